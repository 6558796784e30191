// checkpoint.h: model weights in/out (HF safetensors + config.json) and whole checkpoints
// (weights, optimizer state, loop state). A checkpoint directory is written under a
// temporary name and renamed, so it is complete or absent.
#pragma once
#include <stdint.h>
#include "model.h"
#include "util.h"

typedef struct {
    int step;              // optimizer steps done
    uint64_t data_epoch;   // train loader position
    uint64_t data_next;
    Rng sample_rng;
} LoopState;

// Reads DIR/config.json (Hugging Face) into cfg.
void load_hf_config(const char *dir, ModelConfig *cfg);
// Loads every base tensor of the table from DIR's safetensors (checks names and shapes).
void load_hf_weights(Model *m, const char *dir);
// Writes DIR/model.safetensors and DIR/config.json (merge: adapters folded into the base
// weights); returns 0 or -1 (errno set).
int save_hf_model(const Model *m, const char *dir, int merge);
// PEFT adapter: DIR/adapter_model.safetensors + adapter_config.json. 0 or -1.
int save_adapter(const Model *m, const char *dir, const char *base_model);
// Loads a PEFT adapter whose rank, alpha and targets must match the run's.
void load_adapter(Model *m, const char *dir);
// Writes output_dir/checkpoint-STEP atomically; fails (leaving earlier checkpoints) on error.
void checkpoint_save(Model *m, const LoopState *ls, const char *output_dir);
// Loads weights, optimizer state and loop state from a checkpoint directory.
void checkpoint_load(Model *m, LoopState *ls, const char *dir);
// "auto": the checkpoint-N with the largest N in output_dir, or "" if none.
void checkpoint_find_latest(const char *output_dir, char *out, size_t cap);
// Removes temporary checkpoint directories left by runs that died (owner pid gone).
void checkpoint_clean_debris(const char *output_dir);
