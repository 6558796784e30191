// comm.c: the single-process and MPI implementations of comm.h, and the launcher-free file
// rendezvous that NCCL's unique id travels through. MPI collectives run under a watchdog: if a
// peer died or hangs, the others stop with a message instead of waiting forever.
//
// MPI is optional: without mpi.h (no `mpicc` on the build machine: the Makefile then passes no
// MPI flags, as on the bare GPU machine) the build has no MPI path, and a run started by an MPI
// launcher stops with a message saying so; single-process and launcher-free NCCL runs work.
#include "comm.h"
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>
#include "util.h"
#if defined(__has_include)
#if __has_include(<mpi.h>) && !defined(LLMC_NO_MPI)
#define LLMC_HAVE_MPI 1
#include <mpi.h>
#endif
#endif

double comm_default_timeout(void) {
    const char *t = getenv("LLMC_COMM_TIMEOUT");
    return t && atof(t) > 0 ? atof(t) : 300.0;
}

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
static void s_all_to_all(Comm *c, void *r, const void *s, size_t n) {
    (void)c;
    if (r == s) fail("internal: all-to-all in place");
    memcpy(r, s, n * sizeof(float));
}
static void s_broadcast(Comm *c, void *b, size_t n, int root) { (void)c, (void)b, (void)n, (void)root; }
static void s_barrier(Comm *c) { (void)c; }
static void s_destroy(Comm *c) { free(c); }

Comm *comm_single(void) {
    Comm *c = xcalloc(1, sizeof(Comm));
    *c = (Comm){.name = "single", .rank = 0, .world = 1, .local_rank = 0, .timeout_s = 0,
                .all_reduce_sum = s_allreduce, .all_reduce_sum_f64 = s_allreduce64,
                .reduce_scatter_sum = s_reduce_scatter, .all_gather = s_all_gather,
                .all_to_all = s_all_to_all, .broadcast = s_broadcast, .barrier = s_barrier, .destroy = s_destroy};
    return c;
}

// ---- MPI ---------------------------------------------------------------------------------
#ifdef LLMC_HAVE_MPI
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
                    "hangs; ddp_timeout or LLMC_COMM_TIMEOUT sets the limit); aborting\n", c->rank, op, c->timeout_s);
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
static void m_all_to_all(Comm *c, void *r, const void *s, size_t n) {
    if (r == s) fail("internal: all-to-all in place");
    if (n > INT_MAX) fail("all-to-all of %zu elements per rank exceeds MPI's int count", n);
    enter(c, "all-to-all");
    leave(c, MPI_Alltoall(s, (int)n, MPI_FLOAT, r, (int)n, MPI_FLOAT, MPI_COMM_WORLD));
}
static void m_broadcast(Comm *c, void *b, size_t n, int root) {
    if (n > INT_MAX) fail("internal: broadcast of %zu bytes exceeds MPI's int count", n);
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

#endif  // LLMC_HAVE_MPI

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
    c->timeout_s = comm_default_timeout();  // NCCL inherits it: 0 would fail the first collective
    if (c->rank < 0 || c->rank >= c->world) fail("RANK %d is outside WORLD_SIZE %d", c->rank, c->world);
    c->all_reduce_sum = e_allreduce, c->all_reduce_sum_f64 = e_allreduce64;
    c->reduce_scatter_sum = e_rs, c->all_gather = e_rs, c->all_to_all = e_rs, c->broadcast = e_bcast, c->barrier = e_none;
    return c;
}

Comm *comm_create(int *argc, char ***argv) {
    if (!launched_by_mpi()) {
        const char *ws = getenv("WORLD_SIZE");
        return ws && atoi(ws) > 1 ? comm_env() : comm_single();
    }
#ifndef LLMC_HAVE_MPI
    (void)argc, (void)argv;
    fail("started by an MPI launcher, but this build has no MPI (built without mpi.h, or with LLMC_NO_MPI); "
         "rebuild where mpicc works, or start the ranks without a launcher (RANK, WORLD_SIZE, LOCAL_RANK, "
         "LLMC_NCCL_ID_FILE) on GPUs");
#else
    int provided;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        fail("MPI_Init failed");
    // Errors come back as codes so they can be reported, not as a silent abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    Comm *c = xcalloc(1, sizeof(Comm));
    MpiImpl *mi = xcalloc(1, sizeof(MpiImpl));
    *c = (Comm){.name = "mpi", .impl = mi, .timeout_s = 300,
                .all_reduce_sum = m_allreduce, .all_reduce_sum_f64 = m_allreduce64,
                .reduce_scatter_sum = m_reduce_scatter, .all_gather = m_all_gather, .all_to_all = m_all_to_all,
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
#endif
}


// ---- launcher-free rendezvous through a file ------------------------------------------------
// Files: PATH, written by rank 0 (atomically: a temporary file renamed into place), and
// PATH.ack<r>, written by rank r. Each process draws a random nonce. Rank 0 publishes
// {nonce0, WAIT, blob}; rank r answers with {nonce0 as read, nonce_r}; once every rank answered
// with nonce0, rank 0 publishes {nonce0, GO, nonce_1..nonce_{w-1}, blob}. Rank r takes the blob
// only from a GO file that lists its own nonce_r, so a file left by an earlier (crashed) run,
// GO or not, is never taken: its acks name other nonces. Rank 0 removes PATH once the
// collective init that used the blob has completed (comm_file_rendezvous_done).
#define RDV_MAGIC 0x31564452434d4c4cULL  // "LLMCRDV1"
typedef struct {
    uint64_t magic, nonce0;
    uint32_t world, state;  // state 1: GO
    uint64_t bytes;
} RdvHead;

static uint64_t rdv_nonce(void) {
    uint64_t n = 0;
    int fd = open("/dev/urandom", O_RDONLY);
    if (fd >= 0) {
        if (read(fd, &n, sizeof n) != (ssize_t)sizeof n) n = 0;
        close(fd);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    n ^= ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20);
    return n ? n : 1;
}

static int rdv_write(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return -1;
    int ok = fwrite(a, 1, na, f) == na && (!nb || fwrite(b, 1, nb, f) == nb);
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

// Reads the whole file into buf (cap bytes); returns its size or -1.
static long rdv_read(const char *path, void *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return (long)n;
}

void comm_file_rendezvous(const char *path, int rank, int world, void *blob, size_t bytes, double timeout_s) {
    if (strlen(path) > 4000) fail("LLMC_NCCL_ID_FILE: path too long");
    if (world < 2) return;
    char ack[4200];
    const size_t acks_bytes = sizeof(uint64_t) * (size_t)world;
    const size_t file_bytes = sizeof(RdvHead) + acks_bytes + bytes;
    unsigned char *buf = xcalloc(1, file_bytes + 64);
    uint64_t *acks = (uint64_t *)(buf + sizeof(RdvHead));
    double t0 = now_ms();
    if (rank == 0) {
        RdvHead h = {.magic = RDV_MAGIC, .nonce0 = rdv_nonce(), .world = (uint32_t)world, .bytes = bytes};
        memcpy(buf, &h, sizeof h);
        memcpy(buf + sizeof h + acks_bytes, blob, bytes);
        if (rdv_write(path, buf, file_bytes, NULL, 0) != 0) fail("%s: cannot write the rendezvous file: %s", path, strerror(errno));
        int missing = world - 1, first_missing = 1;
        while (missing) {
            missing = 0, first_missing = 0;
            for (int r = 1; r < world; r++) {
                if (acks[r]) continue;
                uint64_t a[3];
                snprintf(ack, sizeof ack, "%s.ack%d", path, r);
                if (rdv_read(ack, a, sizeof a) == (long)sizeof a && a[0] == RDV_MAGIC && a[1] == h.nonce0) acks[r] = a[2];
                else if (!missing++) first_missing = r;
            }
            if (!missing) break;
            if ((now_ms() - t0) / 1e3 > timeout_s)
                fail("%s: %d rank(s) (first: rank %d) did not join within %.0f s", path, missing, first_missing, timeout_s);
            usleep(10000);
        }
        h.state = 1;
        memcpy(buf, &h, sizeof h);
        if (rdv_write(path, buf, file_bytes, NULL, 0) != 0) fail("%s: cannot write the rendezvous file: %s", path, strerror(errno));
        free(buf);
        return;
    }
    const uint64_t mine = rdv_nonce();
    uint64_t answered = 0;
    snprintf(ack, sizeof ack, "%s.ack%d", path, rank);
    for (;;) {
        long n = rdv_read(path, buf, file_bytes + 64);
        RdvHead h;
        memcpy(&h, buf, sizeof h);
        if (n == (long)file_bytes && h.magic == RDV_MAGIC && h.world == (uint32_t)world && h.bytes == bytes) {
            if (h.nonce0 != answered) {  // a new publication (or a stale one: answering it is harmless)
                uint64_t a[3] = {RDV_MAGIC, h.nonce0, mine};
                if (rdv_write(ack, a, sizeof a, NULL, 0) != 0) fail("%s: cannot write: %s", ack, strerror(errno));
                answered = h.nonce0;
            }
            if (h.state == 1 && acks[rank] == mine) {
                memcpy(blob, buf + sizeof h + acks_bytes, bytes);
                unlink(ack);
                free(buf);
                return;
            }
        }
        if ((now_ms() - t0) / 1e3 > timeout_s)
            fail("%s: rank 0 of this run did not publish the NCCL id within %.0f s (a file left by an earlier "
                 "run is never used)", path, timeout_s);
        usleep(10000);
    }
}

void comm_file_rendezvous_done(const char *path, int rank) {
    if (rank == 0) unlink(path);
}
