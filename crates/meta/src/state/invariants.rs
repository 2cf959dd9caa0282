//! The invariants of the state (ARCHITECTURE.md, `meta`): checked in
//! full by [`MetaState::check_invariants`] (the simulation does after
//! every step), and where a decision acted by
//! [`MetaState::check_decision`], which debug builds run after every
//! committed decision — with the full check too while the state is small,
//! and now and then when it is not ([`FULL_CHECK_MAX`]) — so every test
//! of a cluster checks them.

use super::{MetaState, SLAB_MOVE};
use crate::effect::Effect;
use crate::namespace::{Node, NodeId, Slot, ROOT};
use crate::slab::{Piece, HELD};
use nodekernel_proto::{record, NodeType};
use std::collections::{BTreeMap, BTreeSet};

/// The largest state (in the units of `check_cost`: nodes, blocks and
/// slab pieces) for which a debug build checks every invariant after each
/// decision. The full check walks everything, so above it, it runs after
/// one decision in `cost /` [`FULL_CHECK_WORK`]: about that much of its
/// work per decision, on average.
#[cfg(debug_assertions)]
pub const FULL_CHECK_MAX: u64 = 1024;
/// See [`FULL_CHECK_MAX`].
#[cfg(debug_assertions)]
pub const FULL_CHECK_WORK: u64 = 4;

impl MetaState {
    /// The durable state as text, in a fixed order: two states that dump
    /// the same are the same (liveness and pending claims aside).
    #[cfg(test)]
    pub(crate) fn dump(&self) -> String {
        format!(
            "{}{}{:?}\nnext_lease {} lease_ms {} moves {:?}\nheld {:?}\nballooned {:?}\nquotas {:?}\n",
            self.ns.dump(),
            self.alloc.dump(),
            self.slabs,
            self.next_lease,
            self.lease_ms,
            self.moves,
            self.held,
            self.ballooned,
            self.acct.quotas().collect::<Vec<_>>()
        )
    }

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
    ///   unlinked roots;
    /// - every container's usage, kept as effects apply, is what a recount
    ///   of the namespace finds, and every quota root is a container.
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
        let life = self.ns.lifetimes();
        if !life.is_consistent() {
            return Err(
                "the lifetimes' indexes disagree (expiries, bindings or session deadlines)".into(),
            );
        }
        if let Some(id) = life.nodes().find(|id| self.ns.get(*id).is_none()) {
            return Err(format!("node {id} has a lifetime but does not exist"));
        }
        for n in self.ns.nodes() {
            for b in &n.blocks {
                if self.alloc.server(b.server).is_some() {
                    own(b.server, b.block, b.gen, n.id)?;
                }
            }
            self.check_node(n)?;
            if let Some(l) = n.lease {
                if !leases.insert(l.id) {
                    return Err(format!("lease {} of node {} is not unique", l.id, n.id));
                }
            }
            if n.ty.is_container() {
                if !n.slots.is_consistent() {
                    return Err(format!("slot table of node {} is inconsistent", n.id));
                }
                for (name, child) in n.children.iter() {
                    let c = self
                        .ns
                        .get(*child)
                        .ok_or_else(|| format!("node {} lists missing child {child}", n.id))?;
                    check_child(n, name, c)?;
                }
                let layout = self.record_layout(n);
                for (s, state) in n.slots.iter() {
                    let first = match state {
                        Slot::Live(c) => Some(c),
                        Slot::Clearing => None,
                        Slot::Free | Slot::Tail => continue,
                    };
                    // A record takes the slots its name needs, in one extent.
                    let len = n.slots.record_slots(s);
                    if layout.locate(s).0 != layout.locate(s + len - 1).0
                        || len > record::MAX_RECORD_SLOTS
                    {
                        return Err(format!(
                            "the record at slot {s} of node {} ({len} slots) straddles extents",
                            n.id
                        ));
                    }
                    let Some(c) = first else { continue };
                    if self.ns.get(c).is_none_or(|c| {
                        c.slot.get() != Some(s)
                            || c.parent != n.id
                            || record::slots_for(c.name.len()) != len
                    }) {
                        return Err(format!(
                            "slot {s} of node {} names child {c} in {len} slots, which disagrees",
                            n.id
                        ));
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
                    Some(n) if n.piece != Some(piece) && !n.slots.pieces().contains(&piece) => {
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
        self.check_usage()?;
        Ok(())
    }

    /// Whether `n` is in a removed subtree (under, or itself, an unlinked
    /// container), which the reaper takes apart a bounded step at a time:
    /// a container there may have lost record blocks already.
    fn being_reaped(&self, n: &Node) -> bool {
        let mut cur = n;
        while cur.id != ROOT {
            match self.ns.get(cur.parent) {
                Some(parent) if cur.linked => cur = parent,
                _ => return true,
            }
        }
        false
    }

    /// The invariants of node `n` alone: a piece or blocks, never both
    /// (but for a File whose writer outgrew its piece and has not synced
    /// since); its piece is its own; a container's record pieces are its own, of its
    /// layout's sizes, and with its blocks hold all its slots (unless it
    /// is being reaped); its lease is below the next lease id; without a
    /// writer, a linked data node holds no block wholly past its published
    /// size (closes, aborts, lapsed leases and restarts give them back).
    fn check_node(&self, n: &Node) -> std::result::Result<(), String> {
        if let Some(p) = &n.piece {
            if !n.blocks.is_empty() && (n.ty != NodeType::File || n.lease.is_none()) {
                return Err(format!(
                    "{} {} has a piece and blocks without a writer outgrowing it",
                    n.ty, n.id
                ));
            }
            if self.alloc.server(p.server).is_some() && !self.slabs.is_owner(p, n.id) {
                return Err(format!("node {} holds piece {p:?}, not its own", n.id));
            }
        }
        let layout = self.record_layout(n);
        let pieces = n.slots.pieces();
        if !pieces.is_empty() && !n.ty.is_container() {
            return Err(format!("{} {} has record pieces", n.ty, n.id));
        }
        for (k, p) in pieces.iter().enumerate() {
            if layout.piece_size(k) != Some(p.size) {
                return Err(format!(
                    "record piece {k} of container {} is {} bytes, not {:?}",
                    n.id,
                    p.size,
                    layout.piece_size(k)
                ));
            }
            if self.alloc.server(p.server).is_some() && !self.slabs.is_owner(p, n.id) {
                return Err(format!(
                    "container {} holds record piece {p:?}, not its own",
                    n.id
                ));
            }
        }
        if n.ty.is_container() && !self.being_reaped(n) {
            let extents = pieces.len() + n.blocks.len();
            let need = layout.extents_for(n.slots.len());
            // Blocks come only after every piece extent.
            let gap =
                !pieces.is_empty() && !n.blocks.is_empty() && pieces.len() < layout.piece_extents();
            if extents < need || gap {
                return Err(format!(
                    "container {} has {} slots in {extents} record extents ({} pieces), needs {need}",
                    n.id,
                    n.slots.len(),
                    pieces.len()
                ));
            }
        }
        match n.lease {
            Some(l) if l.id >= self.next_lease => Err(format!(
                "lease {} of node {} is not below the next lease id {}",
                l.id, n.id, self.next_lease
            )),
            None if n.linked
                && !n.ty.is_container()
                && n.blocks.len() as u64 > self.blocks_published(n) =>
            {
                Err(format!(
                    "node {} has no writer but holds {} blocks for its {} published bytes",
                    n.id,
                    n.blocks.len(),
                    n.size
                ))
            }
            _ => Ok(()),
        }
    }

    /// The invariants a decision that made `effects` may have broken,
    /// checked only where it acted, in time proportional to what it
    /// touched rather than to the state:
    /// - every node it touched keeps its own invariants
    ///   (`MetaState::check_node`), holds no block twice nor one with a
    ///   generation not below the next, and, if linked, agrees with its
    ///   parent (listed under its name, with its record slot);
    /// - a node it dropped is gone;
    /// - every block it placed (data, child records, a move's target, a
    ///   slab) has a generation below the next;
    /// - a slab it touched is not kept empty;
    /// - a server it touched has no more free blocks than it exports.
    pub fn check_decision(&self, effects: &[Effect]) -> std::result::Result<(), String> {
        let next_gen = self.alloc.next_gen();
        let mut nodes = BTreeSet::new();
        let mut placed = Vec::new();
        let mut slabs = BTreeSet::new();
        let mut servers = BTreeSet::new();
        for e in effects {
            match e {
                Effect::NodeCreated(n) => {
                    nodes.insert(n.id);
                }
                Effect::Linked { id, .. } | Effect::Unlinked { id } | Effect::Moved { id, .. } => {
                    nodes.insert(*id);
                }
                Effect::Replaced { old, new } => {
                    nodes.extend([*old, *new]);
                }
                Effect::Dropped { ids } => {
                    if let Some(id) = ids.iter().find(|id| self.ns.get(**id).is_some()) {
                        return Err(format!("node {id} was dropped but is still there"));
                    }
                }
                Effect::SlotReleased {
                    container: node, ..
                }
                | Effect::BlocksTruncated { node, .. }
                | Effect::BlockStamped { node, .. }
                | Effect::SizeSet { node, .. }
                | Effect::LeaseSet { node, .. }
                | Effect::LeaseCleared { node }
                | Effect::PieceOutgrown { node }
                | Effect::Aimed { node, .. }
                | Effect::AttrsSet { node, .. }
                | Effect::LifetimeSet { node, .. }
                | Effect::SessionBound { node, .. } => {
                    nodes.insert(*node);
                }
                Effect::QuotaSet { node, .. } => {
                    nodes.insert(*node);
                    if self.acct.quota(*node).is_some()
                        && !self.ns.get(*node).is_some_and(|n| n.ty.is_container())
                    {
                        return Err(format!("node {node} has a quota but is not a container"));
                    }
                }
                Effect::BlockAdded { node, block } | Effect::BlockSwapped { node, block, .. } => {
                    nodes.insert(*node);
                    placed.push(*block);
                }
                Effect::BlockFreed { block }
                | Effect::BlockHeld { block }
                | Effect::Ballooned { block } => {
                    servers.insert(block.server);
                }
                Effect::MoveStarted { node, to, .. } => {
                    nodes.extend((*node != SLAB_MOVE).then_some(*node));
                    placed.push(*to);
                }
                Effect::MoveEnded { node, .. } => {
                    nodes.extend((*node != SLAB_MOVE).then_some(*node));
                }
                Effect::SlabCreated { block, .. } => {
                    slabs.insert((block.server, block.block));
                    placed.push(*block);
                }
                Effect::PieceTaken { node, piece }
                | Effect::RecordPieceSwapped { node, piece, .. } => {
                    nodes.insert(*node);
                    slabs.insert((piece.server, piece.block));
                }
                Effect::PieceFreed { piece } | Effect::PieceHeld { piece } => {
                    slabs.insert((piece.server, piece.block));
                }
                Effect::SlabStamped { server, block, .. }
                | Effect::SlabReleased { server, block } => {
                    slabs.insert((*server, *block));
                }
                Effect::ServerAdded { id, .. }
                | Effect::ServerRetired { id }
                | Effect::ServerReaddressed { id, .. } => {
                    servers.insert(*id);
                }
                Effect::CountersRaised { .. }
                | Effect::SessionOpened { .. }
                | Effect::SessionEnded { .. } => {}
            }
        }
        let below_next = |server: u32, block: u32, gen: u64| {
            if gen >= next_gen {
                return Err(format!(
                    "block {block} of server {server} has generation {gen}, not below the next one {next_gen}"
                ));
            }
            Ok(())
        };
        for id in nodes {
            // Gone: dropped by the same decision.
            let Some(n) = self.ns.get(id) else { continue };
            self.check_node(n)?;
            let mut mine = BTreeSet::new();
            for b in n
                .blocks
                .iter()
                .filter(|b| self.alloc.server(b.server).is_some())
            {
                below_next(b.server, b.block, b.gen)?;
                if !mine.insert((b.server, b.block)) {
                    return Err(format!(
                        "block {} of server {} is owned by nodes {id} and {id}",
                        b.block, b.server
                    ));
                }
                servers.insert(b.server);
            }
            if n.linked && id != ROOT {
                let p = self.ns.get(n.parent).ok_or_else(|| {
                    format!("node {id} is linked under missing node {}", n.parent)
                })?;
                if p.children.get(&n.name) != Some(&id) {
                    return Err(format!("child {id} of node {} disagrees", p.id));
                }
                check_child(p, &n.name, n)?;
            }
        }
        // (That a block handed out was free, the allocator asserts as it
        // takes it; a free list is not searched here: it may be long.)
        for b in placed
            .iter()
            .filter(|b| self.alloc.server(b.server).is_some())
        {
            below_next(b.server, b.block, b.gen)?;
            servers.insert(b.server);
        }
        for (server, block) in slabs {
            if let Some(slab) = self.slabs.get(server, block) {
                if slab.used() == 0 {
                    return Err(format!("slab {block} of server {server} is empty but kept"));
                }
                below_next(server, block, slab.gen)?;
            }
        }
        for id in servers {
            if let Some(s) = self.alloc.server(id) {
                if s.free.len() > s.exported_blocks() {
                    return Err(format!(
                        "server {id}: {} blocks free, more than the {} it exports",
                        s.free.len(),
                        s.exported_blocks()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether a debug build checks every invariant after the decision
    /// just applied: always while the state is small ([`FULL_CHECK_MAX`]),
    /// else once every `cost / FULL_CHECK_WORK` decisions, where `cost`
    /// bounds the full check's work from above (nodes, every server's
    /// blocks, and as many pieces per slab as the smallest pieces make).
    #[cfg(debug_assertions)]
    fn full_check_due(&self) -> bool {
        let blocks: u64 = self
            .alloc
            .servers()
            .map(|(_, s)| u64::from(s.spec.num_blocks))
            .sum();
        let pieces =
            self.slabs.len() as u64 * u64::from(self.alloc.block_size() / crate::slab::MIN_PIECE);
        let cost = self.ns.len() as u64 + blocks + pieces;
        cost <= FULL_CHECK_MAX || self.applied.is_multiple_of(cost / FULL_CHECK_WORK)
    }

    /// Run by [`MetaState::commit`] in debug builds after each decision:
    /// [`MetaState::check_decision`], and [`MetaState::check_invariants`]
    /// when due (`full_check_due`). Panics with the invariant broken and the
    /// decision's effects: a bug, caught where it happened.
    #[cfg(debug_assertions)]
    pub(super) fn debug_check(&self, effects: &[Effect]) {
        // With a bug injected, the simulation must find it on its own.
        #[cfg(test)]
        if self.bug.is_some() {
            return;
        }
        let checked = self.check_decision(effects).and_then(|()| {
            if self.full_check_due() {
                self.check_invariants()
            } else {
                Ok(())
            }
        });
        if let Err(e) = checked {
            panic!("a decision broke an invariant of the metadata state: {e}\nits effects: {effects:?}");
        }
    }
}

/// Child `c`, listed as `name` in container `n`, agrees with it: it
/// names `n` as its parent and `name` as its name, is linked, and holds
/// a record slot, live with it, exactly when `n` is enumerable.
fn check_child(n: &Node, name: &str, c: &Node) -> std::result::Result<(), String> {
    let child = c.id;
    if c.parent != n.id || *c.name != *name || !c.linked {
        return Err(format!("child {child} of node {} disagrees", n.id));
    }
    match (n.enumerable, c.slot.get()) {
        (true, Some(s)) if n.slots.get(s) == Some(Slot::Live(child)) => Ok(()),
        (false, None) => Ok(()),
        (e, s) => Err(format!(
            "child {child} of node {} (enumerable {e}) has record slot {s:?}",
            n.id
        )),
    }
}

#[cfg(debug_assertions)]
impl super::Draft<'_> {
    /// Every generation a decision hands out (a block placed, freed,
    /// fenced, held or ballooned; a slab stamped; a move's target and
    /// fence) is fresh: at or above the state's next generation when it
    /// was decided, so no old holder of a location can pass for a new one.
    /// Run by `Draft::finish` in debug builds.
    pub(super) fn check_fresh(&self) {
        #[cfg(test)]
        if self.st.bug.is_some() {
            return;
        }
        let first = self.st.alloc.next_gen();
        for e in &self.effects {
            let gens = match e {
                Effect::BlockAdded { block, .. }
                | Effect::BlockSwapped { block, .. }
                | Effect::BlockFreed { block }
                | Effect::BlockHeld { block }
                | Effect::Ballooned { block }
                | Effect::SlabCreated { block, .. } => [Some(block.gen), None],
                Effect::BlockStamped { gen, .. } | Effect::SlabStamped { gen, .. } => {
                    [Some(*gen), None]
                }
                Effect::MoveStarted { to, fence, .. } => [Some(to.gen), Some(*fence)],
                _ => [None, None],
            };
            for gen in gens.into_iter().flatten() {
                assert!(
                    gen >= first,
                    "a decision handed out generation {gen}, below the next one {first}: {e:?}"
                );
            }
        }
    }
}
