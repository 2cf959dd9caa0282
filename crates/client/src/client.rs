use crate::blockio::{AccessHook, BlockIo};
use crate::node::Node;
use bytes::BytesMut;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::record::{self, RECORD_SIZE};
use nodekernel_proto::sync;
use nodekernel_proto::{
    path, ClusterStatus, Error, ErrorCode, NodeInfo, NodeType, RecordLoc, Result, NO_CLASS,
};
use nodekernel_rpc::{ConnOptions, ConnectionPool};
use std::sync::Arc;
use std::time::Duration;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Metadata servers, in partition order.
    pub metas: Vec<String>,
    /// Bound on connecting and on every request.
    pub timeout: Duration,
    /// This client's location class (host name by default).
    pub location: String,
    /// Block transfers kept in flight by one read or write call.
    pub transfers_in_flight: usize,
    /// Map the memory of DRAM storage servers on the same host and read and
    /// write their blocks with memory copies instead of network requests
    /// (default `true`). Servers elsewhere, file-tier servers and servers
    /// that do not share their memory are always reached over the network.
    pub shared_memory: bool,
    /// Talk to metadata servers on the same host over their abstract Unix
    /// socket instead of TCP (default `true`).
    pub unix_sockets: bool,
    /// How long a caller busy-polls for a reply before parking (0 disables
    /// spinning; default 100 µs or `NK_POLL_SPIN_US`).
    pub poll_spin: Duration,
    /// Sees every block transfer, mapped ones included (per-block access
    /// statistics, metrics); `None` by default.
    pub access_hook: Option<Arc<dyn AccessHook>>,
    /// The cluster token this client proves on every connection (to
    /// metadata and storage servers, and for shared memory); `None` by
    /// default, when [`Client::connect`] uses one a server on this host
    /// published for its address, if any. [`crate::discover`] reads it from
    /// `NK_TOKEN_FILE` or the `[security]` section.
    pub token: Option<Arc<nodekernel_rpc::Token>>,
    /// TLS on TCP connections (the `[security.tls]` table); `None` by
    /// default.
    pub tls: Option<Arc<nodekernel_rpc::Tls>>,
    /// The key this client encrypts and decrypts the data of encrypted
    /// nodes with (`docs/encryption.md`); never sent anywhere. `None` by
    /// default: encrypted nodes then fail with `Unauthenticated`.
    /// [`crate::discover`] reads it from `NK_ENCRYPTION_KEY_FILE` or
    /// `[security] encryption_key_file`.
    pub encryption_key: Option<Arc<crate::EncryptionKey>>,
    /// Renew the write leases of this client's open writers a few times
    /// per lease, so a writer that pauses keeps its node (default `true`).
    /// Without it, a writer silent for about two leases
    /// (`meta.lease_timeout_ms`) loses what it wrote since its last sync,
    /// as a writer that vanished does: for tests of lease expiry.
    pub renew_leases: bool,
}

impl ClientConfig {
    pub fn new(metas: Vec<String>) -> Self {
        ClientConfig {
            metas,
            timeout: Duration::from_secs(5),
            location: default_location(),
            transfers_in_flight: 16,
            shared_memory: true,
            unix_sockets: true,
            poll_spin: nodekernel_rpc::default_call_spin(),
            access_hook: None,
            token: None,
            tls: None,
            encryption_key: None,
            renew_leases: true,
        }
    }
}

/// How many block transfers went through mapped memory and how many over
/// the network, since the client was created (one per block piece), and
/// how the bytes of network reads reached the reader's buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DataPathStats {
    pub mapped_reads: u64,
    pub mapped_writes: u64,
    pub network_reads: u64,
    pub network_writes: u64,
    /// Bytes of network reads (with each reply's one status byte) the
    /// kernel received straight into the reader's buffer (no copy in the
    /// client).
    pub network_read_bytes_direct: u64,
    /// Bytes of network reads received into a connection buffer first and
    /// copied from there (read ahead together with another reply).
    pub network_read_bytes_copied: u64,
    /// Bytes read, by the storage class of the block that served them
    /// (`BlockLoc::class`, either path), since the client was created:
    /// classes 0 (DRAM), 1 and 2 each in their own slot, every class from
    /// 3 up together in the last one.
    pub read_bytes_by_class: [u64; READ_CLASS_SLOTS],
}

/// Slots of [`DataPathStats::read_bytes_by_class`].
pub(crate) const READ_CLASS_SLOTS: usize = 4;

impl DataPathStats {
    /// The slot of [`DataPathStats::read_bytes_by_class`] that counts reads
    /// from storage class `class`.
    pub fn read_class_slot(class: u8) -> usize {
        (class as usize).min(READ_CLASS_SLOTS - 1)
    }
}

/// The host name, used as the default location class.
/// Now, in nanoseconds since the Unix epoch (what nodes keep as their
/// modification time).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

pub fn default_location() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// Options of a create besides path and type.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// Preferred storage class; `None` inherits the parent directory's
    /// preference, or uses the highest class with free space.
    pub storage_class: Option<u8>,
    /// Ask for blocks on storage servers at this client's location first.
    pub local: bool,
    /// For Tables: whether children are listed (default true).
    pub enumerable: bool,
    /// For a KeyValue: the size its writer will write, when known (0:
    /// unknown). A small value (up to a quarter block) is then stored in a
    /// piece of a block shared with other small values, and cannot grow
    /// past that piece. [`Client::put`] sets it.
    pub size_hint: u64,
    /// Tier migration never moves the node's blocks (e.g. broadcast data
    /// that must stay in DRAM; `docs/tiering.md`).
    pub pinned: bool,
    /// Permission bits; `None` gives 0o755 to containers and 0o644 to
    /// data nodes.
    pub mode: Option<u32>,
    /// Modification time (nanoseconds since the Unix epoch); `None` is now.
    pub mtime: Option<u64>,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            storage_class: None,
            local: false,
            enumerable: true,
            size_hint: 0,
            pinned: false,
            mode: None,
            mtime: None,
        }
    }
}

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
    pub(crate) leases: Arc<crate::leases::Leases>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.leases.client_gone();
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
    /// fails only if none answers.
    ///
    /// Without a token in `cfg`, it uses the one a server on this host
    /// published for one of the metadata servers' addresses
    /// ([`crate::settings::publish_token`]: `nk up` and `nk meta` do, for
    /// clients of their user), so a default one-machine cluster needs no
    /// setting (`docs/security.md`, *Secure by default*).
    pub async fn connect(mut cfg: ClientConfig) -> Result<Client> {
        if cfg.metas.is_empty() {
            return Err(Error::invalid_argument("no metadata server address given"));
        }
        if cfg.token.is_none() {
            cfg.token = crate::settings::published_token(&cfg.metas);
        }
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
        let client = Client {
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
            }),
        };
        let n = client.inner.cfg.metas.len();
        let answers =
            futures::future::join_all((0..n).map(|i| client.meta_at(i, &MetaRequest::Status)))
                .await;
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
            let first = errors.swap_remove(0);
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
            tokio::spawn(crate::leases::keep(
                Arc::downgrade(&client.inner),
                client.inner.leases.clone(),
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

    pub(crate) fn partition(&self, p: &str) -> usize {
        path::partition_of(p, self.inner.cfg.metas.len())
    }

    /// Sends a metadata request to partition `idx`.
    pub(crate) async fn meta_at(&self, idx: usize, req: &MetaRequest) -> Result<MetaReply> {
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

    async fn node_reply(&self, idx: usize, req: &MetaRequest) -> Result<NodeInfo> {
        match self.meta_at(idx, req).await? {
            MetaReply::Node(n) => Ok(n),
            other => Err(unexpected(other)),
        }
    }

    /// Creates a node. File and KeyValue handles come back open for writing
    /// (the caller holds the write lease until [`Node::close`]).
    pub async fn create(&self, p: &str, ty: NodeType, opts: CreateOptions) -> Result<Node> {
        self.create_or_open(p, ty, opts, false).await
    }

    /// Opens the File at `p` for appending (as [`Client::open_write`]),
    /// creating it with `opts` if there is none: one metadata call either
    /// way. `opts` are ignored for an existing File. Another node type at
    /// `p` is `AlreadyExists`; an existing File being written is `Busy`.
    pub async fn open_append(&self, p: &str, opts: CreateOptions) -> Result<Node> {
        self.create_or_open(p, NodeType::File, opts, true).await
    }

    async fn create_or_open(
        &self,
        p: &str,
        ty: NodeType,
        opts: CreateOptions,
        open_existing: bool,
    ) -> Result<Node> {
        path::components(p)?;
        let idx = self.partition(p);
        let req = MetaRequest::Create {
            path: p.to_string(),
            ty,
            storage_class: opts.storage_class.unwrap_or(NO_CLASS),
            location: if opts.local {
                self.inner.cfg.location.clone()
            } else {
                String::new()
            },
            enumerable: opts.enumerable,
            size_hint: opts.size_hint,
            pinned: opts.pinned,
            mode: opts.mode.unwrap_or(ty.default_mode()),
            mtime: opts.mtime.unwrap_or_else(now_ns),
            open_existing,
        };
        let info = self.node_reply(idx, &req).await?;
        if let Some(rec) = &info.record {
            self.write_record(rec, ty, leaf(p)).await;
        }
        Ok(Node::new(self.clone(), p.to_string(), idx, info))
    }

    /// Writes a child record into its container's data. Records are
    /// supplementary (the metadata server is the authority and enumeration
    /// falls back to it for a missing record), so a failure is logged, not
    /// returned: the node exists either way.
    pub(crate) async fn write_record(&self, rec: &RecordLoc, ty: NodeType, name: &str) {
        let bytes = record::encode(rec.container, rec.slot, ty, name);
        if let Err(e) = self.store_write(rec, &bytes).await {
            tracing::warn!(
                "could not write the record of {name} (slot {} of node {}): {e}",
                rec.slot,
                rec.container
            );
        }
    }

    /// Clears a child record, then lets the metadata server reuse its slot.
    /// A record that cannot be cleared keeps its slot out of use (the
    /// metadata server still reports the child as gone).
    async fn clear_record(&self, idx: usize, rec: &RecordLoc) {
        if let Err(e) = self.store_write(rec, &record::CLEARED).await {
            tracing::warn!(
                "could not clear record {} of node {}: {e}",
                rec.slot,
                rec.container
            );
            return;
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

    /// Creates a Directory (and, with `parents`, its missing ancestors).
    pub async fn mkdir(&self, p: &str, parents: bool) -> Result<()> {
        if !parents {
            return self
                .create(p, NodeType::Directory, CreateOptions::default())
                .await
                .map(drop);
        }
        let comps = path::components(p)?;
        for i in 1..=comps.len() {
            let sub = format!("/{}", comps[..i].join("/"));
            match self
                .create(&sub, NodeType::Directory, CreateOptions::default())
                .await
            {
                Ok(_) => {}
                Err(e) if e.code == nodekernel_proto::ErrorCode::AlreadyExists => {
                    let n = self.lookup(&sub).await?;
                    if n.info().ty != NodeType::Directory {
                        return Err(Error::type_mismatch(format!(
                            "{sub} exists and is a {}, not a Directory",
                            n.info().ty
                        )));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Looks a node up; the handle can read (not write).
    pub async fn lookup(&self, p: &str) -> Result<Node> {
        path::components(p)?;
        let idx = self.partition(p);
        let info = self
            .node_reply(
                idx,
                &MetaRequest::Lookup {
                    path: p.to_string(),
                },
            )
            .await?;
        Ok(Node::new(self.clone(), p.to_string(), idx, info))
    }

    /// Opens an existing File or KeyValue for writing (append, overwrite).
    /// Fails with `Busy` while another writer holds the node.
    pub async fn open_write(&self, p: &str) -> Result<Node> {
        path::components(p)?;
        let idx = self.partition(p);
        let info = self
            .node_reply(
                idx,
                &MetaRequest::OpenWrite {
                    path: p.to_string(),
                },
            )
            .await?;
        Ok(Node::new(self.clone(), p.to_string(), idx, info))
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
        path::components(p)?;
        let req = MetaRequest::SetAttrs {
            path: p.to_string(),
            mode,
            mtime,
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
                    self.write_record(&rec, ty, leaf(dst)).await;
                }
                for rec in [clear, replaced].into_iter().flatten() {
                    self.clear_record(a, &rec).await;
                }
                Ok(())
            }
            other => Err(unexpected(other)),
        }
    }

    /// Names of the live children of a container, in record-slot order
    /// (creation order, with freed slots reused lowest first). The names are
    /// read from the container's data through the data plane; the metadata
    /// server only contributes the live-slot bitmap, which is the authority:
    /// a record whose child is gone is never returned. Listing `/` merges
    /// every metadata partition, in partition order.
    pub async fn enumerate(&self, p: &str) -> Result<Vec<String>> {
        Ok(self
            .enumerate_typed(p)
            .await?
            .into_iter()
            .map(|(name, _)| name)
            .collect())
    }

    /// Like [`Client::enumerate`], with each child's type.
    pub async fn enumerate_typed(&self, p: &str) -> Result<Vec<(String, NodeType)>> {
        let comps = path::components(p)?;
        let parts: Vec<usize> = if comps.is_empty() {
            (0..self.inner.cfg.metas.len()).collect()
        } else {
            vec![self.partition(p)]
        };
        let mut out = Vec::new();
        for idx in parts {
            let listing = self
                .meta_at(
                    idx,
                    &MetaRequest::Enumerate {
                        path: p.to_string(),
                    },
                )
                .await?;
            let MetaReply::Listing {
                container,
                block_size,
                slots,
                live,
            } = listing
            else {
                return Err(unexpected(listing));
            };
            if slots == 0 {
                continue;
            }
            let is_live = |slot: usize| live[slot / 8] & (1 << (slot % 8)) != 0;
            let data = match self
                .read_container(p, idx, container, block_size, slots)
                .await
            {
                Ok(d) => d,
                // Records lost with a storage server: names come from the
                // metadata server instead.
                Err(e)
                    if matches!(
                        e.code,
                        ErrorCode::Unavailable
                            | ErrorCode::Timeout
                            | ErrorCode::DataLost
                            | ErrorCode::Stale
                    ) =>
                {
                    tracing::warn!(
                        "{p}: child records unreadable ({e}); asking the metadata server"
                    );
                    Vec::new()
                }
                Err(e) => return Err(e),
            };
            let mut entries: Vec<(u32, NodeType, String)> = Vec::new();
            let mut missing = Vec::new();
            for slot in (0..slots as usize).filter(|s| is_live(*s)) {
                let bytes = data
                    .get(slot * RECORD_SIZE..(slot + 1) * RECORD_SIZE)
                    .unwrap_or(&[]);
                match record::decode(bytes, container, slot as u32) {
                    Some((ty, name)) => entries.push((slot as u32, ty, name)),
                    None => missing.push(slot as u32),
                }
            }
            if !missing.is_empty() {
                for slots in missing.chunks(nodekernel_proto::meta::MAX_RECORD_NAMES) {
                    let req = MetaRequest::RecordNames {
                        container,
                        slots: slots.to_vec(),
                    };
                    match self.meta_at(idx, &req).await? {
                        MetaReply::Names(found) => entries.extend(found),
                        other => return Err(unexpected(other)),
                    }
                }
                entries.sort_by_key(|e| e.0);
            }
            out.extend(entries.into_iter().map(|(_, ty, name)| (name, ty)));
        }
        Ok(out)
    }

    /// Bytes of child-record data a container holds (its record slots times
    /// the record size): what enumerating it reads.
    pub async fn container_data_len(&self, p: &str) -> Result<u64> {
        path::components(p)?;
        let req = MetaRequest::Enumerate {
            path: p.to_string(),
        };
        match self.meta_at(self.partition(p), &req).await? {
            MetaReply::Listing { slots, .. } => Ok(slots as u64 * RECORD_SIZE as u64),
            other => Err(unexpected(other)),
        }
    }

    /// Reads a container's record array like a file.
    async fn read_container(
        &self,
        p: &str,
        idx: usize,
        id: u64,
        block_size: u32,
        slots: u32,
    ) -> Result<Vec<u8>> {
        let len = slots as u64 * RECORD_SIZE as u64;
        let info = NodeInfo {
            id,
            ty: NodeType::Directory,
            size: len,
            block_size,
            storage_class: NO_CLASS,
            location: String::new(),
            enumerable: true,
            mode: 0,
            mtime: 0,
            lease: 0,
            encrypted: false,
            first_block: None,
            record: None,
        };
        Node::new(self.clone(), p.to_string(), idx, info)
            .read(0, len)
            .await
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

    /// KeyValue put: create (replacing any old value), append, close. A
    /// put that fails leaves nothing behind: the new value is dropped and
    /// its blocks freed at once (the old value, if any, stays).
    ///
    /// Cancel safe: a put whose future is dropped before it finished (a
    /// timeout, `select!`, a cancelled Python task) is aborted in the
    /// background on the current tokio runtime, the same way. A create
    /// still in flight is finished first, so even a put dropped before it
    /// learnt its node leaves nothing behind; the value's blocks are freed
    /// as soon as that abort is answered, not when the metadata server
    /// sweeps abandoned puts. A put dropped during its close either
    /// stored the whole new value or left the old one. The bytes of
    /// `value` are not used after the future is dropped.
    pub async fn put(&self, p: &str, value: &[u8]) -> Result<()> {
        let opts = CreateOptions {
            size_hint: value.len() as u64,
            ..CreateOptions::default()
        };
        let mut put = UnfinishedPut::create(self, p, opts);
        let node = put.node().await?;
        let written = match node.append(value).await {
            Ok(()) => node.close_in_place().await,
            Err(e) => Err(e),
        };
        match written {
            Ok(()) => {
                put.finished();
                Ok(())
            }
            Err(e) => {
                // Awaited, so the space is free when the error is seen.
                if let Some(abort) = put.abort() {
                    let _ = abort.await;
                }
                Err(e)
            }
        }
    }

    /// KeyValue get (works for Files too): lookup, then read everything.
    /// If the value is replaced between the lookup and the read (the read
    /// gets `Stale`), the get looks the key up again, so it returns the
    /// current value rather than failing; after [`GET_ATTEMPTS`] replaced
    /// values in a row it gives up with `Stale`.
    pub async fn get(&self, p: &str) -> Result<Vec<u8>> {
        let mut attempt = 1;
        loop {
            let node = self.lookup(p).await?;
            let len = node.info().size;
            match node.read(0, len).await {
                Err(e) if e.code == ErrorCode::Stale && attempt < GET_ATTEMPTS => attempt += 1,
                r => return r,
            }
        }
    }

    /// Gets the values at `paths`, each as [`Client::get`], with up to
    /// `in_flight` gets outstanding: one result per path, in the order
    /// given, so a missing key is its own `NotFound` and fails none of the
    /// others (a reducer fetching the indexes of many map outputs). More
    /// than [`MAX_GET_MANY`] paths is `InvalidArgument`.
    pub async fn get_many<S: AsRef<str>>(
        &self,
        paths: &[S],
        in_flight: usize,
    ) -> Result<Vec<Result<Vec<u8>>>> {
        if paths.len() > MAX_GET_MANY {
            return Err(Error::invalid_argument(format!(
                "{} keys in one get; at most {MAX_GET_MANY}",
                paths.len()
            )));
        }
        Ok(futures::stream::iter(paths)
            .map(|p| self.get(p.as_ref()))
            .buffered(in_flight.max(1))
            .collect()
            .await)
    }
}

/// A [`Client::put`] that has not finished: its create, boxed so that a
/// dropped put can finish it, or its node. Dropped before
/// [`UnfinishedPut::finished`], it aborts the put in the background.
struct UnfinishedPut {
    path: String,
    state: PutState,
}

enum PutState {
    Creating(BoxFuture<'static, Result<Node>>),
    Writing(Box<Node>),
    Done,
}

impl UnfinishedPut {
    /// Starts creating the new value (the create runs when awaited).
    fn create(client: &Client, p: &str, opts: CreateOptions) -> UnfinishedPut {
        let (client, path) = (client.clone(), p.to_string());
        UnfinishedPut {
            path: p.to_string(),
            state: PutState::Creating(
                async move { client.create(&path, NodeType::KeyValue, opts).await }.boxed(),
            ),
        }
    }

    /// The new value's node, once created. Cancel safe.
    async fn node(&mut self) -> Result<&mut Node> {
        if let PutState::Creating(create) = &mut self.state {
            match create.await {
                Ok(node) => self.state = PutState::Writing(Box::new(node)),
                Err(e) => {
                    // Nothing was created: nothing to abort.
                    self.state = PutState::Done;
                    return Err(e);
                }
            }
        }
        match &mut self.state {
            PutState::Writing(node) => Ok(node),
            _ => Err(Error::internal(format!(
                "{}: the put has no node to write",
                self.path
            ))),
        }
    }

    /// The put is closed: nothing to abort.
    fn finished(&mut self) {
        self.state = PutState::Done;
    }

    /// Aborts the put in a task of its own (so that it runs to its end
    /// whatever happens to the caller), finishing its create first; `None`
    /// if there is nothing to abort or no runtime to run it on (the
    /// metadata server then drops the value once its lease lapses).
    fn abort(&mut self) -> Option<tokio::task::JoinHandle<()>> {
        let abort = match std::mem::replace(&mut self.state, PutState::Done) {
            PutState::Done => return None,
            PutState::Writing(node) => node.abort().boxed(),
            PutState::Creating(create) => async move {
                match create.await {
                    Ok(node) => node.abort().await,
                    // Never created: nothing to abort.
                    Err(_) => Ok(()),
                }
            }
            .boxed(),
        };
        let path = std::mem::take(&mut self.path);
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::debug!("{path}: a put dropped outside a tokio runtime is left to the sweep");
            return None;
        };
        Some(rt.spawn(async move {
            if let Err(e) = abort.await {
                // The metadata server drops the put once its lease lapses.
                tracing::debug!("{path}: could not abort the unfinished put: {e}");
            }
        }))
    }
}

impl Drop for UnfinishedPut {
    fn drop(&mut self) {
        // Not awaited: the put's future is gone.
        drop(self.abort());
    }
}

/// Lookups a [`Client::get`] makes before giving up on a key that keeps
/// being replaced under it.
pub const GET_ATTEMPTS: u32 = 64;

/// Most keys one [`Client::get_many`] takes.
pub const MAX_GET_MANY: usize = 1 << 16;

/// The last component of a valid non-root path.
pub(crate) fn leaf(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

pub(crate) fn unexpected(r: MetaReply) -> Error {
    Error::protocol(format!("unexpected reply from metadata server: {r:?}"))
}
