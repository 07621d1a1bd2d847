#!/bin/bash
# Session 16, run 4 on 2 GPUs at 1b613ec: (1) case h (threads) with the crates' tracing and NCCL's warnings, to see why the
# thread-mode recoveries took the give-up path at run 3 (the processes ones shrank); (2) the bench's phases whose
# paths changed (setup: the meshes' parent; recover; step) and the per-call ones (latency, async), PyTorch beside.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
NCCL_SAFE_TEST_TRACE=1 NCCL_DEBUG=WARN timeout 60 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes threads --filter h_thread_panics_mid_collective --timeout 50 --out /tmp/h --faults-report /tmp/h/report.md > /tmp/h.log 2>&1
echo "h rc=$? in $((SECONDS-s)) s" | tee -a $L
s=$SECONDS
timeout 370 bundle/xtask bench --from-bundle bundle --phases setup,step,recover,async,latency --quick --python python3 --timeout 360 --out /tmp/b > /tmp/b.log 2>&1; echo "bench rc=$? in $((SECONDS-s)) s" | tee -a $L
grep -A30 "^## Verdict" /tmp/b/report.md >> $L; tail -5 /tmp/b.log | cut -c1-300 >> $L
cd /tmp && tar czf $OUT/e4.tgz h h.log b b.log 2>/dev/null; true
