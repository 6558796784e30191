#!/usr/bin/python3
"""Limits of the trainer: impossible sizes are refused before anything is allocated, the
parameter table scales linearly in the number of tensors, and the memory planner works for
every combination of memory keys.

Checks (each prints "PASS name" or "FAIL name: why"):
  size_*          a model or micro-batch whose sizes overflow or cannot fit is refused with one
                  "error: " line naming the keys (and "model needs X GiB" for a model), by
                  exit() and not by a signal, an out-of-memory crash or a sanitizer report;
  plan_10k_layers `--plan` of a model with 10000 tiny layers finishes within PLAN_LIMIT_S
                  (it took about a minute while the table was built in quadratic time);
  plan_matrix_*   `--plan` over combinations of offload_optimizer, gradient_checkpointing,
                  activation_offloading, adapter (lora, qlora + load_in_4bit),
                  layer_offloading, tiled_mlp, zero_stage and device_memory_limit exits 0 or
                  with one clean "error: " line;
  run_offload_optimizer_auto  a short run with offload_optimizer and activation_offloading:
                  auto (which plans first) trains.

Usage (from the repository root):
    /usr/bin/python3 test/test_limits.py --build build
    /usr/bin/python3 test/test_limits.py --build build-asan
"""
import argparse
import concurrent.futures
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_bad_inputs import (CRASH_MARKERS, MODEL, Env, Limits, check_error, cfg_file,  # noqa: E402
                             with_model, write_shard)

PLAN_LIMIT_S = 15  # the quadratic table took ~60 s at 10000 layers; linear takes ~1 s (ASan: a few)
GIB = ("GiB",)


class Runner:
    """Runs one binary in a case directory under the given limits; returns (rc, stdout, stderr,
    seconds). rc None: timed out."""
    def __init__(self, binary, root):
        self.env = Env(binary, root)
        self.root = root

    def case_dir(self, name):
        d = os.path.join(self.root, "cases", name)
        os.makedirs(d)
        return d

    def run(self, args, cwd, limits=None, timeout=60):
        env, pre = self.env.proc_env, None
        if limits and limits.mem_mb:
            if self.env.asan:
                env = dict(env)
                env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "") + ":hard_rss_limit_mb=%d" % limits.mem_mb
            else:
                import resource
                n = limits.mem_mb << 20

                def pre():
                    resource.setrlimit(resource.RLIMIT_AS, (n, n))
        t0 = time.time()
        try:
            p = subprocess.run([self.env.bin] + args, cwd=cwd, env=env, preexec_fn=pre,
                               stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                               start_new_session=True)
            return p.returncode, p.stdout.decode("utf-8", "replace"), \
                p.stderr.decode("utf-8", "replace"), time.time() - t0
        except subprocess.TimeoutExpired as e:
            err = e.stderr.decode("utf-8", "replace") if e.stderr else ""
            return None, "", err, time.time() - t0


def base_cfg(root, case_dir, **over):
    cfg = {"model": dict(MODEL), "train_data": os.path.join(root, "train.bin"), "sequence_len": "8",
           "micro_batch_size": "2", "max_steps": "1", "num_threads": "1",
           "output_dir": os.path.join(case_dir, "out")}
    cfg.update(over)
    return cfg


def clean_exit(rc, stderr):
    """'' if the run exited 0 or refused with one clean 'error: ' line, else what is wrong."""
    if rc is None:
        return "hung"
    if rc < 0:
        try:
            return "killed by signal %s" % signal.Signals(-rc).name
        except ValueError:
            return "killed by signal %d" % -rc
    crash = [m for m in CRASH_MARKERS if m in stderr]
    if crash:
        return "crash report (%s) in stderr" % ", ".join(crash)
    if rc == 0:
        return ""
    lines = [l for l in stderr.splitlines() if l.strip()]
    if len(lines) != 1 or not lines[0].startswith("error: "):
        return "exit %d without one 'error: ' line" % rc
    return ""


# ---------------------------------------------------------------------------------------
# size_*: (binary kind, model changes, other config keys, culprits). Every case runs under a
# 2 GiB address-space cap (the sanitizer's RSS cap under ASan), so an allocation attempted
# before the check shows up as an out-of-memory error instead of the expected line.

NEEDS = ("model needs",)
SIZE_CASES = [
    ("size_too_many_layers", "llama", dict(num_hidden_layers="5000000"), {},
     [NEEDS, GIB, "num_hidden_layers", "5000000"]),
    ("size_huge_hidden", "llama", dict(hidden_size="2000000000", num_attention_heads="2"), {},
     [NEEDS, GIB, "hidden_size"]),
    ("size_huge_vocab", "llama", dict(vocab_size="2000000000"), {},
     [NEEDS, GIB, "vocab_size"]),
    ("size_huge_intermediate", "llama", dict(intermediate_size="2000000000"), {},
     [NEEDS, GIB, "intermediate_size"]),
    ("size_heads_x_head_dim", "llama",
     dict(num_attention_heads="65536", num_key_value_heads="1", head_dim="65536"), {},
     ["num_attention_heads", "head_dim"]),
    ("size_tokens_per_batch", "llama", dict(max_position_embeddings="32768"),
     dict(micro_batch_size="65536", sequence_len="32768"), ["micro_batch_size", "sequence_len"]),
    # GPT-2 derives its MLP width (4 x hidden_size) and its padded vocabulary: both once
    # wrapped around to negative ints.
    ("size_gpt2_mlp_width", "gpt", dict(hidden_size="1073741824", num_attention_heads="1",
                                        intermediate_size=None), {},
     [NEEDS, GIB, "hidden_size"]),
    ("size_gpt2_padded_vocab", "gpt", dict(vocab_size="2147483647"), {},
     [NEEDS, GIB, "vocab_size"]),
]


def run_size_case(r, name, kind, model, keys, culprits):
    d = r[kind].case_dir(name)
    cfg = base_cfg(r["root"], d, model=with_model(**model), **keys)
    rc, _, err, _ = r[kind].run(["-c", cfg_file(d, cfg)], d, Limits(mem_mb=2048), timeout=60)
    if rc is None:
        return "hung: no exit within 60 s", err
    return check_error(rc, err, culprits, d), err


# ---------------------------------------------------------------------------------------
# plan_10k_layers

def plan_10k_layers(r):
    d = r["llama"].case_dir("plan_10k_layers")
    cfg = base_cfg(r["root"], d, model=with_model(num_hidden_layers="10000"))
    rc, out, err, secs = r["llama"].run(["-c", cfg_file(d, cfg), "--plan"], d, timeout=PLAN_LIMIT_S)
    if rc is None:
        return "--plan of 10000 layers did not finish within %d s" % PLAN_LIMIT_S
    if rc != 0:
        return "exit %s (stderr %r)" % (rc, err[-600:])
    if "memory plan" not in out:
        return "no plan printed"
    print("  (--plan of 10000 layers: %.2f s)" % secs)
    return ""


# ---------------------------------------------------------------------------------------
# plan_matrix_*: every value of every memory key, and every pair of the keys that interact
# with the optimizer and the planner (offload_optimizer x activation_offloading x adapter),
# with the remaining keys cycled so each of their values meets many of those combinations.

ADAPTERS = {
    "none": {},
    "lora": dict(adapter="lora", lora_r="2", lora_alpha="4", lora_target_linear="true"),
    "qlora": dict(adapter="qlora", load_in_4bit="true", lora_r="2", lora_alpha="4",
                  lora_target_linear="true"),
}
OFFLOADS = ["false", "true", "legacy", "disk", "hidden_states", "auto"]
CYCLED = [
    ("gradient_checkpointing", ["false", "true", "selective"]),
    ("layer_offloading", ["false", "true"]),
    ("tiled_mlp", ["false", "true"]),
    ("zero_stage", ["0", "1", "3"]),
    ("device_memory_limit", ["0", "2MiB", "1KiB"]),
]


def matrix():
    combos = []
    for i, (oo, ao, ad) in enumerate(itertools.product(["false", "true"], OFFLOADS, ADAPTERS)):
        for variant in range(2):
            keys = dict(offload_optimizer=oo, activation_offloading=ao, **ADAPTERS[ad])
            for j, (k, vals) in enumerate(CYCLED):
                keys[k] = vals[(i + variant * (j + 1) + j) % len(vals)]
            if ao == "disk":
                keys["activation_offloading_dir"] = "."
            combos.append(("plan_matrix_offload_optimizer_%s_act_%s_%s_%d" % (oo, ao, ad, variant), keys))
    return combos


def run_plan_combo(r, name, keys):
    d = r["llama"].case_dir(name)
    cfg = base_cfg(r["root"], d, model=with_model(num_hidden_layers="3"), **keys)
    rc, out, err, _ = r["llama"].run(["-c", cfg_file(d, cfg), "--plan"], d, timeout=60)
    problem = clean_exit(rc, err)
    if not problem and rc == 0 and "memory plan" not in out:
        problem = "exit 0 without a plan"
    if problem:
        return "%s with %s (stderr %r)" % (problem, " ".join("%s=%s" % kv for kv in keys.items()),
                                           err[-600:])
    return ""


def run_offload_optimizer_auto(r):
    d = r["llama"].case_dir("run_offload_optimizer_auto")
    cfg = base_cfg(r["root"], d, offload_optimizer="true", activation_offloading="auto")
    rc, out, err, _ = r["llama"].run(["-c", cfg_file(d, cfg)], d, timeout=60)
    if rc != 0:
        return "%s (exit %s, stderr %r)" % (clean_exit(rc, err) or "refused", rc, err[-600:])
    if "auto picked" not in out:
        return "auto did not pick a mode"
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build", help="directory with train_llama and train_gpt")
    ap.add_argument("-k", default="", help="run only checks whose name contains this")
    ap.add_argument("-j", type=int, default=2, help="parallel runs")
    args = ap.parse_args()
    bins = {k: os.path.abspath(os.path.join(args.build, b))
            for k, b in (("llama", "train_llama"), ("gpt", "train_gpt"))}
    for b in bins.values():
        if not os.access(b, os.X_OK):
            sys.exit("no executable %s" % b)
    root = tempfile.mkdtemp(prefix="test_limits.")
    results = []
    try:
        write_shard(os.path.join(root, "train.bin"), [i % 256 for i in range(1024)])
        r = {k: Runner(b, root) for k, b in bins.items()}
        r["root"] = root
        # Cases with resource limits run serially (a fork from a threaded parent may deadlock
        # in a preexec_fn); the plan matrix runs in a pool.
        for name, kind, model, keys, culprits in SIZE_CASES:
            if args.k in name:
                problem, err = run_size_case(r, name, kind, model, keys, culprits)
                results.append((name, problem and "%s (stderr %r)" % (problem, err[-600:])))
        if args.k in "plan_10k_layers":
            results.append(("plan_10k_layers", plan_10k_layers(r)))
        if args.k in "run_offload_optimizer_auto":
            results.append(("run_offload_optimizer_auto", run_offload_optimizer_auto(r)))
        combos = [(n, k) for n, k in matrix() if args.k in n]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.j)) as pool:
            futs = [pool.submit(run_plan_combo, r, n, k) for n, k in combos]
            results += [(n, f.result()) for (n, _), f in zip(combos, futs)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    nfail = 0
    for name, problem in results:
        if problem:
            nfail += 1
            print("FAIL %s: %s" % (name, problem))
        else:
            print("PASS %s" % name)
    print("%d passed, %d failed" % (len(results) - nfail, nfail))
    sys.exit(1 if nfail else 0)


if __name__ == "__main__":
    main()
