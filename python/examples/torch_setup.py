"""PyTorch's side of `cargo xtask bench --python PATH`'s set-up phase.

Run under torchrun (a process per GPU), it times what the bench's
`--setup` times for nccl-rs, with PyTorch's own calls, one rep per
launch (`--rep N`; re-initialising in the same process after
`destroy_process_group` crashes some PyTorch versions, 2.11 among them):

- world: `torch.distributed.init_process_group("nccl", device_id=...)`;
  rep 0 (cold) from process start (imports and the CUDA context
  included), later reps (warm: the libraries in the page cache, the
  launcher warm) after making the CUDA context untimed (`set_device`, a
  tensor on the device, `synchronize`), as the bench's warm reps init a
  communicator in a process that already has its context;
- mesh: `init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))`;
- first dp / first tp: a one-element all_reduce on each axis's group,
  then `torch.cuda.synchronize()`.

The times are the slowest rank's (an all_reduce MAX). Rank 0 writes them
to `--json` in the bench's set-up format (mode "torch"): rep 0 makes the
file, later reps add their row to it (replacing a row of the same rep),
so the report puts them beside nccl-rs's and the summary divides. Three
reps, as `cargo xtask bench` runs them:

    for rep in 0 1 2; do
        torchrun --standalone --nproc-per-node 2 torch_setup.py --json setup-torch.json --rep $rep
    done
"""

import argparse
import json
import os
import time

T0 = time.perf_counter()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402


def ms(since):
    return (time.perf_counter() - since) * 1e3


def axes(n):
    tp = 2 if n % 2 == 0 else 1
    return n // tp, tp


def one_rep(rep, local_rank):
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    if rep == 0:
        t = T0
    else:
        # Warm: the CUDA context first, untimed.
        torch.ones(1, device=device)
        torch.cuda.synchronize(device)
        t = time.perf_counter()
    dist.init_process_group("nccl", device_id=device)
    world = ms(t)
    n = dist.get_world_size()
    dp, tp = axes(n)
    t = time.perf_counter()
    mesh = init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))
    mesh_ms = ms(t)
    firsts = []
    for name in ("dp", "tp"):
        t = time.perf_counter()
        x = torch.ones(1, device=device)
        dist.all_reduce(x, group=mesh[name].get_group())
        torch.cuda.synchronize(device)
        firsts.append(ms(t))
    # This rank's mesh + first calls, before the maximum: the slowest rank's
    # total, not the sum of each phase's slowest rank.
    total = mesh_ms + firsts[0] + firsts[1]
    times = torch.tensor([world, mesh_ms, firsts[0], firsts[1], total], device=device, dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    world, mesh_ms, first_dp, first_tp, total = times.tolist()
    dist.destroy_process_group()
    return {
        "rep": rep,
        "state": "cold" if rep == 0 else "warm",
        "world_ms": world,
        "mesh_ms": mesh_ms,
        "first_all_reduce_dp_ms": first_dp,
        "first_all_reduce_tp_ms": first_tp,
        "mesh_and_first_all_reduces_ms": total,
        "phase_maxima_sum_ms": mesh_ms + first_dp + first_tp,
    }, n, (dp, tp)


def write(path, rep, row, n, mesh):
    """Rep 0 makes the file; a later rep adds its row to it (or makes it,
    run alone), refusing one of another mode or size."""
    meta = {
        "setup": True,
        "mode": "torch",
        "ranks": n,
        "mesh": list(mesh),
        "torch": torch.__version__,
        "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
    }
    rows = []
    if rep > 0 and os.path.exists(path):
        with open(path) as f:
            doc = json.load(f)
        old = doc.get("meta", {})
        for key in ("mode", "ranks", "mesh"):
            if old.get(key) != meta[key]:
                raise SystemExit(f"{path}: {key} {old.get(key)!r}, this rep's is {meta[key]!r}")
        rows = [r for r in doc.get("setup", []) if r.get("rep") != rep]
    rows.append(row)
    rows.sort(key=lambda r: r["rep"])
    doc = {"meta": meta, "setup": rows}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="where rank 0 writes (rep 0) or adds (later reps) the results")
    p.add_argument("--rep", type=int, default=0, help="which rep this launch is (0: cold, makes --json)")
    a = p.parse_args()
    if a.rep < 0:
        p.error("--rep must be 0 or more")
    local_rank = int(os.environ["LOCAL_RANK"])
    row, n, mesh = one_rep(a.rep, local_rank)
    print(f"torch setup rep {a.rep}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items() if k.endswith("_ms")), flush=True)
    if int(os.environ.get("RANK", "0")) == 0:
        write(a.json, a.rep, row, n, mesh)


if __name__ == "__main__":
    main()
