//! Small values share blocks (docs/small-values.md), through a real
//! cluster, on both data paths: they fit where whole blocks would not,
//! a stale handle never reads a reused piece, churn gives space back, and
//! small and large values tier and read back alike.

use crate::admin::{scrape, sum};
use crate::common;

use common::pattern;
use futures::stream::{self, StreamExt};
use nodekernel_client::{Client, CreateOptions, ErrorCode, NodeType};
use nodekernel_cluster::ByteSize;

const MIB: u64 = 1 << 20;

fn table(enumerable: bool) -> CreateOptions {
    CreateOptions {
        enumerable,
        ..CreateOptions::default()
    }
}

/// Used blocks of storage class `class`.
async fn used_blocks(c: &Client, class: u8) -> u64 {
    let st = c.status().await.unwrap();
    st.servers
        .iter()
        .filter(|s| s.class == class)
        .map(|s| s.used_blocks)
        .sum()
}

/// A value that names itself, so a foreign one is detected.
fn value(key: u64, round: u64, len: usize) -> Vec<u8> {
    pattern(key << 32 | round, len)
}

/// The acceptance case: 100,000 values of 100 bytes in a DRAM class of
/// 32 MiB of 1 MiB blocks (with a block each, 32 would fit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_values_of_100_bytes_fit_in_32_mib_of_dram() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(32 * MIB, 0, &dir);
    cfg.meta.block_size = ByteSize(MIB);
    let t = common::start_with(cfg, dir).await;
    // Non-enumerable: this is about the values, not their records.
    t.client
        .create("/t", NodeType::Table, table(false))
        .await
        .unwrap();
    const N: u64 = 100_000;
    stream::iter(0..N)
        .for_each_concurrent(32, |i| {
            let c = t.client.clone();
            async move {
                c.put(&format!("/t/k{i}"), &value(i, 0, 100))
                    .await
                    .unwrap_or_else(|e| panic!("put {i}: {e}"));
            }
        })
        .await;
    // 9,362 pieces of 112 bytes to a slab: 11 blocks, and the root's
    // records.
    assert_eq!(used_blocks(&t.client, 0).await, 12);
    for i in (0..N).step_by(997) {
        assert_eq!(
            t.client.get(&format!("/t/k{i}")).await.unwrap(),
            value(i, 0, 100)
        );
    }
    t.cluster.shutdown();
}

on_both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_stale_handle_never_reads_a_reused_piece => stale_handles
);

/// Values in pieces of 12 KiB (their 8-byte tag included): five to a
/// 64 KiB slab, so a test fills one quickly.
const PIECE: usize = (12 << 10) - 8;

async fn stale_handles(shared_memory: bool) {
    assert_eq!(common::BS, 64 << 10, "five pieces to a slab");
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(4 * MIB, 0, &dir);
    cfg.client.shared_memory = shared_memory;
    // The test follows which piece each put takes: none is taken ahead.
    cfg.client.reserved_puts = 0;
    let t = common::start_with(cfg, dir).await;
    let c = &t.client;
    c.create("/t", NodeType::Table, table(true)).await.unwrap();
    c.put("/t/a", &value(1, 0, PIECE)).await.unwrap();
    c.put("/t/b", &value(2, 0, PIECE)).await.unwrap();
    let old_a = c.lookup("/t/a").await.unwrap();
    let held_b = c.lookup("/t/b").await.unwrap();
    let la = old_a.info().first_block.clone().unwrap();
    let lb = held_b.info().first_block.clone().unwrap();
    assert_eq!(
        (la.server, la.block),
        (lb.server, lb.block),
        "both in one slab"
    );
    assert_ne!(la.offset, lb.offset);

    // Deleted: a's handle gets `Stale` at once (its tag is cleared), from
    // the start of the value or inside it.
    c.delete("/t/a", false).await.unwrap();
    for (offset, len) in [(0, 100), (5000, 10)] {
        let e = old_a.read(offset, len).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Stale, "{e}");
    }
    // a's piece is quarantined: the slab's never-used pieces go first.
    for f in 0..3 {
        c.put(&format!("/t/f{f}"), &value(10 + f, 0, PIECE))
            .await
            .unwrap();
    }
    // The slab is full but for a's piece: c reuses it behind a fence.
    c.put("/t/c", &value(3, 0, PIECE - 7)).await.unwrap();
    let lc = c.lookup("/t/c").await.unwrap().info().first_block.clone();
    let lc = lc.unwrap();
    assert_eq!(
        (lc.block, lc.offset),
        (la.block, la.offset),
        "c took a's piece"
    );
    assert!(lc.gen > la.gen, "under a new generation");

    // a's handle: Stale, never c's bytes.
    let e = old_a.read(0, 100).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Stale, "{e}");
    // b's handle follows its value to the slab's new generation.
    assert_eq!(
        held_b.read(0, PIECE as u64).await.unwrap(),
        value(2, 0, PIECE)
    );
    assert_eq!(c.get("/t/c").await.unwrap(), value(3, 0, PIECE - 7));

    // Replacing a value: the old handle gets Stale at once, and after its
    // piece is reused.
    let old_c = c.lookup("/t/c").await.unwrap();
    c.put("/t/c", &value(3, 1, PIECE - 3)).await.unwrap();
    assert_eq!(old_c.read(0, 100).await.unwrap_err().code, ErrorCode::Stale);
    c.put("/t/d", &value(4, 0, PIECE)).await.unwrap();
    assert_eq!(old_c.read(0, 100).await.unwrap_err().code, ErrorCode::Stale);
    assert_eq!(c.get("/t/c").await.unwrap(), value(3, 1, PIECE - 3));
    assert_eq!(c.get("/t/d").await.unwrap(), value(4, 0, PIECE));
    for f in 0..3 {
        assert_eq!(
            c.get(&format!("/t/f{f}")).await.unwrap(),
            value(10 + f, 0, PIECE)
        );
    }
    common::assert_data_path(&t, c, shared_memory);
    t.cluster.shutdown();
}

on_both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    small_and_large_values_tier_churn_and_read_back => mixed_churn
);

/// Values of 1 B to 40 KiB (pieces) and 64–200 KiB (blocks) replaced and
/// deleted at random by several clients, in a DRAM class too small for
/// them all: every get returns the last value put, small values spill to
/// the file class once DRAM is full, and the space used stays bounded.
async fn mixed_churn(shared_memory: bool) {
    const KEYS: u64 = 64;
    const ROUNDS: u64 = 1500;
    let t = common::start_on_path(MIB, 64 * MIB, shared_memory).await;
    t.client
        .create("/t", NodeType::Table, table(true))
        .await
        .unwrap();
    let size = |key: u64, round: u64| -> usize {
        let r = (key * 7919 + round * 104_729) % 100;
        match r {
            0..=79 => 1 + (r as usize * 509) % (16 << 10),
            80..=89 => (16 << 10) + (r as usize * 997) % (24 << 10),
            _ => (64 << 10) + (r as usize * 7717) % (136 << 10),
        }
    };
    let mut peaks = Vec::new();
    let mut spilled = false;
    for window in 0..3 {
        let mut clients = Vec::new();
        for w in 0..4u64 {
            let c = t.cluster.client().await.unwrap();
            clients.push(tokio::spawn(async move {
                // Each writer owns the keys congruent to w: its last put of
                // a key is what a get must return.
                let mut last = std::collections::BTreeMap::new();
                for r in 0..ROUNDS / 4 {
                    let round = window * ROUNDS + r;
                    let key = (w + 4 * (round * 31 % (KEYS / 4))) % KEYS;
                    let path = format!("/t/k{key}");
                    if round % 7 == 3 {
                        match c.delete(&path, false).await {
                            Ok(_) => {}
                            Err(e) if e.code == ErrorCode::NotFound => {}
                            Err(e) => panic!("delete {path}: {e}"),
                        }
                        last.remove(&key);
                    } else {
                        let v = value(key, round, size(key, round));
                        c.put(&path, &v).await.unwrap();
                        last.insert(key, v);
                    }
                    if let Some((k, v)) = last.iter().nth((round % 5) as usize) {
                        let got = c.get(&format!("/t/k{k}")).await.unwrap();
                        assert!(got == *v, "key {k}: not the last value put");
                    }
                }
                (c, last)
            }));
        }
        let mut finals = Vec::new();
        for h in clients {
            let (c, last) = h.await.unwrap();
            common::assert_data_path(&t, &c, shared_memory);
            finals.push(last);
        }
        for last in &finals {
            for (k, v) in last {
                let node = t.client.lookup(&format!("/t/k{k}")).await.unwrap();
                let class = node.info().first_block.as_ref().map(|l| l.class);
                spilled |= v.len() < (16 << 10) && class == Some(1);
                assert_eq!(node.read(0, v.len() as u64).await.unwrap(), *v);
            }
        }
        // The window's clients are gone, and so are the puts they reserved.
        common::no_puts_in_progress(&t.client).await;
        peaks.push(used_blocks(&t.client, 0).await + used_blocks(&t.client, 1).await);
    }
    assert!(spilled, "some small value went to the file class");
    // 64 keys of at most 200 KiB need at most ~200 blocks of 64 KiB, plus
    // slabs and records; the space does not creep up window after window.
    assert!(
        peaks.iter().all(|p| *p <= peaks[0] + 16),
        "used blocks grew with churn: {peaks:?}"
    );
    // Deleting everything gives back every block but the records': the
    // root's block and the slabs holding the table's record pieces (64
    // keys of one slot each, and slots still being cleared under churn:
    // more than the first piece's 19, so two pieces or a few more, in
    // slabs of up to three sizes, in whichever class had room when each
    // was taken).
    for k in 0..KEYS {
        let _ = t.client.delete(&format!("/t/k{k}"), false).await;
    }
    let extents = t
        .client
        .lookup("/t")
        .await
        .unwrap()
        .block_locations()
        .await
        .unwrap();
    assert!(extents.len() >= 2, "{extents:?}");
    let slabs: std::collections::BTreeSet<(u32, u32)> =
        extents.iter().map(|e| (e.server, e.block)).collect();
    let left = used_blocks(&t.client, 0).await + used_blocks(&t.client, 1).await;
    assert!(
        left <= 1 + slabs.len() as u64,
        "{left} blocks still used after deleting everything (records in {} slabs)",
        slabs.len()
    );
    t.cluster.shutdown();
}

on_both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    out_of_space_small_values_get_no_space_and_earlier_ones_stay_intact => no_space
);

/// Out of space in all classes (`NoSpace`, `docs/small-values.md`): small values fill every
/// class, the next put gets `NoSpace` and leaves nothing behind, every
/// earlier value reads back intact, and a delete makes room again.
async fn no_space(shared_memory: bool) {
    // 4 blocks of 64 KiB, one of them the root's records: 3 slabs of 64
    // pieces of 1 KiB.
    let t = common::start_on_path(4 * common::BS, 0, shared_memory).await;
    let c = &t.client;
    c.create("/t", NodeType::Table, table(false)).await.unwrap();
    let mut stored = 0u64;
    let err = loop {
        match c
            .put(&format!("/t/k{stored}"), &value(stored, 0, 1000))
            .await
        {
            Ok(()) => stored += 1,
            Err(e) => break e,
        }
        assert!(stored <= 1000, "no NoSpace after {stored} values");
    };
    assert_eq!(err.code, ErrorCode::NoSpace, "{err}");
    assert_eq!(stored, 3 * 64);
    assert_eq!(
        c.lookup(&format!("/t/k{stored}")).await.unwrap_err().code,
        ErrorCode::NotFound,
        "the failed put left nothing"
    );
    for i in 0..stored {
        assert_eq!(c.get(&format!("/t/k{i}")).await.unwrap(), value(i, 0, 1000));
    }
    c.delete("/t/k7", false).await.unwrap();
    c.put("/t/again", &value(999, 0, 1000)).await.unwrap();
    assert_eq!(c.get("/t/again").await.unwrap(), value(999, 0, 1000));
    common::assert_data_path(&t, c, shared_memory);
    t.cluster.shutdown();
}

/// Records written while the small values that share their pieces' slabs
/// come and go: a record write refused because the slab was stamped
/// meanwhile asks the metadata server where the record is now
/// (`RecordAt`) and writes it there, so every key's record lands on the
/// data plane and listings need no names from the metadata server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_written_while_their_slabs_churn_all_land() {
    for shared_memory in [true, false] {
        let t = common::start_on_path(64 * MIB, 0, shared_memory).await;
        let meta = t.cluster.meta.admin_addr().expect("meta admin");
        let c = &t.client;
        c.create("/churn", NodeType::Table, table(true))
            .await
            .unwrap();
        // 600-byte values take 640-byte pieces: the size of a container's
        // first record piece, so they share its slabs, and replacing them
        // stamps those slabs now and then.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churners: Vec<_> = (0..3u64)
            .map(|j| {
                let (c, stop) = (c.clone(), stop.clone());
                tokio::spawn(async move {
                    let mut round = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        c.put(&format!("/churn/v{j}"), &value(j, round, 600))
                            .await
                            .unwrap();
                        round += 1;
                    }
                    round
                })
            })
            .collect();
        let (tables, keys) = (24u64, 24u64);
        stream::iter(0..tables)
            .for_each_concurrent(4, |i| async move {
                let dir = format!("/t{i}");
                c.create(&dir, NodeType::Table, table(true)).await.unwrap();
                for k in 0..keys {
                    c.put(&format!("{dir}/k{k}"), b"v").await.unwrap();
                }
            })
            .await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut replaced = 0;
        for ch in churners {
            replaced += ch.await.unwrap();
        }
        assert!(replaced > 0);
        for i in 0..tables {
            let mut names = c.enumerate(&format!("/t{i}")).await.unwrap();
            names.sort();
            let mut want: Vec<_> = (0..keys).map(|k| format!("k{k}")).collect();
            want.sort();
            assert_eq!(names, want, "/t{i} ({shared_memory})");
        }
        let m = scrape(meta).await;
        assert_eq!(
            sum(
                &m,
                "nodekernel_meta_requests_total",
                &[("op", "record_names")]
            ),
            0.0,
            "a record was missing ({shared_memory}; {replaced} values replaced meanwhile)"
        );
    }
}
