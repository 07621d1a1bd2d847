//! Test values exact in every NCCL type, and device buffers with guard
//! regions checked bit for bit.

use std::fmt::Debug;
use std::sync::Arc;

use nccl_safe::NcclType;
use nccl_safe::cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut};

use crate::TestResult;
use crate::env::world;

/// Types whose test values are exact: every value used is a small integer,
/// or a multiple of 0.25 below 2, representable in every type (fp8 E5M2
/// included).
pub trait TestType:
    NcclType + PartialEq + Debug + nccl_safe::cudarc::driver::ValidAsZeroBits
{
    /// The value `x` in this type (exact for the test values).
    fn from_f64(x: f64) -> Self;
    /// Whether this is an integer type.
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
        (|| -> $crate::TestResult {
            $f::<i8>($($arg),*)?;
            $f::<u8>($($arg),*)?;
            $f::<i32>($($arg),*)?;
            $f::<u32>($($arg),*)?;
            $f::<i64>($($arg),*)?;
            $f::<u64>($($arg),*)?;
            $f::<$crate::half::f16>($($arg),*)?;
            $f::<f32>($($arg),*)?;
            $f::<f64>($($arg),*)?;
            $f::<$crate::half::bf16>($($arg),*)?;
            $f::<$crate::float8::F8E4M3>($($arg),*)?;
            $f::<$crate::float8::F8E5M2>($($arg),*)?;
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
    /// The whole buffer, guards included.
    pub buf: CudaSlice<T>,
    /// Elements of the data region.
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

    /// The data region.
    pub fn data(&self) -> CudaView<'_, T> {
        self.buf.slice(GUARD..GUARD + self.len)
    }

    /// The data region, writable.
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

/// The last segment of a type's name (`f32`, `bf16`), for messages.
pub fn type_name<T>() -> &'static str {
    std::any::type_name::<T>()
        .rsplit("::")
        .next()
        .unwrap_or("?")
}
