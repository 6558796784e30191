// model.h: the Llama architecture as data (a config, a flat parameter table) and the block
// forward/backward written once over backend ops.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "backend.h"
#include "lisa.h"
#include "mempolicy.h"

enum { ROPE_DEFAULT = 0, ROPE_LLAMA3 = 1, ROPE_LONGROPE = 2, ROPE_YARN = 3, ROPE_LINEAR = 4 };
#define ROPE_MAX_HALF 256  // head_dim / 2 at most, for longrope's per-frequency factors
enum { YARN_ORIG = 1, YARN_BETA_FAST = 2, YARN_BETA_SLOW = 4, YARN_MSCALE = 8, YARN_MSCALE_ALL = 16, YARN_TRUNCATE = 32 };
// The block family: Llama (RMSNorm, RoPE, GQA, SwiGLU) or GPT-2 (LayerNorm with bias, learned
// positions, GELU MLP, biases on every linear, tied head over a padded vocabulary).
enum { ARCH_LLAMA = 0, ARCH_GPT2 = 1 };

// Hugging Face config.json fields of the Llama family (Llama 2/3, Mistral, Qwen2, SmolLM).
typedef struct {
    int arch;                 // ARCH_LLAMA or ARCH_GPT2
    int padded_vocab;         // GPT-2: rows of the embedding (vocab_size rounded up to 128)
    char model_type[32];      // "llama", "mistral", "qwen2", "qwen3", "phi3": a row of family.h
    int vocab_size;
    int hidden_size;          // C
    int intermediate_size;    // I
    int num_hidden_layers;    // L
    int num_attention_heads;  // Hq
    int num_key_value_heads;  // Hkv (GQA); defaults to Hq
    int head_dim;             // D; defaults to C / Hq
    int max_position_embeddings;
    float rms_norm_eps;
    float initializer_range;       // config.json's std of a random init (reinit_weights); 0: 0.02
    double rope_theta;
    int rope_type;            // ROPE_DEFAULT, ROPE_LLAMA3, ROPE_LONGROPE (Phi-3), ROPE_YARN or ROPE_LINEAR
                              // (linear: inv_freq / rope_factor)
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_position_embeddings;
    int tie_word_embeddings;
    int attention_bias;       // q/k/v biases; o_proj's too where the family says (family.h)
    int bos_token_id, eos_token_id;  // -1 if absent; eos_token_id is the first of eos_ids
    // The embedding's padding_idx (transformers' nn.Embedding(..., pad_token_id)): that row
    // gets no gradient from the lookup. -1: none (null, or absent where the family has no
    // default).
    int pad_token_id;
    // Phi-3's top-level original_max_position_embeddings: only longrope reads it (refused), so
    // it is kept only to be written back (0: absent).
    int original_max_position_embeddings;
    // Phi-3's longrope (rope_scaling type "longrope", legacy "su"/"yarn"): inv_freq[i] is divided
    // by short_factor[i] while a micro-batch's positions stay below
    // original_max_position_embeddings, by long_factor[i] past it, and cos/sin are scaled by
    // the attention factor (rope_scaling's attention_factor, else sqrt(1 + ln(max/orig) /
    // ln(orig)) when max_position_embeddings > orig).
    float rope_short_factor[ROPE_MAX_HALF], rope_long_factor[ROPE_MAX_HALF];
    double rope_attention_factor;   // longrope and yarn: cos/sin are scaled by it
    int rope_has_attention_factor;  // given in the file (written back then)
    // YaRN (rope_type "yarn": Qwen2.5's long-context setting, any Llama-like family): factor
    // and rope_original_max_position_embeddings above (0: max_position_embeddings), the ramp
    // between beta_fast and beta_slow rotations (truncated to whole dimensions unless
    // truncate is false), DeepSeek's mscale / mscale_all_dim for the attention factor.
    double rope_beta_fast, rope_beta_slow, rope_mscale, rope_mscale_all_dim;
    int rope_truncate;
    int rope_yarn_keys;             // YARN_* bits: the optional keys the file gave
    int eos_ids[16], n_eos;   // config.json's eos_token_id: all its ids (a list when eos_is_list)
    int eos_is_list;
    // Sliding-window attention (family.h says which layers use it): sliding_window as
    // config.json has it (0: null/none), Qwen's use_sliding_window and max_window_layers.
    int sliding_window;
    int use_sliding_window;
    int max_window_layers;
    char torch_dtype[12];     // the base's weights: "float32", "bfloat16", "float16" ("": float32)
    // Gemma 3 (family.h's row holds what is fixed: 1 + w norms, GeGLU, the embedding scale,
    // sandwich norms): every sliding_pattern-th layer (l + 1 a multiple) is global and the
    // others slide, with RoPE of rope_local_theta and no scaling on the sliding ones
    // (rope_theta and rope_scaling on the global ones); the attention scales scores by
    // query_pre_attn_scalar^-0.5 (0 for other families: head_dim^-0.5).
    int sliding_pattern;      // WIN_PATTERN families; 0: none
    double rope_local_theta;  // 0: every layer uses rope_theta
    int query_pre_attn_scalar;
    // Phi-3 family (Phi-4-mini: 0.75): RoPE rotates the first int(head_dim * partial_rotary_factor)
    // dimensions of each head and passes the rest (modeling_phi3); 0 for 1.0. rope_dims() below.
    int rotary_dim;
    double partial_rotary_factor;
    // Gemma 2 (and Gemma 3 when set): logit soft-capping, cap tanh(x / cap), of the scaled
    // attention scores before the mask and softmax, and of the classifier's logits; 0: none.
    double attn_softcap, final_softcap;
    // Gemma's GeGLU with exact GELU (erf; "gelu") instead of the tanh approximation, and when
    // config.json's two activation keys disagree, a note saying which was followed (hf.c).
    int gelu_exact;
    char gelu_note[240];
    // Gemma 3 4B/12B/27B files (Gemma3ForConditionalGeneration, model_type gemma3): the text
    // model of text_config, its tensors under language_model.model. (or model.language_model.);
    // the vision tower is not loaded, so only adapters train (their module names as PEFT gives
    // them on that model: model.language_model.layers.N...).
    // A sequence classifier's outputs (a reward model: 1): the head is score.weight [num_labels,
    // C] on the last non-pad token instead of the LM head (transformers'
    // ...ForSequenceClassification); 0: a causal LM. hf.c reads it from a classifier's config.json
    // (its id2label), the run sets it for reward_model.
    int num_labels;
    // A token classifier (a process reward model: ...ForTokenClassification): score.weight and
    // score.bias [num_labels] give every position's classes (cross-entropy on the labelled ones).
    int token_cls;
    int multimodal;
} ModelConfig;

// The dimensions of a head RoPE rotates (the first ones), and so the tables' width times 2.
static inline int rope_dims(const ModelConfig *c) { return c->rotary_dim > 0 ? c->rotary_dim : c->head_dim; }

// Per-layer parameters, in the order they appear in the flat table; then the LoRA adapters
// A and B of each target projection (LORA_Q..LORA_DOWN), present only for adapter runs.
enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_TARGETS };
enum {
    P_LN1, P_WQ, P_BQ, P_WK, P_BK, P_WV, P_BV, P_WO, P_BO, P_LN2, P_WGATE, P_WUP, P_WDOWN,
    P_LN1B, P_LN2B, P_BUP, P_BDOWN,  // GPT-2: LayerNorm biases, fc (in P_WUP) and proj biases
    P_QNORM, P_KNORM,                // Qwen3, Gemma 3: RMSNorm weights [head_dim] of q and k heads
    P_LNPA, P_LNPF,                  // Gemma 3: norms of the attention's and the MLP's outputs
                                     // (post_attention_layernorm, post_feedforward_layernorm;
                                     // P_LN2 is then pre_feedforward_layernorm)
    P_LORA_A, P_LORA_B = P_LORA_A + LORA_TARGETS, P_PER_LAYER = P_LORA_B + LORA_TARGETS
};
extern const char *const LORA_TARGET_NAMES[LORA_TARGETS];  // "q_proj", ..., "down_proj"
extern const int LORA_WEIGHT[LORA_TARGETS];                // P_WQ, ..., P_WDOWN: the adapted weight
// The Hugging Face module that carries target t's adapter in layer l, as PEFT names it:
// model.layers.3.self_attn.q_proj; GPT-2: transformer.h.3.attn.c_attn (q, k and v alike),
// attn.c_proj, mlp.c_fc, mlp.c_proj.
void lora_module_name(char *out, size_t cap, const ModelConfig *c, int layer, int t);

// Per-layer LoRA targeting covers models of up to this many layers.
#define LORA_MAX_LAYERS 1024

// LoRA: y = W x + scale * B(A(dropout(x))) on the target projections; the base is frozen.
typedef struct {
    int r;            // 0: no adapters (full fine-tuning)
    float alpha, dropout;
    int targets;      // bit t set: LORA_* target t is adapted (in some layer)
    int rslora;       // scale alpha/sqrt(r) instead of alpha/r
    // Per-layer targeting (PEFT's layers_to_transform, full module paths, regexes): when
    // per_layer is set, layer l adapts the projections of layer_targets[l] (possibly none)
    // and targets is their union; otherwise every layer adapts targets.
    int per_layer;
    unsigned char layer_targets[LORA_MAX_LAYERS];
    // PEFT's modules_to_save (Axolotl's lora_modules_to_save): the embedding and/or the untied
    // head train whole beside the adapters and are saved in the adapter file.
    int save_embed, save_head;
} LoraConfig;

// GPT-2's c_attn (a Conv1D) and Phi-3's self_attn.qkv_proj are one module over q, k and v, and
// Phi-3's mlp.gate_up_proj one over gate and up: PEFT gives such a module one adapter, A [r, in]
// over the input and B [rows of all parts, r] over the fused output. Here the first part's slot
// (LORA_Q, LORA_GATE) holds that A and B; the parts' bits are set together and the other parts'
// slots stay empty (their rows of B follow: k at QD, v at QD + KD; up at I).
int family_is_fused(const ModelConfig *c);  // family.c: the files hold Phi-3's fused modules
static inline int lora_fused_qkv(const ModelConfig *c) { return c->arch == ARCH_GPT2 || family_is_fused(c); }
static inline int lora_fused_gate_up(const ModelConfig *c) { return family_is_fused(c); }

// The LORA_* bit mask of the projections layer l adapts.
static inline int lora_layer_targets(const LoraConfig *lc, int l) {
    return lc->per_layer ? lc->layer_targets[l] : lc->targets;
}

typedef struct {
    char name[96];     // Hugging Face name, e.g. model.layers.3.self_attn.q_proj.weight
    int ndim;
    int64_t shape[2];
    size_t offset;     // in elements from the start of the flat parameter buffer
    size_t numel;
    int layer;         // -1 for embedding, final norm, head
    int unit;          // ZeRO-3's unit (ParamTable.units): a layer's, the embedding's or the head's
    int decay;         // weight decay applies (not to norms or biases)
    int trainable;     // has a gradient, optimizer state and (if needed) a master copy
    size_t goff;       // offset in the trainable buffers (grads, moments, master)
    int streamed;      // frozen layer weight streamed from host (offset is then within the
                       // layer's block, not the resident buffer)
    int quant;         // 4 (QLoRA: NF4) or 8 (load_in_8bit: int8): in the layer's quant region at byte qoff, dequantized
    size_t qoff, deq_off;  // before use into the layer scratch at element deq_off
    int nfrozen;       // unfrozen_parameters' row ranges: rows [frozen[k][0], frozen[k][1]) of this
    int64_t frozen[9][2];  // trainable tensor get a zero gradient (optim.c's grad_norm)
} ParamSpec;

typedef struct {
    ModelConfig cfg;
    ParamSpec *specs;  // stb_ds array: the parameter table
    size_t num_params, num_trainable, num_resident;
    size_t stream_block;  // elements of one layer's streamed block (0: nothing streamed)
    size_t qregion;       // bytes of one layer's quantized weights (0: no quantization)
    size_t deq_elems;     // elements of the dequantization scratch (one layer's linear weights)
    size_t block_bytes;   // streamed block: act tensors, then (aligned) the quant region
    int world;            // the trainable range [0, shard * world) splits into world shards
    size_t shard;
    size_t *units;        // [nunits + 1]: unit u covers trainable indices [units[u], units[u+1]);
                          // unit 0 = the embedding, unit 1 = final norm and untied head
                          // (nl_units 2), or unit 0 = all three (nl_units 1: a tied head);
                          // unit nl_units + l = layer l
    int nl_units, nunits; // nunits = nl_units + L
    size_t local3;        // ZeRO-3: elements of this rank's pieces of all units
    LoraConfig lora;
    float lora_scale;
    int embed, final_norm, lm_head;      // indices into specs (lm_head == embed when tied)
    int pos_embed, final_norm_bias;      // GPT-2 only (-1 otherwise)
    int score_bias;                      // a token classifier's score.bias (-1 otherwise)
    int *layer_param;                    // [L * P_PER_LAYER] spec index, -1 if absent (biases)
} ParamTable;

void model_config_defaults(ModelConfig *c);

// Sizes are computed before anything is allocated. A count is kept exactly in 64 bits,
// saturating at INT64_MAX (which every check treats as too large), and approximately in a
// double, for messages about models past 64 bits.
typedef struct { int64_t n; double d; } Count;
static inline Count count_of(int64_t v) { return (Count){v, (double)v}; }
static inline Count count_mul(Count a, Count b) {
    int64_t r;
    return (Count){__builtin_mul_overflow(a.n, b.n, &r) ? INT64_MAX : r, a.d * b.d};
}
static inline Count count_add(Count a, Count b) {
    int64_t r;
    return (Count){__builtin_add_overflow(a.n, b.n, &r) ? INT64_MAX : r, a.d + b.d};
}
// The parameter table's totals, computed from the config without building it.
typedef struct {
    Count tensors, params, trainable;
    Count layer_params;  // one decoder layer, the adapters of the most adapted layer included
} ModelSize;
// intermediate and padded_vocab are passed apart so that a GPT-2 config whose derived widths
// overflow an int can still be measured (for its error message).
void model_size(const ModelConfig *c, int64_t intermediate, int64_t padded_vocab,
                const LoraConfig *lora, ModelSize *s);
// Fails with "model needs X GiB for its N parameters (the keys that make it large); why".
// src may be NULL.
void model_fail_size(const ModelConfig *c, int64_t intermediate, int64_t padded_vocab,
                     const char *src, const char *why) __attribute__((noreturn));
// Checks the shape fields; on error fails naming `source` and the field.
void model_config_validate(const ModelConfig *c, const char *source);
// 1 if a and b give parameter tensors of the same names and shapes (sizes, heads, tied head,
// attention biases): a checkpoint or a config override must not change them.
int model_config_same_shape(const ModelConfig *a, const ModelConfig *b);
// stream: frozen per-layer weights go to host blocks (layer_offloading); world: ranks that
// shard the trainable range; quant: the frozen decoder linear weights are NF4 (4, QLoRA) or
// int8 (8, load_in_8bit), 0: float.
// zero3: trainable tensors are kept as per-unit shards (see units).
// unfrozen: a full fine-tune trains only the tensors these patterns match (freeze.h; NULL or
// "": all of them).
void param_table_build(ParamTable *t, const ModelConfig *c, const LoraConfig *lora, int stream,
                       int world, int quant, int zero3, const char *unfrozen);
// Elements of this rank's piece of unit u under ZeRO-3.
size_t unit_shard(const ParamTable *t, int u);
void param_table_free(ParamTable *t);
// Spec index of a layer parameter, or -1.
static inline int param_index(const ParamTable *t, int layer, int kind) {
    return t->layer_param[layer * P_PER_LAYER + kind];
}
// RoPE inverse frequencies [D/2], including llama3 scaling and longrope's short (long_factors
// 0) or long factors, computed as HF does in float32.
void rope_inv_freq(const ModelConfig *c, float *inv_freq, int long_factors);

// ---- the engine's model state ----------------------------------------------------------

// Where one layer's tensors are, for one pass: the activation store fills it (actstore.h).
// With a tiled MLP, gate/up/h are tile-sized working buffers; with tiled attention, so are
// ln1, q and att (one attention span's rows).
typedef struct {
    void *xin, *ln1, *q, *k, *v, *att, *x_mid, *ln2, *gate, *up, *h;
    float *rstd1, *rstd2, *lse;
    // Gemma 3's sandwich norms: o_proj's and down_proj's outputs before their norms, and the
    // norms' rstd (NULL for other families).
    void *ao, *fo;
    float *rstd_pa, *rstd_pf;
} LayerActs;

struct ActStore;
struct Comm;
typedef struct { size_t g0, g1, local; } OwnedRange;

// How the model's state is stored across processes and memories.
typedef struct {
    int stream;              // layer_offloading: frozen layer weights streamed from host
    struct Comm *comm;       // NULL: one process
    int zero_stage;          // 0: all-reduce gradients; 1: shard optimizer state (ZeRO-1)
    int offload_optimizer;   // fp32 master and AdamW moments in host memory, update on the CPU
    int offload_params;      // ZeRO-3 with this rank's pieces of the trainable weights and their
                             // float gradients in host memory (needs zero_stage 3 and
                             // offload_optimizer): DeepSpeed's offload_param for a full fine-tune
    int load_in_4bit;        // QLoRA: frozen decoder linear weights stored NF4
    int load_in_8bit;        // LoRA over bitsandbytes' 8-bit storage (int8.h)
    const char *unfrozen;    // full fine-tune: newline-separated name patterns that train (freeze.h); NULL/"": all
    int seq_parallel;        // sequence_parallel_degree: every rank holds T / n tokens of each
                             // sequence (model_alloc_acts takes that local T); 0 or 1: off
    int lisa_layers;         // LISA's lisa_n_layers (lisa.h): under zero_stage 0 only that many
                             // layers' gradients exist at a time; 0: off
    int adam8;               // 8-bit AdamW (optim.h: ADAM8_BNB, ADAM8_TORCHAO; 0: float AdamW):
                             // byte moments for tensors of at least ADAM8_MIN elements
} ModelOptions;

// Under ModelOptions.adam8, where trainable tensor i's AdamW state lives (Model.adam8[i]):
// 8-bit moments at byte q of q_m/q_v with absmax from block blk on, or (tensors under
// ADAM8_MIN elements, as bitsandbytes keeps them) float moments at f of adam_m/adam_v.
typedef struct { int on; size_t q, blk, f; } Adam8Slot;

typedef struct {
    Backend *bk;
    ModelConfig cfg;
    ParamTable tab;
    // Flat buffers laid out by the parameter table: params holds every resident tensor
    // (trainable ones first, at their goff, except under ZeRO-3, whose pieces are in `pieces`),
    // grads every trainable one. The optimizer state
    // covers this rank's range [opt_lo, opt_hi) of trainable indices: all of them unless
    // zero_stage >= 1. With offload_optimizer it lives in host memory.
    ModelOptions opt;
    void *params;                 // act precision
    void *pieces;                 // ZeRO-3: this rank's pieces of every unit (local3 elements, act
                                  // precision); in host memory under offload_params
    float *grads;                 // float on every backend (backend.h: sums over micro-batches,
                                  // tiles and chunks must not round to bf16); host memory under
                                  // offload_params
    float *master, *adam_m, *adam_v;  // fp32; master NULL when act precision is fp32 (and no offload)
    // ModelOptions.adam8: the byte moments (adam8_n), their blocks' absmax (adam8_blocks), the
    // two code maps (optim.h; 512 floats) where the update runs, each trainable tensor's slot;
    // adam_m/adam_v then hold only the small tensors' float moments (adam8_small).
    uint8_t *q_m, *q_v;
    float *absmax_m, *absmax_v, *adam8_maps;
    Adam8Slot *adam8;
    size_t adam8_n, adam8_blocks, adam8_small;
    float *host_grads;            // offload_optimizer: gradients copied for the CPU update
    // The trainable indices whose optimizer state this rank keeps: each range [g0, g1) maps to
    // local index `local` onward (all of them; one shard under ZeRO-1; a piece of every unit
    // under ZeRO-3). Gradients after the exchange and the state arrays use local indices.
    OwnedRange *owned;
    int nowned;
    size_t local_n;
    // ZeRO-3: gathered weights and full-size (float) gradients of the unit in use. The slots
    // lie inside z3_nl, and with an untied head z3_layer_grad is z3_nl_grad (model.c).
    void *z3_nl, *z3_slot[2];
    // Rank 0 between model_gather_all and model_gather_done of a sharded model: its reads of
    // trainable tensors ask the other ranks for their pieces (model_get_param).
    int gathering;
    float *z3_nl_grad, *z3_layer_grad;
    float *z3_host_grad;          // offload_params: a unit's reduced piece on its way to grads
    int z3_slot_layer[2], z3_last;
    int z3_nl_unit;               // the unit z3_nl holds now (embedding or head), -1: none
    Lisa *lisa;                   // LISA (lisa.h): only the drawn layers have gradients; NULL: off
    // LISA under zero_stage 0: grads holds the gradients of the tensors outside the layers
    // (lisa_g0 floats, at their goff), then opt.lisa_layers slots of lisa_slot floats, one for
    // each drawn layer (lisa_slot_of[l]: its slot, -1 while not drawn; model_lisa_drawn).
    // NULL: every layer has its place at its goff.
    int *lisa_slot_of;
    size_t lisa_g0, lisa_slot;
    size_t grads_n;               // floats in grads
    void *lora_tmp, *lora_dtmp, *lora_xd, *lora_dxd;  // LoRA scratch: [N, r] and [N, max in]
    // layer_offloading: frozen layer weights in pinned host blocks, two device slots.
    void *host_blocks;
    struct Streamer *streamer;
    void **layer_block;           // [L] device block of layer l while acquired
    void *qweights;               // QLoRA without streaming: L quant regions on the device
    void *deq;                    // dequantized linear weights of one layer
    int deq_layer;                // which layer deq holds (-1: none)
    uint64_t dropout_seed;        // per micro-batch; set by the training loop
    int adapters_off;             // forward without the LoRA terms (a preference run's reference)
    size_t row_base;              // this rank's first row in the global micro-batch: dropout
                                  // masks follow global rows, so N ranks match one process
    // Activations, sized for B x T at model_alloc_acts, kept/offloaded/recomputed as the
    // activation store's policy says.
    int B, T;
    MemPolicy pol;
    struct ActStore *store, *sample_store;
    void *final_ln;
    float *final_rstd, *losses;
    int32_t *tokens, *targets;    // device copies of the current micro-batch
    // Packed documents (model_set_batch with doc_start): first index of each token's document
    // in its row and the RoPE position t - doc_start; has_docs 0 means one document per row.
    int32_t *doc_start, *pos;
    int has_docs;
    // Sequence parallelism (seqpar.h): doc_start then covers the whole sequences ([B][T x n]),
    // pos holds this rank's global positions, and attention runs through the reshuffles.
    struct SeqPar *sp;
    int has_pos;
    float *rope_cos, *rope_sin;   // [T, D/2]: the table the current micro-batch uses
    float *rope_tab_cos, *rope_tab_sin;  // the tables: one, or longrope's short then long;
                                         // then Gemma 3's local one
    float *rope_loc_cos, *rope_loc_sin;  // Gemma 3's sliding layers' table (NULL: none)
    size_t rope_rows;             // T of one table
    // q/k norm families (Qwen3): a->q/a->k keep the projections; attention reads normalized,
    // rotated copies made here (and remade before the layer's backward), with their rstd.
    void *q_rot, *k_rot;          // [rows of an attention span, Hq D], [N, Hkv D]
    float *qk_rstd;               // [N, Hq + Hkv]: q rows' then k rows' statistics
    // Backward scratch.
    void *d_res, *d_ln, *d_att, *d_q, *d_k, *d_v, *d_ff1, *d_ff2;  // d_ff*: one MLP tile
    float *dkv_f32;               // [2][N, Hkv D] dK/dV sums across attention tiles (bf16 only)
    void *logits;                 // [V] for sampling; a token classifier's [tile, num_labels]
    long long cls_correct, cls_labelled;  // a token classifier's argmax hits and labelled rows (callers reset)
    void *pad_row;                // [C]: the padding_idx row of the embedding gradient, kept
                                  // across the lookup's backward (NULL: no pad_token_id)
    // Gemma 3 multimodal base (cfg.multimodal): the directory its weights first came from (its
    // vision tower and config.json are copied from there into saved models) and where its text
    // tensors sit ("language_model.model." or "model.language_model.").
    char mm_base[4096], mm_prefix[32];
} Model;

// Fails with "model needs X GiB of host memory ..." when the parameter table (and, unless bk
// is the planner's dry run, a lower bound of the parameter state) cannot fit this machine.
// model_create calls it before allocating anything.
void model_check_memory(const ModelConfig *c, const LoraConfig *lora, const ModelOptions *mo, const Backend *bk);
void model_create(Model *m, Backend *bk, const ModelConfig *cfg, const LoraConfig *lora,
                  const ModelOptions *opt);
void model_alloc_acts(Model *m, int B, int T, const MemPolicy *policy);
void model_free(Model *m);
// Fill parameters: normal(0, 0.02) for matrices, zeros for biases, ones for norms.
void model_init_random(Model *m, uint64_t seed);
// Tensor i alone from N(0, initializer_range), as model_init_random draws it (a reward model's
// score head that the base model's files lack).
void model_init_param(Model *m, int i, uint64_t seed);
// Fresh adapters: A uniform in +-1/sqrt(in_features), B zero, from the seed.
void model_init_lora(Model *m, uint64_t seed);
// Host fp32 <-> device parameter i of the table.
void model_set_param(Model *m, int i, const float *src);
void model_get_param(const Model *m, int i, float *dst);
// The same with the adapters merged in: an adapted weight reads W + scale * B A (its rows of B
// for GPT-2's k and v); any other tensor as model_get_param.
void model_get_param_merged(const Model *m, int i, float *dst);
// n floats into / out of the optimizer state (adam_m, adam_v, master), which is host memory
// under offload_optimizer and device memory otherwise; both return with the copy done.
void model_state_put(const Model *m, float *state, const float *src, size_t n);
void model_state_get(const Model *m, float *dst, const float *state, size_t n);
// The same for any bytes of the optimizer state (8-bit AdamW's codes): into it (to_state) or out.
void model_state_copy(const Model *m, void *dst, const void *src, size_t bytes, int to_state);
// ZeRO-3 keeps only pieces of the trainable weights, and under ZeRO >= 1 with an fp32 master
// the master is spread over the ranks: to read whole tensors (saving), every rank calls
// model_gather_all (collective); rank 0 returns at once and reads what it wants with
// model_get_param, the others serve those reads and return when rank 0 calls
// model_gather_done. Between the two no rank may call another collective. No-ops otherwise.
void model_gather_all(Model *m);
void model_gather_done(Model *m);
// The part [a, b) of trainable tensor p that this rank optimizes, and its local index.
int model_owned_part(const Model *m, const ParamSpec *p, size_t *a, size_t *b, size_t *local);
// The gradient of trainable tensor p's owned part at local index loc (model_owned_part): its
// place in m->grads, or NULL for a layer LISA has not drawn when only drawn layers have one.
float *model_grad_at(const Model *m, const ParamSpec *p, size_t loc);
// After a LISA draw (m->lisa->on): the drawn layers take the gradient slots, in layer order.
void model_lisa_drawn(Model *m);
// How many floats from m->grads on the optimizer reads: this rank's local part, or LISA's slots.
size_t model_grads_used(const Model *m);
struct Nf4Weight;
// A weight already in NF4 (a bitsandbytes checkpoint) for a quantized table entry.
void model_set_param_nf4(Model *m, int i, const void *nf4_weight);
// Sets the micro-batch (host arrays of B*T ids; targets < 0 are ignored). doc_start (or NULL:
// each row is one sequence) gives, per token, the index in its row of its document's first
// token: attention stays inside the document and positions restart at 0 (sample packing).
// Sequence parallel: tokens/targets are this rank's slice (B x T/n), doc_start the whole rows.
void model_set_batch(Model *m, const int32_t *tokens, const int32_t *targets,
                     const int32_t *doc_start, int B, int T);
// Forward pass of the current batch. With loss_scale > 0 it also runs backward, accumulating
// loss_scale * d(sum of token losses) into m->grads. Returns the sum of the token losses.
double model_forward_backward(Model *m, int B, int T, float loss_scale);
// The same in two halves, for losses that need whole rows first (preference.h): the forward
// (kept for a backward when for_backward) writes each row's summed token loss into row_loss[B];
// the backward then adds row_scale[b] * d(row b's summed token loss) into m->grads. With split
// (else NULL), a row's positions before split[b] are summed apart, into head_loss[b], and their
// losses' gradients scaled by head_scale[b].
void model_forward_rows(Model *m, int B, int T, int for_backward, const int *split, double *row_loss,
                        double *head_loss);
void model_backward_rows(Model *m, int B, int T, const float *row_scale, const int *split, const float *head_scale);
// A reward model (num_labels 1): each row's score at position pos[b] of the rows the model holds
// (-1: none, score 0), then the backward of d(loss)/d(score) dscore[b].
void model_forward_scores(Model *m, int B, int T, int for_backward, const int *pos, double *score);
void model_backward_scores(Model *m, int B, int T, const int *pos, const float *dscore);
// Zeroes the gradients model_forward_backward accumulates into (a step's start), wherever
// they live; the _range form n of them from g, a pointer into m->grads.
void model_zero_grads(Model *m);
void model_zero_grad_range(Model *m, float *g, size_t n);
// Logits of the last position of row 0 after a forward of (1, T); returns host pointer [V].
void model_last_logits(Model *m, int T, float *out);
