#!/usr/bin/env bash
# datapar's dcp::save / dcp::load against PyTorch's dcp.save / dcp.load: ResNet-18 + Adam
# state, 2 ranks, the same file system (a fresh directory under DIR per run), one run of each
# in turn per round, the order swapped every round; then the medians and the ratios.
#   bench/dcp_ab.sh BIN_DIR PYTHON [rounds=3] [DIR=/tmp]
# BIN_DIR holds dcp_bench (e.g. build-torch2/bin); PYTHON has torch 2.15 (scripts/setup_torch.sh).
set -euo pipefail
bin=$1
python=$2
rounds=${3:-3}
base=${4:-/tmp}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then order="datapar torch"; else order="torch datapar"; fi
  for side in $order; do
    dir=$(mktemp -d "$base/dcp_ab.XXXXXX")
    if [[ $side == datapar ]]; then
      out=$("$bin/dcp_bench" "$dir" --rounds 5)
    else
      out=$("$python" "$here/torch_dcp.py" "$dir" --rounds 5)
    fi
    rm -rf "$dir"
    line=$(grep "resnet18 + adam" <<<"$out") || { echo "no times from $side:" >&2; echo "$out" >&2; exit 1; }
    echo "round $r $side: $line"
    [[ $r == 1 ]] && grep "wrote" <<<"$out" | sed "s/^/  $side: /"
    sed -n 's/.*save \([0-9.]*\) ms, load \([0-9.]*\) ms.*/\1/p' <<<"$line" >>"$tmp/$side.save"
    sed -n 's/.*save \([0-9.]*\) ms, load \([0-9.]*\) ms.*/\2/p' <<<"$line" >>"$tmp/$side.load"
  done
done
ds=$(median <"$tmp/datapar.save"); dl=$(median <"$tmp/datapar.load")
ts=$(median <"$tmp/torch.save"); tl=$(median <"$tmp/torch.load")
awk -v ds="$ds" -v dl="$dl" -v ts="$ts" -v tl="$tl" 'BEGIN {
  printf "medians: save datapar %.1f ms, torch %.1f ms (%.2fx); load datapar %.1f ms, torch %.1f ms (%.2fx)\n",
         ds, ts, ts / ds, dl, tl, tl / dl }'
rm -rf "$tmp"
