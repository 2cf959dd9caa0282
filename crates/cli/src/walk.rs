//! Walking a subtree of the namespace: `ls -R`, `find`, `du` and the
//! recursive copies. Memory stays bounded by the path being walked and the
//! children of the containers on it, not by the size of the tree.

use futures::stream::{self, StreamExt};
use nodekernel_client::{Client, ErrorCode, NodeInfo, NodeType};

/// Lookups in flight while a container's children are looked up.
const LOOKUPS_IN_FLIGHT: usize = 32;

/// A node met on a walk.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its whole path.
    pub path: String,
    /// Its path below the walk's root (`""` for the root itself).
    pub rel: String,
    /// 0 for the root, 1 for its children, ...
    pub depth: usize,
    pub ty: NodeType,
    /// Its attributes, when the walk asked for them.
    pub info: Option<NodeInfo>,
}

/// What a walk looks at.
#[derive(Debug, Clone, Copy)]
pub struct WalkOpts {
    /// Look every node up for its attributes (size, mode, time); without
    /// it only names and types are read, from the containers' records.
    pub info: bool,
    /// Go at most this many levels below the root.
    pub max_depth: Option<usize>,
}

/// Calls `visit` for `root` and every node below it, in pre-order (a
/// container before its children, children by name). A node removed while
/// the walk runs is skipped; a non-enumerable Table shows no children.
pub async fn walk(
    client: &Client,
    root: &str,
    opts: WalkOpts,
    mut visit: impl FnMut(Entry) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let node = client.lookup(root).await?;
    let first = Entry {
        path: root.to_string(),
        rel: String::new(),
        depth: 0,
        ty: node.info().ty,
        info: opts.info.then(|| node.info().clone()),
    };
    // Containers whose children are still to be visited, deepest last;
    // each with its children left to visit, in reverse order.
    let mut stack: Vec<Vec<Entry>> = Vec::new();
    let mut next = Some(first);
    loop {
        let Some(e) = next.take().or_else(|| pop(&mut stack)) else {
            return Ok(());
        };
        let descend = e.ty.is_container() && opts.max_depth.is_none_or(|m| e.depth < m);
        let (path, rel, depth) = (e.path.clone(), e.rel.clone(), e.depth);
        visit(e)?;
        if descend {
            let mut kids = children(client, &path, &rel, depth + 1, opts.info).await?;
            kids.reverse();
            stack.push(kids);
        }
    }
}

/// The next entry to visit: the last child left of the deepest container
/// that has one.
fn pop(stack: &mut Vec<Vec<Entry>>) -> Option<Entry> {
    while let Some(top) = stack.last_mut() {
        if let Some(e) = top.pop() {
            return Some(e);
        }
        stack.pop();
    }
    None
}

/// The children of the container at `path` (whose path below a walk's
/// root is `rel`, at `depth - 1`), sorted by name; with `info`, each looked
/// up (those removed meanwhile left out).
pub async fn children(
    client: &Client,
    path: &str,
    rel: &str,
    depth: usize,
    info: bool,
) -> anyhow::Result<Vec<Entry>> {
    let mut names = match client.enumerate_typed(path).await {
        Ok(n) => n,
        // Removed meanwhile: nothing below it.
        Err(e) if e.code == ErrorCode::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e.into()),
    };
    names.sort_by(|a, b| a.0.cmp(&b.0));
    let entry = |name: String, ty: NodeType, info: Option<NodeInfo>| Entry {
        path: nodekernel_proto::path::join(path, &name),
        rel: if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        },
        depth,
        ty,
        info,
    };
    if !info {
        return Ok(names
            .into_iter()
            .map(|(n, ty)| entry(n, ty, None))
            .collect());
    }
    let looked: Vec<Option<Entry>> = stream::iter(names)
        .map(|(name, _)| {
            let child = nodekernel_proto::path::join(path, &name);
            async move {
                match client.lookup(&child).await {
                    Ok(n) => Ok(Some(entry(name, n.info().ty, Some(n.info().clone())))),
                    // Removed between the listing and the lookup.
                    Err(e) if e.code == ErrorCode::NotFound => Ok(None),
                    Err(e) => Err(e),
                }
            }
        })
        .buffered(LOOKUPS_IN_FLIGHT)
        .collect::<Vec<nodekernel_client::Result<Option<Entry>>>>()
        .await
        .into_iter()
        .collect::<Result<_, _>>()?;
    Ok(looked.into_iter().flatten().collect())
}
