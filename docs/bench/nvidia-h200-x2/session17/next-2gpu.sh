#!/bin/bash
# For the next session on nvidia-h200-x2, at the head of session 17 or later (recovery by shrink is the default).
# Build: `cargo xtask gpu-test --bundle bundle`, copy this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`;
# run: `tar xJf bundle-cx/d.tar.xz && bash bundle/next-2gpu.sh 1` with carry ["bundle-cx"], then, on the warm
# machine at once (it goes back after 30 s idle), `... bash bundle/next-2gpu.sh 2`. Each call about 400-560 s.
# Call 1: the whole fault suite, both modes, with the new default (about 390 s).
# Call 2: the whole bench with PyTorch (about 410 s), then the sweep if time is left (busbw at 128 MiB).
# NOTE: bench --timeout is the whole bench's limit, not a job's.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
if [ "$1" = 1 ]; then
  for m in processes threads; do
    s=$SECONDS
    timeout 290 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes $m --timeout 60 --faults-report $OUT/faults-$m.md --out /tmp/f$m > /tmp/f$m.log 2>&1
    echo "faults $m rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' /tmp/f$m.log | cut -c1-300 >> $L
  done
  cd /tmp && tar czf $OUT/f.tgz fprocesses fthreads fprocesses.log fthreads.log 2>/dev/null; true
else
  s=$SECONDS
  timeout 480 bundle/xtask bench --from-bundle bundle --phases setup,step,graph,recover,async,latency,small --quick --python python3 --timeout 470 --out /tmp/b > /tmp/b.log 2>&1
  echo "bench rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "^| \`" /tmp/b/report.md | head -20 >> $L
  left=$((575-SECONDS))
  if [ $left -gt 60 ]; then
    s=$SECONDS
    timeout $left bundle/xtask bench --from-bundle bundle --phases sweep --quick --timeout $((left-5)) --out /tmp/s > /tmp/s.log 2>&1
    echo "sweep rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L
  fi
  cd /tmp && tar czf $OUT/b.tgz b b.log s s.log 2>/dev/null; true
fi
