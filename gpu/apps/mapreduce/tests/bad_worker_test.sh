#!/usr/bin/env bash
# bad_worker_test.sh MAPREDUCE MR_BAD_WORKER PORT: a MapReduce worker (rank 0
# of 2, host backend) against a peer that misbehaves in each way
# mr_bad_worker knows. Each time the worker must fail with the error that
# names what went wrong, within the time limit, never hang or crash.
set -uo pipefail
bin=$1 bad=$2 port=$3
failures=0
check() {  # MODE EXPECTED_ERROR_PATTERN
  local mode=$1 want=$2 log rc
  log=$(mktemp)
  timeout 120 "$bad" "$mode" "$port" >"$log.bad" 2>&1 &
  local bad_pid=$!
  timeout 120 "$bin" --host-backend --job wordcount --rank 0 --ranks 2 --port "$port" --corpus-mib 1 >"$log" 2>&1
  rc=$?
  wait "$bad_pid"
  if [ "$rc" -eq 1 ] && grep -qE "$want" "$log"; then
    echo "ok: $mode: $(grep -oE "$want" "$log" | head -n 1)"
  else
    echo "FAIL: $mode: exit $rc (want 1 and /$want/)"
    cat "$log" "$log.bad"
    failures=$((failures + 1))
  fi
  rm -f "$log" "$log.bad"
  port=$((port + 3))
}
check bad-hello 'mesh block [0-9]+: EPROTO'
check bad-length 'exchange block [0-9]+: EMSGSIZE'
check short 'exchange block [0-9]+: EPROTO'
check vanish 'exchange block [0-9]+: (EPROTO|ECONNRESET|EPIPE)'
exit "$failures"
