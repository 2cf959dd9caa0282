//! The client shared by a Python client's calls and its files, and the
//! helpers of its operations.

use crate::buffers::new_bytes;
use crate::buffers::type_name;
use crate::buffers::Input;
use crate::buffers::Target;
use crate::errors::failure;
use crate::errors::At;
use crate::errors::Fail;
use crate::errors::Failure;
use crate::errors::Out;
use crate::runtime::attach_or_fail;
use nk::{ErrorCode, NodeType};
use nodekernel_client as nk;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub(crate) struct Core {
    pub(crate) client: nk::Client,
    pub(crate) pid: u32,
    pub(crate) closed: AtomicBool,
}

impl Core {
    pub(crate) fn check(&self) -> PyResult<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(PyValueError::new_err("the client is closed"));
        }
        if self.pid != std::process::id() {
            return Err(PyRuntimeError::new_err(
                "this client was connected in another process (before a fork); \
                 connect again in this process",
            ));
        }
        Ok(())
    }
}

pub(crate) fn check_path(path: &str) -> PyResult<()> {
    if path.contains('\0') {
        return Err(PyValueError::new_err("paths cannot contain NUL characters"));
    }
    Ok(())
}

/// Calls in flight a batched call (`put_many`, ...) runs by default.
pub(crate) const DEFAULT_IN_FLIGHT: i64 = 64;

/// Most calls in flight a batched call takes.
pub(crate) const MAX_IN_FLIGHT: i64 = 4096;

/// A batched call's `in_flight`: 1 to [`MAX_IN_FLIGHT`].
pub(crate) fn check_in_flight(in_flight: i64) -> PyResult<usize> {
    if !(1..=MAX_IN_FLIGHT).contains(&in_flight) {
        return Err(PyValueError::new_err(format!(
            "in_flight must be 1 to {MAX_IN_FLIGHT}, not {in_flight}"
        )));
    }
    Ok(in_flight as usize)
}

/// `InvalidArgument` for a batch of more than `max` items (checked while
/// iterating, so an endless iterable is not drained).
fn too_many(py: Python<'_>, what: &str, max: usize) -> PyErr {
    Fail::Nk(Failure {
        err: nk::Error::invalid_argument(format!("more than {max} {what} in one call")),
        path: None,
    })
    .into_pyerr(py)
}

/// The keys of a `get_many` or `delete_many`: an iterable of `str` (not a
/// `str` itself), at most `max`.
pub(crate) fn batch_keys(keys: &Bound<'_, PyAny>, max: usize) -> PyResult<Vec<String>> {
    if keys.is_instance_of::<pyo3::types::PyString>() {
        return Err(PyTypeError::new_err(
            "keys must be an iterable of str (a list, a tuple, ...), not one str",
        ));
    }
    let mut out = Vec::new();
    for k in keys.try_iter()? {
        if out.len() == max {
            return Err(too_many(keys.py(), "keys", max));
        }
        let k = k?;
        let k: String = k.extract().map_err(|_| {
            PyTypeError::new_err(format!("keys must be str, not {}", type_name(&k)))
        })?;
        check_path(&k)?;
        out.push(k);
    }
    Ok(out)
}

/// The items of a `put_many`: a mapping of key to value, or an iterable of
/// `(key, value)` pairs; each value any bytes-like object, borrowed in
/// place where possible ([`Input`]); at most [`nk::MAX_PUT_MANY`] items.
pub(crate) fn put_items(items: &Bound<'_, PyAny>) -> PyResult<Vec<(String, Input)>> {
    let py = items.py();
    let pairs = if items.hasattr("keys")? {
        items.call_method0("items")?
    } else {
        items.clone()
    };
    let mut out = Vec::new();
    for pair in pairs.try_iter()? {
        if out.len() == nk::MAX_PUT_MANY {
            return Err(too_many(py, "items", nk::MAX_PUT_MANY));
        }
        let pair = pair?;
        let (k, v): (Bound<'_, PyAny>, Bound<'_, PyAny>) = pair.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "each item must be a (key, bytes-like value) pair, not {}",
                type_name(&pair)
            ))
        })?;
        let k: String = k.extract().map_err(|_| {
            PyTypeError::new_err(format!("keys must be str, not {}", type_name(&k)))
        })?;
        check_path(&k)?;
        out.push((k, Input::new(&v)?));
    }
    Ok(out)
}

pub(crate) async fn connect_core(meta: Option<String>, config: Option<PathBuf>) -> Out<Arc<Core>> {
    let cfg = nk::discover(meta.as_deref(), config.as_deref())
        .map_err(|err| Failure { err, path: None })?;
    let client = nk::Client::connect(cfg)
        .await
        .map_err(|err| Failure { err, path: None })?;
    Ok(Arc::new(Core {
        client,
        pid: std::process::id(),
        closed: AtomicBool::new(false),
    }))
}

/// Reads all of `node` into a new `bytes`; `Stale` if it was replaced.
pub(crate) async fn read_whole(node: &nk::Node, path: &str) -> Out<Target> {
    let len = node.info().size;
    let mut t = attach_or_fail(|py| new_bytes(py, len))?;
    // SAFETY: the bytes object is ours alone until returned.
    node.read_at(0, unsafe { t.slice() }).await.at(path)?;
    Ok(t)
}

/// Whether the parent of `path` is a Table.
pub(crate) async fn in_table(c: &nk::Client, path: &str) -> bool {
    let parent = match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    };
    matches!(c.lookup(parent).await, Ok(n) if n.info().ty == NodeType::Table)
}

pub(crate) fn is_data(t: NodeType) -> bool {
    matches!(t, NodeType::File | NodeType::KeyValue)
}

pub(crate) fn not_data(path: &str, t: NodeType) -> Failure {
    failure(
        ErrorCode::TypeMismatch,
        format!(
            "{path} is a {}, not a File or KeyValue",
            t.name().to_lowercase()
        ),
        path,
    )
}

/// Looks up a data node, retrying a read that meets a replaced value.
pub(crate) async fn with_value<T, F, Fut>(core: &Core, path: &str, mut read: F) -> Out<T>
where
    F: FnMut(nk::Node) -> Fut,
    Fut: Future<Output = Out<T>>,
{
    let mut attempt = 1;
    loop {
        let node = core.client.lookup(path).await.at(path)?;
        if !is_data(node.info().ty) {
            return Err(not_data(path, node.info().ty).into());
        }
        match read(node).await {
            Err(Fail::Nk(f)) if f.err.code == ErrorCode::Stale && attempt < nk::GET_ATTEMPTS => {
                attempt += 1
            }
            r => return r,
        }
    }
}

pub(crate) fn child_path(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// A `ttl=` argument (`docs/lifecycle.md`): seconds (an int or float
/// above 0), a `datetime.timedelta`, or `"never"` (not even under a parent
/// with a child TTL); `None` when absent.
pub(crate) fn ttl_arg(ttl: Option<&Bound<'_, PyAny>>) -> PyResult<Option<nk::Ttl>> {
    let Some(t) = ttl.filter(|t| !t.is_none()) else {
        return Ok(None);
    };
    if let Ok(s) = t.extract::<String>() {
        return match s.as_str() {
            "never" => Ok(Some(nk::Ttl::Never)),
            _ => Err(PyValueError::new_err(format!(
                "ttl must be seconds, a timedelta or \"never\", not {s:?}"
            ))),
        };
    }
    Ok(Some(nk::Ttl::After(duration_arg("ttl", t)?)))
}

/// A `child_ttl=` argument: seconds (above 0) or a `datetime.timedelta`;
/// `None` when absent.
pub(crate) fn child_ttl_arg(
    ttl: Option<&Bound<'_, PyAny>>,
) -> PyResult<Option<std::time::Duration>> {
    match ttl.filter(|t| !t.is_none()) {
        None => Ok(None),
        Some(t) => duration_arg("child_ttl", t).map(Some),
    }
}

/// Seconds (an int or float above 0, finite) or a `datetime.timedelta`
/// (positive), as a duration.
pub(crate) fn duration_arg(what: &str, t: &Bound<'_, PyAny>) -> PyResult<std::time::Duration> {
    let secs: f64 = if t.hasattr("total_seconds")? {
        t.call_method0("total_seconds")?.extract()?
    } else {
        t.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "{what} must be seconds (int or float) or a timedelta, not {}",
                type_name(t)
            ))
        })?
    };
    // About 100 years at most: the server refuses longer.
    const MAX_SECS: f64 = 100.0 * 365.25 * 86_400.0;
    if !(secs > 0.0 && secs <= MAX_SECS) {
        return Err(PyValueError::new_err(format!(
            "{what} must be above 0 and at most about 100 years, not {secs} seconds"
        )));
    }
    Ok(std::time::Duration::from_secs_f64(secs))
}
