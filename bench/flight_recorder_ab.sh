#!/usr/bin/env bash
# What the flight recorder costs: `datapar bench ddp` (2 ranks, gloo) with
# DATAPAR_FLIGHT_RECORDER=2000 and without, alternated, the order swapped every round; the
# DDP step's medians and their ratio.
#   bench/flight_recorder_ab.sh BIN_DIR [model=mlp] [rounds=3]
set -euo pipefail
bin=$1
model=${2:-mlp}
rounds=${3:-3}
tmp=$(mktemp -d)
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then order="off on"; else order="on off"; fi
  for side in $order; do
    entries=0
    [[ $side == on ]] && entries=2000
    out=$(DATAPAR_FLIGHT_RECORDER=$entries DATAPAR_FLIGHT_RECORDER_DIR=$tmp/dumps \
      "$bin/datapar" launch --nproc-per-node 2 -- "$bin/datapar" bench ddp --model "$model" 2>&1)
    step=$(sed -n 's/^\[rank 0\] ddp step: \([0-9.]*\) ms.*/\1/p' <<<"$out")
    [[ -n $step ]] || { echo "no step time ($side):" >&2; echo "$out" >&2; exit 1; }
    echo "round $r, recorder $side: ddp step $step ms"
    echo "$step" >>"$tmp/$side"
  done
done
off=$(median <"$tmp/off"); on=$(median <"$tmp/on")
awk -v off="$off" -v on="$on" -v m="$model" 'BEGIN { printf "%s: ddp step medians: recorder off %.3f ms, on (2000) %.3f ms: %.4f\n", m, off, on, on / off }'
rm -rf "$tmp"
