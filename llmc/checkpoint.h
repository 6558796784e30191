// checkpoint.h: model weights in/out (HF safetensors + config.json) and whole checkpoints
// (weights, optimizer state, loop state). A checkpoint directory is written under a
// temporary name and renamed, so it is complete or absent.
#pragma once
#include <stdint.h>
#include "config.h"
#include "model.h"
#include "util.h"

// What a run trains with: the keys that change the result of continuing it (model shape, base
// model identity, adapter, seed, batch shape, optimizer and schedule), as "key" = "value"
// strings in a fixed order. Written into every checkpoint's trainer_state.json ("run") and
// compared on resume: the first key that differs stops the run. max_steps is not one of them
// (a run may be extended or shortened).
enum { RUN_KEYS = 56 };
typedef struct {
    int n;
    char key[RUN_KEYS][32];
    char val[RUN_KEYS][1280];
} RunIdentity;

typedef struct {
    int step;              // optimizer steps done
    int skipped;           // of which skipped for a non-finite loss or gradient (not applied)
    uint64_t data_epoch;   // train loader position
    uint64_t data_next;
    Rng sample_rng;
    const RunIdentity *run;  // written with each checkpoint and checked on resume (NULL: neither)
    int model_only;        // save_only_model: checkpoints without the optimizer state, which
                           // say so in trainer_state.json and are refused by resume
    // Preference training (preference.h): the reference's row sums, saved with every checkpoint
    // (reference_logps.bin) so that a resume need not compute them again; ref_key names the
    // prepared data they belong to. NULL: none.
    const double *ref_train, *ref_eval;
    size_t nref_train, nref_eval;
    const char *ref_key;
} LoopState;

// Fills id from the run's configuration and model (hashing the base model's config.json and
// safetensors headers, or a GPT-2 file's header, as its identity).
void run_identity(RunIdentity *id, const Config *cfg, const Model *m);

// Reads DIR/config.json (Hugging Face) into cfg.
void load_hf_config(const char *dir, ModelConfig *cfg);
// Loads every base tensor of the table from DIR's safetensors (checks names and shapes). A
// reward model's score.weight may be absent (a causal LM's files): returns 1 then, and the head
// is left for the caller to initialize (model_init_param); else 0.
int load_hf_weights(Model *m, const char *dir);
// Writes DIR/model.safetensors and DIR/config.json (merge: adapters folded into the base
// weights); returns 0 or -1 (errno set).
// The final model's file format: dtype "F32", "BF16" or "F16" (NULL: F32), and the size above
// which it is split into shards with an index.
typedef struct { const char *dtype; uint64_t max_shard; } SaveFormat;
// fmt NULL: one F32 model.safetensors, as checkpoints hold it (resume is bit-exact).
int save_hf_model(const Model *m, const char *dir, int merge, const SaveFormat *fmt);
// PEFT adapter: DIR/adapter_model.safetensors + adapter_config.json. 0 or -1.
int save_adapter(const Model *m, const char *dir, const char *base_model);
// Loads a PEFT adapter whose rank, alpha and targets must match the run's.
void load_adapter(Model *m, const char *dir);
// Writes output_dir/checkpoint-STEP atomically; fails (leaving earlier checkpoints) on error.
// With ls->model_only the optimizer state is left out.
void checkpoint_save(Model *m, const LoopState *ls, const char *output_dir);
// Loads weights, optimizer state and loop state from a checkpoint directory.
void checkpoint_load(Model *m, LoopState *ls, const char *dir);
// The reference sums a checkpoint of a preference run holds (its reference_logps.bin), into
// train[ntrain] and eval[neval]: 1 when present for this data (key) and these row counts, 0
// when absent or for other data (then the caller computes them); a damaged file fails.
int checkpoint_read_reference(const char *dir, const char *key, double *train, size_t ntrain, double *eval,
                              size_t neval);
// "auto": the checkpoint-N with the largest N in output_dir, or "" if none.
void checkpoint_find_latest(const char *output_dir, char *out, size_t cap);
// Removes the temporary directories (.checkpoint-N.tmp-PID, .final.tmp-PID) left in output_dir
// by runs that died. Call it holding output_dir's lock (no live run writes there then).
void checkpoint_clean_debris(const char *output_dir);
// fsyncs every regular file in dir, then dir itself: before a rename publishes it. 0 or -1.
int fsync_dir_files(const char *dir);
// fsyncs a directory (after a rename into it). 0 or -1.
int fsync_dir(const char *dir);
