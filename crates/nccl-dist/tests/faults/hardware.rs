//! What the cases check around NCCL: a plain CUDA kernel still runs,
//! resources stay flat, ranks meet on the host, and where this process is
//! in `World::init` (for the kill-during-init case).

use std::ffi::{CString, c_void};
use std::time::Duration;

use nccl_dist::nccl_safe;
use nccl_dist::nccl_safe::cudarc::driver::{CudaContext, CudaSlice, DevicePtr, result, sys};

use crate::{Rank, TestResult};

const ADD_ONE_PTX: &str = "
.version 7.0
.target sm_70
.address_size 64
.visible .entry add_one(.param .u64 data, .param .u32 n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<5>;
    .reg .f32 %f<3>;
    ld.param.u64 %rd1, [data];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    add.f32 %f2, %f1, 0f3F800000;
    st.global.f32 [%rd4], %f2;
DONE:
    ret;
}
";

/// A plain CUDA kernel (add 1.0 to each of 1 Mi floats, from hand-written
/// PTX) runs on `device` and gives the right answer: whatever NCCL left
/// behind, the GPU still works.
pub(crate) fn kernel_runs(device: usize) -> TestResult {
    let ctx = CudaContext::new(device)?;
    let stream = ctx.new_stream()?;
    let n: u32 = 1 << 20;
    let host: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let buf: CudaSlice<f32> = stream.clone_htod(&host)?;
    ctx.bind_to_thread()?;
    let ptx = CString::new(ADD_ONE_PTX)?;
    // SAFETY: a NUL-terminated PTX image; the module is unloaded below.
    let module = unsafe { result::module::load_data(ptx.as_ptr() as *const c_void)? };
    // SAFETY: the module was just loaded and holds `add_one`.
    let f = unsafe { result::module::get_function(module, CString::new("add_one")?)? };
    let (ptr, sync) = DevicePtr::device_ptr(&buf, &stream);
    let mut data = ptr;
    let mut count = n;
    let mut params = [
        &mut data as *mut sys::CUdeviceptr as *mut c_void,
        &mut count as *mut u32 as *mut c_void,
    ];
    // SAFETY: `add_one(u64 data, u32 n)` with a device buffer of `n` f32 on
    // this context; the parameters live until the launch returns.
    unsafe {
        result::launch_kernel(
            f,
            (n / 256, 1, 1),
            (256, 1, 1),
            0,
            stream.cu_stream(),
            &mut params,
        )?;
    }
    // The launch is recorded against the buffer's stream use.
    drop(sync);
    let got = stream.clone_dtoh(&buf)?;
    stream.synchronize()?;
    // SAFETY: nothing uses the module any more.
    unsafe { result::module::unload(module)? };
    let wrong = got
        .iter()
        .zip(&host)
        .filter(|(g, h)| **g != **h + 1.0)
        .count();
    if wrong > 0 {
        return Err(format!("kernel: {wrong} wrong elements").into());
    }
    Ok(())
}

/// Open file descriptors of this process.
pub(crate) fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Threads of this process.
pub(crate) fn threads() -> usize {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Threads:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Device memory in use on `device`, the least of 10 readings 100 ms
/// apart: the count is for the whole device, and memory that other
/// processes imported is released by the driver a little after they let
/// go (readings swung by up to 290 MiB and back between cycles), while a
/// leak stays in every reading.
pub(crate) fn gpu_used_mib(device: usize) -> TestResult<usize> {
    let ctx = CudaContext::new(device)?;
    ctx.bind_to_thread()?;
    let mut least = usize::MAX;
    for i in 0..10 {
        if i > 0 {
            std::thread::sleep(Duration::from_millis(100));
        }
        let (free, total) = result::mem_get_info()?;
        least = least.min((total - free) >> 20);
    }
    Ok(least)
}

/// Every rank of the job meets on the host (the rendezvous, with a dummy
/// id): no rank returns before all have arrived.
pub(crate) fn host_barrier(r: &Rank, port: u16) -> TestResult {
    let secret = nccl_dist::Secret::from_env()?;
    let timeout = Duration::from_secs(60);
    if r.rank == 0 {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port))?;
        let dummy = nccl_safe::UniqueId::from_bytes([0; 128]);
        nccl_dist::rendezvous::serve(&listener, r.size, &secret, &dummy.raw(), timeout)?;
    } else {
        nccl_dist::rendezvous::join(("127.0.0.1", port), r.rank, r.size, &secret, timeout)?;
    }
    Ok(())
}

/// Whether libnccl is mapped into this process. A rank other than 0 loads
/// it first when `World::init_with` makes its communicators, right after
/// the rendezvous handed it rank 0's id (rank 0 loads it earlier, to make
/// the id): the moment the kill-during-init case waits for.
pub(crate) fn nccl_loaded() -> bool {
    std::fs::read_to_string("/proc/self/maps").is_ok_and(|maps| maps.contains("libnccl"))
}

/// GPU memory in use on some devices, read through contexts held from
/// before a job to after it (so the primary contexts, and whatever is left
/// in them, outlive the job being measured).
pub(crate) struct Usage(Vec<std::sync::Arc<CudaContext>>);

impl Usage {
    pub(crate) fn on(devices: &[usize]) -> Result<Usage, Box<dyn std::error::Error>> {
        let contexts = devices
            .iter()
            .map(|&d| CudaContext::new(d))
            .collect::<Result<_, _>>()?;
        Ok(Usage(contexts))
    }

    /// MiB in use on each device now (`None` where the driver did not say).
    pub(crate) fn mib(&self) -> Vec<Option<u64>> {
        self.0
            .iter()
            .map(|c| {
                c.mem_get_info()
                    .ok()
                    .map(|(free, total)| ((total - free) >> 20) as u64)
            })
            .collect()
    }

    /// What a job left on each device, from the readings before and after
    /// it: "GPU 0 +12, GPU 1 +10 MiB".
    pub(crate) fn left(before: &[Option<u64>], after: &[Option<u64>]) -> String {
        let each: Vec<String> = before
            .iter()
            .zip(after)
            .enumerate()
            .map(|(d, pair)| match pair {
                (Some(b), Some(a)) => format!("GPU {d} {:+}", *a as i64 - *b as i64),
                _ => format!("GPU {d} ?"),
            })
            .collect();
        format!("{} MiB", each.join(", "))
    }
}
