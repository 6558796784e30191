// peft.c: see peft.h.
#include "peft.h"
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "util.h"

static const char *module_group(int t) { return t <= LORA_O ? "self_attn" : "mlp"; }

static void module_name(char *out, size_t cap, int layer, int t) {
    snprintf(out, cap, "model.layers.%d.%s.%s", layer, module_group(t), LORA_TARGET_NAMES[t]);
}

static int ends_with_part(const char *name, const char *key) {
    size_t n = strlen(name), k = strlen(key);
    return k < n && name[n - k - 1] == '.' && !strcmp(name + n - k, key);
}

// PEFT's check_target_module_exists for a list or a regex (re.fullmatch; POSIX extended
// syntax here, which covers the patterns PEFT's docs and Axolotl configs use).
typedef struct { const cJSON *list; regex_t re; int is_re; } Matcher;

static void matcher_init(Matcher *mt, const char *path, const cJSON *tm) {
    memset(mt, 0, sizeof *mt);
    if (cJSON_IsArray(tm)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, tm)
            if (!cJSON_IsString(e)) fail("%s: target_modules holds a non-string", path);
        mt->list = tm;
        return;
    }
    if (!cJSON_IsString(tm)) fail("%s: target_modules must be a list of names or a regex string", path);
    size_t n = strlen(tm->valuestring) + 8;
    char *anchored = xmalloc(n);
    snprintf(anchored, n, "^(%s)$", tm->valuestring);
    if (regcomp(&mt->re, anchored, REG_EXTENDED | REG_NOSUB) != 0)
        fail("%s: target_modules regex '%s' is not a POSIX extended regular expression", path,
             tm->valuestring);
    free(anchored);
    mt->is_re = 1;
}

static int matches(const Matcher *mt, const char *name) {
    if (mt->is_re) return regexec(&mt->re, name, 0, NULL, 0) == 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, mt->list)
        if (!strcmp(name, e->valuestring) || ends_with_part(name, e->valuestring)) return 1;
    return 0;
}

// Options whose non-default value trains or merges something this trainer does not.
static void refuse_unsupported(const char *path, const cJSON *o) {
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "peft_type")) &&
        (!cJSON_IsString(v) || strcmp(v->valuestring, "LORA")))
        fail("%s: peft_type must be \"LORA\" (the only adapter type implemented)", path);
    static const char *const true_refused[] = {"use_dora", "fan_in_fan_out", "lora_bias"};
    for (size_t i = 0; i < sizeof true_refused / sizeof *true_refused; i++)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, true_refused[i])))
            fail("%s: '%s': true is not supported (this trainer implements plain LoRA on "
                 "nn.Linear-layout weights)", path, true_refused[i]);
    static const char *const nonempty_refused[] = {"alpha_pattern", "rank_pattern", "modules_to_save",
                                                  "layer_replication", "target_parameters"};
    for (size_t i = 0; i < sizeof nonempty_refused / sizeof *nonempty_refused; i++) {
        v = cJSON_GetObjectItemCaseSensitive(o, nonempty_refused[i]);
        if (v && !cJSON_IsNull(v) && !((cJSON_IsObject(v) || cJSON_IsArray(v)) && !v->child))
            fail("%s: '%s' is not supported (one rank and alpha for every adapted module, no "
                 "other trained modules)", path, nonempty_refused[i]);
    }
    v = cJSON_GetObjectItemCaseSensitive(o, "bias");
    if (v && !cJSON_IsNull(v) && (!cJSON_IsString(v) || strcmp(v->valuestring, "none")))
        fail("%s: 'bias' must be \"none\" (trained biases, lora_only or all, are not supported)", path);
}

// The layers an adapter covers: layers_to_transform (an int or a list) or all of them.
static void covered_layers(const char *path, const cJSON *o, int L, char *on) {
    const cJSON *ltt = cJSON_GetObjectItemCaseSensitive(o, "layers_to_transform");
    memset(on, ltt && !cJSON_IsNull(ltt) ? 0 : 1, (size_t)L);
    if (!ltt || cJSON_IsNull(ltt)) return;
    const cJSON *e = cJSON_IsArray(ltt) ? ltt->child : ltt;
    for (; e; e = cJSON_IsArray(ltt) ? e->next : NULL) {
        if (!cJSON_IsNumber(e) || e->valuedouble != (double)e->valueint || e->valueint < 0 || e->valueint >= L)
            fail("%s: layers_to_transform holds %g, not a layer index in [0, %d)", path,
                 cJSON_IsNumber(e) ? e->valuedouble : -1.0, L);
        on[e->valueint] = 1;
    }
}

int peft_read_targets(const char *path, const cJSON *o, int L) {
    refuse_unsupported(path, o);
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(o, "target_modules");
    if (!tm || cJSON_IsNull(tm)) fail("%s: target_modules is missing", path);
    char *on = xmalloc((size_t)L);
    covered_layers(path, o, L, on);
    int all_linear = cJSON_IsString(tm) && !strcmp(tm->valuestring, "all-linear");
    Matcher mt;
    if (!all_linear) matcher_init(&mt, path, tm);
    // Modules this trainer cannot adapt must not match (PEFT would train them).
    static const char *const others[] = {"lm_head", "model.embed_tokens", "model.norm"};
    for (size_t i = 0; !all_linear && i < sizeof others / sizeof *others; i++)
        if (matches(&mt, others[i]))
            fail("%s: target_modules selects '%s'; only the decoder layers' q/k/v/o/gate/up/down "
                 "projections can carry adapters", path, others[i]);
    int mask = -1;
    char name[128];
    for (int l = 0; l < L; l++) {
        int m = 0;
        for (int t = 0; t < LORA_TARGETS; t++) {
            module_name(name, sizeof name, l, t);
            if (on[l] && (all_linear || matches(&mt, name))) m |= 1 << t;
        }
        if (mask >= 0 && m != mask)
            fail("%s: the adapter covers layer %d differently from layer 0 (target_modules / "
                 "layers_to_transform); every layer must carry the same projections", path, l);
        mask = m;
    }
    if (!all_linear && mt.is_re) regfree(&mt.re);
    free(on);
    if (mask <= 0) fail("%s: target_modules matches no projection of this model", path);
    return mask;
}

cJSON *peft_adapter_config(const LoraConfig *lc, const char *base_model) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int ok = 1;
#define ADD(x) ok &= (x) != 0
    ADD(cJSON_AddStringToObject(o, "peft_type", "LORA"));
    ADD(cJSON_AddStringToObject(o, "task_type", "CAUSAL_LM"));
    ADD(cJSON_AddStringToObject(o, "base_model_name_or_path", base_model ? base_model : ""));
    ADD(cJSON_AddNullToObject(o, "revision"));
    ADD(cJSON_AddBoolToObject(o, "inference_mode", 1));
    ADD(cJSON_AddNumberToObject(o, "r", lc->r));
    cJSON *tm = cJSON_AddArrayToObject(o, "target_modules");
    ADD(tm);
    for (int t = 0; tm && t < LORA_TARGETS; t++)
        if (lc->targets >> t & 1) ADD(cJSON_AddItemToArray(tm, cJSON_CreateString(LORA_TARGET_NAMES[t])));
    ADD(cJSON_AddNumberToObject(o, "lora_alpha", lc->alpha));
    ADD(cJSON_AddNumberToObject(o, "lora_dropout", lc->dropout));
    ADD(cJSON_AddBoolToObject(o, "fan_in_fan_out", 0));
    ADD(cJSON_AddStringToObject(o, "bias", "none"));
    ADD(cJSON_AddBoolToObject(o, "use_rslora", lc->rslora));
    ADD(cJSON_AddNullToObject(o, "modules_to_save"));
    ADD(cJSON_AddBoolToObject(o, "init_lora_weights", 1));
    ADD(cJSON_AddNullToObject(o, "layers_to_transform"));
    ADD(cJSON_AddNullToObject(o, "layers_pattern"));
    ADD(cJSON_AddObjectToObject(o, "rank_pattern"));
    ADD(cJSON_AddObjectToObject(o, "alpha_pattern"));
    ADD(cJSON_AddNullToObject(o, "megatron_config"));
    ADD(cJSON_AddStringToObject(o, "megatron_core", "megatron.core"));
    ADD(cJSON_AddObjectToObject(o, "loftq_config"));
    ADD(cJSON_AddBoolToObject(o, "use_dora", 0));
    ADD(cJSON_AddNullToObject(o, "layer_replication"));
#undef ADD
    if (!ok) { cJSON_Delete(o); return NULL; }
    return o;
}
