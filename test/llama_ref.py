"""llama_ref.py: an independent PyTorch reference for the C Llama trainer.

It reproduces the semantics the trainer promises (Hugging Face Llama forward, HF Trainer style
loss / AdamW / clipping / LR schedules, the llm.c token shard loader) in float64 by default, so
the trainer's float32 numbers can be checked against an (almost) exact answer.

Everything here is written from the published conventions; it needs only numpy and torch (run
with Debian's /usr/bin/python3). It does not use transformers or safetensors: both file formats
are read and written by hand.

Families (model_type), written in plain PyTorch from transformers' modeling/configuration
equations (modeling_llama, modeling_mistral, modeling_qwen2, modeling_qwen3 and masking_utils of
transformers 4.53+), not by running transformers:
    llama    attention_bias biases q, k, v and o
    mistral  no biases; sliding_window (absent: 4096, null: none) on every layer
    qwen2    q/k/v biases always, o never; with use_sliding_window, layers i >= max_window_layers
             (default 28) use sliding_window (transformers' layer_types rule)
    qwen3    attention_bias on q/k/v/o (default false); q_norm/k_norm: RMSNorm over head_dim of
             every head (weight [head_dim], eps rms_norm_eps) before RoPE; head_dim default 128;
             windows as qwen2
    phi3     no biases; one self_attn.qkv_proj.weight whose output is sliced q | k | v and one
             mlp.gate_up_proj.weight whose output is chunk(2)'ed gate | up (modeling_phi3's
             Phi3Attention / Phi3MLP); the model computes with the fused weights as they are;
             sliding_window (absent: none) on every layer; pad_token_id absent means 32000
    gemma3_text  (modeling_gemma3 / configuration_gemma3 of transformers 4.57) every RMSNorm
             applies (1 + w) to x * rsqrt(mean(x^2) + eps), its weight in the file being w;
             embedding output times sqrt(hidden_size); q_norm/k_norm as qwen3; attention scaled
             by query_pre_attn_scalar^-0.5 (default 256); x + post_attention_layernorm(o_proj(..))
             then x + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(x))); MLP GeGLU
             gelu_tanh(gate) * up; layer i slides (sliding_window, default 4096) unless (i + 1)
             is a multiple of sliding_window_pattern (default 6), and sliding layers rotate with
             rope_local_base_freq (default 10000) and no rope_scaling; head_dim default 256;
             tie_word_embeddings default true; pad_token_id default 0
    gemma2   (modeling_gemma2 / configuration_gemma2 of transformers 4.57) gemma3_text's block
             without q/k norms and with one RoPE for every layer; layer i slides when
             layer_types says so (default: even i); attention scores (after the scale) capped
             as cap * tanh(s / cap) before the mask, cap attn_logit_softcapping (default 50),
             and the logits likewise by final_logit_softcapping (default 30); null: no cap
    gemma    (modeling_gemma / configuration_gemma of transformers 4.57) Llama's block with
             gemma3_text's (1 + w) norms, sqrt(hidden_size) embedding scale and GeGLU, no
             sandwich norms, no q/k norms, attention scaled by head_dim^-0.5, no window; the
             GELU is hidden_activation's where set, else hidden_act's (default
             gelu_pytorch_tanh): "gelu" is the exact one (erf); head_dim default 256
Every family: the embedding is nn.Embedding(..., padding_idx=pad_token_id), so the lookup adds
no gradient to the pad row (F.embedding's padding_idx).
A sliding window W lets query i see keys j with i - W < j <= i (masking_utils'
sliding_window_overlay: kv_idx > q_idx - sliding_window).

Main entry points:
    make_config(**kw)                  -> HF config dict
    init_weights(cfg, seed)            -> {hf_name: float32 ndarray}
    save_hf_dir(dir, cfg, weights)     writes config.json + model.safetensors (F32)
    write_safetensors / read_safetensors
    write_shard(path, tokens, version) / read_shard(path)
    train_config(**kw)                 -> the YAML-level training settings (dict)
    write_yaml(path, dict)
    RefTrainer(cfg, weights, tokens, tc, dtype).step() -> (loss, lr, grad_norm)
    train_reference(cfg, weights, tokens, tc)          -> dict(losses, lrs, grad_norms, weights)
    read_metrics(path)                 -> train lines of a metrics.jsonl

LoRA (PEFT semantics: y = W x (+ b) + scale * B(A(x)), scale = alpha/r or alpha/sqrt(r) with
use_rslora; dropout is not modelled, so compare only with lora_dropout 0):
    lora_spec(cfg, r, alpha, targets, use_rslora, weights)  -> the `lora` dict the classes take
    init_lora(cfg, r, targets, seed)   -> {hf lora name: float32 ndarray} (A and B both random)
    save_adapter_dir(dir, spec) / load_adapter_dir(dir) -> PEFT adapter_model.safetensors +
                                       adapter_config.json, written and read by hand
    merge_lora(cfg, weights, spec)     -> float64 weights with W + scale * B @ A
    RefLlama / RefTrainer / train_reference take lora=spec: the base is frozen and only the
    adapters are trained (AdamW with weight decay, clipping over adapter grads only)
    batch_loss(cfg, weights, x, y, lora=None) -> mean cross-entropy of one batch (float64)
    step_batches(tokens, B, T, accum, step) -> the (x, y) micro-batches of 1-based step `step`
"""
import json
import re
import math
import os
import struct

import numpy as np
import torch
import torch.nn.functional as F

SHARD_MAGIC = 20240520
SHARD_HEADER_INTS = 256

# --------------------------------------------------------------------------------------------
# config and weights


def make_config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=None, head_dim=None,
                rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
                max_position_embeddings=256, tie_word_embeddings=False, attention_bias=False,
                model_type="llama", **extra):
    """A Hugging Face config dict of the family model_type; extra keys (sliding_window,
    use_sliding_window, max_window_layers, eos_token_id, ...) are added as given."""
    if num_key_value_heads is None:
        num_key_value_heads = num_attention_heads
    if head_dim is None:
        head_dim = hidden_size // num_attention_heads
    cfg = {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": rms_norm_eps,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_bias": attention_bias,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
    }
    cfg.update(extra)
    return cfg


ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "phi3": "Phi3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                 "gemma3_text": "Gemma3ForCausalLM"}
GEMMAS = ("gemma", "gemma2", "gemma3_text")
SANDWICH = ("gemma2", "gemma3_text")  # Gemma 2 and 3: a norm on each half's output too


def gelu_exact(cfg):
    """A Gemma config's GELU: True for exact (erf, "gelu"), False for the tanh approximation.
    Gemma 2/3 read hidden_activation; Gemma 1 hidden_activation where set, else hidden_act."""
    act = cfg.get("hidden_activation")
    if act is None and cfg.get("model_type") == "gemma":
        act = cfg.get("hidden_act", "gelu_pytorch_tanh")
    return act == "gelu"


def family(cfg):
    """What the family's modeling code does with this config: biases, q/k norms, and the
    sliding window of each layer (0: none)."""
    mt = cfg.get("model_type", "llama")
    if mt not in ARCHITECTURES:
        raise ValueError(f"model_type {mt} not in the reference")
    ab = bool(cfg.get("attention_bias", False))
    qkv_bias = {"llama": ab, "mistral": False, "qwen2": True, "qwen3": ab, "phi3": False, "gemma": ab, "gemma2": ab,
                "gemma3_text": ab}[mt]
    o_bias = {"llama": ab, "mistral": False, "qwen2": False, "qwen3": ab, "phi3": False, "gemma": ab, "gemma2": ab,
              "gemma3_text": ab}[mt]
    L = cfg["num_hidden_layers"]
    sw = cfg["sliding_window"] if "sliding_window" in cfg else (None if mt in ("llama", "phi3", "gemma") else 4096)
    local = [False] * L
    caps = (None, None)
    if mt == "gemma2":  # Gemma2Config: layer_types (default: even layers slide), soft-caps 50 / 30
        types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
        windows = [(sw or 0) if types[i] == "sliding_attention" else 0 for i in range(L)]
        caps = (cfg.get("attn_logit_softcapping", 50.0), cfg.get("final_logit_softcapping", 30.0))
    elif mt == "gemma3_text":
        pat = cfg.get("sliding_window_pattern", 6)
        local = [(i + 1) % pat != 0 for i in range(L)]
        windows = [(sw or 0) if local[i] else 0 for i in range(L)]
        caps = (cfg.get("attn_logit_softcapping"), cfg.get("final_logit_softcapping"))
    elif mt in ("mistral", "phi3"):
        windows = [sw or 0] * L
    elif mt in ("qwen2", "qwen3"):
        sw = sw if cfg.get("use_sliding_window", False) else None
        mwl = cfg.get("max_window_layers", 28)
        windows = [sw if sw is not None and i >= mwl else 0 for i in range(L)]
    else:
        windows = [0] * L
    pad = cfg["pad_token_id"] if "pad_token_id" in cfg else {"phi3": 32000, "gemma": 0, "gemma2": 0,
                                                            "gemma3_text": 0}.get(mt)
    return {"qkv_bias": qkv_bias, "o_bias": o_bias, "qk_norm": mt in ("qwen3", "gemma3_text"), "windows": windows,
            "fused": mt == "phi3", "pad": pad, "gemma": mt in GEMMAS, "sandwich": mt in SANDWICH,
            "gelu_exact": mt in GEMMAS and gelu_exact(cfg), "local_rope": local,
            "attn_softcap": caps[0], "final_softcap": caps[1]}


def _dims(cfg):
    C = cfg["hidden_size"]
    Hq = cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads") or Hq
    D = cfg.get("head_dim") or {"qwen3": 128, "gemma": 256, "gemma2": 256, "gemma3_text": 256}.get(cfg.get("model_type"),
                                                                                                 C // Hq)
    return C, Hq, Hkv, D


def param_shapes(cfg):
    """Ordered {hf_name: shape} of the model's parameters (lm_head absent when tied)."""
    C, Hq, Hkv, D = _dims(cfg)
    V, I, L = cfg["vocab_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    fam = family(cfg)
    bias, o_bias = fam["qkv_bias"], fam["o_bias"]
    s = {"model.embed_tokens.weight": (V, C)}
    for i in range(L):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (C,)
        if fam["fused"]:  # Phi-3: the files' (and modeling_phi3's) fused projections
            s[p + "self_attn.qkv_proj.weight"] = ((Hq + 2 * Hkv) * D, C)
            s[p + "self_attn.o_proj.weight"] = (C, Hq * D)
            s[p + "post_attention_layernorm.weight"] = (C,)
            s[p + "mlp.gate_up_proj.weight"] = (2 * I, C)
            s[p + "mlp.down_proj.weight"] = (C, I)
            continue
        s[p + "self_attn.q_proj.weight"] = (Hq * D, C)
        if bias:
            s[p + "self_attn.q_proj.bias"] = (Hq * D,)
        s[p + "self_attn.k_proj.weight"] = (Hkv * D, C)
        if bias:
            s[p + "self_attn.k_proj.bias"] = (Hkv * D,)
        s[p + "self_attn.v_proj.weight"] = (Hkv * D, C)
        if bias:
            s[p + "self_attn.v_proj.bias"] = (Hkv * D,)
        s[p + "self_attn.o_proj.weight"] = (C, Hq * D)
        if o_bias:
            s[p + "self_attn.o_proj.bias"] = (C,)
        if fam["qk_norm"]:
            s[p + "self_attn.q_norm.weight"] = (D,)
            s[p + "self_attn.k_norm.weight"] = (D,)
        s[p + "post_attention_layernorm.weight"] = (C,)
        if fam["sandwich"]:
            s[p + "pre_feedforward_layernorm.weight"] = (C,)
            s[p + "post_feedforward_layernorm.weight"] = (C,)
        s[p + "mlp.gate_proj.weight"] = (I, C)
        s[p + "mlp.up_proj.weight"] = (I, C)
        s[p + "mlp.down_proj.weight"] = (C, I)
    s["model.norm.weight"] = (C,)
    if seqcls(cfg) or tokcls(cfg):  # ...ForSequenceClassification / ForTokenClassification: score in lm_head's place
        s["score.weight"] = (len(cfg.get("id2label") or {0: 0, 1: 1}), C)
        if tokcls(cfg):  # transformers' GenericForTokenClassification: nn.Linear with its bias
            s["score.bias"] = (s["score.weight"][0],)
    elif not tied(cfg):
        s["lm_head.weight"] = (V, C)
    return s


def tokcls(cfg):
    """A token classifier's config (a process reward model): architectures ...ForTokenClassification."""
    return any(a.endswith("ForTokenClassification") for a in cfg.get("architectures") or [])


def seqcls(cfg):
    """A sequence classifier's config (a reward model): architectures ...ForSequenceClassification."""
    return any(a.endswith("ForSequenceClassification") for a in cfg.get("architectures") or [])


def tied(cfg):
    """tie_word_embeddings, whose absence means true for the Gemmas and false otherwise."""
    return bool(cfg.get("tie_word_embeddings", cfg.get("model_type") in GEMMAS))


def is_decay_param(name):
    """HF Trainer's rule: no weight decay for biases and norm weights."""
    return not (name.endswith(".bias") or "layernorm" in name or name == "model.norm.weight"
                or name.endswith("_norm.weight"))


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PHI3_LORA_TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # Phi-3's modules
ANY_TARGET = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj", "gate_up_proj",
              "down_proj")  # in the order of a written target_modules list
PEFT_PREFIX = "base_model.model."


def lora_module(layer, target):
    """HF module path of an adaptable projection, e.g. model.layers.0.self_attn.q_proj."""
    if target not in ANY_TARGET:
        raise ValueError(f"unknown LoRA target {target}")
    grp = "mlp" if target in ("gate_proj", "up_proj", "gate_up_proj", "down_proj") else "self_attn"
    return f"model.layers.{layer}.{grp}.{target}"


def lora_shapes(cfg, r, targets):
    """Ordered {hf lora name: shape}: A [r, in] and B [out, r] of every adapted projection."""
    shapes = param_shapes(cfg)
    out = {}
    for i in range(cfg["num_hidden_layers"]):
        for t in ANY_TARGET:
            if t not in targets:
                continue
            m = lora_module(i, t)
            o, n = shapes[m + ".weight"]
            out[m + ".lora_A.weight"] = (r, n)
            out[m + ".lora_B.weight"] = (o, r)
    return out


def lora_scale(r, alpha, use_rslora=False):
    return float(alpha) / (math.sqrt(r) if use_rslora else float(r))


def init_lora(cfg, r, targets, seed=0, b_std=0.05):
    """Random adapters, float32: A uniform(+-1/sqrt(in)) like PEFT's kaiming init, and B
    random too (PEFT starts B at zero) so the adapter path matters from the first step."""
    rng = np.random.default_rng(seed + 777)
    w = {}
    for name, shape in lora_shapes(cfg, r, targets).items():
        if ".lora_A." in name:
            bound = 1.0 / math.sqrt(shape[1])
            a = rng.uniform(-bound, bound, size=shape)
        else:
            a = b_std * rng.standard_normal(shape)
        w[name] = a.astype(np.float32)
    return w


def lora_spec(cfg, r, alpha, targets, use_rslora=False, weights=None, seed=0, dropout=0.0,
              b_std=0.05):
    """The `lora` argument of RefLlama/RefTrainer: settings plus {hf lora name: ndarray}."""
    targets = [t for t in ANY_TARGET if t in targets]
    if weights is None:
        weights = init_lora(cfg, r, targets, seed=seed, b_std=b_std)
    return {"r": int(r), "lora_alpha": alpha, "use_rslora": bool(use_rslora),
            "lora_dropout": dropout, "target_modules": targets, "weights": dict(weights)}


def save_adapter_dir(path, spec, target_order=None, base_model=""):
    """PEFT layout: adapter_model.safetensors (base_model.model.<hf name>) and
    adapter_config.json. target_order lists target_modules in the file in that order."""
    os.makedirs(path, exist_ok=True)
    write_safetensors(os.path.join(path, "adapter_model.safetensors"),
                      {PEFT_PREFIX + k: np.asarray(v, dtype=np.float32)
                       for k, v in spec["weights"].items()},
                      metadata={"format": "pt"})
    conf = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": spec["r"],
            "lora_alpha": spec["lora_alpha"], "lora_dropout": spec.get("lora_dropout", 0.0),
            "target_modules": list(target_order or spec["target_modules"]), "bias": "none",
            "use_rslora": bool(spec["use_rslora"]), "fan_in_fan_out": False,
            "inference_mode": True, "base_model_name_or_path": base_model}
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump(conf, f, indent=2)


def load_adapter_dir(path):
    """Reads a PEFT adapter directory into a lora spec (names without the PEFT prefix)."""
    with open(os.path.join(path, "adapter_config.json")) as f:
        conf = json.load(f)
    if conf.get("peft_type") != "LORA":
        raise ValueError(f"{path}: peft_type {conf.get('peft_type')!r}, expected LORA")
    tm = conf["target_modules"]
    if isinstance(tm, str):
        tm = [tm]
    raw = read_safetensors(os.path.join(path, "adapter_model.safetensors"))
    w = {}
    for k, v in raw.items():
        if not k.startswith(PEFT_PREFIX):
            raise ValueError(f"{path}: adapter tensor {k} lacks the {PEFT_PREFIX} prefix")
        w[k[len(PEFT_PREFIX):]] = v
    spec = {"r": int(conf["r"]), "lora_alpha": conf["lora_alpha"],
            "use_rslora": bool(conf.get("use_rslora", False)),
            "lora_dropout": float(conf.get("lora_dropout", 0.0)),
            "target_modules": [t for t in ANY_TARGET if t in tm], "weights": w,
            "config": conf}
    return spec


def merge_lora(cfg, weights, spec):
    """Base weights with every adapted W replaced by W + scale * B @ A (float64)."""
    s = lora_scale(spec["r"], spec["lora_alpha"], spec["use_rslora"])
    out = {k: np.asarray(v, dtype=np.float64).copy() for k, v in weights.items()}
    for i in range(cfg["num_hidden_layers"]):
        for t in spec["target_modules"]:
            m = lora_module(i, t)
            A = np.asarray(spec["weights"][m + ".lora_A.weight"], dtype=np.float64)
            B = np.asarray(spec["weights"][m + ".lora_B.weight"], dtype=np.float64)
            out[m + ".weight"] += s * (B @ A)
    return out


def init_weights(cfg, seed=0, std=0.05, embed_std=0.5, norm_jitter=0.1, bias_std=0.05,
                 qk_std=None):
    """Seeded random weights, float32. Norm weights are 1 + jitter so they matter in tests;
    qk_std (default std) sets q_proj/k_proj weights, larger values give sharper attention."""
    rng = np.random.default_rng(seed)
    w = {}
    norm_at = 0.0 if family(cfg)["gemma"] else 1.0  # Gemma's norms apply 1 + w
    for name, shape in param_shapes(cfg).items():
        if qk_std is not None and (name.endswith("q_proj.weight") or
                                   name.endswith("k_proj.weight")):
            a = qk_std * rng.standard_normal(shape)
        elif "norm" in name:
            a = norm_at + norm_jitter * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            a = bias_std * rng.standard_normal(shape)
        elif name == "model.embed_tokens.weight":
            a = embed_std * rng.standard_normal(shape)
        else:
            a = std * rng.standard_normal(shape)
        w[name] = a.astype(np.float32)
    return w


# --------------------------------------------------------------------------------------------
# files: safetensors, HF dir, token shards, YAML, metrics

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
              "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8}


def write_safetensors(path, tensors, metadata=None):
    """Write {name: ndarray} (float32 unless given as float64/int) as a safetensors file."""
    header = {}
    blobs = []
    off = 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        if a.dtype == np.float32:
            dt = "F32"
        elif a.dtype == np.float64:
            dt = "F64"
        elif a.dtype == np.int32:
            dt = "I32"
        elif a.dtype == np.int64:
            dt = "I64"
        else:
            raise ValueError(f"unsupported dtype {a.dtype} for {name}")
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hj = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """Read a safetensors file into {name: ndarray}; BF16 is widened to float32."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} past end of file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        raw = data[base + b:base + e]
        dt = info["dtype"]
        if dt == "BF16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            a = u.view(np.float32)
        elif dt in _ST_DTYPES:
            a = np.frombuffer(raw, dtype=np.dtype(_ST_DTYPES[dt]).newbyteorder("<"))
        else:
            raise ValueError(f"{path}: {name}: unsupported dtype {dt}")
        if a.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: {name}: {a.size} elements for shape {shape}")
        out[name] = a.reshape(shape).copy()
    return out


def save_hf_dir(path, cfg, weights):
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    write_safetensors(os.path.join(path, "model.safetensors"),
                      {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()},
                      metadata={"format": "pt"})


def save_hf_dir_gemma3_multimodal(d, cfg, weights, layout="language_model.model."):
    """cfg/weights as a Gemma3ForConditionalGeneration directory: text_config (keys at their
    Gemma3TextConfig defaults left out), the text tensors under layout ("language_model.model."
    as the hub's files, or "model.language_model." as transformers >= 4.52 saves), and a vision
    tower's and projector's tensors beside them."""
    os.makedirs(d, exist_ok=True)
    defaults = {"rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True, "pad_token_id": 0}
    text = {k: v for k, v in cfg.items() if k not in ("architectures", "model_type", "eos_token_id", "bos_token_id",
                                                       "torch_dtype") and not (k in defaults and v == defaults[k])}
    text["model_type"] = "gemma3_text"
    mm = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "text_config": text,
          "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8, "num_hidden_layers": 1},
          "mm_tokens_per_image": 4, "image_token_index": cfg["vocab_size"] - 1, "torch_dtype": "float32",
          "eos_token_id": cfg.get("eos_token_id"), "bos_token_id": cfg.get("bos_token_id")}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(mm, f, indent=2)
    vis = "vision_tower." if layout.startswith("language_model") else "model.vision_tower."
    # an untied head: language_model.lm_head.weight beside language_model.model.*, else lm_head.weight
    head = "language_model.lm_head.weight" if layout.startswith("language_model") else "lm_head.weight"
    t = {(layout + k[6:] if k.startswith("model.") else head if k == "lm_head.weight" else k): v
         for k, v in weights.items()}
    t[vis + "vision_model.embeddings.patch_embedding.weight"] = np.ones((8, 3, 2, 2), np.float32)
    t["multi_modal_projector.mm_input_projection_weight"] = np.ones((8, cfg["hidden_size"]), np.float32)
    write_safetensors(os.path.join(d, "model.safetensors"), t, metadata={"format": "pt"})
    return dict(defaults, **cfg)  # the text model read from it


def write_shard(path, tokens, version=1):
    """llm.c token shard: 256 int32 header (magic, version, count), then uint16 (v1) or
    uint32 (v2) tokens."""
    tokens = np.asarray(tokens)
    hdr = np.zeros(SHARD_HEADER_INTS, dtype="<i4")
    hdr[0] = SHARD_MAGIC
    hdr[1] = version
    hdr[2] = len(tokens)
    dt = {1: "<u2", 2: "<u4"}[version]
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(tokens.astype(dt).tobytes())


def read_shard(path):
    with open(path, "rb") as f:
        hdr = np.frombuffer(f.read(SHARD_HEADER_INTS * 4), dtype="<i4")
        if hdr[0] != SHARD_MAGIC:
            raise ValueError(f"{path}: bad magic {hdr[0]}")
        dt = {1: "<u2", 2: "<u4"}[int(hdr[1])]
        toks = np.frombuffer(f.read(), dtype=dt)
    n = int(hdr[2])
    if len(toks) < n:
        raise ValueError(f"{path}: header says {n} tokens, file has {len(toks)}")
    return toks[:n].astype(np.int64)


def random_tokens(n, vocab_size, seed=0):
    return np.random.default_rng(seed + 12345).integers(0, vocab_size, size=n, dtype=np.int64)


def train_config(**kw):
    """YAML-level training settings with defaults; keys are the trainer's YAML keys."""
    tc = {
        "shuffle": False,
        "sequence_len": 16,
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "max_steps": 4,
        "learning_rate": 1e-3,
        "lr_scheduler": "cosine",
        "warmup_steps": 2,
        "weight_decay": 0.1,
        "max_grad_norm": 1.0,
        "adam_beta1": 0.9,
        "adam_beta2": 0.999,
        "adam_epsilon": 1e-8,
        "seed": 0,
        "save_steps": 0,
        "eval_steps": 0,
        "sample_steps": 0,
        "num_threads": 0,
        "device": "cpu",
    }
    tc.update(kw)
    return tc


def _yaml_scalar(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    return json.dumps(str(v))  # a double-quoted string is valid YAML


def unfrozen_pattern(p):
    """An unfrozen_parameters entry as Axolotl reads it: (compiled name regex, row range or None)."""
    m = re.match(r"^(.+)\[([0-9]*)(?::([0-9]*))?\]$", p)
    rng = None
    if m:
        p, a, b = m.groups()
        rng = (int(a), int(a) + 1) if b is None and a else (int(a) if a else 0, int(b) if b else None)
    return re.compile(re.sub(r"\.(?!\+)", "\\.", p)), rng


def frozen_rows(ranges, rows):
    """The rows outside the union of ranges (end None: the last row), as [start, end) pairs;
    [] when there are no ranges."""
    if not ranges:
        return []
    ranges = sorted((a, rows if b is None else b) for a, b in ranges)
    for a, b in ranges:
        assert 0 <= a < b <= rows, (a, b, rows)
    out, at = [], 0
    for a, b in ranges:
        if a > at:
            out.append((at, a))
        at = max(at, b)
    if at < rows:
        out.append((at, rows))
    return out


def zero_rows(g, frozen):
    g = g.clone()
    for a, b in frozen:
        g[a:b] = 0
    return g


def write_yaml(path, d):
    """key: value lines; a list or tuple value is written as a YAML flow list [a, b]."""
    with open(path, "w") as f:
        for k, v in d.items():
            if isinstance(v, (list, tuple)):
                items = [x if isinstance(x, str) and x.isidentifier() else _yaml_scalar(x)
                         for x in v]  # plain names stay plain: [q_proj, v_proj]
                f.write(f"{k}: [{', '.join(items)}]\n")
            elif isinstance(v, dict):  # a flow mapping of scalars: {rope_type: "yarn", factor: 4.0}
                f.write(f"{k}: {{{', '.join(f'{a}: {_yaml_scalar(b)}' for a, b in v.items())}}}\n")
            else:
                f.write(f"{k}: {_yaml_scalar(v)}\n")


def read_metrics(path):
    """Train lines (those with "loss", not "val_loss") of a metrics.jsonl, in file order."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if "loss" in r and "step" in r:
                rows.append(r)
    return rows


# --------------------------------------------------------------------------------------------
# model


LONGROPE = ("longrope", "su", "yarn")  # Phi3Config renames the legacy two


def rope_attention_factor(cfg):
    """Phi-3 longrope's cos/sin scale (modeling_phi3 4.44, rope_utils 4.57): rope_scaling's
    attention_factor, else sqrt(1 + ln(max / orig) / ln(orig)) when max > orig; 1 otherwise."""
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type")) == "yarn":  # transformers 4.57's yarn
        if rs.get("attention_factor") is not None:
            return float(rs["attention_factor"])
        f = float(rs["factor"])

        def mscale(m):
            return 1.0 if f <= 1 else 0.1 * m * math.log(f) + 1.0
        if rs.get("mscale") and rs.get("mscale_all_dim"):
            return mscale(rs["mscale"]) / mscale(rs["mscale_all_dim"])
        return mscale(1.0)
    if rs.get("rope_type", rs.get("type")) not in LONGROPE:
        return 1.0
    if "attention_factor" in rs:
        return float(rs["attention_factor"])
    orig = cfg.get("original_max_position_embeddings", 4096)
    scale = cfg["max_position_embeddings"] / orig
    return 1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(orig))


def rotary_dims(cfg):
    """The dimensions of a head RoPE rotates: int(head_dim * partial_rotary_factor) (transformers'
    rope init; only Phi-3's attention then rotates a share and passes the rest)."""
    return int(_dims(cfg)[3] * cfg.get("partial_rotary_factor", 1.0))


def rope_inv_freq(cfg, seq_len=0):
    """HF default inv_freq in float32, with the llama3 rope_scaling rule applied (in float32),
    or Phi-3's longrope: 1 / (ext_factors * theta ** e), the long factors when seq_len (the
    batch's largest position + 1) passes original_max_position_embeddings."""
    D = rotary_dims(cfg)
    theta = float(cfg.get("rope_theta", 10000.0))
    exps = torch.arange(0, D, 2, dtype=torch.int64).float() / D
    inv = 1.0 / (theta ** exps)  # float32
    rs = cfg.get("rope_scaling")
    if rs:
        rtype = rs.get("rope_type", rs.get("type"))
        if rtype in (None, "default"):
            return inv
        if rtype == "linear":
            return inv / float(rs["factor"])
        if rtype == "yarn":  # transformers 4.57's _compute_yarn_parameters, float32 as there
            f = float(rs["factor"])
            orig = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
            fast, slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1

            def corr(rot):
                return (D * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(theta))
            lo, hi = corr(fast), corr(slow)
            if rs.get("truncate", True):
                lo, hi = math.floor(lo), math.ceil(hi)
            lo, hi = max(lo, 0), min(hi, D - 1)
            if lo == hi:
                hi += 0.001
            pos = theta ** exps
            ramp = torch.clamp((torch.arange(D // 2, dtype=torch.float32) - lo) / (hi - lo), 0, 1)
            ef = 1 - ramp
            return (1.0 / (f * pos)) * (1 - ef) + (1.0 / pos) * ef
        if rtype in LONGROPE:
            long = seq_len > cfg.get("original_max_position_embeddings", 4096)
            ext = torch.tensor(rs["long_factor" if long else "short_factor"], dtype=torch.float32)
            return 1.0 / (ext * theta ** exps)
        if rtype != "llama3":
            raise ValueError(f"rope_type {rtype} not supported by the reference")
        factor = float(rs["factor"])
        lo = float(rs["low_freq_factor"])
        hi = float(rs["high_freq_factor"])
        old_ctx = float(rs["original_max_position_embeddings"])
        lo_wavelen = old_ctx / lo
        hi_wavelen = old_ctx / hi
        wavelen = 2 * math.pi / inv
        # long wavelengths (low frequencies) are slowed down by `factor`
        scaled = torch.where(wavelen > lo_wavelen, inv / factor, inv)
        # in between the two thresholds: interpolate
        smooth = (old_ctx / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= hi_wavelen) & (wavelen <= lo_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    return inv


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def accumulate_loss(model, loader, n_total, accum):
    """Gradients of the mean token loss over accum micro-batches; returns that mean loss."""
    loss_sum = 0.0
    for _ in range(accum):
        x, y = loader.next()
        logits = model(x)
        l = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
        (l / n_total).backward()
        loss_sum += l.item()
    return loss_sum / n_total


def grad_norm_clip(params, max_norm):
    """Pre-clip global gradient norm; clips in place when max_norm > 0 (clip_grad_norm_)."""
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    return float(torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params if p.grad is not None)))


# --------------------------------------------------------------------------------------------
# bitsandbytes' 8-bit AdamW (bnb.optim.AdamW8bit: Axolotl's adamw_bnb_8bit, adamw_8bit,
# paged_adamw_8bit), written from its algorithm (optimizer.py's init_state, functional.py's
# create_dynamic_map, the pure-PyTorch 8-bit blockwise update): tensors of at least 4096
# elements keep each moment as a uint8 index into a 256-entry map (signed for the first moment,
# unsigned for the second) times one float absmax per block of 256 elements; smaller tensors
# keep float32 moments. The update runs in float32.

ADAM8_NAMES = ("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "adamw_torch_8bit", "adamw_torch_4bit")
# torchao's AdamW4bit (adamw_torch_4bit; its subclass_4bit.py): the AdamW8bit steps over 4-bit
# codes, blocks of 128 (and sizes a multiple of 128), maps create_dynamic_map(True, 3, 4) and
# linspace(0, 1, 17)[1:].
# torchao's AdamW8bit (transformers' adamw_torch_8bit; torchao/optim: adam.py's single_param_adam,
# quant_utils' scale_tensor and quantize_8bit_with_qmap): byte moments only for tensors of at
# least 4096 elements whose size is a multiple of its 256-element block, moments by lerp, the
# scale clipped to at least 1e-12, a code rounded up when x - down >= (up - down) / 2.


def dynamic_map(signed, e=7):
    """The 2^(e+1) ascending float32 codes: for exponent i = 0..e-1 the midpoints of
    linspace(0.1, 1) with 2^i + 1 points (unsigned: 2^(i+1) + 1) times 10^(i - e + 1), and their
    negatives when signed; then 0 and 1."""
    vals = []
    for i in range(e):
        n = (2 ** i if signed else 2 ** (i + 1)) + 1
        b = torch.linspace(0.1, 1, n, dtype=torch.float32)
        mid = (b[:-1] + b[1:]) / 2.0
        vals += ((10 ** (i - e + 1)) * mid).tolist()
        if signed:
            vals += (-(10 ** (i - e + 1)) * mid).tolist()
    vals += [0.0, 1.0]
    assert len(vals) == 2 ** (e + 1)
    return torch.tensor(sorted(vals), dtype=torch.float32)


def torchao4_maps():
    """torchao's 4-bit maps: create_dynamic_map(True, 3, 4), linspace(0, 1, 17)[1:]."""
    return dynamic_map(True, 3), torch.linspace(0, 1, 17, dtype=torch.float32)[1:]


def _blocks(x, block=256):
    n = x.numel()
    nb = (n + block - 1) // block
    return F.pad(x.reshape(-1), (0, nb * block - n)).reshape(nb, block), n


def quantize8(x, code, torchao=False, block=256):
    """(uint8 indices of the nearest codes to x / its block's absmax, absmax per block)."""
    xb, n = _blocks(x.float(), block)
    last = code.numel() - 1
    absmax = xb.abs().max(dim=1, keepdim=True)[0]
    if torchao:
        absmax = absmax.clip(1e-12)
        y = xb / absmax
        lo = (y.unsqueeze(2) >= code).sum(dim=2).sub(1).clamp(min=0)  # the last code <= y (0 if none)
        up = (lo + 1).clamp(max=last)
        down_v, up_v = code[lo], code[up]
        idx = torch.where(y - down_v >= (up_v - down_v) * 0.5, up, lo).to(torch.uint8)
    else:
        absmax[absmax == 0] = 1.0
        idx = torch.argmin((xb / absmax).unsqueeze(2).sub(code).abs(), dim=2).to(torch.uint8)
    return idx.reshape(-1)[:n].reshape(x.shape), absmax.reshape(-1)


def dequantize8(q, absmax, code, block=256):
    qb, n = _blocks(code[q.long()], block)
    return (qb * absmax.unsqueeze(1)).reshape(-1)[:n].reshape(q.shape)


class AdamW8bit(torch.optim.Optimizer):
    """The reference's bitsandbytes 8-bit AdamW (see above); params of any float dtype are
    updated through a float32 copy, as bitsandbytes' update does."""

    def __init__(self, params, lr, betas, eps, weight_decay=0.0, codes=None, torchao=False, bits=8):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.torchao = torchao or bits == 4
        self.block = 128 if bits == 4 else 256
        # codes: (signed, unsigned) maps to use instead of torch's (whose last bits vary by CPU)
        self.code1, self.code2 = codes if codes is not None else (
            torchao4_maps() if bits == 4 else (dynamic_map(True), dynamic_map(False)))

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            b1, b2 = g["betas"]
            lr, eps, wd = g["lr"], g["eps"], g["weight_decay"]
            for p in g["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                small = p.numel() < 4096 or (self.torchao and p.numel() % self.block != 0)
                if not st:
                    st["step"] = 0
                    if small:
                        st["m"] = torch.zeros(p.shape, dtype=torch.float32)
                        st["v"] = torch.zeros(p.shape, dtype=torch.float32)
                    else:
                        nb = (p.numel() + self.block - 1) // self.block
                        st["q1"] = torch.zeros(p.shape, dtype=torch.uint8)
                        st["q2"] = torch.zeros(p.shape, dtype=torch.uint8)
                        st["a1"] = torch.zeros(nb, dtype=torch.float32)
                        st["a2"] = torch.zeros(nb, dtype=torch.float32)
                st["step"] += 1
                t = st["step"]
                grad = p.grad.float()
                w = p.detach().float()
                m = st["m"] if small else dequantize8(st["q1"], st["a1"], self.code1, self.block)
                v = st["v"] if small else dequantize8(st["q2"], st["a2"], self.code2, self.block)
                bc1, bc2 = 1.0 - b1 ** t, 1.0 - b2 ** t
                if self.torchao:  # single_param_adam
                    w = w - lr * wd * w
                    m = m.lerp(grad, 1 - b1)
                    v = v.lerp(grad.square(), 1 - b2)
                    w = w - lr * (m / bc1) / ((v.sqrt() / math.sqrt(bc2)) + eps)
                    if small:
                        st["m"], st["v"] = m, v
                else:
                    m.mul_(b1).add_(grad, alpha=1.0 - b1)
                    v.mul_(b2).addcmul_(grad, grad, value=1.0 - b2)
                    denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
                    if wd > 0.0:
                        w.mul_(1.0 - lr * wd)
                    w.addcdiv_(m, denom, value=-lr / bc1)
                p.copy_(w.to(p.dtype))
                if not small:
                    st["q1"], st["a1"] = quantize8(m, self.code1, self.torchao, self.block)
                    st["q2"], st["a2"] = quantize8(v, self.code2, self.torchao, self.block)


class RefLlama(torch.nn.Module):
    """lora: a lora_spec dict; then the base is frozen (requires_grad False) and the adapted
    projections add scale * B(A(x))."""

    def __init__(self, cfg, weights, dtype=torch.float64, use_sdpa=False, lora=None):
        super().__init__()
        self.cfg = cfg
        self.C, self.Hq, self.Hkv, self.D = _dims(cfg)
        self.L = cfg["num_hidden_layers"]
        self.eps = float(cfg.get("rms_norm_eps", 1e-6))
        self.tied = tied(cfg)
        fam = family(cfg)
        self.bias, self.o_bias, self.qk_norm = fam["qkv_bias"], fam["o_bias"], fam["qk_norm"]
        self.windows = fam["windows"]
        self.fused, self.pad = fam["fused"], fam["pad"]
        self.gemma, self.local_rope = fam["gemma"], fam["local_rope"]
        self.sandwich, self.gelu_exact = fam["sandwich"], fam["gelu_exact"]
        self.attn_cap, self.final_cap = fam["attn_softcap"], fam["final_softcap"]
        self.norm_add = 1.0 if self.gemma else 0.0
        qpas = cfg.get("query_pre_attn_scalar", 256) if self.sandwich else self.D
        self.att_scale = qpas ** -0.5
        self.use_sdpa = use_sdpa and hasattr(F, "scaled_dot_product_attention")
        self.dtype = dtype
        shapes = param_shapes(cfg)
        missing = [k for k in shapes if k not in weights]
        if missing:
            raise ValueError(f"weights missing {missing[:4]}")
        self.names = list(shapes)
        self.params = torch.nn.ParameterDict()  # keys may not contain '.', so map names
        for k in self.names:
            a = torch.from_numpy(np.asarray(weights[k], dtype=np.float32).copy()).to(dtype)
            assert tuple(a.shape) == tuple(shapes[k]), (k, a.shape, shapes[k])
            self.params[k.replace(".", "__")] = torch.nn.Parameter(a, requires_grad=lora is None)
        self.inv_freq = rope_inv_freq(cfg).to(torch.float64)
        self.rope_af = rope_attention_factor(cfg)
        self.lora = lora
        self.lora_names = []
        self.lora_params = torch.nn.ParameterDict()
        if lora is not None:
            if float(lora.get("lora_dropout", 0.0) or 0.0) != 0.0:
                raise ValueError("the reference does not model LoRA dropout")
            self.lora_targets = set(lora["target_modules"])
            self.lora_scale = lora_scale(lora["r"], lora["lora_alpha"], lora["use_rslora"])
            lshapes = lora_shapes(cfg, lora["r"], lora["target_modules"])
            extra = sorted(set(lora["weights"]) - set(lshapes))
            missing = [k for k in lshapes if k not in lora["weights"]]
            if missing or extra:
                raise ValueError(f"adapter tensors: missing {missing[:4]}, extra {extra[:4]}")
            self.lora_names = list(lshapes)
            for k in self.lora_names:
                a = torch.from_numpy(np.asarray(lora["weights"][k], dtype=np.float32).copy())
                assert tuple(a.shape) == tuple(lshapes[k]), (k, a.shape, lshapes[k])
                self.lora_params[k.replace(".", "__")] = torch.nn.Parameter(a.to(dtype))

    def p(self, name):
        return self.params[name.replace(".", "__")]

    def named_hf_parameters(self):
        return [(k, self.p(k)) for k in self.names]

    def named_lora_parameters(self):
        return [(k, self.lora_params[k.replace(".", "__")]) for k in self.lora_names]

    def named_trainable_parameters(self):
        """The adapters when there are any, else every base parameter."""
        return self.named_lora_parameters() if self.lora is not None else self.named_hf_parameters()

    def linear(self, x, module, bias):
        """module (e.g. model.layers.0.self_attn.q_proj) applied to x, with its adapter."""
        y = F.linear(x, self.p(module + ".weight"), bias)
        if self.lora is not None and module.rsplit(".", 1)[1] in self.lora_targets:
            A = self.lora_params[(module + ".lora_A.weight").replace(".", "__")]
            B = self.lora_params[(module + ".lora_B.weight").replace(".", "__")]
            y = y + self.lora_scale * F.linear(F.linear(x, A), B)
        return y

    def rmsnorm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (w + self.norm_add)

    def forward(self, idx):
        B, T = idx.shape
        C, Hq, Hkv, D = self.C, self.Hq, self.Hkv, self.D
        x = F.embedding(idx, self.p("model.embed_tokens.weight"), padding_idx=self.pad)
        if self.gemma:  # Gemma3TextScaledWordEmbedding
            x = x * math.sqrt(C)
        pos = torch.arange(T, dtype=torch.float64)

        def tables(cfg, af):
            inv_freq = rope_inv_freq(cfg, T).to(torch.float64)  # longrope picks by T
            ang = pos[:, None] * inv_freq[None, :]                # [T, D/2]
            ang = torch.cat((ang, ang), dim=-1)                    # [T, D]
            return (ang.cos() * af).to(self.dtype), (ang.sin() * af).to(self.dtype)
        cos_g, sin_g = tables(self.cfg, self.rope_af)
        if any(self.local_rope):  # Gemma 3's sliding layers' RoPE: the local base, no scaling
            lc = dict(self.cfg, rope_theta=self.cfg.get("rope_local_base_freq", 10000.0), rope_scaling=None)
            cos_l, sin_l = tables(lc, 1.0)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        rep = Hq // Hkv
        for i in range(self.L):
            pre = f"model.layers.{i}."
            h = self.rmsnorm(x, self.p(pre + "input_layernorm.weight"))
            if self.fused:  # Phi3Attention: qkv[..., :Hq D] | [Hq D : (Hq + Hkv) D] | rest
                qkv = self.linear(h, pre + "self_attn.qkv_proj", None)
                q = qkv[..., :Hq * D]
                k = qkv[..., Hq * D:(Hq + Hkv) * D]
                v = qkv[..., (Hq + Hkv) * D:]
            else:
                bq = self.p(pre + "self_attn.q_proj.bias") if self.bias else None
                bk = self.p(pre + "self_attn.k_proj.bias") if self.bias else None
                bv = self.p(pre + "self_attn.v_proj.bias") if self.bias else None
                q = self.linear(h, pre + "self_attn.q_proj", bq)
                k = self.linear(h, pre + "self_attn.k_proj", bk)
                v = self.linear(h, pre + "self_attn.v_proj", bv)
            q = q.view(B, T, Hq, D)
            k = k.view(B, T, Hkv, D)
            if self.qk_norm:  # Qwen3: RMSNorm over head_dim of each head, before RoPE
                q = self.rmsnorm(q, self.p(pre + "self_attn.q_norm.weight"))
                k = self.rmsnorm(k, self.p(pre + "self_attn.k_norm.weight"))
            q = q.transpose(1, 2)
            k = k.transpose(1, 2)
            v = v.view(B, T, Hkv, D).transpose(1, 2)
            cos, sin = (cos_l, sin_l) if self.local_rope[i] else (cos_g, sin_g)
            rd = cos.shape[-1]  # modeling_phi3: rotate the first rd dimensions, pass the rest
            q = torch.cat((q[..., :rd] * cos + _rotate_half(q[..., :rd]) * sin, q[..., rd:]), dim=-1)
            k = torch.cat((k[..., :rd] * cos + _rotate_half(k[..., :rd]) * sin, k[..., rd:]), dim=-1)
            if rep > 1:  # query head h reads kv head h // rep
                k = k.repeat_interleave(rep, dim=1)
                v = v.repeat_interleave(rep, dim=1)
            W = self.windows[i]
            if self.use_sdpa and not W and not self.gemma:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-1, -2)) * self.att_scale
                if self.attn_cap:  # Gemma 2's eager attention: cap tanh(s / cap), then the mask
                    att = torch.tanh(att / self.attn_cap) * self.attn_cap
                mask = causal
                if W:  # keys j with i - W < j <= i
                    ii = torch.arange(T)[:, None]
                    jj = torch.arange(T)[None, :]
                    mask = causal & (jj > ii - W)
                att = att.masked_fill(~mask, float("-inf"))
                y = torch.softmax(att, dim=-1) @ v
            y = y.transpose(1, 2).reshape(B, T, Hq * D)
            bo = self.p(pre + "self_attn.o_proj.bias") if self.o_bias else None
            gelu = "none" if self.gelu_exact else "tanh"  # the Gemmas' GeGLU
            if self.sandwich:  # Gemma3DecoderLayer: sandwich norms, GeGLU
                o = self.linear(y, pre + "self_attn.o_proj", bo)
                x = x + self.rmsnorm(o, self.p(pre + "post_attention_layernorm.weight"))
                h = self.rmsnorm(x, self.p(pre + "pre_feedforward_layernorm.weight"))
                g = self.linear(h, pre + "mlp.gate_proj", None)
                u = self.linear(h, pre + "mlp.up_proj", None)
                f = self.linear(F.gelu(g, approximate=gelu) * u, pre + "mlp.down_proj", None)
                x = x + self.rmsnorm(f, self.p(pre + "post_feedforward_layernorm.weight"))
                continue
            x = x + self.linear(y, pre + "self_attn.o_proj", bo)
            h = self.rmsnorm(x, self.p(pre + "post_attention_layernorm.weight"))
            if self.fused:  # Phi3MLP: gate, up = gate_up_proj(h).chunk(2, dim=-1)
                g, u = self.linear(h, pre + "mlp.gate_up_proj", None).chunk(2, dim=-1)
            else:
                g = self.linear(h, pre + "mlp.gate_proj", None)
                u = self.linear(h, pre + "mlp.up_proj", None)
            act = F.gelu(g, approximate=gelu) if self.gemma else F.silu(g)  # Gemma 1: GeGLU
            x = x + self.linear(act * u, pre + "mlp.down_proj", None)
        x = self.rmsnorm(x, self.p("model.norm.weight"))
        if seqcls(self.cfg):  # GenericForSequenceClassification: score(h) at every position, no capping
            return F.linear(x, self.p("score.weight"))
        if tokcls(self.cfg):  # GenericForTokenClassification: score(h) + bias at every position (dropout off)
            return F.linear(x, self.p("score.weight"), self.p("score.bias"))
        head = self.p("model.embed_tokens.weight" if self.tied else "lm_head.weight")
        logits = F.linear(x, head)
        if self.final_cap:  # Gemma2ForCausalLM's final_logit_softcapping
            logits = torch.tanh(logits / self.final_cap) * self.final_cap
        return logits


# --------------------------------------------------------------------------------------------
# training


def lr_factor(s, scheduler, warmup, total):
    """LR multiplier for 0-based optimizer step s (HF get_*_schedule_with_warmup; "constant" is
    get_constant_schedule, which has no warmup)."""
    if scheduler == "constant":
        return 1.0
    if s < warmup:
        return s / max(1, warmup)
    if scheduler == "constant_with_warmup":
        return 1.0
    if scheduler == "linear":
        return max(0.0, (total - s) / max(1, total - warmup))
    if scheduler == "cosine":
        progress = (s - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    raise ValueError(f"unknown lr_scheduler {scheduler}")


class DataLoader:
    """Sequential (shuffle false) llm.c-style loader over one shard's tokens."""

    def __init__(self, tokens, B, T):
        self.tokens = np.asarray(tokens, dtype=np.int64)
        self.B, self.T = B, T
        if len(self.tokens) < B * T + 1:
            raise ValueError(f"shard has {len(self.tokens)} tokens, need at least {B * T + 1}")
        self.pos = 0

    def next(self):
        B, T = self.B, self.T
        if self.pos + B * T + 1 > len(self.tokens):
            self.pos = 0
        buf = self.tokens[self.pos:self.pos + B * T + 1]
        x = torch.from_numpy(buf[:-1].reshape(B, T).copy())
        y = torch.from_numpy(buf[1:].reshape(B, T).copy())
        self.pos += B * T
        return x, y


M64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    z = x
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31), x


def _rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


class Xoshiro:
    """llmc/util.c's rng_seed / rng_next (xoshiro256** seeded by splitmix64)."""

    def __init__(self, seed):
        self.s = []
        x = seed & M64
        for _ in range(4):
            z, x = _splitmix64(x)
            self.s.append(z)

    def next(self):
        s = self.s
        result = (_rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = _rotl(s[3], 45)
        return result


def lisa_draws_at(s, interval):
    """Axolotl's LISA callback draws before the step that follows s completed steps when
    s % interval == 0 or s == 1."""
    return s % interval == 0 or s == 1


def lisa_draw(seed, s, n, L):
    """llmc/lisa.c's draw at s completed steps: the first n of a partial Fisher-Yates shuffle of
    0..L-1 (Axolotl draws with numpy; this program with its own generator)."""
    idx = list(range(L))
    r = Xoshiro((seed * 0x9E3779B97F4A7C15 + 0x4C495341 + s) & M64)
    for i in range(n):
        j = i + r.next() % (L - i)
        idx[i], idx[j] = idx[j], idx[i]
    return sorted(idx[:n])


class RefTrainer:
    """Full fine-tuning, or with lora (a lora_spec dict) adapter training over a frozen base:
    AdamW, clipping and the grad norm then cover the adapters only; weight decay applies to
    A and B (HF Trainer decays every parameter that is not a bias or a norm weight)."""

    def __init__(self, cfg, weights, tokens, tc, dtype=torch.float64, use_sdpa=False, lora=None):
        self.tc = tc
        self.model = RefLlama(cfg, weights, dtype=dtype, use_sdpa=use_sdpa, lora=lora)
        self.B = int(tc["micro_batch_size"])
        self.T = int(tc["sequence_len"])
        self.accum = int(tc.get("gradient_accumulation_steps", 1))
        self.loader = DataLoader(tokens, self.B, self.T)
        named = self.model.named_trainable_parameters()
        if lora is not None and tc.get("lora_modules_to_save"):
            # PEFT's modules_to_save: the whole module trains beside the adapters (a copy of it,
            # with the same initial values; its name in the optimizer still decays it)
            names = {"embed_tokens": "model.embed_tokens.weight", "lm_head": "lm_head.weight"}
            for m in tc["lora_modules_to_save"]:
                p = self.model.p(names[m])
                p.requires_grad_(True)
                named = list(named) + [(names[m], p)]
        if tc.get("unfrozen_parameters"):
            # Axolotl's freeze_layers_except: re.match after every '.' not before '+' is made literal;
            # the rest is frozen (no gradient, so no clipping share, no optimizer state, no decay).
            # A trailing row range ([N], [a:b], [:b], [a:]) keeps the tensor trainable but zeroes the
            # gradient of the rows outside the union of the ranges of the patterns that match it.
            pats = [unfrozen_pattern(p) for p in tc["unfrozen_parameters"]]
            keep = []
            for n, p in named:
                hits = [rng for rx, rng in pats if rx.match(n)]
                if not hits:
                    p.requires_grad_(False)
                    continue
                keep.append((n, p))
                frozen = frozen_rows([r for r in hits if r is not None], p.shape[0])
                if frozen:
                    p.register_hook(lambda g, fr=frozen: zero_rows(g, fr))
            named = keep
        decay = [p for n, p in named if is_decay_param(n)]
        nodecay = [p for n, p in named if not is_decay_param(n)]
        self.all_params = [p for _, p in named]
        self.base_lr = float(tc["learning_rate"])
        groups = [{"params": decay, "weight_decay": float(tc["weight_decay"])},
                  {"params": nodecay, "weight_decay": 0.0}]
        hyper = dict(lr=self.base_lr, betas=(float(tc["adam_beta1"]), float(tc["adam_beta2"])),
                     eps=float(tc["adam_epsilon"]))
        if tc.get("optimizer") in ADAM8_NAMES:  # tc["_adam8_codes"]: AdamW8bit's codes
            self.opt = AdamW8bit(groups, codes=tc.get("_adam8_codes"), torchao=tc["optimizer"] == "adamw_torch_8bit",
                                 bits=4 if tc["optimizer"] == "adamw_torch_4bit" else 8, **hyper)
        else:
            self.opt = torch.optim.AdamW(groups, **hyper)
        self.s = 0  # 0-based index of the next optimizer step
        # LISA (Axolotl's callback): before a drawing step every decoder layer is frozen and the
        # drawn ones unfrozen; a frozen tensor has no gradient (zero_grad sets them to None), so
        # the norm, clipping and AdamW (its per-tensor step count included) pass it by.
        self.lisa = None
        if int(tc.get("lisa_n_layers", 0) or 0) and int(tc.get("lisa_step_interval", 0) or 0):
            self.lisa = (int(tc["lisa_n_layers"]), int(tc["lisa_step_interval"]), int(tc.get("seed", 42)))
        self.lisa_log = []  # (1-based step, drawn layers)

    def lisa_switch(self):
        n, interval, seed = self.lisa
        if not lisa_draws_at(self.s, interval):
            return
        L = self.model.cfg["num_hidden_layers"]
        on = lisa_draw(seed, self.s, n, L)
        self.lisa_log.append((self.s + 1, on))
        for name, p in self.model.named_hf_parameters():
            if name.startswith("model.layers."):
                p.requires_grad_(int(name.split(".")[2]) in on)

    def step(self):
        """One optimizer step; returns (loss, lr, pre-clip grad norm)."""
        tc = self.tc
        if self.lisa:
            self.lisa_switch()
        self.opt.zero_grad(set_to_none=True)
        loss = accumulate_loss(self.model, self.loader, self.B * self.T * self.accum, self.accum)
        gn = grad_norm_clip(self.all_params, float(tc.get("max_grad_norm", 0.0) or 0.0))
        lr = self.base_lr * lr_factor(self.s, tc["lr_scheduler"], int(tc["warmup_steps"]),
                                      int(tc["max_steps"]))
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        self.s += 1
        return loss, lr, gn

    def weights(self):
        return {n: p.detach().to(torch.float64).numpy().copy()
                for n, p in self.model.named_hf_parameters()}

    def adapter_weights(self):
        return {n: p.detach().to(torch.float64).numpy().copy()
                for n, p in self.model.named_lora_parameters()}


def train_reference(cfg, weights, tokens, tc, dtype=torch.float64, lora=None):
    """Run max_steps steps; returns losses, lrs, grad_norms (per step) and final weights
    (and, with lora, the final adapters under "adapter")."""
    tr = RefTrainer(cfg, weights, tokens, tc, dtype=dtype, lora=lora)
    out = {"losses": [], "lrs": [], "grad_norms": []}
    for _ in range(int(tc["max_steps"])):
        loss, lr, gn = tr.step()
        out["losses"].append(loss)
        out["lrs"].append(lr)
        out["grad_norms"].append(gn)
    out["weights"] = tr.weights()
    out["lisa_log"] = tr.lisa_log
    if lora is not None:
        out["adapter"] = tr.adapter_weights()
    return out


def step_batches(tokens, B, T, accum, step):
    """The (x, y) micro-batches the sequential loader gives to 1-based optimizer step `step`."""
    dl = DataLoader(tokens, B, T)
    for _ in range((step - 1) * accum):
        dl.next()
    return [dl.next() for _ in range(accum)]


@torch.no_grad()
def batch_loss(cfg, weights, batches, lora=None, dtype=torch.float64):
    """Mean token cross-entropy over a list of (x, y) micro-batches, as a step's loss."""
    model = RefLlama(cfg, weights, dtype=dtype, lora=lora)
    tot = n = 0
    for x, y in batches:
        logits = model(x)
        tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                               reduction="sum").item()
        n += y.numel()
    return tot / n
