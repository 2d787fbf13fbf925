#!/usr/bin/env bash
# First light on a GPU node (issue 25): build datapar against the torch of the `python3` on
# PATH, run the tests labelled `gpu` and the GPU figures, and write OUTDIR/gpu_report.md and
# OUTDIR/gpu_report.json. Made for the offline bundle (`make bundle`), on a node with no network:
#
#   tar xzf datapar-bundle.tar.gz && datapar/scripts/gpu_check.sh OUTDIR
#
# Needs a C++ compiler, CMake (3.21+ for CTest's JUnit output), the CUDA toolkit (nvcc on PATH,
# or in $CUDA_HOME or /usr/local/cuda) and python3 with pip's CUDA torch first on PATH. Fetches
# nothing: the other dependencies are in third_party/prefix (a git checkout uses Debian's).
# Builds with all cores (nproc) only what the gpu tests and figures run, into
# $GPU_CHECK_BUILD_DIR (default: build-gpu beside this script's folder; a second run reuses it).
# FIGURE_EPOCHS (default 5; the first, warm-up, is not timed) and FIGURE_ROUNDS (default 3, the
# sides alternating; medians) size the training figures; GPU_CHECK_FIGURES, a regular
# expression, runs only the figures whose function it names (scripts/gpu_report.py, FIGURES);
# GPU_CHECK_DEADLINE (epoch seconds, e.g. a lease's end) stops starting figure commands that
# could not end before it (the report is written after each figure); GPU_CHECK_SKIP_TESTS=1
# runs the figures only (a second call on a machine that already ran the tests);
# GPU_CHECK_CMAKE_ARGS adds CMake arguments (e.g. -DCMAKE_CXX_FLAGS=-g1 for line numbers).
# GPU_CHECK_TESTS, a CTest regular expression, reruns just those gpu tests (GPU_CHECK_REPEAT
# times each, stopping at a failure; default 1) and no figure: for a short second look.
#
# Exit status: 0 when no gpu test failed (tests skipped for want of GPUs are fine), 1 when one
# failed or the build did; a figure that fails is reported as failed and does not count.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
[[ $# -eq 1 ]] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
mkdir -p "$1"
out=$(cd "$1" && pwd)
build=${GPU_CHECK_BUILD_DIR:-$src/build-gpu}
started=$(date +%s)

die() { echo "gpu_check: $*" >&2; exit 1; }
log() { echo "gpu_check: $*"; }

# 1. The Python, and its torch (the build's libtorch and the peer of every figure).
python=$(command -v python3) ||
  die "no python3 on PATH: activate the Python environment with pip's CUDA torch (source VENV/bin/activate, or module load ...) and run again"
"$python" -c 'import torch' 2>"$out/torch_import.log" ||
  die "$python cannot import torch ($(tail -1 "$out/torch_import.log")): put a python3 with pip's CUDA torch first on PATH (this script installs nothing; e.g. copy a venv with torch to the node and source its bin/activate)"
torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
log "python $python, torch $("$python" -c 'import torch; print(torch.__version__)'), CMake prefix $torch_prefix"

# 2. Configure. The bundle's prefix is added by CMakeLists.txt itself when it is there.
generator=("Unix Makefiles")
command -v ninja >/dev/null && generator=(Ninja)
cmake_args=(-DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$torch_prefix" -DDATAPAR_TEST_PYTHON="$python"
  -DDATAPAR_WITH_MPI=OFF)  # MPI: not used by the gpu tests, and a node's MPI module may not match
read -r -a extra <<<"${GPU_CHECK_CMAKE_ARGS:-}"
cmake_args+=("${extra[@]}")
if ! command -v nvcc >/dev/null; then  # a CUDA torch needs the toolkit; nodes often have it off PATH
  for cuda in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda; do
    [[ -n $cuda && -x $cuda/bin/nvcc ]] && { cmake_args+=(-DCUDAToolkit_ROOT="$cuda"); break; }
  done
fi
jobs=$(nproc)
report() {  # report [ARGS]: the report from whatever has run; its exit status is this script's
  "$python" "$src/scripts/gpu_report.py" --source "$src" --build "$build" --out "$out" --python "$python" \
    --started "$started" "$@"
}
log "configure: cmake -S $src -B $build -G ${generator[*]} ${cmake_args[*]}"
if ! cmake -S "$src" -B "$build" -G "${generator[@]}" "${cmake_args[@]}" >"$out/configure.log" 2>&1; then
  tail -30 "$out/configure.log" >&2
  report --failed-step configure --failed-log "$out/configure.log"
  exit 1
fi

# 3. Build what the gpu tests and the figures run (target datapar_gpu_check, tests/CMakeLists.txt).
targets=(datapar_gpu_check)
log "build with $jobs jobs: ${targets[*]} (log: $out/build.log)"
if ! cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$out/build.log" 2>&1; then
  tail -30 "$out/build.log" >&2
  report --failed-step build --failed-log "$out/build.log"
  exit 1
fi
built=$(($(date +%s) - started))
log "configured and built in $built s"

# 4. The gpu tests, one at a time (they share the GPUs). A failing test does not stop the report.
log "ctest -L gpu ${GPU_CHECK_TESTS:+-R $GPU_CHECK_TESTS }(log: $out/ctest.log)"
ctest_rc=0
ctest_args=(-L gpu -j 1 --output-on-failure --output-junit "$out/ctest-gpu.xml")
figures=all
if [[ -n ${GPU_CHECK_TESTS:-} ]]; then
  ctest_args+=(-R "$GPU_CHECK_TESTS" --repeat "until-fail:${GPU_CHECK_REPEAT:-1}")
  figures=none
fi
test_args=()
if [[ -n ${GPU_CHECK_SKIP_TESTS:-} ]]; then
  log "tests not asked for (GPU_CHECK_SKIP_TESTS)"
  test_args=(--no-tests)
else
  (cd "$build" && ctest "${ctest_args[@]}") >"$out/ctest.log" 2>&1 || ctest_rc=$?
  tail -5 "$out/ctest.log"
  test_args=(--ctest-junit "$out/ctest-gpu.xml" --ctest-log "$out/ctest.log" --ctest-rc "$ctest_rc")
fi

# 5. The figures, where there are GPUs, and the report (gpu_report.py runs them).
report --build-seconds "$built" "${test_args[@]}" --figure-epochs "${FIGURE_EPOCHS:-5}" \
  --figure-rounds "${FIGURE_ROUNDS:-3}" --figures "$figures" --figure-only "${GPU_CHECK_FIGURES:-}" \
  --deadline "${GPU_CHECK_DEADLINE:-0}"
