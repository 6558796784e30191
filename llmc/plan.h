// plan.h: the memory planner. It builds each mode's model and activation store against a
// counting backend that allocates nothing, so a prediction is the allocator's own sum, then
// adds the analytic recompute FLOPs and transfer bytes to rank modes by estimated step time.
#pragma once
#include "actstore.h"
#include "config.h"

// What the step-time estimate and the fixed memory assume about the device. Every constant
// is named in plan.c's table and printed under the plan; none is a measurement of this repo.
typedef struct {
    const char *name;
    int act_bytes;               // activation/weight element size in compute precision
    double gemm_flops;           // sustained dense GEMM rate in that precision
    double attn_efficiency;      // attention FLOP rate as a fraction of gemm_flops
    double link_bytes_per_s;     // host <-> device copies
    double disk_bytes_per_s;     // the disk tier (NVMe)
    double fixed_device_bytes;   // outside the allocator: context, GEMM workspace, scratch
    double comm_device_bytes;    // collective buffers per rank when there are several
    const char *source;          // where the figures come from, printed with them
    int host_backed;             // "device" memory is host memory (the CPU backend)
    int att_block;               // attention query-tile alignment (0: no tiled attention)
} PlanDevice;

// The device a plan is for: the CUDA backend's (an H100 profile, precision from `dtype`) when
// device is cuda (with or without a GPU here) or bk is a GPU backend; else the CPU backend's.
const PlanDevice *plan_device(const Config *cfg, const Backend *bk);

typedef struct {
    char name[48];
    MemPolicy pol;
    size_t dev_peak, host_peak, disk_peak;
    double recompute_flops, moved_bytes, est_ms;
    int fits;                  // within device_memory_limit and the host budget
    ActTiers tiers;            // a tiered mode: where its kept tensors went
    size_t ws_dev, ws_host;    // a tiered mode: its working set (everything offloaded on disk)
} PlanRow;

// Device/host bytes of one mode, measured by building it on a counting backend.
void plan_measure(const ModelConfig *c, const LoraConfig *lora, const ModelOptions *mo,
                  const MemPolicy *p, int B, int T, int act_bytes, int att_block, size_t *dev, size_t *host,
                  size_t *disk);
// A row per mode: plain, checkpointing, selective, offloading true/legacy/disk, hidden_states,
// each also with a tiled MLP and with a tiled MLP + tiled attention (where the backend has
// query-tiled attention). limit 0: everything fits.
// mo: sharding and optimizer offload as the run will use them (NULL: one process, resident).
int plan_rows(const Config *cfg, const ModelConfig *c, const Backend *bk, const ModelOptions *mo,
              PlanRow *rows, int max);
// limit / host_limit: the device and host budgets the rows were judged against (0: none).
void plan_print(const PlanRow *rows, int n, size_t limit, size_t host_limit, FILE *f);
// The tiers of an offloading mode (TIER_HOST: offload true, ckpt + offload, hidden_states):
// builds the mode with every offloaded tensor on disk (its working set), then sets
// p->dev_budget = device_memory_limit - that device peak (0 without a limit) and
// p->host_budget = host limit - that host peak (and on the CPU backend, where device memory
// is host memory, minus the device peak too); when everything the device budget leaves fits
// on the host without disk staging, the host budget is unlimited (nothing goes to disk and no
// staging is allocated). The planner and the run call it alike, so a
// run spills exactly what its plan said. Other tiers: untiered, returns 0. A working set over
// a limit: returns 1 and writes a line naming the key and the bytes needed into why.
// ws (may be NULL): the working set's device and host peaks.
int plan_budgets(const Config *cfg, const ModelConfig *c, const Backend *bk, const ModelOptions *mo,
                 MemPolicy *p, char *why, size_t cap, size_t ws[2]);
// The host budget of a plan: host_memory_limit, else this machine's physical memory.
size_t plan_host_limit(const Config *cfg);
// The assumptions behind the estimate (device constants), printed under the plan.
void plan_print_assumptions(const PlanDevice *d, int world, FILE *f);
// The fastest row that fits, or NULL.
const PlanRow *plan_pick(const PlanRow *rows, int n);
// "hidden_states, gradient_checkpointing, ..." for an out-of-memory message.
void plan_fitting_names(const PlanRow *rows, int n, char *out, size_t cap);
