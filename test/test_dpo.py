#!/usr/bin/python3
"""Preference training (rl: dpo / ipo / simpo / orpo; llmc/preference.h) against a float64 PyTorch reference
written from TRL 1.8's DPOTrainer (test/llama_ref.py's model; the losses below in torch ops).

    /usr/bin/python3 test/test_dpo.py --bin build/train_llama [--only CASE]

Cases:
  rows            what scripts/prepare_pairs.py writes: per pair a chosen and a rejected row,
                  prompt tokens = tok(prompt), completion = tok(prompt + completion + eos text)
                  past the prompt's count, targets on the completion only, the paired flag;
                  the eos text not appended twice; Axolotl's length filter (drop / truncate /
                  raise); the chatml, llama3, user_defined, passthrough, chat_template formats.
  sigmoid_full    full fine-tune, default loss, accumulation, clipping, an eval split: per-step
                  loss, grad norm and rewards/* as the reference computes them (its reference
                  log-probabilities from the starting weights), eval_loss after the last step.
  mixed_lora      LoRA with dpo_loss_type [sigmoid, ipo, hinge, robust, sft], weights and label
                  smoothing, beta 0.5 (the initial adapter read from checkpoint-1, whose lr is 0).
  ipo             rl: ipo (TRL's length-normalised loss), its note when dpo_loss_type is given.
  simpo           rl: simpo (TRL's CPOTrainer): its rows (no special tokens but one BOS and an EOS
                  id), no reference pass, SimPO on mean log-likelihoods + cpo_alpha x sft, beta 2,
                  gamma 0.3, against the reference; refused without simpo_gamma.
  memory_modes    recompute, activation offloading, tiled MLP, offload_optimizer: the plain
                  run's losses and grad norms bit for bit.
  resume          checkpoint-2 resumed: steps 3-4 identical to the uninterrupted run, with the
                  reference read from the checkpoint and with it computed again; a damaged
                  reference_logps.bin refused.
  ranks           mpirun -np 2 (data parallel, and ZeRO-3), one pair a rank per micro-batch, and
                  sequence_parallel_degree 2 (half of every row a rank): the losses, grad norms,
                  margins and eval_loss of one process with two pairs.
  orpo            rl: orpo (TRL's ORPOTrainer) on Axolotl's chat_template.argilla records (system,
                  a prompt field, two-turn conversations): its rows, no reference pass, the nll over
                  the chosen rows' whole sequences (a mean per micro-batch) minus beta log sigmoid of
                  the log odds ratio, against the reference; gradient checkpointing bit for bit;
                  mpirun sequence parallel (the prompt's end falls in either half) as one process.
  kto             rl: kto (TRL's KTOTrainer) on llama3.ultra records with labels: the rows (each
                  example's KL sequence holds the completion of the one before it in its batch of
                  micro_batch_size, cyclically), the labels file, the loss (KL estimate per
                  micro-batch, clamped, no gradient; weights 1.5 / 0.5) against the reference, and
                  mpirun -np 2 (the ranks' KL estimates averaged) against the reference's; a
                  short or out-of-range labels file refused.
  refusals        rl: grpo, rl: orpo on another format, sample_packing, rpo_alpha, an unknown loss type, train_data shards,
                  lora_model_dir, dpo_loss_weights of the wrong length: one error line, exit 1.
"""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import harness  # noqa: E402
import hf_fixtures as FX  # noqa: E402
import llama_ref as R  # noqa: E402

ARGS = None
WORK = None


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-12)


# ---- fixtures ---------------------------------------------------------------------------------

def model_dir():
    d = os.path.join(WORK, "model")
    if not os.path.exists(os.path.join(d, "config.json")):
        FX.make_model(d, "llama3", seed=3)
    return d


def pairs(n, seed=0, system_every=3):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        r = {"question": FX.sentence(rng, 3, 9), "chosen": FX.sentence(rng, 2, 12), "rejected": FX.sentence(rng, 2, 12)}
        if system_every and i % system_every == 0:
            r["system"] = FX.sentence(rng, 2, 5)
        out.append(r)
    return out


def run(cfg, *extra, expect_ok=True):
    path = os.path.join(WORK, "cfg_%d.yaml" % abs(hash(json.dumps(cfg, sort_keys=True, default=str))))
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)  # JSON is YAML
    env = dict(os.environ, LLMC_PYTHON=sys.executable, LLMC_SCRIPTS_DIR=os.path.join(ROOT, "scripts"),
               TRANSFORMERS_VERBOSITY="error")
    p = subprocess.run([ARGS.bin, "-c", path, *extra], cwd=WORK, env=env, capture_output=True, text=True, timeout=600)
    if expect_ok and p.returncode != 0:
        raise RuntimeError("trainer failed (rc %d): %s" % (p.returncode, (p.stderr or p.stdout).strip()[-600:]))
    return p


def base_cfg(out, data, **kw):
    tc = R.train_config(sequence_len=48, micro_batch_size=2, gradient_accumulation_steps=2, max_steps=3,
                        learning_rate=2e-3, lr_scheduler="constant", warmup_steps=0, weight_decay=0.0,
                        max_grad_norm=1.0, seed=5)
    tc.update(base_model=model_dir(), output_dir=os.path.join(WORK, out), rl="dpo",
              datasets=[{"path": data, "type": "llama3.intel"}], dataset_prepared_path=os.path.join(WORK, "prepared"))
    tc.update(kw)
    return tc


def run_two_ranks(cfg, tag, errs):
    """cfg under mpirun -np 2: True when it ran to the end; False when it failed (the failure added
    to errs, named by tag) or there is no mpirun."""
    if not shutil.which("mpirun"):
        return False
    path = os.path.join(WORK, os.path.basename(cfg["output_dir"]) + ".yaml")
    with open(path, "w") as f:
        json.dump(cfg, f)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "PMIX_", "PRTE_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1",
               LLMC_PYTHON=sys.executable, LLMC_SCRIPTS_DIR=os.path.join(ROOT, "scripts"), TRANSFORMERS_VERBOSITY="error")
    p = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", ARGS.bin, "-c", path],
                       cwd=WORK, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode:
        errs.append("%s: rc %d %s" % (tag, p.returncode, p.stderr.strip()[-300:]))
    return p.returncode == 0


def compare_figures(errs, tag, got, want):
    """Each step's (loss, grad norm, margin) of figures() against want's, 1e-5 relative; returns the
    worst relative difference."""
    worst = 0.0
    for s, (a, b) in enumerate(zip(got, want), 1):
        for i, name in enumerate(("loss", "grad_norm", "margin")):
            compare(errs, "%s step %d %s" % (tag, s, name), a[i], b[i], rtol=1e-5, atol=1e-7)
            worst = max(worst, rel(a[i], b[i]))
    return worst


def prepared_dir(stdout):
    for line in stdout.splitlines():
        if line.startswith("data: ") and " train rows" in line:
            return line.split(": ")[1]
    raise RuntimeError("no prepared directory in the output")


def read_rows(path):
    a = np.fromfile(path, dtype="<i4")
    h = a[:256]
    T, n = int(h[2]), int(h[3])
    rows = a[256:].reshape(n, 3, T)
    return h, rows[:, 0, :], rows[:, 1, :]


def metrics(out):
    steps, evals = {}, {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            if "eval_loss" in m:
                evals[m["step"]] = m
            elif "loss" in m:
                steps[m["step"]] = m
    return steps, evals


# ---- the reference ---------------------------------------------------------------------------

def logps(model, tok, tgt):
    """Per row: the sum of log p over the target (completion) tokens, and their count."""
    logits = model(torch.tensor(tok, dtype=torch.long))
    lp = F.log_softmax(logits.double(), -1)
    t = torch.tensor(tgt, dtype=torch.long)
    mask = t >= 0
    g = lp.gather(-1, t.clamp(min=0).unsqueeze(-1)).squeeze(-1) * mask
    return g.sum(-1), mask.sum(-1).double()


def pref_loss(lp, n, ref, types, weights, beta, eps, gamma=0.0):
    """TRL 1.8's DPOTrainer losses for rows (chosen, rejected, chosen, ...), each a mean over the
    pairs (sft: the chosen completions' token mean), weighted and summed; "simpo" is its
    CPOTrainer's (no reference: ref is None; mean token log-likelihoods)."""
    pc, pr, nc, nr = lp[0::2], lp[1::2], n[0::2], n[1::2]
    if ref is None:  # CPOTrainer: no reference; rewards and logps/* on the mean log-likelihoods
        total = 0
        for t, w in zip(types, weights):
            if t == "simpo":
                total = total + w * (-F.logsigmoid(beta * (pc / nc - pr / nr) - gamma)).mean()
            elif t == "sft":
                total = total + w * (-pc.sum() / nc.sum())
        mc, mr = pc / nc, pr / nr
        stats = {"rewards/chosen": (beta * mc).mean().item(), "rewards/rejected": (beta * mr).mean().item(),
                 "rewards/accuracies": (mc > mr).double().mean().item(), "rewards/margins": (beta * (mc - mr)).mean().item(),
                 "logps/chosen": mc.mean().item(), "logps/rejected": mr.mean().item()}
        return total, stats
    rc, rr = ref[0::2], ref[1::2]
    d = (pc - rc) - (pr - rr)
    z = beta * d
    total = 0
    for t, w in zip(types, weights):
        if t == "sigmoid":
            l = -F.logsigmoid(z)
        elif t == "hinge":
            l = torch.relu(1 - z)
        elif t == "ipo":
            l = ((pc - rc) / nc - (pr - rr) / nr - 1 / (2 * beta)) ** 2
        elif t == "robust":
            l = (-(1 - eps) * F.logsigmoid(z) + eps * F.logsigmoid(-z)) / (1 - 2 * eps)
        elif t == "sft":
            total = total + w * (-pc.sum() / nc.sum())
            continue
        total = total + w * l.mean()
    rw_c, rw_r = beta * (pc - rc), beta * (pr - rr)
    stats = {"rewards/chosen": rw_c.mean().item(), "rewards/rejected": rw_r.mean().item(),
             "rewards/accuracies": (rw_c > rw_r).double().mean().item(),
             "rewards/margins": (rw_c - rw_r).mean().item(), "logps/chosen": pc.mean().item(),
             "logps/rejected": pr.mean().item()}
    return total, stats


def unit_mean(rows, micro, loss_of):
    """HF Trainer's loss for rows (pairs, chosen then rejected): each micro-batch's (micro pairs)
    own loss, averaged over the micro-batches (Trainer divides each by the accumulation steps)."""
    n = rows.stop - rows.start
    units = [slice(rows.start + i, min(rows.start + i + 2 * micro, rows.stop)) for i in range(0, n, 2 * micro)]
    return sum(loss_of(u) for u in units) / len(units)


def orpo_terms(model, tok, tgt, beta):
    """TRL's ORPOTrainer on rows (chosen, rejected, ...): the chosen rows' mean token loss over the
    whole sequence (every next token up to the completion's end), the completions' mean token
    log-likelihoods, the log odds ratio; returns (loss, stats)."""
    logits = model(torch.tensor(tok, dtype=torch.long))
    lp = F.log_softmax(logits.double(), -1)
    t = torch.tensor(tgt, dtype=torch.long)
    full = t.clone()
    for r in range(t.shape[0]):
        s = int((t[r] >= 0).nonzero()[0])
        full[r, :s] = torch.tensor(tok[r, 1:s + 1], dtype=torch.long)
    g = lp.gather(-1, full.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    comp, whole = (t >= 0).double(), (full >= 0).double()
    nll = -(g * whole)[0::2].sum() / whole[0::2].sum()
    mean = (g * comp).sum(-1) / comp.sum(-1)
    lc, lr = mean[0::2], mean[1::2]
    l1m = lambda x: torch.where(x < -0.693, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))  # noqa: E731
    lo = (lc - lr) - (l1m(lc) - l1m(lr))
    ratio = F.logsigmoid(lo)
    loss = nll - beta * ratio.mean()
    stats = {"rewards/chosen": (beta * lc).mean().item(), "rewards/rejected": (beta * lr).mean().item(),
             "rewards/accuracies": (lc > lr).double().mean().item(), "rewards/margins": (beta * (lc - lr)).mean().item(),
             "logps/chosen": lc.mean().item(), "logps/rejected": lr.mean().item(), "nll_loss": nll.item(),
             "log_odds_ratio": ratio.mean().item(), "log_odds_chosen": lo.mean().item()}
    return loss, stats


def reference_run(cfg, weights, tok, tgt, steps, pairs_per_step, lr, types, weights_l, beta, eps, lora=None,
                  warmup=0, max_grad_norm=1.0, eval_rows=None, gamma=None, micro=2):
    """The trainer's run in float64: the reference log-probabilities from the starting model
    (adapters off), then AdamW steps over consecutive pairs (shuffle false), each step's loss the
    mean of its micro-batches' (micro pairs each) losses; types ["orpo"]: TRL's ORPOTrainer."""
    model = R.RefLlama(cfg, weights, lora=lora)
    base = R.RefLlama(cfg, weights)
    with torch.no_grad():
        ref, _ = logps(base, tok, tgt)
        eref = logps(base, *eval_rows)[0] if eval_rows is not None else None
    params = [p for _, p in model.named_trainable_parameters()]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    out = []
    for s in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * (s / warmup if s < warmup else 1.0)
        opt.zero_grad()
        r0 = s * pairs_per_step * 2
        rows = slice(r0, r0 + pairs_per_step * 2)
        if types == ["orpo"]:
            loss = unit_mean(rows, micro, lambda u: orpo_terms(model, tok[u], tgt[u], beta)[0])
            with torch.no_grad():
                stats = orpo_terms(model, tok[rows], tgt[rows], beta)[1]
                stats["nll_loss"] = unit_mean(rows, micro, lambda u: orpo_terms(model, tok[u], tgt[u], beta)[1]["nll_loss"])
        else:
            def unit_loss(u):
                lp, n = logps(model, tok[u], tgt[u])
                return pref_loss(lp, n, None if gamma is not None else ref[u], types, weights_l, beta, eps, gamma or 0.0)[0]
            loss = unit_mean(rows, micro, unit_loss)
            with torch.no_grad():
                lp, n = logps(model, tok[rows], tgt[rows])
                stats = pref_loss(lp, n, None if gamma is not None else ref[rows], types, weights_l, beta, eps,
                                  gamma or 0.0)[1]
        loss.backward()
        gn = R.grad_norm_clip(params, max_grad_norm)
        opt.step()
        out.append(dict(stats, loss=loss.item(), grad_norm=gn))
    ev = None
    if eval_rows is not None:
        with torch.no_grad():
            et, eg = eval_rows
            rows = slice(0, len(et))
            loss = unit_mean(rows, micro, lambda u: pref_loss(*logps(model, et[u], eg[u]), eref[u], types, weights_l,
                                                              beta, eps)[0])
            lp, n = logps(model, et, eg)
            ev = dict(pref_loss(lp, n, eref, types, weights_l, beta, eps)[1], loss=loss.item())
    return out, ev


def compare(errs, tag, got, want, rtol=1e-5, atol=1e-7):
    if not (abs(got - want) <= atol + rtol * abs(want)):
        errs.append("%s: %.9g, reference %.9g" % (tag, got, want))


def compare_steps(errs, m, ref, keys=("loss", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/margins",
                                      "logps/chosen", "logps/rejected", "rewards/accuracies")):
    worst = 0.0
    for s, r in enumerate(ref, 1):
        if s not in m:
            errs.append("step %d missing from metrics.jsonl" % s)
            continue
        for k in keys:
            tol = 1e-4 if k == "grad_norm" else 1e-5
            # rewards are beta times differences of float32 sums of token log-probabilities
            # (tens each): 1e-5 absolute is a few ulps of those sums
            compare(errs, "step %d %s" % (s, k), m[s][k], r[k], rtol=tol, atol=1e-5 if k.startswith("rewards/") else 1e-6)
            if k == "loss":
                worst = max(worst, rel(m[s][k], r[k]))
    return worst


# ---- cases -----------------------------------------------------------------------------------

def case_rows():
    from transformers import AutoTokenizer
    errs = []
    d = model_dir()
    tk = AutoTokenizer.from_pretrained(d)
    eos = tk.eos_token
    recs = pairs(6, seed=1)
    long = {"question": " ".join(["word"] * 60), "chosen": "yes", "rejected": "no"}
    data = os.path.join(WORK, "rows.jsonl")
    FX.write_jsonl(data, recs + [long])
    cfg = base_cfg("rows_out", data, max_steps=1, sequence_len=40)
    p = run(cfg, "--preprocess")
    meta_dir = p.stdout.strip().split()[-1]
    h, tok, tgt = read_rows(os.path.join(meta_dir, "train.bin"))
    if int(h[4]) != 2:
        errs.append("header flags %d, want 2 (paired)" % int(h[4]))
    if "dropped 1 pairs" not in p.stdout:
        errs.append("the 60-word prompt was not reported dropped: %s" % p.stdout.strip()[-200:])
    # Axolotl shuffles the merged pairs by seed (numpy's permutation of 6): rows 2k, 2k+1 are
    # pair perm[k]
    perm = np.random.default_rng(5).permutation(6)
    T = 40
    for k, i in enumerate(perm):
        r = recs[i]
        sysp = ("<|start_header_id|>system<|end_header_id|>\n\n%s<|eot_id|>" % r["system"]) if r.get("system") else ""
        prompt = sysp + "<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|>" % r["question"] + \
            "<|start_header_id|>assistant<|end_header_id|>\n\n"
        P = tk(prompt)["input_ids"]
        for j, comp in enumerate((r["chosen"], r["rejected"])):
            comp = comp + "<|eot_id|>"
            if not comp.endswith(eos):
                comp += eos
            C = tk(prompt + comp)["input_ids"][len(P):]
            seq = (P + C)[:T]
            row = 2 * k + j
            if list(tok[row, :len(seq)]) != seq:
                errs.append("row %d (pair %d %s): tokens differ" % (row, i, "chosen" if j == 0 else "rejected"))
            want_t = [seq[t + 1] if t + 1 < len(seq) and t + 1 >= len(P) else -1 for t in range(T)]
            if list(tgt[row]) != want_t:
                errs.append("row %d: targets differ (want the completion's %d tokens)" % (row, len(seq) - len(P)))
    # raise / truncate
    cfg_r = dict(cfg, excess_length_strategy="raise", output_dir=os.path.join(WORK, "rows_raise"))
    p = run(cfg_r, "--preprocess", expect_ok=False)
    if p.returncode == 0 or "excess_length_strategy: raise" not in p.stderr:
        errs.append("raise: rc %d %s" % (p.returncode, p.stderr.strip()[-200:]))
    long2 = {"question": "a b", "chosen": " ".join(["word"] * 60), "rejected": "no"}
    data2 = os.path.join(WORK, "rows2.jsonl")
    FX.write_jsonl(data2, [long2])
    cfg_t = base_cfg("rows_trunc", data2, max_steps=1, sequence_len=40, excess_length_strategy="truncate",
                     micro_batch_size=1, gradient_accumulation_steps=1)
    p = run(cfg_t, "--preprocess")
    h, tok2, tgt2 = read_rows(os.path.join(p.stdout.strip().split()[-1], "train.bin"))
    plain = len(tk("<|start_header_id|>user<|end_header_id|>\n\na b<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
                   "\n\n", add_special_tokens=False)["input_ids"])
    prompt = "<|start_header_id|>user<|end_header_id|>\n\na b<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    cut = tk.decode(tk(" ".join(["word"] * 60) + "<|eot_id|>", add_special_tokens=False)["input_ids"][:40 - plain])
    P = tk(prompt)["input_ids"]
    want = (P + tk(prompt + cut + eos)["input_ids"][len(P):])[:40]
    if int(h[3]) != 2 or list(tok2[0]) != want:
        errs.append("truncate: the chosen completion is not cut to what sequence_len leaves after the prompt "
                    "(Axolotl's decode of its first %d tokens)" % (40 - plain))
    return errs, "%d pairs checked" % len(perm)


def case_formats():
    """Each preference format's strings, as decoded from the rows it produced."""
    from transformers import AutoTokenizer
    errs = []
    tk = AutoTokenizer.from_pretrained(model_dir())
    cases = [
        ("chatml.argilla_chat", {"chosen": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "good"}],
                                 "rejected": [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "bad"}]},
         "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n", "good<|im_end|>", "bad<|im_end|>"),
        ("chatml.ultra", {"prompt": "q one", "system": "sys", "chosen": [{}, {"content": "a1"}], "rejected": [{}, {"content": "a2"}]},
         "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nq one<|im_end|>\n<|im_start|>assistant\n",
         "a1<|im_end|>", "a2<|im_end|>"),
        ("chatml", {"instruction": "do it", "chosen_response": "done", "rejected_response": "no"},
         "<|im_start|>user\ndo it<|im_end|>\n<|im_start|>assistant\n", "done<|im_end|>", "no<|im_end|>"),
        ("passthrough", {"prompt": "P: ", "chosen": "c<|end_of_text|>", "rejected": "r"}, "P: ", "c<|end_of_text|>", "r"),
        ({"field_prompt": "q", "prompt_format": "Q {prompt} S {system} A ", "chosen_format": "<{chosen}>"},
         {"q": "what", "system": "s", "chosen": "yes", "rejected": "no"}, "Q what S s A ", "<yes>", "no"),
    ]
    for i, (typ, rec, prompt, chosen, rejected) in enumerate(cases):
        data = os.path.join(WORK, "fmt%d.jsonl" % i)
        FX.write_jsonl(data, [rec])
        cfg = base_cfg("fmt%d" % i, data, micro_batch_size=1, gradient_accumulation_steps=1, sequence_len=128)
        cfg["datasets"] = [{"path": data, "type": typ}]
        p = run(cfg, "--preprocess", expect_ok=False)
        if p.returncode:
            errs.append("%s: %s" % (typ, p.stderr.strip()[-200:]))
            continue
        _, tok, _ = read_rows(os.path.join(p.stdout.strip().split()[-1], "train.bin"))
        for row, comp in ((0, chosen), (1, rejected)):
            P = tk(prompt)["input_ids"]
            c = comp if comp.endswith(tk.eos_token) else comp + tk.eos_token
            want = P + tk(prompt + c)["input_ids"][len(P):]
            if list(tok[row, :len(want)]) != want:
                errs.append("%s row %d: %r, want %r" % (typ, row, tk.decode(tok[row, :len(want)]), prompt + c))
    # chat_template.default with the tokenizer's template: the prompt with a generation prompt,
    # each completion from its content on
    rec = {"messages": [{"role": "user", "content": "tell me"}], "chosen": {"role": "assistant", "content": "sure"},
           "rejected": "nope"}
    data = os.path.join(WORK, "fmt_ct.jsonl")
    FX.write_jsonl(data, [rec])
    cfg = base_cfg("fmt_ct", data, micro_batch_size=1, gradient_accumulation_steps=1, sequence_len=128)
    cfg["datasets"] = [{"path": data, "type": "chat_template.default"}]
    p = run(cfg, "--preprocess", expect_ok=False)
    if p.returncode:
        errs.append("chat_template.default: %s" % p.stderr.strip()[-200:])
    else:
        _, tok, tgt = read_rows(os.path.join(p.stdout.strip().split()[-1], "train.bin"))
        prompt = tk.apply_chat_template([{"role": "user", "content": "tell me"}], tokenize=False, add_generation_prompt=True)
        for row, content in ((0, "sure"), (1, "nope")):
            s = tk.apply_chat_template([{"role": "user", "content": "[[dummy_message]]"},
                                        {"role": "assistant", "content": content}], tokenize=False)
            comp = s[s.find(content):].rstrip()
            if not comp.endswith(tk.eos_token):
                comp += tk.eos_token
            P = tk(prompt)["input_ids"]
            want = P + tk(prompt + comp)["input_ids"][len(P):]
            if list(tok[row, :len(want)]) != want:
                errs.append("chat_template.default row %d: %r" % (row, tk.decode(tok[row, :len(want)])))
    # the Axolotl examples' form: field_messages, message_property_mappings and roles applied
    rec = {"conversation": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "tell me"}],
           "good": {"from": "gpt", "value": "sure"}, "bad": [{"from": "gpt", "value": "nope"}]}
    data = os.path.join(WORK, "fmt_map.jsonl")
    FX.write_jsonl(data, [rec])
    cfg = base_cfg("fmt_map", data, micro_batch_size=1, gradient_accumulation_steps=1, sequence_len=128)
    cfg["datasets"] = [{"path": data, "type": "chat_template.default", "field_messages": "conversation",
                        "field_chosen": "good", "field_rejected": "bad",
                        "message_property_mappings": {"role": "from", "content": "value"},
                        "roles": {"user": ["human"], "assistant": ["gpt"], "system": ["system"]}}]
    p = run(cfg, "--preprocess", expect_ok=False)
    if p.returncode:
        errs.append("chat_template.default with mappings: %s" % p.stderr.strip()[-200:])
    else:
        _, tok, _ = read_rows(os.path.join(p.stdout.strip().split()[-1], "train.bin"))
        prompt = tk.apply_chat_template([{"role": "system", "content": "be brief"}, {"role": "user", "content": "tell me"}],
                                        tokenize=False, add_generation_prompt=True)
        P = tk(prompt)["input_ids"]
        if list(tok[0, :len(P)]) != P:
            errs.append("chat_template.default with mappings: prompt %r" % tk.decode(tok[0, :len(P)]))
    return errs, "%d formats" % (len(cases) + 2)


def dpo_run(tag, n_pairs, steps, eval_pairs=0, lora=False, warmup=0, **kw):
    data = os.path.join(WORK, tag + ".jsonl")
    FX.write_jsonl(data, pairs(n_pairs + eval_pairs, seed=sum(map(ord, tag))))
    cfg = base_cfg(tag, data, max_steps=steps, shuffle_merged_datasets=False, **kw)
    if eval_pairs:
        cfg.update(val_set_size=eval_pairs, eval_steps=steps)
    if lora:
        cfg.update({"adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_target_linear": True, "save_steps": 1,
                    "lr_scheduler": "constant_with_warmup", "warmup_steps": warmup})
    p = run(cfg)
    d = prepared_dir(p.stdout)
    _, tok, tgt = read_rows(os.path.join(d, "train.bin"))
    ev = read_rows(os.path.join(d, "eval.bin"))[1:] if eval_pairs else None
    return cfg, p, tok, tgt, ev


def case_sigmoid_full():
    errs = []
    cfg_m, w = R_cfg_weights()
    cfg, p, tok, tgt, ev = dpo_run("sigmoid_full", 12, 3, eval_pairs=4)
    ref, eref = reference_run(cfg_m, w, tok, tgt, 3, 4, 2e-3, ["sigmoid"], [1.0], 0.1, 0.0, eval_rows=ev)
    m, e = metrics(cfg["output_dir"])
    worst = compare_steps(errs, m, ref)
    if abs(m[1]["loss"] - math.log(2)) > 1e-7:
        errs.append("step 1 loss %.9g, not ln 2 (the policy is the reference)" % m[1]["loss"])
    if 3 not in e:
        errs.append("no eval at step 3")
    else:
        compare(errs, "eval_loss", e[3]["eval_loss"], eref["loss"])
        compare(errs, "eval_rewards/margins", e[3]["eval_rewards/margins"], eref["rewards/margins"], atol=1e-6)
    if "reference: log-probabilities of 12 train pairs and 4 eval pairs" not in p.stdout:
        errs.append("no reference line")
    return errs, "loss rel %.2e, step 3 loss %.6f" % (worst, m[3]["loss"] if 3 in m else float("nan"))


def R_cfg_weights():
    with open(os.path.join(model_dir(), "config.json")) as f:
        cfg = json.load(f)
    return cfg, R.read_safetensors(os.path.join(model_dir(), "model.safetensors"))


def case_mixed_lora():
    errs = []
    cfg_m, w = R_cfg_weights()
    types, wts = ["sigmoid", "ipo", "hinge", "robust", "sft"], [1.0, 0.5, 0.3, 0.7, 0.2]
    cfg, p, tok, tgt, _ = dpo_run("mixed_lora", 16, 4, lora=True, warmup=1, rl_beta=2.0, dpo_label_smoothing=0.1,
                                  dpo_loss_type=types, dpo_loss_weights=wts, learning_rate=3e-2)
    spec = R.load_adapter_dir(os.path.join(cfg["output_dir"], "checkpoint-1"))
    ref, _ = reference_run(cfg_m, w, tok, tgt, 4, 4, 3e-2, types, wts, 2.0, 0.1, lora=spec, warmup=1)
    m, _ = metrics(cfg["output_dir"])
    worst = compare_steps(errs, m, ref)
    if "preference   dpo, beta 2, sigmoid + 0.5 ipo + 0.3 hinge + 0.7 robust + 0.2 sft" not in p.stdout:
        errs.append("the box does not name the losses")
    return errs, "loss rel %.2e over 4 steps, last margin %.3f" % (worst, m[4]["rewards/margins"] if 4 in m else 0)


def case_ipo():
    errs = []
    cfg_m, w = R_cfg_weights()
    cfg, p, tok, tgt, _ = dpo_run("ipo", 12, 3, rl="ipo", dpo_loss_type=["sigmoid"], rl_beta=0.2)
    ref, _ = reference_run(cfg_m, w, tok, tgt, 3, 4, 2e-3, ["ipo"], [1.0], 0.2, 0.0)
    m, _ = metrics(cfg["output_dir"])
    worst = compare_steps(errs, m, ref)
    if "rl: ipo sets the loss to ipo" not in p.stdout:
        errs.append("no note that dpo_loss_type is overridden")
    return errs, "loss rel %.2e" % worst


def case_simpo():
    """rl: simpo (TRL's CPOTrainer): its own tokenization (no special tokens but a BOS id and an
    EOS id where missing), no reference pass, SimPO on mean log-likelihoods plus cpo_alpha x sft."""
    from transformers import AutoTokenizer
    errs = []
    cfg_m, w = R_cfg_weights()
    tk = AutoTokenizer.from_pretrained(model_dir())
    cfg, p, tok, tgt, _ = dpo_run("simpo", 12, 3, rl="simpo", simpo_gamma=0.3, cpo_alpha=0.4, rl_beta=2.0,
                                  learning_rate=1e-2)
    ref, _ = reference_run(cfg_m, w, tok, tgt, 3, 4, 1e-2, ["simpo", "sft"], [1.0, 0.4], 2.0, 0.0, gamma=0.3)
    m, _ = metrics(cfg["output_dir"])
    worst = compare_steps(errs, m, ref)
    if "reference:" in p.stdout:
        errs.append("rl: simpo ran a reference pass")
    if "preference   simpo, beta 2, gamma 0.3, simpo + 0.4 sft" not in p.stdout:
        errs.append("the box does not name SimPO's losses")
    # the first pair's rows (shuffle_merged_datasets false: the file's first record)
    r = pairs(15, seed=sum(map(ord, "simpo")))[0]
    sysp = ("<|start_header_id|>system<|end_header_id|>\n\n%s<|eot_id|>" % r["system"]) if r.get("system") else ""
    prompt = sysp + "<|start_header_id|>user<|end_header_id|>\n\n%s<|eot_id|>" % r["question"] + \
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    for row, comp in ((0, r["chosen"]), (1, r["rejected"])):
        full = tk(prompt + comp + "<|eot_id|>", add_special_tokens=False)["input_ids"]
        P = tk(prompt, add_special_tokens=False)["input_ids"]
        start = len(P) if full[:len(P)] == P else len(P) - 1
        want = [tk.bos_token_id] + full + [tk.eos_token_id]
        if list(tok[row, :len(want)]) != want or (tok[row, :len(want)] == tk.bos_token_id).sum() != 1:
            errs.append("row %d: %r" % (row, tk.decode(tok[row, :len(want)])))
        if int((tgt[row] >= 0).sum()) != len(full) - start + 1:
            errs.append("row %d: %d targets, want the completion's %d" % (row, int((tgt[row] >= 0).sum()),
                                                                          len(full) - start + 1))
    bad = run(dict(cfg, simpo_gamma=None, output_dir=os.path.join(WORK, "simpo_bad")), "--plan", expect_ok=False)
    if bad.returncode != 1 or "needs simpo_gamma" not in bad.stderr:
        errs.append("rl: simpo without simpo_gamma: rc %d %s" % (bad.returncode, bad.stderr.strip()[-200:]))
    return errs, "loss rel %.2e" % worst


def argilla_pairs(n, seed):
    """Records of Axolotl's chat_template.argilla: chosen and rejected conversations (the same
    user turns), some with a system, one with two turns, one with a prompt field."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        q = FX.sentence(rng, 3, 9)
        conv = [{"role": "user", "content": q}]
        if i == 2:  # two turns: the first answer is part of the prompt
            conv += [{"role": "assistant", "content": FX.sentence(rng, 2, 5)}, {"role": "user", "content": FX.sentence(rng, 2, 5)}]
        r = {"chosen": conv + [{"role": "assistant", "content": FX.sentence(rng, 2, 10)}],
             "rejected": conv + [{"role": "assistant", "content": FX.sentence(rng, 2, 10)}]}
        if i % 3 == 0:
            r["system"] = FX.sentence(rng, 2, 5)
        if i == 4:
            r["prompt"] = FX.sentence(rng, 2, 6)
        out.append(r)
    return out


def case_orpo():
    from transformers import AutoTokenizer
    errs = []
    cfg_m, w = R_cfg_weights()
    tk = AutoTokenizer.from_pretrained(model_dir())
    data = os.path.join(WORK, "orpo.jsonl")
    recs = argilla_pairs(12, seed=21)
    FX.write_jsonl(data, recs)
    cfg = base_cfg("orpo", data, rl="orpo", orpo_alpha=0.5, chat_template="llama3", learning_rate=1e-2,
                   datasets=[{"path": data, "type": "chat_template.argilla"}], shuffle_merged_datasets=False)
    p = run(cfg)
    d = prepared_dir(p.stdout)
    _, tok, tgt = read_rows(os.path.join(d, "train.bin"))
    ref, _ = reference_run(cfg_m, w, tok, tgt, 3, 4, 1e-2, ["orpo"], [1.0], 0.5, 0.0)
    m, _ = metrics(cfg["output_dir"])
    worst = compare_steps(errs, m, ref, keys=("loss", "grad_norm", "rewards/chosen", "rewards/rejected",
                                              "rewards/margins", "logps/chosen", "logps/rejected", "nll_loss",
                                              "log_odds_ratio", "log_odds_chosen"))
    if "reference:" in p.stdout:
        errs.append("rl: orpo ran a reference pass")
    if "preference   orpo, beta 0.5, nll + orpo" not in p.stdout:
        errs.append("the box does not name ORPO")
    # the rows of records 0 (system), 2 (two turns) and 4 (prompt field), spelled out in Llama 3's
    # format and tokenized as TRL's ORPOTrainer does (no special tokens; the answer after the
    # prompt's count; BOS kept, an EOS id appended)
    hdr = lambda role, text: "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>" % (role, text.strip())  # noqa: E731
    for k in (0, 2, 4):
        r = recs[k]
        prompt = "<|begin_of_text|>" + (hdr("system", r["system"]) if r.get("system") else "")
        turns = r["chosen"][:-1]
        for j, m_ in enumerate(turns):
            prompt += hdr(m_["role"], r["prompt"] if m_["role"] == "user" and "prompt" in r else m_["content"])
        prompt += "<|start_header_id|>assistant<|end_header_id|>\n\n"
        for row, comp in ((2 * k, r["chosen"][-1]["content"]), (2 * k + 1, r["rejected"][-1]["content"])):
            ans = comp.strip() + "<|eot_id|>"
            full = tk(prompt + ans, add_special_tokens=False)["input_ids"]
            P = tk(prompt, add_special_tokens=False)["input_ids"]
            start = len(P) if full[:len(P)] == P else len(P) - 1
            want = full + [tk.eos_token_id]
            if list(tok[row, :len(want)]) != want:
                errs.append("record %d row %d: %r" % (k, row, tk.decode(tok[row, :len(want)])))
            elif int((tgt[row] >= 0).sum()) != len(want) - start or tgt[row, start - 1] < 0:
                errs.append("record %d row %d: %d targets, want %d from position %d" % (
                    k, row, int((tgt[row] >= 0).sum()), len(want) - start, start - 1))
    plain = figures(cfg["output_dir"])
    rc = dict(cfg, output_dir=os.path.join(WORK, "orpo_rc"), gradient_checkpointing=True, activation_offloading=True)
    run(rc)
    if figures(rc["output_dir"]) != plain:
        errs.append("gradient checkpointing + offloading: %s vs %s" % (figures(rc["output_dir"])[-1], plain[-1]))
    sp = dict(cfg, output_dir=os.path.join(WORK, "orpo_sp"), sequence_parallel_degree=2)
    if run_two_ranks(sp, "sequence parallel", errs):
        compare_figures(errs, "sequence parallel", figures(sp["output_dir"]), plain)
    bad = os.path.join(WORK, "orpo_bad.jsonl")
    FX.write_jsonl(bad, [recs[0], {"chosen": [{"role": "user", "content": "q"}], "rejected": recs[0]["rejected"]}])
    q = run(dict(cfg, datasets=[{"path": bad, "type": "chat_template.argilla"}]), "--preprocess", expect_ok=False)
    if q.returncode == 0 or bad + ":2: chosen: expected a conversation" not in q.stderr:
        errs.append("an odd conversation: rc %d %s" % (q.returncode, q.stderr.strip()[-200:]))
    return errs, "loss rel %.2e, step 3 nll %.4f" % (worst, m[3]["nll_loss"] if 3 in m else float("nan"))


def kto_records(n, seed):
    """llama3.ultra records for rl: kto: prompt, completion, label (a fixed mix), some with a system."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        r = {"prompt": FX.sentence(rng, 3, 9), "completion": FX.sentence(rng, 2, 12), "label": i % 4 != 1}
        if i % 4 == 0:
            r["system"] = FX.sentence(rng, 2, 5)
        out.append(r)
    return out


def kto_reference(cfg, weights, tok, tgt, labels, steps, micro, accum, dp, lr, beta, wd, wu, max_grad_norm=1.0):
    """TRL's KTOTrainer in float64: per micro-batch of a rank (micro examples, rows sequence then KL
    sequence) the KL estimate mean(p - ref) over its KL rows, averaged over the dp ranks of that
    micro-step and clamped at 0 (no gradient); each example's loss by its label; the step's loss the
    mean of its units' means."""
    model, base = R.RefLlama(cfg, weights), R.RefLlama(cfg, weights)
    with torch.no_grad():
        ref, _ = logps(base, tok, tgt)
    params = [p for _, p in model.named_trainable_parameters()]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    out = []
    for s in range(steps):
        opt.zero_grad()
        total, kls, rc, rr, lc, lr_ = 0, [], [], [], [], []
        for a in range(accum):
            units = []
            for j in range(dp):
                e0 = ((s * accum + a) * dp + j) * micro
                rows = slice(2 * e0, 2 * (e0 + micro))
                lp, _ = logps(model, tok[rows], tgt[rows])
                units.append((e0, lp))
            kl = max(0.0, sum(float((lp[1::2] - ref[2 * e0 + 1:2 * (e0 + micro):2]).mean()) for e0, lp in units) / dp)
            for e0, lp in units:
                loss = 0
                for i in range(micro):
                    p, lrat = lp[2 * i], lp[2 * i] - ref[2 * (e0 + i)]
                    if labels[e0 + i]:
                        loss = loss + wd * (1 - torch.sigmoid(beta * (lrat - kl)))
                        rc.append(beta * lrat.item()), lc.append(p.item())
                    else:
                        loss = loss + wu * (1 - torch.sigmoid(beta * (kl - lrat)))
                        rr.append(beta * lrat.item()), lr_.append(p.item())
                total = total + loss / micro
                kls.append(kl)
        total = total / (accum * dp)
        total.backward()
        gn = R.grad_norm_clip(params, max_grad_norm)
        opt.step()
        mc, mr = sum(rc) / len(rc), sum(rr) / len(rr)
        out.append({"loss": total.item(), "grad_norm": gn, "rewards/chosen": mc, "rewards/rejected": mr,
                    "rewards/margins": mc - mr, "logps/chosen": sum(lc) / len(lc), "logps/rejected": sum(lr_) / len(lr_),
                    "kl": sum(kls) / len(kls)})
    return out


def case_kto():
    errs = []
    cfg_m, w = R_cfg_weights()
    data = os.path.join(WORK, "kto.jsonl")
    recs = kto_records(18, seed=31)
    FX.write_jsonl(data, recs)
    keys = ("loss", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen",
            "logps/rejected", "kl")
    cfg = base_cfg("kto", data, rl="kto", rl_beta=0.5, kto_desirable_weight=1.5, kto_undesirable_weight=0.5,
                   learning_rate=3e-2, micro_batch_size=3, sequence_len=96, shuffle_merged_datasets=False,
                   datasets=[{"path": data, "type": "llama3.ultra"}])
    p = run(cfg)
    d = prepared_dir(p.stdout)
    _, tok, tgt = read_rows(os.path.join(d, "train.bin"))
    lab = np.fromfile(os.path.join(d, "train_labels.bin"), dtype="<i4")
    labels = [bool(x) for x in lab[256:]]
    if lab[0] != 20241202 or labels != [r["label"] for r in recs]:
        errs.append("train_labels.bin: %r, want the records' labels" % (lab[:3],))
    comp = lambda row: [int(x) for x in tgt[row][tgt[row] >= 0]]  # noqa: E731 - a row's completion tokens
    for e in range(len(recs)):
        g0 = e // 3 * 3
        prev = g0 + (e - g0 - 1) % 3
        if comp(2 * e + 1) != comp(2 * prev) or list(tok[2 * e + 1][:tgt[2 * e + 1].tolist().index(comp(2 * e + 1)[0])]) \
                != list(tok[2 * e][:tgt[2 * e].tolist().index(comp(2 * e)[0])]):
            errs.append("example %d: its KL row is not its prompt with example %d's completion" % (e, prev))
            break
    ref = kto_reference(cfg_m, w, tok, tgt, labels, 3, 3, 2, 1, 3e-2, 0.5, 1.5, 0.5)
    m, _ = metrics(cfg["output_dir"])
    worst = compare_steps(errs, m, ref, keys=keys)
    if "preference   kto, beta 0.5, weights 1.5 / 0.5" not in p.stdout:
        errs.append("the box does not name KTO")
    dpc = dict(cfg, output_dir=os.path.join(WORK, "kto_dp"), gradient_accumulation_steps=1)
    if run_two_ranks(dpc, "data parallel", errs):
        want = kto_reference(cfg_m, w, tok, tgt, labels, 3, 3, 1, 2, 3e-2, 0.5, 1.5, 0.5)
        got, _ = metrics(dpc["output_dir"])
        worst = max(worst, compare_steps(errs, got, want, keys=keys))
    lp = os.path.join(d, "train_labels.bin")
    good = open(lp, "rb").read()
    for tag, bad_bytes in (("short", good[:-4]), ("a label of 2", good[:-4] + b"\x02\x00\x00\x00")):
        with open(lp, "wb") as f:
            f.write(bad_bytes)
        q = run(dict(cfg, output_dir=os.path.join(WORK, "kto_badlabels")), expect_ok=False)
        want = "not 18 labels long" if tag == "short" else "label 17 is 2"
        if q.returncode != 1 or lp + ": " + want not in q.stderr:
            errs.append("train_labels.bin %s: rc %d %s" % (tag, q.returncode, q.stderr.strip()[-200:]))
    with open(lp, "wb") as f:
        f.write(good)
    one = run(dict(cfg, micro_batch_size=1, output_dir=os.path.join(WORK, "kto_one")), "--plan", expect_ok=False)
    if one.returncode != 1 or "rl: kto needs micro_batch_size 2 or more" not in one.stderr:
        errs.append("micro_batch_size 1: rc %d %s" % (one.returncode, one.stderr.strip()[-200:]))
    bad = os.path.join(WORK, "kto_bad.jsonl")
    FX.write_jsonl(bad, [recs[0], dict(recs[1], label="yes")])
    q = run(dict(cfg, datasets=[{"path": bad, "type": "llama3.ultra"}]), "--preprocess", expect_ok=False)
    if q.returncode == 0 or bad + ":2: label: not a boolean" not in q.stderr:
        errs.append("a label that is not a boolean: rc %d %s" % (q.returncode, q.stderr.strip()[-200:]))
    return errs, "loss rel %.2e, step 3 kl %.4f" % (worst, m[3]["kl"] if 3 in m else float("nan"))


def figures(out):
    m, _ = metrics(out)
    return [(m[s]["loss"], m[s]["grad_norm"], m[s]["rewards/margins"]) for s in sorted(m)]


def case_memory_modes():
    errs = []
    data = os.path.join(WORK, "modes.jsonl")
    FX.write_jsonl(data, pairs(12, seed=9))
    plain = base_cfg("modes_plain", data, max_steps=3, tiled_mlp_shards=2)  # the MLP's row chunks of every mode
    run(plain)
    want = figures(plain["output_dir"])
    for i, extra in enumerate([{"gradient_checkpointing": True}, {"activation_offloading": True},
                               {"gradient_checkpointing": True, "tiled_mlp": True, "tiled_mlp_shards": 2},
                               {"offload_optimizer": True},
                               {"adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_target_linear": True,
                                "layer_offloading": True}]):
        c = dict(plain, output_dir=os.path.join(WORK, "modes_%d" % i), **extra)
        if "adapter" in extra:
            base = dict(plain, output_dir=os.path.join(WORK, "modes_lora"), **{k: v for k, v in extra.items()
                                                                               if k != "layer_offloading"})
            run(base)
            ref = figures(base["output_dir"])
        else:
            ref = want
        run(c)
        got = figures(c["output_dir"])
        if got != ref:
            errs.append("%s: %s vs %s" % (extra, got[-1], ref[-1]))
    return errs, "5 modes"


def case_resume():
    """checkpoint-2 resumed: steps 3-4 as the uninterrupted run's, with the reference read from the
    checkpoint's reference_logps.bin, and again with that file removed (computed from the
    starting weights before the checkpoint loads); a damaged file is refused."""
    errs = []
    data = os.path.join(WORK, "resume.jsonl")
    FX.write_jsonl(data, pairs(20, seed=11))
    full = base_cfg("resume_full", data, max_steps=4, save_steps=2, shuffle=True,
                    **{"adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_target_linear": True})
    run(full)
    a = figures(full["output_dir"])
    for tag in ("read", "computed"):
        part = dict(full, output_dir=os.path.join(WORK, "resume_" + tag))
        run(part, "--set", "max_steps=2")
        ck = os.path.join(part["output_dir"], "checkpoint-2")
        if not os.path.exists(os.path.join(ck, "reference_logps.bin")):
            errs.append("checkpoint-2 holds no reference_logps.bin")
        if tag == "computed":
            os.remove(os.path.join(ck, "reference_logps.bin"))
        p = run(part, "--set", "resume_from_checkpoint=auto")
        b = figures(part["output_dir"])
        if a[2:] != b[-2:]:
            errs.append("%s: steps 3-4 differ: %s vs %s" % (tag, a[2:], b[-2:]))
        want = "read from %s/reference_logps.bin" % ck if tag == "read" else "from the starting weights"
        if want not in p.stdout or "resumed from" not in p.stdout:
            errs.append("%s: no '%s' line" % (tag, want))
    with open(os.path.join(full["output_dir"], "checkpoint-2", "reference_logps.bin"), "r+b") as f:
        f.write(b"XXXX")
    p = run(full, "--set", "resume_from_checkpoint=%s" % os.path.join(full["output_dir"], "checkpoint-2"),
            expect_ok=False)
    if p.returncode != 1 or "reference_logps.bin: not a reference_logps.bin" not in p.stderr:
        errs.append("a damaged reference_logps.bin: rc %d %s" % (p.returncode, p.stderr.strip()[-200:]))
    return errs, "steps 3-4 identical, reference read and recomputed"


def case_ranks():
    """Two data-parallel ranks (plain and ZeRO-3) each take one pair of every micro-batch, or two
    sequence-parallel ranks half of every row: the losses and rewards of one process with both
    pairs (the gradients sum in another order)."""
    import shutil as sh
    if not sh.which("mpirun"):
        return [], "SKIP: no mpirun"
    errs = []
    data = os.path.join(WORK, "ranks.jsonl")
    FX.write_jsonl(data, pairs(16, seed=13))
    one = base_cfg("ranks_one", data, max_steps=3, micro_batch_size=2, eval_steps=3, val_set_size=4)
    run(one)
    want = figures(one["output_dir"])
    worst = 0.0
    for tag, extra in (("dp", {"micro_batch_size": 1}), ("zero3", {"micro_batch_size": 1, "zero_stage": 3}),
                       ("seqpar", {"sequence_parallel_degree": 2})):
        c = dict(one, output_dir=os.path.join(WORK, "ranks_" + tag), **extra)
        if not run_two_ranks(c, tag, errs):
            continue
        worst = max(worst, compare_figures(errs, tag, figures(c["output_dir"]), want))
        _, e1 = metrics(c["output_dir"])
        _, e0 = metrics(one["output_dir"])
        if 3 not in e1:
            errs.append("%s: no eval" % tag)
        else:
            compare(errs, tag + " eval_loss", e1[3]["eval_loss"], e0[3]["eval_loss"])
    return errs, "worst rel %.1e" % worst


def case_refusals():
    errs = []
    data = os.path.join(WORK, "ref.jsonl")
    FX.write_jsonl(data, pairs(6, seed=2))
    c = base_cfg("refusals", data, max_steps=1)
    bad = [({"rl": "grpo"}, "rl: grpo is not implemented"),
           ({"rl": "orpo"}, "rl: orpo reads type chat_template.argilla"),
           ({"sample_packing": True}, "sample_packing does not work with rl"),
           ({"rpo_alpha": 0.5}, "rpo_alpha"),
           ({"dpo_loss_type": ["aot"]}, "'aot' is not implemented"),
           ({"dpo_loss_type": ["sigmoid", "sft"], "dpo_loss_weights": [1.0]}, "1 weights for 2 loss types"),
           ({"dpo_use_weighting": True}, "WPO"),
           ({"datasets": None, "train_data": "x.bin"}, "reads preference pairs from datasets"),
           ({"adapter": "lora", "lora_target_linear": True, "lora_model_dir": WORK}, "lora_model_dir"),
           ({"datasets": [{"path": data, "type": "alpaca"}]}, "not a preference format")]
    for extra, want in bad:
        cfg = dict(c, **extra)
        if cfg.get("datasets") is None:
            cfg.pop("datasets")
            cfg.pop("dataset_prepared_path")
        p = run(cfg, expect_ok=False)
        lines = [l for l in p.stderr.splitlines() if l.startswith("error")]
        if p.returncode != 1 or not lines or want not in p.stderr:
            errs.append("%s: rc %d, %s" % (extra, p.returncode, p.stderr.strip()[-200:]))
    # bad records: one line naming the file, its line and the field
    for i, (rec, want) in enumerate([({"question": "q", "chosen": "c"}, ":2: rejected: missing"),
                                     ({"question": "q", "chosen": 5, "rejected": "r"}, ":2: chosen: expected a string"),
                                     ({"prompt": "", "chosen": "c", "rejected": "r"}, ":2: the prompt text is empty")]):
        bad_data = os.path.join(WORK, "bad%d.jsonl" % i)
        FX.write_jsonl(bad_data, [{"question": "q", "prompt": "p", "chosen": "c", "rejected": "r"}, rec])
        typ = "passthrough" if "prompt" in rec else "llama3.intel"
        p = run(dict(c, datasets=[{"path": bad_data, "type": typ}]), "--preprocess", expect_ok=False)
        lines = [l for l in p.stderr.splitlines() if l.startswith("error")]
        if p.returncode == 0 or not lines or bad_data + want not in lines[0]:
            errs.append("bad record %d: rc %d, %s" % (i, p.returncode, p.stderr.strip()[-200:]))
    # a prepared file whose rejected row lost its targets (the header's count kept consistent):
    # refused at open, naming the row and the pair
    p = run(c, "--preprocess")
    path = os.path.join(p.stdout.strip().split()[-1], "train.bin")
    a = np.fromfile(path, dtype="<i4")
    T = int(a[2])
    tg = a[256 + 3 * T + T:256 + 3 * T + 2 * T]  # row 1's targets
    a[7] -= int((tg >= 0).sum())
    tg[:] = -1
    a.tofile(path)
    p = run(c, expect_ok=False)
    if p.returncode != 1 or "row 1 is the rejected completion of pair 0 but has no target token" not in p.stderr:
        errs.append("an untrained completion: rc %d %s" % (p.returncode, p.stderr.strip()[-200:]))
    # a note, once, for label smoothing without the robust loss (TRL 1.8's sigmoid ignores it)
    p = run(dict(c, dpo_label_smoothing=0.1), "--plan", expect_ok=False)
    if p.returncode or p.stdout.count("dpo_label_smoothing 0.1 has no effect") != 1:
        errs.append("label smoothing note: rc %d, %d notes" % (p.returncode, p.stdout.count("dpo_label_smoothing")))
    return errs, "%d refused" % len(bad)


def begin(args, work):
    global ARGS, WORK
    ARGS, WORK = args, work
    torch.set_num_threads(2)


def main():
    cases = [("rows", case_rows), ("formats", case_formats), ("sigmoid_full", case_sigmoid_full),
             ("mixed_lora", case_mixed_lora), ("ipo", case_ipo), ("simpo", case_simpo), ("orpo", case_orpo), ("kto", case_kto),
             ("memory_modes", case_memory_modes),
             ("resume", case_resume), ("ranks", case_ranks), ("refusals", case_refusals)]
    harness.case_main("dpo", cases, begin)


if __name__ == "__main__":
    main()
