#!/usr/bin/env python3
"""End to end on the default corpus: data script -> train -> loss falls, eval and sample run,
metrics.jsonl has every field, the final model and checkpoint exist. Random initialisation:
the same weights on 1, 2 and 3 threads (matrices are drawn in 65536-element chunks, each from
its own stream), a LoRA run's base the same as the full run's, N(0, 0.02) with every chunk its
own draw, norms at 1.
  /usr/bin/python3 test/test_train_smoke.py --bin build/train_llama
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from checks import write_shard
from llama_ref import read_safetensors

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(("PASS %s" % name) if ok else ("FAIL %s: %s" % (name, detail)), flush=True)


def check_random_init(binary, tmp):
    # gate_proj 688 x 256: 176128 floats, three chunks (the last one partial)
    cfg = os.path.join(tmp, "init.yaml")
    data = os.path.join(tmp, "init.bin")
    write_shard(data, [i * 37 % 256 for i in range(4096)])
    with open(cfg, "w") as f:
        f.write("model:\n  vocab_size: 256\n  hidden_size: 256\n  intermediate_size: 688\n"
                "  num_hidden_layers: 1\n  num_attention_heads: 4\n  num_key_value_heads: 2\n"
                "  max_position_embeddings: 64\n"
                "train_data: %s\nsequence_len: 32\nmicro_batch_size: 2\nmax_steps: 1\n"
                "learning_rate: 0\nwarmup_steps: 0\nsave_steps: 0\nseed: 7\n" % data)
    weights = []
    for th in (1, 2, 3):
        out = os.path.join(tmp, "init_%d" % th)
        p = subprocess.run([os.path.abspath(binary), "-c", cfg, "--set", "num_threads=%d" % th,
                            "--set", "output_dir=" + out], capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            check("random init run, %d threads" % th, False, p.stderr[-400:])
            return
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            weights.append(f.read())
    check("random init: the same weights on 1, 2 and 3 threads", weights[0] == weights[1] == weights[2])
    # A LoRA run's base is the full run's (its B starts at zero, so the first loss is the same)
    out = os.path.join(tmp, "init_lora")
    p = subprocess.run([os.path.abspath(binary), "-c", cfg, "--set", "num_threads=1", "--set", "adapter=lora",
                        "--set", "lora_r=4", "--set", "lora_target_linear=true", "--set", "output_dir=" + out],
                       capture_output=True, text=True, timeout=300)
    first = []
    for d in ("init_1", "init_lora"):
        mp = os.path.join(tmp, d, "metrics.jsonl")
        recs = [json.loads(l) for l in open(mp)] if os.path.exists(mp) else []
        first.append([r["loss"] for r in recs if "loss" in r][:1])
    check("random init: a LoRA run's base is the full run's (first loss %s, %s)" % tuple(first),
          p.returncode == 0 and first[0] and first[0] == first[1], p.stderr[-300:])
    w = read_safetensors(os.path.join(tmp, "init_1", "model.safetensors"))
    g = w.get("model.layers.0.mlp.gate_proj.weight")
    if g is None or g.size != 688 * 256:
        check("random init: gate_proj in the saved model", False, str(sorted(w)))
        return
    g = g.ravel()
    mean, std = float(g.mean()), float(g.std())
    check("random init: N(0, 0.02) (mean %.2e, std %.5f)" % (mean, std), abs(mean) < 3e-4 and abs(std - 0.02) < 3e-4)
    c = 65536
    a, b, d = g[:1000], g[c:c + 1000], g[2 * c:2 * c + 1000]
    check("random init: each chunk its own draw", (a != b).any() and (b != d).any() and (a != d).any())
    ln = w.get("model.layers.0.input_layernorm.weight")
    check("random init: norm weights are 1", ln is not None and bool((ln == 1.0).all()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="smoke_")
    try:
        check_random_init(args.bin, tmp)
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
