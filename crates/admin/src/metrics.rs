//! Helpers for the servers' metrics: request counters and latency
//! histograms by request type, and the text encoding of a registry.
//!
//! A server keeps its live families (they are shared handles) and, per
//! scrape, registers them with the gauges of the moment in a fresh
//! [`Registry`], which [`encode`] writes out.

use prometheus_client::encoding::text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::time::Duration;

/// The label set of a per-request-type metric: `op="<name>"`.
pub type OpLabel = [(&'static str, &'static str); 1];
/// Any other label set (a server's id, address and class, …).
pub type Labels = Vec<(&'static str, String)>;

/// Latency buckets: 10 µs doubling up to about 5 s.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(10e-6, 2.0, 20))
}

/// Requests handled, by type: how many (`<prefix>_requests_total`) and
/// how long each took (`<prefix>_request_duration_seconds`). Cheap to
/// clone (the clones share the counts).
#[derive(Clone)]
pub struct RequestMetrics {
    ops: Family<OpLabel, Counter>,
    latency: Family<OpLabel, Histogram, fn() -> Histogram>,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        RequestMetrics {
            ops: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
        }
    }
}

impl RequestMetrics {
    /// Counts one request of type `op` that took `took`.
    pub fn observe(&self, op: &'static str, took: Duration) {
        let l = [("op", op)];
        self.ops.get_or_create(&l).inc();
        self.latency.get_or_create(&l).observe(took.as_secs_f64());
    }

    /// Requests of type `op` so far.
    pub fn count(&self, op: &'static str) -> u64 {
        self.ops.get_or_create(&[("op", op)]).get()
    }

    /// Adds both families to `reg` (whose prefix names the server).
    pub fn register(&self, reg: &mut Registry, what: &str) {
        reg.register(
            "requests",
            format!("{what} requests handled, by type"),
            self.ops.clone(),
        );
        reg.register(
            "request_duration_seconds",
            format!("Time to handle one {what} request, by type"),
            self.latency.clone(),
        );
    }
}

fn signed(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A gauge family filled for one scrape.
pub fn gauges<I>(values: I) -> Family<Labels, Gauge>
where
    I: IntoIterator<Item = (Labels, u64)>,
{
    let f = Family::<Labels, Gauge>::default();
    for (l, v) in values {
        f.get_or_create(&l).set(signed(v));
    }
    f
}

/// A counter family filled for one scrape from cumulative values kept
/// elsewhere (e.g. reported by storage servers).
pub fn counters<I>(values: I) -> Family<Labels, Counter>
where
    I: IntoIterator<Item = (Labels, u64)>,
{
    let f = Family::<Labels, Counter>::default();
    for (l, v) in values {
        f.get_or_create(&l).inc_by(v);
    }
    f
}

/// A counter holding `v`.
pub fn counter(v: u64) -> Counter {
    let c = Counter::default();
    c.inc_by(v);
    c
}

/// A gauge holding `v`.
pub fn gauge(v: u64) -> Gauge {
    let g = Gauge::default();
    g.set(signed(v));
    g
}

/// `reg` in the OpenMetrics text format (which Prometheus reads).
pub fn encode(reg: &Registry) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = text::encode(&mut out, reg);
    out
}
