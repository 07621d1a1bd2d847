#!/bin/bash
# Session 20 on nvidia-h200-x2, after 5d5b016 and the context change (a parentless init cut short by its signal answers at once; World::init_with makes the CUDA context before the rendezvous): the GPU
# matrix (nccl-safe's abort test of it included), then fault case g three times at world 2. Build: `cargo xtask gpu-test
# --bundle bundle`, copy this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`; run
# `tar xJf bundle-cx/d.tar.xz && bash bundle/s20b.sh` with carry ["bundle-cx"] (about 420 s).
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
timeout 470 bundle/xtask gpu-test --from-bundle bundle --worlds 2 --out /tmp/m > /tmp/m.log 2>&1
echo "matrix rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h -i 'pass\|fail' /tmp/m.log | tail -60 | cut -c1-300 >> $L
for i in 1 2 3; do
  s=$SECONDS; left=$((585-SECONDS))
  [ $left -lt 40 ] && break
  timeout $left bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes processes --filter g_kill_during_init --timeout $((left-5)) --faults-report /tmp/g$i.md --out /tmp/g$i > /tmp/g$i.log 2>&1
  echo "g run $i rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'g_kill' /tmp/g$i.md | cut -d'|' -f7-13 >> $L
done
cd /tmp && tar czf $OUT/m.tgz m m.log g1* g2* g3* 2>/dev/null; true
