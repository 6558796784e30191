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
#include "family.h"
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

// Every key of the rope scaling object r is one of known[0..n); else fails naming it and `what`.
static void only_keys(const char *path, const char *where, const cJSON *r, const char *const *known, size_t n,
                      const char *what) {
    const cJSON *e;
    cJSON_ArrayForEach(e, r) {
        size_t i = 0;
        while (i < n && strcmp(e->string, known[i])) i++;
        if (i == n) fail("%s: '%s.%s' is not supported for %s", path, where, e->string, what);
    }
}

// A positive finite number under key k of r, or def when absent (get() counts null as absent,
// as transformers' `.get(k) or default`).
static double yarn_num(const char *path, const cJSON *r, const char *where, const char *k, double def, int *given) {
    const cJSON *v = get(r, k);
    if (!v) return def;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || !(v->valuedouble > 0) || v->valuedouble > 1e12)
        fail("%s: '%s.%s' must be a positive number", path, where, k);
    *given = 1;
    return v->valuedouble;
}

// YaRN as transformers 4.57's _compute_yarn_parameters reads it: factor (required),
// original_max_position_embeddings (else max_position_embeddings), beta_fast (32), beta_slow
// (1), truncate (true), attention_factor (else 0.1 ln(factor) + 1, or DeepSeek's
// mscale / mscale_all_dim ratio of that form, 1 when factor <= 1).
static void read_yarn(const char *path, const cJSON *r, const char *where, ModelConfig *c) {
    static const char *const known[] = {"rope_type", "type", "factor", "original_max_position_embeddings", "beta_fast",
                                        "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate",
                                        "rope_theta"};
    only_keys(path, where, r, known, sizeof known / sizeof *known, "yarn");
    int g = 0, keys = 0;
    if (!cJSON_IsNumber(get(r, "factor"))) fail("%s: '%s' (yarn) needs a number 'factor'", path, where);
    c->rope_factor = yarn_num(path, r, where, "factor", 0, &g);
    g = 0;
    double orig = yarn_num(path, r, where, "original_max_position_embeddings", 0, &g);
    if (g && (orig != floor(orig) || orig > INT_MAX))
        fail("%s: '%s.original_max_position_embeddings' must be a whole number", path, where);
    c->rope_original_max_position_embeddings = (int)orig;
    keys |= g ? YARN_ORIG : 0, g = 0;
    c->rope_beta_fast = yarn_num(path, r, where, "beta_fast", 32, &g);
    keys |= g ? YARN_BETA_FAST : 0, g = 0;
    c->rope_beta_slow = yarn_num(path, r, where, "beta_slow", 1, &g);
    keys |= g ? YARN_BETA_SLOW : 0, g = 0;
    c->rope_mscale = yarn_num(path, r, where, "mscale", 0, &g);
    keys |= g ? YARN_MSCALE : 0, g = 0;
    c->rope_mscale_all_dim = yarn_num(path, r, where, "mscale_all_dim", 0, &g);
    keys |= g ? YARN_MSCALE_ALL : 0, g = 0;
    const cJSON *tr = get(r, "truncate");
    c->rope_truncate = 1;
    if (tr && !cJSON_IsNull(tr)) {
        if (!cJSON_IsBool(tr)) fail("%s: '%s.truncate' must be true or false", path, where);
        c->rope_truncate = cJSON_IsTrue(tr);
        keys |= YARN_TRUNCATE;
    }
    c->rope_yarn_keys = keys;
    const double f = c->rope_factor;
#define MSCALE(m) (f <= 1 ? 1.0 : 0.1 * (m) * log(f) + 1.0)
    c->rope_attention_factor = yarn_num(path, r, where, "attention_factor", 0, &c->rope_has_attention_factor);
    if (!c->rope_has_attention_factor)
        c->rope_attention_factor = c->rope_mscale > 0 && c->rope_mscale_all_dim > 0
                                       ? MSCALE(c->rope_mscale) / MSCALE(c->rope_mscale_all_dim)
                                       : MSCALE(1.0);
#undef MSCALE
    c->rope_type = ROPE_YARN;
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
    if (strcmp(t, "yarn") == 0) return read_yarn(path, r, where, c);
    if (strcmp(t, "linear") == 0) {  // transformers' linear scaling: positions / factor
        static const char *const known[] = {"rope_type", "type", "factor", "rope_theta"};
        only_keys(path, where, r, known, sizeof known / sizeof *known, "linear rope scaling (factor only)");
        const cJSON *f = get(r, "factor");
        if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble) || !(f->valuedouble > 0))
            fail("%s: '%s' (linear) needs a positive number 'factor'", path, where);
        c->rope_factor = f->valuedouble;
        c->rope_type = ROPE_LINEAR;
        return;
    }
    if (strcmp(t, "llama3") != 0)
        fail("%s: '%s.%s' = \"%s\" is not supported (only \"default\", \"linear\", \"llama3\" and \"yarn\"; "
             "\"dynamic\" rescales by the longest batch seen so far, which training cannot reproduce)", path,
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

// Phi-3's longrope: rope_scaling {"type": "longrope" (or the legacy "su" / "yarn", which
// Phi3Config renames), "short_factor": [D/2 numbers], "long_factor": [D/2 numbers]}, plus the
// attention_factor newer transformers read (else derived from max_position_embeddings /
// original_max_position_embeddings as both transformers 4.44 and 4.57 do; a "factor" key is
// overridden by that ratio in transformers too, since Phi3Config has the original length).
static void read_longrope(const char *path, const cJSON *rs, ModelConfig *c) {
    const int half = rope_dims(c) / 2;
    if (!cJSON_IsObject(rs)) fail("%s: 'rope_scaling' must be an object or null", path);
    const cJSON *ty = get(rs, "type"), *e;
    const char *key = "type";
    if (!ty) ty = get(rs, "rope_type"), key = "rope_type";
    const char *t = cJSON_IsString(ty) ? ty->valuestring : "(none)";
    if (strcmp(t, "longrope") && strcmp(t, "su") && strcmp(t, "yarn"))  // Phi3Config renames su, yarn
        fail("%s: 'rope_scaling.%s' = %s is not supported for phi3 (longrope, su, yarn or null)", path, key, t);
    static const char *const known[] = {"type", "rope_type", "short_factor", "long_factor", "attention_factor", "factor"};
    only_keys(path, "rope_scaling", rs, known, sizeof known / sizeof *known,
              "longrope (type, short_factor, long_factor, attention_factor)");
    if (half > ROPE_MAX_HALF)
        fail("%s: longrope over %d rotary dimensions: at most %d is implemented", path, 2 * half, 2 * ROPE_MAX_HALF);
    static const char *const lists[] = {"short_factor", "long_factor"};
    for (int k = 0; k < 2; k++) {
        const cJSON *l = get(rs, lists[k]);
        if (!cJSON_IsArray(l) || cJSON_GetArraySize(l) != half)
            fail("%s: 'rope_scaling.%s' must be a list of %d numbers (the rotary dimensions / 2)", path, lists[k], half);
        float *dst = k ? c->rope_long_factor : c->rope_short_factor;
        int i = 0;
        cJSON_ArrayForEach(e, l) {
            if (!cJSON_IsNumber(e) || !isfinite(e->valuedouble) || !(e->valuedouble > 0) || e->valuedouble > 1e30)
                fail("%s: 'rope_scaling.%s'[%d] must be a positive finite number", path, lists[k], i);
            dst[i++] = (float)e->valuedouble;
        }
    }
    const cJSON *f = get(rs, "factor");
    if (f && !(cJSON_IsNumber(f) && isfinite(f->valuedouble) && f->valuedouble > 0))
        fail("%s: 'rope_scaling.factor' must be a positive number", path);
    if (c->original_max_position_embeddings == 0) c->original_max_position_embeddings = 4096;  // Phi3Config's
    const cJSON *af = get(rs, "attention_factor");
    if (af) {
        if (!cJSON_IsNumber(af) || !isfinite(af->valuedouble) || !(af->valuedouble > 0))
            fail("%s: 'rope_scaling.attention_factor' must be a positive number", path);
        c->rope_attention_factor = af->valuedouble;
        c->rope_has_attention_factor = 1;
    } else {
        const double orig = c->original_max_position_embeddings, scale = c->max_position_embeddings / orig;
        c->rope_attention_factor = scale <= 1.0 || orig <= 1 ? 1.0 : sqrt(1.0 + log(scale) / log(orig));
    }
    c->rope_type = ROPE_LONGROPE;
}

// Phi-3's own keys. Dropout is not implemented, so a nonzero rate would train another model.
static void read_phi3_keys(const char *path, const cJSON *root, ModelConfig *c) {
    // Phi3Config has no head_dim; transformers 4.44's attention ignores the key, 4.57's honours it.
    if (c->head_dim * c->num_attention_heads != c->hidden_size)
        fail("%s: phi3 'head_dim' %d must be hidden_size / num_attention_heads (%d / %d): transformers "
             "versions disagree on another value", path, c->head_dim, c->hidden_size, c->num_attention_heads);
    static const char *const drops[] = {"resid_pdrop", "embd_pdrop"};
    for (int i = 0; i < 2; i++) {
        double p = opt_num(path, root, drops[i], 0.0);
        if (p != 0.0) fail("%s: '%s' = %g is not supported (dropout is not implemented; use 0.0)", path, drops[i], p);
    }
    c->original_max_position_embeddings = opt_int(path, root, "original_max_position_embeddings", 0);
    if (c->original_max_position_embeddings < 0)
        fail("%s: key 'original_max_position_embeddings' must be a positive integer", path);
    const cJSON *rs = get(root, "rope_scaling");
    if (rs) read_longrope(path, rs, c);
}

// A logit soft-cap key: a positive number, or null (none: transformers tests `is not None`);
// absent keys take `def` (0: none). Not get(), which reads null as absent.
static double read_softcap(const char *path, const cJSON *root, const char *key, double def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (v ? cJSON_IsNull(v) : def == 0) return 0;
    const double cap = v ? opt_num(path, root, key, def) : def;
    if (!(isfinite(cap) && cap > 0 && cap < 1e30))
        fail("%s: '%s' must be a positive number or null, got %g", path, key, cap);
    return cap;
}

// An activation key's GELU: 1 exact (erf: "gelu"), 0 the tanh approximation
// ("gelu_pytorch_tanh", or "gelu_new": the same function); anything else is refused.
static int read_gelu(const char *path, const cJSON *v, const char *key, const char *model_type) {
    if (cJSON_IsString(v) && !strcmp(v->valuestring, "gelu")) return 1;
    if (cJSON_IsString(v) && (!strcmp(v->valuestring, "gelu_pytorch_tanh") || !strcmp(v->valuestring, "gelu_new")))
        return 0;
    fail("%s: '%s' must be \"gelu_pytorch_tanh\" or \"gelu\" (GeGLU with GELU's tanh approximation or the "
         "exact one, those implemented for %s)", path, key, model_type);
}

// Gemma 1's MLP activation. hidden_activation names it where set (transformers 4.39-4.44 read
// only that key, and Google's configs give it as the tanh approximation Gemma was trained with);
// without it, hidden_act (what 4.57's GemmaMLP reads, default "gelu_pytorch_tanh"). The hub's
// Gemma 1 configs carry a legacy hidden_act "gelu" beside it: 4.57 runs exact GELU on them, so
// the choice is said, not made quietly.
static void read_gemma1_act(const char *path, const cJSON *root, ModelConfig *c) {
    const cJSON *ha = get(root, "hidden_activation"), *act = get(root, "hidden_act");
    const int by_act = act ? read_gelu(path, act, "hidden_act", c->model_type) : 0;
    if (!ha || cJSON_IsNull(ha)) {
        c->gelu_exact = by_act;
        if (by_act)
            snprintf(c->gelu_note, sizeof c->gelu_note, "%s: hidden_act \"gelu\" without hidden_activation: the "
                     "MLP uses exact GELU, as transformers 4.57 does (4.39-4.44 used the tanh approximation)", path);
        return;
    }
    c->gelu_exact = read_gelu(path, ha, "hidden_activation", c->model_type);
    if (act && by_act != c->gelu_exact)
        snprintf(c->gelu_note, sizeof c->gelu_note, "%s: hidden_act \"%s\" and hidden_activation \"%s\" disagree: "
                 "the MLP uses hidden_activation's (transformers 4.57's GemmaMLP would use hidden_act's)", path,
                 act->valuestring, ha->valuestring);
}

// The Gemma 2/3 keys (configuration_gemma2 / configuration_gemma3 of transformers 4.57: the
// defaults of absent keys). Gemma 2 caps its attention scores and logits (50 and 30 unless
// the keys say otherwise) and alternates sliding and global layers with one RoPE; Gemma 3 has
// no caps unless set and gives its sliding layers their own RoPE base. What this trainer does
// not implement is refused: bidirectional attention, another activation.
static void read_gemma_keys(const char *path, const cJSON *root, ModelConfig *c, int gemma2) {
    const cJSON *ha = get(root, "hidden_activation"), *act = get(root, "hidden_act");
    c->gelu_exact = ha && !cJSON_IsNull(ha) ? read_gelu(path, ha, "hidden_activation", c->model_type) : 0;
    // transformers' Gemma 2/3 read hidden_activation only; a hidden_act that says otherwise is
    // a config to look at, not one to guess about.
    if (act && read_gelu(path, act, "hidden_act", c->model_type) != c->gelu_exact)
        fail("%s: 'hidden_act' and 'hidden_activation' name different GELUs: %s's MLP uses hidden_activation "
             "(default \"gelu_pytorch_tanh\"); remove hidden_act or make them agree", path, c->model_type);
    c->attn_softcap = read_softcap(path, root, "attn_logit_softcapping", gemma2 ? 50.0 : 0);
    c->final_softcap = read_softcap(path, root, "final_logit_softcapping", gemma2 ? 30.0 : 0);
    if (opt_bool(path, root, "use_bidirectional_attention", 0))
        fail("%s: 'use_bidirectional_attention': true is not supported (causal attention only)", path);
    c->query_pre_attn_scalar = opt_int(path, root, "query_pre_attn_scalar", 256);
    if (c->query_pre_attn_scalar <= 0) fail("%s: 'query_pre_attn_scalar' must be a positive integer", path);
    // Gemma 2: every other layer slides (layer_types' default); one RoPE for all (Gemma2Config
    // has neither rope_local_base_freq nor sliding_window_pattern, and transformers reads neither).
    c->sliding_pattern = 2;
    if (!gemma2) {
        c->rope_local_theta = opt_num(path, root, "rope_local_base_freq", 10000.0);
        if (!(isfinite(c->rope_local_theta) && c->rope_local_theta > 0))
            fail("%s: 'rope_local_base_freq' must be a positive finite number, got %g", path, c->rope_local_theta);
        c->sliding_pattern = opt_int(path, root, "sliding_window_pattern", 6);
        if (c->sliding_pattern < 1) fail("%s: 'sliding_window_pattern' must be a positive integer", path);
    }
    // transformers >= 4.53 saves layer_types and not the pattern: then the first global layer
    // gives it (read_root checks the whole list against it).
    const cJSON *lt = get(root, "layer_types");
    if ((gemma2 || !get(root, "sliding_window_pattern")) && cJSON_IsArray(lt)) {
        int n = cJSON_GetArraySize(lt), first = n;
        for (int l = n - 1; l >= 0; l--) {
            const cJSON *t = cJSON_GetArrayItem(lt, l);
            if (cJSON_IsString(t) && !strcmp(t->valuestring, "full_attention")) first = l;
        }
        c->sliding_pattern = first + 1;
    }
}

static void read_root(const char *path, const cJSON *root, ModelConfig *c);

// Gemma3ForConditionalGeneration (model_type gemma3): its text_config, as Gemma3Config builds a
// Gemma3TextConfig from it: absent keys take that class's defaults (transformers 4.57); the
// token ids may sit at the top level. The vision tower's keys are not read.
static void read_gemma3_multimodal(const char *path, const cJSON *root, ModelConfig *c) {
    const cJSON *tc = get(root, "text_config");
    if (!cJSON_IsObject(tc)) fail("%s: model_type gemma3 needs a text_config object (the language model's keys)", path);
    const cJSON *tmt = get(tc, "model_type");
    if (tmt && !(cJSON_IsString(tmt) && !strcmp(tmt->valuestring, "gemma3_text")))
        fail("%s: text_config.model_type must be \"gemma3_text\"", path);
    cJSON *t = cJSON_Duplicate(tc, 1);
    if (!t) fail("out of memory");
    static const struct { const char *key; double v; } DEF[] = {
        {"vocab_size", 262208}, {"hidden_size", 2304}, {"intermediate_size", 9216}, {"num_hidden_layers", 26},
        {"num_attention_heads", 8}, {"num_key_value_heads", 4}, {"head_dim", 256},
        {"max_position_embeddings", 131072}, {"rms_norm_eps", 1e-6}, {"rope_theta", 1000000.0},
        {"pad_token_id", 0}, {"eos_token_id", 1}, {"bos_token_id", 2}};
    for (size_t i = 0; i < sizeof DEF / sizeof DEF[0]; i++) {
        if (cJSON_GetObjectItemCaseSensitive(t, DEF[i].key)) continue;
        const cJSON *top = cJSON_GetObjectItemCaseSensitive(root, DEF[i].key);  // token ids may be here
        cJSON *v = top && strstr(DEF[i].key, "token_id") ? cJSON_Duplicate(top, 1) : cJSON_CreateNumber(DEF[i].v);
        if (!v || !cJSON_AddItemToObject(t, DEF[i].key, v)) fail("out of memory");
    }
    cJSON_DeleteItemFromObjectCaseSensitive(t, "model_type");
    cJSON_DeleteItemFromObjectCaseSensitive(t, "architectures");
    if (!cJSON_AddStringToObject(t, "model_type", "gemma3_text")) fail("out of memory");
    char label[1200];
    snprintf(label, sizeof label, "%s (text_config)", path);
    read_root(label, t, c);
    cJSON_Delete(t);
    c->multimodal = 1;
}

// Reads *c from a parsed config.json; `path` names it in messages.
static void read_root(const char *path, const cJSON *root, ModelConfig *c) {
    memset(c, 0, sizeof *c);
    const cJSON *mt = get(root, "model_type");
    if (mt && !cJSON_IsString(mt)) fail("%s: key 'model_type' must be a string", path);
    const char *model_type = mt ? mt->valuestring : "llama";
    if (!strcmp(model_type, "gemma3")) {
        read_gemma3_multimodal(path, root, c);
        return;
    }
    if (strlen(model_type) >= sizeof c->model_type)
        fail("%s: model_type '%s' is too long", path, model_type);
    strcpy(c->model_type, model_type);
    // Another family read as Llama would train the wrong model silently (Gemma's scaled
    // embeddings and (1 + w) norms): refuse what the family table does not have.
    const ModelFamily *fam = family_find(model_type);
    if (!fam) fail("%s: model_type '%s' is not supported (supported: %s)", path, model_type, family_list());
    const cJSON *archs = get(root, "architectures");
    if (archs) {
        if (!cJSON_IsArray(archs)) fail("%s: key 'architectures' must be a list of strings", path);
        const cJSON *a;
        cJSON_ArrayForEach(a, archs) {
            if (!cJSON_IsString(a)) fail("%s: key 'architectures' must be a list of strings", path);
            // transformers' AutoModelForCausalLM goes by model_type; an entry naming another
            // family's causal LM is tolerated, anything else (a classifier head) is not.
            const int tok = family_classifier_architecture(fam, "Token", a->valuestring);
            if (tok || family_classifier_architecture(fam, "Sequence", a->valuestring)) {  // a reward model's files
                const cJSON *ids = get(root, "id2label");
                c->token_cls = tok;
                c->num_labels = cJSON_IsObject(ids) ? cJSON_GetArraySize(ids) : 2;  // PretrainedConfig's default 2
                if (c->num_labels < 1) fail("%s: 'id2label' is empty; a sequence classifier has labels", path);
                continue;
            }
            if (!family_by_architecture(a->valuestring))
                fail("%s: architecture '%s' is not supported (supported: %s, and their ForSequenceClassification "
                     "and ForTokenClassification for reward models)", path, a->valuestring, family_architectures());
        }
    }

    c->vocab_size = req_int(path, root, "vocab_size");
    c->hidden_size = req_int(path, root, "hidden_size");
    c->intermediate_size = req_int(path, root, "intermediate_size");
    c->num_hidden_layers = req_int(path, root, "num_hidden_layers");
    c->num_attention_heads = req_int(path, root, "num_attention_heads");
    c->num_key_value_heads = opt_int(path, root, "num_key_value_heads", c->num_attention_heads);
    c->head_dim = opt_int(path, root, "head_dim", fam->head_dim ? fam->head_dim : c->hidden_size / c->num_attention_heads);
    c->max_position_embeddings = opt_int(path, root, "max_position_embeddings", 2048);
    double ir = opt_num(path, root, "initializer_range", 0.02);
    if (!(isfinite(ir) && ir > 0 && ir <= 1))
        fail("%s: 'initializer_range' must be a number in (0, 1], got %g", path, ir);
    c->initializer_range = (float)ir;
    double eps = opt_num(path, root, "rms_norm_eps", 1e-6);
    // Checked as the float the kernels use: 1e-50 would become 0, 1e300 infinity.
    c->rms_norm_eps = (float)eps;
    if (!(isfinite(c->rms_norm_eps) && c->rms_norm_eps > 0))
        fail("%s: 'rms_norm_eps' must be a positive finite float32, got %g", path, eps);
    c->tie_word_embeddings = opt_bool(path, root, "tie_word_embeddings", fam->tie_default);
    // transformers' Qwen2 attention always has q/k/v biases and Mistral's none, whatever the
    // config says; Llama and Qwen3 follow attention_bias.
    c->attention_bias = fam->qkv_bias == BIAS_ALWAYS  ? 1
                        : fam->qkv_bias == BIAS_NEVER ? (opt_bool(path, root, "attention_bias", 0), 0)
                                                      : opt_bool(path, root, "attention_bias", 0);
    if (opt_bool(path, root, "mlp_bias", 0))
        fail("%s: 'mlp_bias': true is not supported", path);
    // Every family's attention applies this dropout in training; without it we would train
    // another model.
    double drop = opt_num(path, root, "attention_dropout", 0.0);
    if (drop != 0.0)
        fail("%s: 'attention_dropout' = %g is not supported (dropout is not implemented; use 0.0)", path, drop);
    // transformers' rope code reads it for every family (tables for that share of each head),
    // but only Phi-3's attention rotates a share and passes the rest (modeling_phi3's
    // apply_rotary_pos_emb); the other families' would not run with it.
    double prf = opt_num(path, root, "partial_rotary_factor", 1.0);
    if (prf != 1.0 && !fam->fused)
        fail("%s: 'partial_rotary_factor' = %g is not supported for %s (only 1.0: RoPE over the whole head; phi3 "
             "takes a share)", path, prf, model_type);
    if (!(prf > 0 && prf <= 1))
        fail("%s: 'partial_rotary_factor' must be in (0, 1], got %g", path, prf);
    c->partial_rotary_factor = prf;
    c->rotary_dim = (int)(c->head_dim * prf);  // Python's int(head_dim * factor)
    if (c->rotary_dim < 2 || c->rotary_dim % 2)
        fail("%s: 'partial_rotary_factor' %g rotates %d of head_dim %d dimensions; RoPE needs an even number, at "
             "least 2", path, prf, c->rotary_dim, c->head_dim);
    if (c->rotary_dim == c->head_dim) c->rotary_dim = 0;
    const cJSON *act = get(root, "hidden_act");
    if (fam->gelu_mlp && fam->window != WIN_PATTERN) {
        read_gemma1_act(path, root, c);
    } else if (fam->gelu_mlp) {
        read_gemma_keys(path, root, c, !strcmp(model_type, "gemma2"));
    } else if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0)) {
        fail("%s: 'hidden_act' must be \"silu\" (the only activation implemented)", path);
    }

    c->bos_token_id = opt_int(path, root, "bos_token_id", -1);
    // The embedding's padding_idx: null is none, an absent key the family's default (Phi-3:
    // 32000), a negative one counts from the end as nn.Embedding counts it (-1: the last row).
    const cJSON *pad = cJSON_GetObjectItemCaseSensitive(root, "pad_token_id");
    const int V = c->vocab_size;
    c->pad_token_id = pad ? -1 : fam->pad_token_id;
    if (pad && !cJSON_IsNull(pad)) {
        int p = opt_int(path, root, "pad_token_id", -1);
        if (p >= V || p < -V) fail("%s: pad_token_id %d is not a token id of vocab_size %d", path, p, V);
        c->pad_token_id = p < 0 ? V + p : p;
    }
    if (c->pad_token_id >= V)  // transformers cannot build this embedding either
        fail("%s: pad_token_id is absent, which for %s means %d, past vocab_size %d; set pad_token_id", path,
             model_type, c->pad_token_id, V);
    // A list (Llama 3.1: [128001, 128008, 128009]) is kept whole and written back as a list.
    const cJSON *eos = get(root, "eos_token_id");
    c->eos_token_id = -1;
    if (cJSON_IsArray(eos)) {
        c->eos_is_list = 1;
        const cJSON *e;
        cJSON_ArrayForEach(e, eos) {
            if (!is_int(e)) fail("%s: key 'eos_token_id' must hold integers", path);
            if (c->n_eos == (int)(sizeof c->eos_ids / sizeof c->eos_ids[0]))
                fail("%s: key 'eos_token_id' lists more than %d ids", path, c->n_eos);
            c->eos_ids[c->n_eos++] = e->valueint;
        }
        if (c->n_eos) c->eos_token_id = c->eos_ids[0];
    } else if (eos) {
        c->eos_token_id = opt_int(path, root, "eos_token_id", -1);
        c->eos_ids[0] = c->eos_token_id, c->n_eos = 1;
    }

    // Sliding windows (family.h): Mistral's applies to every layer whenever set (an absent key
    // is transformers' default 4096, null none); Qwen's only with use_sliding_window, to the
    // layers from max_window_layers on. Llama has none.
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
    if (fam->window != WIN_NONE) {
        if (!sw) c->sliding_window = fam->sliding_window;
        else if (cJSON_IsNull(sw)) c->sliding_window = 0;
        else if (!is_int(sw) || sw->valueint <= 0)
            fail("%s: key 'sliding_window' must be a positive integer or null", path);
        else c->sliding_window = sw->valueint;
    }
    if (fam->window == WIN_QWEN) {
        c->use_sliding_window = opt_bool(path, root, "use_sliding_window", 0);
        c->max_window_layers = opt_int(path, root, "max_window_layers", fam->max_window_layers);
        if (c->max_window_layers < 0) fail("%s: key 'max_window_layers' must be >= 0", path);
    }
    // transformers >= 4.53 also writes the per-layer pattern; it must be the one the keys above
    // give (other patterns are not implemented).
    const cJSON *lt = get(root, "layer_types");
    if (lt) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != c->num_hidden_layers)
            fail("%s: key 'layer_types' must be a list of num_hidden_layers (%d) strings", path,
                 c->num_hidden_layers);
        for (int l = 0; l < c->num_hidden_layers; l++) {
            const cJSON *t = cJSON_GetArrayItem(lt, l);
            const int sliding = fam->window == WIN_PATTERN ? family_layer_sliding(c, l) : family_layer_window(c, l) > 0;
            const char *want = sliding ? "sliding_attention" : "full_attention";
            if (!cJSON_IsString(t) || (strcmp(t->valuestring, "full_attention") && strcmp(t->valuestring, "sliding_attention")))
                fail("%s: layer_types[%d] must be \"full_attention\" or \"sliding_attention\"", path, l);
            if (strcmp(t->valuestring, want))
                fail("%s: layer_types[%d] is \"%s\" but by %s's %s it is \"%s\"; other per-layer patterns are "
                     "not supported", path, l, t->valuestring, model_type,
                     fam->window == WIN_PATTERN ? "sliding_window_pattern" : "sliding_window/use_sliding_window/max_window_layers",
                     want);
        }
    }

    if (fam->fused) read_phi3_keys(path, root, c);

    c->rope_theta = opt_num(path, root, "rope_theta", 10000.0);
    if (c->rope_type != ROPE_LONGROPE) c->rope_type = ROPE_DEFAULT;
    c->rope_factor = 1.0;
    const cJSON *rp = get(root, "rope_parameters");
    if (rp) {
        read_rope(path, rp, "rope_parameters", c);
        c->rope_theta = opt_num(path, rp, "rope_theta", c->rope_theta);
    } else if (!fam->fused) {  // Phi-3's rope_scaling is longrope, read above
        const cJSON *rs = get(root, "rope_scaling");
        if (rs) read_rope(path, rs, "rope_scaling", c);
    }
    if (fam->fused && c->rope_type == ROPE_LLAMA3)  // Phi3Config knows only longrope scaling
        fail("%s: phi3 takes no llama3 rope scaling (only longrope or none)", path);
    if (!(isfinite(c->rope_theta) && c->rope_theta > 0))
        fail("%s: 'rope_theta' must be a positive finite number, got %g", path, c->rope_theta);
}

void hf_read_config(const char *path, ModelConfig *c) {
    cJSON *root = json_read_file(path);
    if (!cJSON_IsObject(root)) fail("%s: not a JSON object", path);
    read_root(path, root, c);
    cJSON_Delete(root);
}

// Axolotl sets each model_config key on the config object transformers built from config.json
// (setattr), then builds the model from it. Keys the model reads when it is built take effect;
// keys transformers' config derives from others in its constructor do not follow an override
// (Qwen2's layer_types from use_sliding_window), and keys that fix the weights' shapes would
// not load the checkpoint. So each key is one of: applied (read_root reads it, as from the
// file), without effect on training (noted), or refused.
static const char *const OVERRIDE_APPLIED[] = {
    "max_position_embeddings", "rope_theta", "rope_scaling", "rope_parameters", "rms_norm_eps", "initializer_range",
    "sliding_window", "bos_token_id", "eos_token_id", "pad_token_id", "attention_dropout", "partial_rotary_factor",
    "hidden_act", "mlp_bias", "original_max_position_embeddings", "resid_pdrop", "embd_pdrop", "hidden_activation",
    "attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"};
static const char *const OVERRIDE_SHAPE[] = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "tie_word_embeddings", "attention_bias", "model_type", "architectures"};
static const char *const OVERRIDE_DERIVED[] = {"use_sliding_window", "max_window_layers", "layer_types"};
// Keys of transformers' configs that do not change what training computes, and why.
static const char *const OVERRIDE_NO_EFFECT[][2] = {
    {"use_cache", "the key/value cache serves generation"},
    {"output_router_logits", "a mixture-of-experts router setting; the families here are dense"},
    {"router_aux_loss_coef", "a mixture-of-experts router setting; the families here are dense"},
    {"output_attentions", "an output training does not ask for"},
    {"output_hidden_states", "an output training does not ask for"},
    {"return_dict", "the form of the model's outputs in PyTorch"},
    {"torch_dtype", "the dtype comes from this run's dtype (bf16) keys"},
    {"dtype", "the dtype comes from this run's dtype (bf16) keys"},
    {"pretraining_tp", "transformers' Llama modeling no longer reads it (4.57)"},
    {"attn_implementation", "a kernel choice of the PyTorch stack"},
    {"_attn_implementation", "a kernel choice of the PyTorch stack"},
    {"transformers_version", "bookkeeping"},
    {"_name_or_path", "bookkeeping"}};

static int listed(const char *const *list, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(list[i], key)) return 1;
    return 0;
}
#define LISTED(list, key) listed(list, sizeof list / sizeof *list, key)

void hf_read_config_overridden(const char *path, const cJSON *over, const char *where, const char *key, int notes,
                               ModelConfig *c) {
    if (!cJSON_IsObject(over)) fail("%s: %s must be a mapping of config.json keys", where, key);
    cJSON *root = json_read_file(path);
    if (!cJSON_IsObject(root)) fail("%s: not a JSON object", path);
    ModelConfig before;
    read_root(path, root, &before);
    if (before.multimodal)  // its keys sit in text_config: an override at the top would not reach them
        fail("%s: %s: overrides of a Gemma 3 multimodal config.json (model_type gemma3) are not supported; edit "
             "text_config in a copy of the model", where, key);
    char applied[1024] = "";
    const cJSON *e;
    cJSON_ArrayForEach(e, over) {
        const char *k = e->string;
        size_t ne = 0;
        while (ne < sizeof OVERRIDE_NO_EFFECT / sizeof *OVERRIDE_NO_EFFECT && strcmp(OVERRIDE_NO_EFFECT[ne][0], k)) ne++;
        if (ne < sizeof OVERRIDE_NO_EFFECT / sizeof *OVERRIDE_NO_EFFECT) {
            if (notes) printf("note: %s: %s.%s has no effect on training here: %s\n", where, key, k, OVERRIDE_NO_EFFECT[ne][1]);
            continue;
        }
        const cJSON *was = cJSON_GetObjectItemCaseSensitive(root, k);
        if (LISTED(OVERRIDE_SHAPE, k)) {
            if (was && cJSON_Compare(was, e, 1)) continue;  // the value config.json has: nothing changes
            fail("%s: %s.%s: changes the model's shape or family, which the weights of %s fix; give a "
                 "model directory with that config", where, key, k, path);
        }
        if (LISTED(OVERRIDE_DERIVED, k))
            fail("%s: %s.%s: transformers derives which layers use a sliding window when it builds the "
                 "config, so an override does not change it there; edit config.json in a copy of the model", where, key, k);
        if (!LISTED(OVERRIDE_APPLIED, k))
            fail("%s: %s.%s is not a config.json key this program reads (it reads: max_position_embeddings, "
                 "rope_theta, rope_scaling, rope_parameters, rms_norm_eps, initializer_range, sliding_window, "
                 "bos/eos/pad_token_id, and the dropout and activation keys at their only supported values)",
                 where, key, k);
        cJSON *dup = cJSON_Duplicate(e, 1);
        if (!dup) fail("out of memory");
        if (was) cJSON_ReplaceItemInObjectCaseSensitive(root, k, dup);
        else if (!cJSON_AddItemToObject(root, k, dup)) fail("out of memory");
        snprintf(applied + strlen(applied), sizeof applied - strlen(applied), "%s%s", applied[0] ? ", " : "", k);
    }
    char label[2600];
    snprintf(label, sizeof label, "%s with %s (%s)", path, key, where);
    read_root(label, root, c);
    cJSON_Delete(root);
    // A shape key read through another (head_dim's default follows hidden_size) cannot change
    // here, since those keys are refused above; this keeps it so if the list ever grows.
    if (!model_config_same_shape(c, &before))
        fail("%s: %s changes the model's shape, which the weights of %s fix", where, key, path);
    if (applied[0] && notes)
        printf("note: %s: %s sets %s on %s before the model is built (the saved config.json has them)\n", where, key,
               applied, path);
}

void hf_override_rope(const char *where, const char *json, ModelConfig *c) {
    cJSON *r = cJSON_Parse(json);
    if (!cJSON_IsObject(r)) fail("%s: rope_scaling must be a mapping", where);
    c->rope_type = ROPE_DEFAULT;
    c->rope_factor = 1.0;
    c->rope_has_attention_factor = 0;
    c->rope_original_max_position_embeddings = 0;
    if (family_of(c)->fused) read_longrope(where, r, c);  // Phi-3: longrope only
    else read_rope(where, r, "rope_scaling", c);
    cJSON_Delete(r);
}

// Floats are written as Python would (shortest round-trip digits, always with a '.' or an
// exponent): transformers warns when llama3 rope factors are not floats, and 1e-5f must not
// come out as its double expansion 9.99999974737875e-06.
static cJSON *real_item(double v, int single) {
    if (!isfinite(v)) return cJSON_CreateNull();
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
    return cJSON_CreateRaw(s);
}

static cJSON *add_real(cJSON *o, const char *key, double v, int single) {
    cJSON *item = real_item(v, single);
    if (item && !cJSON_AddItemToObject(o, key, item)) {
        cJSON_Delete(item);
        return NULL;
    }
    return item;
}

// config.json's object for *c (a Gemma 3 multimodal model's text_config), or NULL (ENOMEM).
static cJSON *config_json(const ModelConfig *c) {
    const char *mt = c->model_type[0] ? c->model_type : "llama";
    const ModelFamily *fam = family_of(c);
    const char *arch = fam->architecture;
    cJSON *o = cJSON_CreateObject();
    if (!o) { errno = ENOMEM; return NULL; }
    int built = 1;  // cJSON returns NULL/false on out-of-memory; any miss means no file
#define ADD(x) built &= (x) != 0
    cJSON *archs = cJSON_AddArrayToObject(o, "architectures");
    char seqcls[80];
    if (c->num_labels) family_classifier_name(fam, c->token_cls ? "Token" : "Sequence", seqcls, sizeof seqcls), arch = seqcls;
    ADD(archs && cJSON_AddItemToArray(archs, cJSON_CreateString(arch)));
    if (c->num_labels) {  // transformers' id2label / label2id for num_labels outputs: LABEL_i
        cJSON *i2l = cJSON_AddObjectToObject(o, "id2label"), *l2i = cJSON_AddObjectToObject(o, "label2id");
        ADD(i2l && l2i);
        for (int i = 0; i < c->num_labels && i2l && l2i; i++) {
            char k[16], v[24];
            snprintf(k, sizeof k, "%d", i), snprintf(v, sizeof v, "LABEL_%d", i);
            ADD(cJSON_AddStringToObject(i2l, k, v));
            ADD(cJSON_AddNumberToObject(l2i, v, i));
        }
    }
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
    } else if (c->rope_type == ROPE_LINEAR) {
        cJSON *r = cJSON_AddObjectToObject(o, "rope_scaling");
        ADD(r);
        if (r) {
            ADD(cJSON_AddStringToObject(r, "rope_type", "linear"));
            ADD(add_real(r, "factor", c->rope_factor, 0));
        }
    } else if (c->rope_type == ROPE_YARN) {
        cJSON *r = cJSON_AddObjectToObject(o, "rope_scaling");
        ADD(r);
        if (r) {  // the keys the file gave, as read
            const int k = c->rope_yarn_keys;
            ADD(cJSON_AddStringToObject(r, "rope_type", "yarn"));
            ADD(add_real(r, "factor", c->rope_factor, 0));
            if (k & YARN_ORIG)
                ADD(cJSON_AddNumberToObject(r, "original_max_position_embeddings", c->rope_original_max_position_embeddings));
            if (k & YARN_BETA_FAST) ADD(add_real(r, "beta_fast", c->rope_beta_fast, 0));
            if (k & YARN_BETA_SLOW) ADD(add_real(r, "beta_slow", c->rope_beta_slow, 0));
            if (k & YARN_MSCALE) ADD(add_real(r, "mscale", c->rope_mscale, 0));
            if (k & YARN_MSCALE_ALL) ADD(add_real(r, "mscale_all_dim", c->rope_mscale_all_dim, 0));
            if (k & YARN_TRUNCATE) ADD(cJSON_AddBoolToObject(r, "truncate", c->rope_truncate));
            if (c->rope_has_attention_factor) ADD(add_real(r, "attention_factor", c->rope_attention_factor, 0));
        }
    } else if (c->rope_type == ROPE_LONGROPE) {
        cJSON *r = cJSON_AddObjectToObject(o, "rope_scaling");
        ADD(r);
        if (r) {
            ADD(cJSON_AddStringToObject(r, "type", "longrope"));
            for (int k = 0; k < 2; k++) {
                cJSON *l = cJSON_AddArrayToObject(r, k ? "long_factor" : "short_factor");
                ADD(l);
                for (int i = 0; l && i < rope_dims(c) / 2; i++)
                    ADD(cJSON_AddItemToArray(l, real_item(k ? c->rope_long_factor[i] : c->rope_short_factor[i], 1)));
            }
            if (c->rope_has_attention_factor) ADD(add_real(r, "attention_factor", c->rope_attention_factor, 0));
        }
    } else {
        ADD(cJSON_AddNullToObject(o, "rope_scaling"));
    }
    ADD(cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings));
    ADD(cJSON_AddBoolToObject(o, "attention_bias", c->attention_bias));
    ADD(cJSON_AddBoolToObject(o, "mlp_bias", 0));
    ADD(add_real(o, "attention_dropout", 0.0, 0));
    if (fam->fused) {  // Phi-3's keys as read (dropouts are 0 here)
        ADD(add_real(o, "resid_pdrop", 0.0, 0));
        ADD(add_real(o, "embd_pdrop", 0.0, 0));
        ADD(add_real(o, "partial_rotary_factor", c->partial_rotary_factor > 0 ? c->partial_rotary_factor : 1.0, 0));
        if (c->original_max_position_embeddings > 0)
            ADD(cJSON_AddNumberToObject(o, "original_max_position_embeddings", c->original_max_position_embeddings));
    }
    // The window keys are written back as read, so the saved model attends as the loaded one did.
    if (fam->window != WIN_NONE) {
        if (c->sliding_window) ADD(cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window));
        else ADD(cJSON_AddNullToObject(o, "sliding_window"));
    }
    if (fam->window == WIN_QWEN) {
        ADD(cJSON_AddBoolToObject(o, "use_sliding_window", c->use_sliding_window));
        ADD(cJSON_AddNumberToObject(o, "max_window_layers", c->max_window_layers));
    }
    if (fam->gelu_mlp) {  // both activation keys, so that every transformers version reads the one used
        ADD(cJSON_AddStringToObject(o, "hidden_act", c->gelu_exact ? "gelu" : "gelu_pytorch_tanh"));
        ADD(cJSON_AddStringToObject(o, "hidden_activation", c->gelu_exact ? "gelu" : "gelu_pytorch_tanh"));
    }
    if (fam->gelu_mlp && fam->window == WIN_PATTERN) {  // the Gemma 2/3 keys as read (the others are their defaults: causal)
        ADD(cJSON_AddNumberToObject(o, "query_pre_attn_scalar", c->query_pre_attn_scalar));
        if (c->attn_softcap > 0) ADD(add_real(o, "attn_logit_softcapping", c->attn_softcap, 0));
        else ADD(cJSON_AddNullToObject(o, "attn_logit_softcapping"));
        if (c->final_softcap > 0) ADD(add_real(o, "final_logit_softcapping", c->final_softcap, 0));
        else ADD(cJSON_AddNullToObject(o, "final_logit_softcapping"));
        if (c->rope_local_theta > 0) {  // Gemma 3's; Gemma 2 has one RoPE and its pattern fixed
            ADD(add_real(o, "rope_local_base_freq", c->rope_local_theta, 0));
            ADD(cJSON_AddNumberToObject(o, "sliding_window_pattern", c->sliding_pattern));
        }
        cJSON *lt = cJSON_AddArrayToObject(o, "layer_types");
        ADD(lt);
        for (int l = 0; lt && l < c->num_hidden_layers; l++)
            ADD(cJSON_AddItemToArray(lt, cJSON_CreateString(family_layer_sliding(c, l) ? "sliding_attention" : "full_attention")));
    }
    if (!fam->gelu_mlp) ADD(cJSON_AddStringToObject(o, "hidden_act", "silu"));
    ADD(cJSON_AddStringToObject(o, "torch_dtype", c->torch_dtype[0] ? c->torch_dtype : "float32"));
    ADD(add_real(o, "initializer_range", c->initializer_range > 0 ? c->initializer_range : 0.02, 1));
    ADD(cJSON_AddBoolToObject(o, "use_cache", 1));
    if (c->bos_token_id >= 0) ADD(cJSON_AddNumberToObject(o, "bos_token_id", c->bos_token_id));
    // Absent would mean the family's default (Phi-3: 32000), so none is written as null there.
    if (c->pad_token_id >= 0) ADD(cJSON_AddNumberToObject(o, "pad_token_id", c->pad_token_id));
    else if (fam->pad_token_id >= 0) ADD(cJSON_AddNullToObject(o, "pad_token_id"));
    if (c->eos_is_list) {
        cJSON *e = cJSON_AddArrayToObject(o, "eos_token_id");
        ADD(e);
        for (int i = 0; e && i < c->n_eos; i++) ADD(cJSON_AddItemToArray(e, cJSON_CreateNumber(c->eos_ids[i])));
    } else if (c->eos_token_id >= 0) {
        ADD(cJSON_AddNumberToObject(o, "eos_token_id", c->eos_token_id));
    }

#undef ADD
    if (!built) cJSON_Delete(o), errno = ENOMEM;
    return built ? o : NULL;
}

// Writes o as path (synced); -1 with errno set on failure.
static int write_config(const char *path, const cJSON *o) {
    char *text = cJSON_Print(o);
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

int hf_write_config(const char *path, const ModelConfig *c, const char *mm_base) {
    cJSON *o = config_json(c);
    if (!o) return -1;
    if (c->multimodal) {  // the base's config.json with this text_config (vision_config and the rest as they were)
        char bpath[4096];
        snprintf(bpath, sizeof bpath, "%s/config.json", mm_base ? mm_base : "");
        cJSON *root = mm_base ? json_read_file(bpath) : NULL;
        cJSON_DeleteItemFromObjectCaseSensitive(o, "architectures");
        cJSON_DeleteItemFromObjectCaseSensitive(o, "torch_dtype");
        const char *dt = c->torch_dtype[0] ? c->torch_dtype : "float32";
        cJSON_DeleteItemFromObjectCaseSensitive(root, "torch_dtype");
        cJSON_DeleteItemFromObjectCaseSensitive(root, "text_config");
        if (!root || !cJSON_AddStringToObject(root, "torch_dtype", dt) || !cJSON_AddItemToObject(root, "text_config", o)) {
            cJSON_Delete(root), cJSON_Delete(o);
            errno = mm_base ? ENOMEM : EINVAL;
            return -1;
        }
        o = root;
    }
    int rc = write_config(path, o);
    cJSON_Delete(o);
    return rc;
}
