#!/bin/bash
# Session 12, call A1: the lane (new, 90528de) against the record under the watch's lock (old, 4da859a's
# library), both release-lto: the step (6 interleaved runs per build and mode), the parts (segments, 2 each),
# small-call latency in processes (1 each).
export NCCL_NVLS_ENABLE=0
B=bundle-a; L=$OUT/all.log; R=/tmp/a1; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
A="--step --step-raw-mesh -n 500 -w 50 --rounds 21 -q"
one() { # name timeout cmd...
  local name=$1 to=$2; shift 2; local s=$SECONDS
  timeout $to "$@" > $R/$name.txt 2>&1
  echo "$name rc=$? $((SECONDS-s)) s" | tee -a $L; grep -E "^# default|raw_mesh - raw" $R/$name.txt | tail -3 >> $L
}
for rep in 1 2 3 4 5 6; do
  for bin in old new; do
    one thr-$bin-$rep 40 $B/$bin --mode threads -g 2 $A --json $R/thr-$bin-$rep.json
    one proc-$bin-$rep 45 $B/xtask launch -n 2 --timeout 40 $B/$bin --mode processes $A --json $R/proc-$bin-$rep.json
  done
done
for rep in 1 2; do
  for bin in old-seg new-seg; do
    one thr-$bin-$rep 40 $B/$bin --mode threads -g 2 $A
    one proc-$bin-$rep 45 $B/xtask launch -n 2 --timeout 40 $B/$bin --mode processes $A
  done
done
LA="-b 8 -e 1K -f 2 -n 1000 -w 100 --rounds 11 --layers raw,safe,dist -q"
for bin in old new; do
  one lat-proc-$bin 70 $B/xtask launch -n 2 --timeout 65 $B/$bin --mode processes $LA --json $R/lat-proc-$bin.json
done
cd /tmp && tar czf $OUT/a1.tgz a1
ls -la $OUT
