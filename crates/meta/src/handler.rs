//! The request handler, the async shell around [`MetaState`]: decodes
//! requests, decides and applies them under a lock, logs their effects,
//! sends the block claims they need, encodes replies; and the block mover
//! and the background steps the tasks of [`crate::server`] run (reaping,
//! claims retried, checkpoints).
//!
//! With persistence ([`MetaConfig::persistence`]), every decision's effects
//! are appended to the operation log under the same lock that applies them
//! (so the log has the state's order), and a reply waits until the log is
//! durable up to the last record written when its request was decided —
//! its own, or the ones whose changes it saw — as the fsync policy
//! promises. A failed log write stops the server from taking requests
//! (`Unavailable`): its memory is then ahead of its log. At start the log
//! is replayed, and the restart decision (leases cleared, unclosed puts
//! dropped, moves given up; [`MetaState::decide_restart`]) is logged like
//! any other.
//!
//! Claims are sent before the reply (so that once a delete or a replacing
//! put returns, old handles get `Stale`), batched per storage server, but a
//! reply never waits longer than `claim_timeout` for them: a claim that a
//! storage server does not acknowledge by then (it is dead, hung or cut
//! off) is kept and retried by the ticker until it lands or the server is
//! retired. Until then a reader of the old handle that can still reach that
//! server may read the old bytes of the node it holds — never another
//! node's: a block is only reused under a newer generation.

use crate::alloc::BlockClaim;
use crate::checkpoint::{self, CheckpointError};
use crate::config::{CheckpointStats, MetaConfig, MetaError, Persistence};
use crate::effect::Effect;
use crate::state::{Decision, MetaState, Notes, REAP_NODES};
use crate::tenant;
use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use nodekernel_journal::{Fsync, Journal, JournalError};
use nodekernel_proto::cap::verify_identify;
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::store::{Claim, Identity, StoreRequest, IDENTIFY_NONCE_LEN, MAX_CLAIM_BATCH};
use nodekernel_proto::sync;
use nodekernel_proto::tenant::Tenant;
use nodekernel_proto::Result;
use nodekernel_proto::ServerSpec;
use nodekernel_proto::{Error, LogStatus};
use nodekernel_rpc::{
    ConnOptions, ConnectionPool, Handler, Reply, Role, ServerHandshake, VersionHandshake,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Most claims kept for storage servers that did not acknowledge them; the
/// oldest are dropped beyond it (with a warning: their blocks stay safe,
/// only the early `Stale` of old handles is lost).
pub const MAX_PENDING_CLAIMS: usize = 1 << 20;

pub(crate) struct MetaHandler {
    state: Mutex<MetaState>,
    epoch: Instant,
    /// Connections to storage servers for claims: every call (connect
    /// included) is bounded by the claim timeout, so no extra timer runs
    /// per claim (arming one costs a wake-up of the timer thread).
    stores: ConnectionPool,
    /// Connections to storage servers for block copies (longer bound).
    copies: ConnectionPool,
    /// Every connection's handshake (the token, when there is one).
    handshake: Arc<VersionHandshake>,
    /// A cluster token is configured: the unauthenticated admin endpoint
    /// only reads.
    pub(crate) authenticated: bool,
    claim_timeout: Duration,
    /// Claims not acknowledged yet, by storage server address.
    pending: Mutex<BTreeMap<String, Vec<BlockClaim>>>,
    /// Storage servers in this process, by address: claims go to them by
    /// a call ([`LocalStore`]). One entry per server, none in a
    /// metadata server of its own process.
    local: std::sync::RwLock<HashMap<String, Arc<dyn LocalStore>>>,
    /// Claims delivered so far: by a call to a [`LocalStore`], and as
    /// requests over a socket (the admin endpoint's metrics).
    pub(crate) claims_by_call: std::sync::atomic::AtomicU64,
    pub(crate) claims_by_request: std::sync::atomic::AtomicU64,
    /// Nodes removed because they expired (the admin endpoint's metrics).
    pub(crate) expired: std::sync::atomic::AtomicU64,
    /// Sessions ended because their lease lapsed (the metrics).
    pub(crate) sessions_lapsed: std::sync::atomic::AtomicU64,
    /// Bound nodes of sessions that ended (the admin endpoint's metrics).
    pub(crate) session_removed: std::sync::atomic::AtomicU64,
    /// When the last request came in ([`MetaHandler::now_ms`]): the
    /// background reaper takes short steps while requests come in.
    last_request_ms: std::sync::atomic::AtomicU64,
    /// Requests refused with `QuotaExceeded`, by the path of the quota
    /// root they hit (as it was then; at most `MAX_QUOTAS` paths, about
    /// 64 bytes each, further ones only in the total) and in all (the
    /// admin endpoint's metrics).
    pub(crate) quota_refused: Mutex<HashMap<String, u64>>,
    pub(crate) quota_refused_total: std::sync::atomic::AtomicU64,
    /// Wakes the reaper.
    pub(crate) reap: Notify,
    /// Wakes the drainer (a drain was asked for).
    pub(crate) drain: Notify,
    /// When the block mover may start its next copy: drains and
    /// migration share `move_rate`.
    next_move: std::sync::Mutex<Instant>,
    /// The operation log, when persistent.
    pub(crate) journal: Option<Journal>,
    pub(crate) persistence: Option<Persistence>,
    /// A checkpoint is being written.
    checkpointing: std::sync::atomic::AtomicBool,
    /// The last log record the newest checkpoint holds.
    checkpointed: std::sync::atomic::AtomicU64,
    /// Requests handled, by type (the admin endpoint's metrics).
    pub(crate) requests: nodekernel_admin::metrics::RequestMetrics,
    /// The tenants (`[[security.tenant]]`), by name: what their
    /// connections see ([`crate::tenant`]).
    pub(crate) tenants: HashMap<Arc<str>, Tenant>,
}

impl MetaHandler {
    /// The handler of a server configured by `cfg`, over `state` (restored
    /// from `journal` up to the checkpoint's record `covered`, when
    /// persistent); `epoch` is its clock's zero.
    pub(crate) fn new(
        cfg: &MetaConfig,
        state: MetaState,
        epoch: Instant,
        journal: Option<Journal>,
        covered: u64,
    ) -> MetaHandler {
        MetaHandler {
            state: Mutex::new(state),
            epoch,
            stores: cfg.security.pool(
                Role::MetaServer,
                ConnOptions {
                    spin: claim_spin(),
                    ..ConnOptions::new(cfg.claim_timeout)
                },
            ),
            copies: cfg.security.pool(
                Role::MetaServer,
                ConnOptions::new(cfg.dead_after.min(Duration::from_secs(5))),
            ),
            handshake: cfg.security.handshake(Role::MetaServer),
            authenticated: cfg.security.token.is_some(),
            claim_timeout: cfg.claim_timeout,
            pending: Mutex::new(BTreeMap::new()),
            local: Default::default(),
            claims_by_call: Default::default(),
            claims_by_request: Default::default(),
            expired: Default::default(),
            sessions_lapsed: Default::default(),
            session_removed: Default::default(),
            last_request_ms: Default::default(),
            quota_refused: Default::default(),
            quota_refused_total: Default::default(),
            reap: Notify::new(),
            drain: Notify::new(),
            next_move: std::sync::Mutex::new(Instant::now()),
            journal,
            persistence: cfg.persistence.clone(),
            checkpointing: Default::default(),
            checkpointed: covered.into(),
            requests: Default::default(),
            tenants: cfg
                .security
                .tenants
                .iter()
                .map(|t| (t.name.as_str().into(), t.clone()))
                .collect(),
        }
    }
}

/// What a client gets once the log cannot be written.
fn log_failed(e: JournalError) -> Error {
    Error::unavailable(format!(
        "the metadata server cannot write its operation log and stopped taking requests: {e}"
    ))
}

/// Whether the reply to `req` waits for the log. The create of a put (a
/// KeyValue, linked only by its close) does not: a crash that loses its
/// record loses only a put that had not closed, which a restart drops
/// anyway, and the restart raises node ids, lease ids and generations past
/// anything the reply handed out. The put's close waits, and so makes the
/// create's record durable too (the log is synced in order). A put then
/// waits for one sync, not two.
fn reply_waits(req: &MetaRequest) -> bool {
    !matches!(req, MetaRequest::Create { ty, .. } if ty.replaces_on_create())
}

/// Appends the record of `effects` (if any) to `journal`, and returns the
/// seq a reply must wait for: this record's, or the last one written,
/// whose changes the decision may have seen.
pub(crate) fn log_effects(journal: &Journal, effects: &[Effect]) -> Result<u64, JournalError> {
    if effects.is_empty() {
        return Ok(journal.last());
    }
    let mut rec = BytesMut::new();
    crate::codec::encode_effects(effects, &mut rec);
    // What a replay will read back is exactly what was decided.
    debug_assert_eq!(
        crate::codec::decode_effects(&rec).as_deref().ok(),
        Some(effects),
        "a log record decodes to the effects it was made of"
    );
    journal.append(&rec)
}

impl MetaHandler {
    /// Counts a request refused with `QuotaExceeded` `e`.
    fn count_quota_refusal(&self, e: &Error) {
        use std::sync::atomic::Ordering;
        self.quota_refused_total.fetch_add(1, Ordering::Relaxed);
        let Some(root) = nodekernel_proto::quota::exceeded_root(e) else {
            return;
        };
        let mut by_root = sync::lock(&self.quota_refused);
        if let Some(n) = by_root.get_mut(root) {
            *n += 1;
        } else if by_root.len() < nodekernel_proto::quota::MAX_QUOTAS {
            by_root.insert(root.to_string(), 1);
        }
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, MetaState> {
        sync::lock(&self.state)
    }

    /// Applies a decision taken under the same lock, logs it, and returns
    /// its claims. Nobody waits for these decisions (the ticker's, the
    /// reaper's), so nobody waits for the log either: a restart decides
    /// them again; a failed write stops the server (see [`log_failed`]).
    pub(crate) fn commit(&self, st: &mut MetaState, d: Decision, now: u64) -> Vec<BlockClaim> {
        self.commit_logged(st, d, now).0
    }

    /// [`MetaHandler::commit`], also returning the log record to wait for
    /// before the claims go out, where a claim delivered but lost from the
    /// log would leave a live block fenced beyond what a restart knows.
    fn commit_logged(&self, st: &mut MetaState, d: Decision, now: u64) -> (Vec<BlockClaim>, u64) {
        let o = st.commit(d, now);
        let seq = match &self.journal {
            // A failed write is logged by the journal itself, which
            // refuses all later writes (and `durable` then fails).
            Some(j) => log_effects(j, &o.effects).unwrap_or_else(|_| j.last()),
            None => 0,
        };
        (st.take_claims(), seq)
    }

    /// Changes the tiering policy (`set`, all or none; empty: only read)
    /// and returns every setting, as a `Policy` request does (the admin
    /// endpoint's `/policy`).
    pub(crate) fn policy(&self, set: &[(String, String)]) -> Result<Vec<(String, String)>> {
        let req = MetaRequest::Policy { set: set.to_vec() };
        let reply = self.state().execute(&req, self.now_ms())?;
        if let Some(changes) = reply.notes.policy_changes() {
            log_policy_change(changes);
        }
        match reply.reply {
            MetaReply::Policy(v) => Ok(v),
            other => Err(Error::internal(format!("policy answered {other:?}"))),
        }
    }

    /// This partition's status, as a `Status` request gets it.
    pub(crate) fn status(&self) -> Result<nodekernel_proto::ClusterStatus> {
        let reply = self.state().execute(&MetaRequest::Status, self.now_ms())?;
        match self.with_log(reply.reply) {
            MetaReply::Status(s) => Ok(s),
            other => Err(Error::internal(format!("status answered {other:?}"))),
        }
    }

    /// A status reply completed with the log's part; other replies as they
    /// are.
    fn with_log(&self, reply: MetaReply) -> MetaReply {
        match reply {
            MetaReply::Status(mut s) => {
                s.logs.extend(self.log_status(s.partition));
                MetaReply::Status(s)
            }
            r => r,
        }
    }

    /// Whether the operation log still takes records (always, when
    /// volatile).
    pub(crate) fn log_ok(&self) -> Result<()> {
        match &self.journal {
            Some(j) => j.check().map_err(log_failed),
            None => Ok(()),
        }
    }

    /// The log's part of a status reply, when persistent.
    fn log_status(&self, partition: u32) -> Option<LogStatus> {
        let (j, p) = (self.journal.as_ref()?, self.persistence.as_ref()?);
        Some(LogStatus {
            partition,
            fsync: match p.fsync {
                Fsync::Always => "always".into(),
                Fsync::Interval(d) => format!("interval {}ms", d.as_millis()),
                Fsync::Never => "never".into(),
            },
            records: j.last(),
            checkpoint: self.checkpointed.load(std::sync::atomic::Ordering::Relaxed),
            log_bytes: j.segment_bytes(),
        })
    }

    /// Waits until the log is durable up to `seq`.
    async fn durable(&self, seq: u64) -> Result<()> {
        match &self.journal {
            Some(j) => j.durable(seq).await.map_err(log_failed),
            None => Ok(()),
        }
    }

    /// Writes a checkpoint of the state as of now and deletes the log
    /// segments it makes unnecessary; `None` without persistence, or while
    /// another checkpoint is being written. The live state is not touched:
    /// the log starts a new segment, and in the background the previous
    /// checkpoint is loaded, the records up to the new segment are replayed
    /// onto it, and the result is written (requests never wait for it; it
    /// costs a second copy of the state in memory meanwhile).
    pub(crate) async fn checkpoint(&self) -> Result<Option<CheckpointStats>, MetaError> {
        let (Some(j), Some(p)) = (&self.journal, &self.persistence) else {
            return Ok(None);
        };
        use std::sync::atomic::Ordering;
        if self.checkpointing.swap(true, Ordering::AcqRel) {
            return Ok(None);
        }
        let started = Instant::now();
        let (bs, lease_ms) = {
            let st = self.state();
            (st.alloc().block_size(), st.lease_ms())
        };
        let result = async {
            // Every record before `first` is in the older segments.
            let first = j.rotate()?;
            let dir = p.dir.clone();
            let build = move || -> Result<CheckpointStats, MetaError> {
                let (mut st, after) = checkpoint::read(&dir, lease_ms, 0)?
                    .unwrap_or_else(|| (MetaState::new(bs, lease_ms, 1), 0));
                let covered = first - 1;
                let journal = dir.join("journal");
                let replayed = nodekernel_journal::read_records(&journal, after, covered, |_, r| {
                    st.replay(r).map_err(|e| e.to_string())
                })?;
                let image = st.checkpoint_image();
                drop(st);
                let stats = CheckpointStats {
                    nodes: image.nodes() as u64,
                    bytes: image.bytes() as u64,
                    covered,
                    replayed,
                    took: Duration::ZERO,
                };
                checkpoint::write(&dir, image, covered)?;
                Ok(stats)
            };
            let stats = tokio::task::spawn_blocking(build)
                .await
                .map_err(|e| CheckpointError {
                    path: p.dir.clone(),
                    reason: format!("the writer stopped: {e}"),
                })??;
            self.checkpointed
                .fetch_max(stats.covered, std::sync::atomic::Ordering::Relaxed);
            let removed = j.remove_before(first)?;
            let stats = CheckpointStats {
                took: started.elapsed(),
                ..stats
            };
            tracing::info!(
                "checkpoint of {} nodes ({} bytes) to log record {} ({} records replayed onto the previous one) in {:.1} ms; {removed} log segment(s) removed",
                stats.nodes,
                stats.bytes,
                stats.covered,
                stats.replayed,
                stats.took.as_secs_f64() * 1e3,
            );
            Ok(Some(stats))
        }
        .await;
        self.checkpointing.store(false, Ordering::Release);
        result
    }

    /// Sends claims, batched per storage server, waiting at most
    /// `claim_timeout`; what does not land is kept for the ticker.
    pub(crate) async fn send_claims(&self, claims: Vec<BlockClaim>) {
        if claims.is_empty() {
            return;
        }
        let mut by_addr: BTreeMap<String, Vec<BlockClaim>> = BTreeMap::new();
        for c in claims {
            by_addr.entry(c.addr.clone()).or_default().push(c);
        }
        let sends = by_addr.into_iter().map(|(addr, claims)| async move {
            if let Err(e) = self.deliver(&addr, &claims).await {
                tracing::warn!(
                    "could not claim {} block(s) on storage server {addr} within {:?} ({e}); retrying in the background",
                    claims.len(),
                    self.claim_timeout
                );
                self.keep_pending(addr, claims);
            }
        });
        futures::future::join_all(sends).await;
    }

    /// Claims kept for storage servers that did not acknowledge them.
    pub(crate) fn pending_claims(&self) -> u64 {
        sync::lock(&self.pending)
            .values()
            .map(|l| l.len() as u64)
            .sum()
    }

    fn keep_pending(&self, addr: String, claims: Vec<BlockClaim>) {
        let mut pending = sync::lock(&self.pending);
        let list = pending.entry(addr).or_default();
        list.extend(claims);
        let total: usize = pending.values().map(Vec::len).sum();
        if total > MAX_PENDING_CLAIMS {
            tracing::warn!(
                "{total} claims are waiting for unreachable storage servers; dropping the oldest"
            );
            let mut excess = total - MAX_PENDING_CLAIMS;
            for list in pending.values_mut() {
                let n = excess.min(list.len());
                list.drain(..n);
                excess -= n;
            }
        }
    }

    /// Retries the claims storage servers have not acknowledged, at each
    /// server's current address (a server that kept its blocks may have
    /// come back at another one); claims for servers that were retired are
    /// dropped (their blocks are gone).
    pub(crate) async fn retry_pending(&self) {
        let pending = std::mem::take(&mut *sync::lock(&self.pending));
        if pending.is_empty() {
            return;
        }
        let claims: Vec<BlockClaim> = {
            let st = self.state();
            pending
                .into_values()
                .flatten()
                .filter_map(|mut c| {
                    c.addr = st.alloc().server_addr(c.server)?.to_string();
                    Some(c)
                })
                .collect()
        };
        self.send_claims(claims).await;
    }

    /// Waits for the block mover's turn to copy one block: all moves
    /// (drains and migration) together copy at most `move_rate` bytes per
    /// second.
    async fn pace(&self) {
        let (rate, bs) = {
            let st = self.state();
            (st.tier_settings().move_rate, st.alloc().block_size() as u64)
        };
        if rate == 0 {
            return;
        }
        let start = {
            let mut next = sync::lock(&self.next_move);
            let now = Instant::now();
            let start = (*next).max(now);
            *next = start + Duration::from_secs_f64(bs as f64 / rate as f64);
            start
        };
        tokio::time::sleep_until(start.into()).await;
    }

    /// Servers shrinking (dynamic capacity) take the blocks that moves
    /// freed into their balloon.
    pub(crate) async fn balloon_freed(&self) {
        let (claims, seq) = {
            let mut st = self.state();
            let mut claims = Vec::new();
            let mut seq = 0;
            for (id, target) in st.shrinking() {
                if let Ok(d) = st.decide_resize(id, target) {
                    let (c, s) = self.commit_logged(&mut st, d, self.now_ms());
                    claims.extend(c);
                    seq = s;
                }
            }
            (claims, seq)
        };
        if self.durable(seq).await.is_ok() {
            self.send_claims(claims).await;
        }
    }

    /// See [`MetaServer::move_block`].
    pub async fn move_block(&self, node: u64, index: u64, class: u8) -> Result<()> {
        self.move_block_to(node, index, class, false).await
    }

    /// [`MetaHandler::move_block`]; with `exact`, into `class` only.
    async fn move_block_to(&self, node: u64, index: u64, class: u8, exact: bool) -> Result<()> {
        let h = self;
        let (src, dst, fence_claims, seq) = {
            let mut st = h.state();
            let (d, src, dst) = st.decide_move_start_to(node, index, class, exact)?;
            let (claims, seq) = h.commit_logged(&mut st, d, h.now_ms());
            (src, dst, claims, seq)
        };
        // The fence goes out once the move is in the log (a restart that
        // forgot the move would serve the block at its old generation,
        // which the source then refuses), and it must land before the
        // copy: once acknowledged, no write with an older generation can
        // reach the source block.
        let fenced = async {
            h.durable(seq).await?;
            let mut by: BTreeMap<String, Vec<BlockClaim>> = BTreeMap::new();
            for c in fence_claims {
                by.entry(c.addr.clone()).or_default().push(c);
            }
            let mut ok = Ok(());
            for (addr, claims) in by {
                if let Err(e) = h.deliver(&addr, &claims).await {
                    ok = Err(e);
                }
            }
            ok
        }
        .await;
        let copied = match fenced {
            Ok(()) => {
                let req = StoreRequest::Copy {
                    block: dst.block,
                    gen: dst.gen,
                    cap: dst.cap,
                    src_addr: src.addr.clone(),
                    src_block: src.block,
                    src_gen: src.gen,
                    src_cap: src.cap,
                };
                let mut buf = BytesMut::new();
                req.encode(&mut buf);
                h.copies.call(&dst.addr, req.op(), &[&buf]).await.map(drop)
            }
            Err(e) => Err(e),
        };
        if let Err(e) = &copied {
            tracing::warn!(
                "moving {} failed: {e}",
                crate::state::move_name(node, index)
            );
        }
        let (claims, seq) = {
            let mut st = h.state();
            match st.decide_move_end(node, index, copied.is_ok()) {
                Some(d) => h.commit_logged(&mut st, d, h.now_ms()),
                None => (Vec::new(), 0),
            }
        };
        // Likewise: the freed block's claim only once the switch is logged.
        h.durable(seq).await?;
        h.send_claims(claims).await;
        copied
    }

    /// Ends the sessions whose lease lapsed and removes what has expired
    /// at `now` (`docs/lifecycle.md`), what a session bound among it, a
    /// bounded decision at a time, until nothing is due: the shell does
    /// this before each request under the same lock, so no request sees a
    /// node past its expiry or its session. Returns the claims and the
    /// last log record written (0: none).
    pub(crate) fn expire_due(&self, st: &mut MetaState, now: u64) -> (Vec<BlockClaim>, u64) {
        let mut claims = Vec::new();
        let mut seq = 0;
        while let Some(d) = st.decide_session_lapse(now) {
            let n = d.notes().sessions_lapsed();
            self.session_removed.fetch_add(
                d.notes().session_removed(),
                std::sync::atomic::Ordering::Relaxed,
            );
            tracing::info!(
                "{n} session(s) lapsed: their clients stopped renewing; what they bound is removed"
            );
            let (c, s) = self.commit_logged(st, d, now);
            self.sessions_lapsed
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            claims.extend(c);
            seq = s;
        }
        while let Some(d) = st.decide_expiry(now) {
            let n = d.notes().expired();
            let (c, s) = self.commit_logged(st, d, now);
            self.expired
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            claims.extend(c);
            seq = s;
        }
        (claims, seq)
    }

    /// Reaps removed subtrees, a bounded step per lock hold, until none is
    /// left or `budget` has passed; returns whether some are left.
    pub(crate) async fn reap_for(&self, budget: Duration) -> bool {
        let started = Instant::now();
        while self.reap_step(REAP_NODES).await {
            if started.elapsed() >= budget {
                return true;
            }
            tokio::task::yield_now().await;
        }
        false
    }

    /// The background reaper's round: while requests are coming in (one
    /// in the last [`BUSY_MS`]), one short step, so that a request that
    /// finds the state held waits tens of microseconds, not a full step
    /// (other clients' latency while a big expired or removed subtree is
    /// reaped, `docs/benchmarks.md`); else full steps for a while.
    /// Returns whether some are left (the caller pauses before the next
    /// round).
    pub(crate) async fn reap_round(&self) -> bool {
        let last = self
            .last_request_ms
            .load(std::sync::atomic::Ordering::Relaxed);
        if self.now_ms().saturating_sub(last) < BUSY_MS {
            self.reap_step(REAP_BUSY_NODES).await
        } else {
            self.reap_for(Duration::from_millis(50)).await
        }
    }

    /// One reaping step of at most `max_nodes` nodes; whether some are
    /// left.
    async fn reap_step(&self, max_nodes: usize) -> bool {
        let (claims, left) = {
            let mut st = self.state();
            let Some(d) = st.decide_reap_up_to(max_nodes) else {
                return false;
            };
            let claims = self.commit(&mut st, d, self.now_ms());
            (claims, !st.ns().graveyard_is_empty())
        };
        self.send_claims(claims).await;
        left
    }
}

/// Requests within this many milliseconds make the background reaper take
/// [`REAP_BUSY_NODES`] at a time.
const BUSY_MS: u64 = 5;
/// Nodes a background reaping step drops while requests are coming in:
/// about 50 µs of holding the state (a node is about 1.7 µs to drop, 2-vCPU
/// VM), with a pause of a millisecond after each (some 30,000 nodes a
/// second under load, all the reaper can get when idle).
const REAP_BUSY_NODES: usize = 32;

/// Who reaps after a request: it, the background reaper, or nobody.
enum Reap {
    Now,
    Background,
    Nothing,
}

/// The graveyard held `before` removed subtrees when the request was
/// decided and holds `after` now.
fn reap_after(after: usize, before: usize) -> Reap {
    if after > before {
        Reap::Now
    } else if after > 0 {
        Reap::Background
    } else {
        Reap::Nothing
    }
}

/// Logs a policy change that was applied.
fn log_policy_change(set: &[(String, String)]) {
    if !set.is_empty() {
        let changes: Vec<String> = set.iter().map(|(k, v)| format!("{k}={v}")).collect();
        tracing::info!("policy changed: {}", changes.join(" "));
    }
}

/// Busy-poll budget of the metadata server waiting for a storage server's
/// answer to its claims: `NK_POLL_SPIN_US` if set, else the callers'
/// default on a machine of four CPUs or more, else none.
///
/// A replacing put's close waits on that answer inside the request, while
/// its client spins on its own reply: with the storage server on the same
/// host, the chain has three threads that want a CPU at once. On two CPUs
/// a spinning metadata server took the CPU the storage server needed to
/// answer, and about a third of puts paid 150-250 µs more (`nk bench
/// putkey --keys 1000`, 1 KiB: p90 212-285 µs spinning, 100-158 µs
/// parked; 9.3-9.6 k against 10.0-12.3 k puts/s; docs/benchmarks.md,
/// the YCSB section).
fn claim_spin() -> Duration {
    if std::env::var_os("NK_POLL_SPIN_US").is_some() {
        return nodekernel_rpc::default_call_spin();
    }
    match std::thread::available_parallelism() {
        Ok(n) if n.get() >= 4 => nodekernel_rpc::default_call_spin(),
        _ => Duration::ZERO,
    }
}

/// A storage server in the same process as this metadata server (the
/// one-process cluster of `nk up`), which takes claims by a call instead of
/// a request over a socket ([`crate::MetaServer::add_local_store`]): a
/// replacing put or a delete then waits for no round trip before its
/// reply.
pub trait LocalStore: Send + Sync {
    /// Handles `claims` as a `Claim` request to the server would (the same
    /// checks, the same effects), or `None` when the server no longer
    /// serves (the claims then go over the network, as to any server).
    fn claim<'a>(&'a self, claims: &'a [Claim]) -> ClaimFuture<'a>;
}

/// What [`LocalStore::claim`] returns.
pub type ClaimFuture<'a> = BoxFuture<'a, Option<Result<()>>>;

impl MetaHandler {
    /// Sends one server's claims in batches of at most [`MAX_CLAIM_BATCH`]:
    /// by a call when the server is in this process, else as requests,
    /// each bounded by the claim timeout.
    async fn deliver(&self, addr: &str, claims: &[BlockClaim]) -> Result<()> {
        for chunk in claims.chunks(MAX_CLAIM_BATCH) {
            let claims: Vec<Claim> = chunk
                .iter()
                .map(|c| Claim {
                    block: c.block,
                    gen: c.gen,
                    clear_tag_at: c.clear_tag_at,
                    release: c.release,
                    scrub: c.scrub,
                    cap: c.cap,
                })
                .collect();
            let local = sync::read(&self.local).get(addr).cloned();
            if let Some(store) = local {
                // A DRAM store answers at once, so the timer is never armed.
                match tokio::time::timeout(self.claim_timeout, store.claim(&claims)).await {
                    Ok(Some(r)) => {
                        r?;
                        self.claims_by_call
                            .fetch_add(claims.len() as u64, std::sync::atomic::Ordering::Relaxed);
                        continue;
                    }
                    Ok(None) => {
                        // Stopped: forget it, unless a new server there
                        // took its place meanwhile.
                        let mut local = sync::write(&self.local);
                        if local.get(addr).is_some_and(|s| Arc::ptr_eq(s, &store)) {
                            local.remove(addr);
                        }
                    }
                    Err(_) => {
                        return Err(Error::timeout(format!(
                            "the storage server at {addr} (in this process) did not take \
                             its claims within {:?}",
                            self.claim_timeout
                        )))
                    }
                }
            }
            let n = claims.len() as u64;
            let req = StoreRequest::Claim { claims };
            let mut buf = BytesMut::with_capacity(4 + 16 * chunk.len());
            req.encode(&mut buf);
            self.stores.call(addr, req.op(), &[&buf]).await?;
            self.claims_by_request
                .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    }

    /// Sends claims for the server at `addr` to `store` by a call from now
    /// on (see [`LocalStore`]), in place of any earlier one there.
    pub(crate) fn add_local_store(&self, addr: String, store: Arc<dyn LocalStore>) {
        sync::write(&self.local).insert(addr, store);
    }
}

impl Handler for MetaHandler {
    fn handshake(&self) -> Arc<dyn ServerHandshake> {
        self.handshake.clone()
    }

    /// No metadata request needs more than a few KiB: a larger frame is
    /// refused from its header, before any of it is buffered.
    fn max_payload(&self, op: u16) -> usize {
        nodekernel_proto::meta::max_request_len(op)
    }

    /// A tenant's connection may make every request but the members'
    /// ([`crate::tenant::tenant_may`]), within its root.
    fn tenant_may(&self, op: u16) -> bool {
        crate::tenant::tenant_may(op)
    }

    async fn handle(&self, op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        self.handle_as(None, op, payload, out).await
    }

    async fn handle_reply(&self, op: u16, payload: Bytes, reply: &mut Reply) -> Result<()> {
        let tenant = match reply.tenant() {
            None => None,
            Some(name) => Some(self.tenants.get(name).ok_or_else(|| {
                Error::unauthenticated(format!("tenant {name} is not configured here"))
            })?),
        };
        self.handle_as(tenant, op, payload, reply.out()).await
    }
}

impl MetaHandler {
    /// Handles one request of `tenant`'s connection, or a member's.
    async fn handle_as(
        &self,
        tenant: Option<&Tenant>,
        op: u16,
        payload: Bytes,
        out: &mut BytesMut,
    ) -> Result<()> {
        let started = Instant::now();
        let result = self.serve(tenant, op, payload, out).await;
        let name = nodekernel_proto::meta::op::name(op);
        self.requests.observe(name, started.elapsed());
        result
    }

    /// Handles one request (see [`Handler::handle`]); a tenant's is
    /// checked and mapped into its root first, and its reply and error
    /// mapped back ([`crate::tenant`]).
    async fn serve(
        &self,
        tenant: Option<&Tenant>,
        op: u16,
        payload: Bytes,
        out: &mut BytesMut,
    ) -> Result<()> {
        let req = MetaRequest::decode(op, &payload)?;
        self.log_ok()?;
        if let MetaRequest::Register(spec) = &req {
            self.vet_registration(spec).await?;
        }
        let now = self.now_ms();
        self.last_request_ms
            .store(now, std::sync::atomic::Ordering::Relaxed);
        let (reply, notes, claims, reap, seq) = {
            let mut st = self.state();
            let (mut claims, expired) = self.expire_due(&mut st, now);
            let graves = st.ns().graveyard_len();
            let admitted = match tenant {
                Some(t) => tenant::admit(t, &req, &st).map(Some),
                None => Ok(None),
            };
            let outcome = match &admitted {
                Ok(a) => st.execute(a.as_ref().map_or(&req, |a| &a.req), now),
                Err(e) => Err(e.clone()),
            };
            match outcome {
                Ok(o) => {
                    let seq = match &self.journal {
                        Some(j) => log_effects(j, &o.effects).map_err(log_failed)?,
                        None => 0,
                    };
                    let reap = reap_after(st.ns().graveyard_len(), graves);
                    claims.extend(st.take_claims());
                    let reply = match (tenant, admitted) {
                        (Some(t), Ok(Some(a))) => Ok((o.reply, Some((t, a)))),
                        _ => Ok((o.reply, None)),
                    };
                    (reply, o.notes, claims, reap, seq)
                }
                Err(e) => {
                    if e.code == nodekernel_proto::ErrorCode::QuotaExceeded {
                        self.count_quota_refusal(&e);
                    }
                    let seen = self.journal.as_ref().map_or(expired, Journal::last);
                    let reap = reap_after(st.ns().graveyard_len(), graves);
                    let e = match tenant {
                        Some(t) => tenant::own_error(t, e),
                        None => e,
                    };
                    (Err(e), Notes::default(), claims, reap, seen)
                }
            }
        };
        // Nothing is answered, not even a refusal, before what it saw is
        // durable — except the create of a put.
        if reply_waits(&req) {
            self.durable(seq).await?;
        }
        // Claims go out before the reply, so once a delete or a replacing
        // put returns, old handles get Stale.
        self.send_claims(claims).await;
        let reply = reply.map(|(r, view)| {
            let r = self.with_log(r);
            match view {
                Some((t, a)) => tenant::own_reply(t, a, r),
                None => r,
            }
        });
        if notes.session_removed() > 0 {
            self.session_removed.fetch_add(
                notes.session_removed(),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        if notes.wakes_drainer() {
            self.drain.notify_one();
        }
        if let Some(changes) = notes.policy_changes() {
            log_policy_change(changes);
        }
        match reap {
            // This request's removal: reap a while before its reply (its
            // own back-pressure), the rest in the background.
            Reap::Now => {
                if self.reap_for(Duration::from_millis(200)).await {
                    self.reap.notify_one();
                }
            }
            // Another's (or an expiry's, which belongs to no request): the
            // background reaper's, so no unrelated request waits on it.
            Reap::Background => self.reap.notify_one(),
            Reap::Nothing => {}
        }
        reply?.encode(out);
        Ok(())
    }
}

impl MetaHandler {
    /// The checks a registration of `spec` passes before it is decided,
    /// unless it only repeats the registration in force: the server
    /// registering proves that it serves at the address it registers,
    /// under the key it registers; and no server that the registration
    /// would retire or move (the same identity, or the same address)
    /// proves that it still serves at its registered address under its
    /// key. So no request, authenticated or not, can retire a live server
    /// or take over its blocks (`docs/security.md`). A server that cannot
    /// be reached counts as gone: a new process on its address, or on its
    /// identity after a restart, takes its place as before.
    async fn vet_registration(&self, spec: &ServerSpec) -> Result<()> {
        let displaced = {
            let st = self.state();
            if st.alloc().is_registered(spec) {
                return Ok(());
            }
            st.alloc().displaced_by(spec)
        };
        let addr = &spec.addr;
        let theirs = self.identify(addr).await.map_err(|e| {
            Error::unavailable(format!(
                "cannot reach the storage server registering at {addr} to check that it \
                 serves there: {e}"
            ))
        })?;
        if !theirs.proves(spec) {
            tracing::warn!(
                "refused the registration of identity {} at {addr}: the server answering there \
                 did not prove the key it registers",
                spec.identity
            );
            return Err(Error::invalid_argument(format!(
                "the server answering at {addr} is not the storage server registering there \
                 (identity {}): a storage server registers the address it serves on (check its \
                 advertised address)",
                spec.identity
            )));
        }
        for old in displaced {
            let alive = match self.identify(&old.addr).await {
                Ok(a) => a.proves(&old),
                Err(_) => false,
            };
            if alive {
                tracing::warn!(
                    "refused the registration of identity {} (incarnation {}) at {addr}: the \
                     storage server it would replace (identity {}, incarnation {}) still serves \
                     at {}",
                    spec.identity,
                    spec.incarnation,
                    old.identity,
                    old.incarnation,
                    old.addr
                );
                return Err(Error::already_exists(format!(
                    "storage server {} (incarnation {}) still serves at {} and proved it: a \
                     registration with its identity or address cannot replace it while it runs",
                    old.identity, old.incarnation, old.addr
                )));
            }
        }
        Ok(())
    }

    /// Asks the storage server at `addr` who it is, with a fresh challenge.
    async fn identify(&self, addr: &str) -> Result<Identified> {
        let mut nonce = [0u8; IDENTIFY_NONCE_LEN];
        nodekernel_rpc::random_bytes(&mut nonce)
            .map_err(|e| Error::internal(format!("no random bytes from the kernel: {e}")))?;
        let req = StoreRequest::Identify { nonce };
        let mut buf = BytesMut::new();
        req.encode(&mut buf);
        let reply = self.stores.call(addr, req.op(), &[&buf]).await?;
        Ok(Identified {
            nonce,
            answer: Identity::decode(&reply)?,
        })
    }
}

/// A storage server's answer to a challenge.
struct Identified {
    nonce: [u8; IDENTIFY_NONCE_LEN],
    answer: Identity,
}

impl Identified {
    /// Whether the answer came from the process that registered `spec`.
    fn proves(&self, spec: &ServerSpec) -> bool {
        let a = &self.answer;
        a.identity == spec.identity
            && a.incarnation == spec.incarnation
            && verify_identify(
                &spec.cap_key,
                &self.nonce,
                &a.identity,
                a.incarnation,
                &a.proof,
            )
    }
}

impl MetaHandler {
    /// The moves of `batch` that still apply (`keep`, under the lock).
    pub(crate) fn still<T: Copy>(
        &self,
        batch: &[T],
        keep: impl Fn(&MetaState, &T) -> bool,
    ) -> Vec<T> {
        let st = self.state();
        batch.iter().copied().filter(|m| keep(&st, m)).collect()
    }

    /// Runs the block moves of `batch` at once, each paced by `move_rate`;
    /// `what` gives each one's (node, index, class, exact). Returns every
    /// move with its outcome.
    pub(crate) async fn run_moves<T: Copy + Send + 'static>(
        self: &Arc<Self>,
        batch: Vec<T>,
        what: impl Fn(T) -> (u64, u64, u8, bool),
    ) -> Vec<(T, Result<()>)> {
        let mut moves = tokio::task::JoinSet::new();
        for m in batch {
            let (node, index, class, exact) = what(m);
            let h = self.clone();
            moves.spawn(async move {
                h.pace().await;
                (m, h.move_block_to(node, index, class, exact).await)
            });
        }
        let mut done = Vec::new();
        while let Some(r) = moves.join_next().await {
            if let Ok(r) = r {
                done.push(r);
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::{reap_after, Reap};

    #[test]
    fn a_request_reaps_inline_only_what_it_removed() {
        // Its own removal: reaped a while before its reply.
        assert!(matches!(reap_after(1, 0), Reap::Now));
        assert!(matches!(reap_after(3, 2), Reap::Now));
        // An expiry's or another request's: the background reaper's.
        assert!(matches!(reap_after(2, 2), Reap::Background));
        assert!(matches!(reap_after(1, 2), Reap::Background));
        assert!(matches!(reap_after(0, 0), Reap::Nothing));
    }
}
