//! The hierarchical namespace: nodes, their types and the child rules.
//!
//! Pure data structure, no I/O. Every operation either completes fully or
//! leaves the tree unchanged, and returns the blocks it released so the
//! caller can hand them back to the allocator.

use crate::alloc::BlockRef;
use nodekernel_proto::path;
use nodekernel_proto::{Error, NodeType, Result, NO_CLASS};
use std::collections::{BTreeMap, HashMap};

pub type NodeId = u64;
/// Id of the root directory `/`.
pub const ROOT: NodeId = 1;

/// A write lease: one writer at a time per data node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: u64,
    pub expires_ms: u64,
}

#[derive(Debug, Clone)]
pub struct Node {
    pub id: NodeId,
    pub parent: NodeId,
    pub name: String,
    pub ty: NodeType,
    /// Published size (data nodes).
    pub size: u64,
    /// Blocks of a data node, in stream order.
    pub blocks: Vec<BlockRef>,
    /// Children of a container, by full name (sorted, so enumeration order
    /// is deterministic).
    pub children: BTreeMap<String, NodeId>,
    pub storage_class: u8,
    pub location: String,
    pub enumerable: bool,
    pub lease: Option<Lease>,
}

#[derive(Debug)]
pub struct Namespace {
    nodes: HashMap<NodeId, Node>,
    next_id: NodeId,
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

/// Outcome of a create.
#[derive(Debug)]
pub struct Created {
    pub id: NodeId,
    /// Blocks of a KeyValue that the create replaced.
    pub freed: Vec<BlockRef>,
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
            storage_class: NO_CLASS,
            location: String::new(),
            enumerable: true,
            lease: None,
        };
        Namespace {
            nodes: HashMap::from([(ROOT, root)]),
            next_id: ROOT + 1,
        }
    }

    /// Number of nodes, the root included.
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

    /// Creates a node. A KeyValue on the path of an existing KeyValue
    /// replaces it (last put wins); every other create on an existing path
    /// fails with `AlreadyExists`.
    pub fn create(&mut self, p: &str, ty: NodeType, spec: CreateSpec) -> Result<Created> {
        let (parent, name) = self.parent_for(p, ty)?;
        let mut freed = Vec::new();
        if let Some(&old) = self.nodes[&parent].children.get(&name) {
            let old_ty = self.nodes[&old].ty;
            if ty.replaces_on_create() && old_ty == ty {
                freed = self.detach_subtree(old);
            } else {
                return Err(Error::already_exists(format!(
                    "{p} already exists (a {old_ty})"
                )));
            }
        }
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
                name: name.clone(),
                ty,
                size: 0,
                blocks: Vec::new(),
                children: BTreeMap::new(),
                storage_class,
                location: spec.location,
                enumerable: ty != NodeType::Table || spec.enumerable,
                lease: None,
            },
        );
        self.nodes
            .get_mut(&parent)
            .expect("parent exists")
            .children
            .insert(name, id);
        Ok(Created { id, freed })
    }

    /// Removes a node; containers with children need `recursive`.
    /// Returns every block the removed nodes held.
    pub fn remove(&mut self, p: &str, recursive: bool) -> Result<Vec<BlockRef>> {
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
        Ok(self.detach_subtree(id))
    }

    /// Unlinks `id` from its parent and drops its whole subtree (iteratively,
    /// so depth cannot overflow the stack).
    fn detach_subtree(&mut self, id: NodeId) -> Vec<BlockRef> {
        let (parent, name) = {
            let n = &self.nodes[&id];
            (n.parent, n.name.clone())
        };
        if let Some(pn) = self.nodes.get_mut(&parent) {
            pn.children.remove(&name);
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
    pub fn rename(&mut self, src: &str, dst: &str) -> Result<()> {
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
        let (old_parent, old_name) = {
            let n = &self.nodes[&id];
            (n.parent, n.name.clone())
        };
        self.nodes
            .get_mut(&old_parent)
            .expect("parent exists")
            .children
            .remove(&old_name);
        self.nodes
            .get_mut(&new_parent)
            .expect("checked")
            .children
            .insert(new_name.clone(), id);
        let n = self.nodes.get_mut(&id).expect("exists");
        n.parent = new_parent;
        n.name = new_name;
        Ok(())
    }

    /// Names of the live children of a container (empty for a
    /// non-enumerable Table).
    pub fn children(&self, p: &str) -> Result<Vec<String>> {
        let id = self.resolve(p)?;
        let n = &self.nodes[&id];
        if !n.ty.is_container() {
            return Err(Error::type_mismatch(format!(
                "{p} is a {}, not a container; only Directory, Table and Bag can be enumerated",
                n.ty
            )));
        }
        if !n.enumerable {
            return Ok(Vec::new());
        }
        Ok(n.children.keys().cloned().collect())
    }
}

fn prefix(comps: &[&str], n: usize) -> String {
    format!("/{}", comps[..n].join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodekernel_proto::ErrorCode;
    use NodeType::*;

    fn mk(ns: &mut Namespace, p: &str, ty: NodeType) -> Result<NodeId> {
        ns.create(p, ty, CreateSpec::default()).map(|c| c.id)
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
        for data in [File, KeyValue] {
            let mut ns = Namespace::new();
            if data == File {
                mk(&mut ns, "/d", File).unwrap();
            } else {
                mk(&mut ns, "/t", Table).unwrap();
            }
            let p = if data == File { "/d" } else { "/t/k" };
            if data == KeyValue {
                mk(&mut ns, p, KeyValue).unwrap();
            }
            let e = mk(&mut ns, &format!("{p}/x"), File).unwrap_err();
            assert_eq!(e.code, ErrorCode::TypeMismatch);
        }
    }

    #[test]
    fn create_on_existing_path() {
        let mut ns = Namespace::new();
        mk(&mut ns, "/t", Table).unwrap();
        let k1 = mk(&mut ns, "/t/k", KeyValue).unwrap();
        let k2 = mk(&mut ns, "/t/k", KeyValue).unwrap();
        assert_ne!(k1, k2, "KeyValue replaced by a new node");
        assert!(ns.get(k1).is_none());
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
        ns.create(
            "/t",
            Table,
            CreateSpec {
                enumerable: false,
                ..Default::default()
            },
        )
        .unwrap();
        mk(&mut ns, "/t/k", KeyValue).unwrap();
        assert!(ns.children("/t").unwrap().is_empty());
        assert!(ns.resolve("/t/k").is_ok());
    }
}
