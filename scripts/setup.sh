#!/usr/bin/env bash
# Installs what datapar needs from Debian's archive (the 1.13 line, and the tools of both).
# scripts/setup_torch.sh adds pip's torch for the 2.x line.
# Idempotent and non-interactive: packages already present are left alone.
#
#   scripts/setup.sh          everything: both lines' builds, every leg of `make test`
#   scripts/setup.sh --demo   only what `make demo` builds and runs (a newcomer's first minutes:
#                             no sanitizers, MPI, Slurm or Python torch to download)
set -euo pipefail

demo_packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libopenblas0-openmp libgloo-dev libgtest-dev
  libcli11-dev nlohmann-json3-dev zlib1g-dev libssl-dev
  gnuplot-nox
)
packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev libopenblas0-openmp libgloo-dev
  libgtest-dev patchelf debootstrap
  libcli11-dev nlohmann-json3-dev zlib1g-dev libssl-dev
  python3-torch python3-venv
  libopenmpi-dev openmpi-bin
  iproute2
  slurm-wlm munge
  gnuplot-nox
  clang libclang-rt-14-dev llvm-14
)

[[ ${1:-} == --demo ]] && packages=("${demo_packages[@]}")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  started=$SECONDS
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: installed in $((SECONDS - started)) s"
else
  echo "setup: all packages present"
fi
