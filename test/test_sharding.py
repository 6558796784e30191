#!/usr/bin/python3
"""Data parallel training over MPI: ./train_llama under `mpirun -np 2` against one process.

    /usr/bin/python3 test/test_sharding.py --bin build/train_llama [-k substring]

Every rank reads the global batch (world x micro_batch_size rows) and trains on its rows, so
2 ranks with micro_batch_size B must train exactly what 1 process with 2B trains. Tiny
random-init models (a model: block), 4 steps, grad accumulation 2, clipping active (checked),
warmup + cosine, weight decay, validation every 2 steps, num_threads 1 per rank.

  layout_*       2 ranks x B vs 1 process x 2B, zero_stage 0 / 1 / 3 / fsdp: true, full
                 fine-tuning and LoRA (all seven projections, starting from a random adapter
                 with B != 0; adapter_model.safetensors compared), plain and
                 activation_offloading: hidden_states, plus an odd-sized tied model (shards that
                 do not divide evenly): per-step loss, grad_norm, val_loss (1e-6 rel), lr
                 (exact) and the final weights (per tensor max|a-b| <= 1e-6 * max|b|).
  offload_params_full  offload_params: true on 1 process (a full fine-tune: ZeRO-3 with its
                 pieces of the weights and their float gradients in host memory): losses and
                 final weights bit-identical to ZeRO-3 + offload_optimizer's (the same sums;
                 the resident run's to 1e-6); device peak below ZeRO-3 +
                 offload_optimizer's by at least the pieces and gradients (8 B x trainable),
                 host peak above it by at least the pieces; offload_params_z3_2ranks: 2 ranks
                 match 1 process to 1e-6 (as offload_z3_2ranks).
  offload_*      offload_optimizer on 1 process: losses and final weights bit-identical to the
                 resident optimizer; device_peak_bytes lower by at least the AdamW moments
                 (2 x 4 B x trainable params) and host_peak_bytes higher by at least that;
                 zero_stage 1 (and 3) + offload on 2 ranks matches 1 process to 1e-6; ZeRO-1
                 halves the per-rank moments (device peak of stage 1 below stage 0's); ZeRO-3
                 shards the parameters too (8 layers: device peak below stage 1's).
  ckpt_z1/z3     2 ranks, save_steps 2: checkpoint-2 holds a readable full model.safetensors
                 equal to the 1-process checkpoint (1e-6), config.json, trainer_state.json
                 (world_size 2, zero_stage), one optimizer-rankR-of-2 shard per rank and no
                 optimizer.safetensors; the shards' values (padding aside) are the 1-process
                 AdamW moments (1e-6); resuming on 2 ranks gives the unbroken run's steps 3-4
                 exactly and byte-identical final weights; resuming on 1 process (and on 2
                 ranks with another zero_stage) is refused with one 'error:' line naming the
                 layout, before any step.
  rank_dies      LLMC_COMM_TIMEOUT=5, rank 1 SIGKILLed after step 1 is logged: the job ends
                 (non-zero) within 30 s with an error message and leaves no rank behind.
  rank_hangs     the same with rank 1 SIGSTOPped (alive, silent): rank 0's watchdog aborts the
                 job within 30 s with its "did not complete within 5 s" message.
  shuffle        shuffle: true with a data set that wraps into further epochs: the 2-rank runs
                 (zero_stage 0 and 1) see the 1-process losses; the losses differ from the
                 unshuffled run (the shuffle is really on).

Stage-3 cases print SKIP while the trainer says zero_stage 3 is not implemented. Without
mpirun on PATH every case is a SKIP. --perturb X multiplies the learning rate of the runs under
test (2 ranks, offload) by X, to see the comparisons fail (e.g. --perturb 1.0001).

Why adam_epsilon is 1e-2 in cross-layout cases: 2 ranks sum each gradient in another order
than 1 process (two partial sums + MPI vs one sum), so gradients differ by float32 rounding;
with adam_epsilon 1e-8, AdamW's g / (sqrt(v) + eps) turns the rounding of near-zero gradient
elements into update differences of up to ~lr (measured: 4e-4 of max|w| after 4 steps, at
eps 1e-4 still 3e-6). With eps 1e-2 the update is smooth in g and the weights agree to
~2e-7 of max|w| (a fifth of the tolerance), while a real sharding error (a missing rank, a
wrong shard, a wrong norm) still moves them by ~1e-3, and a learning rate off by 1e-4 fails.
Single-process comparisons (offload) use the default epsilon and must be bit-identical.

Prints PASS/FAIL/SKIP per case and "N passed, M failed[, K skipped]"; exits 1 on failure.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as R  # noqa: E402

RTOL = 1e-6            # losses, grad norms, val losses, weights (per tensor, of max|w|)
CROSS_EPS = 1e-2       # adam_epsilon for cross-layout comparisons (see the docstring)
RUN_TIMEOUT = 120      # seconds for one trainer run; the test never waits longer
ARGS = None
COUNTS = {"pass": 0, "fail": 0, "skip": 0}

MODEL = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
# Odd sizes: 14525 trainable parameters, so the 2 shards cannot be equal halves; tied head.
ODD_MODEL = dict(vocab_size=61, hidden_size=25, intermediate_size=41, num_hidden_layers=3,
                 num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                 tie_word_embeddings=True, max_position_embeddings=64)
LORA = dict(adapter="lora", lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_target_linear=True)


class Skip(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# reporting

def report(name, errs):
    if errs:
        COUNTS["fail"] += 1
        print("FAIL %s: %s" % (name, "; ".join(str(e) for e in errs[:6])), flush=True)
    else:
        COUNTS["pass"] += 1
        print("PASS %s" % name, flush=True)


def skip(name, reason):
    COUNTS["skip"] += 1
    print("SKIP %s: %s" % (name, reason), flush=True)


def case(name):
    """Decorator: runs the case unless -k excludes it; exceptions become FAIL (Skip: SKIP)."""
    def wrap(fn):
        def runner(*a, **kw):
            if ARGS.k and ARGS.k not in name:
                return
            errs = []
            try:
                fn(errs, *a, **kw)
            except Skip as e:
                skip(name, str(e))
                return
            except Exception as e:  # noqa: BLE001 - a crash is a failure with its reason
                errs.append("%s: %s" % (type(e).__name__, e))
            report(name, errs)
        return runner
    return wrap


# ---------------------------------------------------------------------------------------------
# running the trainer

def clean_env(extra=None):
    """Environment without MPI launcher variables (so a plain run is a single process)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI_", "PMIX_", "PRTE_"))}
    env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
    env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    env["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    if extra:
        env.update(extra)
    return env


def yaml_text(d):
    lines = []
    for k, v in d.items():
        if k == "model":
            lines.append("model:")
            lines += ["  %s: %s" % (mk, R._yaml_scalar(mv)) for mk, mv in v.items()]
        else:
            lines.append("%s: %s" % (k, R._yaml_scalar(v)))
    return "\n".join(lines) + "\n"


def mpirun_cmd(ranks):
    return ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"]


class Run:
    def __init__(self, rc, out, err, out_dir, timed_out=False):
        self.rc, self.out, self.err, self.dir, self.timed_out = rc, out, err, out_dir, timed_out

    def tail(self):
        lines = self.err.strip().splitlines()
        picked = [l for l in lines if l.startswith("error:")][:2] or lines[-4:]  # not mpirun's box
        e = " | ".join(picked)
        return "rc %s%s; stderr: %s" % (self.rc, " (timed out)" if self.timed_out else "", e[-500:])


def kill_group(p):
    try:
        os.killpg(p.pid, signal.SIGKILL)  # the session this test started for the run
    except (ProcessLookupError, PermissionError):
        pass


def run(tc, ranks=1, sets=(), env=None, timeout=RUN_TIMEOUT):
    """Writes tc as YAML next to its output_dir and runs the trainer on `ranks` processes."""
    out_dir = tc["output_dir"]
    path = out_dir.rstrip("/") + ".yaml"
    with open(path, "w") as f:
        f.write(yaml_text(tc))
    cmd = [ARGS.bin, "-c", path]
    for s in sets:
        cmd += ["--set", s]
    if ranks > 1:
        cmd = mpirun_cmd(ranks) + cmd
    p = subprocess.Popen(cmd, cwd=ARGS.work, env=clean_env(env), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_group(p)
        out, err = p.communicate()
        timed_out = True
    return Run(p.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
               out_dir, timed_out)


def ok_or_raise(r, what):
    if r.rc != 0 or r.timed_out:
        raise RuntimeError("%s failed: %s" % (what, r.tail()))


def stage3_guard(r):
    """Skip while the trainer refuses zero_stage 3 as not implemented."""
    if r.rc != 0 and "not implemented" in r.err and ("zero_stage 3" in r.err or "fsdp" in r.err):
        line = next((l for l in r.err.splitlines() if "not implemented" in l), "").strip()
        raise Skip("trainer: %s" % line[:160])


def metrics(out_dir):
    rows, vals = {}, {}
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            if "val_loss" in d:
                vals[int(d["step"])] = d["val_loss"]
            elif "loss" in d:
                rows[int(d["step"])] = d
    return rows, vals


def trainable_count(stdout):
    m = re.search(r"parameters\s+\d+ \(trainable (\d+)\)", stdout)
    if not m:
        raise RuntimeError("no 'parameters N (trainable M)' line in the trainer's box")
    return int(m.group(1))


# ---------------------------------------------------------------------------------------------
# comparisons

def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def compare_metrics(got_dir, ref_dir, errs, steps=None, exact=False, what=""):
    g, gv = metrics(got_dir)
    r, rv = metrics(ref_dir)
    if steps is not None:
        r = {s: v for s, v in r.items() if s in steps}
        rv = {s: v for s, v in rv.items() if s in steps}
    if sorted(g) != sorted(r):
        errs.append("%strain steps %s, expected %s" % (what, sorted(g), sorted(r)))
    if sorted(gv) != sorted(rv):
        errs.append("%sval steps %s, expected %s" % (what, sorted(gv), sorted(rv)))
    for s in sorted(set(g) & set(r)):
        for key in ("loss", "grad_norm", "lr"):
            a, b = g[s][key], r[s][key]
            bad = (a != b) if (exact or key == "lr") else not (rel(a, b) <= RTOL)
            if bad:
                errs.append("%sstep %d %s %.9g vs %.9g (rel %.1e)" % (what, s, key, a, b, rel(a, b)))
    for s in sorted(set(gv) & set(rv)):
        a, b = gv[s], rv[s]
        if (a != b) if exact else not (rel(a, b) <= RTOL):
            errs.append("%sstep %d val_loss %.9g vs %.9g (rel %.1e)" % (what, s, a, b, rel(a, b)))


def compare_tensors(got_path, ref_path, errs, tol=RTOL, what=""):
    """Per tensor: max|a-b| <= tol * max|b| (same names, shapes); returns the worst ratio."""
    a, b = R.read_safetensors(got_path), R.read_safetensors(ref_path)
    if set(a) != set(b):
        errs.append("%s%s: tensors differ: missing %s, extra %s" % (
            what, os.path.basename(got_path), sorted(set(b) - set(a))[:3], sorted(set(a) - set(b))[:3]))
    worst, nbad = 0.0, 0
    for k in b:
        if k not in a:
            continue
        x, y = a[k].astype(np.float64), b[k].astype(np.float64)
        if x.shape != y.shape:
            errs.append("%s%s: shape %s vs %s" % (what, k, x.shape, y.shape))
            continue
        d = float(np.max(np.abs(x - y))) if x.size else 0.0
        if not math.isfinite(d):
            d = float("inf")
        scale = float(np.max(np.abs(y))) if y.size else 0.0
        ratio = d / (tol * scale) if scale > 0 else (0.0 if d == 0 else float("inf"))
        worst = max(worst, ratio)
        if ratio > 1:
            nbad += 1
            if nbad <= 2:
                errs.append("%s%s: max|diff| %.2e > %.0e * max|w| %.3g" % (what, k, d, tol, scale))
    if nbad > 2:
        errs.append("%s%d tensors over tolerance in all" % (what, nbad))
    return worst


def moved(path_a, path_b, errs, min_rel=1e-4, what="", skip=()):
    """Every tensor (but those whose name starts with one of skip) changed by more than min_rel
    of its scale between two saves (so a 1e-6 comparison of them means something)."""
    a, b = R.read_safetensors(path_a), R.read_safetensors(path_b)
    still = [k for k in a if k in b and not k.startswith(tuple(skip)) and
             float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) <= min_rel * float(np.max(np.abs(b[k])))]
    if still:
        errs.append("%sweights did not move between checkpoints: %s" % (what, still[:3]))


def clipping_active(out_dir, max_norm, errs):
    rows, _ = metrics(out_dir)
    if not any(r["grad_norm"] > max_norm * 1.05 for r in rows.values()):
        errs.append("setup: clipping never active (grad norms %s <= %g)" %
                    ([round(r["grad_norm"], 4) for r in rows.values()], max_norm))


def weights_file(tc):
    return "adapter_model.safetensors" if tc.get("adapter", "none") != "none" else "model.safetensors"


# ---------------------------------------------------------------------------------------------
# configurations

def train_cfg(name, model=MODEL, micro=2, **kw):
    tc = dict(model=dict(model), train_data=ARGS.train, val_data=ARGS.val, shuffle=False,
              sequence_len=16, micro_batch_size=micro, gradient_accumulation_steps=2, max_steps=4,
              learning_rate=2e-2, lr_scheduler="cosine", warmup_steps=1, weight_decay=0.1,
              max_grad_norm=0.5, adam_epsilon=CROSS_EPS, seed=7, save_steps=2, eval_steps=2,
              eval_batches=2, log_steps=1, num_threads=1, device="cpu",
              output_dir=os.path.join(ARGS.work, name))
    tc.update(kw)
    return tc


def under_test(tc):
    """The runs being checked get --perturb applied to their learning rate."""
    if ARGS.perturb != 1.0:
        tc = dict(tc, learning_rate=tc["learning_rate"] * ARGS.perturb)
    return tc


REFS = {}


def reference(key, **kw):
    """1 process with micro_batch_size 2B (cached by key); checks that it moves and clips."""
    if key in REFS:
        return REFS[key]
    tc = train_cfg("ref_" + key, micro=4, **kw)
    r = run(tc)
    ok_or_raise(r, "1-process reference " + key)
    errs = []
    wf = weights_file(tc)
    skip = ()
    if kw.get("lisa_n_layers"):  # steps 3 and 4 train one drawn layer: the others stay
        m = re.findall(r"^LISA: from step 3 the layers (\d+) train$", r.out, re.M)
        if len(m) != 1:
            raise RuntimeError("reference %s: no LISA draw for step 3 in its output" % key)
        skip = tuple("model.layers.%d." % l for l in range(kw["model"]["num_hidden_layers"]) if str(l) != m[0])
    moved(os.path.join(tc["output_dir"], "checkpoint-4", wf),
          os.path.join(tc["output_dir"], "checkpoint-2", wf), errs, skip=skip)
    clipping_active(tc["output_dir"], tc["max_grad_norm"], errs)
    if errs:
        raise RuntimeError("reference %s: %s" % (key, "; ".join(errs)))
    REFS[key] = (tc, r)
    return REFS[key]


# ---------------------------------------------------------------------------------------------
# 1. layouts: 2 ranks x B == 1 process x 2B

LAYOUTS = {"z0": dict(zero_stage=0), "z1": dict(zero_stage=1), "z3": dict(zero_stage=3),
           "fsdp": dict(fsdp=True)}
VARIANTS = {"full": dict(), "lora": dict(LORA, max_grad_norm=0.05),
            # Dropout masks follow global rows: 2 ranks must draw what one process draws.
            "lora_dropout": dict(LORA, lora_dropout=0.2, max_grad_norm=0.05),
            "odd_tied": dict(model=ODD_MODEL),
            # LISA: one of three layers at a time (drawn at steps 1, 2 and 3): every rank draws
            # the same, and a layer not drawn is left out of the norm and of AdamW everywhere.
            "lisa": dict(model=dict(MODEL, num_hidden_layers=3), lisa_n_layers=1, lisa_step_interval=2)}
MEMORY = {"plain": dict(), "hs": dict(activation_offloading="hidden_states")}


def layout_case(layout, variant, mem):
    name = "layout_%s_%s_%s" % (variant, layout, mem)

    @case(name)
    def body(errs):
        extra = dict(VARIANTS[variant], **MEMORY[mem])
        ref_tc, _ = reference(variant + "_" + mem, **extra)
        tc = under_test(train_cfg(name, micro=2, **extra, **LAYOUTS[layout]))
        r = run(tc, ranks=2)
        if layout in ("z3", "fsdp"):
            stage3_guard(r)
        ok_or_raise(r, "2-rank run")
        if "zero_stage" in LAYOUTS[layout] or "fsdp" in LAYOUTS[layout]:
            st = json.load(open(os.path.join(tc["output_dir"], "checkpoint-4", "trainer_state.json")))
            want = 3 if layout == "fsdp" else LAYOUTS[layout]["zero_stage"]
            if st.get("world_size") != 2 or st.get("zero_stage") != want:
                errs.append("trainer_state.json world_size %s zero_stage %s, expected 2 and %d" %
                            (st.get("world_size"), st.get("zero_stage"), want))
        compare_metrics(tc["output_dir"], ref_tc["output_dir"], errs)
        if mem == "hs" and peaks(tc["output_dir"])[1] == 0:
            errs.append("activation_offloading: hidden_states put nothing in host memory")
        wf = weights_file(tc)
        if wf == "adapter_model.safetensors" and os.path.exists(os.path.join(tc["output_dir"], "model.safetensors")):
            errs.append("an adapter run wrote model.safetensors")
        w = compare_tensors(os.path.join(tc["output_dir"], wf), os.path.join(ref_tc["output_dir"], wf), errs,
                            what=wf + ": ")
        if ARGS.verbose:
            print("   %s: worst weight diff %.3g of tolerance" % (name, w))
    body()


# ---------------------------------------------------------------------------------------------
# 2. optimizer offload

def peaks(out_dir):
    rows, _ = metrics(out_dir)
    return (max(r["device_peak_bytes"] for r in rows.values()),
            max(r["host_peak_bytes"] for r in rows.values()))


def offload_single_case(variant):
    name = "offload_single_%s" % variant

    @case(name)
    def body(errs):
        # The default adam_epsilon: on one process nothing may change at all.
        extra = dict(VARIANTS[variant], adam_epsilon=1e-8)
        a_tc = train_cfg(name + "_resident", micro=4, **extra)
        ra = run(a_tc)
        ok_or_raise(ra, "resident run")
        b_tc = under_test(train_cfg(name + "_offload", micro=4, offload_optimizer=True, **extra))
        rb = run(b_tc)
        ok_or_raise(rb, "offload run")
        bit_identical(a_tc, b_tc, errs)
        n = trainable_count(ra.out)
        moments = 2 * 4 * n
        (da, ha), (db, hb) = peaks(a_tc["output_dir"]), peaks(b_tc["output_dir"])
        if da - db < moments:
            errs.append("device_peak_bytes %d -> %d with offload: lower by %d, expected >= %d "
                        "(2 x 4 B x %d trainable)" % (da, db, da - db, moments, n))
        if hb - ha < moments:
            errs.append("host_peak_bytes %d -> %d with offload: higher by %d, expected >= %d" %
                        (ha, hb, hb - ha, moments))
        if ARGS.verbose:
            print("   %s: trainable %d, device %d -> %d (-%d), host %d -> %d (+%d)" %
                  (name, n, da, db, da - db, ha, hb, hb - ha))
    body()


def bit_identical(a_tc, b_tc, errs):
    """b's per-step metrics and its final and checkpoint-2 weight files exactly a's."""
    compare_metrics(b_tc["output_dir"], a_tc["output_dir"], errs, exact=True)
    wf = weights_file(a_tc)
    for sub in ("", "checkpoint-2"):
        fa = open(os.path.join(a_tc["output_dir"], sub, wf), "rb").read()
        fb = open(os.path.join(b_tc["output_dir"], sub, wf), "rb").read()
        if fa != fb:
            errs.append("%s/%s not bit-identical (max rel diff %.2e)" % (
                sub or "final", wf, compare_tensors(os.path.join(b_tc["output_dir"], sub, wf),
                                                    os.path.join(a_tc["output_dir"], sub, wf), [], tol=1)))


@case("offload_params_full")
def offload_params_single(errs):
    """offload_params: true, one process, a full fine-tune. ZeRO-3 sums each micro-batch's unit
    gradients apart before adding them (the resident run adds into its sums), so the run with
    the same bits is ZeRO-3 + offload_optimizer with its pieces on the device; what
    offload_params moves to the host is those pieces and their float gradients (8 B a
    parameter here), so device memory drops by that and host memory grows by the pieces (the
    gradients replace offload_optimizer's host copy of them)."""
    extra = dict(adam_epsilon=1e-8)
    a_tc = train_cfg("op_resident", micro=4, **extra)
    ra = run(a_tc)
    ok_or_raise(ra, "resident run")
    z_tc = train_cfg("op_z3", micro=4, zero_stage=3, offload_optimizer=True, **extra)
    ok_or_raise(run(z_tc), "zero_stage 3 + offload_optimizer run")
    b_tc = under_test(train_cfg("op_offload", micro=4, offload_params=True, **extra))
    rb = run(b_tc)
    ok_or_raise(rb, "offload_params run")
    if "runs as zero_stage 3 (set by it)" not in rb.out or "offload_optimizer: true (set by it" not in rb.out:
        errs.append("no note that offload_params runs as zero_stage 3 with offload_optimizer")
    if "| state        ZeRO-3 over 1 rank; on host: weights+grads, AdamW+master" not in rb.out:
        errs.append("the config box does not say where the state is: %s" %
                    [l for l in rb.out.splitlines() if l.startswith("| state")])
    bit_identical(z_tc, b_tc, errs)
    compare_metrics(b_tc["output_dir"], a_tc["output_dir"], errs)  # to 1e-6
    n = trainable_count(ra.out)
    (dz, hz), (db, hb) = peaks(z_tc["output_dir"]), peaks(b_tc["output_dir"])
    if dz - db < 8 * n:
        errs.append("device_peak_bytes %d with the pieces on the device, %d with offload_params: lower by %d, "
                    "expected >= %d (4 B weight + 4 B gradient x %d trainable)" % (dz, db, dz - db, 8 * n, n))
    if hb - hz < 4 * n:
        errs.append("host_peak_bytes %d -> %d with offload_params: higher by %d, expected >= %d (the pieces)" %
                    (hz, hb, hb - hz, 4 * n))
    if ARGS.verbose:
        print("   offload_params_full: trainable %d; ZeRO-3 + offload_optimizer device %d host %d; offload_params "
              "device %d host %d" % (n, dz, hz, db, hb))


def offload_sharded_case(layout, variant="full", params=False):
    name = "offload_%s%s%s_2ranks" % ("params_" if params else "", "" if variant == "full" else variant + "_", layout)

    @case(name)
    def body(errs):
        ref_tc, _ = reference(variant + "_plain", **VARIANTS[variant])
        how = dict(offload_params=True) if params else dict(offload_optimizer=True)
        tc = under_test(train_cfg(name, micro=2, **how, **VARIANTS[variant], **LAYOUTS[layout]))
        # the fp32 master reaches rank 0 for saving in chunks of 1000 floats (the LoRA
        # variant's adapters: of 100): several per piece
        chunk = "1000" if variant == "full" else "100"
        r = run(tc, ranks=2, env={"LLMC_SAVE_GATHER_FLOATS": chunk})
        if layout in ("z3", "fsdp"):
            stage3_guard(r)
        ok_or_raise(r, "2-rank offload run")
        compare_metrics(tc["output_dir"], ref_tc["output_dir"], errs)
        wf = weights_file(tc)
        for sub in ("checkpoint-2", ""):
            compare_tensors(os.path.join(tc["output_dir"], sub, wf), os.path.join(ref_tc["output_dir"], sub, wf),
                            errs, what="%s%s: " % (sub + "/" if sub else "", wf))
        if variant != "full" or params:
            return
        # Rank 0's host peak holds only its half of the moments (+ master + grads), so it must
        # be below what one process holds for all of them.
        one_tc = train_cfg(name + "_1proc", micro=4, offload_optimizer=True)
        r1 = run(one_tc)
        ok_or_raise(r1, "1-process offload run")
        n = trainable_count(r1.out)
        (_, h2), (_, h1) = peaks(tc["output_dir"]), peaks(one_tc["output_dir"])
        if h1 - h2 < 2 * 4 * n // 2 - 64:
            errs.append("rank 0 host_peak_bytes %d with 2 shards vs %d unsharded: the offloaded "
                        "optimizer state is not sharded (expected >= %d less)" % (h2, h1, 4 * n))
    body()


@case("zero1_shards_device_memory")
def zero1_memory(errs):
    """ZeRO-1 keeps half the AdamW moments per rank: rank 0's device peak drops by >= 4 B x N
    (half of 2 x 4 B x N) against zero_stage 0."""
    a_tc = train_cfg("mem_z0", micro=2, zero_stage=0, save_steps=0, eval_steps=0)
    b_tc = train_cfg("mem_z1", micro=2, zero_stage=1, save_steps=0, eval_steps=0)
    ra, rb = run(a_tc, ranks=2), run(b_tc, ranks=2)
    ok_or_raise(ra, "zero_stage 0 run")
    ok_or_raise(rb, "zero_stage 1 run")
    n = trainable_count(ra.out)
    (d0, _), (d1, _) = peaks(a_tc["output_dir"]), peaks(b_tc["output_dir"])
    if d0 - d1 < 4 * n - 64:
        errs.append("device_peak_bytes zero_stage 0 %d vs 1 %d: lower by %d, expected >= %d" %
                    (d0, d1, d0 - d1, 4 * n))


@case("zero3_shards_device_memory")
def zero3_memory(errs):
    """ZeRO-3 keeps half the parameters and gradients per rank (plus gathered copies of the
    embedding/head and two layers): on an 8-layer model rank 0's device peak must be below
    stage 1's by at least N bytes (a quarter of the fp32 parameters; the halving saves ~2.2 N)."""
    model = dict(MODEL, num_hidden_layers=8)
    a_tc = train_cfg("mem3_z1", model=model, micro=2, zero_stage=1, save_steps=0, eval_steps=0, max_steps=2)
    b_tc = train_cfg("mem3_z3", model=model, micro=2, zero_stage=3, save_steps=0, eval_steps=0, max_steps=2)
    ra = run(a_tc, ranks=2)
    ok_or_raise(ra, "zero_stage 1 run")
    rb = run(b_tc, ranks=2)
    stage3_guard(rb)
    ok_or_raise(rb, "zero_stage 3 run")
    n = trainable_count(ra.out)
    (d1, _), (d3, _) = peaks(a_tc["output_dir"]), peaks(b_tc["output_dir"])
    if d1 - d3 < n:
        errs.append("device_peak_bytes zero_stage 1 %d vs 3 %d: lower by %d, expected >= %d "
                    "(parameters not sharded?)" % (d1, d3, d1 - d3, n))
    if ARGS.verbose:
        print("   zero3_shards_device_memory: N %d, device %d -> %d (-%.2f N)" % (n, d1, d3, (d1 - d3) / n))


@case("zero3_head_unit_memory")
def zero3_head_unit(errs):
    """ZeRO-3 gathers the embedding and an untied head one at a time into one buffer (and their
    full gradients likewise), and the layers' two gathered slots lie inside that buffer (the
    embedding and head are idle while the layers run; a tied embedding is gathered again for the
    classifier); with an untied head the layers' full gradients lie inside the embedding/head
    gradients too (a tied embedding's span the whole backward). So untying the head of a
    vocabulary-heavy model (V x C = H elements each) adds the head's own state, its pieces,
    gradient piece and AdamW moments (8 H bytes a rank of 2, float), less the layers' gradient
    buffer of U elements (4 U bytes, float) that the untied run no longer has. The builds before
    added 8 H - 12 U (the tied run's slots apart), 8 H (no sharing) and 16 H (a second gathered
    copy and gradient for the head)."""
    model = dict(MODEL, vocab_size=1024, hidden_size=64, intermediate_size=64)
    peak = {}
    for tied in (True, False):
        tc = train_cfg("z3head_%s" % ("tied" if tied else "untied"), model=dict(model, tie_word_embeddings=tied),
                       micro=2, zero_stage=3, save_steps=0, eval_steps=0, max_steps=2)
        r = run(tc, ranks=2)
        ok_or_raise(r, "zero_stage 3 run (%s head)" % ("tied" if tied else "untied"))
        peak[tied] = peaks(tc["output_dir"])[0]
    h = model["vocab_size"] * model["hidden_size"]
    C, I = model["hidden_size"], model["intermediate_size"]
    D = C // model["num_attention_heads"]
    q, kv = model["num_attention_heads"] * D, model["num_key_value_heads"] * D
    u = C * q + 2 * C * kv + q * C + 3 * C * I + 2 * C  # one layer's unit (even: no padding at 2 ranks)
    want = 8 * h - 4 * u
    extra = peak[False] - peak[True]
    if abs(extra - want) > 0.25 * h:
        errs.append("untying the head added %d B of device peak (%.2f H, H = %d): expected %.2f H, the head's own "
                    "state (8 H) less the layers' gradient buffer now inside the embedding/head gradients (4 U, "
                    "U = %d)" % (extra, extra / h, h, want / h, u))
    if ARGS.verbose:
        print("   zero3_head_unit_memory: H %d, device %d (tied) -> %d (untied): +%.2f H" %
              (h, peak[True], peak[False], extra / h))


@case("zero3_save_within_budget")
def zero3_save_budget(errs):
    """Saving a ZeRO-3 model must not need more device memory than training it: rank 0 writes
    tensor by tensor, each gathered from the ranks' pieces when it is written (it once gathered
    the whole model into device memory first, which no plan counted). An 8-layer 2-rank run
    gets a device_memory_limit of its training peak plus an eighth of the model's fp32 size and
    saves checkpoint-2 and the final model under it; the saved weights are the unlimited run's."""
    model = dict(MODEL, num_hidden_layers=8)
    a_tc = train_cfg("z3save_free", model=model, micro=2, zero_stage=3, eval_steps=0)
    ra = run(a_tc, ranks=2)
    stage3_guard(ra)
    ok_or_raise(ra, "zero_stage 3 run")
    n = trainable_count(ra.out)
    dpeak, _ = peaks(a_tc["output_dir"])
    limit = dpeak + 4 * n // 8
    b_tc = train_cfg("z3save_limit", model=model, micro=2, zero_stage=3, eval_steps=0,
                     device_memory_limit=str(limit))
    rb = run(b_tc, ranks=2, env={"LLMC_SAVE_GATHER_FLOATS": "1000"})
    ok_or_raise(rb, "zero_stage 3 run with device_memory_limit %d (training peak %d, model %d B fp32)" %
                (limit, dpeak, 4 * n))
    for sub in ("checkpoint-2", ""):
        fa = os.path.join(a_tc["output_dir"], sub, "model.safetensors")
        fb = os.path.join(b_tc["output_dir"], sub, "model.safetensors")
        if open(fa, "rb").read() != open(fb, "rb").read():
            errs.append("%s/model.safetensors differs from the unlimited run's" % (sub or "final"))
    if ARGS.verbose:
        print("   zero3_save_within_budget: N %d, training peak %d, limit %d" % (n, dpeak, limit))


# ---------------------------------------------------------------------------------------------
# 3. checkpoints

def error_lines(err):
    lines = [l for l in err.splitlines() if l.strip()]
    return lines, [l for l in lines if l.startswith("error:")]


def ckpt_case(stage):
    name = "ckpt_z%d" % stage

    @case(name)
    def body(errs):
        ref_tc, _ = reference("full_plain")  # 1 process: checkpoint-2 and final model
        full_tc = under_test(train_cfg(name + "_unbroken", micro=2, zero_stage=stage))
        # each rank's moments are written in pieces of 7 floats, which the resume below reads
        r = run(full_tc, ranks=2, env={"LLMC_SAVE_PIECE_FLOATS": "7"})
        if stage == 3:
            stage3_guard(r)
        ok_or_raise(r, "2-rank run with save_steps 2")
        ck = os.path.join(full_tc["output_dir"], "checkpoint-2")
        names = sorted(os.listdir(ck)) if os.path.isdir(ck) else []
        want = ["config.json", "model.safetensors", "optimizer-rank0-of-2.safetensors",
                "optimizer-rank1-of-2.safetensors", "trainer_state.json"]
        if names != want:
            errs.append("checkpoint-2 holds %s, expected %s" % (names, want))
            if not names:
                return
        st = json.load(open(os.path.join(ck, "trainer_state.json")))
        if (st.get("step"), st.get("world_size"), st.get("zero_stage")) != (2, 2, stage):
            errs.append("trainer_state.json step/world_size/zero_stage %s/%s/%s, expected 2/2/%d" %
                        (st.get("step"), st.get("world_size"), st.get("zero_stage"), stage))
        ref_ck = os.path.join(ref_tc["output_dir"], "checkpoint-2")
        compare_tensors(os.path.join(ck, "model.safetensors"), os.path.join(ref_ck, "model.safetensors"),
                        errs, what="checkpoint-2/model.safetensors: ")
        # The shards hold each trainable parameter's moments once: the values of all shards,
        # padding (zeros) aside, are the 1-process moments, whatever the flat layout (sorted
        # comparison: sorting moves no value by more than the largest difference).
        shards = [R.read_safetensors(os.path.join(ck, "optimizer-rank%d-of-2.safetensors" % k))
                  for k in range(2) if os.path.exists(os.path.join(ck, "optimizer-rank%d-of-2.safetensors" % k))]
        ref_opt = R.read_safetensors(os.path.join(ref_ck, "optimizer.safetensors"))
        if len(shards) == 2:
            for key in ("exp_avg", "exp_avg_sq"):
                if any(key not in sh or sh[key].ndim != 1 for sh in shards):
                    errs.append("optimizer shard without a 1-d '%s'" % key)
                    break
                flat = np.concatenate([sh[key] for sh in shards]).astype(np.float64)
                want = np.concatenate([v.ravel() for k, v in ref_opt.items()
                                       if k.startswith(key + ".")]).astype(np.float64)
                if flat.size < want.size:
                    errs.append("%s: the shards hold %d values for %d trainable parameters" %
                                (key, flat.size, want.size))
                    continue
                want = np.concatenate([want, np.zeros(flat.size - want.size)])
                d = float(np.max(np.abs(np.sort(flat) - np.sort(want))))
                if not d <= RTOL * float(np.max(np.abs(want))):
                    errs.append("%s: the shards' values differ from the 1-process moments by %.2e "
                                "(max %.2e)" % (key, d, float(np.max(np.abs(want)))))
        # Resume on 2 ranks: steps 3-4 and the final model exactly as the unbroken run.
        res_tc = under_test(train_cfg(name + "_resumed", micro=2, zero_stage=stage,
                                      resume_from_checkpoint=ck))
        rr = run(res_tc, ranks=2)
        ok_or_raise(rr, "2-rank resume")
        if "resumed from" not in rr.out:
            errs.append("resume run does not say 'resumed from'")
        compare_metrics(res_tc["output_dir"], full_tc["output_dir"], errs, steps={3, 4}, exact=True,
                        what="resumed: ")
        a = open(os.path.join(res_tc["output_dir"], "model.safetensors"), "rb").read()
        b = open(os.path.join(full_tc["output_dir"], "model.safetensors"), "rb").read()
        if a != b:
            errs.append("resumed final model.safetensors differs from the unbroken run's")
        # Resume on 1 process, and on 2 ranks with another zero_stage: refused, one error line.
        for ranks, zs in ((1, stage), (2, 0)):
            bad_tc = train_cfg(name + "_refused_%d_%d" % (ranks, zs), micro=2 * (3 - ranks), zero_stage=zs,
                               resume_from_checkpoint=ck)
            rb = run(bad_tc, ranks=ranks, timeout=60)
            lines, elines = error_lines(rb.err)
            what = "resume on %d process(es) zero_stage %d" % (ranks, zs)
            if rb.rc == 0 or rb.timed_out:
                errs.append("%s was not refused (%s)" % (what, rb.tail()))
                continue
            if ranks == 1 and (len(lines) != 1 or len(elines) != 1):
                errs.append("%s: want one 'error:' line on stderr, got %r" % (what, lines[:4]))
            if not elines:
                errs.append("%s: no 'error:' line (%s)" % (what, rb.tail()))
                continue
            msg = elines[0]
            if not re.search(r"\b2 ranks?\b|\b2 rank\(s\)|world[ _]size 2", msg):
                errs.append("%s: the error does not name the checkpoint's world size 2: %r" % (what, msg))
            if ranks == 2 and "zero_stage" not in msg:
                errs.append("%s: the error does not name zero_stage: %r" % (what, msg))
            rows = metrics(bad_tc["output_dir"])[0] if os.path.exists(
                os.path.join(bad_tc["output_dir"], "metrics.jsonl")) else {}
            if rows:
                errs.append("%s trained steps %s before refusing" % (what, sorted(rows)))
        if stage == 3:
            # The shards' layout follows the units (the untied head is a unit of its own since
            # zero3_units was written): a checkpoint without the key had one unit fewer here.
            if st.get("zero3_units") != 2 + MODEL["num_hidden_layers"]:
                errs.append("trainer_state.json zero3_units %r, expected %d (embedding, head, layers)" %
                            (st.get("zero3_units"), 2 + MODEL["num_hidden_layers"]))
            old_ck = os.path.join(ARGS.work, name + "_old_layout")
            shutil.copytree(ck, old_ck)
            st.pop("zero3_units", None)
            with open(os.path.join(old_ck, "trainer_state.json"), "w") as f:
                json.dump(st, f)
            old_tc = train_cfg(name + "_old_layout_run", micro=2, zero_stage=stage, resume_from_checkpoint=old_ck)
            ro = run(old_tc, ranks=2, timeout=60)
            elines = error_lines(ro.err)[1]
            if ro.rc == 0 or not elines or "zero3" not in elines[0] and "units" not in elines[0]:
                errs.append("a ZeRO-3 checkpoint of the older unit layout was not refused by name (%s)" % ro.tail())
    body()


# ---------------------------------------------------------------------------------------------
# 4. a rank that dies or hangs

def children_map():
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                s = f.read()
            ppid = int(s[s.rindex(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(d))
    return kids


def descendants(pid):
    kids, out, todo = children_map(), [], [pid]
    while todo:
        p = todo.pop()
        for c in kids.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def rank_pids(root):
    """{rank: pid} of the trainer processes under an mpirun."""
    found = {}
    for pid in descendants(root):
        try:
            env = open("/proc/%d/environ" % pid, "rb").read().split(b"\0")
            exe = os.readlink("/proc/%d/exe" % pid)
        except OSError:
            continue
        if os.path.basename(exe) != os.path.basename(ARGS.bin):
            continue
        for e in env:
            if e.startswith(b"OMPI_COMM_WORLD_RANK="):
                found[int(e.split(b"=", 1)[1])] = pid
    return found


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            s = f.read()
        return s[s.rindex(")") + 2] != "Z"
    except OSError:
        return False


def failure_case(sig, via_config=False):
    """via_config: the 5 s limit comes from Axolotl's ddp_timeout, not LLMC_COMM_TIMEOUT."""
    name = ("rank_dies" if sig == signal.SIGKILL else "rank_hangs") + ("_ddp_timeout" if via_config else "")

    @case(name)
    def body(errs):
        tc = train_cfg(name, micro=2, zero_stage=1, max_steps=100000, save_steps=0, eval_steps=0,
                       lr_scheduler="constant", learning_rate=1e-4,
                       model=dict(MODEL, hidden_size=64, intermediate_size=128), sequence_len=32,
                       **(dict(ddp_timeout=5) if via_config else {}))
        path = tc["output_dir"] + ".yaml"
        with open(path, "w") as f:
            f.write(yaml_text(tc))
        os.makedirs(tc["output_dir"], exist_ok=True)
        log_out, log_err = open(path + ".out", "w+b"), open(path + ".err", "w+b")
        p = subprocess.Popen(mpirun_cmd(2) + [ARGS.bin, "-c", path], cwd=ARGS.work,
                             env=clean_env({} if via_config else {"LLMC_COMM_TIMEOUT": "5"}), stdout=log_out, stderr=log_err,
                             start_new_session=True)
        pids = {}
        try:
            mpath = os.path.join(tc["output_dir"], "metrics.jsonl")
            deadline = time.time() + 60
            while time.time() < deadline and p.poll() is None:
                if os.path.exists(mpath) and os.path.getsize(mpath) > 0:
                    break
                time.sleep(0.01)
            if p.poll() is not None or not (os.path.exists(mpath) and os.path.getsize(mpath) > 0):
                errs.append("the run did not log a first step (rc %s)" % p.poll())
                return
            pids = rank_pids(p.pid)
            if sorted(pids) != [0, 1]:
                errs.append("could not find both rank processes under mpirun (found %s)" % pids)
                return
            os.kill(pids[1], sig)
            t0 = time.time()
            try:
                p.wait(timeout=45)
            except subprocess.TimeoutExpired:
                errs.append("the job still runs 45 s after rank 1 got %s (it hangs)" % sig.name)
                return
            took = time.time() - t0
            log_out.seek(0), log_err.seek(0)
            text = log_out.read().decode("utf-8", "replace") + log_err.read().decode("utf-8", "replace")
            if p.returncode == 0:
                errs.append("the job exited 0 after rank 1 got %s" % sig.name)
            if took > 30:
                errs.append("the job took %.1f s to end (limit 30)" % took)
            if sig == signal.SIGKILL:
                # mpirun's own report names the dead rank; the trainer may add its own line.
                if not (re.search(r"rank 1\b", text) and re.search(r"error|abort|killed|signal", text, re.I)):
                    errs.append("no error message naming rank 1: %r" % text[-300:])
            else:
                m = re.search(r"error: rank 0: \S+(?: \S+)? did not complete within 5 s", text)
                if not m:
                    errs.append("no watchdog message from rank 0 ('... did not complete within 5 s'): %r"
                                % text[-400:])
                elif took < 4:
                    errs.append("the watchdog fired after %.1f s, before LLMC_COMM_TIMEOUT=5" % took)
            time.sleep(0.5)
            left = [r for r, pid in pids.items() if alive(pid)]
            if left:
                errs.append("rank(s) %s still alive after the job ended" % left)
            if ARGS.verbose:
                print("   %s: ended after %.1f s, rc %s" % (name, took, p.returncode))
        finally:
            if p.poll() is None:
                kill_group(p)
                p.wait()
            for pid in pids.values():  # a stopped or orphaned rank of this test
                if alive(pid):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
            log_out.close(), log_err.close()
    body()


# ---------------------------------------------------------------------------------------------
# 5. shuffled data

def shuffle_case(layout):
    name = "shuffle_%s" % layout

    @case(name)
    def body(errs):
        extra = dict(shuffle=True, train_data=ARGS.small)
        ref_tc, _ = reference("shuffle", **extra)
        noshuf_tc, _ = reference("noshuffle_small", train_data=ARGS.small)
        a, _ = metrics(ref_tc["output_dir"])
        b, _ = metrics(noshuf_tc["output_dir"])
        if [a[s]["loss"] for s in sorted(a)] == [b[s]["loss"] for s in sorted(b)]:
            errs.append("setup: shuffle true gives the losses of shuffle false")
        tc = under_test(train_cfg(name, micro=2, **extra, **LAYOUTS[layout]))
        r = run(tc, ranks=2)
        ok_or_raise(r, "2-rank shuffled run")
        compare_metrics(tc["output_dir"], ref_tc["output_dir"], errs)
        compare_tensors(os.path.join(tc["output_dir"], "model.safetensors"),
                        os.path.join(ref_tc["output_dir"], "model.safetensors"), errs)
    body()


# ---------------------------------------------------------------------------------------------

def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    ap.add_argument("-k", default="", help="run only cases whose name contains this")
    ap.add_argument("--perturb", type=float, default=1.0,
                    help="multiply the learning rate of the runs under test (to see failures)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("-v", "--verbose", action="store_true")
    ARGS = ap.parse_args()
    ARGS.bin = os.path.abspath(ARGS.bin)

    cases = ["layout_%s_%s_%s" % (v, l, m) for v in ("full", "lora") for l in LAYOUTS for m in MEMORY]
    cases += ["layout_odd_tied_%s_plain" % l for l in ("z1", "z3")] + ["layout_lora_dropout_z1_plain"]
    cases += ["offload_single_full", "offload_single_lora", "offload_z1_2ranks", "offload_z3_2ranks", "offload_lora_z3_2ranks",
              "zero1_shards_device_memory", "zero3_shards_device_memory", "zero3_head_unit_memory", "zero3_save_within_budget", "ckpt_z1", "ckpt_z3", "rank_dies", "rank_hangs", "rank_hangs_ddp_timeout",
              "shuffle_z0", "shuffle_z1"]
    if not shutil.which("mpirun"):
        for c in cases:
            if ARGS.k in c:
                skip(c, "mpirun is not on PATH (install Open MPI to test data parallelism)")
        print("%d passed, %d failed, %d skipped" % (COUNTS["pass"], COUNTS["fail"], COUNTS["skip"]))
        return
    if not os.access(ARGS.bin, os.X_OK):
        print("FAIL setup: %s is not an executable (build it with make)" % ARGS.bin)
        print("0 passed, 1 failed")
        sys.exit(1)

    ARGS.work = tempfile.mkdtemp(prefix="sharding_")
    t_start = time.time()
    try:
        ARGS.train = os.path.join(ARGS.work, "train.bin")
        ARGS.val = os.path.join(ARGS.work, "val.bin")
        ARGS.small = os.path.join(ARGS.work, "small.bin")
        R.write_shard(ARGS.train, R.random_tokens(20000, 61, seed=1))  # < every vocab here
        R.write_shard(ARGS.val, R.random_tokens(2000, 61, seed=2))
        # 3 global batches of 4 x 16 per epoch: 8 micro-batches wrap into a third epoch.
        R.write_shard(ARGS.small, R.random_tokens(4 * 16 * 3 + 1, 61, seed=3))
        # A starting adapter with B != 0 (PEFT's B = 0 would leave q/k's B at ~1e-4 after 4
        # steps, where float32 summation order alone differs by ~7e-7 of the tensor's scale).
        hf = R.make_config(**{k: v for k, v in MODEL.items()})
        spec = R.lora_spec(hf, LORA["lora_r"], LORA["lora_alpha"], list(R.LORA_TARGETS), seed=5)
        R.save_adapter_dir(os.path.join(ARGS.work, "adapter0"), spec)
        VARIANTS["lora"]["lora_model_dir"] = os.path.join(ARGS.work, "adapter0")
        VARIANTS["lora_dropout"]["lora_model_dir"] = os.path.join(ARGS.work, "adapter0")

        for variant in ("full", "lora"):
            for layout in LAYOUTS:
                for mem in MEMORY:
                    layout_case(layout, variant, mem)
        for layout in ("z1", "z3"):
            layout_case(layout, "odd_tied", "plain")
        for layout in ("z0", "z1", "z3"):
            layout_case(layout, "lisa", "plain")
        layout_case("z1", "lora_dropout", "plain")
        offload_single_case("full")
        offload_single_case("lora")
        offload_params_single()
        offload_sharded_case("z1")
        offload_sharded_case("z3")
        offload_sharded_case("z3", params=True)
        offload_sharded_case("z3", "lora")
        zero1_memory()
        zero3_memory()
        zero3_head_unit()
        zero3_save_budget()
        ckpt_case(1)
        ckpt_case(3)
        failure_case(signal.SIGKILL)
        failure_case(signal.SIGSTOP)
        failure_case(signal.SIGSTOP, via_config=True)
        shuffle_case("z0")
        shuffle_case("z1")
    finally:
        if ARGS.keep:
            print("work directory kept: %s" % ARGS.work)
        else:
            shutil.rmtree(ARGS.work, ignore_errors=True)
    if ARGS.verbose:
        print("   total %.1f s" % (time.time() - t_start))
    tail = ", %d skipped" % COUNTS["skip"] if COUNTS["skip"] else ""
    print("%d passed, %d failed%s" % (COUNTS["pass"], COUNTS["fail"], tail))
    sys.exit(1 if COUNTS["fail"] else 0)


if __name__ == "__main__":
    main()
