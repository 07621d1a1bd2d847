//! The loaded library: search, load, version check, lazy symbol table.

use std::ffi::{CStr, c_int, c_void};
use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::{Attempt, AttemptFailure, LoadError, SymbolError};
use crate::functions::{FunctionTable, Symbol};
use crate::search::{Candidate, SearchPaths, Source};
use crate::types::ncclResult_t;
use crate::version::Version;

pub use crate::functions::Nccl;

impl Nccl {
    /// Searches for libnccl in the order the process environment sets
    /// (see [`crate::search`]) and loads the first usable one.
    ///
    /// # Safety
    ///
    /// Loading a shared object runs its initialisers, and every later call
    /// trusts that the library found is a genuine NCCL whose functions have
    /// the declared signatures. The caller vouches for the search path
    /// (`NCCL_LIBRARY`, `NCCL_HOME`, the loader's path, Python prefixes).
    pub unsafe fn load() -> Result<Nccl, LoadError> {
        // SAFETY: the caller upholds `load`'s contract, which is this one's.
        unsafe { Nccl::load_from(&SearchPaths::from_env()) }
    }

    /// Loads the first usable candidate of `paths`. When
    /// [`SearchPaths::nccl_library`] is set, only that file is tried and
    /// its failure is [`LoadError::Rejected`].
    ///
    /// # Safety
    ///
    /// As for [`Nccl::load`].
    pub unsafe fn load_from(paths: &SearchPaths) -> Result<Nccl, LoadError> {
        let mut attempts = Vec::new();
        for candidate in paths.candidates() {
            // SAFETY: the caller vouches for every candidate of `paths`.
            match unsafe { Nccl::try_candidate(&candidate) } {
                Ok(nccl) => return Ok(nccl),
                Err(failure) => attempts.push(Attempt {
                    source: candidate.source,
                    target: candidate.target,
                    failure,
                }),
            }
        }
        if paths.nccl_library.is_some()
            && let Some(attempt) = attempts.pop()
        {
            return Err(LoadError::Rejected(Box::new(attempt)));
        }
        Err(LoadError::NotFound { attempts })
    }

    /// Loads the library at `path` and nothing else.
    ///
    /// # Safety
    ///
    /// As for [`Nccl::load`], for the file at `path`.
    pub unsafe fn open(path: impl AsRef<Path>) -> Result<Nccl, LoadError> {
        let candidate = Candidate {
            source: Source::Explicit,
            target: path.as_ref().to_path_buf(),
        };
        // SAFETY: the caller vouches for `path`.
        unsafe { Nccl::try_candidate(&candidate) }.map_err(|failure| {
            LoadError::Rejected(Box::new(Attempt {
                source: candidate.source,
                target: candidate.target,
                failure,
            }))
        })
    }

    /// # Safety
    ///
    /// As for [`Nccl::load`], for `candidate`.
    unsafe fn try_candidate(candidate: &Candidate) -> Result<Nccl, AttemptFailure> {
        let is_path = candidate.target.components().count() > 1;
        if is_path && !candidate.target.exists() {
            return Err(AttemptFailure::Missing);
        }
        // The flags of `libloading::Library::new`, plus one: NCCL starts
        // threads that outlive any call (the bootstrap root of
        // `ncclGetUniqueId`, proxy threads), so its code must stay mapped
        // after the last handle closes: RTLD_NODELETE. Unloading it under a
        // running thread crashed the process (seen in the library tests).
        let flags = libloading::os::unix::RTLD_LAZY
            | libloading::os::unix::RTLD_LOCAL
            | libc::RTLD_NODELETE;
        // SAFETY: the caller vouches that this file is NCCL, so running its
        // initialisers is sound.
        let library =
            unsafe { libloading::os::unix::Library::open(Some(&candidate.target), flags) }
                .map(libloading::Library::from)
                .map_err(AttemptFailure::Open)?;
        let mut nccl = Nccl {
            library,
            path: candidate.target.clone(),
            source: candidate.source,
            version: Version::new(0, 0, 0),
            table: FunctionTable::new(),
        };
        let get_version = nccl.ncclGetVersion().map_err(|_| AttemptFailure::NotNccl)?;
        let mut code: c_int = 0;
        // SAFETY: `ncclGetVersion` writes one int through a valid pointer
        // and has no other precondition.
        let result = unsafe { get_version(&mut code) };
        if result != ncclResult_t::ncclSuccess {
            return Err(AttemptFailure::VersionQuery(result));
        }
        let version = Version::from_code(code).ok_or(AttemptFailure::BadVersion(code))?;
        if version < Version::MIN_SUPPORTED {
            return Err(AttemptFailure::TooOld(version));
        }
        nccl.version = version;
        if let Some(file) = file_of(get_version as *const c_void) {
            nccl.path = file;
        }
        Ok(nccl)
    }

    /// The library's version, from `ncclGetVersion`.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The file that was loaded (resolved through `dladdr` when the system
    /// loader found it by name).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The search rule that found the library.
    pub fn source(&self) -> Source {
        self.source
    }

    /// Whether the library exports `symbol`.
    pub fn has(&self, symbol: Symbol) -> bool {
        self.resolve(symbol).is_ok()
    }

    /// Every function of [`Symbol::ALL`] the library exports.
    pub fn available(&self) -> Vec<Symbol> {
        Symbol::ALL
            .iter()
            .copied()
            .filter(|s| self.has(*s))
            .collect()
    }

    /// Every function of [`Symbol::ALL`] the library lacks.
    pub fn missing(&self) -> Vec<Symbol> {
        Symbol::ALL
            .iter()
            .copied()
            .filter(|s| !self.has(*s))
            .collect()
    }

    /// The address of `symbol`, looked up once and cached.
    pub(crate) fn resolve(&self, symbol: Symbol) -> Result<usize, SymbolError> {
        let slot = self.table.slot(symbol);
        let address = *slot.get_or_init(|| {
            // SAFETY: the symbol is only read as an address here; the typed
            // accessors give it its checked signature.
            let found = unsafe { self.library.get::<unsafe extern "C" fn()>(symbol.c_name()) };
            match found {
                Ok(f) => Some(*f as usize).filter(|a| *a != 0),
                Err(_) => None,
            }
        });
        address.ok_or(SymbolError {
            symbol,
            library: self.version,
        })
    }

    /// `ncclGetErrorString(result)` as Rust text, or `None` when the
    /// library returned null or text that is not UTF-8.
    pub fn error_string(&self, result: ncclResult_t) -> Option<&'static str> {
        let f = self.ncclGetErrorString().ok()?;
        // SAFETY: `ncclGetErrorString` takes any value and returns null or
        // a pointer to a static, nul-terminated string.
        let text = unsafe { f(result) };
        if text.is_null() {
            return None;
        }
        // SAFETY: non-null, nul-terminated, static for the life of the
        // process (NCCL returns string literals).
        unsafe { CStr::from_ptr(text) }.to_str().ok()
    }
}

impl fmt::Debug for Nccl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nccl")
            .field("path", &self.path)
            .field("source", &self.source)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// The file that contains `address`, per `dladdr`.
fn file_of(address: *const c_void) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `dladdr` only reads `address` as a number and writes `info`.
    let found = unsafe { libc::dladdr(address, info.as_mut_ptr()) };
    if found == 0 {
        return None;
    }
    // SAFETY: `dladdr` returned non-zero, so it filled `info`.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: `dli_fname` is a nul-terminated path owned by the loader,
    // valid while the object stays loaded; it is copied at once.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())))
}
