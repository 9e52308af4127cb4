#!/usr/bin/env bash
# A server that forks and execs a child which inherits a connected gpusock
# socket (the child serves the request on it after exec), then forks a child
# without exec while the parent keeps its fd open. Both ends under the shim.
#   fork_exec_test.sh TRANSPORT PORT
source "$(dirname "$0")/lib.sh"
export GPUSOCK_TRANSPORT=$1
PORT=$2
W=$GS_WORK
echo "== fork+exec over $GPUSOCK_TRANSPORT on port $PORT"
EXPECT_GPUSOCK=1 GPUSOCK_LOG=info bg_shim timeout 60 "$PROBE" fork-server "$PORT" >"$W/server.out" 2>"$W/server.err"
S=$BG
check "fork-server listens through gpusock" wait_log "$W/server.err" "listening on 127.0.0.1:$PORT via gpusock"
env LD_PRELOAD="$PRELOAD" EXPECT_GPUSOCK=1 timeout 30 "$PROBE" fork-client "$PORT" 1000000 exec-child >"$W/client1.out" 2>&1
check "client 1 (served by the exec'd child): all checks" test $? -eq 0
env LD_PRELOAD="$PRELOAD" EXPECT_GPUSOCK=1 timeout 30 "$PROBE" fork-client "$PORT" 300000 fork-child >"$W/client2.out" 2>&1
check "client 2 (served by the forked child): all checks" test $? -eq 0
if [ "$GS_FAILS" -ne 0 ]; then
  # A client that could not connect leaves the server waiting in accept() for
  # a connection that never comes: stop it now rather than at its timeout, and
  # show what the transport saw.
  kill "$S" 2>/dev/null
  echo "-- server log:"
  cat "$W/server.err"
  echo "-- gpusock files in /dev/shm:"
  ls -l /dev/shm | grep gpusock
fi
wait "$S"
check "fork-server: all checks (children exited 0)" test $? -eq 0
cat "$W/server.out" "$W/client1.out" "$W/client2.out"
finish
