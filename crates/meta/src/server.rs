//! The async shell around [`MetaState`]: decodes requests, decides and
//! applies them under a lock, sends the block claims their effects need,
//! encodes replies, and runs the ticker (liveness, retirement, sweeping
//! abandoned puts, reaping removed subtrees, retrying claims).
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
use crate::state::{Decision, MetaState, Placement};
use bytes::{Bytes, BytesMut};
use nodekernel_proto::meta::MetaRequest;
use nodekernel_proto::store::{Claim, StoreRequest, MAX_CLAIM_BATCH};
use nodekernel_proto::Result;
use nodekernel_rpc::{
    bind_abstract_unix, serve_unix, serve_with, ConnectionPool, Handler, ServeOptions, ServerHandle,
};
use std::collections::BTreeMap;
use std::net::SocketAddr;
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
}

struct MetaHandler {
    state: Mutex<MetaState>,
    epoch: Instant,
    /// Connections to storage servers for claims: every call (connect
    /// included) is bounded by the claim timeout, so no extra timer runs
    /// per claim (arming one costs a wake-up of the timer thread).
    stores: ConnectionPool,
    /// Connections to storage servers for block copies (longer bound).
    copies: ConnectionPool,
    claim_timeout: Duration,
    /// Claims not acknowledged yet, by storage server address.
    pending: Mutex<BTreeMap<String, Vec<BlockClaim>>>,
    /// Wakes the reaper.
    reap: Notify,
}

impl MetaHandler {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MetaState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies a decision taken under the same lock and returns its claims.
    fn commit(st: &mut MetaState, d: Decision, now: u64) -> Vec<BlockClaim> {
        st.commit(d, now);
        st.take_claims()
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
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
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

    /// Retries the claims storage servers have not acknowledged; claims for
    /// servers that were retired are dropped (their blocks are gone).
    async fn retry_pending(&self) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        if pending.is_empty() {
            return;
        }
        let known: Vec<String> = {
            let st = self.state();
            st.alloc()
                .servers()
                .map(|(_, s)| s.spec.addr.clone())
                .collect()
        };
        let claims: Vec<BlockClaim> = pending
            .into_iter()
            .filter(|(addr, _)| known.contains(addr))
            .flat_map(|(_, c)| c)
            .collect();
        self.send_claims(claims).await;
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
                Self::commit(&mut st, d, self.now_ms())
            };
            self.send_claims(claims).await;
            if started.elapsed() >= budget {
                return true;
            }
            tokio::task::yield_now().await;
        }
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
    async fn handle(&self, op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        let req = MetaRequest::decode(op, &payload)?;
        let now = self.now_ms();
        let (reply, claims, reap) = {
            let mut st = self.state();
            match st.execute(&req, now) {
                Ok(o) => (Ok(o.reply), st.take_claims(), !st.ns().graveyard_is_empty()),
                Err(e) => (Err(e), Vec::new(), false),
            }
        };
        // Claims go out before the reply, so once a delete or a replacing
        // put returns, old handles get Stale.
        self.send_claims(claims).await;
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

/// A running metadata server.
pub struct MetaServer {
    handle: ServerHandle,
    /// The abstract Unix socket server, for clients on this host.
    local: Option<ServerHandle>,
    tasks: Vec<JoinHandle<()>>,
    handler: Arc<MetaHandler>,
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
        state.set_classes(cfg.classes.clone());
        state.set_placement(cfg.placement);
        let handler = Arc::new(MetaHandler {
            state: Mutex::new(state),
            epoch: Instant::now(),
            stores: ConnectionPool::new(cfg.claim_timeout),
            copies: ConnectionPool::new(cfg.dead_after.min(Duration::from_secs(5))),
            claim_timeout: cfg.claim_timeout,
            pending: Mutex::new(BTreeMap::new()),
            reap: Notify::new(),
        });
        let opts = ServeOptions {
            spin: cfg.poll_spin,
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
        ];
        // `nk meta` prints the address itself; an embedding program asks
        // `local_addr`.
        tracing::debug!("metadata server listening on {}", handle.local_addr());
        Ok(MetaServer {
            handle,
            local,
            tasks,
            handler,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.handle.local_addr()
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
    /// The building block of migration and drain.
    pub async fn move_block(&self, node: u64, index: u64, class: u8) -> Result<()> {
        let h = &self.handler;
        let (src, dst, fence_claims) = {
            let mut st = h.state();
            let (d, src, dst) = st.decide_move_start(node, index, class)?;
            (src, dst, MetaHandler::commit(&mut st, d, h.now_ms()))
        };
        // The fence must land before the copy: once acknowledged, no write
        // with an older generation can reach the source block.
        let fenced = {
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
        };
        let copied = match fenced {
            Ok(()) => {
                let req = StoreRequest::Copy {
                    block: dst.block,
                    gen: dst.gen,
                    src_addr: src.addr.clone(),
                    src_block: src.block,
                    src_gen: src.gen,
                };
                let mut buf = BytesMut::new();
                req.encode(&mut buf);
                h.copies.call(&dst.addr, req.op(), &[&buf]).await.map(drop)
            }
            Err(e) => Err(e),
        };
        if let Err(e) = &copied {
            tracing::warn!("moving block {index} of node {node} failed: {e}");
        }
        let claims = {
            let mut st = h.state();
            match st.decide_move_end(node, index, copied.is_ok()) {
                Some(d) => MetaHandler::commit(&mut st, d, h.now_ms()),
                None => Vec::new(),
            }
        };
        h.send_claims(claims).await;
        copied
    }

    pub fn shutdown(&self) {
        self.handle.shutdown();
        if let Some(l) = &self.local {
            l.shutdown();
        }
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Drop for MetaServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Liveness, retirement, sweeping abandoned puts, retrying claims.
async fn ticker(h: Arc<MetaHandler>, cfg: MetaConfig) {
    let dead_after = cfg.dead_after.as_millis() as u64;
    let retire_after = cfg.retire_after.as_millis() as u64;
    let lease_ms = cfg.lease_timeout.as_millis() as u64;
    let period = (cfg.dead_after / 4).max(Duration::from_millis(10));
    let mut tick = tokio::time::interval(period);
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
                    claims.extend(MetaHandler::commit(&mut st, d, now));
                    n
                }
                None => 0,
            };
            let swept = match st.decide_sweep(now, lease_ms) {
                Some(d) => {
                    let n = d
                        .effects
                        .iter()
                        .filter(|e| matches!(e, crate::Effect::Dropped { .. }))
                        .count();
                    claims.extend(MetaHandler::commit(&mut st, d, now));
                    n
                }
                None => 0,
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
        if swept > 0 {
            tracing::info!("dropped KeyValue puts abandoned by their writers");
        }
        h.send_claims(claims).await;
        h.retry_pending().await;
    }
}

/// Reaps removed subtrees in the background, woken after a big removal.
async fn reaper(h: Arc<MetaHandler>) {
    loop {
        h.reap.notified().await;
        while h.reap_for(Duration::from_millis(50)).await {
            // Let requests in between steps.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
