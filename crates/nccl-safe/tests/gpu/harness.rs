//! Launch modes, ranks, test values and buffers with guard regions.

use std::error::Error;
use std::fmt::Debug;
use std::sync::Arc;

use nccl_safe::cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};
use nccl_safe::{Comm, Config, NcclType, UniqueId};

pub type TestResult<T = ()> = Result<T, Box<dyn Error + Send + Sync>>;

/// How the ranks are driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One thread, every GPU, `Comm::init_all`, collectives in groups.
    Single,
    /// A thread per rank, `Comm::init_rank`.
    Threads,
    /// A process per rank (started by `cargo xtask gpu-test` with `RANK`
    /// and `LOCAL_RANK`); rank 0 hands out the unique id through the file
    /// `NCCL_SAFE_TEST_ID_FILE`. (nccl-dist's TCP rendezvous is not used
    /// here: nccl-safe cannot depend on the crate above it.)
    Processes,
}

pub fn mode() -> Mode {
    match std::env::var("NCCL_SAFE_TEST_MODE").as_deref() {
        Ok("threads") => Mode::Threads,
        Ok("processes") => Mode::Processes,
        _ => Mode::Single,
    }
}

fn env_number(var: &str) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("processes mode needs {var}"))
}

/// Rank 0 writes a fresh id (to a temporary name, then renamed, so no
/// reader sees half of it); the others poll for it for up to a minute.
fn exchange_id(rank: usize) -> UniqueId {
    let path = std::path::PathBuf::from(
        std::env::var_os("NCCL_SAFE_TEST_ID_FILE")
            .expect("processes mode needs NCCL_SAFE_TEST_ID_FILE"),
    );
    if rank == 0 {
        let id = UniqueId::new().expect("unique id");
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, id.as_bytes()).expect("write id");
        std::fs::rename(&tmp, &path).expect("publish id");
        return id;
    }
    let started = std::time::Instant::now();
    loop {
        if let Some(bytes) = std::fs::read(&path)
            .ok()
            .and_then(|b| <[u8; UniqueId::BYTES]>::try_from(b.as_slice()).ok())
        {
            return UniqueId::from_bytes(bytes);
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "no unique id from rank 0 in {}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// World size: `NCCL_SAFE_TEST_WORLD`, else every visible GPU.
pub fn world() -> usize {
    let visible = nccl_safe::cudarc::driver::CudaContext::device_count().unwrap_or(0) as usize;
    let wanted = std::env::var("NCCL_SAFE_TEST_WORLD")
        .ok()
        .and_then(|w| w.parse().ok())
        .unwrap_or(visible);
    assert!(wanted >= 1, "no GPU visible");
    assert!(
        wanted <= visible,
        "asked for {wanted} GPUs, {visible} visible"
    );
    wanted
}

/// One rank as a test body sees it.
pub struct Rank {
    pub comm: Comm,
    pub rank: usize,
    pub world: usize,
}

impl Rank {
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.comm.stream()
    }
}

/// Runs `body` over every rank: in `Single` mode once, with all ranks; in
/// `Threads` mode once per thread, with that thread's rank alone. A body
/// therefore loops over the ranks it is given and never assumes it has
/// them all.
pub fn run(config: Config, body: impl Fn(&mut [Rank]) -> TestResult + Sync) {
    let world = world();
    match mode() {
        Mode::Single => {
            let devices: Vec<usize> = (0..world).collect();
            let comms = Comm::init_all(&devices, &config).expect("init_all");
            let mut ranks: Vec<Rank> = comms
                .into_iter()
                .enumerate()
                .map(|(rank, comm)| Rank { comm, rank, world })
                .collect();
            for r in &ranks {
                assert_eq!(
                    (r.comm.rank(), r.comm.size(), r.comm.device()),
                    (r.rank, world, r.rank)
                );
            }
            if let Err(e) = body(&mut ranks) {
                panic!("single-thread mode, world {world}: {e}");
            }
        }
        Mode::Threads => {
            let id = UniqueId::new().expect("unique id");
            let errors: Vec<String> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..world)
                    .map(|rank| {
                        let (body, config) = (&body, config.clone());
                        s.spawn(move || -> TestResult {
                            let comm = Comm::init_rank(&id, rank, world, rank, &config)?;
                            assert_eq!(
                                (comm.rank(), comm.size(), comm.device()),
                                (rank, world, rank)
                            );
                            let mut ranks = [Rank { comm, rank, world }];
                            body(&mut ranks)
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .enumerate()
                    .filter_map(|(rank, h)| match h.join() {
                        Ok(Ok(())) => None,
                        Ok(Err(e)) => Some(format!("rank {rank}: {e}")),
                        Err(_) => Some(format!("rank {rank}: panicked")),
                    })
                    .collect()
            });
            if !errors.is_empty() {
                panic!("thread-per-rank mode, world {world}: {}", errors.join("; "));
            }
        }
        Mode::Processes => {
            let rank = env_number("RANK");
            assert_eq!(env_number("WORLD_SIZE"), world, "WORLD_SIZE");
            let device = env_number("LOCAL_RANK");
            let id = exchange_id(rank);
            let comm = Comm::init_rank(&id, rank, world, device, &config).expect("init_rank");
            assert_eq!(
                (comm.rank(), comm.size(), comm.device()),
                (rank, world, rank)
            );
            let mut ranks = [Rank { comm, rank, world }];
            if let Err(e) = body(&mut ranks) {
                panic!("process-per-rank mode, world {world}, rank {rank}: {e}");
            }
        }
    }
}

/// Runs the same step on every rank given: in a group when there are
/// several (one thread driving them all), directly when there is one.
#[macro_export]
macro_rules! each_rank {
    ($ranks:expr, $states:expr, |$on:ident, $r:ident, $st:ident| $body:expr) => {{
        let ranks: &[$crate::harness::Rank] = &*$ranks;
        if ranks.len() == 1 {
            let $r = &ranks[0];
            let $st = &mut $states[0];
            let $on = $r.comm.on($r.comm.stream());
            $body
        } else {
            nccl_safe::group(|g| {
                for ($r, $st) in ranks.iter().zip($states.iter_mut()) {
                    let $on = g.on(&$r.comm);
                    $body?;
                }
                Ok(())
            })
        }
    }};
}

/// Types whose test values are exact: every value used is a small integer,
/// or a multiple of 0.25 below 2, representable in every type (fp8 E5M2
/// included).
pub trait TestType:
    NcclType + PartialEq + Debug + nccl_safe::cudarc::driver::ValidAsZeroBits
{
    fn from_f64(x: f64) -> Self;
    const IS_INT: bool;
}

macro_rules! test_int {
    ($($t:ty),*) => {$(impl TestType for $t {
        fn from_f64(x: f64) -> Self { x as $t }
        const IS_INT: bool = true;
    })*};
}
test_int!(i8, u8, i32, u32, i64, u64);

impl TestType for f32 {
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    const IS_INT: bool = false;
}
impl TestType for f64 {
    fn from_f64(x: f64) -> Self {
        x
    }
    const IS_INT: bool = false;
}
impl TestType for half::f16 {
    fn from_f64(x: f64) -> Self {
        half::f16::from_f64(x)
    }
    const IS_INT: bool = false;
}
impl TestType for half::bf16 {
    fn from_f64(x: f64) -> Self {
        half::bf16::from_f64(x)
    }
    const IS_INT: bool = false;
}
impl TestType for float8::F8E4M3 {
    fn from_f64(x: f64) -> Self {
        float8::F8E4M3::from_f64(x)
    }
    const IS_INT: bool = false;
}
impl TestType for float8::F8E5M2 {
    fn from_f64(x: f64) -> Self {
        float8::F8E5M2::from_f64(x)
    }
    const IS_INT: bool = false;
}

/// Calls `$f::<T>(args)` for every NCCL type, stopping at the first error.
#[macro_export]
macro_rules! each_type {
    ($f:ident($($arg:expr),*)) => {{
        (|| -> $crate::harness::TestResult {
            $f::<i8>($($arg),*)?;
            $f::<u8>($($arg),*)?;
            $f::<i32>($($arg),*)?;
            $f::<u32>($($arg),*)?;
            $f::<i64>($($arg),*)?;
            $f::<u64>($($arg),*)?;
            $f::<half::f16>($($arg),*)?;
            $f::<f32>($($arg),*)?;
            $f::<f64>($($arg),*)?;
            $f::<half::bf16>($($arg),*)?;
            $f::<float8::F8E4M3>($($arg),*)?;
            $f::<float8::F8E5M2>($($arg),*)?;
            Ok(())
        })()
    }};
}

/// Input of reductions, chosen so every partial result is exact in fp8
/// E5M2 (whose integers are exact only up to 8; NCCL rounds after each
/// step): on up to 4 ranks 1 or 2 (sums at most 8, products at most 16);
/// on more, 0 or 1 (sums at most 8). Seen on 8 H200s: with 1 or 2, a sum
/// of 12 came back as 10.
pub fn reduce_input(rank: usize, i: usize) -> f64 {
    static WORLD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if *WORLD.get_or_init(world) <= 4 {
        1.0 + ((rank + i) % 2) as f64
    } else {
        (rank + i).is_multiple_of(3) as u8 as f64
    }
}

/// Input of data movement: a value that depends on rank and position,
/// from a set every type holds exactly.
pub fn move_input(rank: usize, i: usize) -> f64 {
    const VALUES: [f64; 12] = [
        1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 12.0, 14.0, 16.0,
    ];
    VALUES[(rank * 7 + i * 3) % VALUES.len()]
}

/// Elements of guard region on each side of every output.
pub const GUARD: usize = 64;
/// Guard value: exact in every type and never a result.
pub const GUARD_VALUE: f64 = 96.0;

/// A device buffer of `GUARD + len + GUARD` elements with the guards set.
pub struct Guarded<T: TestType> {
    pub buf: CudaSlice<T>,
    pub len: usize,
}

impl<T: TestType> Guarded<T> {
    /// Data region filled by `f(i)`, guards around it.
    pub fn new(stream: &Arc<CudaStream>, len: usize, f: impl Fn(usize) -> f64) -> TestResult<Self> {
        let host: Vec<T> = (0..GUARD + len + GUARD)
            .map(|i| {
                if i < GUARD || i >= GUARD + len {
                    T::from_f64(GUARD_VALUE)
                } else {
                    T::from_f64(f(i - GUARD))
                }
            })
            .collect();
        Ok(Guarded {
            buf: stream.clone_htod(&host)?,
            len,
        })
    }

    /// Data region zeroed.
    pub fn zeros(stream: &Arc<CudaStream>, len: usize) -> TestResult<Self> {
        Self::new(stream, len, |_| 0.0)
    }

    pub fn data(&self) -> CudaView<'_, T> {
        self.buf.slice(GUARD..GUARD + self.len)
    }

    pub fn data_mut(&mut self) -> CudaViewMut<'_, T> {
        self.buf.slice_mut(GUARD..GUARD + self.len)
    }

    /// Checks the guards are untouched and the data is `expected(i)`.
    pub fn check(&self, what: &str, expected: impl Fn(usize) -> f64) -> TestResult {
        let host = self.buf.stream().clone_dtoh(&self.buf)?;
        let guard = T::from_f64(GUARD_VALUE);
        for (i, v) in host.iter().enumerate() {
            if i < GUARD || i >= GUARD + self.len {
                if *v != guard {
                    return Err(
                        format!("{what}: guard element {i} was overwritten with {v:?}").into(),
                    );
                }
            } else {
                let want = T::from_f64(expected(i - GUARD));
                if *v != want {
                    return Err(format!(
                        "{what}: element {} is {v:?}, expected {want:?}",
                        i - GUARD
                    )
                    .into());
                }
            }
        }
        Ok(())
    }
}

pub fn type_name<T>() -> &'static str {
    std::any::type_name::<T>()
        .rsplit("::")
        .next()
        .unwrap_or("?")
}
