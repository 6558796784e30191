// Scratch timing of 2026-11-28 (dev/results/cpu_performance_log.md, that day's entry): a packed
// 6 x 16 AVX2 GEMM against OpenBLAS's cblas_sgemm on the small bench step's eleven product
// shapes, 1 thread, best of 9. Kept as the record of that measurement, not built by the Makefile
// and not used by the trainer. Reproduce (#define KC below: 256, 384 and 768 were timed):
//   gcc -O3 -mavx2 -mfma -std=gnu11 dev/results/scratch_gemm_2026-11-28.c -o /tmp/g -lopenblas
//   OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1 taskset -c 0 /tmp/g

#include <immintrin.h>
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
#define MR 6
#define NR 16
#define KC 256
#define MC 96
#define NC 512
// C[6,16] (+)= Ap[k][6] * Bp[k][16]
static inline void kern(int kc, const float *ap, const float *bp, float *c, int ldc, int first) {
    __m256 c00,c01,c10,c11,c20,c21,c30,c31,c40,c41,c50,c51;
    if (first) { c00=c01=c10=c11=c20=c21=c30=c31=c40=c41=c50=c51=_mm256_setzero_ps(); }
    else {
#define LD(i) c##i##0=_mm256_loadu_ps(c+i*ldc); c##i##1=_mm256_loadu_ps(c+i*ldc+8);
        LD(0) LD(1) LD(2) LD(3) LD(4) LD(5)
    }
    for (int k = 0; k < kc; k++, ap += MR, bp += NR) {
        __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8), a;
#define F(i) a=_mm256_broadcast_ss(ap+i); c##i##0=_mm256_fmadd_ps(a,b0,c##i##0); c##i##1=_mm256_fmadd_ps(a,b1,c##i##1);
        F(0) F(1) F(2) F(3) F(4) F(5)
    }
#define ST(i) _mm256_storeu_ps(c+i*ldc,c##i##0); _mm256_storeu_ps(c+i*ldc+8,c##i##1);
    ST(0) ST(1) ST(2) ST(3) ST(4) ST(5)
}
// op(A)(i,k): ta ? A[k*lda+i] : A[i*lda+k];  op(B)(k,j): tb ? B[j*ldb+k] : B[k*ldb+j]
static void gemm(int ta, int tb, int M, int N, int K, const float *A, int lda, const float *B, int ldb, float *C, int ldc) {
    static float *Ap, *Bp; static float *Ct;
    if (!Ap) { Ap = aligned_alloc(64, sizeof(float)*(MC+MR)*KC); Bp = aligned_alloc(64, sizeof(float)*KC*(NC+NR)); Ct = aligned_alloc(64, 4*MR*NR);}
    for (int j0 = 0; j0 < N; j0 += NC) {
        int nc = N - j0 < NC ? N - j0 : NC;
        for (int k0 = 0; k0 < K; k0 += KC) {
            int kc = K - k0 < KC ? K - k0 : KC;
            // pack B block [kc x nc] into panels of 16
            for (int jp = 0; jp < nc; jp += NR) {
                float *d = Bp + (size_t)jp * kc;
                int w = nc - jp < NR ? nc - jp : NR;
                if (!tb) for (int k = 0; k < kc; k++) { const float *s = B + (size_t)(k0+k)*ldb + j0+jp; for (int l=0;l<NR;l++) d[k*NR+l] = l<w ? s[l] : 0; }
                else for (int l = 0; l < NR; l++) { if (l>=w) { for (int k=0;k<kc;k++) d[k*NR+l]=0; continue; } const float *s = B + (size_t)(j0+jp+l)*ldb + k0; for (int k = 0; k < kc; k++) d[k*NR+l] = s[k]; }
            }
            for (int i0 = 0; i0 < M; i0 += MC) {
                int mc = M - i0 < MC ? M - i0 : MC;
                for (int ip = 0; ip < mc; ip += MR) {
                    float *d = Ap + (size_t)ip * kc; int h = mc - ip < MR ? mc - ip : MR;
                    if (ta) for (int k = 0; k < kc; k++) { const float *s = A + (size_t)(k0+k)*lda + i0+ip; for (int r=0;r<MR;r++) d[k*MR+r] = r<h ? s[r] : 0; }
                    else for (int r = 0; r < MR; r++) { if (r>=h) {for(int k=0;k<kc;k++) d[k*MR+r]=0; continue;} const float *s = A + (size_t)(i0+ip+r)*lda + k0; for (int k = 0; k < kc; k++) d[k*MR+r] = s[k]; }
                }
                for (int jp = 0; jp < nc; jp += NR)
                    for (int ip = 0; ip < mc; ip += MR) {
                        int h = mc - ip < MR ? mc - ip : MR, w = nc - jp < NR ? nc - jp : NR;
                        float *c = C + (size_t)(i0+ip)*ldc + j0+jp;
                        if (h == MR && w == NR) kern(kc, Ap + (size_t)ip*kc, Bp + (size_t)jp*kc, c, ldc, k0 == 0);
                        else { for (int r=0;r<h;r++) for(int l=0;l<w;l++) Ct[r*NR+l]= k0? c[r*ldc+l]:0; kern(kc, Ap+(size_t)ip*kc, Bp+(size_t)jp*kc, Ct, NR, 0); for (int r=0;r<h;r++) for(int l=0;l<w;l++) c[r*ldc+l]=Ct[r*NR+l]; }
                    }
            }
        }
    }
}
int main(void) {
    static const int sh[][5] = {{0,1,2048,256,256},{0,1,2048,688,256},{0,1,2048,256,688},{0,1,2048,128,256},
                                {0,0,2048,256,256},{0,0,2048,256,688},{0,0,2048,688,256},
                                {1,0,256,256,2048},{1,0,688,256,2048},{1,0,256,688,2048},{1,0,128,256,2048}};
    for (size_t s = 0; s < sizeof sh / sizeof *sh; s++) {
        int ta=sh[s][0], tb=sh[s][1], M=sh[s][2], N=sh[s][3], K=sh[s][4];
        float *A = malloc(4*(size_t)M*K), *B = malloc(4*(size_t)K*N), *C = malloc(4*(size_t)M*N), *C2 = malloc(4*(size_t)M*N);
        for (size_t i=0;i<(size_t)M*K;i++) A[i]=(float)((i*7)%13)*0.1f-0.6f;
        for (size_t i=0;i<(size_t)K*N;i++) B[i]=(float)((i*5)%11)*0.1f-0.5f;
        int lda = ta ? M : K, ldb = tb ? K : N;
        double tb_=1e9, to=1e9;
        for (int r = 0; r < 9; r++) {
            double t0=now(); cblas_sgemm(CblasRowMajor, ta?CblasTrans:CblasNoTrans, tb?CblasTrans:CblasNoTrans, M,N,K,1.0f,A,lda,B,ldb,0.0f,C,N); double t1=now();
            gemm(ta,tb,M,N,K,A,lda,B,ldb,C2,N); double t2=now();
            if (t1-t0<tb_) tb_=t1-t0; if (t2-t1<to) to=t2-t1;
        }
        double md=0; for (size_t i=0;i<(size_t)M*N;i++){double d=C[i]-C2[i]; if(d<0)d=-d; if(d>md)md=d;}
        double fl=2.0*M*N*K;
        printf("%s%s M %4d N %4d K %4d: openblas %5.1f ours %5.1f GFLOP/s (%.2fx) maxdiff %.1e\n", ta?"T":"N", tb?"T":"N", M,N,K, fl/tb_*1e-9, fl/to*1e-9, tb_/to, md);
    }
}
