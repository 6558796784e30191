// opprof.c: per-op time of each training step (see opprof.h).
//
// Each timed entry calls the backend's own function and adds the wall time to its op; an op
// that calls another through the table counts once, as the outer op. Each step's totals are
// kept, and the report takes every op's median over the steps: a neighbour's burst on a shared
// machine lengthens a few steps, not the median.
//
// Each call's fastest: a step makes the same calls in the same order every time, so call k of
// one step is call k of every other; each call's lowest time over the counted steps, summed,
// is the step with every op at its quietest moment. That is the like-for-like figure to set
// against dev/sgemm_roofline.c, which sums each product's fastest of several runs: on a host
// whose load comes and goes within a second (two roofline runs back to back 141 and 267 ms,
// Intel kind, 2026-12-03) a whole step's time against a sum of per-shape minima compares a
// loaded step with an unloaded one.
#include "opprof.h"
#include <stdlib.h>
#include <string.h>
#include "util.h"

#define OPS(X)                                                                                        \
    X(matmul) X(matmul_dw) X(matmul_many) X(attention_fwd) X(attention_bwd) X(classifier_ce)           \
    X(rmsnorm_fwd) X(rmsnorm_bwd) X(layernorm_fwd) X(layernorm_bwd) X(swiglu_fwd) X(swiglu_bwd)        \
    X(geglu_fwd) X(geglu_bwd) X(gelu_fwd) X(gelu_bwd) X(rope_fwd) X(rope_bwd) X(embedding_fwd)         \
    X(embedding_bwd) X(pos_fwd) X(pos_bwd) X(add_bias) X(bias_grad) X(add) X(accumulate) X(accumulate_f32) X(dropout) X(scale)    \
    X(sumsq_many) X(sum_f32) X(adamw) X(adamw8) X(dequantize) X(memzero) X(copy_h2d) X(copy_d2h) X(copy_d2d)      \
    X(copy_2d) X(upload_act) X(download_act)

enum {
#define OP_ENUM(n) OP_##n,
    OPS(OP_ENUM)
#undef OP_ENUM
    NOPS
};
static const char *const op_name[NOPS] = {
#define OP_NAME(n) #n,
    OPS(OP_NAME)
#undef OP_NAME
};

typedef struct {
    double ms[NOPS], flop[NOPS];
    int calls[NOPS];
    double step_ms;
} StepTimes;

static Backend orig;  // the entries before timing
static int depth;     // > 0 inside a timed op
static int active;    // between opprof_step_begin and opprof_step_end
static StepTimes cur, *steps;
static int nsteps, capsteps;

// Per-call fastest over the steps from FAST_FROM on (the first steps touch fresh memory):
// fast[k] the k-th call of a step (its op and lowest time), seq the current step's calls.
#define FAST_FROM 2
typedef struct { int op; double ms; } Call;
static Call *seq, *fast;
static int nseq, capseq, nfast, fast_steps, fast_broken;
static double fast_between = -1;  // the lowest of (step less its ops) over the same steps

static void seq_add(int op, double ms) {
    if (nseq == capseq) {
        capseq = capseq ? 2 * capseq : 256;
        Call *p = realloc(seq, sizeof *seq * (size_t)capseq);
        if (!p) fail("out of memory keeping the op profile's calls (%d)", nseq + 1);
        seq = p;
    }
    seq[nseq++] = (Call){op, ms};
}

// Fold the step's calls into each call's fastest; a step whose calls differ from the first
// counted step's (another count or another op at some place) ends the per-call figures.
static void fast_fold(double step_ms, double ops_ms) {
    if (fast_broken || nsteps < FAST_FROM) return;
    if (!fast_steps) {
        fast = xmalloc(sizeof *fast * (size_t)(nseq ? nseq : 1));
        memcpy(fast, seq, sizeof *seq * (size_t)nseq);
        nfast = nseq;
    } else {
        if (nseq != nfast) { fast_broken = 1; return; }
        for (int k = 0; k < nseq; k++)
            if (seq[k].op != fast[k].op) { fast_broken = 1; return; }
        for (int k = 0; k < nseq; k++)
            if (seq[k].ms < fast[k].ms) fast[k].ms = seq[k].ms;
    }
    const double between = step_ms - ops_ms > 0 ? step_ms - ops_ms : 0;
    if (fast_between < 0 || between < fast_between) fast_between = between;
    fast_steps++;
}

static double op_begin(void) { return depth++ ? 0 : now_ms(); }

static void op_end(Backend *bk, int op, double t0, double flop) {
    if (--depth || !active) return;
    orig.sync(bk);  // a queued op has finished
    const double ms = now_ms() - t0;
    cur.ms[op] += ms;
    seq_add(op, ms);
    cur.flop[op] += flop;
    cur.calls[op]++;
}

// A timed entry: `params` the entry's parameters (the first always Backend *bk), `args` the
// call's arguments, `flop` the floating-point operations the op counts (0: not counted).
#define TIMED(op, flop, params, args)                 \
    static void t_##op params {                       \
        const double t0 = op_begin();                 \
        orig.op args;                                 \
        op_end(bk, OP_##op, t0, (double)(flop));      \
    }
#define TIMED_SUM(op, params, args)                   \
    static double t_##op params {                     \
        const double t0 = op_begin();                 \
        const double s = orig.op args;                \
        op_end(bk, OP_##op, t0, 0);                   \
        return s;                                     \
    }

TIMED(matmul, 2.0 * M * N * K,
      (Backend *bk, void *C, const void *A, const void *B, int M, int N, int K, int ta, int tb, float alpha, float beta),
      (bk, C, A, B, M, N, K, ta, tb, alpha, beta))
TIMED(matmul_dw, 2.0 * M * N * K,
      (Backend *bk, float *dW, const void *A, const void *B, int M, int N, int K, int ta, int tb, float alpha),
      (bk, dW, A, B, M, N, K, ta, tb, alpha))
static double jobs_flop(const Matmul *j, int n) {
    double f = 0;
    for (int i = 0; i < n; i++) f += 2.0 * j[i].M * j[i].N * j[i].K;
    return f;
}
TIMED(matmul_many, jobs_flop(jobs, n), (Backend *bk, const Matmul *jobs, int n), (bk, jobs, n))
TIMED(attention_fwd, 0,
      (Backend *bk, void *out, float *lse, const void *q, const void *k, const void *v, int B, int T, int q0, int nq,
       int Hq, int Hkv, int D, int window, const int32_t *ds, float scale, float softcap),
      (bk, out, lse, q, k, v, B, T, q0, nq, Hq, Hkv, D, window, ds, scale, softcap))
TIMED(attention_bwd, 0,
      (Backend *bk, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k, const void *v,
       const void *out, const float *lse, int B, int T, int q0, int nq, int Hq, int Hkv, int D, int window,
       const int32_t *ds, int accumulate, float *dk32, float *dv32, float scale, float softcap),
      (bk, dq, dk, dv, dout, q, k, v, out, lse, B, T, q0, nq, Hq, Hkv, D, window, ds, accumulate, dk32, dv32, scale,
       softcap))
TIMED(classifier_ce, 2.0 * N * V * C * (dx ? 2 : 1) + (dW ? 2.0 * N * V * C : 0),
      (Backend *bk, float *losses, void *dx, float *dW, const void *x, const void *W, const int32_t *targets, int N,
       int V, int C, float scale, float softcap),
      (bk, losses, dx, dW, x, W, targets, N, V, C, scale, softcap))
TIMED(rmsnorm_fwd, 0,
      (Backend *bk, void *out, float *rstd, const void *x, const void *w, float w_add, int N, int C, float eps),
      (bk, out, rstd, x, w, w_add, N, C, eps))
TIMED(rmsnorm_bwd, 0,
      (Backend *bk, void *dx, float *dw, const void *dout, const void *x, const void *w, float w_add,
       const float *rstd, int N, int C),
      (bk, dx, dw, dout, x, w, w_add, rstd, N, C))
TIMED(layernorm_fwd, 0,
      (Backend *bk, void *out, float *mean, float *rstd, const void *x, const void *w, const void *b, int N, int C,
       float eps),
      (bk, out, mean, rstd, x, w, b, N, C, eps))
TIMED(layernorm_bwd, 0,
      (Backend *bk, void *dx, float *dw, float *db, const void *dout, const void *x, const void *w, const float *mean,
       const float *rstd, int N, int C),
      (bk, dx, dw, db, dout, x, w, mean, rstd, N, C))
TIMED(swiglu_fwd, 0, (Backend *bk, void *h, const void *gate, const void *up, size_t n), (bk, h, gate, up, n))
TIMED(swiglu_bwd, 0, (Backend *bk, void *dgate, void *dup, const void *dh, const void *gate, const void *up, size_t n),
      (bk, dgate, dup, dh, gate, up, n))
TIMED(geglu_fwd, 0, (Backend *bk, void *h, const void *gate, const void *up, size_t n, int exact),
      (bk, h, gate, up, n, exact))
TIMED(geglu_bwd, 0,
      (Backend *bk, void *dgate, void *dup, const void *dh, const void *gate, const void *up, size_t n, int exact),
      (bk, dgate, dup, dh, gate, up, n, exact))
TIMED(gelu_fwd, 0, (Backend *bk, void *y, const void *x, size_t n), (bk, y, x, n))
TIMED(gelu_bwd, 0, (Backend *bk, void *dx, const void *dout, const void *x, size_t n), (bk, dx, dout, x, n))
TIMED(rope_fwd, 0,
      (Backend *bk, void *x, const float *c, const float *s, const int32_t *pos, int B, int T, int H, int D, int rot),
      (bk, x, c, s, pos, B, T, H, D, rot))
TIMED(rope_bwd, 0,
      (Backend *bk, void *dx, const float *c, const float *s, const int32_t *pos, int B, int T, int H, int D,
       int rot),
      (bk, dx, c, s, pos, B, T, H, D, rot))
TIMED(embedding_fwd, 0, (Backend *bk, void *out, const int32_t *tokens, const void *table, int N, int C),
      (bk, out, tokens, table, N, C))
TIMED(embedding_bwd, 0, (Backend *bk, float *dtable, const void *dout, const int32_t *tokens, int N, int C, int V),
      (bk, dtable, dout, tokens, N, C, V))
TIMED(pos_fwd, 0, (Backend *bk, void *out, const void *wpe, int B, int T, int C), (bk, out, wpe, B, T, C))
TIMED(pos_bwd, 0, (Backend *bk, float *dwpe, const void *dout, int B, int T, int C), (bk, dwpe, dout, B, T, C))
TIMED(add_bias, 0, (Backend *bk, void *y, const void *bias, int N, int D), (bk, y, bias, N, D))
TIMED(bias_grad, 0, (Backend *bk, float *db, const void *dy, int N, int D), (bk, db, dy, N, D))
TIMED(add, 0, (Backend *bk, void *y, const void *a, const void *b, size_t n), (bk, y, a, b, n))
TIMED(accumulate, 0, (Backend *bk, void *y, const void *x, size_t n), (bk, y, x, n))
TIMED(accumulate_f32, 0, (Backend *bk, float *y, const float *x, size_t n), (bk, y, x, n))
TIMED(dropout, 0, (Backend *bk, void *y, const void *x, size_t n, float p, uint64_t seed, size_t first),
      (bk, y, x, n, p, seed, first))
TIMED(scale, 0, (Backend *bk, void *y, float s, size_t n), (bk, y, s, n))
TIMED(sumsq_many, 0, (Backend *bk, const float *const *x, const size_t *n, int count, double *each),
      (bk, x, n, count, each))
TIMED_SUM(sum_f32, (Backend *bk, const float *x, size_t n), (bk, x, n))
TIMED(adamw, 0,
      (Backend *bk, void *p, float *master, const float *g, float *m, float *v, size_t n, float lr, float b1, float b2,
       float eps, float wd, float gs, int t),
      (bk, p, master, g, m, v, n, lr, b1, b2, eps, wd, gs, t))
TIMED(adamw8, 0,
      (Backend *bk, void *p, float *master, const float *g, uint8_t *qm, uint8_t *qv, float *am, float *av,
       const float *maps, size_t n, float lr, float b1, float b2, float eps, float wd, float gs, int t, int ta),
      (bk, p, master, g, qm, qv, am, av, maps, n, lr, b1, b2, eps, wd, gs, t, ta))
TIMED(dequantize, 0, (Backend *bk, void *out, const void *region, size_t n, int format), (bk, out, region, n, format))
TIMED(memzero, 0, (Backend *bk, void *dst, size_t bytes, Queue *q), (bk, dst, bytes, q))
TIMED(copy_h2d, 0, (Backend *bk, void *dst, const void *src, size_t bytes, Queue *q), (bk, dst, src, bytes, q))
TIMED(copy_d2h, 0, (Backend *bk, void *dst, const void *src, size_t bytes, Queue *q), (bk, dst, src, bytes, q))
TIMED(copy_d2d, 0, (Backend *bk, void *dst, const void *src, size_t bytes, Queue *q), (bk, dst, src, bytes, q))
TIMED(copy_2d, 0,
      (Backend *bk, void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows, Queue *q),
      (bk, dst, dpitch, src, spitch, width, rows, q))
TIMED(upload_act, 0, (Backend *bk, void *dst, const float *src, size_t n), (bk, dst, src, n))
TIMED(download_act, 0, (Backend *bk, float *dst, const void *src, size_t n), (bk, dst, src, n))

void opprof_install(Backend *bk) {
    orig = *bk;
#define OP_INSTALL(n) \
    if (bk->n) bk->n = t_##n;
    OPS(OP_INSTALL)
#undef OP_INSTALL
}

void opprof_step_begin(void) {
    memset(&cur, 0, sizeof cur);
    nseq = 0;
    active = 1;
}

void opprof_step_end(double step_ms) {
    active = 0;
    cur.step_ms = step_ms;
    double ops = 0;
    for (int op = 0; op < NOPS; op++) ops += cur.ms[op];
    fast_fold(step_ms, ops);
    if (nsteps == capsteps) {
        capsteps = capsteps ? 2 * capsteps : 64;
        StepTimes *p = realloc(steps, sizeof *steps * (size_t)capsteps);
        if (!p) fail("out of memory keeping the op profile of %d steps", nsteps + 1);
        steps = p;
    }
    steps[nsteps++] = cur;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The median of v[0..n), sorted in place.
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Each call's fastest (see the top): the step's sum, and the same by op, largest first.
static void fast_report(FILE *f) {
    if (fast_broken) {
        fprintf(f, "\neach call's fastest: not given (the steps made different calls)\n");
        return;
    }
    if (fast_steps < 2) return;  // one step's calls are not a fastest of anything
    double ms[NOPS] = {0}, total = fast_between;
    for (int k = 0; k < nfast; k++) ms[fast[k].op] += fast[k].ms, total += fast[k].ms;
    fprintf(f, "\neach call's fastest over steps %d-%d (%d; %d calls a step): %.1f ms a step (every call at its "
               "lowest time, summed, with the lowest time between the ops, %.2f ms): the figure to set against a sum "
               "of each product's fastest (dev/sgemm_roofline.c)\nfastest ms/step by op:",
            FAST_FROM + 1, FAST_FROM + fast_steps, fast_steps, nfast, total, fast_between);
    int done[NOPS] = {0};
    for (;;) {  // largest first
        int best = -1;
        for (int op = 0; op < NOPS; op++)
            if (!done[op] && ms[op] > 0 && (best < 0 || ms[op] > ms[best])) best = op;
        if (best < 0) break;
        done[best] = 1;
        fprintf(f, " %s %.2f", op_name[best], ms[best]);
    }
    fprintf(f, "\n");
}

void opprof_report(FILE *f) {
    if (!nsteps) return;
    // The first steps touch fresh memory (page faults, cold caches): left out when there are more.
    const int skip = nsteps >= 4 ? 2 : 0, n = nsteps - skip;
    const StepTimes *s = steps + skip;
    double *v = xmalloc(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) v[i] = s[i].step_ms;
    const double step = median(v, n);
    double ms[NOPS], gf[NOPS], ncalls[NOPS], sum = 0;
    int order[NOPS], k = 0;
    for (int op = 0; op < NOPS; op++) {
        for (int i = 0; i < n; i++) v[i] = s[i].calls[op];
        ncalls[op] = median(v, n);
        double fl = 0, t = 0;
        for (int i = 0; i < n; i++) v[i] = s[i].ms[op], fl += s[i].flop[op], t += s[i].ms[op];
        ms[op] = median(v, n);
        gf[op] = fl > 0 && t > 0 ? fl / (t * 1e6) : 0;  // over all the counted steps
        if (ncalls[op] > 0 || ms[op] > 0) {
            int j = k++;  // insertion, largest time first
            for (; j > 0 && ms[order[j - 1]] < ms[op]; j--) order[j] = order[j - 1];
            order[j] = op;
            sum += ms[op];
        }
    }
    free(v);
    fprintf(f, "\nop profile (--profile): each op's time in a step, the median over steps %d-%d (%d); "
               "step median %.1f ms\n\n", skip + 1, nsteps, n, step);
    fprintf(f, "| op | calls/step | ms/step | %% of step | GFLOP/s |\n|---|---:|---:|---:|---:|\n");
    for (int i = 0; i < k; i++) {
        const int op = order[i];
        char g[32] = "";
        if (gf[op] > 0) snprintf(g, sizeof g, "%.1f", gf[op]);
        fprintf(f, "| %s | %g | %.2f | %.1f%% | %s |\n", op_name[op], ncalls[op], ms[op], step > 0 ? 100 * ms[op] / step : 0, g);
    }
    // Medians do not add: near zero (either side) means the ops are the whole step.
    fprintf(f, "| (the rest: the step's median less the ops' medians: host work between the ops) | | %.2f | %.1f%% | |\n",
            step - sum,
            step > 0 ? 100 * (step - sum) / step : 0);
    fast_report(f);
}
