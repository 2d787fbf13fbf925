#!/usr/bin/env bash
# Two "machines" on this one: network namespaces joined by a veth link shaped as a slow
# inter-machine network (tc netem: a rate and a delay each way), two ranks in each. On it,
# in turns (the order swapped every round): `datapar bench fsdp --hsdp` (DDP, FSDP over all
# four ranks and HSDP 2 x 2, with the bytes each sends over the link) and PyTorch's peer,
# bench/torch_hsdp.py (DDP, fully_shard over the four, fully_shard on a (2, 2) mesh).
#   bench/hsdp_link.sh BIN_DIR PYTHON [rounds=3] [model=mlp] [rate=1gbit] [delay=0.5ms]
# DATAPAR_ARGS: more arguments for `datapar bench fsdp` (e.g. --fault-tolerant: the
# fault-tolerant FSDP and HSDP steps too, with their bytes over the link).
# Needs root (ip netns, tc). BIN_DIR holds `datapar` (e.g. build-torch2/bin); PYTHON has
# torch (e.g. ~/.cache/datapar/torch-2.15.0/bin/python3).
set -euo pipefail
bin=$1
python=$2
rounds=${3:-3}
model=${4:-mlp}
rate=${5:-1gbit}
delay=${6:-0.5ms}
here=$(cd "$(dirname "$0")" && pwd)

prefix=dph
source "$here/link_namespaces.sh"
echo "link: $shaped; two namespaces of two ranks"

datapar_side() {  # node 1 first: its ranks wait for node 0's store
  local port=$((29600 + RANDOM % 300))
  local node
  for node in 1 0; do
    local ns=$a address=$subnet.1
    if ((node == 1)); then ns=$b address=$subnet.2; fi
    ip netns exec "$ns" env DATAPAR_GLOO_HOSTNAME="$address" "$bin/datapar" launch --nproc-per-node 2 --nnodes 2 \
      --node-rank "$node" --master-addr "$subnet.1" --master-port "$port" --token hsdp -- \
      "$bin/datapar" bench fsdp --hsdp --model "$model" --rounds 3 ${DATAPAR_ARGS:-} > "$tmp/datapar.$node" 2>&1 &
    sleep 0.2
  done
  wait
  sed 's/^\[rank 0\] //' "$tmp/datapar.0"
}

torch_side() {
  local port=$((29900 + RANDOM % 90))
  local r
  for r in 3 2 1 0; do
    local ns=$a ifname=$va
    if ((r >= 2)); then ns=$b ifname=$vb; fi
    ip netns exec "$ns" env GLOO_SOCKET_IFNAME="$ifname" "$python" "$here/torch_hsdp.py" --model "$model" \
      --rank "$r" --world 4 --master "$subnet.1" --port "$port" --rounds 3 > "$tmp/torch.$r" 2>&1 &
  done
  wait
  cat "$tmp/torch.0"
}

tmp=$(mktemp -d)
for ((r = 1; r <= rounds; r++)); do
  if ((r % 2)); then order="datapar torch"; else order="torch datapar"; fi
  for side in $order; do
    echo "== round $r: $side"
    if [[ $side == datapar ]]; then datapar_side; else torch_side; fi
  done
done
rm -rf "$tmp"
