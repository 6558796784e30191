// dev/cuda/actstore.cu: the activation store's tiers (llmc/actstore.c) over the CUDA backend.
// The store is driven as the layer loop drives it, without the layer math: forward writes a
// distinct pattern into every kept tensor of every layer (and each layer's output, the next
// one's input) on the compute queue, then act_fwd_done offloads; backward reads each kept
// tensor back on the compute queue after act_bwd_layer and compares it with what forward
// wrote. Two passes per case reuse the stash ring and the disk staging. Cases: host-only
// offloading, the disk tier, and tiered stores that put one run's tensors on the device, the
// host and disk at once (hidden_states and offload true, a layer's tensors split between
// host and disk). Under the emulator a copy or kernel that touches a buffer another queue
// still uses without an event between them stops the program (the stream-order check).
#include <dirent.h>
#include <unistd.h>
#include "dev_common.cuh"
extern "C" {
#include "llmc/actstore.h"
#include "llmc/backend.h"
}

static void **slot(LayerActs *a, int s) {
    switch (s) {
    case S_XIN: return &a->xin;
    case S_LN1: return &a->ln1;
    case S_RSTD1: return (void **)&a->rstd1;
    case S_Q: return &a->q;
    case S_K: return &a->k;
    case S_V: return &a->v;
    case S_ATT: return &a->att;
    case S_LSE: return (void **)&a->lse;
    case S_XMID: return &a->x_mid;
    case S_LN2: return &a->ln2;
    case S_RSTD2: return (void **)&a->rstd2;
    case S_GATE: return &a->gate;
    case S_UP: return &a->up;
    default: return &a->h;
    }
}

static void pattern(std::vector<uint32_t> &v, int pass, int l, int s) {
    for (size_t i = 0; i < v.size(); i++) v[i] = (uint32_t)(pass * 1000003u + l * 7919u + s * 104729u + i);
}

static int offload_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += !strncmp(e->d_name, "llmc-offload-", 13);
    closedir(d);
    return n;
}

static void run_case(Backend *bk, const char *name, MemPolicy pol, const int want[3]) {
    ModelConfig c;
    memset(&c, 0, sizeof c);
    c.arch = ARCH_LLAMA, c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 6;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 8;
    const int B = 2, T = 16, L = c.num_hidden_layers, A = bk->act_bytes;
    char tmp[] = "/tmp/actstore_cuda_XXXXXX";
    if (!mkdtemp(tmp)) { printf("FAIL %s: mkdtemp\n", name); g_fail++; return; }
    snprintf(pol.disk_dir, sizeof pol.disk_dir, "%s", tmp);
    ActStore *st = actstore_create(bk, &c, &pol, B, T, 0);
    const ActTiers *t = act_tiers(st);
    int bad = 0, checked = 0;
    char why[256] = "";
    if (want && (t->layers[0] != want[0] || t->layers[1] != want[1] || t->layers[2] != want[2])) {
        snprintf(why, sizeof why, "tiers device %d host %d disk %d, want %d %d %d", t->layers[0], t->layers[1],
                 t->layers[2], want[0], want[1], want[2]);
        bad++;
    }
    size_t disk_peak = 0;
    for (int pass = 0; pass < 2; pass++) {
        bk->mem.disk_peak = bk->mem.disk_in_use;
        LayerActs a;
        std::vector<uint32_t> h;
        for (int l = -1; l < L; l++) {
            if (l >= 0) {
                act_fwd_layer(st, l, &a);
                for (int s = 1; s < S_COUNT; s++) {  // the input was written by the layer below
                    size_t n = slot_bytes(&c, &pol, B, T, A, s);
                    if (!n || !act_is_saved(st, l, s)) continue;
                    h.resize(n / 4), pattern(h, pass, l, s);
                    bk->copy_h2d(bk, *slot(&a, s), h.data(), n, NULL);
                }
            }
            size_t n = slot_bytes(&c, &pol, B, T, A, S_XIN);
            h.resize(n / 4), pattern(h, pass, l + 1, S_XIN);
            bk->copy_h2d(bk, act_fwd_output(st, l), h.data(), n, NULL);
            bk->sync(bk);  // h is reused at once
            if (l >= 0) act_fwd_done(st, l, 1);
        }
        act_bwd_begin(st);
        for (int l = L - 1; l >= 0; l--) {
            act_bwd_layer(st, l, &a);
            for (int s = 0; s < S_COUNT; s++) {
                size_t n = slot_bytes(&c, &pol, B, T, A, s);
                if (!n || !act_is_saved(st, l, s)) continue;
                std::vector<uint32_t> got(n / 4), want_v(n / 4);
                bk->copy_d2h(bk, got.data(), *slot(&a, s), n, NULL);
                bk->sync(bk);
                pattern(want_v, pass, l, s);
                checked++;
                if (got != want_v && !bad++)
                    snprintf(why, sizeof why, "pass %d layer %d tensor %d read back wrong", pass, l, s);
            }
            act_bwd_layer_done(st, l);
        }
        bk->sync(bk);
        if (bk->mem.disk_peak > disk_peak) disk_peak = bk->mem.disk_peak;
    }
    actstore_free(st);
    int left = offload_files(tmp);
    if (left != 0 && !bad++) snprintf(why, sizeof why, "%d offload directories left", left);
    if (want && (want[2] > 0) != (disk_peak > 0) && !bad++) snprintf(why, sizeof why, "disk peak %zu", disk_peak);
    rmdir(tmp);
    if (bad) printf("FAIL %s: %s\n", name, why), g_fail++;
    else printf("PASS %s (%d tensors read back, disk peak %zu B)\n", name, checked, disk_peak), g_pass++;
}

int main(int argc, char **argv) {
    dev_init(argc, argv);
    char why[256];
    if (!backend_cuda_available(why, sizeof why)) {
        printf("SKIP actstore: %s\n", why);
        return 0;
    }
    Backend *bk = backend_cuda_create(0, 0);  // float32: the patterns are bit patterns
    const size_t in = (size_t)2 * 16 * 32 * 4;  // one layer's input
    MemPolicy base;
    memset(&base, 0, sizeof base);
    base.max_stash = 5;

    MemPolicy p = base;
    p.recompute = RC_NONE, p.tier = TIER_HOST;
    run_case(bk, "offload true, host only", p, NULL);
    p.tier = TIER_DISK;
    run_case(bk, "offload disk", p, NULL);
    p.tier = TIER_HOST_SYNC;
    run_case(bk, "offload legacy", p, NULL);

    MemPolicy hs = base;
    hs.recompute = RC_FULL, hs.every = 1, hs.tier = TIER_HOST, hs.hidden_states = 1, hs.tiered = 1;
    hs.dev_budget = 2 * in, hs.host_budget = 2 * in;
    const int hs_want[3] = {2, 2, 1};
    run_case(bk, "hidden_states tiered: 2 layers on the device, 2 on the host, 1 on disk", hs, hs_want);
    hs.dev_budget = 0, hs.host_budget = 0;
    const int hs_disk[3] = {0, 0, 5};
    run_case(bk, "hidden_states tiered: all on disk", hs, hs_disk);

    // offload true: 13 kinds a layer; budgets that end mid-layer split a layer between tiers.
    ModelConfig c;
    memset(&c, 0, sizeof c);
    c.arch = ARCH_LLAMA, c.hidden_size = 32, c.intermediate_size = 64, c.num_hidden_layers = 6;
    c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 8;
    size_t layer = 0;
    for (int s = 0; s < S_COUNT; s++) layer += slot_bytes(&c, &p, 2, 16, bk->act_bytes, s);
    MemPolicy ot = base;
    ot.recompute = RC_NONE, ot.tier = TIER_HOST, ot.tiered = 1;
    ot.dev_budget = layer + layer / 2, ot.host_budget = 2 * layer;
    const int ot_want[3] = {2, 3, 3};  // layer 1 device/host, layer 3 host/disk
    run_case(bk, "offload true tiered: layers split device/host and host/disk", ot, ot_want);
    return dev_finish("actstore");
}
