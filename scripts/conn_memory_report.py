#!/usr/bin/env python3
"""The report of scripts/conn-memory: what an open, idle connection costs.

  conn_memory_report.py RAW_DIR OUT_PREFIX

Reads RAW_DIR/TRANSPORT-CONNS-REP.{server,clients} (many_probe's "mem:",
"fds:" and "ok:"/"FAIL:" lines, and the script's "tmpfs:" and "exit:" lines)
and writes OUT_PREFIX.json (every cell and the medians per transport and
count) and OUT_PREFIX.png (KiB per connection against the count; skipped
with a message without matplotlib), and prints a markdown table. Per
connection: the client process's and the server process's growth of
resident private memory (RssAnon) and resident shared memory (RssShmem)
and of descriptors over their baselines, and the machine's tmpfs growth
(both ends' shared memory files), each divided by the count.
"""
import datetime
import json
import os
import platform
import re
import statistics
import sys

FIELDS = ("client_anon", "client_shmem", "server_anon", "server_shmem", "tmpfs", "client_fds", "server_fds")


def parse(prefix, n):
    text = ""
    for side in ("server", "clients"):
        try:
            with open(f"{prefix}.{side}", encoding="utf-8", errors="replace") as f:
                text += f.read()
        except OSError:
            pass
    mem = {m[0]: (int(m[1]), int(m[2])) for m in re.findall(r"^mem: (\S+) (-?\d+) (-?\d+)$", text, re.M)}
    fds = {m[0]: int(m[1]) for m in re.findall(r"^fds: (\S+) (-?\d+)$", text, re.M)}
    tmpfs = re.search(r"^tmpfs: (\d+) (\d+)$", text, re.M)
    exits = re.search(r"^exit: (\d+) (\d+)$", text, re.M)
    fails = re.findall(r"^FAIL: (.*)$", text, re.M)
    cell = {"ok": bool(exits) and exits.group(1) == "0" and exits.group(2) == "0" and not fails,
            "failures": fails[:5]}
    if not cell["ok"] and not fails:
        cell["failures"] = [f"exit {exits.groups() if exits else 'missing'}"]
    for side, key in (("client", "clients"), ("server", "server")):
        base, opened = mem.get(f"{key}-base"), mem.get(f"{key}-open")
        if base and opened:
            cell[f"{side}_anon"] = (opened[0] - base[0]) / n
            cell[f"{side}_shmem"] = (opened[1] - base[1]) / n
        if f"{key}-open" in fds:
            cell[f"{side}_fds"] = fds[f"{key}-open"] / n
    if tmpfs:
        cell["tmpfs"] = (int(tmpfs.group(2)) - int(tmpfs.group(1))) / n
    return cell


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    raw, prefix = sys.argv[1], sys.argv[2]
    cells = []
    for name in sorted(os.listdir(raw)):
        m = re.match(r"^(.+)-(\d+)-(\d+)\.clients$", name)
        if m:
            transport, n, rep = m.group(1), int(m.group(2)), int(m.group(3))
            cell = parse(os.path.join(raw, name[: -len(".clients")]), n)
            cells.append({"transport": transport, "conns": n, "rep": rep, **cell})
    if not cells:
        print(f"conn_memory_report: no cells in {raw}", file=sys.stderr)
        return 1
    medians = {}
    for c in cells:
        row = medians.setdefault(c["transport"], {}).setdefault(str(c["conns"]), {"runs": 0, "ok": 0})
        row["runs"] += 1
        row["ok"] += c["ok"]
    for transport, rows in medians.items():
        for n, row in rows.items():
            ok = [c for c in cells if c["transport"] == transport and str(c["conns"]) == n and c["ok"]]
            for field in FIELDS:
                values = [c[field] for c in ok if field in c]
                if values:
                    row[field] = statistics.median(values)
    report = {
        "what": "memory and descriptors per open, idle connection (scripts/conn-memory); KiB per connection",
        "date": datetime.date.today().isoformat(),
        "machine": {"host": platform.node(), "cpus": os.cpu_count()},
        "cells": cells,
        "medians": medians,
    }
    with open(prefix + ".json", "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    print("| transport | conns | ok | client anon KiB | client shmem KiB | server anon KiB | server shmem KiB "
          "| tmpfs KiB (both ends) | fds client/server |")
    print("|---|---|---|---|---|---|---|---|---|")
    def fmt(row, field, spec="{:.1f}"):
        return spec.format(row[field]) if field in row else "-"
    for transport, rows in medians.items():
        for n in sorted(rows, key=int):
            row = rows[n]
            print(f"| {transport} | {n} | {row['ok']}/{row['runs']} | {fmt(row, 'client_anon')} | "
                  f"{fmt(row, 'client_shmem')} | {fmt(row, 'server_anon')} | {fmt(row, 'server_shmem')} | "
                  f"{fmt(row, 'tmpfs')} | {fmt(row, 'client_fds', '{:.2f}')}/{fmt(row, 'server_fds', '{:.2f}')} |")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("conn_memory_report: no matplotlib: no chart")
        return 0
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for transport, rows in medians.items():
        ns = sorted((int(n) for n in rows if "client_anon" in rows[n]))
        if not ns:
            continue
        per = [rows[str(n)]["client_anon"] + rows[str(n)]["client_shmem"] for n in ns]
        axes[0].plot(ns, per, marker="o", label=transport)
        tm = [rows[str(n)].get("tmpfs", 0) for n in ns]
        axes[1].plot(ns, tm, marker="o", label=transport)
    axes[0].set_title("client process: resident KiB per connection")
    axes[1].set_title("tmpfs KiB per connection (both ends)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("symlog")
        ax.set_xlabel("open idle connections")
        ax.legend()
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(prefix + ".png", dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
