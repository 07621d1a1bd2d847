#!/bin/bash
# Session 14, call E3 (4 GPUs): the GPU matrix's other targets at world 4 (main).
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
timeout 360 bundle/xtask gpu-test --from-bundle bundle --worlds 4 --targets nccl-safe-gpu,nccl-safe-abort,nccl-safe-completion,nccl-dist-bad-input,nccl-dist-topology --timeout 60 > $OUT/o4.log 2>&1
echo "other targets rc=$? in $((SECONDS-s)) s" | tee -a $L
tail -80 $OUT/o4.log >> $L
