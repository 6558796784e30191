#!/usr/bin/python3
"""CPU training-throughput comparison: ./train_llama vs PyTorch eager float32.

Driven by dev/bench_cpu.sh; three subcommands:

  prepare --dir D     write D/model (HF dir of the --shape), D/train.bin (random tokens,
                      uint16 or uint32) and D/cfg.yaml
  torch --dir D --threads N [--steps 10 --warmup 2]
                      time PyTorch float32 eager training steps (same model, data, optimizer,
                      clipping) with torch.set_num_threads(N); writes D/torch_N.json, with the
                      OpenBLAS core type torch's BLAS calls run on
  table --dir D --threads "1 2" [--warmup 2]
                      read D/ours_N/metrics.jsonl, D/torch_N.json and D/roofline_N.json (the
                      SGEMM-only time of the same step, dev/sgemm_roofline.c), print a table
  --shape small (default: 4 layers, C 256, I 688, 4/2 heads, V 256, B 8, T 256),
          large (12 layers, C 768, I 2048, 12/12 heads, V 256, B 1, T 1024) or
          vocab (4 layers, C 512, I 1376, 8/4 heads, V 128256, B 4, T 256)
"""
import argparse
import glob
import json
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test"))
import llama_ref as R  # noqa: E402

SHAPES = {
    "small": dict(L=4, C=256, I=688, Hq=4, Hkv=2, V=256, B=8, T=256),
    "large": dict(L=12, C=768, I=2048, Hq=12, Hkv=12, V=256, B=1, T=1024),
    # Llama 3's vocabulary on a small body: the classifier is most of the step.
    "vocab": dict(L=4, C=512, I=1376, Hq=8, Hkv=4, V=128256, B=4, T=256),
}
S = SHAPES["small"]
B, T, ACCUM = S["B"], S["T"], 1


def set_shape(name):
    global S, B, T
    S = SHAPES[name]
    B, T = S["B"], S["T"]


def shape_args(name):
    """The same shape as dev/sgemm_roofline's options."""
    s = SHAPES[name]
    return (f"--layers {s['L']} --hidden {s['C']} --inter {s['I']} --heads {s['Hq']} --kv {s['Hkv']} "
            f"--vocab {s['V']} --B {s['B']} --T {s['T']}")


def bench_cfg():
    return R.make_config(vocab_size=S["V"], hidden_size=S["C"], intermediate_size=S["I"],
                         num_hidden_layers=S["L"], num_attention_heads=S["Hq"],
                         num_key_value_heads=S["Hkv"], max_position_embeddings=max(1024, T),
                         tie_word_embeddings=False)


def openblas_core():
    """Core type of the OpenBLAS loaded in this process (torch's BLAS), or why unknown."""
    import ctypes
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1]
            if "blas" in p and ".so" in p:
                libs.add(p)
    for p in sorted(libs):
        try:
            lib = ctypes.CDLL(p)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return "%s (%s)" % (lib.openblas_get_corename().decode(), p)
        except (OSError, AttributeError):
            continue
    return "not OpenBLAS: " + (", ".join(sorted(libs)) or "no BLAS library mapped")


def bench_tc(d, steps):
    return R.train_config(base_model=os.path.join(d, "model"),
                          train_data=os.path.join(d, "train.bin"),
                          sequence_len=T, micro_batch_size=B, gradient_accumulation_steps=ACCUM,
                          max_steps=steps, learning_rate=3e-4, lr_scheduler="cosine",
                          warmup_steps=2, weight_decay=0.1, max_grad_norm=1.0,
                          output_dir=os.path.join(d, "ours"))


def cmd_prepare(a):
    os.makedirs(a.dir, exist_ok=True)
    cfg = bench_cfg()
    R.save_hf_dir(os.path.join(a.dir, "model"), cfg, R.init_weights(cfg, seed=1, std=0.02,
                                                                     embed_std=0.02))
    n = B * T * ACCUM * (a.steps + a.warmup + 2) + 1
    R.write_shard(os.path.join(a.dir, "train.bin"), R.random_tokens(n, cfg["vocab_size"]),
                  1 if cfg["vocab_size"] <= 65536 else 2)  # version 2: uint32 tokens
    R.write_yaml(os.path.join(a.dir, "cfg.yaml"), bench_tc(a.dir, a.steps + a.warmup))


def cmd_torch(a):
    import torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = json.load(open(os.path.join(a.dir, "model", "config.json")))
    w = R.read_safetensors(os.path.join(a.dir, "model", "model.safetensors"))
    toks = R.read_shard(os.path.join(a.dir, "train.bin"))
    tr = R.RefTrainer(cfg, w, toks, bench_tc(a.dir, a.steps + a.warmup), dtype=torch.float32,
                      use_sdpa=True)
    times, losses = [], []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        loss, _, _ = tr.step()
        dt = time.perf_counter() - t0
        losses.append(loss)
        if i >= a.warmup:
            times.append(dt)
    ms = 1000.0 * float(np.mean(times))
    res = {"threads": a.threads, "ms": ms, "ms_fastest": 1000.0 * float(np.min(times)),
           "tokens_per_sec": B * T * ACCUM / (ms / 1000.0),
           "losses": losses, "sdpa": tr.model.use_sdpa, "torch": torch.__version__,
           "openblas": openblas_core()}
    with open(os.path.join(a.dir, f"torch_{a.threads}{a.tag}.json"), "w") as f:
        json.dump(res, f)
    print(f"torch threads={a.threads}: {ms:.1f} ms/step, {res['tokens_per_sec']:.0f} tok/s, "
          f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")


def rounds(d, name):
    """name and its repeats name_r1, name_r2, ... (dev/bench_cpu.sh ROUNDS=n) that exist in d;
    for the roofline also the runs right before ours (name_pre, name_rK_pre)."""
    base, ext = os.path.splitext(name)
    pats = [f"{base}_r*{ext}"] + ([f"{base}_pre{ext}"] if base.startswith("roofline_") else [])
    found = sorted(p for pat in pats for p in glob.glob(os.path.join(d, pat)))
    return [p for p in [os.path.join(d, name)] + found if os.path.exists(p)]


def bracketed(d, n, sfx):
    """The roofline of a round as ours met it: the mean of the runs right before and right after
    ours (or the one after, for a run without the one before), with the two."""
    post, pre = (os.path.join(d, f"roofline_{n}{sfx}{x}.json") for x in ("", "_pre"))
    if not os.path.exists(post):
        return None
    r = json.load(open(post))["ms"]
    if not os.path.exists(pre):
        return r, None, r
    b = json.load(open(pre))["ms"]
    return (b + r) / 2, b, r


def best_json(d, name):
    """The fastest (lowest ms) of a side's rounds, or None."""
    runs = [json.load(open(p)) for p in rounds(d, name)]
    return min(runs, key=lambda r: r["ms"]) if runs else None


def ours_stats(d, threads, warmup):
    runs = [s for s in (ours_run(p, warmup) for p in rounds(d, f"ours_{threads}")) if s]
    return min(runs, key=lambda r: r["ms"]) if runs else None


def ours_run(out_dir, warmup):
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    rows = [r for r in R.read_metrics(path) if int(r["step"]) > warmup and "ms" in r]
    if not rows:
        return None
    allrows = R.read_metrics(path)
    ms = float(np.mean([float(r["ms"]) for r in rows]))
    fastest = float(np.min([float(r["ms"]) for r in rows]))
    tps_rep = float(np.mean([float(r.get("tokens_per_sec", 0.0)) for r in rows]))
    return {"ms": ms, "ms_fastest": fastest, "tokens_per_sec": B * T * ACCUM / (ms / 1000.0), "reported": tps_rep,
            "losses": [float(r["loss"]) for r in allrows]}


def profile_ops(path):
    """train_llama --profile's table: ({op: ms per step}, step median ms, its steps as '3-12'),
    or None."""
    if not os.path.exists(path):
        return None
    ops, step, steps = {}, None, "?"
    for line in open(path):
        m = re.search(r"median over steps ([0-9]+-[0-9]+).*step median ([0-9.]+) ms", line)
        if m:
            steps, step = m.group(1), float(m.group(2))
        m = re.match(r"\| (\w+) \| [0-9.e+]+ \| ([0-9.]+) \|", line)
        if m:
            ops[m.group(1)] = float(m.group(2))
    return (ops, step, steps) if ops and step else None


def profile_fastest(path):
    """train_llama --profile's each-call's-fastest lines: (ms a step, {op: ms per step}), or None."""
    if not os.path.exists(path):
        return None
    total, ops = None, {}
    for line in open(path):
        m = re.match(r"each call's fastest over steps .*?: ([0-9.]+) ms a step", line)
        if m:
            total = float(m.group(1))
        if line.startswith("fastest ms/step by op:"):
            f = line.split(":", 1)[1].split()
            ops = {f[i]: float(f[i + 1]) for i in range(0, len(f) - 1, 2)}
    return (total, ops) if total and ops else None


def faster_roofline(d, n, sfx):
    """The faster of a round's two roofline runs (before and after ours), its JSON, or None."""
    runs = [json.load(open(p)) for p in (os.path.join(d, f"roofline_{n}{sfx}{x}.json") for x in ("", "_pre"))
            if os.path.exists(p)]
    return min(runs, key=lambda r: r["ms"]) if runs else None


PARTS = [("products (matmul, matmul_many)", ("matmul", "matmul_many", "matmul_dw"), "linear_ms"),
         ("attention, forward and backward", ("attention_fwd", "attention_bwd"), "attention_ms"),
         ("classifier and cross-entropy", ("classifier_ce",), "classifier_ms")]


def split_fastest(d, n, nrounds):
    """Each call's fastest, part by part, against the faster roofline run of the same round, in
    the round whose ratio is the median one: both sides as sums of each operation's lowest time
    (the roofline's by construction), so a load that comes and goes within a second moves
    neither much."""
    got = []
    for k in range(1, nrounds + 1):
        sfx = f"_r{k}" if nrounds > 1 else ""
        f, r = profile_fastest(os.path.join(d, f"ours_{n}{sfx}.log")), faster_roofline(d, n, sfx)
        if f and r and "linear_ms" in r:
            got.append((r["ms"] / f[0], k, f, r))
    if not got:
        return
    got.sort(key=lambda g: g[0])
    _, k, (total, ops), r = got[(len(got) - 1) // 2]
    print(f"\nthreads {n}: each call's fastest (ours: every op call's lowest time over the profiled steps, "
          f"summed) against the faster roofline run of the same round, part by part (round {k}, the median "
          f"ratio of {len(got)}):\n")
    print("| part | ours ms/step | roofline ms/step | ours - roofline |")
    print("|---|---:|---:|---:|")
    named, acc = set(), 0
    for name, group, key in PARTS:
        ms = sum(ops.get(o, 0) for o in group)
        named.update(group)
        acc += ms
        print(f"| {name} | {ms:.1f} | {r[key]:.1f} | {ms - r[key]:+.1f} |")
    rest = sorted((o for o in ops if o not in named), key=lambda o: -ops[o])
    other = sum(ops[o] for o in rest)
    acc += other
    top = ", ".join(f"{o} {ops[o]:.1f}" for o in rest[:6])
    print(f"| every other op ({top}) | {other:.1f} | 0 | {other:+.1f} |")
    print(f"| between the ops (the lowest over the steps) | {total - acc:.1f} | 0 | {total - acc:+.1f} |")
    print(f"| step | {total:.1f} | {r['ms']:.1f} | {total - r['ms']:+.1f} (roofline / ours "
          f"{100 * r['ms'] / total:.0f}%) |")


def split_step(d, n, warmup):
    """Our step part by part against the roofline's parts, in the round where ours was fastest:
    its --profile medians (the same steps the tables time) and the roofline run right after it
    (the same minute's load). What the roofline counts, and what it does not."""
    best = None
    for p in rounds(d, f"ours_{n}"):
        o, prof = ours_run(p, warmup), profile_ops(p + ".log")
        rp = os.path.join(d, os.path.basename(p).replace("ours_", "roofline_", 1) + ".json")
        if o and prof and os.path.exists(rp) and (best is None or o["ms"] < best[0]["ms"]):
            best = (o, prof, json.load(open(rp)), p)
    if not best or "linear_ms" not in best[2]:
        return
    _, (ops, step, steps), r, p = best
    parts = [(name, group, r[key]) for name, group, key in PARTS]
    named = {o for _, group, _ in parts for o in group}
    rest = sorted((o for o in ops if o not in named), key=lambda o: -ops[o])
    print(f"\nthreads {n}: where our step goes against the roofline's parts, in the round where ours was "
          f"fastest ({os.path.basename(p)}: its --profile medians over steps {steps}, and the "
          f"roofline run after it):\n")
    print("| part | ours ms/step | roofline ms/step | ours - roofline |")
    print("|---|---:|---:|---:|")
    total = 0
    for name, group, roof in parts:
        ms = sum(ops.get(o, 0) for o in group)
        total += ms
        print(f"| {name} | {ms:.1f} | {roof:.1f} | {ms - roof:+.1f} |")
    other = sum(ops[o] for o in rest)
    total += other
    top = ", ".join(f"{o} {ops[o]:.1f}" for o in rest[:6])
    print(f"| every other op ({top}) | {other:.1f} | 0 | {other:+.1f} |")
    print(f"| between the ops (step median less the ops' medians) | {step - total:.1f} | 0 | {step - total:+.1f} |")
    print(f"| step | {step:.1f} | {r['ms']:.1f} | {step - r['ms']:+.1f} (roofline / ours {100 * r['ms'] / step:.0f}%) |")


def cmd_table(a):
    print(f"\nmodel: {S['L']} layers, C {S['C']}, I {S['I']}, {S['Hq']} heads / {S['Hkv']} kv heads, "
          f"V {S['V']}; B {B}, T {T}; float32; mean of the steps after {a.warmup} warmup steps"
          f"{'; each side the fastest of its ' + str(a.rounds) + ' rounds' if a.rounds > 1 else ''}"
          "; the roofline the fastest of its runs (two a round: before and after ours)\n")
    print("| threads | ours ms/step | ours tok/s | torch ms/step | torch tok/s | SGEMM roofline ms/step "
          "| ours/torch | ours/roofline |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in a.threads.split():
        o = ours_stats(a.dir, n, a.warmup)
        t = best_json(a.dir, f"torch_{n}.json")
        r = best_json(a.dir, f"roofline_{n}.json")
        os_ = f"{o['ms']:.1f} | {o['tokens_per_sec']:.0f}" if o else "n/a | n/a"
        ts_ = f"{t['ms']:.1f} | {t['tokens_per_sec']:.0f}" if t else "n/a | n/a"
        rs_ = f"{r['ms']:.1f}" if r else "n/a"
        ratio = f"{o['tokens_per_sec'] / t['tokens_per_sec']:.2f}x" if (o and t) else "n/a"
        roof = f"{100 * r['ms'] / o['ms']:.0f}%" if (o and r) else "n/a"
        print(f"| {n} | {os_} | {ts_} | {rs_} | {ratio} | {roof} |")
    # A neighbour's load on a shared machine lengthens some steps and not others, and the
    # roofline is the sum of each shape's fastest of --reps runs: the means above set a mean under
    # load against a best case. So the same statistic on every side too: each side's fastest
    # step over all its rounds (the roofline as it is), the time a step takes when nothing else
    # runs.
    print("\nfastest step of each side (all rounds; the roofline is already each shape's fastest):\n")
    print("| threads | ours ms/step | torch ms/step | SGEMM roofline ms/step | ours/torch | ours/roofline |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in a.threads.split():
        om = [s["ms_fastest"] for s in (ours_run(p, a.warmup) for p in rounds(a.dir, f"ours_{n}")) if s]
        tm = [json.load(open(p)).get("ms_fastest") for p in rounds(a.dir, f"torch_{n}.json")]
        tm = [x for x in tm if x is not None]
        r = best_json(a.dir, f"roofline_{n}.json")
        o_, t_, r_ = (min(om) if om else None), (min(tm) if tm else None), (r["ms"] if r else None)
        fmt = lambda x: f"{x:.1f}" if x else "n/a"  # noqa: E731
        ratio = f"{t_ / o_:.2f}x" if (o_ and t_) else "n/a"
        roof = f"{100 * r_ / o_:.0f}%" if (o_ and r_) else "n/a"
        print(f"| {n} | {fmt(o_)} | {fmt(t_)} | {fmt(r_)} | {ratio} | {roof} |")
    for n in a.threads.split():
        split_step(a.dir, n, a.warmup)
    # Each round ran the sides back to back (roofline, ours, roofline, torch): its own ratios show
    # the noise, and their median is the figure a changing load moves least.
    print("\nround by round (ours / torch / roofline ms/step, the roofline the mean of the runs right "
          "before and after ours [before, after]: ours/torch, ours/roofline; then, where ours ran with "
          "--profile, each call's fastest against the faster of the two roofline runs):")
    for n in a.threads.split():
        own, fast = [], []  # (ours/torch, ours/roofline) of each complete round; each call's fastest ratios
        for k in range(1, a.rounds + 1):
            sfx = f"_r{k}" if a.rounds > 1 else ""
            o = ours_run(os.path.join(a.dir, f"ours_{n}{sfx}"), a.warmup)
            tp = os.path.join(a.dir, f"torch_{n}{sfx}.json")
            t = json.load(open(tp)) if os.path.exists(tp) else None
            r = bracketed(a.dir, n, sfx)
            if o and t and r:
                own.append((t['ms'] / o['ms'], r[0] / o['ms']))
                both = f" [{r[1]:.1f}, {r[2]:.1f}]" if r[1] is not None else ""
                f, rf = profile_fastest(os.path.join(a.dir, f"ours_{n}{sfx}.log")), faster_roofline(a.dir, n, sfx)
                fc = ""
                if f and rf:
                    fast.append(rf["ms"] / f[0])
                    fc = f"; each call's fastest {f[0]:.1f} against {rf['ms']:.1f}: {100 * rf['ms'] / f[0]:.1f}%"
                print(f"  threads {n} round {k}: {o['ms']:.1f} / {t['ms']:.1f} / {r[0]:.1f}{both}: "
                      f"{t['ms'] / o['ms']:.2f}x, {100 * r[0] / o['ms']:.1f}%{fc}")
        if len(own) > 1:  # under a neighbour's changing load the fastest-of-each table mixes rounds
            print(f"  threads {n} median of the {len(own)} rounds' own ratios: "
                  f"{np.median([x for x, _ in own]):.2f}x, {100 * np.median([y for _, y in own]):.1f}%")
        if fast:
            print(f"  threads {n} each call's fastest against the roofline, median of {len(fast)} round(s): "
                  f"{100 * np.median(fast):.1f}% (rounds {', '.join(f'{100 * x:.1f}' for x in fast)})")
            split_fastest(a.dir, n, a.rounds)
    t = None
    for n in a.threads.split():
        t = best_json(a.dir, f"torch_{n}.json") or t
    for n in a.threads.split():  # same model and data: the losses should agree
        o = ours_stats(a.dir, n, a.warmup)
        tb = best_json(a.dir, f"torch_{n}.json")
        if o and tb:
            tl = tb["losses"]
            k = min(len(tl), len(o["losses"]))
            d = max(abs(x - y) for x, y in zip(tl[:k], o["losses"][:k]))
            print(f"\nthreads {n}: loss step 1 ours {o['losses'][0]:.5f} torch {tl[0]:.5f}, "
                  f"step {k} ours {o['losses'][k - 1]:.5f} torch {tl[k - 1]:.5f} "
                  f"(max diff {d:.1e})", end="")
    print()
    if t:
        print(f"\ntorch {t['torch']}, attention: "
              f"{'F.scaled_dot_product_attention' if t['sdpa'] else 'matmul + masked softmax'}; "
              f"torch's OpenBLAS core: {t.get('openblas', 'unknown')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cmd", choices=["prepare", "torch", "table", "shape"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--tag", default="", help="suffix of the torch result file (a round: _r2)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    a = ap.parse_args()
    set_shape(a.shape)
    if a.cmd == "shape":  # dev/sgemm_roofline's options for the same shape
        print(shape_args(a.shape))
    elif a.cmd == "prepare":
        cmd_prepare(a)
    elif a.cmd == "torch":
        a.threads = int(a.threads)
        cmd_torch(a)
    else:
        cmd_table(a)


if __name__ == "__main__":
    main()
