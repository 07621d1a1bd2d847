//! Our own all-reduce for small symmetric buffers: a one-shot kernel
//! (`kernels/one_shot.cu`) that reads every rank's [`crate::SymmetricBuffer`]
//! through the mappings NCCL made when it registered the window, adds them
//! in rank order and writes the sum, with two flag barriers between the
//! ranks. NCCL's own path (symmetric kernels included) cost 6.7–14.7 µs
//! per eager call below 1 MiB on 2 H100s, much of it on the host; this one
//! is one kernel launch, 4.2–7.7 µs (`docs/architecture.md`, "Small
//! messages").
//!
//! - **Build**: the CUDA source is compiled to PTX by `cargo xtask
//!   kernels` (NVRTC, pinned) and the PTX is committed; the driver
//!   JIT-compiles it on first use (once per device and process). No nvcc or
//!   NVRTC is needed where the crate runs; a driver that cannot load it
//!   leaves NCCL's path in place.
//! - **Launch**: on compute capability 9 and later (driver 12.3 or later)
//!   the compute_90 build, whose kernels first wait on the launch
//!   dependency (`griddepcontrol.wait`; NCCL's own symmetric kernels do
//!   so again from 2.30.7, not in 2.28), is launched with the attributes NCCL gives
//!   those kernels: programmatic stream serialisation (the grid may be
//!   launched once every block of the kernel before it has exited,
//!   overlapping that kernel's completion; 1–5 µs less per eager call on
//!   2 H100s) and the remote memory-synchronisation domain. Exactly
//!   `NCCL_RS_ONE_SHOT_PDL=0`, read when a process first loads the
//!   kernels on a device, loads the compute_80 build and launches it
//!   plainly (no attributes); so does a compute_90 build the driver
//!   refuses. Two ranks take a form that loads its own vectors before
//!   the arrive barrier and the peer's after it.
//!   `NCCL_RS_ONE_SHOT_FLAGS=release` (read at the same time) takes the
//!   kernels whose flags follow the PTX memory model's form (below), to
//!   measure what it costs.
//! - **When**: a sum of f32, bf16 or f16 reading a
//!   [`crate::SymmetricBuffer`], of at most [`max_bytes`], on the buffer's
//!   own communicator and its stream, outside groups, into an output
//!   aligned to 16 bytes, eager or captured (captured above
//!   [`CAPTURED_NCCL_MAX_BYTES`] only: below it NCCL's symmetric kernels
//!   win once their host cost is gone), with NCCL 2.28 to 2.30 (the
//!   descriptor layout read below), on a communicator whose ranks NCCL
//!   mapped into one another (one LSA team, at most [`MAX_RANKS`]): agreed
//!   by every rank, with the buffers' lengths, when the buffers are made.
//!   The rest of the choice is made on each rank: the ranks must make a
//!   call alike (the same stream choice, group or not, output alignment,
//!   [`crate::SymmetricBuffer::set_one_shot`]), as NCCL asks of matching
//!   calls; ranks that differ wait for each other until the timeout.
//! - **Flags** are relaxed system-scope stores and loads, no fences: arrive
//!   announces input that work before the kernel wrote (complete when it
//!   started), depart that the block's loads returned (their values were
//!   added before the block's barrier). That rests on how the hardware
//!   performs loads and launches, not on the PTX memory model's letter
//!   (where nothing stops ptxas moving the adds, and with them the loads'
//!   completion, past the block's barrier). The model's form, a release
//!   store and an acquire fence in the signalling threads alone, is built
//!   too (the `_rel` entries, `NCCL_RS_ONE_SHOT_FLAGS=release`). It passes
//!   the same GPU tests, but on 2 H100s an eager bf16 call took 10.5–11.5
//!   µs instead of 4.2–4.6 up to 64 KiB, 17.4–20.1 instead of 7.5 at 1 MiB
//!   and 28.3–28.6 instead of 19.0–21.7 at 4 MiB (one call, the forms
//!   taking turns), so the relaxed form stays the default (with fences in
//!   every barrier thread a small call took 14.5 µs).
//! - **Bounded**: each wait polls the communicator's abort (a host-mapped
//!   word set by every abort) and its timeout; either ends the kernel with
//!   its status word set, which `Comm::synchronize`, completion futures
//!   (`Comm::completion`) and the next launch report (the communicator is
//!   then aborted). A wait that bypasses them (cudarc's own stream
//!   synchronisation, a graph's settling) does not see it.
//! - **Occupancy**: up to 128 blocks of 512 threads, about one per SM on
//!   Hopper, spin in the barriers while a peer is late; other work on the
//!   GPU waits for SMs meanwhile (NCCL's kernels take 16–64 blocks).
//! - **Layout**: the window's device-side descriptor (`ncclWindow_vidmem`
//!   in NCCL's `nccl_device/impl/core__types.h`) starts with the same five
//!   fields from 2.28 to 2.30: the fast path needs one of those releases
//!   and checks what it reads (the world rank must be this rank's).

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, result, sys};

/// The PTX, built from `kernels/one_shot.cu` by `cargo xtask kernels`:
/// for compute_80, and for compute_90 (which waits on the launch
/// dependency, so it may be launched with programmatic serialisation).
pub(crate) const PTX: &str = include_str!("../kernels/one_shot.ptx");
pub(crate) const PTX_90: &str = include_str!("../kernels/one_shot_90.ptx");
/// The same two with the flags in the PTX memory model's form (entries
/// named `_rel`; `NCCL_RS_ONE_SHOT_FLAGS=release`).
pub(crate) const PTX_REL: &str = include_str!("../kernels/one_shot_rel.ptx");
pub(crate) const PTX_90_REL: &str = include_str!("../kernels/one_shot_90_rel.ptx");
/// The CUDA source it was built from (its hash is checked by a test).
#[cfg(test)]
pub(crate) const SOURCE: &str = include_str!("../kernels/one_shot.cu");

/// Ranks the kernel's flags have room for.
pub const MAX_RANKS: usize = 8;
const MAX_BLOCKS: u64 = 128;
const THREADS: u32 = 512;
/// The most [`max_bytes`] gives: within the grid's reach, blocks ×
/// threads × 16-byte vectors a thread keeps (`VMAX`, 8, in the source).
const LIMIT: usize = 4 << 20;
const _: () = assert!(LIMIT <= MAX_BLOCKS as usize * THREADS as usize * 8 * 16);
/// The kernel's flags (`Pad`: an epoch per block, arrive and depart flags
/// per block and rank), rounded up to a 4 KiB boundary.
pub(crate) const PAD_BYTES: usize = 16384;
const _: () = assert!(4 * (MAX_BLOCKS as usize) * (1 + 2 * MAX_RANKS) <= PAD_BYTES);

/// The largest all-reduce (bytes per rank) the kernel takes on `ranks`
/// ranks: 4 MiB on two (above it NCCL's symmetric kernels were as fast
/// on 2 H100s), 1 MiB on more, where each rank's reads grow with the
/// ranks (not measured yet: NCCL's path is kept above it). The grid
/// holds 8 MiB.
pub fn max_bytes(ranks: usize) -> usize {
    if ranks <= 2 { LIMIT } else { LIMIT / 4 }
}

/// Captured in a CUDA graph, an all-reduce of at most this many bytes
/// keeps NCCL's symmetric kernels: without their host cost they are the
/// faster there (3.7–4.9 µs against our 5.1–5.2 µs up to 64 KiB, 2 H100s;
/// ours from 128 KiB: 5.2 against 7.8).
pub const CAPTURED_NCCL_MAX_BYTES: usize = 64 << 10;

/// The kernel's argument (`Args` in the source): one value, by copy.
#[repr(C)]
#[derive(Clone, Copy)]
struct Args {
    flat: u64,
    stride: u64,
    pad: u64,
    out: u64,
    count: u64,
    abort: u64,
    status: u64,
    timeout: u64,
    rank: u32,
    nranks: u32,
    in_place: u32,
}

/// The kernels of one device, loaded once per process and kept.
pub(crate) struct Kernels {
    /// For any rank count: f32, bf16, f16.
    any: [sys::CUfunction; 3],
    /// For two ranks (every load issued before any add): the same order.
    two: [sys::CUfunction; 3],
    /// The compute_90 build ([`hopper_launch`]): launched with the
    /// attributes NCCL gives its symmetric kernels, programmatic stream
    /// serialisation (the grid may be launched once every block of the
    /// kernel before it on the stream has exited, overlapping that
    /// kernel's completion) and the remote memory-synchronisation domain;
    /// its kernels then wait for that completion (as NCCL's do from 2.30.7)
    /// (`griddepcontrol.wait`) before touching memory.
    hopper: bool,
    /// Keeps the context (and with it the module) alive.
    _ctx: Arc<CudaContext>,
}

// SAFETY: function handles of a module that is never unloaded, usable from
// any thread with their context current (the launch binds it).
unsafe impl Send for Kernels {}
// SAFETY: as above; nothing in it is mutated.
unsafe impl Sync for Kernels {}

/// Loaded kernels per device ordinal (`None`: the driver refused them).
static LOADED: Mutex<Vec<(usize, Option<&'static Kernels>)>> = Mutex::new(Vec::new());

/// The kernels for `ctx`'s device, loading them on first use.
pub(crate) fn kernels(ctx: &Arc<CudaContext>) -> Option<&'static Kernels> {
    let ordinal = ctx.ordinal();
    let mut loaded = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, k)) = loaded.iter().find(|(o, _)| *o == ordinal) {
        return *k;
    }
    let k = match load(ctx) {
        Ok(k) => Some(&*Box::leak(Box::new(k))),
        Err(e) => {
            tracing::warn!(device = ordinal, error = %e, "the one-shot kernels did not load: NCCL's path stays");
            None
        }
    };
    loaded.push((ordinal, k));
    k
}

/// The oldest driver the Hopper launch is used with (CUDA 12.3, where NCCL
/// starts launching its symmetric kernels so, and where captures record a
/// programmatic dependency as a graph edge). The committed PTX (ISA 8.4)
/// already needs 12.4 to load; this keeps the launch gated should the
/// pinned NVRTC ever change.
const HOPPER_LAUNCH_MIN_DRIVER: i32 = 12030;

/// Whether this process may launch the kernels on `ctx`'s device the
/// Hopper way: compute capability 9 or later, a driver of
/// [`HOPPER_LAUNCH_MIN_DRIVER`] or later, and `NCCL_RS_ONE_SHOT_PDL` not
/// `0`.
fn hopper_launch(ctx: &Arc<CudaContext>) -> bool {
    let mut driver = 0;
    // SAFETY: writes one int.
    let known = unsafe { sys::cuDriverGetVersion(&mut driver) } == sys::CUresult::CUDA_SUCCESS;
    known
        && driver >= HOPPER_LAUNCH_MIN_DRIVER
        && ctx.compute_capability().is_ok_and(|(major, _)| major >= 9)
        && std::env::var("NCCL_RS_ONE_SHOT_PDL").map_or(true, |v| v != "0")
}

/// Whether the kernels' flags are to be release stores and acquire
/// fences (`NCCL_RS_ONE_SHOT_FLAGS=release`, the PTX memory model's form,
/// there to be measured) rather than relaxed ones (the default).
fn release_flags() -> bool {
    std::env::var("NCCL_RS_ONE_SHOT_FLAGS").is_ok_and(|v| v == "release")
}

fn load(ctx: &Arc<CudaContext>) -> std::result::Result<Kernels, result::DriverError> {
    ctx.bind_to_thread()?;
    let release = release_flags();
    if hopper_launch(ctx) {
        let ptx = if release { PTX_90_REL } else { PTX_90 };
        match load_ptx(ctx, ptx, true, release) {
            Ok(k) => return Ok(k),
            Err(e) => tracing::warn!(
                device = ctx.ordinal(),
                error = %e,
                "the one-shot kernels' compute_90 build did not load: the compute_80 one, launched plainly"
            ),
        }
    }
    load_ptx(ctx, if release { PTX_REL } else { PTX }, false, release)
}

fn load_ptx(
    ctx: &Arc<CudaContext>,
    ptx: &str,
    hopper: bool,
    release: bool,
) -> std::result::Result<Kernels, result::DriverError> {
    let image = std::ffi::CString::new(ptx).expect("the PTX has no NUL byte");
    // SAFETY: a NUL-terminated PTX image; the module is never unloaded.
    let module = unsafe { result::module::load_data(image.as_ptr() as *const c_void) }?;
    let flags = if release { "_rel" } else { "" };
    let get = |ty: &str, form: &str| {
        let name = std::ffi::CString::new(format!("one_shot_{ty}{form}{flags}")).expect("no NUL");
        // SAFETY: the module just loaded; the name is one of its entries.
        unsafe { result::module::get_function(module, name) }
    };
    Ok(Kernels {
        any: [get("f32", "")?, get("bf16", "")?, get("f16", "")?],
        two: [get("f32", "_2")?, get("bf16", "_2")?, get("f16", "_2")?],
        hopper,
        _ctx: Arc::clone(ctx),
    })
}

/// Two host-mapped words of a communicator, `[abort, status]`, that its
/// kernels poll and report through. Never freed (a kernel may read them
/// until it ends), so a copy stays valid for the process.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Words {
    ptr: *mut u32,
}

// SAFETY: the words are process-lifetime pinned memory, only read and
// written with volatile accesses.
unsafe impl Send for Words {}
// SAFETY: as above.
unsafe impl Sync for Words {}

/// A page of words handed out in slots; never freed or reused.
static SLOTS: Mutex<(usize, usize)> = Mutex::new((0, 0));
const SLOTS_PER_PAGE: usize = 4096 / 8;

impl Words {
    /// Two new zeroed words, mapped for every device (`ctx` current to
    /// allocate).
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Option<Words> {
        let mut slots = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
        if slots.0 == 0 || slots.1 == SLOTS_PER_PAGE {
            ctx.bind_to_thread().ok()?;
            let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
            // SAFETY: a fresh pinned allocation, never freed.
            let page = unsafe { result::malloc_host(4096, flags) }.ok()?;
            let mut device: sys::CUdeviceptr = 0;
            // SAFETY: `page` is mapped pinned memory; the out-pointer is valid.
            let mapped = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, page, 0) };
            // Kernels get the host address: with unified addressing the two
            // are one (refused otherwise).
            if mapped != sys::CUresult::CUDA_SUCCESS || device != page as u64 {
                // SAFETY: the page just allocated, never handed out.
                let _ = unsafe { result::free_host(page) };
                return None;
            }
            // Pinned memory lives as long as its context: that context is
            // kept for the process (the words are never freed).
            std::mem::forget(Arc::clone(ctx));
            // SAFETY: 4096 writable bytes.
            unsafe { std::ptr::write_bytes(page as *mut u8, 0, 4096) };
            *slots = (page as usize, 0);
        }
        let ptr = (slots.0 + 8 * slots.1) as *mut u32;
        slots.1 += 1;
        Some(Words { ptr })
    }

    /// Tells the communicator's kernels to stop waiting.
    pub(crate) fn raise_abort(&self) {
        // SAFETY: a live mapped word (never freed).
        unsafe { std::ptr::write_volatile(self.ptr, 1) };
    }

    /// What a kernel reported: 0 nothing, 1 it saw the abort, 2 it timed out.
    pub(crate) fn status(&self) -> u32 {
        // SAFETY: a live mapped word (never freed).
        unsafe { std::ptr::read_volatile(self.ptr.add(1)) }
    }

    fn addresses(&self) -> (u64, u64) {
        (self.ptr as u64, self.ptr as u64 + 4)
    }
}

/// What the one-shot kernel needs to know of a symmetric buffer, agreed by
/// every rank when it was made. Opaque outside the crate.
#[derive(Clone, Copy)]
pub struct OneShot {
    /// The communicator the buffer is registered on (its shared state's
    /// address): a call on another communicator keeps NCCL's path.
    pub(crate) comm: usize,
    pub(crate) kernels: &'static Kernels,
    pub(crate) words: Words,
    /// The buffer's own address and length (elements): a call must read
    /// exactly this buffer.
    pub(crate) base: u64,
    pub(crate) len: usize,
    pub(crate) flat: u64,
    pub(crate) stride: u64,
    pub(crate) pad: u64,
    pub(crate) rank: u32,
    pub(crate) nranks: u32,
    pub(crate) timeout_ns: u64,
}

impl std::fmt::Debug for OneShot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneShot")
            .field("len", &self.len)
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .finish_non_exhaustive()
    }
}

/// The fields of NCCL's window descriptor the kernel uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowView {
    pub(crate) flat: u64,
    pub(crate) lsa_rank: i32,
    pub(crate) world_rank: i32,
    pub(crate) stride: u64,
}

/// Reads NCCL's descriptor of `win` (device memory, NCCL 2.28+ layout).
///
/// # Safety
///
/// `win` is a live window handle of NCCL 2.28 or later, registered on a
/// communicator of `ctx`'s device.
pub(crate) unsafe fn read_window(ctx: &Arc<CudaContext>, win: u64) -> Option<WindowView> {
    ctx.bind_to_thread().ok()?;
    let mut raw = [0u64; 4];
    // SAFETY: the caller's promise: `win` points at the descriptor, whose
    // first 32 bytes are winHost, lsaFlatBase, lsaRank, worldRank,
    // stride4G, mcOffset4K.
    unsafe { result::memcpy_dtoh_sync(&mut raw, win) }.ok()?;
    Some(WindowView {
        flat: raw[1],
        lsa_rank: raw[2] as u32 as i32,
        world_rank: (raw[2] >> 32) as u32 as i32,
        stride: (raw[3] & 0xffff_ffff) << 32,
    })
}

impl OneShot {
    /// Whether a sum of `count` elements of `dtype` read at `send` and
    /// written at `recv` runs on the kernel (`captured`: into a CUDA
    /// graph, where small ones keep NCCL's path).
    pub(crate) fn takes(
        &self,
        dtype: nccl_sys::ncclDataType_t,
        elem_bytes: usize,
        (send, recv): (u64, u64),
        count: usize,
        captured: bool,
    ) -> bool {
        use nccl_sys::ncclDataType_t as D;
        let bytes = count.saturating_mul(elem_bytes);
        [D::ncclFloat32, D::ncclBfloat16, D::ncclFloat16].contains(&dtype)
            && send == self.base
            && count <= self.len
            && bytes <= max_bytes(self.nranks as usize)
            && !(captured && bytes <= CAPTURED_NCCL_MAX_BYTES)
            && recv.is_multiple_of(16)
            && self.words.status() == 0
    }

    /// Launches the kernel on `stream`: the sum of every rank's first
    /// `count` elements into `recv` (this buffer itself when equal).
    ///
    /// # Safety
    ///
    /// [`OneShot::takes`] said yes for these arguments; `recv` holds
    /// `count` writable elements of `dtype` on the stream's device, ordered
    /// after earlier uses; every rank launches the same call in the same
    /// order on this buffer; the stream's context is current.
    pub(crate) unsafe fn launch(
        &self,
        dtype: nccl_sys::ncclDataType_t,
        elem_bytes: usize,
        recv: u64,
        count: usize,
        stream: sys::CUstream,
    ) -> std::result::Result<(), result::DriverError> {
        use nccl_sys::ncclDataType_t as D;
        let set = if self.nranks == 2 {
            &self.kernels.two
        } else {
            &self.kernels.any
        };
        let (f, per_vec) = if dtype == D::ncclFloat32 {
            (set[0], 4)
        } else if dtype == D::ncclBfloat16 {
            (set[1], 8)
        } else {
            (set[2], 8)
        };
        debug_assert_eq!(per_vec * elem_bytes, 16);
        let vectors = (count / per_vec) as u64;
        let blocks = vectors.div_ceil(THREADS as u64).clamp(1, MAX_BLOCKS);
        let (abort, status) = self.words.addresses();
        let mut args = Args {
            flat: self.flat,
            stride: self.stride,
            pad: self.pad,
            out: recv,
            count: count as u64,
            abort,
            status,
            timeout: self.timeout_ns,
            rank: self.rank,
            nranks: self.nranks,
            in_place: u32::from(recv == self.base),
        };
        let mut params = [&mut args as *mut Args as *mut c_void];
        if !self.kernels.hopper {
            // SAFETY: the caller's promise; `args` matches the kernel's
            // `Args` (C layout) and outlives the call, which copies it.
            return unsafe {
                result::launch_kernel(
                    f,
                    (blocks as u32, 1, 1),
                    (THREADS, 1, 1),
                    0,
                    stream,
                    &mut params,
                )
            };
        }
        use sys::CUlaunchAttributeID as Id;
        // SAFETY: an all-zero attribute is a valid C value (id 0 is
        // `CU_LAUNCH_ATTRIBUTE_IGNORE`, then `pad` bytes and a union of
        // plain data); the fields set are the ones their ids name.
        let mut attrs: [sys::CUlaunchAttribute; 2] = unsafe { std::mem::zeroed() };
        attrs[0].id = Id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attrs[0].value.programmaticStreamSerializationAllowed = 1;
        attrs[1].id = Id::CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN;
        attrs[1].value.memSyncDomain = sys::CUlaunchMemSyncDomain::CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
        let config = sys::CUlaunchConfig {
            gridDimX: blocks as u32,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: THREADS,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: stream,
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        // SAFETY: the caller's promise; `args` matches the kernel's `Args`
        // and, with `config` and `attrs`, outlives the call, which copies
        // them; the compute_90 kernel waits on the launch dependency
        // (`griddepcontrol.wait`) before it touches memory.
        unsafe {
            sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()).result()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed PTX was built from the committed source: `cargo xtask
    /// kernels` writes the source's SHA-256 into the PTX's second line.
    #[test]
    fn ptx_matches_its_source() {
        use sha2::Digest;
        let digest = sha2::Sha256::digest(SOURCE.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        for (ptx, flags) in [
            (PTX, ""),
            (PTX_90, ""),
            (PTX_REL, "_rel"),
            (PTX_90_REL, "_rel"),
        ] {
            let line = ptx.lines().nth(1).unwrap_or_default();
            assert!(
                line.ends_with(&format!("source sha256 {hex}")),
                "the kernels' PTX is stale: run `cargo xtask kernels` ({line})"
            );
            for ty in ["f32", "bf16", "f16"] {
                for form in ["", "_2"] {
                    let name = format!("one_shot_{ty}{form}{flags}");
                    assert!(ptx.contains(&format!(".entry {name}(")), "{name} missing");
                }
            }
            // Release stores and acquire fences only in the `_rel` builds.
            assert_eq!(ptx.contains("st.release.sys"), !flags.is_empty());
            assert_eq!(ptx.contains("fence.acq_rel.sys"), !flags.is_empty());
        }
        for (ptx, hopper) in [
            (PTX, false),
            (PTX_90, true),
            (PTX_REL, false),
            (PTX_90_REL, true),
        ] {
            assert_eq!(ptx.contains("griddepcontrol.wait"), hopper);
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(max_bytes(2), 4 << 20);
        assert_eq!(max_bytes(8), 1 << 20);
        assert_eq!(std::mem::size_of::<Args>(), 80);
    }
}
