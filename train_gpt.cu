// train_gpt.cu: train a GPT-2-family model with llm.c's files (checkpoints with magic 20240326,
// token shards, d12/d24/d36/d48 descriptors) on the same engine as train_llama: every memory
// mode, LoRA and sharding apply unchanged.
//   ./train_gpt -c cfg.yaml [--set key=value]...
// It is plain host code (the kernels live behind llmc/backend.h), so it builds with nvcc or,
// where there is none, as C.
#include "llmc/model.h"
#include "llmc/train.h"

int main(int argc, char **argv) { return train_main(argc, argv, ARCH_GPT2); }
