#!/usr/bin/env bash
# Issue 25's "proven here": the offline bundle builds and runs to the end on a machine that
# has a compiler, CMake, ninja, Python with pip's torch and the CUDA toolkit, but none of
# datapar's Debian -dev packages (Gloo, GoogleTest, CLI11, nlohmann-json, zlib, OpenSSL,
# Open MPI).
#
#   tests/bundle/chroot_check.sh [BUNDLE]    default: build/datapar-bundle.tar.gz (make bundle)
#   tests/bundle/chroot_check.sh --prepare   only make the cached chroot
#
# A Debian bookworm chroot (debootstrap --variant=minbase from Debian's archive) with only
# g++, cmake, ninja-build and python3.11, cached as a tar under ~/.cache/datapar so that later
# runs skip debootstrap. pip's torch venv and the CUDA toolkit are bind-mounted read-only at
# the paths they have here. The bundle is unpacked inside and `datapar/scripts/gpu_check.sh`
# runs in a network namespace with only loopback (so it provably fetches nothing); then the
# report must list every gpu test as skipped with a reason, and gpu_check.sh must exit 0.
#
# Environment:
#   TORCH_VENV   pip's torch venv (default: ~/.cache/datapar/torch-$DATAPAR_TORCH_VERSION, 2.15.0;
#                scripts/setup_torch.sh makes it)
#   CUDA_DIR     the CUDA toolkit (default /usr/local/cuda)
#   MIRROR       Debian mirror (default http://deb.debian.org/debian)
#   KEEP=1       keep the run's chroot (its path is printed) instead of deleting it
# Needs root (debootstrap, mount, chroot), debootstrap and unshare (scripts/setup.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${DATAPAR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/datapar}
venv=${TORCH_VENV:-$cache/torch-${DATAPAR_TORCH_VERSION:-2.15.0}}
cuda=${CUDA_DIR:-/usr/local/cuda}
mirror=${MIRROR:-http://deb.debian.org/debian}
suite=bookworm
# What a GPU node is assumed to have besides torch and CUDA. python3: the venv's python3 is a
# link to the host's /usr/bin/python3 (-> python3.11), which bookworm's python3 provides inside.
# ccache: optional for the bundle (used when there); here it shares this machine's cache, so a
# second check of the same sources compiles nothing (the bundle is always at /work/datapar).
chroot_packages=(g++ cmake ninja-build python3 ccache)
# datapar's Debian -dev packages: none of them may be in the chroot.
forbidden=(libgloo-dev libgtest-dev googletest libcli11-dev nlohmann-json3-dev zlib1g-dev libssl-dev libopenmpi-dev)
# The cached chroot's name changes with its package list, so a changed list makes a new one.
tag=$(printf '%s\n' "$suite" "${chroot_packages[@]}" | sha256sum | cut -c1-12)
base_tar=$cache/chroot-$suite-minbase-$tag.tar

die() { echo "chroot_check: $*" >&2; exit 1; }
log() { echo "chroot_check: $*"; }

[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, mount and chroot); run it as root or with sudo"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap (scripts/setup.sh installs it)"
command -v unshare >/dev/null || die "unshare is missing: apt-get install util-linux"

# Makes $base_tar: minbase, then the packages with apt-get inside, caches emptied.
prepare() {
  [[ -f $base_tar ]] && { log "cached chroot $base_tar"; return; }
  local dir
  dir=$(mktemp -d /tmp/datapar-chroot-base.XXXXXX)
  log "debootstrap --variant=minbase $suite into $dir from $mirror (a few minutes, once)"
  debootstrap --variant=minbase "$suite" "$dir" "$mirror" >"$dir.log" 2>&1 ||
    { tail -20 "$dir.log" >&2; die "debootstrap failed (log: $dir.log)"; }
  cp /etc/resolv.conf "$dir/etc/resolv.conf"
  mount -t proc proc "$dir/proc"
  local rc=0
  chroot "$dir" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive \
    sh -c "apt-get update -qq && apt-get install -y -qq --no-install-recommends ${chroot_packages[*]} >/dev/null && apt-get clean" || rc=$?
  umount "$dir/proc"
  ((rc == 0)) || die "apt-get install ${chroot_packages[*]} in the chroot failed"
  rm -rf "$dir"/var/lib/apt/lists/*
  mkdir -p "$cache"
  tar -C "$dir" -cf "$base_tar.tmp" . && mv "$base_tar.tmp" "$base_tar"
  find "$cache" -maxdepth 1 -name "chroot-$suite-minbase-*.tar" ! -path "$base_tar" -delete  # older package lists
  rm -rf "$dir" "$dir.log"
  log "cached chroot $base_tar ($(du -h "$base_tar" | cut -f1))"
}

prepare
[[ ${1:-} == --prepare ]] && exit 0

bundle=${1:-$root/build/datapar-bundle.tar.gz}
[[ -f $bundle ]] || die "no bundle at $bundle: run make bundle first"
[[ -x $venv/bin/python3 ]] || die "no torch venv at $venv: run scripts/setup_torch.sh (or set TORCH_VENV)"
[[ -d $cuda/bin ]] || die "no CUDA toolkit at $cuda (set CUDA_DIR)"
cuda_real=$(readlink -f "$cuda")  # /usr/local/cuda is often a link to /usr/local/cuda-X.Y

dir=$(mktemp -d /tmp/datapar-chroot.XXXXXX)
mounts=()
# Unmounts in reverse order and deletes the chroot, but never while anything is still mounted
# in it: rm -rf would go down into the bind-mounted venv or toolkit.
cleanup() {
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" || true; done
  if grep -q " $dir/" /proc/self/mountinfo; then
    echo "chroot_check: something is still mounted under $dir; not deleting it" >&2
  elif [[ -n ${KEEP:-} ]]; then
    echo "chroot_check: kept the chroot in $dir"
  else
    rm -rf "$dir"
  fi
}
trap cleanup EXIT
trap 'exit 143' TERM INT HUP  # stopped (make test stops a check it began ahead): cleanup still runs
bind() {  # bind SOURCE TARGET_IN_CHROOT [ro]
  mkdir -p "$dir$2"
  mount --bind "$1" "$dir$2"
  mounts+=("$dir$2")
  [[ ${3:-} == ro ]] && mount -o remount,bind,ro "$dir$2"
  return 0
}

start=$(date +%s)
tar -C "$dir" -xf "$base_tar"
# None of datapar's -dev packages may be here, or the proof proves nothing.
for p in "${forbidden[@]}"; do
  if chroot "$dir" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    die "the chroot has $p installed"
  fi
done
mount -t proc proc "$dir/proc"; mounts+=("$dir/proc")
mount -t tmpfs -o size=2g tmpfs "$dir/dev/shm"; mounts+=("$dir/dev/shm")  # the shared-memory collectives
bind "$venv" "$venv" ro
bind "$cuda_real" /usr/local/cuda ro
ccache_dir=$(ccache --get-config cache_dir 2>/dev/null || true)
if [[ -n $ccache_dir ]]; then
  mkdir -p "$ccache_dir"
  bind "$ccache_dir" /root/.cache/ccache
fi
chroot "$dir" "$venv/bin/python3" -c 'import sys; assert sys.version_info[:2] == (3, 11)' ||
  die "the venv's python3 ($(readlink -f "$venv/bin/python3") here) does not run in the chroot"
mkdir -p "$dir/work"
cp "$bundle" "$dir/work/"

log "chroot $dir ready in $(($(date +%s) - start)) s; running gpu_check.sh in it, with no network but loopback"
# A fresh network namespace: only lo, brought up, so that the tests' local TCP works and any
# fetch fails. A clean environment with the venv's python first on PATH, as a user's `activate`.
rc=0
unshare --net -- sh -c 'ip link set lo up && exec "$@"' sh \
  chroot "$dir" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
  PATH="$venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
  nice -n 10 bash -c 'cd /work && tar xzf datapar-bundle.tar.gz && datapar/scripts/gpu_check.sh /work/out' || rc=$?
log "gpu_check.sh exited $rc after $(($(date +%s) - start)) s"
mkdir -p "$root/build/chroot-check"
cp -r "$dir/work/out/." "$root/build/chroot-check/" 2>/dev/null || true
((rc == 0)) || die "gpu_check.sh failed in the chroot (exit $rc); its logs: $root/build/chroot-check/"

# The report: every gpu test skipped with a reason, every figure skipped, nothing failed.
"$venv/bin/python3" - "$root/build/chroot-check/gpu_report.json" <<'PY' || die "the report is not what a machine without GPUs must give (above)"
import json, sys
report = json.load(open(sys.argv[1]))
problems = []
if not report["tests"]:
    problems.append("no gpu test in the report")
for t in report["tests"]:
    if t["status"] != "skipped" or not t["reason"].strip():
        problems.append(f"test {t['name']}: {t['status']}, reason {t['reason']!r}")
    if t["gpus"] is None:
        problems.append(f"test {t['name']}: how many GPUs it needs is unknown")
for f in report["figures"]:
    if f["status"] != "skipped" or not f.get("reason"):
        problems.append(f"figure {f['name']}: {f['status']}")
if not report["figures"]:
    problems.append("no figure in the report")
for p in problems:
    print("chroot_check:", p, file=sys.stderr)
print(f"chroot_check: report: {len(report['tests'])} gpu tests, all skipped with a reason; "
      f"{len(report['figures'])} figures, all skipped; torch {report['machine']['torch'].get('torch')}")
sys.exit(1 if problems else 0)
PY
log "passed in $(($(date +%s) - start)) s (report: $root/build/chroot-check/gpu_report.md)"
