#!/usr/bin/env python3
"""Ratio table for scripts/bench: gpusock against fi_pingpong, raw RMA and kernel TCP.

Inputs: bench_wire's Google Benchmark JSON and fi_pingpong result lines
(--fi-pingpong PROVIDER=LINE). Output: a table on stdout and a JSON summary.
Targets are reported, never asserted; the exit status is 1 only when a
measurement is missing (a benchmark failed or was not run).
"""
import argparse
import datetime
import json
import os
import platform
import sys

PROVIDERS = ("tcp", "shm")
RTT_TARGET = 1.10  # ours / fi_pingpong, at most
BW_TARGET = 0.90  # ours / raw RMA write, at least


def parse_fi_pingpong(line):
    """Round trip in microseconds from a fi_pingpong result line.

    Columns: bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec, where a
    ping-pong iteration is two transfers. Both timing columns have two decimals;
    use whichever carries more significant digits.
    """
    fields = line.split()
    usec_per_xfer = float(fields[6])
    mxfers_per_sec = float(fields[7])
    if usec_per_xfer >= 1.0 or mxfers_per_sec <= 0:
        return 2.0 * usec_per_xfer
    return 2.0 / mxfers_per_sec


def load_benchmarks(path):
    """{(metric, system, size): {"rtt_us"|"bytes_per_second": value} or {"error": text}}."""
    with open(path) as f:
        data = json.load(f)
    runs = {}
    for b in data.get("benchmarks", []):
        name = b.get("run_name") or b["name"]
        parts = name.split("/")
        if len(parts) < 3:
            continue
        key = (parts[0], parts[1], int(parts[2]))
        entry = runs.setdefault(key, {"medians": [], "iterations": [], "error": None})
        if b.get("error_occurred"):
            entry["error"] = b.get("error_message", "error")
            continue
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                entry["medians"].append(b)
        else:
            entry["iterations"].append(b)
    results = {}
    for key, entry in runs.items():
        chosen = entry["medians"] or entry["iterations"]
        if not chosen:
            results[key] = {"error": entry["error"] or "no result"}
            continue

        def mean(field):
            values = [b[field] for b in chosen if field in b]
            return sum(values) / len(values) if values else None

        value = {}
        items = mean("items_per_second")
        if key[0] == "rtt" and items:
            value["rtt_us"] = 1e6 / items
        bytes_per_second = mean("bytes_per_second")
        if bytes_per_second:
            value["bytes_per_second"] = bytes_per_second
        results[key] = value if value else {"error": entry["error"] or "no counters"}
    return results, data.get("context", {})


def size_name(size):
    if size >= 1 << 20 and size % (1 << 20) == 0:
        return "%d MiB" % (size >> 20)
    if size >= 1 << 10 and size % (1 << 10) == 0:
        return "%d KiB" % (size >> 10)
    return "%d B" % size


def fmt_us(v):
    return "n/a" if v is None else "%.2f us" % v


def fmt_bw(v):
    return "n/a" if v is None else "%.2f GB/s" % (v / 1e9)


def ratio(a, b):
    return a / b if a is not None and b else None


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bench-json", required=True)
    parser.add_argument("--fi-pingpong", action="append", default=[], metavar="PROVIDER=LINE")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    pingpong = {}
    for item in args.fi_pingpong:
        provider, _, line = item.partition("=")
        try:
            pingpong[provider] = parse_fi_pingpong(line)
        except (IndexError, ValueError):
            print("bench_report: cannot parse fi_pingpong line for %s: %r" % (provider, line), file=sys.stderr)

    try:
        bench, context = load_benchmarks(args.bench_json)
    except (OSError, ValueError) as e:
        print("bench_report: cannot read %s: %s" % (args.bench_json, e), file=sys.stderr)
        bench, context = {}, {}

    missing = []

    def get(metric, system, size, field):
        r = bench.get((metric, system, size))
        if r is None:
            missing.append("%s/%s/%d: not run" % (metric, system, size))
            return None
        if "error" in r:
            missing.append("%s/%s/%d: %s" % (metric, system, size, r["error"]))
            return None
        return r.get(field)

    rows = []
    kernel_rtt = get("rtt", "kernel_tcp", 64, "rtt_us")
    for p in PROVIDERS:
        ours = get("rtt", "gpusock_" + p, 64, "rtt_us")
        ref = pingpong.get(p)
        if ref is None:
            missing.append("fi_pingpong %s" % p)
        raw = get("rtt", "raw_" + p, 64, "rtt_us")
        rows.append({
            "metric": "rtt", "provider": p, "size": 64, "unit": "us",
            "ours": ours, "fi_pingpong": ref, "raw_rma": raw, "kernel_tcp": kernel_rtt,
            "ratio": ratio(ours, ref), "target": "<= %.2f x fi_pingpong" % RTT_TARGET,
            "ours_vs_raw": ratio(ours, raw), "ours_vs_kernel": ratio(ours, kernel_rtt),
        })
    sizes = sorted({k[2] for k in bench if k[0] == "bw"}) or [64 << 10, 256 << 10, 1 << 20]
    kernel_bw = {size: get("bw", "kernel_tcp", size, "bytes_per_second") for size in sizes}
    for p in PROVIDERS:
        for size in sizes:
            ours = get("bw", "gpusock_" + p, size, "bytes_per_second")
            raw = get("bw", "raw_" + p, size, "bytes_per_second")
            kernel = kernel_bw[size]
            rows.append({
                "metric": "bandwidth", "provider": p, "size": size, "unit": "bytes/s",
                "ours": ours, "raw_rma": raw, "kernel_tcp": kernel,
                "ratio": ratio(ours, raw), "target": ">= %.2f x raw RMA write" % BW_TARGET,
                "ours_vs_kernel": ratio(ours, kernel),
            })
    for row in rows:
        r = row["ratio"]
        if r is None:
            row["meets_target"] = None
        elif row["metric"] == "rtt":
            row["meets_target"] = r <= RTT_TARGET
        else:
            row["meets_target"] = r >= BW_TARGET

    def fr(v):
        return "n/a" if v is None else "%.2f" % v

    def verdict(row):
        return {True: "meets", False: "MISSES", None: "-"}[row["meets_target"]]

    print("64 B round trip (lower is better)")
    print("  %-4s %12s %14s %8s %7s  %12s %12s %10s" % (
        "prov", "gpusock", "fi_pingpong", "ratio", "target", "raw RMA", "kernel tcp", "vs kernel"))
    for row in rows:
        if row["metric"] != "rtt":
            continue
        print("  %-4s %12s %14s %8s %7s  %12s %12s %10s  %s" % (
            row["provider"], fmt_us(row["ours"]), fmt_us(row["fi_pingpong"]), fr(row["ratio"]),
            "<=%.2f" % RTT_TARGET, fmt_us(row["raw_rma"]), fmt_us(row["kernel_tcp"]),
            fr(row["ours_vs_kernel"]), verdict(row)))
    print()
    print("Streaming bandwidth, one way (higher is better)")
    print("  %-4s %-8s %12s %12s %8s %7s  %12s %10s" % (
        "prov", "write", "gpusock", "raw RMA", "ratio", "target", "kernel tcp", "vs kernel"))
    for row in rows:
        if row["metric"] != "bandwidth":
            continue
        print("  %-4s %-8s %12s %12s %8s %7s  %12s %10s  %s" % (
            row["provider"], size_name(row["size"]), fmt_bw(row["ours"]), fmt_bw(row["raw_rma"]),
            fr(row["ratio"]), ">=%.2f" % BW_TARGET, fmt_bw(row["kernel_tcp"]), fr(row["ours_vs_kernel"]),
            verdict(row)))

    summary = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": {
            "machine": platform.machine(), "kernel": platform.release(), "cpus": os.cpu_count(),
            "loadavg_after": list(os.getloadavg()),
            "benchmark_context": {k: context.get(k) for k in ("num_cpus", "mhz_per_cpu", "library_build_type")
                                  if k in context},
        },
        "targets": {"rtt_vs_fi_pingpong_max": RTT_TARGET, "bandwidth_vs_raw_rma_min": BW_TARGET},
        "rows": rows,
        "missing": missing,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print()
    print("written to %s" % args.out)
    if missing:
        print("missing measurements:", file=sys.stderr)
        for m in missing:
            print("  " + m, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
