// peft.h: PEFT's LoRA target selection, read from adapter_config.json or from the run config
// with PEFT's own matching rules (peft 0.11), and adapter_config.json written with the fields
// peft 0.11+ expects.
//
// PEFT names the modules it adapts by target_modules: a list of names (a module matches when
// its full name equals one, or ends with "." + one), a string (a regular expression that must
// match the whole name), or "all-linear"; layers_to_transform (an int or a list) then narrows
// list matches to some layers, the layer index being read from the module name after
// layers_pattern (or after any "<name>.<digits>." part). A full name in the list and a regex
// are not narrowed: PEFT refuses layers_to_transform with a regex and skips it for an exact
// name. The selection maps onto this trainer's layers exactly: layer l adapts the projections
// its names matched (LoraConfig.layer_targets). GPT-2 is GPT2LMHeadModel's module tree
// (transformer.h.N.attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj: Conv1D, fan_in_fan_out).
// Options that would train something else (DoRA, per-module ranks, extra trained modules,
// biases, ...) and matches on modules that are not a decoder projection are refused by name,
// never ignored.
#pragma once
#include <cjson/cJSON.h>
#include "model.h"

// The keys a selection comes from, for error messages: src is the file; tm, ltt and lp name
// target_modules, layers_to_transform and layers_pattern there.
// strict: every name of a target_modules list must name some projection (a run config, where an
// unmatched name is a typo; PEFT itself only needs one match, so adapter files are not strict).
typedef struct { const char *src, *tm, *ltt, *lp; int strict; } PeftKeys;

// Resolves a selection (tm: a cJSON list of names or a regex string or "all-linear"; ltt and lp
// may be NULL) over the model c into lc->targets, lc->per_layer and lc->layer_targets.
// lora_linear adds every projection's short name to a list (Axolotl's lora_target_linear).
void peft_select(const PeftKeys *k, const cJSON *tm, const cJSON *ltt, const cJSON *lp, int lora_linear,
                 const ModelConfig *c, LoraConfig *lc);
// Reads adapter_config.json (already parsed, from path): refuses what cannot be loaded exactly,
// then resolves its selection into lc as peft_select does.
void peft_read_targets(const char *path, const cJSON *config, const ModelConfig *c, LoraConfig *lc);
// One name of PEFT's modules_to_save (Axolotl's lora_modules_to_save): embed_tokens or lm_head
// set lc's save_embed / save_head. NULL when taken, else why it is refused (another name,
// GPT-2, tied embeddings), for the caller's one-line error.
const char *peft_module_to_save(LoraConfig *lc, const ModelConfig *c, const char *name);
// "layer 1: q_proj,v_proj vs none" style description of the first layer where two selections
// differ, or "" when they are the same; out has cap bytes.
void peft_describe_difference(const LoraConfig *a, const LoraConfig *b, const ModelConfig *c, char *out, size_t cap);
// The modules of a LORA_* mask by name ("q_proj,v_proj"; GPT-2: "c_attn,attn.c_proj"), "none".
void peft_target_names(const ModelConfig *c, int mask, char *out, size_t cap);
// A new adapter_config.json object for lc over the model c (base_model may be NULL). Every layer
// alike: short names; the same projections on some layers: short names + layers_to_transform;
// otherwise the full module path of every adapted projection.
cJSON *peft_adapter_config(const LoraConfig *lc, const ModelConfig *c, const char *base_model);
