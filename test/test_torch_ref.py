#!/usr/bin/python3
"""End-to-end check of ./train_llama against the float64 PyTorch reference (test/llama_ref.py).

    /usr/bin/python3 test/test_torch_ref.py --bin ./train_llama

For each case: build a tiny random Llama (HF dir) and a random token shard in a temp dir, run
the trainer, and compare every step's loss (1e-5 relative), lr (1e-6 relative), grad_norm
(1e-4 relative) and the final weights (max abs diff <= 1e-4 * max(1, max|w|) per tensor).

Families (cases f-j): Mistral with sequence_len > sliding_window, Qwen2 with use_sliding_window
and max_window_layers (layers below it full) and with it off, Qwen3 (q_norm/k_norm before RoPE,
head_dim != hidden/heads, tied embeddings, no biases; and with attention_bias and a window). The
reference for them is plain PyTorch written from transformers' modeling equations
(test/llama_ref.py), not transformers, which is not installed here; each window case also checks
that toggling the window moves the loss by far more than the tolerance.

--self-check runs a float32 PyTorch copy of the reference in place of the binary (validates
the tolerances without the trainer); --perturb-lr X multiplies the learning rate given to the
candidate by X (to see the test fail).
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import llama_ref as R  # noqa: E402

LAST_LOG = ""  # the last trainer run's output (run_binary)

LOSS_RTOL = 1e-5
LR_RTOL = 1e-6
GN_RTOL = 1e-4
W_TOL = 1e-4


def cases():
    out = []
    # (a) untied head, MHA, uint16 shard, grad accumulation, cosine
    out.append(dict(
        name="a_untied_mha",
        cfg=R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4),
        tc=R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=2,
                          max_steps=5, learning_rate=5e-3, lr_scheduler="cosine",
                          warmup_steps=2, weight_decay=0.1, max_grad_norm=1.0),
        shard_version=1, n_tokens=1000, expect_clip=False))
    # (b) tied head, GQA 4/2, odd T, uint32 shard small enough to wrap, linear, clipping
    out.append(dict(
        name="b_tied_gqa_wrap",
        cfg=R.make_config(vocab_size=80, hidden_size=48, intermediate_size=96,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          tie_word_embeddings=True),
        tc=R.train_config(sequence_len=17, micro_batch_size=2, gradient_accumulation_steps=1,
                          max_steps=6, learning_rate=5e-3, lr_scheduler="linear",
                          warmup_steps=2, weight_decay=0.1, max_grad_norm=0.5),
        # 2*17 = 34 tokens a micro-batch: 100 tokens hold 2 of them, so steps 3 and 5 wrap
        shard_version=2, n_tokens=100, expect_clip=True, init=dict(embed_std=0.1)))
    # (c) GQA 6/2, attention_bias, head_dim 12 != C/Hq = 8, grad accumulation, cosine
    out.append(dict(
        name="c_gqa_bias_headdim",
        cfg=R.make_config(vocab_size=97, hidden_size=48, intermediate_size=80,
                          num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                          head_dim=12, attention_bias=True, rms_norm_eps=1e-6,
                          rope_theta=500000.0),
        tc=R.train_config(sequence_len=24, micro_batch_size=2, gradient_accumulation_steps=2,
                          max_steps=4, learning_rate=5e-3, lr_scheduler="cosine",
                          warmup_steps=2, weight_decay=0.1, max_grad_norm=0.5,
                          adam_beta2=0.95, adam_epsilon=1e-6),
        shard_version=1, n_tokens=2000, expect_clip=True))
    # (e) Qwen2: q/k/v biases without the o_proj bias that Llama's attention_bias adds
    out.append(dict(
        name="e_qwen2_qkv_bias",
        cfg=R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          attention_bias=True, model_type="qwen2", rms_norm_eps=1e-6),
        tc=R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=2,
                          max_steps=4, learning_rate=5e-3, lr_scheduler="cosine",
                          warmup_steps=2, weight_decay=0.1, max_grad_norm=1.0),
        shard_version=1, n_tokens=1000, expect_clip=False))
    # (d) llama3 rope scaling with a short original context so every branch of the rule is hit
    out.append(dict(
        name="d_llama3_rope",
        cfg=R.make_config(vocab_size=72, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          rope_theta=10000.0, max_position_embeddings=128,
                          # D=16: wavelengths 6.3 (< 32/4: kept), 19.9 (between: smoothed),
                          # 62.8 and up (> 32/1: divided by 8)
                          rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 32}),
        tc=R.train_config(sequence_len=20, micro_batch_size=2, gradient_accumulation_steps=2,
                          max_steps=5, learning_rate=5e-3, lr_scheduler="constant_with_warmup",
                          warmup_steps=2, weight_decay=0.1, max_grad_norm=1.0),
        shard_version=2, n_tokens=1500, expect_clip=False))
    # Families (test/llama_ref.py's family(): plain-PyTorch equations of transformers' modeling
    # code, not transformers itself).
    # (f) Mistral, T = 24 > sliding_window 7: windows end mid-tile, GQA 4/2
    out.append(dict(
        name="f_mistral_window",
        cfg=R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          model_type="mistral", rms_norm_eps=1e-6, sliding_window=7),
        tc=R.train_config(sequence_len=24, micro_batch_size=2, gradient_accumulation_steps=2,
                          max_steps=4, learning_rate=5e-3, lr_scheduler="cosine",
                          warmup_steps=2, weight_decay=0.1, max_grad_norm=1.0),
        shard_version=1, n_tokens=1500, expect_clip=False, contrast=dict(sliding_window=None)))
    # (g) Qwen2 with use_sliding_window: layer 0 (< max_window_layers 1) full, layers 1-2 window 5
    out.append(dict(
        name="g_qwen2_window_layers",
        cfg=R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                          model_type="qwen2", rms_norm_eps=1e-6, use_sliding_window=True,
                          sliding_window=5, max_window_layers=1),
        tc=R.train_config(sequence_len=20, micro_batch_size=2, gradient_accumulation_steps=1,
                          max_steps=4, learning_rate=5e-3, lr_scheduler="linear",
                          warmup_steps=1, weight_decay=0.1, max_grad_norm=1.0),
        shard_version=1, n_tokens=1200, expect_clip=False,
        contrast=dict(use_sliding_window=False)))
    # (h) Qwen2 with a sliding_window but use_sliding_window false: no window anywhere
    out.append(dict(
        name="h_qwen2_window_off",
        cfg=R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                          model_type="qwen2", rms_norm_eps=1e-6, use_sliding_window=False,
                          sliding_window=3, max_window_layers=0),
        tc=R.train_config(sequence_len=20, micro_batch_size=2, gradient_accumulation_steps=1,
                          max_steps=3, learning_rate=5e-3, lr_scheduler="constant_with_warmup",
                          warmup_steps=1, weight_decay=0.1, max_grad_norm=1.0),
        shard_version=1, n_tokens=1200, expect_clip=False,
        contrast=dict(use_sliding_window=True)))
    # (i) Qwen3 as Qwen3-0.6B is shaped: q_norm/k_norm, head_dim 16 != C/Hq = 12, GQA 4/2,
    # tied embeddings, no biases
    out.append(dict(
        name="i_qwen3_qknorm_tied",
        cfg=R.make_config(vocab_size=80, hidden_size=48, intermediate_size=96,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, model_type="qwen3", rms_norm_eps=1e-6,
                          tie_word_embeddings=True, rope_theta=1000000.0,
                          use_sliding_window=False, sliding_window=None, max_window_layers=28),
        tc=R.train_config(sequence_len=17, micro_batch_size=2, gradient_accumulation_steps=2,
                          max_steps=4, learning_rate=5e-3, lr_scheduler="cosine",
                          warmup_steps=2, weight_decay=0.1, max_grad_norm=1.0),
        shard_version=2, n_tokens=1500, expect_clip=False, init=dict(embed_std=0.1)))
    # (j) Qwen3 with attention_bias (q/k/v/o) and a window on every layer (max_window_layers 0)
    out.append(dict(
        name="j_qwen3_bias_window",
        cfg=R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                          head_dim=8, model_type="qwen3", rms_norm_eps=1e-6, attention_bias=True,
                          use_sliding_window=True, sliding_window=6, max_window_layers=0),
        tc=R.train_config(sequence_len=18, micro_batch_size=2, gradient_accumulation_steps=1,
                          max_steps=4, learning_rate=5e-3, lr_scheduler="cosine",
                          warmup_steps=1, weight_decay=0.1, max_grad_norm=1.0),
        shard_version=1, n_tokens=1200, expect_clip=False,
        contrast=dict(use_sliding_window=False)))
    # (g3) Gemma 3 text, shaped as gemma-3-1b is but tiny: (1 + w) norms, scaled embeddings,
    # sandwich norms, GeGLU, q/k norms, head_dim 16 != C/Hq = 12 (query_pre_attn_scalar 16),
    # GQA 4/2, tied embeddings, pad row 0, query_pre_attn_scalar 24 (scores scaled by 24^-0.5,
    # not head_dim^-0.5, as Gemma 3 27B's 168 against 128); sliding_window_pattern 2 (layers 0 and 2 slide over
    # 5 keys with RoPE base 10000, layer 1 is global with base 1e6 and linear scaling x4)
    out.append(dict(
        name="g3_gemma3_sandwich",
        cfg=R.make_config(vocab_size=80, hidden_size=48, intermediate_size=96,
                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, model_type="gemma3_text", rms_norm_eps=1e-6,
                          tie_word_embeddings=True, rope_theta=1000000.0,
                          rope_scaling={"rope_type": "linear", "factor": 4.0},
                          hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                          query_pre_attn_scalar=24, sliding_window=5, sliding_window_pattern=2,
                          rope_local_base_freq=10000.0, pad_token_id=0),
        tc=R.train_config(sequence_len=17, micro_batch_size=2, gradient_accumulation_steps=2,
                          max_steps=4, learning_rate=5e-3, lr_scheduler="cosine",
                          warmup_steps=2, weight_decay=0.1, max_grad_norm=1.0),
        shard_version=2, n_tokens=1500, expect_clip=False, init=dict(embed_std=0.1),
        contrast=dict(sliding_window_pattern=1)))
    # (j2) Gemma 2 (modeling_gemma2): (j)'s block without q/k norms and with one RoPE; layers 0
    # and 2 slide (layer_types' default); the scores capped at 0.8 and the logits at 1.5 (small
    # caps, so that tanh bends them at this init: the contrast drops both); query_pre_attn_scalar
    # 24 against head_dim 16 with no q-norm copy (the scale is the attention op's); the
    # embedding tied by default.
    out.append(dict(
        name="g4_gemma2_softcap",
        cfg=R.make_config(vocab_size=80, hidden_size=48, intermediate_size=96,
                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                          head_dim=16, model_type="gemma2", rms_norm_eps=1e-6, tie_word_embeddings=True,
                          hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh",
                          query_pre_attn_scalar=24, sliding_window=5, attn_logit_softcapping=0.8,
                          final_logit_softcapping=1.5, pad_token_id=0),
        tc=R.train_config(sequence_len=17, micro_batch_size=2, gradient_accumulation_steps=2,
                          max_steps=4, learning_rate=5e-3, lr_scheduler="cosine",
                          warmup_steps=2, weight_decay=0.1, max_grad_norm=1.0),
        shard_version=2, n_tokens=1500, expect_clip=False, init=dict(embed_std=0.1, std=0.3),
        contrast=dict(attn_logit_softcapping=None, final_logit_softcapping=None)))
    # (k) unfrozen_parameters, Axolotl's rules (the reference applies them with Python's re):
    # only the matching tensors train, and the grad norm, clipping and AdamW cover them alone;
    # a '.' before '+' stays a wildcard, the others are literal; a match is anchored at the start.
    tc = R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=2,
                        max_steps=4, learning_rate=5e-3, lr_scheduler="cosine",
                        warmup_steps=1, weight_decay=0.1, max_grad_norm=1.0)
    tc["unfrozen_parameters"] = ["^model.layers.[02].self_attn.(q|v)_proj", "model.layers.1.+norm",
                                 "lm_head.weight$", "model.norm", "layers.2.mlp.up_proj.weight"]
    out.append(dict(
        name="k_unfrozen_parameters",
        cfg=R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                          attention_bias=True),
        tc=tc, shard_version=1, n_tokens=1000, expect_clip=False))
    # (l) unfrozen_parameters with Axolotl's row ranges: a range keeps the tensor trainable but
    # only its rows inside the union of the matching patterns' ranges get a gradient (the rest
    # zero, so AdamW only decays them); ranges of two patterns merge; a vector takes one too.
    tc = dict(tc)
    tc["unfrozen_parameters"] = ["model.embed_tokens.weight$[:40]", "model.layers.1.mlp.down_proj.weight[4:12]",
                                 "model.layers.1.mlp.down_proj.weight[10:20]", "^model.layers.0.self_attn.q_proj.weight[3]",
                                 "model.norm.weight$[8:]", "lm_head.weight$", "model.layers.2.mlp.up_proj"]
    out.append(dict(
        name="l_unfrozen_rows",
        cfg=R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2),
        tc=tc, shard_version=1, n_tokens=1000, expect_clip=False))
    # (m) LISA (Axolotl's lisa_n_layers / lisa_step_interval): one of three layers trains at a
    # time, drawn at steps 1, 2, 3 and 5 (s % 2 == 0 or s == 1 completed steps); a layer not drawn
    # has no gradient, so torch's AdamW skips it (no decay) and a drawn one's bias correction
    # counts its own updates; the embedding, final norm and head train throughout. The draws
    # the trainer prints must be the reference's (the same generator, llama_ref.lisa_draw).
    tc = R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=2,
                        max_steps=7, learning_rate=5e-3, lr_scheduler="cosine",
                        warmup_steps=1, weight_decay=0.1, max_grad_norm=1.0, seed=3)
    tc.update(lisa_n_layers=1, lisa_step_interval=2)
    out.append(dict(
        name="m_lisa",
        cfg=R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2),
        tc=tc, shard_version=1, n_tokens=1200, expect_clip=False, lisa=True))
    # Two of four layers: the drawn layers take the gradient slots in layer order at each draw,
    # so a layer's slot changes from draw to draw.
    tc = dict(tc, lisa_n_layers=2)
    out.append(dict(
        name="m_lisa2",
        cfg=R.make_config(vocab_size=64, hidden_size=32, intermediate_size=64,
                          num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2),
        tc=tc, shard_version=1, n_tokens=1200, expect_clip=False, lisa=True))
    return out


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def run_binary(binary, workdir, tc, threads, timeout):
    yaml_path = os.path.join(workdir, "cfg.yaml")
    R.write_yaml(yaml_path, tc)
    cmd = [binary, "-c", yaml_path]
    if threads is not None:
        cmd += ["--set", f"num_threads={threads}"]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=timeout)
    dt = time.time() - t0
    log = p.stdout.decode("utf-8", "replace")
    global LAST_LOG
    LAST_LOG = log
    if p.returncode != 0:
        raise RuntimeError(f"trainer exit {p.returncode} after {dt:.1f}s; output tail:\n"
                           + "\n".join(log.splitlines()[-15:]))
    rows = R.read_metrics(os.path.join(tc["output_dir"], "metrics.jsonl"))
    weights = R.read_safetensors(os.path.join(tc["output_dir"], "model.safetensors"))
    return rows, weights, dt


def run_self_check(cfg, weights, tokens, tc):
    """Stand-in for the binary: the reference in float32, reporting like the trainer does."""
    ref = R.train_reference(cfg, weights, tokens, tc, dtype=torch.float32)
    rows = [{"step": i + 1, "loss": l, "lr": lr, "grad_norm": g}
            for i, (l, lr, g) in enumerate(zip(ref["losses"], ref["lrs"], ref["grad_norms"]))]
    w = {k: v.astype(np.float32) for k, v in ref["weights"].items()}
    return rows, w, 0.0


def check_case(case, args, root):
    name = case["name"]
    cfg, tc = case["cfg"], dict(case["tc"])
    work = os.path.join(root, name)
    os.makedirs(work)
    model_dir = os.path.join(work, "model")
    shard = os.path.join(work, "train.bin")
    init = dict(qk_std=0.25)  # attention far from uniform, so RoPE and masking matter
    init.update(case.get("init", {}))
    weights = R.init_weights(cfg, seed=len(name) * 7 + 1, **init)
    R.save_hf_dir(model_dir, cfg, weights)
    tokens = R.random_tokens(case["n_tokens"], cfg["vocab_size"], seed=len(name))
    R.write_shard(shard, tokens, version=case["shard_version"])
    tokens = R.read_shard(shard)  # what the trainer sees
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))

    ref = R.train_reference(cfg, weights, tokens, tc)

    cand_tc = dict(tc)
    if args.perturb_lr != 1.0:
        cand_tc["learning_rate"] = tc["learning_rate"] * args.perturb_lr
    if args.self_check:
        rows, got_w, dt = run_self_check(cfg, weights, tokens, cand_tc)
    else:
        rows, got_w, dt = run_binary(args.bin, work, cand_tc, args.threads, args.timeout)

    errs = []
    notes = []
    nsteps = int(tc["max_steps"])
    mgn = float(tc["max_grad_norm"])
    if case.get("expect_clip"):
        if not any(g > mgn for g in ref["grad_norms"]):
            errs.append(f"test setup: reference grad_norm never exceeds max_grad_norm {mgn} "
                        f"({ref['grad_norms']})")
        else:
            notes.append(f"clipped {sum(g > mgn for g in ref['grad_norms'])}/{nsteps} steps")
    by_step = {}
    for r in rows:
        by_step[int(r["step"])] = r
    steps = sorted(by_step)
    if steps != list(range(1, nsteps + 1)):
        errs.append(f"metrics.jsonl train steps {steps}, expected 1..{nsteps}")
    worst_loss = worst_lr = worst_gn = 0.0
    for s in range(1, nsteps + 1):
        if s not in by_step:
            continue
        r = by_step[s]
        rl, rlr, rg = ref["losses"][s - 1], ref["lrs"][s - 1], ref["grad_norms"][s - 1]
        bad = [k for k in ("loss", "lr", "grad_norm") if k not in r
               or not isinstance(r[k], (int, float)) or not math.isfinite(r[k])]
        if bad:
            errs.append(f"step {s}: {', '.join(bad)} missing or not finite")
            break
        e = rel(r["loss"], rl)
        worst_loss = max(worst_loss, e)
        if e > LOSS_RTOL:
            errs.append(f"step {s}: loss {r['loss']:.9g} vs ref {rl:.9g} (rel {e:.2e})")
        e = abs(r["lr"] - rlr) / max(abs(rlr), 1e-12) if rlr != 0 else abs(r["lr"])
        worst_lr = max(worst_lr, e)
        if (rlr != 0 and e > LR_RTOL) or (rlr == 0 and abs(r["lr"]) > 1e-12):
            errs.append(f"step {s}: lr {r['lr']:.9g} vs ref {rlr:.9g}")
        e = rel(r["grad_norm"], rg)
        worst_gn = max(worst_gn, e)
        if e > GN_RTOL:
            errs.append(f"step {s}: grad_norm {r['grad_norm']:.9g} vs ref {rg:.9g} "
                        f"(rel {e:.2e})")
    # final weights
    ref_w = ref["weights"]
    if set(got_w) != set(ref_w):
        errs.append(f"output tensors differ: missing {sorted(set(ref_w) - set(got_w))[:5]}, "
                    f"extra {sorted(set(got_w) - set(ref_w))[:5]}")
    worst = (0.0, "")
    nbad = 0
    for k in ref_w:
        if k not in got_w:
            continue
        a, b = np.asarray(got_w[k], dtype=np.float64), ref_w[k]
        if a.shape != b.shape:
            errs.append(f"{k}: shape {a.shape} vs ref {b.shape}")
            continue
        d = float(np.max(np.abs(a - b)))
        tol = W_TOL * max(1.0, float(np.max(np.abs(b))))
        if not np.isfinite(d):
            d = float("inf")
        if d / tol > worst[0]:
            worst = (d / tol, f"{k} maxdiff {d:.3e} (tol {tol:.1e})")
        if d > tol:
            nbad += 1
            if nbad <= 4:
                errs.append(f"weight {k}: max abs diff {d:.3e} > tol {tol:.1e}")
    if nbad > 4:
        errs.append(f"... {nbad} tensors over tolerance in all")
    # sanity: the window keys really matter here (the first step's loss with the window turned
    # off, or on, differs by far more than the tolerance), so a trainer that ignored them fails
    if case.get("contrast"):
        off = dict(cfg, **case["contrast"])
        batches = R.step_batches(tokens, int(tc["micro_batch_size"]), int(tc["sequence_len"]),
                                 int(tc["gradient_accumulation_steps"]), 1)
        d = rel(R.batch_loss(off, weights, batches), R.batch_loss(cfg, weights, batches))
        notes.append(f"window on/off changes the loss by {d:.1e}")
        if d < 10 * LOSS_RTOL:
            errs.append(f"test setup: toggling the window changes the loss by only {d:.1e}")
    if case.get("lisa") and not args.self_check:
        got = [(int(m.group(1)), sorted(int(x) for x in m.group(2).split(", ")))
               for m in re.finditer(r"^LISA: from step (\d+) the layers ([\d, ]+) train$", LAST_LOG, re.M)]
        if got != ref["lisa_log"]:
            errs.append(f"LISA draws {got}, the reference's {ref['lisa_log']}")
        drawn = {l for _, on in ref["lisa_log"] for l in on}
        if len(drawn) < 2:
            errs.append(f"test setup: the draws {ref['lisa_log']} visit one layer only")
        notes.append(f"LISA draws {ref['lisa_log']}")
    # sanity: the reference really trained (weights moved by much more than the tolerance)
    init_d = max(float(np.max(np.abs(ref_w[k] - weights[k]))) for k in ref_w)
    summary = (f"loss rel {worst_loss:.1e}, lr rel {worst_lr:.1e}, gnorm rel {worst_gn:.1e}, "
               f"worst weight {worst[1]}, max weight change {init_d:.1e}, "
               f"losses {ref['losses'][0]:.4f}->{ref['losses'][-1]:.4f}"
               + (f", {'; '.join(notes)}" if notes else "") + f", run {dt:.1f}s")
    return errs, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="./train_llama", help="trainer binary")
    ap.add_argument("--threads", type=int, default=None, help="--set num_threads=N")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per trainer run")
    ap.add_argument("--only", default=None, help="run only cases whose name contains this")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--self-check", action="store_true",
                    help="use a float32 torch run as the candidate instead of the binary")
    ap.add_argument("--perturb-lr", type=float, default=1.0,
                    help="multiply the candidate's learning rate (to see the test fail)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    if not args.self_check:
        args.bin = os.path.abspath(args.bin)
        if not os.access(args.bin, os.X_OK):
            print(f"FAIL setup: {args.bin} is not an executable (run make first)")
            print("0 passed, 1 failed")
            return 1
    root = tempfile.mkdtemp(prefix="test_torch_ref_")
    passed = failed = 0
    try:
        passed, failed = harness.run_cases(
            ((c["name"], lambda c=c: check_case(c, args, root)) for c in cases()), args.only, args.verbose)
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
