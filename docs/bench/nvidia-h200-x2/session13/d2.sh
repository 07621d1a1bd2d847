#!/bin/bash
# Session 13, call D2 (HEAD): the bench with PyTorch beside it (setup in 6 PyTorch launches, step with raw_mesh,
# graph, recover, async, latency, small; release-lto), within 540 s.
export NCCL_NVLS_ENABLE=0
B=bundle; L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
timeout 560 $B/xtask bench --from-bundle $B --phases setup,step,graph,recover,async,latency,small --quick --python python3 --timeout 540 --out /tmp/b > /tmp/b.log 2>&1; echo "bench rc=$? in $((SECONDS-s)) s" | tee -a $L
grep -A30 "^## Verdict" /tmp/b/report.md >> $L; tail -5 /tmp/b.log | cut -c1-300 >> $L
cd /tmp && tar czf $OUT/bench.tgz b b.log 2>/dev/null
ls $OUT
