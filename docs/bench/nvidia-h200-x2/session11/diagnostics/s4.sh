#!/bin/bash
# Session 11, call S4: does where the issuing thread runs explain the step's two speeds? Topology, then the
# step pinned (each rank to its GPU's local CPUs, to 4 of them, to the other node's) against unpinned.
export NCCL_NVLS_ENABLE=0
B=bundle-s; L=$OUT/all.log; R=/tmp/s4; mkdir -p $R
nvidia-smi --query-gpu=name,pci.bus_id --format=csv,noheader | tee -a $L
lscpu | grep -iE "model name|numa|^cpu\(s\)|thread|core|socket|L3" | tee -a $L
nvidia-smi topo -m 2>&1 | tee -a $L
for d in /sys/bus/pci/devices/*; do [ -f $d/local_cpulist ] && grep -q 0x10de $d/vendor 2>/dev/null && echo "$d $(cat $d/class) $(cat $d/local_cpulist) numa $(cat $d/numa_node)"; done | grep 0x0302 | tee -a $L
A="--step --step-raw-mesh -n 500 -w 50 --rounds 21 -q"
one() { # name timeout cmd...
  local name=$1 to=$2; shift 2; local s=$SECONDS
  timeout $to "$@" > $R/$name.txt 2>&1
  echo "$name rc=$? $((SECONDS-s)) s" | tee -a $L; grep -E "default / raw|bind.sh" $R/$name.txt | tail -4 >> $L
}
for rep in 1 2 3; do
  for m in none local local4 remote; do
    one proc-$m-$rep 70 $B/xtask launch -n 2 --timeout 65 $B/bind.sh $m $B/nccl-bench --mode processes $A --json $R/proc-$m-$rep.json
  done
  for m in none local; do
    one thr-$m-$rep 60 $B/bind.sh $m $B/nccl-bench --mode threads -g 2 $A --json $R/thr-$m-$rep.json
  done
  one proc-lto-local-$rep 70 $B/xtask launch -n 2 --timeout 65 $B/bind.sh local $B/nccl-bench-lto --mode processes $A --json $R/proc-lto-local-$rep.json
done
cd /tmp && tar czf $OUT/s4.tgz s4
ls -la $OUT
