// optim.h: learning-rate schedules, global-norm clipping and AdamW over the parameter table.
#pragma once
#include "model.h"

typedef struct {
    double lr, beta1, beta2, eps, weight_decay, max_grad_norm;
    int warmup_steps, max_steps;
    int schedule;  // SCHED_*
    double min_lr_ratio;  // cosine decays to lr * min_lr_ratio (Axolotl's cosine_min_lr_ratio);
                          // linear and wsd too (llm.c's final fraction, -q)
    int warmup_plus_one;  // llm.c's warmup: lr * (s + 1) / warmup instead of lr * s / warmup
    int warmup_quadratic; // Axolotl's lr_quadratic_warmup: lr * (s / warmup)^2
} OptimConfig;

enum { SCHED_CONSTANT, SCHED_LINEAR, SCHED_COSINE, SCHED_WSD };

int schedule_from_name(const char *name);
// Learning rate for 0-based step s, Hugging Face's warmup convention (base * s / warmup), or
// with warmup_quadratic base * (s / warmup)^2 (Axolotl's lr_quadratic_warmup).
// Cosine with min_lr_ratio r: lr * (r + (1 - r) * 0.5 * (1 + cos(pi * progress))), as Axolotl's
// cosine_min_lr_ratio schedule. Linear: lr * (r + (1 - r) * (1 - progress)). wsd (llm.c's
// warmup-stable-decay): constant until step floor(0.8 * max_steps) (in float32, as llm.c), then
// lr * (r + (1 - r) * (1 - sqrt(d))) with d = (s - that step) / (max_steps - that step).
double lr_at(const OptimConfig *oc, int s);
// Global L2 norm of all gradients (before clipping), after the data-parallel sum and after
// zeroing the rows unfrozen_parameters' row ranges leave frozen.
double grad_norm(Model *m);
// One AdamW update of every trainable tensor; step is 1-based. Returns the clip coefficient.
float optim_step(Model *m, const OptimConfig *oc, double lr, double norm, int step);
