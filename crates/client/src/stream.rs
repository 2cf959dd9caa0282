//! Buffered streams: sequential reading and writing with several slices in
//! flight.
//!
//! NodeKernel offers two kinds of sequential streams over a File or
//! KeyValue (the Crail model):
//!
//! - **Direct streams** are [`Node::reader`] and [`Node::append`]: bytes
//!   move straight between the caller's buffer and storage (or a
//!   co-located server's memory), with no extra copy, but the caller waits
//!   for each call's transfer before it issues the next, so the pipe drains
//!   between calls.
//! - **Buffered streams** ([`BufferedReader`], [`BufferedWriter`]) copy
//!   through a buffer of [`StreamOptions::buffer_size`] bytes cut into
//!   slices of [`StreamOptions::slice_size`] bytes, and keep
//!   `buffer_size / slice_size` slice transfers in flight at any time while
//!   the caller consumes or fills another slice. They cost one extra copy,
//!   but keep storage busy, which is usually faster for sequential access
//!   with small or unevenly sized calls, or when the caller does other work
//!   (such as local file I/O) between calls. A 4 MiB buffer cut into 1 MiB
//!   slices (the default) keeps four transfers in flight.
//!
//! Each slice transfer runs as its own tokio task, so it makes progress
//! while the caller is busy elsewhere; the streams must be used inside a
//! tokio runtime. A stream holds at most `buffer_size + slice_size` bytes of
//! buffers: the slices in flight plus the one the caller is working on.
//! Slices are aligned to multiples of `slice_size` in the node, so with a
//! slice size that is a multiple of the block size every slice transfer
//! covers whole blocks. For an encrypted node a slice ends at the chunk
//! boundary before that (`Node::slice_len`, `docs/encryption.md`), so
//! slice writes in flight together never share a chunk.
//!
//! Transfers in flight when a stream is dropped are not cancelled (aborting
//! a network request half-sent would break the connection it shares with
//! other calls): they finish in the background and their result is
//! discarded.

use crate::node::Node;
use nodekernel_proto::{Error, Result};
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// Default [`StreamOptions::buffer_size`]: 4 MiB.
pub const DEFAULT_STREAM_BUFFER_SIZE: usize = 4 << 20;
/// Default [`StreamOptions::slice_size`]: 1 MiB.
pub const DEFAULT_STREAM_SLICE_SIZE: usize = 1 << 20;
/// Largest accepted [`StreamOptions::buffer_size`]: 1 GiB.
pub const MAX_STREAM_BUFFER_SIZE: usize = 1 << 30;

/// Buffer and slice size of a buffered stream.
///
/// The number of slice transfers kept in flight is
/// `buffer_size / slice_size` (rounded down). The default is a 4 MiB buffer
/// of 1 MiB slices: four transfers in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOptions {
    /// Bytes in flight at most, 1 byte to 1 GiB; at least `slice_size`.
    pub buffer_size: usize,
    /// Bytes per transfer, at least 1.
    pub slice_size: usize,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            buffer_size: DEFAULT_STREAM_BUFFER_SIZE,
            slice_size: DEFAULT_STREAM_SLICE_SIZE,
        }
    }
}

impl StreamOptions {
    /// Options with this buffer and slice size, validated.
    pub fn new(buffer_size: usize, slice_size: usize) -> Result<StreamOptions> {
        let opts = StreamOptions {
            buffer_size,
            slice_size,
        };
        opts.validate()?;
        Ok(opts)
    }

    /// Checks the sizes; `InvalidArgument` names the bad field and value.
    pub fn validate(&self) -> Result<()> {
        if self.slice_size == 0 {
            return Err(Error::invalid_argument(
                "stream slice_size must be at least 1 byte (got 0)",
            ));
        }
        if self.buffer_size > MAX_STREAM_BUFFER_SIZE {
            return Err(Error::invalid_argument(format!(
                "stream buffer_size {} exceeds the maximum of {MAX_STREAM_BUFFER_SIZE} bytes (1 GiB)",
                self.buffer_size
            )));
        }
        if self.buffer_size < self.slice_size {
            return Err(Error::invalid_argument(format!(
                "stream buffer_size {} is smaller than slice_size {}; it must hold at least one slice",
                self.buffer_size, self.slice_size
            )));
        }
        Ok(())
    }

    /// Slice transfers kept in flight: `buffer_size / slice_size`.
    pub fn slices_in_flight(&self) -> usize {
        (self.buffer_size / self.slice_size.max(1)).max(1)
    }
}

/// Waits for a slice task; a task that panicked or was cancelled becomes
/// an `Internal` error naming the path.
async fn join<T>(task: &mut JoinHandle<Result<T>>, path: &str) -> Result<T> {
    match task.await {
        Ok(r) => r,
        Err(e) => Err(Error::internal(format!(
            "{path}: a buffered stream transfer did not complete: {e}"
        ))),
    }
}

/// Length of the slice that starts at `pos`: up to the next multiple of
/// `slice` (so slices are aligned in the node), at most `limit`.
fn slice_len(pos: u64, slice: u64, limit: u64) -> u64 {
    (slice - pos % slice).min(limit)
}

/// A buffered sequential reader of a File or KeyValue: up to
/// [`StreamOptions::slices_in_flight`] slice reads run ahead of the caller.
///
/// It reads from the start offset up to the node's size when the reader was
/// made ([`Node::size`]); bytes published later are not seen (look the node
/// up again, or [`Node::refresh`] it, and make a new reader). The first
/// read ([`BufferedReader::read`], [`BufferedReader::fill_buf`] or
/// [`BufferedReader::read_to_end`]) starts the slice reads.
///
/// An error of a slice read surfaces at the read that reaches that slice,
/// and every later read returns the same error: a reader never skips bytes.
pub struct BufferedReader {
    node: Arc<Node>,
    slices: usize,
    slice_size: u64,
    /// Offset of the next byte returned to the caller.
    pos: u64,
    /// Offset of the next slice to start.
    next: u64,
    end: u64,
    in_flight: VecDeque<JoinHandle<Result<Vec<u8>>>>,
    /// The slice being consumed and how much of it has been returned.
    current: Vec<u8>,
    consumed: usize,
    /// Buffers of consumed slices, reused for the next slice reads.
    spare: Vec<Vec<u8>>,
    failed: Option<Error>,
}

impl std::fmt::Debug for BufferedReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferedReader")
            .field("path", &self.node.path())
            .field("position", &self.pos)
            .field("end", &self.end)
            .field("in_flight", &self.in_flight.len())
            .finish()
    }
}

impl BufferedReader {
    /// A reader of `node` (a [`Node`] or an `Arc<Node>` shared with other
    /// readers) from byte `offset`.
    ///
    /// Fails with `InvalidArgument` for bad options and `OutOfRange` when
    /// `offset` is past the node's size.
    pub fn new(node: impl Into<Arc<Node>>, offset: u64, opts: StreamOptions) -> Result<Self> {
        opts.validate()?;
        let node = node.into();
        let end = node.size();
        if offset > end {
            return Err(Error::out_of_range(format!(
                "{}: buffered reader at offset {offset} starts past the end (size {end})",
                node.path()
            )));
        }
        Ok(BufferedReader {
            node,
            slices: opts.slices_in_flight(),
            slice_size: opts.slice_size as u64,
            pos: offset,
            next: offset,
            end,
            in_flight: VecDeque::new(),
            current: Vec::new(),
            consumed: 0,
            spare: Vec::new(),
            failed: None,
        })
    }

    /// The node being read.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Offset in the node of the next byte [`BufferedReader::read`] returns.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// Where the reader stops: the node's size when the reader was made.
    pub fn end(&self) -> u64 {
        self.end
    }

    /// Starts slice reads until `slices` are in flight or the end is reached.
    fn fill(&mut self) {
        while self.in_flight.len() < self.slices && self.next < self.end {
            let len = slice_len(self.next, self.slice_size, self.end - self.next) as usize;
            // A recycled buffer keeps its length, so this only truncates it
            // (or, for a new one, zero-fills it once).
            let mut buf = self.spare.pop().unwrap_or_default();
            buf.resize(len, 0);
            let node = self.node.clone();
            let offset = self.next;
            self.in_flight.push_back(tokio::spawn(async move {
                node.read_at(offset, &mut buf).await.map(|()| buf)
            }));
            self.next += len as u64;
        }
    }

    /// Makes the next slice current; `false` at the end. Cancel-safe: the
    /// slice leaves the queue only once it has arrived.
    async fn next_slice(&mut self) -> Result<bool> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        self.fill();
        let Some(task) = self.in_flight.front_mut() else {
            return Ok(false);
        };
        let r = join(task, self.node.path()).await;
        self.in_flight.pop_front();
        match r {
            Ok(buf) => {
                let old = std::mem::replace(&mut self.current, buf);
                if old.capacity() > 0 {
                    self.spare.push(old);
                }
                self.consumed = 0;
                self.fill();
                Ok(true)
            }
            Err(e) => {
                // The reads behind it finish in the background, unused.
                self.in_flight.clear();
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    /// Reads up to `buf.len()` bytes; returns 0 at the end (or for an empty
    /// `buf`). Cancel-safe.
    pub async fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if buf.is_empty() {
            return Ok(0);
        }
        while self.consumed == self.current.len() {
            if !self.next_slice().await? {
                return Ok(0);
            }
        }
        let n = buf.len().min(self.current.len() - self.consumed);
        buf[..n].copy_from_slice(&self.current[self.consumed..self.consumed + n]);
        self.consumed += n;
        self.pos += n as u64;
        Ok(n)
    }

    /// The unread bytes of the current slice, waiting for the next slice
    /// when they are all read; empty only at the end. Together with
    /// [`BufferedReader::consume`] this reads without copying out of the
    /// stream's buffer (like `std::io::BufRead`). Cancel-safe.
    pub async fn fill_buf(&mut self) -> Result<&[u8]> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        while self.consumed == self.current.len() {
            if !self.next_slice().await? {
                break;
            }
        }
        Ok(&self.current[self.consumed..])
    }

    /// Marks `n` bytes of what [`BufferedReader::fill_buf`] returned as
    /// read (at most the bytes it returned).
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.current.len() - self.consumed);
        self.consumed += n;
        self.pos += n as u64;
    }

    /// Appends the rest of the stream to `out`; returns the number of bytes
    /// appended. On an error, `out` holds the bytes before the failed slice.
    pub async fn read_to_end(&mut self, out: &mut Vec<u8>) -> Result<usize> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let start = out.len();
        out.reserve(usize::try_from(self.end - self.pos).unwrap_or(0));
        loop {
            out.extend_from_slice(&self.current[self.consumed..]);
            self.pos += (self.current.len() - self.consumed) as u64;
            self.consumed = self.current.len();
            if !self.next_slice().await? {
                return Ok(out.len() - start);
            }
        }
    }
}

/// A buffered sequential writer (appender) of a File or KeyValue: the
/// caller's bytes are copied into slices, and each full slice is written
/// while the caller fills the next, with up to
/// [`StreamOptions::slices_in_flight`] slice writes in flight (a write that
/// finds them all busy waits for the oldest).
///
/// It appends from the node's current end ([`Node::size`] of the writable
/// handle). Bytes become visible to readers only at
/// [`BufferedWriter::sync`] or [`BufferedWriter::close`]; dropping the
/// writer without closing it publishes nothing more (the write lease then
/// lapses as for any unclosed [`Node`]).
///
/// The first failed slice write poisons the writer: that call and every
/// later one return the same error, so no data is silently lost. (A failed
/// `sync` leaves the writer usable, as [`Node::sync`] does.)
pub struct BufferedWriter {
    node: Arc<Node>,
    lease: u64,
    /// The block the stream started in: every block before it exists.
    alloc_from: u64,
    slices: usize,
    slice_size: u64,
    /// Offset in the node of `current[0]`.
    start: u64,
    current: Vec<u8>,
    in_flight: VecDeque<JoinHandle<Result<Vec<u8>>>>,
    /// Buffers of finished slice writes, reused (empty).
    spare: Vec<Vec<u8>>,
    failed: Option<Error>,
}

impl std::fmt::Debug for BufferedWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferedWriter")
            .field("path", &self.node.path())
            .field("position", &self.position())
            .field("in_flight", &self.in_flight.len())
            .field("failed", &self.failed)
            .finish()
    }
}

impl BufferedWriter {
    /// A writer appending to `node`, a writable handle from
    /// [`crate::Client::create`] or [`crate::Client::open_write`].
    ///
    /// Fails with `InvalidArgument` for bad options or a read-only handle
    /// (from [`crate::Client::lookup`]).
    pub fn new(node: Node, opts: StreamOptions) -> Result<Self> {
        opts.validate()?;
        let lease = node.stream_lease()?;
        let start = node.size();
        Ok(BufferedWriter {
            alloc_from: start / node.block_size().max(1),
            node: Arc::new(node),
            lease,
            slices: opts.slices_in_flight(),
            slice_size: opts.slice_size as u64,
            start,
            current: Vec::new(),
            in_flight: VecDeque::new(),
            spare: Vec::new(),
            failed: None,
        })
    }

    /// The node being written. Its [`Node::size`] counts the bytes written
    /// as of the last [`BufferedWriter::sync`].
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Offset in the node after the last byte accepted so far (written or
    /// still buffered).
    pub fn position(&self) -> u64 {
        self.start + self.current.len() as u64
    }

    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn poison(&mut self, e: Error) -> Error {
        // Later slice writes go on, unused: they stay in `in_flight` (no
        // call but `abort` waits for them), since each holds the node and
        // `abort` can only release the lease once they have let go.
        self.current = Vec::new();
        self.failed = Some(e.clone());
        e
    }

    /// Bytes the current slice takes before it is sent (for an encrypted
    /// node, up to a chunk boundary: [`Node::slice_len`]).
    fn target(&self) -> usize {
        self.node.slice_len(self.start, self.slice_size) as usize
    }

    /// Waits for the oldest slice write. Cancel-safe.
    async fn complete_oldest(&mut self) -> Result<()> {
        let Some(task) = self.in_flight.front_mut() else {
            return Ok(());
        };
        let r = join(task, self.node.path()).await;
        self.in_flight.pop_front();
        match r {
            Ok(mut buf) => {
                buf.clear();
                self.spare.push(buf);
                Ok(())
            }
            Err(e) => Err(self.poison(e)),
        }
    }

    /// Sends the current slice, first waiting for a free slot. A flush's
    /// (`last`: none is sent after it until it completes) with no other
    /// in flight has the node alone: a File's small first write may then
    /// take a piece.
    async fn send(&mut self, last: bool) -> Result<()> {
        while self.in_flight.len() >= self.slices {
            self.complete_oldest().await?;
        }
        let exclusive = last && self.in_flight.is_empty();
        let data = std::mem::replace(&mut self.current, self.spare.pop().unwrap_or_default());
        let offset = self.start;
        self.start += data.len() as u64;
        let node = self.node.clone();
        let (lease, alloc_from) = (self.lease, self.alloc_from);
        self.in_flight.push_back(tokio::spawn(async move {
            let r = node
                .write_range_from(lease, alloc_from, offset, &data, offset, exclusive)
                .await;
            // Release the node before the result is seen, so that once every
            // slice has completed the writer holds the only reference.
            drop(node);
            r.map(|()| data)
        }));
        Ok(())
    }

    /// Takes all of `data` into the stream, sending each slice as it fills.
    ///
    /// Returns once the bytes are buffered or in flight, not written: write
    /// errors may surface at a later call. Not cancel-safe: if the future
    /// is dropped, an unknown prefix of `data` has been taken.
    pub async fn write_all(&mut self, mut data: &[u8]) -> Result<()> {
        self.check()?;
        while !data.is_empty() || self.current.len() == self.target() {
            let target = self.target();
            if self.current.len() == target {
                self.send(false).await?;
                continue;
            }
            self.current.reserve_exact(target - self.current.len());
            let n = (target - self.current.len()).min(data.len());
            self.current.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        Ok(())
    }

    /// Sends the partly filled slice and waits for every slice write: then
    /// all bytes taken so far are stored, but not yet visible to readers.
    /// Cancel-safe.
    pub async fn flush(&mut self) -> Result<()> {
        self.check()?;
        if !self.current.is_empty() {
            self.send(true).await?;
        }
        while !self.in_flight.is_empty() {
            self.complete_oldest().await?;
        }
        Ok(())
    }

    /// Flushes, then publishes every byte written so far ([`Node::sync`]),
    /// which also renews the write lease.
    pub async fn sync(&mut self) -> Result<()> {
        self.flush().await?;
        let written = self.start;
        let path = self.node.path().to_string();
        let node = Arc::get_mut(&mut self.node).ok_or_else(|| still_shared(&path))?;
        node.set_written(written);
        node.sync().await
    }

    /// Flushes, then publishes everything and releases the write lease
    /// ([`Node::close`]). A close that fails still releases the lease (as
    /// [`BufferedWriter::abort`]): the handle goes with this call, and
    /// other writers would get `Busy` until the lease lapsed.
    pub async fn close(mut self) -> Result<()> {
        if let Err(e) = self.flush().await {
            let _ = self.abort().await;
            return Err(e);
        }
        let written = self.start;
        let path = self.node.path().to_string();
        let mut node = Arc::try_unwrap(self.node).map_err(|_| still_shared(&path))?;
        node.set_written(written);
        node.close().await
    }

    /// Gives up writing: drops the unsent bytes, waits for the slice
    /// writes already sent (their outcome no longer matters), then
    /// releases the write lease without publishing ([`Node::abort`]): a
    /// put leaves nothing behind, a File keeps what its last sync published.
    pub async fn abort(mut self) -> Result<()> {
        self.current = Vec::new();
        while let Some(task) = self.in_flight.pop_front() {
            let _ = task.await;
        }
        let path = self.node.path().to_string();
        let node = Arc::try_unwrap(self.node).map_err(|_| still_shared(&path))?;
        node.abort().await
    }
}

/// A finished slice task always releases the node first (see
/// [`BufferedWriter::send`]), so this is not expected.
fn still_shared(path: &str) -> Error {
    Error::internal(format!(
        "{path}: a finished buffered write still holds the node"
    ))
}
