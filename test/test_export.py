#!/usr/bin/python3
"""The final output directory as transformers / PEFT / Axolotl users load it (issue 13, item 2).

  * dtype follows the base (save_dtype: auto): a BF16 base gives BF16 weights, torch_dtype
    "bfloat16", each value the round-to-nearest-even bfloat16 of the float32 result (checked
    against a save_dtype: float32 run of the same training); float16 likewise;
  * a float16 overflow is an error naming the tensor, and nothing is published;
  * above max_shard_size the model is split into model-0000k-of-0000N.safetensors with an index
    (weight_map over every tensor, metadata.total_size), which reads back to the same tensors
    and loads as a base_model;
  * tokenizer files, the chat template and generation_config.json are copied from the base;
  * merge_lora writes the merged model (and tokenizer files) to output_dir/merged/, the adapter
    to output_dir, and no model at the top;
  * a later run in the same output_dir leaves no stale shards of an earlier one.
Usage: /usr/bin/python3 test/test_export.py --bin build/train_llama
"""
import argparse
import json
import os
import shutil
import struct
import sys
import tempfile

import numpy as np

from checks import check, finish, run_trainer, tiny_model_yaml, write_shard

CFG = """train_data: {data}
sequence_len: 8
micro_batch_size: 2
max_steps: 2
num_threads: 1
learning_rate: 1e-2
output_dir: {out}
"""
MODEL = tiny_model_yaml(layers=2)
BASE_FILES = {
    "tokenizer.json": '{"version": "1.0", "model": {"type": "BPE"}}\n',
    "tokenizer_config.json": '{"chat_template": "{% for m in messages %}{{ m.content }}{% endfor %}"}\n',
    "special_tokens_map.json": '{"eos_token": "</s>"}\n',
    "generation_config.json": '{"bos_token_id": 1, "eos_token_id": [2, 3], "do_sample": true}\n',
    "chat_template.jinja": "{{ messages }}\n",
}


def run(binary, cwd, text, *sets):
    """Writes text as cwd/cfg.yaml and trains with it: (exit code, stderr)."""
    cfg = os.path.join(cwd, "cfg.yaml")
    with open(cfg, "w") as f:
        f.write(text)
    rc, _, err = run_trainer(binary, cfg, *sets, cwd=cwd)
    return rc, err


def st_read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    dt = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16}
    out = {}
    for k, e in h.items():
        if k == "__metadata__":
            continue
        b, en = e["data_offsets"]
        out[k] = (e["dtype"], np.frombuffer(data[b:en], dt[e["dtype"]]).reshape(e["shape"]))
    return out


def st_write(path, tensors):
    """tensors: name -> (dtype, array) written in order."""
    header, blobs, off = {}, [], 0
    for k, (dt, a) in tensors.items():
        b = a.tobytes()
        header[k] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bf16_bits(a):
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def read_model_dir(d):
    """All tensors of a model directory, one file or shards + index."""
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return st_read(os.path.join(d, "model.safetensors"))
    index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    out = {}
    for f in sorted(set(index["weight_map"].values())):
        out.update(st_read(os.path.join(d, f)))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    root = tempfile.mkdtemp(prefix="test_export.")
    try:
        toks = [(i * 5) % 97 for i in range(3000)]
        data = os.path.join(root, "train.bin")
        write_shard(data, toks)
        # A base model in BF16 with tokenizer files, made from a short random-init run.
        rc, err = run(binary, root, MODEL + CFG.format(data=data, out="init"))
        if rc != 0:
            sys.exit("FAIL setup: %s" % err)
        base = os.path.join(root, "base_bf16")
        os.makedirs(base)
        f32 = st_read(os.path.join(root, "init", "model.safetensors"))
        st_write(os.path.join(base, "model.safetensors"),
                 {k: ("BF16", bf16_bits(a)) for k, (_, a) in f32.items()})
        c = json.load(open(os.path.join(root, "init", "config.json")))
        c["torch_dtype"] = "bfloat16"
        json.dump(c, open(os.path.join(base, "config.json"), "w"))
        for name, text in BASE_FILES.items():
            open(os.path.join(base, name), "w").write(text)
        fine = CFG.format(data=data, out="out") + "base_model: %s\n" % base

        # Full fine-tune: auto dtype (BF16) against the same run saved as float32.
        d = os.path.join(root, "full")
        os.makedirs(d)
        rc, err = run(binary, d, fine)
        rc2, err2 = run(binary, d, fine, "output_dir=out32", "save_dtype=float32")
        check("bf16 base: both runs finish", rc == 0 and rc2 == 0, err + err2)
        got, ref = read_model_dir(os.path.join(d, "out")), read_model_dir(os.path.join(d, "out32"))
        check("bf16 base: every tensor written as BF16", all(dt == "BF16" for dt, _ in got.values()),
              repr({k: dt for k, (dt, _) in got.items()}))
        check("bf16 base: values are the RNE bfloat16 of the float32 result",
              got.keys() == ref.keys() and all(np.array_equal(got[k][1], bf16_bits(ref[k][1])) for k in got),
              "differ")
        cj = json.load(open(os.path.join(d, "out", "config.json")))
        check("bf16 base: config.json torch_dtype bfloat16", cj.get("torch_dtype") == "bfloat16", repr(cj))
        check("float32 override: torch_dtype float32",
              json.load(open(os.path.join(d, "out32", "config.json"))).get("torch_dtype") == "float32")
        copied = all(open(os.path.join(d, "out", n)).read() == t for n, t in BASE_FILES.items()
                     if os.path.exists(os.path.join(d, "out", n)))
        check("tokenizer files, chat template, generation_config copied byte for byte",
              copied and all(os.path.exists(os.path.join(d, "out", n)) for n in BASE_FILES),
              repr(sorted(os.listdir(os.path.join(d, "out")))))

        rc, err = run(binary, d, fine, "output_dir=out16", "save_dtype=float16")
        got16 = read_model_dir(os.path.join(d, "out16"))
        check("float16: values are the float16 of the float32 result",
              rc == 0 and all(dt == "F16" and np.array_equal(a, ref[k][1].astype(np.float16))
                              for k, (dt, a) in got16.items()), err)

        # Shards: small max_shard_size.
        rc, err = run(binary, d, fine, "output_dir=sharded", "max_shard_size=3KiB")
        sd = os.path.join(d, "sharded")
        names = sorted(os.listdir(sd))
        shards = [n for n in names if n.startswith("model-")]
        index = json.load(open(os.path.join(sd, "model.safetensors.index.json"))) if rc == 0 else {}
        sizes = sum(a.nbytes for _, a in got.values())
        check("shards: several files, an index, no model.safetensors",
              rc == 0 and len(shards) > 1 and "model.safetensors" not in names and
              all(s.endswith("-of-%05d.safetensors" % len(shards)) for s in shards), repr(names) + err)
        check("shards: index maps every tensor to an existing shard, total_size right",
              rc == 0 and set(index["weight_map"]) == set(got) and
              set(index["weight_map"].values()) == set(shards) and
              index["metadata"]["total_size"] == sizes, repr(index)[:400])
        back = read_model_dir(sd) if rc == 0 else {}
        check("shards: read back to the same tensors",
              back.keys() == got.keys() and all(np.array_equal(back[k][1], got[k][1]) for k in got))
        rc, err = run(binary, d, CFG.format(data=data, out="from_shards") + "base_model: %s\n" % sd,
                      "max_steps=1")
        check("shards: the sharded output loads as a base_model", rc == 0, err)

        # Stale files: the same output_dir, now a single file: the shards must go.
        rc, err = run(binary, d, fine, "output_dir=sharded")
        names = sorted(os.listdir(sd))
        check("stale shards removed when a later run writes one file",
              rc == 0 and "model.safetensors" in names and
              not [n for n in names if n.startswith("model-") or n.endswith("index.json")], repr(names))

        # float16 overflow: refused, nothing published.
        big = os.path.join(root, "base_big")
        shutil.copytree(base, big)
        t = {k: ("F32", a.copy()) for k, (_, a) in f32.items()}
        t["model.norm.weight"][1][0] = 1e6
        st_write(os.path.join(big, "model.safetensors"), t)
        rc, err = run(binary, d, CFG.format(data=data, out="out_big") + "base_model: %s\n" % big,
                      "save_dtype=float16", "max_steps=1")
        ob = os.path.join(d, "out_big")
        lines = [l for l in err.splitlines() if l.strip()]
        check("float16 overflow: one error naming the tensor and save_dtype",
              rc == 1 and len(lines) == 1 and "model.norm.weight" in lines[0] and "save_dtype" in lines[0],
              repr(err))
        check("float16 overflow: no final model, no temporary directory",
              not [n for n in os.listdir(ob) if n.startswith("model") or "tmp" in n], repr(os.listdir(ob)))

        # float16 rounding at the edges (subnormals, ties, the largest finite values): with
        # learning_rate 0 the weights are written as loaded.
        edge = os.path.join(root, "base_edge")
        shutil.copytree(base, edge)
        t = {k: ("F32", a.copy()) for k, (_, a) in f32.items()}
        vals = np.array([1e-6, 3e-8, -2.5e-7, 5.96e-8, 2.98e-8, 6.0e-5, 6.1035e-5, 65504.0, 65519.0,
                         -65519.9, 1e-10, 2.0 ** -25 * 3, 1.00048828125, 1.00146484375, 0.33333334, 7e-6], np.float32)
        t["model.norm.weight"] = ("F32", vals)
        st_write(os.path.join(edge, "model.safetensors"), t)
        rc, err = run(binary, d, CFG.format(data=data, out="out_edge") + "base_model: %s\n" % edge,
                      "save_dtype=float16", "max_steps=1", "learning_rate=0")
        e16 = read_model_dir(os.path.join(d, "out_edge")) if rc == 0 else {}
        got = e16.get("model.norm.weight", (None, np.zeros(0)))[1]
        check("float16: subnormals, ties and the largest values round as numpy does",
              rc == 0 and got.view(np.uint16).tolist() == vals.astype(np.float16).view(np.uint16).tolist(),
              "%s vs %s %s" % (got, vals.astype(np.float16), err))

        # LoRA + merge_lora: Axolotl's layout.
        rc, err = run(binary, d, fine, "output_dir=lora", "adapter=lora", "lora_r=2", "lora_alpha=4",
                      "lora_target_linear=true", "merge_lora=true")
        lo = os.path.join(d, "lora")
        top, merged = sorted(os.listdir(lo)), sorted(os.listdir(os.path.join(lo, "merged"))) if rc == 0 else []
        check("merge_lora: adapter at the top, no model there",
              rc == 0 and "adapter_model.safetensors" in top and "adapter_config.json" in top and
              "model.safetensors" not in top and "tokenizer.json" in top, repr(top) + err)
        check("merge_lora: merged/ holds model, config and tokenizer files, no adapter",
              {"model.safetensors", "config.json", "tokenizer.json", "generation_config.json"} <= set(merged)
              and "adapter_config.json" not in merged, repr(merged))
        mm = read_model_dir(os.path.join(lo, "merged")) if rc == 0 else {}
        check("merge_lora: merged model in the base's dtype",
              mm and all(dt == "BF16" for dt, _ in mm.values()), repr({k: v[0] for k, v in mm.items()}))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
