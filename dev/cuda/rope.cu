// dev/cuda/rope.cu: RoPE forward and inverse (backward) in place against a double reference
// (HF rotate_half pairs i, i + rot/2 over each head's first rot dimensions, the rest passed;
// tables [T, rot/2]); then GB/s.
#include "dev_common.cuh"

static void one(CudaCtx *c, int B, int T, int H, int D, int rot = 0) {
    if (!rot) rot = D;
    const int bf = c->bf16, half = rot / 2;
    char name[96];
    std::vector<float> x = randn((size_t)B * T * H * D), cs((size_t)T * half), sn((size_t)T * half);
    round_act(x, bf);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            float ang = (float)t * powf(10000.0f, -2.0f * i / rot);
            cs[(size_t)t * half + i] = cosf(ang), sn[(size_t)t * half + i] = sinf(ang);
        }
    void *dx = up_act(x, bf), *dc = up_act(cs, 0), *ds = up_act(sn, 0);
    for (int sign = 1; sign >= -1; sign -= 2) {
        std::vector<double> ref(x.begin(), x.end());  // dimensions past rot pass
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < H; h++) {
                    size_t base = (((size_t)b * T + t) * H + h) * D;
                    for (int i = 0; i < half; i++) {
                        double a = x[base + i], e = x[base + i + half], co = cs[(size_t)t * half + i],
                               s = sign * (double)sn[(size_t)t * half + i];
                        ref[base + i] = a * co - e * s;
                        ref[base + i + half] = e * co + a * s;
                    }
                }
        CUDA_CHECK(dev_copy(dx, up_act(x, bf), x.size() * (bf ? 2 : 4), cudaMemcpyDeviceToDevice));
        k_rope(c, dx, (const float *)dc, (const float *)ds, NULL, B, T, H, D, rot, sign);
        snprintf(name, sizeof name, "rope_%s %s B=%d T=%d H=%d D=%d rot=%d", sign > 0 ? "fwd" : "bwd", prec(bf), B, T, H,
                 D, rot);
        check(name, down_act(dx, x.size(), bf), ref, tol_for(bf));
    }
    cudaFree(dx), cudaFree(dc), cudaFree(ds);
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    for (int bf = 0; bf < 2; bf++) {
        CudaCtx *c = cuda_ctx_create(bf, 0);
        one(c, 2, 13, 3, 16);
        one(c, 1, 40, 2, 6);
        one(c, 2, 13, 3, 16, 10);  // partial rotary
        one(c, 1, 9, 2, 128, 96);  // Phi-4-mini's head
        if (!g_quick) {
            const int B = 4, T = 4096, H = 32, D = 128;
            const size_t es = bf ? 2 : 4, n = (size_t)B * T * H * D;
            void *x = dmalloc(n * es), *cs = dmalloc((size_t)T * D / 2 * 4), *sn = dmalloc((size_t)T * D / 2 * 4);
            dev_noise(x, n * es, es);
            dev_noise(cs, (size_t)T * D / 2 * 4, 4);
            dev_noise(sn, (size_t)T * D / 2 * 4, 4);
            char name[64];
            snprintf(name, sizeof name, "rope_fwd %s B=%d T=%d H=%d D=%d", prec(bf), B, T, H, D);
            report_bw(name, bench_ms(c, 20, [&] { k_rope(c, x, (float *)cs, (float *)sn, NULL, B, T, H, D, D, 1); }), 2.0 * n * es);
            cudaFree(x), cudaFree(cs), cudaFree(sn);
        }
        cuda_ctx_destroy(c);
    }
    return dev_finish("rope");
}
