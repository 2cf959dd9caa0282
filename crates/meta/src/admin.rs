//! What the metadata server's admin endpoint serves: its metrics
//! (`nodekernel_meta_*`), its partition's status as `nk status --json`
//! prints it, and its health.

use crate::handler::MetaHandler;
use nodekernel_admin::metrics::{counter, counters, encode, gauge, gauges, Labels};
use nodekernel_admin::prometheus_client::registry::Registry;
use nodekernel_admin::status::StatusOut;
use nodekernel_admin::Source;
use nodekernel_proto::sync;
use nodekernel_proto::ClusterStatus;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Counting the write leases held walks every node under the state lock,
/// so a count is reused for this long.
const LEASE_COUNT_TTL: Duration = Duration::from_secs(5);

pub(crate) struct MetaAdmin {
    handler: Arc<MetaHandler>,
    /// The server's RPC address, named in `/status`'s partition list.
    addr: String,
    /// The last count of write leases held, and when it was taken.
    leases: Mutex<Option<(Instant, u64)>>,
}

impl MetaAdmin {
    pub(crate) fn new(handler: Arc<MetaHandler>, addr: String) -> MetaAdmin {
        MetaAdmin {
            handler,
            addr,
            leases: Mutex::new(None),
        }
    }

    /// Write leases held (File and KeyValue writers), at most
    /// [`LEASE_COUNT_TTL`] old.
    fn leases(&self) -> u64 {
        let mut cached = sync::lock(&self.leases);
        if let Some((at, n)) = *cached {
            if at.elapsed() < LEASE_COUNT_TTL {
                return n;
            }
        }
        let n = {
            let st = self.handler.state();
            st.ns().nodes().filter(|n| n.lease.is_some()).count() as u64
        };
        *cached = Some((Instant::now(), n));
        n
    }

    fn view(&self, st: &ClusterStatus) -> StatusOut {
        StatusOut::new(st, [(st.partition, self.addr.clone())])
    }
}

/// One number of a subtree's usage, if it has it.
type Of = fn(&nodekernel_proto::quota::UsageInfo) -> Option<u64>;

/// The usage gauges `{prefix}_used_bytes`, `_used_nodes`, `_data_bytes`,
/// `_limit_bytes` and `_limit_nodes` of `rows`, each labelled `label.0`
/// with its name; `label.1` says what a row is, in the help texts.
fn usage_gauges(
    reg: &mut Registry,
    prefix: &str,
    (label, what): (&'static str, &str),
    rows: &[(String, nodekernel_proto::quota::UsageInfo)],
) {
    let per_row = |f: Of| {
        rows.iter()
            .filter_map(|(name, u)| f(u).map(|v| (vec![(label, name.clone())], v)))
            .collect::<Vec<(Labels, u64)>>()
    };
    let gauges_of: [(&str, String, Of); 5] = [
        (
            "used_bytes",
            format!("Storage {what}'s subtree holds (blocks and pieces)"),
            |u| Some(u.held),
        ),
        ("used_nodes", format!("Nodes below {what}"), |u| {
            Some(u.nodes)
        }),
        (
            "data_bytes",
            format!("Bytes of data (published sizes) below {what}"),
            |u| Some(u.bytes),
        ),
        (
            "limit_bytes",
            format!("The limit on storage held of {what} (only those with one)"),
            |u| u.quota.and_then(|q| limit(q.bytes)),
        ),
        (
            "limit_nodes",
            format!("The limit on nodes of {what} (only those with one)"),
            |u| u.quota.and_then(|q| limit(q.nodes)),
        ),
    ];
    for (name, help, f) in gauges_of {
        reg.register(format!("{prefix}_{name}"), help, gauges(per_row(f)));
    }
}

/// A quota limit, if one is set.
fn limit(v: u64) -> Option<u64> {
    (v != nodekernel_proto::quota::NO_LIMIT).then_some(v)
}

/// `server`, `addr` and `class` labels of a storage server.
fn server_labels(s: &nodekernel_admin::status::ServerOut) -> Labels {
    vec![
        ("server", s.id.to_string()),
        ("addr", s.addr.clone()),
        ("class", s.class_name.clone()),
    ]
}

fn class_labels(c: &nodekernel_admin::status::ClassOut) -> Labels {
    vec![("class", c.name.clone()), ("id", c.class.to_string())]
}

impl Source for MetaAdmin {
    fn metrics(&self) -> String {
        let mut root = Registry::default();
        let reg = root.sub_registry_with_prefix("nodekernel_meta");
        self.handler.requests.register(reg, "metadata");
        let st = match self.handler.status() {
            Ok(st) => st,
            // Only the request counters then.
            Err(_) => return encode(&root),
        };
        let v = self.view(&st);
        let leases = self.leases();
        reg.register("nodes", "Nodes in this partition", gauge(v.nodes));
        reg.register("write_leases", "Write leases held", gauge(leases));
        reg.register(
            "puts_in_progress",
            "KeyValue puts not closed yet",
            gauge(v.puts_in_progress),
        );
        reg.register(
            "reserved_puts",
            "Puts reserved ahead of their keys by clients, not used yet",
            gauge(v.reserved_puts),
        );
        reg.register(
            "reclaiming",
            "Removed nodes whose blocks are still being freed",
            gauge(v.reclaiming),
        );
        reg.register(
            "ready",
            "1 when the expected storage servers are alive",
            gauge(v.ready as u64),
        );
        let h = &self.handler;
        let by = |via: &str, n: &std::sync::atomic::AtomicU64| {
            (vec![("via", via.to_string())], n.load(Ordering::Relaxed))
        };
        reg.register(
            "claims",
            "Block claims delivered to storage servers: by a call to a storage server in this \
             process, or as requests",
            counters([
                by("call", &h.claims_by_call),
                by("request", &h.claims_by_request),
            ]),
        );
        reg.register(
            "expired",
            "Nodes removed because they expired (each with its subtree; unclosed puts among them)",
            counter(h.expired.load(Ordering::Relaxed)),
        );
        reg.register(
            "sessions_lapsed",
            "Sessions ended because their client stopped renewing the lease (what they bound is removed)",
            counter(h.sessions_lapsed.load(Ordering::Relaxed)),
        );
        reg.register(
            "session_removed",
            "Nodes bound to sessions that ended, closed or lapsed (each removed with its subtree; counted in expired too)",
            counter(h.session_removed.load(Ordering::Relaxed)),
        );
        reg.register(
            "sessions_open",
            "Sessions open (docs/lifecycle.md, Sessions)",
            gauge(h.state().ns().lifetimes().open_sessions() as u64),
        );
        reg.register(
            "expiring_nodes",
            "Nodes that carry an expiry time",
            gauge(h.state().ns().lifetimes().expiring() as u64),
        );
        reg.register(
            "quota_refused",
            "Requests refused because they would take a subtree past its quota",
            counter(h.quota_refused_total.load(Ordering::Relaxed)),
        );
        let refused: Vec<(Labels, u64)> = sync::lock(&h.quota_refused)
            .iter()
            .map(|(root, n)| (vec![("root", root.clone())], *n))
            .collect();
        reg.register(
            "quota_refused_by_root",
            "Requests refused by each quota root (its path when refused)",
            counters(refused),
        );
        // Usage per quota root (at most MAX_QUOTAS) and per tenant (its
        // root's; at most MAX_TENANTS), from the accounting.
        let (roots, tenants) = {
            let st = h.state();
            let tenants: Vec<_> = h
                .tenants
                .values()
                .filter_map(|t| Some((t.name.clone(), st.usage_at(&t.root)?)))
                .collect();
            let roots = st.quota_infos().into_iter().map(|u| (u.path.clone(), u));
            (roots.collect::<Vec<_>>(), tenants)
        };
        usage_gauges(reg, "quota", ("root", "a quota root"), &roots);
        usage_gauges(reg, "tenant", ("tenant", "a tenant's root"), &tenants);
        reg.register(
            "pending_claims",
            "Block claims storage servers have not acknowledged yet (retried by the ticker)",
            gauge(h.pending_claims()),
        );
        let per_server = |f: fn(&nodekernel_admin::status::ServerOut) -> u64| {
            v.servers.iter().map(move |s| (server_labels(s), f(s)))
        };
        let per_class = |f: fn(&nodekernel_admin::status::ClassOut) -> u64| {
            v.classes.iter().map(move |c| (class_labels(c), f(c)))
        };
        type S = nodekernel_admin::status::ServerOut;
        type C = nodekernel_admin::status::ClassOut;
        /// (metric name, help, the value of one server or class).
        type Table<T, const N: usize> = [(&'static str, &'static str, fn(&T) -> u64); N];
        let server_gauges: Table<S, 4> = [
            (
                "server_capacity_bytes",
                "Bytes a storage server exports to this partition",
                |s| s.capacity_bytes,
            ),
            (
                "server_used_bytes",
                "Bytes of a storage server in use (allocated blocks)",
                |s| s.used_bytes,
            ),
            ("server_alive", "1 while a storage server heartbeats", |s| {
                s.alive as u64
            }),
            (
                "server_draining",
                "1 while a storage server is being drained",
                |s| s.draining as u64,
            ),
        ];
        let server_counters: Table<S, 4> = [
            (
                "server_read_bytes",
                "Bytes a storage server sent to readers (as of its last heartbeat)",
                |s| s.bytes_read,
            ),
            (
                "server_written_bytes",
                "Bytes written to a storage server (as of its last heartbeat)",
                |s| s.bytes_written,
            ),
            (
                "server_read_ops",
                "Read requests a storage server served (as of its last heartbeat)",
                |s| s.read_ops,
            ),
            (
                "server_write_ops",
                "Write requests a storage server served (as of its last heartbeat)",
                |s| s.write_ops,
            ),
        ];
        let class_gauges: Table<C, 3> = [
            (
                "class_capacity_bytes",
                "Bytes a storage class exports to this partition",
                |c| c.capacity_bytes,
            ),
            ("class_used_bytes", "Bytes of a storage class in use", |c| {
                c.used_bytes
            }),
            ("class_servers", "Storage servers of a class", |c| {
                c.servers as u64
            }),
        ];
        let class_counters: Table<C, 6> = [
            (
                "class_blocks_demoted",
                "Blocks tier migration moved from a storage class down to a slower one",
                |c| c.blocks_demoted,
            ),
            (
                "class_blocks_promoted",
                "Blocks tier migration moved from a storage class up to a faster one",
                |c| c.blocks_promoted,
            ),
            (
                "class_read_bytes",
                "Bytes the servers of a storage class sent to readers",
                |c| c.bytes_read,
            ),
            (
                "class_written_bytes",
                "Bytes written to the servers of a storage class",
                |c| c.bytes_written,
            ),
            (
                "class_read_ops",
                "Read requests the servers of a storage class served",
                |c| c.read_ops,
            ),
            (
                "class_write_ops",
                "Write requests the servers of a storage class served",
                |c| c.write_ops,
            ),
        ];
        for (name, help, f) in server_gauges {
            reg.register(name, help, gauges(per_server(f)));
        }
        for (name, help, f) in server_counters {
            reg.register(name, help, counters(per_server(f)));
        }
        for (name, help, f) in class_gauges {
            reg.register(name, help, gauges(per_class(f)));
        }
        for (name, help, f) in class_counters {
            reg.register(name, help, counters(per_class(f)));
        }
        encode(&root)
    }

    fn status(&self) -> String {
        match self.handler.status() {
            Ok(st) => self.view(&st).to_json(),
            Err(e) => nodekernel_admin::status::error_json(&e.to_string()),
        }
    }

    fn health(&self) -> Result<(), String> {
        self.handler.log_ok().map_err(|e| e.to_string())
    }

    fn changes_allowed(&self) -> Result<(), String> {
        if self.handler.authenticated {
            return Err(
                "this cluster requires its token, which the admin endpoint cannot check: \
                        change the policy with `nk policy set` (the endpoint only reads it)"
                    .into(),
            );
        }
        Ok(())
    }

    fn policy(&self, set: &[(String, String)]) -> Option<Result<String, String>> {
        Some(
            self.handler
                .policy(set)
                .map(|v| nodekernel_admin::pairs_json(&v))
                .map_err(|e| e.to_string()),
        )
    }

    fn ready(&self) -> Result<(), String> {
        self.health()?;
        let st = self.handler.status().map_err(|e| e.to_string())?;
        let alive = st.servers.iter().filter(|s| s.alive).count();
        if st.is_ready() {
            Ok(())
        } else {
            Err(format!(
                "not ready: {alive} of {} expected storage servers alive",
                st.expected_servers
            ))
        }
    }
}
