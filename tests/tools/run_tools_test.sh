#!/usr/bin/env bash
# Runs a test script of this folder with the test venv's python (scripts/setup-venv.sh makes it).
# Without the venv (or without a package the script needs) the test is SKIPPED (exit 77) and
# says why; .ci/run always creates the venv first.
#   run_tools_test.sh <path to longhaul-worker> [script.py (default logdir_test.py)]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${LONGHAUL_VENV:-$here/../../.venv}"
script="${2:-logdir_test.py}"
imports="import tensorboard, safetensors, numpy"
[[ "$script" != logdir_test.py ]] && imports="$imports, tokenizers"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "$imports" 2>/dev/null; then
  echo "SKIPPED: no test venv at $venv that can '$imports';" \
    "run scripts/setup-venv.sh (or set LONGHAUL_VENV)"
  exit 77
fi
exec "$venv/bin/python" "$here/$script" --worker "$1"
