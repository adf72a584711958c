#!/usr/bin/env bash
# Creates the Python virtual environment that ONLY the tests use: the tools users read a worker's
# logdir with (`tensorboard` for event files, `safetensors` for checkpoints, `numpy`), Hugging
# Face's `tokenizers` (the independent byte-level BPE that prepare-data's GPT-2 ids are checked
# against), and the
# chart tests' tools (`helm-python-sdk`: Helm's own Go engine in a wheel, to render and lint the
# chart offline; `kubernetes-validate`: the Kubernetes OpenAPI schemas; `pyyaml`).
# Idempotent: an existing venv that already imports all of them is left alone.
#
#   scripts/setup-venv.sh            creates ${LONGHAUL_VENV:-<repo>/.venv}
#
# The build never needs it; tests/tools is skipped (with the reason printed) when it is absent.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${LONGHAUL_VENV:-$repo/.venv}"
packages=(tensorboard safetensors numpy tokenizers pytest helm-python-sdk kubernetes-validate pyyaml)
imports="import tensorboard, safetensors, numpy, tokenizers, pytest, helm_python, kubernetes_validate, yaml"

if [[ -x "$venv/bin/python" ]] &&
  "$venv/bin/python" -c "$imports" 2>/dev/null; then
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
"$venv/bin/python" -c "$imports; print('setup-venv: ok, tensorboard', tensorboard.__version__)"
