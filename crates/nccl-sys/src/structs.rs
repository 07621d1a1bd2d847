//! The versioned structs and their initializers.
//!
//! `ncclConfig_t`, `ncclCollConfig_t`, `ncclSimInfo_t` and
//! `ncclEncryptionConfig_t` open with `size`, `magic` and `version`, and NCCL
//! only ever appends fields. They are laid out here as NCCL 2.32.3 has them.
//!
//! # Passing a struct to an older library
//!
//! NCCL reads `size` first and copies `min(size, its own sizeof)` bytes, so
//! an older library silently ignores fields it does not know. That is safe
//! for memory but loses settings without a word. The rule this crate follows
//! and the safe layer enforces:
//!
//! 1. start from [`ncclConfig_t::initializer_for`] (or the `ncclCollConfig_t`
//!    twin) with the loaded library's version code: `size` becomes the size
//!    that version's header has and `version` that version's code;
//! 2. set only fields whose [`ConfigField::since`] is at or below the loaded
//!    version ([`ncclConfig_t::field_known`] answers that); anything newer
//!    would be dropped by the library.
//!
//! ```
//! use nccl_sys::{Version, ncclConfig_t};
//!
//! // What `Nccl::version()` reported, say the 2.28.9 of our GPU hosts.
//! let loaded = Version::new(2, 28, 9).code();
//! let mut config = ncclConfig_t::initializer_for(loaded);
//! assert_eq!(config.version, 22809);
//! // The 2.28 header's struct ends after `nvlinkCentricSched`.
//! assert_eq!(config.size, core::mem::offset_of!(ncclConfig_t, graphUsageMode));
//!
//! assert_eq!(ncclConfig_t::field_known("blocking", loaded), Some(true));
//! config.blocking = 0;
//! // `graphUsageMode` arrived in 2.29: 2.28.9 would ignore it, so don't set it.
//! assert_eq!(ncclConfig_t::field_known("graphUsageMode", loaded), Some(false));
//! assert_eq!(ncclConfig_t::field_known("noSuchField", loaded), None);
//! ```

use core::ffi::{c_char, c_int, c_uint, c_void};
use core::mem::{align_of, offset_of, size_of};

use crate::types::{
    NCCL_API_MAGIC, NCCL_CONFIG_UNDEF_INT, NCCL_SIM_INFO_MAGIC, NCCL_UNDEF_FLOAT,
    NCCL_VERSION_CODE, cudaEvent_t, ncclEncryptionMode_t,
};

/// One field of a versioned struct: its C name, the version code of the
/// first NCCL that has it, and its byte offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigField {
    /// The field's C name.
    pub name: &'static str,
    /// `NCCL_VERSION_CODE` of the first release whose header has the field.
    pub since: u32,
    /// Byte offset in the 2.32.3 layout (prefixes never move).
    pub offset: usize,
}

const fn round_up(n: usize, align: usize) -> usize {
    n.div_ceil(align) * align
}

/// Size a versioned struct has in the header of `version`: the end of the
/// last field that version knows, rounded up to the struct's alignment.
const fn size_for(fields: &[ConfigField], full_size: usize, align: usize, version: u32) -> usize {
    let mut i = 0;
    while i < fields.len() {
        if fields[i].since > version {
            return round_up(fields[i].offset, align);
        }
        i += 1;
    }
    full_size
}

const fn known(fields: &[ConfigField], name: &str, version: u32) -> Option<bool> {
    let mut i = 0;
    while i < fields.len() {
        if str_eq(fields[i].name, name) {
            return Some(fields[i].since <= version);
        }
        i += 1;
    }
    None
}

const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn min_u32(a: u32, b: u32) -> u32 {
    if a < b { a } else { b }
}

macro_rules! field {
    ($ty:ty, $name:ident, $since:expr) => {
        ConfigField {
            name: stringify!($name),
            since: $since,
            offset: offset_of!($ty, $name),
        }
    };
}

/// Communicator configuration (`ncclConfig_t`, C tag `ncclConfig_v23100`),
/// passed to `ncclCommInitRankConfig`, `ncclCommSplit`, `ncclCommShrink`,
/// `ncclCommGrow` and `ncclCommInitRankScalable`. Added in NCCL 2.14; every
/// field after `splitShare` came later (see [`ncclConfig_t::FIELDS`]).
///
/// Integer fields left at [`NCCL_CONFIG_UNDEF_INT`] and pointers left null
/// mean "library default". Build one with [`ncclConfig_t::initializer`] or
/// [`ncclConfig_t::initializer_for`]; NCCL rejects a struct whose `magic`
/// was not set by an initializer.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_snake_case)]
pub struct ncclConfig_t {
    /// `sizeof` as the caller's header had it; do not touch.
    pub size: usize,
    /// [`NCCL_API_MAGIC`]; do not touch.
    pub magic: c_uint,
    /// `NCCL_VERSION_CODE` of the caller's header; do not touch.
    pub version: c_uint,
    /// 1: calls block until done; 0: nonblocking, poll `ncclCommGetAsyncError`.
    pub blocking: c_int,
    /// CUDA thread-block cluster size (Hopper and later).
    pub cgaClusterSize: c_int,
    /// Lower bound on CTAs (channels) per collective.
    pub minCTAs: c_int,
    /// Upper bound on CTAs (channels) per collective.
    pub maxCTAs: c_int,
    /// Network plugin to use, by name.
    pub netName: *const c_char,
    /// 1: a split child shares its parent's resources.
    pub splitShare: c_int,
    /// Traffic class for network QoS. Added in NCCL 2.26.
    pub trafficClass: c_int,
    /// Name shown in logs and profilers. Added in NCCL 2.27.
    pub commName: *const c_char,
    /// 1: use CollNet. Added in NCCL 2.27.
    pub collnetEnable: c_int,
    /// `NCCL_CTA_POLICY_*` bitmask. Added in NCCL 2.27.
    pub CTAPolicy: c_int,
    /// 1: a shrunk child shares its parent's resources. Added in NCCL 2.27.
    pub shrinkShare: c_int,
    /// CTAs for NVLS algorithms. Added in NCCL 2.27.
    pub nvlsCTAs: c_int,
    /// Channels per network peer. Added in NCCL 2.28.
    pub nChannelsPerNetPeer: c_int,
    /// NVLink-centric scheduling. Added in NCCL 2.28.
    pub nvlinkCentricSched: c_int,
    /// How the communicator is used with CUDA graphs. Added in NCCL 2.29.
    pub graphUsageMode: c_int,
    /// Number of RMA contexts. Added in NCCL 2.29.
    pub numRmaCtx: c_int,
    /// Maximum number of P2P peers. Added in NCCL 2.30.
    pub maxP2pPeers: c_int,
    /// Stream ordering of graph launches. Added in NCCL 2.30.
    pub graphStreamOrdering: c_int,
    /// Implicit launch ordering. Added in NCCL 2.31.
    pub launchOrderImplicit: c_int,
    /// Number of RMA signals. Added in NCCL 2.31.
    pub numRmaSig: c_int,
    /// Eager RMA initialisation. Added in NCCL 2.31.
    pub rmaEagerInit: c_int,
    /// A [`crate::ncclHostCftMode_t`] value. Added in NCCL 2.31.
    pub hostCftMode: c_int,
    /// A [`crate::ncclNvlsHostMode_t`] value. Added in NCCL 2.32.
    pub nvlsHostMode: c_int,
}

const V2_14: u32 = 21400;

impl ncclConfig_t {
    /// Every field with the version that added it, in layout order.
    pub const FIELDS: &'static [ConfigField] = &[
        field!(Self, size, V2_14),
        field!(Self, magic, V2_14),
        field!(Self, version, V2_14),
        field!(Self, blocking, V2_14),
        field!(Self, cgaClusterSize, 21700),
        field!(Self, minCTAs, 21700),
        field!(Self, maxCTAs, 21700),
        field!(Self, netName, 21700),
        field!(Self, splitShare, 21800),
        field!(Self, trafficClass, 22600),
        field!(Self, commName, 22700),
        field!(Self, collnetEnable, 22700),
        field!(Self, CTAPolicy, 22700),
        field!(Self, shrinkShare, 22700),
        field!(Self, nvlsCTAs, 22700),
        field!(Self, nChannelsPerNetPeer, 22800),
        field!(Self, nvlinkCentricSched, 22800),
        field!(Self, graphUsageMode, 22900),
        field!(Self, numRmaCtx, 22900),
        field!(Self, maxP2pPeers, 23000),
        field!(Self, graphStreamOrdering, 23000),
        field!(Self, launchOrderImplicit, 23100),
        field!(Self, numRmaSig, 23100),
        field!(Self, rmaEagerInit, 23100),
        field!(Self, hostCftMode, 23100),
        field!(Self, nvlsHostMode, 23200),
    ];

    /// `NCCL_CONFIG_INITIALIZER` of the 2.32.3 header.
    pub const fn initializer() -> Self {
        Self::initializer_for(NCCL_VERSION_CODE)
    }

    /// The initializer as the header of `version` (a version code such as
    /// `22809`) would write it: `size` is that header's `sizeof`, `version`
    /// is `version` (capped at 2.32.3), every other field is unset. A
    /// library of that version reads exactly the fields it knows.
    pub const fn initializer_for(version: u32) -> Self {
        Self {
            size: Self::size_for_version(version),
            magic: NCCL_API_MAGIC,
            version: min_u32(version, NCCL_VERSION_CODE),
            blocking: NCCL_CONFIG_UNDEF_INT,
            cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
            minCTAs: NCCL_CONFIG_UNDEF_INT,
            maxCTAs: NCCL_CONFIG_UNDEF_INT,
            netName: core::ptr::null(),
            splitShare: NCCL_CONFIG_UNDEF_INT,
            trafficClass: NCCL_CONFIG_UNDEF_INT,
            commName: core::ptr::null(),
            collnetEnable: NCCL_CONFIG_UNDEF_INT,
            CTAPolicy: NCCL_CONFIG_UNDEF_INT,
            shrinkShare: NCCL_CONFIG_UNDEF_INT,
            nvlsCTAs: NCCL_CONFIG_UNDEF_INT,
            nChannelsPerNetPeer: NCCL_CONFIG_UNDEF_INT,
            nvlinkCentricSched: NCCL_CONFIG_UNDEF_INT,
            graphUsageMode: NCCL_CONFIG_UNDEF_INT,
            numRmaCtx: NCCL_CONFIG_UNDEF_INT,
            maxP2pPeers: NCCL_CONFIG_UNDEF_INT,
            graphStreamOrdering: NCCL_CONFIG_UNDEF_INT,
            launchOrderImplicit: NCCL_CONFIG_UNDEF_INT,
            numRmaSig: NCCL_CONFIG_UNDEF_INT,
            rmaEagerInit: NCCL_CONFIG_UNDEF_INT,
            hostCftMode: NCCL_CONFIG_UNDEF_INT,
            nvlsHostMode: NCCL_CONFIG_UNDEF_INT,
        }
    }

    /// `sizeof(ncclConfig_t)` in the header of `version`.
    pub const fn size_for_version(version: u32) -> usize {
        size_for(Self::FIELDS, size_of::<Self>(), align_of::<Self>(), version)
    }

    /// Whether a library of `version` reads field `name`; `None` if there is
    /// no such field.
    pub const fn field_known(name: &str, version: u32) -> Option<bool> {
        known(Self::FIELDS, name, version)
    }
}

impl Default for ncclConfig_t {
    fn default() -> Self {
        Self::initializer()
    }
}

/// Key of a vendor extension option (the anonymous `key` struct of
/// `ncclConfigExt_t`). Added in NCCL 2.31.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_snake_case)]
pub struct ncclConfigExtKey {
    /// The vendor's own non-zero id, below 2^24.
    pub vendorId: c_int,
    /// Vendor-defined option id.
    pub optionId: c_int,
}

/// Value of a vendor extension option (the anonymous `val` union of
/// `ncclConfigExt_t`). Added in NCCL 2.31.
#[repr(C)]
#[derive(Clone, Copy)]
pub union ncclConfigExtValue {
    /// Integer value.
    pub i: c_int,
    /// C string value.
    pub s: *const c_char,
    /// Opaque pointer-sized value.
    pub raw: *mut c_void,
}

/// A vendor-specific option in a null-terminated list hung off
/// [`ncclCollConfig_t::ext`] (`ncclConfigExt_t`). The official library
/// ignores every extension. Added in NCCL 2.31.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclConfigExt_t {
    /// Next option, or null.
    pub next: *mut ncclConfigExt_t,
    /// Which option this is.
    pub key: ncclConfigExtKey,
    /// The option's value.
    pub val: ncclConfigExtValue,
}

/// Per-collective configuration taken by the `nccl*Config` collectives
/// (`ncclCollConfig_t`, C tag `ncclCollConfig_v23200`). Added in NCCL 2.31;
/// `launchCompletionEvent` in 2.32. Must be set identically on every rank.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_snake_case)]
pub struct ncclCollConfig_t {
    /// `sizeof` as the caller's header had it; do not touch.
    pub size: usize,
    /// [`NCCL_API_MAGIC`]; do not touch.
    pub magic: c_uint,
    /// `NCCL_VERSION_CODE` of the caller's header; do not touch.
    pub version: c_uint,
    /// Vendor extension list, or null.
    pub ext: *mut ncclConfigExt_t,
    /// Lower bound on CTAs for this call.
    pub minCTAs: c_int,
    /// Upper bound on CTAs for this call; at most the communicator's.
    pub maxCTAs: c_int,
    /// Cap on NVLS channels for this call.
    pub nvlsCTAs: c_int,
    /// Thread-block cluster size; keep it equal within a group.
    pub cgaClusterSize: c_int,
    /// Algorithm selection string; null or empty means automatic.
    pub algSelection: *const c_char,
    /// 1 (default): an unsatisfiable selection is an error.
    pub forceAlgSelection: c_int,
    /// `NCCL_CTA_POLICY_*` bitmask; unset inherits the communicator's.
    pub CTAPolicy: c_int,
    /// Opaque tag handed to profiler plugins; values with the top bit set
    /// are reserved by NCCL.
    pub userProfilerTag: u64,
    /// Caller-owned event recorded when the kernel launch completes, or
    /// null. Added in NCCL 2.32.
    pub launchCompletionEvent: cudaEvent_t,
}

impl ncclCollConfig_t {
    /// Every field with the version that added it, in layout order.
    pub const FIELDS: &'static [ConfigField] = &[
        field!(Self, size, 23100),
        field!(Self, magic, 23100),
        field!(Self, version, 23100),
        field!(Self, ext, 23100),
        field!(Self, minCTAs, 23100),
        field!(Self, maxCTAs, 23100),
        field!(Self, nvlsCTAs, 23100),
        field!(Self, cgaClusterSize, 23100),
        field!(Self, algSelection, 23100),
        field!(Self, forceAlgSelection, 23100),
        field!(Self, CTAPolicy, 23100),
        field!(Self, userProfilerTag, 23100),
        field!(Self, launchCompletionEvent, 23200),
    ];

    /// `NCCL_COLLCONFIG_INITIALIZER` of the 2.32.3 header.
    pub const fn initializer() -> Self {
        Self::initializer_for(NCCL_VERSION_CODE)
    }

    /// The initializer as the header of `version` writes it (see
    /// [`ncclConfig_t::initializer_for`]).
    pub const fn initializer_for(version: u32) -> Self {
        Self {
            size: Self::size_for_version(version),
            magic: NCCL_API_MAGIC,
            version: min_u32(version, NCCL_VERSION_CODE),
            ext: core::ptr::null_mut(),
            minCTAs: NCCL_CONFIG_UNDEF_INT,
            maxCTAs: NCCL_CONFIG_UNDEF_INT,
            nvlsCTAs: NCCL_CONFIG_UNDEF_INT,
            cgaClusterSize: NCCL_CONFIG_UNDEF_INT,
            algSelection: core::ptr::null(),
            forceAlgSelection: 1,
            CTAPolicy: NCCL_CONFIG_UNDEF_INT,
            userProfilerTag: 0,
            launchCompletionEvent: core::ptr::null_mut(),
        }
    }

    /// `sizeof(ncclCollConfig_t)` in the header of `version`.
    pub const fn size_for_version(version: u32) -> usize {
        size_for(Self::FIELDS, size_of::<Self>(), align_of::<Self>(), version)
    }

    /// Whether a library of `version` reads field `name`; `None` if there is
    /// no such field.
    pub const fn field_known(name: &str, version: u32) -> Option<bool> {
        known(Self::FIELDS, name, version)
    }
}

impl Default for ncclCollConfig_t {
    fn default() -> Self {
        Self::initializer()
    }
}

/// Result of `ncclGroupSimulateEnd` (`ncclSimInfo_t`, C tag
/// `ncclSimInfo_v22200`). Added in NCCL 2.22.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
#[allow(non_snake_case)]
pub struct ncclSimInfo_t {
    /// `sizeof`; do not touch.
    pub size: usize,
    /// [`NCCL_SIM_INFO_MAGIC`]; do not touch.
    pub magic: c_uint,
    /// Version code of the caller's header; do not touch.
    pub version: c_uint,
    /// Estimated time of the simulated group, in microseconds;
    /// [`NCCL_UNDEF_FLOAT`] until NCCL fills it.
    pub estimatedTime: f32,
}

impl ncclSimInfo_t {
    /// `NCCL_SIM_INFO_INITIALIZER` of the 2.32.3 header. The struct has not
    /// changed since 2.22, so every supporting library accepts it.
    pub const fn initializer() -> Self {
        Self {
            size: size_of::<Self>(),
            magic: NCCL_SIM_INFO_MAGIC,
            version: NCCL_VERSION_CODE,
            estimatedTime: NCCL_UNDEF_FLOAT,
        }
    }
}

impl Default for ncclSimInfo_t {
    fn default() -> Self {
        Self::initializer()
    }
}

/// Socket encryption settings for `ncclSetEncryption`
/// (`ncclEncryptionConfig_t`, C tag `ncclEncryptionConfig_v23200`). Added
/// in NCCL 2.32.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ncclEncryptionConfig_t {
    /// `sizeof`; do not touch.
    pub size: usize,
    /// [`NCCL_API_MAGIC`]; do not touch.
    pub magic: c_uint,
    /// Version code of the caller's header; do not touch.
    pub version: c_uint,
    /// An [`ncclEncryptionMode_t`] value.
    pub mode: c_int,
    /// Pre-shared key as a C string, or null.
    pub psk: *const c_char,
}

impl ncclEncryptionConfig_t {
    /// `NCCL_ENCRYPTION_CONFIG_INITIALIZER` of the 2.32.3 header (mode none,
    /// no key).
    pub const fn initializer() -> Self {
        Self {
            size: size_of::<Self>(),
            magic: NCCL_API_MAGIC,
            version: NCCL_VERSION_CODE,
            mode: ncclEncryptionMode_t::NCCL_ENCRYPTION_MODE_NONE.0 as c_int,
            psk: core::ptr::null(),
        }
    }
}

impl Default for ncclEncryptionConfig_t {
    fn default() -> Self {
        Self::initializer()
    }
}

/// How many signals to wait for from one peer, for `ncclWaitSignal`
/// (`ncclWaitSignalDesc_t`). Added in NCCL 2.29.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[allow(non_snake_case)]
pub struct ncclWaitSignalDesc_t {
    /// Number of signal operations to wait for.
    pub opCnt: c_int,
    /// Rank the signals come from.
    pub peer: c_int,
    /// Signal index.
    pub sigIdx: c_int,
    /// Context id.
    pub ctx: c_int,
}
