//! The invariants of the state (ARCHITECTURE.md, `meta`), checked in
//! full by [`MetaState::check_invariants`].

use super::MetaState;
use crate::namespace::{NodeId, Slot};
use crate::slab::{Piece, HELD};
use nodekernel_proto::NodeType;
use std::collections::{BTreeMap, BTreeSet};

impl MetaState {
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
