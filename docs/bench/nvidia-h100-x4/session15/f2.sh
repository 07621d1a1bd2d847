#!/bin/bash
# Session 15, call 2 on 4 GPUs: the fault suite at world 4, processes mode (26 of 26 at 12f44f8), at the new head.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
s=$SECONDS; mkdir -p $OUT/processes
timeout 570 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 --modes processes --faults-report $OUT/processes > $OUT/f4-processes.log 2>&1
echo "faults processes rc=$? in $((SECONDS-s)) s" | tee -a $L
tail -40 $OUT/f4-processes.log >> $L
