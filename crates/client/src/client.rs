//! The client itself: connecting, routing a path to its metadata
//! partition, metadata requests, child records, and the namespace changes
//! that hand out no node (attributes, removes, renames, status). Opening
//! nodes is in `open.rs`, enumeration in `listing.rs`.

use crate::blockio::{BlockIo, DataPathStats};
use crate::config::{ClientConfig, Ttl};
use crate::leases::{self, Leases};
use crate::start::Starting;
use bytes::BytesMut;
use nodekernel_proto::meta::{MetaReply, MetaRequest, NO_STORAGE_SERVER_YET};
use nodekernel_proto::record;
use nodekernel_proto::sync;
use nodekernel_proto::{
    path, ClusterStatus, Error, ErrorCode, NodeInfo, NodeType, RecordLoc, Result,
};
use nodekernel_rpc::{ConnOptions, ConnectionPool};
use std::sync::Arc;
use std::time::Duration;

/// Writes a child record (or its clear) takes before it gives up on a
/// piece whose shared block keeps getting new generations under it (each
/// retry asks the metadata server where the record is now).
const RECORD_ATTEMPTS: u32 = 16;

pub(crate) struct Inner {
    pub(crate) cfg: ClientConfig,
    /// Where each partition's requests go: the configured TCP address, or
    /// the server's Unix socket once it has proved to be on this host.
    routes: Vec<std::sync::RwLock<Arc<str>>>,
    /// Connections to metadata servers.
    pub(crate) pool: ConnectionPool,
    /// Every block transfer goes through here.
    pub(crate) io: BlockIo,
    /// The write leases of this client's open writers, renewed by its
    /// lease keeper (`crate::leases`).
    pub(crate) leases: Arc<Leases>,
    /// Puts reserved ahead of their keys (`crate::reserve`).
    pub(crate) reserved: crate::reserve::Reservations,
    /// The runtime the client was made on: where it gives back its
    /// reservations when dropped, whichever thread drops it.
    rt: Option<tokio::runtime::Handle>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.leases.client_gone();
        // Unused reservations go back now rather than when their leases
        // lapse (best effort: only on a runtime that keeps running).
        let unused = self.reserved.drain(None, None, std::time::Instant::now());
        let Some(rt) = self.rt.take() else {
            return;
        };
        if unused.is_empty() {
            return;
        }
        let pool = std::mem::replace(&mut self.pool, ConnectionPool::new(self.cfg.timeout));
        let routes: Vec<Arc<str>> = self.routes.iter().map(|r| sync::read(r).clone()).collect();
        rt.spawn(async move {
            for (part, info) in unused {
                let mut buf = BytesMut::new();
                let abort = MetaRequest::Abort {
                    node: info.id,
                    lease: info.lease,
                };
                abort.encode(&mut buf);
                let _ = pool.call(&routes[part], abort.op(), &[&buf]).await;
            }
        });
    }
}

/// An asynchronous NodeKernel client. Cheap to clone; clones share
/// connections.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

impl Client {
    /// Creates a client and checks that the metadata servers answer and
    /// are listed in partition order. A partition that does not answer is
    /// tried again by each request for its names (which get `Unavailable`
    /// or `Timeout` meanwhile), so the others keep serving; connecting
    /// fails only if none answers. While nothing listens at any of the
    /// addresses (a cluster that is starting), it asks again, for at most
    /// the client timeout and 10 s (`crate::start`).
    ///
    /// Without a token in `cfg`, it uses the one a server on this host
    /// published for one of the metadata servers' addresses
    /// ([`crate::settings::publish_token`]: `nk up` and `nk meta` do, for
    /// clients of their user), so a default one-machine cluster needs no
    /// setting (`docs/security.md`, *Secure by default*).
    pub async fn connect(cfg: ClientConfig) -> Result<Client> {
        if cfg.metas.is_empty() {
            return Err(Error::invalid_argument("no metadata server address given"));
        }
        let cluster = cfg.metas.join(",");
        let mut starting = Starting::new(&cluster, cfg.timeout);
        loop {
            let mut cfg = cfg.clone();
            if cfg.token.is_none() {
                cfg.token = crate::settings::published_token(&cfg.metas);
            }
            let tokenless = cfg.token.is_none();
            let client = Client::new(cfg);
            let n = client.inner.cfg.metas.len();
            let answers =
                futures::future::join_all((0..n).map(|i| client.meta_at(i, &MetaRequest::Status)))
                    .await;
            let failed = |code| {
                answers
                    .iter()
                    .any(|a| matches!(a, Err(e) if e.code == code))
            };
            // A server that started listening after this client looked for
            // its published token (`nk up` publishes it before it
            // listens): look again.
            if tokenless
                && failed(ErrorCode::Unauthenticated)
                && crate::settings::published_token(&client.inner.cfg.metas).is_some()
            {
                continue;
            }
            // Nothing listens yet at any address: the cluster may be
            // starting (`crate::start`).
            let none = answers
                .iter()
                .all(|a| matches!(a, Err(e) if e.code == ErrorCode::Unavailable));
            match &answers[0] {
                Err(e) if none && starting.pause(e).await => continue,
                _ => return client.connected(answers, &starting).await,
            }
        }
    }

    /// A client of `cfg`, connected to nothing yet.
    fn new(cfg: ClientConfig) -> Client {
        let opts = ConnOptions {
            timeout: cfg.timeout,
            spin: cfg.poll_spin,
        };
        let handshake = Arc::new(
            nodekernel_rpc::VersionHandshake::new(nodekernel_rpc::Role::Client)
                .with_token(cfg.token.clone())
                .with_tls(cfg.tls.clone()),
        );
        let io = BlockIo::new(
            ConnectionPool::with_handshake(opts, handshake.clone()),
            cfg.shared_memory,
            cfg.timeout,
            cfg.access_hook.clone(),
            cfg.token.clone(),
        );
        Client {
            inner: Arc::new(Inner {
                pool: ConnectionPool::with_handshake(opts, handshake),
                routes: cfg
                    .metas
                    .iter()
                    .map(|a| std::sync::RwLock::new(Arc::from(a.as_str())))
                    .collect(),
                cfg,
                io,
                leases: Arc::default(),
                reserved: Default::default(),
                rt: tokio::runtime::Handle::try_current().ok(),
            }),
        }
    }

    /// [`Client::connect`] once the partitions gave `answers` to a
    /// `Status`: checks their order, and fails only if none answered.
    async fn connected(
        self,
        answers: Vec<Result<MetaReply>>,
        starting: &Starting<'_>,
    ) -> Result<Client> {
        let client = self;
        let n = client.inner.cfg.metas.len();
        let mut errors = Vec::new();
        for (i, answer) in answers.into_iter().enumerate() {
            match answer {
                Ok(MetaReply::Status(st)) => {
                    client.inner.leases.note_lease(st.lease_ms);
                    if st.partition != i as u32 || st.partitions != n as u32 {
                        return Err(Error::invalid_argument(format!(
                            "metadata server {} is partition {} of {}, but it is listed as partition {i} of {n}: list the metadata servers in partition order, the same everywhere",
                            client.inner.cfg.metas[i], st.partition, st.partitions
                        )));
                    }
                    if client.inner.cfg.unix_sockets {
                        client.try_local_route(i).await;
                    }
                }
                Ok(other) => return Err(unexpected(other)),
                Err(e) => {
                    tracing::warn!(
                        "metadata partition {i} ({}) does not answer: {e}",
                        client.inner.cfg.metas[i]
                    );
                    errors.push(e);
                }
            }
        }
        if errors.len() == n {
            let first = starting.gave_up(errors.swap_remove(0));
            return Err(if n == 1 {
                first
            } else {
                Error::new(
                    first.code,
                    format!("no metadata partition answers ({n} listed): {first}"),
                )
            });
        }
        if client.inner.cfg.renew_leases {
            tokio::spawn(leases::keep(
                Arc::downgrade(&client.inner),
                client.inner.leases.clone(),
                |inner, part, req| async move { Client { inner }.meta_at(part, &req).await },
            ));
        }
        Ok(client)
    }

    /// Switches partition `idx` to the metadata server's abstract Unix
    /// socket if it has one and it can be reached (only from the same host
    /// and network namespace); otherwise it stays on TCP.
    async fn try_local_route(&self, idx: usize) {
        let name = match self.meta_at(idx, &MetaRequest::LocalSocket).await {
            Ok(MetaReply::LocalSocket(name)) if !name.is_empty() => name,
            Ok(_) => return,
            Err(e) => {
                tracing::debug!("metadata server {idx} tells no local socket: {e}");
                return;
            }
        };
        let addr = nodekernel_rpc::abstract_unix_addr(&name);
        match self.inner.pool.get(&addr).await {
            Ok(_) => *sync::write(self.route(idx)) = addr.into(),
            Err(e) => tracing::debug!("metadata server {idx} is not on this host: {e}"),
        }
    }

    fn route(&self, idx: usize) -> &std::sync::RwLock<Arc<str>> {
        &self.inner.routes[idx]
    }

    /// The address requests to metadata partition `idx` go to: its
    /// configured address, or `unix:@name` when the server is on this host.
    pub fn meta_route(&self, idx: usize) -> Option<String> {
        let r = self.inner.routes.get(idx)?;
        Some(sync::read(r).to_string())
    }

    pub fn config(&self) -> &ClientConfig {
        &self.inner.cfg
    }

    /// Reserved puts this client holds unused (`crate::reserve`): part of
    /// the cluster's `reserved_puts` in [`Client::status`].
    pub fn reserved_puts_held(&self) -> u64 {
        self.inner.reserved.ready()
    }

    /// Whether this client has mapped the memory of the storage server at
    /// `addr` (as registered with the metadata server) and uses it for block
    /// transfers. Known after the first transfer to that server.
    pub fn is_colocated(&self, addr: &str) -> bool {
        self.inner.io.is_mapped(addr)
    }

    /// Block transfers so far, by path.
    pub fn data_path_stats(&self) -> DataPathStats {
        self.inner.io.stats()
    }

    /// Opens a session with a lease of `lease` (the metadata servers keep
    /// it between 1 s and 1 h; [`DEFAULT_SESSION_LEASE`](crate::DEFAULT_SESSION_LEASE)
    /// is a good default), renewed in the background from now on
    /// (`docs/lifecycle.md`, *Sessions*). Must be called within a Tokio
    /// runtime, which runs the renewals.
    pub async fn session(&self, lease: Duration) -> Result<crate::Session> {
        let client = self.clone();
        let send: crate::session::Send = Arc::new(move |part, req| {
            let client = client.clone();
            Box::pin(async move { client.meta_at(part, &req).await })
        });
        let parts = self.inner.cfg.metas.len();
        crate::Session::open(send, self.owner(), parts, lease).await
    }

    /// This client's identity among clones of others (a session names the
    /// client that opened it).
    pub(crate) fn owner(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    pub(crate) fn partition(&self, p: &str) -> usize {
        path::partition_of(p, self.inner.cfg.metas.len())
    }

    /// Sends a metadata request to partition `idx`. A request refused
    /// because no storage server has registered with the partition yet
    /// is sent again once one has, within the client timeout and 10 s
    /// (`crate::start`).
    pub(crate) async fn meta_at(&self, idx: usize, req: &MetaRequest) -> Result<MetaReply> {
        match self.meta_once(idx, req).await {
            Err(e) if self.refused_while_starting(idx, &e).await => {
                self.meta_when_started(idx, req, e).await
            }
            r => r,
        }
    }

    /// Whether `e` refused a request because partition `idx` had no
    /// storage server yet: it says so, or the partition answers and still
    /// has none. (Asking is not enough: one may have registered since the
    /// refusal.)
    async fn refused_while_starting(&self, idx: usize, e: &Error) -> bool {
        e.code == ErrorCode::Unavailable
            && (e.message.contains(NO_STORAGE_SERVER_YET) || self.starting(idx).await)
    }

    /// Whether partition `idx` answers and has no storage server yet: the
    /// cluster is starting (or its metadata server restarting).
    async fn starting(&self, idx: usize) -> bool {
        matches!(
            self.meta_once(idx, &MetaRequest::Status).await,
            Ok(MetaReply::Status(st)) if st.servers.is_empty()
        )
    }

    /// [`Client::meta_at`] for a request refused with `e` while partition
    /// `idx` had no storage server: sent again once one registered.
    async fn meta_when_started(
        &self,
        idx: usize,
        req: &MetaRequest,
        mut e: Error,
    ) -> Result<MetaReply> {
        let addr = &self.inner.cfg.metas[idx];
        let mut starting = Starting::new(addr, self.inner.cfg.timeout);
        loop {
            if !starting
                .pause(&"no storage server has registered yet")
                .await
            {
                return Err(starting.gave_up(e));
            }
            if self.starting(idx).await {
                continue;
            }
            match self.meta_once(idx, req).await {
                Err(again) if self.refused_while_starting(idx, &again).await => e = again,
                r => return r,
            }
        }
    }

    /// Sends a metadata request to partition `idx` once.
    async fn meta_once(&self, idx: usize, req: &MetaRequest) -> Result<MetaReply> {
        let addr = sync::read(self.route(idx)).clone();
        let mut buf = BytesMut::with_capacity(128);
        req.encode(&mut buf);
        let reply = match self.inner.pool.call(&addr, req.op(), &[&buf]).await {
            Ok(r) => r,
            Err(e) => {
                let tcp = &self.inner.cfg.metas[idx];
                if e.code == ErrorCode::Unavailable && *addr != **tcp {
                    // The local socket is gone (the server stopped); later
                    // requests go to the configured address.
                    tracing::debug!("metadata server {idx}: {e}; back to {tcp}");
                    *sync::write(self.route(idx)) = Arc::from(tcp.as_str());
                }
                return Err(e);
            }
        };
        MetaReply::decode(req.op(), &reply)
    }

    pub(crate) async fn node_reply(&self, idx: usize, req: &MetaRequest) -> Result<NodeInfo> {
        match self.meta_at(idx, req).await? {
            MetaReply::Node(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// Writes a child record into its container's data (partition `idx`'s).
    /// Records are supplementary (the metadata server is the authority and
    /// enumeration falls back to it for a missing record), so a failure is
    /// logged, not returned: the node exists either way.
    pub(crate) async fn write_record(&self, idx: usize, rec: &RecordLoc, ty: NodeType, name: &str) {
        let bytes = record::encode(rec.container, rec.slot, ty, name);
        if let Err(e) = self.put_record(idx, rec, &bytes, name).await {
            tracing::warn!(
                "could not write the record of {name} (slot {} of node {}): {e}",
                rec.slot,
                rec.container
            );
        }
    }

    /// Writes a record's bytes (of child `name`, or a clear when `name` is
    /// empty) at `rec`. A write refused as `Stale` (the shared block of
    /// the record's piece got a new generation since the location was
    /// handed out, as the small values sharing it came and went) asks the
    /// metadata server where the record is now and is tried there, up to
    /// [`RECORD_ATTEMPTS`] times in all. Whether it was written: not when
    /// the slot is no longer that record's (its child went, or another
    /// writer released the slot) or its block is moving (enumeration then
    /// asks the metadata server).
    async fn put_record(
        &self,
        idx: usize,
        rec: &RecordLoc,
        bytes: &[u8],
        name: &str,
    ) -> Result<bool> {
        let mut rec = rec.clone();
        let mut attempt = 1;
        loop {
            match self.store_write(&rec, bytes).await {
                Ok(()) => return Ok(true),
                Err(e) if e.code == ErrorCode::Stale && attempt < RECORD_ATTEMPTS => {
                    attempt += 1;
                    let req = MetaRequest::RecordAt {
                        container: rec.container,
                        slot: rec.slot,
                        name: name.to_string(),
                    };
                    match self.meta_at(idx, &req).await? {
                        MetaReply::Record(Some(now)) => rec = now,
                        MetaReply::Record(None) => return Ok(false),
                        other => return Err(unexpected(other)),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Clears a child record, then lets the metadata server reuse its slot.
    /// A record that cannot be cleared keeps its slot out of use (the
    /// metadata server still reports the child as gone).
    async fn clear_record(&self, idx: usize, rec: &RecordLoc) {
        match self.put_record(idx, rec, &record::CLEARED, "").await {
            Ok(true) => {}
            // Released by someone else meanwhile.
            Ok(false) => return,
            Err(e) => {
                tracing::warn!(
                    "could not clear record {} of node {}: {e}",
                    rec.slot,
                    rec.container
                );
                return;
            }
        }
        let req = MetaRequest::ReleaseSlot {
            container: rec.container,
            slot: rec.slot,
        };
        if let Err(e) = self.meta_at(idx, &req).await {
            tracing::warn!(
                "could not release record {} of node {}: {e}",
                rec.slot,
                rec.container
            );
        }
    }

    async fn store_write(&self, rec: &RecordLoc, bytes: &[u8]) -> Result<()> {
        self.inner
            .io
            .write_once(&rec.block, rec.offset, bytes)
            .await
    }

    /// Changes the permission bits (`mode`, at most 0o7777) and/or the
    /// modification time (`mtime`, nanoseconds since the Unix epoch) of the
    /// node at `p`; returns the node as it is now.
    pub async fn set_attrs(
        &self,
        p: &str,
        mode: Option<u32>,
        mtime: Option<u64>,
    ) -> Result<NodeInfo> {
        self.change_attrs(p, mode, mtime, None, None).await
    }

    /// Makes the node at `p` (with its subtree) expire `ttl` from now, or
    /// never (`docs/lifecycle.md`); returns the node as it is now, whose
    /// `expires_ms` says when (wall-clock milliseconds, the metadata
    /// server's clock).
    pub async fn expire(&self, p: &str, ttl: Ttl) -> Result<NodeInfo> {
        self.change_attrs(p, None, None, Some(ttl.wire_ms()), None)
            .await
    }

    /// Gives the Directory, Table or Bag at `p` a TTL for the children
    /// created in it from now on whose create names none (`None`: no
    /// child TTL); returns the node as it is now.
    pub async fn set_child_ttl(&self, p: &str, ttl: Option<Duration>) -> Result<NodeInfo> {
        let ms = ttl.map_or(0, crate::config::ttl_ms);
        self.change_attrs(p, None, None, None, Some(ms)).await
    }

    async fn change_attrs(
        &self,
        p: &str,
        mode: Option<u32>,
        mtime: Option<u64>,
        ttl_ms: Option<u64>,
        child_ttl_ms: Option<u64>,
    ) -> Result<NodeInfo> {
        path::components(p)?;
        let req = MetaRequest::SetAttrs {
            path: p.to_string(),
            mode,
            mtime,
            ttl_ms,
            child_ttl_ms,
        };
        self.node_reply(self.partition(p), &req).await
    }

    /// Deletes a node; a non-empty container needs `recursive`.
    pub async fn delete(&self, p: &str, recursive: bool) -> Result<()> {
        path::components(p)?;
        let req = MetaRequest::Remove {
            path: p.to_string(),
            recursive,
        };
        let idx = self.partition(p);
        match self.meta_at(idx, &req).await? {
            MetaReply::Record(Some(rec)) => self.clear_record(idx, &rec).await,
            MetaReply::Record(None) => {}
            other => return Err(unexpected(other)),
        }
        Ok(())
    }

    /// Atomically moves `src` to `dst`, which must not exist. Fails with
    /// `CrossPartition` when the two paths belong to different metadata
    /// servers (nothing is changed).
    pub async fn rename(&self, src: &str, dst: &str) -> Result<()> {
        self.rename_with(src, dst, false).await
    }

    /// [`Client::rename`]; with `replace`, an existing `dst` of the same
    /// type (a File or KeyValue, or an empty container) is removed in the
    /// same atomic step, as POSIX `rename` does.
    pub async fn rename_with(&self, src: &str, dst: &str, replace: bool) -> Result<()> {
        path::components(src)?;
        path::components(dst)?;
        let (a, b) = (self.partition(src), self.partition(dst));
        if a != b {
            return Err(Error::cross_partition(format!(
                "cannot move {src} to {dst}: they are owned by different metadata servers ({} and {})",
                self.inner.cfg.metas[a], self.inner.cfg.metas[b]
            )));
        }
        let req = MetaRequest::Move {
            src: src.to_string(),
            dst: dst.to_string(),
            replace,
        };
        match self.meta_at(a, &req).await? {
            MetaReply::Moved {
                ty,
                clear,
                write,
                replaced,
            } => {
                if let Some(rec) = write {
                    self.write_record(a, &rec, ty, leaf(dst)).await;
                }
                for rec in [clear, replaced].into_iter().flatten() {
                    self.clear_record(a, &rec).await;
                }
                Ok(())
            }
            other => Err(unexpected(other)),
        }
    }

    /// Cluster status: the merged view of every metadata partition that
    /// answers. A storage server's capacity and use are summed over its
    /// registrations (each partition holds a disjoint slice of its blocks);
    /// it counts as alive only if every partition that answered knows it
    /// and says so (readiness waits for the largest `expect_servers`), and
    /// as draining if any does. Partitions are asked concurrently, so one
    /// that does not answer costs at most the client timeout once; each
    /// such partition is listed in [`ClusterStatus::unreachable`] (with
    /// its address and the error) and its nodes and its slices of the
    /// servers' capacity are missing from the totals. Fails only when no
    /// partition answers (with the first partition's error code, naming
    /// every partition's error).
    pub async fn status(&self) -> Result<ClusterStatus> {
        use nodekernel_proto::types::PartitionDown;
        let metas = &self.inner.cfg.metas;
        let replies = futures::future::join_all((0..metas.len()).map(|idx| async move {
            match self.meta_at(idx, &MetaRequest::Status).await? {
                MetaReply::Status(s) => Ok(s),
                other => Err(unexpected(other)),
            }
        }))
        .await;
        let mut merged: Option<ClusterStatus> = None;
        let mut down: Vec<(PartitionDown, ErrorCode)> = Vec::new();
        // How many answering partitions know each server (by address).
        let mut known: std::collections::HashMap<String, usize> = Default::default();
        for (idx, reply) in replies.into_iter().enumerate() {
            let st = match reply {
                Ok(st) => st,
                Err(e) => {
                    down.push((
                        PartitionDown {
                            partition: idx as u32,
                            addr: metas[idx].clone(),
                            error: e.to_string(),
                        },
                        e.code,
                    ));
                    continue;
                }
            };
            for srv in &st.servers {
                *known.entry(srv.addr.clone()).or_default() += 1;
            }
            match &mut merged {
                None => merged = Some(st),
                Some(m) => {
                    m.nodes += st.nodes;
                    m.lease_ms = m.lease_ms.min(st.lease_ms);
                    m.expected_servers = m.expected_servers.max(st.expected_servers);
                    m.puts_in_progress += st.puts_in_progress;
                    m.reserved_puts += st.reserved_puts;
                    m.reclaiming += st.reclaiming;
                    m.logs.extend(st.logs);
                    for mv in st.moves {
                        match m.moves.iter_mut().find(|x| x.class == mv.class) {
                            Some(x) => {
                                x.demoted += mv.demoted;
                                x.promoted += mv.promoted;
                            }
                            None => m.moves.push(mv),
                        }
                    }
                    for c in st.classes {
                        if !m.classes.iter().any(|x| x.class == c.class) {
                            m.classes.push(c);
                        }
                    }
                    for s in st.servers {
                        match m.servers.iter_mut().find(|x| x.addr == s.addr) {
                            Some(x) => {
                                x.capacity_blocks += s.capacity_blocks;
                                x.used_blocks += s.used_blocks;
                                x.alive &= s.alive;
                                x.draining |= s.draining;
                                x.last_seen_ms = x.last_seen_ms.max(s.last_seen_ms);
                            }
                            None => m.servers.push(s),
                        }
                    }
                }
            }
        }
        match merged {
            Some(mut m) => {
                // A server some answering partition does not know yet (it
                // registers with one partition after another) cannot take
                // that partition's blocks: not alive for the cluster yet.
                let answering = metas.len() - down.len();
                for srv in &mut m.servers {
                    srv.alive &= known.get(&srv.addr) == Some(&answering);
                }
                m.unreachable = down.into_iter().map(|(d, _)| d).collect();
                Ok(m)
            }
            None => match down.first() {
                None => Err(Error::invalid_argument("no metadata server configured")),
                Some((_, code)) => Err(Error::new(
                    *code,
                    format!(
                        "no metadata partition answers: {}",
                        down.iter()
                            .map(|(d, _)| format!(
                                "partition {} at {}: {}",
                                d.partition, d.addr, d.error
                            ))
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                )),
            },
        }
    }
}

/// The last component of a valid non-root path.
pub(crate) fn leaf(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

pub(crate) fn unexpected(r: MetaReply) -> Error {
    Error::protocol(format!("unexpected reply from metadata server: {r:?}"))
}
