#!/usr/bin/env bash
# Benchmarks on a real node (bench/node_bench.py): the time from `kubectl apply -k` of
# examples/trainingjob-tiny.yaml to its first training step, and recovery from a lost replica
# (fault -> next completed step) under restartScope Replica and Group, with the defaults a user
# gets. Needs what the real-node tests need (root, containerd, runc, the CNI plugins; see
# tests/node/README.md), a build with longhaul-envtest and the images made by
# scripts/build-images.sh --worker cpu (the test suite's fixtures write them to <build>/images).
#
#   sudo bench/node_bench.sh [--build-dir build/ci] [--runs 3] [--only startup|recovery]
#                            [--scopes Replica,Group] [--faults "worker SIGKILL,..."] [--lose-at 120]
#
# Prints two tables; results are recorded in bench/README.md.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$here/../build/ci"
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build="$(realpath "$2")"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
envtest="$build/tests/envtest/longhaul-envtest"
if [[ ! -x "$envtest" ]]; then
  echo "$0: no $envtest; build it first: cmake --build $build --target longhaul-envtest" >&2
  exit 2
fi
# shellcheck source=SCRIPTDIR/../tests/support/shell/find_venv.sh
source "$here/../tests/support/shell/find_venv.sh"
export LONGHAUL_ENVTEST="$envtest" LONGHAUL_BINARY_DIR="$build"
export LONGHAUL_IMAGES_DIR="${LONGHAUL_IMAGES_DIR:-$build/images}"
exec "$python" "$here/node_bench.py" "${args[@]}"
