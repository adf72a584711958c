#!/usr/bin/env bash
# Installs every Debian package longhaul needs to build, test and run. Idempotent: packages that
# are already installed are left alone, so README, .ci/run and the Dockerfiles can all call it.
#
#   scripts/install-deps.sh            build + test dependencies
#   scripts/install-deps.sh --runtime  only the shared libraries the binaries need at run time
set -euo pipefail

build_packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libcpprest-dev libyaml-cpp-dev prometheus-cpp-dev libgtest-dev libgmock-dev libgloo-dev
  libprotobuf-dev protobuf-compiler nlohmann-json3-dev libcli11-dev libssl-dev zlib1g-dev
  libopenblas-dev python3 python3-venv
  clang  # only for the thread-safety check (ctest -L lint): clang++ -Wthread-safety
  prometheus  # only for tests: a real Prometheus scrapes the worker and operator (promtool too)
  etcd-server xz-utils  # only for tests: etcd under the real kube-apiserver (tests/envtest)
)
runtime_packages=(
  libcpprest2.10 libyaml-cpp0.7 libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0
  libgloo0 libprotobuf32 libopenblas0-pthread libssl3 zlib1g ca-certificates
)

packages=("${build_packages[@]}")
if [[ "${1:-}" == "--runtime" ]]; then packages=("${runtime_packages[@]}"); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
