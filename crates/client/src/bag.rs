//! Reading a Bag as one sequential stream (the multistream of the paper).

use crate::{Client, Node};
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use nodekernel_proto::{Error, ErrorCode, NodeType, Result};
use std::sync::Arc;

/// Reads in flight by default when reading a Bag.
pub const DEFAULT_BAG_READS_IN_FLIGHT: usize = 16;

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
        let mut entries = Vec::with_capacity(files.len());
        let mut chunks = Vec::new();
        let mut offset = 0u64;
        for (name, node) in files {
            let size = node.info().size;
            let bs = node.info().block_size as u64;
            entries.push(BagEntry { name, offset, size });
            let mut pos = 0;
            while pos < size {
                let len = (bs - pos % bs).min(size - pos);
                chunks.push((node.clone(), pos, len as usize));
                pos += len;
            }
            offset += size;
        }
        let stream = stream::iter(chunks)
            .map(|(node, pos, len)| async move { node.read_chunk(pos, len).await })
            .buffered(reads_in_flight.max(1))
            .boxed();
        Ok(BagReader {
            entries,
            total: offset,
            chunks: stream,
            current: Bytes::new(),
        })
    }
}
