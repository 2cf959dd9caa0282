//! NodeKernel transport.
//!
//! [`Connection`] is the client end: one socket, many requests in flight,
//! replies matched to requests by id, every call bounded by a timeout.
//! [`serve`] is the server end: an accept loop that reads frames, hands each
//! request to a [`Handler`] and writes the reply, batching replies while more
//! requests are already buffered.
//!
//! Malformed input never takes a server down: a bad payload gets a
//! `Protocol` error reply and the connection goes on; a bad header (an
//! oversized or undersized length) gets an error reply and the connection is
//! closed, because the byte stream can no longer be trusted.

mod client;
mod server;

pub use client::{Connection, ConnectionPool};
pub use server::{serve, Handler, ServerHandle};

use nodekernel_proto::Error;

/// Maps an I/O error on a connection to the shared error vocabulary.
pub(crate) fn io_error(what: &str, e: std::io::Error) -> Error {
    Error::unavailable(format!("{what}: {e}"))
}
