// mempolicy.h: the memory policy, the two axes of ../shared/DESIGN.md (what is kept for
// backward, where it lives) plus MLP tiling. Config builds it; the activation store obeys it.
#pragma once
#include <stddef.h>

enum { RC_NONE, RC_FULL, RC_SELECTIVE };                     // recompute policy
enum { TIER_DEVICE, TIER_HOST, TIER_HOST_SYNC, TIER_DISK };  // where kept tensors live
enum { HOME_DEVICE, HOME_HOST, HOME_DISK };

// The tensors a layer's backward reads, in forward order.
enum {
    S_XIN, S_LN1, S_RSTD1, S_Q, S_K, S_V, S_ATT, S_LSE, S_AO, S_RSTDPA, S_XMID, S_LN2, S_RSTD2, S_GATE,
    S_UP, S_H, S_FO, S_RSTDPF,  // S_AO .. S_RSTDPF: Gemma 3's sandwich norms only
    S_COUNT
};

typedef struct MemPolicy {
    int recompute;          // RC_*
    int every;              // full checkpointing: keep the input of every Nth layer
    int tier;               // TIER_*
    int hidden_states;      // only layer inputs go to the tier; the last layer's stays
    size_t min_offload;     // smaller tensors stay on the device
    int max_stash;          // offload copies in flight before forward waits
    int tiled_mlp, mlp_shards;
    int tiled_attention;    // norms, projections and attention over query tiles (O(T) memory)
    int stream_frozen;      // layer_offloading: frozen layer weights streamed from host
    char disk_dir[1024];    // parent directory for the disk tier ("" = system temp dir)
    // Tiers (TIER_HOST only): kept offloadable tensors fill, in layer order, the device up to
    // dev_budget bytes, then the host up to host_budget bytes, then disk. The planner sets
    // them from device_memory_limit and host_memory_limit (plan_budgets); tiered = 0 keeps
    // everything on the host. shared_budget: device memory is host memory (the CPU backend),
    // so a tensor kept on the device uses the host budget too.
    int tiered, shared_budget;
    size_t dev_budget, host_budget;
} MemPolicy;

