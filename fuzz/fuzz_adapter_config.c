// fuzz_adapter_config.c: libFuzzer target for a PEFT adapter's adapter_config.json, read
// through load_adapter (as lora_model_dir is) beside a valid adapter_model.safetensors.
#include "fuzz_checkpoint_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_checkpoint_setup(1);
    char path[600];
    snprintf(path, sizeof path, "%s/adapter_config.json", fuzz_ckpt);
    fuzz_write(path, data, size);
    FUZZ_TRY(load_adapter(&fuzz_model, fuzz_ckpt));
    return 0;
}
