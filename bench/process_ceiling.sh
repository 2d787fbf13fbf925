#!/usr/bin/env bash
# The speedup ceiling of data parallelism on this machine, without threads in the picture:
# one process trains the bare module on the full batch, then two processes train on half
# the batch each at the same time. Prints both and their ratio, for several rounds.
#   bench/process_ceiling.sh [model=mlp] [batch=256] [rounds=5]
set -euo pipefail
model=${1:-mlp}
batch=${2:-256}
rounds=${3:-5}
bench="$(dirname "$0")/../build/bin/dp_step_bench"
for ((r = 1; r <= rounds; r++)); do
  full=$("$bench" --solo --model "$model" --batch "$batch" --steps 60)
  halves=$( ("$bench" --solo --model "$model" --batch $((batch / 2)) --steps 60 &
             "$bench" --solo --model "$model" --batch $((batch / 2)) --steps 60 & wait) | sort -n | tail -1)
  awk -v f="$full" -v h="$halves" -v m="$model" -v b="$batch" \
    'BEGIN { printf "%s batch %d: 1 process %.2f ms/step, 2 processes x half batch %.2f ms/step (slower one): %.2fx\n", m, b, f, h, f / h }'
done
