#!/usr/bin/env bash
# What one failure in the middle of an epoch costs a training job (issue 31, slice 4): the
# fault-tolerant path against the restart path, on one machine in one run. Three ways:
#   ft       datapar launch --fault-tolerant + datapar train --fault-tolerant (the group's
#            collectives through shared memory)
#   ft-tcp   the same with DATAPAR_SHM=0: gloo over TCP, as between machines
#   restart  datapar launch --max-restarts 1 + datapar train --checkpoint-dir: every rank
#            stops, starts again and reloads the last checkpoint (torchrun's way)
# Each round runs every way uninterrupted and with rank 1 SIGKILLed half an epoch after the
# first checkpoint (the middle of epoch 2), the ways in a rotated order. Per way it reports
# the medians of
#   lost      the killed run's wall time minus the uninterrupted run's, in seconds
#   resumed   seconds from the kill to training going on: for ft, the first step the
#             survivors commit after it ("membership epoch" line); for restart, the
#             restarted job's "resuming from" line (before its first step)
# `mode`: what every way trains, ddp or fsdp (each rank's shard kept by the next rank too).
#   bench/ft_recovery.sh [bin_dir=build/bin] [rounds=3] [data=../shared/datasets/fashion-mnist] [limit=30000]
#                        [mode=ddp]
set -euo pipefail
bin=${1:-build/bin}
rounds=${2:-3}
data=${3:-../shared/datasets/fashion-mnist}
limit=${4:-30000}
mode=${5:-ddp}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

now() { date +%s.%N; }
# Every output line with the time it arrived.
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(now)" "$line"; done; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# The worker of launcher $1 whose RANK is $2.
worker() {
  local child
  for child in $(pgrep -P "$1"); do
    if tr '\0' '\n' <"/proc/$child/environ" 2>/dev/null | grep -qx "RANK=$2"; then echo "$child"; return; fi
  done
}

wait_for() { while [[ ! -e $1 ]]; do sleep 0.01; done; }

# run WAY KILL: prints "wall_seconds resumed_seconds epoch_seconds": uninterrupted (KILL 0),
# resumed is -; killed (KILL 1, half of $epoch_s after the first checkpoint), epoch is -.
run() {
  local way=$1 kill=$2 dir=$work/$1.$2
  rm -rf "$dir"
  mkdir -p "$dir/checkpoints"
  local launch=(--nproc-per-node 2 --max-restarts 1) train=(--mode "$mode" --backend gloo --model lenet --epochs 3
    --batch-size 64 --data "$data" --limit "$limit" --workers 1 --checkpoint-dir "$dir/checkpoints")
  local shm=1 resumed_line="resuming from"
  if [[ $way == ft* ]]; then
    launch+=(--fault-tolerant)
    train+=(--fault-tolerant)
    resumed_line="membership epoch"
  fi
  [[ $way == ft-tcp ]] && shm=0
  local start end killed_at= epoch=-
  start=$(now)
  DATAPAR_SHM=$shm "$bin/datapar" launch "${launch[@]}" -- "$bin/datapar" train "${train[@]}" \
    > >(stamp >"$dir/log") 2>&1 &
  local launcher=$!
  wait_for "$dir/checkpoints/checkpoint-epoch-1.pt"
  local first
  first=$(now)
  if ((kill)); then
    sleep "$(awk -v e="$epoch_s" 'BEGIN { print e / 2 }')"
    local victim
    victim=$(worker "$launcher" 1)
    [[ -n $victim ]] || { echo "ft_recovery: no rank 1 under launcher $launcher" >&2; exit 1; }
    kill -9 "$victim"
    killed_at=$(now)
  else
    wait_for "$dir/checkpoints/checkpoint-epoch-2.pt"
    epoch=$(awk -v a="$first" -v b="$(now)" 'BEGIN { print b - a }')
  fi
  wait "$launcher" || { echo "ft_recovery: $way (kill=$kill) failed:" >&2; cat "$dir/log" >&2; exit 1; }
  end=$(now)
  sleep 0.2  # the last lines through stamp
  local resumed=-
  if ((kill)); then
    resumed=$(awk -v k="$killed_at" -v pattern="$resumed_line" '$1 > k && index($0, pattern) { print $1 - k; exit }' \
      "$dir/log")
    [[ -n $resumed ]] || { echo "ft_recovery: $way resumed nowhere after the kill:" >&2; cat "$dir/log" >&2; exit 1; }
  fi
  echo "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }') $resumed $epoch"
}

read -r -a ways <<<"${FT_RECOVERY_WAYS:-ft ft-tcp restart}"  # e.g. FT_RECOVERY_WAYS="ft restart"
for way in "${ways[@]}"; do : >"$work/$way.lost"; : >"$work/$way.resumed"; done
for ((r = 0; r < rounds; r++)); do
  for ((i = 0; i < ${#ways[@]}; i++)); do
    way=${ways[$(((i + r) % ${#ways[@]}))]}
    read -r straight _ epoch_s < <(run "$way" 0)
    read -r killed resumed _ < <(run "$way" 1)
    lost=$(awk -v a="$killed" -v b="$straight" 'BEGIN { printf "%.2f", a - b }')
    echo "round $((r + 1)) $way: uninterrupted ${straight} s, killed ${killed} s, lost ${lost} s, resumed ${resumed} s after the kill"
    echo "$lost" >>"$work/$way.lost"
    echo "$resumed" >>"$work/$way.resumed"
  done
done
echo "medians over $rounds rounds (LeNet, $mode, 2 ranks, $limit samples, 3 epochs, kill in the middle of epoch 2):"
for way in "${ways[@]}"; do
  echo "  $way: lost $(median <"$work/$way.lost") s, resumed $(median <"$work/$way.resumed") s after the kill"
done
