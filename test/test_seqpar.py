#!/usr/bin/python3
"""Sequence parallelism (sequence_parallel_degree, Ulysses): the reshuffles and attention
through them (build/test_seqpar under mpirun -np 1-4), then training under mpirun -np N with
sequence_parallel_degree N against one process, on tiny Hugging Face models:

  gqa_n2 / gqa_n4   Llama GQA 4/2 heads: 2 ranks split the key/value heads, 4 replicate them
  zero1 / zero3     with zero_stage 1 and 3 (fsdp)
  lora              LoRA on all seven projections
  hidden_states     with activation_offloading: hidden_states (recompute + host tier)
  window            Mistral, sliding_window 8 < sequence_len 32
  qwen3             q/k norms and head_dim independent of the hidden size
  longrope          Phi-3 longrope, 16 tokens per rank of 32 past original_max 20: long factors
  packed            prepared rows with three documents per row (the whole rows' document map),
                    and with Phi-3 longrope (documents <= 12 tokens: the short factors)
  errors            a degree that is not the rank count, T or heads that do not split

Each run: 4 steps (grad accumulation 2, clipping, warmup + cosine); the per-step losses and the
final weights must match the one-process run within 1e-5 (relative; the largest difference
is printed). adam_epsilon is 1e-2 in these runs, as in test_sharding.py: N ranks sum each
weight gradient in another order than one process, and with eps 1e-8 AdamW turns the rounding
of near-zero gradients into update differences of up to ~lr; with 1e-2 the update is smooth
in g, while a real error (a wrong slice, position or head) moves the weights by ~1e-3.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import llama_ref as R  # noqa: E402
from checks import check, finish, prepared_rows_env  # noqa: E402

TOL = 1e-5
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           LLMC_DEVICE="cpu")


def unit(build):
    exe = os.path.join(build, "test_seqpar")
    runs = [("single", [exe])]
    if shutil.which("mpirun"):
        for n in (2, 3, 4):
            runs.append(("mpi %d" % n, ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none", exe]))
    for name, cmd in runs:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV)
        out = [x for x in r.stdout.splitlines() if x.startswith(("PASS", "FAIL"))]
        check(out[0][5:] if out and r.returncode == 0 else "reshuffles (%s)" % name,
              r.returncode == 0 and len(out) == 1 and out[0].startswith("PASS"),
              "exit %d: %s" % (r.returncode, out or r.stderr.strip().splitlines()[-3:]))


class Env:
    def __init__(self, root, binary):
        self.root, self.bin, self.n = root, binary, 0
        R.write_shard(os.path.join(root, "train.bin"), R.random_tokens(40000, 64, seed=1))

    def model(self, name, **kw):
        d = os.path.join(self.root, name)
        if not os.path.exists(d):
            cfg = R.make_config(vocab_size=64, hidden_size=kw.pop("hidden_size", 32), intermediate_size=64,
                                num_hidden_layers=2, max_position_embeddings=128, **kw)
            R.save_hf_dir(d, cfg, R.init_weights(cfg, seed=3))
        return d

    def run(self, model, ranks, extra=None, expect_ok=True):
        self.n += 1
        out = os.path.join(self.root, "out%d" % self.n)
        cfg = {"base_model": model, "train_data": os.path.join(self.root, "train.bin"), "sequence_len": 32,
               "micro_batch_size": 2, "gradient_accumulation_steps": 2, "max_steps": 4, "learning_rate": 0.01,
               "warmup_steps": 1, "lr_scheduler": "cosine", "max_grad_norm": 0.5, "adam_epsilon": 0.01,
               "num_threads": 1, "seed": 7, "output_dir": out}
        if ranks > 1:
            cfg["sequence_parallel_degree"] = ranks
        cfg.update(extra or {})
        y = os.path.join(self.root, "cfg%d.yaml" % self.n)
        R.write_yaml(y, {k: v for k, v in cfg.items() if v is not None})
        cmd = [self.bin, "-c", y]
        if ranks > 1:
            cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=self.root)
        return p, out


def losses(out):
    return [r["loss"] for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "loss" in r]


def weights(out):
    for f in ("model.safetensors", "adapter_model.safetensors"):
        if os.path.exists(os.path.join(out, f)):
            return R.read_safetensors(os.path.join(out, f))
    return {}


def compare(e, name, model, n, extra=None):
    p1, o1 = e.run(model, 1, extra)
    pn, on = e.run(model, n, extra)
    if p1.returncode or pn.returncode:
        check("%s: runs" % name, False, (p1.stderr + pn.stderr).strip().splitlines()[-2:])
        return
    l1, ln = losses(o1), losses(on)
    w1, wn = weights(o1), weights(on)
    dl = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(ln, l1)) if l1 and len(l1) == len(ln) else 1
    dw = max((float(np.max(np.abs(wn[k] - w1[k]))) / max(float(np.max(np.abs(w1[k]))), 1e-30) for k in w1),
             default=1) if w1 and set(w1) == set(wn) else 1
    check("%s: %d ranks = 1 process: losses %.1e, weights %.1e (relative, %d tensors)" % (name, n, dl, dw, len(w1)),
          dl <= TOL and dw <= TOL and len(l1) == 4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("-k", default="")
    a = ap.parse_args()
    if not shutil.which("mpirun"):
        print("SKIP sequence parallel: no mpirun on PATH")
        return
    if "unit" in "unit " + a.k or not a.k:
        unit(a.build)
    root = tempfile.mkdtemp(prefix="test_seqpar.")
    try:
        e = Env(root, os.path.abspath(os.path.join(a.build, "train_llama")))
        llama = e.model("llama", num_attention_heads=4, num_key_value_heads=2)
        phi3 = e.model("phi3", model_type="phi3", num_attention_heads=4, num_key_value_heads=2, pad_token_id=3,
                       original_max_position_embeddings=20,
                       rope_scaling={"type": "longrope", "short_factor": [1.0, 1.2, 1.9, 3.0],
                                     "long_factor": [1.4, 2.5, 4.0, 9.0]})
        cases = [
            ("gqa_n2", llama, 2, None), ("gqa_n4", llama, 4, None),
            ("zero1", llama, 2, {"zero_stage": 1}), ("zero3", llama, 2, {"zero_stage": 3}),
            ("lora", llama, 2, {"adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_target_linear": True}),
            ("hidden_states", llama, 2, {"gradient_checkpointing": True, "activation_offloading": "hidden_states"}),
            ("window", e.model("mistral", model_type="mistral", num_attention_heads=4, num_key_value_heads=2,
                               sliding_window=8), 2, None),
            ("qwen3", e.model("qwen3", model_type="qwen3", hidden_size=32, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16), 4, None),
            # 16 tokens per rank but 32 per sequence: past original_max_position_embeddings 20,
            # so the long factors, on every rank.
            ("longrope", phi3, 2, None),
        ]
        for name, model, n, extra in cases:
            if a.k in name:
                compare(e, name, model, n, extra)
        if a.k in "packed":
            sd = prepared_rows_env(root, 32, [0, 9, 20, 32])
            ENV["LLMC_SCRIPTS_DIR"] = sd
            ENV["LLMC_PYTHON"] = sys.executable
            extra = {"train_data": None, "datasets": [{"path": "x.jsonl", "type": "completion"}],
                     "tokenizer_config": llama, "micro_batch_size": 1}
            open(os.path.join(root, "tokenizer.json"), "w").write("{}")
            shutil.copy(os.path.join(root, "tokenizer.json"), os.path.join(llama, "tokenizer.json"))
            compare(e, "packed", llama, 2, extra)
            # Documents of at most 12 tokens: longrope's short factors (16 <= 20) on both ranks,
            # found from the whole rows' document map.
            shutil.copy(os.path.join(root, "tokenizer.json"), os.path.join(phi3, "tokenizer.json"))
            compare(e, "packed_longrope", phi3, 2, dict(extra, tokenizer_config=phi3))
        if a.k in "errors":
            for what, n, extra, needle in [
                    ("a degree other than the rank count", 2, {"sequence_parallel_degree": 4}, "needs exactly 4 ranks"),
                    ("sequence_len not divisible", 3, {"sequence_len": 31}, "not divisible by 3"),
                    ("heads that do not split", 3, {"sequence_len": 36}, "attention heads do not split")]:
                p, _ = e.run(llama, n, extra)
                err = [x for x in p.stderr.splitlines() if "error" in x]
                check("errors: %s" % what, p.returncode != 0 and err and needle in err[0], p.stderr[-300:])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
