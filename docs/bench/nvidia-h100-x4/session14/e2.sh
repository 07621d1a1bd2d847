#!/bin/bash
# Session 14, call E2 (4 GPUs): the fault suite at world 4, processes then threads (main).
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
for m in processes threads; do
  s=$SECONDS; left=$((585-SECONDS)); mkdir -p $OUT/$m
  timeout $left bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 --modes $m --faults-report $OUT/$m > $OUT/f4-$m.log 2>&1
  echo "faults $m rc=$? in $((SECONDS-s)) s" | tee -a $L
  tail -40 $OUT/f4-$m.log >> $L
done
