// optim.c: see optim.h. The loops walk the parameter table, so the optimizer never needs to
// know which tensor is which beyond each spec's decay flag; sharding only narrows each
// tensor to the part inside this rank's range.
#include "optim.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "comm.h"
#include "cpu/kernels.h"
#include "stb_ds.h"
#include "util.h"

int schedule_from_name(const char *name) {
    if (!strcmp(name, "linear")) return SCHED_LINEAR;
    if (!strcmp(name, "cosine")) return SCHED_COSINE;
    if (!strcmp(name, "wsd")) return SCHED_WSD;
    return SCHED_CONSTANT;
}

double lr_at(const OptimConfig *oc, int s) {
    const int w = oc->warmup_steps, total = oc->max_steps;
    const double r = oc->min_lr_ratio;
    if (s < w && oc->warmup_quadratic) {
        const double f = (double)s / (double)w;
        return oc->lr * (f * f);
    }
    if (s < w) return oc->lr * (double)(s + (oc->warmup_plus_one != 0)) / (double)w;
    double rest = (double)(total - w > 1 ? total - w : 1);
    switch (oc->schedule) {
    case SCHED_LINEAR: {
        double f = (double)(total - s) / rest;
        return oc->lr * (r + (1.0 - r) * (f > 0 ? f : 0));
    }
    case SCHED_WSD: {
        const int d = (int)(0.8f * (float)total);  // llm.c computes the decay point in float32
        if (s < d) return oc->lr;
        double f = (double)(s - d) / (double)(total - d > 0 ? total - d : 1);
        return oc->lr * (r + (1.0 - r) * (1.0 - sqrt(f < 1 ? f : 1)));
    }
    case SCHED_COSINE: {
        double f = 0.5 * (1.0 + cos(M_PI * (double)(s - w) / rest));
        f = oc->min_lr_ratio + (1.0 - oc->min_lr_ratio) * (f > 0 ? f : 0);
        return oc->lr * (f > 0 ? f : 0);
    }
    default:
        return oc->lr;
    }
}

static int sharded(const Model *m) { return m->opt.comm && m->opt.comm->world > 1; }

// After the gradient exchange, gradients and optimizer state are indexed locally (see
// Model.owned); the weights too under ZeRO-3, which keeps only its pieces.
static void *param_at(const Model *m, size_t a, size_t local) {
    return m->opt.zero_stage >= 3 ? act_at(m->bk, m->pieces, local) : act_at(m->bk, m->params, a);
}

double grad_norm(Model *m) {
    Comm *c = m->opt.comm;
    const size_t full = m->tab.shard * m->tab.world;
    // Data parallel: sum the ranks' gradients (each already scaled by the global token count),
    // everywhere (stage 0) or only into the owner's shard (stage 1, result at grads[0, shard)).
    // (ZeRO-3 already sent each unit's gradients to their owners during backward.)
    if (sharded(m) && full && m->opt.zero_stage < 3) {
        if (m->opt.zero_stage >= 1) c->reduce_scatter_sum(c, m->grads, m->grads, m->tab.shard);
        else c->all_reduce_sum(c, m->grads, m->grads_n);
    }
    // unfrozen_parameters' row ranges: the rows outside them get a zero gradient before the
    // norm, as Axolotl's gradient hook leaves them (AdamW then only decays them).
    for (int i = 0; i < (int)arrlen(m->tab.specs); i++) {
        const ParamSpec *p = &m->tab.specs[i];
        size_t a, b, loc;
        float *g;
        if (!p->nfrozen || !model_owned_part(m, p, &a, &b, &loc) || !(g = model_grad_at(m, p, loc))) continue;
        const size_t cols = p->numel / (size_t)p->shape[0];
        for (int k = 0; k < p->nfrozen; k++) {
            size_t lo = p->goff + (size_t)p->frozen[k][0] * cols, hi = p->goff + (size_t)p->frozen[k][1] * cols;
            lo = lo > a ? lo : a, hi = hi < b ? hi : b;
            if (lo < hi) model_zero_grad_range(m, g + (lo - a), hi - lo);
        }
    }
    // Per tensor, in table order; a tied head is one entry, so each gradient counts once. The
    // backend sums the list with one wait; the host adds the sums in order. A layer LISA did
    // not draw has no gradient (all zeros where it has a place: the same sum either way).
    const int nspec = (int)arrlen(m->tab.specs);
    const float **x = xmalloc(sizeof *x * (size_t)(nspec + 1));
    size_t *len = xmalloc(sizeof *len * (size_t)(nspec + 1));
    double *each = xmalloc(sizeof *each * (size_t)(nspec + 1));
    int k = 0;
    for (int i = 0; i < nspec; i++) {
        size_t a, b, loc;
        const ParamSpec *p = &m->tab.specs[i];
        if (model_owned_part(m, p, &a, &b, &loc) && (x[k] = model_grad_at(m, p, loc))) len[k++] = b - a;
    }
    if (m->opt.offload_params) {  // host memory: the CPU backend's own sums (the same bits there)
        for (int i = 0; i < k; i++) each[i] = sumsq_f32(x[i], len[i]);
    } else {
        m->bk->sumsq_many(m->bk, x, len, k, each);
    }
    double ss = 0;
    for (int i = 0; i < k; i++) ss += each[i];
    free(x);
    free(len);
    free(each);
    if (sharded(m) && m->opt.zero_stage >= 1) c->all_reduce_sum_f64(c, &ss, 1);
    return sqrt(ss);
}

// offload_optimizer: the updated fp32 master of [a, b) (local index loc) into the weights.
static void master_to_params(Model *m, size_t a, size_t loc, size_t n) {
    if (m->opt.offload_params) m->bk->host_from_f32(m->bk, param_at(m, a, loc), m->master + loc, n);
    else m->bk->upload_act(m->bk, param_at(m, a, loc), m->master + loc, n);
}

// One tensor's update under 8-bit AdamW: its byte moments through adamw8, or (a small tensor)
// its float moments through adamw; on the host with offload_optimizer, as the float path.
static void adam8_update(Model *m, int i, size_t a, size_t loc, const float *g, const OptimConfig *oc, float lr,
                         float wd, float clip, int t) {
    Backend *bk = m->bk;
    const ParamSpec *p = &m->tab.specs[i];
    const Adam8Slot *s = &m->adam8[i];
    const size_t n = p->numel;
    const float b1 = (float)oc->beta1, b2 = (float)oc->beta2, eps = (float)oc->eps;
    const int flavor = m->opt.adam8 - 1;  // adamw8's: 0 bitsandbytes, 1 torchao, 2 torchao 4-bit
    if (m->opt.offload_optimizer) {
        float *w = m->master + loc;
        const float *hg = m->host_grads + (g - m->grads);
        if (s->on)
            adamw8_f32(w, hg, m->q_m + s->q, m->q_v + s->q, m->absmax_m + s->blk, m->absmax_v + s->blk, m->adam8_maps,
                       n, lr, b1, b2, eps, wd, clip, t, flavor);
        else
            adamw_f32(w, hg, m->adam_m + s->f, m->adam_v + s->f, n, lr, b1, b2, eps, wd, clip, t);
        master_to_params(m, a, loc, n);
    } else if (s->on) {
        bk->adamw8(bk, param_at(m, a, loc), m->master ? m->master + loc : NULL, g, m->q_m + s->q, m->q_v + s->q,
                   m->absmax_m + s->blk, m->absmax_v + s->blk, m->adam8_maps, n, lr, b1, b2, eps, wd, clip, t, flavor);
    } else {
        bk->adamw(bk, param_at(m, a, loc), m->master ? m->master + loc : NULL, g, m->adam_m + s->f, m->adam_v + s->f,
                  n, lr, b1, b2, eps, wd, clip, t);
    }
}

float optim_step(Model *m, const OptimConfig *oc, double lr, double norm, int step) {
    Backend *bk = m->bk;
    // torch.nn.utils.clip_grad_norm_: coefficient max / (norm + 1e-6), only when below 1.
    float clip = 1.0f;
    if (oc->max_grad_norm > 0) {
        double c = oc->max_grad_norm / (norm + 1e-6);
        if (c < 1.0) clip = (float)c;
    }
    const size_t n = model_grads_used(m);
    if (m->opt.offload_optimizer && !m->opt.offload_params && n) {  // the float gradients, as they are
        bk->copy_d2h(bk, m->host_grads, m->grads, n * sizeof(float), NULL);
        bk->sync(bk);
    }
    for (int i = 0; i < (int)arrlen(m->tab.specs); i++) {
        const ParamSpec *p = &m->tab.specs[i];
        size_t a, b, loc;
        if (!model_owned_part(m, p, &a, &b, &loc)) continue;  // frozen, or another rank's
        // LISA: a layer not drawn had no gradient, and torch's AdamW skips such a tensor (no
        // update, no decay); a drawn one's bias correction counts its own updates.
        int t = step;
        if (m->lisa && p->layer >= 0) {
            if (!m->lisa->on[p->layer]) continue;
            t = m->lisa->updates[p->layer] + 1;
        }
        float wd = p->decay ? (float)oc->weight_decay : 0.0f;
        float *g = model_grad_at(m, p, loc);
        if (m->opt.adam8) {
            adam8_update(m, i, a, loc, g, oc, (float)lr, wd, clip, t);
            continue;
        }
        if (m->opt.offload_optimizer) {
            // ZeRO-Offload: the update runs on the host's threads on the fp32 master.
            adamw_f32(m->master + loc, m->host_grads + (g - m->grads), m->adam_m + loc, m->adam_v + loc, b - a,
                      (float)lr, (float)oc->beta1, (float)oc->beta2, (float)oc->eps, wd, clip, t);
            master_to_params(m, a, loc, b - a);
        } else {
            bk->adamw(bk, param_at(m, a, loc), m->master ? m->master + loc : NULL,
                      g, m->adam_m + loc, m->adam_v + loc, b - a, (float)lr,
                      (float)oc->beta1, (float)oc->beta2, (float)oc->eps, wd, clip, t);
        }
    }
    if (m->lisa)
        for (int l = 0; l < m->lisa->L; l++) m->lisa->updates[l] += m->lisa->on[l];
    // Stage 1: every rank updated its shard; gather the new weights everywhere. (Stage 3
    // gathers each unit when it is next used.)
    if (sharded(m) && m->opt.zero_stage == 1 && m->tab.shard)
        m->opt.comm->all_gather(m->opt.comm, m->params,
                                act_at(bk, m->params, (size_t)m->opt.comm->rank * m->tab.shard), m->tab.shard);
    return clip;
}

// ---- 8-bit AdamW --------------------------------------------------------------------------

int optimizer_adam8_kind(const char *name) {
    if (!strcmp(name, "adamw_bnb_8bit") || !strcmp(name, "adamw_8bit") || !strcmp(name, "paged_adamw_8bit"))
        return ADAM8_BNB;
    return !strcmp(name, "adamw_torch_8bit") ? ADAM8_TORCHAO : !strcmp(name, "adamw_torch_4bit") ? ADAM4_TORCHAO : 0;
}

// torch.linspace(start, end, steps)[i] in float32: computed in double from the float start and
// rounded once. torch's CPU kernel (float steps, FMA and vector chunks as its build and CPU
// give) lands within one unit in the last place of these, so bitsandbytes' maps differ between
// machines in the last bit of a few codes; test_adamw8.py compares against torch's.
static float linspace_at(float start, float end, int steps, int i) {
    return (float)((double)start + ((double)end - (double)start) * i / (steps - 1));
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

// create_dynamic_map(signed, max_exponent_bits e (7 or 3), total_bits e + 1): for exponent i
// = 0..e-1, the midpoints of linspace(0.1, 1, 2^i + 1 (signed) or 2^(i+1) + 1 points) times
// 10^(i - e + 1), with their negatives when signed; then 0 and 1; sorted. Each product is float32
// (torch multiplies the float32 midpoints by the Python float).
static void dynamic_map(float *out, int is_signed, int e) {
    int n = 0;
    for (int i = 0; i < e; i++) {
        const int items = is_signed ? (1 << i) + 1 : (1 << (i + 1)) + 1;
        const float scale = (float)pow(10.0, i - e + 1);
        for (int k = 0; k + 1 < items; k++) {
            const float mean = (linspace_at(0.1f, 1.0f, items, k) + linspace_at(0.1f, 1.0f, items, k + 1)) / 2.0f;
            out[n++] = scale * mean;
            if (is_signed) out[n++] = -scale * mean;
        }
    }
    out[n++] = 0.0f;
    out[n++] = 1.0f;
    if (n != 1 << (e + 1)) fail("internal: the dynamic map has %d entries", n);
    qsort(out, (size_t)n, sizeof(float), cmp_float);
}

void adam8_maps(float *map) {
    dynamic_map(map, 1, 7);
    dynamic_map(map + 256, 0, 7);
}

void adam4_maps(float *map) {
    memset(map, 0, 512 * sizeof(float));
    dynamic_map(map, 1, 3);
    for (int k = 1; k <= 16; k++) map[256 + k - 1] = linspace_at(0.0f, 1.0f, 17, k);  // linspace(0, 1, 17)[1:]
}

void adam8_layout(Model *m) {
    const int nspec = (int)arrlen(m->tab.specs), world = m->opt.comm ? m->opt.comm->world : 1;
    if (world > 1 && m->opt.zero_stage >= 1)  // its shards cut tensors (even where one happens not to)
        fail("8-bit AdamW (optimizer %s) with ZeRO-%d over %d ranks: each rank would hold parts of tensors, and 8-bit "
             "AdamW needs whole ones (its blocks' absmax): use one rank, zero_stage 0, or a 32-bit optimizer",
             m->opt.adam8 == ADAM4_TORCHAO ? "adamw_torch_4bit" : m->opt.adam8 == ADAM8_TORCHAO ? "adamw_torch_8bit"
                                                                                 : "adamw_bnb_8bit",
             m->opt.zero_stage, world);
    m->adam8 = xcalloc((size_t)(nspec ? nspec : 1), sizeof *m->adam8);
    m->adam8_n = m->adam8_blocks = m->adam8_small = 0;
    const int four = m->opt.adam8 == ADAM4_TORCHAO;
    const size_t blk = four ? ADAM4_BLOCK : ADAM8_BLOCK;
    for (int i = 0; i < nspec; i++) {
        const ParamSpec *p = &m->tab.specs[i];
        size_t a, b, loc;
        if (!model_owned_part(m, p, &a, &b, &loc)) continue;
        if (a != p->goff || b != p->goff + p->numel)
            fail("internal: 8-bit AdamW: %s is split between ranks", p->name);
        Adam8Slot *s = &m->adam8[i];
        if (p->numel >= ADAM8_MIN && (m->opt.adam8 == ADAM8_BNB || p->numel % blk == 0)) {
            s->on = 1, s->q = m->adam8_n, s->blk = m->adam8_blocks;
            m->adam8_n += four ? p->numel / 2 : p->numel;  // bytes
            m->adam8_blocks += (p->numel + blk - 1) / blk;
        } else {
            s->f = m->adam8_small;
            m->adam8_small += p->numel;
        }
    }
}

