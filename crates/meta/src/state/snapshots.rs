//! Snapshots (`docs/snapshots.md`): begun with a frozen listing of a
//! subtree whose blocks and pieces stay pinned, listed a page at a time,
//! located after their blocks were fenced, held or moved, and ended (or
//! expired), freeing what they held. Soft state: the notes a decision
//! carries change it (`crate::snapshot`).

use super::replies::Grant;
use super::{Decision, Draft, MetaState, Reply};
use crate::alloc::BlockRef;
use crate::namespace::{stale, NodeId};
use crate::slab::HELD;
use crate::snapshot::{
    Listed, Snapshot, SnapshotNote, MAX_SNAPSHOTS, MAX_SNAPSHOT_NODES, PAGE_BYTES, SNAPSHOT_TTL_MS,
};
use nodekernel_proto::meta::{MetaReply, SnapshotEntry};
use nodekernel_proto::path;
use nodekernel_proto::{BlockLoc, Error, Result};
use std::collections::BTreeSet;

impl MetaState {
    /// The running snapshot `id`, or the error that says it is gone.
    pub(super) fn snapshot(&self, id: u64) -> Result<&Snapshot> {
        self.snapshots.get(id).ok_or_else(|| snapshot_gone(id))
    }

    /// The node at the root of running snapshot `id` (whose it is, for a
    /// tenant's request), or the error that says it is gone.
    pub(crate) fn snapshot_root(&self, id: u64) -> Result<NodeId> {
        let s = self.snapshot(id)?;
        s.entries
            .first()
            .map(|e| e.node)
            .ok_or_else(|| snapshot_gone(id))
    }

    /// The frozen listing of the subtree at `root`: every linked node,
    /// parents before children, children in name order.
    fn snapshot_listing(&self, root: NodeId) -> Result<Vec<Listed>> {
        let mut out = Vec::new();
        let mut stack: Vec<(NodeId, String)> = vec![(root, String::new())];
        while let Some((id, path)) = stack.pop() {
            let n = self.ns.get(id).ok_or_else(|| stale(id))?;
            if out.len() >= MAX_SNAPSHOT_NODES {
                return Err(Error::invalid_argument(format!(
                    "the subtree has more than {MAX_SNAPSHOT_NODES} nodes, the most one snapshot lists: snapshot parts of it"
                )));
            }
            let (size, blocks, piece) = if n.ty.is_container() {
                for (name, c) in n.children.iter().rev() {
                    let p = if path.is_empty() {
                        name.to_string()
                    } else {
                        format!("{path}/{name}")
                    };
                    stack.push((*c, p));
                }
                (0, Vec::new(), None)
            } else if let Some(p) = n.piece {
                let gen = self.slabs.get(p.server, p.block).map_or(0, |s| s.gen);
                let b = BlockRef {
                    server: p.server,
                    block: p.block,
                    gen,
                };
                (n.size, vec![b], Some(p))
            } else {
                let bs = u64::from(self.block_size_of(n));
                let count = n.size.div_ceil(bs).min(n.blocks.len() as u64) as usize;
                (n.size, n.blocks[..count].to_vec(), None)
            };
            out.push(Listed {
                path: path.into_boxed_str(),
                ty: n.ty,
                enumerable: n.enumerable,
                storage_class: n.storage_class,
                node: id,
                size,
                blocks,
                piece,
                block_size: self.block_size_of(n),
                encrypted: n.encrypted,
            });
        }
        Ok(out)
    }

    /// Where block `block` of `server` (block `index` of `node` when
    /// snapshot `id` began) is now: held, a slab, or still the node's.
    pub(super) fn snapshot_locate(
        &self,
        id: u64,
        node: NodeId,
        index: u64,
        server: u32,
        block: u32,
        now: u64,
    ) -> Result<BlockLoc> {
        let s = self.snapshot(id)?;
        let key = (server, block);
        let gen = if s.slabs.contains(&key) {
            self.slabs.get(server, block).map(|slab| slab.gen)
        } else if s.blocks.contains(&key) {
            self.held.get(&key).copied().or_else(|| {
                self.ns
                    .get(node)
                    .and_then(|n| n.blocks.get(index as usize))
                    .filter(|b| (b.server, b.block) == key)
                    .map(|b| b.gen)
            })
        } else {
            return Err(Error::invalid_argument(format!(
                "block {block} of storage server {server} is not in snapshot {id}"
            )));
        };
        let gen = gen.ok_or_else(|| {
            Error::data_lost(format!(
                "block {block} of storage server {server} (node {node}) is no longer kept for snapshot {id}: its storage server was retired"
            ))
        })?;
        if !self.alloc.is_alive(server) {
            return Err(Error::unavailable(format!(
                "storage server {server}, which holds block {block} of node {node}, is dead"
            )));
        }
        Ok(self.loc(&BlockRef { server, block, gen }, Grant::new(false, now)))
    }

    /// Ends the snapshots not used for [`SNAPSHOT_TTL_MS`]: their held
    /// blocks and pieces are freed. `None` when none expired.
    pub fn decide_snapshot_expiry(&self, now: u64) -> Option<Decision> {
        let ids = self.snapshots.expired(now);
        if ids.is_empty() {
            return None;
        }
        let mut d = Draft::new(self);
        d.release_snapshots(&ids);
        d.notes.snapshot = Some(SnapshotNote::End(ids));
        Some(d.finish(Reply::Done))
    }

    /// A page of snapshot `id`'s listing from entry `entry` (its block
    /// `block` on): about [`PAGE_BYTES`] of entries, a node with many
    /// blocks split over pages.
    pub(super) fn snapshot_page(&self, id: u64, entry: u64, block: u64, now: u64) -> MetaReply {
        let g = Grant::new(false, now);
        let mut entries = Vec::new();
        let (mut e, mut b) = (
            usize::try_from(entry).unwrap_or(usize::MAX),
            usize::try_from(block).unwrap_or(usize::MAX),
        );
        let Some(s) = self.snapshots.get(id) else {
            return MetaReply::SnapshotPage {
                entries,
                next_entry: entry,
                next_block: block,
            };
        };
        let mut bytes = 0;
        while let Some(l) = s.entries.get(e) {
            let mut en = SnapshotEntry {
                index: e as u64,
                path: l.path.to_string(),
                ty: l.ty,
                enumerable: l.enumerable,
                storage_class: l.storage_class,
                node: l.node,
                size: l.size,
                block_size: l.block_size,
                encrypted: l.encrypted,
                first_block: b as u64,
                blocks: Vec::new(),
            };
            bytes += en.encoded_len();
            if bytes > PAGE_BYTES && !entries.is_empty() {
                break;
            }
            while let Some(r) = l.blocks.get(b) {
                if bytes >= PAGE_BYTES && !en.blocks.is_empty() {
                    break;
                }
                let loc = match &l.piece {
                    Some(p) => BlockLoc {
                        offset: p.value_offset(),
                        tag: l.node,
                        ..self.loc_of_range(r, p.offset(), p.offset() + p.size, g)
                    },
                    None => self.loc(r, g),
                };
                bytes += 64 + loc.addr.len();
                en.blocks.push(loc);
                b += 1;
            }
            entries.push(en);
            if b < l.blocks.len() {
                break;
            }
            e += 1;
            b = 0;
            if bytes >= PAGE_BYTES {
                break;
            }
        }
        MetaReply::SnapshotPage {
            entries,
            next_entry: e as u64,
            next_block: b as u64,
        }
    }
}

impl Draft<'_> {
    /// Begins a snapshot of the subtree at `path`: its listing is frozen
    /// now, and its blocks and pieces are pinned until it ends.
    pub(super) fn snapshot_begin(&mut self, path: &str, now: u64) -> Result<Reply> {
        path::components(path)?;
        self.st.check_partition(path)?;
        if self.st.snapshots.len() >= MAX_SNAPSHOTS {
            return Err(Error::busy(format!(
                "{MAX_SNAPSHOTS} snapshots are running on this metadata server, the most it keeps at once: wait for one to end"
            )));
        }
        let root = self.ns().resolve(path)?;
        let entries = self.st.snapshot_listing(root)?;
        let id = self.st.snapshots.next_id().max(self.st.alloc.next_gen());
        let n = entries.len() as u64;
        self.notes.snapshot = Some(SnapshotNote::Begin(
            id,
            Box::new(Snapshot::new(entries, now + SNAPSHOT_TTL_MS)),
        ));
        Ok(Reply::SnapshotBegun { id, entries: n })
    }

    /// A page of snapshot `id`'s listing, built with the reply; renews the
    /// snapshot. A cursor past the end gets an empty page (readers use one
    /// to keep the snapshot alive).
    pub(super) fn snapshot_list(&mut self, id: u64, entry: u64, block: u64) -> Result<Reply> {
        self.st.snapshot(id)?;
        self.notes.snapshot = Some(SnapshotNote::Renew(id));
        Ok(Reply::SnapshotPage { id, entry, block })
    }

    /// Where a block of snapshot `id` is now; renews the snapshot.
    pub(super) fn snapshot_locate(
        &mut self,
        id: u64,
        node: NodeId,
        index: u64,
        server: u32,
        block: u32,
        now: u64,
    ) -> Result<Reply> {
        let loc = self
            .st
            .snapshot_locate(id, node, index, server, block, now)?;
        self.notes.snapshot = Some(SnapshotNote::Renew(id));
        Ok(Reply::Located(loc))
    }

    /// Ends snapshot `id`: what it held and no other snapshot pins is
    /// freed.
    pub(super) fn snapshot_end(&mut self, id: u64) -> Result<Reply> {
        self.st.snapshot(id)?;
        self.release_snapshots(&[id]);
        self.notes.snapshot = Some(SnapshotNote::End(vec![id]));
        Ok(Reply::Done)
    }

    /// Frees what snapshots `ids` held and no other snapshot pins.
    fn release_snapshots(&mut self, ids: &[u64]) {
        let mut blocks = BTreeSet::new();
        let mut pieces = BTreeSet::new();
        for id in ids {
            let Some(s) = self.st.snapshots.get(*id) else {
                continue;
            };
            for key in &s.blocks {
                if self.st.held.contains_key(key)
                    && !self.st.snapshots.pins_block(key.0, key.1, ids)
                {
                    blocks.insert(*key);
                }
            }
            for p in &s.pieces {
                let held = self.st.slabs.get(p.server, p.block).is_some_and(|slab| {
                    slab.piece_size == p.size && slab.owner(p.index) == Some(HELD)
                });
                if held && !self.st.snapshots.pins_piece(p, ids) {
                    pieces.insert(*p);
                }
            }
        }
        for (server, block) in blocks {
            let gen = self.st.held[&(server, block)];
            self.release_block(BlockRef { server, block, gen });
        }
        for p in pieces {
            self.release_piece(p);
        }
    }
}

/// The error for snapshot `id` that is not running.
pub(crate) fn snapshot_gone(id: u64) -> Error {
    Error::not_found(format!(
        "snapshot {id} is gone (ended, expired after {} s without a call, or the metadata server restarted): start the snapshot again",
        SNAPSHOT_TTL_MS / 1000
    ))
}
