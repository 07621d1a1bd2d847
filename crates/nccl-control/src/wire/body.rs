//! The bodies of liveness messages: a loss, a roster, an address, as
//! bytes and back. Text from a peer is cut to [`MAX_TEXT`] bytes and made
//! printable before anyone logs it.

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use crate::loss::{LivenessError, LossCause, PeerLoss};

/// Longest text a loss carries on the wire (cut at a character boundary),
/// so a `Lost` frame always fits the rendezvous framing's payload cap.
pub(super) const MAX_TEXT: usize = 512;

/// Roster entries per frame: each is at most 4 + 1 + 58 bytes (the longest
/// IPv6 socket address as text, scope id included), so a frame stays under
/// [`MAX_PAYLOAD`](crate::rendezvous::MAX_PAYLOAD).
pub(crate) const ROSTER_CHUNK: usize = 12;

fn cut(text: &str) -> &str {
    if text.len() <= MAX_TEXT {
        return text;
    }
    let mut end = MAX_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `rank u32 ‖ seen_by u32 ‖ cause u8 ‖ detail`: nothing for a closed
/// connection, milliseconds (u64) for silence, UTF-8 text otherwise
/// (2 a panic, 3 an early end, 4 a call never made);
/// appended to `out`.
pub(super) fn encode_loss(loss: &PeerLoss, out: &mut Vec<u8>) {
    out.extend_from_slice(&(loss.rank as u32).to_be_bytes());
    out.extend_from_slice(&(loss.seen_by as u32).to_be_bytes());
    match &loss.cause {
        LossCause::ConnectionClosed => out.push(0),
        LossCause::Silent { for_ } => {
            out.push(1);
            let ms = u64::try_from(for_.as_millis()).unwrap_or(u64::MAX);
            out.extend_from_slice(&ms.to_be_bytes());
        }
        LossCause::Panicked { message } => {
            out.push(2);
            out.extend_from_slice(cut(message).as_bytes());
        }
        LossCause::Exited { reason } => {
            out.push(3);
            out.extend_from_slice(cut(reason).as_bytes());
        }
        LossCause::NeverCalled { what } => {
            out.push(4);
            out.extend_from_slice(cut(what).as_bytes());
        }
    }
}

pub(super) fn decode_loss(body: &[u8], world: usize) -> Result<PeerLoss, LivenessError> {
    if body.len() < 9 {
        return Err(LivenessError::Malformed("a loss shorter than its fields"));
    }
    let rank = u32::from_be_bytes([body[0], body[1], body[2], body[3]]) as usize;
    let seen_by = u32::from_be_bytes([body[4], body[5], body[6], body[7]]) as usize;
    for r in [rank, seen_by] {
        if r >= world {
            return Err(LivenessError::RankOutOfRange { rank: r, world });
        }
    }
    let detail = &body[9..];
    let text = || {
        std::str::from_utf8(detail)
            .map(printable)
            .map_err(|_| LivenessError::Malformed("loss text that is not UTF-8"))
    };
    let cause = match body[8] {
        0 if detail.is_empty() => LossCause::ConnectionClosed,
        1 if detail.len() == 8 => {
            let mut ms = [0u8; 8];
            ms.copy_from_slice(detail);
            LossCause::Silent {
                for_: Duration::from_millis(u64::from_be_bytes(ms)),
            }
        }
        2 => LossCause::Panicked { message: text()? },
        3 => LossCause::Exited { reason: text()? },
        4 => LossCause::NeverCalled { what: text()? },
        _ => return Err(LivenessError::Malformed("an unknown loss cause")),
    };
    Ok(PeerLoss {
        rank,
        cause,
        seen_by,
    })
}

/// A peer's text made safe to print: control characters (terminal
/// escapes, newlines that would forge log lines) become `\u{..}` escapes.
fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
}

pub(super) fn decode_addr(text: &[u8]) -> Result<SocketAddr, LivenessError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or(LivenessError::Malformed("not a socket address"))
}

/// An address as text, appended to `out` (no text in between).
pub(super) fn write_addr(addr: &SocketAddr, out: &mut Vec<u8>) {
    // Writing to a `Vec` cannot fail.
    let _ = write!(out, "{addr}");
}

/// `count u8 ‖ (rank u32 ‖ length u8 ‖ address as text)*`, appended to
/// `out`.
pub(super) fn encode_roster(entries: &[(usize, SocketAddr)], out: &mut Vec<u8>) {
    let entries = &entries[..entries.len().min(ROSTER_CHUNK)];
    out.push(entries.len() as u8);
    for (rank, addr) in entries {
        out.extend_from_slice(&(*rank as u32).to_be_bytes());
        let len_at = out.len();
        out.push(0);
        write_addr(addr, out);
        // At most 58 bytes (the widest IPv6 socket address).
        out[len_at] = (out.len() - len_at - 1) as u8;
    }
}

pub(super) fn decode_roster(
    body: &[u8],
    world: usize,
) -> Result<Vec<(usize, SocketAddr)>, LivenessError> {
    const SHORT: LivenessError = LivenessError::Malformed("a roster shorter than its entries");
    let (&count, mut rest) = body
        .split_first()
        .ok_or(LivenessError::Malformed("an empty roster"))?;
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        if rest.len() < 5 {
            return Err(SHORT);
        }
        let rank = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if rank >= world {
            return Err(LivenessError::RankOutOfRange { rank, world });
        }
        let len = rest[4] as usize;
        let text = rest.get(5..5 + len).ok_or(SHORT)?;
        out.push((rank, decode_addr(text)?));
        rest = &rest[5 + len..];
    }
    if !rest.is_empty() {
        return Err(LivenessError::Malformed("bytes after a roster"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_loss_text_cannot_carry_terminal_escapes_or_forge_log_lines() {
        assert_eq!(
            printable("boom\x1b[31m\nFAKE line"),
            "boom\\u{1b}[31m\\u{a}FAKE line"
        );
        assert_eq!(printable("plain text, ünïcode"), "plain text, ünïcode");
    }
}
