//! A real cluster for integration tests: one metadata server, one DRAM
//! storage server (class 0) and one file storage server (class 1), all on
//! port 0 in this process.

#![allow(dead_code, unused_macros)]

use nodekernel_client::{Client, CreateOptions, NodeType};
use nodekernel_cluster::{ByteSize, Config, LocalCluster};
use tempfile::TempDir;

/// Runs `$body(shared_memory: bool)` as two tests, `$name::shared_memory`
/// (clients map the co-located DRAM server) and `$name::network` (every
/// block over the network): every rule must hold on both paths.
/// `main.rs` declares `#[macro_use] mod common;`, so every test module has it.
macro_rules! on_both_paths {
    ($(#[$attr:meta])* $name:ident => $body:ident) => {
        mod $name {
            $(#[$attr])*
            async fn shared_memory() {
                super::$body(true).await
            }
            $(#[$attr])*
            async fn network() {
                super::$body(false).await
            }
        }
    };
}

pub struct TestCluster {
    pub cluster: LocalCluster,
    pub client: Client,
    pub dir: TempDir,
}

/// Block size used by the tests: small, so modest files span many blocks.
pub const BS: u64 = 64 << 10;

pub fn config(dram: u64, file: u64, dir: &TempDir) -> Config {
    let mut cfg = Config::default();
    cfg.meta.listen = "127.0.0.1:0".into();
    cfg.meta.block_size = ByteSize(BS);
    // Every bound only catches a hang, so a loaded machine (slow
    // heartbeats, slow copies) cannot fail a test; tests of timeouts and of
    // dead servers set their own.
    cfg.meta.dead_after_ms = 600_000;
    cfg.meta.retire_after_ms = 600_000;
    cfg.meta.claim_timeout_ms = 120_000;
    cfg.client.timeout_ms = 120_000;
    cfg.up.data_dir = Some(dir.path().to_path_buf());
    cfg.up.dram = ByteSize(dram);
    cfg.up.file = ByteSize(file);
    cfg
}

pub async fn start_with(cfg: Config, dir: TempDir) -> TestCluster {
    let mut cfg = cfg;
    for s in &mut cfg.store {
        s.heartbeat_ms = 100;
    }
    if cfg.store.is_empty() {
        cfg.store = cfg.up_stores();
        for s in &mut cfg.store {
            s.heartbeat_ms = 100;
        }
    }
    let cluster = LocalCluster::start(cfg).await.expect("cluster starts");
    let client = cluster.client().await.expect("client connects");
    TestCluster {
        cluster,
        client,
        dir,
    }
}

/// DRAM of `dram` bytes and a file tier of `file` bytes.
pub async fn start(dram: u64, file: u64) -> TestCluster {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config(dram, file, &dir);
    start_with(cfg, dir).await
}

/// Like [`start`], with clients that map the co-located DRAM server
/// (`shared_memory`) or reach every server over the network.
pub async fn start_on_path(dram: u64, file: u64, shared_memory: bool) -> TestCluster {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = config(dram, file, &dir);
    cfg.client.shared_memory = shared_memory;
    start_with(cfg, dir).await
}

/// Checks that `client` moved DRAM blocks on the path it was configured
/// for: through the mapping of the DRAM server (and only its blocks), or
/// only over the network.
pub fn assert_data_path(t: &TestCluster, client: &Client, shared_memory: bool) {
    let stats = client.data_path_stats();
    let dram = t
        .cluster
        .stores
        .iter()
        .find(|s| s.shared_memory_name().is_some())
        .map(|s| s.advertised_addr().to_string());
    if shared_memory {
        let dram = dram.expect("a DRAM server sharing its memory");
        assert!(client.is_colocated(&dram), "DRAM server {dram} is mapped");
        assert!(
            stats.mapped_reads > 0 && stats.mapped_writes > 0,
            "the mapping was used: {stats:?}"
        );
        for s in &t.cluster.stores {
            if s.shared_memory_name().is_none() {
                assert!(
                    !client.is_colocated(s.advertised_addr()),
                    "file tier is not mapped"
                );
            }
        }
    } else {
        assert_eq!(
            (stats.mapped_reads, stats.mapped_writes),
            (0, 0),
            "shared memory off: network only"
        );
        assert!(
            stats.network_reads > 0 && stats.network_writes > 0,
            "{stats:?}"
        );
        for s in &t.cluster.stores {
            assert!(!client.is_colocated(s.advertised_addr()));
        }
    }
}

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand::rngs::SmallRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

/// Writes a whole File and closes it.
pub trait PutFile {
    async fn put_file(&self, path: &str, data: &[u8]);
}

impl PutFile for Client {
    async fn put_file(&self, path: &str, data: &[u8]) {
        let mut n = self
            .create(path, NodeType::File, CreateOptions::default())
            .await
            .unwrap();
        n.append(data).await.unwrap();
        n.close().await.unwrap();
    }
}

/// Readers that get `files` round and round and check every byte, until
/// stopped: the verifier of the tests that move blocks under load.
pub struct Checkers {
    pub stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    reads: std::sync::Arc<std::sync::atomic::AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Checkers {
    /// `n` readers, reader `r` starting at file `r` and going `step` on;
    /// `during` names what runs meanwhile, for the failure messages.
    pub fn start(
        c: &Client,
        files: std::sync::Arc<Vec<(String, Vec<u8>)>>,
        n: usize,
        step: usize,
        during: &'static str,
    ) -> Checkers {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let reads = std::sync::Arc::new(AtomicU64::new(0));
        let tasks = (0..n)
            .map(|r| {
                let (c, stop, reads, files) =
                    (c.clone(), stop.clone(), reads.clone(), files.clone());
                tokio::spawn(async move {
                    let mut i = r;
                    while !stop.load(Ordering::Acquire) {
                        let (p, data) = &files[i % files.len()];
                        let got = c
                            .get(p)
                            .await
                            .unwrap_or_else(|e| panic!("reading {p} during {during}: {e}"));
                        assert!(got == *data, "{p}: wrong bytes during {during}");
                        reads.fetch_add(1, Ordering::Relaxed);
                        i += step;
                    }
                })
            })
            .collect();
        Checkers { stop, reads, tasks }
    }

    /// Reads checked so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stops the readers (and whatever else watches `stop`) and waits for
    /// them; a reader's failure fails the test here.
    pub async fn finish(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        for t in self.tasks {
            tokio::time::timeout(std::time::Duration::from_secs(120), t)
                .await
                .expect("a reader hangs")
                .unwrap();
        }
    }
}

/// Where the blocks of `path` are.
pub async fn blocks_of(c: &Client, path: &str) -> Vec<nodekernel_client::BlockLoc> {
    c.lookup(path)
        .await
        .unwrap()
        .block_locations()
        .await
        .unwrap()
}

/// Waits until the metadata server has no put in progress or reserved,
/// failing only if that hangs: the puts that clients reserved ahead of
/// their keys are given back when the clients are dropped (in the
/// background), and only then are their pieces free
/// (`docs/small-values.md`).
pub async fn no_puts_in_progress(c: &Client) {
    let waited = tokio::time::timeout(std::time::Duration::from_secs(120), async {
        loop {
            let st = c.status().await.unwrap();
            if st.puts_in_progress + st.reserved_puts == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
    waited.expect("the puts in progress of clients that are gone end");
}

/// Blocks in use on every storage server, as the metadata server counts
/// them.
pub async fn used_blocks(c: &Client) -> u64 {
    let st = c.status().await.unwrap();
    st.servers.iter().map(|s| s.used_blocks).sum()
}

/// Waits until nothing is at `p` (each lookup is a request, before which
/// the metadata server removes what expired or lost its session); the
/// bound only catches a hang.
pub async fn until_gone(c: &Client, p: &str) {
    let start = std::time::Instant::now();
    loop {
        match c.lookup(p).await {
            Err(e) if e.code == nodekernel_client::ErrorCode::NotFound => return,
            Err(e) => panic!("{p}: {e}"),
            Ok(_) => {}
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "{p} is still there"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
