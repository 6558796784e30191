#!/usr/bin/python3
"""Token shards changed while a run reads them (issue 11, item 5).

A shard truncated, extended or replaced while train_llama trains from it must end the run
with one clear line, never a signal: the trainer must exit non-zero by exit(), and the last
line of stderr must start with "error: " and name the shard. (A memory-mapped shard that is
truncated turns the next read past the new end of file into SIGBUS.)

Each case starts a run on a shard far larger than the first steps read, waits until the run
has printed its first steps, changes the shard, and checks how the run ends. The shard is
changed long before the run could reach its end, so every case is deterministic.

Usage (from the repository root):
    /usr/bin/python3 test/test_shards_live.py --bin build/train_llama
Prints "PASS <case>" or "FAIL <case>: detail" per case; exits 1 if any case failed.
"""
import argparse
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

SHARD_MAGIC = 20240520
HEADER = 1024
NTOK = 4_000_000  # 8 MB of uint16 tokens: ~60000 steps of 64 tokens, far more than a case runs
CRASH_MARKERS = ("AddressSanitizer", "UndefinedBehaviorSanitizer", "runtime error",
                 "Segmentation fault", "Bus error", "core dumped", "Aborted")

MODEL = {
    "vocab_size": "256",
    "hidden_size": "16",
    "intermediate_size": "32",
    "num_hidden_layers": "1",
    "num_attention_heads": "2",
    "max_position_embeddings": "64",
}


def write_shard(path, ntok=NTOK):
    # uint16 tokens 0, 1, ..., 255, 0, 1, ...: all below vocab_size 256.
    body = bytes(b for i in range(256) for b in (i, 0)) * (ntok // 256)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", SHARD_MAGIC, 1, ntok, *([0] * 253)))
        f.write(body)


def write_cfg(d, train_data, shuffle):
    lines = ["model:"] + ["  %s: %s" % kv for kv in MODEL.items()]
    lines += ["train_data: %s" % train_data, "sequence_len: 32", "micro_batch_size: 2",
              "max_steps: 50000", "num_threads: 1", "shuffle: %s" % ("true" if shuffle else "false"),
              "save_steps: 0", "output_dir: %s" % os.path.join(d, "out")]
    p = os.path.join(d, "cfg.yaml")
    with open(p, "w") as f:
        f.write("\n".join(lines) + "\n")
    return p


def wait_for_steps(out_path, proc, min_lines=20, timeout=30):
    """Waits until the run's stdout (a file) shows min_lines step lines; False if it ended."""
    t_end = time.time() + timeout
    while time.time() < t_end:
        if proc.poll() is not None:
            return False
        try:
            with open(out_path, errors="replace") as f:
                if sum(1 for l in f if l.startswith("step ")) >= min_lines:
                    return True
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    return False


def run_case(binary, name, shuffle, change, watched):
    """change(shard_paths) is applied once the run trains; watched(paths): the shard the error
    must name."""
    d = tempfile.mkdtemp(prefix="llmc_live_")
    try:
        shards = [os.path.join(d, "train_00.bin"), os.path.join(d, "train_01.bin")]
        for p in shards:
            write_shard(p)
        cfg = write_cfg(d, os.path.join(d, "train_*.bin"), shuffle)
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        env.setdefault("ASAN_OPTIONS", "detect_leaks=0")
        out_path, err_path = os.path.join(d, "stdout"), os.path.join(d, "stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen([binary, "-c", cfg], cwd=d, env=env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err, start_new_session=True)
        try:
            if not wait_for_steps(out_path, proc):
                rc = proc.wait(timeout=60)
                with open(err_path, errors="replace") as f:
                    tail = f.read().strip().splitlines()[-1:]
                return "the run ended (rc %s, %s) before the shard was changed" % (rc, tail)
            change(shards)
            try:
                rc = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                return "still running 60 s after the shard was changed"
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        with open(err_path, errors="replace") as f:
            stderr = f.read()
        if rc < 0:
            try:
                sig = signal.Signals(-rc).name
            except ValueError:
                sig = str(-rc)
            return "killed by signal %s" % sig
        if rc == 0:
            return "exit code 0: the change went unnoticed"
        crash = [m for m in CRASH_MARKERS if m in stderr]
        if crash:
            return "crash report (%s) in stderr" % ", ".join(crash)
        lines = [l for l in stderr.splitlines() if l.strip()]
        if not lines:
            return "exit code %d with nothing on stderr" % rc
        last = lines[-1]
        if not last.startswith("error: "):
            return "last stderr line does not start with 'error: ': %r" % last
        want = watched(shards)
        if want not in last:
            return "error line does not name %s: %r" % (want, last)
        return ""
    finally:
        shutil.rmtree(d, ignore_errors=True)


def truncate_to(size, which=0):
    return lambda shards: os.truncate(shards[which], size)


def grow(shards):
    with open(shards[0], "ab") as f:
        f.write(b"\0" * 4096)


def replace_second(shards):
    tmp = shards[1] + ".new"
    write_shard(tmp, 1000)
    os.replace(tmp, shards[1])


CASES = [
    # In order, reading the first shard: everything past its header disappears.
    ("truncate_to_header", False, truncate_to(HEADER), lambda s: s[0]),
    # In order: the shard shrinks to an odd size in the middle of its first page.
    ("truncate_mid_page", False, truncate_to(HEADER + 2001), lambda s: s[0]),
    # Shuffled: windows come from both shards; the second loses half its tokens.
    ("truncate_shuffled", True, truncate_to(HEADER + NTOK, 1), lambda s: s[1]),
    # Shuffled: the second shard is truncated to nothing.
    ("truncate_to_zero_shuffled", True, truncate_to(0, 1), lambda s: s[1]),
    # A shard that grows after the loader sized its windows is a different file now.
    ("grow_shuffled", True, grow, lambda s: s[0]),
    # The second shard is replaced (rename over it) before the run opens it again.
    ("replaced_shuffled", True, replace_second, lambda s: s[1]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    ap.add_argument("-k", default="")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    failed = 0
    for name, shuffle, change, watched in CASES:
        if args.k not in name:
            continue
        why = run_case(binary, name, shuffle, change, watched)
        if why:
            failed += 1
            print("FAIL %s: %s" % (name, why), flush=True)
        else:
            print("PASS %s" % name, flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
