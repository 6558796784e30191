#!/usr/bin/python3
"""scripts/plot.py draws a run's metrics.jsonl into non-blank PNGs (loss + eval loss, lr,
tokens/s, memory, summary), from a real tiny run and from a prepared-data style file (eval_loss,
eval_loss_hf, epochs, a null loss, a torn last line); a missing metrics.jsonl is one error line.

    /usr/bin/python3 test/test_plot.py --bin build/train_llama
Skips (exit 0, with a message) when matplotlib is not installed.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from checks import check, finish, run_trainer, tiny_model_yaml, write_shard  # noqa: E402

PLOT = os.path.join(ROOT, "scripts", "plot.py")
NAMES = ["loss", "lr", "tokens_per_sec", "memory", "summary"]



def write_pref_metrics(root, name, steps, figures, eval_figures, every=5):
    """ROOT/NAME/metrics.jsonl of a preference run: steps steps with figures(step), an evaluation
    with eval_figures every `every` steps; returns the directory."""
    d = os.path.join(root, name)
    os.makedirs(d)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for s in range(1, steps + 1):
            f.write(json.dumps(dict({"step": s, "loss": 0.69 - 0.02 * s, "lr": 1e-4, "grad_norm": 1.0, "ms": 10,
                                     "tokens_per_sec": 500, "device_peak_bytes": 2 ** 20, "host_peak_bytes": 0,
                                     "disk_peak_bytes": 0}, **figures(s))) + "\n")
            if s % every == 0:
                f.write(json.dumps(dict({"step": s, "eval_loss": 0.6, "eval_pairs": 8}, **eval_figures)) + "\n")
    return d

def plot(out_dir, *extra):
    p = subprocess.run([sys.executable, PLOT, out_dir, *extra], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def pngs_ok(d, tag, names=NAMES):
    import matplotlib.image as mpimg
    import numpy as np
    for n in names:
        p = os.path.join(d, n + ".png")
        ok = os.path.exists(p) and os.path.getsize(p) > 2000 and open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
        detail = "missing or not a PNG"
        if ok:
            img = mpimg.imread(p)
            # not blank: many distinct pixel values (axes, labels and a drawn line)
            distinct = len(np.unique(img.reshape(-1, img.shape[-1]), axis=0))
            ok = distinct > 20
            detail = "%d distinct colours" % distinct
        check("%s: %s.png drawn" % (tag, n), ok, detail)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "train_llama"))
    args = ap.parse_args()
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("SKIP test_plot: matplotlib is not installed (apt-get install python3-matplotlib)")
        return
    root = tempfile.mkdtemp(prefix="test_plot.")
    try:
        # a real run: steps and val_loss evaluations
        data = os.path.join(root, "train.bin")
        write_shard(data, [(i * 7) % 100 for i in range(3000)])
        out = os.path.join(root, "run")
        cfg = os.path.join(root, "cfg.yaml")
        with open(cfg, "w") as f:
            f.write(tiny_model_yaml() + "train_data: %s\nval_data: %s\nsequence_len: 8\nmicro_batch_size: 2\n"
                    "max_steps: 12\neval_steps: 4\neval_batches: 1\nnum_threads: 1\noutput_dir: %s\n"
                    % (data, data, out))
        rc, _, err = run_trainer(os.path.abspath(args.bin), cfg)
        check("real run trains", rc == 0, err[-300:])
        rc, o, err = plot(out)
        check("real run: plot.py exits 0 and names its files", rc == 0 and "plotted 12 steps and 3 evaluations" in o,
              o + err)
        pngs_ok(os.path.join(out, "plots"), "real run")

        # a prepared-data run's metrics, written by hand
        syn = os.path.join(root, "syn")
        os.makedirs(syn)
        with open(os.path.join(syn, "metrics.jsonl"), "w") as f:
            for s in range(1, 21):
                f.write(json.dumps({"step": s, "epoch": s / 10, "loss": None if s == 7 else 5 - s * 0.1,
                                    "lr": 1e-3 * min(1, s / 5), "grad_norm": 1.0, "ms": 10,
                                    "tokens_per_sec": 1000 + 10 * s, "device_peak_bytes": 2 ** 22 + s,
                                    "host_peak_bytes": 2 ** 21, "disk_peak_bytes": 0}) + "\n")
                if s % 5 == 0:
                    f.write(json.dumps({"step": s, "eval_loss": 4.5 - s * 0.05, "eval_tokens": 100,
                                        "eval_loss_hf": 4.6 - s * 0.05}) + "\n")
            f.write('{"step": 21, "loss": 2.')  # torn by a kill
        rc, o, err = plot(syn, "--out", os.path.join(root, "synplots"))
        check("prepared-style metrics: plot.py exits 0 (null loss, torn last line)",
              rc == 0 and "plotted 20 steps and 4 evaluations" in o, o + err)
        pngs_ok(os.path.join(root, "synplots"), "prepared-style")
        check("prepared-style metrics: no rewards.png without preference figures",
              not os.path.exists(os.path.join(root, "synplots", "rewards.png")))

        # a preference run's metrics (rl: dpo): rewards.png beside the others
        pref = write_pref_metrics(root, "pref", 10, lambda s: {
            "rewards/chosen": 0.01 * s, "rewards/rejected": -0.01 * s, "rewards/accuracies": min(1, 0.1 * s),
            "rewards/margins": 0.02 * s}, {"eval_rewards/accuracies": 0.5, "eval_rewards/margins": 0.05})
        rc, o, err = plot(pref)
        check("preference metrics: plot.py exits 0 and writes rewards.png",
              rc == 0 and "rewards.png" in o and "plotted 10 steps and 2 evaluations" in o, o + err)
        pngs_ok(os.path.join(pref, "plots"), "preference", NAMES + ["rewards"])

        # a reward model's metrics (reward_model: TRL's RewardTrainer names accuracy and margin)
        rm = write_pref_metrics(root, "reward", 6, lambda s: {"accuracy": min(1, 0.2 * s), "margin": 0.03 * s,
                                                               "mean_reward": 0.1},
                                {"eval_accuracy": 0.5, "eval_margin": 0.05}, every=6)
        rc, o, err = plot(rm)
        check("reward model metrics: plot.py exits 0 and writes rewards.png",
              rc == 0 and "rewards.png" in o and "plotted 6 steps and 1 evaluations" in o, o + err)
        pngs_ok(os.path.join(rm, "plots"), "reward model", NAMES + ["rewards"])

        rc, o, err = plot(os.path.join(root, "nothing"))
        lines = err.strip().splitlines()
        check("no metrics.jsonl: one error line", rc == 1 and len(lines) == 1 and "metrics.jsonl" in lines[0], err)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    finish()


if __name__ == "__main__":
    main()
