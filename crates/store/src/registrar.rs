//! Registration with the metadata servers and the heartbeats after it
//! ([`Registrar`]): one `Register` request per metadata partition, retried
//! while the failure is transient, then a heartbeat per period (with the
//! data path's counters, and the size to export when it is dynamic),
//! registering again with a metadata server that forgot this one.

use crate::capacity::Capacity;
use crate::config::{partition, StoreConfig};
use crate::metrics::StoreMetrics;
use crate::StoreError;
use bytes::BytesMut;
use nodekernel_proto::cap::CapKey;
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::sync;
use nodekernel_proto::{Error, ErrorCode, Result, ServerSpec};
use nodekernel_rpc::{ConnOptions, ConnectionPool, Role};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

/// Who a server is to the metadata servers: its stable identity, this
/// run's incarnation, and the key its capabilities verify under (drawn at
/// every start).
#[derive(Clone)]
pub(crate) struct Who {
    pub(crate) identity: String,
    pub(crate) incarnation: u64,
    pub(crate) cap_key: CapKey,
}

/// Registration state shared by `start` and the heartbeat tasks.
pub(crate) struct Registrar {
    pool: ConnectionPool,
    metas: Vec<String>,
    /// One `Register` request per metadata server (its partition of blocks).
    requests: Vec<MetaRequest>,
    /// Server id assigned by each metadata server, `None` while unregistered.
    ids: Mutex<Vec<Option<u32>>>,
    /// What heartbeats report.
    metrics: Arc<StoreMetrics>,
    /// The exported size each partition is told at every heartbeat.
    capacity: Arc<Capacity>,
    /// Signs heartbeats and resizes.
    cap_key: CapKey,
    /// The last sequence number signed (see [`Registrar::signed`]).
    seq: AtomicU64,
}

impl Registrar {
    /// The registrar of a server exporting `num_blocks` blocks of a
    /// `medium`, as `who` at `advertise`: one `Register` request per
    /// metadata server, for its partition of the blocks.
    pub(crate) fn new(
        cfg: &StoreConfig,
        num_blocks: u32,
        advertise: &str,
        who: &Who,
        medium: &str,
        metrics: Arc<StoreMetrics>,
        capacity: Arc<Capacity>,
    ) -> Registrar {
        let k = cfg.metas.len();
        let requests = (0..k)
            .map(|i| {
                let (first_block, count) = partition(num_blocks, k, i);
                MetaRequest::Register(ServerSpec {
                    addr: advertise.to_string(),
                    class: cfg.class,
                    class_name: cfg.class_name.clone(),
                    medium: medium.to_string(),
                    location: cfg.location.clone(),
                    block_size: cfg.block_size,
                    first_block,
                    num_blocks: count,
                    identity: who.identity.clone(),
                    incarnation: who.incarnation,
                    cap_key: who.cap_key,
                })
            })
            .collect();
        Registrar {
            pool: cfg
                .security
                .pool(Role::StorageServer, ConnOptions::new(cfg.rpc_timeout)),
            metas: cfg.metas.clone(),
            requests,
            ids: Mutex::new(vec![None; k]),
            metrics,
            capacity,
            cap_key: who.cap_key,
            seq: AtomicU64::new(0),
        }
    }

    /// Registers with every metadata server concurrently (each retried for
    /// about `patience`); the first failure, if any.
    pub(crate) async fn register_all(
        self: &Arc<Self>,
        patience: Duration,
    ) -> std::result::Result<(), StoreError> {
        let pending: Vec<_> = (0..self.metas.len())
            .map(|i| {
                let reg = self.clone();
                tokio::spawn(async move { reg.register(i, patience).await })
            })
            .collect();
        let mut first_err = None;
        for task in pending {
            let result = task.await.unwrap_or_else(|e| {
                Err(StoreError::Rpc(Error::internal(format!(
                    "registration task failed: {e}"
                ))))
            });
            if let Err(e) = result {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Starts the heartbeats: one task per metadata server, every
    /// `interval`.
    pub(crate) fn heartbeats(self: &Arc<Self>, interval: Duration) -> Vec<JoinHandle<()>> {
        (0..self.metas.len())
            .map(|i| tokio::spawn(heartbeat_loop(self.clone(), i, interval)))
            .collect()
    }

    /// `req` signed with this server's key and a sequence number greater
    /// than every earlier one: the clock in milliseconds, or one more than
    /// the last if the clock did not move on (or went back).
    fn signed(&self, mut req: MetaRequest) -> MetaRequest {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let prev = self
            .seq
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
                Some(now.max(last + 1))
            })
            .unwrap_or_else(|last| last);
        req.sign(&self.cap_key, now.max(prev + 1));
        req
    }

    fn set_id(&self, i: usize, id: Option<u32>) {
        sync::lock(&self.ids)[i] = id;
    }

    fn id(&self, i: usize) -> Option<u32> {
        sync::lock(&self.ids)[i]
    }

    /// The id with each metadata server.
    pub(crate) fn ids(&self) -> Vec<Option<u32>> {
        sync::lock(&self.ids).clone()
    }

    async fn call(&self, i: usize, req: &MetaRequest) -> Result<MetaReply> {
        let mut buf = BytesMut::new();
        req.encode(&mut buf);
        let reply = self.pool.call(&self.metas[i], req.op(), &[&buf]).await?;
        MetaReply::decode(req.op(), &reply)
    }

    /// One registration attempt with metadata server `i`.
    async fn register_once(&self, i: usize) -> Result<u32> {
        match self.call(i, &self.requests[i]).await? {
            MetaReply::Registered { server } => {
                self.set_id(i, Some(server));
                Ok(server)
            }
            other => Err(Error::protocol(format!(
                "metadata server {} answered a registration with {other:?}",
                self.metas[i]
            ))),
        }
    }

    /// Registers with metadata server `i`, retrying transient failures with
    /// a short backoff for about `patience` (at least two attempts).
    async fn register(&self, i: usize, patience: Duration) -> std::result::Result<u32, StoreError> {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(50);
        let mut attempts = 0;
        loop {
            attempts += 1;
            let err = match self.register_once(i).await {
                Ok(id) => {
                    tracing::info!(
                        "registered with metadata server {} as server {id}",
                        self.metas[i]
                    );
                    return Ok(id);
                }
                Err(e) => e,
            };
            let transient = matches!(
                err.code,
                ErrorCode::Unavailable | ErrorCode::Timeout | ErrorCode::Busy
            );
            let left = patience.saturating_sub(started.elapsed());
            if !transient || (attempts >= 2 && left.is_zero()) {
                return Err(StoreError::Register {
                    meta: self.metas[i].clone(),
                    error: err,
                });
            }
            let pause = backoff.min(left).max(Duration::from_millis(10));
            tracing::debug!(
                "registration with {} failed (attempt {attempts}), retrying in {pause:?}: {err}",
                self.metas[i]
            );
            tokio::time::sleep(pause).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// Tells metadata server `i` the size its slice should export, when a
    /// target is set (dynamic capacity: asked at every heartbeat, so a
    /// restarted metadata server hears it again).
    async fn resize(&self, i: usize) {
        if i == 0 {
            self.capacity.follow();
        }
        let Some((blocks, news)) = self.capacity.for_partition(i) else {
            return;
        };
        let MetaRequest::Register(spec) = &self.requests[i] else {
            return;
        };
        let req = self.signed(MetaRequest::Resize {
            server: spec.identity.clone(),
            blocks,
            signed: Default::default(),
        });
        match self.call(i, &req).await {
            Ok(MetaReply::Resized(r)) if news => tracing::info!(
                "metadata server {}: exporting {} of {} blocks, asked for {blocks}",
                self.metas[i],
                r.exported_blocks,
                r.max_blocks
            ),
            Ok(_) => {}
            Err(e) => tracing::warn!(
                "resizing with metadata server {} failed, will retry: {e}",
                self.metas[i]
            ),
        }
    }

    /// One heartbeat period for metadata server `i`: heartbeat if registered,
    /// register again if not (or if the metadata server forgot us).
    async fn beat(&self, i: usize) {
        let meta = &self.metas[i];
        let reregister = match self.id(i) {
            None => true,
            Some(id) => match self
                .call(
                    i,
                    &self.signed(MetaRequest::Heartbeat {
                        server: id,
                        traffic: self.metrics.traffic(),
                        signed: Default::default(),
                    }),
                )
                .await
            {
                Ok(_) => false,
                Err(e) if e.code == ErrorCode::UnknownServer => {
                    tracing::warn!(
                        "metadata server {meta} no longer knows server {id} ({e}); registering again"
                    );
                    self.set_id(i, None);
                    true
                }
                Err(e) => {
                    tracing::warn!(
                        "heartbeat of server {id} to metadata server {meta} failed: {e}"
                    );
                    false
                }
            },
        };
        if !reregister {
            self.resize(i).await;
        }
        if reregister {
            match self.register_once(i).await {
                Ok(id) => {
                    tracing::info!("registered again with metadata server {meta} as server {id}")
                }
                Err(e) => tracing::warn!(
                    "registration with metadata server {meta} failed, will retry: {e}"
                ),
            }
        }
    }
}

async fn heartbeat_loop(reg: Arc<Registrar>, i: usize, interval: Duration) {
    let mut ticker = tokio::time::interval_at(Instant::now() + interval, interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        reg.beat(i).await;
    }
}
