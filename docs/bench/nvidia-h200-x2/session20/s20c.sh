#!/bin/bash
# Session 20 on nvidia-h200-x2, the last device time (about 380 s), on the session's final code (a cut-short init
# answers at once; the CUDA context made beside the rendezvous): fault case g twice at world 2, nccl-dist's
# bad-input rows on GPUs (a device out of range for World::init_with), then the fault cases that make worlds
# again (a, a0, n, n0, f1, f2, g, r) at world 2, a process per GPU (the whole suite does not fit the time left). Build: `cargo xtask gpu-test --bundle bundle`, copy this script into bundle/,
# `tar cJf bundle-cx/d.tar.xz bundle`; run `tar xJf bundle-cx/d.tar.xz && bash bundle/s20c.sh` with carry
# ["bundle-cx"].
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
for i in 1 2; do
  s=$SECONDS
  timeout 40 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes processes --filter g_kill_during_init --timeout 40 --faults-report /tmp/g$i.md --out /tmp/g$i > /tmp/g$i.log 2>&1
  echo "g run $i rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'g_kill' /tmp/g$i.md | cut -d'|' -f7-13 >> $L
done
s=$SECONDS
timeout 60 bundle/xtask gpu-test --from-bundle bundle --worlds 2 --targets nccl-dist-bad-input --out /tmp/bi > /tmp/bi.log 2>&1
echo "bad input rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h -i 'pass\|fail' /tmp/bi.log | tail -8 | cut -c1-200 >> $L
s=$SECONDS; left=$((270-SECONDS))
timeout $left bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes processes --filter a_sigkill,a0_sigkill,n_recover,n0_recover,f1_kill,f2_kill,g_kill,r_fifty --timeout $((left-3)) --faults-report /tmp/p2.md --out /tmp/p2 > /tmp/p2.log 2>&1
echo "faults processes rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L; grep -h '^| 2 ' /tmp/p2.md | cut -d'|' -f3,7,9,10 >> $L
grep -h "pass in\|FAIL\|fail" /tmp/p2.log | tail -30 | cut -c1-200 >> $L
cd /tmp && tar czf $OUT/p2.tgz g1* g2* bi bi.log p2 p2.md p2.log 2>/dev/null; true
