//! The effect applier: [`MetaState::apply_effect`], the only way the
//! durable state changes, and the block claims it queues for the shell
//! (freed, fenced and new container blocks, stamped with their
//! generation; scrubs of blocks handed to encrypted data). Replaying a
//! log record applies its effects the same way.

use super::{slab_of, MetaState, Move, SLAB_MOVE};
use crate::alloc::{BlockAllocator, BlockClaim, BlockRef};
use crate::effect::Effect;
use crate::lifetimes::Session;
use crate::namespace::{Namespace, NodeId};
use crate::slab::Piece;
use crate::slab::Slabs;
use nodekernel_proto::cap::{Cap, Rights};
use nodekernel_proto::Result;
use std::collections::BTreeMap;

impl MetaState {
    /// Applies one effect: the only way the durable state changes. The
    /// claim an effect needs (a freed, fenced or new container block) is
    /// queued for [`MetaState::take_claims`].
    pub fn apply_effect(&mut self, e: &Effect) {
        match e {
            // Each change of where a node counts takes its usage away
            // from its ancestors before, and adds it back after
            // (`quotas.rs`).
            Effect::NodeCreated(n) => {
                self.ns.insert(n);
                self.count(n.id);
            }
            Effect::Linked { id, slot } => {
                self.uncount(*id);
                self.ns.link(*id, *slot);
                self.count(*id);
            }
            Effect::Replaced { old, new } => {
                self.uncount(*old);
                self.ns.replace(*old, *new);
                self.acct.forget(*old);
            }
            Effect::Unlinked { id } => {
                self.uncount(*id);
                self.ns.unlink(*id);
            }
            Effect::Dropped { ids } => {
                for id in ids {
                    self.uncount(*id);
                    self.ns.drop_node(*id);
                    self.acct.forget(*id);
                    self.forget_heat(*id);
                }
            }
            Effect::Moved {
                id,
                parent,
                name,
                slot,
            } => {
                self.uncount(*id);
                self.ns.move_node(*id, *parent, name, *slot);
                self.count(*id);
            }
            Effect::SlotReleased { container, slot } => self.ns.release_slot(*container, *slot),
            Effect::BlockAdded { node, block } => {
                self.alloc.take(block.server, block.block, block.gen);
                self.charge_block(*node, block.server, true);
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
                if let Some(old) = self
                    .ns
                    .get(*node)
                    .and_then(|n| n.blocks.get(*index as usize))
                    .map(|b| b.server)
                {
                    self.charge_block(*node, old, false);
                    self.charge_block(*node, block.server, true);
                }
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
                self.charge_truncate(*node, *len);
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
            Effect::LifetimeSet {
                node,
                expires_ms,
                child_ttl_ms,
            } => self.ns.set_lifetime(*node, *expires_ms, *child_ttl_ms),
            Effect::SessionOpened {
                id,
                secret,
                lease_ms,
            } => self.ns.lifetimes_mut().open_session(
                *id,
                Session {
                    secret: *secret,
                    lease_ms: *lease_ms,
                },
            ),
            Effect::SessionEnded { id, at_ms } => {
                #[cfg(test)]
                if self.bug == Some(super::Bug::SessionEndKeepsBound) {
                    // Expiry 0 is none: the bound nodes stay.
                    self.ns.lifetimes_mut().end_session(*id, 0);
                    return;
                }
                self.ns.lifetimes_mut().end_session(*id, *at_ms)
            }
            Effect::SessionBound { node, session } => self.ns.bind_session(*node, *session),
            Effect::QuotaSet { node, bytes, nodes } => {
                if self.ns.get(*node).is_some_and(|n| n.ty.is_container()) {
                    self.acct.set_quota(
                        *node,
                        nodekernel_proto::quota::Quota {
                            bytes: *bytes,
                            nodes: *nodes,
                        },
                    );
                }
            }
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
                self.charge_size(*node, *size);
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
                // Its blocks now count as on a retired server.
                self.recount_usage();
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
                        let size = self.slabs.get(server, block).map_or(0, |s| s.piece_size);
                        for (i, owner) in self.slabs.relocate(server, block, m.to, class) {
                            let piece = Piece {
                                server: m.to.server,
                                block: m.to.block,
                                index: i,
                                size,
                            };
                            let own_piece = self.ns.get(owner).is_some_and(|n| {
                                n.piece.is_some_and(|p| {
                                    (p.server, p.block, p.index) == (server, block, i)
                                })
                            });
                            if own_piece {
                                self.charge_piece(owner, server, size, false);
                                self.charge_piece(owner, m.to.server, size, true);
                            }
                            self.ns.move_piece(owner, (server, block), piece);
                        }
                    } else if *done {
                        if let Some(old) = self
                            .ns
                            .get(*node)
                            .and_then(|n| n.blocks.get(*index as usize))
                            .map(|b| b.server)
                        {
                            self.charge_block(*node, old, false);
                            self.charge_block(*node, m.to.server, true);
                        }
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
                if let Some(old) = self.ns.get(*node).and_then(|n| n.piece) {
                    self.charge_piece(*node, old.server, old.size, false);
                }
                self.charge_piece(*node, piece.server, piece.size, true);
                self.ns.take_piece(*node, *piece);
            }
            Effect::PieceOutgrown { node } => {
                if let Some(old) = self.ns.get(*node).and_then(|n| n.piece) {
                    self.charge_piece(*node, old.server, old.size, false);
                }
                self.ns.outgrow_piece(*node);
            }
            Effect::Aimed { node, parent, name } => {
                self.uncount(*node);
                self.ns.aim(*node, *parent, name);
                self.count(*node);
            }
            Effect::RecordPieceSwapped { node, index, piece } => {
                self.slabs.take(piece, *node);
                self.ns.swap_record_piece(*node, *index as usize, *piece);
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
    pub(super) fn claim(&mut self, b: BlockRef) {
        self.claim_with(b, None);
    }

    /// [`MetaState::claim`] that also clears the tag at `clear_tag_at`.
    fn claim_with(&mut self, b: BlockRef, clear_tag_at: Option<u32>) {
        if let Some(addr) = self.alloc.server_addr(b.server) {
            let cap = self.alloc.signer(b.server).map_or_else(Cap::default, |s| {
                s.mint(
                    b.block,
                    b.gen,
                    0,
                    self.alloc.block_size(),
                    Rights::MANAGE,
                    0,
                )
            });
            self.claims.push(BlockClaim {
                server: b.server,
                addr: addr.to_string(),
                block: b.block,
                gen: b.gen,
                clear_tag_at,
                release: false,
                scrub: false,
                cap,
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
    pub(super) fn scrub(&mut self, b: BlockRef) {
        let Some(gen) = b.gen.checked_sub(1).filter(|g| *g > 0) else {
            return;
        };
        let queued = self.claims.len();
        self.claim(BlockRef { gen, ..b });
        if let Some(c) = self.claims.get_mut(queued) {
            c.scrub = true;
        }
    }

    /// Replays one record of the operation log: the effects of one
    /// decision, as [`crate::codec::encode_effects`] wrote them. Claims are
    /// not queued again: they went out before the crash or were lost with
    /// it, and generations keep old holders out either way.
    pub fn replay(&mut self, record: &[u8]) -> Result<()> {
        for e in crate::codec::decode_effects(record)? {
            self.apply_effect(&e);
        }
        #[cfg(debug_assertions)]
        {
            self.applied += 1;
        }
        self.claims.clear();
        Ok(())
    }
}

/// The durable parts of a state, as a checkpoint holds them
/// (`crate::checkpoint`): everything [`MetaState::apply_effect`] changes.
pub(crate) struct Parts {
    pub ns: Namespace,
    pub alloc: BlockAllocator,
    pub slabs: Slabs,
    pub next_lease: u64,
    pub moves: BTreeMap<(NodeId, u64), Move>,
    pub held: BTreeMap<(u32, u32), u64>,
    pub ballooned: BTreeMap<(u32, u32), u64>,
    /// Quota roots and their limits.
    pub quotas: Vec<(NodeId, nodekernel_proto::quota::Quota)>,
}

impl MetaState {
    /// The state made of checkpointed `parts`; its soft state starts
    /// empty, as after [`MetaState::new`].
    pub(crate) fn from_parts(lease_ms: u64, parts: Parts) -> MetaState {
        let mut st = MetaState::new(parts.alloc.block_size(), lease_ms, 1);
        st.ns = parts.ns;
        st.alloc = parts.alloc;
        st.slabs = parts.slabs;
        st.next_lease = parts.next_lease;
        st.moves = parts.moves;
        st.held = parts.held;
        let mut per_server: BTreeMap<u32, u32> = BTreeMap::new();
        for (server, _) in parts.ballooned.keys() {
            *per_server.entry(*server).or_default() += 1;
        }
        for (server, n) in per_server {
            st.alloc.set_ballooned(server, n);
        }
        st.ballooned = parts.ballooned;
        for (id, q) in parts.quotas {
            st.acct.set_quota(id, q);
        }
        // The usage is derived: one pass over the nodes.
        st.recount_usage();
        st
    }

    /// The next lease id to hand out.
    pub(crate) fn next_lease(&self) -> u64 {
        self.next_lease
    }

    /// Blocks withdrawn from their servers' exported capacity (dynamic
    /// capacity): (server, block) and their generation.
    pub(crate) fn ballooned_blocks(&self) -> impl Iterator<Item = ((u32, u32), u64)> + '_ {
        self.ballooned.iter().map(|(k, g)| (*k, *g))
    }
}
