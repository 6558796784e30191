// deepspeed.c: see deepspeed.h.
#include "deepspeed.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "json.h"
#include "util.h"

// Keys that tune DeepSpeed's own communication, buffers and logging: nothing here to apply.
static const char *const TUNING[] = {
    "overlap_comm", "contiguous_gradients", "sub_group_size", "reduce_bucket_size", "allgather_bucket_size",
    "allgather_partitions", "reduce_scatter", "round_robin_gradients", "stage3_prefetch_bucket_size",
    "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
    "max_live_parameters", "max_reuse_distance", "gather_16bit_weights_on_model_save",
    "stage3_gather_16bit_weights_on_model_save", "wall_clock_breakdown", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "compile", "steps_per_print", "pin_memory", "buffer_count",
    "fast_init", "memory_efficient_linear", "ignore_unused_parameters"};

static int is_tuning(const char *k) {
    for (size_t i = 0; i < sizeof TUNING / sizeof TUNING[0]; i++)
        if (!strcmp(k, TUNING[i])) return 1;
    return 0;
}

static int is_auto(const cJSON *v) { return cJSON_IsString(v) && !strcmp(v->valuestring, "auto"); }

static void note_tuning(char *noted, size_t cap, const char *k) {
    if (strstr(noted, k)) return;
    size_t n = strlen(noted);
    snprintf(noted + n, cap - n, "%s%s", n ? ", " : "", k);
}

// A whole number >= 0 (or "auto": -1); fails otherwise.
static long whole(const cJSON *v, const char *path, const char *key) {
    if (!v || cJSON_IsNull(v) || is_auto(v)) return -1;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble) || v->valuedouble > 1e9)
        fail("%s: %s: expected a whole number or \"auto\"", path, key);
    return (long)v->valuedouble;
}

static void offload(const cJSON *o, const char *path, const char *key, int *to_cpu, char *noted, size_t cap) {
    if (!o || cJSON_IsNull(o)) return;
    if (!cJSON_IsObject(o)) fail("%s: zero_optimization.%s: expected an object with \"device\"", path, key);
    const cJSON *e;
    cJSON_ArrayForEach(e, o) {
        if (!strcmp(e->string, "device")) {
            const char *d = cJSON_IsString(e) ? e->valuestring : "";
            if (!strcmp(d, "none")) continue;
            if (strcmp(d, "cpu"))
                fail("%s: zero_optimization.%s.device %s is not supported: host memory (cpu) or the device (none); "
                     "nvme is not implemented", path, key, d[0] ? d : "(not a string)");
            *to_cpu = 1;
        } else if (is_tuning(e->string)) {
            note_tuning(noted, cap, e->string);
        } else {
            fail("%s: zero_optimization.%s.%s is not supported here", path, key, e->string);
        }
    }
}

void deepspeed_read(const char *value, const char *src, DeepSpeedConfig *ds) {
    memset(ds, 0, sizeof *ds);
    ds->bf16 = -1, ds->gradient_clipping = -1;
    // Axolotl opens the path as given (from the working directory); a path beside the config
    // is tried next.
    snprintf(ds->path, sizeof ds->path, "%s", value);
    if (!path_exists(ds->path) && value[0] != '/') {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s", src);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = 0;
            join_path(ds->path, sizeof ds->path, dir, value);
        }
    }
    if (!path_exists(ds->path))
        fail("%s: deepspeed: '%s' is not a file (looked in the working directory%s); give the path of a "
             "DeepSpeed JSON config such as Axolotl's deepspeed_configs/zero3_bf16.json", src, value,
             strcmp(ds->path, value) ? " and beside the config" : "");
    struct stat st;
    if (stat(ds->path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 20))
        fail("%s: deepspeed: '%s' is not a regular file of at most 1 MiB (a DeepSpeed JSON config)", src, ds->path);
    cJSON *root = json_read_file(ds->path);
    const char *path = ds->path;
    if (!cJSON_IsObject(root)) fail("%s: expected a JSON object (a DeepSpeed config)", path);
    char noted[512] = "";
    int stage = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, root) {
        const char *k = e->string;
        if (!strcmp(k, "zero_optimization")) {
            if (!cJSON_IsObject(e)) fail("%s: zero_optimization: expected an object", path);
            const cJSON *z;
            cJSON_ArrayForEach(z, e) {
                if (!strcmp(z->string, "stage")) {
                    long s = whole(z, path, "zero_optimization.stage");
                    if (s < 0 || s > 3) fail("%s: zero_optimization.stage: expected 0, 1, 2 or 3", path);
                    stage = (int)s;
                } else if (!strcmp(z->string, "offload_optimizer")) {
                    offload(z, path, "offload_optimizer", &ds->offload_optimizer, noted, sizeof noted);
                } else if (!strcmp(z->string, "offload_param")) {
                    offload(z, path, "offload_param", &ds->offload_param, noted, sizeof noted);
                } else if (is_tuning(z->string)) {
                    note_tuning(noted, sizeof noted, z->string);
                } else {
                    fail("%s: zero_optimization.%s is not supported here", path, z->string);
                }
            }
        } else if (!strcmp(k, "bf16")) {
            const cJSON *en = cJSON_GetObjectItemCaseSensitive(e, "enabled");
            if (cJSON_IsBool(en)) ds->bf16 = cJSON_IsTrue(en);
            else if (en && !is_auto(en)) fail("%s: bf16.enabled: expected true, false or \"auto\"", path);
        } else if (!strcmp(k, "fp16")) {
            const cJSON *en = cJSON_GetObjectItemCaseSensitive(e, "enabled");
            if (cJSON_IsTrue(en))
                fail("%s: fp16.enabled: true: float16 compute is not implemented; use bf16 (\"auto\" follows the "
                     "config's bf16)", path);
            // "auto" follows the config's fp16, which is refused when true; its loss-scaling keys then do nothing
        } else if (!strcmp(k, "gradient_clipping")) {
            if (!is_auto(e)) {
                if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0)) fail("%s: gradient_clipping: expected a number or \"auto\"", path);
                ds->gradient_clipping = e->valuedouble;
            }
        } else if (!strcmp(k, "train_micro_batch_size_per_gpu")) {
            long v = whole(e, path, k);
            ds->micro_batch = v > 0 ? (int)v : 0;
        } else if (!strcmp(k, "gradient_accumulation_steps")) {
            long v = whole(e, path, k);
            ds->accum = v > 0 ? (int)v : 0;
        } else if (!strcmp(k, "train_batch_size")) {
            if (whole(e, path, k) >= 0)
                fail("%s: train_batch_size: set it to \"auto\" (micro_batch_size x gradient_accumulation_steps x "
                     "ranks, as Axolotl's configs do)", path);
        } else if (!strcmp(k, "optimizer") || !strcmp(k, "scheduler")) {
            fail("%s: %s: DeepSpeed's own %s is not used here; this program runs its AdamW with the config's "
                 "optimizer and lr_scheduler keys (remove the section)", path, k, k);
        } else if (is_tuning(k)) {
            note_tuning(noted, sizeof noted, k);
        } else {
            fail("%s: %s is not supported here (zero_optimization, bf16, fp16, gradient_clipping and the batch "
                 "sizes are read; DeepSpeed's tuning keys have no effect)", path, k);
        }
    }
    cJSON_Delete(root);
    ds->stage = stage;
    if (noted[0]) printf("note: deepspeed %s: %s have no effect here (DeepSpeed's communication and buffer tuning)\n",
                         path, noted);
}
