//! Python memory that calls read into or write from, in place.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyBytes;

/// A Python-owned memory range: a new `bytes` being filled, or a caller's
/// writable buffer held through a ctypes view (which pins it: a bytearray
/// cannot be resized while exported).
pub(crate) struct Target {
    _keep: Py<PyAny>,
    addr: usize,
    pub(crate) len: usize,
}

impl Target {
    /// # Safety
    /// Only one task writes through a target at a time, and `_keep` holds
    /// the memory for as long as the target lives.
    pub(crate) unsafe fn slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len)
    }
}

/// A `bytes` of `len` bytes, uninitialised, to be filled before anyone else
/// sees it.
pub(crate) fn new_bytes(py: Python<'_>, len: u64) -> PyResult<Target> {
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
    pub(crate) fn into_bytes(self, py: Python<'_>) -> PyResult<Bound<'_, PyBytes>> {
        Ok(self._keep.into_bound(py).cast_into::<PyBytes>()?)
    }
}

pub(crate) static CTYPES: PyOnceLock<(Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();

/// A writable, C-contiguous buffer of any element type (bytearray,
/// memoryview, NumPy array, mmap), written in place. (The limited C API
/// of CPython 3.9 has no buffer protocol; ctypes' `from_buffer` takes the
/// export and gives the address.)
pub(crate) fn writable_target(obj: &Bound<'_, PyAny>) -> PyResult<Target> {
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
pub(crate) struct Input {
    _keep: Py<PyAny>,
    addr: usize,
    pub(crate) len: usize,
}

impl Input {
    pub(crate) fn new(obj: &Bound<'_, PyAny>) -> PyResult<Input> {
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

    pub(crate) fn data(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `_keep` holds the object (and its export) for the call.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }
}

impl AsRef<[u8]> for Input {
    fn as_ref(&self) -> &[u8] {
        self.data()
    }
}

pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}
