// optim.c: see optim.h. The loops walk the parameter table, so the optimizer never needs to
// know which tensor is which beyond each spec's decay flag.
#include "optim.h"
#include <math.h>
#include <string.h>
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

double grad_norm(Model *m) {
    // A tied head is one entry of the table, so every gradient is counted once.
    double ss = 0;
    for (int i = 0; i < (int)arrlen(m->tab.specs); i++) {
        const ParamSpec *p = &m->tab.specs[i];
        if (p->trainable) ss += m->bk->sumsq(m->bk, act_at(m->bk, m->grads, p->goff), p->numel);
    }
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
    for (int i = 0; i < (int)arrlen(m->tab.specs); i++) {
        const ParamSpec *p = &m->tab.specs[i];
        if (!p->trainable) continue;  // frozen: no gradient, no optimizer state
        bk->adamw(bk, act_at(bk, m->params, p->offset), m->master ? m->master + p->goff : NULL,
                  act_at(bk, m->grads, p->goff), m->adam_m + p->goff, m->adam_v + p->goff,
                  p->numel, (float)lr, (float)oc->beta1, (float)oc->beta2, (float)oc->eps,
                  p->decay ? (float)oc->weight_decay : 0.0f, clip, step);
    }
    return clip;
}
