// fuzz_hf_config.c: libFuzzer target for Hugging Face config.json (hf_read_config), and for
// Axolotl's model_config overrides of it (hf_read_config_overridden): an input holding the line
// "//model_config" is config.json before it and the override mapping (JSON) after it.
#define _GNU_SOURCE  // memmem
#include <string.h>
#include "fuzz_common.h"
#include "hf.h"
#include "json.h"

#define SEP "\n//model_config\n"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    fuzz_path(path, sizeof path, "config.json");
    const uint8_t *sep = size >= strlen(SEP) ? memmem(data, size, SEP, strlen(SEP)) : NULL;
    const size_t head = sep ? (size_t)(sep - data) : size;
    fuzz_write(path, data, head);
    FUZZ_TRY({
        ModelConfig c;
        hf_read_config(path, &c);
        model_config_validate(&c, path);
    });
    if (sep) {
        const char *tail = (const char *)sep + strlen(SEP);
        const size_t n = size - head - strlen(SEP);
        FUZZ_TRY({
            char why[256];
            cJSON *over = json_parse_strict(tail, n, why, sizeof why);
            if (over) {
                ModelConfig c;
                hf_read_config_overridden(path, over, "cfg.yaml:1", "model_config", 0, &c);
                model_config_validate(&c, "cfg.yaml:1");
                cJSON_Delete(over);
            }
        });
    }
    return 0;
}
