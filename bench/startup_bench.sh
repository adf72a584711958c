#!/usr/bin/env bash
# Start-up of local data-parallel replicas with the defaults a user gets: the README's
# `longhaul-worker launch --replicas N -- train` with no config and no tuning keys, timed from the
# launch to (a) the group formed (every replica logged "joined the data-parallel group"), (b) the
# replicas synchronised (the chief's state broadcast, "replicas synchronised") and (c) the first
# completed step ("step      1/" on stdout). The run is then stopped (SIGTERM to launch).
#
#   bench/startup_bench.sh [--build-dir DIR] [--worker PATH] [--replicas 3] [--runs 3]
#
# --worker measures another binary (e.g. an older build) with the same command. With neither
# --build-dir nor --worker it builds longhaul-worker in build/bench-dist (Release). Results are
# recorded in bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build="" worker="" replicas=3 runs=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --worker) worker="$2"; shift 2 ;;
    --replicas) replicas="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    *) echo "usage: $0 [--build-dir DIR] [--worker PATH] [--replicas N] [--runs N]" >&2
       exit 2 ;;
  esac
done
if [[ -z "$worker" ]]; then
  if [[ -z "$build" ]]; then
    build=build/bench-dist
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGHAUL_CUDA=OFF >/dev/null
  fi
  cmake --build "$build" --target longhaul-worker -j2 >/dev/null ||
    { echo "$0: building in $build failed (run the cmake --build above to see why)" >&2; exit 1; }
  worker="$build/worker/cli/longhaul-worker"
fi
worker="$(realpath "$worker")"
work="$(mktemp -d /tmp/startup_bench.XXXXXX)"
launcher=""
cleanup() {
  [[ -n "$launcher" ]] && kill -KILL "$launcher" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

now() { date +%s.%N; }
calc() { awk "BEGIN { printf \"%.2f\", $* }"; }

echo "== start-up: launch --replicas $replicas -- train (no config, no tuning), $(nproc) CPUs"
printf "%-5s %16s %18s %15s\n" run group_formed_s synchronised_s first_step_s
for run in $(seq 1 "$runs"); do
  dir="$work/$run"
  mkdir -p "$dir"
  t0=$(now)
  (cd "$dir" && exec "$worker" launch --replicas "$replicas" -- train --logdir "$dir/run" \
     >"$dir/out" 2>"$dir/err") &
  launcher=$!
  formed="" synced="" first=""
  deadline=$(calc "$t0 + 600")
  while [[ -z "$first" ]]; do
    t=$(now)
    if [[ -z "$formed" ]] &&
       [[ $(grep -c 'joined the data-parallel group' "$dir/err" 2>/dev/null || true) -ge \
          $replicas ]]; then
      formed=$(calc "$t - $t0")
    fi
    if [[ -z "$synced" ]] && grep -q 'replicas synchronised' "$dir/err" 2>/dev/null; then
      synced=$(calc "$t - $t0")
    fi
    if grep -q 'step *1/' "$dir/out" 2>/dev/null; then first=$(calc "$t - $t0"); fi
    if ! kill -0 "$launcher" 2>/dev/null || awk "BEGIN { exit !($t > $deadline) }"; then
      echo "$0: no first step within 600 s (see the log below)" >&2
      tail -20 "$dir/err" >&2
      exit 1
    fi
    sleep 0.02
  done
  printf "%-5s %16s %18s %15s\n" "$run" "${formed:-?}" "${synced:-?}" "$first"
  kill -TERM "$launcher" 2>/dev/null || true
  wait "$launcher" 2>/dev/null || true
  launcher=""
done
