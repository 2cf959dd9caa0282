//! Socket reads and errors shared by both ends of a connection:
//! non-blocking reads straight on a descriptor, the error an I/O failure
//! becomes, and the error frame a refusal is answered with.

use crate::limits::MAX_ERROR_MESSAGE;
use bytes::BytesMut;
use nodekernel_proto::{Error, FrameHeader};

/// Reads what a socket has right now with `recv(MSG_DONTWAIT)` straight on
/// its descriptor. Unlike tokio's `try_read`, this does not depend on the
/// reactor having seen the socket become readable, so a busy-polling thread
/// picks data up the moment it arrives. `Ok(None)`: nothing to read;
/// `Ok(Some(0))`: the peer closed. Reads at most `max` bytes and at most the
/// spare capacity of `buf`: the caller decides how the buffer grows.
pub(crate) fn recv_now(
    fd: std::os::fd::RawFd,
    buf: &mut BytesMut,
    max: usize,
) -> std::io::Result<Option<usize>> {
    use bytes::BufMut;
    // Never a zero-length read (which would look like the end of stream):
    // `chunk_mut` makes room if there is none.
    let spare = buf.chunk_mut();
    debug_assert!(spare.len() > 0 && max > 0);
    let len = spare.len().min(max);
    // SAFETY: `spare` is writable memory we own, of at least `len` bytes.
    let n = unsafe { recv_raw(fd, spare.as_mut_ptr(), len)? };
    if let Some(n) = n {
        // SAFETY: `n` bytes were just written by recv.
        unsafe { buf.advance_mut(n) };
    }
    Ok(n)
}

/// `recv(MSG_DONTWAIT)` of at most `len` bytes to `ptr`.
///
/// # Safety
/// `ptr` must be valid for writes of `len` bytes.
pub(crate) unsafe fn recv_raw(
    fd: std::os::fd::RawFd,
    ptr: *mut u8,
    len: usize,
) -> std::io::Result<Option<usize>> {
    // SAFETY: the caller guarantees `ptr` is writable for `len` bytes; recv
    // writes at most that many and returns how many it wrote.
    let n = unsafe { libc::recv(fd, ptr.cast(), len, libc::MSG_DONTWAIT) };
    if n >= 0 {
        return Ok(Some(n as usize));
    }
    let e = std::io::Error::last_os_error();
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(None),
        _ => Err(e),
    }
}

/// Maps an I/O error on a connection to the shared error vocabulary.
pub(crate) fn io_error(what: &str, e: std::io::Error) -> Error {
    Error::unavailable(format!("{what}: {e}"))
}

/// Appends an error reply to request `id` (status = the error's code,
/// payload = its message, cut at [`MAX_ERROR_MESSAGE`] bytes).
pub(crate) fn push_error(out: &mut BytesMut, id: u64, e: &Error) {
    let msg = e.message.as_bytes();
    let msg = &msg[..msg.len().min(MAX_ERROR_MESSAGE)];
    FrameHeader::put(out, id, e.code as u16, msg.len());
    out.extend_from_slice(msg);
}
