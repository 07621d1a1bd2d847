//! The first example: which libnccl the search order finds, its version,
//! which of NCCL 2.32.3's host functions it has, and a fresh unique id (the
//! token rank 0 hands to the other ranks). Needs libnccl, not a GPU.
//!
//! ```text
//! cargo run -p nccl-sys --example nccl_info
//! NCCL_LIBRARY=/path/to/libnccl.so.2 cargo run -p nccl-sys --example nccl_info
//! ```

use std::process::ExitCode;

use nccl_sys::{Nccl, SearchPaths, Symbol};

fn main() -> ExitCode {
    let paths = SearchPaths::from_env();
    // SAFETY: this program exists to inspect whatever libnccl the standard
    // search order finds; we trust that library as any NCCL user would.
    let nccl = match unsafe { Nccl::load_from(&paths) } {
        Ok(nccl) => nccl,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("library:  {}", nccl.path().display());
    println!("found by: {}", nccl.source());
    println!("version:  {}", nccl.version());
    println!(
        "bindings: {} ({} functions)",
        nccl_sys::Version::BINDINGS,
        Symbol::ALL.len()
    );
    let available = nccl.available();
    println!("available: {} of {}", available.len(), Symbol::ALL.len());
    for symbol in &available {
        println!("  + {}", symbol.name());
    }
    // A unique id needs no GPU: NCCL fills it with its bootstrap address.
    let mut id = nccl_sys::ncclUniqueId::zeroed();
    let made = match nccl.ncclGetUniqueId() {
        // SAFETY: `ncclGetUniqueId` writes one `ncclUniqueId` through the
        // pointer, which points at a live, writable one.
        Ok(get_unique_id) => unsafe { get_unique_id(&mut id) },
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if !made.is_success() {
        eprintln!("error: ncclGetUniqueId returned {made:?}");
        return ExitCode::FAILURE;
    }
    // The id holds rank 0's bootstrap address and a random magic that lets
    // a peer join: it crosses the wire sealed (nccl-dist's rendezvous) and
    // is not printed.
    let set = id.as_bytes().iter().filter(|b| **b != 0).count();
    println!(
        "unique id: made, {} bytes ({set} non-zero; not printed: it lets a peer join)",
        id.as_bytes().len()
    );
    let missing = nccl.missing();
    if !missing.is_empty() {
        println!("missing (newer than this library): {}", missing.len());
        for symbol in missing {
            let since = symbol.since();
            println!(
                "  - {:<32} added in {}.{}{}",
                symbol.name(),
                since / 10_000,
                (since / 100) % 100,
                if since % 100 == 0 {
                    String::new()
                } else {
                    format!(".{}", since % 100)
                }
            );
        }
    }
    println!(
        "proved: libnccl {} loads, resolves its functions and makes a unique id",
        nccl.version()
    );
    ExitCode::SUCCESS
}
