//! What the loaded library (and a GPU) can do, decided from the library's
//! version and the symbols it exports, never from guesses.

use std::fmt;

use nccl_sys::{Symbol, Version};

/// A feature that only some NCCL releases (or GPUs) have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Feature {
    /// `ncclCommSplit`.
    Split,
    /// `ncclCommShrink`.
    Shrink,
    /// `ncclCommGrow` and `ncclCommGetUniqueId`.
    Grow,
    /// `ncclCommRevoke`.
    Revoke,
    /// Nonblocking communicators (`blocking = 0`).
    Nonblocking,
    /// `ncclCommInitRankScalable`.
    InitScalable,
    /// `ncclCommRegister` / `ncclCommDeregister`.
    Register,
    /// `ncclMemAlloc` / `ncclMemFree`.
    MemAlloc,
    /// `ncclCommWindowRegister` / `ncclCommWindowDeregister`.
    Windows,
    /// Native `ncclAlltoAll`.
    NativeAllToAll,
    /// Native `ncclGather` and `ncclScatter`.
    NativeGatherScatter,
    /// The fp8 data types (`ncclFloat8e4m3`, `ncclFloat8e5m2`).
    Fp8,
    /// `ncclRedOpCreatePreMulSum`.
    PreMulSum,
    /// The `nccl*Config` collectives with a per-call `ncclCollConfig_t`.
    CollConfig,
    /// `ncclSetEncryption`.
    Encryption,
    /// `ncclGroupSimulateEnd`.
    GroupSimulate,
}

impl Feature {
    /// Every feature.
    pub const ALL: &'static [Feature] = &[
        Feature::Split,
        Feature::Shrink,
        Feature::Grow,
        Feature::Revoke,
        Feature::Nonblocking,
        Feature::InitScalable,
        Feature::Register,
        Feature::MemAlloc,
        Feature::Windows,
        Feature::NativeAllToAll,
        Feature::NativeGatherScatter,
        Feature::Fp8,
        Feature::PreMulSum,
        Feature::CollConfig,
        Feature::Encryption,
        Feature::GroupSimulate,
    ];

    /// The functions the feature needs, all of which must be exported.
    pub fn symbols(self) -> &'static [Symbol] {
        match self {
            Feature::Split => &[Symbol::ncclCommSplit],
            Feature::Shrink => &[Symbol::ncclCommShrink],
            Feature::Grow => &[Symbol::ncclCommGrow, Symbol::ncclCommGetUniqueId],
            Feature::Revoke => &[Symbol::ncclCommRevoke],
            Feature::Nonblocking => &[
                Symbol::ncclCommInitRankConfig,
                Symbol::ncclCommGetAsyncError,
            ],
            Feature::InitScalable => &[Symbol::ncclCommInitRankScalable],
            Feature::Register => &[Symbol::ncclCommRegister, Symbol::ncclCommDeregister],
            Feature::MemAlloc => &[Symbol::ncclMemAlloc, Symbol::ncclMemFree],
            Feature::Windows => &[
                Symbol::ncclCommWindowRegister,
                Symbol::ncclCommWindowDeregister,
            ],
            Feature::NativeAllToAll => &[Symbol::ncclAlltoAll],
            Feature::NativeGatherScatter => &[Symbol::ncclGather, Symbol::ncclScatter],
            Feature::Fp8 => &[],
            Feature::PreMulSum => &[Symbol::ncclRedOpCreatePreMulSum, Symbol::ncclRedOpDestroy],
            Feature::CollConfig => &[Symbol::ncclAllReduceConfig],
            Feature::Encryption => &[Symbol::ncclSetEncryption],
            Feature::GroupSimulate => &[Symbol::ncclGroupSimulateEnd],
        }
    }

    /// The oldest release that has the feature.
    pub fn since(self) -> Version {
        let code = match self {
            Feature::Fp8 => 22400,
            Feature::Nonblocking => 21400,
            other => other
                .symbols()
                .iter()
                .map(|s| s.since())
                .max()
                .unwrap_or(21800),
        };
        Version::new(code / 10_000, (code / 100) % 100, code % 100)
    }

    /// A short human name.
    pub fn name(self) -> &'static str {
        match self {
            Feature::Split => "communicator split",
            Feature::Shrink => "communicator shrink",
            Feature::Grow => "communicator grow",
            Feature::Revoke => "communicator revoke",
            Feature::Nonblocking => "nonblocking communicators",
            Feature::InitScalable => "scalable init",
            Feature::Register => "buffer registration",
            Feature::MemAlloc => "NCCL memory allocation",
            Feature::Windows => "symmetric memory windows",
            Feature::NativeAllToAll => "native all-to-all",
            Feature::NativeGatherScatter => "native gather/scatter",
            Feature::Fp8 => "fp8 data types",
            Feature::PreMulSum => "PreMulSum reductions",
            Feature::CollConfig => "per-collective configuration",
            Feature::Encryption => "socket encryption",
            Feature::GroupSimulate => "group simulation",
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The features a loaded library has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    version: Version,
    present: Vec<Feature>,
}

impl Capabilities {
    /// Decides every feature from a version and a symbol test. Pure, so the
    /// rules are tested without a library.
    pub fn decide(version: Version, has: impl Fn(Symbol) -> bool) -> Capabilities {
        let present = Feature::ALL
            .iter()
            .copied()
            .filter(|f| version >= f.since() && f.symbols().iter().all(|s| has(*s)))
            .collect();
        Capabilities { version, present }
    }

    /// The library's version.
    pub fn version(&self) -> Version {
        self.version
    }

    /// Whether the library has `feature`.
    pub fn has(&self, feature: Feature) -> bool {
        self.present.contains(&feature)
    }

    /// `Ok` when the library has `feature`, else `Error::Unsupported`.
    pub fn require(&self, feature: Feature) -> crate::Result<()> {
        if self.has(feature) {
            Ok(())
        } else {
            Err(crate::Error::needs_version(
                feature.name(),
                feature.since(),
                self.version,
            ))
        }
    }

    /// Every feature present.
    pub fn features(&self) -> &[Feature] {
        &self.present
    }
}

/// The oldest compute capability on which NCCL reduces fp8 values (Hopper).
/// Moving fp8 bytes (broadcast, gather, send/recv) works on any GPU.
pub const FP8_REDUCTION_MIN_CC: (i32, i32) = (9, 0);

#[cfg(test)]
mod tests {
    use super::*;

    fn all_symbols_of(version: Version) -> impl Fn(Symbol) -> bool {
        move |s| s.since() <= version.code()
    }

    #[test]
    fn nccl_2_18_has_split_and_premulsum_but_nothing_newer() {
        let v = Version::new(2, 18, 3);
        let caps = Capabilities::decide(v, all_symbols_of(v));
        for f in [Feature::Split, Feature::Nonblocking, Feature::PreMulSum] {
            assert!(caps.has(f), "{f}");
        }
        for f in [
            Feature::Register,
            Feature::MemAlloc,
            Feature::Shrink,
            Feature::Windows,
            Feature::NativeAllToAll,
            Feature::Fp8,
            Feature::GroupSimulate,
            Feature::Encryption,
        ] {
            assert!(!caps.has(f), "{f}");
        }
    }

    #[test]
    fn nccl_2_28_3_has_native_all_to_all_but_not_revoke() {
        let v = Version::new(2, 28, 3);
        let caps = Capabilities::decide(v, all_symbols_of(v));
        assert!(caps.has(Feature::NativeAllToAll));
        assert!(caps.has(Feature::NativeGatherScatter));
        assert!(caps.has(Feature::Fp8));
        assert!(caps.has(Feature::Windows));
        assert!(!caps.has(Feature::Revoke));
        assert!(!caps.has(Feature::Grow));
        let v = Version::new(2, 28, 9);
        assert!(Capabilities::decide(v, all_symbols_of(v)).has(Feature::Revoke));
    }

    #[test]
    fn a_missing_symbol_disables_a_feature_whatever_the_version() {
        let v = Version::new(2, 32, 3);
        let caps = Capabilities::decide(v, |s| s != Symbol::ncclCommShrink);
        assert!(!caps.has(Feature::Shrink));
        assert!(caps.has(Feature::Encryption));
    }

    #[test]
    fn fp8_needs_2_24_even_though_it_has_no_symbol() {
        let v = Version::new(2, 23, 4);
        assert!(!Capabilities::decide(v, |_| true).has(Feature::Fp8));
        let v = Version::new(2, 24, 0);
        assert!(Capabilities::decide(v, |_| true).has(Feature::Fp8));
    }

    #[test]
    fn require_names_the_feature_and_both_versions() {
        let v = Version::new(2, 18, 3);
        let caps = Capabilities::decide(v, all_symbols_of(v));
        let err = caps.require(Feature::Shrink).unwrap_err();
        assert_eq!(
            err.to_string(),
            "communicator shrink is not supported: it needs NCCL 2.27, found NCCL 2.18.3"
        );
    }
}
