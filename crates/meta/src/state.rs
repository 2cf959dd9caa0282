//! The metadata state machine: namespace + block allocator + write leases.
//!
//! Requests are carried out in two steps:
//! 1. [`MetaState::decide`] looks at the state and a request (and the time,
//!    passed in) and returns a [`Decision`]: the [`Effect`]s that carry the
//!    request out, or an error — without changing anything. Every check
//!    happens here, so a request either applies fully or not at all.
//! 2. [`MetaState::apply_effect`] applies one effect. It is the only way the
//!    durable state changes, never fails, and returns the block claim (if
//!    any) the shell must send to a storage server.
//!
//! [`MetaState::execute`] does both and builds the reply. Pure: no I/O, no
//! clock (the caller passes `now_ms`), so it is tested directly and driven
//! by the deterministic simulation (`crate::sim`).
//!
//! Soft state is kept apart: the liveness of storage servers (heartbeats,
//! dead, suspect; see [`crate::alloc`]) and the claims waiting to be sent.

use crate::alloc::{BlockAllocator, BlockClaim, BlockRef, Registration};
use crate::effect::Effect;
use crate::namespace::{stale, Lease, Namespace, NewNode, NodeId, Slot, SlotRef, ROOT};
use crate::slab::{piece_size_for, stamp_batch, Piece, Slabs, HELD};
use crate::snapshot::{
    Listed, Snapshot, SnapshotNote, Snapshots, MAX_SNAPSHOTS, MAX_SNAPSHOT_NODES, PAGE_BYTES,
    SNAPSHOT_TTL_MS,
};
use crate::tier::{PlacementPolicy, TierSettings};
use nodekernel_proto::cap::{Cap, Rights, CAP_LIFETIME_SECS};
use nodekernel_proto::crypt;
use nodekernel_proto::meta::{MetaReply, MetaRequest, SnapshotEntry, MAX_MAP_COUNT};
use nodekernel_proto::path;
use nodekernel_proto::record::RECORD_SIZE;
use nodekernel_proto::types::{DrainState, DrainStatus};
use nodekernel_proto::{
    BlockLoc, ClassInfo, ClusterStatus, Error, NodeInfo, NodeType, RecordLoc, Result, NO_CLASS,
};
use std::collections::{BTreeMap, BTreeSet};

mod migrate;
mod resize;
pub use migrate::{Migration, Tiering};

/// Most nodes one reaping step drops (a removed subtree larger than this is
/// reaped in the background, a step per lock hold).
pub const REAP_NODES: usize = 1024;
/// Most blocks one reaping step frees.
pub const REAP_BLOCKS: usize = 8192;

/// Where this metadata server sits among the partitions, and what it waits
/// for before it calls itself ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// This server's partition, `0..partitions`.
    pub partition: u32,
    pub partitions: u32,
    /// Live storage servers needed to be ready.
    pub expected_servers: u32,
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            partition: 0,
            partitions: 1,
            expected_servers: 1,
        }
    }
}

/// A create's options besides path, type and size.
struct NodeFlags<'a> {
    class: u8,
    location: &'a str,
    enumerable: bool,
    pinned: bool,
    mode: u32,
    mtime: u64,
}

/// `mode` as a node keeps it, if it holds only permission bits.
fn check_mode(mode: u32) -> Result<u16> {
    if mode > nodekernel_proto::meta::MAX_MODE {
        return Err(Error::invalid_argument(format!(
            "mode {mode:#o} has bits beyond the permission bits ({:#o})",
            nodekernel_proto::meta::MAX_MODE
        )));
    }
    Ok(mode as u16)
}

/// What a decided request replies, built from the state once its effects
/// are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Reply {
    Node {
        id: NodeId,
        lease: u64,
        record: Option<SlotRef>,
    },
    Done,
    Record(Option<SlotRef>),
    Moved {
        ty: NodeType,
        clear: Option<SlotRef>,
        write: Option<SlotRef>,
        replaced: Option<SlotRef>,
    },
    Listing(NodeId),
    Blocks {
        node: NodeId,
        index: u64,
        count: u64,
        /// Handed out under the write lease: the locations allow writing.
        write: bool,
    },
    Names(Vec<(u32, NodeType, String)>),
    Registered(u32),
    Status,
    LocalSocket,
    SnapshotBegun {
        id: u64,
        entries: u64,
    },
    SnapshotPage {
        id: u64,
        entry: u64,
        block: u64,
    },
    Located(BlockLoc),
    Drain(u32),
    Policy,
    Resized(u32),
    /// The nodes whose leases a renewal found no longer held.
    Renewed(Vec<NodeId>),
}

/// The outcome of [`MetaState::decide`]: what to change, and what to reply
/// once it is changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub effects: Vec<Effect>,
    reply: Reply,
    /// Soft state to record along: a heartbeat from a (re-)registering
    /// server, or a server a client could not reach.
    heartbeat: Option<u32>,
    suspect: Option<u32>,
    /// A snapshot begun, used or ended (`crate::snapshot`).
    snapshot: Option<SnapshotNote>,
    /// A drain started (`true`) or cancelled (`false`).
    drain: Option<(u32, bool)>,
    /// New tiering and placement settings (`MetaRequest::Policy`).
    policy: Option<Box<TierSettings>>,
    /// A server's resize target, in blocks (`MetaRequest::Resize`).
    resize: Option<(u32, u32)>,
    /// A storage server's signed request taken: the server and its
    /// sequence number (`nodekernel_proto::cap::Signed`).
    signed: Option<(u32, u64)>,
}

/// A drain of one storage server (soft state, like liveness: a restarted
/// metadata server forgets it, and `nk drain`, which asks again on every
/// poll, starts it again).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Drain {
    pub moved: u64,
    pub failed: u64,
    pub cancelled: bool,
    /// The last failure, until a move succeeds.
    pub message: String,
}

/// The node id under which slab moves are kept among the block moves (no
/// node ever has it: ids count up from 1): a slab belongs to no node, so
/// the move of the slab in `block` of `server` is keyed `(SLAB_MOVE,
/// slab_move_index(server, block))`.
pub const SLAB_MOVE: NodeId = NodeId::MAX;

/// The move key index of the slab in `block` of `server`.
pub fn slab_move_index(server: u32, block: u32) -> u64 {
    (server as u64) << 32 | block as u64
}

/// What the move keyed `(node, index)` moves, for messages.
pub fn move_name(node: NodeId, index: u64) -> String {
    if node == SLAB_MOVE {
        let (server, block) = slab_of(index);
        format!("the slab (small values) in block {block} of storage server {server}")
    } else {
        format!("block {index} of node {node}")
    }
}

/// The slab (server, block) a slab move key index names.
fn slab_of(index: u64) -> (u32, u32) {
    ((index >> 32) as u32, index as u32)
}

/// A block move in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// Where the block goes.
    pub to: BlockRef,
    /// The generation the block was fenced with when the move started.
    pub fence: u64,
}

/// What a block location handed out lets its holder do, and when it was
/// handed out (this server's clock, ms): see [`MetaState::cap`].
#[derive(Debug, Clone, Copy)]
struct Grant {
    rights: Rights,
    now: u64,
}

impl Grant {
    /// The metadata server's own: claims and copies.
    const MANAGE: Grant = Grant {
        rights: Rights::MANAGE,
        now: 0,
    };

    /// A reader's, or with `write` a writer's, at `now`.
    fn new(write: bool, now: u64) -> Grant {
        Grant {
            rights: if write { Rights::WRITE } else { Rights::READ },
            now,
        }
    }
}

/// The clock capabilities are minted by: this server's wall clock (in ms)
/// when its `now` was 0, and how long a client's capability lives.
#[derive(Debug, Clone, Copy)]
struct CapClock {
    base_ms: u64,
    lifetime_s: u64,
}

/// A request carried out: its reply and the effects applied.
#[derive(Debug)]
pub struct Outcome {
    pub reply: MetaReply,
    pub effects: Vec<Effect>,
}

#[derive(Debug)]
pub struct MetaState {
    ns: Namespace,
    alloc: BlockAllocator,
    /// Blocks shared by small values.
    slabs: Slabs,
    lease_ms: u64,
    next_lease: u64,
    placement: Placement,
    /// Blocks being moved, by (node, index).
    moves: BTreeMap<(NodeId, u64), Move>,
    /// Claims produced by applied effects, for the shell to send.
    claims: Vec<BlockClaim>,
    /// Blocks freed while a snapshot pinned them, by (server, block): their
    /// generation. Held out of the free lists (counted as used) until no
    /// snapshot pins them.
    held: BTreeMap<(u32, u32), u64>,
    /// Blocks withdrawn from their server's exported capacity (dynamic
    /// capacity), by (server, block): their generation.
    ballooned: BTreeMap<(u32, u32), u64>,
    /// The exported size each resizing server asked for, in blocks of
    /// this partition (soft state: the server asks again).
    resize: BTreeMap<u32, u32>,
    /// Running snapshots (soft state).
    snapshots: Snapshots,
    /// Drains by server (soft state).
    drains: BTreeMap<u32, Drain>,
    /// Tier migration (soft state): settings, policy, heat, counters.
    tier: Tiering,
    classes: Vec<ClassInfo>,
    local_socket: String,
    /// The clock capabilities are minted by (set by the shell; the state
    /// reads no clock).
    cap_clock: CapClock,
    /// A deliberately injected bug, to show the simulation catches it.
    #[cfg(test)]
    pub(crate) bug: Option<crate::sim::Bug>,
}

impl MetaState {
    /// `first_gen` seeds block generations (see [`BlockAllocator::new`]).
    pub fn new(block_size: u32, lease_ms: u64, first_gen: u64) -> Self {
        MetaState {
            ns: Namespace::new(),
            alloc: BlockAllocator::new(block_size, first_gen),
            slabs: Slabs::default(),
            lease_ms,
            next_lease: 1,
            placement: Placement::default(),
            moves: BTreeMap::new(),
            claims: Vec::new(),
            held: BTreeMap::new(),
            ballooned: BTreeMap::new(),
            resize: BTreeMap::new(),
            snapshots: Snapshots::default(),
            drains: BTreeMap::new(),
            tier: Tiering::default(),
            classes: Vec::new(),
            local_socket: String::new(),
            cap_clock: CapClock {
                base_ms: 0,
                lifetime_s: CAP_LIFETIME_SECS,
            },
            #[cfg(test)]
            bug: None,
        }
    }

    pub fn ns(&self) -> &Namespace {
        &self.ns
    }

    pub fn alloc(&self) -> &BlockAllocator {
        &self.alloc
    }

    pub fn slabs(&self) -> &Slabs {
        &self.slabs
    }

    /// Running snapshots.
    pub fn snapshots(&self) -> &Snapshots {
        &self.snapshots
    }

    /// Blocks freed while a snapshot pinned them: (server, block) and the
    /// generation they were fenced with.
    pub fn held_blocks(&self) -> impl Iterator<Item = ((u32, u32), u64)> + '_ {
        self.held.iter().map(|(k, g)| (*k, *g))
    }

    /// Liveness (soft state) of the storage servers.
    pub fn alloc_soft(&mut self) -> &mut BlockAllocator {
        &mut self.alloc
    }

    pub fn set_placement(&mut self, p: Placement) {
        self.placement = p;
    }

    pub fn placement(&self) -> Placement {
        self.placement
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
    }

    /// The configured storage classes.
    pub fn classes(&self) -> &[ClassInfo] {
        &self.classes
    }

    /// Sets the clock capabilities are minted by: the wall clock in
    /// milliseconds when `now` was 0, and how long a capability handed to a
    /// client lives (`docs/security.md`).
    pub fn set_cap_clock(&mut self, base_ms: u64, lifetime_s: u64) {
        self.cap_clock = CapClock {
            base_ms,
            lifetime_s,
        };
    }

    /// Sets the abstract Unix socket name the server shell also listens on
    /// (answered by `LocalSocket`; empty for none).
    pub fn set_local_socket(&mut self, name: String) {
        self.local_socket = name;
    }

    pub fn local_socket(&self) -> &str {
        &self.local_socket
    }

    /// Sets the configured storage classes (names and prices).
    pub fn set_classes(&mut self, classes: Vec<ClassInfo>) {
        self.alloc
            .set_sealed(classes.iter().filter(|c| c.encrypt).map(|c| c.class));
        self.classes = classes;
    }

    /// Configured classes, plus any class a storage server registered
    /// without configuration (named after its first server, no price).
    fn class_table(&self, servers: &[nodekernel_proto::ServerStatus]) -> Vec<ClassInfo> {
        let mut out = self.classes.clone();
        for s in servers {
            if !out.iter().any(|c| c.class == s.class) {
                out.push(ClassInfo {
                    class: s.class,
                    name: s.class_name.clone(),
                    price_per_gib: 0.0,
                    encrypt: false,
                });
            }
        }
        out.sort_by_key(|c| c.class);
        out
    }

    /// Claims produced by the effects applied so far; the server shell
    /// sends them to the storage servers.
    pub fn take_claims(&mut self) -> Vec<BlockClaim> {
        std::mem::take(&mut self.claims)
    }

    /// Blocks being moved, by (node, index).
    pub fn moves(&self) -> impl Iterator<Item = ((NodeId, u64), Move)> + '_ {
        self.moves.iter().map(|(k, v)| (*k, *v))
    }

    // ----- executing ---------------------------------------------------------

    /// Decides `req`, applies its effects and builds the reply.
    pub fn execute(&mut self, req: &MetaRequest, now: u64) -> Result<Outcome> {
        let d = self.decide(req, now)?;
        Ok(self.commit(d, now))
    }

    /// [`MetaState::execute`], returning only the reply.
    pub fn apply(&mut self, req: MetaRequest, now: u64) -> Result<MetaReply> {
        self.execute(&req, now).map(|o| o.reply)
    }

    /// Applies a decision's effects and soft-state notes, and builds its
    /// reply.
    pub fn commit(&mut self, d: Decision, now: u64) -> Outcome {
        for e in &d.effects {
            self.apply_effect(e);
        }
        if let Some(id) = d.heartbeat {
            let _ = self.alloc.heartbeat(id, now);
        }
        if let Some(id) = d.suspect {
            self.alloc.suspect(id);
        }
        if let Some((id, seq)) = d.signed {
            let wall_ms = self.cap_clock.base_ms.saturating_add(now);
            self.alloc.accept_signed(id, seq, wall_ms);
        }
        if let Some(note) = d.snapshot {
            self.snapshots.apply(note, now);
        }
        if let Some(p) = d.policy {
            self.alloc
                .set_round_robin(p.placement == PlacementPolicy::RoundRobin);
            self.tier.settings = *p;
        }
        match &d.reply {
            Reply::Node { id, .. } | Reply::Blocks { node: id, .. } => self.touch(*id, now),
            _ => {}
        }
        if let Some((id, target)) = d.resize {
            self.resize.insert(id, target);
            self.note_shrinking(id);
        }
        if let Some((id, on)) = d.drain {
            self.alloc.set_draining(id, on);
            let dr = self.drains.entry(id).or_default();
            if on && dr.cancelled {
                *dr = Drain::default();
            }
            dr.cancelled = !on;
        }
        Outcome {
            reply: self.reply(&d.reply, now),
            effects: d.effects,
        }
    }

    /// Applies one effect: the only way the durable state changes. The
    /// claim an effect needs (a freed, fenced or new container block) is
    /// queued for [`MetaState::take_claims`].
    pub fn apply_effect(&mut self, e: &Effect) {
        match e {
            Effect::NodeCreated(n) => self.ns.insert(n),
            Effect::Linked { id, slot } => self.ns.link(*id, *slot),
            Effect::Replaced { old, new } => self.ns.replace(*old, *new),
            Effect::Unlinked { id } => self.ns.unlink(*id),
            Effect::Dropped { ids } => {
                for id in ids {
                    self.ns.drop_node(*id);
                    self.forget_heat(*id);
                }
            }
            Effect::Moved {
                id,
                parent,
                name,
                slot,
            } => self.ns.move_node(*id, *parent, name, *slot),
            Effect::SlotReleased { container, slot } => self.ns.release_slot(*container, *slot),
            Effect::BlockAdded { node, block } => {
                self.alloc.take(block.server, block.block, block.gen);
                if let Some(n) = self.ns.get_mut(*node) {
                    n.blocks.push(*block);
                    if n.ty.is_container() {
                        self.claim(*block);
                    } else if n.encrypted {
                        self.scrub(*block);
                    }
                }
            }
            Effect::BlockSwapped { node, index, block } => {
                self.alloc.take(block.server, block.block, block.gen);
                if let Some(n) = self.ns.get_mut(*node) {
                    if let Some(b) = n.blocks.get_mut(*index as usize) {
                        *b = *block;
                    }
                    if n.ty.is_container() {
                        self.claim(*block);
                    } else if n.encrypted {
                        self.scrub(*block);
                    }
                }
            }
            Effect::BlocksTruncated { node, len } => {
                if let Some(n) = self.ns.get_mut(*node) {
                    n.blocks.truncate(*len as usize);
                }
            }
            Effect::BlockFreed { block } => {
                self.held.remove(&(block.server, block.block));
                if self
                    .ballooned
                    .remove(&(block.server, block.block))
                    .is_some()
                {
                    self.alloc.unballoon(block.server);
                }
                self.alloc.give_back(block.server, block.block, block.gen);
                self.claim(*block);
            }
            Effect::AttrsSet { node, mode, mtime } => self.ns.set_attrs(*node, *mode, *mtime),
            Effect::Ballooned { block } => {
                self.alloc.balloon(block.server, block.block, block.gen);
                if self.alloc.server(block.server).is_some() {
                    self.ballooned
                        .insert((block.server, block.block), block.gen);
                }
                let queued = self.claims.len();
                self.claim(*block);
                // Its server may give the block's memory back.
                if let Some(c) = self.claims.get_mut(queued) {
                    c.release = true;
                }
            }
            Effect::BlockHeld { block } => {
                // Out of its node, fenced, but not free: a snapshot still
                // reads it.
                self.alloc.bump_gen(block.gen);
                if self.alloc.server(block.server).is_some() {
                    self.held.insert((block.server, block.block), block.gen);
                }
                self.claim(*block);
            }
            Effect::PieceHeld { piece } => {
                // As for a freed piece, its tag is cleared at once; its
                // bytes stay until the snapshot is done with them.
                self.clear_tag(piece);
                self.slabs.hold(piece);
            }
            Effect::BlockStamped { node, index, gen } => {
                self.alloc.bump_gen(*gen);
                let stamped = self.ns.get_mut(*node).and_then(|n| {
                    let b = n.blocks.get_mut(*index as usize)?;
                    b.gen = *gen;
                    Some(*b)
                });
                if let Some(b) = stamped {
                    self.claim(b);
                }
            }
            Effect::SizeSet { node, size } => {
                if let Some(n) = self.ns.get_mut(*node) {
                    n.size = *size;
                }
            }
            Effect::LeaseSet { node, lease } => {
                self.next_lease = self.next_lease.max(lease.id + 1);
                self.ns.set_lease(*node, Some(*lease));
            }
            Effect::LeaseCleared { node } => self.ns.set_lease(*node, None),
            Effect::ServerAdded { id, spec } => self.alloc.add_server(*id, spec, 0),
            Effect::ServerRetired { id } => {
                self.alloc.retire(*id);
                self.drains.remove(id);
                self.slabs.retire_server(*id);
                self.held.retain(|(server, _), _| server != id);
                self.ballooned.retain(|(server, _), _| server != id);
                self.resize.remove(id);
            }
            Effect::ServerReaddressed { id, addr, cap_key } => {
                self.alloc.readdress(*id, addr, cap_key.as_ref())
            }
            Effect::MoveStarted {
                node,
                index,
                to,
                fence,
            } => {
                self.alloc.take(to.server, to.block, to.gen);
                self.moves.insert(
                    (*node, *index),
                    Move {
                        to: *to,
                        fence: *fence,
                    },
                );
                if *node == SLAB_MOVE {
                    let (server, block) = slab_of(*index);
                    self.apply_effect(&Effect::SlabStamped {
                        server,
                        block,
                        gen: *fence,
                    });
                } else {
                    self.apply_effect(&Effect::BlockStamped {
                        node: *node,
                        index: *index,
                        gen: *fence,
                    });
                }
            }
            Effect::MoveEnded { node, index, done } => {
                if let Some(m) = self.moves.remove(&(*node, *index)) {
                    if *done && *node == SLAB_MOVE {
                        let (server, block) = slab_of(*index);
                        let class = self.alloc.server_class(m.to.server).unwrap_or(0);
                        for (i, owner) in self.slabs.relocate(server, block, m.to, class) {
                            if let Some(Some(p)) = self.ns.get_mut(owner).map(|n| n.piece.as_mut())
                            {
                                *p = Piece {
                                    server: m.to.server,
                                    block: m.to.block,
                                    index: i,
                                    size: p.size,
                                };
                            }
                        }
                    } else if *done {
                        if let Some(b) = self
                            .ns
                            .get_mut(*node)
                            .and_then(|n| n.blocks.get_mut(*index as usize))
                        {
                            *b = m.to;
                        }
                    }
                }
            }
            Effect::SlabCreated {
                block,
                piece_size,
                encrypted,
            } => {
                self.alloc.take(block.server, block.block, block.gen);
                let class = self.alloc.server_class(block.server).unwrap_or(0);
                let bs = self.alloc.block_size();
                self.slabs
                    .create(*block, class, *piece_size, bs, *encrypted);
                if *encrypted {
                    self.scrub(*block);
                }
            }
            Effect::PieceTaken { node, piece } => {
                self.slabs.take(piece, *node);
                if let Some(n) = self.ns.get_mut(*node) {
                    n.piece = Some(*piece);
                }
            }
            Effect::PieceFreed { piece } => {
                self.clear_tag(piece);
                self.slabs.free(piece);
            }
            Effect::SlabStamped { server, block, gen } => {
                self.alloc.bump_gen(*gen);
                self.slabs.stamp(*server, *block, *gen);
                self.claim(BlockRef {
                    server: *server,
                    block: *block,
                    gen: *gen,
                });
            }
            Effect::SlabReleased { server, block } => self.slabs.remove(*server, *block),
            Effect::CountersRaised { floor } => {
                self.ns.raise_next_id(*floor);
                self.next_lease = self.next_lease.max(*floor);
                self.alloc.bump_gen(floor.saturating_sub(1));
            }
        }
    }

    /// Queues the claim that clears the tag of a piece whose value is gone
    /// (at the slab's generation now), so its handles get `Stale` at once.
    fn clear_tag(&mut self, piece: &Piece) {
        if let Some(gen) = self.slabs.get(piece.server, piece.block).map(|s| s.gen) {
            self.claim_with(
                BlockRef {
                    server: piece.server,
                    block: piece.block,
                    gen,
                },
                Some(piece.offset()),
            );
        }
    }

    /// Queues a claim of `b` with its generation, if its server is known.
    fn claim(&mut self, b: BlockRef) {
        self.claim_with(b, None);
    }

    /// [`MetaState::claim`] that also clears the tag at `clear_tag_at`.
    fn claim_with(&mut self, b: BlockRef, clear_tag_at: Option<u32>) {
        if let Some(addr) = self.alloc.server_addr(b.server) {
            let key = self.alloc.cap_key(b.server).copied().unwrap_or_default();
            self.claims.push(BlockClaim {
                server: b.server,
                addr: addr.to_string(),
                block: b.block,
                gen: b.gen,
                clear_tag_at,
                release: false,
                scrub: false,
                cap: Cap::mint(
                    &key,
                    b.block,
                    b.gen,
                    0,
                    self.alloc.block_size(),
                    Rights::MANAGE,
                    0,
                ),
            });
        }
    }

    /// Queues the scrub of `b`, just handed to an encrypted node or slab:
    /// zeros over the whole block at the generation just below its own,
    /// which the decision kept unused for it ([`AllocPlan::allocate_data`]).
    /// So nothing of an earlier owner (plaintext of a plain node) can
    /// travel with the block into an encrypted class, and the scrub,
    /// claimed before the reply, can never touch the new owner's bytes:
    /// its first write claims the block with a newer generation.
    ///
    /// [`AllocPlan::allocate_data`]: crate::alloc::AllocPlan::allocate_data
    fn scrub(&mut self, b: BlockRef) {
        let Some(gen) = b.gen.checked_sub(1).filter(|g| *g > 0) else {
            return;
        };
        let queued = self.claims.len();
        self.claim(BlockRef { gen, ..b });
        if let Some(c) = self.claims.get_mut(queued) {
            c.scrub = true;
        }
    }

    // ----- deciding ----------------------------------------------------------

    /// Decides `req` at time `now`: the effects that carry it out, or the
    /// error that refuses it. Changes nothing.
    pub fn decide(&self, req: &MetaRequest, now: u64) -> Result<Decision> {
        let mut d = Draft::new(self);
        let reply = match req {
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
            } => d.create(
                path,
                *ty,
                NodeFlags {
                    class: *storage_class,
                    location,
                    enumerable: *enumerable,
                    pinned: *pinned,
                    mode: *mode,
                    mtime: *mtime,
                },
                *size_hint,
                *open_existing,
                now,
            )?,
            MetaRequest::Lookup { path } => {
                self.check_partition(path)?;
                Reply::Node {
                    id: self.ns.resolve(path)?,
                    lease: 0,
                    record: None,
                }
            }
            MetaRequest::Remove { path, recursive } => d.remove(path, *recursive)?,
            MetaRequest::Move { src, dst, replace } => d.rename(src, dst, *replace)?,
            MetaRequest::Enumerate { path } => {
                self.check_partition(path)?;
                Reply::Listing(self.ns.container(path)?)
            }
            MetaRequest::ReleaseSlot { container, slot } => {
                let n = self.ns.get(*container).ok_or_else(|| stale(*container))?;
                if n.slots.get(*slot) != Some(Slot::Clearing) {
                    return Err(Error::invalid_argument(format!(
                        "slot {slot} of node {container} is not being cleared"
                    )));
                }
                d.push(Effect::SlotReleased {
                    container: *container,
                    slot: *slot,
                });
                Reply::Done
            }
            MetaRequest::RecordNames { container, slots } => {
                let n = self.ns.get(*container).ok_or_else(|| stale(*container))?;
                let names = slots
                    .iter()
                    .filter_map(|slot| match n.slots.get(*slot) {
                        Some(Slot::Live(id)) => {
                            self.ns.get(id).map(|c| (*slot, c.ty, c.name.to_string()))
                        }
                        _ => None,
                    })
                    .collect();
                Reply::Names(names)
            }
            MetaRequest::Map {
                node,
                index,
                count,
                alloc,
                lease,
            } => d.map(*node, *index, *count, alloc.then_some(*lease), now)?,
            MetaRequest::OpenWrite { path } => d.open_write(path, now)?,
            MetaRequest::Sync {
                node,
                lease,
                size,
                close,
                mtime,
            } => d.sync(*node, *lease, *size, *close, *mtime, now)?,
            MetaRequest::Truncate {
                node,
                lease,
                size,
                mtime,
            } => d.truncate_to(*node, *lease, *size, *mtime, now)?,
            MetaRequest::SetAttrs { path, mode, mtime } => d.set_attrs(path, *mode, *mtime)?,
            MetaRequest::Register(spec) => match self.alloc.decide_register(spec)? {
                Registration::Known(id) => {
                    d.heartbeat = Some(id);
                    Reply::Registered(id)
                }
                Registration::New { id, replaces } => {
                    for r in replaces {
                        d.push(Effect::ServerRetired { id: r });
                    }
                    d.push(Effect::ServerAdded {
                        id,
                        spec: spec.clone(),
                    });
                    d.heartbeat = Some(id);
                    Reply::Registered(id)
                }
                Registration::Readdressed { id, replaces } => {
                    for r in replaces {
                        d.push(Effect::ServerRetired { id: r });
                    }
                    d.push(Effect::ServerReaddressed {
                        id,
                        addr: spec.addr.clone(),
                        cap_key: Some(spec.cap_key),
                    });
                    d.heartbeat = Some(id);
                    Reply::Registered(id)
                }
            },
            MetaRequest::Heartbeat { server, signed, .. } => {
                if self.alloc.server(*server).is_none() {
                    return Err(Error::unknown_server(format!(
                        "storage server {server} is not registered"
                    )));
                }
                self.check_signed(*server, req)?;
                d.heartbeat = Some(*server);
                d.signed = Some((*server, signed.seq));
                Reply::Done
            }
            MetaRequest::Status => Reply::Status,
            MetaRequest::Drain { server, cancel } => {
                let id = self.find_server(server)?;
                if !cancel && !self.alloc.is_alive(id) {
                    return Err(Error::data_lost(format!(
                        "storage server {server} is dead: its blocks are lost and cannot be moved; it leaves the cluster after meta.retire_after_ms"
                    )));
                }
                d.drain = Some((id, !cancel));
                Reply::Drain(id)
            }
            MetaRequest::Policy { set } => {
                if !set.is_empty() {
                    let mut next = self.tier.settings.clone();
                    next.apply(set).map_err(Error::invalid_argument)?;
                    d.policy = Some(Box::new(next));
                }
                Reply::Policy
            }
            MetaRequest::Resize {
                server,
                blocks,
                signed,
            } => {
                let id = self.find_server(server)?;
                self.check_signed(id, req)?;
                d.signed = Some((id, signed.seq));
                d.resize(id, *blocks)?;
                Reply::Resized(id)
            }
            MetaRequest::LocalSocket => Reply::LocalSocket,
            MetaRequest::Renew { leases } => {
                let mut lost = Vec::new();
                for &(node, lease) in leases {
                    match d.writable(node, lease) {
                        Ok(_) => d.renew(node, lease, now),
                        Err(_) => lost.push(node),
                    }
                }
                Reply::Renewed(lost)
            }
            MetaRequest::Abort { node, lease } => d.abort(*node, *lease)?,
            MetaRequest::ReplaceBlock {
                node,
                lease,
                index,
                gen,
            } => d.replace_block(*node, *lease, *index, *gen, now)?,
            MetaRequest::SnapshotBegin { path } => d.snapshot_begin(path, now)?,
            MetaRequest::SnapshotList { id, entry, block } => {
                // A cursor past the end gets an empty page (readers use
                // one to keep the snapshot alive).
                self.snapshot(*id)?;
                d.snapshot = Some(SnapshotNote::Renew(*id));
                Reply::SnapshotPage {
                    id: *id,
                    entry: *entry,
                    block: *block,
                }
            }
            MetaRequest::SnapshotLocate {
                id,
                node,
                index,
                server,
                block,
            } => {
                let loc = self.snapshot_locate(*id, *node, *index, *server, *block, now)?;
                d.snapshot = Some(SnapshotNote::Renew(*id));
                Reply::Located(loc)
            }
            MetaRequest::SnapshotEnd { id } => {
                self.snapshot(*id)?;
                d.release_snapshots(&[*id]);
                d.snapshot = Some(SnapshotNote::End(vec![*id]));
                Reply::Done
            }
        };
        Ok(d.finish(reply))
    }

    /// The running snapshot `id`, or the error that says it is gone.
    fn snapshot(&self, id: u64) -> Result<&Snapshot> {
        self.snapshots.get(id).ok_or_else(|| {
            Error::not_found(format!(
                "snapshot {id} is gone (ended, expired after {} s without a call, or the metadata server restarted): start the snapshot again",
                SNAPSHOT_TTL_MS / 1000
            ))
        })
    }

    /// The frozen listing of the subtree at `root`: every linked node,
    /// parents before children, children in name order.
    fn snapshot_listing(&self, root: NodeId) -> Result<Vec<Listed>> {
        let mut out = Vec::new();
        let mut stack: Vec<(NodeId, String)> = vec![(root, String::new())];
        while let Some((id, path)) = stack.pop() {
            let n = self.ns.get(id).ok_or_else(|| stale(id))?;
            if out.len() >= MAX_SNAPSHOT_NODES {
                return Err(Error::invalid_argument(format!(
                    "the subtree has more than {MAX_SNAPSHOT_NODES} nodes, the most one snapshot lists: snapshot parts of it"
                )));
            }
            let (size, blocks, piece) = if n.ty.is_container() {
                for (name, c) in n.children.iter().rev() {
                    let p = if path.is_empty() {
                        name.to_string()
                    } else {
                        format!("{path}/{name}")
                    };
                    stack.push((*c, p));
                }
                (0, Vec::new(), None)
            } else if let Some(p) = n.piece {
                let gen = self.slabs.get(p.server, p.block).map_or(0, |s| s.gen);
                let b = BlockRef {
                    server: p.server,
                    block: p.block,
                    gen,
                };
                (n.size, vec![b], Some(p))
            } else {
                let bs = u64::from(self.block_size_of(n));
                let count = n.size.div_ceil(bs).min(n.blocks.len() as u64) as usize;
                (n.size, n.blocks[..count].to_vec(), None)
            };
            out.push(Listed {
                path: path.into_boxed_str(),
                ty: n.ty,
                enumerable: n.enumerable,
                storage_class: n.storage_class,
                node: id,
                size,
                blocks,
                piece,
                block_size: self.block_size_of(n),
                encrypted: n.encrypted,
            });
        }
        Ok(out)
    }

    /// Where block `block` of `server` (block `index` of `node` when
    /// snapshot `id` began) is now: held, a slab, or still the node's.
    fn snapshot_locate(
        &self,
        id: u64,
        node: NodeId,
        index: u64,
        server: u32,
        block: u32,
        now: u64,
    ) -> Result<BlockLoc> {
        let s = self.snapshot(id)?;
        let key = (server, block);
        let gen = if s.slabs.contains(&key) {
            self.slabs.get(server, block).map(|slab| slab.gen)
        } else if s.blocks.contains(&key) {
            self.held.get(&key).copied().or_else(|| {
                self.ns
                    .get(node)
                    .and_then(|n| n.blocks.get(index as usize))
                    .filter(|b| (b.server, b.block) == key)
                    .map(|b| b.gen)
            })
        } else {
            return Err(Error::invalid_argument(format!(
                "block {block} of storage server {server} is not in snapshot {id}"
            )));
        };
        let gen = gen.ok_or_else(|| {
            Error::data_lost(format!(
                "block {block} of storage server {server} (node {node}) is no longer kept for snapshot {id}: its storage server was retired"
            ))
        })?;
        if !self.alloc.is_alive(server) {
            return Err(Error::unavailable(format!(
                "storage server {server}, which holds block {block} of node {node}, is dead"
            )));
        }
        Ok(self.loc(&BlockRef { server, block, gen }, Grant::new(false, now)))
    }

    /// Ends the snapshots not used for [`SNAPSHOT_TTL_MS`]: their held
    /// blocks and pieces are freed. `None` when none expired.
    pub fn decide_snapshot_expiry(&self, now: u64) -> Option<Decision> {
        let ids = self.snapshots.expired(now);
        if ids.is_empty() {
            return None;
        }
        let mut d = Draft::new(self);
        d.release_snapshots(&ids);
        d.snapshot = Some(SnapshotNote::End(ids));
        Some(d.finish(Reply::Done))
    }

    /// Refuses a path whose top-level name another partition owns (every
    /// partition has a root of its own).
    fn check_partition(&self, p: &str) -> Result<()> {
        let Placement {
            partition,
            partitions,
            ..
        } = self.placement;
        if partitions <= 1 || p == "/" {
            return Ok(());
        }
        let owner = path::partition_of(p, partitions as usize) as u32;
        if owner != partition {
            return Err(Error::wrong_partition(format!(
                "{p} belongs to metadata partition {owner} of {partitions}, but this metadata server is partition {partition}: list the metadata servers in the same order everywhere"
            )));
        }
        Ok(())
    }

    /// Cleans up after writers that vanished, once their lease expired
    /// `grace_ms` ago: puts that never closed are dropped with their
    /// blocks, and every other node's lease *lapses* (`Draft::lapse`:
    /// the blocks past its published size are freed, the rest fenced, the
    /// lease released). At most about [`REAP_BLOCKS`] blocks per decision;
    /// the next sweep goes on. `None` when there is nothing to do.
    pub fn decide_sweep(&self, now: u64, grace_ms: u64) -> Option<Decision> {
        let dead: Vec<NodeId> = self
            .ns
            .shadows()
            .filter(|n| n.lease.is_none_or(|l| l.expires_ms + grace_ms <= now))
            .map(|n| n.id)
            .collect();
        let mut d = Draft::new(self);
        for id in &dead {
            d.free_node_blocks(*id);
        }
        if !dead.is_empty() {
            d.push(Effect::Dropped { ids: dead });
        }
        let mut budget = REAP_BLOCKS;
        let lapsed = now
            .checked_sub(grace_ms)
            .into_iter()
            .flat_map(|at| self.ns.leases_expired_by(at));
        for id in lapsed {
            let Some(n) = self.ns.get(id).filter(|n| n.linked) else {
                // A put (dropped above), or the root of a removed subtree
                // (the reaper frees it).
                continue;
            };
            let cost = n.blocks.len().max(1);
            if cost > budget && budget < REAP_BLOCKS {
                break;
            }
            budget = budget.saturating_sub(cost);
            d.lapse(n);
            d.push(Effect::LeaseCleared { node: id });
        }
        (!d.effects.is_empty()).then(|| d.finish(Reply::Done))
    }

    // ----- persistence -------------------------------------------------------

    /// Replays one record of the operation log: the effects of one
    /// decision, as [`crate::codec::encode_effects`] wrote them. Claims are
    /// not queued again: they went out before the crash or were lost with
    /// it, and generations keep old holders out either way.
    pub fn replay(&mut self, record: &[u8]) -> Result<()> {
        for e in crate::codec::decode_effects(record)? {
            self.apply_effect(&e);
        }
        self.claims.clear();
        Ok(())
    }

    /// The whole durable state as a checkpoint image (`crate::checkpoint`):
    /// one record per node, and the rest (counters, allocator, slabs,
    /// moves) in one part. Leases are kept (a replayed log tail may renew
    /// them), liveness and pending claims are not.
    pub fn checkpoint_image(&self) -> crate::checkpoint::Image {
        let mut image = crate::checkpoint::Image::default();
        let next_id = self.ns.checkpoint_nodes(|id, rec| image.push_node(id, rec));
        let mut buf = bytes::BytesMut::new();
        let e = &mut nodekernel_proto::codec::Enc(&mut buf);
        e.u8(crate::checkpoint::FORMAT)
            .u32(self.alloc.block_size())
            .u64(next_id)
            .u64(self.next_lease);
        self.alloc.checkpoint(e);
        self.slabs.checkpoint(e);
        e.u32(self.moves.len() as u32);
        for ((node, index), m) in &self.moves {
            e.u64(*node)
                .u64(*index)
                .u32(m.to.server)
                .u32(m.to.block)
                .u64(m.to.gen)
                .u64(m.fence);
        }
        for blocks in [&self.held, &self.ballooned] {
            e.u32(blocks.len() as u32);
            for ((server, block), gen) in blocks {
                e.u32(*server).u32(*block).u64(*gen);
            }
        }
        image.state = buf.to_vec();
        image
    }

    /// The state of a checkpoint: `state` and the node records as
    /// [`MetaState::checkpoint_image`] made them. Every storage server
    /// counts as seen at `now`.
    pub fn from_checkpoint(
        lease_ms: u64,
        state: &[u8],
        nodes: impl Iterator<Item = Result<(NodeId, Vec<u8>)>>,
        now: u64,
    ) -> Result<MetaState> {
        let mut dec = nodekernel_proto::codec::Dec::new(state, "checkpointed state");
        let d = &mut dec;
        let format = d.u8()?;
        // Format 1 had no held blocks (no snapshots), format 2 no
        // ballooned ones (no dynamic capacity), format 3 no capability
        // keys, format 4 no slab encryption flags.
        if !(1..=crate::checkpoint::FORMAT).contains(&format) {
            return Err(Error::protocol(format!(
                "checkpoint format {format}; this build reads format {}",
                crate::checkpoint::FORMAT
            )));
        }
        let block_size = d.u32()?;
        let next_id = d.u64()?;
        let next_lease = d.u64()?;
        let alloc = BlockAllocator::from_checkpoint(block_size, d, now, format >= 4)?;
        let slabs = Slabs::from_checkpoint(d, format >= 5)?;
        let n = d.count(40)?;
        let mut moves = BTreeMap::new();
        for _ in 0..n {
            let key = (d.u64()?, d.u64()?);
            let to = BlockRef {
                server: d.u32()?,
                block: d.u32()?,
                gen: d.u64()?,
            };
            moves.insert(
                key,
                Move {
                    to,
                    fence: d.u64()?,
                },
            );
        }
        let mut blocks = |since: u8| -> Result<BTreeMap<(u32, u32), u64>> {
            let mut out = BTreeMap::new();
            if format >= since {
                let n = d.count(16)?;
                for _ in 0..n {
                    out.insert((d.u32()?, d.u32()?), d.u64()?);
                }
            }
            Ok(out)
        };
        let held = blocks(2)?;
        let ballooned = blocks(3)?;
        dec.finish()?;
        let mut st = MetaState::new(block_size, lease_ms, 1);
        st.ns = Namespace::from_checkpoint(next_id, nodes)?;
        st.alloc = alloc;
        st.slabs = slabs;
        st.next_lease = next_lease;
        st.moves = moves;
        st.held = held;
        let mut per_server: BTreeMap<u32, u32> = BTreeMap::new();
        for (server, _) in ballooned.keys() {
            *per_server.entry(*server).or_default() += 1;
        }
        for (server, n) in per_server {
            st.alloc.set_ballooned(server, n);
        }
        st.ballooned = ballooned;
        Ok(st)
    }

    /// After a replay: every known storage server counts as seen `now`,
    /// so it has the usual time to heartbeat (or re-register) before it is
    /// declared dead.
    pub fn restarted(&mut self, now: u64) {
        let ids: Vec<u32> = self.alloc.servers().map(|(id, _)| id).collect();
        for id in ids {
            let _ = self.alloc.heartbeat(id, now);
        }
    }

    /// What a restart changes, decided once the log is replayed (PRODUCT.md
    /// §5): the writers of the old process are gone, so every lease lapses
    /// (`Draft::lapse`: a File open for writing keeps its last synced
    /// size and the blocks it needs, fenced), puts
    /// that never closed are dropped with their blocks, and block moves in
    /// flight are given up. Node ids, lease ids and generations are raised
    /// to `floor` (the server passes wall-clock microseconds): with
    /// `fsync` `interval` or `never`, a machine crash may lose the log's
    /// last records, and what they handed out to clients must never be
    /// handed out again. `None` when there is nothing to change.
    pub fn decide_restart(&self, floor: u64) -> Option<Decision> {
        let mut d = Draft::new(self);
        if self.ns.next_id() < floor || self.next_lease < floor || self.alloc.next_gen() < floor {
            d.push(Effect::CountersRaised { floor });
        }
        let unclosed: BTreeSet<NodeId> = self.ns.shadows().map(|n| n.id).collect();
        for id in &unclosed {
            d.free_node_blocks(*id);
        }
        if !unclosed.is_empty() {
            d.push(Effect::Dropped {
                ids: unclosed.iter().copied().collect(),
            });
        }
        // Every other writer's lease lapses. A node without a lease that
        // still holds blocks past its size (a restart of an older build
        // cleared its lease and kept them) gives them back too. In node
        // order: the generations drawn must not depend on hash order.
        let mut lapsed: Vec<NodeId> = self
            .ns
            .nodes()
            .filter(|n| !unclosed.contains(&n.id) && !n.ty.is_container())
            .filter(|n| n.lease.is_some() || n.blocks.len() as u64 > self.blocks_published(n))
            .map(|n| n.id)
            .collect();
        lapsed.sort_unstable();
        for id in &lapsed {
            let n = self.ns.get(*id).expect("listed above");
            d.lapse(n);
            if n.lease.is_some() {
                d.push(Effect::LeaseCleared { node: n.id });
            }
        }
        let moving: BTreeSet<NodeId> = self.moves.keys().map(|(n, _)| *n).collect();
        for node in moving.difference(&unclosed) {
            if lapsed.binary_search(node).is_err() {
                d.end_moves(*node, 0);
            }
        }
        // Snapshots do not survive a restart: what they held is freed.
        for ((server, block), gen) in &self.held {
            d.release_block(BlockRef {
                server: *server,
                block: *block,
                gen: *gen,
            });
        }
        for ((server, block), slab) in self.slabs.iter() {
            for (index, owner) in slab.owned() {
                if owner == HELD {
                    d.release_piece(Piece {
                        server,
                        block,
                        index,
                        size: slab.piece_size,
                    });
                }
            }
        }
        (!d.effects.is_empty()).then(|| d.finish(Reply::Done))
    }

    /// One bounded step of reaping removed subtrees (at most
    /// [`REAP_NODES`] nodes and [`REAP_BLOCKS`] blocks); `None` when the
    /// graveyard is empty.
    pub fn decide_reap(&self) -> Option<Decision> {
        if self.ns.graveyard_is_empty() {
            return None;
        }
        let mut d = Draft::new(self);
        let roots: Vec<NodeId> = self.ns.graveyard().collect();
        d.reap(&roots, REAP_NODES, REAP_BLOCKS);
        Some(d.finish(Reply::Done))
    }

    /// Retires storage servers dead for longer than `retire_after_ms`: their
    /// blocks are lost for good and they leave status and capacity.
    pub fn decide_retire(&self, now: u64, retire_after_ms: u64) -> Option<Decision> {
        let ids = self.alloc.retirable(now, retire_after_ms);
        if ids.is_empty() {
            return None;
        }
        let mut d = Draft::new(self);
        for id in ids {
            d.push(Effect::ServerRetired { id });
        }
        Some(d.finish(Reply::Done))
    }

    /// Starts moving block `index` of `node` to another server (of `class`,
    /// or of any class when [`NO_CLASS`]). Returns the decision and the move:
    /// (source location at the fence generation, target location).
    pub fn decide_move_start(
        &self,
        node: NodeId,
        index: u64,
        class: u8,
    ) -> Result<(Decision, BlockLoc, BlockLoc)> {
        self.decide_move_start_to(node, index, class, false)
    }

    /// [`MetaState::decide_move_start`]; with `exact`, the target must be
    /// in `class` itself (tier migration), else `NoSpace`.
    pub fn decide_move_start_to(
        &self,
        node: NodeId,
        index: u64,
        class: u8,
        exact: bool,
    ) -> Result<(Decision, BlockLoc, BlockLoc)> {
        if node == SLAB_MOVE {
            return self.decide_slab_move_start(index, class, exact);
        }
        let n = self.ns.get(node).ok_or_else(|| stale(node))?;
        let old = *n
            .blocks
            .get(index as usize)
            .ok_or_else(|| Error::out_of_range(format!("node {node} has no block {index}")))?;
        if self.moves.contains_key(&(node, index)) {
            return Err(Error::busy(format!(
                "block {index} of node {node} is already being moved"
            )));
        }
        if !self.alloc.is_alive(old.server) {
            return Err(Error::data_lost(format!(
                "block {index} of node {node} is on dead storage server {}",
                old.server
            )));
        }
        let mut d = Draft::new(self);
        d.plan.avoid(old.server);
        // A container's child records may go anywhere (docs/encryption.md).
        let sealed_ok = n.encrypted || n.ty.is_container();
        let to = d.plan.allocate_where(class, &n.location, sealed_ok)?;
        self.check_target(to, class, exact)?;
        let fence = d.plan.gen();
        d.push(Effect::MoveStarted {
            node,
            index,
            to,
            fence,
        });
        let src = self.loc(&BlockRef { gen: fence, ..old }, Grant::MANAGE);
        let dst = self.loc(&to, Grant::MANAGE);
        Ok((d.finish(Reply::Done), src, dst))
    }

    /// With `exact`, refuses a move target outside `class`.
    fn check_target(&self, to: BlockRef, class: u8, exact: bool) -> Result<()> {
        if exact && self.alloc.server_class(to.server) != Some(class) {
            return Err(Error::no_space(format!(
                "storage class {class} has no free block to move to"
            )));
        }
        Ok(())
    }

    /// Whether a running snapshot reads the slab in `block` of `server`
    /// (pins one of its pieces, or holds a freed one): it stays put.
    fn slab_pinned(&self, server: u32, block: u32) -> bool {
        self.snapshots.pins_slab(server, block)
            || self
                .slabs
                .get(server, block)
                .is_some_and(|slab| slab.owned().any(|(_, o)| o == HELD))
    }

    /// Whether the slab in `block` of `server` holds encrypted values
    /// only, so it may go to an encrypted class.
    pub(crate) fn slab_encrypted(&self, server: u32, block: u32) -> bool {
        self.slabs.get(server, block).is_some_and(|s| s.encrypted)
    }

    /// Starts moving the slab of move key `index` ([`slab_move_index`]):
    /// like a block move, with every piece's node following it at the end.
    /// A slab holding a piece a snapshot pins (or holds) stays put.
    fn decide_slab_move_start(
        &self,
        index: u64,
        class: u8,
        exact: bool,
    ) -> Result<(Decision, BlockLoc, BlockLoc)> {
        let (server, block) = slab_of(index);
        if self.slabs.get(server, block).is_none() {
            return Err(Error::out_of_range(format!(
                "block {block} of server {server} is no slab"
            )));
        }
        if self.moves.contains_key(&(SLAB_MOVE, index)) {
            return Err(Error::busy(format!(
                "the slab in block {block} of server {server} is already being moved"
            )));
        }
        if self.slab_pinned(server, block) {
            return Err(Error::busy(format!(
                "the slab in block {block} of server {server} holds small values a running snapshot reads"
            )));
        }
        if !self.alloc.is_alive(server) {
            return Err(Error::data_lost(format!(
                "the slab in block {block} of server {server} is on a dead storage server"
            )));
        }
        let mut d = Draft::new(self);
        d.plan.avoid(server);
        let to = d
            .plan
            .allocate_where(class, "", self.slab_encrypted(server, block))?;
        self.check_target(to, class, exact)?;
        let fence = d.plan.gen();
        d.push(Effect::MoveStarted {
            node: SLAB_MOVE,
            index,
            to,
            fence,
        });
        let src = self.loc(
            &BlockRef {
                server,
                block,
                gen: fence,
            },
            Grant::MANAGE,
        );
        let dst = self.loc(&to, Grant::MANAGE);
        Ok((d.finish(Reply::Done), src, dst))
    }

    /// Ends the move of block `index` of `node`: with `copied`, the block
    /// switches to the target and the old one is freed; otherwise (or if the
    /// block changed meanwhile: freed, fenced again) the target is given up.
    /// A slab is given up too when a snapshot began to pin it meanwhile,
    /// and any move whose target server died.
    pub fn decide_move_end(&self, node: NodeId, index: u64, copied: bool) -> Option<Decision> {
        let m = *self.moves.get(&(node, index))?;
        let mut d = Draft::new(self);
        let still_fenced = if node == SLAB_MOVE {
            let (server, block) = slab_of(index);
            self.slabs
                .get(server, block)
                .filter(|s| s.gen == m.fence && !self.slab_pinned(server, block))
                .map(|_| BlockRef {
                    server,
                    block,
                    gen: m.fence,
                })
        } else {
            self.ns
                .get(node)
                .and_then(|n| n.blocks.get(index as usize).copied())
                .filter(|b| b.gen == m.fence)
        };
        // A target that died since the copy holds nothing: the source stays.
        let landed = copied && self.alloc.is_alive(m.to.server);
        match (landed, still_fenced) {
            (true, Some(old)) => {
                d.push(Effect::MoveEnded {
                    node,
                    index,
                    done: true,
                });
                d.free(old);
            }
            _ => {
                d.push(Effect::MoveEnded {
                    node,
                    index,
                    done: false,
                });
                d.free(m.to);
            }
        }
        Some(d.finish(Reply::Done))
    }

    // ----- drains ------------------------------------------------------------

    /// The storage server registered with identity or address `name`.
    /// Checks that `req`, a storage server's signed request about server
    /// `id`, is signed with the key `id` registered and is not a replay
    /// (its sequence number is above the last one taken).
    fn check_signed(&self, id: u32, req: &MetaRequest) -> Result<()> {
        let what = nodekernel_proto::meta::op::name(req.op());
        let key = self.alloc.cap_key(id).ok_or_else(|| {
            Error::unknown_server(format!("storage server {id} is not registered"))
        })?;
        if !req.signed_with(key) {
            return Err(Error::unauthenticated(format!(
                "a {what} for storage server {id} not signed with the key it registered: \
                 only that server can send one"
            )));
        }
        let seq = req.signature().map_or(0, |(_, s)| s.seq);
        let last = self.alloc.last_seq(id);
        if seq <= last {
            return Err(Error::unauthenticated(format!(
                "a {what} for storage server {id} with sequence number {seq}, not above the \
                 last one taken ({last}): a replay"
            )));
        }
        Ok(())
    }

    fn find_server(&self, name: &str) -> Result<u32> {
        self.alloc.find_server(name).ok_or_else(|| {
            Error::unknown_server(format!(
                "no storage server with identity or address {name:?} is registered with metadata partition {} (`nk status` lists them)",
                self.placement.partition
            ))
        })
    }

    /// Up to `limit` blocks (node, index, class to move to, server) held by
    /// servers being drained and not being moved yet, in node order.
    /// Blocks of a node that is gone or whose server is dead are skipped.
    /// Shrinking servers (dynamic capacity) count as drained: their blocks
    /// move until they export no more than they asked for.
    pub fn drain_candidates(&self, limit: usize) -> Vec<(NodeId, u64, u8, u32)> {
        let busy = self.alloc.servers().any(|(id, s)| {
            (self.alloc.is_shrinking(id)
                || (self.alloc.is_draining(id)
                    && !self.drains.get(&id).is_some_and(|d| d.cancelled)))
                && s.used_blocks() > 0
        });
        if !busy {
            return Vec::new();
        }
        let mut out = Vec::new();
        for n in self.ns.nodes() {
            for (i, b) in n.blocks.iter().enumerate() {
                if self.emptying(b.server) && !self.moves.contains_key(&(n.id, i as u64)) {
                    let class = self.alloc.server_class(b.server).unwrap_or(NO_CLASS);
                    out.push((n.id, i as u64, class, b.server));
                }
            }
        }
        // In node order, not the namespace's hash order: the same state
        // picks the same blocks (the simulation replays a seed exactly).
        out.sort_unstable();
        if out.len() >= limit {
            out.truncate(limit);
            return out;
        }
        for ((server, block), slab) in self.slabs.iter() {
            let index = slab_move_index(server, block);
            if self.emptying(server)
                && !self.moves.contains_key(&(SLAB_MOVE, index))
                && !self.slab_pinned(server, block)
            {
                out.push((SLAB_MOVE, index, slab.class, server));
                if out.len() >= limit {
                    return out;
                }
            }
        }
        out
    }

    /// Whether blocks move off `server`: alive, and draining or
    /// shrinking.
    fn emptying(&self, server: u32) -> bool {
        (self.alloc.is_draining(server) || self.alloc.is_shrinking(server))
            && self.alloc.is_alive(server)
    }

    /// Whether the block a drain scan found (`drain_candidates`) still
    /// needs moving: still on `server`, which is still being drained, and
    /// not being moved.
    pub fn drain_still_needs(&self, node: NodeId, index: u64, server: u32) -> bool {
        let on_server = if node == SLAB_MOVE {
            let (s, block) = slab_of(index);
            s == server && self.slabs.get(s, block).is_some()
        } else {
            self.ns
                .get(node)
                .and_then(|n| n.blocks.get(index as usize))
                .is_some_and(|b| b.server == server)
        };
        on_server && self.emptying(server) && !self.moves.contains_key(&(node, index))
    }

    /// Records the outcome of one move of a drain from `server`.
    pub fn note_drain_move(&mut self, server: u32, outcome: std::result::Result<(), String>) {
        if let Some(d) = self.drains.get_mut(&server) {
            match outcome {
                Ok(()) => {
                    d.moved += 1;
                    d.message.clear();
                }
                Err(e) => {
                    d.failed += 1;
                    d.message = e;
                }
            }
        }
    }

    /// The progress of the drain of `id` in this partition.
    pub fn drain_status(&self, id: u32) -> DrainStatus {
        let dr = self.drains.get(&id).cloned().unwrap_or_default();
        let (addr, identity, used) = match self.alloc.server(id) {
            Some(s) => (
                s.spec.addr.clone(),
                s.spec.identity.clone(),
                s.used_blocks(),
            ),
            None => Default::default(),
        };
        let held = self.held.keys().filter(|(s, _)| *s == id).count() as u64;
        let pinned = self
            .slabs
            .iter()
            .filter(|((s, b), _)| *s == id && self.slab_pinned(*s, *b))
            .count() as u64;
        let unmovable = held + pinned;
        let mut message = dr.message.clone();
        if message.is_empty() && unmovable > 0 {
            message = format!(
                "{unmovable} block(s) held or read by running snapshots: they move (or are freed) when the snapshots end"
            );
        }
        let state = if dr.cancelled {
            DrainState::Cancelled
        } else if used == 0 {
            DrainState::Done
        } else {
            DrainState::Draining
        };
        DrainStatus {
            partition: self.placement.partition,
            server: id,
            addr,
            identity,
            state,
            used_blocks: used,
            moved_blocks: dr.moved,
            failed_moves: dr.failed,
            unmovable,
            message,
        }
    }

    // ----- replies -----------------------------------------------------------

    fn reply(&self, r: &Reply, now: u64) -> MetaReply {
        match r {
            Reply::Node { id, lease, record } => {
                let mut info = self.info(*id, *lease, now);
                info.record = record.and_then(|s| self.record_loc(s, now));
                MetaReply::Node(info)
            }
            Reply::Done => MetaReply::Done,
            Reply::Record(r) => MetaReply::Record(r.and_then(|s| self.record_loc(s, now))),
            Reply::Moved {
                ty,
                clear,
                write,
                replaced,
            } => MetaReply::Moved {
                ty: *ty,
                clear: clear.and_then(|s| self.record_loc(s, now)),
                write: write.and_then(|s| self.record_loc(s, now)),
                replaced: replaced.and_then(|s| self.record_loc(s, now)),
            },
            Reply::Listing(id) => {
                let n = self.ns.get(*id);
                MetaReply::Listing {
                    container: *id,
                    block_size: self.alloc.block_size(),
                    slots: n.map_or(0, |n| n.slots.len()),
                    live: n.map_or_else(Vec::new, |n| n.slots.live_bitmap()),
                }
            }
            Reply::Blocks {
                node,
                index,
                count,
                write,
            } => self.blocks_reply(*node, *index, *count, Grant::new(*write, now)),
            Reply::Names(names) => MetaReply::Names(names.clone()),
            Reply::Registered(id) => MetaReply::Registered { server: *id },
            Reply::Status => {
                let servers = self.alloc.status(now);
                let shadows = self.ns.shadow_count() as u64;
                let reclaiming = self.reclaiming();
                MetaReply::Status(ClusterStatus {
                    block_size: self.alloc.block_size(),
                    nodes: (self.ns.len() as u64).saturating_sub(shadows + reclaiming),
                    puts_in_progress: shadows,
                    reclaiming,
                    partition: self.placement.partition,
                    partitions: self.placement.partitions,
                    expected_servers: self.placement.expected_servers,
                    classes: self.class_table(&servers),
                    servers,
                    // The server shell adds its log.
                    logs: Vec::new(),
                    unreachable: Vec::new(),
                    moves: self.tier.moves.values().copied().collect(),
                    lease_ms: self.lease_ms,
                })
            }
            Reply::LocalSocket => MetaReply::LocalSocket(self.local_socket.clone()),
            Reply::Drain(id) => MetaReply::Drain(self.drain_status(*id)),
            Reply::Policy => MetaReply::Policy(self.tier.settings.show()),
            Reply::Resized(id) => MetaReply::Resized(self.resize_status(*id)),
            Reply::Renewed(lost) => MetaReply::Renewed {
                lease_ms: self.lease_ms,
                lost: lost.clone(),
            },
            Reply::SnapshotBegun { id, entries } => MetaReply::SnapshotBegun {
                id: *id,
                entries: *entries,
            },
            Reply::SnapshotPage { id, entry, block } => {
                self.snapshot_page(*id, *entry, *block, now)
            }
            Reply::Located(loc) => MetaReply::Located(loc.clone()),
        }
    }

    /// A page of snapshot `id`'s listing from entry `entry` (its block
    /// `block` on): about [`PAGE_BYTES`] of entries, a node with many
    /// blocks split over pages.
    fn snapshot_page(&self, id: u64, entry: u64, block: u64, now: u64) -> MetaReply {
        let g = Grant::new(false, now);
        let mut entries = Vec::new();
        let (mut e, mut b) = (
            usize::try_from(entry).unwrap_or(usize::MAX),
            usize::try_from(block).unwrap_or(usize::MAX),
        );
        let Some(s) = self.snapshots.get(id) else {
            return MetaReply::SnapshotPage {
                entries,
                next_entry: entry,
                next_block: block,
            };
        };
        let mut bytes = 0;
        while let Some(l) = s.entries.get(e) {
            let mut en = SnapshotEntry {
                index: e as u64,
                path: l.path.to_string(),
                ty: l.ty,
                enumerable: l.enumerable,
                storage_class: l.storage_class,
                node: l.node,
                size: l.size,
                block_size: l.block_size,
                encrypted: l.encrypted,
                first_block: b as u64,
                blocks: Vec::new(),
            };
            bytes += en.encoded_len();
            if bytes > PAGE_BYTES && !entries.is_empty() {
                break;
            }
            while let Some(r) = l.blocks.get(b) {
                if bytes >= PAGE_BYTES && !en.blocks.is_empty() {
                    break;
                }
                let loc = match &l.piece {
                    Some(p) => BlockLoc {
                        offset: p.value_offset(),
                        tag: l.node,
                        ..self.loc_of_range(r, p.offset(), p.offset() + p.size, g)
                    },
                    None => self.loc(r, g),
                };
                bytes += 64 + loc.addr.len();
                en.blocks.push(loc);
                b += 1;
            }
            entries.push(en);
            if b < l.blocks.len() {
                break;
            }
            e += 1;
            b = 0;
            if bytes >= PAGE_BYTES {
                break;
            }
        }
        MetaReply::SnapshotPage {
            entries,
            next_entry: e as u64,
            next_block: b as u64,
        }
    }

    /// Nodes in the graveyard (counted up to a bound, to keep status cheap).
    fn reclaiming(&self) -> u64 {
        self.ns
            .graveyard()
            .map(|r| self.ns.subtree_size(r, REAP_NODES) as u64)
            .sum()
    }

    /// The published size and the locations of blocks `[index, index +
    /// count)` that exist, stopping before a block on a dead server or one
    /// being moved (the decision refused the first one already).
    fn blocks_reply(&self, node: NodeId, index: u64, count: u64, g: Grant) -> MetaReply {
        let Some(n) = self.ns.get(node) else {
            return MetaReply::Blocks {
                size: 0,
                blocks: Vec::new(),
            };
        };
        let size = if n.ty.is_container() {
            n.slots.len() as u64 * RECORD_SIZE as u64
        } else {
            n.size
        };
        if let Some(p) = &n.piece {
            let blocks = (index == 0)
                .then(|| self.piece_loc(node, p, g))
                .flatten()
                .into_iter()
                .collect();
            return MetaReply::Blocks { size, blocks };
        }
        let end = index.saturating_add(count).min(n.blocks.len() as u64);
        let mut blocks = Vec::new();
        for i in index..end {
            let b = &n.blocks[i as usize];
            if !self.alloc.is_alive(b.server) || self.moves.contains_key(&(node, i)) {
                break;
            }
            blocks.push(self.loc(b, g));
        }
        MetaReply::Blocks { size, blocks }
    }

    /// Where a client writes or clears the record of `slot`; `None` while
    /// its block is being moved (a record written to the source after the
    /// copy would be lost, and a lost clear could let a reused slot show
    /// its old name): the record is then missing, enumeration asks the
    /// metadata server for the name, and an uncleared slot stays out of use.
    /// Its capability allows writing that one record only.
    fn record_loc(&self, (container, slot): SlotRef, now: u64) -> Option<RecordLoc> {
        let bs = self.alloc.block_size() as u64;
        let at = slot as u64 * RECORD_SIZE as u64;
        let n = self.ns.get(container)?;
        if self.moves.contains_key(&(container, at / bs)) {
            return None;
        }
        let b = n.blocks.get((at / bs) as usize)?;
        let offset = (at % bs) as u32;
        Some(RecordLoc {
            container,
            slot,
            block: self.loc_of_range(
                b,
                offset,
                offset + RECORD_SIZE as u32,
                Grant::new(true, now),
            ),
            offset,
        })
    }

    /// Where block `b` is, with the capability `g` grants for all of it.
    fn loc(&self, b: &BlockRef, g: Grant) -> BlockLoc {
        self.loc_of_range(b, 0, self.alloc.block_size(), g)
    }

    /// The capability `g` grants for bytes `lo..hi` of block `b`: the
    /// metadata server's own (claims, copies) never expire; one handed to
    /// a client expires after the capability lifetime, in the clock of
    /// the block's storage server.
    fn cap(&self, b: &BlockRef, lo: u32, hi: u32, g: Grant) -> Cap {
        let key = self.alloc.cap_key(b.server).copied().unwrap_or_default();
        let expires = if g.rights == Rights::MANAGE {
            0
        } else {
            let wall_s = (self.cap_clock.base_ms.saturating_add(g.now) / 1000) as i64;
            let theirs = wall_s.saturating_add(self.alloc.clock_offset_s(b.server));
            (theirs.saturating_add(self.cap_clock.lifetime_s as i64)).max(1) as u64
        };
        Cap::mint(&key, b.block, b.gen, lo, hi, g.rights, expires)
    }

    /// Where block `b` is, with the capability `g` grants for bytes
    /// `lo..hi` of it.
    fn loc_of_range(&self, b: &BlockRef, lo: u32, hi: u32, g: Grant) -> BlockLoc {
        BlockLoc {
            cap: self.cap(b, lo, hi, g),
            server: b.server,
            addr: self
                .alloc
                .server_addr(b.server)
                .unwrap_or_default()
                .to_string(),
            block: b.block,
            gen: b.gen,
            class: self.alloc.server_class(b.server).unwrap_or(0),
            offset: 0,
            tag: 0,
        }
    }

    /// Where `node`'s piece is: its slab's block at the slab's generation,
    /// past the tag that names `node`; `None` when its server is dead or
    /// gone.
    fn piece_loc(&self, node: NodeId, p: &Piece, g: Grant) -> Option<BlockLoc> {
        let slab = self.slabs.get(p.server, p.block)?;
        if !self.alloc.is_alive(p.server) {
            return None;
        }
        let b = BlockRef {
            server: p.server,
            block: p.block,
            gen: slab.gen,
        };
        Some(BlockLoc {
            offset: p.value_offset(),
            tag: node,
            ..self.loc_of_range(&b, p.offset(), p.offset() + p.size, g)
        })
    }

    /// Blocks data node `n` needs for its published bytes (none for a
    /// small value, whose piece is not a block).
    fn blocks_published(&self, n: &crate::namespace::Node) -> u64 {
        if n.piece.is_some() {
            return 0;
        }
        n.size.div_ceil(u64::from(self.block_size_of(n)).max(1))
    }

    /// The bytes one block of `n` holds as its clients see them: a small
    /// value's one block is its piece less the tag, any other node's a
    /// whole block; an encrypted node's, the plaintext those stored bytes
    /// hold ([`crypt::block_capacity`], [`crypt::plain_capacity`] for a
    /// piece). Every size-to-blocks reckoning of a data node goes through
    /// this.
    pub(crate) fn block_size_of(&self, n: &crate::namespace::Node) -> u32 {
        match (n.piece, n.encrypted) {
            (Some(p), true) => crypt::plain_capacity(p.capacity()),
            (Some(p), false) => p.capacity(),
            (None, true) => crypt::block_capacity(self.alloc.block_size()),
            (None, false) => self.alloc.block_size(),
        }
    }

    /// Whether a data node created for storage class `class` (resolved:
    /// the request's or the parent's, [`NO_CLASS`] for none) is encrypted:
    /// when it may be placed in an encrypted class, i.e. its class is one,
    /// or it names none and some class is (`docs/encryption.md`).
    pub fn encrypts(&self, class: u8) -> bool {
        let mut sealed = self.classes.iter().filter(|c| c.encrypt);
        if class == NO_CLASS {
            sealed.next().is_some()
        } else {
            sealed.any(|c| c.class == class)
        }
    }

    /// Under a write lease (`lease` not 0), its locations allow writing.
    fn info(&self, id: NodeId, lease: u64, now: u64) -> NodeInfo {
        let g = Grant::new(lease != 0, now);
        let Some(n) = self.ns.get(id) else {
            return NodeInfo {
                id,
                ty: NodeType::File,
                size: 0,
                block_size: self.alloc.block_size(),
                storage_class: NO_CLASS,
                location: String::new(),
                enumerable: false,
                mode: 0,
                mtime: 0,
                lease,
                encrypted: false,
                first_block: None,
                record: None,
            };
        };
        let size = if n.ty.is_container() {
            n.children.len() as u64
        } else {
            n.size
        };
        let first_block = match &n.piece {
            Some(p) => self.piece_loc(id, p, g),
            None => n
                .blocks
                .first()
                .filter(|b| {
                    self.alloc.is_alive(b.server)
                        && !n.ty.is_container()
                        && !self.moves.contains_key(&(id, 0))
                })
                .map(|b| self.loc(b, g)),
        };
        NodeInfo {
            id,
            ty: n.ty,
            size,
            block_size: self.block_size_of(n),
            storage_class: n.storage_class,
            location: n.location.to_string(),
            enumerable: n.enumerable,
            mode: u32::from(n.mode),
            mtime: n.mtime,
            lease,
            encrypted: n.encrypted,
            first_block,
            record: None,
        }
    }

    /// The durable state as text, in a fixed order: two states that dump
    /// the same are the same (liveness and pending claims aside).
    #[cfg(test)]
    pub(crate) fn dump(&self) -> String {
        format!(
            "{}{}{:?}\nnext_lease {} lease_ms {} moves {:?}\nheld {:?}\nballooned {:?}\n",
            self.ns.dump(),
            self.alloc.dump(),
            self.slabs,
            self.next_lease,
            self.lease_ms,
            self.moves,
            self.held,
            self.ballooned
        )
    }

    // ----- invariants --------------------------------------------------------

    /// Checks every invariant of the state (ARCHITECTURE.md, `meta`):
    /// - no block is owned twice, and no owned block is free;
    /// - free + used = capacity on every server (no block leaks);
    /// - every generation in use is below the next one to hand out, and
    ///   no two blocks in use share one;
    /// - the record slot tables agree with the children;
    /// - leases are unique and below the next lease id, and indexed by
    ///   expiry;
    /// - a linked data node without a write lease holds no block wholly
    ///   past its published size (closes, aborts, lapsed leases and
    ///   restarts give them back);
    /// - puts in progress are unlinked KeyValues, the graveyard holds only
    ///   unlinked roots.
    ///
    /// Costs time in proportion to the whole state: for tests and the
    /// simulation.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let mut owned: BTreeMap<(u32, u32), NodeId> = BTreeMap::new();
        let mut gens: BTreeSet<u64> = BTreeSet::new();
        let mut leases: BTreeSet<u64> = BTreeSet::new();
        let next_gen = self.alloc.next_gen();
        let mut own = |server: u32, block: u32, gen: u64, by: NodeId| {
            if let Some(other) = owned.insert((server, block), by) {
                return Err(format!(
                    "block {block} of server {server} is owned by nodes {other} and {by}"
                ));
            }
            if gen >= next_gen {
                return Err(format!(
                    "block {block} of server {server} has generation {gen}, not below the next one {next_gen}"
                ));
            }
            if !gens.insert(gen) {
                return Err(format!("generation {gen} is used twice"));
            }
            Ok(())
        };
        for n in self.ns.nodes() {
            for b in &n.blocks {
                if self.alloc.server(b.server).is_some() {
                    own(b.server, b.block, b.gen, n.id)?;
                }
            }
            if let Some(p) = &n.piece {
                if !n.blocks.is_empty() {
                    return Err(format!("node {} has a piece and blocks", n.id));
                }
                if self.alloc.server(p.server).is_some() && !self.slabs.is_owner(p, n.id) {
                    return Err(format!("node {} holds piece {p:?}, not its own", n.id));
                }
            }
            if let Some(l) = n.lease {
                if l.id >= self.next_lease || !leases.insert(l.id) {
                    return Err(format!("lease {} of node {} is not unique", l.id, n.id));
                }
            } else if n.linked
                && !n.ty.is_container()
                && n.blocks.len() as u64 > self.blocks_published(n)
            {
                return Err(format!(
                    "node {} has no writer but holds {} blocks for its {} published bytes",
                    n.id,
                    n.blocks.len(),
                    n.size
                ));
            }
            if n.ty.is_container() {
                if !n.slots.is_consistent() {
                    return Err(format!("slot table of node {} is inconsistent", n.id));
                }
                for (name, child) in &n.children {
                    let c = self
                        .ns
                        .get(*child)
                        .ok_or_else(|| format!("node {} lists missing child {child}", n.id))?;
                    if c.parent != n.id || c.name != *name || !c.linked {
                        return Err(format!("child {child} of node {} disagrees", n.id));
                    }
                    match (n.enumerable, c.slot) {
                        (true, Some(s)) if n.slots.get(s) == Some(Slot::Live(*child)) => {}
                        (false, None) => {}
                        (e, s) => {
                            return Err(format!(
                                "child {child} of node {} (enumerable {e}) has record slot {s:?}",
                                n.id
                            ))
                        }
                    }
                }
                for (s, state) in n.slots.iter() {
                    if let Slot::Live(c) = state {
                        if self
                            .ns
                            .get(c)
                            .is_none_or(|c| c.slot != Some(s) || c.parent != n.id)
                        {
                            return Err(format!(
                                "slot {s} of node {} names child {c}, which disagrees",
                                n.id
                            ));
                        }
                    }
                }
            }
        }
        for m in self.moves.values() {
            own(m.to.server, m.to.block, m.to.gen, 0)?;
        }
        for ((server, block), gen) in &self.held {
            if self.alloc.server(*server).is_none() {
                return Err(format!(
                    "held block {block} of server {server}: no such server"
                ));
            }
            own(*server, *block, *gen, 0)?;
        }
        for ((server, block), gen) in &self.ballooned {
            if self.alloc.server(*server).is_none() {
                return Err(format!(
                    "ballooned block {block} of server {server}: no such server"
                ));
            }
            own(*server, *block, *gen, 0)?;
        }
        let mut per_server: BTreeMap<u32, u32> = BTreeMap::new();
        for (server, _) in self.ballooned.keys() {
            *per_server.entry(*server).or_default() += 1;
        }
        for (id, s) in self.alloc.servers() {
            let n = per_server.get(&id).copied().unwrap_or(0);
            if s.ballooned_blocks() != n {
                return Err(format!(
                    "server {id} counts {} ballooned blocks, the balloon holds {n}",
                    s.ballooned_blocks()
                ));
            }
        }
        for ((server, block), slab) in self.slabs.iter() {
            if self.alloc.server(server).is_none() {
                return Err(format!("slab {block} of server {server}: no such server"));
            }
            if slab.used() == 0 {
                return Err(format!("slab {block} of server {server} is empty but kept"));
            }
            own(server, block, slab.gen, 0)?;
            for (index, owner) in slab.owned() {
                let piece = Piece {
                    server,
                    block,
                    index,
                    size: slab.piece_size,
                };
                match self.ns.get(owner) {
                    // Freed while a snapshot pins it.
                    None if owner == HELD => {}
                    None => {
                        return Err(format!(
                            "piece {index} of slab {block} on server {server} is leaked: its owner, node {owner}, is gone"
                        ))
                    }
                    Some(n) if n.piece != Some(piece) => {
                        return Err(format!(
                            "piece {index} of slab {block} on server {server} names node {owner}, which disagrees"
                        ))
                    }
                    Some(_) => {}
                }
            }
        }
        if !self.slabs.is_consistent() {
            return Err("the slab index disagrees with the slabs".into());
        }
        for (id, s) in self.alloc.servers() {
            let used = owned.keys().filter(|(srv, _)| *srv == id).count() as u64;
            let free = s.free.len();
            if used + free != s.spec.num_blocks as u64 {
                return Err(format!(
                    "server {id}: {used} blocks used + {free} free != capacity {}",
                    s.spec.num_blocks
                ));
            }
            for b in s.free.blocks() {
                if owned.contains_key(&(id, b)) {
                    return Err(format!("block {b} of server {id} is free and owned"));
                }
            }
        }
        for n in self.ns.shadows() {
            if n.linked || n.ty != NodeType::KeyValue {
                return Err(format!(
                    "put in progress {} is linked or not a KeyValue",
                    n.id
                ));
            }
        }
        for r in self.ns.graveyard() {
            if self.ns.get(r).is_none_or(|n| n.linked) {
                return Err(format!("graveyard root {r} is missing or linked"));
            }
        }
        if !self.ns.leases_indexed() {
            return Err("the lease index disagrees with the nodes' leases".into());
        }
        Ok(())
    }
}

/// A decision being built: effects so far, plus the counters and
/// allocation plan they consumed.
struct Draft<'a> {
    st: &'a MetaState,
    plan: crate::alloc::AllocPlan<'a>,
    effects: Vec<Effect>,
    next_id: NodeId,
    next_lease: u64,
    /// Blocks appended to a node by this draft.
    added: BTreeMap<NodeId, u64>,
    /// Pieces freed by this draft, per slab.
    pieces_freed: BTreeMap<(u32, u32), u32>,
    /// Slabs stamped by this draft.
    stamped: BTreeSet<(u32, u32)>,
    heartbeat: Option<u32>,
    suspect: Option<u32>,
    snapshot: Option<SnapshotNote>,
    drain: Option<(u32, bool)>,
    policy: Option<Box<TierSettings>>,
    resize: Option<(u32, u32)>,
    signed: Option<(u32, u64)>,
}

impl<'a> Draft<'a> {
    fn new(st: &'a MetaState) -> Self {
        Draft {
            st,
            plan: st.alloc.plan(),
            effects: Vec::new(),
            next_id: st.ns.next_id(),
            next_lease: st.next_lease,
            added: BTreeMap::new(),
            pieces_freed: BTreeMap::new(),
            stamped: BTreeSet::new(),
            heartbeat: None,
            suspect: None,
            snapshot: None,
            drain: None,
            policy: None,
            resize: None,
            signed: None,
        }
    }

    fn finish(self, reply: Reply) -> Decision {
        Decision {
            effects: self.effects,
            reply,
            heartbeat: self.heartbeat,
            suspect: self.suspect,
            snapshot: self.snapshot,
            drain: self.drain,
            policy: self.policy,
            resize: self.resize,
            signed: self.signed,
        }
    }

    fn push(&mut self, e: Effect) {
        self.effects.push(e);
    }

    fn ns(&self) -> &'a Namespace {
        &self.st.ns
    }

    fn bs(&self) -> u64 {
        self.st.alloc.block_size() as u64
    }

    /// Bytes per block of data node `n` ([`MetaState::block_size_of`]).
    fn bs_of(&self, n: &crate::namespace::Node) -> u64 {
        u64::from(self.st.block_size_of(n))
    }

    fn grant(&mut self, node: NodeId, now: u64) -> u64 {
        let id = self.next_lease;
        self.next_lease += 1;
        self.renew(node, id, now);
        id
    }

    fn renew(&mut self, node: NodeId, id: u64, now: u64) {
        self.push(Effect::LeaseSet {
            node,
            lease: Lease {
                id,
                expires_ms: now + self.st.lease_ms,
            },
        });
    }

    fn add_block(&mut self, node: NodeId, block: BlockRef) {
        *self.added.entry(node).or_default() += 1;
        self.push(Effect::BlockAdded { node, block });
    }

    /// Frees block `b` of a node: fenced with a fresh generation either
    /// way; held instead of given back while a snapshot pins it.
    fn free(&mut self, b: BlockRef) {
        if self.st.snapshots.pins_block(b.server, b.block, &[])
            && self.st.alloc.server(b.server).is_some()
        {
            #[cfg(test)]
            if self.st.bug == Some(crate::sim::Bug::PinnedBlockFreed) {
                return self.release_block(b);
            }
            let gen = self.plan.gen();
            self.push(Effect::BlockHeld {
                block: BlockRef { gen, ..b },
            });
            return;
        }
        self.release_block(b);
    }

    /// Gives block `b` back to its server's free list, fenced.
    fn release_block(&mut self, b: BlockRef) {
        let gen = self.plan.free(b);
        self.push(Effect::BlockFreed {
            block: BlockRef { gen, ..b },
        });
    }

    /// Frees every block of `node` (and the target of any move of them),
    /// or its piece.
    fn free_node_blocks(&mut self, node: NodeId) {
        let Some(n) = self.ns().get(node) else {
            return;
        };
        for b in &n.blocks {
            self.free(*b);
        }
        if let Some(p) = n.piece {
            self.free_piece(p);
        }
        self.end_moves(node, 0);
    }

    /// Gives `node` a piece of `piece_size` bytes, class by class in
    /// placement order (so small values tier like blocks: the preferred
    /// class first, the location's servers first within a class). Within a
    /// class: a free piece (never used, or fenced by an earlier stamp); else
    /// a slab's quarantined pieces behind a stamp, once it has a batch of
    /// them; else a new slab; else any quarantined piece. Stamping only
    /// whole batches keeps stamps rare under churn: each one makes the
    /// slab's in-flight writers and readers re-map. `None` when there is no
    /// room.
    fn take_piece(
        &mut self,
        node: NodeId,
        class: u8,
        location: &str,
        piece_size: u32,
        encrypted: bool,
    ) -> Option<Piece> {
        // Slabs hold encrypted values only, or plain ones only.
        let same = |s: &crate::slab::Slab| s.encrypted == encrypted;
        for c in self.st.alloc.class_order(class, encrypted) {
            let found = self
                .find_piece(c, location, piece_size, |s| {
                    same(s) && s.next_free().is_some()
                })
                .or_else(|| {
                    self.find_piece(c, location, piece_size, |s| {
                        same(s) && s.quarantined() >= stamp_batch(s.pieces())
                    })
                });
            if let Some(found) = found {
                return Some(self.take_found(node, found));
            }
            if encrypted {
                // Kept for the new slab's scrub (MetaState::scrub).
                self.plan.gen();
            }
            if let Some(block) = self.plan.allocate_in(c, location) {
                self.push(Effect::SlabCreated {
                    block,
                    piece_size,
                    encrypted,
                });
                let piece = Piece {
                    server: block.server,
                    block: block.block,
                    index: 0,
                    size: piece_size,
                };
                self.push(Effect::PieceTaken { node, piece });
                return Some(piece);
            }
            if let Some(found) =
                self.find_piece(c, location, piece_size, |s| same(s) && s.quarantined() > 0)
            {
                return Some(self.take_found(node, found));
            }
        }
        None
    }

    /// The next piece of the first slab of `piece_size` in class `c` that
    /// `fits` (one at `location` first, when it names one) and that this
    /// decision may use, and whether taking it needs a stamp.
    fn find_piece(
        &self,
        c: u8,
        location: &str,
        piece_size: u32,
        fits: impl Fn(&crate::slab::Slab) -> bool,
    ) -> Option<(Piece, bool)> {
        let passes: &[bool] = if location.is_empty() {
            &[false]
        } else {
            &[true, false]
        };
        passes.iter().find_map(|&local_only| {
            self.st
                .slabs
                .partial(piece_size, c)
                .find_map(|(server, block)| {
                    let local = self
                        .st
                        .alloc
                        .server(server)
                        .is_some_and(|s| s.spec.location == location);
                    if !self.plan.may_use(server)
                        || (local_only && !local)
                        || self.pieces_freed.contains_key(&(server, block))
                        || self
                            .st
                            .moves
                            .contains_key(&(SLAB_MOVE, slab_move_index(server, block)))
                    {
                        return None;
                    }
                    let slab = self.st.slabs.get(server, block).filter(|s| fits(s))?;
                    let (index, stamp) = match slab.next_free() {
                        Some(i) => (i, false),
                        None => (slab.next_after_stamp()?, true),
                    };
                    let piece = Piece {
                        server,
                        block,
                        index,
                        size: piece_size,
                    };
                    Some((piece, stamp))
                })
        })
    }

    /// Takes `piece` for `node`, stamping its slab first if it was
    /// quarantined.
    fn take_found(&mut self, node: NodeId, (piece, stamp): (Piece, bool)) -> Piece {
        if stamp {
            // Quarantined pieces are reused only behind a fence.
            self.stamp_slab((piece.server, piece.block));
        }
        self.push(Effect::PieceTaken { node, piece });
        piece
    }

    /// Frees piece `p`: it is quarantined until the slab is next stamped
    /// (when its pieces are needed again), so the freed value's handles get
    /// `Stale` before the piece is reused; a slab left empty gives its
    /// block back instead.
    fn free_piece(&mut self, p: Piece) {
        if self.st.slabs.get(p.server, p.block).is_some() && self.st.snapshots.pins_piece(&p, &[]) {
            // Its tag is cleared; its bytes stay for the snapshot.
            self.push(Effect::PieceHeld { piece: p });
            return;
        }
        self.release_piece(p);
    }

    /// Frees piece `p` for reuse (behind a stamp), releasing its slab if
    /// that was the last piece in use.
    fn release_piece(&mut self, p: Piece) {
        let Some(slab) = self.st.slabs.get(p.server, p.block) else {
            return; // gone with its server
        };
        let key = (p.server, p.block);
        self.push(Effect::PieceFreed { piece: p });
        let freed = self.pieces_freed.entry(key).or_default();
        *freed += 1;
        if *freed >= slab.used() {
            self.push(Effect::SlabReleased {
                server: p.server,
                block: p.block,
            });
            self.free(BlockRef {
                server: p.server,
                block: p.block,
                gen: slab.gen,
            });
        }
    }

    /// Frees what snapshots `ids` held and no other snapshot pins.
    fn release_snapshots(&mut self, ids: &[u64]) {
        let mut blocks = BTreeSet::new();
        let mut pieces = BTreeSet::new();
        for id in ids {
            let Some(s) = self.st.snapshots.get(*id) else {
                continue;
            };
            for key in &s.blocks {
                if self.st.held.contains_key(key)
                    && !self.st.snapshots.pins_block(key.0, key.1, ids)
                {
                    blocks.insert(*key);
                }
            }
            for p in &s.pieces {
                let held = self.st.slabs.get(p.server, p.block).is_some_and(|slab| {
                    slab.piece_size == p.size && slab.owner(p.index) == Some(HELD)
                });
                if held && !self.st.snapshots.pins_piece(p, ids) {
                    pieces.insert(*p);
                }
            }
        }
        for (server, block) in blocks {
            let gen = self.st.held[&(server, block)];
            self.release_block(BlockRef { server, block, gen });
        }
        for p in pieces {
            self.release_piece(p);
        }
    }

    /// Begins a snapshot of the subtree at `path`: its listing is frozen
    /// now, and its blocks and pieces are pinned until it ends.
    fn snapshot_begin(&mut self, path: &str, now: u64) -> Result<Reply> {
        path::components(path)?;
        self.st.check_partition(path)?;
        if self.st.snapshots.len() >= MAX_SNAPSHOTS {
            return Err(Error::busy(format!(
                "{MAX_SNAPSHOTS} snapshots are running on this metadata server, the most it keeps at once: wait for one to end"
            )));
        }
        let root = self.ns().resolve(path)?;
        let entries = self.st.snapshot_listing(root)?;
        let id = self.st.snapshots.next_id().max(self.st.alloc.next_gen());
        let n = entries.len() as u64;
        self.snapshot = Some(SnapshotNote::Begin(
            id,
            Box::new(Snapshot::new(entries, now + SNAPSHOT_TTL_MS)),
        ));
        Ok(Reply::SnapshotBegun { id, entries: n })
    }

    /// Fences every piece of a slab: a fresh generation, claimed.
    fn stamp_slab(&mut self, (server, block): (u32, u32)) {
        if self.stamped.insert((server, block)) {
            let gen = self.plan.gen();
            #[cfg(test)]
            let gen = match self.st.slabs.get(server, block) {
                // The injected bug: quarantined pieces freed, not fenced.
                Some(s) if self.st.bug == Some(crate::sim::Bug::PieceReusedUnfenced) => s.gen,
                _ => gen,
            };
            self.push(Effect::SlabStamped { server, block, gen });
        }
    }

    /// The writer of `n` is gone (its lease expired, or the metadata
    /// server restarted): what it wrote past the published size is
    /// dropped, its blocks freed (fenced, or held for a snapshot), and
    /// the blocks that stay (or a small value's slab) get a new
    /// generation, so the old writer's late writes get `Stale` and its
    /// re-map `LeaseExpired` (once the caller clears or replaces the
    /// lease); moves of its blocks are given up. Readers of the published
    /// bytes re-map and read on.
    fn lapse(&mut self, n: &crate::namespace::Node) {
        let keep = self.st.blocks_published(n) as usize;
        #[cfg(test)]
        let keep = match self.st.bug {
            Some(crate::sim::Bug::LapseKeepsBlocks) => n.blocks.len(),
            Some(crate::sim::Bug::LapseFreesPublished) => keep.saturating_sub(1),
            _ => keep,
        };
        for (i, _) in n.blocks.iter().enumerate().take(keep) {
            let gen = self.plan.gen();
            self.push(Effect::BlockStamped {
                node: n.id,
                index: i as u64,
                gen,
            });
        }
        if n.blocks.len() > keep {
            for b in &n.blocks[keep..] {
                self.free(*b);
            }
            self.push(Effect::BlocksTruncated {
                node: n.id,
                len: keep as u64,
            });
        }
        if let Some(p) = n.piece {
            if self.st.slabs.get(p.server, p.block).is_some() {
                self.stamp_slab((p.server, p.block));
            }
        }
        self.end_moves(n.id, 0);
    }

    /// Frees the blocks of `n` from block `keep` on (and their moves).
    fn truncate(&mut self, n: &crate::namespace::Node, keep: u64) {
        if (n.blocks.len() as u64) <= keep {
            return;
        }
        for b in &n.blocks[keep as usize..] {
            self.free(*b);
        }
        self.end_moves(n.id, keep);
        self.push(Effect::BlocksTruncated {
            node: n.id,
            len: keep,
        });
    }

    /// Gives up the moves of blocks `from..` of `node` (their blocks are
    /// being freed).
    fn end_moves(&mut self, node: NodeId, from: u64) {
        let moving: Vec<(u64, BlockRef)> = self
            .st
            .moves
            .range((node, from)..=(node, u64::MAX))
            .map(|((_, i), m)| (*i, m.to))
            .collect();
        for (index, to) in moving {
            self.push(Effect::MoveEnded {
                node,
                index,
                done: false,
            });
            self.free(to);
        }
    }

    /// Gives `container` a record block for `slot` if it lacks one; returns
    /// the slot.
    fn ensure_record_space(&mut self, container: NodeId) -> Result<u32> {
        let n = self.ns().get(container).ok_or_else(|| stale(container))?;
        let slot = n.slots.peek();
        let bs = self.bs();
        let need = ((slot as u64 + 1) * RECORD_SIZE as u64).div_ceil(bs);
        self.relocate_lost_records(container)?;
        let have = n.blocks.len() as u64 + self.added.get(&container).copied().unwrap_or(0);
        for _ in have..need {
            let b = self.record_block(container)?;
            self.add_block(container, b);
        }
        Ok(slot)
    }

    /// Allocates a block for a container's records.
    fn record_block(&mut self, container: NodeId) -> Result<BlockRef> {
        let class = self
            .ns()
            .get(container)
            .ok_or_else(|| stale(container))?
            .storage_class;
        // Records are written on the create path, so they follow the normal
        // placement (DRAM first, or the container's preferred class). The
        // root's few records go to the slowest class instead: the root is
        // shared by every top-level name and changes rarely.
        let b = if class == NO_CLASS && container == ROOT {
            self.plan.allocate_slowest_first()
        } else {
            self.plan.allocate(class, "")
        };
        b.map_err(|e| {
            Error::new(
                e.code,
                format!(
                    "no space for the child records of node {container}: {}",
                    e.message
                ),
            )
        })
    }

    /// Replaces record blocks of `container` that sit on dead storage
    /// servers. Their records are lost; enumeration recovers the names of
    /// those live slots from the metadata server (`RecordNames`).
    fn relocate_lost_records(&mut self, container: NodeId) -> Result<()> {
        let n = self.ns().get(container).ok_or_else(|| stale(container))?;
        let lost: Vec<(usize, BlockRef)> = n
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| !self.st.alloc.is_alive(b.server))
            .map(|(i, b)| (i, *b))
            .collect();
        for (i, old) in lost {
            let new = self.record_block(container)?;
            self.push(Effect::BlockSwapped {
                node: container,
                index: i as u64,
                block: new,
            });
            self.free(old);
        }
        Ok(())
    }

    fn create(
        &mut self,
        path: &str,
        ty: NodeType,
        f: NodeFlags,
        size_hint: u64,
        open_existing: bool,
        now: u64,
    ) -> Result<Reply> {
        let NodeFlags {
            class,
            location,
            enumerable,
            pinned,
            mode,
            mtime,
        } = f;
        let mode = check_mode(mode)?;
        self.st.check_partition(path)?;
        if open_existing && ty != NodeType::File {
            return Err(Error::invalid_argument(format!(
                "{path}: only a File can be opened if it exists (asked for a {ty})"
            )));
        }
        let (parent, name) = self.ns().parent_for(path, ty)?;
        if !ty.replaces_on_create() {
            if let Some(old) = self.ns().child(parent, &name) {
                let old_ty = self.ns().get(old).map_or(ty, |n| n.ty);
                if open_existing && old_ty == NodeType::File {
                    return self.open_write(path, now);
                }
                return Err(Error::already_exists(format!(
                    "{path} already exists (a {old_ty})"
                )));
            }
        }
        let slot = if !ty.replaces_on_create() && self.ns().next_slot_in(parent).is_some() {
            Some(self.ensure_record_space(parent)?)
        } else {
            None
        };
        let id = self.next_id;
        self.next_id += 1;
        let storage_class = self.ns().class_for_child(parent, class);
        let encrypted = !ty.is_container() && self.st.encrypts(storage_class);
        self.push(Effect::NodeCreated(NewNode {
            id,
            parent,
            name,
            ty,
            storage_class,
            location: location.to_string(),
            enumerable,
            pinned,
            encrypted,
        }));
        self.push(Effect::AttrsSet {
            node: id,
            mode,
            mtime,
        });
        if !ty.replaces_on_create() {
            self.push(Effect::Linked { id, slot });
        }
        let lease = if ty.is_container() {
            0
        } else {
            self.grant(id, now)
        };
        if ty.replaces_on_create() {
            // A put always writes: hand out its first block (or, for a
            // small value, its piece) with the create, saving the put a map
            // round trip. (No space now is not an error yet: the put's map
            // will report it.)
            // An encrypted value's piece holds its sealed chunks.
            let stored = if encrypted {
                crypt::sealed_len(size_hint)
            } else {
                size_hint
            };
            match piece_size_for(self.st.alloc.block_size(), stored) {
                Some(size) => {
                    self.take_piece(id, storage_class, location, size, encrypted);
                }
                None => {
                    if let Ok(b) = self.plan.allocate_data(storage_class, location, encrypted) {
                        self.add_block(id, b);
                    }
                }
            }
        }
        Ok(Reply::Node {
            id,
            lease,
            record: slot.map(|s| (parent, s)),
        })
    }

    fn remove(&mut self, path: &str, recursive: bool) -> Result<Reply> {
        self.st.check_partition(path)?;
        let id = self.ns().resolve(path)?;
        if id == ROOT {
            return Err(Error::invalid_argument(
                "the root directory / cannot be removed",
            ));
        }
        let n = self.ns().get(id).ok_or_else(|| stale(id))?;
        if !recursive && !n.children.is_empty() {
            return Err(Error::not_empty(format!(
                "{path} has {} children; remove it recursively",
                n.children.len()
            )));
        }
        let clear = n.slot.map(|s| (n.parent, s));
        self.push(Effect::Unlinked { id });
        // A small subtree is reaped at once; a big one in bounded steps
        // afterwards (the server's reaper).
        if self.ns().subtree_size(id, REAP_NODES + 1) <= REAP_NODES {
            self.reap(&[id], REAP_NODES, REAP_BLOCKS);
        }
        Ok(Reply::Record(clear))
    }

    /// Frees the blocks of, and drops, the first nodes of the subtrees at
    /// `roots` (children first), up to `max_nodes` nodes and about
    /// `max_blocks` blocks. A node with more blocks than are left in the
    /// budget loses its last blocks now and is dropped by a later step.
    fn reap(&mut self, roots: &[NodeId], max_nodes: usize, max_blocks: usize) {
        let order = self.ns().subtree_postorder(roots, max_nodes);
        let mut budget = max_blocks;
        let mut dropped = Vec::new();
        for id in order {
            let Some(n) = self.ns().get(id) else {
                continue;
            };
            let blocks = n.blocks.len() + usize::from(n.piece.is_some());
            if blocks > budget && n.piece.is_none() {
                // Free what the budget allows, from the end.
                self.truncate(n, (blocks - budget) as u64);
                break;
            }
            budget -= blocks;
            self.free_node_blocks(id);
            dropped.push(id);
        }
        if !dropped.is_empty() {
            self.push(Effect::Dropped { ids: dropped });
        }
    }

    fn rename(&mut self, src: &str, dst: &str, replace: bool) -> Result<Reply> {
        self.st.check_partition(src)?;
        let p = self.st.placement;
        if p.partitions > 1
            && path::partition_of(dst, p.partitions as usize)
                != path::partition_of(src, p.partitions as usize)
        {
            return Err(Error::cross_partition(format!(
                "cannot move {src} to {dst}: they are owned by different metadata partitions"
            )));
        }
        let (id, parent, name, replaced) = self.ns().check_rename(src, dst, replace)?;
        let n = self.ns().get(id).ok_or_else(|| stale(id))?;
        if replaced == Some(id) {
            return Ok(Reply::Moved {
                ty: n.ty,
                clear: None,
                write: None,
                replaced: None,
            });
        }
        let clear = n.slot.map(|s| (n.parent, s));
        // The node replaced goes as a remove would take it: unlinked (its
        // record to be cleared), its blocks freed, dropped (a big one by
        // the reaper).
        let replaced = match replaced.and_then(|old| self.ns().get(old)) {
            Some(old) => {
                self.push(Effect::Unlinked { id: old.id });
                self.reap(&[old.id], REAP_NODES, REAP_BLOCKS);
                old.slot.map(|s| (old.parent, s))
            }
            None => None,
        };
        let slot = if self.ns().next_slot_in(parent).is_some() {
            Some(self.ensure_record_space(parent)?)
        } else {
            None
        };
        self.push(Effect::Moved {
            id,
            parent,
            name,
            slot,
        });
        Ok(Reply::Moved {
            ty: n.ty,
            clear,
            write: slot.map(|s| (parent, s)),
            replaced,
        })
    }

    /// The writer shrinks `node` to `size` bytes: published at once, the
    /// blocks past it freed (fenced, so a reader holding their old
    /// locations gets `Stale`).
    fn truncate_to(
        &mut self,
        node: NodeId,
        lease: u64,
        size: u64,
        mtime: u64,
        now: u64,
    ) -> Result<Reply> {
        let n = self.writable(node, lease)?;
        if size > n.size {
            return Err(Error::invalid_argument(format!(
                "cannot truncate node {node} to {size} bytes: it has {} published; a node grows by writing",
                n.size
            )));
        }
        self.push(Effect::SizeSet { node, size });
        if n.piece.is_none() {
            self.truncate(n, size.div_ceil(self.bs_of(n)));
        }
        self.stamp(n, mtime);
        self.renew(node, lease, now);
        Ok(Reply::Done)
    }

    /// A writer's change of `n` stamps its modification time (0: the
    /// writer sent none, the old time stays).
    fn stamp(&mut self, n: &crate::namespace::Node, mtime: u64) {
        if mtime != 0 {
            self.push(Effect::AttrsSet {
                node: n.id,
                mode: n.mode,
                mtime,
            });
        }
    }

    /// Changes the permission bits and/or modification time of `path`.
    fn set_attrs(&mut self, path: &str, mode: Option<u32>, mtime: Option<u64>) -> Result<Reply> {
        self.st.check_partition(path)?;
        let id = self.ns().resolve(path)?;
        let n = self.ns().get(id).ok_or_else(|| stale(id))?;
        let mode = match mode {
            Some(m) => check_mode(m)?,
            None => n.mode,
        };
        self.push(Effect::AttrsSet {
            node: id,
            mode,
            mtime: mtime.unwrap_or(n.mtime),
        });
        Ok(Reply::Node {
            id,
            lease: 0,
            record: None,
        })
    }

    /// The node, if `lease` is its current write lease. A lease that expired
    /// but was not taken over stays usable (and is renewed by the caller).
    fn writable(&self, node: NodeId, lease: u64) -> Result<&'a crate::namespace::Node> {
        let n = self.ns().get(node).ok_or_else(|| stale(node))?;
        if n.ty.is_container() {
            return Err(Error::type_mismatch(format!(
                "node {node} is a {}; its data is written by the metadata server",
                n.ty
            )));
        }
        match n.lease {
            Some(l) if l.id == lease => Ok(n),
            Some(_) => Err(Error::lease_expired(format!(
                "write lease {lease} on node {node} expired and another writer took over"
            ))),
            None => Err(Error::lease_expired(format!(
                "node {node} has no open writer; lease {lease} was closed or expired"
            ))),
        }
    }

    /// Whether the slab of `p` is being moved.
    fn slab_moving(&self, p: Piece) -> bool {
        self.st
            .moves
            .contains_key(&(SLAB_MOVE, slab_move_index(p.server, p.block)))
    }

    /// Refuses a map whose first block is on a dead server or being moved.
    fn check_first_block(&self, node: NodeId, index: u64) -> Result<()> {
        if let Some(p) = self.ns().get(node).and_then(|n| n.piece) {
            if index == 0
                && (!self.st.alloc.is_alive(p.server)
                    || self.st.slabs.get(p.server, p.block).is_none())
            {
                return Err(Error::data_lost(format!(
                    "node {node} is a small value on storage server {} ({}), which is dead",
                    p.server,
                    self.st.alloc.server_addr(p.server).unwrap_or("retired")
                )));
            }
            if self.slab_moving(p) {
                return Err(Error::try_again(format!(
                    "the block of node {node}'s value is being moved; retry shortly"
                )));
            }
            return Ok(());
        }
        let Some(b) = self
            .ns()
            .get(node)
            .and_then(|n| n.blocks.get(index as usize))
        else {
            return Ok(());
        };
        if !self.st.alloc.is_alive(b.server) {
            return Err(Error::data_lost(format!(
                "block {index} of node {node} is on storage server {} ({}), which is dead",
                b.server,
                self.st.alloc.server_addr(b.server).unwrap_or("retired")
            )));
        }
        if self.st.moves.contains_key(&(node, index)) {
            return Err(Error::try_again(format!(
                "block {index} of node {node} is being moved; retry shortly"
            )));
        }
        Ok(())
    }

    fn map(
        &mut self,
        node: NodeId,
        index: u64,
        count: u32,
        lease: Option<u64>,
        now: u64,
    ) -> Result<Reply> {
        let count = count.clamp(1, MAX_MAP_COUNT) as u64;
        let end = index.saturating_add(count);
        let n = self.ns().get(node).ok_or_else(|| stale(node))?;
        if let Some(lease) = lease {
            let n = self.writable(node, lease)?;
            if let Some(p) = n.piece {
                if index > 0 {
                    return Err(Error::out_of_range(format!(
                        "node {node} is a small value stored in a piece of {} bytes and cannot grow past it (a value written without a size hint gets whole blocks)",
                        p.size
                    )));
                }
                self.renew(node, lease, now);
                self.check_first_block(node, index)?;
                return Ok(Reply::Blocks {
                    node,
                    index,
                    count,
                    write: true,
                });
            }
            let have = n.blocks.len() as u64;
            if index > have {
                return Err(Error::out_of_range(format!(
                    "node {node} has {have} blocks; block {index} cannot be allocated before block {have}"
                )));
            }
            self.renew(node, lease, now);
            for i in have..end {
                match self
                    .plan
                    .allocate_data(n.storage_class, &n.location, n.encrypted)
                {
                    Ok(b) => self.add_block(node, b),
                    Err(e) if i <= index => return Err(e),
                    Err(_) => break, // partial: the caller gets NoSpace on its next map
                }
            }
        }
        if n.ty.is_container() {
            self.relocate_lost_records(node)?;
            // A reader of the records waits for a moving block, as for
            // data (the reply would stop before it).
            if self.st.moves.contains_key(&(node, index)) {
                return Err(Error::try_again(format!(
                    "block {index} of container {node} is being moved; retry shortly"
                )));
            }
        } else {
            self.check_first_block(node, index)?;
        }
        Ok(Reply::Blocks {
            node,
            index,
            count,
            write: lease.is_some(),
        })
    }

    fn open_write(&mut self, path: &str, now: u64) -> Result<Reply> {
        self.st.check_partition(path)?;
        let id = self.ns().resolve(path)?;
        let n = self.ns().get(id).ok_or_else(|| stale(id))?;
        if n.ty.is_container() {
            return Err(Error::type_mismatch(format!(
                "{path} is a {}; only File and KeyValue nodes hold data",
                n.ty
            )));
        }
        if let Some(l) = n.lease {
            if now < l.expires_ms {
                return Err(Error::busy(format!(
                    "{path} is being written by another client (one writer at a time)"
                )));
            }
            // The lease expired without a close: its writer may still be
            // alive and writing. It lapses: fenced out at the storage
            // layer, its unpublished blocks freed.
            self.lapse(n);
        }
        let lease = self.grant(id, now);
        Ok(Reply::Node {
            id,
            lease,
            record: None,
        })
    }

    fn sync(
        &mut self,
        node: NodeId,
        lease: u64,
        size: u64,
        close: bool,
        mtime: u64,
        now: u64,
    ) -> Result<Reply> {
        let n = self.writable(node, lease)?;
        let bs = self.bs_of(n);
        let capacity = match n.piece {
            Some(_) => bs,
            None => n.blocks.len() as u64 * bs,
        };
        if size > capacity {
            return Err(Error::out_of_range(format!(
                "cannot publish size {size} of node {node}: only {capacity} bytes are allocated"
            )));
        }
        if size < n.size {
            return Err(Error::invalid_argument(format!(
                "cannot shrink node {node} from {} to {size} bytes",
                n.size
            )));
        }
        // Closing a put makes the value visible, replacing any older one:
        // check it can be linked before changing anything.
        let link = if close && !n.linked {
            Some(self.plan_link(n)?)
        } else {
            None
        };
        self.push(Effect::SizeSet { node, size });
        self.stamp(n, mtime);
        if close {
            // A closed node keeps only the blocks its bytes need: blocks
            // handed out but never filled (an empty put, a write cut short)
            // go back.
            self.truncate(n, size.div_ceil(bs));
            self.push(Effect::LeaseCleared { node });
        } else {
            self.renew(node, lease, now);
        }
        let record = match link {
            None => None,
            Some(Link::Replace(old)) => {
                #[cfg(test)]
                let leak = self.st.bug == Some(crate::sim::Bug::LeakOnReplace);
                #[cfg(not(test))]
                let leak = false;
                if !leak {
                    self.free_node_blocks(old);
                }
                self.push(Effect::Replaced { old, new: node });
                None
            }
            Some(Link::New(slot)) => {
                self.push(Effect::Linked { id: node, slot });
                slot.map(|s| (n.parent, s))
            }
        };
        Ok(Reply::Record(record))
    }

    /// How the closing put `n` will be linked, with record space made for
    /// a new slot.
    fn plan_link(&mut self, n: &crate::namespace::Node) -> Result<Link> {
        let parent = self
            .ns()
            .get(n.parent)
            .filter(|p| p.linked)
            .ok_or_else(|| {
                Error::not_found(format!("cannot store {}: its table was removed", n.name))
            })?;
        match parent.children.get(&n.name) {
            Some(&old) => {
                let old_ty = self.ns().get(old).map(|o| o.ty);
                if old_ty != Some(n.ty) {
                    return Err(Error::already_exists(format!(
                        "{} already exists (a {})",
                        n.name,
                        old_ty.map_or("node".to_string(), |t| t.to_string())
                    )));
                }
                Ok(Link::Replace(old))
            }
            None if parent.enumerable => Ok(Link::New(Some(self.ensure_record_space(n.parent)?))),
            None => Ok(Link::New(None)),
        }
    }

    fn abort(&mut self, node: NodeId, lease: u64) -> Result<Reply> {
        let n = self.writable(node, lease)?;
        if !n.linked {
            // A put that never closed: nothing of it was ever visible.
            self.free_node_blocks(node);
            self.push(Effect::Dropped { ids: vec![node] });
        } else {
            self.truncate(n, n.size.div_ceil(self.bs_of(n)));
            self.push(Effect::LeaseCleared { node });
        }
        Ok(Reply::Done)
    }

    fn replace_block(
        &mut self,
        node: NodeId,
        lease: u64,
        index: u64,
        gen: u64,
        now: u64,
    ) -> Result<Reply> {
        let n = self.writable(node, lease)?;
        if let Some(p) = n.piece {
            return self.replace_piece(n, p, lease, index, gen, now);
        }
        let old = *n
            .blocks
            .get(index as usize)
            .ok_or_else(|| Error::out_of_range(format!("node {node} has no block {index}")))?;
        if old.gen == gen {
            if index * self.bs_of(n) < n.size {
                return Err(Error::invalid_argument(format!(
                    "block {index} of node {node} holds published bytes; only a block the writer still holds in full can move"
                )));
            }
            if self.st.moves.contains_key(&(node, index)) {
                return Err(Error::try_again(format!(
                    "block {index} of node {node} is being moved; retry shortly"
                )));
            }
            self.plan.avoid(old.server);
            let new = self
                .plan
                .allocate_data(n.storage_class, &n.location, n.encrypted)?;
            self.push(Effect::BlockSwapped {
                node,
                index,
                block: new,
            });
            self.free(old);
            self.renew(node, lease, now);
            self.suspect = Some(old.server);
        }
        // Otherwise the caller's location was outdated: it gets the current
        // one and tries that.
        Ok(Reply::Blocks {
            node,
            index,
            count: 1,
            write: true,
        })
    }
}

impl Draft<'_> {
    /// [`Draft::replace_block`] for a small value: a new piece elsewhere.
    fn replace_piece(
        &mut self,
        n: &crate::namespace::Node,
        p: Piece,
        lease: u64,
        index: u64,
        gen: u64,
        now: u64,
    ) -> Result<Reply> {
        let node = n.id;
        let slab_gen = self.st.slabs.get(p.server, p.block).map(|s| s.gen);
        if self.slab_moving(p) {
            return Err(Error::try_again(format!(
                "the block of node {node}'s value is being moved; retry shortly"
            )));
        }
        if index != 0 {
            return Err(Error::out_of_range(format!(
                "node {node} is a small value: it has only block 0"
            )));
        }
        if slab_gen == Some(gen) {
            if n.size > 0 {
                return Err(Error::invalid_argument(format!(
                    "node {node} holds published bytes; only a value the writer still holds in full can move"
                )));
            }
            self.plan.avoid(p.server);
            self.free_piece(p);
            if self
                .take_piece(node, n.storage_class, &n.location, p.size, n.encrypted)
                .is_none()
            {
                return Err(Error::no_space(format!(
                    "no room for node {node}'s value on any other storage server"
                )));
            }
            self.renew(node, lease, now);
            self.suspect = Some(p.server);
        }
        Ok(Reply::Blocks {
            node,
            index,
            count: 1,
            write: true,
        })
    }
}

enum Link {
    /// Replaces this KeyValue.
    Replace(NodeId),
    /// A new child with this record slot.
    New(Option<u32>),
}

#[cfg(test)]
mod tests;
