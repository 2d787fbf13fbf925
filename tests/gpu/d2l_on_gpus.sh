#!/usr/bin/env bash
# CTest gpu.d2l_experiment: the d2l experiment on cuda:0 against cuda:0,cuda:1, one epoch on
# the shipped subset. Exit 77 (skipped) without 2 CUDA devices.
#   d2l_on_gpus.sh DATAPAR_BIN OUT_DIR
set -euo pipefail
bin=$1 out=$2
gpus=$("$bin" devices | sed -n 's/^CUDA: \([0-9]*\).*/\1/p')
if (( ${gpus:-0} < 2 )); then
  echo "skipped: needs 2 CUDA devices; '$bin devices' sees ${gpus:-0}"
  exit 77
fi
DEVICES=cuda EPOCHS=1 RUNS="single dp" BIN=$bin OUT=$out bash "$(dirname "$0")/../../scripts/d2l_experiment.sh"
