// train.h: the training program behind train_llama and train_gpt.
#pragma once
// Parses the command line and trains; arch is ARCH_LLAMA or ARCH_GPT2 (model.h).
int train_main(int argc, char **argv, int arch);
