// gpt2_io.c: see gpt2_io.h.
#include "gpt2_io.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "stb_ds.h"
#include "util.h"

#define GPT2_MAGIC 20240326

void gpt2_complete_config(ModelConfig *c) {
    c->arch = ARCH_GPT2;
    snprintf(c->model_type, sizeof c->model_type, "gpt2");
    // The derived widths are computed in 64 bits: 4 x hidden_size or the padded vocabulary of
    // a huge config must be reported, not wrapped into a negative int.
    const int64_t I = c->intermediate_size ? c->intermediate_size : 4 * (int64_t)c->hidden_size;
    const int64_t Vp = ((int64_t)c->vocab_size + 127) / 128 * 128;
    if (I > INT32_MAX || Vp > INT32_MAX)
        model_fail_size(c, I, Vp, NULL, I > INT32_MAX ? "GPT-2's MLP width 4 x hidden_size is past the 2147483647 "
                        "a tensor dimension holds" : "vocab_size padded to a multiple of 128 is past the "
                        "2147483647 a tensor dimension holds");
    c->intermediate_size = (int)I;
    c->num_key_value_heads = c->num_attention_heads;
    if (c->num_attention_heads > 0 && !c->head_dim) c->head_dim = c->hidden_size / c->num_attention_heads;
    c->padded_vocab = (int)Vp;
    c->rms_norm_eps = 1e-5f;  // LayerNorm's epsilon
    c->tie_word_embeddings = 1;
    c->attention_bias = 1;
}

int gpt2_descriptor(const char *name, ModelConfig *c) {
    static const struct { const char *name; int L, C, NH; } d[] = {
        {"d12", 12, 768, 12}, {"d24", 24, 1024, 16}, {"d36", 36, 1280, 20}, {"d48", 48, 1600, 25}};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        if (strcmp(name, d[i].name)) continue;
        model_config_defaults(c);
        c->vocab_size = 50257;
        c->max_position_embeddings = 1024;
        c->num_hidden_layers = d[i].L, c->hidden_size = d[i].C, c->num_attention_heads = d[i].NH;
        gpt2_complete_config(c);
        return 1;
    }
    return 0;
}

static void read_header(const char *path, int32_t h[256], FILE **fp) {
    FILE *f = fopen(path, "rb");
    if (!f) fail("%s: cannot open GPT-2 checkpoint: %s", path, strerror(errno));
    if (fread(h, sizeof(int32_t), 256, f) != 256) fail("%s: truncated: shorter than the 1024-byte header", path);
    if (h[0] != GPT2_MAGIC) fail("%s: bad magic %d (expected %d, an llm.c GPT-2 checkpoint)", path, h[0], GPT2_MAGIC);
    if (h[1] != 3 && h[1] != 5) fail("%s: unsupported version %d (expected 3 = fp32 or 5 = bf16)", path, h[1]);
    for (int i = 2; i <= 7; i++)
        if (h[i] <= 0) fail("%s: header field %d is %d, expected a positive size", path, i, h[i]);
    if (h[7] < h[3]) fail("%s: padded vocab %d is smaller than vocab %d", path, h[7], h[3]);
    if (h[6] % h[5]) fail("%s: channels %d are not a multiple of heads %d", path, h[6], h[5]);
    *fp = f;
}

void gpt2_read_config(const char *path, ModelConfig *c) {
    int32_t h[256];
    FILE *f;
    read_header(path, h, &f);
    fclose(f);
    model_config_defaults(c);
    c->max_position_embeddings = h[2], c->vocab_size = h[3], c->num_hidden_layers = h[4];
    c->num_attention_heads = h[5], c->hidden_size = h[6];
    gpt2_complete_config(c);
    if (c->padded_vocab != h[7]) c->padded_vocab = h[7];  // keep the file's padding
    model_config_validate(c, path);
}

// Element offsets of llm.c's 16 tensors for a config, and the total.
enum { T_WTE, T_WPE, T_LN1W, T_LN1B, T_QKVW, T_QKVB, T_APW, T_APB, T_LN2W, T_LN2B, T_FCW, T_FCB,
       T_FPW, T_FPB, T_LNFW, T_LNFB, T_COUNT };

static size_t layout(const ModelConfig *c, size_t off[T_COUNT]) {
    const size_t C = c->hidden_size, L = c->num_hidden_layers, I = c->intermediate_size;
    const size_t sizes[T_COUNT] = {(size_t)c->padded_vocab * C, (size_t)c->max_position_embeddings * C,
                                   L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C, L * C,
                                   L * I * C, L * I, L * C * I, L * C, C, C};
    size_t o = 0;
    for (int i = 0; i < T_COUNT; i++) off[i] = o, o += sizes[i];
    return o;
}

// Where table entry i lives in llm.c's flat layout.
static size_t source_offset(const Model *m, int i, const size_t off[T_COUNT]) {
    const ParamTable *t = &m->tab;
    const ParamSpec *p = &t->specs[i];
    const size_t C = m->cfg.hidden_size, I = m->cfg.intermediate_size, l = (size_t)p->layer;
    if (i == t->embed) return off[T_WTE];
    if (i == t->pos_embed) return off[T_WPE];
    if (i == t->final_norm) return off[T_LNFW];
    if (i == t->final_norm_bias) return off[T_LNFB];
    int kind = -1;
    for (int k = 0; k < P_PER_LAYER; k++)
        if (param_index(t, p->layer, k) == i) kind = k;
    switch (kind) {
    case P_LN1: return off[T_LN1W] + l * C;
    case P_LN1B: return off[T_LN1B] + l * C;
    case P_WQ: return off[T_QKVW] + l * 3 * C * C;
    case P_WK: return off[T_QKVW] + l * 3 * C * C + C * C;
    case P_WV: return off[T_QKVW] + l * 3 * C * C + 2 * C * C;
    case P_BQ: return off[T_QKVB] + l * 3 * C;
    case P_BK: return off[T_QKVB] + l * 3 * C + C;
    case P_BV: return off[T_QKVB] + l * 3 * C + 2 * C;
    case P_WO: return off[T_APW] + l * C * C;
    case P_BO: return off[T_APB] + l * C;
    case P_LN2: return off[T_LN2W] + l * C;
    case P_LN2B: return off[T_LN2B] + l * C;
    case P_WUP: return off[T_FCW] + l * I * C;
    case P_BUP: return off[T_FCB] + l * I;
    case P_WDOWN: return off[T_FPW] + l * C * I;
    case P_BDOWN: return off[T_FPB] + l * C;
    }
    return (size_t)-1;  // adapters: not part of the file
}

void gpt2_load(Model *m, const char *path) {
    int32_t h[256];
    FILE *f;
    read_header(path, h, &f);
    const ModelConfig *c = &m->cfg;
    if (h[2] != c->max_position_embeddings || h[3] != c->vocab_size || h[4] != c->num_hidden_layers ||
        h[5] != c->num_attention_heads || h[6] != c->hidden_size || h[7] != c->padded_vocab)
        fail("%s: checkpoint shape (maxT %d, V %d, L %d, NH %d, C %d, Vp %d) differs from the model", path,
             h[2], h[3], h[4], h[5], h[6], h[7]);
    size_t off[T_COUNT], total = layout(c, off), es = h[1] == 3 ? 4 : 2;
    void *raw = xmalloc(total * es);
    size_t got = fread(raw, es, total, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != total)
        fail("%s: truncated: header promises %zu parameters, file holds %zu", path, total, got);
    if (extra) fail("%s: longer than the %zu parameters its header describes", path, total);
    float *w = xmalloc(sizeof(float) * total);
    if (es == 4) {
        memcpy(w, raw, total * 4);
    } else {
        const uint16_t *b = raw;
        for (size_t i = 0; i < total; i++) {
            uint32_t u = (uint32_t)b[i] << 16;
            memcpy(&w[i], &u, 4);
        }
    }
    free(raw);
    for (int i = 0; i < (int)arrlen(m->tab.specs); i++) {
        size_t o = source_offset(m, i, off);
        if (o != (size_t)-1) model_set_param(m, i, w + o);
    }
    free(w);
}

int gpt2_save(const Model *m, const char *path) {
    const ModelConfig *c = &m->cfg;
    size_t off[T_COUNT], total = layout(c, off);
    float *w = xcalloc(total, sizeof(float));
    for (int i = 0; i < (int)arrlen(m->tab.specs); i++) {
        size_t o = source_offset(m, i, off);
        if (o != (size_t)-1) model_get_param(m, i, w + o);
    }
    long long bad = first_nonfinite(w, total);
    if (bad >= 0) fail("%s: refusing to write: weight %lld is %g (the weights went non-finite)", path, bad, w[bad]);
    int32_t h[256] = {GPT2_MAGIC, 3, c->max_position_embeddings, c->vocab_size, c->num_hidden_layers,
                      c->num_attention_heads, c->hidden_size, c->padded_vocab};
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(h, sizeof h, 1, f) == 1 && fwrite(w, sizeof(float), total, f) == total;
    if (ok && (fflush(f) != 0 || fsync(fileno(f)) != 0)) ok = 0;  // on disk before it is published
    int e = errno;
    if (f && fclose(f) != 0 && ok) ok = 0, e = errno;
    free(w);
    errno = e;
    return ok ? 0 : -1;
}
