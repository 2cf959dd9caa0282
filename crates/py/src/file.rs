//! Files: a node open for reading (a File, KeyValue or Bag) or writing,
//! shared by the `File` and `AsyncFile` classes.

use crate::buffers::new_bytes;
use crate::buffers::Input;
use crate::buffers::Target;
use crate::client::child_path;
use crate::client::Core;
use crate::errors::At;
use crate::errors::Fail;
use crate::errors::Out;
use crate::runtime::attach_or_fail;
use crate::runtime::runtime;
use crate::runtime::spawn_with;
use crate::values::Value;
use nk::NodeType;
use nodekernel_client as nk;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// What a file is; `Cancelled` is a writer poisoned by a cancelled write
/// (`FileCore::write`): its abort, running in the background (`None`
/// without a runtime).
pub(crate) enum FileState {
    Read { node: Box<nk::Node> },
    Bag { reader: Box<nk::BagReader> },
    Write { writer: Box<nk::BufferedWriter> },
    Cancelled(Option<Background>),
    Closed,
}

/// A writer's close or abort, run in a task of its own.
pub(crate) type Background = tokio::task::JoinHandle<nk::Result<()>>;

/// Starts a writer's close or abort in a task of its own: it runs to its
/// end even if the call awaiting it is cancelled.
pub(crate) fn background(
    fut: impl Future<Output = nk::Result<()>> + Send + 'static,
) -> PyResult<Background> {
    Ok(runtime()?.spawn(fut))
}

/// Waits for the end of a [`background`] close or abort.
pub(crate) async fn joined(task: Background) -> nk::Result<()> {
    task.await
        .unwrap_or_else(|e| Err(nk::Error::internal(format!("{e}"))))
}

pub(crate) struct FileCore {
    pub(crate) core: Arc<Core>,
    pub(crate) name: String,
    pub(crate) mode: &'static str,
    /// Readers: the size when opened; writers: bytes accepted so far.
    pub(crate) size: AtomicU64,
    pub(crate) pos: AtomicU64,
    pub(crate) closed: AtomicBool,
    /// A Bag's Files: (path, offset, size).
    pub(crate) files: Vec<(String, u64, u64)>,
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

    pub(crate) fn reader(core: Arc<Core>, name: String, node: nk::Node) -> FileCore {
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

    pub(crate) fn bag(core: Arc<Core>, name: String, reader: nk::BagReader) -> FileCore {
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

    pub(crate) fn writer(
        core: Arc<Core>,
        name: String,
        mode: &'static str,
        node: nk::Node,
    ) -> Out<FileCore> {
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

    pub(crate) fn check(&self) -> PyResult<()> {
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
    pub(crate) async fn read(self: Arc<Self>, want: Option<u64>) -> Out<Value> {
        let mut st = self.lock().await;
        let pos = self.pos.load(Ordering::Acquire);
        let left = self.size.load(Ordering::Acquire).saturating_sub(pos);
        let n = want.map_or(left, |w| w.min(left));
        let mut t = attach_or_fail(|py| new_bytes(py, n))?;
        // SAFETY: the new bytes object is ours alone.
        let got = self.read_locked(&mut st, pos, unsafe { t.slice() }).await?;
        if got < n as usize {
            // A Bag's stream ended early (a File shrank): return what came.
            let mut short = attach_or_fail(|py| new_bytes(py, got as u64))?;
            // SAFETY: both bytes objects are ours alone.
            unsafe { short.slice().copy_from_slice(&t.slice()[..got]) };
            return Ok(Value::Bytes(short));
        }
        Ok(Value::Bytes(t))
    }

    pub(crate) async fn readinto(self: Arc<Self>, mut target: Target) -> Out<Value> {
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
    pub(crate) async fn write(self: Arc<Self>, data: Input) -> Out<Value> {
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

    pub(crate) async fn flush(self: Arc<Self>) -> Out<Value> {
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
    pub(crate) async fn close(self: Arc<Self>) -> Out<Value> {
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
    pub(crate) async fn abort(self: Arc<Self>) -> Out<Value> {
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
    pub(crate) async fn exit(self: Arc<Self>, failed: bool) -> Out<Value> {
        let poisoned = matches!(&*self.lock().await, FileState::Cancelled(_));
        if failed && (self.kv || poisoned) {
            self.abort().await
        } else {
            self.close().await
        }
    }

    pub(crate) fn seek(&self, offset: i64, whence: i32) -> PyResult<u64> {
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

pub(crate) fn busy(name: &str) -> PyErr {
    PyRuntimeError::new_err(format!(
        "another operation on {name} is in progress; a file serves one call at a time"
    ))
}

pub(crate) fn want(size: Option<i64>) -> Option<u64> {
    match size {
        Some(n) if n >= 0 => Some(n as u64),
        _ => None,
    }
}

/// [`spawn`] for a write to `file`: cancelling it poisons the file
/// ([`FileCore::poison`]), whether the write had started, was under way
/// or had just finished, so a write that raised CancelledError always
/// left the file poisoned.
pub(crate) fn spawn_write<'py>(
    py: Python<'py>,
    file: Arc<FileCore>,
    fut: impl Future<Output = Out<Value>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>> {
    spawn_with(py, fut, true, Some(Box::new(move || file.poison())))
}

/// A node open for reading or writing (see `Client.open`).
#[pyclass(module = "nodekernel._native", frozen)]
pub(crate) struct File {
    pub(crate) f: Arc<FileCore>,
}

/// The asyncio twin of [`File`].
#[pyclass(module = "nodekernel._native", frozen)]
pub(crate) struct AsyncFile {
    pub(crate) f: Arc<FileCore>,
}

/// A file that a call opened, handed to Python as a [`File`] or, for
/// the asyncio client (`aio`), an [`AsyncFile`].
pub(crate) struct Opened {
    pub(crate) f: Arc<FileCore>,
    pub(crate) aio: bool,
}

impl<'py> IntoPyObject<'py> for Opened {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let f = self.f;
        Ok(if self.aio {
            Bound::new(py, AsyncFile { f })?.into_any()
        } else {
            Bound::new(py, File { f })?.into_any()
        })
    }
}
