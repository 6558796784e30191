#!/usr/bin/python3
"""Writes the seed corpora fuzz/corpus/TARGET/ (small valid and near-valid inputs).

    /usr/bin/python3 fuzz/make_seeds.py
Every seed is built here from the formats' descriptions; rerunning rewrites the same files.
"""
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- safetensors: u64 header length, JSON header, data ------------------------------------
def st(header, data, pad=True, hlen=None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + data


f32 = struct.pack("<4f", 1.0, -2.0, 0.5, 3.25)
bf16 = bytes([0x80, 0x3f, 0x00, 0xc0, 0x00, 0x00])  # 1, -2, 0
f16 = struct.pack("<2H", 0x3c00, 0x7c00)           # 1, inf
good = {"__metadata__": {"format": "pt"},
        "a.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b.bias": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}}
put("safetensors", "valid_two", st(good, f32 + bf16))
put("safetensors", "valid_empty", st({}, b""))
put("safetensors", "valid_f16_i64", st({"h": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]},
                                         "i": {"dtype": "I64", "shape": [1, 1], "data_offsets": [4, 12]},
                                         "s": {"dtype": "F32", "shape": [], "data_offsets": [12, 16]}},
                                        f16 + struct.pack("<q", 7) + struct.pack("<f", 2.0)))
put("safetensors", "valid_zero_size", st({"z": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]}}, b""))
put("safetensors", "near_hlen_too_big", st(good, f32 + bf16, hlen=1 << 40))
put("safetensors", "near_overlap", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, f32))
put("safetensors", "near_dup_metadata",
    st(b'{"__metadata__":{"a":"1"},"__metadata__":{"b":"2","c":"3"},'
       b'"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', f32[:4]))
put("safetensors", "near_dup_key",
    st(b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
       b'"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', f32[:8]))
put("safetensors", "near_shape_mismatch", st({"t": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}, f32))
put("safetensors", "near_bad_dtype", st({"t": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 4]}}, f32[:4]))
put("safetensors", "near_trailing", st({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, f32))
put("safetensors", "near_huge_shape",
    st({"t": {"dtype": "F32", "shape": [4294967296, 4294967296, 16], "data_offsets": [0, 4]}}, f32[:4]))

# ---- Hugging Face config.json ---------------------------------------------------------------
llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128,
         "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
         "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
         "tie_word_embeddings": False, "attention_bias": False, "torch_dtype": "bfloat16",
         "bos_token_id": 1, "eos_token_id": 2}
put("hf_config", "valid_llama", json.dumps(llama, indent=2))
l3 = dict(llama, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
          eos_token_id=[2, 3], head_dim=8)
put("hf_config", "valid_llama3_rope", json.dumps(l3))
put("hf_config", "valid_qwen2", json.dumps(dict(llama, architectures=["Qwen2ForCausalLM"], model_type="qwen2",
                                                attention_bias=True, tie_word_embeddings=True,
                                                use_sliding_window=False, sliding_window=32)))
put("hf_config", "valid_mistral", json.dumps(dict(llama, architectures=["MistralForCausalLM"],
                                                  model_type="mistral", sliding_window=None)))
put("hf_config", "near_missing_hidden", json.dumps({k: v for k, v in llama.items() if k != "hidden_size"}))
put("hf_config", "near_string_int", json.dumps(dict(llama, num_hidden_layers="2")))
put("hf_config", "near_mlp_bias", json.dumps(dict(llama, mlp_bias=True, hidden_act="gelu")))
put("hf_config", "near_rope_linear", json.dumps(dict(llama, rope_scaling={"type": "linear", "factor": 2.0})))
put("hf_config", "near_heads", json.dumps(dict(llama, num_key_value_heads=3, head_dim=-1)))
# config.json, the line //model_config, then Axolotl's overrides as JSON (fuzz_hf_config.c)
put("hf_config", "valid_model_config", json.dumps(llama) + "\n//model_config\n" +
    json.dumps({"rope_theta": 500000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
                "max_position_embeddings": 4096, "use_cache": False}))
put("hf_config", "near_model_config", json.dumps(l3) + "\n//model_config\n" +
    json.dumps({"hidden_size": 64, "rope_scaling": {"rope_type": "llama3", "factor": -1}, "sliding_window": None}))
put("hf_config", "near_dup_key", '{"vocab_size": 128, "vocab_size": 4294967296, "hidden_size": 1e400}')

# ---- YAML run configuration -----------------------------------------------------------------
model = ("model:\n  vocab_size: 256\n  hidden_size: 16\n  intermediate_size: 32\n"
         "  num_hidden_layers: 1\n  num_attention_heads: 2\n  max_position_embeddings: 64\n")
base = model + "train_data: data/train_*.bin\nsequence_len: 8\nmicro_batch_size: 2\nmax_steps: 10\n"
put("yaml_config", "valid_model_block", base)
put("yaml_config", "valid_full", base + "val_data: data/val.bin\neval_steps: 5\nlearning_rate: 3e-4\n"
    "lr_scheduler: cosine\nwarmup_steps: 2\nweight_decay: 0.1\nmax_grad_norm: 1.0\n"
    "gradient_accumulation_steps: 2\nseed: 42\nsave_steps: 5\noutput_dir: out\nshuffle: true\n"
    "device_memory_limit: 2GiB\nprecision: float32\n")
put("yaml_config", "valid_lora", base + "adapter: lora\nlora_r: 4\nlora_alpha: 8\nlora_dropout: 0.05\n"
    "lora_target_modules:\n  - q_proj\n  - v_proj\nlayer_offloading: true\n")
put("yaml_config", "valid_memory", base + "gradient_checkpointing: true\ngradient_checkpointing_every: 2\n"
    "activation_offloading: disk\nactivation_offloading_dir: /tmp\ntiled_mlp: true\n")
put("yaml_config", "valid_base_model", "base_model: models/tiny\ntrain_data: a.bin\nload_in_4bit: true\n"
    "adapter: qlora\nlora_target_linear: true\n")
put("yaml_config", "valid_gpt2", "# gpt2\nmodel:\n  vocab_size: 50257\n  hidden_size: 64\n"
    "  num_hidden_layers: 2\n  num_attention_heads: 4\n  max_position_embeddings: 128\n"
    "train_data: a.bin\n")
put("yaml_config", "valid_axolotl_more", "base_model: models/tiny\ntrain_data: a.bin\nmodel_config:\n"
    "  rope_theta: 1.0e6\n  rope_scaling:\n    rope_type: linear\n    factor: 2.0\n  use_cache: false\n"
    "batch_size: 8\nmicro_batch_size: 2\nrevision_of_model: v1.0\nlr_quadratic_warmup: true\nwarmup_steps: 3\n"
    "adapter: lora\nfsdp:\n  - full_shard\n  - offload\nfsdp_config:\n  fsdp_offload_params: true\n")
put("yaml_config", "valid_offload_params", base + "offload_params: true\ndeepspeed: ds.json\nfsdp_config:\n"
    "  fsdp_offload_params: true\nzero_stage: 3\noffload_optimizer: false\n")
put("yaml_config", "near_lisa", base + "lisa_n_layers: 1\nlisa_step_interval: 2\nlisa_layers_attribute: model.layers\n")
put("yaml_config", "near_unfrozen_rows", base + "unfrozen_parameters:\n  - model.embed_tokens.weight$[:100]\n"
    "  - model.norm.weight[3]\n  - 'model.layers.0.mlp.down_proj.weight[9:2]'\nbatch_size: 5\n")
put("yaml_config", "near_unknown_key", base + "learning_rat: 1e-3\n")
put("yaml_config", "near_two_docs", base + "---\nmax_steps: 3\n")
put("yaml_config", "near_both_models", base + "base_model: x\n")
put("yaml_config", "near_bad_values", base + "micro_batch_size: -1\nadam_beta2: 1.0\nzero_stage: 2\n")
put("yaml_config", "near_anchors", "a: &x [1, 2]\nmodel: *x\ntrain_data: {b: c}\n")
put("yaml_config", "valid_axolotl_keys", base + "bnb_config_kwargs:\n  bnb_4bit_quant_type: nf4\n"
    "  bnb_4bit_use_double_quant: true\n  bnb_4bit_compute_dtype: bfloat16\n"
    "loss_watchdog_threshold: 5.0\nloss_watchdog_patience: 2\nddp_timeout: 1800\ndataloader_drop_last: true\n")
put("yaml_config", "near_bnb", base + "bnb_config_kwargs:\n  llm_int8_skip_modules: [lm_head]\n  bnb_4bit_quant_type: fp4\n")

# ---- token shards: 4 loader-shape bytes (B, T, vocab, shuffle), then the shard -------------
def shard(tokens, version=1, magic=20240520, ntok=None):
    h = struct.pack("<256i", magic, version, len(tokens) if ntok is None else ntok, *([0] * 253))
    return h + struct.pack("<%d%s" % (len(tokens), "H" if version == 1 else "I"), *tokens)


toks = [i % 50 for i in range(40)]
put("shard", "valid_v1", bytes([1, 3, 63, 0]) + shard(toks))        # B 2, T 4, vocab 64
put("shard", "valid_v2_shuffle", bytes([0, 7, 63, 1]) + shard(toks, 2))
put("shard", "valid_exact", bytes([0, 0, 255, 0]) + shard([5, 6]))   # one window of 1 + 1
put("shard", "near_out_of_vocab", bytes([0, 1, 10, 0]) + shard(toks))
put("shard", "near_bad_magic", bytes([0, 1, 63, 0]) + shard(toks, magic=20240521))
put("shard", "near_version3", bytes([0, 1, 63, 0]) + shard(toks, version=3))
put("shard", "near_ntok_too_big", bytes([0, 1, 63, 0]) + shard(toks, ntok=1000))
put("shard", "near_negative_ntok", bytes([0, 1, 63, 0]) + shard(toks, ntok=-5))
put("shard", "near_header_only", bytes([0, 1, 63, 0]) + shard([])[:1024])
put("shard", "near_short_header", bytes([0, 1, 63, 0]) + shard(toks)[:100])

# ---- prepared rows: 4 loader-shape bytes (B, accum, vocab, shuffle), then the rows file ------
# (llmc/rows.h: 256 int32 header [magic, version, T, nrows, flags, max id + 1, ndocs, targets
# (uint64)], then per row tokens[T], targets[T], doc_start[T])
def rows_file(rows, T, packed=0, magic=20241124, version=1, nrows=None, ndocs=None, ntargets=None, max_id1=None):
    body = b""
    docs = targets = 0
    top = 0
    for toks, tgts, ds in rows:
        body += struct.pack("<%di" % (3 * T), *(toks + tgts + ds))
        docs += sum(1 for t in range(T) if ds[t] == t)
        targets += sum(1 for x in tgts if x >= 0)
        top = max([top] + [x + 1 for x in toks])
    hdr = [0] * 256
    hdr[:7] = [magic, version, T, len(rows) if nrows is None else nrows, packed,
               top if max_id1 is None else max_id1, docs if ndocs is None else ndocs]
    h = struct.pack("<256i", *hdr)
    n = targets if ntargets is None else ntargets
    h = h[:28] + struct.pack("<Q", n) + h[36:]
    return h + body


r1 = ([5, 6, 7, 8], [6, 7, 8, -1], [0, 0, 0, 0])          # one document, the last token untrained
r2 = ([9, 3, 4, 2], [-1, 4, 2, -1], [0, 1, 1, 1])         # a packed row: documents at 0 and 1
put("rows", "valid_one", bytes([1, 0, 63, 0]) + rows_file([r1], 4))
put("rows", "valid_packed_shuffle", bytes([0, 1, 63, 1]) + rows_file([r1, r2, r1], 4, packed=1))
put("rows", "near_bad_target", bytes([0, 0, 63, 0]) + rows_file([([5, 6, 7, 8], [7, 7, 8, -1], [0, 0, 0, 0])], 4))
put("rows", "near_doc_start", bytes([0, 0, 63, 0]) + rows_file([([5, 6, 7, 8], [6, 7, 8, -1], [0, 0, 3, 0])], 4))
put("rows", "near_vocab", bytes([0, 0, 6, 0]) + rows_file([r1], 4))
put("rows", "near_nrows_big", bytes([0, 0, 63, 0]) + rows_file([r1], 4, nrows=1 << 30))
put("rows", "near_counts", bytes([0, 0, 63, 0]) + rows_file([r1, r2], 4, packed=1, ndocs=7, ntargets=99))
put("rows", "near_header_only", bytes([0, 0, 63, 0]) + rows_file([r1], 4)[:1024])
# preference pairs (flag 2): chosen and rejected rows, each with a target; odd counts, an
# untrained completion, packed and paired at once are errors
put("rows", "valid_pairs_shuffle", bytes([1, 1, 63, 1]) + rows_file([r1, r1, r1, r1], 4, packed=2))
put("rows", "near_pair_odd", bytes([0, 0, 63, 0]) + rows_file([r1, r1, r1], 4, packed=2))
put("rows", "near_pair_untrained", bytes([0, 0, 63, 0]) + rows_file([r1, ([5, 6, 7, 8], [-1] * 4, [0] * 4)], 4, packed=2))
put("rows", "near_pair_packed", bytes([0, 0, 63, 0]) + rows_file([r1, r1], 4, packed=3))
# a reward model's rows (flags 2 | 4): one target a row, the token at its score position; two
# marks, a mark that is not the token there, and scored rows that are not pairs are errors
s1 = ([5, 6, 7, 8], [-1, -1, 7, -1], [0, 0, 0, 0])
put("rows", "valid_scored", bytes([1, 1, 63, 1]) + rows_file([s1, s1], 4, packed=6))
put("rows", "near_scored_two", bytes([0, 0, 63, 0]) + rows_file([s1, ([5, 6, 7, 8], [-1, 6, 7, -1], [0] * 4)], 4, packed=6))
put("rows", "near_scored_next", bytes([0, 0, 63, 0]) + rows_file([s1, r1], 4, packed=6))
put("rows", "near_scored_unpaired", bytes([0, 0, 63, 0]) + rows_file([s1], 4, packed=4))
# a process reward model's rows (flag 8): labels 0/1 at their own positions; a label of 2 and
# labels with another flag are errors
l1 = ([5, 6, 7, 8], [-1, 1, -1, 0], [0, 0, 0, 0])
put("rows", "valid_labels", bytes([1, 1, 63, 1]) + rows_file([l1, l1], 4, packed=8))
put("rows", "near_label_two", bytes([0, 0, 63, 0]) + rows_file([([5, 6, 7, 8], [-1, 2, -1, 0], [0] * 4)], 4, packed=8))
put("rows", "near_labels_paired", bytes([0, 0, 63, 0]) + rows_file([l1, l1], 4, packed=10))

# ---- HellaSwag eval file: 3 bytes (T, vocab low, vocab high), then llm.c's format ----------
# header 256 int32 [20240522, 1, n]; each example uint16: 65535, bytes, index, label, 4,
# context length, context, then 4 x (length, tokens)
def hs_example(i, label, ctx, comps):
    words = [i, label, 4, len(ctx)] + ctx
    for c in comps:
        words += [len(c)] + c
    n = 2 + len(words)
    return struct.pack("<%dH" % n, 65535, 2 * n, *words)


def hs_file(examples, n=None, magic=20240522):
    hdr = [0] * 256
    hdr[:3] = [magic, 1, len(examples) if n is None else n]
    return struct.pack("<256i", *hdr) + b"".join(examples)


ex0 = hs_example(0, 2, [1, 2, 3], [[4], [5, 6], [7], [8, 9, 10]])
ex1 = hs_example(1, 0, [11], [[12], [13], [14], [15]])
put("hellaswag", "valid_two", bytes([15, 63, 0]) + hs_file([ex0, ex1]))
put("hellaswag", "near_too_long", bytes([3, 63, 0]) + hs_file([ex0, ex1]))
put("hellaswag", "near_vocab", bytes([15, 8, 0]) + hs_file([ex0, ex1]))
put("hellaswag", "near_n_huge", bytes([15, 63, 0]) + hs_file([ex0], n=0x7fffffff))
put("hellaswag", "near_index", bytes([15, 63, 0]) + hs_file([ex1, ex0]))
put("hellaswag", "near_three_completions", bytes([15, 63, 0]) +
    hs_file([struct.pack("<10H", 65535, 20, 0, 0, 3, 1, 5, 1, 6, 1)]))

# ---- llm.c GPT-2 model.bin: header [20240326, version 3 (fp32) or 5 (bf16), maxT, V, L, NH, C,
# padded V], then the 16 tensors. Tiny shapes (the target loads those into a model).
def gpt2_bin(maxT, V, L, NH, C, Vp=None, version=3, extra=0, magic=20240326):
    Vp = Vp if Vp is not None else (V + 127) // 128 * 128
    n = Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C + extra
    hdr = [0] * 256
    hdr[:8] = [magic, version, maxT, V, L, NH, C, Vp]
    body = (struct.pack("<%df" % n, *[((i * 37) % 101 - 50) * 0.001 for i in range(n)]) if version == 3
            else struct.pack("<%dH" % n, *[0x3c00 + (i % 7) for i in range(n)]))
    return struct.pack("<256i", *hdr) + body


put("gpt2_bin", "valid_fp32", gpt2_bin(8, 50, 1, 2, 8))
put("gpt2_bin", "valid_bf16", gpt2_bin(4, 100, 2, 4, 8, version=5))
put("gpt2_bin", "near_truncated", gpt2_bin(8, 50, 1, 2, 8)[:-4])
put("gpt2_bin", "near_long", gpt2_bin(8, 50, 1, 2, 8, extra=1))
put("gpt2_bin", "near_heads", gpt2_bin(8, 50, 1, 3, 8))
put("gpt2_bin", "near_padded_small", gpt2_bin(8, 200, 1, 2, 8, Vp=128))
put("gpt2_bin", "near_xl_header", struct.pack("<256i", *([20240326, 3, 1024, 50257, 48, 25, 1600, 50304] + [0] * 248)))

# ---- trainer_state.json (as checkpoint_save writes it) --------------------------------------
state = {"step": 1, "skipped_steps": 0, "world_size": 1, "zero_stage": 0, "data_epoch": "0",
         "data_next": "3", "sample_rng": ["1", "2", "3", "18446744073709551615"]}
put("trainer_state", "valid", json.dumps(state, indent=2))
put("trainer_state", "valid_minimal", json.dumps({k: v for k, v in state.items()
                                                  if k not in ("skipped_steps", "world_size", "zero_stage")}))
put("trainer_state", "near_negative_step", json.dumps(dict(state, step=-1)))
put("trainer_state", "near_skipped_gt_step", json.dumps(dict(state, skipped_steps=2.5)))
put("trainer_state", "near_epoch_number", json.dumps(dict(state, data_epoch=0)))
put("trainer_state", "near_epoch_overflow", json.dumps(dict(state, data_epoch="99999999999999999999999")))
put("trainer_state", "near_rng_short", json.dumps(dict(state, sample_rng=["1", "2", "3"])))
put("trainer_state", "near_world", json.dumps(dict(state, world_size=4, zero_stage=1)))
put("trainer_state", "near_step_huge", json.dumps(dict(state, step=1e300)))
put("trainer_state", "valid_lisa", json.dumps(dict(state, lisa_layer_updates=[1])))
put("trainer_state", "near_lisa_count", json.dumps(dict(state, lisa_layer_updates=[2])))
put("trainer_state", "near_lisa_list", json.dumps(dict(state, lisa_layer_updates=[1, 0])))

# ---- adapter_config.json (PEFT; the fuzz model has r 2, alpha 4, q_proj + v_proj) ------------
adapter = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": 2, "lora_alpha": 4, "lora_dropout": 0.0,
           "target_modules": ["q_proj", "v_proj"], "bias": "none", "use_rslora": False,
           "fan_in_fan_out": False, "inference_mode": True, "base_model_name_or_path": ""}
put("adapter_config", "valid", json.dumps(adapter, indent=2))
put("adapter_config", "valid_reordered", json.dumps(dict(adapter, target_modules=["v_proj", "q_proj", "q_proj"])))
put("adapter_config", "near_rank", json.dumps(dict(adapter, r=3)))
put("adapter_config", "near_alpha_string", json.dumps(dict(adapter, lora_alpha="4")))
put("adapter_config", "near_targets_string", json.dumps(dict(adapter, target_modules="q_proj,v_proj")))
put("adapter_config", "near_targets_mixed", json.dumps(dict(adapter, target_modules=["q_proj", 7, None, "k_proj"])))
put("adapter_config", "near_rslora", json.dumps(dict(adapter, use_rslora=True)))
put("adapter_config", "near_rank_huge", json.dumps(dict(adapter, r=1e19)))
put("adapter_config", "near_not_object", "[1, 2, 3]")
