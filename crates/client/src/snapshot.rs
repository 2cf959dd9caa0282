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

// ----- the manifest -----------------------------------------------------------

/// One node in a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestEntry {
    /// Relative to the snapshot's root ("" for the root).
    pub path: String,
    pub ty: NodeType,
    pub enumerable: bool,
    pub storage_class: u8,
    /// Data bytes (0 for containers).
    pub size: u64,
    /// Where the bytes are: pack file number and offset in it.
    pub pack: u32,
    pub offset: u64,
    /// CRC-32 (IEEE) of the bytes.
    pub crc: u32,
}

/// A snapshot's manifest (`docs/snapshots.md` has the layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// Milliseconds since the Unix epoch when the snapshot began.
    pub created_ms: u64,
    /// The path the snapshot was taken of.
    pub source: String,
    /// The cluster's block size then.
    pub block_size: u32,
    /// Length of each pack file, header included.
    pub packs: Vec<u64>,
    /// Parents before children; the root first.
    pub entries: Vec<ManifestEntry>,
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = bytes::BytesMut::new();
        let e = &mut Enc(&mut buf);
        for b in MANIFEST_MAGIC {
            e.u8(b);
        }
        e.u16(FORMAT_VERSION)
            .u16(0)
            .u64(self.created_ms)
            .u32(self.block_size)
            .str(&self.source)
            .u32(self.packs.len() as u32);
        for p in &self.packs {
            e.u64(*p);
        }
        e.u32(self.entries.len() as u32);
        for en in &self.entries {
            e.u8(en.ty as u8)
                .bool(en.enumerable)
                .u8(en.storage_class)
                .str(&en.path)
                .u64(en.size)
                .u32(en.pack)
                .u64(en.offset)
                .u32(en.crc);
        }
        let crc = crc32fast::hash(&buf);
        Enc(&mut buf).u32(crc);
        buf.to_vec()
    }

    /// Decodes and checks a manifest read from `file`: checksum, version,
    /// every count against the bytes present, every path by the path
    /// rules, every parent listed before its children and accepting them,
    /// every node's bytes inside its pack. Errors name `file`.
    pub fn decode(bytes: &[u8], file: &Path) -> Result<Manifest> {
        let damaged = |why: String| {
            Error::data_lost(format!(
                "snapshot manifest {} is damaged: {why}",
                file.display()
            ))
        };
        if bytes.len() < MANIFEST_MAGIC.len() + 2 + 4 || bytes[..8] != MANIFEST_MAGIC {
            return Err(damaged(
                "it does not start like a NodeKernel snapshot manifest".into(),
            ));
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != FORMAT_VERSION {
            return Err(Error::invalid_argument(format!(
                "snapshot manifest {} has format version {version}; this build reads version {FORMAT_VERSION}",
                file.display()
            )));
        }
        let (body, tail) = bytes.split_at(bytes.len() - 4);
        let stored = u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
        if crc32fast::hash(body) != stored {
            return Err(damaged("its checksum does not match its bytes".into()));
        }
        let mut dec = Dec::new(&body[10..], "snapshot manifest");
        let d = &mut dec;
        let m = (|| -> Result<Manifest> {
            let _flags = d.u16()?;
            let created_ms = d.u64()?;
            let block_size = d.u32()?;
            let source = d.string()?;
            path::components(&source)?;
            let np = d.count(8)?;
            if np > MAX_PACKS {
                return Err(Error::invalid_argument(format!(
                    "{np} pack files, the limit is {MAX_PACKS}"
                )));
            }
            let mut packs = Vec::with_capacity(np);
            for i in 0..np {
                let len = d.u64()?;
                if len < PACK_HEADER_LEN {
                    return Err(Error::invalid_argument(format!(
                        "{} is {len} bytes, shorter than its header",
                        pack_name(i as u32)
                    )));
                }
                packs.push(len);
            }
            let ne = d.count(ENTRY_MIN_LEN)?;
            let mut entries = Vec::with_capacity(ne);
            for _ in 0..ne {
                let ty = NodeType::from_u8(d.u8()?)?;
                let enumerable = d.bool()?;
                let storage_class = d.u8()?;
                let path = d.string()?;
                let size = d.u64()?;
                let pack = d.u32()?;
                let offset = d.u64()?;
                let crc = d.u32()?;
                entries.push(ManifestEntry {
                    path,
                    ty,
                    enumerable,
                    storage_class,
                    size,
                    pack,
                    offset,
                    crc,
                });
            }
            check_entries(&entries, &packs)?;
            Ok(Manifest {
                created_ms,
                source,
                block_size,
                packs,
                entries,
            })
        })()
        .map_err(|e| damaged(e.message))?;
        dec.finish().map_err(|e| damaged(e.message))?;
        Ok(m)
    }
}

/// The rules a manifest's entries keep beyond their encoding, checked
/// whole before a restore touches anything: the root first (and only it
/// with an empty path); every path valid and listed once; every parent
/// listed before its children, a container accepting their type;
/// containers without bytes; the bytes of each data node inside its pack
/// and after those of the data node listed before it (a snapshot writes
/// them back to back, so no two nodes share bytes and a restore never
/// writes more than the packs hold).
fn check_entries(entries: &[ManifestEntry], packs: &[u64]) -> Result<()> {
    if entries.is_empty() {
        return Err(Error::invalid_argument("no entries (not even the root)"));
    }
    let mut types: HashMap<&str, NodeType> = HashMap::with_capacity(entries.len());
    // Where the bytes of the last data node end: (pack, offset).
    let mut end = (0, PACK_HEADER_LEN);
    for (i, e) in entries.iter().enumerate() {
        let (p, ty, size) = (e.path.as_str(), e.ty, e.size);
        if (i == 0) != p.is_empty() {
            return Err(Error::invalid_argument(format!(
                "entry {i} ({p:?}): only the first entry, the root, has an empty path"
            )));
        }
        if i > 0 {
            path::components(&format!("/{p}"))?;
            let parent = p.rsplit_once('/').map_or("", |(a, _)| a);
            match types.get(parent) {
                Some(pt) if pt.accepts(ty) => {}
                Some(pt) => {
                    return Err(Error::invalid_argument(format!(
                        "entry {p:?}: a {pt} cannot hold a {ty}"
                    )))
                }
                None => {
                    return Err(Error::invalid_argument(format!(
                        "entry {p:?}: its parent is not listed before it"
                    )))
                }
            }
        }
        if types.insert(p, ty).is_some() {
            return Err(Error::invalid_argument(format!("{p:?} is listed twice")));
        }
        if ty.is_container() {
            if size != 0 {
                return Err(Error::invalid_argument(format!(
                    "container {p:?} has {size} bytes of data"
                )));
            }
        } else if size > 0 {
            let len = packs.get(e.pack as usize).copied().ok_or_else(|| {
                Error::invalid_argument(format!(
                    "node {p:?} is in pack {}, of {}",
                    e.pack,
                    packs.len()
                ))
            })?;
            let stop = match e.offset.checked_add(size) {
                Some(stop) if e.offset >= PACK_HEADER_LEN && stop <= len => stop,
                _ => {
                    return Err(Error::invalid_argument(format!(
                        "node {p:?}: {size} bytes at {} are outside {} ({len} bytes)",
                        e.offset,
                        pack_name(e.pack)
                    )))
                }
            };
            if (e.pack, e.offset) < end {
                return Err(Error::invalid_argument(format!(
                    "node {p:?}: its {size} bytes at {} in {} overlap those of a node listed before it (a snapshot writes them back to back)",
                    e.offset,
                    pack_name(e.pack)
                )));
            }
            end = (e.pack, stop);
        }
    }
    Ok(())
}

/// Reads and checks the manifest of the snapshot in `dir`.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let file = dir.join(MANIFEST);
    match std::fs::symlink_metadata(&file) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let why = if dir.is_dir() {
                "the snapshot is incomplete (it was interrupted before its manifest was written) or this is not a snapshot directory"
            } else {
                "no such directory"
            };
            return Err(Error::invalid_argument(format!(
                "{} has no {MANIFEST}: {why}",
                dir.display()
            )));
        }
        Err(e) => return Err(io_err(&file, e)),
    }
    let (f, len) = open_regular(&file, "snapshot manifest", |e| io_err(&file, e))?;
    if len > MAX_MANIFEST_BYTES {
        return Err(Error::invalid_argument(format!(
            "snapshot manifest {} is {len} bytes, the limit is {MAX_MANIFEST_BYTES}",
            file.display(),
        )));
    }
    // No more than the length it had when opened (a file still growing
    // fails its checksum).
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(len)
        .read_to_end(&mut bytes)
        .map_err(|e| io_err(&file, e))?;
    Manifest::decode(&bytes, &file)
}

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

// ----- taking a snapshot ------------------------------------------------------

/// A node of a running snapshot, as listed when it began.
#[derive(Debug, Clone)]
pub struct SnapshotNode {
    /// Which metadata partition (index) and snapshot id listed it.
    part: usize,
    id: u64,
    pub entry: SnapshotEntry,
}

/// A running snapshot: its listing is frozen and its blocks are pinned on
/// the metadata server(s) until [`Snapshot::write_to`] (or
/// [`Snapshot::end`]) ends it. A snapshot nobody touches for two minutes
/// ends by itself.
pub struct Snapshot {
    client: Client,
    path: String,
    /// (partition, snapshot id) of every partition taking part.
    ids: Vec<(usize, u64)>,
    nodes: Vec<SnapshotNode>,
    created_ms: u64,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("path", &self.path)
            .field("ids", &self.ids)
            .field("nodes", &self.nodes.len())
            .finish()
    }
}

impl Client {
    /// Begins a snapshot of the subtree at `p` (every partition for `/`)
    /// and fetches its listing. Nothing is read yet: see
    /// [`Snapshot::write_to`].
    pub async fn snapshot_begin(&self, p: &str) -> Result<Snapshot> {
        let comps = path::components(p)?;
        let parts: Vec<usize> = if comps.is_empty() {
            (0..self.inner.cfg.metas.len()).collect()
        } else {
            vec![self.partition(p)]
        };
        let mut snap = Snapshot {
            client: self.clone(),
            path: p.to_string(),
            ids: Vec::new(),
            nodes: Vec::new(),
            created_ms: now_ms(),
        };
        for &part in &parts {
            let req = MetaRequest::SnapshotBegin {
                path: p.to_string(),
            };
            match self.meta_at(part, &req).await {
                Ok(MetaReply::SnapshotBegun { id, .. }) => snap.ids.push((part, id)),
                Ok(other) => {
                    snap.end().await;
                    return Err(unexpected(other));
                }
                Err(e) => {
                    snap.end().await;
                    return Err(ctx(&format!("snapshot of {p}"), e));
                }
            }
        }
        for (part, id) in snap.ids.clone() {
            if let Err(e) = snap.list(part, id).await {
                snap.end().await;
                return Err(ctx(&format!("snapshot of {p}"), e));
            }
        }
        Ok(snap)
    }

    /// Takes a snapshot of the subtree at `p` into the directory `dir`
    /// (created if missing; it must be empty): [`Client::snapshot_begin`]
    /// then [`Snapshot::write_to`].
    pub async fn snapshot(
        &self,
        p: &str,
        dir: &Path,
        opts: &SnapshotOptions,
        progress: &dyn Progress,
    ) -> Result<SnapshotSummary> {
        prepare_dir(dir)?;
        self.snapshot_begin(p)
            .await?
            .write_to(dir, opts, progress)
            .await
    }
}

/// Mode of the files a snapshot writes (they hold the nodes' data), and of
/// the directories it creates: the owner's only, whatever the umask.
const FILE_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o700;

/// Creates `path` for writing with [`FILE_MODE`]; `new`: it must not
/// exist, else it is truncated.
fn create_private(path: &Path, new: bool) -> Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .create_new(new)
        .truncate(true)
        .mode(FILE_MODE)
        .open(path)
        .map_err(|e| io_err(path, e))
}

/// Creates `dir` if needed (with its missing parents, [`DIR_MODE`]);
/// refuses one that is not empty.
fn prepare_dir(dir: &Path) -> Result<()> {
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), DIR_MODE)
        .create(dir)
        .map_err(|e| io_err(dir, e))?;
    let mut it = std::fs::read_dir(dir).map_err(|e| io_err(dir, e))?;
    if it.next().is_some() {
        return Err(Error::already_exists(format!(
            "{} is not empty: a snapshot goes into a new or empty directory",
            dir.display()
        )));
    }
    Ok(())
}

impl Snapshot {
    /// The nodes listed, parents before children.
    pub fn nodes(&self) -> &[SnapshotNode] {
        &self.nodes
    }

    async fn list(&mut self, part: usize, id: u64) -> Result<()> {
        let first_part = self.nodes.is_empty();
        let (mut entry, mut block) = (0, 0);
        loop {
            let req = MetaRequest::SnapshotList { id, entry, block };
            let (entries, next_entry, next_block) = match self.client.meta_at(part, &req).await? {
                MetaReply::SnapshotPage {
                    entries,
                    next_entry,
                    next_block,
                } => (entries, next_entry, next_block),
                other => return Err(unexpected(other)),
            };
            if entries.is_empty() {
                return Ok(());
            }
            if (next_entry, next_block) <= (entry, block) {
                return Err(Error::protocol(format!(
                    "snapshot {id}: the listing does not advance past entry {entry}"
                )));
            }
            for e in entries {
                let continues = self
                    .nodes
                    .last()
                    .is_some_and(|n| n.part == part && n.entry.index == e.index);
                if continues {
                    if let Some(n) = self.nodes.last_mut() {
                        n.entry.blocks.extend(e.blocks);
                    }
                } else if e.path.is_empty() && !first_part {
                    // Every partition has a root: keep the first one.
                } else {
                    self.nodes.push(SnapshotNode { part, id, entry: e });
                }
            }
            (entry, block) = (next_entry, next_block);
        }
    }

    /// Ends the snapshot without writing it: its blocks may be reused.
    pub async fn end(&self) {
        for (part, id) in &self.ids {
            let req = MetaRequest::SnapshotEnd { id: *id };
            if let Err(e) = self.client.meta_at(*part, &req).await {
                tracing::debug!("ending snapshot {id} on metadata partition {part}: {e}");
            }
        }
    }

    /// Reads every listed node's bytes into pack files in `dir` (created
    /// if missing; it must be empty), writes the manifest last, and ends
    /// the snapshot (also when it fails).
    pub async fn write_to(
        self,
        dir: &Path,
        opts: &SnapshotOptions,
        progress: &dyn Progress,
    ) -> Result<SnapshotSummary> {
        // Reads that never meet a fence never call the metadata server:
        // keep the snapshot alive meanwhile.
        let renew = {
            let client = self.client.clone();
            let ids = self.ids.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(RENEW_EVERY).await;
                    for (part, id) in &ids {
                        // An empty page past the end: it only renews.
                        let req = MetaRequest::SnapshotList {
                            id: *id,
                            entry: u64::MAX,
                            block: 0,
                        };
                        let _ = client.meta_at(*part, &req).await;
                    }
                }
            })
        };
        let r = match prepare_dir(dir) {
            Ok(()) => self.write_inner(dir, opts, progress).await,
            Err(e) => Err(e),
        };
        renew.abort();
        self.end().await;
        r
    }

    async fn write_inner(
        &self,
        dir: &Path,
        opts: &SnapshotOptions,
        progress: &dyn Progress,
    ) -> Result<SnapshotSummary> {
        let mut summary = SnapshotSummary {
            path: self.path.clone(),
            dir: dir.display().to_string(),
            ..SnapshotSummary::default()
        };
        // One read per block holding published bytes, in listing order.
        let mut jobs = Vec::new();
        let mut chunks = Vec::with_capacity(self.nodes.len());
        for n in &self.nodes {
            let e = &n.entry;
            summary.counts.add(e.ty, e.size);
            if e.ty.is_container() {
                chunks.push(0);
                continue;
            }
            let bs = e.block_size.max(1) as u64;
            let count = e.size.div_ceil(bs);
            if (e.blocks.len() as u64) < count {
                return Err(Error::data_lost(format!(
                    "{}: {} bytes need {count} blocks, the listing has {}",
                    target(&self.path, &e.path),
                    e.size,
                    e.blocks.len()
                )));
            }
            for i in 0..count {
                let len = bs.min(e.size - i * bs) as usize;
                jobs.push((n, i, e.blocks[i as usize].clone(), len));
            }
            chunks.push(count);
        }
        progress.phase(
            Phase::Reading,
            self.nodes.len() as u64,
            summary.counts.bytes,
        );
        let client = &self.client;
        let base = &self.path;
        let mut reads = stream::iter(jobs)
            .map(|(n, index, loc, len)| async move {
                let at = SnapshotLocator {
                    client,
                    part: n.part,
                    id: n.id,
                    node: n.entry.node,
                    first: &loc,
                };
                let e = &n.entry;
                let seal = crate::crypt::Seal::of(
                    client.config().encryption_key.as_ref(),
                    e.encrypted,
                    e.node,
                    e.block_size,
                )
                .map_err(|err| ctx(&target(base, &e.path), err))?;
                client
                    .inner
                    .io
                    .read_untagged(&at, index, loc.clone(), seal, 0, len)
                    .await
                    .map_err(|err| ctx(&target(base, &e.path), err))
            })
            .buffered(opts.reads_in_flight.max(1));
        let mut packs = PackWriter::new(dir, opts.pack_bytes);
        let mut entries = Vec::with_capacity(self.nodes.len());
        for (n, count) in self.nodes.iter().zip(chunks) {
            let e = &n.entry;
            let (pack, offset) = if e.ty.is_container() {
                (0, 0)
            } else {
                packs.start_node()?
            };
            let mut crc = crc32fast::Hasher::new();
            for _ in 0..count {
                let bytes = reads
                    .next()
                    .await
                    .ok_or_else(|| Error::internal("a block read went missing"))??;
                crc.update(&bytes);
                packs.write(&bytes)?;
                progress.advance(0, bytes.len() as u64);
            }
            entries.push(ManifestEntry {
                path: e.path.clone(),
                ty: e.ty,
                enumerable: e.enumerable,
                storage_class: e.storage_class,
                size: e.size,
                pack,
                offset: if e.size == 0 { PACK_HEADER_LEN } else { offset },
                crc: crc.finalize(),
            });
            progress.advance(1, 0);
        }
        let pack_lens = packs.finish()?;
        summary.packs = pack_lens.len() as u32;
        let block_size = self.nodes.first().map_or(0, |n| n.entry.block_size);
        let manifest = Manifest {
            created_ms: self.created_ms,
            source: self.path.clone(),
            block_size,
            packs: pack_lens,
            entries,
        };
        write_durably(dir, &manifest.encode())?;
        Ok(summary)
    }
}

/// Writes the manifest: to a temporary file, synced, renamed into place,
/// and the directory synced — the snapshot's commit point.
fn write_durably(dir: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = dir.join(MANIFEST_TMP);
    let fin = dir.join(MANIFEST);
    let mut f = create_private(&tmp, false)?;
    f.write_all(bytes).map_err(|e| io_err(&tmp, e))?;
    f.sync_all().map_err(|e| io_err(&tmp, e))?;
    std::fs::rename(&tmp, &fin).map_err(|e| io_err(&fin, e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(dir, e))
}

/// Pack files being written, one after another.
struct PackWriter {
    dir: PathBuf,
    limit: u64,
    /// Finished packs' lengths.
    done: Vec<u64>,
    current: Option<(std::io::BufWriter<std::fs::File>, u64)>,
}

impl PackWriter {
    fn new(dir: &Path, limit: u64) -> Self {
        PackWriter {
            dir: dir.to_path_buf(),
            limit: limit.max(1),
            done: Vec::new(),
            current: None,
        }
    }

    fn file(&self, i: usize) -> PathBuf {
        self.dir.join(pack_name(i as u32))
    }

    /// Where the next node's bytes go (a new pack once the current one is
    /// full).
    fn start_node(&mut self) -> Result<(u32, u64)> {
        if self
            .current
            .as_ref()
            .is_some_and(|(_, len)| *len >= self.limit)
        {
            self.close_current()?;
        }
        if self.current.is_none() {
            let i = self.done.len();
            if i >= MAX_PACKS {
                return Err(Error::invalid_argument(format!(
                    "the snapshot needs more than {MAX_PACKS} pack files: use bigger ones"
                )));
            }
            let path = self.file(i);
            let f = create_private(&path, true)?;
            let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
            w.write_all(&pack_header(i as u32))
                .map_err(|e| io_err(&path, e))?;
            self.current = Some((w, PACK_HEADER_LEN));
        }
        let len = self.current.as_ref().map_or(PACK_HEADER_LEN, |(_, l)| *l);
        Ok((self.done.len() as u32, len))
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let path = self.file(self.done.len());
        let (w, len) = self
            .current
            .as_mut()
            .ok_or_else(|| Error::internal("no pack file open"))?;
        w.write_all(bytes).map_err(|e| io_err(&path, e))?;
        *len += bytes.len() as u64;
        Ok(())
    }

    fn close_current(&mut self) -> Result<()> {
        if let Some((w, len)) = self.current.take() {
            let path = self.file(self.done.len());
            let f = w.into_inner().map_err(|e| io_err(&path, e.into_error()))?;
            f.sync_all().map_err(|e| io_err(&path, e))?;
            self.done.push(len);
        }
        Ok(())
    }

    /// Closes the last pack (one is always written, maybe empty); the
    /// lengths of all.
    fn finish(mut self) -> Result<Vec<u64>> {
        if self.current.is_none() && self.done.is_empty() {
            self.start_node()?;
        }
        self.close_current()?;
        Ok(self.done)
    }
}

/// Finds a snapshot's block again after `Stale` (fenced, freed and held,
/// moved): asks the metadata server where that block is now.
struct SnapshotLocator<'a> {
    client: &'a Client,
    part: usize,
    id: u64,
    node: u64,
    /// The block's location when the snapshot began.
    first: &'a BlockLoc,
}

impl Locate for SnapshotLocator<'_> {
    async fn relocate(&self, index: u64, _err: Error) -> Result<BlockLoc> {
        let req = MetaRequest::SnapshotLocate {
            id: self.id,
            node: self.node,
            index,
            server: self.first.server,
            block: self.first.block,
        };
        match self.client.meta_at(self.part, &req).await? {
            MetaReply::Located(loc) => Ok(BlockLoc {
                offset: self.first.offset,
                tag: 0,
                ..loc
            }),
            other => Err(unexpected(other)),
        }
    }

    async fn replace(&self, index: u64, _lost: &BlockLoc) -> Result<BlockLoc> {
        Err(Error::internal(format!(
            "snapshot reads never write (block {index})"
        )))
    }
}

// ----- restoring ----------------------------------------------------------------

/// Where a restore builds its tree before moving it into place: under
/// names of its own (`.nk-restore-…`) beside the target, so that a
/// restore that fails leaves nothing behind and an existing target is
/// replaced only once its replacement is whole.
struct Staging {
    /// For a target other than `/`: where the snapshot's root is built,
    /// in `moves[0].0` (which takes the place of the highest node on the
    /// way to the target that is missing, or of the target).
    root: Option<String>,
    /// Each staged node and the path it moves to at the end: one for a
    /// target other than `/`; for `/`, one per top-level name of the
    /// snapshot.
    moves: Vec<(String, String)>,
    /// For `/`: where each top-level name of the snapshot is built.
    tops: HashMap<String, String>,
    /// For `/` with overwrite: its names the snapshot does not have,
    /// removed once the new tree is in place.
    remove: Vec<String>,
    /// Tells this restore's names from any other's.
    key: u64,
}

impl Staging {
    /// Where the node at `rel` in the snapshot is built; `None` for the
    /// root of a restore to `/` (which exists).
    fn path(&self, rel: &str) -> Option<String> {
        if let Some(root) = &self.root {
            return Some(target(root, rel));
        }
        let (top, rest) = rel.split_once('/').unwrap_or((rel, ""));
        self.tops.get(top).map(|staged| target(staged, rest))
    }
}

impl Client {
    /// Restores the snapshot in `dir` to `dst` (`/` too). The manifest and
    /// every checksum are checked first; the tree is then built under a
    /// name of its own beside `dst` and moved into place once whole, so a
    /// restore that fails leaves nothing behind (missing parents of `dst`
    /// included). An existing `dst` (for `/`: one with children) is
    /// refused with `AlreadyExists` unless `opts.overwrite`; then it is
    /// replaced only once the new tree is in place.
    pub async fn restore(
        &self,
        dir: &Path,
        dst: &str,
        opts: &RestoreOptions,
        progress: &dyn Progress,
    ) -> Result<RestoreSummary> {
        path::components(dst)?;
        let m = read_manifest(dir)?;
        let mut summary = RestoreSummary {
            path: dst.to_string(),
            dir: dir.display().to_string(),
            ..RestoreSummary::default()
        };
        let root = &m.entries[0];
        if dst == "/" && root.ty != NodeType::Directory {
            return Err(Error::type_mismatch(format!(
                "the snapshot in {} is of a {}; only a Directory can be restored to /",
                dir.display(),
                root.ty
            )));
        }
        // Every target path must be valid before anything is created.
        for e in &m.entries {
            path::components(&target(dst, &e.path))
                .map_err(|err| ctx(&format!("restoring {:?} to {dst}", e.path), err))?;
        }
        let staging = self.staging(dst, &m, opts.overwrite).await?;
        let packs = open_packs(dir, &m)?;
        verify(dir, &m, &packs, progress)?;
        for e in &m.entries {
            summary.counts.add(e.ty, e.size);
        }
        let built = self
            .build(
                dir,
                dst,
                &m,
                &packs,
                &staging,
                opts,
                progress,
                &summary.counts,
            )
            .await;
        let placed = match built {
            Ok(()) => self.move_into_place(&staging, opts.overwrite).await,
            Err(e) => Err(e),
        };
        let aside = match placed {
            Ok(aside) => aside,
            Err(e) => {
                self.discard(&staging).await;
                return Err(e);
            }
        };
        for old in aside.iter().chain(&staging.remove) {
            match self.delete(old, true).await {
                Ok(()) => {}
                Err(e) if e.code == ErrorCode::NotFound => {}
                Err(e) => {
                    return Err(ctx(
                        &format!("restored {dst}, but could not remove the old {old}"),
                        e,
                    ))
                }
            }
        }
        Ok(summary)
    }

    /// Checks the target (an existing one is refused without
    /// `overwrite`) and names the nodes the restore is built under.
    async fn staging(&self, dst: &str, m: &Manifest, overwrite: bool) -> Result<Staging> {
        use std::hash::BuildHasher;
        let key = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
        let mut st = Staging {
            root: None,
            moves: Vec::new(),
            tops: HashMap::new(),
            remove: Vec::new(),
            key,
        };
        if dst == "/" {
            let existing = self.enumerate("/").await?;
            if !existing.is_empty() && !overwrite {
                return Err(Error::already_exists(format!(
                    "/ is not empty ({} entries): restore into an empty cluster, or ask to overwrite",
                    existing.len()
                )));
            }
            for e in m.entries.iter().skip(1).filter(|e| !e.path.contains('/')) {
                let top = format!("/{}", e.path);
                let staged = self.beside(&top, &format!("restore-{key:016x}-{}", st.moves.len()));
                st.tops.insert(e.path.clone(), staged.clone());
                st.moves.push((staged, top));
            }
            if overwrite {
                st.remove = existing
                    .into_iter()
                    .filter(|name| !st.tops.contains_key(name))
                    .map(|name| format!("/{name}"))
                    .collect();
            }
            return Ok(st);
        }
        // The restore creates the highest node on the way to `dst` that
        // is missing (missing parents become Directories), or replaces
        // `dst`.
        let mut missing = None;
        let mut at = String::new();
        for c in path::components(dst)? {
            at = format!("{at}/{c}");
            match self.lookup(&at).await {
                Ok(_) => {}
                Err(e) if e.code == ErrorCode::NotFound => {
                    missing = Some(at);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        let top = match missing {
            Some(top) => top,
            None if overwrite => dst.to_string(),
            None => {
                return Err(Error::already_exists(format!(
                    "{dst} exists: restore to a new path, or ask to overwrite"
                )))
            }
        };
        let staged = self.beside(&top, &format!("restore-{key:016x}"));
        st.root = Some(format!("{staged}{}", dst.get(top.len()..).unwrap_or("")));
        st.moves.push((staged, top));
        Ok(st)
    }

    /// A name for the restore's own use (`.nk-{tag}-N`) beside `path`, on
    /// the metadata partition that owns `path`, so that moving between
    /// the two is never `CrossPartition`. A path's partition is that of
    /// its top-level name: beside a deeper path any name will do, beside a
    /// top-level one a few are tried (about as many as there are
    /// partitions).
    fn beside(&self, path: &str, tag: &str) -> String {
        let parent = path.rsplit_once('/').map_or("", |(p, _)| p);
        let owner = self.partition(path);
        (0u64..)
            .map(|n| format!("{parent}/.nk-{tag}-{n}"))
            .find(|p| self.partition(p) == owner)
            .unwrap_or_default()
    }

    /// Creates the snapshot's nodes where `st` builds them: the containers
    /// in order, then the data nodes `opts.writes_in_flight` at a time.
    /// After a failure no more are started, and those being written are
    /// aborted.
    #[allow(clippy::too_many_arguments)]
    async fn build(
        &self,
        dir: &Path,
        dst: &str,
        m: &Manifest,
        packs: &[std::fs::File],
        st: &Staging,
        opts: &RestoreOptions,
        progress: &dyn Progress,
        counts: &NodeCounts,
    ) -> Result<()> {
        let staged = |e: &ManifestEntry| {
            st.path(&e.path)
                .ok_or_else(|| Error::internal(format!("restoring {:?}: no staging path", e.path)))
        };
        // The staging paths must be valid too before anything is created.
        for e in m.entries.iter().skip(usize::from(st.root.is_none())) {
            let p = staged(e)?;
            path::components(&p).map_err(|err| {
                ctx(
                    &format!("restoring {} (built at {p} first)", target(dst, &e.path)),
                    err,
                )
            })?;
        }
        progress.phase(Phase::Writing, counts.nodes, counts.bytes);
        if let (Some(root), Some((first, _))) = (&st.root, st.moves.first()) {
            if root != first {
                // Missing parents of the target.
                let (parent, _) = path::split_parent(root)?;
                self.mkdir(parent, true).await?;
            }
        }
        for e in m.entries.iter().filter(|e| e.ty.is_container()) {
            progress.advance(1, 0);
            if st.root.is_none() && e.path.is_empty() {
                continue;
            }
            let opts = CreateOptions {
                enumerable: e.enumerable,
                ..CreateOptions::default()
            };
            self.create(&staged(e)?, e.ty, opts)
                .await
                .map_err(|err| ctx(&format!("restoring {}", target(dst, &e.path)), err))?;
        }
        let failed = std::sync::atomic::AtomicBool::new(false);
        let failed = &failed;
        let data = m.entries.iter().filter(|e| !e.ty.is_container());
        stream::iter(data)
            .map(|e| async move {
                if failed.load(std::sync::atomic::Ordering::Relaxed) {
                    return Ok(());
                }
                let written = match staged(e) {
                    Ok(p) => self.restore_node(dir, packs, e, &p).await,
                    Err(err) => Err(err),
                };
                match written {
                    Ok(()) => progress.advance(1, e.size),
                    Err(_) => failed.store(true, std::sync::atomic::Ordering::Relaxed),
                }
                written.map_err(|err| ctx(&format!("restoring {}", target(dst, &e.path)), err))
            })
            .buffer_unordered(opts.writes_in_flight.max(1))
            .fold(Ok(()), |first, r| async move { first.and(r) })
            .await
    }

    /// Moves every staged node to its target; with `overwrite`, an
    /// existing target is first moved aside (beside it), to be put back
    /// should a later move fail. The paths moved aside, to be removed.
    async fn move_into_place(&self, st: &Staging, overwrite: bool) -> Result<Vec<String>> {
        let mut done: Vec<(&str, &str, Option<String>)> = Vec::new();
        for (i, (staged, to)) in st.moves.iter().enumerate() {
            let tag = format!("replaced-{:016x}-{i}", st.key);
            match self.move_one(staged, to, overwrite, &tag).await {
                Ok(aside) => done.push((staged, to, aside)),
                Err(e) => {
                    for (staged, to, aside) in done.into_iter().rev() {
                        self.move_back(staged, to, aside).await;
                    }
                    return Err(e);
                }
            }
        }
        Ok(done.into_iter().filter_map(|(_, _, aside)| aside).collect())
    }

    async fn move_one(
        &self,
        staged: &str,
        to: &str,
        overwrite: bool,
        tag: &str,
    ) -> Result<Option<String>> {
        let mut aside = None;
        if overwrite {
            let a = self.beside(to, tag);
            match self.rename(to, &a).await {
                Ok(()) => aside = Some(a),
                Err(e) if e.code == ErrorCode::NotFound => {}
                Err(e) => return Err(ctx(&format!("moving {to} aside"), e)),
            }
        }
        if let Err(e) = self.rename(staged, to).await {
            if let Some(a) = &aside {
                if let Err(b) = self.rename(a, to).await {
                    tracing::warn!("could not put {to} back from {a}: {b}");
                }
            }
            return Err(ctx(&format!("moving the restored tree to {to}"), e));
        }
        Ok(aside)
    }

    /// Undoes a move after a later one failed: the restored node goes back
    /// to where it was built (to be discarded), the old one to its place.
    async fn move_back(&self, staged: &str, to: &str, aside: Option<String>) {
        if let Err(e) = self.rename(to, staged).await {
            tracing::warn!("could not move the restored {to} back to {staged}: {e}");
            return;
        }
        if let Some(a) = aside {
            if let Err(e) = self.rename(&a, to).await {
                tracing::warn!("could not put {to} back from {a}: {e}");
            }
        }
    }

    /// Removes what a failed restore built.
    async fn discard(&self, st: &Staging) {
        for (staged, _) in &st.moves {
            match self.delete(staged, true).await {
                Ok(()) => {}
                Err(e) if e.code == ErrorCode::NotFound => {}
                Err(e) => tracing::warn!("could not remove the partial restore at {staged}: {e}"),
            }
        }
    }

    /// Creates one data node with its bytes, checking them again on the
    /// way (the pack could have changed since it was verified); a value
    /// whose bytes do not match is aborted, never published.
    async fn restore_node(
        &self,
        dir: &Path,
        packs: &[std::fs::File],
        e: &ManifestEntry,
        p: &str,
    ) -> Result<()> {
        let opts = CreateOptions {
            size_hint: if e.ty == NodeType::KeyValue {
                e.size
            } else {
                0
            },
            ..CreateOptions::default()
        };
        let mut node = self.create(p, e.ty, opts).await?;
        let mut crc = crc32fast::Hasher::new();
        let mut at = 0;
        let written = async {
            while at < e.size {
                let len = CHUNK.min(e.size - at);
                let buf = read_pack(dir, packs, e.pack, e.offset + at, len)?;
                crc.update(&buf);
                node.append(&buf).await?;
                at += len;
            }
            if crc.clone().finalize() != e.crc {
                return Err(damaged_node(dir, e));
            }
            Ok(())
        }
        .await;
        match written {
            Ok(()) => node.close().await,
            Err(err) => {
                let _ = node.abort().await;
                Err(err)
            }
        }
    }
}

fn damaged_node(dir: &Path, e: &ManifestEntry) -> Error {
    Error::data_lost(format!(
        "snapshot {}: {}: the bytes of node {:?} ({} bytes at offset {}) do not match their checksum: the snapshot is damaged",
        dir.display(),
        pack_name(e.pack),
        e.path,
        e.size,
        e.offset
    ))
}

/// Opens every pack and checks its header and length.
fn open_packs(dir: &Path, m: &Manifest) -> Result<Vec<std::fs::File>> {
    let mut out = Vec::with_capacity(m.packs.len());
    for (i, len) in m.packs.iter().enumerate() {
        let path = dir.join(pack_name(i as u32));
        let (f, actual) = open_regular(&path, "snapshot pack file", |e| {
            Error::data_lost(format!(
                "snapshot {}: {}: {e}",
                dir.display(),
                pack_name(i as u32)
            ))
        })?;
        let mut h = [0u8; PACK_HEADER_LEN as usize];
        let header_ok = actual >= PACK_HEADER_LEN
            && f.read_exact_at(&mut h, 0).is_ok()
            && h == pack_header(i as u32);
        if actual != *len || !header_ok {
            return Err(Error::data_lost(format!(
                "snapshot pack file {} is damaged: {}",
                path.display(),
                if actual != *len {
                    format!("{actual} bytes, the manifest says {len}")
                } else {
                    "its header is wrong".into()
                }
            )));
        }
        out.push(f);
    }
    Ok(out)
}

fn read_pack(dir: &Path, packs: &[std::fs::File], pack: u32, at: u64, len: u64) -> Result<Vec<u8>> {
    let f = packs
        .get(pack as usize)
        .ok_or_else(|| Error::invalid_argument(format!("no pack {pack}")))?;
    // `len` is at most CHUNK.
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, at)
        .map_err(|e| io_err(&dir.join(pack_name(pack)), e))?;
    Ok(buf)
}

/// Checks every node's bytes against its checksum.
fn verify(
    dir: &Path,
    m: &Manifest,
    packs: &[std::fs::File],
    progress: &dyn Progress,
) -> Result<()> {
    let data: Vec<&ManifestEntry> = m.entries.iter().filter(|e| !e.ty.is_container()).collect();
    let bytes = data.iter().map(|e| e.size).sum();
    progress.phase(Phase::Verifying, data.len() as u64, bytes);
    for e in data {
        let mut crc = crc32fast::Hasher::new();
        let mut at = 0;
        while at < e.size {
            let len = CHUNK.min(e.size - at);
            let buf = read_pack(dir, packs, e.pack, e.offset + at, len)?;
            crc.update(&buf);
            at += len;
            progress.advance(0, len);
        }
        if crc.finalize() != e.crc {
            return Err(damaged_node(dir, e));
        }
        progress.advance(1, 0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let entry = |path: &str, ty, size, pack, offset| ManifestEntry {
            path: path.into(),
            ty,
            enumerable: true,
            storage_class: nodekernel_proto::NO_CLASS,
            size,
            pack,
            offset,
            crc: 7,
        };
        Manifest {
            created_ms: 1,
            source: "/src".into(),
            block_size: 1 << 20,
            packs: vec![PACK_HEADER_LEN + 10, PACK_HEADER_LEN + 5],
            entries: vec![
                entry("", NodeType::Directory, 0, 0, 0),
                entry("t", NodeType::Table, 0, 0, 0),
                entry("t/k", NodeType::KeyValue, 10, 0, PACK_HEADER_LEN),
                entry("b", NodeType::Bag, 0, 0, 0),
                entry("b/f", NodeType::File, 5, 1, PACK_HEADER_LEN),
                entry("b/g", NodeType::File, 0, 0, PACK_HEADER_LEN),
            ],
        }
    }

    #[test]
    fn a_manifest_round_trips() {
        let m = sample();
        assert_eq!(Manifest::decode(&m.encode(), Path::new("m")).unwrap(), m);
    }

    #[test]
    fn a_damaged_manifest_is_refused_never_a_panic() {
        let good = sample().encode();
        let file = Path::new("/snap/manifest.nks");
        for cut in 0..good.len() {
            let e = Manifest::decode(&good[..cut], file).unwrap_err();
            assert!(e.message.contains("/snap/manifest.nks"), "cut {cut}: {e}");
        }
        for at in 0..good.len() {
            for bit in [0x01u8, 0x80] {
                let mut bad = good.clone();
                bad[at] ^= bit;
                assert!(Manifest::decode(&bad, file).is_err(), "byte {at} flipped");
            }
        }
    }

    /// A manifest whose checksum is right but whose content breaks a rule.
    fn refused(m: &Manifest) -> String {
        Manifest::decode(&m.encode(), Path::new("m"))
            .unwrap_err()
            .message
    }

    #[test]
    fn a_well_formed_manifest_that_breaks_a_rule_is_refused() {
        let mut m = sample();
        m.entries[2].offset = PACK_HEADER_LEN + 1; // past its pack's end
        assert!(refused(&m).contains("outside"), "{}", refused(&m));
        let mut m = sample();
        m.entries[4].pack = 9;
        assert!(refused(&m).contains("pack 9"), "{}", refused(&m));
        let mut m = sample();
        m.entries[2].offset = u64::MAX;
        assert!(refused(&m).contains("outside"));
        let mut m = sample();
        m.entries.swap(1, 2); // a child before its parent
        assert!(refused(&m).contains("parent"), "{}", refused(&m));
        let mut m = sample();
        m.entries[4].ty = NodeType::KeyValue; // a Bag holds Files only
        assert!(refused(&m).contains("cannot hold"), "{}", refused(&m));
        let mut m = sample();
        m.entries[1].path = "t/../x".into();
        assert!(refused(&m).contains(".."), "{}", refused(&m));
        let mut m = sample();
        m.entries[1].path = "x".repeat(300);
        assert!(refused(&m).contains("255"), "{}", refused(&m));
        let mut m = sample();
        m.entries[1].size = 3;
        assert!(refused(&m).contains("container"), "{}", refused(&m));
        let mut m = sample();
        m.entries.clear();
        assert!(refused(&m).contains("no entries"));
        let mut m = sample();
        m.entries[0].path = "r".into();
        assert!(refused(&m).contains("root"));
    }

    #[test]
    fn a_manifest_listing_a_path_twice_is_refused() {
        let dup = |extra: ManifestEntry| {
            let mut m = sample();
            m.entries.push(extra);
            refused(&m)
        };
        let s = sample();
        // A File twice, a Table and a Directory, a Bag and a File, a
        // KeyValue twice.
        let mut dir = s.entries[1].clone();
        dir.ty = NodeType::Directory;
        let mut file = s.entries[5].clone();
        file.path = "b".into();
        for (what, extra) in [
            ("file", s.entries[4].clone()),
            ("table and directory", dir),
            ("bag and file", file),
            ("key-value", s.entries[2].clone()),
        ] {
            let e = dup(extra);
            assert!(e.contains("twice"), "{what}: {e}");
        }
    }

    #[test]
    fn a_manifest_whose_nodes_share_bytes_is_refused() {
        // Two nodes over the same bytes (a snapshot writes them back to
        // back): a small snapshot must not restore as a big tree.
        let mut m = sample();
        m.packs[0] = PACK_HEADER_LEN + 20;
        let mut twin = m.entries[2].clone();
        twin.path = "t/k2".into();
        m.entries.insert(3, twin.clone());
        assert!(refused(&m).contains("overlap"), "{}", refused(&m));
        // Back to back is fine.
        m.entries[3].offset = PACK_HEADER_LEN + 10;
        Manifest::decode(&m.encode(), Path::new("m")).unwrap();
        // And so is an empty node anywhere.
        twin.size = 0;
        twin.path = "t/k3".into();
        m.entries.insert(4, twin);
        Manifest::decode(&m.encode(), Path::new("m")).unwrap();
    }

    #[test]
    fn a_manifest_of_another_version_says_so() {
        let mut b = sample().encode();
        b[8] = 9;
        let e = Manifest::decode(&b, Path::new("m")).unwrap_err();
        assert!(e.message.contains("version 9"), "{e}");
    }
}
