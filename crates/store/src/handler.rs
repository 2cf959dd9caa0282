//! The data port's requests: [`StoreHandler`] serves `StoreRequest`s
//! against a [`BlockStore`] (reads, writes, claims, block copies,
//! `Identify`, `Resize`), checking every capability first; DRAM reads are
//! sent straight from the shared region and large DRAM writes received
//! into it.

use crate::blocks::BlockStore;
use crate::capacity::Capacity;
use crate::metrics::StoreMetrics;
use bytes::{BufMut, Bytes, BytesMut};
use nodekernel_proto::cap::{identify_proof, unix_now, Cap, CapKey, CapSigner, Rights, Use};
use nodekernel_proto::store::{
    decode_write_prefix, encode_shm_info, op as store_op, read_reply_data, Claim, Identity,
    StoreRequest, TagCheck, READ_CHANGED_HANDS, READ_OK, READ_TRAILER_LEN, TAG_LEN,
    WRITE_PREFIX_LEN,
};
use nodekernel_proto::{Error, ErrorCode, Result};
use nodekernel_rpc::{
    ConnectionPool, DirectSink, Handler, Reply, ServerHandshake, SharedBody, VersionHandshake,
};
use nodekernel_shm::{InPlaceWrite, ServerRegion};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Serves `StoreRequest`s against a [`BlockStore`].
pub(crate) struct StoreHandler {
    pub(crate) store: Arc<BlockStore>,
    /// Abstract socket name handing out the DRAM region; empty when the
    /// memory is not shared.
    pub(crate) shm_name: String,
    /// Connections to other storage servers, for block copies.
    pub(crate) peers: ConnectionPool,
    /// Every connection's handshake (the token, when there is one).
    pub(crate) handshake: Arc<VersionHandshake>,
    /// What data-plane capabilities are checked with (drawn at start,
    /// given to the metadata servers at registration).
    pub(crate) cap_key: CapKey,
    /// `cap_key` made ready: every request's capability is checked with it.
    pub(crate) signer: CapSigner,
    /// Who this server is, for `Identify`.
    pub(crate) identity: String,
    pub(crate) incarnation: u64,
    /// Writes whose data went from the socket straight into the region.
    pub(crate) in_place: Arc<AtomicU64>,
    pub(crate) metrics: Arc<StoreMetrics>,
    /// The exported size `Resize` sets.
    pub(crate) capacity: Arc<Capacity>,
}

/// Bytes of a block in the DRAM region, sent as the end of a `Read` reply
/// (see [`StoreHandler::read_from_region`]).
struct RegionBody {
    /// Keeps the mapping `ptr` points into alive.
    region: Arc<ServerRegion>,
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

    /// A tenant (`docs/security.md`, *Tenants*) reads and writes blocks
    /// with the capabilities its metadata server gave it, and pings; the
    /// rest is for members: the shared-memory offer (a mapped region holds
    /// every tenant's blocks), claims, copies, resizes, identification.
    fn tenant_may(&self, op: u16) -> bool {
        use nodekernel_proto::store::op;
        matches!(op, op::READ | op::WRITE | op::PING)
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
        self.signer.check(
            cap,
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
        region: &Arc<ServerRegion>,
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
    pub(crate) async fn claim(&self, claims: &[Claim]) -> Result<()> {
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
