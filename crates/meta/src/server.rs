//! The async shell around [`MetaState`]: decodes requests, decides and
//! applies them under a lock, sends the block claims their effects need,
//! encodes replies, and runs the ticker (liveness, retirement, sweeping
//! after vanished writers, reaping removed subtrees, retrying claims).
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
use crate::effect::Effect;
use crate::state::{Decision, MetaState, Placement};
use bytes::{Bytes, BytesMut};
use nodekernel_journal::{Fsync, Journal, JournalError};
use nodekernel_proto::cap::verify_identify;
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::store::{Claim, Identity, StoreRequest, IDENTIFY_NONCE_LEN, MAX_CLAIM_BATCH};
use nodekernel_proto::sync;
use nodekernel_proto::Result;
use nodekernel_proto::ServerSpec;
use nodekernel_proto::{Error, LogStatus};
use nodekernel_rpc::{
    bind_abstract_unix, serve_unix, serve_with, ConnOptions, ConnectionPool, Handler, Role,
    ServeOptions, ServerHandle, ServerHandshake, VersionHandshake,
};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// Most claims kept for storage servers that did not acknowledge them; the
/// oldest are dropped beyond it (with a warning: their blocks stay safe,
/// only the early `Stale` of old handles is lost).
pub const MAX_PENDING_CLAIMS: usize = 1 << 20;

/// Settings of one metadata server.
#[derive(Debug, Clone)]
pub struct MetaConfig {
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    pub listen: String,
    /// Block size every storage server must export.
    pub block_size: u32,
    /// A writer that neither syncs nor allocates for this long loses its lease
    /// to the next writer that asks.
    pub lease_timeout: Duration,
    /// A storage server silent for this long is declared dead.
    pub dead_after: Duration,
    /// A storage server dead for this long is retired: its blocks are lost
    /// for good and it leaves status and capacity.
    pub retire_after: Duration,
    /// How long a reply waits for the block claims of its effects.
    pub claim_timeout: Duration,
    /// Names and prices of the storage classes (shown in status).
    pub classes: Vec<nodekernel_proto::ClassInfo>,
    /// How long an idle connection busy-polls for the next request.
    pub poll_spin: Duration,
    /// Also listen on an abstract Unix socket, which clients on the same
    /// host use instead of TCP (a shorter round trip).
    pub unix_socket: bool,
    /// This server's partition among the metadata servers, and the live
    /// storage servers it waits for before it calls itself ready.
    pub placement: Placement,
    /// Keep the namespace across restarts (`None`: volatile, the default).
    pub persistence: Option<Persistence>,
    /// Tier migration and placement settings, changed at runtime by
    /// `MetaRequest::Policy`; `move_rate` there also paces drains.
    pub tiering: crate::tier::TierSettings,
    /// Address of the admin HTTP endpoint (`/metrics`, `/status`,
    /// `/healthz`, `/readyz`, the dashboard); `None`: none.
    pub admin: Option<String>,
    /// Who may connect: the cluster token every connection (in and out)
    /// proves, and the local users of the Unix socket. Default: no token,
    /// the server's own user.
    pub security: nodekernel_rpc::Security,
    /// How long a block location handed to a client may be used
    /// (`docs/security.md`, *Data-plane capabilities*); whole seconds, at
    /// least one.
    pub cap_lifetime: Duration,
}

/// Where and how a persistent metadata server keeps its operation log.
#[derive(Debug, Clone)]
pub struct Persistence {
    /// The server's own directory; the log lives in `journal/` inside it.
    pub dir: PathBuf,
    /// When log records reach stable storage (see `docs/persistence.md`).
    pub fsync: Fsync,
    /// A checkpoint is written once the log has grown by this many bytes
    /// since the last one (the log before it is then deleted).
    pub checkpoint_bytes: u64,
}

/// What one checkpoint wrote.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointStats {
    pub nodes: u64,
    /// Bytes of encoded state.
    pub bytes: u64,
    /// The last log record it holds.
    pub covered: u64,
    /// Log records replayed onto the previous checkpoint to build it.
    pub replayed: u64,
    /// How long it took in all (in the background: requests never wait).
    pub took: Duration,
}

/// Prefix of a metadata server's abstract socket name.
pub const LOCAL_SOCKET_PREFIX: &str = "nodekernel-meta-";

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            listen: "127.0.0.1:9060".into(),
            block_size: nodekernel_proto::DEFAULT_BLOCK_SIZE,
            lease_timeout: Duration::from_secs(30),
            dead_after: Duration::from_secs(10),
            retire_after: Duration::from_secs(60),
            claim_timeout: Duration::from_secs(1),
            classes: Vec::new(),
            poll_spin: nodekernel_rpc::default_spin(),
            unix_socket: true,
            placement: Placement::default(),
            persistence: None,
            tiering: crate::tier::TierSettings::default(),
            admin: None,
            security: Default::default(),
            cap_lifetime: Duration::from_secs(nodekernel_proto::cap::CAP_LIFETIME_SECS),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// The cause is part of the message (and not a `source()`), so a
    /// printed chain names the OS error once.
    #[error("cannot listen on {addr}: {error}")]
    Bind { addr: String, error: std::io::Error },
    #[error("invalid metadata server setting {key}: {reason}")]
    Config { key: &'static str, reason: String },
    #[error(transparent)]
    Rpc(#[from] nodekernel_proto::Error),
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The log lost records it held on stable storage
    /// ([`JournalError::Lost`]; `dir` is the server's directory): the
    /// server does not start.
    #[error("{error}. Refusing to start with part of the namespace in {}: restore the log from a backup; or, to go on with the records that are left, remove {} (every change after record {ends} is lost); or move {} away to start an empty namespace", dir.display(), dir.join(crate::floor::FILE).display(), dir.display())]
    LogLost {
        error: Box<JournalError>,
        ends: u64,
        dir: PathBuf,
    },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Admin(#[from] nodekernel_admin::AdminError),
}

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
    /// Wakes the reaper.
    reap: Notify,
    /// Wakes the drainer (a drain was asked for).
    drain: Notify,
    /// When the block mover may start its next copy: drains and
    /// migration share `move_rate`.
    next_move: std::sync::Mutex<Instant>,
    /// The operation log, when persistent.
    journal: Option<Journal>,
    persistence: Option<Persistence>,
    /// A checkpoint is being written.
    checkpointing: std::sync::atomic::AtomicBool,
    /// The last log record the newest checkpoint holds.
    checkpointed: std::sync::atomic::AtomicU64,
    /// Requests handled, by type (the admin endpoint's metrics).
    pub(crate) requests: nodekernel_admin::metrics::RequestMetrics,
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
fn log_effects(journal: &Journal, effects: &[Effect]) -> Result<u64, JournalError> {
    if effects.is_empty() {
        return Ok(journal.last());
    }
    let mut rec = BytesMut::new();
    crate::codec::encode_effects(effects, &mut rec);
    journal.append(&rec)
}

impl MetaHandler {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub(crate) fn state(&self) -> std::sync::MutexGuard<'_, MetaState> {
        sync::lock(&self.state)
    }

    /// Applies a decision taken under the same lock, logs it, and returns
    /// its claims. Nobody waits for these decisions (the ticker's, the
    /// reaper's), so nobody waits for the log either: a restart decides
    /// them again; a failed write stops the server (see [`log_failed`]).
    fn commit(&self, st: &mut MetaState, d: Decision, now: u64) -> Vec<BlockClaim> {
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
        log_policy_change(set);
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
    async fn checkpoint(&self) -> Result<Option<CheckpointStats>, MetaError> {
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
    async fn send_claims(&self, claims: Vec<BlockClaim>) {
        if claims.is_empty() {
            return;
        }
        let mut by_addr: BTreeMap<String, Vec<BlockClaim>> = BTreeMap::new();
        for c in claims {
            by_addr.entry(c.addr.clone()).or_default().push(c);
        }
        let sends = by_addr.into_iter().map(|(addr, claims)| async move {
            if let Err(e) = deliver(&self.stores, &addr, &claims).await {
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
    async fn retry_pending(&self) {
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
    async fn balloon_freed(&self) {
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
                if let Err(e) = deliver(&h.stores, &addr, &claims).await {
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

    /// Reaps removed subtrees, a bounded step per lock hold, until none is
    /// left or `budget` has passed; returns whether some are left.
    async fn reap_for(&self, budget: Duration) -> bool {
        let started = Instant::now();
        loop {
            let claims = {
                let mut st = self.state();
                let Some(d) = st.decide_reap() else {
                    return false;
                };
                self.commit(&mut st, d, self.now_ms())
            };
            self.send_claims(claims).await;
            if started.elapsed() >= budget {
                return true;
            }
            tokio::task::yield_now().await;
        }
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

/// Sends one server's claims in batches of at most [`MAX_CLAIM_BATCH`].
async fn deliver(pool: &ConnectionPool, addr: &str, claims: &[BlockClaim]) -> Result<()> {
    for chunk in claims.chunks(MAX_CLAIM_BATCH) {
        let req = StoreRequest::Claim {
            claims: chunk
                .iter()
                .map(|c| Claim {
                    block: c.block,
                    gen: c.gen,
                    clear_tag_at: c.clear_tag_at,
                    release: c.release,
                    scrub: c.scrub,
                    cap: c.cap,
                })
                .collect(),
        };
        let mut buf = BytesMut::with_capacity(4 + 16 * chunk.len());
        req.encode(&mut buf);
        pool.call(addr, req.op(), &[&buf]).await?;
    }
    Ok(())
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

    async fn handle(&self, op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        let started = Instant::now();
        let result = self.serve(op, payload, out).await;
        let name = nodekernel_proto::meta::op::name(op);
        self.requests.observe(name, started.elapsed());
        result
    }
}

impl MetaHandler {
    /// Handles one request (see [`Handler::handle`]).
    async fn serve(&self, op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        let req = MetaRequest::decode(op, &payload)?;
        self.log_ok()?;
        if let MetaRequest::Register(spec) = &req {
            self.vet_registration(spec).await?;
        }
        let now = self.now_ms();
        let (reply, claims, reap, seq) = {
            let mut st = self.state();
            match st.execute(&req, now) {
                Ok(o) => {
                    if let MetaRequest::Heartbeat {
                        server, traffic, ..
                    } = &req
                    {
                        st.alloc_soft().set_traffic(*server, *traffic);
                    }
                    let seq = match &self.journal {
                        Some(j) => log_effects(j, &o.effects).map_err(log_failed)?,
                        None => 0,
                    };
                    let reap = !st.ns().graveyard_is_empty();
                    (Ok(o.reply), st.take_claims(), reap, seq)
                }
                Err(e) => {
                    let seen = self.journal.as_ref().map_or(0, Journal::last);
                    (Err(e), Vec::new(), false, seen)
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
        let reply = reply.map(|r| self.with_log(r));
        if matches!(
            req,
            MetaRequest::Drain { cancel: false, .. } | MetaRequest::Resize { .. }
        ) {
            self.drain.notify_one();
        }
        if let (MetaRequest::Policy { set }, Ok(_)) = (&req, &reply) {
            log_policy_change(set);
        }
        if reap {
            // A big removal: reap a while now, the rest in the background.
            if self.reap_for(Duration::from_millis(200)).await {
                self.reap.notify_one();
            }
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

/// A running metadata server.
pub struct MetaServer {
    handle: ServerHandle,
    /// The abstract Unix socket server, for clients on this host.
    local: Option<ServerHandle>,
    tasks: Vec<JoinHandle<()>>,
    handler: Arc<MetaHandler>,
    /// The admin HTTP endpoint, when configured.
    admin: Option<nodekernel_admin::AdminServer>,
}

impl MetaServer {
    pub async fn start(cfg: MetaConfig) -> Result<MetaServer, MetaError> {
        let bs = cfg.block_size;
        if !bs.is_power_of_two() || !(4096..=nodekernel_proto::MAX_BLOCK_SIZE).contains(&bs) {
            return Err(MetaError::Config {
                key: "block_size",
                reason: format!(
                    "{bs} must be a power of two between 4 KiB and {} MiB",
                    nodekernel_proto::MAX_BLOCK_SIZE >> 20
                ),
            });
        }
        let p = cfg.placement;
        if p.partitions == 0 || p.partition >= p.partitions {
            return Err(MetaError::Config {
                key: "partition",
                reason: format!(
                    "partition {} of {} does not exist (partitions are numbered from 0)",
                    p.partition, p.partitions
                ),
            });
        }
        let listener = TcpListener::bind(&cfg.listen)
            .await
            .map_err(|error| MetaError::Bind {
                addr: cfg.listen.clone(),
                error,
            })?;
        let first_gen = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1);
        let mut state = MetaState::new(bs, cfg.lease_timeout.as_millis() as u64, first_gen);
        let epoch = Instant::now();
        state.set_cap_clock(first_gen / 1000, cfg.cap_lifetime.as_secs().max(1));
        state.set_classes(cfg.classes.clone());
        state.set_placement(cfg.placement);
        state.set_tier_settings(cfg.tiering.clone());
        let (journal, covered) = match &cfg.persistence {
            Some(p) => {
                let (j, covered) = recover(&mut state, p)?;
                (Some(j), covered)
            }
            None => (None, 0),
        };
        let handler = Arc::new(MetaHandler {
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
            reap: Notify::new(),
            drain: Notify::new(),
            next_move: std::sync::Mutex::new(Instant::now()),
            journal,
            persistence: cfg.persistence.clone(),
            checkpointing: Default::default(),
            checkpointed: covered.into(),
            requests: Default::default(),
        });
        let opts = ServeOptions {
            spin: cfg.poll_spin,
            local_peers: cfg.security.local_peers,
            ..ServeOptions::default()
        };
        let handle = serve_with(listener, handler.clone(), opts)?;
        // The Unix socket is an optimisation: without it, local clients
        // simply use TCP.
        let local = if cfg.unix_socket {
            match bind_abstract_unix(LOCAL_SOCKET_PREFIX) {
                Ok((name, l)) => {
                    let h = serve_unix(l, handler.clone(), opts)?;
                    handler.state().set_local_socket(name);
                    Some(h)
                }
                Err(e) => {
                    tracing::warn!(
                        "cannot listen on an abstract Unix socket ({e}); local clients use TCP"
                    );
                    None
                }
            }
        } else {
            None
        };
        let tasks = vec![
            tokio::spawn(ticker(handler.clone(), cfg.clone())),
            tokio::spawn(reaper(handler.clone())),
            tokio::spawn(drainer(handler.clone())),
            tokio::spawn(migrator(handler.clone())),
        ];
        // `nk meta` prints the address itself; an embedding program asks
        // `local_addr`.
        tracing::debug!("metadata server listening on {}", handle.local_addr());
        let mut server = MetaServer {
            handle,
            local,
            tasks,
            handler,
            admin: None,
        };
        // Dropping `server` on failure stops what started above.
        if let Some(addr) = cfg.admin.as_deref() {
            let source = crate::admin::MetaAdmin::new(
                server.handler.clone(),
                server.local_addr().to_string(),
            );
            server.admin =
                Some(nodekernel_admin::AdminServer::start(addr, Arc::new(source)).await?);
        }
        Ok(server)
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.handle.local_addr()
    }

    /// The admin HTTP endpoint's address, when it has one
    /// ([`MetaConfig::admin`]).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|a| a.local_addr())
    }

    /// The abstract Unix socket name local clients may use, if listening.
    pub fn local_socket(&self) -> Option<String> {
        self.local.as_ref()?;
        let name = self.with_state(|st| st.local_socket().to_string());
        Some(name)
    }

    /// Runs `f` on the state (for tests and embedding).
    pub fn with_state<R>(&self, f: impl FnOnce(&mut MetaState) -> R) -> R {
        f(&mut self.handler.state())
    }

    /// Writes a checkpoint now (see `docs/persistence.md`); `None` without
    /// persistence or while another one is being written.
    pub async fn checkpoint(&self) -> Result<Option<CheckpointStats>, MetaError> {
        self.handler.checkpoint().await
    }

    /// Moves block `index` of node `node` to another storage server (of
    /// storage class `class`, or any class with
    /// [`NO_CLASS`](nodekernel_proto::NO_CLASS)) while clients
    /// keep reading and writing it:
    /// 1. the block is fenced with a new generation (writers of the old one
    ///    get `Stale` and look the block up again, which answers `TryAgain`
    ///    while the move runs) and a target block is reserved;
    /// 2. the target storage server copies the block from the source
    ///    (`StoreRequest::Copy`; the bytes never pass through this server);
    /// 3. the node's block map switches to the target and the old block is
    ///    freed and claimed, so every old location is refused.
    ///
    /// If the copy fails, or the block changed meanwhile (freed, fenced
    /// again by a new writer), the target is given up and the block stays.
    /// With `node` = [`SLAB_MOVE`](crate::state::SLAB_MOVE) and `index` =
    /// [`slab_move_index`](crate::state::slab_move_index), a whole slab
    /// moves, and every small value in it follows.
    ///
    /// The building block of migration and drain.
    pub async fn move_block(&self, node: u64, index: u64, class: u8) -> Result<()> {
        self.handler.move_block(node, index, class).await
    }

    pub fn shutdown(&self) {
        self.handle.shutdown();
        if let Some(a) = &self.admin {
            a.shutdown();
        }
        if let Some(l) = &self.local {
            l.shutdown();
        }
        for t in &self.tasks {
            t.abort();
        }
        // Requests still in flight get `Unavailable`; the log is synced and
        // its directory free for the next start.
        if let Some(j) = &self.handler.journal {
            if let Err(e) = j.close() {
                tracing::error!("closing the operation log: {e}");
            }
        }
    }
}

impl Drop for MetaServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Rebuilds `state` from the checkpoint and the operation log in `p.dir`,
/// logs the restart decision, and returns the open log and the last record
/// the checkpoint holds.
fn recover(state: &mut MetaState, p: &Persistence) -> Result<(Journal, u64), MetaError> {
    let started = Instant::now();
    // Private, like every directory NodeKernel creates (an existing one
    // keeps its mode).
    std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
        .create(&p.dir)
        .map_err(|e| MetaError::Config {
            key: "data_dir",
            reason: format!("cannot create {}: {e}", p.dir.display()),
        })?;
    let bs = state.alloc().block_size();
    let (checkpointed, covered) = match checkpoint::read(&p.dir, state.lease_ms(), 0)? {
        Some((mut restored, covered)) => {
            if restored.alloc().block_size() != bs {
                return Err(MetaError::Config {
                    key: "block_size",
                    reason: format!(
                        "{bs} differs from the {}-byte blocks of the cluster in {}",
                        restored.alloc().block_size(),
                        p.dir.display()
                    ),
                });
            }
            restored.set_classes(state.classes().to_vec());
            restored.set_placement(state.placement());
            restored.set_tier_settings(state.tier_settings().clone());
            *state = restored;
            (state.ns().len(), covered)
        }
        None => (0, 0),
    };
    let dir = p.dir.join("journal");
    let floor = crate::floor::read(&p.dir);
    let (journal, rec) = Journal::open(&dir, p.fsync, covered, floor, |_, record| {
        state.replay(record).map_err(|e| e.to_string())
    })
    .map_err(|error| match error {
        JournalError::Lost { ends, .. } => MetaError::LogLost {
            error: Box::new(error),
            ends,
            dir: p.dir.clone(),
        },
        e => e.into(),
    })?;
    if let Some((_, s)) = state
        .alloc()
        .servers()
        .find(|(_, s)| s.spec.block_size != bs)
    {
        return Err(MetaError::Config {
            key: "block_size",
            reason: format!(
                "{bs} differs from the {}-byte blocks of the cluster in {} (storage server {} registered with them)",
                s.spec.block_size,
                p.dir.display(),
                s.spec.addr
            ),
        });
    }
    state.restarted(0);
    let floor = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(1);
    if let Some(d) = state.decide_restart(floor) {
        let o = state.commit(d, 0);
        log_effects(&journal, &o.effects)?;
        state.take_claims();
    }
    journal.sync()?;
    // From now on this directory holds a namespace: a log found without
    // these records is refused.
    crate::floor::write(&p.dir, journal.synced()).map_err(|e| MetaError::Config {
        key: "data_dir",
        reason: format!(
            "cannot write {}: {e}",
            p.dir.join(crate::floor::FILE).display()
        ),
    })?;
    if covered > 0 || rec.records > 0 {
        tracing::info!(
            "restored {} nodes from {} ({checkpointed} nodes, to log record {covered}) and {} later log records ({:.1} ms)",
            state.ns().len(),
            p.dir.display(),
            rec.records,
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok((journal, covered))
}

/// Liveness, retirement, sweeping after vanished writers, retrying claims.
async fn ticker(h: Arc<MetaHandler>, cfg: MetaConfig) {
    let dead_after = cfg.dead_after.as_millis() as u64;
    let retire_after = cfg.retire_after.as_millis() as u64;
    let lease_ms = cfg.lease_timeout.as_millis() as u64;
    let period = (cfg.dead_after / 4).max(Duration::from_millis(10));
    let mut tick = tokio::time::interval(period);
    // The log's floor as last written (at start) and when.
    let mut floor = (
        h.journal.as_ref().map_or(0, Journal::synced),
        Instant::now(),
    );
    loop {
        tick.tick().await;
        let now = h.now_ms();
        let (dead, retired, swept, claims) = {
            let mut st = h.state();
            let dead = st.alloc_soft().expire(now, dead_after);
            let mut claims = Vec::new();
            let retired = match st.decide_retire(now, retire_after) {
                Some(d) => {
                    let n = d.effects.len();
                    claims.extend(h.commit(&mut st, d, now));
                    n
                }
                None => 0,
            };
            if let Some(d) = st.decide_snapshot_expiry(now) {
                tracing::warn!(
                    "snapshot(s) not used for {} s ended; their held blocks are freed",
                    crate::snapshot::SNAPSHOT_TTL_MS / 1000
                );
                claims.extend(h.commit(&mut st, d, now));
            }
            let swept = match st.decide_sweep(now, lease_ms) {
                Some(d) => {
                    let dropped: usize = d
                        .effects
                        .iter()
                        .map(|e| match e {
                            crate::Effect::Dropped { ids } => ids.len(),
                            _ => 0,
                        })
                        .sum();
                    let lapsed = d
                        .effects
                        .iter()
                        .filter(|e| matches!(e, crate::Effect::LeaseCleared { .. }))
                        .count();
                    claims.extend(h.commit(&mut st, d, now));
                    (dropped, lapsed)
                }
                None => (0, 0),
            };
            (dead, retired, swept, claims)
        };
        for id in dead {
            tracing::warn!(
                "storage server {id} missed heartbeats for {dead_after} ms: declared dead"
            );
        }
        if retired > 0 {
            tracing::warn!(
                "retired {retired} storage server(s) dead for over {retire_after} ms; their blocks are lost"
            );
        }
        let (dropped, lapsed) = swept;
        if dropped + lapsed > 0 {
            tracing::info!(
                "writers gone for over {} ms: dropped {dropped} unclosed put(s); {lapsed} write lease(s) lapsed, the blocks past their published sizes freed",
                2 * lease_ms
            );
        }
        h.send_claims(claims).await;
        h.retry_pending().await;
        if let (Some(j), Some(p)) = (&h.journal, &h.persistence) {
            let synced = j.synced();
            if synced > floor.0 && floor.1.elapsed() >= crate::floor::UPDATE_EVERY {
                let dir = p.dir.clone();
                let written =
                    tokio::task::spawn_blocking(move || crate::floor::write(&dir, synced)).await;
                floor.1 = Instant::now();
                match written {
                    Ok(Ok(())) => floor.0 = synced,
                    Ok(Err(e)) => tracing::warn!(
                        "cannot write {}: {e}",
                        p.dir.join(crate::floor::FILE).display()
                    ),
                    Err(e) => tracing::warn!("writing the log's floor: {e}"),
                }
            }
            if j.segment_bytes() >= p.checkpoint_bytes {
                let h = h.clone();
                // In the background: a big one must not hold up the ticker.
                tokio::spawn(async move {
                    if let Err(e) = h.checkpoint().await {
                        tracing::warn!("checkpoint failed (the log keeps everything): {e}");
                    }
                });
            }
        }
    }
}

/// Reaps removed subtrees in the background, woken after a big removal.
/// Block moves in flight at once for drains.
const DRAIN_MOVES: usize = 4;
/// Blocks one scan of the namespace collects for the drainer (a scan walks
/// every node under the state lock, so it is not done per batch).
const DRAIN_SCAN: usize = 256;

/// Moves the blocks of servers being drained to other servers, at most
/// [`DRAIN_MOVES`] at a time, paced by `move_rate` ([`MetaHandler::pace`]).
/// A failed move is counted and tried again after a pause.
async fn drainer(h: Arc<MetaHandler>) {
    loop {
        h.balloon_freed().await;
        let found = h.state().drain_candidates(DRAIN_SCAN);
        if found.is_empty() {
            // Also woken by a timer: a move given up (or a restart of the
            // target) puts blocks back into the candidates.
            let _ = tokio::time::timeout(Duration::from_millis(500), h.drain.notified()).await;
            continue;
        }
        for batch in found.chunks(DRAIN_MOVES) {
            // What changed since the scan (freed, moved, a drain
            // cancelled) is left out.
            let batch = h.still(batch, |st, (node, index, _, server)| {
                st.drain_still_needs(*node, *index, *server)
            });
            let done = h
                .run_moves(batch, |(node, index, class, _)| (node, index, class, false))
                .await;
            let mut failed = false;
            for ((_, _, _, server), r) in done {
                failed |= r.is_err();
                h.state()
                    .note_drain_move(server, r.map_err(|e| e.to_string()));
            }
            if failed {
                // Scan again after a pause: failures repeat in order.
                tokio::time::sleep(Duration::from_millis(200)).await;
                break;
            }
        }
    }
}

/// How often the migrator looks for work when there was none.
const MIGRATE_IDLE: Duration = Duration::from_millis(500);
/// Block moves one migration scan plans at most.
const MIGRATE_SCAN: usize = 256;

/// Tier migration: asks the policy for moves
/// ([`MetaState::migration_candidates`]) and carries them out with the
/// block mover, [`DRAIN_MOVES`] at a time, paced by `move_rate` like
/// drains. Each move goes into exactly its target class or not at all.
async fn migrator(h: Arc<MetaHandler>) {
    loop {
        let found = {
            let mut st = h.state();
            st.migration_candidates(h.now_ms(), MIGRATE_SCAN)
        };
        if found.is_empty() {
            tokio::time::sleep(MIGRATE_IDLE).await;
            continue;
        }
        let mut failed = false;
        for batch in found.chunks(DRAIN_MOVES) {
            let batch = h.still(batch, |st, m| st.migration_still_wanted(m));
            let done = h.run_moves(batch, |m| (m.node, m.index, m.to, true)).await;
            for (m, r) in done {
                match r {
                    Ok(()) => h.state().note_migration(&m, h.now_ms()),
                    Err(e) => {
                        failed = true;
                        tracing::debug!(
                            "migrating {} from class {} to {}: {e}",
                            crate::state::move_name(m.node, m.index),
                            m.from,
                            m.to
                        );
                    }
                }
            }
        }
        if failed {
            tokio::time::sleep(MIGRATE_IDLE).await;
        }
    }
}

impl MetaHandler {
    /// The moves of `batch` that still apply (`keep`, under the lock).
    fn still<T: Copy>(&self, batch: &[T], keep: impl Fn(&MetaState, &T) -> bool) -> Vec<T> {
        let st = self.state();
        batch.iter().copied().filter(|m| keep(&st, m)).collect()
    }

    /// Runs the block moves of `batch` at once, each paced by `move_rate`;
    /// `what` gives each one's (node, index, class, exact). Returns every
    /// move with its outcome.
    async fn run_moves<T: Copy + Send + 'static>(
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

async fn reaper(h: Arc<MetaHandler>) {
    loop {
        h.reap.notified().await;
        while h.reap_for(Duration::from_millis(50)).await {
            // Let requests in between steps.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
