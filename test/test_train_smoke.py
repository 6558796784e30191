#!/usr/bin/env python3
"""End to end on the default corpus: data script -> train -> loss falls, eval and sample run,
metrics.jsonl has every field, the final model and checkpoint exist.
  /usr/bin/python3 test/test_train_smoke.py --bin build/train_llama
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(("PASS %s" % name) if ok else ("FAIL %s: %s" % (name, detail)), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="smoke_")
    try:
        data = os.path.join(tmp, "data")
        p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts/prepare_text.py"),
                            "--name", "tinyshakespeare", "--out", data], capture_output=True, text=True)
        check("prepare_text.py writes shards", p.returncode == 0 and os.path.exists(os.path.join(data, "val.bin")),
              p.stderr)
        out = os.path.join(tmp, "out")
        cmd = [os.path.abspath(args.bin), "-c", os.path.join(ROOT, "configs/tiny_shakespeare.yaml"),
               "--set", "train_data=" + os.path.join(data, "train.bin"),
               "--set", "val_data=" + os.path.join(data, "val.bin"),
               "--set", "output_dir=" + out, "--set", "max_steps=40", "--set", "eval_steps=20",
               "--set", "eval_batches=4", "--set", "sample_steps=40", "--set", "sample_tokens=40",
               "--set", "micro_batch_size=8", "--set", "warmup_steps=5", "--set", "log_steps=10"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        check("default config trains", p.returncode == 0, p.stderr[-500:])
        if p.returncode != 0:
            return
        check("config box and step lines", "tokens/step" in p.stdout and "tok/s" in p.stdout, p.stdout[:500])
        check("sample printed", "---- sample ----" in p.stdout)
        recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
        train = [r for r in recs if "loss" in r]
        evals = [r for r in recs if "val_loss" in r]
        keys = {"step", "loss", "lr", "grad_norm", "ms", "tokens_per_sec", "device_peak_bytes",
                "host_peak_bytes", "disk_peak_bytes"}
        check("metrics fields", len(train) == 40 and all(keys <= set(r) for r in train), str(train[:1]))
        check("steps are 1-based and in order", [r["step"] for r in train] == list(range(1, 41)))
        check("loss falls", train[-1]["loss"] < train[0]["loss"] - 1.5,
              "first %.3f last %.3f" % (train[0]["loss"], train[-1]["loss"]))
        check("eval records", [r["step"] for r in evals] == [20, 40] and evals[1]["val_loss"] < evals[0]["val_loss"],
              str(evals))
        check("final model and checkpoint written",
              os.path.exists(os.path.join(out, "model.safetensors")) and
              os.path.exists(os.path.join(out, "checkpoint-40", "optimizer.safetensors")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        n_fail = results.count(False)
        print("%d passed, %d failed" % (len(results) - n_fail, n_fail))
        sys.exit(1 if n_fail else 0)


if __name__ == "__main__":
    main()
