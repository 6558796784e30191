// optim.c: see optim.h. The loops walk the parameter table, so the optimizer never needs to
// know which tensor is which beyond each spec's decay flag; sharding only narrows each
// tensor to the part inside this rank's range.
#include "optim.h"
#include <math.h>
#include <string.h>
#include "comm.h"
#include "cpu/kernels.h"
#include "stb_ds.h"

int schedule_from_name(const char *name) {
    if (!strcmp(name, "linear")) return SCHED_LINEAR;
    if (!strcmp(name, "cosine")) return SCHED_COSINE;
    return SCHED_CONSTANT;
}

double lr_at(const OptimConfig *oc, int s) {
    const int w = oc->warmup_steps, total = oc->max_steps;
    if (s < w) return oc->lr * (double)s / (double)w;
    double rest = (double)(total - w > 1 ? total - w : 1);
    switch (oc->schedule) {
    case SCHED_LINEAR: {
        double f = (double)(total - s) / rest;
        return oc->lr * (f > 0 ? f : 0);
    }
    case SCHED_COSINE: {
        double f = 0.5 * (1.0 + cos(M_PI * (double)(s - w) / rest));
        return oc->lr * (f > 0 ? f : 0);
    }
    default:
        return oc->lr;
    }
}

static int sharded(const Model *m) { return m->opt.comm && m->opt.comm->world > 1; }

// Where trainable index j's gradient is after the gradient exchange.
static void *grad_at(const Model *m, size_t j) {
    return act_at(m->bk, m->grads, j - (m->opt.zero_stage >= 1 ? m->opt_lo : 0));
}

static int part(const Model *m, const ParamSpec *p, size_t *a, size_t *b) {
    *a = p->goff > m->opt_lo ? p->goff : m->opt_lo;
    *b = p->goff + p->numel < m->opt_hi ? p->goff + p->numel : m->opt_hi;
    return p->trainable && *a < *b;
}

double grad_norm(Model *m) {
    Comm *c = m->opt.comm;
    const size_t full = m->tab.shard * m->tab.world;
    // Data parallel: sum the ranks' gradients (each already scaled by the global token count),
    // everywhere (stage 0) or only into the owner's shard (stage 1, result at grads[0, shard)).
    if (sharded(m) && full) {
        if (m->opt.zero_stage >= 1) c->reduce_scatter_sum(c, m->grads, m->grads, m->tab.shard);
        else c->all_reduce_sum(c, m->grads, full);
    }
    // Per tensor, in table order; a tied head is one entry, so each gradient counts once.
    double ss = 0;
    for (int i = 0; i < (int)arrlen(m->tab.specs); i++) {
        size_t a, b;
        if (part(m, &m->tab.specs[i], &a, &b)) ss += m->bk->sumsq(m->bk, grad_at(m, a), b - a);
    }
    if (sharded(m) && m->opt.zero_stage >= 1) c->all_reduce_sum_f64(c, &ss, 1);
    return sqrt(ss);
}

float optim_step(Model *m, const OptimConfig *oc, double lr, double norm, int step) {
    Backend *bk = m->bk;
    // torch.nn.utils.clip_grad_norm_: coefficient max / (norm + 1e-6), only when below 1.
    float clip = 1.0f;
    if (oc->max_grad_norm > 0) {
        double c = oc->max_grad_norm / (norm + 1e-6);
        if (c < 1.0) clip = (float)c;
    }
    const size_t lo = m->opt_lo, n = m->opt_hi - m->opt_lo;
    if (m->opt.offload_optimizer && n) {
        bk->download_act(bk, m->host_grads, grad_at(m, lo), n);
    }
    for (int i = 0; i < (int)arrlen(m->tab.specs); i++) {
        const ParamSpec *p = &m->tab.specs[i];
        size_t a, b;
        if (!part(m, p, &a, &b)) continue;  // frozen, or another rank's
        float wd = p->decay ? (float)oc->weight_decay : 0.0f;
        if (m->opt.offload_optimizer) {
            // ZeRO-Offload: the update runs on the host's threads on the fp32 master.
            adamw_f32(m->master + (a - lo), m->host_grads + (a - lo), m->adam_m + (a - lo),
                      m->adam_v + (a - lo), b - a, (float)lr, (float)oc->beta1, (float)oc->beta2,
                      (float)oc->eps, wd, clip, step);
        } else {
            bk->adamw(bk, act_at(bk, m->params, a), m->master ? m->master + (a - lo) : NULL,
                      grad_at(m, a), m->adam_m + (a - lo), m->adam_v + (a - lo), b - a, (float)lr,
                      (float)oc->beta1, (float)oc->beta2, (float)oc->eps, wd, clip, step);
        }
    }
    if (m->opt.offload_optimizer && n) bk->upload_act(bk, act_at(bk, m->params, lo), m->master, n);
    // Stage 1: every rank updated its shard; gather the new weights everywhere.
    if (sharded(m) && m->opt.zero_stage >= 1 && m->tab.shard)
        m->opt.comm->all_gather(m->opt.comm, m->params, act_at(bk, m->params, lo), m->tab.shard);
    return clip;
}
