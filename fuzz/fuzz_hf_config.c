// fuzz_hf_config.c: libFuzzer target for Hugging Face config.json (hf_read_config).
#include "fuzz_common.h"
#include "hf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    fuzz_path(path, sizeof path, "config.json");
    fuzz_write(path, data, size);
    FUZZ_TRY({
        ModelConfig c;
        hf_read_config(path, &c);
        model_config_validate(&c, path);
    });
    return 0;
}
