#!/bin/bash
# bind.sh MODE CMD...: runs CMD bound to CPUs picked for this rank's GPU (LOCAL_RANK, default 0).
# MODE: none | local (the GPU's local_cpulist) | remote (online CPUs not local) | local4 (4 local CPUs, rank-offset)
mode=$1; shift
r=${LOCAL_RANK:-0}
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader -i $r | tr 'A-F' 'a-f')
bus=${bus#0000}
cpus=$(python3 - "$mode" "$r" "/sys/bus/pci/devices/$bus/local_cpulist" <<'PY'
import sys
def expand(s):
    out=[]
    for part in s.strip().split(","):
        if "-" in part:
            a,b=part.split("-"); out+=range(int(a),int(b)+1)
        elif part: out.append(int(part))
    return out
mode,r,path=sys.argv[1],int(sys.argv[2]),sys.argv[3]
local=expand(open(path).read())
online=expand(open("/sys/devices/system/cpu/online").read())
if mode=="local": s=local
elif mode=="remote": s=[c for c in online if c not in local] or online
elif mode=="local4": s=local[4*r+2:4*r+6]
else: s=online
print(",".join(map(str,s)))
PY
)
echo "bind.sh rank $r gpu $bus mode $mode cpus $cpus" >&2
exec taskset -c "$cpus" "$@"
