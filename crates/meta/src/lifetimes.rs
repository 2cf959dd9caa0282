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
//!
//! Sessions (`docs/lifecycle.md`, *Sessions*) bound the life of the nodes
//! bound to them: an open session costs about 100 bytes (its entry, and
//! its lease's two soft-state entries), a bound node about 60 (an entry by
//! node and one by session). The sessions and bindings are durable; a
//! lease's deadline is soft state in the state's own time (milliseconds
//! since the server started), renewed without a log record, and after a
//! restart every session has one lease from then to be renewed.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A node id (`crate::namespace::NodeId`; the namespace owns the lifetimes,
/// so this module does not import it).
type NodeId = u64;

/// A session id (never 0, never reused).
pub type SessionId = u64;

/// An open session: what its client proves it holds it with, and its
/// lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    pub secret: u128,
    pub lease_ms: u64,
}

#[derive(Debug, Default, Clone)]
pub struct Lifetimes {
    /// Expiry of each node that has one.
    expires: HashMap<NodeId, u64>,
    /// The same, by (expiry, node).
    due: BTreeSet<(u64, NodeId)>,
    /// TTL for new children, by container.
    child_ttl: HashMap<NodeId, u64>,
    /// Open sessions.
    sessions: BTreeMap<SessionId, Session>,
    /// The next session id.
    next_session: SessionId,
    /// The session each bound node is bound to.
    bound_to: HashMap<NodeId, SessionId>,
    /// The same, by (session, node).
    bound: BTreeSet<(SessionId, NodeId)>,
    /// Soft state: when each session's lease lapses (the state's time),
    /// if it has been given one since the server started.
    deadline: HashMap<SessionId, u64>,
    /// The same, by (deadline, session).
    lapsing: BTreeSet<(u64, SessionId)>,
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
        if let Some(s) = self.bound_to.remove(&id) {
            self.bound.remove(&(s, id));
        }
    }

    /// Session `id` is open.
    pub(crate) fn open_session(&mut self, id: SessionId, session: Session) {
        self.sessions.insert(id, session);
        self.next_session = self.next_session.max(id.saturating_add(1));
    }

    /// Session ids continue from at least `next` (ids are never reused).
    pub(crate) fn raise_next_session(&mut self, next: SessionId) {
        self.next_session = self.next_session.max(next);
    }

    /// Session `id` ended at `at` (wall-clock ms): the nodes bound to it
    /// expire then (or earlier, if they would anyway) and are bound no
    /// more.
    pub(crate) fn end_session(&mut self, id: SessionId, at: u64) {
        self.sessions.remove(&id);
        self.set_deadline(id, None);
        let nodes: Vec<NodeId> = self
            .bound
            .range((id, 0)..=(id, NodeId::MAX))
            .map(|(_, n)| *n)
            .collect();
        for n in nodes {
            self.bound.remove(&(id, n));
            self.bound_to.remove(&n);
            let at = self.expires_at(n).map_or(at, |e| e.min(at));
            self.set_expiry(n, at);
        }
    }

    /// Node `id` is bound to session `session`.
    pub(crate) fn bind(&mut self, id: NodeId, session: SessionId) {
        if let Some(old) = self.bound_to.insert(id, session) {
            self.bound.remove(&(old, id));
        }
        self.bound.insert((session, id));
    }

    /// Soft state: session `id`'s lease lapses at `at` (the state's time;
    /// `None`: it has no deadline).
    pub(crate) fn set_deadline(&mut self, id: SessionId, at: Option<u64>) {
        if let Some(old) = self.deadline.remove(&id) {
            self.lapsing.remove(&(old, id));
        }
        if let Some(at) = at {
            self.deadline.insert(id, at);
            self.lapsing.insert((at, id));
        }
    }

    pub fn session(&self, id: SessionId) -> Option<&Session> {
        self.sessions.get(&id)
    }

    pub fn sessions(&self) -> impl Iterator<Item = (SessionId, &Session)> + '_ {
        self.sessions.iter().map(|(id, s)| (*id, s))
    }

    pub fn open_sessions(&self) -> usize {
        self.sessions.len()
    }

    /// The id the next session gets.
    pub fn next_session(&self) -> SessionId {
        self.next_session.max(1)
    }

    /// The session node `id` is bound to, if any.
    pub fn bound_to(&self, id: NodeId) -> Option<SessionId> {
        self.bound_to.get(&id).copied()
    }

    /// How many nodes are bound to session `id`.
    pub fn bound_count(&self, id: SessionId) -> usize {
        self.bound.range((id, 0)..=(id, NodeId::MAX)).count()
    }

    /// Bound nodes and their sessions, in node order (for a checkpoint).
    pub(crate) fn bindings(&self) -> Vec<(NodeId, SessionId)> {
        let mut v: Vec<_> = self.bound_to.iter().map(|(n, s)| (*n, *s)).collect();
        v.sort_unstable();
        v
    }

    /// Sessions whose lease has lapsed at `now` (the state's time).
    pub fn lapsed_by(&self, now: u64) -> impl Iterator<Item = SessionId> + '_ {
        self.lapsing
            .iter()
            .take_while(move |(at, _)| *at <= now)
            .map(|(_, id)| *id)
    }

    /// Session `id`'s deadline, if it has one.
    pub fn deadline(&self, id: SessionId) -> Option<u64> {
        self.deadline.get(&id).copied()
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

    /// Whether the indexes agree with what they index, and every binding
    /// names an open session (the invariant checker's).
    pub(crate) fn is_consistent(&self) -> bool {
        self.expires.len() == self.due.len()
            && self
                .due
                .iter()
                .all(|(at, id)| self.expires.get(id) == Some(at))
            && self.bound_to.len() == self.bound.len()
            && self
                .bound
                .iter()
                .all(|(s, n)| self.bound_to.get(n) == Some(s) && self.sessions.contains_key(s))
            && self.deadline.len() == self.lapsing.len()
            && self
                .lapsing
                .iter()
                .all(|(at, s)| self.deadline.get(s) == Some(at) && self.sessions.contains_key(s))
            && self
                .sessions
                .keys()
                .all(|s| *s != 0 && *s < self.next_session())
    }

    /// Every node named here.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.expires
            .keys()
            .chain(self.child_ttl.keys())
            .chain(self.bound_to.keys())
            .copied()
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
