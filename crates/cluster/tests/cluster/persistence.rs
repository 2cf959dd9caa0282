//! A persistent metadata server restarted under running storage servers
//! (`docs/persistence.md`): everything closed before the
//! restart is back, byte for byte, enumeration is exact, writers are
//! forgotten (a File open for writing keeps its last synced size; a put
//! that never closed is gone), and the cluster takes new work at once.

use crate::common;

use common::TestCluster;
use common::{pattern, BS};
use nodekernel_client::{Client, CreateOptions, ErrorCode, NodeType};
use nodekernel_cluster::config::FsyncMode;
use nodekernel_cluster::Config;
use nodekernel_meta::{MetaConfig, MetaServer};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A cluster whose metadata server keeps its log in `<data dir>/meta`.
async fn persistent(dram: u64, tweak: impl FnOnce(&mut Config)) -> TestCluster {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(dram, 0, &dir);
    cfg.meta.persistence = true;
    tweak(&mut cfg);
    common::start_with(cfg, dir).await
}

/// Stops the metadata server and returns the settings to start it again
/// on the same address and directory.
pub(crate) fn stop_meta(t: &TestCluster) -> MetaConfig {
    let addr = t.cluster.meta_addr();
    t.cluster.meta.shutdown();
    let mut cfg = t.cluster.config.meta_config().unwrap();
    cfg.listen = addr.to_string();
    cfg.persistence = t
        .cluster
        .config
        .meta_persistence(Some(&t.cluster.data_dir().join("meta")));
    assert!(cfg.persistence.is_some());
    cfg
}

/// Stops the metadata server and starts it again on the same address and
/// directory, with `fsync`.
async fn restart_meta(t: &mut TestCluster, fsync: FsyncMode) {
    t.cluster.config.meta.fsync = fsync;
    let cfg = stop_meta(t);
    t.cluster.meta = MetaServer::start(cfg).await.expect("restarts");
}

/// The log's segments.
fn segments(data: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(data.join("meta/journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect()
}

fn checkpoint(data: &Path) -> Option<PathBuf> {
    nodekernel_meta::checkpoint::newest(&data.join("meta"))
}

async fn sorted(c: &Client, p: &str) -> Vec<String> {
    let mut v = c.enumerate(p).await.unwrap();
    v.sort();
    v
}

/// What a client expects to find: path → bytes.
type Expected = BTreeMap<String, Vec<u8>>;

async fn check(c: &Client, want: &Expected) {
    for (p, bytes) in want {
        let got = c
            .get(p)
            .await
            .unwrap_or_else(|e| panic!("{p} after the restart: {e}"));
        assert!(got == *bytes, "{p}: other bytes after the restart");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_metadata_server_keeps_what_was_closed() {
    let mut t = persistent(256 * BS, |c| c.client.shared_memory = false).await;
    let c = t.client.clone();
    let mut want = Expected::new();

    c.mkdir("/d/sub", true).await.unwrap();
    c.create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    // Files of several blocks, one renamed, one deleted.
    for (i, len) in [(0u64, 3 * BS as usize + 17), (1, 10), (2, 0), (3, 5000)] {
        let p = format!("/d/f{i}");
        let mut n = c
            .create(&p, NodeType::File, CreateOptions::default())
            .await
            .unwrap();
        let bytes = pattern(i, len);
        n.append(&bytes).await.unwrap();
        n.close().await.unwrap();
        want.insert(p, bytes);
    }
    c.rename("/d/f1", "/d/sub/moved").await.unwrap();
    let moved = want.remove("/d/f1").unwrap();
    want.insert("/d/sub/moved".into(), moved);
    c.delete("/d/f3", false).await.unwrap();
    want.remove("/d/f3");
    // KeyValues: small and large, some replaced, some deleted.
    for i in 0..40u64 {
        let len = if i % 10 == 0 { 2 * BS as usize } else { 100 };
        let v = pattern(100 + i, len);
        c.put(&format!("/t/k{i}"), &v).await.unwrap();
        want.insert(format!("/t/k{i}"), v);
    }
    for i in 0..10u64 {
        let v = pattern(200 + i, 300);
        c.put(&format!("/t/k{i}"), &v).await.unwrap();
        want.insert(format!("/t/k{i}"), v);
    }
    for i in 30..35u64 {
        c.delete(&format!("/t/k{i}"), false).await.unwrap();
        want.remove(&format!("/t/k{i}"));
    }
    // A File still open for writing: synced at 1000 bytes, then more.
    let mut open = c
        .create("/d/open", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    let synced = pattern(300, 1000);
    open.append(&synced).await.unwrap();
    open.sync().await.unwrap();
    open.append(&pattern(301, 2 * BS as usize)).await.unwrap();
    // A put that never closed.
    let mut unclosed = c
        .create("/t/unclosed", NodeType::KeyValue, CreateOptions::default())
        .await
        .unwrap();
    unclosed.append(b"never published").await.unwrap();
    let used_before = used_blocks(&c).await;

    restart_meta(&mut t, FsyncMode::Always).await;
    let c = t.cluster.client().await.unwrap();
    check(&c, &want).await;
    assert_eq!(sorted(&c, "/d").await, ["f0", "f2", "open", "sub"]);
    assert_eq!(sorted(&c, "/d/sub").await, ["moved"]);
    let keys: Vec<String> = want
        .keys()
        .filter_map(|k| k.strip_prefix("/t/"))
        .map(str::to_string)
        .collect();
    assert_eq!(sorted(&c, "/t").await, keys);
    assert_eq!(
        c.lookup("/t/unclosed").await.err().map(|e| e.code),
        Some(ErrorCode::NotFound)
    );
    // The unclosed put's block is free again, and so are the open File's
    // blocks (its writer's lease lapsed): its 1000 synced bytes are in the
    // piece its first write took, which it outgrew but never published
    // (nothing else changed).
    assert_eq!(used_blocks(&c).await, used_before - 1 - 3);
    // The open File: its last synced size and bytes; its old writer is
    // gone, so a new one gets it at once.
    assert_eq!(c.get("/d/open").await.unwrap(), synced);
    let mut again = c.open_write("/d/open").await.unwrap();
    again.append(b"after").await.unwrap();
    again.close().await.unwrap();
    let mut grown = synced.clone();
    grown.extend_from_slice(b"after");
    want.insert("/d/open".into(), grown);

    // New work after the restart, then a second restart (its log now
    // holds the first restart's own records) with another policy.
    for i in 0..20u64 {
        let v = pattern(400 + i, 64);
        c.put(&format!("/t/new{i}"), &v).await.unwrap();
        want.insert(format!("/t/new{i}"), v);
    }
    restart_meta(&mut t, FsyncMode::Interval).await;
    let c = t.cluster.client().await.unwrap();
    check(&c, &want).await;
    assert_eq!(
        sorted(&c, "/t").await.len(),
        want.keys().filter(|k| k.starts_with("/t/")).count()
    );
    t.cluster.shutdown();
}

async fn used_blocks(c: &Client) -> u64 {
    c.status()
        .await
        .unwrap()
        .servers
        .iter()
        .map(|s| s.used_blocks)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_log_stops_the_start_naming_the_file() {
    let t = persistent(16 * BS, |_| {}).await;
    for i in 0..20 {
        t.client.mkdir(&format!("/d{i}"), false).await.unwrap();
    }
    let cfg = stop_meta(&t);
    let seg = segments(t.cluster.data_dir()).pop().unwrap();
    let mut data = std::fs::read(&seg).unwrap();
    let mid = data.len() / 2;
    data[mid] ^= 0xff;
    std::fs::write(&seg, &data).unwrap();
    let err = MetaServer::start(cfg).await.err().expect("refused");
    let msg = err.to_string();
    assert!(msg.contains(&seg.display().to_string()), "{msg}");
    assert!(msg.contains("damaged"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_from_a_checkpoint_and_the_log_after_it() {
    let mut t = persistent(64 * BS, |_| {}).await;
    let c = t.client.clone();
    let mut want = Expected::new();
    c.create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    for i in 0..200u64 {
        let v = pattern(i, 50 + i as usize);
        c.put(&format!("/t/k{i}"), &v).await.unwrap();
        want.insert(format!("/t/k{i}"), v);
    }
    let data = t.cluster.data_dir().to_path_buf();
    let stats = t.cluster.meta.checkpoint().await.unwrap().expect("written");
    // Status shows the log, the checkpoint, and the policy.
    let logs = c.status().await.unwrap().logs;
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert_eq!(logs[0].fsync, "always");
    assert_eq!(logs[0].checkpoint, stats.covered);
    assert!(logs[0].records >= stats.covered, "{logs:?}");
    assert!(stats.nodes >= 202, "{stats:?}");
    assert!(checkpoint(&data).is_some());
    assert_eq!(
        segments(&data).len(),
        1,
        "the log before the checkpoint is gone"
    );
    // Changes after it: the log's tail.
    for i in 0..50u64 {
        c.delete(&format!("/t/k{i}"), false).await.unwrap();
        want.remove(&format!("/t/k{i}"));
    }
    for i in 200..260u64 {
        let v = pattern(i, 70);
        c.put(&format!("/t/k{i}"), &v).await.unwrap();
        want.insert(format!("/t/k{i}"), v);
    }
    restart_meta(&mut t, FsyncMode::Always).await;
    let c = t.cluster.client().await.unwrap();
    check(&c, &want).await;
    assert_eq!(sorted(&c, "/t").await.len(), want.len());
    // A damaged checkpoint stops the next start, naming the file.
    t.cluster.meta.checkpoint().await.unwrap().expect("written");
    let cfg = stop_meta(&t);
    let file = checkpoint(&data).unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    // Damage in the middle of the file (redb would panic on such a page):
    // the checksum in the file's name catches it before redb reads it.
    let n = bytes.len();
    for b in &mut bytes[n / 3..n / 3 + 64] {
        *b ^= 0x5a;
    }
    std::fs::write(&file, &bytes).unwrap();
    let err = MetaServer::start(cfg).await.err().expect("refused");
    let msg = err.to_string();
    assert!(msg.contains(&file.display().to_string()), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_are_written_as_the_log_grows() {
    let t = persistent(16 * BS, |c| {
        c.meta.checkpoint_after = nodekernel_cluster::ByteSize(16 << 10);
        // The ticker runs every dead_after_ms / 4.
        c.meta.dead_after_ms = 2_000;
    })
    .await;
    let data = t.cluster.data_dir().to_path_buf();
    for i in 0..300 {
        t.client.mkdir(&format!("/d{i}"), false).await.unwrap();
    }
    // Only a hang catcher: the ticker writes one within a few periods.
    let start = std::time::Instant::now();
    while checkpoint(&data).is_none() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "no checkpoint was written"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A log that lost its records: its only segment cut to its header,
/// emptied, cut to 10 bytes, or removed. The start is refused, naming the
/// file, the damage and the way out, and changes no file (a second start
/// is refused the same way); removing `log-floor`, the documented way to
/// accept the loss, lets it start with what is left. A fresh directory
/// starts and a normal restart keeps everything, as always.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_lost_its_records_stops_the_start() {
    type Damage = fn(&Path);
    fn cut_to(seg: &Path, n: u64) {
        let f = std::fs::OpenOptions::new().write(true).open(seg).unwrap();
        f.set_len(n).unwrap();
    }
    let damages: [(&str, Damage, &str); 4] = [
        ("header only", |s| cut_to(s, 24), "holds only its header"),
        ("empty", |s| cut_to(s, 0), "is empty"),
        ("10 bytes", |s| cut_to(s, 10), "is 10 bytes long"),
        (
            "removed",
            |s| std::fs::remove_file(s).unwrap(),
            "holds no segment",
        ),
    ];
    for (name, damage, says) in damages {
        // A fresh directory starts.
        let mut t = persistent(16 * BS, |_| {}).await;
        for i in 0..5 {
            t.client.mkdir(&format!("/d{i}"), false).await.unwrap();
        }
        let nodes = t.cluster.meta.with_state(|st| st.ns().len());
        // A normal restart keeps everything.
        restart_meta(&mut t, FsyncMode::Always).await;
        assert_eq!(t.cluster.meta.with_state(|st| st.ns().len()), nodes);
        let c = t.cluster.client().await.unwrap();
        assert_eq!(sorted(&c, "/").await, ["d0", "d1", "d2", "d3", "d4"]);

        let cfg = stop_meta(&t);
        let data = t.cluster.data_dir().to_path_buf();
        let seg = segments(&data).pop().unwrap();
        damage(&seg);
        let listing = |p: &Path| {
            let mut v: Vec<_> = std::fs::read_dir(p)
                .unwrap()
                .map(|e| {
                    let e = e.unwrap();
                    (e.file_name(), e.metadata().unwrap().len())
                })
                .collect();
            v.sort();
            v
        };
        let before = listing(&data.join("meta/journal"));
        for _ in 0..2 {
            let err = MetaServer::start(cfg.clone())
                .await
                .err()
                .unwrap_or_else(|| panic!("{name}: a log without its records started"));
            let msg = err.to_string();
            let file = if name == "removed" {
                data.join("meta/journal")
            } else {
                seg.clone()
            };
            for part in [
                file.display().to_string(),
                says.to_string(),
                data.join("meta/log-floor").display().to_string(),
            ] {
                assert!(msg.contains(&part), "{name}: {part:?} not in {msg}");
            }
            assert_eq!(listing(&data.join("meta/journal")), before, "{name}");
        }
        // The way out: accept the loss.
        std::fs::remove_file(data.join("meta/log-floor")).unwrap();
        t.cluster.meta = MetaServer::start(cfg)
            .await
            .expect("starts with what is left");
        assert!(
            t.cluster.meta.with_state(|st| st.ns().len()) < nodes,
            "{name}"
        );
        t.cluster.shutdown();
    }
}

/// The floor follows the synced log (the ticker writes it): records
/// acknowledged after a checkpoint are demanded too, so a log cut back to
/// the checkpoint, losing the changes after it, is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_after_a_checkpoint_are_demanded_too() {
    let t = persistent(16 * BS, |c| {
        // The ticker runs every dead_after_ms / 4.
        c.meta.dead_after_ms = 2_000;
    })
    .await;
    let data = t.cluster.data_dir().to_path_buf();
    for i in 0..10 {
        t.client.mkdir(&format!("/a{i}"), false).await.unwrap();
    }
    let stats = t.cluster.meta.checkpoint().await.unwrap().expect("written");
    for i in 0..10 {
        t.client.mkdir(&format!("/b{i}"), false).await.unwrap();
    }
    // Only a hang catcher: the ticker writes the floor within a few periods.
    let start = std::time::Instant::now();
    while nodekernel_meta::floor::read(&data.join("meta")) < stats.covered + 10 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "the floor never followed the log"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let cfg = stop_meta(&t);
    let seg = segments(&data).pop().unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&seg).unwrap();
    f.set_len(24).unwrap();
    let err = MetaServer::start(cfg).await.err().expect("refused");
    let msg = err.to_string();
    assert!(msg.contains(&seg.display().to_string()), "{msg}");
    assert!(
        msg.contains(&format!("ends at record {}", stats.covered)),
        "{msg}"
    );
}

/// Expiry times are durable (`docs/lifecycle.md`): one kept in a
/// checkpoint and one in the log's tail come back with the same time, a
/// child TTL with its container, and what expires while the server is
/// down is gone once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_times_survive_a_restart() {
    use nodekernel_client::Ttl;
    use std::time::Duration;
    let mut t = persistent(64 * BS, |_| {}).await;
    let c = t.client.clone();
    let hour = |ms| CreateOptions {
        ttl: Some(Ttl::After(Duration::from_millis(ms))),
        child_ttl: Some(Duration::from_secs(60)),
        ..CreateOptions::default()
    };
    let long = c
        .create("/long", NodeType::Directory, hour(3_600_000))
        .await
        .unwrap();
    c.create("/short", NodeType::Directory, hour(1_000))
        .await
        .unwrap();
    t.cluster.meta.checkpoint().await.unwrap().expect("written");
    // In the log's tail, after the checkpoint.
    let tail = c
        .create("/tail", NodeType::Directory, hour(3_600_000))
        .await
        .unwrap();
    let child = c
        .create("/long/child", NodeType::Directory, CreateOptions::default())
        .await
        .unwrap();
    restart_meta(&mut t, FsyncMode::Always).await;
    let c = t.cluster.client().await.unwrap();
    for (p, before) in [("/long", &long), ("/tail", &tail), ("/long/child", &child)] {
        let now = c.lookup(p).await.unwrap();
        assert!(before.info().expires_ms > 0, "{p}");
        assert_eq!(now.info().expires_ms, before.info().expires_ms, "{p}");
        assert_eq!(now.info().child_ttl_ms, before.info().child_ttl_ms, "{p}");
    }
    assert_eq!(c.lookup("/long").await.unwrap().info().child_ttl_ms, 60_000);
    let start = std::time::Instant::now();
    while c.lookup("/short").await.is_ok() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "/short never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(c.lookup("/long").await.is_ok());
}
