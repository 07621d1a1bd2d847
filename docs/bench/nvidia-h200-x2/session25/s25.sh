#!/bin/bash
# Session 25 (s24.sh plus `targets`, and a run counter in the fault tags). Build: `cargo xtask gpu-test --bundle bundle` (HEAD's code; it carries the release-lto bench); copy
# this script into bundle/, `tar cJf bundle-cx/d.tar.xz bundle`; run `tar xJf bundle-cx/d.tar.xz && bash
# bundle/s25.sh WHAT...` with carry ["bundle-cx"]. Several WHATs run one after the other; the call ends by 592 s.
# bench (about 480 s): every bench phase but the sweep, PyTorch beside ours.
# sweep CAP (about 125 s): the quick sweep (busbw, allocations), cut at CAP seconds.
# matrix: the GPU matrix at world 2, every target and mode, cut at what is left of the call.
# faults MODE CAP: the fault suite in one mode (processes about 255 s, threads about 145 s), cut at CAP.
# some MODE CAP CASES: the fault cases of one mode whose names contain any of CASES (comma-separated).
# targets NAMES CAP: the GPU matrix's targets NAMES (comma-separated bundle names) at world 2, every mode.
# WORLDS=4 (environment): the fault suite's world size (default 2).
# diag CAP: the bench's setup phase with PyTorch and NCCL's INIT log (NCCL_DEBUG=INFO): where a fresh process's
#   first communicator init goes, ours and PyTorch's (NCCL's "Init timings" lines). Not a report.
export NCCL_NVLS_ENABLE=0
B=bundle; L=$OUT/all.log; n=0
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a $L
left() { local l=$((592-SECONDS)); [ $l -gt $1 ] && l=$1; echo $l; }
while [ $# -gt 0 ]; do
what=$1; shift; s=$SECONDS
case "$what" in
bench)
  cap=$(left 540)
  timeout $cap $B/xtask bench --from-bundle $B --phases setup,step,graph,recover,async,latency,small --quick \
    --python python3 --timeout $((cap-5)) --out /tmp/b > /tmp/b.log 2>&1
  echo "bench rc=$? in $((SECONDS-s)) s" | tee -a $L; grep "^| \`" /tmp/b/report.md >> $L
  (cd /tmp && tar czf $OUT/b.tgz b b.log 2>/dev/null); true
  ;;
sweep)
  cap=$(left $1); shift
  timeout $cap $B/xtask bench --from-bundle $B --phases sweep --quick --timeout $((cap-5)) --out /tmp/s > /tmp/s.log 2>&1
  echo "sweep rc=$? in $((SECONDS-s)) s (limit $cap)" | tee -a $L; grep "^| \`" /tmp/s/report.md >> $L
  (cd /tmp && tar czf $OUT/s.tgz s s.log 2>/dev/null); true
  ;;
matrix)
  cap=$(left 590)
  timeout $cap $B/xtask gpu-test --from-bundle $B --worlds 2 --out /tmp/m > /tmp/m.log 2>&1
  echo "matrix rc=$? in $((SECONDS-s)) s (limit $cap)" | tee -a $L; grep -h 'xtask: \[' /tmp/m.log | tail -200 | cut -c1-200 >> $L
  (cd /tmp && tar czf $OUT/m.tgz m m.log 2>/dev/null); true
  ;;
targets)
  names=$1; cap=$(left $2); shift 2; n=$((n+1))
  timeout $cap $B/xtask gpu-test --from-bundle $B --worlds 2 --targets $names --out /tmp/t$n > /tmp/t$n.log 2>&1
  echo "targets $names rc=$? in $((SECONDS-s)) s (limit $cap)" | tee -a $L; grep -h 'xtask: \[' /tmp/t$n.log | tail -50 | cut -c1-200 >> $L
  (cd /tmp && tar czf $OUT/t$n.tgz t$n t$n.log 2>/dev/null); true
  ;;
faults|some)
  mode=$1; cap=$(left $2); shift 2; n=$((n+1)); tag=${mode:0:1}${WORLDS:-2}-$n; filter=
  if [ $what = some ]; then filter="--filter $1"; tag=${tag}x; shift; fi
  timeout $cap $B/xtask gpu-test --from-bundle $B --faults --worlds ${WORLDS:-2} --modes $mode --timeout $((cap-5)) \
    $filter --faults-report /tmp/f$tag.md --out /tmp/f$tag > /tmp/f$tag.log 2>&1
  echo "faults $mode rc=$? in $((SECONDS-s)) s (limit $cap)" | tee -a $L; grep -h '^|' /tmp/f$tag.md | cut -d'|' -f2-7 >> $L
  grep -h -o 'rebuilt_ms: [0-9; ]*' /tmp/f$tag.md | tr '\n' ' ' >> $L; echo >> $L
  (cd /tmp && tar czf $OUT/f$tag.tgz f$tag f$tag.md f$tag.log 2>/dev/null); true
  ;;
diag)
  cap=$(left $1); shift
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout $cap $B/xtask bench --from-bundle $B --phases setup --python python3 \
    --timeout $((cap-5)) --out /tmp/d > /tmp/d.log 2>&1
  echo "diag rc=$? in $((SECONDS-s)) s (limit $cap)" | tee -a $L
  grep -rh "Init timings\|NCCL version" /tmp/d /tmp/d.log | cut -c1-400 | head -200 >> $L
  (cd /tmp && tar czf $OUT/d.tgz d d.log 2>/dev/null); true
  ;;
esac
done
