#!/usr/bin/env bash
# CTest no_std_filesystem_imports: no datapar program or library calls std::filesystem.
# pip's torch wheels (2.5 to at least 2.11) export a static copy of it from libtorch
# (PyTorch issue 133437); a call binds to that copy before libstdc++'s, and its remove_all
# jumped to address 0 on a GPU node (torch 2.11+cu130). src/file_system.h has what to use.
#   no_std_filesystem_imports.sh DIR...   (every ELF file under the build's bin/ and lib/)
set -euo pipefail
found=0 checked=0
while IFS= read -r -d '' f; do
  [[ $(head -c 4 "$f" | od -An -c | tr -d ' ') == 177ELF ]] || continue
  checked=$((checked + 1))
  if imports=$(nm -D --undefined-only "$f" 2>/dev/null | grep 'St10filesystem'); then
    echo "FAILED: $f imports std::filesystem:"
    echo "$imports" | c++filt | sed 's/^/  /'
    found=1
  fi
done < <(find "$@" -type f \( -perm -u+x -o -name '*.so*' \) -print0)
(( checked > 0 )) || { echo "FAILED: no ELF file found under $*"; exit 1; }
(( found )) || echo "ok: none of $checked programs and libraries imports std::filesystem"
exit $found
