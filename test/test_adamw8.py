#!/usr/bin/python3
"""Low-bit AdamW (llmc/optim.h): bitsandbytes' 8-bit (optimizer: adamw_bnb_8bit, adamw_8bit,
paged_adamw_8bit) and torchao's 8-bit and 4-bit (adamw_torch_8bit, adamw_torch_4bit), against
test/llama_ref.py's AdamW8bit, written from their algorithms.

    /usr/bin/python3 test/test_adamw8.py --bin build/train_llama

  maps         the code maps the trainer writes into a checkpoint (adam8.qmap1 / qmap2) are the
               reference's create_dynamic_map(signed / unsigned) computed with torch, within 2
               units in the last place (torch's linspace itself varies by one with its CPU
               kernel: optim.c), ascending.
  full         a full fine-tune whose matrices are 8-bit (>= 4096 elements) and whose norms and
               GQA k/v projections keep float moments: per-step loss (1e-4) and grad norm (1e-3)
               against the reference, and each tensor's update (final - initial weights) within
               2e-3 normwise of the reference's; the float AdamW reference's updates differ by far
               more (checked, so the test sees a float optimizer). Looser than the float
               optimizer's tests: quantization turns the float noise between the two (float32
               against float64 gradients) into whole code steps wherever a state lies near a
               rounding boundary, and a second moment rounded to 0 beside a first that is not
               moves its element by lr m / eps; the kernel itself is compared with the algorithm
               bit for bit in test_ops (adamw8).
  torchao      torchao's AdamW8bit (adamw_torch_8bit) against the reference's torchao variant, as
               full; its embedding (8256 elements, not a multiple of 256) keeps float moments, so
               its update differs from bitsandbytes' rule's (checked).
  torchao4     torchao's AdamW4bit (adamw_torch_4bit): its 16-entry maps against torchao's (2
               ulps), the run against the reference's 4-bit variant as full (the 8-bit
               reference's updates differ far more: checked), half a byte per element a moment.
  modes        offload_optimizer (the update on the host), recompute and layer offload give the
               plain 8-bit run's weights bit for bit.
  resume       2 steps, a checkpoint, 2 more from it: the same weights bit for bit as 4 steps in
               one run; a float-AdamW checkpoint is refused by a run with the 8-bit optimizer.
  lora         LoRA r 64 (A of 64 x 64: 8-bit) against the reference: losses (1e-4) and adapter
               updates (2e-3).
  memory       the config box counts the 8-bit state: about a quarter of the float one.
  zero_refused ZeRO-1 over 2 ranks (mpirun) is refused: it would split tensors between ranks.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import llama_ref as R  # noqa: E402

ARGS = None


def cfg_small(**kw):
    # q/o 64 x 64 and the MLP's 64 x 128 (>= 4096: 8-bit), k/v 32 x 64 and the norms (float),
    # the embedding and untied head 128 x 64 (8-bit)
    c = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
    c.update(kw)
    return R.make_config(**c)


def setup(work, cfg, seed=3, n_tokens=2000):
    os.makedirs(work, exist_ok=True)
    weights = R.init_weights(cfg, seed=seed, qk_std=0.25, embed_std=0.1)
    model_dir = os.path.join(work, "model")
    R.save_hf_dir(model_dir, cfg, weights)
    shard = os.path.join(work, "train.bin")
    R.write_shard(shard, R.random_tokens(n_tokens, cfg["vocab_size"], seed=seed), version=1)
    return model_dir, shard, R.read_shard(shard), weights


def tconf(model_dir, shard, out, **kw):
    tc = R.train_config(sequence_len=24, micro_batch_size=2, gradient_accumulation_steps=2, max_steps=4,
                        learning_rate=1e-2, lr_scheduler="cosine", warmup_steps=1, weight_decay=0.1,
                        max_grad_norm=1.0)
    tc.update(base_model=model_dir, train_data=shard, output_dir=out, optimizer="adamw_bnb_8bit")
    tc.update(kw)
    return tc


def run(work, tc, name="cfg.yaml", check=True, extra=()):
    path = os.path.join(work, name)
    R.write_yaml(path, tc)
    p = subprocess.run([ARGS.bin, "-c", path, *extra], cwd=work, capture_output=True, text=True,
                       timeout=ARGS.timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"trainer exit {p.returncode}: {p.stderr[-600:]}")
    return p


def rows(out):
    return [r for r in R.read_metrics(os.path.join(out, "metrics.jsonl")) if "loss" in r]


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def update_errors(got, want, w0, only=None):
    """Worst normwise difference of each tensor's update (final - initial) against want's."""
    worst, name = 0.0, ""
    for k, v in want.items():
        if only and only not in k:
            continue
        du = np.asarray(got[k], np.float64) - w0[k]
        dw = np.asarray(v, np.float64) - w0[k]
        e = float(np.linalg.norm(du - dw) / max(np.linalg.norm(dw), 1e-30))
        if e > worst:
            worst, name = e, k
    return worst, name


def ulps(a, b):
    """|a - b| in units in the last place of float32, elementwise."""
    a, b = (np.asarray(x, np.float32).view(np.int32).astype(np.int64) for x in (a, b))
    return np.abs(a - b)


def against(tc, got, ref, weights, what, errs):
    """Per-step losses (1e-4) and each tensor's update (2e-3 normwise) of a run against a
    reference's; returns the metrics rows, the worst loss error and the worst update (and where)."""
    rr = rows(tc["output_dir"])
    wl = max(rel(r["loss"], l) for r, l in zip(rr, ref["losses"]))
    if len(rr) != tc["max_steps"] or wl > 1e-4:
        errs.append(f"{len(rr)} steps; loss rel {wl:.2e} (1e-4)")
    eu, en = update_errors(got, ref["weights"], {k: np.asarray(v, np.float64) for k, v in weights.items()})
    if eu > 2e-3:
        errs.append(f"updates vs the {what} reference: {eu:.2e} at {en} (2e-3)")
    return rr, wl, eu, en


def trainer_codes(out, step):
    """The trainer's code maps as its checkpoint holds them, for the reference to use (the map
    itself is case maps' business: here only the update is compared)."""
    import torch
    st = R.read_safetensors(os.path.join(out, f"checkpoint-{step}", "optimizer.safetensors"))
    return tuple(torch.tensor(np.asarray(st[n], np.float32)) for n in ("adam8.qmap1", "adam8.qmap2"))


def case_maps(root):
    import torch
    work = os.path.join(root, "maps")
    model_dir, shard, _, _ = setup(work, cfg_small())
    tc = tconf(model_dir, shard, os.path.join(work, "out"), max_steps=1, save_steps=1)
    run(work, tc)
    st = R.read_safetensors(os.path.join(work, "out", "checkpoint-1", "optimizer.safetensors"))
    errs = []
    same = []
    for name, signed in (("adam8.qmap1", True), ("adam8.qmap2", False)):
        want = R.dynamic_map(signed).numpy()
        got = np.asarray(st[name], np.float32)
        if got.shape != want.shape or not np.all(np.diff(got) > 0):
            errs.append(f"{name}: shape {got.shape}, or not strictly ascending")
            continue
        u = ulps(got, want)
        same.append(int((u == 0).sum()))
        if u.max() > 2:
            errs.append(f"{name} differs from create_dynamic_map(signed={signed}) by {u.max()} ulps at "
                        f"{int(u.argmax())}")
    # the moments are stored as bytes
    q = np.asarray(st["adam8.exp_avg"], np.uint8)
    if q.dtype != np.uint8 or q.size == 0:
        errs.append("adam8.exp_avg is not a byte tensor")
    return errs, f"within 2 ulps of torch {torch.__version__}'s maps ({same} of 256 codes the same bits)"


def case_full(root):
    work = os.path.join(root, "full")
    cfg = cfg_small()
    model_dir, shard, tokens, weights = setup(work, cfg)
    tc = tconf(model_dir, shard, os.path.join(work, "out"), save_steps=4)
    run(work, tc)
    got = R.read_safetensors(os.path.join(work, "out", "model.safetensors"))
    ref = R.train_reference(cfg, weights, tokens, dict(tc, _adam8_codes=trainer_codes(tc["output_dir"], 4)))
    f32 = R.train_reference(cfg, weights, tokens, dict(tc, optimizer="adamw_torch"))
    errs = []
    rr, wl, eu, en = against(tc, got, ref, weights, "8-bit", errs)
    wg = max(rel(r["grad_norm"], g) for r, g in zip(rr, ref["grad_norms"]))
    if wg > 1e-3:
        errs.append(f"grad norm rel {wg:.2e} (1e-3)")
    w0 = {k: np.asarray(v, np.float64) for k, v in weights.items()}
    e32, n32 = update_errors(ref["weights"], f32["weights"], w0)
    if e32 < 10 * 2e-3:
        errs.append(f"the float AdamW reference's updates differ only {e32:.2e} ({n32}): the test would not see it")
    return errs, f"loss {wl:.1e}, grad norm {wg:.1e}, updates {eu:.1e} ({en}); float AdamW's {e32:.1e}"


def case_torchao(root):
    """torchao's AdamW8bit (adamw_torch_8bit): the embedding and head of 129 x 64 (8256 elements,
    not a multiple of 256) keep float moments there, where bitsandbytes' takes them to bytes."""
    work = os.path.join(root, "torchao")
    cfg = cfg_small(vocab_size=129)
    model_dir, shard, tokens, weights = setup(work, cfg)
    tc = tconf(model_dir, shard, os.path.join(work, "out"), save_steps=4, optimizer="adamw_torch_8bit")
    p = run(work, tc)
    got = R.read_safetensors(os.path.join(work, "out", "model.safetensors"))
    codes = trainer_codes(tc["output_dir"], 4)
    ref = R.train_reference(cfg, weights, tokens, dict(tc, _adam8_codes=codes))
    bnb = R.train_reference(cfg, weights, tokens, dict(tc, _adam8_codes=codes, optimizer="adamw_bnb_8bit"))
    errs = []
    _, wl, eu, en = against(tc, got, ref, weights, "torchao", errs)
    eb, _ = update_errors(got, bnb["weights"], {k: np.asarray(v, np.float64) for k, v in weights.items()},
                          only="embed_tokens")
    if eb < 10 * 2e-3:
        errs.append(f"the embedding's update is bitsandbytes' too ({eb:.2e}): the test would not see the rule")
    if "AdamW 8-bit (torchao)" not in p.stdout:
        errs.append("the config box does not name torchao's 8-bit AdamW")
    return errs, f"loss {wl:.1e}, updates {eu:.1e} ({en}); bitsandbytes' embedding update differs {eb:.1e}"


def case_torchao4(root):
    """torchao's AdamW4bit (adamw_torch_4bit): the checkpoint's 16-entry maps against torchao's
    (create_dynamic_map(True, 3, 4), linspace(0, 1, 17)[1:]), the run against the reference's
    4-bit variant, and half a byte per element of each moment."""
    work = os.path.join(root, "torchao4")
    cfg = cfg_small()
    model_dir, shard, tokens, weights = setup(work, cfg)
    tc = tconf(model_dir, shard, os.path.join(work, "out"), save_steps=4, optimizer="adamw_torch_4bit")
    p = run(work, tc)
    got = R.read_safetensors(os.path.join(work, "out", "model.safetensors"))
    codes = tuple(c[:16] for c in trainer_codes(tc["output_dir"], 4))
    errs = []
    for have, want, name in zip(codes, R.torchao4_maps(), ("signed", "unsigned")):
        u = ulps(have.numpy(), want.numpy())
        if u.max() > 2:
            errs.append(f"the {name} 4-bit map differs from torchao's by {u.max()} ulps")
    ref = R.train_reference(cfg, weights, tokens, dict(tc, _adam8_codes=codes))
    _, wl, eu, en = against(tc, got, ref, weights, "4-bit", errs)
    e8, _ = update_errors(got, R.train_reference(cfg, weights, tokens, dict(tc, optimizer="adamw_torch_8bit"))["weights"],
                          {k: np.asarray(v, np.float64) for k, v in weights.items()})
    if e8 < 10 * 2e-3:
        errs.append(f"the 8-bit reference's updates differ only {e8:.2e}: the test would not see 4-bit codes")
    if "AdamW 4-bit (torchao)" not in p.stdout:
        errs.append("the config box does not name torchao's 4-bit AdamW")
    st = R.read_safetensors(os.path.join(tc["output_dir"], "checkpoint-4", "optimizer.safetensors"))
    n4 = np.asarray(st["adam8.exp_avg"]).size
    big = sum(np.asarray(v).size for k, v in weights.items() if np.asarray(v).size >= 4096)
    if n4 * 2 != big:
        errs.append(f"4-bit moments hold {n4} bytes for {big} elements")
    return errs, f"loss {wl:.1e}, updates {eu:.1e} ({en}); the 8-bit reference's differ {e8:.1e}; {n4} bytes a moment"


def case_modes(root):
    work = os.path.join(root, "modes")
    model_dir, shard, _, _ = setup(work, cfg_small())
    base = tconf(model_dir, shard, os.path.join(work, "plain"))
    run(work, base, "plain.yaml")
    want = open(os.path.join(base["output_dir"], "model.safetensors"), "rb").read()
    errs = []
    modes = {"offload_optimizer": {"offload_optimizer": True},
             "recompute_offload": {"gradient_checkpointing": "true", "activation_offloading": "true"}}
    for name, extra in modes.items():
        tc = dict(base, output_dir=os.path.join(work, name), **extra)
        run(work, tc, name + ".yaml")
        if open(os.path.join(tc["output_dir"], "model.safetensors"), "rb").read() != want:
            errs.append(f"{name}: weights differ from the plain 8-bit run")
    return errs, f"{len(modes)} modes bit-identical"


def case_resume(root):
    work = os.path.join(root, "resume")
    model_dir, shard, _, _ = setup(work, cfg_small())
    one = tconf(model_dir, shard, os.path.join(work, "one"))
    run(work, one, "one.yaml")
    # checkpoint-2 of a run of the whole length (a checkpoint records its run's max_steps)
    two = tconf(model_dir, shard, os.path.join(work, "two"), save_steps=2)
    errs = []
    run(work, two, "two_full.yaml")  # writes checkpoint-2 and checkpoint-4
    ck = os.path.join(two["output_dir"], "checkpoint-2")
    three = dict(two, output_dir=os.path.join(work, "three"), resume_from_checkpoint=ck)
    run(work, three, "three.yaml")
    a = open(os.path.join(one["output_dir"], "model.safetensors"), "rb").read()
    b = open(os.path.join(three["output_dir"], "model.safetensors"), "rb").read()
    if a != b:
        errs.append("resumed from checkpoint-2: weights differ from the uninterrupted run")
    # a float-AdamW checkpoint under the 8-bit optimizer: refused, naming the setting
    f32 = dict(two, output_dir=os.path.join(work, "f32"), optimizer="adamw_torch", max_steps=2)
    run(work, f32, "f32.yaml")
    bad = dict(two, output_dir=os.path.join(work, "bad"),
               resume_from_checkpoint=os.path.join(f32["output_dir"], "checkpoint-2"))
    p = run(work, bad, "bad.yaml", check=False)
    last = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ""
    if p.returncode == 0 or "optimizer_states" not in last:
        errs.append(f"a float checkpoint resumed with 8-bit AdamW: exit {p.returncode}, {last!r}")
    return errs, "resume bit-identical; a float checkpoint refused"


def case_lora(root):
    work = os.path.join(root, "lora")
    cfg = cfg_small()
    model_dir, shard, tokens, weights = setup(work, cfg)
    spec = R.lora_spec(cfg, r=64, alpha=16, targets=["q_proj", "v_proj", "down_proj"], seed=5, b_std=0.05)
    adir = os.path.join(work, "adapter_in")
    R.save_adapter_dir(adir, spec)
    tc = tconf(model_dir, shard, os.path.join(work, "out"), adapter="lora", lora_r=64, lora_alpha=16,
               lora_dropout=0.0, lora_target_modules=["q_proj", "v_proj", "down_proj"], lora_model_dir=adir,
               save_steps=4)
    run(work, tc)
    ref = R.train_reference(cfg, weights, tokens, dict(tc, _adam8_codes=trainer_codes(tc["output_dir"], 4)), lora=spec)
    got = R.read_safetensors(os.path.join(work, "out", "adapter_model.safetensors"))
    errs = []
    rr = rows(tc["output_dir"])
    wl = max(rel(r["loss"], l) for r, l in zip(rr, ref["losses"]))
    if wl > 1e-4:
        errs.append(f"loss rel {wl:.2e} (1e-4)")
    a0 = {k: np.asarray(v, np.float64) for k, v in spec["weights"].items()}
    want = {R.PEFT_PREFIX + k if not k.startswith(R.PEFT_PREFIX) else k: v for k, v in ref["adapter"].items()}
    got = {k if k.startswith(R.PEFT_PREFIX) else R.PEFT_PREFIX + k: v for k, v in got.items()}
    w0 = {R.PEFT_PREFIX + k if not k.startswith(R.PEFT_PREFIX) else k: v for k, v in a0.items()}
    eu, en = update_errors(got, want, w0)
    if eu > 2e-3:
        errs.append(f"adapter updates vs the reference: {eu:.2e} at {en}")
    return errs, f"loss {wl:.1e}, adapter updates {eu:.1e}"


def case_memory(root):
    work = os.path.join(root, "memory")
    model_dir, shard, _, _ = setup(work, cfg_small())
    errs, figs = [], {}
    for name in ("adamw_torch", "adamw_bnb_8bit"):
        tc = tconf(model_dir, shard, os.path.join(work, name), optimizer=name, max_steps=1)
        p = run(work, tc, name + ".yaml")
        line = [ln for ln in p.stdout.splitlines() if ln.startswith("| memory ")]
        figs[name] = line[0].split("optimizer ")[1].split(",")[0] if line else "?"
    units = {"KiB": 1024, "MiB": 1 << 20, "B": 1}

    def size(s):
        v, u = s.split()
        return float(v) * units[u]
    f32, b8 = size(figs["adamw_torch"]), size(figs["adamw_bnb_8bit"])
    if not (0.2 < b8 / f32 < 0.4):
        errs.append(f"optimizer state in the config box: {figs}")
    return errs, f"optimizer state {figs['adamw_torch']} -> {figs['adamw_bnb_8bit']}"


def case_zero_refused(root):
    """ZeRO-1 over 2 ranks would split tensors between them: refused with one error line."""
    if not shutil.which("mpirun"):
        return [], "SKIP: no mpirun"
    work = os.path.join(root, "zero")
    model_dir, shard, _, _ = setup(work, cfg_small())
    tc = tconf(model_dir, shard, os.path.join(work, "out"), zero_stage=1, max_steps=1)
    path = os.path.join(work, "cfg.yaml")
    R.write_yaml(path, tc)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    p = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", ARGS.bin, "-c", path], cwd=work,
                       env=env, capture_output=True, text=True, timeout=ARGS.timeout)
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    if p.returncode == 0 or not lines or "ZeRO-1 over 2 ranks" not in lines[0]:
        return [f"exit {p.returncode}, errors {lines[:2]}"], ""
    return [], lines[0][:120]


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="./train_llama")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--only", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true")
    ARGS = ap.parse_args()
    ARGS.bin = os.path.abspath(ARGS.bin)
    root = tempfile.mkdtemp(prefix="test_adamw8_")
    cases = [("maps", case_maps), ("full", case_full), ("torchao", case_torchao), ("torchao4", case_torchao4),
             ("modes", case_modes),
             ("resume", case_resume),
             ("lora", case_lora), ("memory", case_memory), ("zero_refused", case_zero_refused)]
    try:
        passed, failed = harness.run_cases(((n, lambda f=f: f(root)) for n, f in cases), ARGS.only, ARGS.verbose)
    finally:
        if ARGS.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
