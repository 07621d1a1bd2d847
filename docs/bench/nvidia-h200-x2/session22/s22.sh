#!/bin/bash
# Session 22. Build: `cargo xtask gpu-test --bundle bundle` (HEAD's code), plus bundle/nccl-bench-warm (the
# release-lto bench with the prefetch hints of `crates/nccl-safe/src/warm.rs`, stripped); copy this script into
# bundle/, `tar cJf bundle-cx/d.tar.xz bundle`; run `tar xJf bundle-cx/d.tar.xz && bash bundle/s22.sh WHAT...` with
# carry ["bundle-cx"]. Several WHATs run one after the other.
# ab (about 280 s, 2 GPUs): the step, nccl-bench (old) against nccl-bench-warm (new), interleaved, 6 runs of each
#   per mode; two latency runs of each per mode, interleaved.
# matrix [SECONDS] (about 340 s): the GPU matrix, every target and mode, cut at SECONDS (default 580).
# bench (about 560 s): every bench phase with PyTorch, then the quick sweep with what is left.
# faults2p (about 260 s, 2 GPUs): the fault suite, processes. faults2t (about 145 s): threads.
# faults4 (about 460 s, 4 GPUs): the fault suite, processes then threads.
export NCCL_NVLS_ENABLE=0
B=bundle; MATRIX_LIMIT=${MATRIX_LIMIT:-580}; L=$OUT/all.log; R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
one() { # name bin mode args...
  local name=$1 bin=$2 mode=$3 s=$SECONDS; shift 3
  if [ $mode = threads ]; then
    timeout 60 $B/$bin --mode threads -g 2 "$@" --json $R/$name.json > $R/$name.txt 2>&1
  else
    timeout 65 $B/xtask launch -n 2 --timeout 60 $B/$bin --mode processes "$@" --json $R/$name.json > $R/$name.txt 2>&1
  fi
  echo "$name rc=$? $((SECONDS-s)) s" | tee -a $L
}
for what in "$@"; do
case "$what" in
ab)
  A="--step --step-raw-mesh -n 500 -w 50 --rounds 21 -q"
  for rep in 1 2 3 4 5 6; do
    for mode in threads processes; do
      if [ $((rep % 2)) = 1 ]; then order="old new"; else order="new old"; fi
      for v in $order; do
        bin=nccl-bench; [ $v = new ] && bin=nccl-bench-warm
        one step-$mode-$v-$rep $bin $mode $A
        python3 -c "import json,sys,statistics as st;d=json.load(open(sys.argv[1]))['step'];D,R,M=d['default_rounds_us'],d['raw_rounds_us'],d['raw_mesh_rounds_us'];print('  paired over_raw %.3f ours %+.2f; default %.1f raw %.1f raw_mesh %.1f' % (st.median([a/b for a,b in zip(D,R)]), st.median([a-b for a,b in zip(D,M)]), d['default_us'], d['raw_us'], d['raw_mesh_us']))" $R/step-$mode-$v-$rep.json >> $L 2>&1
      done
    done
  done
  for rep in 1 2; do for mode in threads processes; do
    if [ $rep = 1 ]; then order="old new"; else order="new old"; fi
    for v in $order; do
      bin=nccl-bench; [ $v = new ] && bin=nccl-bench-warm
      one lat-$mode-$v-$rep $bin $mode -b 8 -e 1K -f 2 --ops all_reduce,broadcast,send_recv -n 1000 -w 100 --rounds 11 --layers raw,safe,dist
    done
  done; done
  (cd /tmp && tar czf $OUT/ab.tgz r 2>/dev/null); true
  ;;
faults2t)
  s=$SECONDS
  left=$((592-SECONDS)); [ $left -gt 300 ] && left=300
  timeout $left $B/xtask gpu-test --from-bundle $B --faults --worlds 2 --modes threads --timeout $((left-5)) --faults-report /tmp/ft.md --out /tmp/ft > /tmp/ft.log 2>&1
  echo "faults threads rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h '^|' /tmp/ft.md | cut -d'|' -f2-7 >> $L
  (cd /tmp && tar czf $OUT/f2t.tgz ft ft.md ft.log 2>/dev/null); true
  ;;
matrix)
  s=$SECONDS
  lim=$MATRIX_LIMIT
  timeout $lim $B/xtask gpu-test --from-bundle $B --worlds 2 --out /tmp/m > /tmp/m.log 2>&1
  echo "matrix rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h -i 'pass\|fail' /tmp/m.log | tail -60 | cut -c1-300 >> $L
  (cd /tmp && tar czf $OUT/m.tgz m m.log 2>/dev/null); true
  ;;
bench)
  s=$SECONDS
  timeout 450 $B/xtask bench --from-bundle $B --phases setup,step,graph,recover,async,latency,small --quick --python python3 --timeout 445 --out /tmp/b > /tmp/b.log 2>&1
  echo "bench rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "^| \`" /tmp/b/report.md >> $L
  left=$((585-SECONDS))
  if [ $left -gt 60 ]; then
    s=$SECONDS
    timeout $left $B/xtask bench --from-bundle $B --phases sweep --quick --timeout $((left-5)) --out /tmp/s > /tmp/s.log 2>&1
    echo "sweep rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L
  fi
  (cd /tmp && tar czf $OUT/b.tgz b b.log s s.log 2>/dev/null); true
  ;;
faults2p)
  s=$SECONDS
  left=$((592-SECONDS)); [ $left -gt 500 ] && left=500
  timeout $left $B/xtask gpu-test --from-bundle $B --faults --worlds 2 --modes processes --timeout $((left-5)) --faults-report /tmp/fp.md --out /tmp/fp > /tmp/fp.log 2>&1
  echo "faults processes rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h '^|' /tmp/fp.md | cut -d'|' -f2-7 >> $L
  (cd /tmp && tar czf $OUT/f2.tgz fp fp.md fp.log 2>/dev/null); true
  ;;
faults4)
  s=$SECONDS
  timeout 380 $B/xtask gpu-test --from-bundle $B --faults --worlds 4 --modes processes --timeout 375 --faults-report /tmp/fp.md --out /tmp/fp > /tmp/fp.log 2>&1
  echo "faults processes rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h '^|' /tmp/fp.md | cut -d'|' -f2-7 >> $L
  s=$SECONDS; left=$((590-SECONDS)); [ $left -lt 60 ] && left=60
  timeout $left $B/xtask gpu-test --from-bundle $B --faults --worlds 4 --modes threads --timeout $((left-5)) --faults-report /tmp/ft.md --out /tmp/ft > /tmp/ft.log 2>&1
  echo "faults threads rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L; grep -h '^|' /tmp/ft.md | cut -d'|' -f2-7 >> $L
  (cd /tmp && tar czf $OUT/f4.tgz fp fp.md fp.log ft ft.md ft.log 2>/dev/null); true
  ;;
esac
done
