#!/usr/bin/python3
"""QLoRA end to end: the --quantize tool, 4-bit checkpoints, training over an NF4 base against
the float64 PyTorch reference, layer streaming, memory accounting and bad inputs.

    /usr/bin/python3 test/test_qlora.py --bin build/train_llama [-v] [--only NAME] [--keep]

Checks (each prints PASS/FAIL; the last line is "N passed, M failed"; exit 1 on any failure):
  quantize_f32 / quantize_bf16
        `train_llama --quantize IN OUT` on a small HF model (odd sizes, partial last blocks,
        more than 256 blocks so double quantization has 2 nested blocks, an all-zero block,
        outliers): every decoder linear weight's bitsandbytes tensors (packed U8, absmax U8,
        quant_map, nested_absmax, nested_quant_map, quant_state JSON) are byte-identical to
        test/nf4_ref.py's quantization of the same float weights (names, dtypes, shapes, bytes;
        the JSON's dtype follows the input: float32 / bfloat16); embeddings, norms and lm_head
        stay float with equal values; nothing else is written; metadata format pt.
  quantize_config
        OUT/config.json keeps the model config and adds quantization_config (quant_method
        bitsandbytes, load_in_4bit true, bnb_4bit_quant_type nf4, bnb_4bit_use_double_quant).
  roundtrip_quantize_tool
        QLoRA from the float base (quantized at load) and from the --quantize output: bit-identical
        losses, grad norms and adapter files (and different from a plain LoRA run).
  roundtrip_python_bnb_file
        a bitsandbytes-layout model written here (nf4_ref + this file's safetensors writer, with
        the names, tensor order and config transformers uses) trains bit-identically too.
  torch_reference
        QLoRA vs llama_ref.py over a base dequantized by nf4_ref (float64): per-step loss (1e-5
        rel), grad norm (1e-4), final adapter (1e-4); all seven targets, GQA, dropout 0, a PEFT
        start adapter with nonzero B. The float base gives a clearly different loss.
  shakespeare_trains
        QLoRA over a random base (model: block) on tinyshakespeare byte shards: the first loss
        minus the mean of the last 5 of 40 steps is > 0.3.
  offload_lora / offload_qlora
        layer_offloading vs resident weights, bit-identical losses and adapter files, in every
        combination of gradient_checkpointing false/true/true every 2/selective x
        activation_offloading false/true/legacy/disk/hidden_states, and tiled_mlp.
  modes_agree_qlora
        the same QLoRA runs: every activation mode gives the plain run's losses (bit-identical;
        tiled MLP within 1e-6).
  memory_lora_stream / memory_qlora_stream / memory_qlora_vs_lora
        device_peak_bytes with layer_offloading drops by (frozen layer weights) - 2 x (one
        layer's), host_peak_bytes rises by the frozen layer weights (within 4 KiB); QLoRA's
        resident device peak is below LoRA's by the float linear weights - their NF4 regions -
        one dequantized layer. Expected numbers come from the model shape and the region
        layout documented in llmc/nf4.h (48-byte header, 16-byte aligned arrays).
  memory_exact
        the same five numbers to the byte.
  bad_*  refused with exit 1 and one 'error:' line naming the key or the tensor: qlora without
        load_in_4bit, load_in_4bit without an adapter, a 4-bit checkpoint with blocksize 128
        (large and small tensors), without double quantization, fp4, and a 4-bit checkpoint
        given to a plain LoRA run.
"""
import argparse
import concurrent.futures
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nf4_ref as Q  # noqa: E402
import llama_ref as R  # noqa: E402  (imports torch)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ALL = list(R.LORA_TARGETS)
LOSS_RTOL = 1e-5
GN_RTOL = 1e-4
W_TOL = 1e-4
MEM_TOL = 4096
CRASH_MARKERS = ("AddressSanitizer", "runtime error", "Segmentation fault", "core dumped",
                 "Aborted", "double free", "free(): ", "malloc(): ")

ARGS = None
TMP = None
n_pass = n_fail = 0


def report(name, errs, summary=""):
    global n_pass, n_fail
    if errs:
        n_fail += 1
        print("FAIL %s: %s" % (name, "; ".join(errs[:6]) + (" (+%d more)" % (len(errs) - 6) if len(errs) > 6 else "")))
        if summary:
            print("     " + summary)
    else:
        n_pass += 1
        print("PASS %s" % name + ("  (%s)" % summary if ARGS.verbose and summary else ""))
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------------
# files


def st_raw(path):
    """{name: (dtype, shape, bytes)}, the tensor names in file order, and the metadata."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    hdr = json.loads(data[8:8 + n].decode("utf-8"))
    meta = hdr.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for k, v in hdr.items():
        b, e = v["data_offsets"]
        out[k] = (v["dtype"], list(v["shape"]), data[base + b:base + e])
    order = sorted(hdr, key=lambda k: hdr[k]["data_offsets"][0])
    return out, order, meta


def as_f32(dt, raw):
    if dt == "F32":
        return np.frombuffer(raw, "<f4")
    if dt == "BF16":
        return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    raise ValueError("dtype %s" % dt)


# The safetensors library's Dtype order (its enum); save_file sorts tensors by dtype, larger
# first, then by name, and writes __metadata__ first in the header.
_ST_ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
             "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"]


def write_st(path, tensors, metadata=None):
    """tensors: {name: (dtype, shape, raw bytes)}, written the way safetensors' save_file does."""
    names = sorted(tensors, key=lambda k: (-_ST_ORDER.index(tensors[k][0]), k))
    header, off, blobs = {}, 0, []
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    for k in names:
        dt, shape, raw = tensors[k]
        header[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def f32_entry(a):
    a = np.ascontiguousarray(a, dtype=np.float32)
    return ("F32", list(a.shape), a.astype("<f4").tobytes())


def bf16_round(a):
    """float32 values made exactly representable in bfloat16 (truncation)."""
    return (np.ascontiguousarray(a, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)


def bf16_entry(a):
    a = bf16_round(a)
    return ("BF16", list(a.shape), (a.view(np.uint32) >> 16).astype("<u2").tobytes())


LINEAR_RE = re.compile(r"model\.layers\.\d+\.(self_attn|mlp)\.(q|k|v|o|gate|up|down)_proj\.weight")


def is_linear(name):
    return LINEAR_RE.fullmatch(name) is not None


BNB_CONFIG = {  # what transformers' BitsAndBytesConfig.to_dict() writes for NF4 + double quant
    "_load_in_4bit": True, "_load_in_8bit": False, "bnb_4bit_compute_dtype": "bfloat16",
    "bnb_4bit_quant_storage": "uint8", "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": True, "llm_int8_enable_fp32_cpu_offload": False,
    "llm_int8_has_fp16_weight": False, "llm_int8_skip_modules": None, "llm_int8_threshold": 6.0,
    "load_in_4bit": True, "load_in_8bit": False, "quant_method": "bitsandbytes"}


def write_bnb_dir(path, cfg, weights, json_dtype="bfloat16", special=None):
    """An HF dir as transformers saves a load_in_4bit model: linear weights in bitsandbytes'
    Linear4bit state-dict layout (nf4_ref), the rest F32. special: {weight name: dict of
    quantize() arguments / 'fp4': True} for malformed variants."""
    os.makedirs(path, exist_ok=True)
    tensors = {}
    for k, w in weights.items():
        if not is_linear(k):
            tensors[k] = f32_entry(w)
            continue
        opts = dict((special or {}).get(k, {}))
        fp4 = opts.pop("fp4", False)
        sd = Q.state_dict(k, Q.quantize(w, **opts), json_dtype)
        if fp4:
            js = k + ".quant_state.bitsandbytes__nf4"
            dt, shape, raw = sd.pop(js)
            raw = raw.replace(b'"quant_type": "nf4"', b'"quant_type": "fp4"')
            sd[k + ".quant_state.bitsandbytes__fp4"] = (dt, [len(raw)], raw)
        tensors.update(sd)
    write_st(os.path.join(path, "model.safetensors"), tensors, {"format": "pt"})
    c = dict(cfg)
    c["quantization_config"] = dict(BNB_CONFIG)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(c, f, indent=2)


def dequantized_base(weights):
    """The base the trainer computes with: every linear weight through NF4 and back (fp32)."""
    return {k: (Q.dequantize(Q.quantize(w)) if is_linear(k) else w) for k, w in weights.items()}


def setup_model(work, cfg, seed, n_tokens=1200, tweak=None, std=0.05):
    os.makedirs(work, exist_ok=True)
    weights = R.init_weights(cfg, seed=seed, qk_std=0.25, std=std)
    if tweak:
        tweak(weights)
    model_dir = os.path.join(work, "model")
    R.save_hf_dir(model_dir, cfg, weights)
    shard = os.path.join(work, "train.bin")
    R.write_shard(shard, R.random_tokens(n_tokens, cfg["vocab_size"], seed=seed), version=1)
    return model_dir, shard, weights


# ---------------------------------------------------------------------------------------------
# running the trainer


def yaml_text(d):
    lines = []
    for k, v in d.items():
        if isinstance(v, dict):
            lines.append("%s:" % k)
            lines += ["  %s: %s" % (k2, R._yaml_scalar(v2)) for k2, v2 in v.items()]
        elif isinstance(v, (list, tuple)):
            lines.append("%s: [%s]" % (k, ", ".join(str(x) for x in v)))
        else:
            lines.append("%s: %s" % (k, R._yaml_scalar(v)))
    return "\n".join(lines) + "\n"


class Run:
    def steps(self):
        return [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in self.metrics]

    def adapter(self):
        p = os.path.join(self.out, "adapter_model.safetensors")
        return open(p, "rb").read() if os.path.exists(p) else None

    def peak(self, key):
        v = [int(r[key]) for r in self.metrics if key in r]
        return max(v) if v else -1

    def why(self):
        return "rc %s; stderr: %s; stdout tail: %s" % (
            self.rc, self.err.strip()[-500:], " | ".join(self.stdout.splitlines()[-3:]))


def run_trainer(name, tc, check=True):
    """Writes TMP/name.yaml (output_dir TMP/name unless tc has one), runs the trainer."""
    tc = dict(tc)
    tc.setdefault("output_dir", os.path.join(TMP, "runs", name))
    path = os.path.join(TMP, "runs", name + ".yaml")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(yaml_text(tc))
    p = subprocess.run([ARGS.bin, "-c", path], cwd=TMP, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=ARGS.timeout)
    r = Run()
    r.name, r.out, r.rc = name, tc["output_dir"], p.returncode
    r.stdout = p.stdout.decode("utf-8", "replace")
    r.err = p.stderr.decode("utf-8", "replace")
    mp = os.path.join(r.out, "metrics.jsonl")
    r.metrics = R.read_metrics(mp) if os.path.exists(mp) else []
    if check and (r.rc != 0 or not r.metrics):
        raise RuntimeError("%s: %s" % (name, r.why()))
    return r


def run_many(jobs, check=True):
    """jobs: {name: tc}; runs them ARGS.jobs at a time; returns {name: Run}."""
    with concurrent.futures.ThreadPoolExecutor(ARGS.jobs) as ex:
        futs = {k: ex.submit(run_trainer, k, tc, check) for k, tc in jobs.items()}
        return {k: f.result() for k, f in futs.items()}


def base_tc(**kw):
    tc = R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=2,
                        max_steps=3, learning_rate=5e-3, lr_scheduler="cosine", warmup_steps=1,
                        weight_decay=0.1, max_grad_norm=1.0, num_threads=1)
    tc.update(kw)
    return tc


def qlora_keys(r=4, alpha=8, adapter="qlora", **kw):
    d = {"adapter": adapter, "lora_r": r, "lora_alpha": alpha, "lora_dropout": 0.0,
         "lora_target_linear": True}
    if adapter == "qlora":
        d["load_in_4bit"] = True
    d.update(kw)
    return d


def same_runs(a, b, what, errs):
    """Bit-identical: every step's loss, grad norm and lr, and the adapter file."""
    if a.steps() != b.steps():
        diff = [(x, y) for x, y in zip(a.steps(), b.steps()) if x != y][:1]
        errs.append("%s: metrics differ (%d vs %d steps; first difference %s)"
                    % (what, len(a.steps()), len(b.steps()), diff))
    fa, fb = a.adapter(), b.adapter()
    if fa is None or fb is None:
        errs.append("%s: adapter_model.safetensors missing" % what)
    elif fa != fb:
        errs.append("%s: adapter_model.safetensors differs" % what)


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


# ---------------------------------------------------------------------------------------------
# 1. the --quantize tool


def odd_config():
    """Odd element counts (a half-filled last byte), partial last blocks, > 256 blocks."""
    return R.make_config(vocab_size=64, hidden_size=33, intermediate_size=515, num_hidden_layers=2,
                         num_attention_heads=3, num_key_value_heads=1, head_dim=10)


def odd_tweak(w):
    q = w["model.layers.0.self_attn.q_proj.weight"].reshape(-1)
    q[64:128] = 0.0                                   # an all-zero block
    d = w["model.layers.1.mlp.down_proj.weight"].reshape(-1)
    d[::997] *= 40.0                                   # outliers
    d[-35:] = 0.0                                      # a zero tail in the short last block


_ODD = {}


def odd_model():
    """The odd-shaped model (float dir, shard, weights, --quantize output dir), made once."""
    if not _ODD:
        work = os.path.join(TMP, "odd")
        model_dir, shard, weights = setup_model(work, odd_config(), seed=21, tweak=odd_tweak)
        qdir = os.path.join(work, "quantized")
        p = subprocess.run([ARGS.bin, "--quantize", model_dir, qdir], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=ARGS.timeout)
        _ODD.update(work=work, model=model_dir, shard=shard, weights=weights, qdir=qdir, proc=p)
    return _ODD


def compare_quantized(qfile, weights, json_dtype, errs):
    got, order, meta = st_raw(qfile)
    want = {}
    for k, w in weights.items():
        if is_linear(k):
            want.update(Q.state_dict(k, Q.quantize(w, blocksize=64, nested=True), json_dtype))
    n_lin = sum(is_linear(k) for k in weights)
    plain = [k for k in weights if not is_linear(k)]
    extra = sorted(set(got) - set(want) - set(plain))
    missing = sorted((set(want) | set(plain)) - set(got))
    if extra or missing:
        errs.append("tensor names: missing %s, extra %s" % (missing[:4], extra[:4]))
    if (meta or {}).get("format") != "pt":
        errs.append("__metadata__ %r lacks format: pt" % (meta,))
    nbad = 0
    for k, (dt, shape, raw) in sorted(want.items()):
        if k not in got:
            continue
        gdt, gshape, graw = got[k]
        why = ""
        if (gdt, gshape) != (dt, shape):
            why = "%s %s, expected %s %s" % (gdt, gshape, dt, shape)
        elif graw != raw:
            i = next((i for i in range(min(len(raw), len(graw))) if raw[i] != graw[i]), min(len(raw), len(graw)))
            why = "bytes differ at %d of %d" % (i, len(raw))
            if k.endswith("bitsandbytes__nf4"):
                why += " (%r vs reference %r)" % (graw, raw)
        if why:
            nbad += 1
            if nbad <= 4:
                errs.append("%s: %s" % (k, why))
    if nbad > 4:
        errs.append("%d tensors differ in all" % nbad)
    for k in plain:
        if k not in got:
            continue
        gdt, gshape, graw = got[k]
        if gdt not in ("F32", "BF16") or gshape != list(weights[k].shape):
            errs.append("%s: %s %s, expected float %s" % (k, gdt, gshape, list(weights[k].shape)))
        elif not np.array_equal(as_f32(gdt, graw).view(np.uint32),
                                np.ascontiguousarray(weights[k], np.float32).reshape(-1).view(np.uint32)):
            errs.append("%s: values changed" % k)
    return n_lin, len(got)


def check_quantize_f32():
    m = odd_model()
    errs = []
    if m["proc"].returncode != 0:
        return ["--quantize exited %d: %s" % (m["proc"].returncode, m["proc"].stderr.decode()[-400:])], ""
    n_lin, n = compare_quantized(os.path.join(m["qdir"], "model.safetensors"), m["weights"], "float32", errs)
    return errs, "%d linear weights, %d tensors" % (n_lin, n)


def check_quantize_bf16():
    work = os.path.join(TMP, "bf16")
    cfg = odd_config()
    weights = {k: bf16_round(v) for k, v in R.init_weights(cfg, seed=23, qk_std=0.25).items()}
    src = os.path.join(work, "model")
    os.makedirs(src, exist_ok=True)
    with open(os.path.join(src, "config.json"), "w") as f:
        json.dump(dict(cfg, torch_dtype="bfloat16"), f)
    write_st(os.path.join(src, "model.safetensors"), {k: bf16_entry(v) for k, v in weights.items()},
             {"format": "pt"})
    out = os.path.join(work, "quantized")
    p = subprocess.run([ARGS.bin, "--quantize", src, out], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=ARGS.timeout)
    if p.returncode != 0:
        return ["--quantize exited %d: %s" % (p.returncode, p.stderr.decode()[-400:])], ""
    errs = []
    n_lin, n = compare_quantized(os.path.join(out, "model.safetensors"), weights, "bfloat16", errs)
    return errs, "%d linear weights, %d tensors" % (n_lin, n)


def check_quantize_config():
    m = odd_model()
    if m["proc"].returncode != 0:
        return ["--quantize failed"], ""
    with open(os.path.join(m["qdir"], "config.json")) as f:
        c = json.load(f)
    errs = []
    qc = c.get("quantization_config")
    if not isinstance(qc, dict):
        return ["config.json has no quantization_config object: %s" % sorted(c)], ""
    for k, v in (("quant_method", "bitsandbytes"), ("load_in_4bit", True),
                 ("bnb_4bit_quant_type", "nf4"), ("bnb_4bit_use_double_quant", True)):
        if qc.get(k) != v or type(qc.get(k)) is not type(v):
            errs.append("quantization_config.%s is %r, expected %r" % (k, qc.get(k), v))
    if qc.get("load_in_8bit", False) is not False:
        errs.append("quantization_config.load_in_8bit is %r" % qc.get("load_in_8bit"))
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings",
              "model_type", "rms_norm_eps", "rope_theta"):
        if c.get(k) != odd_config()[k]:
            errs.append("config.json %s is %r, the input's %r" % (k, c.get(k), odd_config()[k]))
    return errs, json.dumps(qc, sort_keys=True)


# ---------------------------------------------------------------------------------------------
# 2. round trips


def odd_train_tc(name, base, **kw):
    m = odd_model()
    tc = base_tc(max_steps=4, base_model=base, train_data=m["shard"],
                 output_dir=os.path.join(TMP, "runs", name))
    tc.update(qlora_keys(r=4, alpha=8, lora_model_dir=odd_adapter()))
    tc.update(kw)
    return tc


def odd_adapter():
    m = odd_model()
    d = os.path.join(m["work"], "adapter_in")
    if not os.path.exists(d):
        R.save_adapter_dir(d, R.lora_spec(odd_config(), r=4, alpha=8, targets=ALL, seed=21, b_std=0.1))
    return d


_RT = {}


def roundtrip_runs():
    if not _RT:
        m = odd_model()
        bnb = os.path.join(m["work"], "bnb")
        write_bnb_dir(bnb, odd_config(), m["weights"], json_dtype="bfloat16")
        jobs = {"rt_float": odd_train_tc("rt_float", m["model"]),
                "rt_quantized": odd_train_tc("rt_quantized", m["qdir"]),
                "rt_bnb": odd_train_tc("rt_bnb", bnb),
                "rt_lora": odd_train_tc("rt_lora", m["model"], adapter="lora", load_in_4bit=False)}
        _RT.update(run_many(jobs))
    return _RT


def check_roundtrip_tool():
    r = roundtrip_runs()
    errs = []
    same_runs(r["rt_float"], r["rt_quantized"], "float base vs --quantize output", errs)
    a, b = r["rt_float"].steps(), r["rt_lora"].steps()
    if a and b and a[0][1] == b[0][1]:
        errs.append("test setup: the QLoRA run's first loss equals the float LoRA run's (%r): "
                    "was the base quantized at all?" % a[0][1])
    return errs, "losses %s" % [s[1] for s in a]


def check_roundtrip_bnb():
    r = roundtrip_runs()
    errs = []
    same_runs(r["rt_float"], r["rt_bnb"], "float base vs bitsandbytes file", errs)
    return errs, ""


# ---------------------------------------------------------------------------------------------
# 3. the PyTorch reference


def check_torch_reference():
    work = os.path.join(TMP, "torch_ref")
    cfg = R.make_config(vocab_size=64, hidden_size=40, intermediate_size=72, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    # std 0.1: NF4's error moves the loss by ~3e-3 relative, far past the tolerance
    model_dir, shard, weights = setup_model(work, cfg, seed=31, std=0.1)
    spec = R.lora_spec(cfg, r=4, alpha=8, targets=ALL, seed=31, b_std=0.1)
    R.save_adapter_dir(os.path.join(work, "adapter_in"), spec)
    tc = base_tc(max_steps=5, base_model=model_dir, train_data=shard, max_grad_norm=0.65,
                 output_dir=os.path.join(TMP, "runs", "torch_ref"))
    tc.update(qlora_keys(r=4, alpha=8, lora_model_dir=os.path.join(work, "adapter_in")))
    fut = concurrent.futures.ThreadPoolExecutor(1).submit(run_trainer, "torch_ref", tc)
    deq = dequantized_base(weights)
    ref = R.train_reference(cfg, deq, R.read_shard(shard), tc, lora=spec)
    x1 = R.step_batches(R.read_shard(shard), 2, 16, 2, 1)
    l_float = R.batch_loss(cfg, weights, x1, lora=spec)
    run = fut.result()
    errs = []
    by = {r["step"]: r for r in run.metrics}
    if sorted(by) != [1, 2, 3, 4, 5]:
        errs.append("metrics steps %s" % sorted(by))
    worst = 0.0
    for s in sorted(by):
        e = rel(by[s]["loss"], ref["losses"][s - 1])
        worst = max(worst, e)
        if e > LOSS_RTOL:
            errs.append("step %d: loss %.9g vs reference %.9g (rel %.1e)" % (s, by[s]["loss"], ref["losses"][s - 1], e))
        if rel(by[s]["grad_norm"], ref["grad_norms"][s - 1]) > GN_RTOL:
            errs.append("step %d: grad_norm %.9g vs reference %.9g" % (s, by[s]["grad_norm"], ref["grad_norms"][s - 1]))
    got = R.load_adapter_dir(run.out)["weights"]
    if set(got) != set(ref["adapter"]):
        errs.append("adapter tensors differ: %s" % sorted(set(got) ^ set(ref["adapter"]))[:4])
    nbad = 0
    for k in ref["adapter"]:
        if k in got:
            d = float(np.max(np.abs(np.asarray(got[k], np.float64) - ref["adapter"][k])))
            if d > W_TOL * max(1.0, float(np.max(np.abs(ref["adapter"][k])))):
                nbad += 1
                if nbad <= 2:
                    errs.append("final adapter %s: max diff %.2e" % (k, d))
    moved = max(float(np.max(np.abs(ref["adapter"][k] - spec["weights"][k]))) for k in spec["weights"])
    if moved < 100 * W_TOL:
        errs.append("test setup: the adapters moved only %.1e" % moved)
    sep = rel(l_float, ref["losses"][0])
    if sep < 100 * LOSS_RTOL:
        errs.append("test setup: the float base's loss %.9g is within %.1e of the NF4 base's" % (l_float, sep))
    clipped = sum(g > tc["max_grad_norm"] for g in ref["grad_norms"])
    return errs, ("worst loss rel %.1e, float-vs-NF4 base loss rel %.1e, adapters moved %.1e, "
                  "clipped %d/5" % (worst, sep, moved, clipped))


# ---------------------------------------------------------------------------------------------
# 4. tinyshakespeare


def check_shakespeare():
    data = os.path.join(TMP, "shakespeare")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "prepare_text.py"), "--name",
                        "tinyshakespeare", "--out", data], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=300)
    if p.returncode != 0 or not os.path.exists(os.path.join(data, "train.bin")):
        return ["prepare_text.py failed: %s" % p.stderr.strip()[-300:]], ""
    # A frozen random head (std 0.02) bounds the logits by about 0.02 * hidden_size, so a
    # 64-wide model cannot get far below ln 256 whatever the adapters do: use 128.
    tc = {"model": {"vocab_size": 256, "hidden_size": 128, "intermediate_size": 256,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                    "max_position_embeddings": 128},
          "train_data": os.path.join(data, "train.bin"), "sequence_len": 64, "micro_batch_size": 8,
          "max_steps": 40, "learning_rate": 1e-2, "lr_scheduler": "constant", "warmup_steps": 0,
          "weight_decay": 0.0, "num_threads": ARGS.jobs, "seed": 42,
          "output_dir": os.path.join(TMP, "runs", "shakespeare")}
    tc.update(qlora_keys(r=8, alpha=16))
    r = run_trainer("shakespeare", tc)
    losses = [m["loss"] for m in r.metrics]
    errs = []
    if len(losses) != 40 or not all(math.isfinite(x) for x in losses):
        return ["%d steps, losses %s" % (len(losses), losses[:5])], ""
    drop = losses[0] - sum(losses[-5:]) / 5
    if not drop > 0.3:
        errs.append("loss fell only %.3f (first %.4f, mean of last 5 %.4f)" % (drop, losses[0], sum(losses[-5:]) / 5))
    if abs(losses[0] - math.log(256)) > 0.2:
        errs.append("first loss %.4f is not near ln 256 for a random base" % losses[0])
    return errs, "first %.4f, last-5 mean %.4f, drop %.3f" % (losses[0], sum(losses[-5:]) / 5, drop)


# ---------------------------------------------------------------------------------------------
# 5. layer_offloading equivalence


GC_MODES = [("nockpt", {"gradient_checkpointing": "false"}),
            ("ckpt", {"gradient_checkpointing": "true"}),
            ("ckpt2", {"gradient_checkpointing": "true", "gradient_checkpointing_every": 2}),
            ("selective", {"gradient_checkpointing": "selective"})]
AO_MODES = ["false", "true", "legacy", "disk", "hidden_states"]


def activation_modes():
    modes = {}
    for g, gk in GC_MODES:
        for a in AO_MODES:
            modes["%s_%s" % (g, a)] = dict(gk, activation_offloading=a)
    modes["tiled"] = {"tiled_mlp": True, "tiled_mlp_shards": 3}
    modes["tiled_ckpt2_true"] = {"tiled_mlp": True, "tiled_mlp_shards": 3, "gradient_checkpointing": "true",
                                 "gradient_checkpointing_every": 2, "activation_offloading": "true"}
    modes["tiled_selective_hidden"] = {"tiled_mlp": True, "gradient_checkpointing": "selective",
                                       "activation_offloading": "hidden_states"}
    return modes


_OFF = {}


def offload_runs():
    if not _OFF:
        work = os.path.join(TMP, "offload")
        cfg = R.make_config(vocab_size=64, hidden_size=32, intermediate_size=72, num_hidden_layers=3,
                            num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
        model_dir, shard, _ = setup_model(work, cfg, seed=41)
        spec = R.lora_spec(cfg, r=4, alpha=8, targets=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
                           seed=41, b_std=0.1)
        R.save_adapter_dir(os.path.join(work, "adapter_in"), spec)
        disk = os.path.join(work, "disk")
        os.makedirs(disk, exist_ok=True)
        jobs = {}
        for adapter in ("lora", "qlora"):
            for mode, keys in activation_modes().items():
                for stream in (False, True):
                    name = "off_%s_%s_%s" % (adapter, mode, "stream" if stream else "resident")
                    tc = base_tc(base_model=model_dir, train_data=shard, min_offload_size=0,
                                 activation_offloading_dir=disk, output_dir=os.path.join(TMP, "runs", name))
                    tc.update(qlora_keys(r=4, alpha=8, adapter=adapter, lora_dropout=0.1,
                                         lora_target_linear=False,
                                         lora_target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
                                         lora_model_dir=os.path.join(work, "adapter_in")))
                    tc.update(keys)
                    tc["layer_offloading"] = stream
                    jobs[name] = tc
        _OFF.update(run_many(jobs))
    return _OFF


def check_offload(adapter):
    runs = offload_runs()
    errs = []
    for mode in activation_modes():
        a = runs["off_%s_%s_resident" % (adapter, mode)]
        b = runs["off_%s_%s_stream" % (adapter, mode)]
        same_runs(a, b, mode, errs)
        if b.peak("host_peak_bytes") <= a.peak("host_peak_bytes"):
            errs.append("%s: layer_offloading did not move weights to the host (host peak %d vs %d)"
                        % (mode, b.peak("host_peak_bytes"), a.peak("host_peak_bytes")))
    return errs, "%d modes" % len(activation_modes())


def check_modes_agree():
    runs = offload_runs()
    errs = []
    plain = runs["off_qlora_nockpt_false_resident"]
    for mode in activation_modes():
        r = runs["off_qlora_%s_resident" % mode]
        if mode.startswith("tiled"):
            ok = len(r.steps()) == len(plain.steps()) and all(
                rel(x[1], y[1]) <= 1e-6 for x, y in zip(r.steps(), plain.steps()))
            if not ok:
                errs.append("%s: losses %s vs plain %s" % (mode, [s[1] for s in r.steps()], [s[1] for s in plain.steps()]))
        elif r.steps() != plain.steps():
            errs.append("%s: losses %s vs plain %s" % (mode, [s[1] for s in r.steps()], [s[1] for s in plain.steps()]))
    if runs["off_qlora_nockpt_false_resident"].steps() == runs["off_lora_nockpt_false_resident"].steps():
        errs.append("test setup: QLoRA and LoRA give the same losses")
    return errs, ""


# ---------------------------------------------------------------------------------------------
# 6. memory


NF4_HEADER = 48  # llmc/nf4.h: Nf4RegionHeader, "48 bytes, so the arrays after it stay 16-byte aligned"


def a16(x):
    return (x + 15) // 16 * 16


def region_bytes(n, blocksize=64):
    """nf4_region_bytes(n, 64, nested=1): header, 8-bit map, nested absmax, codes, qabsmax."""
    nb = -(-n // blocksize)
    nn = -(-nb // 256)
    return NF4_HEADER + a16(256 * 4) + a16(nn * 4) + a16((n + 1) // 2) + a16(nb)


def mem_expectations(cfg):
    shapes = R.param_shapes(cfg)
    L = cfg["num_hidden_layers"]
    layer0 = {k: v for k, v in shapes.items() if k.startswith("model.layers.0.")}
    lin = [int(np.prod(s)) for k, s in layer0.items() if is_linear(k)]
    flt = [int(np.prod(s)) for k, s in layer0.items() if not is_linear(k)]  # norms, biases
    r64 = lambda x: (x + 63) // 64 * 64  # noqa: E731  (a streamed block's NF4 part starts 64-aligned)
    lora_block = r64(4 * (sum(lin) + sum(flt)))
    qregion = sum(region_bytes(n) for n in lin)
    q_block = r64(4 * sum(flt)) + qregion
    return {
        "lora_dev_drop": L * 4 * (sum(lin) + sum(flt)) - 2 * lora_block,
        "lora_host_rise": L * lora_block,
        "qlora_dev_drop": L * (qregion + 4 * sum(flt)) - 2 * q_block,
        "qlora_host_rise": L * q_block,
        "lora_minus_qlora": L * 4 * sum(lin) - L * qregion - 4 * sum(lin),
    }


_MEM = {}


def memory_runs():
    if not _MEM:
        work = os.path.join(TMP, "memory")
        cfg = R.make_config(vocab_size=64, hidden_size=64, intermediate_size=200, num_hidden_layers=4,
                            num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
        model_dir, shard, _ = setup_model(work, cfg, seed=51, n_tokens=2000)
        jobs = {}
        for adapter in ("lora", "qlora"):
            for stream in (False, True):
                name = "mem_%s_%s" % (adapter, "stream" if stream else "resident")
                tc = base_tc(max_steps=2, base_model=model_dir, train_data=shard, layer_offloading=stream,
                             output_dir=os.path.join(TMP, "runs", name))
                tc.update(qlora_keys(r=4, alpha=8, adapter=adapter))
                jobs[name] = tc
        _MEM.update(run_many(jobs))
        _MEM["expect"] = mem_expectations(cfg)
        r = _MEM
        _MEM["got"] = {
            "lora_dev_drop": r["mem_lora_resident"].peak("device_peak_bytes") - r["mem_lora_stream"].peak("device_peak_bytes"),
            "lora_host_rise": r["mem_lora_stream"].peak("host_peak_bytes") - r["mem_lora_resident"].peak("host_peak_bytes"),
            "qlora_dev_drop": r["mem_qlora_resident"].peak("device_peak_bytes") - r["mem_qlora_stream"].peak("device_peak_bytes"),
            "qlora_host_rise": r["mem_qlora_stream"].peak("host_peak_bytes") - r["mem_qlora_resident"].peak("host_peak_bytes"),
            "lora_minus_qlora": r["mem_lora_resident"].peak("device_peak_bytes") - r["mem_qlora_resident"].peak("device_peak_bytes"),
        }
    return _MEM


def check_memory(keys, tol):
    m = memory_runs()
    errs, parts = [], []
    for k in keys:
        got, want = m["got"][k], m["expect"][k]
        parts.append("%s %d (expected %d, %+d)" % (k, got, want, got - want))
        if abs(got - want) > tol:
            errs.append("%s is %d bytes, expected %d (off by %+d)" % (k, got, want, got - want))
    for r in ("mem_lora_resident", "mem_qlora_resident", "mem_lora_stream", "mem_qlora_stream"):
        peaks = {x["device_peak_bytes"] for x in m[r].metrics}
        if len(peaks) != 1:
            errs.append("%s: device peak differs between steps: %s" % (r, sorted(peaks)))
    return errs, ", ".join(parts)


# ---------------------------------------------------------------------------------------------
# 7. bad inputs


def expect_error(r, patterns, errs):
    lines = [l for l in r.err.splitlines() if l.strip()]
    if r.rc != 1:
        errs.append("exit %d, expected 1" % r.rc)
    if len(lines) != 1 or not lines[0].startswith("error: "):
        errs.append("stderr should be one 'error: ' line, got %r" % lines[:3])
    elif not all(re.search(p, lines[0]) for p in patterns):
        errs.append("error line does not match %s: %r" % (patterns, lines[0]))
    if any(m in r.err + r.stdout for m in CRASH_MARKERS):
        errs.append("crashed: %s" % r.err[-300:])
    if re.search(r"^step +\d", r.stdout, re.M):
        errs.append("it trained")
    return lines[0] if lines else ""


def bad_small_model():
    """Every linear weight at most 1024 elements: 16 absmax blocks or fewer."""
    work = os.path.join(TMP, "bad_small")
    if not os.path.exists(work):
        cfg = R.make_config(vocab_size=64, hidden_size=16, intermediate_size=48, num_hidden_layers=2,
                            num_attention_heads=2)
        setup_model(work, cfg, seed=61, n_tokens=300)
    cfg = json.load(open(os.path.join(work, "model", "config.json")))
    w = R.read_safetensors(os.path.join(work, "model", "model.safetensors"))
    return work, cfg, w


def bad_run(name, base, extra):
    tc = base_tc(max_steps=1, base_model=base, train_data=os.path.join(os.path.dirname(base), "train.bin"))
    tc.update(extra)
    return run_trainer(name, tc, check=False)


def bad_cases():
    m = odd_model()
    small_work, small_cfg, small_w = bad_small_model()
    q = qlora_keys()
    cases = []

    def plain(name, extra, pats):
        cases.append((name, lambda: bad_run(name, m["model"], extra), pats))

    def bnb(name, work, cfg, weights, special, extra, pats):
        def f():
            d = os.path.join(work, name)
            write_bnb_dir(d, cfg, weights, special=special)
            shutil.copy(os.path.join(work, "train.bin"), os.path.join(TMP, name + ".bin"))
            tc = base_tc(max_steps=1, base_model=d, train_data=os.path.join(TMP, name + ".bin"))
            tc.update(extra)
            return run_trainer(name, tc, check=False)
        cases.append((name, f, pats))

    plain("bad_qlora_without_4bit", dict(q, load_in_4bit=False), [r"load_in_4bit", r"qlora"])
    plain("bad_4bit_without_adapter", {"load_in_4bit": True, "adapter": "none"}, [r"load_in_4bit", r"adapter"])
    big = "model.layers.1.mlp.down_proj.weight"             # 16995 elements
    bnb("bad_blocksize128_large", m["work"], odd_config(), m["weights"], {big: {"blocksize": 128}}, q,
        [re.escape(big), r"128"])
    small = "model.layers.1.self_attn.k_proj.weight"        # 256 elements
    bnb("bad_blocksize128_small", small_work, small_cfg, small_w, {small: {"blocksize": 128}}, q,
        [re.escape(small), r"128"])
    mid = "model.layers.0.self_attn.o_proj.weight"
    bnb("bad_not_double_quantized", m["work"], odd_config(), m["weights"], {mid: {"nested": False}}, q,
        [re.escape(mid)])
    bnb("bad_fp4", m["work"], odd_config(), m["weights"], {mid: {"fp4": True}}, q,
        [re.escape(mid), r"fp4"])
    lin0 = "model.layers.0.self_attn.q_proj.weight"
    cases.append(("bad_4bit_checkpoint_plain_lora",
                  lambda: bad_run("bad_4bit_checkpoint_plain_lora", m["qdir"],
                                  dict(q, adapter="lora", load_in_4bit=False)),
                  [re.escape(lin0)]))
    return cases


def check_bad(fn, pats):
    r = fn()
    errs = []
    line = expect_error(r, pats, errs)
    return errs, line


# ---------------------------------------------------------------------------------------------


def main():
    global ARGS, TMP
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/train_llama")
    ap.add_argument("--jobs", type=int, default=2, help="trainer runs at a time")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per trainer run")
    ap.add_argument("--only", default=None, help="run only checks whose name contains this")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("-v", "--verbose", action="store_true")
    ARGS = ap.parse_args()
    ARGS.bin = os.path.abspath(ARGS.bin)
    if not os.access(ARGS.bin, os.X_OK):
        print("FAIL setup: %s is not an executable (run make first)" % ARGS.bin)
        print("0 passed, 1 failed")
        return 1
    import torch
    torch.set_num_threads(1)
    TMP = tempfile.mkdtemp(prefix="test_qlora_")
    mem = ["lora_dev_drop", "lora_host_rise", "qlora_dev_drop", "qlora_host_rise", "lora_minus_qlora"]
    checks = [
        ("quantize_f32", check_quantize_f32),
        ("quantize_bf16", check_quantize_bf16),
        ("quantize_config", check_quantize_config),
        ("roundtrip_quantize_tool", check_roundtrip_tool),
        ("roundtrip_python_bnb_file", check_roundtrip_bnb),
        ("torch_reference", check_torch_reference),
        ("shakespeare_trains", check_shakespeare),
        ("offload_lora", lambda: check_offload("lora")),
        ("offload_qlora", lambda: check_offload("qlora")),
        ("modes_agree_qlora", check_modes_agree),
        ("memory_lora_stream", lambda: check_memory(mem[0:2], MEM_TOL)),
        ("memory_qlora_stream", lambda: check_memory(mem[2:4], MEM_TOL)),
        ("memory_qlora_vs_lora", lambda: check_memory(mem[4:5], MEM_TOL)),
        ("memory_exact", lambda: check_memory(mem, 0)),
    ]
    for name, fn, pats in bad_cases():
        checks.append((name, lambda fn=fn, pats=pats: check_bad(fn, pats)))
    t_all = time.time()
    try:
        for name, fn in checks:
            if ARGS.only and ARGS.only not in name:
                continue
            t0 = time.time()
            try:
                errs, summary = fn()
            except Exception as e:  # a crash of the trainer or unreadable output is a failure
                errs, summary = ["%s: %s" % (type(e).__name__, e)], ""
            report(name, errs, (summary + "; %.1fs" % (time.time() - t0)).lstrip("; "))
    finally:
        if ARGS.keep:
            print("kept %s" % TMP)
        else:
            shutil.rmtree(TMP, ignore_errors=True)
    print("(%.1fs)" % (time.time() - t_all))
    print("%d passed, %d failed" % (n_pass, n_fail))
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
