#!/usr/bin/env bash
# Many connections in one process under the shim, every byte checked, and
# the process back to its descriptors when they are gone:
#   1. many_probe's single-threaded epoll echo server and CONNS clients
#      multiplexed through one epoll set in one process;
#   2. memcached with CONNS connections from memaslap (libevent, 4 threads),
#      every get verified (-v 1).
# A connection may cost at most 2 descriptors in each process: its number and
# its bell on fabric:shm, its number and libfabric's socket on fabric:tcp.
# Beside them a process shares a fixed 80 among all (fabric:shm: the first 64
# peers' connected ringers; the transports' helpers), and fabric:tcp has the
# 3 of each completion queue: one a connection by default (5 in all), or with
# CQ_SHARE (GPUSOCK_TCP_CQ_SHARE) one for each of the first CQ_SHARE
# connections, then one for every CQ_SHARE that a thread opens.
#   many_conns_test.sh TRANSPORT PORT CONNS [CQ_SHARE]
source "$(dirname "$0")/lib.sh"
need memcached memcaslap
export GPUSOCK_TRANSPORT=$1
PORT=$2
CONNS=$3
export GPUSOCK_TCP_CQ_SHARE=${4:-1}
W=$GS_WORK
share=$GPUSOCK_TCP_CQ_SHARE
if [ "$GPUSOCK_TRANSPORT" = fabric:shm ]; then
  per_conn=2 shared=80
elif [ "$share" -le 1 ]; then
  per_conn=5 shared=80
else
  per_conn=2 shared=$((80 + 3 * (share + CONNS / share + 4)))
fi
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
echo "== $CONNS connections over $GPUSOCK_TRANSPORT on port $PORT (fd limit $(ulimit -n), GPUSOCK_TCP_CQ_SHARE=$GPUSOCK_TCP_CQ_SHARE)"

per_conn_ok() {  # per_conn_ok FDS: within the transport's bound for CONNS connections
  [ "$1" -le $((CONNS * per_conn + shared)) ]
}

# 1. the epoll echo pair.
bg_shim "$MANY" server "$PORT" "$CONNS" >"$W/server.out" 2>"$W/server.err"
SERVER=$BG
sleep 0.5
env LD_PRELOAD="$PRELOAD" timeout 300 "$MANY" clients "$PORT" "$CONNS" 4096 >"$W/clients.out" 2>"$W/clients.err"
crc=$?
wait "$SERVER"
src=$?
cat "$W/clients.out" "$W/server.out"
check "clients exited 0" test "$crc" -eq 0
check "server exited 0" test "$src" -eq 0
for f in server-open clients-open; do
  n=$(awk -v k="$f" '$1 == "fds:" && $2 == k {print $3}' "$W/server.out" "$W/clients.out")
  echo "$f: ${n:-?} fds for $CONNS connections"
  check "$f: at most $per_conn fds a connection and $shared shared" per_conn_ok "${n:-999999}"
done

# 2. memcached and memaslap. memcached sets its descriptor limit to its -c,
# and gpusock's own descriptors count against it too.
MCPORT=$((PORT + 1))
# shellcheck disable=SC2046
GPUSOCK_LOG=info bg_shim memcached $(memcached_user_args) -U 0 -l 127.0.0.1 -p "$MCPORT" -t 4 -m 64 \
  -c $((CONNS * (per_conn + 1) + shared + 256)) >"$W/memcached.out" 2>"$W/memcached.err"
MC=$BG
check "memcached listens through gpusock" wait_log "$W/memcached.err" "listening on 127.0.0.1:$MCPORT via gpusock"
base=$(ls /proc/"$MC"/fd | wc -l)
env LD_PRELOAD="$PRELOAD" timeout 300 memcaslap -s "127.0.0.1:$MCPORT" -T 4 -c "$CONNS" -x $((CONNS * 40)) -v 1 \
  >"$W/memaslap.out" 2>&1 &
SLAP=$!
peak=0
while kill -0 "$SLAP" 2>/dev/null; do
  n=$(ls /proc/"$MC"/fd 2>/dev/null | wc -l)
  [ "$n" -gt "$peak" ] && peak=$n
  sleep 0.2
done
wait "$SLAP"
rc=$?
grep -E "cmd_get|get_misses|verify_|TPS" "$W/memaslap.out"
check "memaslap exit status 0" test "$rc" -eq 0
check "memaslap ran its operations" grep -q "TPS:" "$W/memaslap.out"
check "memaslap: every get verified (verify_failed 0)" grep -q "^verify_failed: 0$" "$W/memaslap.out"
check "memaslap: no verify misses" grep -q "^verify_misses: 0$" "$W/memaslap.out"
echo "memcached: $base fds before, $peak at most while $CONNS connections were open"
check "memcached: at most $per_conn fds a connection and $shared shared" per_conn_ok $((peak - base))
# Made at first use and kept: 4, one per epoll set (fabric:shm's sleep
# group: memcached's 4 workers and its main thread), and on fabric:shm the
# bells of the endpoints opened ahead (GPUSOCK_SHM_SPARES, 2).
kept=$((4 + 5 + 2))
after=$(ls /proc/"$MC"/fd | wc -l)
for _ in $(seq 50); do
  [ "$after" -le $((base + kept)) ] && break
  sleep 0.2
  after=$(ls /proc/"$MC"/fd | wc -l)
done
check "memcached: back to $base fds after the clients left ($after; $kept made at first use allowed)" test "$after" -le $((base + kept))
check "memcached still running" kill -0 "$MC"
kill -TERM "$MC"
wait "$MC"
check "memcached exited 0 after SIGTERM" test $? -eq 0
finish
