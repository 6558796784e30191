// optim.h: learning-rate schedules, global-norm clipping and AdamW over the parameter table.
#pragma once
#include "model.h"
#include "cpu/kernels.h"

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

// bitsandbytes' 8-bit AdamW (bnb.optim.AdamW8bit, what Axolotl's adamw_bnb_8bit, adamw_8bit
// and paged_adamw_8bit build; blockwise, as bitsandbytes >= 0.44 always is): a tensor of at
// least ADAM8_MIN elements (its min_8bit_size) keeps each moment as one byte per element, an
// index into a 256-entry code map (create_dynamic_map: signed for the first moment, unsigned
// for the second) scaled by its block's absmax, blocks of ADAM8_BLOCK elements from the
// tensor's start; smaller tensors keep float moments and the ordinary AdamW. About 2.03 bytes
// of state per parameter instead of 8.
#define ADAM8_MIN 4096  // and ADAM8_BLOCK (backend.h): 256
// torchao's AdamW8bit (transformers' adamw_torch_8bit) is the same scheme with its own float
// steps (lerp moments, lr (m / bc1) / denom), rounding (up from half the step between codes),
// a scale of at least 1e-12, and byte moments only for tensors whose size is also a multiple
// of 256 (its block).
// torchao's AdamW4bit (adamw_torch_4bit): the same steps as its AdamW8bit over 4-bit codes, two
// to a byte (the even element in the high half), blocks of ADAM4_BLOCK (backend.h: 128), a 16-entry dynamic map
// (create_dynamic_map(signed, 3, 4)) for the first moment and linspace(0, 1, 17)[1:] (no zero)
// for the second; byte moments for tensors of at least 4096 elements whose size is a multiple
// of 128. Its maps sit where the 8-bit ones do (adam8_maps' layout), in the first 16 of each half.
enum { ADAM8_BNB = 1, ADAM8_TORCHAO = 2, ADAM4_TORCHAO = 3 };
// ADAM8_BNB, ADAM8_TORCHAO or ADAM4_TORCHAO for the optimizer names that mean one, else 0.
int optimizer_adam8_kind(const char *name);
// adam8_maps' layout with torchao's 4-bit maps (zeros after the 16 of each half).
void adam4_maps(float *map);
// map[0..255]: the signed map (first moment), map[256..511]: the unsigned one, ascending, the
// float values bitsandbytes' create_dynamic_map(signed) computes with torch.
void adam8_maps(float *map);
// Model.adam8 and the sizes for a model whose owned parts are laid out (model_create); fails
// under ZeRO over several ranks (its shards cut tensors, and a block's absmax needs all of one).
void adam8_layout(Model *m);
