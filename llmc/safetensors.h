// safetensors.h: read (mmap) and write the safetensors format, and open a Hugging Face model
// directory that holds one file or an index of shards.
//
// Layout: u64 little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the data; offsets count from the end of the header.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define ST_MAX_DIMS 8

typedef struct {
    char *name;
    char dtype[8];            // "F32", "BF16", "F16", "I64", ...
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    size_t nbytes;
    const void *data;         // into the mapping; not necessarily aligned, read via st_to_f32
} StTensor;

typedef struct StFile StFile;
typedef struct StModel StModel;

// Every reader entry point fails (one line naming the file and the problem) on bad input.
StFile *st_open(const char *path);
int st_count(const StFile *f);
const StTensor *st_tensor(const StFile *f, int i);           // header order
const StTensor *st_find(const StFile *f, const char *name);  // NULL if absent
const char *st_metadata(const StFile *f, const char *key);   // NULL if absent
void st_close(StFile *f);

size_t st_dtype_size(const char *dtype);  // 0 if unknown
size_t st_numel(const StTensor *t);
// Converts F32/BF16/F16 to float (exact); fails naming the tensor for any other dtype.
void st_to_f32(const StTensor *t, float *out);

// dir/model.safetensors, else dir/model.safetensors.index.json and every shard it names.
StModel *st_open_model_dir(const char *dir);
const StTensor *st_model_find(const StModel *m, const char *name);  // NULL if absent
int st_model_count(const StModel *m);
const StTensor *st_model_tensor(const StModel *m, int i);           // sorted by name
void st_model_close(StModel *m);

typedef struct {
    const char *name;
    const float *data;
    int ndim;                 // 0..4
    int64_t shape[4];
    const char *dtype;        // NULL: data is F32; else raw holds nbytes of this dtype
    const void *raw;          // (e.g. U8 packed NF4 codes)
    size_t nbytes;
    // Or made as it is written (data and raw NULL): fill puts elements [first, first + n) of
    // the tensor (ctx says which) at dst in the file's dtype (F32 when dtype is NULL; nbytes
    // then still gives the size) and returns the bytes it put there. dst holds n floats, so a
    // 2-byte dtype can be narrowed in place. st_write calls it in order, n at most `chunk` elements (0: the
    // whole tensor at once), through one buffer it reuses for every such item: a checkpoint
    // never holds all of its tensors in host memory at once.
    size_t (*fill)(void *ctx, size_t first, size_t n, void *dst);
    void *ctx;
    size_t chunk;
} StWriteItem;

// Writes every item as F32, in order, data contiguous; metadata_kv is NULL or a
// NULL-terminated list of key, value strings. Returns 0, or -1 with errno set (EINVAL for a
// bad item) after removing the partial file. Never calls fail().
int st_write(const char *path, const StWriteItem *items, int n, const char *const *metadata_kv);
