//! Reading a Bag as one sequential stream (the multistream of the paper).

use crate::{Client, Node};
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use nodekernel_proto::{Error, ErrorCode, NodeType, Result};
use std::sync::Arc;

/// Reads in flight by default when reading a Bag.
pub const DEFAULT_BAG_READS_IN_FLIGHT: usize = 16;

/// Most ranges one [`Client::read_ranges`] takes.
pub const MAX_RANGES: usize = 1 << 20;

/// Bytes `offset..offset + len` of the File or KeyValue at `path`: one
/// piece of a [`Client::read_ranges`] stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByteRange {
    pub path: String,
    pub offset: u64,
    pub len: u64,
}

/// Why [`Client::read_ranges`] could not open its stream, and which range
/// it is about (the message names the range too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeError {
    /// Index of the range the failure is about; where a path cannot be
    /// looked up, the first range of that path. `None` for a failure of
    /// the call as a whole (too many ranges).
    pub range: Option<usize>,
    pub error: Error,
}

impl RangeError {
    fn of(i: usize, r: &ByteRange, e: Error) -> Self {
        let end = r.offset.saturating_add(r.len);
        RangeError {
            range: Some(i),
            error: Error::new(
                e.code,
                format!(
                    "range {i} (bytes {}..{end} of {}): {}",
                    r.offset, r.path, e.message
                ),
            ),
        }
    }
}

impl std::fmt::Display for RangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for RangeError {}

impl From<RangeError> for Error {
    fn from(e: RangeError) -> Error {
        e.error
    }
}

/// One File of a Bag and where its bytes sit in the Bag's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BagEntry {
    pub name: String,
    /// Offset of the File's first byte in the stream.
    pub offset: u64,
    pub size: u64,
}

/// The Files of a Bag as one stream: each File's bytes contiguous, Files in
/// enumeration (record-slot) order, with up to `reads_in_flight` block
/// reads outstanding across File boundaries.
pub struct BagReader {
    entries: Vec<BagEntry>,
    total: u64,
    chunks: BoxStream<'static, Result<Bytes>>,
    current: Bytes,
}

impl std::fmt::Debug for BagReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BagReader")
            .field("files", &self.entries.len())
            .field("total", &self.total)
            .finish()
    }
}

impl BagReader {
    /// The Files, in stream order, with their offsets and sizes.
    pub fn files(&self) -> &[BagEntry] {
        &self.entries
    }

    /// Bytes in the whole stream.
    pub fn total_size(&self) -> u64 {
        self.total
    }

    /// Reads the next bytes of the stream into `buf`; 0 at the end.
    pub async fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        while self.current.is_empty() {
            match self.chunks.try_next().await? {
                Some(c) => self.current = c,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len());
        buf[..n].copy_from_slice(&self.current.split_to(n));
        Ok(n)
    }

    /// Reads the rest of the stream.
    pub async fn read_to_end(&mut self) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.total as usize);
        out.extend_from_slice(&std::mem::take(&mut self.current));
        while let Some(c) = self.chunks.try_next().await? {
            out.extend_from_slice(&c);
        }
        Ok(out)
    }
}

impl Client {
    /// Opens a Bag for sequential reading of all its Files.
    pub async fn read_bag(&self, path: &str, reads_in_flight: usize) -> Result<BagReader> {
        let bag = self.lookup(path).await?;
        if bag.info().ty != NodeType::Bag {
            return Err(Error::type_mismatch(format!(
                "{path} is a {}, not a Bag",
                bag.info().ty
            )));
        }
        let names = self.enumerate(path).await?;
        // Look the Files up concurrently, keeping enumeration order; a File
        // removed since the enumeration is skipped.
        let lookups = names.into_iter().map(|name| {
            let child = nodekernel_proto::path::join(path, &name);
            async move {
                match self.lookup(&child).await {
                    Ok(n) => Ok(Some((name, Arc::new(n)))),
                    Err(e) if e.code == ErrorCode::NotFound => Ok(None),
                    Err(e) => Err(e),
                }
            }
        });
        let files: Vec<(String, Arc<Node>)> = stream::iter(lookups)
            .buffered(reads_in_flight.max(1))
            .try_filter_map(|f| async move { Ok(f) })
            .try_collect()
            .await?;
        let pieces = files
            .into_iter()
            .map(|(name, node)| {
                let size = node.info().size;
                (name, node, 0, size)
            })
            .collect();
        Ok(multistream(pieces, reads_in_flight))
    }

    /// Reads byte ranges of Files and KeyValues, in the order given, as one
    /// sequential stream with up to `reads_in_flight` block reads
    /// outstanding across range boundaries: a Bag's multistream over chosen
    /// ranges (a shuffle reducer reads its segments of many map outputs).
    /// [`BagReader::files`] lists the ranges (named by path) and where each
    /// starts in the stream.
    ///
    /// Each distinct path is looked up once, before any byte is read; a
    /// range past the node's published size fails the call with
    /// `OutOfRange` (never a short stream), a container with
    /// `TypeMismatch`, a missing node with `NotFound`, each as a
    /// [`RangeError`] naming the range. At most [`MAX_RANGES`] ranges.
    pub async fn read_ranges(
        &self,
        ranges: &[ByteRange],
        reads_in_flight: usize,
    ) -> std::result::Result<BagReader, RangeError> {
        if ranges.len() > MAX_RANGES {
            return Err(RangeError {
                range: None,
                error: Error::invalid_argument(format!(
                    "{} ranges in one stream; at most {MAX_RANGES}",
                    ranges.len()
                )),
            });
        }
        // Each distinct path with the first range that names it.
        let mut first: std::collections::HashMap<&str, usize> = Default::default();
        for (i, r) in ranges.iter().enumerate() {
            first.entry(r.path.as_str()).or_insert(i);
        }
        let nodes: std::collections::HashMap<&str, Arc<Node>> = stream::iter(first)
            .map(|(p, i)| async move {
                let found = self.lookup(p).await.and_then(|node| {
                    let ty = node.info().ty;
                    if matches!(ty, NodeType::File | NodeType::KeyValue) {
                        Ok(node)
                    } else {
                        Err(Error::type_mismatch(format!(
                            "{p} is a {ty}, not a File or KeyValue"
                        )))
                    }
                });
                match found {
                    Ok(node) => Ok((p, Arc::new(node))),
                    Err(e) => Err(RangeError::of(i, &ranges[i], e)),
                }
            })
            .buffer_unordered(reads_in_flight.max(1))
            .try_collect()
            .await?;
        let mut pieces = Vec::with_capacity(ranges.len());
        for (i, r) in ranges.iter().enumerate() {
            let node = nodes[r.path.as_str()].clone();
            let size = node.info().size;
            let inside = matches!(r.offset.checked_add(r.len), Some(end) if end <= size);
            if !inside {
                let e = Error::new(
                    ErrorCode::OutOfRange,
                    format!("past the end: it holds {size} bytes"),
                );
                return Err(RangeError::of(i, r, e));
            }
            pieces.push((r.path.clone(), node, r.offset, r.len));
        }
        Ok(multistream(pieces, reads_in_flight))
    }
}

/// The stream of `(name, node, offset, len)` pieces, in order, cut at block
/// boundaries, with `reads_in_flight` block reads outstanding.
fn multistream(pieces: Vec<(String, Arc<Node>, u64, u64)>, reads_in_flight: usize) -> BagReader {
    let mut entries = Vec::with_capacity(pieces.len());
    let mut chunks = Vec::new();
    let mut offset = 0u64;
    for (name, node, start, len) in pieces {
        let bs = node.info().block_size as u64;
        entries.push(BagEntry {
            name,
            offset,
            size: len,
        });
        let (mut pos, end) = (start, start + len);
        while pos < end {
            let n = (bs - pos % bs).min(end - pos);
            chunks.push((node.clone(), pos, n as usize));
            pos += n;
        }
        offset += len;
    }
    let stream = stream::iter(chunks)
        .map(|(node, pos, len)| async move { node.read_chunk(pos, len).await })
        .buffered(reads_in_flight.max(1))
        .boxed();
    BagReader {
        entries,
        total: offset,
        chunks: stream,
        current: Bytes::new(),
    }
}
