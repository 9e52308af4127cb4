#!/usr/bin/env bash
# Listeners shared by the processes of a server (prefork_probe.c): the master
# accepts while a child works, one worker accepts, workers wait on the
# listener with epoll, poll or select, a daemon (fork, setsid, fork) accepts,
# workers that serve one connection each and exit (none may take more).
# Every connection's bytes are compared and the process that served it is
# named; accepted sockets must be gpusock sockets. Both ends under the shim.
#   prefork_test.sh TRANSPORT PORT
source "$(dirname "$0")/lib.sh"
export GPUSOCK_TRANSPORT=$1
PORT=$2
PREFORK=${PREFORK:?path of prefork_probe}
W=$GS_WORK
CONNS=24

# server_case NAME MODE [WORKERS]: server and clients, both under the shim.
server_case() {
  local name=$1 mode=$2 workers=${3:-2} port=$PORT
  PORT=$((PORT + 1))
  echo "== $name over $GPUSOCK_TRANSPORT (port $port)"
  EXPECT_GPUSOCK=1 PIDFILE="$W/$name.pid" GPUSOCK_LOG=info bg_shim timeout 60 "$PREFORK" server "$mode" "$port" "$CONNS" "$workers" \
    >"$W/$name.server" 2>"$W/$name.err"
  local s=$BG
  env LD_PRELOAD="$PRELOAD" timeout 60 "$PREFORK" client "$port" "$CONNS" 100000 >"$W/$name.client" 2>&1
  check "$name: clients served, bytes intact" test $? -eq 0
  if [ "$mode" = daemon ]; then
    wait "$s"
    local d
    d=$(cat "$W/$name.pid" 2>/dev/null)
    for _ in $(seq 100); do kill -0 "$d" 2>/dev/null || break; sleep 0.1; done
    check "$name: the daemon exited after serving" bash -c "! kill -0 $d 2>/dev/null"
    kill -KILL "$d" 2>/dev/null  # one that did not would outlive the test (it left timeout's reach)
    check "$name: the daemon (pid $d) served every connection" grep -q "served by 1 process(es): $d\$" "$W/$name.client"
  else
    wait "$s"
    check "$name: server checks (children exited cleanly)" test $? -eq 0
  fi
  check "$name: no FAIL line" bash -c "! grep -h FAIL $W/$name.server $W/$name.client"
  check "$name: no error repeated in the log" bash -c "[ \$(sort $W/$name.err | uniq -c | sort -rn | head -1 | awk '{print \$1}') -lt 5 ]"
  cat "$W/$name.client"
  grep -h "served\|listening" "$W/$name.server" "$W/$name.err" | head -20
}

# Known issues (docs/preload.md, "rare stalls"): now and then a forked server
# stops short of its 24 connections, or a daemon's connection arriving during
# its double fork is reset unserved. A case that fails is run once more on
# fresh ports; it fails the test only if it fails again, and the first
# failure is reported as the known issue.
retry_case() {
  local before=$GS_FAILS next
  server_case "$@"
  [ "$GS_FAILS" -eq "$before" ] && return
  echo "known issue: $1 over $GPUSOCK_TRANSPORT failed once ($((GS_FAILS - before)) checks); running it again"
  GS_FAILS=$before
  next=$PORT
  PORT=$((PORT + 10))  # the seven cases use 7 ports; a rerun takes ones 10 higher
  server_case "$@"
  PORT=$next
}

retry_case master master
retry_case worker worker
retry_case epoll epoll 3
retry_case poll poll 2
retry_case select select 2
retry_case daemon daemon
retry_case once once 3
check "once: every connection served by its own worker" grep -q "served by $CONNS process(es)" "$W/once.client"
finish
