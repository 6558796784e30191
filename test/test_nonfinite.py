#!/usr/bin/python3
"""Non-finite steps never reach the weights (issue 11, item 7).

A real model makes some steps non-finite: token 200's embedding row is FLT_MAX and the
attention output projection is scaled by 1e35, so wherever token 200 appears the residual
stream overflows to infinity and the loss is NaN; every other batch trains normally. Checks:
  * a run with one bad batch skips that step (warning on stderr, weights unchanged, metrics
    line with "loss": null and "skipped": true), finishes with exit 0 and finite weights;
  * resuming from a checkpoint written after a skipped step is bit-identical to the
    uninterrupted run (AdamW's step count excludes skipped steps, and the checkpoint says so);
  * three non-finite steps in a row stop the run with exit 1 and an error naming the step;
    the checkpoints before stay whole, no later checkpoint or final model is written;
  * metrics.jsonl is valid JSON Lines throughout (no NaN or -nan tokens).
Usage: /usr/bin/python3 test/test_nonfinite.py --bin build/train_llama
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

BAD = 200  # the token whose embedding overflows the residual stream

CFG = tiny_model_yaml() + """train_data: {data}
sequence_len: 8
micro_batch_size: 2
max_steps: 1
num_threads: 1
shuffle: false
output_dir: {out}
"""



def st_read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), bytearray(raw[8 + n:])


def st_write(path, header, data):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + bytes(data))


def tensors(path):
    h, data = st_read(path)
    return {k: np.frombuffer(bytes(data[e["data_offsets"][0]:e["data_offsets"][1]]), np.float32)
            for k, e in h.items() if k != "__metadata__"}


def run(binary, cwd, cfg, *sets):
    return run_trainer(binary, cfg, *sets, cwd=cwd)


def metrics(out):
    """The parsed lines of out/metrics.jsonl, or an error string if any line is not JSON."""
    lines = open(os.path.join(out, "metrics.jsonl")).read().splitlines()
    try:
        return [json.loads(l) for l in lines]
    except ValueError as e:
        return "invalid JSON line: %s" % e


def make_bad_model(binary, root):
    """A trained 1-step model, then poisoned so that token BAD overflows."""
    write_shard(os.path.join(root, "plain.bin"), [i % 100 for i in range(4000)])
    cfg = os.path.join(root, "init.yaml")
    open(cfg, "w").write(CFG.format(data="plain.bin", out="init"))
    rc, _, err = run(binary, root, cfg)
    if rc != 0:
        sys.exit("FAIL setup: the initial run failed: %s" % err)
    mdir = os.path.join(root, "bad_model")
    os.makedirs(mdir)
    shutil.copy(os.path.join(root, "init", "config.json"), mdir)
    h, data = st_read(os.path.join(root, "init", "model.safetensors"))

    def edit(name, fn):
        b, e = h[name]["data_offsets"]
        a = np.frombuffer(bytes(data[b:e]), np.float32).copy()
        data[b:e] = fn(a).astype(np.float32).tobytes()

    def poison_row(a):
        a = a.reshape(256, 16)
        a[BAD] = np.finfo(np.float32).max
        return a
    edit("model.embed_tokens.weight", poison_row)
    edit("model.layers.0.self_attn.o_proj.weight", lambda a: a * 1e35)
    st_write(os.path.join(mdir, "model.safetensors"), h, data)
    return mdir


def case_cfg(root, name, tokens, mdir):
    d = os.path.join(root, name)
    os.makedirs(d)
    write_shard(os.path.join(d, "train.bin"), tokens)
    text = CFG.format(data="train.bin", out="out")
    text = text[text.index("train_data"):] + "base_model: %s\n" % mdir
    cfg = os.path.join(d, "cfg.yaml")
    open(cfg, "w").write(text)
    return d, cfg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    root = tempfile.mkdtemp(prefix="test_nonfinite.")
    try:
        mdir = make_bad_model(binary, root)
        # 16 tokens a step: token BAD only in step 3's window.
        one_bad = [i % 100 for i in range(4000)]
        one_bad[40:48] = [BAD] * 8
        d, cfg = case_cfg(root, "one_bad", one_bad, mdir)
        rc, out, err = run(binary, d, cfg, "max_steps=5", "save_steps=4")
        check("skip: run finishes with exit 0", rc == 0, "exit %s, stderr %r" % (rc, err[-500:]))
        warn = [l for l in err.splitlines() if l.strip()]
        check("skip: one warning naming step 3",
              len(warn) == 1 and warn[0].startswith("warning: step 3:") and "skipped" in warn[0],
              repr(warn))
        m = metrics(os.path.join(d, "out"))
        check("skip: metrics.jsonl is valid JSON", not isinstance(m, str), m)
        if not isinstance(m, str):
            steps = {r["step"]: r for r in m if "loss" in r}
            check("skip: step 3 logged as skipped with null loss",
                  steps.get(3, {}).get("loss", 0) is None and steps[3].get("skipped") is True,
                  repr(steps.get(3)))
            check("skip: the other steps are finite and not skipped",
                  all(steps.get(s, {}).get("loss") is not None and "skipped" not in steps[s] for s in (1, 2, 4, 5)),
                  repr(m))
        final = tensors(os.path.join(d, "out", "model.safetensors"))
        emb = final["model.embed_tokens.weight"].reshape(256, 16)
        check("skip: final weights finite except the poisoned row left as loaded",
              all(np.isfinite(v).all() for k, v in final.items() if k != "model.embed_tokens.weight")
              and np.isfinite(np.delete(emb, BAD, axis=0)).all(), "non-finite weights")
        state = json.load(open(os.path.join(d, "out", "checkpoint-4", "trainer_state.json")))
        check("skip: checkpoint records the skipped step", state.get("skipped_steps") == 1, repr(state))

        # Resume from checkpoint-4 (written right after the skipped step): bit-identical.
        shutil.copytree(os.path.join(d, "out"), os.path.join(d, "full"))
        shutil.rmtree(os.path.join(d, "out", "checkpoint-4"))
        shutil.copytree(os.path.join(d, "full", "checkpoint-4"), os.path.join(d, "ck4"))
        rc, _, err = run(binary, d, cfg, "max_steps=5", "save_steps=4", "output_dir=resumed",
                         "resume_from_checkpoint=ck4")
        same = rc == 0 and open(os.path.join(d, "resumed", "model.safetensors"), "rb").read() == \
            open(os.path.join(d, "full", "model.safetensors"), "rb").read()
        check("skip: resume after a skipped step is bit-identical", same,
              "exit %s, stderr %r" % (rc, err[-500:]))

        # Steps 1-2 clean, then BAD in every window: steps 3, 4, 5 skipped -> stop at step 5.
        all_bad = [i % 100 for i in range(4000)]
        for i in range(32, 4000, 16):
            all_bad[i] = BAD
        d, cfg = case_cfg(root, "all_bad", all_bad, mdir)
        rc, out, err = run(binary, d, cfg, "max_steps=10", "save_steps=1")
        lines = [l for l in err.splitlines() if l.strip()]
        check("stop: exit code 1", rc == 1, "exit %s" % rc)
        check("stop: two warnings, then an error naming step 5",
              len(lines) == 3 and lines[0].startswith("warning: step 3:") and
              lines[1].startswith("warning: step 4:") and lines[2].startswith("error: step 5:") and
              "3 consecutive" in lines[2], repr(lines))
        o = os.path.join(d, "out")
        ckpts = sorted(x for x in os.listdir(o) if x.startswith("checkpoint-"))
        check("stop: checkpoints of the good steps only", ckpts == ["checkpoint-1", "checkpoint-2"],
              repr(os.listdir(o)))
        check("stop: no final model", not os.path.exists(os.path.join(o, "model.safetensors")),
              repr(os.listdir(o)))
        ck = tensors(os.path.join(o, "checkpoint-2", "model.safetensors"))
        emb = ck["model.embed_tokens.weight"].reshape(256, 16)
        check("stop: last good checkpoint is finite",
              all(np.isfinite(v).all() for k, v in ck.items() if k != "model.embed_tokens.weight")
              and np.isfinite(np.delete(emb, BAD, axis=0)).all(), "non-finite")
        m = metrics(o)
        check("stop: metrics.jsonl is valid JSON with null losses",
              not isinstance(m, str) and [r["loss"] for r in m][2:] == [None, None, None], repr(m))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
