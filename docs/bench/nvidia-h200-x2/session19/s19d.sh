#!/bin/bash
# Session 19, call 4 on nvidia-h200-x2 (about 150 s): the control communicator at one channel (6db56d2) against
# NCCL's default (169d7d2), same machine, interleaved: the bench binary of each commit (bundle/nccl-bench and
# bundle/nccl-bench-169d7d2), set-up with one thread driving both GPUs and with a thread per GPU, 6 reps each.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
mkdir -p $OUT/ab
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
for round in 1 2; do
  for v in 169d7d2 6db56d2; do
    b=bundle/nccl-bench; [ $v = 169d7d2 ] && b=bundle/nccl-bench-169d7d2
    for m in single threads; do
      [ $SECONDS -gt 150 ] && break 3
      s=$SECONDS
      timeout 40 $b --setup --setup-reps 6 --mode $m --gpus 2 --json $OUT/ab/$m-$v-$round.json > /tmp/$m-$v-$round.log 2>&1
      echo "round $round $v $m rc=$? in $((SECONDS-s)) s" | tee -a $L
    done
  done
done
