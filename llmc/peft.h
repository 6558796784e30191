// peft.h: PEFT's adapter_config.json, read with PEFT's own matching rules and written with the
// fields peft 0.11+ expects.
//
// PEFT names the modules it adapts by target_modules: a list of names (a module matches when
// its full name equals one, or ends with "." + one), a string (a regular expression matched
// against the whole name), or "all-linear"; layers_to_transform narrows them to some layers.
// This trainer adapts the same projections in every decoder layer, so an adapter is accepted
// when its matches are exactly that; options that would train something else (DoRA, per-module
// ranks, extra trained modules, biases, ...) are refused by name, never ignored.
#pragma once
#include <cjson/cJSON.h>
#include "model.h"

// The LORA_* bit mask adapter_config.json (already parsed, from path) selects in a model of
// num_layers layers; fails naming the key for anything this trainer cannot load exactly.
int peft_read_targets(const char *path, const cJSON *config, int num_layers);
// A new adapter_config.json object for lc (base_model may be NULL).
cJSON *peft_adapter_config(const LoraConfig *lc, const char *base_model);
