#!/usr/bin/python3
"""Model families end to end (llmc/family.c): LoRA and memory modes on Qwen3 with a sliding
window, and config.json written back as the input family's.

    /usr/bin/python3 test/test_families.py --bin build/train_llama

The reference is test/llama_ref.py: plain PyTorch written from transformers' modeling
equations (Qwen3's q_norm/k_norm before RoPE, Qwen2/3 layer_types from use_sliding_window and
max_window_layers, the window mask kv_idx > q_idx - sliding_window), float64; transformers
4.44.2 (in /opt/llmc-transformers-4.44.2, from scripts/install_deps.sh) checks it for yarn. Logit/loss/weight exactness of the families in full fine-tuning is in
test/test_torch_ref.py (cases f-j).

  qwen3_lora_window   Qwen3 (q/k norms, head_dim 16 != C/Hq 12, tied, GQA 4/2, window 5 on
                      layers >= 1, T 20) with LoRA on all seven projections: per-step loss
                      (1e-5 rel), grad_norm (1e-4) and final adapters (1e-4) match the
                      reference; then full recompute + layer streaming, recompute every 2nd
                      layer with disk offload, and selective recompute + activation offloading
                      give bit-identical losses, grad norms and adapter files (tiled MLP and
                      tiled attention too: test_memory_modes.py, test_tiled_attention.py).
  config_write_back   Qwen3, Mistral, Qwen2 and Llama bases: the output config.json names the
                      input family's architecture and model_type, keeps head_dim, the window
                      keys (Mistral's absent sliding_window is transformers' 4096), a list
                      eos_token_id as a list, torch_dtype; the output directory trains again as
                      a base (round trip) with the same first loss as the reference gives it.
  qwen2_layer_types   a config.json with layer_types as transformers >= 4.53 writes it loads.
  gemma3_modes        Gemma 3 text (sandwich norms, (1 + w) norms, GeGLU, scaled embeddings,
                      q/k norms, sliding_window_pattern 2 with local RoPE, T 20 over windows of
                      5), full fine-tuning: the plain run against the reference, then full
                      recompute every 1 and 2 layers with host/disk offload, selective recompute
                      with offload, hidden_states, tiled MLP and tiled attention give the plain
                      run's losses, grad norms and weights bit for bit (every run over the same
                      3 MLP row chunks); LoRA on all seven projections with recompute and layer
                      streaming gives the plain LoRA run's bits; config.json written back with
                      Gemma 3's keys (layer_types, rope_local_base_freq, ...) and trained again.
  gemma3_layer_types  a Gemma 3 config.json with layer_types and no sliding_window_pattern (as
                      transformers >= 4.53 writes it): the pattern is read from the list.
  gemma3_refusals     what Gemma 3 configs can ask that is not implemented (or is not a valid
                      value) stops with a one-line error naming the key: a soft-cap of 0 or a
                      string, a query_pre_attn_scalar of 0, another activation, bidirectional
                      attention, layer_types against the pattern; a model_type gemma3
                      config.json without text_config.
  gemma3_softcap      Gemma 3 with both soft-caps set: the first loss against the reference.
  gemma2_modes        Gemma 2 (Gemma 3's block without q/k norms, one RoPE, even layers sliding,
                      attention scores capped at 0.8 and logits at 1.5, query_pre_attn_scalar 24
                      against head_dim 16): gemma3_modes' runs and checks.
  gemma2_layer_types  layer_types absent (even layers slide) and a period of 3: first loss against
                      the reference, the list and the caps written back (and no Gemma 3 keys).
  gemma2_refusals     a layer_types list that is not periodic, a negative cap, another
                      activation.
  gemma_modes         Gemma 1 (Llama's block with (1 + w) norms, scaled embeddings, GeGLU with
                      exact GELU here): gemma3_modes' runs and checks.
  gemma_gelu          Gemma 1's GELU from each form of its activation keys (the hub's pair that
                      disagree: hidden_activation's tanh one, with a note; hidden_act "gelu"
                      alone: exact, with a note; hidden_activation "gelu": exact) and Gemma 2 with
                      exact GELU and null caps: first loss against the reference (1e-6, the other
                      GELU checked to move it further), both keys written back; the reference's
                      logits against transformers 4.44.2's GemmaForCausalLM for both GELUs.
  gemma_refusals      another activation in either key.
  gemma3_multimodal   Gemma3ForConditionalGeneration files (Gemma 3 4B/12B/27B: text_config with
                      absent keys at their defaults, tensors under language_model.model. or
                      model.language_model., a vision tower beside them): LoRA on the language
                      model against the reference, the same bits from both layouts, the adapter
                      named as PEFT names it on that model and read back as lora_model_dir;
                      merge_lora and a full fine-tune (against the reference, and resumed from a
                      checkpoint to the same bits) save the whole model: the base's config.json
                      around the new text_config, the vision tower's tensors byte for byte.
  yarn                rope_scaling yarn on Llama (its logits against transformers 4.44.2's
                      LlamaForCausalLM) and Qwen2 (every optional key), and linear on Llama
                      (against transformers too): loss, one step's weights, rope_scaling
                      written back; Axolotl's YAML rope_scaling on a model without one gives
                      config.json's loss bit for bit and writes it into the output.
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import llama_ref as R  # noqa: E402

LOSS_RTOL = 1e-5
GN_RTOL = 1e-4
W_TOL = 1e-4
ARGS = None


def run(work, tc, name="cfg.yaml"):
    path = os.path.join(work, name)
    R.write_yaml(path, tc)
    cmd = [ARGS.bin, "-c", path]
    if ARGS.threads is not None:
        cmd += ["--set", f"num_threads={ARGS.threads}"]
    p = subprocess.run(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=ARGS.timeout)
    if p.returncode != 0:
        raise RuntimeError(f"trainer exit {p.returncode}: {p.stderr.decode()[-600:]}")
    return p


def setup(work, cfg, n_tokens, seed):
    os.makedirs(work, exist_ok=True)
    weights = R.init_weights(cfg, seed=seed, qk_std=0.25, embed_std=0.1)
    model_dir = os.path.join(work, "model")
    R.save_hf_dir(model_dir, cfg, weights)
    shard = os.path.join(work, "train.bin")
    R.write_shard(shard, R.random_tokens(n_tokens, cfg["vocab_size"], seed=seed), version=1)
    return model_dir, shard, R.read_shard(shard), weights


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def run_modes(work, tc, modes, wfile, errs):
    """tc run once per mode ({name: extra keys}, "plain" first); every other mode must give the
    plain run's losses, grad norms and wfile bit for bit (else a line in errs). Returns the plain
    run's metrics rows and output directory."""
    got = {}
    os.makedirs(work, exist_ok=True)
    for name, extra in modes.items():
        t = dict(tc, output_dir=os.path.join(work, name), **extra)
        run(work, t, name + ".yaml")
        rows = R.read_metrics(os.path.join(t["output_dir"], "metrics.jsonl"))
        got[name] = ([(r["loss"], r["grad_norm"]) for r in rows], sha(os.path.join(t["output_dir"], wfile)))
        if name == "plain":
            plain = rows, t["output_dir"]
        elif got[name][0] != got["plain"][0]:
            errs.append(f"{name}: losses/grad norms {got[name][0]} differ from the plain run's {got['plain'][0]}")
        elif got[name][1] != got["plain"][1]:
            errs.append(f"{name}: {wfile} differs from the plain run's")
    return plain


def weight_diff(got, want):
    """Max |got - want| and whether it is within W_TOL * max(1, max |want|)."""
    d = float(np.max(np.abs(np.asarray(got, np.float64) - want)))
    return d, d <= W_TOL * max(1.0, float(np.max(np.abs(want))))


def ref_errors(rows, ref, steps, errs):
    """Each step's loss (LOSS_RTOL) and grad norm (GN_RTOL) against the reference's; returns the
    worst loss error."""
    worst = 0.0
    if len(rows) != steps:
        errs.append(f"{len(rows)} metrics rows, expected {steps}")
    for s, r in enumerate(rows[:steps]):
        e = rel(r["loss"], ref["losses"][s])
        worst = max(worst, e)
        if e > LOSS_RTOL:
            errs.append(f"step {s + 1}: loss {r['loss']} vs ref {ref['losses'][s]}")
        if rel(r["grad_norm"], ref["grad_norms"][s]) > GN_RTOL:
            errs.append(f"step {s + 1}: grad_norm {r['grad_norm']} vs ref {ref['grad_norms'][s]}")
    return worst


def qwen3_cfg(**kw):
    c = dict(vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, model_type="qwen3",
             rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1000000.0,
             use_sliding_window=True, sliding_window=5, max_window_layers=1)
    c.update(kw)
    return R.make_config(**c)


def case_qwen3_lora_window(root):
    work = os.path.join(root, "qwen3_lora")
    cfg = qwen3_cfg()
    model_dir, shard, tokens, weights = setup(work, cfg, 1200, seed=21)
    spec = R.lora_spec(cfg, r=4, alpha=8, targets=list(R.LORA_TARGETS), seed=21, b_std=0.1)
    adir = os.path.join(work, "adapter_in")
    R.save_adapter_dir(adir, spec)
    tc = R.train_config(sequence_len=20, micro_batch_size=2, gradient_accumulation_steps=2,
                        max_steps=3, learning_rate=5e-3, lr_scheduler="cosine", warmup_steps=1,
                        weight_decay=0.1, max_grad_norm=1.0)
    tc.update(base_model=model_dir, train_data=shard, adapter="lora", lora_r=4, lora_alpha=8,
              lora_dropout=0.0, lora_target_modules=list(R.LORA_TARGETS), lora_model_dir=adir)
    ref = R.train_reference(cfg, weights, tokens, tc, lora=spec)
    errs = []
    modes = {
        "plain": {},
        "recompute_streamed": {"gradient_checkpointing": "true", "gradient_checkpointing_every": 1,
                               "layer_offloading": True},
        "recompute2_disk": {"gradient_checkpointing": "true", "gradient_checkpointing_every": 2,
                            "activation_offloading": "disk", "min_offload_size": 0},
        "selective_offloaded": {"gradient_checkpointing": "selective",
                                "activation_offloading": "true", "min_offload_size": 0},
    }
    rows, out_dir = run_modes(work, tc, modes, "adapter_model.safetensors", errs)
    worst_l = ref_errors(rows, ref, 3, errs)
    out = R.read_safetensors(os.path.join(out_dir, "adapter_model.safetensors"))
    worst_w = 0.0
    for k, v in ref["adapter"].items():
        g = out.get(R.PEFT_PREFIX + k)
        if g is None:
            errs.append(f"adapter lacks {k}")
            continue
        d, ok = weight_diff(g, v)
        worst_w = max(worst_w, d)
        if not ok:
            errs.append(f"adapter {k}: max diff {d:.3e}")
    return errs, f"loss rel {worst_l:.1e}, adapter max diff {worst_w:.1e}, modes bit-identical"


def read_json(p):
    with open(p) as f:
        return json.load(f)


def write_back_one(root, name, cfg, expect):
    work = os.path.join(root, name)
    model_dir, shard, tokens, weights = setup(work, cfg, 600, seed=5)
    tc = R.train_config(sequence_len=12, micro_batch_size=1, max_steps=1, learning_rate=1e-3,
                        warmup_steps=0, lr_scheduler="constant")
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
    run(work, tc)
    out = tc["output_dir"]
    errs = []
    got = read_json(os.path.join(out, "config.json"))
    for k, v in expect.items():
        if got.get(k, "<absent>") != v:
            errs.append(f"{name}: config.json {k} = {got.get(k, '<absent>')!r}, expected {v!r}")
    names_in = set(R.read_safetensors(os.path.join(model_dir, "model.safetensors")))
    names_out = set(R.read_safetensors(os.path.join(out, "model.safetensors")))
    if names_in != names_out:
        errs.append(f"{name}: output tensors differ from the input's: "
                    f"{sorted(names_in ^ names_out)[:4]}")
    # Round trip: the output directory is a base the trainer (and the reference) read alike.
    t2 = dict(tc, base_model=out, output_dir=os.path.join(work, "out2"))
    run(work, t2, "again.yaml")
    rows = R.read_metrics(os.path.join(t2["output_dir"], "metrics.jsonl"))
    w2 = R.read_safetensors(os.path.join(out, "model.safetensors"))
    ref = R.batch_loss(got, w2, R.step_batches(tokens, 1, 12, 1, 1))
    if rel(rows[0]["loss"], ref) > LOSS_RTOL:
        errs.append(f"{name}: reloaded output's first loss {rows[0]['loss']} vs reference {ref} "
                    f"on the written config.json")
    return errs


def case_config_write_back(root):
    errs = []
    errs += write_back_one(root, "qwen3", qwen3_cfg(eos_token_id=[2, 7]), {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 16,
        "eos_token_id": [2, 7], "use_sliding_window": True, "sliding_window": 5,
        "max_window_layers": 1, "tie_word_embeddings": True, "attention_bias": False,
        "torch_dtype": "float32"})
    mis = R.make_config(model_type="mistral", num_key_value_heads=2)
    mis.pop("sliding_window", None)  # absent: transformers' MistralConfig default 4096
    errs += write_back_one(root, "mistral_default_window", mis, {
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": 4096,
        "eos_token_id": 2})
    errs += write_back_one(root, "mistral_null_window", R.make_config(
        model_type="mistral", sliding_window=None, eos_token_id=[2]), {
        "architectures": ["MistralForCausalLM"], "sliding_window": None, "eos_token_id": [2]})
    errs += write_back_one(root, "qwen2", R.make_config(
        model_type="qwen2", attention_bias=True, sliding_window=4, use_sliding_window=False,
        max_window_layers=1), {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "sliding_window": 4,
        "use_sliding_window": False, "max_window_layers": 1})
    errs += write_back_one(root, "llama_eos_list", R.make_config(eos_token_id=[2, 3, 5]), {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "eos_token_id": [2, 3, 5],
        "bos_token_id": 1})
    errs += write_back_one(root, "gemma2", gemma2_cfg(), {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 24, "sliding_window": 5,
        "attn_logit_softcapping": 0.8, "final_logit_softcapping": 1.5, "tie_word_embeddings": True,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "pad_token_id": 0,
        "sliding_window_pattern": "<absent>", "rope_local_base_freq": "<absent>"})
    errs += write_back_one(root, "gemma3", gemma3_cfg(), {
        "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "head_dim": 16,
        "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 16, "sliding_window": 5,
        "sliding_window_pattern": 2, "rope_local_base_freq": 10000.0, "tie_word_embeddings": True,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"], "pad_token_id": 0,
        "attn_logit_softcapping": None, "final_logit_softcapping": None})
    return errs, "qwen3, mistral (absent/null window), qwen2, llama, gemma2, gemma3_text"


def gemma3_cfg(**kw):
    c = dict(vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, model_type="gemma3_text",
             rms_norm_eps=1e-6, tie_word_embeddings=True, rope_theta=1000000.0, hidden_act="gelu_pytorch_tanh",
             hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=16, sliding_window=5,
             sliding_window_pattern=2, rope_local_base_freq=10000.0, pad_token_id=0)
    c.update(kw)
    return R.make_config(**c)


def gemma2_cfg(**kw):
    """Gemma 2 at test size: caps small enough that tanh bends this init's scores and logits,
    query_pre_attn_scalar 24 against head_dim 16 (the scale without a q-norm copy)."""
    c = dict(vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, model_type="gemma2",
             rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="gelu_pytorch_tanh",
             hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24, sliding_window=5,
             attn_logit_softcapping=0.8, final_logit_softcapping=1.5, pad_token_id=0)
    c.update(kw)
    return R.make_config(**c)


def gemma1_cfg(**kw):
    """Gemma 1 at test size (head_dim 16 against hidden 48 / 4 heads), its activation keys as the
    hub's configs have them: the legacy hidden_act "gelu" beside hidden_activation."""
    c = dict(vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, model_type="gemma",
             rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="gelu",
             hidden_activation="gelu_pytorch_tanh", pad_token_id=0)
    c.update(kw)
    return R.make_config(**c)


def case_gemma_modes(root):
    """Gemma 1 with exact GELU (the tanh one is Gemma 2/3's, above) in every memory mode."""
    return gemma_modes(os.path.join(root, "gemma_modes"), gemma1_cfg(hidden_activation="gelu"))


def case_gemma_gelu(root):
    """Gemma 1's two GELUs. The reference's logits against transformers 4.44.2's
    GemmaForCausalLM for each (4.44 reads hidden_activation); then the trainer's first loss
    against the reference for each way configs give the activation: the hub's keys that
    disagree (hidden_activation's tanh one is used, with a note), hidden_act "gelu" alone
    (exact, as 4.57 reads it, with a note), hidden_activation "gelu" (exact, no note), and
    Gemma 2 with both keys "gelu" (caps off: they would flatten the difference), and Axolotl's
    model_config setting hidden_activation "gelu" over the hub's keys; config.json written back with both keys naming the one used.
    Larger MLP weights than setup()'s and a tolerance 10x under LOSS_RTOL, so that the GELUs'
    difference moves the loss well past it (checked)."""
    GELU_RTOL = 1e-6
    import torch
    errs, notes = [], []
    cases = [("hub_keys", gemma1_cfg(), False, "disagree"),
             ("hidden_act_only", gemma1_cfg(hidden_activation=None), True, "without hidden_activation"),
             ("activation_gelu", gemma1_cfg(hidden_activation="gelu", hidden_act="gelu"), True, None),
             ("gemma2_gelu", gemma2_cfg(hidden_activation="gelu", hidden_act="gelu", attn_logit_softcapping=None,
                                        final_logit_softcapping=None), True, None)]
    for name, cfg, exact, note in cases:
        if cfg.get("hidden_activation") is None:
            cfg.pop("hidden_activation", None)
        work = os.path.join(root, "gelu_" + name)
        os.makedirs(work, exist_ok=True)
        weights = R.init_weights(cfg, seed=5, std=0.3, qk_std=0.25, embed_std=0.1)
        model_dir = os.path.join(work, "model")
        R.save_hf_dir(model_dir, cfg, weights)
        shard = os.path.join(work, "train.bin")
        R.write_shard(shard, R.random_tokens(600, cfg["vocab_size"], seed=5), version=1)
        tokens = R.read_shard(shard)
        if R.family(cfg)["gelu_exact"] != exact:
            errs.append(f"{name}: the reference reads exact={R.family(cfg)['gelu_exact']}, expected {exact}")
        tc = R.train_config(sequence_len=12, micro_batch_size=1, max_steps=1, learning_rate=1e-3,
                            warmup_steps=0, lr_scheduler="constant")
        tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
        p = run(work, tc)
        out = p.stdout.decode()
        loss = R.read_metrics(os.path.join(work, "out", "metrics.jsonl"))[0]["loss"]
        batches = R.step_batches(tokens, 1, 12, 1, 1)
        ref = R.batch_loss(cfg, weights, batches)
        other = "gelu_pytorch_tanh" if exact else "gelu"
        contrast = R.batch_loss(dict(cfg, hidden_activation=other, hidden_act=other), weights, batches)
        if rel(loss, ref) > GELU_RTOL:
            errs.append(f"{name}: loss {loss} vs reference {ref} ({rel(loss, ref):.1e})")
        if rel(contrast, ref) < 5 * GELU_RTOL:
            errs.append(f"{name}: the other GELU moves the loss only {rel(contrast, ref):.1e}: the test would not see it")
        said = [ln for ln in out.splitlines() if ln.startswith("note: ") and "hidden_act" in ln]
        if note is None and said:
            errs.append(f"{name}: a note about the activation keys where they agree: {said[0]!r}")
        if note and not any(note in ln for ln in said):
            errs.append(f"{name}: no note saying {note!r} about the activation keys")
        want_line = "GeGLU, exact GELU (erf)" if exact else "GeGLU, GELU tanh approximation"
        if want_line not in out:
            errs.append(f"{name}: the config box does not say {want_line!r}")
        got = read_json(os.path.join(work, "out", "config.json"))
        used = "gelu" if exact else "gelu_pytorch_tanh"
        if got.get("hidden_act") != used or got.get("hidden_activation") != used:
            errs.append(f"{name}: written back hidden_act {got.get('hidden_act')!r}, hidden_activation "
                        f"{got.get('hidden_activation')!r}; expected both {used!r}")
        if cfg["model_type"] == "gemma" and any(k in got for k in ("query_pre_attn_scalar", "layer_types",
                                                                    "attn_logit_softcapping")):
            errs.append(f"{name}: Gemma 2/3 keys written into a Gemma 1 config.json: {sorted(got)}")
        notes.append(f"{name} {rel(loss, ref):.1e} (other GELU {rel(contrast, ref):.1e})")
        if name == "hub_keys":  # Axolotl's model_config sets the key before the model is built
            tco = dict(tc, output_dir=os.path.join(work, "out_override"), model_config={"hidden_activation": "gelu"})
            run(work, tco, "override.yaml")
            lo = R.read_metrics(os.path.join(tco["output_dir"], "metrics.jsonl"))[0]["loss"]
            if rel(lo, contrast) > GELU_RTOL:
                errs.append(f"model_config hidden_activation gelu: loss {lo} vs the exact-GELU reference {contrast}")
        if name in ("hub_keys", "activation_gelu"):  # transformers 4.44.2 reads hidden_activation
            if not os.path.isfile(os.path.join(TF_DIR, "transformers", "__init__.py")):
                errs.append(f"transformers 4.44.2 is not in {TF_DIR}: run scripts/install_deps.sh")
                continue
            ids = [list(map(int, tokens[:12])), list(map(int, tokens[12:24]))]
            want = R.RefLlama(cfg, weights)(torch.tensor(ids)).detach().double().numpy()
            npy = os.path.join(work, "hf.npy")
            p = subprocess.run([sys.executable, "-c", HF_CHILD, model_dir, json.dumps(ids), npy],
                               env=dict(os.environ, PYTHONPATH=TF_DIR), capture_output=True, timeout=ARGS.timeout)
            if p.returncode != 0:
                errs.append("transformers could not run: " + p.stderr.decode("utf-8", "replace")[-400:])
                continue
            hd = float(np.abs(np.load(npy) - want).max() / np.abs(want).max())
            notes.append(f"vs transformers {hd:.1e}")
            if not hd <= 1e-5:
                errs.append(f"{name}: the reference's logits vs transformers 4.44.2's GemmaForCausalLM: {hd:.2e}")
    return errs, "; ".join(notes)


def case_gemma_refusals(root):
    bad = [
        ("hidden_act_silu", dict(hidden_act="silu", hidden_activation=None), "hidden_act"),
        ("activation_relu", dict(hidden_activation="relu"), "hidden_activation"),
    ]
    return refusals(os.path.join(root, "gemma_refusals"), gemma1_cfg, bad)


def case_gemma3_modes(root):
    return gemma_modes(os.path.join(root, "gemma3_modes"), gemma3_cfg())


def case_gemma2_modes(root):
    return gemma_modes(os.path.join(root, "gemma2_modes"), gemma2_cfg())


def gemma_modes(work, cfg):
    model_dir, shard, tokens, weights = setup(work, cfg, 1200, seed=23)
    tc = R.train_config(sequence_len=20, micro_batch_size=2, gradient_accumulation_steps=2,
                        max_steps=3, learning_rate=5e-3, lr_scheduler="cosine", warmup_steps=1,
                        weight_decay=0.1, max_grad_norm=1.0)
    tc.update(base_model=model_dir, train_data=shard, tiled_mlp_shards=3, min_offload_size=0)
    ref = R.train_reference(cfg, weights, tokens, tc)
    errs = []
    modes = {
        "plain": {},
        "recompute1_host": {"gradient_checkpointing": "true", "gradient_checkpointing_every": 1,
                            "activation_offloading": "true"},
        "recompute2_disk": {"gradient_checkpointing": "true", "gradient_checkpointing_every": 2,
                            "activation_offloading": "disk"},
        "selective_offloaded": {"gradient_checkpointing": "selective", "activation_offloading": "true"},
        "hidden_states": {"activation_offloading": "hidden_states"},
        "tiled_mlp_attention": {"tiled_mlp": "true", "tiled_attention": "true",
                                "gradient_checkpointing": "true"},
    }
    rows, out_dir = run_modes(work, tc, modes, "model.safetensors", errs)
    worst_l = ref_errors(rows, ref, 3, errs)
    out = R.read_safetensors(os.path.join(out_dir, "model.safetensors"))
    worst_w = 0.0
    for k, v in ref["weights"].items():
        d, ok = weight_diff(out[k], v)
        worst_w = max(worst_w, d)
        if not ok:
            errs.append(f"weight {k}: max diff {d:.3e}")
    # LoRA: recompute + layer streaming (frozen layers from host blocks) against the plain LoRA run.
    spec = R.lora_spec(cfg, r=4, alpha=8, targets=list(R.LORA_TARGETS), seed=23, b_std=0.1)
    adir = os.path.join(work, "adapter_in")
    R.save_adapter_dir(adir, spec)
    lora = dict(tc, adapter="lora", lora_r=4, lora_alpha=8, lora_dropout=0.0,
                lora_target_modules=list(R.LORA_TARGETS), lora_model_dir=adir)
    lref = R.train_reference(cfg, weights, tokens, lora, lora=spec)
    lmodes = {"plain": {}, "lora_streamed": {"gradient_checkpointing": "true", "layer_offloading": True}}
    lrows, _ = run_modes(os.path.join(work, "lora"), lora, lmodes, "adapter_model.safetensors", errs)
    ref_errors(lrows, lref, 3, errs)
    return errs, (f"loss rel {worst_l:.1e}, weight max diff {worst_w:.1e}, {len(modes) - 1} modes and LoRA "
                  f"streaming bit-identical")


def first_step(work, cfg, seed):
    """One step (T 12) from a random base of cfg: the trainer's first loss, the reference's,
    and the config.json written back (plus the tokens and weights, for contrasts)."""
    model_dir, shard, tokens, weights = setup(work, cfg, 600, seed=seed)
    tc = R.train_config(sequence_len=12, micro_batch_size=1, max_steps=1, learning_rate=1e-3,
                        warmup_steps=0, lr_scheduler="constant")
    tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
    run(work, tc)
    rows = R.read_metrics(os.path.join(work, "out", "metrics.jsonl"))
    ref = R.batch_loss(cfg, weights, R.step_batches(tokens, 1, 12, 1, 1))
    return rows[0]["loss"], ref, read_json(os.path.join(work, "out", "config.json")), tokens, weights


def case_gemma3_layer_types(root):
    """layer_types without sliding_window_pattern (as transformers >= 4.53 saves a Gemma 3
    config): the pattern is the list's; the first loss is the reference's for that pattern."""
    errs = []
    for pat in (2, 3):
        cfg = gemma3_cfg(num_hidden_layers=3, sliding_window=3)
        cfg.pop("sliding_window_pattern")
        cfg["layer_types"] = ["full_attention" if (i + 1) % pat == 0 else "sliding_attention" for i in range(3)]
        # the reference reads the pattern itself: the list is given to the trainer only
        loss, _, got, tokens, weights = first_step(os.path.join(root, "gemma3_lt%d" % pat), cfg, 9)
        ref = R.batch_loss(dict(cfg, sliding_window_pattern=pat), weights, R.step_batches(tokens, 1, 12, 1, 1))
        if rel(loss, ref) > LOSS_RTOL:
            errs.append(f"pattern {pat} from layer_types: loss {loss} vs reference {ref}")
        if got.get("sliding_window_pattern") != pat or got.get("layer_types") != cfg["layer_types"]:
            errs.append(f"pattern {pat}: written back as {got.get('sliding_window_pattern')} / {got.get('layer_types')}")
    return errs, "patterns 2 and 3 read from layer_types alone"


def case_gemma2_layer_types(root):
    """Gemma 2's sliding layers: layer_types' default (even layers) when absent, else the list
    (a period of 3 here); a list that is not periodic is refused. Each first loss is the
    reference's; config.json is written back with the list and the caps."""
    errs = []
    for name, lt in (("default", None), ("period3", ["sliding_attention", "sliding_attention", "full_attention"])):
        cfg = gemma2_cfg(num_hidden_layers=3, sliding_window=3)
        if lt:
            cfg["layer_types"] = lt
        loss, ref, got, tokens, weights = first_step(os.path.join(root, "gemma2_lt_" + name), cfg, 9)
        if rel(loss, ref) > LOSS_RTOL:
            errs.append(f"{name}: loss {loss} vs reference {ref}")
        want = lt or ["sliding_attention", "full_attention", "sliding_attention"]
        if got.get("layer_types") != want or "sliding_window_pattern" in got or "rope_local_base_freq" in got:
            errs.append(f"{name}: written back as layer_types {got.get('layer_types')}, keys {sorted(got)}")
    # Against its reference, a contrast: the same model with the caps off has another loss.
    nocap = R.batch_loss(dict(cfg, attn_logit_softcapping=None, final_logit_softcapping=None), weights,
                         R.step_batches(tokens, 1, 12, 1, 1))
    if rel(nocap, ref) < 1e-3:
        errs.append(f"the caps barely change the reference's loss ({nocap} vs {ref}): the test would not see them")
    return errs, "layer_types default and a period of 3, caps written back"


def case_gemma3_softcap(root):
    """Gemma 3 with soft-caps set (its configs leave them null; modeling_gemma3 applies them when
    set): the first loss against the reference, and both caps written back."""
    cfg = gemma3_cfg(attn_logit_softcapping=0.8, final_logit_softcapping=1.5)
    loss, ref, got, _, _ = first_step(os.path.join(root, "gemma3_softcap"), cfg, 4)
    errs = []
    if rel(loss, ref) > LOSS_RTOL:
        errs.append(f"loss {loss} vs reference {ref}")
    if got.get("attn_logit_softcapping") != 0.8 or got.get("final_logit_softcapping") != 1.5:
        errs.append(f"caps written back as {got.get('attn_logit_softcapping')} / {got.get('final_logit_softcapping')}")
    return errs, f"loss rel {rel(loss, ref):.1e}"


def case_gemma3_multimodal(root):
    """Gemma3ForConditionalGeneration (4B/12B/27B files): LoRA on its language model from either
    tensor layout against the reference on the text model, adapters named as PEFT names them on
    that model (model.language_model.layers...), read back as lora_model_dir; a full fine-tune and
    merge_lora refused."""
    work = os.path.join(root, "gemma3_mm")
    cfg = gemma3_cfg(rope_theta=1000000.0, rms_norm_eps=1e-6)
    weights = R.init_weights(cfg, seed=31, qk_std=0.25, embed_std=0.1)
    os.makedirs(work, exist_ok=True)
    shard = os.path.join(work, "train.bin")
    R.write_shard(shard, R.random_tokens(800, cfg["vocab_size"], seed=31), version=1)
    tokens = R.read_shard(shard)
    spec = R.lora_spec(cfg, r=4, alpha=8, targets=list(R.LORA_TARGETS), seed=31, b_std=0.1)
    adir = os.path.join(work, "adapter_in")
    R.save_adapter_dir(adir, dict(spec, weights={k.replace("model.layers.", "model.language_model.layers."): v
                                                for k, v in spec["weights"].items()}))
    errs, got = [], {}
    for layout in ("language_model.model.", "model.language_model."):
        base = os.path.join(work, "base_" + layout.replace(".", "_"))
        tcfg = R.save_hf_dir_gemma3_multimodal(base, cfg, weights, layout)
        tc = R.train_config(sequence_len=16, micro_batch_size=2, gradient_accumulation_steps=1, max_steps=2,
                            learning_rate=5e-3, lr_scheduler="constant", warmup_steps=0, max_grad_norm=1.0)
        tc.update(base_model=base, train_data=shard, adapter="lora", lora_r=4, lora_alpha=8, lora_dropout=0.0,
                  lora_target_modules=list(R.LORA_TARGETS), lora_model_dir=adir,
                  output_dir=os.path.join(work, "out_" + layout.replace(".", "_")))
        p = run(work, tc, "mm.yaml")
        if "vision tower is not loaded" not in p.stdout.decode():
            errs.append(f"{layout}: no note that the vision tower is not loaded")
        rows = R.read_metrics(os.path.join(tc["output_dir"], "metrics.jsonl"))
        apath = os.path.join(tc["output_dir"], "adapter_model.safetensors")
        got[layout] = ([(r["loss"], r["grad_norm"]) for r in rows], sha(apath))
        if layout.startswith("language_model"):
            ref = R.train_reference(tcfg, weights, tokens, tc, lora=spec)
            ref_errors(rows, ref, 2, errs)
            out = R.read_safetensors(apath)
            want = {R.PEFT_PREFIX + k.replace("model.layers.", "model.language_model.layers."): v
                    for k, v in ref["adapter"].items()}
            if set(out) != set(want):
                errs.append(f"adapter names {sorted(set(out) ^ set(want))[:3]} differ from PEFT's on the multimodal model")
            for k, v in want.items():
                if k in out and not weight_diff(out[k], v)[1]:
                    errs.append(f"adapter {k} differs from the reference's")
    if got["language_model.model."] != got["model.language_model."]:
        errs.append("the two tensor layouts give different losses or adapters")
    # merge_lora (from the hub layout): the merged model is the whole multimodal model.
    base = os.path.join(work, "base_language_model_model_")
    t = dict(tc, base_model=base, output_dir=os.path.join(work, "merge"), merge_lora=True)
    run(work, t, "merge.yaml")
    ref_adapter = R.train_reference(tcfg, weights, tokens, t, lora=spec)["adapter"]
    want = R.merge_lora(tcfg, weights, dict(spec, weights=ref_adapter))
    errs += mm_output_errors("merge_lora", os.path.join(work, "merge", "merged"), base, want)
    # A full fine-tune, its output the whole multimodal model too; resumed from checkpoint-1 it
    # ends with the same files.
    full = dict(tc, base_model=base, output_dir=os.path.join(work, "full"), save_steps=1)
    for k in ("adapter", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_model_dir"):
        full.pop(k)
    run(work, full, "full.yaml")
    fref = R.train_reference(tcfg, weights, tokens, full)
    ref_errors(R.read_metrics(os.path.join(work, "full", "metrics.jsonl")), fref, 2, errs)
    errs += mm_output_errors("full fine-tune", os.path.join(work, "full"), base, fref["weights"])
    res = dict(full, output_dir=os.path.join(work, "full_resumed"),
               resume_from_checkpoint=os.path.join(work, "full", "checkpoint-1"))
    run(work, res, "resumed.yaml")
    if sha(os.path.join(work, "full", "model.safetensors")) != sha(os.path.join(work, "full_resumed", "model.safetensors")):
        errs.append("full fine-tune resumed from checkpoint-1: model.safetensors differs from the unbroken run's")
    # An untied head (not Gemma 3's own choice, but what text_config can say): read from and
    # written back to language_model.lm_head.weight beside language_model.model.*.
    ucfg = dict(cfg, tie_word_embeddings=False)
    uweights = R.init_weights(ucfg, seed=33, qk_std=0.25, embed_std=0.1)
    ubase = os.path.join(work, "base_untied")
    utcfg = R.save_hf_dir_gemma3_multimodal(ubase, ucfg, uweights)
    ut = dict(full, base_model=ubase, output_dir=os.path.join(work, "full_untied"))
    ut.pop("save_steps")
    run(work, ut, "untied.yaml")
    uref = R.train_reference(utcfg, uweights, tokens, ut)
    ref_errors(R.read_metrics(os.path.join(work, "full_untied", "metrics.jsonl")), uref, 2, errs)
    errs += mm_output_errors("untied full fine-tune", os.path.join(work, "full_untied"), ubase, uref["weights"])
    # unfrozen_parameters name the multimodal model's parameters (Axolotl's Gemma 3 examples:
    # ^model.language_model.*): only layer 1 trains here.
    uf = dict(full, output_dir=os.path.join(work, "unfrozen"), unfrozen_parameters=["^model.language_model.layers.1.+"])
    uf.pop("save_steps")
    run(work, uf, "unfrozen.yaml")
    wu, wb = R.read_safetensors(os.path.join(work, "unfrozen", "model.safetensors")), R.read_safetensors(os.path.join(base, "model.safetensors"))
    moved = sorted(k for k in wb if not np.array_equal(wu[k], wb[k]))
    if not moved or any(not k.startswith("language_model.model.layers.1.") for k in moved):
        errs.append(f"unfrozen_parameters ^model.language_model.layers.1.+: changed {moved[:4]}")
    return errs, ("LoRA from both layouts against the reference with PEFT's names; merge_lora and a full fine-tune "
                  "(resumed too) save the whole multimodal model; unfrozen_parameters in its names")


def mm_output_errors(what, out, base, want):
    """A saved Gemma 3 multimodal model in out: the base's config.json keys around a text_config,
    the text tensors under language_model.model. against want (the reference's, 1e-4), every
    other tensor of the base byte for byte."""
    errs = []
    cin, cout = read_json(os.path.join(base, "config.json")), read_json(os.path.join(out, "config.json"))
    if cout.get("model_type") != "gemma3" or cout.get("vision_config") != cin["vision_config"] or \
            cout.get("text_config", {}).get("model_type") != "gemma3_text" or \
            cout.get("architectures") != ["Gemma3ForConditionalGeneration"]:
        errs.append(f"{what}: config.json is not the multimodal one: {sorted(cout)}")
    wout, win = R.read_safetensors(os.path.join(out, "model.safetensors")), R.read_safetensors(os.path.join(base, "model.safetensors"))
    if set(wout) != set(win):
        errs.append(f"{what}: tensors {sorted(set(wout) ^ set(win))[:4]} differ from the base's names")
    for k, v in win.items():
        if k.startswith("language_model.model.") or k == "language_model.lm_head.weight":
            w = want["model." + k[len("language_model.model."):]] if k.startswith("language_model.model.") \
                else want["lm_head.weight"]
            if not weight_diff(wout[k], w)[1]:
                errs.append(f"{what}: {k} differs from the reference's")
        elif k in wout and (wout[k].dtype != v.dtype or not np.array_equal(wout[k], v)):
            errs.append(f"{what}: {k} (not the text model's) changed")
    return errs


def case_gemma2_refusals(root):
    bad = [
        ("layer_types_not_periodic", dict(layer_types=["full_attention", "sliding_attention", "full_attention"]),
         "layer_types[1]"),
        ("softcap_negative", dict(attn_logit_softcapping=-1.0), "attn_logit_softcapping"),
        ("activation", dict(hidden_activation="relu"), "hidden_activation"),
    ]
    return refusals(os.path.join(root, "gemma2_refusals"), gemma2_cfg, bad)


def case_gemma3_refusals(root):
    bad = [
        ("softcap_zero", dict(final_logit_softcapping=0), "final_logit_softcapping"),
        ("attn_softcap_string", dict(attn_logit_softcapping="50"), "attn_logit_softcapping"),
        ("qpas", dict(query_pre_attn_scalar=0), "query_pre_attn_scalar"),
        ("activation", dict(hidden_activation="gelu_fast"), "hidden_activation"),
        ("hidden_act", dict(hidden_act="silu"), "hidden_act"),
        ("acts_disagree", dict(hidden_act="gelu"), "hidden_act"),
        ("bidirectional", dict(use_bidirectional_attention=True), "use_bidirectional_attention"),
        ("layer_types", dict(layer_types=["full_attention"] * 3), "layer_types[0]"),
        ("mm_no_text_config", dict(model_type="gemma3", architectures=["Gemma3ForConditionalGeneration"]), "text_config"),
    ]
    return refusals(os.path.join(root, "gemma3_refusals"), gemma3_cfg, bad)


def refusals(work, make_cfg, bad):
    """Each (name, config overrides, key) stops with a last line naming config.json and the key."""
    errs = []
    for name, over, want in bad:
        cfg = make_cfg(**{k: v for k, v in over.items() if k not in ("model_type", "architectures")})
        model_dir, shard, _, _ = setup(os.path.join(work, name), cfg, 300, seed=3)
        if "model_type" in over:  # written over the text model's config.json
            cj = os.path.join(model_dir, "config.json")
            with open(cj, "w") as f:
                json.dump(dict(cfg, model_type=over["model_type"], architectures=over["architectures"]), f)
        tc = R.train_config(sequence_len=8, micro_batch_size=1, max_steps=1)
        tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, name, "out"))
        path = os.path.join(work, name, "cfg.yaml")
        R.write_yaml(path, tc)
        p = subprocess.run([ARGS.bin, "-c", path], cwd=work, capture_output=True, text=True, timeout=ARGS.timeout)
        err = p.stderr.strip().splitlines()
        if p.returncode == 0 or not err or want not in err[-1] or "config.json" not in err[-1]:
            errs.append(f"{name}: exit {p.returncode}, last line {err[-1] if err else ''!r}, expected one naming "
                        f"config.json and {want!r}")
    return errs, f"{len(bad)} configs refused with the key named"


def case_qwen2_layer_types(root):
    cfg = R.make_config(model_type="qwen2", num_hidden_layers=3, use_sliding_window=True,
                        sliding_window=4, max_window_layers=2,
                        layer_types=["full_attention", "full_attention", "sliding_attention"])
    errs = write_back_one(root, "qwen2_layer_types", cfg, {
        "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2})
    return errs, "layer_types matching max_window_layers accepted"


# Logits of transformers 4.44.2's LlamaForCausalLM (its rope_utils yarn) for argv[2]'s ids from
# the model directory argv[1], into the .npy at argv[3].
HF_CHILD = r"""
import json, sys
import numpy as np, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32, attn_implementation="eager").eval()
with torch.no_grad():
    np.save(sys.argv[3], m(torch.tensor(json.loads(sys.argv[2]))).logits.double().numpy())
"""
TF_DIR = os.environ.get("LLMC_GPT2_TRANSFORMERS", "/opt/llmc-transformers-4.44.2")
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}


def case_yarn(root):
    """rope_scaling yarn (Qwen2.5's long-context setting; transformers 4.57's
    _compute_yarn_parameters): frequencies interpolated by factor below the beta_fast/beta_slow
    ramp, kept above it, cos/sin times 0.1 ln(factor) + 1 (or attention_factor / the mscale
    ratio). Llama GQA: the reference's logits against transformers 4.44.2's LlamaForCausalLM
    (original_max_position_embeddings = max_position_embeddings, where 4.44 and 4.57 agree);
    then for Llama and for Qwen2 with every optional key (beta_fast 16, beta_slow 2, truncate
    false, mscale / mscale_all_dim; no original_max_position_embeddings), first loss and one
    AdamW step against the reference, the rope_scaling written back as read, and a check that
    yarn moves the logits; Qwen2 at sequence_len 48 > max_position_embeddings 32 (raised, as
    Axolotl does, with yarn's original length written out)."""
    import torch
    errs, notes = [], []
    # Qwen2: every optional key but original_max_position_embeddings (max_position_embeddings then)
    qwen_rs = {"rope_type": "yarn", "factor": 4.0, "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False,
               "mscale": 0.8, "mscale_all_dim": 0.5}
    for name, kw in (("llama", dict(model_type="llama", rope_scaling=YARN)),
                     ("qwen2", dict(model_type="qwen2", attention_bias=True, rope_scaling=qwen_rs)),
                     ("llama_linear", dict(model_type="llama", rope_scaling={"rope_type": "linear", "factor": 2.5}))):
        work = os.path.join(root, "yarn_" + name)
        cfg = R.make_config(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                            rope_theta=100.0, **kw)
        model_dir, shard, tokens, weights = setup(work, cfg, 600, seed=9)
        ids = [list(map(int, tokens[:16])), list(map(int, tokens[16:32]))]
        want = R.RefLlama(cfg, weights)(torch.tensor(ids)).detach().double().numpy()
        plain = R.RefLlama(dict(cfg, rope_scaling=None), weights)(torch.tensor(ids)).detach().double().numpy()
        moved = float(np.abs(plain - want).max() / np.abs(want).max())
        if not moved > 1e-3:
            errs.append(f"{name}: yarn moves the logits only {moved:.1e}: the check would not see it")
        if name.startswith("llama"):
            if not os.path.isfile(os.path.join(TF_DIR, "transformers", "__init__.py")):
                errs.append(f"transformers 4.44.2 is not in {TF_DIR}: run scripts/install_deps.sh")
            else:
                npy = os.path.join(work, "hf.npy")
                p = subprocess.run([sys.executable, "-c", HF_CHILD, model_dir, json.dumps(ids), npy],
                                   env=dict(os.environ, PYTHONPATH=TF_DIR), capture_output=True,
                                   timeout=ARGS.timeout)
                if p.returncode != 0:
                    errs.append("transformers could not run: " + p.stderr.decode("utf-8", "replace")[-400:])
                else:
                    hd = float(np.abs(np.load(npy) - want).max() / np.abs(want).max())
                    notes.append(f"{name}: reference vs transformers {hd:.1e}")
                    if not hd <= 1e-5:
                        errs.append(f"{name}: the reference's logits vs transformers 4.44.2's: {hd:.2e} relative")
        tc = R.train_config(sequence_len=16, micro_batch_size=2, max_steps=1, learning_rate=1e-3, warmup_steps=0,
                            lr_scheduler="constant", weight_decay=0.1, max_grad_norm=0.0, adam_epsilon=1e-3)
        tc.update(base_model=model_dir, train_data=shard, output_dir=os.path.join(work, "out"))
        run(work, tc)
        ref = R.train_reference(cfg, weights, tokens, tc)
        row = [r for r in R.read_metrics(os.path.join(tc["output_dir"], "metrics.jsonl")) if "loss" in r][0]
        lr_ = rel(row["loss"], ref["losses"][0])
        if not lr_ <= LOSS_RTOL:
            errs.append(f"{name}: loss {row['loss']} vs reference {ref['losses'][0]} ({lr_:.1e})")
        got = R.read_safetensors(os.path.join(tc["output_dir"], "model.safetensors"))
        wd = max(float(np.max(np.abs(np.asarray(got[k], np.float64) - v))) for k, v in ref["weights"].items())
        if not wd <= 1e-5:
            errs.append(f"{name}: weights after one step differ from the reference by {wd:.1e}")
        rs = read_json(os.path.join(tc["output_dir"], "config.json")).get("rope_scaling")
        if rs != cfg["rope_scaling"]:
            errs.append(f"{name}: written rope_scaling {rs}, read {cfg['rope_scaling']}")
        if name == "llama":  # the same through Axolotl's YAML key on a model without rope_scaling
            plain_dir = os.path.join(work, "model_plain")
            R.save_hf_dir(plain_dir, dict(cfg, rope_scaling=None), weights)
            tc2 = dict(tc, base_model=plain_dir, output_dir=os.path.join(work, "out_yaml"), rope_scaling=YARN)
            run(work, tc2, "yaml.yaml")
            row2 = [r for r in R.read_metrics(os.path.join(tc2["output_dir"], "metrics.jsonl")) if "loss" in r][0]
            if row2["loss"] != row["loss"]:
                errs.append(f"YAML rope_scaling: loss {row2['loss']}, config.json's {row['loss']}")
            rs2 = read_json(os.path.join(tc2["output_dir"], "config.json")).get("rope_scaling")
            if rs2 != YARN:
                errs.append(f"YAML rope_scaling: written {rs2}, expected {YARN}")
        if name == "qwen2":  # sequence_len past max_position_embeddings (32): raised as Axolotl does
            tc3 = dict(tc, sequence_len=48, output_dir=os.path.join(work, "out_48"))
            p3 = run(work, tc3, "t48.yaml")
            ref3 = R.train_reference(cfg, weights, tokens, tc3)
            row3 = [r for r in R.read_metrics(os.path.join(tc3["output_dir"], "metrics.jsonl")) if "loss" in r][0]
            out_cfg = read_json(os.path.join(tc3["output_dir"], "config.json"))
            if rel(row3["loss"], ref3["losses"][0]) > LOSS_RTOL:
                errs.append(f"sequence_len 48 > 32: loss {row3['loss']} vs reference {ref3['losses'][0]}")
            # the length yarn was computed from is written out, so the output loads as trained
            want_rs = dict(cfg["rope_scaling"], original_max_position_embeddings=32)
            if out_cfg.get("max_position_embeddings") != 48 or out_cfg.get("rope_scaling") != want_rs:
                errs.append(f"sequence_len 48 > 32: written max_position_embeddings "
                            f"{out_cfg.get('max_position_embeddings')}, rope_scaling {out_cfg.get('rope_scaling')}")
            if "increasing max_position_embeddings from 32 to sequence_len 48" not in p3.stdout.decode():
                errs.append("sequence_len 48 > 32: no note saying max_position_embeddings was raised")
        notes.append(f"{name}: loss {lr_:.1e}, weights {wd:.1e}, yarn moves logits {moved:.1e}")
    return errs, "; ".join(notes)


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
    root = tempfile.mkdtemp(prefix="test_families_")
    cases = [("qwen3_lora_window", case_qwen3_lora_window),
             ("config_write_back", case_config_write_back),
             ("qwen2_layer_types", case_qwen2_layer_types), ("gemma3_modes", case_gemma3_modes),
             ("gemma3_layer_types", case_gemma3_layer_types), ("gemma3_multimodal", case_gemma3_multimodal),
             ("gemma3_refusals", case_gemma3_refusals), ("gemma2_modes", case_gemma2_modes),
             ("gemma2_layer_types", case_gemma2_layer_types), ("gemma2_refusals", case_gemma2_refusals),
             ("gemma3_softcap", case_gemma3_softcap), ("gemma_modes", case_gemma_modes),
             ("gemma_gelu", case_gemma_gelu), ("gemma_refusals", case_gemma_refusals),
             ("yarn", case_yarn)]
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
