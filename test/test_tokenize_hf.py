#!/usr/bin/python3
"""scripts/tokenize_hf.py on every tokenizer layout, with one EOS rule (issue 13, item 4).

A tiny word-level tokenizer (with a BOS post-processor, as Llama's tokenizer.json has) is made
here with the `tokenizers` package. Checks:
  * a model directory with tokenizer.json + tokenizer_config.json: every document is BOS +
    its words + the EOS that tokenizer_config.json names (computed here independently);
  * --tokenizer pointing at the tokenizer.json file itself: the same shards;
  * a directory holding only tokenizer.json: no crash, no EOS, and a note saying so;
  * transformers' AutoTokenizer path (--transformers) writes byte-identical shards.
Usage: /usr/bin/python3 test/test_tokenize_hf.py
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "tokenize_hf.py")
TEXT = "the cat sat\non the mat\n\na dog ran\n\nthe end"
results = []


def check(name, ok, detail=""):
    results.append(ok)
    print(("PASS %s" % name) if ok else ("FAIL %s: %s" % (name, detail)), flush=True)


def make_tokenizer(d, with_config):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    words = sorted(set(TEXT.split()))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for w in words:
        vocab[w] = len(vocab)
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    os.makedirs(d)
    t.save(os.path.join(d, "tokenizer.json"))
    if with_config:
        with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
                       "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False,
                                     "rstrip": False, "normalized": False, "single_word": False},
                       "unk_token": "<unk>"}, f)
    return vocab


def run(tok, out, *extra):
    inp = os.path.join(os.path.dirname(out), "input.txt")
    with open(inp, "w") as f:
        f.write(TEXT)
    p = subprocess.run([sys.executable, SCRIPT, "--tokenizer", tok, "--input", inp, "--out", out,
                        "--val-fraction", "0.25"] + list(extra), capture_output=True, text=True,
                       env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error"))
    return p.returncode, p.stdout + p.stderr


def tokens(out):
    ids = []
    for name in ("train.bin", "val.bin"):
        raw = open(os.path.join(out, name), "rb").read()
        n = struct.unpack("<256i", raw[:1024])[2]
        ids += list(struct.unpack("<%dH" % n, raw[1024:1024 + 2 * n]))
    return ids


def main():
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        print("FAIL setup: the 'tokenizers' package is missing (scripts/install_deps.sh installs it)")
        sys.exit(1)
    root = tempfile.mkdtemp(prefix="test_tokenize_hf.")
    try:
        full = os.path.join(root, "model")
        vocab = make_tokenizer(full, True)
        want = []
        for doc in TEXT.split("\n\n"):
            want += [1] + [vocab[w] for w in doc.split()] + [2]
        rc, log = run(full, os.path.join(root, "o_dir"))
        check("model dir: BOS + words + EOS per document", rc == 0 and tokens(os.path.join(root, "o_dir")) == want,
              log)
        rc, log = run(os.path.join(full, "tokenizer.json"), os.path.join(root, "o_file"))
        check("tokenizer.json file path: same shards", rc == 0 and tokens(os.path.join(root, "o_file")) == want, log)

        bare = os.path.join(root, "bare")
        make_tokenizer(bare, False)
        rc, log = run(bare, os.path.join(root, "o_bare"))
        no_eos = [t for t in want if t != 2]
        check("directory with only tokenizer.json: no crash, no EOS, a note",
              rc == 0 and tokens(os.path.join(root, "o_bare")) == no_eos and "no eos_token" in log, log)

        try:
            import transformers  # noqa: F401
            have_tf = True
        except ImportError:
            have_tf = False
        if not have_tf:
            print("SKIP transformers path: the 'transformers' package is not installed")
        else:
            rc, log = run(full, os.path.join(root, "o_tf"), "--transformers")
            same = rc == 0 and all(
                open(os.path.join(root, "o_tf", n), "rb").read() == open(os.path.join(root, "o_dir", n), "rb").read()
                for n in ("train.bin", "val.bin"))
            check("transformers path: byte-identical shards", same, log[-600:])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    bad = results.count(False)
    print("%d passed, %d failed" % (len(results) - bad, bad))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
