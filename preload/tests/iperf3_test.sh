#!/usr/bin/env bash
# iperf3 client and server both under the shim: the sender reports the bytes it
# was asked to send (or up to a burst more, see below), both ends agree on what
# the receiver counted, and the receiver counted all of it except what was
# still in flight when the client ended the test.
#   iperf3_test.sh TRANSPORT PORT
source "$(dirname "$0")/lib.sh"
need iperf3 python3
export GPUSOCK_TRANSPORT=$1
PORT=$2
BYTES=$((50 * 1024 * 1024))
W=$GS_WORK
echo "== iperf3 over $GPUSOCK_TRANSPORT on port $PORT"

GPUSOCK_LOG=info bg_shim timeout 60 iperf3 -s -1 -B 127.0.0.1 -p "$PORT" -J >"$W/server.json" 2>"$W/server.err"
S=$BG
check "iperf3 server listens through gpusock" wait_log "$W/server.err" "listening on 127.0.0.1:$PORT via gpusock"
GPUSOCK_LOG=info env LD_PRELOAD="$PRELOAD" timeout 60 iperf3 -c 127.0.0.1 -p "$PORT" -n "$BYTES" -J \
  >"$W/client.json" 2>"$W/client.err"
check "iperf3 client exit status 0" test $? -eq 0
wait "$S"
check "iperf3 server exit status 0" test $? -eq 0
check "client's control and data connections went through gpusock" \
  test "$(count_lines "$W/client.err" "connect 127.0.0.1:$PORT via gpusock")" -ge 2

# iperf3's receiver stops counting when the client's TEST_END arrives on the
# control connection, so bytes still buffered between the two applications are
# never counted (kernel TCP loopback leaves megabytes this way). With gpusock
# that is at most its send ring plus its receive ring: 2 x 4 MiB, the rings
# a connection whose sizes nobody chose grows to (wire/socket/ring_budget.h).
python3 - "$W/client.json" "$W/server.json" "$BYTES" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1])); s = json.load(open(sys.argv[2])); want = int(sys.argv[3])
fails = 0
def check(cond, what):
    global fails
    print(("ok: " if cond else "FAIL: ") + what)
    fails += 0 if cond else 1
check("error" not in c and "error" not in s, "no error in either JSON report")
sent = c["end"]["sum_sent"]["bytes"]
recv_client_view = c["end"]["sum_received"]["bytes"]
recv_server = s["end"]["sum_received"]["bytes"]
window = 2 * 4 * 1024 * 1024
# iperf3's -n is "at least N bytes": the client checks the limit between its
# writes, so it may send a few more 128 KiB blocks (esnet/iperf#768, #1800;
# seen once in CI over fabric:tcp as one extra block). What must hold
# for gpusock is that the receiver counts what the sender sent, checked below.
burst = 10 * 128 * 1024
check(want <= sent <= want + burst, f"sender reports {sent} bytes sent (asked for {want}, at most {burst} more)")
check(recv_server == recv_client_view, f"receiver's count {recv_server} is the same in both reports")
check(0 <= sent - recv_server <= window,
      f"receiver counted {recv_server} bytes: all but {sent - recv_server} (<= {window}, gpusock's rings) in flight at TEST_END")
gbps = c["end"]["sum_sent"]["bits_per_second"] / 1e9
print(f"throughput {gbps:.2f} Gbit/s")
sys.exit(1 if fails else 0)
EOF
check "iperf3 JSON reports agree" test $? -eq 0
finish
