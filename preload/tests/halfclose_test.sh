#!/usr/bin/env bash
# A peer that stops writing while we still have data unread (halfclose_probe.c):
# poll, select and epoll must report what Linux TCP reports: readable and
# POLLRDHUP, no POLLHUP until our side has shut down writing too, nothing at
# all with epoll events 0; every byte then arrives. The same program runs on
# kernel TCP first (the expectations are Linux's), then under the shim; the
# sender either closes or only shuts down writing.
#   halfclose_test.sh TRANSPORT PORT
source "$(dirname "$0")/lib.sh"
export GPUSOCK_TRANSPORT=$1
PORT=$2
HALFCLOSE=${HALFCLOSE:?path of halfclose_probe}
W=$GS_WORK
BYTES=$((8 << 20))
port=$PORT
for how in close shutdown; do
  echo "== kernel TCP, the sender: $how (port $port)"
  EXPECT_GPUSOCK=0 timeout 60 "$HALFCLOSE" "$port" "$BYTES" "$how" >"$W/kernel.$how" 2>&1
  check "kernel TCP, the sender: $how: all checks" test $? -eq 0
  cat "$W/kernel.$how"
  port=$((port + 1))
  echo "== $GPUSOCK_TRANSPORT, the sender: $how (port $port)"
  env LD_PRELOAD="$PRELOAD" EXPECT_GPUSOCK=1 timeout 60 "$HALFCLOSE" "$port" "$BYTES" "$how" >"$W/gpusock.$how" 2>&1
  check "$GPUSOCK_TRANSPORT, the sender: $how: all checks" test $? -eq 0
  cat "$W/gpusock.$how"
  port=$((port + 1))
done
finish
