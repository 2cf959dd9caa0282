//! `Session`: a session of a client (`docs/lifecycle.md`, *Sessions*),
//! renewed in the background while it is open; nodes made with
//! `session=` are removed, with their subtree, when it is closed or its
//! lease lapses (the process died or was cut off).

use crate::errors::Out;
use crate::runtime::{block, spawn, SelfRef};
use nodekernel_client as nk;
use pyo3::prelude::*;

#[pyclass(name = "Session", module = "nodekernel._native", frozen)]
pub(crate) struct Session {
    pub(crate) inner: nk::Session,
}

#[pymethods]
impl Session {
    /// The lease the metadata servers gave, in seconds.
    #[getter]
    fn lease(&self) -> f64 {
        self.inner.lease().as_secs_f64()
    }

    /// Whether the session has ended: closed, or its lease lapsed (what
    /// was bound to it is gone).
    #[getter]
    fn ended(&self) -> bool {
        self.inner.has_ended()
    }

    /// Ends the session: everything bound to it is removed. Closing it
    /// again does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.inner.clone();
        block(py, close(s))
    }

    /// `close` as an awaitable, for asyncio.
    fn aclose<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, close(self.inner.clone()))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __aenter__<'py>(slf: Py<Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, async move { Ok(SelfRef(slf.into_any())) })
    }

    #[pyo3(signature = (*_exc))]
    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        _exc: &Bound<'py, pyo3::types::PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.aclose(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "<nodekernel.Session lease={}s{}>",
            self.inner.lease().as_secs_f64(),
            if self.inner.has_ended() { " ended" } else { "" }
        )
    }
}

async fn close(s: nk::Session) -> Out<()> {
    s.close()
        .await
        .map_err(|err| crate::errors::Failure { err, path: None }.into())
}
