"""All-reduce across two "hosts" with 2 processes each: datapar's default (two levels: shared
memory within each host, Gloo between one leader per host) against a flat Gloo ring over all
four processes ($DATAPAR_SHM=0), in one run, round after round. The hosts are two network
namespaces joined by a veth pair, as in the two-host tests (needs root and iproute2).

    python3 bench/two_hosts_all_reduce.py --rounds 5

Prints the median over rounds of rank 0's median time per size, and the ratio.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATAPAR = os.path.join(ROOT, "build", "bin", "datapar")
ROW = re.compile(r"^\[rank 0\] \| ([0-9.]+ [KMG]?i?B) \| ([0-9.]+) \|")


def sh(command):
    subprocess.run(["sh", "-c", command], check=True)


def run(variant_env, args, hosts):
    (a, address_a), (b, address_b) = hosts
    def node(ns, address, node_rank):
        env = " ".join(f"{k}={v}" for k, v in variant_env.items())
        return (f"ip netns exec {ns} env DATAPAR_GLOO_HOSTNAME={address} {env} timeout 300 {DATAPAR} launch "
                f"--nproc-per-node 2 --nnodes 2 --node-rank {node_rank} --master-addr {address_a} "
                f"--master-port 29517 --token bench --cpu-bind {args.cpu_bind} -- {DATAPAR} bench collectives --sizes {args.sizes} "
                f"--iters {args.iters} --warmup {args.warmup}")
    other = subprocess.Popen(["sh", "-c", node(b, address_b, 1)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    done = subprocess.run(["sh", "-c", node(a, address_a, 0)], capture_output=True, text=True)
    other.wait()
    if done.returncode != 0 or other.returncode != 0:
        sys.exit(f"failed ({done.returncode}, {other.returncode}):\n{done.stdout}\n{done.stderr}")
    return {m.group(1): float(m.group(2)) for m in map(ROW.match, done.stdout.splitlines()) if m}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", default="1MiB,4MiB,16MiB")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    # Both launchers see the same 2 cores: with "cores" each binds its local rank r to core
    # r, so the two processes of every column group (local rank r on both hosts) share one
    # core, while every neighbour pair of the flat ring spans two; "none" lets the kernel
    # place them.
    parser.add_argument("--cpu-bind", default="cores", choices=["cores", "none"])
    args = parser.parse_args()
    pid = os.getpid()
    a, b = f"dpb_a_{pid}", f"dpb_b_{pid}"
    subnet = f"10.232.{pid % 250}."
    hosts = ((a, subnet + "1"), (b, subnet + "2"))
    va, vb = f"dpba{pid % 100000}", f"dpbb{pid % 100000}"
    sh(f"ip netns add {a}; ip netns add {b}; ip link add {va} type veth peer name {vb}; "
       f"ip link set {va} netns {a}; ip link set {vb} netns {b}; "
       f"ip -n {a} addr add {subnet}1/24 dev {va}; ip -n {b} addr add {subnet}2/24 dev {vb}; "
       f"ip -n {a} link set {va} up; ip -n {b} link set {vb} up; ip -n {a} link set lo up; ip -n {b} link set lo up")
    variants = [("two levels (default)", {}), ("flat Gloo ring", {"DATAPAR_SHM": "0"})]
    times = {name: {} for name, _ in variants}
    try:
        for r in range(args.rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            for name, env in order:
                for size, us in run(env, args, hosts).items():
                    times[name].setdefault(size, []).append(us)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        subprocess.run(["sh", "-c", f"ip netns del {a}; ip netns del {b}"])
    print(f"all_reduce of float32, 2 hosts x 2 processes (network namespaces, veth), --cpu-bind {args.cpu_bind}, "
          f"{args.rounds} rounds x {args.iters} iterations: median over rounds of rank 0's median (us)\n")
    print("| size | two levels (default) | flat Gloo ring | flat / two levels |")
    print("|---|---|---|---|")
    for size in times["flat Gloo ring"]:
        two = statistics.median(times["two levels (default)"][size])
        flat = statistics.median(times["flat Gloo ring"][size])
        print(f"| {size} | {two:.0f} | {flat:.0f} | {flat / two:.2f}x |")
    print("\nper round (us):")
    for name in times:
        print(f"  {name}: " + "; ".join(f"{s} " + " ".join(f"{v:.0f}" for v in vs) for s, vs in times[name].items()))


if __name__ == "__main__":
    main()
