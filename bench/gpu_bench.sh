#!/usr/bin/env bash
# GPU training benchmark: longhaul's CUDA backend vs PyTorch on the same GPU, in one run.
#
#   bench/gpu_bench.sh [--preset gpt2-124m] [--seq-len 1024] [--batch auto|N] [--steps 20]
#   bench/gpu_bench.sh --build-only    # step 1 only (works without a GPU)
# LONGHAUL_GPU_BENCH_DIRECT=1 skips CMake and builds directly with nvcc/g++;
# LONGHAUL_GPU_BENCH_BUILD overrides the build folder (default build/gpu-bench);
# LONGHAUL_GPU_BENCH_JOBS the number of parallel compiles (default: all cores).
#
# 1. builds longhaul_gpu_bench and the CUDA test suites (Release, sm_90) in build/gpu-bench —
#    through CMake when the project's dependencies are installed, otherwise directly with nvcc
#    from the few sources the benchmark needs (GPU machines may carry only the CUDA toolkit);
# 2. checks correctness quickly: the CUDA kernel and model suites (each kernel against the CPU
#    reference, one training step against the CPU model, determinism) when they could be built;
#    always `longhaul_gpu_bench --check` (flash vs cuBLASLt attention, a falling loss, bit-exact
#    reruns) and a plausible loss in the timed run;
# 3. trains GPT-2 124M at T=1024 (vocab padded to 50304 inside the backend) with the largest
#    micro-batch that fits (or --batch), with the flash attention kernels (the default) and again
#    with the cuBLASLt attention path (its own largest B); then PyTorch (torch.compile, bf16 autocast,
#    fused AdamW, SDPA) at the same B (halved until it fits);
# 4. prints one table: tokens/s, ms/step, MFU (6N + 6LCT FLOPs per token over 989 TFLOP/s),
#    peak device memory, the checkpoint snapshot stall, and the speed ratio.
#
# Exit status: 0 when everything ran, 3 when no GPU is visible, 1 on a failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${LONGHAUL_GPU_BENCH_BUILD:-$ROOT/build/gpu-bench}
PRESET=gpt2-124m
SEQ_LEN=1024
BATCH=auto
STEPS=20
PEAK=989
BUILD_ONLY=0
while [[ $# -gt 0 ]]; do
  case $1 in
    --preset) PRESET=$2; shift 2 ;;
    --seq-len) SEQ_LEN=$2; shift 2 ;;
    --batch) BATCH=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --peak-tflops) PEAK=$2; shift 2 ;;
    --build-only) BUILD_ONLY=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [[ $BUILD_ONLY == 0 ]]; then
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_bench: no GPU visible (nvidia-smi failed); nothing to measure" >&2
    exit 3
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
JOBS=${LONGHAUL_GPU_BENCH_JOBS:-$(nproc 2>/dev/null || echo 4)}
mkdir -p "$BUILD"

# ---- 1. build ----
TESTS_BUILT=0
BENCH=""
if [[ ${LONGHAUL_GPU_BENCH_DIRECT:-0} != 1 ]] &&
   cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGHAUL_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90 -DLONGHAUL_BUILD_OPERATOR=OFF >"$BUILD/configure.log" 2>&1; then
  cmake --build "$BUILD" --target longhaul_gpu_bench -j "$JOBS"
  BENCH=$BUILD/bench/longhaul_gpu_bench
  if cmake --build "$BUILD" --target kernels_cuda_test backend_cuda_test -j "$JOBS" \
       >"$BUILD/tests-build.log" 2>&1; then
    TESTS_BUILT=1
  else
    echo "gpu_bench: the CUDA test suites did not build (see $BUILD/tests-build.log)" >&2
  fi
else
  if [[ ${LONGHAUL_GPU_BENCH_DIRECT:-0} != 1 ]]; then
    echo "gpu_bench: CMake configure failed (project dependencies missing?), see" \
         "$BUILD/configure.log; building the benchmark directly with nvcc" >&2
  fi
  CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc)")")}
  INC=(-I"$ROOT/worker/base/include" -I"$ROOT/worker/model/include"
       -I"$ROOT/worker/kernels/cuda/include" -I"$ROOT/worker/backend_cuda/include"
       -I"$CUDA_HOME/include")
  OBJ=$BUILD/direct
  mkdir -p "$OBJ"
  export OBJ
  export INC_FLAGS="${INC[*]}"
  # At most $JOBS compilers at a time.
  compile_one() {
    case $1 in
      *.cu) nvcc -std=c++20 -O3 -arch=sm_90 --expt-relaxed-constexpr $INC_FLAGS -c "$1" \
              -o "$OBJ/$(basename "$1").o" ;;
      *) g++ -std=c++20 -O2 -DLONGHAUL_HAVE_CUDA=1 $INC_FLAGS -c "$1" -o "$OBJ/$(basename "$1").o" ;;
    esac
  }
  export -f compile_one
  printf '%s\n' "$ROOT"/worker/kernels/cuda/*.cu \
    "$ROOT"/worker/base/error.cc "$ROOT"/worker/base/log.cc \
    "$ROOT"/worker/model/config.cc "$ROOT"/worker/model/pretrained.cc \
    "$ROOT"/worker/kernels/cuda/check.cc "$ROOT"/worker/kernels/cuda/matmul.cc \
    "$ROOT"/worker/backend_cuda/gpt2_cuda.cc "$ROOT"/worker/backend_cuda/state_transfer.cc \
    "$ROOT"/bench/gpu_train_bench.cc |
    xargs -P "$JOBS" -I{} bash -c 'compile_one "$1"' _ {}
  g++ -o "$OBJ/longhaul_gpu_bench" "$OBJ"/*.o -L"$CUDA_HOME/lib64" -lcublasLt -lcudart -lpthread
  BENCH=$OBJ/longhaul_gpu_bench
fi

echo "gpu_bench: built $BENCH"
if [[ $BUILD_ONLY == 1 ]]; then exit 0; fi

# ---- 2. correctness ----
if [[ $TESTS_BUILT == 1 ]]; then
  echo "== correctness: CUDA kernels vs CPU reference, CUDA model vs CPU model =="
  for suite in kernels_cuda_test backend_cuda_test; do
    "$(find "$BUILD" -name "$suite" -type f -perm -u+x | head -n 1)" --gtest_brief=1
  done
else
  echo "== correctness: test suites not built here (no GoogleTest/OpenBLAS on this machine) =="
fi
echo "== correctness: self-consistency (flash vs cuBLASLt attention, training, determinism) =="
"$BENCH" --check

# ---- 3. measure ----
LOG=$BUILD/gpu_bench.log
echo "== longhaul ($PRESET, T=$SEQ_LEN, batch $BATCH) =="
"$BENCH" --preset "$PRESET" --seq-len "$SEQ_LEN" --batch "$BATCH" --steps "$STEPS" \
  --peak-tflops "$PEAK" | tee "$LOG"
LH=$(grep '^RESULT impl=longhaul' "$LOG")
field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"$1"; }
B=$(field "$LH" B)
echo "== longhaul with the cuBLASLt attention path (batch $BATCH: it keeps T x T probabilities) =="
LOG_CUBLAS=$BUILD/gpu_bench_cublas.log
if "$BENCH" --preset "$PRESET" --seq-len "$SEQ_LEN" --batch "$BATCH" --steps "$STEPS" \
     --peak-tflops "$PEAK" --attention cublas | tee "$LOG_CUBLAS"; then
  LH_CUBLAS=$(grep '^RESULT impl=longhaul' "$LOG_CUBLAS" || true)
else
  LH_CUBLAS=""
fi
LOSS=$(field "$LH" loss)
python3 - "$LOSS" <<'EOF'
import math, sys
loss = float(sys.argv[1])
if not math.isfinite(loss) or not (0.5 < loss < 15):
    sys.exit(f"gpu_bench: longhaul loss {loss} is not plausible: the CUDA backend is broken")
EOF

echo "== PyTorch (same GPU, B=$B) =="
python3 "$ROOT/bench/gpu_bench_torch.py" --preset "$PRESET" --seq-len "$SEQ_LEN" --batch "$B" \
  --steps "$STEPS" --peak-tflops "$PEAK" | tee -a "$LOG"
PT=$(grep '^RESULT impl=pytorch' "$LOG" || true)

# ---- 4. table ----
echo
printf '%-10s %5s %6s %12s %10s %8s %10s %16s\n' impl B T tokens/s ms/step MFU "peak GiB" "snapshot stall"
printf '%-10s %5s %6s %12.0f %10.2f %7.1f%% %10.2f %13.1f ms\n' longhaul "$B" "$SEQ_LEN" \
  "$(field "$LH" tokens_per_s)" "$(field "$LH" ms_per_step)" \
  "$(python3 -c "print(100*$(field "$LH" mfu))")" "$(field "$LH" mem_gib)" \
  "$(field "$LH" snapshot_ms)"
if [[ -n $LH_CUBLAS ]]; then
  printf '%-10s %5s %6s %12.0f %10.2f %7.1f%% %10.2f %16s\n' "lh-cublas" \
    "$(field "$LH_CUBLAS" B)" "$SEQ_LEN" \
    "$(field "$LH_CUBLAS" tokens_per_s)" "$(field "$LH_CUBLAS" ms_per_step)" \
    "$(python3 -c "print(100*$(field "$LH_CUBLAS" mfu))")" "$(field "$LH_CUBLAS" mem_gib)" "-"
fi
if [[ -n $PT ]]; then
  printf '%-10s %5s %6s %12.0f %10.2f %7.1f%% %10.2f %16s\n' pytorch "$(field "$PT" B)" "$SEQ_LEN" \
    "$(field "$PT" tokens_per_s)" "$(field "$PT" ms_per_step)" \
    "$(python3 -c "print(100*$(field "$PT" mfu))")" "$(field "$PT" mem_gib)" "-"
  python3 -c "print(f'longhaul / pytorch tokens/s: {$(field "$LH" tokens_per_s)/$(field "$PT" tokens_per_s):.2f}x')"
else
  echo "pytorch: did not run (see above)"
fi
