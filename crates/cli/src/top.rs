//! `nk top`: the cluster's live numbers in the terminal — capacity and use
//! per storage class and server, and read/write throughput and operation
//! rates from the servers' counters (reported with their heartbeats, so
//! rates move in steps of a heartbeat) — redrawn every `--interval`
//! seconds until Ctrl-C. `--once` prints one frame (rates over one
//! interval) and exits; with `--json` as JSON.

use crate::status::status_view;
use nodekernel_admin::status::{ServerOut, StatusOut};
use nodekernel_client::Client;
use nodekernel_cluster::human;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Rates over one refresh interval.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Rates {
    pub read_bytes_per_s: f64,
    pub write_bytes_per_s: f64,
    pub read_ops_per_s: f64,
    pub write_ops_per_s: f64,
}

#[derive(Serialize)]
struct ClassRow {
    class: u8,
    name: String,
    servers: usize,
    capacity_bytes: u64,
    used_bytes: u64,
    /// Blocks tier migration moved out of the class (down, up), in all.
    blocks_demoted: u64,
    blocks_promoted: u64,
    #[serde(flatten)]
    rates: Rates,
}

#[derive(Serialize)]
struct ServerRow {
    id: u32,
    addr: String,
    class: u8,
    class_name: String,
    alive: bool,
    draining: bool,
    capacity_bytes: u64,
    used_bytes: u64,
    bytes_read: u64,
    bytes_written: u64,
    read_ops: u64,
    write_ops: u64,
    #[serde(flatten)]
    rates: Rates,
}

/// One frame of `nk top`.
#[derive(Serialize)]
struct Frame {
    /// Seconds the rates were measured over.
    interval_s: f64,
    nodes: u64,
    ready: bool,
    alive_servers: usize,
    capacity_bytes: u64,
    used_bytes: u64,
    #[serde(flatten)]
    rates: Rates,
    classes: Vec<ClassRow>,
    servers: Vec<ServerRow>,
    unreachable_partitions: usize,
}

/// A server's counters, by (address, id): the same server seen by
/// several partitions has one id in each.
type Counters = BTreeMap<(String, u32), [u64; 4]>;

fn counters(v: &StatusOut) -> Counters {
    v.servers
        .iter()
        .map(|s| {
            (
                (s.addr.clone(), s.id),
                [s.bytes_read, s.bytes_written, s.read_ops, s.write_ops],
            )
        })
        .collect()
}

/// The rates of `s` since `before` (`secs` ago); zero for a server not
/// seen then, or whose counters went back (it restarted).
fn rates(s: &ServerOut, before: &Counters, secs: f64) -> Rates {
    let Some(b) = before.get(&(s.addr.clone(), s.id)) else {
        return Rates::default();
    };
    let now = [s.bytes_read, s.bytes_written, s.read_ops, s.write_ops];
    let d = |i: usize| now[i].saturating_sub(b[i]) as f64 / secs.max(1e-3);
    Rates {
        read_bytes_per_s: d(0),
        write_bytes_per_s: d(1),
        read_ops_per_s: d(2),
        write_ops_per_s: d(3),
    }
}

fn add(a: &mut Rates, b: Rates) {
    a.read_bytes_per_s += b.read_bytes_per_s;
    a.write_bytes_per_s += b.write_bytes_per_s;
    a.read_ops_per_s += b.read_ops_per_s;
    a.write_ops_per_s += b.write_ops_per_s;
}

fn frame(v: &StatusOut, before: &Counters, secs: f64) -> Frame {
    let servers: Vec<ServerRow> = v
        .servers
        .iter()
        .map(|s| ServerRow {
            id: s.id,
            addr: s.addr.clone(),
            class: s.class,
            class_name: s.class_name.clone(),
            alive: s.alive,
            draining: s.draining,
            capacity_bytes: s.capacity_bytes,
            used_bytes: s.used_bytes,
            bytes_read: s.bytes_read,
            bytes_written: s.bytes_written,
            read_ops: s.read_ops,
            write_ops: s.write_ops,
            rates: rates(s, before, secs),
        })
        .collect();
    let classes: Vec<ClassRow> = v
        .classes
        .iter()
        .map(|c| {
            let mut r = Rates::default();
            for s in servers.iter().filter(|s| s.class == c.class) {
                add(&mut r, s.rates);
            }
            ClassRow {
                class: c.class,
                name: c.name.clone(),
                servers: c.servers,
                capacity_bytes: c.capacity_bytes,
                used_bytes: c.used_bytes,
                blocks_demoted: c.blocks_demoted,
                blocks_promoted: c.blocks_promoted,
                rates: r,
            }
        })
        .collect();
    let mut total = Rates::default();
    for s in &servers {
        add(&mut total, s.rates);
    }
    Frame {
        interval_s: secs,
        nodes: v.nodes,
        ready: v.ready,
        alive_servers: v.alive_servers,
        capacity_bytes: classes.iter().map(|c| c.capacity_bytes).sum(),
        used_bytes: classes.iter().map(|c| c.used_bytes).sum(),
        rates: total,
        classes,
        servers,
        unreachable_partitions: v.unreachable.len(),
    }
}

/// `[████······]  42%` of `used` in `capacity`, `width` cells wide.
fn bar(used: u64, capacity: u64, width: usize) -> String {
    let frac = if capacity == 0 {
        0.0
    } else {
        (used as f64 / capacity as f64).clamp(0.0, 1.0)
    };
    let full = (frac * width as f64).round() as usize;
    format!(
        "[{}{}] {:>3.0}%",
        "█".repeat(full),
        "·".repeat(width - full),
        frac * 100.0
    )
}

fn per_s(bytes: f64) -> String {
    format!("{}/s", human(bytes as u64))
}

fn text(f: &Frame) -> String {
    let mut t = String::new();
    macro_rules! say {
        ($($arg:tt)*) => {{ let _ = writeln!(t, $($arg)*); }};
    }
    say!(
        "NodeKernel  {} nodes, {} servers alive{}{}   (every {:.1} s, Ctrl-C quits)",
        f.nodes,
        f.alive_servers,
        if f.ready { "" } else { ", NOT READY" },
        if f.unreachable_partitions > 0 {
            format!(", {} partitions UNREACHABLE", f.unreachable_partitions)
        } else {
            String::new()
        },
        f.interval_s
    );
    say!(
        "total  used {} of {}   read {} ({:.0} ops/s)   write {} ({:.0} ops/s)",
        human(f.used_bytes),
        human(f.capacity_bytes),
        per_s(f.rates.read_bytes_per_s),
        f.rates.read_ops_per_s,
        per_s(f.rates.write_bytes_per_s),
        f.rates.write_ops_per_s
    );
    say!();
    say!(
        "{:<12} {:<36} {:>10} {:>10} {:>12} {:>12} {:>9} {:>15}",
        "CLASS",
        "USED",
        "used",
        "capacity",
        "read",
        "write",
        "ops/s",
        "moved down/up"
    );
    for c in &f.classes {
        say!(
            "{:<12} {:<36} {:>10} {:>10} {:>12} {:>12} {:>9.0} {:>15}",
            format!("{} {}", c.class, c.name),
            bar(c.used_bytes, c.capacity_bytes, 28),
            human(c.used_bytes),
            human(c.capacity_bytes),
            per_s(c.rates.read_bytes_per_s),
            per_s(c.rates.write_bytes_per_s),
            c.rates.read_ops_per_s + c.rates.write_ops_per_s,
            format!("{}/{}", c.blocks_demoted, c.blocks_promoted)
        );
    }
    say!();
    say!(
        "{:<4} {:<22} {:<8} {:<26} {:>12} {:>12} {:>9} {:<6}",
        "ID",
        "SERVER",
        "CLASS",
        "USED",
        "read",
        "write",
        "ops/s",
        "STATE"
    );
    for s in &f.servers {
        say!(
            "{:<4} {:<22} {:<8} {:<26} {:>12} {:>12} {:>9.0} {:<6}",
            s.id,
            s.addr,
            s.class_name,
            bar(s.used_bytes, s.capacity_bytes, 18),
            per_s(s.rates.read_bytes_per_s),
            per_s(s.rates.write_bytes_per_s),
            s.rates.read_ops_per_s + s.rates.write_ops_per_s,
            match (s.alive, s.draining) {
                (true, false) => "alive",
                (true, true) => "draining",
                (false, _) => "DEAD",
            }
        );
    }
    t
}

/// `nk top`.
pub async fn top(client: &Client, interval: f64, once: bool, json: bool) -> anyhow::Result<()> {
    if !(interval.is_finite() && interval > 0.0) {
        return Err(crate::common::invalid(format!(
            "--interval {interval}: expected a number of seconds above 0"
        )));
    }
    let interval = Duration::from_secs_f64(interval);
    let metas = client.config().metas.clone();
    let sample = || async {
        let st = client.status().await?;
        anyhow::Ok((Instant::now(), status_view(&st, &metas)))
    };
    let (mut at, first) = sample().await?;
    let mut before = counters(&first);
    if once {
        tokio::time::sleep(interval).await;
        let (now, v) = sample().await?;
        let f = frame(&v, &before, now.duration_since(at).as_secs_f64());
        if json {
            println!("{}", serde_json::to_string_pretty(&f)?);
        } else {
            print!("{}", text(&f));
        }
        return Ok(());
    }
    // Hide the cursor while drawing; show it again on the way out.
    print!("\x1b[?25l");
    let shown = loop {
        tokio::select! {
            r = tokio::signal::ctrl_c() => break r.map_err(anyhow::Error::from),
            () = tokio::time::sleep(interval) => {}
        }
        let (now, v) = match sample().await {
            Ok(s) => s,
            Err(e) => break Err(e),
        };
        let f = frame(&v, &before, now.duration_since(at).as_secs_f64());
        if json {
            println!("{}", serde_json::to_string(&f)?);
        } else {
            // Home, draw, clear what the last frame left below.
            print!("\x1b[H\x1b[2J{}", text(&f));
        }
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        before = counters(&v);
        at = now;
    };
    print!("\x1b[?25h");
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_come_from_counter_deltas_and_a_restart_reads_as_zero() {
        let s = ServerOut {
            id: 1,
            addr: "a:1".into(),
            bytes_read: 3000,
            bytes_written: 100,
            read_ops: 30,
            write_ops: 1,
            ..ServerOut::default()
        };
        let mut before = Counters::new();
        before.insert(("a:1".into(), 1), [1000, 200, 10, 0]);
        let r = rates(&s, &before, 2.0);
        assert_eq!(r.read_bytes_per_s, 1000.0);
        assert_eq!(r.write_bytes_per_s, 0.0, "counters went back: a restart");
        assert_eq!(r.read_ops_per_s, 10.0);
        assert_eq!(r.write_ops_per_s, 0.5);
        assert_eq!(rates(&s, &Counters::new(), 2.0), Rates::default());
    }

    #[test]
    fn bars_are_clamped() {
        assert_eq!(bar(0, 0, 4), "[····]   0%");
        assert_eq!(bar(2, 4, 4), "[██··]  50%");
        assert_eq!(bar(9, 4, 4), "[████] 100%");
    }
}
