# Sourced by bench/hsdp_link.sh and bench/ddp_link.sh: two network namespaces $a and $b
# ("machines") joined by a veth link ($va in $a at $subnet.1, $vb in $b at $subnet.2) shaped
# with tc: netem's $rate and $delay each way, or where this kernel has no netem, tbf's rate
# alone ($shaped says which). Removed on exit. Needs root; reads $rate, $delay and $prefix
# (a few letters naming the caller's namespaces and links).
id=$$
a=${prefix}_a_$id b=${prefix}_b_$id va=${prefix}a$((id % 100000)) vb=${prefix}b$((id % 100000))
subnet=10.232.$((id % 250))
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

