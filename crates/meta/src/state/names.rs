//! The namespace requests: create, lookup, remove (and the reaping of
//! removed subtrees, a bounded step at a time), move, enumerate, record
//! slots and attributes; and the container record blocks they need.

use super::pieces::Taker;
use super::{Decision, Draft, MetaState, Reply};
use crate::alloc::BlockRef;
use crate::effect::Effect;
use crate::namespace::{stale, NewNode, NodeId, Slot, MAX_SLOTS, ROOT};
use crate::slab::{piece_size_for, Piece};
use nodekernel_proto::crypt;
use nodekernel_proto::path;
use nodekernel_proto::record;
use nodekernel_proto::{Error, NodeType, Result, NO_CLASS};

/// Most nodes one reaping step drops (a removed subtree larger than this is
/// reaped in the background, a step per lock hold).
pub const REAP_NODES: usize = 1024;
/// Most blocks one reaping step frees.
pub const REAP_BLOCKS: usize = 8192;

/// A create's options besides path, type and size.
pub(super) struct NodeFlags<'a> {
    pub(super) class: u8,
    pub(super) location: &'a str,
    pub(super) enumerable: bool,
    pub(super) pinned: bool,
    pub(super) mode: u32,
    pub(super) mtime: u64,
    /// The create's TTL and child TTL (`MetaRequest::Create`).
    pub(super) ttl_ms: u64,
    pub(super) child_ttl_ms: u64,
    /// The session the node is bound to, if any.
    pub(super) session: Option<nodekernel_proto::meta::SessionRef>,
}

/// `mode` as a node keeps it, if it holds only permission bits.
fn check_mode(mode: u32) -> Result<u16> {
    if mode > nodekernel_proto::meta::MAX_MODE {
        return Err(Error::invalid_argument(format!(
            "mode {mode:#o} has bits beyond the permission bits ({:#o})",
            nodekernel_proto::meta::MAX_MODE
        )));
    }
    Ok(mode as u16)
}

impl MetaState {
    /// One bounded step of reaping removed subtrees (at most
    /// [`REAP_NODES`] nodes and [`REAP_BLOCKS`] blocks); `None` when the
    /// graveyard is empty.
    pub fn decide_reap(&self) -> Option<Decision> {
        self.decide_reap_up_to(REAP_NODES)
    }

    /// [`MetaState::decide_reap`], dropping at most `max_nodes` nodes (a
    /// shorter hold of the state while other requests are coming in).
    pub fn decide_reap_up_to(&self, max_nodes: usize) -> Option<Decision> {
        if self.ns.graveyard_is_empty() {
            return None;
        }
        let mut d = Draft::new(self);
        let roots: Vec<NodeId> = self.ns.graveyard().collect();
        d.reap(&roots, max_nodes.clamp(1, REAP_NODES), REAP_BLOCKS);
        Some(d.finish(Reply::Done))
    }
}

impl<'a> Draft<'a> {
    pub(super) fn create(
        &mut self,
        path: &str,
        ty: NodeType,
        f: NodeFlags,
        size_hint: u64,
        open_existing: bool,
        now: u64,
    ) -> Result<Reply> {
        let NodeFlags {
            class,
            location,
            enumerable,
            pinned,
            mode,
            mtime,
            ttl_ms,
            child_ttl_ms,
            session,
        } = f;
        let mode = check_mode(mode)?;
        self.st.check_partition(path)?;
        if open_existing && ty != NodeType::File {
            return Err(Error::invalid_argument(format!(
                "{path}: only a File can be opened if it exists (asked for a {ty})"
            )));
        }
        let (parent, name) = self.ns().parent_for(path, ty)?;
        if !ty.replaces_on_create() {
            if let Some(old) = self.ns().child(parent, &name) {
                let old_ty = self.ns().get(old).map_or(ty, |n| n.ty);
                if open_existing && old_ty == NodeType::File {
                    return self.open_write(path, now);
                }
                return Err(Error::already_exists(format!(
                    "{path} already exists (a {old_ty})"
                )));
            }
        }
        let slot = if !ty.replaces_on_create() && self.ns().keeps_records(parent) {
            Some(self.ensure_record_space(parent, &name)?)
        } else {
            None
        };
        let id = self.next_id;
        self.next_id += 1;
        let storage_class = self.ns().class_for_child(parent, class);
        let encrypted = !ty.is_container() && self.st.encrypts(storage_class);
        self.push(Effect::NodeCreated(NewNode {
            id,
            parent,
            name,
            ty,
            storage_class,
            location: location.to_string(),
            enumerable,
            pinned,
            encrypted,
        }));
        self.push(Effect::AttrsSet {
            node: id,
            mode,
            mtime,
        });
        self.created_lifetime(id, parent, ttl_ms, child_ttl_ms, ty.is_container(), now)?;
        self.bind_created(id, session)?;
        if !ty.replaces_on_create() {
            self.push(Effect::Linked { id, slot });
        }
        let lease = if ty.is_container() {
            0
        } else {
            self.grant(id, now)
        };
        if ty.replaces_on_create() {
            // A put always writes: hand out its first block (or, for a
            // small value, its piece) with the create, saving the put a map
            // round trip. (No space now is not an error yet: the put's map
            // will report it.)
            // An encrypted value's piece holds its sealed chunks.
            let stored = if encrypted {
                crypt::sealed_len(size_hint)
            } else {
                size_hint
            };
            match piece_size_for(self.st.alloc.block_size(), stored) {
                Some(size) => {
                    self.take_piece(Taker::Node(id), storage_class, location, size, encrypted);
                }
                None => {
                    if let Ok(b) = self.plan.allocate_data(storage_class, location, encrypted) {
                        self.add_block(id, b);
                    }
                }
            }
        }
        Ok(Reply::Node {
            id,
            lease,
            record: slot.map(|s| (parent, s)),
        })
    }

    /// Reserves up to `count` puts of values of up to `size_hint` bytes
    /// (`MetaRequest::Reserve`): KeyValue puts created ahead of their path
    /// (under the root, with no name), each with its piece and write
    /// lease. Fewer when space runs out; none at all is `NoSpace`.
    pub(super) fn reserve(
        &mut self,
        size_hint: u64,
        count: u32,
        class: u8,
        location: &str,
        now: u64,
    ) -> Result<Reply> {
        let block_size = self.st.alloc.block_size();
        let Some(size) = piece_size_for(block_size, size_hint) else {
            return Err(Error::invalid_argument(format!(
                "a reserved put holds a value that fits a piece, at most a quarter block \
                 less its tag; {size_hint} bytes does not"
            )));
        };
        let storage_class = self.ns().class_for_child(ROOT, class);
        if self.st.encrypts(storage_class) {
            return Err(Error::invalid_argument(format!(
                "storage class {storage_class} is encrypted: its values are put one create at a time"
            )));
        }
        let mut reserved = Vec::new();
        for _ in 0..count {
            let (id, at) = (self.next_id, self.effects.len());
            // Taking no piece pushes nothing; a piece taken goes after the
            // node that takes it.
            let Some(piece) =
                self.take_piece(Taker::Node(id), storage_class, location, size, false)
            else {
                break;
            };
            // A slab this decision starts is not seen by its next takes:
            // the next reservation fills it.
            let started_slab = self.st.slabs.get(piece.server, piece.block).is_none();
            self.next_id += 1;
            self.effects.insert(
                at,
                Effect::NodeCreated(NewNode {
                    id,
                    parent: ROOT,
                    name: String::new(),
                    ty: NodeType::KeyValue,
                    storage_class,
                    location: location.to_string(),
                    enumerable: true,
                    pinned: false,
                    encrypted: false,
                }),
            );
            reserved.push((id, self.grant(id, now)));
            if started_slab {
                break;
            }
        }
        if reserved.is_empty() && count > 0 {
            return Err(Error::no_space(format!(
                "no room for a piece of {size} bytes in storage class {storage_class} or any other"
            )));
        }
        Ok(Reply::Reserved(reserved))
    }

    /// The node at `path`.
    pub(super) fn lookup(&self, path: &str) -> Result<Reply> {
        self.st.check_partition(path)?;
        Ok(Reply::Node {
            id: self.ns().resolve(path)?,
            lease: 0,
            record: None,
        })
    }

    /// The container at `path`: the reply lists its live record slots.
    pub(super) fn enumerate(&self, path: &str) -> Result<Reply> {
        self.st.check_partition(path)?;
        Ok(Reply::Listing(self.ns().container(path)?))
    }

    /// The caller cleared the record in `slot` of `container` (after a
    /// remove or move handed it out): the slot may be reused.
    pub(super) fn release_slot(&mut self, container: NodeId, slot: u32) -> Result<Reply> {
        let n = self.ns().get(container).ok_or_else(|| stale(container))?;
        if n.slots.get(slot) != Some(Slot::Clearing) {
            return Err(Error::invalid_argument(format!(
                "slot {slot} of node {container} is not being cleared"
            )));
        }
        self.push(Effect::SlotReleased { container, slot });
        Ok(Reply::Done)
    }

    /// Where the record in `slot` of `container` is now (`RecordAt`): for
    /// a record write refused as `Stale`, while the slot still holds the
    /// child `name`; for a clear (`name` empty), while the slot is being
    /// cleared. Otherwise no location: the record is someone else's now.
    pub(super) fn record_at(&self, container: NodeId, slot: u32, name: &str) -> Result<Reply> {
        let ns = self.ns();
        let n = ns.get(container).ok_or_else(|| stale(container))?;
        let still = match n.slots.get(slot) {
            Some(Slot::Live(id)) => {
                !name.is_empty() && ns.get(id).is_some_and(|c| &*c.name == name)
            }
            Some(Slot::Clearing) => name.is_empty(),
            _ => false,
        };
        Ok(Reply::Record(still.then_some((container, slot))))
    }

    /// The names of the live children in `slots` of `container` (for
    /// records that could not be read).
    pub(super) fn record_names(&self, container: NodeId, slots: &[u32]) -> Result<Reply> {
        let ns = self.ns();
        let n = ns.get(container).ok_or_else(|| stale(container))?;
        let names = slots
            .iter()
            .filter_map(|slot| match n.slots.get(*slot) {
                Some(Slot::Live(id)) => ns.get(id).map(|c| (*slot, c.ty, c.name.to_string())),
                _ => None,
            })
            .collect();
        Ok(Reply::Names(names))
    }

    pub(super) fn remove(&mut self, path: &str, recursive: bool) -> Result<Reply> {
        self.st.check_partition(path)?;
        let id = self.ns().resolve(path)?;
        if id == ROOT {
            return Err(Error::invalid_argument(
                "the root directory / cannot be removed",
            ));
        }
        let n = self.ns().get(id).ok_or_else(|| stale(id))?;
        if !recursive && !n.children.is_empty() {
            return Err(Error::not_empty(format!(
                "{path} has {} children; remove it recursively",
                n.children.len()
            )));
        }
        let clear = n.slot.get().map(|s| (n.parent, s));
        self.push(Effect::Unlinked { id });
        // A small subtree is reaped at once; a big one in bounded steps
        // afterwards (the server's reaper).
        if self.ns().subtree_size(id, REAP_NODES + 1) <= REAP_NODES {
            self.reap(&[id], REAP_NODES, REAP_BLOCKS);
        }
        Ok(Reply::Record(clear))
    }

    /// Frees the blocks of, and drops, the first nodes of the subtrees at
    /// `roots` (children first), up to `max_nodes` nodes and about
    /// `max_blocks` blocks. A node with more blocks than are left in the
    /// budget loses its last blocks now and is dropped by a later step.
    pub(super) fn reap(&mut self, roots: &[NodeId], max_nodes: usize, max_blocks: usize) {
        let order = self.ns().subtree_postorder(roots, max_nodes);
        let mut budget = max_blocks;
        let mut dropped = Vec::new();
        for id in order {
            let Some(n) = self.ns().get(id) else {
                continue;
            };
            let pieces = usize::from(n.piece.is_some()) + n.slots.pieces().len();
            let blocks = n.blocks.len() + pieces;
            if blocks > budget {
                // Free the blocks the budget allows, from the end; the
                // node (and its pieces) goes in a later step.
                self.truncate(n, n.blocks.len().saturating_sub(budget) as u64);
                break;
            }
            budget -= blocks;
            self.free_node_blocks(id);
            dropped.push(id);
        }
        if !dropped.is_empty() {
            self.push(Effect::Dropped { ids: dropped });
        }
    }

    pub(super) fn rename(&mut self, src: &str, dst: &str, replace: bool) -> Result<Reply> {
        self.st.check_partition(src)?;
        let p = self.st.placement;
        if p.partitions > 1
            && path::partition_of(dst, p.partitions as usize)
                != path::partition_of(src, p.partitions as usize)
        {
            return Err(Error::cross_partition(format!(
                "cannot move {src} to {dst}: they are owned by different metadata partitions"
            )));
        }
        let (id, parent, name, replaced) = self.ns().check_rename(src, dst, replace)?;
        let n = self.ns().get(id).ok_or_else(|| stale(id))?;
        if replaced == Some(id) {
            return Ok(Reply::Moved {
                ty: n.ty,
                clear: None,
                write: None,
                replaced: None,
            });
        }
        let clear = n.slot.get().map(|s| (n.parent, s));
        // The node replaced goes as a remove would take it: unlinked (its
        // record to be cleared), its blocks freed, dropped (a big one by
        // the reaper).
        let replaced = match replaced.and_then(|old| self.ns().get(old)) {
            Some(old) => {
                self.push(Effect::Unlinked { id: old.id });
                self.reap(&[old.id], REAP_NODES, REAP_BLOCKS);
                old.slot.get().map(|s| (old.parent, s))
            }
            None => None,
        };
        let slot = if self.ns().keeps_records(parent) {
            Some(self.ensure_record_space(parent, &name)?)
        } else {
            None
        };
        self.push(Effect::Moved {
            id,
            parent,
            name,
            slot,
        });
        Ok(Reply::Moved {
            ty: n.ty,
            clear,
            write: slot.map(|s| (parent, s)),
            replaced,
        })
    }

    /// Changes the permission bits and/or modification time of `path`.
    pub(super) fn set_attrs(
        &mut self,
        path: &str,
        mode: Option<u32>,
        mtime: Option<u64>,
        (ttl_ms, child_ttl_ms): (Option<u64>, Option<u64>),
        now: u64,
    ) -> Result<Reply> {
        self.st.check_partition(path)?;
        let id = self.ns().resolve(path)?;
        let n = self.ns().get(id).ok_or_else(|| stale(id))?;
        if mode.is_some() || mtime.is_some() {
            let mode = match mode {
                Some(m) => check_mode(m)?,
                None => n.mode,
            };
            self.push(Effect::AttrsSet {
                node: id,
                mode,
                mtime: mtime.unwrap_or(n.mtime),
            });
        }
        self.changed_lifetime(id, ttl_ms, child_ttl_ms, now)?;
        Ok(Reply::Node {
            id,
            lease: 0,
            record: None,
        })
    }

    /// Gives `container` the record extent for the record of a child
    /// named `name` if it lacks one (a piece, or a block once its pieces
    /// are full: `docs/records.md`); returns the record's first slot.
    pub(super) fn ensure_record_space(&mut self, container: NodeId, name: &str) -> Result<u32> {
        let n = self.ns().get(container).ok_or_else(|| stale(container))?;
        let layout = self.st.record_layout(n);
        let len = record::slots_for(name.len());
        let slot = n.slots.peek(len, &layout);
        if slot.saturating_add(len) > MAX_SLOTS {
            return Err(Error::no_space(format!(
                "container {container} holds all the child records it can"
            )));
        }
        self.relocate_lost_records(container)?;
        let need = layout.extents_for(slot + len);
        let have = n.slots.pieces().len()
            + n.blocks.len()
            + self.added.get(&container).copied().unwrap_or(0) as usize;
        for k in have..need {
            let piece = match layout.piece_size(k) {
                // No piece for the first records (only encrypted classes
                // have room: pieces of plain slabs never go there): a
                // block, and the container keeps its records in blocks.
                Some(size) if k == 0 => {
                    self.take_record_piece(container, size, Taker::Node(container))
                }
                Some(size) => Some(self.record_piece(container, size, Taker::Node(container))?),
                None => None,
            };
            match piece {
                Some(_) => *self.added.entry(container).or_default() += 1,
                None => {
                    let b = self.record_block(container)?;
                    self.add_block(container, b);
                }
            }
        }
        Ok(slot)
    }

    /// Takes a piece of `size` bytes for a container's records (as
    /// `taker` says), placed as its record blocks are (its class first);
    /// `NoSpace` when none can be had.
    fn record_piece(&mut self, container: NodeId, size: u32, taker: Taker) -> Result<Piece> {
        self.take_record_piece(container, size, taker)
            .ok_or_else(|| records_error(container, self.plan.no_space()))
    }

    fn take_record_piece(&mut self, container: NodeId, size: u32, taker: Taker) -> Option<Piece> {
        let class = self.ns().get(container)?.storage_class;
        self.take_piece(taker, class, "", size, false)
    }

    /// Allocates a block for a container's records.
    fn record_block(&mut self, container: NodeId) -> Result<BlockRef> {
        let class = self
            .ns()
            .get(container)
            .ok_or_else(|| stale(container))?
            .storage_class;
        // Records are written on the create path, so they follow the normal
        // placement (DRAM first, or the container's preferred class). The
        // root's few records go to the slowest class instead: the root is
        // shared by every top-level name and changes rarely.
        let b = if class == NO_CLASS && container == ROOT {
            self.plan.allocate_slowest_first()
        } else {
            self.plan.allocate(class, "")
        };
        b.map_err(|e| records_error(container, e))
    }

    /// Replaces record pieces and blocks of `container` that sit on dead
    /// storage servers. Their records are lost; enumeration recovers the
    /// names of those live slots from the metadata server (`RecordNames`).
    pub(super) fn relocate_lost_records(&mut self, container: NodeId) -> Result<()> {
        let n = self.ns().get(container).ok_or_else(|| stale(container))?;
        for (k, p) in n.slots.pieces().iter().enumerate() {
            if !self.st.alloc.is_alive(p.server) || self.st.slabs.get(p.server, p.block).is_none() {
                self.free_piece(*p);
                let taker = Taker::RecordPiece {
                    node: container,
                    index: k as u32,
                };
                self.record_piece(container, p.size, taker)?;
            }
        }
        let lost: Vec<(usize, BlockRef)> = n
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| !self.st.alloc.is_alive(b.server))
            .map(|(i, b)| (i, *b))
            .collect();
        for (i, old) in lost {
            let new = self.record_block(container)?;
            self.push(Effect::BlockSwapped {
                node: container,
                index: i as u64,
                block: new,
            });
            self.free(old);
        }
        Ok(())
    }
}

/// Allocation error `e` as the error of `container`'s child records.
fn records_error(container: NodeId, e: Error) -> Error {
    Error::new(
        e.code,
        format!(
            "no space for the child records of node {container}: {}",
            e.message
        ),
    )
}
