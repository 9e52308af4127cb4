#!/usr/bin/env bash
# Widely used servers and clients from Debian's packages, unmodified, under the
# shim (label "compat"; docs/preload.md, "Compatibility"). Each case starts the
# server as it is deployed (its own daemon mode, worker processes), runs its
# usual client against it with every byte checked, and, where the client
# reports a rate, runs the same client against the same server on kernel TCP
# for the ratio. One line "compat: PROGRAM | VERSION | TRANSPORT | CHECKED |
# RATIO" per case (also appended to $COMPAT_REPORT when set).
#   compat_test.sh CASE TRANSPORT PORT
#   CASE: nginx apache2 redis postgresql mosquitto python3-http
source "$(dirname "$0")/lib.sh"
CASE=$1
export GPUSOCK_TRANSPORT=$2
PORT=$3
W=$GS_WORK
chmod 755 "$W"
SHIM=(env LD_PRELOAD="$PRELOAD")

# shim_or_kernel MODE: the command prefix for MODE (shim or kernel).
prefix() { if [ "$1" = shim ]; then echo "env LD_PRELOAD=$PRELOAD"; else echo env; fi; }
report() {  # report PROGRAM VERSION CHECKED RATIO
  local line="compat: $1 | $2 | $GPUSOCK_TRANSPORT | $3 | $4"
  echo "$line"
  if [ -n "${COMPAT_REPORT:-}" ]; then echo "$line" >>"$COMPAT_REPORT"; fi
}
ratio() { awk -v g="$1" -v k="$2" 'BEGIN { if (k > 0 && g > 0) printf "%.2f", g / k; else print "n/a" }'; }
# wait_port PORT: until something accepts a kernel or gpusock connection (a
# shimmed probe: the server may be on either).
wait_up() {
  local i
  for i in $(seq 100); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.1
  done
  return 1
}
make_files() {
  mkdir -p "$W/www"
  head -c 20000000 /dev/urandom >"$W/www/big.bin"
  head -c 4096 /dev/urandom >"$W/www/small.bin"
  (cd "$W/www" && sha256sum big.bin small.bin >"$W/sums")
}
# fetch_check MODE TOOL: downloads big.bin with curl or wget, compares it.
fetch_check() {
  local mode=$1 tool=$2 out="$W/got.$2"
  rm -f "$out"
  if [ "$tool" = curl ]; then
    $(prefix "$mode") timeout 60 curl -s -o "$out" "http://127.0.0.1:$PORT/big.bin"
  else
    $(prefix "$mode") timeout 60 wget -q -O "$out" "http://127.0.0.1:$PORT/big.bin"
  fi
  [ "$(sha256sum <"$out" | cut -d' ' -f1)" = "$(grep big.bin "$W/sums" | cut -d' ' -f1)" ]
}
# curl_rate MODE: bytes/s of one 20 MB download, as curl reports it.
curl_rate() { $(prefix "$1") timeout 60 curl -s -o /dev/null -w '%{speed_download}' "http://127.0.0.1:$PORT/big.bin"; }
# ab_rate MODE [-k]: requests/s of ab (apache2-utils) on the small file: 500
# requests with a connection each (a connection costs gpusock a new endpoint
# and rings: docs/preload.md), or with -k 2000 on kept-alive connections.
ab_rate() {
  local mode=$1
  shift
  local out="$W/ab.$mode${1:-}" n=500  # ab.shim, ab.shim-k: both kept for a failed run
  [ "${1:-}" = -k ] && n=2000
  $(prefix "$mode") timeout 120 ab -q -n "$n" -c 4 "$@" "http://127.0.0.1:$PORT/small.bin" >"$out" 2>&1
  grep -q '^Failed requests: *0$' "$out" || { echo 0; return; }
  awk '/^Requests per second/ { print $4 }' "$out"
}
# http_clients NAME VERSION: curl and wget byte checks, curl and ab rates (shim
# against kernel); the server is started by start_server MODE, stopped by stop_server.
http_case() {
  local name=$1 version=$2 k g ka ga kk gk
  start_server kernel
  check "$name on kernel TCP serves" wait_up curl -sf -o /dev/null "http://127.0.0.1:$PORT/small.bin"
  k=$(curl_rate kernel)
  ka=$(ab_rate kernel)
  kk=$(ab_rate kernel -k)
  stop_server
  start_server shim
  check "$name under the shim serves" wait_up "${SHIM[@]}" curl -sf -o /dev/null "http://127.0.0.1:$PORT/small.bin"
  check "$name: no kernel TCP listener on $PORT (fabric:shm)" \
    bash -c "[ $GPUSOCK_TRANSPORT != fabric:shm ] || ! ss -Htln 'sport = :$PORT' | grep -q ."
  check "$name + curl: 20 MB byte-exact (sha256)" fetch_check shim curl
  check "$name + wget: 20 MB byte-exact (sha256)" fetch_check shim wget
  g=$(curl_rate shim)
  ga=$(ab_rate shim)
  check "$name + ab: 500 connections, 0 failed" awk -v r="$ga" 'BEGIN { exit !(r > 0) }'
  gk=$(ab_rate shim -k)
  check "$name + ab -k: 2000 requests, 0 failed" awk -v r="$gk" 'BEGIN { exit !(r > 0) }'
  stop_server
  report "$name" "$version" "curl, wget: 20 MB sha256; ab 500 connections, ab -k 2000 requests: 0 failed" \
    "curl $(ratio "$g" "$k"), ab $(ratio "$ga" "$ka"), ab -k $(ratio "$gk" "$kk")"
  report curl "$(curl --version | head -1 | cut -d' ' -f2)" "20 MB from $name, sha256" "$(ratio "$g" "$k")"
  report wget "$(wget --version | head -1 | cut -d' ' -f3)" "20 MB from $name, sha256" "n/a (reports no rate)"
}

case "$CASE" in
nginx)
  need nginx curl wget ab ss
  make_files
  start_server() {
    mkdir -p "$W/nginx-$1/logs"
    cat >"$W/nginx.conf" <<EOF
user root;
worker_processes 2;
daemon on;
pid $W/nginx-$1/nginx.pid;
error_log $W/nginx-$1/error.log;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path $W/nginx-$1/body;
  proxy_temp_path $W/nginx-$1/proxy;
  fastcgi_temp_path $W/nginx-$1/fastcgi;
  uwsgi_temp_path $W/nginx-$1/uwsgi;
  scgi_temp_path $W/nginx-$1/scgi;
  server { listen 127.0.0.1:$PORT; root $W/www; }
}
EOF
    $(prefix "$1") nginx -c "$W/nginx.conf" -p "$W/nginx-$1" -e "$W/nginx-$1/error.log"
    NGINX_PID_FILE=$W/nginx-$1/nginx.pid
  }
  stop_server() {
    local pid
    pid=$(cat "$NGINX_PID_FILE" 2>/dev/null)
    [ -n "$pid" ] && kill -QUIT "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  }
  http_case nginx "$(nginx -v 2>&1 | cut -d/ -f2)"
  check "nginx: master and 2 workers, no error storm in its log" \
    bash -c "[ \$(wc -l <$W/nginx-shim/error.log) -lt 20 ]"
  ;;
apache2)
  need apache2 curl wget ab ss
  make_files
  start_server() {
    mkdir -p "$W/apache-$1"
    cat >"$W/apache2.conf" <<EOF
ServerRoot $W/apache-$1
ServerName localhost
Listen 127.0.0.1:$PORT
PidFile $W/apache-$1/httpd.pid
ErrorLog $W/apache-$1/error.log
LogLevel warn
LoadModule mpm_prefork_module /usr/lib/apache2/modules/mod_mpm_prefork.so
LoadModule authz_core_module /usr/lib/apache2/modules/mod_authz_core.so
StartServers 3
MinSpareServers 2
MaxSpareServers 4
User www-data
Group www-data
DocumentRoot $W/www
<Directory $W/www>
  Require all granted
</Directory>
EOF
    chmod -R a+rX "$W/www"
    $(prefix "$1") apache2 -f "$W/apache2.conf" -k start
    APACHE_PID_FILE=$W/apache-$1/httpd.pid
  }
  stop_server() {
    local pid
    for _ in $(seq 50); do [ -s "$APACHE_PID_FILE" ] && break; sleep 0.1; done
    pid=$(cat "$APACHE_PID_FILE" 2>/dev/null)
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  }
  if [ "$GPUSOCK_TRANSPORT" = fabric:shm ] && [ "$(id -u)" = 0 ]; then
    echo "apache2 switches its children to www-data: fabric:shm connects processes of one user only"
    exit 77
  fi
  http_case apache2 "$(apache2 -v | head -1 | sed 's/.*Apache\///; s/ .*//')"
  ;;
python3-http)
  PY=/usr/bin/python3  # Debian's
  need "$PY" curl wget ab ss
  make_files
  start_server() {
    $(prefix "$1") "$PY" -m http.server "$PORT" --bind 127.0.0.1 -d "$W/www" >"$W/python-$1.log" 2>&1 &
    PY_PID=$!
    GS_PIDS+=("$PY_PID")
  }
  stop_server() {
    kill "$PY_PID" 2>/dev/null
    wait "$PY_PID" 2>/dev/null
  }
  http_case "python3 -m http.server" "$("$PY" --version | cut -d' ' -f2)"
  ;;
redis)
  need redis-server redis-cli redis-benchmark
  start_server() {
    $(prefix "$1") redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
      --pidfile "$W/redis-$1.pid" --logfile "$W/redis-$1.log" --dir "$W"
  }
  stop_server() {
    local pid
    pid=$(cat "$W/redis-$1.pid" 2>/dev/null)
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  }
  bench() {
    $(prefix "$1") timeout 60 redis-benchmark -p "$PORT" -q -n 20000 -c 4 -t set,get --csv 2>/dev/null |
      awk -F'","' '/"GET"/ { print $2 }'
  }
  start_server kernel
  check "redis on kernel TCP answers" wait_up redis-cli -p "$PORT" ping
  k=$(bench kernel)
  stop_server kernel
  start_server shim
  check "redis (daemonized) under the shim answers" wait_up "${SHIM[@]}" redis-cli -p "$PORT" ping
  head -c 1000000 /dev/urandom | base64 -w0 >"$W/value"
  "${SHIM[@]}" redis-cli -p "$PORT" -x set big <"$W/value" >/dev/null
  "${SHIM[@]}" redis-cli -p "$PORT" --raw get big | head -c -1 >"$W/value.back"
  check "redis-cli: 1.3 MB value set and read back byte-exact" cmp -s "$W/value" "$W/value.back"
  g=$(bench shim)
  check "redis-benchmark: GET rate reported" test -n "$g"
  # A BGSAVE forks a child that inherits the listener: the server goes on serving.
  "${SHIM[@]}" redis-cli -p "$PORT" config set dir "$W" >/dev/null
  "${SHIM[@]}" redis-cli -p "$PORT" bgsave >/dev/null
  sleep 0.5
  check "redis after a BGSAVE fork: value still byte-exact" \
    bash -c "'${SHIM[0]}' '${SHIM[1]}' redis-cli -p $PORT --raw get big | head -c -1 | cmp -s - $W/value"
  stop_server shim
  report redis-server "$(redis-server --version | sed 's/.*v=//; s/ .*//')" \
    "redis-cli 1.3 MB value sha; redis-benchmark set/get 20000 each; BGSAVE fork" "$(ratio "$g" "$k")"
  ;;
postgresql)
  BIN=/usr/lib/postgresql/15/bin
  need "$BIN/postgres" "$BIN/pgbench" runuser
  id postgres >/dev/null 2>&1 || { echo "no postgres user"; exit 77; }
  chown postgres "$W"
  PG=(runuser -u postgres --)
  "${PG[@]}" "$BIN/initdb" -D "$W/pgdata" -A trust >/dev/null
  start_server() {
    "${PG[@]}" $(prefix "$1") "$BIN/pg_ctl" -D "$W/pgdata" -l "$W/pg-$1.log" -w \
      -o "-p $PORT -k $W -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null
  }
  stop_server() { "${PG[@]}" "$BIN/pg_ctl" -D "$W/pgdata" -m fast -w stop >/dev/null; }
  bench() {
    "${PG[@]}" $(prefix "$1") timeout 60 "$BIN/pgbench" -h 127.0.0.1 -p "$PORT" -c 4 -j 2 -T 5 postgres 2>&1 |
      tee "$W/pgbench-$1.out" | awk '/^tps/ { print $3 }'
  }
  start_server kernel
  "${PG[@]}" "$BIN/pgbench" -h 127.0.0.1 -p "$PORT" -i -s 2 postgres >/dev/null 2>&1
  k=$(bench kernel)
  stop_server
  start_server shim
  check "postgres under the shim (postmaster accepts, a backend per connection)" \
    wait_up "${PG[@]}" "${SHIM[@]}" "$BIN/psql" -h 127.0.0.1 -p "$PORT" -c 'select 1' postgres
  g=$(bench shim)
  check "pgbench: transactions done, none failed" \
    bash -c "grep -q 'number of failed transactions: 0' $W/pgbench-shim.out && test -n '$g'"
  sum1=$("${PG[@]}" "${SHIM[@]}" "$BIN/psql" -At -h 127.0.0.1 -p "$PORT" -c \
    "select (select sum(abalance) from pgbench_accounts) = (select sum(bbalance) from pgbench_branches)
       and (select sum(bbalance) from pgbench_branches) = (select sum(tbalance) from pgbench_tellers)" postgres)
  check "pgbench: account, branch and teller balances agree" test "$sum1" = t
  stop_server
  report postgresql "$("$BIN/postgres" --version | awk '{print $3}')" \
    "pgbench -c 4 -T 5 (0 failed), balances agree" "$(ratio "$g" "$k")"
  report pgbench "$("$BIN/pgbench" --version | awk '{print $3}')" "its own benchmark against postgresql" \
    "$(ratio "$g" "$k")"
  ;;
mosquitto)
  need mosquitto mosquitto_pub mosquitto_sub
  : >"$W/subscriptions.log"
  chmod 666 "$W/subscriptions.log"  # mosquitto started as root writes it as its own user
  cat >"$W/mosquitto.conf" <<EOF
listener $PORT 127.0.0.1
allow_anonymous true
persistence false
log_dest file $W/subscriptions.log
log_type subscribe
EOF
  "${SHIM[@]}" mosquitto -c "$W/mosquitto.conf" >"$W/mosquitto.log" 2>&1 &
  GS_PIDS+=($!)
  check "mosquitto under the shim" wait_up "${SHIM[@]}" mosquitto_pub -p "$PORT" -t probe -m x
  seq 1 2000 | sed 's/$/ some payload for the broker/' >"$W/msgs"
  # The broker drops what is published before the subscription exists: wait
  # for it in the broker's log (a fixed sleep lost the first messages on a
  # loaded machine).
  "${SHIM[@]}" timeout 30 mosquitto_sub -p "$PORT" -t t/1 -q 1 -C 2000 >"$W/got" &
  sub=$!
  check "mosquitto_sub subscribed to t/1" wait_log "$W/subscriptions.log" " 1 t/1"
  "${SHIM[@]}" timeout 30 mosquitto_pub -p "$PORT" -t t/1 -q 1 -l <"$W/msgs"
  wait "$sub"
  check "mosquitto_pub -> mosquitto -> mosquitto_sub: 2000 QoS 1 messages in order, byte-exact" \
    cmp -s "$W/msgs" "$W/got"
  head -c 200000 /dev/urandom >"$W/blob"
  "${SHIM[@]}" timeout 30 mosquitto_sub -p "$PORT" -t t/2 -C 1 -N >"$W/blob.got" &
  sub=$!
  check "mosquitto_sub subscribed to t/2" wait_log "$W/subscriptions.log" " 0 t/2"
  "${SHIM[@]}" timeout 30 mosquitto_pub -p "$PORT" -t t/2 -f "$W/blob"
  wait "$sub"
  check "mosquitto: a 200 KB binary message byte-exact" cmp -s "$W/blob" "$W/blob.got"
  report mosquitto "$(mosquitto -h | head -1 | awk '{print $3}')" \
    "mosquitto_pub/sub: 2000 QoS 1 messages and 200 KB binary, compared" "n/a (clients report no rate)"
  ;;
*)
  echo "unknown case $CASE"
  exit 2
  ;;
esac
finish
