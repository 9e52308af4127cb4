#!/usr/bin/env bash
# Port lists: GPUSOCK_EXCLUDE_PORTS keeps a port on kernel TCP (transparently),
# GPUSOCK_PORTS limits gpusock to the ports it names.
#   ports_test.sh TRANSPORT PORT   (uses PORT .. PORT+3)
source "$(dirname "$0")/lib.sh"
need ss
export GPUSOCK_TRANSPORT=$1
P=$2
W=$GS_WORK
echo "== port lists over $GPUSOCK_TRANSPORT"

pair() {  # pair TAG PORT EXPECT: echo server and client under the shim
  local tag=$1 port=$2 expect=$3
  EXPECT_GPUSOCK=$expect GPUSOCK_LOG=info bg_shim timeout 30 "$PROBE" echo-server "$port" >"$W/$tag.server" 2>&1
  local s=$BG
  wait_log "$W/$tag.server" "echo-server listening" 10 >/dev/null
  env LD_PRELOAD="$PRELOAD" EXPECT_GPUSOCK="$expect" GPUSOCK_LOG=info timeout 30 "$PROBE" echo-client "$port" 200000 \
    >"$W/$tag.client" 2>&1
  local rc=$?
  wait "$s"
  local src=$?
  cat "$W/$tag.server" "$W/$tag.client"
  [ "$rc" -eq 0 ] && [ "$src" -eq 0 ]
}

export GPUSOCK_EXCLUDE_PORTS="1-1023,$P"
check "GPUSOCK_EXCLUDE_PORTS=$GPUSOCK_EXCLUDE_PORTS: port $P is kernel TCP on both ends" pair excluded "$P" 0
check "the shim said so" grep -q "kernel TCP (port not selected)" "$W/excluded.server"
check "port $((P + 1)) (not excluded) is gpusock on both ends" pair other $((P + 1)) 1
unset GPUSOCK_EXCLUDE_PORTS

export GPUSOCK_PORTS="$((P + 2))"
check "GPUSOCK_PORTS=$GPUSOCK_PORTS: port $((P + 2)) is gpusock" pair included $((P + 2)) 1
check "port $((P + 3)) (not listed) is kernel TCP" pair unlisted $((P + 3)) 0
unset GPUSOCK_PORTS

# The excluded listener really is the kernel's: ss sees it.
GPUSOCK_EXCLUDE_PORTS=$P bg_shim timeout 30 "$PROBE" echo-server "$P" >"$W/ss.server" 2>&1
S=$BG
wait_log "$W/ss.server" "echo-server listening" 10 >/dev/null
check "ss -tln shows the excluded listener on $P" kernel_listening "$P"
timeout 10 "$PROBE" echo-client "$P" 1000 >/dev/null 2>&1
wait "$S"
finish
