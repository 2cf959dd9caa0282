//! Block moves (`docs/tiering.md`): a node's block, or a whole slab
//! with every small value in it, fenced and given a target
//! (`decide_move_start`), copied store to store by the shell, and switched
//! or given up (`decide_move_end`). Drains and tier migration both move
//! blocks this way.

use super::replies::Grant;
use super::{Decision, Draft, MetaState, Reply};
use crate::alloc::BlockRef;
use crate::effect::Effect;
use crate::namespace::{stale, NodeId};
use crate::slab::{Piece, HELD};
use nodekernel_proto::{BlockLoc, Error, Result};

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
pub(super) fn slab_of(index: u64) -> (u32, u32) {
    ((index >> 32) as u32, index as u32)
}

impl MetaState {
    /// Whether the slab of `p` is being moved.
    pub(super) fn slab_moving(&self, p: &Piece) -> bool {
        self.moves
            .contains_key(&(SLAB_MOVE, slab_move_index(p.server, p.block)))
    }
}

/// A block move in progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// Where the block goes.
    pub to: BlockRef,
    /// The generation the block was fenced with when the move started.
    pub fence: u64,
}

impl MetaState {
    /// Blocks being moved, by (node, index).
    pub fn moves(&self) -> impl Iterator<Item = ((NodeId, u64), Move)> + '_ {
        self.moves.iter().map(|(k, v)| (*k, *v))
    }

    /// Starts moving block `index` of `node` to another server (of
    /// `class`, or of any class when
    /// [`NO_CLASS`](nodekernel_proto::NO_CLASS)). Returns the decision and
    /// the move: (source location at the fence generation, target
    /// location).
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
    pub(super) fn slab_pinned(&self, server: u32, block: u32) -> bool {
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
}
