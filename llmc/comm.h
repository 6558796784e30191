// comm.h: collectives behind one small interface, so the training logic never knows whether
// it runs alone, over MPI between CPU processes, or over NCCL between GPUs.
//
// Buffers are backend ("device") memory: host memory on the CPU backend. The sums
// (all_reduce_sum, reduce_scatter_sum) carry gradients: float32 elements on every backend
// (backend.h keeps parameter gradients in float), summed in float. all_gather and all_to_all
// move weights and activations: the backend's act precision (float32 on the CPU; bf16 or
// float32 over NCCL). The f64 reduction and broadcast take host memory.
#pragma once
#include <stddef.h>

typedef struct Comm Comm;
struct Comm {
    const char *name;  // "single", "mpi", "env" (launcher-free, before NCCL), "nccl"
    int rank, world, local_rank;
    double timeout_s;  // a collective that takes longer aborts the run with a clear message
    double busy_ms;    // wall time spent inside collectives so far (for the step report)
    void *impl;
    void (*all_reduce_sum)(Comm *, void *buf, size_t n);
    void (*all_reduce_sum_f64)(Comm *, double *buf, size_t n);
    // recv[n] = sum over ranks of send[rank * n .. rank * n + n) (send holds world * n).
    // In place (recv == send) the result lands in recv's first n elements.
    void (*reduce_scatter_sum)(Comm *, void *recv, const void *send, size_t n);
    // recv[world * n] = concatenation of every rank's send[n].
    void (*all_gather)(Comm *, void *recv, const void *send, size_t n);
    // Block j of send (send holds world blocks of n) goes to rank j; block i of recv comes
    // from rank i (sequence parallelism: sequence-sharded <-> head-sharded). recv != send.
    void (*all_to_all)(Comm *, void *recv, const void *send, size_t n);
    void (*broadcast)(Comm *, void *buf, size_t bytes, int root);
    void (*barrier)(Comm *);
    void (*destroy)(Comm *);
};

// MPI when launched by mpirun (or another MPI launcher); else, with WORLD_SIZE > 1 in the
// environment (RANK, WORLD_SIZE, LOCAL_RANK), a launcher-free comm that only knows its rank
// until comm_nccl_create replaces it; else a single process.
Comm *comm_create(int *argc, char ***argv);
Comm *comm_single(void);
// NCCL between GPUs on the CUDA backend's compute stream; boot (MPI, or the launcher-free
// comm) shares the unique id (launcher-free: through the file $LLMC_NCCL_ID_FILE) and is
// owned by the result. Not yet run on GPUs.
// Launcher-free NCCL needs no MPI: RANK, WORLD_SIZE, LOCAL_RANK and LLMC_NCCL_ID_FILE (a path
// on a file system every rank sees); LLMC_COMM_TIMEOUT (seconds, default 300) bounds every
// collective and the rendezvous. NCCL runs on the GPU of LOCAL_RANK.
struct Backend;
Comm *comm_nccl_create(Comm *boot, int rank, int world, int local_rank, struct Backend *bk);
// LLMC_COMM_TIMEOUT if set and positive, else 300 s.
double comm_default_timeout(void);
// Rank 0 publishes `bytes` of blob through the file `path`; every other rank of the same run
// receives them. Stale files of earlier runs are never used (each process answers with a fresh
// nonce that rank 0 must echo); fails after timeout_s naming what is missing. Rank 0 removes
// the file with comm_file_rendezvous_done once every rank is known to have read it.
void comm_file_rendezvous(const char *path, int rank, int world, void *blob, size_t bytes, double timeout_s);
void comm_file_rendezvous_done(const char *path, int rank);
