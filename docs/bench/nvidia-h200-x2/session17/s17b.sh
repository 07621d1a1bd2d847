#!/bin/bash
# Session 17, last call (about 120 s; ordered by what matters most, the call's limit may cut the end): the rendezvous attach fix and the late park decision on GPUs.
# Fault cases where a rank dies near set-up, with recovery by shrink on and off; g three more times with
# it on; the recover phase (default and shrink jobs).
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
F=g_kill_during_init,a_sigkill_mid_all_reduce,a0_sigkill_rank0_mid_all_reduce,n_recover_and_rejoin,n0_recover_and_rejoin_after_rank0,f1_kill_before_mesh,f2_kill_during_mesh
for m in 1 0; do
  s=$SECONDS
  NCCL_RS_RECOVER_BY_SHRINK=$m timeout 60 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes processes --filter $F --timeout 30 --faults-report $OUT/faults-$m.md --out /tmp/f$m > /tmp/f$m.log 2>&1
  echo "faults shrink=$m rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' /tmp/f$m.log | cut -c1-300 >> $L
done
s=$SECONDS
timeout 45 bundle/xtask bench --from-bundle bundle --phases recover --quick --timeout 40 --out /tmp/r > /tmp/r.log 2>&1
echo "recover rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "^| threads" /tmp/r/report.md >> $L; grep "recover_by_shrink_ms\|\"recover_ms\"" /tmp/r/bench.json >> $L
for i in 1 2 3; do
  NCCL_RS_RECOVER_BY_SHRINK=1 timeout 30 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes processes --filter g_kill_during_init --timeout 20 --out /tmp/g$i > /tmp/g$i.log 2>&1
  echo "g shrink #$i rc=$?" | tee -a $L; grep -h 'pass in\|FAIL in' /tmp/g$i.log | cut -c1-300 >> $L
done
cd /tmp && tar czf $OUT/s17b.tgz f0 f1 f0.log f1.log g1 g2 g3 r r.log 2>/dev/null; true
