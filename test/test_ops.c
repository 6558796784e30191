// test_ops.c: every CPU kernel against an independent reference.
//
// Backwards are checked in double (the _f64 instantiation of kernels.inc) against central finite
// differences of L = sum(Y * Wt) for a fixed random Wt, the analytic gradient coming from the
// backward kernel with dY = Wt. Forwards are checked against naive formulas written here, and
// the float kernels (what training runs) against the double ones. Finite differences evaluate L
// in long double, so only the rounding of the perturbed outputs themselves limits them.
//
// Error measure: max over elements of |a - n| / max(1e-6, |a| + |n|) ("max rel err"), except
// where a result carries float rounding (f32 kernels vs f64, AdamW's float arithmetic, attention
// against the exact gradient given its float lse), which use the normwise max |a - n| / max |n|
// per tensor ("max err / max|ref|"): float rounding of a cancelling, near-zero element would
// otherwise dominate. One line per check, "N passed, M failed" last, exit 1 on any failure.
// Sizes are small: the whole run takes a few seconds (under AddressSanitizer too).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include "cpu/kernels.h"
#include "model.h"
#include "optim.h"
#include "util.h"

static int n_pass, n_fail;
static Rng rng;

// ---- reporting ---------------------------------------------------------------------------

// Running maximum of an error, remembering the worst element; NaN sticks.
typedef struct {
    double err;
    size_t idx;
    double got, want;
    const char *what;  // which tensor the worst element belongs to
} Cmp;

static double relerr(double a, double n) {
    double d = fabs(a) + fabs(n);
    return fabs(a - n) / (d > 1e-6 ? d : 1e-6);
}

static void cmp_put(Cmp *c, const char *what, size_t i, double got, double want, double e) {
    if (isnan(c->err)) return;
    if (!c->what || isnan(e) || e > c->err) {
        c->err = e;
        c->idx = i;
        c->got = got;
        c->want = want;
        c->what = what;
    }
}

static void cmp_rel(Cmp *c, const char *what, size_t i, double got, double want) {
    cmp_put(c, what, i, got, want, relerr(got, want));
}

// Element-wise relative comparison of whole arrays.
static void cmp_arrays(Cmp *c, const char *what, const double *got, const double *want, size_t n) {
    for (size_t i = 0; i < n; i++) cmp_rel(c, what, i, got[i], want[i]);
}

static void vreport(const Cmp *c, double tol, const char *measure, const char *fmt, va_list ap) {
    char name[256];
    vsnprintf(name, sizeof name, fmt, ap);
    if (c->err <= tol) {
        printf("PASS %s (%s %.1e)\n", name, measure, c->err);
        n_pass++;
    } else {
        printf("FAIL %s: %s %.3e > tol %.0e", name, measure, c->err, tol);
        if (c->what)
            printf(" at %s[%zu] (got %.17g, expected %.17g)", c->what, c->idx, c->got, c->want);
        printf("\n");
        n_fail++;
    }
    fflush(stdout);
}

static void report(const Cmp *c, double tol, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void report(const Cmp *c, double tol, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(c, tol, "max rel err", fmt, ap);
    va_end(ap);
}

static void check(int ok, const char *detail, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void check(int ok, const char *detail, const char *fmt, ...) {
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (ok) {
        printf("PASS %s\n", name);
        n_pass++;
    } else {
        printf("FAIL %s: %s\n", name, detail);
        n_fail++;
    }
    fflush(stdout);
}

// ---- helpers -----------------------------------------------------------------------------

static double *randn(size_t n, double scale) {
    double *x = xmalloc(n ? n * sizeof(double) : 1);
    for (size_t i = 0; i < n; i++) x[i] = rng_normal(&rng) * scale;
    return x;
}
static double *zeros(size_t n) { return xcalloc(n ? n : 1, sizeof(double)); }
static double *dup_arr(const double *x, size_t n) {
    double *y = xmalloc(n ? n * sizeof(double) : 1);
    memcpy(y, x, n * sizeof(double));
    return y;
}
static void fill_nan(double *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}
static float *to_f32(const double *x, size_t n) {
    float *y = xmalloc(n ? n * sizeof(float) : 1);
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}

static long double dot_wt(const double *y, const double *wt, size_t n) {
    long double s = 0;
    for (size_t i = 0; i < n; i++) s += (long double)y[i] * wt[i];
    return s;
}

// Normwise error of got against want: max |got - want| / max |want|, per tensor.
static void cmp_norm(Cmp *c, const char *what, const double *got, const double *want, size_t n) {
    double mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(want[i]));
    if (mx == 0) mx = 1;
    for (size_t i = 0; i < n; i++)
        cmp_put(c, what, i, got[i], want[i], fabs(got[i] - want[i]) / mx);
}

// Float result against double reference, normwise.
static void cmp_f32(Cmp *c, const char *what, const float *got, const double *want, size_t n) {
    double *g = xmalloc(n ? n * sizeof(double) : 1);
    for (size_t i = 0; i < n; i++) g[i] = got[i];
    cmp_norm(c, what, g, want, n);
    free(g);
}

static void report_norm(const Cmp *c, double tol, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void report_norm(const Cmp *c, double tol, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(c, tol, "max err / max|ref|", fmt, ap);
    va_end(ap);
}

// ---- finite differences ------------------------------------------------------------------

typedef long double (*LossFn)(void *ctx);

// Central difference of f with respect to *x, using the step actually representable.
// The loss runs on one thread: thousands of tiny parallel regions are slow on a busy machine,
// and the kernels under test are run on all threads elsewhere.
static double fd1(LossFn f, void *ctx, double *x, double h) {
    double x0 = *x, xp = x0 + h, xm = x0 - h;
    int nt = omp_get_max_threads();
    omp_set_num_threads(1);
    *x = xp;
    long double lp = f(ctx);
    *x = xm;
    long double lm = f(ctx);
    *x = x0;
    omp_set_num_threads(nt);
    return (double)((lp - lm) / ((long double)xp - (long double)xm));
}

// Compares grad[i] with the finite difference for every element (n <= nsample) or nsample
// random ones.
static void fd_check(Cmp *c, const char *what, const double *grad, double *x, size_t n, int nsample,
                     double h, LossFn f, void *ctx) {
    int all = n <= (size_t)nsample;
    size_t cnt = all ? n : (size_t)nsample;
    for (size_t s = 0; s < cnt; s++) {
        size_t i = all ? s : (size_t)(rng_next(&rng) % n);
        cmp_rel(c, what, i, grad[i], fd1(f, ctx, x + i, h));
    }
}

#define FD_H 1e-5
#define FD_TOL 1e-6

// Accumulating backwards: run once from zero (g0) and once from a random buffer b0 ~ N(0,1);
// the difference must be g0. Rounding of b0 + g0 leaves up to ~eps |b0| in the difference,
// hence ACC_TOL for elements of g0 near the 1e-6 floor.
#define ACC_TOL 1e-8
static void accum_cmp(Cmp *c, const char *what, const double *from_b0, const double *b0,
                      const double *g0, size_t n) {
    for (size_t i = 0; i < n; i++) cmp_rel(c, what, i, from_b0[i] - b0[i], g0[i]);
}

// ---- matmul ------------------------------------------------------------------------------

static void naive_matmul(double *C, const double *A, const double *B, int M, int N, int K, int ta,
                         int tb, double alpha, double beta) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            long double s = 0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * M + i] : A[(size_t)i * K + k];
                double b = tb ? B[(size_t)j * K + k] : B[(size_t)k * N + j];
                s += (long double)a * b;
            }
            double *cij = C + (size_t)i * N + j;
            *cij = (double)(alpha * s + (beta == 0 ? 0.0L : (long double)beta * *cij));
        }
}

static void test_matmul_fwd(void) {
    const int shapes[][3] = {{5, 7, 3}, {37, 29, 70}, {1, 13, 1}};
    const double ab[][2] = {{0.7, 0.3}, {1, 0}, {-1.3, 1}};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            Cmp c = {0};
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (size_t k = 0; k < sizeof ab / sizeof ab[0]; k++) {
                    int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                    double alpha = ab[k][0], beta = ab[k][1];
                    double *A = randn((size_t)M * K, 1), *B = randn((size_t)K * N, 1);
                    double *C = randn((size_t)M * N, 1);
                    // beta = 0 must not read C (callers pass uninitialised outputs).
                    if (beta == 0) fill_nan(C, (size_t)M * N);
                    double *ref = dup_arr(C, (size_t)M * N);
                    matmul_f64(C, A, B, M, N, K, ta, tb, alpha, beta);
                    naive_matmul(ref, A, B, M, N, K, ta, tb, alpha, beta);
                    cmp_arrays(&c, "C", C, ref, (size_t)M * N);
                    free(A), free(B), free(C), free(ref);
                }
            report(&c, 1e-12,
                   "matmul fwd ta=%d tb=%d vs naive (3 shapes; alpha/beta 0.7/0.3, 1/0 over NaN, "
                   "-1.3/1)", ta, tb);
        }
}

// Linear layer y = x W^T, x [N,I], W [O,I]; backward dx = dy W, dW += dy^T x.
typedef struct {
    int N, I, O;
    double *x, *W, *wt, *y;
} LinCtx;

static long double linear_loss(void *p) {
    LinCtx *c = p;
    matmul_f64(c->y, c->x, c->W, c->N, c->O, c->I, 0, 1, 1, 0);
    return dot_wt(c->y, c->wt, (size_t)c->N * c->O);
}

static void test_linear_bwd(void) {
    LinCtx c = {.N = 6, .I = 5, .O = 4};
    size_t nx = (size_t)c.N * c.I, nw = (size_t)c.O * c.I, ny = (size_t)c.N * c.O;
    c.x = randn(nx, 1), c.W = randn(nw, 1), c.wt = randn(ny, 1), c.y = zeros(ny);
    double *dx = randn(nx, 1), *dW = zeros(nw);
    fill_nan(dx, nx);
    matmul_f64(dx, c.wt, c.W, c.N, c.I, c.O, 0, 0, 1, 0);
    matmul_f64(dW, c.wt, c.x, c.O, c.I, c.N, 1, 0, 1, 1);
    Cmp e = {0};
    fd_check(&e, "dx", dx, c.x, nx, 200, FD_H, linear_loss, &c);
    report(&e, FD_TOL, "linear bwd dx = dy W vs finite differences");
    e = (Cmp){0};
    fd_check(&e, "dW", dW, c.W, nw, 200, FD_H, linear_loss, &c);
    report(&e, FD_TOL, "linear bwd dW = dy^T x (beta=1 from zero) vs finite differences");
    double *b0 = randn(nw, 1), *acc = dup_arr(b0, nw);
    matmul_f64(acc, c.wt, c.x, c.O, c.I, c.N, 1, 0, 1, 1);
    e = (Cmp){0};
    accum_cmp(&e, "dW", acc, b0, dW, nw);
    report(&e, ACC_TOL, "linear bwd dW accumulates with beta=1");
    free(c.x), free(c.W), free(c.wt), free(c.y), free(dx), free(dW), free(b0), free(acc);
}

// ---- small elementwise ops ---------------------------------------------------------------

typedef struct {
    int N, D;
    double *x, *bias, *wt, *y;
} BiasCtx;

static long double bias_loss(void *p) {
    BiasCtx *c = p;
    memcpy(c->y, c->x, sizeof(double) * c->N * c->D);
    add_bias_f64(c->y, c->bias, c->N, c->D);
    return dot_wt(c->y, c->wt, (size_t)c->N * c->D);
}

static void test_bias(void) {
    BiasCtx c = {.N = 7, .D = 9};
    size_t n = (size_t)c.N * c.D;
    c.x = randn(n, 1), c.bias = randn(c.D, 1), c.wt = randn(n, 1), c.y = zeros(n);
    bias_loss(&c);
    Cmp e = {0};
    for (int i = 0; i < c.N; i++)
        for (int d = 0; d < c.D; d++)
            cmp_rel(&e, "y", (size_t)i * c.D + d, c.y[i * c.D + d], c.x[i * c.D + d] + c.bias[d]);
    report(&e, 1e-15, "add_bias fwd vs x + bias");
    double *db = zeros(c.D);
    bias_grad_f64(db, c.wt, c.N, c.D);
    e = (Cmp){0};
    fd_check(&e, "dbias", db, c.bias, c.D, 200, FD_H, bias_loss, &c);
    report(&e, FD_TOL, "bias_grad vs finite differences");
    double *b0 = randn(c.D, 1), *acc = dup_arr(b0, c.D);
    bias_grad_f64(acc, c.wt, c.N, c.D);
    e = (Cmp){0};
    accum_cmp(&e, "dbias", acc, b0, db, c.D);
    report(&e, ACC_TOL, "bias_grad accumulates");
    free(c.x), free(c.bias), free(c.wt), free(c.y), free(db), free(b0), free(acc);
}

static void test_add_accumulate_scale(void) {
    size_t n = 1003;
    double *a = randn(n, 1), *b = randn(n, 1), *y = randn(n, 1), *y0 = dup_arr(y, n);
    Cmp e = {0};
    add_f64(y, a, b, n);
    for (size_t i = 0; i < n; i++) cmp_rel(&e, "add", i, y[i], a[i] + b[i]);
    memcpy(y, y0, n * sizeof(double));
    accumulate_f64(y, a, n);
    for (size_t i = 0; i < n; i++) cmp_rel(&e, "accumulate", i, y[i], y0[i] + a[i]);
    memcpy(y, y0, n * sizeof(double));
    scale_f64(y, -0.37, n);
    for (size_t i = 0; i < n; i++) cmp_rel(&e, "scale", i, y[i], y0[i] * -0.37);
    report(&e, 0, "add / accumulate / scale vs direct");
    free(a), free(b), free(y), free(y0);
}

// ---- swiglu ------------------------------------------------------------------------------

typedef struct {
    size_t n;
    double *gate, *up, *wt, *h;
    int exact;  // GeGLU: exact GELU (erf), else the tanh approximation
} SwiCtx;

static long double swiglu_loss(void *p) {
    SwiCtx *c = p;
    swiglu_fwd_f64(c->h, c->gate, c->up, c->n);
    return dot_wt(c->h, c->wt, c->n);
}

static void test_swiglu(void) {
    SwiCtx c = {.n = 257};
    c.gate = randn(c.n, 2), c.up = randn(c.n, 1), c.wt = randn(c.n, 1), c.h = zeros(c.n);
    swiglu_loss(&c);
    Cmp e = {0};
    for (size_t i = 0; i < c.n; i++) {
        long double g = c.gate[i];
        cmp_rel(&e, "h", i, c.h[i], (double)(g / (1 + expl(-g)) * c.up[i]));
    }
    report(&e, 1e-14, "swiglu fwd vs silu(gate) * up");
    double *dg = zeros(c.n), *du = zeros(c.n);
    swiglu_bwd_f64(dg, du, c.wt, c.gate, c.up, c.n);
    e = (Cmp){0};
    fd_check(&e, "dgate", dg, c.gate, c.n, 300, FD_H, swiglu_loss, &c);
    report(&e, FD_TOL, "swiglu bwd dgate vs finite differences");
    e = (Cmp){0};
    fd_check(&e, "dup", du, c.up, c.n, 300, FD_H, swiglu_loss, &c);
    report(&e, FD_TOL, "swiglu bwd dup vs finite differences");
    // dgate aliasing dh.
    double *alias = dup_arr(c.wt, c.n), *du2 = zeros(c.n);
    swiglu_bwd_f64(alias, du2, alias, c.gate, c.up, c.n);
    e = (Cmp){0};
    cmp_arrays(&e, "dgate", alias, dg, c.n);
    cmp_arrays(&e, "dup", du2, du, c.n);
    report(&e, 0, "swiglu bwd with dgate aliasing dh matches");
    free(c.gate), free(c.up), free(c.wt), free(c.h), free(dg), free(du), free(alias), free(du2);
}

// ---- geglu (Gemma) ------------------------------------------------------------------------

static long double geglu_loss(void *p) {
    SwiCtx *c = p;
    geglu_fwd_f64(c->h, c->gate, c->up, c->n, c->exact);
    return dot_wt(c->h, c->wt, c->n);
}

// gelu_pytorch_tanh (exact 0) or transformers' "gelu", x Phi(x) by erf (exact 1), in long double.
static long double gelu_ref(long double g, int exact) {
    return exact ? 0.5L * g * (1 + erfl(g / sqrtl(2))) : 0.5L * g * (1 + tanhl(sqrtl(2 / M_PI) * (g + 0.044715L * g * g * g)));
}

static void test_geglu(int exact) {
    const char *act = exact ? "gelu_erf" : "gelu_tanh";
    char what[96];
    SwiCtx c = {.n = 257, .exact = exact};
    c.gate = randn(c.n, 1), c.up = randn(c.n, 1), c.wt = randn(c.n, 1), c.h = zeros(c.n);
    c.gate[0] = 4.5, c.gate[1] = -4.5, c.gate[2] = 0;  // the tails and the middle
    geglu_loss(&c);
    Cmp e = {0};
    for (size_t i = 0; i < c.n; i++) cmp_rel(&e, "h", i, c.h[i], (double)(gelu_ref(c.gate[i], exact) * c.up[i]));
    snprintf(what, sizeof what, "geglu fwd vs %s(gate) * up", act);
    report(&e, 1e-9, what);  // 1 + tanh (or erf) cancels for gate << 0
    double *dg = zeros(c.n), *du = zeros(c.n);
    geglu_bwd_f64(dg, du, c.wt, c.gate, c.up, c.n, exact);
    e = (Cmp){0};
    fd_check(&e, "dgate", dg, c.gate, c.n, 300, FD_H, geglu_loss, &c);
    snprintf(what, sizeof what, "geglu (%s) bwd dgate vs finite differences", act);
    report(&e, FD_TOL, what);
    e = (Cmp){0};
    fd_check(&e, "dup", du, c.up, c.n, 300, FD_H, geglu_loss, &c);
    snprintf(what, sizeof what, "geglu (%s) bwd dup vs finite differences", act);
    report(&e, FD_TOL, what);
    double *alias = dup_arr(c.wt, c.n), *du2 = zeros(c.n);
    geglu_bwd_f64(alias, du2, alias, c.gate, c.up, c.n, exact);
    e = (Cmp){0};
    cmp_arrays(&e, "dgate", alias, dg, c.n);
    cmp_arrays(&e, "dup", du2, du, c.n);
    snprintf(what, sizeof what, "geglu (%s) bwd with dgate aliasing dh matches", act);
    report(&e, 0, what);
    // The float kernel against the double one.
    float *gf = to_f32(c.gate, c.n), *uf = to_f32(c.up, c.n), *wf = to_f32(c.wt, c.n), *hf = xmalloc(c.n * sizeof(float)),
          *dgf = xmalloc(c.n * sizeof(float)), *duf = xmalloc(c.n * sizeof(float));
    geglu_fwd_f32(hf, gf, uf, c.n, exact);
    geglu_bwd_f32(dgf, duf, wf, gf, uf, c.n, exact);
    e = (Cmp){0};
    cmp_f32(&e, "h", hf, c.h, c.n);
    cmp_f32(&e, "dgate", dgf, dg, c.n);
    cmp_f32(&e, "dup", duf, du, c.n);
    snprintf(what, sizeof what, "geglu (%s) f32 fwd+bwd vs f64", act);
    report_norm(&e, 1e-5, what);
    free(c.gate), free(c.up), free(c.wt), free(c.h), free(dg), free(du), free(alias), free(du2);
    free(gf), free(uf), free(wf), free(hf), free(dgf), free(duf);
}

// ---- rmsnorm -----------------------------------------------------------------------------

typedef struct {
    int N, C;
    double eps, w_add;
    double *x, *w, *wt, *y, *rstd;
} RmsCtx;

static long double rms_loss(void *p) {
    RmsCtx *c = p;
    rmsnorm_fwd_f64(c->y, c->rstd, c->x, c->w, c->w_add, c->N, c->C, c->eps);
    return dot_wt(c->y, c->wt, (size_t)c->N * c->C);
}

// w_add 1: Gemma's norms (1 + w applied, the gradient is w's), with w near 0 as Gemma's are.
static void test_rmsnorm(double xscale, double w_add) {
    ModelConfig cfg;
    model_config_defaults(&cfg);
    RmsCtx c = {.N = 5, .C = 24, .eps = cfg.rms_norm_eps, .w_add = w_add};
    size_t n = (size_t)c.N * c.C;
    c.x = randn(n, xscale), c.w = randn(c.C, 1), c.wt = randn(n, 1), c.y = zeros(n);
    c.rstd = zeros(c.N);
    for (int i = 0; i < c.C; i++) c.w[i] += 1 - w_add;
    rms_loss(&c);
    Cmp e = {0};
    for (int r = 0; r < c.N; r++) {
        long double ss = 0;
        for (int i = 0; i < c.C; i++) ss += (long double)c.x[r * c.C + i] * c.x[r * c.C + i];
        long double rs = 1 / sqrtl(ss / c.C + (long double)c.eps);
        cmp_rel(&e, "rstd", r, c.rstd[r], (double)rs);
        for (int i = 0; i < c.C; i++)
            cmp_rel(&e, "y", (size_t)r * c.C + i, c.y[r * c.C + i],
                    (double)(c.x[r * c.C + i] * rs * (c.w[i] + w_add)));
    }
    report(&e, 1e-14, "rmsnorm fwd vs direct (x scale %g, eps %g from config, w + %g)", xscale, c.eps, w_add);
    double *dx = zeros(n), *dw = zeros(c.C);
    rmsnorm_bwd_f64(dx, dw, c.wt, c.x, c.w, w_add, c.rstd, c.N, c.C);
    e = (Cmp){0};
    fd_check(&e, "dx", dx, c.x, n, 200, FD_H * xscale, rms_loss, &c);
    report(&e, FD_TOL, "rmsnorm bwd dx vs finite differences (x scale %g, w + %g)", xscale, w_add);
    e = (Cmp){0};
    fd_check(&e, "dw", dw, c.w, c.C, 200, FD_H, rms_loss, &c);
    report(&e, FD_TOL, "rmsnorm bwd dw vs finite differences (x scale %g, w + %g)", xscale, w_add);
    rms_loss(&c);  // restore y/rstd of the unperturbed input
    double *bx = randn(n, 1), *bw = randn(c.C, 1), *ax = dup_arr(bx, n), *aw = dup_arr(bw, c.C);
    rmsnorm_bwd_f64(ax, aw, c.wt, c.x, c.w, w_add, c.rstd, c.N, c.C);
    e = (Cmp){0};
    accum_cmp(&e, "dx", ax, bx, dx, n);
    accum_cmp(&e, "dw", aw, bw, dw, c.C);
    report(&e, ACC_TOL, "rmsnorm bwd dx and dw accumulate (x scale %g)", xscale);
    free(c.x), free(c.w), free(c.wt), free(c.y), free(c.rstd);
    free(dx), free(dw), free(bx), free(bw), free(ax), free(aw);
}

// ---- embedding ---------------------------------------------------------------------------

typedef struct {
    int N, C;
    const int32_t *tok;
    double *table, *wt, *out;
} EmbCtx;

static long double emb_loss(void *p) {
    EmbCtx *c = p;
    embedding_fwd_f64(c->out, c->tok, c->table, c->N, c->C);
    return dot_wt(c->out, c->wt, (size_t)c->N * c->C);
}

static void test_embedding(void) {
    static const int32_t tok[] = {3, 1, 3, 0, 3, 7, 1, 5, 3};
    EmbCtx c = {.N = 9, .C = 5, .tok = tok};
    const int V = 8;
    size_t nt = (size_t)V * c.C, no = (size_t)c.N * c.C;
    c.table = randn(nt, 1), c.wt = randn(no, 1), c.out = zeros(no);
    emb_loss(&c);
    Cmp e = {0};
    for (int i = 0; i < c.N; i++)
        for (int d = 0; d < c.C; d++)
            cmp_rel(&e, "out", (size_t)i * c.C + d, c.out[i * c.C + d], c.table[tok[i] * c.C + d]);
    report(&e, 0, "embedding fwd vs table rows");
    double *dt = zeros(nt);
    embedding_bwd_f64(dt, c.wt, tok, c.N, c.C);
    e = (Cmp){0};
    fd_check(&e, "dtable", dt, c.table, nt, 200, FD_H, emb_loss, &c);
    report(&e, FD_TOL, "embedding bwd (repeated tokens) vs finite differences");
    double *b0 = randn(nt, 1), *acc = dup_arr(b0, nt);
    embedding_bwd_f64(acc, c.wt, tok, c.N, c.C);
    e = (Cmp){0};
    accum_cmp(&e, "dtable", acc, b0, dt, nt);
    report(&e, ACC_TOL, "embedding bwd accumulates");
    free(c.table), free(c.wt), free(c.out), free(dt), free(b0), free(acc);
}

// ---- rope --------------------------------------------------------------------------------

// inv_freq as Hugging Face computes it (default and llama3), in double.
static void hf_inv_freq(const ModelConfig *c, double *inv, int long_factors) {
    int D = c->head_dim;
    for (int i = 0; i < D / 2; i++) inv[i] = 1.0 / pow(c->rope_theta, (double)(2 * i) / D);
    if (c->rope_type == ROPE_LONGROPE)  // Phi-3: 1 / (ext_factors * theta ** (2i / D))
        for (int i = 0; i < D / 2; i++)
            inv[i] /= long_factors ? c->rope_long_factor[i] : c->rope_short_factor[i];
    if (c->rope_type == ROPE_YARN) {  // transformers' _compute_yarn_parameters, in double
        double orig = c->rope_original_max_position_embeddings, b = c->rope_theta;
        double lo = floor(D * log(orig / (c->rope_beta_fast * 2 * M_PI)) / (2 * log(b)));
        double hi = ceil(D * log(orig / (c->rope_beta_slow * 2 * M_PI)) / (2 * log(b)));
        lo = lo < 0 ? 0 : lo, hi = hi > D - 1 ? D - 1 : hi;
        for (int i = 0; i < D / 2; i++) {
            double ramp = fmin(1, fmax(0, (i - lo) / (hi - lo)));
            inv[i] = inv[i] / c->rope_factor * ramp + inv[i] * (1 - ramp);
        }
    }
    if (c->rope_type != ROPE_LLAMA3) return;
    double old = c->rope_original_max_position_embeddings, lo = c->rope_low_freq_factor,
           hi = c->rope_high_freq_factor, f = c->rope_factor;
    for (int i = 0; i < D / 2; i++) {
        double wl = 2 * M_PI / inv[i];
        double llama = wl > old / lo ? inv[i] / f : inv[i];
        double smooth = (old / wl - lo) / (hi - lo);
        double smoothed = (1 - smooth) * llama / f + smooth * llama;
        int medium = !(wl < old / hi) && !(wl > old / lo);
        inv[i] = medium ? smoothed : llama;
    }
}

typedef struct {
    int B, T, H, D;
    const float *cs, *sn;
    double *x, *wt, *y;
    int rot;  // the rotated dimensions (0: D)
} RopeCtx;

static long double rope_loss(void *p) {
    RopeCtx *c = p;
    size_t n = (size_t)c->B * c->T * c->H * c->D;
    memcpy(c->y, c->x, n * sizeof(double));
    rope_fwd_f64(c->y, c->cs, c->sn, NULL, c->B, c->T, c->H, c->D, c->rot ? c->rot : c->D);
    return dot_wt(c->y, c->wt, n);
}

// Partial rotary (Phi-4-mini's partial_rotary_factor): the first rot dimensions of each head rotate
// as a head of rot dimensions would (pairs i, i + rot/2, tables [T, rot/2]); the rest pass
// unchanged, forward and backward; the backward against finite differences.
static void test_rope_partial(int D, int rot) {
    const int B = 2, T = 7, H = 3, half = rot / 2;
    float *cs = xmalloc(sizeof(float) * T * half), *sn = xmalloc(sizeof(float) * T * half);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            const float ang = (float)t * powf(10000.0f, -(float)(2 * i) / (float)rot);
            cs[t * half + i] = (float)cos(ang), sn[t * half + i] = (float)sin(ang);
        }
    const size_t n = (size_t)B * T * H * D;
    RopeCtx c = {B, T, H, D, cs, sn, randn(n, 1), randn(n, 1), zeros(n), rot};
    rope_loss(&c);
    Cmp e = {0};
    int pass_same = 1;
    for (size_t row = 0; row < (size_t)B * T * H; row++) {
        const int t = (int)(row / H % T);
        const double *x = c.x + row * D, *y = c.y + row * D;
        for (int d = 0; d < rot; d++) {
            const double cf = cs[t * half + d % half], sf = sn[t * half + d % half];
            const double r = d < half ? -x[d + half] : x[d - half];
            cmp_rel(&e, "y", row * D + d, y[d], (double)((long double)x[d] * cf + (long double)r * sf));
        }
        for (int d = rot; d < D; d++) pass_same &= y[d] == x[d];
    }
    report(&e, 1e-14, "rope fwd over %d of %d dimensions vs x*cos + rotate_half(x)*sin on them", rot, D);
    check(pass_same, "a dimension past rot changed", "rope fwd over %d of %d dimensions passes the other %d unchanged",
          rot, D, D - rot);
    double *g = dup_arr(c.wt, n);
    rope_bwd_f64(g, cs, sn, NULL, B, T, H, D, rot);
    e = (Cmp){0};
    fd_check(&e, "dx", g, c.x, n, 600, FD_H, rope_loss, &c);
    report(&e, FD_TOL, "rope bwd over %d of %d dimensions vs finite differences", rot, D);
    free(cs), free(sn), free(c.x), free(c.wt), free(c.y), free(g);
}

static void test_rope(void) {
    const int B = 2, T = 9, H = 3, D = 16, half = D / 2;
    ModelConfig cfg[4];
    float inv[5][8];
    for (int k = 0; k < 4; k++) {
        model_config_defaults(&cfg[k]);
        cfg[k].head_dim = D;
        cfg[k].rope_theta = 10000;
    }
    cfg[1].rope_type = ROPE_LLAMA3;
    cfg[1].rope_factor = 8;
    cfg[1].rope_low_freq_factor = 1;
    cfg[1].rope_high_freq_factor = 4;
    cfg[1].rope_original_max_position_embeddings = 8;
    cfg[2].rope_type = ROPE_LONGROPE;
    for (int i = 0; i < half; i++) cfg[2].rope_short_factor[i] = 1.0f + 0.25f * i, cfg[2].rope_long_factor[i] = 1.5f + i * i;
    cfg[3].rope_type = ROPE_YARN;  // the ramp runs over dimensions 0..5: 1..4 are blends
    cfg[3].rope_factor = 4, cfg[3].rope_theta = 100, cfg[3].rope_original_max_position_embeddings = 64;
    cfg[3].rope_beta_fast = 8, cfg[3].rope_beta_slow = 1, cfg[3].rope_truncate = 1;
    const char *tname[5] = {"default", "llama3", "longrope short", "longrope long", "yarn"};
    for (int k = 0; k < 5; k++) {
        double ref[8];
        const ModelConfig *c = &cfg[k < 3 ? k : k == 3 ? 2 : 3];
        rope_inv_freq(c, inv[k], k == 3);
        hf_inv_freq(c, ref, k == 3);
        Cmp e = {0};
        for (int i = 0; i < half; i++) cmp_rel(&e, "inv_freq", i, inv[k][i], ref[i]);
        report(&e, 1e-6, "rope_inv_freq %s vs HF formula in double", tname[k]);
    }
    int changed = 0, kept_band = 0;
    for (int i = 0; i < half; i++) {
        changed += inv[1][i] != inv[0][i];
        kept_band += fabs(inv[1][i] - inv[0][i] / 8) > 1e-6 * inv[0][i];  // smoothed, not /8
    }
    char det[128];
    snprintf(det, sizeof det, "%d of %d frequencies changed, %d not simply divided by the factor",
             changed, half, kept_band);
    check(changed > 0 && kept_band > 0, det,
          "llama3 rope scaling changes frequencies vs default (%d of %d, %d smoothed)", changed,
          half, kept_band);

    for (int k = 0; k < 2; k++) {
        float *cs = xmalloc(sizeof(float) * T * half), *sn = xmalloc(sizeof(float) * T * half);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < half; i++) {
                float ang = (float)t * inv[k][i];
                cs[t * half + i] = (float)cos(ang);
                sn[t * half + i] = (float)sin(ang);
            }
        size_t n = (size_t)B * T * H * D;
        RopeCtx c = {B, T, H, D, cs, sn, randn(n, 1), randn(n, 1), zeros(n)};
        rope_loss(&c);
        // out = x * cos + rotate_half(x) * sin, cos/sin repeated over both halves.
        Cmp e = {0};
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    size_t o = (((size_t)b * T + t) * H + h) * D;
                    const double *x = c.x + o;
                    for (int d = 0; d < D; d++) {
                        double cf = cs[t * half + d % half], sf = sn[t * half + d % half];
                        double rot = d < half ? -x[d + half] : x[d - half];
                        cmp_rel(&e, "y", o + d, c.y[o + d], (double)((long double)x[d] * cf +
                                                                      (long double)rot * sf));
                    }
                }
        report(&e, 1e-14, "rope fwd (%s tables) vs x*cos + rotate_half(x)*sin", tname[k]);
        double *g = dup_arr(c.wt, n);
        rope_bwd_f64(g, cs, sn, NULL, B, T, H, D, D);
        e = (Cmp){0};
        fd_check(&e, "dx", g, c.x, n, 1000, FD_H, rope_loss, &c);
        report(&e, FD_TOL, "rope bwd (%s tables) vs finite differences", tname[k]);
        // Packed documents: with positions t - doc_start, each document of a row rotates
        // exactly as the same tokens alone at the start of a row, forward and backward.
        int32_t pos[B * T];
        const int starts[2][3] = {{0, 4, 7}, {0, 1, 9}};  // row 0: docs of 4, 3, 2; row 1: 1, 8
        for (int b = 0; b < B; b++)
            for (int t = 0, d = 0; t < T; t++) {
                while (d + 1 < 3 && starts[b][d + 1] <= t) d++;
                pos[b * T + t] = t - starts[b][d];
            }
        for (int dir = 0; dir < 2; dir++) {
            double *y = dup_arr(c.x, n);
            (dir ? rope_bwd_f64 : rope_fwd_f64)(y, cs, sn, pos, B, T, H, D, D);
            e = (Cmp){0};
            for (int b = 0; b < B; b++)
                for (int d = 0; d < 3 && starts[b][d] < T; d++) {
                    const int t0 = starts[b][d], len = (d + 1 < 3 ? starts[b][d + 1] : T) - t0;
                    double *alone = dup_arr(c.x + ((size_t)b * T + t0) * H * D, (size_t)len * H * D);
                    (dir ? rope_bwd_f64 : rope_fwd_f64)(alone, cs, sn, NULL, 1, len, H, D, D);
                    for (size_t i = 0; i < (size_t)len * H * D; i++)
                        cmp_rel(&e, "y", i, y[((size_t)b * T + t0) * H * D + i], alone[i]);
                    free(alone);
                }
            report(&e, 0, "rope %s with document positions (%s tables) = each document alone",
                   dir ? "bwd" : "fwd", tname[k]);
            free(y);
        }
        free(cs), free(sn), free(c.x), free(c.wt), free(c.y), free(g);
    }
}

// ---- attention ---------------------------------------------------------------------------

// Naive causal GQA attention in long double: full softmax per row over keys
// max(i - window + 1, doc_start, 0) .. i (window 0: no window; doc_start may be NULL), out and lse. With dout
// non-NULL also the gradients (written, not accumulated). With lse_in NULL they are exact;
// otherwise the backward's probabilities are exp(s - lse_in) as the kernel recomputes them from
// its saved float lse (Dr = dout . out stays exact, as in the kernel), so the kernel can be held
// to near double precision without the float rounding of lse in the way.
static void naive_attention(double *out, double *lse, double *dq, double *dk, double *dv,
                            const double *dout, const float *lse_in, const double *q,
                            const double *k, const double *v, int B, int T, int Hq, int Hkv,
                            int D, int window, const int32_t *doc_start) {
    const long double scale = 1 / sqrtl(D);
    const int group = Hq / Hkv;
    long double *s = xmalloc(sizeof(long double) * T), *p = xmalloc(sizeof(long double) * T),
                *pb = xmalloc(sizeof(long double) * T), *dp = xmalloc(sizeof(long double) * T),
                *acc = xmalloc(sizeof(long double) * D);
    // dk/dv accumulate over query rows in long double, then round once.
    size_t nk = (size_t)B * T * Hkv * D;
    long double *dkl = xcalloc(nk, sizeof(long double)), *dvl = xcalloc(nk, sizeof(long double));
#define QI(b, t, h) (q + (((size_t)(b) * T + (t)) * Hq + (h)) * D)
#define KI(b, t, h) (k + (((size_t)(b) * T + (t)) * Hkv + (h)) * D)
#define VI(b, t, h) (v + (((size_t)(b) * T + (t)) * Hkv + (h)) * D)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            int hk = h / group;
            for (int i = 0; i < T; i++) {
                const double *qi = QI(b, i, h);
                // keys j0..i: the window's i - window + 1 and the document start, whichever is later
                int j0 = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
                if (doc_start && doc_start[(size_t)b * T + i] > j0) j0 = doc_start[(size_t)b * T + i];
                long double mx = -INFINITY;
                for (int j = j0; j <= i; j++) {
                    const double *kj = KI(b, j, hk);
                    long double d = 0;
                    for (int e = 0; e < D; e++) d += (long double)qi[e] * kj[e];
                    s[j] = d * scale;
                    if (s[j] > mx) mx = s[j];
                }
                long double l = 0;
                for (int j = j0; j <= i; j++) l += p[j] = expl(s[j] - mx);
                for (int j = j0; j <= i; j++) p[j] /= l;
                for (int e = 0; e < D; e++) acc[e] = 0;
                for (int j = j0; j <= i; j++)
                    for (int e = 0; e < D; e++) acc[e] += p[j] * VI(b, j, hk)[e];
                size_t orow = (((size_t)b * T + i) * Hq + h) * D;
                for (int e = 0; e < D; e++) out[orow + e] = (double)acc[e];
                lse[((size_t)b * Hq + h) * T + i] = (double)(mx + logl(l));
                if (!dout) continue;
                for (int j = j0; j <= i; j++)
                    pb[j] = lse_in ? expl(s[j] - lse_in[((size_t)b * Hq + h) * T + i]) : p[j];
                // dP_ij = dO_i . v_j, Dr = sum_j P_ij dP_ij (= dO_i . O_i), dS = P (dP - Dr),
                // dq_i = scale sum_j dS_ij k_j, dk_j += scale dS_ij q_i, dv_j += P_ij dO_i.
                const double *g = dout + orow;
                long double Dr = 0;
                for (int j = j0; j <= i; j++) {
                    long double d = 0;
                    for (int e = 0; e < D; e++) d += (long double)g[e] * VI(b, j, hk)[e];
                    dp[j] = d;
                    Dr += p[j] * d;
                }
                for (int e = 0; e < D; e++) acc[e] = 0;
                for (int j = j0; j <= i; j++) {
                    long double ds = pb[j] * (dp[j] - Dr);
                    size_t krow = (((size_t)b * T + j) * Hkv + hk) * D;
                    for (int e = 0; e < D; e++) {
                        acc[e] += ds * KI(b, j, hk)[e];
                        dkl[krow + e] += scale * ds * qi[e];
                        dvl[krow + e] += pb[j] * g[e];
                    }
                }
                for (int e = 0; e < D; e++) dq[orow + e] = (double)(scale * acc[e]);
            }
        }
#undef QI
#undef KI
#undef VI
    if (dout)
        for (size_t i = 0; i < nk; i++) dk[i] = (double)dkl[i], dv[i] = (double)dvl[i];
    free(s), free(p), free(pb), free(dp), free(acc), free(dkl), free(dvl);
}

typedef struct {
    int B, T, Hq, Hkv, D;
    double *q, *k, *v, *wt, *out;
    float *lse;
    int window;
    const int32_t *doc_start;
} AttCtx;

static long double att_loss(void *p) {
    AttCtx *c = p;
    attention_fwd_f64(c->out, c->lse, c->q, c->k, c->v, c->B, c->T, 0, c->T, c->Hq, c->Hkv, c->D, c->window,
                      c->doc_start, 0, 0);
    return dot_wt(c->out, c->wt, (size_t)c->B * c->T * c->Hq * c->D);
}

// The kernel saves lse in float, so its backward is exact only for a function whose softmax rows
// are rescaled by exp(lse - (float)lse) = 1 +- ~3e-7. Element-wise relative error against the
// true gradient is therefore unbounded where a dk/dv element is a cancelling sum (observed up to
// ~5e-4). Hence three checks of the backward:
//   - element-wise against the naive backward fed the kernel's float lse (tight, 1e-9);
//   - normwise (max err / max |ref|) against the exact naive backward and against finite
//     differences of L = sum(out * Wt) through the forward kernel (1e-6 and 1e-5);
//   - the exact naive backward itself element-wise against the same finite differences (1e-6),
//     so the hand-derived reference is verified too.
// window / doc_start: the mask (backend.h); the tag says which.
static void test_attention_mask(int B, int T, int Hq, int Hkv, int D, int nsample, int window,
                                const int32_t *doc_start) {
    size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * Hq * T;
    AttCtx c = {B, T, Hq, Hkv, D, randn(nq, 1), randn(nk, 1), randn(nk, 1), randn(nq, 1),
                xmalloc(nq * sizeof(double)), xmalloc(nl * sizeof(float)), window, doc_start};
    char tag[128];
    snprintf(tag, sizeof tag, "B=%d T=%d Hq=%d Hkv=%d D=%d%s%.0d%s", B, T, Hq, Hkv, D,
             window ? " window=" : "", window, doc_start ? " documents" : "");
    fill_nan(c.out, nq);
    for (size_t i = 0; i < nl; i++) c.lse[i] = NAN;
    attention_fwd_f64(c.out, c.lse, c.q, c.k, c.v, B, T, 0, T, Hq, Hkv, D, window, doc_start, 0, 0);
    double *rout = zeros(nq), *rlse = zeros(nl), *r[3] = {zeros(nq), zeros(nk), zeros(nk)},
           *f[3] = {zeros(nq), zeros(nk), zeros(nk)};
    naive_attention(rout, rlse, r[0], r[1], r[2], c.wt, NULL, c.q, c.k, c.v, B, T, Hq, Hkv, D,
                    window, doc_start);
    Cmp e = {0};
    cmp_arrays(&e, "out", c.out, rout, nq);
    report(&e, 1e-10, "attention fwd out vs naive (%s)", tag);
    e = (Cmp){0};
    for (size_t i = 0; i < nl; i++) cmp_rel(&e, "lse", i, c.lse[i], rlse[i]);
    report(&e, 1e-7, "attention fwd lse (float) vs naive (%s)", tag);
    naive_attention(rout, rlse, f[0], f[1], f[2], c.wt, c.lse, c.q, c.k, c.v, B, T, Hq, Hkv, D,
                    window, doc_start);

    // Outputs start as NaN: the backward must write them, not accumulate.
    double *g[3] = {xmalloc(nq * sizeof(double)), xmalloc(nk * sizeof(double)),
                    xmalloc(nk * sizeof(double))};
    fill_nan(g[0], nq), fill_nan(g[1], nk), fill_nan(g[2], nk);
    attention_bwd_f64(g[0], g[1], g[2], c.wt, c.q, c.k, c.v, c.out, c.lse, B, T, 0, T, Hq, Hkv, D, window,
                      doc_start, 0, 0, 0);
    const char *nm[3] = {"dq", "dk", "dv"};
    double *in[3] = {c.q, c.k, c.v};
    size_t sz[3] = {nq, nk, nk};
    e = (Cmp){0};
    for (int t = 0; t < 3; t++) cmp_arrays(&e, nm[t], g[t], f[t], sz[t]);
    report(&e, 1e-9, "attention bwd dq,dk,dv vs naive backward at the kernel's float lse (%s)",
           tag);
    e = (Cmp){0};
    for (int t = 0; t < 3; t++) cmp_norm(&e, nm[t], g[t], r[t], sz[t]);
    report_norm(&e, 1e-6, "attention bwd dq,dk,dv vs exact naive backward (%s)", tag);
    Cmp ef = {0}, en = {0};
    for (int t = 0; t < 3; t++) {
        int all = sz[t] <= (size_t)nsample;
        size_t cnt = all ? sz[t] : (size_t)nsample;
        double *a = xmalloc(cnt * sizeof(double)), *fd = xmalloc(cnt * sizeof(double));
        for (size_t s = 0; s < cnt; s++) {
            size_t i = all ? s : (size_t)(rng_next(&rng) % sz[t]);
            fd[s] = fd1(att_loss, &c, in[t] + i, FD_H);
            a[s] = g[t][i];
            cmp_rel(&en, nm[t], i, r[t][i], fd[s]);
        }
        cmp_norm(&ef, nm[t], a, fd, cnt);
        free(a), free(fd);
    }
    report_norm(&ef, 1e-5, "attention bwd dq,dk,dv vs finite differences (%s, %s)", tag,
                (size_t)nsample >= nq ? "all elements" : "sampled");
    report(&en, 1e-6, "attention exact naive backward vs finite differences (%s)", tag);
    free(c.q), free(c.k), free(c.v), free(c.wt), free(c.out), free(c.lse), free(rout), free(rlse);
    for (int t = 0; t < 3; t++) free(r[t]), free(f[t]), free(g[t]);
}

static void test_attention(int B, int T, int Hq, int Hkv, int D, int nsample) {
    test_attention_mask(B, T, Hq, Hkv, D, nsample, 0, NULL);
}

// Packed rows: documents start at the given in-row positions (row b's list ends with -1).
static void test_attention_docs(int B, int T, int Hq, int Hkv, int D, int nsample, int window,
                                const int starts[][8]) {
    int32_t *ds = xmalloc(sizeof(int32_t) * B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0, s = 0; t < T; t++) {
            while (starts[b][s + 1] >= 0 && starts[b][s + 1] <= t) s++;
            ds[(size_t)b * T + t] = starts[b][s];
        }
    test_attention_mask(B, T, Hq, Hkv, D, nsample, window, ds);
    free(ds);
}

// ---- fused classifier + cross-entropy ----------------------------------------------------

typedef struct {
    int N, V, C;
    double scale;
    double *x, *W;
    const int32_t *tgt;
} CeCtx;

static long double ce_logit(const CeCtx *c, int n, int u) {
    long double s = 0;
    for (int d = 0; d < c->C; d++)
        s += (long double)c->x[(size_t)n * c->C + d] * c->W[(size_t)u * c->C + d];
    return s;
}

// Row n's logits as mx + log(S), S = sum_u exp(z_u - mx), in one online pass.
static void ce_row_stats(const CeCtx *c, int n, long double *mx_out, long double *S_out) {
    long double mx = -INFINITY, S = 0;
    for (int u = 0; u < c->V; u++) {
        long double z = ce_logit(c, n, u);
        if (z > mx) S = S * expl(mx - z), mx = z;  // expl(-inf) = 0 on the first logit
        S += exp((double)(z - mx));
    }
    *mx_out = mx, *S_out = S;
}

// -log softmax(x_n W^T)[t] in long double; 0 for ignored rows.
static long double ce_row_loss(const CeCtx *c, int n) {
    if (c->tgt[n] < 0) return 0;
    long double mx, S;
    ce_row_stats(c, n, &mx, &S);
    return mx + logl(S) - ce_logit(c, n, c->tgt[n]);
}

static long double ce_loss(void *p) {
    CeCtx *c = p;
    long double s = 0;
    for (int n = 0; n < c->N; n++) s += ce_row_loss(c, n);
    return c->scale * s;
}

// Loss of one row only (x[n] affects nothing else); ctx is a CeRow.
typedef struct {
    CeCtx *c;
    int n;
} CeRow;
static long double ce_row_fn(void *p) {
    CeRow *r = p;
    return r->c->scale * ce_row_loss(r->c, r->n);
}

// ---- soft-capped attention and classifier (Gemma 2) --------------------------------------
// The kernels' forward against a naive float64 one (scores scaled, capped as cap tanh(s / cap),
// then masked and normalized), and their backward against finite differences of
// L = sum(out * Wt) through the forward kernel; scale is given (Gemma's query_pre_attn_scalar),
// not the default 1/sqrt(D).
typedef struct {
    AttCtx a;
    double scale, cap;
} CapCtx;

static long double cap_loss(void *p) {
    CapCtx *c = p;
    AttCtx *a = &c->a;
    attention_fwd_f64(a->out, a->lse, a->q, a->k, a->v, a->B, a->T, 0, a->T, a->Hq, a->Hkv, a->D, a->window, NULL,
                      c->scale, c->cap);
    return dot_wt(a->out, a->wt, (size_t)a->B * a->T * a->Hq * a->D);
}

static void test_attention_softcap(int B, int T, int Hq, int Hkv, int D, int window, double scale, double cap,
                                   int nsample) {
    size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * Hq * T;
    CapCtx c = {{B, T, Hq, Hkv, D, randn(nq, 2), randn(nk, 2), randn(nk, 1), randn(nq, 1),
                 xmalloc(nq * sizeof(double)), xmalloc(nl * sizeof(float)), window, NULL},
                scale, cap};
    AttCtx *a = &c.a;
    char tag[128];
    snprintf(tag, sizeof tag, "B=%d T=%d Hq=%d Hkv=%d D=%d window=%d scale=%.3f cap=%.2f", B, T, Hq, Hkv, D,
             window, scale, cap);
    cap_loss(&c);
    // naive: per (b, h, i) row
    Cmp e = {0};
    double *srow = xmalloc(sizeof(double) * T), *ref = xmalloc(sizeof(double) * D);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++)
            for (int i = 0; i < T; i++) {
                const int hk = h / (Hq / Hkv), lo = window > 0 && i - window + 1 > 0 ? i - window + 1 : 0;
                double mx = -INFINITY, sum = 0;
                for (int j = lo; j <= i; j++) {
                    double sc = 0;
                    for (int d = 0; d < D; d++)
                        sc += a->q[(((size_t)b * T + i) * Hq + h) * D + d] * a->k[(((size_t)b * T + j) * Hkv + hk) * D + d];
                    srow[j] = cap * tanh(sc * scale / cap);
                    mx = srow[j] > mx ? srow[j] : mx;
                }
                for (int d = 0; d < D; d++) ref[d] = 0;
                for (int j = lo; j <= i; j++) {
                    const double pj = exp(srow[j] - mx);
                    sum += pj;
                    for (int d = 0; d < D; d++) ref[d] += pj * a->v[(((size_t)b * T + j) * Hkv + hk) * D + d];
                }
                for (int d = 0; d < D; d++)
                    cmp_rel(&e, "out", 0, a->out[(((size_t)b * T + i) * Hq + h) * D + d], ref[d] / sum);
            }
    report(&e, 1e-10, "attention fwd out, soft-capped, vs naive (%s)", tag);
    double *g[3] = {xmalloc(nq * sizeof(double)), xmalloc(nk * sizeof(double)), xmalloc(nk * sizeof(double))};
    attention_bwd_f64(g[0], g[1], g[2], a->wt, a->q, a->k, a->v, a->out, a->lse, B, T, 0, T, Hq, Hkv, D, window,
                      NULL, 0, scale, cap);
    const char *nm[3] = {"dq", "dk", "dv"};
    double *in[3] = {a->q, a->k, a->v};
    size_t sz[3] = {nq, nk, nk};
    Cmp ef = {0};
    for (int t = 0; t < 3; t++) {
        double *x = xmalloc(sizeof(double) * nsample), *fd = xmalloc(sizeof(double) * nsample);
        for (int s2 = 0; s2 < nsample; s2++) {
            size_t i = (size_t)(rng_next(&rng) % sz[t]);
            fd[s2] = fd1(cap_loss, &c, in[t] + i, FD_H);
            x[s2] = g[t][i];
        }
        cmp_norm(&ef, nm[t], x, fd, nsample);
        free(x), free(fd);
    }
    report_norm(&ef, 1e-5, "attention bwd dq,dk,dv, soft-capped, vs finite differences (%s)", tag);
    // float against double, same inputs
    float *qf = xmalloc(sizeof(float) * nq), *kf = xmalloc(sizeof(float) * nk), *vf = xmalloc(sizeof(float) * nk),
          *of = xmalloc(sizeof(float) * nq), *gf = xmalloc(sizeof(float) * nq), *lf = xmalloc(sizeof(float) * nl);
    float *gq = xmalloc(sizeof(float) * nq), *gk = xmalloc(sizeof(float) * nk), *gv = xmalloc(sizeof(float) * nk);
    for (size_t i = 0; i < nq; i++) qf[i] = (float)a->q[i], gf[i] = (float)a->wt[i];
    for (size_t i = 0; i < nk; i++) kf[i] = (float)a->k[i], vf[i] = (float)a->v[i];
    attention_fwd_f32(of, lf, qf, kf, vf, B, T, 0, T, Hq, Hkv, D, window, NULL, (float)scale, (float)cap);
    attention_bwd_f32(gq, gk, gv, gf, qf, kf, vf, of, lf, B, T, 0, T, Hq, Hkv, D, window, NULL, 0, (float)scale,
                      (float)cap);
    e = (Cmp){0};
    double *tmp = xmalloc(sizeof(double) * nq);
    for (size_t i = 0; i < nq; i++) tmp[i] = of[i];
    cmp_norm(&e, "out", tmp, a->out, nq);
    for (size_t i = 0; i < nq; i++) tmp[i] = gq[i];
    cmp_norm(&e, "dq", tmp, g[0], nq);
    for (size_t i = 0; i < nk; i++) tmp[i] = gk[i];
    cmp_norm(&e, "dk", tmp, g[1], nk);
    for (size_t i = 0; i < nk; i++) tmp[i] = gv[i];
    cmp_norm(&e, "dv", tmp, g[2], nk);
    report_norm(&e, 1e-5, "attention f32, soft-capped, vs f64 (%s)", tag);
    free(qf), free(kf), free(vf), free(of), free(gf), free(lf), free(gq), free(gk), free(gv), free(tmp);
    free(a->q), free(a->k), free(a->v), free(a->wt), free(a->out), free(a->lse), free(srow), free(ref);
    for (int t = 0; t < 3; t++) free(g[t]);
}

// Soft-capped logits: loss = scale sum_n (lse(z'_n) - z'_n[t]), z' = cap tanh(x W^T / cap).
typedef struct {
    CeCtx c;
    double cap;
} CeCapCtx;

static long double cecap_loss(void *p) {
    CeCapCtx *k = p;
    const CeCtx *c = &k->c;
    long double s = 0;
    for (int n = 0; n < c->N; n++) {
        if (c->tgt[n] < 0) continue;
        long double mx = -INFINITY, S = 0, zt = 0;
        for (int u = 0; u < c->V; u++) {
            const long double z = k->cap * tanhl(ce_logit(c, n, u) / k->cap);
            if (u == c->tgt[n]) zt = z;
            if (z > mx) S = S * expl(mx - z), mx = z;
            S += expl(z - mx);
        }
        s += mx + logl(S) - zt;
    }
    return c->scale * s;
}

static void test_ce_softcap(int N, int V, int C, double cap) {
    int32_t *tgt = xmalloc(sizeof(int32_t) * N);
    for (int n = 0; n < N; n++) tgt[n] = n % 5 == 3 ? -100 : (int32_t)(rng_next(&rng) % V);
    CeCapCtx k = {{N, V, C, 0.37, randn((size_t)N * C, 1), randn((size_t)V * C, 1), tgt}, cap};
    CeCtx *c = &k.c;
    size_t nx = (size_t)N * C, nw = (size_t)V * C;
    float *loss = xmalloc(sizeof(float) * N);
    double *dx = xmalloc(nx * sizeof(double)), *dW = zeros(nw);
    classifier_ce_f64(loss, dx, dW, c->x, c->W, tgt, N, V, C, c->scale, cap);
    long double tot = 0;
    for (int n = 0; n < N; n++) tot += loss[n];
    Cmp e = {0};
    cmp_rel(&e, "loss", 0, (double)(c->scale * tot), (double)cecap_loss(&k));
    report(&e, 1e-7, "classifier_ce soft-capped (cap %.1f) losses vs naive (N=%d V=%d C=%d)", cap, N, V, C);
    e = (Cmp){0};
    fd_check(&e, "dx", dx, c->x, nx, 150, FD_H, cecap_loss, &k);
    fd_check(&e, "dW", dW, c->W, nw, 150, FD_H, cecap_loss, &k);
    report(&e, FD_TOL, "classifier_ce soft-capped (cap %.1f) dx, dW vs finite differences (N=%d V=%d C=%d)", cap, N,
           V, C);
    free(tgt), free(c->x), free(c->W), free(loss), free(dx), free(dW);
}

static void test_ce(int N, int V, int C, const int32_t *tgt, int big) {
    CeCtx c = {N, V, C, 0.37, randn((size_t)N * C, 1), randn((size_t)V * C, 1), tgt};
    size_t nx = (size_t)N * C, nw = (size_t)V * C;
    char tag[96];
    int rows = (1 << 21) / V;  // the kernel's CE_CHUNK / V, at least CE_MIN_ROWS: for the name only
    if (rows < 256) rows = 256;
    if (rows > N) rows = N;
    snprintf(tag, sizeof tag, "N=%d V=%d C=%d, %d chunk%s of %d rows", N, V, C,
             (N + rows - 1) / rows, (N + rows - 1) / rows > 1 ? "s" : "", rows);
    float *loss = xmalloc(sizeof(float) * N);
    double *dx = xmalloc(nx * sizeof(double)), *dW = zeros(nw);
    fill_nan(dx, nx);  // dx is written, not accumulated
    for (int n = 0; n < N; n++) loss[n] = NAN;
    classifier_ce_f64(loss, dx, dW, c.x, c.W, tgt, N, V, C, c.scale, 0);
    Cmp e = {0};
    int ign_ok = 1;
    for (int n = 0; n < N; n++) {
        cmp_rel(&e, "loss", n, loss[n], (double)ce_row_loss(&c, n));
        if (tgt[n] < 0 && loss[n] != 0) ign_ok = 0;
    }
    report(&e, 1e-7, "classifier_ce losses (float) vs naive log-softmax (%s)", tag);
    check(ign_ok, "an ignored row has a nonzero loss",
          "classifier_ce ignored targets give loss 0 (%s)", tag);

    e = (Cmp){0};
    if (!big) {
        fd_check(&e, "dx", dx, c.x, nx, 200, FD_H, ce_loss, &c);
    } else {
        // x[n] moves only row n's loss; one column per row keeps this O(N V).
        for (int n = 0; n < N; n++) {
            CeRow r = {&c, n};
            size_t i = (size_t)n * C + n % C;
            cmp_rel(&e, "dx", i, dx[i], fd1(ce_row_fn, &r, c.x + i, FD_H));
        }
    }
    report(&e, FD_TOL, "classifier_ce dx vs finite differences (%s)", tag);

    e = (Cmp){0};
    if (!big) {
        fd_check(&e, "dW", dW, c.W, nw, 200, FD_H, ce_loss, &c);
    } else {
        // Perturbing W[u,d] moves logit u of every row by +-h x[n,d]; the other logits' sum of
        // exps is computed once per row, so each difference costs O(N).
        long double *mx = xmalloc(sizeof(long double) * N), *S = xmalloc(sizeof(long double) * N);
        for (int n = 0; n < N; n++) ce_row_stats(&c, n, mx + n, S + n);
        int *us = xmalloc(sizeof(int) * (N + 12)), nu = 0;
        for (int n = 0; n < N; n++)
            if (tgt[n] >= 0) us[nu++] = tgt[n];
        us[nu++] = 0, us[nu++] = V - 1;
        while (nu < N + 12) us[nu++] = (int)(rng_next(&rng) % V);
        for (int a = 0; a < nu; a++) {
            int u = us[a];
            for (int d = 0; d < C; d++) {
                double w0 = c.W[(size_t)u * C + d], wp = w0 + FD_H, wm = w0 - FD_H;
                long double lp = 0, lm = 0;
                for (int n = 0; n < N; n++) {
                    if (tgt[n] < 0) continue;
                    const double *xr = c.x + (size_t)n * C;
                    long double z0 = 0, zp = 0, zm = 0, zt = 0;
                    for (int e2 = 0; e2 < C; e2++) {
                        double wv = c.W[(size_t)u * C + e2];
                        z0 += (long double)xr[e2] * wv;
                        zp += (long double)xr[e2] * (e2 == d ? wp : wv);
                        zm += (long double)xr[e2] * (e2 == d ? wm : wv);
                        zt += (long double)xr[e2] * c.W[(size_t)tgt[n] * C + e2];
                    }
                    long double rest = S[n] - expl(z0 - mx[n]);
                    lp += mx[n] + logl(rest + expl(zp - mx[n])) - (tgt[n] == u ? zp : zt);
                    lm += mx[n] + logl(rest + expl(zm - mx[n])) - (tgt[n] == u ? zm : zt);
                }
                double fd = (double)(c.scale * (lp - lm) / ((long double)wp - wm));
                cmp_rel(&e, "dW", (size_t)u * C + d, dW[(size_t)u * C + d], fd);
            }
        }
        free(mx), free(S), free(us);
    }
    report(&e, FD_TOL, "classifier_ce dW vs finite differences (%s)", tag);

    // dW accumulates; dx / dW may each be NULL (checked on the small case only: time).
    double *b0 = randn(nw, 1), *acc = dup_arr(b0, nw), *dx2 = zeros(nx), *dW2 = zeros(nw);
    float *loss2 = xmalloc(sizeof(float) * N);
    classifier_ce_f64(loss2, dx2, acc, c.x, c.W, tgt, N, V, C, c.scale, 0);
    e = (Cmp){0};
    accum_cmp(&e, "dW", acc, b0, dW, nw);
    report(&e, ACC_TOL, "classifier_ce dW accumulates (%s)", tag);
    if (!big) {
        e = (Cmp){0};
        classifier_ce_f64(loss2, NULL, dW2, c.x, c.W, tgt, N, V, C, c.scale, 0);
        cmp_arrays(&e, "dW (dx NULL)", dW2, dW, nw);
        classifier_ce_f64(loss2, dx2, NULL, c.x, c.W, tgt, N, V, C, c.scale, 0);
        cmp_arrays(&e, "dx (dW NULL)", dx2, dx, nx);
        for (int n = 0; n < N; n++) loss2[n] = NAN;
        classifier_ce_f64(loss2, NULL, NULL, c.x, c.W, tgt, N, V, C, c.scale, 0);
        for (int n = 0; n < N; n++) cmp_rel(&e, "loss (dx, dW NULL)", n, loss2[n], loss[n]);
        report(&e, 0, "classifier_ce with dx and/or dW NULL matches (%s)", tag);
    }
    free(c.x), free(c.W), free(loss), free(dx), free(dW), free(b0), free(acc), free(dx2),
        free(dW2), free(loss2);
}

// ---- sumsq, adamw ------------------------------------------------------------------------

static void test_sumsq(void) {
    const size_t ns[] = {0, 1, 3, 1001};
    Cmp e = {0};
    for (size_t k = 0; k < 4; k++) {
        double *x = randn(ns[k], 1);
        long double s = 0;
        for (size_t i = 0; i < ns[k]; i++) s += (long double)x[i] * x[i];
        cmp_rel(&e, "sumsq", ns[k], sumsq_f64(x, ns[k]), (double)s);
        free(x);
    }
    report(&e, 1e-14, "sumsq vs naive (n = 0, 1, 3, 1001)");
}

static void test_adamw(float lr, float wd, float gscale, int t) {
    const size_t n = 101;
    const float b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    double *p = randn(n, 1), *g = randn(n, 1), *p0 = dup_arr(p, n);
    float *m = xmalloc(n * sizeof(float)), *v = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        m[i] = t > 1 ? 0.1f * rng_normal(&rng) : 0;
        v[i] = t > 1 ? 0.01f * fabsf(rng_normal(&rng)) : 0;
    }
    g[0] = 0, m[0] = 0, v[0] = 0;  // a parameter with no gradient history: only decay moves it
    double *rm = xmalloc(n * sizeof(double)), *rv = xmalloc(n * sizeof(double)),
           *rp = xmalloc(n * sizeof(double));
    double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
    for (size_t i = 0; i < n; i++) {
        double gr = g[i] * gscale;
        double w = p[i] - (double)lr * wd * p[i];
        rm[i] = b1 * (double)m[i] + (1 - (double)b1) * gr;
        rv[i] = b2 * (double)v[i] + (1 - (double)b2) * gr * gr;
        rp[i] = w - (double)lr / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + eps);
    }
    adamw_f64(p, g, m, v, n, lr, b1, b2, eps, wd, gscale, t);
    // The kernel computes in float: compare normwise (max err / max |ref|) per tensor. The
    // update p - p0 is ~1e-2 of p, so its own check is ~1e4 times more sensitive to the step.
    double *md = xmalloc(n * sizeof(double)), *vd = xmalloc(n * sizeof(double)),
           *up = xmalloc(n * sizeof(double)), *rup = xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        md[i] = m[i], vd[i] = v[i], up[i] = p[i] - p0[i], rup[i] = rp[i] - p0[i];
    Cmp e = {0}, d = {0};
    cmp_norm(&e, "p", p, rp, n);
    cmp_norm(&e, "m", md, rm, n);
    cmp_norm(&e, "v", vd, rv, n);
    cmp_norm(&d, "p - p0", up, rup, n);
    report_norm(&e, 1e-6, "adamw step (lr %g wd %g gscale %g t %d) p, m, v vs PyTorch formula", lr,
                wd, gscale, t);
    report_norm(&d, 1e-4,
                "adamw step (lr %g wd %g gscale %g t %d) update p - p0 vs PyTorch formula", lr, wd,
                gscale, t);
    free(md), free(vd), free(up), free(rup);
    free(p), free(g), free(p0), free(m), free(v), free(rm), free(rv), free(rp);
}

// ---- 8-bit AdamW (optim.h) ------------------------------------------------------------------
// adamw8_f32 against the algorithm written plainly: the same float operations in the same order,
// the nearest code by a scan of all 256 (argmin, the first on a tie), so the two agree bit for
// bit: the kernel's table-started search finds the same codes.
static uint8_t argmin_code(const float *map, float x) {
    int best = 0;
    for (int i = 1; i < 256; i++)
        if (fabsf(x - map[i]) < fabsf(x - map[best])) best = i;
    return (uint8_t)best;
}

// torchao's quantize_8bit_with_qmap: the last code <= x (0 if none), up when x - down >= half
// the step to the next.
static uint8_t torchao_code(const float *map, float x) {
    int lo = 0;
    for (int i = 1; i < 256; i++)
        if (map[i] <= x) lo = i;
    const int up = lo < 255 ? lo + 1 : 255;
    return (uint8_t)(x - map[lo] >= (map[up] - map[lo]) * 0.5f ? up : lo);
}

static float lerp_ref(float a, float b, float w) { return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w); }

static void naive_adamw8(float *p, const float *g, uint8_t *qm, uint8_t *qv, float *am, float *av, const float *map,
                         size_t n, float lr, float b1, float b2, float eps, float wd, float gs, int t, int torchao) {
    const double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
    const float value = (float)(-(double)lr / bc1), bc2s = (float)sqrt(bc2), decay = (float)(1.0 - (double)lr * wd);
    for (size_t b = 0; b * ADAM8_BLOCK < n; b++) {
        const size_t i0 = b * ADAM8_BLOCK, k = n - i0 < ADAM8_BLOCK ? n - i0 : ADAM8_BLOCK;
        float ms[ADAM8_BLOCK], vs[ADAM8_BLOCK], mm = 0, mv = 0;
        for (size_t j = 0; j < k; j++) {
            const size_t i = i0 + j;
            const float gr = g[i] * gs;
            float mi = map[qm[i]] * am[b], vi = map[256 + qv[i]] * av[b];
            float w = p[i];
            if (torchao) {  // torchao's single_param_adam
                w = w - lr * wd * w;
                mi = lerp_ref(mi, gr, (float)(1.0 - b1));
                vi = lerp_ref(vi, gr * gr, (float)(1.0 - b2));
                p[i] = w - lr * (mi / (float)bc1) / (sqrtf(vi) / bc2s + eps);
            } else {
                mi = mi * b1 + (float)(1.0 - b1) * gr;
                vi = vi * b2 + (float)(1.0 - b2) * gr * gr;
                if (wd > 0) w *= decay;
                p[i] = w + value * (mi / (sqrtf(vi) / bc2s + eps));
            }
            ms[j] = mi, vs[j] = vi;
            if (fabsf(mi) > mm) mm = fabsf(mi);
            if (fabsf(vi) > mv) mv = fabsf(vi);
        }
        if (torchao) am[b] = fmaxf(mm, 1e-12f), av[b] = fmaxf(mv, 1e-12f);  // scale_tensor's clip
        else am[b] = mm == 0 ? 1.0f : mm, av[b] = mv == 0 ? 1.0f : mv;
        for (size_t j = 0; j < k; j++)
            if (torchao) qm[i0 + j] = torchao_code(map, ms[j] / am[b]), qv[i0 + j] = torchao_code(map + 256, vs[j] / av[b]);
            else qm[i0 + j] = argmin_code(map, ms[j] / am[b]), qv[i0 + j] = argmin_code(map + 256, vs[j] / av[b]);
    }
}

// torchao's AdamW4bit written plainly: its steps, 16 codes by a linear scan with its rounding,
// packed two to a byte (element 2k in the high half).
static unsigned torchao_code4(const float *map, float x) {
    unsigned lo = 0;
    for (unsigned i = 1; i < 16; i++)
        if (map[i] <= x) lo = i;
    const unsigned up = lo < 15 ? lo + 1 : 15;
    return x - map[lo] >= (map[up] - map[lo]) * 0.5f ? up : lo;
}

static void naive_adamw4(float *p, const float *g, uint8_t *qm, uint8_t *qv, float *am, float *av, const float *map,
                         size_t n, float lr, float b1, float b2, float eps, float wd, float gs, int t) {
    const double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
    const float bc2s = (float)sqrt(bc2);
    for (size_t b = 0; b * ADAM4_BLOCK < n; b++) {
        float ms[ADAM4_BLOCK], vs[ADAM4_BLOCK], mm = 0, mv = 0;
        for (size_t j = 0; j < ADAM4_BLOCK; j++) {
            const size_t i = b * ADAM4_BLOCK + j;
            const int code_m = i % 2 ? qm[i / 2] & 15 : qm[i / 2] >> 4, code_v = i % 2 ? qv[i / 2] & 15 : qv[i / 2] >> 4;
            const float gr = g[i] * gs;
            float mi = map[code_m] * am[b], vi = map[256 + code_v] * av[b], w = p[i];
            w = w - lr * wd * w;
            mi = lerp_ref(mi, gr, (float)(1.0 - b1));
            vi = lerp_ref(vi, gr * gr, (float)(1.0 - b2));
            p[i] = w - lr * (mi / (float)bc1) / (sqrtf(vi) / bc2s + eps);
            ms[j] = mi, vs[j] = vi;
            mm = fmaxf(mm, fabsf(mi)), mv = fmaxf(mv, fabsf(vi));
        }
        am[b] = fmaxf(mm, 1e-12f), av[b] = fmaxf(mv, 1e-12f);
        for (size_t j = 0; j < ADAM4_BLOCK; j += 2) {
            const size_t k = (b * ADAM4_BLOCK + j) / 2;
            qm[k] = (uint8_t)(torchao_code4(map, ms[j] / am[b]) << 4 | torchao_code4(map, ms[j + 1] / am[b]));
            qv[k] = (uint8_t)(torchao_code4(map + 256, vs[j] / av[b]) << 4 | torchao_code4(map + 256, vs[j + 1] / av[b]));
        }
    }
}

static void test_adamw4(void) {
    float map[512];
    adam4_maps(map);
    Cmp e = {0};
    int ascending = 1;
    for (int i = 1; i < 16; i++) ascending &= map[i - 1] < map[i] && map[256 + i - 1] < map[256 + i];
    cmp_rel(&e, "ascending", 0, ascending, 1.0);
    cmp_rel(&e, "signed last", 0, map[15], 1.0);
    cmp_rel(&e, "unsigned first", 0, map[256], 1.0 / 16);
    cmp_rel(&e, "unsigned last", 0, map[271], 1.0);
    report(&e, 0, "adam4 maps: 16 ascending codes each, signed up to 1, unsigned 1/16 .. 1");
    const size_t n = 640;  // five blocks; block 1 gets no gradient
    float *p = xmalloc(n * sizeof(float)), *q = xmalloc(n * sizeof(float)), *g = xmalloc(n * sizeof(float));
    uint8_t *qm = xcalloc(n / 2, 1), *qv = xcalloc(n / 2, 1), *rqm = xcalloc(n / 2, 1), *rqv = xcalloc(n / 2, 1);
    float *am = xcalloc(5, sizeof(float)), *av = xcalloc(5, sizeof(float)), *ram = xcalloc(5, sizeof(float)),
          *rav = xcalloc(5, sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = q[i] = (float)rng_normal(&rng);
    e = (Cmp){0};
    for (int t = 1; t <= 4; t++) {
        for (size_t i = 0; i < n; i++) {
            const double mag = pow(10.0, -4.0 * (double)(rng_next(&rng) >> 11) / 9007199254740992.0);
            g[i] = i / ADAM4_BLOCK == 1 ? 0.0f : (float)(mag * rng_normal(&rng));
        }
        const float b1 = t == 4 ? 0.3f : 0.9f, wd = t == 3 ? 0.0f : 0.1f;
        adamw8_f32(p, g, qm, qv, am, av, map, n, 1e-2f, b1, 0.999f, 1e-8f, wd, 0.7f, t, 2);
        naive_adamw4(q, g, rqm, rqv, ram, rav, map, n, 1e-2f, b1, 0.999f, 1e-8f, wd, 0.7f, t);
        for (size_t i = 0; i < n; i++) cmp_rel(&e, "p", i, p[i], q[i]);
        for (size_t i = 0; i < n / 2; i++) cmp_rel(&e, "q_m", i, qm[i], rqm[i]), cmp_rel(&e, "q_v", i, qv[i], rqv[i]);
        for (int b = 0; b < 5; b++) cmp_rel(&e, "absmax_m", b, am[b], ram[b]), cmp_rel(&e, "absmax_v", b, av[b], rav[b]);
    }
    report(&e, 0, "adamw4 torchao (4 steps, a block without gradient, wd on and off) vs the plain algorithm, bit for bit");
    free(p), free(q), free(g), free(qm), free(qv), free(rqm), free(rqv), free(am), free(av), free(ram), free(rav);
}

static void test_adamw8(int torchao) {
    const char *who = torchao ? "torchao" : "bitsandbytes";
    float map[512];
    adam8_maps(map);
    Cmp e = {0};
    int ascending = 1;
    for (int i = 1; i < 256; i++) ascending &= map[i - 1] < map[i] && map[256 + i - 1] < map[256 + i];
    cmp_rel(&e, "signed map: last", 0, map[255], 1.0);
    cmp_rel(&e, "unsigned map: first", 0, map[256], 0.0);
    cmp_rel(&e, "unsigned map: last", 0, map[511], 1.0);
    cmp_rel(&e, "ascending", 0, ascending, 1.0);
    if (!torchao) report(&e, 0, "adam8 maps: 256 ascending codes each, signed up to 1, unsigned from 0 to 1");
    // Every code, the midpoints between neighbours and points around them: the kernel's search
    // (through adamw8's tables, run by one step on a tensor of those values) is argmin's.
    const size_t n = 1000;  // three whole blocks and a partial one; block 1 gets no gradient
    float *p = xmalloc(n * sizeof(float)), *q = xmalloc(n * sizeof(float)), *g = xmalloc(n * sizeof(float));
    uint8_t *qm = xcalloc(n, 1), *qv = xcalloc(n, 1), *rqm = xcalloc(n, 1), *rqv = xcalloc(n, 1);
    float *am = xcalloc(4, sizeof(float)), *av = xcalloc(4, sizeof(float)), *ram = xcalloc(4, sizeof(float)),
          *rav = xcalloc(4, sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = q[i] = (float)rng_normal(&rng);
    e = (Cmp){0};
    for (int t = 1; t <= 4; t++) {
        for (size_t i = 0; i < n; i++) {  // magnitudes over six decades, so small states meet the map's fine end
            const double mag = pow(10.0, -6.0 * (double)(rng_next(&rng) >> 11) / 9007199254740992.0);
            g[i] = i / ADAM8_BLOCK == 1 ? 0.0f : (float)(mag * rng_normal(&rng));
        }
        // beta1 0.3 at step 4: torch.lerp's other branch (weight 1 - beta1 >= 0.5)
        const float b1 = t == 4 ? 0.3f : 0.9f;
        adamw8_f32(p, g, qm, qv, am, av, map, n, 1e-2f, b1, 0.999f, 1e-8f, t == 3 ? 0.0f : 0.1f, 0.7f, t, torchao);
        naive_adamw8(q, g, rqm, rqv, ram, rav, map, n, 1e-2f, b1, 0.999f, 1e-8f, t == 3 ? 0.0f : 0.1f, 0.7f, t, torchao);
        for (size_t i = 0; i < n; i++) {
            cmp_rel(&e, "p", i, p[i], q[i]);
            cmp_rel(&e, "q_m", i, qm[i], rqm[i]);
            cmp_rel(&e, "q_v", i, qv[i], rqv[i]);
        }
        for (int b = 0; b < 4; b++) cmp_rel(&e, "absmax_m", b, am[b], ram[b]), cmp_rel(&e, "absmax_v", b, av[b], rav[b]);
    }
    report(&e, 0, "adamw8 %s (4 steps, a block without gradient, wd on and off) vs the plain algorithm, bit for bit",
           who);
    // the search alone, on every code, the midpoints and their neighbouring floats
    e = (Cmp){0};
    for (int half = 0; half < 2; half++)
        for (int i = 0; i < 256; i++) {
            const float *mp = map + 256 * half;
            float xs[4] = {mp[i], i < 255 ? (mp[i] + mp[i + 1]) / 2 : 1.5f, 0, 0};
            xs[2] = nextafterf(xs[1], -INFINITY), xs[3] = nextafterf(xs[1], INFINITY);
            for (int k = 0; k < 4; k++)
                cmp_rel(&e, half ? "unsigned" : "signed", i * 4 + k, adam8_code_f32(mp, xs[k], torchao),
                        torchao ? torchao_code(mp, xs[k]) : argmin_code(mp, xs[k]));
        }
    report(&e, 0, "adam8 %s code: every code, midpoint and the floats beside each midpoint, as %s", who,
           torchao ? "quantize_8bit_with_qmap" : "argmin");
    free(p), free(q), free(g), free(qm), free(qv), free(rqm), free(rqv), free(am), free(av), free(ram), free(rav);
}

// ---- float kernels against double --------------------------------------------------------

static void test_f32_attention(int window, int T, int D) {
    const int B = 2, Hq = 6, Hkv = 2;
    size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * Hq * T;
    double *q = randn(nq, 1), *k = randn(nk, 1), *v = randn(nk, 1), *g = randn(nq, 1);
    double *o = zeros(nq), *dq = zeros(nq), *dk = zeros(nk), *dv = zeros(nk);
    float *lse = xmalloc(nl * sizeof(float)), *lse32 = xmalloc(nl * sizeof(float));
    attention_fwd_f64(o, lse, q, k, v, B, T, 0, T, Hq, Hkv, D, window, NULL, 0, 0);
    attention_bwd_f64(dq, dk, dv, g, q, k, v, o, lse, B, T, 0, T, Hq, Hkv, D, window, NULL, 0, 0, 0);
    float *qf = to_f32(q, nq), *kf = to_f32(k, nk), *vf = to_f32(v, nk), *gf = to_f32(g, nq);
    float *of = xmalloc(nq * sizeof(float)), *dqf = xmalloc(nq * sizeof(float)),
          *dkf = xmalloc(nk * sizeof(float)), *dvf = xmalloc(nk * sizeof(float));
    attention_fwd_f32(of, lse32, qf, kf, vf, B, T, 0, T, Hq, Hkv, D, window, NULL, 0, 0);
    attention_bwd_f32(dqf, dkf, dvf, gf, qf, kf, vf, of, lse32, B, T, 0, T, Hq, Hkv, D, window, NULL, 0, 0, 0);
    double *lsed = xmalloc(nl * sizeof(double));
    for (size_t i = 0; i < nl; i++) lsed[i] = lse[i];
    Cmp e = {0};
    cmp_f32(&e, "out", of, o, nq);
    cmp_f32(&e, "lse", lse32, lsed, nl);
    report_norm(&e, 1e-4, "attention f32 fwd (out, lse) vs f64 (B=%d T=%d Hq=%d Hkv=%d D=%d window=%d)", B, T,
               Hq, Hkv, D, window);
    e = (Cmp){0};
    cmp_f32(&e, "dq", dqf, dq, nq);
    cmp_f32(&e, "dk", dkf, dk, nk);
    cmp_f32(&e, "dv", dvf, dv, nk);
    report_norm(&e, 1e-4, "attention f32 bwd (dq, dk, dv) vs f64 (B=%d T=%d Hq=%d Hkv=%d D=%d window=%d)", B,
               T, Hq, Hkv, D, window);
    free(q), free(k), free(v), free(g), free(o), free(dq), free(dk), free(dv), free(lse),
        free(lse32), free(qf), free(kf), free(vf), free(gf), free(of), free(dqf), free(dkf),
        free(dvf), free(lsed);
}

// Past one query block the kernels lay each key tile out once for several blocks, in chunks of
// tiles (attention_chunking): the bits must not depend on how the tiles and blocks are chunked.
// T 1300 is 6 tiles of 256: one chunk by default at D 16, then 1 tile a chunk with a forward task
// a block, then 2-3 tiles a chunk with 3 blocks a task (uneven last chunks).
static void test_f32_attention_chunks(int window) {
    const int B = 2, T = 1300, Hq = 4, Hkv = 2, D = 16;
    const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * Hq * T;
    double *qd = randn(nq, 1), *kd = randn(nk, 1), *vd = randn(nk, 1), *gd = randn(nq, 1);
    float *q = to_f32(qd, nq), *k = to_f32(kd, nk), *v = to_f32(vd, nk), *g = to_f32(gd, nq);
    int32_t *ds = xmalloc(sizeof(int32_t) * B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) ds[b * T + t] = b == 0 ? 0 : t < 400 ? 0 : t < 777 ? 400 : 777;
    float *out[3][5];
    const size_t n[5] = {nq, nl, nq, nk, nk};
    const size_t kc_bytes[3] = {0, 1, (size_t)256 * D * sizeof(float) * 3 * 2};
    const int qc[3] = {0, 1, 3};
    for (int c = 0; c < 3; c++) {
        for (int i = 0; i < 5; i++) out[c][i] = xmalloc(n[i] * sizeof(float));
        attention_chunking_f32(kc_bytes[c], qc[c]);
        attention_fwd_f32(out[c][0], out[c][1], q, k, v, B, T, 0, T, Hq, Hkv, D, window, ds, 0, 0);
        attention_bwd_f32(out[c][2], out[c][3], out[c][4], g, q, k, v, out[c][0], out[c][1], B, T, 0, T, Hq, Hkv, D,
                          window, ds, 0, 0, 0);
    }
    attention_chunking_f32(0, 0);
    for (int c = 1; c < 3; c++) {
        int same = 1;
        for (int i = 0; i < 5; i++) same &= !memcmp(out[0][i], out[c][i], n[i] * sizeof(float));
        check(same, "some output differs", "attention f32 chunked by %s (T=%d, documents, window %d) = the default "
              "chunks: out, lse, dq, dk, dv bit for bit", c == 1 ? "1 tile, 1 block a task" : "2-3 tiles, 3 blocks a task",
              T, window);
    }
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < 5; i++) free(out[c][i]);
    free(qd), free(kd), free(vd), free(gd), free(q), free(k), free(v), free(g), free(ds);
}

// Query tiles (tiled_attention): tiles that start at multiples of the kernel's block give the
// bits of one call over all queries, forward (out, lse) and backward (dq, and dk/dv summed over
// the tiles through accumulate); packed documents, a window and an uneven last tile included.
// Tiles at other starts (sequence-parallel spans) give the same out, lse and dq bits and dk/dv
// sums in another order: there the query blocks' row groups fall across the key blocks of the
// dK and dV products differently, and a masked score the products read but the kernel did not
// zero would show.
static void test_f32_attention_tiles(int tile, int window) {
    const int B = 2, T = 600, Hq = 4, Hkv = 2, D = 8;
    const size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * Hq * T;
    double *qd = randn(nq, 1), *kd = randn(nk, 1), *vd = randn(nk, 1), *gd = randn(nq, 1);
    float *q = to_f32(qd, nq), *k = to_f32(kd, nk), *v = to_f32(vd, nk), *g = to_f32(gd, nq);
    int32_t *ds = xmalloc(sizeof(int32_t) * B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) ds[b * T + t] = b == 0 ? 0 : t < 77 ? 0 : t < 150 ? 77 : t < 300 ? 150 : 300;
    float *o = xmalloc(nq * 4), *lse = xmalloc(nl * 4), *dq = xmalloc(nq * 4), *dk = xmalloc(nk * 4), *dv = xmalloc(nk * 4);
    for (size_t i = 0; i < nq; i++) dq[i] = NAN;  // the backward writes its outputs, never reads them
    for (size_t i = 0; i < nk; i++) dk[i] = dv[i] = NAN;
    attention_fwd_f32(o, lse, q, k, v, B, T, 0, T, Hq, Hkv, D, window, ds, 0, 0);
    attention_bwd_f32(dq, dk, dv, g, q, k, v, o, lse, B, T, 0, T, Hq, Hkv, D, window, ds, 0, 0, 0);
    // Tiles per sequence, as the model runs them (B = 1 per call, rows of a tile contiguous).
    float *to = xmalloc(nq * 4), *tl = xmalloc(nl * 4), *tdq = xmalloc(nq * 4), *tdk = xmalloc(nk * 4),
          *tdv = xmalloc(nk * 4);
    for (size_t i = 0; i < nk; i++) tdk[i] = tdv[i] = NAN;  // the first tile must write them
    for (size_t i = 0; i < nq; i++) tdq[i] = NAN;              // as each tile must write its dq rows
    const size_t lq = (size_t)Hq * D, lk = (size_t)Hkv * D;
    for (int b = 0; b < B; b++)
        for (int t0 = 0; t0 < T; t0 += tile) {
            int n = T - t0 < tile ? T - t0 : tile;
            size_t r = (size_t)b * T + t0;
            attention_fwd_f32(to + r * lq, tl + (size_t)b * Hq * T, q + r * lq, k + (size_t)b * T * lk,
                              v + (size_t)b * T * lk, 1, T, t0, n, Hq, Hkv, D, window, ds + b * T, 0, 0);
        }
    for (int b = 0; b < B; b++)
        for (int t0 = 0; t0 < T; t0 += tile) {
            int n = T - t0 < tile ? T - t0 : tile;
            size_t r = (size_t)b * T + t0;
            attention_bwd_f32(tdq + r * lq, tdk + (size_t)b * T * lk, tdv + (size_t)b * T * lk, g + r * lq,
                              q + r * lq, k + (size_t)b * T * lk, v + (size_t)b * T * lk, to + r * lq,
                              tl + (size_t)b * Hq * T, 1, T, t0, n, Hq, Hkv, D, window, ds + b * T, t0 > 0, 0, 0);
        }
    const int aligned = tile % attention_block_f32() == 0;
    double mx = 0, ref = 0;
    for (size_t i = 0; i < nk; i++) {
        mx = fmax(mx, fmax(fabs((double)dk[i] - tdk[i]), fabs((double)dv[i] - tdv[i])));
        ref = fmax(ref, fmax(fabs((double)dk[i]), fabs((double)dv[i])));
    }
    mx = isnan(mx) ? INFINITY : mx / fmax(ref, 1e-30);
    int same = !memcmp(o, to, nq * 4) && !memcmp(lse, tl, nl * 4) && !memcmp(dq, tdq, nq * 4) &&
               (aligned ? !memcmp(dk, tdk, nk * 4) && !memcmp(dv, tdv, nk * 4) : mx <= 1e-6);
    char why[80];
    snprintf(why, sizeof why, "differ (max |ddk|, |ddv| over max |dk|, |dv|: %.3g)", mx);
    check(same, why, "attention f32 in query tiles of %d (T=%d, 4 documents, window %d) = one call, %s", tile, T,
          window, aligned ? "bit for bit (out, lse, dq, dk, dv)" : "out, lse, dq bit for bit, dk and dv to 1e-6");
    free(qd), free(kd), free(vd), free(gd), free(q), free(k), free(v), free(g), free(ds), free(o), free(lse),
        free(dq), free(dk), free(dv), free(to), free(tl), free(tdq), free(tdk), free(tdv);
}

static void test_f32_ce(void) {
    const int N = 9, V = 50, C = 16;
    static const int32_t tgt[] = {3, 49, -1, 0, 3, 17, 22, -1, 8};
    size_t nx = (size_t)N * C, nw = (size_t)V * C;
    double *x = randn(nx, 1), *W = randn(nw, 0.5), *dx = zeros(nx), *dW = zeros(nw);
    float *l64 = xmalloc(N * sizeof(float)), *l32 = xmalloc(N * sizeof(float));
    classifier_ce_f64(l64, dx, dW, x, W, tgt, N, V, C, 0.25, 0);
    float *xf = to_f32(x, nx), *Wf = to_f32(W, nw), *dxf = xmalloc(nx * sizeof(float)),
          *dWf = xcalloc(nw, sizeof(float));
    classifier_ce_f32(l32, dxf, dWf, xf, Wf, tgt, N, V, C, 0.25f, 0);
    double *ld = xmalloc(N * sizeof(double));
    for (int i = 0; i < N; i++) ld[i] = l64[i];
    Cmp e = {0};
    cmp_f32(&e, "loss", l32, ld, N);
    cmp_f32(&e, "dx", dxf, dx, nx);
    cmp_f32(&e, "dW", dWf, dW, nw);
    report_norm(&e, 1e-4, "classifier_ce f32 (losses, dx, dW) vs f64 (N=%d V=%d C=%d)", N, V, C);
    free(x), free(W), free(dx), free(dW), free(l64), free(l32), free(xf), free(Wf), free(dxf),
        free(dWf), free(ld);
}

static void test_f32_rmsnorm(double w_add) {
    const int N = 6, C = 32;
    const double eps = 1e-5;
    size_t n = (size_t)N * C;
    double *x = randn(n, 1), *w = randn(C, 1), *g = randn(n, 1), *y = zeros(n), *r = zeros(N),
           *dx = zeros(n), *dw = zeros(C);
    rmsnorm_fwd_f64(y, r, x, w, w_add, N, C, eps);
    rmsnorm_bwd_f64(dx, dw, g, x, w, w_add, r, N, C);
    float *xf = to_f32(x, n), *wf = to_f32(w, C), *gf = to_f32(g, n),
          *yf = xmalloc(n * sizeof(float)), *rf = xmalloc(N * sizeof(float)),
          *dxf = xcalloc(n, sizeof(float)), *dwf = xcalloc(C, sizeof(float));
    rmsnorm_fwd_f32(yf, rf, xf, wf, (float)w_add, N, C, (float)eps);
    rmsnorm_bwd_f32(dxf, dwf, gf, xf, wf, (float)w_add, rf, N, C);
    Cmp e = {0};
    cmp_f32(&e, "out", yf, y, n);
    cmp_f32(&e, "rstd", rf, r, N);
    cmp_f32(&e, "dx", dxf, dx, n);
    cmp_f32(&e, "dw", dwf, dw, C);
    report_norm(&e, 1e-4, "rmsnorm f32 fwd+bwd (out, rstd, dx, dw) vs f64 (N=%d C=%d, w + %g)", N, C, w_add);
    free(x), free(w), free(g), free(y), free(r), free(dx), free(dw), free(xf), free(wf), free(gf),
        free(yf), free(rf), free(dxf), free(dwf);
}

// ---- thread counts ----------------------------------------------------------------------

// Kernels that split work by thread (column ranges, per-thread partials, attention tasks) give
// the same results on 1, 3 and 7 threads as on the default count; 7 > C = 5 leaves some
// embedding threads without columns. The second classifier has a chunk of more rows than words,
// so on 2 threads its dx and dW products run side by side.
typedef struct {
    double emb[40], bg[9], rx[120], rw[24], ry[120], ss, ao[1120], adq[1120], adk[560], adv[560],
        cdx[35], cdw[55], cdx2[35], cdw2[25], go[1152], gdq[1152], gdk[288], gdv[288];
} ThreadOut;

static void thread_run(ThreadOut *o, const double *in) {
    static const int32_t tok[] = {3, 1, 3, 0, 3, 7, 1, 5, 3}, tgt[] = {3, 10, -1, 0, 3, 7, -1},
                         tgt2[] = {4, 0, 2, -1, 1, 3, 4};
    const double *wt = in;  // 1200 values, overlapping slices serve as every input
    float lse[140], loss[7];
    double rstd[5];
    memset(o, 0, sizeof *o);
    embedding_bwd_f64(o->emb, wt, tok, 9, 5);
    bias_grad_f64(o->bg, wt, 7, 9);
    rmsnorm_fwd_f64(o->ry, rstd, wt, wt + 200, 0, 5, 24, 1e-5);
    rmsnorm_bwd_f64(o->rx, o->rw, wt + 300, wt, wt + 200, 0, rstd, 5, 24);
    o->ss = sumsq_f64(wt, 1001);
    attention_fwd_f64(o->ao, lse, wt, wt + 100, wt + 200, 1, 70, 0, 70, 2, 1, 8, 0, NULL, 0, 0);
    attention_bwd_f64(o->adq, o->adk, o->adv, wt + 7, wt, wt + 100, wt + 200, o->ao, lse, 1, 70,
                      0, 70, 2, 1, 8, 0, NULL, 0, 0, 0);
    // Four query heads a kv head, four rows: the forward's tasks take all four heads on 1
    // thread, two on 2 and one on 3 or 7 (enough tasks a thread): the same numbers.
    float lse4[144];
    attention_fwd_f64(o->go, lse4, wt, wt + 40, wt + 300, 4, 9, 0, 9, 4, 1, 8, 0, NULL, 0, 0);
    attention_bwd_f64(o->gdq, o->gdk, o->gdv, wt + 11, wt, wt + 40, wt + 300, o->go, lse4, 4, 9, 0, 9, 4, 1, 8, 0,
                      NULL, 0, 0, 0);
    classifier_ce_f64(loss, o->cdx, o->cdw, wt, wt + 500, tgt, 7, 11, 5, 0.5, 0);
    classifier_ce_f64(loss, o->cdx2, o->cdw2, wt + 50, wt + 600, tgt2, 7, 5, 5, 0.5, 0);
}

static void test_threads(void) {
    double *in = randn(1200, 1);
    ThreadOut ref, got;
    int nt0 = omp_get_max_threads();
    thread_run(&ref, in);
    const int nts[] = {1, 3, 7};
    for (int k = 0; k < 3; k++) {
        omp_set_num_threads(nts[k]);
        thread_run(&got, in);
        Cmp e = {0};
        cmp_arrays(&e, "embedding dtable", got.emb, ref.emb, 40);
        cmp_arrays(&e, "dbias", got.bg, ref.bg, 9);
        cmp_arrays(&e, "rmsnorm y", got.ry, ref.ry, 120);
        cmp_arrays(&e, "rmsnorm dx", got.rx, ref.rx, 120);
        cmp_arrays(&e, "rmsnorm dw", got.rw, ref.rw, 24);
        cmp_rel(&e, "sumsq", 0, got.ss, ref.ss);
        cmp_arrays(&e, "attention out", got.ao, ref.ao, 140 * 8);
        cmp_arrays(&e, "attention dq", got.adq, ref.adq, 140 * 8);
        cmp_arrays(&e, "attention dk", got.adk, ref.adk, 70 * 8);
        cmp_arrays(&e, "attention dv", got.adv, ref.adv, 70 * 8);
        cmp_arrays(&e, "attention out (4 heads a kv head)", got.go, ref.go, 1152);
        cmp_arrays(&e, "attention dq (4 heads a kv head)", got.gdq, ref.gdq, 1152);
        cmp_arrays(&e, "attention dk (4 heads a kv head)", got.gdk, ref.gdk, 288);
        cmp_arrays(&e, "attention dv (4 heads a kv head)", got.gdv, ref.gdv, 288);
        cmp_arrays(&e, "ce dx", got.cdx, ref.cdx, 35);
        cmp_arrays(&e, "ce dW", got.cdw, ref.cdw, 55);
        cmp_arrays(&e, "ce dx (V < N)", got.cdx2, ref.cdx2, 35);
        cmp_arrays(&e, "ce dW (V < N)", got.cdw2, ref.cdw2, 25);
        report(&e, 1e-12, "embedding/bias_grad/rmsnorm/sumsq/attention/classifier_ce on %d "
               "thread%s match %d", nts[k], nts[k] > 1 ? "s" : "", nt0);
    }
    omp_set_num_threads(nt0);
    free(in);
}

// ---- GPT-2 ops: LayerNorm, GELU, learned positions; LoRA dropout ---------------------------

typedef struct {
    int N, C;
    double eps, *x, *w, *b, *wt, *y;
    float *mean, *rstd;
} LnCtx;

static long double ln_loss(void *p) {
    LnCtx *c = p;
    layernorm_fwd_f64(c->y, c->mean, c->rstd, c->x, c->w, c->b, c->N, c->C, c->eps);
    return dot_wt(c->y, c->wt, (size_t)c->N * c->C);
}

static void test_layernorm(void) {
    LnCtx c = {.N = 5, .C = 24, .eps = 1e-5};
    size_t n = (size_t)c.N * c.C;
    c.x = randn(n, 1), c.w = randn(c.C, 1), c.b = randn(c.C, 1), c.wt = randn(n, 1), c.y = zeros(n);
    c.mean = xcalloc(c.N, sizeof(float)), c.rstd = xcalloc(c.N, sizeof(float));
    ln_loss(&c);
    Cmp e = {0};
    for (int r = 0; r < c.N; r++) {
        long double mu = 0, var = 0;
        for (int i = 0; i < c.C; i++) mu += c.x[r * c.C + i];
        mu /= c.C;
        for (int i = 0; i < c.C; i++) var += (c.x[r * c.C + i] - mu) * (c.x[r * c.C + i] - mu);
        long double rs = 1 / sqrtl(var / c.C + c.eps);
        for (int i = 0; i < c.C; i++)
            cmp_rel(&e, "y", (size_t)r * c.C + i, c.y[r * c.C + i],
                    (double)((c.x[r * c.C + i] - mu) * rs * c.w[i] + c.b[i]));
    }
    // mean/rstd are stored as float, so the forward agrees to float precision.
    report(&e, 1e-6, "layernorm fwd vs direct");
    double *dx = zeros(n), *dw = zeros(c.C), *db = zeros(c.C);
    layernorm_bwd_f64(dx, dw, db, c.wt, c.x, c.w, c.mean, c.rstd, c.N, c.C);
    // The backward uses the float statistics; finite differences see the exact ones: 1e-5.
    e = (Cmp){0};
    fd_check(&e, "dx", dx, c.x, n, 200, FD_H, ln_loss, &c);
    report(&e, 1e-5, "layernorm bwd dx vs finite differences");
    e = (Cmp){0};
    fd_check(&e, "dw", dw, c.w, c.C, 200, FD_H, ln_loss, &c);
    fd_check(&e, "db", db, c.b, c.C, 200, FD_H, ln_loss, &c);
    report(&e, 1e-5, "layernorm bwd dw, db vs finite differences");
    ln_loss(&c);
    double *bx = randn(n, 1), *bw = randn(c.C, 1), *bb = randn(c.C, 1);
    double *ax = dup_arr(bx, n), *aw = dup_arr(bw, c.C), *ab = dup_arr(bb, c.C);
    layernorm_bwd_f64(ax, aw, ab, c.wt, c.x, c.w, c.mean, c.rstd, c.N, c.C);
    e = (Cmp){0};
    accum_cmp(&e, "dx", ax, bx, dx, n);
    accum_cmp(&e, "dw", aw, bw, dw, c.C);
    accum_cmp(&e, "db", ab, bb, db, c.C);
    report(&e, ACC_TOL, "layernorm bwd dx, dw, db accumulate");
    free(c.x), free(c.w), free(c.b), free(c.wt), free(c.y), free(c.mean), free(c.rstd);
    free(dx), free(dw), free(db), free(bx), free(bw), free(bb), free(ax), free(aw), free(ab);
}

typedef struct { size_t n; double *x, *wt, *y; } GeluCtx;

static long double gelu_loss(void *p) {
    GeluCtx *c = p;
    gelu_fwd_f64(c->y, c->x, c->n);
    return dot_wt(c->y, c->wt, c->n);
}

static void test_gelu(void) {
    GeluCtx c = {.n = 300};
    c.x = randn(c.n, 1), c.wt = randn(c.n, 1), c.y = zeros(c.n);  // far tails only add FD noise
    gelu_loss(&c);
    Cmp e = {0};
    for (size_t i = 0; i < c.n; i++) {
        long double v = c.x[i];
        cmp_rel(&e, "y", i, c.y[i], (double)(0.5L * v * (1 + tanhl(sqrtl(2 / M_PI) * (v + 0.044715L * v * v * v)))));
    }
    report(&e, 1e-9, "gelu fwd vs the tanh formula");  // 1 + tanh cancels for x << 0
    double *dx = zeros(c.n);
    gelu_bwd_f64(dx, c.wt, c.x, c.n);
    e = (Cmp){0};
    fd_check(&e, "dx", dx, c.x, c.n, 300, FD_H, gelu_loss, &c);
    report(&e, FD_TOL, "gelu bwd vs finite differences");
    double *al = dup_arr(c.wt, c.n);
    gelu_bwd_f64(al, al, c.x, c.n);  // dx may alias dout
    e = (Cmp){0};
    for (size_t i = 0; i < c.n; i++) cmp_rel(&e, "alias", i, al[i], dx[i]);
    report(&e, 0, "gelu bwd with dx aliasing dout");
    free(c.x), free(c.wt), free(c.y), free(dx), free(al);
}

typedef struct { int B, T, C; double *base, *wpe, *wt, *y; } PosCtx;

static long double pos_loss(void *p) {
    PosCtx *c = p;
    size_t n = (size_t)c->B * c->T * c->C;
    memcpy(c->y, c->base, n * sizeof(double));
    pos_fwd_f64(c->y, c->wpe, c->B, c->T, c->C);
    return dot_wt(c->y, c->wt, n);
}

static void test_pos(void) {
    PosCtx c = {.B = 3, .T = 7, .C = 5};
    size_t n = (size_t)c.B * c.T * c.C, np = (size_t)c.T * c.C;
    c.base = randn(n, 1), c.wpe = randn(np, 1), c.wt = randn(n, 1), c.y = zeros(n);
    pos_loss(&c);
    Cmp e = {0};
    for (int b = 0; b < c.B; b++)
        for (size_t i = 0; i < np; i++)
            cmp_rel(&e, "y", b * np + i, c.y[b * np + i], c.base[b * np + i] + c.wpe[i]);
    report(&e, 0, "position embedding fwd adds wpe[t]");
    double *d = zeros(np);
    pos_bwd_f64(d, c.wt, c.B, c.T, c.C);
    e = (Cmp){0};
    fd_check(&e, "dwpe", d, c.wpe, np, 200, FD_H, pos_loss, &c);
    report(&e, FD_TOL, "position embedding bwd vs finite differences");
    free(c.base), free(c.wpe), free(c.wt), free(c.y), free(d);
}

static void test_dropout(void) {
    const size_t n = 20000;
    const float p = 0.25f;
    double *x = randn(n, 1), *y = zeros(n), *tail = zeros(n / 2);
    dropout_f64(y, x, n, p, 42, 0);
    size_t kept = 0;
    Cmp e = {0};
    for (size_t i = 0; i < n; i++) {
        if (y[i] != 0) kept++, cmp_rel(&e, "scale", i, y[i], x[i] / (1 - p));
    }
    report(&e, 1e-15, "dropout keeps x / (1 - p)");
    double frac = (double)kept / n;
    char detail[64];
    snprintf(detail, sizeof detail, "kept %.4f", frac);
    check(fabs(frac - (1 - p)) < 0.02, detail, "dropout keeps 1 - p of the elements");
    // A tile starting at element n/2 draws the mask the whole tensor has there.
    dropout_f64(tail, x + n / 2, n / 2, p, 42, n / 2);
    e = (Cmp){0};
    for (size_t i = 0; i < n / 2; i++) cmp_rel(&e, "tile", i, tail[i], y[n / 2 + i]);
    report(&e, 0, "dropout mask of a tile equals the whole tensor's (first offset)");
    free(x), free(y), free(tail);
}

// The CPU backend's counted allocations: every payload 64-byte aligned, those of 2 MiB and
// more on a 2 MiB boundary (their huge pages), each writable end to end (the sanitizer build
// sees an overrun), the bytes in use and the peak counted by request, all returned on free.
static void test_backend_alloc(void) {
    Backend *bk = backend_cpu_create(1);
    const size_t mib = (size_t)1 << 20;
    const size_t sizes[] = {1, 63, 64, 4096, 2 * mib - 1, 2 * mib, 2 * mib + 1, 4 * mib, 5 * mib + mib / 2, 9 * mib + 7};
    enum { N = sizeof sizes / sizeof sizes[0] };
    void *p[N], *h[N];
    size_t want = 0, misaligned = 0, peak_before = bk->mem.peak;
    for (int i = 0; i < N; i++) {
        p[i] = bk->dev_alloc(bk, sizes[i], "test");
        h[i] = bk->host_alloc(bk, sizes[i], "test");
        const size_t align = sizes[i] >= 2 * mib ? 2 * mib : 64;
        misaligned += (uintptr_t)p[i] % align != 0 || (uintptr_t)h[i] % align != 0;
        memset(p[i], 0x5a, sizes[i]);
        memset(h[i], 0xa5, sizes[i]);
        want += sizes[i];
    }
    int intact = 1;  // no allocation's header or neighbour was overwritten by another's fill
    for (int i = 0; i < N; i++)
        intact &= ((unsigned char *)p[i])[0] == 0x5a && ((unsigned char *)p[i])[sizes[i] - 1] == 0x5a &&
                  ((unsigned char *)h[i])[0] == 0xa5 && ((unsigned char *)h[i])[sizes[i] - 1] == 0xa5;
    check(misaligned == 0, "", "backend alloc: payload alignment (64 B; 2 MiB from 2 MiB up)");
    check(intact, "", "backend alloc: payloads written end to end stay intact");
    check(bk->mem.in_use == want && bk->mem.host_in_use == want && bk->mem.peak >= peak_before + want, "",
          "backend alloc: bytes in use counted by request (%zu device, %zu host, want %zu)", bk->mem.in_use,
          bk->mem.host_in_use, want);
    for (int i = 0; i < N; i++) bk->dev_free(bk, p[i]), bk->host_free(bk, h[i]);
    check(bk->mem.in_use == 0 && bk->mem.host_in_use == 0, "", "backend alloc: all returned on free");
    bk->destroy(bk);
}

// The backend's memzero: a clear of 64 MiB or more goes through non-temporal stores in 1 MiB
// chunks (each with a head to 16 bytes and a tail), a smaller one through memset; both clear
// exactly their range, here starting 3 bytes past an alignment, with the bytes around intact.
static void test_backend_memzero(void) {
    Backend *bk = backend_cpu_create(2);
    const size_t sizes[] = {((size_t)64 << 20) + 13, ((size_t)3 << 20) + 5, 100};
    for (int k = 0; k < 3; k++) {
        const size_t n = sizes[k];
        unsigned char *buf = malloc(n + 64);
        memset(buf, 0xff, n + 64);
        bk->memzero(bk, buf + 3, n, NULL);
        size_t bad = 0;
        for (size_t i = 0; i < n + 64; i++) bad += buf[i] != (i >= 3 && i < 3 + n ? 0 : 0xff);
        check(bad == 0, "", "backend memzero of %zu bytes at an odd address: exactly its range cleared (%zu bytes wrong)",
              n, bad);
        free(buf);
    }
    bk->destroy(bk);
}

int main(void) {
    rng_seed(&rng, 1234);
    test_backend_alloc();
    test_backend_memzero();
    test_matmul_fwd();
    test_linear_bwd();
    test_bias();
    test_add_accumulate_scale();
    test_swiglu();
    test_geglu(0);
    test_geglu(1);
    test_rmsnorm(1, 0);
    test_rmsnorm(1e-3, 0);  // mean(x^2) ~ eps: eps matters
    test_rmsnorm(1, 1);     // Gemma's 1 + w
    test_embedding();
    test_rope();
    test_rope_partial(16, 10);
    test_rope_partial(128, 96);  // Phi-4-mini's head

    // Attention: head ratios 1-4, lengths that leave partial 6-row groups and 16-column score
    // pieces, B 1 and 2, D 8, 12 and 16.
    test_attention(1, 1, 2, 2, 8, 400);
    test_attention(2, 7, 4, 2, 8, 400);
    test_attention(1, 65, 6, 2, 16, 60);
    test_attention(2, 64, 4, 4, 8, 40);
    test_attention(2, 130, 4, 1, 8, 30);
    test_attention(1, 129, 3, 1, 16, 30);
    test_attention(1, 37, 2, 1, 12, 30);  // D not a multiple of 8: transposes' edges
    // Longer than a key tile (256): queries past it meet two key tiles, the online softmax
    // rescales; 520 ends in a partial third.
    test_attention(1, 300, 2, 1, 8, 20);
    test_attention(1, 520, 2, 2, 8, 12);
    // Sliding windows (keys t - window + 1 .. t): shorter than a row, across and at tile
    // boundaries (key tiles are 256 keys), of one key, and past T (the plain causal mask); with GQA.
    test_attention_mask(1, 20, 4, 2, 8, 400, 5, NULL);
    test_attention_softcap(1, 9, 2, 1, 8, 0, 0.3, 0.7, 60);
    test_attention_softcap(2, 70, 4, 2, 8, 13, 0.2, 1.5, 40);
    test_attention_softcap(1, 300, 2, 1, 16, 0, 0.25, 2.0, 20);  // two key tiles: the online softmax's rescale
    test_ce_softcap(6, 11, 5, 1.5);
    test_ce_softcap(300, 7, 3, 0.8);
    test_attention_mask(2, 130, 4, 1, 8, 30, 37, NULL);
    test_attention_mask(1, 200, 6, 2, 16, 30, 64, NULL);
    test_attention_mask(1, 150, 4, 2, 8, 30, 65, NULL);
    test_attention_mask(2, 70, 4, 2, 8, 30, 1, NULL);
    test_attention_mask(1, 129, 3, 1, 16, 30, 500, NULL);
    // Windows over more than one key tile: the first tile starts mid-row and rows of a tile see
    // nothing (left of their window) while others do.
    test_attention_mask(1, 600, 2, 1, 8, 12, 300, NULL);
    test_attention_mask(1, 400, 2, 2, 8, 12, 257, NULL);
    // Documents packed in a row (doc_start), alone and with a window; a one-token document.
    static const int docs[2][8] = {{0, 50, 51, 120, -1}, {0, 70, -1}};
    test_attention_docs(2, 140, 4, 2, 8, 30, 0, docs);
    test_attention_docs(2, 140, 4, 2, 8, 30, 30, docs);
    static const int long_docs[2][8] = {{0, 40, 300, -1}, {0, 290, 291, -1}};
    test_attention_docs(2, 340, 2, 1, 8, 12, 0, long_docs);

    static const int32_t t_small[] = {3, 10, -1, 0, 3, 7, -1};
    test_ce(7, 11, 5, t_small, 0);
    // Chunks of CE_MIN_ROWS (256) rows once V > CE_CHUNK / 256 = 8192: 256 + 3 rows here.
    int32_t t_chunks[259];
    for (int n = 0; n < 259; n++) t_chunks[n] = n % 37 == 5 ? -1 : (int32_t)((n * 7919L + 3) % 8193);
    t_chunks[7] = 8192, t_chunks[8] = 0, t_chunks[257] = 8192;
    test_ce(259, 8193, 2, t_chunks, 1);
    static const int32_t t_big[] = {5, (1 << 20) - 1, -1, 0, 123457};
    test_ce(5, 1 << 20, 2, t_big, 1);  // one chunk of the batch's 5 rows
    static const int32_t t_huge[] = {(1 << 21) + 2, 77};
    test_ce(2, (1 << 21) + 3, 1, t_huge, 1);  // V > CE_CHUNK

    test_sumsq();
    test_adamw(1e-2f, 0.1f, 0.5f, 3);
    test_adamw(3e-3f, 0.0f, 1.0f, 1);
    test_adamw8(0);
    test_adamw8(1);
    test_adamw4();

    test_f32_attention(0, 70, 16);
    test_f32_attention(23, 70, 16);
    // A head dim that is not a multiple of the vector lanes (column tails, transposes' edges);
    // rows over two key tiles.
    test_f32_attention(0, 300, 20);
    test_f32_attention_chunks(0);
    test_f32_attention_chunks(300);
    test_f32_ce();
    test_f32_rmsnorm(0);
    test_f32_rmsnorm(1);
    test_threads();
    // GPT-2's ops and LoRA's dropout (after the rest, so their random inputs stay as they were).
    test_layernorm();
    test_gelu();
    test_pos();
    test_dropout();
    // Query tiles (last: their random inputs shift no other test's).
    // Tiles of the kernel's query block (256 rows) and twice it; T 600 leaves a short last tile.
    const int qb = attention_block_f32();
    test_f32_attention_tiles(qb, 0);
    test_f32_attention_tiles(qb, 37);
    test_f32_attention_tiles(2 * qb, 270);  // rows longer than a key tile, window past one
    test_f32_attention_tiles(100, 0);       // tiles that do not start on a block
    test_f32_attention_tiles(qb + 7, 37);

    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
