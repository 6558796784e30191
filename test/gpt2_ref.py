"""gpt2_ref.py: an independent float64 PyTorch reference for the C GPT-2 trainer (train_gpt).

GPT-2 as llm.c defines it: token embedding wte [Vp, C] (V padded up to a multiple of 128; rows
>= V are padding and never produce logits), learned position embedding wpe [maxT, C]; per layer
LayerNorm (eps 1e-5) -> fused qkv linear (weight [3C, C], out x in, + bias; rows 0..C-1 give q,
C..2C-1 k, 2C..3C-1 v) -> causal multi-head attention (scale 1/sqrt(C/NH)) -> projection [C, C]
+ bias -> residual; LayerNorm -> fc [4C, C] + bias -> GELU (tanh form) -> fc proj [C, 4C] +
bias -> residual; final LayerNorm; logits = x wte[:V]^T (tied head).

Training follows test/llama_ref.py (mean cross-entropy over all B*T*accum targets of a step,
AdamW with PyTorch semantics, HF LR schedules with linear warmup, global-norm clipping), with
weight decay on the 2-D tensors only: wte, wpe and the four matmul weights of every layer (not
biases, not LayerNorm parameters). Everything is float64 unless asked otherwise.

llm.c checkpoints (model.bin) are read and written by hand: a header of 256 int32 (magic
20240326, version 3 = fp32 or 5 = bf16 parameters, maxT, V, L, NH, C, Vp), then every
parameter tensor in llm.c's order, each covering all layers at once.

Main entry points:
    make_config(vocab_size, hidden_size, num_layers, num_heads, max_seq_len) -> cfg dict
    param_shapes(cfg)                  -> ordered {name: shape} (llm.c order and layout)
    init_weights(cfg, seed)            -> {name: float32 ndarray}, padded wte rows zero
    init_llmc(cfg, seed)               -> weights distributed as llm.c's GPT-2 init
    write_checkpoint(path, cfg, w, version=3) / read_checkpoint(path) -> (cfg, w, version)
    bf16_round(a)                      -> float32 array rounded to bf16 (round to nearest even)
    RefGPT2(cfg, weights)(idx)         -> logits [B, T, V]
    RefTrainer(cfg, weights, tokens, tc).step() -> (loss, lr, grad_norm)
    train_reference(cfg, weights, tokens, tc)   -> dict(losses, lrs, grad_norms, weights)
    batch_loss(cfg, weights, batches)  -> mean cross-entropy over (x, y) micro-batches
    step_batches(tokens, B, T, accum, step)     -> the micro-batches of 1-based step `step`
Shards, YAML, metrics and the LR schedule come from llama_ref (same conventions).
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as LR  # noqa: E402  (shards, YAML, metrics, lr schedule, data loader)

MODEL_MAGIC = 20240326
HEADER_INTS = 256
LN_EPS = 1e-5
VOCAB_MULTIPLE = 128

PARAM_NAMES = ("wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb")
# 2-D (matrix) tensors: the only ones with weight decay
DECAY_NAMES = frozenset(("wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"))

# re-exported helpers
write_shard = LR.write_shard
read_shard = LR.read_shard
random_tokens = LR.random_tokens
write_yaml = LR.write_yaml
read_metrics = LR.read_metrics
lr_factor = LR.lr_factor
DataLoader = LR.DataLoader


def padded_vocab(V, multiple=VOCAB_MULTIPLE):
    return ((V + multiple - 1) // multiple) * multiple


def make_config(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, max_seq_len=32,
                padded_vocab_size=None):
    if hidden_size % num_heads:
        raise ValueError("hidden_size must be a multiple of num_heads")
    return {"max_seq_len": int(max_seq_len), "vocab_size": int(vocab_size),
            "num_layers": int(num_layers), "num_heads": int(num_heads),
            "channels": int(hidden_size),
            "padded_vocab_size": int(padded_vocab_size or padded_vocab(vocab_size))}


def model_block(cfg):
    """The trainer's `model:` YAML block for a random-init model of this shape."""
    return {"vocab_size": cfg["vocab_size"], "hidden_size": cfg["channels"],
            "num_hidden_layers": cfg["num_layers"], "num_attention_heads": cfg["num_heads"],
            "max_position_embeddings": cfg["max_seq_len"]}


def param_shapes(cfg):
    """{name: shape} in llm.c's file order; per-layer tensors are stacked over layers."""
    Vp, C, L, maxT = cfg["padded_vocab_size"], cfg["channels"], cfg["num_layers"], cfg["max_seq_len"]
    return {
        "wte": (Vp, C), "wpe": (maxT, C),
        "ln1w": (L, C), "ln1b": (L, C),
        "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C),
        "attprojw": (L, C, C), "attprojb": (L, C),
        "ln2w": (L, C), "ln2b": (L, C),
        "fcw": (L, 4 * C, C), "fcb": (L, 4 * C),
        "fcprojw": (L, C, 4 * C), "fcprojb": (L, C),
        "lnfw": (C,), "lnfb": (C,),
    }


def num_params(cfg):
    return sum(int(np.prod(s)) for s in param_shapes(cfg).values())


def init_weights(cfg, seed=0, std=0.05, wte_std=0.2, wpe_std=0.1, qk_std=0.25, fc_std=0.2,
                 bias_std=0.05, ln_jitter=0.1):
    """Seeded random float32 weights. LayerNorm weights are 1 + jitter and biases non-zero so
    that every parameter matters; q/k rows get qk_std so attention is far from uniform, fcw
    gets fc_std so the GELU inputs reach |x| ~ 3 (where the tanh form is far from erf). The
    padded rows of wte (>= V) are zero, as llm.c writes them."""
    rng = np.random.default_rng(seed)
    V, C = cfg["vocab_size"], cfg["channels"]
    w = {}
    for name, shape in param_shapes(cfg).items():
        if name == "wte":
            a = wte_std * rng.standard_normal(shape)
            a[V:] = 0.0
        elif name == "wpe":
            a = wpe_std * rng.standard_normal(shape)
        elif name in ("ln1w", "ln2w", "lnfw"):
            a = 1.0 + ln_jitter * rng.standard_normal(shape)
        elif name in ("ln1b", "ln2b", "lnfb") or name.endswith("b"):
            a = bias_std * rng.standard_normal(shape)
        elif name == "fcw":
            a = fc_std * rng.standard_normal(shape)
        elif name == "qkvw":
            a = std * rng.standard_normal(shape)
            a[:, :2 * C, :] = qk_std * rng.standard_normal((shape[0], 2 * C, C))
        else:
            a = std * rng.standard_normal(shape)
        w[name] = a.astype(np.float32)
    return w


def init_llmc(cfg, seed=42):
    """GPT-2's initialisation as llm.c does it (not its random stream): LayerNorm weights 1,
    biases 0, wte (real rows), wpe and matmul weights ~ N(0, 0.02), the projections back into
    the residual stream (attprojw, fcprojw) ~ N(0, 0.02 / sqrt(2 L)), padded wte rows 0."""
    rng = np.random.default_rng(seed)
    V, L = cfg["vocab_size"], cfg["num_layers"]
    w = {}
    for name, shape in param_shapes(cfg).items():
        if name in ("ln1w", "ln2w", "lnfw"):
            a = np.ones(shape)
        elif name in ("wte", "wpe", "qkvw", "fcw", "attprojw", "fcprojw"):
            std = 0.02 / math.sqrt(2 * L) if name in ("attprojw", "fcprojw") else 0.02
            a = std * rng.standard_normal(shape)
            if name == "wte":
                a[V:] = 0.0
        else:
            a = np.zeros(shape)
        w[name] = a.astype(np.float32)
    return w


# --------------------------------------------------------------------------------------------
# llm.c checkpoint files


def bf16_round(a):
    """float32 array rounded to the nearest bf16 (ties to even), returned as float32."""
    return bf16_decode(bf16_encode(a))


def bf16_encode(a):
    """uint16 bf16 bit patterns of a (torch's float32 -> bfloat16 conversion, as llm.c's
    write_model uses)."""
    t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(torch.bfloat16)
    return t.view(torch.int16).numpy().view(np.uint16).copy()


def bf16_decode(u):
    return (np.asarray(u, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def write_checkpoint(path, cfg, weights, version=3):
    """Write an llm.c model file: version 3 (fp32) or 5 (bf16) parameters."""
    if version not in (3, 5):
        raise ValueError(f"version {version}: only 3 (fp32) and 5 (bf16) are written")
    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[:8] = [MODEL_MAGIC, version, cfg["max_seq_len"], cfg["vocab_size"], cfg["num_layers"],
               cfg["num_heads"], cfg["channels"], cfg["padded_vocab_size"]]
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        for name, shape in param_shapes(cfg).items():
            a = np.asarray(weights[name], dtype=np.float32)
            if a.shape != tuple(shape):
                raise ValueError(f"{name}: shape {a.shape}, expected {shape}")
            if version == 3:
                f.write(a.astype("<f4").tobytes())
            else:
                f.write(bf16_encode(a).astype("<u2").tobytes())


def read_checkpoint(path):
    """Read an llm.c model file (version 3 or 5) -> (cfg, {name: float32 ndarray}, version)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < HEADER_INTS * 4:
        raise ValueError(f"{path}: {len(data)} bytes, shorter than the header")
    hdr = np.frombuffer(data[:HEADER_INTS * 4], dtype="<i4")
    if int(hdr[0]) != MODEL_MAGIC:
        raise ValueError(f"{path}: bad magic {int(hdr[0])}")
    version = int(hdr[1])
    if version not in (3, 5):
        raise ValueError(f"{path}: unsupported version {version}")
    cfg = {"max_seq_len": int(hdr[2]), "vocab_size": int(hdr[3]), "num_layers": int(hdr[4]),
           "num_heads": int(hdr[5]), "channels": int(hdr[6]), "padded_vocab_size": int(hdr[7])}
    if cfg["padded_vocab_size"] < cfg["vocab_size"]:
        raise ValueError(f"{path}: padded vocab {cfg['padded_vocab_size']} < vocab {cfg['vocab_size']}")
    esize = 4 if version == 3 else 2
    want = HEADER_INTS * 4 + esize * num_params(cfg)
    if len(data) != want:
        raise ValueError(f"{path}: {len(data)} bytes, expected {want} for header {hdr[:8].tolist()}")
    off = HEADER_INTS * 4
    w = {}
    for name, shape in param_shapes(cfg).items():
        n = int(np.prod(shape))
        raw = data[off:off + n * esize]
        off += n * esize
        if version == 3:
            a = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        else:
            a = bf16_decode(np.frombuffer(raw, dtype="<u2"))
        w[name] = a.reshape(shape).copy()
    return cfg, w, version


# --------------------------------------------------------------------------------------------
# model


def hf_tensors(cfg, w, prefix="transformer."):
    """GPT2LMHeadModel's state dict (numpy) for llm.c-layout weights w: Conv1D weights are
    stored in x out (transposed), c_attn fuses q, k, v along its output, wte has V rows."""
    V, L = cfg["vocab_size"], cfg["num_layers"]
    t = {prefix + "wte.weight": w["wte"][:V], prefix + "wpe.weight": w["wpe"],
         prefix + "ln_f.weight": w["lnfw"], prefix + "ln_f.bias": w["lnfb"]}
    for l in range(L):
        h = "%sh.%d." % (prefix, l)
        t[h + "ln_1.weight"], t[h + "ln_1.bias"] = w["ln1w"][l], w["ln1b"][l]
        t[h + "ln_2.weight"], t[h + "ln_2.bias"] = w["ln2w"][l], w["ln2b"][l]
        t[h + "attn.c_attn.weight"], t[h + "attn.c_attn.bias"] = w["qkvw"][l].T, w["qkvb"][l]
        t[h + "attn.c_proj.weight"], t[h + "attn.c_proj.bias"] = w["attprojw"][l].T, w["attprojb"][l]
        t[h + "mlp.c_fc.weight"], t[h + "mlp.c_fc.bias"] = w["fcw"][l].T, w["fcb"][l]
        t[h + "mlp.c_proj.weight"], t[h + "mlp.c_proj.bias"] = w["fcprojw"][l].T, w["fcprojb"][l]
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in t.items()}


def save_hf_dir(d, cfg, w, prefix="transformer.", **extra):
    """A Hugging Face GPT-2 directory (config.json + model.safetensors, as GPT2LMHeadModel
    saves it, with the attn.bias mask buffer older transformers wrote) for weights w."""
    os.makedirs(d, exist_ok=True)
    t = hf_tensors(cfg, w, prefix)
    for l in range(cfg["num_layers"]):
        T = cfg["max_seq_len"]
        t["%sh.%d.attn.bias" % (prefix, l)] = np.tril(np.ones((1, 1, T, T), dtype=np.float32))  # a buffer
    LR.write_safetensors(os.path.join(d, "model.safetensors"), t)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], vocab_size=cfg["vocab_size"],
                       n_positions=cfg["max_seq_len"], n_embd=cfg["channels"], n_layer=cfg["num_layers"],
                       n_head=cfg["num_heads"], n_inner=None, activation_function="gelu_new",
                       layer_norm_epsilon=1e-5, **extra), f)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def layernorm(x, w, b, eps=LN_EPS):
    mu = x.mean(-1, keepdim=True)
    xc = x - mu
    var = (xc * xc).mean(-1, keepdim=True)  # biased variance
    return xc * torch.rsqrt(var + eps) * w + b


class RefGPT2(torch.nn.Module):
    def __init__(self, cfg, weights, dtype=torch.float64):
        super().__init__()
        self.cfg = cfg
        self.V, self.C = cfg["vocab_size"], cfg["channels"]
        self.L, self.NH = cfg["num_layers"], cfg["num_heads"]
        self.maxT = cfg["max_seq_len"]
        self.dtype = dtype
        shapes = param_shapes(cfg)
        self.params = torch.nn.ParameterDict()
        for name, shape in shapes.items():
            a = np.asarray(weights[name], dtype=np.float64)
            if a.shape != tuple(shape):
                raise ValueError(f"{name}: shape {a.shape}, expected {shape}")
            self.params[name] = torch.nn.Parameter(torch.from_numpy(a.copy()).to(dtype))

    def forward(self, idx):
        B, T = idx.shape
        if T > self.maxT:
            raise ValueError(f"T {T} > max_seq_len {self.maxT}")
        if int(idx.max()) >= self.V or int(idx.min()) < 0:
            raise ValueError("token id out of range")
        P = self.params
        C, NH = self.C, self.NH
        hs = C // NH
        x = F.embedding(idx, P["wte"]) + P["wpe"][:T][None]
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for l in range(self.L):
            h = layernorm(x, P["ln1w"][l], P["ln1b"][l])
            qkv = F.linear(h, P["qkvw"][l], P["qkvb"][l])          # [B, T, 3C]
            q, k, v = qkv[..., :C], qkv[..., C:2 * C], qkv[..., 2 * C:]
            q = q.reshape(B, T, NH, hs).transpose(1, 2)
            k = k.reshape(B, T, NH, hs).transpose(1, 2)
            v = v.reshape(B, T, NH, hs).transpose(1, 2)
            att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hs))
            att = att.masked_fill(~mask, float("-inf"))
            y = torch.softmax(att, dim=-1) @ v                      # [B, NH, T, hs]
            y = y.transpose(1, 2).reshape(B, T, C)
            x = x + F.linear(y, P["attprojw"][l], P["attprojb"][l])
            h = layernorm(x, P["ln2w"][l], P["ln2b"][l])
            h = gelu_tanh(F.linear(h, P["fcw"][l], P["fcb"][l]))
            x = x + F.linear(h, P["fcprojw"][l], P["fcprojb"][l])
        x = layernorm(x, P["lnfw"], P["lnfb"])
        return F.linear(x, P["wte"][:self.V])                      # [B, T, V], real vocab only


# --------------------------------------------------------------------------------------------
# training


class RefTrainer:
    def __init__(self, cfg, weights, tokens, tc, dtype=torch.float64):
        self.tc = tc
        self.cfg = cfg
        self.model = RefGPT2(cfg, weights, dtype=dtype)
        self.B = int(tc["micro_batch_size"])
        self.T = int(tc["sequence_len"])
        self.accum = int(tc.get("gradient_accumulation_steps", 1))
        self.loader = DataLoader(tokens, self.B, self.T)
        P = self.model.params
        self.all_params = [P[n] for n in PARAM_NAMES]
        decay = [P[n] for n in PARAM_NAMES if n in DECAY_NAMES]
        nodecay = [P[n] for n in PARAM_NAMES if n not in DECAY_NAMES]
        self.base_lr = float(tc["learning_rate"])
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": float(tc.get("weight_decay", 0.0))},
             {"params": nodecay, "weight_decay": 0.0}],
            lr=self.base_lr, betas=(float(tc.get("adam_beta1", 0.9)),
                                    float(tc.get("adam_beta2", 0.999))),
            eps=float(tc.get("adam_epsilon", 1e-8)))
        self.s = 0

    def step(self):
        """One optimizer step; returns (loss, lr, pre-clip global grad norm)."""
        tc = self.tc
        self.opt.zero_grad(set_to_none=False)
        for p in self.all_params:  # every parameter has a (possibly zero) gradient
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        loss = LR.accumulate_loss(self.model, self.loader, self.B * self.T * self.accum, self.accum)
        gn = LR.grad_norm_clip(self.all_params, float(tc.get("max_grad_norm", 0.0) or 0.0))
        lr = self.base_lr * lr_factor(self.s, tc.get("lr_scheduler", "cosine"),
                                      int(tc.get("warmup_steps", 0)), int(tc["max_steps"]))
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.opt.step()
        self.s += 1
        return loss, lr, gn

    def weights(self):
        return {n: self.model.params[n].detach().to(torch.float64).numpy().copy()
                for n in PARAM_NAMES}


def train_reference(cfg, weights, tokens, tc, dtype=torch.float64):
    """max_steps optimizer steps; returns per-step losses, lrs, grad_norms and final weights
    (float64 ndarrays; with dtype float32 the arithmetic is float32)."""
    tr = RefTrainer(cfg, weights, tokens, tc, dtype=dtype)
    out = {"losses": [], "lrs": [], "grad_norms": []}
    for _ in range(int(tc["max_steps"])):
        loss, lr, gn = tr.step()
        out["losses"].append(loss)
        out["lrs"].append(lr)
        out["grad_norms"].append(gn)
    out["weights"] = tr.weights()
    return out


def step_batches(tokens, B, T, accum, step):
    """The (x, y) micro-batches the sequential loader gives to 1-based optimizer step `step`."""
    return LR.step_batches(tokens, B, T, accum, step)


@torch.no_grad()
def batch_loss(cfg, weights, batches, dtype=torch.float64):
    """Mean token cross-entropy over a list of (x, y) micro-batches, as a step's loss."""
    model = RefGPT2(cfg, weights, dtype=dtype)
    tot = n = 0
    for x, y in batches:
        logits = model(x)
        tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1),
                               reduction="sum").item()
        n += y.numel()
    return tot / n
