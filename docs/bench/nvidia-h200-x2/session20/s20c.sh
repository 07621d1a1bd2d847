#!/bin/bash
# Session 20 on nvidia-h200-x2, the last device time (about 380 s): the fault suite at world 2, a process per GPU,
# on the session's code (a cut-short init answers at once; the CUDA context before the rendezvous). Build: `cargo
# xtask gpu-test --bundle bundle`, copy this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`; run
# `tar xJf bundle-cx/d.tar.xz && bash bundle/s20c.sh` with carry ["bundle-cx"].
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
timeout 268 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes processes --timeout 265 --faults-report /tmp/p2.md --out /tmp/p2 > /tmp/p2.log 2>&1
echo "faults processes rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h '^| 2 ' /tmp/p2.md | cut -d'|' -f3,7,9,10 >> $L
grep -h "pass in\|FAIL\|fail" /tmp/p2.log | tail -30 | cut -c1-200 >> $L
cd /tmp && tar czf $OUT/p2.tgz p2 p2.md p2.log 2>/dev/null; true
