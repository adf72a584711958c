#!/usr/bin/env bash
# CPU training throughput: longhaul's CPU GPT-2 vs PyTorch on the same machine, same configs
# (presets tiny and small-4x256), same batch shapes, AdamW and clipping, same thread count.
#
#   bench/model_bench.sh [--threads N] [--steps N] [--rounds R] [--batch B]
#
# Each side reports its best round of --steps timed steps (see model_bench.cc).
#
# Builds the model_bench target in build/bench-model (Release), installs Debian's python3-torch
# when /usr/bin/python3 cannot import torch, runs both, and prints one table. Results for the
# development machine are recorded in bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2 steps=10 rounds=3 batch=8
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) threads="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    *) echo "usage: $0 [--threads N] [--steps N] [--rounds R] [--batch B]" >&2; exit 2 ;;
  esac
done

build=build/bench-model
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGHAUL_CUDA=OFF \
  -DLONGHAUL_BUILD_OPERATOR=ON -DLONGHAUL_BUILD_TESTS=ON
  >/dev/null
cmake --build "$build" --target model_bench -j2 >/dev/null

if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "installing python3-torch (Debian) for the PyTorch comparison..." >&2
  if [[ $(id -u) -eq 0 ]]; then
    apt-get install -y python3-torch >/dev/null
  else
    sudo apt-get install -y python3-torch >/dev/null
  fi
fi

# Correctness first: loss and gradients of one micro-batch against PyTorch (float64).
check_dir=$(mktemp -d)
trap 'rm -rf "$check_dir"' EXIT
"$build/bench/model_bench" --preset tiny --batch 2 --seq 64 --dump "$check_dir" >/dev/null
/usr/bin/python3 bench/model_check_torch.py "$check_dir" | tail -1 | sed 's/^/PyTorch check: /'

ours=$(OMP_NUM_THREADS="$threads" "$build/bench/model_bench" --threads "$threads" --steps "$steps" \
  --rounds "$rounds" --batch "$batch" | grep '^RESULT')
theirs=$(/usr/bin/python3 bench/model_bench_torch.py --threads "$threads" --steps "$steps" \
  --rounds "$rounds" --batch "$batch" | grep '^RESULT')
torch_version=$(/usr/bin/python3 -c 'import torch; print(torch.__version__)')

echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), threads: $threads"
printf '%-12s %4s %5s %10s %14s %16s %9s\n' preset B T params "longhaul tok/s" \
  "torch $torch_version tok/s" speedup
join <(echo "$ours" | awk '{print $2, $3, $4, $8, $7}' | sort) \
     <(echo "$theirs" | awk '{print $2, $7}' | sort) |
  awk '{printf "%-12s %4s %5s %10s %14.0f %16.0f %8.2fx\n", $1, $2, $3, $4, $5, $6, $5 / $6}'
