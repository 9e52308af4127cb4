#!/usr/bin/env bash
# The GPU echo server example on the host backend, with CPU clients checking
# every echo: echo_example_test.sh SERVER PEER TRANSPORT
set -euo pipefail
server=$1 peer=$2 transport=$3
export GPUSOCK_TRANSPORT=$transport
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
log=$(mktemp)
"$server" --host-backend --port "$port" --blocks 2 --threads 4 --conns 4 >"$log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 100); do grep -q listening "$log" && break; sleep 0.1; done
grep -q listening "$log" || { cat "$log"; exit 1; }
"$peer" clients "$port" 6 10 8192 3
kill -TERM $pid
rc=0
wait $pid || rc=$?
cat "$log"
[ "$rc" -eq 0 ] || { echo "server exited with $rc"; exit 1; }
grep -q "echoed [1-9]" "$log"
