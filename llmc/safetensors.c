// safetensors.c: see safetensors.h.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // mmap, fsync, fileno under -std=c11
#endif
#include "safetensors.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "json.h"
#include "stb_ds.h"
#include "util.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader assumes a little-endian host"
#endif

struct StFile {
    char *path;
    void *map;
    size_t map_len;
    int n;
    StTensor *t;
    const StTensor **by_name;  // sorted, for bsearch
    int n_meta;
    char **meta;               // key, value, key, value...
};

struct StModel {
    StFile **files;
    int n_files;
    int n;
    const StTensor **by_name;
};

static const struct { const char *name; size_t size; } dtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
    {"I8", 1}, {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1},
    {"F8_E4M3", 1}, {"F8_E5M2", 1},
};

size_t st_dtype_size(const char *dtype) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtype, dtypes[i].name) == 0) return dtypes[i].size;
    return 0;
}

size_t st_numel(const StTensor *t) {
    size_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= (size_t)t->shape[i];
    return n;
}

static int cmp_tensor_ptr(const void *a, const void *b) {
    return strcmp((*(const StTensor *const *)a)->name, (*(const StTensor *const *)b)->name);
}

static int cmp_name_key(const void *key, const void *elem) {
    return strcmp((const char *)key, (*(const StTensor *const *)elem)->name);
}

// cJSON holds numbers as doubles: integers are exact only up to 2^53, far beyond any file.
static int json_uint(const cJSON *v, int64_t *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(int64_t)d) return 0;
    *out = (int64_t)d;
    return 1;
}

static void parse_tensor(const char *path, const cJSON *e, StTensor *t,
                         const unsigned char *data, size_t data_len) {
    const char *nm = e->string;
    if (!cJSON_IsObject(e)) fail("%s: header entry '%s' is not an object", path, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *off = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!dt) fail("%s: tensor '%s' has no dtype", path, nm);
    if (!sh) fail("%s: tensor '%s' has no shape", path, nm);
    if (!off) fail("%s: tensor '%s' has no data_offsets", path, nm);
    if (!cJSON_IsString(dt)) fail("%s: tensor '%s' dtype is not a string", path, nm);
    size_t esize = st_dtype_size(dt->valuestring);
    if (strlen(dt->valuestring) >= sizeof t->dtype || !esize)
        fail("%s: tensor '%s' has unknown dtype '%s'", path, nm, dt->valuestring);
    strcpy(t->dtype, dt->valuestring);

    if (!cJSON_IsArray(sh)) fail("%s: tensor '%s' shape is not an array", path, nm);
    int ndim = cJSON_GetArraySize(sh);
    if (ndim > ST_MAX_DIMS)
        fail("%s: tensor '%s' has %d dimensions (at most %d supported)", path, nm, ndim,
             ST_MAX_DIMS);
    t->ndim = ndim;
    size_t numel = 1;
    int overflow = 0;
    for (int i = 0; i < ndim; i++) {
        if (!json_uint(cJSON_GetArrayItem(sh, i), &t->shape[i]))
            fail("%s: tensor '%s' shape[%d] is not a non-negative integer", path, nm, i);
        overflow |= __builtin_mul_overflow(numel, (size_t)t->shape[i], &numel);
    }
    size_t want;
    overflow |= __builtin_mul_overflow(numel, esize, &want);
    if (overflow) fail("%s: tensor '%s' shape is too large", path, nm);

    int64_t b, en;
    if (!cJSON_IsArray(off) || cJSON_GetArraySize(off) != 2 ||
        !json_uint(cJSON_GetArrayItem(off, 0), &b) || !json_uint(cJSON_GetArrayItem(off, 1), &en))
        fail("%s: tensor '%s' data_offsets is not a pair of non-negative integers", path, nm);
    if (b > en)
        fail("%s: tensor '%s' data_offsets [%lld, %lld] begin after end", path, nm,
             (long long)b, (long long)en);
    if ((uint64_t)en > data_len)
        fail("%s: tensor '%s' data_offsets [%lld, %lld] exceed the file's data (%zu bytes)",
             path, nm, (long long)b, (long long)en, data_len);
    t->nbytes = (size_t)(en - b);
    if (t->nbytes != want)
        fail("%s: tensor '%s' has %zu data bytes but its %s shape needs %zu", path, nm,
             t->nbytes, t->dtype, want);
    t->name = xstrdup(nm);
    t->data = data + b;
}

static int cmp_offset(const void *a, const void *b) {
    const StTensor *x = *(const StTensor *const *)a, *y = *(const StTensor *const *)b;
    const char *xa = x->data, *ya = y->data;
    if (xa != ya) return xa < ya ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

// The format requires the tensors' byte ranges to tile the data exactly: no overlap (two
// tensors aliasing one buffer), no holes and nothing after the last tensor (hidden payloads).
static void check_layout(const StFile *f, const unsigned char *data, size_t data_len) {
    const StTensor **by_off = xmalloc((size_t)(f->n ? f->n : 1) * sizeof *by_off);
    for (int i = 0; i < f->n; i++) by_off[i] = &f->t[i];
    qsort(by_off, (size_t)f->n, sizeof *by_off, cmp_offset);
    size_t at = 0;
    for (int i = 0; i < f->n; i++) {
        const StTensor *t = by_off[i];
        size_t b = (size_t)((const unsigned char *)t->data - data);
        if (b < at)
            fail("%s: tensor '%s' bytes [%zu, %zu) overlap tensor '%s'", f->path, t->name, b,
                 b + t->nbytes, by_off[i - 1]->name);
        if (b > at)
            fail("%s: data bytes [%zu, %zu) before tensor '%s' belong to no tensor", f->path, at,
                 b, t->name);
        at = b + t->nbytes;
    }
    if (at != data_len)
        fail("%s: %zu trailing data bytes after the last tensor (data is %zu bytes, tensors end at %zu)",
             f->path, data_len - at, data_len, at);
    free(by_off);
}

StFile *st_open(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK);  // a FIFO must not block the open
    if (fd < 0) fail("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) fail("%s: cannot stat: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) fail("%s: is a directory, expected a .safetensors file", path);
    if (!S_ISREG(st.st_mode)) fail("%s: not a regular file", path);
    size_t len = (size_t)st.st_size;
    if (len < 8) fail("%s: file is %zu bytes, too short for a safetensors header", path, len);
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) fail("%s: cannot mmap: %s", path, strerror(errno));
    close(fd);

    const unsigned char *base = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | base[i];
    if (hlen > len - 8)
        fail("%s: header length %llu is larger than the file (%zu bytes)", path,
             (unsigned long long)hlen, len);
    const char *hdr = (const char *)base + 8;
    // The reference writer pads with spaces; json_parse_strict refuses anything else after the
    // object, duplicate keys and NUL characters in names.
    char why[512];
    cJSON *root = json_parse_strict(hdr, (size_t)hlen, why, sizeof why);
    if (!root) fail("%s: header: %s", path, why);
    if (!cJSON_IsObject(root)) fail("%s: header is not a JSON object", path);

    StFile *f = xcalloc(1, sizeof *f);
    f->path = xstrdup(path);
    f->map = map;
    f->map_len = len;
    const unsigned char *data = base + 8 + hlen;
    size_t data_len = len - 8 - (size_t)hlen;
    int cap = cJSON_GetArraySize(root);
    f->t = xcalloc((size_t)cap, sizeof *f->t);
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (!cJSON_IsObject(e)) fail("%s: __metadata__ is not an object", path);
            int nm = cJSON_GetArraySize(e);
            f->meta = xcalloc((size_t)nm * 2, sizeof *f->meta);
            const cJSON *kv;
            cJSON_ArrayForEach(kv, e) {
                if (!cJSON_IsString(kv))
                    fail("%s: __metadata__ value for '%s' is not a string", path, kv->string);
                f->meta[2 * f->n_meta] = xstrdup(kv->string);
                f->meta[2 * f->n_meta + 1] = xstrdup(kv->valuestring);
                f->n_meta++;
            }
            continue;
        }
        StTensor *t = &f->t[f->n];
        parse_tensor(path, e, t, data, data_len);
        f->n++;
    }
    cJSON_Delete(root);
    check_layout(f, data, data_len);

    f->by_name = xmalloc((size_t)(f->n ? f->n : 1) * sizeof *f->by_name);
    for (int i = 0; i < f->n; i++) f->by_name[i] = &f->t[i];
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_tensor_ptr);
    for (int i = 1; i < f->n; i++)
        if (strcmp(f->by_name[i - 1]->name, f->by_name[i]->name) == 0)
            fail("%s: tensor '%s' appears twice in the header", path, f->by_name[i]->name);
    return f;
}

int st_count(const StFile *f) { return f->n; }

const StTensor *st_tensor(const StFile *f, int i) {
    return (i >= 0 && i < f->n) ? &f->t[i] : NULL;
}

const StTensor *st_find(const StFile *f, const char *name) {
    const StTensor *const *p =
        bsearch(name, f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_name_key);
    return p ? *p : NULL;
}

const char *st_metadata(const StFile *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}

void st_close(StFile *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free(f->t[i].name);
    for (int i = 0; i < 2 * f->n_meta; i++) free(f->meta[i]);
    free(f->meta);
    free(f->t);
    free(f->by_name);
    munmap(f->map, f->map_len);
    free(f->path);
    free(f);
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);  // inf, or NaN keeping its payload
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
    } else if (mant == 0) {
        bits = sign;
    } else {
        // Subnormal half: shift the mantissa up until its leading 1 becomes implicit.
        int e = 113;
        while (!(mant & 0x400)) { mant <<= 1; e--; }
        bits = sign | ((uint32_t)e << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void st_to_f32(const StTensor *t, float *out) {
    size_t n = st_numel(t);
    const unsigned char *p = t->data;
    if (strcmp(t->dtype, "F32") == 0) {
        memcpy(out, p, n * 4);
    } else if (strcmp(t->dtype, "BF16") == 0) {
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&out[i], &bits, 4);
        }
    } else if (strcmp(t->dtype, "F16") == 0) {
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            out[i] = f16_to_f32(h);
        }
    } else {
        fail("tensor '%s' has dtype %s; only F32, BF16 and F16 can be loaded", t->name,
             t->dtype);
    }
}

// ---------------------------------------------------------------------------------------
// Model directories

static StModel *model_from_files(const char *dir, StFile **files, int n_files) {
    StModel *m = xcalloc(1, sizeof *m);
    m->files = files;
    m->n_files = n_files;
    for (int i = 0; i < n_files; i++) m->n += files[i]->n;
    m->by_name = xmalloc((size_t)(m->n ? m->n : 1) * sizeof *m->by_name);
    int k = 0;
    for (int i = 0; i < n_files; i++)
        for (int j = 0; j < files[i]->n; j++) m->by_name[k++] = &files[i]->t[j];
    qsort(m->by_name, (size_t)m->n, sizeof *m->by_name, cmp_tensor_ptr);
    for (int i = 1; i < m->n; i++)
        if (strcmp(m->by_name[i - 1]->name, m->by_name[i]->name) == 0)
            fail("%s: tensor '%s' is stored in more than one shard", dir, m->by_name[i]->name);
    return m;
}

StModel *st_open_model_dir(const char *dir) {
    char path[4096];
    join_path(path, sizeof path, dir, "model.safetensors");
    if (path_exists(path)) {
        StFile **files = xmalloc(sizeof *files);
        files[0] = st_open(path);
        return model_from_files(dir, files, 1);
    }
    char ipath[4096];
    join_path(ipath, sizeof ipath, dir, "model.safetensors.index.json");
    if (!path_exists(ipath))
        fail("%s: neither model.safetensors nor model.safetensors.index.json found", dir);
    cJSON *root = json_read_file(ipath);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) fail("%s: missing object 'weight_map'", ipath);
    if (!wm->child) fail("%s: 'weight_map' is empty", ipath);

    // Distinct shard names, in first-seen order.
    int n_wm = cJSON_GetArraySize(wm), n_files = 0;
    char **names = xcalloc((size_t)n_wm, sizeof *names);
    const cJSON *e;
    cJSON_ArrayForEach(e, wm) {
        if (!cJSON_IsString(e))
            fail("%s: weight_map entry for '%s' is not a file name", ipath, e->string);
        if (!e->valuestring[0] || strchr(e->valuestring, '/') || strcmp(e->valuestring, "..") == 0)
            fail("%s: weight_map names '%s' for '%s', not a plain file name", ipath,
                 e->valuestring, e->string);
        int seen = 0;
        for (int i = 0; i < n_files && !seen; i++) seen = strcmp(names[i], e->valuestring) == 0;
        if (!seen) names[n_files++] = e->valuestring;
    }
    StFile **files = xcalloc((size_t)n_files, sizeof *files);
    for (int i = 0; i < n_files; i++) {
        join_path(path, sizeof path, dir, names[i]);
        if (!path_exists(path))
            fail("%s: names shard '%s', which does not exist in %s", ipath, names[i], dir);
        files[i] = st_open(path);
    }
    // The index must agree with the shards, or a missing tensor would surface much later.
    cJSON_ArrayForEach(e, wm) {
        int fi = 0;
        while (strcmp(names[fi], e->valuestring) != 0) fi++;
        if (!st_find(files[fi], e->string))
            fail("%s: tensor '%s' is mapped to '%s' but that shard does not contain it", ipath,
                 e->string, e->valuestring);
    }
    free(names);
    cJSON_Delete(root);
    return model_from_files(dir, files, n_files);
}

const StTensor *st_model_find(const StModel *m, const char *name) {
    const StTensor *const *p =
        bsearch(name, m->by_name, (size_t)m->n, sizeof *m->by_name, cmp_name_key);
    return p ? *p : NULL;
}

int st_model_count(const StModel *m) { return m->n; }

const StTensor *st_model_tensor(const StModel *m, int i) {
    return (i >= 0 && i < m->n) ? m->by_name[i] : NULL;
}

void st_model_close(StModel *m) {
    if (!m) return;
    for (int i = 0; i < m->n_files; i++) st_close(m->files[i]);
    free(m->files);
    free(m->by_name);
    free(m);
}

// ---------------------------------------------------------------------------------------
// Writer: no fail() here, the caller decides what an I/O error means.

typedef struct { char *p; size_t len, cap; int oom; } Buf;

static void buf_put(Buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void buf_str(Buf *b, const char *s) { buf_put(b, s, strlen(s)); }

static void buf_json_str(Buf *b, const char *s) {
    buf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\'; esc[1] = (char)c;
            buf_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            buf_put(b, esc, 6);
        } else {
            buf_put(b, (const char *)&c, 1);
        }
    }
    buf_put(b, "\"", 1);
}

static int item_numel(const StWriteItem *it, size_t *numel) {
    if (!it->name || it->ndim < 0 || it->ndim > 4) return 0;
    size_t n = 1;
    for (int d = 0; d < it->ndim; d++)
        if (it->shape[d] < 0 || __builtin_mul_overflow(n, (size_t)it->shape[d], &n)) return 0;
    if (it->dtype) {  // raw bytes of another dtype: sizes must agree
        size_t es = st_dtype_size(it->dtype);
        if (!es || n > SIZE_MAX / es || n * es != it->nbytes || (n && !it->raw && !it->fill)) return 0;
        *numel = n;
        return 1;
    }
    if (n > SIZE_MAX / 4 || (n && !it->data && !it->fill)) return 0;
    *numel = n;
    return 1;
}

// Elements of item `it` (numel of them) that one fill call makes.
static size_t fill_piece(const StWriteItem *it, size_t numel) {
    return it->chunk && it->chunk < numel ? it->chunk : numel;
}

// Writes a filled item through buf (room for the largest piece, in floats).
static int write_filled(FILE *f, const StWriteItem *it, size_t numel, float *buf) {
    const size_t es = it->dtype ? st_dtype_size(it->dtype) : 4, piece = fill_piece(it, numel);
    for (size_t first = 0; first < numel; first += piece) {
        const size_t n = numel - first < piece ? numel - first : piece;
        const size_t bytes = it->fill(it->ctx, first, n, buf);
        if (bytes != n * es) { errno = EIO; return 0; }  // a fill that disagrees with the header
        if (fwrite(buf, 1, bytes, f) != bytes) return 0;
    }
    return 1;
}

int st_write(const char *path, const StWriteItem *items, int n, const char *const *metadata_kv) {
    if (n < 0 || (n && !items)) { errno = EINVAL; return -1; }
    // Names must be unique: a hash set keeps this linear for models with many layers.
    struct { char *key; int value; } *seen = NULL;
    int bad = 0;
    for (int i = 0; i < n && !bad; i++) {
        size_t numel = 0;
        bad = !item_numel(&items[i], &numel) || strcmp(items[i].name, "__metadata__") == 0 ||
              shgeti(seen, items[i].name) >= 0;
        if (!bad) shput(seen, items[i].name, i);
    }
    shfree(seen);
    if (bad) { errno = EINVAL; return -1; }

    Buf b = {0};
    char num[64];
    buf_str(&b, "{");
    int first = 1;
    if (metadata_kv && metadata_kv[0]) {
        buf_str(&b, "\"__metadata__\":{");
        for (int i = 0; metadata_kv[i]; i += 2) {
            if (!metadata_kv[i + 1]) { free(b.p); errno = EINVAL; return -1; }
            if (i) buf_str(&b, ",");
            buf_json_str(&b, metadata_kv[i]);
            buf_str(&b, ":");
            buf_json_str(&b, metadata_kv[i + 1]);
        }
        buf_str(&b, "}");
        first = 0;
    }
    uint64_t off = 0;
    size_t piece = 0;  // the filled items' one buffer: their largest piece
    for (int i = 0; i < n; i++) {
        const StWriteItem *it = &items[i];
        size_t numel = 0;
        item_numel(it, &numel);
        if (it->fill && fill_piece(it, numel) > piece) piece = fill_piece(it, numel);
        if (!first) buf_str(&b, ",");
        first = 0;
        buf_json_str(&b, it->name);
        buf_str(&b, ":{\"dtype\":");
        buf_json_str(&b, it->dtype ? it->dtype : "F32");
        buf_str(&b, ",\"shape\":[");
        for (int d = 0; d < it->ndim; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", (long long)it->shape[d]);
            buf_str(&b, num);
        }
        size_t bytes = it->dtype ? it->nbytes : numel * 4;
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                 (unsigned long long)(off + bytes));
        buf_str(&b, num);
        off += bytes;
    }
    buf_str(&b, "}");
    while (!b.oom && b.len % 8) buf_put(&b, " ", 1);  // keeps the data 8-byte aligned
    if (b.oom) { free(b.p); errno = ENOMEM; return -1; }

    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)b.len >> (8 * i));
    FILE *f = fopen(path, "wb");
    if (!f) { free(b.p); return -1; }
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(b.p, 1, b.len, f) == b.len;
    free(b.p);
    float *buf = piece ? malloc(piece * sizeof(float)) : NULL;
    if (piece && !buf) ok = 0, errno = ENOMEM;
    for (int i = 0; ok && i < n; i++) {
        size_t numel = 0;
        item_numel(&items[i], &numel);
        if (numel && items[i].fill) ok = write_filled(f, &items[i], numel, buf);
        else if (items[i].dtype) ok = items[i].nbytes == 0 || fwrite(items[i].raw, 1, items[i].nbytes, f) == items[i].nbytes;
        else ok = numel == 0 || fwrite(items[i].data, 4, numel, f) == numel;
    }
    free(buf);
    // Only a regular file is ours to fsync or remove: the path may be a device or a pipe.
    struct stat st;
    int regular = fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode);
    ok = ok && fflush(f) == 0 && (!regular || fsync(fileno(f)) == 0);
    int saved = errno;
    if (fclose(f) != 0 && ok) { ok = 0; saved = errno; }
    if (!ok) {
        if (regular) unlink(path);
        errno = saved ? saved : EIO;
        return -1;
    }
    return 0;
}
