//! NCCL-side memory: buffer registration, `ncclMemAlloc` allocations and
//! symmetric windows. Each is an RAII value that borrows what it needs.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use crate::buffer::{Access, DeviceBuffer, DeviceBufferMut};
use crate::comm::Comm;
use crate::dtype::NcclType;
use crate::error::Role;
use crate::library::Library;
use crate::{Error, Feature, Result};

/// Device memory from `ncclMemAlloc`, which every NCCL optimisation (user
/// buffer registration, NVLS, symmetric windows) can use. Freed with
/// `ncclMemFree` on drop, after the work queued on the communicator's
/// stream has finished (collectives on another stream are joined into it
/// after their enqueue); if it does not finish within the communicator's
/// timeout (a stuck collective), the memory is leaked rather than freed
/// under it.
pub struct NcclMemory<T: NcclType> {
    ptr: u64,
    len: usize,
    ctx: Arc<CudaContext>,
    /// The stream of the communicator it was allocated for: its work is
    /// what the drop waits for.
    stream: Arc<CudaStream>,
    /// How long the drop waits (the communicator's timeout).
    timeout: std::time::Duration,
    lib: &'static Library,
    _type: PhantomData<T>,
}

// SAFETY: the allocation is plain device memory owned by this value; moving
// the owner between threads is fine, and `&NcclMemory` only hands out the
// address.
unsafe impl<T: NcclType> Send for NcclMemory<T> {}
// SAFETY: as above.
unsafe impl<T: NcclType> Sync for NcclMemory<T> {}

impl<T: NcclType> std::fmt::Debug for NcclMemory<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclMemory")
            .field("len", &self.len)
            .field("device", &self.ctx.ordinal())
            .finish()
    }
}

impl<T: NcclType> NcclMemory<T> {
    /// Allocates `len` elements on `comm`'s device (NCCL 2.19+). The
    /// contents are unspecified until written.
    pub fn alloc(comm: &Comm, len: usize) -> Result<NcclMemory<T>> {
        const OP: &str = "ncclMemAlloc";
        let lib = comm.library();
        lib.capabilities().require(Feature::MemAlloc)?;
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(Error::Overflow {
                op: OP,
                count: len,
                factor: std::mem::size_of::<T>(),
            })?;
        let ctx = Arc::clone(comm.stream().context());
        ctx.bind_to_thread()
            .map_err(|source| Error::Cuda { op: OP, source })?;
        let alloc = lib.raw().ncclMemAlloc()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the current context is the device's.
        let code = unsafe { alloc(&mut ptr, bytes.max(1)) };
        lib.check(OP, code, std::ptr::null_mut())?;
        Ok(NcclMemory {
            ptr: ptr as u64,
            len,
            ctx,
            stream: Arc::clone(comm.stream()),
            timeout: comm.timeout(),
            lib,
            _type: PhantomData,
        })
    }

    /// The device address.
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }
}

impl<T: NcclType> Drop for NcclMemory<T> {
    fn drop(&mut self) {
        // Work that uses the memory may still be queued on the stream:
        // wait for it, with a deadline (a whole-context synchronize would
        // wait behind every other stream's work, a stuck kernel included).
        let _ = self.ctx.bind_to_thread();
        let finished = self.stream.record_event(None).is_ok_and(|event| {
            let waited = crate::comm::poll::poll_with_backoff(self.timeout, || {
                event.try_is_complete().map_err(|source| Error::Cuda {
                    op: "ncclMemFree",
                    source,
                })
            });
            matches!(waited, Ok(None))
        });
        if !finished {
            tracing::warn!(
                bytes = self.len * std::mem::size_of::<T>(),
                "NcclMemory dropped while work on it did not finish; leaked to stay sound"
            );
            return;
        }
        if let Ok(free) = self.lib.raw().ncclMemFree() {
            // SAFETY: `ptr` came from `ncclMemAlloc` and is freed once.
            let code = unsafe { free(self.ptr as *mut c_void) };
            if code != nccl_sys::ncclResult_t::ncclSuccess {
                tracing::warn!(?code, "ncclMemFree failed");
            }
        }
    }
}

// SAFETY: `len` elements at `ptr` on the allocation's device; the memory
// lives until `Drop`, which waits for the communicator stream's work first
// (and leaks the memory when that work does not finish).
unsafe impl<T: NcclType> DeviceBuffer<T> for NcclMemory<T> {
    fn len(&self) -> usize {
        self.len
    }
    fn device(&self) -> usize {
        self.ctx.ordinal()
    }
    fn read<'a>(&'a self, stream: &'a CudaStream) -> (u64, Access<'a>) {
        (self.ptr, Access::into_own(&self.stream, stream))
    }
}

// SAFETY: as above; work on another stream is joined into the
// communicator's stream after the enqueue, so the drop's wait covers it.
unsafe impl<T: NcclType> DeviceBufferMut<T> for NcclMemory<T> {
    fn write<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, Access<'a>) {
        (self.ptr, Access::into_own(&self.stream, stream))
    }
}

/// A buffer registered with a communicator (`ncclCommRegister`, NCCL
/// 2.19+) for zero-copy use. It owns the buffer, so the memory cannot go
/// away while registered, and passes it on to collectives (it is a
/// [`DeviceBuffer`] itself); dropping it deregisters, then drops the buffer.
/// [`Registration::into_inner`] deregisters and hands the buffer back.
pub struct Registration<'c, B> {
    comm: &'c Comm,
    handle: *mut c_void,
    buffer: Option<B>,
}

impl<B> std::fmt::Debug for Registration<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Registration { .. }")
    }
}

impl<'c, B> Registration<'c, B> {
    /// Registers `buffer` with `comm`.
    pub fn new<T: NcclType>(comm: &'c Comm, buffer: B) -> Result<Registration<'c, B>>
    where
        B: DeviceBuffer<T>,
    {
        const OP: &str = "ncclCommRegister";
        let lib = comm.library();
        lib.capabilities().require(Feature::Register)?;
        if crate::group::is_open() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "not allowed while a group is open on this thread",
            });
        }
        if buffer.device() != comm.device() {
            return Err(Error::WrongDevice {
                op: OP,
                role: Role::InPlace,
                expected: comm.device(),
                found: buffer.device(),
            });
        }
        let bytes = byte_len::<T>(OP, buffer.len())?;
        if bytes == 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "cannot register an empty buffer",
            });
        }
        let (ptr, access) = buffer.read(comm.stream());
        drop(access);
        let handle = comm.shared().with_raw(OP, |raw| {
            let register = lib.raw().ncclCommRegister()?;
            let mut handle: *mut c_void = std::ptr::null_mut();
            // SAFETY: `raw` is live; `bytes` bytes of device memory at `ptr`
            // that this value owns (through `buffer`) until deregistration.
            let code = unsafe { register(raw, ptr as *mut c_void, bytes, &mut handle) };
            lib.check(OP, code, raw)?;
            Ok(handle)
        })?;
        Ok(Registration {
            comm,
            handle,
            buffer: Some(buffer),
        })
    }

    /// Deregisters and returns the buffer. [`Error::Timeout`] when a group
    /// open on another thread held the communicator (through another
    /// handle, [`crate::Comm::share`]) for the whole timeout: the buffer, still
    /// registered, is then leaked.
    pub fn into_inner(mut self) -> Result<B> {
        self.deregister()?;
        // `new` always stores the buffer; only this method and `Drop` take it.
        Ok(self
            .buffer
            .take()
            .expect("a registration holds its buffer until into_inner or drop"))
    }

    /// `ncclCommDeregister`, once. An error of NCCL's is logged (the
    /// handle counts as released); [`Error::Timeout`], the wait for
    /// another thread's group, keeps the handle: the buffer must stay.
    fn deregister(&mut self) -> Result<()> {
        if self.handle.is_null() {
            return Ok(());
        }
        let lib = self.comm.library();
        let handle = self.handle;
        let result = self.comm.shared().with_raw("ncclCommDeregister", |raw| {
            let deregister = lib.raw().ncclCommDeregister()?;
            // SAFETY: `handle` came from `ncclCommRegister` on `raw` and is
            // released once (the field is nulled right after).
            let code = unsafe { deregister(raw, handle) };
            lib.check("ncclCommDeregister", code, raw)
        });
        match result {
            Err(e @ Error::Timeout { .. }) => {
                if let Some(buffer) = self.buffer.take() {
                    std::mem::forget(buffer);
                }
                Err(e)
            }
            other => {
                self.handle = std::ptr::null_mut();
                if let Err(e) = other {
                    tracing::debug!(error = %e, "ncclCommDeregister failed");
                }
                Ok(())
            }
        }
    }
}

impl<B> Drop for Registration<'_, B> {
    fn drop(&mut self) {
        if let Err(e) = self.deregister() {
            tracing::warn!(error = %e, "a registered buffer is leaked to stay sound");
        }
    }
}

/// `len` elements of `T` in bytes, or `Overflow` naming `op` when that
/// does not fit in a `usize`: checked before the size reaches NCCL.
fn byte_len<T>(op: &'static str, len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or(Error::Overflow {
            op,
            count: len,
            factor: std::mem::size_of::<T>(),
        })
}

/// A symmetric memory window (`ncclCommWindowRegister`, NCCL 2.27+) over a
/// buffer it owns and passes on to collectives. Registration and
/// deregistration are collective across the communicator's ranks: with a
/// thread per rank use [`Window::register`] and drop; with one thread
/// driving several communicators use [`Window::register_all`] and
/// [`Window::deregister_all`], which group the calls. NCCL wants the memory
/// from `ncclMemAlloc` ([`NcclMemory`]).
pub struct Window<'c, B> {
    comm: &'c Comm,
    /// Filled by NCCL (at group end inside `register_all`): a heap slot
    /// that stays put while the `Window` moves.
    win: Box<nccl_sys::ncclWindow_t>,
    buffer: ManuallyDrop<B>,
}

impl<B> std::fmt::Debug for Window<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Window { .. }")
    }
}

impl<'c, B> Window<'c, B> {
    /// Checks `buffer` and makes the unregistered window value.
    fn prepare<T: NcclType>(comm: &'c Comm, mut buffer: B) -> Result<(Window<'c, B>, u64, usize)>
    where
        B: DeviceBufferMut<T>,
    {
        const OP: &str = "ncclCommWindowRegister";
        comm.library().capabilities().require(Feature::Windows)?;
        if buffer.device() != comm.device() {
            return Err(Error::WrongDevice {
                op: OP,
                role: Role::InPlace,
                expected: comm.device(),
                found: buffer.device(),
            });
        }
        let bytes = byte_len::<T>(OP, buffer.len())?;
        if bytes == 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "cannot register an empty buffer",
            });
        }
        let (ptr, access) = buffer.write(comm.stream());
        drop(access);
        if ptr % nccl_sys::NCCL_WIN_REQUIRED_ALIGNMENT as u64 != 0 {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "the buffer is not aligned to NCCL_WIN_REQUIRED_ALIGNMENT (4096)",
            });
        }
        Ok((
            Window {
                comm,
                win: Box::new(std::ptr::null_mut()),
                buffer: ManuallyDrop::new(buffer),
            },
            ptr,
            bytes,
        ))
    }

    /// The registration call itself, into the window's heap slot.
    fn call(&mut self, ptr: u64, bytes: usize, flags: i32) -> Result<()> {
        const OP: &str = "ncclCommWindowRegister";
        let lib = self.comm.library();
        let slot: *mut nccl_sys::ncclWindow_t = &mut *self.win;
        // Inside a group NCCL refers to the communicator until its end: an
        // abort from another thread must wait for it.
        let grouped = crate::group::is_open();
        if grouped {
            crate::group::touch(self.comm.shared());
        }
        self.comm.shared().with_raw(OP, |raw| {
            if grouped {
                self.comm.shared().enter_group();
            }
            let register = lib.raw().ncclCommWindowRegister()?;
            // SAFETY: `raw` is live; `bytes` bytes of device memory at `ptr`
            // owned by this window; `slot` is a heap slot that lives as long
            // as the window.
            let code = unsafe { register(raw, ptr as *mut c_void, bytes, slot, flags) };
            lib.check(OP, code, raw)
        })
    }

    /// Registers `buffer` as a window with `NCCL_WIN_*` `flags`, on a
    /// communicator driven by its own thread. Not inside a group.
    pub fn register<T: NcclType>(comm: &'c Comm, buffer: B, flags: i32) -> Result<Window<'c, B>>
    where
        B: DeviceBufferMut<T>,
    {
        if crate::group::is_open() {
            return Err(Error::InvalidArgument {
                op: "ncclCommWindowRegister",
                reason: "not allowed while a group is open; use Window::register_all",
            });
        }
        let (mut window, ptr, bytes) = Self::prepare(comm, buffer)?;
        window.call(ptr, bytes, flags)?;
        Ok(window)
    }

    /// Registers one window per communicator, all in one group (one thread
    /// driving several communicators).
    pub fn register_all<T: NcclType>(
        comms: &[&'c Comm],
        buffers: Vec<B>,
        flags: i32,
    ) -> Result<Vec<Window<'c, B>>>
    where
        B: DeviceBufferMut<T>,
    {
        const OP: &str = "ncclCommWindowRegister";
        if comms.len() != buffers.len() {
            return Err(Error::InvalidArgument {
                op: OP,
                reason: "one buffer per communicator",
            });
        }
        // Every check before the group, so a refusal never leaves a partial
        // collective registration waiting for ranks that will not come.
        let mut prepared = Vec::with_capacity(comms.len());
        for (comm, buffer) in comms.iter().zip(buffers) {
            prepared.push(Self::prepare(comm, buffer)?);
        }
        let group: crate::GroupGuard<'_> = crate::GroupGuard::start()?;
        let mut failure = None;
        for (window, ptr, bytes) in &mut prepared {
            if let Err(e) = window.call(*ptr, *bytes, flags) {
                failure = Some(e);
                break;
            }
        }
        let ended = group.end();
        let windows: Vec<Window<'c, B>> = prepared.into_iter().map(|(w, _, _)| w).collect();
        if ended.is_err() && comms.iter().any(|c| !c.is_blocking()) {
            // A nonblocking registration may still be running in NCCL's
            // background job: keep every buffer and slot alive for good.
            tracing::warn!("window registration failed on a nonblocking communicator; leaked");
            std::mem::forget(windows);
            return Err(failure.or(ended.err()).unwrap_or(Error::InvalidArgument {
                op: OP,
                reason: "group end failed",
            }));
        }
        match failure.or(ended.err()) {
            Some(e) => {
                Window::deregister_all(windows);
                Err(e)
            }
            None => Ok(windows),
        }
    }

    /// Deregisters windows of several communicators driven by this thread
    /// in one group, then drops their buffers.
    pub fn deregister_all(mut windows: Vec<Window<'c, B>>) {
        match crate::GroupGuard::start() {
            Ok(group) => {
                for w in &mut windows {
                    // A window still registered is leaked by its drop.
                    let _ = w.deregister();
                }
                if let Err(e) = group.end() {
                    tracing::debug!(error = %e, "grouped ncclCommWindowDeregister failed");
                }
            }
            Err(e) => tracing::debug!(error = %e, "cannot group window deregistration"),
        }
        drop(windows);
    }

    /// `ncclCommWindowDeregister`, once, saying whether NCCL let go of the
    /// memory (a handle already released counts as yes); nulls the handle.
    pub(crate) fn try_deregister(&mut self) -> bool {
        if self.win.is_null() {
            return true;
        }
        let win = *self.win;
        let lib = self.comm.library();
        let result = self
            .comm
            .shared()
            .with_raw("ncclCommWindowDeregister", |raw| {
                let deregister = lib.raw().ncclCommWindowDeregister()?;
                // SAFETY: `win` came from `ncclCommWindowRegister` on `raw`
                // and is released once (the slot is nulled below).
                let code = unsafe { deregister(raw, win) };
                lib.check("ncclCommWindowDeregister", code, raw)
            });
        *self.win = std::ptr::null_mut();
        result.is_ok()
    }

    /// `ncclCommWindowDeregister`, once; nulls the handle, except after
    /// [`Error::Timeout`] (the wait for another thread's group): false then,
    /// and the buffer must stay.
    fn deregister(&mut self) -> bool {
        let win = *self.win;
        if win.is_null() {
            return true;
        }
        let lib = self.comm.library();
        let grouped = crate::group::is_open();
        if grouped {
            crate::group::touch(self.comm.shared());
        }
        let result = self
            .comm
            .shared()
            .with_raw("ncclCommWindowDeregister", |raw| {
                if grouped {
                    self.comm.shared().enter_group();
                }
                let deregister = lib.raw().ncclCommWindowDeregister()?;
                // SAFETY: `win` came from `ncclCommWindowRegister` on `raw` and
                // is released once (the slot is nulled below).
                let code = unsafe { deregister(raw, win) };
                lib.check("ncclCommWindowDeregister", code, raw)
            });
        match result {
            Err(Error::Timeout { .. }) => return false,
            Err(e) => tracing::debug!(error = %e, "ncclCommWindowDeregister failed"),
            Ok(()) => {}
        }
        *self.win = std::ptr::null_mut();
        true
    }

    /// The raw window handle.
    pub fn raw(&self) -> nccl_sys::ncclWindow_t {
        *self.win
    }
}

impl<B> Drop for Window<'_, B> {
    fn drop(&mut self) {
        if crate::group::is_open() {
            // NCCL would deregister at the group's end, after the buffer is
            // gone: keep the buffer and the slot alive for good instead.
            tracing::warn!(
                "a Window was dropped inside a group; its memory is leaked to stay sound"
            );
            let slot = std::mem::replace(&mut self.win, Box::new(std::ptr::null_mut()));
            std::mem::forget(slot);
            return;
        }
        if !self.deregister() {
            // Still registered (another thread's group held the
            // communicator past the timeout): the memory stays.
            tracing::warn!("a Window's memory is leaked to stay sound");
            let slot = std::mem::replace(&mut self.win, Box::new(std::ptr::null_mut()));
            std::mem::forget(slot);
            return;
        }
        // SAFETY: deregistered; the buffer is dropped exactly once, here.
        unsafe { ManuallyDrop::drop(&mut self.buffer) };
    }
}

/// Registered buffers and windows are buffers too: collectives take them
/// directly.
macro_rules! delegate_buffer {
    ($ty:ident, $field:ident $(, $get:ident)?) => {
        // SAFETY: forwards to the owned buffer, whose contract holds; the
        // wrapper only adds a registration.
        unsafe impl<T: NcclType, B: DeviceBuffer<T>> DeviceBuffer<T> for $ty<'_, B> {
            fn len(&self) -> usize {
                delegate_buffer!(@get self.$field $(, $get)?).len()
            }
            fn device(&self) -> usize {
                delegate_buffer!(@get self.$field $(, $get)?).device()
            }
            fn read<'a>(&'a self, stream: &'a CudaStream) -> (u64, Access<'a>) {
                delegate_buffer!(@get self.$field $(, $get)?).read(stream)
            }
        }
        // SAFETY: as above.
        unsafe impl<T: NcclType, B: DeviceBufferMut<T>> DeviceBufferMut<T> for $ty<'_, B> {
            fn write<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, Access<'a>) {
                delegate_buffer!(@get_mut self.$field $(, $get)?).write(stream)
            }
        }
    };
    (@get $e:expr, option) => { $e.as_ref().expect("present until into_inner") };
    (@get $e:expr) => { &*$e };
    (@get_mut $e:expr, option) => { $e.as_mut().expect("present until into_inner") };
    (@get_mut $e:expr) => { &mut *$e };
}

delegate_buffer!(Registration, buffer, option);
delegate_buffer!(Window, buffer);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_size_that_overflows_is_a_typed_error() {
        // What `Registration::new` computes before `ncclCommRegister`: an
        // unchecked `len * size_of::<T>()` wrapped (release) or panicked
        // (debug) here, and a wrapped size would have registered the wrong
        // range.
        let len = usize::MAX / 4 + 1;
        let err = byte_len::<f32>("ncclCommRegister", len).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Overflow {
                    op: "ncclCommRegister",
                    count,
                    factor: 4,
                } if count == len
            ),
            "{err:?}"
        );
        assert!(matches!(
            byte_len::<f64>("ncclCommRegister", usize::MAX),
            Err(Error::Overflow { factor: 8, .. })
        ));
        // The largest length that fits still does, exactly.
        assert_eq!(
            byte_len::<f32>("ncclCommRegister", usize::MAX / 4).unwrap(),
            usize::MAX / 4 * 4
        );
        assert_eq!(
            byte_len::<u8>("ncclCommRegister", usize::MAX).unwrap(),
            usize::MAX
        );
        assert_eq!(byte_len::<f32>("ncclCommRegister", 0).unwrap(), 0);
    }
}
