#!/usr/bin/env python3
"""Tokenize text with a Hugging Face tokenizer into train/val token shards.

  python3 scripts/tokenize_hf.py --tokenizer MODEL_DIR_or_tokenizer.json --input corpus.txt --out data/corpus

--tokenizer is a model directory or a tokenizer.json file. With a tokenizer.json the fast
`tokenizers` package encodes; a directory without one (a SentencePiece tokenizer.model only)
goes through `transformers`' AutoTokenizer (--transformers forces that path). Both paths follow
one rule, so they write the same shards:
  * documents are split on blank lines; each is encoded with the tokenizer's own special tokens
    (its post-processor: e.g. Llama's BOS);
  * each document ends with the EOS token that tokenizer_config.json names (`eos_token`, a string
    or {"content": ...}), else special_tokens_map.json's; with neither, no EOS is appended and
    the script says so.
Writes uint16 shards (version 1) when the vocabulary fits in 16 bits, else uint32 (version 2).
"""
import argparse
import json
import os
import struct
import sys
from array import array


def eos_token(tok_dir):
    """The EOS string tokenizer_config.json (else special_tokens_map.json) names, or None."""
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        p = os.path.join(tok_dir, name)
        if not os.path.isfile(p):
            continue
        with open(p, encoding="utf-8") as f:
            e = json.load(f).get("eos_token")
        if isinstance(e, dict):
            e = e.get("content")
        if e:
            return e
    return None


def load_fast(tok_json, tok_dir):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit("error: needs the 'tokenizers' package (pip install tokenizers)")
    t = Tokenizer.from_file(tok_json)
    eos = eos_token(tok_dir)
    eos_id = t.token_to_id(eos) if eos is not None else None
    if eos is not None and eos_id is None:
        sys.exit("error: %s: eos_token %r is not in %s" % (tok_dir, eos, tok_json))
    return (lambda s: t.encode(s, add_special_tokens=True).ids), eos_id, t.get_vocab_size(with_added_tokens=True)


def load_transformers(tok_dir):
    try:
        from transformers import AutoTokenizer
    except ImportError:
        sys.exit("error: %s has no tokenizer.json; reading it needs the 'transformers' package" % tok_dir)
    tok = AutoTokenizer.from_pretrained(tok_dir)
    eos = eos_token(tok_dir)
    eos_id = tok.convert_tokens_to_ids(eos) if eos is not None else None
    return (lambda s: tok.encode(s, add_special_tokens=True)), eos_id, len(tok)


def load_tokenizer(path, force_transformers=False):
    if not os.path.exists(path):
        sys.exit("error: --tokenizer %s does not exist" % path)
    tok_dir = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    tok_json = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if force_transformers or not os.path.isfile(tok_json):
        return load_transformers(tok_dir)
    return load_fast(tok_json, tok_dir)


def write_shard(path, tokens, version):
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, version, len(tokens)
    body = array("H" if version == 1 else "I", tokens)
    if sys.byteorder != "little":
        body.byteswap()
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<256i", *header))
        body.tofile(f)
    os.replace(path + ".tmp", path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", required=True, help="model directory or tokenizer.json")
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--transformers", action="store_true", help="encode with transformers' AutoTokenizer")
    args = ap.parse_args()
    encode, eos, vocab = load_tokenizer(args.tokenizer, args.transformers)
    if eos is None:
        print("note: the tokenizer names no eos_token; documents are not separated by one")
    text = open(args.input, encoding="utf-8").read()
    ids = []
    for doc in text.split("\n\n"):
        ids.extend(encode(doc))
        if eos is not None:
            ids.append(eos)
    version = 1 if vocab <= 65536 else 2
    split = int(len(ids) * (1 - args.val_fraction))
    os.makedirs(args.out, exist_ok=True)
    write_shard(os.path.join(args.out, "train.bin"), ids[:split], version)
    write_shard(os.path.join(args.out, "val.bin"), ids[split:], version)
    print("%d tokens (vocab %d, version %d) -> %s" % (len(ids), vocab, version, args.out))


if __name__ == "__main__":
    main()
