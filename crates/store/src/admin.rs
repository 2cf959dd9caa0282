//! What a storage server's admin endpoint serves: its metrics
//! (`nodekernel_store_*`, counted in `metrics.rs`) and its status.

use crate::metrics::StoreMetrics;
use crate::registrar::Registrar;
use nodekernel_admin::metrics::{counter, encode, gauge};
use nodekernel_admin::prometheus_client::registry::Registry;
use nodekernel_admin::status::StoreStatusOut;
use nodekernel_admin::Source;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

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
