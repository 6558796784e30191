#!/usr/bin/python3
"""End-to-end check of the GPT-2 trainer (train_gpt) against the float64 reference
(test/gpt2_ref.py, llm.c's GPT-2).

    /usr/bin/python3 test/test_gpt2_ref.py --bin build/train_gpt

Each case builds a tiny random GPT-2 (V 97, padded to 128) and a random token shard in a temp
dir, writes the model as an llm.c checkpoint (model.bin) for `base_model`, runs the trainer and
compares with the reference:
  a_fp32_accum_cosine    version-3 checkpoint, gradient accumulation 2, cosine + warmup, decay
  b_fp32_oddT_clip       odd T = 23, clipping active every step, linear schedule, a uint32 shard
                         that wraps
  c_bf16_ckpt            version-5 (bf16) checkpoint: the reference trains from the same
                         bf16-rounded weights; T = max_seq_len
  d_memory_modes         constant schedule; gradient_checkpointing true / selective and
                         activation_offloading hidden_states / disk give the plain run's
                         losses and grad norms as exact strings and a byte-identical model.bin;
                         a run one step longer matches the reference's loss on the plain run's
                         saved model.bin
  e_random_init          a `model:` block (random init): model.bin header and padding, and
                         the reference's loss on the saved model.bin equals the loss of the
                         next step of a run one step longer
  e_random_init_values   llm.c's GPT-2 init, read back after a learning_rate 0 step:
                         LayerNorm weights 1, biases 0, padded wte rows 0, N(0, 0.02) weights
                         with the residual projections scaled by 1/sqrt(2 L)
The trainer runs with num_threads 1 (2 in case b): quick and steady on a loaded machine.
For a-d: every step's loss (1e-5 relative), lr (1e-6), grad_norm (1e-4), final weights read
back from output_dir/model.bin (max abs diff <= 1e-4 * max(1, max|w|) per tensor), padded wte
rows unchanged, and the reference's loss on the trainer's saved weights equals the reference's
loss on its own final weights for the next batch (1e-5 relative).

--self-check runs a float32 copy of the reference in place of the binary (validates the
harness and tolerances without the trainer); --perturb-lr X multiplies the learning rate given
to the trainer by X, --perturb-mode-lr X only that of the memory-mode runs (to see it fail).
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_ref as G  # noqa: E402
import harness  # noqa: E402

LOSS_RTOL = 1e-5
LR_RTOL = 1e-6
GN_RTOL = 1e-4
W_TOL = 1e-4

ARGS = None
ROOT = None


def train_config(**kw):
    # adam_epsilon 1e-6: the key bias (qkvb rows C..2C-1) has an exactly zero gradient in
    # GPT-2 (it adds the same q.b_k to every score of a row), so float32 leaves rounding noise
    # (~1e-9) there that Adam would blow up to ~0.1 lr per step with eps 1e-8; with 1e-6 that
    # noise moves the key bias by < 1e-5 in all.
    tc = G.LR.train_config(adam_epsilon=1e-6)
    tc.update(kw)
    return tc


def cases():
    return [
        dict(name="a_fp32_accum_cosine",
             cfg=G.make_config(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4,
                               max_seq_len=32),
             tc=train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=2,
                             max_steps=5, learning_rate=5e-3, lr_scheduler="cosine",
                             warmup_steps=2, weight_decay=0.1, max_grad_norm=5.0),
             # small embeddings: the first LayerNorm's input variance is ~2e-3, so eps matters
             version=3, shard_version=1, n_tokens=1500, expect_clip=False,
             init=dict(wte_std=0.04, wpe_std=0.02)),
        # 2*23 = 46 tokens a step: 100 tokens hold 2 steps, so steps 3 and 5 wrap
        dict(name="b_fp32_oddT_clip",
             cfg=G.make_config(vocab_size=97, hidden_size=48, num_layers=2, num_heads=2,
                               max_seq_len=24),
             tc=train_config(sequence_len=23, micro_batch_size=2, gradient_accumulation_steps=1,
                             max_steps=6, learning_rate=5e-3, lr_scheduler="linear",
                             warmup_steps=2, weight_decay=0.1, max_grad_norm=0.3,
                             adam_beta2=0.95, adam_epsilon=1e-6),
             version=3, shard_version=2, n_tokens=100, expect_clip=True, threads=2),
        dict(name="c_bf16_ckpt",
             cfg=G.make_config(vocab_size=97, hidden_size=32, num_layers=2, num_heads=2,
                               max_seq_len=20),
             tc=train_config(sequence_len=20, micro_batch_size=2, gradient_accumulation_steps=2,
                             max_steps=4, learning_rate=5e-3, lr_scheduler="cosine",
                             warmup_steps=1, weight_decay=0.1, max_grad_norm=1.0),
             version=5, shard_version=1, n_tokens=1200, expect_clip=False),
        dict(name="d_memory_modes",
             cfg=G.make_config(vocab_size=97, hidden_size=40, num_layers=2, num_heads=4,
                               max_seq_len=32),
             tc=train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=1,
                             max_steps=4, learning_rate=5e-3, lr_scheduler="constant_with_warmup",
                             warmup_steps=1, weight_decay=0.1, max_grad_norm=1.0),
             version=3, shard_version=1, n_tokens=1000, expect_clip=False, modes=True),
    ]


# (tag, settings, the metrics peak that shows the mode was in effect: "device" below the plain
# run's, or "host" / "disk" above zero)
MEMORY_MODES = [
    ("ckpt_true", {"gradient_checkpointing": True}, "device"),
    ("ckpt_selective", {"gradient_checkpointing": "selective"}, "device"),
    ("offload_hidden_states", {"activation_offloading": "hidden_states", "min_offload_size": 0},
     "host"),
    ("offload_disk", {"activation_offloading": "disk", "min_offload_size": 0}, "disk"),
]


def peak(rows, kind):
    v = [r.get(kind + "_peak_bytes") for r in rows]
    return max(v) if v and all(isinstance(x, (int, float)) for x in v) else None


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def write_config(path, d):
    """YAML: scalars as in llama_ref.write_yaml, a dict value as an indented block."""
    with open(path, "w") as f:
        for k, v in d.items():
            if isinstance(v, dict):
                f.write(f"{k}:\n")
                for k2, v2 in v.items():
                    f.write(f"  {k2}: {G.LR._yaml_scalar(v2)}\n")
            else:
                f.write(f"{k}: {G.LR._yaml_scalar(v)}\n")


def read_metrics_raw(path):
    """Train rows of metrics.jsonl twice: as numbers and with floats as their exact strings."""
    rows, raw = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            r = json.loads(line)
            if "loss" in r and "step" in r:
                rows.append(r)
                raw.append(json.loads(line, parse_float=str))
    return rows, raw


# --------------------------------------------------------------------------------------------
# candidate runs: the binary, or (--self-check) a float32 copy of the reference


def fake_trainer(tc):
    """Stand-in for train_gpt: float32 reference, writes metrics.jsonl and model.bin (v3)."""
    if tc.get("base_model"):
        cfg, w, _ = G.read_checkpoint(tc["base_model"])
    else:
        m = tc["model"]
        cfg = G.make_config(m["vocab_size"], m["hidden_size"], m["num_hidden_layers"],
                            m["num_attention_heads"], m["max_position_embeddings"])
        w = G.init_llmc(cfg, seed=int(tc.get("seed", 42)))
    tokens = G.read_shard(tc["train_data"])
    ref = G.train_reference(cfg, w, tokens, tc, dtype=torch.float32)
    os.makedirs(tc["output_dir"], exist_ok=True)
    with open(os.path.join(tc["output_dir"], "metrics.jsonl"), "w") as f:
        for i, (l, lr, g) in enumerate(zip(ref["losses"], ref["lrs"], ref["grad_norms"])):
            ckpt = str(tc.get("gradient_checkpointing", False)).lower() != "false"
            off = str(tc.get("activation_offloading", False)).lower()
            f.write(json.dumps({"step": i + 1, "loss": float("%.9g" % l), "lr": lr,
                                "grad_norm": float("%.9g" % g),
                                "device_peak_bytes": 900 if ckpt or off == "hidden_states" else 1000,
                                "host_peak_bytes": 10 if off in ("hidden_states", "disk") else 0,
                                "disk_peak_bytes": 10 if off == "disk" else 0}) + "\n")
    G.write_checkpoint(os.path.join(tc["output_dir"], "model.bin"), cfg,
                       {k: v.astype(np.float32) for k, v in ref["weights"].items()})


def run_trainer(work, tag, tc):
    """Runs the candidate with settings tc; returns (rows, raw rows, model.bin path, secs)."""
    tc = dict(tc)
    tc["output_dir"] = os.path.join(work, "out_" + tag)
    if ARGS.perturb_lr != 1.0:
        tc["learning_rate"] = tc["learning_rate"] * ARGS.perturb_lr
    t0 = time.time()
    if ARGS.self_check:
        fake_trainer(tc)
    else:
        tc["num_threads"] = ARGS.threads if ARGS.threads is not None else tc.get("num_threads", 1)
        path = os.path.join(work, tag + ".yaml")
        write_config(path, tc)
        p = subprocess.run([ARGS.bin, "-c", path], cwd=work, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=ARGS.timeout)
        log = p.stdout.decode("utf-8", "replace")
        if p.returncode != 0:
            raise RuntimeError(f"{tag}: trainer exit {p.returncode}; output tail:\n      "
                               + "\n      ".join(log.splitlines()[-12:]))
    dt = time.time() - t0
    rows, raw = read_metrics_raw(os.path.join(tc["output_dir"], "metrics.jsonl"))
    return rows, raw, os.path.join(tc["output_dir"], "model.bin"), dt


# --------------------------------------------------------------------------------------------
# comparisons


def compare_steps(rows, ref, nsteps, errs):
    """Per-step loss / lr / grad_norm against the reference; returns worst relative errors."""
    by_step = {int(r["step"]): r for r in rows}
    if sorted(by_step) != list(range(1, nsteps + 1)):
        errs.append(f"metrics.jsonl train steps {sorted(by_step)}, expected 1..{nsteps}")
    worst = [0.0, 0.0, 0.0]
    for s in range(1, nsteps + 1):
        if s not in by_step:
            continue
        r = by_step[s]
        bad = [k for k in ("loss", "lr", "grad_norm") if not isinstance(r.get(k), (int, float))
               or not math.isfinite(r[k])]
        if bad:
            errs.append(f"step {s}: {', '.join(bad)} missing or not finite")
            break
        rl, rlr, rg = ref["losses"][s - 1], ref["lrs"][s - 1], ref["grad_norms"][s - 1]
        e = rel(r["loss"], rl)
        worst[0] = max(worst[0], e)
        if e > LOSS_RTOL:
            errs.append(f"step {s}: loss {r['loss']:.9g} vs ref {rl:.9g} (rel {e:.2e})")
        if rlr == 0:
            if abs(r["lr"]) > 1e-12:
                errs.append(f"step {s}: lr {r['lr']:.9g} vs ref 0")
        else:
            e = rel(r["lr"], rlr)
            worst[1] = max(worst[1], e)
            if e > LR_RTOL:
                errs.append(f"step {s}: lr {r['lr']:.9g} vs ref {rlr:.9g}")
        e = rel(r["grad_norm"], rg)
        worst[2] = max(worst[2], e)
        if e > GN_RTOL:
            errs.append(f"step {s}: grad_norm {r['grad_norm']:.9g} vs ref {rg:.9g} (rel {e:.2e})")
    return worst


def compare_weights(got, ref_w, errs, bf16=False):
    """Per-tensor max abs diff; bf16: got was rounded to bf16, allow half a bf16 ulp more."""
    worst = (0.0, "")
    nbad = 0
    for k in G.PARAM_NAMES:
        a, b = np.asarray(got[k], dtype=np.float64), ref_w[k]
        if a.shape != b.shape:
            errs.append(f"{k}: shape {a.shape} vs ref {b.shape}")
            continue
        d = float(np.max(np.abs(a - b)))
        tol = W_TOL * max(1.0, float(np.max(np.abs(b))))
        if bf16:
            tol += float(np.max(np.abs(b))) * 2.0 ** -8
        if not np.isfinite(d):
            d = float("inf")
        if d / tol > worst[0]:
            worst = (d / tol, f"{k} {d:.2e}/{tol:.0e}")
        if d > tol:
            nbad += 1
            if nbad <= 4:
                i = np.unravel_index(int(np.argmax(np.abs(a - b))), a.shape)
                errs.append(f"weight {k}: max abs diff {d:.3e} > tol {tol:.1e} at {tuple(map(int, i))} "
                            f"({a[i]:.7g} vs ref {b[i]:.7g})")
    if nbad > 4:
        errs.append(f"... {nbad} tensors over tolerance in all")
    return worst[1]


def check_saved(path, cfg, init_w, errs, what="model.bin"):
    """Reads the trainer's model.bin: header as cfg, padded wte rows as in init_w."""
    try:
        gcfg, gw, ver = G.read_checkpoint(path)
    except (OSError, ValueError) as e:
        errs.append(f"{what}: {e}")
        return None, None
    if gcfg != cfg:
        errs.append(f"{what}: header {gcfg}, expected {cfg}")
        return None, None
    V = cfg["vocab_size"]
    pad_got, pad_want = gw["wte"][V:], np.asarray(init_w["wte"], dtype=np.float32)[V:]
    if not np.array_equal(pad_got, pad_want):
        errs.append(f"{what}: padded wte rows {V}..{cfg['padded_vocab_size'] - 1} not their "
                    f"initial zeros (max |diff| {float(np.max(np.abs(pad_got - pad_want))):.3e})")
    return gw, ver


def next_batch_check(cfg, tokens, tc, got_w, ref_w, errs):
    """(b) the reference on the trainer's saved weights vs on its own final weights, for the
    batch the next step would read."""
    nb = G.step_batches(tokens, int(tc["micro_batch_size"]), int(tc["sequence_len"]),
                        int(tc["gradient_accumulation_steps"]), int(tc["max_steps"]) + 1)
    l_got = G.batch_loss(cfg, got_w, nb)
    l_ref = G.batch_loss(cfg, ref_w, nb)
    e = rel(l_got, l_ref)
    if e > LOSS_RTOL:
        errs.append(f"next-batch loss on saved model.bin {l_got:.9g} vs on reference weights "
                    f"{l_ref:.9g} (rel {e:.2e})")
    return l_got, e


def check_case(case):
    name = case["name"]
    cfg, tc = case["cfg"], dict(case["tc"])
    work = os.path.join(ROOT, name)
    os.makedirs(work)
    weights = G.init_weights(cfg, seed=len(name) * 11 + 3, **case.get("init", {}))
    ckpt = os.path.join(work, "model.bin")
    G.write_checkpoint(ckpt, cfg, weights, version=case["version"])
    if case["version"] == 5:  # what the trainer reads: the bf16-rounded weights
        weights = {k: G.bf16_round(v) for k, v in weights.items()}
    _, back, _ = G.read_checkpoint(ckpt)
    assert all(np.array_equal(back[k], weights[k]) for k in weights)
    shard = os.path.join(work, "train.bin")
    G.write_shard(shard, G.random_tokens(case["n_tokens"], cfg["vocab_size"], seed=len(name)),
                  version=case["shard_version"])
    tokens = G.read_shard(shard)
    tc.update(base_model=ckpt, train_data=shard, num_threads=case.get("threads", 1))

    ref = G.train_reference(cfg, weights, tokens, tc)
    nsteps = int(tc["max_steps"])
    errs, notes = [], []
    mgn = float(tc["max_grad_norm"])
    nclip = sum(g > mgn for g in ref["grad_norms"])
    if case["expect_clip"] and nclip == 0:
        errs.append(f"test setup: reference grad_norm never exceeds {mgn} ({ref['grad_norms']})")
    if nclip:
        notes.append(f"clipped {nclip}/{nsteps}")
    init_d = max(float(np.max(np.abs(ref["weights"][k] - weights[k]))) for k in weights)
    if init_d < 100 * W_TOL:
        errs.append(f"test setup: reference weights moved only {init_d:.1e}")

    rows, raw, out_bin, dt = run_trainer(work, "plain", tc)
    wl, wlr, wgn = compare_steps(rows, ref, nsteps, errs)
    got_w, ver = check_saved(out_bin, cfg, weights, errs)
    wworst = ""
    if got_w is not None:
        wworst = compare_weights(got_w, ref["weights"], errs, bf16=(ver == 5))
        if ver != 3:
            notes.append(f"saved model.bin version {ver}")
        _, e = next_batch_check(cfg, tokens, tc, got_w, ref["weights"], errs)
        notes.append(f"next-batch rel {e:.1e}")

    if case.get("modes"):
        mode_checks(work, cfg, tc, tokens, raw, out_bin, got_w, rows, errs, notes)

    summary = (f"loss rel {wl:.1e}, lr rel {wlr:.1e}, gnorm rel {wgn:.1e}, worst weight "
               f"{wworst}, moved {init_d:.1e}, losses {ref['losses'][0]:.4f}->"
               f"{ref['losses'][-1]:.4f}, {', '.join(notes)}, run {dt:.1f}s")
    return errs, summary


def mode_checks(work, cfg, tc, tokens, raw, out_bin, got_w, rows, errs, notes):
    """(c) memory modes bit-identical to the plain run; (b) strict: one step longer."""
    plain_bytes = open(out_bin, "rb").read() if os.path.exists(out_bin) else None
    want = [(r["step"], r.get("loss"), r.get("grad_norm")) for r in raw]
    for tag, over, shows in MEMORY_MODES:
        mtc = dict(tc)
        mtc.update(over)
        if "disk" in tag:
            d = os.path.join(work, "offload_dir")
            os.makedirs(d, exist_ok=True)
            mtc["activation_offloading_dir"] = d
        if ARGS.perturb_mode_lr != 1.0:
            mtc["learning_rate"] = mtc["learning_rate"] * ARGS.perturb_mode_lr
        try:
            mrows, mraw, mbin, _ = run_trainer(work, tag, mtc)
        except Exception as e:  # noqa: BLE001
            errs.append(f"{tag}: {type(e).__name__}: {e}")
            continue
        p_mode, p_plain = peak(mrows, shows), peak(rows, shows)
        if p_mode is None:
            errs.append(f"{tag}: metrics.jsonl has no {shows}_peak_bytes")
        elif (shows == "device" and not p_mode < p_plain) or (shows != "device" and not p_mode > 0):
            errs.append(f"{tag}: {shows}_peak_bytes {p_mode} (plain {p_plain}): mode not in effect")
        got = [(r["step"], r.get("loss"), r.get("grad_norm")) for r in mraw]
        if got != want:
            diff = [f"step {a[0]}: loss {a[1]} gn {a[2]} vs plain {b[1]} {b[2]}"
                    for a, b in zip(got, want) if a != b][:2]
            errs.append(f"{tag}: losses/grad norms differ from the plain run ({len(got)} vs "
                        f"{len(want)} rows; {'; '.join(diff)})")
        if not os.path.exists(mbin) or open(mbin, "rb").read() != plain_bytes:
            errs.append(f"{tag}: model.bin not byte-identical to the plain run's")
    notes.append(f"{len(MEMORY_MODES)} memory modes compared")
    # one step longer (constant schedule: the first max_steps steps are the same run)
    ltc = dict(tc)
    n = int(tc["max_steps"])
    ltc["max_steps"] = n + 1
    lrows, lraw, _, _ = run_trainer(work, "longer", ltc)
    if [(r["step"], r["loss"]) for r in lraw[:n]] != [(r["step"], r["loss"]) for r in raw]:
        errs.append("run with max_steps+1: first steps' losses differ from the plain run")
    if got_w is not None and len(lrows) == n + 1:
        nb = G.step_batches(tokens, int(tc["micro_batch_size"]), int(tc["sequence_len"]),
                            int(tc["gradient_accumulation_steps"]), n + 1)
        l = G.batch_loss(cfg, got_w, nb)
        e = rel(lrows[n]["loss"], l)
        notes.append(f"next-step rel {e:.1e}")
        if e > LOSS_RTOL:
            errs.append(f"step {n + 1} loss {lrows[n]['loss']:.9g} vs reference on saved "
                        f"model.bin {l:.9g} (rel {e:.2e})")
    elif len(lrows) != n + 1:
        errs.append(f"run with max_steps {n + 1}: {len(lrows)} train rows")


def check_random_init():
    """(e) a `model:` block: header, padding, and the saved weights reproduce the next step."""
    name = "e_random_init"
    work = os.path.join(ROOT, name)
    os.makedirs(work)
    cfg = G.make_config(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, max_seq_len=32)
    shard = os.path.join(work, "train.bin")
    G.write_shard(shard, G.random_tokens(800, 97, seed=5))
    tokens = G.read_shard(shard)
    tc = train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=1,
                      max_steps=3, learning_rate=5e-3, lr_scheduler="constant", warmup_steps=0,
                      weight_decay=0.1, max_grad_norm=1.0, seed=7)
    tc["model"] = G.model_block(cfg)
    tc["train_data"] = shard
    errs, notes = [], []
    rows, raw, out_bin, dt = run_trainer(work, "n", tc)
    n = int(tc["max_steps"])
    if [int(r["step"]) for r in rows] != list(range(1, n + 1)):
        errs.append(f"steps {[r['step'] for r in rows]}")
    zero_pad = {"wte": np.zeros((cfg["padded_vocab_size"], cfg["channels"]), np.float32)}
    got_w, ver = check_saved(out_bin, cfg, zero_pad, errs)
    if got_w is not None:
        ltc = dict(tc)
        ltc["max_steps"] = n + 1
        lrows, lraw, _, _ = run_trainer(work, "n1", ltc)
        if [r["loss"] for r in lraw[:n]] != [r["loss"] for r in raw]:
            errs.append("same seed, one step longer: first steps' losses differ")
        if len(lrows) == n + 1:
            nb = G.step_batches(tokens, 2, 16, 1, n + 1)
            l = G.batch_loss(cfg, got_w, nb)
            e = rel(lrows[n]["loss"], l)
            notes.append(f"next-step rel {e:.1e}")
            if e > LOSS_RTOL:
                errs.append(f"step {n + 1} loss {lrows[n]['loss']:.9g} vs reference on saved "
                            f"model.bin {l:.9g} (rel {e:.2e})")
            # the first loss, from the trainer's initial weights, should be near ln(V)
            if not (0.5 * math.log(97) < rows[0]["loss"] < 2 * math.log(97)):
                errs.append(f"step 1 loss {rows[0]['loss']} far from ln(97) = {math.log(97):.3f}")
        else:
            errs.append(f"run with max_steps {n + 1}: {len(lrows)} train rows")
    summary = (f"version {ver}, losses {rows[0]['loss']:.4f}->{rows[-1]['loss']:.4f}, "
               f"{', '.join(notes)}, run {dt:.1f}s") if rows else ""
    return errs, summary


def check_init_values():
    """(e') llm.c's GPT-2 init, read back from a run with learning_rate 0 (model.bin = the
    initial weights): LayerNorm weights 1, biases 0, padded wte rows 0, matmul weights, wte and
    wpe ~ N(0, 0.02), the residual projections (attprojw, fcprojw) ~ N(0, 0.02 / sqrt(2 L))."""
    name = "e_random_init_values"
    work = os.path.join(ROOT, name)
    os.makedirs(work)
    cfg = G.make_config(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, max_seq_len=32)
    shard = os.path.join(work, "train.bin")
    G.write_shard(shard, G.random_tokens(200, 97, seed=6))
    tc = train_config(sequence_len=16, micro_batch_size=2, max_steps=1, learning_rate=0.0,
                      lr_scheduler="constant", warmup_steps=0, weight_decay=0.1, seed=7)
    tc["model"] = G.model_block(cfg)
    tc["train_data"] = shard
    errs = []
    rows, _, out_bin, _ = run_trainer(work, "z", tc)
    try:
        gcfg, w, _ = G.read_checkpoint(out_bin)
    except (OSError, ValueError) as e:
        return [f"model.bin: {e}"], ""
    V, L = cfg["vocab_size"], cfg["num_layers"]
    stats = []
    for k in ("ln1w", "ln2w", "lnfw"):
        if not np.all(w[k] == 1.0):
            errs.append(f"{k} not all 1 (mean {w[k].mean():.4f}, std {w[k].std():.4f})")
    for k in ("ln1b", "ln2b", "lnfb", "qkvb", "attprojb", "fcb", "fcprojb"):
        if not np.all(w[k] == 0.0):
            errs.append(f"{k} not all 0 (max |b| {np.abs(w[k]).max():.4f})")
    if not np.all(w["wte"][V:] == 0.0):
        errs.append(f"padded wte rows not 0 (std {w['wte'][V:].std():.4f})")
    for k, a in (("wte[:V]", w["wte"][:V]), ("wpe", w["wpe"]), ("qkvw", w["qkvw"]),
                 ("fcw", w["fcw"]), ("attprojw", w["attprojw"]), ("fcprojw", w["fcprojw"])):
        want = 0.02 / math.sqrt(2 * L) if k in ("attprojw", "fcprojw") else 0.02
        sd = float(a.std())
        stats.append(f"{k} {sd:.4f}")
        if abs(sd / want - 1) > 0.15 or abs(float(a.mean())) > 0.2 * want:
            errs.append(f"{k} std {sd:.4f} mean {float(a.mean()):.4f}, expected N(0, {want:.4f})")
    return errs, "std " + ", ".join(stats)


def main():
    global ARGS, ROOT
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/train_gpt", help="trainer binary")
    ap.add_argument("--threads", type=int, default=None,
                    help="num_threads for every trainer run (default: 1, and 2 in case b)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per trainer run")
    ap.add_argument("--only", default=None, help="run only cases whose name contains this")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--self-check", action="store_true",
                    help="use a float32 torch run as the candidate instead of the binary")
    ap.add_argument("--perturb-lr", type=float, default=1.0,
                    help="multiply the trainer's learning rate (to see the test fail)")
    ap.add_argument("--perturb-mode-lr", type=float, default=1.0,
                    help="multiply the memory-mode runs' learning rate (to see (c) fail)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ARGS = ap.parse_args()
    torch.manual_seed(0)
    # tiny tensors: torch's worker threads only add overhead, and their spin-waiting after
    # each parallel region competes with the trainer's threads for the cores
    torch.set_num_threads(1)
    if not ARGS.self_check:
        ARGS.bin = os.path.abspath(ARGS.bin)
        if not os.access(ARGS.bin, os.X_OK):
            print(f"FAIL setup: {ARGS.bin} is not an executable (run make first)")
            print("0 passed, 1 failed")
            return 1
    ROOT = tempfile.mkdtemp(prefix="test_gpt2_ref_")
    passed = failed = 0
    t0 = time.time()
    todo = [(c["name"], (lambda c=c: check_case(c))) for c in cases()]
    todo.append(("e_random_init", check_random_init))
    todo.append(("e_random_init_values", check_init_values))
    try:
        passed, failed = harness.run_cases(todo, ARGS.only, ARGS.verbose)
    finally:
        if ARGS.keep:
            print(f"kept {ROOT}")
        else:
            shutil.rmtree(ROOT, ignore_errors=True)
    if ARGS.verbose:
        print(f"total {time.time() - t0:.1f}s")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
