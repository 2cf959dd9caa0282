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
//! ([`ClientHandshake`], [`ServerHandshake`]). Everything a peer can make a
//! server hold is bounded ([`limits`]).
//!
//! Malformed input never takes a server down: a bad payload gets a
//! `Protocol` error reply and the connection goes on; a bad header (an
//! oversized or undersized length) gets an error reply and the connection is
//! closed, because the byte stream can no longer be trusted.

mod client;
pub mod handshake;
pub mod limits;
mod server;
mod transport;

pub use client::{default_client_handshake, ConnOptions, Connection, ConnectionPool};
pub use handshake::{
    ClientHandshake, HandshakeFrame, HandshakeIo, PeerInfo, ServerHandshake, VersionHandshake,
};
pub use nodekernel_proto::hello::{Role, WIRE_VERSION};
pub use server::{serve, serve_unix, serve_with, Handler, ServeOptions, ServerHandle};
pub use transport::{abstract_unix_addr, bind_abstract_unix, bind_unix, UNIX_PREFIX};

/// Busy-poll budget used when a setting does not say otherwise: 50 µs,
/// or `NK_POLL_SPIN_US` from the environment (0 disables spinning). See
/// [`ConnOptions::spin`] and [`ServeOptions::spin`].
pub fn default_spin() -> std::time::Duration {
    static SPIN: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("NK_POLL_SPIN_US")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(50);
        std::time::Duration::from_micros(us)
    })
}

use nodekernel_proto::Error;

/// Reads what a socket has right now with `recv(MSG_DONTWAIT)` straight on
/// its descriptor. Unlike tokio's `try_read`, this does not depend on the
/// reactor having seen the socket become readable, so a busy-polling thread
/// picks data up the moment it arrives. `Ok(None)`: nothing to read;
/// `Ok(Some(0))`: the peer closed. Reads at most the spare capacity of
/// `buf`: the caller decides how the buffer grows.
pub(crate) fn recv_now(
    fd: std::os::fd::RawFd,
    buf: &mut bytes::BytesMut,
) -> std::io::Result<Option<usize>> {
    use bytes::BufMut;
    // Never a zero-length read (which would look like the end of stream):
    // `chunk_mut` makes room if there is none.
    let spare = buf.chunk_mut();
    debug_assert!(spare.len() > 0);
    // SAFETY: recv writes at most `spare.len()` bytes into memory we own
    // and returns how many it wrote; only those are marked initialised.
    let n = unsafe {
        libc::recv(
            fd,
            spare.as_mut_ptr().cast(),
            spare.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if n >= 0 {
        // SAFETY: `n` bytes were just written by recv.
        unsafe { buf.advance_mut(n as usize) };
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
