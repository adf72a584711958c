#!/usr/bin/env bash
# Runs logdir_test.py with the test venv's python (scripts/setup-venv.sh makes it). Without the
# venv the test is SKIPPED (exit 77) and says why; .ci/run always creates the venv first.
#   run_tools_test.sh <path to longhaul-worker>
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${LONGHAUL_VENV:-$here/../../.venv}"
if [[ ! -x "$venv/bin/python" ]] ||
  ! "$venv/bin/python" -c "import tensorboard, safetensors, numpy" 2>/dev/null; then
  echo "SKIPPED: no test venv with tensorboard + safetensors + numpy at $venv;" \
    "run scripts/setup-venv.sh (or set LONGHAUL_VENV)"
  exit 77
fi
exec "$venv/bin/python" "$here/logdir_test.py" --worker "$1"
