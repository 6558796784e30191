// quantize.c: `train_llama --quantize IN_DIR OUT_DIR` writes a Hugging Face model whose decoder
// linear weights are NF4 in bitsandbytes' serialized layout (what transformers saves for a
// load_in_4bit model), so QLoRA runs can start from it and other tools can read it.
#include "quantize.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include "hf.h"
#include "model.h"
#include "nf4.h"
#include "safetensors.h"
#include "util.h"

// Decoder linear weights: model.layers.N.(self_attn|mlp).X_proj.weight
static int is_linear(const char *name) {
    if (strncmp(name, "model.layers.", 13) || !strstr(name, "_proj.weight")) return 0;
    return strstr(name, ".lora_") == NULL;
}

void quantize_model(const char *in_dir, const char *out_dir) {
    ModelConfig cfg;
    char path[4096];
    join_path(path, sizeof path, in_dir, "config.json");
    hf_read_config(path, &cfg);
    StModel *sm = st_open_model_dir(in_dir);
    int n = st_model_count(sm);
    StWriteItem *items = xcalloc((size_t)n * NF4_MAX_TENSORS, sizeof(StWriteItem));
    StTensor *emitted = xcalloc((size_t)n * NF4_MAX_TENSORS, sizeof(StTensor));
    Nf4Weight *qs = xcalloc(n, sizeof(Nf4Weight));
    float **bufs = xcalloc(n, sizeof(float *));
    int count = 0, nq = 0;
    for (int i = 0; i < n; i++) {
        const StTensor *t = st_model_tensor(sm, i);
        size_t numel = st_numel(t);
        bufs[i] = xmalloc(sizeof(float) * (numel ? numel : 1));
        st_to_f32(t, bufs[i]);
        if (is_linear(t->name) && t->ndim == 2) {
            const char *dtype = !strcmp(t->dtype, "BF16") ? "bfloat16" : !strcmp(t->dtype, "F16") ? "float16" : "float32";
            nf4_quantize(&qs[nq], bufs[i], t->ndim, t->shape, 64, 1, dtype, t->name);
            int k = nf4_emit(&qs[nq], t->name, emitted + count);
            for (int j = 0; j < k; j++) {
                const StTensor *e = &emitted[count + j];
                items[count + j] = (StWriteItem){.name = e->name, .ndim = e->ndim, .dtype = e->dtype,
                                                 .raw = e->data, .nbytes = e->nbytes};
                for (int d = 0; d < e->ndim && d < 4; d++) items[count + j].shape[d] = e->shape[d];
            }
            count += k;
            nq++;
        } else {
            items[count] = (StWriteItem){.name = t->name, .data = bufs[i], .ndim = t->ndim};
            for (int d = 0; d < t->ndim && d < 4; d++) items[count].shape[d] = t->shape[d];
            count++;
        }
    }
    if (mkdir_p(out_dir) != 0) fail("%s: cannot create: %s", out_dir, strerror(errno));
    join_path(path, sizeof path, out_dir, "model.safetensors");
    const char *meta[] = {"format", "pt", NULL};
    if (st_write(path, items, count, meta) != 0) fail("%s: cannot write: %s", path, strerror(errno));
    // config.json with the quantization_config transformers expects for such a file.
    join_path(path, sizeof path, out_dir, "config.json");
    if (hf_write_config(path, &cfg, NULL) != 0) fail("%s: cannot write: %s", path, strerror(errno));
    char *txt = read_file(path, NULL);
    cJSON *o = cJSON_Parse(txt);
    free(txt);
    cJSON *q = cJSON_AddObjectToObject(o, "quantization_config");
    cJSON_AddStringToObject(q, "quant_method", "bitsandbytes");
    cJSON_AddBoolToObject(q, "load_in_4bit", 1);
    cJSON_AddBoolToObject(q, "load_in_8bit", 0);
    cJSON_AddStringToObject(q, "bnb_4bit_quant_type", "nf4");
    cJSON_AddBoolToObject(q, "bnb_4bit_use_double_quant", 1);
    cJSON_AddStringToObject(q, "bnb_4bit_compute_dtype", "bfloat16");
    cJSON_AddStringToObject(q, "bnb_4bit_quant_storage", "uint8");
    txt = cJSON_Print(o);
    cJSON_Delete(o);
    FILE *f = fopen(path, "w");
    if (!f || fputs(txt, f) < 0 || fclose(f) != 0) fail("%s: cannot write: %s", path, strerror(errno));
    free(txt);
    printf("quantized %d linear weights of %s to NF4 -> %s\n", nq, in_dir, out_dir);
    for (int j = 0; j < count; j++)  // emitted[] is parallel to items[]; plain tensors left it empty
        if (emitted[j].name) nf4_emit_free(emitted + j, 1);
    for (int i = 0; i < nq; i++) nf4_free(&qs[i]);
    for (int i = 0; i < n; i++) free(bufs[i]);
    free(bufs), free(qs), free(emitted), free(items);
    st_model_close(sm);
}
