//! Notes: the soft state a decision changes besides its effects
//! (liveness, signed requests, snapshots, drains, the policy, resize
//! targets), filled by the request's family while deciding, applied by
//! [`MetaState::commit`], and read by the shell (`crate::handler`) for what
//! it does after a request: wake the drainer, log a policy change, log the
//! servers declared dead. Never logged: a restarted metadata server
//! forgets them, and the servers, clients and commands that set them ask
//! again. The shell never matches on request kinds or reaches into the
//! state's soft state; what it needs to know is here.

use super::{Drain, MetaState};
use crate::snapshot::SnapshotNote;
use crate::tier::{PlacementPolicy, TierSettings};
use nodekernel_proto::Traffic;

/// What a decision changes of the soft state, and what the shell reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notes {
    /// A storage server heard from (it registered, or sent a heartbeat):
    /// seen now, with the traffic counters a heartbeat reports.
    pub(super) heartbeat: Option<(u32, Option<Traffic>)>,
    /// A server a client could not reach: no new blocks until its next
    /// heartbeat.
    pub(super) suspect: Option<u32>,
    /// Servers silent for too long, declared dead
    /// ([`MetaState::decide_liveness`]).
    pub(super) dead: Vec<u32>,
    /// A storage server's signed request taken: the server and its
    /// sequence number (`nodekernel_proto::cap::Signed`).
    pub(super) signed: Option<(u32, u64)>,
    /// A snapshot begun, used or ended (`crate::snapshot`); taken by
    /// commit, which keeps its listing.
    pub(super) snapshot: Option<SnapshotNote>,
    /// A drain started (`true`) or cancelled (`false`).
    pub(super) drain: Option<(u32, bool)>,
    /// New tiering and placement settings (`MetaRequest::Policy`).
    pub(super) policy: Option<PolicyChange>,
    /// A server's resize target, in blocks (`MetaRequest::Resize`).
    pub(super) resize: Option<(u32, u32)>,
    /// Nodes removed because they expired (unclosed puts among them),
    /// for the metrics ([`MetaState::decide_expiry`]).
    pub(super) expired: u64,
    /// A session opened or renewed: its lease runs from now.
    pub(super) session_renewed: Option<u64>,
    /// Sessions ended because their lease lapsed, for the metrics
    /// ([`MetaState::decide_session_lapse`]).
    pub(super) sessions_lapsed: u64,
    /// Nodes bound to the sessions the decision ended (closed or lapsed),
    /// each removed with its subtree by the expiry that follows, for the
    /// metrics.
    pub(super) session_removed: u64,
}

/// A change of the tiering and placement policy: the settings after it,
/// and the changes asked for (key, value), in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PolicyChange {
    pub(super) settings: Box<TierSettings>,
    pub(super) changes: Vec<(String, String)>,
}

impl Notes {
    /// Whether the drainer has new work: a drain started, or a server
    /// asked to export a new size.
    pub fn wakes_drainer(&self) -> bool {
        matches!(self.drain, Some((_, true))) || self.resize.is_some()
    }

    /// How many nodes the decision removed because they expired.
    pub fn expired(&self) -> u64 {
        self.expired
    }

    /// How many sessions the decision ended because their lease lapsed.
    pub fn sessions_lapsed(&self) -> u64 {
        self.sessions_lapsed
    }

    /// How many bound nodes the decision's ended sessions held.
    pub fn session_removed(&self) -> u64 {
        self.session_removed
    }

    /// The policy changes (key, value) applied, to log.
    pub fn policy_changes(&self) -> Option<&[(String, String)]> {
        self.policy.as_ref().map(|p| &p.changes[..])
    }

    /// The storage servers declared dead.
    pub fn dead(&self) -> &[u32] {
        &self.dead
    }
}

impl MetaState {
    /// Applies a committed decision's notes at `now` (its effects are
    /// applied already). The snapshot note is taken: its listing moves
    /// into the running snapshots.
    pub(super) fn apply_notes(&mut self, n: &mut Notes, now: u64) {
        if let Some((id, traffic)) = n.heartbeat {
            let _ = self.alloc.heartbeat(id, now);
            if let Some(t) = traffic {
                self.alloc.set_traffic(id, t);
            }
        }
        if let Some(id) = n.session_renewed {
            let life = self.ns.lifetimes_mut();
            if let Some(lease) = life.session(id).map(|s| s.lease_ms) {
                life.set_deadline(id, Some(now.saturating_add(lease)));
            }
        }
        if let Some(id) = n.suspect {
            self.alloc.suspect(id);
        }
        for id in &n.dead {
            self.alloc.declare_dead(*id);
        }
        if let Some((id, seq)) = n.signed {
            let wall_ms = self.cap_clock.base_ms.saturating_add(now);
            self.alloc.accept_signed(id, seq, wall_ms);
        }
        if let Some(note) = n.snapshot.take() {
            self.snapshots.apply(note, now);
        }
        if let Some(p) = &n.policy {
            self.alloc
                .set_round_robin(p.settings.placement == PlacementPolicy::RoundRobin);
            self.tier.settings = (*p.settings).clone();
        }
        if let Some((id, target)) = n.resize {
            self.resize.insert(id, target);
            self.note_shrinking(id);
        }
        if let Some((id, on)) = n.drain {
            self.alloc.set_draining(id, on);
            let dr = self.drains.entry(id).or_default();
            if on && dr.cancelled {
                *dr = Drain::default();
            }
            dr.cancelled = !on;
        }
    }
}
