//! Effects: the only way the metadata state changes.
//!
//! [`MetaState::decide`](crate::MetaState::decide) looks at the state and a
//! request and returns the effects that carry the request out, without
//! changing anything; [`MetaState::apply_effect`](crate::MetaState::apply_effect)
//! applies one. Effects carry every choice a decision made — node ids,
//! blocks and their generations, lease ids and expiry times, record slots —
//! so applying a list of effects to the state it was decided on always
//! gives the same state, with no clock read and nothing re-decided. That is
//! what an operation log writes (and a replica replays), and what the
//! deterministic simulation checks after every step.
//!
//! The order inside one decision matters: each effect's preconditions hold
//! once the effects before it are applied (e.g. a node's blocks are freed
//! by `BlockFreed` effects before the `Dropped` effect that drops it).

use crate::alloc::BlockRef;
use crate::namespace::{Lease, NewNode, NodeId};
use crate::slab::Piece;
use nodekernel_proto::ServerSpec;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// A node is added, unlinked. A KeyValue put stays unlinked until its
    /// close; any other node is linked by the `Linked` effect that follows.
    NodeCreated(NewNode),
    /// Node `id` is linked into its parent under its name, with record
    /// `slot` (`None` when the parent keeps no records).
    Linked { id: NodeId, slot: Option<u32> },
    /// The closed put `new` takes the place (and record slot) of the
    /// KeyValue `old` at the same path; `old` is dropped.
    Replaced { old: NodeId, new: NodeId },
    /// Node `id` is unlinked from its parent (its record slot is to be
    /// cleared) and its subtree waits in the graveyard until reaped.
    Unlinked { id: NodeId },
    /// Nodes dropped for good, children before parents: reaped nodes and
    /// puts that never closed.
    Dropped { ids: Vec<NodeId> },
    /// Node `id` moves under `parent` as `name`, with record `slot`; its old
    /// record slot is to be cleared.
    Moved {
        id: NodeId,
        parent: NodeId,
        name: String,
        slot: Option<u32>,
    },
    /// A client cleared record `slot` of `container`: it may be reused.
    SlotReleased { container: NodeId, slot: u32 },
    /// `block` (taken from its server's free list) is appended to `node`.
    BlockAdded { node: NodeId, block: BlockRef },
    /// Block `index` of `node` is now `block` (taken from its server's free
    /// list); the one it replaces is freed by its own effect.
    BlockSwapped {
        node: NodeId,
        index: u64,
        block: BlockRef,
    },
    /// `node` keeps only its first `len` blocks (the others were freed).
    BlocksTruncated { node: NodeId, len: u64 },
    /// A block goes back to its server's free list; `block.gen` is the fresh
    /// generation it is claimed with.
    BlockFreed { block: BlockRef },
    /// Block `index` of `node` gets generation `gen` (a fence: every
    /// location with the old generation is refused from now on).
    BlockStamped { node: NodeId, index: u64, gen: u64 },
    /// `node`'s published size.
    SizeSet { node: NodeId, size: u64 },
    /// `node`'s write lease (granted or renewed).
    LeaseSet { node: NodeId, lease: Lease },
    /// `node` has no writer any more.
    LeaseCleared { node: NodeId },
    /// A storage server joins under `id`.
    ServerAdded { id: u32, spec: ServerSpec },
    /// A storage server is gone for good; its blocks are lost.
    ServerRetired { id: u32 },
    /// A known server (same identity and incarnation: it kept its blocks)
    /// registered again from a new address, or after a restart with a new
    /// capability key (`None`: from a log written before keys).
    ServerReaddressed {
        id: u32,
        addr: String,
        cap_key: Option<nodekernel_proto::cap::CapKey>,
    },
    /// A move of block `index` of `node` to `to` (taken from its server's
    /// free list) begins: the block is fenced with generation `fence`, so
    /// its data can be copied while nobody writes it, and maps of it answer
    /// `TryAgain` until the move ends. With `node` =
    /// [`SLAB_MOVE`](crate::state::SLAB_MOVE), the slab that `index` names
    /// moves (fenced by a stamp), and every small value in it follows.
    MoveStarted {
        node: NodeId,
        index: u64,
        to: BlockRef,
        fence: u64,
    },
    /// The move of block `index` of `node` ends: with `done`, the block is
    /// now the move's target (the old one is freed by its own effect);
    /// without, the target is given up (freed by its own effect).
    MoveEnded {
        node: NodeId,
        index: u64,
        done: bool,
    },
    /// `block` (taken from its server's free list) becomes a slab of
    /// `piece_size` pieces, with the block's generation; an `encrypted`
    /// slab holds only encrypted values (`docs/encryption.md`).
    SlabCreated {
        block: BlockRef,
        piece_size: u32,
        encrypted: bool,
    },
    /// `node` takes `piece` (the next free piece of its slab): a small
    /// value's piece, or a container's next record piece.
    PieceTaken { node: NodeId, piece: Piece },
    /// Record piece `index` of container `node` (one on a dead server,
    /// freed by a `PieceFreed` before) is replaced by `piece`, taken as by
    /// `PieceTaken`.
    RecordPieceSwapped {
        node: NodeId,
        index: u32,
        piece: Piece,
    },
    /// `piece` is free again (its old owner is being dropped).
    PieceFreed { piece: Piece },
    /// File `node` leaves its piece (freed by the `PieceFreed` or
    /// `PieceHeld` before): its blocks, filled by its writer since it
    /// outgrew the piece, hold its bytes from now on.
    PieceOutgrown { node: NodeId },
    /// Reserved put `node` (created under the root with no name) is now a
    /// put into Table `parent` under `name`, linked by the effects that
    /// follow (`MetaRequest::Link`).
    Aimed {
        node: NodeId,
        parent: NodeId,
        name: String,
    },
    /// The slab in `block` of `server` gets generation `gen`, claimed on
    /// the server: every location of its pieces with an older generation
    /// is refused from now on.
    SlabStamped { server: u32, block: u32, gen: u64 },
    /// The slab in `block` of `server`, now empty, stops being one; its
    /// block goes back by the `BlockFreed` effect that follows.
    SlabReleased { server: u32, block: u32 },
    /// A block a running snapshot still has to read is freed: it is fenced
    /// with the fresh generation `block.gen` (claimed, so old handles get
    /// `Stale` at once) but *held* instead of going back to the free list,
    /// counted as used, until no snapshot pins it (`docs/snapshots.md`);
    /// then a `BlockFreed` gives it back.
    BlockHeld { block: BlockRef },
    /// A piece a running snapshot still has to read is freed: its tag is
    /// cleared (so its handles get `Stale` at once), but it stays out of
    /// reuse, counted as used, until no snapshot pins it; then a
    /// `PieceFreed` frees it.
    PieceHeld { piece: Piece },
    /// `block` (taken from its server's free list, fenced with the fresh
    /// generation `block.gen`) leaves the capacity its server exports
    /// (dynamic capacity): owned by the balloon until a `BlockFreed` gives
    /// it back.
    Ballooned { block: BlockRef },
    /// Node ids, lease ids and generations continue from at least `floor`
    /// (a restart raises them to the wall clock, so none that a lost log
    /// tail handed out is ever handed out again).
    CountersRaised { floor: u64 },
    /// `node`'s permission bits (at most `MAX_MODE`) and modification time
    /// (nanoseconds since the Unix epoch, as the client's clock said).
    AttrsSet { node: NodeId, mode: u16, mtime: u64 },
    /// `node` expires at `expires_ms` (wall-clock milliseconds since the
    /// Unix epoch; 0: never) and gives new children a TTL of
    /// `child_ttl_ms` (0: none) (`docs/lifecycle.md`).
    LifetimeSet {
        node: NodeId,
        expires_ms: u64,
        child_ttl_ms: u64,
    },
    /// Session `id` is open, proved by `secret`, with a lease of
    /// `lease_ms` (`docs/lifecycle.md`, *Sessions*).
    SessionOpened {
        id: u64,
        secret: u128,
        lease_ms: u64,
    },
    /// Session `id` ended at `at_ms` (wall-clock milliseconds): closed, or
    /// its lease lapsed. The nodes bound to it expire then.
    SessionEnded { id: u64, at_ms: u64 },
    /// `node` is bound to session `session`.
    SessionBound { node: NodeId, session: u64 },
    /// Container `node`'s quota: at most `bytes` of storage held and
    /// `nodes` nodes below it (`NO_LIMIT` for none; both none clears it)
    /// (`docs/lifecycle.md`, *Quotas*).
    QuotaSet {
        node: NodeId,
        bytes: u64,
        nodes: u64,
    },
}
