//! A Rust rank of a mixed rendezvous, for the Python package's tests
//! (`cargo xtask py` runs them): rank 0 serving Python ranks, or a rank
//! joining a Python `nccl_rs.Server`. Needs no GPU; the secret comes from
//! `NCCL_RS_SECRET` (or its `_FILE` form).
//!
//! ```text
//! rendezvous_peer serve WORLD PORT [--id HEX] [--timeout SECS] [--show-id]
//! rendezvous_peer join HOST:PORT RANK WORLD [--timeout SECS] [--show-id]
//! ```
//!
//! `serve` prints `port P` once it listens, then, like `join`, one line
//! `id DIGEST rank R size N` (`--show-id`: the id's hex instead of its
//! digest, so a test can compare the bytes) and a `refused ...` line per
//! peer it turned away. A failure prints `error KIND: message` (KIND:
//! `timeout`, `unauthenticated`, `rejected`, `version`, `id`, `other`)
//! and exits with status 2. Without `--id`, `serve` makes the id with
//! libnccl.

use std::io::Write;
use std::net::TcpListener;
use std::process::ExitCode;
use std::time::Duration;

use nccl_dist::nccl_safe::UniqueId;
use nccl_dist::{RendezvousError, Secret, rendezvous};

/// `--name VALUE` from the arguments.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).map(String::as_str)
}

fn kind(e: &RendezvousError) -> &'static str {
    match e {
        RendezvousError::Timeout { .. } => "timeout",
        RendezvousError::BadSecret | RendezvousError::Unauthenticated { .. } => "unauthenticated",
        RendezvousError::Rejected(_) => "rejected",
        RendezvousError::Version { .. } => "version",
        _ => "other",
    }
}

fn peer(args: &[String]) -> Result<(), (&'static str, String)> {
    let bad = |what: &str| ("other", what.to_string());
    if !matches!(args.first().map(String::as_str), Some("serve" | "join")) {
        return Err(bad(
            "usage: rendezvous_peer serve|join ... (see the file's doc)",
        ));
    }
    let num = |i: usize| -> Result<usize, (&'static str, String)> {
        let text = args.get(i).ok_or_else(|| bad("missing argument"))?;
        text.parse()
            .map_err(|_| bad(&format!("{text:?} is not a number")))
    };
    let secret = Secret::from_env().map_err(|e| bad(&e.to_string()))?;
    let secs = flag(args, "--timeout").map_or(Ok(60.0), str::parse::<f64>);
    let timeout = Duration::from_secs_f64(secs.map_err(|_| bad("--timeout takes seconds"))?);
    let rdv = |e: RendezvousError| (kind(&e), e.to_string());
    let (id, rank, size) = match args.first().map(String::as_str) {
        Some("serve") => {
            let world = num(1)?;
            let id = match flag(args, "--id") {
                Some(hex) => UniqueId::from_hex(hex),
                None => UniqueId::new(),
            }
            .map_err(|e| ("id", e.to_string()))?;
            let listener = TcpListener::bind(("0.0.0.0", num(2)? as u16))
                .map_err(|e| bad(&format!("bind: {e}")))?;
            let port = listener.local_addr().map_err(|e| bad(&e.to_string()))?;
            println!("port {}", port.port());
            let _ = std::io::stdout().flush();
            let refused =
                rendezvous::serve(&listener, world, &secret, &id.raw(), timeout).map_err(rdv)?;
            for e in refused {
                println!("refused {e}");
            }
            (id, 0, world)
        }
        _ => {
            let addr = args.get(1).ok_or_else(|| bad("missing HOST:PORT"))?;
            let (rank, world) = (num(2)?, num(3)?);
            let id = rendezvous::join(addr.as_str(), rank, world, &secret, timeout).map_err(rdv)?;
            (UniqueId::from(id), rank, world)
        }
    };
    let shown = if args.iter().any(|a| a == "--show-id") {
        id.to_hex()
    } else {
        format!("{:08x}", id.digest())
    };
    println!("id {shown} rank {rank} size {size}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match peer(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err((kind, message)) => {
            println!("error {kind}: {message}");
            ExitCode::from(2)
        }
    }
}
