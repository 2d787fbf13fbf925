#!/usr/bin/env bash
# A/B of the DDP training step between two builds of datapar (e.g. before and after a
# change), on one machine in one run: `datapar bench ddp` with each build in turn, the
# order swapped every round so that neither gains from going second, then the medians.
#   bench/ddp_step_ab.sh BEFORE_BIN_DIR AFTER_BIN_DIR [rounds=5] [models="mlp lenet"] [backend=gloo]
# Each *_BIN_DIR holds that build's `datapar` (e.g. build/bin). Two ranks, each on a core of
# its own (`datapar launch`, or mpirun for mpi, whatever the build's `bench --nproc` does),
# the backend with shared memory, each build's defaults for batch and steps. Prints each
# run's "ddp step" and "local step" times and, per model, the medians and after/before.
set -euo pipefail
before=$1
after=$2
rounds=${3:-5}
models=${4:-mlp lenet}
backend=${5:-gloo}

step_ms() {  # $1: bin dir, $2: model -> "ddp_ms local_ms"
  local out cmd=("$1/datapar" bench ddp --model "$2" --backend "$backend")
  if [[ $backend == mpi ]]; then
    cmd=(mpirun --allow-run-as-root --oversubscribe -n 2 "${cmd[@]}")
  else
    cmd=("$1/datapar" launch --nproc-per-node 2 -- "${cmd[@]}")
  fi
  out=$("${cmd[@]}" | sed 's/^\[rank 0\] //')
  local ddp local_
  ddp=$(sed -n 's/^ddp step: \([0-9.]*\) ms.*/\1/p' <<<"$out")
  local_=$(sed -n 's/^local step (no synchronisation): \([0-9.]*\) ms.*/\1/p' <<<"$out")
  [[ -n $ddp && -n $local_ ]] || { echo "no step times in the output of $1/datapar:" >&2; echo "$out" >&2; exit 1; }
  echo "$ddp $local_"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for model in $models; do
  : >"/tmp/ddp_step_ab.$$.before" ; : >"/tmp/ddp_step_ab.$$.after"
  for ((r = 1; r <= rounds; r++)); do
    if ((r % 2)); then order="before after"; else order="after before"; fi
    for side in $order; do
      dir=$before; [[ $side == after ]] && dir=$after
      read -r ddp local_ < <(step_ms "$dir" "$model")
      echo "$ddp $local_" >>"/tmp/ddp_step_ab.$$.$side"
      printf '%s round %d %-6s ddp step %s ms, local step %s ms\n' "$model" "$r" "$side" "$ddp" "$local_"
    done
  done
  b=$(cut -d' ' -f1 "/tmp/ddp_step_ab.$$.before" | median)
  a=$(cut -d' ' -f1 "/tmp/ddp_step_ab.$$.after" | median)
  bl=$(cut -d' ' -f2 "/tmp/ddp_step_ab.$$.before" | median)
  al=$(cut -d' ' -f2 "/tmp/ddp_step_ab.$$.after" | median)
  awk -v m="$model" -v r="$rounds" -v b="$b" -v a="$a" -v bl="$bl" -v al="$al" 'BEGIN {
    printf "%s, medians of %d rounds: ddp step before %.2f ms, after %.2f ms (after/before %.3f); local step before %.2f ms, after %.2f ms (%.3f)\n",
           m, r, b, a, a / b, bl, al, al / bl }'
  rm -f "/tmp/ddp_step_ab.$$.before" "/tmp/ddp_step_ab.$$.after"
done
