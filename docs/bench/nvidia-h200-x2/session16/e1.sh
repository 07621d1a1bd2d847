#!/bin/bash
# Session 16, run 1 on 2 GPUs at df92482 (grouped aborts, first time on GPUs): the recover phase, then the fault
# suite in threads mode at world 2.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
timeout 150 bundle/xtask bench --from-bundle bundle --phases recover --quick --timeout 140 --out $OUT/r > $OUT/r.log 2>&1
echo "recover rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -A12 "^## Recover" $OUT/r/report.md >> $L
s=$SECONDS
timeout 240 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes threads --faults-report $OUT/faults-threads.md --out /tmp/ft > $OUT/ft.log 2>&1
echo "faults threads rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' $OUT/ft.log | cut -c1-300 >> $L
