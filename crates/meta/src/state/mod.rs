//! The metadata state machine: namespace + block allocator + write leases
//! + block moves, small values, snapshots and drains.
//!
//! Requests are carried out in two steps:
//! 1. [`MetaState::decide`] looks at the state and a request (and the time,
//!    passed in) and returns a [`Decision`]: the [`Effect`]s that carry the
//!    request out and its reply, or an error — without changing anything.
//!    Every check happens here, so a request either applies fully or not
//!    at all.
//! 2. [`MetaState::commit`] applies a decision: each effect through
//!    [`MetaState::apply_effect`], the only way the durable state changes
//!    (it never fails, and queues the block claims the shell sends, see
//!    [`MetaState::take_claims`]), then the decision's soft-state notes;
//!    then it builds the reply.
//!
//! [`MetaState::execute`] does both. Pure: no I/O, no clock (the caller
//! passes `now_ms`), so it is tested directly and driven by the
//! deterministic simulation (`crate::sim`).
//!
//! Soft state is kept apart: the liveness of storage servers (heartbeats,
//! dead, suspect; see [`crate::alloc`]), running snapshots, drains, tier
//! migration's heat, and the claims waiting to be sent.
//!
//! This file is the spine: the struct, [`Decision`], the decide dispatch
//! (one line per request, into the file of its family) and commit. Each
//! family is one file, readable alone:
//! - `names.rs`: create, lookup, remove (and reaping), move, enumerate,
//!   record slots, attributes;
//! - `writes.rs`: map, open for writing, sync, truncate, abort, block
//!   replacement;
//! - `lifetimes.rs`: expiry times and child TTLs, and the expiry of
//!   what is due;
//! - `quotas.rs`: quotas and disk usage: the requests, the accounting
//!   of every container's usage as effects apply, and the check that
//!   refuses growth past a quota;
//! - `leases.rs`: write leases: granted, renewed, lapsed; the sweep after
//!   vanished writers and the restart decision;
//! - `blocks.rs`: a node's blocks handed out and freed inside a decision;
//! - `pieces.rs`: small values' pieces of shared blocks;
//! - `snapshots.rs`, `moves.rs` (block and slab moves), `drains.rs`,
//!   `resize.rs` (dynamic capacity), `migrate.rs` (tier migration);
//! - `servers.rs`: registration, heartbeats, retirement, policy;
//! - `apply.rs`: the effect applier and the claims it queues;
//! - `replies.rs`: replies, built from the state once a decision is
//!   applied (block locations and their capabilities);
//! - `invariants.rs`: the invariant checker.

use crate::alloc::{BlockAllocator, BlockClaim};
use crate::effect::Effect;
use crate::namespace::{Namespace, NodeId};
use crate::slab::Slabs;
use crate::snapshot::Snapshots;
use crate::usage::Accounts;
use nodekernel_proto::cap::CAP_LIFETIME_SECS;
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::path;
use nodekernel_proto::{ClassInfo, Error, Result};
use std::collections::{BTreeMap, BTreeSet};

mod apply;
mod blocks;
mod drains;
mod invariants;
mod leases;
mod lifetimes;
mod migrate;
mod moves;
mod names;
mod notes;
mod pieces;
mod quotas;
mod replies;
mod resize;
mod servers;
mod sessions;
mod snapshots;
mod writes;

pub(crate) use apply::Parts;
pub use drains::Drain;
pub use lifetimes::EXPIRE_NODES;
pub use migrate::{Migration, Tiering};
use moves::slab_of;
pub use moves::{move_name, slab_move_index, Move, SLAB_MOVE};
use names::NodeFlags;
pub use names::{REAP_BLOCKS, REAP_NODES};
pub use notes::Notes;
use replies::{CapClock, Reply};
pub(crate) use snapshots::snapshot_gone;

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

/// The outcome of [`MetaState::decide`]: what to change, and what to reply
/// once it is changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub effects: Vec<Effect>,
    reply: Reply,
    /// The soft state it changes besides its effects.
    notes: Notes,
    /// The change of each quota root's (nodes, held bytes) its effects
    /// bring, as the quota check predicted it (checked after commit).
    /// `None` for background work, which does not pass the check.
    #[cfg(debug_assertions)]
    quota_delta: Option<Vec<(NodeId, i128, i128)>>,
    /// How many decisions (and log records) the state had applied when
    /// this one was decided: it must be applied to exactly that state.
    #[cfg(debug_assertions)]
    basis: u64,
}

impl Decision {
    /// What the decision changes of the soft state.
    pub fn notes(&self) -> &Notes {
        &self.notes
    }
}

/// A request carried out: its reply, the effects applied, and its notes
/// for the shell.
#[derive(Debug)]
pub struct Outcome {
    pub reply: MetaReply,
    pub effects: Vec<Effect>,
    pub notes: Notes,
}

#[derive(Debug)]
pub struct MetaState {
    ns: Namespace,
    alloc: BlockAllocator,
    /// Blocks shared by small values.
    slabs: Slabs,
    /// Every container's usage and the quota roots' limits (the usage is
    /// derived from `ns`, the limits are durable).
    acct: Accounts,
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
    /// Decisions committed and log records replayed so far (debug
    /// builds: a decision must be committed to the state it was decided
    /// on, see [`Decision`]).
    #[cfg(debug_assertions)]
    applied: u64,
    /// A deliberately injected bug, to show the simulation catches it.
    #[cfg(test)]
    pub(crate) bug: Option<Bug>,
}

impl MetaState {
    /// `first_gen` seeds block generations (see [`BlockAllocator::new`]).
    pub fn new(block_size: u32, lease_ms: u64, first_gen: u64) -> Self {
        MetaState {
            ns: Namespace::new(),
            alloc: BlockAllocator::new(block_size, first_gen),
            slabs: Slabs::default(),
            acct: Accounts::default(),
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
            #[cfg(debug_assertions)]
            applied: 0,
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

    /// Every container's usage and the quota roots' limits.
    pub fn accounts(&self) -> &Accounts {
        &self.acct
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

    /// The clock capabilities are minted by: (wall-clock milliseconds when
    /// `now` was 0, a capability's lifetime in seconds).
    pub fn cap_clock(&self) -> (u64, u64) {
        (self.cap_clock.base_ms, self.cap_clock.lifetime_s)
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

    /// Claims produced by the effects applied so far; the server shell
    /// sends them to the storage servers.
    pub fn take_claims(&mut self) -> Vec<BlockClaim> {
        std::mem::take(&mut self.claims)
    }

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
    /// reply. In debug builds, asserts that the decision was made on this
    /// very state (nothing was applied since), and afterwards that the
    /// invariants hold where it acted (all of them while the state is
    /// small; see `invariants.rs`).
    pub fn commit(&mut self, mut d: Decision, now: u64) -> Outcome {
        #[cfg(debug_assertions)]
        {
            assert_eq!(
                d.basis, self.applied,
                "a decision must be committed to the state it was decided on"
            );
            self.applied += 1;
        }
        #[cfg(debug_assertions)]
        let quota_before = self.quota_roots_usage();
        for e in &d.effects {
            self.apply_effect(e);
        }
        #[cfg(debug_assertions)]
        self.check_quota_prediction(&quota_before, &d);
        self.apply_notes(&mut d.notes, now);
        match &d.reply {
            Reply::Node { id, .. } | Reply::Blocks { node: id, .. } => self.touch(*id, now),
            _ => {}
        }
        #[cfg(debug_assertions)]
        self.debug_check(&d.effects);
        Outcome {
            reply: self.reply(&d.reply, now),
            effects: d.effects,
            notes: d.notes,
        }
    }

    /// Decides `req` at time `now`: the effects that carry it out, or the
    /// error that refuses it. Changes nothing. One line per request, into
    /// the file of its family.
    pub fn decide(&self, req: &MetaRequest, now: u64) -> Result<Decision> {
        let mut d = Draft::new(self);
        let reply = match req {
            // names.rs
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
                    ttl_ms: *ttl_ms,
                    child_ttl_ms: *child_ttl_ms,
                    session: *session,
                },
                *size_hint,
                *open_existing,
                now,
            )?,
            MetaRequest::Lookup { path } => d.lookup(path)?,
            MetaRequest::Remove { path, recursive } => d.remove(path, *recursive)?,
            MetaRequest::Move { src, dst, replace } => d.rename(src, dst, *replace)?,
            MetaRequest::Enumerate { path } => d.enumerate(path)?,
            MetaRequest::ReleaseSlot { container, slot } => d.release_slot(*container, *slot)?,
            MetaRequest::RecordNames { container, slots } => d.record_names(*container, slots)?,
            MetaRequest::RecordAt {
                container,
                slot,
                name,
            } => d.record_at(*container, *slot, name)?,
            MetaRequest::SetAttrs {
                path,
                mode,
                mtime,
                ttl_ms,
                child_ttl_ms,
            } => d.set_attrs(path, *mode, *mtime, (*ttl_ms, *child_ttl_ms), now)?,
            // writes.rs, leases.rs
            MetaRequest::Map {
                node,
                index,
                count,
                alloc,
                lease,
                first_write,
            } => d.map(
                *node,
                *index,
                *count,
                alloc.then_some(*lease),
                *first_write,
                now,
            )?,
            MetaRequest::Outgrow { node, lease } => d.outgrow(*node, *lease, now)?,
            MetaRequest::Reserve {
                size_hint,
                count,
                storage_class,
                location,
            } => d.reserve(*size_hint, *count, *storage_class, location, now)?,
            MetaRequest::Link {
                node,
                lease,
                size,
                mtime,
                path,
            } => d.link(*node, *lease, *size, *mtime, path, now)?,
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
            MetaRequest::Abort { node, lease } => d.abort(*node, *lease)?,
            MetaRequest::ReplaceBlock {
                node,
                lease,
                index,
                gen,
            } => d.replace_block(*node, *lease, *index, *gen, now)?,
            MetaRequest::Renew { leases } => d.renew_leases(leases, now),
            // servers.rs, drains.rs, resize.rs
            MetaRequest::Register(spec) => d.register(spec)?,
            MetaRequest::Heartbeat {
                server,
                traffic,
                signed,
            } => d.heartbeat(req, *server, *traffic, signed.seq)?,
            MetaRequest::Status => Reply::Status,
            MetaRequest::LocalSocket => Reply::LocalSocket,
            MetaRequest::Policy { set } => d.policy(set)?,
            MetaRequest::Drain { server, cancel } => d.drain(server, *cancel)?,
            MetaRequest::Resize {
                server,
                blocks,
                signed,
            } => d.resize_asked(req, server, *blocks, signed.seq)?,
            // snapshots.rs
            MetaRequest::SnapshotBegin { path } => d.snapshot_begin(path, now)?,
            MetaRequest::SnapshotList { id, entry, block } => {
                d.snapshot_list(*id, *entry, *block)?
            }
            MetaRequest::SnapshotLocate {
                id,
                node,
                index,
                server,
                block,
            } => d.snapshot_locate(*id, *node, *index, *server, *block, now)?,
            MetaRequest::SnapshotEnd { id } => d.snapshot_end(*id)?,
            // sessions.rs
            MetaRequest::SessionOpen { secret, lease_ms } => d.session_open(*secret, *lease_ms)?,
            MetaRequest::SessionRenew { id, secret } => d.session_renew(*id, *secret)?,
            MetaRequest::SessionClose { id, secret } => d.session_close(*id, *secret, now)?,
            MetaRequest::SessionBind { id, secret, path } => d.session_bind(*id, *secret, path)?,
            // quotas.rs
            MetaRequest::QuotaSet { path, quota } => d.quota_set(path, *quota)?,
            MetaRequest::Usage { path } => d.usage(path)?,
            MetaRequest::Quotas => Reply::Quotas,
        };
        // The one place a client's growth meets the quotas: whatever
        // request it is, its effects pass the check or nothing happens.
        let _quota_delta = self.check_quotas(&d.effects)?;
        #[cfg_attr(not(debug_assertions), allow(unused_mut))]
        let mut decision = d.finish(reply);
        #[cfg(debug_assertions)]
        {
            decision.quota_delta = Some(_quota_delta);
        }
        Ok(decision)
    }

    /// Debug builds: the quota check's prediction of how each quota root's
    /// usage changes is what applying the decision did.
    #[cfg(debug_assertions)]
    fn check_quota_prediction(&self, before: &[(NodeId, u64, u64)], d: &Decision) {
        let Some(predicted_all) = &d.quota_delta else {
            return;
        };
        let after = self.quota_roots_usage();
        for &(id, n0, h0) in before {
            let Some(&(_, n1, h1)) = after.iter().find(|a| a.0 == id) else {
                continue;
            };
            let actual = (
                i128::from(n1) - i128::from(n0),
                i128::from(h1) - i128::from(h0),
            );
            let predicted = predicted_all
                .iter()
                .find(|p| p.0 == id)
                .map_or((0, 0), |p| (p.1, p.2));
            assert_eq!(
                actual, predicted,
                "quota root {id}: the quota check predicted (nodes, held) {predicted:?}, \
                 applying the decision changed them by {actual:?}: {:?}",
                d.effects
            );
        }
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
    /// Pieces taken by this draft, per slab (a reservation takes several).
    pieces_taken: BTreeMap<(u32, u32), u32>,
    /// Slabs stamped by this draft.
    stamped: BTreeSet<(u32, u32)>,
    /// The soft state the decision changes.
    notes: Notes,
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
            pieces_taken: BTreeMap::new(),
            stamped: BTreeSet::new(),
            notes: Notes::default(),
        }
    }

    fn finish(self, reply: Reply) -> Decision {
        #[cfg(debug_assertions)]
        self.check_fresh();
        Decision {
            effects: self.effects,
            reply,
            notes: self.notes,
            #[cfg(debug_assertions)]
            quota_delta: None,
            #[cfg(debug_assertions)]
            basis: self.st.applied,
        }
    }

    fn push(&mut self, e: Effect) {
        self.effects.push(e);
    }

    fn ns(&self) -> &'a Namespace {
        &self.st.ns
    }

    /// Bytes per block of data node `n` ([`MetaState::block_size_of`]).
    fn bs_of(&self, n: &crate::namespace::Node) -> u64 {
        u64::from(self.st.block_size_of(n))
    }
}

/// A deliberately injected bug, to show the simulation (`crate::sim`)
/// catches it: each one is tested there.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bug {
    /// Replacing a KeyValue drops the old value without freeing its blocks.
    LeakOnReplace,
    /// Reusing a freed piece does not fence its slab (the stamp keeps the
    /// generation), so the piece is reused under the generation old handles
    /// still carry.
    PieceReusedUnfenced,
    /// A block a snapshot pins is given back to the free list when its
    /// node frees it, instead of being held.
    PinnedBlockFreed,
    /// A lapsed write lease is released without freeing the blocks past
    /// the node's published size (they stay allocated until it is
    /// deleted).
    LapseKeepsBlocks,
    /// A lapsed write lease frees the node's last published block too
    /// (its published bytes lose their block).
    LapseFreesPublished,
    /// A File that outgrows its piece switches to its new block at once,
    /// before its writer has copied the piece there.
    OutgrowSwitchesEarly,
    /// A session's end forgets what it bound without making it expire
    /// (the bound nodes outlive their session).
    SessionEndKeepsBound,
}

#[cfg(test)]
mod tests;
