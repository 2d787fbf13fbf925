#!/usr/bin/env bash
# `make test`: the legs of the test suite one after another, each built (make build-LEG), then
# run (make test-LEG); stops at the first leg that fails, and ends with a summary: each leg's
# build and test minutes, ccache's hits for its build, and its tests passed, failed and skipped.
#
#   scripts/test_legs.sh LEG...       e.g. tsan asan torch2 bundle (the Makefile's LEGS)
#
# Each leg's whole output goes to the terminal and to build/legs/LEG.log.
set -uo pipefail
cd "$(dirname "$0")/.."
[[ $# -gt 0 ]] || { echo "usage: $0 LEG..." >&2; exit 2; }
mkdir -p build/legs
make=(make --no-print-directory)
have_ccache=0
command -v ccache >/dev/null && have_ccache=1
summary=()
total_passed=0 total_failed=0 total_skipped=0
status=0
started=$(date +%s)

minutes() { awk -v s="$1" 'BEGIN { printf "%.1f", s / 60 }'; }

# ccache's hits and misses since the last zeroing, as "H/N hits" (or "-").
ccache_hits() {
  ((have_ccache)) || { echo "-"; return; }
  ccache --print-stats 2>/dev/null | awk '
    $1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { hits += $2 }
    $1 == "cache_miss" { misses += $2 }
    END { n = hits + misses; if (n == 0) print "nothing compiled"; else printf "%d/%d hits (%.0f%%)\n", hits, n, 100 * hits / n }'
}

# Where each leg's GoogleTest suites write their JSON reports (tests/suites.cmake).
results_dir() {
  case $1 in
    asan) echo build-asan/gtest-results ;;
    torch2) echo build-torch2/gtest-results ;;
    debian) echo build/gtest-results ;;
  esac
}

for leg in "$@"; do
  log=build/legs/$leg.log
  : >"$log"
  echo "=== leg $leg: build (log: $log)"
  ((have_ccache)) && ccache -z >/dev/null
  t0=$(date +%s)
  "${make[@]}" "build-$leg" 2>&1 | tee -a "$log"
  build_rc=${PIPESTATUS[0]}
  t1=$(date +%s)
  hits=$(ccache_hits)
  test_rc=0
  if ((build_rc == 0)); then
    echo "=== leg $leg: test"
    "${make[@]}" "test-$leg" 2>&1 | tee -a "$log"
    test_rc=${PIPESTATUS[0]}
  fi
  t2=$(date +%s)
  read -r passed failed skipped < <(python3 scripts/test_counts.py "$log" "$(results_dir "$leg")")
  total_passed=$((total_passed + passed)) total_failed=$((total_failed + failed)) total_skipped=$((total_skipped + skipped))
  result=passed
  ((build_rc == 0)) || result="BUILD FAILED"
  ((build_rc == 0 && test_rc != 0)) && result=FAILED
  summary+=("$(printf '| %-6s | %5s | %5s | %-22s | %5d | %4d | %4d | %s |' "$leg" "$(minutes $((t1 - t0)))" \
    "$(minutes $((t2 - t1)))" "$hits" "$passed" "$failed" "$skipped" "$result")")
  if ((build_rc != 0 || test_rc != 0)); then
    status=1
    echo "=== leg $leg failed: the legs after it are not run"
    break
  fi
done

echo
echo "## make test: $(minutes $(($(date +%s) - started))) min"
echo
echo "| leg    | build min | test min | ccache (build) | passed | failed | skipped | result |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${summary[@]}"
echo
echo "legs: $total_passed passed, $total_failed failed, $total_skipped skipped"
exit $status
