#!/usr/bin/python3
"""The trainer's side of Axolotl `datasets:` runs (issue 18, items 3-6): prepared rows
(train.bin / eval.bin, the format of /work/notes/prepared_spec.md and DESIGN.md), the spec
handed to scripts/prepare_data.py, epochs and steps, evaluation, and the document mask.

    /usr/bin/python3 test/test_datasets_c.py --bin build/train_llama

The rows here are written by this test (write_rows) and served by a stand-in preparation
script (LLMC_SCRIPTS_DIR), so the C side is tested alone; with the real
scripts/prepare_data.py and test/hf_fixtures.py present, an end-to-end case runs too.

  packed_vs_unpacked  the same documents packed into rows (with doc_start) and one per row
                      give the same step losses, grad norms, per-token eval losses and weights
                      after 2 steps (SGD-like AdamW: epsilon 1) within 1e-6
  reference           first-step loss and grad norm against the float64 PyTorch reference run
                      per document (positions restart, no attention across documents), 1e-5;
                      per-token eval losses, eval_loss (token-weighted), eval_loss_hf (mean of
                      batch means) and eval_tokens against it too
  epochs              steps_per_epoch = ceil(rows / (B x accum)); num_epochs -> max_steps; the
                      last step's missing rows are empty (each step's loss against the
                      reference); the printed plan, epoch/eta in the step line; resume from a
                      checkpoint mid-run gives the same later losses (shuffled order restored)
  spec                the JSON spec the script receives (typed YAML, --set, tokenizer_dir)
  preprocess          --preprocess prepares and exits 0 without training
  bad_rows            corrupted row files: one error line naming the file and the row
  bad_prepare         the script's failure status passes through; missing script/python;
                      config errors (datasets + train_data, no tokenizer, data keys with shards)
  end_to_end          (when scripts/prepare_data.py exists) alpaca jsonl + tiny tokenizer
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

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import llama_ref as R  # noqa: E402
from checks import check, finish  # noqa: E402

MAGIC = 20241124
T = 16
VOCAB = 64
PAD = 0

FAKE_SCRIPT = r'''
import json, os, sys
a = sys.argv[1:]
spec, result = a[a.index("--spec") + 1], a[a.index("--result") + 1]
log = os.environ.get("FAKE_PREP_LOG")
if log:
    with open(log, "a") as f:
        f.write(json.dumps(json.load(open(spec))) + "\n")
code = int(os.environ.get("FAKE_PREP_FAIL", "0"))
if code:
    sys.stderr.write("error: data.jsonl:3: instruction: expected a string\n")
    sys.exit(code)
d = os.environ["FAKE_PREPARED"]
print("data: using prepared %s (cache hit)" % d)
open(result, "w").write(d + "\n")
'''


# ---- documents and rows ------------------------------------------------------------------

def make_docs(n, seed, lo=3, hi=12):
    """n documents: (tokens, trained) where trained[j] says whether tokens[j] is a target (of
    position j - 1); the first 0-3 tokens are a masked prompt, the first token never trains."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        L = int(rng.integers(lo, hi + 1))
        toks = [int(x) for x in rng.integers(1, VOCAB, size=L)]
        prompt = int(rng.integers(0, 4))
        trained = [j > 0 and j >= prompt for j in range(L)]
        docs.append((toks, trained))
    return docs


def doc_row_arrays(doc):
    toks, trained = doc
    L = len(toks)
    tgt = [toks[j + 1] if j + 1 < L and trained[j + 1] else -1 for j in range(L)]
    return toks, tgt


def layout(docs, packed):
    """Rows as lists of doc indices: one per row, or first fit in order (each kept whole)."""
    rows = []
    for i, (toks, _) in enumerate(docs):
        if packed:
            for r in rows:
                if sum(len(docs[j][0]) for j in r) + len(toks) <= T:
                    r.append(i)
                    break
            else:
                rows.append([i])
        else:
            rows.append([i])
    return rows


def build_rows(docs, rows):
    """Arrays [n, T] of tokens, targets, doc_start, and the (row, t) -> (doc, j) map."""
    n = len(rows)
    tok = np.full((n, T), PAD, np.int32)
    tgt = np.full((n, T), -1, np.int32)
    ds = np.zeros((n, T), np.int32)
    where = {}
    for r, members in enumerate(rows):
        t = 0
        for d in members:
            tk, tg = doc_row_arrays(docs[d])
            L = len(tk)
            tok[r, t:t + L] = tk
            tgt[r, t:t + L] = tg
            ds[r, t:t + L] = t
            for j in range(L):
                where[(r, t + j)] = (d, j)
            t += L
        ds[r, t:] = t  # the padding is one more "document"
    return tok, tgt, ds, where


def write_rows(path, tok, tgt, ds, packed, header=None, ndocs=None):
    n = tok.shape[0]
    h = np.zeros(256, "<i4")
    ntg = int((tgt >= 0).sum())
    h[:9] = [MAGIC, 1, tok.shape[1], n, 1 if packed else 0, int(tok.max()) + 1,
             ndocs if ndocs is not None else n, ntg & 0xFFFFFFFF, ntg >> 32]
    for k, v in (header or {}).items():
        h[k] = v
    body = np.stack([tok, tgt, ds], axis=1).astype("<i4")  # [n, 3, T]
    with open(path, "wb") as f:
        f.write(h.tobytes())
        f.write(body.tobytes())


def prepare_dir(path, train_docs, packed, eval_docs=None, eval_packed=None):
    """A prepared directory as the script would leave it; returns the row maps."""
    os.makedirs(path, exist_ok=True)
    rows = layout(train_docs, packed)
    tok, tgt, ds, where = build_rows(train_docs, rows)
    write_rows(os.path.join(path, "train.bin"), tok, tgt, ds, packed, ndocs=len(train_docs))
    out = {"train_rows": rows, "train_where": where}
    if eval_docs is not None:
        ep = packed if eval_packed is None else eval_packed
        erows = layout(eval_docs, ep)
        etok, etgt, eds, ewhere = build_rows(eval_docs, erows)
        write_rows(os.path.join(path, "eval.bin"), etok, etgt, eds, ep, ndocs=len(eval_docs))
        out.update(eval_rows=erows, eval_where=ewhere, eval_arrays=(etok, etgt, eds))
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump({"format_version": 1, "train_rows": len(rows)}, f)
    return out


# ---- the reference ------------------------------------------------------------------------

def ref_doc_losses(model, doc):
    """Per-position losses (float64) of one document run alone, and its targets."""
    toks, tgt = doc_row_arrays(doc)
    x = torch.tensor([toks])
    logits = model(x)[0]
    y = torch.tensor(tgt)
    losses = F.cross_entropy(logits, y.clamp(min=0), reduction="none")
    return losses, y >= 0


def ref_step(cfg, weights, docs):
    """Mean loss over every target of docs and the gradient norm of that mean."""
    model = R.RefLlama(cfg, weights, dtype=torch.float64)
    tot, n = 0, 0
    for d in docs:
        l, m = ref_doc_losses(model, d)
        tot = tot + l[m].sum()
        n += int(m.sum())
    loss = tot / n
    loss.backward()
    gn = math.sqrt(sum(float((p.grad ** 2).sum()) for _, p in model.named_hf_parameters() if p.grad is not None))
    return float(loss), gn


@torch.no_grad()
def ref_token_losses(cfg, weights, docs):
    model = R.RefLlama(cfg, weights, dtype=torch.float64)
    out = {}
    for i, d in enumerate(docs):
        l, m = ref_doc_losses(model, d)
        for j in range(len(d[0])):
            if m[j]:
                out[(i, j)] = float(l[j])
    return out


# ---- running ------------------------------------------------------------------------------

class Env:
    def __init__(self, binary, root):
        self.bin, self.root = binary, root
        self.scripts = os.path.join(root, "scripts")
        os.makedirs(self.scripts)
        with open(os.path.join(self.scripts, "prepare_data.py"), "w") as f:
            f.write(FAKE_SCRIPT)
        self.cfg = R.make_config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        self.weights = R.init_weights(self.cfg, seed=3)
        self.model = os.path.join(root, "model")
        R.save_hf_dir(self.model, self.cfg, self.weights)
        with open(os.path.join(self.model, "tokenizer.json"), "w") as f:
            f.write("{}\n")

    def yaml(self, name, prepared, extra="", **keys):
        d = os.path.join(self.root, name)
        os.makedirs(d, exist_ok=True)
        kv = dict(base_model=self.model, sequence_len=T, micro_batch_size=2, gradient_accumulation_steps=1,
                  learning_rate=0.1, adam_epsilon=1.0, weight_decay=0.0, max_grad_norm=0, lr_scheduler="constant",
                  warmup_steps=0, num_threads=1, device="cpu", output_dir=os.path.join(d, "out"), seed=7)
        kv.update(keys)
        text = "datasets:\n  - path: data.jsonl\n    type: alpaca\ntrain_on_inputs: false\n"
        text += "".join("%s: %s\n" % (k, v) for k, v in kv.items() if v is not None) + extra
        p = os.path.join(d, "cfg.yaml")
        with open(p, "w") as f:
            f.write(text)
        return p, prepared

    def run(self, cfgp, *args, env=None, timeout=120):
        cfg, prepared = cfgp if isinstance(cfgp, tuple) else (cfgp, "")
        argv = [self.bin, "-c", cfg]
        for a in args:
            argv += [a] if a.startswith("--") else ["--set", a]
        e = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", LLMC_DEVICE="cpu",
                 LLMC_SCRIPTS_DIR=self.scripts, FAKE_PREPARED=prepared or "/nonexistent",
                 LLMC_PYTHON=sys.executable)
        e.update(env or {})
        p = subprocess.run(argv, cwd=os.path.dirname(cfg), env=e, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr


def metrics(out_dir):
    rows = [json.loads(l) for l in open(os.path.join(out_dir, "metrics.jsonl")) if l.strip()]
    return [r for r in rows if "loss" in r], [r for r in rows if "eval_loss" in r]


def read_dump(path):
    """Per-eval lists of {(row, t): loss}."""
    evals = []
    for line in open(path):
        if line.startswith("#"):
            evals.append({})
        else:
            r, t, l = line.split()
            evals[-1][(int(r), int(t))] = float(l)
    return evals


def final_weights(out_dir):
    return R.read_safetensors(os.path.join(out_dir, "model.safetensors"))


def tail(err):
    return (err.strip().splitlines() or ["(no stderr)"])[-1]


# ---- cases --------------------------------------------------------------------------------

def case_packed_vs_unpacked(e):
    docs = make_docs(8, seed=1)
    res = {}
    for packed in (False, True):
        name = "pack%d" % packed
        prep = os.path.join(e.root, name, "prepared")
        info = prepare_dir(prep, docs, packed, eval_docs=docs)
        dump = os.path.join(e.root, name, "dump.txt")
        # 8 slots per step (4 x 2): every document in every step, whatever the layout.
        rc, out, err = e.run(e.yaml(name, prep, micro_batch_size=4, gradient_accumulation_steps=2, num_epochs=2,
                                    eval_steps=1, shuffle="true"),
                             env={"LLMC_DUMP_EVAL_TOKEN_LOSSES": dump})
        if rc != 0:
            check("packed_vs_unpacked: run (packed %d)" % packed, False, tail(err))
            return
        steps, evals = metrics(os.path.join(e.root, name, "out"))
        toks = [{info["eval_where"][k]: v for k, v in ev.items()} for ev in read_dump(dump)]
        res[packed] = dict(steps=steps, evals=evals, toks=toks, w=final_weights(os.path.join(e.root, name, "out")),
                           nrows=len(info["train_rows"]))
    u, p = res[False], res[True]
    check("packed_vs_unpacked: layouts differ (%d vs %d rows)" % (u["nrows"], p["nrows"]), p["nrows"] < u["nrows"])
    ok = len(u["steps"]) == len(p["steps"]) == 2
    dl = max(abs(a["loss"] - b["loss"]) for a, b in zip(u["steps"], p["steps"])) if ok else 1
    dg = max(abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(u["steps"], p["steps"])) if ok else 1
    check("packed_vs_unpacked: step losses (max diff %.2e) and grad norms (max rel %.2e) within 1e-6" % (dl, dg),
          ok and dl <= 1e-6 and dg <= 1e-6, "%s vs %s" % (u["steps"], p["steps"]))
    ok = len(u["toks"]) == len(p["toks"]) == 2 and all(a.keys() == b.keys() for a, b in zip(u["toks"], p["toks"]))
    dt = max(abs(a[k] - b[k]) for a, b in zip(u["toks"], p["toks"]) for k in a) if ok else 1
    nt = sum(len(a) for a in u["toks"]) if ok else 0
    check("packed_vs_unpacked: per-token eval losses after each step (%d tokens, max diff %.2e <= 1e-6)" % (nt, dt),
          ok and nt > 0 and dt <= 1e-6)
    de = max(abs(a["eval_loss"] - b["eval_loss"]) for a, b in zip(u["evals"], p["evals"]))
    check("packed_vs_unpacked: eval_loss token-weighted, layout-independent (max diff %.2e)" % de, de <= 1e-6)
    dw = max(float(np.abs(u["w"][k].astype(np.float64) - p["w"][k]).max()) for k in u["w"])
    moved = max(float(np.abs(u["w"][k].astype(np.float64) - e.weights[k]).max()) for k in u["w"])
    check("packed_vs_unpacked: weights after 2 steps (moved %.2e; max diff %.2e <= 1e-6)" % (moved, dw),
          dw <= 1e-6 and moved > 1e-3)


def case_reference(e):
    train_docs, eval_docs = make_docs(7, seed=2), make_docs(13, seed=3)
    loss_ref, gn_ref = ref_step(e.cfg, e.weights, train_docs)
    tok_ref = ref_token_losses(e.cfg, e.weights, eval_docs)
    for packed in (True, False):
        name = "ref%d" % packed
        prep = os.path.join(e.root, name, "prepared")
        info = prepare_dir(prep, train_docs, packed, eval_docs=eval_docs)
        dump = os.path.join(e.root, name, "dump.txt")
        B = 8 if not packed else 4  # one step holds every training document
        rc, out, err = e.run(e.yaml(name, prep, micro_batch_size=B, max_steps=1, eval_steps=1, learning_rate=0.0,
                                    shuffle="false"),
                             env={"LLMC_DUMP_EVAL_TOKEN_LOSSES": dump})
        tag = "reference (%s)" % ("packed" if packed else "unpacked")
        if rc != 0:
            check(tag + ": run", False, tail(err))
            continue
        steps, evals = metrics(os.path.join(e.root, name, "out"))
        dl = abs(steps[0]["loss"] - loss_ref)
        dg = abs(steps[0]["grad_norm"] - gn_ref) / gn_ref
        check("%s: first-step masked loss %.7f vs %.7f (diff %.2e <= 1e-5)" % (tag, steps[0]["loss"], loss_ref, dl),
              dl <= 1e-5)
        check("%s: grad norm %.6g vs %.6g (rel %.2e <= 1e-5)" % (tag, steps[0]["grad_norm"], gn_ref, dg), dg <= 1e-5)
        toks = {info["eval_where"][k]: v for k, v in read_dump(dump)[0].items()}
        dt = max(abs(toks[k] - tok_ref[k]) for k in tok_ref) if toks.keys() == tok_ref.keys() else 1
        check("%s: per-token eval losses (%d, max diff %.2e <= 1e-5)" % (tag, len(tok_ref), dt), dt <= 1e-5)
        # eval_loss: token-weighted; eval_loss_hf: each batch's (B rows) mean, repeated once per
        # row of the batch, averaged (Hugging Face's Trainer: loss.repeat(batch_size))
        ev = evals[0]
        wl = sum(tok_ref.values()) / len(tok_ref)
        etgt = info["eval_arrays"][1]
        bm, bw = [], []
        for b0 in range(0, etgt.shape[0], B):
            ks = [info["eval_where"][(r, t)] for r in range(b0, min(b0 + B, etgt.shape[0])) for t in range(T)
                  if etgt[r, t] >= 0]
            if ks:
                bm.append(sum(tok_ref[k] for k in ks) / len(ks))
                bw.append(min(b0 + B, etgt.shape[0]) - b0)
        hf = sum(m * w for m, w in zip(bm, bw)) / sum(bw)
        check("%s: eval_loss %.7f vs %.7f, eval_tokens %d vs %d" % (tag, ev["eval_loss"], wl, ev["eval_tokens"],
                                                                   len(tok_ref)),
              abs(ev["eval_loss"] - wl) <= 1e-5 and ev["eval_tokens"] == len(tok_ref))
        check("%s: eval_loss_hf %.7f vs %.7f (%d batches; differs from eval_loss by %.1e)"
              % (tag, ev["eval_loss_hf"], hf, len(bm), abs(hf - wl)),
              abs(ev["eval_loss_hf"] - hf) <= 1e-5 and len(bm) > 1 and abs(hf - wl) > 1e-4)
        check("%s: eval line printed" % tag, re.search(r"eval_loss [\d.]+ \| eval_tokens %d \| eval_loss_hf" % len(tok_ref), out),
              out[-300:])


def case_epochs(e):
    docs = make_docs(10, seed=4)
    prep = os.path.join(e.root, "epochs", "prepared")
    prepare_dir(prep, docs, False)
    # 10 rows, 2 x 2 per step: 3 steps per epoch, the third with 2 real rows and 2 empty ones
    cfgp = e.yaml("epochs", prep, micro_batch_size=2, gradient_accumulation_steps=2, num_epochs=2, shuffle="false",
                  learning_rate=0.0)
    rc, out, err = e.run(cfgp)
    if rc != 0:
        check("epochs: run", False, tail(err))
        return
    check("epochs: plan printed (rows, target tokens, 3 steps per epoch, 6 steps)",
          re.search(r"10 train rows, \d+ target tokens", out) and "3 steps per epoch = ceil(10 rows / 4 rows per step" in out
          and "2 epochs x 3 steps per epoch = 6 steps" in out, out[:800])
    steps, _ = metrics(os.path.join(e.root, "epochs", "out"))
    check("epochs: 6 steps, epoch 1.0 at step 3", len(steps) == 6 and abs(steps[2]["epoch"] - 1.0) < 1e-9,
          str([(s["step"], s.get("epoch")) for s in steps]))
    check("epochs: step line has epoch x/2 and an eta",
          re.search(r"^step +3/6 \| epoch 1\.00/2 \| loss .* \| eta \d+s$", out, re.M), out[-600:])
    rows = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    errs = []
    for s, r in enumerate(rows * 2):
        ref, _ = ref_step(e.cfg, e.weights, [docs[i] for i in r])
        if abs(steps[s]["loss"] - ref) > 1e-5:
            errs.append("step %d: %.7f vs %.7f" % (s + 1, steps[s]["loss"], ref))
    check("epochs: every step's loss is the mean over its rows' targets (empty rows add nothing)", not errs, errs)

    # Resume mid-epoch in a shuffled run: steps 4-6 as in the uninterrupted run.
    full = e.yaml("resume_full", prep, micro_batch_size=2, gradient_accumulation_steps=2, num_epochs=2,
                  shuffle="true", save_steps=2)
    rc, out, err = e.run(full)
    rc2, out2, err2 = e.run(e.yaml("resume_part", prep, micro_batch_size=2, gradient_accumulation_steps=2,
                                   num_epochs=2, shuffle="true", save_steps=2),
                            "resume_from_checkpoint=%s" % os.path.join(e.root, "resume_full", "out", "checkpoint-4"))
    if rc or rc2:
        check("epochs: resume runs", False, tail(err) + tail(err2))
        return
    a, _ = metrics(os.path.join(e.root, "resume_full", "out"))
    b, _ = metrics(os.path.join(e.root, "resume_part", "out"))
    la = [(s["step"], s["loss"]) for s in a if s["step"] > 4]
    lb = [(s["step"], s["loss"]) for s in b if s["step"] > 4]
    check("epochs: resume from checkpoint-4 repeats steps 5-6 exactly (shuffled order restored)",
          la == lb and len(la) == 2, "%s vs %s" % (la, lb))
    # other prepared data (another cache key) cannot resume this run's position
    other = os.path.join(e.root, "epochs", "other")
    prepare_dir(other, make_docs(10, seed=40), False)
    rc, out, err = e.run(e.yaml("resume_other", other, micro_batch_size=2, gradient_accumulation_steps=2,
                                num_epochs=2, shuffle="true", save_steps=2),
                         "resume_from_checkpoint=%s" % os.path.join(e.root, "resume_full", "out", "checkpoint-4"))
    one_error("epochs: resuming with other prepared data -> one line naming prepared_data", rc, out, err,
              "prepared_data=prepared", "prepared_data=other")
    # shuffling changes the order (different losses from the ordered run, same set per epoch)
    lo = [s["loss"] for s in steps]
    check("epochs: shuffle visits rows in another order", [s["loss"] for s in a] != lo)

    # dataloader_drop_last: 10 rows in micro-batches of 3 leave out row 9 (3 whole micro-batches
    # an epoch), as a DataLoader with drop_last does; without it a 4th step holds row 9 alone.
    rc, out, err = e.run(e.yaml("drop_last", prep, micro_batch_size=3, gradient_accumulation_steps=1, num_epochs=2,
                                shuffle="false", learning_rate=0.0, dataloader_drop_last="true", save_steps=2))
    if rc != 0:
        check("epochs: dataloader_drop_last run", False, tail(err))
        return
    dl, _ = metrics(os.path.join(e.root, "drop_last", "out"))
    errs = []
    for s, r in enumerate([[0, 1, 2], [3, 4, 5], [6, 7, 8]] * 2):
        ref, _ = ref_step(e.cfg, e.weights, [docs[i] for i in r])
        if s >= len(dl) or abs(dl[s]["loss"] - ref) > 1e-5:
            errs.append("step %d: %s vs %.7f" % (s + 1, dl[s]["loss"] if s < len(dl) else "-", ref))
    check("epochs: dataloader_drop_last: 3 steps per epoch over rows 0-8, row 9 left out (%d steps)" % len(dl),
          "3 steps per epoch = ceil(9 rows / 3 rows per step" in out and "last partial micro-batch left out" in out
          and len(dl) == 6 and not errs, errs or out[:600])
    rc, out, err = e.run(e.yaml("drop_last_resume", prep, micro_batch_size=3, gradient_accumulation_steps=1,
                                num_epochs=2, shuffle="false", learning_rate=0.0),
                         "resume_from_checkpoint=%s" % os.path.join(e.root, "drop_last", "out", "checkpoint-2"))
    one_error("epochs: resuming a dataloader_drop_last run without it -> one line naming the key", rc, out, err,
              "dataloader_drop_last=true", "dataloader_drop_last=false")
    few = os.path.join(e.root, "epochs", "few")
    prepare_dir(few, make_docs(2, seed=41), False)
    rc, out, err = e.run(e.yaml("drop_last_few", few, micro_batch_size=3, dataloader_drop_last="true"))
    one_error("epochs: dataloader_drop_last with fewer rows than a micro-batch -> one line", rc, out, err,
              "2 rows, fewer than one micro-batch of 3")


def case_spec(e):
    docs = make_docs(4, seed=5)
    prep = os.path.join(e.root, "spec", "prepared")
    prepare_dir(prep, docs, True)
    log = os.path.join(e.root, "spec", "log.jsonl")
    extra = ("sample_packing: yes\nval_set_size: 0\ndefault_system_message: \"true\"\n"
             "special_tokens:\n  eos_token: <|eot_id|>\nchat_template: chatml\nexcess_length_strategy: truncate\n"
             "pad_to_sequence_len: true\ndataset_prepared_path: cache_dir\n")
    cfgp = e.yaml("spec", prep, extra=extra, max_steps=1, micro_batch_size=4)
    rc, out, err = e.run(cfgp, "val_set_size=1_000", "sequence_len=16", env={"FAKE_PREP_LOG": log})
    if rc != 0:
        check("spec: run", False, tail(err))
        return
    check("spec: the script's line is shown", "data: using prepared %s (cache hit)" % prep in out)
    s = json.loads(open(log).read().splitlines()[0])
    c = s.get("config", {})
    d = os.path.join(e.root, "spec")
    want = [("spec_version", s.get("spec_version"), 1), ("sequence_len", s.get("sequence_len"), T),
            ("seed", s.get("seed"), 7), ("vocab_size", s.get("vocab_size"), VOCAB),
            ("tokenizer_dir", s.get("tokenizer_dir"), os.path.realpath(e.model)),
            ("config_path", s.get("config_path"), os.path.realpath(cfgp[0])),
            ("config_dir", s.get("config_dir"), os.path.realpath(d)),
            ("prepared_root", s.get("prepared_root"), os.path.join(os.path.realpath(d), "cache_dir")),
            ("datasets", c.get("datasets"), [{"path": "data.jsonl", "type": "alpaca"}]),
            ("sample_packing (yes)", c.get("sample_packing"), True),
            ("train_on_inputs", c.get("train_on_inputs"), False),
            ("val_set_size (--set 1_000)", c.get("val_set_size"), 1000),
            ("default_system_message (quoted)", c.get("default_system_message"), "true"),
            ("special_tokens", c.get("special_tokens"), {"eos_token": "<|eot_id|>"}),
            ("excess_length_strategy", c.get("excess_length_strategy"), "truncate"),
            ("learning_rate", c.get("learning_rate"), 0.1)]
    bad = ["%s: %r, expected %r" % (k, v, w) for k, v, w in want if v != w]
    check("spec: keys and typed values (%d checked)" % len(want), not bad, bad)
    # tokenizer_config as a hub id: a tokenizer-only repository (no config.json) in the local cache
    hub = os.path.join(e.root, "spec", "hub")
    snap = os.path.join(hub, "models--acme--tok", "snapshots", "rev1")
    os.makedirs(snap)
    os.makedirs(os.path.join(hub, "models--acme--tok", "refs"))
    open(os.path.join(hub, "models--acme--tok", "refs", "main"), "w").write("rev1\n")
    open(os.path.join(snap, "tokenizer_config.json"), "w").write("{}\n")
    rc2, out2, err2 = e.run(cfgp, "tokenizer_config=acme/tok", env={"FAKE_PREP_LOG": log, "HF_HUB_CACHE": hub})
    s2 = json.loads(open(log).read().splitlines()[-1]) if rc2 == 0 else {}
    check("spec: tokenizer_config hub id -> its snapshot in the cache", s2.get("tokenizer_dir") == os.path.realpath(snap),
          "rc %d %s: %s" % (rc2, tail(err2), s2.get("tokenizer_dir")))
    rc2, out2, err2 = e.run(cfgp, "tokenizer_config=acme/other", env={"HF_HUB_CACHE": hub})
    one_error("spec: tokenizer_config hub id not in the cache -> one line", rc2, out2, err2, "tokenizer_config",
              "acme/other", "huggingface-cli download")
    # The same resolution as base_model's (hfcache.c), with tokenizer files instead of config.json:
    # a commit's snapshot by revision, the only snapshot of a cache copied without refs/, and a
    # snapshot with config.json alone refused by name.
    snap2 = os.path.join(hub, "models--acme--tok", "snapshots", "rev2")
    os.makedirs(snap2)
    open(os.path.join(snap2, "tokenizer.json"), "w").write("{}\n")
    rc2, out2, err2 = e.run(cfgp, "tokenizer_config=acme/tok", "revision_of_model=rev2",
                            env={"FAKE_PREP_LOG": log, "HF_HUB_CACHE": hub})
    s2 = json.loads(open(log).read().splitlines()[-1]) if rc2 == 0 else {}
    check("spec: tokenizer_config hub id at a commit -> that snapshot", s2.get("tokenizer_dir") == os.path.realpath(snap2),
          "rc %d %s: %s" % (rc2, tail(err2), s2.get("tokenizer_dir")))
    snap3 = os.path.join(hub, "models--acme--copied", "snapshots", "abc")
    os.makedirs(snap3)
    open(os.path.join(snap3, "tokenizer.model"), "wb").write(b"\0")
    rc2, out2, err2 = e.run(cfgp, "tokenizer_config=acme/copied", env={"FAKE_PREP_LOG": log, "HF_HUB_CACHE": hub})
    s2 = json.loads(open(log).read().splitlines()[-1]) if rc2 == 0 else {}
    check("spec: tokenizer_config hub id without refs/ -> its only snapshot",
          s2.get("tokenizer_dir") == os.path.realpath(snap3), "rc %d %s: %s" % (rc2, tail(err2), s2.get("tokenizer_dir")))
    snap4 = os.path.join(hub, "models--acme--notok", "snapshots", "r1")
    os.makedirs(snap4)
    os.makedirs(os.path.join(hub, "models--acme--notok", "refs"))
    open(os.path.join(hub, "models--acme--notok", "refs", "main"), "w").write("r1")
    open(os.path.join(snap4, "config.json"), "w").write("{}\n")
    rc2, out2, err2 = e.run(cfgp, "tokenizer_config=acme/notok", env={"HF_HUB_CACHE": hub})
    one_error("spec: tokenizer_config hub id whose snapshot has no tokenizer -> one line", rc2, out2, err2,
              "tokenizer_config", "acme/notok", "tokenizer files", snap4)
    notes = [l for l in out.splitlines() if l.startswith("note:") and
             re.search(r"special_tokens|pad_to_sequence_len|excess_length|tokenizer_config|chat_template", l)]
    check("spec: data keys of a datasets run are used, not noted", not notes, notes)


def case_preprocess(e):
    docs = make_docs(4, seed=6)
    prep = os.path.join(e.root, "pre", "prepared")
    prepare_dir(prep, docs, True)
    log = os.path.join(e.root, "pre", "log.jsonl")
    rc, out, err = e.run(e.yaml("pre", prep, max_steps=1), "--preprocess", env={"FAKE_PREP_LOG": log})
    check("preprocess: exits 0 after preparing, trains nothing",
          rc == 0 and os.path.exists(log) and "cache hit" in out and not re.search(r"^step ", out, re.M)
          and not os.path.exists(os.path.join(e.root, "pre", "out", "metrics.jsonl")), "rc %d: %s" % (rc, tail(err)))


def one_error(tag, rc, out, err, *needles, code=1, lines=1):
    ls = [l for l in err.splitlines() if l.strip()]
    ok = rc == code and len(ls) == lines and all(l.startswith("error: ") for l in ls) and \
        all(any(n in l for l in ls) for n in needles) and not re.search(r"^step ", out, re.M)
    check(tag, ok, "rc %s, stderr %r" % (rc, err[-500:]))


def case_bad_rows(e):
    docs = make_docs(6, seed=7)
    base = os.path.join(e.root, "bad", "base")
    info = prepare_dir(base, docs, True)
    tok, tgt, ds, _ = build_rows(docs, info["train_rows"])

    def variant(name, mutate=None, header=None, raw=None):
        d = os.path.join(e.root, "bad", name)
        os.makedirs(d, exist_ok=True)
        a, b, c = tok.copy(), tgt.copy(), ds.copy()
        if mutate:
            mutate(a, b, c)
        p = os.path.join(d, "train.bin")
        write_rows(p, a, b, c, True, header=header)
        if raw:
            raw(p)
        return d

    def trunc(p):
        with open(p, "r+b") as f:
            f.truncate(os.path.getsize(p) - 4)

    r1 = [r for r in range(tok.shape[0]) if (tgt[r] >= 0).any()][0]
    t1 = int(np.nonzero(tgt[r1] >= 0)[0][0])
    # the last token of row 0's first document, then give it a target (its next is another document)
    end0 = int(np.nonzero(ds[0] != 0)[0][0]) - 1

    def cross(a, b, c):
        b[0, end0] = a[0, end0 + 1]

    def wrong_tgt(a, b, c):
        b[r1, t1] = (b[r1, t1] + 1) % VOCAB

    def big_tok(a, b, c):
        a[1, 2] = VOCAB + 5

    def bad_ds(a, b, c):
        c[0, 3] = 1

    cases = [
        ("bad magic", variant("magic", header={0: 1234}), ["train.bin", "bad magic 1234"]),
        ("wrong T", variant("T", header={2: 8}), ["train.bin", "rows of 8 tokens", "sequence_len is 16"]),
        ("truncated", variant("trunc", raw=trunc), ["train.bin", "the header says"]),
        ("token id out of range", variant("tok", big_tok, header={5: VOCAB}),
         ["train.bin", "row 1, position 2", "token id %d" % (VOCAB + 5)]),
        ("target not the next token", variant("tgt", wrong_tgt),
         ["train.bin", "row %d, position %d" % (r1, t1), "not the next token"]),
        ("target across a document boundary", variant("cross", cross),
         ["train.bin", "row 0, position %d" % end0, "last token of a document"]),
        ("bad doc_start", variant("ds", bad_ds), ["train.bin", "row 0, position 3", "doc_start"]),
        ("header target count", variant("count", header={7: 3, 8: 0}), ["train.bin", "target tokens"]),
        ("header ids above vocab", variant("vocab", header={5: VOCAB + 1}), ["train.bin", "vocab_size is 64"]),
        ("header id bound INT_MIN", variant("negid", header={5: -2 ** 31}),  # found by fuzz_rows (UBSan)
         ["train.bin", "negative token id bound -2147483648"]),
        ("unknown version", variant("version", header={1: 2}), ["train.bin", "version 2"]),
    ]
    for tag, d, needles in cases:
        rc, out, err = e.run(e.yaml("bad_run", d, max_steps=1))
        one_error("bad_rows: %s -> one line naming the file and row" % tag, rc, out, err, *needles)
    # an eval file is checked at open as well
    d = os.path.join(e.root, "bad", "evalbad")
    prepare_dir(d, docs, True, eval_docs=docs)
    with open(os.path.join(d, "eval.bin"), "r+b") as f:
        f.write(np.array([777], "<i4").tobytes())
    rc, out, err = e.run(e.yaml("bad_run", d, max_steps=1))
    one_error("bad_rows: bad eval.bin -> one line", rc, out, err, "eval.bin", "bad magic 777")


def case_bad_prepare(e):
    docs = make_docs(4, seed=8)
    prep = os.path.join(e.root, "bp", "prepared")
    prepare_dir(prep, docs, True)
    y = e.yaml("bp", prep, max_steps=1)
    rc, out, err = e.run(y, env={"FAKE_PREP_FAIL": "3"})
    one_error("bad_prepare: the script's error and exit status 3 pass through (2 lines)", rc, out, err,
              "data.jsonl:3: instruction", "data preparation failed", code=3, lines=2)
    rc, out, err = e.run(y, env={"LLMC_SCRIPTS_DIR": os.path.join(e.root, "nowhere")})
    one_error("bad_prepare: no script -> one line", rc, out, err, "LLMC_SCRIPTS_DIR", "prepare_data.py")
    rc, out, err = e.run(y, env={"LLMC_PYTHON": os.path.join(e.root, "no-python")})
    one_error("bad_prepare: no python -> its line and status 127", rc, out, err, "cannot run", "LLMC_PYTHON",
              "data preparation failed", code=127, lines=2)
    rc, out, err = e.run((y[0], os.path.join(e.root, "bp")))  # a directory without train.bin
    one_error("bad_prepare: a result without train.bin -> one line", rc, out, err, "no train.bin")
    rc, out, err = e.run(y, "train_data=%s" % os.path.join(prep, "train.bin"))
    one_error("bad_prepare: datasets + train_data -> one line", rc, out, err, "datasets", "train_data", "not both")
    # no tokenizer: a random-init model block and no tokenizer_config
    p = os.path.join(e.root, "bp", "notok.yaml")
    with open(p, "w") as f:
        f.write("model:\n  vocab_size: 64\n  hidden_size: 16\n  intermediate_size: 32\n  num_hidden_layers: 1\n"
                "  num_attention_heads: 2\ndatasets:\n  - path: x.jsonl\n    type: alpaca\nmax_steps: 1\n")
    rc, out, err = e.run((p, prep))
    one_error("bad_prepare: no tokenizer -> names tokenizer_config", rc, out, err, "tokenizer_config", "base_model")
    rc, out, err = e.run(y, "tokenizer_config=%s" % prep)
    one_error("bad_prepare: tokenizer_config without tokenizer files -> one line", rc, out, err,
              "tokenizer_config", "has no tokenizer")
    # data keys with token shards
    shard = os.path.join(e.root, "bp", "shard.bin")
    R.write_shard(shard, R.random_tokens(400, VOCAB))
    p = os.path.join(e.root, "bp", "shards.yaml")
    with open(p, "w") as f:
        f.write("base_model: %s\ntrain_data: %s\nsequence_len: 16\nmax_steps: 1\nsample_packing: true\n"
                "output_dir: %s\n" % (e.model, shard, os.path.join(e.root, "bp", "out2")))
    rc, out, err = e.run((p, ""))
    one_error("bad_prepare: sample_packing with train_data shards -> one line", rc, out, err, "sample_packing",
              "datasets pipeline", "train_data")
    # aliases of aliases must not expand without bound in the JSON handed to the script
    p = os.path.join(e.root, "bp", "bomb.yaml")
    with open(p, "w") as f:
        f.write("base_model: %s\ndatasets:\n  - &a [x, x, x, x, x, x, x, x, x, x]\n" % e.model)
        for i in range(1, 7):
            f.write("  - &%s [%s]\n" % ("abcdefg"[i], ", ".join(["*" + "abcdefg"[i - 1]] * 10)))
    rc, out, err = e.run((p, prep))
    one_error("bad_prepare: a YAML alias bomb -> one line", rc, out, err, "bomb.yaml", "more than a million values")
    rc, out, err = e.run((p.replace("bomb", "shards"), ""), "--preprocess", "sample_packing=false")
    one_error("bad_prepare: --preprocess without datasets -> one line", rc, out, err, "--preprocess")


def case_mpi(e):
    """Two ranks: only rank 0 runs the script; the run equals one process with twice the rows."""
    if not shutil.which("mpirun"):
        print("SKIP mpi: no mpirun")
        return
    docs, edocs = make_docs(12, seed=9), make_docs(9, seed=10)
    prep = os.path.join(e.root, "mpi", "prepared")
    prepare_dir(prep, docs, True, eval_docs=edocs)
    log = os.path.join(e.root, "mpi", "log.jsonl")
    res = {}
    for ranks in (1, 2):
        name = "mpi%d" % ranks
        cfg, _ = e.yaml(name, prep, micro_batch_size=4 // ranks, num_epochs=2, eval_steps=1, shuffle="true")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI_", "PMIX_", "PRTE_"))}
        env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", LLMC_DEVICE="cpu", LLMC_SCRIPTS_DIR=e.scripts,
                   FAKE_PREPARED=prep, LLMC_PYTHON=sys.executable, FAKE_PREP_LOG=log,
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        argv = [e.bin, "-c", cfg]
        if ranks > 1:
            argv = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"] + argv
        if os.path.exists(log):
            os.remove(log)
        p = subprocess.run(argv, cwd=os.path.dirname(cfg), env=env, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            check("mpi: run on %d rank(s)" % ranks, False, tail(p.stderr))
            return
        calls = len(open(log).read().splitlines())
        res[ranks] = metrics(os.path.join(e.root, name, "out")) + (calls,)
    (s1, e1, _), (s2, e2, calls) = res[1], res[2]
    check("mpi: the preparation script ran once for 2 ranks (%d call)" % calls, calls == 1)
    dl = max(abs(a["loss"] - b["loss"]) for a, b in zip(s1, s2)) if len(s1) == len(s2) > 0 else 1
    de = max(abs(a["eval_loss"] - b["eval_loss"]) for a, b in zip(e1, e2)) if len(e1) == len(e2) > 0 else 1
    check("mpi: 2 ranks x 2 rows = 1 rank x 4 rows (%d steps, loss diff %.1e, eval_loss diff %.1e)"
          % (len(s1), dl, de), dl <= 1e-6 and de <= 1e-6 and e1[-1]["eval_tokens"] == e2[-1]["eval_tokens"])


WORDS = ("the cat sat on mat a dog ran to park what is name of animal tell me about it "
         "write story short give answer one two three").split()


def make_tokenizer(d):
    """A tiny word-level tokenizer (BOS <s>, EOS </s>) in Hugging Face layout, in d."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
    for w in WORDS + [".", ":", "#", "\n"]:
        vocab.setdefault(w, len(vocab))
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    t.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
                   "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 1024}, f)
    return len(vocab)


def rows_docs(path):
    """The documents of a row file: (tokens, targets) per doc_start run, padding runs left out."""
    raw = np.fromfile(path, "<i4")
    h, T_ = raw[:256], int(raw[2])
    body = raw[256:].reshape(int(h[3]), 3, T_)
    out = []
    for r in range(body.shape[0]):
        tok, tgt, ds = body[r]
        t = 0
        while t < T_:
            e2 = t + 1
            while e2 < T_ and ds[e2] == ds[t]:
                e2 += 1
            if (tgt[t:e2] >= 0).any():
                out.append((r, [int(x) for x in tok[t:e2]], [int(x) for x in tgt[t:e2]]))
            t = e2
    return h, out


def case_end_to_end(e):
    script = os.path.join(ROOT, "scripts", "prepare_data.py")
    if not os.path.exists(script):
        print("SKIP end_to_end: scripts/prepare_data.py not present yet")
        return
    try:
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print("SKIP end_to_end: tokenizers/transformers not installed (scripts/install_deps.sh)")
        return
    d = os.path.join(e.root, "e2e")
    model = os.path.join(d, "model")
    os.makedirs(model)
    cfg = R.make_config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    weights = R.init_weights(cfg, seed=5)
    R.save_hf_dir(model, cfg, weights)
    nv = make_tokenizer(model)
    rng = np.random.default_rng(11)
    with open(os.path.join(d, "alpaca.jsonl"), "w") as f:
        for i in range(12):
            w = lambda n: " ".join(WORDS[int(x)] for x in rng.integers(0, len(WORDS), size=n))  # noqa: E731
            f.write(json.dumps({"instruction": w(3), "input": w(2) if i % 3 else "", "output": w(4)}) + "\n")
    y = os.path.join(d, "cfg.yaml")
    with open(y, "w") as f:
        f.write("base_model: %s\ndatasets:\n  - path: alpaca.jsonl\n    type: alpaca\n"
                "dataset_prepared_path: prepared\nval_set_size: 0.25\nsample_packing: true\n"
                "train_on_inputs: false\nsequence_len: 64\nmicro_batch_size: 2\nnum_epochs: 2\n"
                "learning_rate: 0.0\nshuffle: false\nevals_per_epoch: 1\nnum_threads: 1\n"
                "output_dir: out\n" % model)
    env = {"LLMC_SCRIPTS_DIR": os.path.join(ROOT, "scripts")}
    rc, out, err = e.run((y, ""), "--preprocess", env=env)
    check("end_to_end: --preprocess prepares and exits 0 without training",
          rc == 0 and re.search(r"^data: prepared .* in ", out, re.M) and not re.search(r"^step ", out, re.M),
          "rc %d: %s | %s" % (rc, out[-300:], tail(err)))
    rc, out, err = e.run((y, ""), env=env)
    check("end_to_end: the run reuses the cache and trains", rc == 0 and "(cache hit)" in out
          and re.search(r"^step +\d+/\d+ \| epoch", out, re.M), "rc %d: %s" % (rc, tail(err)))
    if rc != 0:
        return
    m = re.search(r"^data: (/\S+): \d+ train rows", out, re.M)
    pdir = m.group(1) if m else ""
    ok = os.path.exists(os.path.join(pdir, "train.bin")) and os.path.exists(os.path.join(pdir, "eval.bin"))
    check("end_to_end: train.bin and eval.bin in %s" % pdir, ok)
    if not ok:
        return
    h, docs = rows_docs(os.path.join(pdir, "train.bin"))
    masked = sum(1 for _, tk, tg in docs for j in range(len(tk) - 1) if tg[j] < 0)
    check("end_to_end: packed rows with prompt tokens masked (%d docs, %d masked positions)" % (len(docs), masked),
          h[4] & 1 and masked > 0 and len(docs) >= 6)
    # the first step's loss against the reference run per document of its rows
    model_ref = R.RefLlama(cfg, weights, dtype=torch.float64)
    tot, n = 0.0, 0
    with torch.no_grad():
        for r, tk, tg in docs:
            if r >= 2:  # step 1 = rows 0-1 (micro_batch_size 2, in order)
                continue
            logits = model_ref(torch.tensor([tk]))[0]
            y_ = torch.tensor(tg)
            m = y_ >= 0
            tot += float(F.cross_entropy(logits[m], y_[m], reduction="sum"))
            n += int(m.sum())
    steps, evals = metrics(os.path.join(d, "out"))
    ref = tot / n
    check("end_to_end: first-step loss %.7f vs reference %.7f from the prepared rows" % (steps[0]["loss"], ref),
          abs(steps[0]["loss"] - ref) <= 1e-5)
    check("end_to_end: evaluations with eval_tokens", evals and all(v["eval_tokens"] > 0 for v in evals), evals)
    rc, out, err = e.run((y, ""), "--preprocess", env=env)
    check("end_to_end: a second --preprocess is a cache hit", rc == 0 and "(cache hit)" in out, out[-300:])


CASES = [case_packed_vs_unpacked, case_reference, case_epochs, case_spec, case_preprocess, case_bad_rows,
         case_bad_prepare, case_mpi, case_end_to_end]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "train_llama"))
    ap.add_argument("-k", default="", help="only cases whose name contains this")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    root = tempfile.mkdtemp(prefix="test_datasets_c.")
    try:
        e = Env(binary, root)
        for fn in CASES:
            if args.k in fn.__name__:
                fn(e)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
