#!/bin/bash
# Session 13, call C1 (HEAD: the signal's two passes, the lane's review fixes, NCCL_RS_WATCHDOG_POLL_MS):
# 1. the test that failed with the nccl-safe layout change, at HEAD and with safe-layout-v2.patch, 3 times each;
# 2. the step, interleaved: default (watchdog polls every 2 ms), poll 100 ms, watchdog off, and the layout
#    patch's build (3 runs each per mode), then the segments build (default, poll 100 ms, off; 1 run each);
# 3. nccl-dist's GPU tests in every mode, then the other targets in what time is left.
export NCCL_NVLS_ENABLE=0
B=bundle-c; L=$OUT/all.log; R=/tmp/c1; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
T=a_failing_rank_ends_the_others_at_once_with_a_thread_per_gpu
for rep in 1 2 3; do
  for v in head lay; do
    bin=$B/tests/nccl-dist-gpu; [ $v = lay ] && bin=$B/lay/nccl-dist-gpu
    s=$SECONDS
    NCCL_SAFE_TEST_MODE=single NCCL_SAFE_TEST_WORLD=2 timeout 25 $bin --ignored --exact $T > $R/t-$v-$rep.log 2>&1
    echo "test $v $rep rc=$? in $((SECONDS-s)) s" | tee -a $L
  done
done
A="--step --step-raw-mesh -n 500 -w 50 --rounds 21 -q"
one() { # name env bin mode
  local name=$1 env=$2 bin=$3 mode=$4 s=$SECONDS
  if [ $mode = threads ]; then
    env $env timeout 40 $B/$bin --mode threads -g 2 $A --json $R/$name.json > $R/$name.txt 2>&1
  else
    env $env timeout 45 $B/xtask launch -n 2 --timeout 40 $B/$bin --mode processes $A --json $R/$name.json > $R/$name.txt 2>&1
  fi
  echo "$name rc=$? $((SECONDS-s)) s" | tee -a $L; grep -E "^# default|raw_mesh - raw" $R/$name.txt | tail -3 >> $L
}
for rep in 1 2 3; do
  for mode in threads processes; do
    one $mode-def-$rep "X=1" nccl-bench $mode
    one $mode-poll-$rep "NCCL_RS_WATCHDOG_POLL_MS=100" nccl-bench $mode
    one $mode-off-$rep "NCCL_RS_WATCHDOG=0" nccl-bench $mode
    one $mode-lay-$rep "X=1" nccl-bench-lay $mode
  done
done
for mode in threads processes; do
  one $mode-seg-def "X=1" nccl-bench-seg $mode
  one $mode-seg-poll "NCCL_RS_WATCHDOG_POLL_MS=100" nccl-bench-seg $mode
  one $mode-seg-off "NCCL_RS_WATCHDOG=0" nccl-bench-seg $mode
done
s=$SECONDS
timeout 150 $B/xtask gpu-test --from-bundle $B --worlds 2 --targets nccl-dist-gpu --out /tmp/t > /tmp/t.log 2>&1; echo "nccl-dist-gpu rc=$? in $((SECONDS-s)) s" | tee -a $L
cat /tmp/t/matrix.md >> $L 2>/dev/null; grep -iE "panicked|FAILED|test result" /tmp/t.log | head -20 >> $L
left=$((575-SECONDS)); [ $left -lt 20 ] && left=20
s=$SECONDS
timeout $left $B/xtask gpu-test --from-bundle $B --worlds 2 --targets nccl-safe-abort,nccl-safe-gpu,nccl-safe-completion,nccl-dist-topology,nccl-dist-bad-input --out /tmp/u > /tmp/u.log 2>&1; echo "other targets rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L
cat /tmp/u/matrix.md >> $L 2>/dev/null; grep -iE "panicked|FAILED|test result" /tmp/u.log | head -20 >> $L
cd /tmp && tar czf $OUT/c1.tgz c1 t t.log u u.log 2>/dev/null
ls $OUT
