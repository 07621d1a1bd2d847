//! The liveness messages on the wire: the session key, sealing and
//! opening frames (MAC and per-direction counter), and cutting frames out
//! of a byte stream. Pure functions and small state machines, no sockets.

use std::net::SocketAddr;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::culprit::{Call, Checked, Divergence};
use crate::frame::{MAX_PAYLOAD, RendezvousError, decode_header, encode_frame};
use crate::loss::{LivenessError, PeerLoss};
use crate::secret::Secret;

mod body;
mod exchange;
pub(crate) use body::ROSTER_CHUNK;
use body::{decode_addr, decode_loss, decode_roster, encode_loss, encode_roster, write_addr};
pub use exchange::KEY_MAX;
use exchange::{decode_check, decode_checked, decode_key, decode_tail, decode_verdict};
use exchange::{encode_check, encode_checked, encode_key, encode_tail, encode_verdict};

/// Bytes of a MAC tag (HMAC-SHA256, untruncated).
const TAG: usize = 32;
/// Bytes of the counter in front of every body.
const COUNTER: usize = 8;
/// Bytes of a frame header (magic, version, kind, length).
pub(crate) const HEADER: usize = 11;

/// Which way a frame travels; part of every MAC, so a frame cannot be
/// reflected back to its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Dir {
    /// Hub to member.
    Down = 0,
    /// Member to hub.
    Up = 1,
}

/// Frame kinds of the liveness phase (the handshake uses 1 to 5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    Attach = 16,
    Attached = 17,
    Heartbeat = 18,
    Lost = 19,
    Report = 20,
    Goodbye = 21,
    Roster = 22,
    Left = 23,
    Tail = 24,
    Ask = 25,
    Verdict = 26,
    Check = 27,
    Checked = 28,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            16 => Kind::Attach,
            17 => Kind::Attached,
            18 => Kind::Heartbeat,
            19 => Kind::Lost,
            20 => Kind::Report,
            21 => Kind::Goodbye,
            22 => Kind::Roster,
            23 => Kind::Left,
            24 => Kind::Tail,
            25 => Kind::Ask,
            26 => Kind::Verdict,
            27 => Kind::Check,
            28 => Kind::Checked,
            _ => return None,
        })
    }

    /// Whether this kind may travel in `dir`.
    fn allowed(self, dir: Dir) -> bool {
        match self {
            Kind::Heartbeat | Kind::Goodbye => true,
            Kind::Attach | Kind::Report | Kind::Tail | Kind::Check => dir == Dir::Up,
            Kind::Attached
            | Kind::Lost
            | Kind::Roster
            | Kind::Left
            | Kind::Ask
            | Kind::Verdict
            | Kind::Checked => dir == Dir::Down,
        }
    }
}

/// One liveness message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Msg {
    /// Member: "keep this connection as my liveness channel", and where
    /// it listens should it have to take over as hub.
    Attach {
        /// The member's takeover listener, if it has one.
        listen: Option<SocketAddr>,
    },
    /// Hub: "kept".
    Attached,
    /// Either side: still here.
    Heartbeat,
    /// Hub: this rank was lost.
    Lost(PeerLoss),
    /// Member: this rank found a loss (its own thread, or a peer).
    Report(PeerLoss),
    /// Either side: a clean end; the close that follows is not a loss.
    Goodbye,
    /// Rank 0: where members listen for a takeover (part of the roster;
    /// a long roster takes several frames).
    Roster(Vec<(usize, SocketAddr)>),
    /// Hub: this rank ended cleanly (said goodbye); not a loss, and not a
    /// candidate to take over.
    Left(usize),
    /// Member: the newest calls of its flight recorder for the
    /// communicator `key` (at most [`TAIL_MAX`]), after a timeout there or
    /// when the hub asked.
    Tail {
        /// The communicator's label with the rank taken out.
        key: String,
        /// Sequence numbers and calls, oldest first.
        calls: Vec<(u64, Call)>,
    },
    /// Hub: send your tail of the communicator `key` (one rank timed out).
    Ask {
        /// The communicator's key.
        key: String,
    },
    /// Hub: where the ranks of `key` disagree (`None`: they agree on
    /// every call the tails cover, or too few tails came in time).
    Verdict {
        /// The communicator's key.
        key: String,
        /// The divergence.
        divergence: Option<Box<Divergence>>,
    },
    /// Member: about to launch `call`, its `seq`-th checked call on `key`.
    Check { key: String, seq: u64, call: Call },
    /// Hub: what the check `seq` of `key` found.
    Checked {
        key: String,
        seq: u64,
        outcome: Checked,
    },
}

impl Msg {
    fn kind(&self) -> Kind {
        match self {
            Msg::Attach { .. } => Kind::Attach,
            Msg::Attached => Kind::Attached,
            Msg::Heartbeat => Kind::Heartbeat,
            Msg::Lost(_) => Kind::Lost,
            Msg::Report(_) => Kind::Report,
            Msg::Goodbye => Kind::Goodbye,
            Msg::Roster(_) => Kind::Roster,
            Msg::Left(_) => Kind::Left,
            Msg::Tail { .. } => Kind::Tail,
            Msg::Ask { .. } => Kind::Ask,
            Msg::Verdict { .. } => Kind::Verdict,
            Msg::Check { .. } => Kind::Check,
            Msg::Checked { .. } => Kind::Checked,
        }
    }
}

/// The per-connection key: both nonces make it fresh for every connection,
/// the label keeps it apart from the handshake's MACs.
#[derive(Clone)]
pub(crate) struct SessionKey([u8; 32]);

#[cfg(test)]
impl SessionKey {
    /// The key's bytes, for the protocol's test vectors.
    pub(crate) fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl std::fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionKey(..)")
    }
}

fn keyed(key: &[u8]) -> Result<Hmac<Sha256>, LivenessError> {
    // HMAC takes keys of any length; the error cannot happen, but is
    // carried rather than unwrapped.
    <Hmac<Sha256> as Mac>::new_from_slice(key).map_err(|_| LivenessError::Crypto)
}

/// `HMAC-SHA256(secret, "nccl-rs liveness key" ‖ nonce_s ‖ nonce_c ‖ rank ‖ world)`.
pub(crate) fn session_key(
    secret: &Secret,
    nonce_s: &[u8],
    nonce_c: &[u8],
    rank: usize,
    world: usize,
) -> Result<SessionKey, LivenessError> {
    let mut m = keyed(secret.bytes())?;
    m.update(b"nccl-rs liveness key");
    m.update(nonce_s);
    m.update(nonce_c);
    m.update(&(rank as u32).to_be_bytes());
    m.update(&(world as u32).to_be_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(&m.finalize().into_bytes());
    Ok(SessionKey(key))
}

fn tag(
    key: &SessionKey,
    dir: Dir,
    kind: u8,
    counter: &[u8],
    body: &[u8],
) -> Result<Hmac<Sha256>, LivenessError> {
    let mut m = keyed(&key.0)?;
    m.update(b"nccl-rs liveness frame");
    m.update(&[dir as u8, kind]);
    m.update(counter);
    m.update(body);
    Ok(m)
}

/// Seals outgoing frames of one direction of one connection.
#[derive(Debug)]
pub(crate) struct Sealer {
    key: SessionKey,
    dir: Dir,
    next: u64,
    /// A frame header as the rendezvous framing writes it (magic,
    /// version); kind and length are filled in per frame.
    header: [u8; HEADER],
}

impl Sealer {
    pub(crate) fn new(key: SessionKey, dir: Dir) -> Sealer {
        // The rendezvous framing's own header, made once per connection so
        // sealing never allocates for it and the bytes stay that framing's.
        let mut header = [0u8; HEADER];
        header.copy_from_slice(&encode_frame(0, &[])[..HEADER]);
        Sealer {
            key,
            dir,
            next: 0,
            header,
        }
    }

    /// The whole frame for `msg`, header included; the counter advances.
    pub(crate) fn seal(&mut self, msg: &Msg) -> Result<Vec<u8>, LivenessError> {
        let mut out = Vec::with_capacity(MAX_FRAME);
        self.seal_into(msg, &mut out)?;
        Ok(out)
    }

    /// As [`Sealer::seal`], into `out` (emptied first). With `out` holding
    /// [`MAX_FRAME`] bytes of capacity this never allocates for a message
    /// without a body (a heartbeat, a goodbye) or with a fixed-size one.
    pub(crate) fn seal_into(&mut self, msg: &Msg, out: &mut Vec<u8>) -> Result<(), LivenessError> {
        let kind = msg.kind() as u8;
        let counter = self.next.to_be_bytes();
        out.clear();
        out.extend_from_slice(&self.header);
        out.extend_from_slice(&counter);
        let body_at = out.len();
        match msg {
            Msg::Lost(loss) | Msg::Report(loss) => encode_loss(loss, out),
            Msg::Attach { listen: Some(a) } => write_addr(a, out),
            Msg::Roster(entries) => encode_roster(entries, out),
            Msg::Left(rank) => out.extend_from_slice(&(*rank as u32).to_be_bytes()),
            Msg::Tail { key, calls } => encode_tail(key, calls, out),
            Msg::Ask { key } => encode_key(key, out),
            Msg::Verdict { key, divergence } => encode_verdict(key, divergence, out),
            Msg::Check { key, seq, call } => encode_check(key, *seq, call, out),
            Msg::Checked { key, seq, outcome } => encode_checked(key, *seq, outcome, out),
            Msg::Attach { listen: None } | Msg::Attached | Msg::Heartbeat | Msg::Goodbye => {}
        }
        let len = out.len() - HEADER + TAG;
        if len > MAX_PAYLOAD as usize {
            // Cannot happen with the bounds above; a frame the peer would
            // refuse is never sent.
            out.clear();
            return Err(LivenessError::Malformed("a message over the frame cap"));
        }
        let t = tag(&self.key, self.dir, kind, &counter, &out[body_at..])?
            .finalize()
            .into_bytes();
        out.extend_from_slice(&t);
        out[6] = kind;
        out[7..HEADER].copy_from_slice(&(len as u32).to_be_bytes());
        self.next = self.next.wrapping_add(1);
        Ok(())
    }
}

/// Opens incoming frames of one direction of one connection: checks the
/// kind, the MAC and that the counter is exactly the next one (no replay,
/// no reordering, no gap).
#[derive(Debug)]
pub(crate) struct Opener {
    key: SessionKey,
    dir: Dir,
    next: u64,
    world: usize,
}

impl Opener {
    pub(crate) fn new(key: SessionKey, dir: Dir, world: usize) -> Opener {
        Opener {
            key,
            dir,
            next: 0,
            world,
        }
    }

    /// The message in one frame's kind and payload.
    pub(crate) fn open(&mut self, kind: u8, payload: &[u8]) -> Result<Msg, LivenessError> {
        let k = Kind::from_u8(kind).ok_or(LivenessError::UnknownKind { kind })?;
        if !k.allowed(self.dir) {
            return Err(LivenessError::WrongDirection { kind });
        }
        if payload.len() < COUNTER + TAG {
            return Err(LivenessError::Malformed(
                "a liveness frame shorter than its counter and tag",
            ));
        }
        let (counter, rest) = payload.split_at(COUNTER);
        let (body, t) = rest.split_at(rest.len() - TAG);
        // The MAC first: nothing of an unauthenticated frame is believed,
        // its counter included.
        tag(&self.key, self.dir, kind, counter, body)?
            .verify_slice(t)
            .map_err(|_| LivenessError::BadTag { kind })?;
        let mut c = [0u8; COUNTER];
        c.copy_from_slice(counter);
        let got = u64::from_be_bytes(c);
        if got != self.next {
            return Err(LivenessError::OutOfOrder {
                expected: self.next,
                got,
            });
        }
        self.next = self.next.wrapping_add(1);
        let msg = match k {
            Kind::Attach if body.is_empty() => Msg::Attach { listen: None },
            Kind::Attach => Msg::Attach {
                listen: Some(decode_addr(body)?),
            },
            Kind::Roster => Msg::Roster(decode_roster(body, self.world)?),
            Kind::Left => {
                let b: [u8; 4] = body
                    .try_into()
                    .map_err(|_| LivenessError::Malformed("a left rank that is not 4 bytes"))?;
                let rank = u32::from_be_bytes(b) as usize;
                if rank >= self.world {
                    return Err(LivenessError::RankOutOfRange {
                        rank,
                        world: self.world,
                    });
                }
                Msg::Left(rank)
            }
            Kind::Attached => Msg::Attached,
            Kind::Heartbeat => Msg::Heartbeat,
            Kind::Goodbye => Msg::Goodbye,
            Kind::Lost => Msg::Lost(decode_loss(body, self.world)?),
            Kind::Report => Msg::Report(decode_loss(body, self.world)?),
            Kind::Tail => {
                let (key, calls) = decode_tail(body)?;
                Msg::Tail { key, calls }
            }
            Kind::Ask => Msg::Ask {
                key: decode_key(body)?,
            },
            Kind::Verdict => {
                let (key, divergence) = decode_verdict(body, self.world)?;
                Msg::Verdict { key, divergence }
            }
            Kind::Check => {
                let (key, seq, call) = decode_check(body)?;
                Msg::Check { key, seq, call }
            }
            Kind::Checked => {
                let (key, seq, outcome) = decode_checked(body, self.world)?;
                Msg::Checked { key, seq, outcome }
            }
        };
        if matches!(msg, Msg::Attached | Msg::Heartbeat | Msg::Goodbye) && !body.is_empty() {
            return Err(LivenessError::Malformed(
                "a body on a message that has none",
            ));
        }
        Ok(msg)
    }
}

/// Bytes read from a connection, cut into frames. Holds at most one
/// partial frame beyond what was last read, so it stays bounded; frames
/// are handed out in place, so with enough capacity (see
/// [`FrameBuf::with_capacity`]) cutting never allocates.
#[derive(Debug, Default)]
pub(crate) struct FrameBuf {
    buf: Vec<u8>,
    /// Where the bytes not yet handed out start.
    start: usize,
}

impl FrameBuf {
    /// An empty buffer with room for `bytes` (reads of up to `bytes` minus
    /// one frame then never make it grow).
    pub(crate) fn with_capacity(bytes: usize) -> FrameBuf {
        FrameBuf {
            buf: Vec::with_capacity(bytes),
            start: 0,
        }
    }

    /// Appends bytes read from the connection (first dropping the frames
    /// already handed out).
    pub(crate) fn push(&mut self, bytes: &[u8]) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame (kind, payload), if one has arrived; the
    /// payload is borrowed from the buffer.
    pub(crate) fn next_frame(&mut self) -> Result<Option<(u8, &[u8])>, LivenessError> {
        let rest = &self.buf[self.start..];
        if rest.len() < HEADER {
            return Ok(None);
        }
        let (kind, len) = decode_header(&rest[..HEADER]).map_err(|e| match e {
            RendezvousError::Malformed(what) => LivenessError::Malformed(what),
            RendezvousError::Version { got } => LivenessError::Version { got },
            _ => LivenessError::Malformed("bad frame header"),
        })?;
        let end = HEADER + len as usize;
        if rest.len() < end {
            return Ok(None);
        }
        let from = self.start;
        self.start += end;
        Ok(Some((kind, &self.buf[from + HEADER..from + end])))
    }
}

/// The largest frame there is, header included.
pub(crate) const MAX_FRAME: usize = HEADER + MAX_PAYLOAD as usize;
/// The smallest frame there is: header, counter and tag, no body.
pub(crate) const MIN_FRAME: usize = HEADER + COUNTER + TAG;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::loss::LossCause;
    use body::MAX_TEXT;

    fn key(n: u8) -> SessionKey {
        let s = Secret::from_bytes(b"a secret for the unit tests".to_vec(), "test").unwrap();
        session_key(&s, &[n; 32], &[2; 32], 1, 4).unwrap()
    }

    fn frames(bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
        let mut fb = FrameBuf::default();
        let mut out = Vec::new();
        // One byte at a time: frames are cut right whatever the reads.
        for b in bytes {
            fb.push(&[*b]);
            while let Some((k, p)) = fb.next_frame().unwrap() {
                out.push((k, p.to_vec()));
            }
        }
        out
    }

    fn loss(cause: LossCause) -> PeerLoss {
        PeerLoss {
            rank: 3,
            cause,
            seen_by: 0,
        }
    }

    #[test]
    fn every_message_round_trips_in_order() {
        let mut tx = Sealer::new(key(1), Dir::Down);
        let mut rx = Opener::new(key(1), Dir::Down, 4);
        let msgs = [
            Msg::Attached,
            Msg::Heartbeat,
            Msg::Lost(loss(LossCause::ConnectionClosed)),
            Msg::Lost(loss(LossCause::Silent {
                for_: Duration::from_millis(10_250),
            })),
            Msg::Lost(loss(LossCause::Panicked {
                message: "boom ✓".into(),
            })),
            Msg::Lost(loss(LossCause::Exited {
                reason: "x".repeat(5000),
            })),
            Msg::Goodbye,
            Msg::Roster(vec![
                (1, "127.0.0.1:4000".parse().unwrap()),
                (3, "[fe80::1:2:3:4]:65535".parse().unwrap()),
            ]),
            Msg::Left(3),
        ];
        let mut wire = Vec::new();
        for m in &msgs {
            wire.extend(tx.seal(m).unwrap());
        }
        let got: Vec<Msg> = frames(&wire)
            .into_iter()
            .map(|(k, p)| rx.open(k, &p).unwrap())
            .collect();
        assert_eq!(got.len(), msgs.len());
        assert_eq!(&got[..5], &msgs[..5]);
        // Long text is cut to a bounded frame.
        match &got[5] {
            Msg::Lost(PeerLoss {
                cause: LossCause::Exited { reason },
                ..
            }) => assert_eq!(reason.len(), MAX_TEXT),
            other => panic!("{other:?}"),
        }
        assert_eq!(got[6..], msgs[6..]);
        let mut up = Sealer::new(key(1), Dir::Up);
        let mut rx = Opener::new(key(1), Dir::Up, 4);
        for m in [
            Msg::Attach { listen: None },
            Msg::Attach {
                listen: Some("10.0.0.1:1234".parse().unwrap()),
            },
        ] {
            let (k, p) = frames(&up.seal(&m).unwrap()).pop().unwrap();
            assert_eq!(rx.open(k, &p).unwrap(), m);
        }
        // The longest roster frame fits.
        let widest = std::net::SocketAddrV6::new(
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap(),
            65535,
            0,
            u32::MAX,
        );
        assert_eq!(widest.to_string().len(), 58);
        let long: Vec<_> = (0..40).map(|r| (r % 4, widest.into())).collect();
        let f = tx.seal(&Msg::Roster(long)).unwrap();
        assert!(f.len() <= MAX_FRAME);
    }

    #[test]
    fn replays_reordering_and_gaps_are_refused() {
        let mut tx = Sealer::new(key(1), Dir::Up);
        let f0 = tx.seal(&Msg::Heartbeat).unwrap();
        let f1 = tx.seal(&Msg::Heartbeat).unwrap();
        let f2 = tx.seal(&Msg::Heartbeat).unwrap();
        let open = |rx: &mut Opener, f: &[u8]| {
            let (k, p) = frames(f).pop().unwrap();
            rx.open(k, &p)
        };
        let mut rx = Opener::new(key(1), Dir::Up, 4);
        open(&mut rx, &f0).unwrap();
        assert!(matches!(
            open(&mut rx, &f0),
            Err(LivenessError::OutOfOrder {
                expected: 1,
                got: 0
            })
        ));
        let mut rx = Opener::new(key(1), Dir::Up, 4);
        open(&mut rx, &f0).unwrap();
        assert!(matches!(
            open(&mut rx, &f2),
            Err(LivenessError::OutOfOrder { .. })
        ));
        open(&mut rx, &f1).unwrap();
    }

    #[test]
    fn forged_reflected_and_unknown_frames_are_refused() {
        let mut tx = Sealer::new(key(1), Dir::Down);
        let good = tx
            .seal(&Msg::Lost(loss(LossCause::ConnectionClosed)))
            .unwrap();
        let (k, p) = frames(&good).pop().unwrap();
        // Another connection's key.
        let mut other = Opener::new(key(9), Dir::Down, 4);
        assert!(matches!(
            other.open(k, &p),
            Err(LivenessError::BadTag { .. })
        ));
        // Any flipped bit.
        for i in 0..p.len() {
            let mut bad = p.clone();
            bad[i] ^= 1;
            let mut rx = Opener::new(key(1), Dir::Down, 4);
            assert!(rx.open(k, &bad).is_err(), "byte {i}");
        }
        // Reflected: a hub frame presented as a member's.
        let mut up = Opener::new(key(1), Dir::Up, 4);
        assert!(matches!(
            up.open(k, &p),
            Err(LivenessError::WrongDirection { .. })
        ));
        let mut tx_up = Sealer::new(key(1), Dir::Up);
        let (k, p) = frames(&tx_up.seal(&Msg::Heartbeat).unwrap()).pop().unwrap();
        let mut down = Opener::new(key(1), Dir::Down, 4);
        assert!(matches!(
            down.open(k, &p),
            Err(LivenessError::BadTag { .. })
        ));
        let mut rx = Opener::new(key(1), Dir::Down, 4);
        assert!(matches!(
            rx.open(99, &p),
            Err(LivenessError::UnknownKind { kind: 99 })
        ));
        assert!(rx.open(Kind::Heartbeat as u8, &[0; 3]).is_err());
        // A rank outside the world, even when authenticated.
        let mut tx = Sealer::new(key(1), Dir::Down);
        let far = tx
            .seal(&Msg::Lost(PeerLoss {
                rank: 7,
                cause: LossCause::ConnectionClosed,
                seen_by: 0,
            }))
            .unwrap();
        let (k, p) = frames(&far).pop().unwrap();
        let mut rx = Opener::new(key(1), Dir::Down, 4);
        assert!(matches!(
            rx.open(k, &p),
            Err(LivenessError::RankOutOfRange { rank: 7, world: 4 })
        ));
    }

    #[test]
    fn random_bytes_never_panic_and_never_open() {
        // A small xorshift: deterministic garbage, no extra dependency.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for round in 0..2000 {
            let len = (next() % 1100) as usize;
            let mut bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if round % 2 == 0 && bytes.len() >= HEADER {
                // A valid header in front, so the opener sees the garbage.
                let kind = 16 + (next() % 9) as u8;
                let body = bytes
                    .split_off(HEADER)
                    .into_iter()
                    .take(1024)
                    .collect::<Vec<_>>();
                bytes = encode_frame(kind, &body);
            }
            let mut fb = FrameBuf::default();
            fb.push(&bytes);
            let mut rx = Opener::new(key(1), Dir::Down, 4);
            while let Ok(Some((k, p))) = fb.next_frame() {
                assert!(rx.open(k, p).is_err());
            }
        }
    }

    #[test]
    fn frame_buffer_refuses_garbage_and_oversized_frames() {
        let mut fb = FrameBuf::default();
        fb.push(b"GET / HTTP/1.1\r\n");
        assert!(fb.next_frame().is_err());
        let mut fb = FrameBuf::default();
        let mut big = encode_frame(Kind::Heartbeat as u8, &[]);
        big[7..11].copy_from_slice(&(MAX_PAYLOAD + 1).to_be_bytes());
        fb.push(&big);
        assert!(fb.next_frame().is_err());
        assert_eq!(MAX_FRAME, 1035);
    }

    #[test]
    fn sealed_frames_are_the_documented_bytes() {
        // Each frame is rebuilt from the protocol docs alone: the
        // rendezvous framing around `counter ‖ body ‖ tag`, with the tag
        // over label, direction, kind, counter and body.
        let expect = |dir: Dir, kind: Kind, counter: u64, body: &[u8]| {
            let mut m = keyed(&key(1).0).unwrap();
            m.update(b"nccl-rs liveness frame");
            m.update(&[dir as u8, kind as u8]);
            m.update(&counter.to_be_bytes());
            m.update(body);
            let mut payload = counter.to_be_bytes().to_vec();
            payload.extend_from_slice(body);
            payload.extend_from_slice(&m.finalize().into_bytes());
            encode_frame(kind as u8, &payload)
        };
        let mut down = Sealer::new(key(1), Dir::Down);
        let mut frame = Vec::new();
        let cases: [(Msg, Kind, Vec<u8>); 7] = [
            (Msg::Heartbeat, Kind::Heartbeat, vec![]),
            (Msg::Attached, Kind::Attached, vec![]),
            (Msg::Left(3), Kind::Left, vec![0, 0, 0, 3]),
            (
                Msg::Lost(loss(LossCause::ConnectionClosed)),
                Kind::Lost,
                vec![0, 0, 0, 3, 0, 0, 0, 0, 0],
            ),
            (
                Msg::Lost(loss(LossCause::Silent {
                    for_: Duration::from_millis(258),
                })),
                Kind::Lost,
                vec![0, 0, 0, 3, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2],
            ),
            (
                Msg::Lost(loss(LossCause::Panicked {
                    message: "ab".into(),
                })),
                Kind::Lost,
                vec![0, 0, 0, 3, 0, 0, 0, 0, 2, b'a', b'b'],
            ),
            (
                Msg::Roster(vec![(1, "127.0.0.1:4000".parse().unwrap())]),
                Kind::Roster,
                [&[1, 0, 0, 0, 1, 14][..], b"127.0.0.1:4000"].concat(),
            ),
        ];
        for (counter, (msg, kind, body)) in cases.into_iter().enumerate() {
            let want = expect(Dir::Down, kind, counter as u64, &body);
            // Into a reused buffer that holds a longer frame before.
            frame.resize(MAX_FRAME, 0xaa);
            down.seal_into(&msg, &mut frame).unwrap();
            assert_eq!(frame, want, "{msg:?}");
        }
        let mut up = Sealer::new(key(1), Dir::Up);
        let attach = Msg::Attach {
            listen: Some("[::1]:7".parse().unwrap()),
        };
        assert_eq!(
            up.seal(&attach).unwrap(),
            expect(Dir::Up, Kind::Attach, 0, b"[::1]:7")
        );
        assert_eq!(
            up.seal(&Msg::Report(loss(LossCause::Exited { reason: "x".into() })))
                .unwrap(),
            expect(Dir::Up, Kind::Report, 1, &[0, 0, 0, 3, 0, 0, 0, 0, 3, b'x'])
        );
    }

    #[test]
    fn frames_are_cut_in_place_across_reads() {
        let mut tx = Sealer::new(key(1), Dir::Down);
        let mut wire = Vec::new();
        for _ in 0..5 {
            wire.extend(tx.seal(&Msg::Heartbeat).unwrap());
        }
        wire.extend(tx.seal(&Msg::Left(2)).unwrap());
        let mut fb = FrameBuf::with_capacity(3 * MAX_FRAME);
        let room = fb.buf.capacity();
        let mut rx = Opener::new(key(1), Dir::Down, 4);
        let mut got = Vec::new();
        // Reads that split frames anywhere.
        for piece in wire.chunks(37) {
            fb.push(piece);
            while let Some((k, p)) = fb.next_frame().unwrap() {
                got.push(rx.open(k, p).unwrap());
            }
        }
        assert_eq!(got.len(), 6);
        assert!(got[..5].iter().all(|m| *m == Msg::Heartbeat));
        assert_eq!(got[5], Msg::Left(2));
        assert_eq!(fb.buf.capacity(), room, "the buffer never grew");
    }
}
