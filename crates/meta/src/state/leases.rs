//! Write leases: granted with a create or an open, renewed by the
//! writer's calls and by `Renew`, and *lapsed* when the writer is gone
//! (its lease expired and the sweep came, or the metadata server
//! restarted): what it wrote past the published size is freed, the rest
//! fenced.

use super::{Decision, Draft, MetaState, Reply, REAP_BLOCKS};
use crate::alloc::BlockRef;
use crate::effect::Effect;
use crate::namespace::{stale, Lease, Node, NodeId};
use crate::slab::{Piece, HELD};
use nodekernel_proto::{Error, Result};
use std::collections::BTreeSet;

impl MetaState {
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

    /// What a restart changes, decided once the log is replayed
    /// (`docs/persistence.md`, *Restart*): the writers of the old process
    /// are gone, so every lease lapses (`Draft::lapse`: a File open for
    /// writing keeps its last synced size and the blocks it needs,
    /// fenced), puts that never closed are dropped with their blocks, and
    /// block moves in flight are given up. Node ids, lease ids and
    /// generations are raised to `floor` (the server passes wall-clock
    /// microseconds): with `fsync` `interval` or `never`, a machine crash
    /// may lose the log's last records, and what they handed out to
    /// clients must never be handed out again. `None` when there is
    /// nothing to change.
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
}

impl<'a> Draft<'a> {
    pub(super) fn grant(&mut self, node: NodeId, now: u64) -> u64 {
        let id = self.next_lease;
        self.next_lease += 1;
        self.renew(node, id, now);
        id
    }

    pub(super) fn renew(&mut self, node: NodeId, id: u64, now: u64) {
        self.push(Effect::LeaseSet {
            node,
            lease: Lease {
                id,
                expires_ms: now + self.st.lease_ms,
            },
        });
    }

    /// Renews the write leases (node, lease id) a client still holds; the
    /// reply names the nodes whose leases are no longer held.
    pub(super) fn renew_leases(&mut self, leases: &[(NodeId, u64)], now: u64) -> Reply {
        let mut lost = Vec::new();
        for &(node, lease) in leases {
            match self.writable(node, lease) {
                Ok(_) => self.renew(node, lease, now),
                Err(_) => lost.push(node),
            }
        }
        Reply::Renewed(lost)
    }

    /// The node, if `lease` is its current write lease. A lease that expired
    /// but was not taken over stays usable (and is renewed by the caller).
    pub(super) fn writable(&self, node: NodeId, lease: u64) -> Result<&'a Node> {
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

    /// The writer of `n` is gone (its lease expired, or the metadata
    /// server restarted): what it wrote past the published size is
    /// dropped, its blocks freed (fenced, or held for a snapshot), and
    /// the blocks that stay (or a small value's slab) get a new
    /// generation, so the old writer's late writes get `Stale` and its
    /// re-map `LeaseExpired` (once the caller clears or replaces the
    /// lease); moves of its blocks are given up. Readers of the published
    /// bytes re-map and read on.
    pub(super) fn lapse(&mut self, n: &Node) {
        let keep = self.st.blocks_published(n) as usize;
        #[cfg(test)]
        let keep = match self.st.bug {
            Some(super::Bug::LapseKeepsBlocks) => n.blocks.len(),
            Some(super::Bug::LapseFreesPublished) => keep.saturating_sub(1),
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
}
