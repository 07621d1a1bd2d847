#!/bin/bash
# Session 23. Build: `cargo xtask gpu-test --bundle bundle` (HEAD's code; it carries the release-lto bench); copy
# this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`; run `tar xJf bundle-cx/d.tar.xz && bash
# bundle/s23.sh WHAT...` with carry ["bundle-cx"]. Several WHATs run one after the other, each bounded so that
# the call ends within 600 s.
# recover (about 60 s, 2 GPUs): the bench's recover phase only (threads by shrink, threads giving up, three
#   launches with a process per GPU).
# faults MODE (processes about 260 s, threads about 145 s): the fault suite in one mode.
# some MODE CASES: the fault cases of one mode whose names contain any of CASES (comma-separated).
# WORLDS=4 (environment): the fault suite's world size (default 2).
# matrix (about 320 s): the GPU matrix, every target and mode, cut at MATRIX_LIMIT (default 580; call 3 reached it:
#   a new test ran into its 300 s limit).
# rest (about 60 s): the matrix's runs that call 3 did not reach, and the one it failed (its test since fixed).
# Calls: 1 `recover faults processes` (75728b6); 2 `faults processes faults threads` (10c8a4c); 3 `matrix` (10c8a4c, cut
#   at 580 s); 4 `recover some processes s2_,f1_,f2_,a_sigkill,n_recover some threads s2_,h_thread rest` (the final code);
#   5 (kind nvidia-h100-x4) `WORLDS=4 s23.sh some processes m_mesh,s2_,a_sigkill some threads s2_`.
# bench (about 560 s): every bench phase with PyTorch, then the quick sweep with what is left.
export NCCL_NVLS_ENABLE=0
B=bundle; MATRIX_LIMIT=${MATRIX_LIMIT:-580}; L=$OUT/all.log
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
faults() { # mode limit [filter]
  local mode=$1 cap=$2 s=$SECONDS tag=${1:0:1}${3:+x}
  local left=$((592-SECONDS)); [ $left -gt $cap ] && left=$cap
  timeout $left $B/xtask gpu-test --from-bundle $B --faults --worlds ${WORLDS:-2} --modes $mode --timeout $((left-5)) \
    ${3:+--filter $3} --faults-report /tmp/f$tag.md --out /tmp/f$tag > /tmp/f$tag.log 2>&1
  echo "faults $mode rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h '^|' /tmp/f$tag.md | cut -d'|' -f2-7 >> $L
  grep -h -o 'rebuilt_ms: [0-9; ]*' /tmp/f$tag.md | tr '\n' ' ' >> $L; echo >> $L
  (cd /tmp && tar czf $OUT/f$tag.tgz f$tag f$tag.md f$tag.log 2>/dev/null); true
}
while [ $# -gt 0 ]; do
what=$1; shift
case "$what" in
recover)
  s=$SECONDS
  timeout 200 $B/xtask bench --from-bundle $B --phases recover --timeout 195 --out /tmp/rc > /tmp/rc.log 2>&1
  echo "recover rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "recover" /tmp/rc/report.md | grep "^|" >> $L
  (cd /tmp && tar czf $OUT/rc.tgz rc rc.log 2>/dev/null); true
  ;;
faults)
  mode=$1; shift; cap=500; [ $mode = threads ] && cap=300
  faults $mode $cap
  ;;
some)
  # some MODE CASES: the fault cases whose names contain any of CASES (comma-separated).
  mode=$1; cases=$2; shift 2
  faults $mode 200 $cases
  ;;
matrix)
  s=$SECONDS
  timeout $MATRIX_LIMIT $B/xtask gpu-test --from-bundle $B --worlds 2 --out /tmp/m > /tmp/m.log 2>&1
  echo "matrix rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h -i 'pass\|fail' /tmp/m.log | tail -60 | cut -c1-300 >> $L
  (cd /tmp && tar czf $OUT/m.tgz m m.log 2>/dev/null); true
  ;;
rest)
  # The matrix's runs that call 3 did not reach or failed (its test fixed since).
  s=$SECONDS
  timeout 300 $B/xtask gpu-test --from-bundle $B --worlds 2 --filter a_kept_communicator,worlds_know_their_place,topology_,table_on_gpus --out /tmp/m2 > /tmp/m2.log 2>&1
  echo "matrix rest rc=$? in $((SECONDS-s)) s" | tee -a $L; grep -h 'xtask: \[' /tmp/m2.log | cut -c1-200 >> $L
  (cd /tmp && tar czf $OUT/m2.tgz m2 m2.log 2>/dev/null); true
  ;;
bench)
  s=$SECONDS
  timeout 460 $B/xtask bench --from-bundle $B --phases setup,step,graph,recover,async,latency,small --quick --python python3 --timeout 455 --out /tmp/b > /tmp/b.log 2>&1
  echo "bench rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "^| \`" /tmp/b/report.md >> $L
  left=$((585-SECONDS))
  if [ $left -gt 60 ]; then
    s=$SECONDS
    timeout $left $B/xtask bench --from-bundle $B --phases sweep --quick --timeout $((left-5)) --out /tmp/s > /tmp/s.log 2>&1
    echo "sweep rc=$? in $((SECONDS-s)) s (limit $left)" | tee -a $L
  fi
  (cd /tmp && tar czf $OUT/b.tgz b b.log s s.log 2>/dev/null); true
  ;;
esac
done
