//! The lease keeper: a client renews the write leases of its open writers
//! a few times per lease (`MetaRequest::Renew`, which publishes nothing),
//! so a writer that pauses (a file held open, a slow producer) keeps its
//! node, while the metadata server lapses the leases of writers whose
//! client is gone and frees what they never published (`docs/security.md`,
//! *Space held by writers that vanished*). HDFS clients renew their leases
//! the same way.
//!
//! Costs: per open writer one entry (about 40 bytes); per client one task,
//! asleep while it has no open writer, and otherwise one `Renew` request
//! per metadata partition per period (at most [`MAX_RENEW_BATCH`] leases
//! each).

use nodekernel_proto::meta::{MetaReply, MetaRequest, MAX_RENEW_BATCH};
use nodekernel_proto::sync;
use nodekernel_proto::Result;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// Renewals per lease: a client that stalls for up to two thirds of a
/// lease keeps its writers' nodes.
const RENEWS_PER_LEASE: u64 = 3;

/// The period until a metadata server said how long a lease lasts.
const FIRST_PERIOD: Duration = Duration::from_millis(250);

/// How often an idle keeper checks that its client still exists.
const IDLE_CHECK: Duration = Duration::from_secs(10);

/// A write lease: (partition, node, lease id).
type Key = (usize, u64, u64);

/// The write leases a client holds, and the period of their renewal.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    /// Leases held, with the number of handles holding each.
    held: Mutex<BTreeMap<Key, usize>>,
    /// Wakes the keeper: a first lease is held, or the client is gone.
    wake: tokio::sync::Notify,
    /// Milliseconds between renewals; 0 until a metadata server told the
    /// lease's length.
    period_ms: AtomicU64,
}

/// One handle's hold on a write lease: renewed while it lives.
#[derive(Debug)]
pub(crate) struct LeaseHold {
    leases: Arc<Leases>,
    key: Key,
}

impl Drop for LeaseHold {
    fn drop(&mut self) {
        let mut held = sync::lock(&self.leases.held);
        if let Some(n) = held.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.key);
            }
        }
    }
}

impl Leases {
    /// Holds lease `lease` of `node` (partition `part`) until the hold is
    /// dropped.
    pub(crate) fn hold(self: &Arc<Self>, part: usize, node: u64, lease: u64) -> LeaseHold {
        let key = (part, node, lease);
        *sync::lock(&self.held).entry(key).or_insert(0) += 1;
        self.wake.notify_one();
        LeaseHold {
            leases: self.clone(),
            key,
        }
    }

    /// Ends the keeper of a client that is gone.
    pub(crate) fn client_gone(&self) {
        self.wake.notify_one();
    }

    /// The held leases by partition.
    fn by_partition(&self) -> BTreeMap<usize, Vec<(u64, u64)>> {
        let mut out: BTreeMap<usize, Vec<(u64, u64)>> = BTreeMap::new();
        for (part, node, lease) in sync::lock(&self.held).keys() {
            out.entry(*part).or_default().push((*node, *lease));
        }
        out
    }

    fn period(&self) -> Duration {
        match self.period_ms.load(Ordering::Relaxed) {
            0 => FIRST_PERIOD,
            ms => Duration::from_millis(ms),
        }
    }

    /// Notes a lease length (ms) a metadata server told: renewals come
    /// a few times per the shortest one.
    pub(crate) fn note_lease(&self, lease_ms: u64) {
        if lease_ms == 0 {
            return;
        }
        let period = (lease_ms / RENEWS_PER_LEASE).max(1);
        let _ = self
            .period_ms
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                (p == 0 || period < p).then_some(period)
            });
    }
}

/// Renews the leases of the client behind `client` while it exists,
/// sending each `Renew` to its partition with `send` (the client's
/// metadata request; the keeper knows nothing else of the client).
pub(crate) async fn keep<C, F, Fut>(client: Weak<C>, leases: Arc<Leases>, send: F)
where
    F: Fn(Arc<C>, usize, MetaRequest) -> Fut,
    Fut: Future<Output = Result<MetaReply>>,
{
    loop {
        // Registered before looking, so a hold made meanwhile wakes it.
        let wake = leases.wake.notified();
        tokio::pin!(wake);
        wake.as_mut().enable();
        let Some(inner) = client.upgrade() else {
            return;
        };
        let held = leases.by_partition();
        if held.is_empty() {
            drop(inner);
            let _ = tokio::time::timeout(IDLE_CHECK, wake).await;
            continue;
        }
        for (part, all) in held {
            for chunk in all.chunks(MAX_RENEW_BATCH) {
                renew(&inner, &send, &leases, part, chunk.to_vec()).await;
            }
        }
        drop(inner);
        tokio::time::sleep(leases.period()).await;
    }
}

/// One renewal of `batch` in partition `part`. A lease found lost is
/// renewed no more (its writer learns at its next write); a failed renewal
/// is tried again next period.
async fn renew<C, F, Fut>(
    inner: &Arc<C>,
    send: &F,
    leases: &Leases,
    part: usize,
    batch: Vec<(u64, u64)>,
) where
    F: Fn(Arc<C>, usize, MetaRequest) -> Fut,
    Fut: Future<Output = Result<MetaReply>>,
{
    let req = MetaRequest::Renew {
        leases: batch.clone(),
    };
    match send(inner.clone(), part, req).await {
        Ok(MetaReply::Renewed { lease_ms, lost }) => {
            leases.note_lease(lease_ms);
            if !lost.is_empty() {
                tracing::debug!("write leases of nodes {lost:?} are no longer held");
                let mut held = sync::lock(&leases.held);
                for (node, lease) in batch.iter().filter(|(n, _)| lost.contains(n)) {
                    held.remove(&(part, *node, *lease));
                }
            }
        }
        Ok(other) => tracing::warn!("a lease renewal was answered with {other:?}"),
        Err(e) => tracing::debug!("renewing write leases in partition {part} failed: {e}"),
    }
}
