//! NodeKernel wire protocol.
//!
//! This crate defines everything two NodeKernel processes agree on: the frame
//! layout, every request and reply, the stable error codes and the path rules.
//! It performs no I/O. Every decoder is bounded: it checks lengths against the
//! bytes actually present before allocating, never recurses, and reports
//! malformed input as `Protocol` errors ([`ErrorCode::Protocol`]) instead of panicking.

pub mod auth;
pub mod cap;
pub mod codec;
pub mod crypt;
pub mod error;
pub mod frame;
pub mod hello;
pub mod meta;
pub mod path;
pub mod quota;
pub mod record;
pub mod size;
pub mod store;
pub mod sync;
pub mod tenant;
pub mod types;

pub use error::{Error, ErrorCode, Result};
pub use frame::{FrameHeader, HEADER_LEN, MAX_FRAME_LEN, MAX_PAYLOAD_LEN};
pub use types::{
    BlockLoc, ClassInfo, ClassMoves, ClusterStatus, LogStatus, NodeInfo, NodeType, RecordLoc,
    ServerSpec, ServerStatus, Traffic, NO_CLASS,
};

/// Largest block size a storage server may export (and so the largest single
/// data transfer in one frame).
pub const MAX_BLOCK_SIZE: u32 = 16 << 20;
/// Default block size (1 MiB, as in the NodeKernel paper).
pub const DEFAULT_BLOCK_SIZE: u32 = 1 << 20;
