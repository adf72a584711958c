#!/usr/bin/env bash
# The quick start's first command: installs what longhaul needs, builds it, and trains the `tiny`
# GPT preset on CPU on the embedded default corpus into runs/tiny, printing progress. Running it
# again resumes from the latest checkpoint in runs/tiny (delete the folder to start over).
#
#   scripts/run.sh [extra longhaul-worker train flags, e.g. --set training.max_steps=600]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
preset=${LONGHAUL_PRESET:-default}
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset" --target longhaul-worker
exec "build/$preset/worker/cli/longhaul-worker" train --logdir runs/tiny "$@"
