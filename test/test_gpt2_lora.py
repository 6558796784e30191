#!/usr/bin/python3
"""LoRA on GPT-2 in train_gpt with PEFT's module names (issue 16), against peft 0.11.1 on
transformers' GPT2LMHeadModel.

    /usr/bin/python3 test/test_gpt2_lora.py --bin build/train_gpt

The torch side is transformers' GPT2LMHeadModel itself when this Python can build one
(scripts/install_deps.sh puts transformers 4.44.2, the last line that runs on Debian's torch
1.13, in /opt/llmc-transformers-4.44.2, which this test puts first on sys.path); otherwise a
float64 module tree named as GPT2LMHeadModel names it, whose c_attn/c_proj/c_fc are
transformers' own Conv1D class (so peft sees exactly what it sees in GPT-2: Conv1D modules,
fan_in_fan_out set true by peft, in/out features read from the [in, out] weight). The PASS
lines say which one ran. In both, peft's own inject_adapter_in_model decides which modules get
adapters and its lora.Linear computes them, in float64.

  here_to_peft_*   train_gpt trains a fresh adapter (2 steps, lora_dropout 0) from a YAML
                   selection, with merge_lora: true. adapter_config.json says fan_in_fan_out
                   true, peft_type LORA, base_model_name_or_path; peft reads it
                   (LoraConfig.from_pretrained), adapts exactly the modules the file holds
                   (same names and shapes: c_attn's lora_B is [3C, r]); with the adapter loaded,
                   peft's logits on a batch equal the logits of output_dir/merged/model.bin (the
                   merged llm.c checkpoint train_gpt wrote, run through test/gpt2_ref.py's
                   GPT-2) within 1e-5, peft's own merge (merge_and_unload: the Conv1D weight
                   plus the transposed B A, fan_in_fan_out) equals merged/model.bin's weights,
                   and train_gpt's loss with the adapter loaded (lora_model_dir) equals peft's.
  peft_to_here_*   peft makes an adapter (random A and B) on GPT2LMHeadModel for each
                   target_modules form (short names, a list of full paths, a regex string,
                   "all-linear"), saved as PeftModel saves it; train_gpt loads it (lora_model_dir)
                   and trains 2 steps (AdamW, clipping, weight decay): per-step losses (the
                   first one is the loaded adapter's) and the final adapter tensors match peft +
                   torch.optim.AdamW on the peft model within 1e-5.
  dropout_recompute  lora_dropout 0.1: gradient_checkpointing, activation_offloading
                   hidden_states and a tiled MLP give the plain run's losses and grad norms bit for bit (q, k and v share c_attn's one dropout mask, which
                   recompute regenerates).
  zero3_two_ranks  2 MPI ranks, ZeRO-3, lora_dropout 0.1 against one process (1e-5).
  resume           a run resumed from its step-2 checkpoint continues bit for bit.
  refused_*        what is not implemented or not GPT-2's: one error line naming it.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

TF_DIR = os.environ.get("LLMC_GPT2_TRANSFORMERS", "/opt/llmc-transformers-4.44.2")
if os.path.isdir(TF_DIR):
    sys.path.insert(0, TF_DIR)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt2_ref as G  # noqa: E402
import harness  # noqa: E402
import llama_ref as R  # noqa: E402

try:
    import peft  # noqa: E402
    import peft.tuners.tuners_utils as peft_tuners_utils  # noqa: E402
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict  # noqa: E402
    import transformers  # noqa: E402
    from transformers.pytorch_utils import Conv1D  # noqa: E402
except Exception as e:  # noqa: BLE001
    peft = None
    PEFT_ERR = f"{type(e).__name__}: {e}"

ARGS = None
TOL = 1e-5
R_, ALPHA = 2, 4
PREFIX = "base_model.model."
CFG = G.make_config(vocab_size=97, hidden_size=16, num_layers=2, num_heads=2, max_seq_len=32)
TC = dict(sequence_len=12, micro_batch_size=2, gradient_accumulation_steps=1, max_steps=2, learning_rate=2e-2,
          lr_scheduler="constant", warmup_steps=0, weight_decay=0.1, max_grad_norm=1.0)


# ---------------------------------------------------------------------------------------------
# GPT2LMHeadModel, or its module tree


def real_gpt2():
    """transformers' GPT2LMHeadModel class when this Python can build one, else None."""
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
        GPT2LMHeadModel(GPT2Config(vocab_size=8, n_positions=4, n_embd=4, n_layer=1, n_head=1))
        return GPT2Config, GPT2LMHeadModel
    except Exception:  # noqa: BLE001  (transformers without a usable torch)
        return None


class NewGELU(torch.nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Attn(torch.nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_attn = Conv1D(3 * C, C)
        self.c_proj = Conv1D(C, C)
        self.attn_dropout = torch.nn.Dropout(0.0)
        self.resid_dropout = torch.nn.Dropout(0.0)


class MLP(torch.nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = Conv1D(4 * C, C)
        self.c_proj = Conv1D(C, 4 * C)
        self.act = NewGELU()
        self.dropout = torch.nn.Dropout(0.0)


class Block(torch.nn.Module):
    def __init__(self, C):
        super().__init__()
        self.ln_1 = torch.nn.LayerNorm(C, eps=1e-5)
        self.attn = Attn(C)
        self.ln_2 = torch.nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C)


class Transformer(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg["channels"]
        self.wte = torch.nn.Embedding(cfg["vocab_size"], C)
        self.wpe = torch.nn.Embedding(cfg["max_seq_len"], C)
        self.drop = torch.nn.Dropout(0.0)
        self.h = torch.nn.ModuleList(Block(C) for _ in range(cfg["num_layers"]))
        self.ln_f = torch.nn.LayerNorm(C, eps=1e-5)


class TreeGPT2(torch.nn.Module):
    """GPT2LMHeadModel's modules and forward (eval mode), the head tied to wte."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.transformer = Transformer(cfg)
        self.lm_head = torch.nn.Linear(cfg["channels"], cfg["vocab_size"], bias=False)
        self.lm_head.weight = self.transformer.wte.weight

    def get_output_embeddings(self):
        return self.lm_head

    def forward(self, idx):
        B, T = idx.shape
        C, H = self.cfg["channels"], self.cfg["num_heads"]
        D = C // H
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(T))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for blk in t.h:
            q, k, v = blk.attn.c_attn(blk.ln_1(x)).split(C, dim=2)
            q, k, v = (a.view(B, T, H, D).transpose(1, 2) for a in (q, k, v))
            att = (q @ k.transpose(-1, -2)) / math.sqrt(D)
            y = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1) @ v
            x = x + blk.attn.c_proj(y.transpose(1, 2).reshape(B, T, C))
            x = x + blk.mlp.c_proj(blk.mlp.act(blk.mlp.c_fc(blk.ln_2(x))))
        return self.lm_head(t.ln_f(x))


def gpt2_model(w):
    """GPT2LMHeadModel (or its tree) holding llm.c-layout weights w, float64, eval mode."""
    sd = {k: torch.from_numpy(v) for k, v in G.hf_tensors(CFG, w).items()}
    real = real_gpt2()
    if real:
        GPT2Config, GPT2LMHeadModel = real
        model = GPT2LMHeadModel(GPT2Config(
            vocab_size=CFG["vocab_size"], n_positions=CFG["max_seq_len"], n_embd=CFG["channels"],
            n_layer=CFG["num_layers"], n_head=CFG["num_heads"], activation_function="gelu_new",
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5))
        res = model.load_state_dict(sd, strict=False)
        missing = [k for k in res.missing_keys if not k.endswith((".attn.bias", ".attn.masked_bias", "lm_head.weight"))]
        if missing or res.unexpected_keys:
            raise RuntimeError(f"GPT2LMHeadModel state dict: missing {missing}, unexpected {res.unexpected_keys}")
    else:
        model = TreeGPT2(CFG)
        model.load_state_dict(sd, strict=False)
    return model.double().eval()


def which_model():
    return (f"transformers {transformers.__version__} GPT2LMHeadModel" if real_gpt2()
            else f"GPT2LMHeadModel's module tree, Conv1D of transformers {transformers.__version__}")


def logits_of(model, idx):
    out = model(idx)
    return out.logits if hasattr(out, "logits") else out


def inject(lc, model):
    """peft's inject_adapter_in_model. "all-linear" is only for a PreTrainedModel in peft; the
    tree stands in for one there (peft's own function then lists the Conv1D modules)."""
    if isinstance(model, TreeGPT2):
        saved = peft_tuners_utils.PreTrainedModel
        peft_tuners_utils.PreTrainedModel = TreeGPT2
        try:
            return inject_adapter_in_model(lc, model)
        finally:
            peft_tuners_utils.PreTrainedModel = saved
    return inject_adapter_in_model(lc, model)


def lora_named(model):
    """{hf lora name: parameter} of a peft-injected model (adapter name 'default' dropped)."""
    return {n.replace(".default", ""): p for n, p in model.named_parameters() if "lora_" in n}


def adapted_modules(model):
    return sorted({n.rsplit(".lora_", 1)[0] for n in lora_named(model)})


def module(l, m):
    return f"transformer.h.{l}.{m}"


ALL = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


# ---------------------------------------------------------------------------------------------
# fixtures and runs


def base(root):
    work = os.path.join(root, "base")
    if not os.path.isdir(work):
        os.makedirs(work)
        w = G.init_weights(CFG, seed=5)
        G.save_hf_dir(os.path.join(work, "model"), CFG, w)
        R.write_shard(os.path.join(work, "train.bin"), R.random_tokens(600, CFG["vocab_size"], seed=5))
    w = G.init_weights(CFG, seed=5)
    return work, w, R.read_shard(os.path.join(work, "train.bin"))


def run(work, tc, name, binary=None):
    path = os.path.join(work, name + ".yaml")
    R.write_yaml(path, tc)
    env = dict(os.environ, LLMC_DEVICE="cpu", OMP_NUM_THREADS="1")
    p = subprocess.run([binary or ARGS.bin, "-c", path, "--set", "num_threads=1"], cwd=work, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def run_ok(work, tc, name):
    rc, out, err = run(work, tc, name)
    if rc:
        raise RuntimeError(f"train_gpt exit {rc}: {err[-500:]}")
    return R.read_metrics(os.path.join(tc["output_dir"], "metrics.jsonl")), out


def yaml_config(work, name, **kw):
    tc = R.train_config(**TC)
    tc.update(base_model=os.path.join(work, "model"), train_data=os.path.join(work, "train.bin"), adapter="lora",
              lora_r=R_, lora_alpha=ALPHA, lora_dropout=0.0, output_dir=os.path.join(work, name))
    tc.update(kw)
    return tc


def batch(tokens, step):
    (x, y), = R.step_batches(tokens, TC["micro_batch_size"], TC["sequence_len"], 1, step)
    return x, y


def loss_of(model, tokens, step):
    with torch.no_grad():
        x, y = batch(tokens, step)
        lg = logits_of(model, x)
        return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)).item()


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def shard_from(work, tokens, step, name):
    """A shard whose first batch is `step`'s batch of the sequential loader."""
    n = (step - 1) * TC["micro_batch_size"] * TC["sequence_len"]
    path = os.path.join(work, name + ".bin")
    R.write_shard(path, list(tokens[n:]))
    return path


# ---- here -> peft ----------------------------------------------------------------------------

def here_to_peft(root, name, sel, expect, written=None):
    work, w, tokens = base(root)
    out = os.path.join(work, "here_" + name)
    tc = yaml_config(work, "here_" + name, merge_lora=True, **sel)
    run_ok(work, tc, "here_" + name)
    errs = []
    conf = json.load(open(os.path.join(out, "adapter_config.json")))
    want_conf = dict(peft_type="LORA", task_type="CAUSAL_LM", fan_in_fan_out=True, r=R_, lora_alpha=ALPHA,
                     base_model_name_or_path=tc["base_model"], bias="none", use_dora=False)
    want_conf.update(written or {})
    for k, v in want_conf.items():
        got = conf.get(k)
        if (sorted(got) if isinstance(got, list) and k == "target_modules" else got) != \
                (sorted(v) if isinstance(v, list) and k == "target_modules" else v):
            errs.append(f"adapter_config.json {k} = {got!r}, expected {v!r}")
    lc = LoraConfig.from_pretrained(out)
    model = inject(lc, gpt2_model(w))
    model.double()
    want = sorted(module(l, m) for l, m in expect)
    if adapted_modules(model) != want:
        errs.append(f"peft adapted {adapted_modules(model)} from the written config, expected {want}")
    sd = {k[len(PREFIX):]: torch.from_numpy(v.astype(np.float64))
          for k, v in R.read_safetensors(os.path.join(out, "adapter_model.safetensors")).items()}
    named = lora_named(model)
    if sorted(sd) != sorted(named):
        errs.append(f"adapter file holds {sorted(sd)[:4]}..., peft has {sorted(named)[:4]}...")
    for k, p in named.items():
        if k in sd and tuple(sd[k].shape) != tuple(p.shape):
            errs.append(f"{k}: shape {tuple(sd[k].shape)} in the file, peft's {tuple(p.shape)}")
    if errs:
        return errs, ""
    res = set_peft_model_state_dict(model, sd)
    missing = [k for k in getattr(res, "missing_keys", []) if "lora_" in k]
    if getattr(res, "unexpected_keys", []) or missing:
        errs.append(f"peft load: unexpected {res.unexpected_keys[:3]}, missing {missing[:3]}")
    # peft's logits with the adapter against the merged llm.c checkpoint train_gpt wrote.
    x, y = batch(tokens, 3)
    with torch.no_grad():
        lg_peft = logits_of(model, x)
    mcfg, mw, _ = G.read_checkpoint(os.path.join(out, "merged", "model.bin"))
    with torch.no_grad():
        lg_merged = G.RefGPT2(mcfg, mw, dtype=torch.float64)(x)
    d_logits = float((lg_peft - lg_merged).abs().max())
    if d_logits > TOL:
        errs.append(f"logits: peft with the adapter vs merged/model.bin differ by {d_logits:.2e}")
    # peft's merge of the Conv1D weights (fan_in_fan_out: W + (B A)^T s) against merged/model.bin.
    for mod in model.modules():  # peft's lora.Linear.merge: W += transpose(B A, fan_in_fan_out) s
        if hasattr(mod, "merge") and hasattr(mod, "lora_A"):
            mod.merge()
    merged = {n.replace(".base_layer", ""): p for n, p in model.state_dict().items() if "lora_" not in n}
    got_w = G.hf_tensors(mcfg, mw)
    d_w = 0.0
    for n, v in got_w.items():
        if n.endswith(".weight") and ".h." in n:
            d_w = max(d_w, float(np.max(np.abs(v.astype(np.float64) - merged[n].detach().numpy()))))
    if d_w > TOL:
        errs.append(f"peft's merge differs from merged/model.bin by {d_w:.2e}")
    # train_gpt with the written adapter loaded: its first loss on step 3's batch.
    peft_loss = F.cross_entropy(lg_peft.reshape(-1, lg_peft.shape[-1]), y.reshape(-1)).item()
    t2 = dict(tc, lora_model_dir=out, max_steps=1, merge_lora=False, output_dir=os.path.join(work, "again_" + name),
              train_data=shard_from(work, tokens, 3, "skip_" + name))
    rows, _ = run_ok(work, t2, "again_" + name)
    e = rel(rows[0]["loss"], peft_loss)
    if e > TOL:
        errs.append(f"loss with the adapter: train_gpt {rows[0]['loss']} vs peft {peft_loss}")
    if rel(loss_of(gpt2_model(w), tokens, 3), peft_loss) < 1e-6:
        errs.append("the trained adapter does not change the loss (the check cannot fail)")
    return errs, (f"{which_model()}; {len(want)} modules; logits max diff {d_logits:.1e}, merged weights "
                  f"{d_w:.1e}, loss rel {e:.1e}; target_modules written {conf['target_modules']!r}")


# ---- peft -> here ----------------------------------------------------------------------------

def torch_train(model, tokens):
    """TC's steps on the peft model with torch.optim.AdamW (decay on A and B, as HF Trainer)."""
    named = lora_named(model)
    params = list(named.values())
    opt = torch.optim.AdamW(params, lr=TC["learning_rate"], betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=TC["weight_decay"])
    B, T = TC["micro_batch_size"], TC["sequence_len"]
    loader = R.DataLoader(tokens, B, T)
    losses = []

    def fwd(x):
        return logits_of(model, x)
    for _ in range(TC["max_steps"]):
        opt.zero_grad(set_to_none=True)
        losses.append(R.accumulate_loss(fwd, loader, B * T, 1))
        R.grad_norm_clip(params, TC["max_grad_norm"])
        opt.step()
    return losses, {k: p.detach().numpy().copy() for k, p in named.items()}


def peft_to_here(root, name, peft_tm, yaml_sel, expect):
    work, w, tokens = base(root)
    torch.manual_seed(11)
    lc = LoraConfig(r=R_, lora_alpha=ALPHA, lora_dropout=0.0, init_lora_weights=False, target_modules=peft_tm)
    model = inject(lc, gpt2_model(w))
    model.double()
    errs = []
    want = sorted(module(l, m) for l, m in expect)
    if adapted_modules(model) != want:
        errs.append(f"peft adapted {adapted_modules(model)}, the case expects {want}")
    if not lc.fan_in_fan_out:
        errs.append("peft did not set fan_in_fan_out for the Conv1D modules")
    adir = os.path.join(work, "peft_" + name)
    os.makedirs(adir, exist_ok=True)
    lc.save_pretrained(adir)  # adapter_config.json as PeftModel.save_pretrained writes it
    R.write_safetensors(os.path.join(adir, "adapter_model.safetensors"),
                        {PREFIX + k: p.detach().numpy().astype(np.float32) for k, p in lora_named(model).items()},
                        metadata={"format": "pt"})
    shapes = {k: tuple(p.shape) for k, p in lora_named(model).items()}
    with torch.no_grad():  # the reference trains from the float32 values the file holds
        for p in lora_named(model).values():
            p.copy_(p.float().double())
    ref_losses, ref_w = torch_train(model, tokens)
    tc = yaml_config(work, "out_" + name, lora_model_dir=adir, **yaml_sel)
    rows, _ = run_ok(work, tc, name)
    worst_l = max((rel(r["loss"], ref_losses[s]) for s, r in enumerate(rows)), default=1.0)
    if worst_l > TOL or len(rows) != len(ref_losses):
        errs.append(f"losses {[r['loss'] for r in rows]} vs peft {ref_losses}")
    out = R.read_safetensors(os.path.join(tc["output_dir"], "adapter_model.safetensors"))
    worst_w = 0.0
    if sorted(k[len(PREFIX):] for k in out) != sorted(ref_w):
        errs.append(f"adapter tensors {sorted(out)[:4]}... differ from peft's {sorted(ref_w)[:4]}...")
    else:
        for k, v in ref_w.items():
            worst_w = max(worst_w, float(np.max(np.abs(out[PREFIX + k].astype(np.float64) - v))))
        if worst_w > TOL:
            errs.append(f"adapter max diff {worst_w:.2e} after {TC['max_steps']} steps")
    c_attn_b = next((v for k, v in sorted(shapes.items()) if k.endswith("c_attn.lora_B.weight")), None)
    return errs, (f"{which_model()}; {len(want)} modules (c_attn lora_B {c_attn_b}); losses rel "
                  f"{worst_l:.1e}, adapter max diff {worst_w:.1e} after {TC['max_steps']} AdamW steps")


# ---- memory modes with dropout ---------------------------------------------------------------

def dropout_recompute(root):
    work, w, tokens = base(root)
    # Every run chunks the MLP rows alike (tiled_mlp_shards), so tiling changes no bit.
    sel = dict(lora_target_modules=["c_attn", "c_proj", "c_fc"], lora_dropout=0.1, max_steps=3, tiled_mlp_shards=3)
    runs = {}
    for name, extra in (("plain", {}), ("ckpt", dict(gradient_checkpointing=True)),
                        ("hidden", dict(activation_offloading="hidden_states")), ("tiled", dict(tiled_mlp=True))):
        rows, _ = run_ok(work, yaml_config(work, "drop_" + name, **sel, **extra), "drop_" + name)
        runs[name] = [(r["loss"], r.get("grad_norm")) for r in rows]
    errs = [f"{k}: {v} vs plain {runs['plain']}" for k, v in runs.items() if v != runs["plain"]]
    nodrop, _ = run_ok(work, yaml_config(work, "drop_none", **dict(sel, lora_dropout=0.0)), "drop_none")
    if [r["loss"] for r in nodrop][1:] == [l for l, _ in runs["plain"]][1:]:
        errs.append("dropout 0.1 changes nothing (the check cannot fail)")
    return errs, f"losses {[round(l, 6) for l, _ in runs['plain']]} and grad norms bit-identical in 4 modes"


# ---- resume -----------------------------------------------------------------------------------

def resume(root):
    """A GPT-2 adapter run resumed from its step-2 checkpoint (PEFT-named adapter + AdamW state)
    continues bit for bit."""
    work, w, tokens = base(root)
    sel = dict(lora_target_modules=["c_attn", "mlp.c_proj"], max_steps=4, save_steps=2)
    full, _ = run_ok(work, yaml_config(work, "res_full", **sel), "res_full")
    ck = os.path.join(work, "res_full", "checkpoint-2")
    tc = yaml_config(work, "res_part", resume_from_checkpoint=ck, **sel)
    part, _ = run_ok(work, tc, "res_part")
    errs = []
    if [r["loss"] for r in part][-2:] != [r["loss"] for r in full][-2:]:
        errs.append(f"losses after resume {[r['loss'] for r in part]} vs {[r['loss'] for r in full]}")
    a = R.read_safetensors(os.path.join(work, "res_full", "adapter_model.safetensors"))
    b = R.read_safetensors(os.path.join(work, "res_part", "adapter_model.safetensors"))
    if sorted(a) != sorted(b) or any(not np.array_equal(a[k], b[k]) for k in a):
        errs.append("final adapters differ")
    return errs, f"steps 3-4 losses {[r['loss'] for r in full][-2:]} and the adapter bit-identical"


# ---- ZeRO-3 over two ranks -----------------------------------------------------------------------

def zero3_two_ranks(root):
    """2 MPI ranks with ZeRO-3 (adapters sharded by layer unit, c_attn's B split across ranks'
    pieces) and lora_dropout (masks follow global rows) against one process with both ranks' rows."""
    if not shutil.which("mpirun"):
        return [], "SKIP: no mpirun"
    work, w, tokens = base(root)
    sel = dict(lora_target_modules=["c_attn", "c_proj", "c_fc"], lora_dropout=0.1, max_steps=3)
    one, _ = run_ok(work, yaml_config(work, "z_one", **dict(sel, micro_batch_size=4)), "z_one")
    tc = yaml_config(work, "z_two", zero_stage=3, **sel)
    path = os.path.join(work, "z_two.yaml")
    R.write_yaml(path, tc)
    env = dict(os.environ, LLMC_DEVICE="cpu", OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    p = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", ARGS.bin, "-c", path,
                        "--set", "num_threads=1"], cwd=work, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=180)
    if p.returncode:
        return [f"mpirun exit {p.returncode}: {p.stderr.decode()[-400:]}"], ""
    two = R.read_metrics(os.path.join(tc["output_dir"], "metrics.jsonl"))
    worst_l = max(rel(a["loss"], b["loss"]) for a, b in zip(two, one))
    a = R.read_safetensors(os.path.join(work, "z_one", "adapter_model.safetensors"))
    b = R.read_safetensors(os.path.join(work, "z_two", "adapter_model.safetensors"))
    errs = []
    if len(two) != len(one) or worst_l > TOL:
        errs.append(f"losses {[r['loss'] for r in two]} vs one process {[r['loss'] for r in one]}")
    if sorted(a) != sorted(b):
        return errs + ["adapter tensors differ"], ""
    worst_w = max(float(np.max(np.abs(a[k].astype(np.float64) - b[k]))) for k in a)
    if worst_w > TOL:
        errs.append(f"adapter max diff {worst_w:.2e}")
    return errs, f"losses rel {worst_l:.1e}, adapter max diff {worst_w:.1e} after 3 steps"


# ---- refused ---------------------------------------------------------------------------------

def refused(root, name, sel, word, adapter_edit=None, binary=None, drop=None):
    work, w, tokens = base(root)
    tc = yaml_config(work, "bad_" + name, max_steps=1, **sel)
    if adapter_edit is not None or drop:
        src = os.path.join(work, "here_short")
        d = os.path.join(work, "badad_" + name)
        shutil.copytree(src, d)
        p = os.path.join(d, "adapter_config.json")
        c = json.load(open(p))
        c.update(adapter_edit or {})
        json.dump(c, open(p, "w"))
        if drop:
            st = os.path.join(d, "adapter_model.safetensors")
            t = R.read_safetensors(st)
            t = {k: (v[:drop[1]] if k.endswith(drop[0]) else v) for k, v in t.items()}
            R.write_safetensors(st, t, metadata={"format": "pt"})
        tc["lora_model_dir"] = d
    rc, out, err = run(work, tc, "bad_" + name, binary=binary)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    ok = rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and word in lines[0]
    return ([] if ok else [f"exit {rc}, stderr {err[-400:]!r}, expected one error line naming {word!r}"]), \
        lines[0] if lines else ""


def fan_in_fan_out_false(root):
    """lora_fan_in_fan_out: false on GPT-2: peft sets it true for Conv1D with a warning; here a note."""
    work, w, tokens = base(root)
    tc = yaml_config(work, "fiffo", lora_target_modules=["c_attn"], lora_fan_in_fan_out=False)
    rows, out = run_ok(work, tc, "fiffo")
    errs = [] if "note: lora_fan_in_fan_out: false" in out else [f"no note in {out[-300:]!r}"]
    conf = json.load(open(os.path.join(tc["output_dir"], "adapter_config.json")))
    if conf.get("fan_in_fan_out") is not True:
        errs.append(f"fan_in_fan_out written {conf.get('fan_in_fan_out')!r}")
    tc2 = yaml_config(work, "fiffo_t", lora_target_modules=["c_attn"], lora_fan_in_fan_out=True)
    rows2, _ = run_ok(work, tc2, "fiffo_t")
    if [r["loss"] for r in rows2] != [r["loss"] for r in rows]:
        errs.append(f"true and false differ: {[r['loss'] for r in rows2]} vs {[r['loss'] for r in rows]}")
    return errs, "false: a note, the same run as true"


def cases(root):
    short = ["c_attn", "c_proj", "c_fc"]
    every = [(l, m) for l in range(CFG["num_layers"]) for m in ALL]
    yield "here_to_peft_short", lambda: here_to_peft(
        root, "short", dict(lora_target_modules=short), every, written=dict(target_modules=short))
    yield "here_to_peft_attn_c_proj_only", lambda: here_to_peft(
        root, "attn_proj", dict(lora_target_modules=["attn.c_proj", "c_fc"]),
        [(l, m) for l in range(2) for m in ("attn.c_proj", "mlp.c_fc")],
        written=dict(target_modules=["attn.c_proj", "c_fc"]))
    yield "here_to_peft_full_paths", lambda: here_to_peft(
        root, "full", dict(lora_target_modules=["transformer.h.0.attn.c_attn", "transformer.h.1.mlp.c_proj"]),
        [(0, "attn.c_attn"), (1, "mlp.c_proj")],
        written=dict(target_modules=["transformer.h.0.attn.c_attn", "transformer.h.1.mlp.c_proj"]))
    yield "here_to_peft_layers", lambda: here_to_peft(
        root, "layers", dict(lora_target_modules=["c_attn", "c_fc"], peft_layers_to_transform=[1]),
        [(1, "attn.c_attn"), (1, "mlp.c_fc")],
        written=dict(target_modules=["c_attn", "c_fc"], layers_to_transform=[1], layers_pattern="h"))

    yield "peft_to_here_short_names", lambda: peft_to_here(
        root, "short", ["c_attn", "c_proj", "c_fc"], dict(lora_target_modules=short), every)
    full = ["transformer.h.0.attn.c_attn", "transformer.h.0.mlp.c_fc", "transformer.h.1.attn.c_proj",
            "transformer.h.1.mlp.c_proj"]
    yield "peft_to_here_full_paths", lambda: peft_to_here(
        root, "full", full, dict(lora_target_modules=full),
        [(0, "attn.c_attn"), (0, "mlp.c_fc"), (1, "attn.c_proj"), (1, "mlp.c_proj")])
    rx = r".*\.h\.1\.(attn\.c_attn|mlp\.c_\w+)"
    yield "peft_to_here_regex", lambda: peft_to_here(
        root, "regex", rx, dict(lora_target_modules=rx), [(1, "attn.c_attn"), (1, "mlp.c_fc"), (1, "mlp.c_proj")])
    yield "peft_to_here_all_linear", lambda: peft_to_here(
        root, "all_linear", "all-linear", dict(lora_target_modules="all-linear"), every)

    yield "dropout_recompute", lambda: dropout_recompute(root)
    yield "fan_in_fan_out_false_note", lambda: fan_in_fan_out_false(root)
    yield "resume", lambda: resume(root)
    yield "zero3_two_ranks", lambda: zero3_two_ranks(root)

    llama = os.path.join(os.path.dirname(ARGS.bin), "train_llama")
    bad = {
        "llama_names": (dict(lora_target_modules=["q_proj", "v_proj"]), "unknown module 'q_proj'"),
        "lm_head": (dict(lora_target_modules=["c_attn", "lm_head"]), "'lm_head'"),
        "wte": (dict(lora_target_modules=["wte"]), "'transformer.wte'"),
        "regex_norm": (dict(lora_target_modules=r".*\.h\.0\.ln_1"), "transformer.h.0.ln_1"),
        "regex_attn": (dict(lora_target_modules=r".*\.attn"), "transformer.h.0.attn"),
        "dora": (dict(lora_target_modules=["c_attn"], peft_use_dora=True), "peft_use_dora"),
        "modules_to_save": (dict(lora_target_modules=["c_attn"], lora_modules_to_save=["wte"]), "lora_modules_to_save"),
        "adapter_use_dora": (dict(lora_target_modules=["c_attn", "c_proj", "c_fc"]), "use_dora", dict(use_dora=True)),
        "adapter_other_modules": (dict(lora_target_modules=["c_attn", "c_proj", "c_fc"]), "vs c_attn",
                                  dict(target_modules=["c_proj", "c_fc"])),
        "adapter_embedding": (dict(lora_target_modules=["c_attn", "c_proj", "c_fc"]), "'transformer.wte'",
                              dict(target_modules=["c_attn", "c_proj", "c_fc", "wte"])),
        "adapter_modules_to_save": (dict(lora_target_modules=["c_attn", "c_proj", "c_fc"]), "modules_to_save",
                                    dict(modules_to_save=["lm_head"])),
        "adapter_split_qkv_B": (dict(lora_target_modules=["c_attn", "c_proj", "c_fc"]), "c_attn.lora_B.weight",
                                None, ("attn.c_attn.lora_B.weight", CFG["channels"])),
    }
    for name, spec in bad.items():
        yield "refused_" + name, (lambda s=spec, n=name: refused(
            root, n, s[0], s[1], adapter_edit=s[2] if len(s) > 2 else None, drop=s[3] if len(s) > 3 else None))
    yield "refused_llama_fan_in_fan_out", lambda: refused(
        root, "llama_fiffo", dict(lora_target_modules=["q_proj"], lora_fan_in_fan_out=True), "lora_fan_in_fan_out",
        binary=llama)


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="./train_gpt")
    ap.add_argument("--only", default="")
    ap.add_argument("--keep", action="store_true")
    ARGS = ap.parse_args()
    ARGS.bin = os.path.abspath(ARGS.bin)
    if peft is None:
        print(f"FAIL peft_import: peft is not importable ({PEFT_ERR}); run scripts/install_deps.sh")
        return 1
    if peft.__version__ != "0.11.1":
        print(f"note: peft {peft.__version__}; these checks were written against peft 0.11.1")
    print(f"torch side: {which_model()}, peft {peft.__version__}")
    root = tempfile.mkdtemp(prefix="test_gpt2_lora_")
    try:
        passed, failed = harness.run_cases(cases(root), ARGS.only, verbose=True)
    finally:
        if ARGS.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
