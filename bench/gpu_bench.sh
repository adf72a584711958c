#!/usr/bin/env bash
# GPU training benchmark: longhaul's CUDA backend vs PyTorch on the same GPU, in one run.
#
#   bench/gpu_bench.sh [--preset gpt2-124m] [--seq-len 1024] [--batch auto|N] [--steps 20]
#   bench/gpu_bench.sh --build-only    # step 1 only (works without a GPU)
# LONGHAUL_GPU_BENCH_DIRECT=1 skips CMake and builds directly with nvcc/g++;
# LONGHAUL_GPU_BENCH_BUILD overrides the build folder (default build/gpu-bench);
# LONGHAUL_GPU_BENCH_JOBS the number of parallel compiles (default: all cores);
# LONGHAUL_GPU_TESTS_DIR names a folder holding prebuilt kernels_cuda_test, backend_cuda_test,
# selfcheck_test and longhaul-worker (and, in lib/, shared libraries they need that the GPU
# machine lacks, e.g. OpenBLAS; bench/pack_gpu_tests.sh makes it): a bare
# GPU machine cannot configure the whole project (no GoogleTest, OpenBLAS, protobuf, ...), so
# build the suites on a development machine and carry them (worker/kernels/cuda/NOTES.md).
#
# 1. builds longhaul_gpu_bench and the CUDA test suites (Release, sm_90) in build/gpu-bench —
#    through CMake when the project's dependencies are installed, otherwise directly with nvcc
#    from the few sources the benchmark needs (GPU machines may carry only the CUDA toolkit);
# 2. checks correctness quickly: the CUDA kernel, model and self-check suites (each kernel against
#    the CPU reference, one training step against the CPU model, determinism) when they could be
#    built; `longhaul-worker doctor --json` (the start-up self-check of every kernel family on
#    this GPU with its fallbacks, and matmul/memory/PCIe against peak; saved to
#    $BUILD/doctor.json) and a 20-step `train --set device=cuda` (the self-check in the real
#    start-up path, exit 0 required) when the worker binary is there; always
#    `longhaul_gpu_bench --check` (flash vs cuBLASLt attention, a falling loss, bit-exact
#    reruns) and a plausible loss in the timed run;
# 3. trains GPT-2 124M at T=1024 (vocab padded to 50304 inside the backend) with the largest
#    micro-batch that fits (or --batch), with the flash attention kernels (the default) and again
#    with the cuBLASLt attention path (its own largest B); then PyTorch (torch.compile, bf16 autocast,
#    fused AdamW, SDPA) at the same B (halved until it fits);
# 4. prints one table: tokens/s, ms/step, MFU (6N + 6LCT FLOPs per token over 989 TFLOP/s),
#    peak device memory, the checkpoint snapshot stall, and the speed ratio.
#
# Exit status: 0 when everything ran and passed, 3 when no GPU is visible, 1 when a correctness
# check or a run failed. A failing correctness check does not stop the measurements: the table is
# still printed (a first GPU session wants both), and the failures are listed at the end.
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
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
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
FAILED=()
# Runs a step; on failure records it and carries on (the status is reported at the end).
step() {
  local name=$1
  shift
  if ! "$@"; then
    echo "gpu_bench: FAILED: $name" >&2
    FAILED+=("$name")
    return 1
  fi
}

# ---- 1. build ----
TESTS_BUILT=0
BENCH=""
if [[ ${LONGHAUL_GPU_BENCH_DIRECT:-0} != 1 ]] &&
   cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGHAUL_CUDA=ON \
     -DCMAKE_CUDA_ARCHITECTURES=90 -DLONGHAUL_BUILD_OPERATOR=OFF >"$BUILD/configure.log" 2>&1; then
  cmake --build "$BUILD" --target longhaul_gpu_bench -j "$JOBS"
  BENCH=$BUILD/bench/longhaul_gpu_bench
  if cmake --build "$BUILD" --target kernels_cuda_test backend_cuda_test selfcheck_test \
       longhaul-worker -j "$JOBS" \
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
  NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
  export NVCC
  INC=(-I"$ROOT/base/include" -I"$ROOT/worker/model/include" -I"$ROOT/worker/kernels/common/include"
       -I"$ROOT/worker/kernels/cuda/include" -I"$ROOT/worker/model/cuda/include"
       -I"$CUDA_HOME/include")
  OBJ=$BUILD/direct
  mkdir -p "$OBJ"
  export OBJ
  export INC_FLAGS="${INC[*]}"
  # At most $JOBS compilers at a time.
  compile_one() {
    case $1 in
      *.cu) "$NVCC" -std=c++20 -O3 -arch=sm_90 --expt-relaxed-constexpr $INC_FLAGS -c "$1" \
              -o "$OBJ/$(basename "$1").o" ;;
      *) g++ -std=c++20 -O2 -DLONGHAUL_HAVE_CUDA=1 $INC_FLAGS -c "$1" -o "$OBJ/$(basename "$1").o" ;;
    esac
  }
  export -f compile_one
  rm -f "$OBJ"/*.o
  # worker/model: every library source at its top level but CPU inference, so a source added there
  # later is compiled too. The CPU backend (model/cpu) and gpt2_inference.cc need the CPU kernels
  # and OpenBLAS, which this build does not have.
  MODEL_SOURCES=()
  for f in "$ROOT"/worker/model/*.cc; do
    case $(basename "$f") in *_test.cc | gpt2_inference.cc) ;; *) MODEL_SOURCES+=("$f") ;; esac
  done
  printf '%s\n' "$ROOT"/worker/kernels/cuda/*.cu \
    "$ROOT"/base/error.cc "$ROOT"/base/log.cc "${MODEL_SOURCES[@]}" \
    "$ROOT"/worker/kernels/cuda/check.cc "$ROOT"/worker/kernels/cuda/matmul.cc \
    "$ROOT"/worker/model/cuda/gpt2_cuda.cc \
    "$ROOT"/bench/gpu_train_bench.cc |
    xargs -P "$JOBS" -I{} bash -c 'compile_one "$1"' _ {}
  g++ -o "$OBJ/longhaul_gpu_bench" "$OBJ"/*.o -L"$CUDA_HOME/lib64" -L"$CUDA_HOME/lib" \
    -Wl,-rpath,"$CUDA_HOME/lib64:$CUDA_HOME/lib" -lcublasLt -lcudart -lpthread
  BENCH=$OBJ/longhaul_gpu_bench
fi

echo "gpu_bench: built $BENCH"
if [[ $BUILD_ONLY == 1 ]]; then exit 0; fi

# ---- 2. correctness ----
SUITE_DIR=""
SUITE_LD=${LD_LIBRARY_PATH:-}
if [[ $TESTS_BUILT == 1 ]]; then
  SUITE_DIR=$BUILD
elif [[ -n ${LONGHAUL_GPU_TESTS_DIR:-} ]]; then
  SUITE_DIR=$(cd "$LONGHAUL_GPU_TESTS_DIR" 2>/dev/null && pwd || echo "$LONGHAUL_GPU_TESTS_DIR")
  # Only for the suites (PyTorch below must keep finding its own CUDA libraries first).
  SUITE_LD="$SUITE_DIR/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [[ -n $SUITE_DIR ]]; then
  echo "== correctness: CUDA kernels vs CPU reference, CUDA model vs CPU model ($SUITE_DIR) =="
  for suite in kernels_cuda_test backend_cuda_test selfcheck_test; do
    exe=$(find "$SUITE_DIR" -name "$suite" -type f -perm -u+x 2>/dev/null | head -n 1 || true)
    if [[ -z $exe ]]; then
      echo "gpu_bench: $suite not found under $SUITE_DIR" >&2
      FAILED+=("$suite (missing)")
      continue
    fi
    step "$suite" env LD_LIBRARY_PATH="$SUITE_LD" "$exe" --gtest_brief=1 || true
  done
  worker=$(find "$SUITE_DIR" -name longhaul-worker -type f -perm -u+x 2>/dev/null | head -n 1 || true)
  if [[ -n $worker ]]; then
    echo "== self-check and doctor on this GPU ($worker doctor --json -> $BUILD/doctor.json) =="
    # The GPT-2 124M shape: head size 64, so the flash attention kernels are checked too.
    if env LD_LIBRARY_PATH="$SUITE_LD" "$worker" doctor --json --set model.preset=gpt2-124m \
         >"$BUILD/doctor.json"; then
      python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({k: d[k] for k in ("chosen", "passed")}), json.dumps(d["gpu"].get("measurements", {})))' \
        "$BUILD/doctor.json" || FAILED+=("doctor --json output")
    else
      FAILED+=("longhaul-worker doctor (see $BUILD/doctor.json)")
    fi
    step "longhaul-worker doctor (text)" env LD_LIBRARY_PATH="$SUITE_LD" "$worker" doctor \
      --set model.preset=gpt2-124m || true
    echo "== train 20 steps with device: cuda (start-up self-check, fallbacks, watchdog) =="
    rm -rf "$BUILD/selfcheck-run"
    step "train --set device=cuda" env LD_LIBRARY_PATH="$SUITE_LD" "$worker" train \
      --logdir "$BUILD/selfcheck-run" --set device=cuda --set training.max_steps=20 \
      --set log.every_steps=5 || true
  else
    echo "gpu_bench: longhaul-worker not found under $SUITE_DIR" >&2
    FAILED+=("longhaul-worker (missing)")
  fi
else
  echo "== correctness: test suites not built here (no GoogleTest/OpenBLAS on this machine;" \
       "set LONGHAUL_GPU_TESTS_DIR to prebuilt ones) =="
  FAILED+=("CPU-reference suites (not run)")
fi
echo "== correctness: self-consistency (flash vs cuBLASLt attention, training, determinism) =="
step "longhaul_gpu_bench --check" "$BENCH" --check || true

# ---- 3. measure ----
LOG=$BUILD/gpu_bench.log
field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"$1"; }
echo "== longhaul ($PRESET, T=$SEQ_LEN, batch $BATCH) =="
if ! "$BENCH" --preset "$PRESET" --seq-len "$SEQ_LEN" --batch "$BATCH" --steps "$STEPS" \
     --peak-tflops "$PEAK" | tee "$LOG"; then
  FAILED+=("longhaul timed run")
fi
LH=$(grep '^RESULT impl=longhaul' "$LOG" || true)
B=$(field "$LH" B)
if [[ -z $B ]]; then  # the run failed: compare PyTorch at the requested (or a typical) batch
  B=$([[ $BATCH == auto ]] && echo 16 || echo "$BATCH")
fi
echo "== longhaul with the cuBLASLt attention path (batch $BATCH: it keeps T x T probabilities) =="
LOG_CUBLAS=$BUILD/gpu_bench_cublas.log
if "$BENCH" --preset "$PRESET" --seq-len "$SEQ_LEN" --batch "$BATCH" --steps "$STEPS" \
     --peak-tflops "$PEAK" --attention cublas | tee "$LOG_CUBLAS"; then
  LH_CUBLAS=$(grep '^RESULT impl=longhaul' "$LOG_CUBLAS" || true)
else
  LH_CUBLAS=""
  FAILED+=("longhaul timed run, cuBLASLt attention")
fi
if [[ -n $LH ]] && ! python3 - "$(field "$LH" loss)" <<'EOF_PY'
import math, sys
loss = float(sys.argv[1])
if not math.isfinite(loss) or not (0.5 < loss < 15):
    sys.exit(f"gpu_bench: longhaul loss {loss} is not plausible: the CUDA backend is broken")
EOF_PY
then
  FAILED+=("plausible longhaul loss")
fi

echo "== PyTorch (same GPU, B=$B) =="
if ! python3 "$ROOT/bench/gpu_bench_torch.py" --preset "$PRESET" --seq-len "$SEQ_LEN" --batch "$B" \
     --steps "$STEPS" --peak-tflops "$PEAK" | tee -a "$LOG"; then
  FAILED+=("PyTorch baseline")
fi
PT=$(grep '^RESULT impl=pytorch' "$LOG" || true)

# ---- 4. table ----
row() {  # row NAME RESULT-LINE SNAPSHOT-COLUMN
  printf '%-10s %5s %6s %12.0f %10.2f %7.1f%% %10.2f %16s\n' "$1" "$(field "$2" B)" "$SEQ_LEN" \
    "$(field "$2" tokens_per_s)" "$(field "$2" ms_per_step)" \
    "$(python3 -c "print(100*$(field "$2" mfu))")" "$(field "$2" mem_gib)" "$3"
}
echo
printf '%-10s %5s %6s %12s %10s %8s %10s %16s\n' impl B T tokens/s ms/step MFU "peak GiB" "snapshot stall"
if [[ -n $LH ]]; then
  row longhaul "$LH" "$(field "$LH" snapshot_ms) ms"
else
  echo "longhaul: did not run (see above)"
fi
if [[ -n $LH_CUBLAS ]]; then row lh-cublas "$LH_CUBLAS" "-"; fi
if [[ -n $PT ]]; then
  row pytorch "$PT" "-"
  if [[ -n $LH ]]; then
    python3 -c "print(f'longhaul / pytorch tokens/s: {$(field "$LH" tokens_per_s)/$(field "$PT" tokens_per_s):.2f}x')"
  fi
else
  echo "pytorch: did not run (see above)"
fi
if ((${#FAILED[@]} > 0)); then
  echo
  echo "gpu_bench: FAILED:"
  printf '  - %s\n' "${FAILED[@]}"
  exit 1
fi
