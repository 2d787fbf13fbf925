#!/usr/bin/env bash
# Writes the offline bundle for GPU nodes without network (issue 25, `make bundle`):
#
#   scripts/make_bundle.sh [OUT]     default: build/datapar-bundle.tar.gz
#
# One top folder, datapar/: the source tree (the working tree's git-tracked files) and, in
# datapar/third_party/prefix, every dependency that is neither libtorch nor CUDA, copied from
# the Debian packages installed here (scripts/setup.sh): Gloo (headers, libgloo.so.0 and the
# libraries it needs that a plain node lacks), CLI11, nlohmann-json, GoogleTest (headers,
# static libraries), zlib and OpenSSL's libcrypto (headers, library). `find_package` finds
# each from wherever the bundle is unpacked (relocatable CMake configs; CMake's own FindZLIB
# and FindOpenSSL search the prefix): the top CMakeLists.txt adds the prefix to
# CMAKE_PREFIX_PATH when it exists. third_party/MANIFEST names each package and
# version; their copyright files are in third_party/prefix/share/licenses/.
# Open MPI is left out: optional for datapar, and not needed by the gpu tests.
#
# On the node: tar xzf datapar-bundle.tar.gz && datapar/scripts/gpu_check.sh OUTDIR
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:-build/datapar-bundle.tar.gz}
max_mib=60
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -dumpmachine)

die() { echo "make_bundle: $*" >&2; exit 1; }

# What must be installed here; scripts/setup.sh installs all of them.
for p in libgloo-dev libgloo0 libcli11-dev nlohmann-json3-dev libgtest-dev zlib1g-dev libssl-dev patchelf; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
    die "Debian package $p is missing: run scripts/setup.sh (or apt-get install $p)"
done
git rev-parse --git-dir >/dev/null 2>&1 || die "not a git checkout: the source list comes from git ls-files"

stage=$(mktemp -d "${TMPDIR:-/tmp}/datapar-bundle.XXXXXX")
trap '[[ -n ${KEEP_STAGE:-} ]] || rm -rf "$stage"' EXIT
top=$stage/datapar
prefix=$top/third_party/prefix
mkdir -p "$top" "$prefix"/{include,lib/cmake,share/cmake,share/licenses}

# The source: tracked files as they are in the working tree (uncommitted edits included,
# which MANIFEST's "dirty" says), so that what is bundled is what was just built and tested.
git ls-files -z | while IFS= read -r -d '' f; do [[ -e $f || -L $f ]] && printf '%s\0' "$f"; done |
  tar --null -T - -cf - | tar -C "$top" -xf -

manifest=$top/third_party/MANIFEST
{
  echo "# datapar offline bundle: third-party dependencies (scripts/make_bundle.sh)"
  echo "# source: $(git describe --always --dirty --abbrev=12), made $(date -u +%Y-%m-%dT%H:%M:%SZ) on Debian $(cat /etc/debian_version) ($arch)"
  echo "# component | Debian package (version) | files under third_party/prefix | license"
} >"$manifest"

# Copies a package's copyright file into share/licenses/<package>/ and writes its MANIFEST line.
record() {  # record COMPONENT PACKAGE FILES...
  local component=$1 package=$2; shift 2
  local version
  version=$(dpkg-query -W -f='${Version}' "$package")
  mkdir -p "$prefix/share/licenses/$package"
  cp "/usr/share/doc/$package/copyright" "$prefix/share/licenses/$package/copyright"
  echo "$component | $package ($version) | $* | share/licenses/$package/copyright" >>"$manifest"
}

# The Debian package that holds a file; dpkg knows merged-/usr files under /lib or /usr/lib.
owner() {
  local real
  real=$(readlink -f "$1")
  { dpkg -S "$real" 2>/dev/null || dpkg -S "${real#/usr}" 2>/dev/null; } | head -1 | cut -d: -f1 | grep .
}

# A shared library and its soname link, the file itself dereferenced.
copy_shared() {  # copy_shared PATH_OF_SONAME_LINK
  local link=$1 real
  real=$(readlink -f "$link")
  cp "$real" "$prefix/lib/"
  [[ $(basename "$link") == $(basename "$real") ]] || ln -sf "$(basename "$real")" "$prefix/lib/$(basename "$link")"
}

# --- Gloo: headers, libgloo.so.0 and the libraries it loads that are not part of every system.
cp -r /usr/include/gloo "$prefix/include/"
copy_shared /usr/lib/libgloo.so.0
ln -sf libgloo.so.0 "$prefix/lib/libgloo.so"
record Gloo libgloo-dev include/gloo share/cmake/Gloo
record Gloo libgloo0 lib/libgloo.so.0
mkdir -p "$prefix/share/cmake/Gloo"
cp /usr/share/cmake/Gloo/Gloo{Config,ConfigVersion,Targets}.cmake "$prefix/share/cmake/Gloo/"
# Debian's per-configuration file names /usr/lib/libgloo.so.0.5.0; make it relative to the
# prefix that GlooTargets.cmake computes from its own location (share/cmake/Gloo/../../..).
sed 's|"/usr/lib/|"${_IMPORT_PREFIX}/lib/|g' /usr/share/cmake/Gloo/GlooTargets-relwithdebinfo.cmake \
  >"$prefix/share/cmake/Gloo/GlooTargets-relwithdebinfo.cmake"
! grep -rq '"/usr' "$prefix/share/cmake/Gloo" || die "a /usr path is left in the Gloo config"
# libgloo's own dependencies (hiredis, ibverbs, libnl), except the C/C++ runtime every node has.
# libgloo.so.0 has no RUNPATH; given $ORIGIN it finds them beside itself, so the programs need
# no LD_LIBRARY_PATH. libibverbs finds libnl the same way.
system_libs='^(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux-x86-64|linux-vdso)\.so'
while read -r name path; do
  [[ $name =~ $system_libs ]] && continue
  [[ -f $path ]] || die "ldd libgloo.so.0: $name not found here"
  copy_shared "$path"
  package=$(owner "$path") || die "no Debian package owns $path"
  record "Gloo's dependency $name" "$package" "lib/$name"
done < <(ldd /usr/lib/libgloo.so.0 | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
for lib in "$prefix"/lib/*.so.*; do
  [[ -L $lib ]] || patchelf --set-rpath '$ORIGIN' "$lib"
done

# --- CLI11 and nlohmann-json: header-only; Debian's configs are relocatable already
# (share/cmake/<name>/../../.. is the prefix).
cp -r /usr/include/CLI "$prefix/include/"
cp -r /usr/share/cmake/CLI11 "$prefix/share/cmake/"
record CLI11 libcli11-dev include/CLI share/cmake/CLI11
cp -r /usr/include/nlohmann "$prefix/include/"
cp -r /usr/share/cmake/nlohmann_json "$prefix/share/cmake/"
record nlohmann-json nlohmann-json3-dev include/nlohmann share/cmake/nlohmann_json

# --- GoogleTest: headers, the static libraries and the config, moved from Debian's multiarch
# lib/<arch>/ to lib/ (found there by any CMake, not only those that know the multiarch
# name): one directory level fewer between the config and the prefix.
cp -r /usr/include/gtest "$prefix/include/"
cp "/usr/lib/$arch/libgtest.a" "/usr/lib/$arch/libgtest_main.a" "$prefix/lib/"
gtest_cmake=/usr/lib/$arch/cmake/GTest
mkdir -p "$prefix/lib/cmake/GTest"
cp "$gtest_cmake/GTestConfigVersion.cmake" "$prefix/lib/cmake/GTest/"
sed -e 's|/../../../../"|/../../../"|' -e "s|\"$gtest_cmake\"|\"/nonexistent\"|" \
  "$gtest_cmake/GTestConfig.cmake" >"$prefix/lib/cmake/GTest/GTestConfig.cmake"
# Drop the first of the four "one level up" steps; forget Debian's own location.
awk '/^get_filename_component\(_IMPORT_PREFIX "\$\{_IMPORT_PREFIX\}" PATH\)$/ && !dropped {dropped = 1; next} {print}' \
  "$gtest_cmake/GTestTargets.cmake" | sed "s|\"$gtest_cmake\"|\"/nonexistent\"|" \
  >"$prefix/lib/cmake/GTest/GTestTargets.cmake"
sed "s|/lib/$arch/|/lib/|g" "$gtest_cmake/GTestTargets-none.cmake" >"$prefix/lib/cmake/GTest/GTestTargets-none.cmake"
# (Debian's own location is replaced by /nonexistent above: its "/usr" branch never runs.)
! grep -rh -v '^ *#' "$prefix/lib/cmake/GTest" | grep -q "$arch" || die "a multiarch path is left in the GTest config"
record GoogleTest libgtest-dev "include/gtest lib/libgtest.a lib/libgtest_main.a lib/cmake/GTest"

# --- zlib: zlib1g-dev (headers, the libz.so link) is a -dev package a plain node may lack;
# the library itself (zlib1g) every Debian-like system has, but one copy here costs 120 KiB.
cp /usr/include/zlib.h /usr/include/zconf.h "$prefix/include/"
copy_shared "$(readlink -f "/usr/lib/$arch/libz.so")"
ln -sf "$(basename "$(readlink -f "/usr/lib/$arch/libz.so")")" "$prefix/lib/libz.so.1"
ln -sf libz.so.1 "$prefix/lib/libz.so"
record zlib zlib1g-dev "include/zlib.h include/zconf.h"
record zlib zlib1g "lib/libz.so.1"

# --- OpenSSL's libcrypto (SHA-256 and HMAC for the store's handshake): libssl-dev's headers,
# the generic ones and the two of this architecture (configuration.h, opensslconf.h) in one
# include/openssl; libcrypto.so.3 (libssl3's; it needs only libc) and the libcrypto.so link.
cp -r /usr/include/openssl "$prefix/include/"
cp "/usr/include/$arch/openssl/"*.h "$prefix/include/openssl/"
crypto=$(readlink -f "/usr/lib/$arch/libcrypto.so")
copy_shared "$crypto"
[[ $(basename "$crypto") == libcrypto.so.3 ]] || ln -sf "$(basename "$crypto")" "$prefix/lib/libcrypto.so.3"
ln -sf libcrypto.so.3 "$prefix/lib/libcrypto.so"
record OpenSSL libssl-dev "include/openssl"
record OpenSSL "$(owner "$crypto")" "lib/libcrypto.so.3"

# Every config must resolve inside the prefix alone (system paths off), wherever it lies.
check=$stage/find-check
mkdir -p "$check"
cat >"$check/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.18)
project(bundle_check LANGUAGES CXX)
# The compiler is found; from here on only CMAKE_PREFIX_PATH is searched.
set(CMAKE_FIND_USE_CMAKE_SYSTEM_PATH OFF)
set(CMAKE_FIND_USE_SYSTEM_ENVIRONMENT_PATH OFF)
find_package(Threads REQUIRED)
find_package(Gloo CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(nlohmann_json 3 CONFIG REQUIRED)
find_package(GTest REQUIRED)
find_package(ZLIB REQUIRED)
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
foreach(t gloo GTest::gtest GTest::gtest_main)
  get_target_property(loc ${t} LOCATION)
  list(APPEND found "${loc}")
endforeach()
get_target_property(inc CLI11::CLI11 INTERFACE_INCLUDE_DIRECTORIES)
list(APPEND found "${inc}" "${ZLIB_INCLUDE_DIRS}" "${ZLIB_LIBRARIES}" "${nlohmann_json_DIR}" "${OPENSSL_INCLUDE_DIR}"
  "${OPENSSL_CRYPTO_LIBRARY}")
foreach(f IN LISTS found)
  if(NOT f MATCHES "^${BUNDLE_PREFIX}/" OR NOT EXISTS "${f}")
    message(FATAL_ERROR "${f}: not a file of the bundled prefix ${BUNDLE_PREFIX}")
  endif()
endforeach()
CMAKE
cmake -S "$check" -B "$check/build" -DCMAKE_PREFIX_PATH="$prefix" -DBUNDLE_PREFIX="$prefix" >"$stage/find-check.log" 2>&1 || { cat "$stage/find-check.log" >&2; die "the bundled CMake configs do not resolve inside the prefix"; }
rm -rf "$check"

mkdir -p "$(dirname "$out")"
# Reproducible: names sorted, owner root, no user names.
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner -czf "$out.tmp" datapar
mv "$out.tmp" "$out"
size=$(stat -c %s "$out")
((size <= max_mib * 1024 * 1024)) || die "$out is $((size / 1024 / 1024)) MiB, over the $max_mib MiB limit"
echo "make_bundle: wrote $out ($((size / 1024)) KiB): the source and $(grep -vc '^#' "$manifest") third-party entries (third_party/MANIFEST)"
