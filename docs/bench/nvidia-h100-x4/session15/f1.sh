#!/bin/bash
# Session 15, call 1 on 4 GPUs: the fault suite at world 4, threads mode, at the head that carries the recovery
# change; if it still fails, s3 alone twice: with NCCL's INIT/COLL logs, and with NCCL_CUMEM_ENABLE=0.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS; mkdir -p $OUT/threads
timeout 400 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 --modes threads --faults-report $OUT/threads > $OUT/f4-threads.log 2>&1
rc=$?; echo "faults threads rc=$rc in $((SECONDS-s)) s" | tee -a $L
tail -40 $OUT/f4-threads.log >> $L
if [ $rc -ne 0 ]; then
  left=$((560-SECONDS)); [ $left -gt 150 ] && left=150
  if [ $left -gt 30 ]; then
    s=$SECONDS; mkdir -p $OUT/s3log
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,COLL timeout $left bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 \
      --modes threads --filter s3_silent_at_the_first_send_recv --faults-report $OUT/s3log > $OUT/s3log.log 2>&1
    echo "s3 with NCCL logs rc=$? in $((SECONDS-s)) s" | tee -a $L
  fi
  left=$((570-SECONDS))
  if [ $left -gt 30 ]; then
    s=$SECONDS; mkdir -p $OUT/s3cumem0
    NCCL_CUMEM_ENABLE=0 timeout $left bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 \
      --modes threads --filter s3_silent_at_the_first_send_recv --faults-report $OUT/s3cumem0 > $OUT/s3cumem0.log 2>&1
    echo "s3 with NCCL_CUMEM_ENABLE=0 rc=$? in $((SECONDS-s)) s" | tee -a $L
  fi
fi
cd $OUT && for f in s3log.log; do [ -f $f ] && xz -9 $f; done; true
