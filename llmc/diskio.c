// diskio.c: see diskio.h.
#include "diskio.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util.h"

enum { JOB_WRITE, JOB_READ };
#define QCAP 4096

struct DiskIO {
    char dir[4096];
    int lock_fd;  // the directory, flock'ed while this run lives: others never remove it
    MemStats *mem;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake, finished;
    DiskJob *queue[QCAP];
    int head, tail, stop, abort;  // abort: the run failed; drop queued jobs
    long long fault_after;  // LLMC_FAULT_DISK_FULL_AFTER: simulate ENOSPC past this many bytes
    long long written;
};

static DiskIO *live_io;  // removed by the failure hook
static void cleanup_on_fail(void) {
    DiskIO *io = live_io;
    if (!io) return;
    // Stop the I/O thread before removing its directory: a queued write that lands after
    // remove_tree would leave the directory behind.
    pthread_mutex_lock(&io->lock);
    io->stop = io->abort = 1;
    pthread_cond_broadcast(&io->wake);
    pthread_mutex_unlock(&io->lock);
    pthread_join(io->thread, NULL);
    remove_tree(io->dir);
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w, n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, char *p, size_t n) {
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = EIO;  // the file is shorter than what was written
            return -1;
        }
        p += r, n -= (size_t)r;
    }
    return 0;
}

static int run_job(DiskIO *io, DiskJob *j) {
    if (j->kind == JOB_WRITE) {
        if (io->fault_after >= 0 && io->written + (long long)j->bytes > io->fault_after) {
            errno = ENOSPC;
            return -1;
        }
        int fd = open(j->path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0) return -1;
        int rc = write_all(fd, j->buf, j->bytes);
        if (close(fd) != 0) rc = -1;
        if (rc != 0) {
            int e = errno;
            unlink(j->path);
            errno = e;
            return -1;
        }
        io->written += (long long)j->bytes;
        return 0;
    }
    int fd = open(j->path, O_RDONLY);
    if (fd < 0) return -1;
    int rc = read_all(fd, j->buf, j->bytes);
    int e = errno;
    close(fd);
    unlink(j->path);  // read once: delete as soon as it is back
    errno = e;
    return rc;
}

static void *io_main(void *arg) {
    DiskIO *io = arg;
    pthread_mutex_lock(&io->lock);
    for (;;) {
        while (io->head == io->tail && !io->stop) pthread_cond_wait(&io->wake, &io->lock);
        if (io->head == io->tail) break;
        DiskJob *j = io->queue[io->head % QCAP];
        int abort = io->abort;
        pthread_mutex_unlock(&io->lock);
        int rc = abort ? (errno = ECANCELED, -1) : run_job(io, j);
        int e = rc ? errno : 0;
        pthread_mutex_lock(&io->lock);
        io->head++;
        j->err = e;
        if (!e) {
            MemStats *m = io->mem;
            if (j->kind == JOB_WRITE) m->disk_in_use += j->bytes;
            else m->disk_in_use -= j->bytes;
            if (m->disk_in_use > m->disk_peak) m->disk_peak = m->disk_in_use;
        }
        j->done = 1;
        pthread_cond_broadcast(&io->finished);
    }
    pthread_mutex_unlock(&io->lock);
    return NULL;
}

// Directories "llmc-offload-<pid>-*" of killed runs: their pid no longer runs (or is this
// process's, reused), and nobody holds the directory's flock (a live run holds its own; that
// also protects a live run whose pid this process cannot see, e.g. from another container).
void diskio_clean_debris(const char *parent) {
    DIR *d = opendir(parent);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int pid;
        if (sscanf(e->d_name, "llmc-offload-%d-", &pid) != 1) continue;
        if (pid != getpid() && (kill(pid, 0) == 0 || errno != ESRCH)) continue;
        char path[4096];
        join_path(path, sizeof path, parent, e->d_name);
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) continue;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) remove_tree(path);
        close(fd);
    }
    closedir(d);
}

DiskIO *diskio_create(const char *parent, MemStats *mem) {
    DiskIO *io = xcalloc(1, sizeof(DiskIO));
    const char *tmp = getenv("TMPDIR");
    if (!parent || !parent[0]) parent = tmp && tmp[0] ? tmp : "/tmp";
    if (mkdir_p(parent) != 0)
        fail("activation_offloading_dir: cannot create '%s': %s", parent, strerror(errno));
    diskio_clean_debris(parent);
    char name[64];
    snprintf(name, sizeof name, "llmc-offload-%d-XXXXXX", (int)getpid());
    join_path(io->dir, sizeof io->dir, parent, name);
    if (!mkdtemp(io->dir))
        fail("activation_offloading_dir: cannot create a directory in '%s': %s", parent, strerror(errno));
    io->lock_fd = open(io->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (io->lock_fd < 0 || flock(io->lock_fd, LOCK_EX | LOCK_NB) != 0)
        fail("activation_offloading_dir: cannot lock '%s': %s", io->dir, strerror(errno));
    io->mem = mem;
    const char *f = getenv("LLMC_FAULT_DISK_FULL_AFTER");
    io->fault_after = f ? atoll(f) : -1;
    pthread_mutex_init(&io->lock, NULL);
    pthread_cond_init(&io->wake, NULL);
    pthread_cond_init(&io->finished, NULL);
    if (pthread_create(&io->thread, NULL, io_main, io) != 0) fail("cannot start the disk I/O thread");
    live_io = io;
    on_fail(cleanup_on_fail);
    return io;
}

void diskio_destroy(DiskIO *io) {
    if (!io) return;
    pthread_mutex_lock(&io->lock);
    io->stop = 1;
    pthread_cond_broadcast(&io->wake);
    pthread_mutex_unlock(&io->lock);
    pthread_join(io->thread, NULL);
    remove_tree(io->dir);
    close(io->lock_fd);
    if (live_io == io) live_io = NULL;
    pthread_mutex_destroy(&io->lock);
    pthread_cond_destroy(&io->wake);
    pthread_cond_destroy(&io->finished);
    free(io);
}

const char *diskio_dir(const DiskIO *io) { return io->dir; }

static void submit(DiskIO *io, DiskJob *j, int kind, const char *name, void *buf, size_t bytes) {
    j->kind = kind;
    join_path(j->path, sizeof j->path, io->dir, name);
    j->buf = buf;
    j->bytes = bytes;
    j->err = 0;
    pthread_mutex_lock(&io->lock);
    while (io->tail - io->head >= QCAP) pthread_cond_wait(&io->finished, &io->lock);
    j->done = 0;
    io->queue[io->tail++ % QCAP] = j;
    pthread_cond_signal(&io->wake);
    pthread_mutex_unlock(&io->lock);
}

void diskio_write(DiskIO *io, DiskJob *j, const char *name, const void *buf, size_t bytes) {
    submit(io, j, JOB_WRITE, name, (void *)buf, bytes);
}

void diskio_read(DiskIO *io, DiskJob *j, const char *name, void *buf, size_t bytes) {
    submit(io, j, JOB_READ, name, buf, bytes);
}

void diskio_wait(DiskIO *io, DiskJob *j) {
    pthread_mutex_lock(&io->lock);
    while (!j->done) pthread_cond_wait(&io->finished, &io->lock);
    int err = j->err;
    pthread_mutex_unlock(&io->lock);
    if (err)
        fail("activation_offloading: disk: %s '%s': %s", j->kind == JOB_WRITE ? "writing" : "reading",
             j->path, strerror(err));
}
