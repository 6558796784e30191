// weights.h: frozen-layer streaming (layer_offloading). A layer's frozen weights live in
// pinned host memory as one contiguous block; the device has two slots. While layer i
// computes, the next layer the engine will need is loaded into the other slot on a copy queue;
// a slot is refilled only after the event of its last reader. Frozen weights are never copied
// back. A slot that already holds the requested layer is reused, so a recompute followed by
// the same layer's backward costs one load.
#pragma once
#include <stddef.h>
#include "backend.h"

typedef struct Streamer Streamer;

// host_blocks: L blocks of block_bytes each (from bk->host_alloc).
Streamer *streamer_create(Backend *bk, int L, size_t block_bytes, const void *host_blocks);
void streamer_free(Streamer *s);
// Device pointer to layer l's block, ready for compute-queue work issued after this call.
void *streamer_acquire(Streamer *s, int l);
// Starts loading layer l into the slot the current layer does not use (no-op if present or
// l out of range).
void streamer_prefetch(Streamer *s, int l);
// Compute-queue work issued so far is the last to read layer l's slot.
void streamer_release(Streamer *s, int l);
// Bytes copied host -> device since creation.
double streamer_bytes_loaded(const Streamer *s);
