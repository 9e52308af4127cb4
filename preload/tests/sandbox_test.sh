#!/usr/bin/env bash
# Servers that isolate each client (sandbox_probe.c), both ends under the
# shim: children made by a raw clone system call (CLONE_NEWIPC|SIGCHLD, no
# fork handlers run) close the inherited listener and serve one connection
# each while the parent goes on accepting; children made by glibc's clone(),
# which the shim does not see, close the listener and the connection and
# exit, and the parent still serves both (also a vfork() child, which runs on
# its parent's memory); a forked child that forbids
# rt_sigaction with a seccomp filter exits normally. And a process that opens
# no gpusock socket does not map libfabric.
#   sandbox_test.sh TRANSPORT PORT
source "$(dirname "$0")/lib.sh"
export GPUSOCK_TRANSPORT=$1
PORT=$2
SANDBOX=${SANDBOX:?path of sandbox_probe}
W=$GS_WORK
CONNS=3

# server_case NAME PORT SERVER-ARGS...: the server, then CONNS clients (one
# for seccomp-server) one after another.
server_case() {
  local name=$1 port=$2 conns=$3
  shift 3
  echo "== $name over $GPUSOCK_TRANSPORT (port $port)"
  GPUSOCK_LOG=info bg_shim timeout 60 "$SANDBOX" "$@" >"$W/$name.server" 2>"$W/$name.err"
  local s=$BG
  wait_log "$W/$name.server" "^listening" 20 || true
  env LD_PRELOAD="$PRELOAD" timeout 30 "$SANDBOX" client "$port" "$conns" 200000 >"$W/$name.client" 2>&1
  check "$name: $conns client(s) in a row served, every byte checked" test $? -eq 0
  [ "$GS_FAILS" -eq 0 ] || kill "$s" 2>/dev/null
  wait "$s"
  check "$name: server checks (children exited 0)" test $? -eq 0
  cat "$W/$name.server" "$W/$name.client"
  grep -h "gpusock" "$W/$name.err" | sort | uniq -c | sort -rn | head -8
}

# No LeakSanitizer in these servers (the ASan stage): a child made by a raw
# clone abandons what it inherited on purpose, and LeakSanitizer, which
# cannot stop the parent's threads there ("not suspended"), reports it; its
# check at exit also sets signal handlers of its own, which the seccomp
# child's filter would kill it for. ASan's other checks stay on.
export ASAN_OPTIONS="${ASAN_OPTIONS:-}:detect_leaks=0"
server_case clone $PORT $CONNS clone-server $PORT $CONNS
server_case seccomp $((PORT + 1)) 1 seccomp-server $((PORT + 1))
server_case hidden-clone $((PORT + 2)) $CONNS hidden-clone-server $((PORT + 2)) $CONNS
server_case vfork $((PORT + 3)) $CONNS vfork-server $((PORT + 3)) $CONNS

echo "== libfabric is loaded only by processes that open a gpusock socket"
maps_case() {  # maps_case WHAT WANTED-STATUS WHAT-IT-MEANS [ENV...]
  local what=$1 want=$2 means=$3
  shift 3
  env LD_PRELOAD="$PRELOAD" "$@" "$SANDBOX" maps "$what" $((PORT + 9)) >"$W/maps.$what" 2>&1
  local rc=$?
  check "maps $what: $means ($(tail -1 "$W/maps.$what"))" test "$rc" -eq "$want"
}
maps_case none 0 "libfabric not mapped"
maps_case kernel 0 "libfabric not mapped after a UDP and a unix socket"
maps_case listen 0 "libfabric not mapped by a listener on an excluded port" GPUSOCK_EXCLUDE_PORTS=$((PORT + 9))
maps_case tcp 1 "libfabric mapped once a TCP socket is made"
check "LD_PRELOAD=shim /bin/true opens no libfabric" \
  bash -c "! LD_DEBUG=files env LD_PRELOAD='$PRELOAD' /bin/true 2>&1 | grep -q libfabric"
finish
