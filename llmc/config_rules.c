// config_rules.c: see config_rules.h.
#include "config_rules.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util.h"

// ---- Axolotl keys that are not in the table above. Each is either a note (it cannot change
// the result here: printed once when its value does anything), refused (the message says what
// to use instead), or a datasets-pipeline key (R_DATA: read by scripts/prepare_data.py in a
// datasets: run, an error with train_data shards; R_DATA_NOTE: the same, but only a note with
// shards). A value that makes no difference (null, false, 0, empty, or one of ok) is accepted
// silently. A name ending in '*' is a prefix.
typedef enum { R_NOTE, R_REFUSE, R_DATA, R_DATA_NOTE } RuleKind;
typedef struct {
    const char *name;
    RuleKind kind;
    const char *ok;   // "a|b": further values that are harmless
    const char *msg;
} Rule;

#define NOTE_RAY "Ray launching is not supported: this run is one process; run with mpirun for several ranks"
#define NOTE_TRACKING "experiment tracking is not built in; metrics go to output_dir/metrics.jsonl"
#define NOTE_KERNEL "a kernel choice of the PyTorch stack; this program has its own kernels (flash-style attention, fused loss)"
#define NOTE_HUB "this program never uploads; the model and checkpoints stay in output_dir"
#define NOTE_DDP "a torch.distributed setting; ranks here talk through MPI (CPU) or NCCL (GPU)"
#define NOTE_LOADER "a PyTorch DataLoader setting; train_data shards are read one window at a time"
#define NOTE_MODEL_CLASS "the architecture comes from base_model's config.json"
#define NOTE_PACKER "sample_packing here is a deterministic first fit of whole samples into sequence_len rows (next fit with sample_packing_sequentially), once, before training"
#define NOTE_SHARDS_TOK "train_data shards are already tokenized (with datasets:, scripts/prepare_data.py loads the tokenizer with it)"
#define NOTE_DATASET_OPT "it tunes how Axolotl loads data; here scripts/prepare_data.py prepares datasets once into a cache, and train_data shards need no preparing"
#define NOTE_SHARDS_DATA "it applies to datasets:, which this run does not use (train_data shards are already tokenized rows)"
#define NOTE_WANDB_EVAL "prediction tables and generation metrics are not computed; eval reports val_loss (eval_loss with datasets:)"
#define REFUSE_RL "of preference and RL training only rl: dpo, ipo, kto, simpo and orpo and reward models (reward_model, process_reward_model) are implemented (not GRPO)"
#define REFUSE_PEFT_VARIANT "only plain LoRA/QLoRA (lora_r, lora_alpha, lora_dropout, lora_target_modules, use_rslora) is implemented"

static const Rule RULES[] = {
    // tracking, hub, logging
    {"wandb_*", R_NOTE, NULL, NOTE_TRACKING}, {"use_wandb", R_NOTE, NULL, NOTE_TRACKING},
    {"mlflow_*", R_NOTE, NULL, NOTE_TRACKING}, {"hf_mlflow_log_artifacts", R_NOTE, NULL, NOTE_TRACKING},
    {"use_mlflow", R_NOTE, NULL, NOTE_TRACKING},
    {"comet_*", R_NOTE, NULL, NOTE_TRACKING}, {"use_comet", R_NOTE, NULL, NOTE_TRACKING},
    {"use_tensorboard", R_NOTE, NULL, NOTE_TRACKING}, {"use_ray", R_NOTE, NULL, NOTE_RAY},
    {"ray_run_name", R_NOTE, NULL, NOTE_RAY}, {"ray_num_workers", R_REFUSE, "1",
     "Ray's data-parallel workers are not launched here (one process); run mpirun -np N ./train_llama for N ranks"},
    {"resources_per_worker", R_NOTE, NULL, NOTE_RAY},
    {"use_otel_metrics", R_NOTE, NULL, NOTE_TRACKING}, {"otel_metrics_*", R_NOTE, NULL, NOTE_TRACKING},
    {"hub_model_id", R_NOTE, NULL, NOTE_HUB}, {"hub_strategy", R_NOTE, NULL, NOTE_HUB},
    {"hub_revision", R_NOTE, NULL, NOTE_HUB}, {"push_*", R_NOTE, NULL, NOTE_HUB},
    {"hf_use_auth_token", R_NOTE, NULL, "nothing is downloaded (hub ids resolve in the local cache)"},
    {"include_tokens_per_second", R_NOTE, NULL, "tokens/s is always in the step line and metrics.jsonl"},
    {"profiler_steps", R_NOTE, NULL, "the PyTorch profiler does not exist here; train_llama --profile prints each op's time in a step, metrics.jsonl has per-step time and memory peaks"},
    {"eval_table_size", R_NOTE, NULL, NOTE_WANDB_EVAL}, {"eval_max_new_tokens", R_NOTE, NULL, NOTE_WANDB_EVAL},
    {"do_causal_lm_eval", R_NOTE, NULL, NOTE_WANDB_EVAL}, {"eval_causal_lm_metrics", R_NOTE, NULL, NOTE_WANDB_EVAL},
    {"debug", R_NOTE, NULL, "there is no debug mode"}, {"strict", R_NOTE, NULL, "unknown keys are always errors here"},
    {"local_rank", R_NOTE, NULL, "the rank comes from the launcher (mpirun)"},
    {"seed_everything", R_NOTE, NULL, "seed always seeds everything"},
    // attention and kernel patches, compilation
    {"flash_attention", R_NOTE, NULL, NOTE_KERNEL}, {"flash_attn_*", R_NOTE, NULL, NOTE_KERNEL},
    {"sdp_attention", R_NOTE, NULL, NOTE_KERNEL}, {"xformers_attention", R_NOTE, NULL, NOTE_KERNEL},
    {"flex_attention", R_NOTE, NULL, NOTE_KERNEL}, {"eager_attention", R_NOTE, NULL, NOTE_KERNEL},
    {"flash_optimum", R_NOTE, NULL, NOTE_KERNEL}, {"attn_implementation", R_NOTE, NULL, NOTE_KERNEL},
    {"fused_attn_kernel", R_NOTE, NULL, NOTE_KERNEL}, {"liger_*", R_NOTE, NULL, NOTE_KERNEL},
    {"cut_cross_entropy", R_NOTE, NULL, "the loss is already computed in chunks without B x T x V logits"},
    {"plugins", R_NOTE, NULL, "each listed plugin is judged by name (rules_plugin)"},  // a list: config.c
    {"use_swanlab", R_NOTE, NULL, NOTE_TRACKING}, {"swanlab_*", R_NOTE, NULL, NOTE_TRACKING},
    {"lora_mlp_kernel", R_NOTE, NULL, NOTE_KERNEL}, {"lora_qkv_kernel", R_NOTE, NULL, NOTE_KERNEL},
    {"lora_o_kernel", R_NOTE, NULL, NOTE_KERNEL}, {"lora_embedding_kernel", R_NOTE, NULL, NOTE_KERNEL},
    {"unsloth_*", R_NOTE, NULL, NOTE_KERNEL}, {"torch_compile*", R_NOTE, NULL, "there is no torch.compile; the kernels are compiled C/CUDA"},
    {"tf32", R_NOTE, NULL, "dtype float32 matmuls are always full float32 (no TF32); bfloat16 runs are unaffected"},
    {"low_cpu_mem_usage", R_NOTE, NULL, "weights are read tensor by tensor"},
    {"device_map", R_NOTE, NULL, "one device per rank"}, {"max_memory", R_NOTE, NULL, "use device_memory_limit for a device budget"},
    {"gradient_checkpointing_kwargs", R_NOTE, NULL, "recompute here is exact and has no reentrant/non-reentrant variants"},
    {"embeddings_skip_upcast", R_NOTE, NULL, "embeddings keep float32 master weights"},
    {"lora_on_cpu", R_NOTE, NULL, "adapters are created where the model lives"},
    {"save_safetensors", R_NOTE, "true", "weights are always written as safetensors"},
    {"eval_batch_size", R_NOTE, NULL, "evaluation runs micro_batch_size rows per batch (eval_batches of them from val_data shards; prepared eval rows are evaluated whole, and eval_loss_hf, the mean of per-batch means as Hugging Face reports it, takes batches of micro_batch_size rows)"},
    {"group_by_length", R_NOTE, NULL, "batches are not grouped by sample length: rows are visited in the seeded shuffled order (every row is sequence_len tokens, so grouping would save no padding)"},
    {"batch_flattening", R_NOTE, NULL, "train_data shard rows are all sequence_len tokens long (no padding to flatten)"},
    {"pad_to_sequence_len", R_DATA_NOTE, NULL, "train_data shard rows are always sequence_len tokens long"},
    {"auto_find_batch_size", R_REFUSE, NULL, "set micro_batch_size yourself; train_llama --plan shows what fits"},
    {"ddp_*", R_NOTE, NULL, NOTE_DDP}, {"dataloader_*", R_NOTE, NULL, NOTE_LOADER},
    {"special_tokens", R_DATA_NOTE, NULL, "token ids come from the pre-tokenized train_data shards and the vocabulary is not resized"},
    // model and tokenizer loading
    {"model_type", R_NOTE, "AutoModelForCausalLM|AutoModelForSequenceClassification|AutoModelForTokenClassification",
     NOTE_MODEL_CLASS}, {"base_model_config", R_NOTE, NULL, NOTE_MODEL_CLASS},
    {"is_*_derived_model", R_NOTE, NULL, NOTE_MODEL_CLASS},
    {"base_model_ignore_patterns", R_NOTE, NULL, "only *.safetensors weights are read"},
    {"trust_remote_code", R_NOTE, NULL, "no model code is loaded; the Llama-family architecture is built in"},
    {"tokenizer_config", R_DATA_NOTE, NULL, "train_llama reads pre-tokenized train_data shards; the tokenizer is not used"}, {"tokenizer_type", R_DATA_NOTE, NULL, NOTE_SHARDS_TOK},
    {"tokenizer_use_fast", R_DATA_NOTE, NULL, NOTE_SHARDS_TOK}, {"tokenizer_legacy", R_DATA_NOTE, NULL, NOTE_SHARDS_TOK},
    {"tokenizer_padding_side", R_NOTE, NULL, "prepared rows are padded after their samples, and padding is never attended to or trained"},
    {"tokenizer_save_jinja_files", R_NOTE, NULL, "the base model's tokenizer files are copied beside the final model as they are"},
    {"tokenizer_use_mistral_common", R_REFUSE, NULL, "mistral-common tokenization is not implemented; scripts/prepare_data.py tokenizes with transformers"},
    {"processor_type", R_REFUSE, NULL, "a multimodal processor means image (or audio) training, which is not "
                                       "implemented: Gemma 3's multimodal checkpoints train their language model on text "
                                       "here (drop processor_type)"},
    {"added_tokens_overrides", R_REFUSE, NULL, "tokenizer edits are not implemented"},
    {"random_init_weights", R_REFUSE, NULL, "for a random-init model give a model: block (hidden_size, num_hidden_layers, ...) instead of base_model"},
    {"overrides_of_model_kwargs", R_REFUSE, NULL, "model loading options are not implemented"},
    // quantization, precision, optimizers, schedules
    {"gptq_*", R_NOTE, NULL, "GPTQ options (gptq: true is refused: GPTQ models are not supported)"},
    {"gptq", R_REFUSE, NULL, "GPTQ models are not supported; use a bfloat16/float32 safetensors model (load_in_4bit: true quantizes it to NF4)"},
    {"float16", R_REFUSE, NULL, "float16 compute is not implemented; use bf16: true (dtype: bfloat16)"},
    {"qat", R_REFUSE, NULL, "quantization-aware training is not implemented"},
    {"quantize_moe_experts", R_REFUSE, NULL, "mixture-of-experts models are not supported (the families here are dense)"},
    {"llama4_linearized_experts", R_REFUSE, NULL, "mixture-of-experts models (Llama 4) are not supported"},
    {"quantization", R_REFUSE, NULL, "post-training quantization is not implemented (train_llama --quantize writes an NF4 copy)"},
    {"optim_args", R_REFUSE, NULL, "AdamW takes adam_beta1, adam_beta2, adam_epsilon and weight_decay"},
    {"optim_target_modules", R_REFUSE, NULL, "GaLore/APOLLO optimizers are not implemented"},
    {"adam_beta3", R_NOTE, NULL, "used only by the CAME optimizer"}, {"adam_epsilon2", R_NOTE, NULL, "used only by the CAME optimizer"},
    {"lr_scheduler_kwargs", R_REFUSE, NULL, "schedules take warmup_steps/warmup_ratio and cosine_min_lr_ratio"},
    {"cosine_constant_lr_ratio", R_REFUSE, NULL, "not implemented; use cosine_min_lr_ratio"},
    {"lr_div_factor", R_REFUSE, NULL, "the one_cycle schedule is not implemented (constant, linear, cosine)"},
    {"lr_groups", R_REFUSE, NULL, "per-module learning rates are not implemented"},
    {"loraplus_*", R_REFUSE, NULL, "LoRA+ (a separate learning rate for B) is not implemented"},
    {"embedding_lr*", R_REFUSE, NULL, "per-module learning rates are not implemented"},
    {"neftune_noise_alpha", R_REFUSE, NULL, "NEFTune embedding noise is not implemented"},
    // adapters
    {"peft_use_dora", R_REFUSE, NULL, "DoRA is not implemented; " REFUSE_PEFT_VARIANT},
    {"peft_layer_replication", R_REFUSE, NULL, REFUSE_PEFT_VARIANT},
    {"peft_init_lora_weights", R_REFUSE, "true", "only PEFT's default (Kaiming A, zero B) initialisation is implemented"},
    {"peft", R_REFUSE, NULL, "LoftQ initialisation is not implemented"},
    {"relora_*", R_REFUSE, NULL, "ReLoRA is not implemented; train a plain adapter (adapter: lora)"},
    // distributed
    {"fsdp_version", R_NOTE, NULL, "sharding here is one implementation (zero_stage 3)"},
    {"tensor_parallel_size", R_REFUSE, "1", "tensor parallelism is not implemented; use fsdp: true"},
    {"heads_k_stride", R_NOTE, NULL, "sequence parallelism here moves all key/value heads in one all-to-all"},
    {"ring_attn_func", R_NOTE, NULL, "sequence parallelism here is Ulysses (all-to-all around attention), not ring attention; the result is the same"},
    {"torchdistx_path", R_NOTE, NULL, "used only by adamw_anyprecision"},
    // training modes
    {"trl", R_REFUSE, NULL, "TRL's own settings (GRPO, vLLM generation) are not implemented; DPO takes rl_beta, "
     "dpo_loss_type, dpo_loss_weights and dpo_label_smoothing"},
    {"rpo_alpha", R_REFUSE, NULL, "removed in TRL 1.8 and refused by Axolotl; use dpo_loss_type: [sigmoid, sft] with "
     "dpo_loss_weights: [1.0, alpha]"},
    {"dpo_norm_loss", R_REFUSE, NULL, "deprecated and refused by Axolotl (TRL 1.8 has no such option); dpo_loss_type: "
     "[sigmoid_norm] is not implemented here"},
    {"dpo_use_logits_to_keep", R_REFUSE, NULL, "deprecated and refused by Axolotl (TRL 1.8 has no such option)"},
    {"dpo_generate_during_eval", R_REFUSE, NULL, "deprecated and refused by Axolotl; no generation during evaluation"},
    {"dpo_use_weighting", R_REFUSE, NULL, "WPO weighting is not implemented (rl: dpo without it)"},
    {"dpo_padding_free", R_NOTE, NULL, "TRL 1.8 turns padding_free off for DPO; rows here are one completion each"},
    {"dpo_use_liger_kernel", R_NOTE, NULL, NOTE_KERNEL},
    {"max_prompt_len", R_NOTE, NULL, "Axolotl reads it nowhere with TRL 1.8; rows are cut to sequence_len from the start"},
    {"rl_adapter_ref_model", R_NOTE, NULL, "Axolotl's schema drops it; an adapter run's reference is the base model"},
    {"s2_attention", R_REFUSE, NULL, "shifted-sparse attention is not implemented (attention is full causal)"},
    {"image_size", R_REFUSE, NULL, "image training is not implemented"},
    {"image_resize_algorithm", R_REFUSE, NULL, "image training is not implemented"},
    // the datasets pipeline: passed to scripts/prepare_data.py (prepare.h)
    {"datasets", R_DATA, NULL, NULL}, {"test_datasets", R_DATA, NULL, NULL},
    {"pretraining_dataset", R_DATA, NULL, NULL}, {"chat_template", R_DATA, NULL, NULL},
    {"chat_template_jinja", R_DATA, NULL, NULL}, {"chat_template_kwargs", R_DATA, NULL, NULL},
    {"eot_tokens", R_DATA, NULL, NULL}, {"tokens", R_DATA, NULL, NULL},
    {"resize_token_embeddings_to_32x", R_DATA, NULL, NULL}, {"shrink_embeddings", R_DATA, NULL, NULL},
    {"mean_resizing_embeddings", R_DATA, NULL, NULL},
    {"default_system_message", R_DATA, NULL, NULL}, {"dataset_prepared_path", R_DATA, NULL, NULL},
    {"val_set_size", R_DATA, NULL, NULL}, {"sample_packing", R_DATA, NULL, NULL},
    {"eval_sample_packing", R_DATA, NULL, NULL}, {"train_on_inputs", R_DATA, "true", NULL},
    {"max_packed_sequence_len", R_NOTE, NULL, "packed rows are sequence_len tokens long"}, {"sample_packing_sequentially", R_DATA, NULL, NULL},
    {"pretraining_sample_concatenation", R_DATA, NULL, NULL},
    {"sample_packing_bin_size", R_DATA, NULL, NULL}, {"sample_packing_group_size", R_DATA, NULL, NULL},
    {"sample_packing_*", R_NOTE, NULL, NOTE_PACKER}, {"multipack_real_batches", R_NOTE, NULL, NOTE_PACKER},
    {"sample_packing_eff_est", R_NOTE, NULL, NOTE_PACKER}, {"total_num_tokens", R_NOTE, NULL, "the step count comes from the data (train_data shards or prepared rows)"},
    {"dataset_processes", R_NOTE, NULL, NOTE_DATASET_OPT}, {"dataset_num_proc", R_NOTE, NULL, NOTE_DATASET_OPT},
    {"dataset_keep_in_memory", R_NOTE, NULL, NOTE_DATASET_OPT}, {"dataset_shard_num", R_DATA, NULL, NULL}, {"dataset_shard_idx", R_DATA, NULL, NULL},
    {"dataset_exact_deduplication", R_DATA, NULL, NULL}, {"shuffle_merged_datasets", R_DATA_NOTE, NULL, NOTE_SHARDS_DATA},
    {"shuffle_before_merging_datasets", R_DATA, NULL, NULL}, {"skip_prepare_dataset", R_NOTE, NULL, NOTE_DATASET_OPT},
    {"is_preprocess", R_NOTE, NULL, NOTE_DATASET_OPT}, {"streaming", R_NOTE, NULL, NOTE_DATASET_OPT},
    {"streaming_multipack_buffer_size", R_NOTE, NULL, "Axolotl shuffles a streamed dataset within a buffer of this "
     "many samples; here the prepared samples are shuffled whole by seed"},
    {"remove_unused_columns", R_NOTE, NULL, "the prepared rows have no other columns to keep or remove"},
    {"pretrain_multipack_attn", R_DATA, "true", NULL},
    {"drop_long_sequences", R_NOTE, NULL, NOTE_DATASET_OPT}, {"excess_length_strategy", R_DATA_NOTE, NULL, NOTE_SHARDS_DATA},
    {"min_sample_len", R_DATA, NULL, NULL},
};
#define NRULES (sizeof RULES / sizeof RULES[0])

// Aliases: Axolotl's other names for keys of the table.
static const char *const ALIASES[][2] = {
    {"logging_steps", "log_steps"}, {"peft_use_rslora", "use_rslora"}, {"bfloat16", "bf16"},
    {"context_parallel_size", "sequence_parallel_degree"}, {"model_revision", "revision_of_model"},
};

static const Rule *find_rule(const char *name) {
    for (size_t i = 0; i < NRULES; i++) {
        const char *r = RULES[i].name, *star = strchr(r, '*');
        if (!star ? !strcmp(r, name)
                  : !strncmp(r, name, (size_t)(star - r)) && strlen(name) >= strlen(r) - 1 &&
                        !strcmp(star + 1, name + strlen(name) - strlen(star + 1)))
            return &RULES[i];
    }
    return NULL;
}

int value_in_choices(const char *choices, const char *v) {
    size_t n = strlen(v);
    for (const char *p = choices; p && *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && !strncmp(p, v, n)) return 1;
        p += len + (bar != NULL);
    }
    return 0;
}

// A value that does nothing: null/empty, false, 0 (value NULL: an empty list or mapping).
int value_harmless(const char *v) {
    if (!v || !*v) return 1;
    const char *f[] = {"false", "False", "FALSE", "no", "off", "null", "Null", "NULL", "~", "none", "None"};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (!strcmp(v, f[i])) return 1;
    char *end;
    double d = strtod(v, &end);
    return end != v && !*end && d == 0;
}

// Datasets-pipeline keys that ask for something: whether they are used (a datasets: run) or
// an error/note (train_data shards) is known once every key is read (config_finish).
static struct { const Rule *rule; char key[64], shown[96], origin[160]; } data_keys[64];
static int n_data_keys;

// value: the scalar as written, or NULL for a list/mapping (nonempty says whether it has items).
// Returns 0 when key has no rule.
int rules_apply(const char *key, const char *value, int nonempty, const char *origin) {
    const Rule *r = find_rule(key);
    if (!r) return 0;
    // train_on_inputs: false is the harmful value (it asks for prompt masking), so a data key
    // with an ok list is quiet only for those values.
    int quiet = !value ? !nonempty
              : !*value || (r->ok && value_in_choices(r->ok, value)) ||
                    (!(r->kind == R_DATA && r->ok) && value_harmless(value));
    if (quiet) return 1;
    char shown[96];
    snprintf(shown, sizeof shown, "%s", value ? value : "...");
    if (r->kind == R_NOTE) printf("note: %s has no effect here: %s\n", key, r->msg);
    else if (r->kind == R_REFUSE) fail("%s: key '%s' (%s) is not supported: %s", origin, key, shown, r->msg);
    else if (n_data_keys < (int)(sizeof data_keys / sizeof data_keys[0])) {
        data_keys[n_data_keys].rule = r;
        snprintf(data_keys[n_data_keys].key, sizeof data_keys[0].key, "%.63s", key);
        snprintf(data_keys[n_data_keys].shown, sizeof data_keys[0].shown, "%s", shown);
        snprintf(data_keys[n_data_keys++].origin, sizeof data_keys[0].origin, "%.159s", origin);
    }
    return 1;
}

int rules_known(const char *key) {
    for (size_t i = 0; i < sizeof ALIASES / sizeof ALIASES[0]; i++)
        if (!strcmp(key, ALIASES[i][0])) return 1;
    return find_rule(key) != NULL;
}

const char *rules_alias(const char *key) {
    for (size_t i = 0; i < sizeof ALIASES / sizeof ALIASES[0]; i++)
        if (!strcmp(key, ALIASES[i][0])) return ALIASES[i][1];
    return key;
}

const char *rules_name_at(size_t i) {
    if (i < NRULES) return RULES[i].name;
    i -= NRULES;
    return i < sizeof ALIASES / sizeof ALIASES[0] ? ALIASES[i][0] : NULL;
}

// Axolotl's integrations (src/axolotl/integrations/<module>/), by module: NULL refuse is a note.
static const struct { const char *module, *note, *refuse; } PLUGINS[] = {
    {"cut_cross_entropy", "the loss is already computed in chunks without B x T x V logits", NULL},
    {"liger", NOTE_KERNEL, NULL},
    {"kernels", "mixture-of-experts kernels; the models here are dense", NULL},
    {"swanlab", NOTE_TRACKING, NULL},
    {"lm_eval", "lm-evaluation-harness benchmarks are not run after training here", NULL},
    {"diffusion", NULL, "diffusion language-model training (a masked-denoising loss) is not implemented; this program "
                        "trains next-token prediction"},
    {"kd", NULL, "knowledge distillation (a teacher's logits in the loss) is not implemented"},
    {"grokfast", NULL, "Grokfast's gradient filter is not implemented (the optimizer is AdamW)"},
    {"spectrum", NULL, "Spectrum's freezing by signal-to-noise ratio is not implemented; name what trains with "
                       "unfrozen_parameters"},
    {"llm_compressor", NULL, "sparse fine-tuning (llmcompressor's masks) is not implemented"},
    {"mora", NULL, "MoRA adapters are not implemented (adapter: lora)"},
    {"nemo_gym", NULL, REFUSE_RL},
    {"expert_parallel", NULL, "mixture-of-experts models are not supported"},
    {"densemixer", NULL, "mixture-of-experts models are not supported"},
};

void rules_plugin(const char *name, const char *origin) {
    static const char pre[] = "axolotl.integrations.";
    char module[64] = "";
    if (!strncmp(name, pre, sizeof pre - 1)) {
        const char *m = name + sizeof pre - 1, *dot = strchr(m, '.');
        snprintf(module, sizeof module, "%.*s", (int)(dot ? dot - m : (ptrdiff_t)strlen(m)), m);
    }
    for (size_t i = 0; i < sizeof PLUGINS / sizeof PLUGINS[0]; i++) {
        if (strcmp(module, PLUGINS[i].module)) continue;
        if (PLUGINS[i].refuse) fail("%s: plugin '%s' is not supported: %s", origin, name, PLUGINS[i].refuse);
        printf("note: plugin %s has no effect here: %s\n", name, PLUGINS[i].note);
        return;
    }
    fail("%s: plugin '%s' is not supported: it is not one this program knows (the kernel swaps Liger, CutCrossEntropy "
         "and the trackers are accepted with a note; a plugin that changes the loss, the optimizer or what trains "
         "is refused)", origin, name);
}

void rules_reset(void) { n_data_keys = 0; }

void rules_check_data_keys(void) {
    for (int i = 0; i < n_data_keys; i++) {
        if (data_keys[i].rule->kind == R_DATA_NOTE)
            printf("note: %s has no effect here: %s\n", data_keys[i].key, data_keys[i].rule->msg);
        else
            fail("%s: key '%s' (%s) belongs to the datasets pipeline (datasets:, prepared by "
                 "scripts/prepare_data.py), but this run reads train_data token shards: remove it, or use "
                 "datasets: instead of train_data", data_keys[i].origin, data_keys[i].key, data_keys[i].shown);
    }
}
