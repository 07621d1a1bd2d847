//! The fault-injection suite: each test is one rank of a job that
//! `cargo xtask gpu-test --faults` starts as a process per GPU. The harness
//! sets the torchrun variables plus
//!
//! - `NCCL_RS_FAULT_OUT`: a directory where each rank writes what it saw
//!   (`<case>.<rank>`, `key=value` lines) for the harness's table;
//! - `NCCL_RS_FAULT_VICTIM`: the rank that misbehaves (the last one);
//! - `NCCL_RS_FAULT_PORT2`: a rendezvous port for the survivors' new world.
//!
//! A test passes when its rank saw the outcome the case expects (an error
//! within the deadline, a working communicator after recovery, a plain
//! CUDA kernel still running on the GPU). The victim of a kill or stop
//! case never reports; the harness checks how it ended.
//!
//! Ignored by default: they need GPUs and the harness.

use std::error::Error as StdError;
use std::ffi::{CString, c_void};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nccl_dist::nccl_safe::cudarc::driver::{CudaContext, CudaSlice, result, sys};
use nccl_dist::nccl_safe::{self, ReduceOp};
use nccl_dist::{Error, FailureKind, Launch, WatchdogOptions, World, WorldOptions, default_config};

type TestResult<T = ()> = Result<T, Box<dyn StdError + Send + Sync>>;

/// The watchdog's timeout: how long a stuck operation may take.
const DEADLINE: Duration = Duration::from_secs(5);
/// The communicators' own timeout (nonblocking polling, synchronize,
/// teardown): longer, so the watchdog acts first where it watches.
const COMM_TIMEOUT: Duration = Duration::from_secs(15);
/// Elements of the large all-reduce (256 MiB of f32).
const BIG: usize = 64 << 20;

/// The suite's world options: the communicator timeout above, 60 s for the
/// rendezvous.
fn options() -> WorldOptions {
    WorldOptions::new()
        .config(default_config().timeout(COMM_TIMEOUT))
        .timeout(Duration::from_secs(60))
}

struct Rank {
    case: &'static str,
    rank: usize,
    size: usize,
    victim: usize,
    out: PathBuf,
    lines: Vec<String>,
}

fn env(name: &str) -> TestResult<String> {
    std::env::var(name).map_err(|_| {
        format!("{name} is not set: run this through `cargo xtask gpu-test --faults`").into()
    })
}

impl Rank {
    fn new(case: &'static str) -> TestResult<Rank> {
        let rank = env("RANK")?.parse()?;
        let size = env("WORLD_SIZE")?.parse()?;
        let victim = env("NCCL_RS_FAULT_VICTIM")?.parse()?;
        let out = PathBuf::from(env("NCCL_RS_FAULT_OUT")?);
        Ok(Rank {
            case,
            rank,
            size,
            victim,
            out,
            lines: Vec::new(),
        })
    }

    fn is_victim(&self) -> bool {
        self.rank == self.victim
    }

    /// Records `key=value` for the harness (written at once, so a later
    /// hang still leaves what was seen).
    fn note(&mut self, key: &str, value: impl std::fmt::Display) -> TestResult {
        let value = value.to_string().replace('\n', " | ");
        self.lines.push(format!("{key}={value}"));
        let path = self.out.join(format!("{}.{}", self.case, self.rank));
        std::fs::write(path, self.lines.join("\n") + "\n")?;
        Ok(())
    }

    /// The world of this job, with or without the watchdog.
    fn world(&self, watchdog: bool) -> TestResult<World> {
        let mut options = options();
        if watchdog {
            options = options.watchdog(WatchdogOptions::new().timeout(DEADLINE));
        }
        Ok(World::init_with(Launch::detect()?, &options)?)
    }

    /// A new world among every rank but the victim, on the second port.
    fn survivors_world(&self) -> TestResult<World> {
        let port: u16 = env("NCCL_RS_FAULT_PORT2")?.parse()?;
        let rank = if self.rank > self.victim {
            self.rank - 1
        } else {
            self.rank
        };
        let launch = Launch::explicit(rank, self.size - 1, rank, self.size - 1, "127.0.0.1", port)?;
        let options = options().device(self.rank);
        Ok(World::init_with(launch, &options)?)
    }
}

/// One all-reduce of `n` elements, `rank + 1` each, checked bit-exact.
fn checked_all_reduce(world: &World, n: usize) -> TestResult {
    let comm = world.comm();
    let stream = comm.stream();
    let mut buf = stream.clone_htod(&vec![(comm.rank() + 1) as f32; n])?;
    comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
    nccl_dist::synchronize(comm, stream)?;
    let got = stream.clone_dtoh(&buf)?;
    let want = (comm.size() * (comm.size() + 1) / 2) as f32;
    let wrong = got.iter().filter(|v| **v != want).count();
    if wrong > 0 {
        return Err(format!("{wrong} of {n} elements wrong (want {want})").into());
    }
    Ok(())
}

fn cuda(source: nccl_dist::nccl_safe::cudarc::driver::DriverError) -> nccl_safe::Error {
    nccl_safe::Error::Cuda {
        op: "alloc",
        source,
    }
}

/// What kind of error `e` is, for the table.
fn kind(e: &Error) -> String {
    match e {
        Error::Watchdog(f) => {
            let what = match &f.kind {
                FailureKind::Timeout { .. } => "timeout".to_string(),
                FailureKind::AsyncError(e) => format!("async error {e}"),
                FailureKind::Aborted => "aborted".to_string(),
                _ => "other".to_string(),
            };
            format!("Watchdog: {what} of {} #{}", f.op, f.seq)
        }
        Error::Nccl(nccl_safe::Error::Timeout { op, .. }) => format!("Timeout({op})"),
        Error::Nccl(nccl_safe::Error::Aborted { op, .. }) => format!("Aborted({op})"),
        Error::Nccl(nccl_safe::Error::Nccl { code, op, .. }) => format!("Nccl({op}: {code:?})"),
        other => format!("{other}"),
    }
}

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

/// Case (f): a plain CUDA kernel (add 1.0 to each of 1 Mi floats, from
/// hand-written PTX) runs on `device` and gives the right answer.
fn kernel_runs(device: usize) -> TestResult {
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
    let (ptr, _sync) = nccl_dist::nccl_safe::cudarc::driver::DevicePtr::device_ptr(&buf, &stream);
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
    drop(_sync);
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

/// Records the error of the wait that should fail, and how long it took.
fn expect_error(
    r: &mut Rank,
    waited: Result<(), Error>,
    since: Instant,
    limit: Duration,
) -> TestResult {
    let after = since.elapsed();
    r.note("error_after_ms", after.as_millis())?;
    r.note("deadline_ms", limit.as_millis())?;
    match waited {
        Ok(()) => {
            r.note("outcome", "completed (no error)")?;
            Err("the wait that should fail succeeded".into())
        }
        Err(e) => {
            r.note("outcome", kind(&e))?;
            r.note("error", &e)?;
            if after > limit {
                return Err(format!("error after {after:?}, beyond {limit:?}").into());
            }
            Ok(())
        }
    }
}

/// The survivors' epilogue: a kernel on the GPU, then a new world among
/// them with a checked all-reduce.
fn recover(r: &mut Rank) -> TestResult {
    kernel_runs(r.rank)?;
    r.note("kernel", "ok")?;
    let started = Instant::now();
    let world = r.survivors_world()?;
    checked_all_reduce(&world, 1 << 20)?;
    r.note("rebuilt_ms", started.elapsed().as_millis())?;
    r.note("recovered", format!("ok ({} ranks)", world.size()))?;
    Ok(())
}

fn run(case: &'static str, body: impl FnOnce(&mut Rank) -> TestResult) {
    let mut r = Rank::new(case).expect("fault-suite environment");
    if let Err(e) = body(&mut r) {
        let _ = r.note("failed", &e);
        panic!("rank {}: {e}", r.rank);
    }
    let _ = r.note("pass", "yes");
}

/// (a) The victim enqueues 20 large all-reduces and kills itself with
/// SIGKILL while they run; the others enqueue 40 (a killed process's
/// queued kernels may still finish, so only the extra ones are sure to
/// starve). Every survivor's wait ends in an error within the deadline, a
/// kernel still runs, and the survivors rebuild a world.
#[test]
#[ignore]
fn a_sigkill_mid_all_reduce() {
    run("a_sigkill_mid_all_reduce", |r| {
        let world = r.world(true)?;
        checked_all_reduce(&world, 1024)?;
        let comm = world.comm();
        let mut buf = comm.stream().alloc_zeros::<f32>(BIG)?;
        let since = Instant::now();
        let ops = if r.is_victim() { 20 } else { 40 };
        let mut issued = Ok(());
        for _ in 0..ops {
            issued = comm.all_reduce_in_place(&mut buf, ReduceOp::Sum);
            if issued.is_err() {
                break;
            }
        }
        if r.is_victim() {
            // SAFETY: signals this process.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let waited = issued
            .map_err(|e| nccl_dist::watchdog::explain(comm, e))
            .and_then(|()| nccl_dist::synchronize(comm, comm.stream()));
        expect_error(r, waited, since, DEADLINE + Duration::from_secs(2))?;
        drop(buf);
        drop(world);
        recover(r)
    });
}

/// (b) The victim stops itself (SIGSTOP) before the next all-reduce; the
/// others time out, abort, and a fresh world among them works.
#[test]
#[ignore]
fn b_sigstop_then_rebuild() {
    run("b_sigstop_then_rebuild", |r| {
        let world = r.world(true)?;
        checked_all_reduce(&world, 1024)?;
        if r.is_victim() {
            // SAFETY: signals this process; the harness kills it later.
            unsafe { libc::raise(libc::SIGSTOP) };
            return Err("the victim was resumed".into());
        }
        let since = Instant::now();
        let waited = checked_all_reduce(&world, 1 << 20);
        let waited = match waited {
            Ok(()) => Ok(()),
            Err(e) => match e.downcast::<Error>() {
                Ok(e) => Err(*e),
                Err(e) => return Err(e),
            },
        };
        expect_error(r, waited, since, DEADLINE + Duration::from_secs(2))?;
        drop(world);
        recover(r)
    });
}

/// The mismatch cases: every rank runs `op`, then a one-element barrier;
/// the first error ends it. Every rank must see an error within two
/// deadlines (the op, then the barrier a faster rank got to), never hang.
fn mismatch(r: &mut Rank, op: impl FnOnce(&World) -> nccl_safe::Result<()>) -> TestResult {
    let world = r.world(true)?;
    checked_all_reduce(&world, 1024)?;
    let since = Instant::now();
    let comm = world.comm();
    let waited = op(&world)
        .map_err(|e| nccl_dist::watchdog::explain(comm, e))
        .and_then(|()| nccl_dist::synchronize(comm, comm.stream()))
        .and_then(|()| {
            let mut token = comm.stream().alloc_zeros::<i32>(1).map_err(cuda)?;
            comm.all_reduce_in_place(&mut token, ReduceOp::Sum)
                .map_err(|e| nccl_dist::watchdog::explain(comm, e))?;
            nccl_dist::synchronize(comm, comm.stream())
        });
    expect_error(r, waited, since, 2 * DEADLINE + Duration::from_secs(2))?;
    drop(world);
    kernel_runs(r.rank)?;
    r.note("kernel", "ok")
}

/// (c1) Rank 0 all-reduces N elements, the others 2N.
#[test]
#[ignore]
fn c1_mismatched_count() {
    run("c1_mismatched_count", |r| {
        mismatch(r, |w| {
            let n = if w.rank() == 0 { 1 << 20 } else { 2 << 20 };
            let mut buf = w.comm().stream().alloc_zeros::<f32>(n).map_err(cuda)?;
            w.comm().all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
            // Keep the buffer until the comm is gone: NCCL may still use it.
            std::mem::forget(buf);
            Ok(())
        })
    });
}

/// (c2) Rank 0 all-reduces f32, the others f64, same count.
#[test]
#[ignore]
fn c2_mismatched_dtype() {
    run("c2_mismatched_dtype", |r| {
        mismatch(r, |w| {
            let n = 1 << 20;
            let stream = w.comm().stream();
            if w.rank() == 0 {
                let mut buf = stream.alloc_zeros::<f32>(n).map_err(cuda)?;
                w.comm().all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
                std::mem::forget(buf);
            } else {
                let mut buf = stream.alloc_zeros::<f64>(n).map_err(cuda)?;
                w.comm().all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
                std::mem::forget(buf);
            }
            Ok(())
        })
    });
}

/// (c3) Rank 0 runs an all-reduce then a broadcast; the others the other
/// way round.
#[test]
#[ignore]
fn c3_mismatched_order() {
    run("c3_mismatched_order", |r| {
        mismatch(r, |w| {
            let n = 1 << 20;
            let stream = w.comm().stream();
            let mut a = stream.alloc_zeros::<f32>(n).map_err(cuda)?;
            let mut b = stream.alloc_zeros::<f32>(n).map_err(cuda)?;
            if w.rank() == 0 {
                w.comm().all_reduce_in_place(&mut a, ReduceOp::Sum)?;
                w.comm().broadcast_in_place(&mut b, 0)?;
            } else {
                w.comm().broadcast_in_place(&mut b, 0)?;
                w.comm().all_reduce_in_place(&mut a, ReduceOp::Sum)?;
            }
            std::mem::forget((a, b));
            Ok(())
        })
    });
}

/// (d) The victim never joins an all-reduce; on the others a second
/// thread aborts the communicator after 1 s while the first waits in
/// `synchronize` (no watchdog): the waiter wakes with `Aborted`.
#[test]
#[ignore]
fn d_abort_from_another_thread() {
    run("d_abort_from_another_thread", |r| {
        let world = r.world(false)?;
        checked_all_reduce(&world, 1024)?;
        if r.is_victim() {
            std::thread::sleep(Duration::from_secs(3));
            let started = Instant::now();
            drop(world);
            r.note("victim_drop_ms", started.elapsed().as_millis())?;
            return kernel_runs(r.rank);
        }
        let comm = world.comm();
        let mut buf = comm.stream().alloc_zeros::<f32>(1 << 20)?;
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        let handle = comm.abort_handle();
        let aborter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(1));
            let at = Instant::now();
            let result = handle.abort();
            (at, at.elapsed(), result)
        });
        let waited = nccl_dist::synchronize(comm, comm.stream());
        let woke = Instant::now();
        let (aborted_at, abort_took, abort_result) =
            aborter.join().map_err(|_| "aborter panicked")?;
        abort_result?;
        r.note("abort_call_ms", abort_took.as_millis())?;
        r.note(
            "wake_after_abort_ms",
            woke.saturating_duration_since(aborted_at).as_millis(),
        )?;
        expect_error(
            r,
            waited,
            aborted_at - Duration::from_secs(1),
            Duration::from_secs(3),
        )?;
        if !matches!(comm.status(), Err(nccl_safe::Error::Aborted { .. })) {
            return Err("the communicator does not say Aborted".into());
        }
        drop(buf);
        drop(world);
        kernel_runs(r.rank)?;
        r.note("kernel", "ok")
    });
}

/// (e) The victim never joins an all-reduce; the others drop their world
/// with it in flight. The drop finalizes, gives up after the
/// communicator's timeout and aborts: bounded, no hang.
#[test]
#[ignore]
fn e_drop_with_work_in_flight() {
    run("e_drop_with_work_in_flight", |r| {
        let world = r.world(false)?;
        checked_all_reduce(&world, 1024)?;
        if r.is_victim() {
            std::thread::sleep(Duration::from_secs(2));
            drop(world);
            return kernel_runs(r.rank);
        }
        let comm = world.comm();
        let mut buf = comm.stream().alloc_zeros::<f32>(1 << 20)?;
        comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)?;
        let started = Instant::now();
        drop(world);
        let took = started.elapsed();
        r.note("drop_ms", took.as_millis())?;
        r.note("deadline_ms", COMM_TIMEOUT.as_millis())?;
        r.note("outcome", "dropped (finalize timed out, aborted)")?;
        if took > COMM_TIMEOUT + Duration::from_secs(5) {
            return Err(format!("drop took {took:?}").into());
        }
        // The buffer outlived the aborted communicator's work.
        drop(buf);
        kernel_runs(r.rank)?;
        r.note("kernel", "ok")
    });
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn threads() -> usize {
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
fn gpu_used_mib(device: usize) -> TestResult<usize> {
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
fn host_barrier(r: &Rank, port: u16) -> TestResult {
    let secret = nccl_dist::Secret::from_env()?;
    let timeout = Duration::from_secs(60);
    if r.rank == 0 {
        let listener = std::net::TcpListener::bind(("127.0.0.1", port))?;
        let dummy = nccl_safe::UniqueId::from_bytes([0; 128]);
        nccl_dist::rendezvous::serve(&listener, r.size, &secret, &dummy, timeout)?;
    } else {
        nccl_dist::rendezvous::join(("127.0.0.1", port), r.rank, r.size, &secret, timeout)?;
    }
    Ok(())
}

/// Recovery: 50 cycles of (new world, checked all-reduce, abort). Open
/// fds, threads and device memory after cycle 10 and cycle 50, sampled
/// once every rank has aborted, must match (small slack for the
/// allocator).
#[test]
#[ignore]
fn r_fifty_abort_rebuild_cycles() {
    run("r_fifty_abort_rebuild_cycles", |r| {
        let port: u16 = env("NCCL_RS_FAULT_PORT2")?.parse()?;
        let mut samples = Vec::new();
        let started = Instant::now();
        for cycle in 1..=50 {
            let launch = Launch::explicit(r.rank, r.size, r.rank, r.size, "127.0.0.1", port)?;
            let world = World::init_with(launch, &options())?;
            checked_all_reduce(&world, 1 << 20)?;
            world.into_comm().abort()?;
            if [1, 10, 25, 50].contains(&cycle) {
                // GPU memory is counted for the whole device, and a peer
                // that has not aborted yet still holds this GPU's buffers it
                // imported: sample once every rank has aborted.
                host_barrier(r, port)?;
                let s = (cycle, open_fds(), threads(), gpu_used_mib(r.rank)?);
                r.note(
                    &format!("cycle{cycle}"),
                    format!("fds={} threads={} gpu_used_mib={}", s.1, s.2, s.3),
                )?;
                samples.push(s);
            }
        }
        r.note("total_s", format!("{:.1}", started.elapsed().as_secs_f64()))?;
        let (at10, at50) = (samples[1], samples[3]);
        if at50.1 > at10.1 + 2 || at50.2 > at10.2 + 1 || at50.3 > at10.3 + 64 {
            return Err(
                format!("resources grew from cycle 10 {at10:?} to cycle 50 {at50:?}").into(),
            );
        }
        r.note("outcome", "flat")
    });
}
