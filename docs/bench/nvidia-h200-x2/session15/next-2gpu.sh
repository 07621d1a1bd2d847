#!/bin/bash
# For the next session on nvidia-h200-x2 (not run yet): the recover phase, the fault suite with a process per GPU at the head
# (last run at 0417677; the recovery's give-up and the survivors' 30 s rendezvous changed since), then the GPU
# matrix at world 2 (last run at b26f2ae). Same bundle as the 4-GPU script.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
# First the recover phase: `recover_ms` with the signal's grouped aborts (885e198; 952.1 ms at 9348c3a, where
# giving the old world up took 886-911 ms of it).
s=$SECONDS
timeout 120 bundle/xtask bench --from-bundle bundle --phases recover --quick --timeout 110 --out /tmp/r > /tmp/r.log 2>&1
echo "recover rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -A8 "^## Recovery" /tmp/r/report.md | tail -4 >> $L
s=$SECONDS
timeout 290 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes processes --faults-report $OUT/faults-processes.md --out /tmp/fp > /tmp/fp.log 2>&1
echo "faults processes rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' /tmp/fp.log | cut -c1-300 >> $L
s=$SECONDS; left=$((575-SECONDS))
timeout $left bundle/xtask gpu-test --from-bundle bundle --worlds 2 --timeout 60 > /tmp/m.log 2>&1
echo "matrix rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L; tail -30 /tmp/m.log >> $L
cd /tmp && tar czf $OUT/next2.tgz r r.log fp.log fp m.log 2>/dev/null; true
