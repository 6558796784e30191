#!/usr/bin/env python3
"""Memory modes: every recompute policy x tier trains bit-identically to the plain run, the
measured peaks order as designed and match --plan, device_memory_limit fails clearly or is
met by the modes that fit (auto picks one), the disk tier cleans up after itself (normal
exit, killed runs, a full disk) and long context trains under a budget plain cannot meet.

Checks:
  1 equivalence   {checkpointing off, every 1, 2, 3, selective} x {offload off, true,
                  legacy, disk, hidden_states}, stash sizes 1 and large, partial offload:
                  bit-identical losses and final weights, tiled MLP included
  2 peak order    plain highest; legacy and hidden_states lowest of the offload modes;
                  checkpointing, selective below plain; disk keeps host memory low
  3 plan          --plan's device (and host, disk) peaks within 10% of the measured ones
  4 budget        plain over device_memory_limit fails with one clear line; hidden_states
                  and auto fit and give the same losses; auto with no fitting mode: an error
  5 disk tier     no debris after a run; dead runs' debris removed, live ones kept; a full
                  disk (fault injection, 16 points in step 2) fails cleanly, leaves no
                  directory (the cleanup must not race the I/O thread), the last checkpoint resumes
                  bit-identically; an unusable activation_offloading_dir is a clear error
  6 long context  T=4096 fits a budget with hidden_states + tiled MLP that plain exceeds
  /usr/bin/python3 test/test_memory_modes.py --bin build/train_llama
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
from array import array

results = []
BIN = None
TMP = None
ENV = None
SANITIZER_HITS = []


def check(name, ok, detail=""):
    results.append(bool(ok))
    print(("PASS %s" % name) if ok else ("FAIL %s: %s" % (name, detail)), flush=True)


def write_shard(path, tokens):
    hdr = [0] * 256
    hdr[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(tokens), *tokens))


# ---- configs and runs ----------------------------------------------------------------------

def tiny_base(out):
    return {
        "model": {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 96, "num_hidden_layers": 4,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64},
        "train_data": os.path.join(TMP, "tiny.bin"), "shuffle": "false", "sequence_len": 32,
        "micro_batch_size": 2, "gradient_accumulation_steps": 2, "max_steps": 4, "learning_rate": "1e-2",
        "min_offload_size": 0, "num_threads": 1, "output_dir": out,
    }


def big_base(out):
    # Activations dominate: 8 layers of B*T = 512 rows, MLP 4x wide. T 512, so tiled attention
    # has two query tiles (the CPU kernel's block is 256 rows) with tiled_mlp_shards 8 set (ceil(T /
    # hidden), the default that a default span's 2048-row floor would otherwise override).
    return {
        "model": {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 8,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512},
        "train_data": os.path.join(TMP, "big.bin"), "shuffle": "false", "sequence_len": 512,
        "micro_batch_size": 1, "gradient_accumulation_steps": 1, "max_steps": 2, "learning_rate": "1e-2",
        "min_offload_size": 0, "num_threads": 1, "tiled_mlp_shards": 8, "output_dir": out,
    }


def long_base(out):
    return {
        "model": {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 256, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096},
        "train_data": os.path.join(TMP, "long.bin"), "shuffle": "false", "sequence_len": 4096,
        "micro_batch_size": 1, "gradient_accumulation_steps": 1, "max_steps": 2, "learning_rate": "1e-2",
        "num_threads": 1, "output_dir": out,
    }


def write_config(cfg, path):
    lines = []
    for k, v in cfg.items():
        if isinstance(v, dict):
            lines.append("%s:" % k)
            lines += ["  %s: %s" % (k2, v2) for k2, v2 in v.items()]
        else:
            lines.append("%s: %s" % (k, v))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


class Run:
    pass


def run(base, name, over=None, env=None, plan=False, timeout=240):
    """Runs the trainer on base(out) updated with over; returns a Run (rc, out, err, metrics)."""
    out = os.path.join(TMP, name)
    cfg = base(out)
    cfg.update(over or {})
    path = os.path.join(TMP, name + ".yaml")
    write_config(cfg, path)
    e = dict(ENV)
    e.update(env or {})
    cmd = [BIN, "-c", path] + (["--plan"] if plan else [])
    r = Run()
    r.name, r.out, r.cfg = name, out, cfg
    t0 = time.time()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                           env=e, timeout=timeout)
        r.rc, r.stdout, r.stderr = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        r.rc, r.stdout, r.stderr = -999, "", "timed out after %ds" % timeout
    r.secs = time.time() - t0
    if "AddressSanitizer" in r.stderr or "runtime error" in r.stderr or "LeakSanitizer" in r.stderr:
        SANITIZER_HITS.append("%s: %s" % (name, r.stderr[-1500:]))
    r.metrics = []
    mpath = os.path.join(out, "metrics.jsonl")
    if not plan and os.path.exists(mpath):
        for line in open(mpath):
            if line.strip():
                r.metrics.append(json.loads(line, parse_float=str))  # loss strings kept verbatim
    return r


def run_many(jobs):
    """jobs: list of (base, name, over[, env]); runs them on all cores, returns {name: Run}."""
    workers = max(1, min(4, os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as ex:
        futs = {j[1]: ex.submit(run, *j) for j in jobs}
        return {k: f.result() for k, f in futs.items()}


def losses(r):
    return [(d["step"], d["loss"]) for d in r.metrics if "loss" in d]


def peak(r, key):
    vals = [int(d[key]) for d in r.metrics if key in d]
    return max(vals) if vals else -1


def weights_bytes(r):
    p = os.path.join(r.out, "model.safetensors")
    return open(p, "rb").read() if os.path.exists(p) else b""


def safetensors_f32(data):
    n = struct.unpack("<Q", data[:8])[0]
    hdr = json.loads(data[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        if v["dtype"] != "F32":
            raise ValueError("%s: dtype %s" % (k, v["dtype"]))
        a = array("f")
        a.frombytes(data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
        out[k] = a
    return out


def error_lines(r):
    return [l for l in r.stderr.splitlines() if l.startswith("error:")]


def why(r):
    return "rc %s; stderr: %s" % (r.rc, r.stderr.strip()[-600:])


def debris(parent):
    return sorted(n for n in os.listdir(parent) if n.startswith("llmc-offload-")) if os.path.isdir(parent) else []


# ---- the plan table ------------------------------------------------------------------------

UNITS = {"B": 1, "KiB": 1024, "MiB": 1024 ** 2, "GiB": 1024 ** 3, "TiB": 1024 ** 4}


def parse_size(s):
    m = re.fullmatch(r"\s*([0-9.]+)\s*(B|KiB|MiB|GiB|TiB)\s*", s)
    if not m:
        raise ValueError("bad size %r" % s)
    return float(m.group(1)) * UNITS[m.group(2)]


def parse_plan(text):
    """{mode: {"dev": bytes, "host": bytes, "disk": bytes, "fits": bool}} from --plan output."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 8 or cells[0] in ("mode", "") or cells[0].startswith("-"):
            continue
        rows[cells[0]] = {"dev": parse_size(cells[1]), "host": parse_size(cells[2]),
                          "disk": parse_size(cells[3]), "fits": cells[-1] == "yes"}
    return rows


# plan row name -> the keys that select that mode
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
MODES.update({k + " + tiled MLP + attention": dict(v, tiled_mlp="true", tiled_attention="true")
              for k, v in BASE_MODES.items()})


def slug(s):
    return re.sub(r"[^a-z0-9]+", "_", s.lower()).strip("_")


# ---- checks ------------------------------------------------------------------------------

def check_equivalence():
    gcs = [("nockpt", {"gradient_checkpointing": "false"}),
           ("ckpt1", {"gradient_checkpointing": "true", "gradient_checkpointing_every": 1}),
           ("ckpt2", {"gradient_checkpointing": "true", "gradient_checkpointing_every": 2}),
           ("ckpt3", {"gradient_checkpointing": "true", "gradient_checkpointing_every": 3}),  # 0-2, 3
           ("selective", {"gradient_checkpointing": "selective"})]
    aos = ["false", "true", "legacy", "disk", "hidden_states"]
    jobs = [(tiny_base, "eq_plain", {})]
    exact = []
    for gname, gover in gcs:
        for ao in aos:
            name = "eq_%s_%s" % (gname, ao)
            jobs.append((tiny_base, name, dict(gover, activation_offloading=ao)))
            exact.append(name)
    extra = {
        "eq_stash1_true": {"activation_offloading": "true", "max_fwd_stash_size": 1},
        "eq_stash1_disk": {"activation_offloading": "disk", "max_fwd_stash_size": 1},
        "eq_stashbig_true": {"activation_offloading": "true", "max_fwd_stash_size": 4096},
        "eq_stashbig_disk_ckpt2": {"activation_offloading": "disk", "max_fwd_stash_size": 1000,
                                   "gradient_checkpointing": "true", "gradient_checkpointing_every": 2},
        "eq_ckpt5_disk": {"activation_offloading": "disk", "gradient_checkpointing": "true",
                          "gradient_checkpointing_every": 5},  # one segment, longer than the model
        # Only the larger tensors move; the small ones (rstd, lse, k, v) stay on the device.
        "eq_partial_true": {"activation_offloading": "true", "min_offload_size": 8192},
        "eq_partial_disk": {"activation_offloading": "disk", "min_offload_size": 8192},
    }
    for name, over in extra.items():
        jobs.append((tiny_base, name, over))
        exact.append(name)
    # Tiled MLP: B*T = 64 rows in 3 chunks of 22 (the last one short), or 5 of 13. Every mode
    # runs the MLP over the same row chunks (tiled_mlp_shards), so tiling must change no bit:
    # each tiled run is compared with the untiled run of the same chunking.
    for k in (3, 5):
        jobs.append((tiny_base, "eq_plain_s%d" % k, {"tiled_mlp_shards": k}))
    tiled = {
        "eq_tiled3": {"tiled_mlp": "true", "tiled_mlp_shards": 3},
        "eq_tiled5": {"tiled_mlp": "true", "tiled_mlp_shards": 5},
        "eq_tiled3_ckpt2_true": {"tiled_mlp": "true", "tiled_mlp_shards": 3, "gradient_checkpointing": "true",
                                 "gradient_checkpointing_every": 2, "activation_offloading": "true"},
        "eq_tiled3_selective_disk": {"tiled_mlp": "true", "tiled_mlp_shards": 3,
                                     "gradient_checkpointing": "selective", "activation_offloading": "disk"},
        "eq_tiled3_hidden": {"tiled_mlp": "true", "tiled_mlp_shards": 3, "activation_offloading": "hidden_states"},
        "eq_tiled3_legacy": {"tiled_mlp": "true", "tiled_mlp_shards": 3, "activation_offloading": "legacy"},
    }
    for name, over in tiled.items():
        jobs.append((tiny_base, name, over))
    runs = run_many(jobs)
    plain = runs["eq_plain"]
    ref_l, ref_w = losses(plain), weights_bytes(plain)
    ok = plain.rc == 0 and len(ref_l) == 4 and ref_w and len(set(l for _, l in ref_l)) > 1
    check("equivalence: plain reference run", ok, why(plain) + " losses %s" % ref_l)
    if not ok:
        return runs
    bad = []
    for name in exact:
        r = runs[name]
        if r.rc != 0:
            bad.append("%s: %s" % (name, why(r)))
        elif losses(r) != ref_l:
            bad.append("%s: losses %s != %s" % (name, losses(r), ref_l))
        elif weights_bytes(r) != ref_w:
            bad.append("%s: final weights differ" % name)
    check("equivalence: %d mode combinations give bit-identical losses and weights" % len(exact), not bad,
          "\n  ".join(bad))
    # Equivalence only means something if the offload modes really moved their tensors.
    moved = []
    for name in exact:
        r, ao = runs[name], runs[name].cfg.get("activation_offloading", "false")
        if r.rc != 0 or ao == "false":
            continue
        if peak(r, "disk_peak_bytes" if ao == "disk" else "host_peak_bytes") <= 0:
            moved.append("%s: host %d disk %d" % (name, peak(r, "host_peak_bytes"), peak(r, "disk_peak_bytes")))
    check("equivalence: offload modes really used host/disk memory", not moved, "; ".join(moved))
    bad = []
    for name, over in tiled.items():
        r, ref = runs[name], runs["eq_plain_s%d" % over["tiled_mlp_shards"]]
        if r.rc != 0 or ref.rc != 0:
            bad.append("%s: %s %s" % (name, why(r), why(ref)))
        elif losses(r) != losses(ref) or len(losses(r)) != 4:
            bad.append("%s: losses %s != %s" % (name, losses(r), losses(ref)))
        elif weights_bytes(r) != weights_bytes(ref):
            bad.append("%s: final weights differ from the untiled run's" % name)
    check("equivalence: tiled MLP (3 and 5 uneven chunks, with recompute and every tier) bit-identical "
          "to the untiled run of the same chunking", not bad, "\n  ".join(bad))
    left = debris(ENV["TMPDIR"])
    check("disk: no llmc-offload-* left in TMPDIR after %d disk runs" %
          sum("disk" in str(j[2]) for j in jobs), not left, str(left))
    return runs


def check_peaks_and_plan():
    jobs = [(big_base, "pk_" + slug(m), over) for m, over in MODES.items()]
    jobs.append((big_base, "pk_plan", {}, None, True))
    runs = run_many(jobs)
    failed = [r for r in runs.values() if r.rc != 0]
    check("peaks: all %d modes train the 8-layer model" % len(MODES), not failed,
          "\n  ".join("%s: %s" % (r.name, why(r)) for r in failed))
    dev = {m: peak(runs["pk_" + slug(m)], "device_peak_bytes") for m in MODES}
    host = {m: peak(runs["pk_" + slug(m)], "host_peak_bytes") for m in MODES}
    disk = {m: peak(runs["pk_" + slug(m)], "disk_peak_bytes") for m in MODES}
    table = "\n  ".join("%-32s dev %10d host %10d disk %10d" % (m, dev[m], host[m], disk[m]) for m in MODES)

    others = [m for m in MODES if m != "plain"]
    check("peaks: plain has the highest device peak of all modes",
          all(0 < dev[m] < dev["plain"] for m in others), table)
    offl = ["offload true", "offload legacy", "offload disk", "hidden_states"]
    low = sorted(offl, key=lambda m: dev[m])[:2]
    check("peaks: legacy and hidden_states are the two lowest offload modes",
          max(dev["offload legacy"], dev["hidden_states"]) < min(dev["offload true"], dev["offload disk"]),
          "lowest two: %s\n  %s" % (low, table))
    check("peaks: checkpointing and selective below plain",
          0 < dev["checkpointing"] < dev["plain"] and 0 < dev["selective"] < dev["plain"], table)
    check("peaks: tiled attention lowers every mode's device peak below its tiled-MLP-only row",
          all(0 < dev[m + " + tiled MLP + attention"] < dev[m + " + tiled MLP"] for m in BASE_MODES), table)
    check("peaks: disk mode uses disk and far less host memory than host offload",
          disk["offload disk"] > 0 and 0 <= host["offload disk"] < 0.5 * host["offload true"]
          and disk["offload true"] == 0, table)

    pr = runs["pk_plan"]
    try:
        plan = parse_plan(pr.stdout)
    except ValueError as e:
        plan = {}
        pr.stderr += " " + str(e)
    check("plan: --plan prints a row for each of the %d modes" % len(MODES), pr.rc == 0 and set(plan) == set(MODES),
          "rc %d rows %s\n%s" % (pr.rc, sorted(plan), pr.stdout[-1500:] + pr.stderr[-300:]))
    bad, badhd = [], []
    for m in MODES:
        if m not in plan or dev[m] <= 0:
            bad.append("%s: no prediction or measurement" % m)
            continue
        if abs(plan[m]["dev"] - dev[m]) > 0.1 * dev[m]:
            bad.append("%s: predicted %.0f, measured %d" % (m, plan[m]["dev"], dev[m]))
        for key, meas in (("host", host[m]), ("disk", disk[m])):
            if abs(plan[m][key] - meas) > 0.1 * meas + 1024:
                badhd.append("%s %s: predicted %.0f, measured %d" % (m, key, plan[m][key], meas))
    check("plan: predicted device peak within 10% of measured, all 16 modes", not bad, "\n  ".join(bad))
    check("plan: predicted host and disk peaks within 10% of measured", not badhd, "\n  ".join(badhd))


def check_budget(eq_runs):
    pr = run(tiny_base, "bd_plan", {}, plan=True)
    plan = parse_plan(pr.stdout) if pr.rc == 0 else {}
    if "plain" not in plan or "hidden_states" not in plan:
        check("budget: plan of the small model", False, pr.stdout[-800:] + pr.stderr[-300:])
        return
    lo, hi = plan["hidden_states"]["dev"], plan["plain"]["dev"]
    limit = int((lo + hi) / 2)
    lim_kib = "%.3fKiB" % (limit / 1024.0)  # a size with a unit, as a user writes it
    ref = eq_runs["eq_plain"]
    runs = run_many([
        (tiny_base, "bd_plain", {"device_memory_limit": lim_kib}),
        (tiny_base, "bd_hidden", {"device_memory_limit": lim_kib, "activation_offloading": "hidden_states"}),
        (tiny_base, "bd_auto", {"device_memory_limit": lim_kib, "activation_offloading": "auto"}),
        (tiny_base, "bd_plan_lim", {"device_memory_limit": lim_kib}, None, True),
        (tiny_base, "bd_auto_none", {"device_memory_limit": "100KiB", "activation_offloading": "auto"}),
    ])
    fits = [m for m, row in parse_plan(runs["bd_plan_lim"].stdout).items() if row["fits"]]
    r = runs["bd_plain"]
    errs = error_lines(r)
    m = re.search(r"device memory limit.*allocating [0-9.]+ (?:B|KiB|MiB|GiB) for ([a-zA-Z][^(;]*?) \(", errs[0]) \
        if len(errs) == 1 else None
    listed = errs[0].split("modes that fit:", 1)[1].strip().split(", ") if m and "modes that fit:" in errs[0] else []
    check("budget: plain over device_memory_limit fails with one line naming the allocation and the modes that fit",
          r.rc != 0 and m is not None and sorted(listed) == sorted(fits) and "plain" not in listed
          and "hidden_states" in listed and not r.metrics,
          "%s\n  listed %s\n  plan fits %s" % (why(r), listed, fits))
    r = runs["bd_hidden"]
    check("budget: hidden_states under the limit trains with the plain run's exact losses",
          r.rc == 0 and losses(r) == losses(ref) and 0 < peak(r, "device_peak_bytes") <= limit,
          "%s peak %d limit %d\n  %s\n  %s" % (why(r), peak(r, "device_peak_bytes"), limit, losses(r), losses(ref)))
    r = runs["bd_auto"]
    pick = re.search(r"auto picked '([^']+)'", r.stdout)
    name = pick.group(1) if pick else ""
    same = losses(r) == losses(ref)
    check("budget: auto fits the limit, says which mode it picked, same losses",
          r.rc == 0 and name in fits and same and 0 < peak(r, "device_peak_bytes") <= limit,
          "%s picked %r fits %s peak %d limit %d\n  %s\n  %s" % (why(r), name, fits, peak(r, "device_peak_bytes"),
                                                                limit, losses(r), losses(ref)))
    r = runs["bd_auto_none"]
    errs = error_lines(r)
    check("budget: auto with a limit no mode meets is one clear error",
          r.rc > 0 and len(errs) == 1 and "auto" in errs[0] and "device_memory_limit" in errs[0], why(r))


def check_disk(eq_runs):
    ref = eq_runs["eq_nockpt_disk"]
    # A normal disk run in the default temp dir leaves nothing.
    r = run(tiny_base, "dk_normal", {"activation_offloading": "disk"})
    left = debris(ENV["TMPDIR"])
    check("disk: a normal run leaves no llmc-offload-* directory", r.rc == 0 and not left, why(r) + str(left))

    # Debris: a dead run's directory is removed, a live process's directory is kept.
    parent = os.path.join(TMP, "offload parent")  # a space in the path, on purpose
    os.makedirs(parent)
    p = subprocess.Popen(["true"])
    p.wait()
    dead_pid = p.pid
    try:
        os.kill(dead_pid, 0)
        dead_known = False
    except ProcessLookupError:
        dead_known = True
    dead = os.path.join(parent, "llmc-offload-%d-abc123" % dead_pid)
    live = os.path.join(parent, "llmc-offload-%d-live01" % os.getpid())
    other = os.path.join(parent, "llmc-offloadx")
    for d in (dead, live, other):
        os.makedirs(d)
        with open(os.path.join(d, "l0_s0.bin"), "wb") as f:
            f.write(b"\0" * 4096)
    r = run(tiny_base, "dk_debris", {"activation_offloading": "disk", "activation_offloading_dir": '"%s"' % parent})
    check("disk: a dead run's debris is removed, a live one's kept, its own directory removed",
          r.rc == 0 and dead_known and not os.path.exists(dead) and os.path.isfile(os.path.join(live, "l0_s0.bin"))
          and os.path.isdir(other) and debris(parent) == [os.path.basename(live)] and losses(r) == losses(ref),
          "%s; left %s" % (why(r), debris(parent)))

    # A full disk in step 2 (of 4, a checkpoint every step): clean failure, then resume. Each
    # micro-batch writes per_mb bytes, so step 2 writes bytes 2*per_mb .. 4*per_mb. Several
    # fault points at odd offsets, where after a large write fails a small one (rstd, lse)
    # still fits and lands while the run is already failing: the cleanup must not race the
    # I/O thread (when it did, most of these points left the directory behind on an idle
    # machine, a few on a busy one). Each run has its own parent directory, since a run's
    # start removes the debris of dead runs and would hide another's.
    per_mb = peak(ref, "disk_peak_bytes")  # bytes one micro-batch writes
    faults = [2 * per_mb + 10073 + i * 13331 for i in range(16) if 10073 + i * 13331 < 2 * per_mb]
    jobs = []
    for i, f in enumerate(faults):
        fparent = os.path.join(TMP, "full parent %d" % i)
        os.makedirs(fparent)
        over = {"activation_offloading": "disk", "activation_offloading_dir": '"%s"' % fparent, "save_steps": 1}
        jobs.append((tiny_base, "dk_full%d" % i, over, {"LLMC_FAULT_DISK_FULL_AFTER": str(f)}))
    fulls = {j[1]: run(*j) for j in jobs}  # one at a time: the race needs an idle second core
    bad, left, ckbad = [], [], []
    files = ("model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json")
    for i, f in enumerate(faults):
        r = fulls["dk_full%d" % i]
        errs = error_lines(r)
        steps_done = [d["step"] for d in r.metrics if "loss" in d]
        if not (r.rc > 0 and len(errs) == 1 and "No space left on device" in errs[0] and "disk" in errs[0]
                and re.search(r"llmc-offload-\d+-\w+/\S+", errs[0]) and steps_done == [1]):
            bad.append("fault after %d: %s; steps done %s" % (f, why(r), steps_done))
        d = debris(r.cfg["activation_offloading_dir"].strip('"'))
        if d:
            left.append("fault after %d: %s" % (f, d))
        ck = os.path.join(r.out, "checkpoint-1")
        if not (all(os.path.isfile(os.path.join(ck, n)) for n in files)
                and not any(n.startswith("checkpoint-") and n != "checkpoint-1" for n in os.listdir(r.out))):
            ckbad.append("fault after %d: %s" % (f, sorted(os.listdir(r.out))))
    check("disk: a full disk in step 2 stops the run with one line naming the file and the error (%d fault points)"
          % len(faults), per_mb > 0 and not bad, "per micro-batch %d\n  " % per_mb + "\n  ".join(bad))
    check("disk: no llmc-offload-* directory left after a full-disk failure", per_mb > 0 and not left
          and not debris(ENV["TMPDIR"]), "\n  ".join(left))
    check("disk: checkpoint-1 is complete after the failure, and no later one exists", per_mb > 0 and not ckbad,
          "\n  ".join(ckbad))
    if per_mb > 0:
        r = fulls["dk_full0"]
        ck = os.path.join(r.out, "checkpoint-1")
        r2 = run(tiny_base, "dk_full0", dict(jobs[0][2], resume_from_checkpoint='"%s"' % ck))
        check("disk: resuming from checkpoint-1 finishes with the unbroken run's losses and weights",
              r2.rc == 0 and losses(r2) == losses(ref) and weights_bytes(r2) == weights_bytes(ref)
              and "resumed from" in r2.stdout, "%s\n  %s\n  %s" % (why(r2), losses(r2), losses(ref)))

    # activation_offloading_dir that cannot be a directory.
    afile = os.path.join(TMP, "a_file")
    open(afile, "w").write("x")
    bad_dir = os.path.join(afile, "offload")
    r = run(tiny_base, "dk_baddir", {"activation_offloading": "disk", "activation_offloading_dir": bad_dir})
    errs = error_lines(r)
    check("disk: an unusable activation_offloading_dir is one clear error",
          r.rc > 0 and len(errs) == 1 and "activation_offloading_dir" in errs[0]
          and afile in errs[0] and "Not a directory" in errs[0], why(r))
    if os.geteuid() != 0:  # root writes anywhere
        ro = os.path.join(TMP, "readonly")
        os.makedirs(ro)
        os.chmod(ro, 0o500)
        r = run(tiny_base, "dk_rodir", {"activation_offloading": "disk", "activation_offloading_dir": ro})
        os.chmod(ro, 0o700)
        errs = error_lines(r)
        check("disk: a read-only activation_offloading_dir is one clear error",
              r.rc > 0 and len(errs) == 1 and ro in errs[0] and "Permission denied" in errs[0], why(r))


def check_long_context():
    pr = run(long_base, "lc_plan", {}, plan=True)
    plan = parse_plan(pr.stdout) if pr.rc == 0 else {}
    want = "hidden_states + tiled MLP"
    if "plain" not in plan or want not in plan or not plan[want]["dev"] < plan["plain"]["dev"]:
        check("long context: plan of the T=4096 model", False, pr.stdout[-1800:] + pr.stderr[-300:])
        return
    limit = int(plan[want]["dev"] * 1.03)
    runs = run_many([
        (long_base, "lc_plan_lim", {"device_memory_limit": limit}, None, True),
        (long_base, "lc_hidden_tiled", {"device_memory_limit": limit, "activation_offloading": "hidden_states",
                                        "tiled_mlp": "true"}),
        (long_base, "lc_plain", {"device_memory_limit": limit}),
    ])
    pl = parse_plan(runs["lc_plan_lim"].stdout)
    check("long context: --plan says plain exceeds the limit and hidden_states + tiled MLP fits",
          pl.get("plain", {}).get("fits") is False and pl.get(want, {}).get("fits") is True,
          runs["lc_plan_lim"].stdout[-1800:])
    r = runs["lc_hidden_tiled"]
    ls = losses(r)
    check("long context: T=4096 trains under the limit with hidden_states + tiled MLP, finite losses",
          r.rc == 0 and len(ls) == 2 and all(math.isfinite(float(l)) for _, l in ls)
          and 0 < peak(r, "device_peak_bytes") <= limit,
          "%s losses %s peak %d limit %d (%.1fs)" % (why(r), ls, peak(r, "device_peak_bytes"), limit, r.secs))
    r = runs["lc_plain"]
    errs = error_lines(r)
    check("long context: plain with the same limit fails with the out-of-memory message",
          r.rc > 0 and len(errs) == 1 and "device memory limit" in errs[0] and want in errs[0], why(r))


def main():
    global BIN, TMP, ENV
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    args = ap.parse_args()
    BIN = os.path.abspath(args.bin)
    if not os.access(BIN, os.X_OK):
        check("trainer binary", False, "%s is not an executable (build it first)" % BIN)
        print("0 passed, 1 failed")
        sys.exit(1)
    TMP = tempfile.mkdtemp(prefix="memmodes_")
    t_start = time.time()
    try:
        child_tmp = os.path.join(TMP, "tmpdir")
        os.makedirs(child_tmp)
        ENV = dict(os.environ)
        ENV["TMPDIR"] = child_tmp
        ENV.pop("LLMC_FAULT_DISK_FULL_AFTER", None)
        import random
        rnd = random.Random(7)
        write_shard(os.path.join(TMP, "tiny.bin"), [rnd.randrange(64) for _ in range(2 * 2 * 4 * 32 + 1)])
        write_shard(os.path.join(TMP, "big.bin"), [rnd.randrange(64) for _ in range(4 * 128 * 2 + 1)])
        write_shard(os.path.join(TMP, "long.bin"), [rnd.randrange(64) for _ in range(4096 * 2 + 1)])
        timings = []
        # The long-context run is the slowest; start it first beside the small ones.
        with concurrent.futures.ThreadPoolExecutor(1) as side:
            t0 = time.time()
            lc = side.submit(check_long_context)
            eq_runs = check_equivalence()
            timings.append(("equivalence", time.time() - t0))
            t0 = time.time()
            check_peaks_and_plan()
            timings.append(("peaks+plan", time.time() - t0))
            t0 = time.time()
            if eq_runs["eq_plain"].rc == 0:
                check_budget(eq_runs)
            timings.append(("budget", time.time() - t0))
            t0 = time.time()
            lc.result()
            timings.append(("long context (wait)", time.time() - t0))
        t0 = time.time()
        if eq_runs["eq_plain"].rc == 0 and eq_runs["eq_nockpt_disk"].rc == 0:
            check_disk(eq_runs)  # alone: it watches the temp directories
        else:
            check("disk: reference disk run", False, why(eq_runs["eq_nockpt_disk"]))
        timings.append(("disk", time.time() - t0))
        check("no AddressSanitizer / UBSan reports", not SANITIZER_HITS, "\n".join(SANITIZER_HITS[:3]))
        print("timings: %s; total %.1fs" % (", ".join("%s %.1fs" % t for t in timings), time.time() - t_start))
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    n_fail = results.count(False)
    print("%d passed, %d failed" % (len(results) - n_fail, n_fail))
    sys.exit(1 if n_fail else 0)


if __name__ == "__main__":
    main()
