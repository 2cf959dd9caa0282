//! The rpc crate's integration tests, one binary (one link, one
//! compilation of the shared helpers) with a module per subject.

mod common;

mod auth;
mod cancel;
mod direct;
mod direct_requests;
mod handshake;
mod limits;
mod spin;
mod tls;
mod transport;
