#!/usr/bin/env bash
# Runs the chart and image tests (chart_test.py, images_test.py) with the project's test venv.
# Exit 77 (ctest: Skipped) with the reason when the venv does not exist; a venv that lacks the
# Helm SDK or the validators FAILS, naming the packages, because a silent pass would hide a
# broken chart.
#
#   tests/chart/run_chart_test.sh [FILE_test.py ...] [pytest args]   venv: ${LONGHAUL_VENV:-<repo>/.venv}
# Without test files it runs chart_test.py and images_test.py.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/../support/shell/find_venv.sh
source "$here/../support/shell/find_venv.sh"  # sets venv and python, or exits 77
if ! "$python" -c "import helm_python, kubernetes_validate, jsonschema, yaml, pytest" 2>/dev/null; then
  echo "FAILED: $venv lacks the chart test's packages; scripts/setup-venv.sh must install:" >&2
  echo "  helm-python-sdk kubernetes-validate pyyaml pytest (jsonschema comes with kubernetes-validate)" >&2
  "$python" -c "import helm_python, kubernetes_validate, jsonschema, yaml, pytest" >&2 || true
  exit 1
fi
cd "$here"
files=()
while (($#)) && [[ "$1" == *_test.py ]]; do files+=("$1"); shift; done
if ((${#files[@]} == 0)); then files=(chart_test.py images_test.py); fi
exec "$python" -m pytest -q -p no:cacheprovider -rs "${files[@]}" "$@"
