//! `nodekernel._native`: the Python binding of the NodeKernel client.
//!
//! One implementation serves both APIs: every operation is an `async` body
//! over the Rust client ([`nodekernel_client`], the only protocol
//! implementation). The synchronous classes (`Client`, `File`) run it
//! with the GIL released on the module's tokio runtime; the asyncio classes
//! (`AsyncClient`, `AsyncFile`) run it as a task there and hand the loop
//! a future for it (`nodekernel._future.NativeFuture`, see `runtime::spawn`), so
//! many calls can be in flight from one loop.
//!
//! Cancellation: a cancelled asyncio call stops its task, and the
//! CancelledError reaches the caller only once the task has stopped, so a
//! cancelled call never touches the caller's buffer afterwards. The
//! client's calls are cancel safe, so the connection stays usable, and a
//! cancelled put is aborted (`Client::put`). What takes or gives back a
//! write lease (open, create, close, abort) runs to its end regardless,
//! and its CancelledError comes only then (`runtime::spawn_to_end`), so a
//! later call never races it; a cancelled file write poisons its file and aborts
//! the writer (`file::spawn_write`): no cancellation leaves space held until
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
//!
//! Layout, each file using only those above it: `errors.rs` (failures as
//! exceptions), `buffers.rs` (Python memory read into or written from in
//! place), `runtime.rs` (the runtime; calls with the GIL released or as
//! awaitables), `client.rs` (the client a Python client and its files
//! share), `values.rs` (what calls return), `file.rs` (open files),
//! `ops.rs` (the client operations), `classes.rs` (the Python classes), and
//! here the module functions.

mod buffers;
mod classes;
mod client;
mod errors;
mod file;
mod ops;
mod runtime;
mod session;
mod values;

use crate::classes::AsyncClient;
use crate::classes::Client;
use crate::client::connect_core;
use crate::file::AsyncFile;
use crate::file::File;
use crate::runtime::block;
use crate::runtime::spawn;
use nk::ErrorCode;
use nodekernel_client as nk;
use pyo3::prelude::*;
use std::path::PathBuf;

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
    m.add_class::<session::Session>()?;
    m.add("DEFAULT_META", nk::DEFAULT_META)?;
    // Before Python finalizes, runtime threads stop taking the GIL.
    let hook = wrap_pyfunction!(runtime::at_exit, m)?;
    m.py().import("atexit")?.call_method1("register", (hook,))?;
    Ok(())
}
