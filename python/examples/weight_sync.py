"""Weight sync, PyTorch side: rank 0 broadcasts a model's bf16 parameters
to Rust inference ranks (crates/nccl-dist/examples/weight_sync.rs), then
every rank all_reduces per-tensor checksums (max and min): equal means
bit-exact copies everywhere.

    NCCL_RS_SECRET=... python python/examples/weight_sync.py --world 2 --port 29555
    NCCL_RS_SECRET=... weight_sync join 127.0.0.1:29555 1 2

The unique id is made by CuPy's libnccl and handed to the Rust ranks by
nccl_rs.Server (authenticated, encrypted); the communicator is CuPy's
NcclCommunicator working on the tensors' memory (tensor.data_ptr()).
Rust must load the same libnccl as CuPy: NCCL_LIBRARY at the
nvidia-nccl wheel of this environment (docs/python.md).
"""

import argparse
import os
import time

import cupy
import torch
from cupy.cuda import nccl

import nccl_rs

ROUNDS = 5
NCCL_BFLOAT16 = getattr(nccl, "NCCL_BFLOAT16", 9)  # ncclBfloat16


class Model(torch.nn.Module):
    """An embedding, then per layer a norm, qkv, o, up and down: the same
    list of sizes as weight_sync.rs's `layout()`."""

    def __init__(self, vocab=32000, hidden=2048, ffn=5504, layers=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            layer = torch.nn.Module()
            layer.norm = torch.nn.Parameter(torch.ones(hidden))
            layer.qkv = torch.nn.Linear(hidden, 3 * hidden, bias=False)
            layer.o = torch.nn.Linear(hidden, hidden, bias=False)
            layer.up = torch.nn.Linear(hidden, ffn, bias=False)
            layer.down = torch.nn.Linear(ffn, hidden, bias=False)
            self.layers.append(layer)

    def tensors(self):
        out = [self.embed.weight]
        for l in self.layers:
            out += [l.norm, l.qkv.weight, l.o.weight, l.up.weight, l.down.weight]
        return [t.data for t in out]


def checksum(t):
    """Position-weighted sum of the bf16 bit patterns, wrapping at 2**64
    (weight_sync.rs computes the same)."""
    bits = t.reshape(-1).view(torch.int16).to(torch.int64) & 0xFFFF
    weights = torch.arange(1, bits.numel() + 1, device=t.device, dtype=torch.int64)
    return (bits * weights).sum()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300.0)
    a = p.parse_args()
    torch.cuda.set_device(a.device)
    cupy.cuda.Device(a.device).use()
    torch.manual_seed(0)
    params = Model().to(device="cuda", dtype=torch.bfloat16).tensors()
    nbytes = sum(t.numel() * t.element_size() for t in params)

    secret = os.environb[b"NCCL_RS_SECRET"]
    srv = nccl_rs.Server(a.world, secret, port=a.port, unique_id=nccl.get_unique_id())
    uid, rank, size = srv.wait(timeout=a.timeout)
    comm = nccl.NcclCommunicator(size, nccl_rs.unique_id_to_cupy(uid), rank)
    stream = torch.cuda.current_stream()
    sptr = stream.cuda_stream

    tick = torch.ones(1, dtype=torch.int64, device="cuda")
    best = float("inf")
    for _ in range(ROUNDS):
        comm.allReduce(tick.data_ptr(), tick.data_ptr(), 1, nccl.NCCL_UINT64, nccl.NCCL_SUM, sptr)
        stream.synchronize()
        started = time.perf_counter()
        for t in params:
            comm.broadcast(t.data_ptr(), t.data_ptr(), t.numel(), NCCL_BFLOAT16, 0, sptr)
        stream.synchronize()
        best = min(best, time.perf_counter() - started)

    sums = torch.stack([checksum(t) for t in params])
    hi, lo = sums.clone(), sums.clone()
    comm.allReduce(hi.data_ptr(), hi.data_ptr(), hi.numel(), nccl.NCCL_UINT64, nccl.NCCL_MAX, sptr)
    comm.allReduce(lo.data_ptr(), lo.data_ptr(), lo.numel(), nccl.NCCL_UINT64, nccl.NCCL_MIN, sptr)
    stream.synchronize()
    print(f"rank 0/{size} (PyTorch {torch.__version__}, CuPy {cupy.__version__}): broadcast of "
          f"{len(params)} tensors ({nbytes // 10**6} MB) in {best * 1e3:.2f} ms "
          f"(best of {ROUNDS}): {nbytes / best / 1e9:.1f} GB/s", flush=True)
    if not (torch.equal(hi, lo) and torch.equal(hi, sums)):
        raise SystemExit("checksums differ between ranks")
    print(f"proved: every rank holds bit-exact copies of rank 0's {len(params)} tensors")
    comm.destroy()


if __name__ == "__main__":
    main()
