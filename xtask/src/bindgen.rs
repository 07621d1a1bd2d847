//! `cargo xtask bindgen [--check]`: reference bindings from pinned headers.
//!
//! For every pinned release with `reference: true`, bindgen (pinned in
//! `xtask/Cargo.toml`) runs on libclang (pinned in `pins.rs`) over the
//! wheel's `nccl.h` and writes
//! `crates/nccl-sys/tests/reference/nccl_<version>.rs` with three parts:
//!
//! - `layout`: bindgen's own view of every `nccl*` type and `NCCL_*`
//!   constant, for the tests to compare sizes, alignments, offsets and
//!   values with the hand-written ones;
//! - `signatures`: a `PFN_<name>` type for every function, generated with
//!   nccl-sys's own named types (so only parameters, return types and arity
//!   are bindgen's), plus `FUNCTIONS`, the names the header declares;
//! - `same_signatures`: one `const` per function that assigns
//!   `None::<nccl_sys::pfn::<name>>` to bindgen's `PFN_<name>`, so a
//!   hand-written signature that differs does not compile.
//!
//! The C side sees only the header and a few stand-in system headers
//! (`shim_headers`) under `-nostdinc`: no CUDA toolkit and no system headers
//! are needed, and the output does not depend on the machine.

use std::path::{Path, PathBuf};

use crate::fetch;
use crate::pins;
use crate::{Result, workspace_root};

/// Functions the header declares that nccl-sys leaves out on purpose.
/// `ncclResetDebugInit`: deprecated, "not supported as part of the NCCL API".
const EXCLUDED_FUNCTIONS: &[&str] = &["ncclResetDebugInit"];

/// Named types that nccl-sys defines by hand; in the `signatures` module
/// bindgen refers to these instead of generating its own.
const OWN_TYPES: &[&str] = &[
    "ncclResult_t",
    "ncclDataType_t",
    "ncclRedOp_t",
    "ncclScalarResidence_t",
    "ncclCommMemStat_t",
    "ncclComm",
    "ncclComm_t",
    "ncclWindow",
    "ncclWindow_vidmem",
    "ncclWindow_t",
    "ncclParamHandle",
    "ncclParamHandle_t",
    "ncclUniqueId",
    "ncclConfig_t",
    "ncclConfig_v.*",
    "ncclCollConfig_t",
    "ncclCollConfig_v.*",
    "ncclConfigExt",
    "ncclConfigExt_t",
    "ncclSimInfo_t",
    "ncclSimInfo_v.*",
    "ncclEncryptionConfig_t",
    "ncclEncryptionConfig_v.*",
    "ncclWaitSignalDesc_t",
    "cudaStream_t",
    "CUstream_st",
    "cudaEvent_t",
    "CUevent_st",
];

/// Stand-ins for the system and CUDA headers `nccl.h` includes. Only the
/// names `nccl.h` uses are declared, with the definitions a real toolkit
/// gives them on LP64 Linux (CUDA 12.8 for the version checks; bf16 and
/// fp8 present, as in every wheel we pin).
const SHIM_HEADERS: &[(&str, &str)] = &[
    (
        "stddef.h",
        "#pragma once\ntypedef __SIZE_TYPE__ size_t;\n#define NULL ((void*)0)\n",
    ),
    (
        "stdint.h",
        "#pragma once\ntypedef signed char int8_t;\ntypedef short int16_t;\n\
         typedef int int32_t;\ntypedef long int64_t;\ntypedef unsigned char uint8_t;\n\
         typedef unsigned short uint16_t;\ntypedef unsigned int uint32_t;\n\
         typedef unsigned long uint64_t;\n",
    ),
    (
        "limits.h",
        "#pragma once\n#define INT_MAX 2147483647\n#define INT_MIN (-INT_MAX - 1)\n",
    ),
    (
        "cuda_runtime.h",
        "#pragma once\n#include <stddef.h>\n#include <stdint.h>\n#define CUDART_VERSION 12080\n\
         typedef struct CUstream_st* cudaStream_t;\ntypedef struct CUevent_st* cudaEvent_t;\n",
    ),
    ("cuda_fp16.h", "#pragma once\n"),
    (
        "cuda_bf16.h",
        "#pragma once\n#define __CUDA_BF16_TYPES_EXIST__\n",
    ),
    (
        "cuda_fp8.h",
        "#pragma once\n#define __CUDA_FP8_TYPES_EXIST__\n",
    ),
];

/// Where the reference file of `version` lives.
pub fn reference_path(version: &str) -> PathBuf {
    workspace_root()
        .join("crates/nccl-sys/tests/reference")
        .join(format!("nccl_{}.rs", version.replace('.', "_")))
}

/// Regenerates every reference file, or with `check` fails if any would
/// change.
pub fn run(check: bool) -> Result<()> {
    let libclang = fetch::libclang()?;
    // SAFETY: xtask is single-threaded here; clang-sys reads the variable
    // when bindgen first loads libclang, below.
    unsafe { std::env::set_var("LIBCLANG_PATH", &libclang) };
    let shim = workspace_root().join("target/bindgen/shim");
    std::fs::create_dir_all(&shim)?;
    for (name, text) in SHIM_HEADERS {
        std::fs::write(shim.join(name), text)?;
    }
    let mut stale = Vec::new();
    for pin in pins::NCCL.iter().filter(|p| p.reference) {
        let dir = fetch::nccl(pin)?;
        let text = generate(pin.version, &dir.join("include"), &shim)?;
        let path = reference_path(pin.version);
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current == text {
            eprintln!("xtask: {} is up to date", path.display());
        } else if check {
            stale.push(path);
        } else {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&path, text)?;
            eprintln!("xtask: wrote {}", path.display());
        }
    }
    if stale.is_empty() {
        Ok(())
    } else {
        let list: Vec<String> = stale.iter().map(|p| p.display().to_string()).collect();
        Err(format!(
            "reference bindings are stale (run `cargo xtask bindgen`): {}",
            list.join(", ")
        )
        .into())
    }
}

fn clang_args(include: &Path, shim: &Path) -> Vec<String> {
    vec![
        "-x".into(),
        "c".into(),
        "-std=c11".into(),
        "-nostdinc".into(),
        "--target=x86_64-unknown-linux-gnu".into(),
        format!("-isystem{}", shim.display()),
        format!("-I{}", include.display()),
    ]
}

fn base_builder(header: &str, include: &Path, shim: &Path) -> bindgen::Builder {
    bindgen::Builder::default()
        .header_contents("wrapper.h", header)
        .clang_args(clang_args(include, shim))
        .generate_comments(false)
        .layout_tests(false)
        .derive_debug(false)
        .derive_copy(false)
        .derive_default(false)
        .formatter(bindgen::Formatter::Prettyplease)
}

fn generate(version: &str, include: &Path, shim: &Path) -> Result<String> {
    let header_path = include.join("nccl.h");
    let header_bytes = std::fs::read(&header_path)?;

    // Pass 1: which functions does this header declare?
    let functions = base_builder("#include \"nccl.h\"\n", include, shim)
        .allowlist_function("nccl.*")
        .generate()
        .map_err(|e| format!("bindgen on {}: {e}", header_path.display()))?
        .to_string();
    let mut names: Vec<String> = functions
        .lines()
        .filter_map(|line| line.trim().strip_prefix("pub fn "))
        .filter_map(|rest| rest.split('(').next())
        .map(str::to_string)
        .filter(|name| !EXCLUDED_FUNCTIONS.contains(&name.as_str()))
        .collect();
    names.sort();
    names.dedup();

    // Pass 2: bindgen's own layout of every type and constant.
    let layout = base_builder("#include \"nccl.h\"\n", include, shim)
        .allowlist_type("nccl.*")
        .allowlist_var("NCCL_.*|nccl.*")
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .generate()
        .map_err(|e| format!("bindgen (layout) on {}: {e}", header_path.display()))?
        .to_string();

    // Pass 3: one function-pointer typedef per function, over our types.
    let mut wrapper = String::from("#include \"nccl.h\"\n");
    for name in &names {
        wrapper.push_str(&format!("typedef __typeof__({name}) *PFN_{name};\n"));
    }
    let mut signatures = base_builder(&wrapper, include, shim).allowlist_type("PFN_.*");
    for own in OWN_TYPES {
        signatures = signatures.blocklist_type(own);
    }
    let signatures = signatures
        .generate()
        .map_err(|e| format!("bindgen (signatures) on {}: {e}", header_path.display()))?
        .to_string();

    let mut out = String::new();
    out.push_str(&format!(
        "// Generated by `cargo xtask bindgen` from nccl.h of NCCL {version}\n\
         // (header sha256 {}, bindgen {}, libclang {}). Do not edit: run\n\
         // `cargo xtask bindgen` to regenerate, `cargo xtask bindgen --check` to verify.\n\n",
        sha256_hex(&header_bytes),
        BINDGEN_VERSION,
        pins::LIBCLANG.1,
    ));
    out.push_str("#[allow(dead_code, non_camel_case_types, non_upper_case_globals, non_snake_case, unused_qualifications)]\npub mod layout {\n");
    out.push_str(&indent(&layout));
    out.push_str("}\n\n");
    out.push_str("#[allow(dead_code, non_camel_case_types, non_upper_case_globals, non_snake_case, unused_imports)]\npub mod signatures {\n    use nccl_sys::*;\n\n");
    out.push_str(&indent(&signatures));
    out.push_str(
        "\n    /// Every host function this header declares (minus deliberate exclusions).\n",
    );
    out.push_str("    pub const FUNCTIONS: &[&str] = &[\n");
    for name in &names {
        out.push_str(&format!("        \"{name}\",\n"));
    }
    out.push_str("    ];\n}\n\n");
    out.push_str(&tables(&layout));
    out.push_str("/// Compile-time proof that each hand-written signature is bindgen's.\n");
    out.push_str(
        "#[allow(dead_code)]\nmod same_signatures {\n    use super::signatures as reference;\n\n",
    );
    for name in &names {
        out.push_str(&format!(
            "    const _: reference::PFN_{name} = None::<nccl_sys::pfn::{name}>;\n"
        ));
    }
    out.push_str("}\n");
    Ok(out)
}

const BINDGEN_VERSION: &str = "0.73.2";

/// Tables that let the tests compare by name, computed by rustc from
/// bindgen's definitions: every struct's size, alignment and field
/// offsets, every enumerator's value and every integer constant.
fn tables(layout: &str) -> String {
    let mut structs = String::new();
    let mut enums = String::new();
    let mut consts = String::new();
    let mut lines = layout.lines().peekable();
    while let Some(line) = lines.next() {
        if let Some(name) = line
            .strip_prefix("pub struct ")
            .and_then(|r| r.strip_suffix(" {"))
        {
            let mut fields = String::new();
            for field in lines.by_ref() {
                if field == "}" {
                    break;
                }
                let Some(rest) = field.trim().strip_prefix("pub ") else {
                    continue;
                };
                let Some((field_name, _)) = rest.split_once(':') else {
                    continue;
                };
                if field_name == "bindgen_union_field" {
                    continue;
                }
                fields.push_str(&format!(
                    "            (\"{field_name}\", ::core::mem::offset_of!(layout::{name}, {field_name})),\n"
                ));
            }
            structs.push_str(&format!(
                "    StructLayout {{\n        name: \"{name}\",\n        \
                 size: ::core::mem::size_of::<layout::{name}>(),\n        \
                 align: ::core::mem::align_of::<layout::{name}>(),\n        \
                 fields: &[\n{fields}        ],\n    }},\n"
            ));
        } else if let Some(name) = line
            .strip_prefix("impl ")
            .and_then(|r| r.strip_suffix(" {"))
        {
            let mut body = String::new();
            for item in lines.by_ref() {
                if item == "}" {
                    break;
                }
                body.push_str(item.trim());
            }
            for item in body.split("pub const ").skip(1) {
                if let Some((konst, _)) = item.split_once(':') {
                    enums.push_str(&format!(
                        "    (\"{name}\", \"{konst}\", layout::{name}::{konst}.0 as i64),\n"
                    ));
                }
            }
        } else if let Some(rest) = line.strip_prefix("pub const ")
            && let Some((konst, ty)) = rest.split_once(": ")
            && (ty.starts_with("u32 ") || ty.starts_with("i32 "))
        {
            consts.push_str(&format!("    (\"{konst}\", layout::{konst} as i64),\n"));
        }
    }
    format!(
        "/// Size, alignment and field offsets of one of bindgen's structs.\n\
         #[derive(Debug)]\npub struct StructLayout {{\n    pub name: &'static str,\n    \
         pub size: usize,\n    pub align: usize,\n    \
         pub fields: &'static [(&'static str, usize)],\n}}\n\n\
         /// Every struct of the header, laid out by rustc from bindgen's definition.\n\
         pub const STRUCTS: &[StructLayout] = &[\n{structs}];\n\n\
         /// Every enumerator: (enum, name, value).\n\
         pub const ENUMERATORS: &[(&str, &str, i64)] = &[\n{enums}];\n\n\
         /// Every integer `#define`: (name, value).\n\
         pub const CONSTANTS: &[(&str, i64)] = &[\n{consts}];\n\n"
    )
}

fn indent(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        if line.is_empty() {
            out.push('\n');
        } else {
            out.push_str("    ");
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sha256_matches_known_digests() {
        assert_eq!(
            super::sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            super::sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
