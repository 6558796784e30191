#!/usr/bin/env python3
"""scripts/prepare_data.py against the rules it implements (Axolotl's prompt strategies, as the
issue states them), with byte-level BPE tokenizers made by test/hf_fixtures.py:

  alpaca            prompt masked, response tokenized apart (no BOS) + EOS; the no-input system
                    prompt when input is empty; train_on_inputs trains the prompt too; alpaca:phi
  chat_llama3       sharegpt from/value, roles_to_train [gpt]: each trained run is one assistant
                    turn's content + <|eot_id|> when eos_token is <|eot_id|>; headers never trained;
                    train_on_eos all/last; without the eos override the turn end is not trained
  chat_chatml       tokenizer_default chatml template, eot_tokens [<|im_end|>]; legacy rule
  chat_gemma3       chat_template: gemma3 (Axolotl's Gemma 3 examples), eot_tokens [<end_of_turn>]:
                    the text is <bos><start_of_turn>user\n(system\n\n)... with the assistant as
                    "model"; each trained run is one assistant turn's content + <end_of_turn>
  chat_gemma        chat_template: gemma (Gemma 2's examples) with drop_system_message: Gemma's turns
                    with no system text; a system message without it, or turns that do not
                    alternate, are one-line errors
  chat_named        chat_template: qwen_25 / qwen3 / phi_3 texts spelled out; Qwen3's <think> block
                    and reasoning; tools and tool_calls reach the template and tool calls are trained
  input_output      segments with label flags, no special tokens added
  completion        long texts cut into sequence_len pieces, every token trained, EOS at the end
  pretraining       pretraining_dataset plain text, packed, documents isolated
  packing           packed rows hold the same documents as unpacked rows, targets never cross
  val_split         ceil(val_set_size * n) eval samples, deterministic by seed
  excess_length     drop (counted) / truncate / raise (file:line)
  formats           json list, parquet, csv, a directory, data_files, split slices
  cache             second run hits; a changed data file or tokenizer misses; stale dirs rebuilt
  errors            one line each, naming file:line and field or the config key
"""
import argparse
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import hf_fixtures as F  # noqa: E402
from checks import check, finish  # noqa: E402

import prepare_data as P  # noqa: E402

SCRIPT = os.path.join(ROOT, "scripts", "prepare_data.py")
VOCAB = 1024


class Env:
    def __init__(self, root):
        self.root = root
        self.tok = {}
        for kind in ("llama3", "llama2", "qwen2", "gemma3"):
            d = os.path.join(root, "tok_" + kind)
            F.make_tokenizer(d, kind)
            self.tok[kind] = d
        from transformers import AutoTokenizer
        self.hf = {k: AutoTokenizer.from_pretrained(d) for k, d in self.tok.items()}
        self.n = 0

    def spec(self, config, kind="llama3", T=256, seed=42, vocab=VOCAB):
        self.n += 1
        d = os.path.join(self.root, "run%d" % self.n)
        os.makedirs(d)
        return {"spec_version": 1, "config_path": os.path.join(d, "cfg.yaml"), "config_dir": d,
                "tokenizer_dir": self.tok[kind], "sequence_len": T, "seed": seed,
                "prepared_root": os.path.join(d, "prepared"), "vocab_size": vocab, "config": config}

    def data(self, spec, name, rows):
        F.write_jsonl(os.path.join(spec["config_dir"], name), rows)
        return name

    def run(self, spec, force=False):
        """In-process run: (prepared dir, meta) or raises DataError."""
        sp = os.path.join(spec["config_dir"], "spec.json")
        with open(sp, "w") as f:
            json.dump(spec, f)
        res = os.path.join(spec["config_dir"], "result.txt")
        P.run(types.SimpleNamespace(spec=sp, result=res, force=force))
        d = open(res).read().strip()
        return d, json.load(open(os.path.join(d, "meta.json")))

    def err(self, spec):
        try:
            self.run(spec)
        except P.DataError as e:
            return str(e)
        return ""


def read_rows(path):
    raw = np.fromfile(path, "<i4")
    h, T = raw[:256], int(raw[2])
    return h, raw[256:].reshape(int(h[3]), 3, T)


def docs_of(path):
    """(header, [(tokens, targets)] per document), the padding run at a row's end left out."""
    h, body = read_rows(path)
    pad = json.load(open(os.path.join(os.path.dirname(path), "meta.json")))["pad_token_id"]
    out = []
    for tok, tgt, ds in body:
        T = len(tok)
        t = 0
        while t < T:
            e = t + 1
            while e < T and ds[e] == ds[t]:
                e += 1
            is_pad = e == T and t > 0 and all(int(x) == pad for x in tok[t:e]) and all(y < 0 for y in tgt[t:e])
            if not is_pad:
                out.append(([int(x) for x in tok[t:e]], [int(x) for x in tgt[t:e]]))
            t = e
    return h, out


def trained_runs(tok, tgt):
    """Contiguous runs of trained target ids (targets[t] = tokens[t+1])."""
    runs, cur = [], []
    for t in range(len(tok)):
        if tgt[t] >= 0:
            cur.append(tgt[t])
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return runs


def dec(hf, ids):
    return hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


# ---- cases -----------------------------------------------------------------------------------

def case_alpaca(e):
    rows = F.alpaca_rows(9, seed=1)
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}]})
    e.data(sp, "a.jsonl", rows)
    d, meta = e.run(sp)
    hf = e.hf["llama3"]
    _, docs = docs_of(os.path.join(d, "train.bin"))
    by_text = {}
    for tok, tgt in docs:
        by_text[dec(hf, tok)] = (tok, tgt)
    bad = []
    for r in rows:
        sysp = P.ALPACA_SYSTEM if r["input"] else P.ALPACA_SYSTEM_NO_INPUT
        prompt = sysp + "\n\n### Instruction:\n" + r["instruction"] + "\n\n" + \
            ("### Input:\n" + r["input"] + "\n\n" if r["input"] else "") + "### Response:\n"
        full = "<|begin_of_text|>" + prompt + r["output"] + "<|end_of_text|>"
        if full not in by_text:
            bad.append("missing sample %r" % full[:80])
            continue
        tok, tgt = by_text[full]
        p = hf(prompt)["input_ids"]
        resp = hf(r["output"], add_special_tokens=False)["input_ids"] + [hf.eos_token_id]
        want_tgt = [-1] * (len(p) - 1) + resp + [-1]
        if tok != p + resp or tgt != want_tgt:
            bad.append("sample %r: tokens/targets differ" % r["instruction"])
    check("alpaca: prompt masked, response (no BOS) + EOS trained, no-input system prompt (%d samples)" % len(rows),
          not bad and meta["train_samples"] == len(rows), "; ".join(bad[:3]))
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}], "train_on_inputs": True})
    e.data(sp, "a.jsonl", rows)
    d, _ = e.run(sp)
    _, docs = docs_of(os.path.join(d, "train.bin"))
    ok = all(tg[:-1] == tk[1:] and tg[-1] == -1 for tk, tg in docs)
    check("alpaca: train_on_inputs trains every next token", ok)
    # alpaca:phi (Axolotl's Phi-3 example): the phi style's texts, spelled out, on the Phi-3 tokenizer.
    phi_tokenizer(e)
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca:phi"}]}, kind="phi3")
    e.data(sp, "a.jsonl", rows)
    d, _ = e.run(sp)
    hf = e.hf["phi3"]
    got = sorted((dec(hf, tk), [dec(hf, r) for r in trained_runs(tk, tg)]) for tk, tg in docs_of(os.path.join(d, "train.bin"))[1])
    want = []
    for r in rows:
        if r["input"]:
            prompt = "<|system|>\n%s<|end|>\n<|user|>\n%s<|end|>%s<|assistant|>" % (P.ALPACA_SYSTEM, r["instruction"], r["input"])
        else:
            prompt = "<|system|>\n%s<|end|>\n<|user|>\n%s<|end|>\n<|assistant|>\n" % (P.ALPACA_SYSTEM_NO_INPUT, r["instruction"])
        want.append(("<s>" + prompt + r["output"] + "<|endoftext|>", [r["output"] + "<|endoftext|>"]))
    check("alpaca:phi: Axolotl's phi style (no newlines around an input), response + EOS trained",
          got == sorted(want), "got %r want %r" % (got[:1], sorted(want)[:1]))


def llama3_convs():
    return F.sharegpt_rows(8, seed=3)


def case_chat_llama3(e):
    hf = e.hf["llama3"]
    rows = llama3_convs()
    ds = {"path": "c.jsonl", "type": "chat_template", "field_messages": "conversations",
          "message_property_mappings": {"role": "from", "content": "value"}, "roles_to_train": ["gpt"]}
    eot = hf.convert_tokens_to_ids("<|eot_id|>")
    heads = {hf.convert_tokens_to_ids(x) for x in ("<|start_header_id|>", "<|end_header_id|>")}

    def go(extra, ds_extra=None):
        cfg = {"datasets": [dict(ds, **(ds_extra or {}))], "chat_template": "llama3"}
        cfg.update(extra)
        sp = e.spec(cfg)
        e.data(sp, "c.jsonl", rows)
        d, _ = e.run(sp)
        return docs_of(os.path.join(d, "train.bin"))[1]

    docs = go({"special_tokens": {"eos_token": "<|eot_id|>"}})
    want = sorted(m["value"].strip() + "<|eot_id|>" for r in rows for m in r["conversations"] if m["from"] == "gpt")
    got = sorted(dec(hf, run) for tk, tg in docs for run in trained_runs(tk, tg))
    no_head = all(x not in heads for tk, tg in docs for x in tg if x >= 0)
    check("chat llama3: trained runs = assistant contents + <|eot_id|> (%d turns), headers never trained"
          % len(want), got == want and no_head, "got %r want %r" % (got[:2], want[:2]))
    docs = go({})
    got = sorted(dec(hf, run) for tk, tg in docs for run in trained_runs(tk, tg))
    want2 = sorted(w[:-len("<|eot_id|>")] for w in want)
    check("chat llama3: without eos_token <|eot_id|> the turn end is not trained (Axolotl's default eot = eos)",
          got == want2, "got %r" % got[:2])
    docs = go({"special_tokens": {"eos_token": "<|eot_id|>"}}, {"train_on_eos": "all"})
    n_eot = sum(1 for tk, tg in docs for x in tg if x == eot)
    n_turns = sum(len(r["conversations"]) for r in rows)
    check("chat llama3: train_on_eos all trains every turn's <|eot_id|> (%d of %d)" % (n_eot, n_turns),
          n_eot == n_turns)
    docs = go({"special_tokens": {"eos_token": "<|eot_id|>"}}, {"train_on_eos": "last"})
    n_eot = sum(1 for tk, tg in docs for x in tg if x == eot)
    check("chat llama3: train_on_eos last trains only the last <|eot_id|> of each conversation",
          n_eot == len(rows), "%d for %d conversations" % (n_eot, len(rows)))
    docs = go({"special_tokens": {"eos_token": "<|eot_id|>"}}, {"roles_to_train": ["human", "gpt"]})
    n_runs = sum(len(trained_runs(tk, tg)) for tk, tg in docs)
    n_ug = sum(1 for r in rows for m in r["conversations"] if m["from"] in ("human", "gpt"))
    check("chat llama3: roles_to_train [human, gpt] maps to user and assistant (%d runs)" % n_runs, n_runs == n_ug)


def case_chat_chatml(e):
    hf = e.hf["qwen2"]
    rows = F.messages_rows(8, seed=4)
    sp = e.spec({"datasets": [{"path": "m.jsonl", "type": "chat_template"}], "eot_tokens": ["<|im_end|>"]},
                kind="qwen2")
    e.data(sp, "m.jsonl", rows)
    d, _ = e.run(sp)
    docs = docs_of(os.path.join(d, "train.bin"))[1]
    got = sorted(dec(hf, run) for tk, tg in docs for run in trained_runs(tk, tg))
    want = sorted(m["content"] + "<|im_end|>" for r in rows for m in r["messages"] if m["role"] == "assistant")
    full_ok = all(dec(hf, tk).startswith("<|im_start|>") for tk, tg in docs)
    check("chat chatml (tokenizer_default, no BOS): trained runs = assistant content + <|im_end|>, not the newline",
          got == want and full_ok, "got %r want %r" % (got[:2], want[:2]))
    sp = e.spec({"datasets": [{"path": "m.jsonl", "type": "chat_template", "roles_to_train": [],
                               "train_on_eos": "none"}]}, kind="qwen2")
    e.data(sp, "m.jsonl", rows)
    d, _ = e.run(sp)
    docs = docs_of(os.path.join(d, "train.bin"))[1]
    ok = len(docs) == len(rows)
    for tk, tg in docs:
        runs = trained_runs(tk, tg)
        ok &= len(runs) == 1 and tg[-1] == -1 and tg[-2] >= 0  # one run to the end
        if not ok:
            print(tk, tg)
            break
    check("chat chatml: roles_to_train [] and train_on_eos none = Axolotl's legacy rule (everything after the "
          "last prompt)", ok)


def gemma_turns(e, sp, rows):
    """Prepares sp over rows (ShareGPT, Gemma's tokenizer): the trained runs as text, sorted, what
    they should be (each assistant turn's content + <end_of_turn>), and the documents' texts."""
    hf = e.hf["gemma3"]
    e.data(sp, "g.jsonl", rows)
    d, _ = e.run(sp)
    docs = docs_of(os.path.join(d, "train.bin"))[1]
    got = sorted(dec(hf, run) for tk, tg in docs for run in trained_runs(tk, tg))
    want = sorted(m["value"].strip() + "<end_of_turn>" for r in rows for m in r["conversations"] if m["from"] == "gpt")
    return got, want, {dec(hf, tk) for tk, tg in docs}


def case_chat_gemma3(e):
    rows = F.sharegpt_rows(8, seed=5)
    sp = e.spec({"datasets": [{"path": "g.jsonl", "type": "chat_template", "field_messages": "conversations",
                               "message_property_mappings": {"role": "from", "content": "value"}}],
                 "chat_template": "gemma3", "eot_tokens": ["<end_of_turn>"]}, kind="gemma3")
    got, want, texts = gemma_turns(e, sp, rows)
    # Gemma's format, spelled out: the system text opens the first user turn.
    wtexts = set()
    for r in rows:
        t, carry = "<bos>", ""
        for m in r["conversations"]:
            if m["from"] == "system":
                carry = m["value"] + "\n\n"
                continue
            t += "<start_of_turn>%s\n%s%s<end_of_turn>\n" % ("model" if m["from"] == "gpt" else "user", carry,
                                                                 m["value"].strip())
            carry = ""
        wtexts.add(t)
    check("chat gemma3: trained runs = assistant content + <end_of_turn> (%d turns), texts in Gemma's turn format"
          % len(want), got == want and texts == wtexts,
          "got %r want %r; texts %r want %r" % (got[:2], want[:2], sorted(texts)[:1], sorted(wtexts)[:1]))


def case_chat_gemma(e):
    """chat_template: gemma (Axolotl's Gemma 2 examples, with drop_system_message: true): Gemma's
    turns with no system text anywhere; without drop_system_message a system message is a
    one-line error, as are turns that do not alternate."""
    rows = F.sharegpt_rows(8, seed=6)
    ds = {"path": "g.jsonl", "type": "chat_template", "field_messages": "conversations", "drop_system_message": True,
          "message_property_mappings": {"role": "from", "content": "value"}}
    sp = e.spec({"datasets": [ds], "chat_template": "gemma", "eot_tokens": ["<end_of_turn>"]}, kind="gemma3")
    got, want, texts = gemma_turns(e, sp, rows)  # Gemma 2's tokenizer has Gemma 3's special tokens
    wtexts = {"<bos>" + "".join("<start_of_turn>%s\n%s<end_of_turn>\n" % ("model" if m["from"] == "gpt" else "user",
                                                                         m["value"].strip())
                                for m in r["conversations"] if m["from"] != "system") for r in rows}
    check("chat gemma: trained runs = assistant content + <end_of_turn> (%d turns), system messages dropped"
          % len(want), got == want and texts == wtexts,
          "got %r want %r; texts %r want %r" % (got[:2], want[:2], sorted(texts)[:1], sorted(wtexts)[:1]))
    sp2 = e.spec({"datasets": [dict(ds, drop_system_message=False)], "chat_template": "gemma"}, kind="gemma3")
    e.data(sp2, "g.jsonl", rows)
    msg = e.err(sp2)
    check("chat gemma: a system message without drop_system_message is a one-line error naming the system role",
          "system role" in msg and "\n" not in msg.strip(), msg)
    sp3 = e.spec({"datasets": [ds], "chat_template": "gemma"}, kind="gemma3")
    e.data(sp3, "g.jsonl", [{"conversations": [{"from": "human", "value": "one"}, {"from": "human", "value": "two"}]}])
    msg = e.err(sp3)
    check("chat gemma: turns that do not alternate are a one-line error", "alternate" in msg, msg)


QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def phi_tokenizer(e):
    """The phi3 fixture tokenizer, made once (only two cases use it)."""
    if "phi3" not in e.hf:
        from transformers import AutoTokenizer
        d = os.path.join(e.root, "tok_phi3")
        F.make_tokenizer(d, "phi3")
        e.tok["phi3"], e.hf["phi3"] = d, AutoTokenizer.from_pretrained(d)


def named_docs(e, sp, rows, kind):
    """Prepares sp over rows: (the documents' texts, sorted, and the trained runs as text of each)."""
    hf = e.hf[kind]
    e.data(sp, "n.jsonl", rows)
    d, _ = e.run(sp)
    docs = docs_of(os.path.join(d, "train.bin"))[1]
    out = sorted((dec(hf, tk), [dec(hf, r) for r in trained_runs(tk, tg)]) for tk, tg in docs)  # rows are shuffled
    return [t for t, r in out], [r for t, r in out]


def by_text(texts, runs):
    """texts and their runs in the order named_docs returns them."""
    out = sorted(zip(texts, runs))
    return [t for t, r in out], [r for t, r in out]


def case_chat_named(e):
    """chat_template: qwen_25, qwen3 and phi_3 (Axolotl's Qwen2.5 DPO, Qwen3 and Phi-3 examples name
    them): each conversation in the family's format spelled out here, the assistant turns (and the
    end-of-turn token) trained; Qwen3's <think> block on the last assistant turn only; tools and
    tool calls from the record reach the template, and a turn's tool calls are trained with it."""
    phi_tokenizer(e)
    rows = F.messages_rows(8, seed=7)
    chatml = lambda m: "<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"])  # noqa: E731
    row_runs = [[m["content"] + "<|im_end|>" for m in r["messages"] if m["role"] == "assistant"] for r in rows]
    sp = e.spec({"datasets": [{"path": "n.jsonl", "type": "chat_template"}], "chat_template": "qwen_25",
                 "eot_tokens": ["<|im_end|>"]}, kind="qwen2")
    texts, runs = named_docs(e, sp, rows, "qwen2")
    want = [("" if r["messages"][0]["role"] == "system" else chatml({"role": "system", "content": QWEN_SYSTEM}))
            + "".join(chatml(m) for m in r["messages"]) for r in rows]
    want, want_runs = by_text(want, row_runs)
    check("chat qwen_25: ChatML turns after Qwen's default system line (or the conversation's own), assistant "
          "content + <|im_end|> trained", texts == want and runs == want_runs,
          "texts %r want %r; runs %r want %r" % (texts[:1], want[:1], runs[:1], want_runs[:1]))

    sp = e.spec({"datasets": [{"path": "n.jsonl", "type": "chat_template"}], "chat_template": "qwen3",
                 "eot_tokens": ["<|im_end|>"]}, kind="qwen2")
    texts, runs = named_docs(e, sp, rows, "qwen2")
    want = []
    for r in rows:
        last = len(r["messages"]) - 1
        want.append("".join(chatml(dict(m, content="<think>\n\n</think>\n\n" + m["content"]) if i == last else m)
                            for i, m in enumerate(r["messages"])))
    want, want_runs = by_text(want, row_runs)
    check("chat qwen3: no default system line, an empty <think> block on the last assistant turn only (not "
          "trained), assistant content + <|im_end|> trained", texts == want and runs == want_runs,
          "texts %r want %r; runs %r want %r" % (texts[:1], want[:1], runs[:1], want_runs[:1]))
    conv = [{"role": "user", "content": "one two"}, {"role": "assistant", "content": "three", "reasoning_content": "a"},
            {"role": "user", "content": "four"}, {"role": "assistant", "content": "<think>the king\n</think>five six"}]
    texts, runs = named_docs(e, sp, [{"messages": conv}], "qwen2")
    want = ("<|im_start|>user\none two<|im_end|>\n<|im_start|>assistant\nthree<|im_end|>\n<|im_start|>user\nfour"
            "<|im_end|>\n<|im_start|>assistant\n<think>\nthe king\n</think>\n\nfive six<|im_end|>\n")
    ok = texts == [want] and len(runs[0]) == 2 and runs[0][0] == "three<|im_end|>" and \
        runs[0][1].endswith("the king\n</think>\n\nfive six<|im_end|>") and "<think>" not in runs[0][1]
    # Axolotl finds a turn in the rendering of the conversation up to it, where Qwen3 still shows
    # the first answer's reasoning: its span there ("<think>\na\n</think>\n\nthree") lands on
    # other tokens of the whole text (the user's "four" would be trained).
    check("chat qwen3: reasoning (reasoning_content, or <think> in the text) shown after the last user turn only "
          "and trained with the answer; an earlier turn's span is where its text is", ok,
          "texts %r want %r; runs %r" % (texts, [want], runs))

    rec = {"tools": json.dumps([dict(WEATHER, function=dict(WEATHER["function"], parameters=json.dumps(
        WEATHER["function"]["parameters"])))]),
        "messages": [{"role": "user", "content": "weather in Oslo?"},
                     {"role": "assistant", "tool_calls": [{"type": "function", "function": {
                         "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                     {"role": "tool", "content": "cold"}, {"role": "tool", "content": "windy"},
                     {"role": "assistant", "content": "cold and windy"}]}
    sp = e.spec({"datasets": [{"path": "n.jsonl", "type": "chat_template"}], "chat_template": "qwen_25",
                 "eot_tokens": ["<|im_end|>"]}, kind="qwen2", T=1024)
    texts, runs = named_docs(e, sp, [rec], "qwen2")
    want = ("<|im_start|>system\n" + QWEN_SYSTEM + "\n\n# Tools\n\nYou may call one or more functions to assist with "
            "the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            + json.dumps(WEATHER) + "\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
            "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nweather in Oslo?<|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
            "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\ncold\n</tool_response>\n<tool_response>\nwindy\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\ncold and windy<|im_end|>\n")
    ok = texts == [want] and len(runs[0]) == 2 and runs[0][0].endswith(
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call><|im_end|>") and \
        runs[0][1] == "cold and windy<|im_end|>"
    check("chat qwen_25 with tools: the record's tools (a JSON string, parameters too) listed in the system turn, "
          "a message's tool_calls (arguments as a JSON string) written and trained, tool results in one user turn",
          ok, "texts %r want %r; runs %r" % (texts, [want], runs))
    bad = dict(rec, tools="[{not json")
    sp = e.spec({"datasets": [{"path": "n.jsonl", "type": "chat_template"}], "chat_template": "qwen_25"}, kind="qwen2")
    e.data(sp, "n.jsonl", [bad])
    msg = e.err(sp)
    check("chat qwen_25: tools that are not JSON are an error naming the record and the field",
          "n.jsonl:1" in msg and "tools: not JSON" in msg, msg)

    sp = e.spec({"datasets": [{"path": "n.jsonl", "type": "chat_template"}], "chat_template": "phi_3",
                 "eot_tokens": ["<|end|>"]}, kind="phi3")
    texts, runs = named_docs(e, sp, rows, "phi3")
    want = ["<s>" + "".join("<|%s|>\n%s<|end|>\n%s" % (m["role"], m["content"], "<|assistant|>\n" if m["role"] == "user"
                                                        else "") if m["role"] != "assistant" else m["content"] + "<|end|>\n"
                            for m in r["messages"]) for r in rows]
    want_phi = [[m["content"] + "<|end|>" for m in r["messages"] if m["role"] == "assistant"] for r in rows]
    want, want_phi = by_text(want, want_phi)
    check("chat phi_3: <s>, tagged turns closed by <|end|>, a user turn opening the assistant's; assistant content "
          "+ <|end|> trained", texts == want and runs == want_phi,
          "texts %r want %r; runs %r want %r" % (texts[:1], want[:1], runs[:1], want_phi[:1]))
    e.data(sp, "n.jsonl", [{"messages": [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}]}])
    msg = e.err(sp)
    check("chat phi_3: a role Phi-3 does not have is an error naming the record and the role",
          "n.jsonl:1" in msg and "'tool'" in msg, msg)
    sp = e.spec({"datasets": [{"path": "n.jsonl", "type": "chat_template"}], "chat_template": "phi_3"}, kind="qwen2")
    e.data(sp, "n.jsonl", rows)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        msg = e.err(sp)
    check("chat phi_3 with a tokenizer that lacks <|user|>: a note naming the tokens, the markers as text",
          not msg and "no token <|user|> or <|assistant|> or <|end|>" in out.getvalue(), msg or out.getvalue()[-300:])


def case_input_output(e):
    hf = e.hf["llama2"]
    rows = [{"segments": [{"text": "<s>question: one two", "label": False}, {"text": " answer three</s>",
                                                                             "label": True}]}] * 3
    sp = e.spec({"datasets": [{"path": "io.jsonl", "type": "input_output"}]}, kind="llama2")
    e.data(sp, "io.jsonl", rows)
    d, _ = e.run(sp)
    docs = docs_of(os.path.join(d, "train.bin"))[1]
    a = hf("<s>question: one two", add_special_tokens=False)["input_ids"]
    b = hf(" answer three</s>", add_special_tokens=False)["input_ids"]
    want = [-1] * (len(a) - 1) + b + [-1]
    check("input_output: segments concatenated without added tokens, label false masked",
          len(docs) == 3 and all(tk == a + b and tg == want for tk, tg in docs), docs[:1])


def case_completion(e):
    hf = e.hf["llama2"]
    rows = [{"body": F.sentence(np.random.default_rng(i), 60, 90)} for i in range(3)]
    T = 32
    sp = e.spec({"datasets": [{"path": "t.jsonl", "type": "completion", "field": "body"}]}, kind="llama2", T=T)
    e.data(sp, "t.jsonl", rows)
    d, meta = e.run(sp)
    docs = docs_of(os.path.join(d, "train.bin"))[1]
    want = []
    for r in rows:
        ids = hf(r["body"])["input_ids"] + [hf.eos_token_id]
        want += [ids[i:i + T] for i in range(0, len(ids), T) if len(ids[i:i + T]) >= 2]
    ok = sorted(tk for tk, tg in docs) == sorted(want) and all(tg[:-1] == tk[1:] for tk, tg in docs)
    check("completion: field body, BOS + text + EOS cut into %d-token pieces, all trained (%d pieces)" % (T, len(want)),
          ok and meta["dropped_long"] == 0)


def case_pretraining(e):
    rows = F.text_rows(12, seed=5, lo=3, hi=20)
    sp = e.spec({"pretraining_dataset": [{"path": "p.jsonl", "type": "pretrain", "text_column": "text"}]},
                kind="llama2", T=64)
    e.data(sp, "p.jsonl", rows)
    d, meta = e.run(sp)
    h, body = read_rows(os.path.join(d, "train.bin"))
    docs = docs_of(os.path.join(d, "train.bin"))[1]
    hf = e.hf["llama2"]
    want = sorted(hf(r["text"])["input_ids"] + [hf.eos_token_id] for r in rows)
    check("pretraining_dataset: packed rows (%d) of BOS + text + EOS documents" % h[3],
          meta["packed"] and h[4] & 1 and sorted(tk for tk, _ in docs) == want and h[3] < len(rows))


def case_packing(e):
    rows = F.alpaca_rows(20, seed=6)
    base = {"datasets": [{"path": "a.jsonl", "type": "alpaca"}]}
    got = {}
    for packed in (False, True):
        sp = e.spec(dict(base, sample_packing=packed), T=512)
        e.data(sp, "a.jsonl", rows)
        d, meta = e.run(sp)
        h, body = read_rows(os.path.join(d, "train.bin"))
        got[packed] = (h, sorted(docs_of(os.path.join(d, "train.bin"))[1]), body)
    h0, d0, _ = got[False]
    h1, d1, body = got[True]
    cross = 0
    for tok, tgt, ds in body:
        for t in range(len(tok) - 1):
            if tgt[t] >= 0 and ds[t + 1] != ds[t]:
                cross += 1
    check("packing: %d rows instead of %d, the same documents and targets, none crossing a boundary"
          % (h1[3], h0[3]), h1[3] < h0[3] and d0 == d1 and cross == 0 and h1[6] == h0[6] == 20
          and h1[7] == h0[7])
    # Axolotl's packer limits: at most sample_packing_bin_size samples a row, and groups of
    # sample_packing_group_size samples packed apart (a group of one: a row each).
    for extra, want in (({"sample_packing_bin_size": 3}, "at most 3 a row"), ({"sample_packing_group_size": 1}, "20 rows")):
        sp = e.spec(dict(base, sample_packing=True, **extra), T=512)
        e.data(sp, "a.jsonl", rows)
        d, meta = e.run(sp)
        h, body = read_rows(os.path.join(d, "train.bin"))
        per_row = [len(set(int(x) for x in ds)) for _, _, ds in body]  # documents (and padding) a row
        ok = max(per_row) <= 4 and int(h[3]) >= 7 if "bin" in next(iter(extra)) else int(h[3]) == 20
        check("packing with %s: %s (%d rows, %s segments a row)" % (extra, want, h[3], sorted(set(per_row))),
              ok and sorted(docs_of(os.path.join(d, "train.bin"))[1]) == d0)
    sp = e.spec(dict(base, sample_packing=True, sample_packing_bin_size=0))
    e.data(sp, "a.jsonl", rows)
    msg = e.err(sp)
    check("sample_packing_bin_size 0 is refused by name", "sample_packing_bin_size: expected a whole number" in msg, msg)
    # sample_packing_sequentially (Axolotl's key): next fit in the samples' order, so the rows
    # read in order hold the unpacked run's samples in its order, and each row's first sample
    # did not fit in what the row before left free.
    mixed = [dict(r) for r in rows]  # long and short samples, so that first fit fills earlier rows' holes
    rng = np.random.default_rng(3)
    for r in mixed[::2]:
        r["output"] = F.sentence(rng, 120, 160)
    order = {}
    for packed, seq in ((False, False), (True, True), (True, False)):
        sp = e.spec(dict(base, sample_packing=packed, sample_packing_sequentially=seq), T=512)
        e.data(sp, "a.jsonl", mixed)
        d, meta = e.run(sp)
        order[packed, seq] = [tuple(t) for t, _ in docs_of(os.path.join(d, "train.bin"))[1]]
        if packed and seq:
            pad = meta["pad_token_id"]
            used = []  # tokens of documents in each row, the padding left out
            for tok, tgt, ds in read_rows(os.path.join(d, "train.bin"))[1]:
                n = s0 = int(ds[-1])  # the last segment: the padding when it is all pad, untrained
                if not (s0 > 0 and all(int(x) == pad for x in tok[s0:]) and all(y < 0 for y in tgt[s0:])):
                    n = len(tok)
                used.append((n, [int(x) for x in ds[:n]]))
    firsts = [len([x for x in ds if x == 0]) for _, ds in used]  # each row's first document
    next_fit = all(firsts[i + 1] > 512 - used[i][0] for i in range(len(used) - 1))
    check("sample_packing_sequentially: the rows keep the samples' order, each row's first sample "
          "too long for what the row before left (next fit); %d rows" % len(used),
          order[True, True] == order[False, False] and next_fit and order[True, False] != order[True, True],
          [u for u, _ in used])


def case_val_split(e):
    rows = F.alpaca_rows(21, seed=7)

    def split(seed, v):
        sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}], "val_set_size": v}, seed=seed)
        e.data(sp, "a.jsonl", rows)
        d, meta = e.run(sp)
        ev = sorted(tuple(tk) for tk, _ in docs_of(os.path.join(d, "eval.bin"))[1])
        return meta, ev
    m1, e1 = split(1, 0.1)
    m2, e2 = split(1, 0.1)
    m3, e3 = split(2, 0.1)
    m4, _ = split(1, 5)
    check("val_split: ceil(0.1 x 21) = 3 eval samples, the same for the same seed, others for another seed",
          m1["eval_samples"] == 3 and m1["train_samples"] == 18 and e1 == e2 and e1 != e3, (m1, m3))
    check("val_split: an integer val_set_size is a count (5)", m4["eval_samples"] == 5 and m4["train_samples"] == 16)


def case_excess_length(e):
    rows = F.alpaca_rows(6, seed=8)
    rows[2]["output"] = F.sentence(np.random.default_rng(0), 150, 150)
    for how in ("drop", "truncate", "raise"):
        sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}], "excess_length_strategy": how}, T=128)
        e.data(sp, "a.jsonl", rows)
        if how == "raise":
            msg = e.err(sp)
            check("excess_length raise: names the file and line", "a.jsonl:3:" in msg and "sequence_len 128" in msg, msg)
            continue
        d, meta = e.run(sp)
        if how == "drop":
            check("excess_length drop: one dropped, counted with its line", meta["dropped_long"] == 1 and
                  meta["train_samples"] == 5 and meta["first_dropped"].endswith("a.jsonl:3"), meta)
        else:
            docs = docs_of(os.path.join(d, "train.bin"))[1]
            check("excess_length truncate: kept, cut to sequence_len", meta["train_samples"] == 6 and
                  max(len(tk) for tk, _ in docs) == 128, meta)


def case_formats(e):
    rows = F.alpaca_rows(8, seed=9)
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}]})
    e.data(sp, "a.jsonl", rows)
    d, _ = e.run(sp)
    ref = sorted(docs_of(os.path.join(d, "train.bin"))[1])

    def same(name, cfg_ds, write):
        sp = e.spec({"datasets": [cfg_ds]})
        write(sp["config_dir"])
        try:
            d, _ = e.run(sp)
            got = sorted(docs_of(os.path.join(d, "train.bin"))[1])
            check("formats: %s gives the same samples" % name, got == ref)
        except P.DataError as ex:
            check("formats: %s gives the same samples" % name, False, str(ex))

    def json_list(dd):
        with open(os.path.join(dd, "a.json"), "w") as f:
            json.dump(rows, f, indent=1)
    same("a JSON list (.json)", {"path": "a.json", "type": "alpaca"}, json_list)

    def parquet(dd):
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.Table.from_pylist(rows), os.path.join(dd, "a.parquet"))
    try:
        import pyarrow  # noqa: F401
        same("parquet", {"path": "a.parquet", "type": "alpaca"}, parquet)
    except ImportError:
        print("SKIP formats: parquet (pyarrow not installed)")

    def directory(dd):
        F.write_jsonl(os.path.join(dd, "data", "part-0.jsonl"), rows[:5])
        F.write_jsonl(os.path.join(dd, "data", "part-1.jsonl"), rows[5:])
    same("a directory of jsonl files", {"path": "data", "type": "alpaca"}, directory)
    same("data_files in a directory", {"path": "data", "type": "alpaca", "data_files": ["part-0.jsonl", "part-1.jsonl"]},
         directory)

    def csvf(dd):
        import csv
        with open(os.path.join(dd, "a.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["instruction", "input", "output"])
            w.writeheader()
            w.writerows(rows)
    same("csv", {"path": "a.csv", "type": "alpaca"}, csvf)
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca", "split": "train[:50%]"}]})
    e.data(sp, "a.jsonl", rows)
    d, meta = e.run(sp)
    check("formats: split train[:50%] takes the first half", meta["train_samples"] == 4)


def case_cache(e):
    rows = F.alpaca_rows(6, seed=10)
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}]})
    e.data(sp, "a.jsonl", rows)
    d1, m1 = e.run(sp)
    t1 = os.stat(os.path.join(d1, "train.bin")).st_mtime_ns
    d2, _ = e.run(sp)
    check("cache: a second run reuses the directory", d1 == d2 and os.stat(os.path.join(d2, "train.bin")).st_mtime_ns == t1)
    e.data(sp, "a.jsonl", rows[:5])
    d3, m3 = e.run(sp)
    check("cache: a changed data file prepares again", d3 != d1 and m3["train_samples"] == 5)
    sp2 = dict(sp, sequence_len=200)
    d4, _ = e.run(sp2)
    check("cache: another sequence_len is another key", d4 not in (d1, d3))
    os.remove(os.path.join(d3, "meta.json"))
    d5, m5 = e.run(sp)
    check("cache: a directory without meta.json is stale and rebuilt", d5 == d3 and m5["train_samples"] == 5)
    left = [x for x in os.listdir(sp["prepared_root"]) if x.startswith(".tmp")]
    check("cache: no temporary directories left", not left, left)


def one_line(e, name, spec, *needles):
    sp = os.path.join(spec["config_dir"], "spec.json")
    with open(sp, "w") as f:
        json.dump(spec, f)
    p = subprocess.run([sys.executable, SCRIPT, "--spec", sp, "--result", os.path.join(spec["config_dir"], "r.txt")],
                       capture_output=True, text=True)
    err = p.stderr.strip().splitlines()
    ok = p.returncode == 1 and len(err) == 1 and err[0].startswith("error: ") and all(n in err[0] for n in needles)
    check("errors: %s" % name, ok, "rc %d: %r" % (p.returncode, p.stderr[-400:]))


def case_errors(e):
    bad = F.alpaca_rows(4, seed=11)
    del bad[2]["output"]
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}]})
    e.data(sp, "a.jsonl", bad)
    one_line(e, "a record without output names file:line and field", sp, "a.jsonl:3: output: missing")
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}]})
    with open(os.path.join(sp["config_dir"], "a.jsonl"), "w") as f:
        f.write('{"instruction": "a", "output": "b"}\n{"instruction": "a", "output": \n')
    one_line(e, "invalid JSON names its line", sp, "a.jsonl:2: invalid JSON")
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "sharegpt"}]})
    e.data(sp, "a.jsonl", F.alpaca_rows(2))
    one_line(e, "an unsupported type names it and the supported ones", sp, "datasets[0].type: 'sharegpt'", "chat_template")
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca", "shards": 4}]})
    e.data(sp, "a.jsonl", F.alpaca_rows(2))
    one_line(e, "an unsupported dataset key is refused by name", sp, "datasets[0].shards: not supported")
    sp = e.spec({"datasets": [{"path": "tatsu-lab/alpaca", "type": "alpaca"}]})
    one_line(e, "a hub dataset id says it is not downloaded", sp, "tatsu-lab/alpaca", "not downloaded")
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}], "test_datasets": [{"path": "a.jsonl",
                 "type": "alpaca"}], "val_set_size": 0.1})
    e.data(sp, "a.jsonl", F.alpaca_rows(2))
    one_line(e, "val_set_size with test_datasets", sp, "val_set_size", "not both")
    sp = e.spec({"datasets": [{"path": "m.jsonl", "type": "chat_template"}], "chat_template": "chatml"}, kind="llama2")
    e.data(sp, "m.jsonl", F.messages_rows(2))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        d, _ = e.run(sp)
    text = dec(e.hf["llama2"], docs_of(os.path.join(d, "train.bin"))[1][0][0])
    check("chatml on a tokenizer without <|im_start|>: a note, and the markers tokenized as text (as Axolotl)",
          "has no token <|im_start|> or <|im_end|>" in out.getvalue() and "<|im_start|>user\n" in text,
          "%r %r" % (out.getvalue()[-300:], text[:80]))
    sp = e.spec({"datasets": [{"path": "m.jsonl", "type": "chat_template"}]}, kind="llama2")
    e.data(sp, "m.jsonl", F.messages_rows(2))
    one_line(e, "tokenizer_default without a template", sp, "chat_template", "no chat template")
    n = len(e.hf["llama3"])
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}], "special_tokens": {"pad_token": "<PAD>"}},
                vocab=n)
    e.data(sp, "a.jsonl", F.alpaca_rows(2))
    one_line(e, "a new special token beyond vocab_size", sp, "special_tokens.pad_token", "vocab_size is %d" % n)
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}]}, vocab=300)
    e.data(sp, "a.jsonl", F.alpaca_rows(2))
    one_line(e, "a tokenizer larger than the model's vocab_size (Axolotl would resize)", sp, "has %d tokens"
             % len(e.hf["llama3"]), "vocab_size is 300", "resize the embeddings to %d" % len(e.hf["llama3"]))
    sp = e.spec({"datasets": [{"path": "m.jsonl", "type": "chat_template", "field_messages": "conv"}]}, kind="qwen2")
    e.data(sp, "m.jsonl", F.messages_rows(2))
    one_line(e, "missing field_messages names the field", sp, "m.jsonl:1: conv: expected a non-empty list")
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}], "default_system_message": "hi"})
    e.data(sp, "a.jsonl", F.alpaca_rows(2))
    one_line(e, "default_system_message refused", sp, "default_system_message: not supported")
    sp = e.spec({"datasets": [{"path": "m.jsonl", "type": "chat_template"}]}, kind="qwen2")
    e.data(sp, "m.jsonl", F.messages_rows(2) + [{"messages": []}])
    one_line(e, "an empty conversation names its line", sp, "m.jsonl:3: messages: expected a non-empty list")
    left = os.listdir(sp["prepared_root"]) if os.path.isdir(sp["prepared_root"]) else []
    check("errors: nothing (not even a temporary directory) left in the cache after a failure", not left, left)
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}]})
    with open(os.path.join(sp["config_dir"], "a.jsonl"), "wb") as f:
        f.write(b'{"instruction": "a", "output": "b"}\n{"instruction": "caf\xe9", "output": "b"}\n')
    one_line(e, "invalid UTF-8 names its line", sp, "a.jsonl:2: not valid UTF-8")
    sp = e.spec({"datasets": [{"path": "m.jsonl", "type": "chat_template"}]}, kind="qwen2")
    e.data(sp, "m.jsonl", [{"messages": [{"role": "user", "content": 5}]}])
    one_line(e, "a message content of the wrong type", sp, "m.jsonl:1: messages[0]: content: expected a string, got int")
    sp = e.spec({"datasets": [{"path": "a.json", "type": "alpaca"}]})
    with open(os.path.join(sp["config_dir"], "a.json"), "w") as f:
        f.write('[\n {"instruction": "a", "output": "b"},\n {"instruction": 3,\n  "output": "c"}\n]\n')
    one_line(e, "a JSON list's record is named by its line", sp, "a.json:3: instruction: expected a string")


def case_dataset_keys(e):
    rows = F.alpaca_rows(6, seed=12)
    rows = rows + rows[:2]  # two exact duplicates
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}], "dataset_exact_deduplication": True})
    e.data(sp, "a.jsonl", rows)
    d, meta = e.run(sp)
    check("dataset_exact_deduplication drops the 2 duplicates", meta["train_samples"] == 6 and
          meta["duplicates_removed"] == 2, meta)
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}], "min_sample_len": 60})
    e.data(sp, "a.jsonl", rows[:6])
    d, meta = e.run(sp)
    _, docs = docs_of(os.path.join(d, "train.bin"))
    check("min_sample_len 60 drops shorter samples (%d kept)" % meta["train_samples"],
          0 < meta["train_samples"] < 6 and min(len(tk) for tk, _ in docs) >= 60)
    outs = []
    for before in (False, True):
        sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}], "val_set_size": 2,
                     "shuffle_merged_datasets": False, "shuffle_before_merging_datasets": before})
        e.data(sp, "a.jsonl", rows[:6])
        d, meta = e.run(sp)
        outs.append(sorted(docs_of(os.path.join(d, "eval.bin"))[1]))
    check("shuffle_before_merging_datasets changes which samples the split sees last", outs[0] != outs[1])
    sp = e.spec({"pretraining_dataset": [{"path": "p.jsonl"}], "pretraining_sample_concatenation": True})
    e.data(sp, "p.jsonl", F.text_rows(3))
    msg = e.err(sp)
    check("pretraining_sample_concatenation is refused with what happens instead", "not supported" in msg, msg)


def case_shard_tokenizer_keys(e):
    rows = F.alpaca_rows(10, seed=21)

    def docs(extra, rws=rows, T=256):
        sp = e.spec(dict({"datasets": [{"path": "a.jsonl", "type": "alpaca"}]}, **extra), T=T)
        e.data(sp, "a.jsonl", rws)
        d, meta = e.run(sp)
        return [tuple(t) for t, _ in docs_of(os.path.join(d, "train.bin"))[1]], meta

    whole, _ = docs({})
    parts = [docs({"dataset_shard_num": 3, "dataset_shard_idx": i}) for i in range(3)]
    check("dataset_shard_num 3: pieces of 4, 3 and 3 of the 10 samples",
          [len(p) for p, _ in parts] == [4, 3, 3] and [m["dataset_shard"] for _, m in parts] == [[0, 3], [1, 3], [2, 3]],
          [(len(p), m["dataset_shard"]) for p, m in parts])
    check("dataset_shard: contiguous pieces of the shuffled samples (together, the unsharded run's in its order)",
          sum((p for p, _ in parts), []) == whole)
    # Axolotl shuffles the merged samples, then filters by length: dropping a long sample leaves
    # the others where a run that truncates it has them (filtering first reorders them all).
    long_rows = [dict(r) for r in rows]
    long_rows[3]["output"] = F.sentence(np.random.default_rng(0), 150, 150)
    dropped, md = docs({"excess_length_strategy": "drop"}, long_rows, T=128)
    cut, _ = docs({"excess_length_strategy": "truncate"}, long_rows, T=128)
    check("the merged shuffle comes before the length filter (Axolotl's order)", md["dropped_long"] == 1 and
          len(dropped) == 9 and dropped == [d for d in cut if len(d) != 128], (md["dropped_long"], len(dropped)))
    # Deduplication comes before the shard, as in Axolotl (2026-07): of 6 samples and 2 repeats
    # (in file order), the second of 2 pieces is samples 3-5.
    dup_rows = rows[:6] + rows[:2]
    p1, m1 = docs({"dataset_shard_num": 2, "dataset_shard_idx": 1, "shuffle_merged_datasets": False,
                   "dataset_exact_deduplication": True}, dup_rows)
    first6, _ = docs({"shuffle_merged_datasets": False}, rows[:6])
    check("dataset_exact_deduplication before dataset_shard: the second piece is samples 3-5",
          p1 == first6[3:] and m1["duplicates_removed"] == 2, (len(p1), m1["duplicates_removed"]))
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}], "dataset_shard_num": 3, "dataset_shard_idx": 3})
    e.data(sp, "a.jsonl", rows)
    msg = e.err(sp)
    check("dataset_shard_idx 3 of 3 is refused by name", "dataset_shard_idx: 3 is not below dataset_shard_num 3" in msg, msg)
    sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}], "dataset_shard_num": "two", "dataset_shard_idx": 0})
    e.data(sp, "a.jsonl", rows)
    msg = e.err(sp)
    check("dataset_shard_num 'two' is refused by name", "dataset_shard_num: expected a whole number" in msg, msg)
    # Axolotl's tokenizer keys reach transformers: a class by name, use_fast and legacy (the
    # byte-level fixture tokenizes alike with each), and names that are not are refused.
    same, _ = docs({"tokenizer_type": "GPT2TokenizerFast", "tokenizer_use_fast": False, "tokenizer_legacy": False})
    check("tokenizer_type GPT2TokenizerFast, tokenizer_use_fast/legacy false: the same samples", same == whole)
    for key, val, want in (("tokenizer_type", "NoSuchTokenizer", "tokenizer_type: 'NoSuchTokenizer' is not a tokenizer class"),
                           ("tokenizer_use_fast", "yes", "tokenizer_use_fast: expected true or false")):
        sp = e.spec({"datasets": [{"path": "a.jsonl", "type": "alpaca"}], key: val})
        e.data(sp, "a.jsonl", rows)
        msg = e.err(sp)
        check("%s %r is refused by name" % (key, val), want in msg, msg)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        half, _ = docs({"dataset_shard_num": 3})
    check("dataset_shard_num alone: a note, no sharding (as Axolotl)", half == whole and
          "dataset_shard_num without dataset_shard_idx" in out.getvalue(), out.getvalue())


def case_tokens_saved_tokenizer(e):
    """`tokens:` and special_tokens as Axolotl's loader applies them (AddedToken, normalized=False;
    the ids they get must fit the model's vocab_size), the config's chat template set on the
    tokenizer, all saved in the prepared tokenizer/ (written beside the final model); an adapter
    run refuses tokens the embeddings would have to learn, on a cache hit too."""
    from transformers import AutoTokenizer
    n = len(e.hf["llama3"])
    cfg = {"datasets": [{"path": "t.jsonl", "type": "completion"}], "tokens": ["<tool>", "Zz Top", "<|im_start|>", "<|im_end|>"],
           "special_tokens": {"pad_token": "<PAD>"}, "chat_template": "chatml"}
    sp = e.spec(dict(cfg), kind="llama3")
    e.data(sp, "t.jsonl", [{"text": "call <tool> then Zz Top and zz top"}])
    d, meta = e.run(sp)
    t = AutoTokenizer.from_pretrained(os.path.join(d, "tokenizer"))
    ids = t("call <tool> then Zz Top", add_special_tokens=False)["input_ids"]
    tool, zz = t.convert_tokens_to_ids("<tool>"), t.convert_tokens_to_ids("Zz Top")
    check("tokens: each added token is one id past the tokenizer's %d (%s, %s), and the text tokenizes to it"
          % (n, tool, zz), [tool, zz, t.convert_tokens_to_ids("<|im_end|>")] == [n + 1, n + 2, n + 4] and tool in ids and zz in ids, ids)
    added = t.added_tokens_decoder
    check("tokens and special tokens are added as Axolotl adds them (normalized=False, no strip)",
          all(not added[i].normalized and not added[i].lstrip and not added[i].rstrip for i in (n, tool, zz)),
          [added[i] for i in (n, tool, zz)])
    check("special_tokens.pad_token <PAD> gets id %d and is the saved tokenizer's pad token" % n,
          t.pad_token == "<PAD>" and t.pad_token_id == n and meta["pad_token_id"] == n,
          (t.pad_token, t.pad_token_id, meta["pad_token_id"]))
    check("chat_template: chatml is the saved tokenizer's template",
          t.chat_template == P.CHAT_TEMPLATES["chatml"], (t.chat_template or "")[:80])
    rows = docs_of(os.path.join(d, "train.bin"))[1]
    check("the prepared rows hold the added ids", any(tool in tk and zz in tk for tk, _ in rows))
    check("tokens: needs the embeddings trained (meta)", "tokens" in meta["needs_embeddings"],
          meta["needs_embeddings"])
    sp2 = dict(sp, adapter="lora")
    msg = e.err(sp2)  # the same data keys: a cache hit, still refused
    check("tokens: with an adapter is refused on a cache hit too, as Axolotl refuses it without "
          "lora_modules_to_save", "tokens" in msg and "adapter" in msg and "lora_modules_to_save" in msg, msg)
    check("tokens: with an adapter and lora_modules_to_save [embed_tokens, lm_head] is accepted",
          e.err(dict(sp2, lora_modules_to_save="embed_tokens,lm_head")) == "" and
          "lora_modules_to_save" in e.err(dict(sp2, lora_modules_to_save="lm_head")), "")
    sp3 = e.spec({"datasets": [{"path": "t.jsonl", "type": "completion"}],
                  "special_tokens": {"eos_token": "<|my_end|>", "pad_token": "<|my_pad|>"}}, kind="llama3")
    sp3["adapter"] = "lora"
    e.data(sp3, "t.jsonl", [{"text": "one two"}])
    msg = e.err(sp3)
    check("a new multi-piece special eos_token with an adapter is refused (pad_token alone is not)",
          "special_tokens.eos_token <|my_end|>" in msg and "my_pad" not in msg, msg)
    sp4 = e.spec({"datasets": [{"path": "t.jsonl", "type": "completion"}],
                  "special_tokens": {"pad_token": "<|my_pad|>"}, "adapter": "lora"}, kind="llama3")
    sp4["adapter"] = "lora"
    e.data(sp4, "t.jsonl", [{"text": "one two"}])
    check("a new pad_token with an adapter is fine", e.err(sp4) == "", e.err(sp4))
    sp5 = e.spec({"datasets": [{"path": "t.jsonl", "type": "completion"}], "tokens": ["<a1>", "<a2>"]},
                 kind="llama3", vocab=n + 1)
    e.data(sp5, "t.jsonl", [{"text": "one"}])
    one_line(e, "tokens: past the model's vocab_size", sp5, "tokens", "'<a2>'", "vocab_size is %d" % (n + 1))
    # resize_token_embeddings_to_32x: a no-op when ceil(len / 32) * 32 fits vocab_size (Phi-3:
    # 32011 tokens, 32064 rows), refused when Axolotl would grow the embeddings to it.
    up = -(-n // 32) * 32
    base = {"datasets": [{"path": "t.jsonl", "type": "completion"}]}
    for vocab, ok in ((up, True), (up - 1, False)):
        sp6 = e.spec(dict(base, resize_token_embeddings_to_32x=True, mean_resizing_embeddings=True), vocab=vocab)
        e.data(sp6, "t.jsonl", [{"text": "one"}])
        if ok:
            check("resize_token_embeddings_to_32x with %d tokens and vocab_size %d: nothing to resize" % (n, vocab),
                  e.err(sp6) == "", e.err(sp6))
        else:
            one_line(e, "resize_token_embeddings_to_32x past vocab_size", sp6, "resize_token_embeddings_to_32x",
                     "has %d tokens (%d rounded up to a multiple of 32)" % (n, up), "vocab_size is %d" % vocab)
    sp7 = e.spec(dict(base, shrink_embeddings=True), vocab=VOCAB)
    e.data(sp7, "t.jsonl", [{"text": "one"}])
    one_line(e, "shrink_embeddings with spare rows", sp7, "shrink_embeddings", "resize the embeddings to %d" % n)
    sp9 = e.spec(dict(base, pretrain_multipack_attn=False))
    e.data(sp9, "t.jsonl", [{"text": "one"}])
    one_line(e, "pretrain_multipack_attn: false", sp9, "pretrain_multipack_attn", "attends only to itself")
    sp8 = e.spec(dict(base, shrink_embeddings=True), vocab=n)
    e.data(sp8, "t.jsonl", [{"text": "one"}])
    check("shrink_embeddings with no spare rows: nothing to resize", e.err(sp8) == "", e.err(sp8))


CASES = [case_alpaca, case_tokens_saved_tokenizer, case_dataset_keys, case_shard_tokenizer_keys, case_chat_llama3, case_chat_chatml, case_chat_gemma3, case_chat_gemma, case_chat_named, case_input_output, case_completion, case_pretraining,
         case_packing, case_val_split, case_excess_length, case_formats, case_cache, case_errors]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", default="")
    args = ap.parse_args()
    try:
        import tokenizers  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        print("SKIP prepare_data: tokenizers/transformers not installed (scripts/install_deps.sh)")
        return
    os.environ["TRANSFORMERS_VERBOSITY"] = "error"
    root = tempfile.mkdtemp(prefix="test_prepare_data.")
    try:
        e = Env(root)
        for c in CASES:
            if args.k in c.__name__:
                try:
                    c(e)
                except Exception as ex:  # noqa: BLE001 - a crash is one failure with its reason
                    import traceback
                    traceback.print_exc()
                    check(c.__name__, False, "%s: %s" % (type(ex).__name__, ex))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
