// family.c: see family.h. Sources of each row: transformers' configuration_* / modeling_*
// files for the family (defaults of absent keys, which projections have biases, q/k norms,
// which layers slide).
#include "family.h"
#include <string.h>

static const ModelFamily FAMILIES[] = {
    // Llama 2/3/3.1/3.2, SmolLM, TinyLlama: attention_bias biases all four projections.
    {"llama", "LlamaForCausalLM", BIAS_FROM_CONFIG, BIAS_FROM_CONFIG, 0, WIN_NONE, 0, 0, 0},
    // Mistral: no biases (the modeling code ignores attention_bias); sliding_window defaults to
    // 4096 when the key is absent, null turns it off, and it applies to every layer.
    {"mistral", "MistralForCausalLM", BIAS_NEVER, BIAS_NEVER, 0, WIN_ALL, 0, 4096, 0},
    // Qwen2/2.5: q/k/v always biased, o_proj never; window only with use_sliding_window.
    {"qwen2", "Qwen2ForCausalLM", BIAS_ALWAYS, BIAS_NEVER, 0, WIN_QWEN, 0, 4096, 28},
    // Qwen3: q_norm/k_norm, attention_bias (default false) on all four projections, head_dim
    // its own key (default 128).
    {"qwen3", "Qwen3ForCausalLM", BIAS_FROM_CONFIG, BIAS_FROM_CONFIG, 1, WIN_QWEN, 128, 4096, 28},
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

const char *family_list(void) { return "llama, mistral, qwen2, qwen3"; }
const char *family_architectures(void) {
    return "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";
}

int family_layer_window(const ModelConfig *c, int l) {
    if (c->arch != ARCH_LLAMA || c->sliding_window <= 0) return 0;
    switch (family_of(c)->window) {
    case WIN_ALL: return c->sliding_window;
    case WIN_QWEN: return c->use_sliding_window && l >= c->max_window_layers ? c->sliding_window : 0;
    default: return 0;
    }
}
