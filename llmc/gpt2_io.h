// gpt2_io.h: llm.c's GPT-2 model files. A 256-int32 header (magic 20240326; version 3 = fp32
// parameters, 5 = bf16; maxT, V, L, NH, C, padded V) then every parameter in llm.c's order,
// each tensor covering all layers: wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w,
// ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb. llm.c's fused qkv is split into the table's
// q/k/v tensors on load and joined again on save.
#pragma once
#include "model.h"

// The model source is an llm.c checkpoint file or a Hugging Face GPT-2 directory (config.json
// with model_type gpt2 + model.safetensors: GPT2LMHeadModel's names, with or without the
// "transformer." prefix, Conv1D weights stored in x out and transposed on load).
// Reads the header of an llm.c checkpoint (or the directory's config.json) into a GPT-2
// config; fails naming the file.
void gpt2_read_config(const char *path, ModelConfig *c);
// Loads every parameter (checks the header against the model).
void gpt2_load(Model *m, const char *path);
// Writes the model as an llm.c checkpoint, version 3 (fp32); with merge, the adapters merged
// into their weights (merge_lora). Returns 0 or -1 (errno set).
int gpt2_save(const Model *m, const char *path, int merge);
// A GPT-2 config from one of llm.c's model descriptors; 0 if unknown:
//   dN or gpt2:dN  GPT-2 of depth N (6, 12, 24, 36, 48, 60, 72, 84), context 1024
//   gpt3:cN        GPT-3 shape of width N (384, 768, 1024, 1536, 2048, 2560, 4096, 5140, 12288),
//                  context 2048, dense attention
// The vocabulary is GPT-2's 50257, padded to 50304.
int gpt2_descriptor(const char *name, ModelConfig *c);
#define GPT2_DESCRIPTORS "d6, d12, d24, d36, d48, d60, d72, d84, gpt2:dN, gpt3:cN with N in 384, 768, 1024, " \
                         "1536, 2048, 2560, 4096, 5140, 12288"
// Fills the GPT-2 defaults a model: block leaves out (4C MLP, MHA, padded vocab, eps 1e-5).
void gpt2_complete_config(ModelConfig *c);
