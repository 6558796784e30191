// fuzz_trainer_state.c: libFuzzer target for a checkpoint's trainer_state.json, read through
// checkpoint_load on an otherwise valid checkpoint of a tiny model.
#include "fuzz_checkpoint_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_checkpoint_setup(0);
    char path[600];
    snprintf(path, sizeof path, "%s/trainer_state.json", fuzz_ckpt);
    fuzz_write(path, data, size);
    // A LISA run's model when the input names LISA's key (its per-layer counts are read then),
    // a plain one otherwise, so that both branches of the load see inputs.
    static Lisa lisa;
    if (!lisa.on) lisa_init(&lisa, 1, 2, fuzz_model.cfg.num_hidden_layers, 0);
    fuzz_model.lisa = memmem(data, size, "lisa", 4) ? &lisa : NULL;
    FUZZ_TRY({
        LoopState ls;
        checkpoint_load(&fuzz_model, &ls, fuzz_ckpt);
    });
    return 0;
}
