#!/usr/bin/env bash
# AF_UNIX, UDP and gpusock TCP sockets in one epoll set (level, edge,
# one-shot), poll and select over the same mix, signals, dup and close.
#   epoll_mix_test.sh TRANSPORT PORT
source "$(dirname "$0")/lib.sh"
export GPUSOCK_TRANSPORT=$1
PORT=$2
echo "== epoll mix over $GPUSOCK_TRANSPORT on port $PORT"
env LD_PRELOAD="$PRELOAD" EXPECT_GPUSOCK=1 timeout 60 "$PROBE" epoll-mix "$PORT" >"$GS_WORK/out" 2>&1
rc=$?
cat "$GS_WORK/out"
check "epoll-mix: all checks under the shim" test "$rc" -eq 0
# The same program on the kernel alone passes the same checks.
EXPECT_GPUSOCK=0 timeout 60 "$PROBE" epoll-mix "$((PORT + 1))" >"$GS_WORK/kernel.out" 2>&1
check "epoll-mix: the same checks pass on kernel TCP" test $? -eq 0
finish
