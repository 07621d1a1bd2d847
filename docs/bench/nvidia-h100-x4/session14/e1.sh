#!/bin/bash
# Session 14, call E1 (4 GPUs): nccl-dist's GPU tests at world 4 with the mesh-connect change (B), then the
# set-up phase with PyTorch beside it: A (main, 12f44f8) and B, twice each, interleaved.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
mkdir -p A && cp -r bundle/python bundle/xtask A/ && cp bundle/nccl-bench-a A/nccl-bench
s=$SECONDS
timeout 200 bundle/xtask gpu-test --from-bundle bundle --worlds 4 --targets nccl-dist-gpu --timeout 40 > $OUT/t4.log 2>&1
echo "tests rc=$? in $((SECONDS-s)) s" | tee -a $L
grep -E "passed|failed|FAIL|pass " $OUT/t4.log | tail -40 >> $L
for v in A B A B; do
  d=bundle; [ $v = A ] && d=A
  s=$SECONDS
  timeout 170 bundle/xtask bench --from-bundle $d --phases setup --quick --python python3 --timeout 160 --out /tmp/s$v$SECONDS > /tmp/s$v$SECONDS.log 2>&1
  echo "setup $v rc=$? in $((SECONDS-s)) s" | tee -a $L
  [ $((SECONDS)) -gt 520 ] && break
done
for f in /tmp/s*/report.md; do echo "== $f" >> $L; grep -iA25 "set-up" $f | head -60 >> $L; done
cd /tmp && tar czf $OUT/setup.tgz s* 2>/dev/null
ls $OUT
