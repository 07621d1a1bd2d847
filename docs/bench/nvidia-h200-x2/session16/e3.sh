#!/bin/bash
# Session 16, run 3 on 2 GPUs at 1b613ec: parked communicators whose kernels stop at once. The recover phase, the
# fault suite in processes mode (a, a0, n hung at run 2: no kernel ran while the parked world's kernels spun),
# then threads.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
timeout 100 bundle/xtask bench --from-bundle bundle --phases recover --quick --timeout 90 --out $OUT/r > $OUT/r.log 2>&1
echo "recover rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "^| threads" $OUT/r/report.md >> $L
s=$SECONDS
timeout 330 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes processes --timeout 60 --faults-report $OUT/faults-processes.md --out /tmp/fp > $OUT/fp.log 2>&1
echo "faults processes rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' $OUT/fp.log | cut -c1-300 >> $L
s=$SECONDS; left=$((585-SECONDS))
timeout $left bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes threads --faults-report $OUT/faults-threads.md --out /tmp/ft > $OUT/ft.log 2>&1
echo "faults threads rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' $OUT/ft.log | cut -c1-300 >> $L
cd /tmp && tar czf $OUT/logs.tgz ft fp 2>/dev/null; true
