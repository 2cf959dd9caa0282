//! NodeKernel storage server.
//!
//! A storage server exports one region of one medium (DRAM or a file) as
//! fixed-size blocks (1 MiB by default) of one storage class. It registers
//! its blocks with the metadata servers (split into one contiguous range per
//! metadata partition), heartbeats them, and serves byte-granular reads and
//! writes of blocks over the NodeKernel transport.
//!
//! # Invariant
//!
//! **The store never interprets block bytes; it only checks generations and
//! bounds.** Every request names a block, an allocation generation and a
//! byte range. The range must lie inside one block of this server
//! (`OutOfRange` otherwise, checked without overflow). The generation decides
//! whose bytes these are (see [`blocks`]): a write with a newer generation
//! claims the block for a new owner, a write with an older one is `Stale`,
//! and a read must match the current generation exactly or it is `Stale`
//! and returns no bytes. So a client holding an outdated block location can
//! never read or overwrite another node's data.
//!
//! Malformed network input gives `Protocol` errors and never panics.
//!
//! **A data directory or block file serves at most one server at a time.**
//! Both are locked (`flock`) before anything in them is truncated or
//! written, for the life of the server, so two clusters on one machine never
//! share bytes (see [`datadir`]).
//!
//! # Co-located clients
//!
//! A DRAM server keeps its blocks and their generations in one shared memfd
//! (a regular file in its data directory when it is persistent)
//! ([`nodekernel_shm::Region`]) and, unless
//! [`StoreConfig::shared_memory`] is off, hands it to clients on the same
//! host over an abstract Unix socket whose name `SHM_INFO` returns. Those
//! clients read and write blocks with memory copies, running the same
//! generation protocol on the same shared atomics as this server's network
//! path, so every staleness rule above holds for them too (see
//! [`nodekernel_shm`] and `docs/shared-memory.md`).
//!
//! # Persistence
//!
//! By default a server starts empty every time. A persistent one
//! ([`StoreConfig::persistent`]) keeps its blocks and their generations in
//! its data directory and, when the rule of [`persist`] allows it, comes
//! back with them under the same identity *and incarnation*, so the
//! metadata server keeps every block mapped; otherwise it starts empty
//! under a new incarnation and says why ([`StorageServer::kept_blocks`]).
//!
//! # Layout
//!
//! * [`medium`]: the [`Medium`] trait with [`DramMedium`] (a shared region:
//!   a mapped memfd holding data and generations, accessed with synchronous
//!   memcpys) and the [`AsyncMedium`] interface;
//! * [`file`](mod@file): [`FileMedium`], a preallocated file accessed with io_uring
//!   and `O_DIRECT` through aligned bounce buffers, with buffered and
//!   thread-pool fallbacks (the module docs explain the design);
//! * [`blocks`]: [`BlockStore`], blocks plus generations over a medium;
//! * [`datadir`]: data directories (`LOCK`, `identity`, block file), the
//!   exclusive locks on them and on block files, modes and clean-up;
//! * [`persist`]: persistent servers: the state file, the keep-or-discard
//!   rule ([`StorageServer::kept_blocks`]), the generation file;
//! * [`StorageServer`]: its start in named steps and its stop
//!   (`server.rs`), over the set-up of its directory and medium
//!   (`prepare.rs`), the data port's request handler (`handler.rs`),
//!   registration and heartbeats (`registrar.rs`), the data path's
//!   counters (`metrics.rs`) and admin endpoint (`admin.rs`), and the
//!   shared-memory hand-over socket (`share.rs`).

mod admin;
pub mod blocks;
pub mod capacity;
mod config;
pub mod datadir;
mod error;
pub mod file;
mod handler;
pub mod medium;
mod metrics;
pub mod persist;
mod prepare;
mod registrar;
mod server;
mod share;

pub use blocks::BlockStore;
pub use config::{
    DataDirConfig, FileIoConfig, MediumKind, StoreConfig, MAX_QUEUE_DEPTH, MIN_BLOCK_SIZE,
};
pub use datadir::DirLock;
pub use error::StoreError;
pub use file::{FileMedium, IoMode};
pub use medium::{AsyncMedium, DramMedium, Medium};
pub use persist::Discarded;
pub use server::{LocalClaims, StorageServer, CLEAN_STOP_PATIENCE};

#[cfg(test)]
mod tests;
