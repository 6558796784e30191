// backend_cuda_stub.c: what a build without CUDA links instead of llmc/cuda/*.cu (no nvcc at
// build time, or USE_CUDA=0 as in `make test-asan`), so the program needs no #ifdef to ask.
#include <stdio.h>
#include "../backend.h"
#include "../comm.h"
#include "../util.h"

int backend_cuda_available(char *why, size_t cap) {
    if (why && cap) snprintf(why, cap, "this build has no CUDA support (nvcc was not found when it was built)");
    return 0;
}

Backend *backend_cuda_create(int dtype_bf16, int device_index) {
    (void)dtype_bf16, (void)device_index;
    fail("device: cuda: this build has no CUDA support (nvcc was not found when it was built); use device: cpu");
}

Comm *comm_nccl_create(Comm *boot, int rank, int world, int local_rank, struct Backend *bk) {
    (void)boot, (void)rank, (void)world, (void)local_rank, (void)bk;
    fail("several GPU ranks need NCCL: this build has no CUDA support");
}
