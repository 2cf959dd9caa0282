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

/// Whether every partition's part of a drain is finished: the server holds
/// no block (or the drain was cancelled).
pub fn drain_finished(parts: &[DrainStatus]) -> bool {
    parts.iter().all(|p| p.state != DrainState::Draining)
}
