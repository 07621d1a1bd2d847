//! The 72 public host functions of NCCL 2.32.3, declared by hand.
//!
//! Each function appears once, in the `nccl_functions!` list below, with its
//! doc comment and the release that added it. From that one list come:
//!
//! - a function-pointer type `PFN_<name>` per function, which the tests in
//!   `tests/reference.rs` assign to bindgen's type for the same function in
//!   every pinned header (a mismatch does not compile);
//! - the [`Symbol`] enum: every name, with the version that added it;
//! - the lazily resolved, per-symbol table behind [`crate::Nccl`]'s accessor
//!   methods (`nccl.ncclAllReduce()` returns the function pointer, or
//!   [`SymbolError`] when the loaded library lacks it).
//!
//! "Added in 2.18" means "present in 2.18.3, the oldest release these
//! bindings support"; the function may be older. Later versions are the
//! first release whose header declares the function.
//!
//! Left out on purpose: `ncclResetDebugInit` (the header marks it deprecated
//! and "not supported as part of the NCCL API") and the `pnccl*` profiling
//! aliases (same signatures, meant for tools that interpose on NCCL).

use core::ffi::{c_char, c_int, c_uint, c_void};

use crate::structs::{
    ncclCollConfig_t, ncclConfig_t, ncclEncryptionConfig_t, ncclSimInfo_t, ncclWaitSignalDesc_t,
};
use crate::types::{
    cudaStream_t, ncclComm_t, ncclCommMemStat_t, ncclDataType_t, ncclParamHandle_t, ncclRedOp_t,
    ncclResult_t, ncclScalarResidence_t, ncclUniqueId, ncclWindow_t,
};
use crate::version::Version;

macro_rules! nccl_functions {
    (
        $(
            $(#[doc = $doc:literal])*
            since ($maj:literal, $min:literal $(, $patch:literal)?);
            fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) $(-> $ret:ty)?;
        )*
    ) => {
        pfn_module! {
            $(
                $(#[doc = $doc])*
                #[doc = concat!("\n\nAdded in NCCL ", stringify!($maj), ".", stringify!($min) $(, ".", stringify!($patch))?, ".")]
                pub type $name = unsafe extern "C" fn($($arg: $ty),*) $(-> $ret)?;
            )*
        }

        /// Every public host function of NCCL 2.32.3, by name.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        pub enum Symbol {
            $(
                #[doc = concat!("`", stringify!($name), "`")]
                $name,
            )*
        }

        impl Symbol {
            /// All symbols, in declaration order.
            pub const ALL: &'static [Symbol] = &[$(Symbol::$name),*];

            /// The C name.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Symbol::$name => stringify!($name),)*
                }
            }

            /// The C name as a nul-terminated byte string, for `dlsym`.
            pub(crate) const fn c_name(self) -> &'static [u8] {
                match self {
                    $(Symbol::$name => concat!(stringify!($name), "\0").as_bytes(),)*
                }
            }

            /// `NCCL_VERSION_CODE` of the first release that has the
            /// function (21800 for the 2.18 baseline). Patch-exact where a
            /// function arrived in a patch release (`ncclCommRevoke`: 2.28.7).
            pub const fn since(self) -> u32 {
                match self {
                    $(Symbol::$name => $maj * 10000 + $min * 100 $(+ $patch)?,)*
                }
            }

            /// Looks a symbol up by its C name.
            pub fn from_name(name: &str) -> Option<Symbol> {
                Symbol::ALL.iter().copied().find(|s| s.name() == name)
            }
        }

        /// Resolved addresses, one slot per symbol, filled on first use.
        pub(crate) struct FunctionTable {
            slots: [std::sync::OnceLock<Option<usize>>; Symbol::ALL.len()],
        }

        impl FunctionTable {
            pub(crate) fn new() -> Self {
                Self { slots: [const { std::sync::OnceLock::new() }; Symbol::ALL.len()] }
            }

            pub(crate) fn slot(&self, symbol: Symbol) -> &std::sync::OnceLock<Option<usize>> {
                &self.slots[symbol as usize]
            }
        }

        impl Nccl {
            $(
                #[doc = concat!("`", stringify!($name), "`, resolved on first call.")]
                #[doc = ""]
                #[doc = concat!("Added in NCCL ", stringify!($maj), ".", stringify!($min) $(, ".", stringify!($patch))?, ".")]
                #[doc = "Returns [`SymbolError`] when the loaded library lacks it."]
                #[allow(non_snake_case)]
                pub fn $name(&self) -> Result<pfn::$name, SymbolError> {
                    let address = self.resolve(Symbol::$name)?;
                    // SAFETY: `address` is the non-null address `dlsym`
                    // returned for this exact C name in the loaded library,
                    // and `pfn::$name` is that function's signature, checked
                    // against bindgen's output for every pinned header.
                    // `usize` and function pointers have the same size.
                    Ok(unsafe { core::mem::transmute::<usize, pfn::$name>(address) })
                }
            )*
        }
    };
}

// The function-pointer types live in their own module so that their names
// (the C names) do not clash with the accessor methods' docs.
macro_rules! pfn_module {
    ($($item:item)*) => {
        /// Function-pointer types, one per NCCL host function, named as in C.
        #[allow(non_camel_case_types)]
        pub mod pfn {
            #[allow(unused_imports)]
            use super::*;
            $($item)*
        }
    };
}

nccl_functions! {
    // ---- Library and ids ---------------------------------------------------

    /// Writes the library's `NCCL_VERSION_CODE` to `*version`.
    since (2, 18); fn ncclGetVersion(version: *mut c_int) -> ncclResult_t;
    /// Fills `*uniqueId` with a new id for `ncclCommInitRank`; call once and
    /// share the id with every rank.
    since (2, 18); fn ncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t;
    /// Returns a static string describing `result`.
    since (2, 18); fn ncclGetErrorString(result: ncclResult_t) -> *const c_char;
    /// Returns a message describing the last error on `comm` (or, with a
    /// null `comm`, the calling thread's last error).
    since (2, 18); fn ncclGetLastError(comm: ncclComm_t) -> *const c_char;

    // ---- Memory -----------------------------------------------------------

    /// Allocates `size` bytes of device memory suited to every NCCL
    /// optimisation (registration, NVLS); the allocation may be larger.
    since (2, 19); fn ncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> ncclResult_t;
    /// Frees memory from `ncclMemAlloc`.
    since (2, 19); fn ncclMemFree(ptr: *mut c_void) -> ncclResult_t;

    // ---- Communicator creation -------------------------------------------

    /// Creates the communicator of rank `rank` among `nranks`; every rank
    /// passes the same `commId`. Uses the current CUDA device.
    since (2, 18); fn ncclCommInitRank(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int) -> ncclResult_t;
    /// As `ncclCommInitRank`, with a configuration (null for defaults).
    since (2, 18); fn ncclCommInitRankConfig(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int, config: *mut ncclConfig_t) -> ncclResult_t;
    /// Creates `ndev` communicators in one process, one per device of
    /// `devlist` (null: devices `0..ndev`), into the array `comm`.
    since (2, 18); fn ncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t;
    /// As `ncclCommInitRankConfig`, with `nId` ids (the same on every rank)
    /// to spread the bootstrap.
    since (2, 23); fn ncclCommInitRankScalable(newcomm: *mut ncclComm_t, nranks: c_int, myrank: c_int, nId: c_int, commIds: *mut ncclUniqueId, config: *mut ncclConfig_t) -> ncclResult_t;
    /// Splits `comm` by `color` (ordered by `key`); `NCCL_SPLIT_NOCOLOR`
    /// gives a null `*newcomm`. Null `config` inherits the parent's.
    since (2, 18); fn ncclCommSplit(comm: ncclComm_t, color: c_int, key: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t;
    /// Creates a communicator without the ranks in `excludeRanksList`;
    /// `shrinkFlags` is an `NCCL_SHRINK_*` value.
    since (2, 27); fn ncclCommShrink(comm: ncclComm_t, excludeRanksList: *mut c_int, excludeRanksCount: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t, shrinkFlags: c_int) -> ncclResult_t;
    /// Creates a per-communicator id for `ncclCommGrow` (one unconsumed id
    /// at a time).
    since (2, 29); fn ncclCommGetUniqueId(comm: ncclComm_t, uniqueId: *mut ncclUniqueId) -> ncclResult_t;
    /// Grows a communicator to `nRanks`: existing ranks pass `comm` and
    /// `rank = -1` (the root also the id), new ranks a null `comm`, the id
    /// and their rank.
    since (2, 29); fn ncclCommGrow(comm: ncclComm_t, nRanks: c_int, uniqueId: *const ncclUniqueId, rank: c_int, newcomm: *mut ncclComm_t, config: *mut ncclConfig_t) -> ncclResult_t;

    // ---- Communicator teardown and state ----------------------------------

    /// Flushes outstanding work and starts a collective teardown; the
    /// communicator reports `ncclInProgress` until it is quiescent.
    since (2, 18); fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t;
    /// Frees the communicator's local resources.
    since (2, 18); fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t;
    /// Aborts outstanding operations and frees the communicator.
    since (2, 18); fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t;
    /// Stops in-flight operations so that destroy, split or shrink can
    /// proceed; `revokeFlags` must be `NCCL_REVOKE_DEFAULT`.
    since (2, 28, 7); fn ncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t;
    /// Releases resources (`NCCL_SUSPEND_MEM`: dynamic GPU memory) until
    /// `ncclCommResume`; the communicator cannot be used meanwhile.
    since (2, 29); fn ncclCommSuspend(comm: ncclComm_t, flags: c_int) -> ncclResult_t;
    /// Restores what `ncclCommSuspend` released.
    since (2, 29); fn ncclCommResume(comm: ncclComm_t) -> ncclResult_t;
    /// Reads one memory statistic of the communicator.
    since (2, 29); fn ncclCommMemStats(comm: ncclComm_t, stat: ncclCommMemStat_t, value: *mut u64) -> ncclResult_t;
    /// Writes the communicator's asynchronous error state (or
    /// `ncclInProgress` while a nonblocking call runs) to `*asyncError`.
    since (2, 18); fn ncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t;
    /// Writes the number of ranks to `*count`.
    since (2, 18); fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t;
    /// Writes the communicator's CUDA device to `*device`.
    since (2, 18); fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t;
    /// Writes the caller's rank to `*rank`.
    since (2, 18); fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t;

    // ---- Registration and windows -------------------------------------------

    /// Registers `size` bytes at `buff` for zero-copy use; writes a handle.
    since (2, 19); fn ncclCommRegister(comm: ncclComm_t, buff: *mut c_void, size: usize, handle: *mut *mut c_void) -> ncclResult_t;
    /// Releases a handle from `ncclCommRegister`.
    since (2, 19); fn ncclCommDeregister(comm: ncclComm_t, handle: *mut c_void) -> ncclResult_t;
    /// Collectively registers a memory window (`NCCL_WIN_*` flags).
    since (2, 27); fn ncclCommWindowRegister(comm: ncclComm_t, buff: *mut c_void, size: usize, win: *mut ncclWindow_t, winFlags: c_int) -> ncclResult_t;
    /// Collectively deregisters a window.
    since (2, 27); fn ncclCommWindowDeregister(comm: ncclComm_t, win: ncclWindow_t) -> ncclResult_t;
    /// Writes the user pointer a window was registered with.
    since (2, 29); fn ncclWinGetUserPtr(comm: ncclComm_t, win: ncclWindow_t, outUserPtr: *mut *mut c_void) -> ncclResult_t;

    // ---- Reduction operators ----------------------------------------------

    /// Creates an op that multiplies each input by `*scalar` before summing,
    /// for `comm` and `datatype` only.
    since (2, 18); fn ncclRedOpCreatePreMulSum(op: *mut ncclRedOp_t, scalar: *mut c_void, datatype: ncclDataType_t, residence: ncclScalarResidence_t, comm: ncclComm_t) -> ncclResult_t;
    /// Destroys an op from `ncclRedOpCreatePreMulSum`.
    since (2, 18); fn ncclRedOpDestroy(op: ncclRedOp_t, comm: ncclComm_t) -> ncclResult_t;

    // ---- Collectives --------------------------------------------------------

    /// Reduces `count` elements onto `root`'s `recvbuff`; in place when
    /// `sendbuff == recvbuff`.
    since (2, 18); fn ncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// In-place broadcast from `root` (deprecated in favour of
    /// `ncclBroadcast`).
    since (2, 18); fn ncclBcast(buff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Copies `count` elements from `root` to every rank.
    since (2, 18); fn ncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Reduces `count` elements and leaves the result on every rank.
    since (2, 18); fn ncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Reduces `nranks * recvcount` elements; rank i keeps block i. In
    /// place when `recvbuff == sendbuff + rank * recvcount`.
    since (2, 18); fn ncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Gathers `sendcount` elements from every rank, rank i's at offset
    /// `i * sendcount`. In place when `sendbuff == recvbuff + rank * sendcount`.
    since (2, 18); fn ncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Sends block j (`count` elements) to rank j and receives rank i's
    /// block at offset `i * count`.
    since (2, 28); fn ncclAlltoAll(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Gathers `count` elements from every rank onto `root`.
    since (2, 28); fn ncclGather(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Sends block i of `root`'s buffer to rank i.
    since (2, 28); fn ncclScatter(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;

    // ---- Collectives with a per-call configuration (null config = plain) ----

    /// `ncclAllReduce` with a per-call configuration.
    since (2, 31); fn ncclAllReduceConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t;
    /// `ncclBroadcast` with a per-call configuration.
    since (2, 31); fn ncclBroadcastConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t;
    /// `ncclReduce` with a per-call configuration.
    since (2, 31); fn ncclReduceConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t;
    /// `ncclAllGather` with a per-call configuration.
    since (2, 31); fn ncclAllGatherConfig(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t;
    /// `ncclReduceScatter` with a per-call configuration.
    since (2, 31); fn ncclReduceScatterConfig(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t;
    /// `ncclAlltoAll` with a per-call configuration.
    since (2, 31); fn ncclAlltoAllConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t;
    /// `ncclGather` with a per-call configuration.
    since (2, 31); fn ncclGatherConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t;
    /// `ncclScatter` with a per-call configuration.
    since (2, 31); fn ncclScatterConfig(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t, config: *const ncclCollConfig_t) -> ncclResult_t;

    // ---- Point to point and one-sided ----------------------------------------

    /// Sends `count` elements to `peer`, which must post a matching recv.
    since (2, 18); fn ncclSend(sendbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Receives `count` elements from `peer`.
    since (2, 18); fn ncclRecv(recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Writes `count` elements into `peer`'s window `peerWin` at byte
    /// offset `peerWinOffset`, then raises signal `sigIdx` in context `ctx`.
    since (2, 29); fn ncclPutSignal(localbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int, peerWin: ncclWindow_t, peerWinOffset: usize, sigIdx: c_int, ctx: c_int, flags: c_uint, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Raises signal `sigIdx` in context `ctx` on `peer` without data.
    since (2, 29); fn ncclSignal(peer: c_int, sigIdx: c_int, ctx: c_int, flags: c_uint, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    /// Waits on the stream for the signals the `nDesc` descriptors describe.
    since (2, 29); fn ncclWaitSignal(nDesc: c_int, signalDescs: *mut ncclWaitSignalDesc_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;

    // ---- Groups -------------------------------------------------------------

    /// Opens a group: calls until `ncclGroupEnd` are fused.
    since (2, 18); fn ncclGroupStart() -> ncclResult_t;
    /// Closes a group and launches what it holds.
    since (2, 18); fn ncclGroupEnd() -> ncclResult_t;
    /// Closes a group without launching it and writes NCCL's estimate.
    since (2, 22); fn ncclGroupSimulateEnd(simInfo: *mut ncclSimInfo_t) -> ncclResult_t;

    // ---- Encryption ---------------------------------------------------------

    /// Sets process-wide encryption of NCCL's TCP sockets; call before
    /// creating communicators.
    since (2, 32); fn ncclSetEncryption(config: *const ncclEncryptionConfig_t) -> ncclResult_t;

    // ---- Runtime parameters -------------------------------------------------

    /// Binds `*out` to the parameter named `key` (owned by NCCL).
    since (2, 30); fn ncclParamBind(out: *mut ncclParamHandle_t, key: *const c_char) -> ncclResult_t;
    /// Reads a bound parameter as `int8_t`.
    since (2, 30); fn ncclParamGetI8(h: ncclParamHandle_t, out: *mut i8) -> ncclResult_t;
    /// Reads a bound parameter as `int16_t`.
    since (2, 30); fn ncclParamGetI16(h: ncclParamHandle_t, out: *mut i16) -> ncclResult_t;
    /// Reads a bound parameter as `int32_t`.
    since (2, 30); fn ncclParamGetI32(h: ncclParamHandle_t, out: *mut i32) -> ncclResult_t;
    /// Reads a bound parameter as `int64_t`.
    since (2, 30); fn ncclParamGetI64(h: ncclParamHandle_t, out: *mut i64) -> ncclResult_t;
    /// Reads a bound parameter as `uint8_t`.
    since (2, 30); fn ncclParamGetU8(h: ncclParamHandle_t, out: *mut u8) -> ncclResult_t;
    /// Reads a bound parameter as `uint16_t`.
    since (2, 30); fn ncclParamGetU16(h: ncclParamHandle_t, out: *mut u16) -> ncclResult_t;
    /// Reads a bound parameter as `uint32_t`.
    since (2, 30); fn ncclParamGetU32(h: ncclParamHandle_t, out: *mut u32) -> ncclResult_t;
    /// Reads a bound parameter as `uint64_t`.
    since (2, 30); fn ncclParamGetU64(h: ncclParamHandle_t, out: *mut u64) -> ncclResult_t;
    /// Reads a bound parameter as a string, valid until this thread's next
    /// `ncclParamGetStr`.
    since (2, 30); fn ncclParamGetStr(h: ncclParamHandle_t, out: *mut *const c_char) -> ncclResult_t;
    /// Copies a bound parameter's raw bytes (at most `maxLen`) to `out`.
    since (2, 30); fn ncclParamGet(h: ncclParamHandle_t, out: *mut c_void, maxLen: c_int, len: *mut c_int) -> ncclResult_t;
    /// Reads the parameter `key` as a string, valid until this thread's
    /// next call.
    since (2, 30); fn ncclParamGetParameter(key: *const c_char, value: *mut *const c_char, valueLen: *mut c_int) -> ncclResult_t;
    /// Lists the documented parameter keys (all of them with
    /// `NCCL_PARAM_DUMP_ALL=true`), valid until this thread's next call.
    since (2, 30); fn ncclParamGetAllParameterKeys(table: *mut *mut *const c_char, tableLen: *mut c_int) -> ncclResult_t;
    /// Prints every documented parameter to NCCL's log.
    since (2, 30); fn ncclParamDumpAll();
}

/// The loaded library does not export a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SymbolError {
    /// The missing function.
    pub symbol: Symbol,
    /// The version of the loaded library.
    pub library: Version,
}

impl std::fmt::Display for SymbolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let since = self.symbol.since();
        let (major, minor, patch) = (since / 10_000, (since / 100) % 100, since % 100);
        write!(
            f,
            "{} is not available in the loaded NCCL {} (it was added in NCCL {major}.{minor}",
            self.symbol.name(),
            self.library,
        )?;
        if patch != 0 {
            write!(f, ".{patch}")?;
        }
        f.write_str(")")
    }
}

impl std::error::Error for SymbolError {}

/// A loaded libnccl (loading and searching: [`crate::library`]; the
/// accessors, one per function, are generated beside the symbol table
/// here, so this module needs nothing from the loader).
///
/// Functions are resolved one at a time, on first use, and cached: a
/// function that an older library lacks is a [`SymbolError`] from its
/// accessor (`nccl.ncclCommShrink()`), never a panic and never a failed
/// load. The library stays loaded for as long as this value lives; the
/// function pointers handed out must not be called after it is dropped.
///
/// `Nccl` is `Send + Sync`: it only holds the `dlopen` handle and a table
/// of addresses filled through `OnceLock`. Whether a *function* may be
/// called from several threads is NCCL's rule, which the safe layer keeps.
pub struct Nccl {
    pub(crate) library: libloading::Library,
    pub(crate) path: std::path::PathBuf,
    pub(crate) source: crate::search::Source,
    pub(crate) version: Version,
    pub(crate) table: FunctionTable,
}
