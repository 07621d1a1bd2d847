//! Pinned external inputs: NCCL wheels and the libclang bindgen runs on.
//!
//! Changing a pin is a deliberate commit: run `cargo xtask bindgen` in the
//! same change so the checked-in reference bindings follow.

/// One NCCL release we fetch from PyPI.
#[derive(Debug, Clone, Copy)]
pub struct NcclPin {
    /// `major.minor.patch`.
    pub version: &'static str,
    /// The PyPI package that carries it.
    pub package: &'static str,
    /// Whether `cargo xtask bindgen` generates reference bindings for it.
    pub reference: bool,
    /// Why it is pinned.
    pub why: &'static str,
}

/// Every NCCL release the tests and the binding generator use.
pub const NCCL: &[NcclPin] = &[
    NcclPin {
        version: "2.17.1",
        package: "nvidia-nccl-cu12",
        reference: false,
        why: "older than the supported floor: the loader must refuse it",
    },
    NcclPin {
        version: "2.18.3",
        package: "nvidia-nccl-cu12",
        reference: true,
        why: "oldest supported release",
    },
    NcclPin {
        version: "2.24.3",
        package: "nvidia-nccl-cu12",
        reference: true,
        why: "first release with fp8 (ncclFloat8e4m3, ncclFloat8e5m2)",
    },
    NcclPin {
        version: "2.28.9",
        package: "nvidia-nccl-cu13",
        reference: true,
        why: "what our GPU hosts run",
    },
    NcclPin {
        version: "2.32.3",
        package: "nvidia-nccl-cu13",
        reference: true,
        why: "newest release; the hand-written bindings follow its header",
    },
];

/// The NCCL release whose library the CPU tests load by default.
pub const NEWEST: &str = "2.32.3";

/// libclang for bindgen, from the `libclang` wheel on PyPI, so that the
/// generated output does not depend on whatever clang the machine has.
/// NVRTC for `cargo xtask kernels` (nccl-safe's one-shot kernel to PTX):
/// 12.4 emits PTX ISA 8.4, which drivers from 550 (CUDA 12.4) load.
pub const NVRTC: (&str, &str) = ("nvidia-cuda-nvrtc-cu12", "12.4.127");

pub const LIBCLANG: (&str, &str) = ("libclang", "18.1.1");

/// maturin, which builds the Python package's wheel (`cargo xtask py`).
pub const MATURIN: (&str, &str) = ("maturin", "1.16.0");
