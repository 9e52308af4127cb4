#!/usr/bin/env bash
# Odd but legal socket calls under the shim (odd_calls.c) against an echo
# server on gpusock (gs_test_peer echo): every check passes and nothing hangs.
#   odd_calls_test.sh TRANSPORT PORT
# Environment from CTest: PRELOAD (the shim), PROBE (odd_calls), PEER (gs_test_peer).
source "$(dirname "$0")/../preload/tests/lib.sh"
export GPUSOCK_TRANSPORT=$1
PORT=$2
W=$GS_WORK
echo "== odd calls under the shim over $GPUSOCK_TRANSPORT on port $PORT"
bg_plain "$PEER" echo "$PORT"
env LD_PRELOAD="$PRELOAD" timeout 60 "$PROBE" "$PORT" >"$W/probe.out" 2>&1
rc=$?
cat "$W/probe.out"
check "odd calls: exit status $rc (124: hung), every check passed" test "$rc" -eq 0
finish
