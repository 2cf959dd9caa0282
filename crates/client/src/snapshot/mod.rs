//! Snapshots of a subtree (or `/`) to a directory on local disk, and
//! restores of them into a running cluster (`docs/snapshots.md`).
//!
//! A snapshot is a point in time: the metadata server freezes the listing
//! of the subtree when it begins and keeps the blocks of its data nodes
//! from being reused until it ends, so nodes deleted or replaced meanwhile
//! are still read whole; writers are not blocked, and handles to replaced
//! values still get `Stale` at once. The data goes into pack files, the
//! listing and checksums into a manifest written last (so a directory
//! without a valid manifest is an incomplete snapshot, which restore
//! refuses). Restore checks the manifest whole and every checksum before
//! it creates anything, reads only regular files, and builds the tree
//! beside its target, moving it into place once whole.

use crate::blockio::Locate;
use crate::client::{unexpected, Client};
use crate::config::CreateOptions;
use futures::stream::{self, StreamExt};
use nodekernel_proto::codec::{Dec, Enc};
use nodekernel_proto::meta::{MetaReply, MetaRequest, SnapshotEntry};
use nodekernel_proto::{path, BlockLoc, Error, ErrorCode, NodeType, Result};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

mod manifest;
mod restore;
mod take;
#[cfg(test)]
mod tests;

pub use manifest::{read_manifest, Manifest, ManifestEntry};
pub use take::{Snapshot, SnapshotNode};

/// The manifest's file name; written last.
pub const MANIFEST: &str = "manifest.nks";
const MANIFEST_TMP: &str = "manifest.nks.tmp";
/// First bytes of a manifest.
pub const MANIFEST_MAGIC: [u8; 8] = *b"NKSNAPMF";
/// First bytes of a pack file.
pub const PACK_MAGIC: [u8; 8] = *b"NKSNAPPK";
/// The format this build writes and reads (manifest and packs).
pub const FORMAT_VERSION: u16 = 1;
/// Bytes before a pack's data: magic, version, reserved, pack number.
pub const PACK_HEADER_LEN: u64 = 16;
/// Largest manifest restore reads.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 30;
/// Most pack files one snapshot may have.
pub const MAX_PACKS: usize = 1 << 20;
/// Block reads (snapshot) and node writes (restore) in flight by default.
pub const DEFAULT_IN_FLIGHT: usize = 16;
/// A pack file is closed once it holds this many bytes (a node's bytes
/// never span two packs, so one may be larger).
pub const DEFAULT_PACK_BYTES: u64 = 1 << 30;
/// Bytes restore reads from a pack at a time.
const CHUNK: u64 = 4 << 20;
/// How often a snapshot being read tells the metadata server it is still
/// in use (a snapshot nobody calls for two minutes is ended there).
pub const RENEW_EVERY: std::time::Duration = std::time::Duration::from_secs(20);
/// Encoded bytes of a manifest entry without its path.
const ENTRY_MIN_LEN: usize = 1 + 1 + 1 + 4 + 8 + 4 + 8 + 4;

/// The name of pack file `i`.
pub fn pack_name(i: u32) -> String {
    format!("pack-{i:06}.nkp")
}

/// How [`Client::snapshot`] works.
#[derive(Debug, Clone)]
pub struct SnapshotOptions {
    /// Block reads in flight (at least 1).
    pub reads_in_flight: usize,
    /// Bytes after which a new pack file starts.
    pub pack_bytes: u64,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            reads_in_flight: DEFAULT_IN_FLIGHT,
            pack_bytes: DEFAULT_PACK_BYTES,
        }
    }
}

/// How [`Client::restore`] works.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// Replace an existing target (for `/`, everything in it): moved aside
    /// once the restored tree is whole, then removed. Without it an
    /// existing target is refused with `AlreadyExists`.
    pub overwrite: bool,
    /// Nodes written at once (at least 1).
    pub writes_in_flight: usize,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            overwrite: false,
            writes_in_flight: DEFAULT_IN_FLIGHT,
        }
    }
}

/// The stages a [`Progress`] is told about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Snapshot: reading the nodes' bytes into pack files.
    Reading,
    /// Restore: checking every checksum before anything is created.
    Verifying,
    /// Restore: creating the nodes.
    Writing,
}

/// Watches a snapshot or restore (the CLI draws progress bars with it).
/// Called from the task doing the work: keep it short.
pub trait Progress: Send + Sync {
    /// A phase starts, with the nodes and bytes it will go through.
    fn phase(&self, _phase: Phase, _nodes: u64, _bytes: u64) {}
    /// `nodes` more nodes and `bytes` more bytes are done.
    fn advance(&self, _nodes: u64, _bytes: u64) {}
}

impl Progress for () {}

/// The nodes a snapshot or restore handled, by kind, and their data bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct NodeCounts {
    /// Every node, containers included.
    pub nodes: u64,
    pub containers: u64,
    pub files: u64,
    pub keyvalues: u64,
    /// Data bytes.
    pub bytes: u64,
}

impl NodeCounts {
    /// Counts one node of type `ty` holding `size` bytes.
    fn add(&mut self, ty: NodeType, size: u64) {
        self.nodes += 1;
        match ty {
            t if t.is_container() => self.containers += 1,
            NodeType::KeyValue => {
                self.keyvalues += 1;
                self.bytes += size;
            }
            _ => {
                self.files += 1;
                self.bytes += size;
            }
        }
    }
}

impl std::fmt::Display for NodeCounts {
    /// `N nodes (C containers, F files, K key-values)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} nodes ({} containers, {} files, {} key-values)",
            self.nodes, self.containers, self.files, self.keyvalues
        )
    }
}

/// What a snapshot wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotSummary {
    pub path: String,
    pub dir: String,
    #[serde(flatten)]
    pub counts: NodeCounts,
    pub packs: u32,
}

/// What a restore created.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RestoreSummary {
    pub path: String,
    pub dir: String,
    #[serde(flatten)]
    pub counts: NodeCounts,
}

// ----- shared by snapshot and restore ----------------------------------------

/// Opens `file` (`what` names it in errors) to read it, and its length:
/// a regular file only, a symbolic link followed to one. A FIFO would
/// block the restore forever and a device such as `/dev/zero` never ends,
/// so anything else is refused, naming what it is: checked before
/// opening (opening a device can have effects of its own), and again on
/// the descriptor, opened without blocking, in case the file was replaced
/// meanwhile; the length is the descriptor's. `io` maps I/O errors.
fn open_regular(
    file: &Path,
    what: &str,
    io: impl Fn(std::io::Error) -> Error,
) -> Result<(std::fs::File, u64)> {
    use std::os::unix::fs::OpenOptionsExt;
    let regular = |meta: std::fs::Metadata| {
        if meta.is_file() {
            return Ok(meta.len());
        }
        Err(Error::invalid_argument(format!(
            "{what} {} is {}, not a regular file",
            file.display(),
            kind_of(meta.file_type())
        )))
    };
    regular(std::fs::metadata(file).map_err(&io)?)?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(file)
        .map_err(&io)?;
    let len = regular(f.metadata().map_err(&io)?)?;
    Ok((f, len))
}

/// What a file that is not a regular file is, in words.
fn kind_of(ft: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        "a directory"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "of an unknown kind"
    }
}

fn io_err(file: &Path, e: std::io::Error) -> Error {
    Error::unavailable(format!("{}: {e}", file.display()))
}

fn pack_header(i: u32) -> [u8; PACK_HEADER_LEN as usize] {
    let mut h = [0u8; PACK_HEADER_LEN as usize];
    h[..8].copy_from_slice(&PACK_MAGIC);
    h[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&i.to_le_bytes());
    h
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn target(dst: &str, rel: &str) -> String {
    match (dst, rel) {
        (d, "") => d.to_string(),
        ("/", r) => format!("/{r}"),
        (d, r) => format!("{d}/{r}"),
    }
}

fn ctx(what: &str, e: Error) -> Error {
    Error::new(e.code, format!("{what}: {}", e.message))
}
