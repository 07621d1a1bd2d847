// One-shot all-reduce (sum) over an NCCL symmetric window, for nccl-safe's
// `SymmetricBuffer` (see `src/one_shot.rs` for the host side and
// `docs/architecture.md`, "Small messages", for why it exists).
//
// Every rank's input is a window registered with NCCL_WIN_COLL_SYMMETRIC:
// NCCL maps every rank's window of the LSA team (here: every rank of the
// communicator, checked when the buffer is made) into each rank's address
// space at `flat + lsa_rank * stride`. Behind the caller's elements each
// window holds a `Pad`, the flags this kernel signals through.
//
// Each block b, on every rank, owns the same vectors of the buffer:
//   1. arrive: it tells every peer's block b that this rank's input is
//      ready (the work before the kernel on this stream is complete), and
//      waits until every peer's block b said the same (on two ranks it
//      loads its own vectors first, so their reads overlap the wait);
//   2. it reads its vectors from every rank's window, adds them in rank
//      order (every rank gets the same bits), accumulating in f32; out of
//      place it stores the results now, in place it keeps them in
//      registers;
//   3. depart: it tells every peer's block b that it has read their input,
//      and waits for the same from every peer: after that no peer reads
//      this rank's input again, so it may be overwritten (in place here,
//      by the caller's next work otherwise);
//   4. in place, it stores its results.
// Flags carry a per-block epoch, so they never need resetting; they are
// relaxed stores and loads at system scope (no fences but in the `_rel`
// builds: see ld_flag). A wait
// polls, every 256 polls, the host-mapped abort word (set when the
// communicator is aborted) and the global timer (the communicator's
// timeout): either ends the kernel early with `status` set, the result
// undefined; the host then refuses the buffer's fast path and reports it.
//
// Built to PTX by `cargo xtask kernels` (NVRTC, pinned), for compute_80
// (one_shot.ptx) and compute_90 (one_shot_90.ptx, with the launch
// dependency wait), each also with ONE_SHOT_RELEASE (one_shot_rel.ptx,
// one_shot_90_rel.ptx); all committed and JIT-compiled by the driver at
// run time, one of them per process and device.

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

#define MAX_RANKS 8
#define MAX_BLOCKS 128
#define THREADS 512
#define VMAX 8

struct Pad {
  u32 epoch[MAX_BLOCKS];
  u32 arrive[MAX_BLOCKS][MAX_RANKS];
  u32 depart[MAX_BLOCKS][MAX_RANKS];
};

// Flags are relaxed: what a flag announces is ordered without fences.
// Arrive announces input written by work that ended before this kernel
// began (visible to peers' reads, which the owner's L2 serves); depart
// announces that this block's reads of the peers' inputs returned (their
// values were added and stored in registers before the block's barrier).
// That rests on how the hardware performs loads, not on the PTX memory
// model's letter. REL (the `_rel` builds, chosen on the host by
// NCCL_RS_ONE_SHOT_FLAGS=release, to measure what the model's form costs):
// a signal is a release store at system scope and a wait ends with an
// acquire fence, in the signalling threads only (bar.sync orders the
// block's other threads around them).
__device__ __forceinline__ u32 ld_flag(const u32* p) {
  u32 v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <bool REL>
__device__ __forceinline__ void st_flag(u32* p, u32 v) {
  if (REL) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
  } else {
    asm volatile("st.relaxed.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
  }
}

__device__ __forceinline__ u32 ld_volatile(const u32* p) {
  u32 v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ u64 now_ns() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

struct Args {
  u64 flat;      // rank 0's mapping of the input window
  u64 stride;    // bytes between two ranks' mappings
  u64 pad;       // the Pad's offset in the window
  u64 out;       // this rank's output (may be its own input: in place)
  u64 count;     // elements
  u64 abort;     // host-mapped u32: non-zero once the communicator aborted
  u64 status;    // host-mapped u32: set to 1 (aborted) or 2 (timed out)
  u64 timeout;   // ns a wait may last
  u32 rank;
  u32 nranks;
  u32 in_place;
};

// Waits until *flag reaches epoch; false when aborted or out of time.
template <bool REL>
__device__ bool wait_for(const u32* flag, u32 epoch, const Args& a) {
  u64 start = 0;
  u32 polls = 0;
  while ((int)(ld_flag(flag) - epoch) < 0) {
    if (++polls & 255) continue;
    if (ld_volatile((const u32*)a.abort) != 0) {
      *(volatile u32*)a.status = 1;
      return false;
    }
    u64 t = now_ns();
    if (start == 0) {
      start = t;
    } else if (t - start > a.timeout) {
      *(volatile u32*)a.status = 2;
      return false;
    }
  }
  if (REL) asm volatile("fence.acq_rel.sys;" ::: "memory");
  return true;
}

// Signals `which` (0 arrive, 1 depart) of this block to every peer and
// waits for theirs. Every thread of the block calls it; the answer is the
// same on every thread.
template <bool REL>
__device__ bool barrier(const Args& a, u32 epoch, int which) {
  __shared__ int failed;
  const int b = blockIdx.x;
  const int t = threadIdx.x;
  if (t == 0) failed = 0;
  __syncthreads();
  if (t < a.nranks && t != a.rank) {
    Pad* theirs = (Pad*)(a.flat + t * a.stride + a.pad);
    Pad* mine = (Pad*)(a.flat + a.rank * a.stride + a.pad);
    u32* to = which == 0 ? &theirs->arrive[b][a.rank] : &theirs->depart[b][a.rank];
    const u32* from = which == 0 ? &mine->arrive[b][t] : &mine->depart[b][t];
    st_flag<REL>(to, epoch);
    if (!wait_for<REL>(from, epoch, a)) failed = 1;
  }
  __syncthreads();
  return failed == 0;
}

// Element types: 16-byte vectors of E elements, added in f32.
struct F32 {
  enum { E = 4 };
  typedef float T;
  __device__ static float get(const uint4& v, int i) {
    return __uint_as_float(i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w);
  }
  __device__ static void put(uint4& v, int i, float x) {
    u32 u = __float_as_uint(x);
    if (i == 0) v.x = u; else if (i == 1) v.y = u; else if (i == 2) v.z = u; else v.w = u;
  }
  __device__ static float scalar(const void* p) { return *(const float*)p; }
  __device__ static void store(void* p, float x) { *(float*)p = x; }
};

__device__ __forceinline__ u32 half_of(const uint4& v, int i) {
  u32 w = (i >> 1) == 0 ? v.x : (i >> 1) == 1 ? v.y : (i >> 1) == 2 ? v.z : v.w;
  return (i & 1) ? (w >> 16) : (w & 0xffff);
}

__device__ __forceinline__ void set_half(uint4& v, int i, u32 h) {
  u32* w = (i >> 1) == 0 ? &v.x : (i >> 1) == 1 ? &v.y : (i >> 1) == 2 ? &v.z : &v.w;
  *w = (i & 1) ? ((*w & 0xffffu) | (h << 16)) : ((*w & 0xffff0000u) | h);
}

struct BF16 {
  enum { E = 8 };
  __device__ static float cvt(u32 h) { return __uint_as_float(h << 16); }
  __device__ static u32 back(float x) {
    u16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
  }
  __device__ static float get(const uint4& v, int i) { return cvt(half_of(v, i)); }
  __device__ static void put(uint4& v, int i, float x) { set_half(v, i, back(x)); }
  __device__ static float scalar(const void* p) { return cvt(*(const u16*)p); }
  __device__ static void store(void* p, float x) { *(u16*)p = (u16)back(x); }
};

struct F16 {
  enum { E = 8 };
  __device__ static float cvt(u32 h) {
    float f;
    u16 s = (u16)h;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(s));
    return f;
  }
  __device__ static u32 back(float x) {
    u16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x));
    return r;
  }
  __device__ static float get(const uint4& v, int i) { return cvt(half_of(v, i)); }
  __device__ static void put(uint4& v, int i, float x) { set_half(v, i, back(x)); }
  __device__ static float scalar(const void* p) { return cvt(*(const u16*)p); }
  __device__ static void store(void* p, float x) { *(u16*)p = (u16)back(x); }
};

// TWO: the kernel for exactly two ranks. It loads its own vectors before
// the arrive barrier (they are ready: written by earlier work on this
// stream) and the peer's after it, all in flight together; the sum of two
// is the same bits in either order. Otherwise any rank count, one rank's
// vectors loaded at a time and added in rank order from rank 0's value
// (every rank gets the same bits; -0 + -0 stays -0, as NCCL's).
// Accumulation is in f32.
template <typename D, bool TWO, bool REL>
__device__ void one_shot(const Args& a) {
  const int b = blockIdx.x;
  const u64 threads = (u64)gridDim.x * THREADS;
  const u64 me = (u64)b * THREADS + threadIdx.x;
  const u64 nvec = a.count / D::E;
  const u64 tail = a.count - nvec * D::E;
  const u64 elem = 16 / D::E;
  Pad* mine = (Pad*)(a.flat + a.rank * a.stride + a.pad);

#if __CUDA_ARCH__ >= 900
  // Launched with programmatic stream serialisation (Hopper on), this grid
  // may start once every block of the kernel before it on the stream has
  // exited, before that kernel completed: wait until it is complete and
  // its memory visible. A no-op when the launch was a plain one.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif

  __shared__ u32 epoch;
  if (threadIdx.x == 0) epoch = mine->epoch[b] + 1;
  __syncthreads();
  const u32 e = epoch;

  uint4 sum[VMAX];
  if (TWO) {
    const uint4* own = (const uint4*)(a.flat + a.rank * a.stride);
    const uint4* peer = (const uint4*)(a.flat + (a.rank ^ 1) * a.stride);
#pragma unroll
    for (int v = 0; v < VMAX; ++v) {
      const u64 i = me + v * threads;
      if (i < nvec) sum[v] = own[i];
    }
    if (!barrier<REL>(a, e, 0)) return;
    uint4 x[VMAX];
#pragma unroll
    for (int v = 0; v < VMAX; ++v) {
      const u64 i = me + v * threads;
      if (i < nvec) x[v] = peer[i];
    }
#pragma unroll
    for (int v = 0; v < VMAX; ++v) {
      if (me + v * threads < nvec) {
#pragma unroll
        for (int k = 0; k < D::E; ++k) D::put(sum[v], k, D::get(sum[v], k) + D::get(x[v], k));
      }
    }
  } else {
    if (!barrier<REL>(a, e, 0)) return;
    float acc[VMAX][D::E];
#pragma unroll
    for (int v = 0; v < VMAX; ++v)
#pragma unroll
      for (int k = 0; k < D::E; ++k) acc[v][k] = 0.0f;
    for (u32 r = 0; r < a.nranks; ++r) {
      const uint4* in = (const uint4*)(a.flat + r * a.stride);
      uint4 x[VMAX];
#pragma unroll
      for (int v = 0; v < VMAX; ++v) {
        const u64 i = me + v * threads;
        if (i < nvec) x[v] = in[i];
      }
#pragma unroll
      for (int v = 0; v < VMAX; ++v) {
        if (me + v * threads < nvec) {
#pragma unroll
          for (int k = 0; k < D::E; ++k) acc[v][k] = r == 0 ? D::get(x[v], k) : acc[v][k] + D::get(x[v], k);
        }
      }
    }
#pragma unroll
    for (int v = 0; v < VMAX; ++v)
      if (me + v * threads < nvec)
#pragma unroll
        for (int k = 0; k < D::E; ++k) D::put(sum[v], k, acc[v][k]);
  }
  if (!a.in_place) {
#pragma unroll
    for (int v = 0; v < VMAX; ++v) {
      const u64 i = me + v * threads;
      if (i < nvec) ((uint4*)a.out)[i] = sum[v];
    }
  }
  // The last elements (fewer than a vector): block 0, one per thread.
  float last = 0.0f;
  const bool has_last = b == 0 && threadIdx.x < tail;
  const u64 j = nvec * D::E + threadIdx.x;
  if (has_last) {
    for (u32 r = 0; r < a.nranks; ++r) {
      const float y = D::scalar((const char*)(a.flat + r * a.stride) + j * elem);
      last = r == 0 ? y : last + y;
    }
    if (!a.in_place) D::store((char*)a.out + j * elem, last);
  }

  if (!barrier<REL>(a, e, 1)) return;

  if (a.in_place) {
#pragma unroll
    for (int v = 0; v < VMAX; ++v) {
      const u64 i = me + v * threads;
      if (i < nvec) ((uint4*)a.out)[i] = sum[v];
    }
    if (has_last) D::store((char*)a.out + j * elem, last);
  }
  if (threadIdx.x == 0) mine->epoch[b] = e;
}

// The entries: relaxed flags, or with ONE_SHOT_RELEASE defined (the
// `_rel` builds) the PTX memory model's form, named with `_rel`.
#ifdef ONE_SHOT_RELEASE
#define FLAGS true
#define ENTRY(name) name##_rel
#else
#define FLAGS false
#define ENTRY(name) name
#endif
#define ONE_SHOT_ENTRY(name, D, TWO) \
  extern "C" __global__ void __launch_bounds__(THREADS) ENTRY(name)(Args a) { one_shot<D, TWO, FLAGS>(a); }
ONE_SHOT_ENTRY(one_shot_f32, F32, false)
ONE_SHOT_ENTRY(one_shot_bf16, BF16, false)
ONE_SHOT_ENTRY(one_shot_f16, F16, false)
ONE_SHOT_ENTRY(one_shot_f32_2, F32, true)
ONE_SHOT_ENTRY(one_shot_bf16_2, BF16, true)
ONE_SHOT_ENTRY(one_shot_f16_2, F16, true)
