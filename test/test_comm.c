// test_comm.c: the comm.h collectives that sequence parallelism adds, run by test/test_comm.py
// as one process and under `mpirun -np N`. Each rank checks what it received against the
// values every other rank must have sent, so a wrong block order or a missing peer fails.
#include <stdio.h>
#include <stdlib.h>
#include "llmc/comm.h"
#include "llmc/util.h"

static float value(int from, int to, size_t i) { return (float)(from * 100000 + to * 1000) + (float)i; }

int main(int argc, char **argv) {
    Comm *c = comm_create(&argc, &argv);
    const int W = c->world, me = c->rank;
    int bad = 0;
    for (size_t n = 1; n <= 777; n += 388) {  // 1, 389, 777 elements per block
        float *send = xmalloc(sizeof(float) * n * W), *recv = xmalloc(sizeof(float) * n * W);
        for (int to = 0; to < W; to++)
            for (size_t i = 0; i < n; i++) send[to * n + i] = value(me, to, i), recv[to * n + i] = -1;
        c->all_to_all(c, recv, send, n);
        for (int from = 0; from < W; from++)
            for (size_t i = 0; i < n; i++)
                if (recv[from * n + i] != value(from, me, i)) {
                    if (!bad) fprintf(stderr, "rank %d: block %d element %zu is %g, expected %g\n", me, from, i,
                                      recv[from * n + i], value(from, me, i));
                    bad++;
                }
        free(send), free(recv);
    }
    double b = bad;
    c->all_reduce_sum_f64(c, &b, 1);
    if (me == 0) {
        if (b == 0) printf("PASS all-to-all over %s, world %d (3 block sizes)\n", c->name, W);
        else printf("FAIL all-to-all over %s, world %d: %.0f wrong elements\n", c->name, W, b);
    }
    c->destroy(c);
    return b == 0 ? 0 : 1;
}
