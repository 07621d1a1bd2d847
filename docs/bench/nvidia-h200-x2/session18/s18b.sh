#!/bin/bash
# Session 18, call 4, at df52db3 (one-rank axes split with at most 4 CTAs; the sweep's 15 rounds):
# the mesh tests of nccl-dist-gpu, the set-up phase with PyTorch, then the quick sweep with what is left.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
timeout 90 bundle/xtask gpu-test --from-bundle bundle --worlds 2 --targets nccl-dist-gpu --filter mesh,world --out /tmp/m4 > /tmp/m4.log 2>&1
echo "matrix mesh,world rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h ': pass\|FAIL\|fail' /tmp/m4.log | cut -c1-200 >> $L
s=$SECONDS
timeout 230 bundle/xtask bench --from-bundle bundle --phases setup --quick --python python3 --timeout 225 --out /tmp/b4 > /tmp/b4.log 2>&1
echo "setup rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "^| \`" /tmp/b4/report.md | head -20 >> $L
left=$((400-SECONDS))
if [ $left -gt 60 ]; then
  s=$SECONDS
  timeout $left bundle/xtask bench --from-bundle bundle --phases sweep --quick --timeout $((left-5)) --out /tmp/s4 > /tmp/s4.log 2>&1
  echo "sweep rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L; grep "busbw_large\|MISSED" /tmp/s4/report.md >> $L
fi
cd /tmp && tar czf $OUT/b4.tgz b4 b4.log s4 s4.log m4 m4.log 2>/dev/null; true
