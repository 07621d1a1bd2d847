//! Raw, hand-checked FFI for NVIDIA NCCL 2.18 through 2.32, loaded at run
//! time.
//!
//! This is the bottom layer of the workspace. It adds exactly three things
//! to NCCL's C header and no policy:
//!
//! - **Declarations written by hand**, with docs and the release that added
//!   each item, for all 72 public host functions of NCCL 2.32.3 and every
//!   type, constant and versioned struct they use. They are checked by the
//!   compiler against bindgen's output for the pinned headers of 2.18.3,
//!   2.24.3, 2.28.9 and 2.32.3 (`tests/reference.rs`; regenerate with
//!   `cargo xtask bindgen`). Users never need libclang.
//! - **Open enums.** `ncclResult_t`, `ncclDataType_t`, `ncclRedOp_t` and the
//!   other C enums are `#[repr(transparent)]` newtypes with associated
//!   consts, so a value from a newer library (a new error code, a PreMulSum
//!   op handle) is a plain number, never undefined behaviour.
//! - **A dynamic loader.** [`Nccl`] finds libnccl (see [`search`] for the
//!   order), checks that it is NCCL 2.18 or newer, and resolves each
//!   function lazily on first use: a function an older library lacks is a
//!   [`SymbolError`], not a panic and not a failed load.
//!
//! What it leaves to `nccl-safe`: ownership of communicators, validation of
//! arguments, error types with context, and thread-safety rules. Everything
//! here that calls NCCL is `unsafe`.
//!
//! # Example
//!
//! ```no_run
//! use nccl_sys::{Nccl, Symbol};
//!
//! // SAFETY: we trust the libnccl that the search order finds.
//! let nccl = unsafe { Nccl::load() }?;
//! println!("NCCL {} from {}", nccl.version(), nccl.path().display());
//! if !nccl.has(Symbol::ncclCommShrink) {
//!     println!("this NCCL cannot shrink communicators");
//! }
//! let mut id = nccl_sys::ncclUniqueId::zeroed();
//! // SAFETY: `ncclGetUniqueId` writes one `ncclUniqueId` through the pointer.
//! let result = unsafe { nccl.ncclGetUniqueId()?(&mut id) };
//! assert!(result.is_success());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Naming
//!
//! Items keep their C names (`ncclConfig_t`, `ncclSum`), so the NCCL
//! documentation applies word for word. Function-pointer types are in
//! [`pfn`] (`pfn::ncclAllReduce`); [`Nccl`] has one accessor per function
//! with the same name.
//!
//! # Versioned structs
//!
//! See [`structs`] for the rule that lets a struct laid out as 2.32 has it
//! be passed to an older library without losing settings silently.

#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

pub mod error;
pub mod functions;
pub mod id_text;
pub mod library;
pub mod search;
pub mod structs;
pub mod types;
pub mod version;

pub use error::{Attempt, AttemptFailure, LoadError, Result, SymbolError};
pub use functions::{Symbol, pfn};
pub use id_text::IdTextError;
pub use library::Nccl;
pub use search::{Candidate, SearchPaths, Source};
pub use structs::*;
pub use types::*;
pub use version::Version;
