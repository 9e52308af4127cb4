#!/usr/bin/env bash
# A server that forks per connection (relay_addr_probe.c): the child, before
# and after exec, must see the connection's TCP addresses (getsockname,
# getpeername, SO_DOMAIN, SO_PROTOCOL, SO_PEERCRED), as on kernel TCP, not
# the AF_UNIX socket of the fork relay that carries it under the shim. The
# same program runs on kernel TCP first, then with both ends under the shim.
#   relay_addr_test.sh TRANSPORT PORT
source "$(dirname "$0")/lib.sh"
export GPUSOCK_TRANSPORT=$1
PORT=$2
RELAYADDR=${RELAYADDR:?path of relay_addr_probe}
W=$GS_WORK

run_case() {  # run_case NAME PORT PRELOAD-OR-EMPTY EXPECT_GPUSOCK
  local name=$1 port=$2 preload=$3 expect=$4
  echo "== $name (port $port)"
  env ${preload:+LD_PRELOAD="$preload"} EXPECT_GPUSOCK="$expect" timeout 60 "$RELAYADDR" server "$port" \
    >"$W/$name.server" 2>&1 &
  local s=$!
  GS_PIDS+=("$s")
  env ${preload:+LD_PRELOAD="$preload"} timeout 30 "$RELAYADDR" client "$port" >"$W/$name.client" 2>&1
  check "$name: the client's checks" test $? -eq 0
  wait "$s"
  check "$name: the server's and its children's checks" test $? -eq 0
  cat "$W/$name.server" "$W/$name.client"
}

run_case kernel "$PORT" "" 0
run_case "$GPUSOCK_TRANSPORT" $((PORT + 1)) "$PRELOAD" 1
finish
