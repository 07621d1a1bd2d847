#!/bin/bash
# For the next session with a 4-GPU kind: g (a rank killed during World::init_with) named its death 1987–1992 ms
# after it at world 4 in session 19 (6db56d2), 8 ms inside the 2 s bound (853 ms at world 2). Where it goes (NCCL log
# lines with millisecond timestamps: is the survivors' ncclCommAbort waiting for their init thread to finish loading
# NCCL's kernels, which no abort flag reaches?): g five
# times with NCCL's init log, then the set-up and recover phases with PyTorch. Build: `cargo xtask gpu-test --bundle
# bundle`, copy this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`; run `tar xJf bundle-cx/d.tar.xz &&
# bash bundle/next-4gpu-s19.sh` with carry ["bundle-cx"] (about 500 s).
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
for i in 1 2 3 4 5; do
  s=$SECONDS
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT NCCL_DEBUG_TIMESTAMP_LEVELS=ALL NCCL_DEBUG_TIMESTAMP_FORMAT="[%T.%3f] " timeout 60 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 4 --modes processes --filter g_kill_during_init --timeout 60 --faults-report /tmp/g$i.md --out /tmp/g$i > /tmp/g$i.log 2>&1
  echo "g run $i rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'g_kill' /tmp/g$i.md | cut -d'|' -f8-10 >> $L
done
s=$SECONDS; left=$((580-SECONDS))
timeout $left bundle/xtask bench --from-bundle bundle --phases setup,recover --quick --python python3 --timeout $((left-5)) --out /tmp/b > /tmp/b.log 2>&1
echo "bench rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "^| \`" /tmp/b/report.md >> $L
cd /tmp && tar czf $OUT/g.tgz g1* g2* g3* g4* g5* b b.log 2>/dev/null; true
