"""Plots specd-loadtest sweeps: latency vs offered QPS, one line per JSON file.

    python3 loadtest/plot.py out.png spec.json nospec.json
    python3 loadtest/plot.py --table spec.json nospec.json   # markdown table on stdout

loadtest/sweep.sh runs the sweeps and both commands.
"""
import json
import sys

KEYS = (("ttft_ms", "TTFT"), ("itl_ms", "inter-token latency"), ("e2e_ms", "end-to-end latency"))


def load(files):
    out = []
    for f in files:
        with open(f) as fp:
            d = json.load(fp)
        pts = [p for p in d["points"] if p["offered_qps"] > 0]
        out.append((label(d["config"]), d["config"], pts))
    return out


def label(config):
    if config["spec"] == "off":
        return "spec off"
    k = config["k"]
    return f"spec {config['spec']}, k={k if k else 'adaptive'}"


def table(files):
    print("| QPS | speculation | TTFT p50 / p90 (ms) | ITL p50 / p90 (ms) | e2e p50 / p90 (ms) "
          "| ok / requests | tokens/s | acceptance |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for name, _, pts in load(files):
        for p in pts:
            rows.append((p["offered_qps"], name, p))
    rows.sort(key=lambda r: r[0])
    for qps, name, p in rows:
        cells = " | ".join(f"{p[k]['p50']:.0f} / {p[k]['p90']:.0f}" for k, _ in KEYS)
        acc = f"{p['acceptance_rate']:.2f}" if p["draft_tokens"] else "—"
        print(f"| {qps:g} | {name} | {cells} | {p['ok']} / {p['requests']} "
              f"| {p['throughput_tokens_per_s']:.1f} | {acc} |")


def plot(out, files):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = load(files)
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.5))
    for i, (name, _, pts) in enumerate(runs):
        color = f"C{i}"
        qps = [p["offered_qps"] for p in pts]
        for ax, (key, title) in zip(axes, KEYS):
            ax.plot(qps, [p[key]["p50"] for p in pts], marker="o", color=color, label=name + " p50")
            ax.plot(qps, [p[key]["p90"] for p in pts], marker="x", linestyle="--", color=color,
                    label=name + " p90")
            ax.set_title(title)
            ax.set_ylabel("ms (log scale)")
            ax.set_yscale("log")
        axes[3].plot(qps, [p["throughput_tokens_per_s"] for p in pts], marker="o", color=color,
                     label=name)
    axes[3].set_title("generated tokens/s")
    for ax in axes:
        ax.set_xlabel("offered QPS (Poisson arrivals)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    c = runs[0][1] if runs else {}
    prompts = ("built-in chat prompts" if c.get("prompts") == "builtin"
               else f"{c.get('prompt_tokens')}-token random prompts")
    fig.suptitle(f"specd cluster, {prompts}, "
                 f"{c.get('max_new_tokens')} new tokens, temperature {c.get('temperature')}")
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--table":
        table(sys.argv[2:])
    else:
        plot(sys.argv[1], sys.argv[2:])
