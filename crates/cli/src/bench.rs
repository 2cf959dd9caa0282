//! `nk bench`: the iobench modes of the seeds against a running cluster (or
//! an embedded one), with HDR-histogram latency percentiles and throughput,
//! optionally side by side with a Redis or memcached server started for the
//! run.
//! The `--json` output is documented in `docs/bench.md`.

mod expiry;
mod memcached;
mod redis;
mod zipf;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use futures::stream::{self, StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use nodekernel_client::{Client, ClientConfig, CreateOptions, DataPathStats, NodeType};
use nodekernel_cluster::{human, ByteSize, Config, LocalCluster};
use nodekernel_proto::sync;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Append COUNT buffers of SIZE to a File
    Write,
    /// Read a File sequentially, COUNT reads of SIZE (--qd N in flight)
    Read,
    /// Read COUNT random SIZE-aligned ranges of a File (--qd N in flight)
    Randread,
    /// Read a Bag of COUNT Files of SIZE as one stream
    Multistream,
    /// Create empty Files (create + close)
    Create,
    /// Metadata lookup only
    Lookup,
    /// KeyValue put (create + append + close)
    Putkey,
    /// KeyValue get (lookup + read)
    Getkey,
    /// Enumerate a Directory of COUNT Files
    Enumerate,
    /// Delete empty Files (made before the run, not measured)
    Delete,
    /// Lookups of --clients clients while a subtree of COUNT empty Files
    /// expires, against the same lookups before it (docs/bench.md)
    Expire,
    /// Write and read back SIZE with DRAM holding 100/50/10/0% of it
    /// (embedded clusters; the rest on the file tier)
    Tiering,
    /// Read (lookup + read) or, with --write-share, replace (fresh put)
    /// files of SIZE picked by a Zipf distribution (--zipf) among --files
    /// (or --data / SIZE); reports the share of read bytes DRAM served
    Zipf,
    /// Baseline: memory-copy bandwidth of this machine (COUNT copies of SIZE
    /// into fresh memory, like a COUNT x SIZE File write)
    Memcpy,
    /// Baseline: one loopback TCP stream (COUNT sends of SIZE)
    Tcp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Peer {
    Redis,
    Memcached,
}

#[derive(Args, Clone)]
pub struct BenchArgs {
    /// What to measure
    mode: Mode,
    /// Operations per client (measured)
    #[arg(short = 'k', long, default_value_t = 10_000)]
    count: u64,
    /// Buffer / value size
    #[arg(short = 's', long, value_parser = crate::common::parse_size, default_value = "4")]
    size: ByteSize,
    /// Warm-up operations per client (not measured)
    #[arg(short = 'w', long, default_value_t = 1_000)]
    warmup: u64,
    /// Concurrent clients (each with its own connections)
    #[arg(short = 'c', long, default_value_t = 1)]
    clients: u64,
    /// Operations in flight per client (read, randread, multistream)
    #[arg(long, default_value_t = 1)]
    qd: usize,
    /// Preferred storage class of the benchmark's nodes
    #[arg(long)]
    class: Option<u8>,
    /// Ask for blocks at the client's location first
    #[arg(long)]
    local: bool,
    /// Keys a putkey/getkey run cycles through
    #[arg(long, default_value_t = 100)]
    keys: u64,
    /// putkey: every put creates a new key (instead of replacing one of --keys)
    #[arg(long)]
    new_keys: bool,
    /// Put keys into a non-enumerable table (no child records written)
    #[arg(long)]
    non_enumerable: bool,
    /// Every node the run makes carries this TTL (its root gives it to new
    /// children, and to theirs); make it outlast the run
    #[arg(long, value_name = "DURATION", value_parser = crate::common::parse_duration)]
    ttl: Option<Duration>,
    /// Each of the run's roots carries a quota (limits far above what the
    /// run makes), so that every create, put and delete is counted
    /// against it
    #[arg(long)]
    quota: bool,
    /// Keep the nodes the run made (under /nk-bench-PID) instead of removing
    /// them at the end, e.g. to time a restart holding them
    #[arg(long)]
    keep: bool,
    /// Spread the run's nodes over N top-level directories
    /// (/nk-bench-PID-J), as many owned by each metadata partition (within
    /// one): client C works under directory C mod N, so with several
    /// metadata servers every one gets clients
    #[arg(long, default_value_t = 1, value_name = "N")]
    roots: usize,
    /// zipf: files of the run (default: --data / --size, else 1000)
    #[arg(long)]
    files: Option<u64>,
    /// zipf: total size of the files (--files of --size each)
    #[arg(long, value_parser = crate::common::parse_size)]
    data: Option<ByteSize>,
    /// zipf: exponent of the Zipf distribution files are picked by
    #[arg(long, default_value_t = 0.99)]
    zipf: f64,
    /// zipf: share of operations that replace the file instead of reading it
    #[arg(long, default_value_t = 0.1)]
    write_share: f64,
    /// Start an in-process cluster instead of connecting
    #[arg(long)]
    embedded: bool,
    /// Act as a client on another host: the network data path (no
    /// shared-memory mapping of co-located DRAM servers) and TCP for
    /// metadata (no Unix socket)
    #[arg(long)]
    remote: bool,
    /// DRAM of the embedded cluster
    #[arg(long, value_parser = crate::common::parse_size, default_value = "1GiB")]
    dram: ByteSize,
    /// Block size of the embedded cluster (every KeyValue takes at least one block)
    #[arg(long, value_parser = crate::common::parse_size, default_value = "1MiB")]
    block_size: ByteSize,
    /// Data directory of the tiering runs' clusters (LOCK, store-N); default: a fresh private one per run
    #[arg(long)]
    data_dir: Option<std::path::PathBuf>,
    /// Also run the same workload against these peers, each started for
    /// the run (comma-separated or repeated: `--vs redis,memcached`)
    #[arg(long, value_delimiter = ',')]
    vs: Vec<Peer>,
    /// Print the results as JSON (`docs/bench.md` has the schema)
    #[arg(long)]
    json: bool,
}

/// Latency percentiles in microseconds.
#[derive(Serialize, Clone, Debug)]
pub struct Latency {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Latency {
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            mean: h.mean() / 1000.0,
            p50: us(h.value_at_quantile(0.50)),
            p90: us(h.value_at_quantile(0.90)),
            p99: us(h.value_at_quantile(0.99)),
            p999: us(h.value_at_quantile(0.999)),
            max: us(h.max()),
        }
    }
}

/// One benchmark result (the `--json` schema, see docs/bench.md).
#[derive(Serialize)]
pub struct Report {
    pub mode: Mode,
    pub clients: u64,
    pub qd: usize,
    /// Bytes per operation (0 for metadata-only modes).
    pub size: u64,
    pub ops: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub mb_per_sec: f64,
    pub gb_per_sec: f64,
    pub non_enumerable: bool,
    /// `--ttl`: the TTL every node of the run carried, in seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<f64>,
    /// `--quota`: the run's roots carried quotas.
    pub quota: bool,
    pub latency_us: Latency,
    /// How block bytes moved: `shared-memory`, `network`, `mixed`, or
    /// `none` (metadata-only modes, baselines).
    pub data_path: &'static str,
    /// How metadata requests went: `unix` (a co-located metadata server's
    /// Unix socket), `tcp`, or `none` (baselines).
    pub meta_transport: &'static str,
    /// Top-level directories the run's nodes were spread over (`--roots`;
    /// 0 for baselines).
    pub roots: usize,
    /// Metadata servers (partitions) the clients talked to (0 for baselines).
    pub meta_partitions: usize,
    /// The first of `peers` (kept for readers of the one-peer schema).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<redis::PeerReport>,
    /// Every `--vs` peer, in the order given.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub peers: Vec<redis::PeerReport>,
    /// The zipf mode's reads by storage class and migration's moves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zipf: Option<zipf::ZipfReport>,
}

/// The paths the benchmark's clients took (see [`Report`]).
#[derive(Default)]
struct Paths {
    stats: DataPathStats,
    unix_meta: bool,
    /// Bytes the measured operations read, by storage class.
    measured_read_bytes_by_class: [u64; 4],
}

impl Paths {
    /// Adds client `c`, whose stats were `at_start` when its measured
    /// operations began.
    fn add(&mut self, c: &Client, at_start: &DataPathStats) {
        let s = c.data_path_stats();
        for (sum, (end, start)) in self.measured_read_bytes_by_class.iter_mut().zip(
            s.read_bytes_by_class
                .iter()
                .zip(&at_start.read_bytes_by_class),
        ) {
            *sum += end.saturating_sub(*start);
        }
        self.stats.mapped_reads += s.mapped_reads;
        self.stats.mapped_writes += s.mapped_writes;
        self.stats.network_reads += s.network_reads;
        self.stats.network_writes += s.network_writes;
        self.unix_meta |= c
            .meta_route(0)
            .is_some_and(|r| r.starts_with(nodekernel_client::UNIX_PREFIX));
    }

    fn data_path(&self) -> &'static str {
        let s = &self.stats;
        let mapped = s.mapped_reads + s.mapped_writes;
        let network = s.network_reads + s.network_writes;
        match (mapped > 0, network > 0) {
            (false, false) => "none",
            (true, false) => "shared-memory",
            (false, true) => "network",
            (true, true) => "mixed",
        }
    }

    fn meta_transport(&self) -> &'static str {
        if self.unix_meta {
            "unix"
        } else {
            "tcp"
        }
    }
}

pub async fn run(cfg: ClientConfig, a: &BenchArgs) -> anyhow::Result<()> {
    if a.count == 0 || a.clients == 0 || a.qd == 0 {
        bail!("-k, -c and --qd must be at least 1");
    }
    if a.mode == Mode::Tiering {
        return tiering(a).await;
    }
    if a.mode == Mode::Expire && !a.vs.is_empty() {
        bail!("expire has no peer to compare with (--vs)");
    }
    if matches!(a.mode, Mode::Memcpy | Mode::Tcp) {
        let report = baseline(a).await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print_human(&report, a);
        }
        return Ok(());
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
    let mut cfg = cfg;
    if a.remote {
        cfg.shared_memory = false;
        cfg.unix_sockets = false;
    }
    if a.vs.contains(&Peer::Memcached) {
        memcached::check(a.mode)?;
    }
    if a.mode == Mode::Expire {
        let report = expiry::run(cfg, a).await?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            expiry::print_human(&report);
        }
        return Ok(());
    }
    let mut report = bench(cfg, a).await?;
    for peer in &a.vs {
        let p = match peer {
            Peer::Redis => redis::compare(a.mode, a.clients, a.count, a.size.0, &report).await?,
            Peer::Memcached => memcached::compare(a, &report).await?,
        };
        report.peers.push(p);
    }
    report.peer = report.peers.first().cloned();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_human(&report, a);
    }
    Ok(())
}

fn print_human(r: &Report, a: &BenchArgs) {
    let l = &r.latency_us;
    println!(
        "{:?}: {} client(s) x {} ops, size {}, {} in flight{}",
        r.mode,
        r.clients,
        a.count,
        human(a.size.0),
        r.qd,
        if r.non_enumerable {
            ", non-enumerable table"
        } else {
            ""
        }
    );
    println!(
        "  {:.0} ops/s, {:.3} GB/s, {:.3} s (data path: {}, metadata over {})",
        r.ops_per_sec, r.gb_per_sec, r.seconds, r.data_path, r.meta_transport
    );
    println!(
        "  latency us: p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  max {:.1}",
        l.p50, l.p90, l.p99, l.p999, l.max
    );
    if let Some(z) = &r.zipf {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let c = &z.read_bytes_by_class;
        println!(
            "  {} files ({}), zipf {}, {:.0}% writes: {:.1}% of read bytes from DRAM \
             (MiB read by class 0/1/2/3+: {:.0}/{:.0}/{:.0}/{:.0})",
            z.files,
            human(z.data_bytes),
            z.exponent,
            z.write_share * 100.0,
            z.dram_read_share * 100.0,
            mib(c[0]),
            mib(c[1]),
            mib(c[2]),
            mib(c[3])
        );
        println!(
            "  blocks demoted/promoted: {}/{} during the run, {}/{} while creating the files",
            z.blocks_demoted, z.blocks_promoted, z.setup_blocks_demoted, z.setup_blocks_promoted
        );
    }
    if r.roots > 1 {
        println!(
            "  nodes spread over {} top-level directories, {} metadata partition(s)",
            r.roots, r.meta_partitions
        );
    }
    for p in &r.peers {
        println!(
            "  {} {}: {:.0} ops/s, p50 {:.1} us, p99 {:.1} us -> NodeKernel p50 is {:.2}x {}'s, throughput {:.2}x",
            p.name, p.op, p.ops_per_sec, p.p50_us, p.p99_us, p.p50_ratio, p.name, p.throughput_ratio
        );
    }
}

/// What every client of a run shares.
struct Plan {
    mode: Mode,
    /// The run's top-level directories (`--roots`; interleaved by
    /// metadata partition).
    roots: Vec<String>,
    size: usize,
    warmup: u64,
    count: u64,
    qd: usize,
    keys: u64,
    new_keys: bool,
    opts: CreateOptions,
    /// The zipf mode's files.
    zipf: Option<zipf::Workload>,
}

impl Plan {
    /// Client `c`'s directory: under root `c mod roots`.
    fn dir(&self, c: u64) -> String {
        let r = (c % self.roots.len() as u64) as usize;
        format!("{}/c{c}", self.roots[r])
    }
    /// Operations each client performs (warm-up included).
    fn total(&self) -> u64 {
        match self.mode {
            Mode::Enumerate | Mode::Multistream => self.warmup.min(2) + self.count.min(20),
            _ => self.warmup + self.count,
        }
    }
    fn measured_from(&self) -> u64 {
        match self.mode {
            Mode::Enumerate | Mode::Multistream => self.warmup.min(2),
            _ => self.warmup,
        }
    }
}

/// Runs one benchmark and returns its report.
pub async fn bench(cfg: ClientConfig, a: &BenchArgs) -> anyhow::Result<Report> {
    let setup = Client::connect(cfg.clone()).await?;
    let partitions = cfg.metas.len().max(1);
    let roots = bench_roots(
        &format!("/nk-bench-{}", std::process::id()),
        a.roots,
        partitions,
    )?;
    let zipf = match a.mode {
        Mode::Zipf => Some(zipf::Workload::new(
            format!("{}/zipf", roots[0]),
            zipf::file_count(a.files, a.data, a.size.0),
            a.zipf,
            a.write_share,
            1,
        )?),
        _ => None,
    };
    let plan = Arc::new(Plan {
        mode: a.mode,
        roots,
        size: usize::try_from(a.size.0).context("size too large")?,
        warmup: a.warmup,
        count: a.count,
        qd: a.qd,
        keys: a.keys.max(1),
        new_keys: a.new_keys,
        opts: CreateOptions {
            storage_class: a.class,
            local: a.local,
            enumerable: !a.non_enumerable,
            ..CreateOptions::default()
        },
        zipf,
    });
    for root in &plan.roots {
        make_root(&setup, root, a).await?;
    }
    let result = run_clients(&setup, cfg, a, plan.clone()).await;
    let cleanup = if a.keep {
        eprintln!("kept the benchmark's nodes under {}", plan.roots.join(", "));
        Ok(())
    } else {
        let mut first = Ok(());
        for root in &plan.roots {
            let r = setup.delete(root, true).await;
            if first.is_ok() {
                first = r;
            }
        }
        first
    };
    let run = result?;
    cleanup?;
    let (ops, secs) = (run.hist.len(), run.seconds);
    let bytes_per_op = match a.mode {
        Mode::Create | Mode::Lookup | Mode::Enumerate | Mode::Delete | Mode::Expire => 0,
        Mode::Multistream => a.size.0 * a.count,
        _ => a.size.0,
    };
    let bytes = (ops * bytes_per_op) as f64;
    Ok(Report {
        mode: a.mode,
        clients: a.clients,
        qd: a.qd,
        size: bytes_per_op,
        ops,
        seconds: secs,
        ops_per_sec: ops as f64 / secs,
        mb_per_sec: bytes / secs / 1e6,
        gb_per_sec: bytes / secs / 1e9,
        non_enumerable: a.non_enumerable,
        ttl_seconds: a.ttl.map(|t| t.as_secs_f64()),
        quota: a.quota,
        latency_us: Latency::of(&run.hist),
        data_path: run.paths.data_path(),
        meta_transport: run.paths.meta_transport(),
        roots: plan.roots.len(),
        meta_partitions: partitions,
        peer: None,
        peers: Vec::new(),
        zipf: run.zipf,
    })
}

/// Makes the run's root `root`, with `--ttl` and `--quota`.
async fn make_root(c: &Client, root: &str, a: &BenchArgs) -> anyhow::Result<()> {
    c.mkdir(root, false).await?;
    if let Some(ttl) = a.ttl {
        c.set_child_ttl(root, Some(ttl)).await?;
    }
    if a.quota {
        c.set_quota(root, Some(QUOTA_BYTES), Some(QUOTA_NODES))
            .await?;
    }
    Ok(())
}

/// `--quota`'s limits: never reached by a run, but checked by each create
/// and write as any limit is.
const QUOTA_BYTES: u64 = 1 << 60;
const QUOTA_NODES: u64 = 1 << 40;

/// What the clients of a run measured.
struct Run {
    hist: Histogram<u64>,
    /// The measured phase (see [`Phase`]).
    seconds: f64,
    paths: Paths,
    zipf: Option<zipf::ZipfReport>,
}

async fn run_clients(
    setup: &Client,
    cfg: ClientConfig,
    a: &BenchArgs,
    plan: Arc<Plan>,
) -> anyhow::Result<Run> {
    let value = vec![0x5Au8; plan.size];
    let mut zipf_moves = None;
    if let Some(w) = &plan.zipf {
        let before = zipf::Moves::now(setup).await?;
        w.create(setup, &plan.opts, &value).await?;
        zipf_moves = Some([before, zipf::Moves::now(setup).await?]);
    }
    for c in 0..a.clients {
        prepare(setup, &plan, &plan.dir(c), &value).await?;
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(a.clients as usize));
    let mut tasks = Vec::new();
    for c in 0..a.clients {
        let client = Client::connect(cfg.clone()).await?;
        let plan = plan.clone();
        let barrier = barrier.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let r = one_client(client.clone(), plan, c, value, barrier).await;
            r.map(|(h, measured, at_start)| (h, measured, at_start, client))
        }));
    }
    let mut hist = new_histogram();
    let mut phase = Phase::default();
    let mut paths = Paths::default();
    for t in tasks {
        let (h, measured, at_start, client) = t.await??;
        hist.add(&h).context("merging histograms")?;
        phase.add(measured);
        paths.add(&client, &at_start);
    }
    let zipf = match (&plan.zipf, zipf_moves) {
        (Some(w), Some([before, created])) => Some(zipf::ZipfReport::new(
            w,
            plan.size as u64,
            paths.measured_read_bytes_by_class,
            [before, created, zipf::Moves::now(setup).await?],
        )),
        _ => None,
    };
    Ok(Run {
        hist,
        seconds: phase.seconds(),
        paths,
        zipf,
    })
}

/// Waits for every client at the start of the measured phase; its start
/// and `client`'s data-path stats then.
async fn measure_from(barrier: &tokio::sync::Barrier, client: &Client) -> (Instant, DataPathStats) {
    barrier.wait().await;
    (Instant::now(), client.data_path_stats())
}

/// The measured phase of a run: from the first client's start to the
/// last client's end. The slowest client's own time is not enough: with
/// more clients than runtime threads, a client whose operations do not
/// wait (co-located reads) may run only after others have finished, and
/// every client's own time is then a fraction of the phase.
#[derive(Default)]
struct Phase(Option<std::ops::Range<Instant>>);

impl Phase {
    fn add(&mut self, client: std::ops::Range<Instant>) {
        self.0 = Some(match self.0.take() {
            None => client,
            Some(p) => p.start.min(client.start)..p.end.max(client.end),
        });
    }

    fn seconds(&self) -> f64 {
        self.0
            .as_ref()
            .map_or(0.0, |p| (p.end - p.start).as_secs_f64())
    }
}

/// `n` top-level directory names for a run, `base-J`, chosen so that each
/// of `partitions` metadata partitions owns as many of them as any other
/// (within one), and interleaved so that root `r` belongs to partition
/// `r mod partitions` while every partition has roots left. One root is
/// `base` itself (the layout of runs without `--roots`).
fn bench_roots(base: &str, n: usize, partitions: usize) -> anyhow::Result<Vec<String>> {
    if n == 0 {
        bail!("--roots must be at least 1");
    }
    if n == 1 {
        return Ok(vec![base.to_string()]);
    }
    let p = partitions.max(1);
    let mut want: Vec<usize> = (0..p).map(|i| n / p + usize::from(i < n % p)).collect();
    let mut by_partition: Vec<Vec<String>> = vec![Vec::new(); p];
    let mut found = 0;
    // FNV-1a spreads consecutive names evenly; the bound only guards the loop.
    for j in 0..(n as u64 + 64) * 64 * p as u64 {
        if found == n {
            break;
        }
        let name = format!("{base}-{j}");
        let part = nodekernel_proto::path::partition_of(&name, p);
        if want[part] > 0 {
            want[part] -= 1;
            by_partition[part].push(name);
            found += 1;
        }
    }
    if found < n {
        bail!("could not spread {n} top-level names over {p} metadata partitions");
    }
    let mut roots = Vec::with_capacity(n);
    for k in 0..n.div_ceil(p) {
        roots.extend(
            by_partition
                .iter()
                .filter_map(|names| names.get(k).cloned()),
        );
    }
    Ok(roots)
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 100 s at 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static bounds")
}

/// Creates what a client's workload needs under `dir`.
async fn prepare(c: &Client, plan: &Plan, dir: &str, value: &[u8]) -> anyhow::Result<()> {
    match plan.mode {
        Mode::Putkey | Mode::Getkey => {
            c.create(dir, NodeType::Table, plan.opts.clone()).await?;
            if plan.mode == Mode::Getkey {
                for i in 0..plan.keys.min(plan.total()) {
                    c.put(&format!("{dir}/k{i}"), value).await?;
                }
            }
        }
        Mode::Multistream => {
            c.create(dir, NodeType::Bag, CreateOptions::default())
                .await?;
            for i in 0..plan.count {
                let mut f = c
                    .create(&format!("{dir}/f{i}"), NodeType::File, plan.opts.clone())
                    .await?;
                f.append(value).await?;
                f.close().await?;
            }
        }
        _ => {
            c.mkdir(dir, false).await?;
            match plan.mode {
                Mode::Lookup => {
                    c.create(&format!("{dir}/f"), NodeType::File, plan.opts.clone())
                        .await?
                        .close()
                        .await?
                }
                Mode::Delete => {
                    for i in 0..plan.total() {
                        c.create(&format!("{dir}/f{i}"), NodeType::File, plan.opts.clone())
                            .await?
                            .close()
                            .await?;
                    }
                }
                Mode::Enumerate => {
                    for i in 0..plan.count {
                        c.create(&format!("{dir}/f{i}"), NodeType::File, plan.opts.clone())
                            .await?
                            .close()
                            .await?;
                    }
                }
                Mode::Read | Mode::Randread => {
                    let mut f = c
                        .create(&format!("{dir}/data"), NodeType::File, plan.opts.clone())
                        .await?;
                    let chunk = (16usize << 20).div_ceil(value.len().max(1)).max(1);
                    let big: Vec<u8> = value.repeat(chunk.min(plan.count as usize).max(1));
                    let mut left = plan.count as usize;
                    while left > 0 {
                        let n = left.min(chunk);
                        f.append(&big[..n * value.len()]).await?;
                        left -= n;
                    }
                    f.close().await?;
                }
                _ => {}
            }
        }
    }
    Ok(())
}

async fn one_client(
    client: Client,
    plan: Arc<Plan>,
    c: u64,
    value: Vec<u8>,
    barrier: Arc<tokio::sync::Barrier>,
) -> nodekernel_client::Result<(Histogram<u64>, std::ops::Range<Instant>, DataPathStats)> {
    let dir = plan.dir(c);
    let mut hist = new_histogram();
    let (total, from) = (plan.total(), plan.measured_from());
    let size = plan.size as u64;
    let mut started = Instant::now();
    let mut at_start = client.data_path_stats();
    let record = |i: u64, t: Instant, hist: &mut Histogram<u64>| {
        if i >= from {
            let _ = hist.record(t.elapsed().as_nanos().max(1) as u64);
        }
    };
    match plan.mode {
        Mode::Read | Mode::Randread => {
            let node = client.lookup(&format!("{dir}/data")).await?;
            let blocks = plan.count.max(1);
            let mut rng = rand::rngs::SmallRng::seed_from_u64(c);
            let offsets: Vec<u64> = (0..total)
                .map(|i| match plan.mode {
                    Mode::Read => (i % blocks) * size,
                    _ => rng.gen_range(0..blocks) * size,
                })
                .collect();
            let (warm, measured) = offsets.split_at(from as usize);
            // One buffer per read in flight, reused like an application's
            // I/O buffers (a fresh one would add its page faults).
            let buffers = std::sync::Mutex::new(Vec::<Vec<u8>>::new());
            let read = |off: u64| {
                let (node, buffers) = (&node, &buffers);
                async move {
                    let reused = sync::lock(buffers).pop();
                    let mut buf = reused.unwrap_or_else(|| vec![0u8; size as usize]);
                    let t = Instant::now();
                    node.read_at(off, &mut buf).await?;
                    let took = t.elapsed();
                    sync::lock(buffers).push(buf);
                    Ok::<_, nodekernel_client::Error>(took)
                }
            };
            stream::iter(warm.iter().copied().map(read))
                .buffer_unordered(plan.qd)
                .try_collect::<Vec<_>>()
                .await?;
            (started, at_start) = measure_from(&barrier, &client).await;
            let lats: Vec<Duration> = stream::iter(measured.iter().copied().map(read))
                .buffer_unordered(plan.qd)
                .try_collect()
                .await?;
            for l in lats {
                let _ = hist.record(l.as_nanos().max(1) as u64);
            }
        }
        Mode::Write => {
            let mut f = client
                .create(&format!("{dir}/data"), NodeType::File, plan.opts.clone())
                .await?;
            for i in 0..total {
                if i == from {
                    (started, at_start) = measure_from(&barrier, &client).await;
                }
                let t = Instant::now();
                f.append(&value).await?;
                record(i, t, &mut hist);
            }
            f.close().await?;
        }
        _ => {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(c);
            for i in 0..total {
                if i == from {
                    (started, at_start) = measure_from(&barrier, &client).await;
                }
                let t = Instant::now();
                match plan.mode {
                    Mode::Create => {
                        client
                            .create(&format!("{dir}/f{i}"), NodeType::File, plan.opts.clone())
                            .await?
                            .close()
                            .await?;
                    }
                    Mode::Lookup => {
                        client.lookup(&format!("{dir}/f")).await?;
                    }
                    Mode::Delete => {
                        client.delete(&format!("{dir}/f{i}"), false).await?;
                    }
                    Mode::Putkey => {
                        let key = if plan.new_keys { i } else { i % plan.keys };
                        client.put(&format!("{dir}/k{key}"), &value).await?;
                    }
                    Mode::Getkey => {
                        let n = plan.keys.min(total);
                        let v = client.get(&format!("{dir}/k{}", i % n)).await?;
                        if v.len() != value.len() {
                            return Err(nodekernel_client::Error::internal(
                                "getkey returned a wrong-sized value",
                            ));
                        }
                    }
                    Mode::Enumerate => {
                        let n = client.enumerate(&dir).await?;
                        if n.len() as u64 != plan.count {
                            return Err(nodekernel_client::Error::internal(format!(
                                "enumerate returned {} of {} names",
                                n.len(),
                                plan.count
                            )));
                        }
                    }
                    Mode::Multistream => {
                        let mut bag = client.read_bag(&dir, plan.qd.max(16)).await?;
                        let got = bag.read_to_end().await?;
                        if got.len() as u64 != plan.count * size {
                            return Err(nodekernel_client::Error::internal(
                                "multistream read a wrong length",
                            ));
                        }
                    }
                    Mode::Zipf => {
                        if let Some(w) = &plan.zipf {
                            w.op(&client, &mut rng, &value).await?;
                        }
                    }
                    Mode::Read
                    | Mode::Randread
                    | Mode::Write
                    | Mode::Tiering
                    | Mode::Expire
                    | Mode::Memcpy
                    | Mode::Tcp => {
                        unreachable!("handled above")
                    }
                }
                record(i, t, &mut hist);
            }
        }
    }
    Ok((hist, started..Instant::now(), at_start))
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
        c.up.data_dir = a.data_dir.clone();
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
        // The stores remove their block files.
        cluster.shutdown();
        drop(cluster);
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

/// Largest destination of the memcpy baseline.
const MAX_MEMCPY_SPAN: usize = 16 << 30;

/// The hardware baselines the data-path targets are defined against:
/// `memcpy` of SIZE at a time into COUNT x SIZE bytes of fresh (touched)
/// memory, and one TCP stream over loopback (a sender task and a receiver
/// task, SIZE per send).
async fn baseline(a: &BenchArgs) -> anyhow::Result<Report> {
    let size = usize::try_from(a.size.0).context("size too large")?.max(1);
    let mut hist = new_histogram();
    let started;
    match a.mode {
        Mode::Memcpy => {
            // The shape of a large File write: SIZE bytes at a time into
            // memory that this run has not copied to yet (COUNT x SIZE in
            // all, every page touched beforehand, as the DRAM tier's are).
            // Copying into one SIZE buffer over and over would measure the
            // CPU caches instead (1.3-1.7x this on 16 MiB here).
            let span = size
                .checked_mul(usize::try_from(a.count)?)
                .filter(|&s| s <= MAX_MEMCPY_SPAN)
                .with_context(|| {
                    format!("memcpy: size x count must be at most {MAX_MEMCPY_SPAN} bytes")
                })?;
            let src = vec![0xA5u8; size];
            let mut dst = vec![0u8; span];
            dst.fill(0x11);
            for _ in 0..a.warmup {
                dst[..size].copy_from_slice(&src);
            }
            started = Instant::now();
            for chunk in dst.chunks_exact_mut(size) {
                let t = Instant::now();
                chunk.copy_from_slice(std::hint::black_box(&src));
                std::hint::black_box(&mut *chunk);
                let _ = hist.record(t.elapsed().as_nanos().max(1) as u64);
            }
        }
        Mode::Tcp => {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
            let addr = listener.local_addr()?;
            let total = (a.warmup + a.count) * size as u64;
            let sink = tokio::spawn(async move {
                let (mut s, _) = listener.accept().await?;
                let mut buf = vec![0u8; 4 << 20];
                let mut got = 0u64;
                while got < total {
                    let n = s.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    got += n as u64;
                }
                s.write_all(b"k").await?;
                Ok::<_, std::io::Error>(got)
            });
            let mut s = tokio::net::TcpStream::connect(addr).await?;
            s.set_nodelay(true)?;
            let data = vec![0x5Au8; size];
            for _ in 0..a.warmup {
                s.write_all(&data).await?;
            }
            started = Instant::now();
            for _ in 0..a.count {
                let t = Instant::now();
                s.write_all(&data).await?;
                let _ = hist.record(t.elapsed().as_nanos().max(1) as u64);
            }
            // Wait until the receiver has everything.
            let mut ack = [0u8; 1];
            s.read_exact(&mut ack).await?;
            sink.await.context("receiver task")??;
        }
        other => bail!("{other:?} is not a baseline"),
    }
    let secs = started.elapsed().as_secs_f64();
    let bytes = (a.count * size as u64) as f64;
    Ok(Report {
        mode: a.mode,
        clients: 1,
        qd: 1,
        size: size as u64,
        ops: a.count,
        seconds: secs,
        ops_per_sec: a.count as f64 / secs,
        mb_per_sec: bytes / secs / 1e6,
        gb_per_sec: bytes / secs / 1e9,
        non_enumerable: false,
        ttl_seconds: None,
        quota: false,
        latency_us: Latency::of(&hist),
        data_path: "none",
        meta_transport: "none",
        roots: 0,
        meta_partitions: 0,
        peer: None,
        peers: Vec::new(),
        zipf: None,
    })
}

#[cfg(test)]
mod tests {
    use super::bench_roots;
    use nodekernel_proto::path::partition_of;

    #[test]
    fn roots_are_spread_evenly_over_the_partitions() {
        assert_eq!(bench_roots("/b", 1, 4).unwrap(), ["/b"]);
        for (n, p) in [(16, 1), (16, 2), (16, 4), (10, 4), (3, 4), (64, 4)] {
            let roots = bench_roots("/nk-bench-7", n, p).unwrap();
            assert_eq!(roots.len(), n);
            let mut seen = roots.clone();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), n, "distinct names");
            let mut per = vec![0usize; p];
            for (r, name) in roots.iter().enumerate() {
                let part = partition_of(name, p);
                per[part] += 1;
                if r < n - n % p {
                    assert_eq!(part, r % p, "{n} over {p}: interleaved");
                }
            }
            let (lo, hi) = (per.iter().min().unwrap(), per.iter().max().unwrap());
            assert!(hi - lo <= 1, "{n} over {p}: {per:?}");
        }
        assert!(bench_roots("/b", 0, 1).is_err());
    }
}
