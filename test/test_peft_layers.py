#!/usr/bin/python3
"""Per-layer LoRA targeting against peft itself (issue 13): layers_to_transform (a list, an
int, with layers_pattern), full module paths and regexes that select some layers' projections,
both ways, with peft 0.11.1 (scripts/install_deps.sh installs it).

    /usr/bin/python3 test/test_peft_layers.py --bin build/train_llama

The torch side is a float64 Llama module tree named as transformers names it
(model.layers.N.self_attn.q_proj, ...: every module PEFT walks, nn.Linear projections), so that
peft's own inject_adapter_in_model decides which projections get adapters and its lora.Linear
computes them; the block equations are those of test/llama_ref.py.

  peft_to_here_*   peft makes an adapter (random A and B) with a LoraConfig using that form;
                   saved as PeftModel saves it (adapter_config.json from LoraConfig, tensors
                   base_model.model.<name>.lora_A/B.weight); the trainer loads it (lora_model_dir,
                   run config with the same selection) and trains 2 steps: per-step losses
                   (1e-5 rel) and the final adapter tensors (1e-5) match peft + torch.optim.AdamW
                   on the peft model, and the adapter file holds exactly peft's tensors.
  here_to_peft_*   the trainer trains a fresh adapter from a YAML selection (Axolotl's
                   lora_target_modules / peft_layers_to_transform / peft_layers_pattern,
                   lora_target_linear); peft reads the written adapter_config.json
                   (LoraConfig.from_pretrained), adapts exactly the projections the file holds
                   (no missing, no unexpected tensors), and its loss on the next batch equals
                   the trainer's loss with that adapter loaded (1e-5 rel), and the expected
                   layers/projections are the adapted ones.
  refused_*        selections peft refuses or this trainer cannot load: one error line.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import llama_ref as R  # noqa: E402

try:
    import peft  # noqa: E402
    from peft import LoraConfig, inject_adapter_in_model, set_peft_model_state_dict  # noqa: E402
except Exception as e:  # noqa: BLE001
    peft = None
    PEFT_ERR = f"{type(e).__name__}: {e}"

ARGS = None
LOSS_RTOL = 1e-5
W_TOL = 1e-5
R_, ALPHA = 2, 4


# ---------------------------------------------------------------------------------------------
# a Llama named as transformers names it


class RMSNorm(torch.nn.Module):
    def __init__(self, w, eps):
        super().__init__()
        self.weight = torch.nn.Parameter(w, requires_grad=False)
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def linear(w):
    m = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    m.weight = torch.nn.Parameter(w, requires_grad=False)
    return m


class Attn(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, n, linear(p(f"self_attn.{n}.weight")))


class MLP(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        for n in ("gate_proj", "up_proj", "down_proj"):
            setattr(self, n, linear(p(f"mlp.{n}.weight")))
        self.act_fn = torch.nn.SiLU()


class Layer(torch.nn.Module):
    def __init__(self, p, eps):
        super().__init__()
        self.self_attn = Attn(p)
        self.mlp = MLP(p)
        self.input_layernorm = RMSNorm(p("input_layernorm.weight"), eps)
        self.post_attention_layernorm = RMSNorm(p("post_attention_layernorm.weight"), eps)


class Inner(torch.nn.Module):
    def __init__(self, cfg, w):
        super().__init__()
        t = lambda k: torch.from_numpy(np.asarray(w[k], dtype=np.float64).copy())  # noqa: E731
        eps = float(cfg["rms_norm_eps"])
        self.embed_tokens = torch.nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.embed_tokens.weight = torch.nn.Parameter(t("model.embed_tokens.weight"), requires_grad=False)
        self.layers = torch.nn.ModuleList(
            Layer(lambda k, i=i: t(f"model.layers.{i}.{k}"), eps) for i in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(t("model.norm.weight"), eps)


class HFLlama(torch.nn.Module):
    """LlamaForCausalLM's module names; untied head; float64."""

    def __init__(self, cfg, w):
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg, w)
        self.lm_head = linear(torch.from_numpy(np.asarray(w["lm_head.weight"], dtype=np.float64).copy()))
        self.inv_freq = R.rope_inv_freq(cfg).to(torch.float64)

    def forward(self, idx):
        C, Hq, Hkv, D = R._dims(self.cfg)
        B, T = idx.shape
        x = self.model.embed_tokens(idx)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * self.inv_freq[None, :]
        ang = torch.cat((ang, ang), dim=-1)
        cos, sin = ang.cos(), ang.sin()
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        for lay in self.model.layers:
            a = lay.self_attn
            h = lay.input_layernorm(x)
            q = a.q_proj(h).view(B, T, Hq, D).transpose(1, 2)
            k = a.k_proj(h).view(B, T, Hkv, D).transpose(1, 2)
            v = a.v_proj(h).view(B, T, Hkv, D).transpose(1, 2)
            q = q * cos + R._rotate_half(q) * sin
            k = k * cos + R._rotate_half(k) * sin
            k = k.repeat_interleave(Hq // Hkv, dim=1)
            v = v.repeat_interleave(Hq // Hkv, dim=1)
            att = (q @ k.transpose(-1, -2)) / D ** 0.5
            y = torch.softmax(att.masked_fill(~mask, float("-inf")), dim=-1) @ v
            x = x + a.o_proj(y.transpose(1, 2).reshape(B, T, Hq * D))
            h = lay.post_attention_layernorm(x)
            m = lay.mlp
            x = x + m.down_proj(m.act_fn(m.gate_proj(h)) * m.up_proj(h))
        return self.lm_head(self.model.norm(x))


def lora_named(model):
    """{hf lora name: parameter} of a peft-injected model (adapter name 'default' dropped)."""
    return {n.replace(".default", ""): p for n, p in model.named_parameters() if "lora_" in n}


# ---------------------------------------------------------------------------------------------

CFG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
           num_key_value_heads=2, tie_word_embeddings=False)
TC = dict(sequence_len=12, micro_batch_size=2, gradient_accumulation_steps=1, max_steps=2, learning_rate=2e-2,
          lr_scheduler="constant", warmup_steps=0, weight_decay=0.1, max_grad_norm=1.0)


def run(work, tc, name):
    path = os.path.join(work, name + ".yaml")
    R.write_yaml(path, tc)
    cmd = [ARGS.bin, "-c", path, "--set", "num_threads=1"]
    p = subprocess.run(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=120)
    return p.returncode, p.stderr.decode()


def run_ok(work, tc, name):
    rc, err = run(work, tc, name)
    if rc:
        raise RuntimeError(f"trainer exit {rc}: {err[-500:]}")
    return R.read_metrics(os.path.join(tc["output_dir"], "metrics.jsonl"))


def base(root):
    work = os.path.join(root, "base")
    if not os.path.isdir(work):
        os.makedirs(work)
        cfg = R.make_config(**CFG)
        w = R.init_weights(cfg, seed=3, qk_std=0.25)
        R.save_hf_dir(os.path.join(work, "model"), cfg, w)
        R.write_shard(os.path.join(work, "train.bin"), R.random_tokens(800, cfg["vocab_size"], seed=3))
    cfg = json.load(open(os.path.join(work, "model", "config.json")))
    w = R.read_safetensors(os.path.join(work, "model", "model.safetensors"))
    tokens = R.read_shard(os.path.join(work, "train.bin"))
    return work, cfg, w, tokens


def torch_train(model, tokens, tc):
    """tc's steps on the peft model with torch.optim.AdamW (HF Trainer's decay rule)."""
    named = lora_named(model)
    params = list(named.values())
    opt = torch.optim.AdamW(params, lr=tc["learning_rate"], betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=tc["weight_decay"])
    B, T = tc["micro_batch_size"], tc["sequence_len"]
    loader = R.DataLoader(tokens, B, T)
    losses = []
    for _ in range(tc["max_steps"]):
        opt.zero_grad(set_to_none=True)
        losses.append(R.accumulate_loss(model, loader, B * T, 1))
        R.grad_norm_clip(params, tc["max_grad_norm"])
        opt.step()
    return losses, {k: p.detach().numpy().copy() for k, p in named.items()}


def loss_of(model, tokens, tc, step):
    with torch.no_grad():
        (x, y), = R.step_batches(tokens, tc["micro_batch_size"], tc["sequence_len"], 1, step)
        lg = model(x)
        return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)).item()


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


# ---- peft -> here ----------------------------------------------------------------------------

def peft_to_here(root, name, peft_kw, yaml_sel, expect):
    work, cfg, w, tokens = base(root)
    torch.manual_seed(11)
    model = HFLlama(cfg, w)
    lc = LoraConfig(r=R_, lora_alpha=ALPHA, lora_dropout=0.0, init_lora_weights=False, **peft_kw)
    model = inject_adapter_in_model(lc, model)
    model.double()
    got = sorted(lora_named(model))
    want = sorted(f"{R.lora_module(l, t)}.lora_{ab}.weight" for l, t in expect for ab in "AB")
    errs = []
    if got != want:
        errs.append(f"peft adapted {got}, the case expects {want}")
    adir = os.path.join(work, "peft_" + name)
    os.makedirs(adir, exist_ok=True)
    lc.save_pretrained(adir)  # adapter_config.json as PeftModel.save_pretrained writes it
    R.write_safetensors(os.path.join(adir, "adapter_model.safetensors"),
                        {R.PEFT_PREFIX + k: p.detach().numpy().astype(np.float32) for k, p in lora_named(model).items()},
                        metadata={"format": "pt"})
    # The reference trains from the float32 values the file holds.
    with torch.no_grad():
        for p in lora_named(model).values():
            p.copy_(p.float().double())
    ref_losses, ref_w = torch_train(model, tokens, TC)
    tc = R.train_config(**TC)
    tc.update(base_model=os.path.join(work, "model"), train_data=os.path.join(work, "train.bin"), adapter="lora",
              lora_r=R_, lora_alpha=ALPHA, lora_dropout=0.0, lora_model_dir=adir,
              output_dir=os.path.join(work, "out_" + name), **yaml_sel)
    rows = run_ok(work, tc, name)
    worst_l = worst_w = 0.0
    for s, r in enumerate(rows):
        worst_l = max(worst_l, rel(r["loss"], ref_losses[s]))
    if worst_l > LOSS_RTOL or len(rows) != len(ref_losses):
        errs.append(f"losses {[r['loss'] for r in rows]} vs peft {ref_losses}")
    out = R.read_safetensors(os.path.join(tc["output_dir"], "adapter_model.safetensors"))
    if sorted(k[len(R.PEFT_PREFIX):] for k in out) != sorted(ref_w):
        errs.append(f"adapter tensors {sorted(out)[:4]}... differ from peft's {sorted(ref_w)[:4]}...")
    else:
        for k, v in ref_w.items():
            worst_w = max(worst_w, float(np.max(np.abs(out[R.PEFT_PREFIX + k].astype(np.float64) - v))))
        if worst_w > W_TOL:
            errs.append(f"adapter max diff {worst_w:.2e} after {TC['max_steps']} steps")
    return errs, f"{len(want) // 2} adapted projections; loss rel {worst_l:.1e}, adapter max diff {worst_w:.1e}"


# ---- here -> peft ----------------------------------------------------------------------------

def here_to_peft(root, name, yaml_sel, expect, written=None):
    work, cfg, w, tokens = base(root)
    tc = R.train_config(**TC)
    out = os.path.join(work, "here_" + name)
    tc.update(base_model=os.path.join(work, "model"), train_data=os.path.join(work, "train.bin"), adapter="lora",
              lora_r=R_, lora_alpha=ALPHA, lora_dropout=0.0, output_dir=out, **yaml_sel)
    run_ok(work, tc, name)
    errs = []
    conf = json.load(open(os.path.join(out, "adapter_config.json")))
    if written:
        for k, v in written.items():
            if conf.get(k) != v:
                errs.append(f"adapter_config.json {k} = {conf.get(k)!r}, expected {v!r}")
    lc = LoraConfig.from_pretrained(out)
    model = inject_adapter_in_model(lc, HFLlama(cfg, w))
    model.double()
    sd = {k[len(R.PEFT_PREFIX):]: torch.from_numpy(v.astype(np.float64))
          for k, v in R.read_safetensors(os.path.join(out, "adapter_model.safetensors")).items()}
    got = sorted(lora_named(model))
    want = sorted(f"{R.lora_module(l, t)}.lora_{ab}.weight" for l, t in expect for ab in "AB")
    if got != want:
        errs.append(f"peft adapted {got} from the written config, expected {want}")
    if sorted(sd) != want:
        errs.append(f"adapter file holds {sorted(sd)}, expected {want}")
    res = set_peft_model_state_dict(model, sd)
    unexpected = list(getattr(res, "unexpected_keys", []))
    missing = [k for k in getattr(res, "missing_keys", []) if "lora_" in k]
    if unexpected or missing:
        errs.append(f"peft load: unexpected {unexpected[:3]}, missing {missing[:3]}")
    with torch.no_grad():
        for k, p in lora_named(model).items():
            if k in sd and not torch.equal(p, sd[k]):
                errs.append(f"peft did not load {k}")
                break
    peft_loss = loss_of(model, tokens, TC, 3)
    # The trainer with the written adapter loaded: its first loss on step 3's batch.
    t2 = dict(tc, lora_model_dir=out, max_steps=1, output_dir=os.path.join(work, "again_" + name))
    shard = os.path.join(work, "skip2_" + name + ".bin")
    n = 2 * TC["micro_batch_size"] * TC["sequence_len"]
    R.write_shard(shard, list(tokens[n:]))
    t2["train_data"] = shard
    rows = run_ok(work, t2, "again_" + name)
    e = rel(rows[0]["loss"], peft_loss)
    if e > LOSS_RTOL:
        errs.append(f"loss with the adapter: here {rows[0]['loss']} vs peft {peft_loss}")
    # Not a loss the base alone gives: the adapters matter.
    base_loss = loss_of(HFLlama(cfg, w), tokens, TC, 3)
    if rel(base_loss, peft_loss) < 1e-6:
        errs.append("the trained adapter does not change the loss (the check cannot fail)")
    return errs, f"{len(want) // 2} adapted projections; loss rel {e:.1e}; target_modules written {conf['target_modules']!r}"


def refused(root, name, yaml_sel, word, adapter_edit=None):
    work, cfg, w, tokens = base(root)
    tc = R.train_config(**TC)
    tc.update(base_model=os.path.join(work, "model"), train_data=os.path.join(work, "train.bin"), adapter="lora",
              lora_r=R_, lora_alpha=ALPHA, max_steps=1, output_dir=os.path.join(work, "bad_" + name), **yaml_sel)
    if adapter_edit is not None:
        src = os.path.join(work, "here_ltt_list")
        d = os.path.join(work, "badad_" + name)
        shutil.copytree(src, d)
        p = os.path.join(d, "adapter_config.json")
        c = json.load(open(p))
        c.update(adapter_edit)
        json.dump(c, open(p, "w"))
        tc["lora_model_dir"] = d
    rc, err = run(work, tc, "bad_" + name)
    lines = [l for l in err.splitlines() if l.strip()]
    ok = rc == 1 and len(lines) == 1 and lines[0].startswith("error: ") and word in lines[0]
    return ([] if ok else [f"exit {rc}, stderr {err[-400:]!r}, expected one error line naming {word!r}"]), \
        lines[0] if lines else ""


QV = ("q_proj", "v_proj")


def cases(root):
    yield "peft_to_here_ltt_list", lambda: peft_to_here(
        root, "ltt_list", dict(target_modules=list(QV), layers_to_transform=[0, 2]),
        dict(lora_target_modules=list(QV), peft_layers_to_transform=[0, 2]),
        [(l, t) for l in (0, 2) for t in QV])
    yield "peft_to_here_ltt_int_pattern", lambda: peft_to_here(
        root, "ltt_int", dict(target_modules=["gate_proj", "down_proj", "o_proj"], layers_to_transform=1,
                              layers_pattern="layers"),
        dict(lora_target_modules=["o_proj", "gate_proj", "down_proj"], peft_layers_to_transform=[1],
             peft_layers_pattern=["layers"]),
        [(1, t) for t in ("o_proj", "gate_proj", "down_proj")])
    full = ["model.layers.0.self_attn.q_proj", "model.layers.1.mlp.up_proj", "model.layers.2.self_attn.k_proj",
            "model.layers.2.mlp.down_proj"]
    yield "peft_to_here_full_paths", lambda: peft_to_here(
        root, "full", dict(target_modules=full), dict(lora_target_modules=full),
        [(0, "q_proj"), (1, "up_proj"), (2, "k_proj"), (2, "down_proj")])
    rx = r".*layers\.(0|2)\.self_attn\.(q|v)_proj"
    yield "peft_to_here_regex", lambda: peft_to_here(
        root, "regex", dict(target_modules=rx), dict(lora_target_modules=rx),
        [(l, t) for l in (0, 2) for t in QV])
    rx2 = r"model\.layers\.[12]\.mlp\.\w+?_proj"
    yield "peft_to_here_regex_classes", lambda: peft_to_here(
        root, "regex2", dict(target_modules=rx2), dict(lora_target_modules=rx2),
        [(l, t) for l in (1, 2) for t in ("gate_proj", "up_proj", "down_proj")])

    yield "here_to_peft_ltt_list", lambda: here_to_peft(
        root, "ltt_list", dict(lora_target_modules=list(QV), peft_layers_to_transform=[0, 2]),
        [(l, t) for l in (0, 2) for t in QV],
        written=dict(target_modules=list(QV), layers_to_transform=[0, 2]))
    yield "here_to_peft_linear_one_layer", lambda: here_to_peft(
        root, "linear", dict(lora_target_linear=True, peft_layers_to_transform=[1], peft_layers_pattern=["layers"]),
        [(1, t) for t in R.LORA_TARGETS])
    yield "here_to_peft_regex_mixed", lambda: here_to_peft(
        root, "regex_mixed", dict(lora_target_modules=r".*\.(0\.self_attn\.k_proj|[12]\.mlp\.up_proj)"),
        [(0, "k_proj"), (1, "up_proj"), (2, "up_proj")],
        written=dict(layers_to_transform=None))
    yield "here_to_peft_all_layers", lambda: here_to_peft(
        root, "all", dict(lora_target_modules=list(QV), peft_layers_to_transform=[0, 1, 2]),
        [(l, t) for l in range(3) for t in QV], written=dict(target_modules=list(QV), layers_to_transform=None))

    bad = {
        "ltt_out_of_range": (dict(lora_target_modules=list(QV), peft_layers_to_transform=[3]), "peft_layers_to_transform"),
        "ltt_with_regex": (dict(lora_target_modules=r".*q_proj", peft_layers_to_transform=[0]), "peft_layers_to_transform"),
        "pattern_matches_nothing": (dict(lora_target_modules=list(QV), peft_layers_to_transform=[0],
                                         peft_layers_pattern=["h"]), "matches no projection"),
        "pattern_without_layers": (dict(lora_target_modules=list(QV), peft_layers_pattern=["layers"]), "peft_layers_pattern"),
        "regex_lookahead": (dict(lora_target_modules=r".*(?=q)q_proj"), "lora_target_modules"),
        "regex_selects_norm": (dict(lora_target_modules=r".*layers\.0\..*norm"), "input_layernorm"),
        "list_selects_mlp": (dict(lora_target_modules=["q_proj", "mlp"]), "model.layers.0.mlp"),
        "linear_with_regex": (dict(lora_target_linear=True, lora_target_modules=r".*q_proj"), "lora_target_linear"),
        "adapter_other_layers": (dict(lora_target_modules=list(QV), peft_layers_to_transform=[0, 1]),
                                 "layer 1"),
        "adapter_ltt_regex": (dict(lora_target_modules=list(QV), peft_layers_to_transform=[0, 2]), "layers_to_transform",
                              dict(target_modules=".*_proj", layers_to_transform=[0])),
    }
    for name, spec in bad.items():
        yield "refused_" + name, (lambda s=spec, n=name: refused(
            root, n, s[0], s[1], adapter_edit=s[2] if len(s) > 2 else ({} if n.startswith("adapter") else None)))


def main():
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="./train_llama")
    ap.add_argument("--only", default="")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("-v", "--verbose", action="store_true")
    ARGS = ap.parse_args()
    ARGS.bin = os.path.abspath(ARGS.bin)
    if peft is None:
        print(f"FAIL peft_import: peft is not importable ({PEFT_ERR}); run scripts/install_deps.sh")
        return 1
    if peft.__version__ != "0.11.1":
        print(f"note: peft {peft.__version__}; these checks were written against peft 0.11.1")
    root = tempfile.mkdtemp(prefix="test_peft_layers_")
    try:
        passed, failed = harness.run_cases(cases(root), ARGS.only, ARGS.verbose)
    finally:
        if ARGS.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
