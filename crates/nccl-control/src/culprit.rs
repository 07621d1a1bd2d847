//! Who broke the job: given the tails of every rank's flight recorder for
//! one communicator, the first operation where the ranks disagree and,
//! against the majority, the first rank and the field that diverged. Pure
//! values and one function, no sockets and no GPU.
//!
//! Ranks agree on an operation when they issued the same NCCL function
//! with the same count, element type, reduction and root. Point-to-point
//! calls (`ncclSend`, `ncclRecv`) count as one kind of call and their peers
//! are not compared (a send on one rank meets a receive on another). A rank
//! that has no record at a sequence number the others reached issued
//! fewer operations: the order diverged there. Built-in reductions (sum,
//! prod, max, min, avg) are compared exactly; a PreMulSum is a handle of
//! each rank's communicator whose number may differ between ranks for the
//! same reduction, so any two of them (values from `ncclNumOps` on) count
//! as the same.

use nccl_sys::{ncclDataType_t, ncclRedOp_t};

/// The most diverging ranks a [`Divergence`] lists (the rest are counted).
const MAX_LISTED: usize = 8;

/// One call as the ranks compare it: what every rank of a communicator
/// must agree on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Call {
    /// The NCCL function.
    pub op: &'static str,
    /// Elements per rank.
    pub count: usize,
    /// The element type.
    pub dtype: ncclDataType_t,
    /// The root or peer, if the operation has one.
    pub peer: Option<usize>,
    /// The reduction, for the reducing operations.
    pub reduction: Option<ncclRedOp_t>,
}

/// Whether two reductions count as the same: built-ins exactly, any two
/// PreMulSum handles (per-communicator numbers) alike.
fn same_reduction(a: Option<ncclRedOp_t>, b: Option<ncclRedOp_t>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b || (a.is_dynamic() && b.is_dynamic()),
        (a, b) => a == b,
    }
}

/// A reduction's name: NCCL's without its prefix, `PreMulSum` for a
/// handle made at run time.
fn reduction_name(op: ncclRedOp_t) -> String {
    match op.name() {
        _ if op.is_dynamic() => "PreMulSum".to_string(),
        Some(name) => name.trim_start_matches("nccl").to_string(),
        None => format!("reduction {}", op.0),
    }
}

impl Call {
    fn p2p(&self) -> bool {
        matches!(self.op, "ncclSend" | "ncclRecv")
    }

    /// The first field in which `self` and `other` disagree, if any.
    fn differs(&self, other: &Call) -> Option<Field> {
        let same_op = self.op == other.op || (self.p2p() && other.p2p());
        if !same_op {
            Some(Field::Op)
        } else if self.count != other.count {
            Some(Field::Count)
        } else if self.dtype != other.dtype {
            Some(Field::Dtype)
        } else if !same_reduction(self.reduction, other.reduction) {
            Some(Field::Reduction)
        } else if !self.p2p() && self.peer != other.peer {
            Some(Field::Root)
        } else {
            None
        }
    }

    /// Whether the ranks would count `self` and `other` as the same call.
    fn agrees(&self, other: &Call) -> bool {
        self.differs(other).is_none()
    }
}

impl std::fmt::Display for Call {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dtype = format!("{:?}", self.dtype);
        let dtype = dtype
            .trim_start_matches("ncclDataType_t(")
            .trim_end_matches(')');
        write!(f, "{}(count {}, {dtype}", self.op, self.count)?;
        if let Some(op) = self.reduction {
            write!(f, ", {}", reduction_name(op))?;
        }
        match self.peer {
            Some(p) if self.p2p() => write!(f, ", peer {p})"),
            Some(p) => write!(f, ", root {p})"),
            None => f.write_str(")"),
        }
    }
}

/// The field in which a rank's call diverged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// A different NCCL function: the ranks issued their operations in a
    /// different order.
    Op,
    /// A different element count.
    Count,
    /// A different element type.
    Dtype,
    /// A different reduction.
    Reduction,
    /// A different root.
    Root,
    /// No operation at all where the others issued one (fewer operations,
    /// or one more than the others): the order diverged.
    Missing,
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Field::Op => "operation (order)",
            Field::Count => "count",
            Field::Dtype => "dtype",
            Field::Reduction => "reduction",
            Field::Root => "root",
            Field::Missing => "order (a missing or extra operation)",
        })
    }
}

/// The first operation at which the ranks of a communicator disagree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divergence {
    /// The sequence number of the operation (on that communicator).
    pub seq: u64,
    /// The first field that differs: between the culprit and the majority,
    /// or between the first two ranks that disagree when there is none.
    pub field: Field,
    /// The first (lowest) rank that diverged from the majority; `None`
    /// when no call was made by more ranks than any other (two ranks).
    pub culprit: Option<usize>,
    /// The majority's call (`None`: the majority issued nothing there) and
    /// how many ranks made it; `None` with no majority.
    pub majority: Option<(Option<Call>, usize)>,
    /// The calls outside the majority (every rank's when there is none),
    /// by rank, at most eight; `None`: no operation.
    pub others: Vec<(usize, Option<Call>)>,
    /// How many ranks outside the majority are not listed.
    pub unlisted: usize,
}

fn show(call: &Option<Call>) -> String {
    call.map_or_else(|| "nothing".to_string(), |c| c.to_string())
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.majority, self.culprit) {
            (Some((expected, agreeing)), Some(rank)) => {
                let found = self
                    .others
                    .iter()
                    .find(|(r, _)| *r == rank)
                    .map_or_else(|| "something else".to_string(), |(_, c)| show(c));
                write!(
                    f,
                    "rank {rank} diverged at operation #{} in the {}: it called {found} \
                     where {agreeing} rank(s) called {}",
                    self.seq,
                    self.field,
                    show(expected)
                )?;
                let rest: Vec<String> = self
                    .others
                    .iter()
                    .filter(|(r, _)| *r != rank)
                    .map(|(r, c)| format!("rank {r}: {}", show(c)))
                    .collect();
                if !rest.is_empty() {
                    write!(f, "; also diverged: {}", rest.join(", "))?;
                }
            }
            _ => {
                write!(
                    f,
                    "the ranks disagree at operation #{} in the {}, with no majority: ",
                    self.seq, self.field
                )?;
                let sides: Vec<String> = self
                    .others
                    .iter()
                    .map(|(r, c)| format!("rank {r}: {}", show(c)))
                    .collect();
                f.write_str(&sides.join(" | "))?;
            }
        }
        if self.unlisted > 0 {
            write!(f, " (and {} more rank(s))", self.unlisted)?;
        }
        Ok(())
    }
}

/// What the hub found for one call of the opt-in call check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    /// Every live rank made the same call.
    Agree,
    /// The ranks disagree.
    Diverged(Box<Divergence>),
    /// These ranks (at most eight, lowest first) did not check in by the
    /// hub's deadline, and this many more.
    Missing(Vec<usize>, usize),
}

impl Checked {
    /// The outcome when `calls` (one per rank that checked in, for check
    /// `seq`) are all there is, `missing` the live ranks without one.
    pub fn of(seq: u64, calls: &[(usize, Call)], mut missing: Vec<usize>) -> Checked {
        if !missing.is_empty() {
            missing.sort_unstable();
            let unlisted = missing.len().saturating_sub(MAX_LISTED);
            missing.truncate(MAX_LISTED);
            return Checked::Missing(missing, unlisted);
        }
        let tails: Vec<Tail> = calls.iter().map(|(r, c)| (*r, vec![(seq, *c)])).collect();
        analyze(&tails).map_or(Checked::Agree, |d| Checked::Diverged(Box::new(d)))
    }
}

/// One rank's flight-recorder tail: its rank and its calls with their
/// sequence numbers, oldest first.
pub type Tail = (usize, Vec<(u64, Call)>);

/// The first divergence among `tails` (one per rank of one communicator),
/// or `None` when they agree on every operation they all cover.
///
/// Only sequence numbers every tail could hold are compared: from the
/// newest first record among the tails (older ones fell out of someone's
/// recorder) to the last record of any.
pub fn analyze(tails: &[Tail]) -> Option<Divergence> {
    if tails.len() < 2 {
        return None;
    }
    let from = tails
        .iter()
        .map(|(_, t)| t.first().map_or(0, |(s, _)| *s))
        .max()?;
    let to = tails
        .iter()
        .filter_map(|(_, t)| t.last().map(|(s, _)| *s))
        .max()?;
    let mut ranks: Vec<usize> = tails.iter().map(|(r, _)| *r).collect();
    ranks.sort_unstable();
    let at = |rank: usize, seq: u64| -> Option<Call> {
        let (_, t) = tails.iter().find(|(r, _)| *r == rank)?;
        t.iter().find(|(s, _)| *s == seq).map(|(_, c)| *c)
    };
    // Bounded whatever the tails hold: at most the widest tail's length
    // of sequence numbers is walked.
    let widest = tails.iter().map(|(_, t)| t.len() as u64).max().unwrap_or(0);
    let to = to.min(from.saturating_add(widest));
    for seq in from..=to {
        let calls: Vec<(usize, Option<Call>)> = ranks.iter().map(|&r| (r, at(r, seq))).collect();
        if let Some(d) = diverged(seq, &calls) {
            return Some(d);
        }
    }
    None
}

fn same(a: &Option<Call>, b: &Option<Call>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.agrees(b),
        (None, None) => true,
        _ => false,
    }
}

fn field_between(a: &Option<Call>, b: &Option<Call>) -> Field {
    match (a, b) {
        (Some(a), Some(b)) => a.differs(b).unwrap_or(Field::Op),
        _ => Field::Missing,
    }
}

/// The divergence at `seq`, given every rank's call there (by rank).
fn diverged(seq: u64, calls: &[(usize, Option<Call>)]) -> Option<Divergence> {
    // Groups of ranks that agree, in order of their lowest rank.
    let mut groups: Vec<(Option<Call>, Vec<usize>)> = Vec::new();
    for (rank, call) in calls {
        match groups.iter_mut().find(|(c, _)| same(c, call)) {
            Some((_, members)) => members.push(*rank),
            None => groups.push((*call, vec![*rank])),
        }
    }
    if groups.len() < 2 {
        return None;
    }
    let largest = groups.iter().map(|(_, m)| m.len()).max().unwrap_or(0);
    let tops: Vec<usize> = (0..groups.len())
        .filter(|&i| groups[i].1.len() == largest)
        .collect();
    let cap = |list: Vec<(usize, Option<Call>)>| {
        let unlisted = list.len().saturating_sub(MAX_LISTED);
        (
            list.into_iter().take(MAX_LISTED).collect::<Vec<_>>(),
            unlisted,
        )
    };
    if let [top] = tops[..] {
        let (expected, members) = &groups[top];
        let mut others: Vec<(usize, Option<Call>)> = calls
            .iter()
            .filter(|(r, _)| !members.contains(r))
            .copied()
            .collect();
        others.sort_by_key(|(r, _)| *r);
        let (rank, found) = others[0];
        let field = field_between(expected, &found);
        let (others, unlisted) = cap(others);
        Some(Divergence {
            seq,
            field,
            culprit: Some(rank),
            majority: Some((*expected, members.len())),
            others,
            unlisted,
        })
    } else {
        let field = field_between(&groups[0].0, &groups[1].0);
        let (others, unlisted) = cap(calls.to_vec());
        Some(Divergence {
            seq,
            field,
            culprit: None,
            majority: None,
            others,
            unlisted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(op: &'static str, count: usize, dtype: ncclDataType_t, peer: Option<usize>) -> Call {
        let reduction = matches!(op, "ncclAllReduce" | "ncclReduce" | "ncclReduceScatter")
            .then_some(ncclRedOp_t::ncclSum);
        Call {
            op,
            count,
            dtype,
            peer,
            reduction,
        }
    }

    fn ar(count: usize) -> Call {
        call("ncclAllReduce", count, ncclDataType_t::ncclFloat32, None)
    }

    /// `world` ranks that issued `common` and then, each, its own calls.
    fn tails(world: usize, common: &[Call], last: impl Fn(usize) -> Vec<Call>) -> Vec<Tail> {
        (0..world)
            .map(|r| {
                let mut calls: Vec<Call> = common.to_vec();
                calls.extend(last(r));
                (
                    r,
                    calls
                        .into_iter()
                        .enumerate()
                        .map(|(i, c)| (10 + i as u64, c))
                        .collect(),
                )
            })
            .collect()
    }

    #[test]
    fn agreeing_ranks_have_no_culprit() {
        let t = tails(4, &[ar(8), ar(16)], |_| vec![ar(32)]);
        assert_eq!(analyze(&t), None);
        assert_eq!(analyze(&t[..1]), None);
    }

    #[test]
    fn a_count_mismatch_names_the_rank_and_the_count() {
        let t = tails(4, &[ar(8)], |r| vec![ar(if r == 2 { 2048 } else { 1024 })]);
        let d = analyze(&t).unwrap();
        assert_eq!((d.seq, d.field, d.culprit), (11, Field::Count, Some(2)));
        assert_eq!(d.majority, Some((Some(ar(1024)), 3)));
        assert_eq!(d.others, vec![(2, Some(ar(2048)))]);
        let text = d.to_string();
        assert!(
            text.contains("rank 2 diverged at operation #11 in the count"),
            "{text}"
        );
        assert!(
            text.contains("count 2048") && text.contains("count 1024"),
            "{text}"
        );
    }

    #[test]
    fn a_dtype_mismatch_of_equal_width_is_found() {
        let t = tails(3, &[], |r| {
            let dtype = if r == 0 {
                ncclDataType_t::ncclInt32
            } else {
                ncclDataType_t::ncclFloat32
            };
            vec![call("ncclAllReduce", 64, dtype, None)]
        });
        let d = analyze(&t).unwrap();
        assert_eq!((d.field, d.culprit), (Field::Dtype, Some(0)));
    }

    #[test]
    fn a_reduction_mismatch_is_found_and_premulsum_handles_are_alike() {
        let with = |op: ncclRedOp_t| Call {
            reduction: Some(op),
            ..ar(64)
        };
        let t = tails(3, &[], |r| {
            vec![with(if r == 1 {
                ncclRedOp_t::ncclMax
            } else {
                ncclRedOp_t::ncclSum
            })]
        });
        let d = analyze(&t).unwrap();
        assert_eq!((d.field, d.culprit), (Field::Reduction, Some(1)));
        assert!(d.to_string().contains("Max"), "{d}");
        // Two ranks' PreMulSum handles differ in number, not in meaning.
        let premul = |r: usize| vec![with(ncclRedOp_t(5 + r as u32))];
        assert_eq!(analyze(&tails(3, &[], premul)), None);
        // A dtype difference is named before the reduction.
        let t = tails(2, &[], |r| {
            vec![Call {
                dtype: ncclDataType_t(r as u32),
                ..with(ncclRedOp_t(r as u32))
            }]
        });
        assert_eq!(analyze(&t).unwrap().field, Field::Dtype);
    }

    #[test]
    fn a_root_mismatch_is_found_and_peers_of_p2p_are_not() {
        let bcast = |root| call("ncclBroadcast", 4, ncclDataType_t::ncclUint8, Some(root));
        let t = tails(3, &[], |r| vec![bcast(if r == 1 { 1 } else { 0 })]);
        let d = analyze(&t).unwrap();
        assert_eq!((d.field, d.culprit), (Field::Root, Some(1)));

        let p2p = |r: usize| {
            let op = if r == 0 { "ncclSend" } else { "ncclRecv" };
            vec![call(op, 4, ncclDataType_t::ncclUint8, Some(1 - r))]
        };
        assert_eq!(analyze(&tails(2, &[], p2p)), None);
    }

    #[test]
    fn a_different_order_or_a_missing_operation_is_the_order() {
        let bcast = call("ncclBroadcast", 8, ncclDataType_t::ncclFloat32, Some(0));
        let t = tails(4, &[ar(1)], |r| {
            if r == 3 {
                vec![bcast, ar(8)]
            } else {
                vec![ar(8), bcast]
            }
        });
        let d = analyze(&t).unwrap();
        assert_eq!((d.seq, d.field, d.culprit), (11, Field::Op, Some(3)));

        let t = tails(4, &[ar(1)], |r| if r == 1 { vec![] } else { vec![ar(8)] });
        let d = analyze(&t).unwrap();
        assert_eq!((d.seq, d.field, d.culprit), (11, Field::Missing, Some(1)));
        assert!(d.to_string().contains("it called nothing"), "{d}");
    }

    #[test]
    fn two_ranks_are_shown_side_by_side() {
        let t = tails(2, &[ar(1)], |r| vec![ar(if r == 0 { 4 } else { 5 })]);
        let d = analyze(&t).unwrap();
        assert_eq!((d.field, d.culprit, d.majority), (Field::Count, None, None));
        assert_eq!(d.others, vec![(0, Some(ar(4))), (1, Some(ar(5)))]);
        let text = d.to_string();
        assert!(text.contains("no majority"), "{text}");
        assert!(text.contains("rank 0: ncclAllReduce(count 4"), "{text}");
        assert!(text.contains("rank 1: ncclAllReduce(count 5"), "{text}");
    }

    #[test]
    fn only_the_window_every_tail_covers_is_compared() {
        // Rank 1's recorder lost seq 10, where it differed: not compared.
        let mut t = tails(3, &[ar(1), ar(2)], |_| vec![]);
        t[0].1[0].1 = ar(99);
        t[1].1.remove(0);
        assert_eq!(analyze(&t), None);
    }

    #[test]
    fn many_diverging_ranks_are_capped() {
        let t = tails(30, &[], |r| vec![ar(if r < 19 { 1 } else { 2 })]);
        let d = analyze(&t).unwrap();
        assert_eq!(d.culprit, Some(19));
        assert_eq!((d.others.len(), d.unlisted), (MAX_LISTED, 11 - MAX_LISTED));
    }
}
