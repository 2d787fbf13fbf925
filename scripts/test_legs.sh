#!/usr/bin/env bash
# `make test`: the legs of the test suite one after another, each built (make build-LEG), then
# run (make test-LEG); stops at the first leg that fails, and ends with a summary: each leg's
# build and test minutes, ccache's hits for its build, and its tests passed, failed and skipped.
#
#   scripts/test_legs.sh LEG...       e.g. tsan asan torch2 bundle (the Makefile's LEGS)
#
# While a leg's tests run, the next leg is built beside them at nice 19 (the bundle leg, a
# build in a chroot whose gpu tests all skip, is also checked there): the tests keep the
# cores, the build takes what they leave idle (a suite waiting on a timeout, a single-process
# suite on two cores; about a tenth of the machine under the ASan leg). Its output goes to its
# log and is shown when the leg's turn comes. DATAPAR_LEGS_AHEAD=0 builds each leg only when
# its turn comes.
#
# Each leg's whole output goes to the terminal and to build/legs/LEG.log.
set -uo pipefail
cd "$(dirname "$0")/.."
[[ $# -gt 0 ]] || { echo "usage: $0 LEG..." >&2; exit 2; }
mkdir -p build/legs
make=(make --no-print-directory)
ahead_allowed=${DATAPAR_LEGS_AHEAD:-1}
summary=()
total_passed=0 total_failed=0 total_skipped=0
status=0
started=$(date +%s)

minutes() { awk -v s="$1" 'BEGIN { printf "%.1f", s / 60 }'; }

# ccache's hits and misses in a stats log (CCACHE_STATSLOG of one leg's build), as "H/N hits".
ccache_hits() {
  [[ -s $1 ]] || { echo "nothing compiled"; return; }
  awk '$1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { hits++ } $1 == "cache_miss" { misses++ }
    END { n = hits + misses; if (n == 0) print "nothing compiled"; else printf "%d/%d hits (%.0f%%)\n", hits, n, 100 * hits / n }' "$1"
}

# Where each leg's GoogleTest suites write their JSON reports (tests/suites.cmake).
results_dir() {
  case $1 in
    asan) echo build-asan/gtest-results ;;
    torch2) echo build-torch2/gtest-results ;;
    debian) echo build/gtest-results ;;
  esac
}

# What of a leg may run beside the previous leg's tests: its build; the bundle's check too
# (a build in a chroot; its gpu tests skip, nothing in it is timed).
ahead_steps() {
  case $1 in
    bundle) echo "build test" ;;
    *) echo "build" ;;
  esac
}

# run_step LEG STEP: make STEP-LEG into the leg's log (CCACHE_STATSLOG for a build); its status.
run_step() {
  local leg=$1 step=$2
  if [[ $step == build ]]; then
    CCACHE_STATSLOG=$PWD/build/legs/$leg.ccache-stats "${make[@]}" "build-$leg" >>"build/legs/$leg.log" 2>&1
  else
    "${make[@]}" -o "build-$leg" "$step-$leg" >>"build/legs/$leg.log" 2>&1  # -o: built already
  fi
}

# The leg started ahead: its name, its process group, when it began.
ahead_leg="" ahead_pgid="" ahead_started=0
start_ahead() {
  local leg=$1
  : >"build/legs/$leg.log"
  rm -f "build/legs/$leg.ccache-stats" "build/legs/$leg.ahead"
  ahead_leg=$leg ahead_started=$(date +%s)
  # At the lowest priority but idle's, in a process group of its own (to stop it whole) but in
  # this session: a session of its own (setsid) is an autogroup of its own, and the scheduler
  # shares the CPU fairly between autogroups whatever their tasks' nice (so it took half of the
  # machine from the tests: the pip-torch leg's suite ran 14 min instead of 8).
  set -m
  nice -n 19 bash "$0" --ahead "$leg" </dev/null &
  ahead_pgid=$!
  set +m
}
stop_ahead() {
  [[ -n $ahead_leg ]] || return 0
  kill -TERM -- "-$ahead_pgid" 2>/dev/null
  wait "$ahead_pgid" 2>/dev/null
  ahead_leg=""
}

# scripts/test_legs.sh --ahead LEG (start_ahead): LEG's steps that may run ahead, each one's
# status in build/legs/LEG.ahead.
if [[ $1 == --ahead ]]; then
  for step in $(ahead_steps "$2"); do
    run_step "$2" "$step"
    rc=$?
    echo "$step $rc" >>"build/legs/$2.ahead"
    ((rc == 0)) || break
  done
  exit 0
fi
trap stop_ahead EXIT
trap 'exit 143' TERM INT HUP  # so that the EXIT trap stops the leg begun ahead

legs=("$@")
for ((i = 0; i < ${#legs[@]}; ++i)); do
  leg=${legs[i]}
  next=${legs[i + 1]:-}
  log=build/legs/$leg.log
  t0=$(date +%s)
  build_rc="" test_rc=""
  if [[ $ahead_leg == "$leg" ]]; then
    # Built (and maybe checked) beside the last leg's tests: wait for it, then show its output.
    echo "=== leg $leg: build, begun $(minutes $((t0 - ahead_started))) min ago beside the last leg's tests (log: $log)"
    wait "$ahead_pgid"
    ahead_leg=""
    cat "$log"
    while read -r step rc; do
      [[ $step == build ]] && build_rc=$rc
      [[ $step == test ]] && test_rc=$rc
    done <"build/legs/$leg.ahead"
    build_rc=${build_rc:-1}
  else
    : >"$log"
    rm -f "build/legs/$leg.ccache-stats"
    echo "=== leg $leg: build (log: $log)"
    CCACHE_STATSLOG=$PWD/build/legs/$leg.ccache-stats "${make[@]}" "build-$leg" 2>&1 | tee -a "$log"
    build_rc=${PIPESTATUS[0]}
  fi
  t1=$(date +%s)
  hits=$(ccache_hits "build/legs/$leg.ccache-stats")
  if ((build_rc == 0)) && [[ -z $test_rc ]]; then
    [[ -n $next && $ahead_allowed == 1 ]] && start_ahead "$next"
    echo "=== leg $leg: test"
    # -o: its build is done; make would configure it again (half a minute for pip's torch).
    "${make[@]}" -o "build-$leg" "test-$leg" 2>&1 | tee -a "$log"
    test_rc=${PIPESTATUS[0]}
  elif ((build_rc == 0)); then
    echo "=== leg $leg: checked beside the last leg's tests (above)"
  fi
  test_rc=${test_rc:-0}
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
    stop_ahead
    echo "=== leg $leg failed: the legs after it are not run"
    break
  fi
done

echo
echo "## make test: $(minutes $(($(date +%s) - started))) min"
echo
echo "Build and test minutes are those each leg was waited for; a leg built beside the last"
echo "leg's tests shows only what was left of its build when that leg ended."
echo
echo "| leg    | build min | test min | ccache (build) | passed | failed | skipped | result |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${summary[@]}"
echo
echo "legs: $total_passed passed, $total_failed failed, $total_skipped skipped"
exit $status
