#!/bin/bash
# For the next session with a 4-GPU kind (not run yet): (1) f2 and g, the two cases whose time to name a death
# sits near the 2 s bound at world 4, ten times each with NCCL's INIT log at ms resolution, to see where the time
# goes (NCCL's aborts one after another?); (2) the GPU targets that did not run at world 4 in session 14
# (the end of nccl-safe-completion, nccl-dist-bad-input, nccl-dist-topology).
# Build: `cargo xtask gpu-test --bundle bundle`, copy this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`;
# run: `tar xJf bundle-cx/d.tar.xz && bash bundle/next-4gpu.sh` with carry ["bundle-cx"].
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
for k in $(seq 1 10); do
  [ $SECONDS -gt 200 ] && break
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT NCCL_DEBUG_TIMESTAMP_LEVELS=ALL NCCL_DEBUG_TIMESTAMP_FORMAT='[%T.%3f] ' \
  timeout 60 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 --modes processes --timeout 45 \
    --filter f2_kill_during_mesh,g_kill_during_init --out /tmp/fg-$k --faults-report /tmp/fg-$k/report > /tmp/fg-$k.log 2>&1
  echo "f2+g run $k rc=$?" | tee -a $L; grep -h 'pass in\|FAIL in' /tmp/fg-$k.log | cut -c1-300 >> $L
done
s=$SECONDS; left=$((560-SECONDS))
timeout $left bundle/xtask gpu-test --from-bundle bundle --worlds 4 --targets nccl-dist-bad-input,nccl-dist-topology,nccl-safe-completion \
  --timeout 60 > /tmp/rest.log 2>&1
echo "other targets rc=$? in $((SECONDS-s)) s" | tee -a $L; tail -20 /tmp/rest.log >> $L
cd /tmp && tar cJf $OUT/next.tar.xz fg-* rest.log 2>/dev/null; true
