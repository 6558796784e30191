// actstore.c: see actstore.h.
//
// Buffers, all allocated at creation:
//   dev[l][s]      kept tensors whose home is the device
//   host[l][s]     pinned host copies of kept tensors (host tiers)
//   stash[s][k]    device staging for offloaded tensors of kind s: forward writes into a ring
//                  of `depth` of them while earlier copies drain; backward prefetches into the
//                  first two (by parity), so the two phases share the memory
//   staging[s][j]  two pinned host buffers per kind between stash and the disk I/O thread
//                  (disk tier): forward alternates them, backward reads into them by parity.
//                  The copy into one is synchronous, so two keep the I/O thread busy; more
//                  would only cost host memory (8 GiB each for an 8B model's layer input at 1M)
//   scratch[j][s]  tensors that are recomputed: one set, or one per layer of a checkpoint
//                  segment for full checkpointing (j = layer - segment start)
//   tile[3]        gate/up/h for one MLP tile when the MLP is tiled
#include "family.h"
#include "actstore.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "diskio.h"
#include "util.h"

#define MAXDEPTH 64
// In-flight copies hide the copy time of short layers. A layer whose kept tensor is large
// (long context) computes far longer than its copy takes, so a kind's stash holds no more
// buffers than fit in this (and never fewer than the two a layer needs).
#define STASH_CAP_BYTES ((size_t)2 << 30)

struct ActStore {
    Backend *bk;
    ModelConfig cfg;
    MemPolicy pol;
    int B, T, L, depth, sets, tile_rows;
    size_t bytes[S_COUNT];
    unsigned char *saved, *home;     // [L][S_COUNT]
    void **dev, **host, **fwd_ptr;   // [L][S_COUNT]
    void *stash[S_COUNT][MAXDEPTH];
    void *staging[S_COUNT][MAXDEPTH];
    Event *stash_ev[S_COUNT][MAXDEPTH];
    int stash_busy[S_COUNT][MAXDEPTH];
    DiskJob *jobs[S_COUNT][MAXDEPTH];
    int job_busy[S_COUNT][MAXDEPTH];
    int next_k[S_COUNT], kdepth[S_COUNT];  // ring position and depth per kind
    int next_stage[S_COUNT];                // disk staging buffer the next write uses
    int *stash_k;                    // [L][S_COUNT] ring index a kept tensor used in forward
    void **scratch;                  // [sets][S_COUNT]
    void *tile[4], *final_res, *sink;  // tile: gate, up, h, ln2 of one MLP chunk
    void *att_tile[3];               // ln1, q, att of one attention tile (tiled_attention)
    int att_rows;                    // rows per attention tile
    Queue *copyq;
    Event *ev_compute, *fetch_ev[2], *release_ev[2];
    int *order, norder, *order_pos;  // backward fetch order (layers with offloaded tensors)
    int fetched;                     // next index of order to fetch
    DiskIO *io;
    ActTiers tiers;
};

#define AT(st, arr, l, s) ((st)->arr[(size_t)(l) * S_COUNT + (s)])

int mlp_tile_rows(const ModelConfig *c, const MemPolicy *p, int B, int T) {
    // Every mode runs the MLP over the same row chunks, so the weight gradients sum in the
    // same order whether or not tiled_mlp recomputes the chunks: tiling changes no bits.
    int N = B * T;  // model_alloc_acts checked that it fits an int
    int shards = p->mlp_shards > 0 ? p->mlp_shards : (int)(((int64_t)T + c->hidden_size - 1) / c->hidden_size);
    if (shards < 1) shards = 1;
    return (N + shards - 1) / shards;
}

int att_tile_rows(const ModelConfig *c, const MemPolicy *p, int T, int align) {
    // Tiles start at multiples of the backend's attention block (so a tile computes what one
    // call over all queries computes); a backend without query tiles gets whole sequences.
    int shards = p->mlp_shards > 0 ? p->mlp_shards : (int)(((int64_t)T + c->hidden_size - 1) / c->hidden_size);
    if (shards < 1) shards = 1;
    int64_t n = ((int64_t)T + shards - 1) / shards;
    if (align <= 0) return T;
    // Every mode walks these spans, and a span shorter than a sequence holds one sequence's rows:
    // at GPT-2 124M's B 16, T 1024 the default 512 made 32 spans a layer, each projection a
    // 512-row GEMM (the H200 ran them at 72-88 TFLOP/s, 3168 calls a step). By default a span
    // is at least ATT_SPAN_MIN_ROWS rows, so up to that length one span covers the whole batch;
    // an explicit tiled_mlp_shards is taken as given.
    if (p->mlp_shards <= 0 && n < ATT_SPAN_MIN_ROWS) n = ATT_SPAN_MIN_ROWS;
    n = (n + align - 1) / align * align;
    return n < T ? (int)n : T;
}

int att_span_count(int B, int T, int rows) { return rows >= T ? 1 : B * ((T + rows - 1) / rows); }

size_t att_span_max_rows(int B, int T, int rows) { return rows >= T ? (size_t)B * T : (size_t)rows; }

size_t slot_bytes(const ModelConfig *c, const MemPolicy *p, int B, int T, int A, int s) {
    const size_t N = (size_t)B * T, C = c->hidden_size, I = c->intermediate_size;
    const size_t QD = (size_t)c->num_attention_heads * c->head_dim;
    const size_t KD = (size_t)c->num_key_value_heads * c->head_dim;
    switch (s) {
    case S_LN1: return p->tiled_attention ? 0 : N * C * A;  // tiled: one tile at a time
    case S_LN2: return p->tiled_mlp ? 0 : N * C * A;  // tiled: one MLP chunk at a time
    case S_XIN: case S_XMID: return N * C * A;
    case S_RSTD1: case S_RSTD2: return N * sizeof(float) * (c->arch == ARCH_GPT2 ? 2 : 1);  // (mean,) rstd
    case S_Q: case S_ATT: return p->tiled_attention ? 0 : N * QD * A;
    case S_K: case S_V: return N * KD * A;
    case S_LSE: return (size_t)B * c->num_attention_heads * T * sizeof(float);
    case S_UP: if (c->arch == ARCH_GPT2) return 0;  // GPT-2's MLP: fc (in gate) and gelu (h)
        __attribute__((fallthrough));
    case S_GATE: case S_H: return p->tiled_mlp ? 0 : N * I * A;
    // Gemma 3's sandwich norms read their inputs (whole, tiled or not) and rstd in backward.
    case S_AO: case S_FO: return family_sandwich(c) ? N * C * A : 0;
    case S_RSTDPA: case S_RSTDPF: return family_sandwich(c) ? N * sizeof(float) : 0;
    }
    return 0;
}

// What the recompute policy keeps: everything, the segment inputs, or the expensive outputs.
static int policy_saves(const MemPolicy *p, int l, int s) {
    switch (p->recompute) {
    case RC_FULL: return s == S_XIN && l % p->every == 0;
    case RC_SELECTIVE:
        return s == S_XIN || s == S_Q || s == S_K || s == S_V || s == S_ATT || s == S_LSE ||
               s == S_XMID || s == S_GATE || s == S_UP || s == S_AO || s == S_FO || s == S_RSTDPA ||
               s == S_RSTDPF;  // the sandwich norms' inputs are products; their rstd N floats
    default: return 1;
    }
}

static int policy_home(const MemPolicy *p, int L, int l, int s, size_t bytes) {
    if (p->tier == TIER_DEVICE || bytes < p->min_offload) return HOME_DEVICE;
    if (p->hidden_states && (s != S_XIN || l == L - 1)) return HOME_DEVICE;
    return p->tier == TIER_DISK ? HOME_DISK : HOME_HOST;
}

// What is kept (saved[l][s]) and where (home[l][s]), shared by the store and act_stats so the
// planner's disk bytes are the store's. A tiered policy fills the tiers strictly in layer
// order: once a tensor does not fit a tier, every later one goes further down, so the first
// layers stay on the device (read last in backward) and the last ones go to disk.
// tiers (optional): layers and bytes per home among the tensors the tiers decided.
static void assign_homes(const ModelConfig *c, const MemPolicy *p, int B, int T, int A,
                         unsigned char *saved, unsigned char *home, ActTiers *tiers) {
    const int L = c->num_hidden_layers;
    int tier = HOME_DEVICE;
    size_t dev_used = 0, host_used = 0;
    if (tiers) memset(tiers, 0, sizeof *tiers);
    for (int l = 0; l < L; l++) {
        int in_home[3] = {0};
        for (int s = 0; s < S_COUNT; s++) {
            size_t b = slot_bytes(c, p, B, T, A, s);
            int keep = b && policy_saves(p, l, s), h = keep ? policy_home(p, L, l, s, b) : HOME_DEVICE;
            if (keep && p->tiered && p->tier == TIER_HOST && h == HOME_HOST) {
                if (tier == HOME_DEVICE &&
                    !(dev_used + b <= p->dev_budget && (!p->shared_budget || host_used + b <= p->host_budget)))
                    tier = HOME_HOST;
                if (tier == HOME_HOST && !(host_used + b <= p->host_budget)) tier = HOME_DISK;
                h = tier;
                if (h == HOME_DEVICE) dev_used += b;
                if (h == HOME_HOST || (h == HOME_DEVICE && p->shared_budget)) host_used += b;
                in_home[h] = 1;
                if (tiers) tiers->bytes[h] += b;
            }
            saved[(size_t)l * S_COUNT + s] = (unsigned char)keep;
            home[(size_t)l * S_COUNT + s] = (unsigned char)h;
        }
        if (tiers)
            for (int h = 0; h < 3; h++) tiers->layers[h] += in_home[h];
    }
}

int act_segment_start(const ActStore *st, int l) {
    return st->pol.recompute == RC_FULL ? (l / st->pol.every) * st->pol.every : l;
}

int act_is_saved(const ActStore *st, int l, int s) { return AT(st, saved, l, s); }

static int scratch_set(const ActStore *st, int l) {
    return st->pol.recompute == RC_FULL ? l - act_segment_start(st, l) : 0;
}

ActStore *actstore_create(Backend *bk, const ModelConfig *c, const MemPolicy *p, int B, int T, int att_align) {
    ActStore *st = xcalloc(1, sizeof(ActStore));
    st->bk = bk, st->cfg = *c, st->pol = *p, st->B = B, st->T = T;
    const int L = st->L = c->num_hidden_layers, A = bk->act_bytes;
    if (st->pol.recompute == RC_FULL && st->pol.every < 1) st->pol.every = 1;
    for (int s = 0; s < S_COUNT; s++) st->bytes[s] = slot_bytes(c, p, B, T, A, s);
    st->saved = xcalloc((size_t)L * S_COUNT, 1);
    st->home = xcalloc((size_t)L * S_COUNT, 1);
    st->dev = xcalloc((size_t)L * S_COUNT, sizeof(void *));
    st->host = xcalloc((size_t)L * S_COUNT, sizeof(void *));
    st->fwd_ptr = xcalloc((size_t)L * S_COUNT, sizeof(void *));
    st->stash_k = xcalloc((size_t)L * S_COUNT, sizeof(int));
    st->sets = st->pol.recompute == RC_FULL ? (st->pol.every < L ? st->pol.every : L) : 1;
    st->scratch = xcalloc((size_t)st->sets * S_COUNT, sizeof(void *));

    // Decide, then allocate: kept tensors, their host copies, the scratch they don't need.
    int offloaded_kinds = 0, kind_offloaded[S_COUNT] = {0}, kind_disk[S_COUNT] = {0}, any_disk = 0;
    unsigned char *need_scratch = xcalloc((size_t)st->sets * S_COUNT, 1);
    assign_homes(c, &st->pol, B, T, A, st->saved, st->home, &st->tiers);
    for (int l = 0; l < L; l++)
        for (int s = 0; s < S_COUNT; s++) {
            if (!st->bytes[s]) continue;
            if (!AT(st, saved, l, s)) {
                need_scratch[scratch_set(st, l) * S_COUNT + s] = 1;
                continue;
            }
            int home = AT(st, home, l, s);
            if (home == HOME_DEVICE) AT(st, dev, l, s) = bk->dev_alloc(bk, st->bytes[s], "activations (kept)");
            else kind_offloaded[s]++;  // layers whose tensor of kind s leaves the device
            if (home == HOME_HOST) AT(st, host, l, s) = bk->host_alloc(bk, st->bytes[s], "activations (host copy)");
            if (home == HOME_DISK) kind_disk[s] = any_disk = 1;
        }
    for (int j = 0; j < st->sets; j++)
        for (int s = 0; s < S_COUNT; s++)
            if (need_scratch[j * S_COUNT + s]) st->scratch[j * S_COUNT + s] = bk->dev_alloc(bk, st->bytes[s], "activations (recompute)");
    free(need_scratch);
    for (int s = 0; s < S_COUNT; s++) offloaded_kinds += kind_offloaded[s] > 0;

    // Stash depth: legacy copies synchronously (one buffer); the async tiers keep enough
    // buffers for max_stash copies in flight, and at least the two backward prefetch needs.
    if (offloaded_kinds) {
        int d = p->tier == TIER_HOST_SYNC ? 1 : (p->max_stash + offloaded_kinds - 1) / offloaded_kinds;
        if (p->tier != TIER_HOST_SYNC && d < 2) d = 2;
        st->depth = d > MAXDEPTH ? MAXDEPTH : d;
        for (int s = 0; s < S_COUNT; s++) {
            if (!kind_offloaded[s]) continue;
            // A layer writes the next layer's input while reading its own: two at least.
            // More buffers than tensors of the kind that ever leave would never be used.
            int d = st->depth < kind_offloaded[s] ? st->depth : kind_offloaded[s];
            if ((size_t)d * st->bytes[s] > STASH_CAP_BYTES) d = (int)(STASH_CAP_BYTES / st->bytes[s]);
            int min_d = p->tier == TIER_HOST_SYNC ? (s == S_XIN ? 2 : 1) : 2;
            st->kdepth[s] = d < min_d ? min_d : d;
            for (int k = 0; k < st->kdepth[s]; k++) {
                st->stash[s][k] = bk->dev_alloc(bk, st->bytes[s], "activation offload stash");
                st->stash_ev[s][k] = bk->event_create(bk);
                if (kind_disk[s] && k < 2) {
                    st->staging[s][k] = bk->host_alloc(bk, st->bytes[s], "disk staging");
                    st->jobs[s][k] = xcalloc(1, sizeof(DiskJob));
                }
            }
        }
        st->copyq = bk->queue_create(bk);
        st->ev_compute = bk->event_create(bk);
        for (int i = 0; i < 2; i++) st->fetch_ev[i] = bk->event_create(bk), st->release_ev[i] = bk->event_create(bk);
        if (any_disk && !bk->dry_run) st->io = diskio_create(p->disk_dir, &bk->mem);
    }
    // Backward consumes offloaded layers top down (full checkpointing: segment starts).
    st->order = xcalloc(L, sizeof(int));
    st->order_pos = xcalloc(L, sizeof(int));
    for (int l = L - 1; l >= 0; l--) {
        st->order_pos[l] = -1;
        if (act_segment_start(st, l) != l) continue;
        for (int s = 0; s < S_COUNT; s++)
            if (AT(st, saved, l, s) && AT(st, home, l, s) != HOME_DEVICE) {
                st->order_pos[l] = st->norder;
                st->order[st->norder++] = l;
                break;
            }
    }
    st->tile_rows = mlp_tile_rows(c, p, B, T);
    if (p->tiled_mlp) {
        for (int i = 0; i < 3; i++)
            st->tile[i] = bk->dev_alloc(bk, (size_t)st->tile_rows * c->intermediate_size * A, "tiled MLP buffers");
        st->tile[3] = bk->dev_alloc(bk, (size_t)st->tile_rows * c->hidden_size * A, "tiled MLP buffers");
    }
    st->att_rows = att_tile_rows(c, p, T, att_align);
    if (p->tiled_attention) {
        const size_t R = att_span_max_rows(B, T, st->att_rows);
        const size_t QD = (size_t)c->num_attention_heads * c->head_dim;
        st->att_tile[0] = bk->dev_alloc(bk, R * c->hidden_size * A, "tiled attention buffers");
        st->att_tile[1] = bk->dev_alloc(bk, R * QD * A, "tiled attention buffers");
        st->att_tile[2] = bk->dev_alloc(bk, R * QD * A, "tiled attention buffers");
    }
    st->final_res = bk->dev_alloc(bk, st->bytes[S_XIN], "final residual");
    return st;
}

void actstore_free(ActStore *st) {
    Backend *bk = st->bk;
    diskio_destroy(st->io);
    for (size_t i = 0; i < (size_t)st->L * S_COUNT; i++) {
        bk->dev_free(bk, st->dev[i]);
        if (st->host[i]) bk->host_free(bk, st->host[i]);
    }
    for (int s = 0; s < S_COUNT; s++)
        for (int k = 0; k < st->kdepth[s]; k++) {
            bk->dev_free(bk, st->stash[s][k]);
            if (st->stash_ev[s][k]) bk->event_destroy(bk, st->stash_ev[s][k]);
            if (st->staging[s][k]) bk->host_free(bk, st->staging[s][k]);
            free(st->jobs[s][k]);
        }
    for (int i = 0; i < st->sets * S_COUNT; i++) bk->dev_free(bk, st->scratch[i]);
    for (int i = 0; i < 4; i++) bk->dev_free(bk, st->tile[i]);
    for (int i = 0; i < 3; i++) bk->dev_free(bk, st->att_tile[i]);
    bk->dev_free(bk, st->final_res);
    if (st->copyq) {
        bk->queue_destroy(bk, st->copyq);
        bk->event_destroy(bk, st->ev_compute);
        for (int i = 0; i < 2; i++) bk->event_destroy(bk, st->fetch_ev[i]), bk->event_destroy(bk, st->release_ev[i]);
    }
    free(st->saved), free(st->home), free(st->dev), free(st->host), free(st->fwd_ptr);
    free(st->stash_k), free(st->scratch), free(st->order), free(st->order_pos);
    free(st);
}

static void file_name(char *out, size_t cap, int l, int s) { snprintf(out, cap, "l%d_s%d.bin", l, s); }

// Forward: a kept, offloaded tensor is written into the next stash buffer of its kind, once
// the copy that last used that buffer has drained.
static void *fwd_stash(ActStore *st, int l, int s) {
    void **slot = &AT(st, fwd_ptr, l, s);
    if (*slot) return *slot;
    Backend *bk = st->bk;
    int k = st->next_k[s]++ % st->kdepth[s];
    if (st->stash_busy[s][k]) {
        bk->queue_wait(bk, NULL, st->stash_ev[s][k]);
        st->stash_busy[s][k] = 0;
    }
    AT(st, stash_k, l, s) = k;
    return *slot = st->stash[s][k];
}

static void *ptr(ActStore *st, int l, int s, int backward) {
    if (!st->bytes[s]) return NULL;
    if (!AT(st, saved, l, s)) return st->scratch[scratch_set(st, l) * S_COUNT + s];
    if (AT(st, home, l, s) == HOME_DEVICE) return AT(st, dev, l, s);
    if (!backward) return fwd_stash(st, l, s);
    int pos = st->order_pos[act_segment_start(st, l)];
    return st->stash[s][st->depth == 1 ? 0 : pos % 2];
}

static void fill(ActStore *st, int l, LayerActs *a, int backward) {
    a->xin = ptr(st, l, S_XIN, backward);
    a->ln1 = st->pol.tiled_attention ? st->att_tile[0] : ptr(st, l, S_LN1, backward);
    a->rstd1 = ptr(st, l, S_RSTD1, backward);
    a->q = st->pol.tiled_attention ? st->att_tile[1] : ptr(st, l, S_Q, backward);
    a->k = ptr(st, l, S_K, backward);
    a->v = ptr(st, l, S_V, backward);
    a->att = st->pol.tiled_attention ? st->att_tile[2] : ptr(st, l, S_ATT, backward);
    a->lse = ptr(st, l, S_LSE, backward);
    a->x_mid = ptr(st, l, S_XMID, backward);
    a->ln2 = st->pol.tiled_mlp ? st->tile[3] : ptr(st, l, S_LN2, backward);
    a->rstd2 = ptr(st, l, S_RSTD2, backward);
    a->gate = st->pol.tiled_mlp ? st->tile[0] : ptr(st, l, S_GATE, backward);
    a->up = st->pol.tiled_mlp ? st->tile[1] : ptr(st, l, S_UP, backward);
    a->h = st->pol.tiled_mlp ? st->tile[2] : ptr(st, l, S_H, backward);
    a->ao = ptr(st, l, S_AO, backward);
    a->rstd_pa = ptr(st, l, S_RSTDPA, backward);
    a->fo = ptr(st, l, S_FO, backward);
    a->rstd_pf = ptr(st, l, S_RSTDPF, backward);
}

void act_fwd_layer(ActStore *st, int l, LayerActs *a) { fill(st, l, a, 0); }

void *act_final_residual(ActStore *st) { return st->final_res; }
int act_tile_rows(const ActStore *st) { return st->tile_rows; }
int act_att_rows(const ActStore *st) { return st->att_rows; }

void *act_fwd_output(ActStore *st, int l) {
    return l + 1 < st->L ? ptr(st, l + 1, S_XIN, 0) : st->final_res;
}
void *act_recompute_sink(ActStore *st) { return st->sink; }
void act_set_sink(ActStore *st, void *buf) { st->sink = buf; }

void act_fwd_done(ActStore *st, int l, int for_backward) {
    Backend *bk = st->bk;
    char name[64];
    int recorded = 0;
    for (int s = 0; s < S_COUNT; s++) {
        if (!AT(st, saved, l, s) || AT(st, home, l, s) == HOME_DEVICE) continue;
        int k = AT(st, stash_k, l, s);
        void *src = st->stash[s][k];
        AT(st, fwd_ptr, l, s) = NULL;  // the next forward pass picks a fresh buffer
        if (!for_backward) continue;
        switch (AT(st, home, l, s) == HOME_DISK ? TIER_DISK : st->pol.tier) {
        case TIER_HOST_SYNC:
            bk->copy_d2h(bk, AT(st, host, l, s), src, st->bytes[s], NULL);
            bk->sync(bk);
            break;
        case TIER_HOST:
            if (!recorded) bk->event_record(bk, st->ev_compute, NULL), recorded = 1;
            bk->queue_wait(bk, st->copyq, st->ev_compute);
            bk->copy_d2h(bk, AT(st, host, l, s), src, st->bytes[s], st->copyq);
            bk->event_record(bk, st->stash_ev[s][k], st->copyq);
            st->stash_busy[s][k] = 1;
            break;
        case TIER_DISK: {
            // The staging buffer must be free of its previous write before it is refilled.
            const int j = st->next_stage[s]++ % 2;
            if (st->job_busy[s][j]) diskio_wait(st->io, st->jobs[s][j]), st->job_busy[s][j] = 0;
            bk->copy_d2h(bk, st->staging[s][j], src, st->bytes[s], NULL);
            bk->sync(bk);
            file_name(name, sizeof name, l, s);
            diskio_write(st->io, st->jobs[s][j], name, st->staging[s][j], st->bytes[s]);
            st->job_busy[s][j] = 1;
            break;
        }
        }
    }
}

// Starts moving the tensors of order[i] to the device, into the stash buffers of parity i%2.
static void fetch(ActStore *st, int i) {
    if (i >= st->norder) return;
    Backend *bk = st->bk;
    const int l = st->order[i], p = i % 2;
    char name[64];
    // A tiered layer may have tensors in both: the host ones on the copy queue, the disk ones
    // through the I/O thread into staging (copied to the device when backward reaches them).
    if (st->pol.tier == TIER_HOST) {
        bk->queue_wait(bk, st->copyq, st->release_ev[p]);  // parity p's last reader is done
        for (int s = 0; s < S_COUNT; s++)
            if (AT(st, saved, l, s) && AT(st, home, l, s) == HOME_HOST)
                bk->copy_h2d(bk, st->stash[s][p], AT(st, host, l, s), st->bytes[s], st->copyq);
        bk->event_record(bk, st->fetch_ev[p], st->copyq);
    }
    for (int s = 0; s < S_COUNT; s++) {
        if (!AT(st, saved, l, s) || AT(st, home, l, s) != HOME_DISK) continue;
        if (st->job_busy[s][p]) diskio_wait(st->io, st->jobs[s][p]), st->job_busy[s][p] = 0;
        file_name(name, sizeof name, l, s);
        diskio_read(st->io, st->jobs[s][p], name, st->staging[s][p], st->bytes[s]);
        st->job_busy[s][p] = 1;
    }
    st->fetched = i + 1;
}

void act_bwd_begin(ActStore *st) {
    if (!st->norder) return;
    Backend *bk = st->bk;
    // Every forward write must have landed before backward reads or refills anything.
    for (int s = 0; s < S_COUNT; s++)
        for (int k = 0; k < st->kdepth[s]; k++) {
            if (st->stash_busy[s][k]) bk->queue_wait(bk, st->copyq, st->stash_ev[s][k]), st->stash_busy[s][k] = 0;
            if (st->job_busy[s][k]) diskio_wait(st->io, st->jobs[s][k]), st->job_busy[s][k] = 0;
        }
    st->fetched = 0;
    if (st->pol.tier != TIER_HOST_SYNC) fetch(st, 0);
}

void act_bwd_layer(ActStore *st, int l, LayerActs *a) {
    Backend *bk = st->bk;
    int pos = st->order_pos[l];
    if (pos >= 0 && act_segment_start(st, l) == l && st->fetched <= pos + 1) {
        const int p = pos % 2;
        if (st->pol.tier == TIER_HOST_SYNC) {
            for (int s = 0; s < S_COUNT; s++)
                if (AT(st, saved, l, s) && AT(st, home, l, s) == HOME_HOST)
                    bk->copy_h2d(bk, st->stash[s][0], AT(st, host, l, s), st->bytes[s], NULL);
            bk->sync(bk);
            st->fetched = pos + 2;
        } else {
            if (st->pol.tier == TIER_HOST) bk->queue_wait(bk, NULL, st->fetch_ev[p]);
            int from_disk = 0;
            for (int s = 0; s < S_COUNT; s++) {
                if (!AT(st, saved, l, s) || AT(st, home, l, s) != HOME_DISK) continue;
                diskio_wait(st->io, st->jobs[s][p]);
                st->job_busy[s][p] = 0;
                bk->copy_h2d(bk, st->stash[s][p], st->staging[s][p], st->bytes[s], NULL);
                from_disk = 1;
            }
            if (from_disk) bk->sync(bk);  // staging p is refilled by the fetch after next
            fetch(st, pos + 1);  // one layer ahead
            st->fetched = pos + 2;
        }
    }
    fill(st, l, a, 1);
}

void act_bwd_layer_done(ActStore *st, int l) {
    int pos = st->order_pos[l];
    if (pos >= 0 && st->pol.tier == TIER_HOST) st->bk->event_record(st->bk, st->release_ev[pos % 2], NULL);
}

double forward_flops(const ModelConfig *c, int B, int T) {
    const double N = (double)B * T, C = c->hidden_size, I = c->intermediate_size;
    const double QD = (double)c->num_attention_heads * c->head_dim;
    const double KD = (double)c->num_key_value_heads * c->head_dim;
    double per_layer = 2 * N * C * (QD + 2 * KD) + 2 * N * QD * C + 2 * N * C * I * 3 +
                       2.0 * B * c->num_attention_heads * (double)T * T * c->head_dim;  // causal QK^T + PV
    return per_layer * c->num_hidden_layers + 2 * N * C * c->vocab_size;
}

void act_stats(const ModelConfig *c, const MemPolicy *p, int B, int T, int A, ActStats *out) {
    memset(out, 0, sizeof *out);
    const int L = c->num_hidden_layers;
    const double N = (double)B * T, C = c->hidden_size, I = c->intermediate_size;
    unsigned char *saved = xcalloc((size_t)L * S_COUNT, 1), *home = xcalloc((size_t)L * S_COUNT, 1);
    assign_homes(c, p, B, T, A, saved, home, &out->tiers);
    for (int l = 0; l < L; l++)
        for (int s = 0; s < S_COUNT; s++) {
            size_t i = (size_t)l * S_COUNT + s, b = slot_bytes(c, p, B, T, A, s);
            if (!saved[i]) continue;
            out->saved_bytes[home[i]] += (double)b;
            if (home[i] != HOME_DEVICE) out->moved_bytes += 2.0 * b;
        }
    free(saved), free(home);
    double layer = (forward_flops(c, B, T) - 2 * N * C * c->vocab_size) / L;
    if (p->recompute == RC_FULL) out->recompute_flops = layer * L;
    else if (p->recompute == RC_SELECTIVE) out->recompute_flops = N * (6 * C + 4 * I) * L;  // norms, SwiGLU
    if (p->tiled_mlp) out->recompute_flops += 2 * N * C * I * 2 * L;  // gate and up per tile
    // Tiled attention remakes each tile's q projection and attention output in backward.
    if (p->tiled_attention)
        out->recompute_flops += (2 * N * C * c->num_attention_heads * c->head_dim +
                                 2.0 * B * c->num_attention_heads * (double)T * T * c->head_dim) * L;
}

void mem_policy_describe(const MemPolicy *p, char *out, size_t cap) {
    static const char *tiers[] = {"device", "host (async)", "host (sync)", "disk"};
    char rc[48];
    if (p->recompute == RC_FULL) snprintf(rc, sizeof rc, "recompute: inputs every %d", p->every);
    else snprintf(rc, sizeof rc, "recompute: %s", p->recompute == RC_SELECTIVE ? "selective" : "none");
    snprintf(out, cap, "%s; kept %s on %s%s%s", rc, p->hidden_states ? "layer inputs" : "tensors",
             tiers[p->tier], p->tiled_mlp ? "; tiled MLP" : "", p->tiled_attention ? "; tiled attention" : "");
}

const ActTiers *act_tiers(const ActStore *st) { return &st->tiers; }

void act_describe_tiers(const MemPolicy *p, const ActTiers *t, char *out, size_t cap) {
    out[0] = 0;
    if (!p->tiered) return;
    char b[3][32];
    for (int h = 0; h < 3; h++) format_bytes(b[h], sizeof b[h], t->bytes[h]);
    snprintf(out, cap, "%s: device %d layers (%s), host %d (%s), disk %d (%s)",
             p->hidden_states ? "hidden states" : "kept tensors", t->layers[0], b[0], t->layers[1], b[1],
             t->layers[2], b[2]);
}
