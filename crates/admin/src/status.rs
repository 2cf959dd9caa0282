//! The JSON view of a cluster's status: what `nk status --json` prints and
//! what a metadata server's `/status` serves (for its own partition), so
//! the two cannot drift apart.

use nodekernel_proto::{ClusterStatus, ServerStatus};
use serde::Serialize;

#[derive(Debug, Clone, Default, Serialize)]
pub struct ClassOut {
    pub class: u8,
    pub name: String,
    pub servers: usize,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub blocks: u64,
    pub used_blocks: u64,
    /// Configured price of one GiB of this class.
    pub price_per_gib: f64,
    /// Price of the class's whole capacity.
    pub capacity_cost: f64,
    /// Data-path traffic of the class's servers (their cumulative counters
    /// as of their last heartbeats).
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    /// Blocks tier migration moved out of this class: down to a slower
    /// one (demoted) and up to a faster one (promoted).
    pub blocks_demoted: u64,
    pub blocks_promoted: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct StatusOut {
    pub block_size: u32,
    pub nodes: u64,
    /// Whether the expected storage servers are alive.
    pub ready: bool,
    pub expected_servers: u32,
    pub alive_servers: usize,
    /// Puts not yet closed, and removed nodes whose blocks are still being
    /// freed.
    pub puts_in_progress: u64,
    /// Puts reserved ahead of their keys by clients, not used yet.
    pub reserved_puts: u64,
    pub reclaiming: u64,
    pub classes: Vec<ClassOut>,
    pub servers: Vec<ServerOut>,
    /// The operation log of each persistent metadata server.
    pub logs: Vec<LogOut>,
    /// Every configured metadata partition, in partition order, and
    /// whether it answered.
    pub partitions: Vec<PartitionOut>,
    /// The partitions that did not answer (their nodes and their slices of
    /// the servers' capacity are missing above); `nk status` then exits
    /// with a nonzero status.
    pub unreachable: Vec<PartitionOut>,
}

#[derive(Debug, Serialize, Clone)]
pub struct PartitionOut {
    pub partition: u32,
    pub addr: String,
    pub reachable: bool,
    /// Why it did not answer (absent when it did).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LogOut {
    pub partition: u32,
    pub fsync: String,
    pub records: u64,
    pub checkpoint: u64,
    pub log_bytes: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct ServerOut {
    pub id: u32,
    pub addr: String,
    pub identity: String,
    pub class: u8,
    pub class_name: String,
    pub medium: String,
    pub location: String,
    pub alive: bool,
    /// Being drained: it gets no new blocks, its blocks are moving away.
    pub draining: bool,
    pub last_seen_ms: u64,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub blocks: u64,
    pub used_blocks: u64,
    /// Cumulative data-path counters the server reported in its last
    /// heartbeat (network requests only: co-located clients copy DRAM
    /// blocks through shared memory, which no server sees).
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub read_ops: u64,
    pub write_ops: u64,
}

impl From<&ServerStatus> for ServerOut {
    fn from(s: &ServerStatus) -> Self {
        let bs = s.block_size as u64;
        ServerOut {
            id: s.id,
            addr: s.addr.clone(),
            identity: s.identity.clone(),
            class: s.class,
            class_name: s.class_name.clone(),
            medium: s.medium.clone(),
            location: s.location.clone(),
            alive: s.alive,
            draining: s.draining,
            last_seen_ms: s.last_seen_ms,
            capacity_bytes: s.capacity_blocks * bs,
            used_bytes: s.used_blocks * bs,
            // A draining server takes no new blocks: its room is not free.
            free_bytes: if s.draining {
                0
            } else {
                (s.capacity_blocks - s.used_blocks.min(s.capacity_blocks)) * bs
            },
            blocks: s.capacity_blocks,
            used_blocks: s.used_blocks,
            bytes_read: s.traffic.bytes_read,
            bytes_written: s.traffic.bytes_written,
            read_ops: s.traffic.read_ops,
            write_ops: s.traffic.write_ops,
        }
    }
}

/// `{"error": MESSAGE}`: a status that could not be had.
pub fn error_json(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string()
}

impl StatusOut {
    /// Pretty-printed JSON, as `nk status --json` prints it.
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serialising cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// The view of `st` (one partition's reply, or the client's merge of
    /// several), listing `partitions` (number and address, in partition
    /// order); those named in `st.unreachable` are marked unreachable.
    pub fn new(st: &ClusterStatus, partitions: impl IntoIterator<Item = (u32, String)>) -> Self {
        let partitions: Vec<PartitionOut> = partitions
            .into_iter()
            .map(|(partition, addr)| {
                let down = st.unreachable.iter().find(|d| d.partition == partition);
                PartitionOut {
                    partition,
                    addr,
                    reachable: down.is_none(),
                    error: down.map(|d| d.error.clone()),
                }
            })
            .collect();
        let unreachable: Vec<PartitionOut> = partitions
            .iter()
            .filter(|p| !p.reachable)
            .cloned()
            .collect();
        let servers: Vec<ServerOut> = st.servers.iter().map(ServerOut::from).collect();
        let mut classes: Vec<ClassOut> = st
            .classes
            .iter()
            .map(|c| ClassOut {
                class: c.class,
                name: c.name.clone(),
                price_per_gib: c.price_per_gib,
                ..ClassOut::default()
            })
            .collect();
        for s in &servers {
            let Some(c) = classes.iter_mut().find(|c| c.class == s.class) else {
                continue;
            };
            c.servers += 1;
            c.capacity_bytes += s.capacity_bytes;
            c.used_bytes += s.used_bytes;
            c.blocks += s.blocks;
            c.used_blocks += s.used_blocks;
            if s.alive && !s.draining {
                c.free_bytes += s.free_bytes;
            }
            c.bytes_read += s.bytes_read;
            c.bytes_written += s.bytes_written;
            c.read_ops += s.read_ops;
            c.write_ops += s.write_ops;
        }
        for m in &st.moves {
            if let Some(c) = classes.iter_mut().find(|c| c.class == m.class) {
                c.blocks_demoted += m.demoted;
                c.blocks_promoted += m.promoted;
            }
        }
        // Classes configured but without servers are not shown.
        classes.retain(|c| c.servers > 0);
        for c in &mut classes {
            c.capacity_cost = c.capacity_bytes as f64 / (1u64 << 30) as f64 * c.price_per_gib;
        }
        classes.sort_by_key(|c| c.class);
        StatusOut {
            block_size: st.block_size,
            nodes: st.nodes,
            ready: st.is_ready() && unreachable.is_empty(),
            expected_servers: st.expected_servers,
            alive_servers: st.servers.iter().filter(|s| s.alive).count(),
            puts_in_progress: st.puts_in_progress,
            reserved_puts: st.reserved_puts,
            reclaiming: st.reclaiming,
            classes,
            servers,
            logs: st
                .logs
                .iter()
                .map(|l| LogOut {
                    partition: l.partition,
                    fsync: l.fsync.clone(),
                    records: l.records,
                    checkpoint: l.checkpoint,
                    log_bytes: l.log_bytes,
                })
                .collect(),
            partitions,
            unreachable,
        }
    }
}

/// What a storage server's `/status` serves.
#[derive(Debug, Clone, Default, Serialize)]
pub struct StoreStatusOut {
    /// Always `"store"` (a metadata server's status has `servers`).
    pub role: &'static str,
    /// The address registered with the metadata servers.
    pub addr: String,
    pub identity: String,
    pub class: u8,
    pub class_name: String,
    pub medium: String,
    /// How the medium moves bytes (`memory`, `io_uring+O_DIRECT`, …).
    pub io_mode: String,
    pub block_size: u32,
    pub blocks: u64,
    pub capacity_bytes: u64,
    /// The metadata servers it registers with, and its id with each
    /// (`null` while not registered).
    pub metas: Vec<String>,
    pub server_ids: Vec<Option<u32>>,
    /// Data-path counters since the start (network requests only).
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub read_ops: u64,
    pub write_ops: u64,
    /// Large writes received from the socket straight into DRAM.
    pub writes_in_place: u64,
}

impl StoreStatusOut {
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serialising cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodekernel_proto::ClassInfo;

    fn server(id: u32, alive: bool, draining: bool) -> ServerStatus {
        ServerStatus {
            id,
            addr: format!("127.0.0.1:{id}"),
            class: 0,
            class_name: "dram".into(),
            medium: "dram".into(),
            location: String::new(),
            block_size: 1 << 20,
            capacity_blocks: 100,
            used_blocks: 10,
            alive,
            last_seen_ms: 0,
            identity: format!("id{id}"),
            draining,
            traffic: Default::default(),
        }
    }

    /// A draining server takes no new blocks, and a dead one none either:
    /// neither's room counts as free.
    #[test]
    fn only_servers_taking_blocks_count_as_free() {
        let st = ClusterStatus {
            block_size: 1 << 20,
            nodes: 1,
            puts_in_progress: 0,
            reserved_puts: 0,
            reclaiming: 0,
            partition: 0,
            partitions: 1,
            expected_servers: 3,
            classes: vec![ClassInfo {
                class: 0,
                name: "dram".into(),
                price_per_gib: 0.0,
                encrypt: false,
            }],
            servers: vec![
                server(1, true, false),
                server(2, true, true),
                server(3, false, false),
            ],
            logs: Vec::new(),
            unreachable: Vec::new(),
            moves: Vec::new(),
            lease_ms: 30_000,
        };
        let out = StatusOut::new(&st, [(0, "127.0.0.1:9060".to_string())]);
        let mib = 1u64 << 20;
        assert_eq!(out.servers[0].free_bytes, 90 * mib);
        assert_eq!(out.servers[1].free_bytes, 0, "draining");
        assert_eq!(out.classes[0].free_bytes, 90 * mib);
        assert_eq!(out.classes[0].capacity_bytes, 300 * mib);
        assert_eq!(out.classes[0].used_bytes, 30 * mib);
    }
}
