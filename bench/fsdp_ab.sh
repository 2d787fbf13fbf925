#!/usr/bin/env bash
# datapar's FullyShardedDataParallel against PyTorch's fully_shard (FSDP2) on gloo, on one
# machine in one run: `datapar bench fsdp` and bench/torch_fsdp.py in turn, the order swapped
# every round, two ranks each bound to a core, one thread each, Adam, the same models and
# batches; then per model the medians of each side's FSDP and DDP step times and the ratios.
#   bench/fsdp_ab.sh BIN_DIR PYTHON [rounds=3] [models="mlp resnet18"]
# BIN_DIR holds `datapar` (e.g. build-torch2/bin); PYTHON has torch (e.g. the pip torch 2.15
# that .ci/run installs: ~/.cache/datapar/torch-2.15.0/bin/python3).
set -euo pipefail
bin=$1
python=$2
rounds=${3:-3}
models=${4:-mlp resnet18}
here=$(cd "$(dirname "$0")" && pwd)

times_ms() {  # stdin: a bench's output -> "fsdp_ms ddp_ms"
  sed -n 's/^.*step (median, slowest rank): ddp \([0-9.]*\) ms, fsdp \([0-9.]*\) ms.*/\2 \1/p'
}
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for model in $models; do
  tmp=$(mktemp -d)
  for ((r = 1; r <= rounds; r++)); do
    if ((r % 2)); then order="datapar torch"; else order="torch datapar"; fi
    for side in $order; do
      if [[ $side == datapar ]]; then
        out=$("$bin/datapar" bench fsdp --model "$model" --rounds 3 | sed 's/^\[rank 0\] //')
      else
        out=$("$python" "$here/torch_fsdp.py" --model "$model" --rounds 3)
      fi
      read -r fsdp ddp < <(times_ms <<<"$out") || { echo "no step times from $side:" >&2; echo "$out" >&2; exit 1; }
      echo "$model round $r $side: fsdp $fsdp ms, ddp $ddp ms"
      echo "$fsdp" >>"$tmp/$side.fsdp"
      echo "$ddp" >>"$tmp/$side.ddp"
      [[ $r == 1 ]] && grep -E "per rank|MiB|gathered" <<<"$out" | sed "s/^/  $side: /"
    done
  done
  df=$(median <"$tmp/datapar.fsdp"); dd=$(median <"$tmp/datapar.ddp")
  tf=$(median <"$tmp/torch.fsdp"); td=$(median <"$tmp/torch.ddp")
  awk -v m="$model" -v df="$df" -v dd="$dd" -v tf="$tf" -v td="$td" 'BEGIN {
    printf "%s medians: datapar fsdp %.2f ms (%.3f of its ddp %.2f); torch fsdp %.2f ms (%.3f of its ddp %.2f); ", m, df, df / dd, dd, tf, tf / td, td
    printf "datapar fsdp / torch fsdp %.3f (samples/s ratio %.2f)\n", df / tf, tf / df }'
  rm -rf "$tmp"
done
