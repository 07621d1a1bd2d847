//! Element types NCCL can move and reduce, as a sealed trait.
//!
//! The NCCL data type comes from the Rust type, never from the element
//! size: `f16` and `bf16` are both two bytes but different types to NCCL.

use cudarc::driver::DeviceRepr;
use nccl_sys::ncclDataType_t;

mod sealed {
    pub trait Sealed {}
}

/// A type NCCL has a data type for.
///
/// Implemented for `f32`, `f64`, `half::f16`, `half::bf16`, `i8`, `u8`,
/// `i32`, `u32`, `i64`, `u64`, `float8::F8E4M3` and `float8::F8E5M2`.
/// Sealed: NCCL's set of types is closed.
pub trait NcclType: DeviceRepr + Copy + Send + Sync + 'static + sealed::Sealed {
    /// The NCCL data type.
    const DATATYPE: ncclDataType_t;
    /// `true` for the fp8 types, which need NCCL 2.24 and, for reductions,
    /// a GPU of compute capability 9.0 or newer.
    const IS_FP8: bool = false;
}

/// Calls `$callback!` with the one list of element types, after any
/// tokens given first: `Tag = rust_type => ncclDataType [fp8 = true],
/// "doc";` per type, `Tag` naming it in nccl-dist's run-time `DType`.
/// `NcclType`'s impls below and `DType` (with its `with_type!`) expand
/// it, so adding a type is one line here.
#[doc(hidden)]
#[macro_export]
macro_rules! for_each_dtype {
    ($callback:ident $($first:tt)*) => {
        $callback! {
            $($first)*
            I8 = i8 => ncclInt8, "`i8`.";
            U8 = u8 => ncclUint8, "`u8`.";
            I32 = i32 => ncclInt32, "`i32`.";
            U32 = u32 => ncclUint32, "`u32`.";
            I64 = i64 => ncclInt64, "`i64`.";
            U64 = u64 => ncclUint64, "`u64`.";
            F16 = $crate::half::f16 => ncclFloat16, "IEEE half precision (`half::f16`).";
            F32 = f32 => ncclFloat32, "`f32`.";
            F64 = f64 => ncclFloat64, "`f64`.";
            BF16 = $crate::half::bf16 => ncclBfloat16, "bfloat16 (`half::bf16`).";
            F8E4M3 = $crate::float8::F8E4M3 => ncclFloat8e4m3 [fp8 = true], "fp8 e4m3 (NCCL 2.24+).";
            F8E5M2 = $crate::float8::F8E5M2 => ncclFloat8e5m2 [fp8 = true], "fp8 e5m2 (NCCL 2.24+).";
        }
    };
}

macro_rules! nccl_type {
    ($($tag:ident = $t:ty => $dt:ident $([fp8 = $fp8:literal])?, $doc:literal;)*) => {$(
        impl sealed::Sealed for $t {}
        impl NcclType for $t {
            const DATATYPE: ncclDataType_t = ncclDataType_t::$dt;
            $(const IS_FP8: bool = $fp8;)?
        }
    )*};
}

crate::for_each_dtype!(nccl_type);

#[cfg(test)]
mod tests {
    use super::*;

    fn check<T: NcclType>() {
        assert_eq!(
            T::DATATYPE.size_bytes(),
            Some(std::mem::size_of::<T>()),
            "{:?}",
            T::DATATYPE
        );
    }

    #[test]
    fn every_type_maps_to_the_nccl_type_of_its_size() {
        check::<i8>();
        check::<u8>();
        check::<i32>();
        check::<u32>();
        check::<i64>();
        check::<u64>();
        check::<half::f16>();
        check::<f32>();
        check::<f64>();
        check::<half::bf16>();
        check::<float8::F8E4M3>();
        check::<float8::F8E5M2>();
    }

    #[test]
    fn f16_and_bf16_are_different_nccl_types() {
        assert_eq!(half::f16::DATATYPE, ncclDataType_t::ncclFloat16);
        assert_eq!(half::bf16::DATATYPE, ncclDataType_t::ncclBfloat16);
        const { assert!(float8::F8E4M3::IS_FP8 && float8::F8E5M2::IS_FP8 && !f32::IS_FP8) };
    }
}
