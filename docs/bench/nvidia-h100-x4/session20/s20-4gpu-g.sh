#!/bin/bash
# Session 20 on nvidia-h100-x4, after the device's context moved before the rendezvous (call 2 found g's survivors
# making their CUDA contexts for 1.1-1.6 s after the victim's death, before NCCL was called): g three times with
# NCCL's init log. Run `tar xJf bundle-cx/d.tar.xz && bash bundle/s20-4gpu-g.sh` with carry ["bundle-cx"].
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
for i in 1 2 3; do
  s=$SECONDS
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT NCCL_DEBUG_TIMESTAMP_LEVELS=ALL NCCL_DEBUG_TIMESTAMP_FORMAT="[%T.%3f] " timeout 60 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 --modes processes --filter g_kill_during_init --timeout 60 --faults-report /tmp/g$i.md --out /tmp/g$i > /tmp/g$i.log 2>&1
  echo "g run $i rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'g_kill' /tmp/g$i.md | cut -d'|' -f7-13 >> $L
done
cd /tmp && tar czf $OUT/g.tgz g1* g2* g3* 2>/dev/null; true
