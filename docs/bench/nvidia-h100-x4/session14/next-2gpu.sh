#!/bin/bash
# For the next session on nvidia-h200-x2 (not run yet): the fault suite in both modes at world 2 and the bench's
# recover phase, at the head that carries the recovery change: `recover_ms` (target <= 150 ms; 50.8 at 0417677)
# now includes waiting until NCCL is done with the old world's communicators. Same bundle as next-4gpu.sh.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
timeout 200 bundle/xtask bench --from-bundle bundle --phases recover --quick --timeout 180 --out /tmp/r > /tmp/r.log 2>&1
echo "recover rc=$? in $((SECONDS-s)) s" | tee -a $L
grep -A12 "^## Recovery" /tmp/r/report.md >> $L
for m in threads processes; do
  s=$SECONDS; left=$((580-SECONDS)); [ $left -lt 60 ] && break; mkdir -p $OUT/$m
  timeout $left bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes $m --faults-report $OUT/$m > $OUT/f2-$m.log 2>&1
  echo "faults $m rc=$? in $((SECONDS-s)) s" | tee -a $L
done
cd /tmp && tar czf $OUT/recover.tgz r r.log 2>/dev/null
