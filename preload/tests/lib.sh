# shellcheck shell=bash
# Helpers of the preload tests (sourced). Environment from CTest:
#   PRELOAD  path of libgpusock_preload.so
#   PROBE    path of the preload_probe test program
set -u
export LC_ALL=C

GS_PIDS=()
GS_WORK=$(mktemp -d "${TMPDIR:-/tmp}/gs-preload.XXXXXX")
GS_FAILS=0

gs_cleanup() {
  local pid
  for pid in "${GS_PIDS[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  if [ "${GS_KEEP_WORK:-0}" = 1 ] || [ "$GS_FAILS" -ne 0 ]; then
    echo "(work files kept in $GS_WORK)"
  else
    rm -rf "$GS_WORK"
  fi
}
trap gs_cleanup EXIT

ok() { echo "ok: $*"; }
fail() {
  echo "FAIL: $*"
  GS_FAILS=$((GS_FAILS + 1))
}
check() {  # check "what" command...
  local what=$1
  shift
  if "$@"; then ok "$what"; else fail "$what"; fi
}
finish() {
  if [ "$GS_FAILS" -ne 0 ]; then
    echo "$GS_FAILS check(s) failed"
    exit 1
  fi
  echo "all checks passed"
  exit 0
}
need() {
  local c
  for c in "$@"; do
    if ! command -v "$c" >/dev/null 2>&1; then
      echo "missing $c (install memcached libmemcached-tools iperf3 iproute2)"
      exit 77  # SKIP_RETURN_CODE
    fi
  done
}

# Runs a command under the shim in the background; its pid goes to GS_PIDS and $BG.
bg_shim() {
  env LD_PRELOAD="$PRELOAD" "$@" &
  BG=$!
  GS_PIDS+=("$BG")
}
bg_plain() {
  "$@" &
  BG=$!
  GS_PIDS+=("$BG")
}

# wait_log FILE PATTERN [SECONDS]: until a line matches.
wait_log() {
  local file=$1 pattern=$2 limit=${3:-20} i
  for ((i = 0; i < limit * 20; ++i)); do
    grep -q -- "$pattern" "$file" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "no '$pattern' in $file after ${limit}s:"
  tail -n 20 "$file"
  return 1
}

# Is a kernel TCP socket listening on 127.0.0.1:PORT?
kernel_listening() {
  ss -Htln "sport = :$1" 2>/dev/null | grep -q .
}

# A plain kernel TCP client (no shim) sends a memcached "version" request;
# prints the reply, if any.
kernel_version_reply() {
  timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf 'version\r\n' >&3 && timeout 1 head -c 7 <&3" 2>/dev/null
}

memcached_user_args() {
  if [ "$(id -u)" = 0 ]; then echo "-u root"; fi
}

# Counts lines matching PATTERN in FILE.
count_lines() {
  grep -c -- "$2" "$1" 2>/dev/null || true
}
