//! What a tenant's connection sees (`docs/security.md`, *Tenants*): the
//! namespace from its root down, as `/`, within its rights.
//!
//! A request of a tenant is checked and rewritten before the state machine
//! decides it ([`admit`]), and its reply and error after ([`own_reply`],
//! [`own_error`]), all under the state's lock, so what was checked is what
//! is decided. No path outside the root can be named (every path is
//! mapped into it, and a path has no `..`); a node id outside it (a guess,
//! or another tenant's) is answered as a node that does not exist, with the
//! same error, so nothing tells the two apart. Requests for members only
//! (registrations, drains, policy, resizes) never get here: the handler
//! does not open them to tenants ([`tenant_may`]).
//!
//! Plain functions of the state: no I/O, no clock. Cost per request: one
//! walk of the root's path, and for a request naming a node one walk of
//! that node's parents (at most the path depth limit).

use crate::namespace::{stale, NodeId, ROOT};
use crate::state::{snapshot_gone, MetaState};
use nodekernel_proto::meta::{op, MetaReply, MetaRequest};
use nodekernel_proto::quota::{exceeded, exceeded_root};
use nodekernel_proto::tenant::Tenant;
use nodekernel_proto::{Error, ErrorCode, Result};
use std::borrow::Cow;

/// Whether a tenant's connection may make request `op` at all; the rest
/// ([`admit`]) is decided per request.
pub(crate) fn tenant_may(o: u16) -> bool {
    op::ALL.contains(&o)
        && !matches!(
            o,
            op::REGISTER | op::HEARTBEAT | op::DRAIN | op::POLICY | op::RESIZE
        )
}

/// A tenant's request, checked and mapped into its root.
pub(crate) struct Admitted<'r> {
    /// What the state machine decides.
    pub req: Cow<'r, MetaRequest>,
    /// Leases of a `Renew` that name nodes outside the root: reported lost,
    /// as leases of nodes that do not exist are.
    lost: Vec<u64>,
    /// Nodes below the root, for a `Status`.
    nodes: u64,
}

/// The right a request needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Needs {
    Read,
    Write,
    Admin,
}

fn needs(req: &MetaRequest) -> Needs {
    use MetaRequest as R;
    match req {
        R::Lookup { .. }
        | R::Enumerate { .. }
        | R::Map { alloc: false, .. }
        | R::RecordNames { .. }
        | R::SnapshotBegin { .. }
        | R::SnapshotList { .. }
        | R::SnapshotLocate { .. }
        | R::SnapshotEnd { .. }
        | R::Usage { .. }
        | R::Quotas
        | R::Status
        | R::LocalSocket => Needs::Read,
        R::QuotaSet { .. } => Needs::Admin,
        _ => Needs::Write,
    }
}

fn refused(t: &Tenant, what: &str) -> Error {
    Error::unauthenticated(format!(
        "tenant {} may not {what}: its rights are {} (`docs/security.md`, Tenants)",
        t.name,
        t.rights.names().join(", ")
    ))
}

/// Whether node `id` lies in the subtree at `root` (is it, or below it).
fn within(st: &MetaState, id: NodeId, root: NodeId) -> bool {
    let ns = st.ns();
    let mut at = id;
    for _ in 0..=nodekernel_proto::path::MAX_DEPTH + 1 {
        if at == root {
            return true;
        }
        match ns.get(at) {
            Some(n) if at != ROOT => at = n.parent,
            _ => return false,
        }
    }
    false
}

/// Checks tenant `t`'s request `req` against its rights and maps it into
/// its root; a node outside the root is answered as one that does not
/// exist ([`stale`], as the state machine answers an unknown id).
pub(crate) fn admit<'r>(t: &Tenant, req: &'r MetaRequest, st: &MetaState) -> Result<Admitted<'r>> {
    use MetaRequest as R;
    let r = t.rights;
    match needs(req) {
        Needs::Read if !r.read => return Err(refused(t, "read")),
        Needs::Write if !r.write => return Err(refused(t, "write")),
        Needs::Admin if !r.admin => return Err(refused(t, "set quotas")),
        _ => {}
    }
    let pl = st.placement();
    let owner = nodekernel_proto::path::partition_of(&t.root, pl.partitions as usize) as u32;
    if owner != pl.partition {
        // A tenant's tree lies in the partition of its root's top-level
        // name: its clients talk to that one only, as to a cluster of one.
        return Err(Error::wrong_partition(format!(
            "tenant {}'s data is kept by metadata partition {owner} of {}, not this one \
             ({}): give the tenant's clients that partition's metadata server only",
            t.name, pl.partitions, pl.partition
        )));
    }
    let root = st.ns().resolve(&t.root).map_err(|_| {
        Error::not_found(format!(
            "tenant {}'s root does not exist (it was removed): ask the cluster's admin",
            t.name
        ))
    })?;
    let node = |id: u64| {
        if within(st, id, root) {
            Ok(())
        } else {
            Err(stale(id))
        }
    };
    let as_is = |nodes| {
        Ok(Admitted {
            req: Cow::Borrowed(req),
            lost: Vec::new(),
            nodes,
        })
    };
    match req {
        R::Map { node: n, .. }
        | R::Outgrow { node: n, .. }
        | R::Sync { node: n, .. }
        | R::Abort { node: n, .. }
        | R::ReplaceBlock { node: n, .. }
        | R::Truncate { node: n, .. }
        | R::ReleaseSlot { container: n, .. }
        | R::RecordNames { container: n, .. }
        | R::RecordAt { container: n, .. } => {
            node(*n)?;
            return as_is(0);
        }
        R::SnapshotList { id, .. } | R::SnapshotLocate { id, .. } | R::SnapshotEnd { id } => {
            // A snapshot is the tenant's if its root node is (still) in
            // the tenant's root; another's is answered as a gone one.
            if !within(st, st.snapshot_root(*id)?, root) {
                return Err(snapshot_gone(*id));
            }
            if let R::SnapshotLocate { node: n, .. } = req {
                node(*n)?;
            }
            return as_is(0);
        }
        R::Renew { leases } => {
            let (ours, theirs): (Vec<_>, Vec<_>) =
                leases.iter().partition(|(n, _)| within(st, *n, root));
            return Ok(Admitted {
                req: Cow::Owned(R::Renew { leases: ours }),
                lost: theirs.into_iter().map(|(n, _)| n).collect(),
                nodes: 0,
            });
        }
        R::Reserve { .. } => {
            // A reserved put belongs to no path until it is linked, so no
            // root holds it: a tenant's puts take the usual path (the
            // client falls back to it on this refusal).
            return Err(Error::invalid_argument(
                "a tenant's connection reserves no puts: put values the usual way",
            ));
        }
        R::Status => return as_is(st.usage_of(root).nodes + 1),
        R::Quotas
        | R::LocalSocket
        | R::SessionOpen { .. }
        | R::SessionRenew { .. }
        | R::SessionClose { .. } => return as_is(0),
        R::Register(_)
        | R::Heartbeat { .. }
        | R::Drain { .. }
        | R::Policy { .. }
        | R::Resize { .. } => {
            return Err(refused(t, "make requests of the cluster's members"));
        }
        // Mapped below. Listed, so that a new request does not compile
        // until it is decided here.
        R::Create { .. }
        | R::Lookup { .. }
        | R::Enumerate { .. }
        | R::OpenWrite { .. }
        | R::Usage { .. }
        | R::SnapshotBegin { .. }
        | R::SetAttrs { .. }
        | R::Remove { .. }
        | R::SessionBind { .. }
        | R::QuotaSet { .. }
        | R::Link { .. }
        | R::Move { .. } => {}
    }
    // The requests naming paths: each mapped into the root. Its root is
    // its "/": it may not remove, move, replace, expire, bind or re-quota
    // it.
    let mut mapped = req.clone();
    let (p, keeps_root) = match &mut mapped {
        R::Create { path, .. }
        | R::Lookup { path }
        | R::Enumerate { path }
        | R::OpenWrite { path }
        | R::Usage { path }
        | R::SnapshotBegin { path } => (path, None),
        R::SetAttrs { path, ttl_ms, .. } => (path, ttl_ms.is_some().then_some("give a TTL to")),
        R::Remove { path, .. } => (path, Some("remove")),
        R::SessionBind { path, .. } => (path, Some("bind to a session")),
        R::QuotaSet { path, .. } => (path, Some("set the quota of")),
        R::Link { node: n, path, .. } => {
            node(*n)?;
            (path, None)
        }
        R::Move { src, dst, .. } => {
            if dst == "/" {
                return Err(refused(t, "replace its root"));
            }
            *dst = t.inside(dst)?;
            (src, Some("move"))
        }
        other => {
            return Err(Error::internal(format!(
                "no tenant's view of request {}",
                op::name(other.op())
            )))
        }
    };
    if let Some(what) = keeps_root.filter(|_| p == "/") {
        return Err(refused(t, &format!("{what} its root")));
    }
    *p = t.inside(p)?;
    Ok(Admitted {
        req: Cow::Owned(mapped),
        lost: Vec::new(),
        nodes: 0,
    })
}

/// The reply to tenant `t`'s request as it sees it: paths in its root, and
/// nothing of the cluster outside it.
pub(crate) fn own_reply(t: &Tenant, admitted: Admitted<'_>, reply: MetaReply) -> MetaReply {
    match reply {
        MetaReply::Usage(mut u) => {
            u.path = t.outside(&u.path).unwrap_or_else(|| "/".into());
            MetaReply::Usage(u)
        }
        MetaReply::Quotas(qs) => MetaReply::Quotas(
            qs.into_iter()
                .filter_map(|mut u| {
                    u.path = t.outside(&u.path)?;
                    Some(u)
                })
                .collect(),
        ),
        MetaReply::Renewed { lease_ms, mut lost } => {
            lost.extend(admitted.lost);
            MetaReply::Renewed { lease_ms, lost }
        }
        MetaReply::Status(mut s) => {
            // What the servers are (a client needs their existence and
            // classes), not what anyone else keeps on them.
            s.nodes = admitted.nodes;
            // Its whole tree is in this partition (`admit`): to it, the
            // cluster has one.
            s.partition = 0;
            s.partitions = 1;
            s.puts_in_progress = 0;
            s.reserved_puts = 0;
            s.reclaiming = 0;
            s.logs.clear();
            s.moves.clear();
            for server in &mut s.servers {
                server.used_blocks = 0;
                server.traffic = Default::default();
            }
            MetaReply::Status(s)
        }
        r => r,
    }
}

/// Error `e` of tenant `t`'s request as it sees it: paths in its root
/// written from its `/`; a quota above its root named as its root's,
/// without another subtree's numbers.
pub(crate) fn own_error(t: &Tenant, e: Error) -> Error {
    if e.code == ErrorCode::QuotaExceeded {
        if let Some(q) = exceeded_root(&e) {
            if t.outside(q).is_none() {
                return exceeded(
                    "/",
                    "storage or nodes, set above this tenant's root, would be exceeded (ask the \
                     cluster's admin)",
                );
            }
        }
    }
    Error::new(e.code, t.own_message(&e.message))
}
