#!/bin/bash
# Session 15, call G1 (HEAD, with World::give_up): the bench with PyTorch beside it (setup, step, graph, recover,
# async, latency, small; release-lto), within 545 s.
export NCCL_NVLS_ENABLE=0
B=bundle; L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
timeout 545 $B/xtask bench --from-bundle $B --phases setup,step,graph,recover,async,latency,small --quick --python python3 --timeout 530 --out /tmp/b > /tmp/b.log 2>&1; echo "bench rc=$? in $((SECONDS-s)) s" | tee -a $L
grep -A30 "^## Verdict" /tmp/b/report.md >> $L; tail -5 /tmp/b.log | cut -c1-300 >> $L
cd /tmp && tar czf $OUT/bench.tgz b b.log 2>/dev/null
ls $OUT
