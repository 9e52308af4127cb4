#!/usr/bin/env bash
# gpusock reads its settings in one place (wire/config.cc): no other source of
# the library, the proxy, the shim or the public headers calls getenv or
# setenv, and every GPUSOCK_* variable the docs name is in the table.
#   settings_read_once_test.sh SOURCE_DIR
set -uo pipefail
cd "$1" || exit 1
fail=0
readers=$(grep -rnE '\b(secure_)?getenv\(|\bsetenv\(' wire proxy preload include \
  --include='*.cc' --include='*.h' --include='*.cuh' --include='*.cu' |
  grep -vE '^wire/config\.cc:|/tests/|/fuzz/|CUDA_MODULE_LOADING' || true)
if [ -n "$readers" ]; then
  echo "FAIL: settings read outside wire/config.cc:"
  echo "$readers"
  fail=1
else
  echo "ok: no getenv/setenv outside wire/config.cc"
fi
table=$(grep -oE '"GPUSOCK_[A-Z0-9_]+"' wire/config.cc | tr -d '"' | sort -u)
# (docs/gpu-initiated.md is a design not built; -DGPUSOCK_* are CMake options.)
for name in $(grep -rhoE '(^|[^D])GPUSOCK_[A-Z0-9_]+=' README.md $(ls docs/*.md | grep -v gpu-initiated) |
  grep -oE 'GPUSOCK_[A-Z0-9_]+' | sort -u); do
  grep -qx "$name" <<<"$table" || { echo "FAIL: $name is documented but not in the table"; fail=1; }
done
[ "$fail" -eq 0 ] && echo "ok: every documented GPUSOCK_* variable is in the table"
exit "$fail"
