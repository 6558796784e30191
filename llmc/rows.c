// rows.c: see rows.h.
#include "rows.h"
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "util.h"

#define HEADER_INTS 256
#define HEADER_BYTES (HEADER_INTS * sizeof(int32_t))

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

static size_t row_bytes(const RowLoader *rl) { return (size_t)3 * rl->T * sizeof(int32_t); }

// The descriptor, checked to still be the file rows_open saw (same device, inode and size).
static int rows_fd(RowLoader *rl) {
    struct stat st;
    if (fstat(rl->fd, &st) != 0) fail("%s: cannot stat prepared rows: %s", rl->path, strerror(errno));
    if ((uint64_t)st.st_dev != rl->dev || (uint64_t)st.st_ino != rl->ino)
        fail("%s: prepared rows were replaced by another file while training", rl->path);
    if ((uint64_t)st.st_size != rl->size)
        fail("%s: prepared rows changed size while training: %llu bytes when opened, %llu now", rl->path,
             (unsigned long long)rl->size, (unsigned long long)st.st_size);
    return rl->fd;
}

// Reads n rows starting at row r into buf (n x 3T int32).
static void read_rows(RowLoader *rl, size_t r, size_t n, int32_t *buf) {
    const size_t nb = n * row_bytes(rl);
    const uint64_t off = HEADER_BYTES + (uint64_t)r * row_bytes(rl);
    ssize_t got = read_at(rows_fd(rl), buf, nb, off);
    if (got < 0) fail("%s: cannot read row %zu: %s", rl->path, r, strerror(errno));
    if ((size_t)got < nb)
        fail("%s: prepared rows shrank while training: row %zu is past the end of the file", rl->path, r);
}

// Checks one row against the contract (a paired file's rows each hold a target); adds its
// targets to *ntargets and returns its largest token id.
static int check_row(const RowLoader *rl, size_t r, const int32_t *tok, const int32_t *tgt,
                     const int32_t *ds, uint64_t *ntargets) {
    const int T = rl->T;
    int mx = 0;
    for (int t = 0; t < T; t++) {
        if (tok[t] < 0 || tok[t] >= rl->vocab)
            fail("%s: row %zu, position %d: token id %d is out of range for vocab_size %d", rl->path, r, t,
                 tok[t], rl->vocab);
        if (tok[t] > mx) mx = tok[t];
        if (t == 0 ? ds[t] != 0 : ds[t] != ds[t - 1] && ds[t] != t)
            fail("%s: row %zu, position %d: doc_start %d is neither %d (the document of position %d) nor %d "
                 "(a new document)", rl->path, r, t, ds[t], t ? ds[t - 1] : 0, t - 1, t);
        if (tgt[t] < -1 || tgt[t] >= rl->vocab)
            fail("%s: row %zu, position %d: target %d is out of range (-1, or an id below vocab_size %d)",
                 rl->path, r, t, tgt[t], rl->vocab);
    }
    const uint64_t before = *ntargets;
    for (int t = 0; t < T && rl->scored; t++) {
        if (tgt[t] < 0) continue;
        if (*ntargets != before)
            fail("%s: row %zu, position %d: a second score position (a reward model's row has one)", rl->path, r, t);
        if (tgt[t] != tok[t] || ds[t] != 0)
            fail("%s: row %zu, position %d: target %d is not the token %d there in the row's one sequence (a reward "
                 "model's row marks its score position)", rl->path, r, t, tgt[t], tok[t]);
        (*ntargets)++;
    }
    for (int t = 0; t < T && rl->labels; t++) {
        if (tgt[t] < 0) continue;
        if (tgt[t] > 1 || ds[t] != 0)
            fail("%s: row %zu, position %d: label %d (a token classifier's rows hold 0 or 1 in the row's one "
                 "sequence)", rl->path, r, t, tgt[t]);
        (*ntargets)++;
    }
    for (int t = 0; t < T && !rl->scored && !rl->labels; t++) {
        if (tgt[t] < 0) continue;
        if (t + 1 >= T || ds[t + 1] != ds[t])
            fail("%s: row %zu, position %d: target %d at the last token of a document (targets never cross "
                 "a document boundary)", rl->path, r, t, tgt[t]);
        if (tgt[t] != tok[t + 1])
            fail("%s: row %zu, position %d: target %d is not the next token %d of its document", rl->path, r,
                 t, tgt[t], tok[t + 1]);
        (*ntargets)++;
    }
    if (rl->unit == 2 && *ntargets == before)
        fail("%s: row %zu is the %s completion of pair %zu but has no target token (each completion needs at "
             "least one)", rl->path, r, r % 2 ? "rejected" : "chosen", r / 2);
    return mx;
}

// An epoch serves the first `served` rows of its order, in whole optimizer steps (B x accum
// slots each; those past `served` are empty rows).
static void serve(RowLoader *rl, size_t served) {
    const size_t per_step = (size_t)rl->B * rl->accum;
    rl->served = served;
    rl->slots = (served + per_step - 1) / per_step * per_step;
}

void rows_open(RowLoader *rl, const char *path, int B, int accum, int T, int vocab, int shuffle,
               uint64_t seed, const char *what) {
    memset(rl, 0, sizeof *rl);
    rl->path = xstrdup(path);
    rl->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (rl->fd < 0) fail("%s: cannot open %s: %s", path, what, strerror(errno));
    struct stat st;
    if (fstat(rl->fd, &st) != 0 || !S_ISREG(st.st_mode)) fail("%s: %s: not a regular file", path, what);
    rl->size = (uint64_t)st.st_size, rl->dev = (uint64_t)st.st_dev, rl->ino = (uint64_t)st.st_ino;
    if (rl->size < HEADER_BYTES)
        fail("%s: truncated %s file: %llu bytes, shorter than the 1024-byte header", path, what,
             (unsigned long long)rl->size);
    int32_t h[HEADER_INTS];
    ssize_t got = read_at(rl->fd, h, HEADER_BYTES, 0);
    if (got != (ssize_t)HEADER_BYTES) fail("%s: cannot read the header: %s", path, got < 0 ? strerror(errno) : "short read");
    if (h[0] != ROWS_MAGIC)
        fail("%s: bad magic %d (expected %d: rows written by scripts/prepare_data.py)", path, h[0], ROWS_MAGIC);
    if (h[1] != ROWS_VERSION)
        fail("%s: unsupported rows version %d (this trainer reads version %d; prepare the data again)", path,
             h[1], ROWS_VERSION);
    if (h[2] != T)
        fail("%s: rows of %d tokens, but sequence_len is %d (prepare the data again for this sequence_len)",
             path, h[2], T);
    if (h[3] <= 0) fail("%s: %s file has %d rows (at least one is needed)", path, what, h[3]);
    if (h[4] & ~(ROWS_FLAG_PACKED | ROWS_FLAG_PAIRED | ROWS_FLAG_SCORED | ROWS_FLAG_LABELS))
        fail("%s: unknown flags 0x%x in the header", path, (unsigned)h[4]);
    if ((h[4] & ROWS_FLAG_LABELS) && h[4] != ROWS_FLAG_LABELS)
        fail("%s: the header says token labels with other flags 0x%x (a token classifier's rows are neither packed "
             "nor pairs)", path, (unsigned)h[4]);
    if ((h[4] & ROWS_FLAG_SCORED) && !(h[4] & ROWS_FLAG_PAIRED))
        fail("%s: the header says scored rows but not pairs (a reward model's rows are pairs)", path);
    if ((h[4] & ROWS_FLAG_PACKED) && (h[4] & ROWS_FLAG_PAIRED))
        fail("%s: the header says packed and paired (preference pairs are one sample a row)", path);
    if ((h[4] & ROWS_FLAG_PAIRED) && h[3] % 2)
        fail("%s: paired rows, but an odd row count %d (each pair is a chosen and a rejected row)", path, h[3]);
    if (h[5] < 0) fail("%s: negative token id bound %d in the header", path, h[5]);
    if (h[5] > vocab)
        fail("%s: token ids go up to %d, but the model's vocab_size is %d (a tokenizer of another model?)",
             path, h[5] - 1, vocab);
    if (h[6] < 0) fail("%s: negative document count %d in the header", path, h[6]);
    rl->T = T, rl->vocab = vocab, rl->nrows = (size_t)h[3], rl->packed = h[4] & ROWS_FLAG_PACKED;
    rl->unit = h[4] & ROWS_FLAG_PAIRED ? 2 : 1;
    rl->scored = (h[4] & ROWS_FLAG_SCORED) != 0;
    rl->labels = (h[4] & ROWS_FLAG_LABELS) != 0;
    rl->nunits = rl->nrows / (size_t)rl->unit;
    rl->max_id1 = h[5], rl->ndocs = (uint64_t)h[6];
    rl->ntargets = (uint64_t)(uint32_t)h[7] | (uint64_t)(uint32_t)h[8] << 32;
    const uint64_t want = HEADER_BYTES + (uint64_t)rl->nrows * row_bytes(rl);
    if (rl->size != want)
        fail("%s: the header says %zu rows of %d tokens (%llu bytes), but the file has %llu bytes", path,
             rl->nrows, T, (unsigned long long)want, (unsigned long long)rl->size);
    // Every row once, in chunks of about 4 MiB.
    size_t chunk = ((size_t)4 << 20) / row_bytes(rl);
    if (chunk < 1) chunk = 1;
    if (chunk > rl->nrows) chunk = rl->nrows;
    int32_t *buf = xmalloc(chunk * row_bytes(rl));
    uint64_t ntargets = 0;
    int mx = 0;
    for (size_t r0 = 0; r0 < rl->nrows; r0 += chunk) {
        size_t n = rl->nrows - r0 < chunk ? rl->nrows - r0 : chunk;
        read_rows(rl, r0, n, buf);
        for (size_t i = 0; i < n; i++) {
            const int32_t *row = buf + i * 3 * (size_t)T;
            int m = check_row(rl, r0 + i, row, row + T, row + 2 * T, &ntargets);
            if (m > mx) mx = m;
        }
    }
    free(buf);
    if (mx >= rl->max_id1)
        fail("%s: the header says token ids are below %d, but row data has id %d", path, rl->max_id1, mx);
    if (ntargets != rl->ntargets)
        fail("%s: the header says %llu target tokens, the rows have %llu", path,
             (unsigned long long)rl->ntargets, (unsigned long long)ntargets);
    rl->B = B, rl->accum = accum, rl->shuffle = shuffle, rl->seed = seed;
    serve(rl, rl->nunits);
    rl->order = xmalloc(sizeof(size_t) * rl->nunits);
    rl->buf = xmalloc(row_bytes(rl));
    rl->ids = xmalloc(sizeof(size_t) * (size_t)B * rl->unit);
    rows_seek(rl, 0, 0);
}

void rows_drop_last(RowLoader *rl) {
    const char *what = rl->unit == 2 ? "pairs" : "rows";
    if (rl->nunits < (size_t)rl->B)
        fail("%s: %zu %s, fewer than one micro-batch of %d (micro_batch_size x ranks): with dataloader_drop_last "
             "no batch is left", rl->path, rl->nunits, what, rl->B);
    serve(rl, rl->nunits / (size_t)rl->B * (size_t)rl->B);  // the epoch's order is the same: only its end moves
}

size_t rows_steps_per_epoch(const RowLoader *rl) { return rl->slots / ((size_t)rl->B * rl->accum); }

// The order of an epoch depends only on (seed, epoch).
static void build_order(RowLoader *rl) {
    for (size_t i = 0; i < rl->nunits; i++) rl->order[i] = i;
    if (!rl->shuffle) return;
    Rng r;
    rng_seed(&r, rl->seed * 0xD1B54A32D192ED03ULL + rl->epoch + 1);
    for (size_t i = rl->nunits - 1; i > 0; i--) {
        size_t j = rng_next(&r) % (i + 1), t = rl->order[i];
        rl->order[i] = rl->order[j];
        rl->order[j] = t;
    }
}

void rows_seek(RowLoader *rl, uint64_t epoch, size_t next) {
    if (next > rl->slots)
        fail("%s: the resumed position (row slot %zu of epoch %llu) is past this data's %zu slots per epoch: "
             "the prepared data changed since the checkpoint", rl->path, next, (unsigned long long)epoch, rl->slots);
    rl->epoch = epoch;
    rl->next = next;
    build_order(rl);
}

void rows_read(RowLoader *rl, size_t r, int32_t *tokens, int32_t *targets, int32_t *doc_start) {
    const int T = rl->T;
    if (r >= rl->nrows) {  // an empty row: nothing to predict
        for (int t = 0; t < T; t++) tokens[t] = 0, targets[t] = -1, doc_start[t] = 0;
        return;
    }
    read_rows(rl, r, 1, rl->buf);
    uint64_t n = 0;
    check_row(rl, r, rl->buf, rl->buf + T, rl->buf + 2 * T, &n);
    memcpy(tokens, rl->buf, sizeof(int32_t) * T);
    memcpy(targets, rl->buf + T, sizeof(int32_t) * T);
    memcpy(doc_start, rl->buf + 2 * T, sizeof(int32_t) * T);
}

void rows_next(RowLoader *rl, int32_t *tokens, int32_t *targets, int32_t *doc_start) {
    const size_t T = (size_t)rl->T;
    for (int i = 0; i < rl->B; i++) {
        if (rl->next >= rl->slots) rows_seek(rl, rl->epoch + 1, 0);
        size_t s = rl->next++;
        for (int u = 0; u < rl->unit; u++) {
            const size_t r = s < rl->served ? rl->order[s] * rl->unit + u : rl->nrows, k = (size_t)i * rl->unit + u;
            rows_read(rl, r, tokens + k * T, targets + k * T, doc_start + k * T);
            rl->ids[k] = r;
        }
    }
}

void rows_close(RowLoader *rl) {
    if (rl->fd >= 0) close(rl->fd);
    free(rl->path);
    free(rl->order);
    free(rl->buf);
    free(rl->ids);
    memset(rl, 0, sizeof *rl);
    rl->fd = -1;
}
