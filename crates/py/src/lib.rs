//! `nodekernel._native`: the Python binding of the NodeKernel client.
//!
//! One implementation serves both APIs: every operation is an `async` body
//! over the Rust client ([`nodekernel_client`], the only protocol
//! implementation). The synchronous classes (`Client`, `File`) run it
//! with the GIL released on the module's tokio runtime; the asyncio classes
//! (`AsyncClient`, `AsyncFile`) run it as a task there and hand the loop
//! a future for it (`nodekernel._future.NativeFuture`, see `spawn`), so
//! many calls can be in flight from one loop.
//!
//! Cancellation: a cancelled asyncio call stops its task, and the
//! CancelledError reaches the caller only once the task has stopped, so a
//! cancelled call never touches the caller's buffer afterwards. The
//! client's calls are cancel safe, so the connection stays usable, and a
//! cancelled put is aborted (`Client::put`). What takes or gives back a
//! write lease (open, create, close, abort) runs to its end regardless
//! (`detached`), and a cancelled file write poisons its file and aborts
//! the writer (`spawn_write`): no cancellation leaves space held until
//! the metadata server's sweep.
//!
//! Values come back as `bytes` allocated once at their final size and
//! filled in place with the GIL released (on the co-located path that is
//! the one copy out of the storage server's shared memory); `readinto` and
//! `get_into` fill any writable, C-contiguous buffer directly.
//!
//! Nothing here panics on input from Python: types are checked by PyO3,
//! sizes and offsets by the code below, and every client error becomes an
//! exception of `nodekernel.errors` (chosen by its wire code, see
//! `errors.py`).

use nk::{ErrorCode, NodeInfo, NodeType};
use nodekernel_client as nk;
use nodekernel_client::sync;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList};
use pyo3::IntoPyObjectExt;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::runtime::Runtime;

// ---------------------------------------------------------------------------
// Runtime

/// The runtime of this process. A forked child gets a new one on first use
/// (the parent's threads do not exist in the child); clients made before
/// the fork refuse to work there (see [`Core::check`]).
static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);
fn runtime() -> PyResult<&'static Runtime> {
    let pid = std::process::id();
    let mut rt = sync::lock(&RUNTIME);
    if let Some((p, r)) = *rt {
        if p == pid {
            return Ok(r);
        }
    }
    let r = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("nodekernel")
        .enable_all()
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the I/O runtime: {e}")))?;
    // One per process, alive until the process ends.
    let r: &'static Runtime = Box::leak(Box::new(r));
    *rt = Some((pid, r));
    Ok(r)
}

// ---------------------------------------------------------------------------
// Errors

/// A client error with the path of the call that failed.
struct Failure {
    err: nk::Error,
    path: Option<String>,
}

type R<T> = std::result::Result<T, Failure>;

trait At<T> {
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

fn failure(code: ErrorCode, message: String, path: &str) -> Failure {
    Failure {
        err: nk::Error::new(code, message),
        path: Some(path.to_string()),
    }
}

static ERROR_FACTORY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

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
/// exception already (a bad buffer, ...).
enum Fail {
    Nk(Failure),
    Py(PyErr),
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

impl Fail {
    fn into_pyerr(self, py: Python<'_>) -> PyErr {
        match self {
            Fail::Nk(f) => f.into_pyerr(py),
            Fail::Py(e) => e,
        }
    }
}

type Out<T> = std::result::Result<T, Fail>;

// ---------------------------------------------------------------------------
// Running operations

/// Runs `fut` to completion with the GIL released.
fn block<T: Send>(py: Python<'_>, fut: impl Future<Output = Out<T>> + Send) -> PyResult<T> {
    let rt = runtime()?;
    py.detach(|| rt.block_on(fut)).map_err(|f| f.into_pyerr(py))
}

static NATIVE_FUTURE: PyOnceLock<(Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();

/// Hands `fut` to the running asyncio event loop as an awaitable: a
/// `nodekernel._future.NativeFuture`, resolved when the task running `fut`
/// on the runtime ends.
///
/// Cancel safe for the caller's memory: cancelling the awaitable aborts
/// that task, and the awaitable ends (cancelled) only once the task has
/// stopped, so `fut` has been dropped, with every borrow of a caller's
/// buffer in it (`Target`, `Input`), before CancelledError reaches the
/// caller. What a dropped operation leaves behind is the operation's own
/// concern: a put aborts itself (`Client::put`), a file write poisons its
/// file ([`spawn_write`]).
fn spawn<'py, T>(
    py: Python<'py>,
    fut: impl Future<Output = Out<T>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    spawn_stoppable(py, fut, None)
}

/// [`spawn`] for a write to `file`: cancelling it poisons the file
/// ([`FileCore::poison`]), whether the write had started, was under way
/// or had just finished, so a write that raised CancelledError always
/// left the file poisoned.
fn spawn_write<'py>(
    py: Python<'py>,
    file: Arc<FileCore>,
    fut: impl Future<Output = Out<Value>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>> {
    spawn_stoppable(py, fut, Some(file))
}

fn spawn_stoppable<'py, T>(
    py: Python<'py>,
    fut: impl Future<Output = Out<T>> + Send + 'static,
    poisons: Option<Arc<FileCore>>,
) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let rt = runtime()?;
    let (class, get_running_loop) = NATIVE_FUTURE.get_or_try_init(py, || {
        Ok::<_, PyErr>((
            py.import("nodekernel._future")?
                .getattr("NativeFuture")?
                .unbind(),
            py.import("asyncio")?.getattr("get_running_loop")?.unbind(),
        ))
    })?;
    let event_loop = get_running_loop.bind(py).call0()?;
    let task = rt.spawn(fut);
    let abort = task.abort_handle();
    let py_fut = class
        .bind(py)
        .call1((
            &event_loop,
            Stop {
                task: abort.clone(),
                poisons,
            },
        ))
        .inspect_err(|_| abort.abort())?;
    let (event_loop, target) = (event_loop.unbind(), py_fut.clone().unbind());
    rt.spawn(async move {
        let ended = task.await;
        // The GIL is taken off the runtime's workers, which must not block.
        tokio::task::spawn_blocking(move || {
            Python::attach(|py| resolve(py, &event_loop, &target, ended))
        });
    });
    Ok(py_fut)
}

/// Stops the task of a [`spawn`]ed call (`NativeFuture.cancel` calls it),
/// poisoning the file a cancelled write was for.
#[pyclass(module = "nodekernel._native", frozen)]
struct Stop {
    task: tokio::task::AbortHandle,
    poisons: Option<Arc<FileCore>>,
}

#[pymethods]
impl Stop {
    fn __call__(&self) {
        self.task.abort();
        if let Some(file) = &self.poisons {
            file.poison();
        }
    }
}

/// Hands the end of a [`spawn`]ed task to its future, on the loop's thread.
fn resolve<T>(
    py: Python<'_>,
    event_loop: &Py<PyAny>,
    fut: &Py<PyAny>,
    ended: std::result::Result<Out<T>, tokio::task::JoinError>,
) where
    T: for<'a> IntoPyObject<'a>,
{
    let (ok, value) = match ended {
        Ok(Ok(v)) => match v.into_py_any(py) {
            Ok(v) => (true, v),
            Err(e) => (false, e.into_value(py).into_any()),
        },
        Ok(Err(f)) => (false, f.into_pyerr(py).into_value(py).into_any()),
        // Stopped: the future was cancelled and ends so.
        Err(e) if e.is_cancelled() => (true, py.None()),
        Err(e) => (false, panicked(e).into_value(py).into_any()),
    };
    let delivered = fut
        .bind(py)
        .getattr("_nk_resolve")
        .and_then(|r| event_loop.call_method1(py, "call_soon_threadsafe", (r, ok, value)));
    // Fails only if the loop is closed: nobody awaits the result then.
    drop(delivered);
}

// ---------------------------------------------------------------------------
// Buffers

/// A Python-owned memory range: a new `bytes` being filled, or a caller's
/// writable buffer held through a ctypes view (which pins it: a bytearray
/// cannot be resized while exported).
struct Target {
    _keep: Py<PyAny>,
    addr: usize,
    len: usize,
}

impl Target {
    /// # Safety
    /// Only one task writes through a target at a time, and `_keep` holds
    /// the memory for as long as the target lives.
    unsafe fn slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len)
    }
}

/// A `bytes` of `len` bytes, uninitialised, to be filled before anyone else
/// sees it.
fn new_bytes(py: Python<'_>, len: u64) -> PyResult<Target> {
    let len = isize::try_from(len)
        .map_err(|_| PyValueError::new_err(format!("{len} bytes do not fit in memory")))?;
    // SAFETY: a NULL source makes CPython allocate without copying; the
    // object is not shared until the caller returns it.
    unsafe {
        let obj = pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), len);
        let obj = Bound::from_owned_ptr_or_err(py, obj)?;
        let addr = pyo3::ffi::PyBytes_AsString(obj.as_ptr()) as usize;
        Ok(Target {
            _keep: obj.unbind(),
            addr,
            len: len as usize,
        })
    }
}

impl Target {
    /// The `bytes` a [`new_bytes`] target fills.
    fn into_bytes(self, py: Python<'_>) -> PyResult<Bound<'_, PyBytes>> {
        Ok(self._keep.into_bound(py).cast_into::<PyBytes>()?)
    }
}

static CTYPES: PyOnceLock<(Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();

/// A writable, C-contiguous buffer of any element type (bytearray,
/// memoryview, NumPy array, mmap), written in place. (The limited C API
/// of CPython 3.9 has no buffer protocol; ctypes' `from_buffer` takes the
/// export and gives the address.)
fn writable_target(obj: &Bound<'_, PyAny>) -> PyResult<Target> {
    let py = obj.py();
    let (c_char, addressof) = &CTYPES.get_or_try_init(py, || {
        let ctypes = py.import("ctypes")?;
        Ok::<_, PyErr>((
            ctypes.getattr("c_char")?.unbind(),
            ctypes.getattr("addressof")?.unbind(),
        ))
    })?;
    let builtins = py.import("builtins")?;
    let view = builtins.getattr("memoryview")?.call1((obj,)).map_err(|_| {
        PyTypeError::new_err(format!(
            "expected a writable buffer (bytearray, memoryview, NumPy array, mmap), not {}",
            type_name(obj)
        ))
    })?;
    if view.getattr("readonly")?.extract::<bool>()? {
        return Err(PyTypeError::new_err(format!(
            "the buffer ({}) is read-only",
            type_name(obj)
        )));
    }
    if !view.getattr("c_contiguous")?.extract::<bool>()? {
        return Err(PyValueError::new_err(
            "the buffer is not C-contiguous; pass a contiguous array or memoryview",
        ));
    }
    let len: usize = view.getattr("nbytes")?.extract()?;
    view.call_method0("release")?;
    if len == 0 {
        return Ok(Target {
            _keep: obj.clone().unbind(),
            addr: 0,
            len: 0,
        });
    }
    let array = c_char
        .bind(py)
        .call_method1("__mul__", (len,))?
        .call_method1("from_buffer", (obj,))?;
    let addr: usize = addressof.bind(py).call1((&array,))?.extract()?;
    Ok(Target {
        _keep: array.unbind(),
        addr,
        len,
    })
}

/// Bytes to store, borrowed for the call where possible: a `bytes`
/// object (immutable) or a writable C-contiguous buffer (bytearray,
/// `BytesIO.getbuffer()`, NumPy, pinned through ctypes like
/// [`writable_target`]) is used in place; any other bytes-like object
/// (a read-only memoryview, ...) is copied once.
struct Input {
    _keep: Py<PyAny>,
    addr: usize,
    len: usize,
}

impl Input {
    fn new(obj: &Bound<'_, PyAny>) -> PyResult<Input> {
        if let Ok(b) = obj.cast::<PyBytes>() {
            let data = b.as_bytes();
            return Ok(Input {
                addr: data.as_ptr() as usize,
                len: data.len(),
                _keep: b.clone().into_any().unbind(),
            });
        }
        let not_bytes = || {
            PyTypeError::new_err(format!(
                "expected a bytes-like object (bytes, bytearray, memoryview, NumPy array), not {}",
                type_name(obj)
            ))
        };
        let py = obj.py();
        let view = py
            .import("builtins")?
            .getattr("memoryview")?
            .call1((obj,))
            .map_err(|_| not_bytes())?;
        let borrowable = !view.getattr("readonly")?.extract::<bool>()?
            && view.getattr("c_contiguous")?.extract::<bool>()?;
        if borrowable {
            view.call_method0("release")?;
            let t = writable_target(obj)?;
            return Ok(Input {
                _keep: t._keep,
                addr: t.addr,
                len: t.len,
            });
        }
        let b = view.call_method0("tobytes")?;
        view.call_method0("release")?;
        Input::new(&b)
    }

    fn data(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `_keep` holds the object (and its export) for the call.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

// ---------------------------------------------------------------------------
// Node types and results

fn type_name_of(t: NodeType) -> &'static str {
    match t {
        NodeType::Directory => "dir",
        NodeType::File => "file",
        NodeType::Table => "table",
        NodeType::KeyValue => "kv",
        NodeType::Bag => "bag",
    }
}

fn parse_type(s: &str, allowed: &[NodeType]) -> PyResult<NodeType> {
    let t = match s {
        "dir" | "directory" => Some(NodeType::Directory),
        "file" => Some(NodeType::File),
        "table" => Some(NodeType::Table),
        "kv" | "keyvalue" => Some(NodeType::KeyValue),
        "bag" => Some(NodeType::Bag),
        _ => None,
    };
    match t {
        Some(t) if allowed.contains(&t) => Ok(t),
        _ => {
            let names: Vec<&str> = allowed.iter().map(|t| type_name_of(*t)).collect();
            Err(PyValueError::new_err(format!(
                "type must be one of {names:?}, not {s:?}"
            )))
        }
    }
}

/// A node's attributes, returned as a dict.
struct Stat {
    name: String,
    info: NodeInfo,
}

impl<'py> IntoPyObject<'py> for Stat {
    type Target = PyDict;
    type Output = Bound<'py, PyDict>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("name", self.name)?;
        d.set_item("type", type_name_of(self.info.ty))?;
        d.set_item("size", self.info.size)?;
        d.set_item("id", self.info.id)?;
        d.set_item("block_size", self.info.block_size)?;
        d.set_item("enumerable", self.info.enumerable)?;
        d.set_item("encrypted", self.info.encrypted)?;
        d.set_item("mode", self.info.mode)?;
        // Seconds since the Unix epoch, as `os.stat` gives them.
        d.set_item("mtime", self.info.mtime as f64 / 1e9)?;
        Ok(d)
    }
}

struct Status(nk::ClusterStatus);

impl<'py> IntoPyObject<'py> for Status {
    type Target = PyDict;
    type Output = Bound<'py, PyDict>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.0;
        let d = PyDict::new(py);
        d.set_item("ready", s.is_ready() && s.unreachable.is_empty())?;
        d.set_item("block_size", s.block_size)?;
        d.set_item("nodes", s.nodes)?;
        d.set_item("puts_in_progress", s.puts_in_progress)?;
        d.set_item("reclaiming", s.reclaiming)?;
        d.set_item("partition", s.partition)?;
        d.set_item("partitions", s.partitions)?;
        d.set_item("expected_servers", s.expected_servers)?;
        let servers = PyList::empty(py);
        for v in s.servers {
            let e = PyDict::new(py);
            e.set_item("id", v.id)?;
            e.set_item("addr", v.addr)?;
            e.set_item("class", v.class)?;
            e.set_item("class_name", v.class_name)?;
            e.set_item("medium", v.medium)?;
            e.set_item("location", v.location)?;
            e.set_item(
                "capacity_bytes",
                v.capacity_blocks * u64::from(v.block_size),
            )?;
            e.set_item("used_bytes", v.used_blocks * u64::from(v.block_size))?;
            e.set_item("alive", v.alive)?;
            e.set_item("draining", v.draining)?;
            servers.append(e)?;
        }
        d.set_item("servers", servers)?;
        // Metadata partitions that did not answer (the totals lack them).
        let unreachable = PyList::empty(py);
        for p in s.unreachable {
            let e = PyDict::new(py);
            e.set_item("partition", p.partition)?;
            e.set_item("addr", p.addr)?;
            e.set_item("error", p.error)?;
            unreachable.append(e)?;
        }
        d.set_item("unreachable", unreachable)?;
        let logs = PyList::empty(py);
        for l in s.logs {
            let e = PyDict::new(py);
            e.set_item("partition", l.partition)?;
            e.set_item("fsync", l.fsync)?;
            e.set_item("records", l.records)?;
            e.set_item("checkpoint", l.checkpoint)?;
            e.set_item("log_bytes", l.log_bytes)?;
            logs.append(e)?;
        }
        d.set_item("logs", logs)?;
        // Blocks tier migration moved out of each class (docs/tiering.md).
        let moves = PyList::empty(py);
        for m in s.moves {
            let e = PyDict::new(py);
            e.set_item("class", m.class)?;
            e.set_item("demoted", m.demoted)?;
            e.set_item("promoted", m.promoted)?;
            moves.append(e)?;
        }
        d.set_item("moves", moves)?;
        Ok(d)
    }
}

/// A value or listing: plain data, or Python objects made when finished.
enum Value {
    None,
    Bool(bool),
    Int(u64),
    Names(Vec<String>),
    Stats(Vec<Stat>),
    Stat(Stat),
    Status(Status),
    Bytes(Target),
    File(Arc<FileCore>, bool),
}

impl<'py> IntoPyObject<'py> for Value {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            Value::None => py.None().into_bound(py),
            Value::Bool(b) => pyo3::types::PyBool::new(py, b).to_owned().into_any(),
            Value::Int(n) => n.into_pyobject(py)?.into_any(),
            Value::Names(v) => v.into_pyobject(py)?.into_any(),
            Value::Stats(v) => v.into_pyobject(py)?.into_any(),
            Value::Stat(s) => s.into_pyobject(py)?.into_any(),
            Value::Status(s) => s.into_pyobject(py)?.into_any(),
            Value::Bytes(t) => t.into_bytes(py)?.into_any(),
            Value::File(f, false) => Bound::new(py, File { f })?.into_any(),
            Value::File(f, true) => Bound::new(py, AsyncFile { f })?.into_any(),
        })
    }
}

// ---------------------------------------------------------------------------
// Client core

struct Core {
    client: nk::Client,
    pid: u32,
    closed: AtomicBool,
}

impl Core {
    fn check(&self) -> PyResult<()> {
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

fn check_path(path: &str) -> PyResult<()> {
    if path.contains('\0') {
        return Err(PyValueError::new_err("paths cannot contain NUL characters"));
    }
    Ok(())
}

async fn connect_core(meta: Option<String>, config: Option<PathBuf>) -> Out<Arc<Core>> {
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
async fn read_whole(node: &nk::Node, path: &str) -> Out<Target> {
    let len = node.info().size;
    let mut t = Python::attach(|py| new_bytes(py, len))?;
    // SAFETY: the bytes object is ours alone until returned.
    node.read_at(0, unsafe { t.slice() }).await.at(path)?;
    Ok(t)
}

/// Whether the parent of `path` is a Table.
async fn in_table(c: &nk::Client, path: &str) -> bool {
    let parent = match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    };
    matches!(c.lookup(parent).await, Ok(n) if n.info().ty == NodeType::Table)
}

fn is_data(t: NodeType) -> bool {
    matches!(t, NodeType::File | NodeType::KeyValue)
}

fn not_data(path: &str, t: NodeType) -> Failure {
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
async fn with_value<T, F, Fut>(core: &Core, path: &str, mut read: F) -> Out<T>
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

async fn stat_of(core: &Core, path: String) -> Out<Stat> {
    let node = core.client.lookup(&path).await.at(&path)?;
    Ok(Stat {
        info: node.info().clone(),
        name: path,
    })
}

fn child_path(dir: &str, name: &str) -> String {
    if dir.ends_with('/') {
        format!("{dir}{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// The client operations, shared by [`Client`] and [`AsyncClient`].
mod ops {
    use super::*;

    pub async fn mkdir(
        core: Arc<Core>,
        path: String,
        ty: NodeType,
        parents: bool,
        enumerable: bool,
    ) -> Out<Value> {
        let c = &core.client;
        if ty == NodeType::Directory && enumerable {
            c.mkdir(&path, parents).await.at(&path)?;
            return Ok(Value::None);
        }
        if parents {
            if let Some(i) = path.rfind('/') {
                if i > 0 {
                    c.mkdir(&path[..i], true).await.at(&path)?;
                }
            }
        }
        let opts = nk::CreateOptions {
            enumerable,
            ..Default::default()
        };
        c.create(&path, ty, opts).await.at(&path)?;
        Ok(Value::None)
    }

    pub async fn create(core: Arc<Core>, path: String, ty: NodeType, aio: bool) -> Out<Value> {
        let node = core
            .client
            .create(&path, ty, nk::CreateOptions::default())
            .await
            .at(&path)?;
        let f = FileCore::writer(core, path, "wb", node)?;
        Ok(Value::File(Arc::new(f), aio))
    }

    pub async fn open(core: Arc<Core>, path: String, mode: String, aio: bool) -> Out<Value> {
        let c = &core.client;
        let f = match mode.as_str() {
            "rb" | "r" => {
                let node = c.lookup(&path).await.at(&path)?;
                match node.info().ty {
                    t if is_data(t) => FileCore::reader(core.clone(), path, node),
                    NodeType::Bag => {
                        let reader = c
                            .read_bag(&path, nk::DEFAULT_BAG_READS_IN_FLIGHT)
                            .await
                            .at(&path)?;
                        FileCore::bag(core.clone(), path, reader)
                    }
                    t => return Err(not_data(&path, t).into()),
                }
            }
            "wb" | "w" => {
                let opts = nk::CreateOptions::default();
                let node = match c.create(&path, NodeType::File, opts.clone()).await {
                    // In a Table: a KeyValue (a put in steps, replacing).
                    Err(e) if e.code == ErrorCode::TypeMismatch && in_table(c, &path).await => {
                        c.create(&path, NodeType::KeyValue, opts).await.at(&path)?
                    }
                    Err(e) if e.code == ErrorCode::AlreadyExists => {
                        // Like open(..., "wb"): an existing File is replaced.
                        let old = c.lookup(&path).await.at(&path)?;
                        if !is_data(old.info().ty) {
                            return Err(not_data(&path, old.info().ty).into());
                        }
                        c.delete(&path, false).await.at(&path)?;
                        c.create(&path, NodeType::File, opts).await.at(&path)?
                    }
                    r => r.at(&path)?,
                };
                FileCore::writer(core.clone(), path, "wb", node)?
            }
            "ab" | "a" => {
                let node = match c.open_write(&path).await {
                    Err(e) if e.code == ErrorCode::NotFound => c
                        .create(&path, NodeType::File, nk::CreateOptions::default())
                        .await
                        .at(&path)?,
                    r => r.at(&path)?,
                };
                FileCore::writer(core.clone(), path, "ab", node)?
            }
            m => {
                return Err(PyValueError::new_err(format!(
                    "mode must be 'rb', 'wb' or 'ab' (binary only), not {m:?}"
                ))
                .into())
            }
        };
        Ok(Value::File(Arc::new(f), aio))
    }

    pub async fn lookup(core: Arc<Core>, path: String, aio: bool) -> Out<Value> {
        open(core, path, "rb".into(), aio).await
    }

    pub async fn stat(core: Arc<Core>, path: String) -> Out<Value> {
        Ok(Value::Stat(stat_of(&core, path).await?))
    }

    pub async fn exists(core: Arc<Core>, path: String) -> Out<Value> {
        match core.client.lookup(&path).await {
            Ok(_) => Ok(Value::Bool(true)),
            // A path through a File or KeyValue names nothing either.
            Err(e) if matches!(e.code, ErrorCode::NotFound | ErrorCode::TypeMismatch) => {
                Ok(Value::Bool(false))
            }
            Err(e) => Err(Failure {
                err: e,
                path: Some(path),
            }
            .into()),
        }
    }

    pub async fn ls(core: Arc<Core>, path: String, detail: bool) -> Out<Value> {
        let mut names = core.client.enumerate(&path).await.at(&path)?;
        names.sort();
        if !detail {
            return Ok(Value::Names(names));
        }
        // Children's attributes, a bounded number of lookups at a time.
        use futures::StreamExt;
        let stats: Vec<Out<Stat>> = futures::stream::iter(names)
            .map(|n| stat_of(&core, child_path(&path, &n)))
            .buffered(32)
            .collect()
            .await;
        let mut out = Vec::with_capacity(stats.len());
        for s in stats {
            match s {
                Ok(s) => out.push(s),
                // Removed since the listing: not a child any more.
                Err(Fail::Nk(f)) if f.err.code == ErrorCode::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(Value::Stats(out))
    }

    pub async fn delete(core: Arc<Core>, path: String, recursive: bool) -> Out<Value> {
        core.client.delete(&path, recursive).await.at(&path)?;
        Ok(Value::None)
    }

    pub async fn rename(core: Arc<Core>, src: String, dst: String) -> Out<Value> {
        core.client.rename(&src, &dst).await.at(&src)?;
        Ok(Value::None)
    }

    pub async fn status(core: Arc<Core>) -> Out<Value> {
        let s = core
            .client
            .status()
            .await
            .map_err(|err| Failure { err, path: None })?;
        Ok(Value::Status(Status(s)))
    }

    pub async fn put(core: Arc<Core>, path: String, value: Input) -> Out<Value> {
        core.client.put(&path, value.data()).await.at(&path)?;
        Ok(Value::None)
    }

    pub async fn get(core: Arc<Core>, path: String) -> Out<Value> {
        let p = path.as_str();
        let t = with_value(&core, p, |node| async move { read_whole(&node, p).await }).await?;
        Ok(Value::Bytes(t))
    }

    pub async fn get_into(core: Arc<Core>, path: String, mut target: Target) -> Out<Value> {
        let mut attempt = 1;
        loop {
            let node = core.client.lookup(&path).await.at(&path)?;
            if !is_data(node.info().ty) {
                return Err(not_data(&path, node.info().ty).into());
            }
            let len = node.info().size;
            if len > target.len as u64 {
                return Err(PyValueError::new_err(format!(
                    "{path} holds {len} bytes; the buffer has room for {}",
                    target.len
                ))
                .into());
            }
            // SAFETY: the caller's buffer is pinned by the target.
            let buf = unsafe { &mut target.slice()[..len as usize] };
            match node.read_at(0, buf).await {
                Err(e) if e.code == ErrorCode::Stale && attempt < nk::GET_ATTEMPTS => attempt += 1,
                r => {
                    r.at(&path)?;
                    return Ok(Value::Int(len));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Files

/// What a file is; `Cancelled` is a writer poisoned by a cancelled write
/// (`FileCore::write`): its abort, running in the background (`None`
/// without a runtime).
enum FileState {
    Read { node: Box<nk::Node> },
    Bag { reader: Box<nk::BagReader> },
    Write { writer: Box<nk::BufferedWriter> },
    Cancelled(Option<Background>),
    Closed,
}

/// A writer's close or abort, run in a task of its own.
type Background = tokio::task::JoinHandle<nk::Result<()>>;

/// Runs `fut` in a task of its own, so that it runs to its end even if
/// the call awaiting it is cancelled: for calls that take or give back a
/// write lease (open, create, close, abort), which must not be left
/// half done. A cancelled call's result is dropped, which gives back what
/// it took (a dropped writer is closed or aborted, see `FileCore::drop`).
async fn detached<T: Send + 'static>(fut: impl Future<Output = Out<T>> + Send + 'static) -> Out<T> {
    let task = runtime()?.spawn(fut);
    task.await.unwrap_or_else(|e| Err(panicked(e).into()))
}

/// Starts a writer's close or abort in a task of its own: it runs to its
/// end even if the call awaiting it is cancelled.
fn background(fut: impl Future<Output = nk::Result<()>> + Send + 'static) -> PyResult<Background> {
    Ok(runtime()?.spawn(fut))
}

/// Waits for the end of a [`background`] close or abort.
async fn joined(task: Background) -> nk::Result<()> {
    task.await
        .unwrap_or_else(|e| Err(nk::Error::internal(format!("{e}"))))
}

fn panicked(e: tokio::task::JoinError) -> PyErr {
    PyRuntimeError::new_err(format!("a nodekernel call panicked: {e}"))
}

struct FileCore {
    core: Arc<Core>,
    name: String,
    mode: &'static str,
    /// Readers: the size when opened; writers: bytes accepted so far.
    size: AtomicU64,
    pos: AtomicU64,
    closed: AtomicBool,
    /// A Bag's Files: (path, offset, size).
    files: Vec<(String, u64, u64)>,
    /// A KeyValue being written (a put in steps): dropping or leaving a
    /// `with` block on an exception aborts it instead of publishing.
    kv: bool,
    /// A write was cancelled: the writer is (or is about to be) aborted.
    write_cancelled: AtomicBool,
    state: tokio::sync::Mutex<FileState>,
}

impl FileCore {
    fn new(core: Arc<Core>, name: String, mode: &'static str, size: u64, st: FileState) -> Self {
        FileCore {
            core,
            name,
            mode,
            size: AtomicU64::new(size),
            pos: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            files: Vec::new(),
            kv: false,
            write_cancelled: AtomicBool::new(false),
            state: tokio::sync::Mutex::new(st),
        }
    }

    fn reader(core: Arc<Core>, name: String, node: nk::Node) -> FileCore {
        let size = node.info().size;
        FileCore::new(
            core,
            name,
            "rb",
            size,
            FileState::Read {
                node: Box::new(node),
            },
        )
    }

    fn bag(core: Arc<Core>, name: String, reader: nk::BagReader) -> FileCore {
        let size = reader.total_size();
        let files = reader
            .files()
            .iter()
            .map(|e| (child_path(&name, &e.name), e.offset, e.size))
            .collect();
        let mut f = FileCore::new(
            core,
            name,
            "rb",
            size,
            FileState::Bag {
                reader: Box::new(reader),
            },
        );
        f.files = files;
        f
    }

    fn writer(core: Arc<Core>, name: String, mode: &'static str, node: nk::Node) -> Out<FileCore> {
        let kv = node.info().ty == NodeType::KeyValue;
        let w = nk::BufferedWriter::new(node, nk::StreamOptions::default()).at(&name)?;
        let pos = w.position();
        let mut f = FileCore::new(
            core,
            name,
            mode,
            pos,
            FileState::Write {
                writer: Box::new(w),
            },
        );
        f.pos.store(pos, Ordering::Release);
        f.kv = kv;
        Ok(f)
    }

    fn check(&self) -> PyResult<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(PyValueError::new_err(format!(
                "I/O operation on closed file {}",
                self.name
            )));
        }
        self.core.check()
    }

    fn unsupported(&self, what: &str) -> Fail {
        PyErr::new::<pyo3::exceptions::PyOSError, _>(format!(
            "{} is open in mode {:?}: it does not support {what}",
            self.name, self.mode
        ))
        .into()
    }

    /// Reads up to `want` bytes (all that is left if `None`) into a new
    /// `bytes`.
    async fn read(self: Arc<Self>, want: Option<u64>) -> Out<Value> {
        let mut st = self.lock().await;
        let pos = self.pos.load(Ordering::Acquire);
        let left = self.size.load(Ordering::Acquire).saturating_sub(pos);
        let n = want.map_or(left, |w| w.min(left));
        let mut t = Python::attach(|py| new_bytes(py, n))?;
        // SAFETY: the new bytes object is ours alone.
        let got = self.read_locked(&mut st, pos, unsafe { t.slice() }).await?;
        if got < n as usize {
            // A Bag's stream ended early (a File shrank): return what came.
            let mut short = Python::attach(|py| new_bytes(py, got as u64))?;
            // SAFETY: both bytes objects are ours alone.
            unsafe { short.slice().copy_from_slice(&t.slice()[..got]) };
            return Ok(Value::Bytes(short));
        }
        Ok(Value::Bytes(t))
    }

    async fn readinto(self: Arc<Self>, mut target: Target) -> Out<Value> {
        let mut st = self.lock().await;
        let pos = self.pos.load(Ordering::Acquire);
        let left = self.size.load(Ordering::Acquire).saturating_sub(pos);
        let n = (target.len as u64).min(left) as usize;
        // SAFETY: the caller's buffer is pinned by the target.
        let buf = unsafe { &mut target.slice()[..n] };
        let got = self.read_locked(&mut st, pos, buf).await?;
        Ok(Value::Int(got as u64))
    }

    /// Fills `buf` from `pos` (the current position) and advances it;
    /// returns the bytes read.
    async fn read_locked(&self, st: &mut FileState, pos: u64, buf: &mut [u8]) -> Out<usize> {
        let got = match st {
            FileState::Read { .. } | FileState::Bag { .. } if buf.is_empty() => 0,
            FileState::Read { node } => {
                node.read_at(pos, buf).await.at(&self.name)?;
                buf.len()
            }
            FileState::Bag { reader } => {
                let mut got = 0;
                while got < buf.len() {
                    let n = reader.read(&mut buf[got..]).await.at(&self.name)?;
                    if n == 0 {
                        break;
                    }
                    got += n;
                    // The stream has moved on: a read cancelled later
                    // leaves the position where the stream is.
                    self.pos.store(pos + got as u64, Ordering::Release);
                }
                got
            }
            FileState::Write { .. } | FileState::Cancelled(_) => {
                return Err(self.unsupported("reading"))
            }
            FileState::Closed => return Err(self.check().unwrap_err().into()),
        };
        self.pos.store(pos + got as u64, Ordering::Release);
        Ok(got)
    }

    /// Writes all of `data`. A cancelled write poisons the file
    /// ([`spawn_write`]), however far it got (it may have taken an unknown
    /// prefix of `data`): the writer is aborted at once, in the background
    /// (nothing since the last flush is published, a put in steps leaves
    /// no value, the unpublished blocks are freed), and every later call
    /// but `close` and `abort` raises.
    async fn write(self: Arc<Self>, data: Input) -> Out<Value> {
        let mut st = self.lock().await;
        let pos = match &mut *st {
            FileState::Write { writer } => {
                writer.write_all(data.data()).await.at(&self.name)?;
                writer.position()
            }
            FileState::Cancelled(_) => return Err(self.cancelled()),
            FileState::Closed => return Err(self.check().unwrap_err().into()),
            _ => return Err(self.unsupported("writing")),
        };
        self.pos.store(pos, Ordering::Release);
        self.size.store(pos, Ordering::Release);
        Ok(Value::Int(data.len as u64))
    }

    async fn flush(self: Arc<Self>) -> Out<Value> {
        let mut st = self.lock().await;
        match &mut *st {
            // Cancel safe: a cancelled flush leaves the writer usable.
            FileState::Write { writer } => writer.sync().await.at(&self.name)?,
            FileState::Cancelled(_) => return Err(self.cancelled()),
            _ => {}
        }
        Ok(Value::None)
    }

    /// Closes the file; a writer publishes everything and releases its
    /// lease (to the end even if this call is cancelled). A writer
    /// poisoned by a cancelled write raises, once its abort has ended.
    async fn close(self: Arc<Self>) -> Out<Value> {
        let mut st = self.lock().await;
        self.closed.store(true, Ordering::Release);
        match std::mem::replace(&mut *st, FileState::Closed) {
            FileState::Write { writer } => {
                joined(background(writer.close())?).await.at(&self.name)?;
            }
            FileState::Cancelled(abort) => {
                if let Some(abort) = abort {
                    let _ = joined(abort).await;
                }
                return Err(self.cancelled());
            }
            _ => {}
        }
        Ok(Value::None)
    }

    /// Writers: gives up without publishing (see `BufferedWriter::abort`),
    /// to the end even if this call is cancelled.
    async fn abort(self: Arc<Self>) -> Out<Value> {
        let mut st = self.lock().await;
        self.closed.store(true, Ordering::Release);
        let abort = match std::mem::replace(&mut *st, FileState::Closed) {
            FileState::Write { writer } => background(writer.abort())?,
            FileState::Cancelled(Some(abort)) => abort,
            _ => return Ok(Value::None),
        };
        joined(abort).await.at(&self.name)?;
        Ok(Value::None)
    }

    /// The state, locked, with a cancelled write's poisoning applied.
    async fn lock(&self) -> tokio::sync::MutexGuard<'_, FileState> {
        let mut st = self.state.lock().await;
        self.settle(&mut st);
        st
    }

    /// A write to this file was cancelled: poisons it, at once if no call
    /// holds the state, else as soon as that call lets go of it.
    fn poison(self: &Arc<Self>) {
        self.write_cancelled.store(true, Ordering::Release);
        match self.state.try_lock() {
            Ok(mut st) => self.settle(&mut st),
            Err(_) => {
                if let Ok(rt) = runtime() {
                    let file = self.clone();
                    rt.spawn(async move { drop(file.lock().await) });
                }
            }
        }
    }

    /// Aborts the writer, in the background, if a write was cancelled.
    fn settle(&self, st: &mut FileState) {
        if !self.write_cancelled.load(Ordering::Acquire) {
            return;
        }
        match std::mem::replace(st, FileState::Closed) {
            FileState::Write { writer } => {
                // Without a runtime the writer is dropped: its lease lapses.
                *st = FileState::Cancelled(background(writer.abort()).ok());
            }
            other => *st = other,
        }
    }

    /// The error of every call on a writer poisoned by a cancelled write.
    fn cancelled(&self) -> Fail {
        let name = &self.name;
        let msg = format!(
            "{name}: a write was cancelled, so the writer was aborted: nothing written \
             since the last flush is published (a KeyValue written in steps is not \
             stored); open it again to write"
        );
        pyo3::exceptions::PyOSError::new_err((libc::ECANCELED, msg)).into()
    }

    /// What leaving a `with` block does: a put in steps that failed is
    /// aborted; everything else is closed (a File keeps what was written,
    /// as Python's own files do).
    async fn exit(self: Arc<Self>, failed: bool) -> Out<Value> {
        let poisoned = matches!(&*self.lock().await, FileState::Cancelled(_));
        if failed && (self.kv || poisoned) {
            self.abort().await
        } else {
            self.close().await
        }
    }

    fn seek(&self, offset: i64, whence: i32) -> PyResult<u64> {
        self.check()?;
        if self.mode != "rb" || !self.files.is_empty() {
            return Err(pyo3::exceptions::PyOSError::new_err(format!(
                "{} is not seekable (only Files and KeyValues open for reading are)",
                self.name
            )));
        }
        let base = match whence {
            0 => 0i128,
            1 => self.pos.load(Ordering::Acquire) as i128,
            2 => self.size.load(Ordering::Acquire) as i128,
            w => {
                return Err(PyValueError::new_err(format!(
                    "whence must be 0, 1 or 2, not {w}"
                )))
            }
        };
        let to = base + offset as i128;
        if to < 0 {
            return Err(PyValueError::new_err(format!(
                "negative seek position {to}"
            )));
        }
        let to = u64::try_from(to).map_err(|_| PyValueError::new_err("seek position too large"))?;
        // Hold the state lock so the position does not change under a read.
        let _st = self.state.try_lock().map_err(|_| busy(&self.name))?;
        self.pos.store(to, Ordering::Release);
        Ok(to)
    }
}

impl Drop for FileCore {
    /// A writer dropped without `close` (garbage collected) is closed in
    /// the background, as Python closes its files, so its write lease does
    /// not block the path; a put in steps, or a writer whose write was
    /// cancelled, is aborted instead (a value is all or nothing).
    fn drop(&mut self) {
        let st = std::mem::replace(self.state.get_mut(), FileState::Closed);
        let FileState::Write { writer } = st else {
            return;
        };
        if self.core.pid != std::process::id() {
            return;
        }
        let Ok(rt) = runtime() else {
            return;
        };
        let abort = self.kv || self.write_cancelled.load(Ordering::Acquire);
        rt.spawn(async move {
            // Nobody is left to tell; the lease lapses if this fails.
            let _ = if abort {
                writer.abort().await
            } else {
                writer.close().await
            };
        });
    }
}

fn busy(name: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "another operation on {name} is in progress; a file serves one call at a time"
    ))
}

fn want(size: Option<i64>) -> Option<u64> {
    match size {
        Some(n) if n >= 0 => Some(n as u64),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// Python classes

/// Client methods, generated for the sync and the asyncio class: `$run`
/// is `block` or `spawn`, `$aio` says which file class to hand out.
macro_rules! client_methods {
    ($ty:ident, $run:ident, $ret:ty, $aio:expr, { $($extra:tt)* }) => {
        #[pymethods]
        impl $ty {
            $($extra)*

            #[pyo3(signature = (path, r#type = "dir", parents = false, enumerable = true))]
            fn mkdir<'py>(
                &self,
                py: Python<'py>,
                path: &str,
                r#type: &str,
                parents: bool,
                enumerable: bool,
            ) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                let ty = parse_type(
                    r#type,
                    &[NodeType::Directory, NodeType::Table, NodeType::Bag],
                )?;
                let core = self.core.clone();
                $run(py, ops::mkdir(core, path.into(), ty, parents, enumerable))
            }

            #[pyo3(signature = (path, r#type = "file"))]
            fn create<'py>(&self, py: Python<'py>, path: &str, r#type: &str) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                let ty = parse_type(r#type, &[NodeType::File, NodeType::KeyValue])?;
                $run(py, detached(ops::create(self.core.clone(), path.into(), ty, $aio)))
            }

            fn lookup<'py>(&self, py: Python<'py>, path: &str) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                $run(py, detached(ops::lookup(self.core.clone(), path.into(), $aio)))
            }

            #[pyo3(signature = (path, mode = "rb"))]
            fn open<'py>(&self, py: Python<'py>, path: &str, mode: &str) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                $run(py, detached(ops::open(self.core.clone(), path.into(), mode.into(), $aio)))
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

            fn put<'py>(
                &self,
                py: Python<'py>,
                path: &str,
                value: &Bound<'py, PyAny>,
            ) -> PyResult<$ret> {
                self.core.check()?;
                check_path(path)?;
                let input = Input::new(value)?;
                $run(py, ops::put(self.core.clone(), path.into(), input))
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
struct Client {
    core: Arc<Core>,
}

/// An asyncio NodeKernel client: the methods of [`Client`], each returning
/// an awaitable; any number of calls may be in flight.
#[pyclass(module = "nodekernel._native", frozen)]
struct AsyncClient {
    core: Arc<Core>,
}

fn block_value(
    py: Python<'_>,
    fut: impl Future<Output = Out<Value>> + Send,
) -> PyResult<Py<PyAny>> {
    let v = block(py, fut)?;
    Ok(v.into_pyobject(py)?.unbind())
}

client_methods!(Client, block_value, Py<PyAny>, false, {
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
});
client_methods!(AsyncClient, spawn, Bound<'py, PyAny>, true, {
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
});

/// Returns an existing Python object from an awaitable.
struct SelfRef(Py<PyAny>);

impl<'py> IntoPyObject<'py> for SelfRef {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.0.into_bound(py))
    }
}

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

/// A node open for reading or writing (see `Client.open`).
#[pyclass(module = "nodekernel._native", frozen)]
struct File {
    f: Arc<FileCore>,
}

/// The asyncio twin of [`File`].
#[pyclass(module = "nodekernel._native", frozen)]
struct AsyncFile {
    f: Arc<FileCore>,
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
        spawn(py, self.f.clone().close())
    }

    fn __aenter__<'py>(slf: Py<Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, async move { Ok(SelfRef(slf.into_any())) })
    }

    fn abort<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if self.closed() {
            return spawn(py, async { Ok(Value::None) });
        }
        self.f.core.check()?;
        spawn(py, self.f.clone().abort())
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
        spawn(py, self.f.clone().exit(failed))
    }
});

// ---------------------------------------------------------------------------
// Module functions

/// Connects a synchronous client (see `nodekernel.connect`).
#[pyfunction]
#[pyo3(signature = (meta = None, config = None))]
fn connect(py: Python<'_>, meta: Option<String>, config: Option<PathBuf>) -> PyResult<Client> {
    let core = block(py, connect_core(meta, config))?;
    Ok(Client { core })
}

/// Connects an asyncio client (see `nodekernel.aio.connect`).
#[pyfunction]
#[pyo3(signature = (meta = None, config = None))]
fn connect_async(
    py: Python<'_>,
    meta: Option<String>,
    config: Option<PathBuf>,
) -> PyResult<Bound<'_, PyAny>> {
    spawn(py, async move {
        let core = connect_core(meta, config).await?;
        Ok(AsyncClient { core })
    })
}

/// The wire error codes, as (number, name), for the Python error classes.
#[pyfunction]
fn error_codes() -> Vec<(u16, &'static str)> {
    ErrorCode::ALL
        .iter()
        .map(|c| (*c as u16, c.name()))
        .collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(connect, m)?)?;
    m.add_function(wrap_pyfunction!(connect_async, m)?)?;
    m.add_function(wrap_pyfunction!(error_codes, m)?)?;
    m.add_class::<Client>()?;
    m.add_class::<AsyncClient>()?;
    m.add_class::<File>()?;
    m.add_class::<AsyncFile>()?;
    m.add("DEFAULT_META", nk::DEFAULT_META)?;
    Ok(())
}
