#!/usr/bin/env bash
# Issue 44's "on a new machine, apt included": `make demo` timed in a fresh Debian 12 chroot
# that has only what a new machine has before its user's first command (debootstrap's
# minbase, with make, git and ca-certificates to clone), so the time includes
# `scripts/setup.sh --demo` downloading and installing the Debian packages, the whole
# build with an empty ccache, the tutorial and the demo's training.
#
#   scripts/fresh_machine_demo.sh    (root; network to Debian's archive; a few minutes)
#
# Prints the seconds from `make demo` to its last epoch line, and its apt part alone; the
# demo's output is left in $LOG (default /tmp/fresh_machine_demo.log).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mirror=${MIRROR:-http://deb.debian.org/debian}
die() { echo "fresh_machine_demo: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, mount, chroot)"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap"

dir=$(mktemp -d /tmp/datapar-fresh.XXXXXX)
cleanup() {
  for m in dev/shm dev/pts dev proc; do umountpoint=$dir/$m; mountpoint -q "$umountpoint" && umount -l "$umountpoint"; done
  rm -rf "$dir"
}
trap cleanup EXIT
echo "fresh_machine_demo: debootstrap --variant=minbase bookworm into $dir (not timed)"
debootstrap --variant=minbase --include=make,git,ca-certificates bookworm "$dir" "$mirror" >"$dir.log" 2>&1 ||
  { tail -20 "$dir.log" >&2; die "debootstrap failed"; }
rm -f "$dir.log"
cp /etc/resolv.conf "$dir/etc/resolv.conf"
mount -t proc proc "$dir/proc"
mount --rbind /dev "$dir/dev"
git clone -q "$root" "$dir/root/datapar"
# The shipped data is in the repository; ../shared (the full Fashion-MNIST) is not needed.
start=$(date +%s.%N)
chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb \
  sh -c 'cd /root/datapar && make demo' >"$dir/demo.log" 2>&1 ||
  { cp "$dir/demo.log" "${LOG:-/tmp/fresh_machine_demo.log}"; tail -30 "$dir/demo.log" >&2; die "make demo failed"; }
end=$(date +%s.%N)
grep -E "epoch 10/10" "$dir/demo.log" | tail -1
apt_seconds=$(grep -o "setup: installed in [0-9.]* s" "$dir/demo.log" | grep -o "[0-9.]*" || echo "?")
cp "$dir/demo.log" "${LOG:-/tmp/fresh_machine_demo.log}"
awk -v s="$start" -v e="$end" -v a="$apt_seconds" 'BEGIN { printf "fresh_machine_demo: make demo to its last epoch in %.1f s (%s s of it setup.sh --demo: apt-get update and install)\n", e - s, a }'
