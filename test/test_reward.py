#!/usr/bin/python3
"""Reward models (reward_model: true; llmc/preference.h's "reward") and process reward models
(process_reward_model: true) against a float64 PyTorch reference written from TRL 1.8's RewardTrainer and
PRMTrainer and transformers' ...ForSequenceClassification / ...ForTokenClassification (test/llama_ref.py's
model with its score head).

    /usr/bin/python3 test/test_reward.py --bin build/train_llama [--only CASE]

Cases:
  rows          bradley_terry.chat_template records (system, input, chosen, rejected) as Axolotl's
                strategy builds them, spelled out in Llama 3's format: per pair a chosen and a
                rejected row, the whole conversation tokenized, cut to sequence_len; each row's one
                target at the last token that is not the pad token (with pad_token <|eot_id|>,
                the token before the final <|eot_id|>); drop_system_message; the scored-rows flag.
  train         a full fine-tune from a LlamaForSequenceClassification base: per-step loss
                (-log sigmoid(rc - rr) + center (rc + rr)^2, a mean per micro-batch, averaged),
                grad norm, accuracy, margin, mean/min/max_reward against the reference, weight decay on
                score.weight; eval; the saved model (architectures, id2label, score.weight equal to
                the reference's, no lm_head) trains on as a base_model.
  lora          LoRA (the adapters and score.weight train, PEFT's SEQ_CLS) against the reference, the
                adapter as PEFT writes it (task_type SEQ_CLS, modules_to_save classifier and score),
                read back by lora_model_dir bit for bit;
                QLoRA with layer_offloading as plain QLoRA, bit for bit.
  families      Qwen 3, Gemma 2 (tied embedding; the score not soft-capped) and Gemma 3 text against the
                reference; their saved ...ForSequenceClassification names.
  causal_base   a causal LM as base_model: the note, score.weight from N(0, initializer_range)
                drawn by seed (the same bits twice, others with another seed), lm_head not saved.
  memory_modes  gradient checkpointing, activation offloading, tiled MLP, offload_optimizer: the
                plain run's figures bit for bit; a resume from checkpoint-2 continues identically.
  ranks         mpirun -np 2 data parallel (one pair a rank; plain and ZeRO-3, whose head unit holds
                score.weight), and sequence parallel (each row's score position in one rank's half):
                one process's losses, margins and min/max rewards.
  prm_rows      process_reward_model: stepwise_supervised records (prompt, completions, labels) as
                Axolotl's strategy tokenizes them, spelled out: BOS, the prompt, each step with the
                step_separator's tokens after it, the label (0/1) at the step's last token, at its
                own position (flag 8); train_on_last_step_only, max_completion_length, the cut.
  prm_train     a full fine-tune from a LlamaForTokenClassification base (score.weight and
                score.bias) against the reference: loss (the step's labelled tokens' mean
                cross-entropy, accumulation 2) and grad norm with weight decay, eval_loss and
                eval_accuracy, the saved model; LoRA (TOKEN_CLS; the head trains) against it too.
  prm_modes     gradient checkpointing + offloading and tiled MLP bit for bit, a causal base (the
                head from N(0, 0.02) and 0, a note), two ranks (data and sequence parallel).
  refusals      reward_model with rl, num_labels 2, a classifier model_type without reward_model, a
                sequence classifier as base_model without it, lm_head in lora_modules_to_save,
                another dataset type; for process reward models another dataset
                type, num_labels 3, packing, a sequence classifier base, bad records;
                process_reward_model, sample_packing; scored rows in a dpo run: one error line.
"""
import json
import os
import shutil
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
import test_dpo as D  # noqa: E402  (its runner, metrics and row readers; D.ARGS / D.WORK set in main)

SCORED = 4  # rows.h ROWS_FLAG_SCORED


def records(n, seed, system_every=3):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        r = {"input": FX.sentence(rng, 3, 9), "chosen": FX.sentence(rng, 2, 12), "rejected": FX.sentence(rng, 2, 12),
             "system": FX.sentence(rng, 2, 5) if system_every and i % system_every == 0 else ""}
        out.append(r)
    return out


def seqcls_dir(src=None, arch="LlamaForSequenceClassification", labels=1):
    """A causal model (src, else D.model_dir()'s) as a classifier: its config with architectures
    [arch] and id2label, its weights with a score.weight (std 0.3; labels rows) in lm_head's place
    (the embedding stays for a tied model) and for a token classifier a score.bias, its tokenizer."""
    src = src or D.model_dir()
    d = src + "_" + arch
    if os.path.exists(os.path.join(d, "config.json")):
        return d
    shutil.copytree(src, d)
    cfg = json.load(open(os.path.join(src, "config.json")))
    w = read_tensors(src)
    cfg = dict(cfg, architectures=[arch], id2label={str(i): "LABEL_%d" % i for i in range(labels)},
               label2id={"LABEL_%d" % i: i for i in range(labels)})
    w = {k: v for k, v in w.items() if k != "lm_head.weight"}
    rng = np.random.default_rng(7)
    w["score.weight"] = rng.normal(0, 0.3, size=(labels, cfg["hidden_size"])).astype(np.float32)
    if arch.endswith("ForTokenClassification"):
        w["score.bias"] = rng.normal(0, 0.1, size=(labels,)).astype(np.float32)
    R.save_hf_dir(d, cfg, w)
    return d


def reward_cfg(out, data, base=None, **kw):
    c = D.base_cfg(out, data, base_model=base or seqcls_dir(), reward_model=True, num_labels=1,
                   model_type="AutoModelForSequenceClassification", chat_template="llama3",
                   datasets=[{"path": data, "type": "bradley_terry.chat_template"}])
    c.pop("rl")
    c.update(kw)
    return c


def score_pos(tgt):
    return [int(np.flatnonzero(row >= 0)[0]) if (row >= 0).any() else -1 for row in tgt]


def scores(model, tok, pos):
    s = model(torch.tensor(tok, dtype=torch.long))[..., 0]
    return s[torch.arange(len(tok)), torch.tensor(pos)]


def bt(s, center):
    rc, rr = s[0::2], s[1::2]
    return -F.logsigmoid(rc - rr).mean() + center * ((rc + rr) ** 2).mean()


def reference(cfg, weights, tok, tgt, steps, pairs_per_step, micro, lr, wd, center, eval_rows=None, lora=None,
              warmup=0):
    """TRL's RewardTrainer in float64: AdamW (decay on all but biases and norms) over consecutive
    pairs, each step's loss the mean of its micro-batches' (micro pairs each) losses. lora: the
    adapters and score.weight train (PEFT's SEQ_CLS: score in modules_to_save), the rest is frozen."""
    model = R.RefLlama(cfg, weights, lora=lora)
    named = model.named_trainable_parameters()
    if lora is not None:
        named = named + [("score.weight", model.p("score.weight").requires_grad_(True))]
    groups = [{"params": [p for n, p in named if R.is_decay_param(n)], "weight_decay": wd},
              {"params": [p for n, p in named if not R.is_decay_param(n)], "weight_decay": 0.0}]
    params = [p for _, p in named]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    pos = score_pos(tgt)
    out = []
    for st in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * (st / warmup if st < warmup else 1.0)
        opt.zero_grad()
        r0 = st * pairs_per_step * 2
        rows = slice(r0, r0 + pairs_per_step * 2)
        loss = D.unit_mean(rows, micro, lambda u: bt(scores(model, tok[u], pos[u]), center))
        loss.backward()
        gn = R.grad_norm_clip(params, 1.0)
        with torch.no_grad():
            s = scores(model, tok[rows], pos[rows])
        opt.step()
        rc, rr = s[0::2], s[1::2]
        out.append({"loss": loss.item(), "grad_norm": gn, "accuracy": (rc > rr).double().mean().item(),
                    "margin": (rc - rr).mean().item(), "mean_reward": s.mean().item(), "min_reward": s.min().item(),
                    "max_reward": s.max().item(),
                    "rewards/chosen": rc.mean().item(), "rewards/rejected": rr.mean().item()})
    ev = None
    if eval_rows is not None:
        et, eg = eval_rows
        with torch.no_grad():
            ep = score_pos(eg)
            loss = D.unit_mean(slice(0, len(et)), micro, lambda u: bt(scores(model, et[u], ep[u]), center))
            s = scores(model, et, ep)
        ev = {"loss": loss.item(), "margin": (s[0::2] - s[1::2]).mean().item()}
    return out, ev, model


def figures(out):
    m, _ = D.metrics(out)
    return [(m[s]["loss"], m[s]["grad_norm"], m[s]["margin"]) for s in sorted(m)]


def read_tensors(d):
    return R.read_safetensors(os.path.join(d, "model.safetensors"))


# ---- cases -----------------------------------------------------------------------------------

def case_rows():
    from transformers import AutoTokenizer
    errs = []
    tk = AutoTokenizer.from_pretrained(D.model_dir())
    data = os.path.join(D.WORK, "rows.jsonl")
    recs = records(6, seed=1)
    recs[5]["chosen"] = " ".join(["word"] * 80)  # longer than sequence_len: cut
    FX.write_jsonl(data, recs)
    hdr = lambda role, text: "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>" % (role, text.strip())  # noqa: E731
    drop = {"datasets": [{"path": data, "type": "bradley_terry.chat_template", "drop_system_message": True}]}
    for tag, extra, pad in (("pad end_of_text", {}, "<|end_of_text|>"),
                            ("pad eot", {"special_tokens": {"pad_token": "<|eot_id|>"}}, "<|eot_id|>"),
                            ("drop_system_message", drop, "<|end_of_text|>")):
        c = reward_cfg("rows", data, shuffle_merged_datasets=False, **extra)
        p = D.run(c, "--preprocess")
        d = p.stdout.strip().split()[-1]
        h, tok, tgt = D.read_rows(os.path.join(d, "train.bin"))
        T = int(h[2])
        if int(h[4]) != 2 | SCORED:
            errs.append("%s: header flags %d, want paired and scored" % (tag, int(h[4])))
        if tok.shape[0] != 12:
            errs.append("%s: %d rows for 6 pairs" % (tag, tok.shape[0]))
            continue
        pad_id = tk.convert_tokens_to_ids(pad)
        for k, r in enumerate(recs):
            system = r["system"] and tag != "drop_system_message"
            head = "<|begin_of_text|>" + (hdr("system", r["system"]) if system else "") + hdr("user", r["input"])
            for row, ans in ((2 * k, r["chosen"]), (2 * k + 1, r["rejected"])):
                want = tk(head + hdr("assistant", ans), add_special_tokens=False)["input_ids"][:T]
                if list(tok[row, :len(want)]) != want:
                    errs.append("%s: record %d row %d: %r" % (tag, k, row, tk.decode(tok[row, :len(want)])))
                    continue
                at = max(j for j, x in enumerate(want) if x != pad_id)
                marks = list(np.flatnonzero(tgt[row] >= 0))
                if marks != [at] or tgt[row, at] != want[at]:
                    errs.append("%s: record %d row %d: targets at %s, want one at %d (of %d tokens)" % (
                        tag, k, row, marks, at, len(want)))
                if tag == "pad eot" and len(want) < T and at != len(want) - 2:
                    errs.append("%s: record %d row %d: the score is read at %d, not before the final <|eot_id|>" % (
                        tag, k, row, at))
    return errs, "12 rows, two pad tokens, drop_system_message"


def case_train():
    errs = []
    cfg_m = json.load(open(os.path.join(seqcls_dir(), "config.json")))
    w = read_tensors(seqcls_dir())
    data = os.path.join(D.WORK, "train.jsonl")
    FX.write_jsonl(data, records(16, seed=3))
    c = reward_cfg("train", data, center_rewards_coefficient=0.05, weight_decay=0.1, learning_rate=5e-3,
                   shuffle_merged_datasets=False, val_set_size=4, eval_steps=3)
    p = D.run(c)
    d = D.prepared_dir(p.stdout)
    _, tok, tgt = D.read_rows(os.path.join(d, "train.bin"))
    _, et, eg = D.read_rows(os.path.join(d, "eval.bin"))
    ref, eref, model = reference(cfg_m, w, tok, tgt, 3, 4, 2, 5e-3, 0.1, 0.05, eval_rows=(et, eg))
    m, e = D.metrics(c["output_dir"])
    worst = D.compare_steps(errs, m, ref, keys=("loss", "grad_norm", "accuracy", "margin", "mean_reward",
                                                "min_reward", "max_reward", "rewards/chosen", "rewards/rejected"))
    if 3 not in e:
        errs.append("no eval at step 3")
    else:
        D.compare(errs, "eval_loss", e[3]["eval_loss"], eref["loss"])
        D.compare(errs, "eval_margin", e[3]["eval_margin"], eref["margin"], atol=1e-6)
    if "Bradley-Terry reward, center 0.05" not in p.stdout or "reference:" in p.stdout:
        errs.append("the box does not name the reward model, or a reference pass ran")
    out = c["output_dir"]
    cj = json.load(open(os.path.join(out, "config.json")))
    if cj.get("architectures") != ["LlamaForSequenceClassification"] or cj.get("id2label") != {"0": "LABEL_0"}:
        errs.append("saved config.json: %s %s" % (cj.get("architectures"), cj.get("id2label")))
    got = read_tensors(out)
    if "lm_head.weight" in got or "score.weight" not in got:
        errs.append("saved tensors: %s" % sorted(k for k in got if "layers" not in k))
    else:
        want = model.p("score.weight").detach().numpy()
        diff = float(np.abs(got["score.weight"] - want).max())
        if diff > 1e-5 * max(1.0, float(np.abs(want).max())):
            errs.append("saved score.weight differs from the reference's by %.2e" % diff)
    more = dict(c, base_model=out, output_dir=os.path.join(D.WORK, "train_more"), max_steps=1, val_set_size=0,
                eval_steps=0)
    q = D.run(more)
    if "is a causal LM" in q.stdout:
        errs.append("the saved reward model was read as a causal LM")
    return errs, "loss rel %.2e, step 3 loss %.6f" % (worst, m[3]["loss"] if 3 in m else float("nan"))


def case_lora():
    """LoRA from a classifier base (initial adapters read from checkpoint-1, whose lr is 0): the
    adapters and score.weight train, against the reference; the adapter directory as PEFT writes a
    SEQ_CLS one (task_type, modules_to_save classifier and score, base_model.model.score.weight);
    QLoRA with layer_offloading gives plain QLoRA's figures bit for bit."""
    errs = []
    cfg_m = json.load(open(os.path.join(seqcls_dir(), "config.json")))
    w = read_tensors(seqcls_dir())
    data = os.path.join(D.WORK, "lora.jsonl")
    FX.write_jsonl(data, records(16, seed=19))
    lora = {"adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_target_linear": True}
    c = reward_cfg("lora", data, max_steps=4, learning_rate=2e-2, lr_scheduler="constant_with_warmup", warmup_steps=1,
                   save_steps=1, center_rewards_coefficient=0.1, shuffle_merged_datasets=False, **lora)
    p = D.run(c)
    _, tok, tgt = D.read_rows(os.path.join(D.prepared_dir(p.stdout), "train.bin"))
    spec = R.load_adapter_dir(os.path.join(c["output_dir"], "checkpoint-1"))
    score = spec["weights"].pop("score.weight", None)
    if score is None or not np.array_equal(score, w["score.weight"]):
        errs.append("checkpoint-1's adapter lacks the base's score.weight")
    ref, _, model = reference(cfg_m, w, tok, tgt, 4, 4, 2, 2e-2, 0.0, 0.1, lora=spec, warmup=1)
    m, _ = D.metrics(c["output_dir"])
    worst = D.compare_steps(errs, m, ref, keys=("loss", "grad_norm", "accuracy", "margin", "mean_reward"))
    conf = json.load(open(os.path.join(c["output_dir"], "adapter_config.json")))
    if conf.get("task_type") != "SEQ_CLS" or conf.get("modules_to_save") != ["classifier", "score"]:
        errs.append("adapter_config.json: task_type %s, modules_to_save %s" % (conf.get("task_type"),
                                                                                conf.get("modules_to_save")))
    final = read_tensors(c["output_dir"]) if os.path.exists(os.path.join(c["output_dir"], "model.safetensors")) else None
    got = R.read_safetensors(os.path.join(c["output_dir"], "adapter_model.safetensors"))
    want = model.p("score.weight").detach().numpy()
    if final is not None or "base_model.model.score.weight" not in got or \
            float(np.abs(got["base_model.model.score.weight"] - want).max()) > 1e-5:
        errs.append("the adapter's trained score.weight is not the reference's (or a full model was saved)")
    if not adapter_reloads(c):
        errs.append("lora_model_dir: the adapter (and score.weight) did not load back bit for bit")
    q = dict(c, output_dir=os.path.join(D.WORK, "qlora"), adapter="qlora", load_in_4bit=True, save_steps=0)
    qs = dict(q, output_dir=os.path.join(D.WORK, "qlora_stream"), layer_offloading=True)
    D.run(q)
    D.run(qs)
    if figures(q["output_dir"]) != figures(qs["output_dir"]):
        errs.append("QLoRA with layer_offloading: %s vs %s" % (figures(qs["output_dir"])[-1], figures(q["output_dir"])[-1]))
    return errs, "loss rel %.2e over 4 steps" % worst


def adapter_reloads(c):
    """c's final adapter as lora_model_dir of a run at learning rate 0: its adapter, head included,
    comes out bit for bit."""
    d = dict(c, lora_model_dir=c["output_dir"], output_dir=c["output_dir"] + "_again", learning_rate=0.0, max_steps=1,
             val_set_size=0, eval_steps=0, save_steps=0)
    D.run(d)
    a, b = (R.read_safetensors(os.path.join(x, "adapter_model.safetensors")) for x in (c["output_dir"], d["output_dir"]))
    return sorted(a) == sorted(b) and any("score" in k for k in a) and all(np.array_equal(a[k], b[k]) for k in a)


def case_families():
    """Qwen 3 (q/k norms), Gemma 2 (tied embedding, soft-capped scores; the classifier's score is
    not capped, as transformers' GenericForSequenceClassification) and Gemma 3 text
    (Gemma3TextForSequenceClassification) against the reference, and their saved architectures."""
    errs = []
    data = os.path.join(D.WORK, "fam.jsonl")
    FX.write_jsonl(data, records(8, seed=17))
    worst = 0.0
    for mt, arch in (("qwen3", "Qwen3ForSequenceClassification"), ("gemma2", "Gemma2ForSequenceClassification"),
                     ("gemma3_text", "Gemma3TextForSequenceClassification")):
        src = os.path.join(D.WORK, "fam_" + mt)
        FX.make_model(src, "llama3", seed=6, family=mt)
        base = seqcls_dir(src, arch)
        c = reward_cfg("fam_out_" + mt, data, base=base, max_steps=2, learning_rate=5e-3, shuffle_merged_datasets=False)
        p = D.run(c)
        _, tok, tgt = D.read_rows(os.path.join(D.prepared_dir(p.stdout), "train.bin"))
        ref, _, _ = reference(json.load(open(os.path.join(base, "config.json"))), read_tensors(base), tok, tgt, 2, 4, 2,
                              5e-3, 0.0, 0.0)
        m, _ = D.metrics(c["output_dir"])
        e = []
        worst = max(worst, D.compare_steps(e, m, ref, keys=("loss", "grad_norm")))
        for st, r in enumerate(ref, 1):  # a difference of float32 scores (Gemma's embeddings scaled by sqrt(C))
            if st in m:
                D.compare(e, "step %d margin" % st, m[st]["margin"], r["margin"], atol=1e-5)
        errs += ["%s: %s" % (mt, x) for x in e]
        got = json.load(open(os.path.join(c["output_dir"], "config.json"))).get("architectures")
        if got != [arch]:
            errs.append("%s: saved architectures %s" % (mt, got))
    return errs, "3 families, loss rel %.2e" % worst


def case_causal_base():
    errs = []
    data = os.path.join(D.WORK, "causal.jsonl")
    FX.write_jsonl(data, records(8, seed=5))
    runs = {}
    for tag, seed in (("a", 5), ("b", 5), ("c", 6)):
        c = reward_cfg("causal_" + tag, data, base=D.model_dir(), max_steps=1, learning_rate=0.0, seed=seed)
        p = D.run(c)
        if "is a causal LM: the reward model's score.weight [1, 64] starts from N(0, 0.02)" not in p.stdout:
            errs.append("%s: no note on the score head's init" % tag)
        runs[tag] = read_tensors(c["output_dir"])
    a, b, c_ = (runs[k]["score.weight"] for k in "abc")
    if not np.array_equal(a, b) or np.array_equal(a, c_):
        errs.append("score.weight: same seed equal %s, other seed equal %s" % (np.array_equal(a, b), np.array_equal(a, c_)))
    sd = float(a.std())
    if not (0.012 < sd < 0.028) or abs(float(a.mean())) > 0.01:
        errs.append("score.weight: mean %.4f std %.4f, want N(0, 0.02)" % (float(a.mean()), sd))
    if "lm_head.weight" in runs["a"]:
        errs.append("lm_head.weight saved with the reward model")
    return errs, "init std %.4f" % sd


def case_memory_modes():
    errs = []
    data = os.path.join(D.WORK, "modes.jsonl")
    FX.write_jsonl(data, records(16, seed=9))
    plain = reward_cfg("modes_plain", data, max_steps=4, tiled_mlp_shards=2, center_rewards_coefficient=0.01,
                       save_steps=2)
    D.run(plain)
    want = figures(plain["output_dir"])
    for i, extra in enumerate([{"gradient_checkpointing": True}, {"activation_offloading": True},
                               {"gradient_checkpointing": True, "tiled_mlp": True, "tiled_mlp_shards": 2},
                               {"offload_optimizer": True}]):
        c = dict(plain, output_dir=os.path.join(D.WORK, "modes_%d" % i), save_steps=0, **extra)
        D.run(c)
        got = figures(c["output_dir"])
        if got != want:
            errs.append("%s: %s vs %s" % (extra, got[-1], want[-1]))
    part = dict(plain, output_dir=os.path.join(D.WORK, "modes_resume"))
    D.run(part, "--set", "max_steps=2")
    p = D.run(part, "--set", "resume_from_checkpoint=auto")
    got = figures(part["output_dir"])
    if "resumed from" not in p.stdout or got[-2:] != want[2:]:
        errs.append("resume: steps 3-4 %s vs %s" % (got[-2:], want[2:]))
    return errs, "4 modes and a resume"


def case_ranks():
    if not shutil.which("mpirun"):
        return [], "SKIP: no mpirun"
    errs = []
    data = os.path.join(D.WORK, "ranks.jsonl")
    FX.write_jsonl(data, records(16, seed=13))
    one = reward_cfg("ranks_one", data, max_steps=3, micro_batch_size=2, center_rewards_coefficient=0.02)
    D.run(one)
    want = figures(one["output_dir"])
    worst = 0.0
    for tag, extra in (("dp", {"micro_batch_size": 1}), ("zero3", {"micro_batch_size": 1, "zero_stage": 3}),
                       ("seqpar", {"sequence_parallel_degree": 2})):
        c = dict(one, output_dir=os.path.join(D.WORK, "ranks_" + tag), **extra)
        if D.run_two_ranks(c, tag, errs):
            got = figures(c["output_dir"])
            m1, m0 = D.metrics(c["output_dir"])[0], D.metrics(one["output_dir"])[0]
            for s_ in m0:  # the extremes over both ranks' scores
                for k in ("min_reward", "max_reward"):
                    D.compare(errs, "%s step %d %s" % (tag, s_, k), m1.get(s_, {}).get(k, float("nan")), m0[s_][k],
                              atol=2e-6)
            for s, (a, b) in enumerate(zip(got, want), 1):
                for i, name in enumerate(("loss", "grad_norm", "margin")):
                    # the margin is a difference of float32 scores of about 1 summed in another order
                    D.compare(errs, "%s step %d %s" % (tag, s, name), a[i], b[i], rtol=1e-5,
                              atol=2e-6 if name == "margin" else 1e-7)
                    if name != "margin":
                        worst = max(worst, D.rel(a[i], b[i]))
    return errs, "loss and grad norm worst rel %.1e" % worst


# ---- process reward models (process_reward_model: TRL's PRMTrainer) ------------------------------

def prm_records(n, seed):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(1, 5))
        out.append({"prompt": FX.sentence(rng, 3, 9), "completions": [FX.sentence(rng, 2, 7) for _ in range(k)],
                    "labels": [bool(rng.integers(0, 2)) for _ in range(k)]})
    return out


def tokcls_dir():
    return seqcls_dir(arch="LlamaForTokenClassification", labels=2)


def prm_cfg(out, data, base=None, ds=None, **kw):
    c = D.base_cfg(out, data, base_model=base or tokcls_dir(), process_reward_model=True, num_labels=2,
                   model_type="AutoModelForTokenClassification",
                   datasets=[dict({"path": data, "type": "stepwise_supervised"}, **(ds or {}))])
    c.pop("rl")
    c.update(kw)
    return c


def prm_reference(cfg, weights, tok, tgt, steps, rows_per_step, lr, wd, lora=None, warmup=0, eval_rows=None):
    """TRL's PRMTrainer in float64 as this trainer computes it: each step's loss the cross-entropy
    of the token classifier (score.weight h + score.bias) over the step's labelled tokens (a mean
    over all of them); lora: the adapters, score.weight and score.bias train."""
    model = R.RefLlama(cfg, weights, lora=lora)
    named = model.named_trainable_parameters()
    if lora is not None:
        named = named + [(k, model.p(k).requires_grad_(True)) for k in ("score.weight", "score.bias")]
    groups = [{"params": [p for n, p in named if R.is_decay_param(n)], "weight_decay": wd},
              {"params": [p for n, p in named if not R.is_decay_param(n)], "weight_decay": 0.0}]
    params = [p for _, p in named]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)

    def ce(t, g):
        logits = model(torch.tensor(t, dtype=torch.long))
        lab = torch.tensor(g, dtype=torch.long)
        mask = lab >= 0
        return F.cross_entropy(logits[mask], lab[mask]), logits[mask].argmax(-1) == lab[mask]
    out = []
    for st in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * (st / warmup if st < warmup else 1.0)
        opt.zero_grad()
        rows = slice(st * rows_per_step, (st + 1) * rows_per_step)
        loss, _ = ce(tok[rows], tgt[rows])
        loss.backward()
        gn = R.grad_norm_clip(params, 1.0)
        opt.step()
        out.append({"loss": loss.item(), "grad_norm": gn})
    ev = None
    if eval_rows is not None:
        with torch.no_grad():
            loss, hit = ce(*eval_rows)
        ev = {"loss": loss.item(), "accuracy": hit.double().mean().item()}
    return out, ev, model


def case_prm_rows():
    from transformers import AutoTokenizer
    errs = []
    tk = AutoTokenizer.from_pretrained(D.model_dir())
    data = os.path.join(D.WORK, "prm_rows.jsonl")
    recs = prm_records(6, seed=1)
    recs[5]["completions"][0] = " ".join(["word"] * 70)  # past sequence_len: cut
    FX.write_jsonl(data, recs)
    checked = 0
    for tag, ds in (("every step", {"step_separator": "\n\n"}), ("last step only", {"train_on_last_step_only": True}),
                    ("max_completion_length", {"max_completion_length": 5})):
        p = D.run(prm_cfg("prm_rows", data, ds=ds, shuffle_merged_datasets=False), "--preprocess")
        h, tok, tgt = D.read_rows(os.path.join(p.stdout.strip().split()[-1], "train.bin"))
        T = int(h[2])
        if int(h[4]) != 8:
            errs.append("%s: header flags %d, want 8 (token labels)" % (tag, int(h[4])))
        sep = tk(ds.get("step_separator", "\n"), add_special_tokens=False)["input_ids"]
        for k, r in enumerate(recs):
            ids, lab = [], []
            for j, (text, good) in enumerate(zip(r["completions"], r["labels"])):
                s_ = tk(text, add_special_tokens=False)["input_ids"] + sep
                last = j == len(r["completions"]) - 1
                ids += s_
                lab += [-1] * (len(s_) - 1) + [int(good) if last or not ds.get("train_on_last_step_only") else -1]
            if ds.get("max_completion_length"):
                ids, lab = ids[:5], lab[:5]
            pr = [tk.bos_token_id] + tk(r["prompt"], add_special_tokens=False)["input_ids"]
            want, wl = (pr + ids)[:T], ([-1] * len(pr) + lab)[:T]
            if list(tok[k, :len(want)]) != want or list(tgt[k, :len(want)]) != wl or (tgt[k, len(want):] >= 0).any():
                errs.append("%s: record %d: %r / %s, want %s" % (tag, k, tk.decode(tok[k, :len(want)]),
                                                                 list(tgt[k, :len(want)]), wl))
            checked += 1
    return errs, "%d rows, 3 ways" % checked


def case_prm_train():
    errs = []
    cfg_m = json.load(open(os.path.join(tokcls_dir(), "config.json")))
    w = read_tensors(tokcls_dir())
    data = os.path.join(D.WORK, "prm_train.jsonl")
    FX.write_jsonl(data, prm_records(16, seed=3))
    c = prm_cfg("prm_train", data, weight_decay=0.1, learning_rate=5e-3, shuffle_merged_datasets=False, val_set_size=4,
                eval_steps=3)
    p = D.run(c)
    d = D.prepared_dir(p.stdout)
    _, tok, tgt = D.read_rows(os.path.join(d, "train.bin"))
    _, et, eg = D.read_rows(os.path.join(d, "eval.bin"))
    ref, eref, model = prm_reference(cfg_m, w, tok, tgt, 3, 4, 5e-3, 0.1, eval_rows=(et, eg))
    m, e = D.metrics(c["output_dir"])
    worst = D.compare_steps(errs, m, ref, keys=("loss", "grad_norm"))
    if 3 not in e:
        errs.append("no eval at step 3")
    else:
        D.compare(errs, "eval_loss", e[3]["eval_loss"], eref["loss"])
        D.compare(errs, "eval_accuracy", e[3]["eval_accuracy"], eref["accuracy"], atol=1e-9)
    if "Hugging Face's Trainer adds each micro-batch's mean instead" not in p.stdout:
        errs.append("no note on Hugging Face's accumulation of token classifiers' losses")
    cj = json.load(open(os.path.join(c["output_dir"], "config.json")))
    if cj.get("architectures") != ["LlamaForTokenClassification"] or len(cj.get("id2label") or {}) != 2:
        errs.append("saved config.json: %s %s" % (cj.get("architectures"), cj.get("id2label")))
    got = read_tensors(c["output_dir"])
    for k in ("score.weight", "score.bias"):
        want = model.p(k).detach().numpy()
        if k not in got or float(np.abs(got[k] - want).max()) > 1e-5:
            errs.append("saved %s differs from the reference's" % k)
    # LoRA: the adapters, score.weight and score.bias train (PEFT's TOKEN_CLS), against the reference
    lc = dict(c, output_dir=os.path.join(D.WORK, "prm_lora"), adapter="lora", lora_r=4, lora_alpha=8,
              lora_target_linear=True, lr_scheduler="constant_with_warmup", warmup_steps=1, save_steps=1,
              val_set_size=0, eval_steps=0, learning_rate=2e-2, max_steps=2)
    D.run(lc)
    spec = R.load_adapter_dir(os.path.join(lc["output_dir"], "checkpoint-1"))
    for k in ("score.weight", "score.bias"):
        if not np.array_equal(spec["weights"].pop(k, None), w[k]):
            errs.append("checkpoint-1's adapter lacks the base's %s" % k)
    lref, _, _ = prm_reference(cfg_m, w, tok, tgt, 2, 4, 2e-2, 0.1, lora=spec, warmup=1)
    lm, _ = D.metrics(lc["output_dir"])
    worst = max(worst, D.compare_steps(errs, lm, lref, keys=("loss", "grad_norm")))
    conf = json.load(open(os.path.join(lc["output_dir"], "adapter_config.json")))
    if conf.get("task_type") != "TOKEN_CLS" or conf.get("modules_to_save") != ["classifier", "score"]:
        errs.append("adapter_config.json: %s %s" % (conf.get("task_type"), conf.get("modules_to_save")))
    if not adapter_reloads(lc):
        errs.append("lora_model_dir: the adapter (and the head) did not load back bit for bit")
    return errs, "loss rel %.2e (full and LoRA), eval_accuracy %.3f" % (worst, e[3]["eval_accuracy"] if 3 in e else -1)


def case_prm_modes():
    """Gradient checkpointing + activation offloading, tiled MLP, a causal LM base (the head from
    N(0, 0.02) and 0, with a note) and two ranks (data and sequence parallel) against the plain run."""
    errs = []
    data = os.path.join(D.WORK, "prm_modes.jsonl")
    FX.write_jsonl(data, prm_records(16, seed=9))
    plain = prm_cfg("prm_plain", data, max_steps=3, tiled_mlp_shards=2)
    D.run(plain)
    fig = lambda out: [(x["loss"], x["grad_norm"]) for _, x in sorted(D.metrics(out)[0].items())]  # noqa: E731
    want = fig(plain["output_dir"])
    for i, extra in enumerate([{"gradient_checkpointing": True, "activation_offloading": True},
                               {"gradient_checkpointing": True, "tiled_mlp": True, "tiled_mlp_shards": 2}]):
        c = dict(plain, output_dir=os.path.join(D.WORK, "prm_mode_%d" % i), **extra)
        D.run(c)
        if fig(c["output_dir"]) != want:
            errs.append("%s: %s vs %s" % (extra, fig(c["output_dir"])[-1], want[-1]))
    p = D.run(dict(plain, base_model=D.model_dir(), output_dir=os.path.join(D.WORK, "prm_causal"), max_steps=1))
    if "score.weight [2, 64] starts from N(0, 0.02) and score.bias from 0" not in p.stdout:
        errs.append("a causal base: no note on the head's init")
    if shutil.which("mpirun"):
        for tag, extra in (("dp", {"micro_batch_size": 1}), ("seqpar", {"sequence_parallel_degree": 2})):
            c = dict(plain, output_dir=os.path.join(D.WORK, "prm_" + tag), **extra)
            if D.run_two_ranks(c, tag, errs):
                for s_, (a, b) in enumerate(zip(fig(c["output_dir"]), want), 1):
                    D.compare(errs, "%s step %d loss" % (tag, s_), a[0], b[0], rtol=1e-5)
                    D.compare(errs, "%s step %d grad norm" % (tag, s_), a[1], b[1], rtol=1e-5)
    return errs, "2 modes bit for bit, a causal base, 2 ranks"


def case_refusals():
    errs = []
    data = os.path.join(D.WORK, "ref.jsonl")
    FX.write_jsonl(data, records(6, seed=2))
    c = reward_cfg("refusals", data, max_steps=1)
    bad = [({"rl": "dpo"}, "reward_model and rl: dpo are two kinds of training"),
           ({"num_labels": 2}, "num_labels 2: a reward model has one output"),
           ({"reward_model": False}, "model_type: AutoModelForSequenceClassification needs reward_model: true"),
           ({"reward_model": False, "model_type": None, "num_labels": None,
             "datasets": [{"path": data, "type": "completion", "field": "input"}]}, "a sequence classifier (llama, 1 labels)"),
           ({"adapter": "lora", "lora_target_linear": True, "lora_modules_to_save": ["lm_head"]},
            "a reward model has no lm_head"),
           ({"datasets": [{"path": data, "type": "chatml.intel"}]}, "reward_model reads type bradley_terry.chat_template"),
           ({"datasets": [{"path": data, "type": "bradley_terry.chat_template", "roles": {}}]}, ".roles: not read"),
           ({"process_reward_model": True, "model_type": None}, "process_reward_model and reward_model are two kinds"),
           ({"model_type": "AutoModelForTokenClassification"}, "needs process_reward_model: true"),
           ({"sample_packing": True}, "sample_packing does not work with reward_model")]
    for extra, want in bad:
        cfg = {k: v for k, v in dict(c, **extra).items() if v is not None}
        p = D.run(cfg, expect_ok=False)
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error")]
        if p.returncode != 1 or not lines or want not in lines[0]:
            errs.append("%s: rc %d, %s" % (extra, p.returncode, p.stderr.strip()[-200:]))
    # process reward models: their dataset type, label count, packing; bad records
    pdata = os.path.join(D.WORK, "prm_ref.jsonl")
    FX.write_jsonl(pdata, prm_records(6, seed=4))
    pc = prm_cfg("prm_refusals", pdata, max_steps=1)
    for extra, want in [({"datasets": [{"path": data, "type": "bradley_terry.chat_template"}]},
                         "a process reward model reads stepwise_supervised datasets"),
                        ({"num_labels": 3}, "num_labels 3: a process reward model here has 2"),
                        ({"sample_packing": True}, "sample_packing with process_reward_model is not supported"),
                        ({"process_reward_model": False, "model_type": None, "num_labels": None},
                         "stepwise_supervised labels steps for process_reward_model: true"),
                        ({"base_model": seqcls_dir()}, "a sequence classifier, and process_reward_model trains a token"),
                        ({"datasets": [{"path": pdata, "type": "stepwise_supervised", "step_separator": 5}]},
                         "step_separator: expected a string")]:
        cfg = {k: v for k, v in dict(pc, **extra).items() if v is not None}
        p = D.run(cfg, expect_ok=False)
        lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error")]
        if p.returncode != 1 or not lines or want not in lines[0]:
            errs.append("prm %s: rc %d, %s" % (extra, p.returncode, p.stderr.strip()[-200:]))
    for i, (rec, want) in enumerate([({"prompt": "p", "completions": ["a", "b"], "labels": [True]},
                                      ":2: labels: expected a list of 2 booleans"),
                                     ({"prompt": "p", "completions": ["a"], "labels": ["yes"]},
                                      ":2: labels: expected a list of 1 booleans"),
                                     ({"prompt": "p", "completions": "a", "labels": [True]},
                                      ":2: completions: expected a list of strings")]):
        path = os.path.join(D.WORK, "prm_bad%d.jsonl" % i)
        FX.write_jsonl(path, [prm_records(1, 0)[0], rec])
        p = D.run(dict(pc, datasets=[{"path": path, "type": "stepwise_supervised"}]), "--preprocess", expect_ok=False)
        if p.returncode == 0 or path + want not in p.stderr:
            errs.append("prm bad record %d: rc %d %s" % (i, p.returncode, p.stderr.strip()[-200:]))
    # a record without input: one line naming the file, its line and the field
    bad_data = os.path.join(D.WORK, "bad.jsonl")
    FX.write_jsonl(bad_data, [records(1, 0)[0], {"chosen": "c", "rejected": "r"}])
    p = D.run(dict(c, datasets=[{"path": bad_data, "type": "bradley_terry.chat_template"}]), "--preprocess",
              expect_ok=False)
    if p.returncode == 0 or bad_data + ":2: input: expected a string" not in p.stderr:
        errs.append("a record without input: rc %d %s" % (p.returncode, p.stderr.strip()[-200:]))
    # a reward model's rows given to an rl: dpo run (the same prepared directory)
    scored = os.path.join(D.run(c, "--preprocess").stdout.strip().split()[-1], "train.bin")
    dpo = D.base_cfg("refusals_dpo", data, datasets=[{"path": data, "type": "bradley_terry.chat_template"}])
    dpo["datasets"][0]["type"] = "passthrough"
    FX.write_jsonl(os.path.join(D.WORK, "pt.jsonl"), [{"prompt": r["input"], "chosen": r["chosen"],
                                                       "rejected": r["rejected"]} for r in records(6, seed=2)])
    dpo["datasets"][0]["path"] = os.path.join(D.WORK, "pt.jsonl")
    shutil.copy(scored, os.path.join(D.run(dpo, "--preprocess").stdout.strip().split()[-1], "train.bin"))
    q = D.run(dpo, expect_ok=False)
    if q.returncode != 1 or "a reward model's rows, but the run is no reward_model run" not in q.stderr:
        errs.append("scored rows in a dpo run: rc %d %s" % (q.returncode, q.stderr.strip()[-200:]))
    return errs, "%d refused" % (len(bad) + 11)  # + the prm refusals and bad records, a record, the rows


def begin(args, work):
    D.begin(args, work)  # test_dpo's helpers read its ARGS and WORK


def main():
    cases = [("rows", case_rows), ("train", case_train), ("lora", case_lora), ("families", case_families),
             ("causal_base", case_causal_base), ("memory_modes", case_memory_modes), ("ranks", case_ranks),
             ("prm_rows", case_prm_rows), ("prm_train", case_prm_train), ("prm_modes", case_prm_modes),
             ("refusals", case_refusals)]
    harness.case_main("reward", cases, begin)


if __name__ == "__main__":
    main()
