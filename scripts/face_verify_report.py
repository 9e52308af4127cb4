#!/usr/bin/env python3
"""Table, summary.json and figure for scripts/face-verify.

Reads the fv_client JSON of every run (run-SERVER-kCORES-SIZE-CONNS.json) in
--out, prints every run (with the client's cores busy), each server's peak
per image size and core budget, the ratios GPUnet reported (GPU-native vs
host-centric: throughput and median latency at their peaks; GPU-native vs
CPU), the comparison at equal server cores, and lines of server code; writes
summary.json and, when matplotlib is there, face-verify.png in the spirit of
GPUnet's figure: throughput per server, the latency distribution at peak
throughput, and throughput by server cores. Targets are reported, never
asserted; exit status 1 only when no run is there.
"""
import argparse
import glob
import json
import os
import re
import sys

SERVERS = ("gpu", "hostcentric", "cpu", "cpu-kernel")
NAMES = {"gpu": "GPU-native", "hostcentric": "host-centric GPU", "cpu": "CPU (gpusock shim)",
         "cpu-kernel": "CPU (kernel TCP)"}
TARGET_THROUGHPUT = 2.0  # GPU-native / host-centric, at least
TARGET_LATENCY = 3.0     # host-centric p50 / GPU-native p50, at least
TARGET_EQUAL_CORES = 2.0  # GPU-native / host-centric at equal server cores (2 and 4), at least
RUN_NAME = re.compile(r"run-(.+)-k(\d+)-(\d+)-(\d+)\.json$")


def code_lines(path):
    """Non-blank lines that are not only comments (C/C++/CUDA)."""
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return sum(1 for line in text.splitlines() if line.strip() and not line.strip().startswith("//"))


def load_runs(out):
    runs = []
    for path in sorted(glob.glob(os.path.join(out, "run-*.json"))):
        with open(path, encoding="utf-8") as f:
            run = json.load(f)
        run["server"] = run["label"]
        m = RUN_NAME.search(os.path.basename(path))
        run["cores"] = int(m.group(2)) if m else 0
        runs.append(run)
    return runs


def peaks(runs, key):
    best = {}
    for r in runs:
        k = key(r)
        if k not in best or r["throughput"] > best[k]["throughput"]:
            best[k] = r
    return best


def figure(runs, best, default_size, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no figure; Debian's python3-matplotlib draws it)")
        return False
    servers = [s for s in SERVERS if any(r["server"] == s for r in runs)]
    sizes = sorted({r["width"] for r in runs})
    budgets = sorted({r["cores"] for r in runs})
    fig, ax = plt.subplots(1, 4, figsize=(21, 4.6))
    for s in servers:
        pts = sorted((r["conns"], r["throughput"] / 1e3) for r in runs
                     if r["server"] == s and r["width"] == default_size and r["cores"] == budgets[-1])
        if pts:
            ax[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=NAMES[s])
    ax[0].set_xscale("log", base=2)
    ax[0].set_xlabel("client connections")
    ax[0].set_ylabel("throughput (k requests/s)")
    ax[0].set_title(f"(a) throughput, {default_size}x{default_size}, {budgets[-1]} server cores")
    ax[0].legend(fontsize=8)
    width = 0.8 / max(1, len(servers))
    for i, s in enumerate(servers):
        xs = [j + i * width for j, _ in enumerate(sizes)]
        ax[1].bar(xs, [best[(s, z)]["throughput"] / 1e3 if (s, z) in best else 0 for z in sizes], width,
                  label=NAMES[s])
    ax[1].set_xticks([j + width * (len(servers) - 1) / 2 for j in range(len(sizes))])
    ax[1].set_xticklabels([f"{z}x{z}" for z in sizes])
    ax[1].set_ylabel("peak throughput (k requests/s)")
    ax[1].set_title("(b) peak throughput per image size")
    for s in servers:
        r = best.get((s, default_size))
        if r and r["cdf_us"]:
            ax[2].plot([p[1] for p in r["cdf_us"]], [p[0] for p in r["cdf_us"]],
                       label=f"{NAMES[s]} ({r['conns']} conns)")
    ax[2].set_xscale("log")
    ax[2].set_xlabel("latency (us)")
    ax[2].set_ylabel("fraction of requests")
    ax[2].set_title(f"(c) latency at peak throughput, {default_size}x{default_size}")
    ax[2].legend(fontsize=8)
    by_cores = peaks([r for r in runs if r["width"] == default_size], lambda r: (r["server"], r["cores"]))
    for s in servers:
        pts = sorted((k, r["throughput"] / 1e3) for (srv, k), r in by_cores.items() if srv == s)
        if pts:
            ax[3].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=NAMES[s])
            ax[3].plot([p[0] for p in pts], [p[1] / p[0] for p in pts], marker="x", linestyle=":",
                       color=ax[3].lines[-1].get_color())
    ax[3].set_xscale("log", base=2)
    ax[3].set_xlabel("server CPU cores (GPU-native: proxy threads)")
    ax[3].set_ylabel("k requests/s: peak (o), per core (x)")
    ax[3].set_title(f"(d) by server cores, {default_size}x{default_size}")
    ax[3].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def equal_cores(runs):
    """GPU-native against host-centric at each core budget and size (peaks over connections)."""
    by = peaks(runs, lambda r: (r["server"], r["width"], r["cores"]))
    rows = []
    for (srv, size, k), g in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        h = by.get(("hostcentric", size, k))
        if srv != "gpu" or not h or not h["throughput"]:
            continue
        rows.append({"size": size, "cores": k, "gpu": g["throughput"], "hostcentric": h["throughput"],
                     "ratio": g["throughput"] / h["throughput"]})
    if rows:
        print(f"\n== at equal server cores (GPU-native / host-centric; target >= {TARGET_EQUAL_CORES:.0f}x at 2 and 4 cores)")
        for row in rows:
            mark = ""
            if row["cores"] in (2, 4):
                mark = " [met]" if row["ratio"] >= TARGET_EQUAL_CORES else " [not met]"
            print(f"{row['size']:>4}x{row['size']:<3} {row['cores']:>2} cores: {row['gpu']:>9.0f} / {row['hostcentric']:>9.0f} "
                  f"req/s = {row['ratio']:.2f}x{mark}")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--default-size", type=int, default=128)
    ap.add_argument("--transport", default="")
    ap.add_argument("--cores", default="")
    ap.add_argument("--loc", action="append", default=[], help="NAME=FILE FILE ...")
    a = ap.parse_args()

    runs = load_runs(a.out)
    if not runs:
        print("face-verify: no runs to report", file=sys.stderr)
        return 1
    best = peaks(runs, lambda r: (r["server"], r["width"]))
    print(f"\n== every run ({a.transport}; client: cores busy of those it had)")
    print(f"{'server':<12} {'cores':>5} {'size':>7} {'conns':>5} {'req/s':>10} {'req/s/core':>10} {'p50 us':>9} "
          f"{'p99 us':>9} {'p99.9 us':>9} {'wrong':>5} {'client':>9}")
    for r in sorted(runs, key=lambda r: (SERVERS.index(r["server"]), r["cores"], r["width"], r["conns"])):
        lat = r["latency_us"]
        per_core = r["throughput"] / r["cores"] if r["cores"] else 0
        client = f"{r.get('client_cores_busy', 0):.1f}/{r.get('client_cores', 0)}"
        print(f"{r['server']:<12} {r['cores']:>5} {r['width']:>4}x{r['height']:<3}{r['conns']:>5} {r['throughput']:>10.0f} "
              f"{per_core:>10.0f} {lat['p50']:>9.1f} {lat['p99']:>9.1f} {lat['p999']:>9.1f} {r['wrong']:>5} {client:>9}")

    print("\n== peak throughput per server and size (latency of that run)")
    ratios = []
    for size in sorted({r["width"] for r in runs}):
        for s in SERVERS:
            r = best.get((s, size))
            if r:
                lat = r["latency_us"]
                print(f"{s:<12} {size:>4}x{size:<3} {r['throughput']:>10.0f} req/s at {r['conns']:>3} conns; "
                      f"p50 {lat['p50']:.1f} p99 {lat['p99']:.1f} p99.9 {lat['p999']:.1f} us")
        g, h, c = best.get(("gpu", size)), best.get(("hostcentric", size)), best.get(("cpu", size))
        row = {"size": size}
        if g and h:
            row["gpu_over_hostcentric_throughput"] = g["throughput"] / h["throughput"] if h["throughput"] else None
            row["hostcentric_over_gpu_p50"] = h["latency_us"]["p50"] / g["latency_us"]["p50"] if g["latency_us"]["p50"] else None
        if g and c:
            row["gpu_over_cpu_throughput"] = g["throughput"] / c["throughput"] if c["throughput"] else None
        ratios.append(row)

    print("\n== GPUnet's comparison (GPUnet: 1.9x throughput at 1/3 the latency; targets >= 2x at <= 1/3)")
    for row in ratios:
        t, l, cpu = (row.get("gpu_over_hostcentric_throughput"), row.get("hostcentric_over_gpu_p50"),
                     row.get("gpu_over_cpu_throughput"))
        line = f"{row['size']:>4}x{row['size']:<3}"
        if t and l:
            met = "met" if t >= TARGET_THROUGHPUT and l >= TARGET_LATENCY else "not met"
            line += f" GPU-native/host-centric throughput {t:.2f}x, median latency 1/{l:.2f} [{met}]"
        else:
            line += " (no GPU-native/host-centric pair)"
        if cpu:
            line += f"; GPU-native/CPU throughput {cpu:.2f}x"
            if row["size"] == a.default_size:
                line += " [met]" if cpu >= 1.0 else " [not met]"
        print(line)

    equal = equal_cores(runs)

    loc = {}
    for spec in a.loc:
        name, files = spec.split("=", 1)
        loc[name] = {os.path.basename(f): code_lines(f) for f in files.split()}
    if loc:
        print("\n== lines of server code (non-blank, non-comment; shared headers counted once, apart)")
        for name, files in loc.items():
            print(f"{name:<12} {sum(files.values()):>5}  ({', '.join(f'{k} {v}' for k, v in files.items())})")
        if "gpu" in loc and "hostcentric" in loc:
            print(f"GPU-native / host-centric code: {sum(loc['gpu'].values()) / sum(loc['hostcentric'].values()):.2f}")

    png = os.path.join(a.out, "face-verify.png")
    drew = figure(runs, best, a.default_size, png,
                  f"Face verification over gpusock ({a.transport}); cores: {a.cores}")
    summary = {"transport": a.transport, "cores": a.cores, "runs": [{k: v for k, v in r.items() if k != "cdf_us"}
                                                                  for r in runs],
               "peaks": {f"{s}/{z}": r["throughput"] for (s, z), r in best.items()}, "ratios": ratios,
               "equal_cores": equal,
               "lines_of_code": loc, "figure": png if drew else None}
    with open(os.path.join(a.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    print(f"\nwrote {os.path.join(a.out, 'summary.json')}" + (f" and {png}" if drew else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
