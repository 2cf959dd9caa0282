//! NodeKernel transport.
//!
//! [`Connection`] is the client end: one socket (TCP, or a Unix socket for
//! a server on the same host), many requests in flight,
//! replies matched to requests by id, every call bounded by a timeout and
//! cancel safe. [`serve`] is the server end: an accept loop that reads
//! frames, hands each request to a [`Handler`] and writes the reply,
//! batching replies while more requests are already buffered.
//!
//! Every connection starts with a handshake ([`handshake`]): by default the
//! two ends exchange HELLOs and refuse each other unless they speak the
//! same wire version; authentication plugs in at the same place
//! ([`ClientHandshake`], [`ServerHandshake`]): TLS on TCP ([`tls`]) and the
//! cluster token ([`auth`]). Everything a peer can make a
//! server hold is bounded ([`limits`]).
//!
//! Malformed input never takes a server down: a bad payload gets a
//! `Protocol` error reply and the connection goes on; a bad header (an
//! oversized or undersized length) gets an error reply and the connection is
//! closed, because the byte stream can no longer be trusted.

pub mod auth;
mod client;
pub mod handshake;
pub mod limits;
mod random;
mod server;
pub mod spin;
#[doc(hidden)]
pub mod testing;
pub mod tls;
mod transport;

pub use auth::{Security, Token};
pub use client::{default_client_handshake, ConnOptions, Connection, ConnectionPool, ReplyCopies};
pub use handshake::{
    ClientHandshake, HandshakeFrame, HandshakeIo, PeerInfo, ServerHandshake, VersionHandshake,
};
pub use nodekernel_proto::hello::{Role, WIRE_VERSION};
pub use random::random_bytes;
pub use server::{
    serve, serve_unix, serve_with, DirectSink, Handler, Reply, ServeOptions, ServerHandle,
    SharedBody, DIRECT_MIN,
};
pub use tls::{Tls, TlsFiles};
pub use transport::{abstract_unix_addr, bind_abstract_unix, bind_unix, LocalPeers, UNIX_PREFIX};

/// Busy-poll budget of an idle server connection waiting for its next
/// request, when a setting does not say otherwise: 50 µs, or
/// `NK_POLL_SPIN_US` from the environment (0 disables spinning). See
/// [`ServeOptions::spin`]; a connection spins only while its requests
/// come soon ([`spin`]).
pub fn default_spin() -> std::time::Duration {
    env_spin().unwrap_or(std::time::Duration::from_micros(50))
}

/// Busy-poll budget of a caller waiting for its reply, when a setting does
/// not say otherwise: 100 µs, or `NK_POLL_SPIN_US` from the environment.
/// See [`ConnOptions::spin`].
///
/// It is twice the server's because a reply can include the server's own
/// round trip: a replacing put's close waits while the metadata server
/// claims the old block at its storage server, about 50 µs in all on a
/// 2-core machine. A caller that stops spinning just before its reply
/// arrives pays a thread wake-up (25–40 µs there) on top; with a 50 µs
/// budget that cliff cost replacing puts a third of their latency.
pub fn default_call_spin() -> std::time::Duration {
    env_spin().unwrap_or(std::time::Duration::from_micros(100))
}

/// `NK_POLL_SPIN_US`, read once.
fn env_spin() -> Option<std::time::Duration> {
    static SPIN: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        std::env::var("NK_POLL_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .map(std::time::Duration::from_micros)
    })
}

use nodekernel_proto::Error;

/// Reads what a socket has right now with `recv(MSG_DONTWAIT)` straight on
/// its descriptor. Unlike tokio's `try_read`, this does not depend on the
/// reactor having seen the socket become readable, so a busy-polling thread
/// picks data up the moment it arrives. `Ok(None)`: nothing to read;
/// `Ok(Some(0))`: the peer closed. Reads at most `max` bytes and at most the
/// spare capacity of `buf`: the caller decides how the buffer grows.
pub(crate) fn recv_now(
    fd: std::os::fd::RawFd,
    buf: &mut bytes::BytesMut,
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

/// Like [`recv_now`], into `dst` (memory the caller may not have
/// initialised: recv only writes to it).
pub(crate) fn recv_into(
    fd: std::os::fd::RawFd,
    dst: &mut [std::mem::MaybeUninit<u8>],
) -> std::io::Result<Option<usize>> {
    debug_assert!(!dst.is_empty());
    // SAFETY: `dst` is writable memory of `dst.len()` bytes.
    unsafe { recv_raw(fd, dst.as_mut_ptr().cast(), dst.len()) }
}

/// `recv(MSG_DONTWAIT)` of at most `len` bytes to `ptr`.
///
/// # Safety
/// `ptr` must be valid for writes of `len` bytes.
unsafe fn recv_raw(
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

/// Hands the heap memory the allocator keeps free back to the system
/// (glibc's `malloc_trim`, which also releases free pages inside its
/// arenas); nothing with other C libraries. Blocking: run it off the
/// runtime's worker threads.
pub(crate) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only works on the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Maps an I/O error on a connection to the shared error vocabulary.
pub(crate) fn io_error(what: &str, e: std::io::Error) -> Error {
    Error::unavailable(format!("{what}: {e}"))
}
