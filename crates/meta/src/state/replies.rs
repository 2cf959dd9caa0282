//! Replies: what a decided request answers, built from the state once
//! its effects are applied — node information, block and record
//! locations, and the capabilities they carry (`docs/security.md`).

use super::{MetaState, REAP_NODES};
use crate::alloc::BlockRef;
use crate::namespace::{Node, NodeId, SlotRef, ROOT};
use crate::slab::Piece;
use nodekernel_proto::cap::{Cap, Rights};
use nodekernel_proto::crypt;
use nodekernel_proto::meta::MetaReply;
use nodekernel_proto::record::{Layout, SLOT_SIZE};
use nodekernel_proto::{BlockLoc, ClusterStatus, NodeInfo, NodeType, RecordLoc, NO_CLASS};

/// What a decided request replies, built from the state once its effects
/// are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reply {
    Node {
        id: NodeId,
        lease: u64,
        record: Option<SlotRef>,
    },
    Done,
    Record(Option<SlotRef>),
    Moved {
        ty: NodeType,
        clear: Option<SlotRef>,
        write: Option<SlotRef>,
        replaced: Option<SlotRef>,
    },
    Listing(NodeId),
    Blocks {
        node: NodeId,
        index: u64,
        count: u64,
        /// Handed out under the write lease: the locations allow writing.
        write: bool,
    },
    Names(Vec<(u32, NodeType, String)>),
    Registered(u32),
    Status,
    LocalSocket,
    SnapshotBegun {
        id: u64,
        entries: u64,
    },
    SnapshotPage {
        id: u64,
        entry: u64,
        block: u64,
    },
    Located(BlockLoc),
    Drain(u32),
    Policy,
    Resized(u32),
    /// The nodes whose leases a renewal found no longer held.
    Renewed(Vec<NodeId>),
    /// Reserved puts: (node, lease).
    Reserved(Vec<(NodeId, u64)>),
    /// A session opened or renewed.
    Session {
        id: u64,
        lease_ms: u64,
    },
    /// The usage of a node's subtree (and its quota).
    Usage(NodeId),
    /// Every quota root with its usage.
    Quotas,
}

/// What a block location handed out lets its holder do, and when it was
/// handed out (this server's clock, ms): see [`MetaState::cap`].
#[derive(Debug, Clone, Copy)]
pub(super) struct Grant {
    rights: Rights,
    now: u64,
}

impl Grant {
    /// The metadata server's own: claims and copies.
    pub(super) const MANAGE: Grant = Grant {
        rights: Rights::MANAGE,
        now: 0,
    };

    /// A reader's, or with `write` a writer's, at `now`.
    pub(super) fn new(write: bool, now: u64) -> Grant {
        Grant {
            rights: if write { Rights::WRITE } else { Rights::READ },
            now,
        }
    }

    /// Whether it lets its holder write.
    fn writes(&self) -> bool {
        self.rights.allow(Rights::WRITE)
    }
}

/// The clock capabilities are minted by: this server's wall clock (in ms)
/// when its `now` was 0, and how long a client's capability lives.
#[derive(Debug, Clone, Copy)]
pub(super) struct CapClock {
    pub(super) base_ms: u64,
    pub(super) lifetime_s: u64,
}

impl MetaState {
    pub(super) fn reply(&self, r: &Reply, now: u64) -> MetaReply {
        match r {
            Reply::Node { id, lease, record } => {
                let mut info = self.info(*id, *lease, now);
                info.record = record.and_then(|s| self.record_loc(s, now));
                MetaReply::Node(info)
            }
            Reply::Done => MetaReply::Done,
            Reply::Session { id, lease_ms } => MetaReply::Session {
                id: *id,
                lease_ms: *lease_ms,
            },
            Reply::Record(r) => MetaReply::Record(r.and_then(|s| self.record_loc(s, now))),
            Reply::Moved {
                ty,
                clear,
                write,
                replaced,
            } => MetaReply::Moved {
                ty: *ty,
                clear: clear.and_then(|s| self.record_loc(s, now)),
                write: write.and_then(|s| self.record_loc(s, now)),
                replaced: replaced.and_then(|s| self.record_loc(s, now)),
            },
            Reply::Listing(id) => {
                let n = self.ns.get(*id);
                MetaReply::Listing {
                    container: *id,
                    block_size: self.alloc.block_size(),
                    pieces: n.is_none_or(has_record_pieces),
                    slots: n.map_or(0, |n| n.slots.len()),
                    live: n.map_or_else(Vec::new, |n| n.slots.live_bitmap()),
                }
            }
            Reply::Blocks {
                node,
                index,
                count,
                write,
            } => self.blocks_reply(*node, *index, *count, Grant::new(*write, now)),
            Reply::Names(names) => MetaReply::Names(names.clone()),
            Reply::Registered(id) => MetaReply::Registered { server: *id },
            Reply::Status => {
                let servers = self.alloc.status(now);
                let shadows = self.ns.shadow_count() as u64;
                // Reserved puts wait under the root until they are linked.
                let reserved = self.ns.shadows_of(ROOT).count() as u64;
                let reclaiming = self.reclaiming();
                MetaReply::Status(ClusterStatus {
                    block_size: self.alloc.block_size(),
                    nodes: (self.ns.len() as u64).saturating_sub(shadows + reclaiming),
                    puts_in_progress: shadows - reserved,
                    reserved_puts: reserved,
                    reclaiming,
                    partition: self.placement.partition,
                    partitions: self.placement.partitions,
                    expected_servers: self.placement.expected_servers,
                    classes: self.class_table(&servers),
                    servers,
                    // The server shell adds its log.
                    logs: Vec::new(),
                    unreachable: Vec::new(),
                    moves: self.tier.moves.values().copied().collect(),
                    lease_ms: self.lease_ms,
                })
            }
            Reply::LocalSocket => MetaReply::LocalSocket(self.local_socket.clone()),
            Reply::Drain(id) => MetaReply::Drain(self.drain_status(*id)),
            Reply::Policy => MetaReply::Policy(self.tier.settings.show()),
            Reply::Resized(id) => MetaReply::Resized(self.resize_status(*id)),
            Reply::Renewed(lost) => MetaReply::Renewed {
                lease_ms: self.lease_ms,
                lost: lost.clone(),
            },
            Reply::SnapshotBegun { id, entries } => MetaReply::SnapshotBegun {
                id: *id,
                entries: *entries,
            },
            Reply::SnapshotPage { id, entry, block } => {
                self.snapshot_page(*id, *entry, *block, now)
            }
            Reply::Located(loc) => MetaReply::Located(loc.clone()),
            Reply::Reserved(puts) => MetaReply::Reserved {
                lease_ms: self.lease_ms,
                puts: puts
                    .iter()
                    .map(|&(id, lease)| self.info(id, lease, now))
                    .collect(),
            },
            Reply::Usage(id) => MetaReply::Usage(self.usage_info(*id, self.path_of(*id))),
            Reply::Quotas => MetaReply::Quotas(self.quota_infos()),
        }
    }

    /// Nodes in the graveyard (counted up to a bound, to keep status cheap).
    fn reclaiming(&self) -> u64 {
        self.ns
            .graveyard()
            .map(|r| self.ns.subtree_size(r, REAP_NODES) as u64)
            .sum()
    }

    /// The published size and the locations of blocks `[index, index +
    /// count)` that exist, stopping before a block on a dead server or one
    /// being moved (the decision refused the first one already).
    fn blocks_reply(&self, node: NodeId, index: u64, count: u64, g: Grant) -> MetaReply {
        let Some(n) = self.ns.get(node) else {
            return MetaReply::Blocks {
                size: 0,
                blocks: Vec::new(),
            };
        };
        let size = if n.ty.is_container() {
            n.slots.len() as u64 * SLOT_SIZE as u64
        } else {
            n.size
        };
        if let Some(p) = n.piece_for(g.writes()) {
            let blocks = (index == 0)
                .then(|| self.piece_loc(node, &p, g))
                .flatten()
                .into_iter()
                .collect();
            return MetaReply::Blocks { size, blocks };
        }
        // A container's extents: its record pieces, then its blocks.
        let pieces = n.slots.pieces();
        let mut blocks = Vec::new();
        for p in pieces.iter().skip(index.min(pieces.len() as u64) as usize) {
            if blocks.len() as u64 == count || self.slab_moving(p) {
                return MetaReply::Blocks { size, blocks };
            }
            match self.piece_loc(0, p, g) {
                Some(loc) => blocks.push(loc),
                None => return MetaReply::Blocks { size, blocks },
            }
        }
        let first = index.saturating_sub(pieces.len() as u64);
        let end = first
            .saturating_add(count - blocks.len() as u64)
            .min(n.blocks.len() as u64);
        for i in first..end {
            let b = &n.blocks[i as usize];
            if !self.alloc.is_alive(b.server) || self.moves.contains_key(&(node, i)) {
                break;
            }
            blocks.push(self.loc(b, g));
        }
        MetaReply::Blocks { size, blocks }
    }

    /// Bytes of the cluster `n` takes: its blocks and pieces (a
    /// container's: those of its records).
    pub(crate) fn stored(&self, n: &Node) -> u64 {
        let pieces: u64 = n
            .piece
            .iter()
            .chain(n.slots.pieces())
            .map(|p| u64::from(p.size))
            .sum();
        pieces + n.blocks.len() as u64 * u64::from(self.alloc.block_size())
    }

    /// Where container `n`'s records live ([`Layout`]).
    pub(super) fn record_layout(&self, n: &Node) -> Layout {
        Layout::new(self.alloc.block_size(), has_record_pieces(n))
    }

    /// Where a client writes or clears the record of `slot`; `None` while
    /// its block is being moved (a record written to the source after the
    /// copy would be lost, and a lost clear could let a reused slot show
    /// its old name): the record is then missing, enumeration asks the
    /// metadata server for the name, and an uncleared slot stays out of use.
    /// Its capability allows writing that one record only.
    fn record_loc(&self, (container, slot): SlotRef, now: u64) -> Option<RecordLoc> {
        let n = self.ns.get(container)?;
        let (k, offset) = self.record_layout(n).locate(slot);
        let end = offset + n.slots.record_slots(slot) * SLOT_SIZE as u32;
        let g = Grant::new(true, now);
        let pieces = n.slots.pieces();
        let block = match pieces.get(k) {
            Some(p) => {
                if self.slab_moving(p) {
                    return None;
                }
                let at = p.value_offset();
                BlockLoc {
                    offset: at,
                    ..self.loc_of_range(&self.piece_block(p)?, at + offset, at + end, g)
                }
            }
            None => {
                let i = (k - pieces.len()) as u64;
                if self.moves.contains_key(&(container, i)) {
                    return None;
                }
                self.loc_of_range(n.blocks.get(i as usize)?, offset, end, g)
            }
        };
        Some(RecordLoc {
            container,
            slot,
            block,
            offset,
        })
    }

    /// Where block `b` is, with the capability `g` grants for all of it.
    pub(super) fn loc(&self, b: &BlockRef, g: Grant) -> BlockLoc {
        self.loc_of_range(b, 0, self.alloc.block_size(), g)
    }

    /// The capability `g` grants for bytes `lo..hi` of block `b`: the
    /// metadata server's own (claims, copies) never expire; one handed to
    /// a client expires after the capability lifetime, in the clock of
    /// the block's storage server.
    pub(super) fn cap(&self, b: &BlockRef, lo: u32, hi: u32, g: Grant) -> Cap {
        let expires = if g.rights == Rights::MANAGE {
            0
        } else {
            let wall_s = (self.cap_clock.base_ms.saturating_add(g.now) / 1000) as i64;
            let theirs = wall_s.saturating_add(self.alloc.clock_offset_s(b.server));
            (theirs.saturating_add(self.cap_clock.lifetime_s as i64)).max(1) as u64
        };
        match self.alloc.signer(b.server) {
            Some(s) => s.mint(b.block, b.gen, lo, hi, g.rights, expires),
            // A server gone meanwhile: a capability nothing verifies.
            None => Cap::default(),
        }
    }

    /// Where block `b` is, with the capability `g` grants for bytes
    /// `lo..hi` of it.
    pub(super) fn loc_of_range(&self, b: &BlockRef, lo: u32, hi: u32, g: Grant) -> BlockLoc {
        BlockLoc {
            cap: self.cap(b, lo, hi, g),
            server: b.server,
            addr: self
                .alloc
                .server_addr(b.server)
                .unwrap_or_default()
                .to_string(),
            block: b.block,
            gen: b.gen,
            class: self.alloc.server_class(b.server).unwrap_or(0),
            offset: 0,
            tag: 0,
        }
    }

    /// Where `node`'s piece is: its slab's block at the slab's generation,
    /// past the tag that names `node`; `None` when its server is dead or
    /// gone.
    /// (A container's record piece is read and written with no tag check,
    /// `node` 0: records carry their container's id themselves.)
    fn piece_loc(&self, node: NodeId, p: &Piece, g: Grant) -> Option<BlockLoc> {
        let b = self.piece_block(p)?;
        Some(BlockLoc {
            offset: p.value_offset(),
            tag: node,
            ..self.loc_of_range(&b, p.offset(), p.offset() + p.size, g)
        })
    }

    /// The block of piece `p`'s slab at its generation; `None` when its
    /// server is dead or gone.
    fn piece_block(&self, p: &Piece) -> Option<BlockRef> {
        let slab = self.slabs.get(p.server, p.block)?;
        if !self.alloc.is_alive(p.server) {
            return None;
        }
        Some(BlockRef {
            server: p.server,
            block: p.block,
            gen: slab.gen,
        })
    }

    /// Blocks data node `n` needs for its published bytes (none for a
    /// small value, whose piece is not a block).
    pub(super) fn blocks_published(&self, n: &Node) -> u64 {
        if n.piece.is_some() {
            return 0;
        }
        n.size.div_ceil(u64::from(self.block_size_of(n)).max(1))
    }

    /// The bytes one block of `n` holds as its clients see them: a small
    /// value's one block is its piece less the tag, any other node's a
    /// whole block; an encrypted node's, the plaintext those stored bytes
    /// hold ([`crypt::block_capacity`], [`crypt::plain_capacity`] for a
    /// piece). A File in a piece (never encrypted) counts in whole blocks
    /// too, so its offsets stay where they are when it outgrows the piece:
    /// block 0 is the piece, holding [`MetaState::piece_capacity`] bytes.
    /// Every size-to-blocks reckoning of a data node goes through this.
    pub(crate) fn block_size_of(&self, n: &Node) -> u32 {
        match n.piece {
            Some(_) if n.ty != NodeType::File => self.piece_capacity(n),
            _ if n.encrypted => crypt::block_capacity(self.alloc.block_size()),
            _ => self.alloc.block_size(),
        }
    }

    /// The bytes data node `n`'s piece holds for its clients (0 without
    /// one): less the tag; for an encrypted value, the plaintext of its
    /// sealed chunks.
    pub(crate) fn piece_capacity(&self, n: &Node) -> u32 {
        match (n.piece, n.encrypted) {
            (Some(p), true) => crypt::plain_capacity(p.capacity()),
            (Some(p), false) => p.capacity(),
            (None, _) => 0,
        }
    }

    /// Whether a data node created for storage class `class` (resolved:
    /// the request's or the parent's, [`NO_CLASS`] for none) is encrypted:
    /// when it may be placed in an encrypted class, i.e. its class is one,
    /// or it names none and some class is (`docs/encryption.md`).
    pub fn encrypts(&self, class: u8) -> bool {
        let mut sealed = self.classes.iter().filter(|c| c.encrypt);
        if class == NO_CLASS {
            sealed.next().is_some()
        } else {
            sealed.any(|c| c.class == class)
        }
    }

    /// Under a write lease (`lease` not 0), its locations allow writing.
    pub(super) fn info(&self, id: NodeId, lease: u64, now: u64) -> NodeInfo {
        let g = Grant::new(lease != 0, now);
        let Some(n) = self.ns.get(id) else {
            return NodeInfo {
                id,
                ty: NodeType::File,
                size: 0,
                block_size: self.alloc.block_size(),
                storage_class: NO_CLASS,
                location: String::new(),
                enumerable: false,
                mode: 0,
                mtime: 0,
                lease,
                encrypted: false,
                first_block: None,
                record: None,
                stored: 0,
                expires_ms: 0,
                child_ttl_ms: 0,
            };
        };
        let size = if n.ty.is_container() {
            n.children.len() as u64
        } else {
            n.size
        };
        let first_block = match n.piece_for(g.writes()) {
            Some(p) => self.piece_loc(id, &p, g),
            None => n
                .blocks
                .first()
                .filter(|b| {
                    self.alloc.is_alive(b.server)
                        && !n.ty.is_container()
                        && !self.moves.contains_key(&(id, 0))
                })
                .map(|b| self.loc(b, g)),
        };
        NodeInfo {
            id,
            ty: n.ty,
            size,
            block_size: self.block_size_of(n),
            storage_class: n.storage_class,
            location: n.location.to_string(),
            enumerable: n.enumerable,
            mode: u32::from(n.mode),
            mtime: n.mtime,
            lease,
            encrypted: n.encrypted,
            first_block,
            record: None,
            stored: self.stored(n),
            expires_ms: self.ns.expires_at(id).unwrap_or(0),
            child_ttl_ms: self.ns.child_ttl(id).unwrap_or(0),
        }
    }
}

/// Whether container `n`'s records start in pieces: all but the root's
/// (one container, shared by every top-level name: a block of its own
/// costs less than a chain of pieces, each in a slab of its size) and
/// those of a container whose first records got a block (made before
/// record pieces existed, or where no piece could be had).
fn has_record_pieces(n: &Node) -> bool {
    n.id != ROOT && (!n.slots.pieces().is_empty() || n.blocks.is_empty())
}
