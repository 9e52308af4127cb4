#!/usr/bin/env bash
# A server out of descriptors with connections in its backlog
# (emfile_probe.c): accept fails with EMFILE and the connections stay
# queued; once descriptors are free every one is accepted and served, none
# refused or reset. And a client out of descriptors at each step of its
# connect: the connect fails with EMFILE and no other connection is harmed.
# Kernel TCP first (the expectation is Linux's), then under the shim.
#   emfile_test.sh TRANSPORT PORT
source "$(dirname "$0")/lib.sh"
export GPUSOCK_TRANSPORT=$1
PORT=$2
EMFILE=${EMFILE:?path of emfile_probe}
W=$GS_WORK
N=6
run_case() {  # NAME PORT PRELOAD-OR-EMPTY
  local name=$1 port=$2 pre=$3
  echo "== $name (port $port)"
  env ${pre:+LD_PRELOAD=$pre} timeout 90 "$EMFILE" server "$port" "$N" >"$W/$name.server" 2>&1 &
  local server=$!
  for _ in $(seq 100); do grep -q listening "$W/$name.server" && break; sleep 0.1; done
  env ${pre:+LD_PRELOAD=$pre} timeout 90 "$EMFILE" clients "$port" "$N" >"$W/$name.clients" 2>&1
  local crc=$?
  wait "$server"
  local src=$?
  cat "$W/$name.server" "$W/$name.clients"
  check "$name: the server's checks" test "$src" -eq 0
  check "$name: the clients' checks" test "$crc" -eq 0
}
# A client out of descriptors at each step of its connect.
connect_case() {  # NAME PORT PRELOAD-OR-EMPTY
  local name=$1 port=$2 pre=$3
  echo "== $name: connects (port $port)"
  env ${pre:+LD_PRELOAD=$pre} timeout 90 "$EMFILE" echo "$port" >"$W/$name.echo" 2>&1 &
  local server=$!
  for _ in $(seq 100); do grep -q listening "$W/$name.echo" && break; sleep 0.1; done
  env ${pre:+LD_PRELOAD=$pre} timeout 60 "$EMFILE" connects "$port" 4 >"$W/$name.connects" 2>&1
  local crc=$?
  kill "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  cat "$W/$name.connects"
  check "$name: the connecting client's checks" test "$crc" -eq 0
}
run_case kernel "$PORT" ""
run_case "$GPUSOCK_TRANSPORT" "$((PORT + 1))" "$PRELOAD"
connect_case kernel "$((PORT + 2))" ""
connect_case "$GPUSOCK_TRANSPORT" "$((PORT + 3))" "$PRELOAD"
finish
