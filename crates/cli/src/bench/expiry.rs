//! `nk bench expire`: what removing a large expired subtree costs the
//! metadata server's other clients. A subtree of COUNT empty Files (in
//! Directories of [`FILES_PER_DIR`]) is made, `--clients` clients look up
//! another node without pause, for [`BEFORE`] and then while the subtree
//! expires (from the `expire` call until its nodes are unlinked and
//! reaped): the two phases' latencies side by side.
//!
//! Costs: the run's own nodes (COUNT + COUNT / 1000 + 4) on the server; on
//! the client, one histogram per lookup client and phase.

use super::{make_root, new_histogram, BenchArgs, Latency};
use anyhow::Context;
use hdrhistogram::Histogram;
use nodekernel_client::{Client, ClientConfig, CreateOptions, ErrorCode, NodeType, Ttl};
use serde::Serialize;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Files per Directory of the expiring subtree.
const FILES_PER_DIR: u64 = 1000;
/// Tasks creating the subtree, over [`CREATE_CONNECTIONS`] clients.
const CREATORS: u64 = 16;
const CREATE_CONNECTIONS: u64 = 4;
/// How long the lookups run before the expiry (the baseline).
const BEFORE: Duration = Duration::from_secs(5);
/// How often the run asks whether the subtree is gone.
const POLL: Duration = Duration::from_millis(20);
/// The longest the run waits for the subtree to go (only catches a hang).
const GIVE_UP: Duration = Duration::from_secs(3600);

/// One phase's lookups.
#[derive(Serialize)]
pub struct PhaseReport {
    pub ops: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub latency_us: Latency,
}

impl PhaseReport {
    fn of(h: &Histogram<u64>, seconds: f64) -> PhaseReport {
        PhaseReport {
            ops: h.len(),
            seconds,
            ops_per_sec: h.len() as f64 / seconds.max(f64::MIN_POSITIVE),
            latency_us: Latency::of(h),
        }
    }
}

/// The `--json` schema of `nk bench expire` (docs/bench.md).
#[derive(Serialize)]
pub struct ExpiryReport {
    pub mode: &'static str,
    /// Files in the expiring subtree (Directories not counted).
    pub nodes: u64,
    pub directories: u64,
    pub clients: u64,
    /// Making the subtree.
    pub create_seconds: f64,
    pub creates_per_sec: f64,
    /// From the `expire` call until the subtree was no longer found, and
    /// until its nodes were reaped (freed, no longer counted).
    pub gone_after_seconds: f64,
    pub reaped_after_seconds: f64,
    pub before: PhaseReport,
    pub during: PhaseReport,
    /// `during` over `before`.
    pub p50_ratio: f64,
    pub p99_ratio: f64,
    pub throughput_ratio: f64,
}

/// The lookup clients' phase: before the expiry, during it, stopped.
const BEFORE_PHASE: u8 = 0;
const DURING_PHASE: u8 = 1;
const STOPPED: u8 = 2;

pub async fn run(cfg: ClientConfig, a: &BenchArgs) -> anyhow::Result<ExpiryReport> {
    let setup = Client::connect(cfg.clone()).await?;
    let root = format!("/nk-bench-{}", std::process::id());
    make_root(&setup, &root, a).await?;
    let result = measure(&setup, cfg, a, &root).await;
    // The subtree has gone by itself; the rest goes now.
    let cleanup = setup.delete(&root, true).await;
    let report = result?;
    cleanup?;
    Ok(report)
}

async fn measure(
    setup: &Client,
    cfg: ClientConfig,
    a: &BenchArgs,
    root: &str,
) -> anyhow::Result<ExpiryReport> {
    let target = format!("{root}/other");
    setup.mkdir(&target, false).await?;
    let looked_up = format!("{target}/f");
    setup
        .create(&looked_up, NodeType::File, CreateOptions::default())
        .await?
        .close()
        .await?;
    let big = format!("{root}/big");
    setup.mkdir(&big, false).await?;
    let started = Instant::now();
    let directories = make_subtree(setup, &cfg, &big, a.count).await?;
    let create_seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "made {} Files in {directories} Directories in {create_seconds:.1} s",
        a.count
    );

    let phase = Arc::new(AtomicU8::new(BEFORE_PHASE));
    let mut lookers = Vec::new();
    for _ in 0..a.clients {
        let client = Client::connect(cfg.clone()).await?;
        let (phase, path) = (phase.clone(), looked_up.clone());
        lookers.push(tokio::spawn(look_up(client, path, phase, a.warmup)));
    }
    tokio::time::sleep(BEFORE).await;
    phase.store(DURING_PHASE, Ordering::Release);
    let before_s = BEFORE.as_secs_f64();
    let t0 = Instant::now();
    let nodes_before = setup.status().await?.nodes;
    setup
        .expire(&big, Ttl::After(Duration::from_millis(1)))
        .await?;
    let subtree = a.count + directories + 1;
    let mut gone = None;
    loop {
        if gone.is_none() {
            match setup.lookup(&big).await {
                Err(e) if e.code == ErrorCode::NotFound => gone = Some(t0.elapsed()),
                Err(e) => return Err(e.into()),
                Ok(_) => {}
            }
        }
        let st = setup.status().await?;
        if gone.is_some() && st.nodes + subtree <= nodes_before && st.reclaiming == 0 {
            break;
        }
        if t0.elapsed() > GIVE_UP {
            anyhow::bail!(
                "{big} had not gone {} s after it expired ({} nodes, {} reclaiming)",
                GIVE_UP.as_secs(),
                st.nodes,
                st.reclaiming
            );
        }
        tokio::time::sleep(POLL).await;
    }
    let reaped = t0.elapsed();
    phase.store(STOPPED, Ordering::Release);
    let (mut before, mut during) = (new_histogram(), new_histogram());
    for l in lookers {
        let [b, d] = l.await.context("a lookup client failed")??;
        before.add(&b)?;
        during.add(&d)?;
    }
    let before = PhaseReport::of(&before, before_s);
    let during = PhaseReport::of(&during, reaped.as_secs_f64());
    Ok(ExpiryReport {
        mode: "expire",
        nodes: a.count,
        directories,
        clients: a.clients,
        create_seconds,
        creates_per_sec: (a.count + directories) as f64 / create_seconds,
        gone_after_seconds: gone.unwrap_or(reaped).as_secs_f64(),
        reaped_after_seconds: reaped.as_secs_f64(),
        p50_ratio: during.latency_us.p50 / before.latency_us.p50,
        p99_ratio: during.latency_us.p99 / before.latency_us.p99,
        throughput_ratio: during.ops_per_sec / before.ops_per_sec,
        before,
        during,
    })
}

/// Makes `files` empty Files under `big`, [`FILES_PER_DIR`] per
/// Directory, with [`CREATORS`] tasks; returns the Directories made.
async fn make_subtree(
    setup: &Client,
    cfg: &ClientConfig,
    big: &str,
    files: u64,
) -> anyhow::Result<u64> {
    let dirs = files.div_ceil(FILES_PER_DIR);
    for d in 0..dirs {
        setup.mkdir(&format!("{big}/d{d}"), false).await?;
    }
    let mut clients = Vec::new();
    for _ in 0..CREATE_CONNECTIONS {
        clients.push(Client::connect(cfg.clone()).await?);
    }
    let mut tasks = Vec::new();
    for t in 0..CREATORS {
        let c = clients[(t % CREATE_CONNECTIONS) as usize].clone();
        let big = big.to_string();
        tasks.push(tokio::spawn(async move {
            let mut i = t;
            while i < files {
                let p = format!("{big}/d{}/f{}", i / FILES_PER_DIR, i % FILES_PER_DIR);
                c.create(&p, NodeType::File, CreateOptions::default())
                    .await?
                    .close()
                    .await?;
                i += CREATORS;
            }
            Ok::<_, nodekernel_client::Error>(())
        }));
    }
    for t in tasks {
        t.await.context("a creating task failed")??;
    }
    Ok(dirs)
}

/// One lookup client: looks `path` up without pause, into the histogram
/// of the phase each lookup ends in, until the run stops it. The first
/// `warmup` lookups are not recorded.
async fn look_up(
    client: Client,
    path: String,
    phase: Arc<AtomicU8>,
    warmup: u64,
) -> nodekernel_client::Result<[Histogram<u64>; 2]> {
    let mut h = [new_histogram(), new_histogram()];
    let mut n = 0u64;
    loop {
        let t = Instant::now();
        client.lookup(&path).await?;
        let took = t.elapsed().as_nanos().max(1) as u64;
        let p = phase.load(Ordering::Acquire);
        if p == STOPPED {
            return Ok(h);
        }
        n += 1;
        if n > warmup {
            let _ = h[p as usize].record(took);
        }
    }
}

pub fn print_human(r: &ExpiryReport) {
    println!(
        "Expire: a subtree of {} Files in {} Directories (made in {:.1} s, {:.0} creates/s), {} lookup client(s)",
        r.nodes, r.directories, r.create_seconds, r.creates_per_sec, r.clients
    );
    println!(
        "  gone {:.3} s and reaped {:.3} s after the expire call",
        r.gone_after_seconds, r.reaped_after_seconds
    );
    for (name, p) in [("before", &r.before), ("during", &r.during)] {
        let l = &p.latency_us;
        println!(
            "  {name}: {:.0} lookups/s over {:.2} s, latency us: p50 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
            p.ops_per_sec, p.seconds, l.p50, l.p99, l.p999, l.max
        );
    }
    println!(
        "  during/before: p50 {:.2}x, p99 {:.2}x, throughput {:.2}x",
        r.p50_ratio, r.p99_ratio, r.throughput_ratio
    );
}
