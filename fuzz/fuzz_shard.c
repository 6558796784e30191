// fuzz_shard.c: libFuzzer target for token shards (llmc/data.c: header checks, window count,
// reads, token range checks, shuffled order, seek). The first 4 bytes of the input pick the
// loader's shape: B = 1 + b0 % 4, T = 1 + b1 % 16, vocab = 1 + b2 + 256 * (b3 >> 1), shuffle
// = b3 & 1; the rest is the shard file.
#include "fuzz_common.h"
#include "data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    const int B = 1 + data[0] % 4, T = 1 + data[1] % 16;
    const int vocab = 1 + data[2] + 256 * (data[3] >> 1), shuffle = data[3] & 1;
    char path[512];
    fuzz_path(path, sizeof path, "train.bin");
    fuzz_write(path, data + 4, size - 4);
    static int32_t tok[64 * 16 + 1], tgt[64 * 16 + 1];
    FUZZ_TRY({
        DataLoader dl;
        loader_open(&dl, path, B, T, vocab, shuffle, 1234, "train_data");
        size_t n = dl.total_windows + 2;  // wraps into the next epoch
        for (size_t i = 0; i < n && i < 12; i++) {
            loader_next(&dl, tok, tgt);
            for (int j = 0; j + 1 < B * T; j++)
                if (tgt[j] != tok[j + 1]) abort();  // targets are the tokens shifted by one
        }
        loader_seek(&dl, 3, dl.total_windows - 1);
        loader_next(&dl, tok, tgt);
        loader_close(&dl);
    });
    return 0;
}
