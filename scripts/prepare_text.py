#!/usr/bin/env python3
"""Turn UTF-8 text into byte-level (vocab 256) train/val token shards.

  python3 scripts/prepare_text.py --input corpus.txt --out data/corpus
  python3 scripts/prepare_text.py --name tinyshakespeare --out data/tinyshakespeare

--name looks for NAME.txt in the data directory (--data-dir, else $LLMC_DATA_DIR, else
../shared/data beside the repository, else ./data) and downloads it from its public address
when it is in none of them. The shards use the header the trainer reads: 256 int32
(magic 20240520, version 1 = uint16 tokens, token count), then the tokens.
Stdlib only, so any python3 runs it.
"""
import argparse
import os
import struct
import sys
import urllib.request

SOURCES = {
    "tinyshakespeare":
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_shard(path, tokens):
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))
    os.replace(tmp, path)  # a shard is whole or absent


def find_named(name, data_dir):
    dirs = [d for d in (data_dir, os.environ.get("LLMC_DATA_DIR"),
                        os.path.join(REPO, "..", "shared", "data"), os.path.join(REPO, "data"))
            if d]
    for d in dirs:
        p = os.path.join(d, name + ".txt")
        if os.path.isfile(p):
            return p
    if name not in SOURCES:
        sys.exit("error: no %s.txt in %s and no known download address for it" % (name, ", ".join(dirs)))
    dest_dir = data_dir or os.path.join(REPO, "data")
    os.makedirs(dest_dir, exist_ok=True)
    dest = os.path.join(dest_dir, name + ".txt")
    print("downloading %s -> %s" % (SOURCES[name], dest))
    try:
        with urllib.request.urlopen(SOURCES[name], timeout=60) as r:
            data = r.read()
    except Exception as e:  # network errors of every kind end the same way
        sys.exit("error: cannot download %s: %s" % (SOURCES[name], e))
    with open(dest + ".tmp", "wb") as f:
        f.write(data)
    os.replace(dest + ".tmp", dest)
    return dest


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", help="UTF-8 text file")
    src.add_argument("--name", help="a known corpus: " + ", ".join(SOURCES))
    ap.add_argument("--data-dir", help="where to look for / download NAME.txt")
    ap.add_argument("--out", required=True, help="output directory for train.bin and val.bin")
    ap.add_argument("--val-fraction", type=float, default=0.1, help="tail of the text kept for validation")
    args = ap.parse_args()
    path = args.input or find_named(args.name, args.data_dir)
    try:
        raw = open(path, "rb").read()
        raw.decode("utf-8")
    except OSError as e:
        sys.exit("error: %s: %s" % (path, e.strerror))
    except UnicodeDecodeError as e:
        sys.exit("error: %s: not UTF-8 text (byte %d)" % (path, e.start))
    if not 0 < args.val_fraction < 1:
        sys.exit("error: --val-fraction must be in (0, 1)")
    split = int(len(raw) * (1 - args.val_fraction))
    os.makedirs(args.out, exist_ok=True)
    write_shard(os.path.join(args.out, "train.bin"), list(raw[:split]))
    write_shard(os.path.join(args.out, "val.bin"), list(raw[split:]))
    print("%s: %d train and %d val byte tokens -> %s/{train,val}.bin"
          % (path, split, len(raw) - split, args.out))


if __name__ == "__main__":
    main()
