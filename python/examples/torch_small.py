"""PyTorch's side of `cargo xtask bench --python PATH`'s small phase.

The all_reduce (sum) of small messages, the sizes and types of the
bench's `--small` (8 B to 16 MiB by x2 by default; f32 and bf16), under
torchrun (a process per GPU), three ways:

- `torch_nccl`: `dist.all_reduce` on a plain tensor (ProcessGroupNCCL);
- `torch_one_shot`: `torch.ops.symm_mem.one_shot_all_reduce` on a tensor
  from `symm_mem.empty`, rendezvoused on the world group;
- `torch_two_shot`: `torch.ops.symm_mem.two_shot_all_reduce_` (in place),
  likewise.

Timed as the bench times its own: the ranks meet, `--warmup` calls, then
`--iters` calls timed to the stream's end; `--rounds` rounds with the ways
interleaved, the median per way, the slowest rank (an all_reduce MAX of
the times). Each way's result is checked against the exact sum of
`rank + 1` (exact in both types); one-shot writes a new tensor, two-shot
and NCCL reduce in place, so their inputs are refilled before the check.
A way that PyTorch refuses for a size or type (on any rank: the ranks
agree after one probe call of each way) is recorded with `time_us` null
and its error. The calls are eager Python: at the smallest sizes the
per-call dispatch counts in PyTorch's times, as it does in a program;
`torch_nccl` and `torch_two_shot` reduce in place, `torch_one_shot` into a
new tensor, while the bench's own ways reduce out of place. Rank 0 writes `--json` in the bench's small format
(`small-torch.json`).

    torchrun --standalone --nproc-per-node 2 torch_small.py --json small-torch.json
"""

import argparse
import json
import os
import statistics
import time

# Before torch loads: no NVLink multicast, in NCCL or in PyTorch's
# symmetric memory (whose rendezvous would otherwise create multicast
# objects where the GPUs support them).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

WAYS = ("torch_nccl", "torch_one_shot", "torch_two_shot")


def sizes(lo, hi):
    b = lo
    while b <= hi:
        yield b
        b *= 2


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", required=True)
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=16 << 20)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    import torch.distributed._symmetric_memory as symm_mem

    # The CUDA backend (P2P over NVLink, the one whose one-shot and
    # two-shot kernels the issue measured), where the API can choose.
    if hasattr(symm_mem, "set_backend"):
        try:
            symm_mem.set_backend("CUDA")
        except Exception as e:  # noqa: BLE001 - the default backend stays
            print(f"torch small: symm_mem.set_backend('CUDA'): {e!r}", flush=True)

    n, rank = dist.get_world_size(), dist.get_rank()
    group = dist.group.WORLD.group_name
    rows = []
    for dtype, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        elem = torch.tensor([], dtype=dtype).element_size()
        for nbytes in sizes(max(a.min_bytes, elem), a.max_bytes):
            count = nbytes // elem
            want = float(n * (n + 1) // 2)
            plain = torch.full((count,), float(rank + 1), device=device, dtype=dtype)
            errors = {}
            try:
                symm = symm_mem.empty(count, device=device, dtype=dtype)
                symm_mem.rendezvous(symm, group)
                symm.fill_(float(rank + 1))
            except Exception as e:  # noqa: BLE001 - recorded, not fatal
                symm = None
                errors["torch_one_shot"] = errors["torch_two_shot"] = repr(e)

            def call(way):
                if way == "torch_nccl":
                    dist.all_reduce(plain)
                elif way == "torch_one_shot":
                    return torch.ops.symm_mem.one_shot_all_reduce(symm, "sum", group)
                else:
                    torch.ops.symm_mem.two_shot_all_reduce_(symm, "sum", group)
                return None

            # One probe call of each way, then the ranks agree on which
            # failed anywhere, so every rank runs the same collectives.
            failed = torch.zeros(len(WAYS), device=device, dtype=torch.int32)
            for i, way in enumerate(WAYS):
                if way in errors:
                    failed[i] = 1
                    continue
                try:
                    call(way)
                    torch.cuda.synchronize(device)
                except Exception as e:  # noqa: BLE001
                    errors[way] = repr(e)
                    failed[i] = 1
            dist.all_reduce(failed, op=dist.ReduceOp.MAX)
            for i, way in enumerate(WAYS):
                if failed[i].item() and way not in errors:
                    errors[way] = "failed on another rank"
            times = {w: [] for w in WAYS}
            for _ in range(a.rounds):
                for way in WAYS:
                    if way in errors:
                        continue
                    try:
                        for _ in range(a.warmup):
                            call(way)
                        torch.cuda.synchronize(device)
                        # The ranks start the timed calls together.
                        dist.barrier(device_ids=[local_rank])
                        t = time.perf_counter()
                        for _ in range(a.iters):
                            call(way)
                        torch.cuda.synchronize(device)
                        times[way].append((time.perf_counter() - t) * 1e6 / a.iters)
                    except Exception as e:  # noqa: BLE001
                        errors[way] = repr(e)
            # Checks: fresh inputs, one call each.
            wrong = {}
            for way in WAYS:
                if way in errors:
                    continue
                plain.fill_(float(rank + 1))
                if symm is not None:
                    symm.fill_(float(rank + 1))
                dist.barrier(device_ids=[local_rank])
                out = call(way)
                torch.cuda.synchronize(device)
                got = out if out is not None else (plain if way == "torch_nccl" else symm)
                wrong[way] = int((got.float() != want).sum().item())
            # The slowest rank's medians (NaN where a way failed).
            med = torch.tensor(
                [statistics.median(times[w]) if times[w] else float("nan") for w in WAYS],
                device=device,
                dtype=torch.float64,
            )
            dist.all_reduce(med, op=dist.ReduceOp.MAX)
            bad = torch.tensor([wrong.get(w, 0) for w in WAYS], device=device, dtype=torch.int64)
            dist.all_reduce(bad)
            for i, way in enumerate(WAYS):
                us = med[i].item()
                rows.append(
                    {
                        "dtype": name,
                        "bytes": nbytes,
                        "layer": way,
                        "coll": "all_reduce",
                        "time_us": None if us != us else us,
                        "wrong": int(bad[i].item()),
                        "error": errors.get(way),
                    }
                )
            if rank == 0:
                cells = " ".join(
                    f"{w} {r['time_us']:.2f}" if r["time_us"] is not None else f"{w} -"
                    for w, r in zip(WAYS, rows[-3:])
                )
                print(f"torch small {name} {nbytes} B: {cells}", flush=True)
    if rank == 0:
        doc = {
            "meta": {
                "small": True,
                "mode": "torch",
                "ranks": n,
                "torch": torch.__version__,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                "iters": a.iters,
                "warmup": a.warmup,
                "rounds": a.rounds,
            },
            "small": rows,
        }
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
