//! The process-wide libnccl handle and error mapping.

use std::ffi::CStr;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use nccl_sys::{Nccl, Version, ncclComm_t, ncclResult_t};

use crate::capabilities::Capabilities;
use crate::{Error, Result};

/// The loaded libnccl, with its version and capabilities.
///
/// One per process: NCCL keeps process-wide state (groups, the bootstrap
/// network, encryption settings), so two copies in one process would
/// disagree. [`Library::get`] loads it on first use by the search order of
/// [`nccl_sys::search`]; [`Library::load_from`] picks a file explicitly and
/// must come first.
#[derive(Debug)]
pub struct Library {
    nccl: Nccl,
    capabilities: Capabilities,
}

static LIBRARY: OnceLock<Library> = OnceLock::new();
static LOADING: Mutex<()> = Mutex::new(());

impl Library {
    /// The process's library, loaded on first call.
    ///
    /// Safe although loading a shared library runs its initialisers: the
    /// file comes from the process's environment (`NCCL_LIBRARY`,
    /// `NCCL_HOME`, the dynamic loader's search path, the active Python
    /// prefixes), which this crate trusts as the dynamic loader does.
    /// Whoever controls the environment can already run code in the
    /// process (`LD_PRELOAD`, `LD_LIBRARY_PATH`), so `NCCL_LIBRARY` naming
    /// a hostile file grants nothing new; a program that does not trust
    /// its environment must clean it before starting, as for any library
    /// it loads.
    pub fn get() -> Result<&'static Library> {
        Self::init_with(|| {
            // SAFETY: the documented search order (NCCL_LIBRARY, NCCL_HOME,
            // the system loader, pip wheels) reads the process environment,
            // which is trusted like the dynamic loader's own (see above).
            unsafe { Nccl::load() }
        })
    }

    /// Loads the library at `path` as the process's library. Fails with
    /// `InvalidArgument` if another library was loaded already.
    ///
    /// # Safety
    ///
    /// `path` must name a genuine libnccl that the caller trusts: loading
    /// it runs its initialisers (arbitrary code) in this process, and its
    /// functions are then called with the signatures of NCCL's API. A path
    /// from an untrusted source (a request, a config file another user can
    /// write) is not enough.
    pub unsafe fn load_from(path: impl AsRef<Path>) -> Result<&'static Library> {
        let path = path.as_ref();
        let lib = Self::init_with(|| {
            // SAFETY: the caller vouches that this file is a genuine NCCL
            // it trusts (this function's contract).
            unsafe { Nccl::open(path) }
        })?;
        let wanted = std::fs::canonicalize(path).ok();
        let loaded = std::fs::canonicalize(lib.nccl.path()).ok();
        if wanted.is_some() && wanted == loaded {
            Ok(lib)
        } else {
            Err(Error::InvalidArgument {
                op: "Library::load_from",
                reason: "another libnccl is already loaded in this process",
            })
        }
    }

    fn init_with(
        load: impl FnOnce() -> Result<Nccl, nccl_sys::LoadError>,
    ) -> Result<&'static Library> {
        if let Some(lib) = LIBRARY.get() {
            return Ok(lib);
        }
        let _guard = LOADING
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(lib) = LIBRARY.get() {
            return Ok(lib);
        }
        let _span = tracing::debug_span!("nccl.library_load").entered();
        let nccl = load()?;
        let capabilities = Capabilities::decide(nccl.version(), |s| nccl.has(s));
        tracing::debug!(version = %nccl.version(), path = %nccl.path().display(), "loaded libnccl");
        Ok(LIBRARY.get_or_init(|| Library { nccl, capabilities }))
    }

    /// The raw bindings, for calls this crate does not wrap.
    pub fn raw(&self) -> &Nccl {
        &self.nccl
    }

    /// The library's version.
    pub fn version(&self) -> Version {
        self.nccl.version()
    }

    /// What the library can do.
    pub fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    /// Maps a result code to `Ok` or `Error::Nccl`, capturing
    /// `ncclGetLastError(comm)` now, before another call overwrites it.
    pub(crate) fn check(
        &self,
        op: &'static str,
        code: ncclResult_t,
        comm: ncclComm_t,
    ) -> Result<()> {
        if code == ncclResult_t::ncclSuccess {
            return Ok(());
        }
        Err(Error::Nccl {
            op,
            code,
            message: self.last_error(code, comm),
        })
    }

    fn last_error(&self, code: ncclResult_t, comm: ncclComm_t) -> String {
        if let Ok(last) = self.nccl.ncclGetLastError() {
            // SAFETY: `ncclGetLastError` takes a communicator or null and
            // returns null or a nul-terminated string it owns; it is copied
            // at once.
            let text = unsafe { last(comm) };
            if !text.is_null() {
                // SAFETY: non-null and nul-terminated per NCCL's contract.
                let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
                if !text.trim().is_empty() {
                    return text.into_owned();
                }
            }
        }
        self.nccl
            .error_string(code)
            .unwrap_or("unknown NCCL error")
            .to_string()
    }
}
