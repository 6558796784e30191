#!/usr/bin/env python3
"""Resume: a run continued from a checkpoint gives bit-identical losses to an unbroken run.

Cases: resume from an explicit checkpoint path; resume with 'auto' after a run was killed
mid-way (SIGKILL while writing), which also checks that the killed run's temporary
checkpoint debris is cleaned and no half-written checkpoint is ever visible.
  /usr/bin/python3 test/test_resume.py --bin build/train_llama
"""
import argparse
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(("PASS %s" % name) if ok else ("FAIL %s: %s" % (name, detail)), flush=True)


def write_shard(path, tokens):
    hdr = [0] * 256
    hdr[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr) + struct.pack("<%dH" % len(tokens), *tokens))


def config(tmp, out, extra=""):
    path = os.path.join(tmp, os.path.basename(out) + ".yaml")
    with open(path, "w") as f:
        f.write("""model:
  vocab_size: 64
  hidden_size: 32
  intermediate_size: 64
  num_hidden_layers: 2
  num_attention_heads: 4
  num_key_value_heads: 2
  max_position_embeddings: 64
train_data: {tmp}/train.bin
val_data: {tmp}/val.bin
shuffle: true
sequence_len: 16
micro_batch_size: 2
gradient_accumulation_steps: 2
max_steps: 24
learning_rate: 1e-2
warmup_steps: 2
weight_decay: 0.1
max_grad_norm: 0.5
eval_steps: 4
eval_batches: 2
save_steps: 3
output_dir: {out}
{extra}
""".format(tmp=tmp, out=out, extra=extra))
    return path


def losses(out):
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]
    return [(d["step"], d.get("loss"), d.get("val_loss")) for d in lines]


def run(bin_, cfg, *sets, env=None):
    cmd = [bin_, "-c", cfg]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600,
                          env=dict(os.environ, **(env or {})))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    args = ap.parse_args()
    bin_ = os.path.abspath(args.bin)
    tmp = tempfile.mkdtemp(prefix="resume_")
    try:
        import random
        rnd = random.Random(1)
        # Few enough windows (11) that shuffling wraps into further epochs within the run.
        write_shard(os.path.join(tmp, "train.bin"), [rnd.randrange(64) for _ in range(16 * 2 * 11 + 1)])
        write_shard(os.path.join(tmp, "val.bin"), [rnd.randrange(64) for _ in range(200)])
        full = os.path.join(tmp, "full")
        p = run(bin_, config(tmp, full))
        check("unbroken run", p.returncode == 0, p.stderr[-500:])
        ref = losses(full)
        for step in (3, 6):
            check("checkpoint-%d complete" % step, all(os.path.exists(os.path.join(full, "checkpoint-%d" % step, f))
                  for f in ("model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json")))

        # A checkpoint's tensors are made as they are written, the moments in pieces: written
        # in pieces of 7 floats (none of this model's tensors a multiple of 7), its files are
        # the default's byte for byte.
        pieces = os.path.join(tmp, "pieces")
        p = run(bin_, config(tmp, pieces), "max_steps=3", env={"LLMC_SAVE_PIECE_FLOATS": "7"})
        same = p.returncode == 0 and all(
            open(os.path.join(d, "checkpoint-3", f), "rb").read() ==
            open(os.path.join(full, "checkpoint-3", f), "rb").read()
            for d in (pieces,) for f in ("model.safetensors", "optimizer.safetensors"))
        check("checkpoint written in 7-float pieces: files identical to the default's", same,
              "rc %d %s" % (p.returncode, p.stderr[-300:]))

        # save_first_step: a checkpoint after step 1 as well, which resumes like any other.
        first = os.path.join(tmp, "first")
        p = run(bin_, config(tmp, first, "save_first_step: true"), "max_steps=4")
        names = sorted(n for n in os.listdir(first) if n.startswith("checkpoint-")) if os.path.isdir(first) else []
        check("save_first_step: checkpoints 1, 3 and 4", p.returncode == 0 and
              names == ["checkpoint-1", "checkpoint-3", "checkpoint-4"], "rc %d %s %s" % (p.returncode, names, p.stderr[-300:]))
        if "checkpoint-1" in names:
            again = os.path.join(tmp, "first_resumed")
            p = run(bin_, config(tmp, again), "resume_from_checkpoint=" + os.path.join(first, "checkpoint-1"))
            check("save_first_step: resumed from checkpoint-1, bit-identical losses",
                  p.returncode == 0 and losses(again) == [r for r in ref if r[0] > 1], p.stderr[-300:])

        # data_seed: the data order alone. Equal to seed it is the unset run; another value
        # visits the windows in another order from the same initial weights (without shuffle
        # it changes nothing), resumes bit-identically, and a resume without it is refused.
        ds = os.path.join(tmp, "ds42")
        p = run(bin_, config(tmp, ds, "data_seed: 42"))
        check("data_seed equal to seed: the unset run's losses", p.returncode == 0 and losses(ds) == ref, p.stderr[-300:])
        ds7 = os.path.join(tmp, "ds7")
        p = run(bin_, config(tmp, ds7, "data_seed: 7"))
        l7 = losses(ds7) if p.returncode == 0 else []
        check("data_seed 7: another order (other losses from step 1)", p.returncode == 0 and len(l7) >= 6 and
              l7[0][1] != ref[0][1] and [r[1] for r in l7[:6]] != [r[1] for r in ref[:6]], "rc %d %s" % (p.returncode, p.stderr[-300:]))
        for name, extra in (("seq", ""), ("seq7", "data_seed: 7")):
            p = run(bin_, config(tmp, os.path.join(tmp, name), extra), "max_steps=3", "shuffle=false")
        check("data_seed without shuffle: no change", p.returncode == 0 and
              losses(os.path.join(tmp, "seq")) == losses(os.path.join(tmp, "seq7")), p.stderr[-300:])
        again = os.path.join(tmp, "ds7_resumed")
        p = run(bin_, config(tmp, again, "data_seed: 7"), "resume_from_checkpoint=" + os.path.join(ds7, "checkpoint-3"))
        check("data_seed 7: resumed from checkpoint-3, bit-identical losses",
              p.returncode == 0 and losses(again) == [r for r in l7 if r[0] > 3], p.stderr[-300:])
        p = run(bin_, config(tmp, os.path.join(tmp, "ds7_unset")), "resume_from_checkpoint=" + os.path.join(ds7, "checkpoint-3"))
        err = p.stderr.strip().splitlines()
        check("data_seed: resume without it refused in one line naming data_seed=7 and 42",
              p.returncode == 1 and len(err) == 1 and "data_seed=7" in err[0] and "data_seed=42" in err[0],
              "rc %d %r" % (p.returncode, p.stderr[-300:]))

        # save_only_model: checkpoints without the optimizer state, with the full checkpoint's
        # weights; resume refuses them by name; as a base_model they start a new run. A run
        # interrupted by SIGTERM still leaves a checkpoint it resumes from bit-identically.
        only = os.path.join(tmp, "only")
        p = run(bin_, config(tmp, only, "save_only_model: true"), "max_steps=3")
        ck = os.path.join(only, "checkpoint-3")
        names = sorted(os.listdir(ck)) if os.path.isdir(ck) else []
        check("save_only_model: checkpoint without optimizer.safetensors", p.returncode == 0 and
              names == ["config.json", "model.safetensors", "trainer_state.json"], "rc %d %s %s" % (p.returncode, names, p.stderr[-300:]))
        check("save_only_model: its weights are the full checkpoint's", p.returncode == 0 and
              open(os.path.join(ck, "model.safetensors"), "rb").read() ==
              open(os.path.join(full, "checkpoint-3", "model.safetensors"), "rb").read())
        p = run(bin_, config(tmp, os.path.join(tmp, "only_resumed")), "resume_from_checkpoint=" + ck)
        err = p.stderr.strip().splitlines()
        check("save_only_model: resume refused in one line naming the key", p.returncode == 1 and len(err) == 1 and
              "save_only_model" in err[0] and "base_model" in err[0], "rc %d %r" % (p.returncode, p.stderr[-400:]))
        base_cfg = config(tmp, os.path.join(tmp, "only_base"), "base_model: " + ck)
        text = open(base_cfg).read()
        open(base_cfg, "w").write(text[text.index("train_data"):])  # the model comes from base_model
        p = run(bin_, base_cfg, "max_steps=1")
        check("save_only_model: the checkpoint as base_model starts a run", p.returncode == 0, p.stderr[-300:])
        term = os.path.join(tmp, "term")
        cfg = config(tmp, term, "save_only_model: true")
        proc = subprocess.Popen([bin_, "-c", cfg], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300
        while time.time() < deadline and not os.path.exists(os.path.join(term, "checkpoint-6")) and proc.poll() is None:
            time.sleep(0.002)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate()
        stopped = [int(x) for x in re.findall(r"interrupted by \S.* at step (\d+)/", out)]
        if stopped:
            p = run(bin_, cfg, "resume_from_checkpoint=auto")
            check("save_only_model: a run stopped by SIGTERM resumes bit-identically",
                  p.returncode == 0 and losses(term) == ref, "stopped at %s, rc %d %s" % (stopped, p.returncode, p.stderr[-300:]))
        else:
            check("save_only_model: the SIGTERM landed before the last step", False, "rc %s %s" % (proc.returncode, out[-300:]))

        # Explicit path: continue from checkpoint-3 into a fresh output dir.
        part = os.path.join(tmp, "part")
        p = run(bin_, config(tmp, part), "resume_from_checkpoint=" + os.path.join(full, "checkpoint-3"))
        got = losses(part)
        want = [r for r in ref if r[0] > 3]
        check("resume from path: bit-identical losses", p.returncode == 0 and got == want,
              "rc %d\n got  %s\n want %s\n%s" % (p.returncode, got, want, p.stderr[-300:]))
        w_full = open(os.path.join(full, "model.safetensors"), "rb").read()
        w_part = open(os.path.join(part, "model.safetensors"), "rb").read() if p.returncode == 0 else b""
        check("resume from path: identical final weights", w_full == w_part)

        # Killed run, then auto: kill after checkpoint-6 appears, resume with auto.
        kill = os.path.join(tmp, "kill")
        cfg = config(tmp, kill)
        proc = subprocess.Popen([bin_, "-c", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 300
        while time.time() < deadline and not os.path.exists(os.path.join(kill, "checkpoint-6")):
            if proc.poll() is not None:
                break
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        check("run was killed mid-way", proc.returncode == -signal.SIGKILL and
              not os.path.exists(os.path.join(kill, "checkpoint-24")), "rc %s" % proc.returncode)
        # Debris as a killed writer would leave it: a temp dir owned by a dead pid.
        debris = os.path.join(kill, ".checkpoint-7.tmp-%d" % proc.pid)
        os.makedirs(debris, exist_ok=True)
        p = run(bin_, cfg, "resume_from_checkpoint=auto")
        got = losses(kill)
        check("kill + resume auto: bit-identical metrics", p.returncode == 0 and got == ref,
              "rc %d\n got  %s\n want %s\n%s" % (p.returncode, got, ref, p.stderr[-300:]))
        check("kill + resume auto: debris of the dead run removed", not os.path.exists(debris))
        names = sorted(os.listdir(kill))
        check("no temporary directories left", not [n for n in names if "tmp" in n], str(names))

        # auto with no checkpoint starts fresh and says so.
        fresh = os.path.join(tmp, "fresh")
        p = run(bin_, config(tmp, fresh), "resume_from_checkpoint=auto", "max_steps=2")
        check("resume auto without checkpoint starts fresh",
              p.returncode == 0 and "starting fresh" in p.stdout, p.stdout[-300:] + p.stderr[-300:])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n_fail = results.count(False)
    print("%d passed, %d failed" % (len(results) - n_fail, n_fail))
    sys.exit(1 if n_fail else 0)


if __name__ == "__main__":
    main()
