//! Snapshots (`docs/snapshots.md`): the frozen listing of a subtree, and
//! the blocks and pieces it pins.
//!
//! Soft state, like the liveness of storage servers: kept in memory only,
//! changed by the notes a [`Decision`](crate::Decision) carries (never by
//! effects), and gone with a restart of the metadata server. What *is*
//! durable is what pins cause: a pinned block or piece that is freed is
//! fenced but *held* ([`Effect::BlockHeld`](crate::Effect::BlockHeld),
//! [`Effect::PieceHeld`](crate::Effect::PieceHeld)) instead of going back
//! for reuse, and released by ordinary free effects once no snapshot pins
//! it (at the snapshot's end, its expiry, or the restart decision).
//!
//! Plain data, no I/O, no clock.

use crate::alloc::BlockRef;
use crate::namespace::NodeId;
use crate::slab::Piece;
use nodekernel_proto::NodeType;
use std::collections::{BTreeMap, BTreeSet};

/// Most snapshots running at once on one metadata server.
pub const MAX_SNAPSHOTS: usize = 4;
/// A snapshot nobody called for this long ends (every snapshot call
/// renews it).
pub const SNAPSHOT_TTL_MS: u64 = 120_000;
/// Most nodes one snapshot may list (its listing is kept in memory).
pub const MAX_SNAPSHOT_NODES: usize = 1 << 24;
/// A listing page holds entries up to about this many encoded bytes (well
/// under the frame limit).
pub const PAGE_BYTES: usize = 1 << 20;

/// One node of a frozen listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Relative to the snapshot's root ("" for the root).
    pub path: Box<str>,
    pub ty: NodeType,
    pub enumerable: bool,
    pub storage_class: u8,
    pub node: NodeId,
    /// Published size at the start (data nodes).
    pub size: u64,
    /// The blocks holding bytes `0..size` at the start; for a small value,
    /// its slab's block at the slab's generation then.
    pub blocks: Vec<BlockRef>,
    /// A small value's piece.
    pub piece: Option<Piece>,
    /// Bytes per block as the node's clients see them
    /// (`MetaState::block_size_of`).
    pub block_size: u32,
    /// The node's clients encrypt its data.
    pub encrypted: bool,
}

/// A running snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub entries: Vec<Listed>,
    /// (server, block) of every block listed (not slabs).
    pub blocks: BTreeSet<(u32, u32)>,
    /// Every piece listed.
    pub pieces: BTreeSet<Piece>,
    /// (server, block) of the slabs of those pieces.
    pub slabs: BTreeSet<(u32, u32)>,
    pub expires_ms: u64,
}

impl Snapshot {
    /// A snapshot of `entries`, pinning their blocks and pieces.
    pub fn new(entries: Vec<Listed>, expires_ms: u64) -> Snapshot {
        let mut s = Snapshot {
            entries: Vec::new(),
            blocks: BTreeSet::new(),
            pieces: BTreeSet::new(),
            slabs: BTreeSet::new(),
            expires_ms,
        };
        for l in &entries {
            match l.piece {
                Some(p) => {
                    s.pieces.insert(p);
                    s.slabs.insert((p.server, p.block));
                }
                None => s
                    .blocks
                    .extend(l.blocks.iter().map(|b| (b.server, b.block))),
            }
        }
        s.entries = entries;
        s
    }
}

/// What a decision changes in the snapshots (applied by
/// [`MetaState::commit`](crate::MetaState::commit)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotNote {
    Begin(u64, Box<Snapshot>),
    /// The snapshot was used: it lives another [`SNAPSHOT_TTL_MS`].
    Renew(u64),
    End(Vec<u64>),
}

/// The running snapshots of one metadata server.
#[derive(Debug, Default)]
pub struct Snapshots {
    map: BTreeMap<u64, Snapshot>,
    next_id: u64,
}

impl Snapshots {
    pub fn get(&self, id: u64) -> Option<&Snapshot> {
        self.map.get(&id)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.map.keys().copied()
    }

    /// The lowest id the next snapshot may take.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Whether a snapshot other than those in `except` pins block `block`
    /// of `server`.
    pub fn pins_block(&self, server: u32, block: u32, except: &[u64]) -> bool {
        self.map
            .iter()
            .any(|(id, s)| !except.contains(id) && s.blocks.contains(&(server, block)))
    }

    /// Whether a snapshot pins a piece of the slab in `block` of `server`.
    pub fn pins_slab(&self, server: u32, block: u32) -> bool {
        self.map
            .values()
            .any(|s| s.slabs.contains(&(server, block)))
    }

    /// Whether a snapshot other than those in `except` pins `piece`.
    pub fn pins_piece(&self, piece: &Piece, except: &[u64]) -> bool {
        self.map
            .iter()
            .any(|(id, s)| !except.contains(id) && s.pieces.contains(piece))
    }

    /// Snapshots not renewed since `now`.
    pub fn expired(&self, now: u64) -> Vec<u64> {
        self.map
            .iter()
            .filter(|(_, s)| s.expires_ms <= now)
            .map(|(id, _)| *id)
            .collect()
    }

    /// Applies a decision's note.
    pub(crate) fn apply(&mut self, note: SnapshotNote, now: u64) {
        match note {
            SnapshotNote::Begin(id, s) => {
                self.next_id = self.next_id.max(id + 1);
                self.map.insert(id, *s);
            }
            SnapshotNote::Renew(id) => {
                if let Some(s) = self.map.get_mut(&id) {
                    s.expires_ms = s.expires_ms.max(now + SNAPSHOT_TTL_MS);
                }
            }
            SnapshotNote::End(ids) => {
                for id in ids {
                    self.map.remove(&id);
                }
            }
        }
    }
}
