#!/usr/bin/env python3
"""Renders the interop matrix (results.tsv from run-matrix.sh, plus the host's
rows) as text on stdout and as Markdown for docs/interop.md.

Exit status: 0 if every FAIL cell is listed in the known-issues file (and no
section is missing), 1 otherwise.
"""
import argparse
import csv
import datetime
import sys

SECTIONS = [
    ("control", "Control: do the rxe0 counters only count RDMA?"),
    ("rstream", "rstream (rdmacm-utils 44.0, unmodified)"),
    ("riostream", "riostream (rdmacm-utils 44.0, unmodified)"),
    ("rsocket", "rdma-core 44's rsocket library (librdmacm 44.0, unmodified) driven by interop-tests/xfer_peer.cc"),
    ("memcached", "memcached and libmemcached-tools under librspreload.so (rdma-core 44.0)"),
    ("shim", "gpusock's preload shim ↔ rdma-core 44's librspreload.so: memcached and libmemcached-tools, unmodified"),
    ("prefork", "A pre-fork server (prefork_probe: a master, three epoll workers) under gpusock's shim ← clients under librspreload.so"),
    ("gpu", "GPU echo server (gpu/examples, host backend) ← unmodified rstream and a plain-sockets client under librspreload"),
    ("hostile", "Bad input: gs_hostile, a deliberately misbehaving peer on wire/transport.h + wire/verbs"),
    ("errors", "Errors users will hit"),
    ("proof", "Proof that the bytes went over verbs"),
    ("twohosts", "Two hosts: two guests, each with its own rxe0, joined by a private link (interop-tests/run-two-guests.sh)"),
]

ROLE_LABELS = {
    "gs-server": "gpusock = server",
    "gs-client": "gpusock = client",
    "baseline": "baseline: rdma-core ↔ rdma-core",
    "-": "result",
}

# Per section, what the two roles mean in words.
ROLE_TITLES = {
    "rstream": {"gs-server": "gpusock server ← rstream client", "gs-client": "rstream server ← gpusock client",
                "baseline": "rstream ↔ rstream (no gpusock)"},
    "riostream": {"gs-server": "gpusock server ← riostream client", "gs-client": "riostream server ← gpusock client"},
    "rsocket": {"gs-server": "gpusock server ← rsocket client", "gs-client": "rsocket server ← gpusock client",
                "baseline": "rsocket ↔ rsocket (no gpusock)"},
    "memcached": {"gs-server": "gpusock = server", "gs-client": "gpusock = client"},
    "shim": {"gs-server": "memcached on gpusock's shim ← tools on librspreload",
             "gs-client": "memcached on librspreload ← tools on gpusock's shim",
             "baseline": "librspreload on both sides (no gpusock)"},
    "prefork": {"gs-server": "workers on gpusock's shim ← clients on librspreload"},
    "gpu": {"gs-server": "GPU echo server ← peer"},
    "twohosts": {"gs-server": "gpusock in B (server) ← rdma-core in A", "gs-client": "rdma-core in B (server) ← gpusock in A",
                 "baseline": "rdma-core ↔ rdma-core"},
    "hostile": {"gs-server": "gpusock = server (victim)", "gs-client": "gpusock = client"},
    "errors": {"gs-server": "gpusock = server", "gs-client": "gpusock = client / caller"},
}

STATUS_TEXT = {"PASS": "pass", "FAIL": "**FAIL**", "NS": "n/s"}


def load_rows(paths):
    rows = []
    for p in paths:
        try:
            with open(p, newline="") as f:
                for r in csv.DictReader(f, delimiter="\t"):
                    rows.append(r)
        except FileNotFoundError:
            pass
    return rows


def load_known(path):
    known = {}
    if not path:
        return known
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split("|", 3)
            if len(parts) == 4:
                known[tuple(parts[:3])] = parts[3]
    return known


def md_escape(s):
    return s.replace("|", "\\|").replace("\n", " ")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", action="append", required=True)
    ap.add_argument("--header")
    ap.add_argument("--known")
    ap.add_argument("--out")
    ap.add_argument("--meta", action="append", default=[], help="KEY=VALUE lines for the run summary")
    ap.add_argument("--expect-sections", default="")
    a = ap.parse_args()

    rows = load_rows(a.results)
    known = load_known(a.known)
    for r in rows:
        k = known.get((r["section"], r["role"], r["case"]))
        r["known"] = k if (k and r["status"] == "FAIL") else ""
        r["xpass"] = k if (k and r["status"] == "PASS") else ""

    counts = {"PASS": 0, "FAIL": 0, "NS": 0}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    unexpected = [r for r in rows if r["status"] == "FAIL" and not r["known"]]
    known_fails = [r for r in rows if r["known"]]
    xpasses = [r for r in rows if r["xpass"]]
    present = {r["section"] for r in rows}
    missing = [s for s in a.expect_sections.split(",") if s and s not in present]

    def cell(r):
        if r is None:
            return "–"
        t = STATUS_TEXT.get(r["status"], r["status"])
        if r["known"]:
            t += " (known: " + r["known"].split(":", 1)[0] + ")"
        return t

    # ---------------------------------------------------------------- text
    out = []
    out.append("interop matrix: %d cells: %d pass, %d fail (%d known), %d not supported"
               % (len(rows), counts["PASS"], counts["FAIL"], len(known_fails), counts["NS"]))
    for sec, title in SECTIONS:
        srows = [r for r in rows if r["section"] == sec]
        if not srows:
            continue
        roles = []
        for r in srows:
            if r["role"] not in roles:
                roles.append(r["role"])
        keys = []
        for r in srows:
            k = (r["peer"], r["case"])
            if k not in keys:
                keys.append(k)
        out.append("")
        out.append("[%s] %s" % (sec, title))
        labels = [ROLE_TITLES.get(sec, {}).get(x, ROLE_LABELS.get(x, x)) for x in roles]
        w0 = max(len("%s / %s" % k) for k in keys)
        out.append("  %-*s  %s" % (w0, "peer / case", "  ".join("%-24s" % l[:24] for l in labels)))
        for k in keys:
            cells = []
            for role in roles:
                match = [r for r in srows if (r["peer"], r["case"]) == k and r["role"] == role]
                c = cell(match[-1] if match else None).replace("**", "")
                cells.append("%-24s" % c)
            out.append("  %-*s  %s" % (w0, "%s / %s" % k, "  ".join(cells)))
    if unexpected:
        out.append("")
        out.append("UNEXPECTED FAILURES:")
        for r in unexpected:
            out.append("  %s / %s / %s / %s: %s" % (r["section"], r["peer"], r["role"], r["case"], r["note"]))
    if xpasses:
        out.append("")
        out.append("Known issues that passed this time (remove them from known-issues.txt once fixed):")
        for r in xpasses:
            out.append("  %s / %s / %s: %s" % (r["section"], r["role"], r["case"], r["xpass"]))
    if missing:
        out.append("")
        out.append("MISSING SECTIONS (the guest run stopped early?): " + ", ".join(missing))
    print("\n".join(out))

    # ---------------------------------------------------------------- markdown
    if a.out:
        md = []
        if a.header:
            with open(a.header) as f:
                md.append(f.read().rstrip() + "\n")
        md.append("## The matrix (generated)\n")
        md.append("Generated by `scripts/interop` on %s. " % datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
        for m in a.meta:
            k, _, v = m.partition("=")
            md.append("%s: %s. " % (k, v))
        md.append("\n\n**%d cells: %d pass, %d fail (%d of them known issues, listed below), %d not supported.**\n"
                  % (len(rows), counts["PASS"], counts["FAIL"], len(known_fails), counts["NS"]))
        md.append("`pass` = every check of the case held; `**FAIL**` = a check failed (reason in the details); "
                  "`n/s` = not supported, and checked to fail exactly the documented way. "
                  "A *baseline* column runs the same case between two rdma-core programs, without gpusock.\n")
        for sec, title in SECTIONS:
            srows = [r for r in rows if r["section"] == sec]
            if not srows:
                continue
            roles = []
            for r in srows:
                if r["role"] not in roles:
                    roles.append(r["role"])
            keys = []
            for r in srows:
                k = (r["peer"], r["case"])
                if k not in keys:
                    keys.append(k)
            peers = {k[0] for k in keys}
            md.append("\n### %s\n" % title)
            labels = [ROLE_TITLES.get(sec, {}).get(x, ROLE_LABELS.get(x, x)) for x in roles]
            first = "peer / case" if len(peers) > 1 else "case"
            md.append("| %s | %s |" % (first, " | ".join(labels)))
            md.append("|---|%s" % ("---|" * len(labels)))
            for k in keys:
                cells = []
                for role in roles:
                    match = [r for r in srows if (r["peer"], r["case"]) == k and r["role"] == role]
                    cells.append(cell(match[-1] if match else None))
                name = ("%s / %s" % k) if len(peers) > 1 else k[1]
                md.append("| %s | %s |" % (md_escape(name), " | ".join(cells)))
        if known_fails or known:
            md.append("\n### Known issues (gpusock bugs found by this matrix)\n")
            md.append("Cells marked *known* fail for a reason written up in `interop-tests/known-issues.txt`; "
                      "they do not fail the run (any other FAIL does).\n")
            if not known_fails:
                md.append("None failed in this run. Still listed, as not yet confirmed over many runs: %s.\n"
                          % "; ".join(md_escape(v) for v in known.values()))
            seen = set()
            for r in known_fails:
                kid = r["known"].split(":", 1)[0]
                if kid in seen:
                    continue
                seen.add(kid)
                md.append("- **%s**:%s" % (kid, md_escape(r["known"].split(":", 1)[1] if ":" in r["known"] else "")))
        md.append("\n### Details\n")
        md.append("Every case, in run order: status, seconds (wall, under TCG), rxe0 packets sent+received during the "
                  "case, and what was checked or seen. Logs: `<build>/interop-out/logs/`.\n")
        md.append("| section | peer | role | case | status | s | rxe pkts | note |")
        md.append("|---|---|---|---|---|---|---|---|")
        for r in rows:
            md.append("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                r["section"], md_escape(r["peer"]), r["role"], md_escape(r["case"]), cell(r), r["seconds"],
                r.get("rxe_pkts", "") or "", md_escape(r["note"])))
        with open(a.out, "w") as f:
            f.write("\n".join(md) + "\n")

    return 1 if (unexpected or missing) else 0


if __name__ == "__main__":
    sys.exit(main())
