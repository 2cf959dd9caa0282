//! The data path's counters ([`StoreMetrics`]): what heartbeats report to
//! the metadata servers and the admin endpoint shows.

use nodekernel_admin::metrics::RequestMetrics;
use nodekernel_proto::store::op;
use nodekernel_proto::Traffic;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The data path's counters: requests by type and their latency, and the
/// bytes they moved. Network requests only: co-located clients copy DRAM
/// blocks through shared memory, which the server never sees.
#[derive(Default)]
pub(crate) struct StoreMetrics {
    pub(crate) requests: RequestMetrics,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

impl StoreMetrics {
    /// One request of type `op` that started at `started` ended.
    pub(crate) fn done(&self, op: u16, started: Instant) {
        self.requests.observe(op::name(op), started.elapsed());
    }

    pub(crate) fn read(&self, bytes: u32) {
        self.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub(crate) fn written(&self, bytes: usize) {
        self.bytes_written
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// The counters a heartbeat reports.
    pub(crate) fn traffic(&self) -> Traffic {
        Traffic {
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            read_ops: self.requests.count(op::name(op::READ)),
            write_ops: self.requests.count(op::name(op::WRITE)),
        }
    }
}
