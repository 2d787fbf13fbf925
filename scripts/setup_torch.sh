#!/usr/bin/env bash
# Installs pip's torch (the libtorch most C++ users have, with CUDA) into a virtual environment
# under the user's cache directory, never in the repository, and prints the CMake prefix path
# of its libtorch (torch.utils.cmake_prefix_path) on the last line.
#
#   scripts/setup_torch.sh [VERSION]       default: DATAPAR_TORCH_VERSION, else 2.15.0
#
# Idempotent: an environment that already has that torch is left alone. Needs python3 with
# venv (Debian: python3-venv, which scripts/setup.sh installs) and Python's package index.
set -euo pipefail

version=${1:-${DATAPAR_TORCH_VERSION:-2.15.0}}
cache=${DATAPAR_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/datapar}
env_dir=$cache/torch-$version
python=$env_dir/bin/python

# Debian's interpreter when there is one (python3-venv is a Debian package); else PATH's.
base_python=/usr/bin/python3
[[ -x $base_python ]] || base_python=$(command -v python3)

has_torch() {
  [[ -x $python ]] && "$python" - "$version" <<'PY' 2>/dev/null
import sys, torch
sys.exit(0 if torch.__version__.split("+")[0] == sys.argv[1] else 1)
PY
}

if has_torch; then
  echo "setup_torch: torch $version present in $env_dir" >&2
else
  echo "setup_torch: installing torch $version into $env_dir (about 3 GB with its CUDA libraries)" >&2
  rm -rf "$env_dir"
  mkdir -p "$cache"
  "$base_python" -m venv "$env_dir"
  "$python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
  # numpy: torch warns on import without it.
  "$python" -m pip install --quiet --disable-pip-version-check "torch==$version" numpy >&2
  has_torch || { echo "setup_torch: torch $version did not install into $env_dir" >&2; exit 1; }
fi
"$python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null
