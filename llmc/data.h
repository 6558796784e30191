// data.h: token shards (llm.c's format) and the batch loader.
//
// A shard is a 256-int32 header (magic 20240520, version 1 = uint16 tokens or 2 = uint32,
// token count) followed by the tokens. A loader serves windows of B*T+1 tokens: window k of a
// shard starts at k*B*T; a window needs B*T+1 tokens, so a shard of n tokens has
// floor((n-1)/(B*T)) of them. In order (shuffle false) the loader walks shards and windows
// in order and wraps; shuffled, it visits all windows of all shards in a seeded random order
// per epoch.
//
// Tokens are read with pread() one window at a time, never through a memory map: a shard that
// is truncated or rewritten while the run reads it ends the run with one line naming the shard
// (a map would turn the read past the new end of file into SIGBUS). Before each read the
// loader checks the file is still the one it opened (device, inode, size).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "util.h"

typedef struct {
    char *path;
    uint64_t size;       // file size at open; any change while training is an error
    uint64_t dev, ino;   // identity of the file opened (a replaced file is an error)
    int version;         // 1: uint16, 2: uint32
    size_t ntok;
    size_t nwin;         // windows of B*T+1 at stride B*T
} Shard;

typedef struct {
    Shard *shards;
    int nshards;
    int B, T, vocab;
    int shuffle;
    uint64_t seed;
    size_t total_windows;
    // position: epoch and index of the next window in that epoch's order
    uint64_t epoch;
    size_t next;
    size_t *order;       // permutation of window ids for the current epoch (shuffle)
    int fd;              // open descriptor of shards[fd_shard] (-1: none); one at a time
    int fd_shard;
    uint8_t *buf;        // one window's raw tokens: (B*T+1) x 4 bytes
} DataLoader;

// pattern is a path or a glob; fails naming the file on any problem.
void loader_open(DataLoader *dl, const char *pattern, int B, int T, int vocab, int shuffle,
                 uint64_t seed, const char *key);
// Next window: tokens [B*T] and targets [B*T]; ids are checked against the vocabulary.
void loader_next(DataLoader *dl, int32_t *tokens, int32_t *targets);
void loader_reset(DataLoader *dl);
// Position for checkpoints.
void loader_seek(DataLoader *dl, uint64_t epoch, size_t next);
void loader_close(DataLoader *dl);
// Writes a shard (used by tools and tests). Returns 0 or -1 on I/O error.
int shard_write(const char *path, const uint32_t *tokens, size_t n, int version);
