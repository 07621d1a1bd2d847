#!/bin/bash
# Session 15, call 3 on 4 GPUs: f2 (failed once in call 2: a survivor's split of DeviceMesh::new ran into the
# 10 s timeout instead of PeerLost) four times with NCCL's INIT/BOOTSTRAP log, each case cut at 45 s; then the
# cases call 2 did not reach (g, i, r), processes mode, world 4. Per-case logs and fields under $OUT.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
for k in 1 2 3 4; do
  s=$SECONDS
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP NCCL_DEBUG_TIMESTAMP_LEVELS=ALL \
  timeout 120 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 --modes processes --timeout 45 \
    --filter f2_kill_during_mesh --out /tmp/f2-$k --faults-report /tmp/f2-$k/report > /tmp/f2-$k.log 2>&1
  echo "f2 run $k rc=$? in $((SECONDS-s)) s" | tee -a $L
  grep -h 'pass in\|FAIL in' /tmp/f2-$k.log | cut -c1-600 >> $L
done
s=$SECONDS; left=$((560-SECONDS))
timeout $left bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 --modes processes \
  --filter g_kill_during_init,i_abort_while_group_open,r_fifty_abort_rebuild_cycles \
  --out /tmp/rest --faults-report /tmp/rest/report > /tmp/rest.log 2>&1
echo "g,i,r rc=$? in $((SECONDS-s)) s" | tee -a $L
grep -h 'pass in\|FAIL in' /tmp/rest.log | cut -c1-600 >> $L
cd /tmp && tar cJf $OUT/f3.tar.xz f2-* rest rest.log 2>/dev/null; true
