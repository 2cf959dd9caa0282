//! `nk drain SERVER`: empties a storage server so it can be stopped.

use nodekernel_client::{drain_finished, Client, DrainState, DrainStatus};
use nodekernel_cluster::human;
use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// How often a waiting `nk drain` asks for progress (each ask also starts
/// the drain again on a metadata server that restarted meanwhile).
const POLL: Duration = Duration::from_millis(500);

/// The whole drain over every partition.
#[derive(serde::Serialize)]
struct Summary<'a> {
    server: &'a str,
    state: &'static str,
    used_blocks: u64,
    moved_blocks: u64,
    failed_moves: u64,
    unmovable_blocks: u64,
    seconds: f64,
    partitions: Vec<Part>,
}

#[derive(serde::Serialize)]
struct Part {
    partition: u32,
    addr: String,
    identity: String,
    state: &'static str,
    used_blocks: u64,
    moved_blocks: u64,
    failed_moves: u64,
    unmovable_blocks: u64,
    message: String,
}

fn summary<'a>(server: &'a str, parts: &[DrainStatus], took: Duration) -> Summary<'a> {
    let state = if parts.iter().any(|p| p.state == DrainState::Cancelled) {
        "cancelled"
    } else if drain_finished(parts) {
        "done"
    } else {
        "draining"
    };
    Summary {
        server,
        state,
        used_blocks: parts.iter().map(|p| p.used_blocks).sum(),
        moved_blocks: parts.iter().map(|p| p.moved_blocks).sum(),
        failed_moves: parts.iter().map(|p| p.failed_moves).sum(),
        unmovable_blocks: parts.iter().map(|p| p.unmovable).sum(),
        seconds: took.as_secs_f64(),
        partitions: parts
            .iter()
            .map(|p| Part {
                partition: p.partition,
                addr: p.addr.clone(),
                identity: p.identity.clone(),
                state: p.state.name(),
                used_blocks: p.used_blocks,
                moved_blocks: p.moved_blocks,
                failed_moves: p.failed_moves,
                unmovable_blocks: p.unmovable,
                message: p.message.clone(),
            })
            .collect(),
    }
}

fn line(s: &Summary, block_size: u64) -> String {
    let mut text = format!(
        "{}: {}, {} block(s) left ({}), {} moved, {} failed move(s) retried",
        s.server,
        s.state,
        s.used_blocks,
        human(s.used_blocks * block_size),
        s.moved_blocks,
        s.failed_moves,
    );
    for p in &s.partitions {
        if !p.message.is_empty() {
            text.push_str(&format!("\n  partition {}: {}", p.partition, p.message));
        }
    }
    text
}

pub async fn drain(
    client: &Client,
    server: &str,
    cancel: bool,
    wait: bool,
    json: bool,
    stuck_after: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let block_size = client.status().await?.block_size as u64;
    let mut parts = client.drain(server, cancel).await?;
    let waiting = wait && !cancel;
    let tty = std::io::stderr().is_terminal();
    // The last progress: blocks left then, failed moves then, and when.
    let (mut left, mut failed, mut since) = (u64::MAX, 0u64, Instant::now());
    let mut last_print = Instant::now();
    while waiting && !drain_finished(&parts) {
        let s = summary(server, &parts, started.elapsed());
        if tty || last_print.elapsed() >= Duration::from_secs(5) {
            eprint!("{}{}", line(&s, block_size), if tty { "\r" } else { "\n" });
            last_print = Instant::now();
        }
        // Nothing moved for a while, and moves fail (e.g. no room left) or
        // only blocks that cannot move are left.
        if s.used_blocks < left {
            (left, failed, since) = (s.used_blocks, s.failed_moves, Instant::now());
        } else if since.elapsed() >= stuck_after
            && (s.failed_moves > failed || s.used_blocks <= s.unmovable_blocks)
        {
            return Err(crate::common::coded(
                crate::common::Code::Wire(nodekernel_client::ErrorCode::Timeout),
                format!(
                "the drain of {server} makes no progress (it goes on in the background; `nk drain {server} --cancel` stops it): {}",
                line(&s, block_size).replace('\n', ";")
            ),
            ));
        }
        tokio::time::sleep(POLL).await;
        parts = client.drain(server, false).await?;
    }
    if tty && waiting {
        eprintln!();
    }
    let s = summary(server, &parts, started.elapsed());
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!("{}", line(&s, block_size));
        if s.state == "done" {
            println!("{server} holds no blocks: it can be stopped");
        }
    }
    if waiting && s.state == "cancelled" {
        return Err(crate::common::coded(
            crate::common::Code::Wire(nodekernel_client::ErrorCode::Busy),
            format!("the drain of {server} was cancelled"),
        ));
    }
    Ok(())
}
