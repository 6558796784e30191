// fuzz_gpt2_bin.c: libFuzzer target for llm.c's GPT-2 model file (llmc/gpt2_io.c: the header
// checks and the file-size check of gpt2_read_config; then, for a model small enough to make
// thousands a second, gpt2_load into it on the CPU backend, fp32 or bf16). The input is the file.
#include "fuzz_common.h"
#include "backend.h"
#include "gpt2_io.h"
#include "model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Backend *bk;
    if (!bk) bk = backend_cpu_create(1);
    char path[512];
    fuzz_path(path, sizeof path, "model.bin");
    fuzz_write(path, data, size);
    FUZZ_TRY({
        ModelConfig c;
        gpt2_read_config(path, &c);
        if ((int64_t)c.padded_vocab * c.hidden_size <= 1 << 16 && c.num_hidden_layers <= 2 &&
            c.hidden_size <= 64 && c.max_position_embeddings <= 64) {
            Model m;
            LoraConfig lc = {0};
            ModelOptions mo = {0};
            model_create(&m, bk, &c, &lc, &mo);
            gpt2_load(&m, path);
            model_free(&m);
        }
    });
    return 0;
}
