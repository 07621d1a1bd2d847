//! Handles, the unique id, the C enums as open newtypes, and the header's
//! `#define` constants.
//!
//! Every C enum that crosses the FFI boundary is a `#[repr(transparent)]`
//! newtype over the integer type the C compiler picks for it (`unsigned int`
//! when every enumerator is non-negative, `int` otherwise), with the
//! enumerators as associated consts. A Rust `enum` would make a value that a
//! newer libnccl returns (a new error code, a PreMulSum op handle, a new
//! dtype) undefined behaviour; a newtype makes it just another number.

use core::ffi::{c_int, c_uint};
use core::fmt;

/// Declares an opaque C object that is only ever handled by pointer: no
/// size, not `Send`/`Sync`/`Unpin` (the C side owns its threading and
/// address), per the Rustonomicon's advice for opaque FFI types.
macro_rules! opaque {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[repr(C)]
        pub struct $name {
            _opaque: [u8; 0],
            _not_send_sync_unpin: core::marker::PhantomData<(*mut u8, core::marker::PhantomPinned)>,
        }
    };
}

opaque! {
    /// Opaque communicator object behind [`ncclComm_t`].
    ncclComm
}

/// Handle to a communicator (`struct ncclComm*`). Null is `NCCL_COMM_NULL`.
pub type ncclComm_t = *mut ncclComm;

opaque! {
    /// Opaque object behind [`ncclWindow_t`]. The C tag was `struct ncclWindow`
    /// in 2.27 and `struct ncclWindow_vidmem` from 2.28; only the pointer crosses
    /// the boundary, so the rename does not change the ABI.
    ncclWindow_vidmem
}

/// Handle to a registered memory window (NCCL 2.27).
pub type ncclWindow_t = *mut ncclWindow_vidmem;

opaque! {
    /// Opaque object behind [`ncclParamHandle_t`].
    ncclParamHandle
}

/// Handle to a runtime parameter, owned by NCCL's parameter system (NCCL 2.30).
pub type ncclParamHandle_t = *mut ncclParamHandle;

opaque! {
    /// Opaque CUDA runtime stream object (`struct CUstream_st`).
    CUstream_st
}

/// CUDA stream handle as NCCL takes it. The runtime's `cudaStream_t` and the
/// driver's `CUstream` are the same pointer, so a cudarc stream's raw handle
/// can be cast to this type. Null is the legacy default stream.
pub type cudaStream_t = *mut CUstream_st;

opaque! {
    /// Opaque CUDA runtime event object (`struct CUevent_st`).
    CUevent_st
}

/// CUDA event handle (same pointer as the driver's `CUevent`).
pub type cudaEvent_t = *mut CUevent_st;

/// Size of [`ncclUniqueId`] in bytes (`NCCL_UNIQUE_ID_BYTES`).
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;

/// The opaque id that every rank of a new communicator must share.
///
/// C declares it as `struct { char internal[128]; }`. `char` is signed on
/// x86-64 and unsigned on aarch64, so the field here is `[u8; 128]`: same
/// size, alignment and passing convention (a struct of bytes is passed the
/// same way whatever the signedness), and the bytes compare, hash and
/// serialise identically on both architectures.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ncclUniqueId {
    /// The raw bytes. NCCL gives them no structure callers may rely on.
    pub internal: [u8; NCCL_UNIQUE_ID_BYTES],
}

impl ncclUniqueId {
    /// An all-zero id, to be filled by `ncclGetUniqueId`.
    pub const fn zeroed() -> Self {
        Self {
            internal: [0; NCCL_UNIQUE_ID_BYTES],
        }
    }

    /// Wraps bytes received from another rank.
    pub const fn from_bytes(bytes: [u8; NCCL_UNIQUE_ID_BYTES]) -> Self {
        Self { internal: bytes }
    }

    /// The bytes to send to the other ranks.
    pub const fn as_bytes(&self) -> &[u8; NCCL_UNIQUE_ID_BYTES] {
        &self.internal
    }
}

impl Default for ncclUniqueId {
    fn default() -> Self {
        Self::zeroed()
    }
}

impl fmt::Debug for ncclUniqueId {
    // The id is a credential for joining a communicator: never print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ncclUniqueId { .. }")
    }
}

/// Declares an open C enum: a transparent newtype with one associated const
/// per enumerator, each documented with the NCCL version that added it.
macro_rules! c_enum {
    (
        $(#[$meta:meta])*
        pub struct $name:ident($repr:ty);
        $(
            $(#[doc = $doc:literal])*
            since ($maj:literal, $min:literal);
            $konst:ident = $value:expr;
        )*
    ) => {
        $(#[$meta])*
        #[repr(transparent)]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub $repr);

        impl $name {
            $(
                $(#[doc = $doc])*
                #[doc = concat!("\n\nAdded in NCCL ", stringify!($maj), ".", stringify!($min), ".")]
                pub const $konst: $name = $name($value);
            )*

            /// Every enumerator with its C name and the version code of the
            /// release that added it, in declaration order
            /// (aliases and counts such as `ncclNumTypes` are separate consts).
            pub const VARIANTS: &'static [(&'static str, $name, u32)] =
                &[$((stringify!($konst), $name($value), $maj * 10000 + $min * 100)),*];

            /// The enumerator's C name, or `None` for a value this crate does
            /// not know (one from a newer library, or a dynamic op handle).
            /// Where C gives one value several names, the first is returned.
            pub const fn name(self) -> Option<&'static str> {
                $(
                    if self.0 == $value {
                        return Some(stringify!($konst));
                    }
                )*
                None
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.name() {
                    Some(name) => f.write_str(name),
                    None => write!(f, concat!(stringify!($name), "({})"), self.0),
                }
            }
        }
    };
}

c_enum! {
    /// Result code of every NCCL call (`ncclResult_t`).
    pub struct ncclResult_t(c_uint);
    /// The call succeeded.
    since (2, 0); ncclSuccess = 0;
    /// A CUDA call made by NCCL failed.
    since (2, 0); ncclUnhandledCudaError = 1;
    /// A system call failed (socket, memory, file).
    since (2, 0); ncclSystemError = 2;
    /// An internal NCCL check failed: a bug in NCCL or memory corruption.
    since (2, 0); ncclInternalError = 3;
    /// An argument was invalid.
    since (2, 0); ncclInvalidArgument = 4;
    /// The call was made in a state that does not allow it.
    since (2, 0); ncclInvalidUsage = 5;
    /// A remote peer failed or went away.
    since (2, 9); ncclRemoteError = 6;
    /// A nonblocking operation is still running; poll again.
    since (2, 14); ncclInProgress = 7;
    /// An operation timed out inside NCCL.
    since (2, 30); ncclTimeout = 8;
}

impl ncclResult_t {
    /// One past the largest result code of NCCL 2.32 (`ncclNumResults`).
    /// It was 8 before `ncclTimeout` (2.30); a newer library may return
    /// codes at or above it.
    pub const ncclNumResults: ncclResult_t = ncclResult_t(9);

    /// `true` for `ncclSuccess`.
    pub const fn is_success(self) -> bool {
        self.0 == Self::ncclSuccess.0
    }
}

c_enum! {
    /// Element type of a buffer (`ncclDataType_t`).
    pub struct ncclDataType_t(c_uint);
    /// Signed 8-bit integer (also `ncclChar`).
    since (2, 0); ncclInt8 = 0;
    /// Unsigned 8-bit integer.
    since (2, 0); ncclUint8 = 1;
    /// Signed 32-bit integer (also `ncclInt`).
    since (2, 0); ncclInt32 = 2;
    /// Unsigned 32-bit integer.
    since (2, 0); ncclUint32 = 3;
    /// Signed 64-bit integer.
    since (2, 0); ncclInt64 = 4;
    /// Unsigned 64-bit integer.
    since (2, 0); ncclUint64 = 5;
    /// IEEE 754 binary16 (also `ncclHalf`).
    since (2, 0); ncclFloat16 = 6;
    /// IEEE 754 binary32 (also `ncclFloat`).
    since (2, 0); ncclFloat32 = 7;
    /// IEEE 754 binary64 (also `ncclDouble`).
    since (2, 0); ncclFloat64 = 8;
    /// bfloat16. Headers before 2.24 declare it only when the CUDA toolkit
    /// has bf16 (`__CUDA_BF16_TYPES_EXIST__`, CUDA 11+); every library we
    /// support was built with it.
    since (2, 10); ncclBfloat16 = 9;
    /// 8-bit float, 4 exponent and 3 mantissa bits (OCP E4M3).
    since (2, 24); ncclFloat8e4m3 = 10;
    /// 8-bit float, 5 exponent and 2 mantissa bits (OCP E5M2).
    since (2, 24); ncclFloat8e5m2 = 11;
}

#[allow(non_upper_case_globals)]
impl ncclDataType_t {
    /// Alias of [`ncclDataType_t::ncclInt8`].
    pub const ncclChar: ncclDataType_t = ncclDataType_t::ncclInt8;
    /// Alias of [`ncclDataType_t::ncclInt32`].
    pub const ncclInt: ncclDataType_t = ncclDataType_t::ncclInt32;
    /// Alias of [`ncclDataType_t::ncclFloat16`].
    pub const ncclHalf: ncclDataType_t = ncclDataType_t::ncclFloat16;
    /// Alias of [`ncclDataType_t::ncclFloat32`].
    pub const ncclFloat: ncclDataType_t = ncclDataType_t::ncclFloat32;
    /// Alias of [`ncclDataType_t::ncclFloat64`].
    pub const ncclDouble: ncclDataType_t = ncclDataType_t::ncclFloat64;
    /// Number of types in NCCL 2.24 and later (12). It was 10 from 2.10 to
    /// 2.23 and 9 before bf16.
    pub const ncclNumTypes: ncclDataType_t = ncclDataType_t(12);

    /// Size of one element in bytes, or `None` for a type this crate does
    /// not know.
    pub const fn size_bytes(self) -> Option<usize> {
        match self.0 {
            0 | 1 | 10 | 11 => Some(1),
            6 | 9 => Some(2),
            2 | 3 | 7 => Some(4),
            4 | 5 | 8 => Some(8),
            _ => None,
        }
    }
}

c_enum! {
    /// Reduction operation (`ncclRedOp_t`). Values from
    /// [`ncclRedOp_t::ncclNumOps`] up to [`ncclRedOp_t::ncclMaxRedOp`] are
    /// handles that `ncclRedOpCreatePreMulSum` hands out at run time.
    pub struct ncclRedOp_t(c_uint);
    /// Sum.
    since (2, 0); ncclSum = 0;
    /// Product.
    since (2, 0); ncclProd = 1;
    /// Maximum.
    since (2, 0); ncclMax = 2;
    /// Minimum.
    since (2, 0); ncclMin = 3;
    /// Sum divided by the number of ranks.
    since (2, 10); ncclAvg = 4;
}

#[allow(non_upper_case_globals)]
impl ncclRedOp_t {
    /// Number of built-in ops, and the smallest value a dynamic op can have.
    pub const ncclNumOps: ncclRedOp_t = ncclRedOp_t(5);
    /// Largest valid op value: `0x7fffffff`, the largest signed value that
    /// keeps `sizeof(ncclRedOp_t)` at 4.
    pub const ncclMaxRedOp: ncclRedOp_t = ncclRedOp_t(0x7fff_ffff);

    /// `true` for a handle created at run time (PreMulSum), not a built-in.
    pub const fn is_dynamic(self) -> bool {
        self.0 >= Self::ncclNumOps.0
    }
}

c_enum! {
    /// Where a PreMulSum scalar lives and when NCCL reads it
    /// (`ncclScalarResidence_t`).
    pub struct ncclScalarResidence_t(c_uint);
    /// Device-visible memory, read while the collective runs.
    since (2, 11); ncclScalarDevice = 0;
    /// Host memory, read before `ncclRedOpCreatePreMulSum` returns.
    since (2, 11); ncclScalarHostImmediate = 1;
}

c_enum! {
    /// Memory statistic selector for `ncclCommMemStats` (`ncclCommMemStat_t`).
    pub struct ncclCommMemStat_t(c_uint);
    /// GPU memory that `ncclCommSuspend` can release, in bytes.
    since (2, 29); ncclStatGpuMemSuspend = 0;
    /// 1 while the communicator's memory is suspended, else 0.
    since (2, 29); ncclStatGpuMemSuspended = 1;
    /// GPU memory that cannot be suspended, in bytes.
    since (2, 29); ncclStatGpuMemPersist = 2;
    /// All GPU memory NCCL tracks for the communicator, in bytes.
    since (2, 29); ncclStatGpuMemTotal = 3;
}

c_enum! {
    /// Host-side CFT mode, the value of `ncclConfig_t::hostCftMode`
    /// (`ncclHostCftMode_t`). Signed: the default is `INT_MIN`.
    pub struct ncclHostCftMode_t(c_int);
    /// Library default (`NCCL_CONFIG_UNDEF_INT`).
    since (2, 31); ncclHostCftDefault = c_int::MIN;
    /// Enabled.
    since (2, 31); ncclHostCftEnable = 1;
    /// Disabled.
    since (2, 31); ncclHostCftDisable = 2;
    /// Enabled with fallback.
    since (2, 31); ncclHostCftFallback = 3;
}

c_enum! {
    /// Host NVLS component switches, the value of
    /// `ncclConfig_t::nvlsHostMode` (`ncclNvlsHostMode_t`). The
    /// `Disable*` flags may be or-ed together.
    pub struct ncclNvlsHostMode_t(c_int);
    /// Library default (`NCCL_CONFIG_UNDEF_INT`).
    since (2, 32); ncclNvlsHostModeDefault = c_int::MIN;
    /// Every host NVLS component on.
    since (2, 32); ncclNvlsHostModeEnable = 0;
    /// No NVLS transport and no NVLS registered-buffer optimisation.
    since (2, 32); ncclNvlsHostModeDisableTransport = 1;
    /// No multimem in internal symmetric kernels and copy-engine paths.
    since (2, 32); ncclNvlsHostModeDisableSymmetricMultimem = 2;
    /// Every present and future host NVLS component off.
    since (2, 32); ncclNvlsHostModeDisable = c_int::MAX;
}

c_enum! {
    /// Encryption of NCCL's TCP sockets, the value of
    /// `ncclEncryptionConfig_t::mode` (`ncclEncryptionMode_t`).
    pub struct ncclEncryptionMode_t(c_uint);
    /// Plaintext.
    since (2, 32); NCCL_ENCRYPTION_MODE_NONE = 0;
    /// Encrypted with a pre-shared key.
    since (2, 32); NCCL_ENCRYPTION_MODE_PSK = 1;
}

// ---- `#define` constants ----------------------------------------------------

/// Major version of the newest header these bindings follow.
pub const NCCL_MAJOR: u32 = 2;
/// Minor version of the newest header these bindings follow.
pub const NCCL_MINOR: u32 = 32;
/// Patch version of the newest header these bindings follow.
pub const NCCL_PATCH: u32 = 3;
/// `NCCL_VERSION_CODE` of the newest header these bindings follow.
pub const NCCL_VERSION_CODE: u32 = NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);

/// The header's `NCCL_VERSION(X, Y, Z)` macro: `X*1000 + Y*100 + Z` up to
/// 2.8, `X*10000 + Y*100 + Z` from 2.9 on.
#[allow(non_snake_case)]
pub const fn NCCL_VERSION(major: u32, minor: u32, patch: u32) -> u32 {
    if major <= 2 && minor <= 8 {
        major * 1000 + minor * 100 + patch
    } else {
        major * 10000 + minor * 100 + patch
    }
}

/// Marker for "not set" in integer config fields (`INT_MIN`).
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `color` for `ncclCommSplit` meaning "not part of any new communicator".
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;
/// Marker for "not set" in float fields (`-1.0f`). Added in NCCL 2.22.
pub const NCCL_UNDEF_FLOAT: f32 = -1.0;
/// Magic value every initialized config struct carries (`0xcafebeef`). The
/// name was added in NCCL 2.29; the value is in every initializer since 2.14.
pub const NCCL_API_MAGIC: c_uint = 0xcafe_beef;
/// Magic value of an initialized [`crate::ncclSimInfo_t`]. Added in NCCL 2.22.
pub const NCCL_SIM_INFO_MAGIC: c_uint = 0x7468_5283;

/// Window registration: default behaviour. Added in NCCL 2.27.
pub const NCCL_WIN_DEFAULT: c_int = 0x00;
/// Window registration: symmetric memory for collectives. Added in NCCL 2.27.
pub const NCCL_WIN_COLL_SYMMETRIC: c_int = 0x01;
/// Window registration: strict ordering. Added in NCCL 2.29.
pub const NCCL_WIN_STRICT_ORDERING: c_int = 0x02;
/// Window registration: GPU-initiated networking only. Added in NCCL 2.32.
pub const NCCL_WIN_GIN_ONLY: c_int = 0x04;
/// Window registration: CFT counted only. Added in NCCL 2.32.
pub const NCCL_WIN_CFT_COUNTED: c_int = 0x08;
/// Required alignment of a window's buffer in bytes. Added in NCCL 2.28.
pub const NCCL_WIN_REQUIRED_ALIGNMENT: usize = 4096;

/// CTA policy: library default. Added in NCCL 2.27.
pub const NCCL_CTA_POLICY_DEFAULT: c_int = 0x00;
/// CTA policy: favour efficiency. Added in NCCL 2.27.
pub const NCCL_CTA_POLICY_EFFICIENCY: c_int = 0x01;
/// CTA policy: zero CTAs where possible. Added in NCCL 2.28.
pub const NCCL_CTA_POLICY_ZERO: c_int = 0x02;

/// `ncclCommShrink` flag: shrink the parent. Added in NCCL 2.27.
pub const NCCL_SHRINK_DEFAULT: c_int = 0x00;
/// `ncclCommShrink` flag: abort the parent's operations first. Added in NCCL 2.27.
pub const NCCL_SHRINK_ABORT: c_int = 0x01;
/// `ncclCommRevoke` flags: the only valid value. Added in NCCL 2.28.7.
pub const NCCL_REVOKE_DEFAULT: c_int = 0x00;
/// `ncclCommSuspend` flag: release dynamic GPU memory. Added in NCCL 2.29.
pub const NCCL_SUSPEND_MEM: c_int = 0x01;
