#!/usr/bin/env bash
# Unlike devices, made on purpose: one of two CPU devices (dp) or ranks (ddp) shares its core
# with a competing process, so it runs at about half speed. Trains the same job with
# --balance even and --balance auto, alternating, and prints each run's samples/s (the median
# over the epochs after the first, when auto has measured and re-split) and the ratio
# auto / even per round.
#   bench/balance_under_load.sh [mode=dp|ddp] [model=lenet] [rounds=3] [epochs=4] [limit=0: all 6000]
# dp: DataParallel pins cpu:K's thread to core K (Note [Pinning CPU devices]).
# ddp: each rank is pinned to core LOCAL_RANK with taskset. The competitor is pinned to core 1.
# Needs 2 cores; uses the shipped Fashion-MNIST subset (6000 samples), batch 256.
set -euo pipefail
mode=${1:-dp}
model=${2:-lenet}
rounds=${3:-3}
epochs=${4:-4}
limit=${5:-0}
root=$(cd "$(dirname "$0")/.." && pwd)
cli=$root/build/bin/datapar
out=$(mktemp -d)
trap 'kill "$hog" 2>/dev/null || true; rm -rf "$out"' EXIT

taskset -c 1 bash -c 'while :; do :; done' &
hog=$!

run() {  # run BALANCE ROUND: prints the median samples/s of epochs 2..
  local metrics=$out/$1-$2.jsonl
  local common=(train --model "$model" --epochs "$epochs" --batch-size 256 --lr 0.1 --balance "$1" --limit "$limit"
          --metrics "$metrics")
  if [[ $mode == dp ]]; then
    "$cli" "${common[@]}" --mode dp --devices cpu:0,cpu:1 > "$out/$1-$2.log"
  else
    "$cli" launch --nproc-per-node 2 -- bash -c 'exec taskset -c "$LOCAL_RANK" "$0" "$@"' \
      "$cli" "${common[@]}" --mode ddp --threads 1 > "$out/$1-$2.log"
  fi
  grep -h 'balance: step' "$out/$1-$2.log" | tail -1 >&2 || true
  python3 - "$metrics" <<'PY'
import json, statistics, sys
epochs = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
print(statistics.median(e["samples_per_second"] for e in epochs[1:] or epochs))
PY
}

unit=devices
[[ $mode == dp ]] || unit=ranks
echo "$mode, $model, batch 256, $epochs epochs (limit $limit), one of two $unit slowed by a process on its core"
for ((r = 1; r <= rounds; r++)); do
  even=$(run even "$r")
  auto=$(run auto "$r")
  awk -v e="$even" -v a="$auto" -v r="$r" \
    'BEGIN { printf "round %d: even %.0f samples/s, auto %.0f samples/s: auto/even %.2fx\n", r, e, a, a / e }'
done
