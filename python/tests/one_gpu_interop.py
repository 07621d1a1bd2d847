"""On one GPU: the id forms nccl_rs hands out are the ones CuPy's NCCL
binding takes, and CuPy broadcasts PyTorch bf16 tensors with the dtype code
the weight-sync example uses.

Needs a GPU, PyTorch, CuPy and the nccl_rs wheel; NCCL_LIBRARY may name the
libnccl that CuPy loads (nccl_rs loads it for `new_unique_id`). The
two-GPU cases (`cargo xtask gpu-test --python`) need more GPUs than one;
this is what one GPU can prove. Prints `proved: ...` and exits 0, or fails.
"""

import sys

import cupy
import nccl_rs
import torch
from cupy.cuda import nccl

NCCL_BFLOAT16 = getattr(nccl, "NCCL_BFLOAT16", 9)


def main():
    # An id made by nccl_rs (our libnccl), in CuPy's form, opens a CuPy
    # communicator.
    ours = nccl_rs.new_unique_id()
    assert len(ours) == nccl_rs.UNIQUE_ID_BYTES
    comm = nccl.NcclCommunicator(1, nccl_rs.unique_id_to_cupy(ours), 0)
    # CuPy's own id round-trips through nccl_rs unchanged.
    theirs = nccl.get_unique_id()
    as_bytes = nccl_rs.unique_id_from_hex(nccl_rs.unique_id_hex(theirs))
    assert nccl_rs.unique_id_to_cupy(as_bytes) == theirs, "CuPy id changed"
    # A bf16 broadcast of a PyTorch tensor through CuPy's binding.
    src = torch.arange(1 << 20, device="cuda", dtype=torch.float32).to(torch.bfloat16)
    buf = src.clone()
    stream = torch.cuda.current_stream().cuda_stream
    comm.bcast(buf.data_ptr(), buf.numel(), NCCL_BFLOAT16, 0, stream)
    torch.cuda.synchronize()
    same = torch.equal(buf.view(torch.int16), src.view(torch.int16))
    assert same, "bf16 broadcast changed the bits"
    # And a sum of one rank: bf16 reductions accepted.
    comm.allReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(), NCCL_BFLOAT16,
                   nccl.NCCL_SUM, stream)
    torch.cuda.synchronize()
    assert torch.equal(buf.view(torch.int16), src.view(torch.int16))
    print(f"proved: nccl_rs ids open CuPy communicators, CuPy ids round-trip, "
          f"bf16 (code {NCCL_BFLOAT16}) broadcasts and reduces PyTorch tensors bit-exact; "
          f"cupy {cupy.__version__}, torch {torch.__version__}, "
          f"nccl {nccl.get_version()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
