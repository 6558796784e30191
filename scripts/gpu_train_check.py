#!/usr/bin/env python3
"""Whole-model checks of the CUDA backend, run by scripts/gpu_check.sh (parts b, c, d, e).

  gpu_train_check.py train     --bin B --json J   (b) fp32 CUDA vs CPU, full, LoRA, a Gemma 3, 2 and 1
                                                      text model (HF directory written here): losses
                                                      of 5 AdamW steps within 1e-5 relative; one
                                                      step's gradient (a linear update: see
                                                      part_train) within 1e-4 per tensor,
                                                      median 2e-6; rl: dpo on the Gemma 1 base with
                                                      a word-level tokenizer: 2 steps' loss and grad
                                                      norm within 1e-5, and a reward model's
                                                      and a process reward model's the same
                                                      (needs transformers)
  gpu_train_check.py modes     --bin B --json J   (c) every memory mode (16, and layer streaming
                                                      with LoRA; QLoRA's 8 base modes and
                                                      streaming) bit-identical to the plain run;
                                                      device peak: counted, nvidia-smi, --plan;
                                                      offload_params bit-identical to ZeRO-3 +
                                                      offload_optimizer, 6 B a parameter less
  gpu_train_check.py sanitizer --bin B --json J   (d) compute-sanitizer memcheck + racecheck on a
                                                      short run of each base mode (+ synccheck plain)
  gpu_train_check.py nccl      --bin B --json J   (e) LLMC_FORCE_NCCL=1 (world 1) bit-identical to
                                                      the plain run; on 2+ GPUs a launcher-free run
                                                      of all of them
  gpu_train_check.py gpt       --bin G --json J   (h) train_gpt (G) on the GPU: fp32 against the
                                                      CPU (losses 1e-5, one step's gradient 1e-4 per
                                                      tensor), bf16 against fp32 CPU (losses 2e-2),
                                                      llm.c's -r 1 and -r 2 bit-identical to -r 0;
                                                      on a GPU also GPT-2 124M (d12) at T 1024: tok/s, MFU

Standard library only. Options: --tiny (a very small model: for the CPU emulator build, which
runs about 10^4 times slower than a GPU), --device cuda|... Prints PASS/FAIL lines and writes
{"part", "status", "checks": [{"name","ok","detail"}], "tables": {...}, "secs"} to --json.
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time
from array import array

CHECKS = []
TABLES = {}
TMP = None
BIN = None
ENV = dict(os.environ)


def check(name, ok, detail=""):
    CHECKS.append({"name": name, "ok": bool(ok), "detail": "" if ok else str(detail)[-3000:]})
    print(("PASS %s" % name) if ok else ("FAIL %s: %s" % (name, str(detail)[-1500:])), flush=True)


# ---- data, configs, runs ----------------------------------------------------------------------

def write_shard(path, n, vocab, seed=1):
    rng = random.Random(seed)
    toks = [rng.randrange(vocab) for _ in range(n)]
    hdr = [0] * 256
    hdr[:3] = [20240520, 1, n]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr) + array("H", toks).tobytes())


def model_cfg(size):
    if size == "tiny":   # emulator-sized
        return dict(model=dict(vocab_size=64, hidden_size=32, intermediate_size=96, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64),
                    sequence_len=32, micro_batch_size=1, gradient_accumulation_steps=2, max_steps=2)
    if size == "small":  # (b): the CPU reference must stay quick
        return dict(model=dict(vocab_size=1024, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                               num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256),
                    sequence_len=256, micro_batch_size=2, gradient_accumulation_steps=2, max_steps=5)
    # "medium" (c, d, e): activations dominate, a few seconds a run on a GPU
    return dict(model=dict(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                           num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024),
                sequence_len=1024, micro_batch_size=2, gradient_accumulation_steps=2, max_steps=3)


def base_cfg(size, out, sizes=model_cfg, **over):
    c = sizes(size)
    c.update({"train_data": os.path.join(TMP, "data_%d.bin" % c["model"]["vocab_size"]), "shuffle": "false",
              "learning_rate": "1e-3", "min_offload_size": 0, "output_dir": out, "seed": 1234})
    if not os.path.exists(c["train_data"]):
        write_shard(c["train_data"], 200000, c["model"]["vocab_size"])
    c.update(over)
    if "base_model" in c:  # a Hugging Face directory instead of the random-init model block
        del c["model"]
    return c


def gemma_base(size, gen=3):
    """A random Gemma 3 text model (Gemma3ForCausalLM; gen 2: Gemma2ForCausalLM, gen 1:
    GemmaForCausalLM) of the size's shape as a Hugging Face directory (float32 safetensors
    written here): (1 + w) norms, GeGLU, scaled embeddings; Gemma 2 and 3 with sandwich norms,
    sliding layers (pattern 2, half the sequence) and query_pre_attn_scalar 1.5 x head_dim (a
    score scale of its own); Gemma 3 with q/k norms and the sliding layers' own RoPE, Gemma 2
    with its attention scores and logits soft-capped (at caps small enough to bend this init's
    values: the generic attention kernels); Gemma 1 Llama's block with exact GELU (erf)."""
    c = model_cfg(size)
    m, T = c["model"], c["sequence_len"]
    d = os.path.join(TMP, "gemma%d_%s" % (gen, size))
    if os.path.exists(d):
        return d
    os.makedirs(d)
    C, I, L, Hq, Hkv, V = (m[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                          "num_attention_heads", "num_key_value_heads", "vocab_size"))
    D = C // Hq
    cfg = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "vocab_size": V, "hidden_size": C,
           "intermediate_size": I, "num_hidden_layers": L, "num_attention_heads": Hq, "num_key_value_heads": Hkv,
           "head_dim": D, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": D * 3 // 2,
           "sliding_window": T // 2, "sliding_window_pattern": 2, "rope_theta": 1000000.0,
           "rope_local_base_freq": 10000.0, "max_position_embeddings": m["max_position_embeddings"],
           "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "pad_token_id": 0, "torch_dtype": "float32"}
    if gen == 2:
        cfg.update(architectures=["Gemma2ForCausalLM"], model_type="gemma2", attn_logit_softcapping=1.0,
                   final_logit_softcapping=2.0)
        for k in ("sliding_window_pattern", "rope_local_base_freq"):
            del cfg[k]
    if gen == 1:
        cfg.update(architectures=["GemmaForCausalLM"], model_type="gemma", hidden_act="gelu", hidden_activation="gelu",
                   rope_theta=10000.0)
        for k in ("sliding_window_pattern", "rope_local_base_freq", "query_pre_attn_scalar", "sliding_window"):
            del cfg[k]
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    rng = random.Random(5)
    shapes = {"model.embed_tokens.weight": (V, C), "model.norm.weight": (C,)}
    for l in range(L):
        p = "model.layers.%d." % l
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
            if gen > 1 or n in ("input_layernorm", "post_attention_layernorm"):  # Gemma 1: no sandwich
                shapes[p + n + ".weight"] = (C,)
        shapes.update({p + "self_attn.q_proj.weight": (Hq * D, C), p + "self_attn.k_proj.weight": (Hkv * D, C),
                       p + "self_attn.v_proj.weight": (Hkv * D, C), p + "self_attn.o_proj.weight": (C, Hq * D),
                       p + "mlp.gate_proj.weight": (I, C), p + "mlp.up_proj.weight": (I, C),
                       p + "mlp.down_proj.weight": (C, I)})
        if gen == 3:
            shapes.update({p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
    header, blobs, off = {}, [], 0
    for name, shape in shapes.items():
        n = math.prod(shape)
        std = 0.1 if "norm" in name else 0.5 if "embed" in name else 0.05  # norms: w near 0 (1 + w applied)
        b = array("f", (rng.gauss(0, std) for _ in range(n))).tobytes()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return d


def write_config(cfg, path):
    lines = []
    for k, v in cfg.items():
        if isinstance(v, dict):
            lines.append("%s:" % k)
            lines += ["  %s: %s" % (k2, v2) for k2, v2 in v.items()]
        elif isinstance(v, bool):
            lines.append("%s: %s" % (k, "true" if v else "false"))
        elif isinstance(v, list):  # a JSON list is a YAML flow sequence (datasets: [{path, type}])
            lines.append("%s: %s" % (k, json.dumps(v)))
        elif isinstance(v, str) and any(c in v for c in "{}[]%:#'\"\n"):  # a JSON string: a quoted YAML scalar
            lines.append("%s: %s" % (k, json.dumps(v)))
        else:
            lines.append("%s: %s" % (k, v))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


class Run:
    pass


def gpu_used_mib(pid):
    """Memory nvidia-smi reports for process pid (MiB), or -1."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10)
        for line in p.stdout.splitlines():
            a = [x.strip() for x in line.split(",")]
            if len(a) == 2 and a[0] == str(pid):
                return int(a[1])
    except Exception:  # noqa: BLE001 - a missing or slow nvidia-smi only loses the sample
        pass
    return -1


RUN_TIMEOUT = int(os.environ.get("LLMC_CHECK_RUN_TIMEOUT", "600"))


def run(name, cfg, env=None, prefix=None, plan=False, timeout=None, sample=False, args=(), binary=None):
    timeout = timeout or RUN_TIMEOUT
    out = cfg["output_dir"]
    path = os.path.join(TMP, name + ".yaml")
    write_config(cfg, path)
    e = dict(ENV)
    e.update(env or {})
    cmd = (prefix or []) + [binary or BIN, "-c", path] + (["--plan"] if plan else []) + list(args)
    r = Run()
    r.name, r.out, r.cfg, r.gpu_peak_mib = name, out, cfg, -1
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace", env=e)
    stop = []
    if sample:
        def poll():
            while not stop:
                r.gpu_peak_mib = max(r.gpu_peak_mib, gpu_used_mib(p.pid))
                time.sleep(0.2)
        th = threading.Thread(target=poll, daemon=True)
        th.start()
    try:
        r.stdout, r.stderr = p.communicate(timeout=timeout)
        r.rc = p.returncode
    except subprocess.TimeoutExpired:
        p.kill()
        r.stdout, r.stderr = p.communicate()
        r.rc = -999
        r.stderr += "\ntimed out after %d s" % timeout
    stop.append(1)
    r.secs = time.time() - t0
    r.metrics = []
    mp = os.path.join(out, "metrics.jsonl")
    if not plan and os.path.exists(mp):
        for line in open(mp):
            if line.strip():
                try:
                    r.metrics.append(json.loads(line, parse_float=str))
                except ValueError:
                    pass
    return r


def why(r):
    return "rc %s: %s" % (r.rc, (r.stderr.strip().splitlines() or ["(no stderr)"])[-1][:600])


def losses(r):
    return [(d["step"], d["loss"]) for d in r.metrics if "loss" in d]


def peak(r, key):
    v = [int(d[key]) for d in r.metrics if key in d]
    return max(v) if v else -1


def file_bytes(r, name):
    p = os.path.join(r.out, name)
    return open(p, "rb").read() if os.path.exists(p) else b""


def bf16_to_f32(raw):
    a = array("H")
    a.frombytes(raw)
    out = array("I", (x << 16 for x in a))
    return array("f", out.tobytes())


def safetensors_floats(data):
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        raw = data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
        if v["dtype"] == "F32":
            a = array("f")
            a.frombytes(raw)
        elif v["dtype"] == "BF16":
            a = bf16_to_f32(raw)
        else:
            raise ValueError("%s: dtype %s" % (k, v["dtype"]))
        out[k] = a
    return out


def weights_close(a_bytes, b_bytes, rel):
    """Per tensor, max |a-b| <= rel * max |b|. Returns (ok, worst relative error, detail)."""
    try:
        a, b = safetensors_floats(a_bytes), safetensors_floats(b_bytes)
    except Exception as e:  # noqa: BLE001
        return False, math.inf, "cannot read weights: %s" % e
    if a.keys() != b.keys():
        return False, math.inf, "tensor names differ"
    worst, wname = 0.0, ""
    for k in b:
        if len(a[k]) != len(b[k]):
            return False, math.inf, "%s: sizes differ" % k
        scale = max((abs(x) for x in b[k]), default=0.0) or 1.0
        diff = max((abs(x - y) for x, y in zip(a[k], b[k])), default=0.0)
        if not diff == diff:
            return False, math.inf, "%s: NaN" % k
        if diff / scale > worst:
            worst, wname = diff / scale, k
    return worst <= rel, worst, "worst tensor %s: %.3g relative" % (wname, worst)


def losses_rel(a, b):
    if [s for s, _ in a] != [s for s, _ in b] or not b:
        return math.inf
    return max(abs(float(x) - float(y)) / max(abs(float(y)), 1e-30) for (_, x), (_, y) in zip(a, b))


LORA = {"adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "lora_target_linear": "true"}
QLORA = dict(LORA, adapter="qlora", load_in_4bit="true")


# ---- (b) fp32 CUDA vs CPU ----------------------------------------------------------------------

# One step whose change measures the gradient: AdamW with epsilon 1 moves each weight by
# lr * g / (|g| + 1), nearly lr * g for small g, with no clipping or decay (as
# test/test_cuda_emu_train.py does). With the usual epsilon (1e-8) AdamW moves a weight by about
# lr * sign(g) whatever |g| is, so gradients near zero, where two backends' float sums differ most
# in relative terms, decide whole updates: the first GPU run (H200, 2026-11-27) had every loss
# within 7e-8 of the CPU's and yet final weights 3e-3 (full) and 8e-4 (LoRA B) apart per tensor.
LINEAR_STEP = {"adam_epsilon": 1, "weight_decay": 0, "max_grad_norm": 0, "warmup_steps": 0,
               "lr_scheduler": "constant", "learning_rate": 10, "max_steps": 1}


def step_errors(w0_bytes, a_bytes, b_bytes, only=None, read=None):
    """Per tensor: max |(a-w0) - (b-w0)| / max |b-w0| (the steps, normwise against b's), the files
    read by read (default safetensors_floats). Returns (worst, its name, median, detail) or
    (inf, ...) when a file is unreadable."""
    read = read or safetensors_floats
    try:
        w0, a, b = read(w0_bytes), read(a_bytes), read(b_bytes)
    except Exception as e:  # noqa: BLE001
        return math.inf, "", math.inf, "cannot read weights: %s" % e
    if not (w0.keys() == a.keys() == b.keys()):
        return math.inf, "", math.inf, "tensor names differ"
    errs = {}
    for k in b:
        if only and only not in k:
            continue
        db = [y - x for x, y in zip(w0[k], b[k])]
        da = [y - x for x, y in zip(w0[k], a[k])]
        ref = max((abs(x) for x in db), default=0.0)
        e = max((abs(x - y) for x, y in zip(da, db)), default=0.0) / (ref if ref > 0 else 1.0)
        errs[k] = e if e == e else math.inf
    if not errs:
        return math.inf, "", math.inf, "no tensor%s" % (" named *%s*" % only if only else "")
    worst = max(errs, key=errs.get)
    med = sorted(errs.values())[len(errs) // 2]
    return errs[worst], worst, med, "worst tensor %s: %.3g, median %.3g over %d" % (worst, errs[worst], med, len(errs))


def part_train(a):
    size = "tiny" if a.tiny else "small"
    rows = []
    for label, extra, wfile in (("full", {}, "model.safetensors"), ("LoRA", LORA, "adapter_model.safetensors"),
                                ("Gemma 3 full", {"base_model": gemma_base(size)}, "model.safetensors"),
                                ("Gemma 2 full", {"base_model": gemma_base(size, 2)}, "model.safetensors"),
                                ("Gemma 1 full", {"base_model": gemma_base(size, 1)}, "model.safetensors")):
        # (1) a few steps of ordinary AdamW: the losses
        cpu = run("b_cpu_" + label, base_cfg(size, os.path.join(TMP, "b_cpu_" + label), device="cpu", **extra))
        gpu = run("b_gpu_" + label, base_cfg(size, os.path.join(TMP, "b_gpu_" + label), device=a.device,
                                              dtype="float32", **extra))
        ok_runs = cpu.rc == 0 and gpu.rc == 0
        lr = losses_rel(losses(gpu), losses(cpu)) if ok_runs else math.inf
        check("fp32 CUDA vs CPU, %s: every step's loss within 1e-5 relative" % label, ok_runs and lr <= 1e-5,
              "%s | %s | worst %.3g\n  cuda %s\n  cpu  %s" % (why(gpu), why(cpu), lr, losses(gpu), losses(cpu)))
        _, wrel, _ = weights_close(file_bytes(gpu, wfile), file_bytes(cpu, wfile), 0) if ok_runs else (False, math.inf, "")
        # (2) one linear step from the same initial weights: the gradients, element by element
        # (LoRA: B's; A has no gradient while B is zero)
        runs = {}
        for name, dev, over in (("w0", "cpu", dict(extra, **dict(LINEAR_STEP, learning_rate=0))),
                                ("cpu", "cpu", dict(extra, **LINEAR_STEP)),
                                ("gpu", a.device, dict(extra, dtype="float32", **LINEAR_STEP))):
            slug = "b_step_%s_%s" % (name, label)
            runs[name] = run(slug, base_cfg(size, os.path.join(TMP, slug), device=dev, **over))
        ok_step = all(r.rc == 0 for r in runs.values())
        gerr, gname, gmed, gdet = step_errors(*(file_bytes(runs[n], wfile) for n in ("w0", "gpu", "cpu")),
                                              only="lora_B" if "adapter" in extra else None) if ok_step else (math.inf, "", math.inf, "")
        # Neither side is exact: both sum in float, in different orders. Through the emulator
        # (the CUDA code on the CPU) the worst tensor was a norm weight, 1.3e-5 (its gradient
        # sums dy * x_hat over rows, terms of both signs that cancel), the median 2.8e-7
        check("fp32 CUDA vs CPU, %s: one step's gradient (AdamW epsilon 1, lr 10) within 1e-4 normwise per "
              "tensor, median within 2e-6" % label, ok_step and gerr <= 1e-4 and gmed <= 2e-6,
              gdet if ok_step else " | ".join(why(r) for r in runs.values()))
        rows.append({"run": label, "steps": len(losses(cpu)), "loss_rel_err": lr, "gradient_rel_err": gerr,
                     "gradient_rel_err_median": gmed, "adamw_weights_rel_err": wrel,
                     "cuda_s": round(gpu.secs, 2), "cpu_s": round(cpu.secs, 2)})
    rows.append(pref_check(a, size, "dpo"))
    rows.append(pref_check(a, size, "reward"))
    rows.append(pref_check(a, size, "prm"))
    TABLES["fp32 CUDA vs CPU"] = rows


WORDS = ("the a cat dog sat ran on under mat tree home far blue green red sky river stone light dark quick slow "
         "yes no good bad answer question tell me why how").split()


def word_tokenizer(d, vocab):
    """A word-level tokenizer (tokenizer.json, standard library only) in d: <pad> <unk> <bos>
    <eos>, then WORDS; the BOS added before every text, as Llama's tokenizers do."""
    toks = ["<pad>", "<unk>", "<bos>", "<eos>"] + list(WORDS)
    assert len(toks) <= vocab, (len(toks), vocab)
    special = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
                "special": True} for i, t in enumerate(toks[:4])]
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": special, "normalizer": None,
          "pre_tokenizer": {"type": "WhitespaceSplit"},
          "post_processor": {"type": "TemplateProcessing",
                             "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                        {"Sequence": {"id": "A", "type_id": 0}}],
                             "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                             "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}},
          "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
          "model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(toks)}, "unk_token": "<unk>"}}
    with open(os.path.join(d, "tokenizer.json"), "w") as f:
        json.dump(tj, f)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
                   "pad_token": "<pad>", "unk_token": "<unk>"}, f)


def pref_check(a, size, kind):
    """rl: dpo (kind "dpo") or reward_model ("reward") on the device against the CPU: DPO's
    reference pass, then the classifier's second pass with a scale per row (negative for rejected
    rows); the reward model's score head at one position a row (products with K = 1). A Gemma 1
    base with a word-level tokenizer; data prepared by scripts/prepare_data.py (needs Python's
    transformers: SKIP without)."""
    what = {"dpo": "rl: dpo", "reward": "reward_model", "prm": "process_reward_model"}[kind]
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("SKIP %s: Python's transformers is not installed" % what)
        return {"run": what, "skipped": "no transformers"}
    d = gemma_base(size, 1)
    word_tokenizer(d, model_cfg(size)["model"]["vocab_size"])
    rng = random.Random(11)
    data = os.path.join(TMP, "%s_pairs.jsonl" % kind)
    with open(data, "w") as f:
        for _ in range(4):
            sent = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))
            rec = {"dpo": {"prompt": sent(5) + " answer", "chosen": " " + sent(4), "rejected": " " + sent(3)},
                   "reward": {"system": "", "input": sent(5), "chosen": sent(4), "rejected": sent(3)},
                   "prm": {"prompt": sent(5), "completions": [sent(3), sent(4)], "labels": [True, False]}}[kind]
            f.write(json.dumps(rec) + "\n")
    method = {"dpo": {"rl": "dpo", "rl_beta": 0.5, "datasets": [{"path": data, "type": "passthrough"}]},
              "reward": {"reward_model": True, "center_rewards_coefficient": 0.01, "chat_template": "jinja",
                         "chat_template_jinja": "{% for m in messages %}{{ m['content'] }} {% endfor %}",
                         "datasets": [{"path": data, "type": "bradley_terry.chat_template"}]},
              "prm": {"process_reward_model": True,
                      "datasets": [{"path": data, "type": "stepwise_supervised", "step_separator": " and "}]}}[kind]
    rs = {}
    for name, dev in (("cpu", "cpu"), ("gpu", a.device)):
        out = os.path.join(TMP, "b_%s_%s" % (kind, name))
        cfg = dict(method, base_model=d, dataset_prepared_path=os.path.join(TMP, "%s_prepared" % kind), sequence_len=32,
                   micro_batch_size=1, gradient_accumulation_steps=2, max_steps=2, learning_rate=1e-2,
                   lr_scheduler="constant", shuffle=False, seed=3, device=dev, dtype="float32", output_dir=out)
        rs[name] = run("b_%s_%s" % (kind, name), cfg, env={"LLMC_PYTHON": sys.executable, "TRANSFORMERS_VERBOSITY": "error"})
    ok_runs = all(r.rc == 0 for r in rs.values())
    lr = losses_rel(losses(rs["gpu"]), losses(rs["cpu"])) if ok_runs else math.inf
    nr = max((abs(float(x["grad_norm"]) - float(y["grad_norm"])) / float(y["grad_norm"])
              for x, y in zip(rs["gpu"].metrics, rs["cpu"].metrics) if "grad_norm" in y), default=math.inf)
    check("fp32 CUDA vs CPU, %s (Gemma 1 base): both steps' loss and grad norm within 1e-5 relative" % what,
          ok_runs and lr <= 1e-5 and nr <= 1e-5,
          "%s | %s | loss %.3g, norm %.3g" % (why(rs["gpu"]), why(rs["cpu"]), lr, nr))
    return {"run": {"dpo": "DPO", "reward": "reward model", "prm": "process reward model"}[kind],
            "steps": len(losses(rs["cpu"])), "loss_rel_err": lr,
            "grad_norm_rel_err": nr, "cuda_s": round(rs["gpu"].secs, 2), "cpu_s": round(rs["cpu"].secs, 2)}


# ---- (c) memory modes --------------------------------------------------------------------------

BASE_MODES = {
    "plain": {},
    "checkpointing": {"gradient_checkpointing": "true"},
    "selective": {"gradient_checkpointing": "selective"},
    "offload true": {"activation_offloading": "true"},
    "offload legacy": {"activation_offloading": "legacy"},
    "offload disk": {"activation_offloading": "disk"},
    "ckpt + offload true": {"gradient_checkpointing": "true", "activation_offloading": "true"},
    "hidden_states": {"activation_offloading": "hidden_states"},
}
MODES = dict(BASE_MODES)
MODES.update({k + " + tiled MLP": dict(v, tiled_mlp="true") for k, v in BASE_MODES.items()})


def parse_size(s):
    s = s.strip()
    units = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3, "TiB": 1024 ** 4}
    num, unit = s.split()
    return float(num) * units[unit]


def parse_plan(text):
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8 or cells[0] in ("mode", "") or cells[0].startswith("-"):
            continue
        try:
            rows[cells[0]] = {"dev": parse_size(cells[1]), "host": parse_size(cells[2]), "disk": parse_size(cells[3])}
        except (ValueError, KeyError):
            pass
    return rows


def gpu_total_gib():
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True, timeout=10)
        return max(1, int(p.stdout.split()[0]) // 1024)
    except Exception:  # noqa: BLE001
        return 80


def unplanned_row(mode, r, same):
    """A table row for a run the plan has no row for (its plan columns -1)."""
    return {"mode": mode, "bit_identical": same, "counted_peak_MiB": round(peak(r, "device_peak_bytes") / 2 ** 20, 2),
            "nvidia_smi_peak_MiB": r.gpu_peak_mib, "plan_peak_MiB": -1,
            "host_peak_MiB": round(peak(r, "host_peak_bytes") / 2 ** 20, 2), "plan_host_MiB": -1,
            "secs": round(r.secs, 2)}


def part_modes(a):
    size = "tiny" if a.tiny else "medium"
    lim = "%dGiB" % gpu_total_gib()
    runs = {}
    for m, over in MODES.items():
        slug = "c_" + m.replace(" ", "_").replace("+", "p")
        runs[m] = run(slug, base_cfg(size, os.path.join(TMP, slug), device=a.device, **over), sample=not a.tiny)
    plan = run("c_plan", base_cfg(size, os.path.join(TMP, "c_plan"), device=a.device, device_memory_limit=lim), plan=True)
    prow = parse_plan(plan.stdout)
    check("--plan on the GPU prints a row for every mode", plan.rc == 0 and set(prow) >= set(MODES),
          why(plan) + " rows: %s" % sorted(prow))
    ref = runs["plain"]
    check("plain GPU run", ref.rc == 0 and losses(ref), why(ref))
    ref_w = file_bytes(ref, "model.safetensors")
    rows, bad = [], []
    for m, r in runs.items():
        same = r.rc == 0 and losses(r) == losses(ref) and file_bytes(r, "model.safetensors") == ref_w and ref_w
        if m != "plain" and not same:
            bad.append("%s: %s; losses %s vs plain %s" % (m, why(r) if r.rc else "differs", losses(r), losses(ref)))
        p = prow.get(m, {})
        rows.append({"mode": m, "bit_identical": bool(same), "counted_peak_MiB": round(peak(r, "device_peak_bytes") / 2 ** 20, 2),
                     "nvidia_smi_peak_MiB": r.gpu_peak_mib, "plan_peak_MiB": round(p.get("dev", -1) / 2 ** 20, 2),
                     "host_peak_MiB": round(peak(r, "host_peak_bytes") / 2 ** 20, 2),
                     "plan_host_MiB": round(p.get("host", -1) / 2 ** 20, 2), "secs": round(r.secs, 2)})
    check("every memory mode on the GPU: losses and final weights bit-identical to the plain GPU run", not bad,
          "\n  ".join(bad))
    # the plan's device peak includes the backend's fixed memory (context, cuBLASLt workspace):
    # compared with what nvidia-smi saw, within 10% (+ 256 MiB for the allocator's rounding).
    # Only where the plan places kept tensors as the run did: --plan on CUDA needs a device
    # limit and then keeps on the device the layers that fit, while these runs have no limit
    # and offload every kept layer (on the first GPU run, 2026-11-27, offload true planned
    # 1382 MiB on the device and 0 B on the host, the run used 1162 MiB and 245 MiB).
    for r in rows:
        r["same_placement"] = (r["plan_host_MiB"] >= 0 and
                               abs(r["plan_host_MiB"] - r["host_peak_MiB"]) <= 0.1 * r["host_peak_MiB"] + 16)
    cmp_rows = [r for r in rows if r["same_placement"] and r["plan_peak_MiB"] > 0 and r["nvidia_smi_peak_MiB"] > 0]
    far = [r for r in cmp_rows if abs(r["plan_peak_MiB"] - r["nvidia_smi_peak_MiB"]) > 0.1 * r["nvidia_smi_peak_MiB"] + 256]
    other = [r["mode"] for r in rows if not r["same_placement"]]
    if not a.tiny:
        check("--plan's device peak within 10%% (+256 MiB) of the nvidia-smi peak, the %d modes the plan places "
              "as the run did (not compared: %s)" % (len(cmp_rows), ", ".join(other) or "none"), cmp_rows and not far,
              "; ".join("%s: plan %.0f MiB, nvidia-smi %d MiB" % (r["mode"], r["plan_peak_MiB"], r["nvidia_smi_peak_MiB"]) for r in far)
              or "no mode to compare")
    # frozen-layer streaming (LoRA): bit-identical to resident LoRA
    lo = run("c_lora", base_cfg(size, os.path.join(TMP, "c_lora"), device=a.device, **LORA))
    ls = run("c_lora_stream", base_cfg(size, os.path.join(TMP, "c_lora_stream"), device=a.device,
                                       layer_offloading="true", **LORA), sample=not a.tiny)
    ad = file_bytes(lo, "adapter_model.safetensors")
    check("layer_offloading (LoRA): losses and adapter bit-identical to resident LoRA",
          lo.rc == 0 and ls.rc == 0 and losses(lo) == losses(ls) and ad and ad == file_bytes(ls, "adapter_model.safetensors"),
          "%s | %s | %s vs %s" % (why(lo), why(ls), losses(ls), losses(lo)))
    rows.append(unplanned_row("LoRA + layer_offloading", ls, losses(lo) == losses(ls)))
    # A full fine-tune's parameters in host memory (offload_params: ZeRO-3 whose pieces and
    # their float gradients live in pinned host memory, the update on the host): ZeRO-3 +
    # offload_optimizer's losses and weights bit for bit (the same arithmetic; only where the
    # pieces live differs), and a device peak lower by the pieces and their gradients (6 bytes a
    # parameter in bf16, 8 in fp32)
    z3 = run("c_z3_offload", base_cfg(size, os.path.join(TMP, "c_z3_offload"), device=a.device, zero_stage="3",
                                      offload_optimizer="true"))
    op = run("c_offload_params", base_cfg(size, os.path.join(TMP, "c_offload_params"), device=a.device,
                                          offload_params="true"), sample=not a.tiny)
    npar = re.search(r"\| parameters +\d+ \(trainable (\d+)\)", op.stdout or "")
    npar = int(npar.group(1)) if npar else 0
    dz, dop = peak(z3, "device_peak_bytes"), peak(op, "device_peak_bytes")
    zw = file_bytes(z3, "model.safetensors")
    check("offload_params: losses and weights bit-identical to ZeRO-3 + offload_optimizer's, device peak lower by "
          ">= 6 B x %d trainable parameters (%.2f -> %.2f MiB)" % (npar, dz / 2 ** 20, dop / 2 ** 20),
          z3.rc == 0 and op.rc == 0 and losses(z3) and losses(op) == losses(z3) and zw and
          file_bytes(op, "model.safetensors") == zw and npar > 0 and dz - dop >= 6 * npar,
          "%s | %s | losses %s vs %s" % (why(z3), why(op), losses(op), losses(z3)))
    for label, r in (("ZeRO-3 + offload_optimizer", z3), ("offload_params", op)):
        rows.append(unplanned_row(label, r, r.rc == 0 and losses(r) == losses(z3)))
    # QLoRA (NF4 base, dequantized per layer on the GPU): every base mode and layer streaming
    # give the resident QLoRA run's losses and adapter bit for bit
    qruns = {}
    for m, over in list(BASE_MODES.items()) + [("layer_offloading", {"layer_offloading": "true"})]:
        slug = "c_qlora_" + m.replace(" ", "_").replace("+", "p")
        qruns[m] = run(slug, base_cfg(size, os.path.join(TMP, slug), device=a.device, **dict(QLORA, **over)),
                       sample=not a.tiny)
    qref = qruns["plain"]
    qad = file_bytes(qref, "adapter_model.safetensors")
    qbad = ["%s: %s; losses %s vs %s" % (m, why(r) if r.rc else "differs", losses(r), losses(qref))
            for m, r in qruns.items() if m != "plain" and not (
                r.rc == 0 and losses(r) == losses(qref) and qad and file_bytes(r, "adapter_model.safetensors") == qad)]
    check("QLoRA: every base memory mode and layer streaming bit-identical to resident QLoRA (losses, adapter)",
          qref.rc == 0 and losses(qref) and not qbad, why(qref) if qref.rc else "\n  ".join(qbad))
    check("QLoRA and LoRA differ (the NF4 base is in use)", losses(qref) != losses(lo), "same losses %s" % losses(qref))
    # load_in_8bit (int8 base, dequantized per layer by int8.cu): layer streaming gives the
    # resident run's losses and adapter bit for bit, and the base is not the float one
    int8 = dict(LORA, load_in_8bit="true")
    ires = run("c_int8_plain", base_cfg(size, os.path.join(TMP, "c_int8_plain"), device=a.device, **int8),
               sample=not a.tiny)
    istr = run("c_int8_stream", base_cfg(size, os.path.join(TMP, "c_int8_stream"), device=a.device,
                                         **dict(int8, layer_offloading="true")), sample=not a.tiny)
    iad = file_bytes(ires, "adapter_model.safetensors")
    check("load_in_8bit: layer streaming bit-identical to the resident run (losses, adapter), both unlike LoRA's",
          ires.rc == 0 and istr.rc == 0 and losses(ires) and losses(ires) == losses(istr) and iad and
          iad == file_bytes(istr, "adapter_model.safetensors") and losses(ires) != losses(lo),
          "%s | %s | %s vs %s (LoRA %s)" % (why(ires), why(istr), losses(istr), losses(ires), losses(lo)))
    for label, r in (("LoRA int8 base", ires), ("LoRA int8 base + layer_offloading", istr)):
        rows.append(unplanned_row(label, r, r.rc == 0 and losses(r) == losses(ires)))
    for m, r in qruns.items():
        rows.append(unplanned_row("QLoRA + " + m, r, r.rc == 0 and losses(r) == losses(qref)))
    TABLES["memory modes on the GPU"] = rows


# ---- (d) compute-sanitizer ---------------------------------------------------------------------

def part_sanitizer(a):
    cs = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(cs):
        check("compute-sanitizer found", False, "not on PATH nor in /usr/local/cuda/bin")
        return
    size = "tiny"
    rows = []
    # racecheck (shared-memory hazards inside kernels: the same kernels in every mode) on three
    # modes of the tiny model (head dim 8: attention's generic path) and on the dev/cuda programs
    # whose kernels share memory (--quick: attention's WMMA paths at head dims 16, 64 and 128
    # too); memcheck on every mode and on those programs; synccheck on one mode. Racechecks
    # first: the first GPU run found a hazard there. Jobs past the time budget are reported as
    # not run.
    progs = ("attention", "classifier")
    jobs = [("train", m, "racecheck") for m in ("plain", "offload true", "hidden_states")]
    jobs += [("prog", p, "racecheck") for p in progs]
    jobs += [("train", m, "memcheck") for m in BASE_MODES] + [("train", "LoRA + layer_offloading", "memcheck")]
    jobs += [("prog", p, "memcheck") for p in progs] + [("train", "plain", "synccheck")]
    t0 = time.time()
    for kind, m, tool in jobs:
        name = "compute-sanitizer %s: %s" % (tool, m if kind == "train" else "dev/cuda/%s --quick" % m)
        if time.time() - t0 > a.budget:
            check(name, False, "not run: past the part's %d s budget" % a.budget)
            continue
        prefix = [cs, "--tool", tool, "--error-exitcode", "99", "--print-limit", "20"]
        left = max(30, int(a.budget - (time.time() - t0)) + 30)
        if kind == "train":
            over = dict(BASE_MODES.get(m, {}))
            if m.startswith("LoRA"):
                over.update(LORA, layer_offloading="true")
            slug = "d_%s_%s" % (tool, m.replace(" ", "_").replace("+", "p"))
            cfg = base_cfg(size, os.path.join(TMP, slug), device=a.device, max_steps=1, **over)
            r = run(slug, cfg, prefix=prefix, timeout=left)
        else:
            r = Run()
            prog = os.path.join(os.path.dirname(BIN), "dev", "cuda", m)
            t1 = time.time()
            try:
                p = subprocess.run(prefix + [prog, "--quick"], capture_output=True, text=True, errors="replace", timeout=left)
                r.rc, r.stdout, r.stderr = p.returncode, p.stdout, p.stderr
            except subprocess.TimeoutExpired as e:
                r.rc, r.stdout, r.stderr = -999, str(e.stdout or ""), "timed out after %d s" % left
            except OSError as e:
                r.rc, r.stdout, r.stderr = -1, "", str(e)
            r.secs = time.time() - t1
        summary = [l for l in (r.stdout + r.stderr).splitlines() if "ERROR SUMMARY" in l or "RACECHECK SUMMARY" in l]
        ok = r.rc == 0 and bool(summary) and all(" 0 error" in l or " 0 hazard" in l for l in summary)
        check(name, ok, "%s\n%s" % (why(r), "\n".join((r.stdout + r.stderr).splitlines()[-30:])))
        rows.append({"mode": m if kind == "train" else "dev/cuda/" + m, "tool": tool, "ok": ok,
                     "summary": "; ".join(summary), "secs": round(r.secs, 1)})
    TABLES["compute-sanitizer"] = rows


# ---- (e) NCCL --------------------------------------------------------------------------------

def gpu_count():
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        return sum(1 for l in p.stdout.splitlines() if l.startswith("GPU "))
    except Exception:  # noqa: BLE001
        return 0


def part_nccl(a):
    size = "tiny" if a.tiny else "medium"
    ref = run("e_plain", base_cfg(size, os.path.join(TMP, "e_plain"), device=a.device))
    nc = run("e_nccl1", base_cfg(size, os.path.join(TMP, "e_nccl1"), device=a.device), env={"LLMC_FORCE_NCCL": "1"})
    check("NCCL world 1 (LLMC_FORCE_NCCL=1): runs, losses and weights bit-identical to the plain GPU run",
          ref.rc == 0 and nc.rc == 0 and losses(ref) == losses(nc) and
          file_bytes(ref, "model.safetensors") == file_bytes(nc, "model.safetensors"),
          "%s | %s | %s vs %s" % (why(nc), why(ref), losses(nc), losses(ref)))
    rows = [{"world": 1, "ok": nc.rc == 0, "secs": round(nc.secs, 2), "comm_ms": sum(float(d.get("comm_ms", 0)) for d in nc.metrics)}]
    n = gpu_count()
    if n >= 2 and not a.tiny:
        idf = os.path.join(TMP, "nccl_id")
        cfg = base_cfg(size, os.path.join(TMP, "e_multi"), device=a.device)
        path = os.path.join(TMP, "e_multi.yaml")
        write_config(cfg, path)
        procs = []
        for r in range(n):
            e = dict(ENV, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LLMC_NCCL_ID_FILE=idf)
            procs.append(subprocess.Popen([BIN, "-c", path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True, errors="replace", env=e))
        outs = [p.communicate(timeout=600)[0] for p in procs]
        ok = all(p.returncode == 0 for p in procs)
        check("NCCL world %d (launcher-free, one process per GPU): every rank exits 0" % n, ok,
              "\n".join(o[-800:] for o in outs))
        rows.append({"world": n, "ok": ok})
    else:
        print("SKIP NCCL on several GPUs: %d GPU(s)" % n)
        rows.append({"world": "several", "ok": None, "note": "skipped: %d GPU(s)" % n})
    TABLES["NCCL"] = rows


# ---- (g) memory and time at a real shape ---------------------------------------------------

# issue 15, item 3: at TinyLlama-1.1B's shape and 4096 tokens, every mode's measured device peak
# within 10% of --plan's (both under the same device_memory_limit, the GPU's memory, so the plan
# and the run place kept tensors alike); then, without a limit (kept hidden states on the host),
# hidden_states at most 1.02x the step time of plain recompute (gradient checkpointing) and LoRA
# layer streaming at most 1.10x resident LoRA. bf16, micro batch 1. The time checks need a real
# GPU; with --tiny (the emulator) only the runs are checked.
MEM_1B = dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
              num_attention_heads=32, num_key_value_heads=4)
MEM_MODES = {"plain": {}, "checkpointing": {"gradient_checkpointing": "true"},
             "selective": {"gradient_checkpointing": "selective"}, "offload true": {"activation_offloading": "true"},
             "hidden_states": {"activation_offloading": "hidden_states"},
             "LoRA": dict(LORA, lora_r=16, lora_alpha=32), "LoRA + layer_offloading": dict(LORA, lora_r=16, lora_alpha=32, layer_offloading="true")}
# Llama-3.1-8B's shape (GQA 32/8, head dim 128): QLoRA r16 in each base mode and with its frozen
# layers streamed (a full fine-tune of 8B does not fit one GPU: ~130 GB of weights, gradients
# and moments).
MEM_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=8)
Q16 = dict(QLORA, lora_r=16, lora_alpha=32)
MEM8_MODES = {"QLoRA": Q16, "QLoRA + checkpointing": dict(Q16, gradient_checkpointing="true"),
              "QLoRA + selective": dict(Q16, gradient_checkpointing="selective"),
              "QLoRA + offload true": dict(Q16, activation_offloading="true"),
              "QLoRA + hidden_states": dict(Q16, activation_offloading="hidden_states"),
              "QLoRA + layer_offloading": dict(Q16, layer_offloading="true")}
# Per shape: the model, its modes, the --plan runs (kind: config) and which plan row each mode is
# compared with, and the step-time pairs (slow, fast, bound) timed without a device limit.
MEM_SHAPES = {
    "1b": dict(model=MEM_1B, modes=MEM_MODES, title="the 1.1B shape",
               plans={"full": {}, "LoRA": MEM_MODES["LoRA"], "LoRA streamed": MEM_MODES["LoRA + layer_offloading"]},
               row=lambda m: {"LoRA": ("LoRA", "plain"), "LoRA + layer_offloading": ("LoRA streamed", "plain")}.get(m, ("full", m)),
               times=(("hidden_states", "checkpointing", 1.02), ("LoRA + layer_offloading", "LoRA", 1.10))),
    "8b": dict(model=MEM_8B, modes=MEM8_MODES, title="the 8B shape (QLoRA r16)",
               plans={"QLoRA": Q16, "QLoRA streamed": MEM8_MODES["QLoRA + layer_offloading"]},
               row=lambda m: ("QLoRA streamed", "plain") if m == "QLoRA + layer_offloading" else
               ("QLoRA", m[len("QLoRA + "):] if m.startswith("QLoRA + ") else "plain"),
               times=(("QLoRA + hidden_states", "QLoRA + checkpointing", 1.02), ("QLoRA + layer_offloading", "QLoRA", 1.10))),
}


def step_ms(r):
    ms = [float(d["ms"]) for d in r.metrics if "loss" in d and "ms" in d]
    ms = ms[1:] or ms  # the first step pays for warm-up
    return sorted(ms)[len(ms) // 2] if ms else math.inf


def part_memory(a):
    sh = MEM_SHAPES[a.shape]
    if a.tiny:
        model = model_cfg("tiny")["model"]
        T, steps = 32, 3
    else:
        model = dict(sh["model"], max_position_embeddings=4096)
        T, steps = 4096, 5
    lim = "%dGiB" % gpu_total_gib()
    # Each full run ends by writing its checkpoint (~15 GB at 1.1B: weights, master, moments),
    # removed after it; on the H200 (2026-11-28) four modes took the part's 146 s. In memory
    # (/dev/shm) where it has room, those writes cost little.
    outroot = TMP
    if not a.tiny and os.path.isdir("/dev/shm"):
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize >= 48 * 2 ** 30:
            outroot = tempfile.mkdtemp(prefix="llmc_gpucheck_out_", dir="/dev/shm")
    try:
        memory_runs(a, sh, model, T, steps, lim, outroot)
    finally:
        if outroot != TMP:
            shutil.rmtree(outroot, ignore_errors=True)


def memory_runs(a, sh, model, T, steps, lim, outroot):
    def cfg(name, **over):
        c = {"model": model, "train_data": os.path.join(TMP, "data_%d.bin" % model["vocab_size"]), "shuffle": "false",
             "sequence_len": T, "micro_batch_size": 1, "gradient_accumulation_steps": 1, "max_steps": steps,
             "learning_rate": "1e-5", "dtype": "bfloat16", "device": a.device, "device_memory_limit": lim,
             "output_dir": os.path.join(outroot, name), "seed": 1234}
        if not os.path.exists(c["train_data"]):
            write_shard(c["train_data"], T * (steps + 2) + 1, model["vocab_size"])
        c.update(over)
        return c
    # The step-time ratios first (the H200's first memory call ran out of its budget before
    # them), from runs without a limit: there every kept hidden state goes to the host (under a
    # limit the GPU can hold them all, and nothing would be offloaded to time)
    t0 = time.time()
    trows = []
    for slow, fast, bound in sh["times"]:
        if time.time() - t0 > a.budget:
            check("memory: %s vs %s step time" % (slow, fast), False, "not run: past the part's %d s budget" % a.budget)
            continue
        tr = {}
        for m in (fast, slow):
            slug = "g_time_" + m.replace(" ", "_").replace("+", "p")
            c = cfg(slug, **sh["modes"][m])
            del c["device_memory_limit"]
            tr[m] = run(slug, c, sample=not a.tiny)
            shutil.rmtree(tr[m].out, ignore_errors=True)
            trows.append({"mode": m + " (no limit)", "rc": tr[m].rc, "step_ms": round(step_ms(tr[m]), 1),
                          "host_peak_MiB": round(peak(tr[m], "host_peak_bytes") / 2 ** 20, 1),
                          "nvidia_smi_peak_MiB": tr[m].gpu_peak_mib})
        ts, tf = step_ms(tr[slow]), step_ms(tr[fast])
        check("memory: %s step at most %.2fx %s's, without a device limit (%.1f / %.1f ms)" % (slow, bound, fast, ts, tf),
              tr[slow].rc == 0 and tr[fast].rc == 0 and (a.tiny or ts <= bound * tf),
              "ratio %.3f; %s | %s" % (ts / tf if tf else math.inf, why(tr[slow]), why(tr[fast])))
    TABLES["step times without a device limit (%s)" % a.shape] = trows
    rows, runs = [], {}
    for m, over in sh["modes"].items():
        if time.time() - t0 > a.budget:
            check("memory: %s" % m, False, "not run: past the part's %d s budget" % a.budget)
            continue
        slug = "g_" + m.replace(" ", "_").replace("+", "p")
        r = runs[m] = run(slug, cfg(slug, **over), sample=not a.tiny)
        shutil.rmtree(r.out, ignore_errors=True)  # a 1.1B full run saves ~13 GB (weights, master, moments)
    plans = {}  # (plan kind, plan row) -> peaks
    for kind, over in sh["plans"].items():
        slug = "g_plan_" + kind.replace(" ", "_")
        pl = run(slug, cfg(slug, **over), plan=True)
        for k2, v2 in parse_plan(pl.stdout).items():
            plans[(kind, k2)] = v2
        if pl.rc:
            check("memory: --plan runs (%s)" % kind, False, why(pl))
    for m, r in runs.items():
        p = plans.get(sh["row"](m), {})
        rows.append({"mode": m, "rc": r.rc, "step_ms": round(step_ms(r), 1), "nvidia_smi_peak_MiB": r.gpu_peak_mib,
                     "counted_peak_MiB": round(peak(r, "device_peak_bytes") / 2 ** 20, 1),
                     "plan_peak_MiB": round(p.get("dev", -1) / 2 ** 20, 1) if p else None,
                     "host_peak_MiB": round(peak(r, "host_peak_bytes") / 2 ** 20, 1)})
    TABLES["memory and time at %s, T %d" % (sh["title"], T) if not a.tiny else "memory and time (tiny, %s modes)" % a.shape] = rows
    bad = [m for m, r in runs.items() if r.rc != 0 or not losses(r)]
    check("memory: every mode runs %d steps" % steps, not bad, "; ".join("%s: %s" % (m, why(runs[m])) for m in bad))
    check("memory: every mode has a --plan row to compare with", all(r["plan_peak_MiB"] for r in rows),
          "no plan row for " + ", ".join(r["mode"] for r in rows if not r["plan_peak_MiB"]))
    far = [r for r in rows if r["plan_peak_MiB"] and r["plan_peak_MiB"] > 0 and r["nvidia_smi_peak_MiB"] > 0 and
           abs(r["plan_peak_MiB"] - r["nvidia_smi_peak_MiB"]) > 0.1 * r["nvidia_smi_peak_MiB"]]
    if not a.tiny:  # the emulator's peaks and times mean nothing: there only the runs are checked
        check("memory: nvidia-smi's device peak within 10% of --plan's, every mode (same device_memory_limit)", not far,
              "; ".join("%s: plan %.0f MiB, nvidia-smi %d MiB" % (r["mode"], r["plan_peak_MiB"], r["nvidia_smi_peak_MiB"]) for r in far))


# ---- (h) train_gpt: GPT-2 on the GPU ------------------------------------------------------------

# GPT-2 (train_gpt) has LayerNorm with biases, learned positions, GELU and a tied head over a
# vocabulary padded to 128: kernels train_llama never runs. Its model.bin is llm.c's layout.
def gpt2_sizes(size):
    if size == "tiny":  # emulator-sized
        return dict(model=dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               max_position_embeddings=64),
                    sequence_len=32, micro_batch_size=1, gradient_accumulation_steps=2, max_steps=2)
    return dict(model=dict(vocab_size=1024, hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                           max_position_embeddings=256),
                sequence_len=256, micro_batch_size=2, gradient_accumulation_steps=2, max_steps=5)


# fp32 model.bin files (the gradient check reads them); no evaluation or samples between steps
GPT2_KEYS = {"save_dtype": "float32", "eval_steps": 0, "sample_steps": 0}


def gpt2_bin_floats(data):
    """llm.c's model.bin (version 3, fp32) as {name: floats}, in its parameter order."""
    h = struct.unpack("<256i", data[:1024])
    if h[0] != 20240326 or h[1] != 3:
        raise ValueError("not an fp32 llm.c model.bin (magic %d, version %d)" % (h[0], h[1]))
    maxT, L, C, Vp = h[2], h[4], h[6], h[7]
    sizes = [("wte", Vp * C), ("wpe", maxT * C), ("ln1w", L * C), ("ln1b", L * C), ("qkvw", L * 3 * C * C),
             ("qkvb", L * 3 * C), ("attprojw", L * C * C), ("attprojb", L * C), ("ln2w", L * C), ("ln2b", L * C),
             ("fcw", L * 4 * C * C), ("fcb", L * 4 * C), ("fcprojw", L * 4 * C * C), ("fcprojb", L * C),
             ("lnfw", C), ("lnfb", C)]
    a = array("f")
    a.frombytes(data[1024:])
    if len(a) != sum(n for _, n in sizes):
        raise ValueError("model.bin holds %d floats, the header implies %d" % (len(a), sum(n for _, n in sizes)))
    out, o = {}, 0
    for name, n in sizes:
        out[name], o = a[o:o + n], o + n
    return out


def part_gpt(a):
    size = "tiny" if a.tiny else "small"
    G = os.path.abspath(a.bin)

    def go(slug, dev, **over):
        return run(slug, base_cfg(size, os.path.join(TMP, slug), gpt2_sizes, device=dev, **dict(GPT2_KEYS, **over)),
                   binary=G)
    # (1) fp32 CUDA against the CPU: a few AdamW steps' losses
    cpu = go("h_cpu", "cpu")
    gpu = go("h_gpu32", a.device, dtype="float32")
    ok = cpu.rc == 0 and gpu.rc == 0
    lr = losses_rel(losses(gpu), losses(cpu)) if ok else math.inf
    check("train_gpt fp32 CUDA vs CPU: every step's loss within 1e-5 relative", ok and lr <= 1e-5,
          "%s | %s | worst %.3g\n  cuda %s\n  cpu  %s" % (why(gpu), why(cpu), lr, losses(gpu), losses(cpu)))
    # (2) one linear step (AdamW epsilon 1, lr 10: the change is nearly lr * g) from the same
    # initial weights: the gradient, tensor by tensor (LayerNorm's and the biases' included)
    runs = {n: go("h_step_" + n, dev, **dict(LINEAR_STEP, **over)) for n, dev, over in
            (("w0", "cpu", {"learning_rate": 0}), ("cpu", "cpu", {}), ("gpu", a.device, {"dtype": "float32"}))}
    ok_step = all(r.rc == 0 for r in runs.values())
    gerr, _, gmed, gdet = step_errors(*(file_bytes(runs[n], "model.bin") for n in ("w0", "gpu", "cpu")),
                                      read=gpt2_bin_floats) \
        if ok_step else (math.inf, "", math.inf, " | ".join(why(r) for r in runs.values()))
    check("train_gpt fp32 CUDA vs CPU: one step's gradient within 1e-4 normwise per tensor, median within 2e-6",
          ok_step and gerr <= 1e-4 and gmed <= 2e-6, gdet)
    # (3) bf16 (the CUDA default) against the fp32 CPU run: bf16 activations, fp32 gradients
    b16 = go("h_gpu16", a.device, dtype="bfloat16")
    lr16 = losses_rel(losses(b16), losses(cpu)) if b16.rc == 0 and cpu.rc == 0 else math.inf
    check("train_gpt bf16 CUDA vs fp32 CPU: every step's loss within 2e-2 relative", lr16 <= 2e-2,
          "%s | worst %.3g\n  bf16 %s\n  cpu  %s" % (why(b16), lr16, losses(b16), losses(cpu)))
    # (4) llm.c's recompute settings (-r 1: every layer remade; -r 2: GELU and the LayerNorms)
    # train bit-identically to -r 0
    w16 = file_bytes(b16, "model.bin")
    bad = []
    for label, ck in (("-r 1", "true"), ("-r 2", "selective")):
        r = go("h_gpu16_r" + label[-1], a.device, dtype="bfloat16", gradient_checkpointing=ck)
        if not (r.rc == 0 and b16.rc == 0 and losses(r) == losses(b16) and w16 and file_bytes(r, "model.bin") == w16):
            bad.append("%s: %s; losses %s vs %s" % (label, why(r) if r.rc else "differs", losses(r), losses(b16)))
    check("train_gpt bf16: -r 1 and -r 2 losses and model.bin bit-identical to -r 0", not bad, "\n  ".join(bad))
    rows = [{"run": "fp32 vs CPU", "steps": len(losses(cpu)), "loss_rel_err": lr, "gradient_rel_err": gerr,
             "gradient_rel_err_median": gmed},
            {"run": "bf16 vs fp32 CPU", "steps": len(losses(cpu)), "loss_rel_err": lr16}]
    TABLES["train_gpt (GPT-2) on the GPU against the CPU"] = rows
    if a.tiny:
        return
    # (5) GPT-2 124M (llm.c's d12) at llm.c's T 1024, bf16, recompute off: its speed. llm.c's
    # MFU counts 6 N + 6 L C T FLOPs a token; issue 15 puts llm.c's GPT-2 runs at about 46-56%
    # MFU. Reported, not a check.
    shard = os.path.join(TMP, "data_50257.bin")
    write_shard(shard, 1024 * 16 * 12 + 1, 50257)
    slug = "h_d12"
    c = {"model": "d12", "train_data": shard, "shuffle": "false", "sequence_len": 1024, "micro_batch_size": 16,
         "gradient_accumulation_steps": 1, "max_steps": 10, "learning_rate": "6e-4", "device": a.device,
         "dtype": "bfloat16", "output_dir": os.path.join(TMP, slug), "eval_steps": 0, "sample_steps": 0,
         "save_steps": 0, "gradient_checkpointing": "false"}
    r = run(slug, c, binary=G, sample=True)
    ms = step_ms(r)
    n = 124475904  # GPT-2 124M with the vocabulary padded to 50304 (llm.c's count)
    fl = 6 * n + 6 * 12 * 768 * 1024
    tok = 16 * 1024 / (ms / 1e3) if ms < math.inf else 0
    mfu = 100 * fl * tok / 989e12
    check("train_gpt GPT-2 124M (d12), B 16, T 1024, bf16: 10 steps", r.rc == 0 and tok > 0, why(r))
    TABLES["train_gpt GPT-2 124M (d12), B 16, T 1024, bf16"] = [{
        "step_ms": round(ms, 2) if ms < math.inf else None, "tok_per_s": round(tok), "MFU_pct_of_989": round(mfu, 1),
        "counted_peak_MiB": round(peak(r, "device_peak_bytes") / 2 ** 20, 1), "nvidia_smi_peak_MiB": r.gpu_peak_mib}]
    print("train_gpt d12: %.1f ms a step, %.0f tok/s, MFU %.1f%% of 989 TFLOP/s" % (ms, tok, mfu))


def main():
    global TMP, BIN
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=["train", "modes", "sanitizer", "nccl", "memory", "gpt"])
    ap.add_argument("--shape", choices=sorted(MEM_SHAPES), default="1b", help="memory: the 1.1B shape or the 8B (QLoRA)")
    ap.add_argument("--bin", required=True, help="train_llama (gpt: train_gpt)")
    ap.add_argument("--json", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--budget", type=float, default=480, help="seconds a part may take before it stops starting runs")
    a = ap.parse_args()
    BIN = os.path.abspath(a.bin)
    TMP = tempfile.mkdtemp(prefix="llmc_gpucheck_")
    t0 = time.time()
    try:
        {"train": part_train, "modes": part_modes, "sanitizer": part_sanitizer, "nccl": part_nccl,
         "memory": part_memory, "gpt": part_gpt}[a.part](a)
    except Exception as e:  # noqa: BLE001 - reported as a failed check, not a traceback only
        import traceback
        check("%s: script error" % a.part, False, traceback.format_exc())
        del e
    finally:
        if not a.keep:
            shutil.rmtree(TMP, ignore_errors=True)
    res = {"part": a.part, "status": "pass" if CHECKS and all(c["ok"] for c in CHECKS) else "fail",
           "checks": CHECKS, "tables": TABLES, "secs": round(time.time() - t0, 1)}
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print("%s: %d passed, %d failed" % (a.part, sum(c["ok"] for c in CHECKS), sum(not c["ok"] for c in CHECKS)))
    return 0 if res["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
