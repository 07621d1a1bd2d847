#!/bin/bash
# Session 18 on nvidia-h200-x2 (recovery by shrink the default). Build: `cargo xtask gpu-test --bundle bundle`,
# copy this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`; run `tar xJf bundle-cx/d.tar.xz && bash bundle/s18.sh N`
# with carry ["bundle-cx"]; the calls one after another on the warm machine.
# 1: the whole fault suite, both modes, then the nccl-dist-gpu matrix target (about 490 s).
# 2: the whole bench with PyTorch (about 410 s), then the sweep with what is left (bench --timeout is the whole bench's).
# 3: the rest of the GPU matrix (about 230 s).
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
matrix() {
  s=$SECONDS
  timeout $2 bundle/xtask gpu-test --from-bundle bundle --worlds 2 --targets $1 --out /tmp/m-$3 > /tmp/m-$3.log 2>&1
  echo "matrix $1 rc=$? in $((SECONDS-s)) s" | tee -a $L
  grep -h -i 'pass\|fail' /tmp/m-$3.log | tail -60 | cut -c1-300 >> $L
}
if [ "$1" = 1 ]; then
  for m in processes threads; do
    s=$SECONDS
    timeout 300 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes $m --timeout 60 --faults-report $OUT/faults-$m.md --out /tmp/f$m > /tmp/f$m.log 2>&1
    echo "faults $m rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' /tmp/f$m.log | cut -c1-300 >> $L
  done
  # Where a one-rank split's time goes: NCCL's init timings and channel counts, and the mesh with one CTA a communicator.
  mkdir -p /tmp/x
  for m in single threads; do
    for v in a b; do
      s=$SECONDS
      if [ $v = a ]; then e=""; else e="NCCL_MAX_CTAS=1 NCCL_MIN_CTAS=1"; fi
      env $e timeout 60 bundle/nccl-bench --setup --setup-reps 6 --mode $m --gpus 2 --json /tmp/x/setup-$m-$v.json > /tmp/x/setup-$m-$v.log 2>&1
      echo "setup $m $v ($e) rc=$? in $((SECONDS-s)) s" | tee -a $L
    done
  done
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV timeout 60 bundle/nccl-bench --setup --setup-reps 2 --mode single --gpus 2 --json /tmp/x/setup-single-info.json > /tmp/x/setup-single-info.log 2>&1
  echo "setup single info rc=$?" | tee -a $L; grep -h "Init timings\|coll channels" /tmp/x/setup-single-info.log | head -20 >> $L
  left=$((570-SECONDS))
  [ $left -gt 60 ] && matrix nccl-dist-gpu $left dist
  cd /tmp && tar czf $OUT/f.tgz fprocesses fthreads fprocesses.log fthreads.log m-* x 2>/dev/null; true
elif [ "$1" = 2 ]; then
  s=$SECONDS
  timeout 470 bundle/xtask bench --from-bundle bundle --phases setup,step,graph,recover,async,latency,small --quick --python python3 --timeout 460 --out /tmp/b > /tmp/b.log 2>&1
  echo "bench rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "^| \`" /tmp/b/report.md | head -20 >> $L
  left=$((575-SECONDS))
  if [ $left -gt 60 ]; then
    s=$SECONDS
    timeout $left bundle/xtask bench --from-bundle bundle --phases sweep --quick --timeout $((left-5)) --out /tmp/s > /tmp/s.log 2>&1
    echo "sweep rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L
  fi
  cd /tmp && tar czf $OUT/b.tgz b b.log s s.log 2>/dev/null; true
else
  matrix nccl-safe-gpu,nccl-safe-abort,nccl-safe-completion,nccl-dist-topology,nccl-dist-bad-input 560 rest
  cd /tmp && tar czf $OUT/m.tgz m-* 2>/dev/null; true
fi
