// comm.h: collectives behind one small interface, so the training logic never knows whether
// it runs alone, over MPI between CPU processes, or over NCCL between GPUs.
//
// Buffers are backend ("device") memory: host memory on the CPU backend. Element type is
// float32 unless a function says otherwise.
#pragma once
#include <stddef.h>

typedef struct Comm Comm;
struct Comm {
    const char *name;  // "single", "mpi"
    int rank, world, local_rank;
    double timeout_s;  // a collective that takes longer aborts the run with a clear message
    void *impl;
    void (*all_reduce_sum)(Comm *, float *buf, size_t n);
    void (*all_reduce_sum_f64)(Comm *, double *buf, size_t n);
    // recv[n] = sum over ranks of send[rank * n .. rank * n + n) (send holds world * n).
    void (*reduce_scatter_sum)(Comm *, float *recv, const float *send, size_t n);
    // recv[world * n] = concatenation of every rank's send[n].
    void (*all_gather)(Comm *, float *recv, const float *send, size_t n);
    void (*broadcast)(Comm *, void *buf, size_t bytes, int root);
    void (*barrier)(Comm *);
    void (*destroy)(Comm *);
};

// MPI when launched by mpirun (or another MPI launcher), else a single process.
Comm *comm_create(int *argc, char ***argv);
Comm *comm_single(void);
