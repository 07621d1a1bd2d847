//! The Python exceptions and how each of nccl-dist's typed errors maps to
//! one. Every exception derives from `nccl_rs.RendezvousError`; the
//! message is the Rust error's own text.

use nccl_control::{RendezvousError as Rdv, SecretError};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

create_exception!(
    nccl_rs,
    RendezvousError,
    PyException,
    "A rendezvous failed. The base of every nccl_rs exception."
);
create_exception!(
    nccl_rs,
    UnauthenticatedError,
    RendezvousError,
    "The other side does not hold the shared secret (a wrong secret on one side, or a stranger on the port)."
);
create_exception!(
    nccl_rs,
    RejectedError,
    RendezvousError,
    "Rank 0 refused this rank in an authenticated reject; `reason` says why (wrong world size, duplicate rank, ...)."
);
create_exception!(
    nccl_rs,
    RendezvousTimeout,
    RendezvousError,
    "The deadline passed (nobody served the address, or too few ranks joined)."
);
create_exception!(
    nccl_rs,
    ProtocolVersionError,
    RendezvousError,
    "The peer speaks another version of the rendezvous protocol; `got` and `expected` are the versions."
);
create_exception!(
    nccl_rs,
    MalformedIdError,
    RendezvousError,
    "A unique id that is not 128 bytes (or not 256 hex digits)."
);

/// Registers the exceptions on the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("RendezvousError", py.get_type::<RendezvousError>())?;
    m.add(
        "UnauthenticatedError",
        py.get_type::<UnauthenticatedError>(),
    )?;
    m.add("RejectedError", py.get_type::<RejectedError>())?;
    m.add("RendezvousTimeout", py.get_type::<RendezvousTimeout>())?;
    m.add(
        "ProtocolVersionError",
        py.get_type::<ProtocolVersionError>(),
    )?;
    m.add("MalformedIdError", py.get_type::<MalformedIdError>())?;
    Ok(())
}

/// The exception for a rendezvous error, with its details as attributes
/// where it has some (`reason` on a reject, `got`/`expected` on a version
/// mismatch).
pub(crate) fn rendezvous(py: Python<'_>, e: Rdv) -> PyErr {
    let text = e.to_string();
    match e {
        Rdv::Timeout { .. } => RendezvousTimeout::new_err(text),
        Rdv::BadSecret | Rdv::Unauthenticated { .. } => UnauthenticatedError::new_err(text),
        Rdv::Rejected(reason) => {
            let err = RejectedError::new_err(text);
            set(py, &err, "reason", reason.to_string());
            err
        }
        Rdv::Version { got } => {
            let err = ProtocolVersionError::new_err(text);
            set(py, &err, "got", got);
            set(
                py,
                &err,
                "expected",
                nccl_control::rendezvous::PROTOCOL_VERSION,
            );
            err
        }
        _ => RendezvousError::new_err(text),
    }
}

/// A secret that cannot be used (too short): a `ValueError`.
pub(crate) fn secret(e: SecretError) -> PyErr {
    PyValueError::new_err(e.to_string())
}

fn set<'py, V: IntoPyObject<'py>>(py: Python<'py>, err: &PyErr, name: &str, value: V) {
    // Setting an attribute on a fresh exception instance does not fail;
    // if it ever did, the exception still carries its message.
    let _ = err.value(py).setattr(name, value);
}
