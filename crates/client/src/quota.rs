//! Quotas and disk usage (`docs/lifecycle.md`, *Quotas* and *Disk
//! usage*): a container's limits on the storage and nodes of its subtree,
//! and what a subtree holds, from the metadata servers' incremental
//! accounting (no walk: one request whatever the subtree's size).
//!
//! A path is asked of the partition that owns its top-level name; `/` of a
//! cluster of several partitions is the sum of every partition's root, and
//! [`Client::quotas`] lists every partition's quota roots.

use crate::client::{unexpected, Client};
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::path;
use nodekernel_proto::quota::{Quota, UsageInfo, NO_LIMIT};
use nodekernel_proto::{Error, Result};

impl Client {
    /// Sets the quota of the Directory, Table or Bag at `p`: at most
    /// `bytes` of storage held below it (blocks and small values' pieces)
    /// and at most `nodes` nodes below it; `None` for no limit, and both
    /// `None` clears the quota. A write or create that would take the
    /// subtree past a limit then fails with `QuotaExceeded`, naming `p`,
    /// and changes nothing; a limit below what the subtree holds already
    /// refuses only growth. Returns the subtree's usage with its new quota.
    ///
    /// `/` takes a quota only in a cluster of one metadata partition (each
    /// partition keeps its own part of the tree).
    pub async fn set_quota(
        &self,
        p: &str,
        bytes: Option<u64>,
        nodes: Option<u64>,
    ) -> Result<UsageInfo> {
        path::components(p)?;
        let partitions = self.config().metas.len();
        if p == "/" && partitions > 1 {
            return Err(Error::invalid_argument(format!(
                "/ cannot carry a quota in a cluster of {partitions} metadata partitions \
                 (each keeps its own part of the tree): set quotas on top-level directories"
            )));
        }
        let quota = Quota {
            bytes: limit(bytes, "bytes")?,
            nodes: limit(nodes, "nodes")?,
        };
        let req = MetaRequest::QuotaSet {
            path: p.to_string(),
            quota,
        };
        self.usage_reply(self.partition(p), &req).await
    }

    /// Clears the quota of the container at `p` (no limit at all).
    pub async fn clear_quota(&self, p: &str) -> Result<UsageInfo> {
        self.set_quota(p, None, None).await
    }

    /// The quota of the container at `p`, if it has one.
    pub async fn quota(&self, p: &str) -> Result<Option<Quota>> {
        Ok(self.du(p).await?.quota)
    }

    /// Every quota root of the cluster with its usage, in path order.
    /// Every partition is asked; one that does not answer fails the call.
    pub async fn quotas(&self) -> Result<Vec<UsageInfo>> {
        let mut all = Vec::new();
        for idx in 0..self.config().metas.len() {
            match self.meta_at(idx, &MetaRequest::Quotas).await? {
                MetaReply::Quotas(q) => all.extend(q),
                other => return Err(unexpected(other)),
            }
        }
        all.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(all)
    }

    /// The disk usage of the subtree at `p`: for a container, the nodes
    /// below it, their published bytes and the storage they hold per
    /// class (and its quota, if it has one); for a data node, itself. From
    /// the metadata server's accounting: instant whatever the subtree's
    /// size.
    pub async fn du(&self, p: &str) -> Result<UsageInfo> {
        path::components(p)?;
        let req = MetaRequest::Usage {
            path: p.to_string(),
        };
        let partitions = self.config().metas.len();
        if p != "/" || partitions == 1 {
            return self.usage_reply(self.partition(p), &req).await;
        }
        let mut total: Option<UsageInfo> = None;
        for idx in 0..partitions {
            let u = self.usage_reply(idx, &req).await?;
            total = Some(match total {
                None => u,
                Some(t) => add(t, &u),
            });
        }
        total.ok_or_else(|| Error::internal("a cluster without metadata partitions"))
    }

    async fn usage_reply(&self, idx: usize, req: &MetaRequest) -> Result<UsageInfo> {
        match self.meta_at(idx, req).await? {
            MetaReply::Usage(u) => Ok(u),
            other => Err(unexpected(other)),
        }
    }
}

/// A limit as the wire carries it (`None`: [`NO_LIMIT`], which is not a
/// limit one can ask for).
fn limit(v: Option<u64>, what: &str) -> Result<u64> {
    match v {
        None => Ok(NO_LIMIT),
        Some(NO_LIMIT) => Err(Error::invalid_argument(format!(
            "a quota of {NO_LIMIT} {what} is no limit: pass none instead"
        ))),
        Some(n) => Ok(n),
    }
}

/// Two partitions' usage of their roots, summed.
fn add(mut t: UsageInfo, u: &UsageInfo) -> UsageInfo {
    t.nodes += u.nodes;
    t.bytes += u.bytes;
    t.held += u.held;
    for c in &u.classes {
        match t.classes.iter_mut().find(|x| x.class == c.class) {
            Some(x) => {
                x.blocks += c.blocks;
                x.piece_bytes += c.piece_bytes;
            }
            None => t.classes.push(*c),
        }
    }
    t.classes.sort_by_key(|c| c.class);
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodekernel_proto::quota::ClassUsage;
    use nodekernel_proto::NodeType;

    #[test]
    fn partitions_roots_add_up_by_class() {
        let a = UsageInfo {
            path: "/".into(),
            ty: NodeType::Directory,
            nodes: 2,
            bytes: 10,
            held: 4096 + 64,
            classes: vec![
                ClassUsage {
                    class: 0,
                    blocks: 1,
                    piece_bytes: 0,
                },
                ClassUsage {
                    class: 2,
                    blocks: 0,
                    piece_bytes: 64,
                },
            ],
            quota: None,
        };
        let b = UsageInfo {
            classes: vec![ClassUsage {
                class: 1,
                blocks: 3,
                piece_bytes: 0,
            }],
            nodes: 1,
            held: 3 * 4096,
            ..a.clone()
        };
        let t = add(a, &b);
        assert_eq!((t.nodes, t.bytes, t.held), (3, 20, 4 * 4096 + 64));
        assert_eq!(
            t.classes.iter().map(|c| c.class).collect::<Vec<_>>(),
            [0, 1, 2]
        );
    }

    #[test]
    fn none_is_no_limit_and_the_marker_is_refused() {
        assert_eq!(limit(None, "bytes").unwrap(), NO_LIMIT);
        assert_eq!(limit(Some(5), "bytes").unwrap(), 5);
        assert_eq!(
            limit(Some(NO_LIMIT), "nodes").unwrap_err().code,
            nodekernel_proto::ErrorCode::InvalidArgument
        );
    }
}
