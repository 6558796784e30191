// train.c: the training program shared by train_llama (Llama family) and train_gpt (GPT-2);
// the architecture is data (ModelConfig.arch), not a fork. Read top to bottom:
//   config -> backend -> model (HF directory or random init) -> data -> [resume] -> loop
//   { batches of the step -> forward+backward per micro-batch -> norm, clip, AdamW -> log,
//     eval, sample, checkpoint } -> final model.
// Usage: ./train_llama -c cfg.yaml [--set key=value]... (see --help); ./train_gpt likewise.
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "actstore.h"
#include "checkpoint.h"
#include "comm.h"
#include "config.h"
#include "data.h"
#include "diskio.h"
#include "model.h"
#include "optim.h"
#include "plan.h"
#include "peft.h"
#include "preference.h"
#include "prepare.h"
#include "quantize.h"
#include "rows.h"
#include "export.h"
#include "family.h"
#include "gpt2_io.h"
#include "gpt2_cli.h"
#include "hf.h"
#include "metrics.h"
#include "opprof.h"
#include "train.h"
#include "seqpar.h"
#include "util.h"
#include "weights.h"
#include "stb_ds.h"

enum { MAX_BAD_STEPS = 3 };  // consecutive non-finite steps that stop a run

// base_model's config.json, with the config's model_config overrides when it has them (notes:
// say what they set, once a run).
static void load_base_config(const Config *cfg, int notes, ModelConfig *mc) {
    if (!cfg->model_config_key[0]) {
        load_hf_config(cfg->base_model, mc);
        return;
    }
    char path[4096], where[1200];
    join_path(path, sizeof path, cfg->base_model, "config.json");
    snprintf(where, sizeof where, "%s:%d", cfg->path, cfg->model_config_line);
    hf_read_config_overridden(path, cJSON_GetObjectItemCaseSensitive((const cJSON *)cfg->yaml_json, cfg->model_config_key),
                              where, cfg->model_config_key, notes, mc);
    model_config_validate(mc, where);
}

// device: cuda, or auto when a usable GPU is present, runs the CUDA backend (which has not yet
// run on a real GPU; see README), with NCCL between ranks; otherwise the CPU backend (MPI).
static Backend *make_backend(const Config *cfg, Comm **comm) {
    char why[256] = "";
    const int want = !strcmp(cfg->device, "cuda");
    // Planning builds every mode on a counting backend: a plan for the GPU needs no GPU.
    if (want && cfg->plan_only) {
        if (!cfg->device_memory_limit)
            fail("--plan with device: cuda needs device_memory_limit (the GPU's memory, e.g. 80GiB)");
        return NULL;
    }
    if ((want || !strcmp(cfg->device, "auto")) && backend_cuda_available(why, sizeof why)) {
        Comm *c = *comm;
        Backend *bk = backend_cuda_create(strcmp(cfg->precision, "float32") != 0, c->local_rank);
        // LLMC_FORCE_NCCL=1 sends even a world of one through NCCL (to check that path on one GPU).
        if (c->world > 1 || getenv("LLMC_FORCE_NCCL")) *comm = comm_nccl_create(c, c->rank, c->world, c->local_rank, bk);
        return bk;
    }
    if (want) fail("device: cuda was asked for, but %s; use device: cpu", why);
    return backend_cpu_create(cfg->num_threads);
}

// pl: preference training's losses (NULL: supervised).
static void print_box(const Config *cfg, const Model *m, const Backend *bk, size_t acts_bytes, const PrefLoss *pl) {
    const ModelConfig *c = &m->cfg;
    char a[48], b[48], d[48];
    long long tokens = (long long)cfg->micro_batch_size * cfg->sequence_len * cfg->gradient_accumulation_steps;
    printf("+-----------------------------------------------------------------+\n");
    printf("| train_llama                                                     |\n");
    printf("+-----------------------------------------------------------------+\n");
    printf("| model        %-50s |\n", cfg->base_model[0] ? cfg->base_model : "random init (model: block)");
    char np[96];
    snprintf(np, sizeof np, "%zu (trainable %zu)", m->tab.num_params, m->tab.num_trainable);
    printf("| parameters   %-50s |\n", np);
    if (m->tab.lora.r) {
        char lr[320], names[200];
        peft_target_names(c, m->tab.lora.targets, names, sizeof names);
        snprintf(lr, sizeof lr, "LoRA r=%d alpha=%g dropout=%g scale=%g on %s%s%s", m->tab.lora.r, m->tab.lora.alpha,
                 m->tab.lora.dropout, m->tab.lora_scale, names, m->tab.lora.per_layer ? " (per layer)" : "",
                 m->opt.load_in_4bit ? "; base NF4" : m->opt.load_in_8bit ? "; base int8" : "");
        printf("| adapter      %-50s |\n", lr);
    }
    char shape[128];
    snprintf(shape, sizeof shape, "L=%d C=%d I=%d heads=%d/%d D=%d V=%d%s", c->num_hidden_layers,
             c->hidden_size, c->intermediate_size, c->num_attention_heads, c->num_key_value_heads,
             c->head_dim, c->vocab_size, c->tie_word_embeddings ? " tied" : "");
    printf("| shape        %-50s |\n", shape);
    if (family_gelu_mlp(c))  // Gemma: which GELU, as config.json's activation keys gave it (hf.c)
        printf("| mlp          %-50s |\n", c->gelu_exact ? "GeGLU, exact GELU (erf)" : "GeGLU, GELU tanh approximation");
    if (c->arch == ARCH_LLAMA) {  // what the rotary embedding applies, as read from config.json
        char rope[160];
        const int orig = c->rope_type == ROPE_LONGROPE ? c->original_max_position_embeddings
                         : c->rope_original_max_position_embeddings ? c->rope_original_max_position_embeddings
                                                                     : c->max_position_embeddings;
        switch (c->rope_type) {
        case ROPE_LLAMA3: snprintf(rope, sizeof rope, "theta %g, llama3 x%g (original %d)", c->rope_theta, c->rope_factor, orig); break;
        case ROPE_LINEAR: snprintf(rope, sizeof rope, "theta %g, linear x%g", c->rope_theta, c->rope_factor); break;
        case ROPE_YARN:
            snprintf(rope, sizeof rope, "theta %g, yarn x%g (original %d), attention x%.4g", c->rope_theta, c->rope_factor,
                     orig, c->rope_attention_factor);
            break;
        case ROPE_LONGROPE:
            snprintf(rope, sizeof rope, "theta %g, longrope (%s factors past %d), attention x%.4g", c->rope_theta,
                     "short/long", orig, c->rope_attention_factor);
            break;
        default: snprintf(rope, sizeof rope, "theta %g", c->rope_theta);
        }
        printf("| rope         %-50s |\n", rope);
    }
    if (pl) {  // preference training (preference.h)
        char what[320], desc[120];
        pref_loss_describe(pl, desc, sizeof desc);
        if (pl->reward)
            snprintf(what, sizeof what, "Bradley-Terry reward, center %g; 2 rows a pair", pl->center);
        else if (pl->orpo)
            snprintf(what, sizeof what, "orpo, beta %g, nll + %s; B counts 2 rows a pair", cfg->rl_beta, desc);
        else if (pl->kto)
            snprintf(what, sizeof what, "kto, beta %g, weights %g / %g; B counts 2 rows an example", cfg->rl_beta,
                     pl->w_des, pl->w_und);
        else if (pl->ref_free)
            snprintf(what, sizeof what, "%s, beta %g, gamma %g, %s; B counts 2 rows a pair", cfg->rl, cfg->rl_beta,
                     cfg->simpo_gamma, desc);
        else
            snprintf(what, sizeof what, "%s, beta %g, %s; B counts 2 rows a pair", cfg->rl, cfg->rl_beta, desc);
        printf("| preference   %-50s |\n", what);
    }
    char tok[128];
    snprintf(tok, sizeof tok, "%lld (B=%d x T=%d x accum %d)", tokens, cfg->micro_batch_size,
             cfg->sequence_len, cfg->gradient_accumulation_steps);
    printf("| tokens/step  %-50s |\n", tok);
    char opt[128];
    snprintf(opt, sizeof opt, "%s lr %.3g %s warmup %d wd %g clip %g",
             m->opt.adam8 == ADAM4_TORCHAO   ? "AdamW 4-bit (torchao)"
             : m->opt.adam8 == ADAM8_TORCHAO ? "AdamW 8-bit (torchao)"
             : m->opt.adam8                  ? "AdamW 8-bit"
                                             : "AdamW",
             cfg->learning_rate,
             cfg->lr_scheduler, cfg->warmup_steps, cfg->weight_decay, cfg->max_grad_norm);
    printf("| optimizer    %-50s |\n", opt);
    if (cfg->lisa_n_layers) {
        snprintf(opt, sizeof opt, "LISA: %d of %d layers at a time, drawn every %d step%s", cfg->lisa_n_layers,
                 m->cfg.num_hidden_layers, cfg->lisa_step_interval, cfg->lisa_step_interval > 1 ? "s" : "");
        printf("|              %-50s |\n", opt);
    }
    char dev[128];
    snprintf(dev, sizeof dev, "%s, %d threads%s%s", bk->name, bk->threads, bk->detail[0] ? ", " : "", bk->detail);
    if (bk->attention_path) {
        const size_t n = strlen(dev);
        // soft-capped scores (Gemma 2): the mma kernels' capped instances, but the WMMA path has
        // none and takes the generic kernels (attention.cu)
        const char *path = bk->attention_path(bk, m->cfg.head_dim);
        if (m->cfg.attn_softcap > 0 && !strncmp(path, "wmma", 4)) path = "generic (soft-capped)";
        snprintf(dev + n, sizeof dev - n, ", attention %s%s", path,
                 m->cfg.attn_softcap > 0 && strncmp(path, "generic", 7) ? ", soft-capped" : "");
    }
    printf("| device       %-50s |\n", dev);
    size_t pbytes = m->tab.num_params * bk->act_bytes, gbytes = (m->lisa_slot_of ? m->grads_n : m->tab.num_trainable) * sizeof(float);  // float grads
    format_bytes(a, sizeof a, (double)(pbytes + gbytes));
    // AdamW's state: two float moments a parameter (8-bit: bytes, block scales and the small
    // tensors' floats), and the fp32 master when there is one
    const double moments = m->opt.adam8 ? 2.0 * m->adam8_n + 8.0 * (m->adam8_blocks + m->adam8_small) + 2048
                                         : 8.0 * m->tab.num_trainable;
    format_bytes(b, sizeof b, moments + (m->master ? 4.0 * m->tab.num_trainable : 0));
    format_bytes(d, sizeof d, (double)acts_bytes);
    char mem[192];
    snprintf(mem, sizeof mem, "params+grads %s, optimizer %s, activations %s", a, b, d);
    printf("| memory       %-50s |\n", mem);
    // Where the parameter state lives: sharding, and what sits in host memory.
    const int world = m->opt.comm ? m->opt.comm->world : 1, z = m->opt.zero_stage;
    char st[160];
    int k = z ? snprintf(st, sizeof st, "ZeRO-%d over %d rank%s", z, world, world > 1 ? "s" : "")
              : snprintf(st, sizeof st, world > 1 ? "replicated on %d ranks" : "one process", world);
    const char *host[3] = {m->opt.offload_params ? "weights+grads" : NULL,
                           m->opt.offload_optimizer ? "AdamW+master" : NULL, m->streamer ? "frozen layers" : NULL};
    int any = 0;
    for (int i = 0; i < 3; i++)
        if (host[i]) k += snprintf(st + k, sizeof st - k, "%s%s", any++ ? ", " : "; on host: ", host[i]);
    printf("| state        %-50s |\n", st);
    char pol[160];
    mem_policy_describe(&m->pol, pol, sizeof pol);
    printf("| memory mode  %-50s |\n", pol);
    format_bytes(a, sizeof a, (double)bk->mem.in_use);
    format_bytes(b, sizeof b, (double)bk->mem.host_in_use);
    char tot[128];
    snprintf(tot, sizeof tot, "device %s, host %s", a, b);
    printf("| allocated    %-50s |\n", tot);
    printf("+-----------------------------------------------------------------+\n");
}

// How a global batch of rows is split over the ranks: data parallel, rank r takes rows
// [r B, (r + 1) B); sequence parallel (n > 1), every rank takes the same rows and keeps its
// slice of T / n tokens of each (copied into tok/tgt), with the whole rows' document map.
typedef struct {
    int n, rank, dp;     // sequence-parallel degree, this rank, data-parallel ranks (world / n)
    int32_t *tok, *tgt;  // this rank's slices (sequence parallel)
} Split;

// The first row of a global batch that is this rank's: data parallel, its B rows; sequence
// parallel, every row (each rank keeps a slice of all of them).
static size_t part_row0(const Split *s, int B) { return s->n > 1 ? 0 : (size_t)s->rank * B; }

// Sets this rank's part of a global batch (rows of T tokens; ds may be NULL) on the model;
// returns the model's tokens per row.
static int set_part(Model *m, Split *s, const int32_t *tok, const int32_t *tgt, const int32_t *ds, int B, int T) {
    if (s->n <= 1) {
        const size_t mine = part_row0(s, B) * T;
        model_set_batch(m, tok + mine, tgt ? tgt + mine : NULL, ds ? ds + mine : NULL, B, T);
        m->row_base = mine;
        return T;
    }
    const int Tl = T / s->n;
    for (int b = 0; b < B; b++) {
        memcpy(s->tok + (size_t)b * Tl, tok + (size_t)b * T + (size_t)s->rank * Tl, sizeof(int32_t) * Tl);
        if (tgt) memcpy(s->tgt + (size_t)b * Tl, tgt + (size_t)b * T + (size_t)s->rank * Tl, sizeof(int32_t) * Tl);
    }
    model_set_batch(m, s->tok, tgt ? s->tgt : NULL, ds, B, Tl);
    m->row_base = (size_t)s->rank * Tl;  // dropout follows global token indices (one row: see config)
    return Tl;
}

// Mean validation loss; with several ranks each evaluates its part of every global batch.
static double evaluate(Model *m, DataLoader *val, int batches, int32_t *tok, int32_t *tgt, Split *sp) {
    Comm *c = m->opt.comm;
    const int T = val->T, B = val->B / sp->dp;
    double sum = 0;
    loader_reset(val);
    for (int i = 0; i < batches; i++) {
        loader_next(val, tok, tgt);
        const int Tm = set_part(m, sp, tok, tgt, NULL, B, T);
        sum += model_forward_backward(m, B, Tm, 0.0f);
    }
    c->all_reduce_sum_f64(c, &sum, 1);
    return sum / ((double)batches * val->B * T);
}

// Evaluation over prepared rows (the whole eval set, in batches of world x B rows; the last
// batch is filled with empty rows). Returns the token-weighted loss: the sum of every eval
// target's loss over the number of targets, which packing and batch size cannot change. *hf
// gets Hugging Face Trainer's figure, the mean of each batch's mean (batches without targets
// skipped), which does change with them.
static double evaluate_rows(Model *m, RowLoader *ev, int32_t *tok, int32_t *tgt, int32_t *ds, Split *sp,
                            double *hf, long long *ntargets) {
    Comm *c = m->opt.comm;
    const int T = ev->T, GB = ev->B, B = GB / sp->dp;
    const size_t nb = (ev->nrows + GB - 1) / GB;
    double *sums = xcalloc(nb, sizeof(double));
    long long *cnt = xcalloc(nb, sizeof(long long)), n = 0;
    // Tests: LLMC_DUMP_EVAL_TOKEN_LOSSES=FILE appends "row position loss" per target (one rank).
    const char *dump_path = getenv("LLMC_DUMP_EVAL_TOKEN_LOSSES");
    FILE *dump = dump_path && *dump_path && c->world == 1 ? fopen(dump_path, "a") : NULL;
    float *tl = dump ? xmalloc(sizeof(float) * (size_t)B * T) : NULL;
    if (dump) fprintf(dump, "# eval\n");
    for (size_t i = 0; i < nb; i++) {
        for (int j = 0; j < GB; j++)
            rows_read(ev, i * GB + j, tok + (size_t)j * T, tgt + (size_t)j * T, ds + (size_t)j * T);
        for (size_t k = 0; k < (size_t)GB * T; k++) cnt[i] += tgt[k] >= 0;
        const int Tm = set_part(m, sp, tok, tgt, ev->packed ? ds : NULL, B, T);
        sums[i] = model_forward_backward(m, B, Tm, 0.0f);
        if (dump) {
            m->bk->copy_d2h(m->bk, tl, m->losses, sizeof(float) * (size_t)B * T, NULL);
            m->bk->sync(m->bk);
            for (size_t k = 0; k < (size_t)B * T; k++)
                if (tgt[k] >= 0 && i * GB + k / T < ev->nrows)
                    fprintf(dump, "%zu %zu %.9g\n", i * GB + k / T, k % T, (double)tl[k]);
        }
    }
    if (dump) fclose(dump);
    free(tl);
    c->all_reduce_sum_f64(c, sums, nb);
    // eval_loss_hf: Hugging Face's Trainer repeats each batch's mean loss once per sample of
    // the batch and averages those, so a short last batch weighs by its rows.
    double tot = 0, hsum = 0;
    size_t hn = 0;
    for (size_t i = 0; i < nb; i++) {
        const size_t rows = ev->nrows - i * GB < (size_t)GB ? ev->nrows - i * GB : (size_t)GB;
        tot += sums[i], n += cnt[i];
        if (cnt[i]) hsum += (double)rows * (sums[i] / (double)cnt[i]), hn += rows;
    }
    free(sums);
    free(cnt);
    *hf = hn ? hsum / (double)hn : NAN;
    *ntargets = n;
    return n ? tot / (double)n : NAN;
}

// Rows [r0, r0 + B x data-parallel ranks) of a pair file (past its end: empty rows) as a global
// batch in tok/tgt/ds, ids[j] the row in slot j (nrows: empty); this rank's part is set on the
// model, with pref_model_targets' targets (orpo: written into mtgt). Returns the model's tokens per row.
static int pair_batch(Model *m, const PrefLoss *pl, RowLoader *rl, size_t r0, int B, int32_t *tok, int32_t *tgt,
                      int32_t *mtgt, int32_t *ds, size_t *ids, Split *sp) {
    const int T = rl->T;
    const size_t GB = (size_t)B * sp->dp;
    for (size_t j = 0; j < GB; j++) {
        rows_read(rl, r0 + j, tok + j * T, tgt + j * T, ds + j * T);
        ids[j] = r0 + j < rl->nrows ? r0 + j : rl->nrows;
    }
    return set_part(m, sp, tok, pref_model_targets(pl, tok, tgt, mtgt, GB, T), NULL, B, T);
}

// The position in each row where this rank's slice starts (sequence parallel), else 0.
static int part_t0(const Split *s, int Tm) { return s->n > 1 ? s->rank * Tm : 0; }

// The reference of preference training (preference.h): every row's summed token log-likelihood
// under the current (starting) weights with the adapters off, each rank computing its part of
// every global batch of B rows per rank (sequence parallel: its slice of every row, a partial
// sum) and the sums added over ranks. A long pass shows progress every 10 s.
static double *reference_pairs(Model *m, const PrefLoss *pl, RowLoader *rl, int B, int32_t *tok, int32_t *tgt,
                               int32_t *mtgt, int32_t *ds, Split *sp) {
    Comm *c = m->opt.comm;
    const size_t GB = (size_t)B * sp->dp, mine = part_row0(sp, B);
    double *ref = xcalloc(rl->nrows, sizeof(double)), *row = xmalloc(sizeof(double) * (size_t)B);
    size_t *ids = xmalloc(sizeof(size_t) * GB);
    const double t0 = now_ms();
    double shown = t0;
    m->adapters_off = 1;
    for (size_t r0 = 0; r0 < rl->nrows; r0 += GB) {
        if (now_ms() - shown > 10000 && c->rank == 0) {
            shown = now_ms();
            const double done = (double)r0 / (double)rl->nrows;
            printf("reference: %zu of %zu pairs (%.0f%%), %.0f s left\n", r0 / 2, rl->nunits, 100 * done,
                   (shown - t0) / 1000 * (1 - done) / done);
            fflush(stdout);
        }
        const int Tm = pair_batch(m, pl, rl, r0, B, tok, tgt, mtgt, ds, ids, sp);
        model_forward_rows(m, B, Tm, 0, NULL, row, NULL);
        for (int b = 0; b < B; b++)
            if (ids[mine + b] < rl->nrows) ref[ids[mine + b]] = -row[b];
    }
    m->adapters_off = 0;
    free(row);
    free(ids);
    c->all_reduce_sum_f64(c, ref, rl->nrows);
    return ref;
}

// Evaluation of preference pairs: every eval pair once, in global batches of B rows per rank
// (the last filled with empty pairs); the pairs' figures summed over ranks.
static PrefStats evaluate_pairs(Model *m, RowLoader *ev, const PrefLoss *pl, const double *ref, const int32_t *labels,
                                int32_t *tok, int32_t *tgt, int32_t *mtgt, int32_t *ds, Split *sp) {
    const int T = ev->T, B = ev->B * ev->unit / sp->dp;  // rows per rank
    const size_t mine = part_row0(sp, B);
    size_t *ids = xmalloc(sizeof(size_t) * B * sp->dp);
    PrefStats st = {0};
    for (size_t r0 = 0; r0 < ev->nrows; r0 += (size_t)B * sp->dp) {
        const int Tm = pair_batch(m, pl, ev, r0, B, tok, tgt, mtgt, ds, ids, sp);
        pref_micro_batch(m, pl, B, T, Tm, part_t0(sp, Tm), tgt + mine * T, ids + mine, ref, labels, ev->nrows, 0, 0,
                         &st);
    }
    free(ids);
    pref_stats_reduce(&st, m->opt.comm);
    return st;
}

// The step line's and metrics.jsonl's preference figures (TRL's names; prefix "eval_" or "").
static void pref_print(const PrefStats *st, const PrefLoss *pl, char *line, size_t cap) {
    const int orpo = pl->orpo, kto = pl->kto;
    const double n = st->pairs ? (double)st->pairs : NAN;
    if (kto) {  // TRL's KTO figures: means over the desirable and over the undesirable examples ("-": none)
        char f[3][24];
        const double c = st->n_chosen ? (double)st->n_chosen : NAN, r = st->n_rejected ? (double)st->n_rejected : NAN;
        const double v[3] = {st->reward_c / c - st->reward_r / r, st->reward_c / c, st->reward_r / r};
        for (int i = 0; i < 3; i++) isfinite(v[i]) ? snprintf(f[i], sizeof f[i], "%.4f", v[i]) : snprintf(f[i], sizeof f[i], "-");
        snprintf(line, cap, "rewards margin %s (chosen %s rejected %s) kl %.4f", f[0], f[1], f[2],
                 st->units ? st->kl / (double)st->units : NAN);
        return;
    }
    int len = snprintf(line, cap, "rewards acc %.3f margin %.4f (chosen %.4f rejected %.4f)", st->correct / n,
                       st->margin / n, st->reward_c / n, st->reward_r / n);
    if (orpo && len > 0 && (size_t)len < cap)
        snprintf(line + len, cap - (size_t)len, " nll %.4f log_odds %.4f", st->nll / (double)st->units,
                 st->log_odds_chosen / n);
}
// ", \"PREFIXkey\": value" for n keys and values (null for a value that is not finite).
static void metrics_keys(char *out, size_t cap, const char *prefix, const char *const *k, const double *v, int n) {
    size_t len = 0;
    out[0] = 0;
    for (int i = 0; i < n && len < cap; i++) {
        char num[32];
        len += (size_t)snprintf(out + len, cap - len, ", \"%s%s\": %s", prefix, k[i], metrics_num(num, sizeof num, v[i]));
    }
}
static void pref_metrics(const PrefStats *st, const PrefLoss *pl, const char *prefix, char *out, size_t cap) {
    const int orpo = pl->orpo, kto = pl->kto;
    const double n = st->pairs ? (double)st->pairs : NAN, u = st->units ? (double)st->units : NAN;
    if (pl->reward) {  // TRL's RewardTrainer's names
        const double v[7] = {st->correct / n, st->margin / n, (st->reward_c + st->reward_r) / (2 * n),
                             st->pairs ? st->reward_min : NAN, st->pairs ? st->reward_max : NAN, st->reward_c / n,
                             st->reward_r / n};
        const char *const k[7] = {"accuracy", "margin", "mean_reward", "min_reward", "max_reward", "rewards/chosen",
                                  "rewards/rejected"};
        metrics_keys(out, cap, prefix, k, v, 7);
        return;
    }
    if (kto) {  // TRL's KTOTrainer's names; rewards/* over each kind's examples (absent when there are none)
        const double c = st->n_chosen ? (double)st->n_chosen : NAN, r = st->n_rejected ? (double)st->n_rejected : NAN;
        const double v[6] = {st->reward_c / c, st->reward_r / r, st->reward_c / c - st->reward_r / r, st->logp_c / c,
                             st->logp_r / r, st->kl / u};
        const char *const k[6] = {"rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen",
                                  "logps/rejected", "kl"};
        metrics_keys(out, cap, prefix, k, v, 6);
        return;
    }
    const double v[9] = {st->reward_c / n, st->reward_r / n, st->correct / n, st->margin / n, st->logp_c / n,
                         st->logp_r / n, st->nll / u, st->log_odds_ratio / n, st->log_odds_chosen / n};
    const char *const k[9] = {"rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
                              "logps/chosen", "logps/rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen"};
    metrics_keys(out, cap, prefix, k, v, orpo ? 9 : 6);  // the last 3: orpo's
}

// "1h02m", "3m05s", "12s": the time left at the mean step time so far.
static void format_eta(char *out, size_t cap, double ms) {
    long long s = ms > 0 && ms < 1e15 ? (long long)(ms / 1000.0 + 0.5) : 0;
    if (s >= 86400) snprintf(out, cap, "%lldd%02lldh", s / 86400, s % 86400 / 3600);
    else if (s >= 3600) snprintf(out, cap, "%lldh%02lldm", s / 3600, s % 3600 / 60);
    else if (s >= 60) snprintf(out, cap, "%lldm%02llds", s / 60, s % 60);
    else snprintf(out, cap, "%llds", s);
}

// Byte-level sample: temperature-1 sampling from a newline, window capped at T.
static void print_sample(Model *m, int T, int ntok, Rng *rng) {
    const int V = m->cfg.vocab_size;
    int32_t *ctx = xmalloc(sizeof(int32_t) * (ntok + 1));
    float *logits = xmalloc(sizeof(float) * V);
    int n = 0;
    ctx[n++] = '\n';
    printf("---- sample ----\n");
    for (int i = 0; i < ntok; i++) {
        int start = n > T ? n - T : 0, len = n - start;
        model_set_batch(m, ctx + start, NULL, NULL, 1, len);
        model_last_logits(m, len, logits);
        double mx = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++) if (logits[v] > mx) mx = logits[v];
        for (int v = 0; v < V; v++) sum += exp(logits[v] - mx);
        double r = rng_uniform(rng) * sum, acc = 0;
        int pick = V - 1;
        for (int v = 0; v < V; v++) {
            acc += exp(logits[v] - mx);
            if (acc > r) { pick = v; break; }
        }
        ctx[n++] = pick;
        putchar(pick == '\n' || (pick >= 32 && pick < 127) ? pick : '?');
    }
    printf("\n----------------\n");
    free(ctx);
    free(logits);
}

// ---- run lifecycle: one run per output_dir, a clean stop on SIGINT/SIGTERM

// One run at a time per output_dir: rank 0 holds a flock on output_dir/.lock (which holds its
// pid) for the whole run. The kernel drops the lock when the process dies, however it dies, so
// a .lock file left by a killed run never blocks the next one.
static void lock_output_dir(const char *dir, Comm *c) {
    int holder = 0;  // 0: locked by us; > 0: the pid of the run that holds it; -1: unknown pid
    if (c->rank == 0) {
        if (mkdir_p(dir) != 0) fail("%s: cannot create output_dir: %s", dir, strerror(errno));
        char path[4096];
        join_path(path, sizeof path, dir, ".lock");
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) fail("%s: cannot create the lock file: %s", path, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {  // fd stays open: the lock lives with the process
            char pid[32];
            int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
            if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
                fail("%s: cannot write the lock file: %s", path, strerror(errno));
        } else if (errno == EWOULDBLOCK) {
            holder = -1;
            for (int i = 0; i < 100 && holder <= 0; i++) {  // the holder writes its pid just after locking
                char buf[32] = "";
                ssize_t r = pread(fd, buf, sizeof buf - 1, 0);
                if (r > 0) buf[r] = 0, holder = atoi(buf) > 0 ? atoi(buf) : -1;
                if (holder <= 0) usleep(1000);
            }
            close(fd);
        } else {
            fail("%s: cannot lock: %s", path, strerror(errno));
        }
    }
    c->broadcast(c, &holder, sizeof holder, 0);
    if (holder > 0) fail("%s is in use by another run (pid %d)", dir, holder);
    if (holder) fail("%s is in use by another run (pid unknown)", dir);
}

// The first SIGINT or SIGTERM asks the run to stop after the current optimizer step with a
// checkpoint; a second one exits at once (a checkpoint being written stays a hidden temporary
// directory, which the next run removes).
static volatile sig_atomic_t stop_signal;
static void on_signal(int sig) {
    if (stop_signal) {
        static const char msg[] = "\nsecond signal: exiting now without a checkpoint\n";
        ssize_t r = write(2, msg, sizeof msg - 1);
        (void)r;
        _exit(128 + sig);
    }
    stop_signal = sig;
    static const char msg[] = "\nsignal received: finishing this step, then writing a checkpoint "
                              "(send it again to exit at once)\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
}

static void install_signal_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

// 0, or the signal that stops the run. Every rank stops at the same step: a signal that reached
// any rank stops them all (one small all-reduce per step when there are several).
static int stop_requested(Comm *c) {
    double s = stop_signal != 0;
    if (c->world > 1) c->all_reduce_sum_f64(c, &s, 1);
    return s == 0 ? 0 : stop_signal ? (int)stop_signal : SIGTERM;
}

int train_main(int argc, char **argv, int arch) {
    backend_cpu_preinit(argv);
    if (argc == 4 && !strcmp(argv[1], "--quantize")) {  // a tool, not a training run
        quantize_model(argv[2], argv[3]);
        return 0;
    }
    Comm *comm = comm_create(&argc, &argv);
    const int world = comm->world, rank = comm->rank;
    if (world > 1) {
        static char prefix[32];
        snprintf(prefix, sizeof prefix, "rank %d: ", rank);
        fail_prefix = prefix;  // every rank's failure is reported, and says whose it is
        if (rank != 0 && !freopen("/dev/null", "w", stdout)) fail("cannot silence stdout");
    }
    Config cfg;
    config_from_args(&cfg, argc, argv, arch);
    // Axolotl's ddp_timeout bounds every collective's wait (an explicit LLMC_COMM_TIMEOUT wins).
    if (cfg.ddp_timeout > 0 && !getenv("LLMC_COMM_TIMEOUT")) comm->timeout_s = cfg.ddp_timeout;
    if (cfg.datasets_run && !cfg.plan_only) {  // Axolotl datasets: prepared (or found in its cache) by scripts/prepare_data.py
        ModelConfig vc = cfg.model;
        if (cfg.base_model[0] && arch == ARCH_GPT2) gpt2_read_config(cfg.base_model, &vc);
        else if (cfg.base_model[0]) load_base_config(&cfg, 0, &vc);
        prepare_data(&cfg, vc.vocab_size, comm);
        if (cfg.preprocess_only) {
            printf("--preprocess: prepared data in %s\n", cfg.prepared_dir);
            fflush(stdout);
            comm->barrier(comm);
            comm->destroy(comm);
            return 0;
        }
    }
    if (cfg.total_batch_size) {  // llm.c's -d: tokens per step over all ranks
        const long long per = (long long)cfg.micro_batch_size * cfg.sequence_len * (world / cfg.sequence_parallel_degree);
        if (cfg.total_batch_size % per)
            fail("total_batch_size %d is not a multiple of micro_batch_size x sequence_len x data-parallel ranks = %lld",
                 cfg.total_batch_size, per);
        cfg.gradient_accumulation_steps = (int)(cfg.total_batch_size / per);
    }
    if (cfg.hellaswag_data[0] && arch != ARCH_GPT2) fail("hellaswag_data: train_gpt only (GPT-2's vocabulary)");
    Backend *bk = make_backend(&cfg, &comm);
    if (bk && cfg.profile) opprof_install(bk);
    const int B = cfg.micro_batch_size, T = cfg.sequence_len, accum = cfg.gradient_accumulation_steps;

    // ---- model
    ModelConfig mc = cfg.model;
    if (cfg.base_model[0] && arch == ARCH_GPT2) gpt2_read_config(cfg.base_model, &mc);
    else if (cfg.base_model[0]) load_base_config(&cfg, 1, &mc);
    if (mc.num_labels && !cfg.reward_model && !cfg.process_reward_model)
        fail("%s: a %s classifier (%s, %d labels): %s: true trains it (a causal LM run would drop its score head)",
             cfg.base_model, mc.token_cls ? "token" : "sequence", mc.model_type, mc.num_labels,
             mc.token_cls ? "process_reward_model" : "reward_model");
    if (mc.num_labels && mc.token_cls != cfg.process_reward_model)
        fail("%s: a %s classifier, and %s trains a %s classifier", cfg.base_model, mc.token_cls ? "token" : "sequence",
             cfg.reward_model ? "reward_model" : "process_reward_model", mc.token_cls ? "sequence" : "token");
    if (cfg.process_reward_model) {
        if (mc.num_labels && mc.num_labels != 2)
            fail("%s: a token classifier with %d labels; a process reward model here has 2", cfg.base_model,
                 mc.num_labels);
        if (mc.multimodal) fail("%s: process_reward_model on a Gemma 3 multimodal model is not supported", cfg.base_model);
        mc.num_labels = 2, mc.token_cls = 1;
    }
    if (cfg.reward_model) {
        if (mc.num_labels > 1)
            fail("%s: a classifier with %d labels; a reward model has 1 (TRL's RewardTrainer)", cfg.base_model,
                 mc.num_labels);
        if (mc.multimodal) fail("%s: reward_model on a Gemma 3 multimodal model is not supported", cfg.base_model);
        mc.num_labels = 1;
    }
    if (mc.multimodal) {  // Gemma 3 4B/12B/27B: the text model alone is loaded (see model.h)
        if (cfg.lora_modules_to_save[0])
            fail("%s: lora_modules_to_save on a Gemma 3 multimodal model is not supported", cfg.base_model);
        printf("note: %s is Gemma3ForConditionalGeneration: its language model trains on text; the vision tower is "
               "not loaded (saved models carry it as it came; its adapters, which PEFT would create for the same "
               "module names, would keep B = 0 in a text-only run)\n", cfg.base_model);
    }
    if (mc.gelu_note[0]) printf("note: %s\n", mc.gelu_note);  // Gemma 1's activation keys (hf.c)
    if (cfg.rope_scaling_json[0]) {  // Axolotl's rope_scaling: replaces the model's
        char where[1200];
        snprintf(where, sizeof where, "%s:%d", cfg.path, cfg.rope_scaling_line);
        if (arch == ARCH_GPT2) fail("%s: rope_scaling: GPT-2 has learned positions, no rotary embedding", where);
        hf_override_rope(where, cfg.rope_scaling_json, &mc);
        model_config_validate(&mc, where);
    }
    if (T > mc.max_position_embeddings && arch == ARCH_GPT2)  // learned positions: no rows past it
        fail("sequence_len %d exceeds the model's max_position_embeddings %d", T, mc.max_position_embeddings);
    if (T > mc.max_position_embeddings) {
        // Axolotl raises the model's max_position_embeddings to sequence_len after loading it, so
        // the rotary embedding keeps what the loaded config gave (yarn's and longrope's factors);
        // the saved config.json says the new length.
        printf("note: increasing max_position_embeddings from %d to sequence_len %d, as Axolotl does (the rotary "
               "embedding keeps the values computed from %d)\n", mc.max_position_embeddings, T, mc.max_position_embeddings);
        // What the rotary embedding derived from the old length is written out explicitly, so
        // the saved model loads with the embedding it was trained with.
        if (mc.rope_type == ROPE_YARN && !mc.rope_original_max_position_embeddings) {
            mc.rope_original_max_position_embeddings = mc.max_position_embeddings;
            mc.rope_yarn_keys |= YARN_ORIG;
        }
        if (mc.rope_type == ROPE_LONGROPE) mc.rope_has_attention_factor = 1;
        mc.max_position_embeddings = T;
    }
    if (cfg.lisa_n_layers) {  // before --plan, so that it names what would stop the run
        const char *layers = arch == ARCH_GPT2 ? "transformer.h" : "model.layers";
        if (strcmp(cfg.lisa_layers_attribute, layers))
            fail("lisa_layers_attribute '%s': this model's decoder layers are '%s' (the only list LISA draws from here)",
                 cfg.lisa_layers_attribute, layers);
        if (cfg.lisa_n_layers > mc.num_hidden_layers)
            fail("lisa_n_layers %d: the model has %d decoder layers", cfg.lisa_n_layers, mc.num_hidden_layers);
    }
    // ---- memory plan: --plan prints it; auto picks from it; a limit names what would fit
    MemPolicy pol;
    config_mem_policy(&cfg, &pol);
    // Sequence parallelism: the ranks split every sequence (all of them, for now: no data
    // parallelism across groups); each holds T / n tokens through the whole layer.
    const int spn = cfg.sequence_parallel_degree;
    if (spn > 1) {
        if (spn != world)
            fail("sequence_parallel_degree %d needs exactly %d ranks (this run has %d; data parallelism across "
                 "sequence-parallel groups is not implemented)", spn, spn, world);
        if (arch != ARCH_LLAMA) fail("sequence_parallel_degree: GPT-2's learned positions are not supported");
        const char *why = seqpar_unsupported(spn, T, mc.num_attention_heads, mc.num_key_value_heads);
        if (why[0]) fail("sequence_parallel_degree %d: %s", spn, why);
        if (cfg.lora_dropout > 0 && B > 1)
            fail("sequence_parallel_degree with lora_dropout needs micro_batch_size 1 (dropout masks follow "
                 "global token indices)");
        if (cfg.sample_steps && mc.vocab_size == 256)
            printf("note: sample_steps: no samples are generated with sequence_parallel_degree %d\n", spn);
    }
    const Split split0 = {.n = spn, .rank = rank, .dp = world / spn};
    ModelOptions mo = {.stream = pol.stream_frozen, .comm = comm, .zero_stage = cfg.zero_stage,
                       .offload_optimizer = cfg.offload_optimizer, .offload_params = cfg.offload_params,
                       .load_in_4bit = cfg.load_in_4bit, .load_in_8bit = cfg.load_in_8bit,
                       .unfrozen = cfg.unfrozen_parameters, .seq_parallel = spn,
                       .lisa_layers = cfg.lisa_n_layers, .adam8 = optimizer_adam8_kind(cfg.optimizer)};
    PlanRow rows[32];
    int nrows = 0;
    char fitting[1024] = "";
    int is_auto = !strcmp(cfg.activation_offloading, "auto");
    if (cfg.plan_only || is_auto || cfg.device_memory_limit) {
        nrows = plan_rows(&cfg, &mc, bk, &mo, rows, 32);
        plan_fitting_names(rows, nrows, fitting, sizeof fitting);
    }
    if (cfg.plan_only) {
        plan_print(rows, nrows, (size_t)cfg.device_memory_limit, plan_host_limit(&cfg), stdout);
        plan_print_assumptions(plan_device(&cfg, bk), world, stdout);
        fflush(stdout);
        comm->barrier(comm);
        comm->destroy(comm);  // under mpirun every rank plans; all must finalize
        return 0;
    }
    lock_output_dir(cfg.output_dir, comm);  // before anything is loaded: a second run stops at once
    install_signal_handlers();
    if (is_auto) {
        const PlanRow *best = plan_pick(rows, nrows);
        if (!best) fail("activation_offloading: auto: no mode fits device_memory_limit and the host memory; see --plan");
        pol = best->pol;
        printf("activation_offloading: auto picked '%s'\n", best->name);
    }
    char tier_why[512];  // the offloading modes' device/host/disk tiers, as planned
    if (plan_budgets(&cfg, &mc, bk, &mo, &pol, tier_why, sizeof tier_why, NULL)) fail("%s", tier_why);
    bk->mem.limit = (size_t)cfg.device_memory_limit;
    if (fitting[0]) bk->oom_hint = fitting;
    LoraConfig lora;
    config_lora(&cfg, &mc, &lora);
    if (!strcmp(cfg.adapter, "qlora") && !cfg.load_in_4bit)
        fail("adapter: qlora needs load_in_4bit: true (the frozen base in NF4)");
    if (cfg.load_in_4bit && !lora.r)
        fail("load_in_4bit: a 4-bit base can only be trained through adapters (adapter: qlora)");
    if (cfg.load_in_8bit && cfg.load_in_4bit)
        fail("load_in_8bit and load_in_4bit: set one of them (8-bit with adapter: lora, 4-bit with adapter: qlora)");
    if (cfg.load_in_8bit && !lora.r)
        fail("load_in_8bit: an 8-bit base can only be trained through adapters (adapter: lora)");
    if (cfg.rl[0] && !cfg.reward_model && cfg.lora_model_dir[0])  // a reward model has no reference
        fail("rl: %s with lora_model_dir: the reference would be the base without that adapter and training would "
             "start from it; merge the adapter into base_model first (merge_lora) and train a new one", cfg.rl);
    PrefLoss pref_loss = {0};
    if (cfg.rl[0]) pref_loss_from_config(&pref_loss, &cfg);
    if (cfg.layer_offloading && !lora.r)
        fail("layer_offloading streams the frozen weights of adapter runs; a full fine-tune keeps its weights "
             "resident%s (use adapter: lora)", cfg.unfrozen_parameters[0] ? ", unfrozen_parameters or not" : "");
    Model model;
    model_create(&model, bk, &mc, &lora, &mo);
    if (cfg.reinit_weights && !cfg.base_model[0])
        fail("reinit_weights: true needs base_model (its config.json gives the architecture); a model: block "
             "is a random init already");
    if (cfg.reinit_weights) {
        printf("note: reinit_weights: %s's weights are not read; random init N(0, %g) as transformers' "
               "_init_weights (norms 1, biases 0, the padding row 0)\n", cfg.base_model,
               mc.initializer_range > 0 ? mc.initializer_range : 0.02);
        model_init_random(&model, (uint64_t)cfg.seed);
    } else if (cfg.base_model[0] && arch == ARCH_GPT2) gpt2_load(&model, cfg.base_model);
    else if (cfg.base_model[0]) {
        if (load_hf_weights(&model, cfg.base_model)) {
            printf("note: %s is a causal LM: the reward model's score.weight [%d, %d] starts from N(0, %g)%s (as "
                   "transformers initializes a head the checkpoint lacks); lm_head is not used\n", cfg.base_model,
                   mc.num_labels, mc.hidden_size, mc.initializer_range > 0 ? mc.initializer_range : 0.02,
                   mc.token_cls ? " and score.bias from 0" : "");
            model_init_param(&model, model.tab.lm_head, (uint64_t)cfg.seed);
            if (model.tab.score_bias >= 0) model_init_param(&model, model.tab.score_bias, (uint64_t)cfg.seed);
        }
    } else model_init_random(&model, (uint64_t)cfg.seed);
    if (lora.r && cfg.lora_model_dir[0]) load_adapter(&model, cfg.lora_model_dir);
    else if (lora.r) model_init_lora(&model, (uint64_t)cfg.seed);
    static Lisa lisa;
    if (cfg.lisa_n_layers) {
        lisa_init(&lisa, cfg.lisa_n_layers, cfg.lisa_step_interval, mc.num_hidden_layers, (uint64_t)cfg.seed);
        model.lisa = &lisa;
        char when[64] = "before every step";
        if (cfg.lisa_step_interval > 1)
            snprintf(when, sizeof when, "at steps 1 and 2 and then every %d steps", cfg.lisa_step_interval);
        if (rank == 0)
            printf("LISA: %d of %d layers (%.1f%%) train at a time, drawn %s; the embedding, final norm and head "
                   "train throughout; %s\n", cfg.lisa_n_layers, mc.num_hidden_layers,
                   100.0 * cfg.lisa_n_layers / mc.num_hidden_layers, when,
                   model.lisa_slot_of ? "float gradients for the drawn layers only"
                                      : "every layer keeps its gradient's place (zero_stage >= 1, or every layer drawn)");
    }
    size_t before = bk->mem.in_use;
    model_alloc_acts(&model, B, T / spn, &pol);
    size_t acts_bytes = bk->mem.in_use - before;

    // ---- data: every rank reads the global batch (world x B rows) and trains on its rows, so
    // N ranks see exactly the tokens one rank sees with micro batch N x B.
    // Prepared rows (datasets:) are served world x B at a time the same way.
    DataLoader train, val;
    RowLoader rtrain, rval;
    const int prepared = cfg.prepared_dir[0] != 0;
    int have_val;
    double steps_per_epoch;  // optimizer steps in one pass over the training data
    if (prepared) {
        char p[1200];
        snprintf(p, sizeof p, "%s/train.bin", cfg.prepared_dir);
        const int unit = cfg.rl[0] ? 2 : 1;  // preference pairs: two rows a unit
        rows_open(&rtrain, p, split0.dp * B / unit, accum, T, mc.vocab_size, cfg.shuffle, (uint64_t)config_data_seed(&cfg), "train rows");
        if (rtrain.unit != unit)
            fail("%s: %s, but the run %s (prepare the data again)", p, rtrain.unit == 2 ? "preference pairs" : "rows of "
                 "samples, not preference pairs", cfg.rl[0] ? "has rl set" : "has no rl");
        if (rtrain.labels != cfg.process_reward_model)
            fail("%s: %s, but the run %s (prepare the data again)", p, rtrain.labels ? "a token classifier's labelled rows" :
                 "rows without token labels", cfg.process_reward_model ? "trains a process reward model" :
                 "is no process_reward_model run");
        if (rtrain.scored != cfg.reward_model)
            fail("%s: %s, but the run %s (prepare the data again)", p, rtrain.scored ? "a reward model's rows" :
                 "preference pairs without score positions", cfg.reward_model ? "trains a reward model" :
                 "is no reward_model run");
        if (cfg.dataloader_drop_last) rows_drop_last(&rtrain);
        snprintf(p, sizeof p, "%s/eval.bin", cfg.prepared_dir);
        have_val = cfg.has_eval_rows = path_exists(p);
        if (have_val) rows_open(&rval, p, split0.dp * B / unit, 1, T, mc.vocab_size, 0, 0, "eval rows");
        if (have_val && (rval.unit != unit || rval.scored != rtrain.scored || rval.labels != rtrain.labels))
            fail("%s: paired and unpaired rows mixed (prepare the data again)", p);
        if (arch == ARCH_GPT2 && (rtrain.packed || (have_val && rval.packed)))
            fail("sample_packing needs rotary positions that restart per document; GPT-2 has learned positions: "
                 "set sample_packing: false (and eval_sample_packing: false)");
        steps_per_epoch = (double)rows_steps_per_epoch(&rtrain);
        printf("data: %s: %zu train rows%s, %llu target tokens", cfg.prepared_dir, rtrain.nrows,
               rtrain.packed ? " (packed)" : "", (unsigned long long)rtrain.ntargets);
        if (have_val)
            printf("; %zu eval rows%s, %llu target tokens", rval.nrows, rval.packed ? " (packed)" : "",
                   (unsigned long long)rval.ntargets);
        const char *units = unit == 2 ? "pairs" : "rows";
        printf("\ndata: %.0f steps per epoch = ceil(%zu %s / %d %s per step (micro_batch_size %d x "
               "gradient_accumulation_steps %d x %d ranks))%s\n", steps_per_epoch, rtrain.served, units,
               B / unit * accum * split0.dp, units, B / unit, accum, split0.dp,
               rtrain.served < rtrain.nunits ? " (dataloader_drop_last: an epoch's last partial micro-batch left out)" : "");
        config_plan_steps(&cfg, rows_steps_per_epoch(&rtrain) * accum);  // num_epochs -> max_steps, ...
        if (cfg.eval_steps && !have_val) {  // Axolotl: no eval dataset and val_set_size 0 -> eval_strategy "no"
            printf("note: no evaluation: there is no eval data (val_set_size 0 and no test_datasets), so Axolotl "
                   "turns evaluation off whatever eval_steps or evals_per_epoch say\n");
            cfg.eval_steps = 0;
        }
    } else {
        if (cfg.overfit_single_batch && !cfg.val_data[0]) fail("overfit_single_batch needs val_data (its first batch is trained on)");
        if (cfg.overfit_single_batch)  // llm.c's -a 1: the first val batch, again and again
            loader_open(&train, cfg.val_data, split0.dp * B, T, mc.vocab_size, 0, 0, "val_data");
        else
            loader_open(&train, cfg.train_data, split0.dp * B, T, mc.vocab_size, cfg.shuffle, (uint64_t)config_data_seed(&cfg), "train_data");
        have_val = cfg.val_data[0] != 0;
        if (have_val) loader_open(&val, cfg.val_data, split0.dp * B, T, mc.vocab_size, 0, 0, "val_data");
        if (cfg.dataloader_drop_last)
            printf("note: dataloader_drop_last has no effect here: train_data shards are read as one stream of "
                   "windows that runs on into the next epoch, so no batch is partial\n");
        steps_per_epoch = (double)train.total_windows / accum;
        config_plan_steps(&cfg, train.total_windows);  // num_epochs -> max_steps, warmup_ratio, cadences
        if (cfg.eval_steps && !have_val) fail("eval_steps is %d but no val_data is set", cfg.eval_steps);
    }

    // The checkpoint to resume from ("": none)
    char resume_dir[4096] = "";
    if (cfg.resume_from_checkpoint[0]) {
        snprintf(resume_dir, sizeof resume_dir, "%s", cfg.resume_from_checkpoint);
        if (!strcmp(resume_dir, "auto")) checkpoint_find_latest(cfg.output_dir, resume_dir, sizeof resume_dir);
        if (resume_dir[0] && !path_exists(resume_dir))
            fail("resume_from_checkpoint: '%s' does not exist", resume_dir);
    }

    // ---- host buffers of a step's batches (all its micro-batches), and this rank's slices
    const size_t BT = (size_t)B * T, GBT = BT * split0.dp;  // this rank's rows, the global batch
    Split split = split0;
    if (spn > 1) split.tok = xmalloc(sizeof(int32_t) * BT / spn), split.tgt = xmalloc(sizeof(int32_t) * BT / spn);
    int32_t *tok = xmalloc(sizeof(int32_t) * GBT * accum), *tgt = xmalloc(sizeof(int32_t) * GBT * accum);
    int32_t *dst = prepared ? xmalloc(sizeof(int32_t) * GBT * accum) : NULL;  // document starts
    // rl: orpo's targets for the model (pref_model_targets); rl: kto's labels
    int32_t *mtgt = pref_loss.orpo ? xmalloc(sizeof(int32_t) * GBT * accum) : NULL;
    int32_t *labels_train = NULL, *labels_eval = NULL;
    if (pref_loss.kto) {
        char lp[1200];
        snprintf(lp, sizeof lp, "%s/train_labels.bin", cfg.prepared_dir);
        labels_train = pref_read_labels(lp, rtrain.nunits);
        snprintf(lp, sizeof lp, "%s/eval_labels.bin", cfg.prepared_dir);
        if (have_val) labels_eval = pref_read_labels(lp, rval.nunits);
    }

    // ---- preference training: the reference's log-probabilities, from the starting weights
    // (before a resume loads other ones), adapters off; a checkpoint of the run holds them
    double *ref_train = NULL, *ref_eval = NULL;
    const char *ref_key = strrchr(cfg.prepared_dir, '/') ? strrchr(cfg.prepared_dir, '/') + 1 : cfg.prepared_dir;
    if (cfg.rl[0] && !pref_loss.ref_free) {
        double t0 = now_ms();
        char ev[64] = "";
        const char *units = pref_loss.kto ? "examples" : "pairs";  // kto: an example's two rows
        if (have_val) snprintf(ev, sizeof ev, " and %zu eval %s", rval.nunits, units);
        ref_train = xmalloc(sizeof(double) * rtrain.nrows);
        ref_eval = have_val ? xmalloc(sizeof(double) * rval.nrows) : NULL;
        if (resume_dir[0] && checkpoint_read_reference(resume_dir, ref_key, ref_train, rtrain.nrows, ref_eval,
                                                       have_val ? rval.nrows : 0)) {
            printf("reference: log-probabilities of %zu train %s%s read from %s/reference_logps.bin\n",
                   rtrain.nunits, units, ev, resume_dir);
        } else {
            free(ref_train);
            free(ref_eval);
            ref_train = reference_pairs(&model, &pref_loss, &rtrain, B, tok, tgt, mtgt, dst, &split);
            ref_eval = have_val ? reference_pairs(&model, &pref_loss, &rval, B, tok, tgt, mtgt, dst, &split) : NULL;
            printf("reference: log-probabilities of %zu train %s%s from the starting weights%s in %.1f s\n",
                   rtrain.nunits, units, ev, lora.r ? " (adapters off)" : "", (now_ms() - t0) / 1000);
        }
    }

    // ---- output and resume
    if (mkdir_p(cfg.output_dir) != 0) fail("%s: cannot create output_dir: %s", cfg.output_dir, strerror(errno));
    if (rank == 0) checkpoint_clean_debris(cfg.output_dir);
    if (cfg.activation_offloading_dir[0]) diskio_clean_debris(cfg.activation_offloading_dir);
    comm->barrier(comm);
    static RunIdentity run_id;  // checked against a checkpoint we resume from, written into ours
    run_identity(&run_id, &cfg, &model);
    LoopState ls = {0};
    ls.run = &run_id;
    ls.model_only = cfg.save_only_model;
    ls.ref_train = ref_train, ls.nref_train = ref_train ? rtrain.nrows : 0;
    ls.ref_eval = ref_eval, ls.nref_eval = ref_eval ? rval.nrows : 0;
    ls.ref_key = ref_key;
    rng_seed(&ls.sample_rng, (uint64_t)cfg.seed ^ 0x5A5A5A5AULL);
    if (resume_dir[0]) {
        checkpoint_load(&model, &ls, resume_dir);
        if (prepared) rows_seek(&rtrain, ls.data_epoch, ls.data_next);
        else loader_seek(&train, ls.data_epoch, ls.data_next);
        printf("resumed from %s at step %d\n", resume_dir, ls.step);
    } else if (cfg.resume_from_checkpoint[0]) {
        printf("resume_from_checkpoint: auto found no checkpoint in %s; starting fresh\n", cfg.output_dir);
    }
    Metrics metrics;
    metrics_open(&metrics, cfg.output_dir, ls.step, rank == 0);
    if (arch == ARCH_GPT2) gpt2_print_box(&cfg, &model, bk, world, acts_bytes);
    else print_box(&cfg, &model, bk, acts_bytes, cfg.rl[0] ? &pref_loss : NULL);
    char tiers[192];
    act_describe_tiers(&pol, act_tiers(model.store), tiers, sizeof tiers);
    if (tiers[0] && rank == 0) printf("memory tiers: %s\n", tiers);
    HellaSwag hsw = {0};
    if (cfg.hellaswag_data[0]) {
        if (spn > 1) fail("hellaswag_data: not with sequence_parallel_degree %d", spn);
        hellaswag_open(&hsw, cfg.hellaswag_data, T, mc.vocab_size);
        printf("hellaswag: %s: %d examples\n", cfg.hellaswag_data, hsw.n);
    }
    const int val_batches = !have_val || prepared ? 0 : cfg.eval_batches ? cfg.eval_batches : (int)val.total_windows;

    OptimConfig oc = {cfg.learning_rate, cfg.adam_beta1, cfg.adam_beta2, cfg.adam_epsilon,
                      cfg.weight_decay, cfg.max_grad_norm, cfg.warmup_steps, cfg.max_steps,
                      schedule_from_name(cfg.lr_scheduler), cfg.cosine_min_lr_ratio,
                      !strcmp(cfg.warmup_style, "llmc"), cfg.lr_quadratic_warmup};
    size_t *sid = cfg.rl[0] ? xmalloc(sizeof(size_t) * (size_t)B * split0.dp * accum) : NULL;  // the step's row ids

    int bad_in_row = 0;  // consecutive skipped (non-finite) steps
    int stopped = stop_requested(comm), last_saved = -1;  // a signal: stop after this step
    int early_stop = 0, no_better = 0, best_step = 0;     // early_stopping_patience
    int high_loss = 0;                                    // loss_watchdog: steps in a row above the threshold
    double best_val = INFINITY;
    if (stopped) printf("interrupted by %s before the first step; nothing to save\n", strsignal(stopped));
    const int first_step = ls.step;
    // llm.c evaluates before the first step too (its "val loss" at step 0).
    if (arch == ARCH_GPT2 && val_batches && cfg.eval_steps && first_step == 0 && cfg.max_steps > 0 && !stopped) {
        double vl = evaluate(&model, &val, val_batches, tok, tgt, &split);
        printf("step %5d/%d | val_loss %.6f\n", 0, cfg.max_steps, vl);
        char nl[32];
        metrics_line(&metrics, "\"step\": 0, \"val_loss\": %s", metrics_num(nl, sizeof nl, vl));
    }
    const double loop_t0 = now_ms();
    for (int step = ls.step; step < cfg.max_steps && !stopped && !early_stop; step++) {
        double t0 = now_ms();
        if (cfg.profile) opprof_step_begin();
        bk->mem.peak = bk->mem.in_use;  // peaks are per step
        bk->mem.host_peak = bk->mem.host_in_use;
        bk->mem.disk_peak = bk->mem.disk_in_use;
        double streamed0 = model.streamer ? streamer_bytes_loaded(model.streamer) : 0;
        double comm0 = comm->busy_ms;
        // Load the whole step first: the loss is a mean over all its valid targets.
        long long count = 0;
        if (cfg.overfit_single_batch && !prepared) loader_reset(&train);
        for (int a = 0; a < accum; a++) {
            if (prepared) rows_next(&rtrain, tok + a * GBT, tgt + a * GBT, dst + a * GBT);
            else loader_next(&train, tok + a * GBT, tgt + a * GBT);
            if (sid) memcpy(sid + (size_t)a * B * split0.dp, rtrain.ids, sizeof(size_t) * B * split0.dp);
        }
        for (size_t i = 0; i < GBT * accum; i++) count += tgt[i] >= 0;
        float scale = count ? (float)(1.0 / (double)count) : 0.0f;
        // Preference losses are means over the step's units (each rank's micro-batches), each a mean
        // within its unit (preference.h).
        long long step_units = 0;
        PrefStats pst = {0};
        for (size_t u = 0; sid && u < (size_t)split0.dp * accum; u++) {
            int any_pair = 0;
            for (size_t i = u * B; i < (u + 1) * B; i += 2) any_pair |= sid[i] < rtrain.nrows;
            step_units += any_pair;
        }
        const int32_t *model_tgt = cfg.rl[0] ? pref_model_targets(&pref_loss, tok, tgt, mtgt, (size_t)GBT / T * accum, T)
                                             : tgt;
        if (model.lisa && (step == first_step || lisa_draws_at(model.lisa, step))) {
            lisa_draw(model.lisa, lisa_last_draw(model.lisa, step));
            model_lisa_drawn(&model);
            char on[1024];
            lisa_describe(model.lisa, on, sizeof on);
            if (rank == 0) printf("LISA: from step %d the layers %s train\n", step + 1, on);
        }
        model_zero_grads(&model);
        double loss_sum = 0;
        int ran = 0;  // micro-batches computed
        for (int a = 0; a < accum; a++) {
            // A micro-batch with no target anywhere (the empty rows that fill an epoch's last
            // step) adds exactly zero to every gradient: skip it on all ranks alike.
            long long any = 0;
            for (size_t i = 0; i < GBT && !any; i++) any = tgt[a * GBT + i] >= 0;
            if (!any) continue;
            ran++;
            // Packed rows carry their document map (unpacked: one sample per row, then padding,
            // which no real token attends to, so the plain causal mask is the same).
            const int Tm = set_part(&model, &split, tok + a * GBT, model_tgt + a * GBT,
                                    prepared && rtrain.packed ? dst + a * GBT : NULL, B, T);
            // Dropout masks depend only on (seed, micro-batch): recompute and resume agree.
            Rng dr;
            rng_seed(&dr, (uint64_t)cfg.seed * 1000003ULL + (uint64_t)step * accum + a);
            model.dropout_seed = rng_next(&dr);
            if (cfg.rl[0]) {
                const size_t mine = (size_t)a * B * split0.dp + part_row0(&split, B);
                pref_micro_batch(&model, &pref_loss, B, T, Tm, part_t0(&split, Tm), tgt + mine * T, sid + mine,
                                 ref_train, labels_train, rtrain.nrows, 1, 1.0 / (double)step_units, &pst);
            } else
                loss_sum += model_forward_backward(&model, B, Tm, scale);
        }
        comm->all_reduce_sum_f64(comm, &loss_sum, 1);
        float loss = (float)(loss_sum * scale);
        char pref_line[224] = "";
        if (cfg.rl[0]) {
            pref_stats_reduce(&pst, comm);
            loss = (float)pref_stats_loss(&pst);
            pref_print(&pst, &pref_loss, pref_line + 3, sizeof pref_line - 3);
            memcpy(pref_line, " | ", 3);
        }
        double norm = grad_norm(&model);
        double lr = lr_at(&oc, step);
        // A non-finite loss or gradient must never reach the weights: the step is skipped (the
        // batch is consumed) and, if it keeps happening, the run stops with the weights of the
        // last good step untouched. The norm is global, so every rank skips alike.
        const int skip = !isfinite(loss) || !isfinite(norm);
        if (skip) {
            ls.skipped++;
            if (++bad_in_row < MAX_BAD_STEPS)
                fprintf(stderr, "warning: step %d: loss %g, grad norm %g: not finite; step skipped, "
                    "weights unchanged (%d in a row; %d stop the run)\n", step + 1, loss, norm,
                    bad_in_row, MAX_BAD_STEPS);
        } else {
            bad_in_row = 0;
            optim_step(&model, &oc, lr, norm, step + 1 - ls.skipped);  // AdamW counts updates
        }
        bk->sync(bk);
        double ms = now_ms() - t0;
        if (cfg.profile) opprof_step_end(ms);
        double tps = (double)GBT * ran / (ms / 1000.0);  // tokens computed (skipped empty micro-batches not counted)
        ls.step = step + 1;
        ls.data_epoch = prepared ? rtrain.epoch : train.epoch;
        ls.data_next = prepared ? rtrain.next : train.next;
        char eta[32];
        format_eta(eta, sizeof eta, (now_ms() - loop_t0) / (ls.step - first_step) * (cfg.max_steps - ls.step));
        char peak[32], hpeak[32], dpeak[32];
        format_bytes(peak, sizeof peak, (double)bk->mem.peak);
        format_bytes(hpeak, sizeof hpeak, (double)bk->mem.host_peak);
        format_bytes(dpeak, sizeof dpeak, (double)bk->mem.disk_peak);
        if (arch == ARCH_GPT2 && (ls.step % cfg.log_steps == 0 || ls.step == cfg.max_steps || ls.step == 1)) {
            // llm.c's step line (its loss and grad-norm z-scores aside), then the memory peaks
            char mfu[32] = "MFU n/a";
            double f = gpt2_mfu(&model, bk, &cfg, (double)GBT * ran / split0.dp, ms / 1000.0);
            if (f >= 0) snprintf(mfu, sizeof mfu, "%.1f%% MFU", 100 * f);
            printf("step %4d/%d | loss %7.6f | norm %6.4f | lr %.2e | %.2f ms | %s | %.0f tok/s | dev %s host %s | "
                   "eta %s%s\n", ls.step, cfg.max_steps, loss, norm, lr, ms, mfu, tps, peak, hpeak, eta,
                   skip ? " | skipped" : "");
        } else if (ls.step % cfg.log_steps == 0 || ls.step == cfg.max_steps || ls.step == 1)
            printf("step %5d/%d | epoch %.2f/%.3g | loss %.6f | lr %.3e | norm %.4f | %.1f ms | %.0f tok/s | "
                   "dev %s host %s disk %s | eta %s%s%s\n", ls.step, cfg.max_steps, ls.step / steps_per_epoch,
                   cfg.max_steps / steps_per_epoch, loss, lr, norm, ms, tps, peak, hpeak, dpeak, eta, pref_line,
                   skip ? " | skipped" : "");
        char pref_keys[512] = "";
        if (cfg.rl[0]) pref_metrics(&pst, &pref_loss, "", pref_keys, sizeof pref_keys);
        char nl[32], nn[32];
        metrics_line(&metrics,
                     "\"step\": %d, \"epoch\": %.6g, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, \"ms\": %.3f, "
                     "\"tokens_per_sec\": %.1f, \"device_peak_bytes\": %zu, \"host_peak_bytes\": %zu, "
                     "\"disk_peak_bytes\": %zu, \"streamed_weight_bytes\": %.0f, \"comm_ms\": %.3f%s%s",
                     ls.step, ls.step / steps_per_epoch, metrics_num(nl, sizeof nl, loss), lr, metrics_num(nn, sizeof nn, norm), ms,
                     tps, bk->mem.peak, bk->mem.host_peak, bk->mem.disk_peak,
                     model.streamer ? streamer_bytes_loaded(model.streamer) - streamed0 : 0.0,
                     comm->busy_ms - comm0, pref_keys, skip ? ", \"skipped\": true" : "");
        if (bad_in_row >= MAX_BAD_STEPS)
            fail("step %d: loss %g, grad norm %g: %d consecutive non-finite steps; stopping "
                 "(the last checkpoint holds the last good weights; lower learning_rate or "
                 "set max_grad_norm)", ls.step, loss, norm, bad_in_row);
        // Axolotl's loss watchdog: learning that has broken down stops the run like early
        // stopping does (a skipped, non-finite step neither counts nor breaks the run).
        if (cfg.loss_watchdog_threshold > 0 && !skip) {
            high_loss = loss > cfg.loss_watchdog_threshold ? high_loss + 1 : 0;
            if (high_loss >= cfg.loss_watchdog_patience && ls.step < cfg.max_steps) {
                early_stop = 1;
                printf("loss watchdog: loss above loss_watchdog_threshold %g for %d steps in a row "
                       "(%.6f at step %d); stopping\n", cfg.loss_watchdog_threshold, high_loss, loss, ls.step);
            }
        }
        fflush(stdout);
        if (cfg.eval_steps && (ls.step % cfg.eval_steps == 0 || ls.step == cfg.max_steps)) {
            double vl;
            if (cfg.rl[0]) {
                PrefStats es = evaluate_pairs(&model, &rval, &pref_loss, ref_eval, labels_eval, tok, tgt, mtgt, dst, &split);
                vl = pref_stats_loss(&es);
                char line[224], keys[640];
                pref_print(&es, &pref_loss, line, sizeof line);
                pref_metrics(&es, &pref_loss, "eval_", keys, sizeof keys);
                printf("step %5d/%d | eval_loss %.6f | eval_pairs %lld | eval %s\n", ls.step, cfg.max_steps, vl, es.pairs,
                       line);
                metrics_line(&metrics, "\"step\": %d, \"eval_loss\": %s, \"eval_pairs\": %lld%s", ls.step,
                             metrics_num(nl, sizeof nl, vl), es.pairs, keys);
            } else if (prepared) {
                double hf;
                long long ntg;
                model.cls_correct = model.cls_labelled = 0;
                vl = evaluate_rows(&model, &rval, tok, tgt, dst, &split, &hf, &ntg);
                // A token classifier's accuracy over the labelled tokens (TRL's PRMTrainer's metric)
                double hits[2] = {(double)model.cls_correct, (double)model.cls_labelled};
                comm->all_reduce_sum_f64(comm, hits, 2);
                char acc[64] = "", acck[64] = "", na[32];
                if (mc.token_cls) {
                    snprintf(acc, sizeof acc, " | eval_accuracy %.4f", hits[1] ? hits[0] / hits[1] : NAN);
                    snprintf(acck, sizeof acck, ", \"eval_accuracy\": %s",
                             metrics_num(na, sizeof na, hits[1] ? hits[0] / hits[1] : NAN));
                }
                printf("step %5d/%d | eval_loss %.6f | eval_tokens %lld | eval_loss_hf %.6f%s\n", ls.step,
                       cfg.max_steps, vl, ntg, hf, acc);
                metrics_line(&metrics, "\"step\": %d, \"eval_loss\": %s, \"eval_tokens\": %lld, \"eval_loss_hf\": %s%s",
                             ls.step, metrics_num(nl, sizeof nl, vl), ntg, metrics_num(nn, sizeof nn, hf), acck);
            } else {
                vl = evaluate(&model, &val, val_batches, tok, tgt, &split);
                printf("step %5d/%d | val_loss %.6f\n", ls.step, cfg.max_steps, vl);
                metrics_line(&metrics, "\"step\": %d, \"val_loss\": %s", ls.step, metrics_num(nl, sizeof nl, vl));
            }
            if (vl < best_val) best_val = vl, best_step = ls.step, no_better = 0;
            else if (cfg.early_stopping_patience && ++no_better >= cfg.early_stopping_patience && ls.step < cfg.max_steps) {
                early_stop = 1;
                printf("early stopping at step %d: val_loss has not improved for %d evaluations "
                       "(best %.6f at step %d)\n", ls.step, no_better, best_val, best_step);
            }
        }
        if (hsw.n && ((cfg.eval_steps && ls.step % cfg.eval_steps == 0) || ls.step == cfg.max_steps)) {
            int good;
            double acc = hellaswag_eval(&model, &hsw, B, T, &good);
            printf("HellaSwag: %d/%d = %f\n", good, hsw.n, acc);
            metrics_line(&metrics, "\"step\": %d, \"hellaswag_acc\": %.9g, \"hellaswag_correct\": %d, \"hellaswag_examples\": %d",
                         ls.step, acc, good, hsw.n);
        }
        // Every rank runs the sampler (ZeRO-3 gathers are collective); only rank 0 prints.
        if (cfg.sample_steps && (mc.vocab_size == 256 || arch == ARCH_GPT2) && spn == 1 && !mc.num_labels &&
            (ls.step % cfg.sample_steps == 0 || ls.step == cfg.max_steps)) {
            if (arch == ARCH_GPT2) gpt2_sample(&model, T, cfg.sample_tokens);
            else print_sample(&model, T, cfg.sample_tokens, &ls.sample_rng);
        }
        // No checkpoint in the middle of a run of skipped steps: the last one stays the last
        // good state to go back to. (The final model is written: its weights are unchanged.)
        if (((cfg.save_steps && ls.step % cfg.save_steps == 0) || ls.step == cfg.max_steps || early_stop ||
             (cfg.save_first_step && ls.step == 1)) && !skip) {
            checkpoint_save(&model, &ls, cfg.output_dir);
            printf("saved %s/checkpoint-%d\n", cfg.output_dir, ls.step);
            last_saved = ls.step;
            if (rank == 0) config_prune_checkpoints(&cfg, ls.step);  // save_total_limit
        }
        // SIGINT/SIGTERM: this step is done; keep it in a checkpoint and stop (the last step
        // goes on to write the final model instead).
        if (ls.step < cfg.max_steps && (stopped = stop_requested(comm))) {
            if (last_saved != ls.step || ls.model_only) {
                LoopState resumable = ls;  // made to be resumed: with the optimizer state whatever save_only_model says
                resumable.model_only = 0;
                checkpoint_save(&model, &resumable, cfg.output_dir);
                printf("saved %s/checkpoint-%d\n", cfg.output_dir, ls.step);
            }
            printf("interrupted by %s at step %d/%d; resume with --set resume_from_checkpoint=auto "
                   "(or =%s/checkpoint-%d)\n", strsignal(stopped), ls.step, cfg.max_steps,
                   cfg.output_dir, ls.step);
        }
    }
    if (!stopped) {
        model_gather_all(&model);  // ZeRO-3: every rank sends its pieces; rank 0 writes
        if (rank == 0) export_final(&model, &cfg, arch == ARCH_GPT2 ? "" : cfg.base_model);
        model_gather_done(&model);
        printf("final %s: %s\n", lora.r ? "adapter" : "model", cfg.output_dir);
    }
    if (cfg.profile && rank == 0) opprof_report(stdout);
    fflush(stdout);
    metrics_close(&metrics);
    hellaswag_close(&hsw);
    free(tok);
    free(tgt);
    free(split.tok);
    free(split.tgt);
    free(dst);
    free(mtgt);
    free(labels_train);
    free(labels_eval);
    free(sid);
    free(ref_train);
    free(ref_eval);
    if (prepared) {
        rows_close(&rtrain);
        if (have_val) rows_close(&rval);
    } else {
        loader_close(&train);
        if (have_val) loader_close(&val);
    }
    model_free(&model);  // removes the disk tier's files
    if (cfg.lisa_n_layers) lisa_free(&lisa);
    comm->barrier(comm);
    // The comm before the backend: an NCCL comm queues its collectives on the backend's stream,
    // which bk->destroy destroys (in the other order the barrier above ran on a destroyed
    // stream: a segfault at exit on the first GPU run, LLMC_FORCE_NCCL=1, 2026-11-27)
    comm->destroy(comm);
    bk->destroy(bk);
    return stopped ? 128 + stopped : 0;  // 130 for SIGINT, 143 for SIGTERM
}
