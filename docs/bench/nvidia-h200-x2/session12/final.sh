#!/bin/bash
# Session 12, final call (e1d4c2f: nccl-safe as at 88993d0, the watch's lane in nccl-dist): the bench with PyTorch
# (setup in 6 PyTorch launches, step with raw_mesh, graph, recover, async, latency; release-lto), the sweep to
# 128 MiB if time is left, then the test that failed with the nccl-safe layout change, alone, twice.
export NCCL_NVLS_ENABLE=0
B=bundle-f; L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
timeout 345 $B/xtask bench --from-bundle $B --phases setup,step,graph,recover,async,latency --quick --python python3 --timeout 330 --out /tmp/b > /tmp/b.log 2>&1; echo "bench rc=$? in $((SECONDS-s)) s" | tee -a $L
cp -r /tmp/b /tmp/b-main
for rep in 1 2; do
  s=$SECONDS
  NCCL_SAFE_TEST_MODE=single NCCL_SAFE_TEST_WORLD=2 timeout 25 $B/tests/nccl-dist-gpu --ignored --exact a_failing_rank_ends_the_others_at_once_with_a_thread_per_gpu > /tmp/t$rep.log 2>&1; echo "test rerun $rep rc=$? in $((SECONDS-s)) s" | tee -a $L
  grep -E "test result|panicked" /tmp/t$rep.log >> $L
done
left=$((395-SECONDS))
if [ $left -gt 35 ]; then
  s=$SECONDS
  timeout $left $B/xtask bench --from-bundle $B --phases sweep --quick --timeout $((left-5)) --out /tmp/b > /tmp/b-sweep.log 2>&1; echo "sweep rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L
else
  echo "sweep skipped: $left s left" | tee -a $L
fi
grep -A24 "^## Verdict" /tmp/b/report.md >> $L; tail -3 /tmp/b.log | cut -c1-300 >> $L
cd /tmp && tar czf $OUT/bench.tgz b b-main b.log b-sweep.log t1.log t2.log 2>/dev/null
ls $OUT
