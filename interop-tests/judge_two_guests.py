#!/usr/bin/env python3
"""Judges the two-guest rows (interop-tests/run-two-guests.sh) on the host from
the logs of both guests and appends them to a results file in run-matrix.sh's
format (section twohosts).

  judge_two_guests.py DIR/two RESULTS.tsv

A case passes when the client in guest A exited 0 with its success line, the
server in guest B printed its own, and A's rxe0 counters moved."""
import csv
import os
import re
import sys


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def last(text, pattern):
    lines = [l for l in text.splitlines() if re.search(pattern, l)]
    return lines[-1].strip()[:220] if lines else ""


def main():
    d, results = sys.argv[1], sys.argv[2]
    cases = []
    with open(os.path.join(d, "cases.tsv")) as f:
        for row in csv.reader(f, delimiter="\t"):
            if len(row) == 5:
                cases.append(row)
    clients = {}
    try:
        with open(os.path.join(d, "clients.tsv")) as f:
            for row in csv.reader(f, delimiter="\t"):
                clients[row[0]] = row[1:]
    except FileNotFoundError:
        pass
    failed = 0
    with open(results, "a") as out:
        for cid, section, peer, role, name in cases:
            srv = read(os.path.join(d, cid + ".srv"))
            cli = read(os.path.join(d, cid + ".cli"))
            rc, secs, pkts = clients.get(cid, ["-", "-", "0"])
            why = []
            if rc != "0":
                why.append("client in A: exit %s %s" % (rc, last(cli, r"FAIL|rror|fail")))
            # What each side prints when its conversation succeeded.
            cli_ok = last(cli, r"^(OK|custom)")
            srv_ok = last(srv, r"^(OK|custom)|listening on .* via gpusock|gpu_echo_server: listening")
            if not cli_ok:
                why.append("no success line from the client")
            if not srv_ok:
                why.append("no success line from the server in B: %s" % last(srv, r"."))
            if int(pkts or 0) <= 0:
                why.append("no rxe0 packets in A")
            status = "FAIL" if why else "PASS"
            failed += status == "FAIL"
            note = "; ".join(why) + ("; " if why else "")
            note += "A (client): %s | B (server): %s" % (cli_ok or "-", srv_ok or "-")
            out.write("\t".join(["twohosts", "%s [%s]" % (peer, section), role, name, status, str(secs),
                                 note.replace("\t", " ").replace("\n", " "), str(pkts)]) + "\n")
    print("judge_two_guests: %d cases, %d failed" % (len(cases), failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
