// family.h: the Llama-shaped model families as data. Every difference between Llama, Mistral,
// Qwen2, Qwen3 and Phi-3 that the trainer implements is a field of one row of this table, read when
// config.json is loaded and when the parameter table is built; the block forward/backward in
// forward_backward.c is written once and asks the row, never the family's name.
#pragma once
#include "model.h"

// How config.json decides a bias: from its attention_bias key, never, or always.
enum { BIAS_FROM_CONFIG = 0, BIAS_NEVER = 1, BIAS_ALWAYS = 2 };
// Which layers attend through a sliding window (ModelConfig.sliding_window keys):
//   WIN_NONE   no window (Llama)
//   WIN_ALL    every layer when sliding_window is set (Mistral)
//   WIN_QWEN   only with use_sliding_window, and only layers l >= max_window_layers (Qwen2/3,
//              transformers' layer_types rule)
//   WIN_PATTERN every layer but each sliding_pattern-th (Gemma 3: l + 1 a multiple of 6 is
//              global; Gemma 2: every other), Gemma 3's with RoPE of rope_local_base_freq
enum { WIN_NONE = 0, WIN_ALL = 1, WIN_QWEN = 2, WIN_PATTERN = 3 };

typedef struct {
    const char *model_type;    // config.json model_type
    const char *architecture;  // architectures[0] written back
    int qkv_bias, o_bias;      // BIAS_*: q/k/v projections, o_proj
    int qk_norm;               // RMSNorm over head_dim on each q and k head, before RoPE
                               // (self_attn.q_norm.weight / k_norm.weight [head_dim])
    int window;                // WIN_*
    int head_dim;              // default when config.json has none (0: hidden / heads)
    int sliding_window;        // default when the key is absent (null means none)
    int max_window_layers;     // default when the key is absent (WIN_QWEN)
    int fused;                 // Phi-3's files: q/k/v as one self_attn.qkv_proj.weight and
                               // gate/up as one mlp.gate_up_proj.weight (the table keeps them
                               // apart; they are split at load and joined at save)
    int pad_token_id;          // default when the key is absent (-1: none)
    int tie_default;           // tie_word_embeddings when the key is absent
    // Gemma: RMSNorms apply 1 + w (their files hold w; random init 0), the MLP is GeGLU
    // (which GELU: ModelConfig.gelu_exact), the embedding's output is multiplied by
    // sqrt(hidden_size), and (Gemma 2 and 3) each half of a layer has a norm on its output too
    // (sandwich: post_attention_layernorm, then pre_feedforward_layernorm and
    // post_feedforward_layernorm around the MLP).
    int norm_add, gelu_mlp, embed_scale, sandwich;
} ModelFamily;

// The row of model_type, or NULL when the family is not implemented.
const ModelFamily *family_find(const char *model_type);
// The row of a config (model_type "" or unknown falls back to Llama: random-init configs).
const ModelFamily *family_of(const ModelConfig *c);
// The row whose architectures[0] this is, or NULL.
const ModelFamily *family_by_architecture(const char *architecture);
// The family's ...ForSequenceClassification (kind "Sequence": a reward model's) or
// ...ForTokenClassification ("Token": a process reward model's) name, and whether it is architecture.
void family_classifier_name(const ModelFamily *f, const char *kind, char *out, size_t cap);
int family_classifier_architecture(const ModelFamily *f, const char *kind, const char *architecture);
// "llama, mistral, qwen2, qwen3" and the architectures: for error messages.
const char *family_list(void);
const char *family_architectures(void);
// The attention window of layer l (0: none): what the attention op is given.
int family_layer_window(const ModelConfig *c, int l);
// 1 when layer l is one of a WIN_PATTERN family's sliding layers (Gemma 2 and 3).
int family_layer_sliding(const ModelConfig *c, int l);
// 1 when layer l rotates with the local RoPE tables (Gemma 3's sliding layers).
int family_layer_local_rope(const ModelConfig *c, int l);
// The row's Gemma traits for a config (0 for GPT-2 and the other families): what the norms
// add to their weights, GeGLU, sqrt(hidden) embedding scale, sandwich norms.
float family_norm_add(const ModelConfig *c);
int family_gelu_mlp(const ModelConfig *c);
int family_embed_scale(const ModelConfig *c);
int family_sandwich(const ModelConfig *c);
// A table tensor's name in the Hugging Face module tree: itself, or on a Gemma 3 multimodal
// model (Gemma3ForConditionalGeneration, transformers >= 4.52) model.X as model.language_model.X.
void family_hf_name(const ModelConfig *c, const char *name, char *out, size_t cap);

// Where table tensor i lives in a fused file tensor: its rows [row0, row0 + shape[0]) of
// name's [rows, shape[1]], which stacks the table tensors parts[0..nparts) in that order.
typedef struct {
    char name[96];
    int64_t row0, rows;
    int part, nparts, parts[3];
} FusedSlice;
// 1 and *f filled when tensor i of t is written fused (Phi-3's q/k/v and gate/up), else 0.
int family_fused_slice(const ParamTable *t, int i, FusedSlice *f);
