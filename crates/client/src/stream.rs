//! Buffered streams over a node (the `buffer_size` / `slice_size` streams of
//! the seeds). Unbuffered ("direct") access is [`Node::read_at`] and
//! [`Node::append`] themselves.
//!
//! - [`BufferedReader`] keeps up to `buffer_size / slice_size` slice reads
//!   in flight ahead of the caller, so a sequential reader never waits for a
//!   round trip once the pipe is full.
//! - [`BufferedWriter`] collects small writes into a buffer of
//!   `buffer_size`. A full buffer is appended in the background, with its
//!   slices transferred concurrently, while the caller fills the next one.

use crate::Node;
use futures::stream::{FuturesOrdered, StreamExt};
use nodekernel_proto::{Error, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// Sizes of a buffered stream.
#[derive(Debug, Clone, Copy)]
pub struct StreamConfig {
    /// Bytes buffered (read ahead, or collected before a write).
    pub buffer_size: usize,
    /// Bytes per transfer; `buffer_size / slice_size` are in flight.
    pub slice_size: usize,
}

impl Default for StreamConfig {
    fn default() -> Self {
        StreamConfig {
            buffer_size: 16 << 20,
            slice_size: 1 << 20,
        }
    }
}

impl StreamConfig {
    fn check(&self) -> Result<()> {
        if self.slice_size == 0 || self.buffer_size < self.slice_size {
            return Err(Error::invalid_argument(format!(
                "stream buffer_size ({}) must be at least slice_size ({}), and slice_size above 0",
                self.buffer_size, self.slice_size
            )));
        }
        Ok(())
    }
}

type SliceRead = Pin<Box<dyn Future<Output = Result<Vec<u8>>> + Send>>;

/// Sequential reader with read-ahead.
pub struct BufferedReader {
    node: Arc<Node>,
    cfg: StreamConfig,
    /// Next offset to request.
    next: u64,
    /// End of the node when the reader was opened.
    end: u64,
    inflight: FuturesOrdered<SliceRead>,
    current: Vec<u8>,
    pos_in_current: usize,
}

impl BufferedReader {
    /// Reads `node` from `offset` to its published size.
    pub fn new(node: Arc<Node>, offset: u64, cfg: StreamConfig) -> Result<BufferedReader> {
        cfg.check()?;
        let end = node.size();
        Ok(BufferedReader {
            node,
            cfg,
            next: offset.min(end),
            end,
            inflight: FuturesOrdered::new(),
            current: Vec::new(),
            pos_in_current: 0,
        })
    }

    fn refill(&mut self) {
        let depth = (self.cfg.buffer_size / self.cfg.slice_size).max(1);
        while self.inflight.len() < depth && self.next < self.end {
            let len = (self.end - self.next).min(self.cfg.slice_size as u64);
            let (node, off) = (self.node.clone(), self.next);
            self.inflight.push_back(Box::pin(async move { node.read(off, len).await }));
            self.next += len;
        }
    }

    /// Reads up to `buf.len()` bytes; 0 at the end.
    pub async fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        while self.pos_in_current == self.current.len() {
            self.refill();
            match self.inflight.next().await {
                Some(slice) => {
                    self.current = slice?;
                    self.pos_in_current = 0;
                }
                None => return Ok(0),
            }
        }
        self.refill();
        let n = buf.len().min(self.current.len() - self.pos_in_current);
        buf[..n].copy_from_slice(&self.current[self.pos_in_current..self.pos_in_current + n]);
        self.pos_in_current += n;
        Ok(n)
    }
}

/// Buffered appender that overlaps filling a buffer with sending the last.
pub struct BufferedWriter {
    /// The node, unless a flush task has it.
    node: Option<Node>,
    flushing: Option<tokio::task::JoinHandle<(Node, Result<()>)>>,
    cfg: StreamConfig,
    buf: Vec<u8>,
}

impl BufferedWriter {
    /// Wraps a node opened for writing (from `create` or `open_write`).
    pub fn new(node: Node, cfg: StreamConfig) -> Result<BufferedWriter> {
        cfg.check()?;
        if !node.is_writable() {
            return Err(Error::invalid_argument(format!(
                "{}: a BufferedWriter needs a node opened for writing",
                node.path()
            )));
        }
        Ok(BufferedWriter {
            node: Some(node),
            flushing: None,
            buf: Vec::with_capacity(cfg.buffer_size),
            cfg,
        })
    }

    async fn take_node(&mut self) -> Result<Node> {
        if let Some(task) = self.flushing.take() {
            let (node, result) = task
                .await
                .map_err(|e| Error::internal(format!("stream flush task failed: {e}")))?;
            self.node = Some(node);
            result?;
        }
        self.node
            .take()
            .ok_or_else(|| Error::internal("stream lost its node after an earlier failure"))
    }

    /// Sends the buffered bytes in the background (after the previous send
    /// finished: appends stay in order).
    async fn start_flush(&mut self) -> Result<()> {
        let mut node = self.take_node().await?;
        let data = std::mem::replace(&mut self.buf, Vec::with_capacity(self.cfg.buffer_size));
        self.flushing = Some(tokio::spawn(async move {
            let r = node.append(&data).await;
            (node, r)
        }));
        Ok(())
    }

    /// Appends `data` (buffered).
    pub async fn write(&mut self, mut data: &[u8]) -> Result<()> {
        while !data.is_empty() {
            let room = self.cfg.buffer_size - self.buf.len();
            let n = room.min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.buf.len() == self.cfg.buffer_size {
                self.start_flush().await?;
            }
        }
        Ok(())
    }

    /// Sends everything buffered and publishes it (`sync`).
    pub async fn flush(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            self.start_flush().await?;
        }
        let mut node = self.take_node().await?;
        let r = node.sync().await;
        self.node = Some(node);
        r
    }

    /// Sends everything buffered, publishes it and releases the write lease.
    pub async fn close(mut self) -> Result<()> {
        if !self.buf.is_empty() {
            self.start_flush().await?;
        }
        self.take_node().await?.close().await
    }
}
