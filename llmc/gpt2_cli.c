// gpt2_cli.c: see gpt2_cli.h.
#include "gpt2_cli.h"
#include <errno.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "gpt2_io.h"
#include "util.h"
#include "stb_ds.h"

// ---- the command line

static char **out;  // stb_ds array of the rewritten argv

static void push(const char *s) { arrput(out, xstrdup(s)); }

static void set(const char *key, const char *value) {
    char buf[2200];
    snprintf(buf, sizeof buf, "%s=%s", key, value);
    push("--set");
    push(buf);
}

static int parse_int(const char *s, long long *v) {
    char *end;
    errno = 0;
    *v = strtoll(s, &end, 10);
    return *s && !*end && !errno;
}

static int parse_float(const char *s, double *v) {
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    return *s && !*end && !errno && isfinite(*v);
}

static long long need_int(const char *flag, const char *v, long long lo, const char *what) {
    long long x;
    if (!parse_int(v, &x)) fail("%s '%s': expected an integer (%s)", flag, v, what);
    if (x < lo) fail("%s %lld: expected at least %lld (%s)", flag, x, lo, what);
    return x;
}

static double need_float(const char *flag, const char *v, double lo, double hi, const char *what) {
    double x;
    if (!parse_float(v, &x)) fail("%s '%s': expected a number (%s)", flag, v, what);
    if (x < lo || x > hi) fail("%s %g: expected a number in [%g, %g] (%s)", flag, x, lo, hi, what);
    return x;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

// -e: an llm.c checkpoint (*.bin), a descriptor, a Hugging Face GPT-2 size or hub id, a directory.
static void model_source(const char *v) {
    static const char *const hf[] = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
    ModelConfig probe;
    if (ends_with(v, ".bin")) {
        set("base_model", v);
        return;
    }
    if (gpt2_descriptor(v, &probe)) {
        set("model", v);
        return;
    }
    for (size_t i = 0; i < sizeof hf / sizeof hf[0]; i++)
        if (!strcmp(v, hf[i])) {
            char id[64];
            snprintf(id, sizeof id, "openai-community/%s", v);
            set("base_model", id);  // resolved in the local Hugging Face cache
            return;
        }
    if (strchr(v, '/') || access(v, F_OK) == 0) {  // a directory or ORG/NAME
        set("base_model", v);
        return;
    }
    fail("-e '%s': expected an llm.c checkpoint (*.bin), a descriptor (%s), gpt2 / gpt2-medium / gpt2-large / "
         "gpt2-xl (Hugging Face safetensors in the local cache), a hub id ORG/NAME or a model directory", v,
         GPT2_DESCRIPTORS);
}

// One llm.c flag and its value.
static void apply_flag(const char *f, const char *v, const char **model) {
    long long n;
    double x;
    char buf[64];
#define IS(s) (!strcmp(f, s))
    if (IS("-i")) set("train_data", v);
    else if (IS("-j")) set("val_data", v);
    else if (IS("-e")) *model = v;
    else if (IS("-o")) set("output_dir", v);
    else if (IS("-n")) set("save_steps", (snprintf(buf, sizeof buf, "%lld", need_int(f, v, 0, "checkpoint every N steps; 0: only the final one")), buf));
    else if (IS("-nk")) set("save_total_limit", (snprintf(buf, sizeof buf, "%lld", need_int(f, v, 0, "checkpoints to keep; 0: all")), buf));
    else if (IS("-nm")) {
        if (need_int(f, v, 0, "major checkpoint period") != 0)
            fail("-nm %s: major checkpoints are not implemented; -nk (save_total_limit) keeps the newest checkpoints "
                 "(use -nm 0)", v);
    } else if (IS("-y")) {
        n = need_int(f, v, 0, "0 = start fresh, 1 = resume from the latest checkpoint in -o");
        if (n > 1) fail("-y %s: expected 0 or 1", v);
        set("resume_from_checkpoint", n ? "auto" : "");
    } else if (IS("-b")) set("micro_batch_size", (snprintf(buf, sizeof buf, "%lld", need_int(f, v, 1, "micro batch size B")), buf));
    else if (IS("-t")) set("sequence_len", (snprintf(buf, sizeof buf, "%lld", need_int(f, v, 1, "sequence length T")), buf));
    else if (IS("-d")) {
        n = need_int(f, v, -1, "total batch size in tokens; -1: B x T x ranks");
        if (n == 0) fail("-d 0: expected -1 or a positive token count");
        if (n > 0) snprintf(buf, sizeof buf, "%lld", n), set("total_batch_size", buf);
        else set("total_batch_size", "0");
    } else if (IS("-x")) {
        n = need_int(f, v, -1, "max steps; -1: one epoch");
        if (n == 0) fail("-x 0: expected -1 (one epoch) or a positive number of steps");
        snprintf(buf, sizeof buf, "%lld", n < 0 ? 0 : n);
        set("max_steps", buf);
    } else if (IS("-k")) {
        if (strcmp(v, "cosine") && strcmp(v, "linear") && strcmp(v, "constant") && strcmp(v, "wsd"))
            fail("-k '%s': expected a learning rate scheduler: cosine, linear, constant or wsd", v);
        set("lr_scheduler", v);
    } else if (IS("-l")) {
        x = need_float(f, v, 0, 10, "learning rate");
        set("learning_rate", v);
    } else if (IS("-u")) set("warmup_steps", (snprintf(buf, sizeof buf, "%lld", need_int(f, v, 0, "warmup steps")), buf));
    else if (IS("-q")) {
        need_float(f, v, 0, 1, "final learning rate fraction");
        set("final_lr_fraction", v);
    } else if (IS("-c")) {
        need_float(f, v, 0, 10, "weight decay");
        set("weight_decay", v);
    } else if (IS("-sl") || IS("-sg")) {
        if (need_float(f, v, 0, 1e30, "outlier z-score") != 0)
            fail("%s %s: skipping updates by %s z-score is not implemented (use %s 0; non-finite steps are always "
                 "skipped)", f, v, IS("-sl") ? "loss" : "grad norm", f);
    } else if (IS("-v")) {
        n = need_int(f, v, 0, "val loss every N steps");
        if (n == 0) set("eval_strategy", "no");
        else snprintf(buf, sizeof buf, "%lld", n), set("eval_steps", buf);
    } else if (IS("-m")) {
        n = need_int(f, v, -1, "val batches per evaluation; -1: the whole val split");
        if (n == 0) fail("-m 0: expected -1 (the whole val split) or a positive number of batches");
        snprintf(buf, sizeof buf, "%lld", n < 0 ? 0 : n);
        set("eval_batches", buf);
    } else if (IS("-s")) set("sample_steps", (snprintf(buf, sizeof buf, "%lld", need_int(f, v, 0, "sample every N steps; 0: never")), buf));
    else if (IS("-g")) {
        n = need_int(f, v, 2, "genT: sample length including the <|endoftext|> it starts from");
        snprintf(buf, sizeof buf, "%lld", n - 1);
        set("sample_tokens", buf);
    } else if (IS("-h")) {
        n = need_int(f, v, 0, "HellaSwag eval: 0 or 1");
        if (n > 1) fail("-h %s: expected 0 or 1", v);
        const char *path = "dev/data/hellaswag/hellaswag_val.bin";  // where llm.c looks
        if (n && access(path, R_OK) != 0) {
            printf("note: -h 1: HellaSwag eval not found at %s (write it with llm.c's dev/data/hellaswag.py); "
                   "skipping its evaluation, as llm.c does\n", path);
            set("hellaswag_data", "");
        } else {
            set("hellaswag_data", n ? path : "");
        }
    } else if (IS("-a")) {
        n = need_int(f, v, 0, "overfit a single batch: 0 or 1");
        if (n > 1) fail("-a %s: expected 0 or 1", v);
        set("overfit_single_batch", n ? "true" : "false");
    } else if (IS("-f")) {
        n = need_int(f, v, 0, "TF32 override: 0 or 1");
        if (n > 1) fail("-f %s: expected 0 or 1", v);
        printf("note: -f %s has no effect here: float32 matmuls never use TF32 (dtype float32 is full float32; "
               "dtype bfloat16, the default, computes in bf16 on a GPU)\n", v);
    } else if (IS("-w")) {
        n = need_int(f, v, 0, "keep float32 master weights: 0 or 1");
        if (n > 1) fail("-w %s: expected 0 or 1", v);
        if (n == 0) fail("-w 0: training without float32 master weights is not implemented (this program always keeps them)");
    } else if (IS("-ge")) {
        n = need_int(f, v, 0, "GELU fusion: 0, 1 or 2");
        if (n > 2) fail("-ge %s: expected 0, 1 or 2", v);
        printf("note: -ge %s has no effect here: a kernel fusion choice of llm.c's; the results are the same\n", v);
    } else if (IS("-z")) {
        n = need_int(f, v, 0, "ZeRO stage: 0, 1 or 3");
        if (n > 3) fail("-z %s: expected 0, 1, 2 or 3", v);
        snprintf(buf, sizeof buf, "%lld", n);
        set("zero_stage", buf);
    } else if (IS("-r")) {
        n = need_int(f, v, 0, "recompute: 0 none, 1 GELU, 2 GELU + LayerNorm");
        if (n > 2) fail("-r %s: expected 0, 1 or 2", v);
        // selective recompute keeps the matmul outputs and recomputes GELU and the LayerNorms:
        // llm.c's -r 2, which holds less than -r 1; results are bit-identical either way.
        set("gradient_checkpointing", n ? "selective" : "false");
    } else if (IS("-lg")) {
        n = need_int(f, v, -1, "log GPU info every N steps; -1 off");
        if (n > 0) fail("-lg %s: GPU utilisation logging is not implemented (use nvidia-smi; -lg -1)", v);
    } else if (IS("-pn")) {
        if (need_int(f, v, 1, "number of processes") != 1)
            fail("-pn %s: ranks come from MPI here: run mpirun -np %s ./train_gpt ... without -pn", v, v);
    } else if (IS("-pr")) {
        if (need_int(f, v, 0, "process rank") != 0) fail("-pr %s: ranks come from MPI here (mpirun), not -pr", v);
    } else if (IS("-pg")) {
        need_int(f, v, 1, "GPUs per node");
        printf("note: -pg %s has no effect here: each rank takes the GPU of its local rank\n", v);
    } else if (IS("-pm") || IS("-pi")) {
        if (strcmp(v, "mpi")) fail("%s '%s': only mpi is supported (ranks start under mpirun, or launcher-free, see README)", f, v);
    } else if (IS("-ps") || IS("-pp") || IS("-pf")) {
        fail("%s '%s': multi-node setup through %s is not implemented; start ranks with mpirun", f, v,
             IS("-ps") ? "a TCP server" : "a shared file system");
    } else {
        fail("unknown flag '%s' (see --help)", f);
    }
    (void)x;
#undef IS
}

static int is_number(const char *s) {
    double x;
    return parse_float(s, &x);
}

// The trainer's own valueless flags, passed through as they are.
static int trainer_flag(const char *a) {
    return !strcmp(a, "--plan") || !strcmp(a, "--preprocess") || !strcmp(a, "--profile");
}

void gpt2_cli_translate(int argc, char **argv, int *out_argc, char ***out_argv) {
    out = NULL;
    push(argv[0]);
    if (argc == 4 && !strcmp(argv[1], "--quantize")) {  // train_main's tool: unchanged
        for (int i = 1; i < argc; i++) push(argv[i]);
        *out_argc = (int)arrlen(out), *out_argv = out;
        return;
    }
    // The YAML file: -c/--config with a value that is not a number (llm.c's -c is the weight
    // decay, a number), normally FILE.yaml / FILE.yml.
    const char *yaml = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || (!strcmp(a, "-h") && i + 1 == argc)) {
            gpt2_cli_help(stdout);
            exit(0);
        }
        if (trainer_flag(a)) continue;
        if (a[0] != '-' || (strlen(a) != 2 && strlen(a) != 3 && strncmp(a, "--", 2)))
            fail("unexpected argument '%s': flags are -x VALUE (llm.c's) or -c FILE.yaml, --set key=value, --plan "
                 "(see --help)", a);
        if (i + 1 >= argc) fail("%s needs a value (see --help)", a);
        if ((!strcmp(a, "-c") && !is_number(argv[i + 1])) || !strcmp(a, "--config")) {
            if (yaml) fail("-c '%s': a second config file (the first is '%s')", argv[i + 1], yaml);
            yaml = argv[i + 1];
        }
        i++;
    }
    if (yaml) {
        push("-c");
        push(yaml);
    } else {
        // llm.c's train_gpt2cu defaults (its main() and gpt2_update call): no YAML file.
        static const char *const defaults[][2] = {
            {"train_data", "dev/data/tinyshakespeare/tiny_shakespeare_train.bin"},
            {"val_data", "dev/data/tinyshakespeare/tiny_shakespeare_val.bin"},
            {"micro_batch_size", "4"}, {"sequence_len", "1024"}, {"max_steps", "0"},
            {"lr_scheduler", "cosine"}, {"learning_rate", "3e-4"}, {"warmup_steps", "0"},
            {"warmup_style", "llmc"}, {"final_lr_fraction", "1.0"}, {"weight_decay", "0"},
            {"adam_beta1", "0.9"}, {"adam_beta2", "0.95"}, {"adam_epsilon", "1e-8"}, {"max_grad_norm", "1.0"},
            {"eval_steps", "20"}, {"eval_batches", "20"}, {"sample_steps", "20"}, {"sample_tokens", "63"},
            {"gradient_checkpointing", "selective"}, {"shuffle", "true"}, {"zero_stage", "0"},
            {"save_steps", "0"}, {"dtype", "bfloat16"}};
        for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++) set(defaults[i][0], defaults[i][1]);
    }
    const char *model = yaml ? NULL : "gpt2_124M_bf16.bin";  // llm.c's default -e
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (trainer_flag(a)) {
            push(a);
            continue;
        }
        const char *v = argv[++i];
        if (a == yaml || v == yaml) continue;
        if (!strcmp(a, "--set")) push(a), push(v);
        else if (!strncmp(a, "--", 2)) fail("unknown option '%s' (see --help)", a);
        else apply_flag(a, v, &model);
    }
    if (model) model_source(model);
    *out_argc = (int)arrlen(out);
    *out_argv = out;
}

void gpt2_cli_help(FILE *f) {
    static const char *const rows[][3] = {
        {"-i PATTERN", "train_data", "train token shards (default dev/data/tinyshakespeare/tiny_shakespeare_train.bin)"},
        {"-j PATTERN", "val_data", "val token shards (default dev/data/tinyshakespeare/tiny_shakespeare_val.bin)"},
        {"-e MODEL", "base_model / model", "llm.c checkpoint *.bin, descriptor dN / gpt2:dN / gpt3:cN, gpt2[-medium|-large|-xl] (HF cache), HF dir or ORG/NAME (default gpt2_124M_bf16.bin)"},
        {"-o DIR", "output_dir", "checkpoints, metrics.jsonl, final model.bin (default out)"},
        {"-n N", "save_steps", "checkpoint every N steps (default 0: only the final one)"},
        {"-nk N", "save_total_limit", "checkpoints kept (default 0: all)"},
        {"-nm N", "-", "major checkpoints: 0 only (not implemented)"},
        {"-y 0|1", "resume_from_checkpoint", "1: resume from the latest checkpoint in -o (auto)"},
        {"-b N", "micro_batch_size", "micro batch size B (default 4)"},
        {"-t N", "sequence_len", "sequence length T (default 1024)"},
        {"-d N", "total_batch_size", "tokens per step, sets the accumulation (default -1: B x T x ranks)"},
        {"-x N", "max_steps", "optimizer steps (default -1: one epoch)"},
        {"-k NAME", "lr_scheduler", "cosine, linear, constant, wsd (default cosine)"},
        {"-l LR", "learning_rate", "peak learning rate (default 3e-4)"},
        {"-u N", "warmup_steps", "warmup steps, lr (s+1)/N (default 0)"},
        {"-q F", "final_lr_fraction", "lr at the end of the decay / peak (default 1.0: no decay)"},
        {"-c WD | FILE.yaml", "weight_decay / config", "a number: weight decay (default 0); otherwise a YAML config"},
        {"-sl Z, -sg Z", "-", "outlier skipping by z-score: 0 only (not implemented)"},
        {"-v N", "eval_steps", "val loss (and HellaSwag) every N steps (default 20; 0: never)"},
        {"-m N", "eval_batches", "val batches per evaluation (default 20; -1: the whole split)"},
        {"-s N", "sample_steps", "sample every N steps (default 20; 0: never)"},
        {"-g N", "sample_tokens", "genT: sample length, N - 1 new tokens (default 64)"},
        {"-h 0|1", "hellaswag_data", "1: HellaSwag from dev/data/hellaswag/hellaswag_val.bin (default 0)"},
        {"-a 0|1", "overfit_single_batch", "train on the first val batch every step (default 0)"},
        {"-f 0|1", "-", "TF32: no effect here (note)"},
        {"-w 0|1", "-", "float32 master weights: always kept (-w 0 refused)"},
        {"-ge 0|1|2", "-", "GELU fusion: no effect on results (note)"},
        {"-z N", "zero_stage", "ZeRO stage 0, 1 or 3 (default 0)"},
        {"-r 0|1|2", "gradient_checkpointing", "0: false; 1, 2: selective (default 1)"},
        {"-lg N", "-", "GPU logging: -1 only (not implemented)"},
        {"-pn/-pr/-pg/-pm", "-", "multi-process: 1 / 0 / any / mpi only; use mpirun"},
    };
    fprintf(f,
            "usage: train_gpt [llm.c flags] [-c FILE.yaml] [--set key=value]... [--plan] [--profile]\n"
            "Trains GPT-2 with llm.c's train_gpt2cu flags and defaults. Without a YAML file every key starts\n"
            "at llm.c's default (AdamW betas 0.9/0.95, clipping at norm 1, llm.c warmup); with -c FILE.yaml\n"
            "the file and this program's key defaults apply, and each flag or --set overrides its key in\n"
            "command-line order. -c takes a number as llm.c's weight decay, anything else as a YAML file.\n"
            "  %-18s %-24s %s\n", "flag", "key", "meaning");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) fprintf(f, "  %-18s %-24s %s\n", rows[i][0], rows[i][1], rows[i][2]);
    fprintf(f, "  %-18s %-24s %s\n", "--set key=value", "any key", "any YAML key (train_llama --help lists them)");
    fprintf(f, "  %-18s %-24s %s\n", "--plan", "-", "print the memory plan and exit");
    fprintf(f, "  %-18s %-24s %s\n", "--profile", "-", "time every op of each step; print where a step's time goes");
}

// ---- config box, MFU

static void row(const char *name, const char *value) { printf("| %-21s | %-50s |\n", name, value); }
static void rowi(const char *name, long long v) {
    char b[64];
    snprintf(b, sizeof b, "%lld", v);
    row(name, b);
}
static void rowf(const char *name, double v) {
    char b[64];
    snprintf(b, sizeof b, "%e", v);
    row(name, b);
}
static void rule(void) { printf("+-----------------------+----------------------------------------------------+\n"); }

void gpt2_print_box(const Config *cfg, const Model *m, const Backend *bk, int world, size_t acts_bytes) {
    const ModelConfig *c = &m->cfg;
    char b[256];
    rule();
    row("Parameter", "Value");
    rule();
    row("train data pattern", cfg->overfit_single_batch ? cfg->val_data : cfg->train_data);
    row("val data pattern", cfg->val_data[0] ? cfg->val_data : "(none)");
    row("output dir", cfg->output_dir);
    rowi("checkpoint_every", cfg->save_steps);
    row("resume", cfg->resume_from_checkpoint[0] ? cfg->resume_from_checkpoint : "no");
    rowi("micro batch size B", cfg->micro_batch_size);
    rowi("sequence length T", cfg->sequence_len);
    rowi("total batch size", (long long)cfg->micro_batch_size * cfg->sequence_len * world * cfg->gradient_accumulation_steps);
    rowi("grad accum steps", cfg->gradient_accumulation_steps);
    row("LR scheduler", cfg->lr_scheduler);
    rowf("learning rate (LR)", cfg->learning_rate);
    rowi("warmup iterations", cfg->warmup_steps);
    row("warmup style", cfg->warmup_style);
    rowf("final LR fraction", !strcmp(cfg->lr_scheduler, "constant") ? 1.0 : cfg->cosine_min_lr_ratio);
    rowf("weight decay", cfg->weight_decay);
    snprintf(b, sizeof b, "%g / %g / %g, clip %g", cfg->adam_beta1, cfg->adam_beta2, cfg->adam_epsilon, cfg->max_grad_norm);
    row("AdamW b1/b2/eps", b);
    rowi("max_steps", cfg->max_steps);
    rowi("val_loss_every", cfg->eval_steps);
    if (cfg->eval_batches) rowi("val_max_steps", cfg->eval_batches);
    else row("val_max_steps", "all");
    rowi("sample_every", cfg->sample_steps);
    rowi("genT", cfg->sample_tokens + 1);
    rowi("overfit_single_batch", cfg->overfit_single_batch);
    row("recompute", cfg->gradient_checkpointing);
    rule();
    snprintf(b, sizeof b, "%s, %d threads%s%s", bk->name, bk->threads, bk->detail[0] ? ", " : "", bk->detail);
    row("device", b);
    if (bk->attention_path) row("attention kernels", bk->attention_path(bk, m->cfg.head_dim));
    row("precision", strcmp(bk->name, "cpu") ? cfg->precision : "float32");
    rule();
    row("weight init method", cfg->base_model[0] ? cfg->base_model : "random init (model descriptor)");
    rowi("max_sequence_length T", c->max_position_embeddings);
    rowi("vocab_size V", c->vocab_size);
    rowi("padded_vocab_size Vp", c->padded_vocab);
    rowi("num_layers L", c->num_hidden_layers);
    rowi("num_heads NH", c->num_attention_heads);
    rowi("channels C", c->hidden_size);
    rowi("num_parameters", (long long)m->tab.num_params);
    if (m->tab.lora.r) rowi("trainable (LoRA)", (long long)m->tab.num_trainable);
    rule();
    row("run hellaswag", cfg->hellaswag_data[0] ? cfg->hellaswag_data : "no");
    rowi("num_processes", world);
    rowi("zero_stage", cfg->zero_stage);
    char a1[32];
    format_bytes(a1, sizeof a1, (double)acts_bytes);
    row("activations", a1);
    rule();
}

// The GPU model from the NVIDIA driver's /proc files (no CUDA call from host code).
static double known_peak_tflops(void) {
    const char *e = getenv("LLMC_PEAK_TFLOPS");
    if (e && *e) return atof(e);
    glob_t g;
    double peak = -1;
    if (glob("/proc/driver/nvidia/gpus/*/information", 0, NULL, &g) == 0 && g.gl_pathc > 0) {
        FILE *f = fopen(g.gl_pathv[0], "r");
        char line[256];
        while (f && fgets(line, sizeof line, f))
            if (!strncmp(line, "Model:", 6)) {
                if (strstr(line, "H100") || strstr(line, "H200") || strstr(line, "H800")) peak = 989.4;
                else if (strstr(line, "A100") || strstr(line, "A800")) peak = 312.0;
            }
        if (f) fclose(f);
    }
    globfree(&g);
    return peak;
}

double gpt2_mfu(const Model *m, const Backend *bk, const Config *cfg, double tokens, double seconds) {
    static double peak = 0;
    if (strcmp(bk->name, "cuda") && !getenv("LLMC_PEAK_TFLOPS")) return -1;  // no CPU peak is assumed
    if (peak == 0) peak = known_peak_tflops();
    if (peak <= 0 || seconds <= 0) return -1;
    const double N = (double)m->tab.num_params, L = m->cfg.num_hidden_layers, C = m->cfg.hidden_size;
    const double flops = (6.0 * N + 6.0 * L * C * cfg->sequence_len) * tokens;
    return flops / seconds / (peak * 1e12);
}

// ---- samples through llm.c's tokenizer file

typedef struct {
    int n, eot;
    char **tok;
    unsigned char *len;
} Tokenizer;

// gpt2_tokenizer.bin: 256 uint32 (magic 20240328, version 1 or 2, vocab size, v2: the
// <|endoftext|> id), then per token a length byte and that many bytes. 0 if absent or bad (why).
static int tokenizer_load(Tokenizer *t, const char *path, int vocab, char *why, size_t cap) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "rb");
    if (!f) return snprintf(why, cap, "%s: %s", path, strerror(errno)), 0;
    uint32_t h[256];
    int ok = fread(h, sizeof h, 1, f) == 1;
    if (!ok || h[0] != 20240328 || (h[1] != 1 && h[1] != 2) || h[2] == 0 || h[2] > (1u << 24)) {
        fclose(f);
        return snprintf(why, cap, "%s: not an llm.c tokenizer file (magic 20240328, version 1 or 2)", path), 0;
    }
    t->n = (int)h[2];
    t->eot = h[1] == 2 ? (int)h[3] : 50256;
    t->tok = xcalloc((size_t)t->n, sizeof(char *));
    t->len = xcalloc((size_t)t->n, 1);
    for (int i = 0; i < t->n && ok; i++) {
        int c = fgetc(f);
        if (c <= 0) ok = 0;
        else {
            t->len[i] = (unsigned char)c;
            t->tok[i] = xmalloc((size_t)c + 1);
            ok = fread(t->tok[i], 1, (size_t)c, f) == (size_t)c;
            t->tok[i][c] = 0;
        }
    }
    fclose(f);
    if (!ok || t->eot < 0 || t->eot >= t->n || t->n < vocab) {
        snprintf(why, cap, "%s: %s", path, !ok ? "truncated or a zero-length token" :
                 t->n < vocab ? "fewer tokens than the model's vocabulary" : "bad <|endoftext|> id");
        for (int i = 0; i < t->n; i++) free(t->tok[i]);
        free(t->tok), free(t->len);
        return 0;
    }
    return 1;
}

// xorshift* (Marsaglia / Vigna), as llm.c's sampler: 32 random bits, then a float in [0, 1).
static uint32_t xorshift32(unsigned long long *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (uint32_t)((*s * 0x2545F4914F6CDD1Dull) >> 32);
}

void gpt2_sample(Model *m, int T, int gen_len) {
    const int V = m->cfg.vocab_size;
    static int loaded = -1;
    static Tokenizer tk;
    if (loaded < 0) {
        char why[1200];
        loaded = tokenizer_load(&tk, "gpt2_tokenizer.bin", V, why, sizeof why);
        if (!loaded) printf("note: no GPT-2 tokenizer (%s); samples are printed as token ids (llm.c's "
                            "train_gpt2.py writes gpt2_tokenizer.bin)\n", why);
    }
    const int eot = loaded ? tk.eot : V > 50256 ? 50256 : V - 1;
    int32_t *ctx = xmalloc(sizeof(int32_t) * (gen_len + 1));
    float *logits = xmalloc(sizeof(float) * V);
    unsigned long long rng = 1337;
    ctx[0] = eot;
    printf("generating:\n---\n");
    for (int t = 1; t < gen_len + 1; t++) {
        int start = t > T ? t - T : 0, len = t - start;
        model_set_batch(m, ctx + start, NULL, NULL, 1, len);
        model_last_logits(m, len, logits);
        float coin = (float)(xorshift32(&rng) >> 8) / 16777216.0f;
        double norm = 0;
        for (int v = 0; v < V; v++) norm += expf(logits[v]);
        double target = coin * norm, cdf = 0;
        int pick = V - 1;
        for (int v = 0; v < V; v++) {
            cdf += expf(logits[v]);
            if (target < cdf) { pick = v; break; }
        }
        ctx[t] = pick;
        if (loaded) {
            const unsigned char c = (unsigned char)tk.tok[pick][0];
            // one-byte tokens that are control characters are not printed (llm.c does the same)
            if (tk.len[pick] > 1 || c >= 32 || c == '\n' || c == '\t' || c == ' ') fputs(tk.tok[pick], stdout);
        } else {
            printf("%d ", pick);
        }
    }
    printf("\n---\n");
    free(ctx);
    free(logits);
}

// ---- HellaSwag

void hellaswag_open(HellaSwag *h, const char *path, int T, int vocab) {
    memset(h, 0, sizeof *h);
    snprintf(h->path, sizeof h->path, "%s", path);
    size_t len;
    char *raw = read_file(path, &len);
    if (!raw) fail("%s: cannot read the HellaSwag file: %s", path, strerror(errno));
    if (len < 1024) fail("%s: truncated: shorter than the 1024-byte header", path);
    int32_t hd[256];
    memcpy(hd, raw, sizeof hd);
    if (hd[0] != 20240522) fail("%s: bad magic %d (expected 20240522, llm.c's eval file)", path, hd[0]);
    if (hd[1] != 1) fail("%s: unsupported version %d (expected 1)", path, hd[1]);
    if (hd[2] <= 0) fail("%s: %d examples", path, hd[2]);
    // The smallest example is 15 uint16 (6 fields, a 1-token context, 4 one-token completions):
    // a count the file cannot hold fails before the per-example arrays are sized by it.
    if ((size_t)hd[2] > (len - 1024) / 30)
        fail("%s: the header says %d examples, but %zu bytes after the header hold at most %zu", path, hd[2],
             len - 1024, (len - 1024) / 30);
    h->n = hd[2];
    h->label = xcalloc((size_t)h->n, sizeof(int));
    h->ctx_len = xcalloc((size_t)h->n, sizeof(int));
    h->comp_len = xcalloc((size_t)h->n * 4, sizeof(int));
    h->ctx = xcalloc((size_t)h->n, sizeof(uint16_t *));
    h->comp = xcalloc((size_t)h->n, sizeof(uint16_t *));
    size_t pos = 1024;
    for (int i = 0; i < h->n; i++) {
        uint16_t e[6];
        if (pos + sizeof e > len) fail("%s: truncated at example %d", path, i);
        memcpy(e, raw + pos, sizeof e);
        // e: delimiter 65535, bytes of the example, index, label, completions, context length
        if (e[0] != 65535) fail("%s: example %d: no start delimiter 65535 at byte %zu", path, i, pos);
        if (e[2] != (uint16_t)i) fail("%s: example %d: index field says %d", path, i, e[2]);
        if (e[4] != 4) fail("%s: example %d: %d completions (expected 4, as llm.c)", path, i, e[4]);
        if (e[3] >= 4) fail("%s: example %d: label %d (expected 0..3)", path, i, e[3]);
        const size_t bytes = e[1], words = bytes / 2;
        if (bytes % 2 || bytes < sizeof e || pos + bytes > len) fail("%s: example %d: bad length %zu bytes", path, i, bytes);
        const uint16_t *w = (const uint16_t *)(void *)(raw + pos);
        size_t k = 6;
        const int cl = e[5];
        if (cl <= 0 || k + cl > words) fail("%s: example %d: bad context length %d", path, i, cl);
        h->label[i] = e[3], h->ctx_len[i] = cl;
        h->ctx[i] = xmalloc(sizeof(uint16_t) * cl);
        memcpy(h->ctx[i], w + k, sizeof(uint16_t) * cl);
        k += cl;
        size_t total = 0, start = k;
        for (int c = 0; c < 4; c++) {
            if (k >= words) fail("%s: example %d: truncated completion %d", path, i, c);
            int n = w[k];
            if (n <= 0 || k + 1 + n > words) fail("%s: example %d: bad completion %d length %d", path, i, c, n);
            if (cl + n >= T + 1)
                fail("%s: example %d: context %d + completion %d tokens do not fit sequence_len %d", path, i, cl, n, T);
            h->comp_len[i * 4 + c] = n;
            total += n;
            k += 1 + n;
        }
        if (k != words) fail("%s: example %d: %zu bytes left after the 4 completions", path, i, (words - k) * 2);
        h->comp[i] = xmalloc(sizeof(uint16_t) * total);
        for (int c = 0, o = 0; c < 4; c++) {
            memcpy(h->comp[i] + o, w + start + 1, sizeof(uint16_t) * h->comp_len[i * 4 + c]);
            o += h->comp_len[i * 4 + c];
            start += 1 + h->comp_len[i * 4 + c];
        }
        for (int t = 0; t < cl; t++)
            if (h->ctx[i][t] >= vocab) fail("%s: example %d: token %d is not below vocab_size %d", path, i, h->ctx[i][t], vocab);
        for (size_t t = 0; t < total; t++)
            if (h->comp[i][t] >= vocab) fail("%s: example %d: token %d is not below vocab_size %d", path, i, h->comp[i][t], vocab);
        pos += bytes;
    }
    if (pos != len) fail("%s: %zu bytes after the last of %d examples", path, len - pos, h->n);
    free(raw);
}

double hellaswag_eval(Model *m, const HellaSwag *h, int B, int T, int *correct) {
    const int per = B / 4;
    if (per < 1) fail("hellaswag_data: micro_batch_size %d is below 4 (one example is 4 rows); raise -b or use -h 0", B);
    int32_t *tok = xmalloc(sizeof(int32_t) * B * T), *tgt = xmalloc(sizeof(int32_t) * B * T);
    float *loss = xmalloc(sizeof(float) * B * T);
    int good = 0;
    for (int first = 0; first < h->n; first += per) {
        for (int i = 0; i < B * T; i++) tok[i] = 0, tgt[i] = -1;
        const int cnt = h->n - first < per ? h->n - first : per;
        for (int e = 0; e < cnt; e++) {
            const int ex = first + e, cl = h->ctx_len[ex];
            const uint16_t *cp = h->comp[ex];
            for (int c = 0; c < 4; c++) {
                int32_t *rt = tok + (size_t)(e * 4 + c) * T, *rg = tgt + (size_t)(e * 4 + c) * T;
                const int n = h->comp_len[ex * 4 + c];
                for (int t = 0; t < cl; t++) rt[t] = h->ctx[ex][t];
                // a completion token at position cl + t is the target of position cl + t - 1
                for (int t = 0; t < n; t++) {
                    if (cl + t < T) rt[cl + t] = cp[t];
                    rg[cl + t - 1] = cp[t];
                }
                cp += n;
            }
        }
        model_set_batch(m, tok, tgt, NULL, B, T);
        model_forward_backward(m, B, T, 0.0f);
        m->bk->copy_d2h(m->bk, loss, m->losses, sizeof(float) * (size_t)B * T, NULL);
        m->bk->sync(m->bk);
        for (int e = 0; e < cnt; e++) {
            int best = -1;
            float best_loss = 0;
            for (int c = 0; c < 4; c++) {
                const size_t r = (size_t)(e * 4 + c) * T;
                float sum = 0;  // float, in position order, as llm.c sums
                int n = 0;
                for (int t = 0; t < T; t++)
                    if (tgt[r + t] >= 0) sum += loss[r + t], n++;
                const float mean = n ? sum / (float)n : 0.0f;
                if (c == 0 || mean < best_loss) best_loss = mean, best = c;
            }
            good += best == h->label[first + e];
        }
    }
    free(tok), free(tgt), free(loss);
    *correct = good;
    return (double)good / h->n;
}

void hellaswag_close(HellaSwag *h) {
    for (int i = 0; i < h->n; i++) free(h->ctx[i]), free(h->comp[i]);
    free(h->ctx), free(h->comp), free(h->label), free(h->ctx_len), free(h->comp_len);
    memset(h, 0, sizeof *h);
}
