#!/usr/bin/env python3
"""Tokenize text with a Hugging Face tokenizer into train/val token shards.

  python3 scripts/tokenize_hf.py --tokenizer path/to/model_dir --input corpus.txt --out data/corpus

Needs the `transformers` (or `tokenizers`) package and a local tokenizer (tokenizer.json).
Writes uint16 shards (version 1) when the vocabulary fits in 16 bits, else uint32 (version 2).
Documents are split on blank lines; an EOS token (if the tokenizer has one) ends each.
"""
import argparse
import os
import struct
import sys
from array import array


def load_tokenizer(path):
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(path)
        return tok.encode, tok.eos_token_id, len(tok)
    except ImportError:
        pass
    try:
        from tokenizers import Tokenizer
    except ImportError:
        sys.exit("error: needs the 'transformers' or 'tokenizers' package (pip install tokenizers)")
    f = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    t = Tokenizer.from_file(f)
    return (lambda s: t.encode(s).ids), None, t.get_vocab_size()


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
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--val-fraction", type=float, default=0.1)
    args = ap.parse_args()
    encode, eos, vocab = load_tokenizer(args.tokenizer)
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
