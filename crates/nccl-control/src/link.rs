//! One authenticated liveness connection ([`Link`]): its socket, the
//! sealer and opener of its session, and the buffers that keep its steady
//! state free of allocation. The rendezvous makes links; the engine
//! watches them.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::wire::{FrameBuf, MAX_FRAME, Msg, Opener, Sealer};

/// Bytes the thread reads from a connection at once.
pub(super) const READ_CHUNK: usize = 2 * MAX_FRAME;
/// A guard on reads the thread makes only after `poll` said "readable".
const READ_GUARD: Duration = Duration::from_millis(100);
/// How long a write of one small frame may block (the peer stopped
/// reading and its buffers are full: it will be found silent anyway).
const WRITE_GUARD: Duration = Duration::from_secs(1);

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A hook that panicked cannot leave this state half-written (hooks run
    // with no lock held), so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One authenticated liveness connection, to the hub or to a member.
pub(crate) struct Link {
    pub(super) peer: usize,
    /// The peer is this rank's hub (this side is the member).
    pub(super) to_hub: bool,
    pub(super) stream: TcpStream,
    pub(super) tx: Mutex<Tx>,
    pub(super) rx: Mutex<Rx>,
    pub(super) goodbye: AtomicBool,
}

/// The sending side of a link: its sealer and the buffer every frame is
/// sealed into (kept, so a heartbeat allocates nothing).
pub(super) struct Tx {
    sealer: Sealer,
    frame: Vec<u8>,
}

/// The receiving side of a link. Its buffer has room for a partial frame
/// and a whole read, so cutting frames allocates nothing.
pub(super) struct Rx {
    pub(super) opener: Opener,
    pub(super) buf: FrameBuf,
    pub(super) last_heard: Instant,
}

impl Link {
    /// A link to `peer` over `stream`, whose handshake and attach are
    /// done; `to_hub` when `peer` is this rank's hub.
    pub(crate) fn new(
        peer: usize,
        to_hub: bool,
        stream: TcpStream,
        sealer: Sealer,
        opener: Opener,
    ) -> std::io::Result<Link> {
        // Losses are tiny frames that must not wait for an acknowledgement.
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(READ_GUARD))?;
        stream.set_write_timeout(Some(WRITE_GUARD))?;
        Ok(Link {
            peer,
            to_hub,
            stream,
            tx: Mutex::new(Tx {
                sealer,
                frame: Vec::with_capacity(MAX_FRAME),
            }),
            rx: Mutex::new(Rx {
                opener,
                buf: FrameBuf::with_capacity(READ_CHUNK + MAX_FRAME),
                last_heard: Instant::now(),
            }),
            goodbye: AtomicBool::new(false),
        })
    }

    /// Seals and writes one message; false when it could not be sent (the
    /// reading side finds out why).
    pub(super) fn send(&self, msg: &Msg) -> bool {
        // The sealer's lock is held across the write so counters reach the
        // wire in order whichever thread sends.
        let tx = &mut *lock(&self.tx);
        match tx.sealer.seal_into(msg, &mut tx.frame) {
            Ok(()) => (&self.stream).write_all(&tx.frame).is_ok(),
            Err(_) => false,
        }
    }

    pub(super) fn last_heard(&self) -> Instant {
        lock(&self.rx).last_heard
    }

    pub(super) fn shut(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}
