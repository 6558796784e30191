// preference.h: preference training (rl: dpo, rl: ipo) as TRL 1.8's DPOTrainer computes it.
//
// Each pair is two rows (rows.h, paired): the prompt with the chosen completion and the prompt
// with the rejected one; a row's log-likelihood is the sum of log p over its completion tokens
// (its targets). With the policy's sums pc, pr and the reference's rc, rr (the same sums under
// the starting weights, adapters off), d = (pc - rc) - (pr - rr) and the losses of TRL's
// loss_type list, each a mean over pairs, times its weight, are summed:
//   sigmoid  -log sigmoid(beta d)
//   hinge    relu(1 - beta d)
//   robust   (-(1 - e) log sigmoid(beta d) + e log sigmoid(-beta d)) / (1 - 2e), e = label smoothing
//   ipo      ((pc - rc) / nc - (pr - rr) / nr - 1 / (2 beta))^2, n* the completions' token counts
//   sft      the chosen completions' mean token cross-entropy (TRL's replacement of rpo_alpha)
// rl: simpo (TRL's CPOTrainer with loss_type simpo) has no reference and works on the
// completions' mean token log-likelihoods lc = pc / nc, lr = pr / nr:
//   simpo    -log sigmoid(beta (lc - lr) - gamma), plus cpo_alpha x sft
// The gradient reaches the tokens as a cross-entropy gradient scaled per row (negative for a
// rejected row): model_forward_rows, then model_backward_rows.
//
// The reference is computed once, before training, by a forward pass over every pair with the
// starting weights and the adapters switched off: TRL's reference for an adapter run (the base
// model with the adapter disabled) and Axolotl's for a full fine-tune (a second copy of
// base_model), without a second copy in memory (train.c's reference_pairs); checkpoints keep the
// sums (checkpoint.h), and a resume without them computes them again before it loads.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "comm.h"
#include "config.h"
#include "model.h"

enum { PL_SIGMOID, PL_HINGE, PL_IPO, PL_ROBUST, PL_SFT, PL_SIMPO };
#define PREF_MAX_LOSSES 8

typedef struct {
    int n, kind[PREF_MAX_LOSSES];
    double weight[PREF_MAX_LOSSES];
    double beta, smoothing, gamma;
    int ref_free;  // rl: simpo: no reference; log-likelihoods are per-token means
} PrefLoss;

// Sums over pairs (divide by pairs for TRL's means); sft_nll is the weighted sum of the chosen
// rows' token losses (divided by chosen_tokens).
typedef struct {
    double loss, reward_c, reward_r, correct, margin, logp_c, logp_r, sft_nll;
    long long pairs, chosen_tokens;
} PrefStats;

// The config's rl keys as losses; fails naming a loss type not implemented.
void pref_loss_from_config(PrefLoss *pl, const Config *cfg);
// "sigmoid", "0.5 sigmoid + 1 sft", ... for the run's box.
void pref_loss_describe(const PrefLoss *pl, char *out, size_t cap);
// One micro-batch already set on the model (B rows = B/2 pairs of this rank, tgt their whole
// targets, T a row; the model holds Tm tokens of each, fewer under sequence parallelism, whose
// ranks add their slices' sums; ids the rows' indices into ref; ids >= nref are empty pairs). train: add scale x the
// gradient of the losses' sum into the model's gradients (scale = 1 / the step's pairs,
// sft_scale = 1 / the step's chosen completion tokens). Adds the pairs' figures into st.
void pref_micro_batch(Model *m, const PrefLoss *pl, int B, int T, int Tm, const int32_t *tgt, const size_t *ids,
                      const double *ref, size_t nref, int train, double scale, double sft_scale, PrefStats *st);
// Sums st over the ranks.
void pref_stats_reduce(PrefStats *st, Comm *c);
// The loss st's pairs give: the pair losses' mean plus the sft term's token mean.
double pref_stats_loss(const PrefStats *st);
