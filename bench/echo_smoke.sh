#!/usr/bin/env bash
# ctest smoke test: gs_echo server + a 1-second client over one transport.
# Checks that the demo runs end to end; the numbers it prints are not judged.
#   echo_smoke.sh GS_ECHO TRANSPORT
set -euo pipefail
gs_echo=$1
transport=$2
log=$(mktemp)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -f "$log"
}
trap cleanup EXIT

# A random port pair; another try if it is taken.
for _ in 1 2 3 4 5; do
  port=$((20000 + (RANDOM % 20000) * 2))
  "$gs_echo" server --transport "$transport" --port "$port" --sink-port $((port + 1)) >"$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 100); do
    grep -q listening "$log" && break
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  grep -q listening "$log" && break
  wait "$server_pid" 2>/dev/null || true
  server_pid=
done
if [ -z "$server_pid" ]; then
  echo "gs_echo server over $transport did not start:" >&2
  cat "$log" >&2
  exit 1
fi
"$gs_echo" client --transport "$transport" --port "$port" --sink-port $((port + 1)) --seconds 1
