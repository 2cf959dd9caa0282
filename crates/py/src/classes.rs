//! The Python classes: `Client`, `AsyncClient`, `File`, `AsyncFile`.

use crate::buffers::writable_target;
use crate::buffers::Input;
use crate::client::batch_keys;
use crate::client::check_in_flight;
use crate::client::check_path;
use crate::client::child_ttl_arg;
use crate::client::duration_arg;
use crate::client::put_items;
use crate::client::ttl_arg;
use crate::client::Core;
use crate::client::DEFAULT_IN_FLIGHT;
use crate::errors::Out;
use crate::file::spawn_write;
use crate::file::want;
use crate::file::AsyncFile;
use crate::file::File;
use crate::ops;
use crate::runtime::block;
use crate::runtime::block_on_workers;
use crate::runtime::spawn;
use crate::runtime::spawn_to_end;
use crate::runtime::SelfRef;
use crate::session::Session;
use crate::values::parse_type;
use crate::values::Value;
use nk::NodeType;
use nodekernel_client as nk;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::IntoPyObjectExt;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A create's `ttl=` and `session=` arguments.
fn life(
    ttl: Option<&Bound<'_, PyAny>>,
    session: Option<PyRef<'_, Session>>,
) -> PyResult<ops::Life> {
    Ok(ops::Life {
        ttl: ttl_arg(ttl)?,
        session: session.map(|s| s.inner.clone()),
        ..Default::default()
    })
}

/// Client methods, generated for the sync and the asyncio class: `$run`
/// is `block` or `spawn`, `$to_end` the same for calls that run to their
/// end even if cancelled (`spawn_to_end`), `$aio` says which file class to
/// hand out.
macro_rules! client_methods {
    ($ty:ident, $run:ident, $to_end:ident, $many:ident, $ret:ty, $aio:expr, { $($extra:tt)* }) => {
        #[pymethods]
        impl $ty {
            $($extra)*

            /// Opens a session with a lease of `lease` seconds (or a
            /// timedelta; default 10 s), renewed in the background; see
            /// `Session`.
            #[pyo3(signature = (lease = None))]
            fn session<'py>(
                &self,
                py: Python<'py>,
                lease: Option<&Bound<'py, PyAny>>,
            ) -> PyResult<$ret> {
                self.core.check()?;
                let lease = match lease.filter(|l| !l.is_none()) {
                    Some(l) => duration_arg("lease", l)?,
                    None => nk::DEFAULT_SESSION_LEASE,
                };
                $run(py, ops::session(self.core.clone(), lease))
            }

            #[pyo3(signature = (
                path, r#type = "dir", parents = false, enumerable = true, *, ttl = None,
                child_ttl = None, session = None
            ))]
            #[allow(clippy::too_many_arguments)]
            fn mkdir<'py>(
                &self,
                py: Python<'py>,
                path: &str,
                r#type: &str,
                parents: bool,
                enumerable: bool,
                ttl: Option<&Bound<'py, PyAny>>,
                child_ttl: Option<&Bound<'py, PyAny>>,
                session: Option<PyRef<'py, Session>>,
            ) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                let ty = parse_type(
                    r#type,
                    &[NodeType::Directory, NodeType::Table, NodeType::Bag],
                )?;
                let life = ops::Life {
                    ttl: ttl_arg(ttl)?,
                    child_ttl: child_ttl_arg(child_ttl)?,
                    session: session.map(|s| s.inner.clone()),
                };
                let core = self.core.clone();
                $run(py, ops::mkdir(core, path.into(), ty, parents, enumerable, life))
            }

            #[pyo3(signature = (path, r#type = "file", *, ttl = None, session = None))]
            fn create<'py>(
                &self,
                py: Python<'py>,
                path: &str,
                r#type: &str,
                ttl: Option<&Bound<'py, PyAny>>,
                session: Option<PyRef<'py, Session>>,
            ) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                let ty = parse_type(r#type, &[NodeType::File, NodeType::KeyValue])?;
                let life = life(ttl, session)?;
                $to_end(py, ops::create(self.core.clone(), path.into(), ty, life, $aio))
            }

            /// The node at `path` (with its subtree) expires `ttl` from now
            /// (or never); returns its stat.
            fn expire<'py>(
                &self,
                py: Python<'py>,
                path: &str,
                ttl: &Bound<'py, PyAny>,
            ) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                let ttl = ttl_arg(Some(ttl))?
                    .ok_or_else(|| PyValueError::new_err("ttl must be given"))?;
                $run(py, ops::expire(self.core.clone(), path.into(), Ok(ttl)))
            }

            /// The container at `path` gives its new children `child_ttl`
            /// (`None`: no child TTL); returns its stat.
            fn set_child_ttl<'py>(
                &self,
                py: Python<'py>,
                path: &str,
                child_ttl: Option<&Bound<'py, PyAny>>,
            ) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                let child = child_ttl_arg(child_ttl)?;
                $run(py, ops::expire(self.core.clone(), path.into(), Err(child)))
            }

            fn lookup<'py>(&self, py: Python<'py>, path: &str) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                $to_end(py, ops::lookup(self.core.clone(), path.into(), $aio))
            }

            #[pyo3(signature = (path, mode = "rb", *, ttl = None, session = None))]
            fn open<'py>(
                &self,
                py: Python<'py>,
                path: &str,
                mode: &str,
                ttl: Option<&Bound<'py, PyAny>>,
                session: Option<PyRef<'py, Session>>,
            ) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                let life = life(ttl, session)?;
                $to_end(py, ops::open(self.core.clone(), path.into(), mode.into(), life, $aio))
            }

            fn stat<'py>(&self, py: Python<'py>, path: &str) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                $run(py, ops::stat(self.core.clone(), path.into()))
            }

            fn exists<'py>(&self, py: Python<'py>, path: &str) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                $run(py, ops::exists(self.core.clone(), path.into()))
            }

            #[pyo3(signature = (path = "/", detail = false))]
            fn ls<'py>(&self, py: Python<'py>, path: &str, detail: bool) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                $run(py, ops::ls(self.core.clone(), path.into(), detail))
            }

            #[pyo3(signature = (path, recursive = false))]
            fn delete<'py>(&self, py: Python<'py>, path: &str, recursive: bool) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                $run(py, ops::delete(self.core.clone(), path.into(), recursive))
            }

            #[pyo3(name = "move")]
            fn rename<'py>(&self, py: Python<'py>, src: &str, dst: &str) -> PyResult<$ret> {
                self.core.check()?;
                check_path(src)?;
                check_path(dst)?;
                $run(py, ops::rename(self.core.clone(), src.into(), dst.into()))
            }

            fn status<'py>(&self, py: Python<'py>) -> PyResult<$ret> {
                self.core.check()?;
                $run(py, ops::status(self.core.clone()))
            }

            #[pyo3(signature = (path, bytes = None, nodes = None))]
            fn set_quota<'py>(
                &self,
                py: Python<'py>,
                path: &str,
                bytes: Option<u64>,
                nodes: Option<u64>,
            ) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                $run(py, ops::set_quota(self.core.clone(), path.into(), bytes, nodes))
            }

            fn quota<'py>(&self, py: Python<'py>, path: &str) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                $run(py, ops::quota(self.core.clone(), path.into()))
            }

            fn quotas<'py>(&self, py: Python<'py>) -> PyResult<$ret> {
                self.core.check()?;
                $run(py, ops::quotas(self.core.clone()))
            }

            #[pyo3(signature = (path = "/"))]
            fn du<'py>(&self, py: Python<'py>, path: &str) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                $run(py, ops::du(self.core.clone(), path.into()))
            }

            #[pyo3(signature = (path, value, *, ttl = None, session = None))]
            fn put<'py>(
                &self,
                py: Python<'py>,
                path: &str,
                value: &Bound<'py, PyAny>,
                ttl: Option<&Bound<'py, PyAny>>,
                session: Option<PyRef<'py, Session>>,
            ) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                let input = Input::new(value)?;
                let life = life(ttl, session)?;
                $run(py, ops::put(self.core.clone(), path.into(), input, life))
            }

            #[pyo3(signature = (items, in_flight = DEFAULT_IN_FLIGHT))]
            fn put_many<'py>(
                &self,
                py: Python<'py>,
                items: &Bound<'py, PyAny>,
                in_flight: i64,
            ) -> PyResult<$ret> {
                self.core.check()?;
                let in_flight = check_in_flight(in_flight)?;
                let items = put_items(items)?;
                $many(py, ops::put_many(self.core.clone(), items, in_flight))
            }

            #[pyo3(signature = (keys, in_flight = DEFAULT_IN_FLIGHT))]
            fn get_many<'py>(
                &self,
                py: Python<'py>,
                keys: &Bound<'py, PyAny>,
                in_flight: i64,
            ) -> PyResult<$ret> {
                self.core.check()?;
                let in_flight = check_in_flight(in_flight)?;
                let keys = batch_keys(keys, nk::MAX_GET_MANY)?;
                $many(py, ops::get_many(self.core.clone(), keys, in_flight))
            }

            #[pyo3(signature = (keys, recursive = false, in_flight = DEFAULT_IN_FLIGHT))]
            fn delete_many<'py>(
                &self,
                py: Python<'py>,
                keys: &Bound<'py, PyAny>,
                recursive: bool,
                in_flight: i64,
            ) -> PyResult<$ret> {
                self.core.check()?;
                let in_flight = check_in_flight(in_flight)?;
                let keys = batch_keys(keys, nk::MAX_DELETE_MANY)?;
                $many(py, ops::delete_many(self.core.clone(), keys, recursive, in_flight))
            }

            fn get<'py>(&self, py: Python<'py>, path: &str) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                $run(py, ops::get(self.core.clone(), path.into()))
            }

            fn get_into<'py>(
                &self,
                py: Python<'py>,
                path: &str,
                buffer: &Bound<'py, PyAny>,
            ) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                let target = writable_target(buffer)?;
                $run(py, ops::get_into(self.core.clone(), path.into(), target))
            }

            /// Whether `close` was called.
            #[getter]
            fn closed(&self) -> bool {
                self.core.closed.load(Ordering::Acquire)
            }

            fn __repr__(&self) -> String {
                format!(
                    "<nodekernel.{} meta={:?}{}>",
                    stringify!($ty),
                    self.core.client.config().metas,
                    if self.closed() { " closed" } else { "" }
                )
            }
        }
    };
}

/// A synchronous NodeKernel client. Every call releases the GIL while it
/// waits, so threads can share one client.
#[pyclass(module = "nodekernel._native", frozen)]
pub(crate) struct Client {
    pub(crate) core: Arc<Core>,
}

/// An asyncio NodeKernel client: the methods of [`Client`], each returning
/// an awaitable; any number of calls may be in flight.
#[pyclass(module = "nodekernel._native", frozen)]
pub(crate) struct AsyncClient {
    pub(crate) core: Arc<Core>,
}

pub(crate) fn block_value<T>(
    py: Python<'_>,
    fut: impl Future<Output = Out<T>> + Send,
) -> PyResult<Py<PyAny>>
where
    T: Send + for<'a> IntoPyObject<'a>,
{
    block(py, fut)?.into_py_any(py)
}

/// [`block_value`] of a call run on the runtime's workers.
pub(crate) fn block_many<T>(
    py: Python<'_>,
    fut: impl Future<Output = Out<T>> + Send + 'static,
) -> PyResult<Py<PyAny>>
where
    T: Send + 'static + for<'a> IntoPyObject<'a>,
{
    block_on_workers(py, fut)?.into_py_any(py)
}

client_methods!(
    Client,
    block_value,
    block_value,
    block_many,
    Py<PyAny>,
    false,
    {
        /// Closes the client; later calls raise ValueError. Open files keep
        /// working until closed.
        fn close(&self) {
            self.core.closed.store(true, Ordering::Release);
        }

        fn __enter__(slf: Py<Self>) -> Py<Self> {
            slf
        }

        #[pyo3(signature = (*_exc))]
        fn __exit__(&self, _exc: &Bound<'_, pyo3::types::PyTuple>) {
            self.close();
        }
    }
);
client_methods!(
    AsyncClient,
    spawn,
    spawn_to_end,
    spawn,
    Bound<'py, PyAny>,
    true,
    {
        fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
            self.core.closed.store(true, Ordering::Release);
            spawn(py, async { Ok(Value::None) })
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
            self.close(py)
        }
    }
);

/// File attributes, shared by [`File`] and [`AsyncFile`].
macro_rules! file_attrs {
    ($ty:ident, { $($extra:tt)* }) => {
        #[pymethods]
        impl $ty {
            $($extra)*

            #[getter]
            fn name(&self) -> &str {
                &self.f.name
            }
            #[getter]
            fn mode(&self) -> &str {
                self.f.mode
            }
            #[getter]
            fn closed(&self) -> bool {
                self.f.closed.load(Ordering::Acquire)
            }
            #[getter]
            fn size(&self) -> u64 {
                self.f.size.load(Ordering::Acquire)
            }
            /// A Bag's Files as (path, offset in the stream, size); else empty.
            #[getter]
            fn files(&self) -> Vec<(String, u64, u64)> {
                self.f.files.clone()
            }
            fn tell(&self) -> PyResult<u64> {
                self.f.check()?;
                Ok(self.f.pos.load(Ordering::Acquire))
            }
            #[pyo3(signature = (offset, whence = 0))]
            fn seek(&self, offset: i64, whence: i32) -> PyResult<u64> {
                self.f.seek(offset, whence)
            }
            fn readable(&self) -> bool {
                self.f.mode == "rb"
            }
            fn writable(&self) -> bool {
                self.f.mode != "rb"
            }
            fn seekable(&self) -> bool {
                self.f.mode == "rb" && self.f.files.is_empty()
            }
            fn __repr__(&self) -> String {
                format!(
                    "<nodekernel.{} {:?} mode={:?}{}>",
                    stringify!($ty),
                    self.f.name,
                    self.f.mode,
                    if self.closed() { " closed" } else { "" }
                )
            }
        }
    };
}

file_attrs!(File, {
    #[pyo3(signature = (size = -1))]
    fn read(&self, py: Python<'_>, size: Option<i64>) -> PyResult<Py<PyAny>> {
        self.f.check()?;
        block_value(py, self.f.clone().read(want(size)))
    }

    fn readall(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.read(py, None)
    }

    fn readinto(&self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.f.check()?;
        let target = writable_target(buffer)?;
        block_value(py, self.f.clone().readinto(target))
    }

    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.f.check()?;
        let input = Input::new(data)?;
        block_value(py, self.f.clone().write(input))
    }

    fn flush(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.f.check()?;
        block_value(py, self.f.clone().flush())
    }

    /// Closes the file (writers publish what they wrote). Closing twice is
    /// a no-op.
    fn close(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if self.closed() {
            return Ok(py.None());
        }
        self.f.core.check()?;
        block_value(py, self.f.clone().close())
    }

    /// Writers: gives up without publishing anything since the last
    /// flush; a put in steps leaves no value. Readers: closes.
    fn abort(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if self.closed() {
            return Ok(py.None());
        }
        self.f.core.check()?;
        block_value(py, self.f.clone().abort())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (exc_type, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        if self.closed() {
            return Ok(());
        }
        self.f.core.check()?;
        let failed = exc_type.is_some_and(|t| !t.is_none());
        block_value(py, self.f.clone().exit(failed)).map(|_| ())
    }
});
file_attrs!(AsyncFile, {
    #[pyo3(signature = (size = -1))]
    fn read<'py>(&self, py: Python<'py>, size: Option<i64>) -> PyResult<Bound<'py, PyAny>> {
        self.f.check()?;
        spawn(py, self.f.clone().read(want(size)))
    }

    fn readinto<'py>(
        &self,
        py: Python<'py>,
        buffer: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.f.check()?;
        let target = writable_target(buffer)?;
        spawn(py, self.f.clone().readinto(target))
    }

    fn write<'py>(&self, py: Python<'py>, data: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.f.check()?;
        let input = Input::new(data)?;
        spawn_write(py, self.f.clone(), self.f.clone().write(input))
    }

    fn flush<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.f.check()?;
        spawn(py, self.f.clone().flush())
    }

    fn close<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if self.closed() {
            return spawn(py, async { Ok(Value::None) });
        }
        self.f.core.check()?;
        spawn_to_end(py, self.f.clone().close())
    }

    fn __aenter__<'py>(slf: Py<Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, async move { Ok(SelfRef(slf.into_any())) })
    }

    fn abort<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if self.closed() {
            return spawn(py, async { Ok(Value::None) });
        }
        self.f.core.check()?;
        spawn_to_end(py, self.f.clone().abort())
    }

    #[pyo3(signature = (exc_type, _exc = None, _tb = None))]
    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        exc_type: Option<&Bound<'py, PyAny>>,
        _exc: Option<&Bound<'py, PyAny>>,
        _tb: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if self.closed() {
            return spawn(py, async { Ok(Value::None) });
        }
        self.f.core.check()?;
        let failed = exc_type.is_some_and(|t| !t.is_none());
        spawn_to_end(py, self.f.clone().exit(failed))
    }
});
