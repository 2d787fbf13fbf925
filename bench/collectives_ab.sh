#!/usr/bin/env bash
# A/B of `datapar bench collectives` between two builds of datapar (e.g. before and after a
# change), on one machine in one run: all_reduce, broadcast and all_gather over 2 processes,
# each build in turn, the order swapped every round, then a table of medians.
#   bench/collectives_ab.sh BEFORE_BIN_DIR AFTER_BIN_DIR [rounds=5] [backend=gloo]
# Each run's ranks are bound to a core each, as mpirun binds them (backend mpi) and
# `datapar launch` does (the others), whatever the build's `bench --nproc` does: unbound,
# the same binary gave 4 or 55-80 us for a 4 KiB all_reduce, by the luck of thread
# placement. The first size is a warm-up and is not reported.
set -euo pipefail
before=$1
after=$2
rounds=${3:-5}
backend=${4:-gloo}
sizes=4KiB,64,4KiB,64KiB,1MiB,16MiB
out=$(mktemp)
trap 'rm -f "$out"' EXIT

run() {  # $1: bin dir, $2: op -> lines "size us", the warm-up size left out
  local cmd=("$1/datapar" bench collectives --backend "$backend" --op "$2" --sizes "$sizes" --iters 200)
  if [[ $backend == mpi ]]; then
    cmd=(mpirun --allow-run-as-root --oversubscribe -n 2 "${cmd[@]}")
  else
    cmd=("$1/datapar" launch --nproc-per-node 2 -- "${cmd[@]}")
  fi
  "${cmd[@]}" | sed 's/^\[rank 0\] //' |
    awk -F'|' '/^\| [0-9]/ { gsub(/ /, "", $2); gsub(/ /, "", $3); if (n++) print $2, $3 }'
}

for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then order="before after"; else order="after before"; fi
  for side in $order; do
    dir=$before; [[ $side == after ]] && dir=$after
    for op in all_reduce broadcast all_gather; do
      run "$dir" "$op" | sed "s/^/$side $op /" >>"$out"
    done
  done
  echo "round $r of $rounds done" >&2
done

echo "| op | size | before, us | after, us | after / before |"
echo "|---|---|---|---|---|"
awk '
  { v[$2 " " $3 " " $1] = v[$2 " " $3 " " $1] " " $4; if (!seen[$2 " " $3]++) keys[++k] = $2 " " $3 }
  function median(s,   a, n, i, j, t) {
    n = split(s, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    for (i = 1; i <= k; i++) {
      split(keys[i], p, " ")
      b = median(v[keys[i] " before"]); a = median(v[keys[i] " after"])
      printf "| %s | %s | %.1f | %.1f | %.2f |\n", p[1], p[2], b, a, a / b
    }
  }' "$out"
