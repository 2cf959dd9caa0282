//! Client errors as Python exceptions: a failure with the path of the
//! call, turned into the `nodekernel.errors` class of its wire code.

use nk::ErrorCode;
use nodekernel_client as nk;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;

/// A client error with the path of the call that failed.
pub(crate) struct Failure {
    pub(crate) err: nk::Error,
    pub(crate) path: Option<String>,
}

pub(crate) type R<T> = std::result::Result<T, Failure>;

pub(crate) trait At<T> {
    /// Names the path of a failed call.
    fn at(self, path: &str) -> R<T>;
}

impl<T> At<T> for nk::Result<T> {
    fn at(self, path: &str) -> R<T> {
        self.map_err(|err| Failure {
            err,
            path: Some(path.to_string()),
        })
    }
}

pub(crate) fn failure(code: ErrorCode, message: String, path: &str) -> Failure {
    Failure {
        err: nk::Error::new(code, message),
        path: Some(path.to_string()),
    }
}

pub(crate) static ERROR_FACTORY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

impl Failure {
    fn into_pyerr(self, py: Python<'_>) -> PyErr {
        let factory = ERROR_FACTORY.get_or_try_init(py, || {
            Ok::<_, PyErr>(
                py.import("nodekernel.errors")?
                    .getattr("_from_code")?
                    .unbind(),
            )
        });
        let made = factory.and_then(|f| {
            f.bind(py).call1((
                self.err.code.name(),
                &self.err.message,
                self.path.as_deref(),
            ))
        });
        match made {
            Ok(exc) => PyErr::from_value(exc),
            Err(e) => e,
        }
    }
}

/// What an operation body returns: a client failure, or a Python
/// exception already (a bad buffer, ...), or the failed items of a batched
/// call (`put_many`, `delete_many`) out of `total` items.
pub(crate) enum Fail {
    Nk(Failure),
    Py(PyErr),
    Batch { failed: Vec<Failure>, total: usize },
}

impl From<Failure> for Fail {
    fn from(f: Failure) -> Self {
        Fail::Nk(f)
    }
}

impl From<PyErr> for Fail {
    fn from(e: PyErr) -> Self {
        Fail::Py(e)
    }
}

pub(crate) static BATCH_FACTORY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

impl Fail {
    pub(crate) fn into_pyerr(self, py: Python<'_>) -> PyErr {
        match self {
            Fail::Nk(f) => f.into_pyerr(py),
            Fail::Py(e) => e,
            Fail::Batch { failed, total } => batch_error(py, failed, total),
        }
    }
}

/// A `nodekernel.errors.BatchError` listing each failed key (the path of
/// its failure) with the exception of its wire code.
fn batch_error(py: Python<'_>, failed: Vec<Failure>, total: usize) -> PyErr {
    let factory = BATCH_FACTORY.get_or_try_init(py, || {
        Ok::<_, PyErr>(py.import("nodekernel.errors")?.getattr("_batch")?.unbind())
    });
    let made = factory.and_then(|f| {
        let errors = failed
            .into_iter()
            .map(|f| {
                let key = f.path.clone().unwrap_or_default();
                (key, f.into_pyerr(py).into_value(py))
            })
            .collect::<Vec<_>>();
        f.bind(py).call1((errors, total))
    });
    match made {
        Ok(exc) => PyErr::from_value(exc),
        Err(e) => e,
    }
}

pub(crate) type Out<T> = std::result::Result<T, Fail>;
