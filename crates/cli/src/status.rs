//! `nk status`: the merged view of the metadata partitions, readiness, and
//! waiting for it.

use nodekernel_client::Client;
use nodekernel_cluster::human;
use std::time::Instant;

use nodekernel_admin::status::StatusOut;
#[cfg(test)]
use nodekernel_admin::status::{PartitionOut, ServerOut};

/// The readiness line of `nk status`: more servers than expected (stores
/// started one by one) read as such, not as "2 of 1".
fn readiness_line(ready: bool, alive: usize, expected: u32) -> String {
    if ready {
        format!("ready: {alive} storage servers alive ({expected} expected)")
    } else {
        format!("NOT READY: {alive} of {expected} expected storage servers alive")
    }
}

/// Waits until the cluster is ready (the expected storage servers are
/// alive), polling status, for at most `timeout`.
pub async fn wait_ready(
    client: &Client,
    timeout: std::time::Duration,
) -> anyhow::Result<nodekernel_client::ClusterStatus> {
    let deadline = Instant::now() + timeout;
    let mut said = false;
    loop {
        let st = client.status().await?;
        if st.is_ready() && st.unreachable.is_empty() {
            return Ok(st);
        }
        let alive = st.servers.iter().filter(|s| s.alive).count();
        if Instant::now() >= deadline {
            if !st.unreachable.is_empty() {
                return Err(unavailable(format!(
                    "the cluster is not ready after {:?}: {}",
                    timeout,
                    unreachable_summary(&st.unreachable, client.config().metas.len())
                )));
            }
            return Err(unavailable(format!(
                "the cluster is not ready after {:?}: {alive} of {} expected storage servers are alive",
                timeout,
                st.expected_servers
            )));
        }
        if !said {
            eprintln!(
                "waiting for storage servers: {alive} of {} alive",
                st.expected_servers
            );
            said = true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

fn unavailable(message: String) -> anyhow::Error {
    crate::common::coded(
        crate::common::Code::Wire(nodekernel_client::ErrorCode::Unavailable),
        message,
    )
}

/// `1 of 2 metadata partitions unreachable: partition 1 at ADDR (error)`.
fn unreachable_summary(down: &[nodekernel_proto::types::PartitionDown], total: usize) -> String {
    format!(
        "{} of {total} metadata partitions unreachable: {}",
        down.len(),
        down.iter()
            .map(|d| format!("partition {} at {} ({})", d.partition, d.addr, d.error))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// `nk status`: prints the merged view of the metadata partitions that
/// answer, and a line for each that does not; fails (a nonzero exit
/// status, after the output) when any partition is unreachable.
pub async fn status(
    client: &Client,
    json: bool,
    wait: Option<std::time::Duration>,
) -> anyhow::Result<()> {
    let st = match wait {
        Some(t) => wait_ready(client, t).await?,
        None => client.status().await?,
    };
    let metas = &client.config().metas;
    let out = status_view(&st, metas);
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", status_text(&out));
    }
    if !st.unreachable.is_empty() {
        return Err(unavailable(unreachable_summary(
            &st.unreachable,
            metas.len(),
        )));
    }
    Ok(())
}

/// The JSON view of a status the client merged from the partitions
/// `metas` (what `nk status --json` prints; `nk top` shows it too).
pub fn status_view(st: &nodekernel_client::ClusterStatus, metas: &[String]) -> StatusOut {
    StatusOut::new(
        st,
        metas
            .iter()
            .enumerate()
            .map(|(i, addr)| (i as u32, addr.clone())),
    )
}

/// The human form of `nk status`.
fn status_text(out: &StatusOut) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    // Writing to a String cannot fail.
    macro_rules! say {
        ($($arg:tt)*) => {{ let _ = writeln!(t, $($arg)*); }};
    }
    say!(
        "block size {}, {} nodes, {} puts in progress ({} reserved ahead), {} removed nodes \
         being reclaimed",
        human(out.block_size as u64),
        out.nodes,
        out.puts_in_progress,
        out.reserved_puts,
        out.reclaiming
    );
    if out.unreachable.is_empty() {
        say!(
            "{}",
            readiness_line(out.ready, out.alive_servers, out.expected_servers)
        );
    } else {
        say!(
            "NOT READY: {} of {} metadata partitions unreachable ({} storage servers alive in the others, {} expected)",
            out.unreachable.len(),
            out.partitions.len(),
            out.alive_servers,
            out.expected_servers
        );
    }
    // Every partition when there are several, and always one that did
    // not answer.
    if out.partitions.len() > 1 || !out.unreachable.is_empty() {
        say!(
            "metadata partitions: {} ({} unreachable)",
            out.partitions.len(),
            out.unreachable.len()
        );
        for p in &out.partitions {
            match &p.error {
                None => say!("  partition {} at {}: reachable", p.partition, p.addr),
                Some(e) => say!(
                    "  partition {} at {}: UNREACHABLE: {e}",
                    p.partition,
                    p.addr
                ),
            }
        }
    }
    if out.logs.is_empty() {
        say!("metadata: volatile (lost when the metadata server stops)");
    }
    for l in &out.logs {
        say!(
            "metadata partition {}: persistent, fsync {}; {} log records, {} since the checkpoint at record {}",
            l.partition,
            l.fsync,
            l.records,
            human(l.log_bytes),
            l.checkpoint
        );
    }
    say!(
        "{:<6} {:<10} {:>8} {:>12} {:>12} {:>12}",
        "class",
        "name",
        "servers",
        "capacity",
        "used",
        "free"
    );
    for c in &out.classes {
        say!(
            "{:<6} {:<10} {:>8} {:>12} {:>12} {:>12}",
            c.class,
            c.name,
            c.servers,
            human(c.capacity_bytes),
            human(c.used_bytes),
            human(c.free_bytes)
        );
    }
    say!();
    say!(
        "{:<4} {:<22} {:<6} {:<6} {:<12} {:>12} {:>12} {:<6}",
        "id",
        "address",
        "class",
        "medium",
        "location",
        "capacity",
        "used",
        "state"
    );
    for s in &out.servers {
        say!(
            "{:<4} {:<22} {:<6} {:<6} {:<12} {:>12} {:>12} {:<6}",
            s.id,
            s.addr,
            s.class,
            s.medium,
            s.location,
            human(s.capacity_bytes),
            human(s.used_bytes),
            match (s.alive, s.draining) {
                (true, false) => "alive",
                (true, true) => "alive, draining",
                (false, false) => "DEAD",
                (false, true) => "DEAD, draining",
            }
        );
    }
    t
}

#[cfg(test)]
mod status_tests {
    use super::*;

    fn server(id: u32, alive: bool, draining: bool) -> ServerOut {
        ServerOut {
            id,
            addr: format!("10.0.0.{id}:7001"),
            identity: format!("id{id}"),
            class: 0,
            class_name: "dram".into(),
            medium: "dram".into(),
            location: format!("host{id}"),
            alive,
            draining,
            last_seen_ms: 1,
            capacity_bytes: 4 << 20,
            used_bytes: 1 << 20,
            free_bytes: 3 << 20,
            blocks: 4,
            used_blocks: 1,
            ..ServerOut::default()
        }
    }

    fn out(down: bool) -> StatusOut {
        let partitions = vec![
            PartitionOut {
                partition: 0,
                addr: "10.0.0.1:7000".into(),
                reachable: true,
                error: None,
            },
            PartitionOut {
                partition: 1,
                addr: "10.0.0.2:7000".into(),
                reachable: !down,
                error: down.then(|| "Unavailable: connection refused".to_string()),
            },
        ];
        StatusOut {
            block_size: 1 << 20,
            nodes: 3,
            ready: !down,
            expected_servers: 1,
            alive_servers: 2,
            puts_in_progress: 0,
            reserved_puts: 0,
            reclaiming: 0,
            classes: Vec::new(),
            servers: vec![
                server(1, true, false),
                server(2, true, true),
                server(3, false, true),
            ],
            logs: Vec::new(),
            unreachable: partitions
                .iter()
                .filter(|p| !p.reachable)
                .cloned()
                .collect(),
            partitions,
        }
    }

    #[test]
    fn every_partition_is_shown_and_an_unreachable_one_is_named() {
        let t = status_text(&out(true));
        assert!(
            t.contains("NOT READY: 1 of 2 metadata partitions unreachable"),
            "{t}"
        );
        assert!(t.contains("partition 0 at 10.0.0.1:7000: reachable"), "{t}");
        assert!(
            t.contains(
                "partition 1 at 10.0.0.2:7000: UNREACHABLE: Unavailable: connection refused"
            ),
            "{t}"
        );
        let t = status_text(&out(false));
        assert!(t.contains("metadata partitions: 2 (0 unreachable)"), "{t}");
        assert!(t.contains("partition 1 at 10.0.0.2:7000: reachable"), "{t}");
        assert!(!t.contains("UNREACHABLE"), "{t}");
        let j = serde_json::to_value(out(true)).unwrap();
        assert_eq!(j["unreachable"][0]["partition"], 1);
        assert_eq!(j["unreachable"][0]["addr"], "10.0.0.2:7000");
        assert_eq!(j["partitions"][1]["reachable"], false);
        assert!(j["partitions"][0].get("error").is_none());
    }

    #[test]
    fn draining_servers_say_so() {
        let t = status_text(&out(false));
        let line = |id: &str| {
            t.lines()
                .find(|l| l.starts_with(id))
                .unwrap_or_else(|| panic!("no line for server {id}: {t}"))
                .to_string()
        };
        assert!(line("1 ").trim_end().ends_with("alive"), "{t}");
        assert!(line("2 ").contains("alive, draining"), "{t}");
        assert!(line("3 ").contains("DEAD, draining"), "{t}");
        let j = serde_json::to_value(out(false)).unwrap();
        assert_eq!(j["servers"][0]["draining"], false);
        assert_eq!(j["servers"][1]["draining"], true);
    }
}

#[cfg(test)]
mod readiness_tests {
    #[test]
    fn more_servers_than_expected_read_as_such() {
        assert_eq!(
            super::readiness_line(true, 2, 1),
            "ready: 2 storage servers alive (1 expected)"
        );
        assert_eq!(
            super::readiness_line(false, 0, 1),
            "NOT READY: 0 of 1 expected storage servers alive"
        );
    }
}
