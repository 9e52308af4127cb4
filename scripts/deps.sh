# shellcheck shell=bash
# Sourced by scripts/*: installs missing Debian packages, quietly and only when
# something is missing. Works as root, or through sudo.
#
#   gs_need_packages pkg...   install whichever of pkg... is not installed
#   gs_section "title"        a section header in the output

# What configuring and building the whole tree needs (tests and benchmarks are
# on by default, so GTest and Google Benchmark are part of it).
GS_BUILD_PACKAGES=(cmake ninja-build g++ pkg-config libfabric-dev libfabric-bin librdmacm-dev libibverbs-dev
                   rdmacm-utils libgtest-dev libbenchmark-dev)
# scripts/test adds the libFuzzer toolchain.
# shellcheck disable=SC2034  # used by the scripts that source this file
# The shim and interop tests drive unmodified programs from Debian's packages.
# The compatibility programs (label compat, docs/preload.md): servers and the
# clients they are used with.
GS_COMPAT_PACKAGES=(nginx-light apache2 apache2-utils redis-server redis-tools postgresql mosquitto
                    mosquitto-clients curl wget python3 iproute2)
GS_TEST_PACKAGES=("${GS_BUILD_PACKAGES[@]}" clang libclang-rt-14-dev clang-format-14 memcached libmemcached-tools iperf3
                  "${GS_COMPAT_PACKAGES[@]}")

gs_section() {
  printf '\n==== %s ====\n' "$*"
}

_gs_is_installed() {
  dpkg-query -W -f='${Status}\n' "$1" 2>/dev/null | grep -q ' installed$'
}

# Runs a command as root: directly when we are root, else through sudo.
_gs_as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "deps: need root or sudo to run: $*" >&2
    return 1
  fi
}

# Captures apt's chatter and shows it only if the command fails.
_gs_apt_quiet() {
  local log rc=0
  log=$(mktemp)
  _gs_as_root env DEBIAN_FRONTEND=noninteractive "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "deps: '$*' failed (exit $rc):" >&2
    tail -n 40 "$log" >&2
  fi
  rm -f "$log"
  return "$rc"
}

gs_need_packages() {
  local missing=() pkg
  if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
    echo "deps: not a Debian system (no dpkg/apt-get); make sure these are installed: $*" >&2
    return 0
  fi
  for pkg in "$@"; do
    _gs_is_installed "$pkg" || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -eq 0 ]; then
    echo "deps: all ${#} packages present"
    return 0
  fi
  echo "deps: installing ${missing[*]}"
  # One `apt-get update` per run, shared with scripts this one starts.
  if [ "${GS_APT_UPDATED:-0}" != 1 ]; then
    _gs_apt_quiet apt-get -q update || return 1
    export GS_APT_UPDATED=1
  fi
  _gs_apt_quiet apt-get -q -y -o Dpkg::Use-Pty=0 install --no-install-recommends "${missing[@]}" || return 1
  echo "deps: installed ${#missing[@]} package(s)"
}
