//! Quotas and disk usage on the wire (`docs/lifecycle.md`, *Quotas* and
//! *Disk usage*): a subtree's limits ([`Quota`]) and what it holds
//! ([`UsageInfo`]), as `QuotaSet`, `Usage` and `Quotas` answer them.

use crate::codec::{Dec, Enc};
use crate::error::{Error, Result};
use crate::types::NodeType;

/// A limit that is not set (a quota on bytes only, or on nodes only).
pub const NO_LIMIT: u64 = u64::MAX;

/// Most quota roots one metadata partition keeps (so that `Quotas`, the
/// metrics and the check of a write stay bounded).
pub const MAX_QUOTAS: usize = 4096;

/// The class of blocks held on a storage server since retired (their data
/// is lost; they still count until their nodes are removed).
pub const RETIRED_CLASS: u8 = crate::types::NO_CLASS;

/// A container's limits on its subtree: the storage it may hold (bytes of
/// blocks and pieces, as [`UsageInfo::held`] counts them) and the nodes
/// below it ([`UsageInfo::nodes`]); [`NO_LIMIT`] where none is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub bytes: u64,
    pub nodes: u64,
}

impl Quota {
    /// No limit at all: setting it clears a quota.
    pub const NONE: Quota = Quota {
        bytes: NO_LIMIT,
        nodes: NO_LIMIT,
    };

    pub fn is_none(&self) -> bool {
        *self == Quota::NONE
    }

    pub(crate) fn encode(&self, e: &mut Enc) {
        e.u64(self.bytes).u64(self.nodes);
    }

    pub(crate) fn decode(d: &mut Dec) -> Result<Quota> {
        Ok(Quota {
            bytes: d.u64()?,
            nodes: d.u64()?,
        })
    }
}

/// What a subtree holds in one storage class: whole blocks, and bytes of
/// small values' pieces of shared blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClassUsage {
    /// [`RETIRED_CLASS`] for blocks on servers since retired.
    pub class: u8,
    pub blocks: u64,
    pub piece_bytes: u64,
}

/// A subtree's disk usage, from the metadata server's incremental
/// accounting: for a container, everything below it (not itself); for a
/// data node, the node itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageInfo {
    /// The path asked about (`Quotas`: the quota root's path).
    pub path: String,
    pub ty: NodeType,
    /// Nodes below a container (a data node: 1).
    pub nodes: u64,
    /// Logical bytes: the sum of the published sizes of its data nodes.
    pub bytes: u64,
    /// Storage held: the bytes of the blocks and pieces its data nodes
    /// hold (what a byte quota limits).
    pub held: u64,
    /// Held storage per class, in class order.
    pub classes: Vec<ClassUsage>,
    /// The container's own quota, if it has one.
    pub quota: Option<Quota>,
}

impl UsageInfo {
    /// Encoded length with no path and no class.
    pub const MIN_LEN: usize = 4 + 1 + 8 + 8 + 8 + 4 + 1;

    pub(crate) fn encode(&self, e: &mut Enc) {
        e.str(&self.path)
            .u8(self.ty as u8)
            .u64(self.nodes)
            .u64(self.bytes)
            .u64(self.held)
            .u32(self.classes.len() as u32);
        for c in &self.classes {
            e.u8(c.class).u64(c.blocks).u64(c.piece_bytes);
        }
        match &self.quota {
            Some(q) => {
                e.bool(true);
                q.encode(e);
            }
            None => {
                e.bool(false);
            }
        }
    }

    pub(crate) fn decode(d: &mut Dec) -> Result<UsageInfo> {
        let path = d.string()?;
        let ty = NodeType::from_u8(d.u8()?)?;
        let (nodes, bytes, held) = (d.u64()?, d.u64()?, d.u64()?);
        let n = d.count(1 + 8 + 8)?;
        if n > 256 {
            return Err(Error::protocol(format!("{n} storage classes in a usage")));
        }
        let mut classes = Vec::with_capacity(n);
        for _ in 0..n {
            classes.push(ClassUsage {
                class: d.u8()?,
                blocks: d.u64()?,
                piece_bytes: d.u64()?,
            });
        }
        let quota = if d.bool()? {
            Some(Quota::decode(d)?)
        } else {
            None
        };
        Ok(UsageInfo {
            path,
            ty,
            nodes,
            bytes,
            held,
            classes,
            quota,
        })
    }

    /// The blocks and piece bytes it holds in `class` (zeros if none).
    pub fn class(&self, class: u8) -> ClassUsage {
        self.classes
            .iter()
            .find(|c| c.class == class)
            .copied()
            .unwrap_or(ClassUsage {
                class,
                ..ClassUsage::default()
            })
    }
}

/// What follows the quota root's path in a `QuotaExceeded` message
/// (`"/q: its quota of 3 nodes would be exceeded (...)"`).
pub const EXCEEDED_AFTER_ROOT: &str = ": its quota of ";

/// The message of a `QuotaExceeded` refusal at quota root `root`; `rest`
/// names the limit and the usage (`"3 nodes would be exceeded (...)"`).
pub fn exceeded(root: &str, rest: &str) -> Error {
    Error::quota_exceeded(format!("{root}{EXCEEDED_AFTER_ROOT}{rest}"))
}

/// The path of the quota root a `QuotaExceeded` error hit (`None` for
/// another error). The client puts the path of the request before the
/// server's message (`"/q/t/k: /q: its quota of ..."`), so the root is
/// what follows the last `": /"` before [`EXCEEDED_AFTER_ROOT`] (a root
/// with a name ending in `": "` is not told apart from such a prefix).
pub fn exceeded_root(e: &Error) -> Option<&str> {
    if e.code != crate::error::ErrorCode::QuotaExceeded {
        return None;
    }
    let head = &e.message[..e.message.rfind(EXCEEDED_AFTER_ROOT)?];
    Some(head.rfind(": /").map_or(head, |i| &head[i + 2..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_its_quota_root() {
        let e = exceeded(
            "/a: b/q",
            "3 nodes would be exceeded (3 below it, 1 more asked)",
        );
        assert_eq!(e.code, crate::error::ErrorCode::QuotaExceeded);
        assert_eq!(exceeded_root(&e), Some("/a: b/q"));
        // With the request's path before it, as the client adds it.
        let prefixed = Error::quota_exceeded(format!("/a: b/q/k: {}", e.message));
        assert_eq!(exceeded_root(&prefixed), Some("/a: b/q"));
        assert_eq!(exceeded_root(&exceeded("/", "1 nodes")), Some("/"));
        assert_eq!(exceeded_root(&Error::not_found("/q: its quota of")), None);
    }
}
