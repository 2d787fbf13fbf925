#!/usr/bin/env bash
# datapar's dcp::AsyncSaver against PyTorch's dcp.async_save, with dcp.save / dcp::save beside
# each: ResNet-18 or a 143 M-parameter MLP with Adam, 2 ranks, training steps while the write is
# in flight (bench/async_save_bench.cc, bench/torch_async_save.py). One run of each side per
# round, the order swapped every round; each run prints its medians; then the medians of those.
#   bench/async_save_ab.sh BIN_DIR PYTHON [model=resnet18] [rounds=3] [DIR=/tmp]
# BIN_DIR holds async_save_bench (e.g. build/bin); PYTHON has torch 2.15 (scripts/setup_torch.sh).
set -euo pipefail
bin=$1
python=$2
model=${3:-resnet18}
rounds=${4:-3}
base=${5:-/tmp}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
field() { sed -n "s/.*$1 \([0-9][0-9.]*\).*/\1/p"; }
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then order="datapar torch"; else order="torch datapar"; fi
  for side in $order; do
    dir=$(mktemp -d "$base/async_ab.XXXXXX")
    if [[ $side == datapar ]]; then
      out=$("$bin/async_save_bench" "$dir" --model "$model" --rounds 3)
    else
      out=$("$python" "$here/torch_async_save.py" "$dir" --model "$model" --rounds 3)
    fi
    rm -rf "$dir"
    line=$(grep "$model + adam" <<<"$out") || { echo "no times from $side:" >&2; echo "$out" >&2; exit 1; }
    echo "round $r $side: $line"
    field "sync save" <<<"$line" >>"$tmp/$side.sync"
    field "async save blocked" <<<"$line" >>"$tmp/$side.blocked"
    field "during the write" <<<"$line" >>"$tmp/$side.pace"
  done
done
for side in datapar torch; do
  printf "%s medians: sync save %s ms, async save blocked %s ms, training pace during the write %s\n" "$side" \
    "$(median <"$tmp/$side.sync")" "$(median <"$tmp/$side.blocked")" "$(median <"$tmp/$side.pace")"
done
rm -rf "$tmp"
