#!/bin/bash
# For the next session on nvidia-h200-x2 (not run yet), at the head of session 16 or later: recovery by shrink in
# its final form (opt-in; the stop in the signal's group), then the default bench.
# Build: `cargo xtask gpu-test --bundle bundle`, copy this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`;
# run: `tar xJf bundle-cx/d.tar.xz && bash bundle/next-2gpu.sh` with carry ["bundle-cx"]. About 560 s.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
# 1. The recover phase with parking on (recover_ms; 47.7 at 2abffbd, before the kernels were stopped).
s=$SECONDS
NCCL_RS_RECOVER_BY_SHRINK=1 timeout 100 bundle/xtask bench --from-bundle bundle --phases recover --quick --timeout 90 --out /tmp/r > /tmp/r.log 2>&1
echo "recover (shrink) rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "^| threads" /tmp/r/report.md >> $L
# 2. The fault suite with parking on, both modes (1b613ec passed 25 + 12 with it on by default).
s=$SECONDS
NCCL_RS_RECOVER_BY_SHRINK=1 timeout 300 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes processes --timeout 60 --faults-report $OUT/faults-processes-shrink.md --out /tmp/fp > /tmp/fp.log 2>&1
echo "faults processes (shrink) rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' /tmp/fp.log | cut -c1-300 >> $L
s=$SECONDS; left=$((580-SECONDS))
NCCL_RS_RECOVER_BY_SHRINK=1 timeout $left bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes threads --timeout 60 --faults-report $OUT/faults-threads-shrink.md --out /tmp/ft > /tmp/ft.log 2>&1
echo "faults threads (shrink) rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' /tmp/ft.log | cut -c1-300 >> $L
cd /tmp && tar czf $OUT/next.tgz r r.log fp fp.log ft ft.log 2>/dev/null; true
# Then, in a second call on the warm machine: the default fault suite (processes) and the full bench
# (`--phases setup,step,graph,recover,async,latency,small --quick --python python3`), as session 15's g1.sh.
