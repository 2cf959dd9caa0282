//! The tokio runtime of this process and how calls run on it: with the
//! GIL released ([`block`]) or as an asyncio awaitable ([`spawn`]), see
//! the crate docs on cancellation.

use crate::errors::Out;
use nodekernel_client::sync;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::IntoPyObjectExt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use tokio::runtime::Runtime;

/// The runtime of this process. A forked child gets a new one on first use
/// (the parent's threads do not exist in the child); clients made before
/// the fork refuse to work there (see [`Core::check`]).
pub(crate) static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);
pub(crate) fn runtime() -> PyResult<&'static Runtime> {
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

/// Set once the interpreter exits (the module's `atexit` hook,
/// [`at_exit`]): from then on no runtime thread takes the GIL, since one
/// that takes it while Python finalizes brings the process down.
static EXITING: AtomicBool = AtomicBool::new(false);
/// Runtime threads inside [`attach`] (taking the GIL or holding it).
static ATTACHED: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` with the GIL on a runtime thread, or, once the interpreter is
/// exiting, not at all (None): nobody awaits the result then.
pub(crate) fn attach<R>(f: impl FnOnce(Python<'_>) -> R) -> Option<R> {
    ATTACHED.fetch_add(1, Ordering::SeqCst);
    let r = if EXITING.load(Ordering::SeqCst) {
        None
    } else {
        Some(Python::attach(f))
    };
    ATTACHED.fetch_sub(1, Ordering::SeqCst);
    r
}

/// [`attach`] for a call's own work: an error once the interpreter exits.
pub(crate) fn attach_or_fail<R>(f: impl FnOnce(Python<'_>) -> PyResult<R>) -> PyResult<R> {
    attach(f).unwrap_or_else(|| Err(PyRuntimeError::new_err("the Python interpreter is exiting")))
}

/// How long the exit hook holds the GIL released for other libraries'
/// threads (see [`at_exit`]). Measured: 1 ms already ended every crash of
/// 30 runs; ten times that covers a loaded machine.
const EXIT_GIL_RELEASE: std::time::Duration = std::time::Duration::from_millis(10);

/// The module's `atexit` hook: stops runtime threads from taking the GIL,
/// then waits (the GIL released) for those that took it or are taking it
/// to let go, before Python finalizes under them.
///
/// It also holds the GIL released for [`EXIT_GIL_RELEASE`], for threads
/// that are not ours. PyArrow's scanner (which pandas and PyArrow use to
/// read a directory through `nk://`) ends its work on its own threads after
/// the call returned, and its last step drops the filesystem object, which
/// takes the GIL. A script that ends right after such a read leaves that
/// thread waiting for the GIL; on Python before 3.14, a thread that gets it
/// while Python finalizes aborts the process ("terminate called without an
/// active exception", apache/arrow#36389). Released here, it gets the GIL
/// while Python still runs and ends normally.
#[pyfunction]
pub(crate) fn at_exit(py: Python<'_>) {
    EXITING.store(true, Ordering::SeqCst);
    py.detach(|| {
        std::thread::sleep(EXIT_GIL_RELEASE);
        while ATTACHED.load(Ordering::SeqCst) > 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    });
}

/// Runs `fut` to completion with the GIL released.
pub(crate) fn block<T: Send>(
    py: Python<'_>,
    fut: impl Future<Output = Out<T>> + Send,
) -> PyResult<T> {
    let rt = runtime()?;
    py.detach(|| rt.block_on(fut)).map_err(|f| f.into_pyerr(py))
}

/// Runs `fut` as a task on the runtime's workers and waits for it with
/// the GIL released: for calls that make many exchanges at once (the
/// batched calls), whose replies are then handled on the worker that reads
/// them instead of waking the caller's thread for each ([`block`] polls on
/// the caller's thread). Measured on a loaded 2-vCPU machine, 50,000 puts of
/// 100 B with `put_many(in_flight=64)`: 30–44k puts/s against 17–32k.
pub(crate) fn block_on_workers<T: Send + 'static>(
    py: Python<'_>,
    fut: impl Future<Output = Out<T>> + Send + 'static,
) -> PyResult<T> {
    let rt = runtime()?;
    match py.detach(|| rt.block_on(rt.spawn(fut))) {
        Ok(r) => r.map_err(|f| f.into_pyerr(py)),
        Err(e) => Err(panicked(e)),
    }
}

pub(crate) static NATIVE_FUTURE: PyOnceLock<(Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();

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
/// file (`file::spawn_write`).
pub(crate) fn spawn<'py, T>(
    py: Python<'py>,
    fut: impl Future<Output = Out<T>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    spawn_with(py, fut, true, None)
}

/// [`spawn`] for a call that takes or gives back a write lease (open,
/// create, close, abort), which must not be left half done: cancelling the
/// awaitable does not stop its task. The awaitable ends, cancelled, once
/// the task has ended, and its result is dropped (a dropped writer is
/// closed, a put in steps aborted: `FileCore::drop`). So a call made after
/// the CancelledError never races the cancelled one: a cancelled
/// `open(path, "wb")` cannot replace the File again after a later open did.
pub(crate) fn spawn_to_end<'py, T>(
    py: Python<'py>,
    fut: impl Future<Output = Out<T>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    spawn_with(py, fut, false, None)
}

/// [`spawn`], with a choice: cancelling aborts the task (`abortable`) and
/// then does what `on_stop` says, or lets it run to its end.
pub(crate) fn spawn_with<'py, T>(
    py: Python<'py>,
    fut: impl Future<Output = Out<T>> + Send + 'static,
    abortable: bool,
    on_stop: Option<OnStop>,
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
                task: abortable.then(|| abort.clone()),
                on_stop,
            },
        ))
        .inspect_err(|_| {
            if abortable {
                abort.abort()
            }
        })?;
    let (event_loop, target) = (event_loop.unbind(), py_fut.clone().unbind());
    rt.spawn(async move {
        let ended = task.await;
        // The GIL is taken off the runtime's workers, which must not block.
        tokio::task::spawn_blocking(move || attach(|py| resolve(py, &event_loop, &target, ended)));
    });
    Ok(py_fut)
}

/// What stopping a [`spawn_with`] call also does: poisoning the
/// file a cancelled write was for (`file::spawn_write`).
pub(crate) type OnStop = Box<dyn Fn() + Send + Sync>;

/// Stops the task of a [`spawn`]ed call (`NativeFuture.cancel` calls it),
/// and does what its [`OnStop`] says.
#[pyclass(module = "nodekernel._native", frozen)]
pub(crate) struct Stop {
    /// None for a call that runs to its end ([`spawn_to_end`]).
    task: Option<tokio::task::AbortHandle>,
    on_stop: Option<OnStop>,
}

#[pymethods]
impl Stop {
    fn __call__(&self) {
        if let Some(task) = &self.task {
            task.abort();
        }
        if let Some(stop) = &self.on_stop {
            stop();
        }
    }
}

/// Hands the end of a [`spawn`]ed task to its future, on the loop's thread.
pub(crate) fn resolve<T>(
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

/// The exception for a call whose task panicked.
pub(crate) fn panicked(e: tokio::task::JoinError) -> PyErr {
    PyRuntimeError::new_err(format!("a nodekernel call panicked: {e}"))
}

/// Returns an existing Python object from an awaitable (an `__aenter__`
/// that hands back `self`).
pub(crate) struct SelfRef(pub(crate) Py<PyAny>);

impl<'py> IntoPyObject<'py> for SelfRef {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.0.into_bound(py))
    }
}
