#!/bin/bash
# Session 19, calls 2 and 3 (control communicator at one channel). Build: `cargo xtask gpu-test --bundle bundle`,
# copy this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`; run `tar xJf bundle-cx/d.tar.xz && bash bundle/s19b.sh N`
# with carry ["bundle-cx"].
# 2 (nvidia-h200-x2, about 430 s): the fault suite with a process per rank, then the set-up and recover phases with PyTorch.
# 4 (nvidia-h100-x4, at most 580 s): the fault suite at world 4, processes then threads.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
if [ "$1" = 2 ]; then
  s=$SECONDS
  timeout 320 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes processes --timeout 60 --faults-report $OUT/faults-processes.md --out /tmp/fprocesses > /tmp/fprocesses.log 2>&1
  echo "faults processes rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' /tmp/fprocesses.log | cut -c1-300 >> $L
  s=$SECONDS; left=$((585-SECONDS))
  timeout $left bundle/xtask bench --from-bundle bundle --phases setup,recover --quick --python python3 --timeout $((left-5)) --out /tmp/b > /tmp/b.log 2>&1
  echo "bench rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L; grep "^| \`\|^| processes-fresh\|^| torch" /tmp/b/report.md >> $L
  cd /tmp && tar czf $OUT/b.tgz fprocesses fprocesses.log b b.log 2>/dev/null; true
else
  for m in processes threads; do
    s=$SECONDS; left=$((580-SECONDS)); [ $left -lt 60 ] && break
    timeout $left bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 --modes $m --timeout 60 --faults-report $OUT/faults-$m.md --out /tmp/f$m > /tmp/f$m.log 2>&1
    echo "faults $m rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' /tmp/f$m.log | cut -c1-300 >> $L
  done
  cd /tmp && tar czf $OUT/f.tgz fprocesses fthreads fprocesses.log fthreads.log 2>/dev/null; true
fi
