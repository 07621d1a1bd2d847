#!/bin/bash
# For the next session on nvidia-h200-x2 (one call, about 400 s): where `world_over_torch` goes.
# Build: `cargo xtask gpu-test --bundle bundle`, copy this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`;
# run `tar xJf bundle-cx/d.tar.xz && bash bundle/next-2gpu.sh` with carry ["bundle-cx"].
# 1. The set-up phase with PyTorch twice: ours on /lib's NCCL 2.28.3 (the default), then ours on the venv's
#    2.28.9, PyTorch's own (like for like: a process's first communicator loads NCCL's kernels, 0.44 s of
#    NCCL's init timings with 2.28.3 in session 18).
# 2. NCCL's init timings of a fresh world on each library and of PyTorch's init_process_group.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
V=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib/libnccl.so.2
# Which architectures each library carries as cubins and as PTX (a library without sm_90 cubins
# has its kernels JIT-compiled from PTX at a process's first communicator).
for f in /lib/x86_64-linux-gnu/libnccl.so.2 $V; do
  echo "$f: cubins by arch: $(cuobjdump --list-elf $f 2>/dev/null | grep -o 'sm_[0-9]*[a-z]*' | sort | uniq -c | tr '\n' ' ')" | tee -a $L
  echo "$f: ptx by arch: $(cuobjdump --list-ptx $f 2>/dev/null | grep -o 'sm_[0-9]*[a-z]*' | sort | uniq -c | tr '\n' ' ')" | tee -a $L
done
for lib in sys venv; do
  s=$SECONDS
  if [ $lib = venv ]; then export NCCL_LIBRARY=$V; else unset NCCL_LIBRARY; fi
  timeout 200 bundle/xtask bench --from-bundle bundle --phases setup --quick --python python3 --timeout 195 --out /tmp/b-$lib > /tmp/b-$lib.log 2>&1
  echo "setup ($lib) rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "setup_ms\|mesh_over\|world_over" /tmp/b-$lib/report.md >> $L
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout 60 bundle/xtask bench --from-bundle bundle --phases setup --quick --timeout 55 --out /tmp/i-$lib > /tmp/i-$lib.log 2>&1
  grep -rh "Init timings" /tmp/i-$lib* | head -8 >> $L
done
unset NCCL_LIBRARY
cd /tmp && tar czf $OUT/b.tgz b-* i-* 2>/dev/null; true
