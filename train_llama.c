// train_llama.c: train a Llama-family model (Llama 2/3, Mistral, Qwen2, SmolLM, TinyLlama).
//   ./train_llama -c cfg.yaml [--set key=value]... [--plan]
// The training program is llmc/train.c; this file only names the architecture.
#include "llmc/model.h"
#include "llmc/train.h"

int main(int argc, char **argv) { return train_main(argc, argv, ARCH_LLAMA); }
