//! The block-I/O layer: the only code in the client that moves block bytes.
//!
//! Every read and write of a block piece — node data, streams, Bag chunks,
//! child records — goes through [`BlockIo`]. It:
//! - picks the path per block: a memory copy through the mapped region of a
//!   co-located DRAM storage server, or a `Read`/`Write` request over the
//!   network;
//! - turns `Stale` on a block of a node that still exists into re-map and
//!   retry ([`Locate::relocate`]), so blocks can move under readers and
//!   writers (migration, drain); only a node that is gone or replaced (or
//!   a writer whose lease was taken over) surfaces the error;
//! - follows a block whose storage server is unreachable to the address
//!   the metadata server knows now (a persistent server back on another
//!   port); any other unreachable server's error stands;
//! - moves a write that cannot reach its storage server to another block
//!   ([`Locate::replace`]) when the bytes of that block are all still in
//!   the caller's hands;
//! - counts every transfer by path ([`DataPathStats`]) and reports it to the
//!   [`AccessHook`], mapped transfers included (which servers never see):
//!   the place for per-block access statistics and metrics;
//! - seals and opens the chunks of encrypted nodes (`read_sealed_into`,
//!   `write_sealed`; `docs/encryption.md`): plaintext never leaves this
//!   layer for a storage server, and a chunk that fails authentication is
//!   `Integrity`, never bytes.
//!
//! Invariant: no other module touches a mapped region or sends a data
//! request (the `blockio_is_the_only_data_path` test greps for it).

use crate::crypt::{ChunkPlace, Seal};
use crate::local::{Local, Mapped};
use bytes::{Bytes, BytesMut};
use nodekernel_proto::crypt::{self, CHUNK, NONCE_LEN, OVERHEAD};
use nodekernel_proto::store::{
    check_read_status, encode_write_prefix, op as store_op, read_reply_data, StoreRequest,
    READ_TRAILER_LEN, TAG_LEN,
};
use nodekernel_proto::{BlockLoc, Error, ErrorCode, Result};
use nodekernel_rpc::ConnectionPool;
use nodekernel_shm::ClientRegion;
use std::future::Future;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
    /// Bytes of small network reads (with their status bytes), received
    /// with the frames around them and copied on purpose: under
    /// [`nodekernel_rpc::DIRECT_REPLY_MIN`], a copy costs less than
    /// receiving straight into the reader's buffer.
    pub network_read_bytes_small: u64,
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

/// Re-maps one transfer may make after `Stale` before giving up (each one
/// found the block at a new location, so this only stops a block that
/// keeps moving).
pub const MAX_RELOCATIONS: u32 = 16;

/// Re-maps one transfer may make that find its block in the same place
/// under a newer generation (a small value's slab stamped to reuse freed
/// pieces) before giving up. Stamps come one per batch of reused pieces,
/// so a busy slab may fence an in-flight transfer a few times; this only
/// stops one that never gets through.
pub const MAX_REFENCES: u32 = 256;

/// The re-maps of one transfer: moves to a new place, and fences in place.
#[derive(Default)]
struct Follows {
    moves: u32,
    fences: u32,
}

impl Follows {
    fn may_follow(&self) -> bool {
        self.moves < MAX_RELOCATIONS && self.fences < MAX_REFENCES
    }

    /// Counts a re-map from `from` to `to`: in place under a newer
    /// generation is a fence; anything else (the same location again
    /// included) counts as a move.
    fn count(&mut self, from: &BlockLoc, to: &BlockLoc) {
        let in_place = (&from.addr, from.server, from.block, from.offset)
            == (&to.addr, to.server, to.block, to.offset)
            && to.gen > from.gen;
        if in_place {
            self.fences += 1;
        } else {
            self.moves += 1;
        }
    }
}

/// One block transfer, as the [`AccessHook`] sees it.
#[derive(Debug, Clone, Copy)]
pub struct Access<'a> {
    /// The block, at the generation used.
    pub loc: &'a BlockLoc,
    /// Byte offset inside the block, and length.
    pub offset: u32,
    pub len: usize,
    pub write: bool,
    /// Through mapped memory (`true`) or the network.
    pub mapped: bool,
}

/// Sees every successful block transfer of a client (set in
/// [`ClientConfig::access_hook`](crate::ClientConfig::access_hook)). Called
/// on the transfer's task: keep it short and non-blocking.
pub trait AccessHook: Send + Sync + std::fmt::Debug {
    fn on_access(&self, access: &Access<'_>);
}

/// How a transfer finds its block again: implemented by the node handle.
pub(crate) trait Locate {
    /// Block `index` was refused as `Stale` (`err`): its current location
    /// according to the metadata server (which may be the refused one
    /// itself), or the error to surface (the node is gone or replaced, the
    /// lease was taken over).
    fn relocate(&self, index: u64, err: Error) -> impl Future<Output = Result<BlockLoc>> + Send;

    /// The storage server of `lost` (block `index`) cannot be reached:
    /// a new block to write instead (only asked when every byte of the
    /// block is in the transfer).
    fn replace(&self, index: u64, lost: &BlockLoc)
        -> impl Future<Output = Result<BlockLoc>> + Send;
}

/// Where a block's bytes are reached.
enum Route {
    Mapped(Arc<Mapped>),
    Network,
}

pub(crate) struct BlockIo {
    pool: ConnectionPool,
    local: Local,
    shared_memory: bool,
    timeout: Duration,
    hook: Option<Arc<dyn AccessHook>>,
    /// Proved to storage servers for their shared memory.
    token: Option<Arc<nodekernel_rpc::Token>>,
    mapped_reads: AtomicU64,
    mapped_writes: AtomicU64,
    network_reads: AtomicU64,
    network_writes: AtomicU64,
    read_bytes_by_class: [AtomicU64; READ_CLASS_SLOTS],
}

impl BlockIo {
    pub(crate) fn new(
        pool: ConnectionPool,
        shared_memory: bool,
        timeout: Duration,
        hook: Option<Arc<dyn AccessHook>>,
        token: Option<Arc<nodekernel_rpc::Token>>,
    ) -> Self {
        BlockIo {
            pool,
            local: Local::default(),
            shared_memory,
            timeout,
            hook,
            token,
            mapped_reads: AtomicU64::new(0),
            mapped_writes: AtomicU64::new(0),
            network_reads: AtomicU64::new(0),
            network_writes: AtomicU64::new(0),
            read_bytes_by_class: Default::default(),
        }
    }

    pub(crate) fn stats(&self) -> DataPathStats {
        DataPathStats {
            mapped_reads: self.mapped_reads.load(Ordering::Relaxed),
            mapped_writes: self.mapped_writes.load(Ordering::Relaxed),
            network_reads: self.network_reads.load(Ordering::Relaxed),
            network_writes: self.network_writes.load(Ordering::Relaxed),
            network_read_bytes_direct: self.pool.reply_copies().direct(),
            network_read_bytes_copied: self.pool.reply_copies().staged(),
            network_read_bytes_small: self.pool.reply_copies().small(),
            read_bytes_by_class: self
                .read_bytes_by_class
                .each_ref()
                .map(|c| c.load(Ordering::Relaxed)),
        }
    }

    /// Whether the memory of the storage server at `addr` is mapped.
    pub(crate) fn is_mapped(&self, addr: &str) -> bool {
        self.local.is_mapped(addr)
    }

    /// Where a transfer to `addr` goes. A mapped transfer is a plain memory
    /// copy that never waits, so it counts against the task's cooperative
    /// budget first: a task that only reads and writes co-located memory
    /// still yields to the runtime now and then, and tasks it woke (kept
    /// in its worker's LIFO slot, where no other worker can steal them)
    /// get to run.
    async fn route(&self, addr: &str) -> Result<Route> {
        let route = self.route_now(addr).await?;
        if matches!(route, Route::Mapped(_)) {
            tokio::task::consume_budget().await;
        }
        Ok(route)
    }

    async fn route_now(&self, addr: &str) -> Result<Route> {
        if !self.shared_memory {
            return Ok(Route::Network);
        }
        Ok(
            match self
                .local
                .mapping(&self.pool, addr, self.timeout, self.token.as_ref())
                .await?
            {
                Some(m) => Route::Mapped(m),
                None => Route::Network,
            },
        )
    }

    fn note(&self, loc: &BlockLoc, offset: u32, len: usize, write: bool, mapped: bool) {
        let c = match (write, mapped) {
            (false, true) => &self.mapped_reads,
            (true, true) => &self.mapped_writes,
            (false, false) => &self.network_reads,
            (true, false) => &self.network_writes,
        };
        c.fetch_add(1, Ordering::Relaxed);
        if !write {
            self.read_bytes_by_class[DataPathStats::read_class_slot(loc.class)]
                .fetch_add(len as u64, Ordering::Relaxed);
        }
        if let Some(h) = &self.hook {
            h.on_access(&Access {
                loc,
                offset,
                len,
                write,
                mapped,
            });
        }
    }

    // ----- one attempt at a known location ----------------------------------

    // `offset` is inside the node's block; a small value's block is a
    // piece of a storage block, at `loc.offset`.

    /// Fills `dst` (copied from mapped memory, or received from the
    /// socket straight into it); returns whether the bytes came through
    /// mapped memory.
    async fn read_into_once(
        &self,
        loc: &BlockLoc,
        offset: u32,
        dst: &mut [MaybeUninit<u8>],
    ) -> Result<bool> {
        let offset = loc.storage_offset(offset)?;
        match self.route(&loc.addr).await? {
            Route::Mapped(m) => {
                check_mapped_tag(m.region(), loc)?;
                m.region().read_uninit(loc.block, loc.gen, offset, dst)?;
                Ok(true)
            }
            Route::Network => {
                let req = read_request(loc, offset, dst.len());
                let conn = self.pool.get(&loc.addr).await?;
                let mut status = [0u8; READ_TRAILER_LEN];
                let n = conn
                    .call_into_uninit(store_op::READ, &[&req], dst, &mut status)
                    .await?;
                if n != dst.len() {
                    return Err(Error::protocol(format!(
                        "storage server {} returned {n} bytes instead of {}",
                        loc.addr,
                        dst.len()
                    )));
                }
                if let Err(e) = check_read_status(status[0], loc.block, loc.gen) {
                    // The bytes may be another owner's.
                    // SAFETY: plain bytes written over memory we own.
                    unsafe { std::ptr::write_bytes(dst.as_mut_ptr(), 0, dst.len()) };
                    return Err(e);
                }
                Ok(false)
            }
        }
    }

    async fn read_once(&self, loc: &BlockLoc, offset: u32, len: usize) -> Result<(Bytes, bool)> {
        let offset = loc.storage_offset(offset)?;
        match self.route(&loc.addr).await? {
            Route::Mapped(m) => {
                check_mapped_tag(m.region(), loc)?;
                let mut out = BytesMut::new();
                m.region()
                    .read_append(loc.block, loc.gen, offset, len as u32, &mut out)?;
                Ok((out.freeze(), true))
            }
            Route::Network => Ok((self.read_remote(loc, offset, len).await?, false)),
        }
    }

    async fn read_remote(&self, loc: &BlockLoc, offset: u32, len: usize) -> Result<Bytes> {
        let req = read_request(loc, offset, len);
        let reply = self.pool.call(&loc.addr, store_op::READ, &[&req]).await?;
        read_reply_data(reply, loc.block, loc.gen, len)
    }

    /// Writes `data` at `offset` of the block at `loc`, once, without
    /// re-mapping (used for child records, which are best effort).
    ///
    /// A small value's tag goes with the bytes written at its start.
    pub(crate) async fn write_once(&self, loc: &BlockLoc, offset: u32, data: &[u8]) -> Result<()> {
        let at = loc.storage_offset(offset)?;
        let tag = loc.tag.to_le_bytes();
        let tag: &[u8] = if loc.tag != 0 && offset == 0 && !data.is_empty() {
            &tag
        } else {
            &[]
        };
        // Where the tag, if any, and then `data` go.
        let start = at.checked_sub(tag.len() as u32).ok_or_else(|| {
            Error::protocol(format!(
                "a small value at offset {at} leaves no room for its tag"
            ))
        })?;
        let mapped = match self.route(&loc.addr).await? {
            Route::Mapped(m) => {
                // Straight from the caller's buffer into the server's memory.
                if !tag.is_empty() {
                    m.region().write(loc.block, loc.gen, start, tag).await?;
                }
                m.region().write(loc.block, loc.gen, at, data).await?;
                true
            }
            Route::Network => {
                let mut prefix = BytesMut::with_capacity(16);
                encode_write_prefix(&mut prefix, loc.block, loc.gen, start, &loc.cap);
                self.pool
                    .call(&loc.addr, store_op::WRITE, &[&prefix, tag, data])
                    .await?;
                false
            }
        };
        self.note(loc, offset, data.len(), true, mapped);
        Ok(())
    }

    // ----- transfers that follow their block --------------------------------

    /// Fills `dst` from block `index` (first tried at `loc`) at `offset`.
    pub(crate) async fn read_into(
        &self,
        at: &impl Locate,
        index: u64,
        mut loc: BlockLoc,
        offset: u32,
        dst: &mut [MaybeUninit<u8>],
    ) -> Result<()> {
        let mut follows = Follows::default();
        loop {
            match self.read_into_once(&loc, offset, dst).await {
                Ok(mapped) => {
                    self.note(&loc, offset, dst.len(), false, mapped);
                    return Ok(());
                }
                Err(e) if e.code == ErrorCode::Stale && follows.may_follow() => {
                    let next = self.follow_for_read(at, index, &loc, e).await?;
                    follows.count(&loc, &next);
                    loc = next;
                }
                Err(e) if e.code == ErrorCode::Unavailable && follows.may_follow() => {
                    let next = self.follow_moved_server(at, index, &loc, e).await?;
                    follows.count(&loc, &next);
                    loc = next;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A read of `stale` got `Stale` (`err`): where to read next. When the
    /// metadata server says `stale` is still the block's location, the
    /// storage server is behind it: the claim of a fence is on its way (a
    /// small value's slab is fenced when its freed pieces are reused,
    /// and a lookup can overtake that claim). The reader then makes the
    /// claim itself — it fences only what the metadata server already
    /// fenced — and reads there again; if the storage server is ahead
    /// instead (the claim fails), the node's bytes changed hands.
    async fn follow_for_read(
        &self,
        at: &impl Locate,
        index: u64,
        stale: &BlockLoc,
        err: Error,
    ) -> Result<BlockLoc> {
        let next = at.relocate(index, err.clone()).await?;
        if next == *stale && self.write_once(stale, 0, &[]).await.is_err() {
            return Err(err);
        }
        Ok(next)
    }

    /// A read of `loc` found its storage server unreachable (`err`): if
    /// the metadata server now knows the block at another address (a
    /// persistent server that came back on another port), read there;
    /// otherwise the error stands as it was.
    async fn follow_moved_server(
        &self,
        at: &impl Locate,
        index: u64,
        loc: &BlockLoc,
        err: Error,
    ) -> Result<BlockLoc> {
        match at.relocate(index, err.clone()).await {
            Ok(next) if next.addr != loc.addr => Ok(next),
            _ => Err(err),
        }
    }

    /// Reads `len` bytes of block `index` (first tried at `loc`) at `offset`.
    pub(crate) async fn read(
        &self,
        at: &impl Locate,
        index: u64,
        mut loc: BlockLoc,
        offset: u32,
        len: usize,
    ) -> Result<Bytes> {
        let mut follows = Follows::default();
        loop {
            match self.read_once(&loc, offset, len).await {
                Ok((data, mapped)) => {
                    self.note(&loc, offset, len, false, mapped);
                    return Ok(data);
                }
                Err(e) if e.code == ErrorCode::Stale && follows.may_follow() => {
                    let next = self.follow_for_read(at, index, &loc, e).await?;
                    follows.count(&loc, &next);
                    loc = next;
                }
                Err(e) if e.code == ErrorCode::Unavailable && follows.may_follow() => {
                    let next = self.follow_moved_server(at, index, &loc, e).await?;
                    follows.count(&loc, &next);
                    loc = next;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads `len` bytes of block `index` (first tried at `loc`) at
    /// `offset` for a snapshot (`crate::snapshot`): like [`BlockIo::read`],
    /// but a small value's tag is not checked. A value freed while a
    /// snapshot pins it has its tag cleared (so its own handles get `Stale`
    /// at once) and keeps its bytes until the snapshot ends; the generation
    /// alone guards the read (`at` finds the piece's slab again after a
    /// stamp). Of an encrypted node (`seal`), the plaintext.
    pub(crate) async fn read_untagged(
        &self,
        at: &impl Locate,
        index: u64,
        loc: BlockLoc,
        seal: Option<Seal<'_>>,
        offset: u32,
        len: usize,
    ) -> Result<Bytes> {
        self.read_bytes(at, index, BlockLoc { tag: 0, ..loc }, seal, offset, len)
            .await
    }

    /// Writes `data` into block `index` (first tried at `loc`) at `offset`.
    /// With `whole` (this transfer holds every byte the block will have
    /// written so far), a storage server that cannot be reached gets the
    /// block replaced by one elsewhere, and the write goes there.
    pub(crate) async fn write(
        &self,
        at: &impl Locate,
        index: u64,
        mut loc: BlockLoc,
        offset: u32,
        data: &[u8],
        whole: bool,
    ) -> Result<()> {
        let mut follows = Follows::default();
        loop {
            match self.write_once(&loc, offset, data).await {
                Ok(()) => return Ok(()),
                Err(e) if !follows.may_follow() => return Err(e),
                Err(e) if e.code == ErrorCode::Stale => {
                    // A write with a newer generation claims the block, so
                    // `Stale` means the storage server is ahead of `loc`.
                    // Unless the block moved or was fenced in place, its
                    // bytes changed hands.
                    let next = at.relocate(index, e.clone()).await?;
                    if next == loc {
                        return Err(e);
                    }
                    follows.count(&loc, &next);
                    loc = next;
                }
                Err(e) if whole && unreachable(&e) => {
                    tracing::debug!(
                        "block {index} on storage server {} is unreachable ({e}); writing it elsewhere",
                        loc.addr
                    );
                    let next = at.replace(index, &loc).await?;
                    follows.count(&loc, &next);
                    loc = next;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Reads of an encrypted range whose chunks do not authenticate, before
/// the range is declared damaged (`Integrity`): a chunk read while its
/// writer rewrites it (an append into its last chunk, an overwrite) may
/// come torn, and the next read finds it whole.
pub const OPEN_ATTEMPTS: u32 = 4;

// ----- encrypted nodes (`docs/encryption.md`) ---------------------------------

/// The chunks of a block holding plaintext `offset..offset + len` of a
/// block of `capacity` plaintext bytes: first and last chunk, and the
/// stored byte range they take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    first: u32,
    last: u32,
    stored: (u32, u32),
}

impl Span {
    fn of(capacity: u32, offset: u32, len: usize) -> Result<Span> {
        let end = u64::from(offset) + len as u64;
        if len == 0 || end > u64::from(capacity) {
            return Err(Error::out_of_range(format!(
                "{len} bytes at offset {offset} of an encrypted block of {capacity} bytes"
            )));
        }
        let first = offset / CHUNK;
        let last = ((end - 1) / u64::from(CHUNK)) as u32;
        let stop =
            crypt::chunk_offset(last) + u64::from(crypt::chunk_len(capacity, last) + OVERHEAD);
        Ok(Span {
            first,
            last,
            stored: (crypt::chunk_offset(first) as u32, stop as u32),
        })
    }

    /// Where each chunk is: (chunk, plaintext start in the block, its
    /// length, its start in the stored span).
    fn chunks(&self, capacity: u32) -> impl Iterator<Item = (u32, u32, u32, usize)> + '_ {
        (self.first..=self.last).map(move |c| {
            let at = (crypt::chunk_offset(c) - u64::from(self.stored.0)) as usize;
            (c, c * CHUNK, crypt::chunk_len(capacity, c), at)
        })
    }
}

impl BlockIo {
    /// `len` bytes at `offset` of block `index` (first tried at `loc`): of
    /// an encrypted node (`seal`), its plaintext; else as
    /// [`BlockIo::read`].
    pub(crate) async fn read_bytes(
        &self,
        at: &impl Locate,
        index: u64,
        loc: BlockLoc,
        seal: Option<Seal<'_>>,
        offset: u32,
        len: usize,
    ) -> Result<Bytes> {
        let Some(seal) = seal else {
            return self.read(at, index, loc, offset, len).await;
        };
        if len == 0 {
            return Ok(Bytes::new());
        }
        let span = Span::of(seal.capacity, offset, len)?;
        let mut plain = self.read_open(at, index, loc, seal, span).await?;
        let from = (offset - span.first * CHUNK) as usize;
        plain.truncate(from + len);
        Ok(Bytes::from(plain).slice(from..))
    }

    /// Fills `dst` with plaintext bytes `offset..` of block `index` of the
    /// encrypted node of `seal` (first tried at `loc`): reads the chunks
    /// covering them, opens each and copies out the plaintext. A chunk
    /// that does not authenticate is read again (see [`OPEN_ATTEMPTS`]),
    /// then is `Integrity`; `dst` never receives a byte that did not
    /// authenticate.
    pub(crate) async fn read_sealed_into(
        &self,
        at: &impl Locate,
        index: u64,
        loc: BlockLoc,
        seal: Seal<'_>,
        offset: u32,
        dst: &mut [MaybeUninit<u8>],
    ) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let span = Span::of(seal.capacity, offset, dst.len())?;
        let plain = self.read_open(at, index, loc, seal, span).await?;
        let from = (offset - span.first * CHUNK) as usize;
        let src = &plain[from..from + dst.len()];
        // SAFETY: `MaybeUninit<u8>` has the layout of `u8`; the copy only
        // writes initialised bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast(), src.len()) };
        Ok(())
    }

    /// The plaintext of the chunks of `span`, back to back: read, opened
    /// and checked (read again while one fails, [`OPEN_ATTEMPTS`] in all).
    async fn read_open(
        &self,
        at: &impl Locate,
        index: u64,
        loc: BlockLoc,
        seal: Seal<'_>,
        span: Span,
    ) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; (span.stored.1 - span.stored.0) as usize];
        let mut pause = Duration::from_millis(1);
        for attempt in 1.. {
            // SAFETY: `u8` to `MaybeUninit<u8>` (same layout); the read
            // only writes initialised bytes.
            let raw = unsafe { &mut *(buf.as_mut_slice() as *mut [u8] as *mut [MaybeUninit<u8>]) };
            self.read_into(at, index, loc.clone(), span.stored.0, raw)
                .await?;
            let bad = span.chunks(seal.capacity).find(|&(c, _, len, at)| {
                let place = ChunkPlace {
                    node: seal.node,
                    block: index,
                    chunk: c,
                };
                !seal
                    .key
                    .open(&place, &mut buf[at..at + (len + OVERHEAD) as usize])
            });
            let Some((c, ..)) = bad else { break };
            if attempt >= OPEN_ATTEMPTS {
                return Err(Error::integrity(format!(
                    "block {index}, chunk {c} (on storage server {}) failed authentication: its stored bytes were changed, or written with another encryption key",
                    loc.addr
                )));
            }
            tokio::time::sleep(pause).await;
            pause *= 4;
        }
        // Squeeze out nonces and tags: the plaintext, back to back.
        let mut out = 0;
        for (_, _, len, at) in span.chunks(seal.capacity) {
            let body = at + NONCE_LEN as usize;
            buf.copy_within(body..body + len as usize, out);
            out += len as usize;
        }
        buf.truncate(out);
        Ok(buf)
    }

    /// Writes plaintext `data` at `offset` of block `index` of the
    /// encrypted node of `seal` (first tried at `loc`): every chunk it
    /// touches is sealed again under a fresh random nonce and written in
    /// one transfer. A chunk it covers only in part keeps its other bytes:
    /// read and opened first when any of them was ever written (before
    /// `fresh_from`, a plaintext offset in the block: bytes from there on
    /// were never written), zeros otherwise. `whole` as for
    /// [`BlockIo::write`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn write_sealed(
        &self,
        at: &impl Locate,
        index: u64,
        loc: BlockLoc,
        seal: Seal<'_>,
        offset: u32,
        data: &[u8],
        fresh_from: u64,
        whole: bool,
    ) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let span = Span::of(seal.capacity, offset, data.len())?;
        let end = offset as u64 + data.len() as u64;
        // Whether chunk `c`'s bytes outside the write were ever written.
        let keeps = |c: u32| {
            let (start, stop) = (
                u64::from(c * CHUNK),
                u64::from(c * CHUNK + crypt::chunk_len(seal.capacity, c)),
            );
            (start < u64::from(offset) && start < fresh_from) || (end < stop && end < fresh_from)
        };
        let base = span.first * CHUNK;
        let mut plain = vec![
            0u8;
            ((span.last - span.first) * CHUNK + crypt::chunk_len(seal.capacity, span.last))
                as usize
        ];
        let edges = if span.first == span.last {
            vec![span.first]
        } else {
            vec![span.first, span.last]
        };
        for c in edges {
            if keeps(c) {
                let one = Span::of(
                    seal.capacity,
                    c * CHUNK,
                    crypt::chunk_len(seal.capacity, c) as usize,
                )?;
                let old = self.read_open(at, index, loc.clone(), seal, one).await?;
                let from = (c * CHUNK - base) as usize;
                plain[from..from + old.len()].copy_from_slice(&old);
            }
        }
        let from = (offset - base) as usize;
        plain[from..from + data.len()].copy_from_slice(data);
        let count = (span.last - span.first + 1) as usize;
        let mut nonces = vec![0u8; count * NONCE_LEN as usize];
        nodekernel_rpc::random_bytes(&mut nonces)
            .map_err(|e| Error::internal(format!("no random nonce from the kernel: {e}")))?;
        let mut stored = vec![0u8; (span.stored.1 - span.stored.0) as usize];
        for (i, (c, start, len, at)) in span.chunks(seal.capacity).enumerate() {
            let chunk = &mut stored[at..at + (len + OVERHEAD) as usize];
            let p = (start - base) as usize;
            chunk[NONCE_LEN as usize..NONCE_LEN as usize + len as usize]
                .copy_from_slice(&plain[p..p + len as usize]);
            let place = ChunkPlace {
                node: seal.node,
                block: index,
                chunk: c,
            };
            let nonce = &nonces[i * NONCE_LEN as usize..(i + 1) * NONCE_LEN as usize];
            seal.key.seal(&place, nonce, chunk)?;
        }
        self.write(at, index, loc, span.stored.0, &stored, whole)
            .await
    }
}

/// A READ of `len` bytes of the block at `loc`, at storage offset `offset`
/// (a small value's tag checked by the storage server first).
fn read_request(loc: &BlockLoc, offset: u32, len: usize) -> BytesMut {
    let mut req = BytesMut::with_capacity(36 + nodekernel_proto::cap::CAP_LEN);
    StoreRequest::Read {
        block: loc.block,
        gen: loc.gen,
        offset,
        len: len as u32,
        tag: loc.tag_check(),
        cap: loc.cap,
    }
    .encode(&mut req);
    req
}

/// Checks a small value's tag in mapped memory, before its bytes are
/// read: `Stale` once the value was replaced or deleted.
fn check_mapped_tag(region: &ClientRegion, loc: &BlockLoc) -> Result<()> {
    let Some(t) = loc.tag_check() else {
        return Ok(());
    };
    let mut found = [0; TAG_LEN as usize];
    region.read(loc.block, loc.gen, t.at, &mut found)?;
    t.check(found, loc.block)
}

/// Errors that mean the storage server itself could not be reached (as
/// opposed to one that answered with a refusal).
fn unreachable(e: &Error) -> bool {
    matches!(e.code, ErrorCode::Unavailable | ErrorCode::Timeout)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Moves and fences in place have budgets of their own: a small value's
    /// slab stamped again and again (by reuses elsewhere in it) is not a
    /// block that keeps moving.
    #[test]
    fn fences_in_place_do_not_use_up_the_moves() {
        let at = |block, gen, offset| BlockLoc {
            server: 1,
            addr: "a:1".into(),
            block,
            gen,
            class: 0,
            offset,
            tag: 9,
            cap: Default::default(),
        };
        let mut f = Follows::default();
        for gen in 1..MAX_REFENCES as u64 {
            f.count(&at(3, gen, 120), &at(3, gen + 1, 120));
            assert!(f.may_follow(), "fence {gen}");
        }
        assert_eq!((f.moves, f.fences), (0, MAX_REFENCES - 1));
        f.count(&at(3, 1, 120), &at(3, 2, 120));
        assert!(!f.may_follow(), "a transfer that never gets through stops");

        let mut f = Follows::default();
        for b in 0..MAX_RELOCATIONS {
            assert!(f.may_follow());
            // Another block, or another piece of the same block: a move.
            let next = if b % 2 == 0 {
                at(b + 10, 1, 120)
            } else {
                at(3, 1, 240)
            };
            f.count(&at(3, 1, 120), &next);
        }
        assert_eq!(f.moves, MAX_RELOCATIONS);
        assert!(!f.may_follow());

        // The same location again (a reader that made the claim itself and
        // reads there again) is a move: a tag that never matches stops
        // after 16 tries, not 256.
        let mut f = Follows::default();
        f.count(&at(3, 5, 120), &at(3, 5, 120));
        assert_eq!((f.moves, f.fences), (1, 0));
    }

    /// The layer's invariant, checked on the sources: no other module
    /// touches a mapped region or builds a data request.
    #[test]
    fn blockio_is_the_only_data_path() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
        let forbidden = [
            ".region()",
            "StoreRequest::Read",
            "StoreRequest::Write",
            "store_op::READ",
            "store_op::WRITE",
            "encode_write_prefix",
        ];
        let mut checked = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "rs") || path.ends_with("blockio.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for f in forbidden {
                assert!(
                    !text.contains(f),
                    "{} uses {f}: block bytes move only through blockio.rs",
                    path.display()
                );
            }
            checked += 1;
        }
        assert!(checked >= 5, "only {checked} source files found");
    }
}
