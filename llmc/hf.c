// hf.c: see hf.h.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // mmap, fsync, fileno under -std=c11
#endif
#include "hf.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "json.h"
#include "util.h"

// Absent and JSON null both mean "use the default", as in transformers.
static const cJSON *get(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

static int is_int(const cJSON *v) {
    if (!cJSON_IsNumber(v)) return 0;
    double d = v->valuedouble;
    return d >= INT_MIN && d <= INT_MAX && d == (double)(int)d;
}

static int req_int(const char *path, const cJSON *o, const char *key) {
    const cJSON *v = get(o, key);
    if (!v) fail("%s: missing integer key '%s'", path, key);
    if (!is_int(v)) fail("%s: key '%s' must be an integer", path, key);
    if (v->valueint <= 0) fail("%s: key '%s' must be positive, got %d", path, key, v->valueint);
    return v->valueint;
}

static int opt_int(const char *path, const cJSON *o, const char *key, int def) {
    const cJSON *v = get(o, key);
    if (!v) return def;
    if (!is_int(v)) fail("%s: key '%s' must be an integer", path, key);
    return v->valueint;
}

static double opt_num(const char *path, const cJSON *o, const char *key, double def) {
    const cJSON *v = get(o, key);
    if (!v) return def;
    if (!cJSON_IsNumber(v)) fail("%s: key '%s' must be a number", path, key);
    return v->valuedouble;
}

static int opt_bool(const char *path, const cJSON *o, const char *key, int def) {
    const cJSON *v = get(o, key);
    if (!v) return def;
    if (!cJSON_IsBool(v)) fail("%s: key '%s' must be true or false", path, key);
    return cJSON_IsTrue(v);
}

// rope_scaling / rope_parameters share one layout: rope_type (or legacy "type") plus the
// llama3 fields. `where` names the object in messages.
static void read_rope(const char *path, const cJSON *r, const char *where, ModelConfig *c) {
    if (!cJSON_IsObject(r)) fail("%s: '%s' must be an object or null", path, where);
    const cJSON *ty = get(r, "rope_type");
    const char *tkey = "rope_type";
    if (!ty) { ty = get(r, "type"); tkey = "type"; }
    if (ty && !cJSON_IsString(ty)) fail("%s: '%s.%s' must be a string", path, where, tkey);
    const char *t = ty ? ty->valuestring : "default";
    if (strcmp(t, "default") == 0) {
        c->rope_type = ROPE_DEFAULT;
        return;
    }
    if (strcmp(t, "llama3") != 0)
        fail("%s: '%s.%s' = \"%s\" is not supported (only \"default\" and \"llama3\")", path,
             where, tkey, t);
    c->rope_type = ROPE_LLAMA3;
    static const char *keys[] = {"factor", "low_freq_factor", "high_freq_factor",
                                 "original_max_position_embeddings"};
    double v[4];
    for (int i = 0; i < 4; i++) {
        const cJSON *x = get(r, keys[i]);
        if (!cJSON_IsNumber(x)) fail("%s: '%s' (llama3) needs a number '%s'", path, where, keys[i]);
        v[i] = x->valuedouble;
    }
    // HF divides by (high - low) and by each factor; reject what would make that meaningless.
    if (!isfinite(v[0]) || !isfinite(v[1]) || !isfinite(v[2]) || !(v[0] > 0) || !(v[1] > 0) || !(v[2] > v[1]) || !(v[3] >= 1 && v[3] <= INT_MAX) ||
        v[3] != (double)(int)v[3])
        fail("%s: '%s' has invalid llama3 values (factor %g, low_freq_factor %g, "
             "high_freq_factor %g, original_max_position_embeddings %g)",
             path, where, v[0], v[1], v[2], v[3]);
    c->rope_factor = v[0];
    c->rope_low_freq_factor = v[1];
    c->rope_high_freq_factor = v[2];
    c->rope_original_max_position_embeddings = (int)v[3];
}

void hf_read_config(const char *path, ModelConfig *c) {
    cJSON *root = json_read_file(path);
    if (!cJSON_IsObject(root)) fail("%s: not a JSON object", path);

    memset(c, 0, sizeof *c);
    const cJSON *mt = get(root, "model_type");
    if (mt && !cJSON_IsString(mt)) fail("%s: key 'model_type' must be a string", path);
    const char *model_type = mt ? mt->valuestring : "llama";
    if (strlen(model_type) >= sizeof c->model_type)
        fail("%s: model_type '%s' is too long", path, model_type);
    strcpy(c->model_type, model_type);
    // Another family read as Llama would train the wrong model silently (Qwen3's q/k norms,
    // Gemma's scaled embeddings, Phi-3's fused projections): refuse what is not implemented.
    if (strcmp(model_type, "llama") && strcmp(model_type, "mistral") && strcmp(model_type, "qwen2"))
        fail("%s: model_type '%s' is not supported (llama, mistral, qwen2)", path, model_type);

    c->vocab_size = req_int(path, root, "vocab_size");
    c->hidden_size = req_int(path, root, "hidden_size");
    c->intermediate_size = req_int(path, root, "intermediate_size");
    c->num_hidden_layers = req_int(path, root, "num_hidden_layers");
    c->num_attention_heads = req_int(path, root, "num_attention_heads");
    c->num_key_value_heads = opt_int(path, root, "num_key_value_heads", c->num_attention_heads);
    c->head_dim = opt_int(path, root, "head_dim", c->hidden_size / c->num_attention_heads);
    c->max_position_embeddings = opt_int(path, root, "max_position_embeddings", 2048);
    double eps = opt_num(path, root, "rms_norm_eps", 1e-6);
    // Checked as the float the kernels use: 1e-50 would become 0, 1e300 infinity.
    c->rms_norm_eps = (float)eps;
    if (!(isfinite(c->rms_norm_eps) && c->rms_norm_eps > 0))
        fail("%s: 'rms_norm_eps' must be a positive finite float32, got %g", path, eps);
    c->tie_word_embeddings = opt_bool(path, root, "tie_word_embeddings", 0);
    // transformers' Qwen2 attention always has q/k/v biases, whatever the config says.
    c->attention_bias = strcmp(c->model_type, "qwen2") == 0
                            ? 1 : opt_bool(path, root, "attention_bias", 0);
    if (opt_bool(path, root, "mlp_bias", 0))
        fail("%s: 'mlp_bias': true is not supported", path);
    const cJSON *act = get(root, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0))
        fail("%s: 'hidden_act' must be \"silu\" (the only activation implemented)", path);

    c->bos_token_id = opt_int(path, root, "bos_token_id", -1);
    const cJSON *eos = get(root, "eos_token_id");
    if (cJSON_IsArray(eos)) {
        const cJSON *first = cJSON_GetArrayItem(eos, 0);
        if (first && !is_int(first)) fail("%s: key 'eos_token_id' must hold integers", path);
        c->eos_token_id = first ? first->valueint : -1;
    } else {
        c->eos_token_id = opt_int(path, root, "eos_token_id", -1);
    }

    // Mistral applies its window whenever one is set; Qwen2 only with use_sliding_window.
    const cJSON *sw = get(root, "sliding_window");
    if (sw && (!is_int(sw) || sw->valueint <= 0))
        fail("%s: key 'sliding_window' must be a positive integer or null", path);
    int sw_on = !strcmp(model_type, "mistral") ||
                (!strcmp(model_type, "qwen2") && opt_bool(path, root, "use_sliding_window", 0));
    c->sliding_window = sw && sw_on ? sw->valueint : 0;

    c->rope_theta = opt_num(path, root, "rope_theta", 10000.0);
    c->rope_type = ROPE_DEFAULT;
    c->rope_factor = 1.0;
    const cJSON *rp = get(root, "rope_parameters");
    if (rp) {
        read_rope(path, rp, "rope_parameters", c);
        c->rope_theta = opt_num(path, rp, "rope_theta", c->rope_theta);
    } else {
        const cJSON *rs = get(root, "rope_scaling");
        if (rs) read_rope(path, rs, "rope_scaling", c);
    }
    if (!(isfinite(c->rope_theta) && c->rope_theta > 0))
        fail("%s: 'rope_theta' must be a positive finite number, got %g", path, c->rope_theta);
    cJSON_Delete(root);
}

// Floats are written as Python would (shortest round-trip digits, always with a '.' or an
// exponent): transformers warns when llama3 rope factors are not floats, and 1e-5f must not
// come out as its double expansion 9.99999974737875e-06.
static cJSON *add_real(cJSON *o, const char *key, double v, int single) {
    if (!isfinite(v)) return cJSON_AddNullToObject(o, key);
    char s[40];
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(s, sizeof s, "%.1f", v);  // 500000.0, not 5e+05
    } else {
        for (int prec = 1; prec <= 17; prec++) {  // 9 digits suffice for a float, 17 for a double
            snprintf(s, sizeof s, "%.*g", prec, v);
            if (single ? strtof(s, NULL) == (float)v : strtod(s, NULL) == v) break;
        }
    }
    if (!strpbrk(s, ".e")) strcat(s, ".0");
    return cJSON_AddRawToObject(o, key, s);
}

int hf_write_config(const char *path, const ModelConfig *c) {
    const char *mt = c->model_type[0] ? c->model_type : "llama";
    const char *arch = strcmp(mt, "qwen2") == 0     ? "Qwen2ForCausalLM"
                       : strcmp(mt, "mistral") == 0 ? "MistralForCausalLM"
                                                    : "LlamaForCausalLM";
    cJSON *o = cJSON_CreateObject();
    if (!o) { errno = ENOMEM; return -1; }
    int built = 1;  // cJSON returns NULL/false on out-of-memory; any miss means no file
#define ADD(x) built &= (x) != 0
    cJSON *archs = cJSON_AddArrayToObject(o, "architectures");
    ADD(archs && cJSON_AddItemToArray(archs, cJSON_CreateString(arch)));
    ADD(cJSON_AddStringToObject(o, "model_type", mt));
    ADD(cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size));
    ADD(cJSON_AddNumberToObject(o, "hidden_size", c->hidden_size));
    ADD(cJSON_AddNumberToObject(o, "intermediate_size", c->intermediate_size));
    ADD(cJSON_AddNumberToObject(o, "num_hidden_layers", c->num_hidden_layers));
    ADD(cJSON_AddNumberToObject(o, "num_attention_heads", c->num_attention_heads));
    ADD(cJSON_AddNumberToObject(o, "num_key_value_heads", c->num_key_value_heads));
    ADD(cJSON_AddNumberToObject(o, "head_dim", c->head_dim));
    ADD(cJSON_AddNumberToObject(o, "max_position_embeddings", c->max_position_embeddings));
    ADD(add_real(o, "rms_norm_eps", c->rms_norm_eps, 1));
    ADD(add_real(o, "rope_theta", c->rope_theta, 0));
    if (c->rope_type == ROPE_LLAMA3) {
        cJSON *r = cJSON_AddObjectToObject(o, "rope_scaling");
        ADD(r);
        if (r) {
            ADD(cJSON_AddStringToObject(r, "rope_type", "llama3"));
            ADD(add_real(r, "factor", c->rope_factor, 0));
            ADD(add_real(r, "low_freq_factor", c->rope_low_freq_factor, 0));
            ADD(add_real(r, "high_freq_factor", c->rope_high_freq_factor, 0));
            ADD(cJSON_AddNumberToObject(r, "original_max_position_embeddings",
                                        c->rope_original_max_position_embeddings));
        }
    } else {
        ADD(cJSON_AddNullToObject(o, "rope_scaling"));
    }
    ADD(cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings));
    ADD(cJSON_AddBoolToObject(o, "attention_bias", c->attention_bias));
    ADD(cJSON_AddBoolToObject(o, "mlp_bias", 0));
    ADD(add_real(o, "attention_dropout", 0.0, 0));
    // The window is written back as read, so the saved model attends as the loaded one did.
    if (!strcmp(mt, "mistral") || !strcmp(mt, "qwen2")) {
        if (c->sliding_window) ADD(cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window));
        else ADD(cJSON_AddNullToObject(o, "sliding_window"));
    }
    if (!strcmp(mt, "qwen2")) ADD(cJSON_AddBoolToObject(o, "use_sliding_window", c->sliding_window > 0));
    ADD(cJSON_AddStringToObject(o, "hidden_act", "silu"));
    ADD(cJSON_AddStringToObject(o, "torch_dtype", c->torch_dtype[0] ? c->torch_dtype : "float32"));
    ADD(add_real(o, "initializer_range", 0.02, 0));
    ADD(cJSON_AddBoolToObject(o, "use_cache", 1));
    if (c->bos_token_id >= 0) ADD(cJSON_AddNumberToObject(o, "bos_token_id", c->bos_token_id));
    if (c->eos_token_id >= 0) ADD(cJSON_AddNumberToObject(o, "eos_token_id", c->eos_token_id));

#undef ADD
    char *text = built ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!text) { errno = ENOMEM; return -1; }
    FILE *f = fopen(path, "w");
    if (!f) { free(text); return -1; }
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n && fputc('\n', f) != EOF && fflush(f) == 0 &&
             fsync(fileno(f)) == 0;
    free(text);
    int saved = errno;
    if (fclose(f) != 0 && ok) { ok = 0; saved = errno; }
    if (!ok) { errno = saved ? saved : EIO; return -1; }
    return 0;
}
