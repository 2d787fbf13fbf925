#!/usr/bin/env bash
# Runs COMMAND beside a CPU-bound process, at the same priority, and returns COMMAND's status:
# the suite must not depend on a quiet machine (issue 13: one full run once failed while
# another job ran beside it). make test runs the pip-torch leg's ctest -j 2 this way.
#   with_cpu_load.sh COMMAND [ARGS...]
set -uo pipefail
# A busy loop in its own process (bash arithmetic, no I/O): one core's worth of load.
bash -c 'while :; do :; done' &
load=$!
trap 'kill "$load" 2>/dev/null' EXIT
echo "with_cpu_load.sh: a CPU-bound process (pid $load) runs beside: $*"
"$@"
