#!/usr/bin/python3
"""LoRA end to end: ./train_llama with adapter: lora against the float64 PyTorch reference
(test/llama_ref.py, PEFT semantics y = W x (+ b) + scale * B(A(x))).

    /usr/bin/python3 test/test_lora_ref.py --bin build/train_llama

Each case builds a tiny random model (HF dir), a token shard and, where it says so, a random
adapter with A and B both nonzero written in PEFT layout (lora_model_dir), runs the trainer and
checks:
  all_linear_untied   every projection adapted, untied head, GQA, grad accumulation, clipping,
                      warmup, weight decay: per-step loss (1e-5 rel), lr, grad_norm (1e-4) and
                      the final adapter_model.safetensors (1e-4) match the reference; the base
                      model is untouched and no model.safetensors is written.
  subset_rslora_qwen2 targets as a YAML list, adapter_config listing them in another order,
                      tied head, use_rslora, Qwen2 q/k/v biases.
  merge_lora          targets via --set (comma-separated); output_dir/merged/model.safetensors is the
                      merged W + scale * B @ A: the reference without adapter on it gives the
                      loss of base + adapter; untouched tensors are bit-identical; config.json.
  fresh_adapter_eval  no lora_model_dir: the seeded init (A in +-1/sqrt(in), B = 0) leaves the
                      first loss at the base model's; training from it matches the reference; the
                      saved adapter read back by the reference predicts the loss the trainer
                      reports for the next step.
  resume_adapter      4 steps with save_steps 2 (lora_dropout 0.1) vs resuming from
                      checkpoint-2: steps 3-4 identical, final adapters byte-identical; the
                      checkpoint holds adapter files, adapter-only optimizer moments, no base.
  memory_modes        full recompute every 2nd layer + tiled MLP + layer_offloading, and
                      selective recompute + activation offloading, match the reference.
  dropout_tiled_mlp   lora_dropout 0.3: tiled_mlp (4 tiles) gives the untiled run's losses and
                      grad norms bit for bit.
  bad_*               refused with exit 1 and one 'error:' line naming the culprit.

--perturb-lr X / --perturb-alpha X change what the candidate trainer is given (to see the
test fail). Prints PASS/FAIL per case and "N passed, M failed"; exits 1 on any failure.
"""
import argparse
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import llama_ref as R  # noqa: E402

LOSS_RTOL = 1e-5
LR_RTOL = 1e-6
GN_RTOL = 1e-4
W_TOL = 1e-4
ALL = list(R.LORA_TARGETS)

ARGS = None


# ---------------------------------------------------------------------------------------------
# helpers

def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def setup(work, cfg, n_tokens, seed, **init):
    """Model dir, shard and tokens for a case; init: extra R.init_weights arguments."""
    os.makedirs(work, exist_ok=True)
    init.setdefault("qk_std", 0.25)  # attention far from uniform
    weights = R.init_weights(cfg, seed=seed, **init)
    model_dir = os.path.join(work, "model")
    R.save_hf_dir(model_dir, cfg, weights)
    shard = os.path.join(work, "train.bin")
    R.write_shard(shard, R.random_tokens(n_tokens, cfg["vocab_size"], seed=seed), version=1)
    return model_dir, shard, R.read_shard(shard), weights


def lora_keys(spec, targets=None, target_linear=False, model_dir=None):
    """The YAML adapter keys for a spec (targets default to the spec's, as a YAML list)."""
    d = {"adapter": "lora", "lora_r": spec["r"], "lora_alpha": spec["lora_alpha"],
         "lora_dropout": spec.get("lora_dropout", 0.0), "use_rslora": spec["use_rslora"]}
    if target_linear:
        d["lora_target_linear"] = True
    else:
        d["lora_target_modules"] = list(targets if targets is not None else spec["target_modules"])
    if model_dir:
        d["lora_model_dir"] = model_dir
    return d


def perturbed(tc):
    """What the candidate trainer gets: tc with the --perturb-* options applied."""
    tc = dict(tc)
    if ARGS.perturb_lr != 1.0:
        tc["learning_rate"] = tc["learning_rate"] * ARGS.perturb_lr
    if ARGS.perturb_alpha != 1.0 and "lora_alpha" in tc:
        tc["lora_alpha"] = tc["lora_alpha"] * ARGS.perturb_alpha
        if tc.get("lora_model_dir"):  # the adapter's config must agree, or the load refuses
            p = os.path.join(tc["lora_model_dir"], "adapter_config.json")
            with open(p) as f:
                c = json.load(f)
            c["lora_alpha"] = tc["lora_alpha"]
            with open(p, "w") as f:
                json.dump(c, f)
    return tc


def run_trainer(work, tc, sets=(), name="cfg.yaml", check=True):
    """Runs the binary; returns (returncode, stdout, stderr)."""
    yaml_path = os.path.join(work, name)
    R.write_yaml(yaml_path, tc)
    cmd = [ARGS.bin, "-c", yaml_path]
    for s in sets:
        cmd += ["--set", s]
    if ARGS.threads is not None:
        cmd += ["--set", f"num_threads={ARGS.threads}"]
    p = subprocess.run(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=ARGS.timeout)
    out = p.stdout.decode("utf-8", "replace")
    err = p.stderr.decode("utf-8", "replace")
    if check and p.returncode != 0:
        raise RuntimeError(f"trainer exit {p.returncode}; stderr: {err.strip()[-600:]}; "
                           f"stdout tail: {' | '.join(out.splitlines()[-4:])}")
    return p.returncode, out, err


def rows_by_step(output_dir):
    return {int(r["step"]): r for r in R.read_metrics(os.path.join(output_dir, "metrics.jsonl"))}


def compare_rows(by_step, ref, steps, errs, gn=True):
    """Trainer's metrics (by step) against the reference's per-step lists (index step-1)."""
    got = sorted(by_step)
    if got != list(steps):
        errs.append(f"metrics.jsonl train steps {got}, expected {list(steps)}")
    worst = 0.0
    for s in steps:
        if s not in by_step:
            continue
        r = by_step[s]
        if not all(isinstance(r.get(k), (int, float)) and math.isfinite(r[k])
                   for k in ("loss", "lr", "grad_norm")):
            errs.append(f"step {s}: loss/lr/grad_norm missing or not finite: {r}")
            continue
        rl, rlr, rg = ref["losses"][s - 1], ref["lrs"][s - 1], ref["grad_norms"][s - 1]
        e = rel(r["loss"], rl)
        worst = max(worst, e)
        if e > LOSS_RTOL:
            errs.append(f"step {s}: loss {r['loss']:.9g} vs ref {rl:.9g} (rel {e:.2e})")
        if (rlr == 0 and abs(r["lr"]) > 1e-12) or (rlr != 0 and rel(r["lr"], rlr) > LR_RTOL):
            errs.append(f"step {s}: lr {r['lr']:.9g} vs ref {rlr:.9g}")
        if gn and rel(r["grad_norm"], rg) > GN_RTOL:
            errs.append(f"step {s}: grad_norm {r['grad_norm']:.9g} vs ref {rg:.9g} "
                        f"(rel {rel(r['grad_norm'], rg):.2e})")
    return worst


def compare_tensors(got, ref, errs, what, tol_rel=W_TOL):
    """max |got - ref| <= tol_rel * max(1, max|ref|) per tensor; the same names."""
    if set(got) != set(ref):
        errs.append(f"{what}: tensors differ: missing {sorted(set(ref) - set(got))[:4]}, "
                    f"extra {sorted(set(got) - set(ref))[:4]}")
    nbad, worst = 0, 0.0
    for k in ref:
        if k not in got:
            continue
        a, b = np.asarray(got[k], dtype=np.float64), np.asarray(ref[k], dtype=np.float64)
        if a.shape != b.shape:
            errs.append(f"{what}: {k}: shape {a.shape} vs {b.shape}")
            continue
        d = float(np.max(np.abs(a - b))) if a.size else 0.0
        if not math.isfinite(d):
            d = float("inf")
        tol = tol_rel * max(1.0, float(np.max(np.abs(b))))
        worst = max(worst, d / tol)
        if d > tol:
            nbad += 1
            if nbad <= 3:
                errs.append(f"{what}: {k}: max abs diff {d:.3e} > tol {tol:.1e}")
    if nbad > 3:
        errs.append(f"{what}: {nbad} tensors over tolerance in all")
    return worst


def read_trainer_adapter(d, errs, spec=None, targets=None):
    """Reads a PEFT dir written by the trainer and checks its adapter_config.json."""
    a = R.load_adapter_dir(d)
    conf = a["config"]
    if conf.get("task_type") != "CAUSAL_LM" or conf.get("bias") != "none":
        errs.append(f"{d}/adapter_config.json: task_type {conf.get('task_type')!r}, "
                    f"bias {conf.get('bias')!r}")
    if spec is not None:
        for k in ("r", "lora_alpha", "use_rslora"):
            if conf.get(k) != spec[k]:
                errs.append(f"{d}/adapter_config.json: {k} {conf.get(k)!r}, expected {spec[k]!r}")
        want = targets if targets is not None else spec["target_modules"]
        if sorted(conf.get("target_modules") or []) != sorted(want):
            errs.append(f"{d}/adapter_config.json: target_modules {conf.get('target_modules')}, "
                        f"expected {sorted(want)}")
    return a


def expect_clip(ref, mgn, errs, notes):
    n = sum(g > mgn for g in ref["grad_norms"])
    if n == 0 or n == len(ref["grad_norms"]):
        errs.append(f"test setup: clipping should be active on some steps, not all; "
                    f"grad_norms {['%.3g' % g for g in ref['grad_norms']]} vs {mgn}")
    else:
        notes.append(f"clipped {n}/{len(ref['grad_norms'])}")


def moved(ref_adapter, start, errs):
    """Sanity: the reference's adapters changed by far more than the tolerance."""
    d = max(float(np.max(np.abs(ref_adapter[k] - start[k]))) for k in start)
    if d < 100 * W_TOL:
        errs.append(f"test setup: adapters moved only {d:.2e}")
    return d


# ---------------------------------------------------------------------------------------------
# cases

def case_all_linear_untied(root):
    work = os.path.join(root, "all_linear")
    cfg = R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    model_dir, shard, tokens, weights = setup(work, cfg, 1000, seed=11)
    spec = R.lora_spec(cfg, r=4, alpha=8, targets=ALL, seed=11)
    R.save_adapter_dir(os.path.join(work, "adapter_in"), spec)
    base_hash = sha(os.path.join(model_dir, "model.safetensors"))
    tc = R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=2,
                        max_steps=5, learning_rate=5e-3, lr_scheduler="cosine", warmup_steps=2,
                        weight_decay=0.1, max_grad_norm=0.095)
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
    tc.update(lora_keys(spec, target_linear=True, model_dir=os.path.join(work, "adapter_in")))
    ref = R.train_reference(cfg, weights, tokens, tc, lora=spec)
    errs, notes = [], []
    expect_clip(ref, tc["max_grad_norm"], errs, notes)
    run_trainer(work, perturbed(tc))
    out = tc["output_dir"]
    wl = compare_rows(rows_by_step(out), ref, range(1, 6), errs)
    got = read_trainer_adapter(out, errs, spec)
    ww = compare_tensors(got["weights"], ref["adapter"], errs, "final adapter")
    mv = moved(ref["adapter"], spec["weights"], errs)
    for f in ("model.safetensors", "config.json"):
        if os.path.exists(os.path.join(out, f)):
            errs.append(f"output_dir has {f} without merge_lora")
    if os.path.exists(os.path.join(out, "checkpoint-5", "model.safetensors")):
        errs.append("checkpoint-5 holds model.safetensors")
    if sha(os.path.join(model_dir, "model.safetensors")) != base_hash:
        errs.append("the base model file changed")
    return errs, (f"loss rel {wl:.1e}, adapter worst {ww:.2f} of tol, moved {mv:.1e}, "
                  + ", ".join(notes))


def case_modules_to_save(root):
    """lora_modules_to_save [embed_tokens, lm_head] (PEFT's modules_to_save): both train whole
    beside the adapters (grad norm, clipping, AdamW with decay), saved in the adapter file
    under PEFT's names; resuming from lora_model_dir with them continues the reference."""
    work = os.path.join(root, "modules_to_save")
    cfg = R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    model_dir, shard, tokens, weights = setup(work, cfg, 1000, seed=13)
    spec = R.lora_spec(cfg, r=4, alpha=8, targets=["q_proj", "v_proj", "down_proj"], seed=13, b_std=0.05)
    # The start adapter as PEFT saves one with modules_to_save: their weights (here the base's)
    # beside the adapters, the list in adapter_config.json.
    start = dict(spec, weights=dict(spec["weights"]))
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        start["weights"][k] = weights[k]
    ain = os.path.join(work, "adapter_in")
    R.save_adapter_dir(ain, start, target_order=spec["target_modules"])
    conf = json.load(open(os.path.join(ain, "adapter_config.json")))
    conf["modules_to_save"] = ["embed_tokens", "lm_head"]
    json.dump(conf, open(os.path.join(ain, "adapter_config.json"), "w"))
    tc = R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=2,
                        max_steps=5, learning_rate=5e-3, lr_scheduler="cosine", warmup_steps=2,
                        weight_decay=0.1, max_grad_norm=1.0)
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
    tc.update(lora_keys(spec, model_dir=ain))
    tc["lora_modules_to_save"] = ["embed_tokens", "lm_head"]
    ref = R.train_reference(cfg, weights, tokens, tc, lora=spec)
    errs = []
    run_trainer(work, perturbed(tc))
    out = tc["output_dir"]
    wl = compare_rows(rows_by_step(out), ref, range(1, 6), errs)
    got = read_trainer_adapter(out, errs, spec)
    if got["config"].get("modules_to_save") != ["embed_tokens", "lm_head"]:
        errs.append("adapter_config.json modules_to_save %r" % got["config"].get("modules_to_save"))
    raw = R.read_safetensors(os.path.join(out, "adapter_model.safetensors"))
    saved = {}
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        v = raw.get("base_model.model." + k)
        if v is None:
            errs.append("adapter_model.safetensors lacks base_model.model." + k)
        else:
            saved[k] = v
    ww = compare_tensors({k: v for k, v in got["weights"].items() if ".lora_" in k}, ref["adapter"], errs,
                         "final adapter")
    if saved:
        compare_tensors(saved, {k: ref["weights"][k] for k in saved}, errs, "final embed_tokens/lm_head")
    d = max(float(np.max(np.abs(ref["weights"][k] - weights[k]))) for k in saved) if saved else 0
    if d < 100 * W_TOL:
        errs.append(f"test setup: embed_tokens/lm_head moved only {d:.2e}")
    return errs, f"loss rel {wl:.1e}, adapter worst {ww:.2f} of tol, embed/head moved {d:.1e}"


def case_subset_rslora_qwen2(root):
    work = os.path.join(root, "subset")
    cfg = R.make_config(vocab_size=80, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                        attention_bias=True, model_type="qwen2", rms_norm_eps=1e-6)
    # a tied head with the default embed_std 0.5 starts at loss ~22: keep the logits sane
    model_dir, shard, tokens, weights = setup(work, cfg, 1200, seed=22, embed_std=0.1)
    targets = ["q_proj", "v_proj", "down_proj"]
    spec = R.lora_spec(cfg, r=4, alpha=6, targets=targets, use_rslora=True, seed=22, b_std=0.2)
    # PEFT stores target_modules as a set: any order must do
    R.save_adapter_dir(os.path.join(work, "adapter_in"), spec,
                       target_order=["down_proj", "v_proj", "q_proj"])
    tc = R.train_config(sequence_len=17, micro_batch_size=2, gradient_accumulation_steps=1,
                        max_steps=5, learning_rate=5e-3, lr_scheduler="linear", warmup_steps=1,
                        weight_decay=0.05, max_grad_norm=1.0)
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
    # the trainer's YAML lists them in yet another order
    tc.update(lora_keys(spec, targets=["v_proj", "down_proj", "q_proj"],
                        model_dir=os.path.join(work, "adapter_in")))
    ref = R.train_reference(cfg, weights, tokens, tc, lora=spec)
    errs = []
    run_trainer(work, perturbed(tc))
    out = tc["output_dir"]
    wl = compare_rows(rows_by_step(out), ref, range(1, 6), errs)
    got = read_trainer_adapter(out, errs, spec)
    ww = compare_tensors(got["weights"], ref["adapter"], errs, "final adapter")
    mv = moved(ref["adapter"], spec["weights"], errs)
    # rslora matters here: alpha/sqrt(r) = 3 vs alpha/r = 1.5
    x = R.step_batches(tokens, 2, 17, 1, 1)
    plain = dict(spec, use_rslora=False)
    l_rs, l_plain = R.batch_loss(cfg, weights, x, lora=spec), R.batch_loss(cfg, weights, x, lora=plain)
    if rel(l_rs, l_plain) < 1e-3:
        errs.append(f"test setup: use_rslora barely changes the loss ({l_rs} vs {l_plain})")
    if os.path.exists(os.path.join(out, "model.safetensors")):
        errs.append("output_dir has model.safetensors without merge_lora")
    return errs, f"loss rel {wl:.1e}, adapter worst {ww:.2f} of tol, moved {mv:.1e}"


def case_merge_lora(root):
    work = os.path.join(root, "merge")
    cfg = R.make_config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=1, attention_bias=True)
    model_dir, shard, tokens, weights = setup(work, cfg, 800, seed=33)
    targets = ["k_proj", "o_proj", "gate_proj", "up_proj"]
    spec = R.lora_spec(cfg, r=2, alpha=5, targets=targets, seed=33, b_std=0.3)
    R.save_adapter_dir(os.path.join(work, "adapter_in"), spec)
    tc = R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=2,
                        max_steps=3, learning_rate=5e-3, lr_scheduler="cosine", warmup_steps=1,
                        weight_decay=0.1, max_grad_norm=1.0, merge_lora=True)
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
    keys = lora_keys(spec, model_dir=os.path.join(work, "adapter_in"))
    del keys["lora_target_modules"]  # given on the command line instead
    tc.update(keys)
    ref = R.train_reference(cfg, weights, tokens, tc, lora=spec)
    errs = []
    run_trainer(work, perturbed(tc), sets=["lora_target_modules=" + ",".join(targets)])
    out = tc["output_dir"]
    wl = compare_rows(rows_by_step(out), ref, range(1, 4), errs)
    # Axolotl's layout: the adapter at the top, the merged model (alone) in merged/.
    for f in ("merged/model.safetensors", "merged/config.json", "adapter_model.safetensors",
              "adapter_config.json"):
        if not os.path.exists(os.path.join(out, f)):
            errs.append(f"output_dir lacks {f}")
    for f in ("model.safetensors", "merged/adapter_config.json"):
        if os.path.exists(os.path.join(out, f)):
            errs.append(f"output_dir has {f}: from_pretrained would load base + adapter")
    if errs:
        return errs, ""
    got = read_trainer_adapter(out, errs, spec)
    compare_tensors(got["weights"], ref["adapter"], errs, "final adapter")
    merged = R.read_safetensors(os.path.join(out, "merged", "model.safetensors"))
    # the merge of the trainer's own adapter, in float64
    want = R.merge_lora(cfg, weights, got)
    wm = compare_tensors(merged, want, errs, "merged model", tol_rel=1e-5)
    adapted = {R.lora_module(i, t) + ".weight" for i in range(2) for t in targets}
    for k, v in weights.items():
        if k not in adapted and k in merged and not np.array_equal(merged[k], v):
            errs.append(f"merged model: {k} is not adapted but differs from the base")
    # evaluated without an adapter it gives the loss of base + adapter
    batch = [(torch.from_numpy(b[:, :-1].copy()), torch.from_numpy(b[:, 1:].copy()))
             for b in [R.random_tokens(2 * 21, 64, seed=99).reshape(2, 21)]]
    l_merged = R.batch_loss(cfg, merged, batch)
    l_adapter = R.batch_loss(cfg, weights, batch, lora=got)
    l_base = R.batch_loss(cfg, weights, batch)
    if rel(l_merged, l_adapter) > LOSS_RTOL:
        errs.append(f"merged model loss {l_merged:.9g} vs base+adapter {l_adapter:.9g} "
                    f"(rel {rel(l_merged, l_adapter):.2e})")
    if rel(l_adapter, l_base) < 1e-3:
        errs.append(f"test setup: the adapter barely changes the loss ({l_adapter} vs {l_base})")
    with open(os.path.join(out, "merged", "config.json")) as f:
        c = json.load(f)
    for k in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "tie_word_embeddings",
              "attention_bias"):
        if c.get(k) != cfg[k]:
            errs.append(f"config.json: {k} {c.get(k)!r}, expected {cfg[k]!r}")
    return errs, (f"loss rel {wl:.1e}, merged worst {wm:.2f} of tol, losses merged "
                  f"{l_merged:.6f} adapter {l_adapter:.6f} base {l_base:.6f}")


def case_fresh_adapter_eval(root):
    work = os.path.join(root, "fresh")
    cfg = R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    model_dir, shard, tokens, weights = setup(work, cfg, 1000, seed=44)
    B, T, accum, N = 2, 16, 2, 3
    # constant after a 1-step warmup: the first N steps do not depend on max_steps, and the
    # first step's lr is 0, so checkpoint-1 holds the initial adapter
    tc = R.train_config(sequence_len=T, micro_batch_size=B, gradient_accumulation_steps=accum,
                        max_steps=N, learning_rate=5e-3, lr_scheduler="constant_with_warmup", warmup_steps=1,
                        weight_decay=0.1, max_grad_norm=1.0, save_steps=1, seed=7)
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out3"))
    tc.update({"adapter": "lora", "lora_r": 4, "lora_alpha": 4, "lora_dropout": 0.0,
               "lora_target_linear": True})
    errs = []
    run_trainer(work, perturbed(tc))
    init = R.load_adapter_dir(os.path.join(tc["output_dir"], "checkpoint-1"))
    shapes = R.lora_shapes(cfg, 4, ALL)
    if set(init["weights"]) != set(shapes):
        errs.append(f"checkpoint-1 adapter tensors {sorted(init['weights'])[:3]}...")
        return errs, ""
    for k, a in init["weights"].items():
        if ".lora_B." in k and np.any(a != 0):
            errs.append(f"initial {k} is not zero")
        if ".lora_A." in k:
            bound = 1.0 / math.sqrt(shapes[k][1])
            if np.max(np.abs(a)) > bound * (1 + 1e-6) or np.std(a) < 0.4 * bound:
                errs.append(f"initial {k}: max|a| {np.max(np.abs(a)):.3g}, std {np.std(a):.3g}; "
                            f"expected uniform(+-{bound:.3g})")
    by3 = rows_by_step(tc["output_dir"])
    # B = 0: the first loss is the base model's
    l_base = R.batch_loss(cfg, weights, R.step_batches(tokens, B, T, accum, 1))
    if 1 in by3 and rel(by3[1]["loss"], l_base) > LOSS_RTOL:
        errs.append(f"step 1 loss {by3[1]['loss']:.9g} vs base model {l_base:.9g}")
    # training from that initial adapter matches the reference
    ref = R.train_reference(cfg, weights, tokens, tc, lora=init)
    wl = compare_rows(by3, ref, range(1, N + 1), errs)
    got = read_trainer_adapter(tc["output_dir"], errs, init)
    compare_tensors(got["weights"], ref["adapter"], errs, "final adapter")
    # the saved adapter, read back by the reference, predicts the trainer's step N+1 loss
    tc4 = dict(tc, max_steps=N + 1, save_steps=0, output_dir=os.path.join(work, "out4"))
    run_trainer(work, perturbed(tc4), name="cfg4.yaml")
    by4 = rows_by_step(tc4["output_dir"])
    predicted = R.batch_loss(cfg, weights, R.step_batches(tokens, B, T, accum, N + 1), lora=got)
    if N + 1 not in by4:
        errs.append(f"the {N + 1}-step run logged steps {sorted(by4)}")
    else:
        e = rel(by4[N + 1]["loss"], predicted)
        if e > LOSS_RTOL:
            errs.append(f"step {N + 1} loss {by4[N + 1]['loss']:.9g} vs the reference with the "
                        f"saved {N}-step adapter {predicted:.9g} (rel {e:.2e})")
        for s in range(1, N + 1):
            if by4.get(s, {}).get("loss") != by3.get(s, {}).get("loss"):
                errs.append(f"step {s}: loss differs between the {N}- and {N + 1}-step runs")
    return errs, f"loss rel {wl:.1e}, base loss {l_base:.6f}, step {N + 1} predicted {predicted:.6f}"


def case_resume_adapter(root):
    work = os.path.join(root, "resume")
    cfg = R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    model_dir, shard, tokens, weights = setup(work, cfg, 1000, seed=55)
    targets = ["q_proj", "k_proj", "gate_proj"]
    spec = R.lora_spec(cfg, r=3, alpha=6, targets=targets, seed=55, dropout=0.1)
    R.save_adapter_dir(os.path.join(work, "adapter_in"), spec)
    tc = R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=2,
                        max_steps=4, learning_rate=5e-3, lr_scheduler="cosine", warmup_steps=1,
                        weight_decay=0.1, max_grad_norm=1.0, save_steps=2)
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "outA"))
    tc.update(lora_keys(spec, model_dir=os.path.join(work, "adapter_in")))
    errs = []
    tc = perturbed(tc)
    run_trainer(work, tc, name="a.yaml")
    ck = os.path.join(tc["output_dir"], "checkpoint-2")
    have = sorted(os.listdir(ck)) if os.path.isdir(ck) else []
    want = ["adapter_config.json", "adapter_model.safetensors", "optimizer.safetensors",
            "trainer_state.json"]
    if have != want:
        errs.append(f"checkpoint-2 holds {have}, expected {want}")
        return errs, ""
    opt = R.read_safetensors(os.path.join(ck, "optimizer.safetensors"))
    names = list(R.lora_shapes(cfg, 3, targets))
    want_opt = {p + n for p in ("exp_avg.", "exp_avg_sq.") for n in names}
    if set(opt) != want_opt:
        errs.append(f"optimizer.safetensors: extra {sorted(set(opt) - want_opt)[:3]}, "
                    f"missing {sorted(want_opt - set(opt))[:3]}")
    read_trainer_adapter(ck, errs, spec)
    tcb = dict(tc, output_dir=os.path.join(work, "outB"), resume_from_checkpoint=ck)
    run_trainer(work, tcb, name="b.yaml")
    a, b = rows_by_step(tc["output_dir"]), rows_by_step(tcb["output_dir"])
    if sorted(b) != [3, 4]:
        errs.append(f"resumed run logged steps {sorted(b)}, expected [3, 4]")
    for s in (3, 4):
        for k in ("loss", "lr", "grad_norm"):
            if a.get(s, {}).get(k) != b.get(s, {}).get(k):
                errs.append(f"step {s}: {k} {b.get(s, {}).get(k)!r} after resume vs "
                            f"{a.get(s, {}).get(k)!r} unbroken")
    fa = os.path.join(tc["output_dir"], "adapter_model.safetensors")
    fb = os.path.join(tcb["output_dir"], "adapter_model.safetensors")
    if not (os.path.exists(fa) and os.path.exists(fb) and sha(fa) == sha(fb)):
        errs.append("final adapter_model.safetensors differs between unbroken and resumed runs")
    # lora_dropout 0.1 is really applied (the reference has no dropout: the loss must differ)
    l_nodrop = R.batch_loss(cfg, weights, R.step_batches(tokens, 2, 16, 2, 1),
                            lora=dict(spec, lora_dropout=0.0))
    if 1 in a and rel(a[1]["loss"], l_nodrop) < 1e-6:
        errs.append(f"lora_dropout 0.1: step 1 loss {a[1]['loss']:.9g} equals the no-dropout "
                    f"loss {l_nodrop:.9g}")
    return errs, f"steps 3-4 losses {[a.get(s, {}).get('loss') for s in (3, 4)]}"


def case_memory_modes(root):
    """Recompute, tiled MLP, layer streaming and offloading must not change an adapter run."""
    work = os.path.join(root, "modes")
    cfg = R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2)
    model_dir, shard, tokens, weights = setup(work, cfg, 1000, seed=88)
    spec = R.lora_spec(cfg, r=4, alpha=8, targets=["q_proj", "o_proj", "up_proj", "down_proj"],
                       seed=88, b_std=0.1)
    R.save_adapter_dir(os.path.join(work, "adapter_in"), spec)
    tc = R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=2,
                        max_steps=3, learning_rate=5e-3, lr_scheduler="cosine", warmup_steps=1,
                        weight_decay=0.1, max_grad_norm=1.0)
    tc.update(base_model=model_dir, train_data=shard)
    tc.update(lora_keys(spec, model_dir=os.path.join(work, "adapter_in")))
    ref = R.train_reference(cfg, weights, tokens, tc, lora=spec)
    modes = {
        "recompute_tiled_streamed": {"gradient_checkpointing": "true",
                                     "gradient_checkpointing_every": 2, "tiled_mlp": True,
                                     "tiled_mlp_shards": 3, "layer_offloading": True},
        "selective_offloaded": {"gradient_checkpointing": "selective",
                                "activation_offloading": "true", "min_offload_size": 0},
    }
    errs = []
    for name, extra in modes.items():
        t = dict(tc, output_dir=os.path.join(work, name))
        t.update(extra)
        e = []
        run_trainer(work, perturbed(t), name=name + ".yaml")
        compare_rows(rows_by_step(t["output_dir"]), ref, range(1, 4), e)
        got = read_trainer_adapter(t["output_dir"], e, spec)
        compare_tensors(got["weights"], ref["adapter"], e, "final adapter")
        errs += [f"{name}: {x}" for x in e]
    return errs, ", ".join(modes)


def case_dropout_tiled_mlp(root):
    """lora_dropout masks belong to (seed, micro-batch, layer, projection, element): running the
    MLP over row tiles must not change them (nor repeat one tile's mask in every tile)."""
    work = os.path.join(root, "dropout_tiled")
    cfg = R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    model_dir, shard, tokens, weights = setup(work, cfg, 1000, seed=77)
    tc = R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=1,
                        max_steps=3, learning_rate=5e-3, lr_scheduler="constant", warmup_steps=0,
                        weight_decay=0.1, max_grad_norm=1.0)
    spec = R.lora_spec(cfg, r=4, alpha=8, targets=ALL, seed=77, dropout=0.3, b_std=0.2)
    R.save_adapter_dir(os.path.join(work, "adapter_in"), spec)  # B != 0: dropout acts at once
    # The untiled run uses the same 4 MLP row chunks, so the two must agree to the bit.
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "plain"), tiled_mlp_shards=4)
    tc.update(lora_keys(spec, target_linear=True, model_dir=os.path.join(work, "adapter_in")))
    tc = perturbed(tc)
    run_trainer(work, tc, name="plain.yaml")
    tct = dict(tc, output_dir=os.path.join(work, "tiled"), tiled_mlp=True)
    run_trainer(work, tct, name="tiled.yaml")
    tc0 = dict(tc, output_dir=os.path.join(work, "nodrop"), lora_dropout=0.0)
    run_trainer(work, tc0, name="nodrop.yaml")
    a, b, c = (rows_by_step(t["output_dir"]) for t in (tc, tct, tc0))
    errs = []
    for s in (1, 2, 3):
        for k in ("loss", "grad_norm"):
            x, y = a.get(s, {}).get(k), b.get(s, {}).get(k)
            if x is None or y is None or x != y:
                errs.append(f"step {s}: {k} {y!r} with tiled_mlp (4 tiles) vs {x!r} untiled (4 chunks)")
    if 1 in a and 1 in c and rel(a[1]["loss"], c[1]["loss"]) < 1e-5:
        errs.append("test setup: lora_dropout 0.3 barely changes the step-1 loss")
    return errs, f"losses untiled {[a.get(s, {}).get('loss') for s in (1, 2, 3)]}"


def bad_cases(root):
    """(name, tc tweaks, --set list, adapter dir tweak, regexes the error line must match)."""
    return [
        ("bad_unknown_target_yaml", {"lora_target_modules": ["q_proj", "qkv_proj"]}, [], None,
         [r"qkv_proj", r"lora_target_modules"]),
        ("bad_unknown_target_set", {}, ["lora_target_modules=q_proj,vproj"], None,
         [r"vproj"]),
        ("bad_no_targets", {}, [], None, [r"lora_target_modules|lora_target_linear"]),
        ("bad_rank_mismatch", {"lora_r": 5, "lora_target_modules": ["q_proj", "v_proj"]}, [],
         {"r": 3}, [r"\b3\b", r"\b5\b", r"adapter_config\.json"]),
        ("bad_alpha_mismatch", {"lora_r": 3, "lora_alpha": 7,
                                "lora_target_modules": ["q_proj", "v_proj"]}, [],
         {"r": 3, "lora_alpha": 9}, [r"\b7\b", r"\b9\b"]),
        ("bad_targets_mismatch", {"lora_r": 3, "lora_target_modules": ["q_proj", "k_proj"]}, [],
         {"r": 3}, [r"target_modules"]),
        # the scale alpha/sqrt(r) vs alpha/r is as much a part of the adapter as alpha
        ("bad_rslora_mismatch", {"lora_r": 4, "lora_target_modules": ["q_proj", "v_proj"],
                                 "use_rslora": False}, [],
         {"r": 4, "use_rslora": True}, [r"use_rslora"]),
    ]


def run_bad(root, name, tweaks, sets, adapter_tweak, patterns):
    work = os.path.join(root, name)
    cfg = R.make_config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=2)
    model_dir, shard, _, _ = setup(work, cfg, 200, seed=66)
    tc = R.train_config(max_steps=1, sequence_len=8)
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"),
              adapter="lora", lora_alpha=16)
    if adapter_tweak is not None:
        spec = R.lora_spec(cfg, r=adapter_tweak["r"], alpha=adapter_tweak.get("lora_alpha", 16),
                           targets=["q_proj", "v_proj"], seed=1,
                           use_rslora=adapter_tweak.get("use_rslora", False))
        R.save_adapter_dir(os.path.join(work, "adapter_in"), spec)
        tc["lora_model_dir"] = os.path.join(work, "adapter_in")
    tc.update(tweaks)
    rc, out, err = run_trainer(work, tc, sets=sets, check=False)
    errs = []
    lines = [l for l in err.splitlines() if l.strip()]
    if rc != 1:
        errs.append(f"exit {rc}, expected 1")
    if len(lines) != 1 or not lines[0].startswith("error: "):
        errs.append(f"stderr should be one 'error: ' line, got {lines[:3]}")
    elif not all(re.search(p, lines[0]) for p in patterns):
        errs.append(f"error line does not name {patterns}: {lines[0]!r}")
    if "step " in out and "loss" in out:
        errs.append("it trained")
    return errs, lines[0] if lines else ""


# ---------------------------------------------------------------------------------------------

def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/train_llama", help="trainer binary")
    ap.add_argument("--threads", type=int, default=None, help="--set num_threads=N")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per trainer run")
    ap.add_argument("--only", default=None, help="run only cases whose name contains this")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--perturb-lr", type=float, default=1.0,
                    help="multiply the candidate's learning rate (to see the test fail)")
    ap.add_argument("--perturb-alpha", type=float, default=1.0,
                    help="multiply the candidate's lora_alpha (to see the test fail)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ARGS = ap.parse_args()
    torch.manual_seed(0)
    ARGS.bin = os.path.abspath(ARGS.bin)
    if not os.access(ARGS.bin, os.X_OK):
        print(f"FAIL setup: {ARGS.bin} is not an executable (run make first)")
        print("0 passed, 1 failed")
        return 1
    root = tempfile.mkdtemp(prefix="test_lora_ref_")
    cases = [("all_linear_untied", case_all_linear_untied),
             ("subset_rslora_qwen2", case_subset_rslora_qwen2),
             ("modules_to_save", case_modules_to_save),
             ("merge_lora", case_merge_lora),
             ("fresh_adapter_eval", case_fresh_adapter_eval),
             ("resume_adapter", case_resume_adapter),
             ("memory_modes", case_memory_modes),
             ("dropout_tiled_mlp", case_dropout_tiled_mlp)]
    for name, tweaks, sets, at, pats in bad_cases(root):
        cases.append((name, lambda r, a=(name, tweaks, sets, at, pats): run_bad(r, *a)))
    passed = failed = 0
    try:
        passed, failed = harness.run_cases(((n, lambda f=f: f(root)) for n, f in cases), ARGS.only,
                                           ARGS.verbose, timed=True)
    finally:
        if ARGS.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
