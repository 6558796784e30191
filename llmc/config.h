// config.h: the run's configuration, read from YAML (libyaml) with Axolotl key names, then
// overridden by --set key=value. Every key is described once in a table in config.c (type,
// default, range), which drives parsing, validation, --help and the error for unknown keys.
#pragma once
#include <stdio.h>
#include "model.h"

typedef struct {
    // model source: base_model (HF dir) or the model: block
    char base_model[1024];
    int has_model_block;
    ModelConfig model;
    // data
    char train_data[1024], val_data[1024], data_dir[1024];
    int shuffle;
    int sequence_len, micro_batch_size, gradient_accumulation_steps;
    // optimisation. max_steps 0: from num_epochs and the data (config_plan_steps)
    int max_steps;
    double num_epochs;            // 0: not set (1 epoch, Axolotl's default, unless max_steps)
    double learning_rate;
    char lr_scheduler[24], optimizer[24];
    int warmup_steps;
    double warmup_ratio, cosine_min_lr_ratio;
    double weight_decay, max_grad_norm, adam_beta1, adam_beta2, adam_epsilon;
    long long seed;
    long long data_seed;          // the training data order (shuffle); -1: seed
    // llm.c's training semantics (train_gpt's flags; see README "train_gpt"): tokens per step
    // (0: from gradient_accumulation_steps), lr at the end of the decay as a fraction of the
    // peak (-1: unset), warmup convention (hf: s/w, llmc: (s+1)/w), HellaSwag eval file,
    // training on the first val batch again and again
    int total_batch_size;
    int lr_quadratic_warmup;      // Axolotl's: warmup lr = lr (s / warmup_steps)^2 (cosine only)
    int batch_size;               // Axolotl's rows per optimizer step (a rank's); 0: unset
    double final_lr_fraction;
    char warmup_style[8];
    char hellaswag_data[1024];
    int overfit_single_batch;
    // evaluation, output, checkpoints
    int eval_steps, eval_batches, sample_steps, sample_tokens, save_steps, log_steps;
    double eval_steps_spec, save_steps_spec;  // as written: N steps, or a fraction (0, 1) of all
    int evals_per_epoch, saves_per_epoch, save_total_limit, early_stopping_patience, save_only_model,
        save_first_step;
    double loss_watchdog_threshold;  // 0: off
    int dataloader_drop_last;        // prepared rows: each epoch's last partial micro-batch left out
    double ddp_timeout;              // seconds a collective may wait (0: LLMC_COMM_TIMEOUT, else 300)
    int loss_watchdog_patience;
    char eval_strategy[8], save_strategy[8];
    int auto_resume_from_checkpoints;
    char output_dir[1024], resume_from_checkpoint[1024];
    char save_dtype[16];          // final model's dtype: auto (the input's), float32, bfloat16, float16
    long long max_shard_size;     // final model split into indexed shards above this many bytes
    // memory (see mempolicy.h): recompute x tier, tiled MLP, a device budget
    char gradient_checkpointing[16], activation_offloading[16], activation_offloading_dir[1024];
    int gradient_checkpointing_every, max_fwd_stash_size, tiled_mlp, tiled_mlp_shards, tiled_attention;
    long long min_offload_size, device_memory_limit;
    long long host_memory_limit;  // planning's host budget; 0: this machine's RAM
    int plan_only;  // --plan
    int profile;    // --profile: per-op times of the steps (opprof.h)
    // adapters
    char adapter[16], lora_target_modules[4096], lora_model_dir[1024], lora_modules_to_save[256];
    char peft_layers_to_transform[1024], peft_layers_pattern[256];  // comma-joined lists
    char lora_fan_in_fan_out[8];  // auto, true, false (PEFT's fan_in_fan_out: true for Conv1D layers)
    int lora_r, lora_target_linear, use_rslora, merge_lora, load_in_4bit, load_in_8bit, layer_offloading;
    int reinit_weights;            // base_model's config.json with a random init
    char unfrozen_parameters[16384];  // newline-separated patterns (freeze.h); empty: train everything
    int lisa_n_layers, lisa_step_interval;  // LISA (lisa.h): both > 0 turn it on
    char lisa_layers_attribute[64];
    double lora_alpha, lora_dropout;
    // preference training (preference.h): rl dpo or ipo ("": supervised); beta (rl_beta, else
    // Axolotl's fallbacks dpo_beta and orpo_alpha, else 0.1); TRL's loss types and weights as
    // comma-joined lists. With rl set, micro_batch_size counts rows after config_finish: two per
    // pair (the YAML's value counts pairs).
    char rl[16];
    double rl_beta, dpo_beta, orpo_alpha, dpo_label_smoothing;
    double simpo_gamma, cpo_alpha;  // rl: simpo (TRL's CPOTrainer, loss_type simpo)
    double kto_desirable_weight, kto_undesirable_weight;  // rl: kto (TRL's KTOTrainer)
    char dpo_loss_type[256], dpo_loss_weights[256];
    // reward_model (preference.h's "reward": rl holds it after config_finish): TRL's RewardTrainer
    int reward_model, num_labels;
    int process_reward_model;  // TRL's PRMTrainer: supervised training of a token classifier
    double center_rewards_coefficient;
    int precompute_ref_log_probs;
    // sharding
    int fsdp, zero_stage, offload_optimizer;
    // Parameters in host memory (the key offload_params, FSDP's offload_params, fsdp: offload,
    // DeepSpeed's offload_param): where it was asked for ("" when not). config_finish maps an
    // adapter run onto layer_offloading + offload_optimizer (offload_params then 0) and a full
    // fine-tune onto zero_stage 3 + offload_optimizer + offload_params 1.
    int offload_params;
    char offload_params_from[2600];
    char deepspeed[1024];          // a DeepSpeed JSON config (deepspeed.h), read in config_finish
    int sequence_parallel_degree;  // ranks that share each sequence (Ulysses); 1: off
    // runtime
    char device[16], precision[16];
    char bf16[8], fp16[8];        // Axolotl's precision keys as written ("" unset), mapped onto dtype
    int num_threads;
    // where the YAML came from, for messages; the architecture the program trains
    char path[1024];
    int arch;
    char base_model_id[256];       // the hub id base_model was resolved from ("" for a directory)
    char revision_of_model[256];   // the hub revision (branch, tag or commit) base_model resolves at ("": main)
    unsigned char given[160];      // given[i]: KEYS[i] was set by the YAML or --set
    int fsdp_config_given, fsdp_given;
    int bnb_int8_fp16_weight;      // bnb_config_kwargs.llm_int8_has_fp16_weight: true
    // Axolotl's rope_scaling mapping as JSON ("" when absent or null): it replaces config.json's
    // rope_scaling (hf_override_rope), so a run can stretch a model's context from the YAML.
    char rope_scaling_json[1024];
    int rope_scaling_line;
    // Axolotl's model_config (or overrides_of_model_config): the key as written ("" when absent
    // or null) and its line; the mapping itself is read from yaml_json (hf_read_config_overridden).
    char model_config_key[32];
    int model_config_line;
    // prepared data (prepare.h): datasets:/pretraining_dataset: instead of train_data shards
    void *yaml_json;               // the whole config as JSON (cJSON *; --set applied) for the script
    int datasets_run;              // the config asks for prepared data
    int preprocess_only;           // --preprocess: prepare the data and exit
    char tokenizer_dir[1024];      // resolved tokenizer directory (datasets runs)
    char prepared_dir[1024];       // the prepared directory (train.bin, eval.bin) once prepared
    int has_eval_rows;             // eval.bin exists: evaluations as with val_data
} Config;

// Parse argv (-c FILE, --set k=v..., --help). Fails with a one-line message on any bad input.
void config_from_args(Config *cfg, int argc, char **argv, int arch);
void config_load_yaml(Config *cfg, const char *path);
void config_set(Config *cfg, const char *key, const char *value, const char *origin);
void config_finish(Config *cfg);  // cross-key checks after all sources are applied
void config_print_help(FILE *f);
// Frees what the configuration holds on the heap (the config's JSON).
void config_release(Config *cfg);
// Once the training data's size is known (windows: global micro-batches per epoch): max_steps
// from num_epochs, warmup_ratio, fractional/per-epoch eval and save cadence; prints the plan.
void config_plan_steps(Config *cfg, size_t windows);
// The seed of the training data order: data_seed, or seed when it is unset (-1).
static inline long long config_data_seed(const Config *cfg) { return cfg->data_seed >= 0 ? cfg->data_seed : cfg->seed; }
// After a checkpoint: remove the oldest checkpoint-N beyond save_total_limit (never keep_step's).
void config_prune_checkpoints(const Config *cfg, int keep_step);
// The LoRA settings the keys describe (r = 0 without an adapter); fails on a bad target list.
// The adapter settings of the run for the model mc (its layers: the targets may select some).
void config_lora(const Config *cfg, const ModelConfig *mc, LoraConfig *lora);
// The memory policy the keys describe (activation_offloading: auto is resolved by the planner).
void config_mem_policy(const Config *cfg, MemPolicy *p);
