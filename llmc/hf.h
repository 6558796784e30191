// hf.h: Hugging Face config.json for the Llama family (Llama 2/3, Mistral, Qwen2, SmolLM).
#pragma once
#include "model.h"

// Fills *c from config.json, applying Hugging Face's defaults for absent keys. Fails with one
// line naming the file and key on malformed JSON, missing/mistyped required keys, or features
// this trainer does not implement (rope scaling other than llama3, mlp_bias, non-silu act).
void hf_read_config(const char *path, ModelConfig *c);
// Writes a config.json that transformers loads (LlamaForCausalLM, Qwen2ForCausalLM or
// MistralForCausalLM by model_type). Returns 0, or -1 with errno set on an I/O error.
int hf_write_config(const char *path, const ModelConfig *c);
