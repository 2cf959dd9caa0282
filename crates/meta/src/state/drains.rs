//! Drains: a drained storage server gets no new blocks, and the shell's
//! drainer moves what it holds (data and child-record blocks, slabs; not
//! what a running snapshot reads) to other servers. Soft state, like
//! liveness.

use super::{slab_move_index, slab_of, Draft, MetaState, Reply, SLAB_MOVE};
use crate::namespace::NodeId;
use nodekernel_proto::types::{DrainState, DrainStatus};
use nodekernel_proto::{Error, Result, NO_CLASS};

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

impl Draft<'_> {
    /// Starts (or, with `cancel`, stops) draining storage server `server`
    /// (its identity or address); the reply reports the progress.
    pub(super) fn drain(&mut self, server: &str, cancel: bool) -> Result<Reply> {
        let id = self.st.find_server(server)?;
        if !cancel && !self.st.alloc.is_alive(id) {
            return Err(Error::data_lost(format!(
                "storage server {server} is dead: its blocks are lost and cannot be moved; it leaves the cluster after meta.retire_after_ms"
            )));
        }
        self.notes.drain = Some((id, !cancel));
        Ok(Reply::Drain(id))
    }
}

impl MetaState {
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
}
