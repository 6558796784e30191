#!/usr/bin/python3
"""load_in_8bit (LoRA over bitsandbytes' 8-bit weight storage) end to end, with the helpers of
test_qlora.py and test/int8_ref.py (the quantization as bitsandbytes' source states it).

    /usr/bin/python3 test/test_int8.py --bin build/train_llama [-v] [--only NAME] [--keep]

  merged_base_exact
        merge_lora after a step at learning_rate 0 (B stays 0): every decoder linear weight of
        merged/ is int8_ref's roundtrip of the float weight, bit for bit (rows of different
        scales, an all-zero row, a 300.0 outlier, values float16 rounds or flushes to
        subnormals); embeddings, norms and the head are the float originals.
  torch_reference
        LoRA over the int8 base vs llama_ref.py over int8_ref's dequantized base (float64):
        per-step loss (1e-5 rel), grad norm (1e-4), final adapter (1e-4); the float base gives a
        clearly different loss.
  modes
        layer_offloading streamed vs resident and the activation modes (checkpointing,
        offloading to host and disk, hidden states): bit-identical losses and adapters.
  memory_exact
        device peak of a LoRA run minus the same run with load_in_8bit = the float linear weights
        - their int8 regions (48-byte header, 16-byte aligned scales and codes) - one
        dequantized layer, to the byte.
  bad_*  one 'error:' line each: no adapter, qlora with it, with load_in_4bit, a bitsandbytes
        8-bit checkpoint (.SCB), a weight past float16's range, llm_int8_has_fp16_weight: true.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import int8_ref as I  # noqa: E402
import test_qlora as QL  # noqa: E402  (imports torch through llama_ref)
R = QL.R


def int8_keys(**kw):
    return QL.qlora_keys(adapter="lora", load_in_8bit=True, **kw)


def deq_base(weights):
    return {k: (I.roundtrip(w) if QL.is_linear(k) else w) for k, w in weights.items()}


def check_merged_exact():
    work = os.path.join(QL.TMP, "merged")
    cfg = R.make_config(vocab_size=64, hidden_size=40, intermediate_size=72, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)

    def tweak(w):
        q = w["model.layers.0.self_attn.q_proj.weight"]
        q[3, :] = 0.0                      # an all-zero row
        q[5, 7] = 300.0                    # an outlier: the rest of its row rounds to few codes
        up = w["model.layers.1.mlp.up_proj.weight"]
        up[2, :] *= 1e-4                   # float16 subnormals
        up[4, :] = np.float32(1.0) + np.arange(up.shape[1], dtype=np.float32) * np.float32(1e-4)
        w["model.layers.1.mlp.down_proj.weight"] *= 37.0
    model_dir, shard, weights = QL.setup_model(work, cfg, seed=21, tweak=tweak)
    tc = QL.base_tc(max_steps=1, base_model=model_dir, train_data=shard, learning_rate=0.0, merge_lora=True,
                    output_dir=os.path.join(QL.TMP, "runs", "merged"))
    tc.update(int8_keys())
    run = QL.run_trainer("merged", tc)
    got = R.read_safetensors(os.path.join(run.out, "merged", "model.safetensors"))
    errs, nlin = [], 0
    for k, w in weights.items():
        want = I.roundtrip(w) if QL.is_linear(k) else np.asarray(w, np.float32)
        nlin += QL.is_linear(k)
        g = np.asarray(got.get(k), np.float32)
        if g.shape != want.shape or not np.array_equal(g.view(np.uint32), want.view(np.uint32)):
            bad = int(np.sum(g != want)) if g.shape == want.shape else -1
            errs.append("%s: %d elements differ from the reference" % (k, bad))
    if not re.search(r"^\| adapter .*; base int8", run.stdout, re.M):
        errs.append("the run's table does not say the base is int8")
    if "note: load_in_8bit:" not in run.stdout:
        errs.append("no load_in_8bit note")
    sep = max(float(np.max(np.abs(I.roundtrip(w) - w))) for k, w in weights.items() if QL.is_linear(k))
    if sep == 0:
        errs.append("test setup: int8 rounding changed nothing")
    return errs, "%d linear weights bit-exact, largest rounding %.2e" % (nlin, sep)


def check_torch_reference():
    work = os.path.join(QL.TMP, "torch_ref")
    cfg = R.make_config(vocab_size=64, hidden_size=40, intermediate_size=72, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    def outliers(w):  # one large entry a row coarsens the row's codes, so the bases part clearly
        for k in w:
            if QL.is_linear(k):
                w[k][:, 0] = 0.8
    model_dir, shard, weights = QL.setup_model(work, cfg, seed=33, std=0.1, tweak=outliers)
    spec = R.lora_spec(cfg, r=4, alpha=8, targets=QL.ALL, seed=33, b_std=0.1)
    R.save_adapter_dir(os.path.join(work, "adapter_in"), spec)
    tc = QL.base_tc(max_steps=5, base_model=model_dir, train_data=shard, max_grad_norm=0.65,
                    output_dir=os.path.join(QL.TMP, "runs", "torch_ref"))
    tc.update(int8_keys(lora_model_dir=os.path.join(work, "adapter_in")))
    run = QL.run_trainer("torch_ref", tc)
    ref = R.train_reference(cfg, deq_base(weights), R.read_shard(shard), tc, lora=spec)
    x1 = R.step_batches(R.read_shard(shard), 2, 16, 2, 1)
    l_float = R.batch_loss(cfg, weights, x1, lora=spec)
    errs, worst = [], 0.0
    by = {r["step"]: r for r in run.metrics}
    if sorted(by) != [1, 2, 3, 4, 5]:
        errs.append("metrics steps %s" % sorted(by))
    for s in sorted(by):
        e = QL.rel(by[s]["loss"], ref["losses"][s - 1])
        worst = max(worst, e)
        if e > QL.LOSS_RTOL:
            errs.append("step %d: loss %.9g vs reference %.9g" % (s, by[s]["loss"], ref["losses"][s - 1]))
        if QL.rel(by[s]["grad_norm"], ref["grad_norms"][s - 1]) > QL.GN_RTOL:
            errs.append("step %d: grad_norm %.9g vs %.9g" % (s, by[s]["grad_norm"], ref["grad_norms"][s - 1]))
    got = R.load_adapter_dir(run.out)["weights"]
    for k in ref["adapter"]:
        d = float(np.max(np.abs(np.asarray(got[k], np.float64) - ref["adapter"][k])))
        if d > QL.W_TOL * max(1.0, float(np.max(np.abs(ref["adapter"][k])))):
            errs.append("final adapter %s: max diff %.2e" % (k, d))
    sep = QL.rel(l_float, ref["losses"][0])
    if sep < 10 * QL.LOSS_RTOL:  # a float-base run would then fail the loss check 10 times over
        errs.append("test setup: the float base's loss is within %.1e of the int8 base's" % sep)
    return errs, "worst loss rel %.1e, float-vs-int8 base loss rel %.1e" % (worst, sep)


MODES = {"plain": {}, "ckpt": {"gradient_checkpointing": "true"},
         "ckpt2_host": {"gradient_checkpointing": "true", "gradient_checkpointing_every": 2,
                        "activation_offloading": "true"},
         "selective_disk": {"gradient_checkpointing": "selective", "activation_offloading": "disk"},
         "hidden_states": {"activation_offloading": "hidden_states"}}


def check_modes():
    work = os.path.join(QL.TMP, "modes")
    cfg = R.make_config(vocab_size=64, hidden_size=32, intermediate_size=72, num_hidden_layers=3,
                        num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
    model_dir, shard, _ = QL.setup_model(work, cfg, seed=43)
    disk = os.path.join(work, "disk")
    os.makedirs(disk, exist_ok=True)
    jobs = {}
    for mode, keys in MODES.items():
        for stream in (False, True):
            name = "modes_%s_%s" % (mode, "stream" if stream else "resident")
            tc = QL.base_tc(base_model=model_dir, train_data=shard, min_offload_size=0, layer_offloading=stream,
                            activation_offloading_dir=disk, output_dir=os.path.join(QL.TMP, "runs", name))
            tc.update(int8_keys(lora_dropout=0.1))
            tc.update(keys)
            jobs[name] = tc
    tc = dict(jobs["modes_plain_resident"], load_in_8bit=False, output_dir=os.path.join(QL.TMP, "runs", "modes_float"))
    jobs["modes_float"] = tc
    runs = QL.run_many(jobs)
    errs = []
    plain = runs["modes_plain_resident"]
    for name, r in runs.items():
        if name != "modes_float":
            QL.same_runs(plain, r, name, errs)
    if runs["modes_float"].steps() == plain.steps():
        errs.append("test setup: the float base trains exactly like the int8 one")
    return errs, "%d runs" % (len(runs) - 1)


def check_memory():
    work = os.path.join(QL.TMP, "memory")
    cfg = R.make_config(vocab_size=64, hidden_size=64, intermediate_size=200, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, attention_bias=True)
    model_dir, shard, _ = QL.setup_model(work, cfg, seed=53, n_tokens=2000)
    jobs = {}
    for name, keys in (("mem_lora", QL.qlora_keys(adapter="lora")), ("mem_int8", int8_keys())):
        tc = QL.base_tc(max_steps=2, base_model=model_dir, train_data=shard,
                        output_dir=os.path.join(QL.TMP, "runs", name))
        tc.update(keys)
        jobs[name] = tc
    runs = QL.run_many(jobs)
    shapes = R.param_shapes(cfg)
    L = cfg["num_hidden_layers"]
    lin = [s for k, s in shapes.items() if k.startswith("model.layers.0.") and QL.is_linear(k)]
    region = sum(QL.NF4_HEADER + QL.a16(4 * s[0]) + QL.a16(s[0] * s[1]) for s in lin)
    nlin = sum(s[0] * s[1] for s in lin)
    want = L * 4 * nlin - L * region - 4 * nlin
    got = runs["mem_lora"].peak("device_peak_bytes") - runs["mem_int8"].peak("device_peak_bytes")
    errs = [] if got == want else ["LoRA minus int8 device peak is %d bytes, expected %d (%+d)" % (got, want, got - want)]
    return errs, "%d bytes" % got


def bad_cases():
    m = QL.odd_model()
    base = m["model"]
    lin0 = "model.layers.0.self_attn.q_proj.weight"
    cases = []

    def plain(name, extra, pats, model=base):
        cases.append((name, lambda: QL.bad_run(name, model, extra), pats))

    plain("bad_8bit_without_adapter", {"load_in_8bit": True, "adapter": "none"}, [r"load_in_8bit", r"adapter"])
    plain("bad_8bit_qlora", QL.qlora_keys(load_in_4bit=False, load_in_8bit=True), [r"qlora", r"load_in_4bit"])
    plain("bad_8bit_and_4bit", int8_keys(load_in_4bit=True), [r"load_in_8bit", r"load_in_4bit"])
    plain("bad_fp16_weight", dict(int8_keys(), bnb_config_kwargs={"llm_int8_has_fp16_weight": True}),
          [r"llm_int8_has_fp16_weight"])

    def scb():
        d = os.path.join(m["work"], "scb")
        os.makedirs(d, exist_ok=True)
        w = dict(m["weights"])
        tensors = {k: QL.f32_entry(v) for k, v in w.items()}
        q, s = I.quantize(w[lin0])
        tensors[lin0] = ("I8", list(q.shape), q.tobytes())
        tensors[lin0 + ".SCB"] = QL.f32_entry(s)
        QL.write_st(os.path.join(d, "model.safetensors"), tensors, {"format": "pt"})
        shutil.copy(os.path.join(base, "config.json"), d)
        shutil.copy(os.path.join(m["work"], "train.bin"), os.path.join(m["work"], "train_scb.bin"))
        tc = QL.base_tc(max_steps=1, base_model=d, train_data=os.path.join(m["work"], "train.bin"))
        tc.update(int8_keys())
        return QL.run_trainer("bad_scb_checkpoint", tc, check=False)
    cases.append(("bad_scb_checkpoint", scb, [re.escape(lin0), r"8-bit", r"load_in_8bit"]))

    def overflow():
        d = os.path.join(m["work"], "overflow")
        w = {k: np.array(v, np.float32) for k, v in m["weights"].items()}
        w["model.layers.1.mlp.up_proj.weight"][2, 3] = 70000.0
        R.save_hf_dir(d, json.load(open(os.path.join(base, "config.json"))), w)
        tc = QL.base_tc(max_steps=1, base_model=d, train_data=os.path.join(m["work"], "train.bin"))
        tc.update(int8_keys())
        return QL.run_trainer("bad_f16_overflow", tc, check=False)
    cases.append(("bad_f16_overflow", overflow, [r"model\.layers\.1\.mlp\.up_proj\.weight", r"\[2, 3\]",
                                                  r"float16"]))
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/train_llama")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--only", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    args.bin = os.path.abspath(args.bin)
    import torch
    torch.set_num_threads(1)
    QL.ARGS = args
    QL.TMP = tempfile.mkdtemp(prefix="test_int8_")
    checks = [("merged_base_exact", check_merged_exact), ("torch_reference", check_torch_reference),
              ("modes", check_modes), ("memory_exact", check_memory)]
    for name, fn, pats in bad_cases():
        checks.append((name, lambda fn=fn, pats=pats: QL.check_bad(fn, pats)))
    t_all = time.time()
    try:
        for name, fn in checks:
            if args.only and args.only not in name:
                continue
            t0 = time.time()
            try:
                errs, summary = fn()
            except Exception as e:  # noqa: BLE001  a crash or unreadable output is a failure
                errs, summary = ["%s: %s" % (type(e).__name__, e)], ""
            QL.report(name, errs, (summary + "; %.1fs" % (time.time() - t0)).lstrip("; "))
    finally:
        if args.keep:
            print("kept %s" % QL.TMP)
        else:
            shutil.rmtree(QL.TMP, ignore_errors=True)
    print("(%.1fs)" % (time.time() - t_all))
    print("%d passed, %d failed" % (QL.n_pass, QL.n_fail))
    return 1 if QL.n_fail else 0


if __name__ == "__main__":
    sys.exit(main())
