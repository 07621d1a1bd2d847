"""CuPy ranks and Rust ranks in one all_reduce.

    NCCL_RS_SECRET=... python python/examples/cupy_allreduce.py --world 3 --cupy-ranks 2 --port 29556
    NCCL_RS_SECRET=... weight_sync join 127.0.0.1:29556 2 3 --all-reduce

CuPy rank 0 serves the id (nccl_rs.Server), CuPy ranks 1.. join it on
threads of this process (nccl_rs.join, one GPU each); the Rust ranks join
with `weight_sync join ... --all-reduce`. Every rank contributes rank + 1
in every element of a float32 buffer; all see n (n + 1) / 2.
"""

import argparse
import os
import threading

import cupy
from cupy.cuda import nccl

import nccl_rs

ELEMENTS = 1 << 24


def rank_main(rank, size, uid, out):
    with cupy.cuda.Device(rank):
        comm = nccl.NcclCommunicator(size, nccl_rs.unique_id_to_cupy(uid), rank)
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            # Filled on the stream the all-reduce runs on (a non-blocking
            # stream does not wait for the null stream).
            buf = cupy.full(ELEMENTS, rank + 1, dtype=cupy.float32)
        comm.allReduce(buf.data.ptr, buf.data.ptr, ELEMENTS, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
        stream.synchronize()
        want = size * (size + 1) / 2
        out[rank] = int((buf != want).sum())
        comm.destroy()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--cupy-ranks", type=int, default=1)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--timeout", type=float, default=300.0)
    a = p.parse_args()
    secret = os.environb[b"NCCL_RS_SECRET"]
    with cupy.cuda.Device(0):
        srv = nccl_rs.Server(a.world, secret, port=a.port, unique_id=nccl.get_unique_id())
    addr = f"127.0.0.1:{srv.port}"
    ids = {}

    def joiner(r):
        ids[r] = nccl_rs.join(addr, r, a.world, secret, timeout=a.timeout)[0]

    joiners = [threading.Thread(target=joiner, args=(r,)) for r in range(1, a.cupy_ranks)]
    for t in joiners:
        t.start()
    ids[0] = srv.wait(timeout=a.timeout)[0]
    for t in joiners:
        t.join()
    wrong = {}
    ranks = [threading.Thread(target=rank_main, args=(r, a.world, ids[r], wrong)) for r in range(a.cupy_ranks)]
    for t in ranks:
        t.start()
    for t in ranks:
        t.join()
    print(f"CuPy ranks 0..{a.cupy_ranks - 1} of {a.world}: wrong elements {wrong}", flush=True)
    if len(wrong) != a.cupy_ranks or any(wrong.values()):
        raise SystemExit("the all_reduce gave wrong elements (or a rank failed)")
    print(f"proved: CuPy and Rust ranks summed {ELEMENTS} float32 elements in one all_reduce")


if __name__ == "__main__":
    main()
