#!/usr/bin/python3
"""Plots dev/bench_long_context.sh's results: device, host and disk peak and ms/step against
sequence length, one line per memory mode.
    /usr/bin/python3 dev/plot_long_context.py dev/results/long_context.json dev/results/long_context.png
"""
import json
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    meta = json.load(open(sys.argv[1]))
    rows = meta["rows"]
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    panels = [("device_peak_bytes", "device peak (MiB)"), ("host_peak_bytes", "host peak (MiB)"),
              ("disk_peak_bytes", "disk peak (MiB)"), ("ms", "ms per step")]
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    for ax, (key, label) in zip(axes, panels):
        for m in modes:
            pts = sorted((r["T"], r[key] / (1048576 if key != "ms" else 1)) for r in rows if r["mode"] == m)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens per sequence")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("%s - %s (%s)" % (meta["model"], meta["cpu"], meta["date"]))
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)
    print("wrote", sys.argv[2])


if __name__ == "__main__":
    main()
