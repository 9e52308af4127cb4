#!/usr/bin/env bash
# IPv4 and IPv6 listeners on one port as the kernel has them (IPV6_V6ONLY on
# and off), clients over 127.0.0.1, ::1 and ::ffff:127.0.0.1
# (prefork_probe.c dualstack); first on kernel TCP (the reference), then
# under the shim.
#   dualstack_test.sh TRANSPORT PORT
source "$(dirname "$0")/lib.sh"
export GPUSOCK_TRANSPORT=$1
PORT=$2
PREFORK=${PREFORK:?path of prefork_probe}
if ! [ -e /proc/net/if_inet6 ] || ! ip -6 addr show lo 2>/dev/null | grep -q '::1'; then
  echo "no IPv6 loopback here"
  exit 77
fi
for v6only in 1 0; do
  echo "== kernel TCP, V6ONLY=$v6only"
  timeout 30 "$PREFORK" dualstack "$PORT" "$v6only"
  check "kernel TCP, V6ONLY=$v6only (the reference)" test $? -eq 0
  echo "== $GPUSOCK_TRANSPORT, V6ONLY=$v6only"
  env LD_PRELOAD="$PRELOAD" timeout 30 "$PREFORK" dualstack "$((PORT + 2))" "$v6only"
  check "$GPUSOCK_TRANSPORT, V6ONLY=$v6only" test $? -eq 0
  PORT=$((PORT + 4))
done
finish
