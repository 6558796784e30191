// preference.c: see preference.h.
#include "preference.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util.h"

static const char *const LOSS_NAMES[] = {"sigmoid", "hinge", "ipo", "robust", "sft", "simpo", "orpo", "kto"};
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
    pl->orpo = !strcmp(cfg->rl, "orpo");
    pl->kto = !strcmp(cfg->rl, "kto");
    pl->w_des = cfg->kto_desirable_weight, pl->w_und = cfg->kto_undesirable_weight;
    pl->ref_free = !strcmp(cfg->rl, "simpo") || pl->orpo;
    if (!strcmp(cfg->rl, "reward")) {  // its own loss; the dpo_* keys are rl's (config.c notes them)
        pl->reward = pl->ref_free = 1;
        pl->center = cfg->center_rewards_coefficient;
        return;
    }
    const char *s = cfg->dpo_loss_type[0] ? cfg->dpo_loss_type : "sigmoid";
    char item[64];
    while (next_item(&s, item, sizeof item)) {
        if (pl->n == PREF_MAX_LOSSES) fail("dpo_loss_type: more than %d loss types", PREF_MAX_LOSSES);
        int k = -1;
        for (int i = 0; i < (int)(sizeof LOSS_NAMES / sizeof *LOSS_NAMES); i++)
            if (!strcmp(item, LOSS_NAMES[i])) k = i;
        if (k == PL_SIMPO && (!pl->ref_free || pl->orpo)) k = -1;  // TRL's DPOTrainer has no simpo loss (rl: simpo is the CPOTrainer)
        if (k == PL_ORPO && !pl->orpo) k = -1;  // nor an orpo one (rl: orpo is the ORPOTrainer)
        if (k == PL_KTO && !pl->kto) k = -1;    // nor kto (the KTOTrainer's, with its own rows)
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

// The first target of a row (its completion's start), T when it has none.
static int first_target(const int32_t *tgt, int T) {
    int t = 0;
    while (t < T && tgt[t] < 0) t++;
    return t;
}

// log(1 - e^x) for x < 0, as TRL's log1mexp computes it (the two forms either side of -ln 2).
static double log1mexp(double x) { return x < -0.693 ? log1p(-exp(x)) : log(-expm1(x)); }

const int32_t *pref_model_targets(const PrefLoss *pl, const int32_t *tok, const int32_t *tgt, int32_t *out,
                                  size_t rows, int T) {
    if (!pl->orpo) return tgt;
    memcpy(out, tgt, sizeof(int32_t) * rows * (size_t)T);
    for (size_t r = 0; r < rows; r++) {
        const int32_t *k = tok + r * T;
        const int s = first_target(tgt + r * T, T);
        if (s == T) continue;  // an empty row
        for (int t = 0; t < s; t++) out[r * T + t] = k[t + 1];  // TRL's nll: every token of the sequence
    }
    return out;
}

int32_t *pref_read_labels(const char *path, size_t n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail("%s: cannot open (rl: kto's labels; prepare the data again): %s", path, strerror(errno));
    int32_t head[256];
    if (fread(head, sizeof head, 1, f) != 1 || head[0] != 20241202 || head[1] != 1)
        fail("%s: not a labels file (magic 20241202, version 1)", path);
    if (head[2] < 0 || (size_t)head[2] != n)
        fail("%s: %d labels for %zu examples in the rows file (prepare the data again)", path, head[2], n);
    int32_t *lab = xmalloc(sizeof(int32_t) * (n ? n : 1));
    if (fread(lab, sizeof(int32_t), n, f) != n || fgetc(f) != EOF) fail("%s: not %zu labels long", path, n);
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (lab[i] != 0 && lab[i] != 1) fail("%s: label %zu is %d (expected 0 or 1)", path, i, lab[i]);
    return lab;
}

// rl: kto's unit (preference.h): the KL estimate from the KL rows, averaged over the ranks (each
// calls this for every micro-batch, empty or not), then each example's loss and gradient scale.
static void kto_unit(Model *m, const PrefLoss *pl, int B, const double *nll, const size_t *ids, const double *ref,
                     const int32_t *labels, size_t nref, int train, double unit_weight, float *row_scale,
                     PrefStats *st) {
    double v[2] = {0, 0};  // this rank's mean KL estimate, and 1 when it has examples
    long long n = 0;
    for (int i = 0; i < B / 2; i++)
        if (ids[2 * i] < nref) v[0] += -nll[2 * i + 1] - ref[ids[2 * i + 1]], n++;
    if (n) v[0] /= (double)n, v[1] = 1;
    Comm *c = m->opt.comm;
    c->all_reduce_sum_f64(c, v, 2);  // TRL gathers each process's mean and averages them
    const double kl = v[1] > 0 && v[0] > 0 ? v[0] / v[1] : 0, beta = pl->beta;
    if (!n) return;
    double loss = 0;
    for (int i = 0; i < B / 2; i++) {
        const int r = 2 * i;
        if (ids[r] >= nref) continue;
        const double p = -nll[r], lr = p - ref[ids[r]];
        double g;  // d(loss)/dp; kl carries no gradient
        if (labels[ids[r] / 2]) {
            const double sg = sigmoid(beta * (lr - kl));
            loss += pl->w_des * (1 - sg);
            g = -pl->w_des * beta * sg * (1 - sg);
            st->reward_c += beta * lr, st->logp_c += p, st->n_chosen++;
        } else {
            const double sg = sigmoid(beta * (kl - lr));
            loss += pl->w_und * (1 - sg);
            g = pl->w_und * beta * sg * (1 - sg);
            st->reward_r += beta * lr, st->logp_r += p, st->n_rejected++;
        }
        if (train) row_scale[r] = (float)(-g * unit_weight / (double)n);  // the KL row's stays 0
        st->pairs++;
    }
    st->loss += loss / (double)n, st->kl += kl;
    st->units++;
}

// reward_model's unit: each row's score where its one target is (positions t0 .. t0+Tm-1 here;
// sequence parallel ranks add their slices' scores, each row's position in one of them), then
// the pairs' Bradley-Terry loss, TRL's mean over the unit's pairs.
static void reward_unit(Model *m, const PrefLoss *pl, int B, int T, int Tm, int t0, const int32_t *tgt,
                        const size_t *ids, size_t nref, int train, double unit_weight, PrefStats *st) {
    int *pos = xmalloc(sizeof(int) * (size_t)B);
    double *score = xmalloc(sizeof(double) * (size_t)B);
    float *dscore = xcalloc((size_t)B, sizeof(float));
    for (int b = 0; b < B; b++) {
        const int p = first_target(tgt + (size_t)b * T, T);
        pos[b] = p < T && p >= t0 && p < t0 + Tm ? p - t0 : -1;
    }
    model_forward_scores(m, B, Tm, train, pos, score);
    if (Tm < T) m->opt.comm->all_reduce_sum_f64(m->opt.comm, score, (size_t)B);
    long long np = 0;
    for (int i = 0; i < B / 2; i++) np += ids[2 * i] < nref;
    double loss = 0;
    for (int i = 0; i < B / 2 && np; i++) {
        const int c = 2 * i, r = 2 * i + 1;
        if (ids[c] >= nref) continue;  // an empty pair (the epoch's last step)
        const double rc = score[c], rr = score[r], z = rc - rr, s = rc + rr;
        loss += -log_sigmoid(z) + pl->center * s * s;
        const double g = -sigmoid(-z), gs = 2 * pl->center * s, w = unit_weight / (double)np;
        dscore[c] = (float)((g + gs) * w), dscore[r] = (float)((-g + gs) * w);
        st->reward_c += rc, st->reward_r += rr, st->correct += rc > rr, st->margin += z;
        const double lo = rc < rr ? rc : rr, hi = rc < rr ? rr : rc;
        st->reward_min = !st->pairs || lo < st->reward_min ? lo : st->reward_min;
        st->reward_max = !st->pairs || hi > st->reward_max ? hi : st->reward_max;
        st->pairs++, st->n_chosen++, st->n_rejected++;
    }
    if (np) st->loss += loss / (double)np, st->units++;
    if (train) model_backward_scores(m, B, Tm, pos, dscore);
    free(pos);
    free(score);
    free(dscore);
}

void pref_micro_batch(Model *m, const PrefLoss *pl, int B, int T, int Tm, int t0, const int32_t *tgt,
                      const size_t *ids, const double *ref, const int32_t *labels, size_t nref, int train,
                      double unit_weight, PrefStats *st) {
    if (pl->reward) {
        reward_unit(m, pl, B, T, Tm, t0, tgt, ids, nref, train, unit_weight, st);
        return;
    }
    double *nll = xmalloc(sizeof(double) * 2 * (size_t)B), *head = nll + B;  // each row's summed token loss
    float *row_scale = xcalloc(2 * (size_t)B, sizeof(float)), *head_scale = row_scale + B;
    int *split = NULL;
    if (pl->orpo) {  // the prompt's tokens apart: the model holds positions t0 .. t0+Tm-1 of each row
        split = xmalloc(sizeof(int) * (size_t)B);
        for (int b = 0; b < B; b++) {
            const int s = first_target(tgt + (size_t)b * T, T) - t0;
            split[b] = s < 0 ? 0 : s > Tm ? Tm : s;
        }
    }
    model_forward_rows(m, B, Tm, train, split, nll, head);
    if (Tm < T) {  // sequence parallel: each rank summed its slice of every row
        Comm *c = m->opt.comm;
        c->all_reduce_sum_f64(c, nll, (size_t)(split ? 2 * B : B));
    }
    if (pl->kto) {
        kto_unit(m, pl, B, nll, ids, ref, labels, nref, train, unit_weight, row_scale, st);
        if (train) model_backward_rows(m, B, Tm, row_scale, NULL, NULL);
        free(nll);
        free(row_scale);
        return;
    }
    // The unit's sizes: its pairs, and its chosen rows' targets (sft: completion tokens; orpo's
    // nll: every token but the first).
    long long np = 0, nchosen = 0;
    for (int i = 0; i < B / 2; i++)
        if (ids[2 * i] < nref) {
            const int32_t *tc = tgt + (size_t)2 * i * T;
            np++;
            nchosen += targets_in(tc, T) + (pl->orpo ? first_target(tc, T) : 0);
        }
    if (np) {
        const double beta = pl->beta, e = pl->smoothing, wp = unit_weight / (double)np;
        const double wt = unit_weight / (double)nchosen;
        double loss = 0;  // the unit's pair losses, summed; its token means added after
        for (int i = 0; i < B / 2; i++) {
            const int c = 2 * i, r = 2 * i + 1;
            if (ids[c] >= nref) continue;  // an empty pair (the epoch's last step)
            const double pc = -nll[c], pr = -nll[r];
            const double rc = pl->ref_free ? 0 : ref[ids[c]], rr = pl->ref_free ? 0 : ref[ids[r]];
            const long long nc = targets_in(tgt + (size_t)c * T, T), nr = targets_in(tgt + (size_t)r * T, T);
            const double d = (pc - rc) - (pr - rr), z = beta * d;
            const double lc = pl->ref_free ? pc / (double)nc : pc, lr = pl->ref_free ? pr / (double)nr : pr;
            double gc = 0, gr = 0;  // d(pair losses)/d(pc), d(pair losses)/d(pr)
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
                    const double u = beta * (lc - lr) - pl->gamma, gu = -sigmoid(-u);
                    loss += w * -log_sigmoid(u);
                    gc += w * beta * gu / (double)nc;
                    gr -= w * beta * gu / (double)nr;
                    break;
                }
                case PL_ORPO: {  // -beta log sigmoid(log odds ratio); the nll term is a token mean, below
                    const double lo = (lc - lr) - (log1mexp(lc) - log1mexp(lr)), gl = -beta * sigmoid(-lo);
                    loss += w * -beta * log_sigmoid(lo);
                    gc += w * gl / (1 - exp(lc)) / (double)nc;  // d lo / d lc = 1 / (1 - e^lc)
                    gr -= w * gl / (1 - exp(lr)) / (double)nr;
                    st->log_odds_ratio += log_sigmoid(lo), st->log_odds_chosen += lo;
                    break;
                }
                case PL_SFT:  // the chosen rows' token mean over the unit, not a pair mean
                    st->loss += w * nll[c] / (double)nchosen;
                    if (train) row_scale[c] += (float)(w * wt);
                    break;
                }
                gc += w * g;
                gr -= w * g;
            }
            if (pl->orpo) {  // the nll: every token of the chosen row, prompt included
                const double v = (nll[c] + head[c]) / (double)nchosen;
                st->loss += v, st->nll += v;
                if (train) row_scale[c] += (float)wt, head_scale[c] += (float)wt;
            }
            // TRL's figures: beta (p - ref); without a reference (CPO and ORPO) beta times the
            // mean token log-likelihood, and logps/* are those means
            const double rw_c = beta * (lc - rc), rw_r = beta * (lr - rr);
            st->reward_c += rw_c, st->reward_r += rw_r, st->correct += rw_c > rw_r, st->margin += rw_c - rw_r;
            st->logp_c += lc, st->logp_r += lr;
            st->pairs++, st->n_chosen++, st->n_rejected++;
            // A row's summed token loss is -p: its scale is -d(loss)/dp.
            if (train) row_scale[c] += (float)(-gc * wp), row_scale[r] += (float)(-gr * wp);
        }
        st->loss += loss / (double)np;
        st->units++;
    }
    if (train) model_backward_rows(m, B, Tm, row_scale, split, head_scale);
    free(nll);
    free(row_scale);
    free(split);
}

void pref_stats_reduce(PrefStats *st, Comm *c) {
    // The extremes: each rank's in its own slots (NaN without pairs), the others' adding 0.
    double *mm = xcalloc(2 * (size_t)c->world, sizeof(double));
    mm[2 * c->rank] = st->pairs ? st->reward_min : NAN, mm[2 * c->rank + 1] = st->pairs ? st->reward_max : NAN;
    c->all_reduce_sum_f64(c, mm, 2 * (size_t)c->world);
    st->reward_min = INFINITY, st->reward_max = -INFINITY;
    for (int r = 0; r < c->world; r++) {
        if (mm[2 * r] < st->reward_min) st->reward_min = mm[2 * r];  // NaN compares false
        if (mm[2 * r + 1] > st->reward_max) st->reward_max = mm[2 * r + 1];
    }
    free(mm);
    double v[15] = {st->loss, st->nll, st->kl, st->reward_c, st->reward_r, st->correct, st->margin, st->logp_c,
                    st->logp_r, st->log_odds_ratio, st->log_odds_chosen, (double)st->pairs, (double)st->units,
                    (double)st->n_chosen, (double)st->n_rejected};
    c->all_reduce_sum_f64(c, v, 15);
    st->loss = v[0], st->nll = v[1], st->kl = v[2], st->reward_c = v[3], st->reward_r = v[4], st->correct = v[5];
    st->margin = v[6], st->logp_c = v[7], st->logp_r = v[8], st->log_odds_ratio = v[9], st->log_odds_chosen = v[10];
    st->pairs = (long long)v[11], st->units = (long long)v[12];
    st->n_chosen = (long long)v[13], st->n_rejected = (long long)v[14];
}

double pref_stats_loss(const PrefStats *st) { return st->units ? st->loss / (double)st->units : 0; }
