// preference.c: see preference.h.
#include "preference.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util.h"

static const char *const LOSS_NAMES[] = {"sigmoid", "hinge", "ipo", "robust", "sft", "simpo"};
// TRL 1.8's other loss types: named in the error, not implemented here.
static const char *const TRL_OTHERS = "exo_pair, nca_pair, bco_pair, sppo_hard, aot, aot_unpaired, apo_zero, "
                                      "apo_down, discopop, sigmoid_norm";

// The next comma-separated item of *s into out (trimmed); 0 at the end.
static int next_item(const char **s, char *out, size_t cap) {
    while (**s == ' ' || **s == ',') (*s)++;
    if (!**s) return 0;
    size_t n = 0;
    while (**s && **s != ',') {
        if (n + 1 < cap) out[n++] = **s;
        (*s)++;
    }
    while (n && out[n - 1] == ' ') n--;
    out[n] = 0;
    return 1;
}

void pref_loss_from_config(PrefLoss *pl, const Config *cfg) {
    memset(pl, 0, sizeof *pl);
    pl->beta = cfg->rl_beta;
    pl->smoothing = cfg->dpo_label_smoothing;
    pl->gamma = cfg->simpo_gamma;
    pl->ref_free = !strcmp(cfg->rl, "simpo");
    const char *s = cfg->dpo_loss_type[0] ? cfg->dpo_loss_type : "sigmoid";
    char item[64];
    while (next_item(&s, item, sizeof item)) {
        if (pl->n == PREF_MAX_LOSSES) fail("dpo_loss_type: more than %d loss types", PREF_MAX_LOSSES);
        int k = -1;
        for (int i = 0; i < (int)(sizeof LOSS_NAMES / sizeof *LOSS_NAMES); i++)
            if (!strcmp(item, LOSS_NAMES[i])) k = i;
        if (k == PL_SIMPO && !pl->ref_free) k = -1;  // TRL's DPOTrainer has no simpo loss (rl: simpo is the CPOTrainer)
        if (k < 0)
            fail("dpo_loss_type: '%s' is not implemented (sigmoid, hinge, ipo, robust, sft are; TRL's %s are not)", item,
                 TRL_OTHERS);
        pl->kind[pl->n] = k;
        pl->weight[pl->n++] = 1.0;
    }
    if (cfg->dpo_loss_weights[0]) {
        const char *w = cfg->dpo_loss_weights;
        int n = 0;
        while (next_item(&w, item, sizeof item)) {
            char *end;
            double v = strtod(item, &end);
            if (*end || !isfinite(v)) fail("dpo_loss_weights: '%s' is not a number", item);
            if (n < pl->n) pl->weight[n] = v;
            n++;
        }
        if (n != pl->n)
            fail("dpo_loss_weights: %d weights for %d loss types in dpo_loss_type (one each)", n, pl->n);
    }
    int robust = 0;
    for (int i = 0; i < pl->n; i++) robust |= pl->kind[i] == PL_ROBUST;
    if (!robust) pl->smoothing = 0;  // TRL 1.8's other losses do not read it (config.c says so)
}

void pref_loss_describe(const PrefLoss *pl, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (int i = 0; i < pl->n && n < cap; i++) {
        if (pl->weight[i] == 1.0)
            n += (size_t)snprintf(out + n, cap - n, "%s%s", i ? " + " : "", LOSS_NAMES[pl->kind[i]]);
        else
            n += (size_t)snprintf(out + n, cap - n, "%s%g %s", i ? " + " : "", pl->weight[i], LOSS_NAMES[pl->kind[i]]);
    }
    if (n < cap && pl->smoothing > 0) snprintf(out + n, cap - n, " (label smoothing %g)", pl->smoothing);
}

// log sigmoid(z) and sigmoid(z) without overflow.
static double log_sigmoid(double z) { return z >= 0 ? -log1p(exp(-z)) : z - log1p(exp(z)); }
static double sigmoid(double z) { return z >= 0 ? 1 / (1 + exp(-z)) : exp(z) / (1 + exp(z)); }

static long long targets_in(const int32_t *tgt, int T) {
    long long n = 0;
    for (int t = 0; t < T; t++) n += tgt[t] >= 0;
    return n;
}

void pref_micro_batch(Model *m, const PrefLoss *pl, int B, int T, int Tm, const int32_t *tgt, const size_t *ids,
                      const double *ref, size_t nref, int train, double scale, double sft_scale, PrefStats *st) {
    double *nll = xmalloc(sizeof(double) * (size_t)B);  // each row's summed token loss: -log-likelihood
    float *row_scale = xcalloc((size_t)B, sizeof(float));
    model_forward_rows(m, B, Tm, train, nll);
    if (Tm < T) {  // sequence parallel: each rank summed its slice of every row
        Comm *c = m->opt.comm;
        c->all_reduce_sum_f64(c, nll, (size_t)B);
    }
    const double beta = pl->beta, e = pl->smoothing;
    for (int i = 0; i < B / 2; i++) {
        const int c = 2 * i, r = 2 * i + 1;
        if (ids[c] >= nref) continue;  // an empty pair (the epoch's last step)
        const double pc = -nll[c], pr = -nll[r];
        const double rc = pl->ref_free ? 0 : ref[ids[c]], rr = pl->ref_free ? 0 : ref[ids[r]];
        const long long nc = targets_in(tgt + (size_t)c * T, T), nr = targets_in(tgt + (size_t)r * T, T);
        const double d = (pc - rc) - (pr - rr), z = beta * d;
        double loss = 0, gc = 0, gr = 0;  // this pair's losses and d(loss)/d(pc), d(loss)/d(pr)
        for (int k = 0; k < pl->n; k++) {
            const double w = pl->weight[k];
            double g = 0;  // d(loss)/d(d) for the losses of d alone
            switch (pl->kind[k]) {
            case PL_SIGMOID:
                loss += w * -log_sigmoid(z);
                g = -beta * sigmoid(-z);
                break;
            case PL_HINGE:
                loss += w * (z < 1 ? 1 - z : 0);
                g = z < 1 ? -beta : 0;  // torch's relu has gradient 0 at 0
                break;
            case PL_ROBUST:
                loss += w * (-(1 - e) * log_sigmoid(z) + e * log_sigmoid(-z)) / (1 - 2 * e);
                g = beta * (-(1 - e) * sigmoid(-z) - e * sigmoid(z)) / (1 - 2 * e);
                break;
            case PL_IPO: {
                const double u = (pc - rc) / (double)nc - (pr - rr) / (double)nr - 1 / (2 * beta);
                loss += w * u * u;
                gc += w * 2 * u / (double)nc;
                gr -= w * 2 * u / (double)nr;
                break;
            }
            case PL_SIMPO: {  // on the mean token log-likelihoods
                const double u = beta * (pc / (double)nc - pr / (double)nr) - pl->gamma, gu = -sigmoid(-u);
                loss += w * -log_sigmoid(u);
                gc += w * beta * gu / (double)nc;
                gr -= w * beta * gu / (double)nr;
                break;
            }
            case PL_SFT:  // the chosen rows' token mean over the step, not a pair mean
                st->sft_nll += w * nll[c];
                if (train) row_scale[c] += (float)(w * sft_scale);
                break;
            }
            gc += w * g;
            gr -= w * g;
        }
        st->loss += loss;
        // TRL's figures: beta (p - ref); without a reference (CPOTrainer) beta times the mean token
        // log-likelihood, and logps/* are those means
        const double lc = pl->ref_free ? pc / (double)nc : pc, lr = pl->ref_free ? pr / (double)nr : pr;
        const double rw_c = beta * (lc - rc), rw_r = beta * (lr - rr);
        st->reward_c += rw_c, st->reward_r += rw_r, st->correct += rw_c > rw_r, st->margin += rw_c - rw_r;
        st->logp_c += lc, st->logp_r += lr;
        st->pairs++, st->chosen_tokens += nc;
        // A row's summed token loss is -p: its scale is -d(loss)/dp.
        if (train) row_scale[c] += (float)(-gc * scale), row_scale[r] += (float)(-gr * scale);
    }
    if (train) model_backward_rows(m, B, Tm, row_scale);
    free(nll);
    free(row_scale);
}

void pref_stats_reduce(PrefStats *st, Comm *c) {
    double v[10] = {st->loss, st->reward_c, st->reward_r, st->correct, st->margin, st->logp_c, st->logp_r,
                    st->sft_nll, (double)st->pairs, (double)st->chosen_tokens};
    c->all_reduce_sum_f64(c, v, 10);
    st->loss = v[0], st->reward_c = v[1], st->reward_r = v[2], st->correct = v[3], st->margin = v[4];
    st->logp_c = v[5], st->logp_r = v[6], st->sft_nll = v[7];
    st->pairs = (long long)v[8], st->chosen_tokens = (long long)v[9];
}

double pref_stats_loss(const PrefStats *st) {
    double l = st->pairs ? st->loss / (double)st->pairs : 0;
    if (st->chosen_tokens) l += st->sft_nll / (double)st->chosen_tokens;
    return l;
}
