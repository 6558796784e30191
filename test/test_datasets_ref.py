#!/usr/bin/env python3
"""The masked loss of the first step and the eval loss of `datasets:` runs against an
independent reference: samples tokenized here with transformers (alpaca by Axolotl's stated rule;
chat_template by character spans of the rendered conversation, mapped to tokens through the
tokenizer's offsets, a different method from the script's token comparison), and each sample's
loss computed alone by the float64 PyTorch model of test/llama_ref.py. Packed and unpacked rows
must give the same figures (1e-5): documents in a packed row attend only to themselves and
their positions restart.

One step covers every training row (micro_batch_size 1, gradient_accumulation_steps above the
row count, learning_rate 0), so its loss is the mean over every trained token of the training
data; test_datasets gives the eval set, evaluated at step 1.
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
import torch.nn.functional as F_

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import hf_fixtures as F  # noqa: E402
import llama_ref as R  # noqa: E402
from checks import check, finish  # noqa: E402

T = 256
ALPACA_SYS = ("Below is an instruction that describes a task, paired with an input that provides further context. "
              "Write a response that appropriately completes the request.")
ALPACA_SYS_NO_INPUT = "Below is an instruction that describes a task. Write a response that appropriately completes " \
                      "the request."


def alpaca_sample(tok, r):
    if r.get("input"):
        prompt = "%s\n\n### Instruction:\n%s\n\n### Input:\n%s\n\n### Response:\n" % (ALPACA_SYS, r["instruction"],
                                                                                        r["input"])
    else:
        prompt = "%s\n\n### Instruction:\n%s\n\n### Response:\n" % (ALPACA_SYS_NO_INPUT, r["instruction"])
    p = tok(prompt)["input_ids"]
    resp = tok(r["output"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return p + resp, [False] * len(p) + [True] * len(resp)


def chat_sample(tok, template, r):
    """Rendered text; trained = tokens inside an assistant content or its <|eot_id|>."""
    import jinja2
    turns = [{"role": {"human": "user", "gpt": "assistant"}.get(m["from"], m["from"]), "content": m["value"]}
             for m in r["conversations"]]
    text = jinja2.Environment().from_string(template).render(messages=turns, bos_token="<|begin_of_text|>",
                                                             add_generation_prompt=False)
    spans, pos = [], 0
    for t in turns:
        head = "<|start_header_id|>%s<|end_header_id|>\n\n" % t["role"]
        body = t["content"].strip()
        start = text.index(head + body, pos) + len(head)
        end = start + len(body) + len("<|eot_id|>")
        assert text[start + len(body):end] == "<|eot_id|>"
        if t["role"] == "assistant":
            spans.append((start, end))
        pos = end
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offs = enc["input_ids"], enc["offset_mapping"]
    trained = [any(a <= s and e <= b for a, b in spans) and e > s for s, e in offs]
    return ids, trained


def ref_loss(model, samples):
    """(sum of per-token losses, count) over the trained positions, each sample alone."""
    tot, n = 0.0, 0
    with torch.no_grad():
        for ids, trained in samples:
            logits = model(torch.tensor([ids]))[0]
            tgt = torch.tensor(ids[1:])
            m = torch.tensor(trained[1:])
            if m.any():
                tot += float(F_.cross_entropy(logits[:-1][m], tgt[m], reduction="sum"))
                n += int(m.sum())
    return tot, n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "train_llama"))
    args = ap.parse_args()
    try:
        import jinja2  # noqa: F401
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print("SKIP datasets_ref: tokenizers/transformers/jinja2 not installed (scripts/install_deps.sh)")
        return
    from transformers import AutoTokenizer
    work = tempfile.mkdtemp(prefix="test_datasets_ref.")
    try:
        mdir = os.path.join(work, "model")
        cfg, w = F.make_model(mdir, "llama3", hidden_size=32, intermediate_size=64, num_attention_heads=4,
                              num_key_value_heads=2, max_position_embeddings=1024)
        tok = AutoTokenizer.from_pretrained(mdir)
        model = R.RefLlama(cfg, w, dtype=torch.float64)
        alp_tr, alp_ev = F.alpaca_rows(10, seed=21), F.alpaca_rows(4, seed=22)
        chat_tr, chat_ev = F.sharegpt_rows(8, seed=23), F.sharegpt_rows(3, seed=24)
        F.write_jsonl(os.path.join(work, "alpaca_train.jsonl"), alp_tr)
        F.write_jsonl(os.path.join(work, "alpaca_eval.jsonl"), alp_ev)
        F.write_jsonl(os.path.join(work, "chat_train.jsonl"), chat_tr)
        F.write_jsonl(os.path.join(work, "chat_eval.jsonl"), chat_ev)
        template = tok.chat_template
        refs = {
            "alpaca": (ref_loss(model, [alpaca_sample(tok, r) for r in alp_tr]),
                       ref_loss(model, [alpaca_sample(tok, r) for r in alp_ev])),
            "chat": (ref_loss(model, [chat_sample(tok, template, r) for r in chat_tr]),
                     ref_loss(model, [chat_sample(tok, template, r) for r in chat_ev])),
        }
        ds = {"alpaca": "    type: alpaca\n",
              "chat": ("    type: chat_template\n    field_messages: conversations\n"
                       "    message_property_mappings: {role: from, content: value}\n    roles_to_train: [gpt]\n")}
        for kind in ("alpaca", "chat"):
            (tr_sum, tr_n), (ev_sum, ev_n) = refs[kind]
            for packed in (False, True):
                name = "%s_%s" % (kind, "packed" if packed else "unpacked")
                y = os.path.join(work, name + ".yaml")
                with open(y, "w") as f:
                    f.write("base_model: %s\ndatasets:\n  - path: %s_train.jsonl\n%stest_datasets:\n"
                            "  - path: %s_eval.jsonl\n%ssample_packing: %s\n"
                            "%s" % (mdir, kind, ds[kind], kind, ds[kind], "true" if packed else "false",
                                    "special_tokens:\n  eos_token: \"<|eot_id|>\"\n" if kind == "chat" else ""))
                    f.write("sequence_len: %d\nmicro_batch_size: 1\ngradient_accumulation_steps: 16\nmax_steps: 1\n"
                            "learning_rate: 0.0\neval_steps: 1\nnum_threads: 1\noutput_dir: out_%s\n"
                            "dataset_prepared_path: prepared\n" % (T, name))
                env = dict(os.environ, LLMC_PYTHON=sys.executable, LLMC_SCRIPTS_DIR=os.path.join(ROOT, "scripts"),
                           TRANSFORMERS_VERBOSITY="error")
                p = subprocess.run([os.path.abspath(args.bin), "-c", y], cwd=work, env=env, capture_output=True,
                                   text=True, timeout=600)
                if p.returncode != 0:
                    check("%s: runs" % name, False, p.stderr[-400:])
                    continue
                rows = [json.loads(x) for x in open(os.path.join(work, "out_" + name, "metrics.jsonl"))]
                step = next(r for r in rows if "loss" in r)
                ev = next(r for r in rows if "eval_loss" in r)
                m = re.search(r"(\d+) train rows.*?, (\d+) target tokens", p.stdout)
                want_tr, want_ev = tr_sum / tr_n, ev_sum / ev_n
                check("%s: first-step loss %.7f vs reference %.7f (%d trained tokens)" % (name, step["loss"], want_tr,
                                                                                         tr_n),
                      abs(step["loss"] - want_tr) <= 1e-5 and m and int(m.group(2)) == tr_n, p.stdout[-300:])
                check("%s: eval_loss %.7f vs reference %.7f, eval_tokens %d = %d" % (
                    name, ev["eval_loss"], want_ev, ev["eval_tokens"], ev_n),
                    abs(ev["eval_loss"] - want_ev) <= 1e-5 and ev["eval_tokens"] == ev_n)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
