#!/usr/bin/python3
"""Tiered activation store (issue 12, item 2): the offloading modes keep their tensors on the
device while device_memory_limit leaves room beyond the mode's working set, then on the host
while host_memory_limit does, then on disk, in layer order.

Checks, on the CPU backend (8 layers, B=2, T=128, two micro-batches a step, 3 steps, an
evaluation every 2; "losses" are the training and evaluation losses):
  * hidden_states under a host limit that holds some layers' inputs: the rest goes to disk;
    losses and weights bit-identical to the plain run; the start-up line and the plan say how
    many layers are where; the measured device/host/disk peaks are the plan's; no files are
    left under activation_offloading_dir;
  * device + host limits: the three tiers at once (device, host and disk layers), same numbers;
  * offload true and checkpointing every 2 + offload true under a host limit (a layer's
    tensors split between host and disk): same numbers;
  * hidden_states + tiled MLP + tiled attention under a host limit: the plain run's numbers;
  * the same (tiled MLP) under mpirun with sequence_parallel_degree 2: bit-identical to those
    ranks without tiers, and within 1e-5 of the plain one-process run;
  * a host limit that holds every input without disk staging (but not with it): no disk;
  * a limit below the working set: one error line naming the key and the bytes needed;
  * auto under a host limit picks a mode that fits, and trains to the plain run's numbers.
Usage: /usr/bin/python3 test/test_tiers.py --bin build/train_llama
"""
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import tempfile

import numpy as np

from checks import check, finish, run_trainer, write_shard

UNITS = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}
B, T, C, L = 2, 128, 64, 8
LAYER_IN = B * T * C * 4  # one layer's input in float32


def size(s):
    m = re.fullmatch(r"\s*([\d.]+) (B|KiB|MiB|GiB)\s*", s)
    return float(m.group(1)) * UNITS[m.group(2)]


def plan_rows(out):
    rows, tiers = {}, {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 8 and re.match(r"[\d.]+ \w+$", cells[1]):
            rows[cells[0]] = (size(cells[1]), size(cells[2]), size(cells[3]), cells[-1] == "yes")
        m = re.match(r"tiers of (.+?): working set device ([\d.]+ \w+), host ([\d.]+ \w+); (.*)$", line)
        if m:
            tiers[m.group(1)] = (size(m.group(2)), size(m.group(3)), m.group(4))
    return rows, tiers


def split(text):
    """'... device 2 layers (..), host 3 (..), disk 1 (..)' -> (2, 3, 1)"""
    m = re.search(r"device (\d+) layers \([^)]*\), host (\d+) \([^)]*\), disk (\d+)", text or "")
    return tuple(int(x) for x in m.groups()) if m else None


class Ctx:
    pass


def tensors(blob):
    n = struct.unpack("<Q", blob[:8])[0]
    hdr = json.loads(blob[8:8 + n])
    return {k: np.frombuffer(blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dtype=np.float32)
            for k, v in hdr.items() if k != "__metadata__"}


def rel_diff(a, b):
    """Largest per-tensor max |a - b| / max |b| of two safetensors files (1 if they differ in names)."""
    ta, tb = tensors(a), tensors(b)
    if ta.keys() != tb.keys():
        return 1.0
    return max(float(np.max(np.abs(ta[k] - tb[k]))) / max(float(np.max(np.abs(tb[k]))), 1e-30) for k in tb)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    root = tempfile.mkdtemp(prefix="test_tiers.")
    offdir = os.path.join(root, "offload")
    os.makedirs(offdir)
    try:
        data = os.path.join(root, "train.bin")
        write_shard(data, [(i * 13 + 5) % 256 for i in range(B * T * 2 * 3 + 1)])
        cfg = os.path.join(root, "cfg.yaml")
        with open(cfg, "w") as f:
            f.write("model:\n  vocab_size: 256\n  hidden_size: %d\n  intermediate_size: 160\n"
                    "  num_hidden_layers: %d\n  num_attention_heads: 4\n  num_key_value_heads: 2\n"
                    "  max_position_embeddings: 256\ntrain_data: %s\nsequence_len: %d\nmicro_batch_size: %d\n"
                    "gradient_accumulation_steps: 2\nmax_steps: 3\nnum_threads: 1\nmin_offload_size: 0\n"
                    "shuffle: false\ndevice: cpu\nactivation_offloading_dir: %s\nlearning_rate: 1e-2\n"
                    "val_data: %s\neval_steps: 2\n" % (C, L, data, T, B, offdir, data))

        def mpirun(ranks, *args):
            argv = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none", binary, "-c", cfg]
            for a in args:
                argv += [a] if a.startswith("--") else ["--set", a]
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("OMPI_", "PMI_", "PMIX_", "PRTE_")) and k != "LLMC_DEVICE"}
            env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                       OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
            return p.returncode, p.stdout, p.stderr

        def train(name, *sets, ranks=1):
            out = os.path.join(root, name)
            if ranks > 1:
                rc, so, se = mpirun(ranks, "output_dir=" + out, *sets)
            else:
                rc, so, se = run_trainer(binary, cfg, "output_dir=" + out, *sets, drop_env=("LLMC_DEVICE",))
            r = Ctx()
            r.rc, r.out, r.err, r.dir = rc, so, se, out
            r.metrics = []
            mp = os.path.join(out, "metrics.jsonl")
            if rc == 0 and os.path.exists(mp):
                r.metrics = [json.loads(l) for l in open(mp) if l.strip()]
            # Training and evaluation losses (an eval pass keeps nothing, wherever the tiers are).
            r.losses = [(m.get("loss"), m.get("val_loss")) for m in r.metrics if "loss" in m or "val_loss" in m]
            r.peaks = tuple(max([int(m.get(k, 0)) for m in r.metrics] or [-1])
                            for k in ("device_peak_bytes", "host_peak_bytes", "disk_peak_bytes"))
            w = os.path.join(out, "model.safetensors")
            r.weights = open(w, "rb").read() if os.path.exists(w) else None
            m = re.search(r"memory tiers: (.*)", so)
            r.split = split(m.group(1)) if m else None
            return r

        def plan(*sets):
            rc, so, se = run_trainer(binary, cfg, "output_dir=" + os.path.join(root, "plan"), *sets, "--plan",
                                     drop_env=("LLMC_DEVICE",))
            return rc, so, se

        plain = train("plain")
        plain_tiled = train("plain_tiled", "tiled_mlp=true")
        check("plain reference runs (3 steps, 2 evaluations)", plain.rc == 0 and plain.weights and
              sum(v is not None for _, v in plain.losses) == 2 and sum(l is not None for l, _ in plain.losses) == 3,
              plain.err[-400:] + repr(plain.losses))
        rc, so, se = plan()
        rows, tiers = plan_rows(so)
        need = ["hidden_states", "offload true", "ckpt + offload true", "hidden_states + tiled MLP"]
        check("plan prints each tiered mode's working set", rc == 0 and all(k in tiers for k in need), so + se)
        if rc != 0 or not all(k in tiers for k in need):
            return

        def same(r, ref, label):
            ok = r.rc == 0 and r.losses == ref.losses and r.weights == ref.weights
            check(label + ": losses and weights bit-identical", ok,
                  "rc %d %s\n  %s\n  %s" % (r.rc, r.err.strip()[-400:], r.losses, ref.losses))

        def matches_plan(r, sets, mode, label):
            rc, so, se = plan(*sets)
            rows, tiers = plan_rows(so)
            p = rows.get(mode)
            t = split(tiers.get(mode, (0, 0, ""))[2])
            ok = (rc == 0 and p and p[3] and r.split == t and
                  all(abs(a - b) <= 0.006 * max(a, b) + 8 for a, b in zip(p[:3], r.peaks)))
            check(label + ": device/host/disk peaks and tier split as planned", ok,
                  "plan %s split %s; measured %s split %s" % (p, t, r.peaks, r.split))

        def debris():
            return os.listdir(offdir)

        # Disk staging is two layer inputs that a run with nothing on disk does not hold, so a
        # limit spills only when it leaves room for fewer than all but two of the inputs.
        # 1. hidden_states, host limit: 2 of the 7 offloaded inputs on the host, 5 on disk.
        wd, wh, _ = tiers["hidden_states"]
        hl = int(wd + wh + 2.5 * LAYER_IN)
        sets = ("activation_offloading=hidden_states", "host_memory_limit=%d" % hl)
        r = train("hs_host", *sets)
        same(r, plain, "hidden_states + host_memory_limit")
        check("hidden_states + host_memory_limit: 2 layers on the host, 5 on disk, disk peak > 0",
              r.split == (0, 2, 5) and r.peaks[2] == 5 * LAYER_IN, "split %s peaks %s" % (r.split, r.peaks))
        matches_plan(r, sets, "hidden_states", "hidden_states + host_memory_limit")
        check("hidden_states + host_memory_limit: no files left under activation_offloading_dir",
              not debris(), repr(debris()))

        # 2. device + host limits: 2 layers on the device, 2 on the host, 3 on disk. The device
        # layers use host memory too here (the CPU backend's device memory is host memory).
        dl = int(wd + 2.5 * LAYER_IN)
        hl = int(wd + wh + 4.5 * LAYER_IN)
        sets = ("activation_offloading=hidden_states", "device_memory_limit=%d" % dl, "host_memory_limit=%d" % hl)
        r = train("hs_dev_host", *sets)
        same(r, plain, "hidden_states + device and host limits")
        check("hidden_states + device and host limits: device 2, host 2, disk 3 layers",
              r.split == (2, 2, 3) and r.peaks[2] == 3 * LAYER_IN and r.peaks[0] <= dl,
              "split %s peaks %s limit %d" % (r.split, r.peaks, dl))
        matches_plan(r, sets, "hidden_states", "hidden_states + device and host limits")

        # 3. offload true and ckpt every 2 + offload true under a host limit.
        for mode, keys in (("offload true", ("activation_offloading=true",)),
                           ("ckpt + offload true", ("activation_offloading=true", "gradient_checkpointing=true",
                                                    "gradient_checkpointing_every=2"))):
            wd, wh, _ = tiers[mode]
            full = rows[mode][1] - wh if mode == "offload true" else 4 * LAYER_IN
            if mode == "ckpt + offload true":  # the plan's row is every 1; probe every 2's own
                rc, so, se = plan(*keys)
                wd, wh, _ = plan_rows(so)[1][mode]
            hl = int(wd + wh + 0.45 * full)
            sets = keys + ("host_memory_limit=%d" % hl,)
            r = train("tier_" + re.sub(r"\W+", "_", mode), *sets)
            same(r, plain, mode + " + host_memory_limit")
            check(mode + " + host_memory_limit: some on the host, some on disk",
                  r.split and r.split[1] > 0 and r.split[2] > 0 and r.peaks[2] > 0, "split %s peaks %s" % (r.split, r.peaks))
            if mode == "offload true":
                matches_plan(r, sets, mode, mode + " + host_memory_limit")

        # 4. tiled MLP and tiled attention (tiling changes no bits: against the plain run).
        mode = "hidden_states + tiled MLP + attention"
        wd, wh, _ = tiers[mode]
        sets = ("activation_offloading=hidden_states", "tiled_mlp=true", "tiled_attention=true",
                "host_memory_limit=%d" % int(wd + wh + 1.5 * LAYER_IN))
        r = train("hs_tiled", *sets)
        same(r, plain, mode + " + host_memory_limit")
        check(mode + " + host_memory_limit: spills", r.split == (0, 1, 6), repr(r.split))
        matches_plan(r, sets, mode, mode + " + host_memory_limit")

        # 4b. with sequence parallelism over 2 ranks (each holds T/2 tokens, so half a layer
        # input): bit-identical to the same ranks without tiers, and the plain one-process run's
        # numbers within 1e-5 (adam_epsilon 0.01 on both: a tiny epsilon would divide the last-bit
        # differences of the reordered sums by near-zero second moments).
        if shutil.which("mpirun"):
            keys = ("activation_offloading=hidden_states", "tiled_mlp=true", "sequence_parallel_degree=2",
                    "adam_epsilon=0.01")
            rc, so, se = mpirun(2, *keys, "output_dir=" + os.path.join(root, "sp_plan"), "--plan")
            sp = plan_rows(so)[1].get("hidden_states + tiled MLP")
            if rc != 0 or not sp:
                check("sequence parallel: plan", False, so[-600:] + se[-600:])
            else:
                r = train("sp_tiers", *(keys + ("host_memory_limit=%d" % int(sp[0] + sp[1] + 2.5 * LAYER_IN / 2),)),
                          ranks=2)
                r0 = train("sp_untiered", *keys, ranks=2)
                ref = train("plain_eps", "adam_epsilon=0.01")
                same(r, r0, "sequence_parallel_degree 2 + hidden_states + tiled MLP: host_memory_limit vs none")
                ok = r.rc == 0 and ref.rc == 0 and r.weights is not None and len(r.losses) == len(ref.losses)
                dl = max((abs(float(a or 0) - float(b or 0)) / max(abs(float(b or 1)), 1e-30)
                          for x, y in zip(r.losses, ref.losses) for a, b in zip(x, y)), default=1) if ok else 1
                dw = rel_diff(r.weights, ref.weights) if ok else 1
                check("sequence_parallel_degree 2 + hidden_states + tiled MLP + host_memory_limit: 2 layers on the "
                      "host, 5 on disk per rank; losses %.1e and weights %.1e of the plain run (relative)" % (dl, dw),
                      ok and r.split == (0, 2, 5) and dl <= 1e-5 and dw <= 1e-5,
                      "rc %d split %s %s" % (r.rc, r.split, r.err.strip()[-600:]))
        else:
            print("SKIP sequence parallel + tiers: no mpirun")
        check("no files left under activation_offloading_dir after all runs", not debris(), repr(debris()))

        # 5. a host limit that holds all the inputs without staging but not with it: no disk.
        wd, wh, _ = tiers["hidden_states"]
        sets = ("activation_offloading=hidden_states", "host_memory_limit=%d" % int(wd + wh + 5.5 * LAYER_IN))
        r = train("hs_nodisk", *sets)
        same(r, plain, "hidden_states, host limit that fits every input without staging")
        check("hidden_states, host limit that fits every input without staging: no disk",
              r.split == (0, 7, 0) and r.peaks[2] == 0, "split %s peaks %s" % (r.split, r.peaks))
        matches_plan(r, sets, "hidden_states", "hidden_states, host limit that fits every input without staging")

        # 6. limits below the working set.
        for key, val in (("host_memory_limit", "1MiB"), ("device_memory_limit", "1MiB")):
            rc, so, se = run_trainer(binary, cfg, "output_dir=" + os.path.join(root, "bad"),
                                     "activation_offloading=hidden_states", "%s=%s" % (key, val),
                                     drop_env=("LLMC_DEVICE",))
            lines = [l for l in se.splitlines() if l.strip()]
            check("%s below the working set: one error line naming it and the bytes needed" % key,
                  rc == 1 and len(lines) == 1 and key in lines[0] and "working set of" in lines[0], se)

        # 7. auto under a host limit that plain cannot meet.
        hl = int(rows["plain"][0] * 0.9)
        r = train("auto", "activation_offloading=auto", "host_memory_limit=%d" % hl)
        picked = re.search(r"auto picked '(.+)'", r.out)
        same(r, plain, "auto under host_memory_limit")
        check("auto under host_memory_limit picks a mode whose device + host peaks fit",
              picked and r.peaks[0] + r.peaks[1] <= hl, "%s peaks %s limit %d" % (picked and picked.group(1), r.peaks, hl))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
