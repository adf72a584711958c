#!/usr/bin/env bash
# Installs every Debian package longhaul needs to build, test and run. Idempotent: packages that
# are already installed are left alone, so README, .ci/run and the Dockerfiles can all call it.
#
#   scripts/install-deps.sh            build + test dependencies (README, scripts/test.sh, CI)
#   scripts/install-deps.sh --build    only what building needs (the images' build stages)
#   scripts/install-deps.sh --runtime [worker|operator]
#                                      only the shared libraries the binaries (or one of them)
#                                      need at run time
set -euo pipefail

build_packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libcpprest-dev libyaml-cpp-dev prometheus-cpp-dev libgtest-dev libgmock-dev libgloo-dev
  libprotobuf-dev protobuf-compiler nlohmann-json3-dev libcli11-dev libssl-dev zlib1g-dev
  libopenblas-dev python3 python3-venv
)
# Only for tests (never in an image).
test_packages=(
  clang  # the thread-safety check (ctest -L lint): clang++ -Wthread-safety
  prometheus  # a real Prometheus scrapes the worker and operator (promtool too)
  etcd-server xz-utils  # etcd under the real kube-apiserver (tests/envtest)
  # Container images and the real node (tests/images, tests/node): scripts/build-images.sh makes
  # a Debian 12 base from Debian's archive (mmdebstrap), builds docker/*.Dockerfile with podman
  # (buildah inside) and runs them with runc; the real-node harness runs the kubelet on
  # containerd + runc with the CNI bridge plugins, catatonit as the pause image, iproute2 and
  # iptables for the bridge and the API server's Service address, openssl for the kubelet's
  # client certificate, busybox-static for the harness test's own small image.
  podman buildah mmdebstrap runc
  containerd containernetworking-plugins catatonit iproute2 iptables openssl busybox-static
)
# kubectl, the user's client in the real-node tests: Debian's kubernetes-client where no
# kubectl is installed already (a newer one from elsewhere is left alone).
if ! command -v kubectl >/dev/null 2>&1; then test_packages+=(kubernetes-client); fi
# The shared libraries of the binaries, for the images' runtime stages: those both load, then
# each binary's own (tests/chart/runtime_deps_test.py checks them against ldd).
runtime_packages=(libyaml-cpp0.7 libprometheus-cpp-core1.0 zlib1g ca-certificates)
worker_runtime_packages=(libopenblas0-pthread libgloo0 libprotobuf32)
operator_runtime_packages=(libcpprest2.10 libssl3)

case "${1:-}" in
  "") packages=("${build_packages[@]}" "${test_packages[@]}") ;;
  --build) packages=("${build_packages[@]}") ;;
  --runtime)
    case "${2:-}" in
      "") packages=("${runtime_packages[@]}" "${worker_runtime_packages[@]}" "${operator_runtime_packages[@]}") ;;
      worker) packages=("${runtime_packages[@]}" "${worker_runtime_packages[@]}") ;;
      operator) packages=("${runtime_packages[@]}" "${operator_runtime_packages[@]}") ;;
      *) echo "usage: scripts/install-deps.sh --runtime [worker|operator]" >&2; exit 2 ;;
    esac ;;
  *) echo "usage: scripts/install-deps.sh [--build | --runtime [worker|operator]]" >&2; exit 2 ;;
esac

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
