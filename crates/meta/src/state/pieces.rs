//! Small values' pieces inside a decision (`docs/small-values.md`): a
//! piece taken (a free one, a quarantined one behind a stamp of its slab,
//! or a new slab), freed (quarantined until the next stamp; held for a
//! snapshot) and the slab given back once its last piece is freed.

use super::{slab_move_index, Draft, SLAB_MOVE};
use crate::alloc::BlockRef;
use crate::effect::Effect;
use crate::namespace::NodeId;
use crate::slab::{stamp_batch, Piece, Slab};

/// Who takes a piece, and as what: the effect that records it.
#[derive(Debug, Clone, Copy)]
pub(super) enum Taker {
    /// A small value, or a container as its next record piece.
    Node(NodeId),
    /// A container, as its record piece `index`, in place of one lost
    /// with its server.
    RecordPiece { node: NodeId, index: u32 },
}

impl Taker {
    fn effect(self, piece: Piece) -> Effect {
        match self {
            Taker::Node(node) => Effect::PieceTaken { node, piece },
            Taker::RecordPiece { node, index } => Effect::RecordPieceSwapped { node, index, piece },
        }
    }
}

impl Draft<'_> {
    /// Gives `taker` a piece of `piece_size` bytes, class by class in
    /// placement order (so small values tier like blocks: the preferred
    /// class first, the location's servers first within a class). Within a
    /// class: a free piece (never used, or fenced by an earlier stamp); else
    /// a slab's quarantined pieces behind a stamp, once it has a batch of
    /// them; else a new slab; else any quarantined piece. Stamping only
    /// whole batches keeps stamps rare under churn: each one makes the
    /// slab's in-flight writers and readers re-map. `None` when there is no
    /// room.
    pub(super) fn take_piece(
        &mut self,
        taker: Taker,
        class: u8,
        location: &str,
        piece_size: u32,
        encrypted: bool,
    ) -> Option<Piece> {
        // Slabs hold encrypted values only, or plain ones only.
        let same = |s: &Slab| s.encrypted == encrypted;
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
                return Some(self.take_found(taker, found));
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
                self.push(taker.effect(piece));
                return Some(piece);
            }
            if let Some(found) =
                self.find_piece(c, location, piece_size, |s| same(s) && s.quarantined() > 0)
            {
                return Some(self.take_found(taker, found));
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
        fits: impl Fn(&Slab) -> bool,
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
                    // Past the pieces this decision took already.
                    let key = (server, block);
                    let taken = self.pieces_taken.get(&key).copied().unwrap_or(0);
                    let stamped = self.stamped.contains(&key);
                    let (index, stamp) = match slab.handout(taken, stamped) {
                        Some(i) => (i, false),
                        None if !stamped => (slab.handout(taken, true)?, true),
                        None => return None,
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

    /// Takes `piece` for `taker`, stamping its slab first if it was
    /// quarantined.
    fn take_found(&mut self, taker: Taker, (piece, stamp): (Piece, bool)) -> Piece {
        if stamp {
            // Quarantined pieces are reused only behind a fence.
            self.stamp_slab((piece.server, piece.block));
        }
        self.push(taker.effect(piece));
        *self.pieces_taken.entry(piece.slab()).or_default() += 1;
        piece
    }

    /// Frees piece `p`: it is quarantined until the slab is next stamped
    /// (when its pieces are needed again), so the freed value's handles get
    /// `Stale` before the piece is reused; a slab left empty gives its
    /// block back instead.
    pub(super) fn free_piece(&mut self, p: Piece) {
        if self.st.slabs.get(p.server, p.block).is_some() && self.st.snapshots.pins_piece(&p, &[]) {
            // Its tag is cleared; its bytes stay for the snapshot.
            self.push(Effect::PieceHeld { piece: p });
            return;
        }
        self.release_piece(p);
    }

    /// Frees piece `p` for reuse (behind a stamp), releasing its slab if
    /// that was the last piece in use.
    pub(super) fn release_piece(&mut self, p: Piece) {
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

    /// Fences every piece of a slab: a fresh generation, claimed.
    pub(super) fn stamp_slab(&mut self, (server, block): (u32, u32)) {
        if self.stamped.insert((server, block)) {
            let gen = self.plan.gen();
            #[cfg(test)]
            let gen = match self.st.slabs.get(server, block) {
                // The injected bug: quarantined pieces freed, not fenced.
                Some(s) if self.st.bug == Some(super::Bug::PieceReusedUnfenced) => s.gen,
                _ => gen,
            };
            self.push(Effect::SlabStamped { server, block, gen });
        }
    }
}
