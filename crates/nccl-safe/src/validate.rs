//! Checks every collective runs before any FFI call: `Check`'s methods are pure
//! functions of addresses and counts, tested without a GPU; `check_dtype`
//! asks the loaded library and the GPU.

use crate::capabilities::{FP8_REDUCTION_MIN_CC, Feature};
use crate::comm::Comm;
use crate::dtype::NcclType;
use crate::error::{Error, Result, Role};

/// `Err(error)`, on a path the compiler is told is cold: the checks'
/// error branches then sit out of line, after the code every valid call
/// runs. Between two calls NCCL's enqueue evicts our code from the nearer
/// caches, so each instruction cache line the valid path spans is fetched
/// again on every call (`segments.rs`); fewer lines, less time.
#[cold]
#[inline(never)]
pub(crate) fn cold_err<T>(error: Error) -> Result<T> {
    Err(error)
}

/// A buffer as validation sees it: address, elements, device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    pub ptr: u64,
    pub len: usize,
    pub device: usize,
}

/// The operation being validated and the communicator it runs on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Check {
    pub op: &'static str,
    pub rank: usize,
    pub size: usize,
    pub device: usize,
    pub elem_bytes: usize,
}

impl Check {
    pub fn device(&self, role: Role, span: Span) -> Result<()> {
        if span.device == self.device {
            Ok(())
        } else {
            cold_err(Error::WrongDevice {
                op: self.op,
                role,
                expected: self.device,
                found: span.device,
            })
        }
    }

    /// `span` is on this device and holds at least `needed` elements.
    pub fn holds(&self, role: Role, span: Span, needed: usize) -> Result<()> {
        self.device(role, span)?;
        self.at_least(role, span, needed)
    }

    /// `len` split into one block per rank: the block length, refused
    /// with `reason` when `len` is not a multiple of the number of ranks.
    pub fn blocks(&self, len: usize, reason: &'static str) -> Result<usize> {
        if !len.is_multiple_of(self.size) {
            return cold_err(Error::InvalidArgument {
                op: self.op,
                reason,
            });
        }
        Ok(len / self.size)
    }

    /// `span` must hold at least `needed` elements.
    pub fn at_least(&self, role: Role, span: Span, needed: usize) -> Result<()> {
        if span.len >= needed {
            Ok(())
        } else {
            cold_err(Error::Length {
                op: self.op,
                role,
                needed,
                given: span.len,
            })
        }
    }

    /// `count * factor`, refusing overflow (of the element count and of the
    /// byte size it implies).
    pub fn times(&self, count: usize, factor: usize) -> Result<usize> {
        match count.checked_mul(factor).filter(|n| {
            n.checked_mul(self.elem_bytes)
                .is_some_and(|b| b <= isize::MAX as usize)
        }) {
            Some(n) => Ok(n),
            None => cold_err(Error::Overflow {
                op: self.op,
                count,
                factor,
            }),
        }
    }

    /// A root or peer in `0..size`.
    pub fn rank(&self, what: &'static str, rank: usize) -> Result<()> {
        if rank < self.size {
            Ok(())
        } else {
            cold_err(Error::RankOutOfRange {
                op: self.op,
                what,
                rank,
                size: self.size,
            })
        }
    }

    /// The first `send_len` elements of `send` and `recv_len` of `recv`
    /// must not overlap, unless `send` starts exactly `in_place_offset`
    /// elements into `recv` (NCCL's in-place layout for the operation).
    pub fn aliasing(
        &self,
        send: Span,
        send_len: usize,
        recv: Span,
        recv_len: usize,
        in_place_offset: Option<usize>,
    ) -> Result<()> {
        let send_bytes = send_len.saturating_mul(self.elem_bytes);
        let recv_bytes = recv_len.saturating_mul(self.elem_bytes);
        if send_bytes == 0 || recv_bytes == 0 {
            return Ok(());
        }
        let overlap = send.ptr < recv.ptr.saturating_add(recv_bytes as u64)
            && recv.ptr < send.ptr.saturating_add(send_bytes as u64);
        if !overlap {
            return Ok(());
        }
        if let Some(offset) = in_place_offset
            && offset
                .checked_mul(self.elem_bytes)
                .and_then(|b| recv.ptr.checked_add(b as u64))
                .is_some_and(|p| p == send.ptr)
        {
            return Ok(());
        }
        cold_err(Error::PartialAlias {
            op: self.op,
            send: send.ptr,
            send_bytes,
            recv: recv.ptr,
            recv_bytes,
        })
    }

    /// Per-peer segments `(count, displacement)` of an all-to-all-v side:
    /// one per rank, each inside a buffer of `len` elements.
    pub fn segments(
        &self,
        role: Role,
        counts: &[usize],
        displs: &[usize],
        len: usize,
    ) -> Result<()> {
        if counts.len() != self.size || displs.len() != self.size {
            return Err(Error::Length {
                op: self.op,
                role,
                needed: self.size,
                given: counts.len().min(displs.len()),
            });
        }
        for (&count, &displ) in counts.iter().zip(displs) {
            let end = displ.checked_add(count).ok_or(Error::Overflow {
                op: self.op,
                count,
                factor: 1,
            })?;
            self.times(end, 1)?;
            if end > len {
                return Err(Error::Length {
                    op: self.op,
                    role,
                    needed: end,
                    given: len,
                });
            }
        }
        Ok(())
    }
}

/// Refuses `T` where the library (fp8 before 2.24) or, for reductions, the
/// GPU (fp8 below compute capability 9.0) cannot handle it.
pub(crate) fn check_dtype<T: NcclType>(comm: &Comm, op: &'static str, reduces: bool) -> Result<()> {
    if T::IS_FP8 {
        comm.capabilities().require(Feature::Fp8)?;
        let cc = comm.compute_capability();
        if reduces && cc < FP8_REDUCTION_MIN_CC {
            let _ = op;
            return Err(Error::Unsupported {
                what: "fp8 reductions",
                requires: format!(
                    "compute capability {}.{}",
                    FP8_REDUCTION_MIN_CC.0, FP8_REDUCTION_MIN_CC.1
                ),
                found: format!(
                    "compute capability {}.{} on device {}",
                    cc.0,
                    cc.1,
                    comm.device()
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHECK: Check = Check {
        op: "test",
        rank: 1,
        size: 4,
        device: 2,
        elem_bytes: 4,
    };

    fn span(ptr: u64, len: usize) -> Span {
        Span {
            ptr,
            len,
            device: 2,
        }
    }

    #[test]
    fn a_buffer_on_another_device_is_refused_with_both_devices() {
        let err = CHECK
            .device(
                Role::Send,
                Span {
                    ptr: 0,
                    len: 1,
                    device: 0,
                },
            )
            .unwrap_err();
        assert!(matches!(
            err,
            Error::WrongDevice {
                expected: 2,
                found: 0,
                role: Role::Send,
                ..
            }
        ));
        assert!(CHECK.device(Role::Recv, span(0, 1)).is_ok());
    }

    #[test]
    fn a_short_buffer_reports_needed_and_given() {
        let err = CHECK.at_least(Role::Recv, span(0, 7), 8).unwrap_err();
        assert!(matches!(
            err,
            Error::Length {
                needed: 8,
                given: 7,
                role: Role::Recv,
                ..
            }
        ));
        assert!(CHECK.at_least(Role::Recv, span(0, 9), 8).is_ok());
        assert_eq!(
            err.to_string(),
            "test: receive buffer holds 7 elements, needs 8"
        );
    }

    #[test]
    fn counts_that_overflow_are_refused() {
        assert!(matches!(
            CHECK.times(usize::MAX / 2, 4),
            Err(Error::Overflow { .. })
        ));
        // Fits in elements but not in bytes.
        assert!(matches!(
            CHECK.times(isize::MAX as usize / 4 + 1, 1),
            Err(Error::Overflow { .. })
        ));
        assert_eq!(CHECK.times(10, 4).unwrap(), 40);
    }

    #[test]
    fn ranks_outside_the_communicator_are_refused() {
        assert!(CHECK.rank("root", 3).is_ok());
        let err = CHECK.rank("peer", 4).unwrap_err();
        assert!(matches!(
            err,
            Error::RankOutOfRange {
                what: "peer",
                rank: 4,
                size: 4,
                ..
            }
        ));
    }

    #[test]
    fn disjoint_buffers_pass_and_partial_overlap_fails() {
        // 4-byte elements: [0x1000, 0x1010) and [0x1010, 0x1020) touch only.
        assert!(
            CHECK
                .aliasing(span(0x1000, 4), 4, span(0x1010, 4), 4, None)
                .is_ok()
        );
        let err = CHECK
            .aliasing(span(0x1004, 4), 4, span(0x1000, 4), 4, None)
            .unwrap_err();
        assert!(matches!(
            err,
            Error::PartialAlias {
                send: 0x1004,
                recv: 0x1000,
                ..
            }
        ));
    }

    #[test]
    fn the_exact_in_place_layout_passes() {
        // all_gather on rank 1 with 4 elements per rank: send at recv + 4.
        let recv = span(0x1000, 16);
        assert!(
            CHECK
                .aliasing(span(0x1010, 4), 4, recv, 16, Some(4))
                .is_ok()
        );
        // One element off is a partial alias.
        assert!(
            CHECK
                .aliasing(span(0x1014, 4), 4, recv, 16, Some(4))
                .is_err()
        );
        // Identical buffers are in place only where the op defines offset 0.
        assert!(
            CHECK
                .aliasing(span(0x1000, 4), 4, span(0x1000, 4), 4, Some(0))
                .is_ok()
        );
        assert!(
            CHECK
                .aliasing(span(0x1000, 4), 4, span(0x1000, 4), 4, None)
                .is_err()
        );
    }

    #[test]
    fn empty_ranges_never_alias() {
        assert!(
            CHECK
                .aliasing(span(0x1000, 0), 0, span(0x1000, 4), 4, None)
                .is_ok()
        );
    }

    #[test]
    fn all_to_all_v_segments_must_fit_and_cover_every_rank() {
        assert!(
            CHECK
                .segments(Role::Send, &[1, 2, 3, 4], &[0, 1, 3, 6], 10)
                .is_ok()
        );
        let err = CHECK
            .segments(Role::Send, &[1, 2, 3, 4], &[0, 1, 3, 7], 10)
            .unwrap_err();
        assert!(matches!(
            err,
            Error::Length {
                needed: 11,
                given: 10,
                ..
            }
        ));
        let err = CHECK
            .segments(Role::Recv, &[1, 2, 3], &[0, 1, 3], 10)
            .unwrap_err();
        assert!(matches!(
            err,
            Error::Length {
                needed: 4,
                given: 3,
                role: Role::Recv,
                ..
            }
        ));
        assert!(matches!(
            CHECK.segments(Role::Send, &[usize::MAX, 0, 0, 0], &[1, 0, 0, 0], 10),
            Err(Error::Overflow { .. })
        ));
    }
}
