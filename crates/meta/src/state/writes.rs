//! The writer's requests, under its write lease: map (allocating on
//! write), open for writing, sync (and the close that links a put),
//! truncate, abort, and the replacement of a block (or a small value's
//! piece) on a server the writer could not reach.

use super::pieces::Taker;
use super::{Draft, Reply};
use crate::effect::Effect;
use crate::namespace::{stale, Node, NodeId, ROOT};
use crate::slab::{piece_size_for, Piece};
use nodekernel_proto::meta::MAX_MAP_COUNT;
use nodekernel_proto::{Error, NodeType, Result, NO_CLASS};

impl<'a> Draft<'a> {
    pub(super) fn map(
        &mut self,
        node: NodeId,
        index: u64,
        count: u32,
        lease: Option<u64>,
        first_write: u32,
        now: u64,
    ) -> Result<Reply> {
        let count = count.clamp(1, MAX_MAP_COUNT) as u64;
        let end = index.saturating_add(count);
        let n = self.ns().get(node).ok_or_else(|| stale(node))?;
        if let Some(lease) = lease {
            let n = self.writable(node, lease)?;
            if first_write > 0 && index == 0 && self.takes_file_piece(n) {
                if let Some(size) =
                    piece_size_for(self.st.alloc.block_size(), u64::from(first_write))
                {
                    let got = self.take_piece(
                        Taker::Node(node),
                        n.storage_class,
                        &n.location,
                        size,
                        false,
                    );
                    if got.is_some() {
                        self.renew(node, lease, now);
                        return Ok(Reply::Blocks {
                            node,
                            index,
                            count: 1,
                            write: true,
                        });
                    }
                }
            }
            if let Some(p) = n.piece_for(true) {
                if index > 0 {
                    let what = if n.ty == NodeType::File {
                        "its writer outgrows it (Outgrow) before writing past it"
                    } else {
                        "cannot grow past it (a value written without a size hint gets whole blocks)"
                    };
                    return Err(Error::out_of_range(format!(
                        "node {node} is stored in a piece of {} bytes: {what}",
                        p.size
                    )));
                }
                self.renew(node, lease, now);
                self.check_first_block(node, index, true)?;
                return Ok(Reply::Blocks {
                    node,
                    index,
                    count,
                    write: true,
                });
            }
            let have = n.blocks.len() as u64;
            if index > have {
                return Err(Error::out_of_range(format!(
                    "node {node} has {have} blocks; block {index} cannot be allocated before block {have}"
                )));
            }
            self.renew(node, lease, now);
            for i in have..end {
                match self
                    .plan
                    .allocate_data(n.storage_class, &n.location, n.encrypted)
                {
                    Ok(b) => self.add_block(node, b),
                    Err(e) if i <= index => return Err(e),
                    Err(_) => break, // partial: the caller gets NoSpace on its next map
                }
            }
        }
        if n.ty.is_container() {
            self.relocate_lost_records(node)?;
            // A reader of the records waits for a moving piece or block,
            // as for data (the reply would stop before it).
            let pieces = n.slots.pieces();
            let moving = match pieces.get(index as usize) {
                Some(p) => self.st.slab_moving(p),
                None => self
                    .st
                    .moves
                    .contains_key(&(node, index - pieces.len() as u64)),
            };
            if moving {
                return Err(Error::try_again(format!(
                    "extent {index} of the records of container {node} is being moved; retry shortly"
                )));
            }
        } else {
            self.check_first_block(node, index, lease.is_some())?;
        }
        Ok(Reply::Blocks {
            node,
            index,
            count,
            write: lease.is_some(),
        })
    }

    /// Whether File `n`'s writer may have its first write put in a piece:
    /// nothing written or allocated yet, and not encrypted (a sealed
    /// File's chunks are laid out by whole blocks).
    fn takes_file_piece(&self, n: &Node) -> bool {
        n.ty == NodeType::File
            && !n.encrypted
            && n.size == 0
            && n.piece.is_none()
            && n.blocks.is_empty()
    }

    /// The writer of File `node` in a piece is about to write past it:
    /// block 0 gets a block of its own, which only the writer sees (its
    /// readers read the piece) until its next sync publishes it and frees
    /// the piece (`Effect::PieceOutgrown`). The writer copies what it
    /// wrote to the piece into the block first. A writer that goes away
    /// before that sync leaves the File in its piece: the block is
    /// unpublished, freed when the lease ends.
    pub(super) fn outgrow(&mut self, node: NodeId, lease: u64, now: u64) -> Result<Reply> {
        let n = self.writable(node, lease)?;
        if n.ty != NodeType::File {
            return Err(Error::type_mismatch(format!(
                "node {node} is a {}: only a File grows out of its piece",
                n.ty
            )));
        }
        if n.piece_for(true).is_some() {
            let b = self
                .plan
                .allocate_data(n.storage_class, &n.location, false)?;
            self.add_block(node, b);
            #[cfg(test)]
            if let (Some(p), Some(super::Bug::OutgrowSwitchesEarly)) = (n.piece, self.st.bug) {
                self.free_piece(p);
                self.push(Effect::PieceOutgrown { node });
            }
        }
        // Otherwise it has its block already (a retry; or no piece at
        // all): the reply is its location.
        self.renew(node, lease, now);
        Ok(Reply::Blocks {
            node,
            index: 0,
            count: 1,
            write: true,
        })
    }

    pub(super) fn open_write(&mut self, path: &str, now: u64) -> Result<Reply> {
        self.st.check_partition(path)?;
        let id = self.ns().resolve(path)?;
        let n = self.ns().get(id).ok_or_else(|| stale(id))?;
        if n.ty.is_container() {
            return Err(Error::type_mismatch(format!(
                "{path} is a {}; only File and KeyValue nodes hold data",
                n.ty
            )));
        }
        if let Some(l) = n.lease {
            if now < l.expires_ms {
                return Err(Error::busy(format!(
                    "{path} is being written by another client (one writer at a time)"
                )));
            }
            // The lease expired without a close: its writer may still be
            // alive and writing. It lapses: fenced out at the storage
            // layer, its unpublished blocks freed.
            self.lapse(n);
        }
        let lease = self.grant(id, now);
        Ok(Reply::Node {
            id,
            lease,
            record: None,
        })
    }

    pub(super) fn sync(
        &mut self,
        node: NodeId,
        lease: u64,
        size: u64,
        close: bool,
        mtime: u64,
        now: u64,
    ) -> Result<Reply> {
        self.publish(node, lease, size, close, mtime, None, now)
    }

    /// Closes reserved put `node` at `size` as the value at `path`
    /// (`MetaRequest::Link`): its sync with `close`, into the Table at
    /// `path`'s parent under its name.
    pub(super) fn link(
        &mut self,
        node: NodeId,
        lease: u64,
        size: u64,
        mtime: u64,
        path: &str,
        now: u64,
    ) -> Result<Reply> {
        self.st.check_partition(path)?;
        let n = self.writable(node, lease)?;
        if n.linked || n.parent != ROOT || !n.name.is_empty() {
            return Err(Error::invalid_argument(format!(
                "node {node} is not a reserved put: it cannot be linked at {path}"
            )));
        }
        let (parent, name) = self.ns().parent_for(path, NodeType::KeyValue)?;
        let class = self.ns().class_for_child(parent, NO_CLASS);
        if class != n.storage_class || self.st.encrypts(class) {
            return Err(Error::invalid_argument(format!(
                "{path}: its table's values go to {}{}, the reserved put's to {}: put it \
                 with a create of its own",
                class_name(class),
                if self.st.encrypts(class) {
                    " (encrypted)"
                } else {
                    ""
                },
                class_name(n.storage_class)
            )));
        }
        self.linked_lifetime(node, parent, now);
        self.publish(node, lease, size, true, mtime, Some((parent, name)), now)
    }

    /// Publishes `size` of `node` (a sync; with `close`, its close), and
    /// a put's close makes it the value at its name: for a reserved put,
    /// `aim` is the Table and the name.
    #[allow(clippy::too_many_arguments)]
    fn publish(
        &mut self,
        node: NodeId,
        lease: u64,
        size: u64,
        close: bool,
        mtime: u64,
        aim: Option<(NodeId, String)>,
        now: u64,
    ) -> Result<Reply> {
        let n = self.writable(node, lease)?;
        let bs = self.bs_of(n);
        let capacity = match n.piece_for(true) {
            Some(_) => u64::from(self.st.piece_capacity(n)),
            None => n.blocks.len() as u64 * bs,
        };
        if size > capacity {
            return Err(Error::out_of_range(format!(
                "cannot publish size {size} of node {node}: only {capacity} bytes are allocated"
            )));
        }
        if size < n.size {
            return Err(Error::invalid_argument(format!(
                "cannot shrink node {node} from {} to {size} bytes",
                n.size
            )));
        }
        // Closing a put makes the value visible, replacing any older one:
        // check it can be linked before changing anything.
        let table = aim.as_ref().map_or(n.parent, |(p, _)| *p);
        if !n.linked && !self.ns().is_unclosed(node) {
            // Removed (deleted or expired) while its writer wrote on: a
            // close must not link it back.
            return Err(stale(node));
        }
        let link = if close && !n.linked {
            let name = aim.as_ref().map_or(&*n.name, |(_, m)| m);
            Some(self.plan_link(table, name)?)
        } else {
            None
        };
        if let Some((parent, name)) = aim {
            self.push(Effect::Aimed { node, parent, name });
        }
        self.push(Effect::SizeSet { node, size });
        self.stamp(n, mtime);
        if let Some(p) = n.outgrown_piece() {
            // The writer outgrew the piece and has copied it to block 0.
            self.free_piece(p);
            self.push(Effect::PieceOutgrown { node });
        }
        if close {
            // A closed node keeps only the blocks its bytes need: blocks
            // handed out but never filled (an empty put, a write cut short)
            // go back.
            self.truncate(n, size.div_ceil(bs));
            self.push(Effect::LeaseCleared { node });
        } else {
            self.renew(node, lease, now);
        }
        let record = match link {
            None => None,
            Some(Link::Replace(old)) => {
                #[cfg(test)]
                let leak = self.st.bug == Some(super::Bug::LeakOnReplace);
                #[cfg(not(test))]
                let leak = false;
                if !leak {
                    self.free_node_blocks(old);
                }
                self.push(Effect::Replaced { old, new: node });
                None
            }
            Some(Link::New(slot)) => {
                self.push(Effect::Linked { id: node, slot });
                slot.map(|s| (table, s))
            }
        };
        Ok(Reply::Record(record))
    }

    /// How a closing put will be linked into Table `table` under `name`,
    /// with record space made for a new slot.
    fn plan_link(&mut self, table: NodeId, name: &str) -> Result<Link> {
        let parent = self.ns().get(table).filter(|p| p.linked).ok_or_else(|| {
            Error::not_found(format!("cannot store {name}: its table was removed"))
        })?;
        match parent.children.get(name) {
            Some(&old) => {
                let old_ty = self.ns().get(old).map(|o| o.ty);
                if old_ty != Some(NodeType::KeyValue) {
                    return Err(Error::already_exists(format!(
                        "{} already exists (a {})",
                        name,
                        old_ty.map_or("node".to_string(), |t| t.to_string())
                    )));
                }
                Ok(Link::Replace(old))
            }
            None if parent.enumerable => {
                Ok(Link::New(Some(self.ensure_record_space(table, name)?)))
            }
            None => Ok(Link::New(None)),
        }
    }

    pub(super) fn abort(&mut self, node: NodeId, lease: u64) -> Result<Reply> {
        let n = self.writable(node, lease)?;
        if !n.linked {
            // A put that never closed: nothing of it was ever visible.
            self.free_node_blocks(node);
            self.push(Effect::Dropped { ids: vec![node] });
        } else {
            // (A File that outgrew its piece keeps the piece.)
            self.truncate(n, self.st.blocks_published(n));
            self.push(Effect::LeaseCleared { node });
        }
        Ok(Reply::Done)
    }

    /// The writer shrinks `node` to `size` bytes: published at once, the
    /// blocks past it freed (fenced, so a reader holding their old
    /// locations gets `Stale`).
    pub(super) fn truncate_to(
        &mut self,
        node: NodeId,
        lease: u64,
        size: u64,
        mtime: u64,
        now: u64,
    ) -> Result<Reply> {
        let n = self.writable(node, lease)?;
        if size > n.size {
            return Err(Error::invalid_argument(format!(
                "cannot truncate node {node} to {size} bytes: it has {} published; a node grows by writing",
                n.size
            )));
        }
        self.push(Effect::SizeSet { node, size });
        if n.piece.is_none() {
            self.truncate(n, size.div_ceil(self.bs_of(n)));
        }
        self.stamp(n, mtime);
        self.renew(node, lease, now);
        Ok(Reply::Done)
    }

    /// A writer's change of `n` stamps its modification time (0: the
    /// writer sent none, the old time stays).
    pub(super) fn stamp(&mut self, n: &Node, mtime: u64) {
        if mtime != 0 {
            self.push(Effect::AttrsSet {
                node: n.id,
                mode: n.mode,
                mtime,
            });
        }
    }

    /// Refuses a map whose first block is on a dead server or being moved
    /// (for a writer, as it sees the node).
    fn check_first_block(&self, node: NodeId, index: u64, write: bool) -> Result<()> {
        if let Some(p) = self.ns().get(node).and_then(|n| n.piece_for(write)) {
            if index == 0
                && (!self.st.alloc.is_alive(p.server)
                    || self.st.slabs.get(p.server, p.block).is_none())
            {
                return Err(Error::data_lost(format!(
                    "node {node} is a small value on storage server {} ({}), which is dead",
                    p.server,
                    self.st.alloc.server_addr(p.server).unwrap_or("retired")
                )));
            }
            if self.st.slab_moving(&p) {
                return Err(Error::try_again(format!(
                    "the block of node {node}'s value is being moved; retry shortly"
                )));
            }
            return Ok(());
        }
        let Some(b) = self
            .ns()
            .get(node)
            .and_then(|n| n.blocks.get(index as usize))
        else {
            return Ok(());
        };
        if !self.st.alloc.is_alive(b.server) {
            return Err(Error::data_lost(format!(
                "block {index} of node {node} is on storage server {} ({}), which is dead",
                b.server,
                self.st.alloc.server_addr(b.server).unwrap_or("retired")
            )));
        }
        if self.st.moves.contains_key(&(node, index)) {
            return Err(Error::try_again(format!(
                "block {index} of node {node} is being moved; retry shortly"
            )));
        }
        Ok(())
    }

    pub(super) fn replace_block(
        &mut self,
        node: NodeId,
        lease: u64,
        index: u64,
        gen: u64,
        now: u64,
    ) -> Result<Reply> {
        let n = self.writable(node, lease)?;
        if let Some(p) = n.piece_for(true) {
            return self.replace_piece(n, p, lease, index, gen, now);
        }
        let old = *n
            .blocks
            .get(index as usize)
            .ok_or_else(|| Error::out_of_range(format!("node {node} has no block {index}")))?;
        if old.gen == gen {
            if index < self.st.blocks_published(n) {
                return Err(Error::invalid_argument(format!(
                    "block {index} of node {node} holds published bytes; only a block the writer still holds in full can move"
                )));
            }
            if self.st.moves.contains_key(&(node, index)) {
                return Err(Error::try_again(format!(
                    "block {index} of node {node} is being moved; retry shortly"
                )));
            }
            self.plan.avoid(old.server);
            let new = self
                .plan
                .allocate_data(n.storage_class, &n.location, n.encrypted)?;
            self.push(Effect::BlockSwapped {
                node,
                index,
                block: new,
            });
            self.free(old);
            self.renew(node, lease, now);
            self.notes.suspect = Some(old.server);
        }
        // Otherwise the caller's location was outdated: it gets the current
        // one and tries that.
        Ok(Reply::Blocks {
            node,
            index,
            count: 1,
            write: true,
        })
    }

    /// [`Draft::replace_block`] for a small value: a new piece elsewhere.
    fn replace_piece(
        &mut self,
        n: &Node,
        p: Piece,
        lease: u64,
        index: u64,
        gen: u64,
        now: u64,
    ) -> Result<Reply> {
        let node = n.id;
        let slab_gen = self.st.slabs.get(p.server, p.block).map(|s| s.gen);
        if self.st.slab_moving(&p) {
            return Err(Error::try_again(format!(
                "the block of node {node}'s value is being moved; retry shortly"
            )));
        }
        if index != 0 {
            return Err(Error::out_of_range(format!(
                "node {node} is a small value: it has only block 0"
            )));
        }
        if slab_gen == Some(gen) {
            if n.size > 0 {
                return Err(Error::invalid_argument(format!(
                    "node {node} holds published bytes; only a value the writer still holds in full can move"
                )));
            }
            self.plan.avoid(p.server);
            self.free_piece(p);
            if self
                .take_piece(
                    Taker::Node(node),
                    n.storage_class,
                    &n.location,
                    p.size,
                    n.encrypted,
                )
                .is_none()
            {
                return Err(Error::no_space(format!(
                    "no room for node {node}'s value on any other storage server"
                )));
            }
            self.renew(node, lease, now);
            self.notes.suspect = Some(p.server);
        }
        Ok(Reply::Blocks {
            node,
            index,
            count: 1,
            write: true,
        })
    }
}

/// A storage class as an error names it.
fn class_name(class: u8) -> String {
    if class == NO_CLASS {
        "the default storage class".into()
    } else {
        format!("storage class {class}")
    }
}

enum Link {
    /// Replaces this KeyValue.
    Replace(NodeId),
    /// A new child with this record slot.
    New(Option<u32>),
}
