//! Values that travel inside messages: node types, node metadata, block
//! locations and cluster status.

use crate::cap::{Cap, CapKey, CAP_LEN};
use crate::codec::{Dec, Enc};
use crate::error::{Error, Result};
use crate::store::{TagCheck, TAG_LEN};

/// "No storage class preference": allocate from the highest-priority class
/// with a free block anywhere in the cluster.
pub const NO_CLASS: u8 = u8::MAX;

/// The five node types of the NodeKernel namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum NodeType {
    Directory = 0,
    File = 1,
    Table = 2,
    KeyValue = 3,
    Bag = 4,
}

impl NodeType {
    pub const ALL: [NodeType; 5] = [
        NodeType::Directory,
        NodeType::File,
        NodeType::Table,
        NodeType::KeyValue,
        NodeType::Bag,
    ];

    pub fn from_u8(v: u8) -> Result<NodeType> {
        NodeType::ALL
            .get(v as usize)
            .copied()
            .ok_or_else(|| Error::protocol(format!("unknown node type {v}")))
    }

    pub fn name(self) -> &'static str {
        match self {
            NodeType::Directory => "Directory",
            NodeType::File => "File",
            NodeType::Table => "Table",
            NodeType::KeyValue => "KeyValue",
            NodeType::Bag => "Bag",
        }
    }

    /// Parses a user-facing type name (`dir`, `directory`, `file`, `table`,
    /// `kv`, `keyvalue`, `bag`), case-insensitively.
    pub fn parse(s: &str) -> Option<NodeType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "dir" | "directory" => NodeType::Directory,
            "file" => NodeType::File,
            "table" => NodeType::Table,
            "kv" | "keyvalue" => NodeType::KeyValue,
            "bag" => NodeType::Bag,
            _ => return None,
        })
    }

    /// Containers hold child records; data nodes hold bytes.
    pub fn is_container(self) -> bool {
        matches!(self, NodeType::Directory | NodeType::Table | NodeType::Bag)
    }

    /// The permission bits of a node created without any: what `mkdir` and
    /// `creat` give under the usual umask 022.
    pub fn default_mode(self) -> u32 {
        if self.is_container() {
            0o755
        } else {
            0o644
        }
    }

    /// The child rule of the node-type table: which types this one may hold.
    pub fn accepts(self, child: NodeType) -> bool {
        match self {
            NodeType::Directory => matches!(
                child,
                NodeType::Directory | NodeType::File | NodeType::Table | NodeType::Bag
            ),
            NodeType::Table => child == NodeType::KeyValue,
            NodeType::Bag => child == NodeType::File,
            NodeType::File | NodeType::KeyValue => false,
        }
    }

    /// A sentence stating the child rule, used in `TypeMismatch` errors.
    pub fn child_rule(self) -> &'static str {
        match self {
            NodeType::Directory => "a Directory can hold Directory, File, Table and Bag nodes",
            NodeType::Table => "a Table can only hold KeyValue nodes",
            NodeType::Bag => "a Bag can only hold File nodes",
            NodeType::File => "a File holds bytes and cannot have children",
            NodeType::KeyValue => "a KeyValue holds bytes and cannot have children",
        }
    }

    /// Whether creating this type on an existing path replaces the old node.
    pub fn replaces_on_create(self) -> bool {
        self == NodeType::KeyValue
    }
}

impl std::fmt::Display for NodeType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where one block of a node lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockLoc {
    /// Storage server id (assigned by the metadata server at registration).
    pub server: u32,
    /// Address of the storage server's data port (`host:port`).
    pub addr: String,
    /// Block index on that server.
    pub block: u32,
    /// Allocation generation of the block; storage servers refuse access with
    /// a different generation, so a stale location can never reach another
    /// node's bytes.
    pub gen: u64,
    /// Storage class (priority) of the server.
    pub class: u8,
    /// Where the node's block starts inside the storage block: 0 for a
    /// block of its own, the piece's offset for a small value sharing the
    /// block with others (see `docs/small-values.md`). Offsets the client
    /// sends to the storage server are relative to the storage block, so
    /// it adds this to its offset inside the node's block.
    pub offset: u32,
    /// A small value's node id, which the [`TAG_LEN`] bytes before
    /// `offset` (the start of its piece) hold while the value lives; 0 for
    /// a block of its own.
    pub tag: u64,
    /// The storage server's permission to touch this block (a small
    /// value: its piece) at `gen` ([`crate::cap`]).
    pub cap: Cap,
}

impl BlockLoc {
    pub(crate) fn encode(&self, e: &mut Enc) {
        e.u32(self.server)
            .str(&self.addr)
            .u32(self.block)
            .u64(self.gen)
            .u8(self.class)
            .u32(self.offset)
            .u64(self.tag);
        self.cap.encode(e);
    }
    pub(crate) const MIN_LEN: usize = 4 + 4 + 4 + 8 + 1 + 4 + 8 + CAP_LEN;
    pub(crate) fn decode(d: &mut Dec) -> Result<BlockLoc> {
        let loc = BlockLoc {
            server: d.u32()?,
            addr: d.string()?,
            block: d.u32()?,
            gen: d.u64()?,
            class: d.u8()?,
            offset: d.u32()?,
            tag: d.u64()?,
            cap: Cap::decode(d)?,
        };
        if loc.tag != 0 && loc.offset < TAG_LEN {
            return Err(Error::protocol(format!(
                "block {} of server {}: a small value at offset {} leaves no room for its tag",
                loc.block, loc.server, loc.offset
            )));
        }
        Ok(loc)
    }

    /// The check of a small value's tag, for reads of it; `None` for a
    /// block of its own.
    pub fn tag_check(&self) -> Option<TagCheck> {
        (self.tag != 0).then(|| TagCheck {
            at: self.offset.saturating_sub(TAG_LEN),
            expect: self.tag,
        })
    }

    /// `offset` inside the node's block as an offset inside the storage
    /// block (`Protocol` if a bad location makes it overflow).
    pub fn storage_offset(&self, offset: u32) -> Result<u32> {
        self.offset.checked_add(offset).ok_or_else(|| {
            crate::Error::protocol(format!(
                "block {} of server {}: offset {offset} past a piece at {} overflows",
                self.block, self.server, self.offset
            ))
        })
    }
}

/// Where a child's record lives in its container's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordLoc {
    /// Container node id (part of the record, see [`crate::record`]).
    pub container: u64,
    pub slot: u32,
    /// The container block holding the record.
    pub block: BlockLoc,
    /// Byte offset of the record inside that block.
    pub offset: u32,
}

impl RecordLoc {
    pub(crate) fn encode(&self, e: &mut Enc) {
        e.u64(self.container).u32(self.slot);
        self.block.encode(e);
        e.u32(self.offset);
    }
    pub(crate) fn decode(d: &mut Dec) -> Result<RecordLoc> {
        Ok(RecordLoc {
            container: d.u64()?,
            slot: d.u32()?,
            block: BlockLoc::decode(d)?,
            offset: d.u32()?,
        })
    }
    pub(crate) fn encode_opt(r: &Option<RecordLoc>, e: &mut Enc) {
        match r {
            Some(r) => {
                e.bool(true);
                r.encode(e);
            }
            None => {
                e.bool(false);
            }
        }
    }
    pub(crate) fn decode_opt(d: &mut Dec) -> Result<Option<RecordLoc>> {
        Ok(if d.bool()? {
            Some(RecordLoc::decode(d)?)
        } else {
            None
        })
    }
}

/// Metadata of one node, as returned by create and lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Unique node id; never reused, so it also identifies this version of a
    /// path (a replaced KeyValue gets a new id).
    pub id: u64,
    pub ty: NodeType,
    /// Published size in bytes (data nodes) or number of live children
    /// (containers).
    pub size: u64,
    pub block_size: u32,
    /// Preferred storage class, or [`NO_CLASS`].
    pub storage_class: u8,
    /// Preferred location class (host), empty for none.
    pub location: String,
    pub enumerable: bool,
    /// Permission bits (at most [`MAX_MODE`](crate::meta::MAX_MODE)).
    pub mode: u32,
    /// Modification time, nanoseconds since the Unix epoch (as the last
    /// writer's or `SetAttrs` caller's clock said).
    pub mtime: u64,
    /// Write lease held by the caller (0 = none). Only set in replies to
    /// create and open-for-write.
    pub lease: u64,
    /// Encrypted by its clients (`docs/encryption.md`): its blocks hold
    /// sealed chunks ([`crate::crypt`]) and `block_size` is the plaintext
    /// capacity of one. Fixed when the node is created.
    pub encrypted: bool,
    /// Location of block 0, saving a round trip on the first read.
    pub first_block: Option<BlockLoc>,
    /// In a create reply: the child record the caller must write into the
    /// parent's data (None for non-enumerable parents and for KeyValues,
    /// whose record is handed out when the put closes).
    pub record: Option<RecordLoc>,
    /// Bytes of the cluster the node takes now: its whole blocks (a
    /// writer's unpublished ones too) or its piece; for a container, the
    /// pieces and blocks of its child records (`docs/records.md`).
    pub stored: u64,
    /// When the node expires (`docs/lifecycle.md`): wall-clock
    /// milliseconds since the Unix epoch, as the metadata server's clock
    /// counts them; 0: never.
    pub expires_ms: u64,
    /// A container's TTL for new children, in milliseconds (0: none).
    pub child_ttl_ms: u64,
}

impl NodeInfo {
    /// Its smallest encoding (empty location, no block, no record).
    pub(crate) const MIN_LEN: usize = 8 + 1 + 8 + 4 + 1 + 4 + 1 + 4 + 8 + 8 + 1 + 1 + 1 + 8 + 8 + 8;

    pub(crate) fn encode(&self, e: &mut Enc) {
        e.u64(self.id)
            .u8(self.ty as u8)
            .u64(self.size)
            .u32(self.block_size)
            .u8(self.storage_class)
            .str(&self.location)
            .bool(self.enumerable)
            .u32(self.mode)
            .u64(self.mtime)
            .u64(self.lease)
            .bool(self.encrypted);
        match &self.first_block {
            Some(b) => {
                e.bool(true);
                b.encode(e);
            }
            None => {
                e.bool(false);
            }
        }
        RecordLoc::encode_opt(&self.record, e);
        e.u64(self.stored)
            .u64(self.expires_ms)
            .u64(self.child_ttl_ms);
    }
    pub(crate) fn decode(d: &mut Dec) -> Result<NodeInfo> {
        Ok(NodeInfo {
            id: d.u64()?,
            ty: NodeType::from_u8(d.u8()?)?,
            size: d.u64()?,
            block_size: d.u32()?,
            storage_class: d.u8()?,
            location: d.string()?,
            enumerable: d.bool()?,
            mode: d.u32()?,
            mtime: d.u64()?,
            lease: d.u64()?,
            encrypted: d.bool()?,
            first_block: if d.bool()? {
                Some(BlockLoc::decode(d)?)
            } else {
                None
            },
            record: RecordLoc::decode_opt(d)?,
            stored: d.u64()?,
            expires_ms: d.u64()?,
            child_ttl_ms: d.u64()?,
        })
    }
}

/// What a storage server announces when it registers: blocks
/// `[first_block, first_block + num_blocks)` of `block_size` bytes at
/// `addr`, in storage class `class`.
///
/// `identity` names the server for good (kept in its data directory, or
/// random for a server without one); `incarnation` is random per process
/// start. The same identity and incarnation registering again is a retry
/// and gets the same id; a new incarnation is a restarted server, whose
/// earlier blocks are gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSpec {
    pub addr: String,
    pub class: u8,
    pub class_name: String,
    pub medium: String,
    pub location: String,
    pub block_size: u32,
    pub first_block: u32,
    pub num_blocks: u32,
    pub identity: String,
    pub incarnation: u64,
    /// The key the server checks data-plane capabilities with
    /// ([`crate::cap`]); the metadata servers sign with it.
    pub cap_key: CapKey,
}

impl ServerSpec {
    pub fn encode(&self, e: &mut Enc) {
        e.str(&self.addr)
            .u8(self.class)
            .str(&self.class_name)
            .str(&self.medium)
            .str(&self.location)
            .u32(self.block_size)
            .u32(self.first_block)
            .u32(self.num_blocks)
            .str(&self.identity)
            .u64(self.incarnation)
            .fixed(&self.cap_key);
    }

    pub fn decode(d: &mut Dec) -> Result<ServerSpec> {
        ServerSpec::decode_keyed(d, true)
    }

    /// Decodes a spec, with its key (`keyed`) or as written before
    /// capabilities: without one (all zeros; no capability verifies until
    /// the server registers again).
    pub fn decode_keyed(d: &mut Dec, keyed: bool) -> Result<ServerSpec> {
        let mut spec = ServerSpec {
            addr: d.string()?,
            class: d.u8()?,
            class_name: d.string()?,
            medium: d.string()?,
            location: d.string()?,
            block_size: d.u32()?,
            first_block: d.u32()?,
            num_blocks: d.u32()?,
            identity: d.string()?,
            incarnation: d.u64()?,
            cap_key: [0; crate::cap::CAP_KEY_LEN],
        };
        if keyed {
            spec.cap_key = d.array()?;
        }
        Ok(spec)
    }
}

/// A storage server's cumulative data-path counters since it started
/// (network requests only), sent with each heartbeat. Soft state on the
/// metadata server, like liveness: the latest report wins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub read_ops: u64,
    pub write_ops: u64,
}

impl Traffic {
    pub const LEN: usize = 4 * 8;
    pub fn encode(&self, e: &mut Enc) {
        e.u64(self.bytes_read)
            .u64(self.bytes_written)
            .u64(self.read_ops)
            .u64(self.write_ops);
    }
    pub fn decode(d: &mut Dec) -> Result<Traffic> {
        Ok(Traffic {
            bytes_read: d.u64()?,
            bytes_written: d.u64()?,
            read_ops: d.u64()?,
            write_ops: d.u64()?,
        })
    }
}

/// One storage server as seen by the metadata server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerStatus {
    pub id: u32,
    pub addr: String,
    pub class: u8,
    pub class_name: String,
    pub medium: String,
    pub location: String,
    pub block_size: u32,
    pub capacity_blocks: u64,
    pub used_blocks: u64,
    pub alive: bool,
    /// Milliseconds since the last heartbeat.
    pub last_seen_ms: u64,
    /// The server's stable identity (see [`ServerSpec::identity`]).
    pub identity: String,
    /// Being drained: it gets no new blocks and its blocks are moving away.
    pub draining: bool,
    /// Its counters as of its last heartbeat (zero before the first).
    pub traffic: Traffic,
}

impl ServerStatus {
    const MIN_LEN: usize = 4 + 4 + 1 + 4 + 4 + 4 + 4 + 8 + 8 + 1 + 8 + 4 + 1 + Traffic::LEN;
    fn encode(&self, e: &mut Enc) {
        e.u32(self.id)
            .str(&self.addr)
            .u8(self.class)
            .str(&self.class_name)
            .str(&self.medium)
            .str(&self.location)
            .u32(self.block_size)
            .u64(self.capacity_blocks)
            .u64(self.used_blocks)
            .bool(self.alive)
            .u64(self.last_seen_ms)
            .str(&self.identity)
            .bool(self.draining);
        self.traffic.encode(e);
    }
    fn decode(d: &mut Dec) -> Result<ServerStatus> {
        Ok(ServerStatus {
            id: d.u32()?,
            addr: d.string()?,
            class: d.u8()?,
            class_name: d.string()?,
            medium: d.string()?,
            location: d.string()?,
            block_size: d.u32()?,
            capacity_blocks: d.u64()?,
            used_blocks: d.u64()?,
            alive: d.bool()?,
            last_seen_ms: d.u64()?,
            identity: d.string()?,
            draining: d.bool()?,
            traffic: Traffic::decode(d)?,
        })
    }
}

/// A storage class as configured on the metadata server.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassInfo {
    pub class: u8,
    pub name: String,
    /// Price of one GiB of this class's capacity (e.g. dollars).
    pub price_per_gib: f64,
    /// Clients encrypt node data before it goes to this class
    /// (`[[class]] encrypt`, `docs/encryption.md`).
    pub encrypt: bool,
}

impl Eq for ClassInfo {}

impl ClassInfo {
    const MIN_LEN: usize = 1 + 4 + 8 + 1;
    fn encode(&self, e: &mut Enc) {
        e.u8(self.class)
            .str(&self.name)
            .u64(self.price_per_gib.to_bits())
            .bool(self.encrypt);
    }
    fn decode(d: &mut Dec) -> Result<ClassInfo> {
        Ok(ClassInfo {
            class: d.u8()?,
            name: d.string()?,
            price_per_gib: f64::from_bits(d.u64()?),
            encrypt: d.bool()?,
        })
    }
}

/// The metadata server's view of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    pub block_size: u32,
    /// Nodes reachable in this metadata partition (the root included).
    pub nodes: u64,
    /// KeyValue puts not closed yet (reserved ones not counted).
    pub puts_in_progress: u64,
    /// Puts that clients reserved ahead of their keys and have not used
    /// yet (`docs/small-values.md`, *Puts in one exchange*): each holds a
    /// piece until it is used, given back or its lease lapses.
    pub reserved_puts: u64,
    /// Removed nodes whose blocks are still being reclaimed.
    pub reclaiming: u64,
    /// This server's partition and the number of partitions.
    pub partition: u32,
    pub partitions: u32,
    /// Live storage servers this metadata server waits for before it calls
    /// itself ready (`meta.expect_servers`).
    pub expected_servers: u32,
    /// Configured storage classes (names and prices).
    pub classes: Vec<ClassInfo>,
    pub servers: Vec<ServerStatus>,
    /// The operation log of each persistent metadata server (none when the
    /// namespace is volatile).
    pub logs: Vec<LogStatus>,
    /// Metadata partitions the client could not reach when it merged the
    /// partitions' views. Filled by the client, never on the wire (a
    /// server always decodes it empty).
    pub unreachable: Vec<PartitionDown>,
    /// Blocks tier migration moved, per class they left.
    pub moves: Vec<ClassMoves>,
    /// How long a write lease lasts without a renewal
    /// (`meta.lease_timeout_ms`; merged: the shortest of the partitions),
    /// so a client that keeps files open for long (`nk mount`) renews in
    /// time.
    pub lease_ms: u64,
}

/// Where a storage server's resize stands in one metadata partition
/// (`MetaRequest::Resize`): of its `max_blocks` there, it exports
/// `exported_blocks` and asked for `target_blocks`; until the two are
/// equal, blocks in use past the target are moving away.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResizeStatus {
    pub partition: u32,
    pub server: u32,
    pub max_blocks: u64,
    pub exported_blocks: u64,
    pub target_blocks: u64,
    pub used_blocks: u64,
}

impl ResizeStatus {
    pub(crate) fn encode(&self, e: &mut Enc) {
        e.u32(self.partition)
            .u32(self.server)
            .u64(self.max_blocks)
            .u64(self.exported_blocks)
            .u64(self.target_blocks)
            .u64(self.used_blocks);
    }
    pub(crate) fn decode(d: &mut Dec) -> Result<ResizeStatus> {
        Ok(ResizeStatus {
            partition: d.u32()?,
            server: d.u32()?,
            max_blocks: d.u64()?,
            exported_blocks: d.u64()?,
            target_blocks: d.u64()?,
            used_blocks: d.u64()?,
        })
    }

    /// Whether the server exports exactly what it asked for.
    pub fn is_done(&self) -> bool {
        self.exported_blocks == self.target_blocks
    }
}

/// Blocks tier migration moved out of one storage class since the
/// metadata server started (`docs/tiering.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassMoves {
    pub class: u8,
    /// Moved down to a slower class (demoted: cold, or making room).
    pub demoted: u64,
    /// Moved up to a faster class (promoted: hot).
    pub promoted: u64,
}

/// A metadata partition that did not answer a status request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionDown {
    pub partition: u32,
    pub addr: String,
    /// Why (the client's error, with its code).
    pub error: String,
}

/// Where a drain stands (`MetaRequest::Drain`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DrainState {
    /// Blocks are still being moved away.
    Draining = 0,
    /// The server holds no block of this partition: it can be stopped.
    Done = 1,
    /// The drain was cancelled: the server takes new blocks again.
    Cancelled = 2,
}

impl DrainState {
    pub fn from_u8(v: u8) -> Result<DrainState> {
        Ok(match v {
            0 => DrainState::Draining,
            1 => DrainState::Done,
            2 => DrainState::Cancelled,
            _ => return Err(Error::protocol(format!("unknown drain state {v}"))),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            DrainState::Draining => "draining",
            DrainState::Done => "done",
            DrainState::Cancelled => "cancelled",
        }
    }
}

/// A drain's progress in one metadata partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainStatus {
    pub partition: u32,
    /// The server's id in this partition.
    pub server: u32,
    pub addr: String,
    pub identity: String,
    pub state: DrainState,
    /// Blocks of this partition the server still holds.
    pub used_blocks: u64,
    /// Blocks moved away since the drain started.
    pub moved_blocks: u64,
    /// Moves that failed (each is tried again).
    pub failed_moves: u64,
    /// Blocks that cannot move yet (e.g. held by a running snapshot).
    pub unmovable: u64,
    /// The last failure or what holds the drain up; empty when nothing.
    pub message: String,
}

impl DrainStatus {
    pub(crate) fn encode(&self, e: &mut Enc) {
        e.u32(self.partition)
            .u32(self.server)
            .str(&self.addr)
            .str(&self.identity)
            .u8(self.state as u8)
            .u64(self.used_blocks)
            .u64(self.moved_blocks)
            .u64(self.failed_moves)
            .u64(self.unmovable)
            .str(&self.message);
    }

    pub(crate) fn decode(d: &mut Dec) -> Result<DrainStatus> {
        Ok(DrainStatus {
            partition: d.u32()?,
            server: d.u32()?,
            addr: d.string()?,
            identity: d.string()?,
            state: DrainState::from_u8(d.u8()?)?,
            used_blocks: d.u64()?,
            moved_blocks: d.u64()?,
            failed_moves: d.u64()?,
            unmovable: d.u64()?,
            message: d.string()?,
        })
    }
}

/// A persistent metadata server's operation log (`docs/persistence.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogStatus {
    pub partition: u32,
    /// `always`, `interval <ms>ms` or `never`.
    pub fsync: String,
    /// The last record written.
    pub records: u64,
    /// The last record the newest checkpoint holds (0: none yet).
    pub checkpoint: u64,
    /// Bytes of log written since the newest checkpoint began.
    pub log_bytes: u64,
}

impl LogStatus {
    const MIN_LEN: usize = 4 + 4 + 24;

    fn encode(&self, e: &mut Enc) {
        e.u32(self.partition)
            .str(&self.fsync)
            .u64(self.records)
            .u64(self.checkpoint)
            .u64(self.log_bytes);
    }

    fn decode(d: &mut Dec) -> Result<LogStatus> {
        Ok(LogStatus {
            partition: d.u32()?,
            fsync: d.string()?,
            records: d.u64()?,
            checkpoint: d.u64()?,
            log_bytes: d.u64()?,
        })
    }
}

impl ClusterStatus {
    /// Whether at least the expected number of storage servers is alive.
    pub fn is_ready(&self) -> bool {
        self.servers.iter().filter(|s| s.alive).count() >= self.expected_servers as usize
    }

    pub(crate) fn encode(&self, e: &mut Enc) {
        e.u32(self.block_size)
            .u64(self.nodes)
            .u64(self.puts_in_progress)
            .u64(self.reclaiming)
            .u32(self.partition)
            .u32(self.partitions)
            .u32(self.expected_servers)
            .u32(self.classes.len() as u32);
        for c in &self.classes {
            c.encode(e);
        }
        e.u32(self.servers.len() as u32);
        for s in &self.servers {
            s.encode(e);
        }
        e.u32(self.logs.len() as u32);
        for l in &self.logs {
            l.encode(e);
        }
        e.u32(self.moves.len() as u32);
        for m in &self.moves {
            e.u8(m.class).u64(m.demoted).u64(m.promoted);
        }
        e.u64(self.lease_ms).u64(self.reserved_puts);
    }
    pub(crate) fn decode(d: &mut Dec) -> Result<ClusterStatus> {
        let block_size = d.u32()?;
        let nodes = d.u64()?;
        let puts_in_progress = d.u64()?;
        let reclaiming = d.u64()?;
        let partition = d.u32()?;
        let partitions = d.u32()?;
        let expected_servers = d.u32()?;
        let n = d.count(ClassInfo::MIN_LEN)?;
        let mut classes = Vec::with_capacity(n);
        for _ in 0..n {
            classes.push(ClassInfo::decode(d)?);
        }
        let n = d.count(ServerStatus::MIN_LEN)?;
        let mut servers = Vec::with_capacity(n);
        for _ in 0..n {
            servers.push(ServerStatus::decode(d)?);
        }
        let n = d.count(LogStatus::MIN_LEN)?;
        let mut logs = Vec::with_capacity(n);
        for _ in 0..n {
            logs.push(LogStatus::decode(d)?);
        }
        let n = d.count(1 + 8 + 8)?;
        let mut moves = Vec::with_capacity(n);
        for _ in 0..n {
            moves.push(ClassMoves {
                class: d.u8()?,
                demoted: d.u64()?,
                promoted: d.u64()?,
            });
        }
        let lease_ms = d.u64()?;
        let reserved_puts = d.u64()?;
        Ok(ClusterStatus {
            block_size,
            nodes,
            puts_in_progress,
            reserved_puts,
            reclaiming,
            partition,
            partitions,
            expected_servers,
            classes,
            servers,
            logs,
            unreachable: Vec::new(),
            moves,
            lease_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_rules_match_the_node_type_table() {
        use NodeType::*;
        let allowed = [
            (Directory, vec![Directory, File, Table, Bag]),
            (File, vec![]),
            (Table, vec![KeyValue]),
            (KeyValue, vec![]),
            (Bag, vec![File]),
        ];
        for (parent, kids) in allowed {
            for child in NodeType::ALL {
                assert_eq!(
                    parent.accepts(child),
                    kids.contains(&child),
                    "{parent} <- {child}"
                );
            }
        }
        assert!(KeyValue.replaces_on_create());
        for t in [Directory, File, Table, Bag] {
            assert!(!t.replaces_on_create());
        }
    }

    #[test]
    fn type_names_parse() {
        for t in NodeType::ALL {
            assert_eq!(NodeType::parse(t.name()), Some(t));
            assert_eq!(NodeType::from_u8(t as u8).unwrap(), t);
        }
        assert!(NodeType::from_u8(5).is_err());
        assert_eq!(NodeType::parse("nope"), None);
    }
}
