#!/usr/bin/env bash
# Creates the Python virtual environment that ONLY the tests use to read a worker's logdir with
# the tools users run: `tensorboard` (event files), `safetensors` (checkpoints) and `numpy`.
# Idempotent: an existing venv that already imports all three is left alone.
#
#   scripts/setup-venv.sh            creates ${LONGHAUL_VENV:-<repo>/.venv}
#
# The build never needs it; tests/tools is skipped (with the reason printed) when it is absent.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LONGHAUL_VENV:-$repo/.venv}"
packages=(tensorboard safetensors numpy pytest)

if [[ -x "$venv/bin/python" ]] &&
  "$venv/bin/python" -c "import tensorboard, safetensors, numpy, pytest" 2>/dev/null; then
  echo "setup-venv: $venv already has ${packages[*]}"
  exit 0
fi

python="${PYTHON:-python3}"
if ! "$python" -m venv --help >/dev/null 2>&1; then
  echo "setup-venv: $python has no venv module; run scripts/install-deps.sh (python3-venv)" >&2
  exit 1
fi
echo "setup-venv: creating $venv with ${packages[*]}"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${packages[@]}"
"$venv/bin/python" -c "import tensorboard, safetensors, numpy, pytest; print('setup-venv: ok', tensorboard.__version__)"
