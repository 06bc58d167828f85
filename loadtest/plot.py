"""Plots specd-loadtest sweeps: latency vs offered QPS, one line per JSON file.

    python3 loadtest/plot.py out.png spec.json nospec.json
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(out, files):
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for f in files:
        d = json.load(open(f))
        pts = [p for p in d["points"] if p["offered_qps"] > 0]
        qps = [p["offered_qps"] for p in pts]
        label = f"{d['config']['spec']} (k={d['config']['k']})"
        for ax, key in zip(axes, ("ttft_ms", "itl_ms", "e2e_ms")):
            ax.plot(qps, [p[key]["p50"] for p in pts], marker="o", label=label + " p50")
            ax.plot(qps, [p[key]["p90"] for p in pts], linestyle="--", label=label + " p90")
            ax.set_xlabel("offered QPS")
            ax.set_ylabel(key)
            ax.grid(True)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
