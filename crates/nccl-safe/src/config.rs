//! `Config`: a builder for every `ncclConfig_t` field, checked against the
//! loaded library before it reaches NCCL.
//!
//! An older library silently ignores fields it does not know (it copies
//! only the prefix of the struct it knows). Here a field the loaded library
//! does not know is `Error::Unsupported` naming the field, so no setting is
//! ever dropped without a word.

use std::collections::BTreeMap;
use std::ffi::{CString, c_char, c_int};
use std::time::Duration;

use nccl_sys::{Version, ncclConfig_t};

use crate::{Error, Result};

/// How long our own waits on a nonblocking communicator last by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Settings for a new communicator.
///
/// Unset fields keep NCCL's defaults (and its `NCCL_*` environment
/// overrides). Every setter names the `ncclConfig_t` field it fills.
///
/// ```
/// use nccl_safe::Config;
/// use std::time::Duration;
///
/// let config = Config::new()
///     .blocking(false)
///     .comm_name("dp")
///     .max_ctas(16)
///     .timeout(Duration::from_secs(60));
/// assert_eq!(config.get_timeout(), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    ints: BTreeMap<&'static str, c_int>,
    net_name: Option<String>,
    comm_name: Option<String>,
    timeout: Duration,
    signal: Option<crate::AbortSignal>,
    park_on_peer_loss: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

macro_rules! int_setters {
    ($($(#[doc = $doc:literal])* $method:ident: $ty:ty => $field:ident;)*) => {$(
        $(#[doc = $doc])*
        #[doc = concat!("\n\nFills `ncclConfig_t::", stringify!($field), "`.")]
        #[must_use]
        pub fn $method(mut self, value: $ty) -> Self {
            self.ints.insert(stringify!($field), value.into_c_int());
            self
        }
    )*};
}

trait IntoCInt {
    fn into_c_int(self) -> c_int;
}
impl IntoCInt for bool {
    fn into_c_int(self) -> c_int {
        c_int::from(self)
    }
}
impl IntoCInt for i32 {
    fn into_c_int(self) -> c_int {
        self
    }
}

/// The least `minCTAs` that [`Config::for_symmetric_kernels`] sets.
pub const SYMMETRIC_MIN_CTAS: i32 = 16;

/// NCCL's `maxCTAs` when unset (`MAXCHANNELS`, 2.28).
const NCCL_DEFAULT_MAX_CTAS: i32 = 64;

impl Config {
    /// This configuration with `minCTAs` at least [`SYMMETRIC_MIN_CTAS`]
    /// (kept under a `maxCTAs` already set; an unset `maxCTAs` becomes
    /// NCCL's default, 64, since NCCL refuses `minCTAs` alone): for a
    /// communicator whose all-reduces run on [`crate::SymmetricBuffer`]s.
    ///
    /// NCCL 2.28 sizes a symmetric kernel's grid by its own model, from
    /// `minCTAs` up, and on H100 and H200 pairs picks so few blocks that
    /// 1–4 MiB all-reduces stay near its default path's time. At 16 blocks
    /// or more, 2 MiB bf16 takes 0.42–0.46 of the default path's time
    /// (2 H100s, NCCL 2.28.3 and 2.28.9; `docs/architecture.md`, "Small
    /// messages"). Other collectives: NCCL makes at least `minCTAs`
    /// channels, which changes nothing where it already makes 16 or more
    /// (24 between two NVLink-linked H100s or H200s) and adds channels
    /// elsewhere.
    ///
    /// ```
    /// use nccl_safe::{Config, SYMMETRIC_MIN_CTAS};
    /// let config = Config::new().for_symmetric_kernels();
    /// assert_eq!(config.get_min_ctas(), Some(SYMMETRIC_MIN_CTAS));
    /// // A larger minimum stays; a smaller maximum bounds it.
    /// assert_eq!(Config::new().min_ctas(32).for_symmetric_kernels().get_min_ctas(), Some(32));
    /// assert_eq!(Config::new().max_ctas(8).for_symmetric_kernels().get_min_ctas(), Some(8));
    /// ```
    pub fn for_symmetric_kernels(self) -> Config {
        let at_least = self.get_min_ctas().unwrap_or(0).max(SYMMETRIC_MIN_CTAS);
        match self.ints.get("maxCTAs") {
            Some(&max) => self.min_ctas(at_least.min(max)),
            None => self.min_ctas(at_least).max_ctas(NCCL_DEFAULT_MAX_CTAS),
        }
    }

    /// The `minCTAs` set on this configuration, if any.
    pub fn get_min_ctas(&self) -> Option<i32> {
        self.ints.get("minCTAs").copied()
    }

    /// The `maxCTAs` set on this configuration, if any.
    ///
    /// ```
    /// use nccl_safe::Config;
    /// assert_eq!(Config::new().get_max_ctas(), None);
    /// assert_eq!(Config::new().max_ctas(4).get_max_ctas(), Some(4));
    /// ```
    pub fn get_max_ctas(&self) -> Option<i32> {
        self.ints.get("maxCTAs").copied()
    }

    /// Every field unset, our wait deadline at [`DEFAULT_TIMEOUT`].
    pub fn new() -> Config {
        Config {
            ints: BTreeMap::new(),
            net_name: None,
            comm_name: None,
            timeout: DEFAULT_TIMEOUT,
            signal: None,
            park_on_peer_loss: false,
        }
    }

    int_setters! {
        /// `false` makes NCCL calls return at once with `ncclInProgress`;
        /// this crate then polls against [`Config::timeout`], which also
        /// makes [`crate::AbortHandle::abort`] able to interrupt them.
        blocking: bool => blocking;
        /// CUDA thread-block cluster size (Hopper and later).
        cga_cluster_size: i32 => cgaClusterSize;
        /// Lower bound on CTAs per collective.
        min_ctas: i32 => minCTAs;
        /// Upper bound on CTAs per collective.
        max_ctas: i32 => maxCTAs;
        /// Whether split children share the parent's resources.
        split_share: bool => splitShare;
        /// Network traffic class (NCCL 2.26).
        traffic_class: i32 => trafficClass;
        /// Whether to use CollNet (NCCL 2.27).
        collnet_enable: bool => collnetEnable;
        /// `NCCL_CTA_POLICY_*` bitmask (NCCL 2.27).
        cta_policy: i32 => CTAPolicy;
        /// Whether shrunk children share the parent's resources (NCCL 2.27).
        shrink_share: bool => shrinkShare;
        /// CTAs for NVLS algorithms (NCCL 2.27).
        nvls_ctas: i32 => nvlsCTAs;
        /// Channels per network peer (NCCL 2.28).
        n_channels_per_net_peer: i32 => nChannelsPerNetPeer;
        /// NVLink-centric scheduling (NCCL 2.28).
        nvlink_centric_sched: bool => nvlinkCentricSched;
        /// How the communicator is used with CUDA graphs (NCCL 2.29).
        graph_usage_mode: i32 => graphUsageMode;
        /// Number of RMA contexts (NCCL 2.29).
        num_rma_ctx: i32 => numRmaCtx;
        /// Maximum number of P2P peers (NCCL 2.30).
        max_p2p_peers: i32 => maxP2pPeers;
        /// Stream ordering of graph launches (NCCL 2.30).
        graph_stream_ordering: i32 => graphStreamOrdering;
        /// Implicit launch ordering (NCCL 2.31).
        launch_order_implicit: bool => launchOrderImplicit;
        /// Number of RMA signals (NCCL 2.31).
        num_rma_sig: i32 => numRmaSig;
        /// Eager RMA initialisation (NCCL 2.31).
        rma_eager_init: bool => rmaEagerInit;
        /// An `ncclHostCftMode_t` value (NCCL 2.31).
        host_cft_mode: i32 => hostCftMode;
        /// An `ncclNvlsHostMode_t` value (NCCL 2.32).
        nvls_host_mode: i32 => nvlsHostMode;
    }

    /// Network plugin to use, by name. Fills `ncclConfig_t::netName`.
    #[must_use]
    pub fn net_name(mut self, name: impl Into<String>) -> Self {
        self.net_name = Some(name.into());
        self
    }

    /// Name shown in NCCL's logs and profilers (NCCL 2.27). Fills
    /// `ncclConfig_t::commName`.
    #[must_use]
    pub fn comm_name(mut self, name: impl Into<String>) -> Self {
        self.comm_name = Some(name.into());
        self
    }

    /// Deadline for each wait this crate owns on the communicator: polling
    /// a nonblocking init, split, finalize or group end. Not an NCCL field.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The wait deadline.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// Communicators made with this configuration carry `signal` (and so
    /// do their split or shrunk children unless given another): when it is
    /// triggered they are aborted, even mid-init. Not an NCCL field.
    #[must_use]
    pub fn abort_signal(mut self, signal: &crate::AbortSignal) -> Self {
        self.signal = Some(signal.clone());
        self
    }

    /// The abort signal, if one was set.
    pub fn get_abort_signal(&self) -> Option<&crate::AbortSignal> {
        self.signal.as_ref()
    }

    /// With `true`, a communicator made with this configuration is
    /// *parked* instead of aborted when an abort is asked for because a
    /// peer was lost ([`crate::AbortCause::PeerLost`]) and no thread is in
    /// a call on it: every later call fails as after an abort
    /// ([`crate::Error::Aborted`] with the loss), but `ncclCommAbort` is put
    /// off, so that the survivors can make their new communicator with
    /// [`crate::Comm::shrink_parked`] at once instead of waiting for NCCL's
    /// teardown (which joins proxy threads that poll every 500 ms). A
    /// parked blocking communicator's kernels are stopped all the same
    /// (`ncclCommShrink` to its own rank with `NCCL_SHRINK_ABORT`, once the
    /// signal's other aborts were asked for, or at the next call on it), so
    /// the GPU is free after a loss as after an abort. Any other cause,
    /// [`crate::AbortHandle::abort`], the drop and
    /// [`crate::AbortSignal::end_parking`] abort a parked communicator.
    /// Only where the library has `ncclCommShrink` (NCCL 2.27+), no CUDA
    /// graph of this process may refer to a communicator, and NCCL reports
    /// no error on it; elsewhere the abort happens as without it. Children
    /// do not inherit it. Not an NCCL field.
    ///
    /// ```
    /// use nccl_safe::Config;
    /// assert!(Config::new().park_on_peer_loss(true).parks_on_peer_loss());
    /// assert!(!Config::new().parks_on_peer_loss());
    /// ```
    #[must_use]
    pub fn park_on_peer_loss(mut self, park: bool) -> Self {
        self.park_on_peer_loss = park;
        self
    }

    /// Whether [`Config::park_on_peer_loss`] is set.
    pub fn parks_on_peer_loss(&self) -> bool {
        self.park_on_peer_loss
    }

    /// Whether the communicator will be blocking (NCCL's default: yes).
    pub fn is_blocking(&self) -> bool {
        self.ints.get("blocking").is_none_or(|v| *v != 0)
    }

    /// NCCL's own check of `minCTAs` and `maxCTAs` (2.28), made here so
    /// that it is a typed error before any call: each set is positive,
    /// and a `minCTAs` needs a `maxCTAs` at least as large (NCCL compares
    /// an unset `maxCTAs` as `INT_MIN`, so `minCTAs` alone is refused).
    /// Seen on 2 H100s: an `ncclCommSplit` that NCCL 2.28.3 refused for
    /// this ended its process in glibc's heap check at a thread's exit.
    fn check_ctas(&self) -> Result<()> {
        let (min, max) = (self.ints.get("minCTAs"), self.ints.get("maxCTAs"));
        let reason = match (min, max) {
            (Some(&m), _) if m <= 0 => "minCTAs must be positive",
            (_, Some(&m)) if m <= 0 => "maxCTAs must be positive",
            (Some(_), None) => "minCTAs needs maxCTAs set as well (NCCL refuses it alone)",
            (Some(&lo), Some(&hi)) if lo > hi => "minCTAs is above maxCTAs",
            _ => return Ok(()),
        };
        Err(Error::InvalidArgument {
            op: "Config",
            reason,
        })
    }

    /// The raw struct for a library of `version`, with the strings it
    /// points to. Fails on a field the library does not know and on a
    /// string with an interior nul.
    pub(crate) fn to_raw(&self, version: Version) -> Result<RawConfig> {
        self.check_ctas()?;
        let code = version.code();
        let mut raw = ncclConfig_t::initializer_for(code);
        let check = |field: &'static str| match ncclConfig_t::field_known(field, code) {
            Some(true) => Ok(()),
            _ => Err(Error::Unsupported {
                what: field,
                requires: format!("an NCCL whose ncclConfig_t has `{field}`"),
                found: format!("NCCL {version}"),
            }),
        };
        for (&field, &value) in &self.ints {
            check(field)?;
            let slot = match field {
                "blocking" => &mut raw.blocking,
                "cgaClusterSize" => &mut raw.cgaClusterSize,
                "minCTAs" => &mut raw.minCTAs,
                "maxCTAs" => &mut raw.maxCTAs,
                "splitShare" => &mut raw.splitShare,
                "trafficClass" => &mut raw.trafficClass,
                "collnetEnable" => &mut raw.collnetEnable,
                "CTAPolicy" => &mut raw.CTAPolicy,
                "shrinkShare" => &mut raw.shrinkShare,
                "nvlsCTAs" => &mut raw.nvlsCTAs,
                "nChannelsPerNetPeer" => &mut raw.nChannelsPerNetPeer,
                "nvlinkCentricSched" => &mut raw.nvlinkCentricSched,
                "graphUsageMode" => &mut raw.graphUsageMode,
                "numRmaCtx" => &mut raw.numRmaCtx,
                "maxP2pPeers" => &mut raw.maxP2pPeers,
                "graphStreamOrdering" => &mut raw.graphStreamOrdering,
                "launchOrderImplicit" => &mut raw.launchOrderImplicit,
                "numRmaSig" => &mut raw.numRmaSig,
                "rmaEagerInit" => &mut raw.rmaEagerInit,
                "hostCftMode" => &mut raw.hostCftMode,
                "nvlsHostMode" => &mut raw.nvlsHostMode,
                _ => {
                    return Err(Error::InvalidArgument {
                        op: "Config",
                        reason: "unknown field",
                    });
                }
            };
            *slot = value;
        }
        let c_string = |s: &Option<String>| -> Result<Option<CString>> {
            s.as_deref()
                .map(CString::new)
                .transpose()
                .map_err(|_| Error::InvalidArgument {
                    op: "Config",
                    reason: "a name contains a nul byte",
                })
        };
        let net_name = c_string(&self.net_name)?.map(HeldCStr::new);
        let comm_name = c_string(&self.comm_name)?.map(HeldCStr::new);
        if let Some(name) = &net_name {
            check("netName")?;
            raw.netName = name.as_ptr();
        }
        if let Some(name) = &comm_name {
            check("commName")?;
            raw.commName = name.as_ptr();
        }
        Ok(RawConfig {
            raw,
            _net_name: net_name,
            _comm_name: comm_name,
        })
    }
}

/// An `ncclConfig_t` and the strings its pointers point into; the strings
/// are heap allocations held by raw pointer ([`HeldCStr`]), so moving this
/// value keeps the pointers valid.
#[derive(Debug)]
pub(crate) struct RawConfig {
    pub(crate) raw: ncclConfig_t,
    _net_name: Option<HeldCStr>,
    _comm_name: Option<HeldCStr>,
}

/// A C string that pointers handed to NCCL point into, held as the raw
/// pointer `CString::into_raw` gives. A `CString` (a `Box` inside) claims
/// unique access to its bytes each time it moves, which under Rust's
/// aliasing rules invalidates every pointer taken from it before the move
/// (Miri's Stacked Borrows reported it on `RawConfig`); a raw pointer
/// claims nothing, so the config may move between `to_raw` and NCCL's read.
#[derive(Debug)]
struct HeldCStr(*mut c_char);

impl HeldCStr {
    fn new(s: CString) -> HeldCStr {
        HeldCStr(s.into_raw())
    }

    fn as_ptr(&self) -> *const c_char {
        self.0
    }
}

impl Drop for HeldCStr {
    fn drop(&mut self) {
        // SAFETY: made by `CString::into_raw` in `HeldCStr::new` and taken
        // back once, here; the config whose pointers point into it goes
        // with it (it is a field of that `RawConfig`).
        drop(unsafe { CString::from_raw(self.0) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_fields_keep_the_initializer_values() {
        let raw = Config::new().to_raw(Version::new(2, 32, 3)).unwrap().raw;
        let init = ncclConfig_t::initializer();
        assert_eq!(
            (raw.size, raw.magic, raw.version),
            (init.size, init.magic, init.version)
        );
        assert_eq!(raw.blocking, nccl_sys::NCCL_CONFIG_UNDEF_INT);
        assert!(raw.netName.is_null() && raw.commName.is_null());
    }

    #[test]
    fn set_fields_reach_the_struct() {
        let cfg = Config::new()
            .blocking(false)
            .max_ctas(8)
            .comm_name("tp")
            .split_share(true);
        let raw = cfg.to_raw(Version::new(2, 28, 9)).unwrap();
        assert_eq!(raw.raw.blocking, 0);
        assert_eq!(raw.raw.maxCTAs, 8);
        assert_eq!(raw.raw.splitShare, 1);
        // SAFETY: commName points into the CString `raw` owns.
        let name = unsafe { std::ffi::CStr::from_ptr(raw.raw.commName) };
        assert_eq!(name.to_str().unwrap(), "tp");
        assert_eq!(raw.raw.size, ncclConfig_t::size_for_version(22809));
        assert!(!cfg.is_blocking());
    }

    #[test]
    fn a_field_the_library_does_not_know_is_unsupported_not_dropped() {
        let err = Config::new()
            .graph_usage_mode(1)
            .to_raw(Version::new(2, 28, 9))
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Unsupported {
                    what: "graphUsageMode",
                    ..
                }
            ),
            "{err}"
        );
        let err = Config::new()
            .comm_name("x")
            .to_raw(Version::new(2, 18, 3))
            .unwrap_err();
        assert!(
            matches!(
                err,
                Error::Unsupported {
                    what: "commName",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("NCCL 2.18.3"), "{err}");
    }

    #[test]
    fn cta_bounds_nccl_refuses_are_refused_first() {
        let v = Version::new(2, 28, 3);
        for bad in [
            Config::new().min_ctas(16),
            Config::new().min_ctas(0).max_ctas(8),
            Config::new().max_ctas(-1),
            Config::new().min_ctas(16).max_ctas(8),
        ] {
            let err = bad.to_raw(v).unwrap_err();
            assert!(
                matches!(err, Error::InvalidArgument { op: "Config", .. }),
                "{err}"
            );
        }
        let raw = Config::new().for_symmetric_kernels().to_raw(v).unwrap();
        assert_eq!((raw.raw.minCTAs, raw.raw.maxCTAs), (16, 64));
        let raw = Config::new()
            .max_ctas(8)
            .for_symmetric_kernels()
            .to_raw(v)
            .unwrap();
        assert_eq!((raw.raw.minCTAs, raw.raw.maxCTAs), (8, 8));
    }

    #[test]
    fn a_name_with_a_nul_byte_is_refused() {
        let err = Config::new()
            .comm_name("a\0b")
            .to_raw(Version::new(2, 32, 3))
            .unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    }
}
