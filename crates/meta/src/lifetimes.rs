//! Node lifetimes (`docs/lifecycle.md`): when nodes expire, and the TTL a
//! container gives its new children.
//!
//! Kept beside the node table rather than in each node, so a node without
//! a TTL costs nothing here (a million small values without one add no
//! byte). A node with an expiry costs an entry in `expires` and one in
//! `due` (about 60 bytes together, with the tables' overhead); a container
//! with a child TTL, an entry in `child_ttl` (about 30 bytes). Finding the
//! nodes due at a time is a walk from the front of `due`: time in
//! proportion to what is due, never to the nodes with a TTL.
//!
//! Times are wall-clock milliseconds since the Unix epoch, as the
//! metadata server's clock counts them (the state reads no clock: the
//! time comes in with each decision), so an expiry survives a restart.

use std::collections::{BTreeSet, HashMap};

/// A node id (`crate::namespace::NodeId`; the namespace owns the lifetimes,
/// so this module does not import it).
type NodeId = u64;

#[derive(Debug, Default, Clone)]
pub struct Lifetimes {
    /// Expiry of each node that has one.
    expires: HashMap<NodeId, u64>,
    /// The same, by (expiry, node).
    due: BTreeSet<(u64, NodeId)>,
    /// TTL for new children, by container.
    child_ttl: HashMap<NodeId, u64>,
}

impl Lifetimes {
    /// Node `id` expires at `at` (0: never).
    pub(crate) fn set_expiry(&mut self, id: NodeId, at: u64) {
        if let Some(old) = self.expires.remove(&id) {
            self.due.remove(&(old, id));
        }
        if at != 0 {
            self.expires.insert(id, at);
            self.due.insert((at, id));
        }
    }

    /// Container `id` gives new children a TTL of `ttl_ms` (0: none).
    pub(crate) fn set_child_ttl(&mut self, id: NodeId, ttl_ms: u64) {
        if ttl_ms == 0 {
            self.child_ttl.remove(&id);
        } else {
            self.child_ttl.insert(id, ttl_ms);
        }
    }

    /// Node `id` is gone: it keeps nothing here.
    pub(crate) fn forget(&mut self, id: NodeId) {
        self.set_expiry(id, 0);
        self.child_ttl.remove(&id);
    }

    pub fn expires_at(&self, id: NodeId) -> Option<u64> {
        self.expires.get(&id).copied()
    }

    pub fn child_ttl(&self, id: NodeId) -> Option<u64> {
        self.child_ttl.get(&id).copied()
    }

    /// The earliest expiry of any node, if one has one.
    pub fn next_due(&self) -> Option<u64> {
        self.due.first().map(|(at, _)| *at)
    }

    /// Nodes expired at `now` (expiry at or before it), earliest first.
    pub fn due_by(&self, now: u64) -> impl Iterator<Item = NodeId> + '_ {
        self.due
            .iter()
            .take_while(move |(at, _)| *at <= now)
            .map(|(_, id)| *id)
    }

    /// Nodes with an expiry.
    pub fn expiring(&self) -> usize {
        self.expires.len()
    }

    /// Every node's lifetime (expiry, child TTL; 0 for none), for a
    /// checkpoint, in node order.
    pub(crate) fn entries(&self) -> Vec<(NodeId, u64, u64)> {
        let mut ids: Vec<NodeId> = self
            .expires
            .keys()
            .chain(self.child_ttl.keys())
            .copied()
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids.into_iter()
            .map(|id| {
                (
                    id,
                    self.expires_at(id).unwrap_or(0),
                    self.child_ttl(id).unwrap_or(0),
                )
            })
            .collect()
    }

    /// Whether `expires` and `due` agree (the invariant checker's).
    pub(crate) fn is_consistent(&self) -> bool {
        self.expires.len() == self.due.len()
            && self
                .due
                .iter()
                .all(|(at, id)| self.expires.get(id) == Some(at))
    }

    /// Every node named here.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.expires.keys().chain(self.child_ttl.keys()).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiries_are_found_in_time_order_and_forgotten_with_their_node() {
        let mut l = Lifetimes::default();
        l.set_expiry(3, 300);
        l.set_expiry(1, 100);
        l.set_expiry(2, 200);
        l.set_child_ttl(2, 50);
        assert_eq!(l.next_due(), Some(100));
        assert_eq!(l.due_by(99).count(), 0);
        assert_eq!(l.due_by(200).collect::<Vec<_>>(), vec![1, 2]);
        l.set_expiry(1, 400);
        assert_eq!(l.due_by(300).collect::<Vec<_>>(), vec![2, 3]);
        l.forget(2);
        assert_eq!(l.child_ttl(2), None);
        assert_eq!(l.expires_at(2), None);
        l.set_expiry(3, 0);
        assert_eq!(l.entries(), vec![(1, 400, 0)]);
        assert!(l.is_consistent());
    }
}
