// fuzz_hellaswag.c: libFuzzer target for llm.c's HellaSwag eval file (llmc/gpt2_cli.c:
// hellaswag_open reads and checks every example). The first 3 bytes pick sequence_len T = 1 +
// b0 % 64 and vocab = 1 + b1 + 256 * b2; the rest is the file.
#include "fuzz_common.h"
#include "gpt2_cli.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 3) return 0;
    const int T = 1 + data[0] % 64, vocab = 1 + data[1] + 256 * data[2];
    char path[512];
    fuzz_path(path, sizeof path, "hellaswag.bin");
    fuzz_write(path, data + 3, size - 3);
    FUZZ_TRY({
        HellaSwag h;
        hellaswag_open(&h, path, T, vocab);
        for (int i = 0; i < h.n; i++) {  // what hellaswag_eval relies on
            if (h.label[i] < 0 || h.label[i] > 3 || h.ctx_len[i] <= 0) abort();
            for (int c = 0; c < 4; c++)
                if (h.comp_len[i * 4 + c] <= 0 || h.ctx_len[i] + h.comp_len[i * 4 + c] > T) abort();
        }
        hellaswag_close(&h);
    });
    return 0;
}
