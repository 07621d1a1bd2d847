//! What is measured: the collectives with their buffer shapes and
//! nccl-tests' bus-bandwidth factors, the layers they are issued through,
//! and the values a correctness check expects.

use nccl_dist::nccl_safe::cudarc::driver::ValidAsZeroBits;
use nccl_dist::nccl_safe::{NcclType, ReduceOp};

/// A collective as nccl-tests names its test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coll {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
    SendRecv,
}

impl Coll {
    pub const ALL: [Coll; 7] = [
        Coll::AllReduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllToAll,
        Coll::SendRecv,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllToAll => "all_to_all",
            Coll::SendRecv => "send_recv",
        }
    }

    pub fn parse(text: &str) -> Option<Coll> {
        Coll::ALL.into_iter().find(|c| c.name() == text)
    }

    /// Whether it applies a reduction operator.
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce)
    }

    /// Whether it has a root.
    pub fn rooted(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::Reduce)
    }

    /// Whether NCCL defines an in-place layout for it.
    pub fn has_in_place(self) -> bool {
        !matches!(self, Coll::AllToAll | Coll::SendRecv)
    }

    /// nccl-tests' factor from algorithm to bus bandwidth on `n` ranks.
    pub fn bus_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::AllReduce => 2.0 * (n - 1.0) / n,
            Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll => (n - 1.0) / n,
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => 1.0,
        }
    }

    /// The shape of one measurement of about `bytes` bytes on `n` ranks:
    /// `None` when it rounds to nothing.
    pub fn shape(self, bytes: usize, elem: usize, n: usize) -> Option<Shape> {
        let total = bytes / elem;
        let split = matches!(self, Coll::AllGather | Coll::ReduceScatter | Coll::AllToAll);
        let count = if split { total / n } else { total };
        if count == 0 {
            return None;
        }
        let (send, recv) = match self {
            Coll::AllGather => (count, n * count),
            Coll::ReduceScatter => (n * count, count),
            Coll::AllToAll => (n * count, n * count),
            _ => (count, count),
        };
        let reported = if split { n * count } else { count };
        Some(Shape {
            count,
            send,
            recv,
            bytes: reported * elem,
            elements: reported,
        })
    }
}

/// Buffer lengths of one measurement, in elements.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The count NCCL is given (per rank block for the split ones).
    pub count: usize,
    pub send: usize,
    pub recv: usize,
    /// nccl-tests' size column: the whole buffer.
    pub bytes: usize,
    /// nccl-tests' count column.
    pub elements: usize,
}

/// One operation to measure.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub coll: Coll,
    pub shape: Shape,
    pub in_place: bool,
    pub op: ReduceOp,
    pub root: usize,
}

/// The layer a call goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layer {
    /// nccl-sys function pointers, no checks: what a C program does.
    Raw,
    /// nccl-safe's typed, validated API on cudarc buffers.
    Safe,
    /// nccl-dist's `dyn Communicator` on raw device pointers, on the
    /// world's communicator as `World` makes it by default (watchdog on).
    Dist,
    /// `Safe` on the same communicator with a watchdog observing it: the
    /// observer is set for this layer's measurements only, so `SafeWd −
    /// Safe` is the watchdog's cost per call.
    SafeWd,
    /// `Raw` plus, before each call, the two driver calls the typed path
    /// makes per call on the issuing thread (the stream's capture status,
    /// the context's binding): `RawProbe − Raw` is what those calls cost
    /// inside the loop, beside NCCL's own (a diagnostic, not in `all`).
    RawProbe,
}

impl Layer {
    /// What `--layers all` means.
    pub const ALL: [Layer; 3] = [Layer::Raw, Layer::Safe, Layer::Dist];
    /// Every layer `--layers` knows.
    pub const KNOWN: [Layer; 5] = [
        Layer::Raw,
        Layer::Safe,
        Layer::Dist,
        Layer::SafeWd,
        Layer::RawProbe,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Layer::Raw => "raw",
            Layer::Safe => "safe",
            Layer::Dist => "dist",
            Layer::SafeWd => "safe_wd",
            Layer::RawProbe => "raw_probe",
        }
    }

    pub fn parse(text: &str) -> Option<Layer> {
        Layer::KNOWN.into_iter().find(|l| l.name() == text)
    }
}

/// An element type the bench can fill and check.
pub trait Elem: NcclType + ValidAsZeroBits + PartialEq + std::fmt::Debug {
    const NAME: &'static str;
    const INTEGER: bool;
    /// Relative tolerance of a reduction of small integers in this type.
    const TOLERANCE: f64;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
}

macro_rules! elem {
    ($($t:ty, $name:literal, $int:literal, $tol:literal, |$v:ident| $from:expr, |$s:ident| $to:expr;)*) => {$(
        impl Elem for $t {
            const NAME: &'static str = $name;
            const INTEGER: bool = $int;
            const TOLERANCE: f64 = $tol;
            fn from_f64($v: f64) -> Self { $from }
            fn to_f64(self) -> f64 { let $s = self; $to }
        }
    )*};
}

elem! {
    f32, "f32", false, 1e-6, |v| v as f32, |s| s as f64;
    f64, "f64", false, 1e-12, |v| v, |s| s;
    half::f16, "f16", false, 1e-2, |v| half::f16::from_f64(v), |s| f64::from(s);
    half::bf16, "bf16", false, 1e-2, |v| half::bf16::from_f64(v), |s| f64::from(s);
    float8::F8E4M3, "f8e4m3", false, 0.125, |v| float8::F8E4M3::from_f64(v), |s| f64::from(s);
    float8::F8E5M2, "f8e5m2", false, 0.25, |v| float8::F8E5M2::from_f64(v), |s| f64::from(s);
    i8, "i8", true, 0.0, |v| v as i8, |s| s as f64;
    u8, "u8", true, 0.0, |v| v as u8, |s| s as f64;
    i32, "i32", true, 0.0, |v| v as i32, |s| s as f64;
    u32, "u32", true, 0.0, |v| v as u32, |s| s as f64;
    i64, "i64", true, 0.0, |v| v as i64, |s| s as f64;
    u64, "u64", true, 0.0, |v| v as u64, |s| s as f64;
}

pub fn parse_op(text: &str) -> Option<ReduceOp> {
    Some(match text {
        "sum" => ReduceOp::Sum,
        "prod" => ReduceOp::Prod,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        "avg" => ReduceOp::Avg,
        _ => return None,
    })
}

pub fn op_name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Prod => "prod",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
        ReduceOp::Avg => "avg",
    }
}

/// The value rank `rank` puts in block `block` of its input: small
/// integers, exact in every type and under every operator here (products
/// stay within 2^8 on 8 ranks).
pub fn input(op: ReduceOp, rank: usize, block: usize) -> f64 {
    if op == ReduceOp::Prod {
        (1 + (rank + block) % 2) as f64
    } else {
        (1 + (rank * 7 + block * 3) % 5) as f64
    }
}

/// `op` over `values`, as NCCL computes it on small integers.
pub fn reduce<T: Elem>(op: ReduceOp, values: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = values.collect();
    match op {
        ReduceOp::Sum => v.iter().sum(),
        ReduceOp::Prod => v.iter().product(),
        ReduceOp::Max => v.iter().copied().fold(f64::MIN, f64::max),
        ReduceOp::Min => v.iter().copied().fold(f64::MAX, f64::min),
        ReduceOp::Avg => {
            let s: f64 = v.iter().sum();
            if T::INTEGER {
                (s / v.len() as f64).floor()
            } else {
                s / v.len() as f64
            }
        }
    }
}

/// Whether `got` is `want` within the type's tolerance.
pub fn matches<T: Elem>(got: T, want: f64) -> bool {
    let g = got.to_f64();
    (g - want).abs() <= T::TOLERANCE * want.abs().max(1.0)
}
