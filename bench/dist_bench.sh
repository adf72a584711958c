#!/usr/bin/env bash
# Data-parallel replicas on one machine (worker/distributed): training steps/s for 1, 2 and 3 local
# replicas on CPU (`longhaul-worker launch`, Gloo all-reduce over loopback) with the gradient
# all-reduce overlapped with the backward pass (`--allreduce-overlap on`, the default) and not
# (`off`), and the time from a peer's death (SIGKILL) or hang (SIGSTOP) to the exit (code 138)
# of every survivor (supervisor.on_peer_loss: exit; recovery in place is bench/recovery_bench.sh).
#
#   bench/dist_bench.sh [--build-dir DIR] [--preset tiny] [--batch 4] [--seq 64]
#                       [--threads-per-replica 1] [--steps 60] [--timeout-secs 3]
#                       [--bucket-mb 0]
#
# Steps/s is measured between two run lengths (steps and 3*steps) so that start-up,
# rendezvous and the final checkpoint cancel out. allreduce_ms is the chief's time inside
# all-reduce calls per step (on the communication thread when overlapped), blocked_ms the time
# its training thread waited for them after the backward pass, hidden = 1 - blocked/allreduce
# (from the `gradient all-reduce` log line of the 3*steps run). Every replica trains on `--batch` sequences
# per step (weak scaling: the global batch grows with the replicas); tokens/s counts all
# replicas. With --build-dir unset it builds longhaul-worker in build/bench-dist (Release).
# Results for the development machine are recorded in bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build="" preset=tiny batch=4 seq=64 threads=1 steps=60 timeout_secs=3 bucket_mb=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --preset) preset="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --threads-per-replica) threads="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --timeout-secs) timeout_secs="$2"; shift 2 ;;
    --bucket-mb) bucket_mb="$2"; shift 2 ;;
    *) echo "usage: $0 [--build-dir DIR] [--preset P] [--batch B] [--seq T]" \
            "[--threads-per-replica N] [--steps N] [--timeout-secs S] [--bucket-mb MB]" >&2
       exit 2 ;;
  esac
done
if [[ -z "$build" ]]; then
  build=build/bench-dist
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGHAUL_CUDA=OFF >/dev/null
  cmake --build "$build" --target longhaul-worker -j2 >/dev/null
fi
worker="$(realpath "$build/worker/cli/longhaul-worker")"
work="$(mktemp -d /tmp/dist_bench.XXXXXX)"
trap 'rm -rf "$work"' EXIT
export LONGHAUL_NUM_THREADS="$threads"

config() {  # config <max_steps> <save_model_steps>
  cat <<YAML
model: {preset: $preset}
training: {batch_size: $batch, seq_len: $seq, max_steps: $1, warmup_steps: 2}
checkpoint: {save_model_secs: 0, save_model_steps: $2, max_to_keep: 2}
summaries: {every_steps: 0, save_summaries_secs: 0}
log: {every_steps: 1000000}
eval: {every_steps: 0}
supervisor: {on_peer_loss: exit}
YAML
}

now() { date +%s.%N; }
calc() { awk "BEGIN { printf \"%.6f\", $* }"; }

# Wall seconds of `launch --replicas $1` training $2 steps with --allreduce-overlap $3 in a
# fresh logdir (its output in $work/run-$1-$2-$3.log).
timed_run() {
  local dir="$work/run-$1-$2-$3"
  config "$2" 0 >"$work/cfg-$2.yaml"
  local t0 t1
  t0=$(now)
  "$worker" launch --replicas "$1" --max-restarts 0 -- train --config "$work/cfg-$2.yaml" \
    --logdir "$dir" --allreduce-overlap "$3" --allreduce-bucket-mb "$bucket_mb" >"$dir.log" 2>&1 ||
    { echo "run failed, see below" >&2; cat "$dir.log" >&2; exit 1; }
  t1=$(now)
  calc "$t1 - $t0"
}

# field <log> <key>: the value of key=... on the chief's `gradient all-reduce` line.
field() {
  grep 'gradient all-reduce rank=0 ' "$1" | sed -n "s/.* $2=\([^ ]*\).*/\1/p" | tail -1
}

echo "== steps/s: $preset, per replica batch ${batch}x${seq}, $threads thread(s) per replica," \
  "$(nproc) CPUs, bucket ${bucket_mb} MiB (0: auto)"
printf "%-9s %-8s %9s %10s %13s %9s %13s %11s %7s %8s\n" replicas overlap steps/s tokens/s \
  vs_1_replica ms/step allreduce_ms blocked_ms hidden buckets
base=""
for w in 1 2 3; do
  modes="on off"
  [[ $w -eq 1 ]] && modes="on"  # one replica has nothing to all-reduce
  for mode in $modes; do
    short=$(timed_run "$w" "$steps" "$mode")
    long=$(timed_run "$w" $((3 * steps)) "$mode")
    sps=$(calc "2 * $steps / ($long - $short)")
    tps=$(calc "$sps * $w * $batch * $seq")
    [[ -z "$base" ]] && base="$tps"
    log="$work/run-$w-$((3 * steps))-$mode.log"
    if [[ $w -eq 1 ]]; then
      ar="-" bl="-" hid="-" buckets="-" shown="-"
    else
      n=$(field "$log" steps)
      ar=$(awk "BEGIN { printf \"%.2f\", 1000 * $(field "$log" allreduce_seconds) / $n }")
      bl=$(awk "BEGIN { printf \"%.2f\", 1000 * $(field "$log" blocked_seconds) / $n }")
      hid=$(awk "BEGIN { printf \"%.0f%%\", 100 * $(field "$log" hidden_fraction) }")
      buckets=$(field "$log" buckets_per_step)
      [[ "$mode" == off ]] && buckets=1
      shown=$mode
    fi
    printf "%-9s %-8s %9.2f %10.0f %12.2fx %9.1f %13s %11s %7s %8s\n" "$w" "$shown" "$sps" \
      "$tps" "$(calc "$tps / $base")" "$(calc "1000 / $sps")" "$ar" "$bl" "$hid" "$buckets"
  done
done

# Failure detection: 3 replicas, one is killed (or stopped) after the first checkpoint; the
# time until every survivor exited, and their exit codes.
detect() {  # detect <KILL|STOP>
  local dir="$work/fail-$1" pids=() i
  mkdir -p "$dir"
  config 100000000 5 >"$dir/cfg.yaml"
  local cluster='"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2222", "127.0.0.1:2222"]'
  for i in 0 1 2; do
    local task='{"type": "chief", "index": 0}'
    [[ $i -gt 0 ]] && task="{\"type\": \"worker\", \"index\": $((i - 1))}"
    TF_CONFIG="{\"cluster\": {$cluster}, \"task\": $task}" LONGHAUL_RESTART_ATTEMPT="$1" \
      LONGHAUL_COLLECTIVE_TIMEOUT_SECS="$timeout_secs" \
      "$worker" train --config "$dir/cfg.yaml" --logdir "$dir/run" >"$dir/$i.log" 2>&1 &
    pids+=($!)
  done
  until grep -q model_checkpoint_path "$dir/run/checkpoint" 2>/dev/null; do sleep 0.05; done
  local t0 codes=() last
  t0=$(now)
  kill -"$1" "${pids[2]}"
  for i in 0 1; do
    set +e; wait "${pids[$i]}"; codes+=($?); set -e
  done
  last=$(now)
  kill -KILL "${pids[2]}" 2>/dev/null || true
  kill -CONT "${pids[2]}" 2>/dev/null || true
  wait "${pids[2]}" 2>/dev/null || true
  printf "%-26s %12.3f %18s\n" "$2" "$(calc "$last - $t0")" "${codes[*]}"
}
echo
echo "== peer loss: 3 replicas, LONGHAUL_COLLECTIVE_TIMEOUT_SECS=$timeout_secs"
printf "%-26s %12s %18s\n" event "all_exited_s" survivor_exit_codes
detect KILL "peer SIGKILL (died)" 2>/dev/null
detect STOP "peer SIGSTOP (hung/cut)" 2>/dev/null
