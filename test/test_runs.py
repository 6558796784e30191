#!/usr/bin/env python3
"""Run lifecycle: which checkpoint a run may resume, one run per output_dir, a clean stop on
SIGINT/SIGTERM, and no debris after a SIGKILL.

  identity_*  resume_from_checkpoint refuses a checkpoint of another run (model shape, base
              model of the same shape, LoRA and GPT-2 runs, a training key) with one line
              naming the first key that differs; max_steps may change; a moved copy of the
              base model is the same model; an old checkpoint (no 'run') resumes with a note
  lock_*      a second run on a busy output_dir stops naming the holder's pid; a .lock left by
              a SIGKILLed run does not block
  signal_*    SIGTERM/SIGINT finish the step, write checkpoint-STEP, exit 143/130; resuming
              gives bit-identical weights and losses; a second signal exits at once, leaving
              no half-written checkpoint visible
  debris_*    after a SIGKILL mid-step with activation_offloading: disk, the next run in that
              output_dir/offload dir removes the dead run's temporary directories and offload
              files (never a live run's)
  fsync_*     (strace) every file of a checkpoint and the final model is fsynced before the
              rename that publishes it
  /usr/bin/python3 test/test_runs.py --bin build/train_llama
"""
import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

from checks import check, finish, write_shard

LLAMA = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
GPT2 = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "max_position_embeddings": 64}


def config(name, out, model=LLAMA, **keys):
    """A YAML file under TMP; keys override the defaults (None drops a key)."""
    kv = {"train_data": os.path.join(TMP, "train.bin"), "sequence_len": 16, "micro_batch_size": 2,
          "gradient_accumulation_steps": 1, "max_steps": 6, "learning_rate": 1e-2,
          "warmup_steps": 1, "save_steps": 3, "num_threads": 1, "output_dir": out}
    kv.update(keys)
    path = os.path.join(TMP, name + ".yaml")
    with open(path, "w") as f:
        if model and "base_model" not in kv:
            f.write("model:\n" + "".join("  %s: %s\n" % (k, v) for k, v in model.items()))
        for k, v in kv.items():
            if v is not None:
                f.write("%s: %s\n" % (k, v))
    return path


def run(bin_, cfg, *sets, timeout=300):
    cmd = [bin_, "-c", cfg]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)


def one_error(p, *needles):
    """'' if p is a clean refusal: exit 1, one stderr line 'error: ...' holding every needle."""
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    if p.returncode != 1 or len(lines) != 1 or not lines[0].startswith("error: "):
        return "rc %d, stderr %r" % (p.returncode, p.stderr[-600:])
    missing = [n for n in needles if n not in lines[0]]
    return "error line %r lacks %r" % (lines[0], missing) if missing else ""


def losses(out):
    lines = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl")) if l.strip()]
    return [(d["step"], d.get("loss"), d.get("val_loss")) for d in lines]


def temporaries(out):
    return [n for n in os.listdir(out) if re.fullmatch(r"\.(checkpoint-\d+|final)\.tmp-\d+", n)]


def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def start(bin_, cfg, *sets):
    cmd = [bin_, "-c", cfg]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_step(proc, k):
    """Reads proc's stdout until the line of step >= k; returns that step (None at EOF)."""
    for line in proc.stdout:
        m = re.match(r"step\s+(\d+)/", line)
        if m and int(m.group(1)) >= k:
            return int(m.group(1))
    return None


# ---- 9: resume identity

def test_identity(bin_):
    out = os.path.join(TMP, "ident")
    p = run(bin_, config("ident", out))
    check("identity: first run", p.returncode == 0, p.stderr[-400:])
    other = dict(LLAMA, hidden_size=64)
    p = run(bin_, config("ident_shape", out, model=other, max_steps=9), "resume_from_checkpoint=auto")
    err = one_error(p, out, "checkpoint was trained with model=llama L=2 C=32",
                    "this run has model=llama L=2 C=64")
    check("identity_model_shape: auto refuses another model's checkpoint", not err, err)
    p = run(bin_, config("ident_lr", out, max_steps=9, learning_rate=0.02), "resume_from_checkpoint=auto")
    err = one_error(p, "checkpoint-6: checkpoint was trained with learning_rate=0.01, "
                    "this run has learning_rate=0.02")
    check("identity_training_key: learning_rate differs", not err, err)
    p = run(bin_, config("ident_minlr", out, max_steps=9, cosine_min_lr_ratio=0.1), "resume_from_checkpoint=auto")
    err = one_error(p, "checkpoint was trained with cosine_min_lr_ratio=0, this run has cosine_min_lr_ratio=0.1")
    check("identity_training_key: cosine_min_lr_ratio differs", not err, err)
    p = run(bin_, config("ident_seq", out, max_steps=9, sequence_len=8), "resume_from_checkpoint=auto")
    err = one_error(p, "checkpoint was trained with sequence_len=16, this run has sequence_len=8")
    check("identity_training_key: sequence_len differs", not err, err)
    p = run(bin_, config("ident_ext", out, max_steps=9), "resume_from_checkpoint=auto")
    check("identity_max_steps: a run may be extended", p.returncode == 0 and "resumed from" in p.stdout
          and [s for s, _, _ in losses(out)] == list(range(1, 10)), p.stderr[-400:])

    # Old checkpoints (no 'run' in trainer_state.json) resume with a note.
    old = os.path.join(out, "checkpoint-9", "trainer_state.json")
    st = json.load(open(old))
    st.pop("run", None)
    json.dump(st, open(old, "w"))
    p = run(bin_, config("ident_old", out, max_steps=10), "resume_from_checkpoint=auto")
    check("identity_old_checkpoint: resumes with a note", p.returncode == 0 and "note:" in p.stdout
          and "predates resume checks" in p.stdout, p.stdout[-300:] + p.stderr[-300:])

    # Two base models of one shape (random inits with different seeds), then runs from base A.
    bases = {}
    for tag, seed in (("A", 1), ("B", 2)):
        d = os.path.join(TMP, "base" + tag)
        p = run(bin_, config("base" + tag, d, max_steps=1, seed=seed, save_steps=0))
        bases[tag] = d
    copy = os.path.join(TMP, "baseA_moved")
    shutil.copytree(bases["A"], copy)
    for kind in ("full", "lora"):
        extra = {"adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_target_linear": "true"} if kind == "lora" else {}
        o = os.path.join(TMP, "ident_base_" + kind)
        p = run(bin_, config("ib_" + kind, o, model=None, base_model=bases["A"], **extra))
        check("identity_base_%s: first run" % kind, p.returncode == 0, p.stderr[-400:])
        p = run(bin_, config("ib2_" + kind, o, model=None, base_model=bases["B"], max_steps=9, **extra),
                "resume_from_checkpoint=auto")
        err = one_error(p, "checkpoint was trained with base_model=%s, this run has base_model=%s"
                        % (bases["A"], bases["B"]))
        check("identity_base_%s: another base model of the same shape is refused" % kind, not err, err)
        # The same model under another path (copied or moved) is the same model.
        p = run(bin_, config("ib3_" + kind, o, model=None, base_model=copy, max_steps=9, **extra),
                "resume_from_checkpoint=auto")
        check("identity_base_%s: a copy of the base model resumes" % kind, p.returncode == 0, p.stderr[-400:])
        if kind == "lora":
            p = run(bin_, config("ib4_" + kind, o, model=None, base_model=copy, max_steps=12,
                                 **dict(extra, lora_r=8)), "resume_from_checkpoint=auto")
            err = one_error(p, "checkpoint was trained with lora_r=4, this run has lora_r=8")
            check("identity_base_lora: lora_r differs", not err, err)

    # GPT-2: two model.bin files of one shape, as train_gpt writes them.
    gbin = os.path.join(os.path.dirname(bin_), "train_gpt")
    if not os.path.exists(gbin):
        print("SKIP identity_gpt2: no %s" % gbin)
        return
    gb = {}
    for tag, seed in (("A", 1), ("B", 2)):
        d = os.path.join(TMP, "gbase" + tag)
        p = run(gbin, config("gbase" + tag, d, model=GPT2, max_steps=1, seed=seed, save_steps=0))
        gb[tag] = os.path.join(d, "model.bin")
    o = os.path.join(TMP, "ident_gpt2")
    p = run(gbin, config("ig", o, model=None, base_model=gb["A"]))
    check("identity_gpt2: first run", p.returncode == 0, p.stderr[-400:])
    p = run(gbin, config("ig2", o, model=None, base_model=gb["B"], max_steps=9), "resume_from_checkpoint=auto")
    err = one_error(p, "checkpoint was trained with base_model=%s, this run has base_model=%s" % (gb["A"], gb["B"]))
    check("identity_gpt2: another model.bin is refused", not err, err)
    p = run(gbin, config("ig3", o, model=None, base_model=gb["A"], max_steps=9, seed=5), "resume_from_checkpoint=auto")
    err = one_error(p, "checkpoint was trained with seed=42, this run has seed=5")
    check("identity_gpt2: seed differs", not err, err)


# ---- 10: one run per output_dir

def test_lock(bin_):
    out = os.path.join(TMP, "lock")
    cfg = config("lock", out, max_steps=100000, save_steps=0, log_steps=1)
    first = start(bin_, cfg)
    try:
        got = wait_step(first, 1)
        p = run(bin_, cfg)
        err = one_error(p, "%s is in use by another run (pid %d)" % (out, first.pid))
        check("lock_busy: a second run on the same output_dir stops", got and not err, err)
        check("lock_busy: the first run is unharmed", first.poll() is None)
    finally:
        first.kill()
        first.communicate()
    check("lock_stale: the killed run left its .lock", os.path.exists(os.path.join(out, ".lock")))
    p = run(bin_, cfg, "max_steps=2")
    check("lock_stale: a .lock left by a killed run does not block", p.returncode == 0, p.stderr[-400:])


# ---- 11: signals

def test_signals(bin_):
    n = 1000  # steps of about a millisecond: the signal lands long before the end
    ref = os.path.join(TMP, "sig_ref")
    p = run(bin_, config("sig_ref", ref, max_steps=n, save_steps=0))
    check("signal: uninterrupted run", p.returncode == 0, p.stderr[-400:])
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        name = sig.name
        out, off = os.path.join(TMP, "sig_" + name), os.path.join(TMP, "sig_off_" + name)
        # SIGINT with the disk tier (bit-identical to the plain run): its files go too.
        disk = {"activation_offloading": "disk", "activation_offloading_dir": off} if sig == signal.SIGINT else {}
        cfg = config("sig_" + name, out, max_steps=n, save_steps=0, log_steps=1, **disk)
        proc = start(bin_, cfg)
        got = wait_step(proc, 3)
        proc.send_signal(sig)
        so, se = proc.communicate(timeout=300)
        m = re.search(r"interrupted by .* at step (\d+)/%d; resume with --set resume_from_checkpoint=auto" % n, so)
        k = int(m.group(1)) if m else -1
        check("signal_%s: exits %d after the step with a checkpoint" % (name, code),
              got and proc.returncode == code and 3 <= k < n and
              os.path.exists(os.path.join(out, "checkpoint-%d" % k, "optimizer.safetensors")),
              "rc %s k %d\n%s\n%s" % (proc.returncode, k, so[-300:], se[-300:]))
        check("signal_%s: no temporary files left" % name, not temporaries(out) and
              not (disk and os.listdir(off)), str(os.listdir(out)) + str(disk and os.listdir(off)))
        p = run(bin_, cfg, "resume_from_checkpoint=auto")
        same = p.returncode == 0 and open(os.path.join(out, "model.safetensors"), "rb").read() == \
            open(os.path.join(ref, "model.safetensors"), "rb").read()
        check("signal_%s: resume gives bit-identical final weights" % name, same, p.stderr[-400:])
        check("signal_%s: resume gives identical losses" % name, p.returncode == 0 and losses(out) == losses(ref))

    # Two signals: the second exits at once; whatever is visible is whole. Both are delivered
    # together (pending while stopped), wherever the run was (often mid-checkpoint).
    out = os.path.join(TMP, "sig_twice")
    cfg = config("sig_twice", out, max_steps=n, save_steps=1, log_steps=1)
    proc = start(bin_, cfg)
    wait_step(proc, 3)
    proc.send_signal(signal.SIGSTOP)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGCONT)
    t0 = time.time()
    so, se = proc.communicate(timeout=60)
    ckpts = [d for d in os.listdir(out) if re.fullmatch(r"checkpoint-\d+", d)]
    whole = all(all(os.path.exists(os.path.join(out, d, f)) for f in
                    ("model.safetensors", "config.json", "optimizer.safetensors", "trainer_state.json"))
                for d in ckpts)
    check("signal_twice: the second signal exits at once with 128 + its number",
          proc.returncode in (130, 143) and "second signal" in se and "interrupted" not in so and
          time.time() - t0 < 30, "rc %s\n%s" % (proc.returncode, se[-300:]))
    check("signal_twice: every visible checkpoint is whole", ckpts and whole, str(ckpts))
    p = run(bin_, cfg, "resume_from_checkpoint=auto", "max_steps=%d" % (max(int(d[11:]) for d in ckpts) + 2))
    check("signal_twice: resume works and leaves no temporaries", p.returncode == 0 and not temporaries(out),
          p.stderr[-300:] + str(os.listdir(out)))


# ---- 12: debris after SIGKILL

def test_debris(bin_):
    out, off = os.path.join(TMP, "debris"), os.path.join(TMP, "offload")
    os.makedirs(off)
    cfg = config("debris", out, max_steps=100000, save_steps=2, log_steps=1,
                 activation_offloading="disk", activation_offloading_dir=off)
    proc = start(bin_, cfg)
    wait_step(proc, 3)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    left = [d for d in os.listdir(off) if d.startswith("llmc-offload-%d-" % proc.pid)]
    check("debris: the killed run left its offload directory", left, str(os.listdir(off)))
    # As a writer killed mid-checkpoint or mid-final-model leaves them; one named with a pid that
    # is alive (reused by an unrelated process: this one) is a dead run's too, under the lock.
    planted = [".checkpoint-7.tmp-%d" % dead_pid(), ".final.tmp-%d" % dead_pid(),
               ".checkpoint-9.tmp-%d" % os.getpid()]
    for d in planted:
        os.makedirs(os.path.join(out, d))
        open(os.path.join(out, d, "model.safetensors"), "w").write("half")
    # A live run's offload directory (flock held, pid alive) must never be touched.
    live = os.path.join(off, "llmc-offload-%d-live" % os.getpid())
    os.makedirs(live)
    open(os.path.join(live, "act"), "w").write("x")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        # The next run in that output_dir does not use the disk tier: it still cleans its offload dir.
        p = run(bin_, config("debris2", out, max_steps=6, save_steps=2, activation_offloading_dir=off),
                "resume_from_checkpoint=auto")
        check("debris_rerun: the next run succeeds", p.returncode == 0, p.stderr[-400:])
        check("debris_output_dir: dead runs' temporary directories removed", not temporaries(out),
              str(sorted(os.listdir(out))))
        check("debris_offload: the dead run's offload directory removed",
              not [d for d in os.listdir(off) if d != os.path.basename(live)], str(os.listdir(off)))
        check("debris_offload: a live run's offload directory kept", os.path.exists(os.path.join(live, "act")))
        p = run(bin_, config("debris3", out, max_steps=8, save_steps=2, activation_offloading="disk",
                             activation_offloading_dir=off), "resume_from_checkpoint=auto")
        check("debris_disk_rerun: a disk-tier run finishes and leaves only the live directory",
              p.returncode == 0 and os.listdir(off) == [os.path.basename(live)] and os.path.exists(live),
              p.stderr[-300:] + str(os.listdir(off)))
    finally:
        os.close(fd)


# ---- 13: fsync before publishing

def test_fsync(bin_):
    if not shutil.which("strace"):
        print("SKIP fsync: no strace")
        return
    out = os.path.join(TMP, "fsync")
    log = os.path.join(TMP, "strace.log")
    for b in (bin_, os.path.join(os.path.dirname(bin_), "train_gpt")):
        shutil.rmtree(out, ignore_errors=True)
        gpt = b.endswith("train_gpt")
        cfg = config("fsync", out, model=GPT2 if gpt else LLAMA, max_steps=2, save_steps=1)
        p = subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat,fsync,rename,renameat,renameat2",
                            "-o", log, b, "-c", cfg], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        tag = "gpt2" if gpt else "llama"
        if p.returncode != 0:
            check("fsync_%s: run under strace" % tag, False, p.stderr[-300:])
            continue
        fds, synced, bad, renames = {}, set(), [], 0
        for line in open(log):
            m = re.search(r'openat\(AT_FDCWD, "([^"]+)", ([^)]*)\)\s+=\s+(\d+)', line)
            if m:
                fds[(line.split()[0], m.group(3))] = m.group(1)
                continue
            m = re.search(r"fsync\((\d+)\)\s+=\s+0", line)
            if m:
                synced.add(os.path.normpath(fds.get((line.split()[0], m.group(1)), "?")))
                continue
            m = re.search(r'rename\w*\((?:AT_FDCWD, )?"([^"]+)", (?:AT_FDCWD, )?"([^"]+)"', line)
            if not m or ".tmp-" not in m.group(1):
                continue
            src = m.group(1)
            renames += 1
            if os.path.basename(src).startswith(".checkpoint-"):  # a whole checkpoint directory
                names = ["model.bin" if gpt else "model.safetensors", "trainer_state.json",
                         "optimizer.safetensors", ""]
                bad += [os.path.join(src, f) for f in names if os.path.normpath(os.path.join(src, f)) not in synced]
            elif src not in synced:  # one file of the final model
                bad.append(src)
        check("fsync_%s: checkpoint and final files synced before their rename" % tag,
              renames >= 3 and not bad, "%d renames; not synced: %s" % (renames, bad[:5]))


def main():
    global TMP
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    ap.add_argument("-k", default="")
    args = ap.parse_args()
    bin_ = os.path.abspath(args.bin)
    TMP = tempfile.mkdtemp(prefix="runs_")
    try:
        import random
        rnd = random.Random(1)
        write_shard(os.path.join(TMP, "train.bin"), [rnd.randrange(64) for _ in range(4000)])
        for name, fn in (("identity", test_identity), ("lock", test_lock), ("signal", test_signals),
                         ("debris", test_debris), ("fsync", test_fsync)):
            if args.k in name:
                fn(bin_)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
