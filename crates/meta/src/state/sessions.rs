//! Sessions (`docs/lifecycle.md`, *Sessions*): a client opens one with a
//! lease it renews; nodes created bound to it are removed, each with its
//! subtree, when it closes or its lease lapses (the client died or was
//! cut off).
//!
//! Opening and ending a session are effects (logged, replayed,
//! checkpointed); a renewal is soft state (a note): it moves the lease's
//! deadline in the state's own time and writes no log record. A session
//! that ends makes its bound nodes expire at once, so the expiry decision
//! removes them, a bounded number per decision, as it removes any
//! expired node. After a restart every open session gets one lease from
//! then ([`MetaState::restarted`]): a client that is alive renews within
//! it, one that died lets it lapse.

use super::{Decision, Draft, MetaState, Reply};
use crate::effect::Effect;
use crate::lifetimes::SessionId;
use crate::namespace::NodeId;
use nodekernel_proto::meta::{SessionRef, MAX_SESSION_LEASE_MS, MIN_SESSION_LEASE_MS};
use nodekernel_proto::{Error, Result};

/// Most sessions open at once in one partition (each about 100 bytes).
pub const MAX_SESSIONS: usize = 65_536;

/// Most nodes bound to one session: bind a directory and create inside it
/// for more (its subtree goes with it). Ending a session touches each of
/// its bound nodes in one step, so this bounds that step.
pub const MAX_BOUND: usize = 4_096;

/// Most sessions one lapse decision ends.
pub const LAPSE_SESSIONS: usize = 64;

impl MetaState {
    /// Sessions whose lease lapsed by `now` are ended (a bounded number
    /// per decision); `None` when none has.
    pub fn decide_session_lapse(&self, now: u64) -> Option<Decision> {
        let lapsed: Vec<SessionId> = self
            .ns
            .lifetimes()
            .lapsed_by(now)
            .take(LAPSE_SESSIONS)
            .collect();
        if lapsed.is_empty() {
            return None;
        }
        let mut d = Draft::new(self);
        let at_ms = self.wall_ms(now);
        for id in lapsed {
            d.notes.session_removed += self.ns.lifetimes().bound_count(id) as u64;
            d.push(Effect::SessionEnded { id, at_ms });
        }
        d.notes.sessions_lapsed = d.effects.len() as u64;
        Some(d.finish(Reply::Done))
    }

    /// Whether some session's lease has lapsed at `now` (a cheap check
    /// the shell makes before each request).
    pub fn session_lapse_due(&self, now: u64) -> bool {
        self.ns.lifetimes().lapsed_by(now).next().is_some()
    }
}

impl Draft<'_> {
    pub(super) fn session_open(&mut self, secret: u128, lease_ms: u64) -> Result<Reply> {
        let life = self.ns().lifetimes();
        if life.open_sessions() >= MAX_SESSIONS {
            return Err(Error::busy(format!(
                "{MAX_SESSIONS} sessions are open on this metadata server, the most it keeps: close some"
            )));
        }
        let lease_ms = lease_ms.clamp(MIN_SESSION_LEASE_MS, MAX_SESSION_LEASE_MS);
        let id = life.next_session();
        self.push(Effect::SessionOpened {
            id,
            secret,
            lease_ms,
        });
        self.notes.session_renewed = Some(id);
        Ok(Reply::Session { id, lease_ms })
    }

    pub(super) fn session_renew(&mut self, id: SessionId, secret: u128) -> Result<Reply> {
        let lease_ms = self.owned_session(id, secret)?;
        self.notes.session_renewed = Some(id);
        Ok(Reply::Session { id, lease_ms })
    }

    pub(super) fn session_close(&mut self, id: SessionId, secret: u128, now: u64) -> Result<Reply> {
        self.owned_session(id, secret)?;
        self.notes.session_removed = self.ns().lifetimes().bound_count(id) as u64;
        let at_ms = self.st.wall_ms(now);
        self.push(Effect::SessionEnded { id, at_ms });
        Ok(Reply::Done)
    }

    /// Binds the node at `path` to session `id`, as a create naming it
    /// would have (the root cannot be bound).
    pub(super) fn session_bind(
        &mut self,
        id: SessionId,
        secret: u128,
        path: &str,
    ) -> Result<Reply> {
        self.st.check_partition(path)?;
        let node = self.ns().resolve(path)?;
        if node == crate::namespace::ROOT {
            return Err(Error::invalid_argument(
                "the root directory / is bound to no session",
            ));
        }
        if self.ns().lifetimes().bound_to(node) == Some(id) {
            self.owned_session(id, secret)?;
            return Ok(Reply::Done);
        }
        self.bind_created(node, Some(SessionRef { id, secret }))?;
        Ok(Reply::Done)
    }

    /// Session `id`'s lease, if it is open and `secret` is its own. One
    /// that is not open and one whose secret is wrong get the same answer,
    /// so a guess learns nothing.
    fn owned_session(&self, id: SessionId, secret: u128) -> Result<u64> {
        match self.ns().lifetimes().session(id) {
            Some(s) if s.secret == secret => Ok(s.lease_ms),
            _ => Err(Error::not_found(format!(
                "session {id} has ended (its lease lapsed, or it was closed) or is not open on this metadata server"
            ))),
        }
    }

    /// A create's part: node `id` is bound to `session`, if it names one
    /// (the creator must hold it: its secret, as for a renewal).
    pub(super) fn bind_created(&mut self, id: NodeId, session: Option<SessionRef>) -> Result<()> {
        let Some(SessionRef {
            id: session,
            secret,
        }) = session
        else {
            return Ok(());
        };
        self.owned_session(session, secret)?;
        if self.ns().lifetimes().bound_count(session) >= MAX_BOUND {
            return Err(Error::invalid_argument(format!(
                "session {session} has {MAX_BOUND} nodes bound to it, the most it may: bind a directory and create inside it"
            )));
        }
        self.push(Effect::SessionBound { node: id, session });
        Ok(())
    }
}
