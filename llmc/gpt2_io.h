// gpt2_io.h: llm.c's GPT-2 model files. A 256-int32 header (magic 20240326; version 3 = fp32
// parameters, 5 = bf16; maxT, V, L, NH, C, padded V) then every parameter in llm.c's order,
// each tensor covering all layers: wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w,
// ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb. llm.c's fused qkv is split into the table's
// q/k/v tensors on load and joined again on save.
#pragma once
#include "model.h"

// Reads the header of an llm.c checkpoint into a GPT-2 config; fails naming the file.
void gpt2_read_config(const char *path, ModelConfig *c);
// Loads every parameter (checks the header against the model).
void gpt2_load(Model *m, const char *path);
// Writes the model as an llm.c checkpoint, version 3 (fp32). Returns 0 or -1 (errno set).
int gpt2_save(const Model *m, const char *path);
// A GPT-2 config from a `model: dNN` descriptor (d12, d24, d36, d48); 0 if unknown.
int gpt2_descriptor(const char *name, ModelConfig *c);
// Fills the GPT-2 defaults a model: block leaves out (4C MLP, MHA, padded vocab, eps 1e-5).
void gpt2_complete_config(ModelConfig *c);
