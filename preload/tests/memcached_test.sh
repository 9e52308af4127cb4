#!/usr/bin/env bash
# memcached (its default libevent epoll loop) served under the shim, driven by
# libmemcached-tools under the shim: memccapable, memcslap, memccp/memccat.
#   memcached_test.sh TRANSPORT PORT
source "$(dirname "$0")/lib.sh"
need memcached memccapable memcslap memccp memccat ss sha256sum
export GPUSOCK_TRANSPORT=$1
PORT=$2
W=$GS_WORK
echo "== memcached over $GPUSOCK_TRANSPORT on port $PORT"

# shellcheck disable=SC2046
GPUSOCK_LOG=info bg_shim memcached $(memcached_user_args) -U 0 -l 127.0.0.1 -p "$PORT" -t 2 -m 64 -c 256 \
  >"$W/memcached.out" 2>"$W/memcached.err"
MC=$BG
check "memcached listens through gpusock" wait_log "$W/memcached.err" "listening on 127.0.0.1:$PORT via gpusock"

# The bytes go through gpusock, not the kernel's TCP stack.
if [ "$GPUSOCK_TRANSPORT" = fabric:shm ]; then
  check "no kernel TCP socket listens on $PORT (ss -tln)" bash -c "! ss -Htln 'sport = :$PORT' | grep -q ."
fi
reply=$(kernel_version_reply "$PORT")
check "a plain kernel TCP client gets no memcached reply (got '${reply//$'\r'/}')" test -z "$reply"

# memccapable: every check of the protocol suite.
GPUSOCK_LOG=info env LD_PRELOAD="$PRELOAD" timeout 120 memccapable -h 127.0.0.1 -p "$PORT" -t 10 \
  >"$W/memccapable.out" 2>"$W/memccapable.err"
rc=$?
tail -n 3 "$W/memccapable.out"
check "memccapable exit status 0" test "$rc" -eq 0
check "memccapable: All tests passed" grep -q "All tests passed" "$W/memccapable.out"
check "memccapable: no failed check" bash -c "! grep -E '\[(FAIL|fail)' '$W/memccapable.out'"
check "memccapable connected through gpusock" grep -q "connect 127.0.0.1:$PORT via gpusock" "$W/memccapable.err"

# memcslap: a bounded load (set, get, binary mget) with concurrent connections.
for t in set get; do
  env LD_PRELOAD="$PRELOAD" timeout 120 memcslap -s "127.0.0.1:$PORT" -c 4 -e 2000 -t "$t" >"$W/slap-$t.out" 2>&1
  rc=$?
  grep -E "Time to|Time total" "$W/slap-$t.out"
  check "memcslap -t $t -c 4 -e 2000 exit status 0" test "$rc" -eq 0
  check "memcslap -t $t reported its run" grep -q "Time to $t" "$W/slap-$t.out"
done
env LD_PRELOAD="$PRELOAD" timeout 120 memcslap -s "127.0.0.1:$PORT" -b -c 2 -e 500 -t mget >"$W/slap-mget.out" 2>&1
rc=$?
check "memcslap -b -t mget exit status 0" test "$rc" -eq 0

# memccp / memccat round-trip files (binary, text, near the 1 MB item limit).
mkdir -p "$W/in" "$W/out"
head -c 300000 /dev/urandom >"$W/in/random.bin"
head -c 900000 /dev/urandom >"$W/in/large.bin"
seq 1 5000 >"$W/in/text.txt"
(cd "$W/in" && env LD_PRELOAD="$PRELOAD" timeout 60 memccp --servers="127.0.0.1:$PORT" random.bin large.bin text.txt)
check "memccp stored 3 files" test $? -eq 0
for f in random.bin large.bin text.txt; do
  (cd "$W/out" && env LD_PRELOAD="$PRELOAD" timeout 60 memccat --servers="127.0.0.1:$PORT" --file="$f" "$f")
  a=$(sha256sum <"$W/in/$f" | cut -c1-64)
  b=$(sha256sum <"$W/out/$f" 2>/dev/null | cut -c1-64)
  check "memccat $f: sha256 ${a:0:16}... round-trips" test "$a" = "$b"
done

check "memcached still running" kill -0 "$MC"
kill -TERM "$MC"
wait "$MC"
check "memcached exited 0 after SIGTERM" test $? -eq 0
finish
