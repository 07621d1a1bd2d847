#!/bin/bash
# Session 20 on nvidia-h100-x4, after 5d5b016 (a parentless init cut short by its signal answers at once; the
# drop makes NCCL's abort): g (a rank killed during World::init_with, 1987–1992 ms at 6db56d2) three times with
# NCCL's init log at millisecond resolution, then the whole fault suite, a process per GPU. Build: `cargo xtask
# gpu-test --bundle bundle`, copy this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`; run
# `tar xJf bundle-cx/d.tar.xz && bash bundle/s20-4gpu.sh` with carry ["bundle-cx"] (about 480 s).
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
for i in 1 2 3; do
  s=$SECONDS
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT NCCL_DEBUG_TIMESTAMP_LEVELS=ALL NCCL_DEBUG_TIMESTAMP_FORMAT="[%T.%3f] " timeout 60 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 --modes processes --filter g_kill_during_init --timeout 60 --faults-report /tmp/g$i.md --out /tmp/g$i > /tmp/g$i.log 2>&1
  echo "g run $i rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'g_kill' /tmp/g$i.md | cut -d'|' -f7-12 >> $L
done
s=$SECONDS; left=$((585-SECONDS))
timeout $left bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 --modes processes --timeout $((left-5)) --faults-report /tmp/p4.md --out /tmp/p4 > /tmp/p4.log 2>&1
echo "faults processes rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h '^| 4 ' /tmp/p4.md | cut -d'|' -f3,7,9,10 >> $L
cd /tmp && tar czf $OUT/f.tgz g1* g2* g3* p4* 2>/dev/null; true
