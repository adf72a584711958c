#!/usr/bin/env bash
# The quick start's second command: installs the build and test dependencies (Debian packages and
# a Python virtual environment with the tools users read the logdir with), builds everything with
# warnings as errors, and runs every test suite.
#
#   scripts/test.sh                 all suites (about 25-35 minutes on 2 cores, the real node included)
#   scripts/test.sh -LE slow        only the fast suites (about a minute)
#   scripts/test.sh -R Checkpoint   any ctest filter
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
scripts/setup-venv.sh
preset=${LONGHAUL_PRESET:-ci}
cmake --preset "$preset"
cmake --build --preset "$preset"
ctest --preset "$preset" "$@"
