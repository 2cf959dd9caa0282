//! A real cluster for integration tests: one metadata server, one DRAM
//! storage server (class 0) and one file storage server (class 1), all on
//! port 0 in this process.

#![allow(dead_code)]

use nodekernel_client::Client;
use nodekernel_cluster::{ByteSize, Config, LocalCluster};
use tempfile::TempDir;

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
    cfg.meta.dead_after_ms = 600;
    cfg.client.timeout_ms = 2_000;
    cfg.up.data_dir = dir.path().to_path_buf();
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

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand::rngs::SmallRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}
