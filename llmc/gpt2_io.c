// gpt2_io.c: see gpt2_io.h.
#include "gpt2_io.h"
#include <errno.h>
#include <math.h>
#include <sys/stat.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "json.h"
#include "safetensors.h"
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

// Parses a whole positive decimal number; 0 for anything else.
static int whole_number(const char *s) {
    long v = 0;
    if (!*s) return 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > 1000000) return 0;
        v = v * 10 + (*s - '0');
    }
    return (int)v;
}

int gpt2_descriptor(const char *name, ModelConfig *c) {
    // llm.c's tables: GPT-2 by depth (the width and heads of each), GPT-3 by width (depth and
    // head size of each).
    static const struct { int L, C, NH; } g2[] = {{6, 384, 6},     {12, 768, 12},   {24, 1024, 16},
                                                  {36, 1280, 20},  {48, 1600, 25},  {60, 1920, 30},
                                                  {72, 2880, 30},  {84, 3456, 36}};
    static const struct { int C, L, HS; } g3[] = {{384, 6, 64},    {768, 12, 64},   {1024, 24, 64},
                                                  {1536, 24, 96},  {2048, 24, 128}, {2560, 32, 80},
                                                  {4096, 32, 128}, {5140, 40, 128}, {12288, 96, 128}};
    int L = 0, C = 0, NH = 0, maxT = 0;
    if (name[0] == 'd' || !strncmp(name, "gpt2:d", 6)) {
        int depth = whole_number(name + (name[0] == 'd' ? 1 : 6));
        for (size_t i = 0; i < sizeof g2 / sizeof g2[0]; i++)
            if (g2[i].L == depth) L = g2[i].L, C = g2[i].C, NH = g2[i].NH, maxT = 1024;
    } else if (!strncmp(name, "gpt3:c", 6)) {
        int width = whole_number(name + 6);
        for (size_t i = 0; i < sizeof g3 / sizeof g3[0]; i++)
            if (g3[i].C == width) L = g3[i].L, C = g3[i].C, NH = g3[i].C / g3[i].HS, maxT = 2048;
    }
    if (!L) return 0;
    model_config_defaults(c);
    c->vocab_size = 50257;
    c->max_position_embeddings = maxT;
    c->num_hidden_layers = L, c->hidden_size = C, c->num_attention_heads = NH;
    gpt2_complete_config(c);
    return 1;
}

// ---- Hugging Face GPT-2 directories (GPT2LMHeadModel)

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int json_int(const cJSON *o, const char *key, const char *path, int need) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {  // n_inner: null means 4 x n_embd
        if (need) fail("%s: config.json has no '%s' (a GPT-2 config.json has n_embd, n_layer, n_head, n_positions, vocab_size)", path, key);
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != (double)(int)v->valuedouble || v->valuedouble <= 0)
        fail("%s: config.json: '%s' must be a positive integer", path, key);
    return (int)v->valuedouble;
}

static void hf_gpt2_config(const char *dir, ModelConfig *c) {
    char path[4096];
    join_path(path, sizeof path, dir, "config.json");
    cJSON *o = json_read_file(path);  // strict: duplicate keys, trailing data, NUL are errors
    if (!cJSON_IsObject(o)) fail("%s: not a JSON object", path);
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(o, "model_type");
    if (!cJSON_IsString(mt) || strcmp(mt->valuestring, "gpt2"))
        fail("%s: model_type is %s; train_gpt trains GPT-2 (model_type gpt2) (use train_llama for Llama-family models)",
             path, cJSON_IsString(mt) ? mt->valuestring : "missing");
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(o, "activation_function");
    if (act && (!cJSON_IsString(act) || (strcmp(act->valuestring, "gelu_new") && strcmp(act->valuestring, "gelu_pytorch_tanh"))))
        fail("%s: activation_function %s is not implemented (GPT-2's gelu_new, the tanh form, is)", path,
             cJSON_IsString(act) ? act->valuestring : "(not a string)");
    const cJSON *eps = cJSON_GetObjectItemCaseSensitive(o, "layer_norm_epsilon");
    if (eps && (!cJSON_IsNumber(eps) || fabs(eps->valuedouble - 1e-5) > 1e-12))
        fail("%s: layer_norm_epsilon must be 1e-5 (GPT-2's; the kernels use it)", path);
    const cJSON *sa = cJSON_GetObjectItemCaseSensitive(o, "scale_attn_by_inverse_layer_idx");
    if (cJSON_IsTrue(sa)) fail("%s: scale_attn_by_inverse_layer_idx: true is not implemented", path);
    model_config_defaults(c);
    c->vocab_size = json_int(o, "vocab_size", path, 1);
    c->max_position_embeddings = json_int(o, "n_positions", path, 1);
    c->num_hidden_layers = json_int(o, "n_layer", path, 1);
    c->num_attention_heads = json_int(o, "n_head", path, 1);
    c->hidden_size = json_int(o, "n_embd", path, 1);
    int inner = json_int(o, "n_inner", path, 0);
    // GPT-2's files carry the pretraining dropouts (0.1). llm.c trains without dropout and so
    // does train_gpt; said once, so a fine-tune that expected them knows.
    static const char *const drops[] = {"attn_pdrop", "resid_pdrop", "embd_pdrop"};
    for (int i = 0; i < 3; i++) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(o, drops[i]);
        if (d && !cJSON_IsNull(d) && (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble >= 1))
            fail("%s: '%s' must be a number in [0, 1)", path, drops[i]);
        if (d && cJSON_IsNumber(d) && d->valuedouble != 0) {
            printf("note: %s: %s = %g (and any other dropout) is not applied: train_gpt trains without dropout, "
                   "as llm.c does\n", path, drops[i], d->valuedouble);
            break;
        }
    }
    cJSON_Delete(o);
    if (inner && inner != 4 * c->hidden_size) fail("%s: n_inner %d is not 4 x n_embd (GPT-2's MLP)", path, inner);
    if (c->hidden_size % c->num_attention_heads)
        fail("%s: n_embd %d is not a multiple of n_head %d", path, c->hidden_size, c->num_attention_heads);
    gpt2_complete_config(c);
    model_config_validate(c, path);
}

// The tensor of a GPT2LMHeadModel / GPT2Model file by its name without the prefix.
static const StTensor *hf_find(const StModel *sm, const char *name) {
    char full[160];
    snprintf(full, sizeof full, "transformer.%s", name);
    const StTensor *t = st_model_find(sm, full);
    return t ? t : st_model_find(sm, name);
}

static float *hf_tensor(const StModel *sm, const char *dir, const char *name, int64_t d0, int64_t d1) {
    const StTensor *t = hf_find(sm, name);
    if (!t) fail("%s: model.safetensors has no tensor '%s' (or 'transformer.%s')", dir, name, name);
    int ok = d1 ? t->ndim == 2 && t->shape[0] == d0 && t->shape[1] == d1 : t->ndim == 1 && t->shape[0] == d0;
    if (!ok) fail("%s: tensor '%s' has the wrong shape (expected [%lld%s%lld])", dir, name, (long long)d0,
                  d1 ? ", " : "", d1 ? (long long)d1 : 0LL);
    float *w = xmalloc(sizeof(float) * st_numel(t));
    st_to_f32(t, w);
    return w;
}

// Conv1D keeps weights as [in, out]; the table holds [out, in] rows [r0, r0 + rows) of it.
static void set_transposed(Model *m, int idx, const float *w, int64_t in, int64_t out, int64_t r0, int64_t rows) {
    float *t = xmalloc(sizeof(float) * rows * in);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < in; i++) t[r * in + i] = w[i * out + r0 + r];
    model_set_param(m, idx, t);
    free(t);
}

static void hf_gpt2_load(Model *m, const char *dir) {
    const ModelConfig *c = &m->cfg;
    const int64_t C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, Vp = c->padded_vocab;
    StModel *sm = st_open_model_dir(dir);
    const ParamTable *t = &m->tab;
    float *w = hf_tensor(sm, dir, "wte.weight", V, C);
    float *pad = xcalloc((size_t)(Vp * C), sizeof(float));  // padded rows stay zero, as llm.c's
    memcpy(pad, w, sizeof(float) * V * C);
    model_set_param(m, t->embed, pad);
    free(pad), free(w);
    w = hf_tensor(sm, dir, "wpe.weight", c->max_position_embeddings, C);
    model_set_param(m, t->pos_embed, w), free(w);
    w = hf_tensor(sm, dir, "ln_f.weight", C, 0), model_set_param(m, t->final_norm, w), free(w);
    w = hf_tensor(sm, dir, "ln_f.bias", C, 0), model_set_param(m, t->final_norm_bias, w), free(w);
    char n[128];
    for (int l = 0; l < c->num_hidden_layers; l++) {
        const int *lp = t->layer_param + l * P_PER_LAYER;
        static const struct { const char *name; int kind; } vec[] = {
            {"ln_1.weight", P_LN1}, {"ln_1.bias", P_LN1B}, {"ln_2.weight", P_LN2}, {"ln_2.bias", P_LN2B},
            {"attn.c_proj.bias", P_BO}, {"mlp.c_fc.bias", P_BUP}, {"mlp.c_proj.bias", P_BDOWN}};
        for (size_t i = 0; i < sizeof vec / sizeof vec[0]; i++) {
            snprintf(n, sizeof n, "h.%d.%s", l, vec[i].name);
            w = hf_tensor(sm, dir, n, vec[i].kind == P_BUP ? I : C, 0);
            model_set_param(m, lp[vec[i].kind], w), free(w);
        }
        snprintf(n, sizeof n, "h.%d.attn.c_attn.weight", l);
        w = hf_tensor(sm, dir, n, C, 3 * C);
        set_transposed(m, lp[P_WQ], w, C, 3 * C, 0, C);
        set_transposed(m, lp[P_WK], w, C, 3 * C, C, C);
        set_transposed(m, lp[P_WV], w, C, 3 * C, 2 * C, C);
        free(w);
        snprintf(n, sizeof n, "h.%d.attn.c_attn.bias", l);
        w = hf_tensor(sm, dir, n, 3 * C, 0);
        model_set_param(m, lp[P_BQ], w), model_set_param(m, lp[P_BK], w + C), model_set_param(m, lp[P_BV], w + 2 * C);
        free(w);
        snprintf(n, sizeof n, "h.%d.attn.c_proj.weight", l);
        w = hf_tensor(sm, dir, n, C, C), set_transposed(m, lp[P_WO], w, C, C, 0, C), free(w);
        snprintf(n, sizeof n, "h.%d.mlp.c_fc.weight", l);
        w = hf_tensor(sm, dir, n, C, I), set_transposed(m, lp[P_WUP], w, C, I, 0, I), free(w);
        snprintf(n, sizeof n, "h.%d.mlp.c_proj.weight", l);
        w = hf_tensor(sm, dir, n, I, C), set_transposed(m, lp[P_WDOWN], w, I, C, 0, C), free(w);
    }
    // A separate lm_head must equal wte (GPT-2 ties them); anything else would be dropped.
    const StTensor *head = st_model_find(sm, "lm_head.weight");
    if (head) {
        float *h = hf_tensor(sm, dir, "lm_head.weight", V, C), *e = hf_tensor(sm, dir, "wte.weight", V, C);
        if (memcmp(h, e, sizeof(float) * V * C))
            fail("%s: lm_head.weight differs from wte.weight; GPT-2's head is tied to the embedding", dir);
        free(h), free(e);
    }
    st_model_close(sm);
}

// Element offsets of llm.c's 16 tensors for a config, and the total; SIZE_MAX when the total
// does not fit a size_t (a header's sizes are only checked to be positive ints).
enum { T_WTE, T_WPE, T_LN1W, T_LN1B, T_QKVW, T_QKVB, T_APW, T_APB, T_LN2W, T_LN2B, T_FCW, T_FCB,
       T_FPW, T_FPB, T_LNFW, T_LNFB, T_COUNT };

static size_t layout(const ModelConfig *c, size_t off[T_COUNT]) {
    const size_t C = c->hidden_size, L = c->num_hidden_layers, I = c->intermediate_size;
    const size_t f[T_COUNT][3] = {{(size_t)c->padded_vocab, C, 1}, {(size_t)c->max_position_embeddings, C, 1},
                                  {L, C, 1}, {L, C, 1}, {L, 3 * C, C}, {L, 3 * C, 1}, {L, C, C}, {L, C, 1},
                                  {L, C, 1}, {L, C, 1}, {L, I, C}, {L, I, 1}, {L, C, I}, {L, C, 1}, {C, 1, 1},
                                  {C, 1, 1}};
    size_t o = 0;
    for (int i = 0; i < T_COUNT; i++) {
        size_t n;
        off[i] = o;
        if (__builtin_mul_overflow(f[i][0], f[i][1], &n) || __builtin_mul_overflow(n, f[i][2], &n) ||
            __builtin_add_overflow(o, n, &o))
            return SIZE_MAX;
    }
    return o;
}

// The header, checked; the file is left open after it. A bad header closes the file before
// failing (the fuzz harness returns from fail() and frees what the reader allocated: a FILE
// left open would stay linked in libc's list of streams).
static FILE *read_header(const char *path, int32_t h[256]) {
    FILE *f = fopen(path, "rb");
    if (!f) fail("%s: cannot open GPT-2 checkpoint: %s", path, strerror(errno));
    char why[160] = "";
    if (fread(h, sizeof(int32_t), 256, f) != 256)
        snprintf(why, sizeof why, "truncated: shorter than the 1024-byte header");
    else if (h[0] != GPT2_MAGIC)
        snprintf(why, sizeof why, "bad magic %d (expected %d, an llm.c GPT-2 checkpoint)", h[0], GPT2_MAGIC);
    else if (h[1] != 3 && h[1] != 5)
        snprintf(why, sizeof why, "unsupported version %d (expected 3 = fp32 or 5 = bf16)", h[1]);
    for (int i = 2; i <= 7 && !why[0]; i++)
        if (h[i] <= 0) snprintf(why, sizeof why, "header field %d is %d, expected a positive size", i, h[i]);
    if (!why[0] && h[7] < h[3]) snprintf(why, sizeof why, "padded vocab %d is smaller than vocab %d", h[7], h[3]);
    if (!why[0] && h[6] % h[5]) snprintf(why, sizeof why, "channels %d are not a multiple of heads %d", h[6], h[5]);
    if (why[0]) {
        fclose(f);
        fail("%s: %s", path, why);
    }
    return f;
}

void gpt2_read_config(const char *path, ModelConfig *c) {
    if (is_dir(path)) {
        hf_gpt2_config(path, c);
        return;
    }
    int32_t h[256];
    fclose(read_header(path, h));
    model_config_defaults(c);
    c->max_position_embeddings = h[2], c->vocab_size = h[3], c->num_hidden_layers = h[4];
    c->num_attention_heads = h[5], c->hidden_size = h[6];
    gpt2_complete_config(c);
    if (c->padded_vocab != h[7]) c->padded_vocab = h[7];  // keep the file's padding
    model_config_validate(c, path);
    // The caller allocates the model this header describes: a file that does not hold it
    // (truncated, or another file's header) fails now, not after gigabytes were allocated.
    size_t off[T_COUNT], total = layout(c, off), es = h[1] == 3 ? 4 : 2, want;
    struct stat st;
    if (stat(path, &st) != 0) fail("%s: cannot stat GPT-2 checkpoint: %s", path, strerror(errno));
    if (total == SIZE_MAX || __builtin_mul_overflow(total, es, &want) || __builtin_add_overflow(want, 1024, &want))
        fail("%s: header describes more parameters than a file can hold", path);
    if ((uint64_t)st.st_size != want)
        fail("%s: %s: the header promises %zu parameters (%zu bytes with the header), the file has %lld bytes",
             path, (uint64_t)st.st_size < want ? "truncated" : "longer than its header describes", total, want,
             (long long)st.st_size);
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
    if (is_dir(path)) {
        hf_gpt2_load(m, path);
        return;
    }
    int32_t h[256];
    FILE *f = read_header(path, h);
    const ModelConfig *c = &m->cfg;
    if (h[2] != c->max_position_embeddings || h[3] != c->vocab_size || h[4] != c->num_hidden_layers ||
        h[5] != c->num_attention_heads || h[6] != c->hidden_size || h[7] != c->padded_vocab)
        fclose(f), fail("%s: checkpoint shape (maxT %d, V %d, L %d, NH %d, C %d, Vp %d) differs from the model", path,
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

// Table entries in the file's order (gpt2_save).
typedef struct {
    size_t off;
    int spec;
} FileSlot;

static int by_offset(const void *a, const void *b) {
    const size_t x = ((const FileSlot *)a)->off, y = ((const FileSlot *)b)->off;
    return x < y ? -1 : x > y;
}

// Writes n zero floats (a stretch of the layout no table entry fills) through buf, which
// holds cap. (Called before every tensor: nothing to clear when there is no stretch.)
static int write_zeros(FILE *f, float *buf, size_t cap, size_t n) {
    if (!n) return 1;
    memset(buf, 0, (n < cap ? n : cap) * sizeof(float));
    for (size_t k; n; n -= k) {
        k = n < cap ? n : cap;
        if (fwrite(buf, sizeof(float), k, f) != k) return 0;
    }
    return 1;
}

// The tensors are written in the file's order, each made as it is written through one buffer
// of the largest, so saving never holds the whole model a second time in host memory.
int gpt2_save(const Model *m, const char *path, int merge) {
    const ModelConfig *c = &m->cfg;
    size_t off[T_COUNT], total = layout(c, off), most = 1;
    const int n = (int)arrlen(m->tab.specs);
    FileSlot *slot = xmalloc(sizeof(FileSlot) * (size_t)(n ? n : 1));
    int k = 0;
    for (int i = 0; i < n; i++) {
        size_t o = source_offset(m, i, off);
        if (o == (size_t)-1) continue;
        slot[k++] = (FileSlot){o, i};
        if (m->tab.specs[i].numel > most) most = m->tab.specs[i].numel;
    }
    qsort(slot, (size_t)k, sizeof(FileSlot), by_offset);
    float *w = xmalloc(sizeof(float) * most);
    int32_t h[256] = {GPT2_MAGIC, 3, c->max_position_embeddings, c->vocab_size, c->num_hidden_layers,
                      c->num_attention_heads, c->hidden_size, c->padded_vocab};
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(h, sizeof h, 1, f) == 1;
    size_t at = 0;  // floats written after the header
    for (int j = 0; ok && j < k; j++) {
        const ParamSpec *p = &m->tab.specs[slot[j].spec];
        if (slot[j].off < at || slot[j].off + p->numel > total)
            fail("internal: %s: tensor %s does not fit llm.c's layout at %zu", path, p->name, slot[j].off);
        ok = write_zeros(f, w, most, slot[j].off - at);
        if (merge) model_get_param_merged(m, slot[j].spec, w);
        else model_get_param(m, slot[j].spec, w);
        long long bad = first_nonfinite(w, p->numel);
        if (bad >= 0)  // fail() removes the temporary directory this file is in
            fail("%s: refusing to write: weight %lld is %g (the weights went non-finite)", path,
                 (long long)(slot[j].off + (size_t)bad), w[bad]);
        ok = ok && fwrite(w, sizeof(float), p->numel, f) == p->numel;
        at = slot[j].off + p->numel;
    }
    ok = ok && write_zeros(f, w, most, total - at);
    if (ok && (fflush(f) != 0 || fsync(fileno(f)) != 0)) ok = 0;  // on disk before it is published
    int e = errno;
    if (f && fclose(f) != 0 && ok) ok = 0, e = errno;
    free(w);
    free(slot);
    errno = e;
    return ok ? 0 : -1;
}
