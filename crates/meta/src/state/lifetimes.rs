//! Lifetimes (`docs/lifecycle.md`): the expiry a create or `SetAttrs`
//! gives a node, the TTL a container gives its new children, and the
//! decision that removes what has expired.
//!
//! Times are wall-clock milliseconds: the state's time `now` (milliseconds
//! since the server started) plus the wall clock at its start, both given
//! by the shell. The shell decides the expiry of what is due before every
//! request it serves, and the ticker does between requests, so no request
//! sees a node past its expiry.

use super::{Decision, Draft, MetaState, Reply};
use crate::effect::Effect;
use crate::namespace::{stale, NodeId, ROOT};
use nodekernel_proto::meta::{MAX_TTL_MS, TTL_NEVER};
use nodekernel_proto::{Error, Result};
use std::collections::BTreeSet;

/// Most expired nodes one decision removes (each a subtree unlinked at
/// once and reaped afterwards, a bounded step at a time).
pub const EXPIRE_NODES: usize = 256;

/// What an expired node is, for its expiry.
enum Expired {
    /// Linked, under linked ancestors: removed with its subtree.
    Live,
    /// A put not closed yet: dropped, as an unclosed put whose writer
    /// vanished is.
    Unclosed,
    /// Inside a subtree removed already: nothing to remove, its entry
    /// goes.
    Removed,
}

fn check_ttl(what: &str, ttl_ms: u64) -> Result<u64> {
    if ttl_ms > MAX_TTL_MS && ttl_ms != TTL_NEVER {
        return Err(Error::invalid_argument(format!(
            "{what} of {ttl_ms} ms is longer than the longest allowed, {MAX_TTL_MS} ms (about 100 years)"
        )));
    }
    Ok(ttl_ms)
}

impl MetaState {
    /// Wall-clock milliseconds at the state's time `now`.
    pub fn wall_ms(&self, now: u64) -> u64 {
        self.cap_clock.base_ms.saturating_add(now)
    }

    /// Whether some node has expired at `now` (a cheap check the shell
    /// makes before each request).
    pub fn expiry_due(&self, now: u64) -> bool {
        self.ns
            .lifetimes()
            .next_due()
            .is_some_and(|at| at <= self.wall_ms(now))
    }

    /// Removes up to [`EXPIRE_NODES`] nodes that have expired at `now`,
    /// each with its subtree (as a recursive remove would); `None` when
    /// none has.
    pub fn decide_expiry(&self, now: u64) -> Option<Decision> {
        if !self.expiry_due(now) {
            return None;
        }
        let wall = self.wall_ms(now);
        let mut d = Draft::new(self);
        let mut removed = BTreeSet::new();
        let mut dropped = 0;
        for id in self.ns.lifetimes().due_by(wall).take(EXPIRE_NODES) {
            match self.expired(id) {
                Expired::Live => {
                    // Under a node this decision removes already: it goes
                    // with that subtree.
                    if !self.ancestors(id).any(|a| removed.contains(&a)) {
                        d.push(Effect::Unlinked { id });
                        removed.insert(id);
                    }
                }
                Expired::Unclosed => {
                    d.free_node_blocks(id);
                    d.push(Effect::Dropped { ids: vec![id] });
                    dropped += 1;
                }
                Expired::Removed => d.push(Effect::LifetimeSet {
                    node: id,
                    expires_ms: 0,
                    child_ttl_ms: self.ns.child_ttl(id).unwrap_or(0),
                }),
            }
        }
        d.notes.expired = (removed.len() + dropped) as u64;
        Some(d.finish(Reply::Done))
    }

    /// A node past its expiry at `now` that is still to be seen (linked
    /// and reachable, or a put not closed yet), if any: none once
    /// [`MetaState::decide_expiry`] has run until it returned `None`.
    pub fn visible_expired(&self, now: u64) -> Option<NodeId> {
        let wall = self.wall_ms(now);
        self.ns
            .lifetimes()
            .due_by(wall)
            .find(|id| !matches!(self.expired(*id), Expired::Removed))
    }

    /// Whether node `id` can still be seen: linked under linked ancestors,
    /// or a put not closed yet (the simulation's check).
    #[cfg(test)]
    pub(crate) fn is_reachable(&self, id: NodeId) -> bool {
        !matches!(self.expired(id), Expired::Removed)
    }

    fn expired(&self, id: NodeId) -> Expired {
        let Some(n) = self.ns.get(id) else {
            return Expired::Removed;
        };
        if !n.linked {
            return if self.ns.is_unclosed(id) {
                Expired::Unclosed
            } else {
                Expired::Removed
            };
        }
        if self
            .ancestors(id)
            .any(|a| self.ns.get(a).is_none_or(|p| !p.linked))
        {
            return Expired::Removed;
        }
        Expired::Live
    }

    /// `id`'s ancestors, its parent first, up to the root (excluded).
    fn ancestors(&self, id: NodeId) -> impl Iterator<Item = NodeId> + '_ {
        let mut at = id;
        std::iter::from_fn(move || {
            let p = self.ns.get(at)?.parent;
            if at == ROOT || p == ROOT {
                return None;
            }
            at = p;
            Some(p)
        })
    }
}

impl Draft<'_> {
    /// The lifetime a node created under `parent` gets: its own TTL, or
    /// the parent's child TTL (`ttl_ms` 0), or none ([`TTL_NEVER`]); and,
    /// for a container, the child TTL it gives: its own, or (`child_ttl_ms`
    /// 0) the parent's, so a child TTL reaches down the subtree as storage
    /// affinity does.
    pub(super) fn created_lifetime(
        &mut self,
        id: NodeId,
        parent: NodeId,
        ttl_ms: u64,
        child_ttl_ms: u64,
        container: bool,
        now: u64,
    ) -> Result<()> {
        let ttl = match check_ttl("a TTL", ttl_ms)? {
            0 => self.ns().child_ttl(parent).unwrap_or(0),
            TTL_NEVER => 0,
            t => t,
        };
        let child = match check_ttl("a child TTL", child_ttl_ms)? {
            0 if container => self.ns().child_ttl(parent).unwrap_or(0),
            c => c,
        };
        if child != 0 && (!container || child == TTL_NEVER) {
            return Err(Error::invalid_argument(if container {
                "a child TTL of never is no child TTL: give 0".to_string()
            } else {
                "only a Directory, Table or Bag gives its children a TTL".to_string()
            }));
        }
        self.set_lifetime(id, ttl, child, now);
        Ok(())
    }

    /// `SetAttrs`' part: node `id` expires `ttl_ms` from now (or never,
    /// [`TTL_NEVER`]); a container gives new children `child_ttl_ms`.
    pub(super) fn changed_lifetime(
        &mut self,
        id: NodeId,
        ttl_ms: Option<u64>,
        child_ttl_ms: Option<u64>,
        now: u64,
    ) -> Result<()> {
        if ttl_ms.is_none() && child_ttl_ms.is_none() {
            return Ok(());
        }
        let n = self.ns().get(id).ok_or_else(|| stale(id))?;
        if id == ROOT && ttl_ms.is_some_and(|t| t != TTL_NEVER) {
            return Err(Error::invalid_argument(
                "the root directory / never expires",
            ));
        }
        let expires = match ttl_ms.map(|t| check_ttl("a TTL", t)).transpose()? {
            Some(0) => {
                return Err(Error::invalid_argument(
                    "a TTL of 0 ms: give a TTL of at least 1 ms, or never",
                ))
            }
            Some(TTL_NEVER) => 0,
            Some(t) => self.st.wall_ms(now).saturating_add(t),
            None => self.ns().expires_at(id).unwrap_or(0),
        };
        let child = match child_ttl_ms
            .map(|t| check_ttl("a child TTL", t))
            .transpose()?
        {
            Some(TTL_NEVER) => {
                return Err(Error::invalid_argument(
                    "a child TTL of never is no child TTL: give 0",
                ))
            }
            Some(t) if t != 0 && !n.ty.is_container() => {
                return Err(Error::invalid_argument(format!(
                    "a {} has no children to give a TTL: only a Directory, Table or Bag does",
                    n.ty
                )))
            }
            Some(t) => t,
            None => self.ns().child_ttl(id).unwrap_or(0),
        };
        self.push(Effect::LifetimeSet {
            node: id,
            expires_ms: expires,
            child_ttl_ms: child,
        });
        Ok(())
    }

    /// A KeyValue put linked into `parent` (a reserved put) gets the
    /// parent's child TTL.
    pub(super) fn linked_lifetime(&mut self, id: NodeId, parent: NodeId, now: u64) {
        if let Some(ttl) = self.ns().child_ttl(parent) {
            self.set_lifetime(id, ttl, 0, now);
        }
    }

    fn set_lifetime(&mut self, id: NodeId, ttl_ms: u64, child_ttl_ms: u64, now: u64) {
        if ttl_ms != 0 || child_ttl_ms != 0 {
            let expires_ms = match ttl_ms {
                0 => 0,
                t => self.st.wall_ms(now).saturating_add(t),
            };
            self.push(Effect::LifetimeSet {
                node: id,
                expires_ms,
                child_ttl_ms,
            });
        }
    }
}
