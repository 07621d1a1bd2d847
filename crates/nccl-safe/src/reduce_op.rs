//! Reduction operators: the built-ins and PreMulSum.

use std::marker::PhantomData;

use cudarc::driver::CudaStream;
use nccl_sys::{ncclRedOp_t, ncclScalarResidence_t};

use crate::buffer::{Access, DeviceBuffer};
use crate::comm::Comm;
use crate::dtype::NcclType;
use crate::error::Role;
use crate::{Error, Feature, Result};

/// A built-in reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Sum divided by the number of ranks (integer types: truncated).
    Avg,
}

impl ReduceOp {
    /// Every built-in.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ];

    /// The NCCL value.
    pub fn raw(self) -> ncclRedOp_t {
        match self {
            ReduceOp::Sum => ncclRedOp_t::ncclSum,
            ReduceOp::Prod => ncclRedOp_t::ncclProd,
            ReduceOp::Max => ncclRedOp_t::ncclMax,
            ReduceOp::Min => ncclRedOp_t::ncclMin,
            ReduceOp::Avg => ncclRedOp_t::ncclAvg,
        }
    }
}

mod sealed {
    /// Only this crate's operators: a `Reduction` decides which memory NCCL
    /// reads (a PreMulSum's device scalar), so one made elsewhere could
    /// hand NCCL memory with no ordering or lifetime behind it.
    pub trait Sealed {}
    impl Sealed for super::ReduceOp {}
    impl<T: crate::NcclType> Sealed for &super::PreMulSum<'_, T> {}
}

/// Something a reducing collective accepts as its operator: a
/// [`ReduceOp`] or a [`PreMulSum`] made for the same communicator and type.
/// `'a` is how long the collective's borrows last. Sealed: only these two
/// implement it.
pub trait Reduction<'a, T: NcclType>: sealed::Sealed {
    /// The NCCL operator to pass for `comm`.
    fn raw_for(&self, comm: &Comm) -> Result<ncclRedOp_t>;

    /// Orders `stream` after writes to a device-resident scalar and tells
    /// its owner about the read.
    fn scalar_access(&self, stream: &'a CudaStream) -> Option<Access<'a>>;

    /// A name for tracing.
    fn name(&self) -> &'static str;

    /// Whether NCCL runs it as a scaled sum (PreMulSum, and `Avg` on
    /// floating-point types).
    fn scales(&self) -> bool;
}

impl<'a, T: NcclType> Reduction<'a, T> for ReduceOp {
    fn raw_for(&self, _comm: &Comm) -> Result<ncclRedOp_t> {
        Ok(self.raw())
    }
    fn scalar_access(&self, _stream: &'a CudaStream) -> Option<Access<'a>> {
        None
    }
    fn name(&self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Avg => "avg",
        }
    }
    fn scales(&self) -> bool {
        *self == ReduceOp::Avg
    }
}

/// `ncclRedOpCreatePreMulSum`: multiplies each rank's input by a scalar,
/// then sums. Valid only on the communicator that made it and for `T`;
/// destroyed with `ncclRedOpDestroy` when dropped.
///
/// The scalar is either read once at creation ([`PreMulSum::host`]) or
/// read from device memory by every collective that uses the op
/// ([`PreMulSum::device`]), which the op borrows so it cannot be freed
/// while the op exists.
pub struct PreMulSum<'c, T: NcclType> {
    comm: &'c Comm,
    op: ncclRedOp_t,
    scalar: Option<&'c dyn DeviceBuffer<T>>,
    _type: PhantomData<T>,
}

impl<T: NcclType> std::fmt::Debug for PreMulSum<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreMulSum")
            .field("op", &self.op)
            .field("device_scalar", &self.scalar.is_some())
            .finish()
    }
}

impl<'c, T: NcclType> PreMulSum<'c, T> {
    fn create(
        comm: &'c Comm,
        scalar: *mut std::ffi::c_void,
        residence: ncclScalarResidence_t,
    ) -> Result<ncclRedOp_t> {
        const OP: &str = "ncclRedOpCreatePreMulSum";
        let lib = comm.library();
        lib.capabilities().require(Feature::PreMulSum)?;
        crate::validate::check_dtype::<T>(comm, OP, true)?;
        comm.shared().with_raw(OP, |raw| {
            let create = lib.raw().ncclRedOpCreatePreMulSum()?;
            let mut op = ncclRedOp_t::ncclSum;
            // SAFETY: `raw` is live; `scalar` points to one `T` in host memory
            // (read before return) or device memory (kept alive by the
            // borrow in the returned op).
            let code = unsafe { create(&mut op, scalar, T::DATATYPE, residence, raw) };
            lib.check(OP, code, raw)?;
            Ok(op)
        })
    }

    /// A PreMulSum whose scalar NCCL copies from the host now.
    pub fn host(comm: &'c Comm, scalar: T) -> Result<PreMulSum<'c, T>> {
        let mut value = scalar;
        let op = Self::create(
            comm,
            (&mut value as *mut T).cast(),
            ncclScalarResidence_t::ncclScalarHostImmediate,
        )?;
        Ok(PreMulSum {
            comm,
            op,
            scalar: None,
            _type: PhantomData,
        })
    }

    /// A PreMulSum whose scalar is element 0 of `scalar`, read on the GPU
    /// by each collective, so it can change between collectives.
    pub fn device(comm: &'c Comm, scalar: &'c dyn DeviceBuffer<T>) -> Result<PreMulSum<'c, T>> {
        const OP: &str = "ncclRedOpCreatePreMulSum";
        if scalar.device() != comm.device() {
            return Err(Error::WrongDevice {
                op: OP,
                role: Role::Scalar,
                expected: comm.device(),
                found: scalar.device(),
            });
        }
        if scalar.is_empty() {
            return Err(Error::Length {
                op: OP,
                role: Role::Scalar,
                needed: 1,
                given: 0,
            });
        }
        let (ptr, access) = scalar.read(comm.stream());
        drop(access);
        let op = Self::create(
            comm,
            ptr as *mut std::ffi::c_void,
            ncclScalarResidence_t::ncclScalarDevice,
        )?;
        Ok(PreMulSum {
            comm,
            op,
            scalar: Some(scalar),
            _type: PhantomData,
        })
    }

    /// The NCCL operator value.
    pub fn raw(&self) -> ncclRedOp_t {
        self.op
    }
}

impl<'a, 'c: 'a, T: NcclType> Reduction<'a, T> for &'a PreMulSum<'c, T> {
    fn raw_for(&self, comm: &Comm) -> Result<ncclRedOp_t> {
        if std::ptr::eq(self.comm, comm) {
            Ok(self.op)
        } else {
            Err(Error::InvalidArgument {
                op: "PreMulSum",
                reason: "the operator belongs to another communicator",
            })
        }
    }
    fn scalar_access(&self, stream: &'a CudaStream) -> Option<Access<'a>> {
        let scalar: Option<&'a dyn DeviceBuffer<T>> = self.scalar;
        scalar.map(|s| s.read(stream).1)
    }
    fn name(&self) -> &'static str {
        "premul_sum"
    }
    fn scales(&self) -> bool {
        true
    }
}

impl<T: NcclType> Drop for PreMulSum<'_, T> {
    fn drop(&mut self) {
        let lib = self.comm.library();
        let op = self.op;
        let result = self.comm.shared().with_raw("ncclRedOpDestroy", |raw| {
            let destroy = lib.raw().ncclRedOpDestroy()?;
            // SAFETY: `op` was created on `raw` and is destroyed once; NCCL
            // allows it as soon as the calls that used it have returned.
            let code = unsafe { destroy(op, raw) };
            lib.check("ncclRedOpDestroy", code, raw)
        });
        if let Err(e) = result {
            tracing::debug!(error = %e, "ncclRedOpDestroy failed in drop");
        }
    }
}
