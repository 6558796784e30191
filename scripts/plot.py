#!/usr/bin/env python3
"""Plots a run's metrics.jsonl: loss (and eval loss), learning rate, tokens/s and memory per step.

    python3 scripts/plot.py OUTPUT_DIR [--out DIR]

Reads OUTPUT_DIR/metrics.jsonl (one JSON object per step and per evaluation, as train_llama
writes it) and writes PNGs into DIR (default OUTPUT_DIR/plots):
    loss.png            training loss per step; eval_loss (or val_loss for val_data shards)
                        at each evaluation; eval_loss_hf dashed when present
    lr.png              learning rate
    tokens_per_sec.png  throughput
    memory.png          device / host / disk peak bytes of each step
    rewards.png         preference runs (rl) only: rewards/accuracies and rewards/margins per
                        step and at each evaluation (reward_model runs: accuracy and margin)
    summary.png         the four together
Needs matplotlib (Debian: apt-get install python3-matplotlib; scripts/install_deps.sh).
"""
import argparse
import json
import math
import os
import sys


def die(msg):
    sys.stderr.write("error: %s\n" % msg)
    sys.exit(1)


def read_metrics(path):
    steps, evals = [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError:
                # a run killed mid-write may leave a torn last line; anything else is an error
                if f.read().strip():
                    die("%s:%d: not JSON" % (path, n))
                break
            if "step" not in r:
                continue
            if "loss" in r:
                steps.append(r)
            elif "eval_loss" in r or "val_loss" in r:
                evals.append(r)
    return steps, evals


def num(v):
    return v if isinstance(v, (int, float)) and math.isfinite(v) else None


def series(rows, key):
    xs, ys = [], []
    for r in rows:
        v = num(r.get(key))
        if v is not None:
            xs.append(r["step"])
            ys.append(v)
    return xs, ys


def draw_loss(ax, steps, evals):
    ax.plot(*series(steps, "loss"), label="train loss", lw=1)
    for key, style in (("eval_loss", "o-"), ("val_loss", "o-"), ("eval_loss_hf", "x--")):
        xs, ys = series(evals, key)
        if xs:
            ax.plot(xs, ys, style, label=key.replace("_", " "), ms=4)
    ax.set_ylabel("loss")
    ax.legend(loc="best", fontsize=8)


def draw_lr(ax, steps, evals):
    ax.plot(*series(steps, "lr"), color="tab:green", lw=1)
    ax.set_ylabel("learning rate")


def draw_tps(ax, steps, evals):
    ax.plot(*series(steps, "tokens_per_sec"), color="tab:purple", lw=1)
    ax.set_ylabel("tokens / s")


def draw_memory(ax, steps, evals):
    drew = False
    for key, label in (("device_peak_bytes", "device peak"), ("host_peak_bytes", "host peak"),
                       ("disk_peak_bytes", "disk peak")):
        xs, ys = series(steps, key)
        if xs and any(ys):
            ax.plot(xs, [y / 2 ** 20 for y in ys], label=label, lw=1)
            drew = True
    ax.set_ylabel("MiB")
    if drew:
        ax.legend(loc="best", fontsize=8)


def draw_rewards(ax, steps, evals):
    """A preference run's reward accuracy (left axis) and margin (right axis), train and eval
    (a reward model's run: TRL's RewardTrainer names, accuracy and margin)."""
    reward = any("accuracy" in r for r in steps)
    acc, margin = ("accuracy", "margin") if reward else ("rewards/accuracies", "rewards/margins")
    ax.plot(*series(steps, acc), lw=1, color="tab:blue", label=acc)
    xs, ys = series(evals, "eval_" + acc)
    if xs:
        ax.plot(xs, ys, "o-", ms=4, color="tab:cyan", label="eval_" + acc)
    ax.set_ylabel("accuracy")
    ax.set_ylim(-0.05, 1.05)
    ax.legend(loc="upper left", fontsize=8)
    ax2 = ax.twinx()
    ax2.plot(*series(steps, margin), lw=1, color="tab:red", label=margin)
    xs, ys = series(evals, "eval_" + margin)
    if xs:
        ax2.plot(xs, ys, "o-", ms=4, color="tab:orange", label="eval_" + margin)
    ax2.set_ylabel("margin")
    ax2.legend(loc="lower right", fontsize=8)


PLOTS = [("loss", "loss", draw_loss), ("lr", "learning rate", draw_lr),
         ("tokens_per_sec", "throughput", draw_tps), ("memory", "memory peaks per step", draw_memory)]


def epoch_axis(ax, steps):
    """A secondary x axis in epochs, when the metrics carry them."""
    pairs = [(r["step"], r["epoch"]) for r in steps if num(r.get("epoch")) and r["step"]]
    if not pairs:
        return
    per = pairs[-1][1] / pairs[-1][0]  # epochs per step
    if per <= 0:
        return
    sec = ax.secondary_xaxis("top", functions=(lambda s: s * per, lambda e: e / per))
    sec.set_xlabel("epoch", fontsize=8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output_dir", help="a run's output_dir (holds metrics.jsonl)")
    ap.add_argument("--out", help="where the PNGs go (default OUTPUT_DIR/plots)")
    args = ap.parse_args()
    path = os.path.join(args.output_dir, "metrics.jsonl")
    if not os.path.exists(path):
        die("%s: no metrics.jsonl (is %s a run's output_dir?)" % (path, args.output_dir))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        die("matplotlib is not installed (Debian: apt-get install python3-matplotlib; or pip install matplotlib)")
    steps, evals = read_metrics(path)
    if not steps:
        die("%s: no training steps yet" % path)
    out = args.out or os.path.join(args.output_dir, "plots")
    os.makedirs(out, exist_ok=True)
    title = os.path.basename(os.path.abspath(args.output_dir))
    written = []
    plots = PLOTS + ([("rewards", "preference rewards", draw_rewards)]
                     if any("rewards/accuracies" in r or "accuracy" in r for r in steps) else [])
    for name, label, fn in plots:
        fig, ax = plt.subplots(figsize=(7, 4))
        fn(ax, steps, evals)
        ax.set_xlabel("step")
        ax.set_title("%s: %s" % (title, label))
        ax.grid(alpha=0.3)
        epoch_axis(ax, steps)
        fig.tight_layout()
        p = os.path.join(out, name + ".png")
        fig.savefig(p, dpi=100)
        plt.close(fig)
        written.append(p)
    fig, axes = plt.subplots(2, 2, figsize=(12, 7))
    for ax, (name, label, fn) in zip(axes.flat, PLOTS):
        fn(ax, steps, evals)
        ax.set_xlabel("step")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    p = os.path.join(out, "summary.png")
    fig.savefig(p, dpi=100)
    plt.close(fig)
    written.append(p)
    print("plotted %d steps and %d evaluations: %s" % (len(steps), len(evals), ", ".join(written)))


if __name__ == "__main__":
    main()
