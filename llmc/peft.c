// peft.c: see peft.h. The matching rules follow peft 0.11's check_target_module_exists and
// LoraConfig checks, read from its source and written again here.
#include "peft.h"
#include <ctype.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "family.h"
#include "util.h"

// The Hugging Face module tree PEFT walks, per architecture: the modules that can carry an
// adapter in every layer (the LORA_* bits each one stands for), and the other modules a target
// could match. GPT-2 is GPT2LMHeadModel: Conv1D modules, c_attn one module over q, k and v, and
// the short name c_proj shared by the attention and MLP output projections.
typedef struct {
    const char *suffix;  // after the layer's prefix
    int mask;            // LORA_* bits
    const char *label;   // in messages and in a written target_modules list
} AdaptedModule;

typedef struct {
    const char *layer_fmt;                 // a layer's module prefix
    const char *pattern;                   // PEFT's layers_pattern for it
    const AdaptedModule *mods;
    int nmods;
    const char *const *outside;            // modules outside the layers
    int noutside;
    const char *const *inside;             // a layer's other modules (suffixes; "" the layer)
    int ninside;
    const char *what;                      // the adaptable modules, for messages
} ModuleTree;

static const AdaptedModule LLAMA_MODS[] = {
    {"self_attn.q_proj", 1 << LORA_Q, "q_proj"},       {"self_attn.k_proj", 1 << LORA_K, "k_proj"},
    {"self_attn.v_proj", 1 << LORA_V, "v_proj"},       {"self_attn.o_proj", 1 << LORA_O, "o_proj"},
    {"mlp.gate_proj", 1 << LORA_GATE, "gate_proj"},    {"mlp.up_proj", 1 << LORA_UP, "up_proj"},
    {"mlp.down_proj", 1 << LORA_DOWN, "down_proj"}};
static const char *const LLAMA_OUTSIDE[] = {"lm_head", "model.embed_tokens", "model.norm", "model.rotary_emb",
                                            "model", "model.layers"};
static const char *const LLAMA_INSIDE[] = {"", ".self_attn", ".mlp", ".mlp.act_fn", ".input_layernorm",
                                           ".post_attention_layernorm", ".self_attn.rotary_emb",
                                           ".self_attn.q_norm", ".self_attn.k_norm"};
// Gemma3ForCausalLM: Llama's projections; the sandwich norms and the sliding layers' RoPE too.
static const char *const GEMMA3_OUTSIDE[] = {"lm_head", "model.embed_tokens", "model.norm", "model.rotary_emb",
                                             "model.rotary_emb_local", "model", "model.layers"};
static const char *const GEMMA2_OUTSIDE[] = {"lm_head", "model.embed_tokens", "model.norm", "model.rotary_emb", "model",
                                             "model.layers"};
// Both Gemmas' layers (Gemma 2's without the last two, its q/k norms).
static const char *const GEMMA3_INSIDE[] = {"", ".self_attn", ".mlp", ".mlp.act_fn", ".input_layernorm",
                                            ".post_attention_layernorm", ".pre_feedforward_layernorm",
                                            ".post_feedforward_layernorm", ".self_attn.q_norm", ".self_attn.k_norm"};
// Gemma3ForConditionalGeneration (transformers >= 4.52): the text model is model.language_model;
// the vision tower's modules are not in this tree (not loaded here).
static const char *const GEMMA3_MM_OUTSIDE[] = {"lm_head", "model", "model.language_model",
                                                "model.language_model.embed_tokens", "model.language_model.norm",
                                                "model.language_model.rotary_emb", "model.language_model.rotary_emb_local",
                                                "model.language_model.layers", "model.vision_tower",
                                                "model.multi_modal_projector"};
static const AdaptedModule PHI3_MODS[] = {  // qkv_proj and gate_up_proj: one adapter each
    {"self_attn.qkv_proj", 1 << LORA_Q | 1 << LORA_K | 1 << LORA_V, "qkv_proj"},
    {"self_attn.o_proj", 1 << LORA_O, "o_proj"},
    {"mlp.gate_up_proj", 1 << LORA_GATE | 1 << LORA_UP, "gate_up_proj"},
    {"mlp.down_proj", 1 << LORA_DOWN, "down_proj"}};
static const AdaptedModule GPT2_MODS[] = {
    {"attn.c_attn", 1 << LORA_Q | 1 << LORA_K | 1 << LORA_V, "c_attn"}, {"attn.c_proj", 1 << LORA_O, "attn.c_proj"},
    {"mlp.c_fc", 1 << LORA_UP, "c_fc"}, {"mlp.c_proj", 1 << LORA_DOWN, "mlp.c_proj"}};
static const char *const GPT2_OUTSIDE[] = {"lm_head", "transformer", "transformer.wte", "transformer.wpe",
                                           "transformer.drop", "transformer.h", "transformer.ln_f"};
static const char *const GPT2_INSIDE[] = {"", ".ln_1", ".attn", ".attn.attn_dropout", ".attn.resid_dropout",
                                          ".ln_2", ".mlp", ".mlp.act", ".mlp.dropout"};

static ModuleTree tree_of(const ModelConfig *c) {
#define N(a) (int)(sizeof a / sizeof *a)
    if (c->arch == ARCH_GPT2)
        return (ModuleTree){"transformer.h.%d", "h", GPT2_MODS, N(GPT2_MODS), GPT2_OUTSIDE, N(GPT2_OUTSIDE),
                            GPT2_INSIDE, N(GPT2_INSIDE), "c_attn/c_proj/c_fc modules"};
    if (family_of(c)->fused)
        return (ModuleTree){"model.layers.%d", "layers", PHI3_MODS, N(PHI3_MODS), LLAMA_OUTSIDE, N(LLAMA_OUTSIDE),
                            LLAMA_INSIDE, N(LLAMA_INSIDE) - 2, "qkv_proj/o_proj/gate_up_proj/down_proj projections (phi3)"};
    if (c->multimodal)
        return (ModuleTree){"model.language_model.layers.%d", "layers", LLAMA_MODS, N(LLAMA_MODS), GEMMA3_MM_OUTSIDE,
                            N(GEMMA3_MM_OUTSIDE), GEMMA3_INSIDE, N(GEMMA3_INSIDE),
                            "q/k/v/o/gate/up/down projections of the language model"};
    if (family_of(c)->sandwich && !family_of(c)->qk_norm)  // Gemma 2
        return (ModuleTree){"model.layers.%d", "layers", LLAMA_MODS, N(LLAMA_MODS), GEMMA2_OUTSIDE, N(GEMMA2_OUTSIDE),
                            GEMMA3_INSIDE, N(GEMMA3_INSIDE) - 2, "q/k/v/o/gate/up/down projections"};
    if (family_of(c)->sandwich)
        return (ModuleTree){"model.layers.%d", "layers", LLAMA_MODS, N(LLAMA_MODS), GEMMA3_OUTSIDE, N(GEMMA3_OUTSIDE),
                            GEMMA3_INSIDE, N(GEMMA3_INSIDE), "q/k/v/o/gate/up/down projections"};
    return (ModuleTree){"model.layers.%d", "layers", LLAMA_MODS, N(LLAMA_MODS), LLAMA_OUTSIDE, N(LLAMA_OUTSIDE),
                        LLAMA_INSIDE, family_of(c)->qk_norm ? N(LLAMA_INSIDE) : N(LLAMA_INSIDE) - 2,
                        "q/k/v/o/gate/up/down projections"};
#undef N
}

// The short name PEFT matches a module by: its last part.
static const char *short_name(const AdaptedModule *a) {
    const char *dot = strrchr(a->suffix, '.');
    return dot ? dot + 1 : a->suffix;
}

static void module_name(char *out, size_t cap, const ModuleTree *mt, int layer, int i) {
    char prefix[48];
    snprintf(prefix, sizeof prefix, mt->layer_fmt, layer);
    snprintf(out, cap, "%s.%s", prefix, mt->mods[i].suffix);
}

static int ends_with_part(const char *name, const char *key) {
    size_t n = strlen(name), k = strlen(key);
    return k < n && name[n - k - 1] == '.' && !strcmp(name + n - k, key);
}

// ---- Python regular expressions as POSIX extended ones --------------------------------------
// PEFT matches a target_modules string with Python's re.fullmatch. Whether a whole name
// matches does not depend on greedy or lazy repetition, nor on a group capturing, so those
// translate; the classes \d \w \s (and their negations) become POSIX classes. What POSIX cannot
// say (lookaround, backreferences, inline flags, \b ...) is refused. Returns NULL when
// translated, else what was refused.
static const char *py_to_posix(const char *in, char *out, size_t cap) {
    size_t o = 0;
    int in_bracket = 0;
#define PUT(str)                                                          \
    do {                                                                  \
        size_t l_ = strlen(str);                                          \
        if (o + l_ + 1 > cap) return "the expression is too long";        \
        memcpy(out + o, str, l_), o += l_;                                \
    } while (0)
    for (const char *p = in; *p; p++) {
        char c[2] = {*p, 0};
        if (*p == '\\') {
            char e = p[1];
            if (!e) return "a trailing backslash";
            p++;
            const char *cls = NULL, *neg = NULL;
            if (e == 'd') cls = "0-9";
            else if (e == 'w') cls = "[:alnum:]_";
            else if (e == 's') cls = "[:space:]";
            else if (e == 'D') neg = "0-9";
            else if (e == 'W') neg = "[:alnum:]_";
            else if (e == 'S') neg = "[:space:]";
            if (in_bracket) {
                if (cls) { PUT(cls); continue; }
                if (e == '.' || e == '_' || e == '|' || e == '*' || e == '+' || e == '?' || e == '(' ||
                    e == ')' || e == '{' || e == '}' || e == '$') { char s[2] = {e, 0}; PUT(s); continue; }
                return "an escape inside [...] that POSIX brackets cannot hold";
            }
            if (cls) { PUT("["); PUT(cls); PUT("]"); continue; }
            if (neg) { PUT("[^"); PUT(neg); PUT("]"); continue; }
            if (isalnum((unsigned char)e)) return "a backslash escape other than \\d \\w \\s \\D \\W \\S";
            char s[3] = {'\\', e, 0};
            PUT(s);
            continue;
        }
        if (in_bracket) {
            if (*p == ']' && !(p[-1] == '[' || (p[-1] == '^' && p[-2] == '['))) in_bracket = 0;
            PUT(c);
            continue;
        }
        if (*p == '[') { in_bracket = 1; PUT(c); continue; }
        if (*p == '(' && p[1] == '?') {
            if (p[2] == ':') { PUT("("); p += 2; continue; }
            if (p[2] == 'P' && p[3] == '<') {  // named group: a plain group for matching
                const char *q = strchr(p, '>');
                if (!q) return "an unterminated (?P<name>";
                PUT("(");
                p = q;
                continue;
            }
            return "a (?...) construct (lookaround or inline flags)";
        }
        // Lazy or possessive repetition: the same language under fullmatch.
        if ((*p == '?' || *p == '+') && p > in && (p[-1] == '*' || p[-1] == '+' || p[-1] == '?' || p[-1] == '}') &&
            !(p - 1 > in && p[-2] == '\\'))
            continue;
        PUT(c);
    }
#undef PUT
    if (in_bracket) return "an unterminated [";
    out[o] = 0;
    return NULL;
}

// ---- the selection ----------------------------------------------------------------------------

typedef struct {
    const PeftKeys *k;
    const ModuleTree *mt;
    const cJSON *list;     // target_modules as names
    int linear;            // + every adaptable module's short name (all-linear, lora_target_linear)
    regex_t re;            // target_modules as a regular expression
    int is_re;
    const cJSON *ltt, *lp; // layers_to_transform, layers_pattern (NULL when unused)
} Sel;

// PEFT's layer index of a module name: after one of the layers_pattern names
// (".*\.{pattern}\.(\d+)\."), or without patterns after any part (".*\.[^.]*\.(\d+)\."):
// the last "<part>.<digits>." that has a dot before it. -1 when there is none.
static long layer_index_of(const char *name, const cJSON *lp) {
    long found = -1;
    for (const char *p = strchr(name, '.'); p; p = strchr(p + 1, '.')) {
        // p: a dot; the part after it runs to the next dot, then digits, then a dot.
        const char *part = p + 1, *dot = strchr(part, '.');
        if (!dot) break;
        const char *d = dot + 1, *e = d;
        while (isdigit((unsigned char)*e)) e++;
        if (e == d || *e != '.') continue;
        int ok = 0;
        if (!lp) ok = 1;
        else {
            const cJSON *pat = cJSON_IsArray(lp) ? lp->child : lp;
            for (; pat; pat = cJSON_IsArray(lp) ? pat->next : NULL)
                if (strlen(pat->valuestring) == (size_t)(dot - part) && !strncmp(part, pat->valuestring, dot - part))
                    ok = 1;
        }
        if (ok) found = strtol(d, NULL, 10);
    }
    return found;
}

static int in_layers(const cJSON *ltt, long index) {
    if (cJSON_IsNumber(ltt)) return index == ltt->valueint;
    const cJSON *e;
    cJSON_ArrayForEach(e, ltt) if (index == e->valueint) return 1;
    return 0;
}

static int selected(const Sel *s, const char *name) {
    if (s->is_re) return regexec(&s->re, name, 0, NULL, 0) == 0;
    const cJSON *e;
    if (s->list)
        cJSON_ArrayForEach(e, s->list) if (!strcmp(name, e->valuestring)) return 1;  // named exactly
    int found = 0;
    if (s->list) cJSON_ArrayForEach(e, s->list) found |= ends_with_part(name, e->valuestring);
    for (int i = 0; s->linear && i < s->mt->nmods; i++) found |= ends_with_part(name, short_name(&s->mt->mods[i]));
    if (found && s->ltt) {
        long i = layer_index_of(name, s->lp);
        found = i >= 0 && in_layers(s->ltt, i);
    }
    return found;
}

// PEFT's "not given": null, an empty list or an empty string.
static int empty(const cJSON *v) {
    if (!v || cJSON_IsNull(v)) return 1;
    if (cJSON_IsArray(v)) return v->child == NULL;
    return cJSON_IsString(v) && !v->valuestring[0];
}

static void sel_init(Sel *s, const PeftKeys *k, const ModuleTree *mt, const cJSON *tm, const cJSON *ltt,
                     const cJSON *lp, int linear, const ModelConfig *c) {
    const int L = c->num_hidden_layers;
    memset(s, 0, sizeof *s);
    s->k = k;
    s->mt = mt;
    s->linear = linear;
    int regex = cJSON_IsString(tm) && strcmp(tm->valuestring, "all-linear");
    if (cJSON_IsString(tm) && !regex) s->linear = 1;
    if (cJSON_IsString(tm) && ltt && !cJSON_IsNull(ltt))
        fail("%s: %s cannot be used with %s given as a string ('%s'); PEFT refuses it too (give %s as a "
             "list of names)", k->src, k->ltt, k->tm, tm->valuestring, k->tm);
    if (cJSON_IsString(tm) && lp && !cJSON_IsNull(lp))
        fail("%s: %s cannot be used with %s given as a string ('%s'); PEFT refuses it too", k->src, k->lp,
             k->tm, tm->valuestring);
    if (cJSON_IsArray(tm)) {
        const cJSON *e;
        cJSON_ArrayForEach(e, tm) if (!cJSON_IsString(e)) fail("%s: %s holds a non-string", k->src, k->tm);
        s->list = tm;
    } else if (regex) {
        char posix[4096], anchored[4200];
        const char *why = py_to_posix(tm->valuestring, posix, sizeof posix);
        if (why) fail("%s: %s regex '%s' has %s, which this trainer cannot match", k->src, k->tm, tm->valuestring, why);
        why = regex_too_complex(posix);
        if (why) fail("%s: %s regex '%s' has %s, which this trainer does not compile", k->src, k->tm, tm->valuestring, why);
        snprintf(anchored, sizeof anchored, "^(%s)$", posix);
        if (regcomp(&s->re, anchored, REG_EXTENDED | REG_NOSUB) != 0)
            fail("%s: %s regex '%s' is not a regular expression this trainer reads (POSIX extended with "
                 "Python's \\d \\w \\s)", k->src, k->tm, tm->valuestring);
        s->is_re = 1;
    } else if (!cJSON_IsString(tm)) {
        fail("%s: %s must be a list of names, a regex string or \"all-linear\"", k->src, k->tm);
    }
    if (!empty(ltt)) {
        const cJSON *e = cJSON_IsArray(ltt) ? ltt->child : ltt;
        if (!cJSON_IsArray(ltt) && !cJSON_IsNumber(ltt))
            fail("%s: %s must be a layer index or a list of them", k->src, k->ltt);
        for (; e; e = cJSON_IsArray(ltt) ? e->next : NULL)
            if (!cJSON_IsNumber(e) || e->valuedouble != (double)e->valueint || e->valueint < 0 || e->valueint >= L)
                fail("%s: %s holds %s%g, not a layer index in [0, %d)", k->src, k->ltt,
                     cJSON_IsNumber(e) ? "" : "a non-number ", cJSON_IsNumber(e) ? e->valuedouble : 0.0, L);
        s->ltt = ltt;
        if (!empty(lp)) {
            const cJSON *pat = cJSON_IsArray(lp) ? lp->child : lp;
            if (!cJSON_IsArray(lp) && !cJSON_IsString(lp))
                fail("%s: %s must be a name or a list of names", k->src, k->lp);
            for (; pat; pat = cJSON_IsArray(lp) ? pat->next : NULL) {
                int plain = cJSON_IsString(pat) && pat->valuestring[0];
                for (const char *q = plain ? pat->valuestring : ""; *q; q++)
                    if (!isalnum((unsigned char)*q) && *q != '_') plain = 0;
                if (!plain)
                    fail("%s: %s holds %s; only plain module names (such as \"layers\") are implemented", k->src,
                         k->lp, cJSON_IsString(pat) ? pat->valuestring : "a non-string");
            }
            s->lp = lp;
        }
    }
}

static void sel_free(Sel *s) {
    if (s->is_re) regfree(&s->re);
}

void peft_select(const PeftKeys *k, const cJSON *tm, const cJSON *ltt, const cJSON *lp, int lora_linear,
                 const ModelConfig *c, LoraConfig *lc) {
    const int L = c->num_hidden_layers;
    const ModuleTree mt = tree_of(c);
    if (!tm || cJSON_IsNull(tm)) {
        if (!lora_linear) fail("%s: %s is missing", k->src, k->tm);
        tm = NULL;
    }
    Sel s;
    static const cJSON empty_list = {.type = cJSON_Array};
    sel_init(&s, k, &mt, tm ? tm : &empty_list, ltt, lp, lora_linear, c);
    // Modules of the Hugging Face model that cannot carry an adapter here: PEFT would adapt
    // lm_head and the embeddings (which this trainer cannot) or fail on the rest.
    char name[160], prefix[48];
    for (int i = 0; i < mt.noutside; i++)
        if (selected(&s, mt.outside[i]))
            fail("%s: %s selects '%s'; only the decoder layers' %s can carry adapters", k->src, k->tm,
                 mt.outside[i], mt.what);
    lc->targets = 0;
    int first = -1, uniform = 1;
    if (L > LORA_MAX_LAYERS) lc->per_layer = 0;
    for (int l = 0; l < L; l++) {
        snprintf(prefix, sizeof prefix, mt.layer_fmt, l);
        for (int i = 0; i < mt.ninside; i++) {
            snprintf(name, sizeof name, "%s%s", prefix, mt.inside[i]);
            if (selected(&s, name))
                fail("%s: %s selects '%s', which is not one of the %s", k->src, k->tm, name, mt.what);
        }
        int m = 0;
        for (int i = 0; i < mt.nmods; i++) {
            module_name(name, sizeof name, &mt, l, i);
            if (selected(&s, name)) m |= mt.mods[i].mask;
        }
        if (first < 0) first = m;
        if (m != first) uniform = 0;
        if (!uniform && L > LORA_MAX_LAYERS)
            fail("%s: %s / %s select different projections in different layers, which is implemented for "
                 "models of up to %d layers (this one has %d)", k->src, k->tm, k->ltt, LORA_MAX_LAYERS, L);
        if (l < LORA_MAX_LAYERS) lc->layer_targets[l] = (unsigned char)m;
        lc->targets |= m;
    }
    if (k->strict && s.list) {
        const cJSON *e;
        cJSON_ArrayForEach(e, s.list) {
            int hit = 0;
            for (int l = 0; l < L && !hit; l++)
                for (int i = 0; i < mt.nmods && !hit; i++) {
                    module_name(name, sizeof name, &mt, l, i);
                    hit = !strcmp(name, e->valuestring) || ends_with_part(name, e->valuestring);
                }
            if (!hit) {
                char known[200] = "";
                for (int i = 0; i < mt.nmods; i++)
                    if (!strstr(known, short_name(&mt.mods[i])))
                        snprintf(known + strlen(known), sizeof known - strlen(known), "%s, ", short_name(&mt.mods[i]));
                module_name(name, sizeof name, &mt, 0, 0);
                fail("%s: %s: unknown module '%s' (expected one of %sor a full path such as %s)", k->src, k->tm,
                     e->valuestring, known, name);
            }
        }
    }
    sel_free(&s);
    lc->per_layer = !uniform;
    if (!lc->targets) fail("%s: %s matches no %s of this model", k->src, k->tm,
                           c->arch == ARCH_GPT2 ? "adaptable module" : "projection");
}

// Options whose non-default value trains or merges something this trainer does not.
// fan_in_fan_out says how the adapted layers store their weights: GPT-2's Conv1D modules
// ([in, out]) need true, and PEFT sets it true for them whatever the file says; Llama's
// nn.Linear modules ([out, in]) take false here.
static void refuse_unsupported(const char *path, const cJSON *o, const ModelConfig *c) {
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(o, "peft_type")) &&
        (!cJSON_IsString(v) || strcmp(v->valuestring, "LORA")))
        fail("%s: peft_type must be \"LORA\" (the only adapter type implemented)", path);
    static const char *const true_refused[] = {"use_dora", "lora_bias"};
    for (size_t i = 0; i < sizeof true_refused / sizeof *true_refused; i++)
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, true_refused[i])))
            fail("%s: '%s': true is not supported (this trainer implements plain LoRA)", path, true_refused[i]);
    if (c->arch != ARCH_GPT2 && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "fan_in_fan_out")))
        fail("%s: 'fan_in_fan_out': true is not supported (this model's projections are nn.Linear-layout "
             "weights; true is for Conv1D layers such as GPT-2's)", path);
    static const char *const nonempty_refused[] = {"alpha_pattern", "rank_pattern", "layer_replication",
                                                  "target_parameters"};
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

const char *peft_module_to_save(LoraConfig *lc, const ModelConfig *c, const char *name) {
    if (c->arch == ARCH_GPT2) return "training GPT-2's embeddings beside the adapters is not implemented";
    if (c->num_labels) {  // a classifier: its head is score (PEFT's SEQ_CLS and TOKEN_CLS add classifier and score)
        if (!strcmp(name, "score")) lc->save_head = 1;
        else if (!strcmp(name, "lm_head")) return "a reward model has no lm_head (its head, score, trains anyway)";
        else if (strcmp(name, "classifier") && strcmp(name, "embed_tokens")) return "not supported (embed_tokens is)";
        if (!strcmp(name, "embed_tokens")) lc->save_embed = 1;
        return NULL;
    }
    if (!strcmp(name, "embed_tokens")) lc->save_embed = 1;
    else if (!strcmp(name, "lm_head")) lc->save_head = 1;
    else return "not supported (embed_tokens and lm_head are)";
    if (c->tie_word_embeddings)
        return "this model ties lm_head to embed_tokens, and PEFT would train a separate copy, untying them; "
               "that is not supported here";
    return NULL;
}

void peft_read_targets(const char *path, const cJSON *o, const ModelConfig *c, LoraConfig *lc) {
    refuse_unsupported(path, o, c);
    // modules_to_save: whole modules trained beside the adapters (PEFT matches the names as
    // suffixes of module paths); this program can hold the embedding and an untied head.
    lc->save_embed = lc->save_head = 0;
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(o, "modules_to_save"), *e;
    if (ms && !cJSON_IsNull(ms) && !cJSON_IsArray(ms))
        fail("%s: 'modules_to_save' must be a list of module names or null", path);
    cJSON_ArrayForEach(e, ms) {
        const char *n = cJSON_IsString(e) ? e->valuestring : "";
        const char *why = peft_module_to_save(lc, c, strcmp(n, "model.embed_tokens") ? n : "embed_tokens");
        if (why) fail("%s: 'modules_to_save' entry '%s': %s", path, n, why);
    }
    const PeftKeys k = {path, "target_modules", "layers_to_transform", "layers_pattern", 0};
    peft_select(&k, cJSON_GetObjectItemCaseSensitive(o, "target_modules"),
                cJSON_GetObjectItemCaseSensitive(o, "layers_to_transform"),
                cJSON_GetObjectItemCaseSensitive(o, "layers_pattern"), 0, c, lc);
}

void peft_target_names(const ModelConfig *c, int mask, char *out, size_t cap) {
    const ModuleTree mt = tree_of(c);
    out[0] = 0;
    for (int i = 0; i < mt.nmods; i++)
        if ((mask & mt.mods[i].mask) == mt.mods[i].mask)
            snprintf(out + strlen(out), cap - strlen(out), "%s%s", out[0] ? "," : "", mt.mods[i].label);
    if (!out[0]) snprintf(out, cap, "none");
}

void peft_describe_difference(const LoraConfig *a, const LoraConfig *b, const ModelConfig *c, char *out, size_t cap) {
    out[0] = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        int ma = lora_layer_targets(a, l), mb = lora_layer_targets(b, l);
        if (ma == mb) continue;
        char na[160], nb[160];
        peft_target_names(c, ma, na, sizeof na);
        peft_target_names(c, mb, nb, sizeof nb);
        snprintf(out, cap, "layer %d: %s vs %s", l, na, nb);
        return;
    }
}

// The names of a target_modules list for the modules in mask (the same in every listed layer):
// short names, but a suffix that tells them apart where two modules share a short name and only
// one is adapted (GPT-2's attn.c_proj, mlp.c_proj).
static int add_target_names(cJSON *tm, const ModuleTree *mt, int mask) {
    int ok = 1;
    for (int i = 0; i < mt->nmods; i++) {
        if ((mask & mt->mods[i].mask) != mt->mods[i].mask) continue;
        const char *name = short_name(&mt->mods[i]);
        int shared_all = 1, first = 1;
        for (int j = 0; j < mt->nmods; j++)
            if (!strcmp(short_name(&mt->mods[j]), name)) {
                if ((mask & mt->mods[j].mask) != mt->mods[j].mask) shared_all = 0;
                else if (j < i) first = 0;
            }
        if (!shared_all) name = mt->mods[i].suffix;
        else if (!first) continue;  // already listed by its short name
        ok &= cJSON_AddItemToArray(tm, cJSON_CreateString(name)) != 0;
    }
    return ok;
}

cJSON *peft_adapter_config(const LoraConfig *lc, const ModelConfig *c, const char *base_model) {
    const int L = c->num_hidden_layers;
    // The form of target_modules: every layer alike, one set on some layers, or full paths.
    int common = 0, same = 1;
    for (int l = 0; l < L; l++) {
        int m = lora_layer_targets(lc, l);
        if (m && common && m != common) same = 0;
        if (m) common = m;
    }
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    int ok = 1;
#define ADD(x) ok &= (x) != 0
    ADD(cJSON_AddStringToObject(o, "peft_type", "LORA"));
    ADD(cJSON_AddStringToObject(o, "task_type", c->token_cls ? "TOKEN_CLS" : c->num_labels ? "SEQ_CLS" : "CAUSAL_LM"));
    ADD(cJSON_AddStringToObject(o, "base_model_name_or_path", base_model ? base_model : ""));
    ADD(cJSON_AddNullToObject(o, "revision"));
    ADD(cJSON_AddBoolToObject(o, "inference_mode", 1));
    ADD(cJSON_AddNumberToObject(o, "r", lc->r));
    cJSON *tm = cJSON_AddArrayToObject(o, "target_modules");
    ADD(tm);
    char name[160];
    const ModuleTree mt = tree_of(c);
    if (!lc->per_layer || same) {
        if (tm) ADD(add_target_names(tm, &mt, lc->targets));
    } else {
        for (int l = 0; tm && l < L; l++)
            for (int i = 0; i < mt.nmods; i++)
                if ((lora_layer_targets(lc, l) & mt.mods[i].mask) == mt.mods[i].mask) {
                    module_name(name, sizeof name, &mt, l, i);
                    ADD(cJSON_AddItemToArray(tm, cJSON_CreateString(name)));
                }
    }
    ADD(cJSON_AddNumberToObject(o, "lora_alpha", lc->alpha));
    ADD(cJSON_AddNumberToObject(o, "lora_dropout", lc->dropout));
    ADD(cJSON_AddBoolToObject(o, "fan_in_fan_out", c->arch == ARCH_GPT2));  // Conv1D: [in, out] weights
    ADD(cJSON_AddStringToObject(o, "bias", "none"));
    ADD(cJSON_AddBoolToObject(o, "use_rslora", lc->rslora));
    if (lc->save_embed || lc->save_head) {
        cJSON *ms = cJSON_AddArrayToObject(o, "modules_to_save");
        ADD(ms);
        if (ms && lc->save_embed) ADD(cJSON_AddItemToArray(ms, cJSON_CreateString("embed_tokens")));
        if (ms && lc->save_head && c->num_labels) {  // as PEFT writes a SEQ_CLS adapter's list
            ADD(cJSON_AddItemToArray(ms, cJSON_CreateString("classifier")));
            ADD(cJSON_AddItemToArray(ms, cJSON_CreateString("score")));
        } else if (ms && lc->save_head) {
            ADD(cJSON_AddItemToArray(ms, cJSON_CreateString("lm_head")));
        }
    } else {
        ADD(cJSON_AddNullToObject(o, "modules_to_save"));
    }
    ADD(cJSON_AddBoolToObject(o, "init_lora_weights", 1));
    if (lc->per_layer && same) {
        cJSON *ltt = cJSON_AddArrayToObject(o, "layers_to_transform");
        ADD(ltt);
        for (int l = 0; ltt && l < L; l++)
            if (lora_layer_targets(lc, l)) ADD(cJSON_AddItemToArray(ltt, cJSON_CreateNumber(l)));
        ADD(cJSON_AddStringToObject(o, "layers_pattern", mt.pattern));
    } else {
        ADD(cJSON_AddNullToObject(o, "layers_to_transform"));
        ADD(cJSON_AddNullToObject(o, "layers_pattern"));
    }
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
