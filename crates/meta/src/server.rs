//! A running metadata server ([`MetaServer`]): the request handler
//! (`crate::handler`) served on TCP and on an abstract Unix socket, the
//! admin endpoint, recovery from the checkpoint and the operation log at
//! start, and the background tasks: the ticker (liveness, retirement,
//! snapshot expiry, sweeping after vanished writers, retrying claims,
//! the log's floor, checkpoints), the reaper, the drainer and the
//! migrator.
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

use crate::checkpoint;
use crate::handler::{log_effects, LocalStore, MetaHandler};
use crate::state::MetaState;
use nodekernel_journal::{Journal, JournalError};
use nodekernel_proto::Result;
use nodekernel_rpc::{bind_abstract_unix, serve_unix, serve_with, ServeOptions, ServerHandle};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub use crate::config::{CheckpointStats, MetaConfig, MetaError, Persistence};

/// Prefix of a metadata server's abstract socket name.
pub const LOCAL_SOCKET_PREFIX: &str = "nodekernel-meta-";

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
        if let Some(t) = cfg.security.tenants.iter().find(|t| t.root == "/") {
            if p.partitions > 1 {
                // A tenant's clients talk to the one partition of its root
                // (`crate::tenant`): `/` is in all of them.
                return Err(MetaError::Config {
                    key: "security.tenant",
                    reason: format!(
                        "tenant {} has root /, which spans all {} metadata partitions: a tenant's \
                         root must be below a top-level directory (its tree then lies in one \
                         partition)",
                        t.name, p.partitions
                    ),
                });
            }
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
        let handler = Arc::new(MetaHandler::new(&cfg, state, epoch, journal, covered));
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

    /// Sends the claims for the storage server at `addr` (as it
    /// registered) to `store` by a call instead of a request over a socket:
    /// for a storage server in this process (`nk up`, [`LocalStore`]). A
    /// later call for the same address replaces it.
    pub fn add_local_store(&self, addr: impl Into<String>, store: Arc<dyn LocalStore>) {
        self.handler.add_local_store(addr.into(), store);
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
            // The clock too: capabilities and expiry times count from it.
            let (base_ms, lifetime_s) = state.cap_clock();
            restored.set_cap_clock(base_ms, lifetime_s);
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

/// Liveness, retirement, expiry, sweeping after vanished writers, retrying
/// claims.
async fn ticker(h: Arc<MetaHandler>, cfg: MetaConfig) {
    let dead_after = cfg.dead_after.as_millis() as u64;
    let retire_after = cfg.retire_after.as_millis() as u64;
    let lease_ms = cfg.lease_timeout.as_millis() as u64;
    // At least every second: nodes expire on time with no request to
    // look at them (`docs/lifecycle.md`).
    let period = (cfg.dead_after / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
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
            let mut claims = Vec::new();
            let dead = match st.decide_liveness(now, dead_after) {
                Some(d) => {
                    let dead = d.notes().dead().to_vec();
                    claims.extend(h.commit(&mut st, d, now));
                    dead
                }
                None => Vec::new(),
            };
            let retired = match st.decide_retire(now, retire_after) {
                Some(d) => {
                    let n = d.effects.len();
                    claims.extend(h.commit(&mut st, d, now));
                    n
                }
                None => 0,
            };
            let (expired, _) = h.expire_due(&mut st, now);
            claims.extend(expired);
            if !st.ns().graveyard_is_empty() {
                h.reap.notify_one();
            }
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

/// Block moves in flight at once for drains (and for tier migration).
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

/// Reaps removed subtrees in the background, woken after a big removal.
async fn reaper(h: Arc<MetaHandler>) {
    loop {
        h.reap.notified().await;
        while h.reap_round().await {
            // Let requests in between rounds.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
