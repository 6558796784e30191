#!/usr/bin/env python3
"""Prepares an Axolotl `datasets:` section for train_llama: tokenizes with the model's own
Hugging Face tokenizer and chat template, masks prompts, splits off a validation set, packs, and
writes row files (tokens, targets, document starts) into a cache directory.

The trainer runs it (llmc/prepare.c); the contract, the row format and the cache key are in
DESIGN.md ("Prepared datasets"). By hand:
    python3 scripts/prepare_data.py --spec SPEC.json --result RESULT.txt [--force]

Prompt formats follow Axolotl's strategies (alpaca, completion, input_output, chat_template,
pretraining_dataset); where this script differs from Axolotl it says so in DESIGN.md. Every
failure is one line on stderr: `error: <file>:<line>: <field>: <what was expected>`.
"""
import argparse
import csv
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
from array import array

FORMAT_VERSION = 3  # 2: Axolotl's order (shuffle, length filter, dedup, dataset_shard, split); 3: the run's tokenizer in tokenizer/
MAGIC, ROWS_VERSION, HEADER_INTS = 20241124, 1, 256
ROWS_FLAG_PACKED, ROWS_FLAG_PAIRED, ROWS_FLAG_SCORED, ROWS_FLAG_LABELS = 1, 2, 4, 8
IGNORE = -100

# The config keys that decide the prepared rows (all of them go into the cache key).
DATA_KEYS = ("datasets", "test_datasets", "pretraining_dataset", "val_set_size", "sample_packing",
             "eval_sample_packing", "pad_to_sequence_len", "train_on_inputs", "chat_template",
             "chat_template_jinja", "chat_template_kwargs", "eot_tokens", "default_system_message",
             "special_tokens", "tokens", "excess_length_strategy", "sample_packing_sequentially",
             "pretraining_sample_concatenation", "shuffle_merged_datasets", "min_sample_len",
             "dataset_exact_deduplication", "shuffle_before_merging_datasets", "dataset_shard_num",
             "dataset_shard_idx", "tokenizer_type", "tokenizer_use_fast", "tokenizer_legacy",
             "sample_packing_bin_size", "sample_packing_group_size", "resize_token_embeddings_to_32x",
             "shrink_embeddings", "mean_resizing_embeddings", "pretrain_multipack_attn", "rl")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "added_tokens.json")
DATA_EXT = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv", ".txt": "text"}


class DataError(Exception):
    """One line for the user: where (file:line or config key), which field, what was expected."""


def where_cfg(spec, key):
    return "%s: %s" % (spec["config_path"], key)


# ---- Axolotl's prompt texts (alpaca family); the response follows the prompt directly.

ALPACA_SYSTEM = ("Below is an instruction that describes a task, paired with an input that provides further "
                 "context. Write a response that appropriately completes the request.")
ALPACA_SYSTEM_NO_INPUT = "Below is an instruction that describes a task. Write a response that appropriately " \
                         "completes the request."
ALPACA_STYLES = {  # style: (system format, turn with input, turn without input)
    "instruct": ("{system}\n\n", "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n",
                 "### Instruction:\n{instruction}\n\n### Response:\n"),
    "chat": ("SYSTEM: {system}\n", "USER: {instruction}\n{input}\nASSISTANT:", "USER: {instruction}\nASSISTANT:"),
    "chatml": ("<|im_start|>system\n{system}<|im_end|>\n",
               "<|im_start|>user\n{instruction}\n{input}<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\n{instruction}<|im_end|>\n<|im_start|>assistant\n"),
    # Axolotl's phi style (alpaca:phi, its Phi-3 example): the turn with an input has no newlines
    # around the input, the one without has them.
    "phi": ("<|system|>\n{system}<|end|>\n", "<|user|>\n{instruction}<|end|>{input}<|assistant|>",
            "<|user|>\n{instruction}<|end|>\n<|assistant|>\n"),
}

# Named chat templates (chat_template: chatml | llama3 | gemma | gemma3), written for this
# project. gemma3 is Gemma's turn format: <bos>, then <start_of_turn>ROLE\n ... <end_of_turn>\n
# with the assistant called "model", a system message's text (and two newlines) put at the start
# of the next turn. gemma (Gemma 1/2) is the same turn format without a system role: a system
# message is an error (drop_system_message: true drops it), and turns must alternate user,
# assistant, user, ... as Gemma's own template requires.
CHAT_TEMPLATES = {
    "gemma": ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
              "{{ raise_exception('the gemma template has no system role (drop_system_message: true drops it)') }}"
              "{% elif (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
              "{{ raise_exception('gemma turns must alternate user, assistant, user, ...') }}{% endif %}"
              "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' + "
              "(m['content'] | trim) + '<end_of_turn>\n' }}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"),
    "chatml": ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
               "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
    "llama3": ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
               "'<|end_header_id|>\n\n' + (m['content'] | trim) + '<|eot_id|>' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"),
    "gemma3": ("{{ bos_token }}{% set carry = namespace(text='') %}{% for m in messages %}"
               "{% if m['role'] == 'system' %}{% set carry.text = m['content'] + '\n\n' %}{% else %}"
               "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\n' + carry.text + "
               "(m['content'] | trim) + '<end_of_turn>\n' }}{% set carry.text = '' %}{% endif %}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"),
}
# Longer named templates live in scripts/chat_templates/NAME.jinja (written for this project from
# each family's published format; test_prepare_data renders them against the expected text).
TEMPLATE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_templates")
for _name in ("qwen_25", "qwen3", "phi_3"):
    with open(os.path.join(TEMPLATE_DIR, _name + ".jinja"), encoding="utf-8") as _fh:
        CHAT_TEMPLATES[_name] = _fh.read()
CHAT_TEMPLATE_TOKENS = {"chatml": ["<|im_start|>", "<|im_end|>"],
                        "llama3": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                        "gemma": ["<start_of_turn>", "<end_of_turn>"], "gemma3": ["<start_of_turn>", "<end_of_turn>"],
                        "qwen_25": ["<|im_start|>", "<|im_end|>"], "qwen3": ["<|im_start|>", "<|im_end|>"],
                        "phi_3": ["<|user|>", "<|assistant|>", "<|end|>"]}
TEMPLATE_NAMES = ", ".join(sorted(CHAT_TEMPLATES))
ROLE_MAP = {"human": "user", "user": "user", "assistant": "assistant", "gpt": "assistant", "model": "assistant",
            "system": "system", "tool": "tool"}

# Dataset entry keys by prompt type; anything else in an entry is refused by name.
COMMON_DS_KEYS = {"path", "type", "data_files", "split", "ds_type", "name", "field"}
CHAT_DS_KEYS = {"field_messages", "message_property_mappings", "message_field_role", "message_field_content",
                "roles_to_train", "train_on_eos", "train_on_eot", "roles", "field_system", "drop_system_message",
                "message_field_training", "chat_template", "chat_template_jinja", "field_tools", "field_thinking"}
PRETRAIN_KEYS = {"path", "type", "data_files", "split", "ds_type", "name", "text_column", "field"}


# ---- reading records ------------------------------------------------------------------------

def resolve_path(spec, p, key):
    if not isinstance(p, str) or not p:
        raise DataError("%s: expected a file or directory path" % where_cfg(spec, key))
    p = os.path.expanduser(p)
    cands = [p] if os.path.isabs(p) else [os.path.join(spec["config_dir"], p), os.path.abspath(p)]
    for c in cands:
        if os.path.exists(c):
            return os.path.abspath(c)
    hub = re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", p) is not None
    raise DataError("%s: '%s' is not a local file or directory (looked in %s)%s" % (
        where_cfg(spec, key), p, " and ".join(cands),
        "; hub datasets are not downloaded here: save it with `datasets` "
        "(load_dataset('%s').to_json(...)) and give the file" % p if hub else ""))


def data_files_of(spec, ds, key):
    """The files of one entry, in a stable order, each with its reader type."""
    root = resolve_path(spec, ds.get("path"), key + ".path")
    df = ds.get("data_files")
    if df is not None:
        names = [df] if isinstance(df, str) else df
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise DataError("%s.data_files: expected a file name or a list of them" % where_cfg(spec, key))
        base = root if os.path.isdir(root) else os.path.dirname(root)
        files = []
        for n in names:
            f = n if os.path.isabs(n) else os.path.join(base, n)
            if not os.path.isfile(f):
                raise DataError("%s.data_files: %s does not exist" % (where_cfg(spec, key), f))
            files.append(f)
    elif os.path.isdir(root):
        files = []
        for d, dirs, fs in os.walk(root):
            dirs[:] = sorted(x for x in dirs if not x.startswith("."))
            files += [os.path.join(d, f) for f in sorted(fs)
                      if not f.startswith(".") and os.path.splitext(f)[1].lower() in DATA_EXT]
        if not files:
            raise DataError("%s.path: directory %s holds no data files (%s)" % (
                where_cfg(spec, key), root, ", ".join(sorted(DATA_EXT))))
    else:
        files = [root]
    ds_type = ds.get("ds_type")
    if ds_type is not None and ds_type not in ("json", "parquet", "csv", "text"):
        raise DataError("%s.ds_type: '%s' is not supported here (json, parquet, csv, text)" % (
            where_cfg(spec, key), ds_type))
    out = []
    for f in files:
        t = ds_type or DATA_EXT.get(os.path.splitext(f)[1].lower())
        if t is None:
            raise DataError("%s: cannot tell the format of %s from its extension; set ds_type (json, parquet, "
                            "csv, text)" % (where_cfg(spec, key), f))
        out.append((f, t))
    return out


def read_json_file(path):
    """(line, record) pairs of a .json (a list, or records one per line) or .jsonl file."""
    with open(path, "rb") as fh:
        raw = fh.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise DataError("%s:%d: not valid UTF-8 text" % (path, line))
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError("%s:%d: invalid JSON: %s" % (path, e.lineno, e.msg))
        if not isinstance(data, list):
            raise DataError("%s:1: expected a list of records (or one JSON record per line)" % path)
        lines = element_lines(text)
        return [(lines[i] if i < len(lines) else 1, r) for i, r in enumerate(data)]
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            out.append((n, json.loads(line)))
        except json.JSONDecodeError as e:
            raise DataError("%s:%d: invalid JSON: %s (one record per line expected)" % (path, n, e.msg))
    return out


def element_lines(text):
    """The line on which each top-level element of a JSON list starts (for error messages)."""
    lines, depth, instr, esc, expect, line = [], 0, False, False, False, 1
    for ch in text:
        if ch == "\n":
            line += 1
        if instr:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                instr = False
            continue
        if depth == 1 and expect and not ch.isspace() and ch not in ",]":
            lines.append(line)
            expect = False
        if ch == '"':
            instr = True
        elif ch in "[{":
            depth += 1
            expect = depth == 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 1:
            expect = True
    return lines


def read_records(path, kind):
    if kind == "json":
        return read_json_file(path)
    if kind == "text":
        with open(path, encoding="utf-8", errors="strict") as fh:
            return [(n, {"text": line.rstrip("\n")}) for n, line in enumerate(fh, 1) if line.strip()]
    if kind == "csv":
        with open(path, encoding="utf-8", newline="") as fh:
            return [(n + 2, dict(r)) for n, r in enumerate(csv.DictReader(fh))]
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("%s: reading parquet needs pyarrow (scripts/install_deps.sh installs it)" % path)
    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as e:  # noqa: BLE001 - pyarrow raises many types for bad files
        raise DataError("%s: not a readable parquet file: %s" % (path, str(e).splitlines()[0]))
    return [(i + 1, r) for i, r in enumerate(rows)]


def apply_split(spec, records, split, key):
    """HF-style split strings on the one 'train' split of local files: train, train[:20%], train[10:50]."""
    if split is None:
        return records
    m = re.fullmatch(r"\s*(\w+)\s*(?:\[\s*(-?\d+%?)?\s*:\s*(-?\d+%?)?\s*\])?\s*", str(split))
    if not m or m.group(1) != "train":
        raise DataError("%s.split: '%s' is not supported for local files, which have one split: use train, "
                        "train[:N], train[:N%%] or train[A%%:B%%]" % (where_cfg(spec, key), split))
    n = len(records)

    def bound(s, default):
        if s is None:
            return default
        v = int(s[:-1]) * n // 100 if s.endswith("%") else int(s)
        return max(0, min(n, v + n if v < 0 else v))
    return records[bound(m.group(2), 0):bound(m.group(3), n)]


# ---- the tokenizer ---------------------------------------------------------------------------

class Tok:
    """The model's tokenizer (transformers), with the config's special tokens applied."""

    def __init__(self, spec):
        d = spec["tokenizer_dir"]
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        try:
            import transformers
            from transformers import AutoTokenizer, PreTrainedTokenizerFast
        except ImportError:
            raise DataError("datasets: tokenizing needs Python's transformers and tokenizers, which %s does not "
                            "have: install them (scripts/install_deps.sh) or set $LLMC_PYTHON to a Python that "
                            "has them" % sys.executable)
        transformers.logging.set_verbosity_error()
        cfg = spec["config"]
        # Axolotl's tokenizer keys, passed as its loader passes them: tokenizer_type names the
        # transformers class (AutoTokenizer by default), tokenizer_use_fast and tokenizer_legacy
        # go to from_pretrained when set.
        kw, cls = {}, None
        for key, arg in (("tokenizer_use_fast", "use_fast"), ("tokenizer_legacy", "legacy")):
            if cfg.get(key) is not None:
                if not isinstance(cfg[key], bool):
                    raise DataError("%s: expected true or false, got %r" % (where_cfg(spec, key), cfg[key]))
                kw[arg] = cfg[key]
        if cfg.get("tokenizer_type"):
            name = cfg["tokenizer_type"]
            cls = getattr(transformers, name, None) if isinstance(name, str) else None
            if not isinstance(cls, type) or not (name.endswith("Tokenizer") or name.endswith("TokenizerFast")):
                raise DataError("%s: %r is not a tokenizer class of transformers %s (AutoTokenizer, "
                                "LlamaTokenizerFast, ...)" % (where_cfg(spec, "tokenizer_type"), name,
                                                              transformers.__version__))
        try:
            if cls and not cls.__name__.endswith("Fast") and hasattr(transformers, cls.__name__ + "Fast"):
                # A slow (Python) class such as Axolotl's examples' LlamaTokenizer needs
                # sentencepiece and tokenizer.model; without them its fast twin, which
                # transformers keeps token-for-token equal, loads tokenizer.json instead.
                try:
                    t = cls.from_pretrained(d, local_files_only=True, **kw)
                except Exception as e:  # noqa: BLE001
                    fast = getattr(transformers, cls.__name__ + "Fast")
                    print("note: tokenizer_type %s cannot load here (%s); using %s, its fast version" % (
                        cls.__name__, (str(e).strip().splitlines() or [type(e).__name__])[0][:120], fast.__name__))
                    t = fast.from_pretrained(d, local_files_only=True, **kw)
            elif cls or kw:
                t = (cls or AutoTokenizer).from_pretrained(d, local_files_only=True, **kw)
            elif os.path.exists(os.path.join(d, "tokenizer_config.json")):
                t = AutoTokenizer.from_pretrained(d, local_files_only=True)
            elif os.path.exists(os.path.join(d, "tokenizer.json")):
                t = PreTrainedTokenizerFast(tokenizer_file=os.path.join(d, "tokenizer.json"))
            else:
                t = AutoTokenizer.from_pretrained(d, local_files_only=True)
        except Exception as e:  # noqa: BLE001
            raise DataError("%s: cannot load the tokenizer: %s" % (d, str(e).splitlines()[0] if str(e) else
                                                                      type(e).__name__))
        self.t, self.vocab = t, int(spec["vocab_size"])
        # Axolotl's loader (loaders/tokenizer.py, 2026-07) in its order: a Llama tokenizer without
        # a pad token gets </s>, the special tokens are added as AddedToken(normalized=False), then
        # `tokens:`; a special token that is new and more than two pieces long needs the embeddings
        # trained (lora_modules_to_save) in an adapter run, which run() checks (cache hits too).
        if type(t).__name__ in ("LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer",
                                "CodeLlamaTokenizerFast") and not t.pad_token:
            t.pad_token = "</s>"
        from tokenizers import AddedToken
        self.needs_embeddings = []
        st = cfg.get("special_tokens") or {}
        if not isinstance(st, dict):
            raise DataError("%s: expected a mapping of bos_token/eos_token/pad_token/unk_token"
                            % where_cfg(spec, "special_tokens"))
        for k, v in st.items():
            if k not in ("bos_token", "eos_token", "pad_token", "unk_token"):
                raise DataError("%s.%s: not supported (bos_token, eos_token, pad_token, unk_token)"
                                % (where_cfg(spec, "special_tokens"), k))
            if v is None:
                continue
            if not isinstance(v, str) or not v:
                raise DataError("%s.%s: expected a token string" % (where_cfg(spec, "special_tokens"), k))
            if k != "pad_token" and getattr(t, k) != v and len(t.encode(v, add_special_tokens=False)) > 2:
                self.needs_embeddings.append("special_tokens.%s %s" % (k, v))
            self._add(spec, "special_tokens." + k, v)
            t.add_special_tokens({k: AddedToken(v, rstrip=False, lstrip=False, normalized=False)})
        if "bos_token" in st and "eos_token" in st and type(t).__name__ in ("LlamaTokenizerFast",
                                                                           "CodeLlamaTokenizerFast"):
            t.update_post_processor()
        toks = cfg.get("tokens") or []
        if not isinstance(toks, list) or not all(isinstance(x, str) and x for x in toks):
            raise DataError("%s: expected a list of token strings" % where_cfg(spec, "tokens"))
        for x in toks:
            self._add(spec, "tokens", x)
            t.add_tokens([AddedToken(x, rstrip=False, lstrip=False, normalized=False)])
        if toks:
            self.needs_embeddings.append("tokens")
        if t.pad_token is None and t.eos_token is not None:
            t.pad_token = t.eos_token
        # Axolotl resizes the embeddings to len(tokenizer) (rounded up to a multiple of 32 with
        # resize_token_embeddings_to_32x) when they are smaller, or larger with shrink_embeddings;
        # mean_resizing_embeddings only says how new rows start. Resizing is not implemented here.
        for k in ("resize_token_embeddings_to_32x", "shrink_embeddings", "mean_resizing_embeddings"):
            if cfg.get(k) is not None and not isinstance(cfg[k], bool):
                raise DataError("%s: expected true or false, got %r" % (where_cfg(spec, k), cfg[k]))
        want = len(t)
        if cfg.get("resize_token_embeddings_to_32x"):
            want = -(-want // 32) * 32
        if want > self.vocab or (want < self.vocab and cfg.get("shrink_embeddings")):
            key = "resize_token_embeddings_to_32x" if cfg.get("resize_token_embeddings_to_32x") and \
                len(t) <= self.vocab else "shrink_embeddings" if want < self.vocab else None
            raise DataError("%s: the tokenizer in %s has %d tokens%s and the model's vocab_size is %d: Axolotl "
                            "would resize the embeddings to %d, which is not implemented here%s" % (
                                where_cfg(spec, key) if key else spec["config_path"], d, len(t),
                                " (%d rounded up to a multiple of 32)" % want if want != len(t) else "",
                                self.vocab, want, "" if key else " (is the tokenizer the model's?)"))
        self.bos, self.eos = t.bos_token_id, t.eos_token_id
        self.pad = t.pad_token_id if t.pad_token_id is not None else (self.eos if self.eos is not None else 0)

    def _add(self, spec, key, s):
        """A token the config names must have an id below the model's vocab_size."""
        i = self.t.convert_tokens_to_ids(s)
        if i is None or i == self.t.unk_token_id and s != self.t.unk_token:
            i = len(self.t)  # the id it would get when added
        if i >= self.vocab:
            raise DataError("%s: '%s' is not in the tokenizer and would get id %d, but the model's vocab_size is "
                            "%d (resizing the embeddings is not supported; use a token the tokenizer has)"
                            % (where_cfg(spec, key), s, i, self.vocab))

    def encode(self, text, special=True, max_length=None):
        if max_length is not None:
            return self.t(text, add_special_tokens=special, truncation=True, max_length=max_length)["input_ids"]
        return self.t(text, add_special_tokens=special)["input_ids"]

    def token_id(self, s):
        i = self.t.convert_tokens_to_ids(s)
        return None if i is None or (i == self.t.unk_token_id and s != self.t.unk_token) else i


# ---- prompt strategies: each returns (input_ids, labels) with labels IGNORE where not trained

def field(rec, name, loc, required=True, kind=str):
    v = rec.get(name) if isinstance(rec, dict) else None
    if v is None:
        if required:
            raise DataError("%s: %s: missing (expected a %s)" % (loc, name, "string" if kind is str else kind.__name__))
        return None
    if not isinstance(v, kind):
        raise DataError("%s: %s: expected a %s, got %s" % (loc, name, "string" if kind is str else kind.__name__,
                                                          type(v).__name__))
    return v


class Alpaca:
    def __init__(self, tok, cfg, ds, style):
        self.tok, self.T, self.train_inputs = tok, cfg["sequence_len"], cfg["train_on_inputs"]
        self.fmt = ALPACA_STYLES[style]

    def _tok(self, text, add_eos, strip_bos):
        """Axolotl's _tokenize: truncated at sequence_len, EOS appended unless there or full."""
        if not text:
            return []
        ids = self.tok.encode(text, max_length=self.T)
        if ids and add_eos and ids[-1] != self.tok.eos and len(ids) < self.T and self.tok.eos is not None:
            ids.append(self.tok.eos)
        if ids and strip_bos and ids[0] == self.tok.bos:
            ids = ids[1:]
        return ids

    def __call__(self, rec, loc):
        ins = field(rec, "instruction", loc)
        inp = field(rec, "input", loc, required=False) or ""
        out = field(rec, "output", loc)
        sysf, with_in, no_in = self.fmt
        prompt = (sysf.format(system=ALPACA_SYSTEM) + with_in.format(instruction=ins, input=inp)) if inp else \
            (sysf.format(system=ALPACA_SYSTEM_NO_INPUT) + no_in.format(instruction=ins))
        p = self._tok(prompt, add_eos=False, strip_bos=False)
        r = self._tok(out, add_eos=True, strip_bos=True)
        return [(p + r, (list(p) if self.train_inputs else [IGNORE] * len(p)) + r)]


class Completion:
    """The whole text is trained; EOS appended; long texts split into sequence_len pieces."""

    def __init__(self, tok, cfg, ds, style=None):
        self.tok, self.T = tok, cfg["sequence_len"]
        self.field = ds.get("field") or "text"

    def __call__(self, rec, loc):
        text = field(rec, self.field, loc)
        if not text:
            return []
        ids = self.tok.encode(text, max_length=self.T * 64)
        if ids and ids[-1] != self.tok.eos and len(ids) < self.T * 64 and self.tok.eos is not None:
            ids.append(self.tok.eos)
        return [(ids[i:i + self.T], ids[i:i + self.T]) for i in range(0, len(ids), self.T)]


class InputOutput:
    """segments: [{text, label}]: each segment tokenized without special tokens; label false = masked."""

    def __init__(self, tok, cfg, ds, style=None):
        self.tok, self.train_inputs = tok, cfg["train_on_inputs"]

    def __call__(self, rec, loc):
        segs = field(rec, "segments", loc, kind=list)
        ids, labels = [], []
        for k, s in enumerate(segs):
            sl = "%s: segments[%d]" % (loc, k)
            if not isinstance(s, dict):
                raise DataError("%s: expected a mapping with text and label" % sl)
            text = field(s, "text", sl)
            lab = s.get("label", True)
            if not isinstance(lab, bool):
                raise DataError("%s: label: expected true or false" % sl)
            x = self.tok.encode(text, special=False)
            ids += x
            labels += x if (lab or self.train_inputs) else [IGNORE] * len(x)
        return [(ids, labels)]


class ChatTemplate:
    """Axolotl's chat_template strategy: the conversation rendered by the chat template; each
    trainable turn's content (found by rendering the turn with placeholder content and comparing)
    and the end-of-turn/EOS token within 3 positions after it are trained."""

    def __init__(self, tok, cfg, ds, style=None, spec=None):
        self.tok, self.train_inputs = tok, cfg["train_on_inputs"]
        self.template = chat_template_of(spec, tok, cfg, ds)
        self.kwargs = cfg.get("chat_template_kwargs") or {}
        self.field_messages = ds.get("field_messages") or "messages"
        mpm = dict(ds.get("message_property_mappings") or {})
        if ds.get("message_field_role"):
            mpm.setdefault("role", ds["message_field_role"])
        if ds.get("message_field_content"):
            mpm.setdefault("content", ds["message_field_content"])
        self.mapping = {"role": mpm.get("role", "role"), "content": mpm.get("content", "content")}
        for k in mpm:
            if k not in ("role", "content"):
                self.mapping[k] = mpm[k]
        if not mpm:  # Axolotl's default mapping also takes the reasoning from field_thinking
            self.mapping["reasoning_content"] = ds.get("field_thinking") or "reasoning_content"
        # Other message fields go to the template when it reads them (tool_calls, say), as Axolotl passes them.
        self.passed = template_message_keys(self.template) - set(self.mapping.values()) - set(self.mapping)
        self.field_tools = ds.get("field_tools") or "tools"
        roles = ds.get("roles")
        self.roles = dict(ROLE_MAP) if not roles else {s: t for t, srcs in roles.items() for s in srcs}
        rtt = ds.get("roles_to_train", ["assistant"])
        self.roles_to_train = [self.roles.get(r, r) for r in (rtt or [])]
        self.train_on_eos = norm_train_on(ds.get("train_on_eos", "turn"))
        eot = ds.get("train_on_eot")
        self.train_on_eot = norm_train_on(eot) if eot is not None else self.train_on_eos
        eots = cfg.get("eot_tokens")
        names = eots if eots else ([tok.t.eos_token] if tok.t.eos_token else [])
        self.eot_ids = set()
        for s in names:
            i = tok.token_id(s)
            if i is None:
                raise DataError("%s: '%s' is not a single token of the tokenizer" % (where_cfg(spec, "eot_tokens"), s))
            self.eot_ids.add(i)
        self.field_system = ds.get("field_system", "system")
        self.drop_system = bool(ds.get("drop_system_message", False))
        self.field_training = ds.get("message_field_training")

    def render(self, turns, gen=False, tools=None):
        try:
            ids = self.tok.t.apply_chat_template(turns, chat_template=self.template, tokenize=True, tools=tools,
                                                 add_generation_prompt=gen, return_dict=False, **self.kwargs)
        except Exception as e:  # noqa: BLE001 - jinja raises its own errors (raise_exception in templates)
            raise DataError("chat template failed: %s" % (str(e).splitlines()[0] if str(e) else type(e).__name__))
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    def turns_of(self, rec, loc):
        msgs = rec.get(self.field_messages) if isinstance(rec, dict) else None
        if isinstance(msgs, str):
            try:
                msgs = json.loads(msgs)
            except json.JSONDecodeError:
                msgs = None
        if not isinstance(msgs, list) or not msgs:
            raise DataError("%s: %s: expected a non-empty list of messages (field_messages)" % (loc, self.field_messages))
        turns = []
        for k, m in enumerate(msgs):
            ml = "%s: %s[%d]" % (loc, self.field_messages, k)
            if not isinstance(m, dict):
                raise DataError("%s: expected a mapping with %s and %s" % (ml, self.mapping["role"], self.mapping["content"]))
            t = {}
            for dst, src in self.mapping.items():
                if m.get(src) is not None:
                    t[dst] = m[src]
            for k in self.passed:
                if m.get(k) is not None:
                    t[k] = m[k]
            for what in ("role", "content"):
                src = self.mapping[what]
                if what == "content" and t.get("tool_calls") and "content" not in t:
                    continue  # a message that only calls tools may have no text
                if not isinstance(t.get(what), str):
                    raise DataError("%s: %s: %s" % (ml, src, "missing (expected the %s as a string)" % what
                                                    if m.get(src) is None else "expected a string, got %s"
                                                    % type(m[src]).__name__))
            if t.get("tool_calls") is not None:
                t["tool_calls"] = tool_calls_of(t["tool_calls"], ml)
            t["role"] = self.roles.get(t["role"], t["role"])
            if self.field_training and m.get(self.field_training) is not None:
                t["training"] = bool(m[self.field_training])
            turns.append(t)
        if turns[0]["role"] != "system" and isinstance(rec.get(self.field_system), str):
            turns.insert(0, {"role": "system", "content": rec[self.field_system]})
        if self.drop_system and turns[0]["role"] == "system":
            turns = turns[1:]
        return turns

    def tools_of(self, rec, loc):
        """The record's tool list (field_tools), a JSON string or a list; None when absent."""
        tools = rec.get(self.field_tools)
        if tools is None:
            return None
        if isinstance(tools, str):
            try:
                tools = json.loads(tools)
            except json.JSONDecodeError as e:
                raise DataError("%s: %s: not JSON (%s)" % (loc, self.field_tools, e.msg))
        if not isinstance(tools, list) or not all(isinstance(x, dict) for x in tools):
            raise DataError("%s: %s: expected a list of tool objects" % (loc, self.field_tools))
        for x in tools:
            parse_json_field(x.get("function"), "parameters", "%s: %s" % (loc, self.field_tools))
        return tools

    def find_turn(self, clean, i, b, tools=None):
        """[start, end) of turn i's content in b, the rendering of clean (the turns): the first and last tokens
        that change when the turn is replaced by one of the same role whose only field is
        placeholder text (Axolotl's rule: a turn's reasoning and tool calls are part of its span).
        Axolotl renders turns[:i+1] for this; the whole conversation is rendered here, since
        some templates render an earlier turn differently once later turns exist (Qwen3 drops an
        assistant turn's reasoning once a user turn follows it), and then the prefix's positions
        are not the whole text's."""
        dummy = {"role": clean[i]["role"], "content": "[[dummy_message]]"}
        a = self.render(clean[:i] + [dummy] + clean[i + 1:], tools=tools)
        n = min(len(a), len(b))
        start = next((j for j in range(n) if a[j] != b[j]), None)
        end = next((len(b) - j for j in range(n) if a[len(a) - 1 - j] != b[len(b) - 1 - j]), None)
        if start is None or end is None or end <= start:
            return -1, -1
        return start, end

    def __call__(self, rec, loc):
        turns = self.turns_of(rec, loc)
        tools = self.tools_of(rec, loc)
        clean = [{k: v for k, v in t.items() if k != "training"} for t in turns]
        try:
            ids = self.render(clean, tools=tools)
            if not self.roles_to_train and self.train_on_eos == "none" and self.train_on_eot == "none" and \
                    not self.field_training:
                # Axolotl's legacy rule: everything after the prompt of the last turn is trained.
                p = self.render(clean[:-1], gen=True, tools=tools)
                n = len(p) if not self.train_inputs else 0
                return [(ids, [IGNORE] * n + ids[n:])]
            labels = [IGNORE] * len(ids)
            last = {"eot": -1, "eos": -1}
            for i, t in enumerate(turns):
                train = t["training"] if "training" in t else (self.train_inputs or t["role"] in self.roles_to_train)
                if not train and self.train_on_eos != "all" and self.train_on_eot != "all":
                    continue
                s, e = self.find_turn(clean, i, ids, tools)
                if train and s >= 0:
                    labels[s:e] = ids[s:e]
                if s < 0:
                    continue
                for kind, opt, hit in (("eot", self.train_on_eot, lambda x: x in self.eot_ids),
                                       ("eos", self.train_on_eos, lambda x: x == self.tok.eos)):
                    k = next((j for j in range(e, len(ids)) if hit(ids[j])), -1)
                    if k != -1 and k - e <= 3:
                        last[kind] = k
                        if opt == "all" or (opt == "turn" and train):
                            labels[k] = ids[k]
            for kind, opt in (("eot", self.train_on_eot), ("eos", self.train_on_eos)):
                if opt == "last" and last[kind] != -1:
                    labels[last[kind]] = ids[last[kind]]
        except DataError as e:
            raise DataError("%s: %s" % (loc, e))
        return [(ids, labels)]


def template_message_keys(template):
    """The message fields a chat template reads: x of m.x or m['x'] for each m of a loop over
    messages (or a slice or filter of it)."""
    import jinja2
    from jinja2 import nodes
    try:
        ast = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateSyntaxError:
        return set()  # rendering reports it, with the template's own message
    keys = set()
    for loop in ast.find_all(nodes.For):
        if not isinstance(loop.target, nodes.Name) or \
                not any(n.name == "messages" for n in [loop.iter, *loop.iter.find_all(nodes.Name)] if isinstance(n, nodes.Name)):
            continue
        var = loop.target.name
        for g in loop.find_all((nodes.Getattr, nodes.Getitem)):
            if isinstance(g.node, nodes.Name) and g.node.name == var:
                if isinstance(g, nodes.Getattr):
                    keys.add(g.attr)
                elif isinstance(g.arg, nodes.Const) and isinstance(g.arg.value, str):
                    keys.add(g.arg.value)
    return keys


def tool_calls_of(calls, where):
    """A message's tool_calls, each call's arguments parsed when given as a JSON string (as Axolotl does)."""
    if not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls):
        raise DataError("%s: tool_calls: expected a list of call objects" % where)
    for c in calls:
        parse_json_field(c.get("function"), "arguments", "%s: tool_calls" % where)
    return calls


def parse_json_field(f, key, where):
    """A function object's key (a tool's parameters, a call's arguments) parsed in place when it is
    a JSON string, as Axolotl parses them; an error names where, the function and the key."""
    if isinstance(f, dict) and isinstance(f.get(key), str):
        try:
            f[key] = json.loads(f[key])
        except json.JSONDecodeError as e:
            raise DataError("%s: %s.%s: not JSON (%s)" % (where, f.get("name"), key, e.msg))


def norm_train_on(v):
    if v is None or v is False or v == "none":
        return "none"
    if v in ("turn", "all", "last"):
        return v
    raise DataError("train_on_eos/train_on_eot: '%s' is not one of turn, all, last, none" % v)


def chat_template_of(spec, tok, cfg, ds):
    """The jinja text for chat_template: tokenizer_default | a name in CHAT_TEMPLATES | jinja (dataset entry first)."""
    name = ds.get("chat_template") or cfg.get("chat_template") or "tokenizer_default"
    jinja = ds.get("chat_template_jinja") or cfg.get("chat_template_jinja")
    if not isinstance(name, str):
        raise DataError("%s: expected tokenizer_default, jinja or a name (%s)" % (where_cfg(spec, "chat_template"), TEMPLATE_NAMES))
    fallback = None
    if name.startswith("tokenizer_default_fallback_"):
        fallback = name[len("tokenizer_default_fallback_"):]
        name = "tokenizer_default"
    if name == "tokenizer_default":
        if tok.t.chat_template:
            return tok.t.chat_template
        if fallback is None:
            raise DataError("%s: tokenizer_default, but the tokenizer in %s has no chat template; name one "
                            "(%s) or give chat_template_jinja" % (where_cfg(spec, "chat_template"), spec["tokenizer_dir"],
                                                                     TEMPLATE_NAMES))
        name = fallback
    if name == "jinja":
        if not isinstance(jinja, str) or not jinja.strip():
            raise DataError("%s: jinja needs chat_template_jinja (the template text or a .jinja file)"
                            % where_cfg(spec, "chat_template"))
        if jinja.strip().endswith(".jinja") and "\n" not in jinja.strip():
            p = jinja.strip() if os.path.isabs(jinja.strip()) else os.path.join(spec["config_dir"], jinja.strip())
            try:
                with open(p, encoding="utf-8") as fh:
                    return fh.read()
            except OSError as e:
                raise DataError("%s: cannot read %s: %s" % (where_cfg(spec, "chat_template_jinja"), p, e.strerror))
        return jinja
    if name not in CHAT_TEMPLATES:
        raise DataError("%s: '%s' is not available here (tokenizer_default, %s, jinja with chat_template_jinja)"
                        % (where_cfg(spec, "chat_template"), name, TEMPLATE_NAMES))
    missing = [s for s in CHAT_TEMPLATE_TOKENS[name] if tok.token_id(s) is None]
    if missing and (name, spec["tokenizer_dir"]) not in NOTED_TEMPLATES:
        NOTED_TEMPLATES.add((name, spec["tokenizer_dir"]))
        print("note: chat_template %s: the tokenizer in %s has no token %s: its markers are tokenized as plain text, "
              "as Axolotl does (`tokens:` adds them as tokens, where the model's "
              "vocab_size leaves room)" % (name, spec["tokenizer_dir"], " or ".join(missing)))
    return CHAT_TEMPLATES[name]


NOTED_TEMPLATES = set()  # (template, tokenizer) pairs whose missing marker tokens were noted


class StepwiseSupervised:
    """process_reward_model's stepwise_supervised (Axolotl's, after TRL's PRMTrainer): prompt,
    completions (the steps) and labels (one per step); each step tokenized without special tokens
    with step_separator's tokens after it, labelled at its last token (train_on_last_step_only:
    the last step only); the steps cut to max_completion_length, the BOS (when the tokenizer has
    one) and the prompt before them, all cut to sequence_len. Labels are aligned with the tokens
    (the class of that token), not next-token targets."""

    def __init__(self, tok, cfg, ds, style=None):
        self.tok, self.T = tok, cfg["sequence_len"]
        sep = ds.get("step_separator", "\n")
        if not isinstance(sep, str):
            raise DataError("step_separator: expected a string")
        self.sep = tok.encode(sep, special=False)
        self.max_completion = ds.get("max_completion_length")
        if self.max_completion is not None and (not isinstance(self.max_completion, int) or self.max_completion < 1):
            raise DataError("max_completion_length: expected a positive integer or null")
        self.last_only = bool(ds.get("train_on_last_step_only", False))

    def __call__(self, rec, loc):
        prompt, steps, labels = field(rec, "prompt", loc), rec.get("completions"), rec.get("labels")
        if not isinstance(steps, list) or not all(isinstance(x, str) for x in steps):
            raise DataError("%s: completions: expected a list of strings (the steps)" % loc)
        if not isinstance(labels, list) or len(labels) != len(steps) or \
                not all(isinstance(x, bool) or x in (0, 1) for x in labels):
            raise DataError("%s: labels: expected a list of %d booleans (or 0/1), one per step" % (loc, len(steps)))
        labels = [int(x) for x in labels]
        if self.last_only:
            labels = [IGNORE] * (len(labels) - 1) + labels[-1:]
        ids, lab = [], []
        for text, label in zip(steps, labels):
            s = self.tok.encode(text, special=False) + self.sep
            ids += s
            lab += [IGNORE] * (len(s) - 1) + [label]
        if self.max_completion:
            ids, lab = ids[:self.max_completion], lab[:self.max_completion]
        p = ([self.tok.bos] if self.tok.bos is not None else []) + self.tok.encode(prompt, special=False)
        return [((p + ids)[:self.T], ([IGNORE] * len(p) + lab)[:self.T])]


STRATEGIES = {"alpaca": Alpaca, "completion": Completion, "input_output": InputOutput,
              "chat_template": ChatTemplate, "stepwise_supervised": StepwiseSupervised}
STEPWISE_DS_KEYS = {"step_separator", "max_completion_length", "train_on_last_step_only"}


def strategy_of(spec, tok, cfg, ds, key):
    t = ds.get("type")
    if isinstance(t, dict):
        raise DataError("%s.type: custom prompt formats (a mapping) are not supported; use alpaca, completion, "
                        "input_output or chat_template" % where_cfg(spec, key))
    if not isinstance(t, str) or not t:
        raise DataError("%s.type: missing (alpaca, completion, input_output, chat_template)" % where_cfg(spec, key))
    base, _, style = t.partition(":")
    if (base == "stepwise_supervised") != bool(cfg.get("process_reward_model")):
        raise DataError("%s.type: %s" % (where_cfg(spec, key), "a process reward model reads stepwise_supervised "
                                         "datasets (prompt, completions, labels), not '%s'" % t
                                         if cfg.get("process_reward_model") else
                                         "stepwise_supervised labels steps for process_reward_model: true"))
    if base not in STRATEGIES or (style and (base != "alpaca" or style not in ALPACA_STYLES)):
        raise DataError("%s.type: '%s' is not supported here (alpaca, alpaca:chat, alpaca:chatml, alpaca:phi, completion, "
                        "input_output, chat_template; stepwise_supervised with process_reward_model)"
                        % (where_cfg(spec, key), t))
    allowed = COMMON_DS_KEYS | (CHAT_DS_KEYS if base == "chat_template" else set()) | \
        (STEPWISE_DS_KEYS if base == "stepwise_supervised" else set())
    for k in ds:
        if k not in allowed:
            raise DataError("%s.%s: not supported for type %s (supported: %s)" % (
                where_cfg(spec, key), k, base, ", ".join(sorted(allowed))))
    if base == "chat_template":
        return ChatTemplate(tok, cfg, ds, spec=spec)
    if base == "stepwise_supervised":
        try:
            return StepwiseSupervised(tok, cfg, ds)
        except DataError as e:
            raise DataError("%s.%s" % (where_cfg(spec, key), e))
    if ds.get("field") is not None and base != "completion":
        raise DataError("%s.field: only type completion reads a field" % where_cfg(spec, key))
    return STRATEGIES[base](tok, cfg, ds, style or "instruct")


# ---- samples ---------------------------------------------------------------------------------

def load_section(spec, tok, cfg, entries, key, counts):
    """All samples of a datasets/test_datasets list: [(input_ids, labels, 'file:line')]."""
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list) or not entries:
        raise DataError("%s: expected a list of datasets (path, type, ...)" % where_cfg(spec, key))
    samples = []
    for i, ds in enumerate(entries):
        k = "%s[%d]" % (key, i)
        if not isinstance(ds, dict):
            raise DataError("%s: expected a mapping with path and type" % where_cfg(spec, k))
        strat = strategy_of(spec, tok, cfg, ds, k)
        n0 = len(samples)
        for f, kind in data_files_of(spec, ds, k):
            recs = apply_split(spec, read_records(f, kind), ds.get("split"), k)
            for line, rec in recs:
                loc = "%s:%d" % (f, line)
                if not isinstance(rec, dict):
                    raise DataError("%s: expected a JSON object per record" % loc)
                for ids, labels in strat(rec, loc):
                    samples.append((ids, labels, loc))
        if cfg.get("shuffle_before_merging_datasets"):
            mine = samples[n0:]
            samples[n0:] = [mine[j] for j in permutation(len(mine), int(spec["seed"]))]
        counts.append({"key": k, "path": ds.get("path"), "type": ds.get("type"), "samples": len(samples) - n0})
    return samples


def load_pretraining(spec, tok, cfg, counts):
    """pretraining_dataset: plain text, BOS (as the tokenizer adds it) + text + EOS per document,
    documents longer than sequence_len cut into sequence_len pieces."""
    pd = cfg["pretraining_dataset"]
    entries = [{"path": pd}] if isinstance(pd, str) else pd if isinstance(pd, list) else [pd]
    T = cfg["sequence_len"]
    samples = []
    for i, ds in enumerate(entries):
        k = "pretraining_dataset[%d]" % i
        if not isinstance(ds, dict):
            raise DataError("%s: expected a mapping with path (and text_column)" % where_cfg(spec, k))
        for x in ds:
            if x not in PRETRAIN_KEYS:
                raise DataError("%s.%s: not supported (%s)" % (where_cfg(spec, k), x, ", ".join(sorted(PRETRAIN_KEYS))))
        if ds.get("type") not in (None, "pretrain", "completion"):
            raise DataError("%s.type: '%s': pretraining_dataset reads plain text (type pretrain)" % (
                where_cfg(spec, k), ds.get("type")))
        col = ds.get("text_column") or ds.get("field") or "text"
        n0 = len(samples)
        for f, kind in data_files_of(spec, ds, k):
            for line, rec in apply_split(spec, read_records(f, kind), ds.get("split"), k):
                loc = "%s:%d" % (f, line)
                text = field(rec, col, loc)
                ids = tok.encode(text)
                if tok.eos is not None and (not ids or ids[-1] != tok.eos):
                    ids.append(tok.eos)
                for j in range(0, len(ids), T):
                    samples.append((ids[j:j + T], ids[j:j + T], loc))
        counts.append({"key": k, "path": ds.get("path"), "type": "pretrain", "samples": len(samples) - n0})
    return samples


def fit_length(spec, cfg, samples, what, order):
    """Drops (or truncates, or refuses) samples longer than sequence_len, and drops those under
    min_sample_len tokens, keeping the order of samples[order[0]], samples[order[1]], ... (the
    merged shuffle comes first, as in Axolotl); returns (kept, number dropped as too long, the
    first dropped location in file order)."""
    T, how = cfg["sequence_len"], (cfg.get("excess_length_strategy") or "drop")
    if how not in ("drop", "truncate", "raise"):
        raise DataError("%s: '%s' is not one of drop, truncate, raise" % (where_cfg(spec, "excess_length_strategy"), how))
    long_at = [i for i, (ids, _, _) in enumerate(samples) if len(ids) > T]
    if long_at and how == "raise":
        ids, _, loc = samples[long_at[0]]
        raise DataError("%s: %s sample of %d tokens is longer than sequence_len %d "
                        "(excess_length_strategy: raise)" % (loc, what, len(ids), T))
    min_len = int(cfg.get("min_sample_len") or 2)
    out = []
    for i in order:
        ids, labels, loc = samples[i]
        if len(ids) > T:
            if how == "drop":
                continue
            ids, labels = ids[:T], labels[:T]
        if len(ids) >= min_len:
            out.append((ids, labels, loc))
    drop = long_at if how == "drop" else []
    return out, len(drop), samples[drop[0]][2] if drop else None


def shard_on(cfg):
    return bool(cfg.get("dataset_shard_num")) and cfg.get("dataset_shard_idx") is not None


def shard_of(cfg, samples):
    """dataset_shard_num / dataset_shard_idx: piece idx of num contiguous pieces, the first
    len % num of them one sample longer (Hugging Face datasets' shard(contiguous=True), its
    default since 3.x, which Axolotl applies to the prepared samples before the val split)."""
    if not shard_on(cfg):
        return samples
    num, idx = cfg["dataset_shard_num"], cfg["dataset_shard_idx"]
    div, mod = divmod(len(samples), num)
    start = div * idx + min(idx, mod)
    return samples[start:start + div + (1 if idx < mod else 0)]


def dedup(samples, key_of=lambda s: (tuple(s[0]), tuple(s[1]))):
    """dataset_exact_deduplication: the first of identical samples (by default tokens and labels;
    key_of gives another key) kept."""
    seen, out = set(), []
    for s in samples:
        key = key_of(s)
        if key not in seen:
            seen.add(key)
            out.append(s)
    return out, len(samples) - len(out)


def check_ids(spec, tok, seqs):
    """Every id of seqs ((ids, 'file:line') pairs) below the model's vocab_size."""
    for ids, loc in seqs:
        if ids and max(ids) >= tok.vocab:
            raise DataError("%s: token id %d is not below the model's vocab_size %d (is the tokenizer in %s the "
                            "model's?)" % (loc, max(ids), tok.vocab, spec["tokenizer_dir"]))


def split_val(spec, cfg, train, evals, what):
    """val_set_size: the last ceil(fraction x n) (as HF does) or that many of train become the
    eval set; (train, evals). what names the items in the error ("samples", "pairs")."""
    v = cfg.get("val_set_size") or 0
    if not v:
        return train, evals
    nt = int(v) if v >= 1 else -(-int(round(v * len(train) * 1e9)) // 10 ** 9)  # ceil, as HF does
    if nt >= len(train):
        raise DataError("%s: %s leaves no training %s out of %d" % (where_cfg(spec, "val_set_size"), v, what,
                                                                     len(train)))
    return train[:len(train) - nt], train[len(train) - nt:]


def save_tokenizer(spec, tok, cfg, out_dir):
    """The tokenizer as the run used it (special tokens, tokens, the config's chat template), which
    the trainer writes beside the final model as Axolotl does (tokenizer.save_pretrained)."""
    if cfg.get("chat_template"):
        tok.t.chat_template = chat_template_of(spec, tok, cfg, {})
    tok.t.save_pretrained(os.path.join(out_dir, "tokenizer"))


def permutation(n, seed):
    import numpy as np
    return [int(i) for i in np.random.default_rng(int(seed) & 0xFFFFFFFFFFFFFFFF).permutation(n)]


# ---- rows ------------------------------------------------------------------------------------

def pack(lengths, T, sequential=False, bin_size=200, group_size=100000):
    """The row of each sample, as Axolotl's multipack packer places them: first fit in the
    given order, at most bin_size samples a row (sample_packing_bin_size), each group of
    group_size consecutive samples (sample_packing_group_size) into rows of its own; a segment
    tree over the rows' free space finds the first that fits (a full row's is -1).
    sequential (sample_packing_sequentially): next fit, as Axolotl's sequential allocator: a
    sample that does not fit the current row starts the next one, so rows keep the order."""
    if sequential:
        rows, nrows, room = [], 0, 0
        for L in lengths:
            if L > room or not nrows:
                nrows, room = nrows + 1, T
            rows.append(nrows - 1)
            room -= L
        return rows, nrows
    rows, nrows = [], 0
    for g0 in range(0, len(lengths), group_size):
        group = lengths[g0:g0 + group_size]
        size = 1
        while size < len(group):
            size *= 2
        free, count = [0] * (2 * size), [0] * size
        for i in range(size):
            free[size + i] = T
        for i in range(size - 1, 0, -1):
            free[i] = max(free[2 * i], free[2 * i + 1])
        used = 0
        for L in group:
            i = 1
            while i < size:
                i = 2 * i if free[2 * i] >= L else 2 * i + 1
            r = i - size
            rows.append(nrows + r)
            used = max(used, r + 1)
            count[r] += 1
            free[i] = free[i] - L if count[r] < bin_size else -1
            i //= 2
            while i:
                free[i] = max(free[2 * i], free[2 * i + 1])
                i //= 2
        nrows += used
    return rows, nrows


def write_rows(path, samples, T, packed, pad, packer=None, flags=0, marks=None, aligned=False):
    """The row file of the contract; returns (rows, target tokens, max id + 1). packer: pack()'s
    keyword arguments; flags: more header flags (ROWS_FLAG_PAIRED); marks (unpacked rows only): a
    position per sample whose target is set to the token there, instead of the labels' targets
    (a reward model's rows: where its score is read); aligned: the labels are the targets of
    their own positions (a token classifier's classes), not the next token's."""
    if packed:
        where, nrows = pack([len(s[0]) for s in samples], T, **(packer or {}))
        members = [[] for _ in range(nrows)]
        for k, r in enumerate(where):
            members[r].append(k)
    else:
        members = [[k] for k in range(len(samples))]
    ntgt, maxid = 0, 0
    with open(path, "wb") as fh:
        hdr = array("i", [0] * HEADER_INTS)
        fh.write(hdr.tobytes())
        for mem in members:
            tok, tgt, ds = array("i", [pad] * T), array("i", [-1] * T), array("i", [0] * T)
            t = 0
            for k in mem:
                ids, labels, _ = samples[k]
                L = len(ids)
                for j in range(L):
                    tok[t + j] = ids[j]
                    ds[t + j] = t
                    if aligned and labels[j] != IGNORE:
                        tgt[t + j] = labels[j]
                        ntgt += 1
                    elif not aligned and marks is None and j + 1 < L and labels[j + 1] != IGNORE:
                        tgt[t + j] = ids[j + 1]
                        ntgt += 1
                if marks is not None:
                    tgt[t + marks[k]] = ids[marks[k]]
                    ntgt += 1
                maxid = max(maxid, max(ids) + 1)
                t += L
            for j in range(t, T):
                ds[j] = t
            if t < T:
                maxid = max(maxid, pad + 1)
            if sys.byteorder != "little":
                for a in (tok, tgt, ds):
                    a.byteswap()
            fh.write(tok.tobytes())
            fh.write(tgt.tobytes())
            fh.write(ds.tobytes())
        h = [0] * HEADER_INTS
        h[0:9] = [MAGIC, ROWS_VERSION, T, len(members), (ROWS_FLAG_PACKED if packed else 0) | flags, maxid, len(samples),
                  ntgt & 0xFFFFFFFF, ntgt >> 32]
        hdr = array("i", [x - (1 << 32) if x >= 1 << 31 else x for x in h])
        if sys.byteorder != "little":
            hdr.byteswap()
        fh.seek(0)
        fh.write(hdr.tobytes())
        fh.flush()
        os.fsync(fh.fileno())
    return len(members), ntgt, maxid


# ---- the cache key ---------------------------------------------------------------------------

def sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as fh:
        for b in iter(lambda: fh.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def cache_key(spec):
    cfg = spec["config"]
    parts = {"format_version": FORMAT_VERSION, "sequence_len": spec["sequence_len"], "seed": spec["seed"],
             "vocab_size": spec["vocab_size"], "keys": {k: cfg.get(k) for k in DATA_KEYS if k in cfg}}
    if spec.get("kto_batch"):  # rl: kto's KL sequences cycle completions within batches of this many
        parts["kto_batch"] = spec["kto_batch"]
    d = spec["tokenizer_dir"]
    parts["tokenizer"] = {f: sha256_file(os.path.join(d, f)) for f in TOKENIZER_FILES
                          if os.path.isfile(os.path.join(d, f))}
    files = []
    for key in ("datasets", "test_datasets", "pretraining_dataset"):
        entries = cfg.get(key)
        if not entries:
            continue
        if isinstance(entries, (str, dict)):
            entries = [{"path": entries} if isinstance(entries, str) else entries]
        if not isinstance(entries, list):
            continue  # load_section reports it
        for i, ds in enumerate(entries):
            if not isinstance(ds, dict):
                continue
            for f, _ in data_files_of(spec, ds, "%s[%d]" % (key, i)):
                st = os.stat(f)
                files.append([f, st.st_size, st.st_mtime_ns])
            jinja = ds.get("chat_template_jinja")
            if isinstance(jinja, str) and jinja.strip().endswith(".jinja"):
                files.append(["jinja", jinja])
    jinja = cfg.get("chat_template_jinja")
    if isinstance(jinja, str) and jinja.strip().endswith(".jinja"):
        p = jinja.strip() if os.path.isabs(jinja.strip()) else os.path.join(spec["config_dir"], jinja.strip())
        if os.path.isfile(p):
            files.append([p, sha256_file(p)])
    parts["files"] = files
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def valid_cache(d, h):
    try:
        with open(os.path.join(d, "meta.json")) as fh:
            meta = json.load(fh)
        ok = meta.get("format_version") == FORMAT_VERSION and meta.get("hash") == h and \
            os.path.isfile(os.path.join(d, "train.bin")) and os.path.isdir(os.path.join(d, "tokenizer")) and \
            (not meta.get("eval_rows") or os.path.isfile(os.path.join(d, "eval.bin")))
        return meta if ok else None
    except (OSError, ValueError):
        return None


# ---- main ------------------------------------------------------------------------------------

def config_checks(spec):
    cfg = dict(spec["config"])
    cfg["sequence_len"] = int(spec["sequence_len"])
    cfg["train_on_inputs"] = bool(cfg.get("train_on_inputs") or False)
    for k in ("default_system_message",):
        if cfg.get(k) is not None:
            raise DataError("%s: not supported here; put a system turn in the data (field_system or a "
                            "system message)" % where_cfg(spec, k))
    if cfg.get("test_datasets") and cfg.get("val_set_size"):
        raise DataError("%s: set either val_set_size or test_datasets, not both" % where_cfg(spec, "val_set_size"))
    v = cfg.get("val_set_size") or 0
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
        raise DataError("%s: expected a fraction below 1 or a number of samples" % where_cfg(spec, "val_set_size"))
    if cfg.get("pretraining_sample_concatenation") is not None:
        raise DataError("%s: not supported; pretraining_dataset documents are packed whole into rows, each "
                        "attending only to itself (sample_packing: false puts one per row)"
                        % where_cfg(spec, "pretraining_sample_concatenation"))
    for k, lo, what in (("sample_packing_bin_size", 1, " of samples, at least 1"),
                        ("sample_packing_group_size", 1, " of samples, at least 1"),
                        ("dataset_shard_num", 0, ""), ("dataset_shard_idx", 0, "")):
        x = cfg.get(k)
        if x is not None and (isinstance(x, bool) or not isinstance(x, int) or x < lo):
            raise DataError("%s: expected a whole number%s, got %r" % (where_cfg(spec, k), what, x))
    num, idx = cfg.get("dataset_shard_num"), cfg.get("dataset_shard_idx")
    if num and idx is not None and idx >= num:
        raise DataError("%s: %d is not below dataset_shard_num %d" % (where_cfg(spec, "dataset_shard_idx"), idx, num))
    if (num and idx is None) or (not num and idx is not None):
        print("note: %s without %s: no sharding (Axolotl shards only when both are set)" % (
            ("dataset_shard_num", "dataset_shard_idx") if num else ("dataset_shard_idx", "dataset_shard_num")))
    elif num and cfg.get("pretraining_dataset") and not cfg.get("test_datasets"):
        print("note: dataset_shard_num has no effect on pretraining_dataset (as in Axolotl, which shards "
              "datasets: and test_datasets)")
    if cfg.get("pretrain_multipack_attn") is False:
        raise DataError("%s: false (packed documents attending to each other) is not implemented; every document "
                        "in a packed row attends only to itself (Axolotl's default, true)"
                        % where_cfg(spec, "pretrain_multipack_attn"))
    if cfg.get("datasets") and cfg.get("pretraining_dataset"):
        raise DataError("%s: set either datasets or pretraining_dataset, not both" % where_cfg(spec, "pretraining_dataset"))
    return cfg


def prepare(spec, out_dir, h):
    cfg = config_checks(spec)
    tok = Tok(spec)
    if cfg.get("rl") or cfg.get("reward_model"):  # preference pairs (rl, reward_model): scripts/prepare_pairs.py
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import prepare_pairs
        return prepare_pairs.prepare(sys.modules[__name__], spec, cfg, tok, out_dir, h)
    T, seed = cfg["sequence_len"], int(spec["seed"])
    counts = []
    if cfg.get("pretraining_dataset"):
        train = load_pretraining(spec, tok, cfg, counts)
        packed = cfg.get("sample_packing") is not False  # packed unless turned off explicitly
    else:
        train = load_section(spec, tok, cfg, cfg.get("datasets"), "datasets", counts)
        packed = bool(cfg.get("sample_packing"))
    evals = load_section(spec, tok, cfg, cfg["test_datasets"], "test_datasets", counts) \
        if cfg.get("test_datasets") else []
    check_ids(spec, tok, ((ids, loc) for ids, _, loc in train + evals))
    n_in = len(train)
    # Axolotl's order (2026-07), each split alike: the merged samples shuffled by seed, the
    # length filter (which keeps their order), deduplication, dataset_shard, the val split.
    shuffle = cfg.get("shuffle_merged_datasets", True) is not False

    def merged_order(n):
        return permutation(n, seed) if shuffle else range(n)

    train, dropped, first = fit_length(spec, cfg, train, "a", merged_order(len(train)))
    evals, edrop, efirst = fit_length(spec, cfg, evals, "an eval", merged_order(len(evals)))
    dups = 0
    if cfg.get("dataset_exact_deduplication"):
        train, d1 = dedup(train)
        evals, d2 = dedup(evals)
        dups = d1 + d2
    n_kept = len(train)
    if not cfg.get("pretraining_dataset"):  # Axolotl streams it, unsharded
        train = shard_of(cfg, train)
    evals = shard_of(cfg, evals)
    n_shard = len(train)
    train, evals = split_val(spec, cfg, train, evals, "samples")
    if not train:
        raise DataError("%s: no training samples left (%d read, %d longer than sequence_len %d%s)" % (
            where_cfg(spec, "datasets"), n_in, dropped, T, ", %d in dataset_shard_idx %d of %d" % (
                n_shard, cfg["dataset_shard_idx"], cfg["dataset_shard_num"]) if shard_on(cfg) else ""))
    sequential = bool(cfg.get("sample_packing_sequentially"))
    packer = {"sequential": sequential, "bin_size": cfg.get("sample_packing_bin_size") or 200,
              "group_size": cfg.get("sample_packing_group_size") or 100000}
    if packed and not sequential:
        train = [train[i] for i in permutation(len(train), seed + 1)]
    eval_packed = bool(cfg.get("eval_sample_packing", packed)) if evals else False
    os.makedirs(out_dir, exist_ok=True)
    save_tokenizer(spec, tok, cfg, out_dir)
    prm = bool(cfg.get("process_reward_model"))  # token labels: each at its own position
    if prm and (packed or eval_packed):
        raise DataError("%s: sample_packing with process_reward_model is not supported here: each row is one "
                        "labelled sequence" % where_cfg(spec, "sample_packing"))
    flags = ROWS_FLAG_LABELS if prm else 0
    tr_rows, tr_tgt, _ = write_rows(os.path.join(out_dir, "train.bin"), train, T, packed, tok.pad, packer,
                                    flags=flags, aligned=prm)
    ev_rows = ev_tgt = 0
    if evals:
        ev_rows, ev_tgt, _ = write_rows(os.path.join(out_dir, "eval.bin"), evals, T, eval_packed, tok.pad, packer,
                                        flags=flags, aligned=prm)
    meta = {"format_version": FORMAT_VERSION, "hash": h, "train_rows": tr_rows, "eval_rows": ev_rows,
            "train_samples": len(train), "eval_samples": len(evals), "train_target_tokens": tr_tgt,
            "eval_target_tokens": ev_tgt, "dropped_long": dropped + edrop, "duplicates_removed": dups,
            "dataset_shard": [cfg.get("dataset_shard_idx"), cfg.get("dataset_shard_num")] if shard_on(cfg) else None, "first_dropped": first or efirst,
            "sequence_len": T, "packed": packed, "eval_packed": eval_packed, "tokenizer_dir": spec["tokenizer_dir"],
            "pad_token_id": tok.pad, "datasets": counts, "needs_embeddings": tok.needs_embeddings}
    if shard_on(cfg) and not cfg.get("pretraining_dataset"):
        print("data: dataset_shard_idx %d of dataset_shard_num %d: %d of %d samples" % (
            cfg["dataset_shard_idx"], cfg["dataset_shard_num"], n_shard, n_kept))
    if dups:
        print("data: dataset_exact_deduplication removed %d duplicate samples" % dups)
    if dropped + edrop:
        print("data: dropped %d samples longer than sequence_len %d (the first: %s); excess_length_strategy: "
              "truncate keeps them cut" % (dropped + edrop, T, first or efirst))
    return meta


def run(args):
    with open(args.spec) as fh:
        spec = json.load(fh)
    if spec.get("spec_version") != 1:
        raise DataError("%s: spec_version %r is not 1 (trainer and script from different versions?)" % (
            args.spec, spec.get("spec_version")))
    if not isinstance(spec.get("config"), dict):
        raise DataError("%s: the spec carries no config" % args.spec)
    h = cache_key(spec)
    root = spec["prepared_root"]
    d = os.path.join(root, h)
    meta = None if args.force else valid_cache(d, h)
    if meta:
        print("data: using prepared %s (cache hit)" % d)
    else:
        os.makedirs(root, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-%s-" % h[:8], dir=root)
        try:
            meta = prepare(spec, tmp, h)
            with open(os.path.join(tmp, "meta.json"), "w") as fh:  # what valid_cache reads: written last
                json.dump(meta, fh, indent=1)
            if os.path.isdir(d):
                shutil.rmtree(d, ignore_errors=True)  # stale (no valid meta.json) or --force
            try:
                os.rename(tmp, d)
            except OSError:
                if not valid_cache(d, h):  # another run made it first; else a real failure
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        what = "kto examples" if meta.get("rl") == "kto" else "preference pairs" if meta.get("paired") else "samples"
        print("data: prepared %d %s -> %d rows%s in %s (%d eval %s -> %d rows)" % (
            meta["train_samples"], what, meta["train_rows"], " (packed)" if meta["packed"] else "", d,
            meta["eval_samples"], what, meta["eval_rows"]))
    mts = re.split(r"[\s,\[\]]+", spec.get("lora_modules_to_save") or "")
    if spec.get("adapter", "none") != "none" and meta.get("needs_embeddings") and not (
            "embed_tokens" in mts and "lm_head" in mts):
        # Axolotl: "lora_modules_to_save not properly set when adding new tokens".
        raise DataError("%s: %s adds tokens the model has not learnt, which an adapter run trains only with "
                        "lora_modules_to_save: [embed_tokens, lm_head] (Axolotl's rule); add it, or train "
                        "without an adapter" % (where_cfg(spec, "special_tokens" if "special" in
                                                          meta["needs_embeddings"][0] else "tokens"),
                                                ", ".join(meta["needs_embeddings"])))
    with open(args.result, "w") as fh:
        fh.write(d + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", required=True, help="the JSON spec the trainer writes")
    ap.add_argument("--result", required=True, help="file to receive the prepared directory's path")
    ap.add_argument("--force", action="store_true", help="prepare again even when the cache is valid")
    args = ap.parse_args()
    try:
        run(args)
    except DataError as e:
        sys.stdout.flush()
        sys.stderr.write("error: %s\n" % e)
        sys.exit(1)
    except OSError as e:
        sys.stdout.flush()
        sys.stderr.write("error: %s: %s\n" % (e.filename or "data", e.strerror or e))
        sys.exit(1)


if __name__ == "__main__":
    main()
