#!/bin/bash
# For the next session with a 4-GPU kind (listed in session 18, not run: the budget went to 2 GPUs).
# At HEAD (recovery by shrink the default since session 17; one-rank mesh axes at 4 CTAs since df52db3):
# the fault suite at world 4, processes first (f2's 2 s bound missed once in five at 9348c3a, when the
# default gave the old world up), then threads, each under what is left of one call's 600 s; then, in a
# second call on the warm machine, `bash bundle/next-4gpu-s18.sh setup`: the set-up and recover phases with
# PyTorch (a 2x2 mesh: no one-rank axis, so df52db3 does not apply; setup_ms was 675.8 ms with a process per
# GPU at 0417677). Build: `cargo xtask gpu-test --bundle bundle`, copy this script into bundle/,
# `tar cJf bundle-cx/d.tar.xz bundle`; run `tar xJf bundle-cx/d.tar.xz && bash bundle/next-4gpu-s18.sh`
# with carry ["bundle-cx"].
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
if [ "$1" = setup ]; then
  s=$SECONDS
  timeout 560 bundle/xtask bench --from-bundle bundle --phases setup,recover --quick --python python3 --timeout 550 --out /tmp/b > /tmp/b.log 2>&1
  echo "bench rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "^| \`" /tmp/b/report.md | head -20 >> $L
  cd /tmp && tar czf $OUT/b.tgz b b.log 2>/dev/null; true
  exit 0
fi
for m in processes threads; do
  s=$SECONDS; left=$((580-SECONDS)); [ $left -lt 60 ] && break
  timeout $left bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 --modes $m --timeout 60 --faults-report $OUT/faults-$m.md --out /tmp/f$m > /tmp/f$m.log 2>&1
  echo "faults $m rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' /tmp/f$m.log | cut -c1-300 >> $L
done
cd /tmp && tar czf $OUT/f.tgz fprocesses fthreads fprocesses.log fthreads.log 2>/dev/null; true
