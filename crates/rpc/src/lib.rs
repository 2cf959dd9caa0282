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
mod hello;
pub mod limits;
mod random;
mod security;
mod server;
mod sock;
pub mod spin;
#[doc(hidden)]
pub mod testing;
pub mod tls;
mod tls_io;
mod transport;

pub use auth::Token;
pub use client::{
    default_client_handshake, ConnOptions, Connection, ConnectionPool, ReplyCopies,
    DIRECT_REPLY_MIN,
};
pub use handshake::{ClientHandshake, HandshakeFrame, HandshakeIo, PeerInfo, ServerHandshake};
pub use hello::VersionHandshake;
pub use nodekernel_proto::hello::{Role, WIRE_VERSION};
pub use random::random_bytes;
pub use security::Security;
pub use server::{
    serve, serve_unix, serve_with, DirectSink, Handler, Reply, ServeOptions, ServerHandle,
    SharedBody, DIRECT_MIN,
};
pub use spin::{default_call_spin, default_spin};
pub use tls::{Tls, TlsFiles};
pub use transport::{abstract_unix_addr, bind_abstract_unix, bind_unix, LocalPeers, UNIX_PREFIX};
