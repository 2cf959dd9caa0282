//! Small values share blocks: a *slab* is a block cut into equal *pieces*,
//! and a small KeyValue owns one piece instead of a whole block
//! (`docs/small-values.md`).
//!
//! Plain data, no I/O. The block of a slab is taken from its server's free
//! list like any other and counted as used; the slab hands out its pieces
//! and gives the block back once the last one is freed.
//!
//! Staleness: a piece has no generation of its own. The slab's block has
//! one, which every piece's location carries. A freed piece is
//! *quarantined*: it is not handed out again until the slab is stamped with
//! a fresh generation (a fence claimed on the storage server), so a handle
//! to the freed value can never reach the piece's next value. Stamping is
//! lazy and batched ([`stamp_batch`]): a slab is stamped when a batch of its
//! quarantined pieces is needed, fencing all of them at once, so the live
//! pieces' readers and writers re-map once per batch of reuses, not once
//! per freed value (under churn, stamping on every free re-fenced a busy
//! slab faster than its writers could re-map). That a freed value's handle
//! gets `Stale` at once is the tag's job: each piece starts with its
//! value's node id ([`TAG_LEN`] bytes), cleared when the piece is freed.

use crate::alloc::BlockRef;
use nodekernel_proto::codec::{Dec, Enc};
pub use nodekernel_proto::store::{max_piece, piece_size_for, MIN_PIECE, TAG_LEN};
use nodekernel_proto::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};

/// A piece's owner: the id of the node whose value it holds (a
/// [`NodeId`](crate::namespace::NodeId)), or [`HELD`].
pub type Owner = u64;

/// The owner recorded for a piece that was freed while a snapshot still
/// has to read it (`Effect::PieceHeld`): in use, but by no node. Node ids
/// never get this high.
pub const HELD: Owner = u64::MAX;

/// Quarantined pieces a slab gathers before it is stamped to reuse them,
/// while a new slab can still be had instead: an eighth of its pieces, at
/// most 256 (so the space held back is bounded), at least one.
pub fn stamp_batch(pieces: u32) -> usize {
    (pieces / 8).clamp(1, 256) as usize
}

/// One piece: `size` bytes at `index * size` in `block` of `server`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Piece {
    pub server: u32,
    pub block: u32,
    pub index: u32,
    pub size: u32,
}

impl Piece {
    /// Where the piece starts in its block: its value's tag.
    pub fn offset(&self) -> u32 {
        self.index * self.size
    }
    /// Where the value starts in the block, after its tag.
    pub fn value_offset(&self) -> u32 {
        self.offset() + TAG_LEN
    }
    /// The most bytes the value may hold.
    pub fn capacity(&self) -> u32 {
        self.size - TAG_LEN
    }
    pub(crate) fn slab(&self) -> (u32, u32) {
        (self.server, self.block)
    }
}

/// A block cut into pieces of one size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slab {
    pub piece_size: u32,
    /// Storage class of its server (the index of partial slabs is by it).
    pub class: u8,
    /// Generation of the block: every piece's location carries it.
    pub gen: u64,
    /// Holds only encrypted values (scrubbed when created, so its free
    /// pieces hold zeros or ciphertext): only such a slab may move into an
    /// encrypted class (`docs/encryption.md`).
    pub encrypted: bool,
    /// Owner of each piece (0: free).
    owners: Vec<Owner>,
    /// Freed pieces whose old owners' handles are fenced (by a stamp since
    /// they were freed), reused last-freed first.
    freed: Vec<u32>,
    /// Freed pieces not fenced yet: reusable after the next stamp.
    quarantined: Vec<u32>,
    /// Pieces from here on were never used.
    fresh: u32,
    used: u32,
}

impl Slab {
    /// Pieces in use.
    pub fn used(&self) -> u32 {
        self.used
    }

    /// Pieces in all.
    pub fn pieces(&self) -> u32 {
        self.owners.len() as u32
    }

    /// The piece the slab hands out next, if any is free.
    pub fn next_free(&self) -> Option<u32> {
        self.freed
            .last()
            .copied()
            .or_else(|| (self.fresh < self.pieces()).then_some(self.fresh))
    }

    /// The piece the slab hands out after `k` others were taken (freed
    /// ones, last freed first, then never-used ones), and with `stamped`
    /// (a stamp fenced its quarantined pieces once no other was free) the
    /// quarantined ones after those. `handout(0, false)` is
    /// [`Slab::next_free`].
    pub fn handout(&self, k: u32, stamped: bool) -> Option<u32> {
        let quarantined = if stamped { &self.quarantined[..] } else { &[] };
        self.freed
            .iter()
            .rev()
            .copied()
            .chain(self.fresh..self.pieces())
            .chain(quarantined.iter().rev().copied())
            .nth(k as usize)
    }

    /// The piece the slab hands out next once it is stamped (when no piece
    /// is free without one).
    pub fn next_after_stamp(&self) -> Option<u32> {
        self.quarantined.last().copied()
    }

    /// Freed pieces waiting for a stamp.
    pub fn quarantined(&self) -> usize {
        self.quarantined.len()
    }

    pub fn owner(&self, index: u32) -> Option<Owner> {
        self.owners.get(index as usize).copied().filter(|o| *o != 0)
    }

    /// (piece index, owner) of every used piece.
    pub fn owned(&self) -> impl Iterator<Item = (u32, Owner)> + '_ {
        self.owners
            .iter()
            .enumerate()
            .filter(|(_, o)| **o != 0)
            .map(|(i, o)| (i as u32, *o))
    }
}

/// Every slab of one metadata server.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Slabs {
    slabs: BTreeMap<(u32, u32), Slab>,
    /// Slabs with a free or quarantined piece, by (piece size, storage
    /// class).
    partial: BTreeMap<(u32, u8), BTreeSet<(u32, u32)>>,
}

impl Slabs {
    pub fn get(&self, server: u32, block: u32) -> Option<&Slab> {
        self.slabs.get(&(server, block))
    }

    pub fn iter(&self) -> impl Iterator<Item = ((u32, u32), &Slab)> {
        self.slabs.iter().map(|(k, s)| (*k, s))
    }

    pub fn len(&self) -> usize {
        self.slabs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slabs.is_empty()
    }

    /// Slabs of `piece_size` in `class` with a free or quarantined piece,
    /// lowest first (so low slabs fill up and high ones drain and go back).
    pub fn partial(&self, piece_size: u32, class: u8) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.partial
            .get(&(piece_size, class))
            .into_iter()
            .flatten()
            .copied()
    }

    /// Whether `piece` is used by `node`.
    pub fn is_owner(&self, piece: &Piece, node: Owner) -> bool {
        self.slabs
            .get(&piece.slab())
            .is_some_and(|s| s.piece_size == piece.size && s.owner(piece.index) == Some(node))
    }

    /// Every slab in a checkpoint (`crate::checkpoint`).
    pub(crate) fn checkpoint(&self, e: &mut Enc) {
        e.u32(self.slabs.len() as u32);
        for ((server, block), s) in &self.slabs {
            e.u32(*server)
                .u32(*block)
                .u32(s.piece_size)
                .u8(s.class)
                .bool(s.encrypted)
                .u64(s.gen)
                .u32(s.fresh)
                .u32(s.owners.len() as u32);
            for o in &s.owners {
                e.u64(*o);
            }
            for list in [&s.freed, &s.quarantined] {
                e.u32(list.len() as u32);
                for i in list {
                    e.u32(*i);
                }
            }
        }
    }

    /// The slabs of a checkpoint written by [`Slabs::checkpoint`];
    /// without `flagged` (checkpoint formats before 5), as written before
    /// slabs were encrypted or not: every slab is plain.
    pub(crate) fn from_checkpoint(d: &mut Dec, flagged: bool) -> Result<Slabs> {
        let mut out = Slabs::default();
        let n = d.count(33)?;
        for _ in 0..n {
            let (server, block) = (d.u32()?, d.u32()?);
            let (piece_size, class) = (d.u32()?, d.u8()?);
            let encrypted = flagged && d.bool()?;
            let (gen, fresh) = (d.u64()?, d.u32()?);
            let no = d.count(8)?;
            let mut owners = Vec::with_capacity(no);
            for _ in 0..no {
                owners.push(d.u64()?);
            }
            let mut lists = [Vec::new(), Vec::new()];
            for list in &mut lists {
                let nl = d.count(4)?;
                for _ in 0..nl {
                    let i = d.u32()?;
                    if i as usize >= owners.len() {
                        return Err(Error::protocol(format!(
                            "slab {block} of server {server}: piece {i} of {}",
                            owners.len()
                        )));
                    }
                    list.push(i);
                }
            }
            let [freed, quarantined] = lists;
            let used = owners.iter().filter(|o| **o != 0).count() as u32;
            out.slabs.insert(
                (server, block),
                Slab {
                    piece_size,
                    class,
                    gen,
                    encrypted,
                    owners,
                    freed,
                    quarantined,
                    fresh,
                    used,
                },
            );
            out.reindex(server, block);
        }
        Ok(out)
    }

    // ----- appliers ----------------------------------------------------------

    /// `block` (taken from its server's free list) becomes a slab of
    /// `piece_size` pieces, of encrypted values or of plain ones.
    pub(crate) fn create(
        &mut self,
        b: BlockRef,
        class: u8,
        piece_size: u32,
        block_size: u32,
        encrypted: bool,
    ) {
        let n = (block_size / piece_size.max(1)) as usize;
        self.slabs.insert(
            (b.server, b.block),
            Slab {
                piece_size,
                class,
                gen: b.gen,
                encrypted,
                owners: vec![0; n],
                freed: Vec::new(),
                quarantined: Vec::new(),
                fresh: 0,
                used: 0,
            },
        );
        self.reindex(b.server, b.block);
    }

    /// `node` takes `piece`, which must be the slab's next free one.
    pub(crate) fn take(&mut self, piece: &Piece, node: Owner) {
        let Some(s) = self.slabs.get_mut(&piece.slab()) else {
            return;
        };
        debug_assert_eq!(s.next_free(), Some(piece.index), "not the next piece");
        if s.freed.last() == Some(&piece.index) {
            s.freed.pop();
        } else if piece.index == s.fresh {
            s.fresh += 1;
        } else {
            return;
        }
        s.owners[piece.index as usize] = node;
        s.used += 1;
        self.reindex(piece.server, piece.block);
    }

    /// `piece` is free again.
    pub(crate) fn free(&mut self, piece: &Piece) {
        let Some(s) = self.slabs.get_mut(&piece.slab()) else {
            return;
        };
        let Some(o) = s.owners.get_mut(piece.index as usize) else {
            return;
        };
        if *o == 0 {
            return;
        }
        *o = 0;
        s.used -= 1;
        s.quarantined.push(piece.index);
        self.reindex(piece.server, piece.block);
    }

    /// `piece` is freed while a snapshot pins it: it stays in use, owned by
    /// [`HELD`], until [`Slabs::free`] frees it.
    pub(crate) fn hold(&mut self, piece: &Piece) {
        if let Some(o) = self
            .slabs
            .get_mut(&piece.slab())
            .and_then(|s| s.owners.get_mut(piece.index as usize))
        {
            if *o != 0 {
                *o = HELD;
            }
        }
    }

    /// The slab's block gets generation `gen`: every quarantined piece is
    /// fenced, and free.
    pub(crate) fn stamp(&mut self, server: u32, block: u32, gen: u64) {
        if let Some(s) = self.slabs.get_mut(&(server, block)) {
            s.gen = gen;
            let fenced = std::mem::take(&mut s.quarantined);
            s.freed.extend(fenced);
        }
    }

    /// The slab in `block` of `server` now lives in `to` (a copy of its
    /// block, on a server of storage class `class`); returns (piece index,
    /// owner) of its used pieces, whose nodes must follow. Quarantined
    /// pieces stay quarantined: the copy carried their old owners' bytes,
    /// under the new generation, so they wait for a stamp like any other.
    pub(crate) fn relocate(
        &mut self,
        server: u32,
        block: u32,
        to: BlockRef,
        class: u8,
    ) -> Vec<(u32, Owner)> {
        let Some(mut s) = self.slabs.remove(&(server, block)) else {
            return Vec::new();
        };
        self.unindex((s.piece_size, s.class), server, block);
        s.gen = to.gen;
        s.class = class;
        let owned = s.owned().collect();
        self.slabs.insert((to.server, to.block), s);
        self.reindex(to.server, to.block);
        owned
    }

    /// An empty slab stops being one (its block goes back separately).
    pub(crate) fn remove(&mut self, server: u32, block: u32) {
        if let Some(s) = self.slabs.remove(&(server, block)) {
            self.unindex((s.piece_size, s.class), server, block);
        }
    }

    /// The slabs of a retired server are gone with it.
    pub(crate) fn retire_server(&mut self, server: u32) {
        let gone: Vec<(u32, u32)> = self
            .slabs
            .range((server, 0)..=(server, u32::MAX))
            .map(|(k, _)| *k)
            .collect();
        for (srv, block) in gone {
            self.remove(srv, block);
        }
    }

    fn reindex(&mut self, server: u32, block: u32) {
        let Some(s) = self.slabs.get(&(server, block)) else {
            return;
        };
        let key = (s.piece_size, s.class);
        if s.next_free().is_some() || s.next_after_stamp().is_some() {
            self.partial.entry(key).or_default().insert((server, block));
        } else {
            self.unindex(key, server, block);
        }
    }

    fn unindex(&mut self, key: (u32, u8), server: u32, block: u32) {
        if let Some(set) = self.partial.get_mut(&key) {
            set.remove(&(server, block));
            if set.is_empty() {
                self.partial.remove(&key);
            }
        }
    }

    /// Whether each slab's counts agree with its owners, and the partial
    /// index holds exactly the slabs with a free piece (for invariants).
    pub fn is_consistent(&self) -> bool {
        let indexed: usize = self.partial.values().map(|s| s.len()).sum();
        let mut with_free = 0;
        let slabs_agree = self.slabs.iter().all(|(k, s)| {
            let has_free = s.next_free().is_some() || s.next_after_stamp().is_some();
            with_free += usize::from(has_free);
            let in_index = self
                .partial
                .get(&(s.piece_size, s.class))
                .is_some_and(|set| set.contains(k));
            s.owned().count() as u32 == s.used
                && s.freed.iter().all(|i| s.owner(*i).is_none())
                && s.quarantined
                    .iter()
                    .all(|i| s.owner(*i).is_none() && !s.freed.contains(i))
                && s.fresh as usize <= s.owners.len()
                && has_free == in_index
        });
        slabs_agree && indexed == with_free
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn piece_sizes_waste_at_most_a_fifth() {
        let bs = 1 << 20;
        assert_eq!(piece_size_for(bs, 0), None);
        // The value and its 8-byte tag.
        assert_eq!(piece_size_for(bs, 1), Some(64));
        assert_eq!(piece_size_for(bs, 56), Some(64));
        assert_eq!(piece_size_for(bs, 57), Some(80));
        assert_eq!(piece_size_for(bs, 100), Some(112));
        assert_eq!(piece_size_for(bs, 120), Some(128));
        assert_eq!(piece_size_for(bs, 1016), Some(1024));
        assert_eq!(piece_size_for(bs, 1024), Some(1280));
        assert_eq!(piece_size_for(bs, (256 << 10) - 8), Some(256 << 10));
        assert_eq!(piece_size_for(bs, (256 << 10) - 7), None);
        for size in u64::from(MIN_PIECE)..=(256u64 << 10) - 8 {
            let p = piece_size_for(bs, size).unwrap() as u64;
            let used = size + 8;
            assert!(p >= used && (p - used) * 5 <= p, "{size} -> {p}");
        }
        // Tiny blocks have no pieces at all.
        assert_eq!(piece_size_for(128, 10), None);
    }

    #[test]
    fn pieces_are_reused_and_the_index_follows() {
        let mut s = Slabs::default();
        let b = BlockRef {
            server: 1,
            block: 7,
            gen: 5,
        };
        s.create(b, 0, 1024, 4096, false);
        let piece = |index| Piece {
            server: 1,
            block: 7,
            index,
            size: 1024,
        };
        for i in 0..4 {
            assert_eq!(s.get(1, 7).unwrap().next_free(), Some(i));
            s.take(&piece(i), 10 + i as u64);
        }
        assert_eq!(s.partial(1024, 0).count(), 0, "full");
        assert!(s.is_consistent());
        s.free(&piece(2));
        s.free(&piece(2)); // twice is once
        assert_eq!(s.get(1, 7).unwrap().used(), 3);
        assert_eq!(s.partial(1024, 0).collect::<Vec<_>>(), vec![(1, 7)]);
        // Quarantined until a stamp fences the old owner's handles.
        assert_eq!(s.get(1, 7).unwrap().next_free(), None);
        assert_eq!(s.get(1, 7).unwrap().next_after_stamp(), Some(2));
        assert!(s.is_consistent());
        s.stamp(1, 7, 6);
        assert_eq!(s.get(1, 7).unwrap().gen, 6);
        assert_eq!(s.get(1, 7).unwrap().next_free(), Some(2));
        assert_eq!(s.get(1, 7).unwrap().quarantined(), 0);
        assert!(s.is_owner(&piece(1), 11));
        assert!(!s.is_owner(&piece(2), 12));
        assert!(s.is_consistent());
        s.retire_server(1);
        assert!(s.is_empty());
        assert_eq!(s.partial(1024, 0).count(), 0);
    }
}
