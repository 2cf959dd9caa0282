//! A node's blocks inside a decision: handed out, and freed — fenced
//! with a fresh generation either way, and held instead of freed while a
//! snapshot pins them — with the moves of the blocks freed given up.

use super::Draft;
use crate::alloc::BlockRef;
use crate::effect::Effect;
use crate::namespace::{Node, NodeId};

impl Draft<'_> {
    pub(super) fn add_block(&mut self, node: NodeId, block: BlockRef) {
        *self.added.entry(node).or_default() += 1;
        self.push(Effect::BlockAdded { node, block });
    }

    /// Frees block `b` of a node: fenced with a fresh generation either
    /// way; held instead of given back while a snapshot pins it.
    pub(super) fn free(&mut self, b: BlockRef) {
        if self.st.snapshots.pins_block(b.server, b.block, &[])
            && self.st.alloc.server(b.server).is_some()
        {
            #[cfg(test)]
            if self.st.bug == Some(super::Bug::PinnedBlockFreed) {
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
    pub(super) fn release_block(&mut self, b: BlockRef) {
        let gen = self.plan.free(b);
        self.push(Effect::BlockFreed {
            block: BlockRef { gen, ..b },
        });
    }

    /// Frees every block of `node` (and the target of any move of them),
    /// or its piece.
    pub(super) fn free_node_blocks(&mut self, node: NodeId) {
        let Some(n) = self.ns().get(node) else {
            return;
        };
        for b in &n.blocks {
            self.free(*b);
        }
        for p in n.piece.iter().chain(n.slots.pieces()) {
            self.free_piece(*p);
        }
        self.end_moves(node, 0);
    }

    /// Frees the blocks of `n` from block `keep` on (and their moves).
    pub(super) fn truncate(&mut self, n: &Node, keep: u64) {
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
    pub(super) fn end_moves(&mut self, node: NodeId, from: u64) {
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
}
