// family.c: see family.h. Sources of each row: transformers' configuration_* / modeling_*
// files for the family (defaults of absent keys, which projections have biases, q/k norms,
// which layers slide).
#include "family.h"
#include <stdio.h>
#include <string.h>

static const ModelFamily FAMILIES[] = {
    // Llama 2/3/3.1/3.2, SmolLM, TinyLlama: attention_bias biases all four projections.
    {"llama", "LlamaForCausalLM", BIAS_FROM_CONFIG, BIAS_FROM_CONFIG, 0, WIN_NONE, 0, 0, 0, 0, -1},
    // Mistral: no biases (the modeling code ignores attention_bias); sliding_window defaults to
    // 4096 when the key is absent, null turns it off, and it applies to every layer.
    {"mistral", "MistralForCausalLM", BIAS_NEVER, BIAS_NEVER, 0, WIN_ALL, 0, 4096, 0, 0, -1},
    // Qwen2/2.5: q/k/v always biased, o_proj never; window only with use_sliding_window.
    {"qwen2", "Qwen2ForCausalLM", BIAS_ALWAYS, BIAS_NEVER, 0, WIN_QWEN, 0, 4096, 28, 0, -1},
    // Qwen3: q_norm/k_norm, attention_bias (default false) on all four projections, head_dim
    // its own key (default 128).
    {"qwen3", "Qwen3ForCausalLM", BIAS_FROM_CONFIG, BIAS_FROM_CONFIG, 1, WIN_QWEN, 128, 4096, 28, 0, -1},
    // Phi-3 (mini/medium, Phi-4): Llama's block with q/k/v fused into qkv_proj and gate/up into
    // gate_up_proj in the files, no biases (attention_bias ignored), sliding_window on every
    // layer when set (absent: none; masking as Mistral's since transformers 4.45), and
    // pad_token_id 32000 when absent (Phi3Config's default).
    {"phi3", "Phi3ForCausalLM", BIAS_NEVER, BIAS_NEVER, 0, WIN_ALL, 0, 0, 0, 1, 32000},
    // Gemma 3 text (gemma-3-270m, -1b; Gemma3ForCausalLM): q/k norms, head_dim 256 by default,
    // sliding_window 4096 on five layers of six, pad_token_id 0, tied embeddings by default,
    // (1 + w) norms, GeGLU, scaled embeddings, sandwich norms (modeling_gemma3,
    // configuration_gemma3 of transformers 4.57).
    {"gemma3_text", "Gemma3ForCausalLM", BIAS_FROM_CONFIG, BIAS_FROM_CONFIG, 1, WIN_PATTERN, 256, 4096, 0, 0, 0,
     1, 1, 1, 1, 1},
    // Gemma 2 (gemma-2-2b/9b/27b; Gemma2ForCausalLM): Gemma 3's block without q/k norms, every
    // other layer sliding (4096) with the one RoPE, attention scores and logits soft-capped
    // (ModelConfig.attn_softcap/final_softcap; modeling_gemma2 of transformers 4.57).
    {"gemma2", "Gemma2ForCausalLM", BIAS_FROM_CONFIG, BIAS_FROM_CONFIG, 0, WIN_PATTERN, 256, 4096, 0, 0, 0,
     1, 1, 1, 1, 1},
    // Gemma 1 (gemma-2b/7b, 1.1, CodeGemma; GemmaForCausalLM): Llama's block with (1 + w) norms,
    // GeGLU (its GELU from the activation keys: hf.c) and scaled embeddings; head_dim 256 by
    // default, tied, pad_token_id 0, no window (modeling_gemma / configuration_gemma of 4.57).
    {"gemma", "GemmaForCausalLM", BIAS_FROM_CONFIG, BIAS_FROM_CONFIG, 0, WIN_NONE, 256, 0, 0, 0, 0,
     1, 1, 1, 1, 0},
};

const ModelFamily *family_find(const char *model_type) {
    for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0]; i++)
        if (!strcmp(FAMILIES[i].model_type, model_type)) return &FAMILIES[i];
    return NULL;
}

const ModelFamily *family_of(const ModelConfig *c) {
    const ModelFamily *f = family_find(c->model_type);
    return f ? f : &FAMILIES[0];
}

const ModelFamily *family_by_architecture(const char *architecture) {
    for (size_t i = 0; i < sizeof FAMILIES / sizeof FAMILIES[0]; i++)
        if (!strcmp(FAMILIES[i].architecture, architecture)) return &FAMILIES[i];
    return NULL;
}

// The family's classifier of a kind ("Sequence" or "Token"): its causal LM's name with
// ForSequenceClassification / ForTokenClassification (Gemma 3's text model: Gemma3Text...,
// as transformers names it).
void family_classifier_name(const ModelFamily *f, const char *kind, char *out, size_t cap) {
    const char *a = f->architecture, *end = strstr(a, "ForCausalLM");
    const int n = end ? (int)(end - a) : (int)strlen(a);
    snprintf(out, cap, "%.*s%sFor%sClassification", n, a, !strcmp(f->model_type, "gemma3_text") ? "Text" : "", kind);
}

int family_classifier_architecture(const ModelFamily *f, const char *kind, const char *architecture) {
    char n[80];
    family_classifier_name(f, kind, n, sizeof n);
    return !strcmp(n, architecture);
}

const char *family_list(void) { return "llama, mistral, qwen2, qwen3, phi3, gemma, gemma2, gemma3_text"; }
const char *family_architectures(void) {
    return "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM, "
           "GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM";
}

int family_layer_window(const ModelConfig *c, int l) {
    if (c->arch != ARCH_LLAMA || c->sliding_window <= 0) return 0;
    switch (family_of(c)->window) {
    case WIN_ALL: return c->sliding_window;
    case WIN_QWEN: return c->use_sliding_window && l >= c->max_window_layers ? c->sliding_window : 0;
    case WIN_PATTERN: return family_layer_sliding(c, l) ? c->sliding_window : 0;
    default: return 0;
    }
}

int family_layer_sliding(const ModelConfig *c, int l) {
    return c->arch == ARCH_LLAMA && family_of(c)->window == WIN_PATTERN && c->sliding_pattern > 0 &&
           (l + 1) % c->sliding_pattern != 0;
}

int family_layer_local_rope(const ModelConfig *c, int l) { return family_layer_sliding(c, l) && c->rope_local_theta > 0; }

static const ModelFamily *llama_row(const ModelConfig *c) { return c->arch == ARCH_LLAMA ? family_of(c) : NULL; }
float family_norm_add(const ModelConfig *c) { return llama_row(c) && llama_row(c)->norm_add ? 1.0f : 0.0f; }
int family_gelu_mlp(const ModelConfig *c) { return llama_row(c) && llama_row(c)->gelu_mlp; }
int family_embed_scale(const ModelConfig *c) { return llama_row(c) && llama_row(c)->embed_scale; }
int family_sandwich(const ModelConfig *c) { return llama_row(c) && llama_row(c)->sandwich; }

void family_hf_name(const ModelConfig *c, const char *name, char *out, size_t cap) {
    if (c->multimodal && !strncmp(name, "model.", 6)) snprintf(out, cap, "model.language_model.%s", name + 6);
    else snprintf(out, cap, "%s", name);
}

// Phi-3's fused tensors, as Phi3Attention and Phi3MLP slice them: qkv_proj's output rows are
// q (heads x head_dim), then k, then v; gate_up_proj's are gate, then up (chunk(2), gate first).
static const struct { const char *suffix; int kinds[3], n; } FUSIONS[] = {
    {"self_attn.qkv_proj.weight", {P_WQ, P_WK, P_WV}, 3},
    {"mlp.gate_up_proj.weight", {P_WGATE, P_WUP}, 2},
};

int family_fused_slice(const ParamTable *t, int i, FusedSlice *f) {
    const ParamSpec *p = &t->specs[i];
    if (t->cfg.arch != ARCH_LLAMA || !family_of(&t->cfg)->fused || p->layer < 0) return 0;
    for (size_t u = 0; u < sizeof FUSIONS / sizeof FUSIONS[0]; u++) {
        int at = -1;
        for (int j = 0; j < FUSIONS[u].n; j++)
            if (param_index(t, p->layer, FUSIONS[u].kinds[j]) == i) at = j;
        if (at < 0) continue;
        memset(f, 0, sizeof *f);
        snprintf(f->name, sizeof f->name, "model.layers.%d.%s", p->layer, FUSIONS[u].suffix);
        f->part = at, f->nparts = FUSIONS[u].n;
        for (int j = 0; j < FUSIONS[u].n; j++) {
            f->parts[j] = param_index(t, p->layer, FUSIONS[u].kinds[j]);
            if (j < at) f->row0 += t->specs[f->parts[j]].shape[0];
            f->rows += t->specs[f->parts[j]].shape[0];
        }
        return 1;
    }
    return 0;
}

int family_is_fused(const ModelConfig *c) { return c->arch == ARCH_LLAMA && family_of(c)->fused; }
