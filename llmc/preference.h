// preference.h: preference training (rl: dpo, ipo, simpo, orpo) as TRL 1.8's trainers compute it.
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
// rl: orpo (TRL's ORPOTrainer) has no reference either: the chosen rows' mean token loss over
// the whole sequence, prompt included, minus beta times log sigmoid of the log odds ratio of
// the completions' mean log-likelihoods:
//   orpo     nll - beta log sigmoid((lc - lr) - (log(1 - e^lc) - log(1 - e^lr)))
// Its rows are stored as the other methods' (completion targets only); the prompt's targets,
// which only orpo's nll reads, are the row's next tokens (pref_model_targets).
// rl: kto (TRL's KTOTrainer) has unpaired examples, each with a label (desirable or not): row 2k
// is example k's sequence, row 2k+1 its KL sequence (the prompt with the completion of the
// example before it in its batch); with lr = p - ref of the sequence and kl = max(0, the mean of
// (p - ref) over the micro-batch's KL rows, averaged over the data-parallel ranks; no gradient):
//   kto      desirable: w_d (1 - sigmoid(beta (lr - kl))); undesirable: w_u (1 - sigmoid(beta (kl - lr)))
// reward_model (TRL's RewardTrainer; rl "reward" inside) has no reference: a score head reads each
// row's number rc, rr at the one position its targets mark (the last non-pad token), and
//   reward   -log sigmoid(rc - rr) + center (rc + rr)^2, center_rewards_coefficient (0: off)
//
// Every term is a mean within a unit, one rank's micro-batch (pairs, or the chosen rows'
// tokens for sft and orpo's nll), and the loss is the mean over the step's units: HF Trainer
// divides each micro-batch's loss by the accumulation steps and DDP averages the ranks.
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

enum { PL_SIGMOID, PL_HINGE, PL_IPO, PL_ROBUST, PL_SFT, PL_SIMPO, PL_ORPO, PL_KTO };
#define PREF_MAX_LOSSES 8

typedef struct {
    int n, kind[PREF_MAX_LOSSES];
    double weight[PREF_MAX_LOSSES];
    double beta, smoothing, gamma;
    int ref_free;  // rl: simpo and orpo: no reference; log-likelihoods are per-token means
    int orpo;      // rl: orpo: the chosen rows' prompts are trained too (pref_model_targets)
    int kto;       // rl: kto: examples with labels, each a sequence and a KL sequence
    double w_des, w_und;  // rl: kto: the desirable and undesirable examples' weights
    int reward;           // reward_model: a Bradley-Terry reward model (rl "reward")
    double center;        // reward_model: center_rewards_coefficient
} PrefLoss;

// loss, nll (orpo's) and kl (kto's) are sums over units (divide by units); the rest sums over
// pairs (divide by pairs for TRL's figures; kto: over its desirable examples, n_chosen, or its
// undesirable ones, n_rejected): log_odds_ratio and log_odds_chosen are orpo's log sigmoid of the
// log odds ratio and the ratio itself.
typedef struct {
    double loss, nll, kl, reward_c, reward_r, correct, margin, logp_c, logp_r, log_odds_ratio, log_odds_chosen;
    double reward_min, reward_max;  // reward_model: the smallest and largest score (when pairs > 0)
    long long pairs, units, n_chosen, n_rejected;
} PrefStats;

// The config's rl keys as losses; fails naming a loss type not implemented.
void pref_loss_from_config(PrefLoss *pl, const Config *cfg);
// "sigmoid", "0.5 sigmoid + 1 sft", ... for the run's box.
void pref_loss_describe(const PrefLoss *pl, char *out, size_t cap);
// The targets the model is given for rows (tok, tgt: T each, as stored): tgt itself, except
// under orpo, where a row's positions before its completion get the next token as target (written
// into out, which is returned; out may be NULL for the other methods).
const int32_t *pref_model_targets(const PrefLoss *pl, const int32_t *tok, const int32_t *tgt, int32_t *out,
                                  size_t rows, int T);
// One micro-batch, a unit, already set on the model with pref_model_targets' targets (B rows =
// B/2 pairs of this rank, tgt their stored targets, T a row; the model holds Tm tokens of each
// from position t0 on, fewer under sequence parallelism, whose ranks add their slices' sums;
// ids the rows' indices into ref; ids >= nref are empty pairs). train: add unit_weight (1 / the
// step's units) x the gradient of the unit's loss into the model's gradients. Adds the unit's
// figures into st.
// labels: rl: kto's, one per example (row ids / 2), else NULL.
void pref_micro_batch(Model *m, const PrefLoss *pl, int B, int T, int Tm, int t0, const int32_t *tgt,
                      const size_t *ids, const double *ref, const int32_t *labels, size_t nref, int train,
                      double unit_weight, PrefStats *st);
// rl: kto's labels of a prepared rows file (NAME_labels.bin beside it), n examples; fails naming
// the file when it is missing, damaged or of another count.
int32_t *pref_read_labels(const char *path, size_t n);
// Sums st over the ranks.
void pref_stats_reduce(PrefStats *st, Comm *c);
// The loss st's units give: the mean of the units' losses.
double pref_stats_loss(const PrefStats *st);
