//! The hierarchical namespace: nodes, their types and the child rules.
//!
//! Pure data structure, no I/O. Every operation either completes fully or
//! leaves the tree unchanged, and returns the blocks it released so the
//! caller can hand them back to the allocator.

use crate::alloc::BlockRef;
use nodekernel_proto::path;
use nodekernel_proto::{Error, NodeType, Result, NO_CLASS};
use std::collections::{BTreeMap, BTreeSet, HashMap};

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
}

/// Record slots of a container: the container's data is `len() *
/// RECORD_SIZE` bytes. Free slots are reused lowest first, so the data
/// stays bounded by the peak number of children (plus slots being cleared).
#[derive(Debug, Clone, Default)]
pub struct SlotTable {
    slots: Vec<Slot>,
    free: BTreeSet<u32>,
}

impl SlotTable {
    pub fn len(&self) -> u32 {
        self.slots.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The slot the next `assign` will return.
    pub fn peek(&self) -> u32 {
        self.free
            .first()
            .copied()
            .unwrap_or(self.slots.len() as u32)
    }

    fn assign(&mut self, child: NodeId) -> u32 {
        match self.free.pop_first() {
            Some(s) => {
                self.slots[s as usize] = Slot::Live(child);
                s
            }
            None => {
                self.slots.push(Slot::Live(child));
                self.slots.len() as u32 - 1
            }
        }
    }

    fn set(&mut self, slot: u32, state: Slot) {
        self.slots[slot as usize] = state;
    }

    pub fn get(&self, slot: u32) -> Option<Slot> {
        self.slots.get(slot as usize).copied()
    }

    /// Bit `i` of byte `i / 8` is set when slot `i` is live.
    pub fn live_bitmap(&self) -> Vec<u8> {
        let mut bits = vec![0u8; self.slots.len().div_ceil(8)];
        for (i, s) in self.slots.iter().enumerate() {
            if matches!(s, Slot::Live(_)) {
                bits[i / 8] |= 1 << (i % 8);
            }
        }
        bits
    }

    /// Number of slots in each state: (live, clearing, free).
    pub fn counts(&self) -> (usize, usize, usize) {
        let live = self
            .slots
            .iter()
            .filter(|s| matches!(s, Slot::Live(_)))
            .count();
        (
            live,
            self.slots.len() - live - self.free.len(),
            self.free.len(),
        )
    }
}

#[derive(Debug, Clone)]
pub struct Node {
    pub id: NodeId,
    /// The parent (for a shadow KeyValue: the Table it will be put into).
    pub parent: NodeId,
    pub name: String,
    pub ty: NodeType,
    /// Published size (data nodes).
    pub size: u64,
    /// Blocks of the node's data: bytes of a data node, child records of a
    /// container.
    pub blocks: Vec<BlockRef>,
    /// Children of a container, by full name (the authority on what exists).
    pub children: BTreeMap<String, NodeId>,
    /// Record slots of a container.
    pub slots: SlotTable,
    /// This node's record slot in its parent (None: parent not enumerable,
    /// root, or not linked yet).
    pub slot: Option<u32>,
    /// False for a KeyValue whose put has not closed yet.
    pub linked: bool,
    pub storage_class: u8,
    pub location: String,
    pub enumerable: bool,
    pub lease: Option<Lease>,
}

#[derive(Debug)]
pub struct Namespace {
    nodes: HashMap<NodeId, Node>,
    next_id: NodeId,
    shadows: BTreeSet<NodeId>,
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

/// A record slot in a container: (container id, slot).
pub type SlotRef = (NodeId, u32);

/// Outcome of linking a node into its parent.
#[derive(Debug, Default)]
pub struct Linked {
    /// Record the caller must write (a new slot was assigned).
    pub write: Option<SlotRef>,
    /// Blocks of a KeyValue that was replaced.
    pub freed: Vec<BlockRef>,
}

/// Outcome of a remove.
#[derive(Debug, Default)]
pub struct Removed {
    /// Record the caller must clear, then release.
    pub clear: Option<SlotRef>,
    pub freed: Vec<BlockRef>,
}

/// Outcome of a move.
#[derive(Debug)]
pub struct Moved {
    pub ty: NodeType,
    pub clear: Option<SlotRef>,
    pub write: Option<SlotRef>,
}

impl Namespace {
    pub fn new() -> Self {
        let root = Node {
            id: ROOT,
            parent: ROOT,
            name: String::new(),
            ty: NodeType::Directory,
            size: 0,
            blocks: Vec::new(),
            children: BTreeMap::new(),
            slots: SlotTable::default(),
            slot: None,
            linked: true,
            storage_class: NO_CLASS,
            location: String::new(),
            enumerable: true,
            lease: None,
        };
        Namespace {
            nodes: HashMap::from([(ROOT, root)]),
            next_id: ROOT + 1,
            shadows: BTreeSet::new(),
        }
    }

    /// Number of nodes, the root and unlinked KeyValues included.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn get(&self, id: NodeId) -> Option<&Node> {
        self.nodes.get(&id)
    }

    pub fn get_mut(&mut self, id: NodeId) -> Option<&mut Node> {
        self.nodes.get_mut(&id)
    }

    /// KeyValues whose put has not closed yet.
    pub fn shadows(&self) -> impl Iterator<Item = &Node> {
        self.shadows.iter().filter_map(|id| self.nodes.get(id))
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

    /// Resolves the parent of a non-root path and checks it can hold `ty`.
    fn parent_for(&self, p: &str, ty: NodeType) -> Result<(NodeId, String)> {
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

    /// The container that would receive a new child at `p`, and the slot the
    /// child would get (None when the parent keeps no records or `p` is
    /// not creatable). Lets the caller make room for the record first.
    pub fn next_slot(&self, p: &str) -> Option<SlotRef> {
        let comps = path::components(p).ok()?;
        let (_, parent_comps) = comps.split_last()?;
        let parent = self.walk(p, parent_comps).ok()?;
        self.next_slot_in(parent)
    }

    pub fn next_slot_in(&self, parent: NodeId) -> Option<SlotRef> {
        let n = self.nodes.get(&parent)?;
        (n.ty.is_container() && n.enumerable).then(|| (parent, n.slots.peek()))
    }

    fn new_node(&mut self, parent: NodeId, name: String, ty: NodeType, spec: CreateSpec) -> NodeId {
        let pnode = &self.nodes[&parent];
        let storage_class = if spec.storage_class == NO_CLASS {
            pnode.storage_class
        } else {
            spec.storage_class
        };
        let id = self.next_id;
        self.next_id += 1;
        self.nodes.insert(
            id,
            Node {
                id,
                parent,
                name,
                ty,
                size: 0,
                blocks: Vec::new(),
                children: BTreeMap::new(),
                slots: SlotTable::default(),
                slot: None,
                linked: false,
                storage_class,
                location: spec.location,
                enumerable: ty != NodeType::Table || spec.enumerable,
                lease: None,
            },
        );
        id
    }

    /// Creates a node. Directories, Files, Tables and Bags are linked at
    /// once (an existing path gives `AlreadyExists`). A KeyValue is created
    /// unlinked: it becomes visible, replacing any older value at its path,
    /// only when [`Namespace::link`] is called as its put closes.
    pub fn create(&mut self, p: &str, ty: NodeType, spec: CreateSpec) -> Result<(NodeId, Linked)> {
        let (parent, name) = self.parent_for(p, ty)?;
        if ty.replaces_on_create() {
            let id = self.new_node(parent, name, ty, spec);
            self.shadows.insert(id);
            return Ok((id, Linked::default()));
        }
        if let Some(&old) = self.nodes[&parent].children.get(&name) {
            return Err(Error::already_exists(format!(
                "{p} already exists (a {})",
                self.nodes[&old].ty
            )));
        }
        let id = self.new_node(parent, name, ty, spec);
        let linked = self.link(id)?;
        Ok((id, linked))
    }

    /// Links a node into its parent under its name. An existing KeyValue of
    /// the same name is replaced (it keeps its record slot: same name, same
    /// record); anything else there gives `AlreadyExists`.
    pub fn link(&mut self, id: NodeId) -> Result<Linked> {
        let (parent, name, ty) = {
            let n = self.nodes.get(&id).ok_or_else(|| stale(id))?;
            if n.linked {
                return Ok(Linked::default());
            }
            (n.parent, n.name.clone(), n.ty)
        };
        let Some(pnode) = self.nodes.get(&parent).filter(|p| p.linked) else {
            return Err(Error::not_found(format!(
                "cannot store {name}: its parent was removed"
            )));
        };
        let mut out = Linked::default();
        let mut slot = None;
        if let Some(&old) = pnode.children.get(&name) {
            if !(ty.replaces_on_create() && self.nodes[&old].ty == ty) {
                return Err(Error::already_exists(format!(
                    "{name} already exists (a {})",
                    self.nodes[&old].ty
                )));
            }
            slot = self.nodes[&old].slot;
            self.nodes.get_mut(&old).expect("child exists").slot = None;
            out.freed = self.detach_subtree(old);
        }
        let pnode = self.nodes.get_mut(&parent).expect("checked");
        if slot.is_none() && pnode.enumerable {
            let s = pnode.slots.assign(id);
            slot = Some(s);
            out.write = Some((parent, s));
        } else if let Some(s) = slot {
            pnode.slots.set(s, Slot::Live(id));
        }
        pnode.children.insert(name, id);
        let n = self.nodes.get_mut(&id).expect("exists");
        n.linked = true;
        n.slot = slot;
        self.shadows.remove(&id);
        Ok(out)
    }

    /// Drops a node that was never linked (an abandoned or failed put).
    pub fn drop_unlinked(&mut self, id: NodeId) -> Vec<BlockRef> {
        match self.nodes.get(&id) {
            Some(n) if !n.linked => {
                self.shadows.remove(&id);
                self.nodes.remove(&id).map(|n| n.blocks).unwrap_or_default()
            }
            _ => Vec::new(),
        }
    }

    /// Removes a node; containers with children need `recursive`.
    pub fn remove(&mut self, p: &str, recursive: bool) -> Result<Removed> {
        let id = self.resolve(p)?;
        if id == ROOT {
            return Err(Error::invalid_argument(
                "the root directory / cannot be removed",
            ));
        }
        let node = &self.nodes[&id];
        if !recursive && !node.children.is_empty() {
            return Err(Error::not_empty(format!(
                "{p} has {} children; remove it recursively",
                node.children.len()
            )));
        }
        let clear = node.slot.map(|s| (node.parent, s));
        let freed = self.detach_subtree(id);
        Ok(Removed { clear, freed })
    }

    /// Unlinks `id` from its parent (its record slot, if it still has one,
    /// goes to `Clearing`) and drops its whole subtree, iteratively.
    fn detach_subtree(&mut self, id: NodeId) -> Vec<BlockRef> {
        let (parent, name, slot) = {
            let n = &self.nodes[&id];
            (n.parent, n.name.clone(), n.slot)
        };
        if let Some(pn) = self.nodes.get_mut(&parent) {
            pn.children.remove(&name);
            if let Some(s) = slot {
                pn.slots.set(s, Slot::Clearing);
            }
        }
        let mut freed = Vec::new();
        let mut stack = vec![id];
        while let Some(cur) = stack.pop() {
            if let Some(n) = self.nodes.remove(&cur) {
                freed.extend(n.blocks);
                stack.extend(n.children.into_values());
            }
        }
        freed
    }

    /// Atomically moves `src` to `dst`. `dst` must not exist, its parent must
    /// accept the node's type, and a container cannot move into itself.
    pub fn rename(&mut self, src: &str, dst: &str) -> Result<Moved> {
        let id = self.resolve(src)?;
        if id == ROOT {
            return Err(Error::invalid_argument(
                "the root directory / cannot be moved",
            ));
        }
        let ty = self.nodes[&id].ty;
        let (new_parent, new_name) = self.parent_for(dst, ty)?;
        if self.nodes[&new_parent].children.contains_key(&new_name) {
            return Err(Error::already_exists(format!(
                "cannot move {src} to {dst}: {dst} already exists"
            )));
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
        let (old_parent, old_name, old_slot) = {
            let n = &self.nodes[&id];
            (n.parent, n.name.clone(), n.slot)
        };
        let op = self.nodes.get_mut(&old_parent).expect("parent exists");
        op.children.remove(&old_name);
        if let Some(s) = old_slot {
            op.slots.set(s, Slot::Clearing);
        }
        let np = self.nodes.get_mut(&new_parent).expect("checked");
        let new_slot = np.enumerable.then(|| np.slots.assign(id));
        np.children.insert(new_name.clone(), id);
        let n = self.nodes.get_mut(&id).expect("exists");
        n.parent = new_parent;
        n.name = new_name;
        n.slot = new_slot;
        Ok(Moved {
            ty,
            clear: old_slot.map(|s| (old_parent, s)),
            write: new_slot.map(|s| (new_parent, s)),
        })
    }

    /// A client finished clearing the record in `slot`: it may be reused.
    pub fn release_slot(&mut self, container: NodeId, slot: u32) -> Result<()> {
        let n = self
            .nodes
            .get_mut(&container)
            .ok_or_else(|| stale(container))?;
        match n.slots.get(slot) {
            Some(Slot::Clearing) => {
                n.slots.set(slot, Slot::Free);
                n.slots.free.insert(slot);
                Ok(())
            }
            _ => Err(Error::invalid_argument(format!(
                "slot {slot} of node {container} is not being cleared"
            ))),
        }
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
        Ok(n.children.keys().cloned().collect())
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
    use nodekernel_proto::ErrorCode;
    use NodeType::*;

    /// Creates (and for KeyValues, links) a node.
    fn mk(ns: &mut Namespace, p: &str, ty: NodeType) -> Result<NodeId> {
        let (id, _) = ns.create(p, ty, CreateSpec::default())?;
        ns.link(id)?;
        Ok(id)
    }

    #[test]
    fn node_type_table() {
        for parent in [Directory, Table, Bag] {
            for child in NodeType::ALL {
                let mut ns = Namespace::new();
                mk(&mut ns, "/p", parent).unwrap();
                let r = mk(&mut ns, "/p/c", child);
                if parent.accepts(child) {
                    r.unwrap();
                } else {
                    let e = r.unwrap_err();
                    assert_eq!(e.code, ErrorCode::TypeMismatch, "{parent} <- {child}");
                    assert!(e.message.contains("/p/c"), "{}", e.message);
                }
            }
        }
        let mut ns = Namespace::new();
        mk(&mut ns, "/f", File).unwrap();
        mk(&mut ns, "/t", Table).unwrap();
        mk(&mut ns, "/t/k", KeyValue).unwrap();
        for p in ["/f/x", "/t/k/x"] {
            assert_eq!(
                mk(&mut ns, p, File).unwrap_err().code,
                ErrorCode::TypeMismatch
            );
        }
    }

    #[test]
    fn keyvalue_put_is_invisible_until_linked_then_replaces() {
        let mut ns = Namespace::new();
        mk(&mut ns, "/t", Table).unwrap();
        let (k1, _) = ns.create("/t/k", KeyValue, CreateSpec::default()).unwrap();
        assert_eq!(ns.resolve("/t/k").unwrap_err().code, ErrorCode::NotFound);
        let l1 = ns.link(k1).unwrap();
        assert_eq!(
            l1.write,
            Some((ns.resolve("/t").unwrap(), 0)),
            "new key: record to write"
        );
        let (k2, _) = ns.create("/t/k", KeyValue, CreateSpec::default()).unwrap();
        assert_eq!(
            ns.resolve("/t/k").unwrap(),
            k1,
            "old value visible while the put runs"
        );
        let l2 = ns.link(k2).unwrap();
        assert_eq!(l2.write, None, "replacement keeps the record slot");
        assert_eq!(ns.resolve("/t/k").unwrap(), k2);
        assert!(ns.get(k1).is_none());
        assert_eq!(ns.get(k2).unwrap().slot, Some(0));
        assert_eq!(ns.children("/t").unwrap(), vec!["k"]);
        for (p, ty) in [("/d", Directory), ("/f", File), ("/t", Table), ("/b", Bag)] {
            let _ = mk(&mut ns, p, ty);
            assert_eq!(
                mk(&mut ns, p, ty).unwrap_err().code,
                ErrorCode::AlreadyExists,
                "{p}"
            );
        }
        assert_eq!(
            mk(&mut ns, "/", Directory).unwrap_err().code,
            ErrorCode::AlreadyExists
        );
        // A put whose table disappeared cannot be linked.
        let (k3, _) = ns.create("/t/k3", KeyValue, CreateSpec::default()).unwrap();
        ns.remove("/t", true).unwrap();
        assert_eq!(ns.link(k3).unwrap_err().code, ErrorCode::NotFound);
        ns.drop_unlinked(k3);
        assert_eq!(ns.shadows().count(), 0);
    }

    #[test]
    fn slots_are_cleared_before_reuse() {
        let mut ns = Namespace::new();
        mk(&mut ns, "/d", Directory).unwrap();
        let d = ns.resolve("/d").unwrap();
        for i in 0..4 {
            mk(&mut ns, &format!("/d/f{i}"), File).unwrap();
        }
        assert_eq!(ns.get(d).unwrap().slots.len(), 4);
        let r = ns.remove("/d/f1", false).unwrap();
        assert_eq!(r.clear, Some((d, 1)));
        assert_eq!(
            ns.next_slot("/d/new"),
            Some((d, 4)),
            "slot 1 is not reusable before release"
        );
        mk(&mut ns, "/d/f4", File).unwrap();
        ns.release_slot(d, 1).unwrap();
        assert_eq!(
            ns.release_slot(d, 1).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        assert_eq!(
            ns.next_slot("/d/new"),
            Some((d, 1)),
            "lowest free slot first"
        );
        mk(&mut ns, "/d/f5", File).unwrap();
        assert_eq!(ns.get(d).unwrap().slots.len(), 5);
        assert_eq!(ns.get(d).unwrap().slots.live_bitmap(), vec![0b11111]);
        // Moves clear the old record and write a new one.
        mk(&mut ns, "/e", Directory).unwrap();
        let e = ns.resolve("/e").unwrap();
        let m = ns.rename("/d/f0", "/e/g").unwrap();
        assert_eq!((m.clear, m.write), (Some((d, 0)), Some((e, 0))));
        assert_eq!(ns.get(d).unwrap().slots.counts(), (4, 1, 0));
    }

    #[test]
    fn lookup_remove_move() {
        let mut ns = Namespace::new();
        assert_eq!(ns.resolve("/nope").unwrap_err().code, ErrorCode::NotFound);
        let e = mk(&mut ns, "/a/b", File).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert!(e.message.contains("parent /a"), "{}", e.message);
        mk(&mut ns, "/a", Directory).unwrap();
        mk(&mut ns, "/a/b", Directory).unwrap();
        let f = mk(&mut ns, "/a/b/f", File).unwrap();
        assert_eq!(
            ns.remove("/a", false).unwrap_err().code,
            ErrorCode::NotEmpty
        );
        ns.rename("/a/b", "/c").unwrap();
        assert_eq!(ns.resolve("/c/f").unwrap(), f);
        assert_eq!(ns.resolve("/a/b").unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(
            ns.rename("/c", "/c/f2").unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        assert_eq!(
            ns.rename("/c", "/a").unwrap_err().code,
            ErrorCode::AlreadyExists
        );
        ns.remove("/c", true).unwrap();
        assert_eq!(ns.len(), 2);
        assert!(ns.get(f).is_none());
        assert_eq!(
            ns.remove("/", true).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn class_is_inherited_and_non_enumerable_tables_list_nothing() {
        let mut ns = Namespace::new();
        ns.create(
            "/d",
            Directory,
            CreateSpec {
                storage_class: 1,
                ..Default::default()
            },
        )
        .unwrap();
        let f = mk(&mut ns, "/d/f", File).unwrap();
        assert_eq!(ns.get(f).unwrap().storage_class, 1);
        let (t, _) = ns
            .create(
                "/t",
                Table,
                CreateSpec {
                    enumerable: false,
                    ..Default::default()
                },
            )
            .unwrap();
        let k = mk(&mut ns, "/t/k", KeyValue).unwrap();
        assert!(ns.children("/t").unwrap().is_empty());
        assert!(ns.resolve("/t/k").is_ok());
        assert_eq!(
            ns.get(k).unwrap().slot,
            None,
            "no record in a non-enumerable table"
        );
        assert!(ns.get(t).unwrap().slots.is_empty());
        assert_eq!(ns.next_slot("/t/x"), None);
    }
}
