// plan.c: see plan.h.
#include "plan.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "actstore.h"
#include "comm.h"
#include "stb_ds.h"
#include "util.h"

// ---- a backend that only counts --------------------------------------------------------
// Allocation k gets the fake address (k + 1) * 4096, never dereferenced, so its size is found
// by index: constant time per call, whatever the number of tensors.
typedef struct { size_t *sizes; } CountImpl;  // stb_ds array: bytes of allocation k (0: freed)

static void *count_alloc(Backend *bk, size_t bytes, size_t *in_use, size_t *peak) {
    CountImpl *ci = bk->impl;
    arrput(ci->sizes, bytes);
    *in_use += bytes;
    if (*in_use > *peak) *peak = *in_use;
    return (void *)((uintptr_t)arrlen(ci->sizes) * 4096);
}
static size_t count_free(Backend *bk, void *p) {
    CountImpl *ci = bk->impl;
    if (!p) return 0;
    size_t k = (uintptr_t)p / 4096 - 1, b = ci->sizes[k];
    ci->sizes[k] = 0;
    return b;
}
static void *c_dev_alloc(Backend *bk, size_t n, const char *w) { (void)w; return count_alloc(bk, n, &bk->mem.in_use, &bk->mem.peak); }
static void c_dev_free(Backend *bk, void *p) { bk->mem.in_use -= count_free(bk, p); }
static void *c_host_alloc(Backend *bk, size_t n, const char *w) { (void)w; return count_alloc(bk, n, &bk->mem.host_in_use, &bk->mem.host_peak); }
static void c_host_free(Backend *bk, void *p) { bk->mem.host_in_use -= count_free(bk, p); }
static void c_memzero(Backend *bk, void *d, size_t n, Queue *q) { (void)bk, (void)d, (void)n, (void)q; }
static void c_copy(Backend *bk, void *d, const void *s, size_t n, Queue *q) { (void)bk, (void)d, (void)s, (void)n, (void)q; }
static Queue *c_queue_create(Backend *bk) { (void)bk; return (Queue *)(uintptr_t)1; }
static void c_queue_destroy(Backend *bk, Queue *q) { (void)bk, (void)q; }
static Event *c_event_create(Backend *bk) { (void)bk; return (Event *)(uintptr_t)1; }
static void c_event_destroy(Backend *bk, Event *e) { (void)bk, (void)e; }
static void c_sync(Backend *bk) { (void)bk; }
static void c_copy_2d(Backend *bk, void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t rows, Queue *q) {
    (void)bk, (void)dst, (void)dp, (void)src, (void)sp, (void)w, (void)rows, (void)q;
}

void plan_measure(const ModelConfig *c, const LoraConfig *lora, const ModelOptions *base,
                  const MemPolicy *p, int B, int T, int act_bytes, int att_block, size_t *dev, size_t *host,
                  size_t *disk) {
    CountImpl ci = {0};
    Backend bk = {.name = "plan", .act_bytes = act_bytes, .att_block = att_block, .dry_run = 1, .impl = &ci,
                  .dev_alloc = c_dev_alloc, .dev_free = c_dev_free, .host_alloc = c_host_alloc,
                  .host_free = c_host_free, .memzero = c_memzero, .copy_h2d = c_copy,
                  .copy_d2h = c_copy, .copy_d2d = c_copy, .copy_2d = c_copy_2d, .queue_create = c_queue_create,
                  .queue_destroy = c_queue_destroy, .event_create = c_event_create,
                  .event_destroy = c_event_destroy, .sync = c_sync};
    Model m;
    ModelOptions mo = base ? *base : (ModelOptions){0};
    mo.stream = p->stream_frozen;
    model_create(&m, &bk, c, lora, &mo);
    model_alloc_acts(&m, B, T, p);
    *dev = bk.mem.peak;
    *host = bk.mem.host_peak;
    ActStats as;
    act_stats(c, p, B, T, act_bytes, &as);
    *disk = (size_t)as.saved_bytes[HOME_DISK];
    model_free(&m);
    arrfree(ci.sizes);
}

// ---- modes ------------------------------------------------------------------------------
typedef struct { const char *name; int recompute, tier, hidden; } Mode;
static const Mode MODES[] = {
    {"plain", RC_NONE, TIER_DEVICE, 0},
    {"checkpointing", RC_FULL, TIER_DEVICE, 0},
    {"selective", RC_SELECTIVE, TIER_DEVICE, 0},
    {"offload true", RC_NONE, TIER_HOST, 0},
    {"offload legacy", RC_NONE, TIER_HOST_SYNC, 0},
    {"offload disk", RC_NONE, TIER_DISK, 0},
    {"ckpt + offload true", RC_FULL, TIER_HOST, 0},
    {"hidden_states", RC_FULL, TIER_HOST, 1},
};

// ---- devices -----------------------------------------------------------------------------
// H100 SXM: 989 TFLOP/s dense bf16 and 3.35 TB/s are NVIDIA's datasheet peaks; the sustained
// rates below are assumptions for ranking modes and sizing runs (about 2/3 of peak for large
// cuBLASLt GEMMs; our attention kernels are sm_80-style mma.sync, so a third of that), PCIe Gen5
// x16 at 50 of its 64 GB/s, one NVMe Gen4 drive at 5 GB/s. Fixed memory: a CUDA context of
// about 0.5 GiB, the 32 MiB cuBLASLt workspace (backend_cuda.cu) and kernel scratch.
static const PlanDevice DEVICES[] = {
    {"H100 80GB (CUDA backend, bf16)", 2, 650e12, 0.33, 50e9, 5e9, 640.0 * (1 << 20),
     256.0 * (1 << 20), "H100 SXM datasheet peaks; sustained fractions assumed, not measured here", 0, 64},
    {"H100 80GB (CUDA backend, fp32)", 4, 50e12, 0.33, 50e9, 5e9, 640.0 * (1 << 20),
     256.0 * (1 << 20), "H100 SXM datasheet fp32 (non-tensor) peak 67 TFLOP/s; fractions assumed", 0, 64},
    {"CPU backend (float32)", 4, 100e9, 1.0, 8e9, 1e9, 0, 0,
     "a 2-core x86-64 machine's order of magnitude; \"device\" memory is host memory", 1, 64},
};

const PlanDevice *plan_device(const Config *cfg, const Backend *bk) {
    if (!strcmp(cfg->device, "cuda") || (bk && strcmp(bk->name, "cpu")))
        return &DEVICES[strcmp(cfg->precision, "float32") ? 0 : 1];
    return &DEVICES[2];
}

void plan_print_assumptions(const PlanDevice *d, int world, FILE *f) {
    char fixed[32], comm[32];
    format_bytes(fixed, sizeof fixed, d->fixed_device_bytes);
    format_bytes(comm, sizeof comm, world > 1 ? d->comm_device_bytes : 0);
    fprintf(f, "assumptions (%s): %d-byte activations; GEMM %.0f TFLOP/s, attention at %.0f%% of "
            "that; host link %.0f GB/s; disk %.1f GB/s; fixed device memory %s + collectives %s "
            "per rank (included in the device peaks); %s%s\n", d->name, d->act_bytes,
            d->gemm_flops / 1e12, d->attn_efficiency * 100, d->link_bytes_per_s / 1e9,
            d->disk_bytes_per_s / 1e9, fixed, comm, d->source,
            d->att_block ? "" : "; no tiled-attention rows: these kernels have no query tiles yet");
}

// ---- tiers ------------------------------------------------------------------------------
int plan_budgets(const Config *cfg, const ModelConfig *c, const Backend *bk, const ModelOptions *mo,
                 MemPolicy *p, char *why, size_t cap, size_t ws_out[2]) {
    if (why && cap) why[0] = 0;
    if (ws_out) ws_out[0] = ws_out[1] = 0;
    p->tiered = 0, p->dev_budget = 0, p->host_budget = 0;
    if (p->tier != TIER_HOST) return 0;
    const PlanDevice *dev = plan_device(cfg, bk);
    const int spn = mo && mo->seq_parallel > 1 ? mo->seq_parallel : 1;
    const int world = mo && mo->comm ? mo->comm->world : 1;
    const int B = cfg->micro_batch_size, T = cfg->sequence_len / spn, A = bk ? bk->act_bytes : dev->act_bytes;
    LoraConfig lora;
    config_lora(cfg, c, &lora);
    // The working set: this mode with every tensor the tiers decide on disk (the most staging,
    // nothing kept on the device or the host). What the limits leave beyond it is the budget.
    MemPolicy ws = *p;
    ws.tiered = 1, ws.shared_budget = 0;
    size_t wdev, whost, wdisk;
    const int att_block = spn > 1 ? 0 : bk ? bk->att_block : dev->att_block;  // as plan_rows
    plan_measure(c, &lora, mo, &ws, B, T, A, att_block, &wdev, &whost, &wdisk);
    wdev += (size_t)(dev->fixed_device_bytes + (world > 1 ? dev->comm_device_bytes : 0));
    const size_t dlim = (size_t)cfg->device_memory_limit, hlim = plan_host_limit(cfg);
    // On the CPU backend "device" memory is host memory: it counts against the host limit too.
    const size_t hneed = whost + (dev->host_backed ? wdev : 0);
    if (ws_out) ws_out[0] = wdev, ws_out[1] = whost;
    char a[32], b[32];
    if (dlim && wdev > dlim) {
        format_bytes(a, sizeof a, (double)dlim), format_bytes(b, sizeof b, (double)wdev);
        if (why) snprintf(why, cap, "device_memory_limit %s is below this mode's working set of %s (its "
                          "device memory with every offloaded tensor on disk)", a, b);
        return 1;
    }
    if (hneed > hlim) {
        format_bytes(a, sizeof a, (double)hlim), format_bytes(b, sizeof b, (double)hneed);
        if (why) snprintf(why, cap, "host_memory_limit %s%s is below this mode's working set of %s (host "
                          "memory%s with every offloaded tensor on disk)", a,
                          cfg->host_memory_limit ? "" : " (this machine's memory)", b,
                          dev->host_backed ? ", with the CPU backend's device memory," : "");
        return 1;
    }
    p->tiered = 1;
    p->shared_budget = dev->host_backed;
    p->dev_budget = dlim ? dlim - wdev : 0;
    p->host_budget = hlim == SIZE_MAX ? SIZE_MAX : hlim - hneed;
    if (hlim == SIZE_MAX) return 0;
    // The working set holds disk staging that a run with nothing on disk does not need: when
    // everything the device leaves fits on the host without it, nothing goes to disk.
    MemPolicy all = *p;
    all.host_budget = SIZE_MAX;
    size_t adev, ahost, adisk;
    plan_measure(c, &lora, mo, &all, B, T, A, att_block, &adev, &ahost, &adisk);
    adev += (size_t)(dev->fixed_device_bytes + (world > 1 ? dev->comm_device_bytes : 0));
    if (ahost + (dev->host_backed ? adev : 0) <= hlim) p->host_budget = SIZE_MAX;
    return 0;
}

// Attention's share of the forward FLOPs (the T^2 term), which runs at its own rate.
static double attention_flops(const ModelConfig *c, int B, int T) {
    return 2.0 * B * c->num_attention_heads * (double)T * T * c->head_dim * c->num_hidden_layers;
}

int plan_rows(const Config *cfg, const ModelConfig *c, const Backend *bk, const ModelOptions *mo,
              PlanRow *rows, int max) {
    const PlanDevice *dev = plan_device(cfg, bk);
    const size_t host_limit = plan_host_limit(cfg);
    // Sequence parallel: each rank holds T / n tokens, and runs attention over all T for 1/n of
    // the heads.
    const int spn = mo && mo->seq_parallel > 1 ? mo->seq_parallel : 1;
    const int B = cfg->micro_batch_size, T = cfg->sequence_len / spn, A = bk ? bk->act_bytes : dev->act_bytes;
    const int world = mo && mo->comm ? mo->comm->world : 1;
    const double fixed = dev->fixed_device_bytes + (world > 1 ? dev->comm_device_bytes : 0);
    MemPolicy base;
    config_mem_policy(cfg, &base);
    LoraConfig lora;
    config_lora(cfg, c, &lora);
    // A run that plans first (auto, or a device limit) hears that the model cannot fit before
    // sixteen plans of it are built.
    if (bk && !cfg->plan_only) model_check_memory(c, &lora, mo, bk);
    const double F = dev->gemm_flops, link = dev->link_bytes_per_s, disk = dev->disk_bytes_per_s;
    const double attn = attention_flops(c, B, cfg->sequence_len) / spn;
    const double fwd = forward_flops(c, B, T) - attention_flops(c, B, T) + attn, accum = cfg->gradient_accumulation_steps;
    // Forward + backward is about 3 forwards; attention's part runs at its own, lower rate.
    const double step_s = 3 * accum * ((fwd - attn) / F + attn / (F * dev->attn_efficiency));
    // Query tiles need the backend's kernels (the real one when there is one); sequence
    // parallelism runs attention over whole sequences.
    const int att_block = spn > 1 ? 0 : bk ? bk->att_block : dev->att_block;
    static const char *TILING[] = {"", " + tiled MLP", " + tiled MLP + attention"};
    int n = 0;
    for (int tiled = 0; tiled < (att_block ? 3 : 2); tiled++)
        for (size_t i = 0; i < sizeof MODES / sizeof MODES[0] && n < max; i++) {
            PlanRow *r = &rows[n++];
            memset(r, 0, sizeof *r);
            r->pol = base;
            r->pol.recompute = MODES[i].recompute;
            r->pol.tier = MODES[i].tier;
            r->pol.hidden_states = MODES[i].hidden;
            if (MODES[i].hidden) r->pol.every = 1;
            r->pol.tiled_mlp = tiled > 0;
            r->pol.tiled_attention = tiled > 1;
            snprintf(r->name, sizeof r->name, "%s%s", MODES[i].name, TILING[tiled]);
            // The tiered modes are planned as the run will build them: the same budgets.
            size_t ws[2];
            int ws_fits = plan_budgets(cfg, c, bk, mo, &r->pol, NULL, 0, ws) == 0;
            r->ws_dev = ws[0], r->ws_host = ws[1];
            plan_measure(c, &lora, mo, &r->pol, B, T, A, att_block, &r->dev_peak, &r->host_peak, &r->disk_peak);
            r->dev_peak += (size_t)fixed;
            ActStats as;
            act_stats(c, &r->pol, B, T, A, &as);
            r->tiers = as.tiers;
            r->recompute_flops = as.recompute_flops * accum;
            r->moved_bytes = as.moved_bytes * accum;
            // Async host copies mostly hide behind compute; count a quarter of their time. Disk
            // bytes (both directions) go at the disk's rate.
            double hidden = r->pol.tier == TIER_HOST ? 0.25 : 1.0;
            double to_host = 2 * as.saved_bytes[HOME_HOST] * accum, to_disk = 2 * as.saved_bytes[HOME_DISK] * accum;
            r->est_ms = 1e3 * (step_s + r->recompute_flops / F + hidden * to_host / link + to_disk / disk);
            // On the CPU backend "device" memory is host memory too.
            size_t host_need = r->host_peak + (dev->host_backed ? r->dev_peak : 0);
            r->fits = ws_fits && (!cfg->device_memory_limit || r->dev_peak <= (size_t)cfg->device_memory_limit) &&
                      host_need <= host_limit;
        }
    return n;
}

size_t plan_host_limit(const Config *cfg) {
    if (cfg->host_memory_limit) return (size_t)cfg->host_memory_limit;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : SIZE_MAX;
}

void plan_print(const PlanRow *rows, int n, size_t limit, size_t host_limit, FILE *f) {
    char lim[32] = "none", hlim[32] = "none";
    if (limit) format_bytes(lim, sizeof lim, (double)limit);
    if (host_limit && host_limit != SIZE_MAX) format_bytes(hlim, sizeof hlim, (double)host_limit);
    fprintf(f, "memory plan (device_memory_limit: %s, host_memory_limit: %s)\n", lim, hlim);
    fprintf(f, "| %-42s | %12s | %12s | %12s | %14s | %14s | %9s | %4s |\n", "mode", "device peak",
            "host peak", "disk peak", "recompute GFLOP", "moved/step", "est. ms", "fits");
    fprintf(f, "|%s|%s|%s|%s|%s|%s|%s|%s|\n", "--------------------------------------------", "--------------",
            "--------------", "--------------", "-----------------", "----------------", "-----------", "------");
    for (int i = 0; i < n; i++) {
        const PlanRow *r = &rows[i];
        char d[32], h[32], k[32], mv[32];
        format_bytes(d, sizeof d, (double)r->dev_peak);
        format_bytes(h, sizeof h, (double)r->host_peak);
        format_bytes(k, sizeof k, (double)r->disk_peak);
        format_bytes(mv, sizeof mv, r->moved_bytes);
        fprintf(f, "| %-42s | %12s | %12s | %12s | %15.2f | %14s | %9.1f | %4s |\n", r->name, d, h, k,
                r->recompute_flops / 1e9, mv, r->est_ms, r->fits ? "yes" : "no");
    }
    // The tiered modes: what they need whatever the limits, and where their kept tensors went.
    for (int i = 0; i < n; i++) {
        const PlanRow *r = &rows[i];
        if (r->pol.tier != TIER_HOST) continue;
        char t[192] = "not within the limits", d[32], h[32];
        if (r->pol.tiered) act_describe_tiers(&r->pol, &r->tiers, t, sizeof t);
        format_bytes(d, sizeof d, (double)r->ws_dev), format_bytes(h, sizeof h, (double)r->ws_host);
        fprintf(f, "tiers of %s: working set device %s, host %s; %s\n", r->name, d, h, t);
    }
}

const PlanRow *plan_pick(const PlanRow *rows, int n) {
    const PlanRow *best = NULL;
    for (int i = 0; i < n; i++)
        if (rows[i].fits && (!best || rows[i].est_ms < best->est_ms)) best = &rows[i];
    return best;
}

void plan_fitting_names(const PlanRow *rows, int n, char *out, size_t cap) {
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        if (!rows[i].fits) continue;
        size_t len = strlen(out);
        snprintf(out + len, cap - len, "%s%s", len ? ", " : "", rows[i].name);
    }
    if (!out[0]) snprintf(out, cap, "none (lower micro_batch_size or sequence_len)");
}
