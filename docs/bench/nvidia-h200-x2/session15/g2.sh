#!/bin/bash
# Session 15, call G2 (HEAD): the fault suite in threads mode at world 2 (in-process recovery with World::give_up),
# then the sweep to 128 MiB.
export NCCL_NVLS_ENABLE=0
B=bundle; L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
timeout 170 $B/xtask gpu-test --from-bundle $B --faults --worlds 2 --modes threads --faults-report $OUT/faults-threads.md --out /tmp/ft > /tmp/ft.log 2>&1; echo "faults threads rc=$? in $((SECONDS-s)) s" | tee -a $L
grep -h 'pass in\|FAIL in' /tmp/ft.log | cut -c1-400 >> $L
left=$((280-SECONDS)); [ $left -lt 20 ] && left=20
s=$SECONDS
timeout $left $B/xtask bench --from-bundle $B --phases sweep --quick --timeout $((left-5)) --out /tmp/s > /tmp/s.log 2>&1; echo "sweep rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L
grep -B2 -A16 "^## Bandwidth" /tmp/s/report.md >> $L 2>/dev/null
cd /tmp && tar czf $OUT/g2.tgz ft.log ft s s.log 2>/dev/null
ls $OUT
