// comm_nccl.cu: comm.h over NCCL between GPUs (one rank per GPU), ordered on the backend's
// compute stream. The unique id travels over the bootstrap comm (MPI under mpirun) or, in the
// launcher-free mode, through a file named by LLMC_NCCL_ID_FILE that rank 0 writes.
// NOT RUN YET: written and compiled without a GPU; the first multi-GPU session must test it.
// Collectives wait for completion (with the comm timeout) before returning, so they have the
// same semantics as the MPI path; overlapping them with compute is future work.
#include <cuda_runtime.h>
#include <nccl.h>
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
} NcclImpl;

static NcclImpl *ni(Comm *c) { return (NcclImpl *)c->impl; }

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
            fail("%s did not complete within %.0f s (a peer rank died or hangs)", op, c->timeout_s);
        }
        usleep(100);
    }
}

static size_t esize(Comm *c) { return ni(c)->act == ncclFloat32 ? 4 : 2; }

static void n_allreduce(Comm *c, void *b, size_t n) {
    finish(c, "all-reduce", ncclAllReduce(b, b, n, ni(c)->act, ncclSum, ni(c)->nccl, ni(c)->stream));
}
static void n_allreduce64(Comm *c, double *b, size_t n) {
    NcclImpl *x = ni(c);
    if (n > 64) fail("internal: host all-reduce of %zu doubles", n);
    cudaMemcpyAsync(x->dbuf, b, n * sizeof(double), cudaMemcpyHostToDevice, x->stream);
    ncclResult_t r = ncclAllReduce(x->dbuf, x->dbuf, n, ncclFloat64, ncclSum, x->nccl, x->stream);
    cudaMemcpyAsync(b, x->dbuf, n * sizeof(double), cudaMemcpyDeviceToHost, x->stream);
    finish(c, "all-reduce", r);
}
static void n_reduce_scatter(Comm *c, void *r, const void *s, size_t n) {
    // NCCL writes the result to recv; in place means recv == send + rank * n, so run on the
    // whole buffer and move this rank's block to the front as the MPI path does.
    char *base = (char *)r;
    char *mine = base + (size_t)c->rank * n * esize(c);
    finish(c, "reduce-scatter", ncclReduceScatter(s, mine, n, ni(c)->act, ncclSum, ni(c)->nccl, ni(c)->stream));
    if (mine != base) cudaMemcpyAsync(base, mine, n * esize(c), cudaMemcpyDeviceToDevice, ni(c)->stream);
    finish(c, "reduce-scatter", ncclSuccess);
}
static void n_all_gather(Comm *c, void *r, const void *s, size_t n) {
    finish(c, "all-gather", ncclAllGather(s, r, n, ni(c)->act, ni(c)->nccl, ni(c)->stream));
}
static void n_broadcast(Comm *c, void *b, size_t bytes, int root) {
    NcclImpl *x = ni(c);
    if (bytes > x->bbytes) {  // host buffers (small: a pid, a flag) go through device memory
        cudaFree(x->bbuf);
        cudaMalloc(&x->bbuf, bytes);
        x->bbytes = bytes;
    }
    cudaMemcpyAsync(x->bbuf, b, bytes, cudaMemcpyHostToDevice, x->stream);
    ncclResult_t r = ncclBroadcast(x->bbuf, x->bbuf, bytes, ncclUint8, root, x->nccl, x->stream);
    cudaMemcpyAsync(b, x->bbuf, bytes, cudaMemcpyDeviceToHost, x->stream);
    finish(c, "broadcast", r);
}
static void n_barrier(Comm *c) {
    double z = 0;
    n_allreduce64(c, &z, 1);
}
static void n_destroy(Comm *c) {
    NcclImpl *x = ni(c);
    ncclCommDestroy(x->nccl);
    cudaFree(x->dbuf);
    cudaFree(x->bbuf);
    if (x->boot) x->boot->destroy(x->boot);
    free(x);
    free(c);
}

// The unique id: over the bootstrap comm, or through a file rank 0 writes (renamed into
// place so a reader never sees half of it).
static void share_id(Comm *boot, int rank, ncclUniqueId *id) {
    if (!boot || boot->world == 1) return;  // a world of one (LLMC_FORCE_NCCL) keeps its own id
    if (boot->world > 1 && strcmp(boot->name, "env") != 0) {
        boot->broadcast(boot, id, sizeof *id, 0);
        return;
    }
    const char *path = getenv("LLMC_NCCL_ID_FILE");
    if (!path || !*path) fail("launcher-free multi-GPU runs need LLMC_NCCL_ID_FILE (a path every rank can read)");
    if (rank == 0) {
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0)
            fail("%s: cannot write the NCCL id", path);
        return;
    }
    for (int i = 0; i < 6000; i++) {  // up to 10 minutes for rank 0 to start
        FILE *f = fopen(path, "rb");
        if (f) {
            size_t got = fread(id, sizeof *id, 1, f);
            fclose(f);
            if (got == 1) return;
        }
        usleep(100000);
    }
    fail("%s: rank 0 did not write the NCCL id within 10 minutes", path);
}

extern "C" Comm *comm_nccl_create(Comm *boot, int rank, int world, int local_rank, Backend *bk) {
    NcclImpl *x = (NcclImpl *)xcalloc(1, sizeof(NcclImpl));
    x->boot = boot;
    x->stream = (cudaStream_t)backend_cuda_stream(bk);
    x->act = bk->act_bytes == 4 ? ncclFloat32 : ncclBfloat16;
    ncclUniqueId id;
    if (rank == 0 && ncclGetUniqueId(&id) != ncclSuccess) fail("ncclGetUniqueId failed");
    share_id(boot, rank, &id);
    ncclResult_t r = ncclCommInitRank(&x->nccl, world, id, rank);
    if (r != ncclSuccess) fail("ncclCommInitRank failed: %s", ncclGetErrorString(r));
    cudaMalloc((void **)&x->dbuf, 64 * sizeof(double));
    Comm *c = (Comm *)xcalloc(1, sizeof(Comm));
    c->name = "nccl";
    c->rank = rank, c->world = world, c->local_rank = local_rank;
    c->timeout_s = boot ? boot->timeout_s : 300;
    c->impl = x;
    c->all_reduce_sum = n_allreduce;
    c->all_reduce_sum_f64 = n_allreduce64;
    c->reduce_scatter_sum = n_reduce_scatter;
    c->all_gather = n_all_gather;
    c->broadcast = n_broadcast;
    c->barrier = n_barrier;
    c->destroy = n_destroy;
    return c;
}
