#!/usr/bin/python3
"""train_llama --profile: where a step's time goes, op by op (issue 17, item 2).

  * the numbers do not change: a profiled run's losses and final weights are those of the plain
    run, bit for bit;
  * every op of the step is counted, once: a 2-layer model's step makes 2 attention forwards
    without checkpoints and 4 with them (the recompute), 2 attention backwards either way, one
    fused classifier, 2 x 2 + 1 RMSNorm forwards (without checkpoints);
  * the table's op times add up to no more than the step, and the steps it takes its medians
    over are named;
  * each call's fastest (every call's lowest time over the same steps, summed; the figure
    dev/bench_cpu.sh sets against the SGEMM roofline's sum of each product's fastest) counts the
    table's calls, no op above its median, and adds up;
  * --profile with --plan is refused with one line.
Usage: /usr/bin/python3 test/test_profile.py --bin build/train_llama
"""
import argparse
import filecmp
import json
import os
import re
import shutil
import sys
import tempfile

from checks import check, finish, profile_table as table, run_trainer, tiny_model_yaml, write_shard

CFG = tiny_model_yaml(layers=2) + """train_data: {data}
sequence_len: 16
micro_batch_size: 2
max_steps: 6
save_steps: 0
num_threads: 1
seed: 3
output_dir: {out}
"""


def losses(out):
    return [json.loads(l).get("loss") for l in open(os.path.join(out, "metrics.jsonl")) if '"loss"' in l]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/train_llama")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    root = tempfile.mkdtemp(prefix="test_profile.")
    try:
        data = os.path.join(root, "train.bin")
        write_shard(data, [(i * 11) % 256 for i in range(3000)])
        runs = {}
        for name, extra in [("plain", []), ("prof", ["--profile"]),
                            ("ckpt", ["--profile", "gradient_checkpointing=true"])]:
            out = os.path.join(root, name)
            cfg = os.path.join(root, name + ".yaml")
            open(cfg, "w").write(CFG.format(data=data, out=out))
            rc, so, err = run_trainer(binary, cfg, *extra)
            if rc != 0:
                sys.exit("FAIL setup %s: %s" % (name, err.strip()[-400:]))
            runs[name] = (out, so)

        plain, prof = runs["plain"][0], runs["prof"][0]
        check("profiled run: the plain run's losses", losses(plain) == losses(prof),
              "%s against %s" % (losses(prof), losses(plain)))
        same = [f for f in sorted(os.listdir(plain)) if f.endswith(".safetensors")]
        check("profiled run: the plain run's final weights, bit for bit",
              same and all(filecmp.cmp(os.path.join(plain, f), os.path.join(prof, f), shallow=False) for f in same),
              "files %s" % same)
        check("no table without --profile", "op profile" not in runs["plain"][1])

        rows, head = table(runs["prof"][1])
        check("the table names its steps: the median over steps 3-6 (4)", "steps 3-6 (4)" in head, head)
        want = {"attention_fwd": 2, "attention_bwd": 2, "classifier_ce": 1, "rmsnorm_fwd": 5, "embedding_fwd": 1,
                "embedding_bwd": 1, "swiglu_fwd": 2, "swiglu_bwd": 2}
        got = {k: rows.get(k, (None,))[0] for k in want}
        check("calls per step of a 2-layer step (no checkpoints)", got == want, "got %s" % got)
        for op in ("matmul", "adamw", "memzero"):
            check("%s is timed" % op, op in rows and rows[op][0] > 0, "rows %s" % sorted(rows))
        step = float(re.search(r"step median ([0-9.]+) ms", head).group(1)) if head else 0
        total = sum(ms for _, ms in rows.values())
        check("the ops' medians add up to no more than the step's (+5%: medians need not add)",
              0 < total <= step * 1.05 + 0.05,
              "ops %.3f ms, step %.3f ms" % (total, step))
        rest = re.search(r"\| \(the rest[^|]*\| \| (-?[0-9.]+) \|", runs["prof"][1])
        check("the rest of the step is shown", rest is not None)

        # Each call's fastest: every call's lowest time over the same steps, summed (the like-for-like
        # figure against the SGEMM roofline's sum of each product's fastest).
        so = runs["prof"][1]
        fl = re.search(r"each call's fastest over steps 3-6 \(4; ([0-9]+) calls a step\): ([0-9.]+) ms a step .*?"
                       r"between the ops, ([0-9.]+) ms\)", so)
        check("each call's fastest: over the table's steps (3-6), with its calls a step", fl is not None,
              "no such line in %r" % so[-600:])
        byop = re.search(r"^fastest ms/step by op:(.*)$", so, re.M)
        check("each call's fastest, by op", byop is not None)
        if fl and byop:
            f = byop.group(1).split()
            fast = {f[i]: float(f[i + 1]) for i in range(0, len(f) - 1, 2)}
            calls = sum(int(c) for c, _ in rows.values())
            check("as many calls a step as the table counts", int(fl.group(1)) == calls,
                  "%s against %d" % (fl.group(1), calls))
            check("the same ops as the table (those with time)", set(fast) <= set(rows) and
                  all(op in fast for op, (_, ms) in rows.items() if ms >= 0.01), "%s against %s" % (sorted(fast), sorted(rows)))
            slower = {op: (ms, rows[op][1]) for op, ms in fast.items() if op in rows and ms > rows[op][1] + 0.011}
            check("no op's fastest above its median", not slower, "fastest, median: %s" % slower)
            total, between = float(fl.group(2)), float(fl.group(3))
            check("the fastest step is its ops' fastest plus the lowest time between them",
                  abs(total - between - sum(fast.values())) <= 0.06 + 0.005 * len(fast),
                  "%.2f against %.2f + %.2f" % (total, between, sum(fast.values())))
            check("the fastest step is no slower than the step median", total <= step + 0.05,
                  "%.2f against %.2f" % (total, step))

        ck, _ = table(runs["ckpt"][1])
        got = {k: ck.get(k, (None,))[0] for k in ("attention_fwd", "attention_bwd")}
        check("with checkpoints each layer's attention forward runs twice (the recompute)",
              got == {"attention_fwd": 4, "attention_bwd": 2}, "got %s" % got)

        cfg = os.path.join(root, "plain.yaml")
        rc, so, err = run_trainer(binary, cfg, "--profile", "--plan")
        check("--profile with --plan: one-line error, exit 1",
              rc == 1 and "--profile" in err and len(err.strip().splitlines()) == 1, "rc %d err %r" % (rc, err))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
