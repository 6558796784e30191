// data.c: see data.h.
#include "data.h"
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARD_MAGIC 20240520
#define HEADER_BYTES (256 * sizeof(int32_t))

// pread() until n bytes or end of file; the byte count, or -1 with errno set.
static ssize_t read_at(int fd, void *buf, size_t n, uint64_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static void shard_open(Shard *s, const char *path) {
    memset(s, 0, sizeof *s);
    s->path = xstrdup(path);
    int fd = open(path, O_RDONLY | O_NONBLOCK);  // a FIFO must not block the open
    if (fd < 0) fail("%s: cannot open token shard: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) fail("%s: not a regular file", path);
    if ((size_t)st.st_size < HEADER_BYTES)
        fail("%s: truncated token shard: %lld bytes, shorter than the 1024-byte header", path,
             (long long)st.st_size);
    s->size = (uint64_t)st.st_size;
    s->dev = (uint64_t)st.st_dev;
    s->ino = (uint64_t)st.st_ino;
    int32_t h[256];
    ssize_t got = read_at(fd, h, HEADER_BYTES, 0);
    int err = errno;
    close(fd);
    if (got < 0) fail("%s: cannot read token shard header: %s", path, strerror(err));
    if ((size_t)got < HEADER_BYTES)
        fail("%s: token shard shrank while being opened: read %zd of the 1024 header bytes", path, got);
    if (h[0] != SHARD_MAGIC)
        fail("%s: bad magic %d in token shard header (expected %d)", path, h[0], SHARD_MAGIC);
    if (h[1] != 1 && h[1] != 2)
        fail("%s: unsupported token shard version %d (expected 1 = uint16 or 2 = uint32)", path, h[1]);
    if (h[2] < 0) fail("%s: negative token count %d in header", path, h[2]);
    s->version = h[1];
    s->ntok = (size_t)(uint32_t)h[2];
    size_t want = HEADER_BYTES + s->ntok * (s->version == 1 ? 2 : 4);
    if (s->size < want)
        fail("%s: truncated token shard: header says %zu tokens (%zu bytes), file has %llu bytes",
             path, s->ntok, want, (unsigned long long)s->size);
}

// A descriptor for shard si, checked to still be the file loader_open saw, same size: a shard
// replaced, truncated or extended while the run trains ends the run naming it. One descriptor
// is kept open at a time, so any number of shards works under any open-file limit.
static int shard_fd(DataLoader *dl, int si) {
    const Shard *s = &dl->shards[si];
    if (dl->fd_shard != si) {
        if (dl->fd >= 0) close(dl->fd);
        dl->fd = -1;
        int fd = open(s->path, O_RDONLY | O_NONBLOCK);
        if (fd < 0)
            fail("%s: cannot reopen token shard while training: %s", s->path, strerror(errno));
        dl->fd = fd, dl->fd_shard = si;
    }
    struct stat st;
    if (fstat(dl->fd, &st) != 0)
        fail("%s: cannot stat token shard while training: %s", s->path, strerror(errno));
    if ((uint64_t)st.st_dev != s->dev || (uint64_t)st.st_ino != s->ino)
        fail("%s: token shard was replaced by another file while training", s->path);
    if ((uint64_t)st.st_size != s->size)
        fail("%s: token shard changed size while training: %llu bytes when opened, %llu now",
             s->path, (unsigned long long)s->size, (unsigned long long)st.st_size);
    return dl->fd;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void loader_open(DataLoader *dl, const char *pattern, int B, int T, int vocab, int shuffle,
                 uint64_t seed, const char *key) {
    memset(dl, 0, sizeof *dl);
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0))
        fail("%s: no token shard matches '%s'", key, pattern);
    if (rc != 0) fail("%s: cannot expand '%s'", key, pattern);
    char **paths = g.gl_pathv;
    qsort(paths, g.gl_pathc, sizeof(char *), cmp_str);
    dl->nshards = (int)g.gl_pathc;
    dl->shards = xcalloc(dl->nshards, sizeof(Shard));
    dl->B = B, dl->T = T, dl->vocab = vocab, dl->shuffle = shuffle, dl->seed = seed;
    size_t need = (size_t)B * T + 1;
    for (int i = 0; i < dl->nshards; i++) {
        Shard *s = &dl->shards[i];
        shard_open(s, paths[i]);
        s->nwin = s->ntok >= need ? (s->ntok - 1) / ((size_t)B * T) : 0;
        dl->total_windows += s->nwin;
    }
    if (dl->total_windows == 0)
        fail("%s: '%s' has no shard with the %zu tokens one batch needs (micro_batch_size %d x "
             "sequence_len %d + 1)", key, pattern, need, B, T);
    globfree(&g);
    dl->order = xmalloc(sizeof(size_t) * dl->total_windows);
    dl->fd = -1, dl->fd_shard = -1;
    dl->buf = xmalloc(((size_t)B * T + 1) * sizeof(uint32_t));
    loader_seek(dl, 0, 0);
}

// The order of an epoch depends only on (seed, epoch), so a resumed run rebuilds it exactly.
static void build_order(DataLoader *dl) {
    for (size_t i = 0; i < dl->total_windows; i++) dl->order[i] = i;
    if (!dl->shuffle) return;
    Rng r;
    rng_seed(&r, dl->seed * 0x9E3779B97F4A7C15ULL + dl->epoch + 1);
    for (size_t i = dl->total_windows - 1; i > 0; i--) {
        size_t j = rng_next(&r) % (i + 1), t = dl->order[i];
        dl->order[i] = dl->order[j];
        dl->order[j] = t;
    }
}

void loader_seek(DataLoader *dl, uint64_t epoch, size_t next) {
    dl->epoch = epoch;
    dl->next = next;
    build_order(dl);
}

void loader_reset(DataLoader *dl) { loader_seek(dl, 0, 0); }

void loader_next(DataLoader *dl, int32_t *tokens, int32_t *targets) {
    if (dl->next >= dl->total_windows) loader_seek(dl, dl->epoch + 1, 0);
    size_t w = dl->order[dl->next++];
    int si = 0;
    while (w >= dl->shards[si].nwin) w -= dl->shards[si++].nwin;
    const Shard *s = &dl->shards[si];
    const size_t BT = (size_t)dl->B * dl->T, start = w * BT, tsize = s->version == 1 ? 2 : 4;
    const size_t nbytes = (BT + 1) * tsize;
    const uint64_t off = HEADER_BYTES + (uint64_t)start * tsize;
    ssize_t got = read_at(shard_fd(dl, si), dl->buf, nbytes, off);
    if (got < 0)
        fail("%s: cannot read token shard at byte %llu: %s", s->path, (unsigned long long)off,
             strerror(errno));
    if ((size_t)got < nbytes)
        fail("%s: token shard shrank while training: read %zd of %zu bytes at byte %llu "
             "(%llu bytes when opened)", s->path, got, nbytes, (unsigned long long)off,
             (unsigned long long)s->size);
    for (size_t i = 0; i <= BT; i++) {
        uint32_t t;
        if (tsize == 2) {
            uint16_t t16;
            memcpy(&t16, dl->buf + 2 * i, 2);
            t = t16;
        } else {
            memcpy(&t, dl->buf + 4 * i, 4);
        }
        if (t >= (uint32_t)dl->vocab)
            fail("%s: token %u at position %zu is out of range for vocab_size %d", s->path, t,
                 start + i, dl->vocab);
        if (i < BT) tokens[i] = (int32_t)t;
        if (i > 0) targets[i - 1] = (int32_t)t;
    }
}

void loader_close(DataLoader *dl) {
    for (int i = 0; i < dl->nshards; i++) free(dl->shards[i].path);
    if (dl->fd >= 0) close(dl->fd);
    free(dl->shards);
    free(dl->order);
    free(dl->buf);
    memset(dl, 0, sizeof *dl);
    dl->fd = -1;
}

int shard_write(const char *path, const uint32_t *tokens, size_t n, int version) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int32_t h[256] = {SHARD_MAGIC, version, (int32_t)n};
    int ok = fwrite(h, sizeof h, 1, f) == 1;
    for (size_t i = 0; ok && i < n; i++) {
        if (version == 1) {
            uint16_t t = (uint16_t)tokens[i];
            ok = fwrite(&t, 2, 1, f) == 1;
        } else {
            ok = fwrite(&tokens[i], 4, 1, f) == 1;
        }
    }
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : -1;
}
