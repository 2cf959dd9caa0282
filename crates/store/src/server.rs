//! The running storage server: data port, registration and heartbeats.

use crate::admin::{StoreAdmin, StoreMetrics};
use crate::blocks::BlockStore;
use crate::capacity::Capacity;
use crate::config::{partition, DataDirConfig, FileIoConfig, MediumKind, StoreConfig};
use crate::datadir::{self, DataDir, Footprint};
use crate::medium::{DramMedium, FileMedium, Medium};
use crate::persist::{self, Discarded, GenFile, StoreState};
use crate::share::Share;
use crate::StoreError;
use bytes::{BufMut, Bytes, BytesMut};
use nodekernel_admin::status::StoreStatusOut;
use nodekernel_proto::cap::{identify_proof, unix_now, Cap, CapKey, Rights, Use};
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::store::{
    decode_write_prefix, encode_shm_info, op as store_op, read_reply_data, Claim, Identity,
    StoreRequest, TagCheck, READ_CHANGED_HANDS, READ_OK, READ_TRAILER_LEN, TAG_LEN,
    WRITE_PREFIX_LEN,
};
use nodekernel_proto::{Error, ErrorCode, Result};
use nodekernel_rpc::{
    ConnOptions, ConnectionPool, DirectSink, Handler, Reply, Role, ServerHandle, ServerHandshake,
    SharedBody, VersionHandshake,
};
use nodekernel_shm::{InPlaceWrite, Region};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

/// Serves `StoreRequest`s against a [`BlockStore`].
pub(crate) struct StoreHandler {
    store: Arc<BlockStore>,
    /// Abstract socket name handing out the DRAM region; empty when the
    /// memory is not shared.
    shm_name: String,
    /// Connections to other storage servers, for block copies.
    peers: ConnectionPool,
    /// Every connection's handshake (the token, when there is one).
    handshake: Arc<VersionHandshake>,
    /// What data-plane capabilities are checked with (drawn at start,
    /// given to the metadata servers at registration).
    pub(crate) cap_key: CapKey,
    /// Who this server is, for `Identify`.
    identity: String,
    incarnation: u64,
    /// Writes whose data went from the socket straight into the region.
    in_place: Arc<AtomicU64>,
    metrics: Arc<StoreMetrics>,
    /// The exported size `Resize` sets.
    capacity: Arc<Capacity>,
}

/// Bytes of a block in the DRAM region, sent as the end of a `Read` reply
/// (see [`StoreHandler::read_from_region`]).
struct RegionBody {
    /// Keeps the mapping `ptr` points into alive.
    region: Arc<Region>,
    block: u32,
    gen: u64,
    ptr: *const u8,
    len: usize,
}

// SAFETY: `ptr` points into the mapping `region` owns; it is only ever
// handed to send(2), from whichever thread sends the reply.
unsafe impl Send for RegionBody {}

// SAFETY: `ptr..ptr + len` lies inside the region's data (checked by
// `read_shared`), mapped for as long as `region`, which the body holds.
unsafe impl SharedBody for RegionBody {
    fn bytes(&self) -> (*const u8, usize) {
        (self.ptr, self.len)
    }

    fn trailer_len(&self) -> usize {
        READ_TRAILER_LEN
    }

    fn seal(&self, out: &mut BytesMut) {
        let status = if self.region.read_unchanged(self.block, self.gen) {
            READ_OK
        } else {
            READ_CHANGED_HANDS
        };
        out.extend_from_slice(&[status]);
    }
}

/// The tag at the start of `b` (which a read of at least [`TAG_LEN`]
/// bytes filled).
fn tag_bytes(b: &[u8]) -> Result<[u8; TAG_LEN as usize]> {
    b.get(..TAG_LEN as usize)
        .and_then(|t| t.try_into().ok())
        .ok_or_else(|| Error::internal(format!("a tag read returned {} bytes", b.len())))
}

/// Bytes of a file read's reply besides its data: the frame header, the
/// status byte, and room to spare.
const READ_REPLY_OVERHEAD: usize = 64;

/// How long a persistent server's stop waits for writes in flight before
/// it gives up on a clean stop (see [`StorageServer::shutdown`]).
pub const CLEAN_STOP_PATIENCE: Duration = Duration::from_secs(2);

/// Bytes a block copy moves per request.
const COPY_CHUNK: u32 = 1 << 20;

/// A write's data received from the socket straight into the DRAM block
/// (`nodekernel_rpc::DirectSink`); the write ends when it is dropped, and
/// is counted then (with its bytes, also if its peer left mid-frame).
struct RegionSink {
    write: InPlaceWrite,
    started: std::time::Instant,
    metrics: Arc<StoreMetrics>,
}

impl Drop for RegionSink {
    fn drop(&mut self) {
        self.metrics.written(self.write.len());
        self.metrics.done(store_op::WRITE, self.started);
    }
}

// SAFETY: the `InPlaceWrite` keeps the region mapped and the block's bytes
// writable under its generation until it is dropped.
unsafe impl DirectSink for RegionSink {
    fn dest(&self) -> (*mut u8, usize) {
        (self.write.ptr(), self.write.len())
    }
}

impl Handler for StoreHandler {
    fn handshake(&self) -> Arc<dyn ServerHandshake> {
        self.handshake.clone()
    }

    /// A write carries at most one block, a claim a bounded batch, the
    /// rest a few hundred bytes: a larger frame is refused from its
    /// header, before any of it is buffered.
    fn max_payload(&self, op: u16) -> usize {
        nodekernel_proto::store::max_request_len(op, self.store.block_size())
    }

    /// A read from a file holds its data twice until its reply is sent:
    /// in the reply, and, while the disk reads it, in an aligned buffer.
    /// (A DRAM server sends its reads from the region.) A read its
    /// capability does not cover is refused and reserves nothing.
    fn reply_len(&self, op: u16, payload: &[u8]) -> usize {
        if op != store_op::READ || self.store.shared_region().is_some() {
            return 0;
        }
        match StoreRequest::decode(op, payload) {
            Ok(StoreRequest::Read {
                block,
                gen,
                offset,
                len,
                tag,
                cap,
            }) if self.check_read(&cap, block, gen, offset, len, tag).is_ok() => {
                // A small value's tag may be read with its bytes.
                let (at, span) = (offset.saturating_sub(TAG_LEN), len.saturating_add(TAG_LEN));
                READ_REPLY_OVERHEAD + span as usize + self.store.read_buffer_len(block, at, span)
            }
            _ => 0,
        }
    }

    /// Writes to a DRAM block take their data straight from the socket.
    fn direct_prefix(&self, op: u16) -> Option<usize> {
        (op == store_op::WRITE && self.store.shared_region().is_some()).then_some(WRITE_PREFIX_LEN)
    }

    async fn direct_sink(
        &self,
        op: u16,
        prefix: &[u8],
        data_len: usize,
    ) -> Result<Option<Box<dyn DirectSink>>> {
        let (Some(region), store_op::WRITE) = (self.store.shared_region(), op) else {
            return Ok(None);
        };
        let started = std::time::Instant::now();
        let (block, gen, offset, cap) = decode_write_prefix(prefix)?;
        let len = u32::try_from(data_len)
            .map_err(|_| Error::out_of_range(format!("a write of {data_len} bytes")))?;
        self.check_cap(&cap, block, gen, offset, len, Rights::WRITE)?;
        let write = region.write_in_place(block, gen, offset, data_len).await?;
        self.in_place.fetch_add(1, Ordering::Relaxed);
        Ok(Some(Box::new(RegionSink {
            write,
            started,
            metrics: self.metrics.clone(),
        })))
    }

    /// Every byte of the write arrived: dropping the sink ends it.
    async fn handle_direct(
        &self,
        _op: u16,
        _prefix: Bytes,
        sink: Box<dyn DirectSink>,
        _out: &mut BytesMut,
    ) -> Result<()> {
        drop(sink);
        Ok(())
    }

    async fn handle_reply(&self, op: u16, payload: Bytes, reply: &mut Reply) -> Result<()> {
        let started = std::time::Instant::now();
        let result = self.reply_to(op, payload, reply).await;
        self.metrics.done(op, started);
        result
    }

    async fn handle(&self, op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        match StoreRequest::decode(op, &payload)? {
            StoreRequest::Read {
                block,
                gen,
                offset,
                len,
                tag,
                cap,
            } => {
                self.check_read(&cap, block, gen, offset, len, tag)?;
                // All of the reply at once (never grown, and so copied,
                // as the bytes and the status byte come).
                out.reserve(len as usize + (TAG_LEN as usize) + READ_TRAILER_LEN);
                // Copied into the reply (the media other than DRAM; DRAM
                // replies are sent from the region by `handle_reply`).
                match tag {
                    // A small value read from its start: the tag and the
                    // bytes in one read, the tag then cut off.
                    Some(t) if t.at.checked_add(TAG_LEN) == Some(offset) => {
                        let start = out.len();
                        let with_tag = len.checked_add(TAG_LEN).ok_or_else(|| {
                            Error::out_of_range(format!("read of {len} bytes is too long"))
                        })?;
                        self.store.read(block, gen, t.at, with_tag, out).await?;
                        t.check(tag_bytes(&out[start..])?, block)?;
                        out.copy_within(start + TAG_LEN as usize.., start);
                        out.truncate(start + len as usize);
                    }
                    Some(t) => {
                        self.check_tag(block, gen, t).await?;
                        self.store.read(block, gen, offset, len, out).await?;
                    }
                    None => self.store.read(block, gen, offset, len, out).await?,
                }
                out.extend_from_slice(&[READ_OK]);
                self.metrics.read(len);
                Ok(())
            }
            StoreRequest::Write {
                block,
                gen,
                offset,
                cap,
                data,
            } => {
                let n = data.len();
                let len = u32::try_from(n)
                    .map_err(|_| Error::out_of_range(format!("a write of {n} bytes")))?;
                // A zero-length write only claims the block at the
                // capability's generation, which a reader may do (see
                // `StoreHandler::claim`): a reader catching up with a fence.
                let needs = if n == 0 { Rights::READ } else { Rights::WRITE };
                self.check_cap(&cap, block, gen, offset, len, needs)?;
                self.store.write(block, gen, offset, data).await?;
                self.metrics.written(n);
                Ok(())
            }
            StoreRequest::Ping => Ok(()),
            StoreRequest::ShmInfo => {
                encode_shm_info(out, &self.shm_name);
                Ok(())
            }
            StoreRequest::Claim { claims } => self.claim(&claims).await,
            StoreRequest::Copy {
                block,
                gen,
                cap,
                src_addr,
                src_block,
                src_gen,
                src_cap,
            } => {
                self.check_cap(&cap, block, gen, 0, self.store.block_size(), Rights::MANAGE)?;
                self.copy(block, gen, &src_addr, src_block, src_gen, src_cap)
                    .await
            }
            StoreRequest::Resize { bytes } => {
                let exported = self.capacity.set(bytes);
                tracing::info!(
                    "asked to export {bytes} bytes: exporting {exported} (blocks in use move away first)"
                );
                out.put_u64_le(exported);
                Ok(())
            }
            StoreRequest::Identify { nonce } => {
                Identity {
                    identity: self.identity.clone(),
                    incarnation: self.incarnation,
                    proof: identify_proof(&self.cap_key, &nonce, &self.identity, self.incarnation),
                }
                .encode(out);
                Ok(())
            }
        }
    }
}

impl StoreHandler {
    /// Answers one request (see [`Handler::handle_reply`]): DRAM reads
    /// from the region without a copy, the rest through
    /// [`Handler::handle`].
    async fn reply_to(&self, op: u16, payload: Bytes, reply: &mut Reply) -> Result<()> {
        if let (store_op::READ, Some(region)) = (op, self.store.shared_region()) {
            if let StoreRequest::Read {
                block,
                gen,
                offset,
                len,
                tag,
                cap,
            } = StoreRequest::decode(op, &payload)?
            {
                self.check_read(&cap, block, gen, offset, len, tag)?;
                if let Some(t) = tag {
                    let mut found = [0; TAG_LEN as usize];
                    region.read(block, gen, t.at, &mut found)?;
                    t.check(found, block)?;
                }
                Self::read_from_region(region, block, gen, offset, len, reply)?;
                self.metrics.read(len);
                return Ok(());
            }
        }
        self.handle(op, payload, reply.out()).await
    }

    /// Checks that `cap` covers a read of `len` bytes at `offset` and the
    /// tag it checks first, if any.
    fn check_read(
        &self,
        cap: &Cap,
        block: u32,
        gen: u64,
        offset: u32,
        len: u32,
        tag: Option<TagCheck>,
    ) -> Result<()> {
        let (mut start, mut end) = (offset as u64, offset as u64 + len as u64);
        if let Some(t) = tag {
            start = start.min(t.at as u64);
            end = end.max(t.at as u64 + TAG_LEN as u64);
        }
        let span = u32::try_from(end - start)
            .map_err(|_| Error::out_of_range(format!("a read of {len} bytes at {offset}")))?;
        self.check_cap(cap, block, gen, start as u32, span, Rights::READ)
    }

    /// Checks that `cap` allows `needs` on `len` bytes at `offset` of
    /// `block` at `gen`, now.
    fn check_cap(
        &self,
        cap: &Cap,
        block: u32,
        gen: u64,
        offset: u32,
        len: u32,
        needs: Rights,
    ) -> Result<()> {
        cap.check(
            &self.cap_key,
            Use {
                block,
                gen,
                offset,
                len,
                needs,
                now: unix_now(),
            },
        )
    }

    /// A read from the DRAM region, sent from it without a copy: the
    /// generation is checked before, and again after the bytes went out
    /// (the trailer says whether it held).
    pub(crate) fn read_from_region(
        region: &Arc<Region>,
        block: u32,
        gen: u64,
        offset: u32,
        len: u32,
        reply: &mut Reply,
    ) -> Result<()> {
        let ptr = region.read_shared(block, gen, offset, len)?;
        reply.set_body(Box::new(RegionBody {
            region: region.clone(),
            block,
            gen,
            ptr,
            len: len as usize,
        }));
        Ok(())
    }

    /// Checks a small value's tag (`Stale` when it names another node, or
    /// none: the value was replaced or deleted), on media other than DRAM
    /// (whose reads check it in the region, without a buffer).
    async fn check_tag(&self, block: u32, gen: u64, t: TagCheck) -> Result<()> {
        let mut found = BytesMut::with_capacity(TAG_LEN as usize);
        self.store
            .read(block, gen, t.at, TAG_LEN, &mut found)
            .await?;
        t.check(tag_bytes(&found)?, block)
    }

    /// Claims each block with its generation (a zero-length write), and
    /// clears the tags of freed small values (a write of zeros at that
    /// generation) and scrubs blocks handed to encrypted nodes (zeros over
    /// the whole block, at that generation). A block already claimed by a
    /// newer owner is fine: the claim's purpose, that nobody older writes
    /// there, holds. Every claim is tried; the first other error is
    /// returned.
    async fn claim(&self, claims: &[Claim]) -> Result<()> {
        let mut first_err = None;
        for c in claims {
            let (block, gen) = (c.block, c.gen);
            // A plain claim only catches the block up with the generation
            // its capability names: any holder may make it. Clearing a tag,
            // scrubbing or releasing destroys bytes: the metadata server's.
            let needs = if c.release {
                Rights::MANAGE
            } else {
                Rights::READ
            };
            let checked = match c.clear_tag_at {
                Some(at) => self.check_cap(&c.cap, block, gen, at, TAG_LEN, Rights::MANAGE),
                None if c.scrub => self.check_cap(
                    &c.cap,
                    block,
                    gen,
                    0,
                    self.store.block_size(),
                    Rights::MANAGE,
                ),
                None => self.check_cap(&c.cap, block, gen, 0, 0, needs),
            };
            if let Err(e) = checked {
                first_err.get_or_insert(e);
                continue;
            }
            let done = match c.clear_tag_at {
                Some(at) => {
                    self.store
                        .write(block, gen, at, &[0; TAG_LEN as usize])
                        .await
                }
                None if c.scrub => {
                    let zeros = vec![0u8; self.store.block_size() as usize];
                    self.store.write(block, gen, 0, &zeros).await
                }
                None => self.store.write(block, gen, 0, &[]).await,
            };
            match done {
                Ok(()) if c.release => {
                    if let Err(e) = self.store.release(block) {
                        tracing::warn!("cannot give the memory of block {block} back: {e}");
                    }
                }
                Ok(()) => {}
                Err(e) if e.code == ErrorCode::Stale => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Copies block `src_block` (at `src_gen`) of the storage server at
    /// `src_addr` into `block`, claimed with `gen`.
    async fn copy(
        &self,
        block: u32,
        gen: u64,
        src_addr: &str,
        src_block: u32,
        src_gen: u64,
        src_cap: Cap,
    ) -> Result<()> {
        let bs = self.store.block_size();
        // Claim first: a failed copy leaves the target claimed (the
        // metadata server frees it), never with an older owner's bytes.
        self.store.write(block, gen, 0, &[]).await?;
        let mut offset = 0;
        while offset < bs {
            let len = COPY_CHUNK.min(bs - offset);
            let req = StoreRequest::Read {
                block: src_block,
                gen: src_gen,
                offset,
                len,
                tag: None,
                cap: src_cap,
            };
            let mut buf = BytesMut::new();
            req.encode(&mut buf);
            let reply = self.peers.call(src_addr, req.op(), &[&buf]).await?;
            let data = read_reply_data(reply, src_block, src_gen, len as usize).map_err(|e| {
                Error::new(e.code, format!("storage server {src_addr}: {}", e.message))
            })?;
            self.store.write(block, gen, offset, &data).await?;
            offset += len;
        }
        Ok(())
    }
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
        self.ids.lock().unwrap_or_else(|p| p.into_inner())[i] = id;
    }

    fn id(&self, i: usize) -> Option<u32> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner())[i]
    }

    /// The id with each metadata server.
    pub(crate) fn ids(&self) -> Vec<Option<u32>> {
        self.ids.lock().unwrap_or_else(|p| p.into_inner()).clone()
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

/// What [`prepare`] set up.
struct Prepared {
    medium: Box<dyn Medium>,
    footprint: Footprint,
    /// The generation file of a persistent file medium.
    gens: Option<GenFile>,
    persist: Option<Persist>,
}

/// A persistent server's state (see [`persist`](crate::persist)).
struct Persist {
    dir: PathBuf,
    /// As written at start (`clean = false`).
    state: StoreState,
    /// Whether the blocks of the last run were kept, or why not.
    kept: std::result::Result<(), Discarded>,
}

/// Sets up what a server holds on disk and in memory: locks and reads its
/// data directory, then creates the medium (after locking a block file).
/// A persistent server first decides whether to keep its blocks, and
/// writes its state file (`clean = false`) before returning, so before
/// anything can change a block. Blocking work (file system calls,
/// preallocating, prefaulting DRAM): run it off the async workers. On
/// error, the dropped footprint removes what was created.
fn prepare(
    cfg: &StoreConfig,
    num_blocks: u32,
    bytes: u64,
    file_io: &FileIoConfig,
) -> std::result::Result<Prepared, StoreError> {
    let block_size = cfg.block_size;
    let dir = match &cfg.data_dir {
        DataDirConfig::None => None,
        DataDirConfig::At(p) => Some(DataDir::open(p)?),
        DataDirConfig::Private => Some(DataDir::private("store")?),
    };
    let mut footprint = Footprint::new(dir, cfg.persistent);
    let block_path = match &cfg.medium {
        MediumKind::Dram => None,
        MediumKind::File { path } => Some(match footprint.data_dir() {
            Some(d) if path.is_relative() => d.path().join(path),
            _ => path.clone(),
        }),
    };
    if !cfg.persistent {
        if let Some(d) = footprint.data_dir() {
            // A persistent server may have used this directory before: its
            // state file must not vouch for files this server is about to
            // empty or reuse (were it persistent again later).
            let state_path = d.path().join(persist::STATE_FILE);
            persist::remove_state(d.path())
                .map_err(|e| StoreError::io("remove", &state_path, e))?;
        }
        let medium: Box<dyn Medium> = match &block_path {
            None => Box::new(DramMedium::new(block_size, num_blocks)?),
            Some(path) => {
                let m = FileMedium::create_with(path, bytes, file_io)?;
                if let Some(b) = m.footprint() {
                    footprint.set_block_file(b);
                }
                Box::new(m)
            }
        };
        return Ok(Prepared {
            medium,
            footprint,
            gens: None,
            persist: None,
        });
    }
    // Persistent (validated: the data directory is `At`).
    let dir = match footprint.data_dir() {
        Some(d) => d.path().to_path_buf(),
        None => {
            return Err(StoreError::config(
                "persistent",
                "needs a data directory (data_dir)",
            ))
        }
    };
    let settings = persist::Settings {
        dram: block_path.is_none(),
        block_size,
        num_blocks,
    };
    let boot = persist::boot_id();
    let dram_path = dir.join(persist::DRAM_FILE);
    let gens_path = dir.join(persist::GENS_FILE);
    let state_path = dir.join(persist::STATE_FILE);
    let kept = persist::decide(&dir, settings, boot).and_then(|incarnation| {
        let files = match &block_path {
            None => Region::check_file(&dram_path, block_size, num_blocks),
            Some(path) => persist::check_size(path, bytes.next_multiple_of(crate::file::ALIGN))
                .and_then(|()| persist::check_size(&gens_path, u64::from(num_blocks) * 8)),
        };
        files.map(|()| incarnation).map_err(Discarded::MediumFiles)
    });
    let keep = kept.is_ok();
    if !keep {
        // Before any medium file is emptied: a crash from here on finds no
        // state file, and discards again.
        persist::remove_state(&dir).map_err(|e| StoreError::io("remove", &state_path, e))?;
    }
    let (medium, gens): (Box<dyn Medium>, Option<GenFile>) = match &block_path {
        None => {
            footprint.note_new(&dram_path);
            (
                Box::new(DramMedium::open_file(
                    &dram_path, block_size, num_blocks, keep,
                )?),
                None,
            )
        }
        Some(path) => {
            let m = FileMedium::open_with(path, bytes, file_io, keep)?;
            if let Some(b) = m.footprint() {
                footprint.set_block_file(b);
            }
            footprint.note_new(&gens_path);
            let gens = GenFile::open(&gens_path, num_blocks, keep)?;
            (Box::new(m), Some(gens))
        }
    };
    let incarnation = match &kept {
        Ok(i) => *i,
        Err(_) => datadir::random_incarnation()
            .map_err(|e| StoreError::io("generate an incarnation from", "getrandom", e))?,
    };
    let state = StoreState {
        dram: settings.dram,
        clean: false,
        block_size,
        num_blocks,
        incarnation,
        boot_id: boot.unwrap_or([0; 16]),
    };
    footprint.note_new(&state_path);
    state
        .write(&dir)
        .map_err(|e| StoreError::io("write", &state_path, e))?;
    Ok(Prepared {
        medium,
        footprint,
        gens,
        persist: Some(Persist {
            dir,
            state,
            kept: kept.map(|_| ()),
        }),
    })
}

/// Binds the data port: for a persistent server whose configured port is
/// 0, first the address it had last time (remembered in its data
/// directory), so that clients and metadata servers holding it can carry
/// on; a fresh port if that is taken.
async fn bind(
    cfg: &StoreConfig,
    persist: Option<&Persist>,
) -> std::io::Result<tokio::net::TcpListener> {
    let wanted: Option<SocketAddr> = cfg.listen.parse().ok();
    let remembered = persist.and_then(|p| persist::read_address(&p.dir));
    if let (Some(w), Some(old)) = (wanted, remembered) {
        if w.port() == 0 && w.ip() == old.ip() && old.port() != 0 {
            // The server before us may be closing its listener right now
            // (a restart within one process): give it a moment.
            let mut tries = 0;
            loop {
                match tokio::net::TcpListener::bind(old).await {
                    Ok(l) => return Ok(l),
                    Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 10 => {
                        tries += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(e) => {
                        tracing::info!(
                            "storage server: its previous address {old} is not free ({e}); taking a new port"
                        );
                        break;
                    }
                }
            }
        }
    }
    tokio::net::TcpListener::bind(&cfg.listen).await
}

/// Handle of a running storage server. Dropping it stops the server.
pub struct StorageServer {
    local_addr: SocketAddr,
    advertise: String,
    num_blocks: u32,
    store: Arc<BlockStore>,
    server: ServerHandle,
    share: Option<Share>,
    stopped: AtomicBool,
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
        let bytes = cfg.exported_bytes(num_blocks);
        // Locking, preallocation and prefaulting DRAM (about 1 s per GiB)
        // block: keep them off the async workers.
        let Prepared {
            medium,
            footprint,
            gens,
            persist,
        } = {
            let cfg = cfg.clone();
            tokio::task::spawn_blocking(move || prepare(&cfg, num_blocks, bytes, &file_io))
                .await
                .map_err(|e| {
                    StoreError::Rpc(Error::internal(format!("medium set-up task failed: {e}")))
                })??
        };
        if let Some(p) = &persist {
            let dir = p.dir.display();
            match &p.kept {
                Ok(()) => tracing::info!(
                    "storage server in {dir}: kept its {num_blocks} blocks from the last run (incarnation {:016x})",
                    p.state.incarnation
                ),
                Err(why @ Discarded::NoState) => {
                    tracing::info!("storage server in {dir}: starts empty: {why}")
                }
                Err(why) => tracing::warn!(
                    "storage server in {dir}: starts empty, the blocks of its last run are discarded: {why}"
                ),
            }
        }
        // From here on, an early return drops `footprint`, which removes
        // what this start created while it still holds the locks.
        let identity = match footprint.data_dir() {
            Some(d) => d.identity().to_string(),
            None => datadir::random_identity()
                .map_err(|e| StoreError::io("generate an identity from", "getrandom", e))?,
        };
        let incarnation = match &persist {
            Some(p) => p.state.incarnation,
            None => datadir::random_incarnation()
                .map_err(|e| StoreError::io("generate an incarnation from", "getrandom", e))?,
        };
        // Drawn by every process: capabilities from before a restart are
        // refused, and their holders ask the metadata server again.
        let mut cap_key: CapKey = [0; nodekernel_proto::cap::CAP_KEY_LEN];
        nodekernel_rpc::random_bytes(&mut cap_key)
            .map_err(|e| StoreError::io("generate a capability key from", "getrandom", e))?;
        let store = Arc::new(BlockStore::with_gens(
            medium,
            cfg.block_size,
            num_blocks,
            gens,
        ));
        // Sharing is an optimisation: without the socket, clients simply
        // use the data port.
        let share = match store.shared_region() {
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
        };

        let listen_err = |error| StoreError::Listen {
            addr: cfg.listen.clone(),
            error,
        };
        let listener = bind(&cfg, persist.as_ref()).await.map_err(listen_err)?;
        let local_addr = listener.local_addr().map_err(listen_err)?;
        if let Some(p) = &persist {
            let path = p.dir.join(persist::ADDRESS_FILE);
            footprint.note_new(&path);
            if let Err(e) = persist::write_address(&p.dir, local_addr) {
                tracing::warn!("cannot remember the address in {}: {e}", path.display());
            }
        }
        let in_place = Arc::new(AtomicU64::new(0));
        let metrics = Arc::new(StoreMetrics::default());
        let k = cfg.metas.len();
        let capacity = Arc::new(Capacity::new(
            cfg.block_size,
            (0..k).map(|i| partition(num_blocks, k, i).1).collect(),
            cfg.dynamic.clone(),
        ));
        let server = nodekernel_rpc::serve_with(
            listener,
            Arc::new(StoreHandler {
                store: store.clone(),
                shm_name: share
                    .as_ref()
                    .map(|s| s.name().to_string())
                    .unwrap_or_default(),
                peers: cfg
                    .security
                    .pool(Role::StorageServer, ConnOptions::new(cfg.rpc_timeout)),
                handshake: cfg.security.handshake(Role::StorageServer),
                cap_key,
                identity: identity.clone(),
                incarnation,
                in_place: in_place.clone(),
                metrics: metrics.clone(),
                capacity: capacity.clone(),
            }),
            nodekernel_rpc::ServeOptions {
                spin: cfg.poll_spin,
                local_peers: cfg.security.local_peers,
                ..Default::default()
            },
        )
        .map_err(StoreError::Rpc)?;

        #[cfg(test)]
        crate::tests::note_cap_key(&local_addr.to_string(), cap_key);
        let advertise = match &cfg.advertise {
            Some(a) => a.clone(),
            None => {
                if local_addr.ip().is_unspecified() && !cfg.metas.is_empty() {
                    tracing::warn!(
                        "storage server bound to {local_addr} registers that wildcard address; set `advertise`"
                    );
                }
                local_addr.to_string()
            }
        };
        let requests = (0..k)
            .map(|i| {
                let (first_block, count) = partition(num_blocks, k, i);
                MetaRequest::Register(nodekernel_proto::ServerSpec {
                    addr: advertise.clone(),
                    class: cfg.class,
                    class_name: cfg.class_name.clone(),
                    medium: store.medium_kind().to_string(),
                    location: cfg.location.clone(),
                    block_size: cfg.block_size,
                    first_block,
                    num_blocks: count,
                    identity: identity.clone(),
                    incarnation,
                    cap_key,
                })
            })
            .collect();
        let registrar = Arc::new(Registrar {
            pool: cfg
                .security
                .pool(Role::StorageServer, ConnOptions::new(cfg.rpc_timeout)),
            metas: cfg.metas.clone(),
            requests,
            ids: Mutex::new(vec![None; k]),
            metrics: metrics.clone(),
            capacity,
            cap_key,
            seq: AtomicU64::new(0),
        });

        let mut srv = StorageServer {
            local_addr,
            advertise,
            num_blocks,
            store,
            server,
            share,
            stopped: AtomicBool::new(false),
            registrar: registrar.clone(),
            heartbeats: Vec::new(),
            identity,
            incarnation,
            cap_key,
            footprint,
            in_place,
            persist,
            admin: None,
        };
        // Register with all metadata servers concurrently. On failure `srv`
        // drops, which stops the data port again and removes what this
        // start created.
        let pending: Vec<_> = (0..k)
            .map(|i| {
                let reg = registrar.clone();
                let patience = cfg.rpc_timeout;
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
        if let Some(e) = first_err {
            return Err(e);
        }
        if let Some(addr) = cfg.admin.as_deref() {
            let source = StoreAdmin {
                metrics,
                in_place: srv.in_place.clone(),
                registrar: registrar.clone(),
                info: StoreStatusOut {
                    role: "store",
                    addr: srv.advertise.clone(),
                    identity: srv.identity.clone(),
                    class: cfg.class,
                    class_name: cfg.class_name.clone(),
                    medium: srv.store.medium_kind().to_string(),
                    io_mode: srv.store.io_mode().to_string(),
                    block_size: cfg.block_size,
                    blocks: num_blocks as u64,
                    capacity_bytes: cfg.exported_bytes(num_blocks),
                    metas: cfg.metas.clone(),
                    ..Default::default()
                },
            };
            let admin = nodekernel_admin::AdminServer::start(addr, Arc::new(source))
                .await
                .map_err(StoreError::Admin)?;
            srv.admin = Some(admin);
        }
        srv.heartbeats = (0..k)
            .map(|i| tokio::spawn(heartbeat_loop(registrar.clone(), i, cfg.heartbeat_interval)))
            .collect();
        srv.footprint.started();
        tracing::info!(
            "storage server on {} exports {num_blocks} {} blocks of {} bytes ({}{}), identity {}{}",
            srv.local_addr,
            srv.store.medium_kind(),
            cfg.block_size,
            srv.store.io_mode(),
            match &srv.share {
                Some(s) => format!(", shared with co-located clients at @{}", s.name()),
                None => String::new(),
            },
            srv.identity,
            match srv.data_dir() {
                Some(d) => format!(", data directory {}", d.display()),
                None => String::new(),
            }
        );
        Ok(srv)
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
        self.registrar
            .ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
