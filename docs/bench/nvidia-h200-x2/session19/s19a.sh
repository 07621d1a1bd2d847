#!/bin/bash
# Session 19, call 1 on nvidia-h200-x2 (about 520 s). Build: `cargo xtask gpu-test --bundle bundle`, copy this
# script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`; run `tar xJf bundle-cx/d.tar.xz && bash bundle/s19a.sh`
# with carry ["bundle-cx"].
# 1. The fault suite with a thread per rank at HEAD (df52db3's mesh change had only the mesh and world tests).
# 2. Where `world_over_torch` goes: which architectures each libnccl carries; the set-up phase with PyTorch on /lib's
#    NCCL 2.28.3 (our default) and on the venv's 2.28.9 (PyTorch's own); NCCL's init timings of ours on each and of
#    PyTorch's init_process_group.
export NCCL_NVLS_ENABLE=0
L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
s=$SECONDS
timeout 200 bundle/xtask gpu-test --from-bundle bundle --faults --worlds 2 --modes threads --timeout 60 --faults-report $OUT/faults-threads.md --out /tmp/fthreads > /tmp/fthreads.log 2>&1
echo "faults threads rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'pass in\|FAIL in' /tmp/fthreads.log | cut -c1-300 >> $L
V=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")/lib/libnccl.so.2
for f in /lib/x86_64-linux-gnu/libnccl.so.2 $V; do
  echo "$f: $(ls -laL $f | awk '{print $5}') bytes; cubins: $(cuobjdump --list-elf $f 2>/dev/null | grep -o 'sm_[0-9]*[a-z]*' | sort | uniq -c | tr '\n' ' ')" | tee -a $L
  echo "$f: ptx: $(cuobjdump --list-ptx $f 2>/dev/null | grep -o 'sm_[0-9]*[a-z]*' | sort | uniq -c | tr '\n' ' ')" | tee -a $L
done
for lib in sys venv; do
  s=$SECONDS
  if [ $lib = venv ]; then export NCCL_LIBRARY=$V; else unset NCCL_LIBRARY; fi
  timeout 150 bundle/xtask bench --from-bundle bundle --phases setup --quick --python python3 --timeout 145 --out /tmp/b-$lib > /tmp/b-$lib.log 2>&1
  echo "setup ($lib) rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "setup_ms\|mesh_over\|world_over\|^| processes-fresh\|^| torch" /tmp/b-$lib/report.md >> $L
done
for lib in sys venv; do
  s=$SECONDS
  if [ $lib = venv ]; then export NCCL_LIBRARY=$V; else unset NCCL_LIBRARY; fi
  [ $((SECONDS)) -gt 500 ] && break
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout 50 bundle/xtask bench --from-bundle bundle --phases setup --quick --timeout 45 --out /tmp/i-$lib > /tmp/i-$lib.log 2>&1
  echo "info ($lib) rc=$? in $((SECONDS-s)) s" | tee -a $L
  grep -rh "Init timings" /tmp/i-$lib* | grep -v "nranks 1" | head -6 >> $L
done
unset NCCL_LIBRARY
if [ $SECONDS -lt 540 ]; then
  mkdir -p /tmp/t && cd /tmp/t
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT TORCH_SYMM_MEM_DISABLE_MULTICAST=1 timeout 40 python3 -m torch.distributed.run --standalone --nproc-per-node=2 $OLDPWD/bundle/python/torch_setup.py --json /tmp/t/t.json --rep 1 > /tmp/t/t.log 2>&1
  echo "torch info rc=$?" | tee -a $L; grep -h "Init timings\|NCCL version" /tmp/t/t.log | head -6 >> $L
  cd $OLDPWD
fi
cd /tmp && tar czf $OUT/b.tgz fthreads fthreads.log b-* i-* t 2>/dev/null; true
