// actstore.h: the activation store. It decides, per layer and per saved tensor, two things
// (the two axes of ../shared/DESIGN.md):
//   what is kept for backward (recompute policy): everything; only the layer input of every
//     Nth layer (full checkpointing); or the matmul/attention outputs (selective);
//   where a kept tensor lives (tier): device; host with asynchronous copies and one-ahead
//     prefetch; host with synchronous copies (legacy); disk, through pinned staging buffers
//     and an I/O thread.
// The layer code asks the store where to write each tensor in forward and where to read it
// in backward; it never knows which mode is running. All buffers are allocated once, up
// front, so the device peak is exactly the sum the planner predicts.
#pragma once
#include <pthread.h>
#include <stddef.h>
#include "mempolicy.h"
#include "model.h"

typedef struct ActStore ActStore;

// Where a tiered policy put the tensors it decided: layers with any of them in each home
// (HOME_*) and their bytes.
typedef struct { int layers[3]; double bytes[3]; } ActTiers;

// Bytes of one saved tensor of kind s (0 when the kind does not exist, e.g. tiled MLP).
size_t slot_bytes(const ModelConfig *c, const MemPolicy *p, int B, int T, int act_bytes, int s);
// Rows per MLP chunk, the same in every mode (tiled_mlp only decides what a chunk keeps).
int mlp_tile_rows(const ModelConfig *c, const MemPolicy *p, int B, int T);
int act_tile_rows(const ActStore *st);
// The default attention span's fewest rows (tiled_mlp_shards unset); see att_tile_rows.
#define ATT_SPAN_MIN_ROWS 2048
// Attention tiles: rows per tile (a multiple of the backend's attention block `align`, or T),
// the number of spans a batch splits into (B x tiles, or 1 when a tile holds a whole sequence:
// then the one span is the whole batch) and the rows of the largest span. Every mode uses the
// same spans for its backward reductions, so tiled_attention changes no bits.
int att_tile_rows(const ModelConfig *c, const MemPolicy *p, int T, int align);
int att_span_count(int B, int T, int rows);
size_t att_span_max_rows(int B, int T, int rows);
int act_att_rows(const ActStore *st);

ActStore *actstore_create(Backend *bk, const ModelConfig *c, const MemPolicy *p, int B, int T, int att_align);
void actstore_free(ActStore *st);

// Forward of layer l: fills *a with where to write each tensor (and a->xin holds the input);
// after the layer's ops are issued, fwd_done starts the offload of what it keeps (only when a
// backward follows: evaluation passes offload nothing).
void act_fwd_layer(ActStore *st, int l, LayerActs *a);
void act_fwd_done(ActStore *st, int l, int for_backward);
// Where layer l writes its output: the next layer's input (l = -1: the embedding's output).
void *act_fwd_output(ActStore *st, int l);
// Where the output of the last layer goes (always on the device: the final norm reads it).
void *act_final_residual(ActStore *st);

// Backward: call bwd_begin once after forward; bwd_layer(l) makes layer l's kept tensors
// readable in *a (waiting for their prefetch, starting the next one) and tells which ones
// must be recomputed; bwd_layer_done(l) releases its buffers for reuse.
void act_bwd_begin(ActStore *st);
void act_bwd_layer(ActStore *st, int l, LayerActs *a);
void act_bwd_layer_done(ActStore *st, int l);
int act_is_saved(const ActStore *st, int l, int s);
// Full checkpointing: the first layer of l's segment, and the pointers of layer j of the
// segment during its recompute (written in forward order from the segment start).
int act_segment_start(const ActStore *st, int l);
void *act_recompute_sink(ActStore *st);  // throwaway output of a segment's last layer
// The sink is borrowed: the model lends a [B*T, hidden] buffer that is dead during backward.
void act_set_sink(ActStore *st, void *buf);

// "recompute every 2, kept tensors on host (async), tiled MLP" for the config box.
void mem_policy_describe(const MemPolicy *p, char *out, size_t cap);

// Statistics for the planner and metrics.
typedef struct {
    double saved_bytes[3];     // kept tensor bytes per home, whole model
    double moved_bytes;        // bytes copied device<->host/disk per step (both directions)
    double recompute_flops;    // extra forward FLOPs per micro-batch
    ActTiers tiers;
} ActStats;
void act_stats(const ModelConfig *c, const MemPolicy *p, int B, int T, int act_bytes, ActStats *out);
const ActTiers *act_tiers(const ActStore *st);
// "hidden states: device 2 layers (1.00 MiB), host 3 (...), disk 2 (...)"; "" if not tiered.
void act_describe_tiers(const MemPolicy *p, const ActTiers *t, char *out, size_t cap);
// Forward FLOPs of one micro-batch (matmuls + attention), for recompute ratios.
double forward_flops(const ModelConfig *c, int B, int T);
