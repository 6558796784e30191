// data.c: see data.h.
#include "data.h"
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SHARD_MAGIC 20240520
#define HEADER_BYTES (256 * sizeof(int32_t))

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
    s->map_len = st.st_size;
    s->map = mmap(NULL, s->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (s->map == MAP_FAILED) fail("%s: cannot map: %s", path, strerror(errno));
    const int32_t *h = (const int32_t *)s->map;
    if (h[0] != SHARD_MAGIC)
        fail("%s: bad magic %d in token shard header (expected %d)", path, h[0], SHARD_MAGIC);
    if (h[1] != 1 && h[1] != 2)
        fail("%s: unsupported token shard version %d (expected 1 = uint16 or 2 = uint32)", path, h[1]);
    if (h[2] < 0) fail("%s: negative token count %d in header", path, h[2]);
    s->version = h[1];
    s->ntok = (size_t)(uint32_t)h[2];
    size_t want = HEADER_BYTES + s->ntok * (s->version == 1 ? 2 : 4);
    if (s->map_len < want)
        fail("%s: truncated token shard: header says %zu tokens (%zu bytes), file has %zu bytes",
             path, s->ntok, want, s->map_len);
    madvise((void *)s->map, s->map_len, MADV_SEQUENTIAL);
}

static uint32_t shard_token(const Shard *s, size_t i) {
    const uint8_t *body = s->map + HEADER_BYTES;
    if (s->version == 1) {
        uint16_t t;
        memcpy(&t, body + 2 * i, 2);
        return t;
    }
    uint32_t t;
    memcpy(&t, body + 4 * i, 4);
    return t;
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
    const size_t BT = (size_t)dl->B * dl->T, start = w * BT;
    for (size_t i = 0; i <= BT; i++) {
        uint32_t t = shard_token(s, start + i);
        if (t >= (uint32_t)dl->vocab)
            fail("%s: token %u at position %zu is out of range for vocab_size %d", s->path, t,
                 start + i, dl->vocab);
        if (i < BT) tokens[i] = (int32_t)t;
        if (i > 0) targets[i - 1] = (int32_t)t;
    }
}

void loader_close(DataLoader *dl) {
    for (int i = 0; i < dl->nshards; i++) {
        munmap((void *)dl->shards[i].map, dl->shards[i].map_len);
        free(dl->shards[i].path);
    }
    free(dl->shards);
    free(dl->order);
    memset(dl, 0, sizeof *dl);
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
