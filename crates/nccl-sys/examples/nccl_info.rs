//! Prints which libnccl the search order finds, its version, and which of
//! NCCL 2.32.3's host functions it has.
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
    ExitCode::SUCCESS
}
