//! NodeKernel metadata server.
//!
//! - [`namespace`]: the node tree and its type rules;
//! - [`alloc`]: storage servers, free blocks, generations, placement;
//! - [`state`]: both plus write leases, driven request by request;
//! - [`server`]: the thin async shell (decode, lock, apply, encode).
//!
//! Invariants: the metadata server never touches block bytes; the state
//! modules do no I/O and read no clock; every request either applies fully
//! or leaves the state unchanged.

pub mod alloc;
pub mod namespace;
pub mod server;
pub mod state;

pub use server::{MetaConfig, MetaError, MetaServer};
pub use state::MetaState;
