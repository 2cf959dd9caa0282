//! A deterministic simulation of the metadata state machine.
//!
//! One seed drives the real [`MetaState`] with a model of storage servers
//! and many clients through a random interleaving of every request, plus
//! the things that go wrong: storage servers that die, come back with their
//! memory wiped or just rejoin, writers that vanish mid-put, leases that
//! expire and are taken over, block moves, claims that arrive late and out
//! of order. Time is a number the simulation advances; randomness is a
//! seeded PRNG; nothing else is read, so a seed always replays the same run.
//!
//! After every step it checks:
//! - [`MetaState::check_invariants`] (no block owned twice, free + used =
//!   capacity, records agree with the slot tables, leases unique, ...);
//! - generations only grow: every block a decision hands out, fences or
//!   frees gets a generation above any it had before;
//! - no internal errors: every refusal carries a user-facing code;
//! - no quota root that holds more than a limit grows (under the same
//!   limits), whatever ran;
//! - reads see their own node's bytes: a block (or a small value's piece
//!   of a shared block) read at its current generation holds bytes
//!   written for the node being read, never another's (the model stores
//!   record who wrote each block and each piece), by the generation
//!   alone: the tag a small value's piece starts with is a second guard
//!   the model does not lean on, except that a live value's tag is never
//!   cleared;
//! - periodically, replaying every effect so far onto a fresh state gives
//!   the same state (effects alone carry every decision). The effects go
//!   through the operation log's encoding (`crate::codec`), one record per
//!   decision, as the server shell writes them.
//!
//! Every replay check also round-trips the live state through a
//! checkpoint image. Among the faults, the metadata server itself
//! restarts: its state is rebuilt from the log alone, or from a checkpoint
//! taken at an earlier step plus the log after it, the claims it had not
//! delivered are lost,
//! and the restart decision (leases cleared, unclosed puts dropped, moves
//! given up) is applied and logged like any other; every check above
//! holds across it.
//!
//! Replay a failing seed with `NK_SIM_SEED=<seed> cargo test -p
//! nodekernel-meta sim::` (and `NK_SIM_STEPS` for longer runs).

mod background;
mod clients;
mod store;
#[cfg(test)]
mod tests;

use crate::alloc::BlockClaim;
use crate::effect::Effect;
use crate::namespace::NodeId;
use crate::slab::TAG_LEN;
use crate::state::{Bug, MetaState};
use nodekernel_proto::cap::{Cap, CapKey, Rights, Use};
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::{BlockLoc, ErrorCode, NodeType, ServerSpec, NO_CLASS};
use std::collections::{BTreeMap, BTreeSet};
use store::Store;

const BS: u32 = 4096;
const LEASE_MS: u64 = 1_000;
const DEAD_AFTER_MS: u64 = 3_000;
const RETIRE_AFTER_MS: u64 = 12_000;
const STORES: usize = 4;
const CLIENTS: usize = 6;

/// splitmix64: small, fast, and fully determined by its seed.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What a client is in the middle of.
enum Task {
    Idle,
    /// Writing whole blocks of `node` (of `bs` bytes: a piece's size for a
    /// small value) from block `next` until `end`.
    Writing {
        node: NodeId,
        lease: u64,
        bs: u64,
        next: u64,
        end: u64,
        /// A new File's first write, of this many bytes (0: none), asks for
        /// a piece.
        first_write: u32,
        /// While the File's block 0 is a piece: the bytes it holds, which
        /// the writer publishes unless it outgrows the piece first.
        piece: Option<u64>,
        /// A reserved put, closed by a `Link` at key `.1` of table `.0`.
        link: Option<(u64, u64)>,
    },
}

/// What a run did, to show a seed exercised something.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Stats {
    pub steps: u64,
    pub applied: u64,
    pub refused: u64,
    pub effects: u64,
    pub writes: u64,
    pub reads: u64,
    pub puts_closed: u64,
    pub truncates: u64,
    pub replacing_moves: u64,
    pub moves: u64,
    /// Drains started or cancelled.
    pub drains: u64,
    /// Of which moves of slabs (every small value in one block).
    pub slab_moves: u64,
    /// Of which moves tier migration planned (into exactly their class).
    pub migrations: u64,
    /// Resizes of stores (dynamic capacity).
    pub resizes: u64,
    pub store_deaths: u64,
    /// Stores that restarted keeping their blocks, at a new address.
    pub store_moves: u64,
    pub takeovers: u64,
    /// Write leases of linked nodes (Files, KeyValues opened for writing)
    /// that lapsed and were released by the sweep, their writer gone.
    pub lapses: u64,
    /// Leases renewed by a client's lease keeper (publishing nothing).
    pub renewals: u64,
    pub small_puts: u64,
    /// Files whose first write took a piece, and writers that outgrew one.
    pub file_pieces: u64,
    pub outgrown: u64,
    /// Puts reserved ahead of their paths, and those linked.
    pub reserved: u64,
    pub linked: u64,
    pub small_reads: u64,
    pub old_handle_reads: u64,
    pub restarts: u64,
    pub checkpoint_restarts: u64,
    pub snapshots: u64,
    /// Reads of a snapshot's block or piece whose node was since freed
    /// (the block or piece held for the snapshot).
    pub snapshot_held_reads: u64,
    pub snapshot_reads: u64,
    /// Record locations asked again (`RecordAt`) and checked.
    pub record_locations: u64,
    /// Nodes removed because they expired (subtrees and unclosed puts).
    pub expired: u64,
    /// Quotas set (or cleared), and requests they refused.
    pub quotas_set: u64,
    pub quota_refusals: u64,
    /// Sessions opened, closed and lapsed, and nodes created bound to one.
    pub sessions_opened: u64,
    pub sessions_closed: u64,
    pub sessions_lapsed: u64,
    pub bound: u64,
}

/// A snapshot a simulated client is taking: its id, and the blocks (and
/// pieces) it listed whose bytes were, when it began, written for the
/// node listed: (node, block index, location then, the store's
/// incarnation then).
struct SimSnap {
    id: u64,
    blocks: Vec<(NodeId, u64, BlockLoc, u64)>,
}

pub(crate) struct Sim {
    st: MetaState,
    rng: Rng,
    now: u64,
    bug: Option<Bug>,
    stores: Vec<Store>,
    clients: Vec<Task>,
    /// Every decision's effects so far, in order, encoded as the operation
    /// log writes them.
    log: Vec<bytes::Bytes>,
    /// A checkpoint taken earlier: its image and the log records it holds.
    checkpoint: Option<(crate::checkpoint::Image, usize)>,
    /// Claims decided but not yet delivered to their stores.
    claims: Vec<BlockClaim>,
    /// The highest generation each (server, block) was given.
    last_gen: BTreeMap<(u32, u32), u64>,
    /// Each quota root's limits and (nodes, storage held) after the last
    /// step: a root past a limit must not grow past it.
    quota_seen: BTreeMap<NodeId, (nodekernel_proto::quota::Quota, u64, u64)>,
    /// Record slots a client must release once it cleared them.
    clearing: Vec<(NodeId, u32)>,
    /// Sessions the clients opened and have not seen end: (id, secret).
    sessions: Vec<(u64, u128)>,
    /// Nodes created bound to a session: (node, session).
    bound: Vec<(NodeId, u64)>,
    /// Block moves started and not yet ended: the source, and whether
    /// the copy was made (and succeeded) yet.
    moving: Vec<(NodeId, u64, BlockLoc, Option<bool>)>,
    /// Locations readers looked up earlier and may still use (old handles).
    handles: Vec<(NodeId, BlockLoc)>,
    /// Snapshots running.
    snaps: Vec<SimSnap>,
    trace: Vec<String>,
    pub stats: Stats,
}

/// The state a checkpoint image restores.
fn restore(image: &crate::checkpoint::Image, bug: Option<Bug>) -> Result<MetaState, String> {
    let nodes = image.node_records().map(|(id, r)| Ok((id, r.to_vec())));
    let mut st = MetaState::from_checkpoint(LEASE_MS, &image.state, nodes, 0)
        .map_err(|e| format!("a checkpoint does not restore: {e}"))?;
    st.bug = bug;
    Ok(st)
}

fn fresh_state(bug: Option<Bug>) -> MetaState {
    let mut st = MetaState::new(BS, LEASE_MS, 1);
    st.bug = bug;
    // Small stores: low watermarks and eager promotion make migration
    // plan moves often.
    let mut tier = crate::tier::TierSettings::default();
    tier.apply(&[
        ("high_watermark", "40"),
        ("low_watermark", "20"),
        ("promotion", "on"),
        ("promote_after", "2"),
        ("half_life_ms", "200"),
    ])
    .expect("valid settings");
    st.set_tier_settings(tier);
    st
}

impl Sim {
    pub(crate) fn new(seed: u64, bug: Option<Bug>) -> Self {
        let mut rng = Rng(seed);
        let stores = (0..STORES)
            .map(|i| {
                let num_blocks = 8 + rng.below(24) as u32;
                Store {
                    identity: format!("store-{i}"),
                    addr: format!("10.0.0.{i}:7000"),
                    class: (i % 2) as u8,
                    num_blocks,
                    incarnation: 1,
                    id: None,
                    seq: 0,
                    up: true,
                    gens: vec![0; num_blocks as usize],
                    bytes: vec![BTreeMap::new(); num_blocks as usize],
                    cleared: vec![BTreeSet::new(); num_blocks as usize],
                }
            })
            .collect();
        Sim {
            st: fresh_state(bug),
            rng,
            now: 0,
            bug,
            stores,
            clients: (0..CLIENTS).map(|_| Task::Idle).collect(),
            log: Vec::new(),
            checkpoint: None,
            claims: Vec::new(),
            last_gen: BTreeMap::new(),
            quota_seen: BTreeMap::new(),
            clearing: Vec::new(),
            sessions: Vec::new(),
            bound: Vec::new(),
            moving: Vec::new(),
            handles: Vec::new(),
            snaps: Vec::new(),
            trace: Vec::new(),
            stats: Stats::default(),
        }
    }

    /// Runs `steps` steps, checking everything after each.
    pub(crate) fn run(&mut self, steps: u64) -> Result<(), String> {
        for i in 0..self.stores.len() {
            self.register(i)?;
        }
        for step in 0..steps {
            self.stats.steps = step + 1;
            self.step().map_err(|e| self.failure(step, &e))?;
            self.st
                .check_invariants()
                .map_err(|e| self.failure(step, &e))?;
            self.check_quotas().map_err(|e| self.failure(step, &e))?;
            if step % 64 == 63 {
                self.check_replay().map_err(|e| self.failure(step, &e))?;
            }
        }
        self.drain().map_err(|e| self.failure(steps, &e))?;
        self.check_replay().map_err(|e| self.failure(steps, &e))
    }

    fn failure(&self, step: u64, e: &str) -> String {
        let start = self.trace.len().saturating_sub(20);
        format!(
            "step {step}: {e}\nlast requests:\n  {}",
            self.trace[start..].join("\n  ")
        )
    }

    // ----- driving the state -------------------------------------------------

    /// Executes one request; refusals are fine but must not be internal.
    fn exec(&mut self, req: MetaRequest) -> Result<Result<MetaReply, ErrorCode>, String> {
        self.expire_due()?;
        self.trace.push(format!("t={} {req:?}", self.now));
        match self.st.execute(&req, self.now) {
            Ok(o) => {
                self.stats.applied += 1;
                self.record(o.effects)?;
                Ok(Ok(o.reply))
            }
            Err(e) if e.code == ErrorCode::Internal => {
                Err(format!("{req:?} failed internally: {}", e.message))
            }
            Err(e) => {
                self.stats.refused += 1;
                if e.code == ErrorCode::QuotaExceeded {
                    self.stats.quota_refusals += 1;
                }
                self.trace.push(format!("  -> {:?}: {}", e.code, e.message));
                Ok(Err(e.code))
            }
        }
    }

    /// What the shell does before each request: removes what has expired,
    /// after which no node past its expiry is left to be seen.
    fn expire_due(&mut self) -> Result<(), String> {
        while let Some(d) = self.st.decide_session_lapse(self.now) {
            self.stats.sessions_lapsed += d.notes().sessions_lapsed();
            self.commit(d)?;
        }
        if self.st.session_lapse_due(self.now) {
            return Err(format!(
                "a session's lease lapsed by {} and it is still open",
                self.now
            ));
        }
        self.check_bound()?;
        while let Some(d) = self.st.decide_expiry(self.now) {
            self.stats.expired += d.notes().expired();
            self.commit(d)?;
        }
        match self.st.visible_expired(self.now) {
            Some(id) => Err(format!(
                "node {id} expired at {:?} and is still there at {}",
                self.st.ns().expires_at(id),
                self.st.wall_ms(self.now)
            )),
            None => Ok(()),
        }
    }

    /// Nothing bound to an ended session is left to be seen (the expiry
    /// decisions just run removed it).
    fn check_bound(&mut self) -> Result<(), String> {
        let mut err = None;
        let (st, now) = (&self.st, self.now);
        self.bound.retain(|&(node, session)| {
            if st.ns().lifetimes().session(session).is_some() {
                return true;
            }
            if st.is_reachable(node)
                && st
                    .ns()
                    .expires_at(node)
                    .is_none_or(|at| at > st.wall_ms(now))
            {
                err.get_or_insert(format!(
                    "node {node} is still there at {now}, after session {session} ended"
                ));
            }
            false
        });
        err.map_or(Ok(()), Err)
    }

    /// No quota root grew past a limit: whatever ran (client requests,
    /// the ticker, reaping, moves, restarts), a root that holds more than
    /// a limit holds no more than it did after the last step, under the
    /// same limits.
    fn check_quotas(&mut self) -> Result<(), String> {
        let bs = u64::from(BS);
        let now: BTreeMap<NodeId, (nodekernel_proto::quota::Quota, u64, u64)> = self
            .st
            .accounts()
            .quotas()
            .map(|(id, q)| {
                let u = self.st.accounts().usage(id);
                (id, (q, u.nodes, u.held(bs)))
            })
            .collect();
        for (id, &(q, nodes, held)) in &now {
            let Some(&(q0, nodes0, held0)) = self.quota_seen.get(id) else {
                continue;
            };
            if q0 != q {
                continue;
            }
            if nodes > q.nodes && nodes > nodes0 {
                return Err(format!(
                    "quota root {id} ({}) grew from {nodes0} to {nodes} nodes, past its limit of {}",
                    self.st.path_of(*id),
                    q.nodes
                ));
            }
            if held > q.bytes && held > held0 {
                return Err(format!(
                    "quota root {id} ({}) grew from {held0} to {held} bytes held, past its limit of {}",
                    self.st.path_of(*id),
                    q.bytes
                ));
            }
        }
        self.quota_seen = now;
        Ok(())
    }

    /// Commits a decision made outside `execute` (ticker, reaper, moves).
    fn commit(&mut self, d: crate::state::Decision) -> Result<(), String> {
        self.trace
            .push(format!("t={} internal {:?}", self.now, d.effects));
        let o = self.st.commit(d, self.now);
        self.record(o.effects)
    }

    /// Logs applied effects, checks their generations only grow, and
    /// queues their claims.
    fn record(&mut self, effects: Vec<Effect>) -> Result<(), String> {
        for e in &effects {
            let fresh: Option<(u32, u32, u64)> = match e {
                Effect::BlockAdded { block, .. }
                | Effect::BlockSwapped { block, .. }
                | Effect::BlockFreed { block }
                | Effect::BlockHeld { block } => Some((block.server, block.block, block.gen)),
                Effect::MoveStarted { to, .. } => Some((to.server, to.block, to.gen)),
                Effect::BlockStamped { node, index, gen } => self
                    .st
                    .ns()
                    .get(*node)
                    .and_then(|n| n.blocks.get(*index as usize))
                    .map(|b| (b.server, b.block, *gen)),
                _ => None,
            };
            // Nothing new lands on a server being drained.
            let placed = match e {
                Effect::BlockAdded { block, .. }
                | Effect::BlockSwapped { block, .. }
                | Effect::SlabCreated { block, .. } => Some(block.server),
                Effect::MoveStarted { to, .. } => Some(to.server),
                Effect::PieceTaken { piece, .. } => Some(piece.server),
                _ => None,
            };
            if let Some(server) = placed.filter(|s| self.st.alloc().is_draining(*s)) {
                return Err(format!(
                    "{e:?} places data on server {server}, which is being drained"
                ));
            }
            if let Some((server, block, gen)) = fresh {
                let last = self.last_gen.entry((server, block)).or_insert(0);
                if gen <= *last {
                    return Err(format!(
                        "{e:?} gives block {block} of server {server} generation {gen}, not above its earlier {last}"
                    ));
                }
                *last = gen;
            }
        }
        self.stats.effects += effects.len() as u64;
        if !effects.is_empty() {
            let mut rec = bytes::BytesMut::new();
            crate::codec::encode_effects(&effects, &mut rec);
            self.log.push(rec.freeze());
        }
        let claims = self.st.take_claims();
        self.claims.extend(claims);
        Ok(())
    }

    /// Applies every logged effect to a fresh state: it must equal the
    /// live one.
    fn check_replay(&mut self) -> Result<(), String> {
        let fresh = self.replayed()?;
        let (a, b) = (self.st.dump(), fresh.dump());
        if a != b {
            return Err(format!(
                "replaying {} records gives a different state:\nlive:\n{a}\nreplayed:\n{b}",
                self.log.len()
            ));
        }
        let image = self.st.checkpoint_image();
        let c = restore(&image, self.bug)?.dump();
        if a != c {
            return Err(format!(
                "a checkpoint gives a different state:\nlive:\n{a}\nrestored:\n{c}"
            ));
        }
        // Keep it sometimes, for a restart to start from.
        if self.rng.chance(30) {
            self.checkpoint = Some((image, self.log.len()));
        }
        Ok(())
    }

    /// A fresh state with every logged record replayed.
    fn replayed(&self) -> Result<MetaState, String> {
        self.replay_from(fresh_state(self.bug), 0)
    }

    /// `st` with the logged records from `first` on replayed.
    fn replay_from(&self, mut fresh: MetaState, first: usize) -> Result<MetaState, String> {
        for (i, r) in self.log.iter().enumerate().skip(first) {
            fresh
                .replay(r)
                .map_err(|e| format!("record {i} of the log does not replay: {e}"))?;
        }
        Ok(fresh)
    }

    /// The metadata server restarts from its log: the state is rebuilt
    /// from the records alone, undelivered claims and moves in flight die
    /// with the process, and the restart decision is committed.
    fn restart(&mut self) -> Result<(), String> {
        self.trace
            .push(format!("t={} metadata server restarts", self.now));
        self.stats.restarts += 1;
        self.st = match &self.checkpoint {
            Some((image, covered)) if self.rng.chance(50) => {
                self.stats.checkpoint_restarts += 1;
                self.replay_from(restore(image, self.bug)?, *covered)?
            }
            _ => self.replayed()?,
        };
        self.st.restarted(self.now);
        self.claims.clear();
        self.moving.clear();
        // Snapshots die with the process (their readers are told so).
        for s in std::mem::take(&mut self.snaps) {
            match self.exec(MetaRequest::SnapshotEnd { id: s.id })? {
                Err(ErrorCode::NotFound) => {}
                r => return Err(format!("a snapshot survived a restart: {r:?}")),
            }
        }
        // Sometimes the clock is ahead of every counter, as after a lossy
        // machine crash.
        let floor = if self.rng.chance(50) {
            self.stats.restarts * 1000
        } else {
            0
        };
        match self.st.decide_restart(floor) {
            Some(d) => self.commit(d),
            None => Ok(()),
        }
    }

    // ----- one step ----------------------------------------------------------

    fn step(&mut self) -> Result<(), String> {
        self.now += self.rng.below(120);
        self.heartbeats()?;
        self.deliver_claims();
        match self.rng.below(100) {
            0..=51 => self.client_step(),
            52..=54 => self.snapshot_step(),
            55..=64 => self.namespace_op(),
            65..=69 => self.read(),
            70..=74 => self.read_old_handle(),
            75..=79 => self.release_slots(),
            80..=84 => self.move_step(),
            85..=92 => self.tick(),
            93..=95 => self.store_fault(),
            96 => self.restart(),
            _ => {
                // A long pause: leases expire, stores are declared dead.
                self.now += self.rng.below(4 * LEASE_MS);
                Ok(())
            }
        }
    }
}
