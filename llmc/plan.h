// plan.h: the memory planner. It builds each mode's model and activation store against a
// counting backend that allocates nothing, so a prediction is the allocator's own sum, then
// adds the analytic recompute FLOPs and transfer bytes to rank modes by estimated step time.
#pragma once
#include "config.h"

typedef struct {
    char name[48];
    MemPolicy pol;
    size_t dev_peak, host_peak, disk_peak;
    double recompute_flops, moved_bytes, est_ms;
    int fits;
} PlanRow;

// Device/host bytes of one mode, measured by building it on a counting backend.
void plan_measure(const ModelConfig *c, const LoraConfig *lora, const ModelOptions *mo,
                  const MemPolicy *p, int B, int T, int act_bytes, size_t *dev, size_t *host, size_t *disk);
// A row per mode: plain, checkpointing, selective, offloading true/legacy/disk, hidden_states,
// and tiled-MLP variants. limit 0: everything fits.
// mo: sharding and optimizer offload as the run will use them (NULL: one process, resident).
int plan_rows(const Config *cfg, const ModelConfig *c, const Backend *bk, const ModelOptions *mo,
              PlanRow *rows, int max);
void plan_print(const PlanRow *rows, int n, size_t limit, FILE *f);
// The fastest row that fits, or NULL.
const PlanRow *plan_pick(const PlanRow *rows, int n);
// "hidden_states, gradient_checkpointing, ..." for an out-of-memory message.
void plan_fitting_names(const PlanRow *rows, int n, char *out, size_t cap);
