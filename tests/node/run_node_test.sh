#!/usr/bin/env bash
# Runs the real-node suites (node_harness_test.py, user_path_test.py) with the project's test
# venv. Exit 77 (ctest: Skipped) with the reason when the venv does not exist; the suites skip
# themselves, saying what is missing, when the machine cannot run a node (not root, no
# containerd, no kubelet binary, ...).
#
#   tests/node/run_node_test.sh FILE_test.py... [pytest args]   venv: ${LONGHAUL_VENV:-<repo>/.venv}
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=SCRIPTDIR/../support/shell/find_venv.sh
source "$here/../support/shell/find_venv.sh"  # sets venv and python, or exits 77
cd "$here"
exec "$python" -m pytest -q -p no:cacheprovider -rs "$@"
