#!/usr/bin/env bash
#   bench/stragglers.sh BIN_DIR   (e.g. build/bin; docs/benchmarks.md, "Stragglers named")
# 20 DDP runs of 2 ranks without a straggler, 20 with rank 1 slowed to 1.5x: how often a rank is named.
set -uo pipefail
bin=${1:?usage: bench/stragglers.sh BIN_DIR}
args="train --mode ddp --model lenet --data synthetic --batch-size 512 --lr 0.1 --workers 1 --epochs 2"
job() {  # $1: metrics file, $2: rank 1's extra flags
  local port=$((29500 + RANDOM % 400))
  for r in 0 1; do
    local extra=""; [[ $r == 1 ]] && extra="$2"
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port $bin/datapar $args --metrics $1 $extra > /dev/null 2>&1 &
  done
  wait
}
named_even=0 named_slow=0
for i in $(seq 1 20); do
  job /tmp/even.jsonl ""
  n=$(grep -c '"straggler":[0-9]' /tmp/even.jsonl); named_even=$((named_even + n))
  s=$(python3 -c "import json;m=json.loads(open('/tmp/even.jsonl').readline());print(m['seconds']/((m['train_samples']+511)//512)/2*1e3)")
  job /tmp/slow.jsonl "--slow-step $s"
  n=$(grep -c '"straggler":1' /tmp/slow.jsonl); named_slow=$((named_slow + n))
  echo "run $i: even scores $(grep -o '"straggler_scores":[^]]*]' /tmp/even.jsonl | tr '\n' ' ') slowed (+${s} ms) $(grep -o '"straggler":[-0-9]*,"straggler_scores":[^]]*]' /tmp/slow.jsonl | tr '\n' ' ')"
done
echo "epochs naming a rank without a straggler: $named_even of 40; epochs naming rank 1 when slowed to 1.5x: $named_slow of 40"
