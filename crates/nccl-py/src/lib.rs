//! `nccl_rs`: the authenticated rendezvous of `nccl-control` for Python
//! ranks (this crate depends on the control plane alone: no CUDA).
//!
//! A PyTorch, CuPy or JAX program gets the NCCL unique id from (or hands
//! it to) Rust ranks over the same wire protocol, run by the same Rust
//! code: rank 0 makes a `nccl_rs.Server`, learns its port
//! and waits; the other ranks call `nccl_rs.join`. Each returns
//! `(unique_id: bytes, rank, size)`, ready for `ncclCommInitRank` through
//! CuPy's `NcclCommunicator` (`nccl_rs.unique_id_to_cupy` gives its id
//! form) or a ctypes binding of libnccl. The blocking calls release the
//! GIL. Errors are `nccl_rs.RendezvousError` and its subclasses.
//!
//! Built into an abi3 wheel by `cargo xtask py` (maturin); `docs/python.md`
//! has the guide.

mod env;
mod errors;
mod id;

use std::net::TcpListener;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use nccl_control::nccl_sys::{NCCL_UNIQUE_ID_BYTES, Nccl, ncclResult_t, ncclUniqueId};
use nccl_control::{Secret, rendezvous};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

/// What `wait`, `serve` and `join` return: the id's bytes, this rank and
/// the world size.
type Joined<'py> = (Bound<'py, PyBytes>, usize, usize);

/// The shared secret from `bytes` or `str` (its UTF-8 bytes); at least
/// 16 bytes.
fn secret_from_py(obj: &Bound<'_, PyAny>) -> PyResult<Secret> {
    let bytes = if let Ok(b) = obj.cast::<PyBytes>() {
        b.as_bytes().to_vec()
    } else if let Ok(s) = obj.cast::<PyString>() {
        s.to_cow()?.as_bytes().to_vec()
    } else {
        return Err(PyTypeError::new_err("the secret is bytes or str"));
    };
    Secret::from_bytes(bytes, "the secret argument").map_err(errors::secret)
}

/// Seconds as a `Duration`; negative, NaN or endless is a `ValueError`.
fn seconds(timeout: f64) -> PyResult<Duration> {
    // A year at most: a larger value is a mistake, not a wish to wait.
    const MAX_SECONDS: f64 = 365.0 * 24.0 * 3600.0;
    if !(0.0..=MAX_SECONDS).contains(&timeout) {
        return Err(PyValueError::new_err(format!(
            "timeout {timeout} is not a duration from 0 to {MAX_SECONDS} seconds"
        )));
    }
    Duration::try_from_secs_f64(timeout).map_err(|_| {
        PyValueError::new_err(format!("timeout {timeout} is not a duration in seconds"))
    })
}

/// Rank 0's side of the rendezvous. Binding happens at construction, so
/// `port` is known (and can be handed to the other ranks) before
/// `wait` blocks.
///
/// `Server(world, secret, *, port=0, host="0.0.0.0", unique_id=None)`:
/// `port=0` picks a free port; `unique_id=None` makes a fresh id with
/// libnccl (`ncclGetUniqueId`), otherwise the given id (bytes, or CuPy's
/// tuple) is handed out.
#[pyclass(module = "nccl_rs")]
struct Server {
    /// Taken by the first `wait`: a rendezvous serves once.
    listener: Mutex<Option<TcpListener>>,
    port: u16,
    world: usize,
    secret: Secret,
    id: ncclUniqueId,
    refused: Mutex<Vec<String>>,
}

#[pymethods]
impl Server {
    #[new]
    #[pyo3(signature = (world, secret, *, port = 0, host = "0.0.0.0", unique_id = None))]
    fn new(
        world: usize,
        secret: &Bound<'_, PyAny>,
        port: u16,
        host: &str,
        unique_id: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Server> {
        if world == 0 {
            return Err(PyValueError::new_err("the world has at least one rank"));
        }
        let secret = secret_from_py(secret)?;
        let id = match unique_id {
            Some(obj) => id::from_py(obj)?,
            None => fresh_id()?,
        };
        let listener = TcpListener::bind((host, port))
            .map_err(|e| PyRuntimeError::new_err(format!("binding {host}:{port}: {e}")))?;
        let port = listener.local_addr()?.port();
        Ok(Server {
            listener: Mutex::new(Some(listener)),
            port,
            world,
            secret,
            id,
            refused: Mutex::new(Vec::new()),
        })
    }

    /// The port the other ranks join.
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// The world size.
    #[getter]
    fn world(&self) -> usize {
        self.world
    }

    /// The id this server hands out (rank 0 initialises with it too).
    #[getter]
    fn unique_id<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        id::to_bytes(py, &self.id)
    }

    /// The refusals of the last `wait`: why each peer that was not served
    /// was turned away (wrong secret, other protocol version, ...).
    #[getter]
    fn refused(&self) -> Vec<String> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Serves the id to the other `world - 1` ranks, then returns
    /// `(unique_id, 0, world)`. Blocks (without the GIL) until every rank
    /// is served or `timeout` seconds pass (`RendezvousTimeout`). Peers
    /// that fail are refused and listed in `refused`; the server keeps
    /// waiting for the real ones. Runs once per server.
    #[pyo3(signature = (timeout = 300.0))]
    fn wait<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Joined<'py>> {
        let timeout = seconds(timeout)?;
        let listener = self
            .listener
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| errors::RendezvousError::new_err("this server has already served"))?;
        let (world, secret, id) = (self.world, &self.secret, &self.id);
        let outcome = py.detach(|| rendezvous::serve(&listener, world, secret, id, timeout));
        match outcome {
            Ok(refused) => {
                *self.refused.lock().unwrap_or_else(|p| p.into_inner()) =
                    refused.iter().map(ToString::to_string).collect();
                Ok((id::to_bytes(py, &self.id), 0, self.world))
            }
            Err(e) => Err(errors::rendezvous(py, e)),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "nccl_rs.Server(world={}, port={}, unique_id={:?})",
            self.world, self.port, self.id
        )
    }
}

/// `serve(world, secret, *, port, host="0.0.0.0", unique_id=None,
/// timeout=300.0) -> (unique_id, 0, world)`: `Server(...).wait(timeout)`
/// in one call, for a port the other ranks already know.
#[pyfunction]
#[pyo3(signature = (world, secret, *, port, host = "0.0.0.0", unique_id = None, timeout = 300.0))]
fn serve<'py>(
    py: Python<'py>,
    world: usize,
    secret: &Bound<'py, PyAny>,
    port: u16,
    host: &str,
    unique_id: Option<&Bound<'py, PyAny>>,
    timeout: f64,
) -> PyResult<Joined<'py>> {
    Server::new(world, secret, port, host, unique_id)?.wait(py, timeout)
}

/// `join(addr, rank, world, secret, *, timeout=300.0) -> (unique_id,
/// rank, world)`: connects to rank 0 at `addr` (`"host:port"`), retrying
/// until `timeout` seconds pass, proves the secret and receives the id.
/// Blocks without the GIL.
#[pyfunction]
#[pyo3(signature = (addr, rank, world, secret, *, timeout = 300.0))]
fn join<'py>(
    py: Python<'py>,
    addr: &str,
    rank: usize,
    world: usize,
    secret: &Bound<'py, PyAny>,
    timeout: f64,
) -> PyResult<Joined<'py>> {
    let secret = secret_from_py(secret)?;
    let timeout = seconds(timeout)?;
    let outcome = py.detach(|| rendezvous::join(addr, rank, world, &secret, timeout));
    match outcome {
        Ok(id) => Ok((id::to_bytes(py, &id), rank, world)),
        Err(e) => Err(errors::rendezvous(py, e)),
    }
}

/// `new_unique_id() -> bytes`: a fresh id from libnccl's
/// `ncclGetUniqueId` (found as nccl-sys finds it: `NCCL_LIBRARY`, the
/// loader, the pip wheel in the active environment).
#[pyfunction]
fn new_unique_id(py: Python<'_>) -> PyResult<Bound<'_, PyBytes>> {
    Ok(id::to_bytes(py, &fresh_id()?))
}

/// A fresh id from `ncclGetUniqueId`, refused while `NCCL_COMM_ID` is set
/// (its id is a fixed address anyone who reaches it can join) unless
/// `NCCL_RS_ALLOW_COMM_ID=1`, as nccl-safe refuses it.
fn fresh_id() -> PyResult<ncclUniqueId> {
    let set =
        std::env::var_os(env::COMM_ID_ENV).is_some_and(|v| !v.to_string_lossy().trim().is_empty());
    let allowed = std::env::var(env::ALLOW_COMM_ID_ENV).is_ok_and(|v| v.trim() == "1");
    if set && !allowed {
        return Err(PyRuntimeError::new_err(
            "ncclGetUniqueId: NCCL_COMM_ID is set: its id is a fixed address with a constant \
             magic, so anyone who can reach that address can join; unset it or set \
             NCCL_RS_ALLOW_COMM_ID=1",
        ));
    }
    let lib = library()?;
    let get = lib
        .ncclGetUniqueId()
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    let mut id = ncclUniqueId::zeroed();
    // SAFETY: `ncclGetUniqueId` writes one ncclUniqueId through a valid
    // pointer.
    let code = unsafe { get(&mut id) };
    if code != ncclResult_t::ncclSuccess {
        let text = lib.error_string(code).unwrap_or("unknown error");
        return Err(PyRuntimeError::new_err(format!("ncclGetUniqueId: {text}")));
    }
    Ok(id)
}

/// libnccl, loaded once and never unloaded (an id's bootstrap may run a
/// thread of NCCL's). A failed load is tried again at the next call (the
/// environment may have been fixed meanwhile), as nccl-safe does.
fn library() -> PyResult<&'static Nccl> {
    static LIB: OnceLock<Nccl> = OnceLock::new();
    static LOADING: Mutex<()> = Mutex::new(());
    if let Some(lib) = LIB.get() {
        return Ok(lib);
    }
    let _one_at_a_time = LOADING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(lib) = LIB.get() {
        return Ok(lib);
    }
    // SAFETY: the documented search order (NCCL_LIBRARY, NCCL_HOME, the
    // system loader, pip wheels) reads the process environment, trusted
    // like the dynamic loader's own.
    let lib = unsafe { Nccl::load() }.map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    Ok(LIB.get_or_init(|| lib))
}

/// The `nccl_rs` module.
#[pymodule]
fn nccl_rs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("PROTOCOL_VERSION", rendezvous::PROTOCOL_VERSION)?;
    m.add("UNIQUE_ID_BYTES", NCCL_UNIQUE_ID_BYTES)?;
    m.add_class::<Server>()?;
    m.add_function(wrap_pyfunction!(serve, m)?)?;
    m.add_function(wrap_pyfunction!(join, m)?)?;
    m.add_function(wrap_pyfunction!(new_unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(id::unique_id_to_cupy, m)?)?;
    m.add_function(wrap_pyfunction!(id::unique_id_hex, m)?)?;
    m.add_function(wrap_pyfunction!(id::unique_id_from_hex, m)?)?;
    errors::register(m)
}
