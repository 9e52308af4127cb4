#!/usr/bin/env bash
# Face verification end to end on one transport: Debian's memcached under the
# shim, the loader, then the servers side by side on the same memcached, each
# checked by fv_client against the CPU reference (identical verdicts and
# distances for all), misses answered "unknown identity", bad input
# (fv_bad_client) while a good client runs, and memcached killed and
# restarted: database errors during the outage, correct replies after.
#   face_verify_test.sh TRANSPORT BASE_PORT SERVER...   (SERVER: gpu hostcentric cpu)
# Environment from CTest: PRELOAD (the shim), BIN (the folder of the programs).
source "$(dirname "$0")/../../../../preload/tests/lib.sh"
need memcached
export GPUSOCK_TRANSPORT=$1
base=$2
shift 2
servers=("$@")
W=$GS_WORK
mc_port=$base
ids=300
common=(--identities "$ids" --seed 7)
echo "== face verification over $GPUSOCK_TRANSPORT: ${servers[*]}"

start_memcached() {
  # shellcheck disable=SC2046
  GPUSOCK_LOG=info bg_shim memcached $(memcached_user_args) -U 0 -l 127.0.0.1 -p "$mc_port" -t 2 -m 64 -c 512 \
    >"$W/memcached.out" 2>"$W/memcached$1.err"
  MC=$BG
  check "memcached$1 listens through gpusock" wait_log "$W/memcached$1.err" "listening on 127.0.0.1:$mc_port via gpusock"
}
load() {
  for size in 64 96; do
    env LD_PRELOAD="$PRELOAD" timeout 120 "$BIN/fv_load" --memcached "127.0.0.1:$mc_port" --size "$size" \
      "${common[@]}" --threads 2 >"$W/load.out" 2>&1
    check "fv_load stored $ids references of ${size}x${size}" grep -q "stored $ids references" "$W/load.out"
  done
}
# client NAME SERVER ARGS...: runs fv_client under the shim; its summary goes to the log.
client() {
  local name=$1 s=$2
  shift 2
  # shellcheck disable=SC2086
  env LD_PRELOAD="$PRELOAD" timeout 180 "$BIN/fv_client" --server "127.0.0.1:${port[$s]}" ${ports[$s]:-} \
    "${common[@]}" --pool 64 --label "$name" "$@" >"$W/client-$name.out" 2>&1
  local rc=$?
  grep -h "fv_client" "$W/client-$name.out"
  return $rc
}

declare -A port pid ports
start_server() {
  local s=$1 p=$2
  port[$s]=$p
  local cmd=()
  case $s in
    gpu)  # two proxies (ports p and p + 1): the clients spread over both
      cmd=("$BIN/fv_gpu_server" --host-backend --blocks 4 --threads 4 --conns 4 --proxies 2)
      ports[$s]="--ports 2" ;;
    hostcentric) cmd=("$BIN/fv_hostcentric_server" --host-backend --io-threads 2 --batch 8) ;;
    cpu) cmd=(env LD_PRELOAD="$PRELOAD" "$BIN/fv_cpu_server" --workers 2) ;;
  esac
  bg_plain "${cmd[@]}" --port "$p" --memcached "127.0.0.1:$mc_port" --mc-timeout-ms 2000 \
    >"$W/server-$s.out" 2>"$W/server-$s.err"
  pid[$s]=$BG
  check "$s server listens on $p" wait_log "$W/server-$s.out" "listening on port $p" 60
}

start_memcached ""
load
p=$((base + 1))
for s in "${servers[@]}"; do
  start_server "$s" $p
  p=$((p + 2))
done

for s in "${servers[@]}"; do
  client "$s-64" "$s" --conns 3 --requests 300 --size 64
  check "$s: 300 replies at 64x64 equal the CPU reference" test $? -eq 0
  check "$s: misses answered unknown identity" grep -qE "unknown [1-9]" "$W/client-$s-64.out"
  client "$s-96" "$s" --conns 2 --requests 60 --size 96 --rate 200
  check "$s: 60 open-loop replies at 96x96 equal the CPU reference" test $? -eq 0
  client "$s-mux" "$s" --conns 12 --mux 3 --requests 600 --size 64
  check "$s: 600 replies on 12 connections multiplexed by 3 epoll threads equal the CPU reference" test $? -eq 0
done

# Bad input while a good client runs on its own connections.
for s in "${servers[@]}"; do
  client "$s-beside-bad" "$s" --conns 2 --requests 200 --size 64 &
  good=$!
  env LD_PRELOAD="$PRELOAD" timeout 120 "$BIN/fv_bad_client" --server "127.0.0.1:${port[$s]}" --size 64 \
    >"$W/bad-$s.out" 2>&1
  rc=$?
  sed "s/^/  $s: /" "$W/bad-$s.out"
  check "$s: every bad-input case handled" test $rc -eq 0
  wait $good
  check "$s: the good client beside it got every reply right" test $? -eq 0
done

# memcached killed mid-run, then restarted and reloaded.
for s in "${servers[@]}"; do
  client "$s-across-kill" "$s" --conns 2 --duration 3 --size 64 --allow-db-errors &
  pid[$s-across]=$!
done
sleep 1
kill -KILL "$MC"
wait "$MC" 2>/dev/null
for s in "${servers[@]}"; do
  wait "${pid[$s-across]}"
  check "$s: across the kill every reply was right or a database error" test $? -eq 0
  client "$s-outage" "$s" --conns 2 --requests 10 --size 64 --expect-db-errors
  check "$s: while memcached is down every reply is a database error" test $? -eq 0
done
start_memcached "-restarted"
load
for s in "${servers[@]}"; do
  client "$s-after" "$s" --conns 3 --requests 200 --size 64
  check "$s: after the restart every reply is right again" test $? -eq 0
done

for s in "${servers[@]}"; do
  check "$s server still running" kill -0 "${pid[$s]}"
  kill -TERM "${pid[$s]}"
  wait "${pid[$s]}"
  check "$s server exited 0 after SIGTERM" test $? -eq 0
  grep -h "replies:" "$W/server-$s.out"
done
kill -TERM "$MC"
finish
