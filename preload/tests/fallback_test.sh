#!/usr/bin/env bash
# No usable transport (GPUSOCK_TRANSPORT=verbs without an RDMA device): the shim
# falls back to kernel TCP with exactly one warning line per process, or, with
# GPUSOCK_FALLBACK=refuse, socket() fails; never silently.
#   fallback_test.sh PORT
source "$(dirname "$0")/lib.sh"
need memcached memccapable ss
PORT=$1
W=$GS_WORK
if [ -d /sys/class/infiniband ] && [ -n "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
  echo "an RDMA device exists: verbs is usable here, nothing to fall back from"
  exit 77
fi
export GPUSOCK_TRANSPORT=verbs
echo "== fallback: GPUSOCK_TRANSPORT=verbs, no RDMA device"

# shellcheck disable=SC2046
bg_shim memcached $(memcached_user_args) -U 0 -l 127.0.0.1 -p "$PORT" -t 2 >"$W/mc.out" 2>"$W/mc.err"
MC=$BG
for ((i = 0; i < 100; ++i)); do kernel_listening "$PORT" && break; sleep 0.05; done
check "memcached fell back: a kernel TCP socket listens on $PORT" kernel_listening "$PORT"
env LD_PRELOAD="$PRELOAD" timeout 60 memccapable -h 127.0.0.1 -p "$PORT" -t 10 >"$W/cap.out" 2>"$W/cap.err"
check "memccapable (also fallen back) passes all checks" grep -q "All tests passed" "$W/cap.out"
reply=$(kernel_version_reply "$PORT")
check "a plain kernel client reaches it (${reply})" test "$reply" = VERSION
kill -TERM "$MC"
wait "$MC"
cat "$W/mc.err" "$W/cap.err"
check "memcached warned exactly once" test "$(count_lines "$W/mc.err" "falling back to kernel TCP")" -eq 1
check "memccapable warned exactly once" test "$(count_lines "$W/cap.err" "falling back to kernel TCP")" -eq 1
check "the warning names the cause" grep -q "no RDMA device" "$W/mc.err"

echo "== refuse: GPUSOCK_FALLBACK=refuse"
GPUSOCK_FALLBACK=refuse env LD_PRELOAD="$PRELOAD" "$PROBE" socket >"$W/refuse.out" 2>"$W/refuse.err"
rc=$?
cat "$W/refuse.out" "$W/refuse.err"
check "socket() fails (exit status 3)" test "$rc" -eq 3
check "with ENODEV" grep -q "socket: No such device" "$W/refuse.out"
check "and one line says why" test "$(count_lines "$W/refuse.err" "refusing TCP sockets")" -eq 1
check "sockets the shim never takes still work: AF_UNIX" grep -qx "unix: ok" "$W/refuse.out"
check "sockets the shim never takes still work: UDP" grep -qx "udp: ok" "$W/refuse.out"
finish
