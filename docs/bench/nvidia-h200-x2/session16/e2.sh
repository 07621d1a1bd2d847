#!/bin/bash
# Session 16, run 2 on 2 GPUs at 2abffbd: recovery by shrink (parked communicators). The recover phase, then the
# fault suite in both modes at world 2.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
timeout 150 bundle/xtask bench --from-bundle bundle --phases recover --quick --timeout 140 --out $OUT/r > $OUT/r.log 2>&1
echo "recover rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -A12 "^## Recover" $OUT/r/report.md >> $L
s=$SECONDS
timeout 200 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes threads --faults-report $OUT/faults-threads.md --out /tmp/ft > $OUT/ft.log 2>&1
echo "faults threads rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' $OUT/ft.log | cut -c1-300 >> $L
s=$SECONDS; left=$((580-SECONDS))
timeout $left bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes processes --faults-report $OUT/faults-processes.md --out /tmp/fp > $OUT/fp.log 2>&1
echo "faults processes rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' $OUT/fp.log | cut -c1-300 >> $L
cd /tmp && tar czf $OUT/logs.tgz ft fp 2>/dev/null; true
