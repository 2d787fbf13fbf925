#!/usr/bin/env bash
# Activation checkpointing against plain training (bench/checkpoint_bench.cc), one process
# per run, the two modes taking turns, the order swapped every round; then the medians.
#   bench/checkpoint_ab.sh BIN_DIR [rounds=3] [bench options...]
# glibc serves blocks of 64 KiB and more by mmap here, and unmaps them when freed, so a
# process's peak resident memory follows its peak live memory; with its defaults, freed
# heap blocks stay resident and the peak measures fragmentation (checkpointing then showed
# 1.25x the memory of plain training, measured).
set -euo pipefail
export MALLOC_MMAP_THRESHOLD_=65536
bin=$1
rounds=${2:-3}
shift $(($# >= 2 ? 2 : 1))
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then order="plain checkpoint"; else order="checkpoint plain"; fi
  for mode in $order; do
    "$bin/checkpoint_bench" --mode "$mode" "$@" | tee -a "$out"
  done
done
awk '
  { mode = $2; sub(":", "", mode); mem[mode] = mem[mode] " " $5; ms[mode] = ms[mode] " " $8 }
  function median(s,   a, n, i, j, t) {
    n = split(s, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    printf "medians: plain %.1f MiB, %.1f ms; checkpoint %.1f MiB, %.1f ms; checkpoint / plain: memory %.2f, time %.2f\n",
           median(mem["plain"]), median(ms["plain"]), median(mem["checkpoint"]), median(ms["checkpoint"]),
           median(mem["checkpoint"]) / median(mem["plain"]), median(ms["checkpoint"]) / median(ms["plain"])
  }' "$out"
