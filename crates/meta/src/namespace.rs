//! The hierarchical namespace: nodes, their types and the child rules.
//!
//! Pure data structure, no I/O. It has two kinds of methods:
//! - *queries* (`resolve`, `parent_for`, `next_slot`, `subtree_postorder`,
//!   …) that decide nothing and change nothing, used by
//!   [`MetaState::decide`](crate::MetaState::decide);
//! - *appliers* (`pub(crate)`, named after the [`Effect`](crate::Effect) they
//!   carry out) that change the tree. They are called only from
//!   [`MetaState::apply_effect`](crate::MetaState::apply_effect), never
//!   fail, and leave blocks to the allocator: an applier never frees a block
//!   itself (the decision emitted `BlockFreed` effects first).
//!
//! Removed subtrees are not dropped at once: their root is unlinked (no
//! path reaches it any more) and joins the *graveyard*, from which the
//! reaper drops nodes in bounded batches, leaves first, so that one huge
//! delete never holds the state for long.

use crate::alloc::BlockRef;
use crate::lifetimes::Lifetimes;
use crate::slab::Piece;
use bytes::BytesMut;
use nodekernel_proto::codec::{Dec, Enc};
use nodekernel_proto::path;
use nodekernel_proto::record::{self, Layout};
use nodekernel_proto::{Error, NodeType, Result, NO_CLASS};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use thin_vec::ThinVec;

pub type NodeId = u64;
/// Id of the root directory `/`.
pub const ROOT: NodeId = 1;

/// A write lease: one writer at a time per data node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: u64,
    pub expires_ms: u64,
}

/// State of one record slot of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Reusable.
    Free,
    /// Holds the record of this child.
    Live(NodeId),
    /// The child left; its record is being cleared by a client. The slot is
    /// reused only after the client confirms (`release_slot`), so a late
    /// clear can never wipe a newer child's record.
    Clearing,
    /// A slot after the first of a record that takes several (a name
    /// longer than one slot holds: `record::slots_for`); it goes with the
    /// record's first slot, and is freed with it.
    Tail,
}

/// Free slots a search for a run of several looks at, lowest first,
/// before it takes new slots at the end instead: a create costs a bounded
/// look, however fragmented the table.
const RUN_SEARCH: usize = 1024;

/// Record slots of a container: the container's data is `len() *
/// SLOT_SIZE` bytes. A record takes the slots its name needs, in one
/// extent of the container's layout. Free slots are reused lowest first,
/// so the data stays bounded by the peak size of the records (plus those
/// being cleared).
///
/// Costs: 8 bytes per slot (a record of a name of up to 8 bytes takes
/// one, up to 40 two), plus 40-odd bytes per free slot in the free set.
///
/// Boxed, and absent until the first slot: every node has a table, and most
/// nodes (a million small values) are not containers.
#[derive(Debug, Clone, Default)]
pub struct SlotTable(Option<Box<Slots>>);

/// A [`Slot`] in 8 bytes, not an enum's 16: the child's id, or one of
/// three values no node id reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Packed(u64);

const PACKED_FREE: u64 = u64::MAX;
const PACKED_CLEARING: u64 = u64::MAX - 1;
const PACKED_TAIL: u64 = u64::MAX - 2;
/// Node ids below this fit a packed slot.
const MAX_PACKED_ID: NodeId = PACKED_TAIL;

impl From<Slot> for Packed {
    fn from(s: Slot) -> Packed {
        Packed(match s {
            Slot::Free => PACKED_FREE,
            Slot::Clearing => PACKED_CLEARING,
            Slot::Tail => PACKED_TAIL,
            Slot::Live(id) => {
                debug_assert!(id < MAX_PACKED_ID);
                id
            }
        })
    }
}

impl From<Packed> for Slot {
    fn from(p: Packed) -> Slot {
        match p.0 {
            PACKED_FREE => Slot::Free,
            PACKED_CLEARING => Slot::Clearing,
            PACKED_TAIL => Slot::Tail,
            id => Slot::Live(id),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct Slots {
    slots: Vec<Packed>,
    free: BTreeSet<u32>,
    /// The pieces holding the first records, one per piece extent of the
    /// container's [`Layout`](nodekernel_proto::record::Layout), in extent
    /// order; the node's blocks hold the rest. Empty for the root and a
    /// container made before record pieces.
    pieces: Vec<Piece>,
}

const NO_SLOTS: &[Packed] = &[];

impl SlotTable {
    fn slots(&self) -> &[Packed] {
        self.0.as_ref().map_or(NO_SLOTS, |t| &t.slots)
    }

    fn free(&self) -> Option<&BTreeSet<u32>> {
        self.0.as_ref().map(|t| &t.free)
    }

    fn table(&mut self) -> &mut Slots {
        self.0.get_or_insert_with(Box::default)
    }

    pub fn len(&self) -> u32 {
        self.slots().len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.slots().is_empty()
    }

    /// The first slot of the next record of `n` slots in `layout`: the
    /// lowest run of `n` free slots in one extent (among the first
    /// `RUN_SEARCH` free ones), else new slots at the end, from the next
    /// extent if the last one has no room left for it.
    pub fn peek(&self, n: u32, layout: &Layout) -> u32 {
        // Where the record would start in the run of free slots so far, and
        // the run's last slot.
        let mut run: Option<(u32, u32)> = None;
        for &s in self.free().into_iter().flatten().take(RUN_SEARCH) {
            let at = match run {
                Some((at, last)) if last + 1 == s => at,
                _ => layout.fit(s, n),
            };
            if at + n <= s + 1 {
                return at;
            }
            run = Some((at, s));
        }
        match run {
            // The last slots are free: the record may go on past them.
            Some((at, last)) if last + 1 == self.len() => at,
            _ => layout.fit(self.len(), n),
        }
    }

    /// Makes the `n` slots from `slot` (which [`SlotTable::peek`] returned)
    /// the record of `child`; slots skipped to get there become free.
    fn assign_at(&mut self, slot: u32, n: u32, child: NodeId) {
        let t = self.table();
        let (first, end) = (slot as usize, (slot + n) as usize);
        for s in t.slots.len()..first {
            t.free.insert(s as u32);
        }
        if t.slots.len() < end {
            t.slots.resize(end, Slot::Free.into());
        }
        for (i, s) in t.slots[first..end].iter_mut().enumerate() {
            debug_assert_eq!(Slot::from(*s), Slot::Free, "a record takes free slots");
            *s = if i == 0 {
                Slot::Live(child)
            } else {
                Slot::Tail
            }
            .into();
            t.free.remove(&(first as u32 + i as u32));
        }
    }

    fn set(&mut self, slot: u32, state: Slot) {
        if let Some(s) = self.0.as_mut().and_then(|t| t.slots.get_mut(slot as usize)) {
            *s = state.into();
        }
    }

    /// Frees the record at `slot`: its first slot and its tail.
    fn release(&mut self, slot: u32) {
        let t = self.table();
        for (i, s) in t.slots.iter_mut().enumerate().skip(slot as usize) {
            if i > slot as usize && Slot::from(*s) != Slot::Tail {
                break;
            }
            *s = Slot::Free.into();
            t.free.insert(i as u32);
        }
    }

    /// Slots of the record at `slot`: its first and its tail.
    pub fn record_slots(&self, slot: u32) -> u32 {
        let tail = self
            .slots()
            .iter()
            .skip(slot as usize + 1)
            .take_while(|s| Slot::from(**s) == Slot::Tail)
            .count();
        1 + tail as u32
    }

    pub fn get(&self, slot: u32) -> Option<Slot> {
        self.slots().get(slot as usize).map(|s| Slot::from(*s))
    }

    /// The pieces holding the container's first records, in extent order.
    pub fn pieces(&self) -> &[Piece] {
        self.0.as_ref().map_or(&[], |t| &t.pieces)
    }

    /// The piece of record extent `k` becomes `p`; `k` one past the last
    /// piece appends it.
    fn set_piece(&mut self, k: usize, p: Piece) {
        let pieces = &mut self.table().pieces;
        match pieces.get_mut(k) {
            Some(q) => *q = p,
            None => pieces.push(p),
        }
    }

    /// Every slot with its state, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, Slot)> + '_ {
        self.slots()
            .iter()
            .enumerate()
            .map(|(i, s)| (i as u32, Slot::from(*s)))
    }

    /// Bit `i` of byte `i / 8` is set when slot `i` is live.
    pub fn live_bitmap(&self) -> Vec<u8> {
        let mut bits = vec![0u8; self.slots().len().div_ceil(8)];
        for (i, s) in self.iter() {
            let i = i as usize;
            if matches!(s, Slot::Live(_)) {
                bits[i / 8] |= 1 << (i % 8);
            }
        }
        bits
    }

    /// Whether the free set and the slot states agree, and every tail
    /// follows a record's first slot (for invariant checks).
    pub fn is_consistent(&self) -> bool {
        let free = self.free();
        free.is_none_or(|f| f.iter().all(|s| self.get(*s) == Some(Slot::Free)))
            && self.iter().all(|(i, s)| match s {
                Slot::Free => free.is_some_and(|f| f.contains(&i)),
                Slot::Tail => i > 0 && self.get(i - 1) != Some(Slot::Free),
                Slot::Live(_) | Slot::Clearing => true,
            })
    }
}

/// A node's placement hint (`CreateSpec::location`): a null pointer for
/// the many nodes without one (8 bytes, not a string's 16).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[allow(clippy::box_collection)] // the box is the point: a thin pointer
pub struct Location(Option<Box<String>>);

impl Location {
    pub fn new(location: &str) -> Location {
        Location((!location.is_empty()).then(|| Box::new(location.to_string())))
    }
}

impl std::ops::Deref for Location {
    type Target = str;
    fn deref(&self) -> &str {
        self.0.as_deref().map_or("", String::as_str)
    }
}

/// A node's record slot in its parent, if it has one (4 bytes, not an
/// `Option<u32>`'s 8; no container has `u32::MAX` slots: `MAX_SLOTS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordSlot(u32);

/// More slots than any container may have.
pub const MAX_SLOTS: u32 = u32::MAX - 1;

impl RecordSlot {
    pub const NONE: RecordSlot = RecordSlot(u32::MAX);

    pub fn new(slot: Option<u32>) -> RecordSlot {
        debug_assert!(slot.is_none_or(|s| s < MAX_SLOTS));
        RecordSlot(slot.unwrap_or(u32::MAX))
    }

    pub fn get(self) -> Option<u32> {
        (self.0 != u32::MAX).then_some(self.0)
    }

    pub fn take(&mut self) -> Option<u32> {
        std::mem::replace(self, RecordSlot::NONE).get()
    }
}

/// The children of a container by full name; nothing but a null pointer
/// for a node without any (every data node: 8 bytes, not a B-tree's 24).
#[derive(Debug, Clone, Default)]
#[allow(clippy::box_collection)] // the box is the point: a thin pointer
pub struct Children(Option<Box<BTreeMap<Arc<str>, NodeId>>>);

static NO_CHILDREN: BTreeMap<Arc<str>, NodeId> = BTreeMap::new();

impl std::ops::Deref for Children {
    type Target = BTreeMap<Arc<str>, NodeId>;
    fn deref(&self) -> &Self::Target {
        self.0.as_deref().unwrap_or(&NO_CHILDREN)
    }
}

impl Children {
    pub fn insert(&mut self, name: Arc<str>, id: NodeId) -> Option<NodeId> {
        self.0.get_or_insert_default().insert(name, id)
    }

    /// Removes `name`; the map goes with its last child.
    pub fn remove(&mut self, name: &str) -> Option<NodeId> {
        let map = self.0.as_mut()?;
        let id = map.remove(name);
        if map.is_empty() {
            self.0 = None;
        }
        id
    }
}

impl FromIterator<(Arc<str>, NodeId)> for Children {
    fn from_iter<I: IntoIterator<Item = (Arc<str>, NodeId)>>(children: I) -> Children {
        let map: BTreeMap<_, _> = children.into_iter().collect();
        Children((!map.is_empty()).then(|| Box::new(map)))
    }
}

#[derive(Debug, Clone)]
pub struct Node {
    pub id: NodeId,
    /// The parent (for a shadow KeyValue: the Table it will be put into).
    pub parent: NodeId,
    /// Shared with the parent's `children` key: one allocation per name.
    pub name: Arc<str>,
    pub ty: NodeType,
    /// Published size (data nodes).
    pub size: u64,
    /// Blocks of the node's data: bytes of a data node, child records of a
    /// container.
    pub blocks: ThinVec<BlockRef>,
    /// A small value's piece of a shared block, instead of blocks.
    pub piece: Option<Piece>,
    /// Children of a container, by full name (the authority on what exists).
    pub children: Children,
    /// Record slots of a container.
    pub slots: SlotTable,
    /// This node's record slot in its parent (None: parent not enumerable,
    /// root, or not linked yet).
    pub slot: RecordSlot,
    /// False for a KeyValue whose put has not closed yet, and for the root
    /// of a removed subtree waiting in the graveyard.
    pub linked: bool,
    pub storage_class: u8,
    pub location: Location,
    pub enumerable: bool,
    /// Tier migration leaves its blocks where they are.
    pub pinned: bool,
    /// Its clients encrypt its data (`docs/encryption.md`): fixed at
    /// create. A data node that is not is never placed in, or moved into,
    /// an encrypted class.
    pub encrypted: bool,
    /// Permission bits (at most `MAX_MODE`).
    pub mode: u16,
    pub lease: Option<Lease>,
    /// Modification time, nanoseconds since the Unix epoch (a client's
    /// clock; 0 for a node from before nodes kept one).
    pub mtime: u64,
}

impl Node {
    /// The piece holding this data node's bytes as its readers see them,
    /// or with `write` as its writer does: a File whose writer outgrew its
    /// piece (it has blocks too, until that writer syncs) is its blocks
    /// to the writer.
    pub fn piece_for(&self, write: bool) -> Option<Piece> {
        self.piece.filter(|_| self.blocks.is_empty() || !write)
    }

    /// The piece of a File its writer outgrew and has not published its
    /// blocks over yet.
    pub fn outgrown_piece(&self) -> Option<Piece> {
        self.piece.filter(|_| !self.blocks.is_empty())
    }
}

/// [`NodeType::default_mode`], as a node keeps it.
fn default_mode(ty: NodeType) -> u16 {
    ty.default_mode() as u16
}

/// What a new node is made of (the fields of
/// [`Effect::NodeCreated`](crate::Effect::NodeCreated)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewNode {
    pub id: NodeId,
    pub parent: NodeId,
    pub name: String,
    pub ty: NodeType,
    /// Already resolved: the request's class, or the parent's.
    pub storage_class: u8,
    pub location: String,
    pub enumerable: bool,
    pub pinned: bool,
    pub encrypted: bool,
}

#[derive(Debug)]
pub struct Namespace {
    /// Boxed: the table keeps up to twice as many buckets as nodes, and an
    /// empty bucket then costs a pointer rather than a whole node (with a
    /// million small values, 230 MB less).
    nodes: HashMap<NodeId, Box<Node>>,
    next_id: NodeId,
    /// KeyValue puts not closed yet, by (target table, node).
    shadows: BTreeSet<(NodeId, NodeId)>,
    /// Roots of removed subtrees whose nodes are not dropped yet.
    graveyard: BTreeSet<NodeId>,
    /// Write leases by (expiry, node), so the sweep finds lapsed ones
    /// without walking every node.
    leases: BTreeSet<(u64, NodeId)>,
    /// Expiry times and child TTLs of the nodes that have them.
    life: Lifetimes,
}

impl Default for Namespace {
    fn default() -> Self {
        Self::new()
    }
}

/// Options of a create, besides path and type.
#[derive(Debug, Clone)]
pub struct CreateSpec {
    /// Preferred storage class; [`NO_CLASS`] inherits the parent's.
    pub storage_class: u8,
    pub location: String,
    /// Only meaningful for Tables.
    pub enumerable: bool,
}

impl Default for CreateSpec {
    fn default() -> Self {
        CreateSpec {
            storage_class: NO_CLASS,
            location: String::new(),
            enumerable: true,
        }
    }
}

/// A node's flags as the log and checkpoints keep them: bit 0
/// enumerable, bit 1 pinned, bit 2 encrypted (older records hold only the
/// lower bits; a build from before a bit refuses a record that sets it).
pub(crate) fn node_flags(enumerable: bool, pinned: bool, encrypted: bool) -> u8 {
    u8::from(enumerable) | u8::from(pinned) << 1 | u8::from(encrypted) << 2
}

/// Decodes [`node_flags`] as (enumerable, pinned, encrypted).
pub(crate) fn dec_node_flags(d: &mut Dec) -> Result<(bool, bool, bool)> {
    match d.u8()? {
        f @ 0..=7 => Ok((f & 1 != 0, f & 2 != 0, f & 4 != 0)),
        f => Err(Error::protocol(format!("bad node flags {f:#x}"))),
    }
}

/// A record slot in a container: (container id, slot).
pub type SlotRef = (NodeId, u32);

impl Namespace {
    pub fn new() -> Self {
        let root = Node {
            id: ROOT,
            parent: ROOT,
            name: "".into(),
            ty: NodeType::Directory,
            size: 0,
            blocks: ThinVec::new(),
            piece: None,
            children: Children::default(),
            slots: SlotTable::default(),
            slot: RecordSlot::NONE,
            linked: true,
            storage_class: NO_CLASS,
            location: Location::default(),
            enumerable: true,
            pinned: false,
            encrypted: false,
            mode: default_mode(NodeType::Directory),
            lease: None,
            mtime: 0,
        };
        Namespace {
            nodes: HashMap::from([(ROOT, Box::new(root))]),
            next_id: ROOT + 1,
            shadows: BTreeSet::new(),
            graveyard: BTreeSet::new(),
            leases: BTreeSet::new(),
            life: Lifetimes::default(),
        }
    }

    // ----- queries -----------------------------------------------------------

    /// Number of nodes, the root, puts in progress and removed nodes not
    /// reaped yet included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// Puts in progress (KeyValues not closed yet).
    pub fn shadow_count(&self) -> usize {
        self.shadows.len()
    }

    /// The id the next created node gets.
    pub fn next_id(&self) -> NodeId {
        self.next_id
    }

    /// Node ids continue from at least `floor` (applier).
    pub(crate) fn raise_next_id(&mut self, floor: NodeId) {
        self.next_id = self.next_id.max(floor);
    }

    pub fn get(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(&id).map(|n| &**n)
    }

    /// Every node, in no particular order (for invariant checks).
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values().map(|n| &**n)
    }

    /// KeyValues whose put has not closed yet.
    pub fn shadows(&self) -> impl Iterator<Item = &Node> {
        self.shadows.iter().filter_map(|(_, id)| self.get(*id))
    }

    /// Whether `id` is a put not closed yet.
    pub fn is_unclosed(&self, id: NodeId) -> bool {
        self.get(id)
            .is_some_and(|n| self.shadows.contains(&(n.parent, id)))
    }

    /// Puts in progress into `table`.
    pub fn shadows_of(&self, table: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        self.shadows
            .range((table, 0)..=(table, NodeId::MAX))
            .map(|(_, id)| *id)
    }

    /// Nodes whose write lease expired at or before `at` (ms), soonest
    /// expired first.
    pub fn leases_expired_by(&self, at: u64) -> impl Iterator<Item = NodeId> + '_ {
        self.leases.range(..=(at, NodeId::MAX)).map(|(_, id)| *id)
    }

    /// Whether the lease index names exactly the nodes' leases.
    pub(crate) fn leases_indexed(&self) -> bool {
        let held = self.nodes.values().filter(|n| n.lease.is_some()).count();
        held == self.leases.len()
            && self.leases.iter().all(|(at, id)| {
                self.get(*id)
                    .and_then(|n| n.lease)
                    .is_some_and(|l| l.expires_ms == *at)
            })
    }

    /// Roots of removed subtrees not reaped yet.
    pub fn graveyard(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.graveyard.iter().copied()
    }

    /// Expiry times and child TTLs.
    pub fn lifetimes(&self) -> &Lifetimes {
        &self.life
    }

    /// When node `id` expires, if it does.
    pub fn expires_at(&self, id: NodeId) -> Option<u64> {
        self.life.expires_at(id)
    }

    /// Container `id`'s TTL for new children, if it has one.
    pub fn child_ttl(&self, id: NodeId) -> Option<u64> {
        self.life.child_ttl(id)
    }

    /// Node `id` expires at `expires_ms` (0: never) and gives new
    /// children a TTL of `child_ttl_ms` (0: none). A node that does not
    /// exist keeps nothing.
    pub(crate) fn set_lifetime(&mut self, id: NodeId, expires_ms: u64, child_ttl_ms: u64) {
        if self.nodes.contains_key(&id) {
            self.life.set_expiry(id, expires_ms);
            self.life.set_child_ttl(id, child_ttl_ms);
        } else {
            self.life.forget(id);
        }
    }

    pub(crate) fn lifetimes_mut(&mut self) -> &mut Lifetimes {
        &mut self.life
    }

    /// Node `id` is bound to `session` (a node that does not exist, or a
    /// session that is not open, keeps nothing).
    pub(crate) fn bind_session(&mut self, id: NodeId, session: u64) {
        if self.nodes.contains_key(&id) && self.life.session(session).is_some() {
            self.life.bind(id, session);
        }
    }

    pub fn graveyard_is_empty(&self) -> bool {
        self.graveyard.is_empty()
    }

    /// Removed subtrees waiting in the graveyard.
    pub fn graveyard_len(&self) -> usize {
        self.graveyard.len()
    }

    /// Resolves a path to a node id.
    pub fn resolve(&self, p: &str) -> Result<NodeId> {
        let comps = path::components(p)?;
        self.walk(p, &comps)
    }

    fn walk(&self, p: &str, comps: &[&str]) -> Result<NodeId> {
        let mut cur = ROOT;
        for (i, name) in comps.iter().enumerate() {
            let node = &self.nodes[&cur];
            if !node.ty.is_container() {
                return Err(Error::type_mismatch(format!(
                    "{p}: {} is a {} and has no children",
                    prefix(comps, i),
                    node.ty
                )));
            }
            cur = *node.children.get(*name).ok_or_else(|| {
                if i + 1 == comps.len() {
                    Error::not_found(format!("{p} does not exist"))
                } else {
                    Error::not_found(format!(
                        "{p}: parent {} does not exist",
                        prefix(comps, i + 1)
                    ))
                }
            })?;
        }
        Ok(cur)
    }

    /// Resolves the parent of a non-root path and checks it can hold `ty`;
    /// returns the parent and the new name.
    pub fn parent_for(&self, p: &str, ty: NodeType) -> Result<(NodeId, String)> {
        let comps = path::components(p)?;
        let Some((name, parent_comps)) = comps.split_last() else {
            return Err(Error::already_exists("/ (the root) always exists"));
        };
        let parent = self.walk(p, parent_comps).map_err(|e| match e.code {
            nodekernel_proto::ErrorCode::NotFound => Error::not_found(format!(
                "{p}: parent {} does not exist",
                prefix(&comps, comps.len() - 1)
            )),
            _ => e,
        })?;
        let pnode = &self.nodes[&parent];
        if !pnode.ty.accepts(ty) {
            return Err(Error::type_mismatch(format!(
                "cannot put a {ty} at {p}: {}",
                pnode.ty.child_rule()
            )));
        }
        Ok((parent, name.to_string()))
    }

    /// Whether `parent` keeps a record of each child.
    pub fn keeps_records(&self, parent: NodeId) -> bool {
        self.nodes
            .get(&parent)
            .is_some_and(|n| n.ty.is_container() && n.enumerable)
    }

    /// The child of `parent` named `name`.
    pub fn child(&self, parent: NodeId, name: &str) -> Option<NodeId> {
        self.nodes.get(&parent)?.children.get(name).copied()
    }

    /// The storage class a new child of `parent` gets for a requested
    /// `class` ([`NO_CLASS`] inherits the parent's).
    pub fn class_for_child(&self, parent: NodeId, class: u8) -> u8 {
        if class == NO_CLASS {
            self.nodes
                .get(&parent)
                .map_or(NO_CLASS, |p| p.storage_class)
        } else {
            class
        }
    }

    /// Checks a move and returns (node, new parent, new name). `dst` must
    /// not exist, its parent must accept the node's type, and a container
    /// cannot move into itself.
    pub fn check_rename(
        &self,
        src: &str,
        dst: &str,
        replace: bool,
    ) -> Result<(NodeId, NodeId, String, Option<NodeId>)> {
        let id = self.resolve(src)?;
        if id == ROOT {
            return Err(Error::invalid_argument(
                "the root directory / cannot be moved",
            ));
        }
        let ty = self.nodes[&id].ty;
        let (new_parent, new_name) = self.parent_for(dst, ty)?;
        let replaced = self.nodes[&new_parent]
            .children
            .get(new_name.as_str())
            .copied();
        if let Some(old) = replaced {
            if !replace {
                return Err(Error::already_exists(format!(
                    "cannot move {src} to {dst}: {dst} already exists"
                )));
            }
            if old == id {
                // Renaming a node to its own name changes nothing.
                return Ok((id, new_parent, new_name, replaced));
            }
            let o = &self.nodes[&old];
            if o.ty != ty {
                return Err(Error::type_mismatch(format!(
                    "cannot move {src} (a {ty}) over {dst} (a {})",
                    o.ty
                )));
            }
            if !o.children.is_empty() {
                return Err(Error::not_empty(format!(
                    "cannot move {src} over {dst}: {dst} has {} children",
                    o.children.len()
                )));
            }
        }
        let mut cur = new_parent;
        loop {
            if cur == id {
                return Err(Error::invalid_argument(format!(
                    "cannot move {src} into its own subtree ({dst})"
                )));
            }
            if cur == ROOT {
                break;
            }
            cur = self.nodes[&cur].parent;
        }
        Ok((id, new_parent, new_name, replaced))
    }

    /// Nodes of the subtrees rooted at `roots` (which must exist), children
    /// before their parents (post-order), puts in progress into a Table
    /// before the Table. Stops after `limit` nodes: a container is listed
    /// only once all its children are, so dropping a prefix of this list
    /// never orphans a listed node's children.
    pub fn subtree_postorder(&self, roots: &[NodeId], limit: usize) -> Vec<NodeId> {
        let mut out = Vec::new();
        for &root in roots {
            // (node, children expanded?)
            let mut stack = vec![(root, false)];
            while let Some((id, expanded)) = stack.pop() {
                if out.len() >= limit {
                    return out;
                }
                let Some(n) = self.nodes.get(&id) else {
                    continue;
                };
                if expanded {
                    out.push(id);
                    continue;
                }
                stack.push((id, true));
                // At most `limit` children of a node can come out before
                // the step ends, so only those are stacked: a step costs
                // time in proportion to `limit`, not to the width of a
                // container (a Table of a million keys). Reversed, so
                // children come out in name order.
                // (Collected first: reversing a `take` of a B-tree walks it
                // from the far end.)
                let room = limit - out.len();
                let children: Vec<NodeId> = n.children.values().take(room).copied().collect();
                stack.extend(children.into_iter().rev().map(|c| (c, false)));
                let shadows: Vec<NodeId> = self.shadows_of(id).take(room).collect();
                stack.extend(shadows.into_iter().rev().map(|c| (c, false)));
            }
        }
        out
    }

    /// Number of nodes in the subtree rooted at `root`, counting at most
    /// `limit` (so the cost is bounded).
    pub fn subtree_size(&self, root: NodeId, limit: usize) -> usize {
        let mut n = 0;
        let mut stack = vec![root];
        while let Some(id) = stack.pop() {
            n += 1;
            if n >= limit {
                return n;
            }
            if let Some(node) = self.nodes.get(&id) {
                // Only what can still be counted (see `subtree_postorder`).
                let room = limit - n;
                stack.extend(node.children.values().take(room).copied());
                stack.extend(self.shadows_of(id).take(room));
            }
        }
        n
    }

    /// Names of the live children of a container, as the metadata server
    /// knows them (empty for a non-enumerable Table). Clients enumerate
    /// through the data plane; this is the authority it is checked against.
    pub fn children(&self, p: &str) -> Result<Vec<String>> {
        let id = self.container(p)?;
        let n = &self.nodes[&id];
        if !n.enumerable {
            return Ok(Vec::new());
        }
        Ok(n.children.keys().map(|k| k.to_string()).collect())
    }

    /// Resolves `p` and checks it is a container.
    pub fn container(&self, p: &str) -> Result<NodeId> {
        let id = self.resolve(p)?;
        let n = &self.nodes[&id];
        if !n.ty.is_container() {
            return Err(Error::type_mismatch(format!(
                "{p} is a {}, not a container; only Directory, Table and Bag can be enumerated",
                n.ty
            )));
        }
        Ok(id)
    }

    /// The whole tree as text, in a fixed order (for tests comparing
    /// states).
    #[cfg(test)]
    pub(crate) fn dump(&self) -> String {
        use std::fmt::Write;
        let mut ids: Vec<&NodeId> = self.nodes.keys().collect();
        ids.sort();
        let mut out = format!(
            "next_id {} shadows {:?} graveyard {:?}\n",
            self.next_id, self.shadows, self.graveyard
        );
        for id in ids {
            let _ = writeln!(out, "{:?}", self.nodes[id]);
        }
        let _ = writeln!(out, "lifetimes {:?}", self.life.entries());
        let sessions: Vec<_> = self.life.sessions().collect();
        let _ = writeln!(
            out,
            "sessions {:?} next {} bound {:?}",
            sessions,
            self.life.next_session(),
            self.life.bindings()
        );
        out
    }

    // ----- appliers (called from MetaState::apply_effect only) --------------

    pub(crate) fn get_mut(&mut self, id: NodeId) -> Option<&mut Node> {
        self.nodes.get_mut(&id).map(|n| &mut **n)
    }

    /// Adds a node, unlinked: a KeyValue put stays so until its close; other
    /// nodes are linked by the `Linked` effect that follows.
    pub(crate) fn insert(&mut self, n: &NewNode) {
        debug_assert!(!self.nodes.contains_key(&n.id), "node ids are never reused");
        self.next_id = self.next_id.max(n.id + 1);
        self.nodes.insert(
            n.id,
            Box::new(Node {
                id: n.id,
                parent: n.parent,
                name: n.name.as_str().into(),
                ty: n.ty,
                size: 0,
                blocks: ThinVec::new(),
                piece: None,
                children: Children::default(),
                slots: SlotTable::default(),
                slot: RecordSlot::NONE,
                linked: false,
                storage_class: n.storage_class,
                location: Location::new(&n.location),
                enumerable: n.ty != NodeType::Table || n.enumerable,
                pinned: n.pinned,
                encrypted: n.encrypted,
                mode: default_mode(n.ty),
                lease: None,
                mtime: 0,
            }),
        );
        if n.ty.replaces_on_create() {
            self.shadows.insert((n.parent, n.id));
        }
    }

    /// `id`'s permission bits and modification time.
    pub(crate) fn set_attrs(&mut self, id: NodeId, mode: u16, mtime: u64) {
        if let Some(n) = self.nodes.get_mut(&id) {
            n.mode = mode;
            n.mtime = mtime;
        }
    }

    /// Gives `id` piece `p`: a small value's piece, or a container's next
    /// record piece.
    pub(crate) fn take_piece(&mut self, id: NodeId, p: Piece) {
        if let Some(n) = self.nodes.get_mut(&id) {
            if n.ty.is_container() {
                let next = n.slots.pieces().len();
                n.slots.set_piece(next, p);
            } else {
                n.piece = Some(p);
            }
        }
    }

    /// File `id` leaves its piece for its blocks.
    pub(crate) fn outgrow_piece(&mut self, id: NodeId) {
        if let Some(n) = self.nodes.get_mut(&id) {
            n.piece = None;
        }
    }

    /// Record piece `k` of container `id` becomes `p`.
    pub(crate) fn swap_record_piece(&mut self, id: NodeId, k: usize, p: Piece) {
        if let Some(n) = self.nodes.get_mut(&id) {
            n.slots.set_piece(k, p);
        }
    }

    /// `id`'s piece at `index` of the slab in `block` of `server` moved
    /// with its slab to `to` (same index and size).
    pub(crate) fn move_piece(&mut self, id: NodeId, (server, block): (u32, u32), to: Piece) {
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        let was = |p: &Piece| (p.server, p.block, p.index) == (server, block, to.index);
        if n.piece.as_ref().is_some_and(was) {
            n.piece = Some(to);
        }
        if let Some(k) = n.slots.pieces().iter().position(was) {
            n.slots.set_piece(k, to);
        }
    }

    /// `id`'s write lease (`None`: no writer).
    pub(crate) fn set_lease(&mut self, id: NodeId, lease: Option<Lease>) {
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        if let Some(old) = std::mem::replace(&mut n.lease, lease) {
            self.leases.remove(&(old.expires_ms, id));
        }
        if let Some(l) = lease {
            self.leases.insert((l.expires_ms, id));
        }
    }

    /// Reserved put `id` becomes a put into Table `parent` under `name`
    /// (still unlinked: a shadow of that table).
    pub(crate) fn aim(&mut self, id: NodeId, parent: NodeId, name: &str) {
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        self.shadows.remove(&(n.parent, id));
        n.parent = parent;
        n.name = name.into();
        self.shadows.insert((parent, id));
    }

    /// Links `id` into its parent under its name, with record `slot`.
    pub(crate) fn link(&mut self, id: NodeId, slot: Option<u32>) {
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        n.linked = true;
        n.slot = RecordSlot::new(slot);
        let (parent, name) = (n.parent, n.name.clone());
        self.shadows.remove(&(parent, id));
        if let Some(p) = self.nodes.get_mut(&parent) {
            if let Some(s) = slot {
                p.slots.assign_at(s, record::slots_for(name.len()), id);
            }
            p.children.insert(name, id);
        }
    }

    /// The put `new` replaces KeyValue `old` (same parent and name): `new`
    /// takes `old`'s place and record slot, and `old` is dropped (its blocks
    /// were freed by earlier effects).
    pub(crate) fn replace(&mut self, old: NodeId, new: NodeId) {
        let Some(o) = self.nodes.remove(&old) else {
            return;
        };
        self.life.forget(old);
        if let Some(l) = o.lease {
            self.leases.remove(&(l.expires_ms, old));
        }
        let Some(n) = self.nodes.get_mut(&new) else {
            return;
        };
        n.linked = true;
        n.slot = o.slot;
        let (parent, name) = (n.parent, n.name.clone());
        self.shadows.remove(&(parent, new));
        if let Some(p) = self.nodes.get_mut(&parent) {
            if let Some(s) = o.slot.get() {
                p.slots.set(s, Slot::Live(new));
            }
            p.children.insert(name, new);
        }
    }

    /// Unlinks `id` from its parent (its record slot goes to `Clearing`) and
    /// puts its subtree in the graveyard.
    pub(crate) fn unlink(&mut self, id: NodeId) {
        let Some(n) = self.nodes.get_mut(&id) else {
            return;
        };
        n.linked = false;
        let (parent, name, slot) = (n.parent, n.name.clone(), n.slot.take());
        if let Some(p) = self.nodes.get_mut(&parent) {
            if p.children.get(&name) == Some(&id) {
                p.children.remove(&name);
            }
            if let Some(s) = slot {
                p.slots.set(s, Slot::Clearing);
            }
        }
        self.graveyard.insert(id);
    }

    /// Drops a node for good: a reaped node (its children were dropped
    /// before it), or a put that never closed. Its blocks were freed by
    /// earlier effects.
    pub(crate) fn drop_node(&mut self, id: NodeId) {
        let Some(n) = self.nodes.remove(&id) else {
            return;
        };
        debug_assert!(n.children.is_empty(), "children are dropped first");
        self.graveyard.remove(&id);
        self.life.forget(id);
        if let Some(l) = n.lease {
            self.leases.remove(&(l.expires_ms, id));
        }
        self.shadows.remove(&(n.parent, id));
        if let Some(p) = self.nodes.get_mut(&n.parent) {
            if p.children.get(&n.name) == Some(&id) {
                p.children.remove(&n.name);
            }
            // Only a reaped child still holds a slot, and its parent is
            // being reaped too: nobody reads those records any more.
            if let Some(s) = n.slot.get() {
                p.slots.set(s, Slot::Clearing);
            }
        }
    }

    /// Moves `id` under `parent` as `name` with record `slot`; its old
    /// record slot goes to `Clearing`.
    pub(crate) fn move_node(&mut self, id: NodeId, parent: NodeId, name: &str, slot: Option<u32>) {
        let Some(n) = self.nodes.get(&id) else {
            return;
        };
        let name: Arc<str> = name.into();
        let (old_parent, old_name, old_slot) = (n.parent, n.name.clone(), n.slot.get());
        if let Some(op) = self.nodes.get_mut(&old_parent) {
            op.children.remove(&old_name);
            if let Some(s) = old_slot {
                op.slots.set(s, Slot::Clearing);
            }
        }
        if let Some(np) = self.nodes.get_mut(&parent) {
            if let Some(s) = slot {
                np.slots.assign_at(s, record::slots_for(name.len()), id);
            }
            np.children.insert(name.clone(), id);
        }
        let n = self.nodes.get_mut(&id).expect("checked above");
        n.parent = parent;
        n.name = name;
        n.slot = RecordSlot::new(slot);
    }

    /// A client finished clearing the record in `slot`: it may be reused.
    pub(crate) fn release_slot(&mut self, container: NodeId, slot: u32) {
        if let Some(n) = self.nodes.get_mut(&container) {
            n.slots.release(slot);
        }
    }
}

// ----- checkpoints -----------------------------------------------------------

/// Where an unlinked node waits (linked nodes: neither).
const IN_NOTHING: u8 = 0;
const IN_SHADOWS: u8 = 1;
const IN_GRAVEYARD: u8 = 2;

impl Namespace {
    /// Every node as a checkpoint record (`crate::checkpoint`), in no
    /// particular order, and the next node id.
    pub(crate) fn checkpoint_nodes(&self, mut each: impl FnMut(NodeId, &[u8])) -> NodeId {
        let mut buf = BytesMut::new();
        for n in self.nodes.values() {
            buf.clear();
            let e = &mut Enc(&mut buf);
            let waits = if self.shadows.contains(&(n.parent, n.id)) {
                IN_SHADOWS
            } else if self.graveyard.contains(&n.id) {
                IN_GRAVEYARD
            } else {
                IN_NOTHING
            };
            e.u64(n.parent)
                .str(&n.name)
                .u8(n.ty as u8)
                .u64(n.size)
                .u32(n.blocks.len() as u32);
            for b in &n.blocks {
                e.u32(b.server).u32(b.block).u64(b.gen);
            }
            match &n.piece {
                Some(p) => e
                    .bool(true)
                    .u32(p.server)
                    .u32(p.block)
                    .u32(p.index)
                    .u32(p.size),
                None => e.bool(false),
            };
            match &n.slots.0 {
                Some(t) => {
                    e.bool(true).u32(t.slots.len() as u32);
                    for s in &t.slots {
                        match Slot::from(*s) {
                            Slot::Free => e.u8(0),
                            Slot::Live(id) => e.u8(1).u64(id),
                            Slot::Clearing => e.u8(2),
                            Slot::Tail => e.u8(3),
                        };
                    }
                }
                None => {
                    e.bool(false);
                }
            }
            match n.slot.get() {
                Some(s) => e.bool(true).u32(s),
                None => e.bool(false),
            };
            e.bool(n.linked)
                .u8(waits)
                .u8(n.storage_class)
                .str(&n.location)
                .u8(node_flags(n.enumerable, n.pinned, n.encrypted));
            match n.lease {
                Some(l) => e.bool(true).u64(l.id).u64(l.expires_ms),
                None => e.bool(false),
            };
            e.u16(n.mode).u64(n.mtime);
            // Only a container's record ends with its record pieces.
            let pieces = n.slots.pieces();
            if !pieces.is_empty() {
                e.u32(pieces.len() as u32);
                for p in pieces {
                    e.u32(p.server).u32(p.block).u32(p.index).u32(p.size);
                }
            }
            each(n.id, &buf);
        }
        self.next_id
    }

    /// The namespace of a checkpoint: its node records (as
    /// [`Namespace::checkpoint_nodes`] wrote them) and next node id. The
    /// child maps, puts in progress and graveyard are rebuilt from the
    /// nodes; a record that does not decode, or a checkpoint whose nodes do
    /// not form a tree, is an error.
    pub(crate) fn from_checkpoint(
        next_id: NodeId,
        records: impl Iterator<Item = Result<(NodeId, Vec<u8>)>>,
    ) -> Result<Namespace> {
        if next_id >= MAX_PACKED_ID {
            return Err(Error::protocol(format!("bad next node id {next_id}")));
        }
        let mut ns = Namespace {
            nodes: HashMap::with_capacity(records.size_hint().0),
            next_id,
            shadows: BTreeSet::new(),
            graveyard: BTreeSet::new(),
            leases: BTreeSet::new(),
            life: Lifetimes::default(),
        };
        for r in records {
            let (id, rec) = r?;
            let d = &mut Dec::new(&rec, "checkpointed node");
            let parent = d.u64()?;
            let name: Arc<str> = d.string()?.into();
            let ty = NodeType::from_u8(d.u8()?)?;
            let size = d.u64()?;
            let nb = d.count(16)?;
            let mut blocks = ThinVec::with_capacity(nb);
            for _ in 0..nb {
                blocks.push(BlockRef {
                    server: d.u32()?,
                    block: d.u32()?,
                    gen: d.u64()?,
                });
            }
            let piece = if d.bool()? {
                Some(Piece {
                    server: d.u32()?,
                    block: d.u32()?,
                    index: d.u32()?,
                    size: d.u32()?,
                })
            } else {
                None
            };
            let slots = if d.bool()? {
                let n = d.count(1)?;
                let mut t = Slots::default();
                for i in 0..n as u32 {
                    let s = match d.u8()? {
                        0 => Slot::Free,
                        1 => match d.u64()? {
                            child if child < MAX_PACKED_ID => Slot::Live(child),
                            _ => return Err(Error::protocol(format!("node {id}: bad child id"))),
                        },
                        2 => Slot::Clearing,
                        3 => Slot::Tail,
                        v => return Err(Error::protocol(format!("node {id}: bad slot state {v}"))),
                    };
                    if s == Slot::Free {
                        t.free.insert(i);
                    }
                    t.slots.push(s.into());
                }
                SlotTable(Some(Box::new(t)))
            } else {
                SlotTable(None)
            };
            let slot = if d.bool()? { Some(d.u32()?) } else { None };
            if slot.is_some_and(|s| s >= MAX_SLOTS) {
                return Err(Error::protocol(format!("node {id}: bad record slot")));
            }
            let linked = d.bool()?;
            let waits = d.u8()?;
            let storage_class = d.u8()?;
            let location = Location::new(&d.string()?);
            let (enumerable, pinned, encrypted) = dec_node_flags(d)?;
            let lease = if d.bool()? {
                Some(Lease {
                    id: d.u64()?,
                    expires_ms: d.u64()?,
                })
            } else {
                None
            };
            // Records of checkpoint format 3 end here (nodes kept no
            // attributes then).
            let (mode, mtime) = if d.remaining() == 0 {
                (default_mode(ty), 0)
            } else {
                (d.u16()?, d.u64()?)
            };
            if u32::from(mode) > nodekernel_proto::meta::MAX_MODE {
                return Err(Error::protocol(format!("node {id}: bad mode {mode:#o}")));
            }
            let mut slots = slots;
            if d.remaining() != 0 {
                if !ty.is_container() {
                    return Err(Error::protocol(format!(
                        "node {id}: a {ty} with record pieces"
                    )));
                }
                for k in 0..d.count(16)? {
                    slots.set_piece(
                        k,
                        Piece {
                            server: d.u32()?,
                            block: d.u32()?,
                            index: d.u32()?,
                            size: d.u32()?,
                        },
                    );
                }
            }
            let rest = d.remaining();
            if rest != 0 {
                return Err(Error::protocol(format!(
                    "node {id}: {rest} bytes left over in its record"
                )));
            }
            match waits {
                IN_NOTHING => {}
                IN_SHADOWS => {
                    ns.shadows.insert((parent, id));
                }
                IN_GRAVEYARD => {
                    ns.graveyard.insert(id);
                }
                v => return Err(Error::protocol(format!("node {id}: bad place {v}"))),
            }
            if id >= next_id {
                return Err(Error::protocol(format!(
                    "node {id} is not below the next node id {next_id}"
                )));
            }
            let node = Node {
                id,
                parent,
                name,
                ty,
                size,
                blocks,
                piece,
                children: Children::default(),
                slots,
                slot: RecordSlot::new(slot),
                linked,
                storage_class,
                location,
                enumerable,
                pinned,
                encrypted,
                mode,
                lease,
                mtime,
            };
            if let Some(l) = lease {
                ns.leases.insert((l.expires_ms, id));
            }
            if ns.nodes.insert(id, Box::new(node)).is_some() {
                return Err(Error::protocol(format!("node {id} appears twice")));
            }
        }
        // Each child map is built in one go from its children sorted by name
        // (inserting them one by one, in hash order, spent most of a
        // restart comparing names).
        let mut by_parent: HashMap<NodeId, Vec<(Arc<str>, NodeId)>> = HashMap::new();
        for n in ns.nodes.values().filter(|n| n.linked && n.id != ROOT) {
            by_parent
                .entry(n.parent)
                .or_default()
                .push((n.name.clone(), n.id));
        }
        for (parent, children) in by_parent {
            let count = children.len();
            let p = ns.nodes.get_mut(&parent).ok_or_else(|| {
                Error::protocol(format!("nodes name parent {parent}, which is missing"))
            })?;
            p.children = children.into_iter().collect();
            if p.children.len() != count {
                return Err(Error::protocol(format!(
                    "two children of node {parent} have the same name"
                )));
            }
        }
        if !ns.nodes.contains_key(&ROOT) {
            return Err(Error::protocol("the root directory is missing"));
        }
        Ok(ns)
    }
}

pub(crate) fn stale(node: u64) -> Error {
    Error::stale(format!(
        "node {node} no longer exists (it was deleted or replaced)"
    ))
}

fn prefix(comps: &[&str], n: usize) -> String {
    format!("/{}", comps[..n].join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the metadata server keeps per node, boxed (a million small
    /// values: a million of these). A data node has no children, no
    /// location and no blocks besides its piece: each of those is one
    /// null pointer. 136 bytes is a 144-byte heap chunk.
    #[test]
    fn a_node_stays_small() {
        assert_eq!(std::mem::size_of::<Children>(), 8);
        assert_eq!(std::mem::size_of::<Location>(), 8);
        assert_eq!(std::mem::size_of::<ThinVec<BlockRef>>(), 8);
        let size = std::mem::size_of::<Node>();
        assert!(size <= 136, "a node takes {size} bytes");
    }

    /// A slot is 8 bytes, and packs and unpacks every state.
    #[test]
    fn slots_pack_into_eight_bytes() {
        assert_eq!(std::mem::size_of::<Packed>(), 8);
        for s in [
            Slot::Free,
            Slot::Clearing,
            Slot::Tail,
            Slot::Live(1),
            Slot::Live(MAX_PACKED_ID - 1),
        ] {
            assert_eq!(Slot::from(Packed::from(s)), s);
        }
    }
}
