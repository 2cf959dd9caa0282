use crate::blockio::Locate;
use crate::client::{unexpected, Client};
use crate::crypt::Seal;
use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use nodekernel_proto::meta::{MetaReply, MetaRequest, MAX_MAP_COUNT};
use nodekernel_proto::sync;
use nodekernel_proto::{BlockLoc, Error, ErrorCode, NodeInfo, NodeType, Result};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Block locations fetched beyond the ones a read needs, so the next read
/// finds its locations cached.
const LOCATION_READAHEAD: u64 = 16;

/// A File's first write goes in a piece of a shared block when it is at
/// most this fraction of a block (64 KiB of 1 MiB), and the writer has it
/// alone (`docs/small-values.md`, *Small Files*): a small File then takes
/// a piece its size. A larger first write is most likely the start of a
/// large File, which would only outgrow the piece at its next write.
const FIRST_WRITE_PIECE_FRACTION: u64 = 16;

/// The bytes a File's block 0 holds when `loc` is a piece (its tag names
/// the node): less than a block, up to the end of the piece.
fn piece_capacity(loc: &BlockLoc) -> Option<u64> {
    (loc.tag != 0).then(|| u64::from(loc.cap.hi.saturating_sub(loc.offset)))
}

/// A handle to one node (one version of a path). Handles from
/// [`Client::create`] and [`Client::open_write`] of File/KeyValue nodes hold
/// the write lease; any handle can read.
pub struct Node {
    client: Client,
    path: String,
    part: usize,
    info: NodeInfo,
    /// Cached block locations by block index.
    locs: Mutex<Vec<Option<BlockLoc>>>,
    /// Highest published size seen.
    size: AtomicU64,
    writer: Option<WriteState>,
    /// The end of the bytes this handle has written (at least the size it
    /// was opened at): what a File outgrowing its piece copies.
    written_end: AtomicU64,
    /// Writes into a File's piece hold it shared; its outgrowing holds it
    /// alone, so the copy misses none of them.
    piece_gate: tokio::sync::RwLock<()>,
    /// The client's lease keeper renews the writer's lease while this is
    /// held (dropped with the writer: at close, abort, or when the handle
    /// is dropped unclosed, so a writer that vanished lets its lease lapse).
    hold: Option<crate::leases::LeaseHold>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("path", &self.path)
            .field("info", &self.info)
            .field("writable", &self.writer.is_some())
            .finish()
    }
}

#[derive(Debug, Clone, Copy)]
struct WriteState {
    lease: u64,
    /// Bytes written so far (published on sync/close).
    written: u64,
    /// Written since the last publish (which then stamps the node's
    /// modification time).
    dirty: bool,
}

/// One contiguous piece of a transfer inside a single block.
struct Segment {
    /// Block index in the node.
    index: u64,
    loc: BlockLoc,
    offset: u32,
    len: usize,
    /// Offset of this piece in the caller's buffer.
    at: usize,
}

impl Node {
    pub(crate) fn new(client: Client, path: String, part: usize, info: NodeInfo) -> Node {
        let writer = (info.lease != 0).then_some(WriteState {
            lease: info.lease,
            written: info.size,
            // A new node's creator stamped its time already.
            dirty: false,
        });
        let mut locs = Vec::new();
        if let Some(b) = &info.first_block {
            locs.push(Some(b.clone()));
        }
        let hold = writer.map(|w| client.inner.leases.hold(part, info.id, w.lease));
        Node {
            client,
            path,
            part,
            size: AtomicU64::new(info.size),
            written_end: AtomicU64::new(info.size),
            piece_gate: tokio::sync::RwLock::new(()),
            locs: Mutex::new(locs),
            info,
            writer,
            hold,
        }
    }

    /// Metadata as of lookup/create.
    pub fn info(&self) -> &NodeInfo {
        &self.info
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    /// Readable size: the published size, or for a writer the bytes it has
    /// written so far.
    pub fn size(&self) -> u64 {
        match self.writer {
            Some(w) => w.written,
            None => self.size.load(Ordering::Acquire),
        }
    }

    pub fn is_writable(&self) -> bool {
        self.writer.is_some()
    }

    pub(crate) fn block_size(&self) -> u64 {
        self.info.block_size as u64
    }

    /// How the block-I/O layer seals this node's data: `None` unless it is
    /// encrypted; `Unauthenticated` if it is and this client has no key.
    fn seal(&self) -> Result<Option<Seal<'_>>> {
        Seal::of(
            self.client.config().encryption_key.as_ref(),
            self.info.encrypted,
            self.info.id,
            self.info.block_size,
        )
    }

    /// Length of the slice of a buffered writer that starts at `pos`: up
    /// to the next multiple of `slice` in the node (so slices are aligned),
    /// and for an encrypted node back to the chunk boundary before that
    /// (or on to the one after `pos`), so that slice writes in flight
    /// together never share a chunk (each rewrites its partial chunks
    /// whole).
    pub(crate) fn slice_len(&self, pos: u64, slice: u64) -> u64 {
        let end = pos + (slice - pos % slice);
        if !self.info.encrypted {
            return end - pos;
        }
        let bs = self.block_size().max(1);
        let chunk = u64::from(nodekernel_proto::crypt::CHUNK);
        let boundary = |x: u64| x - x % bs + (x % bs) / chunk * chunk;
        let back = boundary(end);
        if back > pos {
            return back - pos;
        }
        // No boundary inside: the next one after `pos` (a chunk's end, or
        // the block's).
        let next = boundary(pos) + chunk;
        (next.min(pos - pos % bs + bs)) - pos
    }

    // ----- metadata helpers -------------------------------------------------

    /// Maps blocks `index..index + count` (allocating with a lease),
    /// waiting while block `index` is being moved (`TryAgain`), at most
    /// the client's timeout.
    async fn map(
        &self,
        index: u64,
        count: u64,
        lease: Option<u64>,
    ) -> Result<(u64, Vec<BlockLoc>)> {
        self.map_first(index, count, lease, 0).await
    }

    /// [`Node::map`] with a File writer's `first_write` (see
    /// [`MetaRequest::Map`]).
    async fn map_first(
        &self,
        index: u64,
        count: u64,
        lease: Option<u64>,
        first_write: u32,
    ) -> Result<(u64, Vec<BlockLoc>)> {
        let deadline = Instant::now() + self.client.config().timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            match self.map_once(index, count, lease, first_write).await {
                Err(e) if e.code == ErrorCode::TryAgain && Instant::now() < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MOVE_WAIT_MAX);
                }
                r => return r,
            }
        }
    }

    async fn map_once(
        &self,
        index: u64,
        count: u64,
        lease: Option<u64>,
        first_write: u32,
    ) -> Result<(u64, Vec<BlockLoc>)> {
        let req = MetaRequest::Map {
            node: self.info.id,
            index,
            count: count.clamp(1, MAX_MAP_COUNT as u64) as u32,
            alloc: lease.is_some(),
            lease: lease.unwrap_or(0),
            first_write,
        };
        match self.client.meta_at(self.part, &req).await? {
            MetaReply::Blocks { size, blocks } => {
                self.size.fetch_max(size, Ordering::AcqRel);
                self.cache(index, &blocks);
                Ok((size, blocks))
            }
            other => Err(unexpected(other)),
        }
    }

    /// Remembers the locations of blocks `index..`.
    fn cache(&self, index: u64, blocks: &[BlockLoc]) {
        let mut locs = sync::lock(&self.locs);
        let end = index as usize + blocks.len();
        if locs.len() < end {
            locs.resize(end, None);
        }
        for (i, b) in blocks.iter().enumerate() {
            locs[index as usize + i] = Some(b.clone());
        }
    }

    /// Makes sure locations of blocks `[first, last]` are cached; with a
    /// lease, allocates missing blocks.
    async fn ensure_locations(&self, first: u64, last: u64, lease: Option<u64>) -> Result<()> {
        loop {
            let missing = {
                let locs = sync::lock(&self.locs);
                (first..=last).find(|i| locs.get(*i as usize).is_none_or(|l| l.is_none()))
            };
            let Some(m) = missing else { return Ok(()) };
            let want = last - m + 1;
            let count = if lease.is_some() {
                want
            } else {
                want + LOCATION_READAHEAD
            };
            let (_, blocks) = self.map(m, count, lease).await?;
            if blocks.is_empty() {
                return Err(if lease.is_some() {
                    Error::no_space(format!("{}: no free block left for block {m}", self.path))
                } else {
                    Error::out_of_range(format!("{}: block {m} does not exist", self.path))
                });
            }
        }
    }

    fn segments(&self, offset: u64, len: usize) -> Vec<Segment> {
        let bs = self.block_size();
        let locs = sync::lock(&self.locs);
        let mut out = Vec::new();
        let mut pos = offset;
        let end = offset + len as u64;
        while pos < end {
            let idx = pos / bs;
            let in_block = pos % bs;
            let n = (bs - in_block).min(end - pos);
            out.push(Segment {
                index: idx,
                loc: locs[idx as usize].clone().expect("ensured"),
                offset: in_block as u32,
                len: n as usize,
                at: (pos - offset) as usize,
            });
            pos += n;
        }
        out
    }

    /// Block 0 of this File, while this handle knows it as a piece, and
    /// the bytes the piece holds.
    fn file_piece(&self) -> Option<(BlockLoc, u64)> {
        if self.info.ty != NodeType::File {
            return None;
        }
        let locs = sync::lock(&self.locs);
        let loc = locs.first()?.as_ref()?;
        piece_capacity(loc).map(|cap| (loc.clone(), cap))
    }

    /// Forgets the cached piece of a File read up to `end` past it: the
    /// File has outgrown it since (its published size says so), and its
    /// block 0 is mapped anew.
    fn forget_outgrown_piece(&self, end: u64) {
        if self.file_piece().is_some_and(|(_, cap)| end > cap) {
            if let Some(first) = sync::lock(&self.locs).first_mut() {
                *first = None;
            }
        }
    }

    /// The writer of this File, in a piece, is about to write past it:
    /// block 0 gets a block of its own (`Outgrow`), and what this handle
    /// wrote to the piece is copied there. Readers read the piece until
    /// the next sync publishes the block. Waits for the writes into the
    /// piece in flight, and holds the others back meanwhile. If the copy
    /// fails, the handle keeps the piece, so the next write outgrows it
    /// again (the metadata server hands out the same block).
    async fn outgrow(&self, lease: u64) -> Result<()> {
        let _alone = self.piece_gate.write().await;
        let Some((piece, cap)) = self.file_piece() else {
            return Ok(()); // outgrown by a write before this one
        };
        let io = &self.client.inner.io;
        let len = self.written_end.load(Ordering::Acquire).min(cap) as usize;
        let held = if len > 0 {
            io.read_bytes(self, 0, piece.clone(), None, 0, len).await?
        } else {
            Bytes::new()
        };
        let req = MetaRequest::Outgrow {
            node: self.info.id,
            lease,
        };
        let block = match self.client.meta_at(self.part, &req).await? {
            MetaReply::Blocks { blocks, .. } => blocks.into_iter().next().ok_or_else(|| {
                Error::no_space(format!(
                    "{}: no block for the File to grow into (block 0's server is unavailable)",
                    self.path
                ))
            })?,
            other => return Err(unexpected(other)),
        };
        let copied = if held.is_empty() {
            Ok(())
        } else {
            io.write(self, 0, block.clone(), 0, &held, true).await
        };
        // (A re-map during the copy may have cached the block already.)
        let keep = if copied.is_ok() { block } else { piece };
        self.cache(0, std::slice::from_ref(&keep));
        copied
    }

    /// Adds the path to an error coming from a server.
    fn ctx(&self, e: Error) -> Error {
        let msg = match e.code {
            ErrorCode::Stale => format!(
                "{}: this handle is stale (the node was replaced or deleted): {}",
                self.path, e.message
            ),
            _ => format!("{}: {}", self.path, e.message),
        };
        Error::new(e.code, msg)
    }

    // ----- reads -------------------------------------------------------------

    /// Re-reads the published size from the metadata server.
    pub async fn refresh(&self) -> Result<u64> {
        let (size, _) = self.map(0, 1, None).await.map_err(|e| self.ctx(e))?;
        Ok(size)
    }

    async fn check_range(&self, offset: u64, len: usize) -> Result<()> {
        let end = offset.checked_add(len as u64).ok_or_else(|| {
            // `read_at` names the path.
            Error::out_of_range(format!("offset {offset} + length {len} overflows"))
        })?;
        if end <= self.size() {
            return Ok(());
        }
        let size = if self.writer.is_some() {
            self.size()
        } else {
            self.refresh().await?
        };
        if end > size {
            return Err(Error::out_of_range(format!(
                "read of {len} bytes at offset {offset} goes past the end (size {size})"
            )));
        }
        Ok(())
    }

    /// Fills `buf` with the bytes at `offset`. Reading past the end is an
    /// `OutOfRange` error and leaves no partial result.
    ///
    /// Pieces on co-located storage servers are copied straight from their
    /// mapped memory into `buf`; the rest come over the network, several
    /// blocks in flight. On any error `buf` holds no bytes of another node.
    pub async fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        // SAFETY: the read path only ever writes initialised bytes into the
        // buffer (copies, recv, zeroes), so it stays initialised.
        let buf = unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) };
        self.read_at_raw(offset, buf).await.map_err(|e| self.ctx(e))
    }

    /// Fills `buf`, which need not be initialised: the bytes are copied
    /// from mapped memory or received from the socket straight into it.
    async fn read_at_raw(&self, offset: u64, buf: &mut [MaybeUninit<u8>]) -> Result<()> {
        let seal = self.seal()?;
        self.check_range(offset, buf.len()).await?;
        if buf.is_empty() {
            return Ok(());
        }
        let bs = self.block_size();
        let last = (offset + buf.len() as u64 - 1) / bs;
        self.forget_outgrown_piece(offset + buf.len() as u64);
        self.ensure_locations(offset / bs, last, None).await?;
        let mut segs = self.segments(offset, buf.len());
        if segs.len() == 1 {
            let s = segs.pop().expect("one segment");
            return self.read_segment(seal, s, buf).await;
        }
        // Each piece gets its own part of `buf`; several are in flight,
        // created as they start (not one future per block up front).
        let mut rest = buf;
        let reads = segs.into_iter().map(move |s| {
            let (dst, tail) = std::mem::take(&mut rest).split_at_mut(s.len);
            rest = tail;
            self.read_segment(seal, s, dst)
        });
        stream::iter(reads)
            .buffer_unordered(self.client.config().transfers_in_flight.max(1))
            .try_collect::<()>()
            .await
    }

    /// Fills `dst` with segment `s` (its plaintext, for an encrypted node).
    async fn read_segment(
        &self,
        seal: Option<Seal<'_>>,
        s: Segment,
        dst: &mut [MaybeUninit<u8>],
    ) -> Result<()> {
        let io = &self.client.inner.io;
        match seal {
            Some(seal) => {
                io.read_sealed_into(self, s.index, s.loc, seal, s.offset, dst)
                    .await
            }
            None => io.read_into(self, s.index, s.loc, s.offset, dst).await,
        }
    }

    /// Reads `len` bytes at `offset` into a new vector, allocated once and
    /// filled by the read itself (never zeroed first).
    pub async fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let len = usize::try_from(len).map_err(|_| {
            Error::invalid_argument(format!("{}: length {len} too large", self.path))
        })?;
        // Checked before allocating: `len` comes from the caller.
        self.check_range(offset, len)
            .await
            .map_err(|e| self.ctx(e))?;
        let mut buf = Vec::with_capacity(len);
        self.read_at_raw(offset, &mut buf.spare_capacity_mut()[..len])
            .await
            .map_err(|e| self.ctx(e))?;
        // SAFETY: a successful read initialised all `len` bytes.
        unsafe { buf.set_len(len) };
        Ok(buf)
    }

    /// Locations of all blocks of the node, in stream order (including blocks
    /// a writer has allocated but not yet published).
    pub async fn block_locations(&self) -> Result<Vec<BlockLoc>> {
        let mut all = Vec::new();
        loop {
            let (_, blocks) = self
                .map(all.len() as u64, MAX_MAP_COUNT as u64, None)
                .await
                .map_err(|e| self.ctx(e))?;
            let n = blocks.len();
            all.extend(blocks);
            if n < MAX_MAP_COUNT as usize {
                return Ok(all);
            }
        }
    }

    /// Reads `len` bytes at `offset` that lie inside one block, as one
    /// storage transfer (used by the Bag stream).
    pub(crate) async fn read_chunk(&self, offset: u64, len: usize) -> Result<Bytes> {
        let bs = self.block_size();
        debug_assert!(len > 0 && offset % bs + len as u64 <= bs);
        let idx = offset / bs;
        let read = async {
            let seal = self.seal()?;
            self.forget_outgrown_piece(offset + len as u64);
            self.ensure_locations(idx, idx, None).await?;
            let loc = sync::lock(&self.locs)[idx as usize]
                .clone()
                .expect("ensured");
            self.client
                .inner
                .io
                .read_bytes(self, idx, loc, seal, (offset % bs) as u32, len)
                .await
        };
        read.await.map_err(|e| self.ctx(e))
    }

    /// A sequential reader starting at `offset`.
    pub fn reader(&self, offset: u64) -> Reader<'_> {
        Reader {
            node: self,
            pos: offset,
        }
    }

    // ----- writes ------------------------------------------------------------

    fn write_state(&self) -> Result<WriteState> {
        self.writer.ok_or_else(|| {
            Error::invalid_argument(format!(
                "{}: this handle is read-only; use create or open_write to write",
                self.path
            ))
        })
    }

    /// The write lease of a writable handle (`InvalidArgument` for a
    /// read-only one), for a stream that writes through `&self`.
    pub(crate) fn stream_lease(&self) -> Result<u64> {
        self.write_state().map(|w| w.lease)
    }

    /// Records that a stream has written the node up to `written` bytes, so
    /// that the next [`Node::sync`] or [`Node::close`] publishes them.
    pub(crate) fn set_written(&mut self, written: u64) {
        if let Some(w) = &mut self.writer {
            w.written = written;
            w.dirty = true;
        }
    }

    /// Writes `data` at `offset`; bytes from `fresh_from` on were never
    /// written before (see [`Node::write_range_from`]).
    async fn write_range(
        &self,
        lease: u64,
        offset: u64,
        data: &[u8],
        fresh_from: u64,
    ) -> Result<()> {
        let alloc_from = offset / self.block_size();
        self.write_range_from(lease, alloc_from, offset, data, fresh_from, true)
            .await
    }

    /// Writes `data` at `offset`, allocating its missing blocks and any
    /// missing blocks between them and block `alloc_from`.
    ///
    /// The metadata server only allocates contiguously (block `i` needs
    /// block `i - 1`), so a write that overtakes earlier writes still in
    /// flight (a buffered stream) passes the stream's first block here: its
    /// map then starts right after the last block known to exist and also
    /// allocates the blocks the earlier writes need, instead of asking for
    /// a block past the allocated end. Every block before `alloc_from` must
    /// already exist.
    ///
    /// Bytes at `fresh_from` and after were never written before. A block
    /// this write fills from its start, at or after `fresh_from`, is held
    /// whole by the caller when the write fills all of it, or when the
    /// caller writes exclusively (`exclusive`: no other write of the node in
    /// flight): such a block moves to another storage server if its own
    /// cannot be reached.
    pub(crate) async fn write_range_from(
        &self,
        lease: u64,
        alloc_from: u64,
        offset: u64,
        data: &[u8],
        fresh_from: u64,
        exclusive: bool,
    ) -> Result<()> {
        let write = async {
            if data.is_empty() {
                return Ok(());
            }
            let seal = self.seal()?;
            let bs = self.block_size();
            let end = offset + data.len() as u64;
            let (first, last) = (offset / bs, (end - 1) / bs);
            // A plain File's write into block 0 first learns whether that
            // is a piece, which the write may outgrow. A small first
            // write, which this writer has alone, may take one (the
            // metadata server decides).
            if first == 0
                && self.info.ty == NodeType::File
                && !self.info.encrypted
                && sync::lock(&self.locs).first().is_none_or(|l| l.is_none())
            {
                let small_first = exclusive
                    && offset == 0
                    && fresh_from == 0
                    && end <= bs / FIRST_WRITE_PIECE_FRACTION;
                let hint = if small_first { end as u32 } else { 0 };
                self.map_first(0, last + 1, Some(lease), hint).await?;
            }
            if self.file_piece().is_some_and(|(_, cap)| end > cap) {
                self.outgrow(lease).await?;
            }
            let _in_piece = match self.file_piece() {
                Some(_) => Some(self.piece_gate.read().await),
                None => None,
            };
            let start = {
                let locs = sync::lock(&self.locs);
                let missing = |i: u64| locs.get(i as usize).is_none_or(|l| l.is_none());
                match (first..=last).find(|i| missing(*i)) {
                    // Walk back over the missing blocks before it: a known
                    // block exists on the server, so the map may start after it.
                    Some(mut m) => {
                        while m > alloc_from && missing(m - 1) {
                            m -= 1;
                        }
                        m
                    }
                    None => first,
                }
            };
            self.ensure_locations(start, last, Some(lease)).await?;
            let io = &self.client.inner.io;
            let segs = self.segments(offset, data.len());
            stream::iter(segs.into_iter().map(|s| {
                let start = s.index * bs;
                let whole =
                    s.offset == 0 && start >= fresh_from && (exclusive || s.len as u64 == bs);
                let data = &data[s.at..s.at + s.len];
                async move {
                    match seal {
                        Some(seal) => {
                            let fresh = fresh_from.saturating_sub(start);
                            io.write_sealed(
                                self, s.index, s.loc, seal, s.offset, data, fresh, whole,
                            )
                            .await
                        }
                        None => io.write(self, s.index, s.loc, s.offset, data, whole).await,
                    }
                }
            }))
            .buffer_unordered(self.client.config().transfers_in_flight.max(1))
            .try_collect::<()>()
            .await?;
            self.written_end.fetch_max(end, Ordering::AcqRel);
            Ok(())
        };
        write.await.map_err(|e| self.ctx(e))
    }

    /// Appends `data` at the end. Bytes become visible to other readers at
    /// the next [`Node::sync`] or [`Node::close`].
    pub async fn append(&mut self, data: &[u8]) -> Result<()> {
        let w = self.write_state()?;
        self.write_range(w.lease, w.written, data, w.written)
            .await?;
        if let Some(w) = &mut self.writer {
            w.written += data.len() as u64;
            w.dirty = true;
        }
        Ok(())
    }

    /// Overwrites bytes inside the current size.
    pub async fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        let w = self.write_state()?;
        let end = offset.checked_add(data.len() as u64);
        if end.is_none_or(|e| e > w.written) {
            return Err(Error::out_of_range(format!(
                "{}: overwrite of {} bytes at offset {offset} goes past the end (size {}); use append to grow",
                self.path,
                data.len(),
                w.written
            )));
        }
        self.write_range(w.lease, offset, data, u64::MAX).await?;
        if let Some(w) = &mut self.writer {
            w.dirty = true;
        }
        Ok(())
    }

    /// Sets the size to `size`: a shrink is published at once (the blocks
    /// past the new end are freed, and readers holding them get `Stale`);
    /// a growth appends zeros and publishes them. Needs the write lease.
    pub async fn truncate(&mut self, size: u64) -> Result<()> {
        let w = self.write_state()?;
        if size >= w.written {
            self.zero_fill_to(size).await?;
            return self.publish(false).await;
        }
        if w.written > self.size.load(Ordering::Acquire) {
            // The metadata server cuts only what was published.
            self.publish(false).await?;
        }
        let req = MetaRequest::Truncate {
            node: self.info.id,
            lease: w.lease,
            size,
            mtime: crate::config::now_ns(),
        };
        match self.client.meta_at(self.part, &req).await {
            Ok(MetaReply::Done) => {}
            Ok(other) => return Err(unexpected(other)),
            Err(e) => return Err(self.ctx(e)),
        }
        self.size.store(size, Ordering::Release);
        self.written_end.store(size, Ordering::Release);
        if let Some(w) = &mut self.writer {
            w.written = size;
            w.dirty = false;
        }
        let keep = size.div_ceil(self.block_size()) as usize;
        sync::lock(&self.locs).truncate(keep);
        Ok(())
    }

    /// Appends zeros up to `size` (nothing if the writer has written that
    /// much already): nodes have no holes, so this is how a writer gets to
    /// an offset past its end.
    pub async fn zero_fill_to(&mut self, size: u64) -> Result<()> {
        let written = self.write_state()?.written;
        let zeros = vec![0u8; size.saturating_sub(written).min(self.block_size()) as usize];
        while let Some(left) = size
            .checked_sub(self.write_state()?.written)
            .filter(|l| *l > 0)
        {
            self.append(&zeros[..left.min(zeros.len() as u64) as usize])
                .await?;
        }
        Ok(())
    }

    async fn publish(&mut self, close: bool) -> Result<()> {
        let w = self.write_state()?;
        let req = MetaRequest::Sync {
            node: self.info.id,
            lease: w.lease,
            size: w.written,
            close,
            mtime: if w.dirty { crate::config::now_ns() } else { 0 },
        };
        self.published(req).await
    }

    /// Closes a reserved put as the value at its path (`MetaRequest::Link`:
    /// a close and a create in one exchange; `crate::reserve`).
    pub(crate) async fn link_in_place(&mut self) -> Result<()> {
        let w = self.write_state()?;
        let req = MetaRequest::Link {
            node: self.info.id,
            lease: w.lease,
            size: w.written,
            mtime: crate::config::now_ns(),
            path: self.path.clone(),
        };
        self.published(req).await?;
        self.writer = None;
        self.hold = None;
        Ok(())
    }

    /// Sends `req`, a sync or link publishing what was written, and
    /// writes the record its reply hands out.
    async fn published(&mut self, req: MetaRequest) -> Result<()> {
        let written = self.write_state()?.written;
        let reply = self
            .client
            .meta_at(self.part, &req)
            .await
            .map_err(|e| self.ctx(e))?;
        if let Some(w) = &mut self.writer {
            w.dirty = false;
        }
        self.size.fetch_max(written, Ordering::AcqRel);
        match reply {
            // A closed put of a new key: write its record into the table.
            MetaReply::Record(Some(rec)) => {
                let name = crate::client::leaf(&self.path);
                self.client
                    .write_record(self.part, &rec, self.info.ty, name)
                    .await;
                Ok(())
            }
            MetaReply::Record(None) => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Publishes everything written so far and renews the write lease.
    pub async fn sync(&mut self) -> Result<()> {
        self.publish(false).await
    }

    /// Renews the write lease now, publishing nothing; `LeaseExpired` if
    /// it was lost (taken over, or lapsed). The client's lease keeper
    /// already renews every open writer's lease a few times per lease
    /// (`meta.lease_timeout_ms`), so a writer that pauses keeps its node;
    /// this tells at once whether the lease is still held.
    pub async fn renew(&self) -> Result<()> {
        let w = self.write_state()?;
        let req = MetaRequest::Renew {
            leases: vec![(self.info.id, w.lease)],
        };
        match self.client.meta_at(self.part, &req).await {
            Ok(MetaReply::Renewed { lost, .. }) if lost.is_empty() => Ok(()),
            Ok(MetaReply::Renewed { .. }) => Err(Error::lease_expired(format!(
                "{}: write lease {} is no longer held (taken over, or lapsed)",
                self.path, w.lease
            ))),
            Ok(other) => Err(unexpected(other)),
            Err(e) => Err(self.ctx(e)),
        }
    }

    /// Publishes everything written and releases the write lease. A close
    /// that fails still releases the lease (as [`Node::abort`]: a File
    /// keeps what its last sync published, a put leaves nothing): the
    /// handle goes with this call, and other writers would get `Busy`
    /// until the lease lapsed.
    pub async fn close(mut self) -> Result<()> {
        let r = self.close_in_place().await;
        if r.is_err() {
            let _ = self.abort().await;
        }
        r
    }

    /// [`Node::close`] that keeps the handle (to abort after a failure).
    pub(crate) async fn close_in_place(&mut self) -> Result<()> {
        if self.writer.is_some() {
            self.publish(true).await?;
            self.writer = None;
            self.hold = None;
        }
        Ok(())
    }

    /// Gives up writing and releases the write lease. A put that never
    /// closed leaves nothing behind: its node is dropped and its blocks are
    /// free at once. A File keeps the bytes published by its last sync.
    /// A read-only handle has nothing to abort.
    pub async fn abort(mut self) -> Result<()> {
        let Some(w) = self.writer.take() else {
            return Ok(());
        };
        self.hold = None;
        let req = MetaRequest::Abort {
            node: self.info.id,
            lease: w.lease,
        };
        match self.client.meta_at(self.part, &req).await {
            Ok(MetaReply::Done) => Ok(()),
            Ok(other) => Err(unexpected(other)),
            Err(e) => Err(self.ctx(e)),
        }
    }
}

/// How long a transfer waits between re-maps of a block being moved, at
/// most.
const MOVE_WAIT_MAX: Duration = Duration::from_millis(50);

impl Locate for Node {
    async fn relocate(&self, index: u64, err: Error) -> Result<BlockLoc> {
        // A writer re-maps under its lease: if another writer took over,
        // the answer is `LeaseExpired`, never a location to write on.
        let lease = self.writer.map(|w| w.lease);
        // Where the block is now (once a move of it has ended): moved or
        // fenced, or still `stale` (the block-I/O layer decides what that
        // means).
        let (_, blocks) = self.map(index, 1, lease).await?;
        blocks.into_iter().next().ok_or(err)
    }

    async fn replace(&self, index: u64, lost: &BlockLoc) -> Result<BlockLoc> {
        let lease = self.write_state()?.lease;
        let req = MetaRequest::ReplaceBlock {
            node: self.info.id,
            lease,
            index,
            gen: lost.gen,
        };
        match self.client.meta_at(self.part, &req).await? {
            MetaReply::Blocks { blocks, .. } => {
                let b = blocks.into_iter().next().ok_or_else(|| {
                    Error::unavailable(format!(
                        "block {index}: storage server {} is unreachable and no other block is available",
                        lost.addr
                    ))
                })?;
                self.cache(index, std::slice::from_ref(&b));
                Ok(b)
            }
            other => Err(unexpected(other)),
        }
    }
}

/// Sequential reader: while block i transfers, the location of block i+1 is
/// already being fetched, so the metadata round trip hides behind the data
/// transfer (NodeKernel paper §4.4).
pub struct Reader<'a> {
    node: &'a Node,
    pos: u64,
}

impl Reader<'_> {
    /// Current position in the node.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Reads up to `buf.len()` bytes (never crossing a block boundary);
    /// returns 0 at the end of the node.
    pub async fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        let size = self.node.size().max(self.node.size.load(Ordering::Acquire));
        if self.pos >= size || buf.is_empty() {
            return Ok(0);
        }
        let bs = self.node.block_size();
        let idx = self.pos / bs;
        let n = (bs - self.pos % bs)
            .min(size - self.pos)
            .min(buf.len() as u64) as usize;
        self.node
            .ensure_locations(idx, idx, None)
            .await
            .map_err(|e| self.node.ctx(e))?;
        let next = idx + 1;
        let next_known = (next * bs >= size)
            || sync::lock(&self.node.locs)
                .get(next as usize)
                .is_some_and(|l| l.is_some());
        let read = self.node.read_at(self.pos, &mut buf[..n]);
        if next_known {
            read.await?;
        } else {
            let prefetch = self.node.ensure_locations(next, next, None);
            let (r, p) = tokio::join!(read, prefetch);
            r?;
            // A failed prefetch is retried (and reported) by the next read.
            drop(p);
        }
        self.pos += n as u64;
        Ok(n)
    }
}
