// fuzz_checkpoint_common.h: a tiny model on the CPU backend and a valid checkpoint of it, so
// that a target can replace one file of the checkpoint with its input and load the whole.
#pragma once
#include "fuzz_common.h"
#include "backend.h"
#include "checkpoint.h"
#include "config.h"
#include "model.h"

static Model fuzz_model;
static char fuzz_ckpt[512];  // fuzz_dir()/checkpoint-1: model or adapter, optimizer, state

// Builds the model (LoRA r=2 on q_proj, v_proj when lora) and saves checkpoint-1. Any failure
// here aborts: the setup must work.
static void fuzz_checkpoint_setup(int lora) {
    if (fuzz_ckpt[0]) return;
    char yaml[512], text[1024];
    fuzz_path(yaml, sizeof yaml, "setup.yaml");
    snprintf(text, sizeof text,
             "model:\n  vocab_size: 64\n  hidden_size: 8\n  intermediate_size: 16\n"
             "  num_hidden_layers: 1\n  num_attention_heads: 2\n  max_position_embeddings: 16\n"
             "train_data: unused.bin\nnum_threads: 1\n%s",
             lora ? "adapter: lora\nlora_r: 2\nlora_alpha: 4\nlora_target_modules: [q_proj, v_proj]\n" : "");
    fuzz_write(yaml, (const uint8_t *)text, strlen(text));
    static Config cfg;
    char *argv[] = {"fuzz", "-c", yaml, NULL};
    config_from_args(&cfg, 3, argv, ARCH_LLAMA);
    LoraConfig lc;
    config_lora(&cfg, &cfg.model, &lc);
    ModelOptions mo = {0};
    Backend *bk = backend_cpu_create(1);
    model_create(&fuzz_model, bk, &cfg.model, &lc, &mo);
    model_init_random(&fuzz_model, 1);
    if (lc.r) model_init_lora(&fuzz_model, 2);
    LoopState ls = {0};
    ls.step = 1;
    ls.data_next = 3;
    rng_seed(&ls.sample_rng, 7);
    checkpoint_save(&fuzz_model, &ls, fuzz_dir());
    fuzz_path(fuzz_ckpt, sizeof fuzz_ckpt, "checkpoint-1");
}
