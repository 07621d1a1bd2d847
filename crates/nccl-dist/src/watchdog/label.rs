//! Communicator labels (`world[3]/mesh/dp`): the rank in them, and the
//! key that is the same on every rank. Imports nothing.

/// The rank in a label (`world[3]/mesh/dp` is 3).
pub(super) fn label_rank(label: &str) -> Option<usize> {
    let (_, rest) = label.split_once('[')?;
    let (rank, _) = rest.split_once(']')?;
    rank.parse().ok()
}

/// A communicator's label with the rank taken out (`world[3]/mesh/dp` is
/// `world/mesh/dp`): the same on every rank.
pub(super) fn exchange_key(label: &str) -> String {
    let mut out = String::with_capacity(label.len());
    let mut skip = false;
    for c in label.chars() {
        match c {
            '[' => skip = true,
            ']' if skip => skip = false,
            c if !skip => out.push(c),
            _ => {}
        }
    }
    out
}
