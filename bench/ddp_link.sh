#!/usr/bin/env bash
# DDP's step against compressed gradients on a slow link: two "machines" (network namespaces
# joined by a veth link shaped with tc: a rate, and a delay where netem exists), one rank in
# each. `datapar bench ddp --comm-hook HOOK` times plain DDP and DDP with the hook by turns
# and prints the gradient bytes each rank sends per step.
#   bench/ddp_link.sh BIN_DIR [hook=powersgd:4:3] [model=resnet18] [rounds=3] [rate=1gbit] [delay=0.5ms]
# Needs root (ip netns, tc). BIN_DIR holds `datapar` (e.g. build/bin).
set -euo pipefail
bin=$1
hook=${2:-powersgd:4:3}
model=${3:-resnet18}
rounds=${4:-3}
rate=${5:-1gbit}
delay=${6:-0.5ms}

id=$$
a=dpd_a_$id b=dpd_b_$id va=dpda$((id % 100000)) vb=dpdb$((id % 100000))
subnet=10.233.$((id % 250))
cleanup() { ip netns del "$a" 2>/dev/null || true; ip netns del "$b" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$a"
ip netns add "$b"
ip link add "$va" type veth peer name "$vb"
ip link set "$va" netns "$a"
ip link set "$vb" netns "$b"
ip -n "$a" addr add "$subnet.1/24" dev "$va"
ip -n "$b" addr add "$subnet.2/24" dev "$vb"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "$va" up
ip -n "$b" link set "$vb" up
# netem gives the rate and the delay; a kernel without it (sch_netem) gets the rate alone,
# from a token bucket (tbf), and says so.
shaped="$rate, $delay each way"
for end in "$a $va" "$b $vb"; do
  set -- $end
  if ! ip netns exec "$1" tc qdisc add dev "$2" root netem rate "$rate" delay "$delay" 2>/dev/null; then
    ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst 256kb latency 100ms
    shaped="$rate each way (tbf; no delay: this kernel has no netem)"
  fi
done
echo "link: $shaped; two namespaces of one rank"

run() {  # node 1 first: its rank waits for node 0's store
  local port=$((29600 + RANDOM % 300))
  local node
  for node in 1 0; do
    local ns=$a address=$subnet.1
    if ((node == 1)); then ns=$b address=$subnet.2; fi
    ip netns exec "$ns" env DATAPAR_GLOO_HOSTNAME="$address" "$bin/datapar" launch --nproc-per-node 1 --nnodes 2 \
      --node-rank "$node" --master-addr "$subnet.1" --master-port "$port" --token ddplink -- \
      "$bin/datapar" bench ddp --model "$model" --warmup 3 --steps 5 --comm-hook "$hook" > "$tmp/datapar.$node" 2>&1 &
    sleep 0.2
  done
  wait
  sed 's/^\[rank 0\] //' "$tmp/datapar.0" | grep -E "^(datapar bench ddp|ddp step|comm hook)"
}

tmp=$(mktemp -d)
for ((r = 1; r <= rounds; r++)); do
  echo "== round $r"
  run
done
rm -rf "$tmp"
