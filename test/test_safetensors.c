// test_safetensors.c: safetensors reader/writer, model directories and config.json.
// Error paths exit through fail(), so each runs in a forked child whose stderr is captured.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "family.h"
#include "hf.h"
#include "safetensors.h"
#include "util.h"

static int n_pass, n_fail;
static char tmp[256];
static int in_child;

// fail() exits without freeing, by design; LeakSanitizer (when linked) would report that in
// every error-path child, so it stays on only in the parent.
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) { return in_child; }

static void check(const char *name, int ok, const char *fmt, ...) {
    if (ok) {
        printf("PASS %s\n", name);
        n_pass++;
        return;
    }
    printf("FAIL %s: ", name);
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    n_fail++;
}

static const char *tpath(const char *name) {
    static char buf[8][512];
    static int k;
    char *p = buf[k++ % 8];
    join_path(p, 512, tmp, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(2);
    }
}

static void write_text(const char *path, const char *s) { write_bytes(path, s, strlen(s)); }

// A safetensors file from a literal header and raw data; header_len overrides when nonzero.
static void write_raw(const char *path, const char *header, const void *data, size_t dlen,
                      uint64_t header_len) {
    size_t h = strlen(header);
    uint64_t n = header_len ? header_len : h;
    unsigned char *buf = xmalloc(8 + h + dlen);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(n >> (8 * i));
    memcpy(buf + 8, header, h);
    if (dlen) memcpy(buf + 8 + h, data, dlen);
    write_bytes(path, buf, 8 + h + dlen);
    free(buf);
}

static int bits_equal(const float *a, const float *b, size_t n) {
    return n == 0 || memcmp(a, b, n * sizeof(float)) == 0;
}

// ---------------------------------------------------------------------------------------
// Children for the error paths

typedef void (*child_fn)(const char *arg);

static void do_st_open(const char *arg) { st_close(st_open(arg)); }
static void do_model_dir(const char *arg) { st_model_close(st_open_model_dir(arg)); }
static void do_hf_read(const char *arg) {
    ModelConfig c;
    hf_read_config(arg, &c);
}
static void do_to_f32(const char *arg) {
    StFile *f = st_open(arg);
    float out[16];
    st_to_f32(st_find(f, "ints"), out);
    st_close(f);
}

// Runs fn(arg) in a child; passes if it exits 1 after one "error: " line containing every
// needle (NULL-terminated).
static void expect_fail(const char *name, child_fn fn, const char *arg, ...) {
    int fds[2];
    if (pipe(fds) != 0) { perror("pipe"); exit(2); }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); exit(2); }
    if (pid == 0) {
        in_child = 1;
        close(fds[0]);
        dup2(fds[1], 2);
        close(fds[1]);
        fn(arg);
        _exit(0);
    }
    close(fds[1]);
    char msg[4096];
    size_t len = 0;
    ssize_t r;
    while ((r = read(fds[0], msg + len, sizeof msg - 1 - len)) > 0) len += (size_t)r;
    close(fds[0]);
    msg[len] = 0;
    int status;
    waitpid(pid, &status, 0);
    if (len && msg[len - 1] == '\n') msg[len - 1] = 0;  // for printing
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 1) {
        check(name, 0, "child did not exit 1 (status 0x%x), stderr: %s", status, msg);
        return;
    }
    if (strncmp(msg, "error: ", 7) != 0 || strchr(msg, '\n')) {
        check(name, 0, "expected one 'error: ' line, got: %s", msg);
        return;
    }
    va_list ap;
    va_start(ap, arg);
    const char *needle;
    while ((needle = va_arg(ap, const char *))) {
        if (!strstr(msg, needle)) {
            check(name, 0, "message lacks '%s': %s", needle, msg);
            va_end(ap);
            return;
        }
    }
    va_end(ap);
    check(name, 1, "");
    if (getenv("TEST_VERBOSE")) printf("     %s\n", msg);
}

// ---------------------------------------------------------------------------------------

static void test_write_roundtrip(void) {
    float a[6] = {1.5f, -0.0f, 3.0e-42f /* subnormal */, INFINITY, -1234.5678f, NAN};
    float s[1] = {42.0f};
    float big[1000];
    Rng rng;
    rng_seed(&rng, 7);
    for (int i = 0; i < 1000; i++) big[i] = rng_normal(&rng);
    StWriteItem items[] = {
        {"model.a", a, 2, {2, 3}},
        {"scalar", s, 0, {0}},
        {"empty", NULL, 2, {0, 4}},
        {"we\"ird\\name\n", big, 3, {10, 10, 10}},
    };
    const char *meta[] = {"format", "pt", "step", "12", NULL};
    const char *path = tpath("w.safetensors");
    int rc = st_write(path, items, 4, meta);
    check("st_write returns 0", rc == 0, "rc %d errno %s", rc, strerror(errno));
    if (rc) return;

    size_t flen;
    unsigned char *raw = (unsigned char *)read_file(path, &flen);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | raw[i];
    check("header padded to 8 bytes", hlen % 8 == 0 && raw[8 + hlen - 1] != 0,
          "header length %llu", (unsigned long long)hlen);
    check("data contiguous after header", flen == 8 + hlen + (6 + 1 + 1000) * 4,
          "file %zu bytes, header %llu", flen, (unsigned long long)hlen);
    free(raw);

    StFile *f = st_open(path);
    check("count", st_count(f) == 4, "got %d", st_count(f));
    int order = 1;
    for (int i = 0; i < 4 && order; i++)
        order = st_tensor(f, i) && strcmp(st_tensor(f, i)->name, items[i].name) == 0;
    check("header order kept", order, "order differs");
    check("metadata", st_metadata(f, "format") && strcmp(st_metadata(f, "format"), "pt") == 0 &&
                          st_metadata(f, "step") && strcmp(st_metadata(f, "step"), "12") == 0 &&
                          !st_metadata(f, "nope"),
          "metadata mismatch");
    check("st_find absent is NULL", st_find(f, "missing") == NULL, "found something");
    for (int i = 0; i < 4; i++) {
        const StTensor *t = st_find(f, items[i].name);
        char nm[96];
        snprintf(nm, sizeof nm, "round trip tensor %d", i);
        if (!t) { check(nm, 0, "not found"); continue; }
        int ok = strcmp(t->dtype, "F32") == 0 && t->ndim == items[i].ndim;
        for (int d = 0; ok && d < t->ndim; d++) ok = t->shape[d] == items[i].shape[d];
        size_t n = st_numel(t);
        ok = ok && t->nbytes == n * 4;
        float *out = xmalloc(n * sizeof(float) + 1);
        st_to_f32(t, out);
        ok = ok && bits_equal(out, items[i].data, n);
        free(out);
        check(nm, ok, "dtype %s ndim %d numel %zu", t->dtype, t->ndim, n);
    }
    st_close(f);
}

static float ref_half(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 31) v = m ? NAN : INFINITY;
    else if (e == 0) v = ldexpf((float)m, -24);
    else v = ldexpf(1.0f + (float)m / 1024.0f, e - 15);
    return sign ? -v : v;
}

static void test_half_bf16(void) {
    // F16 and BF16 tensors, plus an F32 tensor at an unaligned offset.
    uint16_t h[6] = {0x0001, 0x03ff, 0x3c00, 0xc100, 0x7c00, 0x8000};
    uint16_t b[4] = {0x3f80, 0xc020, 0x7f80, 0x0001};
    float f32v = -2.5f;
    unsigned char data[12 + 8 + 4];
    memcpy(data, h, 12);
    memcpy(data + 12, b, 8);
    memcpy(data + 20, &f32v, 4);
    const char *hdr = "{\"h\":{\"dtype\":\"F16\",\"shape\":[6],\"data_offsets\":[0,12]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[12,20]},"
                      "\"f\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[20,24]}} ";
    const char *path = tpath("half.safetensors");
    write_raw(path, hdr, data, sizeof data, 0);
    StFile *f = st_open(path);
    float out[6];
    st_to_f32(st_find(f, "h"), out);
    float want_h[6] = {ldexpf(1, -24), ldexpf(1023, -24), 1.0f, -2.5f, INFINITY, -0.0f};
    check("F16 subnormal/1/-2.5/inf/-0", bits_equal(out, want_h, 6),
          "got %g %g %g %g %g %g", out[0], out[1], out[2], out[3], out[4], out[5]);
    st_to_f32(st_find(f, "b"), out);
    float want_b[4] = {1.0f, -2.5f, INFINITY, ldexpf(1, -133)};
    check("BF16 1/-2.5/inf/subnormal", bits_equal(out, want_b, 4), "got %g %g %g %g", out[0],
          out[1], out[2], out[3]);
    st_to_f32(st_find(f, "f"), out);
    check("F32 scalar at unaligned offset", out[0] == -2.5f, "got %g", out[0]);
    st_close(f);

    // Every half bit pattern against an arithmetic reference.
    uint16_t *all = xmalloc(65536 * 2);
    for (int i = 0; i < 65536; i++) all[i] = (uint16_t)i;
    write_raw(path, "{\"all\":{\"dtype\":\"F16\",\"shape\":[65536],\"data_offsets\":[0,131072]}}",
              all, 131072, 0);
    f = st_open(path);
    float *conv = xmalloc(65536 * sizeof(float));
    st_to_f32(st_find(f, "all"), conv);
    int bad = -1;
    for (int i = 0; i < 65536 && bad < 0; i++) {
        float r = ref_half((uint16_t)i);
        int same = isnan(r) ? isnan(conv[i]) : memcmp(&r, &conv[i], 4) == 0;
        if (!same) bad = i;
    }
    check("F16 all 65536 patterns exact", bad < 0, "0x%04x -> %g, want %g", bad,
          bad >= 0 ? conv[bad] : 0, bad >= 0 ? ref_half((uint16_t)bad) : 0);
    free(conv);
    free(all);
    st_close(f);
}

static void test_model_dirs(void) {
    float x[4] = {1, 2, 3, 4}, y[2] = {5, 6}, z[3] = {7, 8, 9};
    const char *dir = tpath("sharded");
    mkdir_p(dir);
    char p1[512], p2[512], idx[512];
    join_path(p1, sizeof p1, dir, "model-00001-of-00002.safetensors");
    join_path(p2, sizeof p2, dir, "model-00002-of-00002.safetensors");
    join_path(idx, sizeof idx, dir, "model.safetensors.index.json");
    StWriteItem s1[] = {{"x", x, 1, {4}}, {"y", y, 2, {1, 2}}};
    StWriteItem s2[] = {{"z", z, 1, {3}}};
    int ok = st_write(p1, s1, 2, NULL) == 0 && st_write(p2, s2, 1, NULL) == 0;
    write_text(idx, "{\"metadata\":{\"total_size\":36},\"weight_map\":{"
                    "\"x\":\"model-00001-of-00002.safetensors\","
                    "\"z\":\"model-00002-of-00002.safetensors\","
                    "\"y\":\"model-00001-of-00002.safetensors\"}}");
    StModel *m = st_open_model_dir(dir);
    const StTensor *tx = st_model_find(m, "x"), *tz = st_model_find(m, "z");
    float out[4];
    ok = ok && st_model_count(m) == 3 && tx && tz && st_model_find(m, "y") &&
         !st_model_find(m, "w");
    if (ok) { st_to_f32(tz, out); ok = bits_equal(out, z, 3); }
    if (ok) { st_to_f32(tx, out); ok = bits_equal(out, x, 4); }
    ok = ok && strcmp(st_model_tensor(m, 0)->name, "x") == 0 &&
         strcmp(st_model_tensor(m, 2)->name, "z") == 0 && !st_model_tensor(m, 3);
    check("sharded index dir", ok, "lookup or data mismatch");
    st_model_close(m);

    const char *single = tpath("single");
    mkdir_p(single);
    char sp[512];
    join_path(sp, sizeof sp, single, "model.safetensors");
    ok = st_write(sp, s2, 1, NULL) == 0;
    m = st_open_model_dir(single);
    check("single-file dir", ok && st_model_count(m) == 1 && st_model_find(m, "z"),
          "lookup failed");
    st_model_close(m);
}

#define SAME(field) ok = ok && a->field == b->field
static int config_equal(const ModelConfig *a, const ModelConfig *b) {
    int ok = strcmp(a->model_type, b->model_type) == 0;
    SAME(vocab_size); SAME(hidden_size); SAME(intermediate_size); SAME(num_hidden_layers);
    SAME(num_attention_heads); SAME(num_key_value_heads); SAME(head_dim);
    SAME(max_position_embeddings); SAME(rms_norm_eps); SAME(rope_theta); SAME(rope_type);
    SAME(tie_word_embeddings); SAME(attention_bias); SAME(bos_token_id); SAME(eos_token_id);
    SAME(sliding_window); SAME(use_sliding_window); SAME(max_window_layers);
    SAME(eos_is_list);
    if (a->eos_is_list) {  // a list eos_token_id comes back whole
        SAME(n_eos);
        for (int i = 0; i < a->n_eos && i < 16; i++) SAME(eos_ids[i]);
    }
    if (a->rope_type == ROPE_LLAMA3) {
        SAME(rope_factor); SAME(rope_low_freq_factor); SAME(rope_high_freq_factor);
        SAME(rope_original_max_position_embeddings);
    }
    return ok;
}
#undef SAME

static void test_config(void) {
    ModelConfig a, b;
    memset(&a, 0, sizeof a);
    strcpy(a.model_type, "llama");
    a.vocab_size = 128256; a.hidden_size = 2048; a.intermediate_size = 8192;
    a.num_hidden_layers = 16; a.num_attention_heads = 32; a.num_key_value_heads = 8;
    a.head_dim = 64; a.max_position_embeddings = 131072; a.rms_norm_eps = 1e-5f;
    a.rope_theta = 500000.0; a.rope_type = ROPE_LLAMA3; a.rope_factor = 32.0;
    a.rope_low_freq_factor = 1.0; a.rope_high_freq_factor = 4.0;
    a.rope_original_max_position_embeddings = 8192; a.tie_word_embeddings = 1;
    a.bos_token_id = 128000; a.eos_token_id = 128001;
    const char *path = tpath("config.json");
    int rc = hf_write_config(path, &a, NULL);
    hf_read_config(path, &b);
    check("config round trip (llama3 rope_scaling)", rc == 0 && config_equal(&a, &b),
          "rc %d, fields differ", rc);
    char *text = read_file(path, NULL);
    check("config text", text && strstr(text, "\"LlamaForCausalLM\"") &&
                             strstr(text, "1e-05") && strstr(text, "\"silu\"") &&
                             strstr(text, "500000.0") && strstr(text, "32.0") &&
                             strstr(text, "\"float32\""),
          "%s", text ? text : "(unreadable)");
    free(text);

    memset(&a, 0, sizeof a);
    strcpy(a.model_type, "qwen2");
    a.vocab_size = 151936; a.hidden_size = 896; a.intermediate_size = 4864;
    a.num_hidden_layers = 24; a.num_attention_heads = 14; a.num_key_value_heads = 2;
    a.head_dim = 64; a.max_position_embeddings = 32768; a.rms_norm_eps = 1e-6f;
    a.rope_theta = 1000000.0; a.rope_type = ROPE_DEFAULT; a.tie_word_embeddings = 1;
    a.attention_bias = 1; a.bos_token_id = -1; a.eos_token_id = 151643;
    rc = hf_write_config(path, &a, NULL);
    hf_read_config(path, &b);
    text = read_file(path, NULL);
    check("config round trip (qwen2, no bos)",
          rc == 0 && config_equal(&a, &b) && text && strstr(text, "Qwen2ForCausalLM") &&
              !strstr(text, "bos_token_id") && strstr(text, "\"rope_scaling\":\tnull"),
          "rc %d, fields differ: %s", rc, text ? text : "");
    free(text);

    // HF defaults, qwen2 bias without the key, eos as a list, null head_dim.
    write_text(path, "{\"model_type\":\"qwen2\",\"vocab_size\":100,\"hidden_size\":64,"
                     "\"intermediate_size\":128,\"num_hidden_layers\":2,"
                     "\"num_attention_heads\":4,\"head_dim\":null,\"eos_token_id\":[7,8]}");
    hf_read_config(path, &b);
    check("config defaults",
          b.attention_bias == 1 && b.num_key_value_heads == 4 && b.head_dim == 16 &&
              b.rms_norm_eps == 1e-6f && b.rope_theta == 10000.0 &&
              b.rope_type == ROPE_DEFAULT && b.tie_word_embeddings == 0 &&
              b.max_position_embeddings == 2048 && b.bos_token_id == -1 &&
              b.eos_token_id == 7,
          "bias %d kv %d hd %d eps %g theta %g eos %d", b.attention_bias, b.num_key_value_heads,
          b.head_dim, b.rms_norm_eps, b.rope_theta, b.eos_token_id);

    write_text(path, "{\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
                     "\"num_hidden_layers\":2,\"num_attention_heads\":4}");
    hf_read_config(path, &b);
    check("config llama no bias by default",
          strcmp(b.model_type, "llama") == 0 && b.attention_bias == 0, "type %s bias %d",
          b.model_type, b.attention_bias);

    // rope_parameters (newer layout) wins over rope_theta/rope_scaling.
    write_text(path,
               "{\"model_type\":\"llama\",\"vocab_size\":100,\"hidden_size\":64,"
               "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
               "\"rope_theta\":10000,\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2},"
               "\"rope_parameters\":{\"rope_type\":\"llama3\",\"rope_theta\":500000.0,"
               "\"factor\":8.0,\"low_freq_factor\":1.0,\"high_freq_factor\":4.0,"
               "\"original_max_position_embeddings\":8192}}");
    hf_read_config(path, &b);
    check("config rope_parameters layout",
          b.rope_type == ROPE_LLAMA3 && b.rope_theta == 500000.0 && b.rope_factor == 8.0 &&
              b.rope_low_freq_factor == 1.0 && b.rope_high_freq_factor == 4.0 &&
              b.rope_original_max_position_embeddings == 8192,
          "type %d theta %g factor %g", b.rope_type, b.rope_theta, b.rope_factor);

    write_text(path,
               "{\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
               "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"rope_theta\":20000,"
               "\"rope_scaling\":{\"type\":\"llama3\",\"factor\":8.0,\"low_freq_factor\":1.0,"
               "\"high_freq_factor\":4.0,\"original_max_position_embeddings\":8192}}");
    hf_read_config(path, &b);
    check("config legacy rope_scaling 'type'",
          b.rope_type == ROPE_LLAMA3 && b.rope_theta == 20000.0 && b.rope_factor == 8.0,
          "type %d theta %g", b.rope_type, b.rope_theta);

    // Mistral's window is read and written back; Qwen2's only counts with use_sliding_window.
    write_text(path, "{\"model_type\":\"mistral\",\"vocab_size\":100,\"hidden_size\":64,"
                     "\"intermediate_size\":128,\"num_hidden_layers\":2,"
                     "\"num_attention_heads\":4,\"sliding_window\":4096}");
    hf_read_config(path, &b);
    a = b;
    rc = hf_write_config(path, &a, NULL);
    hf_read_config(path, &b);
    text = read_file(path, NULL);
    check("config mistral sliding_window round trip",
          a.sliding_window == 4096 && rc == 0 && config_equal(&a, &b) && text &&
              strstr(text, "\"sliding_window\":\t4096"),
          "window %d -> %d: %s", a.sliding_window, b.sliding_window, text ? text : "");
    free(text);
    write_text(path, "{\"model_type\":\"qwen2\",\"vocab_size\":100,\"hidden_size\":64,"
                     "\"intermediate_size\":128,\"num_hidden_layers\":2,"
                     "\"num_attention_heads\":4,\"sliding_window\":4096,\"use_sliding_window\":false}");
    hf_read_config(path, &b);
    check("config qwen2 window off without use_sliding_window",
          b.sliding_window == 4096 && !b.use_sliding_window && family_layer_window(&b, 0) == 0 &&
              family_layer_window(&b, 1) == 0,
          "window %d use %d layer windows %d %d", b.sliding_window, b.use_sliding_window,
          family_layer_window(&b, 0), family_layer_window(&b, 1));
    // With use_sliding_window, layers from max_window_layers on slide (transformers' layer_types).
    write_text(path, "{\"model_type\":\"qwen2\",\"vocab_size\":100,\"hidden_size\":64,"
                     "\"intermediate_size\":128,\"num_hidden_layers\":3,\"num_attention_heads\":4,"
                     "\"sliding_window\":16,\"use_sliding_window\":true,\"max_window_layers\":1,"
                     "\"eos_token_id\":[7,9]}");
    hf_read_config(path, &b);
    a = b;
    rc = hf_write_config(path, &a, NULL);
    hf_read_config(path, &b);
    text = read_file(path, NULL);
    check("config qwen2 max_window_layers and eos list round trip",
          family_layer_window(&a, 0) == 0 && family_layer_window(&a, 1) == 16 &&
              family_layer_window(&a, 2) == 16 && a.n_eos == 2 && a.eos_token_id == 7 && rc == 0 &&
              config_equal(&a, &b) && text && strstr(text, "Qwen2ForCausalLM") &&
              strstr(text, "\"max_window_layers\":\t1"),
          "windows %d %d %d eos %d: %s", family_layer_window(&a, 0), family_layer_window(&a, 1),
          family_layer_window(&a, 2), a.n_eos, text ? text : "");
    free(text);

    rc = hf_write_config(tpath("no/such/dir/config.json"), &a, NULL);
    check("hf_write_config I/O error returns -1", rc == -1 && errno == ENOENT, "rc %d errno %d",
          rc, errno);
}

// Items made as they are written (StWriteItem.fill): the source and the pieces asked for.
typedef struct {
    const float *src;
    int calls, bad_bytes;
    size_t next, most;  // where the next piece must start; the largest piece asked for
} FillSrc;

static size_t fill_from(void *ctx, size_t first, size_t n, void *dst) {
    FillSrc *s = ctx;
    s->calls++;
    if (first != s->next) s->next = (size_t)-1;  // out of order: the check below fails
    else s->next = first + n;
    if (n > s->most) s->most = n;
    memcpy(dst, s->src + first, n * sizeof(float));
    return n * sizeof(float) - (s->bad_bytes ? 1 : 0);
}

// A filled BF16 item: its floats narrowed in place (as the checkpoint writer does).
static size_t fill_bf16(void *ctx, size_t first, size_t n, void *dst) {
    const float *src = ((FillSrc *)ctx)->src + first;
    uint16_t *h = dst;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], 4);
        h[i] = (uint16_t)(u >> 16);  // the values below are exact in bf16
    }
    return n * 2;
}

static void test_write_filled(void) {
    float big[1000], small[3] = {1, 2, 3}, half[6] = {0.5f, -2.0f, 384.0f, 0.0f, -0.125f, 7.0f};
    Rng rng;
    rng_seed(&rng, 11);
    for (int i = 0; i < 1000; i++) big[i] = rng_normal(&rng);
    // big in pieces of 7 (1000 is not a multiple), small whole, half as BF16; a plain item
    // between them: the file must be what the same tensors written from memory give.
    FillSrc fb = {big}, fs = {small}, fh = {half};
    StWriteItem filled[] = {
        {.name = "big", .ndim = 2, .shape = {10, 100}, .fill = fill_from, .ctx = &fb, .chunk = 7},
        {.name = "plain", .data = small, .ndim = 1, .shape = {3}},
        {.name = "small", .ndim = 1, .shape = {3}, .fill = fill_from, .ctx = &fs},
        {.name = "half", .ndim = 2, .shape = {2, 3}, .dtype = "BF16", .nbytes = 12, .fill = fill_bf16, .ctx = &fh},
    };
    uint16_t hb[6];
    for (int i = 0; i < 6; i++) {
        uint32_t u;
        memcpy(&u, &half[i], 4);
        hb[i] = (uint16_t)(u >> 16);
    }
    StWriteItem plain[] = {
        {"big", big, 2, {10, 100}},
        {"plain", small, 1, {3}},
        {"small", small, 1, {3}},
        {.name = "half", .ndim = 2, .shape = {2, 3}, .dtype = "BF16", .raw = hb, .nbytes = 12},
    };
    const char *p1 = tpath("filled.safetensors"), *p2 = tpath("plain.safetensors");
    int rc = st_write(p1, filled, 4, NULL), rc2 = st_write(p2, plain, 4, NULL);
    check("st_write of filled items returns 0", rc == 0 && rc2 == 0, "rc %d %d errno %s", rc, rc2, strerror(errno));
    if (rc || rc2) return;
    size_t l1, l2;
    char *a = read_file(p1, &l1), *b = read_file(p2, &l2);
    check("filled items: the file the same tensors from memory give", l1 == l2 && !memcmp(a, b, l1),
          "%zu against %zu bytes", l1, l2);
    free(a), free(b);
    check("filled in order, in pieces of at most 7", fb.calls == 143 && fb.next == 1000 && fb.most == 7,
          "%d calls, ended at %zu, largest %zu", fb.calls, fb.next, fb.most);
    check("filled whole when chunk is 0", fs.calls == 1 && fs.most == 3, "%d calls, largest %zu", fs.calls, fs.most);

    // A fill that puts fewer bytes than its header promised: an error, and no file left.
    FillSrc short_src = {big, .bad_bytes = 1};
    StWriteItem shortf[] = {{.name = "x", .ndim = 1, .shape = {20}, .fill = fill_from, .ctx = &short_src, .chunk = 8}};
    const char *p3 = tpath("short.safetensors");
    errno = 0;
    rc = st_write(p3, shortf, 1, NULL);
    const int e = errno;
    check("a fill short of its header: EIO, the file removed", rc == -1 && e == EIO && !path_exists(p3),
          "rc %d errno %d exists %d", rc, e, path_exists(p3));
}

static void test_write_errors(void) {
    float x[2] = {1, 2};
    StWriteItem it[] = {{"x", x, 1, {2}}};
    errno = 0;
    int rc = st_write("/dev/full", it, 1, NULL);
    int e = errno;
    check("st_write ENOSPC", rc == -1 && e == ENOSPC, "rc %d errno %s", rc, strerror(e));
    check("st_write leaves a device alone", path_exists("/dev/full"), "/dev/full is gone");

    errno = 0;
    rc = st_write(tpath("missing/dir/x.safetensors"), it, 1, NULL);
    check("st_write bad dir", rc == -1 && errno == ENOENT, "rc %d errno %d", rc, errno);

    StWriteItem bad[] = {{"x", x, 5, {1, 1, 1, 1}}};
    errno = 0;
    rc = st_write(tpath("bad.safetensors"), bad, 1, NULL);
    check("st_write EINVAL on bad item", rc == -1 && errno == EINVAL, "rc %d errno %d", rc,
          errno);
    StWriteItem dup[] = {{"x", x, 1, {2}}, {"x", x, 1, {2}}};
    rc = st_write(tpath("dup.safetensors"), dup, 2, NULL);
    check("st_write EINVAL on duplicate name", rc == -1 && errno == EINVAL, "rc %d", rc);

    // A file-size limit makes write() fail with EFBIG midway; the partial file must go.
    const char *path = tpath("big.safetensors");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {4096, 4096};
        setrlimit(RLIMIT_FSIZE, &rl);
        float *big = calloc(100000, sizeof(float));
        StWriteItem b1[] = {{"big", big, 1, {100000}}};
        int r = st_write(path, b1, 1, NULL);
        _exit(r == -1 && errno == EFBIG && !path_exists(path) ? 0 : 1);
    }
    int status;
    waitpid(pid, &status, 0);
    check("st_write EFBIG removes partial file", WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "status 0x%x", status);
}

static void test_errors(void) {
    static char paths[32][512];
    int k = 0;
#define NEWPATH() (snprintf(paths[k], 512, "%s/e%d.safetensors", tmp, k), paths[k++])
    unsigned char zeros[64] = {0};

    expect_fail("err missing file", do_st_open, tpath("nope.safetensors"), "nope.safetensors",
                "cannot open", NULL);

    const char *q = NEWPATH();
    write_bytes(q, "abc", 3);
    expect_fail("err short file", do_st_open, q, q, "too short", NULL);

    q = NEWPATH();
    write_raw(q, "{}", NULL, 0, 1000);
    expect_fail("err header length > file", do_st_open, q, q, "header length 1000", NULL);

    q = NEWPATH();
    write_raw(q, "{\"a\": [1,", NULL, 0, 0);
    expect_fail("err header not JSON", do_st_open, q, q, "not valid JSON", NULL);

    q = NEWPATH();
    write_raw(q, "[1, 2]  ", NULL, 0, 0);
    expect_fail("err header not object", do_st_open, q, q, "not a JSON object", NULL);

    q = NEWPATH();
    write_raw(q, "{} xyz", NULL, 0, 0);
    expect_fail("err header trailing data", do_st_open, q, q, "trailing", NULL);

    q = NEWPATH();
    write_raw(q, "{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", zeros, 8, 0);
    expect_fail("err missing dtype", do_st_open, q, q, "'w'", "dtype", NULL);

    q = NEWPATH();
    write_raw(q, "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", zeros, 8, 0);
    expect_fail("err missing shape", do_st_open, q, q, "'w'", "shape", NULL);

    q = NEWPATH();
    write_raw(q, "{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", zeros, 8, 0);
    expect_fail("err missing data_offsets", do_st_open, q, q, "'w'", "data_offsets", NULL);

    q = NEWPATH();
    write_raw(q, "{\"w\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", zeros, 8, 0);
    expect_fail("err unknown dtype", do_st_open, q, q, "'w'", "F33", NULL);

    q = NEWPATH();
    write_raw(q, "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,99]}}", zeros, 64, 0);
    expect_fail("err offsets exceed data", do_st_open, q, q,
                "tensor 'x' data_offsets [0, 99] exceed the file's data (64 bytes)", NULL);

    q = NEWPATH();
    write_raw(q, "{\"x\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", zeros, 64, 0);
    expect_fail("err begin > end", do_st_open, q, q, "'x'", "[8, 0]", NULL);

    q = NEWPATH();
    write_raw(q, "{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", zeros, 8, 0);
    expect_fail("err byte count mismatch", do_st_open, q, q, "'x'", "8 data bytes", "12", NULL);

    q = NEWPATH();
    write_raw(q, "{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", zeros, 8, 0);
    expect_fail("err negative dim", do_st_open, q, q, "'x'", "shape[0]", NULL);

    q = NEWPATH();
    write_raw(q, "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", zeros, 8, 0);
    expect_fail("err duplicate tensor", do_st_open, q, q, "'x'", "twice", NULL);

    q = NEWPATH();
    write_raw(q, "{\"__metadata__\":{\"a\":1}}", NULL, 0, 0);
    expect_fail("err metadata not string", do_st_open, q, q, "__metadata__", "'a'", NULL);

    q = NEWPATH();
    write_raw(q, "{\"ints\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}", zeros, 8, 0);
    expect_fail("err st_to_f32 on I32", do_to_f32, q, "'ints'", "I32", NULL);

    // Model directories.
    const char *d = tpath("empty_dir");
    mkdir_p(d);
    expect_fail("err dir without model", do_model_dir, d, d, "model.safetensors", NULL);

    char idx[512];
    d = tpath("bad_index");
    mkdir_p(d);
    join_path(idx, sizeof idx, d, "model.safetensors.index.json");
    write_text(idx, "{\"weight_map\": {\"a\": ");
    expect_fail("err index not JSON", do_model_dir, d, "index.json", "JSON", NULL);
    write_text(idx, "{\"metadata\": {}}");
    expect_fail("err index without weight_map", do_model_dir, d, "index.json", "weight_map",
                NULL);
    write_text(idx, "{\"weight_map\": {\"a\": \"gone.safetensors\"}}");
    expect_fail("err index names missing shard", do_model_dir, d, "gone.safetensors", NULL);
    float one = 1;
    StWriteItem s[] = {{"b", &one, 0, {0}}};
    char sp[512];
    join_path(sp, sizeof sp, d, "s1.safetensors");
    st_write(sp, s, 1, NULL);
    write_text(idx, "{\"weight_map\": {\"a\": \"s1.safetensors\"}}");
    expect_fail("err index tensor not in shard", do_model_dir, d, "'a'", "s1.safetensors",
                NULL);

    // config.json.
    const char *base = "\"vocab_size\":100,\"intermediate_size\":128,\"num_hidden_layers\":2,"
                       "\"num_attention_heads\":4";
    char buf[1024];
    const char *cfg = tpath("bad_config.json");
    expect_fail("err config missing file", do_hf_read, tpath("nope.json"), "nope.json", NULL);
    write_text(cfg, "{\"vocab_size\": 100,");
    expect_fail("err config malformed", do_hf_read, cfg, "bad_config.json", "JSON", NULL);
    snprintf(buf, sizeof buf, "{%s}", base);
    write_text(cfg, buf);
    expect_fail("err config missing hidden_size", do_hf_read, cfg, "bad_config.json",
                "missing integer key 'hidden_size'", NULL);
    snprintf(buf, sizeof buf, "{%s,\"hidden_size\":\"64\"}", base);
    write_text(cfg, buf);
    expect_fail("err config hidden_size string", do_hf_read, cfg, "'hidden_size'", NULL);
    snprintf(buf, sizeof buf, "{%s,\"hidden_size\":64,\"rope_scaling\":{\"rope_type\":\"linear\","
                              "\"factor\":2.0,\"low_freq_factor\":1}}", base);
    write_text(cfg, buf);
    expect_fail("err config rope linear extra key", do_hf_read, cfg, "rope_scaling.low_freq_factor", "linear", NULL);
    snprintf(buf, sizeof buf, "{%s,\"hidden_size\":64,\"rope_scaling\":{\"type\":\"dynamic\","
                              "\"factor\":2.0}}", base);
    write_text(cfg, buf);
    expect_fail("err config rope dynamic (legacy key)", do_hf_read, cfg, "rope_scaling",
                "dynamic", NULL);
    snprintf(buf, sizeof buf, "{%s,\"hidden_size\":64,\"rope_parameters\":{\"rope_type\":"
                              "\"yarn\",\"rope_theta\":10000}}", base);
    write_text(cfg, buf);
    expect_fail("err config rope_parameters yarn", do_hf_read, cfg, "rope_parameters", "yarn",
                NULL);
    snprintf(buf, sizeof buf, "{%s,\"hidden_size\":64,\"rope_scaling\":{\"rope_type\":"
                              "\"llama3\",\"low_freq_factor\":1,\"high_freq_factor\":4,"
                              "\"original_max_position_embeddings\":8192}}", base);
    write_text(cfg, buf);
    expect_fail("err config llama3 missing factor", do_hf_read, cfg, "'factor'", NULL);
    snprintf(buf, sizeof buf, "{%s,\"hidden_size\":64,\"mlp_bias\":true}", base);
    write_text(cfg, buf);
    expect_fail("err config mlp_bias", do_hf_read, cfg, "mlp_bias", NULL);
    // Every family's attention drops out in training: a nonzero rate is refused, 0.0 reads.
    const char *fams[] = {"llama", "mistral", "qwen2", "qwen3"};
    for (int i = 0; i < 4; i++) {
        char name[64];
        snprintf(buf, sizeof buf, "{%s,\"hidden_size\":64,\"model_type\":\"%s\",\"attention_dropout\":0.1}",
                 base, fams[i]);
        write_text(cfg, buf);
        snprintf(name, sizeof name, "err config %s attention_dropout", fams[i]);
        expect_fail(name, do_hf_read, cfg, "'attention_dropout' = 0.1", NULL);
    }
    snprintf(buf, sizeof buf, "{%s,\"hidden_size\":64,\"model_type\":\"qwen2\",\"partial_rotary_factor\":0.5}", base);
    write_text(cfg, buf);
    expect_fail("err config qwen2 partial_rotary_factor", do_hf_read, cfg, "'partial_rotary_factor' = 0.5", NULL);
    snprintf(buf, sizeof buf, "{%s,\"hidden_size\":64,\"attention_dropout\":0.0}", base);
    write_text(cfg, buf);
    ModelConfig mc;
    hf_read_config(cfg, &mc);
    check("config attention_dropout 0.0 reads", mc.hidden_size == 64, "hidden %d", mc.hidden_size);
    snprintf(buf, sizeof buf, "{%s,\"hidden_size\":64,\"hidden_act\":\"gelu\"}", base);
    write_text(cfg, buf);
    expect_fail("err config hidden_act", do_hf_read, cfg, "hidden_act", NULL);
#undef NEWPATH
}

int main(void) {
    snprintf(tmp, sizeof tmp, "/tmp/test_st.XXXXXX");
    if (!mkdtemp(tmp)) { perror("mkdtemp"); return 2; }
    test_write_roundtrip();
    test_write_filled();
    test_half_bf16();
    test_model_dirs();
    test_config();
    test_write_errors();
    test_errors();
    remove_tree(tmp);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail ? 1 : 0;
}
