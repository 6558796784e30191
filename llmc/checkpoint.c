// checkpoint.c: see checkpoint.h.
#include "checkpoint.h"
#include "optim.h"
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "comm.h"
#include "family.h"
#include "gpt2_io.h"
#include "hf.h"
#include "json.h"
#include "peft.h"
#include "nf4.h"
#include "safetensors.h"
#include "stb_ds.h"

void load_hf_config(const char *dir, ModelConfig *cfg) {
    char path[4096];
    join_path(path, sizeof path, dir, "config.json");
    hf_read_config(path, cfg);
    model_config_validate(cfg, path);
}

static void check_shape(const StTensor *t, const ParamSpec *p, const char *where) {
    int ok = t->ndim == p->ndim && t->shape[0] == p->shape[0] &&
             (p->ndim == 1 || t->shape[1] == p->shape[1]);
    if (!ok) {
        char have[64] = "", want[64];
        for (int d = 0; d < t->ndim && d < 4; d++)
            snprintf(have + strlen(have), sizeof have - strlen(have), "%s%" PRId64, d ? ", " : "",
                     t->shape[d]);
        if (p->ndim == 1) snprintf(want, sizeof want, "%" PRId64, p->shape[0]);
        else snprintf(want, sizeof want, "%" PRId64 ", %" PRId64, p->shape[0], p->shape[1]);
        fail("%s: tensor '%s' has shape [%s], the config needs [%s]", where, p->name, have, want);
    }
}

// Writes (and frees) a JSON object, flushed to disk; 0 or -1 with errno.
static int write_json(const char *path, cJSON *o) {
    char *txt = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!txt) { errno = ENOMEM; return -1; }  // cJSON's out-of-memory: no file rather than a bad one
    FILE *f = fopen(path, "w");
    int ok = f && fputs(txt, f) >= 0 && fputc('\n', f) != EOF;
    if (f && (fflush(f) != 0 || fsync(fileno(f)) != 0)) ok = 0;
    if (f && fclose(f) != 0) ok = 0;
    free(txt);
    return ok ? 0 : -1;
}

// Which tensors of the table a file holds, and under which names: the base weights (HF
// names), the LoRA adapters (PEFT names), or one AdamW moment of every trainable tensor.
enum { SEL_BASE, SEL_ADAPTER, SEL_EXP_AVG, SEL_EXP_AVG_SQ };
static const char *const SEL_PREFIX[] = {"", "base_model.model.", "exp_avg.", "exp_avg_sq."};

// An adapter file holds the adapters and, in an adapter run, the modules_to_save tensors (the
// only other trainable ones), under PEFT's names: base_model.model.lm_head.weight.
static int selected(const ParamSpec *p, int sel) {
    int lora = strstr(p->name, ".lora_") != NULL;
    return sel == SEL_BASE ? !lora : sel == SEL_ADAPTER ? lora || p->trainable : p->trainable;
}

static float *moment(const Model *m, int sel) { return sel == SEL_EXP_AVG ? m->adam_m : m->adam_v; }

// nf4_load looks tensors up through this, whatever the source.
typedef struct { const StTensor *(*find)(const void *, const char *); const void *src; } FindCtx;
static const StTensor *find_via(void *ctx, const char *name) {
    FindCtx *f = ctx;
    return f->find(f->src, name);
}

// A base tensor that the files hold inside a fused one (Phi-3): its rows of that tensor,
// which is read whole into buf (sized for it) and checked as a whole.
static const float *load_fused_part(const char *where, const StTensor *(*find)(const void *, const char *),
                                    const void *src, const ParamSpec *p, const FusedSlice *fs, float *buf) {
    const StTensor *t = find(src, fs->name);
    if (!t) fail("%s: missing tensor '%s'", where, fs->name);
    char qs[200];
    snprintf(qs, sizeof qs, "%s.quant_state.bitsandbytes__nf4", fs->name);
    if (find(src, qs))
        fail("%s: tensor '%s' is 4-bit (bitsandbytes); a fused 4-bit tensor is not supported (give the "
             "16-bit base; QLoRA quantizes it at load)", where, fs->name);
    if (t->ndim != 2 || t->shape[0] != fs->rows || t->shape[1] != p->shape[1])
        fail("%s: tensor '%s' has shape [%" PRId64 ", %" PRId64 "], the config needs [%" PRId64 ", %" PRId64 "]",
             where, fs->name, t->shape[0], t->ndim > 1 ? t->shape[1] : 0, fs->rows, p->shape[1]);
    if (strcmp(t->dtype, "F32") && strcmp(t->dtype, "BF16") && strcmp(t->dtype, "F16"))
        fail("%s: tensor '%s' has dtype %s; expected F32, BF16 or F16", where, fs->name, t->dtype);
    st_to_f32(t, buf);
    const size_t n = (size_t)fs->rows * (size_t)p->shape[1];
    long long bad = first_nonfinite(buf, n);
    if (bad >= 0)
        fail("%s: tensor '%s' element %lld is %g; refusing to load non-finite values", where, fs->name, bad, buf[bad]);
    return buf + (size_t)fs->row0 * (size_t)p->shape[1];
}

// The file name of table tensor `tname` under selection sel: PEFT's prefix for adapters, and on
// a Gemma 3 multimodal base (Gemma3ForConditionalGeneration) the text model's place in it: its
// files' layout (m->mm_prefix) for the weights, model.language_model. for adapters
// (transformers >= 4.52, as PEFT names them on that model today).
static void file_name(const Model *m, int sel, const char *tname, char *out, size_t cap) {
    if (m->cfg.multimodal && sel == SEL_BASE) {
        if (!strncmp(tname, "model.", 6)) snprintf(out, cap, "%s%s", m->mm_prefix, tname + 6);
        else if (!strcmp(m->mm_prefix, "language_model.model.")) snprintf(out, cap, "language_model.%s", tname);  // an untied lm_head
        else snprintf(out, cap, "%s", tname);
        return;
    }
    char hf[128];  // table names are shorter (ParamSpec.name)
    if (sel == SEL_ADAPTER) family_hf_name(&m->cfg, tname, hf, sizeof hf);
    else snprintf(hf, sizeof hf, "%s", tname);
    snprintf(out, cap, "%s%s", SEL_PREFIX[sel], hf);
}

// Loads the selected tensors via a lookup function (a model directory or one file).
// Returns 1 when a reward model's score head was not in the files (a causal LM's: left as it is).
static int load_params(Model *m, const char *where, const StTensor *(*find)(const void *, const char *),
                       const void *src, int sel) {
    int no_score = 0;
    size_t maxn = 0;
    FusedSlice fs;
    for (int i = 0; i < (int)arrlen(m->tab.specs); i++) {
        size_t n = m->tab.specs[i].numel;
        if (family_fused_slice(&m->tab, i, &fs)) n = (size_t)fs.rows * (size_t)m->tab.specs[i].shape[1];
        if (n > maxn) maxn = n;
    }
    float *buf = xmalloc(sizeof(float) * maxn);
    for (int i = 0; i < (int)arrlen(m->tab.specs); i++) {
        const ParamSpec *p = &m->tab.specs[i];
        if (!selected(p, sel)) continue;
        if (sel == SEL_BASE && family_fused_slice(&m->tab, i, &fs)) {
            model_set_param(m, i, load_fused_part(where, find, src, p, &fs, buf));
            continue;
        }
        char name[200];
        file_name(m, sel, p->name, name, sizeof name);
        if (p->quant == 4) {  // QLoRA: a bitsandbytes 4-bit tensor loads as it is; else quantize
            Nf4Weight q;
            FindCtx fc = {find, src};
            if (nf4_load(&q, name, find_via, &fc)) {
                if (q.ndim != 2 || q.shape[0] != p->shape[0] || q.shape[1] != p->shape[1])
                    fail("%s: 4-bit tensor '%s' has the wrong shape", where, name);
                model_set_param_nf4(m, i, &q);
                nf4_free(&q);
                continue;
            }
        }
        const StTensor *t = find(src, name);
        if (!t && sel == SEL_BASE && (i == m->tab.lm_head || i == m->tab.score_bias) && m->cfg.num_labels) {  // a causal LM's files
            no_score = 1;
            continue;
        }
        if (!t) fail("%s: missing tensor '%s'", where, name);
        char qs[240];
        snprintf(qs, sizeof qs, "%s.quant_state.bitsandbytes__nf4", name);
        if (p->quant != 4 && find(src, qs))
            fail("%s: tensor '%s' is 4-bit (bitsandbytes); set adapter: qlora and load_in_4bit: true", where, name);
        snprintf(qs, sizeof qs, "%s.SCB", name);
        if (find(src, qs))
            fail("%s: tensor '%s' is bitsandbytes' 8-bit (LLM.int8) storage, which is not read here; give the "
                 "float (bfloat16/float32) model: load_in_8bit: true quantizes it at load", where, name);
        check_shape(t, p, where);
        if (strcmp(t->dtype, "F32") && strcmp(t->dtype, "BF16") && strcmp(t->dtype, "F16"))
            fail("%s: tensor '%s' has dtype %s; expected F32, BF16 or F16", where, name, t->dtype);
        st_to_f32(t, buf);
        long long bad = first_nonfinite(buf, p->numel);
        if (bad >= 0)  // training would only skip every step; say which weight is broken
            fail("%s: tensor '%s' element %lld is %g; refusing to load non-finite values", where,
                 name, bad, buf[bad]);
        if (sel == SEL_BASE || sel == SEL_ADAPTER) {
            model_set_param(m, i, buf);
        } else {
            model_state_put(m, moment(m, sel) + p->goff, buf, p->numel);
        }
    }
    free(buf);
    return no_score;
}

static const StTensor *find_in_model(const void *s, const char *n) { return st_model_find(s, n); }
static const StTensor *find_in_file(const void *s, const char *n) { return st_find(s, n); }

int load_hf_weights(Model *m, const char *dir) {
    StModel *sm = st_open_model_dir(dir);
    char embed[160];
    if (m->cfg.multimodal) {  // the hub's files hold language_model.model.X, transformers >= 4.52's model.language_model.X
        const char *pre = st_model_find(sm, "language_model.model.embed_tokens.weight") ? "language_model.model."
                          : st_model_find(sm, "model.language_model.embed_tokens.weight") ? "model.language_model."
                                                                                          : NULL;
        if (!pre)
            fail("%s: a Gemma 3 multimodal model without language_model.model.embed_tokens.weight or "
                 "model.language_model.embed_tokens.weight", dir);
        snprintf(m->mm_prefix, sizeof m->mm_prefix, "%s", pre);
        if (!m->mm_base[0]) snprintf(m->mm_base, sizeof m->mm_base, "%s", dir);  // the base, not a later checkpoint
    }
    const int no_score = load_params(m, dir, find_in_model, sm, SEL_BASE);
    // The final model is written in the base's dtype (save_dtype: auto): the embedding's.
    file_name(m, SEL_BASE, m->cfg.arch == ARCH_GPT2 ? "wte.weight" : "model.embed_tokens.weight", embed, sizeof embed);
    const StTensor *e = st_model_find(sm, embed);
    const char *dt = !e ? "" : !strcmp(e->dtype, "BF16") ? "bfloat16" : !strcmp(e->dtype, "F16") ? "float16" : "float32";
    snprintf(m->cfg.torch_dtype, sizeof m->cfg.torch_dtype, "%s", dt);
    st_model_close(sm);
    return no_score;
}

// Round-to-nearest-even float -> half without _Float16 (which not every compiler targets):
// a subnormal result is rounded by one float addition of a magic constant (the FPU rounds to
// nearest even), a normal one by adding half an ulp minus one plus the kept mantissa's low bit.
static uint16_t to_f16(float f) {
    const uint32_t f32_inf = 255u << 23, f16_overflow = (127u + 16u) << 23;  // 2^16
    const uint32_t denorm_magic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = u & 0x80000000u;
    u ^= sign;
    uint16_t h;
    if (u >= f16_overflow) {
        h = u > f32_inf ? 0x7e00 : 0x7c00;  // NaN stays NaN; too large becomes infinity
    } else if (u < (113u << 23)) {  // below 2^-14: a half subnormal (or zero)
        float x, magic;
        memcpy(&x, &u, 4);
        memcpy(&magic, &denorm_magic, 4);
        x += magic;
        uint32_t r;
        memcpy(&r, &x, 4);
        h = (uint16_t)(r - denorm_magic);
    } else {
        u += ((uint32_t)(15 - 127) << 23) + 0xfffu + ((u >> 13) & 1u);
        h = (uint16_t)(u >> 13);
    }
    return h | (uint16_t)(sign >> 16);
}

// Converts n floats at buf, in place, into the 16-bit dtype (BF16 or F16): value i moves from
// bytes 4i to 2i, which it has already been read from. Returns -1, or the index of a value
// that overflows the dtype (beyond 65504 in float16, say), which is left in *val: an infinity
// must not be written where a number was. (memcpy: float and uint16_t views of one buffer.)
static long long narrow(const char *dtype, void *buf, size_t n, float *val) {
    const int bf = !strcmp(dtype, "BF16");
    const uint16_t inf = bf ? 0x7f80 : 0x7c00;
    char *b = buf;
    for (size_t i = 0; i < n; i++) {
        float x;
        memcpy(&x, b + 4 * i, 4);
        uint16_t h = bf ? float_to_bf16(x) : to_f16(x);
        if ((h & inf) == inf) { *val = x; return (long long)i; }
        memcpy(b + 2 * i, &h, 2);
    }
    return -1;
}

// Writes items into DIR/model.safetensors, or, above max_shard bytes, into
// model-0000k-of-0000N.safetensors shards with model.safetensors.index.json as transformers
// does: tensors in table order, a shard closed before the tensor that would overflow it.
static int write_model_files(const char *dir, StWriteItem *items, int n, uint64_t max_shard) {
    const char *meta[] = {"format", "pt", NULL};
    char path[4096];
    uint64_t total = 0, in_cur = 0;
    int *shard_of = xcalloc((size_t)(n ? n : 1), sizeof(int)), nshards = n ? 1 : 0;
    for (int i = 0; i < n; i++) {
        if (in_cur && in_cur + items[i].nbytes > max_shard) nshards++, in_cur = 0;
        shard_of[i] = nshards - 1;
        in_cur += items[i].nbytes;
        total += items[i].nbytes;
    }
    int rc = 0;
    if (nshards <= 1) {
        join_path(path, sizeof path, dir, "model.safetensors");
        rc = st_write(path, items, n, meta);
        free(shard_of);
        return rc;
    }
    cJSON *index = cJSON_CreateObject(), *md = cJSON_AddObjectToObject(index, "metadata"),
          *wm = cJSON_AddObjectToObject(index, "weight_map");
    char total_s[32], name[64];
    snprintf(total_s, sizeof total_s, "%llu", (unsigned long long)total);
    cJSON_AddRawToObject(md, "total_size", total_s);
    for (int k = 0, first = 0; k < nshards && rc == 0; k++) {
        int last = first;
        while (last < n && shard_of[last] == k) last++;
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, nshards);
        join_path(path, sizeof path, dir, name);
        rc = st_write(path, items + first, last - first, meta);
        for (int i = first; i < last; i++) cJSON_AddStringToObject(wm, items[i].name, name);
        first = last;
    }
    join_path(path, sizeof path, dir, "model.safetensors.index.json");
    if (rc == 0) rc = write_json(path, index);
    else cJSON_Delete(index);
    free(shard_of);
    return rc;
}

// Narrows a written tensor's floats to dtype in place (a no-op for F32); its byte size.
static size_t narrow_item(const char *dtype, const char *path, const char *name, float *buf, size_t numel) {
    if (!strcmp(dtype, "F32")) return numel * sizeof(float);
    float v;
    long long bad = narrow(dtype, buf, numel, &v);
    if (bad >= 0)
        fail("%s: refusing to write '%s' as %s: element %lld (%g) overflows it; use save_dtype: float32", path,
             name, dtype, bad, v);
    return numel * 2;
}

// Where a written tensor comes from (write_tensors): table entry spec in selection sel, or
// the fused tensor fs (Phi-3's qkv_proj or gate_up_proj: its parts' rows stacked in order).
typedef struct {
    const Model *m;
    const char *path, *name, *dtype;
    int spec, sel, merge, fused;
    FusedSlice fs;
} TensorSource;

// Moments are copied in pieces of 16M floats (64 MiB), weights a tensor at a time.
// LLMC_SAVE_PIECE_FLOATS sets the moments' piece, for tests that need several per tensor.
static size_t moment_piece(void) {
    const char *env = getenv("LLMC_SAVE_PIECE_FLOATS");
    return env && atol(env) > 0 ? (size_t)atol(env) : (size_t)1 << 24;
}

// StWriteItem.fill: elements [first, first + n) of the tensor, each merged with its adapter
// when asked, checked for non-finite values, narrowed in place to the file's dtype.
static size_t tensor_fill(void *ctx, size_t first, size_t n, void *dst) {
    const TensorSource *s = ctx;
    const Model *m = s->m;
    float *buf = dst;
    if (s->fused) {
        float *at = buf;
        for (int j = 0; j < s->fs.nparts; j++) {
            if (s->merge) model_get_param_merged(m, s->fs.parts[j], at);  // W + scale * B A
            else model_get_param(m, s->fs.parts[j], at);
            at += m->tab.specs[s->fs.parts[j]].numel;
        }
    } else if (s->sel == SEL_BASE || s->sel == SEL_ADAPTER) {
        if (s->merge) model_get_param_merged(m, s->spec, buf);
        else model_get_param(m, s->spec, buf);
    } else {
        model_state_get(m, buf, moment(m, s->sel) + m->tab.specs[s->spec].goff + first, n);
    }
    long long bad = first_nonfinite(buf, n);
    if (bad >= 0)  // never publish NaN weights; the last good checkpoint stays as it is
        fail("%s: refusing to write '%s': element %lld is %g (the weights or optimizer state went "
             "non-finite)", s->path, s->name, (long long)first + bad, buf[bad]);
    return narrow_item(s->dtype, s->path, s->name, buf, n);  // in place
}

// Writes the selected tensors (several selections into one file). fmt NULL: one F32 file at
// path (checkpoints: exact resume). Else path is a directory and the model is written in
// fmt->dtype, sharded above fmt->max_shard bytes (the final model, as transformers saves it).
// Each tensor is made as it is written (tensor_fill), so the host never holds more than the
// largest one.
static int write_tensors(const Model *m, const char *path, const int *sels, int nsel, int merge,
                         const SaveFormat *fmt) {
    const ParamTable *t = &m->tab;
    const char *dtype = fmt && fmt->dtype ? fmt->dtype : "F32";
    const size_t es = st_dtype_size(dtype);
    int n = (int)arrlen(t->specs), count = 0;
    StWriteItem *items = xcalloc((size_t)n * nsel, sizeof(StWriteItem));
    TensorSource *src = xcalloc((size_t)n * nsel, sizeof(TensorSource));
    for (int k = 0; k < nsel; k++)
        for (int i = 0; i < n; i++) {
            const ParamSpec *p = &t->specs[i];
            if (!selected(p, sels[k])) continue;
            TensorSource *s = &src[count];
            *s = (TensorSource){.m = m, .path = path, .dtype = dtype, .spec = i, .sel = sels[k], .merge = merge};
            int64_t rows = p->shape[0], cols = p->shape[1];
            if (sels[k] == SEL_BASE && family_fused_slice(t, i, &s->fs)) {
                if (s->fs.part != 0) continue;  // the later parts go into the first one's tensor
                s->fused = 1;
                s->name = xstrdup(s->fs.name);
                rows = s->fs.rows, cols = t->specs[s->fs.parts[0]].shape[1];
            } else {
                const size_t cap = strlen(SEL_PREFIX[sels[k]]) + strlen(p->name) + sizeof m->mm_prefix + 32;
                char *name = xmalloc(cap);
                file_name(m, sels[k], p->name, name, cap);
                s->name = name;
            }
            const int moments = sels[k] == SEL_EXP_AVG || sels[k] == SEL_EXP_AVG_SQ;
            const size_t numel = s->fused ? (size_t)rows * (size_t)cols : p->numel;
            items[count++] = (StWriteItem){.name = s->name, .ndim = s->fused ? 2 : p->ndim, .shape = {rows, cols},
                                           .dtype = dtype, .nbytes = numel * es, .fill = tensor_fill, .ctx = s,
                                           .chunk = moments ? moment_piece() : 0};
        }
    // A Gemma 3 multimodal model's weights: the rest of the base (vision tower, projector) as it
    // came, byte for byte, beside the text model's.
    StModel *base = NULL;
    int nall = count;
    if (m->cfg.multimodal && nsel == 1 && sels[0] == SEL_BASE) {
        base = st_open_model_dir(m->mm_base);
        const int nb = st_model_count(base);
        StWriteItem *grown = xcalloc((size_t)(count + nb), sizeof(StWriteItem));
        memcpy(grown, items, sizeof(StWriteItem) * (size_t)count);
        free(items);
        items = grown;
        for (int i = 0; i < nb; i++) {
            const StTensor *b = st_model_tensor(base, i);
            if (!strncmp(b->name, m->mm_prefix, strlen(m->mm_prefix)) || !strcmp(b->name, "lm_head.weight") ||
                !strcmp(b->name, "language_model.lm_head.weight"))
                continue;  // the text model's: written from the table above
            if (b->ndim > 4) fail("%s: tensor '%s' has %d dimensions; at most 4 are copied", m->mm_base, b->name, b->ndim);
            StWriteItem it = {.name = b->name, .ndim = b->ndim, .dtype = b->dtype, .raw = b->data, .nbytes = b->nbytes};
            for (int d = 0; d < b->ndim; d++) it.shape[d] = b->shape[d];
            items[nall++] = it;
        }
    }
    const char *meta[] = {"format", "pt", NULL};
    int rc = fmt ? write_model_files(path, items, nall, fmt->max_shard) : st_write(path, items, nall, meta);
    if (base) st_model_close(base);
    for (int j = 0; j < count; j++) free((char *)src[j].name);
    free(items), free(src);
    return rc;
}

int save_hf_model(const Model *m, const char *dir, int merge, const SaveFormat *fmt) {
    char path[4096];
    if (m->cfg.arch == ARCH_GPT2) {  // llm.c's file, which llm.c loads as it is
        join_path(path, sizeof path, dir, "model.bin");
        return gpt2_save(m, path, merge);
    }
    const int sel[] = {SEL_BASE};
    ModelConfig out = m->cfg;
    if (fmt) {
        if (write_tensors(m, dir, sel, 1, merge, fmt) != 0) return -1;
        const char *dt = fmt->dtype ? fmt->dtype : "F32";
        snprintf(out.torch_dtype, sizeof out.torch_dtype, "%s",
                 !strcmp(dt, "BF16") ? "bfloat16" : !strcmp(dt, "F16") ? "float16" : "float32");
    } else {
        join_path(path, sizeof path, dir, "model.safetensors");
        if (write_tensors(m, path, sel, 1, merge, NULL) != 0) return -1;
        snprintf(out.torch_dtype, sizeof out.torch_dtype, "float32");
    }
    join_path(path, sizeof path, dir, "config.json");
    return hf_write_config(path, &out, m->cfg.multimodal ? m->mm_base : NULL);
}

// PEFT layout: adapter_model.safetensors + adapter_config.json.
int save_adapter(const Model *m, const char *dir, const char *base_model) {
    char path[4096];
    const int sel[] = {SEL_ADAPTER};
    join_path(path, sizeof path, dir, "adapter_model.safetensors");
    if (write_tensors(m, path, sel, 1, 0, NULL) != 0) return -1;
    cJSON *o = peft_adapter_config(&m->tab.lora, &m->cfg, base_model);
    join_path(path, sizeof path, dir, "adapter_config.json");
    return write_json(path, o);
}

void load_adapter(Model *m, const char *dir) {
    char path[4096];
    join_path(path, sizeof path, dir, "adapter_config.json");
    cJSON *o = json_read_file(path);
    const LoraConfig *lc = &m->tab.lora;
    cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "r"), *a = cJSON_GetObjectItemCaseSensitive(o, "lora_alpha");
    if (!cJSON_IsNumber(r) || r->valueint != lc->r)
        fail("%s: adapter rank r=%d differs from lora_r %d", path, cJSON_IsNumber(r) ? r->valueint : -1, lc->r);
    if (!cJSON_IsNumber(a) || (float)a->valuedouble != lc->alpha)
        fail("%s: adapter lora_alpha %g differs from lora_alpha %g", path, cJSON_IsNumber(a) ? a->valuedouble : -1.0, lc->alpha);
    cJSON *rs = cJSON_GetObjectItemCaseSensitive(o, "use_rslora");
    if (cJSON_IsTrue(rs) != (lc->rslora != 0))
        fail("%s: adapter use_rslora is %s but use_rslora is %s", path, cJSON_IsTrue(rs) ? "true" : "false",
             lc->rslora ? "true" : "false");
    LoraConfig got = *lc;
    peft_read_targets(path, o, &m->cfg, &got);
    if (got.save_embed != lc->save_embed || got.save_head != lc->save_head)
        fail("%s: the adapter's modules_to_save (%s%s%s) differ from the run's lora_modules_to_save (%s%s%s)", path,
             got.save_embed ? "embed_tokens " : "", got.save_head ? "lm_head" : "",
             got.save_embed || got.save_head ? "" : "none", lc->save_embed ? "embed_tokens " : "",
             lc->save_head ? "lm_head" : "", lc->save_embed || lc->save_head ? "" : "none");
    char diff[256];
    peft_describe_difference(&got, lc, &m->cfg, diff, sizeof diff);
    if (diff[0])
        fail("%s: the adapter's target_modules/layers_to_transform differ from the run's lora_target_modules "
             "(adapter vs run, %s)", path, diff);
    cJSON_Delete(o);
    join_path(path, sizeof path, dir, "adapter_model.safetensors");
    StFile *f = st_open(path);
    load_params(m, path, find_in_file, f, SEL_ADAPTER);
    st_close(f);
}

static int write_state(const LoopState *ls, const Model *m, const char *path) {
    cJSON *o = cJSON_CreateObject();
    char buf[32];
    cJSON_AddNumberToObject(o, "step", ls->step);
    cJSON_AddNumberToObject(o, "skipped_steps", ls->skipped);
    cJSON_AddNumberToObject(o, "world_size", m->opt.comm ? m->opt.comm->world : 1);
    cJSON_AddNumberToObject(o, "zero_stage", m->opt.zero_stage);
    // ZeRO-3's optimizer shards hold each rank's piece of every unit: their layout
    // depends on the units (ParamTable.units), which changed once (the head became a unit of
    // its own); resuming checks the count.
    if (m->opt.zero_stage >= 3) cJSON_AddNumberToObject(o, "zero3_units", m->tab.nunits);
    if (ls->model_only) cJSON_AddTrueToObject(o, "save_only_model");
    if (m->lisa) {  // LISA: each layer's AdamW update count (its bias correction)
        cJSON *u = cJSON_AddArrayToObject(o, "lisa_layer_updates");
        for (int l = 0; l < m->lisa->L; l++) cJSON_AddItemToArray(u, cJSON_CreateNumber(m->lisa->updates[l]));
    }
    snprintf(buf, sizeof buf, "%" PRIu64, ls->data_epoch);
    cJSON_AddStringToObject(o, "data_epoch", buf);
    snprintf(buf, sizeof buf, "%" PRIu64, ls->data_next);
    cJSON_AddStringToObject(o, "data_next", buf);
    cJSON *r = cJSON_AddArrayToObject(o, "sample_rng");
    for (int i = 0; i < 4; i++) {
        snprintf(buf, sizeof buf, "%" PRIu64, ls->sample_rng.s[i]);
        cJSON_AddItemToArray(r, cJSON_CreateString(buf));
    }
    if (ls->run) {
        cJSON *run = cJSON_AddObjectToObject(o, "run");
        for (int i = 0; i < ls->run->n; i++) cJSON_AddStringToObject(run, ls->run->key[i], ls->run->val[i]);
    }
    return write_json(path, o);
}

static char tmp_dir[4096];  // a checkpoint being written; removed if the run fails meanwhile
static void remove_tmp_dir(void) {
    if (tmp_dir[0]) remove_tree(tmp_dir);
}

int fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    if (rc != 0 && errno == EINVAL) rc = 0;  // a file system that cannot sync directories
    int e = errno;
    close(fd);
    errno = e;
    return rc;
}

static int fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd), e = errno;
    close(fd);
    errno = e;
    return rc;
}

// Whatever wrote the files (safetensors, JSON, llm.c's model.bin), their data reaches the disk
// before the rename that makes them visible: a crash never publishes an empty checkpoint.
int fsync_dir_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    int rc = 0;
    char path[4096];
    while (rc == 0 && (e = readdir(d))) {
        struct stat st;
        join_path(path, sizeof path, dir, e->d_name);
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) rc = fsync_path(path);
    }
    int err = errno;
    closedir(d);
    errno = err;
    return rc == 0 ? fsync_dir(dir) : rc;
}

// ZeRO-1 shards its optimizer state: each rank writes (and later reads) its own flat slice.
static int sharded_opt(const Model *m) {
    return m->opt.comm && m->opt.comm->world > 1 && m->opt.zero_stage >= 1;
}

static void shard_file(const Model *m, const char *dir, char *out, size_t cap) {
    char name[64];
    snprintf(name, sizeof name, "optimizer-rank%d-of-%d.safetensors", m->opt.comm->rank, m->opt.comm->world);
    join_path(out, cap, dir, name);
}

// A rank's flat slice of one moment (StWriteItem.fill's ctx).
typedef struct {
    const Model *m;
    const float *state;  // adam_m or adam_v, wherever they live
} MomentSlice;

static size_t slice_fill(void *ctx, size_t first, size_t n, void *dst) {
    const MomentSlice *s = ctx;
    model_state_get(s->m, dst, s->state + first, n);
    return n * sizeof(float);
}

static int write_shard(const Model *m, const char *path) {
    const size_t n = m->local_n;
    MomentSlice mm = {m, m->adam_m}, vv = {m, m->adam_v};
    StWriteItem items[] = {
        {.name = "exp_avg", .ndim = 1, .shape = {(int64_t)n}, .fill = slice_fill, .ctx = &mm, .chunk = moment_piece()},
        {.name = "exp_avg_sq", .ndim = 1, .shape = {(int64_t)n}, .fill = slice_fill, .ctx = &vv, .chunk = moment_piece()}};
    return st_write(path, items, 2, NULL);
}

static void read_shard(Model *m, const char *path) {
    const size_t n = m->local_n;
    StFile *f = st_open(path);
    const char *names[] = {"exp_avg", "exp_avg_sq"};
    float *dst[] = {m->adam_m, m->adam_v};
    float *buf = xmalloc(sizeof(float) * (n ? n : 1));
    for (int k = 0; k < 2; k++) {
        const StTensor *t = st_find(f, names[k]);
        if (!t || st_numel(t) != n || strcmp(t->dtype, "F32"))
            fail("%s: tensor '%s' missing or not F32 [%zu]", path, names[k], n);
        st_to_f32(t, buf);
        model_state_put(m, dst[k], buf, n);
    }
    free(buf);
    st_close(f);
}

// ---- 8-bit AdamW's state (optim.h) -------------------------------------------------------
// One file of flat tensors in table order: the byte moments, their blocks' absmax, the small
// tensors' float moments (each present when it has elements), and the two code maps (as
// bitsandbytes' state keeps qmap1/qmap2), so that a resume restores the bytes exactly.
static const char *const ADAM8_NAMES[] = {"adam8.exp_avg", "adam8.exp_avg_sq", "adam8.exp_avg.absmax",
                                          "adam8.exp_avg_sq.absmax", "adam8.exp_avg.float", "adam8.exp_avg_sq.float",
                                          "adam8.qmap1", "adam8.qmap2"};

// The state arrays of ADAM8_NAMES' order, their element sizes and counts.
static void adam8_arrays(const Model *m, void *arr[8], size_t esize[8], size_t count[8]) {
    void *a[8] = {m->q_m, m->q_v, m->absmax_m, m->absmax_v, m->adam_m, m->adam_v, m->adam8_maps, m->adam8_maps + 256};
    const size_t n[8] = {m->adam8_n, m->adam8_n, m->adam8_blocks, m->adam8_blocks, m->adam8_small, m->adam8_small, 256, 256};
    for (int k = 0; k < 8; k++) arr[k] = a[k], esize[k] = k < 2 ? 1 : sizeof(float), count[k] = n[k];
}

static int write_adam8(const Model *m, const char *path) {
    void *arr[8];
    size_t es[8], cnt[8];
    adam8_arrays(m, arr, es, cnt);
    StWriteItem items[8];
    void *host[8] = {0};
    int n = 0, rc = 0;
    for (int k = 0; k < 8; k++) {
        if (!cnt[k]) continue;
        host[k] = xmalloc(cnt[k] * es[k]);
        model_state_copy(m, host[k], arr[k], cnt[k] * es[k], 0);
        if (es[k] == sizeof(float))
            for (size_t i = 0; i < cnt[k]; i++)
                if (!isfinite(((float *)host[k])[i])) {
                    errno = EINVAL;
                    fprintf(stderr, "error: %s: refusing to write '%s': element %zu is %g (the optimizer state went "
                            "non-finite)\n", path, ADAM8_NAMES[k], i, ((float *)host[k])[i]);
                    rc = -1;
                    goto done;
                }
        items[n++] = (StWriteItem){.name = ADAM8_NAMES[k], .ndim = 1, .shape = {(int64_t)cnt[k]},
                                   .data = es[k] == 1 ? NULL : host[k], .dtype = es[k] == 1 ? "U8" : NULL,
                                   .raw = es[k] == 1 ? host[k] : NULL, .nbytes = cnt[k] * es[k]};
    }
    rc = st_write(path, items, n, NULL);
done:
    for (int k = 0; k < 8; k++) free(host[k]);
    return rc;
}

static void read_adam8(Model *m, const char *path) {
    void *arr[8];
    size_t es[8], cnt[8];
    adam8_arrays(m, arr, es, cnt);
    StFile *f = st_open(path);
    for (int k = 0; k < 8; k++) {
        const StTensor *t = st_find(f, ADAM8_NAMES[k]);
        if (!cnt[k]) {
            if (t) fail("%s: tensor '%s' is not part of this run's optimizer state", path, ADAM8_NAMES[k]);
            continue;
        }
        if (!t || st_numel(t) != cnt[k] || strcmp(t->dtype, es[k] == 1 ? "U8" : "F32"))
            fail("%s: tensor '%s' missing or not %s [%zu] (8-bit AdamW state of this model)", path, ADAM8_NAMES[k],
                 es[k] == 1 ? "U8" : "F32", cnt[k]);
        void *buf = xmalloc(cnt[k] * es[k]);
        memcpy(buf, t->data, cnt[k] * es[k]);  // the mapping is not necessarily aligned
        if (k >= 6) {  // the code maps: this build's, or the bytes would decode differently
            float have[256];
            model_state_copy(m, have, arr[k], sizeof have, 0);
            if (memcmp(have, buf, sizeof have))
                fail("%s: tensor '%s' differs from this program's 8-bit code map: the moments would decode "
                     "differently", path, ADAM8_NAMES[k]);
        } else {
            model_state_copy(m, arr[k], buf, cnt[k] * es[k], 1);
        }
        free(buf);
    }
    st_close(f);
}

// reference_logps.bin: "LLMCREF1", the train and eval row counts (uint64), the prepared data's
// key (256 bytes, NUL-padded), then the sums as float64, train rows first; little endian.
#define REF_MAGIC "LLMCREF1"
#define REF_KEY 256
static int write_reference(const LoopState *ls, const char *path) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint64_t n[2] = {ls->nref_train, ls->nref_eval};
    char key[REF_KEY] = {0};
    snprintf(key, sizeof key, "%s", ls->ref_key ? ls->ref_key : "");
    int ok = fwrite(REF_MAGIC, 1, 8, f) == 8 && fwrite(n, sizeof n, 1, f) == 1 && fwrite(key, 1, REF_KEY, f) == REF_KEY &&
             fwrite(ls->ref_train, sizeof(double), n[0], f) == n[0] &&
             (!n[1] || fwrite(ls->ref_eval, sizeof(double), n[1], f) == n[1]);
    if (fclose(f) != 0) ok = 0;
    return ok ? 0 : -1;
}

int checkpoint_read_reference(const char *dir, const char *key, double *train, size_t ntrain, double *eval,
                              size_t neval) {
    char path[4096];
    join_path(path, sizeof path, dir, "reference_logps.bin");
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char magic[8], k[REF_KEY];
    uint64_t n[2];
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, REF_MAGIC, 8) || fread(n, sizeof n, 1, f) != 1 ||
        fread(k, 1, REF_KEY, f) != REF_KEY)
        fail("%s: not a reference_logps.bin this program writes (bad or short header)", path);
    k[REF_KEY - 1] = 0;
    if (strcmp(k, key) || n[0] != ntrain || n[1] != neval) {
        fclose(f);
        return 0;
    }
    if (fread(train, sizeof(double), ntrain, f) != ntrain || (neval && fread(eval, sizeof(double), neval, f) != neval))
        fail("%s: truncated (%llu + %llu sums expected)", path, (unsigned long long)n[0], (unsigned long long)n[1]);
    fclose(f);
    for (size_t i = 0; i < ntrain + neval; i++)
        if (!isfinite(i < ntrain ? train[i] : eval[i - ntrain]))
            fail("%s: sum %zu is not finite", path, i);
    return 1;
}

// Rank 0 writes the weights and loop state, every rank its optimizer shard (or rank 0 all of
// it), into one temporary directory that rank 0 renames when everyone is done.
void checkpoint_save(Model *m, const LoopState *ls, const char *output_dir) {
    static int hooked;
    if (!hooked) on_fail(remove_tmp_dir), hooked = 1;
    Comm *c = m->opt.comm ? m->opt.comm : comm_single();
    const int rank = c->rank;
    char final[4096], name[64], path[4096];
    snprintf(name, sizeof name, "checkpoint-%d", ls->step);
    join_path(final, sizeof final, output_dir, name);
    int owner = (int)getpid();
    c->broadcast(c, &owner, sizeof owner, 0);  // the directory is named after rank 0's pid
    snprintf(name, sizeof name, ".checkpoint-%d.tmp-%d", ls->step, owner);
    join_path(tmp_dir, sizeof tmp_dir, output_dir, name);
    if (rank == 0) {
        remove_tree(tmp_dir);
        if (mkdir_p(tmp_dir) != 0) fail("%s: cannot create checkpoint directory: %s", tmp_dir, strerror(errno));
    }
    c->barrier(c);
    model_gather_all(m);  // sharded weights: the other ranks serve rank 0's reads until model_gather_done
    int rc = 0;
    if (rank == 0) {
        // An adapter run's checkpoint holds the adapter; the frozen base stays where it came from.
        rc = m->tab.lora.r ? save_adapter(m, tmp_dir, NULL) : save_hf_model(m, tmp_dir, 0, NULL);
        join_path(path, sizeof path, tmp_dir, "trainer_state.json");
        if (rc == 0) rc = write_state(ls, m, path);
        join_path(path, sizeof path, tmp_dir, "reference_logps.bin");
        if (rc == 0 && ls->ref_train) rc = write_reference(ls, path);
    }
    if (rc == 0 && ls->model_only) {
        // save_only_model: the weights and the loop state only
    } else if (rc == 0 && sharded_opt(m)) {
        shard_file(m, tmp_dir, path, sizeof path);
        rc = write_shard(m, path);
        if (rc == 0) rc = fsync_path(path);  // each rank syncs its own shard (rank 0 the rest)
    } else if (rc == 0 && rank == 0) {
        const int moments[] = {SEL_EXP_AVG, SEL_EXP_AVG_SQ};
        join_path(path, sizeof path, tmp_dir, "optimizer.safetensors");
        rc = m->opt.adam8 ? write_adam8(m, path) : write_tensors(m, path, moments, 2, 0, NULL);
    }
    if (rc != 0) fail("%s: writing checkpoint failed: %s (earlier checkpoints are intact)", final, strerror(errno));
    model_gather_done(m);
    c->barrier(c);
    if (rank == 0) {
        if (fsync_dir_files(tmp_dir) != 0)
            fail("%s: cannot sync checkpoint to disk: %s (earlier checkpoints are intact)", final, strerror(errno));
        if (path_exists(final)) remove_tree(final);  // a rerun of the same step replaces it whole
        if (rename(tmp_dir, final) != 0) fail("%s: cannot rename checkpoint into place: %s", final, strerror(errno));
        tmp_dir[0] = 0;
        if (fsync_dir(output_dir) != 0) fail("%s: cannot sync output_dir: %s", output_dir, strerror(errno));
    }
    tmp_dir[0] = 0;
    c->barrier(c);
    if (!m->opt.comm) c->destroy(c);
}

// ---- run identity: what a checkpoint was trained with (see RunIdentity in checkpoint.h)

static void id_add(RunIdentity *id, const char *key, const char *fmt, ...) {
    if (id->n >= RUN_KEYS) fail("internal: too many run identity keys");
    snprintf(id->key[id->n], sizeof id->key[0], "%s", key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(id->val[id->n], sizeof id->val[0], fmt, ap);
    va_end(ap);
    id->n++;
}

// The shortest decimal that reads back as the same double: 0.01, not 0.010000000000000000208.
static void id_num(RunIdentity *id, const char *key, double x) {
    char buf[40];
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    id_add(id, key, "%s", buf);
}

// Hashes the file's name, size, its first `head` bytes (all of it if head is 0) and 16 blocks
// of 4 KiB spread over the rest: two models of one shape differ there, and it reads 64 KiB.
static uint64_t hash_file(uint64_t h, const char *path, const char *name, size_t head) {
    struct stat st;
    FILE *f = fopen(path, "rb");
    if (!f || fstat(fileno(f), &st) != 0) {
        if (f) fclose(f);
        return fnv1a(h, "?", 1);
    }
    uint64_t size = (uint64_t)st.st_size;
    h = fnv1a(h, name, strlen(name) + 1);
    h = fnv1a(h, &size, sizeof size);
    size_t n = head && head < size ? head : (size_t)size;
    if (n > (64u << 20)) n = 64u << 20;
    enum { BLOCKS = 16, BLOCK = 4096 };
    char *buf = xmalloc(n > BLOCK ? n : BLOCK);
    n = fread(buf, 1, n, f);
    h = fnv1a(h, buf, n);
    const uint64_t rest = size > n ? size - n : 0;
    for (int b = 0; rest && b < BLOCKS; b++) {
        uint64_t at = n + rest / BLOCKS * (uint64_t)b;
        size_t got = fseeko(f, (off_t)at, SEEK_SET) == 0 ? fread(buf, 1, BLOCK, f) : 0;
        h = fnv1a(h, buf, got);
    }
    free(buf);
    fclose(f);
    return h;
}

static int by_name(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }

// A cheap identity of a base model that survives moving or copying it but not editing or
// replacing it: a directory's config.json bytes and each safetensors file's name, size,
// header (every tensor's name, dtype, shape and offset) and sampled data; a single file's
// (llm.c's model.bin) size, 1 KiB header and sampled data.
static uint64_t model_identity(const char *path) {
    uint64_t h = 0xcbf29ce484222325ULL;
    struct stat st;
    if (stat(path, &st) != 0) return 0;
    if (!S_ISDIR(st.st_mode)) return hash_file(h, path, "", 1024);
    struct dirent **ents;
    int n = scandir(path, &ents, NULL, by_name);
    for (int i = 0; i < n; i++) {
        const char *name = ents[i]->d_name;
        size_t len = strlen(name);
        char full[4096];
        join_path(full, sizeof full, path, name);
        if (!strcmp(name, "config.json")) {
            h = hash_file(h, full, name, 0);
        } else if (len > 12 && !strcmp(name + len - 12, ".safetensors")) {
            uint64_t hdr = 0;  // little-endian header length, then the JSON header
            FILE *f = fopen(full, "rb");
            if (f && fread(&hdr, 8, 1, f) != 1) hdr = 0;
            if (f) fclose(f);
            h = hash_file(h, full, name, hdr < (64u << 20) ? 8 + (size_t)hdr : (64u << 20));
        }
        free(ents[i]);
    }
    if (n >= 0) free(ents);
    return h;
}

void run_identity(RunIdentity *id, const Config *cfg, const Model *m) {
    const ModelConfig *c = &m->cfg;
    memset(id, 0, sizeof *id);
    id_add(id, "model", "%s L=%d C=%d I=%d heads=%d/%d D=%d V=%d positions=%d%s%s rope_theta=%g eps=%g",
           c->arch == ARCH_GPT2 ? "gpt2" : c->model_type[0] ? c->model_type : "llama",
           c->num_hidden_layers, c->hidden_size, c->intermediate_size, c->num_attention_heads,
           c->num_key_value_heads, c->head_dim, c->vocab_size, c->max_position_embeddings,
           c->tie_word_embeddings ? " tied" : "", c->attention_bias ? " bias" : "", c->rope_theta,
           (double)c->rms_norm_eps);
    id_add(id, "base_model", "%s", cfg->base_model);
    if (cfg->base_model[0]) id_add(id, "base_model_id", "%016" PRIx64, model_identity(cfg->base_model));
    else id_add(id, "base_model_id", "random init");
    const LoraConfig *lc = &m->tab.lora;
    id_add(id, "adapter", "%s", lc->r ? cfg->adapter : "none");
    if (!lc->r && cfg->unfrozen_parameters[0])  // which tensors carry optimizer state
        id_add(id, "unfrozen_parameters", "%016" PRIx64,
               fnv1a(14695981039346656037ULL, cfg->unfrozen_parameters, strlen(cfg->unfrozen_parameters)));
    if (lc->r) {
        id_add(id, "load_in_4bit", "%s", cfg->load_in_4bit ? "true" : "false");
        id_add(id, "load_in_8bit", "%s", cfg->load_in_8bit ? "true" : "false");
        id_add(id, "lora_r", "%d", lc->r);
        if (lc->save_embed || lc->save_head)
            id_add(id, "modules_to_save", "%s%s", lc->save_embed ? "embed_tokens," : "", lc->save_head ? "lm_head" : "");
        id_num(id, "lora_alpha", lc->alpha);
        id_num(id, "lora_dropout", lc->dropout);
        char tm[256];
        peft_target_names(c, lc->targets, tm, sizeof tm);
        id_add(id, "lora_target_modules", "%s", tm);
        if (lc->per_layer) {  // which layers carry which projections: a LORA_* mask per layer
            char lt[sizeof id->val[0]];
            uint64_t h = 1469598103934665603ULL;  // FNV-1a of the masks, when they do not fit
            for (int l = 0; l < c->num_hidden_layers; l++) {
                if (2 * l + 3 <= (int)sizeof lt) snprintf(lt + 2 * l, 3, "%02x", lc->layer_targets[l]);
                h = fnv1a(h, &lc->layer_targets[l], 1);
            }
            if (2 * c->num_hidden_layers + 1 > (int)sizeof lt) snprintf(lt, sizeof lt, "fnv1a:%016" PRIx64, h);
            id_add(id, "lora_layer_targets", "%s", lt);
        }
        id_add(id, "use_rslora", "%s", lc->rslora ? "true" : "false");
    }
    if (cfg->lisa_n_layers)  // which layers train when (with the seed)
        id_add(id, "lisa", "%d layers every %d steps", cfg->lisa_n_layers, cfg->lisa_step_interval);
    id_add(id, "seed", "%lld", cfg->seed);
    id_add(id, "data_seed", "%lld", config_data_seed(cfg));  // the order the data was visited in
    id_add(id, "sequence_len", "%d", cfg->sequence_len);
    if (cfg->prepared_dir[0]) {  // datasets: the prepared rows' cache key (data files, tokenizer, data keys)
        const char *slash = strrchr(cfg->prepared_dir, '/');
        id_add(id, "prepared_data", "%s", slash ? slash + 1 : cfg->prepared_dir);
        id_add(id, "dataloader_drop_last", "%s", cfg->dataloader_drop_last ? "true" : "false");  // which rows an epoch serves
    }
    id_add(id, "micro_batch_size", "%d", cfg->micro_batch_size);
    id_add(id, "gradient_accumulation_steps", "%d", cfg->gradient_accumulation_steps);
    id_add(id, "shuffle", "%s", cfg->shuffle ? "true" : "false");
    id_num(id, "learning_rate", cfg->learning_rate);
    id_add(id, "lr_scheduler", "%s", cfg->lr_scheduler);
    id_num(id, "cosine_min_lr_ratio", cfg->cosine_min_lr_ratio);
    id_add(id, "warmup_steps", "%d", cfg->warmup_steps);
    id_add(id, "lr_quadratic_warmup", "%s", cfg->lr_quadratic_warmup ? "true" : "false");
    id_num(id, "weight_decay", cfg->weight_decay);
    id_num(id, "max_grad_norm", cfg->max_grad_norm);
    id_num(id, "adam_beta1", cfg->adam_beta1);
    id_num(id, "adam_beta2", cfg->adam_beta2);
    id_num(id, "adam_epsilon", cfg->adam_epsilon);
    // the moments' form: a checkpoint's optimizer file holds one or the other
    id_add(id, "optimizer_states", "%s",
           m->opt.adam8 == ADAM4_TORCHAO   ? "4-bit (torchao)"
           : m->opt.adam8 == ADAM8_TORCHAO ? "8-bit (torchao)"
           : m->opt.adam8                  ? "8-bit (bitsandbytes blockwise)"
                                           : "float32");
}

// The first key of this run that the checkpoint recorded differently stops the resume. The base
// model is compared by identity (a moved copy is the same model), reported by path. A
// checkpoint written before these checks (no "run") resumes with a note; keys it lacks are
// not compared.
static void check_run(cJSON *state, const RunIdentity *id, const char *dir) {
    if (!id) return;
    cJSON *run = cJSON_GetObjectItemCaseSensitive(state, "run");
    if (!run) {
        printf("note: %s predates resume checks (no 'run' in trainer_state.json); resuming without "
               "checking that it was trained with this configuration\n", dir);
        return;
    }
    if (!cJSON_IsObject(run)) fail("%s: key 'run' in trainer_state.json is not an object", dir);
    for (int i = 0; i < id->n; i++) {
        if (!strcmp(id->key[i], "base_model")) continue;  // compared through base_model_id
        cJSON *v = cJSON_GetObjectItemCaseSensitive(run, id->key[i]);
        if (!v) continue;
        if (!cJSON_IsString(v)) fail("%s: key 'run.%s' in trainer_state.json is not a string", dir, id->key[i]);
        if (!strcmp(v->valuestring, id->val[i])) continue;
        if (!strcmp(id->key[i], "base_model_id")) {
            cJSON *was = cJSON_GetObjectItemCaseSensitive(run, "base_model");
            const char *wp = cJSON_IsString(was) && was->valuestring[0] ? was->valuestring : "(random init)";
            const char *np = "(random init)";
            for (int j = 0; j < id->n; j++)
                if (!strcmp(id->key[j], "base_model") && id->val[j][0]) np = id->val[j];
            if (strcmp(wp, np))
                fail("%s: checkpoint was trained with base_model=%s, this run has base_model=%s", dir, wp, np);
            fail("%s: checkpoint was trained with base_model=%s (identity %s), this run has base_model=%s "
                 "(identity %s): its config.json or weights changed", dir, wp, v->valuestring, np, id->val[i]);
        }
        fail("%s: checkpoint was trained with %s=%s, this run has %s=%s", dir, id->key[i], v->valuestring,
             id->key[i], id->val[i]);
    }
}

static uint64_t json_u64(cJSON *o, const char *key, const char *path) {
    cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v)) fail("%s: key '%s' missing or not a string", path, key);
    char *end;
    uint64_t x = strtoull(v->valuestring, &end, 10);
    if (*end || !*v->valuestring) fail("%s: key '%s' is not an integer", path, key);
    return x;
}

static void load_model_checkpoint(Model *m, const char *dir);
static void load_state(LoopState *ls, const Model *m, const char *dir);

void checkpoint_load(Model *m, LoopState *ls, const char *dir) {
    char path[4096];
    load_state(ls, m, dir);  // first: a checkpoint of another run is refused before its weights load
    if (m->tab.lora.r) {
        load_adapter(m, dir);
    } else {
        load_model_checkpoint(m, dir);
    }
    if (sharded_opt(m)) {
        shard_file(m, dir, path, sizeof path);
        read_shard(m, path);
        return;
    }
    join_path(path, sizeof path, dir, "optimizer.safetensors");
    if (m->opt.adam8) {
        read_adam8(m, path);
        return;
    }
    StFile *f = st_open(path);
    load_params(m, path, find_in_file, f, SEL_EXP_AVG);
    load_params(m, path, find_in_file, f, SEL_EXP_AVG_SQ);
    st_close(f);
}

static void load_model_checkpoint(Model *m, const char *dir) {
    if (m->cfg.arch == ARCH_GPT2) {
        char path[4096];
        join_path(path, sizeof path, dir, "model.bin");
        gpt2_load(m, path);
        return;
    }
    ModelConfig saved;
    load_hf_config(dir, &saved);
    const ModelConfig *c = &m->cfg;
    if (!model_config_same_shape(&saved, c))
        fail("%s: checkpoint's model shape differs from the configured model", dir);
    if (load_hf_weights(m, dir)) fail("%s: the checkpoint has no score.weight (the reward model's head)", dir);
}

static void load_state(LoopState *ls, const Model *m, const char *dir) {
    char path[4096];
    join_path(path, sizeof path, dir, "trainer_state.json");
    cJSON *o = json_read_file(path);
    cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    if (!cJSON_IsNumber(step) || step->valueint < 0) fail("%s: key 'step' missing or invalid", path);
    ls->step = step->valueint;
    cJSON *mo = cJSON_GetObjectItemCaseSensitive(o, "save_only_model");
    if (mo && !cJSON_IsBool(mo)) fail("%s: key 'save_only_model' must be true or false", path);
    if (cJSON_IsTrue(mo))
        fail("%s: written with save_only_model: true, it holds no optimizer state and cannot be resumed; "
             "to start a new run from its weights, give the checkpoint as base_model", dir);
    cJSON *sk = cJSON_GetObjectItemCaseSensitive(o, "skipped_steps");  // absent before it existed
    if (sk && (!cJSON_IsNumber(sk) || sk->valuedouble < 0 || sk->valuedouble > ls->step ||
               sk->valuedouble != (double)sk->valueint))
        fail("%s: key 'skipped_steps' must be an integer in [0, step]", path);
    ls->skipped = sk ? sk->valueint : 0;
    cJSON *ws = cJSON_GetObjectItemCaseSensitive(o, "world_size"), *zs = cJSON_GetObjectItemCaseSensitive(o, "zero_stage");
    int world = m->opt.comm ? m->opt.comm->world : 1;
    int saved_world = cJSON_IsNumber(ws) ? ws->valueint : 1, saved_zero = cJSON_IsNumber(zs) ? zs->valueint : 0;
    // ZeRO-1 shards depend on the world size; unsharded state resumes on any number of ranks.
    if ((saved_zero >= 1 && saved_world > 1) || (m->opt.zero_stage >= 1 && world > 1))
        if (saved_world != world || saved_zero != m->opt.zero_stage)
            fail("%s: checkpoint was written by %d rank(s) with zero_stage %d; this run has %d with "
                 "zero_stage %d (resume with the same layout)", path, saved_world, saved_zero, world,
                 m->opt.zero_stage);
    if (m->opt.zero_stage >= 3 && world > 1) {
        // Written before the key existed: one unit for the embedding, norm and head, one a layer.
        cJSON *zu = cJSON_GetObjectItemCaseSensitive(o, "zero3_units");
        if (zu && (!cJSON_IsNumber(zu) || zu->valuedouble != (double)zu->valueint))
            fail("%s: key 'zero3_units' must be an integer", path);
        const int saved_units = zu ? zu->valueint : m->cfg.num_hidden_layers + 1;
        if (saved_units != m->tab.nunits)
            fail("%s: the ZeRO-3 optimizer shards were written with %d units (an older build: the embedding "
                 "and an untied head in one unit); this build has %d, so the pieces are not the same numbers; "
                 "resume with the build that wrote it, or start a new run from the checkpoint's weights "
                 "(base_model: %s)", path, saved_units, m->tab.nunits, dir);
    }
    check_run(o, ls->run, dir);
    cJSON *lu = cJSON_GetObjectItemCaseSensitive(o, "lisa_layer_updates");
    if (lu && !m->lisa)
        fail("%s: checkpoint was written by a LISA run (its layers' AdamW counts differ from the step's); resume "
             "with its lisa_n_layers and lisa_step_interval, or start a new run from its weights (base_model: %s)",
             path, dir);
    if (m->lisa && !lu)
        fail("%s: checkpoint was written without LISA; resume it without lisa_n_layers, or start a new run from "
             "its weights (base_model: %s)", path, dir);
    if (m->lisa) {
        if (!cJSON_IsArray(lu) || cJSON_GetArraySize(lu) != m->lisa->L)
            fail("%s: key 'lisa_layer_updates' must be a list of %d counts (one per layer)", path, m->lisa->L);
        for (int l = 0; l < m->lisa->L; l++) {
            cJSON *e = cJSON_GetArrayItem(lu, l);
            if (!cJSON_IsNumber(e) || e->valuedouble != (double)e->valueint || e->valueint < 0 || e->valueint > ls->step)
                fail("%s: key 'lisa_layer_updates': entry %d must be an integer in [0, step %d]", path, l, ls->step);
            m->lisa->updates[l] = e->valueint;
        }
    }
    ls->data_epoch = json_u64(o, "data_epoch", path);
    ls->data_next = json_u64(o, "data_next", path);
    cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "sample_rng");
    if (!cJSON_IsArray(r) || cJSON_GetArraySize(r) != 4) fail("%s: key 'sample_rng' invalid", path);
    for (int i = 0; i < 4; i++) {
        cJSON *e = cJSON_GetArrayItem(r, i);
        char *end;
        if (!cJSON_IsString(e)) fail("%s: key 'sample_rng' invalid", path);
        ls->sample_rng.s[i] = strtoull(e->valuestring, &end, 10);
        if (*end || !*e->valuestring) fail("%s: key 'sample_rng' invalid", path);
    }
    cJSON_Delete(o);
}

void checkpoint_find_latest(const char *output_dir, char *out, size_t cap) {
    out[0] = 0;
    DIR *d = opendir(output_dir);
    if (!d) return;
    int best = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        int n;
        char tail;
        if (sscanf(e->d_name, "checkpoint-%d%c", &n, &tail) == 1 && n > best) best = n;
    }
    closedir(d);
    if (best >= 0) {
        char name[64];
        snprintf(name, sizeof name, "checkpoint-%d", best);
        join_path(out, cap, output_dir, name);
    }
}

// Under output_dir's lock no other run writes here, so every temporary directory is a dead
// run's, even one whose pid was reused since (by an unrelated process, or by this very run).
void checkpoint_clean_debris(const char *output_dir) {
    DIR *d = opendir(output_dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int step, pid;
        char tail;
        if (sscanf(e->d_name, ".checkpoint-%d.tmp-%d%c", &step, &pid, &tail) != 2 &&
            sscanf(e->d_name, ".final.tmp-%d%c", &pid, &tail) != 1)
            continue;
        char path[4096];
        join_path(path, sizeof path, output_dir, e->d_name);
        remove_tree(path);
    }
    closedir(d);
}
