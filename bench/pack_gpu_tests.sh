#!/usr/bin/env bash
# Packs the CUDA test suites for a bare GPU machine (worker/kernels/cuda/NOTES.md).
#
#   bench/pack_gpu_tests.sh [--build-dir build/gpu-release] [--out build/gpu-tests]
#
# A GPU machine lent for a session carries the CUDA toolkit but not the project's dependencies
# (GoogleTest, OpenBLAS, protobuf, ...), so it cannot configure the whole project. This script
# builds here (Release, sm_90, CUDA on) kernels_cuda_test, backend_cuda_test, selfcheck_test and
# the longhaul-worker binary, strips them, and copies beside them, in lib/, every shared library
# they load from outside the CUDA toolkit and the C/C++ runtime (OpenBLAS, protobuf, yaml-cpp,
# cpprest, ...). The folder is git-ignored: hand it to the device with
# `carry: ["build/gpu-tests"]` and run there, in one call,
#
#   LONGHAUL_GPU_TESTS_DIR=build/gpu-tests bench/gpu_bench.sh
#
# which runs the suites (every kernel against its CPU reference, the model against the CPU model,
# determinism), `longhaul-worker doctor --json` (the start-up self-check of every kernel family on
# the real GPU, fallbacks, matmul/memory/PCIe against peak), a short `train --set device=cuda`
# (the self-check in the real start-up path), then the timing table. Prints the folder's size
# (the carry limit is 64 MiB for everything carried).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=$ROOT/build/gpu-release
OUT=$ROOT/build/gpu-tests
while [[ $# -gt 0 ]]; do
  case $1 in
    --build-dir) BUILD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "pack_gpu_tests.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
case $OUT in /*) ;; *) OUT=$ROOT/$OUT ;; esac

if ! command -v nvcc >/dev/null && [[ ! -x /usr/local/cuda/bin/nvcc ]]; then
  echo "pack_gpu_tests.sh: no nvcc on PATH or in /usr/local/cuda/bin: install the CUDA toolkit" >&2
  exit 2
fi
if [[ ! -f $BUILD/build.ninja ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DLONGHAUL_CUDA=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90
fi
TARGETS=(kernels_cuda_test backend_cuda_test selfcheck_test longhaul-worker)
cmake --build "$BUILD" --target "${TARGETS[@]}" -j"${LONGHAUL_JOBS:-2}"

rm -rf "$OUT"
mkdir -p "$OUT/lib"
for name in "${TARGETS[@]}"; do
  bin=$(find "$BUILD" -name "$name" -type f -perm -u+x | head -1)
  if [[ -z $bin ]]; then
    echo "pack_gpu_tests.sh: $name was not built in $BUILD" >&2
    exit 1
  fi
  cp "$bin" "$OUT/"
  strip "$OUT/$name"
  # Libraries from outside the toolkit and the C/C++ runtime travel along.
  ldd "$bin" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case $(basename "$lib") in
      libc.so*|libm.so*|libdl.so*|libpthread.so*|librt.so*|libstdc++.so*|libgcc_s.so*) ;;
      libcudart.so*|libcublas*.so*|libnccl.so*|libcudnn*.so*) ;;
      *) cp -L "$lib" "$OUT/lib/" ;;
    esac
  done
done
echo "packed into $OUT ($(du -sh "$OUT" | cut -f1)):"
ls -1 "$OUT" "$OUT/lib"
