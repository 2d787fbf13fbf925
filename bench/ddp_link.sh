#!/usr/bin/env bash
# DDP's step against compressed gradients on a slow link: two "machines" (network namespaces
# joined by a veth link shaped with tc: a rate, and a delay where netem exists), one rank in
# each. `datapar bench ddp --comm-hook HOOK` times plain DDP and DDP with the hook by turns
# and prints the gradient bytes each rank sends per step; hook "none" leaves it out, and
# DATAPAR_ARGS adds flags (e.g. DATAPAR_ARGS="--sync-every 50 --fragments 4": DiLoCo's rounds
# against DDP, with the bytes measured on the link). TORCH_PYTHON (a python with torch) adds
# PyTorch's DDP, and its powerSGD_hook for a powersgd hook, on the same link in each round
# (bench/torch_ddp.py, one rank per namespace), after datapar's.
#   bench/ddp_link.sh BIN_DIR [hook=powersgd:4:3] [model=resnet18] [rounds=3] [rate=1gbit] [delay=0.5ms] [steps=5]
# Needs root (ip netns, tc). BIN_DIR holds `datapar` (e.g. build/bin).
set -euo pipefail
bin=$1
hook=${2:-powersgd:4:3}
model=${3:-resnet18}
rounds=${4:-3}
rate=${5:-1gbit}
delay=${6:-0.5ms}
steps=${7:-5}
hook_flag=()
if [[ $hook != none ]]; then hook_flag=(--comm-hook "$hook"); fi

here=$(cd "$(dirname "$0")" && pwd)
prefix=dpd
source "$here/link_namespaces.sh"
echo "link: $shaped; two namespaces of one rank"

run() {  # node 1 first: its rank waits for node 0's store
  local port=$((29600 + RANDOM % 300))
  local node
  for node in 1 0; do
    local ns=$a address=$subnet.1
    if ((node == 1)); then ns=$b address=$subnet.2; fi
    ip netns exec "$ns" env DATAPAR_GLOO_HOSTNAME="$address" "$bin/datapar" launch --nproc-per-node 1 --nnodes 2 \
      --node-rank "$node" --master-addr "$subnet.1" --master-port "$port" --token ddplink -- \
      "$bin/datapar" bench ddp --model "$model" --warmup 3 --steps "$steps" "${hook_flag[@]}" ${DATAPAR_ARGS:-} \
      > "$tmp/datapar.$node" 2>&1 &
    sleep 0.2
  done
  wait_for datapar
  sed 's/^\[rank 0\] //' "$tmp/datapar.0" | grep -E "^(datapar bench ddp|ddp step|comm hook|DiLoCo|local SGD)"
  [[ -n ${TORCH_PYTHON:-} ]] || return 0
  port=$((29900 + RANDOM % 90))
  for node in 1 0; do
    local ns=$a dev=$va
    if ((node == 1)); then ns=$b dev=$vb; fi
    ip netns exec "$ns" env GLOO_SOCKET_IFNAME="$dev" timeout 600 "$TORCH_PYTHON" "$here/torch_ddp.py" \
      --model "$model" --nproc 2 --rank "$node" --master "$subnet.1:$port" --warmup 3 --steps "$steps" \
      "${torch_hook[@]}" > "$tmp/torch.$node" 2>&1 &
    sleep 0.2
  done
  wait_for torch
  grep -E "^(torch .* DDP|ddp step|comm hook)" "$tmp/torch.0"
}

# Waits for both ranks of a side; a rank that failed has its log printed and stops the script.
wait_for() {
  local side=$1 node failed=0
  for node in 0 1; do
    if ! wait -n; then failed=1; fi
  done
  if ((failed)); then
    for node in 0 1; do echo "--- $side rank $node:"; tail -20 "$tmp/$side.$node"; done
    exit 1
  fi
}

torch_hook=()
if [[ $hook == powersgd:* ]]; then
  IFS=: read -r _ torch_rank torch_start <<<"$hook"
  torch_hook=(--powersgd "$torch_rank:${torch_start:-2}")
fi

tmp=$(mktemp -d)
for ((r = 1; r <= rounds; r++)); do
  echo "== round $r"
  run
done
rm -rf "$tmp"
