// fuzz_rows.c: libFuzzer target for prepared rows (llmc/rows.c: the header, the whole-file check
// at open, batches in a shuffled order across epochs, seek, single rows). The first 4 bytes pick
// the loader: B = 1 + b0 % 4, accum = 1 + b1 % 3, vocab = 1 + b2 + 256 * (b3 >> 1), shuffle =
// b3 & 1; T is the file's own row length when it is 1-64 (so most inputs get past the header
// check to the rows), else 1 + b1 % 16. The rest is the file.
#include "fuzz_common.h"
#include "rows.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4) return 0;
    const int B = 1 + data[0] % 4, accum = 1 + data[1] % 3;
    const int vocab = 1 + data[2] + 256 * (data[3] >> 1), shuffle = data[3] & 1;
    int T = 1 + data[1] % 16;
    if (size >= 4 + 12) {
        int32_t h2;
        memcpy(&h2, data + 4 + 8, sizeof h2);
        if (h2 >= 1 && h2 <= 64) T = h2;
    }
    char path[512];
    fuzz_path(path, sizeof path, "train_rows.bin");
    fuzz_write(path, data + 4, size - 4);
    static int32_t tok[8 * 64], tgt[8 * 64], ds[8 * 64];  // B pairs are 2B rows
    FUZZ_TRY({
        RowLoader rl;
        rows_open(&rl, path, B, accum, T, vocab, shuffle, 99, "train rows");
        const size_t steps = rows_steps_per_epoch(&rl);
        for (size_t i = 0; i < steps * accum + 2 && i < 16; i++) {  // into the next epoch
            rows_next(&rl, tok, tgt, ds);
            for (int j = 0; j < B * rl.unit * T; j++)  // what the loader promises the trainer
                if (tok[j] < 0 || tok[j] >= vocab || tgt[j] < -1 || tgt[j] >= vocab || ds[j] < 0 ||
                    ds[j] > j % T)
                    abort();
        }
        rows_seek(&rl, 2, rl.slots / 2);
        rows_next(&rl, tok, tgt, ds);
        rows_read(&rl, rl.nrows, tok, tgt, ds);  // past the end: an empty row
        rows_read(&rl, 0, tok, tgt, ds);
        rows_close(&rl);
    });
    return 0;
}
