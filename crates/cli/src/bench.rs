//! `nk bench`: the iobench modes of the seeds against a running cluster (or
//! an embedded one), with latency percentiles and throughput.

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use nodekernel_client::{Client, ClientConfig, CreateOptions, NodeType};
use nodekernel_cluster::{human, ByteSize, Config, LocalCluster};
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Create empty Files (create + close)
    Create,
    /// KeyValue put (create + append + close)
    Putkey,
    /// KeyValue get (lookup + read)
    Getkey,
    /// Metadata lookup only
    Lookup,
    /// Enumerate a Directory of COUNT Files
    Enumerate,
    /// Write and read back SIZE with DRAM holding 100/50/10/0% of it
    /// (embedded clusters; the rest on the file tier)
    Tiering,
}

#[derive(Args)]
pub struct BenchArgs {
    mode: Mode,
    /// Operations per client (measured)
    #[arg(short = 'k', long, default_value_t = 10_000)]
    count: u64,
    /// Value size for putkey/getkey
    #[arg(short = 's', long, value_parser = crate::parse_size, default_value = "4")]
    size: ByteSize,
    /// Warm-up operations per client (not measured)
    #[arg(short = 'w', long, default_value_t = 1_000)]
    warmup: u64,
    /// Concurrent clients (each with its own connections)
    #[arg(short = 'c', long, default_value_t = 1)]
    clients: u64,
    /// Put keys into a non-enumerable table (no child records written)
    #[arg(long)]
    non_enumerable: bool,
    /// Start an in-process cluster instead of connecting
    #[arg(long)]
    embedded: bool,
    /// DRAM of the embedded cluster
    #[arg(long, value_parser = crate::parse_size, default_value = "1GiB")]
    dram: ByteSize,
    /// Block size of the embedded cluster (every KeyValue takes at least one block)
    #[arg(long, value_parser = crate::parse_size, default_value = "1MiB")]
    block_size: ByteSize,
    /// Directory for file-tier block files (tiering)
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
pub struct Report {
    pub mode: Mode,
    pub clients: u64,
    pub ops: u64,
    pub size: u64,
    pub non_enumerable: bool,
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub mb_per_sec: f64,
    pub latency_us: Percentiles,
}

#[derive(Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

fn percentiles(mut ns: Vec<u64>) -> Percentiles {
    ns.sort_unstable();
    let at = |q: f64| {
        if ns.is_empty() {
            return 0.0;
        }
        let i = ((ns.len() as f64 * q).ceil() as usize).clamp(1, ns.len()) - 1;
        ns[i] as f64 / 1000.0
    };
    Percentiles {
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        p999: at(0.999),
        max: at(1.0),
    }
}

pub async fn run(cfg: ClientConfig, a: &BenchArgs) -> anyhow::Result<()> {
    if a.count == 0 || a.clients == 0 {
        bail!("-k and -c must be at least 1");
    }
    if a.mode == Mode::Tiering {
        return tiering(a).await;
    }
    let _embedded;
    let cfg = if a.embedded {
        let mut c = Config::default();
        c.meta.listen = "127.0.0.1:0".into();
        c.meta.block_size = a.block_size;
        c.up.dram = a.dram;
        c.up.file = ByteSize(0);
        let cluster = LocalCluster::start(c)
            .await
            .context("starting the embedded cluster")?;
        let cc = cluster.client_config();
        _embedded = cluster;
        cc
    } else {
        cfg
    };
    let report = bench(cfg, a).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let l = &report.latency_us;
        println!(
            "{:?}: {} clients x {} ops, size {}{}",
            report.mode,
            report.clients,
            a.count,
            human(report.size),
            if report.non_enumerable {
                ", non-enumerable table"
            } else {
                ""
            }
        );
        println!(
            "  {:.0} ops/s, {:.1} MB/s, {:.3} s",
            report.ops_per_sec, report.mb_per_sec, report.seconds
        );
        println!(
            "  latency us: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
            l.p50, l.p90, l.p99, l.p999, l.max
        );
    }
    Ok(())
}

/// Runs one benchmark and returns its report.
pub async fn bench(cfg: ClientConfig, a: &BenchArgs) -> anyhow::Result<Report> {
    let setup = Client::connect(cfg.clone()).await?;
    let root = format!("/nk-bench-{}", std::process::id());
    setup.mkdir(&root, false).await?;
    let value = vec![0x5Au8; a.size.0 as usize];
    let per_client = a.warmup + a.count;
    // Gets cycle over a small key set; every put creates a new key (so each
    // one takes a block and, in an enumerable table, writes a record).
    const KEYS: u64 = 100;
    let table_opts = CreateOptions {
        enumerable: !a.non_enumerable,
        ..CreateOptions::default()
    };
    for c in 0..a.clients {
        let dir = format!("{root}/c{c}");
        match a.mode {
            Mode::Putkey | Mode::Getkey => {
                setup
                    .create(&dir, NodeType::Table, table_opts.clone())
                    .await?;
                if a.mode == Mode::Getkey {
                    for i in 0..per_client.min(KEYS) {
                        setup.put(&format!("{dir}/k{i}"), &value).await?;
                    }
                }
            }
            Mode::Tiering => bail!("tiering runs its own clusters"),
            Mode::Lookup | Mode::Create | Mode::Enumerate => {
                setup.mkdir(&dir, false).await?;
                if a.mode == Mode::Lookup {
                    setup
                        .create(
                            &format!("{dir}/f"),
                            NodeType::File,
                            CreateOptions::default(),
                        )
                        .await?
                        .close()
                        .await?;
                }
                if a.mode == Mode::Enumerate {
                    for i in 0..a.count {
                        setup
                            .create(
                                &format!("{dir}/f{i}"),
                                NodeType::File,
                                CreateOptions::default(),
                            )
                            .await?
                            .close()
                            .await?;
                    }
                }
            }
        }
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(a.clients as usize));
    let mut tasks = Vec::new();
    for c in 0..a.clients {
        let client = Client::connect(cfg.clone()).await?;
        let dir = format!("{root}/c{c}");
        let value = value.clone();
        let (mode, warmup, count) = (a.mode, a.warmup, a.count);
        let barrier = barrier.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(count as usize);
            let mut started = Instant::now();
            let iterations = if mode == Mode::Enumerate {
                warmup.min(3) + count.min(20)
            } else {
                warmup + count
            };
            let measured_from = if mode == Mode::Enumerate {
                warmup.min(3)
            } else {
                warmup
            };
            for i in 0..iterations {
                if i == measured_from {
                    barrier.wait().await;
                    started = Instant::now();
                }
                let t = Instant::now();
                match mode {
                    Mode::Tiering => unreachable!("rejected during setup"),
                    Mode::Create => {
                        client
                            .create(
                                &format!("{dir}/f{i}"),
                                NodeType::File,
                                CreateOptions::default(),
                            )
                            .await?
                            .close()
                            .await?;
                    }
                    Mode::Putkey => client.put(&format!("{dir}/k{i}"), &value).await?,
                    Mode::Getkey => {
                        let v = client
                            .get(&format!("{dir}/k{}", i % per_client.min(KEYS)))
                            .await?;
                        debug_assert_eq!(v.len(), value.len());
                    }
                    Mode::Lookup => {
                        client.lookup(&format!("{dir}/f")).await?;
                    }
                    Mode::Enumerate => {
                        let n = client.enumerate(&dir).await?;
                        if n.len() as u64 != count {
                            return Err(nodekernel_client::Error::internal(format!(
                                "enumerate returned {} of {count} names",
                                n.len()
                            )));
                        }
                    }
                }
                if i >= measured_from {
                    lat.push(t.elapsed().as_nanos() as u64);
                }
            }
            Ok::<_, nodekernel_client::Error>((lat, started.elapsed()))
        }));
    }
    let mut all = Vec::new();
    let mut wall = Duration::ZERO;
    for t in tasks {
        let (lat, elapsed) = t.await??;
        all.extend(lat);
        wall = wall.max(elapsed);
    }
    setup.delete(&root, true).await?;
    let ops = all.len() as u64;
    let secs = wall.as_secs_f64();
    let bytes_per_op = match a.mode {
        Mode::Putkey | Mode::Getkey => a.size.0,
        _ => 0,
    };
    Ok(Report {
        mode: a.mode,
        clients: a.clients,
        ops,
        size: bytes_per_op,
        non_enumerable: a.non_enumerable,
        seconds: secs,
        ops_per_sec: ops as f64 / secs,
        mb_per_sec: (ops * bytes_per_op) as f64 / secs / 1e6,
        latency_us: percentiles(all),
    })
}

#[derive(Serialize)]
struct TierRow {
    dram_percent: u32,
    dram_bytes: u64,
    file_bytes: u64,
    write_seconds: f64,
    read_seconds: f64,
    total_seconds: f64,
    relative_to_all_dram: f64,
    write_mb_per_sec: f64,
    read_mb_per_sec: f64,
    storage_cost: f64,
    relative_cost: f64,
}

/// The tiering benchmark: one fresh embedded cluster per DRAM share.
async fn tiering(a: &BenchArgs) -> anyhow::Result<()> {
    let size = a.size.0;
    let bs = a.block_size.0;
    if size < bs {
        bail!("-s must be at least one block ({})", human(bs));
    }
    let data_dir = a
        .data_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("nk-bench-tiering"));
    let chunk = (16u64 << 20).min(size) as usize;
    let data: Vec<u8> = (0..chunk).map(|i| (i * 31 % 251) as u8).collect();
    let mut rows: Vec<TierRow> = Vec::new();
    let mut prices = (0.0, 0.0);
    for pct in [100u32, 50, 10, 0] {
        // Room for the data plus the root's record block on each tier.
        let dram = (size * pct as u64 / 100).div_ceil(bs) * bs;
        let file = (size - dram.min(size)).div_ceil(bs) * bs + 2 * bs;
        let mut c = Config::default();
        c.meta.listen = "127.0.0.1:0".into();
        c.meta.block_size = a.block_size;
        c.up.dram = ByteSize(dram);
        c.up.file = ByteSize(file);
        c.up.data_dir = data_dir.clone();
        let classes = c.classes();
        prices = (classes[0].price_per_gib, classes[1].price_per_gib);
        let cluster = LocalCluster::start(c)
            .await
            .context("starting the embedded cluster")?;
        let client = cluster.client().await?;
        let t0 = Instant::now();
        let mut w = client
            .create("/dataset", NodeType::File, CreateOptions::default())
            .await?;
        let mut left = size;
        while left > 0 {
            let n = left.min(chunk as u64) as usize;
            w.append(&data[..n]).await?;
            left -= n as u64;
        }
        w.close().await?;
        let write_s = t0.elapsed().as_secs_f64();
        let r = client.lookup("/dataset").await?;
        let mut buf = vec![0u8; chunk];
        let t1 = Instant::now();
        let mut pos = 0;
        while pos < size {
            let n = (size - pos).min(chunk as u64) as usize;
            r.read_at(pos, &mut buf[..n]).await?;
            if buf[..n] != data[..n] {
                bail!("read back wrong bytes at offset {pos}");
            }
            pos += n as u64;
        }
        let read_s = t1.elapsed().as_secs_f64();
        cluster.shutdown();
        drop(cluster);
        for f in std::fs::read_dir(&data_dir).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(f.path());
        }
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let dram_used = dram.min(size);
        let file_used = size - dram_used;
        let cost = gib(dram_used) * prices.0 + gib(file_used) * prices.1;
        let total = write_s + read_s;
        let base = rows.first().map(|r| r.total_seconds).unwrap_or(total);
        let base_cost = rows.first().map(|r| r.storage_cost).unwrap_or(cost);
        rows.push(TierRow {
            dram_percent: pct,
            dram_bytes: dram_used,
            file_bytes: file_used,
            write_seconds: write_s,
            read_seconds: read_s,
            total_seconds: total,
            relative_to_all_dram: total / base,
            write_mb_per_sec: size as f64 / write_s / 1e6,
            read_mb_per_sec: size as f64 / read_s / 1e6,
            storage_cost: cost,
            relative_cost: if base_cost > 0.0 {
                cost / base_cost
            } else {
                0.0
            },
        });
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!(
        "tiering: {} dataset, {} blocks; prices: DRAM ${:.2}/GiB, file ${:.2}/GiB",
        human(size),
        human(bs),
        prices.0,
        prices.1
    );
    println!("| DRAM share | write MB/s | read MB/s | time (s) | vs all-DRAM | storage cost | vs all-DRAM |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {}% | {:.0} | {:.0} | {:.2} | {:.2}x | ${:.2} | {:.2}x |",
            r.dram_percent,
            r.write_mb_per_sec,
            r.read_mb_per_sec,
            r.total_seconds,
            r.relative_to_all_dram,
            r.storage_cost,
            r.relative_cost
        );
    }
    Ok(())
}
