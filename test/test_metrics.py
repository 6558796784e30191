#!/usr/bin/python3
"""metrics.jsonl is never lost, torn or silently incomplete (issue 11, items 8 and 13).

  * resume keeps the history up to the checkpoint, drops later lines (and a torn last line)
    and appends: the file reads as the unbroken run;
  * the history is rewritten atomically: if that rewrite cannot be written (a full disk,
    here a file-size limit), the run stops with an error naming metrics.jsonl and the old
    file is left exactly as it was;
  * a metrics line that cannot be written stops the run with an error naming metrics.jsonl
    (no silent gap), and no final model is written after it.
Usage: /usr/bin/python3 test/test_metrics.py --bin build/train_llama
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

from checks import check, finish, run_trainer, tiny_model_yaml, write_shard

CFG = tiny_model_yaml() + """train_data: {data}
sequence_len: 8
micro_batch_size: 2
max_steps: 6
save_steps: 3
eval_steps: 3
eval_batches: 1
val_data: {data}
num_threads: 1
output_dir: {out}
"""



def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    root = tempfile.mkdtemp(prefix="test_metrics.")
    try:
        toks = [(i * 7) % 100 for i in range(4000)]
        data = os.path.join(root, "train.bin")
        write_shard(data, toks)
        full, part = os.path.join(root, "full"), os.path.join(root, "part")
        cfg = os.path.join(root, "cfg.yaml")
        open(cfg, "w").write(CFG.format(data=data, out=full))
        rc, _, err = run_trainer(binary, cfg)
        if rc != 0:
            sys.exit("FAIL setup: %s" % err)
        ref = open(os.path.join(full, "metrics.jsonl")).read()

        # The run is 'killed' after step 5 started writing: steps 4-5 and a torn line remain.
        shutil.copytree(full, part)
        shutil.rmtree(os.path.join(part, "checkpoint-6"))
        lines = ref.splitlines(keepends=True)
        upto5 = [l for l in lines if json.loads(l)["step"] <= 5]
        with open(os.path.join(part, "metrics.jsonl"), "w") as f:
            f.write("".join(upto5) + '{"step": 6, "loss": 5.5')
        rc, _, err = run_trainer(binary, cfg, "output_dir=" + part, "resume_from_checkpoint=auto")
        got = open(os.path.join(part, "metrics.jsonl")).read()
        strip = lambda t: [{k: v for k, v in json.loads(l).items() if k not in ("ms", "tokens_per_sec")}
                           for l in t.splitlines()]
        check("resume: history kept, later and torn lines dropped, same records as the unbroken run",
              rc == 0 and strip(got) == strip(ref), "exit %s\n%s\n%s" % (rc, got, err[-300:]))
        check("resume: lines up to the checkpoint kept byte for byte",
              got.startswith("".join(l for l in lines if json.loads(l)["step"] <= 3)), got)

        # The history rewrite cannot be written: error, old file untouched.
        shutil.rmtree(part)
        shutil.copytree(full, part)
        before = open(os.path.join(part, "metrics.jsonl"), "rb").read()
        rc, _, err = run_trainer(binary, cfg, "output_dir=" + part,
                         "resume_from_checkpoint=" + os.path.join(part, "checkpoint-3"),
                         fsize=len(before) // 3)
        after = open(os.path.join(part, "metrics.jsonl"), "rb").read()
        errs = [l for l in err.splitlines() if l.strip()]
        check("rewrite fails: one error naming metrics.jsonl",
              rc == 1 and len(errs) == 1 and errs[0].startswith("error: ") and "metrics.jsonl" in errs[0],
              "exit %s, %r" % (rc, err))
        check("rewrite fails: history unchanged", after == before, "%d bytes, was %d" % (len(after), len(before)))
        check("rewrite fails: no temporary file left",
              not [n for n in os.listdir(part) if "tmp" in n], repr(os.listdir(part)))

        # A metrics line cannot be written (file-size limit under one step line's growth).
        out = os.path.join(root, "full_disk")
        rc, _, err = run_trainer(binary, cfg, "output_dir=" + out, "save_steps=0", "eval_steps=0",
                         "val_data=", fsize=400)
        errs = [l for l in err.splitlines() if l.strip()]
        check("metrics write fails: one error naming metrics.jsonl",
              rc == 1 and len(errs) == 1 and "metrics.jsonl" in errs[0], "exit %s, %r" % (rc, err))
        check("metrics write fails: no final model",
              os.path.isdir(out) and not os.path.exists(os.path.join(out, "model.safetensors")),
              repr(os.listdir(out)) if os.path.isdir(out) else "no output_dir")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
