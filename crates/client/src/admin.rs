//! Cluster administration through the metadata partitions: draining a
//! storage server, reading and changing the tiering policy.

use crate::client::{unexpected, Client};
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::types::{DrainState, DrainStatus};
use nodekernel_proto::Result;

impl Client {
    /// Starts draining storage server `server` (its identity or its
    /// registered address) in every metadata partition, or reports the
    /// progress of a drain already running (asking again also starts it
    /// again on a metadata server that restarted meanwhile); with `cancel`,
    /// stops it and lets the server take new blocks again. A draining
    /// server gets no new blocks while its blocks are moved to other
    /// servers of its class (else the next class with room); readers and
    /// writers follow the moved blocks. Returns one status per partition,
    /// in partition order.
    pub async fn drain(&self, server: &str, cancel: bool) -> Result<Vec<DrainStatus>> {
        let req = MetaRequest::Drain {
            server: server.to_string(),
            cancel,
        };
        let mut out = Vec::new();
        for idx in 0..self.config().metas.len() {
            match self.meta_at(idx, &req).await? {
                MetaReply::Drain(s) => out.push(s),
                other => return Err(unexpected(other)),
            }
        }
        Ok(out)
    }

    /// Changes the tiering and placement policy (`set`: (key, value) pairs,
    /// applied in order, all or none; empty: only read it) in every
    /// metadata partition, and returns each partition's settings after
    /// the change, in partition order. Keys and values:
    /// `docs/tiering.md`. A refused change (unknown key, bad value) is an
    /// `InvalidArgument` naming the key; partitions are asked in order, so
    /// a refusal comes from the first one, before any changed.
    pub async fn policy(&self, set: &[(String, String)]) -> Result<Vec<Vec<(String, String)>>> {
        let req = MetaRequest::Policy { set: set.to_vec() };
        let mut out = Vec::new();
        for idx in 0..self.config().metas.len() {
            match self.meta_at(idx, &req).await? {
                MetaReply::Policy(s) => out.push(s),
                other => return Err(unexpected(other)),
            }
        }
        Ok(out)
    }
}

impl Client {
    /// Asks the storage server at `addr` (its data address, as `nk status`
    /// shows it) to export `bytes` of its memory from now on (dynamic
    /// capacity; `u64::MAX`: all of it). Returns the bytes it will export
    /// (whole blocks of each metadata partition's share). Blocks past the
    /// new size that are in use move to other servers first; the server's
    /// `capacity_blocks` in [`Client::status`] reaches the new size once
    /// they have.
    pub async fn resize_store(&self, addr: &str, bytes: u64) -> Result<u64> {
        let req = nodekernel_proto::store::StoreRequest::Resize { bytes };
        let mut buf = bytes::BytesMut::new();
        req.encode(&mut buf);
        let reply = self.inner.pool.call(addr, req.op(), &[&buf]).await?;
        let mut d = nodekernel_proto::codec::Dec::new(&reply, "resize reply");
        let exported = d.u64()?;
        d.finish()?;
        Ok(exported)
    }
}

/// Whether every partition's part of a drain is finished: the server holds
/// no block (or the drain was cancelled).
pub fn drain_finished(parts: &[DrainStatus]) -> bool {
    parts.iter().all(|p| p.state != DrainState::Draining)
}
