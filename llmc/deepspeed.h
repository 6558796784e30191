// deepspeed.h: Axolotl's `deepspeed:` key, a DeepSpeed JSON file (Axolotl's deepspeed_configs/
// zero1.json ... zero3_bf16_cpuoffload_all.json), read onto this program's own keys. Its ZeRO
// stage becomes zero_stage (stage 2 runs as 1: the same numbers, but each rank keeps all the
// gradients), offload_optimizer.device cpu becomes offload_optimizer: true, offload_param.device
// cpu parameters in host memory (config.c: adapter runs only); values that must
// agree with the trainer's ("auto" or the same number) are handed back to be checked; the
// communication and bucket tuning keys have no effect here (one note); anything that would
// train otherwise (nvme, fp16, an optimizer or scheduler section, an unknown key) is refused
// by name.
#pragma once

typedef struct {
    int stage;                // 0..3
    int offload_optimizer;    // 1: offload_optimizer.device cpu
    int offload_param;        // 1: offload_param.device cpu (adapter runs only: config.c's offload_params)
    int bf16;                 // -1: auto or absent, 0/1: bf16.enabled as written
    double gradient_clipping; // < 0: auto or absent
    int micro_batch, accum;   // 0: auto or absent
    char path[1024];          // the file read
} DeepSpeedConfig;

// Reads `value` (a path: as given, else beside the config `src`); fails with one line naming
// the file and key on anything refused.
void deepspeed_read(const char *value, const char *src, DeepSpeedConfig *ds);
