#!/usr/bin/env bash
# CTest cuda_one_runtime (CUDA builds): every binary of datapar and libtorch_cuda.so itself
# load one and the same libcudart and libnccl: the same major in every DT_NEEDED
# (readelf -d) and the same file once resolved (ldd). A mix of the CUDA toolkit's and torch's
# wheels' libraries would load two runtimes into one process, or one too old for torch.
#   one_cuda_runtime.sh LIBTORCH_CUDA BINARY...
set -euo pipefail
torch_cuda=$1
shift
status=0
for lib in libcudart libnccl; do
  needed=$(for f in "$torch_cuda" "$@"; do readelf -d "$f" | sed -n "s/.*Shared library: \[\($lib\.so\.[0-9]*\)\].*/\1/p"; done | sort -u)
  resolved=$(for f in "$torch_cuda" "$@"; do ldd "$f" | awk -v l="$lib.so" 'index($1, l) == 1 {print $1, $3}'; done |
             while read -r name path; do echo "$name => $(realpath -e "$path" 2>/dev/null || echo "$path (not found)")"; done |
             sort -u)
  echo "$lib needed: ${needed:-none}"
  echo "$lib resolved: ${resolved:-none}"
  if [[ $(wc -l <<<"$needed") -ne 1 || -z $needed ]]; then
    echo "FAIL: $lib: expected exactly one major across the binaries"; status=1
  fi
  if [[ $(wc -l <<<"$resolved") -ne 1 || -z $resolved || $resolved == *"not found"* ]]; then
    echo "FAIL: $lib: the binaries resolve it to different files (or none)"; status=1
  fi
done
exit $status
