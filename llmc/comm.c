// comm.c: the single-process and MPI implementations of comm.h. MPI collectives run under a
// watchdog: if a peer died or hangs, the others stop with a message instead of waiting
// forever.
#include "comm.h"
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util.h"

// ---- single process: every collective is the identity -----------------------------------
static void s_allreduce(Comm *c, void *b, size_t n) { (void)c, (void)b, (void)n; }
static void s_allreduce64(Comm *c, double *b, size_t n) { (void)c, (void)b, (void)n; }
static void s_reduce_scatter(Comm *c, void *r, const void *s, size_t n) {
    (void)c;
    if (r != s) memmove(r, s, n * sizeof(float));
}
static void s_all_gather(Comm *c, void *r, const void *s, size_t n) {
    (void)c;
    if (r != s) memmove(r, s, n * sizeof(float));
}
static void s_broadcast(Comm *c, void *b, size_t n, int root) { (void)c, (void)b, (void)n, (void)root; }
static void s_barrier(Comm *c) { (void)c; }
static void s_destroy(Comm *c) { free(c); }

Comm *comm_single(void) {
    Comm *c = xcalloc(1, sizeof(Comm));
    *c = (Comm){.name = "single", .rank = 0, .world = 1, .local_rank = 0, .timeout_s = 0,
                .all_reduce_sum = s_allreduce, .all_reduce_sum_f64 = s_allreduce64,
                .reduce_scatter_sum = s_reduce_scatter, .all_gather = s_all_gather,
                .broadcast = s_broadcast, .barrier = s_barrier, .destroy = s_destroy};
    return c;
}

// ---- MPI ---------------------------------------------------------------------------------
typedef struct {
    pthread_t watchdog;
    pthread_mutex_t lock;
    const char *op;     // the collective in flight, NULL when idle
    double started;
    int stop;
} MpiImpl;

static void *watchdog_main(void *arg) {
    Comm *c = arg;
    MpiImpl *mi = c->impl;
    for (;;) {
        usleep(200000);
        pthread_mutex_lock(&mi->lock);
        int stop = mi->stop;
        const char *op = mi->op;
        double age = op ? (now_ms() - mi->started) / 1e3 : 0;
        pthread_mutex_unlock(&mi->lock);
        if (stop) return NULL;
        if (op && age > c->timeout_s) {
            fprintf(stderr, "error: rank %d: %s did not complete within %.0f s (a peer rank died or "
                    "hangs); aborting\n", c->rank, op, c->timeout_s);
            fflush(stderr);
            MPI_Abort(MPI_COMM_WORLD, 3);
            _exit(3);
        }
    }
}

static void enter(Comm *c, const char *op) {
    MpiImpl *mi = c->impl;
    pthread_mutex_lock(&mi->lock);
    mi->op = op;
    mi->started = now_ms();
    pthread_mutex_unlock(&mi->lock);
}


static void leave(Comm *c, int rc) {
    MpiImpl *mi = c->impl;
    pthread_mutex_lock(&mi->lock);
    const char *op = mi->op;
    mi->op = NULL;
    c->busy_ms += now_ms() - mi->started;
    pthread_mutex_unlock(&mi->lock);
    if (rc != MPI_SUCCESS) fail("MPI %s failed (code %d)", op, rc);
}

static void m_allreduce(Comm *c, void *b, size_t n) {
    enter(c, "all-reduce");
    leave(c, MPI_Allreduce(MPI_IN_PLACE, b, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD));
}
static void m_allreduce64(Comm *c, double *b, size_t n) {
    enter(c, "all-reduce");
    leave(c, MPI_Allreduce(MPI_IN_PLACE, b, (int)n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
}
static void m_reduce_scatter(Comm *c, void *r, const void *s, size_t n) {
    enter(c, "reduce-scatter");
    // In place: the input is all of r and the result lands in its first n elements.
    leave(c, MPI_Reduce_scatter_block(s == r ? MPI_IN_PLACE : s, r, (int)n, MPI_FLOAT, MPI_SUM,
                                      MPI_COMM_WORLD));
}
static void m_all_gather(Comm *c, void *r, const void *s, size_t n) {
    enter(c, "all-gather");
    // In place when the send block already sits at this rank's place in recv.
    const void *src = (const float *)s == (float *)r + (size_t)c->rank * n ? MPI_IN_PLACE : s;
    leave(c, MPI_Allgather(src, (int)n, MPI_FLOAT, r, (int)n, MPI_FLOAT, MPI_COMM_WORLD));
}
static void m_broadcast(Comm *c, void *b, size_t n, int root) {
    enter(c, "broadcast");
    leave(c, MPI_Bcast(b, (int)n, MPI_BYTE, root, MPI_COMM_WORLD));
}
static void m_barrier(Comm *c) {
    enter(c, "barrier");
    leave(c, MPI_Barrier(MPI_COMM_WORLD));
}
static void m_destroy(Comm *c) {
    MpiImpl *mi = c->impl;
    pthread_mutex_lock(&mi->lock);
    mi->stop = 1;
    pthread_mutex_unlock(&mi->lock);
    pthread_join(mi->watchdog, NULL);
    MPI_Finalize();
    free(mi);
    free(c);
}

// A launcher sets one of these; without them MPI is not initialised at all, so a plain run
// needs no MPI runtime.
static int launched_by_mpi(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

// Launcher-free: rank and world from the environment; collectives need NCCL, which
// comm_nccl_create brings once the CUDA backend exists.
static void e_none(Comm *c) { (void)c; fail("launcher-free runs (WORLD_SIZE) need the CUDA backend and NCCL; use mpirun for CPU processes"); }
static void e_allreduce(Comm *c, void *b, size_t n) { (void)b, (void)n; e_none(c); }
static void e_allreduce64(Comm *c, double *b, size_t n) { (void)b, (void)n; e_none(c); }
static void e_rs(Comm *c, void *r, const void *s, size_t n) { (void)r, (void)s, (void)n; e_none(c); }
static void e_bcast(Comm *c, void *b, size_t n, int root) { (void)b, (void)n, (void)root; e_none(c); }

static Comm *comm_env(void) {
    Comm *c = comm_single();
    c->name = "env";
    c->rank = atoi(getenv("RANK") ? getenv("RANK") : "0");
    c->world = atoi(getenv("WORLD_SIZE"));
    c->local_rank = getenv("LOCAL_RANK") ? atoi(getenv("LOCAL_RANK")) : c->rank;
    if (c->rank < 0 || c->rank >= c->world) fail("RANK %d is outside WORLD_SIZE %d", c->rank, c->world);
    c->all_reduce_sum = e_allreduce, c->all_reduce_sum_f64 = e_allreduce64;
    c->reduce_scatter_sum = e_rs, c->all_gather = e_rs, c->broadcast = e_bcast, c->barrier = e_none;
    return c;
}

Comm *comm_create(int *argc, char ***argv) {
    if (!launched_by_mpi()) {
        const char *ws = getenv("WORLD_SIZE");
        return ws && atoi(ws) > 1 ? comm_env() : comm_single();
    }
    int provided;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        fail("MPI_Init failed");
    // Errors come back as codes so they can be reported, not as a silent abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    Comm *c = xcalloc(1, sizeof(Comm));
    MpiImpl *mi = xcalloc(1, sizeof(MpiImpl));
    *c = (Comm){.name = "mpi", .impl = mi, .timeout_s = 300,
                .all_reduce_sum = m_allreduce, .all_reduce_sum_f64 = m_allreduce64,
                .reduce_scatter_sum = m_reduce_scatter, .all_gather = m_all_gather,
                .broadcast = m_broadcast, .barrier = m_barrier, .destroy = m_destroy};
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->world);
    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    c->local_rank = lr ? atoi(lr) : c->rank;
    const char *t = getenv("LLMC_COMM_TIMEOUT");
    if (t && atof(t) > 0) c->timeout_s = atof(t);
    pthread_mutex_init(&mi->lock, NULL);
    if (pthread_create(&mi->watchdog, NULL, watchdog_main, c) != 0) fail("cannot start the comm watchdog");
    return c;
}
