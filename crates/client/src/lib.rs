//! NodeKernel client library.
//!
//! The client does most of the work: path operations go to the metadata
//! server that owns the path's top-level name (hash partitioning), data goes
//! straight to storage servers, several block transfers are kept in flight,
//! and block locations are fetched in batches ahead of the transfer that
//! needs them. The async API ([`Client`], [`Node`]) is the core;
//! [`blocking`] wraps it for synchronous callers.
//!
//! Errors are the shared [`Error`] type: a stable code plus a message that
//! names the path and the rule. Transport failures become `Unavailable` or
//! `Timeout`, never a hang longer than the configured timeout.
//!
//! **Co-located servers.** With [`ClientConfig::shared_memory`] (the
//! default), the client maps the memory of DRAM storage servers on the same
//! host and moves block bytes with memory copies, straight between the
//! caller's buffers and the server's memory, without a request to the
//! server. It runs the same generation protocol as the server's network
//! path (`nodekernel_shm`), so it gets the same `Stale` and `OutOfRange`
//! errors with the same messages. [`Client::is_colocated`] and
//! [`Client::data_path_stats`] tell which path was taken.
//!
//! **Streams.** [`Node::reader`] and [`Node::append`] are direct streams:
//! bytes go straight between the caller's buffer and storage, one call's
//! transfers at a time. The buffered streams [`BufferedReader`] and
//! [`BufferedWriter`] copy through a buffer cut into slices and keep several
//! slice transfers in flight ([`StreamOptions`]: by default a 4 MiB buffer
//! of 1 MiB slices, four in flight), so storage stays busy during
//! sequential access with small calls.

mod admin;
mod bag;
pub mod blocking;
mod blockio;
mod client;
mod config;
mod crypt;
mod leases;
mod listing;
mod local;
mod node;
mod open;
mod quota;
mod reserve;
mod session;
pub mod settings;
pub mod snapshot;
mod start;
mod stream;

pub use admin::drain_finished;
pub use bag::{
    BagEntry, BagReader, ByteRange, RangeError, DEFAULT_BAG_READS_IN_FLIGHT, MAX_RANGES,
};
pub use blockio::{Access, AccessHook, DataPathStats, MAX_RELOCATIONS, OPEN_ATTEMPTS};
pub use client::Client;
pub use config::{default_location, now_ns, ClientConfig, CreateOptions, Ttl};
pub use crypt::EncryptionKey;
pub use node::{Node, Reader};
pub use nodekernel_proto::quota::{
    exceeded_root, ClassUsage, Quota, UsageInfo, NO_LIMIT, RETIRED_CLASS,
};
/// Prefix of Unix-socket addresses (see [`Client::meta_route`]).
pub use nodekernel_proto::sync;
pub use nodekernel_proto::types::{DrainState, DrainStatus, PartitionDown};
pub use nodekernel_proto::{
    BlockLoc, ClassInfo, ClusterStatus, Error, ErrorCode, NodeInfo, NodeType, Result, ServerStatus,
};
pub use nodekernel_rpc::UNIX_PREFIX;
pub use open::{GET_ATTEMPTS, MAX_DELETE_MANY, MAX_GET_MANY, MAX_PUT_MANY, REPLACE_ATTEMPTS};
pub use session::{Session, DEFAULT_SESSION_LEASE};
pub use settings::{
    discover, ClientSection, SecuritySection, TenantSection, TlsSection, DEFAULT_META,
};
pub use stream::{
    BufferedReader, BufferedWriter, StreamOptions, DEFAULT_STREAM_BUFFER_SIZE,
    DEFAULT_STREAM_SLICE_SIZE, MAX_STREAM_BUFFER_SIZE,
};
