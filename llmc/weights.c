// weights.c: see weights.h.
#include "weights.h"
#include <stdlib.h>
#include "util.h"

typedef struct {
    void *dev;
    int layer;        // -1: empty
    Event *loaded;    // copy queue: the block is on the device
    Event *released;  // compute queue: its last reader is done
    long last_use;    // acquire counter, for choosing the slot to refill
} Slot;

struct Streamer {
    Backend *bk;
    int L;
    size_t block;
    const char *host;
    Queue *copyq;
    Slot slot[2];
    long clock;
    int current;      // slot of the most recent acquire
    double loaded_bytes;
};

Streamer *streamer_create(Backend *bk, int L, size_t block_bytes, const void *host_blocks) {
    Streamer *s = xcalloc(1, sizeof(Streamer));
    s->bk = bk, s->L = L, s->block = block_bytes, s->host = host_blocks;
    s->copyq = bk->queue_create(bk);
    for (int i = 0; i < 2; i++) {
        s->slot[i].dev = bk->dev_alloc(bk, block_bytes, "streamed layer slot");
        s->slot[i].layer = -1;
        s->slot[i].loaded = bk->event_create(bk);
        s->slot[i].released = bk->event_create(bk);
    }
    s->current = -1;
    return s;
}

void streamer_free(Streamer *s) {
    if (!s) return;
    Backend *bk = s->bk;
    bk->sync(bk);
    for (int i = 0; i < 2; i++) {
        bk->dev_free(bk, s->slot[i].dev);
        bk->event_destroy(bk, s->slot[i].loaded);
        bk->event_destroy(bk, s->slot[i].released);
    }
    bk->queue_destroy(bk, s->copyq);
    free(s);
}

static int find(const Streamer *s, int l) {
    for (int i = 0; i < 2; i++)
        if (s->slot[i].layer == l) return i;
    return -1;
}

static void load(Streamer *s, int i, int l) {
    Backend *bk = s->bk;
    Slot *sl = &s->slot[i];
    bk->queue_wait(bk, s->copyq, sl->released);  // its previous layer's readers are done
    bk->copy_h2d(bk, sl->dev, s->host + (size_t)l * s->block, s->block, s->copyq);
    bk->event_record(bk, sl->loaded, s->copyq);
    sl->layer = l;
    s->loaded_bytes += (double)s->block;
}

void *streamer_acquire(Streamer *s, int l) {
    int i = find(s, l);
    if (i < 0) {
        // Refill the slot used least recently (never the one a prefetch just filled for l).
        i = s->slot[0].last_use <= s->slot[1].last_use ? 0 : 1;
        load(s, i, l);
    }
    s->bk->queue_wait(s->bk, NULL, s->slot[i].loaded);
    s->slot[i].last_use = ++s->clock;
    s->current = i;
    return s->slot[i].dev;
}

void streamer_prefetch(Streamer *s, int l) {
    if (l < 0 || l >= s->L || find(s, l) >= 0) return;
    load(s, s->current == 0 ? 1 : 0, l);
}

void streamer_release(Streamer *s, int l) {
    int i = find(s, l);
    if (i >= 0) s->bk->event_record(s->bk, s->slot[i].released, NULL);
}

double streamer_bytes_loaded(const Streamer *s) { return s->loaded_bytes; }
