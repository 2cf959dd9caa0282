//! Quotas and disk usage (`docs/lifecycle.md`, *Quotas* and *Disk
//! usage*): the requests (`QuotaSet`, `Usage`, `Quotas`), the accounting
//! that keeps every container's usage as effects apply, and the check that
//! refuses a client's decision that would take a quota root past its
//! limits.
//!
//! **What counts.** A node counts in the usage of every container above
//! it while it is *attached*: linked, or a put in progress into a Table
//! (it holds its node and its storage from its create, so a writer can
//! never overshoot). A reserved put (`Reserve`: created under the root
//! with no name) counts nowhere until its `Link` aims it at its key; a
//! removed subtree stops counting at its unlink (its root is detached, so
//! its whole aggregate leaves its ancestors at once). A container's usage
//! is everything below it, not itself: nodes, logical bytes (published
//! sizes) and, per storage class, the whole blocks and piece bytes its
//! data nodes hold (containers' child records are not counted: the node
//! quota bounds them). A byte quota limits storage held: blocks (of the
//! block size) and pieces.
//!
//! **Cost.** An update walks the attached ancestors of the node it
//! changes: O(depth), bounded by `MAX_DEPTH`. A link, unlink or move adds
//! or takes away the node's whole contribution (a container's is its usage
//! entry, O(1); a data node's is counted from its blocks). The usage is
//! derived from the namespace, recounted in one pass (each node adds itself
//! to its ancestors) when a checkpoint is loaded and when a storage server
//! retires (its blocks move to `RETIRED_CLASS`); only limits are durable
//! (`Effect::QuotaSet`, the checkpoint).

use super::{Draft, MetaState, Reply};
use crate::effect::Effect;
use crate::namespace::{Node, NodeId, ROOT};
use crate::usage::Usage;
use nodekernel_proto::path::MAX_DEPTH;
use nodekernel_proto::quota::{exceeded, Quota, UsageInfo, MAX_QUOTAS, NO_LIMIT, RETIRED_CLASS};
use nodekernel_proto::size::format_bytes;
use nodekernel_proto::{Error, Result};
use std::collections::HashMap;

/// Most containers an upward walk passes (a path has at most `MAX_DEPTH`
/// components; a removed subtree's nodes are as deep).
const WALK_MAX: usize = MAX_DEPTH + 2;

impl Draft<'_> {
    /// Sets (or with `Quota::NONE` clears) the quota of the container at
    /// `path`.
    pub(super) fn quota_set(&mut self, path: &str, quota: Quota) -> Result<Reply> {
        self.st.check_partition(path)?;
        let id = self.ns().container(path).map_err(|e| match e.code {
            nodekernel_proto::ErrorCode::TypeMismatch => Error::type_mismatch(format!(
                "{path} is not a container: only a Directory, Table or Bag carries a quota"
            )),
            _ => e,
        })?;
        if self.st.acct.quota(id).is_none()
            && !quota.is_none()
            && self.st.acct.quota_count() >= MAX_QUOTAS
        {
            return Err(Error::invalid_argument(format!(
                "this metadata partition keeps at most {MAX_QUOTAS} quotas; clear one first"
            )));
        }
        self.push(Effect::QuotaSet {
            node: id,
            bytes: quota.bytes,
            nodes: quota.nodes,
        });
        Ok(Reply::Usage(id))
    }

    /// The usage of the subtree at `path`.
    pub(super) fn usage(&self, path: &str) -> Result<Reply> {
        self.st.check_partition(path)?;
        Ok(Reply::Usage(self.ns().resolve(path)?))
    }
}

impl MetaState {
    // ----- queries -----------------------------------------------------------

    /// The path of node `id` (its name under its parents, up to the root);
    /// a node of a removed subtree gets the path it had inside it.
    pub fn path_of(&self, id: NodeId) -> String {
        let mut names = Vec::new();
        let mut at = id;
        while at != ROOT && names.len() < WALK_MAX {
            let Some(n) = self.ns.get(at) else { break };
            names.push(n.name.clone());
            at = n.parent;
        }
        if names.is_empty() {
            return "/".into();
        }
        names.reverse();
        names.iter().fold(String::new(), |mut s, n| {
            s.push('/');
            s.push_str(n);
            s
        })
    }

    /// What the subtree at node `id` holds (a data node: itself).
    pub fn usage_of(&self, id: NodeId) -> Usage {
        match self.ns.get(id) {
            Some(n) if n.ty.is_container() => self.acct.usage(id).clone(),
            Some(n) => self.own_usage(n),
            None => Usage::default(),
        }
    }

    /// [`MetaState::usage_of`] as the wire carries it, under `path`.
    pub(super) fn usage_info(&self, id: NodeId, path: String) -> UsageInfo {
        let u = self.usage_of(id);
        UsageInfo {
            path,
            ty: self
                .ns
                .get(id)
                .map_or(nodekernel_proto::NodeType::Directory, |n| n.ty),
            nodes: u.nodes,
            bytes: u.bytes,
            held: u.held(u64::from(self.alloc.block_size())),
            classes: u.classes,
            quota: self.acct.quota(id),
        }
    }

    /// Whether node `id` is reachable from the root (not in a removed
    /// subtree, not a put in progress).
    pub fn reachable(&self, id: NodeId) -> bool {
        let mut at = id;
        for _ in 0..WALK_MAX {
            if at == ROOT {
                return true;
            }
            match self.ns.get(at) {
                Some(n) if n.linked => at = n.parent,
                _ => return false,
            }
        }
        false
    }

    /// Every quota root with its usage, in path order (a removed one,
    /// waiting to be reaped, no longer).
    /// What the subtree at path `p` holds, if `p` exists (a tenant's root,
    /// for the admin endpoint's metrics).
    pub fn usage_at(&self, p: &str) -> Option<UsageInfo> {
        let id = self.ns.resolve(p).ok()?;
        Some(self.usage_info(id, p.to_string()))
    }

    pub fn quota_infos(&self) -> Vec<UsageInfo> {
        let mut all: Vec<UsageInfo> = self
            .acct
            .quotas()
            .filter(|(id, _)| self.reachable(*id))
            .map(|(id, _)| self.usage_info(id, self.path_of(id)))
            .collect();
        all.sort_by(|a, b| a.path.cmp(&b.path));
        all
    }

    /// Whether node `n` counts in its ancestors' usage: linked, or a put
    /// in progress into a Table (not a reserved put, which has no name).
    pub(super) fn attached(&self, n: &Node) -> bool {
        n.id != ROOT && (n.linked || (!n.name.is_empty() && self.ns.is_unclosed(n.id)))
    }

    /// The class usage counts a block of `server` in.
    fn class_of(&self, server: u32) -> u8 {
        self.alloc.server_class(server).unwrap_or(RETIRED_CLASS)
    }

    /// What node `n` holds itself: one node and, for a data node, its
    /// size, blocks and piece.
    fn own_usage(&self, n: &Node) -> Usage {
        let mut u = Usage::node();
        if n.ty.is_container() {
            return u;
        }
        u.bytes = n.size;
        let mut run: Option<(u8, u64)> = None;
        for b in &n.blocks {
            let c = self.class_of(b.server);
            match &mut run {
                Some((rc, k)) if *rc == c => *k += 1,
                _ => {
                    if let Some((rc, k)) = run {
                        u.add_class(rc, k, 0);
                    }
                    run = Some((c, 1));
                }
            }
        }
        if let Some((rc, k)) = run {
            u.add_class(rc, k, 0);
        }
        if let Some(p) = n.piece {
            u.add_class(self.class_of(p.server), 0, u64::from(p.size));
        }
        u
    }

    /// What node `id` adds to each container above it: itself and, for a
    /// container, its usage.
    fn contribution(&self, id: NodeId) -> Usage {
        let Some(n) = self.ns.get(id) else {
            return Usage::default();
        };
        let mut u = self.own_usage(n);
        if n.ty.is_container() {
            u.apply(self.acct.usage(id), true);
        }
        u
    }

    /// Adds `d` to (or takes it from) every container above `id`, as far
    /// as the chain of attached nodes goes.
    fn charge_above(&mut self, id: NodeId, d: &Usage, plus: bool) {
        if d.is_empty() {
            return;
        }
        let mut at = id;
        for _ in 0..WALK_MAX {
            let Some(n) = self.ns.get(at) else { return };
            if !self.attached(n) {
                return;
            }
            let p = n.parent;
            self.acct.add(p, d, plus);
            at = p;
        }
    }

    // ----- the accounting, called by `apply_effect` --------------------------

    /// Takes node `id`'s contribution away from its ancestors if it
    /// counts (before an effect that moves, links or drops it).
    pub(super) fn uncount(&mut self, id: NodeId) {
        if self.ns.get(id).is_some_and(|n| self.attached(n)) {
            let c = self.contribution(id);
            self.charge_above(id, &c, false);
        }
    }

    /// Adds node `id`'s contribution to its ancestors if it counts (after
    /// such an effect).
    pub(super) fn count(&mut self, id: NodeId) {
        if self.ns.get(id).is_some_and(|n| self.attached(n)) {
            let c = self.contribution(id);
            self.charge_above(id, &c, true);
        }
    }

    /// A change `d` of data node `id`'s own usage (size, blocks, piece).
    pub(super) fn charge_data(&mut self, id: NodeId, d: &Usage, plus: bool) {
        if self.ns.get(id).is_some_and(|n| !n.ty.is_container()) {
            self.charge_above(id, d, plus);
        }
    }

    /// Data node `id`'s published size becomes `size`.
    pub(super) fn charge_size(&mut self, id: NodeId, size: u64) {
        let Some(old) = self
            .ns
            .get(id)
            .filter(|n| !n.ty.is_container())
            .map(|n| n.size)
        else {
            return;
        };
        let d = Usage {
            bytes: old.abs_diff(size),
            ..Usage::default()
        };
        self.charge_above(id, &d, size > old);
    }

    /// One block of `server` joins (`plus`) or leaves data node `id`.
    pub(super) fn charge_block(&mut self, id: NodeId, server: u32, plus: bool) {
        let d = Usage::in_class(self.class_of(server), 1, 0);
        self.charge_data(id, &d, plus);
    }

    /// Data node `id` gives up its blocks from `len` on.
    pub(super) fn charge_truncate(&mut self, id: NodeId, len: u64) {
        let Some(n) = self.ns.get(id) else { return };
        let mut d = Usage::default();
        for b in n.blocks.iter().skip(len as usize) {
            d.add_class(self.class_of(b.server), 1, 0);
        }
        self.charge_data(id, &d, false);
    }

    /// A piece of `piece_bytes` on `server` joins (`plus`) or leaves data
    /// node `id`.
    pub(super) fn charge_piece(&mut self, id: NodeId, server: u32, piece_bytes: u32, plus: bool) {
        let d = Usage::in_class(self.class_of(server), 0, u64::from(piece_bytes));
        self.charge_data(id, &d, plus);
    }

    /// Every container's usage as a count from the namespace finds it:
    /// one pass over the nodes, each adding what it holds itself to its
    /// attached ancestors.
    pub(super) fn recount(&self) -> HashMap<NodeId, Usage> {
        let mut out: HashMap<NodeId, Usage> = HashMap::new();
        for n in self.ns.nodes().filter(|n| self.attached(n)) {
            let u = self.own_usage(n);
            let mut at = n;
            for _ in 0..WALK_MAX {
                out.entry(at.parent).or_default().apply(&u, true);
                match self.ns.get(at.parent) {
                    Some(p) if self.attached(p) => at = p,
                    _ => break,
                }
            }
        }
        out.retain(|_, u| !u.is_empty());
        out
    }

    /// Recounts every container's usage (a checkpoint loaded, a storage
    /// server retired).
    pub(crate) fn recount_usage(&mut self) {
        let usage = self.recount();
        self.acct.set_usage(usage);
    }

    // ----- the check of a client's decision ----------------------------------

    /// Refuses `effects` (a client request's, not applied yet) with
    /// `QuotaExceeded` if they would take a quota root past a limit: its
    /// nodes or held bytes would grow to above it. Decisions that shrink
    /// a subtree, or leave it as it is, always pass (so a quota set below
    /// what a subtree holds refuses only growth). Returns the change of
    /// each quota root's (nodes, held bytes), for the debug check after
    /// commit. Costs nothing without quotas, and O(effects × depth) with.
    pub(super) fn check_quotas(&self, effects: &[Effect]) -> Result<Vec<(NodeId, i128, i128)>> {
        if !self.acct.has_quotas() {
            return Ok(Vec::new());
        }
        let mut ov = Overlay::new(self);
        for e in effects {
            ov.effect(e);
        }
        let bs = u64::from(self.alloc.block_size());
        let mut out = Vec::new();
        for (root, q) in self.acct.quotas() {
            let Some(&(dn, dh)) = ov.delta.get(&root) else {
                continue;
            };
            out.push((root, dn, dh));
            let u = self.acct.usage(root);
            let (nodes, held) = (i128::from(u.nodes) + dn, i128::from(u.held(bs)) + dh);
            if dn > 0 && q.nodes != NO_LIMIT && nodes > i128::from(q.nodes) {
                return Err(exceeded(
                    &self.path_of(root),
                    &format!(
                        "{} nodes would be exceeded ({} nodes below it, {dn} more asked)",
                        q.nodes, u.nodes
                    ),
                ));
            }
            if dh > 0 && q.bytes != NO_LIMIT && held > i128::from(q.bytes) {
                return Err(exceeded(
                    &self.path_of(root),
                    &format!(
                        "{} would be exceeded ({} held below it, {} more asked)",
                        format_bytes(q.bytes),
                        format_bytes(u.held(bs)),
                        format_bytes(dh as u64)
                    ),
                ));
            }
        }
        Ok(out)
    }

    /// Every quota root's (nodes, held bytes) now (the debug check after
    /// commit compares them with what [`MetaState::check_quotas`] said).
    #[cfg(debug_assertions)]
    pub(super) fn quota_roots_usage(&self) -> Vec<(NodeId, u64, u64)> {
        let bs = u64::from(self.alloc.block_size());
        self.acct
            .quotas()
            .map(|(id, _)| {
                let u = self.acct.usage(id);
                (id, u.nodes, u.held(bs))
            })
            .collect()
    }
}

/// A node as a decision's effects left it, so far.
#[derive(Debug, Clone, Copy)]
struct Place {
    parent: NodeId,
    attached: bool,
    container: bool,
    /// Created by these effects (it held nothing before them).
    new: bool,
    /// Blocks and piece bytes it holds (a data node).
    blocks: u64,
    piece: u64,
}

/// The effects of a decision replayed on the nodes they name, counting
/// only what quotas limit: nodes and held bytes.
struct Overlay<'a> {
    st: &'a MetaState,
    bs: i128,
    places: HashMap<NodeId, Place>,
    /// The change of each container's usage (a data node: of what it holds
    /// itself), as (nodes, held bytes).
    delta: HashMap<NodeId, (i128, i128)>,
}

impl<'a> Overlay<'a> {
    fn new(st: &'a MetaState) -> Overlay<'a> {
        Overlay {
            st,
            bs: i128::from(st.alloc.block_size()),
            places: HashMap::new(),
            delta: HashMap::new(),
        }
    }

    fn place(&self, id: NodeId) -> Option<Place> {
        if let Some(p) = self.places.get(&id) {
            return Some(*p);
        }
        let n = self.st.ns.get(id)?;
        Some(Place {
            parent: n.parent,
            attached: self.st.attached(n),
            container: n.ty.is_container(),
            new: false,
            blocks: n.blocks.len() as u64,
            piece: n.piece.map_or(0, |p| u64::from(p.size)),
        })
    }

    fn set(&mut self, id: NodeId, f: impl FnOnce(&mut Place)) {
        if let Some(mut p) = self.place(id) {
            f(&mut p);
            self.places.insert(id, p);
        }
    }

    /// (nodes, held) node `id` adds to its ancestors now.
    fn contribution(&self, id: NodeId) -> (i128, i128) {
        let Some(p) = self.place(id) else {
            return (0, 0);
        };
        let (dn, dh) = self.delta.get(&id).copied().unwrap_or((0, 0));
        let base = if p.new {
            (1, 0)
        } else if p.container {
            let u = self.st.acct.usage(id);
            (1 + i128::from(u.nodes), i128::from(u.held(self.bs as u64)))
        } else {
            let n = self.st.ns.get(id);
            let held = n.map_or(0, |n| {
                n.blocks.len() as i128 * self.bs + n.piece.map_or(0, |p| i128::from(p.size))
            });
            (1, held)
        };
        (base.0 + dn, base.1 + dh)
    }

    fn bump_above(&mut self, id: NodeId, (dn, dh): (i128, i128)) {
        let mut at = id;
        for _ in 0..WALK_MAX {
            let Some(p) = self.place(at) else { return };
            if !p.attached {
                return;
            }
            let d = self.delta.entry(p.parent).or_default();
            d.0 += dn;
            d.1 += dh;
            at = p.parent;
        }
    }

    /// A change of data node `id`'s held bytes.
    fn held(&mut self, id: NodeId, dh: i128) {
        if self.place(id).is_some_and(|p| !p.container) {
            self.delta.entry(id).or_default().1 += dh;
            self.bump_above(id, (0, dh));
        }
    }

    fn detach(&mut self, id: NodeId) {
        if self.place(id).is_some_and(|p| p.attached) {
            let (n, h) = self.contribution(id);
            self.bump_above(id, (-n, -h));
            self.set(id, |p| p.attached = false);
        }
    }

    fn effect(&mut self, e: &Effect) {
        match e {
            Effect::NodeCreated(n) => {
                let attached = n.ty.replaces_on_create() && !n.name.is_empty();
                self.places.insert(
                    n.id,
                    Place {
                        parent: n.parent,
                        attached,
                        container: n.ty.is_container(),
                        new: true,
                        blocks: 0,
                        piece: 0,
                    },
                );
                if attached {
                    self.bump_above(n.id, (1, 0));
                }
            }
            Effect::Linked { id, .. } => {
                if self.place(*id).is_some_and(|p| !p.attached) {
                    self.set(*id, |p| p.attached = true);
                    let c = self.contribution(*id);
                    self.bump_above(*id, c);
                }
            }
            Effect::Aimed { node, parent, .. } => {
                self.detach(*node);
                self.set(*node, |p| {
                    p.parent = *parent;
                    p.attached = true;
                });
                let c = self.contribution(*node);
                self.bump_above(*node, c);
            }
            Effect::Replaced { old, .. } => self.detach(*old),
            Effect::Unlinked { id } => self.detach(*id),
            Effect::Dropped { ids } => {
                for id in ids {
                    self.detach(*id);
                }
            }
            Effect::Moved { id, parent, .. } => {
                if self.place(*id).is_some_and(|p| p.attached) {
                    let (n, h) = self.contribution(*id);
                    self.bump_above(*id, (-n, -h));
                    self.set(*id, |p| p.parent = *parent);
                    self.bump_above(*id, (n, h));
                }
            }
            Effect::BlockAdded { node, .. } => {
                self.set(*node, |p| p.blocks += 1);
                self.held(*node, self.bs);
            }
            Effect::BlocksTruncated { node, len } => {
                let had = self.place(*node).map_or(0, |p| p.blocks);
                let gone = had.saturating_sub(*len);
                self.set(*node, |p| p.blocks = p.blocks.min(*len));
                self.held(*node, -(i128::from(gone)) * self.bs);
            }
            Effect::PieceTaken { node, piece } => {
                if let Some(had) = self.place(*node).filter(|p| !p.container).map(|p| p.piece) {
                    self.set(*node, |p| p.piece = u64::from(piece.size));
                    self.held(*node, i128::from(piece.size) - i128::from(had));
                }
            }
            Effect::PieceOutgrown { node } => {
                let had = self.place(*node).map_or(0, |p| p.piece);
                self.set(*node, |p| p.piece = 0);
                self.held(*node, -i128::from(had));
            }
            // Nothing else changes what a node holds or where it counts:
            // a swapped or moved block replaces one, frees and stamps act
            // on blocks no node holds any more (or on generations).
            Effect::SlotReleased { .. }
            | Effect::BlockSwapped { .. }
            | Effect::BlockFreed { .. }
            | Effect::BlockStamped { .. }
            | Effect::SizeSet { .. }
            | Effect::LeaseSet { .. }
            | Effect::LeaseCleared { .. }
            | Effect::ServerAdded { .. }
            | Effect::ServerRetired { .. }
            | Effect::ServerReaddressed { .. }
            | Effect::MoveStarted { .. }
            | Effect::MoveEnded { .. }
            | Effect::SlabCreated { .. }
            | Effect::RecordPieceSwapped { .. }
            | Effect::PieceFreed { .. }
            | Effect::SlabStamped { .. }
            | Effect::SlabReleased { .. }
            | Effect::BlockHeld { .. }
            | Effect::PieceHeld { .. }
            | Effect::Ballooned { .. }
            | Effect::CountersRaised { .. }
            | Effect::AttrsSet { .. }
            | Effect::LifetimeSet { .. }
            | Effect::SessionOpened { .. }
            | Effect::SessionEnded { .. }
            | Effect::SessionBound { .. }
            | Effect::QuotaSet { .. } => {}
        }
    }
}

impl MetaState {
    /// Checks that the incremental usage equals a recount, and that every
    /// quota root is an existing container (the invariant checker's).
    pub(super) fn check_usage(&self) -> std::result::Result<(), String> {
        let recount = self.recount();
        if recount.len() != self.acct.entry_count() {
            return Err(format!(
                "usage kept for {} containers, a recount finds {}",
                self.acct.entry_count(),
                recount.len()
            ));
        }
        for (id, u) in self.acct.entries() {
            if recount.get(&id) != Some(u) {
                return Err(format!(
                    "usage of node {id} ({}) is {u:?}, a recount finds {:?}",
                    self.path_of(id),
                    recount.get(&id)
                ));
            }
        }
        for (id, _) in self.acct.quotas() {
            match self.ns.get(id) {
                Some(n) if n.ty.is_container() => {}
                Some(n) => return Err(format!("a {} ({id}) has a quota", n.ty)),
                None => return Err(format!("node {id} has a quota but does not exist")),
            }
        }
        Ok(())
    }
}
