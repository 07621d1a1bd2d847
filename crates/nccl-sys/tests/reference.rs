//! Proves the hand-written declarations against bindgen's output for every
//! pinned header (`cargo xtask bindgen` writes `tests/reference/*.rs`).
//!
//! - Function signatures: each reference file ends in a `same_signatures`
//!   module that assigns `nccl_sys::pfn::<name>` to bindgen's type, so a
//!   wrong parameter, return type or arity does not compile. Here we check
//!   that the set of functions is right and that each `Symbol::since` agrees
//!   with the headers.
//! - Structs: size, alignment, field names in order and field offsets.
//! - Enums: every enumerator's value, and the integer type under each enum.
//! - Constants: every integer `#define`.

use std::collections::BTreeSet;
use std::ffi::{c_int, c_uint};
use std::mem::{align_of, offset_of, size_of};

use nccl_sys::*;

// Generated code: formatted by prettyplease, not rustfmt, and not held to
// the house lints (bindgen's union helpers have undocumented unsafe blocks).
#[rustfmt::skip]
#[allow(clippy::all, clippy::pedantic, clippy::undocumented_unsafe_blocks, missing_docs)]
#[path = "reference/nccl_2_18_3.rs"]
mod v2_18_3;
// Generated code: formatted by prettyplease, not rustfmt, and not held to
// the house lints (bindgen's union helpers have undocumented unsafe blocks).
#[rustfmt::skip]
#[allow(clippy::all, clippy::pedantic, clippy::undocumented_unsafe_blocks, missing_docs)]
#[path = "reference/nccl_2_24_3.rs"]
mod v2_24_3;
// Generated code: formatted by prettyplease, not rustfmt, and not held to
// the house lints (bindgen's union helpers have undocumented unsafe blocks).
#[rustfmt::skip]
#[allow(clippy::all, clippy::pedantic, clippy::undocumented_unsafe_blocks, missing_docs)]
#[path = "reference/nccl_2_28_9.rs"]
mod v2_28_9;
// Generated code: formatted by prettyplease, not rustfmt, and not held to
// the house lints (bindgen's union helpers have undocumented unsafe blocks).
#[rustfmt::skip]
#[allow(clippy::all, clippy::pedantic, clippy::undocumented_unsafe_blocks, missing_docs)]
#[path = "reference/nccl_2_32_3.rs"]
mod v2_32_3;

/// One pinned header, seen through the tables its reference file carries.
struct Reference {
    version: Version,
    functions: &'static [&'static str],

    enumerators: &'static [(&'static str, &'static str, i64)],
    constants: &'static [(&'static str, i64)],
    structs: Vec<(&'static str, Layout)>,
}

#[derive(Debug, PartialEq, Eq)]
struct Layout {
    size: usize,
    align: usize,
    fields: Vec<(&'static str, usize)>,
}

macro_rules! reference {
    ($m:ident, $major:literal, $minor:literal, $patch:literal) => {
        (
            stringify!($m),
            Reference {
                version: Version::new($major, $minor, $patch),
                functions: $m::signatures::FUNCTIONS,
                enumerators: $m::ENUMERATORS,
                constants: $m::CONSTANTS,
                structs: $m::STRUCTS
                    .iter()
                    .map(|s| {
                        let fields = s.fields.to_vec();
                        (
                            s.name,
                            Layout {
                                size: s.size,
                                align: s.align,
                                fields,
                            },
                        )
                    })
                    .collect(),
            },
        )
    };
}

fn references() -> Vec<(&'static str, Reference)> {
    vec![
        reference!(v2_18_3, 2, 18, 3),
        reference!(v2_24_3, 2, 24, 3),
        reference!(v2_28_9, 2, 28, 9),
        reference!(v2_32_3, 2, 32, 3),
    ]
}

// ---- functions ---------------------------------------------------------------

#[test]
fn the_2_32_3_header_declares_exactly_our_72_functions() {
    let theirs: BTreeSet<&str> = v2_32_3::signatures::FUNCTIONS.iter().copied().collect();
    let ours: BTreeSet<&str> = Symbol::ALL.iter().map(|s| s.name()).collect();
    assert_eq!(ours.len(), 72);
    assert_eq!(theirs, ours);
}

#[test]
fn each_symbol_is_in_exactly_the_headers_its_since_version_covers() {
    for (module, r) in references() {
        let declared: BTreeSet<&str> = r.functions.iter().copied().collect();
        for symbol in Symbol::ALL {
            let expected = symbol.since() <= r.version.code();
            assert_eq!(
                declared.contains(symbol.name()),
                expected,
                "{module}: {} has since {} but the header {} it",
                symbol.name(),
                symbol.since(),
                if declared.contains(symbol.name()) {
                    "declares"
                } else {
                    "does not declare"
                }
            );
        }
        for name in &declared {
            assert!(
                Symbol::from_name(name).is_some(),
                "{module}: {name} is not declared by hand"
            );
        }
    }
}

// ---- structs -----------------------------------------------------------------

fn opaque<T>() -> Layout {
    Layout {
        size: size_of::<T>(),
        align: align_of::<T>(),
        fields: Vec::new(),
    }
}

fn from_fields(fields: &[ConfigField], size: usize, align: usize, version: u32) -> Layout {
    Layout {
        size,
        align,
        fields: fields
            .iter()
            .filter(|f| f.since <= version)
            .map(|f| (f.name, f.offset))
            .collect(),
    }
}

/// Our layout of the struct bindgen calls `name`, as the header of
/// `version` has it.
fn our_layout(name: &str, version: u32) -> Option<Layout> {
    Some(match name {
        n if n.starts_with("ncclConfig_v") => from_fields(
            ncclConfig_t::FIELDS,
            ncclConfig_t::size_for_version(version),
            align_of::<ncclConfig_t>(),
            version,
        ),
        n if n.starts_with("ncclCollConfig_v") => from_fields(
            ncclCollConfig_t::FIELDS,
            ncclCollConfig_t::size_for_version(version),
            align_of::<ncclCollConfig_t>(),
            version,
        ),
        n if n.starts_with("ncclSimInfo_v") => Layout {
            size: size_of::<ncclSimInfo_t>(),
            align: align_of::<ncclSimInfo_t>(),
            fields: vec![
                ("size", offset_of!(ncclSimInfo_t, size)),
                ("magic", offset_of!(ncclSimInfo_t, magic)),
                ("version", offset_of!(ncclSimInfo_t, version)),
                ("estimatedTime", offset_of!(ncclSimInfo_t, estimatedTime)),
            ],
        },
        n if n.starts_with("ncclEncryptionConfig_v") => Layout {
            size: size_of::<ncclEncryptionConfig_t>(),
            align: align_of::<ncclEncryptionConfig_t>(),
            fields: vec![
                ("size", offset_of!(ncclEncryptionConfig_t, size)),
                ("magic", offset_of!(ncclEncryptionConfig_t, magic)),
                ("version", offset_of!(ncclEncryptionConfig_t, version)),
                ("mode", offset_of!(ncclEncryptionConfig_t, mode)),
                ("psk", offset_of!(ncclEncryptionConfig_t, psk)),
            ],
        },
        "ncclWaitSignalDesc_t" => Layout {
            size: size_of::<ncclWaitSignalDesc_t>(),
            align: align_of::<ncclWaitSignalDesc_t>(),
            fields: vec![
                ("opCnt", offset_of!(ncclWaitSignalDesc_t, opCnt)),
                ("peer", offset_of!(ncclWaitSignalDesc_t, peer)),
                ("sigIdx", offset_of!(ncclWaitSignalDesc_t, sigIdx)),
                ("ctx", offset_of!(ncclWaitSignalDesc_t, ctx)),
            ],
        },
        "ncclUniqueId" => Layout {
            size: size_of::<ncclUniqueId>(),
            align: align_of::<ncclUniqueId>(),
            fields: vec![("internal", offset_of!(ncclUniqueId, internal))],
        },
        "ncclConfigExt" => Layout {
            size: size_of::<ncclConfigExt_t>(),
            align: align_of::<ncclConfigExt_t>(),
            fields: vec![
                ("next", offset_of!(ncclConfigExt_t, next)),
                ("key", offset_of!(ncclConfigExt_t, key)),
                ("val", offset_of!(ncclConfigExt_t, val)),
            ],
        },
        // bindgen's names for the anonymous `key` struct and `val` union.
        "ncclConfigExt__bindgen_ty_1" => Layout {
            size: size_of::<ncclConfigExtKey>(),
            align: align_of::<ncclConfigExtKey>(),
            fields: vec![
                ("vendorId", offset_of!(ncclConfigExtKey, vendorId)),
                ("optionId", offset_of!(ncclConfigExtKey, optionId)),
            ],
        },
        "ncclConfigExt__bindgen_ty_2" => Layout {
            size: size_of::<ncclConfigExtValue>(),
            align: align_of::<ncclConfigExtValue>(),
            fields: vec![
                ("i", offset_of!(ncclConfigExtValue, i)),
                ("s", offset_of!(ncclConfigExtValue, s)),
                ("raw", offset_of!(ncclConfigExtValue, raw)),
            ],
        },
        "ncclComm" => opaque::<ncclComm>(),
        "ncclWindow" | "ncclWindow_vidmem" => opaque::<ncclWindow_vidmem>(),
        "ncclParamHandle" => opaque::<ncclParamHandle>(),
        "CUevent_st" => opaque::<CUevent_st>(),
        "CUstream_st" => opaque::<CUstream_st>(),
        _ => return None,
    })
}

#[test]
fn every_struct_has_bindgens_size_alignment_and_field_offsets() {
    for (module, r) in references() {
        let structs = &r.structs;
        assert!(!structs.is_empty(), "{module}: no structs in the reference");
        for (name, theirs) in structs.iter() {
            let ours = our_layout(name, r.version.code())
                .unwrap_or_else(|| panic!("{module}: struct {name} is not declared by hand"));
            assert_eq!(&ours, theirs, "{module}: layout of {name}");
        }
    }
}

#[test]
fn versioned_initializers_match_each_headers_sizeof() {
    for (module, r) in references() {
        let structs = &r.structs;
        let code = r.version.code();
        let config = structs.iter().find(|(n, _)| n.starts_with("ncclConfig_v"));
        let (_, config) = config.unwrap_or_else(|| panic!("{module}: no ncclConfig_t"));
        let init = ncclConfig_t::initializer_for(code);
        assert_eq!(init.size, config.size, "{module}: ncclConfig_t size");
        assert_eq!(init.version, code, "{module}: ncclConfig_t version");
        assert_eq!(init.magic, NCCL_API_MAGIC);
        if let Some((_, coll)) = structs
            .iter()
            .find(|(n, _)| n.starts_with("ncclCollConfig_v"))
        {
            assert_eq!(
                ncclCollConfig_t::initializer_for(code).size,
                coll.size,
                "{module}"
            );
        }
    }
    // The 2.31 header's ncclCollConfig_t ended before launchCompletionEvent.
    assert_eq!(
        ncclCollConfig_t::size_for_version(23102),
        offset_of!(ncclCollConfig_t, launchCompletionEvent)
    );
}

// ---- enums -------------------------------------------------------------------

/// Aliases and counts that C declares as enumerators of the same enum.
fn our_extra_enumerator(enumeration: &str, name: &str, version: Version) -> Option<i64> {
    let v = |x: u32| Some(i64::from(x));
    match (enumeration, name) {
        ("ncclResult_t", "ncclNumResults") => {
            // ncclTimeout (8) arrived in 2.30 and moved the count.
            if version.at_least(2, 30, 0) {
                v(ncclResult_t::ncclNumResults.0)
            } else {
                Some(8)
            }
        }
        ("ncclDataType_t", "ncclNumTypes") => {
            // fp8 (10, 11) arrived in 2.24.
            if version.at_least(2, 24, 0) {
                v(ncclDataType_t::ncclNumTypes.0)
            } else {
                Some(10)
            }
        }
        ("ncclDataType_t", "ncclChar") => v(ncclDataType_t::ncclChar.0),
        ("ncclDataType_t", "ncclInt") => v(ncclDataType_t::ncclInt.0),
        ("ncclDataType_t", "ncclHalf") => v(ncclDataType_t::ncclHalf.0),
        ("ncclDataType_t", "ncclFloat") => v(ncclDataType_t::ncclFloat.0),
        ("ncclDataType_t", "ncclDouble") => v(ncclDataType_t::ncclDouble.0),
        ("ncclRedOp_t", "ncclNumOps") => v(ncclRedOp_t::ncclNumOps.0),
        ("ncclRedOp_t", "ncclMaxRedOp") => v(ncclRedOp_t::ncclMaxRedOp.0),
        // A helper enum the header uses to size ncclRedOp_t; not API.
        ("ncclRedOp_dummy_t", "ncclNumOps_dummy") => Some(5),
        _ => None,
    }
}

fn our_variants(enumeration: &str) -> Option<Vec<(&'static str, i64, u32)>> {
    fn list<T: Copy>(
        variants: &'static [(&'static str, T, u32)],
        value: impl Fn(T) -> i64,
    ) -> Vec<(&'static str, i64, u32)> {
        variants
            .iter()
            .map(|(n, x, since)| (*n, value(*x), *since))
            .collect()
    }
    Some(match enumeration {
        "ncclResult_t" => list(ncclResult_t::VARIANTS, |x| x.0.into()),
        "ncclDataType_t" => list(ncclDataType_t::VARIANTS, |x| x.0.into()),
        "ncclRedOp_t" => list(ncclRedOp_t::VARIANTS, |x| x.0.into()),
        "ncclScalarResidence_t" => list(ncclScalarResidence_t::VARIANTS, |x| x.0.into()),
        "ncclCommMemStat_t" => list(ncclCommMemStat_t::VARIANTS, |x| x.0.into()),
        "ncclHostCftMode_t" => list(ncclHostCftMode_t::VARIANTS, |x| x.0.into()),
        "ncclNvlsHostMode_t" => list(ncclNvlsHostMode_t::VARIANTS, |x| x.0.into()),
        "ncclEncryptionMode_t" => list(ncclEncryptionMode_t::VARIANTS, |x| x.0.into()),
        "ncclRedOp_dummy_t" => Vec::new(),
        _ => return None,
    })
}

#[test]
fn every_enumerator_has_bindgens_value() {
    for (module, r) in references() {
        assert!(!r.enumerators.is_empty(), "{module}: no enumerators");
        for &(enumeration, name, value) in r.enumerators {
            let variants = our_variants(enumeration)
                .unwrap_or_else(|| panic!("{module}: enum {enumeration} is not declared by hand"));
            let ours = variants
                .iter()
                .find(|(n, _, _)| *n == name)
                .map(|(_, x, _)| *x)
                .or_else(|| our_extra_enumerator(enumeration, name, r.version))
                .unwrap_or_else(|| panic!("{module}: {enumeration}::{name} is not declared"));
            assert_eq!(ours, value, "{module}: {enumeration}::{name}");
        }
    }
}

#[test]
fn each_enumerators_since_matches_the_headers() {
    for (module, r) in references() {
        let declared: BTreeSet<(&str, &str)> =
            r.enumerators.iter().map(|(e, n, _)| (*e, *n)).collect();
        let enums: BTreeSet<&str> = r.enumerators.iter().map(|(e, _, _)| *e).collect();
        for enumeration in enums {
            for (name, _, since) in our_variants(enumeration).unwrap_or_default() {
                assert_eq!(
                    declared.contains(&(enumeration, name)),
                    since <= r.version.code(),
                    "{module}: {enumeration}::{name} is marked since {since}"
                );
            }
        }
    }
}

fn same_type<T>(_: T, _: T) {}

#[test]
fn enums_wrap_the_integer_type_c_gives_them() {
    // Compile-time: each newtype's field has bindgen's type, in every header
    // that has the enum.
    macro_rules! same_repr {
        ($($m:ident),*; $ty:ident :: $konst:ident) => {
            $( same_type($m::layout::$ty::$konst.0, nccl_sys::$ty::$konst.0); )*
        };
    }
    same_repr!(v2_18_3, v2_24_3, v2_28_9, v2_32_3; ncclResult_t::ncclSuccess);
    same_repr!(v2_18_3, v2_24_3, v2_28_9, v2_32_3; ncclDataType_t::ncclInt8);
    same_repr!(v2_18_3, v2_24_3, v2_28_9, v2_32_3; ncclRedOp_t::ncclSum);
    same_repr!(v2_18_3, v2_24_3, v2_28_9, v2_32_3; ncclScalarResidence_t::ncclScalarDevice);
    same_repr!(v2_32_3; ncclCommMemStat_t::ncclStatGpuMemTotal);
    same_repr!(v2_32_3; ncclHostCftMode_t::ncclHostCftDefault);
    same_repr!(v2_32_3; ncclNvlsHostMode_t::ncclNvlsHostModeDefault);
    same_repr!(v2_32_3; ncclEncryptionMode_t::NCCL_ENCRYPTION_MODE_PSK);
    same_type(ncclResult_t::ncclSuccess.0, 0 as c_uint);
    same_type(ncclHostCftMode_t::ncclHostCftDefault.0, 0 as c_int);
}

// ---- constants -----------------------------------------------------------------

/// Our integer constants: (name, value, version code that added it).
fn our_constants() -> Vec<(&'static str, i64, u32)> {
    vec![
        ("NCCL_UNIQUE_ID_BYTES", NCCL_UNIQUE_ID_BYTES as i64, 21800),
        ("NCCL_CONFIG_UNDEF_INT", NCCL_CONFIG_UNDEF_INT.into(), 21800),
        ("NCCL_SPLIT_NOCOLOR", NCCL_SPLIT_NOCOLOR.into(), 21800),
        ("NCCL_API_MAGIC", NCCL_API_MAGIC.into(), 22900),
        ("NCCL_WIN_DEFAULT", NCCL_WIN_DEFAULT.into(), 22700),
        (
            "NCCL_WIN_COLL_SYMMETRIC",
            NCCL_WIN_COLL_SYMMETRIC.into(),
            22700,
        ),
        (
            "NCCL_WIN_STRICT_ORDERING",
            NCCL_WIN_STRICT_ORDERING.into(),
            22900,
        ),
        ("NCCL_WIN_GIN_ONLY", NCCL_WIN_GIN_ONLY.into(), 23200),
        ("NCCL_WIN_CFT_COUNTED", NCCL_WIN_CFT_COUNTED.into(), 23200),
        (
            "NCCL_WIN_REQUIRED_ALIGNMENT",
            NCCL_WIN_REQUIRED_ALIGNMENT as i64,
            22800,
        ),
        (
            "NCCL_CTA_POLICY_DEFAULT",
            NCCL_CTA_POLICY_DEFAULT.into(),
            22700,
        ),
        (
            "NCCL_CTA_POLICY_EFFICIENCY",
            NCCL_CTA_POLICY_EFFICIENCY.into(),
            22700,
        ),
        ("NCCL_CTA_POLICY_ZERO", NCCL_CTA_POLICY_ZERO.into(), 22800),
        ("NCCL_SHRINK_DEFAULT", NCCL_SHRINK_DEFAULT.into(), 22700),
        ("NCCL_SHRINK_ABORT", NCCL_SHRINK_ABORT.into(), 22700),
        ("NCCL_REVOKE_DEFAULT", NCCL_REVOKE_DEFAULT.into(), 22807),
        ("NCCL_SUSPEND_MEM", NCCL_SUSPEND_MEM.into(), 22900),
    ]
}

#[test]
fn every_integer_constant_has_bindgens_value() {
    for (module, r) in references() {
        let ours = our_constants();
        for &(name, value) in r.constants {
            let expected = match name {
                "NCCL_MAJOR" => i64::from(r.version.major),
                "NCCL_MINOR" => i64::from(r.version.minor),
                "NCCL_PATCH" => i64::from(r.version.patch),
                "NCCL_VERSION_CODE" => i64::from(r.version.code()),
                _ => ours
                    .iter()
                    .find(|(n, _, _)| *n == name)
                    .map(|(_, v, _)| *v)
                    .unwrap_or_else(|| panic!("{module}: constant {name} is not declared")),
            };
            assert_eq!(expected, value, "{module}: {name}");
        }
        for (name, _, since) in ours {
            let present = r.constants.iter().any(|(n, _)| *n == name);
            assert_eq!(
                present,
                since <= r.version.code(),
                "{module}: {name} is marked since {since}"
            );
        }
    }
    assert_eq!(
        (NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH, NCCL_VERSION_CODE),
        (
            v2_32_3::layout::NCCL_MAJOR,
            v2_32_3::layout::NCCL_MINOR,
            v2_32_3::layout::NCCL_PATCH,
            23203
        )
    );
    assert_eq!(
        f64::from(NCCL_UNDEF_FLOAT),
        v2_32_3::layout::NCCL_UNDEF_FLOAT
    );
}
