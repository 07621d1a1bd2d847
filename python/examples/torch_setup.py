"""PyTorch's side of `cargo xtask bench --python PATH`'s set-up phase.

Run under torchrun (a process per GPU), it times what the bench's
`--setup` times for nccl-rs, with PyTorch's own calls:

- world: `torch.distributed.init_process_group("nccl", device_id=...)`
  (the first rep from process start, later reps after
  `destroy_process_group`);
- mesh: `init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))`;
- first dp / first tp: a one-element all_reduce on each axis's group,
  then `torch.cuda.synchronize()`.

Each rep's times are the slowest rank's (an all_reduce MAX). Rank 0
writes them to `--json` in the bench's set-up format (mode "torch"), so
the report puts them beside nccl-rs's and the summary divides.

    torchrun --standalone --nproc-per-node 2 torch_setup.py --json setup-torch.json
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


def one_rep(rep, local_rank, started):
    device = torch.device("cuda", local_rank)
    t = started if rep == 0 else time.perf_counter()
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
    times = torch.tensor([world, mesh_ms, firsts[0], firsts[1]], device=device, dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    world, mesh_ms, first_dp, first_tp = times.tolist()
    dist.destroy_process_group()
    return {
        "rep": rep,
        "state": "cold" if rep == 0 else "warm",
        "world_ms": world,
        "mesh_ms": mesh_ms,
        "first_all_reduce_dp_ms": first_dp,
        "first_all_reduce_tp_ms": first_tp,
        "mesh_and_first_all_reduces_ms": mesh_ms + first_dp + first_tp,
    }, n, (dp, tp)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True, help="where rank 0 writes the results")
    p.add_argument("--reps", type=int, default=3, help="repetitions (the first is cold)")
    a = p.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    rows = []
    n, mesh = 0, (0, 0)
    for rep in range(a.reps):
        row, n, mesh = one_rep(rep, local_rank, T0)
        rows.append(row)
        print(f"torch setup rep {rep}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items() if k.endswith("_ms")), flush=True)
    if int(os.environ.get("RANK", "0")) == 0:
        doc = {
            "meta": {
                "setup": True,
                "mode": "torch",
                "ranks": n,
                "mesh": list(mesh),
                "torch": torch.__version__,
                "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
            },
            "setup": rows,
        }
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)


if __name__ == "__main__":
    main()
