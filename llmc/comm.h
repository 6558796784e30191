// comm.h: collectives behind one small interface, so the training logic never knows whether
// it runs alone, over MPI between CPU processes, or over NCCL between GPUs.
//
// Buffers are backend ("device") memory: host memory on the CPU backend. Elements are the
// backend's act precision (float32 on the CPU; bf16 or float32 over NCCL) unless a function
// says otherwise; the f64 reduction and broadcast take host memory.
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
struct Backend;
Comm *comm_nccl_create(Comm *boot, int rank, int world, int local_rank, struct Backend *bk);
