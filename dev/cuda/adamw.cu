// dev/cuda/adamw.cu: fused AdamW (PyTorch semantics: clip scale, decoupled decay, moments, bias
// correction) against a double reference over three steps: float params in place, and bf16
// params with an fp32 master (the master is checked at fp32 tolerance, the bf16 copy must be
// the master rounded to bf16); gradients are float in both precisions; then GB/s.
#include "dev_common.cuh"
extern "C" {
#include "llmc/optim.h"  // adam8_maps, and adamw8_f32 (llmc/cpu/kernels.h): the CPU's 8-bit AdamW
}

// bitsandbytes' 8-bit AdamW (llmc/optim.h): k_adamw8 against the CPU kernel over three steps,
// bit for bit (both compute the same float operations, uncontracted): params (or the fp32
// master, whose bf16 copy must be its rounding), the moments' bytes and the blocks' absmax;
// one block of the tensor without gradient, a partial last block, decay off at step 2.
static void check_adamw8(CudaCtx *c, int bf, int torchao) {  // torchao 2: its 4-bit flavour
    const int four = torchao == 2, blk = four ? ADAM4_BLOCK : ADAM8_BLOCK;
    const size_t n = four ? 640 : 1000, nb = (n + blk - 1) / blk, nq = four ? n / 2 : n;
    float maps[512];
    if (four) adam4_maps(maps);
    else adam8_maps(maps);
    std::vector<float> p = randn(n), q = p;
    void *dp = up_act(p, bf), *dmaster = bf ? up_act(p, 0) : NULL;
    float *dmaps = (float *)up_act(std::vector<float>(maps, maps + 512), 0);
    std::vector<unsigned char> zb(nq, 0), qm(nq, 0), qv(nq, 0);
    std::vector<float> za(nb, 0.0f), am(nb, 0.0f), av(nb, 0.0f);
    unsigned char *dqm = (unsigned char *)up_bytes(zb.data(), nq), *dqv = (unsigned char *)up_bytes(zb.data(), nq);
    float *dam = (float *)up_act(za, 0), *dav = (float *)up_act(za, 0);
    for (int t = 1; t <= 3; t++) {
        std::vector<float> g = randn(n, t == 2 ? 1e-4 : 1.0);
        for (size_t i = blk; i < 2 * (size_t)blk; i++) g[i] = 0;
        float *dg = (float *)up_act(g, 0);
        const float wd = t == 2 ? 0.0f : 0.1f;
        const float b1 = t == 3 ? 0.3f : 0.9f;  // torch.lerp's other branch for torchao
        k_adamw8(c, dp, (float *)dmaster, dg, dqm, dqv, dam, dav, dmaps, n, 1e-2f, b1, 0.999f, 1e-8f, wd, 0.7f, t, torchao);
        adamw8_f32(q.data(), g.data(), qm.data(), qv.data(), am.data(), av.data(), maps, n, 1e-2f, b1, 0.999f,
                   1e-8f, wd, 0.7f, t, torchao);
        cudaFree(dg);
    }
    std::vector<unsigned char> gqm(nq), gqv(nq);
    CUDA_CHECK(dev_copy(gqm.data(), dqm, nq, cudaMemcpyDeviceToHost));
    CUDA_CHECK(dev_copy(gqv.data(), dqv, nq, cudaMemcpyDeviceToHost));
    std::vector<float> gam = down_f32(dam, nb), gav = down_f32(dav, nb);
    std::vector<float> w = bf ? down_f32((float *)dmaster, n) : down_act(dp, n, 0);
    char name[96];
    snprintf(name, sizeof name, "adamw8 %s %s: weights, bytes and absmax after 3 steps equal the CPU kernel's",
             four ? "torchao 4-bit" : torchao ? "torchao" : "bitsandbytes", prec(bf));
    check_true(name, !memcmp(w.data(), q.data(), n * 4) && gqm == qm && gqv == qv && gam == am && gav == av, "differ");
    if (bf) {
        std::vector<float> pb = down_act(dp, n, 1), mr = w;
        round_act(mr, 1);
        check_true("adamw8 bf16 params are the master rounded", !memcmp(mr.data(), pb.data(), n * 4), "differ");
    }
    cudaFree(dp), cudaFree(dmaster), cudaFree(dmaps), cudaFree(dqm), cudaFree(dqv), cudaFree(dam), cudaFree(dav);
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    for (int bf = 0; bf < 2; bf++) {
        CudaCtx *c = cuda_ctx_create(bf, 0);
        const size_t n = 1003;
        const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
        std::vector<float> p = randn(n), m0(n, 0.0f), v0(n, 0.0f);
        std::vector<double> rp = to_d(p), rm(n, 0), rv(n, 0);
        void *dp = up_act(p, bf), *dmaster = bf ? up_act(p, 0) : NULL;
        float *dm = (float *)up_act(m0, 0), *dv = (float *)up_act(v0, 0);
        if (bf) {  // the bf16 params start as the master rounded
            std::vector<float> pr = p;
            round_act(pr, 1);
            CUDA_CHECK(dev_copy(dp, up_act(pr, 1), n * 2, cudaMemcpyDeviceToDevice));
        }
        for (int t = 1; t <= 3; t++) {
            std::vector<float> g = randn(n);  // a float gradient: not rounded in either precision
            float *dg = (float *)up_act(g, 0);
            k_adamw(c, dp, (float *)dmaster, dg, dm, dv, n, lr, b1, b2, eps, wd, gs, t);
            const double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
            for (size_t i = 0; i < n; i++) {
                double gr = g[i] * (double)gs, w = rp[i] * (1 - (double)lr * wd);
                rm[i] = b1 * rm[i] + (1 - (double)b1) * gr;
                rv[i] = b2 * rv[i] + (1 - (double)b2) * gr * gr;
                rp[i] = w - lr / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + eps);
            }
            cudaFree(dg);
        }
        char name[64];
        snprintf(name, sizeof name, "adamw %s m after 3 steps", prec(bf));
        check(name, down_f32(dm, n), rm, 1e-5);
        snprintf(name, sizeof name, "adamw %s v after 3 steps", prec(bf));
        check(name, down_f32(dv, n), rv, 1e-5);
        if (bf) {
            std::vector<float> master = down_f32((float *)dmaster, n), pb = down_act(dp, n, 1), mr = master;
            check("adamw bf16 fp32 master after 3 steps", master, rp, 1e-5);
            round_act(mr, 1);
            check_true("adamw bf16 params are the master rounded", !memcmp(mr.data(), pb.data(), n * 4), "differ");
        } else {
            check("adamw fp32 params after 3 steps", down_act(dp, n, 0), rp, 1e-5);
        }
        if (!g_quick) {
            const size_t N = (size_t)1 << 27, es = bf ? 2 : 4;
            void *P = dmalloc(N * es), *G = dmalloc(N * 4), *M = dmalloc(N * 4), *Vv = dmalloc(N * 4),
                 *Ms = bf ? dmalloc(N * 4) : NULL;
            dev_noise(P, N * es, es);
            dev_noise(G, N * 4, 4);
            dev_noise(M, N * 4, 4);
            dev_noise(Vv, N * 4, 4, 0.0f, 1.0f);  // second moments: not negative
            if (Ms) dev_noise(Ms, N * 4, 4);
            snprintf(name, sizeof name, "adamw %s n=2^27", prec(bf));
            report_bw(name, bench_ms(c, 10, [&] { k_adamw(c, P, (float *)Ms, (const float *)G, (float *)M, (float *)Vv, N, lr, b1, b2, eps, wd, gs, 5); }),
                      (double)N * (2 * es + 20 + (bf ? 8 : 0)));
            cudaFree(P), cudaFree(G), cudaFree(M), cudaFree(Vv), cudaFree(Ms);
        }
        cudaFree(dp), cudaFree(dmaster), cudaFree(dm), cudaFree(dv);
        check_adamw8(c, bf, 0);
        check_adamw8(c, bf, 1);
        check_adamw8(c, bf, 2);
        cuda_ctx_destroy(c);
    }
    return dev_finish("adamw");
}
