//! NodeKernel metadata server.
//!
//! - [`namespace`]: the node tree and its type rules;
//! - [`alloc`]: storage servers, free blocks, generations, placement;
//! - [`slab`]: small values in pieces of shared blocks;
//! - [`lifetimes`]: when nodes expire, and containers' child TTLs;
//! - [`usage`]: containers' disk usage and quota limits;
//! - [`effect`]: the changes a decision makes, the only way state changes;
//! - [`state`]: all of it plus write leases, decided request by request;
//! - [`floor`]: the last log record known on stable storage, which a
//!   restart demands;
//! - [`server`]: the thin async shell (decode, lock, decide and apply,
//!   send block claims, encode), the ticker and the reaper;
//! - `admin`: what the admin HTTP endpoint serves (metrics, status).
//!
//! Invariants: the metadata server never touches block bytes; the state
//! modules do no I/O and read no clock; every request either applies fully
//! or leaves the state unchanged (decisions are made without changing
//! anything, then applied); applying the same effects to the same state
//! always gives the same state.

mod admin;
pub mod alloc;
pub mod checkpoint;
pub mod codec;
mod config;
pub mod effect;
pub mod floor;
mod handler;
pub mod lifetimes;
pub mod namespace;
pub mod server;
pub mod slab;
pub mod snapshot;
pub mod state;
mod tenant;
pub mod tier;
pub mod usage;

#[cfg(test)]
mod sim;

pub use effect::Effect;
pub use handler::{ClaimFuture, LocalStore};
pub use nodekernel_journal::Fsync;
pub use server::{CheckpointStats, MetaConfig, MetaError, MetaServer, Persistence};
pub use state::{Decision, MetaState, Outcome, Placement};
