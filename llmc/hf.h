// hf.h: Hugging Face config.json for the Llama-shaped families of family.h (Llama 2/3, SmolLM,
// Mistral, Qwen2/2.5, Qwen3).
#pragma once
#include "model.h"

// Fills *c from config.json, applying Hugging Face's defaults for absent keys. Fails with one
// line naming the file and key on malformed JSON, missing/mistyped required keys, or features
// this trainer does not implement (a model_type or architecture outside family.h, rope scaling
// other than llama3, mlp_bias, non-silu act, a layer_types pattern its keys do not give).
void hf_read_config(const char *path, ModelConfig *c);
// hf_read_config with Axolotl's model_config (overrides_of_model_config, a JSON object) set on
// the config first, as transformers' setattr before the model is built: keys read from
// config.json take the new values; keys without effect on training are noted; keys that change
// the weights' shapes or that transformers derives at construction are refused. `where` (file:line)
// and `key` (model_config or overrides_of_model_config) name the YAML in messages; notes: print
// the notes (what was set, what has no effect).
struct cJSON;
void hf_read_config_overridden(const char *path, const struct cJSON *over, const char *where, const char *key,
                               int notes, ModelConfig *c);
// Replaces c's rope scaling with the rope_scaling object in json (Axolotl's YAML key), read as
// config.json's would be for c's family; `where` names the YAML in messages.
void hf_override_rope(const char *where, const char *json, ModelConfig *c);
// Writes a config.json that transformers loads: the input family's architecture and
// model_type, its window keys and eos_token_id (a list stays a list) as read. Returns 0, or -1
// with errno set on an I/O error.
// mm_base: a Gemma 3 multimodal model's base directory, whose config.json is written with
// this text_config (NULL for the other models).
int hf_write_config(const char *path, const ModelConfig *c, const char *mm_base);
