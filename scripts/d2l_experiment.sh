#!/usr/bin/env bash
# The d2l multi-GPU experiment ("Concise Implementation for Multiple GPUs") on CPU devices:
# ResNet-18 on Fashion-MNIST, 1 device at batch 256 / lr 0.1 against 2 devices at batch
# 512 / lr 0.2 (--scale-lr), in DataParallel and in DDP mode. Prints each run's epoch lines
# and leaves metrics (JSON lines) and plots in $OUT.
#
# Environment (defaults reproduce d2l's 10 epochs on the shipped 6000/1000 subset):
#   EPOCHS=10   epochs per run
#   LIMIT=0     use only the first N train and N test samples (0: all; see --limit)
#   DATA=       --data (default: the shipped subset); e.g. /work/shared/datasets/fashion-mnist
#   OUT=d2l-out where metrics and plots go
#   RUNS="single dp ddp"
#   DEVICES=cpu  cpu: cpu:0 against cpu:0,cpu:1; cuda: cuda:0 against cuda:0,cuda:1 (single, dp)
# On 2 CPU cores one ResNet-18 epoch over 6000 images takes minutes: time EPOCHS=1 first.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-build/bin/datapar}
EPOCHS=${EPOCHS:-10}
LIMIT=${LIMIT:-0}
OUT=${OUT:-d2l-out}
RUNS=${RUNS:-single dp ddp}
DEVICES=${DEVICES:-cpu}
one=$DEVICES:0
two=$DEVICES:0,$DEVICES:1
mkdir -p "$OUT"
common=(train --model resnet18 --epochs "$EPOCHS" --batch-size 256 --lr 0.1 --limit "$LIMIT" --seed 0)
[[ -n "${DATA:-}" ]] && common+=(--data "$DATA")

echo "d2l experiment: ResNet-18, $EPOCHS epochs, limit $LIMIT, load: $(cut -d' ' -f1-3 /proc/loadavg)"
# Plots where gnuplot is installed; a GPU node often has none, and the metrics say it all.
plot() { if command -v gnuplot >/dev/null; then echo --plot "$OUT/$1.png"; fi; }
command -v gnuplot >/dev/null || echo "no gnuplot on PATH: metrics only, no plots"
for run in $RUNS; do
  echo "== $run"
  case $run in
    single) "$BIN" "${common[@]}" --mode single --devices "$one" \
              --metrics "$OUT/single.jsonl" $(plot single) ;;
    dp)     "$BIN" "${common[@]}" --mode dp --devices "$two" --scale-lr \
              --metrics "$OUT/dp.jsonl" $(plot dp) ;;
    ddp)
      args=("${common[@]}" --mode ddp --scale-lr --metrics "$OUT/ddp.jsonl" $(plot ddp))
      if "$BIN" --help 2>/dev/null | grep -qE "^ +launch"; then
        "$BIN" launch --nproc-per-node 2 -- "$BIN" "${args[@]}"
      else  # no launcher in this build: start the two ranks with torchrun's variables
        port=$((29500 + RANDOM % 1000))
        for rank in 1 0; do
          env RANK=$rank WORLD_SIZE=2 LOCAL_RANK=$rank LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$port "$BIN" "${args[@]}" &
        done
        wait
      fi ;;
  esac
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
