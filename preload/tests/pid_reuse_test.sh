#!/usr/bin/env bash
# fabric:shm after pid reuse: a SIGKILLed process leaves its shm regions in
# /dev/shm, and a later process with the same pid must still connect. Runs the
# fork_exec scenario in a private /dev/shm and pid namespace (needs root and
# unshare; SKIP otherwise) with stale regions planted for the next pids, named
# as gpusock named endpoints before their names carried the process start time
# (gpusock-ep-<pid>-<seq>, the pid inside, so shm took them for live regions
# and refused the name: the client's connect failed with EBUSY and the server
# waited in accept() until its timeout).
#   pid_reuse_test.sh PORT
source "$(dirname "$0")/lib.sh"
PORT=$1
if [ "${GS_IN_NS:-0}" != 1 ]; then
  if ! unshare --mount --pid --fork --mount-proc true 2>/dev/null; then
    echo "needs unshare (root) for a private /dev/shm and pid namespace"
    exit 77
  fi
  exec env GS_IN_NS=1 unshare --mount --pid --fork --mount-proc bash "$0" "$@"
fi
mount -t tmpfs tmpfs /dev/shm || exit 77
export GPUSOCK_TRANSPORT=fabric:shm
W=$GS_WORK
echo "== pid reuse over $GPUSOCK_TRANSPORT on port $PORT"
EXPECT_GPUSOCK=1 GPUSOCK_LOG=info bg_shim timeout 30 "$PROBE" fork-server "$PORT" >"$W/server.out" 2>"$W/server.err"
S=$BG
check "fork-server listens through gpusock" wait_log "$W/server.err" "listening on 127.0.0.1:$PORT via gpusock"
# Leftovers of killed processes for the next 200 pids (what shm 1.17 writes
# first in a region: version 4, then the owner's pid), written with shell
# builtins only, so that planting takes no pids itself.
next=$(($(sh -c 'echo $$') + 1))
for ((pid = next; pid < next + 200; ++pid)); do
  printf -v head '\\x04\\x00\\x00\\x00\\x%02x\\x%02x\\x%02x\\x%02x' $((pid & 255)) $((pid >> 8 & 255)) \
    $((pid >> 16 & 255)) $((pid >> 24 & 255))
  for seq in 0 1; do printf "$head" >"/dev/shm/gpusock-ep-$pid-$seq"; done
done
check "stale regions planted for pids $next.." test -s "/dev/shm/gpusock-ep-$next-0"
env LD_PRELOAD="$PRELOAD" EXPECT_GPUSOCK=1 timeout 20 "$PROBE" fork-client "$PORT" 100000 exec-child >"$W/client1.out" 2>&1
check "client 1 with a reused pid: all checks" test $? -eq 0
env LD_PRELOAD="$PRELOAD" EXPECT_GPUSOCK=1 timeout 20 "$PROBE" fork-client "$PORT" 100000 fork-child >"$W/client2.out" 2>&1
check "client 2 with a reused pid: all checks" test $? -eq 0
[ "$GS_FAILS" -ne 0 ] && kill "$S" 2>/dev/null
wait "$S"
check "fork-server: all checks" test $? -eq 0
check "stale regions of dead owners were swept" test ! -e "/dev/shm/gpusock-ep-$((next + 150))-0"
cat "$W/server.out" "$W/client1.out" "$W/client2.out"
finish
