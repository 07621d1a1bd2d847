#!/bin/bash
# Session 11, call S3: the step and small-call latency, plain release against fat LTO + one codegen unit
# (interleaved reps, both modes); the parts (segments) of each; set-up with the per-rank total.
export NCCL_NVLS_ENABLE=0
B=bundle-s; L=$OUT/all.log; R=/tmp/s3; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
A="--step --step-raw-mesh -n 500 -w 50 --rounds 21 -q"
one() { # name timeout cmd...
  local name=$1 to=$2; shift 2; local s=$SECONDS
  timeout $to "$@" > $R/$name.txt 2>&1
  echo "$name rc=$? $((SECONDS-s)) s" | tee -a $L; grep -E "^  |^#|segments" $R/$name.txt | tail -14 >> $L
}
one setup-proc 90 $B/xtask launch -n 2 --timeout 85 $B/nccl-bench --setup --setup-reps 6 --mode processes --json $R/setup-processes.json
one setup-thr 60 $B/nccl-bench --setup --setup-reps 6 --mode threads --json $R/setup-threads.json
for rep in 1 2 3 4; do
  for bin in nccl-bench nccl-bench-lto; do
    one thr-$bin-$rep 60 $B/$bin --mode threads -g 2 $A --json $R/thr-$bin-$rep.json
    one proc-$bin-$rep 70 $B/xtask launch -n 2 --timeout 65 $B/$bin --mode processes $A --json $R/proc-$bin-$rep.json
  done
done
for bin in nccl-bench-seg nccl-bench-seg-lto; do
  one thr-$bin 60 $B/$bin --mode threads -g 2 $A
  one proc-$bin 70 $B/xtask launch -n 2 --timeout 65 $B/$bin --mode processes $A
done
LA="-b 8 -e 1K -f 2 -n 1000 -w 100 --rounds 11 --layers raw,safe,dist -q"
for bin in nccl-bench nccl-bench-lto; do
  one lat-thr-$bin 90 $B/$bin --mode threads -g 2 $LA --json $R/lat-thr-$bin.json
  one lat-proc-$bin 90 $B/xtask launch -n 2 --timeout 85 $B/$bin --mode processes $LA --json $R/lat-proc-$bin.json
done
cd /tmp && tar czf $OUT/s3.tgz s3
ls -la $OUT
