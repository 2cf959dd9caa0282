//! Storage servers: registration, heartbeats (signed, never replayed),
//! retirement of dead ones, the policy, and the configured classes.
//! Liveness is soft state (`crate::alloc`).

use super::notes::PolicyChange;
use super::{Decision, Draft, MetaState, Reply};
use crate::alloc::Registration;
use crate::effect::Effect;
use nodekernel_proto::meta::MetaRequest;
use nodekernel_proto::{ClassInfo, Error, Result, ServerSpec, Traffic};

impl Draft<'_> {
    /// A storage server registers (again, after a restart, or from a new
    /// address): see [`BlockAllocator::decide_register`].
    ///
    /// [`BlockAllocator::decide_register`]: crate::alloc::BlockAllocator::decide_register
    pub(super) fn register(&mut self, spec: &ServerSpec) -> Result<Reply> {
        Ok(match self.st.alloc.decide_register(spec)? {
            Registration::Known(id) => {
                self.notes.heartbeat = Some((id, None));
                Reply::Registered(id)
            }
            Registration::New { id, replaces } => {
                for r in replaces {
                    self.push(Effect::ServerRetired { id: r });
                }
                self.push(Effect::ServerAdded {
                    id,
                    spec: spec.clone(),
                });
                self.notes.heartbeat = Some((id, None));
                Reply::Registered(id)
            }
            Registration::Readdressed { id, replaces } => {
                for r in replaces {
                    self.push(Effect::ServerRetired { id: r });
                }
                self.push(Effect::ServerReaddressed {
                    id,
                    addr: spec.addr.clone(),
                    cap_key: Some(spec.cap_key),
                });
                self.notes.heartbeat = Some((id, None));
                Reply::Registered(id)
            }
        })
    }

    /// A heartbeat of storage server `server`, reporting its `traffic`,
    /// signed with its key (`req`), with sequence number `seq`.
    pub(super) fn heartbeat(
        &mut self,
        req: &MetaRequest,
        server: u32,
        traffic: Traffic,
        seq: u64,
    ) -> Result<Reply> {
        if self.st.alloc.server(server).is_none() {
            return Err(Error::unknown_server(format!(
                "storage server {server} is not registered"
            )));
        }
        self.st.check_signed(server, req)?;
        self.notes.heartbeat = Some((server, Some(traffic)));
        self.notes.signed = Some((server, seq));
        Ok(Reply::Done)
    }

    /// Reads the tiering and placement policy after changing `set` (all
    /// or none).
    pub(super) fn policy(&mut self, set: &[(String, String)]) -> Result<Reply> {
        if !set.is_empty() {
            let mut next = self.st.tier.settings.clone();
            next.apply(set).map_err(Error::invalid_argument)?;
            self.notes.policy = Some(PolicyChange {
                settings: Box::new(next),
                changes: set.to_vec(),
            });
        }
        Ok(Reply::Policy)
    }
}

impl MetaState {
    /// Declares dead the storage servers silent for longer than
    /// `dead_after_ms` (the ticker's liveness step): soft state, so the
    /// decision has notes and no effects. `None` when none is newly dead.
    pub fn decide_liveness(&self, now: u64, dead_after_ms: u64) -> Option<Decision> {
        let dead = self.alloc.silent(now, dead_after_ms);
        if dead.is_empty() {
            return None;
        }
        let mut d = Draft::new(self);
        d.notes.dead = dead;
        Some(d.finish(Reply::Done))
    }

    /// The storage server registered with identity or address `name`.
    /// Checks that `req`, a storage server's signed request about server
    /// `id`, is signed with the key `id` registered and is not a replay
    /// (its sequence number is above the last one taken).
    pub(super) fn check_signed(&self, id: u32, req: &MetaRequest) -> Result<()> {
        let what = nodekernel_proto::meta::op::name(req.op());
        let key = self.alloc.cap_key(id).ok_or_else(|| {
            Error::unknown_server(format!("storage server {id} is not registered"))
        })?;
        if !req.signed_with(key) {
            return Err(Error::unauthenticated(format!(
                "a {what} for storage server {id} not signed with the key it registered: \
                 only that server can send one"
            )));
        }
        let seq = req.signature().map_or(0, |(_, s)| s.seq);
        let last = self.alloc.last_seq(id);
        if seq <= last {
            return Err(Error::unauthenticated(format!(
                "a {what} for storage server {id} with sequence number {seq}, not above the \
                 last one taken ({last}): a replay"
            )));
        }
        Ok(())
    }

    pub(super) fn find_server(&self, name: &str) -> Result<u32> {
        self.alloc.find_server(name).ok_or_else(|| {
            Error::unknown_server(format!(
                "no storage server with identity or address {name:?} is registered with metadata partition {} (`nk status` lists them)",
                self.placement.partition
            ))
        })
    }

    /// Retires storage servers dead for longer than `retire_after_ms`: their
    /// blocks are lost for good and they leave status and capacity.
    pub fn decide_retire(&self, now: u64, retire_after_ms: u64) -> Option<Decision> {
        let ids = self.alloc.retirable(now, retire_after_ms);
        if ids.is_empty() {
            return None;
        }
        let mut d = Draft::new(self);
        for id in ids {
            d.push(Effect::ServerRetired { id });
        }
        Some(d.finish(Reply::Done))
    }

    /// After a replay: every known storage server counts as seen `now`,
    /// so it has the usual time to heartbeat (or re-register) before it is
    /// declared dead, and every open session has a lease from `now`.
    pub fn restarted(&mut self, now: u64) {
        let ids: Vec<u32> = self.alloc.servers().map(|(id, _)| id).collect();
        for id in ids {
            let _ = self.alloc.heartbeat(id, now);
        }
        // Every open session has one lease from now to be renewed
        // (`docs/lifecycle.md`, *Sessions*): its deadline was soft state.
        let life = self.ns.lifetimes_mut();
        let leases: Vec<(u64, u64)> = life.sessions().map(|(id, s)| (id, s.lease_ms)).collect();
        for (id, lease) in leases {
            life.set_deadline(id, Some(now.saturating_add(lease)));
        }
    }

    /// Configured classes, plus any class a storage server registered
    /// without configuration (named after its first server, no price).
    pub(super) fn class_table(&self, servers: &[nodekernel_proto::ServerStatus]) -> Vec<ClassInfo> {
        let mut out = self.classes.clone();
        for s in servers {
            if !out.iter().any(|c| c.class == s.class) {
                out.push(ClassInfo {
                    class: s.class,
                    name: s.class_name.clone(),
                    price_per_gib: 0.0,
                    encrypt: false,
                });
            }
        }
        out.sort_by_key(|c| c.class);
        out
    }
}
