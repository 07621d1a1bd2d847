"""PyTorch's side of `cargo xtask bench --python PATH`'s step phase.

The bench's training-like step (`crates/nccl-bench/src/step/mod.rs`) with
PyTorch's calls on a `DeviceMesh` of the same shape, run under torchrun
(a process per GPU), timed the way the bench times its own: `--iters`
steps after `--warmup`, `--rounds` rounds, the slowest rank's time per
step, the median over rounds. One step, on the current stream:

1. broadcast from tp rank 0, in place, tp, f32, 2 elements;
2. all_reduce sum, tp, bf16, 32768 (in place on its own buffer: PyTorch
   has no out-of-place all_reduce);
3. all_to_all_single, dp, bf16, 8192;
4. reduce_scatter_tensor sum, dp, bf16, 524288 in;
5. all_gather_into_tensor of 4's shard, dp, bf16;
6. a ring: batch_isend_irecv to dp+1 and from dp-1, f32, 1024;
7. all_reduce with PreMulSum(1/dp), dp, f32, 65536
   (`ReduceOp.AVG` where PyTorch has no PreMulSum);
8. all_reduce sum, dp, f32, 2.

The values are not checked (the in-place sums grow); the bench checks its
own sides bit for bit. Rank 0 writes `--json` (`torch-step.json`).

    torchrun --standalone --nproc-per-node 2 torch_step.py --json torch-step.json
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def axes(n):
    tp = 2 if n >= 4 and n % 2 == 0 else 1
    return n // tp, tp


def premul_average(dp):
    make = getattr(dist, "_make_nccl_premul_sum", None)
    if make is not None:
        return make(1.0 / dp), "PreMulSum(1/dp)"
    return dist.ReduceOp.AVG, "AVG"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True)
    p.add_argument("--iters", type=int, default=500)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--rounds", type=int, default=11)
    a = p.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    n = dist.get_world_size()
    dp, tp = axes(n)
    mesh = init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))
    g_dp, g_tp = mesh["dp"].get_group(), mesh["tp"].get_group()
    d = mesh.get_local_rank("dp")
    tp_root = dist.get_global_rank(g_tp, 0)
    nxt = dist.get_global_rank(g_dp, (d + 1) % dp)
    prv = dist.get_global_rank(g_dp, (d - 1) % dp)
    avg_op, avg_name = premul_average(dp)
    bf, f32 = torch.bfloat16, torch.float32
    # As the bench's step: the sizes rounded down to a multiple of dp.
    a2a = 8192 // dp * dp
    shard = 524288 // dp
    b = {
        "bcast": torch.ones(2, device=device, dtype=f32),
        "tp": torch.ones(32768, device=device, dtype=bf),
        "a2a_in": torch.ones(a2a, device=device, dtype=bf),
        "a2a_out": torch.empty(a2a, device=device, dtype=bf),
        "grad": torch.ones(shard * dp, device=device, dtype=bf),
        "shard": torch.empty(shard, device=device, dtype=bf),
        "gathered": torch.empty(shard * dp, device=device, dtype=bf),
        "ring_out": torch.ones(1024, device=device, dtype=f32),
        "ring_in": torch.empty(1024, device=device, dtype=f32),
        "avg": torch.ones(65536, device=device, dtype=f32),
        "loss": torch.ones(2, device=device, dtype=f32),
    }

    def step():
        dist.broadcast(b["bcast"], src=tp_root, group=g_tp)
        dist.all_reduce(b["tp"], group=g_tp)
        dist.all_to_all_single(b["a2a_out"], b["a2a_in"], group=g_dp)
        dist.reduce_scatter_tensor(b["shard"], b["grad"], group=g_dp)
        dist.all_gather_into_tensor(b["gathered"], b["shard"], group=g_dp)
        if dp > 1:
            ops = [
                dist.P2POp(dist.isend, b["ring_out"], nxt, g_dp),
                dist.P2POp(dist.irecv, b["ring_in"], prv, g_dp),
            ]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        dist.all_reduce(b["avg"], op=avg_op, group=g_dp)
        dist.all_reduce(b["loss"], group=g_dp)

    rounds = []
    for _ in range(a.rounds):
        for _ in range(a.warmup):
            step()
        torch.cuda.synchronize(device)
        dist.barrier()
        t = time.perf_counter()
        for _ in range(a.iters):
            step()
        torch.cuda.synchronize(device)
        per = torch.tensor([(time.perf_counter() - t) / a.iters * 1e6], device=device, dtype=torch.float64)
        dist.all_reduce(per, op=dist.ReduceOp.MAX)
        rounds.append(per.item())
    median = statistics.median(rounds)
    if dist.get_rank() == 0:
        print(f"torch step: {median:.2f} us (median of {len(rounds)} rounds), mesh {dp}x{tp}, average by {avg_name}", flush=True)
        doc = {
            "meta": {
                "step": True,
                "mode": "torch",
                "ranks": n,
                "mesh": {"dp": dp, "tp": tp},
                "torch": torch.__version__,
                "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()),
                "iters": a.iters,
                "warmup": a.warmup,
                "rounds": a.rounds,
                "average": avg_name,
            },
            "step": {"torch_us": median, "torch_rounds_us": rounds},
        }
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
