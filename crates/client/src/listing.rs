//! Enumeration through the data plane (`docs/records.md`): the metadata
//! server answers with the live-slot bitmap, the client reads the child
//! records from the container's extents (pieces, then blocks).

use crate::client::{unexpected, Client};
use crate::node::Node;
use futures::StreamExt;
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::record::{self, Layout, MAX_RECORD_SLOTS, SLOT_SIZE};
use nodekernel_proto::{path, ErrorCode, NodeInfo, NodeType, Result, NO_CLASS};

impl Client {
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
                pieces,
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
            let layout = Layout::new(block_size, pieces);
            let data = self
                .read_container(p, idx, container, layout, slots)
                .await?;
            let mut entries: Vec<(u32, NodeType, String)> = Vec::new();
            let mut missing = Vec::new();
            for slot in (0..slots as usize).filter(|s| is_live(*s)) {
                // A record takes the slots its name needs (no more than the
                // longest); its length field says how many.
                let end = data
                    .len()
                    .min((slot + MAX_RECORD_SLOTS as usize) * SLOT_SIZE);
                let bytes = data.get(slot * SLOT_SIZE..end).unwrap_or(&[]);
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
    /// the slot size): what enumerating it reads.
    pub async fn container_data_len(&self, p: &str) -> Result<u64> {
        path::components(p)?;
        let req = MetaRequest::Enumerate {
            path: p.to_string(),
        };
        match self.meta_at(self.partition(p), &req).await? {
            MetaReply::Listing { slots, .. } => Ok(slots as u64 * SLOT_SIZE as u64),
            other => Err(unexpected(other)),
        }
    }

    /// Reads a container's record array, `slots` records in the extents
    /// of `layout`, a few extents at a time. An extent that cannot be read
    /// (records lost with a storage server) reads as zeros: its live slots
    /// then get their names from the metadata server.
    async fn read_container(
        &self,
        p: &str,
        idx: usize,
        id: u64,
        layout: Layout,
        slots: u32,
    ) -> Result<Vec<u8>> {
        let info = NodeInfo {
            id,
            ty: NodeType::Directory,
            size: slots as u64 * SLOT_SIZE as u64,
            block_size: layout.block_size(),
            storage_class: NO_CLASS,
            location: String::new(),
            enumerable: true,
            mode: 0,
            mtime: 0,
            lease: 0,
            encrypted: false,
            first_block: None,
            record: None,
            stored: 0,
            expires_ms: 0,
            child_ttl_ms: 0,
        };
        let node = Node::new(self.clone(), p.to_string(), idx, info);
        let locs = match node.block_locations().await {
            Ok(locs) => locs,
            Err(e) if lost(&e) => Vec::new(),
            Err(e) => return Err(e),
        };
        // (extent, location, records in it to read)
        let mut reads = Vec::new();
        let mut left = slots;
        for (k, loc) in locs.into_iter().enumerate().take(layout.extents_for(slots)) {
            let n = layout.slots_in(k).min(left);
            left -= n;
            reads.push((k as u64, loc, n as usize * SLOT_SIZE));
        }
        let node = &node;
        let parts: Vec<(usize, Result<bytes::Bytes>)> =
            futures::stream::iter(reads)
                .map(|(k, loc, len)| async move {
                    (len, self.inner.io.read(node, k, loc, 0, len).await)
                })
                .buffered(EXTENT_READS)
                .collect()
                .await;
        let mut data = Vec::with_capacity(slots as usize * SLOT_SIZE);
        for (k, (len, part)) in parts.into_iter().enumerate() {
            match part {
                Ok(b) => data.extend_from_slice(&b),
                Err(e) if lost(&e) => {
                    tracing::warn!(
                        "{p}: child records in extent {k} unreadable ({e}); asking the metadata server"
                    );
                    data.resize(data.len() + len, 0);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(data)
    }
}

/// Record extents read at once.
const EXTENT_READS: usize = 8;

/// Whether `e` means records were lost with a storage server (or moved
/// under the reader): their names then come from the metadata server.
fn lost(e: &nodekernel_proto::Error) -> bool {
    matches!(
        e.code,
        ErrorCode::Unavailable | ErrorCode::Timeout | ErrorCode::DataLost | ErrorCode::Stale
    )
}
