#!/usr/bin/env python3
"""Part (f) of scripts/gpu_check.sh: this trainer against PyTorch + transformers (+ peft) on the
same GPU, in one run, on the same ~1B Llama shape at 4K tokens, full fine-tuning and LoRA.

  gpu_bench.py --bin build-gpu/train_llama --json J [--steps 6] [--seq 4096] [--shape 1b|small]
               [--ours-env NAME=VALUE[,NAME=VALUE] ...]   (ours again with each setting: a row each)
               [--torch-amp]   (PyTorch again with fp32 weights and moments under bf16 autocast)

Both sides: random init, bf16 weights and activations, AdamW (fp32 master + moments on our side;
PyTorch: bf16 model with torch.optim.AdamW, fused where available, so bf16 moments and no master
copy; --torch-amp adds a row with fp32 weights and moments under bf16 autocast, which is what our
side keeps), micro batch 1, sequence 4096,
gradient checkpointing OFF first; when a side runs out of memory it is retried with
checkpointing on (reported). tok/s is the median over the steps after the first two; MFU counts
6 * params * tokens + the causal attention's 6 * L * T^2 * d_model (half of the full square, fwd
+ bwd) against the H100 SXM dense bf16 datasheet peak (989 TFLOP/s) or --peak-tflops. Peak
memory: torch.cuda.max_memory_allocated for PyTorch; our metrics' device_peak_bytes (counted
allocations) and nvidia-smi's per-process peak for ours. Standard library + torch/transformers/
peft only where they are imported; a missing one turns its rows into "skipped".

--shape 8b --qlora: Llama-3.1-8B's shape, QLoRA r16 on every linear layer (ours: an NF4 base;
PyTorch: peft over a bf16 base, since bitsandbytes is not on the GPU machine). Not covered yet
(stated in the report): llm.c's own train_gpt2cu on the same GPU (scripts/gpu_check.sh gpt
times train_gpt at GPT-2 124M).

--max-context (with --shape 8b --qlora: issue 15's "a longer context on one GPU than PyTorch's
best"): the longest sequence each side trains one step at (micro batch 1), on a ladder of
doubling lengths from --ctx-start to --ctx-max, within --budget seconds for the whole ladder.
PyTorch: the model built once, gradient checkpointing on (its best on one GPU without
offloading code), one forward/backward/AdamW step per length until one runs out of memory.
Ours: per length, --plan with activation_offloading: auto and device_memory_limit: the GPU's
memory, and when a mode fits, a one-step run in the mode auto picks; the ladder stops at the
first length whose plan fits nothing, whose run fails, or that the budget cannot hold (the last
step's time times 4: attention grows as T^2). Each side's maximum is reported with why it
stopped (out of memory, the plan, the budget); the plan's own longest fitting length up to
--plan-max is reported beside it (planned, not run).
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

SHAPES = {
    # TinyLlama-1.1B's shape (Llama 2 architecture, GQA 32/4), 1.1e9 parameters
    "1b": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
               num_attention_heads=32, num_key_value_heads=4),
    # Llama-3.1-8B's shape (GQA 32/8), 8.0e9 parameters: the QLoRA benchmark (--shape 8b --qlora)
    "8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8),
    "small": dict(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4),
}


def n_params(s):
    C, I, L, V = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["vocab_size"]
    kv = C // s["num_attention_heads"] * s["num_key_value_heads"]
    per_layer = C * C * 2 + C * kv * 2 + 3 * C * I + 2 * C
    return L * per_layer + 2 * V * C + C


def flops_per_token(s, T, trainable_frac=1.0):
    N = n_params(s)
    attn = 6 * s["num_hidden_layers"] * T * s["hidden_size"]  # causal: half of 12 * L * T * d
    # LoRA: forward 2N, backward through activations 2N, weight gradients only for adapters
    return (6 * N if trainable_frac >= 1 else 4 * N) + attn


def smi_peak(pid, box, stop):
    while not stop:
        try:
            p = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=10)
            for line in p.stdout.splitlines():
                a = [x.strip() for x in line.split(",")]
                if len(a) == 2 and a[0] == str(pid):
                    box[0] = max(box[0], int(a[1]))
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.25)


# ---- PyTorch ------------------------------------------------------------------------------------

def torch_model(shape, T, lora, ckpt, dev, amp=False):
    """The PyTorch side's model (bf16, sdpa; LoRA r16 on every linear through peft) and AdamW;
    amp: fp32 weights (master), AdamW moments in fp32, bf16 compute under autocast."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(**shape, max_position_embeddings=T, torch_dtype="bfloat16", attn_implementation="sdpa",
                      tie_word_embeddings=False, use_cache=False)
    model = LlamaForCausalLM(cfg).to(device=dev, dtype=torch.float32 if amp else torch.bfloat16)
    # QLoRA on this side would need bitsandbytes (not on the GPU machine, and over the device
    # tool's carry limit as a wheel): its adapters train over a bf16 base instead, which the
    # report's "base" column says
    if lora:
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear"))
    if ckpt:
        model.gradient_checkpointing_enable()
        if lora:
            model.enable_input_require_grads()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    try:
        opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(params, lr=1e-5)
    return model, opt, params


def torch_side(shape, T, steps, lora, ckpt, dev="cuda", amp=False):
    import torch
    cuda = dev == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    model, opt, params = torch_model(shape, T, lora, ckpt, dev, amp)
    x = torch.randint(0, shape["vocab_size"], (1, T), device=dev)
    times = []
    for i in range(steps):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device_type=dev, dtype=torch.bfloat16, enabled=amp):
            out = model(input_ids=x, labels=x)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    trainable = sum(p.numel() for p in params)
    del model, opt
    if cuda:
        torch.cuda.empty_cache()
    return times, peak, trainable


def run_torch(shape, T, steps, lora, dev="cuda", amp=False):
    for ckpt in (False, True):
        try:
            times, peak, trainable = torch_side(shape, T, steps, lora, ckpt, dev, amp)
            return {"times": times, "peak": peak, "ckpt": ckpt, "trainable": trainable}
        except Exception as e:  # noqa: BLE001 - OOM: retry with checkpointing; else report
            err = "%s: %s" % (type(e).__name__, str(e)[:300])
            try:
                import torch
                torch.cuda.empty_cache()
            except Exception:  # noqa: BLE001
                pass
            if "out of memory" not in err.lower():
                return {"error": err}
    return {"error": "out of memory even with gradient checkpointing"}


# ---- ours ---------------------------------------------------------------------------------------

def write_tokens(data, n, vocab):
    import random
    import struct
    from array import array
    rng = random.Random(0)
    toks = array("H", (rng.randrange(min(vocab, 65535)) for _ in range(n)))
    with open(data, "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)) + toks.tobytes())


def ours_cfg(shape, T, steps, lora, data, out, device, extra=()):
    cfg = ["model:"] + ["  %s: %s" % kv for kv in shape.items()] + ["  max_position_embeddings: %d" % T]
    cfg += ["train_data: %s" % data, "shuffle: false", "sequence_len: %d" % T, "micro_batch_size: 1",
            "gradient_accumulation_steps: 1", "max_steps: %d" % steps, "learning_rate: 1e-5",
            "device: %s" % device, "dtype: bfloat16", "output_dir: %s" % out, "save_steps: 0"] + list(extra)
    if lora:
        cfg += ["adapter: %s" % lora] + (["load_in_4bit: true"] if lora == "qlora" else [])
        cfg += ["lora_r: 16", "lora_alpha: 32", "lora_dropout: 0.0", "lora_target_linear: true"]
    path = out + ".yaml"
    with open(path, "w") as f:
        f.write("\n".join(cfg) + "\n")
    return path


def launch(cmd, timeout, env=None):
    """Runs cmd (env: variables to add), sampling its nvidia-smi memory: (Popen, stdout, stderr,
    peak MiB or -1)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                         env=dict(os.environ, **env) if env else None)
    box, stop = [-1], []
    th = threading.Thread(target=smi_peak, args=(p.pid, box, stop), daemon=True)
    th.start()
    try:
        so, se = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        so, se = p.communicate()
        se += "\ntimed out after %d s" % timeout
    stop.append(1)
    return p, so, se, box[0]


def step_metrics(out):
    mp = os.path.join(out, "metrics.jsonl")
    ms = [json.loads(l) for l in open(mp)] if os.path.exists(mp) else []
    return [m for m in ms if "loss" in m and "ms" in m]


def run_ours(binary, shape, T, steps, lora, tmp, device="cuda", profile=False, env=None):
    data = os.path.join(tmp, "bench.bin")
    if not os.path.exists(data):
        write_tokens(data, T * (steps + 2) + 1, shape["vocab_size"])
    for ckpt in ("false", "true"):
        out = os.path.join(tmp, "ours_%s_%s" % (lora or "full", ckpt))
        path = ours_cfg(shape, T, steps, lora, data, out, device, ["gradient_checkpointing: %s" % ckpt])
        p, so, se, smi = launch([binary, "-c", path] + (["--profile"] if profile else []), 480, env)
        steps_ = step_metrics(out)
        # The run's final model and checkpoint (a 1B full run writes ~20 GB of weights, master
        # and moments) go at once: the GPU machine's disk is 64 GiB.
        shutil.rmtree(out, ignore_errors=True)
        if profile and p.returncode == 0:  # the per-op table (the trainer prints it last)
            print("our --profile (%s, grad ckpt %s%s):\n%s" % (lora or "full", ckpt, "".join(", %s=%s" % kv for kv in (env or {}).items()), so[so.rfind("\n", 0, so.rfind("profile")) + 1:][-6000:]), flush=True)
        if p.returncode == 0 and steps_:
            return {"times": [m["ms"] / 1e3 for m in steps_], "peak": max(m.get("device_peak_bytes", 0) for m in steps_),
                    "smi_peak_mib": smi, "ckpt": ckpt == "true"}
        err = (se.strip().splitlines() or ["rc %d" % p.returncode])[-1]
        if "memory" not in err:
            return {"error": err[:400]}
    return {"error": "out of device memory even with gradient checkpointing: " + err[:300]}


def summarize(side, res, shape, T, lora, peak_tflops):
    if "error" in res:
        return {"side": side, "lora": lora, "status": "error", "detail": res["error"]}
    t = res["times"][2:] or res["times"]
    step = statistics.median(t)
    tok_s = T / step
    fl = flops_per_token(shape, T, 0.0 if lora else 1.0) * tok_s
    base = ("NF4" if side.startswith("ours") else "bf16 (no bitsandbytes)") if lora == "qlora" else \
        "fp32 master, bf16 autocast" if "amp" in side else "bf16"
    return {"side": side, "lora": lora, "base": base, "status": "ok", "tok_per_s": round(tok_s, 1), "step_ms": round(step * 1e3, 1),
            "MFU_pct": round(100 * fl / (peak_tflops * 1e12), 1), "peak_GiB": round(res["peak"] / 2 ** 30, 2),
            "smi_peak_GiB": round(res.get("smi_peak_mib", -1) / 1024, 2) if res.get("smi_peak_mib", -1) > 0 else None,
            "grad_ckpt": res["ckpt"]}


# ---- --max-context -------------------------------------------------------------------------------

def ladder(start, stop):
    T, out = start, []
    while T <= stop:
        out.append(T)
        T *= 2
    return out


def device_gib(dev):
    if dev != "cuda":
        return 64  # a stand-in budget for a CPU test of the script
    try:
        import torch
        return torch.cuda.get_device_properties(0).total_memory / 2 ** 30
    except Exception:  # noqa: BLE001
        p = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                           capture_output=True, text=True)
        return int(p.stdout.split()[0]) / 1024


def torch_max_context(shape, lora, lengths, dev, deadline):
    """One step at each length, ascending, one model: [(T, row)], and why the ladder stopped."""
    import torch
    cuda = dev == "cuda"
    model, opt, _ = torch_model(shape, max(lengths), lora, True, dev)
    rows, why, last = [], "the ladder's end", None
    for T in lengths:
        if last is not None and time.time() + 4 * last > deadline:
            why = "the budget (the next length's step would not fit)"
            break
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        x = torch.randint(0, shape["vocab_size"], (1, T), device=dev)
        t0 = time.time()
        try:
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - out of memory ends the ladder
            opt.zero_grad(set_to_none=True)
            msg = "%s: %s" % (type(e).__name__, str(e)[:200])
            why = "out of memory at %d" % T if "out of memory" in msg.lower() else "error at %d: %s" % (T, msg)
            break
        last = time.time() - t0
        rows.append({"side": "pytorch", "T": T, "step_s": round(last, 2),
                     "peak_GiB": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2) if cuda else None,
                     "mode": "gradient checkpointing"})
        print(json.dumps(rows[-1]), flush=True)
    del model, opt
    if cuda:
        torch.cuda.empty_cache()
    return rows, why


def plan_row(binary, path):
    """The mode activation_offloading: auto picks under --plan, and its device peak: (mode, text) or None."""
    p = subprocess.run([binary, "-c", path, "--plan"], capture_output=True, text=True, errors="replace", timeout=120)
    fits = [l for l in p.stdout.splitlines() if l.startswith("|") and l.rstrip().endswith("yes |")]
    if p.returncode != 0 or not fits:
        return None
    est = lambda l: float(l.split("|")[-3])  # noqa: E731 - est. ms, the plan's second-to-last column
    best = min(fits, key=est)
    return best.split("|")[1].strip(), est(best)


def ours_max_context(binary, shape, lora, lengths, dev, deadline, tmp, plan_max):
    lim = "%dGiB" % int(device_gib(dev))
    extra = ["activation_offloading: auto", "device_memory_limit: %s" % lim]
    data = os.path.join(tmp, "ctx.bin")
    write_tokens(data, max(lengths) + 1, shape["vocab_size"])
    rows, why, last = [], "the ladder's end", None
    for T in lengths:
        out = os.path.join(tmp, "ctx_%d" % T)
        path = ours_cfg(shape, T, 1, lora, data, out, dev, extra)
        pr = plan_row(binary, path)
        if pr is None:
            why = "the plan: nothing fits at %d under %s" % (T, lim)
            break
        if last is not None and time.time() + 4 * last > deadline:
            why = "the budget (the next length's step would not fit)"
            break
        t0 = time.time()
        p, so, se, smi = launch([binary, "-c", path], max(60, int(deadline - time.time())))
        st = step_metrics(out)
        shutil.rmtree(out, ignore_errors=True)
        if p.returncode != 0 or not st:
            why = "a failed run at %d: %s" % (T, (se.strip().splitlines() or ["rc %d" % p.returncode])[-1][:300])
            break
        last = time.time() - t0
        rows.append({"side": "ours", "T": T, "step_s": round(st[0]["ms"] / 1e3, 2), "run_s": round(last, 1),
                     "peak_GiB": round(st[0].get("device_peak_bytes", 0) / 2 ** 30, 2),
                     "smi_peak_GiB": round(smi / 1024, 2) if smi > 0 else None,
                     "mode": "plan's pick: %s (est. %.0f ms)" % pr})
        print(json.dumps(rows[-1]), flush=True)
    # the plan alone, on up to plan_max (nothing run)
    planned = None
    for T in ladder(lengths[0], plan_max):
        path = ours_cfg(shape, T, 1, lora, data, os.path.join(tmp, "plan_%d" % T), dev, extra)
        if plan_row(binary, path) is None:
            break
        planned = T
    return rows, why, planned


def max_context(a, shape, tmp):
    lengths = ladder(a.ctx_start, a.ctx_max)
    lora = "qlora" if a.qlora else False
    t0 = time.time()
    half = t0 + a.budget / 2
    res = {"part": "max-context", "shape": a.shape, "adapter": lora or "full", "lengths": lengths, "budget_s": a.budget}
    if a.only != "torch":
        rows, why, planned = ours_max_context(os.path.abspath(a.bin), shape, lora, lengths, a.device,
                                              half if a.only != "ours" else t0 + a.budget, tmp, a.plan_max)
        res["ours"] = {"rows": rows, "max_T": max((r["T"] for r in rows), default=0), "stopped_by": why,
                       "planned_max_T": planned}
    if a.only != "ours":
        try:
            rows, why = torch_max_context(shape, lora, lengths, a.device, t0 + a.budget)
        except Exception as e:  # noqa: BLE001 - no torch, or the model does not fit at all
            rows, why = [], "%s: %s" % (type(e).__name__, str(e)[:300])
        res["pytorch"] = {"rows": rows, "max_T": max((r["T"] for r in rows), default=0), "stopped_by": why,
                          "base": "bf16 (no bitsandbytes)" if lora == "qlora" else "bf16"}
    res["secs"] = round(time.time() - t0, 1)
    sides = [k for k in ("ours", "pytorch") if k in res]
    ok = all(res[k]["max_T"] > 0 for k in sides)
    res["status"] = "pass" if ok else "fail"
    res["tables"] = {  # what gpu_check.sh's report prints
        "longest context on one GPU (%s, %s): each side's maximum" % (a.shape, lora or "full"):
            [{"side": k, "longest_T_trained": res[k]["max_T"], "stopped_by": res[k]["stopped_by"],
              "planned_longest_T": res[k].get("planned_max_T", "-")} for k in sides],
        "one step at each length": [r for k in sides for r in res[k]["rows"]]}
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print("| side | longest T trained (one step) | stopped by | planned longest T |")
    for k in ("ours", "pytorch"):
        if k in res:
            print("| %s | %d | %s | %s |" % (k, res[k]["max_T"], res[k]["stopped_by"], res[k].get("planned_max_T", "-")))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--only", choices=["ours", "torch"], default=None)
    ap.add_argument("--qlora", action="store_true", help="QLoRA r16 only (ours: NF4 base; PyTorch: LoRA over bf16)")
    ap.add_argument("--profile", action="store_true", help="run ours with --profile and print its per-op table")
    ap.add_argument("--device", default="cuda", help="both sides' device (cpu: to test this script without a GPU)")
    ap.add_argument("--ours-env", action="append", default=[], metavar="NAME=VALUE[,NAME=VALUE...]",
                    help="also run ours with these variables set (repeatable; each its own row, e.g. "
                         "LLMC_ATT_BWD_ONE_GRID=1 or LLMC_ATT_KV_SPLIT=8,LLMC_ATT_BWD_ONE_GRID=1), to "
                         "compare kernel variants in one call")
    ap.add_argument("--torch-amp", action="store_true",
                    help="also PyTorch with fp32 weights and AdamW moments under bf16 autocast (our numerics: "
                         "an fp32 master copy), a row beside its pure-bf16 one")
    ap.add_argument("--max-context", action="store_true", help="the longest sequence each side trains one step at")
    ap.add_argument("--ctx-start", type=int, default=8192)
    ap.add_argument("--ctx-max", type=int, default=262144)
    ap.add_argument("--plan-max", type=int, default=1048576, help="--max-context: plan (not run) up to this length")
    ap.add_argument("--budget", type=float, default=540, help="--max-context: seconds for both ladders")
    a = ap.parse_args()
    if a.max_context and not 1 <= a.ctx_start <= a.ctx_max:
        ap.error("--ctx-start must be at least 1 and at most --ctx-max")
    for v in a.ours_env:
        if not all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=[^,]*", x) for x in v.split(",")):
            ap.error("--ours-env %r: expected NAME=VALUE[,NAME=VALUE...]" % v)
    a.ours_variants = [(None, None)] + [(v, dict(x.split("=", 1) for x in v.split(","))) for v in a.ours_env]
    shape, T = SHAPES[a.shape], a.seq
    tmp = tempfile.mkdtemp(prefix="llmc_bench_")
    try:
        if a.max_context:
            return max_context(a, shape, tmp)
        return bench(a, shape, T, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def bench(a, shape, T, tmp):
    rows = []
    t0 = time.time()
    try:
        import torch  # noqa: F401
        have_torch = torch.cuda.is_available() or a.device == "cpu"
    except Exception:  # noqa: BLE001
        have_torch = False
    for lora in (["qlora"] if a.qlora else [False, "lora"]):
        if a.only != "torch":
            for v, env in a.ours_variants:
                rows.append(summarize("ours" + (" " + v if v else ""), run_ours(os.path.abspath(a.bin), shape, T, a.steps, lora, tmp,
                                                                               a.device, a.profile, env), shape, T, lora, a.peak_tflops))
                print(json.dumps(rows[-1]), flush=True)
        if a.only != "ours":
            for amp in [False] + ([True] if a.torch_amp else []):
                side = "pytorch amp (fp32 master)" if amp else "pytorch"
                if have_torch:
                    rows.append(summarize(side, run_torch(shape, T, a.steps, lora, a.device, amp), shape, T, lora,
                                          a.peak_tflops))
                else:
                    rows.append({"side": side, "lora": lora, "status": "skipped", "detail": "torch with CUDA not importable"})
                print(json.dumps(rows[-1]), flush=True)
    res = {"part": "bench", "shape": a.shape, "params": n_params(shape), "seq": T, "steps": a.steps,
           "peak_tflops": a.peak_tflops, "rows": rows, "secs": round(time.time() - t0, 1),
           "not_covered": ["llm.c's own train_gpt2cu on the same GPU (gpu_check part gpt times train_gpt at GPT-2 124M)"],
           "status": "pass" if rows and all(r["status"] in ("ok", "skipped") for r in rows) else "fail"}
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)
    print("| side | LoRA | tok/s | step ms | MFU % | peak GiB | nvidia-smi GiB | grad ckpt |")
    for r in rows:
        if r["status"] == "ok":
            print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (r["side"], r["lora"], r["tok_per_s"], r["step_ms"],
                                                            r["MFU_pct"], r["peak_GiB"], r["smi_peak_GiB"], r["grad_ckpt"]))
        else:
            print("| %s | %s | %s: %s |" % (r["side"], r["lora"], r["status"], r.get("detail", "")))
    return 0 if res["status"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
