//! Disk usage and quotas (`docs/lifecycle.md`, *Quotas* and *Disk usage*):
//! what each container's subtree holds, kept up to date as effects apply,
//! and the quota limits some containers carry.
//!
//! Plain data: the state (`state/quotas.rs`) decides which node's change
//! reaches which containers and calls `Accounts::add` for each of them.
//! The usage is derived from the namespace (it is recounted in one pass
//! when a checkpoint is loaded), so only the limits are durable.
//!
//! Costs: nothing for a data node; for a container whose subtree holds
//! anything, one entry in `usage` (about 80 bytes with the table's share,
//! plus 24 bytes per storage class its blocks are in); for a quota root,
//! an entry in `quotas` (about 40 bytes).

use nodekernel_proto::quota::{ClassUsage, Quota};
use std::collections::{BTreeMap, HashMap};

/// A node id (`crate::namespace::NodeId`; the state owns the accounts, so
/// this module does not import the namespace).
type NodeId = u64;

/// What a subtree holds: nodes, logical bytes (published sizes) and, per
/// storage class, whole blocks and the bytes of small values' pieces.
/// Used for deltas too (added or taken away whole).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub nodes: u64,
    pub bytes: u64,
    /// Sorted by class; no class with nothing in it.
    pub classes: Vec<ClassUsage>,
}

impl Usage {
    /// One node holding nothing.
    pub fn node() -> Usage {
        Usage {
            nodes: 1,
            ..Usage::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        self.nodes == 0 && self.bytes == 0 && self.classes.is_empty()
    }

    /// `blocks` blocks and `piece_bytes` of pieces in `class`.
    pub fn in_class(class: u8, blocks: u64, piece_bytes: u64) -> Usage {
        let mut u = Usage::default();
        u.add_class(class, blocks, piece_bytes);
        u
    }

    pub fn add_class(&mut self, class: u8, blocks: u64, piece_bytes: u64) {
        if blocks == 0 && piece_bytes == 0 {
            return;
        }
        match self.classes.binary_search_by_key(&class, |c| c.class) {
            Ok(i) => {
                let c = &mut self.classes[i];
                c.blocks += blocks;
                c.piece_bytes += piece_bytes;
            }
            Err(i) => self.classes.insert(
                i,
                ClassUsage {
                    class,
                    blocks,
                    piece_bytes,
                },
            ),
        }
    }

    /// Storage held: blocks of `block_size` bytes and pieces.
    pub fn held(&self, block_size: u64) -> u64 {
        self.classes
            .iter()
            .map(|c| c.blocks * block_size + c.piece_bytes)
            .sum()
    }

    /// Adds `d` (`plus`) or takes it away (never below zero: the
    /// invariant checker, which recounts, reports a drift).
    pub fn apply(&mut self, d: &Usage, plus: bool) {
        let f = |a: u64, b: u64| {
            if plus {
                a.saturating_add(b)
            } else {
                a.saturating_sub(b)
            }
        };
        self.nodes = f(self.nodes, d.nodes);
        self.bytes = f(self.bytes, d.bytes);
        for c in &d.classes {
            if plus {
                self.add_class(c.class, c.blocks, c.piece_bytes);
            } else if let Ok(i) = self.classes.binary_search_by_key(&c.class, |x| x.class) {
                let x = &mut self.classes[i];
                x.blocks = x.blocks.saturating_sub(c.blocks);
                x.piece_bytes = x.piece_bytes.saturating_sub(c.piece_bytes);
                if x.blocks == 0 && x.piece_bytes == 0 {
                    self.classes.remove(i);
                }
            }
        }
    }
}

/// Every container's usage (those holding nothing have no entry) and the
/// quota roots' limits.
#[derive(Debug, Default, Clone)]
pub struct Accounts {
    usage: HashMap<NodeId, Usage>,
    quotas: BTreeMap<NodeId, Quota>,
}

static NOTHING: Usage = Usage {
    nodes: 0,
    bytes: 0,
    classes: Vec::new(),
};

impl Accounts {
    /// What container `id`'s subtree holds (below it).
    pub fn usage(&self, id: NodeId) -> &Usage {
        self.usage.get(&id).unwrap_or(&NOTHING)
    }

    /// Adds `d` to container `id`'s usage (`plus`), or takes it away.
    pub(crate) fn add(&mut self, id: NodeId, d: &Usage, plus: bool) {
        let u = self.usage.entry(id).or_default();
        u.apply(d, plus);
        if u.is_empty() {
            self.usage.remove(&id);
        }
    }

    /// Every container's usage, as a recount found it.
    pub(crate) fn set_usage(&mut self, usage: HashMap<NodeId, Usage>) {
        self.usage = usage;
    }

    /// Container `id`'s quota (`Quota::NONE` clears it).
    pub(crate) fn set_quota(&mut self, id: NodeId, q: Quota) {
        if q.is_none() {
            self.quotas.remove(&id);
        } else {
            self.quotas.insert(id, q);
        }
    }

    /// Node `id` is gone: it keeps nothing here.
    pub(crate) fn forget(&mut self, id: NodeId) {
        self.usage.remove(&id);
        self.quotas.remove(&id);
    }

    pub fn quota(&self, id: NodeId) -> Option<Quota> {
        self.quotas.get(&id).copied()
    }

    /// Every quota root and its limits, in node order.
    pub fn quotas(&self) -> impl Iterator<Item = (NodeId, Quota)> + '_ {
        self.quotas.iter().map(|(id, q)| (*id, *q))
    }

    pub fn has_quotas(&self) -> bool {
        !self.quotas.is_empty()
    }

    pub fn quota_count(&self) -> usize {
        self.quotas.len()
    }

    /// Containers with a usage entry.
    pub fn entries(&self) -> impl Iterator<Item = (NodeId, &Usage)> + '_ {
        self.usage.iter().map(|(id, u)| (*id, u))
    }

    pub fn entry_count(&self) -> usize {
        self.usage.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_adds_and_takes_away_by_class_and_drops_empty_entries() {
        let mut a = Accounts::default();
        let d = Usage {
            nodes: 2,
            bytes: 10,
            classes: vec![],
        };
        a.add(5, &d, true);
        a.add(5, &Usage::in_class(1, 3, 0), true);
        a.add(5, &Usage::in_class(0, 0, 640), true);
        let u = a.usage(5).clone();
        assert_eq!(
            u.classes.iter().map(|c| c.class).collect::<Vec<_>>(),
            [0, 1]
        );
        assert_eq!(u.held(1 << 20), 3 << 20 | 640);
        a.add(5, &Usage::in_class(1, 3, 0), false);
        assert_eq!(a.usage(5).classes.len(), 1);
        a.add(5, &u, false);
        assert_eq!(a.entry_count(), 0);
        assert!(a.usage(5).is_empty());
        a.set_quota(5, Quota { bytes: 1, nodes: 2 });
        assert!(a.has_quotas());
        a.forget(5);
        assert!(!a.has_quotas());
    }
}
