#!/usr/bin/env bash
# Recovery from a lost replica: 3 data-parallel replicas, one is lost, the group goes on. Two
# tables:
#
# 1. On the local cluster (bench/recovery_cluster_bench.cc, built as recovery_cluster_bench): the
#    longhaul-operator binary against the fake API server (--api real: a real kube-apiserver, etcd
#    and controller manager from tests/envtest, LONGHAUL_KUBE_ASSETS), the local kubelet running the
#    pods of a 3-replica TrainingJob as longhaul-worker processes; per restartScope (Replica: only
#    the lost pod is re-created, the survivors regroup in place; Group: every pod is re-created and
#    restores the latest checkpoint) and fault (worker SIGKILL, chief SIGKILL, worker preempted with
#    notice): the time from the fault to the next completed step, the pod start reported separately
#    (pod created -> process started) and subtracted, steps redone, pods re-created, whether a
#    checkpoint was read, and the operator's own status.lastRecoveryMilliseconds.
# 2. Processes only (no operator, no pods; the baseline): the same replicas started here with
#    TF_CONFIG as pods get it, the lost one replaced at once with the same rank.
#
#   bench/recovery_bench.sh [--build-dir DIR] [--only cluster|processes] [--api fake|real]
#                           [--preset tiny] [--batch 4] [--seq 64] [--save-every 50]
#                           [--lose-at 120]
#
# Processes table: in place (supervisor.on_peer_loss: regroup, the default) with a worker
# SIGKILLed, the chief SIGKILLed, a worker preempted (SIGTERM: it tells the others), each followed
# at once by a replacement with the same rank (what the operator does with restartScope: Replica,
# minus the operator and the pod); and today's group restart (on_peer_loss: exit) after a worker
# SIGKILL: the survivors exit 138 and all three restart from the latest checkpoint (taken every
# --save-every steps). The replica is lost once the chief printed step --lose-at. Steps redone =
# the last step completed before the fault - the step training continued from. With --build-dir
# unset it builds longhaul-worker, longhaul-operator and recovery_cluster_bench in
# build/bench-dist (Release). Results are recorded in bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
build="" only="" api=fake preset=tiny batch=4 seq=64 save_every=50 lose_at=120
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --api) api="$2"; shift 2 ;;
    --preset) preset="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --save-every) save_every="$2"; shift 2 ;;
    --lose-at) lose_at="$2"; shift 2 ;;
    *) echo "usage: $0 [--build-dir DIR] [--only cluster|processes] [--api fake|real]" \
            "[--preset P] [--batch B] [--seq T] [--save-every N] [--lose-at STEP]" >&2
       exit 2 ;;
  esac
done
case "$only" in
  ""|cluster|processes) ;;
  *) echo "$0: --only takes cluster or processes, not '$only'" >&2; exit 2 ;;
esac
if [[ -z "$build" ]]; then
  build=build/bench-dist
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLONGHAUL_CUDA=OFF >/dev/null
fi
cmake --build "$build" --target longhaul-worker longhaul-operator recovery_cluster_bench -j2 \
  >/dev/null || { echo "$0: building in $build failed (run the cmake --build above to see why)" >&2
                  exit 1; }
if [[ "$only" != processes ]]; then
  "$build/bench/recovery_cluster_bench" --api "$api" --preset "$preset" --batch "$batch" \
    --seq "$seq" --save-every "$save_every" --lose-at "$lose_at"
  [[ "$only" == cluster ]] && exit 0
  echo
fi
worker="$(realpath "$build/worker/cli/longhaul-worker")"
work="$(mktemp -d /tmp/recovery_bench.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export LONGHAUL_NUM_THREADS=1
max_steps=$((lose_at + 3 * save_every))

config() {  # config <on_peer_loss>
  cat <<YAML
model: {preset: $preset}
training: {batch_size: $batch, seq_len: $seq, max_steps: $max_steps, warmup_steps: 2}
checkpoint: {save_model_secs: 0, save_model_steps: $save_every, max_to_keep: 2}
summaries: {every_steps: 0, save_summaries_secs: 0}
log: {every_steps: 1}
eval: {every_steps: 0}
supervisor: {on_peer_loss: $1}
YAML
}

now() { date +%s.%N; }
calc() { awk "BEGIN { printf \"%.3f\", $* }"; }
cluster='"chief": ["127.0.0.1:2222"], "worker": ["127.0.0.1:2222", "127.0.0.1:2222"]'

start() {  # start <dir> <rank> <attempt> <log>: starts one replica, its pid in $started
  local task='{"type": "chief", "index": 0}'
  [[ $2 -gt 0 ]] && task="{\"type\": \"worker\", \"index\": $(($2 - 1))}"
  TF_CONFIG="{\"cluster\": {$cluster}, \"task\": $task}" LONGHAUL_RESTART_ATTEMPT="$3" \
    "$worker" train --config "$1/cfg.yaml" --logdir "$1/run" >"$4" 2>"$4.err" &
  started=$!
  pids+=("$started")
}

last_step() {  # the last "step N/" progress line of a log, 0 when none
  { grep -o 'step *[0-9]*/' "$1" 2>/dev/null || true; } | tail -1 | tr -dc '0-9' | sed 's/^$/0/'
}

wait_step_above() {  # wait_step_above <log> <step>: polls (20 ms) until the log shows a later step
  until [[ $(last_step "$1") -gt $2 ]]; do sleep 0.02; done
}

scenario() {  # scenario <name> <victim rank> <KILL|TERM> <regroup|exit>
  local dir="$work/$1" r rep=()
  mkdir -p "$dir"
  config "$4" >"$dir/cfg.yaml"
  for r in 0 1 2; do start "$dir" "$r" a0 "$dir/$r.log"; rep+=("$started"); done
  local watch=0
  [[ $2 -eq 0 ]] && watch=1
  wait_step_above "$dir/$watch.log" $((lose_at - 1))
  local t0 before resumed t1 redone read
  kill -"$3" "${rep[$2]}"
  t0=$(now)
  set +e; wait "${rep[$2]}" 2>/dev/null; set -e
  before=$(last_step "$dir/$watch.log")
  if [[ $4 == regroup ]]; then
    start "$dir" "$2" a0 "$dir/$2.replacement.log"
    rep[$2]=$started
    wait_step_above "$dir/$watch.log" "$before"
    t1=$(now)
    resumed=$(grep -o 'resuming at step [0-9]*' "$dir/$2.replacement.log" | tr -dc '0-9')
  else
    for r in 0 1 2; do
      [[ $r -eq $2 ]] && continue
      set +e; wait "${rep[$r]}" 2>/dev/null; set -e
    done
    before=$(last_step "$dir/$watch.log")
    for r in 0 1 2; do start "$dir" "$r" a1 "$dir/$r.restart.log"; rep[$r]=$started; done
    until grep -q 'resuming at step' "$dir/$watch.restart.log" 2>/dev/null; do sleep 0.02; done
    resumed=$(grep -o 'resuming at step [0-9]*' "$dir/$watch.restart.log" | tr -dc '0-9')
    wait_step_above "$dir/$watch.restart.log" "$resumed"
    t1=$(now)
  fi
  redone=$((before - resumed))
  [[ $redone -lt 0 ]] && redone=0
  read=no
  if cat "$dir"/*.err | grep -q 'restored checkpoint'; then read=yes; fi
  for r in "${rep[@]}"; do kill -KILL "$r" 2>/dev/null || true; done
  wait 2>/dev/null || true
  printf "%-34s %14s %13s %12s %16s\n" "$5" "$(calc "$t1 - $t0")" "$redone" "$read" \
    "$before->$resumed"
}

echo "== recovery, processes only (no operator, no pods): 3 replicas, $preset, per replica" \
  "batch ${batch}x${seq}, checkpoint every $save_every steps, fault after step $lose_at," \
  "$(nproc) CPUs"
printf "%-34s %14s %13s %12s %16s\n" scenario fault_to_step_s steps_redone ckpt_read \
  "step_before->from"
scenario worker-kill 2 KILL regroup "in place: worker SIGKILL"
scenario chief-kill 0 KILL regroup "in place: chief SIGKILL"
scenario worker-term 2 TERM regroup "in place: worker SIGTERM (notice)"
scenario group-restart 2 KILL exit "group restart: worker SIGKILL"
