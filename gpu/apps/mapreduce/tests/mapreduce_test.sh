#!/usr/bin/env bash
# mapreduce_test.sh MAPREDUCE JOB WORKERS threads|processes PORT [ARGS...]: one
# MapReduce job on the host backend, WORKERS emulated GPUs in one process or
# one process each; passes when every worker checked its part of the result
# against the CPU reference.
set -uo pipefail
bin=$1 job=$2 workers=$3 mode=$4 port=$5
shift 5
if [ "$mode" = threads ]; then
  timeout 240 "$bin" --host-backend --job "$job" --gpus "$workers" --port "$port" "$@"
  exit $?
fi
pids=()
for ((r = 0; r < workers; ++r)); do
  timeout 240 "$bin" --host-backend --job "$job" --rank "$r" --ranks "$workers" --port "$port" "$@" &
  pids+=("$!")
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
