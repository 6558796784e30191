// nf4.c: see nf4.h.
#include "nf4.h"
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "json.h"
#include "util.h"

const float nf4_code[16] = {
    -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
    -0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
    0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
    0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f,
};

// bitsandbytes' tree constants (dQuantizeNF4), as a C or CUDA compiler reads these fp32
// literals: each is the float64 midpoint of neighbouring codes printed to 16-17 digits, which
// gives the fp32 nearest that midpoint except for entries 0, 8, 12 and 14, whose midpoint is
// an exact fp32 tie that the printed digits break to one side.
const float nf4_threshold[15] = {
    -0.8480964004993439f, -0.6106329262256622f, -0.4599952697753906f, -0.33967943489551544f,
    -0.23460740596055984f, -0.13791173323988914f, -0.045525018125772476f, 0.03979014977812767f,
    0.1202552504837513f, 0.2035212516784668f, 0.2920137718319893f, 0.3893125355243683f,
    0.5016634166240692f, 0.6427869200706482f, 0.8614784181118011f,
};

uint8_t nf4_encode(float s) {
    // Four comparisons down a balanced tree: first against the 7|8 threshold, then 3|4 or
    // 11|12, and so on. "s > t" is false for NaN, so NaN ends at code 0.
    int lo = 0;
    for (int half = 8; half > 0; half >>= 1)
        if (s > nf4_threshold[lo + half - 1]) lo += half;
    return (uint8_t)lo;
}

uint8_t nf4_dyn_encode(const float code[256], float s) {
    // The kernel's search: 7 halving steps over entries 0..254 from 127, keeping the nearest
    // entry seen above (hi) and below (lo); then the nearer of the landing entry and that
    // neighbour, where the midpoint itself keeps the landing entry.
    int p = 127, hi = 255, lo = 0;
    float vhi = 1.0f, vlo = -1.0f, v = code[p];
    for (int step = 64; step > 0; step >>= 1) {
        if (s > v) {
            lo = p;
            vlo = v;
            p += step;
        } else {
            hi = p;
            vhi = v;
            p -= step;
        }
        v = code[p];
    }
    if (hi == 255) vhi = code[255];
    if (lo == 0) vlo = code[0];
    if (s > v) {
        float mid = (vhi + v) * 0.5f;
        return (uint8_t)(s > mid ? hi : p);
    }
    float mid = (vlo + v) * 0.5f;
    return (uint8_t)(s < mid ? lo : p);
}

void nf4_dynamic_map(float out[256]) {
    // 7 groups i = 0..6: 2^i means of neighbours of linspace(0.1, 1, 2^i + 1) (fp32, each
    // point one rounding: torch's CPU kernel, FMA-contracted), scaled by 10^(i-6) as an fp32
    // multiply, with both signs; plus 0 and 1. Sorted ascending.
    static const double scale[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
    float v[256];
    int k = 0;
    for (int i = 0; i < 7; i++) {
        int steps = (1 << i) + 1;
        float start = 0.1f, end = 1.0f;
        float step = (end - start) / (float)(steps - 1);
        float b[65];
        for (int j = 0; j < steps; j++)
            b[j] = j < steps / 2 ? fmaf(step, (float)j, start)
                                 : fmaf(-step, (float)(steps - 1 - j), end);
        float sc = (float)scale[i];
        for (int j = 0; j + 1 < steps; j++) {
            float m = (b[j] + b[j + 1]) / 2.0f;
            v[k++] = sc * m;
            v[k++] = -sc * m;
        }
    }
    v[k++] = 0.0f;
    v[k++] = 1.0f;
    // insertion sort: 256 values, once
    for (int i = 1; i < 256; i++) {
        float x = v[i];
        int j = i - 1;
        while (j >= 0 && v[j] > x) {
            v[j + 1] = v[j];
            j--;
        }
        v[j + 1] = x;
    }
    memcpy(out, v, sizeof v);
}

static int pow2_in(int x, int lo, int hi) { return x >= lo && x <= hi && (x & (x - 1)) == 0; }

static int dtype_ok(const char *d) {
    return strcmp(d, "bfloat16") == 0 || strcmp(d, "float16") == 0 || strcmp(d, "float32") == 0;
}

// Blockwise 8-bit quantization of x[n] with the dynamic map (bitsandbytes quantize_blockwise).
static void quantize_blockwise8(const float *x, size_t n, int bs, const float code[256],
                                uint8_t *q, float *amax) {
    size_t nb = (n + (size_t)bs - 1) / (size_t)bs;
    for (size_t b = 0; b < nb; b++) {
        size_t s0 = b * (size_t)bs, len = n - s0 < (size_t)bs ? n - s0 : (size_t)bs;
        float m = 0.0f;
        for (size_t i = 0; i < len; i++) {
            float a = fabsf(x[s0 + i]);
            if (a > m) m = a;
        }
        amax[b] = m;
        float inv = 1.0f / m;
        for (size_t i = 0; i < len; i++) q[s0 + i] = nf4_dyn_encode(code, x[s0 + i] * inv);
    }
}

void nf4_quantize(Nf4Weight *q, const float *w, int ndim, const int64_t *shape, int blocksize,
                  int nested, const char *dtype, const char *name) {
    if (ndim < 1 || ndim > ST_MAX_DIMS) fail("nf4: %s: %d dimensions", name, ndim);
    if (!pow2_in(blocksize, 32, 4096))
        fail("nf4: %s: blocksize %d is not a power of two in [32, 4096]", name, blocksize);
    if (!dtype || !dtype_ok(dtype)) fail("nf4: %s: dtype '%s' is not bfloat16, float16 or float32",
                                         name, dtype ? dtype : "(null)");
    memset(q, 0, sizeof *q);
    q->ndim = ndim;
    q->n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1) fail("nf4: %s: dimension %d is %lld", name, i, (long long)shape[i]);
        q->shape[i] = shape[i];
        q->n *= (size_t)shape[i];
    }
    size_t n = q->n;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(w[i])) fail("nf4: %s: element %zu is not finite", name, i);
    snprintf(q->dtype, sizeof q->dtype, "%s", dtype);
    q->blocksize = blocksize;
    q->nblocks = (n + (size_t)blocksize - 1) / (size_t)blocksize;
    q->packed = xmalloc((n + 1) / 2);
    float *amax = xmalloc(q->nblocks * sizeof(float));
    size_t bs = (size_t)blocksize;
#pragma omp parallel for schedule(static) if (n >= (1u << 16))
    for (size_t b = 0; b < q->nblocks; b++) {
        size_t s0 = b * bs, len = n - s0 < bs ? n - s0 : bs;
        const float *x = w + s0;
        float m = 0.0f;
        for (size_t i = 0; i < len; i++) {
            float a = fabsf(x[i]);
            if (a > m) m = a;
        }
        amax[b] = m;
        float inv = 1.0f / m;  // inf for an all-zero block: 0 * inf = NaN -> code 0
        // The code is the number of thresholds below s: what nf4_encode's tree computes,
        // written without branches so that it vectorizes.
        uint8_t c[4096 + 1];
        for (size_t i = 0; i < len; i++) {
            float s = x[i] * inv;
            int k = 0;
            for (int t = 0; t < 15; t++) k += s > nf4_threshold[t];
            c[i] = (uint8_t)k;
        }
        if (len % 2) c[len] = nf4_encode(0.0f * inv);  // the zero padding past the end
        uint8_t *out = q->packed + s0 / 2;
        for (size_t i = 0; i < len; i += 2) out[i / 2] = (uint8_t)(c[i] << 4 | c[i + 1]);
    }
    if (!nested) {
        q->absmax = amax;
        return;
    }
    q->nested = 1;
    q->nested_blocksize = 256;
    q->nested_nblocks = (q->nblocks + 255) / 256;
    double sum = 0;
    for (size_t b = 0; b < q->nblocks; b++) sum += amax[b];
    q->offset = (float)(sum / (double)q->nblocks);
    for (size_t b = 0; b < q->nblocks; b++) amax[b] = amax[b] - q->offset;
    nf4_dynamic_map(q->nested_code);
    q->qabsmax = xmalloc(q->nblocks);
    q->nested_absmax = xmalloc(q->nested_nblocks * sizeof(float));
    quantize_blockwise8(amax, q->nblocks, 256, q->nested_code, q->qabsmax, q->nested_absmax);
    free(amax);
}

float nf4_block_absmax(const Nf4Weight *q, size_t b) {
    if (!q->nested) return q->absmax[b];
    float a = q->nested_code[q->qabsmax[b]] * q->nested_absmax[b / (size_t)q->nested_blocksize];
    return a + q->offset;
}

void nf4_dequantize_range(const Nf4Weight *q, size_t begin, size_t count, float *out) {
    if (begin > q->n || count > q->n - begin)
        fail("nf4: dequantize range [%zu, +%zu) is outside %zu elements", begin, count, q->n);
    size_t bs = (size_t)q->blocksize, end = begin + count;
    size_t b0 = begin / bs, b1 = (end + bs - 1) / bs;
#pragma omp parallel for schedule(static) if (count >= (1u << 16))
    for (size_t b = b0; b < b1; b++) {
        float a = nf4_block_absmax(q, b), lut[16];
        for (int k = 0; k < 16; k++) lut[k] = nf4_code[k] * a;  // the same products, once
        size_t i = b * bs < begin ? begin : b * bs;
        size_t i1 = (b + 1) * bs > end ? end : (b + 1) * bs;
        const uint8_t *p = q->packed;
        if (i < i1 && i % 2) out[i - begin] = lut[p[i / 2] & 15], i++;
        for (; i + 1 < i1; i += 2) {
            out[i - begin] = lut[p[i / 2] >> 4];
            out[i + 1 - begin] = lut[p[i / 2] & 15];
        }
        if (i < i1) out[i - begin] = lut[p[i / 2] >> 4];
    }
}

void nf4_dequantize(const Nf4Weight *q, float *out) { nf4_dequantize_range(q, 0, q->n, out); }

void nf4_free(Nf4Weight *q) {
    free(q->packed);
    free(q->absmax);
    free(q->qabsmax);
    free(q->nested_absmax);
    memset(q, 0, sizeof *q);
}

// ---------------------------------------------------------------------------------------
// Python float repr and the quant_state JSON

// Decimal digits of v > 0 with `prec` significant digits: *d = the digits as an integer,
// *e10 = the power of ten of its last digit. Returns 0 if they do not fit.
static int digits_at(double v, int prec, unsigned long long *d, int *e10) {
    char tmp[48];
    snprintf(tmp, sizeof tmp, "%.*e", prec - 1, v);
    unsigned long long x = 0;
    const char *p = tmp;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') x = x * 10 + (unsigned long long)(*p - '0');
    if (*p != 'e') return 0;
    *d = x;
    *e10 = atoi(p + 1) - (prec - 1);
    return 1;
}

static int round_trips(double v, unsigned long long d, int e10) {
    char tmp[48];
    snprintf(tmp, sizeof tmp, "%llue%d", d, e10);
    return strtod(tmp, NULL) == v;
}

int nf4_py_repr(double v, char *buf) {
    char *o = buf;
    if (isnan(v)) return sprintf(buf, "NaN");
    if (isinf(v)) return sprintf(buf, v > 0 ? "Infinity" : "-Infinity");
    if (signbit(v)) *o++ = '-', v = -v;
    if (v == 0) return (int)(o - buf) + sprintf(o, "0.0");
    // Shortest digit string that reads back as v, the closest one among those of that
    // length: the correctly rounded one, else its neighbour on the other side of v.
    unsigned long long d = 0;
    int e10 = 0;
    for (int prec = 1; prec <= 17; prec++) {
        unsigned long long c = 0;
        int e = 0;
        if (!digits_at(v, prec, &c, &e)) continue;
        if (round_trips(v, c, e)) {
            d = c, e10 = e;
            break;
        }
        char tmp[48];
        snprintf(tmp, sizeof tmp, "%llue%d", c, e);
        unsigned long long c2 = strtod(tmp, NULL) < v ? c + 1 : c - 1;
        if (c2 > 0 && round_trips(v, c2, e)) {
            d = c2, e10 = e;
            break;
        }
    }
    char ds[24];
    int nd = sprintf(ds, "%llu", d);
    int decpt = nd + e10;  // v = 0.ds * 10^decpt
    while (nd > 1 && ds[nd - 1] == '0') ds[--nd] = 0;
    if (decpt <= -4 || decpt > 16) {  // repr's switch to exponent form
        *o++ = ds[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, ds + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        int x = decpt - 1;
        o += sprintf(o, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    } else if (decpt <= 0) {
        o += sprintf(o, "0.");
        for (int i = 0; i < -decpt; i++) *o++ = '0';
        memcpy(o, ds, (size_t)nd);
        o += nd;
    } else if (decpt >= nd) {
        memcpy(o, ds, (size_t)nd);
        o += nd;
        for (int i = nd; i < decpt; i++) *o++ = '0';
        o += sprintf(o, ".0");
    } else {
        memcpy(o, ds, (size_t)decpt);
        o += decpt;
        *o++ = '.';
        memcpy(o, ds + decpt, (size_t)(nd - decpt));
        o += nd - decpt;
    }
    *o = 0;
    return (int)(o - buf);
}

char *nf4_quant_state_json(const Nf4Weight *q) {
    size_t cap = 512 + 24 * (size_t)q->ndim;
    char *s = xmalloc(cap);
    int k = snprintf(s, cap, "{\"quant_type\": \"nf4\", \"blocksize\": %d, \"dtype\": \"%s\", \"shape\": [",
                     q->blocksize, q->dtype);
    for (int i = 0; i < q->ndim; i++)
        k += snprintf(s + k, cap - (size_t)k, "%s%lld", i ? ", " : "", (long long)q->shape[i]);
    k += snprintf(s + k, cap - (size_t)k, "]");
    if (q->nested) {
        char num[32];
        nf4_py_repr((double)q->offset, num);
        k += snprintf(s + k, cap - (size_t)k,
                      ", \"nested_blocksize\": %d, \"nested_dtype\": \"float32\", \"nested_offset\": %s",
                      q->nested_blocksize, num);
    }
    snprintf(s + k, cap - (size_t)k, "}");
    return s;
}

// ---------------------------------------------------------------------------------------
// Emit / load

static void set_tensor(StTensor *t, const char *name, const char *suffix, const char *dtype,
                       int ndim, int64_t d0, int64_t d1, const void *data, size_t nbytes) {
    memset(t, 0, sizeof *t);
    size_t len = strlen(name) + strlen(suffix) + 1;
    t->name = xmalloc(len);
    snprintf(t->name, len, "%s%s", name, suffix);
    snprintf(t->dtype, sizeof t->dtype, "%s", dtype);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->data = data;
    t->nbytes = nbytes;
}

int nf4_emit(const Nf4Weight *q, const char *name, StTensor out[NF4_MAX_TENSORS]) {
    int k = 0;
    set_tensor(&out[k++], name, "", "U8", 2, (int64_t)((q->n + 1) / 2), 1, q->packed, (q->n + 1) / 2);
    if (q->nested)
        set_tensor(&out[k++], name, ".absmax", "U8", 1, (int64_t)q->nblocks, 0, q->qabsmax, q->nblocks);
    else
        set_tensor(&out[k++], name, ".absmax", "F32", 1, (int64_t)q->nblocks, 0, q->absmax,
                   q->nblocks * sizeof(float));
    set_tensor(&out[k++], name, ".quant_map", "F32", 1, 16, 0, nf4_code, sizeof nf4_code);
    if (q->nested) {
        set_tensor(&out[k++], name, ".nested_absmax", "F32", 1, (int64_t)q->nested_nblocks, 0,
                   q->nested_absmax, q->nested_nblocks * sizeof(float));
        set_tensor(&out[k++], name, ".nested_quant_map", "F32", 1, 256, 0, q->nested_code,
                   sizeof q->nested_code);
    }
    char *js = nf4_quant_state_json(q);
    size_t len = strlen(js);
    set_tensor(&out[k++], name, ".quant_state.bitsandbytes__nf4", "U8", 1, (int64_t)len, 0, js, len);
    return k;
}

void nf4_emit_free(StTensor *t, int count) {
    for (int i = 0; i < count; i++) {
        if (strstr(t[i].name, ".quant_state.bitsandbytes__")) free((void *)t[i].data);
        free(t[i].name);
        t[i].name = NULL;
        t[i].data = NULL;
    }
}

static const StTensor *find_sfx(Nf4FindFn find, void *ctx, const char *name, const char *sfx) {
    char full[1024];
    if ((size_t)snprintf(full, sizeof full, "%s%s", name, sfx) >= sizeof full)
        fail("nf4: tensor name '%s' is too long", name);
    return find(ctx, full);
}

// A required F32 tensor of exactly `count` elements, copied into out.
static void read_f32(const StTensor *t, size_t count, float *out) {
    if (strcmp(t->dtype, "F32") != 0) fail("nf4: %s: dtype %s, expected F32", t->name, t->dtype);
    if (st_numel(t) != count || t->nbytes != count * 4)
        fail("nf4: %s: %zu elements, expected %zu", t->name, st_numel(t), count);
    memcpy(out, t->data, count * 4);
}

static int json_int(const cJSON *v, long long *out) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    if (!(d >= -9007199254740992.0 && d <= 9007199254740992.0) || d != (double)(long long)d)
        return 0;
    *out = (long long)d;
    return 1;
}

int nf4_load(Nf4Weight *q, const char *name, Nf4FindFn find, void *ctx) {
    const StTensor *qs = find_sfx(find, ctx, name, ".quant_state.bitsandbytes__nf4");
    if (!qs) {
        const StTensor *fp4 = find_sfx(find, ctx, name, ".quant_state.bitsandbytes__fp4");
        if (fp4) fail("nf4: %s: quant_type fp4 is not supported (only nf4)", fp4->name);
        const StTensor *am = find_sfx(find, ctx, name, ".absmax");
        if (am) fail("nf4: %s: present but %s.quant_state.bitsandbytes__nf4 is missing", am->name, name);
        return 0;
    }
    const StTensor *w = find(ctx, name);
    const StTensor *am = find_sfx(find, ctx, name, ".absmax");
    const StTensor *qm = find_sfx(find, ctx, name, ".quant_map");
    const StTensor *nam = find_sfx(find, ctx, name, ".nested_absmax");
    const StTensor *nqm = find_sfx(find, ctx, name, ".nested_quant_map");
    if (!w) fail("nf4: %s: packed weight tensor is missing (%s has a quant_state)", name, name);
    if (!am) fail("nf4: %s.absmax: missing", name);
    if (!qm) fail("nf4: %s.quant_map: missing", name);
    if (nam && !nqm) fail("nf4: %s.nested_quant_map: missing (nested_absmax is present)", name);
    if (!nam && nqm) fail("nf4: %s.nested_absmax: missing (nested_quant_map is present)", name);
    if (strcmp(qs->dtype, "U8") != 0) fail("nf4: %s: dtype %s, expected U8", qs->name, qs->dtype);

    char why[512];
    cJSON *js = json_parse_strict((const char *)qs->data, qs->nbytes, why, sizeof why);
    if (!js) fail("nf4: %s: not a JSON object: %s", qs->name, why);
    if (!cJSON_IsObject(js)) fail("nf4: %s: not a JSON object", qs->name);
    static const char *known[] = {"quant_type", "blocksize", "dtype", "shape", "nested_blocksize",
                                  "nested_dtype", "nested_offset"};
    for (const cJSON *e = js->child; e; e = e->next) {
        int ok = 0;
        for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) ok |= strcmp(e->string, known[i]) == 0;
        if (!ok) fail("nf4: %s: unknown key '%s'", qs->name, e->string);
    }
    const cJSON *qt = cJSON_GetObjectItemCaseSensitive(js, "quant_type");
    if (!cJSON_IsString(qt)) fail("nf4: %s: quant_type missing or not a string", qs->name);
    if (strcmp(qt->valuestring, "nf4") != 0)
        fail("nf4: %s: quant_type '%s' is not supported (only nf4)", qs->name, qt->valuestring);
    long long bs;
    if (!json_int(cJSON_GetObjectItemCaseSensitive(js, "blocksize"), &bs) || bs > 4096 ||
        !pow2_in((int)bs, 32, 4096))
        fail("nf4: %s: blocksize missing or not a power of two in [32, 4096]", qs->name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(js, "dtype");
    if (!cJSON_IsString(dt) || !dtype_ok(dt->valuestring))
        fail("nf4: %s: dtype missing or not bfloat16, float16 or float32", qs->name);
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(js, "shape");
    int ndim = cJSON_IsArray(sh) ? cJSON_GetArraySize(sh) : -1;
    if (ndim < 1 || ndim > ST_MAX_DIMS)
        fail("nf4: %s: shape missing or not a list of 1..%d sizes", qs->name, ST_MAX_DIMS);

    memset(q, 0, sizeof *q);
    q->ndim = ndim;
    q->n = 1;
    int i = 0;
    for (const cJSON *e = sh->child; e; e = e->next, i++) {
        long long d;
        if (!json_int(e, &d) || d < 1 || d > (1LL << 40))
            fail("nf4: %s: shape[%d] is not a positive integer", qs->name, i);
        q->shape[i] = d;
        if (q->n > ((size_t)1 << 50) / (size_t)d) fail("nf4: %s: shape is too large", qs->name);
        q->n *= (size_t)d;
    }
    snprintf(q->dtype, sizeof q->dtype, "%s", dt->valuestring);
    q->blocksize = (int)bs;
    q->nblocks = (q->n + (size_t)bs - 1) / (size_t)bs;
    q->nested = nam != NULL;

    const cJSON *nbs = cJSON_GetObjectItemCaseSensitive(js, "nested_blocksize");
    const cJSON *ndt = cJSON_GetObjectItemCaseSensitive(js, "nested_dtype");
    const cJSON *noff = cJSON_GetObjectItemCaseSensitive(js, "nested_offset");
    if (q->nested) {
        long long v;
        if (!json_int(nbs, &v) || v > 4096 || !pow2_in((int)v, 64, 4096))
            fail("nf4: %s: nested_blocksize missing or not a power of two in [64, 4096]", qs->name);
        q->nested_blocksize = (int)v;
        if (!cJSON_IsString(ndt) || strcmp(ndt->valuestring, "float32") != 0)
            fail("nf4: %s: nested_dtype missing or not float32", qs->name);
        if (!cJSON_IsNumber(noff) || !isfinite(noff->valuedouble))
            fail("nf4: %s: nested_offset missing or not a finite number", qs->name);
        q->offset = (float)noff->valuedouble;
        q->nested_nblocks = (q->nblocks + (size_t)v - 1) / (size_t)v;
    } else if (nbs || ndt || noff) {
        fail("nf4: %s: has nested_* keys but %s.nested_absmax is missing", qs->name, name);
    }
    cJSON_Delete(js);

    size_t nbytes = (q->n + 1) / 2;
    if (st_dtype_size(w->dtype) == 0 || w->nbytes != nbytes)
        fail("nf4: %s: %zu bytes of %s, expected %zu packed bytes for shape of %zu elements",
             name, w->nbytes, w->dtype, nbytes, q->n);
    float qmap[16];
    read_f32(qm, 16, qmap);
    for (int k = 0; k < 16; k++)
        if (!(fabsf(qmap[k] - nf4_code[k]) <= 1e-6f))
            fail("nf4: %s: entry %d is %g, not the NF4 value %g", qm->name, k, qmap[k], nf4_code[k]);
    q->packed = xmalloc(nbytes);
    memcpy(q->packed, w->data, nbytes);
    if (q->nested) {
        if (strcmp(am->dtype, "U8") != 0 || am->nbytes != q->nblocks)
            fail("nf4: %s: %s with %zu elements, expected U8 with %zu (one per block of %d)",
                 am->name, am->dtype, st_numel(am), q->nblocks, q->blocksize);
        q->qabsmax = xmalloc(q->nblocks);
        memcpy(q->qabsmax, am->data, q->nblocks);
        q->nested_absmax = xmalloc(q->nested_nblocks * sizeof(float));
        read_f32(nam, q->nested_nblocks, q->nested_absmax);
        read_f32(nqm, 256, q->nested_code);
    } else {
        q->absmax = xmalloc(q->nblocks * sizeof(float));
        read_f32(am, q->nblocks, q->absmax);
    }
    return 1;
}

// ---- device layout -------------------------------------------------------------------------
static size_t align16(size_t x) { return (x + 15) & ~(size_t)15; }

size_t nf4_region_bytes(size_t n, int blocksize, int nested) {
    size_t nb = (n + (size_t)blocksize - 1) / (size_t)blocksize;
    size_t nn = nested ? (nb + 255) / 256 : 0;
    size_t bytes = sizeof(Nf4RegionHeader);
    bytes += nested ? align16(256 * sizeof(float)) + align16(nn * sizeof(float)) : align16(nb * sizeof(float));
    bytes += align16((n + 1) / 2);
    if (nested) bytes += align16(nb);
    return bytes;
}

void nf4_region_pack(const Nf4Weight *q, void *region) {
    Nf4RegionHeader h = {0};
    h.n = q->n, h.nblocks = q->nblocks, h.nested_nblocks = q->nested ? q->nested_nblocks : 0;
    h.blocksize = q->blocksize, h.nested = q->nested, h.nested_blocksize = q->nested_blocksize;
    h.offset = q->offset;
    char *p = region;
    memset(region, 0, nf4_region_bytes(q->n, q->blocksize, q->nested));
    memcpy(p, &h, sizeof h);
    p += sizeof h;
    if (q->nested) {
        memcpy(p, q->nested_code, 256 * sizeof(float));
        p += align16(256 * sizeof(float));
        memcpy(p, q->nested_absmax, q->nested_nblocks * sizeof(float));
        p += align16(q->nested_nblocks * sizeof(float));
    } else {
        memcpy(p, q->absmax, q->nblocks * sizeof(float));
        p += align16(q->nblocks * sizeof(float));
    }
    memcpy(p, q->packed, (q->n + 1) / 2);
    p += align16((q->n + 1) / 2);
    if (q->nested) memcpy(p, q->qabsmax, q->nblocks);
}

void nf4_region_dequantize(const void *region, float *out) {
    Nf4RegionHeader h;
    memcpy(&h, region, sizeof h);
    const char *p = (const char *)region + sizeof h;
    const float *map = NULL, *absf = NULL, *nabs = NULL;
    if (h.nested) {
        map = (const float *)p;
        p += align16(256 * sizeof(float));
        nabs = (const float *)p;
        p += align16(h.nested_nblocks * sizeof(float));
    } else {
        absf = (const float *)p;
        p += align16(h.nblocks * sizeof(float));
    }
    const uint8_t *packed = (const uint8_t *)p;
    const uint8_t *qabs = h.nested ? packed + align16((h.n + 1) / 2) : NULL;
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < h.nblocks; b++) {
        // Same order as bitsandbytes: absmax' = map[q] * nested_absmax + offset, then code * it.
        float am = h.nested ? map[qabs[b]] * nabs[b / (size_t)h.nested_blocksize] + h.offset : absf[b];
        size_t i0 = b * (size_t)h.blocksize, i1 = i0 + (size_t)h.blocksize < h.n ? i0 + (size_t)h.blocksize : h.n;
        for (size_t i = i0; i < i1; i++) {
            uint8_t byte = packed[i / 2];
            out[i] = nf4_code[i % 2 ? byte & 15 : byte >> 4] * am;
        }
    }
}
