// config.c: the key table and the YAML/--set readers built on it.
#include "config.h"
#include "config_rules.h"
#include "deepspeed.h"
#include "freeze.h"
#include "optim.h"
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>
#include <cjson/cJSON.h>
#include "gpt2_io.h"
#include "hfcache.h"
#include "peft.h"
#include "preference.h"
#include "prepare.h"
#include "util.h"

// T_STEPS: a step count, or a fraction in (0, 1) of all steps (Axolotl's eval_steps: 0.25)
typedef enum { T_INT, T_FLOAT, T_BOOL, T_STR, T_ENUM, T_SIZE, T_LIST, T_STEPS } KeyType;

typedef struct {
    const char *name;
    KeyType type;
    size_t off, size;   // where in Config; the field's size (an int or a long long, a float or a double)
    const char *def;    // default as text (NULL: none)
    double lo, hi;      // range for numbers
    const char *choices;  // "a|b|c" for enums
    const char *help;
} KeyDef;

#define NUM(key, typ, field, def, lo, hi, help) \
    {key, typ, offsetof(Config, field), sizeof(((Config *)0)->field), def, lo, hi, NULL, help}
#define STR(key, field, def, help) \
    {key, T_STR, offsetof(Config, field), sizeof(((Config *)0)->field), def, 0, 0, NULL, help}
#define ENUM(key, field, def, choices, help) \
    {key, T_ENUM, offsetof(Config, field), sizeof(((Config *)0)->field), def, 0, 0, choices, help}
#define BIG 2147483647.0

static const KeyDef KEYS[] = {
    STR("base_model", base_model, "", "Hugging Face model directory (config.json + safetensors)"),
    STR("revision_of_model", revision_of_model, "",
        "a hub id base_model's (and tokenizer_config's) revision in the local cache: branch, tag or commit; \"\": main"),
    NUM("model.vocab_size", T_INT, model.vocab_size, "256", 1, BIG, "random-init model: vocabulary"),
    NUM("model.hidden_size", T_INT, model.hidden_size, NULL, 1, BIG, "random-init model: width"),
    NUM("model.intermediate_size", T_INT, model.intermediate_size, NULL, 1, BIG, "MLP width"),
    NUM("model.num_hidden_layers", T_INT, model.num_hidden_layers, NULL, 1, BIG, "layers"),
    NUM("model.num_attention_heads", T_INT, model.num_attention_heads, NULL, 1, BIG, "query heads"),
    NUM("model.num_key_value_heads", T_INT, model.num_key_value_heads, "0", 0, BIG,
        "key/value heads (GQA); 0 = num_attention_heads"),
    NUM("model.head_dim", T_INT, model.head_dim, "0", 0, BIG, "0 = hidden_size / num_attention_heads"),
    NUM("model.rope_theta", T_FLOAT, model.rope_theta, "10000", 1e-9, 1e30, "RoPE base"),
    NUM("model.rms_norm_eps", T_FLOAT, model.rms_norm_eps, "1e-5", 1e-30, 1, "RMSNorm epsilon"),
    NUM("model.max_position_embeddings", T_INT, model.max_position_embeddings, "2048", 1, BIG,
        "longest sequence"),
    NUM("model.tie_word_embeddings", T_BOOL, model.tie_word_embeddings, "false", 0, 1,
        "share embedding and output head"),
    NUM("model.attention_bias", T_BOOL, model.attention_bias, "false", 0, 1, "q/k/v biases"),
    STR("train_data", train_data, "", "token shard path or glob"),
    STR("val_data", val_data, "", "validation shard path or glob"),
    NUM("shuffle", T_BOOL, shuffle, "true", 0, 1, "visit batches in a seeded random order"),
    NUM("sequence_len", T_INT, sequence_len, "256", 1, 16777216, "tokens per row (T)"),
    NUM("micro_batch_size", T_INT, micro_batch_size, "1", 1, 65536, "rows per micro-batch (B)"),
    NUM("gradient_accumulation_steps", T_INT, gradient_accumulation_steps, "1", 1, 65536,
        "micro-batches per optimizer step"),
    NUM("batch_size", T_INT, batch_size, "0", 0, BIG,
        "rows per optimizer step (Axolotl's): gradient_accumulation_steps = batch_size / micro_batch_size; 0: unset"),
    NUM("max_steps", T_INT, max_steps, "0", 0, BIG, "optimizer steps; 0: num_epochs over train_data"),
    NUM("num_epochs", T_FLOAT, num_epochs, "0", 0, 1e6,
        "passes over train_data (max_steps overrides); unset: 1"),
    NUM("learning_rate", T_FLOAT, learning_rate, "3e-4", 0, 10, "peak learning rate"),
    ENUM("lr_scheduler", lr_scheduler, "cosine", "constant|linear|cosine|constant_with_warmup|wsd",
         "schedule after warmup (wsd: constant, then 1 - sqrt decay over the last 20% of steps, llm.c's)"),
    NUM("final_lr_fraction", T_FLOAT, final_lr_fraction, "-1", -1, 1,
        "cosine/linear/wsd end at this fraction of learning_rate (llm.c's -q); -1: unset (cosine_min_lr_ratio, else 0)"),
    ENUM("warmup_style", warmup_style, "hf", "hf|llmc", "warmup lr: hf = lr s/warmup_steps, llmc = lr (s+1)/warmup_steps"),
    NUM("total_batch_size", T_INT, total_batch_size, "0", 0, BIG,
        "tokens per optimizer step (llm.c's -d): sets gradient_accumulation_steps; 0: unset"),
    ENUM("optimizer", optimizer, "adamw_torch",
         "adamw_torch|adamw_torch_fused|adamw_hf|adamw_bnb_8bit|adamw_8bit|paged_adamw_8bit|paged_adamw_32bit|"
         "adamw_torch_8bit|adamw_torch_4bit|ao_adamw_8bit|ao_adamw_4bit",
         "all run this program's AdamW (float32 moments)"),
    NUM("warmup_steps", T_INT, warmup_steps, "0", 0, BIG,
        "linear warmup steps (neither it nor warmup_ratio given: 3% of the steps, at most 100, Axolotl's)"),
    NUM("lr_quadratic_warmup", T_BOOL, lr_quadratic_warmup, "false", 0, 1,
        "with lr_scheduler cosine: warmup lr = lr (s / warmup_steps)^2 and no cosine_min_lr_ratio (Axolotl's)"),
    NUM("warmup_ratio", T_FLOAT, warmup_ratio, "0", 0, 1, "warmup as a fraction of all steps (not with warmup_steps)"),
    NUM("cosine_min_lr_ratio", T_FLOAT, cosine_min_lr_ratio, "0", 0, 1,
        "cosine decays to this fraction of learning_rate"),
    NUM("weight_decay", T_FLOAT, weight_decay, "0", 0, 10, "AdamW decoupled weight decay"),
    NUM("max_grad_norm", T_FLOAT, max_grad_norm, "1.0", 0, 1e30, "global-norm clipping; 0 disables"),
    NUM("adam_beta1", T_FLOAT, adam_beta1, "0.9", 0, 1, "AdamW beta1, below 1 in float32"),
    NUM("adam_beta2", T_FLOAT, adam_beta2, "0.999", 0, 1, "AdamW beta2, below 1 in float32"),
    NUM("adam_epsilon", T_FLOAT, adam_epsilon, "1e-8", 0, 1, "AdamW epsilon, > 0 in float32"),
    NUM("seed", T_INT, seed, "42", 0, BIG, "seed for init, shuffling and sampling"),
    NUM("data_seed", T_INT, data_seed, "-1", -1, BIG,
        "seed of the training data order alone (shuffle), as HF Trainer's; -1: seed"),
    NUM("eval_steps", T_STEPS, eval_steps_spec, "0", 0, BIG,
        "evaluate every N steps, or a fraction of all steps (0.25); 0 and val_data: every epoch"),
    NUM("evals_per_epoch", T_INT, evals_per_epoch, "0", 0, BIG, "evaluations per epoch (not with eval_steps)"),
    ENUM("eval_strategy", eval_strategy, "auto", "auto|no|steps|epoch",
         "no: never evaluate; epoch: every epoch; auto/steps: from eval_steps"),
    NUM("early_stopping_patience", T_INT, early_stopping_patience, "0", 0, BIG,
        "stop after N evaluations without a better val_loss; 0 disables"),
    NUM("ddp_timeout", T_FLOAT, ddp_timeout, "0", 0, 1e9,
        "seconds a collective may wait for the other ranks before the run stops (LLMC_COMM_TIMEOUT wins; "
        "0: 300, and 1800 while rank 0 prepares datasets:)"),
    NUM("dataloader_drop_last", T_BOOL, dataloader_drop_last, "false", 0, 1,
        "datasets: leave out each epoch's last partial micro-batch, as a PyTorch DataLoader with drop_last"),
    NUM("loss_watchdog_threshold", T_FLOAT, loss_watchdog_threshold, "0", 0, 1e30,
        "stop (with a checkpoint and the final model) after loss_watchdog_patience steps in a row "
        "with a training loss above this; 0: off"),
    NUM("loss_watchdog_patience", T_INT, loss_watchdog_patience, "3", 1, BIG,
        "steps in a row above loss_watchdog_threshold that stop the run"),
    NUM("eval_batches", T_INT, eval_batches, "8", 0, BIG, "validation batches per evaluation; 0: the whole val_data"),
    STR("hellaswag_data", hellaswag_data, "", "train_gpt: llm.c's HellaSwag .bin, evaluated with val_data (eval_steps)"),
    NUM("overfit_single_batch", T_BOOL, overfit_single_batch, "false", 0, 1,
        "train on the first val_data batch every step (llm.c's -a 1)"),
    NUM("sample_steps", T_INT, sample_steps, "0", 0, BIG, "print a sample every N steps (byte vocab)"),
    NUM("sample_tokens", T_INT, sample_tokens, "200", 1, 100000, "length of a sample"),
    NUM("save_steps", T_STEPS, save_steps_spec, "0", 0, BIG,
        "checkpoint every N steps or a fraction of all steps; 0: only at the end"),
    NUM("saves_per_epoch", T_INT, saves_per_epoch, "0", 0, BIG, "checkpoints per epoch (not with save_steps)"),
    ENUM("save_strategy", save_strategy, "auto", "auto|no|steps|epoch",
         "epoch: every epoch; no/auto/steps: from save_steps (the last step is always saved)"),
    NUM("save_total_limit", T_INT, save_total_limit, "0", 0, BIG,
        "keep at most N checkpoint-* directories (oldest removed); 0: all"),
    NUM("save_first_step", T_BOOL, save_first_step, "false", 0, 1,
        "also write a checkpoint after the first step (to find a saving problem early)"),
    NUM("save_only_model", T_BOOL, save_only_model, "false", 0, 1,
        "checkpoints without the optimizer state: a third of the size, but they cannot be resumed"),
    NUM("log_steps", T_INT, log_steps, "1", 1, BIG, "print a step line every N steps (alias logging_steps)"),
    STR("output_dir", output_dir, "out", "metrics, checkpoints and the final model"),
    STR("resume_from_checkpoint", resume_from_checkpoint, "",
        "checkpoint directory to continue from, or auto (the latest in output_dir)"),
    NUM("auto_resume_from_checkpoints", T_BOOL, auto_resume_from_checkpoints, "false", 0, 1,
        "true: resume_from_checkpoint auto"),
    ENUM("gradient_checkpointing", gradient_checkpointing, "false", "false|true|selective|offload|offload_disk",
         "recompute in backward: true keeps only layer inputs, selective keeps matmul outputs; offload and "
         "offload_disk (Axolotl's older spelling) are true with activation_offloading true and disk"),
    NUM("gradient_checkpointing_every", T_INT, gradient_checkpointing_every, "1", 1, 100000,
        "keep the input of every Nth layer"),
    ENUM("activation_offloading", activation_offloading, "false",
         "false|true|legacy|disk|hidden_states|auto",
         "where kept activations live: host (async), host (sync), disk, layer inputs to host"),
    STR("activation_offloading_dir", activation_offloading_dir, "",
        "parent directory of the disk tier's files (default: the system temp dir)"),
    NUM("min_offload_size", T_SIZE, min_offload_size, "1024", 0, 1e18, "smaller tensors stay on the device"),
    NUM("max_fwd_stash_size", T_INT, max_fwd_stash_size, "5", 1, 4096, "offload copies in flight before forward waits"),
    NUM("tiled_mlp", T_BOOL, tiled_mlp, "false", 0, 1, "run the MLP over sequence tiles"),
    NUM("tiled_attention", T_BOOL, tiled_attention, "false", 0, 1,
        "run norms, q/k/v/o projections and attention over sequence tiles"),
    NUM("tiled_mlp_shards", T_INT, tiled_mlp_shards, "0", 0, 1 << 20, "MLP tiles; 0 = ceil(T / hidden_size)"),
    NUM("host_memory_limit", T_SIZE, host_memory_limit, "0", 0, 1e18,
        "host memory budget (--plan, auto, the offloading modes' host tier); 0 = this machine's RAM"),
    NUM("device_memory_limit", T_SIZE, device_memory_limit, "0", 0, 1e18,
        "device memory budget (e.g. 2GiB); 0 = none"),
    ENUM("adapter", adapter, "none", "none|lora|qlora", "train adapters over a frozen base"),
    NUM("lora_r", T_INT, lora_r, "8", 1, 65536, "LoRA rank"),
    NUM("lora_alpha", T_FLOAT, lora_alpha, "16", 1e-9, 1e9, "LoRA alpha (scale alpha/r)"),
    NUM("lora_dropout", T_FLOAT, lora_dropout, "0", 0, 0.999, "dropout on the adapter input"),
    {"lora_target_modules", T_LIST, offsetof(Config, lora_target_modules),
     sizeof(((Config *)0)->lora_target_modules), "", 0, 0, NULL,
     "list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj (GPT-2: c_attn, c_proj, c_fc) "
     "or full module paths; or a regex string or all-linear (PEFT's target_modules)"},
    {"peft_layers_to_transform", T_LIST, offsetof(Config, peft_layers_to_transform),
     sizeof(((Config *)0)->peft_layers_to_transform), "", 0, 0, NULL,
     "layer indices whose lora_target_modules are adapted (PEFT's layers_to_transform)"},
    {"peft_layers_pattern", T_LIST, offsetof(Config, peft_layers_pattern),
     sizeof(((Config *)0)->peft_layers_pattern), "", 0, 0, NULL,
     "module name before the layer index (PEFT's layers_pattern; layers, GPT-2: h)"},
    NUM("lora_target_linear", T_BOOL, lora_target_linear, "false", 0, 1, "adapt every linear projection"),
    ENUM("lora_fan_in_fan_out", lora_fan_in_fan_out, "auto", "auto|true|false",
         "PEFT's fan_in_fan_out: true for GPT-2's Conv1D layers (train_gpt), false for Llama-family ones"),
    NUM("use_rslora", T_BOOL, use_rslora, "false", 0, 1, "scale alpha/sqrt(r)"),
    STR("lora_model_dir", lora_model_dir, "", "start from this PEFT adapter directory"),
    NUM("merge_lora", T_BOOL, merge_lora, "false", 0, 1, "also write the merged model to output_dir/merged"),
    ENUM("save_dtype", save_dtype, "auto", "auto|float32|bfloat16|float16",
         "final model's dtype (auto: the base model's; checkpoints stay float32)"),
    NUM("max_shard_size", T_SIZE, max_shard_size, "5GB", 1, 1e18,
        "final model in indexed shards of at most this size"),
    STR("deepspeed", deepspeed, "",
        "a DeepSpeed JSON config (Axolotl's deepspeed_configs/*.json): its ZeRO stage and optimizer offload "
        "become zero_stage and offload_optimizer"),
    {"lora_modules_to_save", T_LIST, offsetof(Config, lora_modules_to_save),
     sizeof(((Config *)0)->lora_modules_to_save), "", 0, 0, NULL,
     "embed_tokens and/or lm_head: trained whole beside the adapters and saved with them (PEFT's modules_to_save)"},
    {"unfrozen_parameters", T_LIST, offsetof(Config, unfrozen_parameters),
     sizeof(((Config *)0)->unfrozen_parameters), "", 0, 0, NULL,
     "full fine-tune: train only parameters whose name matches one of these regexes (Axolotl's rules)"},
    NUM("lisa_n_layers", T_INT, lisa_n_layers, "0", 0, BIG,
        "LISA: full fine-tune training this many decoder layers at a time, drawn at random (with lisa_step_interval)"),
    NUM("lisa_step_interval", T_INT, lisa_step_interval, "0", 0, BIG,
        "LISA: draw the training layers again every this many optimizer steps (and at step 1)"),
    STR("lisa_layers_attribute", lisa_layers_attribute, "model.layers",
        "LISA: the module list drawn from (model.layers; transformer.h for GPT-2)"),
    NUM("reinit_weights", T_BOOL, reinit_weights, "false", 0, 1,
        "base_model's architecture with random weights (N(0, initializer_range), as transformers' init), not its weights"),
    NUM("load_in_4bit", T_BOOL, load_in_4bit, "false", 0, 1, "QLoRA: frozen layer weights in NF4"),
    NUM("load_in_8bit", T_BOOL, load_in_8bit, "false", 0, 1,
        "adapter: lora over frozen layer weights in bitsandbytes' int8 storage (products use the dequantized weights)"),
    NUM("layer_offloading", T_BOOL, layer_offloading, "false", 0, 1,
        "stream frozen layer weights from host memory through two device slots"),
    NUM("fsdp", T_BOOL, fsdp, "false", 0, 1,
        "shard parameters, gradients and optimizer (zero_stage 3); or Axolotl's list [full_shard, auto_wrap]"),
    NUM("zero_stage", T_INT, zero_stage, "0", 0, 3, "0: all-reduce gradients; 1: shard optimizer state; 3: fsdp"),
    NUM("sequence_parallel_degree", T_INT, sequence_parallel_degree, "1", 1, 4096,
        "ranks that split each sequence (Ulysses all-to-all around attention); must equal the rank count"),
    NUM("offload_optimizer", T_BOOL, offload_optimizer, "false", 0, 1,
        "fp32 master and AdamW moments in host memory, updated on the CPU"),
    NUM("offload_params", T_BOOL, offload_params, "false", 0, 1,
        "weights in host memory: a full fine-tune keeps its ZeRO-3 pieces and their gradients there (zero_stage 3 "
        "and offload_optimizer follow); an adapter run streams its frozen base (layer_offloading)"),
    STR("rl", rl, "", "preference training over datasets: of prompt/chosen/rejected pairs: dpo or ipo (TRL 1.8's "
        "DPOTrainer; the reference is the starting model), kto (its KTOTrainer), simpo (its CPOTrainer) or orpo (its "
        "ORPOTrainer); \"\": supervised"),
    NUM("rl_beta", T_FLOAT, rl_beta, "0", 0, 1e6, "rl: DPO's beta (0: unset, then dpo_beta, orpo_alpha or 0.1)"),
    NUM("dpo_beta", T_FLOAT, dpo_beta, "0", 0, 1e6, "rl: Axolotl's deprecated name of rl_beta"),
    NUM("orpo_alpha", T_FLOAT, orpo_alpha, "0", 0, 1e6, "rl: the beta when rl_beta is unset (Axolotl's order; ORPO's lambda)"),
    NUM("dpo_label_smoothing", T_FLOAT, dpo_label_smoothing, "0", 0, 0.4999,
        "rl: dpo: label smoothing of the robust loss (TRL's sigmoid loss does not use it)"),
    {"dpo_loss_type", T_LIST, offsetof(Config, dpo_loss_type), sizeof(((Config *)0)->dpo_loss_type), "", 0, 0, NULL,
     "rl: dpo: TRL's loss types summed (sigmoid, hinge, ipo, robust, sft); \"\": sigmoid"},
    {"dpo_loss_weights", T_LIST, offsetof(Config, dpo_loss_weights), sizeof(((Config *)0)->dpo_loss_weights), "", 0, 0,
     NULL, "rl: dpo: a weight per dpo_loss_type (default 1 each)"},
    NUM("simpo_gamma", T_FLOAT, simpo_gamma, "0", -1e6, 1e6, "rl: simpo: the target reward margin (required, as in Axolotl)"),
    NUM("cpo_alpha", T_FLOAT, cpo_alpha, "1", 0, 1e6,
        "rl: simpo: weight of the chosen completions' token loss added to SimPO's (TRL's default 1; 0: pure SimPO)"),
    NUM("kto_desirable_weight", T_FLOAT, kto_desirable_weight, "1", 0, 1e6,
        "rl: kto: weight of the desirable examples' losses (0 means 1, as Axolotl passes `or 1.0`)"),
    NUM("kto_undesirable_weight", T_FLOAT, kto_undesirable_weight, "1", 0, 1e6,
        "rl: kto: weight of the undesirable examples' losses (0 means 1, as in Axolotl)"),
    NUM("reward_model", T_BOOL, reward_model, "false", 0, 1,
        "train a Bradley-Terry reward model (TRL 1.8's RewardTrainer) on datasets: of type "
        "bradley_terry.chat_template: a score head on the last token, saved as ...ForSequenceClassification"),
    NUM("process_reward_model", T_BOOL, process_reward_model, "false", 0, 1,
        "train a process reward model (TRL 1.8's PRMTrainer) on datasets: of type stepwise_supervised: a token "
        "classifier (score.weight and score.bias, 2 labels) at each step's last token, saved as ...ForTokenClassification"),
    NUM("num_labels", T_INT, num_labels, "0", 0, 1 << 20, "reward_model: the score head's outputs (1, the only count "
        "a reward model has; 0: 1); process_reward_model: 2 (0: 2)"),
    NUM("center_rewards_coefficient", T_FLOAT, center_rewards_coefficient, "0", 0, 1e6,
        "reward_model: adds this times the mean of (chosen + rejected reward)^2 to the loss (TRL's; unset: none)"),
    NUM("precompute_ref_log_probs", T_BOOL, precompute_ref_log_probs, "false", 0, 1,
        "rl: the reference log-probabilities are always computed once before training here; either value"),
    ENUM("device", device, "auto", "auto|cpu|cuda",
         "backend; auto = CUDA when a GPU is present ($LLMC_DEVICE sets the default)"),
    ENUM("dtype", precision, "bfloat16", "bfloat16|float32",
         "GPU compute precision (fp32 master weights either way); the CPU computes in float32"),
    ENUM("bf16", bf16, NULL, "true|false|auto|full", "Axolotl: true/auto = dtype bfloat16; false (and no fp16) = float32"),
    ENUM("fp16", fp16, NULL, "true|false", "Axolotl: float16 compute is not implemented (false only)"),
    NUM("num_threads", T_INT, num_threads, "0", 0, 4096, "CPU threads; 0 = all cores"),
};
#define NKEYS (sizeof KEYS / sizeof KEYS[0])

static int edit_distance(const char *a, const char *b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    int *row = xmalloc(sizeof(int) * (lb + 1));
    for (int j = 0; j <= lb; j++) row[j] = j;
    for (int i = 1; i <= la; i++) {
        int prev = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            int cur = row[j];
            int sub = prev + (a[i - 1] != b[j - 1]);
            int best = row[j] + 1 < row[j - 1] + 1 ? row[j] + 1 : row[j - 1] + 1;
            row[j] = sub < best ? sub : best;
            prev = cur;
        }
    }
    int d = row[lb];
    free(row);
    return d;
}

static const KeyDef *find_key(const char *name) {
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(KEYS[i].name, name) == 0) return &KEYS[i];
    return NULL;
}

// The known name nearest to name when it is a near spelling (at most 1 edit per 5 characters,
// at least 1, at most 3), else NULL: "bf16" must not suggest "seed".
static const char *closest_key(const char *name) {
    const char *best = NULL;
    int bd = 1 << 30;
    const char *bare = strncmp(name, "model.", 6) ? name : name + 6;
    for (size_t i = 0; i < NKEYS || rules_name_at(i - NKEYS); i++) {
        // Compare against the bare name too, so "hidden_size" suggests "model.hidden_size".
        const char *k = i < NKEYS ? KEYS[i].name : rules_name_at(i - NKEYS);
        if (strchr(k, '*')) continue;
        const char *dot = strchr(k, '.');
        int d = edit_distance(name, k);
        if (dot) {
            int d2 = edit_distance(bare, dot + 1);
            if (d2 < d) d = d2;
        }
        if (d < bd) bd = d, best = k;
    }
    int len = (int)strlen(bare), allow = len / 5 < 1 ? 1 : len / 5 > 3 ? 3 : len / 5;
    return bd <= allow && bd < len ? best : NULL;
}

// " (did you mean 'x'?)" or "".
static const char *suggest(const char *name) {
    static char buf[160];
    const char *k = closest_key(name);
    if (!k) return "";
    snprintf(buf, sizeof buf, " (did you mean '%s'?)", k);
    return buf;
}

static int parse_bool(const char *v, int *out);

// Keys whose value is more than one field: fsdp's list form, optimizer notes, gpu_memory_limit.
// Returns 1 when it handled key.
static int special_set(Config *cfg, const char *key, const char *value, const char *origin) {
    if (!strcmp(key, "model") && cfg->arch == ARCH_GPT2) {  // train_gpt: a descriptor (d12, gpt3:c768)
        if (!gpt2_descriptor(value, &cfg->model))
            fail("%s: model '%s' is not a GPT-2 descriptor (%s) or a mapping", origin, value, GPT2_DESCRIPTORS);
        cfg->has_model_block = 1;
        return 1;
    }
    if (!strcmp(key, "fsdp")) {
        int b;
        cfg->fsdp_given = 1;
        if (parse_bool(value, &b)) return cfg->fsdp = b, 1;
        // Axolotl's list: full_shard, shard_grad_op, hybrid_shard, no_shard, offload, auto_wrap
        char words[512];
        snprintf(words, sizeof words, "%s", value);
        int any = 0;
        cfg->fsdp = 0;
        for (char *sv, *w = strtok_r(words, ", []", &sv); w; w = strtok_r(NULL, ", []", &sv)) {
            any = 1;
            if (!strcmp(w, "full_shard")) cfg->fsdp = 1;
            else if (!strcmp(w, "auto_wrap")) printf("note: fsdp: auto_wrap has no effect here: sharding is always per decoder layer\n");
            else if (!strcmp(w, "no_shard")) cfg->fsdp = 0;
            else if (!strcmp(w, "offload"))
                snprintf(cfg->offload_params_from, sizeof cfg->offload_params_from, "%s: fsdp: offload", origin);
            else if (!strcmp(w, "shard_grad_op") || !strncmp(w, "hybrid_shard", 12))
                fail("%s: key 'fsdp': '%s' is not supported; use full_shard (zero_stage 3) or "
                     "zero_stage: 1 (optimizer state sharded)", origin, w);
            else
                fail("%s: key 'fsdp': unknown option '%s' (expected true/false or a list of full_shard, "
                     "auto_wrap, no_shard)", origin, w);
        }
        if (!any) fail("%s: key 'fsdp' expects true, false or a list such as [full_shard, auto_wrap]", origin);
        return 1;
    }
    if (!strcmp(key, "curriculum_sampling")) {  // Axolotl: a sequential sampler, batches in data order
        int b;
        if (!parse_bool(value, &b)) fail("%s: key 'curriculum_sampling' expects true or false, got '%s'", origin, value);
        if (b) {
            config_set(cfg, "shuffle", "false", origin);
            printf("note: curriculum_sampling: true runs as shuffle: false (batches in the data's order)\n");
        }
        return 1;
    }
    if (!strcmp(key, "gpu_memory_limit")) {
        // Axolotl: an integer is in GiB (device_memory_limit's plain integers are bytes).
        char v[64];
        size_t n = strspn(value, "0123456789");
        snprintf(v, sizeof v, "%s%s", value, n && !value[n] ? "GiB" : "");
        config_set(cfg, "device_memory_limit", v, origin);
        printf("note: gpu_memory_limit %s is used as device_memory_limit (a hard budget for this program's "
               "device allocations)\n", v);
        return 1;
    }
    return 0;
}

static int parse_bool(const char *v, int *out) {
    const char *t[] = {"true", "True", "TRUE", "yes", "on", "1"};
    const char *f[] = {"false", "False", "FALSE", "no", "off", "0"};
    for (int i = 0; i < 6; i++) {
        if (strcmp(v, t[i]) == 0) return *out = 1, 1;
        if (strcmp(v, f[i]) == 0) return *out = 0, 1;
    }
    return 0;
}

// YAML's digit separators: 500_000 -> 500000 (an underscore between two digits only).
static const char *no_underscores(const char *v, char *buf, size_t cap) {
    size_t n = 0;
    for (size_t i = 0; v[i] && n + 1 < cap; i++)
        if (!(v[i] == '_' && i > 0 && v[i - 1] >= '0' && v[i - 1] <= '9' && v[i + 1] >= '0' && v[i + 1] <= '9'))
            buf[n++] = v[i];
    buf[n] = 0;
    return buf;
}

// Sets key (an alias, a special key, a table key or a ruled Axolotl key); 0 if key is unknown.
static int set_key(Config *cfg, const char *key, const char *value, const char *origin) {
    key = rules_alias(key);
    if (special_set(cfg, key, value, origin)) return 1;
    const KeyDef *k = find_key(key);
    if (!k) return rules_apply(key, value, 0, origin);
    if (strcmp(origin, "default")) cfg->given[k - KEYS] = 1;
    char *field = (char *)cfg + k->off;
    char *end, clean[128];
    if (k->type == T_INT || k->type == T_FLOAT || k->type == T_STEPS)
        value = no_underscores(value, clean, sizeof clean);
    if (k->off == offsetof(Config, optimizer) && !value_in_choices(k->choices, value))
        fail("%s: key 'optimizer': '%s' is not supported: this program implements AdamW only; use "
             "adamw_torch (or one of %s, which all run the same AdamW)", origin, value, k->choices);
    switch (k->type) {
    case T_STEPS: {
        errno = 0;
        double v = strtod(value, &end);
        if (*value == 0 || *end || errno || !isfinite(v) || v < 0 || (v >= 1 && v != floor(v)) || v > k->hi)
            fail("%s: key '%s' expects a number of steps or a fraction in (0, 1) of all steps, got '%s'",
                 origin, key, value);
        *(double *)field = v;
        break;
    }
    case T_INT: {
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (*value == 0 || *end || errno) {
            const double f = strtod(value, &end);
            if (k->off == offsetof(Config, warmup_steps) && !*end && f > 0 && f < 1)  // transformers 5 reads it as a ratio
                fail("%s: key 'warmup_steps' expects an integer (Axolotl's schema too), got '%s'; a fraction of "
                     "all steps is warmup_ratio: %s", origin, value, value);
            fail("%s: key '%s' expects an integer, got '%s'", origin, key, value);
        }
        if (v < k->lo || v > k->hi)
            fail("%s: key '%s' must be in [%.0f, %.0f], got %lld", origin, key, k->lo, k->hi, v);
        if (k->size == sizeof(long long)) *(long long *)field = v;
        else *(int *)field = (int)v;
        break;
    }
    case T_FLOAT: {
        errno = 0;
        double v = strtod(value, &end);
        if (*value == 0 || *end || errno || !isfinite(v))
            fail("%s: key '%s' expects a number, got '%s'", origin, key, value);
        if (v < k->lo || v > k->hi)
            fail("%s: key '%s' must be in [%.10g, %.10g], got %.10g", origin, key, k->lo, k->hi, v);
        if (k->size == sizeof(float)) *(float *)field = (float)v;
        else *(double *)field = v;
        break;
    }
    case T_SIZE: {
        long long v = parse_size(value);
        if (v < 0) fail("%s: key '%s' expects a size such as 512MiB or 2GiB, got '%s'", origin, key, value);
        *(long long *)field = v;
        break;
    }
    case T_BOOL:
        if (!parse_bool(value, (int *)field))
            fail("%s: key '%s' expects true or false, got '%s'", origin, key, value);
        break;
    case T_ENUM: {
        int b;
        if (parse_bool(value, &b)) value = b ? "true" : "false";  // YAML's True/yes/on
        if (!strcmp(value, "false") && (k->off == offsetof(Config, eval_strategy) || k->off == offsetof(Config, save_strategy)))
            value = "no";  // YAML 1.1 reads a bare no as false
        size_t n = strlen(value);
        const char *p = k->choices;
        int ok = 0;
        while (*p) {
            const char *bar = strchr(p, '|');
            size_t len = bar ? (size_t)(bar - p) : strlen(p);
            if (len == n && strncmp(p, value, n) == 0) ok = 1;
            p += len + (bar != NULL);
        }
        if (!ok) fail("%s: key '%s' expects one of %s, got '%s'", origin, key, k->choices, value);
    }
        __attribute__((fallthrough));  // an enum is stored as its string
    case T_LIST:  // stored comma-joined; YAML lists are joined by the loader
    case T_STR:
        if (strlen(value) >= k->size) fail("%s: key '%s': value too long", origin, key);
        snprintf(field, k->size, "%s", value);
        break;
    }
    if (strncmp(key, "model.", 6) == 0) cfg->has_model_block = 1;
    if (k->off == offsetof(Config, optimizer) && strcmp(origin, "default")) {
        int bits = strstr(value, "8bit") ? 8 : strstr(value, "4bit") ? 4 : 0;
        if (optimizer_adam8_kind(value) == ADAM4_TORCHAO) {
            printf("note: optimizer %s runs as torchao's AdamW4bit (4-bit moments, two to a byte, for tensors of at "
                   "least 4096 elements whose size is a multiple of 128, float moments for the others)\n", value);
        } else if (optimizer_adam8_kind(value) == ADAM8_TORCHAO) {
            printf("note: optimizer %s runs as torchao's AdamW8bit (one byte per moment for tensors of at least 4096 "
                   "elements whose size is a multiple of 256, float moments for the others)\n", value);
        } else if (optimizer_adam8_kind(value)) {
            printf("note: optimizer %s runs as bitsandbytes' blockwise 8-bit AdamW (one byte per moment for tensors "
                   "of at least 4096 elements, float moments for smaller ones)%s\n", value,
                   strstr(value, "paged") ? "; paged (unified-memory) states are not implemented: the moments stay in "
                                            "device memory (offload_optimizer: true moves them to host memory)" : "");
        } else if (bits)
            printf("note: optimizer %s runs as AdamW with float32 moments: %d-bit optimizer states are "
                   "not implemented (8 bytes per trainable parameter instead of about %d; "
                   "offload_optimizer: true moves them to host memory)\n", value, bits, bits / 4);
        else if (strstr(value, "paged"))
            printf("note: optimizer %s runs as AdamW: paged (unified-memory) optimizer states are not "
                   "implemented; the moments stay in device memory (offload_optimizer: true moves them "
                   "to host memory)\n", value);
    }
    return 1;
}

void config_set(Config *cfg, const char *key, const char *value, const char *origin) {
    if (!set_key(cfg, key, value, origin)) fail("%s: unknown key '%s'%s", origin, key, suggest(key));
}

void config_release(Config *cfg) {
    cJSON_Delete(cfg->yaml_json);
    cfg->yaml_json = NULL;
}

static void set_defaults(Config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    rules_reset();
    model_config_defaults(&cfg->model);
    for (size_t i = 0; i < NKEYS; i++)
        if (KEYS[i].def) config_set(cfg, KEYS[i].name, KEYS[i].def, "default");
    cfg->has_model_block = 0;
    _Static_assert(NKEYS <= sizeof ((Config *)0)->given, "Config.given is too small for the key table");
    const char *dev = getenv("LLMC_DEVICE");  // e.g. the test suite pins the CPU backend
    if (dev && *dev) config_set(cfg, "device", dev, "$LLMC_DEVICE");
}

static const char *scalar(yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static int is_null(yaml_node_t *n) {
    const char *s = scalar(n);
    return n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (!*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL"));
}

// Unknown keys of the file being read, all reported in one line once it is read.
static char unknown_keys[2048], first_unknown[300];
static size_t first_unknown_line;
static int n_unknown;

static void add_unknown(const char *key, size_t line) {
    size_t len = strlen(unknown_keys);
    const char *near = closest_key(key);
    char one[640];
    snprintf(one, sizeof one, "%s'%s' (line %zu%s%s%s)", n_unknown ? ", " : "", key, line,
             near ? ", did you mean '" : "", near ? near : "", near ? "'?" : "");
    if (!n_unknown) snprintf(first_unknown, sizeof first_unknown, "%s", key), first_unknown_line = line;
    if (len + strlen(one) < sizeof unknown_keys - 8) snprintf(unknown_keys + len, sizeof unknown_keys - len, "%s", one);
    else if (!strstr(unknown_keys, ", ...")) snprintf(unknown_keys + len, sizeof unknown_keys - len, ", ...");
    n_unknown++;
}

// One entry of an fsdp_config: block (fsdp_ prefixes optional). 0: not an FSDP option.
// bnb_config_kwargs.NAME (Axolotl passes them to BitsAndBytesConfig): the NF4 base here is
// bitsandbytes' nf4 with double-quantized absmax, which is also Axolotl's default; other
// choices are refused rather than quantized otherwise. Returns 0 for an unknown name.
static int bnb_config_key(Config *cfg, const char *name, const char *value, int list_items, const char *origin) {
    if (!value) value = list_items ? "[...]" : "";  // a list says it is one; a mapping or an empty list says nothing
    const char *v = value;
    int b;
    if (!strcmp(name, "llm_int8_has_fp16_weight")) {  // load_in_8bit with 16-bit weights: refused in finish
        if (*value && !parse_bool(value, &b))
            fail("%s: bnb_config_kwargs: llm_int8_has_fp16_weight expects true or false, got '%s'", origin, v);
        cfg->bnb_int8_fp16_weight = *value && b;
        return 1;
    }
    // llm_int8_threshold: which activation columns bitsandbytes keeps in 16 bits; activations are
    // never rounded to int8 here (int8.h), so it changes nothing.
    if (!value || !*value || !strcmp(name, "llm_int8_threshold") ||
        !strcmp(name, "llm_int8_enable_fp32_cpu_offload") || !strcmp(name, "bnb_4bit_quant_storage"))
        return 1;  // unset, 8-bit-only options, or how the packed bytes are typed: the values are the same
    if (!strcmp(name, "bnb_4bit_quant_type")) {
        if (strcmp(value, "nf4"))
            fail("%s: bnb_config_kwargs: bnb_4bit_quant_type: %s is not implemented; the 4-bit base here is nf4", origin, v);
    } else if (!strcmp(name, "bnb_4bit_use_double_quant")) {
        if (!parse_bool(value, &b) || !b)
            fail("%s: bnb_config_kwargs: bnb_4bit_use_double_quant: %s is not implemented; the NF4 base here always "
                 "double-quantizes its absmax values (Axolotl's default: true)", origin, v);
    } else if (!strcmp(name, "bnb_4bit_compute_dtype")) {
        printf("note: bnb_config_kwargs: bnb_4bit_compute_dtype %s has no effect here: the NF4 weights are "
               "dequantized to the run's dtype and multiplied in it\n", v);
    } else if (!strcmp(name, "llm_int8_skip_modules")) {
        if (!value_harmless(value))
            fail("%s: bnb_config_kwargs: llm_int8_skip_modules: %s is not implemented; every decoder matrix "
                 "is quantized", origin, v);
    } else {
        return 0;
    }
    return 1;
}

static int fsdp_config_key(Config *cfg, const char *name, const char *value, int list_items, const char *origin) {
    const char *n = strncmp(name, "fsdp_", 5) ? name : name + 5, *v = value ? value : "...";
    int b, is_bool = value && parse_bool(value, &b), on = is_bool && b;
    static const char *const noted[] = {
        "auto_wrap_policy", "transformer_layer_cls_to_wrap", "use_orig_params", "sync_module_states",
        "cpu_ram_efficient_loading", "limit_all_gathers", "forward_prefetch", "backward_prefetch",
        "min_num_params", "version", "cpu_offload_pin_memory", "mixed_precision_policy"};
    if (!strcmp(n, "offload_params")) {
        if (value && !is_bool && !value_harmless(value))
            fail("%s: fsdp_config: %s expects true or false, got '%s'", origin, name, v);
        if (on) snprintf(cfg->offload_params_from, sizeof cfg->offload_params_from, "%s: fsdp_config: %s: true", origin, name);
    } else if (!strcmp(n, "sharding_strategy")) {
        if (!strcmp(v, "FULL_SHARD") || !strcmp(v, "1")) cfg->fsdp = 1, cfg->fsdp_given = 1;
        else if (!strcmp(v, "NO_SHARD") || !strcmp(v, "3")) cfg->fsdp = 0, cfg->fsdp_given = 1;
        else if (value && *value)
            fail("%s: fsdp_config: %s: %s is not supported; use FULL_SHARD (zero_stage 3) or "
                 "zero_stage: 1 (optimizer state sharded)", origin, name, v);
    } else if (!strcmp(n, "reshard_after_forward")) {
        if (is_bool && !b)
            fail("%s: fsdp_config: %s: false is not supported: sharded layers are gathered again for "
                 "backward (use true, or zero_stage: 1 to keep whole weights on every rank)", origin, name);
    } else if (!strcmp(n, "activation_checkpointing")) {
        if (on) {
            config_set(cfg, "gradient_checkpointing", "true", origin);
            printf("note: fsdp_config: %s: true is used as gradient_checkpointing: true\n", name);
        }
    } else if (!strcmp(n, "state_dict_type")) {
        if (value && *value && strcmp(value, "FULL_STATE_DICT"))
            printf("note: fsdp_config: %s: %s has no effect here: checkpoints and the final model are "
                   "always written whole\n", name, value);
    } else {
        size_t i = 0;
        while (i < sizeof noted / sizeof noted[0] && strcmp(n, noted[i])) i++;
        if (i == sizeof noted / sizeof noted[0]) return 0;
        if (!value || !value_harmless(value))
            printf("note: fsdp_config: %s has no effect here: sharding is per decoder layer (zero_stage 3)\n", name);
    }
    return 1;
}

static int item_count(yaml_node_t *n) {
    return n->type == YAML_SEQUENCE_NODE ? (int)(n->data.sequence.items.top - n->data.sequence.items.start)
                                         : (int)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
}

// One option of a mapping key (fsdp_config, bnb_config_kwargs): value is the scalar as written
// ("" for null), NULL for a list or a mapping; list_items is a list's length (0 otherwise).
// Returns 0 for a name it does not know.
typedef int (*OptionFn)(Config *cfg, const char *name, const char *value, int list_items, const char *origin);

// The options under mapping key `key` (null: none), each given to fn with its file:line; names
// fn does not know are unknown keys `key.name`. Returns how many options there were, -1 for null.
static int load_options(Config *cfg, yaml_document_t *doc, yaml_node_t *vn, const char *key, const char *what,
                        const char *path, const char *origin, OptionFn fn) {
    if (vn->type == YAML_SCALAR_NODE && is_null(vn)) return -1;
    if (vn->type != YAML_MAPPING_NODE) fail("%s: key '%s' expects a mapping of %s", origin, key, what);
    for (yaml_node_pair_t *q = vn->data.mapping.pairs.start; q < vn->data.mapping.pairs.top; q++) {
        yaml_node_t *k2 = yaml_document_get_node(doc, q->key), *v2 = yaml_document_get_node(doc, q->value);
        char o2[1200], full[300];
        snprintf(o2, sizeof o2, "%s:%zu", path, k2->start_mark.line + 1);
        if (k2->type != YAML_SCALAR_NODE) fail("%s: keys must be plain names", o2);
        snprintf(full, sizeof full, "%s.%s", key, scalar(k2));
        const char *val = v2->type != YAML_SCALAR_NODE ? NULL : is_null(v2) ? "" : scalar(v2);
        if (!fn(cfg, scalar(k2), val, v2->type == YAML_SEQUENCE_NODE ? item_count(v2) : 0, o2))
            add_unknown(full, k2->start_mark.line + 1);
    }
    return item_count(vn);
}

static int is_known(const char *key) {
    return find_key(key) || rules_known(key) || !strcmp(key, "gpu_memory_limit") || !strcmp(key, "curriculum_sampling");
}

static void load_mapping(Config *cfg, yaml_document_t *doc, yaml_node_t *map, const char *prefix,
                         const char *path) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *kn = yaml_document_get_node(doc, p->key);
        yaml_node_t *vn = yaml_document_get_node(doc, p->value);
        char origin[1200], key[256];
        snprintf(origin, sizeof origin, "%s:%zu", path, kn->start_mark.line + 1);
        if (kn->type != YAML_SCALAR_NODE) fail("%s: keys must be plain names", origin);
        snprintf(key, sizeof key, "%s%s", prefix, scalar(kn));
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++)
            if (!strcmp(scalar(yaml_document_get_node(doc, q->key)), scalar(kn)))
                fail("%s: key '%s' appears twice", origin, key);
        if (!*prefix && !strcmp(key, "model") && vn->type == YAML_SCALAR_NODE && cfg->arch == ARCH_GPT2) {
            config_set(cfg, "model", scalar(vn), origin);
            continue;
        }
        if (!*prefix && !strcmp(key, "model")) {
            if (vn->type != YAML_MAPPING_NODE)
                fail("%s: key 'model' expects a mapping of model fields (hidden_size: ...)", origin);
            load_mapping(cfg, doc, vn, "model.", path);
            cfg->has_model_block = 1;
            continue;
        }
        if (!*prefix && (!strcmp(key, "model_config") || !strcmp(key, "overrides_of_model_config"))) {
            // Axolotl's overrides of config.json (its alias and its field name): the mapping is
            // read from the config's JSON (yaml_json) when the model's config is loaded.
            if (vn->type == YAML_SCALAR_NODE && is_null(vn)) continue;
            if (vn->type != YAML_MAPPING_NODE)
                fail("%s: key '%s' expects a mapping of config.json keys (rope_theta: 1000000, ...) or null", origin, key);
            if (cfg->model_config_key[0])
                fail("%s: '%s' and '%s' are the same setting; give one", origin, key, cfg->model_config_key);
            snprintf(cfg->model_config_key, sizeof cfg->model_config_key, "%s", !strcmp(key, "model_config") ? "model_config" : "overrides_of_model_config");
            cfg->model_config_line = (int)kn->start_mark.line + 1;
            continue;
        }
        if (!*prefix && !strcmp(key, "rope_scaling")) {  // Axolotl's: config.json's rope_scaling, replaced
            if (vn->type == YAML_SCALAR_NODE && is_null(vn)) continue;
            if (vn->type != YAML_MAPPING_NODE)
                fail("%s: key 'rope_scaling' expects a mapping (rope_type: yarn, factor: 4.0, ...) or null", origin);
            cJSON *o = cJSON_CreateObject();
            if (!o) fail("out of memory");
            for (yaml_node_pair_t *q = vn->data.mapping.pairs.start; q < vn->data.mapping.pairs.top; q++) {
                yaml_node_t *k2 = yaml_document_get_node(doc, q->key), *v2 = yaml_document_get_node(doc, q->value);
                char o2[1200];
                snprintf(o2, sizeof o2, "%s:%zu", path, k2->start_mark.line + 1);
                if (k2->type != YAML_SCALAR_NODE) fail("%s: keys must be plain names", o2);
                if (v2->type != YAML_SCALAR_NODE)
                    fail("%s: rope_scaling.%s: only single values here (per-frequency lists belong in config.json)", o2,
                         scalar(k2));
                // Values as YAML means them: numbers, true/false, null, else strings.
                const char *v = scalar(v2);
                char *end;
                double d = strtod(v, &end);
                cJSON *item = is_null(v2) ? cJSON_CreateNull()
                              : !strcmp(v, "true") || !strcmp(v, "false") ? cJSON_CreateBool(!strcmp(v, "true"))
                              : *v && !*end && v2->data.scalar.style == YAML_PLAIN_SCALAR_STYLE ? cJSON_CreateNumber(d)
                                                                                                   : cJSON_CreateString(v);
                if (!item || !cJSON_AddItemToObject(o, scalar(k2), item)) fail("out of memory");
            }
            char *txt = cJSON_PrintUnformatted(o);
            if (!txt || strlen(txt) >= sizeof cfg->rope_scaling_json) fail("%s: rope_scaling is too long", origin);
            strcpy(cfg->rope_scaling_json, txt);
            cfg->rope_scaling_line = (int)kn->start_mark.line + 1;
            free(txt);
            cJSON_Delete(o);
            continue;
        }
        if (!*prefix && !strcmp(key, "bnb_config_kwargs")) {  // Axolotl's BitsAndBytesConfig options
            load_options(cfg, doc, vn, key, "options", path, origin, bnb_config_key);
            continue;
        }
        if (!*prefix && !strcmp(key, "fsdp_config")) {  // Axolotl's FSDP options
            const int n = load_options(cfg, doc, vn, key, "FSDP options", path, origin, fsdp_config_key);
            if (n >= 0) cfg->fsdp_config_given = n > 0;
            continue;
        }
        if (!*prefix && !strcmp(key, "plugins") && !(vn->type == YAML_SCALAR_NODE && is_null(vn))) {
            // Each plugin by name (rules_plugin); a single name or a mapping is not Axolotl's list.
            if (vn->type != YAML_SEQUENCE_NODE) fail("%s: key 'plugins' expects a list of plugin names", origin);
            for (yaml_node_item_t *it = vn->data.sequence.items.start; it < vn->data.sequence.items.top; it++) {
                yaml_node_t *e = yaml_document_get_node(doc, *it);
                char at[1200];
                snprintf(at, sizeof at, "%s:%zu", path, e->start_mark.line + 1);
                if (e->type != YAML_SCALAR_NODE) fail("%s: key 'plugins' expects a list of plugin names", at);
                rules_plugin(scalar(e), at);
            }
            continue;
        }
        const KeyDef *kd = find_key(key);
        if (vn->type == YAML_SEQUENCE_NODE && ((kd && kd->type == T_LIST) || !strcmp(key, "fsdp"))) {
            // lora_target_modules keeps its brackets: a list of names, not a regex string.
            const int brackets = !strcmp(key, "lora_target_modules");
            // unfrozen_parameters' regexes may hold commas ({1,3}): one per line instead.
            const char *sep = !strcmp(key, "unfrozen_parameters") ? "\n" : ",";
            char joined[16384] = "";
            for (yaml_node_item_t *it = vn->data.sequence.items.start; it < vn->data.sequence.items.top; it++) {
                yaml_node_t *e = yaml_document_get_node(doc, *it);
                if (e->type != YAML_SCALAR_NODE) fail("%s: key '%s' expects a list of names", origin, key);
                size_t len = strlen(joined);
                if (len + strlen(scalar(e)) + 3 >= sizeof joined) fail("%s: key '%s': list too long", origin, key);
                snprintf(joined + len, sizeof joined - len, "%s%s", len ? sep : brackets ? "[" : "", scalar(e));
            }
            if (brackets) strcat(joined, joined[0] ? "]" : "[]");
            config_set(cfg, key, joined, origin);
            continue;
        }
        if (!is_known(key)) {
            add_unknown(key, kn->start_mark.line + 1);
            continue;
        }
        if (vn->type != YAML_SCALAR_NODE) {
            if (!kd && rules_apply(key, NULL, item_count(vn) > 0, origin)) continue;
            fail("%s: key '%s' expects a single value, not a %s", origin, key,
                 vn->type == YAML_MAPPING_NODE ? "mapping" : "list");
        }
        // A key with no value (Axolotl's examples list many: "lora_r:") keeps its default.
        if (is_null(vn)) {
            if (!kd) rules_apply(key, "", 0, origin);
        } else {
            config_set(cfg, key, scalar(vn), origin);
        }
    }
}

void config_load_yaml(Config *cfg, const char *path) {
    size_t len;
    char *text = read_file(path, &len);
    if (!text) fail("%s: cannot read config: %s", path, errno == EISDIR ? "is a directory" : strerror(errno));
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_parser_initialize(&parser);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc))
        fail("%s:%zu: invalid YAML: %s", path, parser.problem_mark.line + 1,
             parser.problem ? parser.problem : "parse error");
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root) {
        if (root->type != YAML_MAPPING_NODE) fail("%s: expected a mapping of key: value lines", path);
        unknown_keys[0] = 0, n_unknown = 0;
        load_mapping(cfg, &doc, root, "", path);
        config_release(cfg);  // the whole document, for scripts/prepare_data.py
        cfg->yaml_json = prepare_yaml_to_json(&doc, root, path);
        if (n_unknown == 1)
            fail("%s:%zu: unknown key '%s'%s", path, first_unknown_line, first_unknown, suggest(first_unknown));
        if (n_unknown)
            fail("%s: %d unknown keys: %s (Axolotl keys this program knows are listed by --help and in "
                 "README; keys without effect here are accepted with a note)", path, n_unknown, unknown_keys);
    }
    yaml_document_delete(&doc);
    // A second document ("---") would be silently ignored by a reader that loads one.
    if (!yaml_parser_load(&parser, &doc))
        fail("%s:%zu: invalid YAML: %s", path, parser.problem_mark.line + 1,
             parser.problem ? parser.problem : "parse error");
    if (yaml_document_get_root_node(&doc))
        fail("%s:%zu: a second YAML document starts here; put every key in one document", path,
             doc.start_mark.line + 1);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    free(text);
    snprintf(cfg->path, sizeof cfg->path, "%s", path);
}

static int given(const Config *cfg, const char *key) {
    const KeyDef *k = find_key(key);
    return k && cfg->given[k - KEYS];
}

// deepspeed: a DeepSpeed JSON file onto zero_stage and offload_optimizer; the values it shares
// with the trainer ("auto" in Axolotl's files) must agree with the config's.
static void finish_deepspeed(Config *cfg, const char *src) {
    DeepSpeedConfig ds;
    deepspeed_read(cfg->deepspeed, src, &ds);
    const int stage = ds.stage == 2 ? 1 : ds.stage;
    if (cfg->fsdp || cfg->fsdp_config_given)
        fail("%s: set deepspeed or fsdp/fsdp_config, not both", src);
    if (given(cfg, "zero_stage") && cfg->zero_stage != stage)
        fail("%s: deepspeed %s is ZeRO stage %d, but zero_stage is %d; set one of them", src, ds.path, ds.stage,
             cfg->zero_stage);
    if (ds.bf16 >= 0 && ds.bf16 != !strcmp(cfg->precision, "bfloat16"))
        fail("%s: deepspeed %s has bf16.enabled %s, but this run's dtype is %s (bf16: %s); make them agree "
             "(\"auto\" follows the config)", src, ds.path, ds.bf16 ? "true" : "false", cfg->precision,
             cfg->bf16[0] ? cfg->bf16 : "unset");
    if (ds.gradient_clipping >= 0 && ds.gradient_clipping != cfg->max_grad_norm)
        fail("%s: deepspeed %s has gradient_clipping %g, but max_grad_norm is %g; make them agree (\"auto\" "
             "follows max_grad_norm)", src, ds.path, ds.gradient_clipping, cfg->max_grad_norm);
    if (ds.micro_batch && ds.micro_batch != cfg->micro_batch_size)
        fail("%s: deepspeed %s has train_micro_batch_size_per_gpu %d, but micro_batch_size is %d", src, ds.path,
             ds.micro_batch, cfg->micro_batch_size);
    if (ds.accum && ds.accum != cfg->gradient_accumulation_steps)
        fail("%s: deepspeed %s has gradient_accumulation_steps %d, but the config has %d", src, ds.path, ds.accum,
             cfg->gradient_accumulation_steps);
    cfg->zero_stage = stage;
    if (ds.offload_optimizer) cfg->offload_optimizer = 1;
    if (ds.offload_param) snprintf(cfg->offload_params_from, sizeof cfg->offload_params_from, "%s: deepspeed %s: offload_param", src, ds.path);
    printf("note: deepspeed %s: ZeRO stage %d runs as zero_stage %d%s%s\n", ds.path, ds.stage, stage,
           ds.stage == 2 ? " (the same numbers: optimizer state sharded, but every rank keeps all the gradients)"
                         : "",
           ds.offload_optimizer ? " with offload_optimizer: true" : "");
}

// rl: kto and orpo run their trainer's one loss (what: its formula for the note): the DPO loss keys
// are overridden, with a note when any was given.
static void fixed_loss(Config *cfg, const char *loss, const char *what) {
    if (cfg->dpo_loss_type[0] || cfg->dpo_loss_weights[0] || cfg->dpo_label_smoothing > 0)
        printf("note: rl: %s sets its loss (%s); dpo_loss_type, dpo_loss_weights and dpo_label_smoothing have no "
               "effect (as in Axolotl)\n", loss, what);
    snprintf(cfg->dpo_loss_type, sizeof cfg->dpo_loss_type, "%s", loss);
    cfg->dpo_loss_weights[0] = 0;
    cfg->dpo_label_smoothing = 0;
}

// reward_model: true (Axolotl's key; TRL's RewardTrainer) runs as rl "reward" from here on: the
// preference pairs' data path and steps, a score head instead of the token losses. Axolotl's
// model_type (or type_of_model) names the head: a sequence classifier is a reward model here and
// nothing else (a silent causal LM in its place would train another model).
static void finish_reward(Config *cfg, const char *src) {
    const char *mk[] = {"model_type", "type_of_model"};
    for (int i = 0; i < 2; i++) {
        const cJSON *o = cfg->yaml_json ? cJSON_GetObjectItemCaseSensitive((const cJSON *)cfg->yaml_json, mk[i]) : NULL;
        const char *v = cJSON_IsString(o) ? o->valuestring : "";
        if (strstr(v, "ForTokenClassification") && !cfg->process_reward_model)
            fail("%s: %s: %s needs process_reward_model: true (the token classifier trained here)", src, mk[i], v);
        if (strstr(v, "ForSequenceClassification") && !cfg->reward_model)
            fail("%s: %s: %s needs reward_model: true (a Bradley-Terry reward model is the sequence classifier "
                 "trained here)", src, mk[i], v);
        if (*v && cfg->reward_model && !strstr(v, "ForSequenceClassification"))
            fail("%s: %s: %s with reward_model: true; a reward model is a sequence classifier "
                 "(AutoModelForSequenceClassification, Axolotl's default for it)", src, mk[i], v);
        if (*v && cfg->process_reward_model && !strstr(v, "ForTokenClassification"))
            fail("%s: %s: %s with process_reward_model: true; a process reward model is a token classifier "
                 "(AutoModelForTokenClassification, Axolotl's default for it)", src, mk[i], v);
    }
    if (cfg->process_reward_model) {  // TRL's PRMTrainer: the supervised path with a 2-label token classifier
        if (cfg->reward_model || cfg->rl[0])
            fail("%s: process_reward_model and %s are two kinds of training; set one", src,
                 cfg->reward_model ? "reward_model" : "rl");
        if (cfg->num_labels && cfg->num_labels != 2)
            fail("%s: num_labels %d: a process reward model here has 2 (the steps' labels are booleans)", src,
                 cfg->num_labels);
        cfg->num_labels = 2;
        if (cfg->sample_steps) printf("note: sample_steps: a process reward model has no LM head to sample from\n");
        if (!cfg->datasets_run)
            fail("%s: process_reward_model reads labelled steps from datasets: (type stepwise_supervised), not "
                 "train_data shards", src);
        if (cfg->lora_dropout > 0) printf("note: lora_dropout %g is off: TRL's PRMTrainer disables every dropout\n",
                                          cfg->lora_dropout);
        if (cfg->gradient_accumulation_steps > 1)  // transformers 4.57's Trainer with a model whose forward takes **kwargs
            printf("note: process_reward_model: the loss is the mean over the step's labelled tokens; Hugging Face's "
                   "Trainer adds each micro-batch's mean instead (its token classifiers' loss ignores "
                   "num_items_in_batch): about %d times this loss and gradient before clipping\n",
                   cfg->gradient_accumulation_steps);
        cfg->lora_dropout = 0;
        return;
    }
    if (!cfg->reward_model) {
        if (cfg->num_labels)
            fail("%s: num_labels %d sets a classifier head, and this run trains a causal LM (reward_model: true "
                 "trains a reward model)", src, cfg->num_labels);
        if (given(cfg, "center_rewards_coefficient"))
            printf("note: center_rewards_coefficient has no effect without reward_model\n");
        return;
    }
    if (cfg->rl[0]) fail("%s: reward_model and rl: %s are two kinds of training; set one", src, cfg->rl);
    if (cfg->num_labels > 1)
        fail("%s: num_labels %d: a reward model has one output (TRL's RewardTrainer requires num_labels 1)", src,
             cfg->num_labels);
    cfg->num_labels = 1;
    if (cfg->sample_steps) printf("note: sample_steps: a reward model has no LM head to sample from\n");
    snprintf(cfg->rl, sizeof cfg->rl, "reward");
}

// rl: dpo / ipo / simpo / orpo / kto (preference.h). Axolotl's beta order is rl_beta, then dpo_beta
// (deprecated), then orpo_alpha, else TRL's 0.1; TRL 1.8's trainers turn every dropout off
// (LoRA's too).
static void finish_rl(Config *cfg, const char *src) {
    const char *rl_keys[] = {"rl_beta", "dpo_beta", "orpo_alpha", "dpo_label_smoothing", "dpo_loss_type",
                             "dpo_loss_weights", "precompute_ref_log_probs", "simpo_gamma", "cpo_alpha",
                             "kto_desirable_weight", "kto_undesirable_weight"};
    finish_reward(cfg, src);
    if (!cfg->rl[0]) {
        for (size_t i = 0; i < sizeof rl_keys / sizeof *rl_keys; i++)
            if (given(cfg, rl_keys[i]))
                printf("note: %s has no effect without rl (supervised training)\n", rl_keys[i]);
        return;
    }
    const char *rl = cfg->rl;
    const int reward = !strcmp(rl, "reward");
    if (reward)
        for (size_t i = 0; i < sizeof rl_keys / sizeof *rl_keys; i++)
            if (given(cfg, rl_keys[i])) printf("note: %s has no effect with reward_model (it is rl's)\n", rl_keys[i]);
    if (!strcmp(rl, "grpo") || !strcmp(rl, "gdpo") || !strcmp(rl, "ebft"))
        fail("%s: rl: %s is not implemented (rl: dpo, ipo, kto, simpo and orpo are)", src, rl);
    if (strcmp(rl, "dpo") && strcmp(rl, "ipo") && strcmp(rl, "simpo") && strcmp(rl, "orpo") && strcmp(rl, "kto") && !reward)
        fail("%s: rl: '%s' is not a preference method here (dpo, ipo, kto, simpo, orpo)", src, rl);
    const int simpo = !strcmp(rl, "simpo"), orpo = !strcmp(rl, "orpo"), kto = !strcmp(rl, "kto");
    if (!kto && (given(cfg, "kto_desirable_weight") || given(cfg, "kto_undesirable_weight")))
        printf("note: kto_desirable_weight and kto_undesirable_weight have no effect with rl: %s (they are rl: "
               "kto's)\n", rl);
    if (!simpo && (given(cfg, "simpo_gamma") || given(cfg, "cpo_alpha")))
        printf("note: simpo_gamma and cpo_alpha have no effect with rl: %s (they are rl: simpo's)\n", rl);
    if (cfg->arch == ARCH_GPT2) fail("%s: rl: %s trains Llama-family models (train_llama)", src, rl);
    if (!cfg->datasets_run)
        fail("%s: rl: %s reads preference pairs from datasets: (prompt, chosen, rejected), not train_data shards", src, rl);
    if (cfg->total_batch_size)
        fail("%s: rl: %s with total_batch_size: steps are counted in pairs (micro_batch_size x "
             "gradient_accumulation_steps)", src, rl);
    if (reward) {  // TRL's RewardTrainer: its own loss, no reference, no beta; dropout off (disable_dropout)
        if (cfg->lora_dropout > 0) printf("note: lora_dropout %g is off: TRL's RewardTrainer disables every dropout\n",
                                          cfg->lora_dropout);
        cfg->lora_dropout = 0;
        cfg->micro_batch_size *= 2;  // rows: each pair is a chosen and a rejected row
        return;
    }
    if (!given(cfg, "rl_beta")) {
        if (given(cfg, "dpo_beta")) {
            cfg->rl_beta = cfg->dpo_beta;
            printf("note: dpo_beta is deprecated in Axolotl; taken as rl_beta %g\n", cfg->rl_beta);
        } else if (given(cfg, "orpo_alpha")) {
            cfg->rl_beta = cfg->orpo_alpha;
            printf("note: rl: %s takes orpo_alpha %g as its beta (Axolotl's order: rl_beta, then orpo_alpha)\n", rl,
                   cfg->rl_beta);
        } else cfg->rl_beta = 0.1;
    }
    if (!(cfg->rl_beta > 0)) fail("%s: rl_beta must be above 0 (DPO divides by it in ipo)", src);
    if (kto) {  // TRL's KTOTrainer: loss_type kto, its KL term from mismatched completions of each batch
        if (cfg->micro_batch_size < 2)
            fail("%s: rl: kto needs micro_batch_size 2 or more (TRL refuses 1: the KL term, from the batch's other "
                 "completions, would be the reward itself)", src);
        fixed_loss(cfg, "kto", "TRL's kto");
        if (!(cfg->kto_desirable_weight > 0)) cfg->kto_desirable_weight = 1;  // Axolotl: `or 1.0`
        if (!(cfg->kto_undesirable_weight > 0)) cfg->kto_undesirable_weight = 1;
        if (cfg->shuffle)
            printf("note: rl: kto reads its examples in order (TRL's KTOTrainer samples sequentially: each "
                   "example's KL sequence holds the completion of the one before it in its batch)\n");
        cfg->shuffle = 0;
    }
    if (orpo)  // TRL's ORPOTrainer: the chosen rows' nll minus beta log sigmoid(log odds)
        fixed_loss(cfg, "orpo", "nll - beta log sigmoid(log odds ratio)");
    if (simpo) {  // TRL's CPOTrainer: loss_type simpo, plus cpo_alpha x the chosen completions' token loss
        if (!given(cfg, "simpo_gamma"))
            fail("%s: rl: simpo needs simpo_gamma (the target reward margin; Axolotl passes it to TRL unset "
                 "otherwise, which fails)", src);
        if (cfg->warmup_ratio > 0)
            fail("%s: warmup_ratio with rl: simpo: Axolotl refuses it (\"not supported with the simpo trainer\"); "
                 "use warmup_steps", src);
        if (cfg->dpo_loss_type[0] || cfg->dpo_loss_weights[0] || cfg->dpo_label_smoothing > 0)
            printf("note: rl: simpo sets its loss (simpo + cpo_alpha x sft); dpo_loss_type, dpo_loss_weights and "
                   "dpo_label_smoothing have no effect (as in Axolotl)\n");
        snprintf(cfg->dpo_loss_type, sizeof cfg->dpo_loss_type, cfg->cpo_alpha > 0 ? "simpo,sft" : "simpo");
        snprintf(cfg->dpo_loss_weights, sizeof cfg->dpo_loss_weights, cfg->cpo_alpha > 0 ? "1,%.17g" : "1",
                 cfg->cpo_alpha);
        cfg->dpo_label_smoothing = 0;
    }
    if (!strcmp(rl, "ipo")) {
        if (cfg->dpo_loss_type[0] || cfg->dpo_label_smoothing > 0)
            printf("note: rl: ipo sets the loss to ipo; dpo_loss_type and dpo_label_smoothing have no effect (as in "
                   "Axolotl)\n");
        snprintf(cfg->dpo_loss_type, sizeof cfg->dpo_loss_type, "ipo");
        cfg->dpo_loss_weights[0] = 0;
        cfg->dpo_label_smoothing = 0;
    }
    PrefLoss pl;
    pref_loss_from_config(&pl, cfg);  // an unknown loss type or weight fails here, before --plan
    if (cfg->dpo_label_smoothing > 0 && pl.smoothing == 0)
        printf("note: dpo_label_smoothing %g has no effect: of TRL 1.8's losses here only robust reads it (its sigmoid "
               "loss does not)\n", cfg->dpo_label_smoothing);
    if (cfg->lora_dropout > 0) {
        printf("note: lora_dropout %g is off: TRL's %s disables every dropout (disable_dropout), the "
               "adapters' too\n", cfg->lora_dropout, simpo ? "CPOTrainer" : orpo ? "ORPOTrainer" : kto ? "KTOTrainer" : "DPOTrainer");
        cfg->lora_dropout = 0;
    }
    cfg->micro_batch_size *= 2;  // rows: each pair is a chosen and a rejected row
}

// Axolotl's keys that combine with others: precision, FSDP options, schedule and cadence
// conflicts, auto-resume, and a hub id as base_model.
static void finish_axolotl_keys(Config *cfg, const char *src) {
    // Axolotl derives gradient_accumulation_steps from batch_size when it is unset (floor
    // division), and sizes its schedule by batch_size: a remainder, or both keys disagreeing,
    // would train one batch and schedule another, so those are refused.
    if (cfg->batch_size) {
        const int mbs = cfg->micro_batch_size;
        if (given(cfg, "total_batch_size") && cfg->total_batch_size)
            fail("%s: batch_size and total_batch_size both set the accumulation; give one", src);
        if (given(cfg, "gradient_accumulation_steps")) {
            if ((long long)mbs * cfg->gradient_accumulation_steps != cfg->batch_size)
                fail("%s: batch_size %d is not micro_batch_size %d x gradient_accumulation_steps %d; give one of "
                     "batch_size and gradient_accumulation_steps", src, cfg->batch_size, mbs,
                     cfg->gradient_accumulation_steps);
        } else {
            if (cfg->batch_size % mbs)
                fail("%s: batch_size %d is not a multiple of micro_batch_size %d (it sets gradient_accumulation_steps "
                     "= batch_size / micro_batch_size)", src, cfg->batch_size, mbs);
            if (cfg->batch_size / mbs > 65536)
                fail("%s: batch_size %d / micro_batch_size %d is more than 65536 accumulation steps", src,
                     cfg->batch_size, mbs);
            cfg->gradient_accumulation_steps = cfg->batch_size / mbs;
        }
    }
    if (!strcmp(cfg->fp16, "true"))
        fail("%s: fp16: true: float16 compute is not implemented; use bf16: true (dtype bfloat16 with "
             "float32 master weights) or bf16: false (float32)", src);
    if (cfg->bf16[0]) {
        const char *want = strcmp(cfg->bf16, "false") ? "bfloat16" : "float32";
        if (given(cfg, "dtype") && strcmp(cfg->precision, want))
            fail("%s: bf16: %s means dtype %s, but dtype is %s; set only one of them", src, cfg->bf16,
                 want, cfg->precision);
        snprintf(cfg->precision, sizeof cfg->precision, "%s", want);
        if (strcmp(cfg->bf16, "true"))
            printf("note: bf16: %s runs as dtype %s (GPU compute precision with float32 master weights; "
                   "the CPU backend computes in float32)\n", cfg->bf16, want);
    }
    // Axolotl's validator turns these into gradient_checkpointing: true and sets
    // activation_offloading, over any value the config gave it.
    const char *gc = cfg->gradient_checkpointing;
    if (!strcmp(gc, "offload") || !strcmp(gc, "offload_disk")) {
        const char *ao = strcmp(gc, "offload") ? "disk" : "true";
        if (given(cfg, "activation_offloading") && strcmp(cfg->activation_offloading, ao) &&
            strcmp(cfg->activation_offloading, "false"))
            fail("%s: gradient_checkpointing: %s means activation_offloading: %s, but activation_offloading is "
                 "%s; set only activation_offloading (with gradient_checkpointing: true)", src, gc, ao,
                 cfg->activation_offloading);
        printf("note: gradient_checkpointing: %s runs as gradient_checkpointing: true with activation_offloading: "
               "%s, as Axolotl does\n", gc, ao);
        snprintf(cfg->activation_offloading, sizeof cfg->activation_offloading, "%s", ao);
        snprintf(cfg->gradient_checkpointing, sizeof cfg->gradient_checkpointing, "true");
    }
    if (cfg->load_in_8bit) {
        if (cfg->bnb_int8_fp16_weight)
            fail("%s: bnb_config_kwargs: llm_int8_has_fp16_weight: true keeps 16-bit weights beside the 8-bit ones; "
                 "load_in_8bit here stores int8 weights only (the default, false)", src);
        printf("note: load_in_8bit: the frozen layer weights are stored as bitsandbytes' int8 (a scale per row) and "
               "dequantized for every product; bitsandbytes' LLM.int8 forward also rounds activations to int8 "
               "(outside columns past llm_int8_threshold), which this program does not: losses are the dequantized "
               "model's\n");
    }
    if (cfg->deepspeed[0]) finish_deepspeed(cfg, src);
    if (cfg->fsdp_config_given && !cfg->fsdp_given && !given(cfg, "zero_stage")) {
        cfg->fsdp = 1;
        printf("note: fsdp_config without fsdp: sharding parameters, gradients and optimizer state (zero_stage 3)\n");
    }
    if (cfg->warmup_ratio > 0 && cfg->warmup_steps > 0)
        fail("%s: set warmup_steps (%d) or warmup_ratio (%g), not both", src, cfg->warmup_steps, cfg->warmup_ratio);
    // Axolotl applies the quadratic warmup to the cosine schedule only, and there without the
    // minimum (it warns that the quadratic warmup wins).
    if (cfg->lr_quadratic_warmup) {
        if (strcmp(cfg->lr_scheduler, "cosine")) {
            printf("note: lr_quadratic_warmup has no effect with lr_scheduler %s (Axolotl applies it to cosine only); "
                   "the warmup is linear\n", cfg->lr_scheduler);
            cfg->lr_quadratic_warmup = 0;
        } else if (!strcmp(cfg->warmup_style, "llmc")) {
            fail("%s: lr_quadratic_warmup: true and warmup_style: llmc are two warmups; give one", src);
        } else if (cfg->cosine_min_lr_ratio > 0 || cfg->final_lr_fraction > 0) {
            printf("note: lr_quadratic_warmup: the cosine decays to 0, not to %s %g, as in Axolotl (whose quadratic "
                   "warmup schedule has no minimum)\n", cfg->final_lr_fraction > 0 ? "final_lr_fraction" : "cosine_min_lr_ratio",
                   cfg->final_lr_fraction > 0 ? cfg->final_lr_fraction : cfg->cosine_min_lr_ratio);
            cfg->cosine_min_lr_ratio = 0, cfg->final_lr_fraction = -1;
        }
    }
    if (cfg->cosine_min_lr_ratio > 0 && strcmp(cfg->lr_scheduler, "cosine"))
        fail("%s: cosine_min_lr_ratio needs lr_scheduler: cosine (it is %s)", src, cfg->lr_scheduler);
    if (cfg->final_lr_fraction >= 0) {  // llm.c's -q: the decay's end for cosine, linear and wsd
        if (cfg->cosine_min_lr_ratio > 0)
            fail("%s: set final_lr_fraction or cosine_min_lr_ratio, not both", src);
        cfg->cosine_min_lr_ratio = cfg->final_lr_fraction;
    }
    if (cfg->eval_steps_spec > 0 && cfg->evals_per_epoch)
        fail("%s: set eval_steps or evals_per_epoch, not both", src);
    if (cfg->save_steps_spec > 0 && cfg->saves_per_epoch)
        fail("%s: set save_steps or saves_per_epoch, not both", src);
    if (!strcmp(cfg->eval_strategy, "epoch") && (cfg->eval_steps_spec > 0 || cfg->evals_per_epoch))
        fail("%s: eval_strategy: epoch conflicts with eval_steps/evals_per_epoch; drop one", src);
    if (!strcmp(cfg->save_strategy, "epoch") && (cfg->save_steps_spec > 0 || cfg->saves_per_epoch))
        fail("%s: save_strategy: epoch conflicts with save_steps/saves_per_epoch; drop one", src);
    if (cfg->early_stopping_patience && !cfg->val_data[0] && !prepare_wants_data(cfg))
        fail("%s: early_stopping_patience needs val_data (validation shards) to watch val_loss", src);
    if (cfg->early_stopping_patience && !strcmp(cfg->eval_strategy, "no"))
        fail("%s: early_stopping_patience needs evaluations, but eval_strategy is no", src);
    // Whole step counts are known now; fractions and per-epoch counts wait for the data size.
    cfg->eval_steps = cfg->eval_steps_spec >= 1 ? (int)cfg->eval_steps_spec : 0;
    cfg->save_steps = cfg->save_steps_spec >= 1 ? (int)cfg->save_steps_spec : 0;
    if (cfg->auto_resume_from_checkpoints && !cfg->resume_from_checkpoint[0])
        snprintf(cfg->resume_from_checkpoint, sizeof cfg->resume_from_checkpoint, "auto");
    // A hub id that is not a local path resolves in the local Hugging Face cache (never the network).
    // revision_of_model picks the snapshot (Axolotl passes it to from_pretrained, which ignores it
    // for a local directory).
    const char *rev = cfg->revision_of_model;
    for (const char *c = rev; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || strchr("-_./", *c)) ||
            (c == rev && *c == '/') || !strncmp(c, "..", 2))
            fail("%s: revision_of_model '%s' is not a branch, tag or commit name (letters, digits, '-', '_', '.', '/', "
                 "no '..')", src, rev);
    if (cfg->base_model[0] && !path_exists(cfg->base_model) &&
        hf_is_hub_id(cfg->base_model)) {
        char dir[1024], why[2048];
        if (hf_resolve(cfg->base_model, rev, dir, sizeof dir, why, sizeof why))
            fail("%s: base_model: %s", src, why);
        snprintf(cfg->base_model_id, sizeof cfg->base_model_id, "%.255s", cfg->base_model);
        snprintf(cfg->base_model, sizeof cfg->base_model, "%s", dir);
        printf("base_model %s%s%s: %s (Hugging Face cache)\n", cfg->base_model_id, rev[0] ? " at revision " : "", rev,
               dir);
    } else if (rev[0]) {
        printf("note: revision_of_model (%s) has no effect here: base_model %s is a local directory, whose files are "
               "the ones read (transformers ignores a revision for a local directory too)\n", rev,
               cfg->base_model[0] ? cfg->base_model : "(none)");
    }
}

// datasets: (prepared by scripts/prepare_data.py) or train_data shards, and the pipeline's keys.
static void finish_data_keys(Config *cfg, const char *src) {
    cfg->datasets_run = prepare_wants_data(cfg);
    if (cfg->datasets_run) {
        if (cfg->train_data[0])
            fail("%s: set datasets (prepared from your files by scripts/prepare_data.py) or train_data (token "
                 "shards), not both", src);
        if (cfg->val_data[0])
            fail("%s: val_data (token shards) does not go with datasets:; evaluate with val_set_size or "
                 "test_datasets", src);
        prepare_resolve_tokenizer(cfg);
        return;
    }
    if (cfg->preprocess_only)
        fail("%s: --preprocess prepares datasets: (or pretraining_dataset:), and this config has none", src);
    if (!cfg->train_data[0])
        fail("%s: no training data: set datasets (Axolotl's list of dataset files) or train_data (a token "
             "shard path or glob)", src);
    rules_check_data_keys();
}

// Parameters in host memory (the key offload_params, FSDP's and DeepSpeed's parameter
// offload). In an adapter run the parameters are the frozen base, which layer_offloading keeps
// in host memory and streams to the device a layer at a time, and the adapters, whose AdamW
// state offload_optimizer keeps on the host; the adapters' own weights and gradients (a small
// fraction) stay on the device. A full fine-tune runs ZeRO-3 with its pieces of the weights
// and their float gradients in host memory: each unit is copied up and gathered for use, and
// its reduced gradient piece is added into host memory as the backward finishes it; the update
// then runs on the host (offload_optimizer), where the gradients are. Every placement trains
// the same bits as the run without it.
static void finish_offload_params(Config *cfg) {
    const char *what = cfg->offload_params_from;
    if (given(cfg, "offload_params") && !cfg->offload_params)
        fail("%s asks for the weights in host memory, but the config sets offload_params: false", what);
    if (given(cfg, "offload_optimizer") && !cfg->offload_optimizer)
        fail("%s means offload_optimizer: true (the update runs where the offloaded state is), but the config "
             "sets offload_optimizer: false", what);
    const int had_optimizer = cfg->offload_optimizer;
    cfg->offload_optimizer = 1;
    if (strcmp(cfg->adapter, "none")) {
        if (given(cfg, "layer_offloading") && !cfg->layer_offloading)
            fail("%s means layer_offloading: true and offload_optimizer: true, but the config sets "
                 "layer_offloading: false", what);
        cfg->layer_offloading = 1;
        cfg->offload_params = 0;  // done by the two above
        printf("note: %s runs as layer_offloading: true (the frozen base weights in host memory, streamed to the "
               "device a layer at a time) and offload_optimizer: true (the adapters' fp32 master and AdamW moments "
               "on the host); the adapters' own weights and gradients stay on the device\n", what);
        return;
    }
    const int z3 = cfg->fsdp || cfg->zero_stage == 3;
    if (!z3 && (given(cfg, "zero_stage") || cfg->deepspeed[0]))
        fail("%s: a full fine-tune keeps its weights in host memory as ZeRO-3 pieces (each layer gathered to the "
             "device for its use), but this run has zero_stage %d; use zero_stage: 3 (DeepSpeed stage 3, fsdp: "
             "full_shard)", what, cfg->zero_stage);
    cfg->zero_stage = 3;
    cfg->offload_params = 1;
    printf("note: %s: the full fine-tune runs as zero_stage 3%s with its pieces of the weights and their float "
           "gradients in host memory (each layer's weights copied to the device and gathered for its forward and "
           "backward, its gradients reduced on the device and added into host memory) and offload_optimizer: "
           "true%s\n", what, z3 ? "" : " (set by it)",
           had_optimizer ? "" : " (set by it: the update runs on the host, where the gradients are)");
}

void config_finish(Config *cfg) {
    const char *src = cfg->path[0] ? cfg->path : "config";
    if (cfg->base_model[0] && cfg->has_model_block)
        fail("%s: set either base_model or a model: block, not both", src);
    if (!cfg->base_model[0] && !cfg->has_model_block)
        fail("%s: no model: set base_model (a Hugging Face directory) or a model: block", src);
    finish_axolotl_keys(cfg, src);
    if (cfg->offload_params && !cfg->offload_params_from[0])
        snprintf(cfg->offload_params_from, sizeof cfg->offload_params_from, "%s: offload_params: true", src);
    if (cfg->offload_params_from[0]) finish_offload_params(cfg);
    if (cfg->model_config_key[0]) {
        const char *mk = cfg->model_config_key;
        const int line = cfg->model_config_line;
        if (cfg->arch == ARCH_GPT2)
            fail("%s:%d: %s: train_gpt reads llm.c's GPT-2 model files, which have no config.json to override", src,
                 line, mk);
        if (!cfg->base_model[0])
            fail("%s:%d: %s overrides base_model's config.json; a model: block sets the fields itself", src, line, mk);
        const cJSON *o = cfg->yaml_json ? cJSON_GetObjectItemCaseSensitive((const cJSON *)cfg->yaml_json, mk) : NULL;
        if (!cJSON_IsObject(o)) fail("%s:%d: %s must be a mapping of config.json keys", src, line, mk);
        if (cfg->rope_scaling_json[0] && cJSON_GetObjectItemCaseSensitive(o, "rope_scaling"))
            fail("%s:%d: rope_scaling is given twice, at the top level (line %d) and under %s; give it once (Axolotl "
                 "reads it under %s)", src, line, cfg->rope_scaling_line, mk, mk);
    }
    // The optimizer runs in float32: a beta that rounds to 1 makes the bias correction 0/0 and
    // an epsilon of 0 divides 0 by 0 for every weight whose gradient is 0.
    const char *beta_key[2] = {"adam_beta1", "adam_beta2"};
    const double beta[2] = {cfg->adam_beta1, cfg->adam_beta2};
    for (int i = 0; i < 2; i++)
        if (!((float)beta[i] < 1.0f))
            fail("%s: key '%s' = %.10g is 1.0 in float32 (the optimizer's precision), which makes "
                 "every update NaN; use at most 0.9999999", src, beta_key[i], beta[i]);
    if (!((float)cfg->adam_epsilon > 0.0f))
        fail("%s: key 'adam_epsilon' = %g is 0 in float32; it must be > 0 (a zero gradient "
             "would divide 0 by 0); the usual value is 1e-8", src, cfg->adam_epsilon);
    // fan_in_fan_out follows the layers, as in PEFT (which overrides a wrong value with a warning):
    // true is refused where no layer is Conv1D; false on GPT-2 gets PEFT's warning as a note.
    if (cfg->arch != ARCH_GPT2 && !strcmp(cfg->lora_fan_in_fan_out, "true"))
        fail("%s: key 'lora_fan_in_fan_out' (true) is not supported: Conv1D-style (fan_in_fan_out) layers do "
             "not occur in Llama-family models", src);
    if (cfg->arch == ARCH_GPT2 && !strcmp(cfg->lora_fan_in_fan_out, "false") && strcmp(cfg->adapter, "none"))
        printf("note: lora_fan_in_fan_out: false, but GPT-2's c_attn/c_proj/c_fc are Conv1D layers, for which "
               "PEFT sets fan_in_fan_out to true; so does this run\n");
    if (cfg->lora_modules_to_save[0] && !strcmp(cfg->adapter, "none") && strcmp(cfg->lora_modules_to_save, "[]"))
        fail("%s: lora_modules_to_save (%s) trains modules beside an adapter, and this run has none (adapter: lora "
             "or qlora)", src, cfg->lora_modules_to_save);
    if (cfg->unfrozen_parameters[0]) {  // checked here, so errors name the config
        if (strcmp(cfg->adapter, "none"))
            fail("%s: unfrozen_parameters chooses what a full fine-tune trains; with adapter: %s only the "
                 "adapters train (drop one of them)", src, cfg->adapter);
        Unfrozen u;
        unfrozen_compile(&u, cfg->unfrozen_parameters, src);
        unfrozen_free(&u);
    }
    if ((cfg->lisa_n_layers > 0) != (cfg->lisa_step_interval > 0)) {  // Axolotl turns LISA on with both
        printf("note: %s has no effect without %s: LISA needs both (as in Axolotl)\n",
               cfg->lisa_n_layers ? "lisa_n_layers" : "lisa_step_interval",
               cfg->lisa_n_layers ? "lisa_step_interval" : "lisa_n_layers");
        cfg->lisa_n_layers = cfg->lisa_step_interval = 0;
    }
    if (cfg->lisa_n_layers) {
        if (strcmp(cfg->adapter, "none"))
            fail("%s: lisa_n_layers with adapter: %s is not implemented (LISA here trains whole decoder layers in "
                 "a full fine-tune; Axolotl's callback would unfreeze the base weights of the drawn layers too)",
                 src, cfg->adapter);
        if (cfg->unfrozen_parameters[0])
            fail("%s: lisa_n_layers with unfrozen_parameters: both choose what trains (drop one of them)", src);
    }
    if (cfg->fsdp) cfg->zero_stage = 3;
    if (cfg->zero_stage == 2) fail("%s: zero_stage 2 is not supported: use 1 (optimizer state) or 3 (fsdp)", src);
    finish_data_keys(cfg, src);
    finish_rl(cfg, src);
    if (cfg->has_model_block) {
        ModelConfig *m = &cfg->model;
        if (cfg->arch == ARCH_GPT2) gpt2_complete_config(m);  // 4C MLP, MHA, padded vocab
        const char *need[] = {"hidden_size", "intermediate_size", "num_hidden_layers",
                              "num_attention_heads"};
        int vals[] = {m->hidden_size, m->intermediate_size, m->num_hidden_layers,
                      m->num_attention_heads};
        for (int i = 0; i < 4; i++)
            if (vals[i] <= 0) fail("%s: model block needs key 'model.%s'", src, need[i]);
        if (!m->num_key_value_heads) m->num_key_value_heads = m->num_attention_heads;
        if (!m->head_dim) {
            if (m->hidden_size % m->num_attention_heads)
                fail("%s: model.hidden_size (%d) is not a multiple of model.num_attention_heads (%d); "
                     "set model.head_dim", src, m->hidden_size, m->num_attention_heads);
            m->head_dim = m->hidden_size / m->num_attention_heads;
        }
        model_config_validate(m, src);
    }
}

void config_print_help(FILE *f) {
    fprintf(f,
            "usage: train_llama -c CONFIG.yaml [--set key=value]... [--plan | --preprocess] [--profile]\n"
            "  --plan  print the memory plan of every mode and exit without training\n"
            "  --profile  time every op of each step; print where a step's time goes at the end\n"
            "  --preprocess  prepare the config's datasets: (scripts/prepare_data.py, cached) and exit\n"
            "       train_llama --quantize IN_DIR OUT_DIR\n"
            "  write IN_DIR's model with NF4 decoder weights in bitsandbytes' layout\n"
            "Trains a Llama-family model. Keys (YAML, Axolotl names; --set overrides):\n");
    for (size_t i = 0; i < NKEYS; i++) {
        const KeyDef *k = &KEYS[i];
        char def[64];
        snprintf(def, sizeof def, "%s", k->def ? (k->def[0] ? k->def : "\"\"") : k->type == T_ENUM ? "unset" : "required");
        fprintf(f, "  %-30s %-9s %s", k->name, def, k->help);
        if (k->choices) fprintf(f, " (%s)", k->choices);
        fputc('\n', f);
    }
}

void config_from_args(Config *cfg, int argc, char **argv, int arch) {
    set_defaults(cfg);
    cfg->arch = arch;
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            config_print_help(stdout);
            exit(0);
        } else if (!strcmp(argv[i], "-c") || !strcmp(argv[i], "--config")) {
            if (++i >= argc) fail("-c needs a YAML file");
            path = argv[i];
        } else if (!strcmp(argv[i], "--plan")) {
            cfg->plan_only = 1;
        } else if (!strcmp(argv[i], "--profile")) {
            cfg->profile = 1;
        } else if (!strcmp(argv[i], "--preprocess")) {
            cfg->preprocess_only = 1;
        } else if (!strcmp(argv[i], "--set")) {
            if (++i >= argc) fail("--set needs key=value");
        } else {
            fail("unknown argument '%s' (see --help)", argv[i]);
        }
    }
    if (cfg->profile && (cfg->plan_only || cfg->preprocess_only))
        fail("--profile times training steps; --plan and --preprocess run none");
    // train_gpt builds its llm.c flags into --set settings and may have no file.
    if (!path && arch != ARCH_GPT2) fail("no config: use -c CONFIG.yaml (see --help)");
    if (path) config_load_yaml(cfg, path);
    // --set applies after the file, in order, whatever its position on the line.
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--set")) continue;
        char *kv = argv[++i], *eq = strchr(kv, '=');
        if (!eq) fail("--set '%s': expected key=value", kv);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
        config_set(cfg, key, eq + 1, "--set");
        if (!strchr(key, '.')) prepare_json_set(cfg, key, eq + 1);
    }
    config_finish(cfg);
}

void config_plan_steps(Config *cfg, size_t windows) {
    const int accum = cfg->gradient_accumulation_steps;
    const double per_epoch = (double)windows / accum;  // optimizer steps in one pass over train_data
    const int spe = per_epoch < 1 ? 1 : (int)ceil(per_epoch - 1e-9);
    if (!cfg->max_steps) {
        double ep = cfg->num_epochs > 0 ? cfg->num_epochs : 1;
        if (cfg->num_epochs <= 0) printf("num_epochs not set: training 1 epoch (Axolotl's default; set max_steps or num_epochs)\n");
        double total = ceil(ep * per_epoch - 1e-9);
        if (total > BIG) fail("num_epochs %g x %d steps per epoch is more than %.0f steps", ep, spe, BIG);
        cfg->max_steps = total < 1 ? 1 : (int)total;
        printf("%g epochs x %g steps per epoch = %d steps (%zu batches of %d x %d tokens per epoch, "
               "gradient_accumulation_steps %d)\n", ep, per_epoch, cfg->max_steps, windows,
               (int)(windows ? cfg->micro_batch_size : 0), cfg->sequence_len, accum);
    } else {
        printf("max_steps %d = %.3g epochs of %g steps%s\n", cfg->max_steps, cfg->max_steps / per_epoch, per_epoch,
               cfg->num_epochs > 0 ? " (max_steps overrides num_epochs)" : "");
    }
    const int S = cfg->max_steps;
    // Warmup as Axolotl's trainer builder sets it (HF-style schedules only; llm.c's warmup_style
    // keeps its own): int(warmup_ratio x steps); neither key given: 3% of the steps, at most
    // 100. The products are the same doubles as Python's. Axolotl also turns a warmup of 1 into
    // 2; that one is noted, not copied (a run asks for 1 step on purpose).
    if (!strcmp(cfg->warmup_style, "hf")) {
        if (cfg->warmup_ratio > 0) {
            cfg->warmup_steps = (int)(cfg->warmup_ratio * S);
            printf("warmup_ratio %g: %d warmup steps\n", cfg->warmup_ratio, cfg->warmup_steps);
        } else if (!given(cfg, "warmup_steps") && !given(cfg, "warmup_ratio")) {
            const int w = (int)(0.03 * S);
            cfg->warmup_steps = w < 100 ? w : 100;
            if (cfg->warmup_steps && strcmp(cfg->lr_scheduler, "constant"))
                printf("warmup: %d steps (neither warmup_steps nor warmup_ratio given: Axolotl's default, 3%% of the "
                       "%d steps, at most 100; warmup_steps: 0 for none)\n", cfg->warmup_steps, S);
        }
        if (cfg->warmup_steps == 1)
            printf("note: a warmup of 1 step: Axolotl's trainer builder turns 1 into 2; this run warms up for 1 step as "
                   "written (warmup_steps: 2 for Axolotl's)\n");
    } else if (cfg->warmup_ratio > 0) {
        cfg->warmup_steps = (int)ceil(cfg->warmup_ratio * S - 1e-9);
        printf("warmup_ratio %g: %d warmup steps\n", cfg->warmup_ratio, cfg->warmup_steps);
    }
    // Hugging Face's "constant" (get_constant_schedule) and llm.c's have no warmup, whatever
    // warmup_steps says; "constant_with_warmup" has one.
    if (!strcmp(cfg->lr_scheduler, "constant") && cfg->warmup_steps > 0) {
        if (given(cfg, "warmup_steps") || given(cfg, "warmup_ratio"))
            printf("note: lr_scheduler constant has no warmup (as in Hugging Face and llm.c): the %d warmup steps are "
                   "not used; lr_scheduler: constant_with_warmup for them\n", cfg->warmup_steps);
        cfg->warmup_steps = 0;
    }
    // Evaluation: Hugging Face rounds a fraction of all steps up; per epoch rounds down (at least 1).
    const int have_val = cfg->val_data[0] != 0 || cfg->has_eval_rows;
    if (!strcmp(cfg->eval_strategy, "no")) {
        cfg->eval_steps = 0;
        if (have_val) printf("eval_strategy: no: val_data is never evaluated\n");
    } else if (cfg->eval_steps_spec > 0 && cfg->eval_steps_spec < 1) {
        cfg->eval_steps = (int)ceil(cfg->eval_steps_spec * S - 1e-9);
    } else if (cfg->evals_per_epoch) {
        cfg->eval_steps = spe / cfg->evals_per_epoch > 0 ? spe / cfg->evals_per_epoch : 1;
    } else if (have_val && (!cfg->eval_steps || !strcmp(cfg->eval_strategy, "epoch"))) {
        cfg->eval_steps = spe;
        printf("%s%s: evaluating every epoch (every %d steps) and after the last step\n",
               cfg->val_data[0] ? "val_data" : "eval data", strcmp(cfg->eval_strategy, "epoch") ? " without eval_steps" : "", spe);
    }
    if (cfg->eval_steps && have_val && (cfg->eval_steps_spec < 1 || cfg->evals_per_epoch))
        printf("evaluating every %d steps\n", cfg->eval_steps);
    if (cfg->early_stopping_patience && !cfg->eval_steps)
        fail("early_stopping_patience needs evaluations: set eval_steps or evals_per_epoch");
    // Checkpoints
    if (!strcmp(cfg->save_strategy, "no")) {
        cfg->save_steps = 0;
        printf("save_strategy: no: no intermediate checkpoints (the last step's is still written)\n");
    } else if (cfg->save_steps_spec > 0 && cfg->save_steps_spec < 1) {
        cfg->save_steps = (int)ceil(cfg->save_steps_spec * S - 1e-9);
    } else if (cfg->saves_per_epoch) {
        cfg->save_steps = spe / cfg->saves_per_epoch > 0 ? spe / cfg->saves_per_epoch : 1;
    } else if (!strcmp(cfg->save_strategy, "epoch")) {
        cfg->save_steps = spe;
    }
    if (cfg->save_steps && (cfg->save_steps_spec < 1 || cfg->saves_per_epoch))
        printf("saving a checkpoint every %d steps and after the last step\n", cfg->save_steps);
    if (cfg->save_only_model)
        printf("save_only_model: checkpoints hold no optimizer state and cannot be resumed (one written when "
               "the run is interrupted still can)\n");
    if (cfg->save_total_limit)
        printf("save_total_limit %d: older checkpoint-* directories are removed after each save\n",
               cfg->save_total_limit);
    fflush(stdout);
}

static int cmp_int(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

void config_prune_checkpoints(const Config *cfg, int keep_step) {
    if (cfg->save_total_limit <= 0) return;
    DIR *d = opendir(cfg->output_dir);
    if (!d) return;
    int *steps = NULL, n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        const char *name = e->d_name;
        if (strncmp(name, "checkpoint-", 11) || !name[11] || strspn(name + 11, "0123456789") != strlen(name + 11))
            continue;
        if (n == cap) steps = realloc(steps, sizeof(int) * (size_t)(cap = cap ? 2 * cap : 16));
        if (!steps) fail("out of memory listing %s", cfg->output_dir);
        steps[n++] = atoi(name + 11);
    }
    closedir(d);
    qsort(steps, (size_t)n, sizeof(int), cmp_int);
    for (int i = 0, left = n; i < n && left > cfg->save_total_limit; i++) {
        if (steps[i] == keep_step) continue;  // never the one just written
        char path[4096];
        snprintf(path, sizeof path, "%s/checkpoint-%d", cfg->output_dir, steps[i]);
        if (remove_tree(path) == 0) {
            printf("save_total_limit %d: removed %s\n", cfg->save_total_limit, path);
            left--;
        } else {
            fprintf(stderr, "warning: save_total_limit: cannot remove %s: %s\n", path, strerror(errno));
            left--;
        }
    }
    free(steps);
}

void config_mem_policy(const Config *cfg, MemPolicy *p) {
    memset(p, 0, sizeof *p);
    const char *gc = cfg->gradient_checkpointing, *ao = cfg->activation_offloading;
    p->recompute = !strcmp(gc, "true") ? RC_FULL : !strcmp(gc, "selective") ? RC_SELECTIVE : RC_NONE;
    p->every = cfg->gradient_checkpointing_every;
    p->tier = !strcmp(ao, "true") ? TIER_HOST : !strcmp(ao, "legacy") ? TIER_HOST_SYNC
            : !strcmp(ao, "disk") ? TIER_DISK : TIER_DEVICE;
    if (!strcmp(ao, "hidden_states")) {
        // Checkpoint every layer and send only each layer's input to the host.
        p->recompute = RC_FULL, p->every = 1, p->tier = TIER_HOST, p->hidden_states = 1;
    }
    p->min_offload = (size_t)cfg->min_offload_size;
    p->max_stash = cfg->max_fwd_stash_size;
    p->tiled_mlp = cfg->tiled_mlp;
    p->tiled_attention = cfg->tiled_attention;
    p->stream_frozen = cfg->layer_offloading;
    p->mlp_shards = cfg->tiled_mlp_shards;
    snprintf(p->disk_dir, sizeof p->disk_dir, "%s", cfg->activation_offloading_dir);
}

// A comma-separated list as a cJSON array of strings (ints: numbers); NULL when empty.
static cJSON *csv_array(const char *src, const char *key, const char *csv, int ints) {
    if (!csv[0]) return NULL;
    cJSON *a = cJSON_CreateArray();
    char *copy = xmalloc(strlen(csv) + 1);
    strcpy(copy, csv);
    for (char *save, *tok = strtok_r(copy, ", []", &save); tok; tok = strtok_r(NULL, ", []", &save)) {
        if (!ints) {
            cJSON_AddItemToArray(a, cJSON_CreateString(tok));
            continue;
        }
        char *end;
        long v = strtol(tok, &end, 10);
        if (*end || v < 0 || v > 1000000) {
            free(copy);
            cJSON_Delete(a);
            fail("%s: %s: '%s' is not a layer index", src, key, tok);
        }
        cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v));
    }
    free(copy);
    return a;
}

void config_lora(const Config *cfg, const ModelConfig *mc, LoraConfig *lora) {
    memset(lora, 0, sizeof *lora);
    if (!strcmp(cfg->adapter, "none")) return;
    const char *src = cfg->path[0] ? cfg->path : "config";
    lora->r = cfg->lora_r;
    lora->alpha = (float)cfg->lora_alpha;
    lora->dropout = (float)cfg->lora_dropout;
    lora->rslora = cfg->use_rslora;
    char mts[sizeof cfg->lora_modules_to_save];
    snprintf(mts, sizeof mts, "%s", cfg->lora_modules_to_save);
    for (char *sv, *w = strtok_r(mts, ", []", &sv); w; w = strtok_r(NULL, ", []", &sv)) {
        const char *why = peft_module_to_save(lora, mc, w);
        if (why) fail("%s: lora_modules_to_save: '%s': %s", src, w, why);
    }
    // A sequence classifier's head trains beside the adapters: PEFT's SEQ_CLS task (Axolotl's for
    // a reward model) puts classifier and score in modules_to_save.
    if (mc->num_labels) peft_module_to_save(lora, mc, "score");
    const char *tm = cfg->lora_target_modules;
    if (!tm[0] && !cfg->lora_target_linear)
        fail("%s: adapter: %s needs lora_target_modules or lora_target_linear: true", src, cfg->adapter);
    // lora_target_modules as PEFT's target_modules: a YAML list (or "[a,b]") is a list of names;
    // a string with regex characters a regular expression; any other string a comma-separated
    // list of names. lora_target_linear adds every projection's short name (Axolotl).
    int is_list = tm[0] == '[' || !tm[tm[0] ? strcspn(tm, "\\*+?()|{}^$[]") : 0];
    if (!is_list && cfg->lora_target_linear)
        fail("%s: lora_target_linear: true adds names to a list of lora_target_modules, not to the regex '%s'",
             src, tm);
    if (!strcmp(tm, "all-linear")) is_list = 0;
    cJSON *t = is_list ? csv_array(src, "lora_target_modules", tm, 0) : cJSON_CreateString(tm);
    cJSON *ltt = csv_array(src, "peft_layers_to_transform", cfg->peft_layers_to_transform, 1);
    cJSON *lp = csv_array(src, "peft_layers_pattern", cfg->peft_layers_pattern, 0);
    if (lp && !ltt)
        fail("%s: peft_layers_pattern only says where peft_layers_to_transform finds the layer index; give "
             "peft_layers_to_transform too", src);
    const PeftKeys k = {src, "lora_target_modules", "peft_layers_to_transform", "peft_layers_pattern", 1};
    peft_select(&k, t, ltt, lp, cfg->lora_target_linear, mc, lora);
    cJSON_Delete(t);
    cJSON_Delete(ltt);
    cJSON_Delete(lp);
}
