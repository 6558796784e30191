// fuzz_safetensors.c: libFuzzer target for the safetensors reader (st_open: header length,
// JSON header, dtypes, shapes, data offsets, __metadata__), then reads every tensor it accepts.
#include "fuzz_common.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    fuzz_path(path, sizeof path, "model.safetensors");
    fuzz_write(path, data, size);
    FUZZ_TRY({
        StFile *f = st_open(path);
        for (int i = 0; i < st_count(f); i++) {
            const StTensor *t = st_tensor(f, i);
            if (st_find(f, t->name) != t) abort();  // every tensor is found by its name
            size_t n = st_numel(t);
            if (n * st_dtype_size(t->dtype) != t->nbytes) abort();
            if (n <= (1 << 16) && (!strcmp(t->dtype, "F32") || !strcmp(t->dtype, "BF16") ||
                                   !strcmp(t->dtype, "F16"))) {
                float *out = malloc((n ? n : 1) * sizeof(float));
                st_to_f32(t, out);
                free(out);
            }
        }
        st_metadata(f, "format");
        st_find(f, "model.embed_tokens.weight");
        st_close(f);
    });
    return 0;
}
