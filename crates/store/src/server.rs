//! The running storage server: its start ([`StorageServer::start`], in
//! named steps: prepare the medium, draw who it is, share its memory, bind
//! and serve the data port, register, then the admin endpoint and the
//! heartbeats), what it tells about itself, and its stop. The request
//! handler is in `handler.rs`, registration and heartbeats in
//! `registrar.rs`, the set-up before serving in `prepare.rs`.

use crate::admin::StoreAdmin;
use crate::blocks::BlockStore;
use crate::capacity::Capacity;
use crate::config::{partition, FileIoConfig, StoreConfig};
use crate::datadir::{self, Footprint};
use crate::handler::StoreHandler;
use crate::metrics::StoreMetrics;
use crate::persist::{self, Discarded, StoreState};
use crate::prepare::{bind, prepare, Persist, Prepared};
use crate::registrar::{Registrar, Who};
use crate::share::Share;
use crate::StoreError;
use nodekernel_admin::status::StoreStatusOut;
use nodekernel_proto::cap::{CapKey, CapSigner};
use nodekernel_proto::store::{op as store_op, Claim};
use nodekernel_proto::Error;
use nodekernel_rpc::{ConnOptions, Role, ServerHandle};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// How long a persistent server's stop waits for writes in flight before
/// it gives up on a clean stop (see [`StorageServer::shutdown`]).
pub const CLEAN_STOP_PATIENCE: Duration = Duration::from_secs(2);

/// Takes block claims by a call, for a metadata server in the same
/// process: what a `Claim` request does (capabilities checked, tags
/// cleared, blocks released, the request counted in the metrics), without
/// the round trip over a socket, which a replacing put or a delete waits
/// for before its reply. Cheap to clone. It does not keep the server
/// alive: once the server is dropped, its memory goes as it would.
#[derive(Clone)]
pub struct LocalClaims {
    handler: Weak<StoreHandler>,
    stopped: Arc<AtomicBool>,
}

impl LocalClaims {
    /// Handles `claims` as a `Claim` request would; `None` once the server
    /// stopped (its claims then go where requests go: to whatever listens
    /// at its address, or nowhere).
    pub async fn claim(&self, claims: &[Claim]) -> Option<nodekernel_proto::Result<()>> {
        if self.stopped.load(Ordering::Acquire) {
            return None;
        }
        let handler = self.handler.upgrade()?;
        let started = std::time::Instant::now();
        let r = handler.claim(claims).await;
        handler.metrics.done(store_op::CLAIM, started);
        Some(r)
    }
}

impl std::fmt::Debug for LocalClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalClaims")
            .field("stopped", &self.stopped.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Handle of a running storage server. Dropping it stops the server.
pub struct StorageServer {
    local_addr: SocketAddr,
    advertise: String,
    num_blocks: u32,
    store: Arc<BlockStore>,
    server: ServerHandle,
    share: Option<Share>,
    /// Set when it stops; shared with [`LocalClaims`].
    stopped: Arc<AtomicBool>,
    /// The handler its connections run, shared with [`LocalClaims`].
    handler: Arc<StoreHandler>,
    registrar: Arc<Registrar>,
    heartbeats: Vec<JoinHandle<()>>,
    identity: String,
    incarnation: u64,
    /// What it checks capabilities with (see [`StorageServer::cap_key`]).
    cap_key: CapKey,
    /// The locked data directory and block file, and what to remove when
    /// the server stops (or its start fails).
    footprint: Footprint,
    /// Shared with the handler: see [`StorageServer::writes_in_place`].
    in_place: Arc<AtomicU64>,
    /// A persistent server's state.
    persist: Option<Persist>,
    /// The admin HTTP endpoint, when configured.
    admin: Option<nodekernel_admin::AdminServer>,
}

impl StorageServer {
    /// A way for a metadata server in this process to send this server its
    /// claims by a call instead of a request over a socket (the one-process
    /// cluster of `nk up`; see [`LocalClaims`]).
    pub fn local_claims(&self) -> LocalClaims {
        LocalClaims {
            handler: Arc::downgrade(&self.handler),
            stopped: self.stopped.clone(),
        }
    }

    /// The key this server checks data-plane capabilities with, for tests
    /// that play the metadata server (it never leaves the cluster's
    /// servers otherwise).
    #[doc(hidden)]
    pub fn cap_key(&self) -> &CapKey {
        &self.cap_key
    }

    /// Locks the data directory and reads (or creates) the identity there,
    /// creates the medium, binds the data port, starts serving and
    /// registers with every metadata server. Returns once every
    /// registration succeeded; heartbeats then run in the background.
    ///
    /// A data directory or block file in use by another server gives
    /// [`StoreError::Locked`] before anything is changed. A failed start
    /// removes what it created (see [`datadir`](crate::datadir)).
    ///
    /// A file medium uses the default [`FileIoConfig`] (io_uring and
    /// `O_DIRECT` where the machine allows them).
    pub async fn start(cfg: StoreConfig) -> std::result::Result<StorageServer, StoreError> {
        StorageServer::start_with_file_io(cfg, FileIoConfig::default()).await
    }

    /// [`start`](Self::start) with explicit file I/O settings (ignored for a
    /// DRAM medium): queue depth, or forcing the buffered or pread/pwrite
    /// fallbacks.
    pub async fn start_with_file_io(
        cfg: StoreConfig,
        file_io: FileIoConfig,
    ) -> std::result::Result<StorageServer, StoreError> {
        let num_blocks = cfg.validate()?;
        file_io.validate()?;
        let Prepared {
            medium,
            footprint,
            gens,
            persist,
        } = prepare_off_runtime(&cfg, num_blocks, file_io).await?;
        if let Some(p) = &persist {
            p.log_kept(num_blocks);
        }
        // From here on, an early return drops `footprint`, which removes
        // what this start created while it still holds the locks.
        let who = who(&footprint, persist.as_ref())?;
        let store = Arc::new(BlockStore::with_gens(
            medium,
            cfg.block_size,
            num_blocks,
            gens,
        ));
        let share = share_memory(&cfg, &store);
        let (listener, local_addr) = listen(&cfg, persist.as_ref(), &footprint).await?;
        let in_place = Arc::new(AtomicU64::new(0));
        let metrics = Arc::new(StoreMetrics::default());
        let k = cfg.metas.len();
        let capacity = Arc::new(Capacity::new(
            cfg.block_size,
            (0..k).map(|i| partition(num_blocks, k, i).1).collect(),
            cfg.dynamic.clone(),
        ));
        let handler = StoreHandler {
            store: store.clone(),
            shm_name: share
                .as_ref()
                .map(|s| s.name().to_string())
                .unwrap_or_default(),
            peers: cfg
                .security
                .pool(Role::StorageServer, ConnOptions::new(cfg.rpc_timeout)),
            handshake: cfg.security.handshake(Role::StorageServer),
            cap_key: who.cap_key,
            signer: CapSigner::new(&who.cap_key),
            identity: who.identity.clone(),
            incarnation: who.incarnation,
            in_place: in_place.clone(),
            metrics: metrics.clone(),
            capacity: capacity.clone(),
        };
        let options = nodekernel_rpc::ServeOptions {
            spin: cfg.poll_spin,
            local_peers: cfg.security.local_peers,
            ..Default::default()
        };
        let handler = Arc::new(handler);
        let server = nodekernel_rpc::serve_with(listener, handler.clone(), options)
            .map_err(StoreError::Rpc)?;
        let advertise = advertised(&cfg, local_addr);
        let registrar = Arc::new(Registrar::new(
            &cfg,
            num_blocks,
            &advertise,
            &who,
            store.medium_kind(),
            metrics.clone(),
            capacity,
        ));
        let mut srv = StorageServer {
            local_addr,
            advertise,
            num_blocks,
            store,
            server,
            share,
            stopped: Arc::new(AtomicBool::new(false)),
            handler,
            registrar: registrar.clone(),
            heartbeats: Vec::new(),
            identity: who.identity,
            incarnation: who.incarnation,
            cap_key: who.cap_key,
            footprint,
            in_place,
            persist,
            admin: None,
        };
        // On failure `srv` drops, which stops the data port again and
        // removes what this start created.
        registrar.register_all(cfg.rpc_timeout).await?;
        if let Some(addr) = cfg.admin.as_deref() {
            srv.admin = Some(srv.start_admin(addr, &cfg, metrics).await?);
        }
        srv.heartbeats = registrar.heartbeats(cfg.heartbeat_interval);
        srv.footprint.started();
        srv.log_started(&cfg);
        Ok(srv)
    }

    /// Starts the admin HTTP endpoint on `addr`.
    async fn start_admin(
        &self,
        addr: &str,
        cfg: &StoreConfig,
        metrics: Arc<StoreMetrics>,
    ) -> std::result::Result<nodekernel_admin::AdminServer, StoreError> {
        let source = StoreAdmin {
            metrics,
            in_place: self.in_place.clone(),
            registrar: self.registrar.clone(),
            info: StoreStatusOut {
                role: "store",
                addr: self.advertise.clone(),
                identity: self.identity.clone(),
                class: cfg.class,
                class_name: cfg.class_name.clone(),
                medium: self.store.medium_kind().to_string(),
                io_mode: self.store.io_mode().to_string(),
                block_size: cfg.block_size,
                blocks: self.num_blocks as u64,
                capacity_bytes: cfg.exported_bytes(self.num_blocks),
                metas: cfg.metas.clone(),
                ..Default::default()
            },
        };
        nodekernel_admin::AdminServer::start(addr, Arc::new(source))
            .await
            .map_err(StoreError::Admin)
    }

    /// Says what started, where.
    fn log_started(&self, cfg: &StoreConfig) {
        tracing::info!(
            "storage server on {} exports {} {} blocks of {} bytes ({}{}), identity {}{}",
            self.local_addr,
            self.num_blocks,
            self.store.medium_kind(),
            cfg.block_size,
            self.store.io_mode(),
            match &self.share {
                Some(s) => format!(", shared with co-located clients at @{}", s.name()),
                None => String::new(),
            },
            self.identity,
            match self.data_dir() {
                Some(d) => format!(", data directory {}", d.display()),
                None => String::new(),
            }
        );
    }

    /// The bound address of the data port.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The admin HTTP endpoint's address, when it has one
    /// ([`StoreConfig::admin`]).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|a| a.local_addr())
    }

    /// The address registered with the metadata servers.
    pub fn advertised_addr(&self) -> &str {
        &self.advertise
    }

    pub fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    pub fn block_size(&self) -> u32 {
        self.store.block_size()
    }

    /// How the medium moves bytes: `"memory"` for DRAM; for a file one of
    /// `"io_uring+O_DIRECT"`, `"io_uring+buffered"`,
    /// `"pread/pwrite+O_DIRECT"`, `"pread/pwrite+buffered"` (see
    /// [`IoMode`](crate::IoMode)).
    pub fn io_mode(&self) -> &'static str {
        self.store.io_mode()
    }

    /// The abstract Unix socket name that hands this server's DRAM to
    /// co-located clients (without the leading NUL), or `None` when its
    /// memory is not shared.
    pub fn shared_memory_name(&self) -> Option<&str> {
        self.share.as_ref().map(|s| s.name())
    }

    /// The blocks this server exports (for inspection, e.g. generations).
    pub fn store(&self) -> &Arc<BlockStore> {
        &self.store
    }

    /// Writes whose data went from the socket straight into the DRAM
    /// region (large writes; see `nodekernel_rpc::DirectSink`).
    pub fn writes_in_place(&self) -> u64 {
        self.in_place.load(Ordering::Relaxed)
    }

    /// The server's stable identity: [`IDENTITY_LEN`](crate::datadir::IDENTITY_LEN)
    /// lowercase hexadecimal digits, kept in its data directory (the same
    /// at every start there), or random per start without one.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// A random, nonzero number drawn at every start that begins empty:
    /// tells a restarted server (same identity) from the one before it. A
    /// persistent server that kept its blocks keeps the incarnation they
    /// were written under, so the metadata server knows it as the same
    /// server and keeps every block mapped.
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// Whether this start kept the blocks of the last run: `None` for a
    /// volatile server, `Some(Ok(()))` when a persistent one kept them
    /// (same incarnation), `Some(Err(why))` when it started empty under a
    /// new incarnation (first start, settings changed, machine restarted
    /// after an unclean stop, a damaged or missing file...). See
    /// [`persist`](crate::persist).
    pub fn kept_blocks(&self) -> Option<std::result::Result<(), Discarded>> {
        self.persist.as_ref().map(|p| p.kept.clone())
    }

    /// Whether the server keeps its blocks across restarts
    /// ([`StoreConfig::persistent`]).
    pub fn is_persistent(&self) -> bool {
        self.persist.is_some()
    }

    /// The locked data directory, if the server has one.
    pub fn data_dir(&self) -> Option<&Path> {
        self.footprint.data_dir().map(|d| d.path())
    }

    /// The locked block file of a file medium.
    pub fn block_file(&self) -> Option<&Path> {
        self.footprint.block_file()
    }

    /// Stops the server and removes everything its start created (block
    /// file, identity, `LOCK`, directories that did not exist), as if it
    /// had never started. For a larger start-up that failed after this
    /// server started (`nk up`, `nk store` with several servers). After
    /// [`shutdown`](Self::shutdown) it removes nothing more.
    pub fn discard(self) {
        self.stop(true);
    }

    /// Server ids assigned by each metadata server, in `StoreConfig::metas`
    /// order; `None` while not registered with that one.
    pub fn server_ids(&self) -> Vec<Option<u32>> {
        self.registrar.ids()
    }

    /// Stops everything: the listener (new connections are refused from the
    /// moment this returns), every client connection and the heartbeats.
    /// A shared DRAM region is marked closed, so co-located clients stop
    /// using their mappings at their next access, and the hand-over socket
    /// closes.
    ///
    /// On disk, a volatile server: the block file of a file medium is
    /// removed if this start created it or it lies in the data directory,
    /// a private data directory is removed entirely, any other data
    /// directory stays with its `LOCK` and `identity`.
    ///
    /// A persistent server removes nothing. It waits (up to
    /// [`CLEAN_STOP_PATIENCE`]) until no write is in flight, syncs the
    /// blocks and their generations to the device (`msync`, `fsync`),
    /// then writes `clean = true` in its state file: its blocks are then
    /// kept even if the machine restarts before the server does. If a
    /// write is still in flight after that time, or the sync fails, the
    /// stop is not clean (logged): the blocks are still kept after a
    /// restart of the process on the same boot, not after a machine
    /// restart.
    ///
    /// The data directory's lock is released, so a new server may start
    /// on it at once. A file medium is closed to writes first, and once
    /// none is in flight (up to [`CLEAN_STOP_PATIENCE`]) its block file's
    /// lock is released too; otherwise it goes with the medium, when the
    /// server and its last connection task are dropped. Idempotent; also
    /// done on drop.
    pub fn shutdown(&self) {
        self.stop(false);
    }

    fn stop(&self, undo: bool) {
        let mut release = false;
        if !self.stopped.swap(true, Ordering::AcqRel) {
            self.stop_serving();
            // A persistent server syncs only once no write is in flight; a
            // block file is released early only then, too. A volatile DRAM
            // server waits for nothing, as ever.
            let quiet = (self.persist.is_some() || self.footprint.block_file().is_some())
                && self.wait_for_writes();
            if let Some(p) = &self.persist {
                if quiet {
                    self.stop_clean(p);
                }
            }
            release = quiet;
            tracing::info!("storage server on {} stopped", self.local_addr);
        }
        // After serving stopped, and idempotent itself.
        self.footprint.finish(undo);
        if release {
            self.footprint.release_block_file();
        }
    }

    /// Closes the store to writes and waits (up to
    /// [`CLEAN_STOP_PATIENCE`]) until none is in flight; whether that
    /// happened.
    fn wait_for_writes(&self) -> bool {
        let started = std::time::Instant::now();
        let quiet = self.store.close_and_quiesce(CLEAN_STOP_PATIENCE);
        if !quiet {
            tracing::warn!(
                "storage server on {}: writes still in flight after {:?}; {}",
                self.local_addr,
                started.elapsed(),
                if self.persist.is_some() {
                    "the stop is not clean (blocks kept across a process restart, not a machine restart)"
                } else {
                    "its block file stays locked until they end"
                }
            );
        }
        quiet
    }

    /// A persistent server's clean stop (see [`shutdown`](Self::shutdown)),
    /// once it stopped serving and no write is in flight.
    fn stop_clean(&self, p: &Persist) {
        if let Err(e) = self.store.sync() {
            tracing::warn!(
                "storage server on {}: cannot sync its blocks ({e}); the stop is not clean",
                self.local_addr
            );
            return;
        }
        let state = StoreState {
            clean: true,
            ..p.state
        };
        if let Err(e) = state.write(&p.dir) {
            tracing::warn!(
                "storage server on {}: cannot mark its stop clean in {}: {e}",
                self.local_addr,
                p.dir.join(persist::STATE_FILE).display()
            );
        }
    }

    fn stop_serving(&self) {
        if let Some(r) = self.store.shared_region() {
            r.close();
        }
        if let Some(s) = &self.share {
            s.stop();
        }
        self.server.shutdown();
        if let Some(a) = &self.admin {
            a.shutdown();
        }
        for h in &self.heartbeats {
            h.abort();
        }
    }
}

impl Drop for StorageServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for StorageServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageServer")
            .field("local_addr", &self.local_addr)
            .field("advertise", &self.advertise)
            .field("identity", &self.identity)
            .field("incarnation", &self.incarnation)
            .field("data_dir", &self.data_dir())
            .field("medium", &self.store.medium_kind())
            .field("io_mode", &self.store.io_mode())
            .field("num_blocks", &self.num_blocks)
            .field("block_size", &self.store.block_size())
            .field("server_ids", &self.server_ids())
            .field("shared_memory", &self.shared_memory_name())
            .finish()
    }
}

/// [`prepare`], off the async workers: locking, preallocation and
/// prefaulting DRAM (about 1 s per GiB) block.
async fn prepare_off_runtime(
    cfg: &StoreConfig,
    num_blocks: u32,
    file_io: FileIoConfig,
) -> std::result::Result<Prepared, StoreError> {
    let bytes = cfg.exported_bytes(num_blocks);
    let cfg = cfg.clone();
    tokio::task::spawn_blocking(move || prepare(&cfg, num_blocks, bytes, &file_io))
        .await
        .map_err(|e| StoreError::Rpc(Error::internal(format!("medium set-up task failed: {e}"))))?
}

/// Who the server is this run: the identity of its data directory (or a
/// random one), the incarnation its kept blocks were written under (or a
/// fresh one), and a capability key drawn by every process, so that
/// capabilities from before a restart are refused and their holders ask
/// the metadata server again.
fn who(footprint: &Footprint, persist: Option<&Persist>) -> std::result::Result<Who, StoreError> {
    let identity = match footprint.data_dir() {
        Some(d) => d.identity().to_string(),
        None => datadir::random_identity()
            .map_err(|e| StoreError::io("generate an identity from", "getrandom", e))?,
    };
    let incarnation = match persist {
        Some(p) => p.state.incarnation,
        None => datadir::random_incarnation()
            .map_err(|e| StoreError::io("generate an incarnation from", "getrandom", e))?,
    };
    let mut cap_key: CapKey = [0; nodekernel_proto::cap::CAP_KEY_LEN];
    nodekernel_rpc::random_bytes(&mut cap_key)
        .map_err(|e| StoreError::io("generate a capability key from", "getrandom", e))?;
    Ok(Who {
        identity,
        incarnation,
        cap_key,
    })
}

/// The hand-over socket of a DRAM region, unless sharing is off. Sharing
/// is an optimisation: without the socket, clients simply use the data
/// port.
fn share_memory(cfg: &StoreConfig, store: &BlockStore) -> Option<Share> {
    match store.shared_region() {
        Some(region) if cfg.shared_memory => {
            match Share::start(region.clone(), cfg.security.token.clone()) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::warn!(
                        "cannot listen on an abstract Unix socket ({e}); DRAM is not shared with co-located clients"
                    );
                    None
                }
            }
        }
        _ => None,
    }
}

/// Binds the data port (see [`bind`]); a persistent server remembers the
/// address for its next start.
async fn listen(
    cfg: &StoreConfig,
    persist: Option<&Persist>,
    footprint: &Footprint,
) -> std::result::Result<(TcpListener, SocketAddr), StoreError> {
    let listen_err = |error| StoreError::Listen {
        addr: cfg.listen.clone(),
        error,
    };
    let listener = bind(cfg, persist).await.map_err(listen_err)?;
    let local_addr = listener.local_addr().map_err(listen_err)?;
    if let Some(p) = persist {
        let path = p.dir.join(persist::ADDRESS_FILE);
        footprint.note_new(&path);
        if let Err(e) = persist::write_address(&p.dir, local_addr) {
            tracing::warn!("cannot remember the address in {}: {e}", path.display());
        }
    }
    Ok((listener, local_addr))
}

/// The address registered with the metadata servers: the configured one,
/// or the bound one (a wildcard address, warned about, if it is one).
fn advertised(cfg: &StoreConfig, local_addr: SocketAddr) -> String {
    match &cfg.advertise {
        Some(a) => a.clone(),
        None => {
            if local_addr.ip().is_unspecified() && !cfg.metas.is_empty() {
                tracing::warn!(
                    "storage server bound to {local_addr} registers that wildcard address; set `advertise`"
                );
            }
            local_addr.to_string()
        }
    }
}
