// config.c: the key table and the YAML/--set readers built on it.
#include "config.h"
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>
#include "gpt2_io.h"
#include "util.h"

typedef enum { T_INT, T_FLOAT, T_BOOL, T_STR, T_ENUM, T_SIZE, T_LIST } KeyType;

typedef struct {
    const char *name;
    KeyType type;
    size_t off, size;   // where in Config; size for strings
    const char *def;    // default as text (NULL: none)
    double lo, hi;      // range for numbers
    const char *choices;  // "a|b|c" for enums
    const char *help;
} KeyDef;

#define NUM(key, typ, field, def, lo, hi, help) \
    {key, typ, offsetof(Config, field), 0, def, lo, hi, NULL, help}
#define STR(key, field, def, help) \
    {key, T_STR, offsetof(Config, field), sizeof(((Config *)0)->field), def, 0, 0, NULL, help}
#define ENUM(key, field, def, choices, help) \
    {key, T_ENUM, offsetof(Config, field), sizeof(((Config *)0)->field), def, 0, 0, choices, help}
#define BIG 2147483647.0

static const KeyDef KEYS[] = {
    STR("base_model", base_model, "", "Hugging Face model directory (config.json + safetensors)"),
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
    NUM("max_steps", T_INT, max_steps, "100", 1, BIG, "optimizer steps"),
    NUM("learning_rate", T_FLOAT, learning_rate, "3e-4", 0, 10, "peak learning rate"),
    ENUM("lr_scheduler", lr_scheduler, "cosine", "constant|linear|cosine", "schedule after warmup"),
    NUM("warmup_steps", T_INT, warmup_steps, "0", 0, BIG, "linear warmup steps"),
    NUM("weight_decay", T_FLOAT, weight_decay, "0", 0, 10, "AdamW decoupled weight decay"),
    NUM("max_grad_norm", T_FLOAT, max_grad_norm, "1.0", 0, 1e30, "global-norm clipping; 0 disables"),
    NUM("adam_beta1", T_FLOAT, adam_beta1, "0.9", 0, 1, "AdamW beta1, below 1 in float32"),
    NUM("adam_beta2", T_FLOAT, adam_beta2, "0.999", 0, 1, "AdamW beta2, below 1 in float32"),
    NUM("adam_epsilon", T_FLOAT, adam_epsilon, "1e-8", 0, 1, "AdamW epsilon, > 0 in float32"),
    NUM("seed", T_INT, seed, "42", 0, BIG, "seed for init, shuffling and sampling"),
    NUM("eval_steps", T_INT, eval_steps, "0", 0, BIG, "evaluate every N steps; 0 disables"),
    NUM("eval_batches", T_INT, eval_batches, "8", 1, BIG, "validation batches per evaluation"),
    NUM("sample_steps", T_INT, sample_steps, "0", 0, BIG, "print a sample every N steps (byte vocab)"),
    NUM("sample_tokens", T_INT, sample_tokens, "200", 1, 100000, "length of a sample"),
    NUM("save_steps", T_INT, save_steps, "0", 0, BIG, "checkpoint every N steps; 0: only at the end"),
    NUM("log_steps", T_INT, log_steps, "1", 1, BIG, "print a step line every N steps"),
    STR("output_dir", output_dir, "out", "metrics, checkpoints and the final model"),
    STR("resume_from_checkpoint", resume_from_checkpoint, "",
        "checkpoint directory to continue from, or auto (the latest in output_dir)"),
    ENUM("gradient_checkpointing", gradient_checkpointing, "false", "false|true|selective",
         "recompute in backward: true keeps only layer inputs, selective keeps matmul outputs"),
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
    NUM("tiled_mlp_shards", T_INT, tiled_mlp_shards, "0", 0, 1 << 20, "MLP tiles; 0 = ceil(T / hidden_size)"),
    NUM("host_memory_limit", T_SIZE, host_memory_limit, "0", 0, 1e18,
        "host memory a plan may use (--plan, auto); 0 = this machine's RAM"),
    NUM("device_memory_limit", T_SIZE, device_memory_limit, "0", 0, 1e18,
        "device memory budget (e.g. 2GiB); 0 = none"),
    ENUM("adapter", adapter, "none", "none|lora|qlora", "train adapters over a frozen base"),
    NUM("lora_r", T_INT, lora_r, "8", 1, 65536, "LoRA rank"),
    NUM("lora_alpha", T_FLOAT, lora_alpha, "16", 1e-9, 1e9, "LoRA alpha (scale alpha/r)"),
    NUM("lora_dropout", T_FLOAT, lora_dropout, "0", 0, 0.999, "dropout on the adapter input"),
    {"lora_target_modules", T_LIST, offsetof(Config, lora_target_modules),
     sizeof(((Config *)0)->lora_target_modules), "", 0, 0, NULL,
     "list of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"},
    NUM("lora_target_linear", T_BOOL, lora_target_linear, "false", 0, 1, "adapt all seven projections"),
    NUM("use_rslora", T_BOOL, use_rslora, "false", 0, 1, "scale alpha/sqrt(r)"),
    STR("lora_model_dir", lora_model_dir, "", "start from this PEFT adapter directory"),
    NUM("merge_lora", T_BOOL, merge_lora, "false", 0, 1, "also write the merged model to output_dir/merged"),
    ENUM("save_dtype", save_dtype, "auto", "auto|float32|bfloat16|float16",
         "final model's dtype (auto: the base model's; checkpoints stay float32)"),
    NUM("max_shard_size", T_SIZE, max_shard_size, "5GB", 1, 1e18,
        "final model in indexed shards of at most this size"),
    NUM("load_in_4bit", T_BOOL, load_in_4bit, "false", 0, 1, "QLoRA: frozen layer weights in NF4"),
    NUM("layer_offloading", T_BOOL, layer_offloading, "false", 0, 1,
        "stream frozen layer weights from host memory through two device slots"),
    NUM("fsdp", T_BOOL, fsdp, "false", 0, 1, "shard parameters, gradients and optimizer (zero_stage 3)"),
    NUM("zero_stage", T_INT, zero_stage, "0", 0, 3, "0: all-reduce gradients; 1: shard optimizer state; 3: fsdp"),
    NUM("offload_optimizer", T_BOOL, offload_optimizer, "false", 0, 1,
        "fp32 master and AdamW moments in host memory, updated on the CPU"),
    ENUM("device", device, "auto", "auto|cpu|cuda",
         "backend; auto = CUDA when a GPU is present ($LLMC_DEVICE sets the default)"),
    ENUM("dtype", precision, "bfloat16", "bfloat16|float32",
         "GPU compute precision (fp32 master weights either way); the CPU computes in float32"),
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

static const char *closest_key(const char *name) {
    const char *best = KEYS[0].name;
    int bd = 1 << 30;
    for (size_t i = 0; i < NKEYS; i++) {
        // Compare against the bare name too, so "hidden_size" suggests "model.hidden_size".
        const char *k = KEYS[i].name, *dot = strchr(k, '.');
        int d = edit_distance(name, k);
        if (dot) {
            int d2 = edit_distance(name, dot + 1);
            if (d2 < d) d = d2;
        }
        if (d < bd) bd = d, best = k;
    }
    return best;
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

void config_set(Config *cfg, const char *key, const char *value, const char *origin) {
    const KeyDef *k = find_key(key);
    if (!k) fail("%s: unknown key '%s' (did you mean '%s'?)", origin, key, closest_key(key));
    char *field = (char *)cfg + k->off;
    char *end;
    switch (k->type) {
    case T_INT: {
        errno = 0;
        long long v = strtoll(value, &end, 10);
        if (*value == 0 || *end || errno)
            fail("%s: key '%s' expects an integer, got '%s'", origin, key, value);
        if (v < k->lo || v > k->hi)
            fail("%s: key '%s' must be in [%.0f, %.0f], got %lld", origin, key, k->lo, k->hi, v);
        if (k->off == offsetof(Config, seed)) *(long long *)field = v;
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
        if (k->off == offsetof(Config, model.rms_norm_eps)) *(float *)field = (float)v;
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
}

static void set_defaults(Config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    model_config_defaults(&cfg->model);
    for (size_t i = 0; i < NKEYS; i++)
        if (KEYS[i].def) config_set(cfg, KEYS[i].name, KEYS[i].def, "default");
    cfg->has_model_block = 0;
    const char *dev = getenv("LLMC_DEVICE");  // e.g. the test suite pins the CPU backend
    if (dev && *dev) config_set(cfg, "device", dev, "$LLMC_DEVICE");
}

static const char *scalar(yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static int is_null(yaml_node_t *n) {
    const char *s = scalar(n);
    return n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (!*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL"));
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
            if (!gpt2_descriptor(scalar(vn), &cfg->model))
                fail("%s: model '%s' is not a GPT-2 descriptor (d12, d24, d36, d48) or a mapping", origin, scalar(vn));
            cfg->has_model_block = 1;
            continue;
        }
        if (!*prefix && !strcmp(key, "model")) {
            if (vn->type != YAML_MAPPING_NODE)
                fail("%s: key 'model' expects a mapping of model fields (hidden_size: ...)", origin);
            load_mapping(cfg, doc, vn, "model.", path);
            cfg->has_model_block = 1;
            continue;
        }
        const KeyDef *kd = find_key(key);
        if (kd && kd->type == T_LIST && vn->type == YAML_SEQUENCE_NODE) {
            char joined[1024] = "";
            for (yaml_node_item_t *it = vn->data.sequence.items.start; it < vn->data.sequence.items.top; it++) {
                yaml_node_t *e = yaml_document_get_node(doc, *it);
                if (e->type != YAML_SCALAR_NODE) fail("%s: key '%s' expects a list of names", origin, key);
                size_t len = strlen(joined);
                snprintf(joined + len, sizeof joined - len, "%s%s", len ? "," : "", scalar(e));
            }
            config_set(cfg, key, joined, origin);
            continue;
        }
        if (vn->type != YAML_SCALAR_NODE) {
            if (!find_key(key))
                fail("%s: unknown key '%s' (did you mean '%s'?)", origin, key, closest_key(key));
            fail("%s: key '%s' expects a single value, not a %s", origin, key,
                 vn->type == YAML_MAPPING_NODE ? "mapping" : "list");
        }
        if (is_null(vn)) {
            const KeyDef *k = find_key(key);
            if (!k) fail("%s: unknown key '%s' (did you mean '%s'?)", origin, key, closest_key(key));
            if (k->type != T_STR) fail("%s: key '%s' needs a value", origin, key);
            config_set(cfg, key, "", origin);
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
        load_mapping(cfg, &doc, root, "", path);
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

void config_finish(Config *cfg) {
    const char *src = cfg->path[0] ? cfg->path : "config";
    if (cfg->base_model[0] && cfg->has_model_block)
        fail("%s: set either base_model or a model: block, not both", src);
    if (!cfg->base_model[0] && !cfg->has_model_block)
        fail("%s: no model: set base_model (a Hugging Face directory) or a model: block", src);
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
    if (cfg->fsdp) cfg->zero_stage = 3;
    if (cfg->zero_stage == 2) fail("%s: zero_stage 2 is not supported: use 1 (optimizer state) or 3 (fsdp)", src);
    if (!cfg->train_data[0]) fail("%s: key 'train_data' is required (a token shard path or glob)", src);
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
            "usage: train_llama -c CONFIG.yaml [--set key=value]... [--plan]\n"
            "  --plan  print the memory plan of every mode and exit without training\n"
            "       train_llama --quantize IN_DIR OUT_DIR\n"
            "  write IN_DIR's model with NF4 decoder weights in bitsandbytes' layout\n"
            "Trains a Llama-family model. Keys (YAML, Axolotl names; --set overrides):\n");
    for (size_t i = 0; i < NKEYS; i++) {
        const KeyDef *k = &KEYS[i];
        char def[64];
        snprintf(def, sizeof def, "%s", k->def ? (k->def[0] ? k->def : "\"\"") : "required");
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
        } else if (!strcmp(argv[i], "--set")) {
            if (++i >= argc) fail("--set needs key=value");
        } else {
            fail("unknown argument '%s' (see --help)", argv[i]);
        }
    }
    if (!path) fail("no config: use -c CONFIG.yaml (see --help)");
    config_load_yaml(cfg, path);
    // --set applies after the file, in order, whatever its position on the line.
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--set")) continue;
        char *kv = argv[++i], *eq = strchr(kv, '=');
        if (!eq) fail("--set '%s': expected key=value", kv);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
        config_set(cfg, key, eq + 1, "--set");
    }
    config_finish(cfg);
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
    p->stream_frozen = cfg->layer_offloading;
    p->mlp_shards = cfg->tiled_mlp_shards;
    snprintf(p->disk_dir, sizeof p->disk_dir, "%s", cfg->activation_offloading_dir);
}

void config_lora(const Config *cfg, LoraConfig *lora) {
    memset(lora, 0, sizeof *lora);
    if (!strcmp(cfg->adapter, "none")) return;
    const char *src = cfg->path[0] ? cfg->path : "config";
    lora->r = cfg->lora_r;
    lora->alpha = (float)cfg->lora_alpha;
    lora->dropout = (float)cfg->lora_dropout;
    lora->rslora = cfg->use_rslora;
    if (cfg->lora_target_linear) lora->targets = (1 << LORA_TARGETS) - 1;
    char list[256];
    snprintf(list, sizeof list, "%s", cfg->lora_target_modules);
    for (char *save, *tok = strtok_r(list, ", []", &save); tok; tok = strtok_r(NULL, ", []", &save)) {
        int found = -1;
        for (int t = 0; t < LORA_TARGETS; t++)
            if (!strcmp(tok, LORA_TARGET_NAMES[t])) found = t;
        if (found < 0)
            fail("%s: lora_target_modules: unknown module '%s' (expected q_proj, k_proj, v_proj, o_proj, "
                 "gate_proj, up_proj or down_proj)", src, tok);
        lora->targets |= 1 << found;
    }
    if (!lora->targets)
        fail("%s: adapter: %s needs lora_target_modules or lora_target_linear: true", src, cfg->adapter);
}
