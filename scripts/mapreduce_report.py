#!/usr/bin/env python3
"""Table, summary.json and figure for scripts/mapreduce.

Reads runs.jsonl (one line per worker per run, from mapreduce --json) and
link.jsonl (gpu_link --json) in --out. A run's time is its slowest worker's
(each worker times from the start barrier to the end barrier); a point
(job, workers) takes its fastest run. Speed-up is the 1-worker time over the
N-worker time on the same total input; efficiency is speed-up / N (GPUnet on 4
GPUs: 0.875 K-means, 0.725 word count; target 0.9). Link: GPU-to-GPU stream
bandwidth and round trip next to CPU-to-CPU on the same transport (target:
GPU streaming >= 0.9 x CPU). Targets are reported, never asserted; exit
status 1 when a run's check failed or no run is there.
"""
import argparse
import json
import os
import sys
from collections import defaultdict

TARGET_EFFICIENCY = 0.9
TARGET_STREAM = 0.9
GPUNET_EFFICIENCY = {"kmeans": 0.875, "wordcount": 0.725}


def read_lines(path):
    rows = []
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    return rows


def runs_of(rows):
    """One entry per run (label): the slowest worker's times, all checks."""
    by_label = defaultdict(list)
    for r in rows:
        by_label[r["label"]].append(r)
    runs = []
    for label, workers in by_label.items():
        ok = all(w["status"] == "ok" and w["check"].startswith("ok") for w in workers)
        ok = ok and len(workers) == workers[0]["ranks"]
        slow = max(workers, key=lambda w: w["total_s"])
        runs.append({"label": label, "job": slow["job"], "workers": slow["ranks"], "mode": slow["mode"],
                     "backend": slow["backend"], "ok": ok, "total_s": slow["total_s"],
                     "map_s": max(w["map_s"] for w in workers), "shuffle_s": max(w["shuffle_s"] for w in workers),
                     "reduce_s": max(w["reduce_s"] for w in workers),
                     "input_bytes": sum(w["input_bytes"] for w in workers),
                     "sent_bytes": sum(w["sent_bytes"] for w in workers),
                     "checks": sorted({w["check"] for w in workers})})
    return runs


def points_of(runs):
    best = {}
    for r in runs:
        if not r["ok"]:
            continue
        key = (r["job"], r["workers"])
        if key not in best or r["total_s"] < best[key]["total_s"]:
            best[key] = r
    for (job, n), r in best.items():
        one = best.get((job, 1))
        r["speedup"] = one["total_s"] / r["total_s"] if one and r["total_s"] > 0 else None
        r["efficiency"] = r["speedup"] / n if r["speedup"] else None
    return best


def link_table(rows):
    """Labels are SIDE-SCOPE-KIND (gpu-processes-stream, cpu-processes-x4-stream,
    gpu-inprocess-rtt, copy-peer-stream): per scope, GPU against CPU (the CPU
    processes' figure where the CPU has none of that scope) and against the
    CUDA runtime's peer copy between the two GPUs, where it ran."""
    by = {}
    for r in rows:
        side, *scope, kind = r["label"].split("-")
        by[(side, "-".join(scope), kind)] = r
    copy, copy_rtt = by.get(("copy", "peer", "stream")), by.get(("copy", "peer", "rtt"))
    out = {}
    for scope in sorted({k[1] for k in by if k[0] == "gpu"}, key=lambda s: (s != "processes", s)):
        cpu_scope = scope if ("cpu", scope, "stream") in by else scope.replace("inprocess", "processes")
        g, gr = by.get(("gpu", scope, "stream")), by.get(("gpu", scope, "rtt"))
        c, cr = by.get(("cpu", cpu_scope, "stream")), by.get(("cpu", cpu_scope, "rtt"))
        out[scope] = {
            "gpu_MBps": g["MBps"] if g else None, "cpu_MBps": c["MBps"] if c else None,
            "stream_ratio": g["MBps"] / c["MBps"] if g and c and c["MBps"] else None,
            "gpu_rtt_us": gr["rtt_us"] if gr else None, "cpu_rtt_us": cr["rtt_us"] if cr else None,
            "copy_MBps": copy["MBps"] if copy else None, "copy_rtt_us": copy_rtt["rtt_us"] if copy_rtt else None,
            "copy_ratio": g["MBps"] / copy["MBps"] if g and copy and copy["MBps"] else None,
            "ok": all(x is None or (x["error"] == "" and x["bad"] == 0) for x in (g, c, gr, cr, copy, copy_rtt)),
        }
    return out


def figure(best, links, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no figure; Debian's python3-matplotlib draws it)")
        return False
    jobs = sorted({j for j, _ in best})
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.6))
    width = 0.8 / max(1, len(jobs))
    counts = sorted({n for _, n in best})
    for i, job in enumerate(jobs):
        xs = [j + i * width for j, _ in enumerate(counts)]
        ax[0].bar(xs, [best[(job, n)]["total_s"] if (job, n) in best else 0 for n in counts], width, label=job)
    ax[0].set_xticks([j + width * (len(jobs) - 1) / 2 for j in range(len(counts))])
    ax[0].set_xticklabels([str(n) for n in counts])
    ax[0].set_xlabel("GPUs (workers)")
    ax[0].set_ylabel("job time (s)")
    ax[0].set_title("(a) time, same total input")
    ax[0].legend(fontsize=8)
    for job in jobs:
        pts = sorted((n, best[(job, n)]["speedup"]) for n in counts if (job, n) in best and best[(job, n)]["speedup"])
        ax[1].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=job)
    if counts:
        ax[1].plot(counts, counts, ls=":", color="gray", label="ideal")
        ax[1].plot(counts, [TARGET_EFFICIENCY * n for n in counts], ls="--", color="red", label="target 0.9 x GPUs")
    ax[1].set_xlabel("GPUs (workers)")
    ax[1].set_ylabel("speed-up over 1 GPU")
    ax[1].set_title("(b) speed-up")
    ax[1].legend(fontsize=8)
    labels, gpu_bw, cpu_bw = [], [], []
    for scope, row in links.items():
        labels.append(scope)
        gpu_bw.append(row["gpu_MBps"] or 0)
        cpu_bw.append(row["cpu_MBps"] or 0)
    xs = list(range(len(labels)))
    ax[2].bar([x - 0.2 for x in xs], gpu_bw, 0.4, label="GPU to GPU")
    ax[2].bar([x + 0.2 for x in xs], cpu_bw, 0.4, label="CPU to CPU")
    for x, scope in zip(xs, labels):
        row = links[scope]
        if row["gpu_rtt_us"] is not None:
            ax[2].annotate(f"rtt {row['gpu_rtt_us']:.1f} us", (x - 0.2, row["gpu_MBps"] or 0), fontsize=7,
                           ha="center", va="bottom")
        if row["cpu_rtt_us"] is not None:
            ax[2].annotate(f"rtt {row['cpu_rtt_us']:.1f} us", (x + 0.2, row["cpu_MBps"] or 0), fontsize=7,
                           ha="center", va="bottom")
    ax[2].set_xticks(xs)
    ax[2].set_xticklabels(labels)
    ax[2].set_ylabel("stream (MB/s)")
    ax[2].set_title("(c) link: stream and 64 B round trip")
    ax[2].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def fmt(v, spec):
    return format(v, spec) if v is not None else "-"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--transport", default="")
    ap.add_argument("--mode", default="")
    ap.add_argument("--gpus", default="")
    a = ap.parse_args()

    runs = runs_of(read_lines(os.path.join(a.out, "runs.jsonl")))
    links = link_table(read_lines(os.path.join(a.out, "link.jsonl")))
    if not runs and not links:
        print("mapreduce: no runs to report", file=sys.stderr)
        return 1
    best = points_of(runs)
    print(f"\n== MapReduce, {a.transport}, workers as {a.mode}, {a.gpus} GPU(s); the fastest run per point")
    print(f"{'job':<10} {'GPUs':>4} {'time s':>9} {'map s':>8} {'shuffle s':>9} {'reduce s':>8} {'sent MB':>8} "
          f"{'speed-up':>8} {'eff.':>5}  check")
    for (job, n), r in sorted(best.items()):
        print(f"{job:<10} {n:>4} {r['total_s']:>9.4f} {r['map_s']:>8.4f} {r['shuffle_s']:>9.4f} {r['reduce_s']:>8.4f} "
              f"{r['sent_bytes'] / 1e6:>8.2f} {fmt(r['speedup'], '8.2f'):>8} {fmt(r['efficiency'], '5.2f'):>5}  "
              f"{'; '.join(r['checks'])[:60]}")
    failed = [r for r in runs if not r["ok"]]
    for r in failed:
        print(f"FAILED run {r['label']}: {'; '.join(r['checks'])}")
    for (job, n), r in sorted(best.items()):
        if n > 1 and r["efficiency"] is not None:
            met = "met" if r["efficiency"] >= TARGET_EFFICIENCY else "not met"
            print(f"target {job} on {n}: speed-up {r['speedup']:.2f} >= {TARGET_EFFICIENCY * n:.2f}: {met} "
                  f"(GPUnet on 4 GPUs: {GPUNET_EFFICIENCY.get(job, 0) * 4:.2f})")
    if links:
        print(f"\n== link, {a.transport}: GPU to GPU against CPU to CPU, and the CUDA runtime's peer copy")
        print(f"{'where':<14} {'GPU MB/s':>9} {'CPU MB/s':>9} {'ratio':>6} {'GPU rtt us':>10} {'CPU rtt us':>10} "
              f"{'copy MB/s':>10} {'of copy':>7} {'copy rtt us':>11}")
        for scope, row in links.items():
            print(f"{scope:<14} {fmt(row['gpu_MBps'], '9.1f'):>9} {fmt(row['cpu_MBps'], '9.1f'):>9} "
                  f"{fmt(row['stream_ratio'], '6.2f'):>6} {fmt(row['gpu_rtt_us'], '10.2f'):>10} "
                  f"{fmt(row['cpu_rtt_us'], '10.2f'):>10} {fmt(row['copy_MBps'], '10.1f'):>10} "
                  f"{fmt(row['copy_ratio'], '7.4f'):>7} {fmt(row['copy_rtt_us'], '11.2f'):>11}"
                  f"{'' if row['ok'] else '  (a check failed)'}")
            if row["stream_ratio"] is not None:
                met = "met" if row["stream_ratio"] >= TARGET_STREAM else "not met"
                print(f"target GPU stream >= {TARGET_STREAM} x CPU ({scope}): {met}")
    summary = {"transport": a.transport, "mode": a.mode, "gpus": a.gpus,
               "points": [dict(r, key=f"{j}-{n}") for (j, n), r in sorted(best.items())],
               "failed_runs": [r["label"] for r in failed], "link": links}
    with open(os.path.join(a.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    if figure(best, links, os.path.join(a.out, "mapreduce.png"),
              f"in-GPU-memory MapReduce over gpusock ({a.transport}, {a.gpus} GPU(s), workers as {a.mode})"):
        print(f"figure: {os.path.join(a.out, 'mapreduce.png')}")
    bad_links = [s for s, row in links.items() if not row["ok"]]
    return 1 if failed or bad_links or not best else 0


if __name__ == "__main__":
    sys.exit(main())
