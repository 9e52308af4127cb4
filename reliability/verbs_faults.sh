#!/usr/bin/env bash
# The fault tests (reliability_fault_tests) and the CPU soak over the verbs
# transport, inside the Soft-RoCE guest (scripts/rdma-vm): a server or client
# SIGKILLed mid-stream, a stalled reader, a backlog overflowing, on verbs.
# Not part of ctest: it boots a guest (minutes under TCG); run it by hand.
#   reliability/verbs_faults.sh [BUILD_DIR]     (default build/)
# Environment: GS_SOAK_CONNECTIONS, GS_SOAK_BYTES (the soak's sizes, defaults
# smaller than on the host: the guest is slow), GS_STALL_MS.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
for t in reliability_fault_tests reliability_soak_tests; do
  [ -x "$build/reliability/$t" ] || { echo "verbs_faults: build $build/reliability/$t first" >&2; exit 2; }
done
# shellcheck disable=SC2016  # expanded in the guest
exec scripts/rdma-vm --timeout 1500 --env GPUSOCK_TRANSPORT=verbs \
  --env GS_SOAK_CONNECTIONS="${GS_SOAK_CONNECTIONS:-100}" --env GS_SOAK_BYTES="${GS_SOAK_BYTES:-67108864}" \
  --env GS_STALL_MS="${GS_STALL_MS:-10000}" -- \
  bash -c 'export GPUSOCK_TEST_ADDR=$RDMA_VM_ADDR
           rc=0
           "$0/reliability/reliability_fault_tests" || rc=1
           "$0/reliability/reliability_soak_tests" || rc=1
           exit $rc' "$PWD/$build"
