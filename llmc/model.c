// model.c: a model's shape checks, parameter table, memory and parameters (get, set,
// initialise, quantize). Its forward and backward over the backend's ops are forward_backward.c.
#include "model_internal.h"
#include "family.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include "stb_ds.h"
#include "actstore.h"
#include "freeze.h"
#include "int8.h"
#include "nf4.h"
#include "comm.h"
#include "seqpar.h"
#include "weights.h"
#include "optim.h"
#include "util.h"

void model_config_defaults(ModelConfig *c) {
    memset(c, 0, sizeof *c);
    snprintf(c->model_type, sizeof c->model_type, "llama");
    c->rms_norm_eps = 1e-5f;
    c->rope_theta = 10000.0;
    c->max_position_embeddings = 2048;
    c->bos_token_id = c->eos_token_id = c->pad_token_id = -1;
}

// A ceiling far past any real model (Llama 3 405B has 4e11 parameters) and far below 64-bit
// overflow: every byte size derived from a valid config fits in size_t with room to spare.
#define MAX_PARAMS 10000000000000LL

// Mirrors param_table_build (model_create checks that the two agree).
void model_size(const ModelConfig *c, int64_t I, int64_t Vp, const LoraConfig *lora, ModelSize *s) {
    const int64_t C = c->hidden_size, V = c->vocab_size;
    const int gpt2 = c->arch == ARCH_GPT2;
    // Output and input widths of the seven projections, in LORA_* order (GPT-2: q/k/v/o are
    // C x C and there is no gate).
    const Count QD = gpt2 ? count_of(C) : count_mul(count_of(c->num_attention_heads), count_of(c->head_dim));
    const Count KD = gpt2 ? count_of(C) : count_mul(count_of(c->num_key_value_heads), count_of(c->head_dim));
    const Count out[LORA_TARGETS] = {QD, KD, KD, count_of(C), count_of(I), count_of(I), count_of(C)};
    const Count in[LORA_TARGETS] = {count_of(C), count_of(C), count_of(C), QD, count_of(C), count_of(C), count_of(I)};
    Count layer = count_of(0), outside, tensors;
    int layer_tensors;
    for (int k = 0; k < LORA_TARGETS; k++)
        if (!(gpt2 && k == LORA_GATE)) layer = count_add(layer, count_mul(out[k], in[k]));
    if (gpt2) {
        // Two LayerNorms with biases; q/k/v/o, fc and proj biases.
        layer = count_add(layer, count_add(count_mul(count_of(9), count_of(C)), count_of(I)));
        layer_tensors = 16;
        outside = count_add(count_mul(count_add(count_of(Vp), count_of(c->max_position_embeddings)), count_of(C)),
                            count_of(2 * C));
        tensors = count_of(4);
    } else {
        const ModelFamily *f = family_of(c);
        const int bias = c->attention_bias != 0, o_bias = bias && f->o_bias != BIAS_NEVER, qkn = f->qk_norm;
        layer = count_add(layer, count_of(2 * C + o_bias * C));  // two RMSNorms, o_proj bias
        if (bias) layer = count_add(layer, count_add(QD, count_mul(count_of(2), KD)));
        if (qkn) layer = count_add(layer, count_of(2 * (int64_t)c->head_dim));  // q_norm, k_norm
        const int sw = f->sandwich;  // Gemma 3: two norms more
        if (sw) layer = count_add(layer, count_of(2 * C));
        layer_tensors = 9 + 3 * bias + o_bias + 2 * qkn + 2 * sw;
        // The embedding, the final norm and the head: the LM head untied, or a classifier's score
        // head (num_labels rows, never tied), or none (tied).
        const int64_t head = c->num_labels ? c->num_labels : c->tie_word_embeddings ? 0 : V;
        outside = count_add(count_mul(count_of(V + head), count_of(C)), count_of(C + (c->token_cls ? c->num_labels : 0)));
        tensors = count_of((head ? 3 : 2) + (c->token_cls != 0));
    }
    // Adapters of one layer whose LORA_* mask is m: parameters, and tensors in *nt.
    // (A fused module, GPT-2's c_attn or Phi-3's qkv_proj / gate_up_proj: one A over its input
    // and one B over all its parts' outputs, in the first part's slot.)
    const int fqkv = lora_fused_qkv(c), fgu = lora_fused_gate_up(c);
    Count ad_out[LORA_TARGETS];
    memcpy(ad_out, out, sizeof ad_out);
    if (fqkv) ad_out[LORA_Q] = count_add(QD, count_mul(count_of(2), KD));
    if (fgu) ad_out[LORA_GATE] = count_mul(count_of(2), out[LORA_GATE]);
#define LAYER_ADAPTERS(m, nt, acc)                                                                  \
    for (int k = 0; k < LORA_TARGETS; k++)                                                          \
        if ((m) >> k & 1 && !(gpt2 && k == LORA_GATE) && !(fqkv && (k == LORA_K || k == LORA_V)) && \
            !(fgu && k == LORA_UP)) {                                                               \
            acc = count_add(acc, count_mul(count_of(lora->r), count_add(in[k], ad_out[k])));        \
            (nt) += 2;                                                                              \
        }
    const Count L = count_of(c->num_hidden_layers);
    const int lora_r = lora ? lora->r : 0;
    Count adapters = count_of(0), most = count_of(0), ltens = count_of(0);  // all layers; largest layer
    if (lora_r > 0 && lora->per_layer) {
        for (int l = 0; l < c->num_hidden_layers; l++) {
            Count a = count_of(0);
            int nt = 0;
            LAYER_ADAPTERS(lora_layer_targets(lora, l), nt, a)
            adapters = count_add(adapters, a);
            ltens = count_add(ltens, count_of(nt));
            if (a.n > most.n) most = a;
        }
    } else if (lora_r > 0) {
        int nt = 0;
        LAYER_ADAPTERS(lora->targets, nt, most)
        adapters = count_mul(L, most);
        ltens = count_mul(L, count_of(nt));
    }
#undef LAYER_ADAPTERS
    s->layer_params = count_add(layer, most);
    s->params = count_add(outside, count_add(count_mul(L, layer), adapters));
    s->trainable = s->params;
    if (lora_r > 0) {  // adapters, and modules_to_save's embedding / untied head
        const Count VC = count_mul(count_of(c->arch == ARCH_GPT2 ? Vp : c->vocab_size), count_of(C));
        s->trainable = adapters;
        if (lora->save_embed) s->trainable = count_add(s->trainable, VC);
        if (lora->save_head && c->num_labels)  // score.weight (and a token classifier's score.bias)
            s->trainable = count_add(s->trainable, count_of((int64_t)c->num_labels * (C + (c->token_cls != 0))));
        else if (lora->save_head && !c->tie_word_embeddings) s->trainable = count_add(s->trainable, VC);
    }
    s->tensors = count_add(count_add(tensors, count_mul(L, count_of(layer_tensors))), ltens);
}

void model_fail_size(const ModelConfig *c, int64_t I, int64_t Vp, const char *src, const char *why) {
    ModelSize s;
    model_size(c, I, Vp, NULL, &s);
    const int64_t V = c->arch == ARCH_GPT2 ? Vp : c->vocab_size;
    fail("%s%smodel needs %.1f GiB for its %.3g parameters in 16 bits (num_hidden_layers %d x %.3g per layer "
         "from hidden_size %d, intermediate_size %lld, %d heads of head_dim %d; vocab_size %lld x hidden_size %d); %s",
         src ? src : "", src ? ": " : "", 2 * s.params.d / 1073741824.0, s.params.d, c->num_hidden_layers,
         s.layer_params.d, c->hidden_size, (long long)I, c->num_attention_heads, c->head_dim, (long long)V,
         c->hidden_size, why);
}

int model_config_same_shape(const ModelConfig *a, const ModelConfig *b) {
    return a->vocab_size == b->vocab_size && a->hidden_size == b->hidden_size &&
           a->intermediate_size == b->intermediate_size && a->num_hidden_layers == b->num_hidden_layers &&
           a->num_attention_heads == b->num_attention_heads && a->num_key_value_heads == b->num_key_value_heads &&
           a->head_dim == b->head_dim && a->tie_word_embeddings == b->tie_word_embeddings &&
           a->attention_bias == b->attention_bias && a->num_labels == b->num_labels && a->token_cls == b->token_cls;
}

void model_config_validate(const ModelConfig *c, const char *src) {
    struct { const char *name; int v; } pos[] = {
        {"vocab_size", c->vocab_size}, {"hidden_size", c->hidden_size},
        {"intermediate_size", c->intermediate_size}, {"num_hidden_layers", c->num_hidden_layers},
        {"num_attention_heads", c->num_attention_heads},
        {"num_key_value_heads", c->num_key_value_heads}, {"head_dim", c->head_dim},
        {"max_position_embeddings", c->max_position_embeddings}};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
        if (pos[i].v <= 0) fail("%s: %s must be a positive integer, got %d", src, pos[i].name, pos[i].v);
    // The kernels take the attention widths as int.
    const char *heads[2] = {"num_attention_heads", "num_key_value_heads"};
    const int hv[2] = {c->num_attention_heads, c->num_key_value_heads};
    for (int i = 0; i < 2; i++)
        if ((int64_t)hv[i] * c->head_dim > INT32_MAX)
            fail("%s: %s %d x head_dim %d = %lld is wider than the 2147483647 a tensor dimension holds", src,
                 heads[i], hv[i], c->head_dim, (long long)hv[i] * c->head_dim);
    if (c->arch == ARCH_GPT2 && c->padded_vocab < c->vocab_size)
        fail("%s: padded vocab %d is smaller than vocab_size %d", src, c->padded_vocab, c->vocab_size);
    ModelSize s;
    model_size(c, c->intermediate_size, c->padded_vocab, NULL, &s);
    if (s.params.n > MAX_PARAMS)
        model_fail_size(c, c->intermediate_size, c->padded_vocab, src, "more than this trainer can address");
    // Table entries and the per-layer index rows (layer x P_PER_LAYER) are indexed by an int.
    if (count_mul(count_of(c->num_hidden_layers), count_of(P_PER_LAYER + 1)).n > INT32_MAX)
        model_fail_size(c, c->intermediate_size, c->padded_vocab, src,
                        "its parameter table would hold more tensors than an int indexes");
    if (c->num_attention_heads % c->num_key_value_heads)
        fail("%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", src,
             c->num_attention_heads, c->num_key_value_heads);
    if (c->head_dim % 2) fail("%s: head_dim must be even for rotary embeddings, got %d", src, c->head_dim);
    if (!(c->rms_norm_eps > 0)) fail("%s: rms_norm_eps must be > 0", src);
    if (!(c->rope_theta > 0)) fail("%s: rope_theta must be > 0", src);
    if (c->rope_type == ROPE_LLAMA3 &&
        !(c->rope_factor > 0 && c->rope_low_freq_factor > 0 &&
          c->rope_high_freq_factor > c->rope_low_freq_factor &&
          c->rope_original_max_position_embeddings > 0))
        fail("%s: llama3 rope_scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
             "original_max_position_embeddings > 0", src);
    if (c->rope_type == ROPE_LINEAR && !(isfinite(c->rope_factor) && c->rope_factor > 0))
        fail("%s: linear rope_scaling needs factor > 0", src);
    if (c->rope_type == ROPE_YARN &&
        !(c->rope_factor > 0 && c->rope_beta_fast > 0 && c->rope_beta_slow > 0 && c->rope_attention_factor > 0 &&
          isfinite(c->rope_attention_factor) && c->rope_original_max_position_embeddings >= 0))
        fail("%s: yarn rope_scaling needs factor, beta_fast, beta_slow and the attention factor > 0", src);
    if (c->rotary_dim && (c->rotary_dim < 2 || c->rotary_dim % 2 || c->rotary_dim > c->head_dim))
        fail("%s: RoPE over %d of head_dim %d dimensions: an even number from 2 to head_dim", src, c->rotary_dim,
             c->head_dim);
    if (c->rope_type == ROPE_LONGROPE) {
        if (rope_dims(c) / 2 > ROPE_MAX_HALF)
            fail("%s: longrope over %d rotary dimensions: at most %d is implemented", src, rope_dims(c), 2 * ROPE_MAX_HALF);
        if (!(c->original_max_position_embeddings > 0) || !(isfinite(c->rope_attention_factor) && c->rope_attention_factor > 0))
            fail("%s: longrope needs original_max_position_embeddings > 0 and a positive attention factor", src);
        for (int i = 0; i < rope_dims(c) / 2; i++)
            if (!(isfinite(c->rope_short_factor[i]) && c->rope_short_factor[i] > 0 &&
                  isfinite(c->rope_long_factor[i]) && c->rope_long_factor[i] > 0))
                fail("%s: longrope short_factor/long_factor[%d] must be positive finite numbers", src, i);
    }
}

const char *const LORA_TARGET_NAMES[LORA_TARGETS] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                     "gate_proj", "up_proj", "down_proj"};
const int LORA_WEIGHT[LORA_TARGETS] = {P_WQ, P_WK, P_WV, P_WO, P_WGATE, P_WUP, P_WDOWN};

void lora_module_name(char *out, size_t cap, const ModelConfig *c, int layer, int t) {
    if (c->arch == ARCH_GPT2) {
        static const char *const gpt2[LORA_TARGETS] = {"attn.c_attn", "attn.c_attn", "attn.c_attn", "attn.c_proj",
                                                       "", "mlp.c_fc", "mlp.c_proj"};
        snprintf(out, cap, "transformer.h.%d.%s", layer, gpt2[t]);
    } else if (family_is_fused(c) && t != LORA_O && t != LORA_DOWN) {
        snprintf(out, cap, "model.layers.%d.%s", layer, t <= LORA_V ? "self_attn.qkv_proj" : "mlp.gate_up_proj");
    } else {
        snprintf(out, cap, "model.layers.%d.%s.%s", layer, t <= LORA_O ? "self_attn" : "mlp", LORA_TARGET_NAMES[t]);
    }
}

static int add_param(ParamTable *t, const char *name, int64_t d0, int64_t d1, int layer, int decay,
                     size_t *offset) {
    ParamSpec p = {0};
    snprintf(p.name, sizeof p.name, "%s", name);
    p.ndim = d1 ? 2 : 1;
    p.shape[0] = d0;
    p.shape[1] = d1;
    p.numel = (size_t)d0 * (size_t)(d1 ? d1 : 1);
    p.offset = *offset;
    p.layer = layer;
    p.decay = decay;
    *offset += p.numel;
    arrput(t->specs, p);
    return (int)arrlen(t->specs) - 1;
}

// GPT-2 as llm.c has it; q/k/v are separate tensors here (llm.c's fused c_attn is split and
// joined at load and save), so attention, LoRA and sharding need nothing GPT-2 specific.
static void build_gpt2_table(ParamTable *t, const ModelConfig *c, size_t *off) {
    const int64_t C = c->hidden_size, I = c->intermediate_size;
    char n[96];
    t->embed = add_param(t, "transformer.wte.weight", c->padded_vocab, C, -1, 1, off);
    t->pos_embed = add_param(t, "transformer.wpe.weight", c->max_position_embeddings, C, -1, 1, off);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        int *lp = t->layer_param + l * P_PER_LAYER;
        for (int k = 0; k < P_PER_LAYER; k++) lp[k] = -1;
        static const struct { int kind; const char *suffix; int rows, cols; } layout[] = {
            {P_LN1, "ln_1.weight", 1, 0}, {P_LN1B, "ln_1.bias", 1, 0},
            {P_WQ, "attn.q_proj.weight", 1, 1}, {P_BQ, "attn.q_proj.bias", 1, 0},
            {P_WK, "attn.k_proj.weight", 1, 1}, {P_BK, "attn.k_proj.bias", 1, 0},
            {P_WV, "attn.v_proj.weight", 1, 1}, {P_BV, "attn.v_proj.bias", 1, 0},
            {P_WO, "attn.c_proj.weight", 1, 1}, {P_BO, "attn.c_proj.bias", 1, 0},
            {P_LN2, "ln_2.weight", 1, 0}, {P_LN2B, "ln_2.bias", 1, 0},
            {P_WUP, "mlp.c_fc.weight", 4, 1}, {P_BUP, "mlp.c_fc.bias", 4, 0},
            {P_WDOWN, "mlp.c_proj.weight", 1, 4}, {P_BDOWN, "mlp.c_proj.bias", 1, 0}};
        for (size_t i = 0; i < sizeof layout / sizeof layout[0]; i++) {
            snprintf(n, sizeof n, "transformer.h.%d.%s", l, layout[i].suffix);
            int64_t d0 = layout[i].rows == 4 ? I : C, d1 = layout[i].cols == 0 ? 0 : layout[i].cols == 4 ? I : C;
            lp[layout[i].kind] = add_param(t, n, d0, d1, l, d1 != 0, off);
        }
    }
    t->final_norm = add_param(t, "transformer.ln_f.weight", C, 0, -1, 0, off);
    t->final_norm_bias = add_param(t, "transformer.ln_f.bias", C, 0, -1, 0, off);
    t->lm_head = t->embed;
}

size_t unit_shard(const ParamTable *t, int u) {
    return (t->units[u + 1] - t->units[u] + t->world - 1) / t->world;
}

// Bytes of a quantized tensor's region: NF4 (blocks of 64, double-quantized) or int8 rows.
static size_t quant_bytes(const ParamSpec *p) {
    return p->quant == 8 ? int8_region_bytes((size_t)p->shape[0], (size_t)p->shape[1])
                         : nf4_region_bytes(p->numel, 64, 1);
}

// The Hugging Face name a pattern of unfrozen_parameters sees: Phi-3 keeps q/k/v and gate/up
// fused in its files (self_attn.qkv_proj, mlp.gate_up_proj), so their parts go by that name;
// a Gemma 3 multimodal model's text model is model.language_model (transformers >= 4.52's
// Gemma3ForConditionalGeneration, whose parameters Axolotl's patterns name).
static void hf_param_name(const ModelConfig *c, const char *name, char *out, size_t cap) {
    if (c->multimodal) {
        family_hf_name(c, name, out, cap);
        return;
    }
    static const char *const parts[][2] = {{"self_attn.q_proj.", "self_attn.qkv_proj."},
                                           {"self_attn.k_proj.", "self_attn.qkv_proj."},
                                           {"self_attn.v_proj.", "self_attn.qkv_proj."},
                                           {"mlp.gate_proj.", "mlp.gate_up_proj."},
                                           {"mlp.up_proj.", "mlp.gate_up_proj."}};
    snprintf(out, cap, "%s", name);
    if (c->arch == ARCH_GPT2 || !family_is_fused(c)) return;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        const char *at = strstr(name, parts[i][0]);
        if (at) {
            snprintf(out, cap, "%.*s%s%s", (int)(at - name), name, parts[i][1], at + strlen(parts[i][0]));
            return;
        }
    }
}

// unfrozen_parameters' row ranges: the rows of p outside them, as intervals to zero. A part
// of Phi-3's fused qkv_proj/gate_up_proj, or a GPT-2 Conv1D weight (stored [in, out]), would
// need its rows mapped through the fusion or the transpose: refused.
static void freeze_rows(ParamSpec *p, const ModelConfig *c, const Unfrozen *uf, const char *hf) {
    RowRange keep[UNFROZEN_MAX_RANGES];
    const int n = unfrozen_rows(uf, hf, p->shape[0], keep, "config");
    if (!n) return;
    if (c->arch == ARCH_GPT2 || strcmp(hf, p->name))
        fail("config: unfrozen_parameters: a row range on %s is not implemented (%s); name the whole tensor", hf,
             c->arch == ARCH_GPT2 ? "GPT-2's Conv1D weights are stored transposed" : "a fused Phi-3 tensor");
    int64_t at = 0;
    for (int k = 0; k < n; k++) {
        if (keep[k].start > at) p->frozen[p->nfrozen][0] = at, p->frozen[p->nfrozen][1] = keep[k].start, p->nfrozen++;
        at = keep[k].end;
    }
    if (at < p->shape[0]) p->frozen[p->nfrozen][0] = at, p->frozen[p->nfrozen][1] = p->shape[0], p->nfrozen++;
}

void param_table_build(ParamTable *t, const ModelConfig *c, const LoraConfig *lora, int stream,
                       int world, int quant, int zero3, const char *unfrozen) {
    memset(t, 0, sizeof *t);
    t->cfg = *c;
    if (lora) t->lora = *lora;
    const int64_t C = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
    const int64_t QD = (int64_t)c->num_attention_heads * c->head_dim;
    const int64_t KD = (int64_t)c->num_key_value_heads * c->head_dim;
    const int L = c->num_hidden_layers;
    size_t off = 0;
    char n[96];
    // attention_bias biases q, k and v; o_proj too unless the family says never (Qwen2).
    const ModelFamily *fam = family_of(c);
    const int o_bias = c->attention_bias && fam->o_bias != BIAS_NEVER;
    t->pos_embed = t->final_norm_bias = t->score_bias = -1;
    t->layer_param = xmalloc(sizeof(int) * L * P_PER_LAYER);
    if (c->arch == ARCH_GPT2) {
        build_gpt2_table(t, c, &off);
    } else {
    t->embed = add_param(t, "model.embed_tokens.weight", V, C, -1, 1, &off);
    for (int l = 0; l < L; l++) {
        int *lp = t->layer_param + l * P_PER_LAYER;
        for (int k = 0; k < P_PER_LAYER; k++) lp[k] = -1;
#define LAYER(kind, suffix, d0, d1, decay)                                   \
    snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix);                  \
    lp[kind] = add_param(t, n, d0, d1, l, decay, &off);
        LAYER(P_LN1, "input_layernorm.weight", C, 0, 0)
        LAYER(P_WQ, "self_attn.q_proj.weight", QD, C, 1)
        if (c->attention_bias) { LAYER(P_BQ, "self_attn.q_proj.bias", QD, 0, 0) }
        LAYER(P_WK, "self_attn.k_proj.weight", KD, C, 1)
        if (c->attention_bias) { LAYER(P_BK, "self_attn.k_proj.bias", KD, 0, 0) }
        LAYER(P_WV, "self_attn.v_proj.weight", KD, C, 1)
        if (c->attention_bias) { LAYER(P_BV, "self_attn.v_proj.bias", KD, 0, 0) }
        LAYER(P_WO, "self_attn.o_proj.weight", C, QD, 1)
        if (o_bias) { LAYER(P_BO, "self_attn.o_proj.bias", C, 0, 0) }
        if (fam->qk_norm) {
            LAYER(P_QNORM, "self_attn.q_norm.weight", c->head_dim, 0, 0)
            LAYER(P_KNORM, "self_attn.k_norm.weight", c->head_dim, 0, 0)
        }
        // Gemma 3's sandwich: post_attention_layernorm is on o_proj's output, the MLP's input
        // norm is pre_feedforward_layernorm, and post_feedforward_layernorm is on its output.
        if (fam->sandwich) {
            LAYER(P_LNPA, "post_attention_layernorm.weight", C, 0, 0)
            LAYER(P_LN2, "pre_feedforward_layernorm.weight", C, 0, 0)
            LAYER(P_LNPF, "post_feedforward_layernorm.weight", C, 0, 0)
        } else {
            LAYER(P_LN2, "post_attention_layernorm.weight", C, 0, 0)
        }
        LAYER(P_WGATE, "mlp.gate_proj.weight", I, C, 1)
        LAYER(P_WUP, "mlp.up_proj.weight", I, C, 1)
        LAYER(P_WDOWN, "mlp.down_proj.weight", C, I, 1)
#undef LAYER
    }
    t->final_norm = add_param(t, "model.norm.weight", C, 0, -1, 0, &off);
    // A sequence classifier (reward model) has score.weight in the LM head's place, never tied.
    t->lm_head = c->num_labels             ? add_param(t, "score.weight", c->num_labels, C, -1, 1, &off)
                 : c->tie_word_embeddings ? t->embed
                                          : add_param(t, "lm_head.weight", V, C, -1, 1, &off);
    if (c->token_cls) t->score_bias = add_param(t, "score.bias", c->num_labels, 0, -1, 0, &off);
    }
    // Adapters come last, so the base keeps the layout of a full fine-tuning run. They are named
    // as PEFT names them on the Hugging Face model (GPT-2: GPT2LMHeadModel's Conv1D modules).
    const int r = t->lora.r;
    if (r > 0) {
        for (int l = 0; l < L; l++)
            for (int k = 0; k < LORA_TARGETS; k++) {
                if (!(lora_layer_targets(&t->lora, l) >> k & 1) || t->layer_param[l * P_PER_LAYER + LORA_WEIGHT[k]] < 0) continue;
                if (lora_fused_qkv(c) && (k == LORA_K || k == LORA_V)) continue;  // in q's slot
                if (lora_fused_gate_up(c) && k == LORA_UP) continue;               // in gate's
                const ParamSpec *w = &t->specs[t->layer_param[l * P_PER_LAYER + LORA_WEIGHT[k]]];
                int64_t out = w->shape[0], in = w->shape[1];
                if (lora_fused_qkv(c) && k == LORA_Q) out += 2 * t->specs[t->layer_param[l * P_PER_LAYER + P_WK]].shape[0];
                if (lora_fused_gate_up(c) && k == LORA_GATE) out *= 2;
                char mod[80];
                lora_module_name(mod, sizeof mod, c, l, k);
                snprintf(n, sizeof n, "%s.lora_A.weight", mod);
                t->layer_param[l * P_PER_LAYER + P_LORA_A + k] = add_param(t, n, r, in, l, 1, &off);
                snprintf(n, sizeof n, "%s.lora_B.weight", mod);
                t->layer_param[l * P_PER_LAYER + P_LORA_B + k] = add_param(t, n, out, r, l, 1, &off);
            }
        t->lora_scale = t->lora.alpha / (t->lora.rslora ? sqrtf((float)r) : (float)r);
    }
    t->num_params = off;
    // Full fine-tuning trains everything; an adapter run trains only the adapters. Gradient
    // order groups the trainable tensors into units, each contiguous: the embedding, the final
    // norm and head, then each layer's. ZeRO-3 shards and gathers by unit. The embedding and an
    // untied head are units of their own so that each is gathered only around its use (the
    // lookup, the classifier) into one buffer the size of the larger; tied, they are one unit
    // (the table order embedding, layers, norm, head keeps the gradient order the same either
    // way). One pass sizes the units, a prefix sum places them, a second pass places each
    // tensor inside its unit in table order: linear in the number of tensors.
    t->nl_units = t->lm_head != t->embed ? 2 : 1;
    t->nunits = t->nl_units + L;
    t->units = xcalloc((size_t)t->nunits + 1, sizeof(size_t));
    size_t *fill = xcalloc((size_t)t->nunits, sizeof(size_t));
    Unfrozen uf = {0};
    const int some = r == 0 && unfrozen && unfrozen[0];
    if (some) unfrozen_compile(&uf, unfrozen, "config");
    for (int i = 0; i < (int)arrlen(t->specs); i++) {
        ParamSpec *p = &t->specs[i];
        char hf[160];
        hf_param_name(c, p->name, hf, sizeof hf);
        p->trainable = r == 0 ? !some || unfrozen_match(&uf, hf)
                              : strstr(p->name, ".lora_") != NULL || (i == t->embed && t->lora.save_embed) ||
                                    ((i == t->lm_head || i == t->score_bias) && i != t->embed && t->lora.save_head);
        if (some && p->trainable) freeze_rows(p, c, &uf, hf);
        p->unit = p->layer >= 0 ? t->nl_units + p->layer
                                : t->nl_units == 2 && (i == t->final_norm || i == t->lm_head || i == t->score_bias) ? 1 : 0;
        if (p->trainable) t->units[p->unit + 1] += p->numel;  // shifted: the prefix sum below
    }
    if (some) unfrozen_free(&uf);
    for (int u = 1; u <= t->nunits; u++) t->units[u] += t->units[u - 1];
    memcpy(fill, t->units, (size_t)t->nunits * sizeof(size_t));
    for (int i = 0; i < (int)arrlen(t->specs); i++) {
        ParamSpec *p = &t->specs[i];
        if (p->trainable) p->goff = fill[p->unit], fill[p->unit] += p->numel;
    }
    free(fill);
    const size_t g = t->units[t->nunits];
    t->num_trainable = g;
    // Streaming: frozen layer tensors move to per-layer blocks; the rest pack the resident buffer.
    // The resident buffer starts with the trainable tensors in gradient order (so sharding
    // can gather and scatter one contiguous range, padded to a multiple of the world size),
    // then the frozen resident ones. ZeRO-3 keeps its pieces in a buffer of their own (which
    // offload_params puts in host memory), so there the resident buffer holds only frozen
    // tensors. Every layer has the same tensors in the same order, so streamed block offsets
    // agree across layers.
    t->world = world > 0 ? world : 1;
    t->shard = (g + t->world - 1) / t->world;
    // ZeRO-3 keeps only this rank's piece of every unit: ceil(unit / world) elements each.
    t->local3 = 0;
    for (int u = 0; u < t->nunits; u++) t->local3 += unit_shard(t, u);
    size_t res = zero3 ? 0 : t->shard * t->world, *blk = xcalloc(L, sizeof(size_t));
    size_t *qo = xcalloc(L, sizeof(size_t)), *dq = xcalloc(L, sizeof(size_t));
    for (int i = 0; i < (int)arrlen(t->specs); i++) {
        ParamSpec *p = &t->specs[i];
        p->streamed = stream && p->layer >= 0 && !p->trainable;
        // QLoRA / load_in_8bit: the frozen decoder matrices (not norms, biases or adapters).
        p->quant = p->layer >= 0 && !p->trainable && p->ndim == 2 ? quant : 0;
        if (p->quant) {
            p->qoff = qo[p->layer], qo[p->layer] += quant_bytes(p);
            p->deq_off = dq[p->layer], dq[p->layer] += p->numel;
        } else if (p->trainable) {
            p->offset = zero3 ? 0 : p->goff;  // ZeRO-3: reached through the unit's gather buffer
        } else if (p->streamed) {
            p->offset = blk[p->layer], blk[p->layer] += p->numel;
        } else {
            p->offset = res, res += p->numel;
        }
    }
    t->stream_block = L ? blk[0] : 0;
    t->qregion = L ? qo[0] : 0;
    t->deq_elems = L ? dq[0] : 0;
    t->num_resident = res;
    free(blk), free(qo), free(dq);
}

void param_table_free(ParamTable *t) {
    arrfree(t->specs);
    free(t->layer_param);
    free(t->units);
    memset(t, 0, sizeof *t);
}

// HF computes inv_freq = 1 / theta^(2i/D) in float32, then llama3 rescales by wavelength:
// long wavelengths are divided by `factor`, short ones kept, the band between interpolated.
// D is the rotated dimensions (rope_dims: head_dim, or Phi-3's partial share).
void rope_inv_freq(const ModelConfig *c, float *inv, int long_factors) {
    const int half = rope_dims(c) / 2;
    for (int i = 0; i < half; i++) {
        float e = (float)(2 * i) / (float)rope_dims(c);
        // Phi-3's longrope: 1 / (ext_factors * base ** e) in float32; ext 1 (exact) otherwise.
        const float ext = c->rope_type != ROPE_LONGROPE ? 1.0f
                          : long_factors                ? c->rope_long_factor[i]
                                                        : c->rope_short_factor[i];
        inv[i] = 1.0f / (ext * powf((float)c->rope_theta, e));
    }
    if (c->rope_type == ROPE_LINEAR) {  // positions / factor, as inv_freq /= factor in float32
        for (int i = 0; i < half; i++) inv[i] /= (float)c->rope_factor;
        return;
    }
    if (c->rope_type == ROPE_YARN) {
        // transformers' _compute_yarn_parameters (4.57): interpolated (/ factor) frequencies
        // below a ramp over dimensions [low, high], extrapolated (as trained) above it, in float32.
        const int dim = rope_dims(c);
        const double base = c->rope_theta, orig = c->rope_original_max_position_embeddings > 0
                                                      ? c->rope_original_max_position_embeddings
                                                      : c->max_position_embeddings;
        double lo = dim * log(orig / (c->rope_beta_fast * 2 * M_PI)) / (2 * log(base));
        double hi = dim * log(orig / (c->rope_beta_slow * 2 * M_PI)) / (2 * log(base));
        if (c->rope_truncate) lo = floor(lo), hi = ceil(hi);
        if (lo < 0) lo = 0;
        if (hi > dim - 1) hi = dim - 1;
        if (lo == hi) hi += 0.001;  // as transformers: no division by zero
        for (int i = 0; i < half; i++) {
            const float pos = powf((float)base, (float)(2 * i) / (float)dim);
            const float extrap = 1.0f / pos, interp = 1.0f / ((float)c->rope_factor * pos);
            float ramp = ((float)i - (float)lo) / (float)(hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            const float ef = 1.0f - ramp;  // the extrapolation share
            inv[i] = interp * (1.0f - ef) + extrap * ef;
        }
        return;
    }
    if (c->rope_type != ROPE_LLAMA3) return;
    const double old = c->rope_original_max_position_embeddings;
    const double lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor, f = c->rope_factor;
    const double low_wavelen = old / lo, high_wavelen = old / hi;
    for (int i = 0; i < half; i++) {
        double w = 2 * M_PI / inv[i];
        float scaled = w > low_wavelen ? (float)(inv[i] / f) : inv[i];
        if (!(w < high_wavelen) && !(w > low_wavelen)) {
            float smooth = (float)((old / w - lo) / (hi - lo));
            scaled = (1 - smooth) * scaled / (float)f + smooth * scaled;
        }
        inv[i] = scaled;
    }
}

// ---- allocation -------------------------------------------------------------------------

// Bytes this process can have: physical memory, or less under an address-space limit.
static double host_capacity(void) {
    double phys = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    struct rlimit r;
    if (getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY && (double)r.rlim_cur < phys)
        phys = (double)r.rlim_cur;
    return phys;
}

static int backend_is_host(const Backend *bk) { return !strcmp(bk->name, "cpu"); }

static void fail_memory(const ModelConfig *c, const ModelSize *s, double need, double have, const char *what) {
    fail("model needs %.1f GiB of host memory for %s (%.3g tensors, %.3g parameters: num_hidden_layers %d "
         "x %.3g per layer from hidden_size %d and intermediate_size %d, vocab_size %d x hidden_size %d), "
         "but this machine has %.1f GiB", need / 1073741824.0, what, s->tensors.d, s->params.d,
         c->num_hidden_layers, s->layer_params.d, c->hidden_size, c->intermediate_size, c->vocab_size,
         c->hidden_size, have / 1073741824.0);
}

void model_check_memory(const ModelConfig *c, const LoraConfig *lora, const ModelOptions *mo, const Backend *bk) {
    ModelSize s;
    model_size(c, c->intermediate_size, c->padded_vocab, lora, &s);
    // Sizes passed model_config_validate (below 1e13 parameters), so doubles hold them exactly
    // enough and sums of them cannot overflow.
    const double L = c->num_hidden_layers, have = host_capacity();
    // The table: a ParamSpec per tensor, and per layer its index row, unit bounds, block and
    // quant offsets (param_table_build) and an owned range (model_create).
    double table = s.tensors.d * sizeof(ParamSpec) +
                   L * (P_PER_LAYER * sizeof(int) + 4 * sizeof(size_t) + sizeof(OwnedRange));
    if (table > have) fail_memory(c, &s, table, have, "its parameter table");
    if (bk->dry_run) return;  // the planner allocates nothing else
    // A lower bound of the parameter state, so a run that could fit is never refused:
    // weights (frozen ones NF4 at half a byte when quantized), gradients, AdamW moments,
    // fp32 master weights; ZeRO divides the optimizer state (stage 3: everything) by the ranks.
    const double A = bk->act_bytes, world = mo && mo->comm ? mo->comm->world : 1;
    const int zero = mo ? mo->zero_stage : 0, offload = mo && mo->offload_optimizer;
    const int offload_params = mo && mo->offload_params;
    double trainable = s.trainable.d;
    if ((!lora || !lora->r) && mo && mo->unfrozen && mo->unfrozen[0]) {  // unfrozen_parameters: count them
        ParamTable t;
        param_table_build(&t, c, lora, 0, 1, 0, 0, mo->unfrozen);
        trainable = (double)t.num_trainable;
        param_table_free(&t);
    }
    const double frozen = s.params.d - trainable;
    const double frozen_b = frozen * (mo && mo->load_in_4bit ? 0.5 : mo && mo->load_in_8bit ? 1 : A);
    const double train_b = trainable * (A + sizeof(float)) / (zero >= 3 ? world : 1);  // weights, float grads
    // (offload_optimizer's host copy of the gradients is the gradients themselves under
    // offload_params)
    // low-bit AdamW: at least a byte each (8-bit), half a byte (4-bit)
    const double moments = !mo || !mo->adam8 ? 8 : mo->adam8 == ADAM4_TORCHAO ? 1 : 2;
    const double opt_b = trainable * (moments + (A != 4 || offload ? 4 : 0) + (offload && !offload_params ? 4 : 0)) /
                         (zero >= 1 ? world : 1);
    double host = table;
    if (backend_is_host(bk)) host += frozen_b + train_b + opt_b;  // "device" memory is host memory
    else host += (mo && mo->stream ? frozen_b : 0) + (offload ? opt_b : 0) + (offload_params ? train_b : 0);
    if (host > have) fail_memory(c, &s, host, have, "its weights, gradients and optimizer state");
}


static int rank_ranges(const ParamTable *t, int zero_stage, int rank, OwnedRange *out, size_t *local_n);

void model_create(Model *m, Backend *bk, const ModelConfig *cfg, const LoraConfig *lora,
                  const ModelOptions *opt) {
    memset(m, 0, sizeof *m);
    m->bk = bk;
    m->cfg = *cfg;
    if (opt) m->opt = *opt;
    const int world = m->opt.comm ? m->opt.comm->world : 1, rank = m->opt.comm ? m->opt.comm->rank : 0;
    const int zero3 = m->opt.zero_stage >= 3, L = cfg->num_hidden_layers;
    if (m->opt.offload_params && (!zero3 || !m->opt.offload_optimizer))
        fail("internal: offload_params needs zero_stage 3 and offload_optimizer");
    model_check_memory(cfg, lora, &m->opt, bk);
    param_table_build(&m->tab, cfg, lora, m->opt.stream, world,
                      m->opt.load_in_4bit ? 4 : m->opt.load_in_8bit ? 8 : 0, zero3, m->opt.unfrozen);
    const ParamTable *t = &m->tab;
    if (!t->num_trainable) fail("unfrozen_parameters matches none of the model's parameters: nothing would train");
    ModelSize s;
    model_size(cfg, cfg->intermediate_size, cfg->padded_vocab, &t->lora, &s);
    const int subset = !t->lora.r && m->opt.unfrozen && m->opt.unfrozen[0];  // model_size counts all
    if (s.params.n != (int64_t)t->num_params || s.tensors.n != (int64_t)arrlen(t->specs) ||
        (!subset && s.trainable.n != (int64_t)t->num_trainable))
        fail("internal: model_size (%lld tensors, %lld parameters) disagrees with the table (%d, %zu)",
             (long long)s.tensors.n, (long long)s.params.n, (int)arrlen(t->specs), t->num_params);
    const size_t n = t->num_resident, full = t->shard * world;
    // Which trainable indices this rank optimizes (see Model.owned).
    m->owned = xcalloc((size_t)t->nunits, sizeof(*m->owned));
    m->nowned = rank_ranges(t, m->opt.zero_stage, rank, m->owned, &m->local_n);
    const size_t g = m->local_n;
    m->grads_n = zero3 ? g : full;
    if (m->opt.lisa_layers > 0 && m->opt.lisa_layers < L && m->opt.zero_stage == 0) {
        // LISA: a layer outside the draw has no gradient, so only lisa_layers layers need room
        // for one (at Llama 3.1 8B's shape with 2 of 32 layers drawn, 6.5B of its 8.0B float
        // gradients less: --plan 137.17 -> 112.79 GiB). ZeRO-1 and -3 keep every layer's
        // place: their shards and units cut the gradient buffer by goff.
        m->lisa_g0 = t->units[t->nl_units];
        for (int l = 0; l < L; l++) {
            const size_t u = t->units[t->nl_units + l + 1] - t->units[t->nl_units + l];
            m->lisa_slot = u > m->lisa_slot ? u : m->lisa_slot;
        }
        m->grads_n = m->lisa_g0 + (size_t)m->opt.lisa_layers * m->lisa_slot;
        m->lisa_slot_of = xmalloc(sizeof(int) * (size_t)L);
        for (int l = 0; l < L; l++) m->lisa_slot_of[l] = -1;
    }
    m->params = dev_alloc_zero(bk, (n ? n : 1) * bk->act_bytes, zero3 ? "frozen parameters" : "parameters");
    if (zero3) {
        // Gathered copies of the unit in use, and its full-size gradients before they are
        // reduce-scattered to their owners: two layer slots, and one buffer for the embedding
        // or the head, whichever is in use.
        size_t maxu = 0, nl = 0, A = bk->act_bytes;
        for (int u = t->nl_units; u < t->nunits; u++) maxu = unit_shard(t, u) > maxu ? unit_shard(t, u) : maxu;
        for (int u = 0; u < t->nl_units; u++) nl = unit_shard(t, u) > nl ? unit_shard(t, u) : nl;
        const size_t max_piece = maxu > nl ? maxu : nl;
        maxu *= world;
        nl *= world;
        m->z3_nl_unit = -1;
        m->z3_slot_layer[0] = m->z3_slot_layer[1] = -1;
        // The embedding and the head are in use only before and after the layers, so the two
        // gathered layer slots lie inside their buffer (forward_backward.c: a gather into
        // either marks the other's contents gone; a tied embedding is gathered again for the
        // classifier). With an untied head the layers' full gradients lie inside the
        // embedding/head gradients too (the head's are reduced before the layers' backward,
        // the embedding's made after it); a tied embedding's gradients span the whole backward
        // (the classifier's part first, the lookup's last), so the layers' keep their own. At
        // Llama 3.1 8B's shape that is 2 x 218M bf16 weights and 218M float gradients less on
        // every rank.
        const size_t w = nl > 2 * maxu ? nl : 2 * maxu;
        m->z3_nl = dev_alloc_zero(bk, (w ? w : 1) * A, "gathered embedding/head/layer weights");
        m->z3_slot[0] = m->z3_nl;
        m->z3_slot[1] = act_at(bk, m->z3_nl, maxu);
        if (t->nl_units == 2) {
            const size_t g = nl > maxu ? nl : maxu;
            m->z3_nl_grad = m->z3_layer_grad = dev_alloc_zero(bk, (g ? g : 1) * sizeof(float),
                                                              "embedding/head/layer gradients (full)");
        } else {
            m->z3_nl_grad = dev_alloc_zero(bk, (nl ? nl : 1) * sizeof(float), "embedding/head gradients");
            m->z3_layer_grad = dev_alloc_zero(bk, (maxu ? maxu : 1) * sizeof(float), "layer gradients (full)");
        }
        // This rank's pieces: the weights between optimizer steps (gathered per unit for use)
        // and, under offload_params, their gradients too, each unit's reduced piece copied
        // out of the device through z3_host_grad as the backward finishes it.
        const size_t np = t->local3 ? t->local3 : 1;
        if (m->opt.offload_params) {
            m->pieces = host_alloc_zero(bk, np * A, "trainable weights' pieces (host)");
            m->z3_host_grad = host_alloc_zero(bk, (max_piece ? max_piece : 1) * sizeof(float),
                                              "a unit's gradient piece (host)");
        } else {
            m->pieces = dev_alloc_zero(bk, np * A, "trainable weights' pieces");
        }
    }
    m->deq_layer = -1;
    if (m->opt.stream && (m->tab.stream_block || m->tab.qregion)) {
        // A streamed block: the layer's frozen act tensors, then its NF4 region (QLoRA).
        m->tab.block_bytes = ((m->tab.stream_block * bk->act_bytes + 63) & ~(size_t)63) + m->tab.qregion;
        m->host_blocks = bk->host_alloc(bk, m->tab.block_bytes * L, "streamed frozen layer weights");
        m->streamer = streamer_create(bk, L, m->tab.block_bytes, m->host_blocks);
        m->layer_block = xcalloc(L, sizeof(void *));
    } else if (m->tab.qregion) {
        m->qweights = bk->dev_alloc(bk, m->tab.qregion * L, m->opt.load_in_8bit ? "int8 frozen weights" : "NF4 frozen weights");
    }
    if (m->tab.qregion) m->deq = bk->dev_alloc(bk, m->tab.deq_elems * bk->act_bytes, "dequantized layer weights");
    // Gradients are float whatever the act precision (backend.h): 4 bytes per trainable
    // parameter, 2 more than bf16 would take, so that accumulation never rounds to bf16.
    if (m->opt.offload_params)
        m->grads = host_alloc_zero(bk, (g ? g : 1) * sizeof(float), "gradients' pieces (host)");
    else
        m->grads = dev_alloc_zero(bk, (m->grads_n ? m->grads_n : 1) * sizeof(float),
                                  m->lisa_slot_of ? "gradients (the drawn layers')" : "gradients");
    // 8-bit AdamW: byte moments and their blocks' absmax for the large tensors, float moments
    // (ng of them) for the small ones; else float moments for all g.
    size_t ng = g;
    if (m->opt.adam8) {
        adam8_layout(m);
        ng = m->adam8_small;
        float maps[512];
        if (m->opt.adam8 == ADAM4_TORCHAO) adam4_maps(maps);
        else adam8_maps(maps);
        const int host = m->opt.offload_optimizer;
        void *(*alloc)(Backend *, size_t, const char *) = host ? host_alloc_zero : dev_alloc_zero;
        m->q_m = alloc(bk, m->adam8_n ? m->adam8_n : 1, host ? "8-bit AdamW first moments (host)" : "8-bit AdamW first moments");
        m->q_v = alloc(bk, m->adam8_n ? m->adam8_n : 1, host ? "8-bit AdamW second moments (host)" : "8-bit AdamW second moments");
        const size_t nb = (m->adam8_blocks ? m->adam8_blocks : 1) * sizeof(float);
        m->absmax_m = alloc(bk, nb, host ? "8-bit AdamW block scales (host)" : "8-bit AdamW block scales");
        m->absmax_v = alloc(bk, nb, host ? "8-bit AdamW block scales (host)" : "8-bit AdamW block scales");
        m->adam8_maps = alloc(bk, sizeof maps, "8-bit AdamW code maps");
        if (!bk->dry_run) {
            if (host) memcpy(m->adam8_maps, maps, sizeof maps);
            else bk->copy_h2d(bk, m->adam8_maps, maps, sizeof maps, NULL), bk->sync(bk);
        }
    }
    if (m->opt.offload_optimizer) {
        // ZeRO-Offload: the optimizer's fp32 state lives on the host and the update runs there.
        m->adam_m = bk->host_alloc(bk, (ng ? ng : 1) * sizeof(float), "AdamW first moments (host)");
        m->adam_v = bk->host_alloc(bk, (ng ? ng : 1) * sizeof(float), "AdamW second moments (host)");
        m->master = bk->host_alloc(bk, g * sizeof(float), "fp32 master weights (host)");
        // offload_params: the gradients are in host memory already
        m->host_grads = m->opt.offload_params ? m->grads
                                               : bk->host_alloc(bk, model_grads_used(m) * sizeof(float), "gradients (host)");
        if (!bk->dry_run) {  // the planner's counting backend hands out fake addresses
            memset(m->adam_m, 0, (ng ? ng : 1) * sizeof(float));
            memset(m->adam_v, 0, (ng ? ng : 1) * sizeof(float));
        }
    } else {
        m->adam_m = dev_alloc_zero(bk, (ng ? ng : 1) * sizeof(float), "AdamW first moments");
        m->adam_v = dev_alloc_zero(bk, (ng ? ng : 1) * sizeof(float), "AdamW second moments");
        if (bk->act_bytes != sizeof(float))
            m->master = bk->dev_alloc(bk, g * sizeof(float), "fp32 master weights");
    }
}

// The trainable indices rank `rank` optimizes (Model.owned): under ZeRO-3 its piece of every
// unit (the rank-th unit_shard of each, clipped to the unit), under ZeRO-1 its flat shard, else
// all of them. out has room for nunits ranges; returns how many, and the local count in *local_n.
// Every rank computes any rank's ranges alike (saving a sharded model relies on it).
static int rank_ranges(const ParamTable *t, int zero_stage, int rank, OwnedRange *out, size_t *local_n) {
    int n = 0;
    if (zero_stage >= 3) {
        size_t local = 0;
        for (int u = 0; u < t->nunits; u++) {
            size_t s = unit_shard(t, u), g0 = t->units[u] + rank * s, g1 = g0 + s;
            if (g1 > t->units[u + 1]) g1 = t->units[u + 1];
            if (g0 < g1) out[n++] = (OwnedRange){g0, g1, local};
            local += s;
        }
        *local_n = local;
    } else if (zero_stage >= 1) {
        out[n++] = (OwnedRange){rank * t->shard, (rank + 1) * t->shard, 0};
        *local_n = t->shard;
    } else {
        out[n++] = (OwnedRange){0, t->num_trainable, 0};
        *local_n = t->num_trainable;
    }
    return n;
}

static int part_in(const OwnedRange *r, int n, const ParamSpec *p, size_t *a, size_t *b, size_t *local) {
    if (!p->trainable) return 0;
    for (int k = 0; k < n; k++) {
        size_t lo = r[k].g0 > p->goff ? r[k].g0 : p->goff;
        size_t hi = r[k].g1 < p->goff + p->numel ? r[k].g1 : p->goff + p->numel;
        if (lo < hi) {  // a tensor lies in one unit, and ZeRO-1's single range cuts it once
            *a = lo, *b = hi, *local = r[k].local + (lo - r[k].g0);
            return 1;
        }
    }
    return 0;
}

int model_owned_part(const Model *m, const ParamSpec *p, size_t *a, size_t *b, size_t *local) {
    return part_in(m->owned, m->nowned, p, a, b, local);
}

float *model_grad_at(const Model *m, const ParamSpec *p, size_t loc) {
    if (!m->lisa_slot_of || p->layer < 0) return m->grads + loc;
    const int s = m->lisa_slot_of[p->layer];  // zero_stage 0: loc is the goff of the part
    if (s < 0 && m->lisa && m->lisa->on[p->layer])  // a draw that model_lisa_drawn did not see
        fail("internal: LISA layer %d is drawn but has no gradient slot", p->layer);
    return s < 0 ? NULL : m->grads + m->lisa_g0 + (size_t)s * m->lisa_slot + (loc - m->tab.units[m->tab.nl_units + p->layer]);
}

size_t model_grads_used(const Model *m) { return m->lisa_slot_of ? m->grads_n : m->local_n; }

void model_lisa_drawn(Model *m) {
    if (!m->lisa_slot_of) return;
    int k = 0;
    for (int l = 0; l < m->lisa->L; l++) m->lisa_slot_of[l] = m->lisa->on[l] ? k++ : -1;
    if (k > m->opt.lisa_layers) fail("internal: LISA drew %d layers, room for %d", k, m->opt.lisa_layers);
}

// The same for any rank of the run.
static int rank_part(const Model *m, const ParamSpec *p, int rank, size_t *a, size_t *b, size_t *local) {
    if (!m->opt.comm || rank == m->opt.comm->rank) return model_owned_part(m, p, a, b, local);
    OwnedRange *r = xcalloc((size_t)m->tab.nunits, sizeof *r);
    size_t n_local;
    int got = part_in(r, rank_ranges(&m->tab, m->opt.zero_stage, rank, r, &n_local), p, a, b, local);
    free(r);
    return got;
}

// Kernels index the B x T rows of a micro-batch with int, and every activation's bytes must fit
// in 64 bits; on the CPU backend the activations must also fit the host beside the model.
static void check_acts(const Model *m, int B, int T, const MemPolicy *pol) {
    const ModelConfig *c = &m->cfg;
    const Backend *bk = m->bk;
    const Count N = count_mul(count_of(B), count_of(T));
    if (N.n > INT32_MAX)
        fail("micro_batch_size %d x sequence_len %d = %lld tokens per micro-batch, past the 2147483647 "
             "the kernels index", B, T, (long long)N.n);
    int64_t QD = (int64_t)c->num_attention_heads * c->head_dim, wide = c->hidden_size;
    const int64_t widths[] = {QD, c->intermediate_size, c->num_attention_heads, c->vocab_size};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++) wide = widths[i] > wide ? widths[i] : wide;
    const Count biggest = count_mul(count_mul(N, count_of(wide)), count_of(8));
    // q/k norms run over N x heads rows of head_dim, counted in an int.
    if (family_of(c)->qk_norm && count_mul(N, count_of(c->num_attention_heads)).n > INT32_MAX)
        fail("micro_batch_size %d x sequence_len %d x num_attention_heads %d rows of q/k norm are past the "
             "2147483647 the kernels index", B, T, c->num_attention_heads);
    if (biggest.n == INT64_MAX)
        fail("activations need %.3g GiB for one tensor (micro_batch_size %d x sequence_len %d x width %lld), "
             "past 64-bit sizes", biggest.d / 1073741824.0, B, T, (long long)wide);
    if (pol->tiled_attention && m->opt.seq_parallel > 1)
        fail("tiled_attention with sequence_parallel_degree %d: not implemented (attention runs over whole "
             "sequences after the reshuffles); use tiled_mlp", m->opt.seq_parallel);
    if (pol->tiled_attention && bk->att_block <= 0)
        fail("tiled_attention: the %s backend's attention kernels have no query tiles yet; use tiled_mlp", bk->name);
    if (bk->dry_run || !backend_is_host(bk)) return;
    // A lower bound: the kept tensors and the backward scratch model_alloc_acts itself holds.
    ActStats as;
    act_stats(c, pol, B, T, bk->act_bytes, &as);
    const double A = bk->act_bytes, KD = (double)c->num_key_value_heads * c->head_dim;
    const double acts = as.saved_bytes[HOME_DEVICE] + as.saved_bytes[HOME_HOST] +
                        N.d * A * (3.0 * c->hidden_size + (pol->tiled_attention ? 0 : 2.0 * QD) + 2.0 * KD);
    const double model = (double)bk->mem.in_use + (double)bk->mem.host_in_use, have = host_capacity();
    if (model + acts > have)
        fail("activations need %.1f GiB of host memory (micro_batch_size %d x sequence_len %d x hidden_size %d "
             "x %d layers) beside the model's %.1f GiB, but this machine has %.1f GiB; --plan shows modes "
             "that keep less", acts / 1073741824.0, B, T, c->hidden_size, c->num_hidden_layers,
             model / 1073741824.0, have / 1073741824.0);
}

void model_alloc_acts(Model *m, int B, int T, const MemPolicy *pol) {
    Backend *bk = m->bk;
    check_acts(m, B, T, pol);
    const ModelConfig *c = &m->cfg;
    const size_t N = (size_t)B * T, C = c->hidden_size, I = c->intermediate_size;
    const size_t QD = (size_t)c->num_attention_heads * c->head_dim;
    const size_t KD = (size_t)c->num_key_value_heads * c->head_dim;
    const int A = bk->act_bytes;
    m->B = B;
    m->T = T;
    m->pol = *pol;
    // Sequence parallelism runs attention over whole sequences (after its reshuffles): no tiles.
    m->store = actstore_create(bk, c, pol, B, T, m->opt.seq_parallel > 1 ? 0 : bk->att_block);
    const size_t tile = (size_t)act_tile_rows(m->store);
    // Tiled attention keeps one span's rows of the query-sized tensors; whole otherwise.
    const size_t QR = pol->tiled_attention ? att_span_max_rows(B, T, act_att_rows(m->store)) : N;
    // The final norm and the classifier run over the MLP's row chunks: one chunk's output at a time.
    m->final_ln = bk->dev_alloc(bk, tile * C * A, "final norm output");
    m->final_rstd = bk->dev_alloc(bk, 2 * N * sizeof(float), "final norm statistics");
    m->losses = bk->dev_alloc(bk, N * sizeof(float), "token losses");
    m->tokens = bk->dev_alloc(bk, N * sizeof(int32_t), "token ids");
    m->targets = bk->dev_alloc(bk, N * sizeof(int32_t), "target ids");
    const int spn = m->opt.seq_parallel > 1 ? m->opt.seq_parallel : 1;
    const int Tg = T * spn;  // whole sequences: attention's document map and the RoPE table
    m->doc_start = bk->dev_alloc(bk, (size_t)B * Tg * sizeof(int32_t), "document starts");
    m->pos = bk->dev_alloc(bk, N * sizeof(int32_t), "positions");
    if (spn > 1) {
        if (c->arch != ARCH_LLAMA) fail("sequence_parallel_degree needs rotary positions; GPT-2 has learned ones");
        m->sp = xcalloc(1, sizeof(SeqPar));
        seqpar_init(m->sp, bk, m->opt.comm, spn, B, Tg, c->num_attention_heads, c->num_key_value_heads, c->head_dim);
    }
    m->d_res = bk->dev_alloc(bk, N * C * A, "backward scratch");
    m->d_ln = bk->dev_alloc(bk, N * C * A, "backward scratch");
    // Full checkpointing's throwaway output (the recomputed top of a segment) goes where d_ln
    // is: it is dead between two layers' backward passes.
    act_set_sink(m->store, m->d_ln);
    m->d_att = bk->dev_alloc(bk, QR * QD * A, "backward scratch");
    m->d_q = bk->dev_alloc(bk, QR * QD * A, "backward scratch");
    m->d_k = bk->dev_alloc(bk, N * KD * A, "backward scratch");
    // Tiles sum dK/dV over many calls: in float when activations are narrower.
    if (A < 4 && act_att_rows(m->store) < T)
        m->dkv_f32 = bk->dev_alloc(bk, 2 * N * KD * sizeof(float), "attention dK/dV float sums");
    m->d_v = bk->dev_alloc(bk, N * KD * A, "backward scratch");
    m->d_ff1 = bk->dev_alloc(bk, tile * I * A, "backward scratch (MLP)");
    m->d_ff2 = bk->dev_alloc(bk, tile * I * A, "backward scratch (MLP)");
    // Sampling's logits; a token classifier's head holds a chunk's classes there (tile x num_labels).
    const size_t ncls = tile * (size_t)c->num_labels;
    const size_t nlog = c->token_cls && ncls > (size_t)c->vocab_size ? ncls : (size_t)c->vocab_size;
    m->logits = bk->dev_alloc(bk, nlog * A, "sampling logits");
    if (c->arch == ARCH_LLAMA && c->pad_token_id >= 0) m->pad_row = bk->dev_alloc(bk, C * sizeof(float), "padding_idx row");
    if (c->arch == ARCH_LLAMA && family_of(c)->qk_norm) {
        const size_t H = (size_t)c->num_attention_heads + c->num_key_value_heads;
        m->q_rot = bk->dev_alloc(bk, QR * QD * A, "q/k norm working set");
        m->k_rot = bk->dev_alloc(bk, N * KD * A, "q/k norm working set");
        m->qk_rstd = bk->dev_alloc(bk, N * H * sizeof(float), "q/k norm statistics");
    }
    if (m->tab.lora.r > 0) {
        size_t r = m->tab.lora.r, in = C > QD ? C : QD;
        if (I > in) in = I;
        m->lora_tmp = bk->dev_alloc(bk, N * r * A, "LoRA scratch");
        m->lora_dtmp = bk->dev_alloc(bk, N * r * A, "LoRA scratch");
        if (m->tab.lora.dropout > 0) {
            m->lora_xd = bk->dev_alloc(bk, N * in * A, "LoRA dropout scratch");
            m->lora_dxd = bk->dev_alloc(bk, N * in * A, "LoRA dropout scratch");
        }
    }

    // RoPE tables: angle = t * inv_freq in float32 as HF computes it, cos/sin in double (then
    // times longrope's attention factor in float, as HF scales its float32 cos/sin). Longrope
    // has two, short then long factors; model_set_batch picks one per micro-batch.
    // Gemma 3's sliding layers rotate with rope_local_base_freq and no scaling: a table more.
    const int nglob = c->rope_type == ROPE_LONGROPE ? 2 : 1, local = c->rope_local_theta > 0;
    const int half = rope_dims(c) / 2, ntab = nglob + local;
    const size_t per = (size_t)Tg * half;
    m->rope_rows = (size_t)Tg;
    m->rope_tab_cos = bk->dev_alloc(bk, sizeof(float) * per * ntab, "rope table");
    m->rope_tab_sin = bk->dev_alloc(bk, sizeof(float) * per * ntab, "rope table");
    m->rope_cos = m->rope_tab_cos, m->rope_sin = m->rope_tab_sin;
    m->rope_loc_cos = local ? m->rope_tab_cos + nglob * per : NULL;
    m->rope_loc_sin = local ? m->rope_tab_sin + nglob * per : NULL;
    if (bk->dry_run) return;
    ModelConfig lc = *c;  // the local table's config (transformers: rope_theta = the local base, default rope)
    lc.rope_theta = c->rope_local_theta, lc.rope_type = ROPE_DEFAULT, lc.rope_factor = 1.0;
    float *inv = xmalloc(sizeof(float) * half), *cs = xmalloc(sizeof(float) * per), *sn = xmalloc(sizeof(float) * per);
    for (int k = 0; k < ntab; k++) {
        const int loc = k == nglob;
        const float af = !loc && (c->rope_type == ROPE_LONGROPE || c->rope_type == ROPE_YARN) ? (float)c->rope_attention_factor : 1.0f;
        rope_inv_freq(loc ? &lc : c, inv, loc ? 0 : k);
        for (int t = 0; t < Tg; t++)
            for (int i = 0; i < half; i++) {
                float ang = (float)t * inv[i];
                cs[(size_t)t * half + i] = (float)cos(ang) * af;
                sn[(size_t)t * half + i] = (float)sin(ang) * af;
            }
        bk->copy_h2d(bk, m->rope_tab_cos + k * per, cs, sizeof(float) * per, NULL);
        bk->copy_h2d(bk, m->rope_tab_sin + k * per, sn, sizeof(float) * per, NULL);
        bk->sync(bk);
    }
    free(inv);
    free(cs);
    free(sn);
}

// Longrope's table for a micro-batch whose largest position is maxpos: the long factors once
// maxpos + 1 passes original_max_position_embeddings (HF: torch.max(position_ids) + 1).
static void rope_pick(Model *m, int maxpos) {
    const ModelConfig *c = &m->cfg;
    if (c->rope_type != ROPE_LONGROPE) return;
    const size_t off = maxpos + 1 > c->original_max_position_embeddings ? m->rope_rows * (rope_dims(c) / 2) : 0;
    m->rope_cos = m->rope_tab_cos + off, m->rope_sin = m->rope_tab_sin + off;
}

void model_free(Model *m) {
    Backend *bk = m->bk;
    if (m->sample_store) actstore_free(m->sample_store);
    if (m->store) {
        actstore_free(m->store);
        void *ps[] = {m->final_ln, m->final_rstd, m->losses, m->tokens, m->targets, m->doc_start, m->pos, m->d_res,
                      m->d_ln, m->d_att, m->d_q, m->d_k, m->d_v, m->d_ff1, m->d_ff2, m->logits,
                      m->rope_tab_cos, m->rope_tab_sin, m->lora_tmp, m->lora_dtmp, m->lora_xd, m->lora_dxd,
                      m->q_rot, m->k_rot, m->qk_rstd, m->dkv_f32, m->pad_row};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) bk->dev_free(bk, ps[i]);
    }
    if (m->sp) {
        seqpar_free(m->sp, bk);
        free(m->sp);
    }
    if (m->streamer) {
        streamer_free(m->streamer);
        bk->host_free(bk, m->host_blocks);
        free(m->layer_block);
    }
    bk->dev_free(bk, m->qweights);
    bk->dev_free(bk, m->deq);
    bk->dev_free(bk, m->params);
    if (m->opt.offload_params) {
        bk->host_free(bk, m->pieces);
        bk->host_free(bk, m->z3_host_grad);
        bk->host_free(bk, m->grads);  // also host_grads
        m->host_grads = NULL;
    } else {
        bk->dev_free(bk, m->pieces);
        bk->dev_free(bk, m->grads);
    }
    bk->dev_free(bk, m->z3_nl);  // the slots lie inside it
    if (m->z3_layer_grad != m->z3_nl_grad) bk->dev_free(bk, m->z3_layer_grad);
    bk->dev_free(bk, m->z3_nl_grad);
    free(m->owned);
    free(m->lisa_slot_of);
    void (*state_free)(Backend *, void *) = m->opt.offload_optimizer ? bk->host_free : bk->dev_free;
    if (m->opt.adam8) {
        state_free(bk, m->q_m), state_free(bk, m->q_v), state_free(bk, m->absmax_m), state_free(bk, m->absmax_v);
        state_free(bk, m->adam8_maps);
        free(m->adam8);
    }
    if (m->opt.offload_optimizer) {
        bk->host_free(bk, m->adam_m);
        bk->host_free(bk, m->adam_v);
        bk->host_free(bk, m->master);
        bk->host_free(bk, m->host_grads);
    } else {
        bk->dev_free(bk, m->adam_m);
        bk->dev_free(bk, m->adam_v);
        bk->dev_free(bk, m->master);
    }
    param_table_free(&m->tab);
    memset(m, 0, sizeof *m);
}

// Puts a host copy of p's region where the model keeps it (its layer's streamed host block or
// the device), and forgets the dequantized layer.
static void set_region(Model *m, const ParamSpec *p, const void *r) {
    size_t bytes = quant_bytes(p);
    if (m->streamer) {
        memcpy((char *)m->host_blocks + (size_t)p->layer * m->tab.block_bytes + quant_base(m) + p->qoff, r, bytes);
    } else {
        m->bk->copy_h2d(m->bk, (char *)m->qweights + (size_t)p->layer * m->tab.qregion + p->qoff, r, bytes, NULL);
        m->bk->sync(m->bk);
    }
    m->deq_layer = -1;
}

void model_set_param(Model *m, int i, const float *src) {
    const ParamSpec *p = &m->tab.specs[i];
    if (p->quant == 4) {
        Nf4Weight q;
        nf4_quantize(&q, src, p->ndim, p->shape, 64, 1, "float32", p->name);
        model_set_param_nf4(m, i, &q);
        nf4_free(&q);
        return;
    }
    if (p->quant == 8) {
        void *r = xmalloc(quant_bytes(p));
        int8_quantize(src, (size_t)p->shape[0], (size_t)p->shape[1], r, p->name);
        set_region(m, p, r);
        free(r);
        return;
    }
    if (p->streamed) {
        char *blk = (char *)m->host_blocks + (size_t)p->layer * m->tab.block_bytes;
        m->bk->host_from_f32(m->bk, blk + p->offset * m->bk->act_bytes, src, p->numel);
        return;
    }
    size_t a, b, loc;
    int own = model_owned_part(m, p, &a, &b, &loc);
    if (p->trainable && m->opt.zero_stage >= 3) {  // only this rank's piece is kept
        if (own && m->opt.offload_params)
            m->bk->host_from_f32(m->bk, act_at(m->bk, m->pieces, loc), src + (a - p->goff), b - a);
        else if (own)
            m->bk->upload_act(m->bk, act_at(m->bk, m->pieces, loc), src + (a - p->goff), b - a);
    } else {
        m->bk->upload_act(m->bk, act_at(m->bk, m->params, p->offset), src, p->numel);
    }
    if (m->master && own) model_state_put(m, m->master + loc, src + (a - p->goff), b - a);
}

void model_state_copy(const Model *m, void *dst, const void *src, size_t bytes, int to_state) {
    if (m->opt.offload_optimizer) memcpy(dst, src, bytes);
    else if (to_state) m->bk->copy_h2d(m->bk, dst, src, bytes, NULL);
    else m->bk->copy_d2h(m->bk, dst, src, bytes, NULL);
    if (!m->opt.offload_optimizer) m->bk->sync(m->bk);
}

void model_state_put(const Model *m, float *state, const float *src, size_t n) {
    model_state_copy(m, state, src, n * sizeof(float), 1);
}

void model_state_get(const Model *m, float *dst, const float *state, size_t n) {
    model_state_copy(m, dst, state, n * sizeof(float), 0);
}

// ---- reading a sharded model's tensors (saving) ------------------------------------------
// Under ZeRO-3 each rank keeps a piece of every trainable weight, and under ZeRO >= 1 with an
// fp32 master (bf16 weights, or offload_optimizer) the master is spread over the ranks: what is
// saved is the master. Rank 0 writes the files, pulling whole tensors through model_get_param,
// in whatever order its writer wants them. So between model_gather_all and model_gather_done
// rank 0 asks for a tensor by broadcasting its index; then each rank that holds a piece of it
// broadcasts the piece in turn (float32, in chunks), and rank 0 copies each into place; the
// other ranks answer such requests until rank 0 sends -1. At no time does any rank hold more
// than one tensor and a chunk of it (rank 0 once gathered the whole fp32 master into host
// memory, and ZeRO-3 without a master the whole model into device memory, which the plan did
// not count: a run that fitted would have run out of memory at its first save).

// The tensor's trainable values are sharded over the ranks' memories.
static int sharded(const Model *m) {
    return m->opt.comm && m->opt.comm->world > 1 &&
           (m->opt.zero_stage >= 3 || (m->master && m->opt.zero_stage >= 1));
}

// This rank holds all of trainable tensor p (at local index *loc): always unless sharded.
static int whole_here(const Model *m, const ParamSpec *p, size_t *loc) {
    size_t a, b;
    if (!sharded(m) && m->opt.zero_stage < 3) {
        *loc = p->goff;  // whole weights on every rank; an fp32 master, if any, is not split either
        return 1;
    }
    return model_owned_part(m, p, &a, &b, loc) && a == p->goff && b == p->goff + p->numel;
}

// n float32 values of this rank's piece from local index loc: the fp32 master (host memory
// under offload_optimizer), else the act weights (without a master a piece is ZeRO-3's, and
// offload_params always has a master).
static void read_piece(const Model *m, size_t loc, size_t n, float *dst) {
    Backend *bk = m->bk;
    if (m->master) {
        model_state_get(m, dst, m->master + loc, n);
    } else {
        bk->download_act(bk, dst, act_at(bk, m->opt.zero_stage >= 3 ? m->pieces : m->params, loc), n);
    }
}

// Every rank's part of trainable tensor i, in rank order, into rank 0's dst (NULL elsewhere).
// Rank 0 reads its own part directly; any other part travels as float32 broadcasts from its
// rank of at most LLMC_SAVE_GATHER_FLOATS (default 4M) floats, so that tests can make a piece
// take several.
static void gather_tensor(const Model *m, int i, float *dst) {
    const ParamSpec *p = &m->tab.specs[i];
    Comm *c = m->opt.comm;
    const char *env = getenv("LLMC_SAVE_GATHER_FLOATS");
    size_t chunk = env && atol(env) > 0 ? (size_t)atol(env) : (size_t)4 << 20, a, b, loc;
    if (chunk > (size_t)1 << 28) chunk = (size_t)1 << 28;  // 1 GiB a broadcast: within MPI's int count
    if (chunk > p->numel) chunk = p->numel;
    float *buf = NULL;
    for (int r = 0; r < c->world; r++) {
        if (!rank_part(m, p, r, &a, &b, &loc)) continue;
        if (r == 0) {
            if (c->rank == 0) read_piece(m, loc, b - a, dst + (a - p->goff));
            continue;
        }
        if (!buf) buf = xmalloc(chunk * sizeof(float));
        for (size_t k = 0; k < b - a; k += chunk) {
            const size_t n = b - a - k < chunk ? b - a - k : chunk;
            if (c->rank == r) read_piece(m, loc + k, n, buf);
            c->broadcast(c, buf, n * sizeof(float), r);
            if (c->rank == 0) memcpy(dst + (a - p->goff) + k, buf, n * sizeof(float));
        }
    }
    free(buf);
}

// Rank 0's request: a tensor's index, or -1 when it has read all it wants.
static int64_t request(const Model *m, int64_t req) {
    m->opt.comm->broadcast(m->opt.comm, &req, sizeof req, 0);
    return req;
}

void model_gather_all(Model *m) {
    if (!sharded(m)) return;
    if (m->opt.comm->rank == 0) {
        m->gathering = 1;
        return;
    }
    for (int64_t i; (i = request(m, -1)) >= 0;) {
        if (i >= arrlen(m->tab.specs) || !m->tab.specs[i].trainable)
            fail("internal: rank 0 asked for tensor %lld, not a trainable one", (long long)i);
        gather_tensor(m, (int)i, NULL);
    }
}

void model_gather_done(Model *m) {
    if (!m->gathering) return;
    request(m, -1);
    m->gathering = 0;
}

void model_get_param(const Model *m, int i, float *dst) {
    const ParamSpec *p = &m->tab.specs[i];
    size_t loc;
    if (p->quant) {
        // Dequantized on the host from a copy of the region, exactly as the kernel would.
        size_t bytes = quant_bytes(p);
        void *r = xmalloc(bytes);
        if (m->streamer) {
            memcpy(r, (const char *)m->host_blocks + (size_t)p->layer * m->tab.block_bytes + quant_base(m) + p->qoff, bytes);
        } else {
            m->bk->copy_d2h(m->bk, r, (const char *)m->qweights + (size_t)p->layer * m->tab.qregion + p->qoff, bytes, NULL);
            m->bk->sync(m->bk);
        }
        if (p->quant == 8) int8_region_dequantize(r, dst);
        else nf4_region_dequantize(r, dst);
        free(r);
    } else if (p->streamed) {
        const char *blk = (const char *)m->host_blocks + (size_t)p->layer * m->tab.block_bytes;
        m->bk->host_to_f32(m->bk, dst, blk + p->offset * m->bk->act_bytes, p->numel);
    } else if (p->trainable && !whole_here(m, p, &loc)) {
        if (!m->gathering) fail("internal: %s read while sharded (call model_gather_all first)", p->name);
        request(m, i);
        gather_tensor(m, i, dst);
    } else if (p->trainable && (m->master || m->opt.zero_stage >= 3)) {
        // The fp32 master (ZeRO-3 included: its act copy is the rounded one), else this rank's
        // act piece, which is all of the tensor.
        read_piece(m, loc, p->numel, dst);
    } else {
        m->bk->download_act(m->bk, dst, act_at(m->bk, m->params, p->offset), p->numel);
    }
}

// The slot that holds target t's adapter in layer l (-1: none) and the first row of its B that
// t's outputs use: t's own, or for a fused module's later parts the first part's slot (k at
// QD, v at QD + KD; up at I). The parts then share A and the dropout mask of the slot, as
// PEFT's one adapter on c_attn, qkv_proj or gate_up_proj does.
int model_lora_slot(const Model *m, int l, int t, size_t *brow) {
    const ModelConfig *c = &m->cfg;
    const size_t QD = (size_t)c->num_attention_heads * c->head_dim, KD = (size_t)c->num_key_value_heads * c->head_dim;
    *brow = 0;
    if (lora_fused_qkv(c) && (t == LORA_K || t == LORA_V)) {
        *brow = t == LORA_K ? QD : QD + KD;
        t = LORA_Q;
    } else if (lora_fused_gate_up(c) && t == LORA_UP) {
        *brow = (size_t)c->intermediate_size;
        t = LORA_GATE;
    }
    return param_index(&m->tab, l, P_LORA_A + t) < 0 ? -1 : t;
}

void model_get_param_merged(const Model *m, int i, float *dst) {
    model_get_param(m, i, dst);
    const ParamSpec *p = &m->tab.specs[i];
    if (p->layer < 0 || m->tab.lora.r == 0) return;
    for (int t = 0; t < LORA_TARGETS; t++) {
        if (param_index(&m->tab, p->layer, LORA_WEIGHT[t]) != i) continue;
        size_t brow;
        const int s = model_lora_slot(m, p->layer, t, &brow);
        if (s < 0) return;
        const int ia = param_index(&m->tab, p->layer, P_LORA_A + s), ib = param_index(&m->tab, p->layer, P_LORA_B + s);
        const size_t r = (size_t)m->tab.lora.r, out = (size_t)p->shape[0], in = (size_t)p->shape[1];
        float *A = xmalloc(sizeof(float) * m->tab.specs[ia].numel), *B = xmalloc(sizeof(float) * m->tab.specs[ib].numel);
        model_get_param(m, ia, A);
        model_get_param(m, ib, B);
        for (size_t o = 0; o < out; o++)
            for (size_t k = 0; k < r; k++) {
                const float b = m->tab.lora_scale * B[(brow + o) * r + k];
                for (size_t c = 0; c < in; c++) dst[o * in + c] += b * A[k * in + c];
            }
        free(A), free(B);
        return;
    }
}

// Matrices are drawn in chunks of INIT_CHUNK elements, each chunk from its own stream (seeded by
// the run's seed, the tensor's name and the chunk's index), so the values depend neither on how
// many threads draw them nor on what else the table holds (a LoRA run's base is the full run's),
// and the chunks are drawn in parallel: one stream for the whole model spent ~30 s of a 1.1B
// model's start in Box-Muller's log and cos (and would spend minutes of an 8B's).
#define INIT_CHUNK ((size_t)1 << 16)

static void init_normal(float *w, size_t n, size_t live, float std, uint64_t seed, const char *name) {
    const uint64_t h = fnv1a(14695981039346656037ULL, name, strlen(name));
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < (n + INIT_CHUNK - 1) / INIT_CHUNK; c++) {
        Rng rng;
        rng_seed(&rng, seed ^ h ^ (c + 1) * 0x9E3779B97F4A7C15ULL);
        for (size_t j = c * INIT_CHUNK; j < n && j < (c + 1) * INIT_CHUNK; j++)
            w[j] = j < live ? std * rng_normal(&rng) : 0.0f;
    }
}

void model_init_random(Model *m, uint64_t seed) {
    const int gpt2 = m->cfg.arch == ARCH_GPT2;
    // transformers' _init_weights: N(0, initializer_range) matrices, the embedding's padding row
    // zero. GPT-2 (as llm.c initialises it) scales the residual projections by 1/sqrt(2L).
    const float base_std = !gpt2 && m->cfg.initializer_range > 0 ? m->cfg.initializer_range : 0.02f;
    const float proj_std = gpt2 ? 0.02f / sqrtf(2.0f * m->cfg.num_hidden_layers) : base_std;
    for (int i = 0; i < (int)arrlen(m->tab.specs); i++) {
        const ParamSpec *p = &m->tab.specs[i];
        if (strstr(p->name, ".lora_")) continue;  // adapters: model_init_lora
        // Vectors are norm weights (ones) or biases (zeros); matrices are N(0, std).
        int is_bias = p->ndim == 1 && strstr(p->name, ".bias") != NULL, is_norm = p->ndim == 1 && !is_bias;
        float std = gpt2 && (strstr(p->name, "attn.c_proj.weight") || strstr(p->name, "mlp.c_proj.weight")) ? proj_std : base_std;
        // GPT-2's padded vocabulary rows stay zero: they never produce a logit.
        size_t live = i == m->tab.embed && gpt2 ? (size_t)m->cfg.vocab_size * p->shape[1] : p->numel;
        float *w = xmalloc(sizeof(float) * p->numel);
        // Gemma's norms apply 1 + w: their weights start at 0 (Gemma3RMSNorm's zeros).
        if (is_norm || is_bias)
            for (size_t j = 0; j < p->numel; j++) w[j] = is_norm && !family_norm_add(&m->cfg) ? 1.0f : 0.0f;
        else
            init_normal(w, p->numel, live, std, seed, p->name);
        if (i == m->tab.embed && !gpt2 && m->cfg.pad_token_id >= 0)
            memset(w + (size_t)m->cfg.pad_token_id * p->shape[1], 0, sizeof(float) * p->shape[1]);
        model_set_param(m, i, w);
        free(w);
    }
}

void model_init_param(Model *m, int i, uint64_t seed) {
    const ParamSpec *p = &m->tab.specs[i];
    float *w = xcalloc(p->numel, sizeof(float));  // a bias: zeros (transformers' _init_weights)
    if (p->ndim > 1)
        init_normal(w, p->numel, p->numel, m->cfg.initializer_range > 0 ? m->cfg.initializer_range : 0.02f, seed, p->name);
    model_set_param(m, i, w);
    free(w);
}

void model_set_param_nf4(Model *m, int i, const void *nf4_weight) {
    const Nf4Weight *q = nf4_weight;
    const ParamSpec *p = &m->tab.specs[i];
    size_t bytes = nf4_region_bytes(q->n, q->blocksize, q->nested);
    if (p->quant != 4 || q->n != p->numel || q->blocksize != 64 || !q->nested || q->nested_blocksize != 256 ||
        bytes != nf4_region_bytes(p->numel, 64, 1))
        fail("%s: 4-bit weight layout (blocksize %d, nested %d) is not the NF4 blocksize 64 with double "
             "quantization this trainer stores", p->name, q->blocksize, q->nested);
    void *r = xmalloc(bytes);
    nf4_region_pack(q, r);
    set_region(m, p, r);
    free(r);
}

void model_init_lora(Model *m, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed ^ 0x10AA10AAULL);
    for (int i = 0; i < (int)arrlen(m->tab.specs); i++) {
        const ParamSpec *p = &m->tab.specs[i];
        int is_a = strstr(p->name, ".lora_A.") != NULL;
        if (!is_a && !strstr(p->name, ".lora_B.")) continue;
        float *w = xmalloc(sizeof(float) * p->numel), bound = 1.0f / sqrtf((float)p->shape[1]);
        for (size_t j = 0; j < p->numel; j++) w[j] = is_a ? bound * (2 * rng_uniform(&rng) - 1) : 0.0f;
        model_set_param(m, i, w);
        free(w);
    }
}

// Sequence parallel: the global positions of this rank's tokens (t0 + t, or that minus the
// document start) and the whole rows' document map.
static void set_batch_sp(Model *m, const int32_t *doc_start, int B, int T) {
    Backend *bk = m->bk;
    const int Tg = m->sp->T, t0 = m->sp->rank * T;
    int32_t *pos = xmalloc(sizeof(int32_t) * (size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const int g = t0 + t;
            const int32_t *ds = doc_start ? doc_start + (size_t)b * Tg : NULL;
            if (ds && (ds[g] < 0 || ds[g] > g || (g > 0 && ds[g] < ds[g - 1])))
                fail("internal: bad document start %d at row %d position %d", ds[g], b, g);
            pos[(size_t)b * T + t] = ds ? g - ds[g] : g;
        }
    // The whole micro-batch's largest position (every rank has the whole rows' documents).
    int maxpos = Tg - 1;
    if (doc_start) {
        maxpos = 0;
        for (size_t i = 0; i < (size_t)B * Tg; i++)
            if ((int)(i % Tg) - doc_start[i] > maxpos) maxpos = (int)(i % Tg) - doc_start[i];
    }
    rope_pick(m, maxpos);
    if (doc_start) bk->copy_h2d(bk, m->doc_start, doc_start, sizeof(int32_t) * B * Tg, NULL);
    bk->copy_h2d(bk, m->pos, pos, sizeof(int32_t) * B * T, NULL);
    bk->sync(bk);
    free(pos);
    m->has_docs = doc_start != NULL;
    m->has_pos = 1;
}

void model_set_batch(Model *m, const int32_t *tokens, const int32_t *targets,
                     const int32_t *doc_start, int B, int T) {
    Backend *bk = m->bk;
    const size_t N = (size_t)B * T;
    bk->copy_h2d(bk, m->tokens, tokens, sizeof(int32_t) * N, NULL);
    if (targets) bk->copy_h2d(bk, m->targets, targets, sizeof(int32_t) * N, NULL);
    m->has_docs = m->has_pos = 0;
    if (m->sp) return set_batch_sp(m, doc_start, B, T);
    rope_pick(m, T - 1);  // positions run to T - 1 in a row without documents
    if (!doc_start && m->cfg.arch == ARCH_LLAMA) {
        // Tiles of rows need their RoPE positions spelled out (NULL means "from 0").
        int32_t *pos = xmalloc(sizeof(int32_t) * N);
        for (size_t i = 0; i < N; i++) pos[i] = (int32_t)(i % (size_t)T);
        bk->copy_h2d(bk, m->pos, pos, sizeof(int32_t) * N, NULL);
        bk->sync(bk);
        free(pos);
        m->has_pos = 1;
        return;
    }
    if (!doc_start) return;
    if (m->cfg.arch != ARCH_LLAMA)
        fail("packed documents need rotary positions; GPT-2 has learned positions");
    int32_t *pos = xmalloc(sizeof(int32_t) * N);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const size_t i = (size_t)b * T + t;
            // A document starts at or before t and never before an earlier token's document.
            if (doc_start[i] < 0 || doc_start[i] > t || (t > 0 && doc_start[i] < doc_start[i - 1]))
                fail("internal: bad document start %d at row %d position %d", doc_start[i], b, t);
            pos[i] = t - doc_start[i];
        }
    int maxpos = 0;
    for (size_t i = 0; i < N; i++) maxpos = pos[i] > maxpos ? pos[i] : maxpos;
    rope_pick(m, maxpos);
    bk->copy_h2d(bk, m->doc_start, doc_start, sizeof(int32_t) * N, NULL);
    bk->copy_h2d(bk, m->pos, pos, sizeof(int32_t) * N, NULL);
    bk->sync(bk);  // pos is freed below; copies may be asynchronous
    free(pos);
    m->has_docs = m->has_pos = 1;
}
