//! Metadata-plane messages: the lean RPC set of the NodeKernel paper
//! (create, lookup, remove, move, map, register) plus enumerate, write
//! leases, heartbeat and status.

/// The start of what a metadata server says when it refuses a request that
/// needs a storage server while none has registered with it yet
/// (`Unavailable`): a client that reads it knows the request changed
/// nothing and sends it again once one has (`crates/client/src/start.rs`).
pub const NO_STORAGE_SERVER_YET: &str =
    "no storage server has registered with this metadata server yet";

use crate::cap::{CapKey, Signed, SIGNED_LEN};
use crate::codec::{Dec, Enc};
use crate::error::{Error, Result};
use crate::quota::{Quota, UsageInfo, MAX_QUOTAS};
use crate::types::{
    BlockLoc, ClusterStatus, DrainStatus, NodeInfo, NodeType, RecordLoc, ResizeStatus, ServerSpec,
    Traffic,
};
use bytes::BytesMut;

/// Every metadata request, one row each: its op code (the `kind` of a
/// request frame; append-only, never reused), its constant in [`op`], its
/// [`MetaRequest`] variant, its name in metrics and logs, the largest
/// payload a metadata server takes for it, and the [`MetaReply`] variant
/// that answers it. [`op`], [`op::name`], [`MetaRequest::op`],
/// [`max_request_len`] and the choice of reply decoder in
/// [`MetaReply::decode`] are all derived from this one table, so a new
/// request is one row here plus its variant, its encoding and its
/// decoding (ARCHITECTURE.md, *Adding a metadata request*).
macro_rules! meta_ops {
    ($($CONST:ident = $code:literal, $Variant:ident, $name:literal, $max:expr => $Reply:ident;)*) => {
        /// Operation codes of metadata requests (the `kind` of a request
        /// frame), from the table of `meta_ops!`.
        pub mod op {
            $(pub const $CONST: u16 = $code;)*

            /// Every op code this build knows, in the table's order.
            pub const ALL: &[u16] = &[$($CONST),*];

            /// The request's name in metrics and logs (`"other"` for a
            /// number this build does not know).
            pub fn name(op: u16) -> &'static str {
                match op {
                    $($CONST => $name,)*
                    _ => "other",
                }
            }
        }

        /// The largest payload a metadata server takes for a request of
        /// kind `op`: no request needs more than a few KiB, so a larger
        /// frame is refused from its header, before any of it is buffered
        /// (`docs/security.md`, *Limits*).
        pub fn max_request_len(op: u16) -> usize {
            match op {
                $(op::$CONST => $max,)*
                _ => SMALL_REQUEST_MAX,
            }
        }

        impl MetaRequest {
            pub fn op(&self) -> u16 {
                match self {
                    $(MetaRequest::$Variant { .. } => op::$CONST,)*
                }
            }
        }

        /// Which reply variant answers a request of kind `op`.
        fn reply_kind(op: u16) -> Option<ReplyKind> {
            match op {
                $(op::$CONST => Some(ReplyKind::$Reply),)*
                _ => None,
            }
        }
    };
}

meta_ops! {
    CREATE = 1, Create, "create", PATH_REQUEST_MAX => Node;
    LOOKUP = 2, Lookup, "lookup", PATH_REQUEST_MAX => Node;
    REMOVE = 3, Remove, "remove", PATH_REQUEST_MAX => Record;
    MOVE = 4, Move, "move", PATH_REQUEST_MAX => Moved;
    ENUMERATE = 5, Enumerate, "enumerate", PATH_REQUEST_MAX => Listing;
    MAP = 6, Map, "map", SMALL_REQUEST_MAX => Blocks;
    OPEN_WRITE = 7, OpenWrite, "open_write", PATH_REQUEST_MAX => Node;
    SYNC = 8, Sync, "sync", SMALL_REQUEST_MAX => Record;
    REGISTER = 9, Register, "register", LARGE_REQUEST_MAX => Registered;
    HEARTBEAT = 10, Heartbeat, "heartbeat", SMALL_REQUEST_MAX => Done;
    STATUS = 11, Status, "status", SMALL_REQUEST_MAX => Status;
    RELEASE_SLOT = 12, ReleaseSlot, "release_slot", SMALL_REQUEST_MAX => Done;
    RECORD_NAMES = 13, RecordNames, "record_names", 8 + 4 + 4 * MAX_RECORD_NAMES => Names;
    LOCAL_SOCKET = 14, LocalSocket, "local_socket", SMALL_REQUEST_MAX => LocalSocket;
    ABORT = 15, Abort, "abort", SMALL_REQUEST_MAX => Done;
    REPLACE_BLOCK = 16, ReplaceBlock, "replace_block", SMALL_REQUEST_MAX => Blocks;
    SNAPSHOT_BEGIN = 17, SnapshotBegin, "snapshot_begin", PATH_REQUEST_MAX => SnapshotBegun;
    SNAPSHOT_LIST = 18, SnapshotList, "snapshot_list", SMALL_REQUEST_MAX => SnapshotPage;
    SNAPSHOT_LOCATE = 19, SnapshotLocate, "snapshot_locate", SMALL_REQUEST_MAX => Located;
    SNAPSHOT_END = 20, SnapshotEnd, "snapshot_end", SMALL_REQUEST_MAX => Done;
    DRAIN = 21, Drain, "drain", SMALL_REQUEST_MAX => Drain;
    POLICY = 22, Policy, "policy", LARGE_REQUEST_MAX => Policy;
    RESIZE = 23, Resize, "resize", SMALL_REQUEST_MAX => Resized;
    TRUNCATE = 24, Truncate, "truncate", SMALL_REQUEST_MAX => Done;
    SET_ATTRS = 25, SetAttrs, "set_attrs", PATH_REQUEST_MAX => Node;
    RENEW = 26, Renew, "renew", 4 + 16 * MAX_RENEW_BATCH => Renewed;
    OUTGROW = 27, Outgrow, "outgrow", SMALL_REQUEST_MAX => Blocks;
    RESERVE = 28, Reserve, "reserve", PATH_REQUEST_MAX => Reserved;
    LINK = 29, Link, "link", PATH_REQUEST_MAX => Record;
    RECORD_AT = 30, RecordAt, "record_at", PATH_REQUEST_MAX => Record;
    SESSION_OPEN = 31, SessionOpen, "session_open", SMALL_REQUEST_MAX => Session;
    SESSION_RENEW = 32, SessionRenew, "session_renew", SMALL_REQUEST_MAX => Session;
    QUOTA_SET = 33, QuotaSet, "quota_set", PATH_REQUEST_MAX => Usage;
    USAGE = 34, Usage, "usage", PATH_REQUEST_MAX => Usage;
    QUOTAS = 35, Quotas, "quotas", SMALL_REQUEST_MAX => Quotas;
    SESSION_CLOSE = 36, SessionClose, "session_close", SMALL_REQUEST_MAX => Done;
    SESSION_BIND = 37, SessionBind, "session_bind", PATH_REQUEST_MAX => Done;
}

/// Shortest lease a session may ask for: its client renews it a few
/// times per lease, so a shorter one would cost more requests than it
/// saves waiting (`docs/lifecycle.md`, *Sessions*).
pub const MIN_SESSION_LEASE_MS: u64 = 1_000;

/// Longest lease a session may ask for: how long what a dead client bound
/// may outlive it.
pub const MAX_SESSION_LEASE_MS: u64 = 3_600_000;

/// Most puts one `Reserve` request reserves.
pub const MAX_RESERVE: u32 = 64;

/// Most policy settings one request may change.
pub const MAX_POLICY_SETS: usize = 64;

/// Most blocks one map request may ask for.
pub const MAX_MAP_COUNT: u32 = 1024;

/// Most record slots one `RecordNames` request may name (a client asks
/// in batches).
pub const MAX_RECORD_NAMES: usize = 16 * 1024;

/// Largest payload of a metadata request that names paths: two paths of
/// [`MAX_PATH_LEN`](crate::path::MAX_PATH_LEN) (a move's source and
/// destination; a create's path and location), and room for the rest.
pub const PATH_REQUEST_MAX: usize = 2 * (4 + crate::path::MAX_PATH_LEN) + 1024;

/// Largest payload of a metadata request that names no path: numbers, a
/// server's identity or address.
pub const SMALL_REQUEST_MAX: usize = 4 * 1024;

/// Largest payload of a registration or a policy change.
pub const LARGE_REQUEST_MAX: usize = 64 * 1024;

/// Most write leases one `Renew` request renews.
pub const MAX_RENEW_BATCH: usize = 1024;

/// One node of a snapshot's frozen listing (`docs/snapshots.md`), as a
/// [`MetaReply::SnapshotPage`] carries it. A node with many blocks is
/// split over several entries with the same `index` (and increasing
/// `first_block`), each carrying some of its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// The entry's number in the listing (parents come before children).
    pub index: u64,
    /// Path relative to the snapshot's root, components joined by `/`;
    /// empty for the root itself.
    pub path: String,
    pub ty: NodeType,
    pub enumerable: bool,
    pub storage_class: u8,
    /// The node id at the snapshot's start.
    pub node: u64,
    /// Published size at the snapshot's start (data nodes; 0 for
    /// containers).
    pub size: u64,
    /// Bytes per block of the node (a small value's piece capacity; for
    /// an encrypted node, the plaintext capacity).
    pub block_size: u32,
    /// The node is encrypted ([`NodeInfo::encrypted`](crate::NodeInfo)).
    pub encrypted: bool,
    /// Index of `blocks[0]` among the node's blocks.
    pub first_block: u64,
    /// Block locations at the snapshot's start (a small value's piece:
    /// one location with its offset and tag).
    pub blocks: Vec<BlockLoc>,
}

impl SnapshotEntry {
    /// Encoded length without the path and the blocks.
    const MIN_LEN: usize = 8 + 4 + 1 + 1 + 1 + 8 + 8 + 4 + 1 + 8 + 4;

    /// Bytes this entry takes encoded (for page budgets).
    pub fn encoded_len(&self) -> usize {
        Self::MIN_LEN
            + self.path.len()
            + self
                .blocks
                .iter()
                .map(|b| BlockLoc::MIN_LEN + b.addr.len())
                .sum::<usize>()
    }

    fn encode(&self, e: &mut Enc) {
        e.u64(self.index)
            .str(&self.path)
            .u8(self.ty as u8)
            .bool(self.enumerable)
            .u8(self.storage_class)
            .u64(self.node)
            .u64(self.size)
            .u32(self.block_size)
            .bool(self.encrypted)
            .u64(self.first_block)
            .u32(self.blocks.len() as u32);
        for b in &self.blocks {
            b.encode(e);
        }
    }

    fn decode(d: &mut Dec) -> Result<SnapshotEntry> {
        let index = d.u64()?;
        let path = d.string()?;
        let ty = NodeType::from_u8(d.u8()?)?;
        let enumerable = d.bool()?;
        let storage_class = d.u8()?;
        let node = d.u64()?;
        let size = d.u64()?;
        let block_size = d.u32()?;
        let encrypted = d.bool()?;
        let first_block = d.u64()?;
        let n = d.count(BlockLoc::MIN_LEN)?;
        let mut blocks = Vec::with_capacity(n);
        for _ in 0..n {
            blocks.push(BlockLoc::decode(d)?);
        }
        Ok(SnapshotEntry {
            index,
            path,
            ty,
            enumerable,
            storage_class,
            node,
            size,
            block_size,
            encrypted,
            first_block,
            blocks,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaRequest {
    /// Create a node. Data nodes (File, KeyValue) come back with a write
    /// lease held by the caller.
    Create {
        path: String,
        ty: NodeType,
        storage_class: u8,
        location: String,
        enumerable: bool,
        /// The size the writer will write, when it knows it (a KeyValue
        /// put); 0 when unknown. A small known size gets a piece of a
        /// shared block instead of a block of its own, and the node can
        /// then never grow past the piece (`docs/small-values.md`).
        size_hint: u64,
        /// Tier migration never moves the node's blocks (e.g. broadcast
        /// data that must stay in DRAM).
        pinned: bool,
        /// Permission bits (at most [`MAX_MODE`]).
        mode: u32,
        /// Modification time, nanoseconds since the Unix epoch (the
        /// client's clock: the metadata server reads none).
        mtime: u64,
        /// For a File: if a File already exists at `path`, take its write
        /// lease instead (as [`MetaRequest::OpenWrite`]) and append to it,
        /// so a writer that may have to create its File makes one call.
        /// Another node type at `path` is still `AlreadyExists`.
        open_existing: bool,
        /// Time to live in milliseconds (`docs/lifecycle.md`): the node
        /// (with its subtree) expires this long after the create. 0: the
        /// parent's child TTL, if it has one; [`TTL_NEVER`]: never, even
        /// under a parent with a child TTL. At most [`MAX_TTL_MS`].
        ttl_ms: u64,
        /// For a container: the TTL its new children get when their create
        /// names none (0: none). At most [`MAX_TTL_MS`].
        child_ttl_ms: u64,
        /// The session the node is bound to, if any: it is removed, with
        /// its subtree, when that session ends or its lease lapses
        /// (`docs/lifecycle.md`, *Sessions*).
        session: Option<SessionRef>,
    },
    Lookup {
        path: String,
    },
    Remove {
        path: String,
        recursive: bool,
    },
    /// With `replace`, an existing `dst` of the same type (a data node, or
    /// an empty container) is removed in the same step: the rename of
    /// POSIX. Without, an existing `dst` is `AlreadyExists`.
    Move {
        src: String,
        dst: String,
        replace: bool,
    },
    Enumerate {
        path: String,
    },
    /// Map block indexes `[index, index + count)` of a node to block
    /// locations. With `alloc`, missing blocks are allocated (the caller must
    /// hold the write lease); without it, only existing blocks are returned.
    ///
    /// `first_write` (0: none) is the length of a File writer's first
    /// write, at offset 0 of a File with nothing allocated: if it fits a
    /// piece, block 0 becomes a piece of a shared block sized for it
    /// (`docs/small-values.md`, *Small Files*); the writer learns it from
    /// the location's tag, and calls `Outgrow` before writing past it.
    Map {
        node: u64,
        index: u64,
        count: u32,
        alloc: bool,
        lease: u64,
        first_write: u32,
    },
    /// The writer of a File in a piece is about to write past it: block 0
    /// gets a whole block of its own, and the reply is its location. The
    /// writer copies what it wrote to the piece into it; readers keep
    /// reading the piece until the writer's next sync publishes the block.
    Outgrow {
        node: u64,
        lease: u64,
    },
    /// Reserves `count` puts of values of up to `size_hint` bytes (a size
    /// that fits a piece), for a put that then costs one exchange: each is
    /// a KeyValue put created ahead of its path, with its piece and write
    /// lease, in storage class `storage_class` (or the root's), placed as a
    /// create with `location` would be. The writer writes a value into one
    /// and closes it with [`MetaRequest::Link`]; one it does not use is
    /// dropped with its piece when its lease lapses, like any put whose
    /// client went away. At most [`MAX_RESERVE`]
    /// (`docs/small-values.md`, *Puts in one exchange*).
    Reserve {
        size_hint: u64,
        count: u32,
        storage_class: u8,
        location: String,
    },
    /// Closes a reserved put at `size` bytes (its [`MetaRequest::Sync`]
    /// with `close`) and makes it the value at `path`, replacing the one
    /// there. A table whose values go to another storage class than the
    /// reservation's, or are encrypted when it is not, is
    /// `InvalidArgument`: the writer puts the value the usual way.
    Link {
        node: u64,
        lease: u64,
        size: u64,
        mtime: u64,
        path: String,
    },
    /// Take the write lease of an existing File or KeyValue.
    OpenWrite {
        path: String,
    },
    /// Publish `size` (making bytes up to it visible to readers) and renew
    /// the lease; with `close`, also release it. A non-zero `mtime` becomes
    /// the node's modification time.
    Sync {
        node: u64,
        lease: u64,
        size: u64,
        close: bool,
        mtime: u64,
    },
    /// A storage server announces its blocks.
    Register(ServerSpec),
    /// A registered storage server is alive; it reports its cumulative
    /// counters. Signed with its capability key.
    Heartbeat {
        server: u32,
        traffic: Traffic,
        signed: Signed,
    },
    Status,
    /// The caller cleared the record in `slot` of `container` (after a
    /// remove or move handed it out): the slot may be reused.
    ReleaseSlot {
        container: u64,
        slot: u32,
    },
    /// Names of live children in the given record slots: the fallback for
    /// slots whose record could not be read (lost with a storage server, or
    /// not written yet).
    RecordNames {
        container: u64,
        slots: Vec<u32>,
    },
    /// Where the record in `slot` of `container` is now, for a writer
    /// whose record write was refused as `Stale` (the shared block of the
    /// record's piece got a new generation meanwhile, as the small values
    /// sharing it come and go): the write is tried again there. `name` is
    /// the child whose record it writes (the slot must still be that
    /// child's), or empty for a clear (the slot must still be being
    /// cleared). Answered with no location when the slot is no longer so,
    /// or while the record's block moves.
    RecordAt {
        container: u64,
        slot: u32,
        name: String,
    },
    /// The abstract Unix socket this server also listens on, for clients
    /// on the same host (empty payload).
    LocalSocket,
    /// The writer gives up: a KeyValue put that has not closed is dropped
    /// with its blocks; any other node keeps its published size, gives back
    /// the blocks beyond it and loses its write lease.
    Abort {
        node: u64,
        lease: u64,
    },
    /// The writer could not reach the storage server of block `index`
    /// (whose location had generation `gen`): give that block a new place
    /// on another server. Only for a block the writer holds every byte of
    /// (nothing of it was published); the reply is `Blocks` with the new
    /// location.
    ReplaceBlock {
        node: u64,
        lease: u64,
        index: u64,
        gen: u64,
    },
    /// Starts a snapshot of the subtree at `path`: the server freezes its
    /// listing and keeps the blocks of its data nodes from being reused
    /// until the snapshot ends (`docs/snapshots.md`).
    SnapshotBegin {
        path: String,
    },
    /// The snapshot's listing from entry `entry` (and that entry's block
    /// `block` on); renews the snapshot.
    SnapshotList {
        id: u64,
        entry: u64,
        block: u64,
    },
    /// The current location of block `block` of `server`, block `index` of
    /// `node` when the snapshot began (its generation changed: fenced,
    /// freed and held, moved); renews the snapshot.
    SnapshotLocate {
        id: u64,
        node: u64,
        index: u64,
        server: u32,
        block: u32,
    },
    /// Ends the snapshot: its blocks may be reused.
    SnapshotEnd {
        id: u64,
    },
    /// Renews write leases (node, lease id) that their client still holds,
    /// publishing nothing (a client renews the leases of its open writers
    /// a few times per lease, so a writer that pauses keeps its node). At
    /// most [`MAX_RENEW_BATCH`].
    Renew {
        leases: Vec<(u64, u64)>,
    },
    /// Starts draining storage server `server` (its identity or its
    /// registered address): it gets no new blocks, and every block it holds
    /// in this partition is moved to other servers. Asked again, reports the
    /// progress; with `cancel`, stops the drain and gives the server back
    /// to placement.
    Drain {
        server: String,
        cancel: bool,
    },
    /// Reads the tiering and placement policy, after changing the given
    /// settings (key, value) in order: all or none (`nk policy`).
    Policy {
        set: Vec<(String, String)>,
    },
    /// Storage server `server` (its identity or registered address) now
    /// exports only `blocks` of its blocks in this partition (dynamic
    /// capacity, `docs/tiering.md`): free blocks leave at once, blocks in
    /// use move to other servers first. Asked again, reports the progress.
    /// Sent by the storage server itself, signed with its capability key.
    Resize {
        server: String,
        blocks: u32,
        signed: Signed,
    },
    /// The writer shrinks its node to `size` bytes (at most its published
    /// size): the size is published at once and the blocks past it are
    /// freed. A non-zero `mtime` becomes the modification time. (Growing is
    /// writing: the client appends zeros.)
    Truncate {
        node: u64,
        lease: u64,
        size: u64,
        mtime: u64,
    },
    /// Changes the permission bits, the modification time, the expiry
    /// and/or the child TTL of the node at `path`; the reply is the node
    /// as it is now.
    SetAttrs {
        path: String,
        mode: Option<u32>,
        mtime: Option<u64>,
        /// The node expires this many milliseconds from now (1 to
        /// [`MAX_TTL_MS`]), or never ([`TTL_NEVER`]).
        ttl_ms: Option<u64>,
        /// A container's TTL for new children (0: none; at most
        /// [`MAX_TTL_MS`]).
        child_ttl_ms: Option<u64>,
    },
    /// Opens a session (`docs/lifecycle.md`, *Sessions*): nodes created
    /// bound to it are removed when it ends, or when `lease_ms` passes
    /// with no renewal. `secret` is the client's random proof of
    /// ownership, which renewing and closing it must show. The lease is
    /// clamped to [`MIN_SESSION_LEASE_MS`]..=[`MAX_SESSION_LEASE_MS`];
    /// the reply says what was given.
    SessionOpen {
        secret: u128,
        lease_ms: u64,
    },
    /// Renews a session's lease; `NotFound` once it has ended.
    SessionRenew {
        id: u64,
        secret: u128,
    },
    /// Ends a session: what is bound to it is removed.
    SessionClose {
        id: u64,
        secret: u128,
    },
    /// Binds the existing node at `path` to a session, as a create with
    /// the session would have (a file a mount hides while it is open, so
    /// it goes if the mount dies).
    SessionBind {
        id: u64,
        secret: u128,
        path: String,
    },
    /// Sets the quota of the container at `path` (`nk quota set`):
    /// limits on the storage its subtree holds and on the nodes below it
    /// ([`NO_LIMIT`](crate::quota::NO_LIMIT) for none; both none clears
    /// it). A limit below what the subtree holds already is kept: only
    /// growth is refused. The reply is the container's usage.
    QuotaSet {
        path: String,
        quota: Quota,
    },
    /// The disk usage of the subtree at `path` (`nk du`), from the
    /// incremental accounting: no walk.
    Usage {
        path: String,
    },
    /// Every quota root of this partition with its usage (at most
    /// [`MAX_QUOTAS`]).
    Quotas,
}

/// A TTL meaning "never expires" (in a create: not even under a parent
/// with a child TTL; in `SetAttrs`: the expiry is cleared).
pub const TTL_NEVER: u64 = u64::MAX;

/// The longest TTL a node may carry: about 100 years, in milliseconds
/// (expiry times are wall-clock milliseconds and must not overflow).
pub const MAX_TTL_MS: u64 = 100 * 366 * 24 * 3600 * 1000;

/// The permission bits a node keeps (`rwx` for user, group and others,
/// plus set-user-id, set-group-id and sticky).
pub const MAX_MODE: u32 = 0o7777;

impl MetaRequest {
    /// A storage server's signed request (`Heartbeat`, `Resize`): the
    /// bytes its signature covers (the payload before it) and the
    /// signature. `None` for every other request.
    pub fn signature(&self) -> Option<(BytesMut, Signed)> {
        let signed = match self {
            MetaRequest::Heartbeat { signed, .. } | MetaRequest::Resize { signed, .. } => *signed,
            _ => return None,
        };
        let mut buf = BytesMut::new();
        self.encode(&mut buf);
        buf.truncate(buf.len() - SIGNED_LEN);
        Some((buf, signed))
    }

    /// Signs a storage server's request with its capability key `key` and
    /// the sequence number `seq` (see [`Signed`]); other requests are left
    /// alone.
    pub fn sign(&mut self, key: &CapKey, seq: u64) {
        let op = self.op();
        let Some((fields, _)) = self.signature() else {
            return;
        };
        let new = Signed::sign(key, op, &fields, seq);
        if let MetaRequest::Heartbeat { signed, .. } | MetaRequest::Resize { signed, .. } = self {
            *signed = new;
        }
    }

    /// Whether this is a storage server's request signed with `key`.
    pub fn signed_with(&self, key: &CapKey) -> bool {
        self.signature()
            .is_some_and(|(fields, s)| s.verify(key, self.op(), &fields))
    }

    /// Appends the payload (not the frame header).
    pub fn encode(&self, buf: &mut BytesMut) {
        let e = &mut Enc(buf);
        match self {
            MetaRequest::Create {
                path,
                ty,
                storage_class,
                location,
                enumerable,
                size_hint,
                pinned,
                mode,
                mtime,
                open_existing,
                ttl_ms,
                child_ttl_ms,
                session,
            } => {
                e.str(path)
                    .u8(*ty as u8)
                    .u8(*storage_class)
                    .str(location)
                    .bool(*enumerable)
                    .u64(*size_hint)
                    .bool(*pinned)
                    .u32(*mode)
                    .u64(*mtime)
                    .bool(*open_existing)
                    .u64(*ttl_ms)
                    .u64(*child_ttl_ms);
                match session {
                    None => {
                        e.u64(0);
                    }
                    Some(s) => {
                        e.u64(s.id);
                        put_secret(e, s.secret);
                    }
                }
            }
            MetaRequest::SessionOpen { secret, lease_ms } => {
                put_secret(e, *secret);
                e.u64(*lease_ms);
            }
            MetaRequest::SessionRenew { id, secret } | MetaRequest::SessionClose { id, secret } => {
                e.u64(*id);
                put_secret(e, *secret);
            }
            MetaRequest::SessionBind { id, secret, path } => {
                e.u64(*id);
                put_secret(e, *secret);
                e.str(path);
            }
            MetaRequest::Lookup { path }
            | MetaRequest::Enumerate { path }
            | MetaRequest::OpenWrite { path }
            | MetaRequest::SnapshotBegin { path } => {
                e.str(path);
            }
            MetaRequest::Remove { path, recursive } => {
                e.str(path).bool(*recursive);
            }
            MetaRequest::Move { src, dst, replace } => {
                e.str(src).str(dst).bool(*replace);
            }
            MetaRequest::Map {
                node,
                index,
                count,
                alloc,
                lease,
                first_write,
            } => {
                e.u64(*node)
                    .u64(*index)
                    .u32(*count)
                    .bool(*alloc)
                    .u64(*lease)
                    .u32(*first_write);
            }
            MetaRequest::Outgrow { node, lease } => {
                e.u64(*node).u64(*lease);
            }
            MetaRequest::Reserve {
                size_hint,
                count,
                storage_class,
                location,
            } => {
                e.u64(*size_hint)
                    .u32(*count)
                    .u8(*storage_class)
                    .str(location);
            }
            MetaRequest::Link {
                node,
                lease,
                size,
                mtime,
                path,
            } => {
                e.u64(*node).u64(*lease).u64(*size).u64(*mtime).str(path);
            }
            MetaRequest::Sync {
                node,
                lease,
                size,
                close,
                mtime,
            } => {
                e.u64(*node).u64(*lease).u64(*size).bool(*close).u64(*mtime);
            }
            MetaRequest::Register(spec) => spec.encode(e),
            MetaRequest::Heartbeat {
                server,
                traffic,
                signed,
            } => {
                e.u32(*server);
                traffic.encode(e);
                signed.encode(e);
            }
            MetaRequest::Status | MetaRequest::LocalSocket | MetaRequest::Quotas => {}
            MetaRequest::QuotaSet { path, quota } => {
                e.str(path);
                quota.encode(e);
            }
            MetaRequest::Usage { path } => {
                e.str(path);
            }
            MetaRequest::ReleaseSlot { container, slot } => {
                e.u64(*container).u32(*slot);
            }
            MetaRequest::RecordAt {
                container,
                slot,
                name,
            } => {
                e.u64(*container).u32(*slot).str(name);
            }
            MetaRequest::RecordNames { container, slots } => {
                e.u64(*container).u32(slots.len() as u32);
                for s in slots {
                    e.u32(*s);
                }
            }
            MetaRequest::Abort { node, lease } => {
                e.u64(*node).u64(*lease);
            }
            MetaRequest::ReplaceBlock {
                node,
                lease,
                index,
                gen,
            } => {
                e.u64(*node).u64(*lease).u64(*index).u64(*gen);
            }
            MetaRequest::SnapshotList { id, entry, block } => {
                e.u64(*id).u64(*entry).u64(*block);
            }
            MetaRequest::SnapshotLocate {
                id,
                node,
                index,
                server,
                block,
            } => {
                e.u64(*id).u64(*node).u64(*index).u32(*server).u32(*block);
            }
            MetaRequest::SnapshotEnd { id } => {
                e.u64(*id);
            }
            MetaRequest::Renew { leases } => {
                e.u32(leases.len() as u32);
                for (node, lease) in leases {
                    e.u64(*node).u64(*lease);
                }
            }
            MetaRequest::Drain { server, cancel } => {
                e.str(server).bool(*cancel);
            }
            MetaRequest::Policy { set } => {
                e.u32(set.len() as u32);
                for (k, v) in set {
                    e.str(k).str(v);
                }
            }
            MetaRequest::Resize {
                server,
                blocks,
                signed,
            } => {
                e.str(server).u32(*blocks);
                signed.encode(e);
            }
            MetaRequest::Truncate {
                node,
                lease,
                size,
                mtime,
            } => {
                e.u64(*node).u64(*lease).u64(*size).u64(*mtime);
            }
            MetaRequest::SetAttrs {
                path,
                mode,
                mtime,
                ttl_ms,
                child_ttl_ms,
            } => {
                e.str(path);
                match mode {
                    Some(m) => e.bool(true).u32(*m),
                    None => e.bool(false),
                };
                for t in [mtime, ttl_ms, child_ttl_ms] {
                    match t {
                        Some(t) => e.bool(true).u64(*t),
                        None => e.bool(false),
                    };
                }
            }
        }
    }

    /// Decodes a request payload. Unknown ops and malformed payloads give
    /// `Protocol` errors.
    pub fn decode(opcode: u16, payload: &[u8]) -> Result<MetaRequest> {
        let d = &mut Dec::new(payload, "metadata request");
        let req = match opcode {
            op::CREATE => MetaRequest::Create {
                path: d.string()?,
                ty: NodeType::from_u8(d.u8()?)?,
                storage_class: d.u8()?,
                location: d.string()?,
                enumerable: d.bool()?,
                size_hint: d.u64()?,
                pinned: d.bool()?,
                mode: d.u32()?,
                mtime: d.u64()?,
                open_existing: d.bool()?,
                ttl_ms: d.u64()?,
                child_ttl_ms: d.u64()?,
                session: match d.u64()? {
                    0 => None,
                    id => Some(SessionRef {
                        id,
                        secret: secret(d)?,
                    }),
                },
            },
            op::SESSION_OPEN => MetaRequest::SessionOpen {
                secret: secret(d)?,
                lease_ms: d.u64()?,
            },
            op::SESSION_RENEW => MetaRequest::SessionRenew {
                id: d.u64()?,
                secret: secret(d)?,
            },
            op::SESSION_CLOSE => MetaRequest::SessionClose {
                id: d.u64()?,
                secret: secret(d)?,
            },
            op::SESSION_BIND => MetaRequest::SessionBind {
                id: d.u64()?,
                secret: secret(d)?,
                path: d.string()?,
            },
            op::LOOKUP => MetaRequest::Lookup { path: d.string()? },
            op::ENUMERATE => MetaRequest::Enumerate { path: d.string()? },
            op::OPEN_WRITE => MetaRequest::OpenWrite { path: d.string()? },
            op::REMOVE => MetaRequest::Remove {
                path: d.string()?,
                recursive: d.bool()?,
            },
            op::MOVE => MetaRequest::Move {
                src: d.string()?,
                dst: d.string()?,
                replace: d.bool()?,
            },
            op::MAP => MetaRequest::Map {
                node: d.u64()?,
                index: d.u64()?,
                count: d.u32()?,
                alloc: d.bool()?,
                lease: d.u64()?,
                first_write: d.u32()?,
            },
            op::OUTGROW => MetaRequest::Outgrow {
                node: d.u64()?,
                lease: d.u64()?,
            },
            op::RESERVE => {
                let (size_hint, count) = (d.u64()?, d.u32()?);
                if count > MAX_RESERVE {
                    return Err(Error::protocol(format!(
                        "{count} puts reserved in one request (at most {MAX_RESERVE})"
                    )));
                }
                MetaRequest::Reserve {
                    size_hint,
                    count,
                    storage_class: d.u8()?,
                    location: d.string()?,
                }
            }
            op::LINK => MetaRequest::Link {
                node: d.u64()?,
                lease: d.u64()?,
                size: d.u64()?,
                mtime: d.u64()?,
                path: d.string()?,
            },
            op::SYNC => MetaRequest::Sync {
                node: d.u64()?,
                lease: d.u64()?,
                size: d.u64()?,
                close: d.bool()?,
                mtime: d.u64()?,
            },
            op::REGISTER => MetaRequest::Register(ServerSpec::decode(d)?),
            op::HEARTBEAT => MetaRequest::Heartbeat {
                server: d.u32()?,
                traffic: Traffic::decode(d)?,
                signed: Signed::decode(d)?,
            },
            op::STATUS => MetaRequest::Status,
            op::LOCAL_SOCKET => MetaRequest::LocalSocket,
            op::QUOTA_SET => MetaRequest::QuotaSet {
                path: d.string()?,
                quota: Quota::decode(d)?,
            },
            op::USAGE => MetaRequest::Usage { path: d.string()? },
            op::QUOTAS => MetaRequest::Quotas,
            op::RELEASE_SLOT => MetaRequest::ReleaseSlot {
                container: d.u64()?,
                slot: d.u32()?,
            },
            op::RECORD_NAMES => {
                let container = d.u64()?;
                let n = d.count(4)?;
                if n > MAX_RECORD_NAMES {
                    return Err(Error::protocol(format!(
                        "names of {n} record slots asked in one request (at most \
                         {MAX_RECORD_NAMES})"
                    )));
                }
                let mut slots = Vec::with_capacity(n);
                for _ in 0..n {
                    slots.push(d.u32()?);
                }
                MetaRequest::RecordNames { container, slots }
            }
            op::RECORD_AT => MetaRequest::RecordAt {
                container: d.u64()?,
                slot: d.u32()?,
                name: d.string()?,
            },
            op::ABORT => MetaRequest::Abort {
                node: d.u64()?,
                lease: d.u64()?,
            },
            op::REPLACE_BLOCK => MetaRequest::ReplaceBlock {
                node: d.u64()?,
                lease: d.u64()?,
                index: d.u64()?,
                gen: d.u64()?,
            },
            op::SNAPSHOT_BEGIN => MetaRequest::SnapshotBegin { path: d.string()? },
            op::SNAPSHOT_LIST => MetaRequest::SnapshotList {
                id: d.u64()?,
                entry: d.u64()?,
                block: d.u64()?,
            },
            op::SNAPSHOT_LOCATE => MetaRequest::SnapshotLocate {
                id: d.u64()?,
                node: d.u64()?,
                index: d.u64()?,
                server: d.u32()?,
                block: d.u32()?,
            },
            op::SNAPSHOT_END => MetaRequest::SnapshotEnd { id: d.u64()? },
            op::DRAIN => MetaRequest::Drain {
                server: d.string()?,
                cancel: d.bool()?,
            },
            op::POLICY => {
                let n = d.count(8)?;
                if n > MAX_POLICY_SETS {
                    return Err(Error::protocol(format!(
                        "{n} policy settings in one request (at most {MAX_POLICY_SETS})"
                    )));
                }
                let mut set = Vec::with_capacity(n);
                for _ in 0..n {
                    set.push((d.string()?, d.string()?));
                }
                MetaRequest::Policy { set }
            }
            op::RESIZE => MetaRequest::Resize {
                server: d.string()?,
                blocks: d.u32()?,
                signed: Signed::decode(d)?,
            },
            op::TRUNCATE => MetaRequest::Truncate {
                node: d.u64()?,
                lease: d.u64()?,
                size: d.u64()?,
                mtime: d.u64()?,
            },
            op::SET_ATTRS => MetaRequest::SetAttrs {
                path: d.string()?,
                mode: if d.bool()? { Some(d.u32()?) } else { None },
                mtime: if d.bool()? { Some(d.u64()?) } else { None },
                ttl_ms: if d.bool()? { Some(d.u64()?) } else { None },
                child_ttl_ms: if d.bool()? { Some(d.u64()?) } else { None },
            },
            op::RENEW => {
                let n = d.count(16)?;
                if n > MAX_RENEW_BATCH {
                    return Err(Error::protocol(format!(
                        "a renewal of {n} leases exceeds the limit of {MAX_RENEW_BATCH}"
                    )));
                }
                let mut leases = Vec::with_capacity(n);
                for _ in 0..n {
                    leases.push((d.u64()?, d.u64()?));
                }
                MetaRequest::Renew { leases }
            }

            other => return Err(Error::protocol(format!("unknown metadata op {other}"))),
        };
        if d.remaining() != 0 {
            return Err(Error::protocol(format!(
                "metadata request op {opcode}: {} trailing bytes",
                d.remaining()
            )));
        }
        Ok(req)
    }
}

/// A session's secret as the wire carries it: two little-endian halves.
fn secret(d: &mut Dec) -> Result<u128> {
    let lo = d.u64()?;
    Ok(u128::from(lo) | u128::from(d.u64()?) << 64)
}

fn put_secret(e: &mut Enc, secret: u128) {
    e.u64(secret as u64).u64((secret >> 64) as u64);
}

/// A session as a create names it, to bind the node to it: its id (never
/// 0) and the secret that proves the creator holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionRef {
    pub id: u64,
    pub secret: u128,
}

/// Successful replies; which variant answers which op is fixed by the
/// table of `meta_ops!` (its last column).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaReply {
    /// The node (a create, lookup, open or attribute change).
    Node(NodeInfo),
    /// A session opened or renewed: its id and the lease it was given.
    Session { id: u64, lease_ms: u64 },
    /// Nothing to report.
    Done,
    /// Remove: the record to clear; Sync: the record to write (a closed
    /// KeyValue that took a new slot).
    Record(Option<RecordLoc>),
    /// Move: the source record to clear, the destination record to write,
    /// and the record of the node it replaced, to clear.
    Moved {
        ty: NodeType,
        clear: Option<RecordLoc>,
        write: Option<RecordLoc>,
        replaced: Option<RecordLoc>,
    },
    /// Enumerate: the container id, where its records live (extents of
    /// `block_size`-byte blocks, the first ones pieces when `pieces`:
    /// [`crate::record::Layout`]), its number of record slots (its data is
    /// `slots * RECORD_SIZE` bytes) and the live-slot bitmap (bit `i` of
    /// byte `i / 8`), the authority on which records are live.
    Listing {
        container: u64,
        block_size: u32,
        pieces: bool,
        slots: u32,
        live: Vec<u8>,
    },
    /// Map, ReplaceBlock: the node's published size and the requested
    /// block locations.
    Blocks { size: u64, blocks: Vec<BlockLoc> },
    /// RecordNames: (slot, type, name) of each requested slot that is live.
    Names(Vec<(u32, NodeType, String)>),
    /// Register.
    Registered { server: u32 },
    /// Status.
    Status(ClusterStatus),
    /// LocalSocket: the abstract socket name, empty when there is none.
    LocalSocket(String),
    /// SnapshotBegin: the snapshot's id and its number of entries.
    SnapshotBegun { id: u64, entries: u64 },
    /// SnapshotList: entries from the cursor on, and where the next page
    /// starts (`next_entry` = the number of entries when done).
    SnapshotPage {
        entries: Vec<SnapshotEntry>,
        next_entry: u64,
        next_block: u64,
    },
    /// SnapshotLocate: the block's current location.
    Located(BlockLoc),
    /// Drain: the drain's progress in this partition.
    Drain(DrainStatus),
    /// Policy: every setting as (key, value), after the change.
    Policy(Vec<(String, String)>),
    /// Resize: where the resize stands in this partition.
    Resized(ResizeStatus),
    /// Renew: how long a lease lasts (ms), and the nodes of the leases
    /// that are no longer held (taken over, lapsed, closed).
    Renewed { lease_ms: u64, lost: Vec<u64> },
    /// Reserve: how long a lease lasts (ms: a reserved put not linked by
    /// then is dropped), and the reserved puts, each a node with its write
    /// lease and its piece (`first_block`); fewer than asked when space
    /// ran out or a new slab was started.
    Reserved { lease_ms: u64, puts: Vec<NodeInfo> },
    /// QuotaSet, Usage: the subtree's usage and quota.
    Usage(UsageInfo),
    /// Quotas: every quota root with its usage, in path order.
    Quotas(Vec<UsageInfo>),
}

impl MetaReply {
    pub fn encode(&self, buf: &mut BytesMut) {
        let e = &mut Enc(buf);
        match self {
            MetaReply::Node(n) => n.encode(e),
            MetaReply::Done => {}
            MetaReply::Record(r) => RecordLoc::encode_opt(r, e),
            MetaReply::Moved {
                ty,
                clear,
                write,
                replaced,
            } => {
                e.u8(*ty as u8);
                RecordLoc::encode_opt(clear, e);
                RecordLoc::encode_opt(write, e);
                RecordLoc::encode_opt(replaced, e);
            }
            MetaReply::Listing {
                container,
                block_size,
                pieces,
                slots,
                live,
            } => {
                e.u64(*container)
                    .u32(*block_size)
                    .bool(*pieces)
                    .u32(*slots)
                    .bytes(live);
            }
            MetaReply::Blocks { size, blocks } => {
                e.u64(*size).u32(blocks.len() as u32);
                for b in blocks {
                    b.encode(e);
                }
            }
            MetaReply::Names(names) => {
                e.u32(names.len() as u32);
                for (slot, ty, name) in names {
                    e.u32(*slot).u8(*ty as u8).str(name);
                }
            }
            MetaReply::Registered { server } => {
                e.u32(*server);
            }
            MetaReply::Status(s) => s.encode(e),
            MetaReply::LocalSocket(name) => {
                e.str(name);
            }
            MetaReply::SnapshotBegun { id, entries } => {
                e.u64(*id).u64(*entries);
            }
            MetaReply::SnapshotPage {
                entries,
                next_entry,
                next_block,
            } => {
                e.u64(*next_entry)
                    .u64(*next_block)
                    .u32(entries.len() as u32);
                for en in entries {
                    en.encode(e);
                }
            }
            MetaReply::Located(loc) => loc.encode(e),
            MetaReply::Drain(s) => s.encode(e),
            MetaReply::Policy(set) => {
                e.u32(set.len() as u32);
                for (k, v) in set {
                    e.str(k).str(v);
                }
            }
            MetaReply::Resized(s) => s.encode(e),
            MetaReply::Session { id, lease_ms } => {
                e.u64(*id).u64(*lease_ms);
            }
            MetaReply::Reserved { lease_ms, puts } => {
                e.u64(*lease_ms).u32(puts.len() as u32);
                for n in puts {
                    n.encode(e);
                }
            }
            MetaReply::Renewed { lease_ms, lost } => {
                e.u64(*lease_ms).u32(lost.len() as u32);
                for n in lost {
                    e.u64(*n);
                }
            }
            MetaReply::Usage(u) => u.encode(e),
            MetaReply::Quotas(all) => {
                e.u32(all.len() as u32);
                for u in all {
                    u.encode(e);
                }
            }
        }
    }

    /// Decodes the successful reply to a request with op code `opcode`.
    pub fn decode(opcode: u16, payload: &[u8]) -> Result<MetaReply> {
        let mut d = Dec::new(payload, "metadata reply");
        let Some(kind) = reply_kind(opcode) else {
            return Err(Error::protocol(format!(
                "reply to unknown metadata op {opcode}"
            )));
        };
        let reply = match kind {
            ReplyKind::Node => MetaReply::Node(NodeInfo::decode(&mut d)?),
            ReplyKind::Done => MetaReply::Done,
            ReplyKind::Record => MetaReply::Record(RecordLoc::decode_opt(&mut d)?),
            ReplyKind::Moved => MetaReply::Moved {
                ty: NodeType::from_u8(d.u8()?)?,
                clear: RecordLoc::decode_opt(&mut d)?,
                write: RecordLoc::decode_opt(&mut d)?,
                replaced: RecordLoc::decode_opt(&mut d)?,
            },
            ReplyKind::Listing => {
                let container = d.u64()?;
                let block_size = d.u32()?;
                let pieces = d.bool()?;
                let slots = d.u32()?;
                let live = d.bytes()?.to_vec();
                if live.len() != (slots as usize).div_ceil(8) {
                    return Err(Error::protocol(format!(
                        "listing of {slots} slots carries a {}-byte bitmap",
                        live.len()
                    )));
                }
                MetaReply::Listing {
                    container,
                    block_size,
                    pieces,
                    slots,
                    live,
                }
            }
            ReplyKind::Blocks => {
                let size = d.u64()?;
                let n = d.count(BlockLoc::MIN_LEN)?;
                let mut blocks = Vec::with_capacity(n);
                for _ in 0..n {
                    blocks.push(BlockLoc::decode(&mut d)?);
                }
                MetaReply::Blocks { size, blocks }
            }
            ReplyKind::Names => {
                let n = d.count(4 + 1 + 4)?;
                let mut names = Vec::with_capacity(n);
                for _ in 0..n {
                    names.push((d.u32()?, NodeType::from_u8(d.u8()?)?, d.string()?));
                }
                MetaReply::Names(names)
            }
            ReplyKind::Registered => MetaReply::Registered { server: d.u32()? },
            ReplyKind::Status => MetaReply::Status(ClusterStatus::decode(&mut d)?),
            ReplyKind::LocalSocket => MetaReply::LocalSocket(crate::store::check_socket_name(
                d.string()?,
                "local socket",
            )?),
            ReplyKind::SnapshotBegun => MetaReply::SnapshotBegun {
                id: d.u64()?,
                entries: d.u64()?,
            },
            ReplyKind::SnapshotPage => {
                let next_entry = d.u64()?;
                let next_block = d.u64()?;
                let n = d.count(SnapshotEntry::MIN_LEN)?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    entries.push(SnapshotEntry::decode(&mut d)?);
                }
                MetaReply::SnapshotPage {
                    entries,
                    next_entry,
                    next_block,
                }
            }
            ReplyKind::Located => MetaReply::Located(BlockLoc::decode(&mut d)?),
            ReplyKind::Renewed => {
                let lease_ms = d.u64()?;
                let n = d.count(8)?;
                let mut lost = Vec::with_capacity(n);
                for _ in 0..n {
                    lost.push(d.u64()?);
                }
                MetaReply::Renewed { lease_ms, lost }
            }
            ReplyKind::Reserved => {
                let lease_ms = d.u64()?;
                let n = d.count(NodeInfo::MIN_LEN)?;
                if n > MAX_RESERVE as usize {
                    return Err(Error::protocol(format!(
                        "{n} reserved puts in one reply (at most {MAX_RESERVE})"
                    )));
                }
                let mut puts = Vec::with_capacity(n);
                for _ in 0..n {
                    puts.push(NodeInfo::decode(&mut d)?);
                }
                MetaReply::Reserved { lease_ms, puts }
            }
            ReplyKind::Drain => MetaReply::Drain(DrainStatus::decode(&mut d)?),
            ReplyKind::Policy => {
                let n = d.count(8)?;
                let mut set = Vec::with_capacity(n);
                for _ in 0..n {
                    set.push((d.string()?, d.string()?));
                }
                MetaReply::Policy(set)
            }
            ReplyKind::Resized => MetaReply::Resized(ResizeStatus::decode(&mut d)?),
            ReplyKind::Session => MetaReply::Session {
                id: d.u64()?,
                lease_ms: d.u64()?,
            },
            ReplyKind::Usage => MetaReply::Usage(UsageInfo::decode(&mut d)?),
            ReplyKind::Quotas => {
                let n = d.count(UsageInfo::MIN_LEN)?;
                if n > MAX_QUOTAS {
                    return Err(Error::protocol(format!(
                        "{n} quota roots in one reply (at most {MAX_QUOTAS})"
                    )));
                }
                let mut all = Vec::with_capacity(n);
                for _ in 0..n {
                    all.push(UsageInfo::decode(&mut d)?);
                }
                MetaReply::Quotas(all)
            }
        };
        d.finish()?;
        Ok(reply)
    }
}

/// The [`MetaReply`] variants without their data: the last column of the
/// table of `meta_ops!`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReplyKind {
    Node,
    Done,
    Record,
    Moved,
    Listing,
    Blocks,
    Names,
    Registered,
    Status,
    LocalSocket,
    SnapshotBegun,
    SnapshotPage,
    Located,
    Drain,
    Policy,
    Resized,
    Renewed,
    Reserved,
    Session,
    Usage,
    Quotas,
}

#[cfg(test)]
#[path = "meta_tests.rs"]
mod tests;
