#!/usr/bin/python3
"""Phi-3 (model_type phi3, Phi3ForCausalLM) end to end: the family row of llmc/family.c.

    /usr/bin/python3 test/test_phi3.py --bin build/train_llama

The reference is test/llama_ref.py's Phi-3 path: plain PyTorch in float64 written from
transformers' modeling_phi3 (the fused self_attn.qkv_proj sliced q | k | v, mlp.gate_up_proj
chunked gate | up, the sliding-window mask kv_idx > q_idx - sliding_window on every layer, the
embedding's padding_idx = pad_token_id). The reference computes with the fused weights as the
files hold them, so the trainer's split at load and join at save are checked against the
modeling code's slicing, not against themselves. transformers 4.44.2 and peft 0.11.1 (in
/opt/llmc-transformers-4.44.2, from scripts/install_deps.sh) check the adapter in lora_peft.

  one_step          GQA 4/2, sliding_window 5 < sequence_len 16, pad_token_id 3 frequent in
                    the data: the first loss within 1e-5 (relative), and after one AdamW step
                    (weight decay) every output weight, by its fused name, within 1e-5.
  steps_tied        tied embeddings (the padding row keeps the head's gradient), 3 steps,
                    grad accumulation, clipping: losses 1e-5, grad norms 1e-4, weights 1e-4;
                    the window and the padding row both matter (toggling either moves the
                    result by far more than the tolerance).
  export            the output directory as transformers loads a Phi-3: config.json
                    (Phi3ForCausalLM, phi3, sliding_window, pad_token_id,
                    original_max_position_embeddings), the input's tensor names (qkv_proj,
                    gate_up_proj, no q_proj); bfloat16 shards with an index naming the fused
                    tensors; the output trains again as a base with the reference's loss.
  lora_o_down       LoRA on o_proj and down_proj: losses and adapters against the reference,
                    adapter_config target_modules, and the merged model (fused qkv/gate_up
                    unchanged, o/down = W + scale B A).
  lora_fused        the same on all four modules: qkv_proj's one adapter (B over q | k | v) and
                    gate_up_proj's (B over gate | up) against the reference's fused Linear.
  lora_peft         lora_target_linear on Phi-3; the adapter loads in peft 0.11.1 on
                    transformers 4.44.2's Phi3ForCausalLM (logits 1e-5), merge_and_unload equals
                    our merged model (1e-6).
  longrope          rope_scaling longrope with the long and the short factors: the reference's
                    logits against transformers 4.44.2's Phi3ForCausalLM, then loss, one step's
                    weights and the rope_scaling written back.
  partial_rotary    partial_rotary_factor 0.5 (Phi-4-mini has 0.75): RoPE over the first half of
                    each head, plain and with longrope (3 factors): first loss and one step's
                    weights against the reference, the factor written back.
  refusals          one-line errors: other rope_scaling types, bad longrope factor lists or
                    keys, partial_rotary_factor that rotates an odd share or none, longrope
                    factor lists not of the rotated share's length,
                    resid_pdrop / embd_pdrop / attention_dropout > 0, an absent pad_token_id
                    (32000) past a small vocab, LoRA on q_proj (no such module in Phi-3),
                    unfused files, a wrong qkv_proj shape.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import llama_ref as R  # noqa: E402

ARGS = None
PAD = 3


def phi3_cfg(**kw):
    c = dict(vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, model_type="phi3", rms_norm_eps=1e-5,
             rope_theta=10000.0, sliding_window=5, pad_token_id=PAD, bos_token_id=1,
             eos_token_id=PAD, original_max_position_embeddings=128, resid_pdrop=0.0,
             embd_pdrop=0.0, attention_dropout=0.0, max_position_embeddings=128)
    c.update(kw)
    cfg = R.make_config(**c)
    if "head_dim" not in kw:
        cfg.pop("head_dim")  # Phi3Config has none: hidden / heads
    cfg.pop("attention_bias")
    cfg.pop("mlp_bias")
    return cfg


def tokens_with_pad(n, vocab, seed):
    t = np.asarray(R.random_tokens(n, vocab, seed=seed))
    t[::5] = PAD  # every fifth token is the padding id (Phi-3's pad is its end-of-text)
    return t


def run(work, tc, name="cfg.yaml", expect_ok=True, env=None):
    path = os.path.join(work, name)
    R.write_yaml(path, tc)
    cmd = [ARGS.bin, "-c", path]
    if ARGS.threads is not None:
        cmd += ["--set", f"num_threads={ARGS.threads}"]
    p = subprocess.run(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=ARGS.timeout, env=dict(os.environ, **(env or {})))
    if expect_ok and p.returncode != 0:
        raise RuntimeError(f"trainer exit {p.returncode}: {p.stderr.decode()[-600:]}")
    return p


def setup(work, cfg, n_tokens, seed, init=None):
    os.makedirs(work, exist_ok=True)
    weights = R.init_weights(cfg, seed=seed, **(init or dict(embed_std=0.1)))
    model_dir = os.path.join(work, "model")
    R.save_hf_dir(model_dir, cfg, weights)
    shard = os.path.join(work, "train.bin")
    R.write_shard(shard, tokens_with_pad(n_tokens, cfg["vocab_size"], seed), version=1)
    return model_dir, shard, R.read_shard(shard), weights


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def compare_weights(got, ref, tol, scaled):
    """(errors, worst abs diff): every reference tensor, by name, within tol (x max(1, |w|))."""
    errs = []
    worst = 0.0
    if set(got) != set(ref):
        errs.append(f"output tensors differ: missing {sorted(set(ref) - set(got))[:4]}, "
                    f"extra {sorted(set(got) - set(ref))[:4]}")
    for k, v in ref.items():
        if k not in got:
            continue
        g = np.asarray(got[k], dtype=np.float64)
        if g.shape != v.shape:
            errs.append(f"{k}: shape {g.shape} vs {v.shape}")
            continue
        d = float(np.max(np.abs(g - v)))
        worst = max(worst, d)
        t = tol * (max(1.0, float(np.max(np.abs(v)))) if scaled else 1.0)
        if d > t:
            errs.append(f"{k}: max diff {d:.3e} > {t:.1e}")
    return errs, worst


def check_losses(rows, ref, errs, gn=True):
    worst = 0.0
    if len(rows) != len(ref["losses"]):
        errs.append(f"{len(rows)} metrics rows, expected {len(ref['losses'])}")
    for s, r in enumerate(rows[:len(ref["losses"])]):
        e = rel(r["loss"], ref["losses"][s])
        worst = max(worst, e)
        if e > 1e-5:
            errs.append(f"step {s + 1}: loss {r['loss']} vs ref {ref['losses'][s]} (rel {e:.1e})")
        if gn and rel(r["grad_norm"], ref["grad_norms"][s]) > 1e-4:
            errs.append(f"step {s + 1}: grad_norm {r['grad_norm']} vs ref {ref['grad_norms'][s]}")
    return worst


def case_one_step(root):
    work = os.path.join(root, "one_step")
    cfg = phi3_cfg()
    model_dir, shard, tokens, weights = setup(work, cfg, 600, seed=3,
                                              init=dict(qk_std=0.25, embed_std=0.1))
    tc = R.train_config(sequence_len=16, micro_batch_size=2, max_steps=1, learning_rate=1e-3,
                        warmup_steps=0, lr_scheduler="constant", weight_decay=0.1,
                        max_grad_norm=0.0)
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
    run(work, tc)
    ref = R.train_reference(cfg, weights, tokens, tc)
    rows = R.read_metrics(os.path.join(tc["output_dir"], "metrics.jsonl"))
    errs = []
    wl = check_losses(rows, ref, errs)
    got = R.read_safetensors(os.path.join(tc["output_dir"], "model.safetensors"))
    werrs, ww = compare_weights(got, ref["weights"], 1e-5, scaled=False)
    errs += werrs
    moved = max(float(np.max(np.abs(ref["weights"][k] - weights[k]))) for k in weights)
    return errs, f"loss rel {wl:.1e}, weights max diff {ww:.1e} (step moved them {moved:.1e})"


def case_steps_tied(root):
    work = os.path.join(root, "steps_tied")
    cfg = phi3_cfg(tie_word_embeddings=True, num_attention_heads=6, num_key_value_heads=2,
                   sliding_window=4)
    model_dir, shard, tokens, weights = setup(work, cfg, 1500, seed=7,
                                              init=dict(qk_std=0.25, embed_std=0.1))
    tc = R.train_config(sequence_len=13, micro_batch_size=2, gradient_accumulation_steps=2,
                        max_steps=3, learning_rate=5e-3, lr_scheduler="cosine", warmup_steps=1,
                        weight_decay=0.1, max_grad_norm=0.5)
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
    run(work, tc)
    ref = R.train_reference(cfg, weights, tokens, tc)
    rows = R.read_metrics(os.path.join(tc["output_dir"], "metrics.jsonl"))
    errs = []
    wl = check_losses(rows, ref, errs)
    got = R.read_safetensors(os.path.join(tc["output_dir"], "model.safetensors"))
    werrs, ww = compare_weights(got, ref["weights"], 1e-4, scaled=True)
    errs += werrs
    # Both Phi-3 specifics matter here: without the window the first loss moves, without the
    # padding row the trained embedding does.
    batches = R.step_batches(tokens, 2, 13, 2, 1)
    d_win = rel(R.batch_loss(dict(cfg, sliding_window=None), weights, batches),
                R.batch_loss(cfg, weights, batches))
    nopad = R.train_reference(dict(cfg, pad_token_id=None), weights, tokens, tc)
    e = "model.embed_tokens.weight"
    d_pad = float(np.max(np.abs(nopad["weights"][e][PAD] - ref["weights"][e][PAD])))
    if d_win < 1e-3:
        errs.append(f"test setup: the window moves the loss by only {d_win:.1e}")
    if d_pad < 1e-3:
        errs.append(f"test setup: padding_idx moves the pad row by only {d_pad:.1e}")
    return errs, (f"loss rel {wl:.1e}, weights max diff {ww:.1e}; window on/off moves the loss "
                  f"{d_win:.1e}, padding_idx on/off the pad row {d_pad:.1e}")


def read_json(p):
    with open(p) as f:
        return json.load(f)


def case_export(root):
    work = os.path.join(root, "export")
    cfg = phi3_cfg(num_hidden_layers=3)
    model_dir, shard, tokens, weights = setup(work, cfg, 600, seed=11)
    tc = R.train_config(sequence_len=12, micro_batch_size=1, max_steps=1, learning_rate=1e-3,
                        warmup_steps=0, lr_scheduler="constant")
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
    run(work, tc)
    out = tc["output_dir"]
    errs = []
    got = read_json(os.path.join(out, "config.json"))
    expect = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "sliding_window": 5,
              "pad_token_id": PAD, "original_max_position_embeddings": 128,
              "tie_word_embeddings": False, "rope_scaling": None, "partial_rotary_factor": 1.0,
              "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attention_dropout": 0.0,
              "hidden_size": 48, "num_key_value_heads": 2, "torch_dtype": "float32"}
    for k, v in expect.items():
        if got.get(k, "<absent>") != v:
            errs.append(f"config.json {k} = {got.get(k, '<absent>')!r}, expected {v!r}")
    w_out = R.read_safetensors(os.path.join(out, "model.safetensors"))
    if set(w_out) != set(weights):
        errs.append(f"output tensors differ from the input's: {sorted(set(w_out) ^ set(weights))[:4]}")
    # Round trip: the output is a base that the trainer and the reference read alike.
    t2 = dict(tc, base_model=out, output_dir=os.path.join(work, "out2"))
    run(work, t2, "again.yaml")
    rows = R.read_metrics(os.path.join(t2["output_dir"], "metrics.jsonl"))
    ref = R.batch_loss(got, w_out, R.step_batches(tokens, 1, 12, 1, 1))
    e = rel(rows[0]["loss"], ref)
    if e > 1e-5:
        errs.append(f"reloaded output's first loss {rows[0]['loss']} vs reference {ref}")
    # bfloat16 shards: the index names the fused tensors, and they hold the float32 output's
    # values rounded to bfloat16.
    t3 = dict(tc, output_dir=os.path.join(work, "out_bf16"), save_dtype="bfloat16",
              max_shard_size=20000)
    run(work, t3, "bf16.yaml")
    idx = read_json(os.path.join(t3["output_dir"], "model.safetensors.index.json"))
    wm = idx["weight_map"]
    if set(wm) != set(weights):
        errs.append(f"sharded index names {sorted(set(wm) ^ set(weights))[:4]} apart from the input's")
    nshards = len(set(wm.values()))
    if nshards < 2:
        errs.append(f"expected several shards, got {nshards}")
    shards = {}
    for f in set(wm.values()):
        shards.update(R.read_safetensors(os.path.join(t3["output_dir"], f)))
    for k in ("model.layers.1.self_attn.qkv_proj.weight", "model.layers.2.mlp.gate_up_proj.weight"):
        a = np.asarray(shards[k], dtype=np.float64)
        b = np.asarray(w_out[k], dtype=np.float64)
        d = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-30)))
        if a.shape != b.shape or d > 2 ** -8:
            errs.append(f"{k} (bfloat16) differs from the float32 output by {d:.1e} relative")
    return errs, f"config keys and tensor names kept, round-trip loss rel {e:.1e}, bf16 in {nshards} shards"


def case_lora_o_down(root, targets=("o_proj", "down_proj"), name="lora"):
    work = os.path.join(root, name)
    cfg = phi3_cfg()
    model_dir, shard, tokens, weights = setup(work, cfg, 1200, seed=21,
                                              init=dict(qk_std=0.25, embed_std=0.1))
    targets = list(targets)
    spec = R.lora_spec(cfg, r=4, alpha=8, targets=targets, seed=21, b_std=0.1)
    adir = os.path.join(work, "adapter_in")
    R.save_adapter_dir(adir, spec)
    tc = R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=1,
                        max_steps=3, learning_rate=5e-3, lr_scheduler="constant", warmup_steps=0,
                        weight_decay=0.1, max_grad_norm=1.0)
    tc.update(base_model=model_dir, train_data=shard, adapter="lora", lora_r=4, lora_alpha=8,
              lora_dropout=0.0, lora_target_modules=targets, lora_model_dir=adir,
              merge_lora=True, output_dir=os.path.join(work, "out"))
    run(work, tc)
    ref = R.train_reference(cfg, weights, tokens, tc, lora=spec)
    rows = R.read_metrics(os.path.join(tc["output_dir"], "metrics.jsonl"))
    errs = []
    wl = check_losses(rows, ref, errs)
    out = R.read_safetensors(os.path.join(tc["output_dir"], "adapter_model.safetensors"))
    got = {k[len(R.PEFT_PREFIX):]: v for k, v in out.items()}
    werrs, ww = compare_weights(got, ref["adapter"], 1e-4, scaled=True)
    errs += werrs
    ac = read_json(os.path.join(tc["output_dir"], "adapter_config.json"))
    if ac.get("target_modules") != targets:
        errs.append(f"adapter_config target_modules {ac.get('target_modules')}, expected {targets}")
    merged = R.read_safetensors(os.path.join(tc["output_dir"], "merged", "model.safetensors"))
    want = R.merge_lora(cfg, weights, dict(spec, weights=ref["adapter"]))
    merrs, mw = compare_weights(merged, want, 1e-5, scaled=True)
    errs += merrs
    return errs, f"loss rel {wl:.1e}, adapters max diff {ww:.1e}, merged max diff {mw:.1e}"


def case_lora_fused(root):
    """LoRA on every Phi-3 module, the fused ones included: qkv_proj's adapter is one A over the
    input and one B over q | k | v (GQA: rows Hq D + 2 Hkv D), gate_up_proj's one B over gate |
    up, as PEFT adapts the Linear modules; the reference applies them to the fused outputs."""
    return case_lora_o_down(root, R.PHI3_LORA_TARGETS, "lora_fused")


# Run by transformers 4.44.2's Phi3ForCausalLM and peft 0.11.1 in a child Python (the
# transformers on the default path builds no model on Debian's torch 1.13): the base plus the
# adapter directory as PeftModel.from_pretrained loads them, logits for argv[3]'s ids, and the
# merge_and_unload weights, into the .npz at argv[4].
PEFT_CHILD = r"""
import json, sys
import numpy as np, torch
from transformers import Phi3ForCausalLM
from peft import PeftModel
model_dir, adapter_dir, ids, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
base = Phi3ForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager").eval()
pm = PeftModel.from_pretrained(base, adapter_dir).eval()
with torch.no_grad():
    logits = pm(torch.tensor(ids)).logits.double().numpy()
    merged = {k: v.double().numpy() for k, v in pm.merge_and_unload().state_dict().items()}
np.savez(out, logits=logits, **{"w:" + k: v for k, v in merged.items()})
"""
TF_DIR = os.environ.get("LLMC_GPT2_TRANSFORMERS", "/opt/llmc-transformers-4.44.2")


def case_lora_peft(root):
    """lora_target_linear (Axolotl) selects every Phi-3 module, qkv_proj and gate_up_proj
    included; the trained adapter loads in peft 0.11.1 on transformers 4.44.2's
    Phi3ForCausalLM and gives the reference's logits, and peft's merge_and_unload gives our
    merged model. (5 tokens: 4.44's eager attention ignores the window of 5.)"""
    if not os.path.isfile(os.path.join(TF_DIR, "transformers", "__init__.py")):
        return [f"transformers 4.44.2 is not in {TF_DIR}: run scripts/install_deps.sh"], ""
    work = os.path.join(root, "lora_peft")
    cfg = phi3_cfg()
    model_dir, shard, tokens, weights = setup(work, cfg, 1200, seed=23, init=dict(qk_std=0.25, embed_std=0.1))
    tc = R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=1, max_steps=2,
                        learning_rate=2e-2, lr_scheduler="constant", warmup_steps=0)
    tc.update(base_model=model_dir, train_data=shard, adapter="lora", lora_r=4, lora_alpha=8, lora_dropout=0.0,
              lora_target_linear=True, merge_lora=True, output_dir=os.path.join(work, "out"))
    run(work, tc)
    out = tc["output_dir"]
    errs = []
    ac = read_json(os.path.join(out, "adapter_config.json"))
    want_tm = list(R.PHI3_LORA_TARGETS)
    if ac.get("target_modules") != want_tm:
        errs.append(f"adapter_config target_modules {ac.get('target_modules')}, expected {want_tm}")
    ids = [[5, PAD, 17, 40, 9], [1, 2, 63, PAD, 30]]
    npz = os.path.join(work, "peft.npz")
    env = dict(os.environ, PYTHONPATH=TF_DIR)
    p = subprocess.run([sys.executable, "-c", PEFT_CHILD, model_dir, out, json.dumps(ids), npz], env=env,
                       capture_output=True, timeout=ARGS.timeout)
    if p.returncode != 0:
        return errs + ["peft could not load the adapter: " + p.stderr.decode("utf-8", "replace")[-600:]], ""
    got = np.load(npz)
    spec = R.load_adapter_dir(out)
    import torch
    ref = R.RefLlama(cfg, weights, lora=spec)
    with torch.no_grad():
        want = ref(torch.tensor(ids)).double().numpy()
    ld = float(np.abs(got["logits"] - want).max() / np.abs(want).max())
    if not ld <= 1e-5:
        errs.append(f"peft logits vs the reference with our adapter: {ld:.2e} relative (max 1e-5)")
    base_delta = max(float(np.abs(spec["weights"][k]).max()) for k in spec["weights"] if ".lora_B." in k)
    if base_delta == 0:
        errs.append("the trained lora_B tensors are all zero: the check would not see the adapter")
    ours = R.read_safetensors(os.path.join(out, "merged", "model.safetensors"))
    md = 0.0
    for k, v in ours.items():
        w = got["w:" + k] if "w:" + k in got.files else None
        if w is None:
            errs.append(f"merged tensor {k} is not in peft's merged model")
            continue
        md = max(md, float(np.abs(np.asarray(v, np.float64) - w).max() / max(np.abs(w).max(), 1e-30)))
    if not md <= 1e-6:
        errs.append(f"merged model vs peft's merge_and_unload: {md:.2e} relative (max 1e-6)")
    return errs, f"peft logits {ld:.1e} rel, merged weights {md:.1e} rel"


# Logits of transformers 4.44.2's Phi3ForCausalLM (its own longrope code) for argv[2]'s ids
# from the model directory argv[1], into the .npy at argv[3].
HF_CHILD = r"""
import json, sys
import numpy as np, torch
from transformers import Phi3ForCausalLM
m = Phi3ForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32, attn_implementation="eager").eval()
with torch.no_grad():
    np.save(sys.argv[3], m(torch.tensor(json.loads(sys.argv[2]))).logits.double().numpy())
"""

SHORT = [1.0, 1.1, 1.3, 1.7, 2.2, 3.0]
LONG = [1.5, 2.0, 3.1, 5.0, 8.0, 13.0]


def one_step_vs_reference(work, cfg, model_dir, shard, tokens, weights, name, errs):
    """One AdamW step (T 16, 2 rows) against the reference: the loss's and the weights' worst
    relative errors (failures appended to errs, prefixed with name) and the config.json written."""
    tc = R.train_config(sequence_len=16, micro_batch_size=2, max_steps=1, learning_rate=1e-3, warmup_steps=0,
                        lr_scheduler="constant", weight_decay=0.1, max_grad_norm=0.0)
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
    run(work, tc)
    ref = R.train_reference(cfg, weights, tokens, tc)
    wl = check_losses(R.read_metrics(os.path.join(tc["output_dir"], "metrics.jsonl")), ref, errs)
    got = R.read_safetensors(os.path.join(tc["output_dir"], "model.safetensors"))
    werrs, ww = compare_weights(got, ref["weights"], 1e-5, scaled=False)
    errs += [f"{name}: {e}" for e in werrs]
    return wl, ww, read_json(os.path.join(tc["output_dir"], "config.json"))


def case_longrope(root):
    """rope_scaling longrope (Phi-3-mini-128k, Phi-3.5-mini): inv_freq / short or long factors
    by the batch's length against original_max_position_embeddings, cos/sin times
    sqrt(1 + ln(max / orig) / ln(orig)). For a long (16 > 8) and a short (16 <= 32) setting:
    the reference's logits against transformers 4.44.2's Phi3ForCausalLM, then the first loss
    and one AdamW step's weights against the reference, and rope_scaling written back."""
    import torch
    errs, notes = [], []
    for name, orig, legacy in (("long", 8, "longrope"), ("short", 32, "su")):
        work = os.path.join(root, "longrope_" + name)
        cfg = phi3_cfg(sliding_window=None, max_position_embeddings=128, original_max_position_embeddings=orig,
                       rope_scaling={"type": legacy, "short_factor": SHORT, "long_factor": LONG})
        model_dir, shard, tokens, weights = setup(work, cfg, 600, seed=5, init=dict(qk_std=0.25, embed_std=0.1))
        ids = [list(map(int, tokens[:16])), list(map(int, tokens[16:32]))]
        want = R.RefLlama(cfg, weights)(torch.tensor(ids)).detach().double().numpy()
        if os.path.isfile(os.path.join(TF_DIR, "transformers", "__init__.py")):
            npy = os.path.join(work, "hf.npy")
            p = subprocess.run([sys.executable, "-c", HF_CHILD, model_dir, json.dumps(ids), npy],
                               env=dict(os.environ, PYTHONPATH=TF_DIR), capture_output=True, timeout=ARGS.timeout)
            if p.returncode != 0:
                errs.append(f"{name}: transformers could not run: " + p.stderr.decode("utf-8", "replace")[-400:])
            else:
                hd = float(np.abs(np.load(npy) - want).max() / np.abs(want).max())
                notes.append(f"{name}: reference vs transformers {hd:.1e}")
                if not hd <= 1e-5:
                    errs.append(f"{name}: the reference's logits vs transformers 4.44.2's: {hd:.2e} relative")
        else:
            errs.append(f"transformers 4.44.2 is not in {TF_DIR}: run scripts/install_deps.sh")
        # The other factor set and no attention factor must each move the result past the tolerance.
        other = dict(cfg, original_max_position_embeddings=24 - orig // 2 if orig == 8 else 8)
        flat = dict(cfg, max_position_embeddings=orig)
        for what, c2 in (("the other factors", other), ("no attention factor", flat)):
            d = float(np.abs(R.RefLlama(c2, weights)(torch.tensor(ids)).detach().double().numpy() - want).max()
                      / np.abs(want).max())
            if not d > 1e-3:
                errs.append(f"{name}: {what} moves the logits only {d:.1e}: the check would not see it")
        wl, ww, out = one_step_vs_reference(work, cfg, model_dir, shard, tokens, weights, name, errs)
        rs = out.get("rope_scaling")
        if rs != {"type": "longrope", "short_factor": SHORT, "long_factor": LONG}:
            errs.append(f"{name}: written rope_scaling {rs}")
        notes.append(f"loss rel {wl:.1e}, weights {ww:.1e}")
    return errs, "; ".join(notes)


def case_partial_rotary(root):
    """partial_rotary_factor (Phi-4-mini: 0.75 of head_dim 128): RoPE over the first
    int(head_dim * factor) dimensions of each head, the rest passed (modeling_phi3 of transformers
    4.57), tables and longrope factors for that share. Here 0.5 of head_dim 12: without scaling,
    and with longrope's long factors (3 of them), tied embeddings as Phi-4-mini's: the first loss
    and one AdamW step's weights against the reference, the factor written back; the reference
    with the whole head rotated gives other logits (the check sees the share)."""
    import torch
    errs, notes = [], []
    for name, extra in (("plain", {}), ("longrope", dict(original_max_position_embeddings=8, rope_scaling={
            "type": "longrope", "short_factor": SHORT[:3], "long_factor": LONG[:3]}))):
        work = os.path.join(root, "partial_" + name)
        cfg = phi3_cfg(sliding_window=None, partial_rotary_factor=0.5, tie_word_embeddings=True, **extra)
        model_dir, shard, tokens, weights = setup(work, cfg, 600, seed=6, init=dict(qk_std=0.25, embed_std=0.1))
        if name == "plain":
            ids = torch.tensor([list(map(int, tokens[:16]))])
            a = R.RefLlama(cfg, weights)(ids).detach().double().numpy()
            b = R.RefLlama(dict(cfg, partial_rotary_factor=1.0), weights)(ids).detach().double().numpy()
            d = float(np.abs(a - b).max() / np.abs(a).max())
            if not d > 1e-3:
                errs.append(f"rotating the whole head moves the reference's logits only {d:.1e}")
        wl, ww, out = one_step_vs_reference(work, cfg, model_dir, shard, tokens, weights, name, errs)
        if out.get("partial_rotary_factor") != 0.5 or (extra and out.get("rope_scaling") != dict(
                extra["rope_scaling"], type="longrope")):
            errs.append(f"{name}: written back partial_rotary_factor {out.get('partial_rotary_factor')}, "
                        f"rope_scaling {out.get('rope_scaling')}")
        notes.append(f"{name}: loss rel {wl:.1e}, weights {ww:.1e}")
    return errs, "; ".join(notes)


def case_longrope_packed(root):
    """Longrope picks its factors by the batch's largest position + 1 (transformers:
    max(position_ids) + 1), so packed rows of documents up to 12 tokens long use the short
    factors (original_max_position_embeddings 16) though the rows are 32 long: the same losses
    as a model whose long factors are its short ones, bit for bit; unpacked rows of 32 differ."""
    from checks import prepared_rows_env
    work = os.path.join(root, "longrope_packed")
    os.makedirs(work, exist_ok=True)
    rs = {"type": "longrope", "short_factor": SHORT, "long_factor": LONG}
    cfg = phi3_cfg(sliding_window=None, max_position_embeddings=128, original_max_position_embeddings=16,
                   rope_scaling=rs)
    w = R.init_weights(cfg, seed=7, qk_std=0.25, embed_std=0.1)
    dirs = {}
    for name, c in (("real", cfg), ("all_short", dict(cfg, rope_scaling=dict(rs, long_factor=SHORT)))):
        dirs[name] = os.path.join(work, name)
        R.save_hf_dir(dirs[name], c, w)
        with open(os.path.join(dirs[name], "tokenizer.json"), "w") as f:
            f.write("{}")
    env = {"LLMC_SCRIPTS_DIR": prepared_rows_env(work, 32, [0, 9, 20, 32]), "LLMC_PYTHON": sys.executable}
    shard = os.path.join(work, "train.bin")
    R.write_shard(shard, tokens_with_pad(2000, 64, 2), version=1)
    out = {}
    for packed in (True, False):
        for name, d in dirs.items():
            tc = R.train_config(sequence_len=32, micro_batch_size=1, max_steps=3, learning_rate=1e-3,
                                warmup_steps=0, lr_scheduler="constant")
            tc.update(base_model=d, output_dir=os.path.join(work, f"out_{name}_{packed}"))
            if packed:
                tc.update(datasets=[{"path": "x.jsonl", "type": "completion"}], tokenizer_config=d)
            else:
                tc.update(train_data=shard)
            run(work, tc, f"{name}_{packed}.yaml", env=env)
            out[name, packed] = [r["loss"] for r in R.read_metrics(os.path.join(tc["output_dir"], "metrics.jsonl"))]
    errs = []
    if out["real", True] != out["all_short", True] or len(out["real", True]) != 3:
        errs.append(f"packed (documents <= 12 tokens): {out['real', True]} vs short factors {out['all_short', True]}")
    d = max(abs(a - b) for a, b in zip(out["real", False], out["all_short", False]))
    if not d > 1e-4:
        errs.append(f"unpacked rows of 32 > 16: the long factors move the loss only {d:.1e}")
    return errs, f"packed = short factors bit for bit; unpacked long vs short {d:.1e}"


def case_resume_modes(root):
    """A checkpoint of a Phi-3 holds the fused tensors and resumes bit-identically; LoRA with
    recompute and layer streaming, and QLoRA, load the fused files too."""
    work = os.path.join(root, "resume")
    cfg = phi3_cfg()
    model_dir, shard, tokens, weights = setup(work, cfg, 800, seed=5)
    tc = R.train_config(sequence_len=16, micro_batch_size=2, max_steps=3, learning_rate=2e-3,
                        warmup_steps=0, lr_scheduler="linear")
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "full"),
              save_steps=2)
    run(work, tc, "full.yaml")
    errs = []
    ck = R.read_safetensors(os.path.join(tc["output_dir"], "checkpoint-2", "model.safetensors"))
    if set(ck) != set(weights):
        errs.append(f"checkpoint tensors {sorted(set(ck) ^ set(weights))[:4]} differ from the base's")
    t2 = dict(tc, output_dir=os.path.join(work, "resumed"),
              resume_from_checkpoint=os.path.join(tc["output_dir"], "checkpoint-2"))
    run(work, t2, "resumed.yaml")
    a = R.read_metrics(os.path.join(tc["output_dir"], "metrics.jsonl"))
    b = R.read_metrics(os.path.join(t2["output_dir"], "metrics.jsonl"))
    if [r["loss"] for r in a][2:] != [r["loss"] for r in b][-1:]:
        errs.append(f"resumed step 3 loss {[r['loss'] for r in b]} vs {[r['loss'] for r in a]}")
    wa = R.read_safetensors(os.path.join(tc["output_dir"], "model.safetensors"))
    wb = R.read_safetensors(os.path.join(t2["output_dir"], "model.safetensors"))
    if any(not np.array_equal(wa[k], wb[k]) for k in wa):
        errs.append("resumed final weights differ from the straight run's")
    lora = dict(save_steps=0, adapter="lora", lora_r=4, lora_alpha=8, lora_target_modules=["o_proj", "down_proj"])
    t3 = dict(tc, output_dir=os.path.join(work, "lora"), **lora)
    run(work, t3, "lora.yaml")
    t3s = dict(t3, output_dir=os.path.join(work, "streamed"), gradient_checkpointing="true", layer_offloading=True)
    run(work, t3s, "streamed.yaml")
    c = [R.read_metrics(os.path.join(t["output_dir"], "metrics.jsonl")) for t in (t3, t3s)]
    if [(r["loss"], r["grad_norm"]) for r in c[0]] != [(r["loss"], r["grad_norm"]) for r in c[1]]:
        errs.append("LoRA with recompute + layer streaming: losses differ from the plain LoRA run's")
    t4 = dict(tc, output_dir=os.path.join(work, "qlora"), max_steps=2, **dict(lora, adapter="qlora"))
    t4["load_in_4bit"] = True
    run(work, t4, "qlora.yaml")
    q = R.read_metrics(os.path.join(t4["output_dir"], "metrics.jsonl"))
    # NF4 rounds the base: the first loss is near the float one, not equal to it.
    if not (len(q) == 2 and abs(q[0]["loss"] - a[0]["loss"]) < 0.05 * a[0]["loss"]):
        errs.append(f"qlora losses {[r['loss'] for r in q]} vs float base {a[0]['loss']}")
    return errs, "checkpoint fused and resumed bit-identically; streamed LoRA identical; qlora runs"


def case_pad_negative(root):
    """transformers' nn.Embedding counts a negative padding_idx from the end (any family)."""
    work = os.path.join(root, "pad_negative")
    cfg = R.make_config(vocab_size=64, hidden_size=32, num_attention_heads=4, pad_token_id=-1)
    os.makedirs(work, exist_ok=True)
    weights = R.init_weights(cfg, seed=9, embed_std=0.1)
    model_dir = os.path.join(work, "model")
    R.save_hf_dir(model_dir, cfg, weights)
    t = np.asarray(R.random_tokens(600, 64, seed=9))
    t[::4] = 63
    shard = os.path.join(work, "train.bin")
    R.write_shard(shard, t, version=1)
    tokens = R.read_shard(shard)
    tc = R.train_config(sequence_len=16, micro_batch_size=2, max_steps=2, learning_rate=5e-3,
                        warmup_steps=0, lr_scheduler="constant")
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
    run(work, tc)
    ref = R.train_reference(cfg, weights, tokens, tc)
    errs = []
    wl = check_losses(R.read_metrics(os.path.join(tc["output_dir"], "metrics.jsonl")), ref, errs)
    got = R.read_safetensors(os.path.join(tc["output_dir"], "model.safetensors"))
    werrs, ww = compare_weights(got, ref["weights"], 1e-4, scaled=True)
    errs += werrs
    e = "model.embed_tokens.weight"
    nopad = R.train_reference(dict(cfg, pad_token_id=None), weights, tokens, tc)
    d = float(np.max(np.abs(nopad["weights"][e][63] - ref["weights"][e][63])))
    if d < 1e-3:
        errs.append(f"test setup: padding_idx -1 moves row 63 by only {d:.1e}")
    return errs, f"llama pad_token_id -1: loss rel {wl:.1e}, weights max diff {ww:.1e}, row 63 vs no padding {d:.1e}"


def refusal(root, name, cfg=None, tc_extra=None, want="", weights_fn=None):
    """The run fails with one line on stderr that contains want; returns errors."""
    work = os.path.join(root, "refuse", name)
    cfg = cfg or phi3_cfg()
    os.makedirs(work, exist_ok=True)
    model_dir = os.path.join(work, "model")
    w = R.init_weights(phi3_cfg(), seed=1)
    if weights_fn:
        w = weights_fn(w)
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(cfg, f)
    R.write_safetensors(os.path.join(model_dir, "model.safetensors"), w, metadata={"format": "pt"})
    shard = os.path.join(work, "train.bin")
    R.write_shard(shard, tokens_with_pad(400, 64, 1), version=1)
    tc = R.train_config(sequence_len=8, micro_batch_size=1, max_steps=1, warmup_steps=0,
                        lr_scheduler="constant")
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
    tc.update(tc_extra or {})
    p = run(work, tc, expect_ok=False)
    err = p.stderr.decode("utf-8", "replace").strip()
    if p.returncode == 0:
        return [f"{name}: the run succeeded; expected an error with {want!r}"]
    if want not in err or len(err.splitlines()) != 1:
        return [f"{name}: stderr {err[-300:]!r} is not one line naming {want!r}"]
    return []


def case_refusals(root):
    errs = []
    long_scaling = {"type": "longrope", "short_factor": [1.0] * 6, "long_factor": [2.0] * 6}
    cases = [
        ("dynamic", phi3_cfg(rope_scaling={"type": "dynamic", "factor": 2.0}), None, "'rope_scaling.type' = dynamic"),
        ("longrope_short_len", phi3_cfg(rope_scaling=dict(long_scaling, short_factor=[1.0] * 5)), None,
         "'rope_scaling.short_factor' must be a list of 6 numbers"),
        ("longrope_zero", phi3_cfg(rope_scaling=dict(long_scaling, long_factor=[2.0] * 5 + [0])), None,
         "'rope_scaling.long_factor'[5] must be a positive finite number"),
        ("longrope_key", phi3_cfg(rope_scaling=dict(long_scaling, mscale=1.2)), None,
         "'rope_scaling.mscale' is not supported for longrope"),
        ("llama3_rope", phi3_cfg(rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                               "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                               "original_max_position_embeddings": 64}), None,
         "'rope_scaling.rope_type' = llama3"),
        ("partial_rotary_odd", phi3_cfg(partial_rotary_factor=0.75), None,
         "'partial_rotary_factor' 0.75 rotates 9 of head_dim 12"),
        ("partial_rotary_zero", phi3_cfg(partial_rotary_factor=0.0), None, "'partial_rotary_factor' must be in (0, 1]"),
        ("partial_rotary_longrope_len", phi3_cfg(partial_rotary_factor=0.5, rope_scaling={
            "type": "longrope", "short_factor": SHORT, "long_factor": LONG}), None,
         "'rope_scaling.short_factor' must be a list of 3 numbers"),
        ("resid_pdrop", phi3_cfg(resid_pdrop=0.1), None, "'resid_pdrop' = 0.1"),
        ("embd_pdrop", phi3_cfg(embd_pdrop=0.05), None, "'embd_pdrop' = 0.05"),
        ("attention_dropout", phi3_cfg(attention_dropout=0.1), None, "'attention_dropout' = 0.1"),
        ("pad_default", {k: v for k, v in phi3_cfg().items() if k != "pad_token_id"}, None,
         "pad_token_id is absent, which for phi3 means 32000, past vocab_size 64"),
        ("pad_past_vocab", phi3_cfg(pad_token_id=64), None, "pad_token_id 64 is not a token id of vocab_size 64"),
        ("head_dim", phi3_cfg(head_dim=16), None, "phi3 'head_dim' 16 must be hidden_size / num_attention_heads"),
        ("lora_q_proj", None, dict(adapter="lora", lora_r=2, lora_alpha=4, lora_target_modules=["q_proj"]),
         "unknown module 'q_proj' (expected one of qkv_proj, o_proj, gate_up_proj, down_proj"),
    ]
    for name, cfg, extra, want in cases:
        errs += refusal(root, name, cfg, extra, want)

    def unfused(w):  # Llama-style names in a phi3 directory
        out = {}
        for k, v in w.items():
            if k.endswith("qkv_proj.weight"):
                q, kk, vv = np.split(v, [48, 72])
                for n, a in (("q_proj", q), ("k_proj", kk), ("v_proj", vv)):
                    out[k.replace("qkv_proj", n)] = a
            else:
                out[k] = v
        return out

    def short_qkv(w):
        k = "model.layers.1.self_attn.qkv_proj.weight"
        return dict(w, **{k: w[k][:-8]})

    errs += refusal(root, "unfused", None, None, "missing tensor 'model.layers.0.self_attn.qkv_proj.weight'",
                    weights_fn=unfused)
    errs += refusal(root, "qkv_shape", None, None,
                    "tensor 'model.layers.1.self_attn.qkv_proj.weight' has shape [88, 48], the config needs "
                    "[96, 48]", weights_fn=short_qkv)
    return errs, f"{len(cases) + 2} inputs refused with one line each"


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="./train_llama")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--only", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true")
    ARGS = ap.parse_args()
    ARGS.bin = os.path.abspath(ARGS.bin)
    root = tempfile.mkdtemp(prefix="test_phi3_")
    cases = [("one_step", case_one_step), ("steps_tied", case_steps_tied),
             ("export", case_export), ("lora_o_down", case_lora_o_down),
             ("lora_fused", case_lora_fused), ("lora_peft", case_lora_peft), ("longrope", case_longrope),
             ("longrope_packed", case_longrope_packed), ("partial_rotary", case_partial_rotary),
             ("resume_modes", case_resume_modes), ("pad_negative", case_pad_negative),
             ("refusals", case_refusals)]
    try:
        passed, failed = harness.run_cases(((n, lambda f=f: f(root)) for n, f in cases),
                                           ARGS.only, ARGS.verbose)
    finally:
        if ARGS.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
