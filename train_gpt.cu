// train_gpt.cu: train a GPT-2-family model as llm.c's train_gpt2cu does, on the same engine as
// train_llama: llm.c's command-line flags and defaults, its checkpoints (magic 20240326), token
// shards, model descriptors (d12, gpt3:c768), HellaSwag eval and gpt2_tokenizer.bin samples,
// plus every memory mode, LoRA and sharding of the engine.
//   ./train_gpt [-i train.bin -j val.bin -e d12 -b 4 -t 1024 ...] [-c cfg.yaml] [--set key=value]...
// llmc/gpt2_cli.c turns the flags into the YAML keys llmc/train.c reads (README: "train_gpt").
// It is plain host code (the kernels live behind llmc/backend.h), so it builds with nvcc or,
// where there is none, as C.
#include <stdio.h>
#include <stdlib.h>
#include "llmc/backend.h"
#include "llmc/gpt2_cli.h"
#include "llmc/model.h"
#include "llmc/train.h"

int main(int argc, char **argv) {
    int n;
    char **args;
    backend_cpu_preinit(argv);  // may re-execute with the original flags, before any note is printed
    gpt2_cli_translate(argc, argv, &n, &args);
    if (getenv("LLMC_GPT2_PRINT_ARGS")) {  // tests: the command line train_main would get
        for (int i = 1; i < n; i++) printf("%s\n", args[i]);
        return 0;
    }
    return train_main(n, args, ARCH_GPT2);
}
