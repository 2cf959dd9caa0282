//! The async shell around [`MetaState`]: decodes requests, applies them
//! under a lock, encodes replies, and runs the liveness check.

use crate::alloc::BlockClaim;
use crate::state::MetaState;
use bytes::{Bytes, BytesMut};
use nodekernel_proto::meta::MetaRequest;
use nodekernel_proto::store::{encode_write_prefix, op as store_op};
use nodekernel_proto::Result;
use nodekernel_rpc::{
    bind_abstract_unix, serve_unix, serve_with, ConnectionPool, Handler, ServeOptions, ServerHandle,
};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

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
    /// Names and prices of the storage classes (shown in status).
    pub classes: Vec<nodekernel_proto::ClassInfo>,
    /// How long an idle connection busy-polls for the next request.
    pub poll_spin: Duration,
    /// Also listen on an abstract Unix socket, which clients on the same
    /// host use instead of TCP (a shorter round trip).
    pub unix_socket: bool,
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
            classes: Vec::new(),
            poll_spin: nodekernel_rpc::default_spin(),
            unix_socket: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("invalid metadata server setting {key}: {reason}")]
    Config { key: &'static str, reason: String },
    #[error(transparent)]
    Rpc(#[from] nodekernel_proto::Error),
}

struct MetaHandler {
    state: Mutex<MetaState>,
    epoch: Instant,
    /// Connections to storage servers, for invalidations.
    stores: ConnectionPool,
}

impl MetaHandler {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Sends block claims (zero-length writes with a generation) to storage
    /// servers: freed blocks get a fresh generation, so any older location
    /// of them gets `Stale` from now on. Failures are logged: a storage
    /// server that cannot be reached is dead or will be, and its blocks with
    /// it.
    async fn send_claims(&self, invs: Vec<BlockClaim>) {
        let sends = invs.into_iter().map(|inv| async move {
            let mut prefix = BytesMut::with_capacity(16);
            encode_write_prefix(&mut prefix, inv.block, inv.gen, 0);
            if let Err(e) = self
                .stores
                .call(&inv.addr, store_op::WRITE, &[&prefix])
                .await
            {
                tracing::warn!(
                    "could not claim block {} on storage server {} ({}): {e}",
                    inv.block,
                    inv.server,
                    inv.addr
                );
            }
        });
        futures::future::join_all(sends).await;
    }
}

impl Handler for MetaHandler {
    async fn handle(&self, op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        let req = MetaRequest::decode(op, &payload)?;
        let now = self.now_ms();
        let (reply, invs) = {
            let mut st = self.state.lock().expect("meta state lock");
            let reply = st.apply(req, now);
            (reply, st.take_claims())
        };
        // Freed blocks are invalidated before the reply, so once a delete or
        // a replacing put returns, old handles get Stale.
        if !invs.is_empty() {
            self.send_claims(invs).await;
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
    ticker: JoinHandle<()>,
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
        let listener = TcpListener::bind(&cfg.listen)
            .await
            .map_err(|source| MetaError::Bind {
                addr: cfg.listen.clone(),
                source,
            })?;
        let first_gen = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(1);
        let mut state = MetaState::new(bs, cfg.lease_timeout.as_millis() as u64, first_gen);
        state.set_classes(cfg.classes.clone());
        let handler = Arc::new(MetaHandler {
            state: Mutex::new(state),
            epoch: Instant::now(),
            stores: ConnectionPool::new(cfg.dead_after.min(Duration::from_secs(5))),
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
                    handler
                        .state
                        .lock()
                        .expect("meta state lock")
                        .set_local_socket(name);
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
        let dead_after = cfg.dead_after.as_millis() as u64;
        let lease_ms = cfg.lease_timeout.as_millis() as u64;
        let h = handler.clone();
        let period = (cfg.dead_after / 4).max(Duration::from_millis(10));
        let ticker = tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                let now = h.now_ms();
                let (dead, swept, invs) = {
                    let mut st = h.state.lock().expect("meta state lock");
                    let dead = st.alloc.expire(now, dead_after);
                    let swept = st.sweep_abandoned_puts(now, lease_ms);
                    (dead, swept, st.take_claims())
                };
                for id in dead {
                    tracing::warn!(
                        "storage server {id} missed heartbeats for {dead_after} ms: declared dead"
                    );
                }
                if swept > 0 {
                    tracing::info!("dropped {swept} KeyValue puts abandoned by their writers");
                }
                h.send_claims(invs).await;
            }
        });
        tracing::info!("metadata server listening on {}", handle.local_addr());
        Ok(MetaServer {
            handle,
            local,
            ticker,
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
        f(&mut self.handler.state.lock().expect("meta state lock"))
    }

    pub fn shutdown(&self) {
        self.handle.shutdown();
        if let Some(l) = &self.local {
            l.shutdown();
        }
        self.ticker.abort();
    }
}

impl Drop for MetaServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}
