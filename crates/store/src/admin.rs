//! The storage server's metrics (`nodekernel_store_*`) and what its admin
//! endpoint serves.

use crate::server::Registrar;
use nodekernel_admin::metrics::{counter, encode, gauge, RequestMetrics};
use nodekernel_admin::prometheus_client::registry::Registry;
use nodekernel_admin::status::StoreStatusOut;
use nodekernel_admin::Source;
use nodekernel_proto::store::op;
use nodekernel_proto::Traffic;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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

/// The admin endpoint's view of a storage server.
pub(crate) struct StoreAdmin {
    pub(crate) metrics: Arc<StoreMetrics>,
    pub(crate) in_place: Arc<AtomicU64>,
    /// Its id with each metadata server.
    pub(crate) registrar: Arc<Registrar>,
    /// Everything else `/status` shows (fixed at start).
    pub(crate) info: StoreStatusOut,
}

impl StoreAdmin {
    fn view(&self) -> StoreStatusOut {
        let t = self.metrics.traffic();
        StoreStatusOut {
            server_ids: self.registrar.ids(),
            bytes_read: t.bytes_read,
            bytes_written: t.bytes_written,
            read_ops: t.read_ops,
            write_ops: t.write_ops,
            writes_in_place: self.in_place.load(Ordering::Relaxed),
            ..self.info.clone()
        }
    }
}

impl Source for StoreAdmin {
    fn metrics(&self) -> String {
        let v = self.view();
        let mut root = Registry::default();
        let reg = root.sub_registry_with_prefix("nodekernel_store");
        self.metrics.requests.register(reg, "storage");
        reg.register("read_bytes", "Bytes sent to readers", counter(v.bytes_read));
        reg.register(
            "written_bytes",
            "Bytes written by clients",
            counter(v.bytes_written),
        );
        reg.register(
            "writes_in_place",
            "Large writes received from the socket straight into DRAM",
            counter(v.writes_in_place),
        );
        reg.register("capacity_bytes", "Bytes exported", gauge(v.capacity_bytes));
        reg.register("blocks", "Blocks exported", gauge(v.blocks));
        reg.register(
            "block_size_bytes",
            "Size of one block",
            gauge(v.block_size as u64),
        );
        let registered = v.server_ids.iter().filter(|i| i.is_some()).count();
        reg.register(
            "registered",
            "Metadata servers this server is registered with",
            gauge(registered as u64),
        );
        encode(&root)
    }

    fn status(&self) -> String {
        self.view().to_json()
    }

    /// The endpoint stops with the server: serving means healthy.
    fn health(&self) -> Result<(), String> {
        Ok(())
    }

    fn ready(&self) -> Result<(), String> {
        let ids = self.registrar.ids();
        match ids.iter().filter(|i| i.is_none()).count() {
            0 => Ok(()),
            n => Err(format!(
                "not registered with {n} of {} metadata servers",
                ids.len()
            )),
        }
    }
}
