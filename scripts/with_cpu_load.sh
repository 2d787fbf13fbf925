#!/usr/bin/env bash
# Runs COMMAND beside a CPU-bound process and returns COMMAND's status: the suite must not
# depend on a quiet machine (issue 13: one full run once failed while another job ran beside
# it). make test runs the pip-torch leg's ctest -j 3 this way: three suites, most of them
# several processes, on two cores already load the machine as a job beside would; the busy
# loop, at the lowest priority (SCHED_IDLE: below even the next leg's build, which make test
# runs beside at nice 19), takes whatever a waiting suite leaves idle, so no core is ever
# quiet, and takes almost nothing from the tests. (At their priority, beside ctest -j 2, it
# took a third of the machine from a leg that is CPU-bound.)
#   with_cpu_load.sh COMMAND [ARGS...]
set -uo pipefail
# A busy loop in its own process (bash arithmetic, no I/O): one core's worth of load.
chrt --idle 0 bash -c 'while :; do :; done' 2>/dev/null &
load=$!
trap 'kill "$load" 2>/dev/null' EXIT
echo "with_cpu_load.sh: a CPU-bound process (pid $load) runs beside: $*"
"$@"
