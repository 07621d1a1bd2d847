#!/bin/bash
# Session 20 on nvidia-h200-x2 (the script of session 19's `next-2gpu.sh`): the whole report from one commit.
# Build: `cargo xtask gpu-test --bundle bundle`, copy this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`;
# run `tar xJf bundle-cx/d.tar.xz && bash bundle/s20.sh N` with carry ["bundle-cx"].
# 1 (about 560 s): every bench phase with PyTorch, then the quick sweep with what is left (bench --timeout is every
#   job together).
# 2 (about 560 s): the GPU matrix.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
if [ "$1" = 1 ]; then
  s=$SECONDS
  timeout 450 bundle/xtask bench --from-bundle bundle --phases setup,step,graph,recover,async,latency,small --quick --python python3 --timeout 445 --out /tmp/b > /tmp/b.log 2>&1
  echo "bench rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "^| \`" /tmp/b/report.md >> $L
  left=$((580-SECONDS))
  if [ $left -gt 60 ]; then
    s=$SECONDS
    timeout $left bundle/xtask bench --from-bundle bundle --phases sweep --quick --timeout $((left-5)) --out /tmp/s > /tmp/s.log 2>&1
    echo "sweep rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L
  fi
  cd /tmp && tar czf $OUT/b.tgz b b.log s s.log 2>/dev/null; true
else
  s=$SECONDS
  timeout 570 bundle/xtask gpu-test --from-bundle bundle --worlds 2 --out /tmp/m > /tmp/m.log 2>&1
  echo "matrix rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h -i 'pass\|fail' /tmp/m.log | tail -60 | cut -c1-300 >> $L
  cd /tmp && tar czf $OUT/m.tgz m m.log 2>/dev/null; true
fi
