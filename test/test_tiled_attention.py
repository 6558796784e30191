#!/usr/bin/python3
"""Tiled attention (tiled_attention: true): norms, q/k/v/o projections, RoPE and attention run
over query tiles (full keys/values, one tile of queries at a time; dK/dV summed over the tiles),
and backward remakes each tile's ln1, q and attention output. Every mode walks the same tiles,
so a tiled run must be bit-identical to the untiled one: per-step losses and the final weight
files are compared byte for byte.

Tiny Hugging Face models, sequence_len 520 in tiles of 256 (tiled_mlp_shards 3: 174 rows,
rounded up to the CPU kernel's query block): 256 + 256 + 8 rows, two sequences per micro-batch,
3 steps with accumulation 2.

  llama             GQA 4/2; alone, with tiled MLP + hidden_states (recompute + host tier),
                    selective recompute + disk offload, checkpoints every 2nd layer + host offload
  lora_dropout      LoRA r4 on all seven projections with lora_dropout 0.2 (tile rows draw the
                    untiled masks)
  qlora             NF4 base, LoRA on all linear layers
  window            Mistral, sliding_window 50 < sequence_len (windows span tiles)
  qwen3             q/k norms, head_dim 16 independent of hidden 32, tied embeddings
  qwen2             q/k/v biases
  packed            prepared rows with four documents per row (document starts inside tiles)
  gpt2              train_gpt (LayerNorm with bias, learned positions), alone and with tiled MLP +
                    hidden_states
  zero3             zero_stage 3 under mpirun -np 2 (skipped without mpirun)
  memory            T 4096, tiled_mlp_shards unset (spans of at least 2048 rows, ATT_SPAN_MIN_ROWS):
                    tiled attention's device peak below the untiled run's, and within 10% of
                    --plan's prediction
  spans             --profile's attention calls a step: by default a span is at least 2048 rows,
                    so at T 520 one span holds the whole micro-batch; with tiled_mlp_shards 3 a
                    sequence splits into 3 (GPT-2 124M at B 16, T 1024 ran 32 spans a layer of
                    512-row GEMMs on the H200 before the floor)
  errors            with sequence_parallel_degree (mpirun -np 2): one clear error line
Usage: /usr/bin/python3 test/test_tiled_attention.py --build build [-k name]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref as R  # noqa: E402
from checks import check, finish, prepared_rows_env, profile_table  # noqa: E402

ENV = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
           LLMC_DEVICE="cpu")
T = 520
UNITS = {"B": 1, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30}


class Env:
    def __init__(self, root, binary):
        self.root, self.bin, self.n = root, binary, 0
        R.write_shard(os.path.join(root, "train.bin"), R.random_tokens(60000, 64, seed=2))

    def model(self, name, **kw):
        d = os.path.join(self.root, name)
        if not os.path.exists(d):
            cfg = R.make_config(vocab_size=64, hidden_size=kw.pop("hidden_size", 32), intermediate_size=64,
                                num_hidden_layers=3, max_position_embeddings=4096, **kw)
            R.save_hf_dir(d, cfg, R.init_weights(cfg, seed=4))
        return d

    def run(self, model, extra=None, ranks=1, args=()):
        self.n += 1
        out = os.path.join(self.root, "out%d" % self.n)
        cfg = {"base_model": model, "train_data": os.path.join(self.root, "train.bin"), "sequence_len": T,
               "micro_batch_size": 2, "gradient_accumulation_steps": 2, "max_steps": 3, "learning_rate": 0.01,
               "warmup_steps": 1, "lr_scheduler": "cosine", "max_grad_norm": 0.5, "num_threads": 1, "seed": 7,
               "min_offload_size": 0, "tiled_mlp_shards": 3, "output_dir": out}
        cfg.update(extra or {})
        y = os.path.join(self.root, "cfg%d.yaml" % self.n)
        write_yaml(y, {k: v for k, v in cfg.items() if v is not None})
        cmd = [self.bin, "-c", y] + list(args)
        if ranks > 1:
            cmd = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none"] + cmd
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV, cwd=self.root)
        return p, out


def write_yaml(path, d):
    """llama_ref.write_yaml, plus a dict value as an indented block (a `model:` shape)."""
    flat = {k: v for k, v in d.items() if not isinstance(v, dict)}
    R.write_yaml(path, flat)
    with open(path, "a") as f:
        for k, v in d.items():
            if isinstance(v, dict):
                f.write("%s:\n" % k + "".join("  %s: %s\n" % (k2, R._yaml_scalar(v2)) for k2, v2 in v.items()))


def metrics(out):
    return [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in x]


def weight_bytes(out):
    for f in ("model.safetensors", "adapter_model.safetensors"):
        p = os.path.join(out, f)
        if os.path.exists(p):
            return open(p, "rb").read()
    return b""


def compare(e, name, model, extra, tiled):
    p0, o0 = e.run(model, extra)
    p1, o1 = e.run(model, dict(extra or {}, tiled_attention=True, **tiled))
    if p0.returncode or p1.returncode:
        check("%s: runs" % name, False, (p0.stderr + p1.stderr).strip().splitlines()[-3:])
        return
    l0 = [(r["step"], r["loss"], r["grad_norm"]) for r in metrics(o0)]
    l1 = [(r["step"], r["loss"], r["grad_norm"]) for r in metrics(o1)]
    w0, w1 = weight_bytes(o0), weight_bytes(o1)
    what = ", ".join("%s=%s" % kv for kv in tiled.items()) or "alone"
    check("%s (tiled attention, %s): losses, grad norms and weights bit-identical to the untiled run" % (name, what),
          len(l0) == 3 and l0 == l1 and w0 and w0 == w1,
          "losses %s vs %s; weights %s" % (l0, l1, "same" if w0 == w1 else "differ"))


def plan_rows(out):
    got = {}
    for line in out.splitlines():
        m = re.match(r"\| (.+?) +\| +([\d.]+) (\w+) \| +([\d.]+) (\w+) \|", line)
        if m:
            got[m.group(1)] = float(m.group(2)) * UNITS[m.group(3)]
    return got


def memory(e, llama):
    big = {"sequence_len": 4096, "tiled_mlp_shards": None, "micro_batch_size": 1, "gradient_accumulation_steps": 1, "max_steps": 1,
           "gradient_checkpointing": True, "activation_offloading": "hidden_states", "tiled_mlp": True}
    p0, o0 = e.run(llama, big)
    p1, o1 = e.run(llama, dict(big, tiled_attention=True))
    pp, _ = e.run(llama, big, args=["--plan"])
    if p0.returncode or p1.returncode or pp.returncode:
        check("memory: runs", False, (p0.stderr + p1.stderr + pp.stderr).strip().splitlines()[-3:])
        return
    d0, d1 = metrics(o0)[0]["device_peak_bytes"], metrics(o1)[0]["device_peak_bytes"]
    rows = plan_rows(pp.stdout)
    want = rows.get("hidden_states + tiled MLP + attention", 0)
    check("memory: T 4096 hidden_states + tiled MLP: tiled attention's device peak %.2f MiB < untiled %.2f MiB"
          % (d1 / 2 ** 20, d0 / 2 ** 20), 0 < d1 < d0)
    check("memory: --plan's 'hidden_states + tiled MLP + attention' row %.2f MiB within 10%% of the measured %.2f MiB"
          % (want / 2 ** 20, d1 / 2 ** 20), want > 0 and abs(want - d1) <= 0.1 * d1, sorted(rows))


def spans(e, llama):
    # 3 layers x 2 micro-batches x spans a micro-batch
    for over, want, what in (({"tiled_mlp_shards": None}, 3 * 2 * 1, "default: one span of 2 x 520 rows"),
                             ({}, 3 * 2 * 2 * 3, "tiled_mlp_shards 3: 3 tiles of each of 2 sequences")):
        p, _ = e.run(llama, dict(over, max_steps=1), args=["--profile"])
        got = profile_table(p.stdout)[0].get("attention_fwd", (None,))[0]
        check("spans: %s: attention_fwd %s calls a step (want %d)" % (what, got, want), not p.returncode and got == want,
              p.stderr[-300:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("-k", default="")
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="test_tiled_attention.")
    try:
        e = Env(root, os.path.abspath(os.path.join(a.build, "train_llama")))
        llama = e.model("llama", num_attention_heads=4, num_key_value_heads=2)
        lora = {"adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_target_linear": True}
        cases = [
            ("llama", llama, None, {}),
            ("llama", llama, None, {"tiled_mlp": True, "gradient_checkpointing": True,
                                    "activation_offloading": "hidden_states"}),
            ("llama", llama, None, {"gradient_checkpointing": "selective", "activation_offloading": "disk"}),
            ("llama", llama, None, {"gradient_checkpointing": True, "gradient_checkpointing_every": 2,
                                    "activation_offloading": True}),
            # 2 threads: the CPU backend runs independent products side by side (matmul_many);
            # remade products must still match the forward's bit for bit.
            ("llama_2threads", llama, {"num_threads": 2}, {}),
            ("llama_2threads", llama, {"num_threads": 2}, {"tiled_mlp": True, "gradient_checkpointing": True,
                                                           "activation_offloading": "hidden_states"}),
            ("lora_dropout", llama, dict(lora, lora_dropout=0.2), {}),
            ("qlora", llama, dict(lora, adapter="qlora", load_in_4bit=True), {}),
            ("window", e.model("mistral", model_type="mistral", num_attention_heads=4, num_key_value_heads=2,
                               sliding_window=50), None, {}),
            ("qwen3", e.model("qwen3", model_type="qwen3", num_attention_heads=4, num_key_value_heads=2,
                              head_dim=16, tie_word_embeddings=True), None, {}),
            ("qwen2", e.model("qwen2", model_type="qwen2", num_attention_heads=4, num_key_value_heads=2),
             None, {}),
        ]
        for name, model, extra, tiled in cases:
            if a.k in name:
                compare(e, name, model, extra, tiled)
        if a.k in "packed":
            sd = prepared_rows_env(root, T, [0, 37, 130, 300, T])
            ENV["LLMC_SCRIPTS_DIR"] = sd
            ENV["LLMC_PYTHON"] = sys.executable
            open(os.path.join(llama, "tokenizer.json"), "w").write("{}")
            extra = {"train_data": None, "datasets": [{"path": "x.jsonl", "type": "completion"}],
                     "tokenizer_config": llama}
            compare(e, "packed", llama, extra, {})
        if a.k in "gpt2":
            gpt = os.path.abspath(os.path.join(a.build, "train_gpt"))
            g = {"model": {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                           "max_position_embeddings": 1024}, "base_model": None}
            for tiled in ({}, {"tiled_mlp": True, "gradient_checkpointing": True,
                               "activation_offloading": "hidden_states"}):
                e.bin, keep = gpt, e.bin
                p0, o0 = e.run(None, g)
                p1, o1 = e.run(None, dict(g, tiled_attention=True, **tiled))
                e.bin = keep
                same = (not p0.returncode and not p1.returncode and
                        [(r["loss"], r["grad_norm"]) for r in metrics(o0)] ==
                        [(r["loss"], r["grad_norm"]) for r in metrics(o1)] and
                        open(os.path.join(o0, "model.bin"), "rb").read() == open(os.path.join(o1, "model.bin"), "rb").read())
                check("gpt2 (train_gpt, tiled attention, %s): losses, grad norms and model.bin bit-identical"
                      % (", ".join("%s=%s" % kv for kv in tiled.items()) or "alone"), same,
                      (p0.stderr + p1.stderr)[-400:])
        if a.k in "memory":
            memory(e, llama)
        if a.k in "spans":
            spans(e, llama)
        have_mpi = shutil.which("mpirun") is not None
        if a.k in "zero3" and have_mpi:
            p0, o0 = e.run(llama, {"zero_stage": 3}, ranks=2)
            p1, o1 = e.run(llama, {"zero_stage": 3, "tiled_attention": True}, ranks=2)
            ok = not p0.returncode and not p1.returncode
            check("zero3 (2 ranks): tiled attention bit-identical to untiled",
                  ok and metrics(o0) and [r["loss"] for r in metrics(o0)] == [r["loss"] for r in metrics(o1)]
                  and weight_bytes(o0) == weight_bytes(o1), (p0.stderr + p1.stderr)[-400:])
        if a.k in "errors" and have_mpi:
            p, _ = e.run(llama, {"tiled_attention": True, "sequence_parallel_degree": 2}, ranks=2)
            err = [x for x in p.stderr.splitlines() if x.startswith("error")]
            check("errors: tiled_attention with sequence_parallel_degree is one clear error",
                  p.returncode != 0 and err and "tiled_attention" in err[0] and "sequence_parallel" in err[0],
                  p.stderr[-300:])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
