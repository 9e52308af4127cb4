#!/usr/bin/env python3
"""The report of gpu_stream's JSON lines (gpu/bench/gpu_stream.cu): GPU
blocks streaming through a proxy with T threads against as many CPU client
connections, per transport.

  gpu_stream_report.py --out PREFIX FILE.jsonl [FILE.jsonl ...]

Writes PREFIX.json (every cell, grouped by transport) and PREFIX.png (the
ratio to the CPU connections against the block count, a line per proxy
thread count, a panel per transport; skipped with a message without
python3-matplotlib) and prints a markdown table: for each transport and
block count, the CPU rate and each thread count's ratio (its MB/s).
"""
import argparse
import json
import sys


def load(paths):
    cells = []
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    cells.append(json.loads(line))
    return cells


def table(cells):
    lines = []
    for transport in sorted({c["transport"] for c in cells}):
        mine = [c for c in cells if c["transport"] == transport]
        threads = sorted({c["proxy_threads"] for c in mine})
        lines.append(f"\n{transport}\n")
        lines.append("| blocks | CPU connections MB/s | " +
                     " | ".join(f"{t} proxy thread{'s' if t > 1 else ''}" for t in threads) + " |")
        lines.append("|---|---|" + "---|" * len(threads))
        for blocks in sorted({c["blocks"] for c in mine}):
            row = {c["proxy_threads"]: c for c in mine if c["blocks"] == blocks}
            cpu = next(iter(row.values()))["cpu_mbps"]
            cols = [f"{row[t]['ratio']:.2f}× ({row[t]['gpu_mbps'] / 1000:.1f} GB/s)" if t in row else "–"
                    for t in threads]
            lines.append(f"| {blocks} | {cpu:.0f} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def chart(cells, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("gpu_stream_report: no matplotlib, no chart", file=sys.stderr)
        return
    transports = sorted({c["transport"] for c in cells})
    fig, axes = plt.subplots(1, len(transports), figsize=(6 * len(transports), 4.2), squeeze=False)
    for ax, transport in zip(axes[0], transports):
        mine = [c for c in cells if c["transport"] == transport]
        for t in sorted({c["proxy_threads"] for c in mine}):
            pts = sorted((c["blocks"], c["ratio"]) for c in mine if c["proxy_threads"] == t)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{t} proxy thread(s)")
        ax.axhline(0.9, color="grey", linestyle="--", linewidth=0.8, label="target 0.9×")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPU blocks (= CPU connections)")
        ax.set_ylabel("GPU MB/s ÷ CPU connections' MB/s")
        ax.set_title(f"{transport}: streaming to CPU drains")
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    cells = load(a.files)
    if not cells:
        print("gpu_stream_report: no cells", file=sys.stderr)
        return 1
    with open(a.out + ".json", "w") as f:
        json.dump({"cells": cells}, f, indent=1)
    chart(cells, a.out + ".png")
    print(table(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
