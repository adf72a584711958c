#!/usr/bin/env bash
# Runs the real-node suites (node_harness_test.py, user_path_test.py) with the project's test
# venv. Exit 77 (ctest: Skipped) with the reason when the venv does not exist; the suites skip
# themselves, saying what is missing, when the machine cannot run a node (not root, no
# containerd, no kubelet binary, ...).
#
#   tests/node/run_node_test.sh FILE_test.py... [pytest args]   venv: ${LONGHAUL_VENV:-<repo>/.venv}
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
venv="${LONGHAUL_VENV:-$repo/.venv}"
[[ "$venv" = /* ]] || venv="$PWD/$venv"
python="$venv/bin/python"

if [[ ! -x "$python" ]]; then
  echo "SKIPPED: no Python venv at $venv; create it with scripts/setup-venv.sh"
  exit 77
fi
cd "$here"
exec "$python" -m pytest -q -p no:cacheprovider -rs "$@"
