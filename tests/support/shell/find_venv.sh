# shellcheck shell=bash
# Sourced by the Python suites' runners (tests/chart/run_chart_test.sh, tests/node/run_node_test.sh):
# sets `python` to the project's test venv's interpreter, ${LONGHAUL_VENV:-<repo>/.venv} (a
# relative LONGHAUL_VENV is taken from the current folder), and `venv` to that venv; exits 77
# (ctest: Skipped) saying how to create it when it does not exist.
venv="${LONGHAUL_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)/.venv}"
[[ "$venv" = /* ]] || venv="$PWD/$venv"
python="$venv/bin/python"

if [[ ! -x "$python" ]]; then
  echo "SKIPPED: no Python venv at $venv; create it with scripts/setup-venv.sh"
  exit 77
fi
