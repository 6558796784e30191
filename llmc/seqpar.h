// seqpar.h: sequence parallelism, Ulysses-style. Each of the N ranks of a group holds T/N
// consecutive tokens of every sequence through the whole layer except attention; around
// attention one all-to-all turns "my tokens, all heads" into "all tokens, my heads" and another
// turns the result back. Query heads are split evenly (Hq divisible by N); key/value heads are
// split too when Hkv is divisible by N, else (N divisible by Hkv) each rank receives the one
// key/value head its query heads use, and the gradients of a replicated head are summed back.
//
// Layouts (act elements): sequence-sharded x_loc[B][T/N][H][D]; head-sharded x_h[B][T][h][D]
// with h = the heads of this rank. The collectives run over the comm (MPI on the CPU, NCCL on
// CUDA), the reshuffles as strided copies on the backend, so the layer code calls two functions.
#pragma once
#include <stddef.h>
#include "backend.h"
#include "comm.h"

typedef struct SeqPar {
    int n, rank;         // group size (sequence_parallel_degree) and this rank's place in it
    int T;               // tokens per sequence (global); each rank holds T / n
    int Hq, Hkv, D;      // the model's heads
    Comm *comm;
    void *send, *recv;   // staging for the all-to-alls, n blocks each
    size_t cap;          // bytes of each staging buffer
    // Head-sharded scratch for attention: q, out, dout, dq ([B][T][Hq/n][D]) and k, v, dk, dv
    // ([B][T][kv heads of this rank][D]).
    void *q, *o, *dout, *dq, *k, *v, *dk, *dv;
} SeqPar;

// Why n cannot split this model's heads or this sequence ("" when it can), for error messages.
const char *seqpar_unsupported(int n, int T, int Hq, int Hkv);
// Heads of this layout that rank r holds in the head-sharded layout: count and first.
int seqpar_heads(int n, int H, int kv);
int seqpar_first(int n, int H, int kv, int r);

// Staging and attention scratch for B sequences of T tokens (n must be the comm's world).
void seqpar_init(SeqPar *sp, Backend *bk, Comm *c, int n, int B, int T, int Hq, int Hkv, int D);
void seqpar_free(SeqPar *sp, Backend *bk);
// Device bytes seqpar_init allocates (for the memory plan).
size_t seqpar_bytes(int n, int B, int T, int Hq, int Hkv, int D, size_t act_bytes);

// The backend's attention over the whole sequence for sequence-sharded q/k/v/out of this
// rank (B x T/n tokens); lse is kept head-sharded ([B][Hq/n][T], the same size), doc_start is
// the whole sequences' document map ([B][T], or NULL). Backward writes this rank's dq/dk/dv.
void seqpar_attention_fwd(SeqPar *sp, Backend *bk, void *out, float *lse, const void *q, const void *k,
                          const void *v, int B, int window, const int32_t *doc_start, float scale,
                          float softcap);
void seqpar_attention_bwd(SeqPar *sp, Backend *bk, void *dq, void *dk, void *dv, const void *dout,
                          const void *q, const void *k, const void *v, const void *out, const float *lse, int B,
                          int window, const int32_t *doc_start, float scale, float softcap);

// x_loc [B][T/n][H][D] -> x_h [B][T][heads(r)][D] on every rank r (kv: the key/value split).
void seqpar_to_heads(SeqPar *sp, Backend *bk, void *x_h, const void *x_loc, int B, int H, int D, int kv);
// x_h [B][T][heads(r)][D] -> x_loc [B][T/n][H][D]; a replicated key/value head's pieces are
// summed in rank order (gradients).
void seqpar_to_seq(SeqPar *sp, Backend *bk, void *x_loc, const void *x_h, int B, int H, int D, int kv);
