//! Tier migration (`docs/tiering.md`): a DRAM class above its high
//! watermark sheds its coldest blocks to the file class, hot blocks come
//! back up, pinned nodes stay, `Client::policy` changes it all at runtime,
//! and readers and writers running meanwhile never see an error or a
//! wrong byte.

use crate::common;

use common::{blocks_of, config, pattern, start_with, Checkers, PutFile, TestCluster, BS};
use nodekernel_client::{Client, CreateOptions, NodeType};
use nodekernel_cluster::ByteSize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const HANG: Duration = Duration::from_secs(120);
const DRAM: u8 = 0;
const FILE: u8 = 1;

/// DRAM of `dram_blocks` blocks and a file class of 256 blocks, with the
/// given watermarks; heat halves only every 10 minutes, so the order of
/// accesses decides what is cold.
async fn tiered(dram_blocks: u64, high: u8, low: u8, shared_memory: bool) -> TestCluster {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dram_blocks * BS, 256 * BS, &dir);
    cfg.client.shared_memory = shared_memory;
    cfg.meta.high_watermark = high;
    cfg.meta.low_watermark = low;
    cfg.meta.heat_half_life_ms = 600_000;
    cfg.meta.move_rate = ByteSize(0);
    start_with(cfg, dir).await
}

/// (used, capacity) blocks of class `class`.
async fn class_use(c: &Client, class: u8) -> (u64, u64) {
    let st = c.status().await.unwrap();
    st.servers
        .iter()
        .filter(|s| s.class == class)
        .fold((0, 0), |(u, cap), s| {
            (u + s.used_blocks, cap + s.capacity_blocks)
        })
}

/// The classes of the blocks of `path`.
async fn classes_of(c: &Client, path: &str) -> Vec<u8> {
    blocks_of(c, path).await.iter().map(|b| b.class).collect()
}

/// Waits until `f` holds, asking every 50 ms; panics (naming `what`)
/// only after the hang timeout.
async fn wait_for<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let waited = tokio::time::timeout(HANG, async {
        while !f().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting for {what}");
}

async fn demoted_and_promoted(c: &Client) -> (u64, u64) {
    let st = c.status().await.unwrap();
    st.moves
        .iter()
        .fold((0, 0), |(d, p), m| (d + m.demoted, p + m.promoted))
}

/// A writer that keeps writing new Files of a block or so (the newest
/// four kept, older ones deleted) until `stop`, at least four; returns
/// what is left, to check.
fn rolling_writer(
    c: &Client,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> tokio::task::JoinHandle<Vec<(String, Vec<u8>)>> {
    let c = c.clone();
    tokio::spawn(async move {
        let mut written: Vec<(String, Vec<u8>)> = Vec::new();
        let mut n = 0u64;
        while !stop.load(Ordering::Acquire) || n < 4 {
            let p = format!("/d/w{n}");
            let data = pattern(seed + n, (BS + 77 * n) as usize);
            c.put_file(&p, &data).await;
            written.push((p, data));
            if written.len() > 4 {
                let (gone, _) = written.remove(0);
                c.delete(&gone, false).await.unwrap();
            }
            n += 1;
        }
        written
    })
}

/// Acceptance 1: write until DRAM passes its high watermark and keep
/// writing: DRAM sheds down to its low watermark, the coldest nodes move
/// down (a pinned one stays), new writes land in DRAM again, and every
/// byte reads back identical.
async fn dram_sheds_its_coldest_blocks(shared_memory: bool) {
    let t = tiered(16, 75, 50, shared_memory).await;
    let c = t.client.clone();
    c.mkdir("/d", false).await.unwrap();
    let mut files = Vec::new();
    // The coldest of all, but pinned.
    let pinned = pattern(99, 2 * BS as usize);
    let mut n = c
        .create(
            "/d/pinned",
            NodeType::File,
            CreateOptions {
                pinned: true,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    n.append(&pinned).await.unwrap();
    n.close().await.unwrap();
    files.push(("/d/pinned".to_string(), pinned));
    let mut i = 0u64;
    let mut passed_high = false;
    // Until DRAM passed 75 %, then four files more.
    let mut after_high = 0;
    while after_high < 4 {
        let p = format!("/d/f{i}");
        let data = pattern(i, 2 * BS as usize);
        c.put_file(&p, &data).await;
        files.push((p, data));
        i += 1;
        let (used, cap) = class_use(&c, DRAM).await;
        passed_high |= used * 100 > cap * 75;
        if passed_high {
            after_high += 1;
        }
        assert!(i < 100, "DRAM never passed its high watermark");
    }
    wait_for("DRAM down to its low watermark", || async {
        let (used, cap) = class_use(&c, DRAM).await;
        used * 100 <= cap * 50
    })
    .await;
    let (demoted, _) = demoted_and_promoted(&c).await;
    assert!(demoted > 0, "blocks were demoted");
    assert_eq!(
        classes_of(&c, "/d/f0").await,
        vec![FILE, FILE],
        "the coldest file moved down"
    );
    assert_eq!(
        classes_of(&c, "/d/pinned").await,
        vec![DRAM, DRAM],
        "a pinned node never moves"
    );
    // New writes land in DRAM again.
    let fresh = pattern(1000, 2 * BS as usize);
    c.put_file("/d/fresh", &fresh).await;
    files.push(("/d/fresh".to_string(), fresh));
    assert_eq!(classes_of(&c, "/d/fresh").await, vec![DRAM, DRAM]);
    for (p, data) in &files {
        assert_eq!(&c.get(p).await.unwrap(), data, "{p}");
    }
}

on_both_paths!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] dram_sheds_coldest => dram_sheds_its_coldest_blocks);

/// Acceptances 2 and 4: with migration held back (watermarks at 100 %),
/// DRAM fills; `Client::policy` lowers the watermarks at runtime and DRAM
/// sheds down to the new target while readers check every byte and a
/// writer keeps writing: zero errors, zero wrong bytes.
async fn policy_change_sheds_under_load(shared_memory: bool) {
    let t = tiered(24, 100, 100, shared_memory).await;
    let c = t.client.clone();
    c.mkdir("/d", false).await.unwrap();
    let mut files = Vec::new();
    for i in 0..10u64 {
        let p = format!("/d/f{i}");
        let data = pattern(i, (2 * BS + 100 * i) as usize);
        c.put_file(&p, &data).await;
        files.push((p, data));
    }
    let (used, cap) = class_use(&c, DRAM).await;
    assert!(used * 100 > cap * 60, "DRAM filled: {used}/{cap}");
    // Nothing moves at 100 %.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(demoted_and_promoted(&c).await, (0, 0));
    assert_eq!(class_use(&c, DRAM).await.0, used);

    let files = Arc::new(files);
    let readers = Checkers::start(&c, files.clone(), 2, 1, "migration");
    let writer = rolling_writer(&c, readers.stop.clone(), 500);
    let set = [
        ("high_watermark".to_string(), "40".to_string()),
        ("low_watermark".to_string(), "25".to_string()),
    ];
    let parts = c.policy(&set).await.unwrap();
    assert!(
        parts[0].contains(&("low_watermark".into(), "25".into())),
        "{parts:?}"
    );
    wait_for("blocks demoted under the new watermarks", || async {
        demoted_and_promoted(&c).await.0 >= 6
    })
    .await;
    let reads_during = readers.reads();
    readers.finish().await;
    let written = tokio::time::timeout(HANG, writer).await.unwrap().unwrap();
    assert!(reads_during > 0, "reads ran during the migration");
    // With the writer gone, DRAM settles under its new high watermark
    // (between the two it sheds only if it passed the high one since it
    // last reached the low one).
    wait_for("DRAM under its new high watermark", || async {
        let (used, cap) = class_use(&c, DRAM).await;
        used * 100 <= cap * 40
    })
    .await;
    for (p, data) in files.iter().chain(&written) {
        assert_eq!(&c.get(p).await.unwrap(), data, "{p} after the migration");
    }
}

on_both_paths!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] policy_change_sheds => policy_change_sheds_under_load);

/// Acceptance 3: with promotion on, a node read again and again on the
/// file class moves up to DRAM (there is room); one never read stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_node_on_the_file_class_is_promoted() {
    let t = tiered(32, 90, 75, true).await;
    let c = t.client.clone();
    let on_file = CreateOptions {
        storage_class: Some(FILE),
        ..Default::default()
    };
    let hot = pattern(1, 3 * BS as usize);
    let cold = pattern(2, 3 * BS as usize);
    for (p, data) in [("/hot", &hot), ("/cold", &cold)] {
        let mut n = c.create(p, NodeType::File, on_file.clone()).await.unwrap();
        n.append(data).await.unwrap();
        n.close().await.unwrap();
        assert_eq!(classes_of(&c, p).await, vec![FILE; 3]);
    }
    let parts = c
        .policy(&[
            ("promotion".into(), "on".into()),
            ("promote_after".into(), "8".into()),
        ])
        .await
        .unwrap();
    assert!(parts[0].contains(&("promotion".into(), "on".into())));
    // The migrator counts a batch of moves once the batch is done, after
    // their blocks switched: wait for the count too.
    wait_for("/hot promoted to DRAM", || async {
        assert_eq!(c.get("/hot").await.unwrap(), hot);
        classes_of(&c, "/hot").await == vec![DRAM; 3] && demoted_and_promoted(&c).await.1 >= 3
    })
    .await;
    assert_eq!(demoted_and_promoted(&c).await.1, 3);
    assert_eq!(
        classes_of(&c, "/cold").await,
        vec![FILE; 3],
        "never read: stays"
    );
    assert_eq!(c.get("/hot").await.unwrap(), hot);
    assert_eq!(c.get("/cold").await.unwrap(), cold);
}

/// A refused change names the key and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_policy_change_is_refused_whole() {
    let t = tiered(8, 90, 75, false).await;
    let c = t.client.clone();
    let before = c.policy(&[]).await.unwrap();
    let e = c
        .policy(&[
            ("high_watermark".into(), "80".into()),
            ("low_watermark".into(), "95".into()),
        ])
        .await
        .unwrap_err();
    assert_eq!(e.code, nodekernel_client::ErrorCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("low_watermark"), "{e}");
    assert_eq!(c.policy(&[]).await.unwrap(), before);
}

// ----- dynamic capacity -------------------------------------------------------

/// (exported, used) blocks of the server at `addr`.
async fn server_blocks(c: &Client, addr: &str) -> (u64, u64) {
    let st = c.status().await.unwrap();
    let s = st.servers.iter().find(|s| s.addr == addr).unwrap();
    (s.capacity_blocks, s.used_blocks)
}

/// Acceptance 2, the shrink: a DRAM server full of data is resized to a
/// quarter while readers check every byte and a writer keeps writing;
/// its blocks move to the file class, nothing is lost or wrong, and it
/// grows back.
async fn a_store_shrinks_under_load(shared_memory: bool) {
    let t = tiered(32, 100, 100, shared_memory).await;
    let c = t.client.clone();
    let dram = t.cluster.stores[0].advertised_addr().to_string();
    c.mkdir("/d", false).await.unwrap();
    let mut files = Vec::new();
    for i in 0..10u64 {
        let p = format!("/d/f{i}");
        let data = pattern(i, (2 * BS + 50 * i) as usize);
        c.put_file(&p, &data).await;
        files.push((p, data));
    }
    let (cap, used) = server_blocks(&c, &dram).await;
    assert_eq!(cap, 32);
    assert!(used > 20, "DRAM holds most of it: {used}");
    let files = Arc::new(files);
    let readers = Checkers::start(&c, files.clone(), 2, 1, "the shrink");
    let writer = rolling_writer(&c, readers.stop.clone(), 700);
    let target = c.resize_store(&dram, 8 * BS).await.unwrap();
    assert_eq!(target, 8 * BS);
    wait_for("the DRAM server down to 8 blocks", || async {
        server_blocks(&c, &dram).await.0 == 8
    })
    .await;
    let reads_during = readers.reads();
    readers.finish().await;
    let written = tokio::time::timeout(HANG, writer).await.unwrap().unwrap();
    assert!(reads_during > 0, "reads ran during the shrink");
    let (cap, used) = server_blocks(&c, &dram).await;
    assert_eq!(cap, 8);
    assert!(used <= 8, "{used} blocks in use on an 8-block server");
    for (p, data) in files.iter().chain(&written) {
        assert_eq!(&c.get(p).await.unwrap(), data, "{p} after the shrink");
    }
    // Back to its whole size (more than that is all of it).
    assert_eq!(c.resize_store(&dram, u64::MAX).await.unwrap(), 32 * BS);
    wait_for("the DRAM server back to 32 blocks", || async {
        server_blocks(&c, &dram).await.0 == 32
    })
    .await;
    let fresh = pattern(9999, BS as usize);
    c.put_file("/d/fresh", &fresh).await;
    assert_eq!(
        classes_of(&c, "/d/fresh").await,
        vec![DRAM],
        "it takes new blocks again"
    );
}

on_both_paths!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] store_shrinks => a_store_shrinks_under_load);

/// A memory source the test controls: the bytes the server may export.
#[derive(Debug)]
struct FakeMemory(AtomicU64);

impl nodekernel_store::capacity::MemorySource for FakeMemory {
    fn budget(&self, _exported: u64) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Dynamic capacity: a DRAM server following an (injected) memory source
/// shrinks when memory gets short, never below its minimum, and grows
/// again when memory comes back; data on it moves away first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_follows_the_memory_it_may_use() {
    // A file class only, then the dynamic DRAM server.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(0, 256 * BS, &dir);
    cfg.meta.migration = false;
    let t = start_with(cfg, dir).await;
    let c = t.client.clone();
    let memory = Arc::new(FakeMemory(AtomicU64::new(64 * BS)));
    let section = nodekernel_cluster::StoreSection {
        size: ByteSize(32 * BS),
        heartbeat_ms: 100,
        admin: String::new(),
        ..Default::default()
    };
    let meta = t.cluster.meta_addr().to_string();
    let mut scfg = t
        .cluster
        .config
        .store_config(9, &section, vec![meta])
        .unwrap();
    scfg.dynamic = Some(nodekernel_store::capacity::DynamicCapacity {
        min: 4 * BS,
        source: memory.clone(),
    });
    let store = nodekernel_store::StorageServer::start(scfg).await.unwrap();
    let addr = store.advertised_addr().to_string();
    wait_for(
        "the dynamic server registered, at its whole size",
        || async {
            c.status()
                .await
                .unwrap()
                .servers
                .iter()
                .any(|s| s.addr == addr && s.capacity_blocks == 32)
        },
    )
    .await;
    let data = pattern(5, (6 * BS) as usize);
    c.put_file("/on-dram", &data).await;
    assert_eq!(classes_of(&c, "/on-dram").await, vec![DRAM; 6]);
    // Memory gets short: 2 blocks' worth, below the 4-block minimum.
    memory.0.store(2 * BS, Ordering::Relaxed);
    wait_for("the server down to its minimum", || async {
        server_blocks(&c, &addr).await.0 == 4
    })
    .await;
    assert_eq!(c.get("/on-dram").await.unwrap(), data);
    assert!(server_blocks(&c, &addr).await.1 <= 4);
    // Memory comes back: 20 blocks' worth.
    memory.0.store(20 * BS, Ordering::Relaxed);
    wait_for("the server grown to 20 blocks", || async {
        server_blocks(&c, &addr).await.0 == 20
    })
    .await;
    assert_eq!(c.get("/on-dram").await.unwrap(), data);
    store.shutdown();
}
