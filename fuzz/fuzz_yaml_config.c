// fuzz_yaml_config.c: libFuzzer target for the YAML run configuration (config_from_args ->
// config_load_yaml, config_set, config_finish), then the LoRA and memory-policy views of it.
// An input that starts with "# gpt2" is read as train_gpt reads its config.
#include "fuzz_common.h"
#include "config.h"

static Config cfg;  // large: not on the stack

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    fuzz_path(path, sizeof path, "cfg.yaml");
    fuzz_write(path, data, size);
    int arch = size >= 6 && !memcmp(data, "# gpt2", 6) ? ARCH_GPT2 : ARCH_LLAMA;
    FUZZ_TRY({
        char *argv[] = {"train_llama", "-c", path, NULL};
        config_from_args(&cfg, 3, argv, arch);
        LoraConfig lora;
        MemPolicy pol;
        config_lora(&cfg, &cfg.model, &lora);
        config_mem_policy(&cfg, &pol);
        config_release(&cfg);
    });
    return 0;
}
