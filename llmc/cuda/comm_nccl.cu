// comm_nccl.cu: comm.h over NCCL between GPUs (one rank per GPU), ordered on the backend's
// compute stream. The unique id travels over the bootstrap comm (MPI under mpirun) or, in the
// launcher-free mode, through the file named by LLMC_NCCL_ID_FILE (comm_file_rendezvous in
// comm.c: a file left by an earlier run is never used). The timeout of every collective is the
// boot comm's, or LLMC_COMM_TIMEOUT / 300 s when the boot comm has none.
// NOT RUN YET on a GPU: written and compiled without one; a world of one runs under the CPU
// emulator (dev/cuda/comm.cu, make test-cuda-emu); the first GPU session must run that program
// and then LLMC_FORCE_NCCL=1 (scripts/gpu_check.sh nccl).
// Collectives wait for completion (with the comm timeout) before returning, so they have the
// same semantics as the MPI path; overlapping them with compute is future work.
#include <cuda_runtime.h>
#include <nccl.h>
#ifdef LLMC_EMU
#include "nccl_emu.inc"
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
extern "C" {
#include "../backend.h"
#include "../comm.h"
#include "../util.h"
void *backend_cuda_stream(Backend *bk);
}

typedef struct {
    ncclComm_t nccl;
    cudaStream_t stream;
    ncclDataType_t act;
    Comm *boot;       // MPI (or NULL in the launcher-free mode)
    double *dbuf;     // device staging for host-side f64 reductions and broadcasts
    void *bbuf;
    size_t bbytes;
    // Pinned host staging: a copy into pageable memory would block inside cudaMemcpyAsync
    // until the collective completes, out of reach of the timeout in finish().
    double *hdbl;
    void *hbuf;
} NcclImpl;

static NcclImpl *ni(Comm *c) { return (NcclImpl *)c->impl; }

static void check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) fail("NCCL comm: %s failed: %s", what, cudaGetErrorString(e));
}

// Waits for the stream, failing after the comm timeout: a dead or hung peer stops the run.
static void finish(Comm *c, const char *op, ncclResult_t r) {
    if (r != ncclSuccess) fail("NCCL %s failed: %s", op, ncclGetErrorString(r));
    double t0 = now_ms();
    for (;;) {
        cudaError_t e = cudaStreamQuery(ni(c)->stream);
        if (e == cudaSuccess) {  // includes compute queued before the collective
            c->busy_ms += now_ms() - t0;
            return;
        }
        if (e != cudaErrorNotReady) fail("%s: %s", op, cudaGetErrorString(e));
        if ((now_ms() - t0) / 1e3 > c->timeout_s) {
            ncclCommAbort(ni(c)->nccl);
            fail("%s did not complete within %.3g s (a peer rank died or hangs; ddp_timeout or LLMC_COMM_TIMEOUT sets the limit)", op, c->timeout_s);
        }
        usleep(100);
    }
}

static size_t esize(Comm *c) { return ni(c)->act == ncclFloat32 ? 4 : 2; }

// The sums carry gradients, float whatever the act precision (comm.h): NCCL adds in fp32.
static void n_allreduce(Comm *c, void *b, size_t n) {
    finish(c, "all-reduce", ncclAllReduce(b, b, n, ncclFloat32, ncclSum, ni(c)->nccl, ni(c)->stream));
}
static void n_allreduce64(Comm *c, double *b, size_t n) {
    NcclImpl *x = ni(c);
    if (n > 64) fail("internal: host all-reduce of %zu doubles", n);
    memcpy(x->hdbl, b, n * sizeof(double));
    check(cudaMemcpyAsync(x->dbuf, x->hdbl, n * sizeof(double), cudaMemcpyHostToDevice, x->stream), "copy to device");
    ncclResult_t r = ncclAllReduce(x->dbuf, x->dbuf, n, ncclFloat64, ncclSum, x->nccl, x->stream);
    check(cudaMemcpyAsync(x->hdbl, x->dbuf, n * sizeof(double), cudaMemcpyDeviceToHost, x->stream), "copy to host");
    finish(c, "all-reduce", r);
    memcpy(b, x->hdbl, n * sizeof(double));
}
static void n_reduce_scatter(Comm *c, void *r, const void *s, size_t n) {
    // NCCL writes the result to recv; in place means recv == send + rank * n, so run on the
    // whole buffer and move this rank's block to the front as the MPI path does.
    char *base = (char *)r;
    char *mine = base + (size_t)c->rank * n * sizeof(float);
    finish(c, "reduce-scatter", ncclReduceScatter(s, mine, n, ncclFloat32, ncclSum, ni(c)->nccl, ni(c)->stream));
    if (mine != base) check(cudaMemcpyAsync(base, mine, n * sizeof(float), cudaMemcpyDeviceToDevice, ni(c)->stream), "copy");
    finish(c, "reduce-scatter", ncclSuccess);
}
static void n_all_gather(Comm *c, void *r, const void *s, size_t n) {
    finish(c, "all-gather", ncclAllGather(s, r, n, ni(c)->act, ni(c)->nccl, ni(c)->stream));
}
// One grouped send/receive per peer: NCCL has no all-to-all collective of its own.
static void n_all_to_all(Comm *c, void *r, const void *s, size_t n) {
    if (r == s) fail("internal: all-to-all in place");
    NcclImpl *x = ni(c);
    const size_t bytes = n * esize(c);
    ncclResult_t res = ncclGroupStart();
    for (int p = 0; p < c->world && res == ncclSuccess; p++) {
        res = ncclSend((const char *)s + p * bytes, n, x->act, p, x->nccl, x->stream);
        if (res == ncclSuccess) res = ncclRecv((char *)r + p * bytes, n, x->act, p, x->nccl, x->stream);
    }
    ncclResult_t end = ncclGroupEnd();
    finish(c, "all-to-all", res != ncclSuccess ? res : end);
}
static void n_broadcast(Comm *c, void *b, size_t bytes, int root) {
    NcclImpl *x = ni(c);
    if (bytes > x->bbytes) {  // host buffers (small: a pid, a flag) go through device memory
        check(cudaStreamSynchronize(x->stream), "stream synchronize");
        check(cudaFree(x->bbuf), "cudaFree");
        check(cudaFreeHost(x->hbuf), "cudaFreeHost");
        x->bbuf = x->hbuf = NULL, x->bbytes = 0;
        check(cudaMalloc(&x->bbuf, bytes), "cudaMalloc of the broadcast staging buffer");
        check(cudaMallocHost(&x->hbuf, bytes), "cudaMallocHost of the broadcast staging buffer");
        x->bbytes = bytes;
    }
    memcpy(x->hbuf, b, bytes);
    check(cudaMemcpyAsync(x->bbuf, x->hbuf, bytes, cudaMemcpyHostToDevice, x->stream), "copy to device");
    ncclResult_t r = ncclBroadcast(x->bbuf, x->bbuf, bytes, ncclUint8, root, x->nccl, x->stream);
    check(cudaMemcpyAsync(x->hbuf, x->bbuf, bytes, cudaMemcpyDeviceToHost, x->stream), "copy to host");
    finish(c, "broadcast", r);
    memcpy(b, x->hbuf, bytes);
}
static void n_barrier(Comm *c) {
    double z = 0;
    n_allreduce64(c, &z, 1);
}
static void n_destroy(Comm *c) {
    NcclImpl *x = ni(c);
    check(cudaStreamSynchronize(x->stream), "stream synchronize");
    ncclCommDestroy(x->nccl);
    check(cudaFree(x->dbuf), "cudaFree");
    check(cudaFree(x->bbuf), "cudaFree");
    check(cudaFreeHost(x->hbuf), "cudaFreeHost");
    check(cudaFreeHost(x->hdbl), "cudaFreeHost");
    if (x->boot) x->boot->destroy(x->boot);
    free(x);
    free(c);
}

// The unique id: over the bootstrap comm (MPI), or through the rendezvous file.
static void share_id(Comm *boot, int rank, int world, ncclUniqueId *id, double timeout_s) {
    if (world == 1) return;  // a world of one (LLMC_FORCE_NCCL) keeps its own id
    if (boot && boot->world > 1 && strcmp(boot->name, "env") != 0) {
        boot->broadcast(boot, id, sizeof *id, 0);
        return;
    }
    const char *path = getenv("LLMC_NCCL_ID_FILE");
    if (!path || !*path) fail("launcher-free multi-GPU runs need LLMC_NCCL_ID_FILE (a path every rank can read)");
    comm_file_rendezvous(path, rank, world, id, sizeof *id, timeout_s);
}

extern "C" Comm *comm_nccl_create(Comm *boot, int rank, int world, int local_rank, Backend *bk) {
    NcclImpl *x = (NcclImpl *)xcalloc(1, sizeof(NcclImpl));
    x->boot = boot;
    x->stream = (cudaStream_t)backend_cuda_stream(bk);
    x->act = bk->act_bytes == 4 ? ncclFloat32 : ncclBfloat16;
    // A boot comm without a timeout (single process, LLMC_FORCE_NCCL) must not hand NCCL one of
    // 0 s: every collective would then fail at its first poll.
    const double timeout_s = boot && boot->timeout_s > 0 ? boot->timeout_s : comm_default_timeout();
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) fail("ncclGetUniqueId failed");
    share_id(boot, rank, world, &id, timeout_s);
    ncclResult_t r = ncclCommInitRank(&x->nccl, world, id, rank);
    if (r != ncclSuccess) fail("ncclCommInitRank failed: %s", ncclGetErrorString(r));
    // every rank has the id now (init is collective): the rendezvous file can go
    if (world > 1 && getenv("LLMC_NCCL_ID_FILE") && (!boot || !strcmp(boot->name, "env")))
        comm_file_rendezvous_done(getenv("LLMC_NCCL_ID_FILE"), rank);
    check(cudaMalloc((void **)&x->dbuf, 64 * sizeof(double)), "cudaMalloc of the f64 staging buffer");
    check(cudaMallocHost((void **)&x->hdbl, 64 * sizeof(double)), "cudaMallocHost of the f64 staging buffer");
    Comm *c = (Comm *)xcalloc(1, sizeof(Comm));
    c->name = "nccl";
    c->rank = rank, c->world = world, c->local_rank = local_rank;
    c->timeout_s = timeout_s;
    c->impl = x;
    c->all_reduce_sum = n_allreduce;
    c->all_reduce_sum_f64 = n_allreduce64;
    c->reduce_scatter_sum = n_reduce_scatter;
    c->all_gather = n_all_gather;
    c->all_to_all = n_all_to_all;
    c->broadcast = n_broadcast;
    c->barrier = n_barrier;
    c->destroy = n_destroy;
    return c;
}
