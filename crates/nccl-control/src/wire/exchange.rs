//! The bodies of the flight-recorder exchange (`Tail`, `Ask`, `Verdict`)
//! and of the call check (`Check`, `Checked`): a communicator's key,
//! calls, and the divergence the hub found. Every field has a fixed width
//! and every list a bound, so each fits one frame.

use nccl_sys::{ncclDataType_t, ncclRedOp_t};

use crate::culprit::{Call, Checked, Divergence, Field};
use crate::loss::LivenessError;

/// The most calls a `Tail` carries (the newest of the flight recorder).
pub(crate) const TAIL_MAX: usize = 32;
/// The longest communicator key, in bytes.
pub const KEY_MAX: usize = 64;
/// The most calls a verdict lists.
const LISTED_MAX: usize = 8;
/// "None" for a rank, a root or a peer.
const NONE: u32 = u32::MAX;
/// "No reduction" (an operation that does not reduce).
const NO_REDUCTION: u8 = u8::MAX;

/// The NCCL functions the flight recorder names, by wire code.
const OPS: [&str; 9] = [
    "ncclAllReduce",
    "ncclBroadcast",
    "ncclReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclAlltoAll",
    "ncclGather",
    "ncclScatter",
    "ncclSend",
];
/// The code of `ncclRecv` (kept apart so `OPS` stays in code order).
const RECV: u8 = 9;
/// The code of a symmetric window's registration, which the ranks check
/// (its length) before NCCL's registration barrier.
const WINDOW: u8 = 10;
const UNKNOWN: u8 = 255;

fn op_code(op: &str) -> u8 {
    match op {
        "ncclRecv" => RECV,
        "ncclCommWindowRegister" => WINDOW,
        _ => OPS
            .iter()
            .position(|o| *o == op)
            .map_or(UNKNOWN, |i| i as u8),
    }
}

fn op_name(code: u8) -> &'static str {
    match code {
        RECV => "ncclRecv",
        WINDOW => "ncclCommWindowRegister",
        c => OPS.get(c as usize).copied().unwrap_or("(unknown)"),
    }
}

const SHORT: LivenessError = LivenessError::Malformed("an exchange body shorter than its fields");

/// Reads fixed-width fields off the front of a body.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], LivenessError> {
        if self.0.len() < N {
            return Err(SHORT);
        }
        let (head, rest) = self.0.split_at(N);
        self.0 = rest;
        let mut out = [0u8; N];
        out.copy_from_slice(head);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, LivenessError> {
        Ok(self.take::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, LivenessError> {
        Ok(u32::from_be_bytes(self.take()?))
    }

    fn u64(&mut self) -> Result<u64, LivenessError> {
        Ok(u64::from_be_bytes(self.take()?))
    }

    fn opt(&mut self) -> Result<Option<usize>, LivenessError> {
        let v = self.u32()?;
        Ok((v != NONE).then_some(v as usize))
    }

    fn key(&mut self) -> Result<String, LivenessError> {
        let len = self.u8()? as usize;
        if len > KEY_MAX || self.0.len() < len {
            return Err(LivenessError::Malformed("a communicator key too long"));
        }
        let (key, rest) = self.0.split_at(len);
        self.0 = rest;
        String::from_utf8(key.to_vec())
            .map_err(|_| LivenessError::Malformed("a communicator key that is not UTF-8"))
    }

    fn call(&mut self) -> Result<Call, LivenessError> {
        let op = op_name(self.u8()?);
        let count = usize::try_from(self.u64()?)
            .map_err(|_| LivenessError::Malformed("a count too large for this host"))?;
        let dtype = ncclDataType_t(self.u8()?.into());
        let reduction = match self.u8()? {
            NO_REDUCTION => None,
            c if u32::from(c) <= ncclRedOp_t::ncclNumOps.0 => Some(ncclRedOp_t(c.into())),
            _ => return Err(LivenessError::Malformed("an unknown reduction code")),
        };
        let peer = self.opt()?;
        Ok(Call {
            op,
            count,
            dtype,
            peer,
            reduction,
        })
    }

    fn end(&self) -> Result<(), LivenessError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(LivenessError::Malformed("bytes after an exchange body"))
        }
    }
}

fn opt(v: Option<usize>, out: &mut Vec<u8>) {
    out.extend_from_slice(&v.map_or(NONE, |v| v as u32).to_be_bytes());
}

/// `len u8 ‖ key`, cut to [`KEY_MAX`] bytes on a character boundary.
pub(super) fn encode_key(key: &str, out: &mut Vec<u8>) {
    let mut end = key.len().min(KEY_MAX);
    while !key.is_char_boundary(end) {
        end -= 1;
    }
    out.push(end as u8);
    out.extend_from_slice(&key.as_bytes()[..end]);
}

pub(super) fn decode_key(body: &[u8]) -> Result<String, LivenessError> {
    let mut r = Reader(body);
    let key = r.key()?;
    r.end()?;
    Ok(key)
}

/// `op u8 ‖ count u64 ‖ dtype u8 ‖ reduction u8 ‖ peer u32` (peer
/// `u32::MAX`: none; reduction 0 to 4 the built-ins, 5 any PreMulSum
/// handle, 255 none).
pub(super) fn encode_call(c: &Call, out: &mut Vec<u8>) {
    out.push(op_code(c.op));
    out.extend_from_slice(&(c.count as u64).to_be_bytes());
    out.push(c.dtype.0 as u8);
    out.push(match c.reduction {
        None => NO_REDUCTION,
        Some(r) => r.0.min(ncclRedOp_t::ncclNumOps.0) as u8,
    });
    opt(c.peer, out);
}

/// `key ‖ n u8 ‖ (seq u64 ‖ call)*`, the newest [`TAIL_MAX`] calls.
pub(super) fn encode_tail(key: &str, calls: &[(u64, Call)], out: &mut Vec<u8>) {
    encode_key(key, out);
    let calls = &calls[calls.len().saturating_sub(TAIL_MAX)..];
    out.push(calls.len() as u8);
    for (seq, c) in calls {
        out.extend_from_slice(&seq.to_be_bytes());
        encode_call(c, out);
    }
}

pub(super) fn decode_tail(body: &[u8]) -> Result<(String, Vec<(u64, Call)>), LivenessError> {
    let mut r = Reader(body);
    let key = r.key()?;
    let n = r.u8()? as usize;
    if n > TAIL_MAX {
        return Err(LivenessError::Malformed("a tail of too many calls"));
    }
    let mut calls: Vec<(u64, Call)> = Vec::with_capacity(n);
    for _ in 0..n {
        let seq = r.u64()?;
        // Rising, and no wider than a recorder's tail: the analysis walks
        // the span, so a peer may not make it long.
        if let Some((last, _)) = calls.last()
            && seq <= *last
        {
            return Err(LivenessError::Malformed(
                "a tail whose sequence numbers do not rise",
            ));
        }
        if let Some((first, _)) = calls.first()
            && seq - first >= TAIL_MAX as u64
        {
            return Err(LivenessError::Malformed("a tail wider than the recorder's"));
        }
        calls.push((seq, r.call()?));
    }
    r.end()?;
    Ok((key, calls))
}

fn encode_maybe(c: &Option<Call>, out: &mut Vec<u8>) {
    match c {
        Some(c) => {
            out.push(1);
            encode_call(c, out);
        }
        None => out.push(0),
    }
}

fn decode_maybe(r: &mut Reader<'_>) -> Result<Option<Call>, LivenessError> {
    match r.u8()? {
        0 => Ok(None),
        1 => Ok(Some(r.call()?)),
        _ => Err(LivenessError::Malformed("a call flag that is not 0 or 1")),
    }
}

fn field_code(f: Field) -> u8 {
    match f {
        Field::Op => 0,
        Field::Count => 1,
        Field::Dtype => 2,
        Field::Root => 3,
        Field::Missing => 4,
        Field::Reduction => 5,
    }
}

fn field_of(code: u8) -> Result<Field, LivenessError> {
    Ok(match code {
        0 => Field::Op,
        1 => Field::Count,
        2 => Field::Dtype,
        3 => Field::Root,
        4 => Field::Missing,
        5 => Field::Reduction,
        _ => return Err(LivenessError::Malformed("an unknown divergence field")),
    })
}

/// `key ‖ found u8`, then when found: `seq u64 ‖ field u8 ‖ culprit u32 ‖
/// majority u32 (how many; u32::MAX: none) ‖ [maybe call] ‖ n u8 ‖
/// (rank u32 ‖ maybe call)* ‖ unlisted u32`, where a maybe call is
/// `0` or `1 ‖ call`.
pub(super) fn encode_verdict(key: &str, d: &Option<Box<Divergence>>, out: &mut Vec<u8>) {
    encode_key(key, out);
    let Some(d) = d else {
        out.push(0);
        return;
    };
    out.push(1);
    encode_divergence(d, out);
}

/// The part of a verdict after its `found` flag.
fn encode_divergence(d: &Divergence, out: &mut Vec<u8>) {
    out.extend_from_slice(&d.seq.to_be_bytes());
    out.push(field_code(d.field));
    opt(d.culprit, out);
    match &d.majority {
        Some((call, n)) => {
            opt(Some(*n), out);
            encode_maybe(call, out);
        }
        None => opt(None, out),
    }
    let listed = &d.others[..d.others.len().min(LISTED_MAX)];
    out.push(listed.len() as u8);
    for (rank, call) in listed {
        opt(Some(*rank), out);
        encode_maybe(call, out);
    }
    let unlisted = d.unlisted + (d.others.len() - listed.len());
    out.extend_from_slice(&(unlisted as u32).to_be_bytes());
}

/// The verdict in `body`, its ranks checked against `world`.
pub(super) type Verdict = (String, Option<Box<Divergence>>);

pub(super) fn decode_verdict(body: &[u8], world: usize) -> Result<Verdict, LivenessError> {
    let mut r = Reader(body);
    let key = r.key()?;
    if r.u8()? == 0 {
        r.end()?;
        return Ok((key, None));
    }
    let d = decode_divergence(&mut r, world)?;
    r.end()?;
    Ok((key, Some(Box::new(d))))
}

fn in_world(rank: Option<usize>, world: usize) -> Result<Option<usize>, LivenessError> {
    match rank {
        Some(rank) if rank >= world => Err(LivenessError::RankOutOfRange { rank, world }),
        _ => Ok(rank),
    }
}

fn decode_divergence(r: &mut Reader<'_>, world: usize) -> Result<Divergence, LivenessError> {
    let in_world = |rank: Option<usize>| in_world(rank, world);
    let seq = r.u64()?;
    let field = field_of(r.u8()?)?;
    let culprit = in_world(r.opt()?)?;
    let majority = match r.opt()? {
        Some(n) => Some((decode_maybe(r)?, n)),
        None => None,
    };
    let n = r.u8()? as usize;
    if n > LISTED_MAX {
        return Err(LivenessError::Malformed("a verdict listing too many ranks"));
    }
    let mut others = Vec::with_capacity(n);
    for _ in 0..n {
        let rank = in_world(r.opt()?)?.ok_or(SHORT)?;
        others.push((rank, decode_maybe(r)?));
    }
    let unlisted = r.u32()? as usize;
    Ok(Divergence {
        seq,
        field,
        culprit,
        majority,
        others,
        unlisted,
    })
}

/// `key ‖ seq u64 ‖ call`.
pub(super) fn encode_check(key: &str, seq: u64, call: &Call, out: &mut Vec<u8>) {
    encode_key(key, out);
    out.extend_from_slice(&seq.to_be_bytes());
    encode_call(call, out);
}

pub(super) fn decode_check(body: &[u8]) -> Result<(String, u64, Call), LivenessError> {
    let mut r = Reader(body);
    let (key, seq, call) = (r.key()?, r.u64()?, r.call()?);
    r.end()?;
    Ok((key, seq, call))
}

/// `key ‖ seq u64 ‖ outcome u8`, then for 1 a divergence (as in a
/// verdict), for 2 `n u8 ‖ rank u32 * n ‖ unlisted u32`.
pub(super) fn encode_checked(key: &str, seq: u64, outcome: &Checked, out: &mut Vec<u8>) {
    encode_key(key, out);
    out.extend_from_slice(&seq.to_be_bytes());
    match outcome {
        Checked::Agree => out.push(0),
        Checked::Diverged(d) => {
            out.push(1);
            encode_divergence(d, out);
        }
        Checked::Missing(ranks, unlisted) => {
            out.push(2);
            let listed = &ranks[..ranks.len().min(LISTED_MAX)];
            out.push(listed.len() as u8);
            for rank in listed {
                opt(Some(*rank), out);
            }
            let unlisted = unlisted + (ranks.len() - listed.len());
            out.extend_from_slice(&(unlisted as u32).to_be_bytes());
        }
    }
}

/// A check's outcome: key, seq and what the hub found.
pub(super) type CheckOutcome = (String, u64, Checked);

pub(super) fn decode_checked(body: &[u8], world: usize) -> Result<CheckOutcome, LivenessError> {
    let mut r = Reader(body);
    let (key, seq) = (r.key()?, r.u64()?);
    let outcome = match r.u8()? {
        0 => Checked::Agree,
        1 => Checked::Diverged(Box::new(decode_divergence(&mut r, world)?)),
        2 => {
            let n = r.u8()? as usize;
            if n > LISTED_MAX {
                return Err(LivenessError::Malformed("a check listing too many ranks"));
            }
            let mut ranks = Vec::with_capacity(n);
            for _ in 0..n {
                ranks.push(in_world(r.opt()?, world)?.ok_or(SHORT)?);
            }
            Checked::Missing(ranks, r.u32()? as usize)
        }
        _ => return Err(LivenessError::Malformed("an unknown check outcome")),
    };
    r.end()?;
    Ok((key, seq, outcome))
}

#[cfg(test)]
mod tests {

    #[test]
    fn every_named_operation_keeps_its_name_across_the_wire() {
        for op in OPS
            .iter()
            .copied()
            .chain(["ncclRecv", "ncclCommWindowRegister"])
        {
            assert_eq!(op_name(op_code(op)), op);
        }
        assert_eq!(op_name(op_code("ncclSomethingNew")), "(unknown)");
    }

    use super::*;
    use crate::culprit::{Tail, analyze};

    fn call(op: &'static str, count: usize, peer: Option<usize>) -> Call {
        Call {
            op,
            count,
            dtype: ncclDataType_t::ncclBfloat16,
            peer,
            reduction: (op == "ncclReduce").then_some(ncclRedOp_t::ncclNumOps),
        }
    }

    #[test]
    fn tails_that_do_not_rise_or_span_too_far_are_refused() {
        let c = call(OPS[0], 8, None);
        for seqs in [[5u64, 5], [5, 4], [0, u64::MAX], [0, TAIL_MAX as u64]] {
            let tail: Vec<(u64, Call)> = seqs.iter().map(|&s| (s, c)).collect();
            let mut out = Vec::new();
            encode_tail("world", &tail, &mut out);
            assert!(
                matches!(decode_tail(&out), Err(LivenessError::Malformed(_))),
                "{seqs:?}"
            );
        }
        let tail: Vec<(u64, Call)> = [7u64, 9, 7 + TAIL_MAX as u64 - 1]
            .iter()
            .map(|&s| (s, c))
            .collect();
        let mut out = Vec::new();
        encode_tail("world", &tail, &mut out);
        assert_eq!(decode_tail(&out).unwrap().1.len(), 3);
    }

    #[test]
    fn tails_and_verdicts_round_trip_within_a_frame() {
        let calls: Vec<(u64, Call)> = (0..40u64)
            .map(|s| (s, call(OPS[s as usize % OPS.len()], 1 << 40, Some(3))))
            .chain([(40, call("ncclRecv", 1, None))])
            .collect();
        let mut out = Vec::new();
        encode_tail("world/mesh/dp", &calls, &mut out);
        assert!(out.len() <= 984, "{} bytes", out.len());
        let (key, got) = decode_tail(&out).unwrap();
        assert_eq!(key, "world/mesh/dp");
        assert_eq!(got, calls[calls.len() - TAIL_MAX..]);

        let tails: Vec<(usize, Vec<(u64, Call)>)> = (0..20)
            .map(|r| {
                (
                    r,
                    vec![(7, call("ncclReduce", 5, Some(usize::from(r > 9))))],
                )
            })
            .collect();
        let d = analyze(&tails).map(Box::new);
        for verdict in [d, None] {
            let mut out = Vec::new();
            encode_verdict(&"k".repeat(300), &verdict, &mut out);
            let (key, got) = decode_verdict(&out, 20).unwrap();
            assert_eq!((key.len(), got), (KEY_MAX, verdict.clone()));
            assert!(
                matches!(
                    decode_verdict(&out, 5),
                    Err(LivenessError::RankOutOfRange { .. })
                ) || verdict.is_none()
            );
            assert!(decode_verdict(&out[..out.len() - 1], 20).is_err());
        }
        assert!(decode_key(&[65, b'a']).is_err());
    }

    #[test]
    fn checks_and_their_outcomes_round_trip() {
        let premul = Call {
            reduction: Some(ncclRedOp_t(77)),
            ..call("ncclAllReduce", 3, None)
        };
        let mut out = Vec::new();
        encode_check("world", 12, &premul, &mut out);
        let (key, seq, got) = decode_check(&out).unwrap();
        // Every PreMulSum handle travels as the first dynamic value.
        let expect = Call {
            reduction: Some(ncclRedOp_t::ncclNumOps),
            ..premul
        };
        assert_eq!((key.as_str(), seq, got), ("world", 12, expect));
        assert!(decode_check(&out[..out.len() - 1]).is_err());
        let mut bad = out.clone();
        let at = bad.len() - 5;
        bad[at] = 9;
        assert!(decode_check(&bad).is_err(), "an unknown reduction code");

        let tails: Vec<Tail> = (0..3)
            .map(|r| (r, vec![(4, call(OPS[r], 1, None))]))
            .collect();
        let diverged = Checked::Diverged(Box::new(analyze(&tails).unwrap()));
        let missing = Checked::Missing((0..12).collect(), 3);
        for outcome in [Checked::Agree, diverged, missing] {
            let mut out = Vec::new();
            encode_checked("world", 4, &outcome, &mut out);
            let (key, seq, got) = decode_checked(&out, 16).unwrap();
            let want = match &outcome {
                Checked::Missing(ranks, n) => Checked::Missing(ranks[..LISTED_MAX].to_vec(), n + 4),
                o => o.clone(),
            };
            assert_eq!((key.as_str(), seq, got), ("world", 4, want));
            assert!(decode_checked(&out[..out.len() - 1], 16).is_err());
            let far = matches!(outcome, Checked::Missing(..));
            assert_eq!(decode_checked(&out, 5).is_err(), far);
        }
    }
}
