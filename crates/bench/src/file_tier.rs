//! File tier benchmark: sequential writes and reads in whole-block requests
//! and random small reads, each with several requests in flight.
//!
//! Engines:
//!
//! * a **store** engine is the storage server's data path below the network:
//!   [`BlockStore::write`]/[`BlockStore::read`] (generation checks, block
//!   lock, aligned bounce buffers) over a [`FileMedium`] in a chosen
//!   [`IoMode`], driven by `depth` tokio tasks on a multi-threaded runtime
//!   (one request in flight per task);
//! * the **baseline** is what the file tier did before: synchronous
//!   buffered `pread`/`pwrite` (`read_exact_at`/`write_all_at`) of the same
//!   requests, from `depth` OS threads (an upper bound for the old server,
//!   which ran them on its few tokio worker threads).
//!
//! Buffered engines go through the page cache, so for them the benchmark
//! reports writes both as the `pwrite`s returned (data only in memory) and
//! including the final `fdatasync`, and reads both *cold* (after
//! `fdatasync` + `POSIX_FADV_DONTNEED` of the file) and *warm* (the same
//! pass again, served from memory). Direct engines have one number each.

use bytes::BytesMut;
use nodekernel_store::{BlockStore, FileIoConfig, FileMedium, IoMode};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which implementation moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Engine {
    /// The file tier with io_uring and O_DIRECT, large reads uncached
    /// buffered (the default path).
    UringDirect,
    /// The file tier with io_uring and O_DIRECT for every read too.
    UringDirectOnly,
    /// The file tier with io_uring through the page cache.
    UringBuffered,
    /// The file tier's fallback: pread/pwrite threads with O_DIRECT.
    ThreadsDirect,
    /// The file tier's fallback: pread/pwrite threads, buffered.
    ThreadsBuffered,
    /// Plain buffered pread/pwrite from `depth` threads (the old path).
    Baseline,
}

impl Engine {
    fn file_io(self, queue_depth: u32) -> Option<FileIoConfig> {
        let (direct, io_uring, stream_reads) = match self {
            Engine::UringDirect => (true, true, true),
            Engine::UringDirectOnly => (true, true, false),
            Engine::UringBuffered => (false, true, false),
            Engine::ThreadsDirect => (true, false, true),
            Engine::ThreadsBuffered => (false, false, false),
            Engine::Baseline => return None,
        };
        Some(FileIoConfig {
            direct,
            io_uring,
            queue_depth,
            stream_reads,
        })
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// Directory for the benchmark files (removed afterwards).
    pub dir: PathBuf,
    /// Bytes written and read sequentially per pass (whole blocks).
    pub size: u64,
    /// Block (= request) size of the sequential passes.
    pub block_size: u32,
    /// Request size of the random reads (aligned to itself).
    pub rand_size: u32,
    /// Requests in flight to try, e.g. `[1, 16, 64]`.
    pub depths: Vec<usize>,
    /// How long each random-read run lasts.
    pub rand_time: Duration,
    pub engines: Vec<Engine>,
}

/// One measured run.
#[derive(Debug, Clone)]
pub struct Row {
    /// `"baseline"` or the store's [`IoMode`] string.
    pub engine: String,
    /// E.g. `"seq write"`, `"seq read (cold)"`.
    pub workload: &'static str,
    pub depth: usize,
    pub bytes: u64,
    pub ops: u64,
    pub secs: f64,
    /// Lowest and highest MB/s over repeated runs (see [`median`]); both
    /// equal this row's own rate for a single run.
    pub range_mb_s: (f64, f64),
}

impl Row {
    pub fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.secs
    }

    pub fn ops_per_s(&self) -> f64 {
        self.ops as f64 / self.secs
    }
}

/// The thing under test, plus a plain descriptor of the same file for
/// `fdatasync` and `fadvise`.
struct Target {
    engine: String,
    direct: bool,
    ctl: File,
    kind: Kind,
}

enum Kind {
    Store(Arc<BlockStore>, tokio::runtime::Runtime),
    Plain(Arc<File>),
}

const GEN: u64 = 1;

impl Target {
    fn open(engine: Engine, path: &Path, cfg: &Config, depth: usize) -> io::Result<Target> {
        let blocks = cfg.size / u64::from(cfg.block_size);
        let bytes = blocks * u64::from(cfg.block_size);
        let (name, direct, kind) = match engine.file_io(depth.max(1) as u32) {
            Some(io) => {
                let medium = FileMedium::create_with(path, bytes, &io).map_err(io::Error::other)?;
                let mode = medium.mode();
                let name = match medium.stream_reads() {
                    true => format!("{mode}, uncached large reads"),
                    false => mode.to_string(),
                };
                let store = BlockStore::new(Box::new(medium), cfg.block_size, blocks as u32);
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()?;
                (name, mode.is_direct(), Kind::Store(Arc::new(store), rt))
            }
            None => {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(path)?;
                f.set_len(bytes)?;
                // Preallocate like the file tier does, so both write into
                // allocated extents.
                // SAFETY: plain system call on a descriptor we own.
                let rc = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, bytes as libc::off_t) };
                if rc != 0 && rc != libc::EOPNOTSUPP {
                    return Err(io::Error::from_raw_os_error(rc));
                }
                ("baseline".to_string(), false, Kind::Plain(Arc::new(f)))
            }
        };
        let ctl = File::open(path)?;
        Ok(Target {
            engine: name,
            direct,
            ctl,
            kind,
        })
    }

    /// Writes back and evicts the file's cached pages.
    fn drop_cache(&self) -> io::Result<()> {
        self.ctl.sync_data()?;
        // SAFETY: plain system call on a descriptor we own.
        let rc =
            unsafe { libc::posix_fadvise(self.ctl.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }

    /// Sequential pass over all blocks, `depth` requests in flight; each
    /// request takes the next block. Returns (bytes, ops, seconds).
    fn seq(&self, write: bool, cfg: &Config, depth: usize) -> io::Result<(u64, u64, f64)> {
        let bs = cfg.block_size as usize;
        let blocks = cfg.size / bs as u64;
        let next = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        match &self.kind {
            Kind::Store(store, rt) => rt.block_on(async {
                let mut set = tokio::task::JoinSet::new();
                for t in 0..depth {
                    let (store, next) = (store.clone(), next.clone());
                    set.spawn(async move {
                        let mut buf = vec![0u8; bs];
                        SmallRng::seed_from_u64(t as u64).fill_bytes(&mut buf);
                        let mut out = BytesMut::with_capacity(bs);
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= blocks {
                                return Ok(());
                            }
                            let r = if write {
                                store.write(i as u32, GEN, 0, &buf).await
                            } else {
                                out.clear();
                                store.read(i as u32, GEN, 0, bs as u32, &mut out).await
                            };
                            r.map_err(|e| io::Error::other(e.to_string()))?;
                        }
                    });
                }
                join_all(&mut set).await
            })?,
            Kind::Plain(file) => std::thread::scope(|s| {
                let workers: Vec<_> = (0..depth)
                    .map(|t| {
                        let next = next.clone();
                        s.spawn(move || -> io::Result<()> {
                            let mut buf = vec![0u8; bs];
                            SmallRng::seed_from_u64(t as u64).fill_bytes(&mut buf);
                            loop {
                                let i = next.fetch_add(1, Ordering::Relaxed);
                                if i >= blocks {
                                    return Ok(());
                                }
                                if write {
                                    file.write_all_at(&buf, i * bs as u64)?;
                                } else {
                                    file.read_exact_at(&mut buf, i * bs as u64)?;
                                }
                            }
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .try_for_each(|w| w.join().expect("benchmark thread"))
            })?,
        }
        Ok((blocks * bs as u64, blocks, started.elapsed().as_secs_f64()))
    }

    /// Random aligned reads of `cfg.rand_size` bytes for `cfg.rand_time`.
    fn rand_reads(&self, cfg: &Config, depth: usize) -> io::Result<(u64, u64, f64)> {
        let bs = u64::from(cfg.block_size);
        let blocks = cfg.size / bs;
        let rs = cfg.rand_size;
        let slots = bs / u64::from(rs);
        let ops = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let deadline = started + cfg.rand_time;
        match &self.kind {
            Kind::Store(store, rt) => rt.block_on(async {
                let mut set = tokio::task::JoinSet::new();
                for t in 0..depth {
                    let (store, ops) = (store.clone(), ops.clone());
                    set.spawn(async move {
                        let mut rng = SmallRng::seed_from_u64(1000 + t as u64);
                        let mut out = BytesMut::with_capacity(rs as usize);
                        let mut n = 0;
                        while Instant::now() < deadline {
                            let block = rng.gen_range(0..blocks) as u32;
                            let off = (rng.gen_range(0..slots) * u64::from(rs)) as u32;
                            out.clear();
                            store
                                .read(block, GEN, off, rs, &mut out)
                                .await
                                .map_err(|e| io::Error::other(e.to_string()))?;
                            n += 1;
                        }
                        ops.fetch_add(n, Ordering::Relaxed);
                        Ok(())
                    });
                }
                join_all(&mut set).await
            })?,
            Kind::Plain(file) => std::thread::scope(|s| {
                let workers: Vec<_> = (0..depth)
                    .map(|t| {
                        let ops = ops.clone();
                        s.spawn(move || -> io::Result<()> {
                            let mut rng = SmallRng::seed_from_u64(1000 + t as u64);
                            let mut buf = vec![0u8; rs as usize];
                            let mut n = 0;
                            while Instant::now() < deadline {
                                let block = rng.gen_range(0..blocks);
                                let off = rng.gen_range(0..slots) * u64::from(rs);
                                file.read_exact_at(&mut buf, block * bs + off)?;
                                n += 1;
                            }
                            ops.fetch_add(n, Ordering::Relaxed);
                            Ok(())
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .try_for_each(|w| w.join().expect("benchmark thread"))
            })?,
        }
        let secs = started.elapsed().as_secs_f64();
        let ops = ops.load(Ordering::Relaxed);
        Ok((ops * u64::from(rs), ops, secs))
    }
}

async fn join_all(set: &mut tokio::task::JoinSet<io::Result<()>>) -> io::Result<()> {
    let mut result = Ok(());
    while let Some(r) = set.join_next().await {
        let r = r.map_err(io::Error::other).and_then(|r| r);
        if result.is_ok() {
            result = r;
        }
    }
    result
}

/// Runs every engine at every depth and reports each row through `report`
/// as soon as it is measured.
pub fn run(cfg: &Config, mut report: impl FnMut(&Row)) -> io::Result<Vec<Row>> {
    if cfg.size < u64::from(cfg.block_size) || cfg.rand_size == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "size must hold at least one block and rand_size must not be 0",
        ));
    }
    std::fs::create_dir_all(&cfg.dir)?;
    let mut rows = Vec::new();
    let mut push = |rows: &mut Vec<Row>, t: &Target, workload, depth, (bytes, ops, secs)| {
        let mb = bytes as f64 / 1e6 / secs;
        let row = Row {
            engine: t.engine.clone(),
            workload,
            depth,
            bytes,
            ops,
            secs,
            range_mb_s: (mb, mb),
        };
        report(&row);
        rows.push(row);
    };
    for &engine in &cfg.engines {
        for &depth in &cfg.depths {
            let depth = depth.max(1);
            let path = cfg.dir.join(format!("nk-file-bench-{engine:?}.dat"));
            let t = Target::open(engine, &path, cfg, depth)?;
            let w = t.seq(true, cfg, depth)?;
            if t.direct {
                push(&mut rows, &t, "seq write", depth, w);
                push(&mut rows, &t, "seq read", depth, t.seq(false, cfg, depth)?);
                push(&mut rows, &t, "rand read", depth, t.rand_reads(cfg, depth)?);
            } else {
                push(&mut rows, &t, "seq write (page cache)", depth, w);
                let synced = Instant::now();
                t.ctl.sync_data()?;
                let sync = synced.elapsed().as_secs_f64();
                push(
                    &mut rows,
                    &t,
                    "seq write + fdatasync",
                    depth,
                    (w.0, w.1, w.2 + sync),
                );
                t.drop_cache()?;
                push(
                    &mut rows,
                    &t,
                    "seq read (cold)",
                    depth,
                    t.seq(false, cfg, depth)?,
                );
                push(
                    &mut rows,
                    &t,
                    "seq read (warm)",
                    depth,
                    t.seq(false, cfg, depth)?,
                );
                t.drop_cache()?;
                push(
                    &mut rows,
                    &t,
                    "rand read (cold)",
                    depth,
                    t.rand_reads(cfg, depth)?,
                );
                push(
                    &mut rows,
                    &t,
                    "rand read (warm)",
                    depth,
                    t.rand_reads(cfg, depth)?,
                );
            }
            drop(t);
            std::fs::remove_file(&path)?;
        }
    }
    Ok(rows)
}

/// Combines repeated runs (each the rows of one [`run`], in the same order):
/// each row becomes the median run of its measurement, with the range of
/// all runs in [`Row::range_mb_s`].
pub fn median(runs: &[Vec<Row>]) -> Vec<Row> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    (0..first.len())
        .map(|i| {
            let mut same: Vec<&Row> = runs.iter().filter_map(|r| r.get(i)).collect();
            same.sort_by(|a, b| a.mb_per_s().total_cmp(&b.mb_per_s()));
            let lo = same.first().map_or(0.0, |r| r.mb_per_s());
            let hi = same.last().map_or(0.0, |r| r.mb_per_s());
            let mut row = same[same.len() / 2].clone();
            row.range_mb_s = (lo, hi);
            row
        })
        .collect()
}

/// All rows as a Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| engine | workload | in flight | MB/s | ops/s | MB/s range over runs |\n|---|---|---:|---:|---:|---:|\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {:.0} | {:.0} | {:.0}–{:.0} |\n",
            r.engine,
            r.workload,
            r.depth,
            r.mb_per_s(),
            r.ops_per_s(),
            r.range_mb_s.0,
            r.range_mb_s.1
        );
    }
    s
}

/// For each workload and depth: the first direct store engine against the
/// baseline (cold and warm where both exist), as a Markdown table.
pub fn comparison(rows: &[Row]) -> String {
    let new = rows
        .iter()
        .find(|r| r.engine != "baseline")
        .map(|r| r.engine.clone());
    let Some(new) = new else {
        return String::new();
    };
    let find = |engine: &str, workload: &str, depth| {
        rows.iter()
            .find(|r| r.engine == engine && r.workload == workload && r.depth == depth)
    };
    let mut s = format!(
        "| workload | in flight | {new} MB/s | baseline MB/s | ratio | {new} ops/s | baseline ops/s |\n|---|---:|---:|---:|---:|---:|---:|\n"
    );
    let mut depths: Vec<usize> = rows.iter().map(|r| r.depth).collect();
    depths.dedup();
    depths.sort_unstable();
    depths.dedup();
    let pairs: [(&str, &str, &str); 5] = [
        (
            "seq write",
            "seq write + fdatasync",
            "seq write vs buffered + fdatasync",
        ),
        (
            "seq read",
            "seq read (cold)",
            "seq read vs buffered, cold cache",
        ),
        (
            "seq read",
            "seq read (warm)",
            "seq read vs buffered, warm cache",
        ),
        (
            "rand read",
            "rand read (cold)",
            "rand read vs buffered, cold cache",
        ),
        (
            "rand read",
            "rand read (warm)",
            "rand read vs buffered, warm cache",
        ),
    ];
    for (ours, theirs, label) in pairs {
        for &d in &depths {
            let (Some(a), Some(b)) = (find(&new, ours, d), find("baseline", theirs, d)) else {
                continue;
            };
            s += &format!(
                "| {label} | {d} | {:.0} | {:.0} | {:.2}× | {:.0} | {:.0} |\n",
                a.mb_per_s(),
                b.mb_per_s(),
                a.mb_per_s() / b.mb_per_s(),
                a.ops_per_s(),
                b.ops_per_s()
            );
        }
    }
    s
}

/// The mode a store engine actually got on this machine (it may fall back).
pub fn detect(engine: Engine, dir: &Path) -> io::Result<Option<IoMode>> {
    let Some(io) = engine.file_io(1) else {
        return Ok(None);
    };
    std::fs::create_dir_all(dir)?;
    let path = dir.join("nk-file-bench-probe.dat");
    let m = FileMedium::create_with(&path, 1 << 20, &io).map_err(io::Error::other)?;
    let mode = m.mode();
    drop(m);
    std::fs::remove_file(&path)?;
    Ok(Some(mode))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_run_of_every_engine() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            dir: dir.path().to_path_buf(),
            size: 4 << 20,
            block_size: 1 << 20,
            rand_size: 4096,
            depths: vec![1, 3],
            rand_time: Duration::from_millis(20),
            engines: vec![
                Engine::UringDirect,
                Engine::UringDirectOnly,
                Engine::UringBuffered,
                Engine::ThreadsDirect,
                Engine::ThreadsBuffered,
                Engine::Baseline,
            ],
        };
        let mut seen = 0;
        let rows = run(&cfg, |_| seen += 1).unwrap();
        assert_eq!(rows.len(), seen);
        for r in &rows {
            assert!(r.ops > 0 && r.secs > 0.0, "{r:?}");
            if r.workload.starts_with("seq") {
                assert_eq!(r.bytes, 4 << 20, "{r:?}");
                assert_eq!(r.ops, 4, "{r:?}");
            }
        }
        assert!(rows.iter().any(|r| r.engine == "baseline"));
        let table = markdown(&rows);
        assert_eq!(table.lines().count(), rows.len() + 2);
        let m = median(&[rows.clone(), rows.clone(), rows.clone()]);
        assert_eq!(m.len(), rows.len());
        assert_eq!(m[0].range_mb_s, (rows[0].mb_per_s(), rows[0].mb_per_s()));
        let cmp = comparison(&rows);
        assert!(cmp.contains("seq write vs buffered + fdatasync"), "{cmp}");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "files are removed"
        );
        assert_eq!(
            detect(Engine::ThreadsBuffered, dir.path()).unwrap(),
            Some(IoMode::ThreadsBuffered)
        );
        assert_eq!(detect(Engine::Baseline, dir.path()).unwrap(), None);
    }
}
