//! Unique ids between Python and Rust: bytes in, bytes out, and the form
//! CuPy's `NcclCommunicator(ndev, comm_id, rank)` takes (`bytes` from
//! CuPy 14 on, a tuple of C `char`s before).

use std::ffi::c_char;

use nccl_control::nccl_sys::{NCCL_UNIQUE_ID_BYTES, ncclUniqueId as UniqueId};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::errors::MalformedIdError;

/// A unique id from Python: `bytes` of 128 bytes, or a sequence of 128
/// ints (`bytearray`, CuPy's tuple of signed or unsigned chars).
/// Anything else is a `MalformedIdError`.
pub(crate) fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<UniqueId> {
    let bytes: Vec<u8> = if let Ok(b) = obj.cast::<PyBytes>() {
        b.as_bytes().to_vec()
    } else if let Ok(ints) = obj.extract::<Vec<i64>>() {
        ints.into_iter()
            .map(|v| {
                // A C char: signed (x86-64) or unsigned (aarch64).
                u8::try_from(v)
                    .or_else(|_| i8::try_from(v).map(|s| s as u8))
                    .map_err(|_| {
                        MalformedIdError::new_err(format!("id element {v} is not a C char"))
                    })
            })
            .collect::<PyResult<_>>()?
    } else {
        return Err(MalformedIdError::new_err(format!(
            "a unique id is bytes or a tuple of {} ints, not {}",
            NCCL_UNIQUE_ID_BYTES,
            obj.get_type().name()?
        )));
    };
    UniqueId::from_slice(&bytes).ok_or_else(|| {
        MalformedIdError::new_err(format!(
            "a unique id is {NCCL_UNIQUE_ID_BYTES} bytes, found {}",
            bytes.len()
        ))
    })
}

/// The id's bytes as a Python `bytes`.
pub(crate) fn to_bytes<'py>(py: Python<'py>, id: &UniqueId) -> Bound<'py, PyBytes> {
    PyBytes::new(py, id.as_bytes())
}

/// The id as the installed CuPy's `NcclCommunicator(ndev, comm_id, rank)`
/// takes it: `bytes` from CuPy 14 on (and when CuPy is not installed), the
/// tuple of 128 C `char` values (signed where this platform's `char` is)
/// before it. `form="bytes"` or `form="tuple"` chooses without asking
/// CuPy.
#[pyfunction]
#[pyo3(signature = (unique_id, form = None))]
pub(crate) fn unique_id_to_cupy<'py>(
    py: Python<'py>,
    unique_id: &Bound<'py, PyAny>,
    form: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    let id = from_py(unique_id)?;
    let tuple = match form {
        Some("tuple") => true,
        Some("bytes") => false,
        Some(other) => {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "form is \"bytes\" or \"tuple\", not {other:?}"
            )));
        }
        None => cupy_major(py).is_some_and(|major| major < 14),
    };
    if tuple {
        Ok(PyTuple::new(py, id.as_bytes().iter().map(|b| i64::from(*b as c_char)))?.into_any())
    } else {
        Ok(to_bytes(py, &id).into_any())
    }
}

/// The installed CuPy's major version, if it imports.
fn cupy_major(py: Python<'_>) -> Option<u32> {
    let version: String = py
        .import("cupy")
        .ok()?
        .getattr("__version__")
        .ok()?
        .extract()
        .ok()?;
    version.split('.').next()?.parse().ok()
}

/// `unique_id_hex(unique_id) -> str`: the id as 256 lowercase hex digits
/// (what `nccl_safe::UniqueId::to_hex` writes and `from_hex` reads).
#[pyfunction]
pub(crate) fn unique_id_hex(unique_id: &Bound<'_, PyAny>) -> PyResult<String> {
    Ok(from_py(unique_id)?.to_hex())
}

/// `unique_id_from_hex(text) -> bytes`: the id from 256 hex digits
/// (whitespace around them allowed); anything else is a
/// `MalformedIdError`.
#[pyfunction]
pub(crate) fn unique_id_from_hex<'py>(
    py: Python<'py>,
    text: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let id = UniqueId::from_hex(text).map_err(|e| MalformedIdError::new_err(e.to_string()))?;
    Ok(to_bytes(py, &id))
}
