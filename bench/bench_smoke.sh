#!/usr/bin/env bash
# ctest bench_sockets_smoke: every bench_sockets measure on every transport
# with tiny counts, then scripts/bench_report.py over the result (table, JSON
# and, with python3-matplotlib, the chart). Checks that the benchmark runs and
# reports; never judges a number.
#   bench_smoke.sh BENCH_SOCKETS BENCH_REPORT_PY OUT_DIR
set -euo pipefail
bench_sockets=$1 report=$2 out=$3
mkdir -p "$out"
"$bench_sockets" suite --smoke --json "$out/bench_sockets.json"
# Debian's interpreter where there is one: python3-matplotlib is installed for it.
python=/usr/bin/python3
[ -x "$python" ] || python=python3
"$python" "$report" --sockets-json "$out/bench_sockets.json" --out "$out/report.json" --chart "$out/report.png"
