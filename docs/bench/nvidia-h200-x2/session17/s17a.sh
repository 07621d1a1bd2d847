#!/bin/bash
# Session 17, call 3: fault case g with tracing, parking off and on; then the full default bench.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
for m in 0 1; do
  s=$SECONDS
  NCCL_RS_RECOVER_BY_SHRINK=$m NCCL_SAFE_TEST_TRACE=1 timeout 60 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes processes --filter g_kill_during_init --timeout 40 --faults-report /tmp/g$m.md --out /tmp/g$m > /tmp/g$m.log 2>&1
  echo "g shrink=$m rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' /tmp/g$m.log | cut -c1-300 >> $L
done
s=$SECONDS; left=$((585-SECONDS))
timeout $left bundle/xtask bench --from-bundle bundle --phases setup,step,graph,recover,async,latency,small --quick --python python3 --timeout $((left-10)) --out /tmp/b > /tmp/b.log 2>&1
echo "bench rc=$? in $((SECONDS-s)) s" | tee -a $L
cd /tmp && tar czf $OUT/s17a.tgz g0 g0.log g0.md g1 g1.log g1.md b b.log 2>/dev/null; true
