#!/bin/bash
# Session 21. Build: `cargo xtask gpu-test --bundle bundle`, plus bundle/nccl-bench-old (the release-lto bench of
# the commit before the cold split, stripped); copy this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`;
# run `tar xJf bundle-cx/d.tar.xz && bash bundle/s21.sh WHAT` with carry ["bundle-cx"].
# ab (about 420 s, 2 GPUs): the step, old against new bench, interleaved, 6 runs of each per mode; a latency run of
#   each per mode; then the fault suite in threads mode.
# matrix [SECONDS] (about 340 s): the GPU matrix, every target and mode, cut at SECONDS (default 580).
# bench (about 560 s): every bench phase with PyTorch, then the quick sweep with what is left.
# faults2p (about 250 s, 2 GPUs): the fault suite, processes.
# final [SECONDS] (2 GPUs): the recover phase, fault cases a, n, g (processes) and h, s1 (threads), then nccl-safe's
#   abort tests with what is left of SECONDS (default 300).
# faults4 (about 460 s, 4 GPUs): the fault suite, processes then threads.
export NCCL_NVLS_ENABLE=0
B=bundle; L=$OUT/all.log; R=/tmp/r; mkdir -p $R
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
case "$1" in
ab)
  A="--step --step-raw-mesh -n 500 -w 50 --rounds 21 -q"
  for rep in 1 2 3 4 5 6; do
    for mode in threads processes; do
      if [ $((rep % 2)) = 1 ]; then order="old new"; else order="new old"; fi
      for v in $order; do
        bin=nccl-bench; [ $v = old ] && bin=nccl-bench-old
        one step-$mode-$v-$rep $bin $mode $A
        python3 -c "import json,sys,statistics as st;d=json.load(open(sys.argv[1]))['step'];D,R,M=d['default_rounds_us'],d['raw_rounds_us'],d['raw_mesh_rounds_us'];print('  paired over_raw %.3f ours %+.2f; default %.1f raw %.1f raw_mesh %.1f' % (st.median([a/b for a,b in zip(D,R)]), st.median([a-b for a,b in zip(D,M)]), d['default_us'], d['raw_us'], d['raw_mesh_us']))" $R/step-$mode-$v-$rep.json >> $L 2>&1
      done
    done
  done
  for mode in threads processes; do
    for v in old new; do
      bin=nccl-bench; [ $v = old ] && bin=nccl-bench-old
      one lat-$mode-$v $bin $mode -b 8 -e 1K -f 2 --ops all_reduce,broadcast,send_recv -n 1000 -w 100 --rounds 11 --layers raw,safe,dist
    done
  done
  s=$SECONDS; left=$((590-SECONDS)); [ $left -lt 60 ] && left=60
  timeout $left $B/xtask gpu-test --from-bundle $B --faults --worlds 2 --modes threads --timeout $((left-5)) --faults-report /tmp/ft.md --out /tmp/ft > /tmp/ft.log 2>&1
  echo "faults threads rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L; grep -h '^|' /tmp/ft.md | cut -d'|' -f2-7 >> $L
  cd /tmp && tar czf $OUT/ab.tgz r ft ft.md ft.log 2>/dev/null; true
  ;;
matrix)
  s=$SECONDS
  lim=${2:-580}
  timeout $lim $B/xtask gpu-test --from-bundle $B --worlds 2 --out /tmp/m > /tmp/m.log 2>&1
  echo "matrix rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h -i 'pass\|fail' /tmp/m.log | tail -60 | cut -c1-300 >> $L
  cd /tmp && tar czf $OUT/m.tgz m m.log 2>/dev/null; true
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
  cd /tmp && tar czf $OUT/b.tgz b b.log s s.log 2>/dev/null; true
  ;;
faults2p)
  s=$SECONDS
  timeout 500 $B/xtask gpu-test --from-bundle $B --faults --worlds 2 --modes processes --timeout 495 --faults-report /tmp/fp.md --out /tmp/fp > /tmp/fp.log 2>&1
  echo "faults processes rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h '^|' /tmp/fp.md | cut -d'|' -f2-7 >> $L
  cd /tmp && tar czf $OUT/f2.tgz fp fp.md fp.log 2>/dev/null; true
  ;;
final)
  s=$SECONDS
  timeout 150 $B/xtask bench --from-bundle $B --phases recover --quick --timeout 145 --out /tmp/rc > /tmp/rc.log 2>&1
  echo "recover rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "recover" /tmp/rc/report.md | grep "^| \`" >> $L
  s=$SECONDS
  timeout 90 $B/xtask gpu-test --from-bundle $B --faults --worlds 2 --modes processes --filter a_sigkill,n_recover,g_kill --timeout 85 --faults-report /tmp/fq.md --out /tmp/fq > /tmp/fq.log 2>&1
  echo "faults processes a,n,g rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h '^| 2' /tmp/fq.md | cut -d'|' -f3,7,10,13 | cut -c1-300 >> $L
  s=$SECONDS
  timeout 60 $B/xtask gpu-test --from-bundle $B --faults --worlds 2 --modes threads --filter h_thread,s1_silent --timeout 55 --faults-report /tmp/fh.md --out /tmp/fh > /tmp/fh.log 2>&1
  echo "faults threads h,s1 rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h '^| 2' /tmp/fh.md | cut -d'|' -f3,7,10,13 | cut -c1-300 >> $L
  left=$((${2:-300}-SECONDS))
  if [ $left -gt 30 ]; then
    s=$SECONDS
    timeout $left $B/xtask gpu-test --from-bundle $B --worlds 2 --targets nccl-safe-abort --out /tmp/ma > /tmp/ma.log 2>&1
    echo "matrix nccl-safe-abort rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L; grep -h -i 'pass\|fail' /tmp/ma.log | tail -40 | cut -c1-300 >> $L
  fi
  cd /tmp && tar czf $OUT/final.tgz rc rc.log fq fq.md fq.log fh fh.md fh.log ma ma.log 2>/dev/null; true
  ;;
faults4)
  s=$SECONDS
  timeout 380 $B/xtask gpu-test --from-bundle $B --faults --worlds 4 --modes processes --timeout 375 --faults-report /tmp/fp.md --out /tmp/fp > /tmp/fp.log 2>&1
  echo "faults processes rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h '^|' /tmp/fp.md | cut -d'|' -f2-7 >> $L
  s=$SECONDS; left=$((590-SECONDS)); [ $left -lt 60 ] && left=60
  timeout $left $B/xtask gpu-test --from-bundle $B --faults --worlds 4 --modes threads --timeout $((left-5)) --faults-report /tmp/ft.md --out /tmp/ft > /tmp/ft.log 2>&1
  echo "faults threads rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L; grep -h '^|' /tmp/ft.md | cut -d'|' -f2-7 >> $L
  cd /tmp && tar czf $OUT/f4.tgz fp fp.md fp.log ft ft.md ft.log 2>/dev/null; true
  ;;
esac
