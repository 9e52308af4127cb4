#!/usr/bin/env python3
"""The report of scripts/conn-sweep: memcached under gpusock's shim against
kernel TCP at many connection counts, from two kinds of client.

  conn_sweep_report.py --raw RAW_DIR --out DIR --tag TAG

Reads RAW_DIR/meta.json (the sweep's settings) and RAW_DIR/cells.jsonl (one
line per cell, with the paths of its logs), parses each cell's output
(bench_memcached's Google Benchmark JSON; memaslap's final lines), and writes
  DIR/conn-sweep-TAG.json  machine, settings, every cell, medians per client x
                           transport x connections, ratios to kernel TCP
  DIR/conn-sweep-TAG.png   ops/s and the ratio to kernel TCP against the
                           connection count, one column per client kind
                           (skipped with a message without python3-matplotlib)
and prints a markdown table. Ratios are medians over the repetitions of each
repetition's gpusock cell against the kernel TCP cell measured next to it.
memaslap prints latency only as a log2 histogram: its p50/p99 are estimated
inside a bucket (marked ~), its mean is exact. Exit status 1 when the raw
folder cannot be read; failed cells are reported, not fatal.
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys

KERNEL = "kernel"


def short(transport):
    return transport.split(":", 1)[-1] if transport != KERNEL else "kernel"


# Google Benchmark's preamble: no reason for anything.
PREAMBLE = re.compile(r"^(\d{4}-\d\d-\d\dT|Running |Run on |CPU Caches|L\d (Data|Instruction|Unified)|"
                      r"Load Average|\*\*\*WARNING|-+$|Benchmark +Time)")


def tail(path, lines=3):
    try:
        with open(path, errors="replace") as f:
            text = [ln.strip() for ln in f.read().splitlines() if ln.strip() and not PREAMBLE.match(ln.strip())]
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:])[-400:] or "(no output)"


def parse_threads(cell, raw):
    """bench_memcached's counters, or the reason there are none."""
    path = os.path.join(raw, cell["json"])
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None, f"exit {cell.get('rc')}, no JSON: {tail(os.path.join(raw, cell['log']))}"
    for b in data.get("benchmarks", []):
        if not b.get("name", "").startswith("BM_Memcached/"):
            continue
        if b.get("error_occurred") or b.get("skipped"):
            msg = b.get("error_message") or b.get("skip_message") or "skipped"
            return None, " ".join(msg.split())[:400]
        m = {k: b[k] for k in ("ops_per_s", "p50_us", "p90_us", "p99_us", "p999_us", "max_us",
                               "server_cpu_us_per_op", "client_cpu_us_per_op",
                               "server_window_cpu_us_per_op", "client_window_cpu_us_per_op") if k in b}
        m["p99_exact"] = True
        return m, None
    return None, f"exit {cell.get('rc')}, no BM_Memcached row: {tail(os.path.join(raw, cell['log']))}"


def log2_percentile(hist, p, lo_clamp, hi_clamp):
    """The p-quantile of memaslap's log2 histogram (bucket b: [2^(b-1), 2^b) us),
    interpolated geometrically inside its bucket."""
    total = sum(hist.values())
    if total == 0:
        return None
    want = p * total
    seen = 0
    for b in sorted(hist):
        c = hist[b]
        if c and seen + c >= want:
            lo, hi = (2.0 ** (b - 1), 2.0 ** b) if b > 0 else (0.5, 1.0)
            lo, hi = max(lo, lo_clamp), min(hi, hi_clamp)
            if hi <= lo:
                return lo
            return lo * (hi / lo) ** ((want - seen) / c)
        seen += c
    return hi_clamp


def parse_memaslap(cell, raw, clk_tck):
    if not cell.get("server_alive", True):
        return None, cell.get("server_why") or "memcached died"
    log = os.path.join(raw, cell["log"])
    try:
        with open(log, errors="replace") as f:
            text = f.read()
    except OSError:
        return None, "no memaslap log"
    runs = re.findall(r"Run time: ([\d.]+)s Ops: (\d+) TPS: (\d+)", text)
    if cell.get("rc", 0) != 0 and not runs:
        return None, f"memaslap exit {cell.get('rc')}: {tail(log)}"
    if not runs:
        return None, f"no result line: {tail(log)}"
    secs, ops, tps = float(runs[-1][0]), int(runs[-1][1]), int(runs[-1][2])
    if ops <= 0 or tps <= 0:
        return None, f"zero ops: {tail(log)}"
    m = {"ops_per_s": float(tps), "ops": ops, "run_s": secs, "p99_exact": False}
    if cell.get("rc", 0) != 0:
        m["note"] = f"memaslap exit {cell.get('rc')} after its result line"
    # The last "Total Statistics (N events)" block: the whole run.
    blocks = text.split("Total Statistics (")
    if len(blocks) > 1:
        block = blocks[-1]
        stat = {k: float(v) for k, v in re.findall(r"^\s*(Min|Max|Avg|Geo|Std):\s+([\d.]+)", block, re.M)}
        hist = {}
        dist = block.split("Log2 Dist:", 1)
        if len(dist) > 1:
            for line in dist[1].splitlines()[1:]:
                mm = re.match(r"^\s*(\d+):((?:\s+\d+)+)\s*$", line)
                if not mm:
                    break
                for i, c in enumerate(mm.group(2).split()):
                    hist[int(mm.group(1)) + i] = int(c)
        if "Avg" in stat:
            m["avg_us"] = stat["Avg"]
        if hist and "Min" in stat and "Max" in stat:
            m["p50_us"] = log2_percentile(hist, 0.50, stat["Min"], stat["Max"])
            m["p99_us"] = log2_percentile(hist, 0.99, stat["Min"], stat["Max"])
            m["max_us"] = stat["Max"]
    times = os.path.join(raw, cell.get("times", ""))
    try:
        with open(times) as f:
            lines = f.read().split("\n")
        # bash's `times`: the shell's own line, then its children's.
        u, s = (float(a) * 60 + float(b) for a, b in re.findall(r"(\d+)m([\d.]+)s", lines[1]))
        m["client_cpu_us_per_op"] = (u + s) * 1e6 / ops
    except (OSError, IndexError, ValueError):
        pass
    t0, t1 = cell.get("server_cpu_ticks_before"), cell.get("server_cpu_ticks")
    if t0 is not None and t1 is not None:
        m["server_cpu_us_per_op"] = (t1 - t0) / clk_tck * 1e6 / ops
    return m, None


def server_end(cell, limit):
    """bench_memcached's memcached ended on its own, as the sweep's watcher saw it."""
    try:
        status, secs = cell.get("server_end", "").split()
        status, secs = int(status), float(secs)
    except ValueError:
        return ""
    if isinstance(limit, (int, float)) and secs >= limit - 1:
        return ""
    how = f"killed by signal {status & 0x7f}" if status & 0x7f else f"exit status {status >> 8}"
    return f"memcached ended {secs:.1f} s into the cell ({how}); "


def machine_info():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "cpu_model": model,
        "mem_gib": mem_gib,
        "kernel": platform.release(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(cells, meta):
    by = {}
    for c in cells:
        by.setdefault((c["client"], c["transport"], c["conns"]), []).append(c)
    rows = []
    for client in meta["clients"]:
        for n in meta["conns"]:
            kernel = {c["rep"]: c for c in by.get((client, KERNEL, n), []) if c["ok"]}
            for t in meta["transports"]:
                group = by.get((client, t, n), [])
                ok = [c for c in group if c["ok"]]
                not_run = [c for c in group if not c["ok"] and c["why"].startswith("not run")]
                row = {"client": client, "transport": t, "conns": n, "ok": len(ok),
                       "failed": len(group) - len(ok) - len(not_run), "not_run": len(not_run),
                       "failures": [f"rep {c['rep']}: {c['why']}" for c in group if not c["ok"]]}
                for k in ("ops_per_s", "p50_us", "p99_us", "avg_us", "server_cpu_us_per_op",
                          "client_cpu_us_per_op", "server_window_cpu_us_per_op", "client_window_cpu_us_per_op",
                          "fds_per_conn"):
                    row[k] = median([c.get(k) for c in ok])
                row["p99_exact"] = all(c.get("p99_exact") for c in ok) if ok else None
                if t != KERNEL:
                    for k, name in (("ops_per_s", "ops_ratio"), ("p99_us", "p99_ratio"), ("avg_us", "avg_ratio"),
                                    ("server_cpu_us_per_op", "server_cpu_ratio"),
                                    ("client_cpu_us_per_op", "client_cpu_ratio")):
                        pairs = [c[k] / kernel[c["rep"]][k] for c in ok
                                 if c["rep"] in kernel and c.get(k) and kernel[c["rep"]].get(k)]
                        row[name] = median(pairs)
                rows.append(row)
    return rows


def fmt_ops(v):
    if v is None:
        return "—"
    return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.1f} k"


def fmt_ratio(v, approx=False):
    return "—" if v is None else f"{'~' if approx else ''}{v:.2f}×"


def table(rows, meta):
    others = [t for t in meta["transports"] if t != KERNEL]
    have_kernel = KERNEL in meta["transports"]
    head = ["client", "conns"]
    head += ["kernel ops/s"] if have_kernel else []
    head += [f"{short(t)} ops/s" if not have_kernel else f"{short(t)} ×" for t in others]
    head += [f"{short(t)} p99 ×" for t in others] if have_kernel else []
    head += ["fds/conn " + "/".join(short(t) for t in meta["transports"])]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    index = {(r["client"], r["transport"], r["conns"]): r for r in rows}

    def cell(r, value):
        if r is None:
            return "—"
        if r["ok"] == 0:
            return "fail" if r["failed"] else "not run"
        return value + (f" ({r['failed']} failed)" if r["failed"] else "")

    for client in meta["clients"]:
        for n in meta["conns"]:
            get = lambda t: index.get((client, t, n))  # noqa: E731
            line = [client, str(n)]
            if have_kernel:
                k = get(KERNEL)
                line.append(cell(k, fmt_ops(k and k["ops_per_s"])))
                line += [cell(get(t), fmt_ratio(get(t) and get(t).get("ops_ratio"))) for t in others]
                line += [cell(get(t), fmt_ratio(get(t) and get(t).get("p99_ratio"),
                                                approx=not (get(t) or {}).get("p99_exact", True)))
                         for t in others]
            else:
                line += [cell(get(t), fmt_ops(get(t) and get(t)["ops_per_s"])) for t in others]
            fds = []
            for t in meta["transports"]:
                r = get(t)
                fds.append("—" if not r or r["fds_per_conn"] is None else f"{r['fds_per_conn']:.1f}")
            line.append("/".join(fds))
            out.append("| " + " | ".join(line) + " |")
    return "\n".join(out)


def chart(path, rows, cells, meta, machine):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("conn_sweep_report: no chart: python3-matplotlib is not installed", file=sys.stderr)
        return False
    kinds = meta["clients"]
    fig, axes = plt.subplots(2, len(kinds), figsize=(6.5 * len(kinds), 8), squeeze=False, sharex=True)
    colors = {KERNEL: "tab:gray", "fabric:shm": "tab:blue", "fabric:tcp": "tab:orange", "verbs": "tab:green"}
    for col, client in enumerate(kinds):
        top, bottom = axes[0][col], axes[1][col]
        for t in meta["transports"]:
            color = colors.get(t)
            pts = [(r["conns"], r["ops_per_s"]) for r in rows
                   if r["client"] == client and r["transport"] == t and r["ops_per_s"]]
            if pts:
                top.plot(*zip(*pts), marker="o", color=color, label=short(t) if t != KERNEL else "kernel TCP")
            reps = [(c["conns"], c["ops_per_s"]) for c in cells
                    if c["client"] == client and c["transport"] == t and c["ok"]]
            if reps:
                top.scatter(*zip(*reps), s=10, color=color, alpha=0.35)
            fails = [r["conns"] for r in rows if r["client"] == client and r["transport"] == t and r["ok"] == 0]
            if fails:
                top.scatter(fails, [0] * len(fails), marker="x", color=color)
            if t != KERNEL:
                ratio = [(r["conns"], r["ops_ratio"]) for r in rows
                         if r["client"] == client and r["transport"] == t and r.get("ops_ratio")]
                if ratio:
                    bottom.plot(*zip(*ratio), marker="o", color=color, label=f"{short(t)} / kernel TCP")
        for y in (1, 2):
            bottom.axhline(y, linestyle="--", color="black", linewidth=0.8)
            bottom.text(0.995, y, f"{y}×", transform=bottom.get_yaxis_transform(), ha="right", va="bottom",
                        fontsize=8)
        title = ("thread per connection (bench_memcached)" if client == "threads"
                 else f"multiplexing (memaslap, {meta['memaslap_threads']} threads at most)")
        top.set_title(title)
        top.set_ylabel("ops/s (median; dots: repetitions, x: failed)")
        top.set_ylim(bottom=0)
        bottom.set_ylabel("ops/s ratio to kernel TCP (median of pairs)")
        top_ratio = max([r.get("ops_ratio") or 0 for r in rows if r["client"] == client] + [2.0])
        bottom.set_ylim(0, top_ratio * 1.12)
        top.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _: f"{v / 1e6:g} M" if v >= 1e6 else f"{v / 1e3:g} k"))
        bottom.set_xlabel("connections")
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.set_xticks(meta["conns"])
            ax.set_xticklabels([str(n) for n in meta["conns"]])
            ax.minorticks_off()
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    fig.suptitle(f"memcached -t {meta['server_threads']} under gpusock's shim vs kernel TCP — "
                 f"{machine['nproc']} CPUs, {machine['cpu_model']}; {meta['reps']} rep(s) of "
                 f"{meta['seconds']} s ({meta['tag']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", required=True)
    args = ap.parse_args()
    try:
        with open(os.path.join(args.raw, "meta.json")) as f:
            meta = json.load(f)
        with open(os.path.join(args.raw, "cells.jsonl")) as f:
            raw_cells = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        print(f"conn_sweep_report: cannot read {args.raw}: {e}", file=sys.stderr)
        return 1
    clk_tck = meta.get("clk_tck") or 100
    cells = []
    for c in raw_cells:
        c = dict(c)
        if "ok" in c and not c["ok"]:
            cells.append(c)
            continue
        limit = c.get("timeout_s", meta["timeout_s"])
        if c.get("timed_out") and isinstance(limit, (int, float)) and c.get("wall_s", limit) < limit - 1:
            m, why = None, (f"killed (exit {c.get('rc')}) after {c.get('wall_s')} s, before its {limit} s: "
                            f"{tail(os.path.join(args.raw, c.get('log', '')))}")
        elif c.get("timed_out"):
            m, why = None, f"timed out after {limit} s: {tail(os.path.join(args.raw, c.get('log', '')))}"
        elif c["client"] == "threads":
            m, why = parse_threads(c, args.raw)
        else:
            m, why = parse_memaslap(c, args.raw, clk_tck)
        c["ok"] = m is not None
        if m is None:
            c["why"] = server_end(c, limit) + why
        else:
            c.update(m)
            if c.get("fds_max"):
                c["fds_per_conn"] = (c["fds_max"] - c.get("fds_idle", 0)) / c["conns"]
        cells.append(c)
    # The sweep's machine, as the sweep saw it (this may be another one).
    machine = {**machine_info(), **meta.get("machine", {})}
    rows = summarize(cells, meta)
    text = table(rows, meta)
    result = {"tag": args.tag, "machine": machine, "settings": meta, "summary": rows, "cells": cells,
              "table_markdown": text,
              "notes": ["ratios: median over repetitions of gpusock / kernel TCP, cells measured side by side",
                        "memaslap p50/p99: estimated inside log2 buckets (p99_exact false); avg_us is exact",
                        "fds_per_conn: (server fds at full load - fds of an idle server) / connections",
                        "threads cpu: bench_memcached's whole-process CPU per op, and *_window_cpu_us_per_op "
                        "over the measured window alone; memaslap cpu: server during the client's run, client "
                        "over its life"]}
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, f"conn-sweep-{args.tag}.json")
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)
    png_path = os.path.join(args.out, f"conn-sweep-{args.tag}.png")
    drew = chart(png_path, rows, cells, meta, machine)
    print()
    print(f"memcached under gpusock's shim vs kernel TCP: {machine['nproc']} CPUs ({machine['cpu_model']}), "
          f"memcached -t {meta['server_threads']}, {meta['reps']} rep(s) of {meta['seconds']} s, "
          f"ulimit -n {meta['ulimit_n']}; ratios > 1× are more ops/s, p99 ratios < 1× lower latency "
          f"(~: memaslap's log2 histogram)")
    print()
    print(text)
    failed = [c for c in cells if not c["ok"] and not c["why"].startswith("not run")]
    not_run = len([c for c in cells if not c["ok"]]) - len(failed)
    if failed:
        print()
        print(f"{len(failed)} failed cell(s):")
        for c in failed:
            print(f"  {c['client']} {c['transport']} {c['conns']} conns rep {c['rep']}: {c['why']}")
    if not_run:
        print(f"{not_run} cell(s) not run: the sweep's --budget was spent")
    print()
    print(f"conn_sweep_report: {json_path}" + (f", {png_path}" if drew else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
