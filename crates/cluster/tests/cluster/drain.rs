//! Draining a storage server (`Client::drain`, `nk drain`): every block it
//! holds moves to other servers while clients keep reading and writing,
//! readers are never given wrong bytes, and the drained server ends empty.

use crate::common;

use common::{blocks_of, config, pattern, start_with, Checkers, PutFile, TestCluster, BS};
use nodekernel_client::{
    drain_finished, Client, CreateOptions, DrainState, DrainStatus, ErrorCode, NodeType,
};
use nodekernel_cluster::{ByteSize, StoreSection};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

const HANG: Duration = Duration::from_secs(120);

/// Two DRAM servers of `dram` bytes each, and a file tier of `file` bytes
/// (none when 0).
async fn two_dram(dram: u64, file: u64, shared_memory: bool) -> TestCluster {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dram, file, &dir);
    // About 30 blocks a second: drains last long enough for the workload
    // to run through them.
    cfg.meta.move_rate = ByteSize(30 * BS);
    cfg.client.shared_memory = shared_memory;
    let mut stores = cfg.up_stores();
    let second = StoreSection {
        size: ByteSize(dram),
        ..stores[0].clone()
    };
    stores.insert(1, second);
    cfg.store = stores;
    cfg.meta.expect_servers = Some(cfg.store.len() as u32);
    start_with(cfg, dir).await
}

/// Used blocks of the server at `addr`, and whether it is draining.
async fn used(c: &Client, addr: &str) -> (u64, bool) {
    let st = c.status().await.unwrap();
    let s = st.servers.iter().find(|s| s.addr == addr).unwrap();
    (s.used_blocks, s.draining)
}

/// Asks for the drain's progress until it is finished.
async fn drain_to_end(c: &Client, server: &str) -> Vec<DrainStatus> {
    tokio::time::timeout(HANG, async {
        loop {
            let parts = c.drain(server, false).await.unwrap();
            if drain_finished(&parts) {
                return parts;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the drain ends")
}

/// Acceptance 4 of the cluster issue: `drain` under a concurrent
/// read/write workload gives zero read errors, every byte is right
/// afterwards, and the drained server ends with 0 used blocks. Only DRAM
/// servers here, so the directories' child records, the Table's and every
/// value are on them too, and move with the data.
async fn drain_under_workload(shared_memory: bool) {
    let t = two_dram(8 << 20, 0, shared_memory).await;
    let c = t.client.clone();
    let a = t.cluster.stores[0].advertised_addr().to_string();
    c.mkdir("/d", false).await.unwrap();
    c.create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    // Files of several blocks and values larger than a block, written
    // before the drain.
    let mut files = Vec::new();
    for i in 0..12u64 {
        let data = pattern(i, (3 * BS + 777 * i) as usize);
        c.put_file(&format!("/d/f{i}"), &data).await;
        files.push((format!("/d/f{i}"), data));
    }
    for i in 0..6u64 {
        let data = pattern(100 + i, (BS + 1000 * i) as usize);
        c.put(&format!("/t/k{i}"), &data).await.unwrap();
        files.push((format!("/t/k{i}"), data));
    }
    // Small values, which share blocks (slabs).
    for i in 0..20u64 {
        let data = pattern(200 + i, 40 + 13 * i as usize);
        c.put(&format!("/t/s{i}"), &data).await.unwrap();
        files.push((format!("/t/s{i}"), data));
    }
    let (before, _) = used(&c, &a).await;
    assert!(before > 10, "the server to drain holds blocks: {before}");
    // A handle opened before the drain, read after it: redirected.
    let old = c.lookup("/d/f3").await.unwrap();

    let files = Arc::new(files);
    let readers = Checkers::start(&c, files.clone(), 2, 3, "the drain");
    let stop = readers.stop.clone();
    // A writer: new files (from the other server only: the drained one
    // takes no new blocks) and replaced values.
    let writer = {
        let (c, stop) = (c.clone(), stop.clone());
        tokio::spawn(async move {
            let mut written = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) || n < 4 {
                let p = format!("/d/n{n}");
                let data = pattern(1000 + n, (BS + 333 * n) as usize);
                c.put_file(&p, &data).await;
                written.push((p, data));
                let key = format!("/t/w{}", n % 3);
                // Large and small values in turn.
                let len = if n.is_multiple_of(2) {
                    BS + 10
                } else {
                    100 + n
                };
                let data = pattern(2000 + n, len as usize);
                c.put(&key, &data).await.unwrap();
                written.retain(|(q, _)| *q != key);
                written.push((key, data));
                // Keep the cluster from filling up on a slow machine.
                if n >= 6 {
                    let gone = format!("/d/n{}", n - 6);
                    c.delete(&gone, false).await.unwrap();
                    written.retain(|(q, _)| *q != gone);
                }
                n += 1;
            }
            written
        })
    };

    let parts = c.drain(&a, false).await.unwrap();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0].addr, a);
    let parts = drain_to_end(&c, &a).await;
    let reads_during = readers.reads();
    readers.finish().await;
    let written = tokio::time::timeout(HANG, writer).await.unwrap().unwrap();

    let p = &parts[0];
    assert_eq!(p.state, DrainState::Done, "{p:?}");
    assert_eq!(p.used_blocks, 0, "{p:?}");
    assert!(p.moved_blocks >= before, "{p:?} (held {before} blocks)");
    assert_eq!(p.unmovable, 0, "{p:?}");
    assert!(reads_during > 0, "reads ran during the drain");
    let (after, draining) = used(&c, &a).await;
    assert_eq!((after, draining), (0, true), "the drained server is empty");
    // Every byte, through fresh lookups and through the old handle.
    for (p, data) in files.iter().chain(&written) {
        assert_eq!(c.get(p).await.unwrap(), *data, "{p} after the drain");
    }
    assert_eq!(
        old.read(0, old.size()).await.unwrap(),
        files[3].1,
        "an old handle follows its moved blocks"
    );
    // Listings (their records moved too, or come from the metadata server).
    let mut names = c.enumerate("/d").await.unwrap();
    names.sort();
    let mut expect: Vec<String> = files
        .iter()
        .chain(&written)
        .filter_map(|(p, _)| p.strip_prefix("/d/").map(str::to_string))
        .collect();
    expect.sort();
    assert_eq!(names, expect);
    // Still drained: new data goes elsewhere.
    c.put_file("/d/late", &pattern(7, 3 * BS as usize)).await;
    assert_eq!(used(&c, &a).await.0, 0, "no new blocks on a drained server");
}

on_both_paths!(#[tokio::test(flavor = "multi_thread", worker_threads = 4)] drain_moves_every_block_under_a_workload => drain_under_workload);

/// With no other server of its class, a drained server's blocks go to the
/// next class with room (here the file tier).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_falls_back_to_the_next_class() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(4 << 20, 16 << 20, &dir);
    let t = start_with(cfg, dir).await;
    let c = &t.client;
    let dram = t.cluster.stores[0].advertised_addr().to_string();
    let data = pattern(5, 5 * BS as usize);
    c.put_file("/big", &data).await;
    let blocks = blocks_of(c, "/big").await;
    assert!(
        blocks.iter().any(|b| b.addr == dram),
        "written to DRAM first: {blocks:?}"
    );
    let parts = {
        c.drain(&dram, false).await.unwrap();
        drain_to_end(c, &dram).await
    };
    assert_eq!(parts[0].state, DrainState::Done);
    let file = t.cluster.stores[1].advertised_addr().to_string();
    let blocks = blocks_of(c, "/big").await;
    assert!(
        blocks.iter().all(|b| b.addr == file && b.class == 1),
        "moved to the file tier: {blocks:?}"
    );
    assert_eq!(c.get("/big").await.unwrap(), data);
}

/// A cancelled drain gives the server back to placement; naming a server
/// nobody registered fails with `UnknownServer`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_gives_the_server_back_and_unknown_servers_are_refused() {
    let t = two_dram(2 << 20, 0, true).await;
    let c = &t.client;
    let a = t.cluster.stores[0].advertised_addr().to_string();
    let id = t.cluster.stores[0].identity().to_string();
    // By identity.
    c.drain(&id, false).await.unwrap();
    drain_to_end(c, &id).await;
    assert!(used(c, &a).await.1, "draining");
    let parts = c.drain(&id, true).await.unwrap();
    assert_eq!(parts[0].state, DrainState::Cancelled);
    let (_, draining) = used(c, &a).await;
    assert!(!draining, "cancelled");
    // Blocks go round-robin again, so some land on it.
    for i in 0..8 {
        c.put_file(&format!("/f{i}"), &pattern(i, BS as usize))
            .await;
    }
    assert!(used(c, &a).await.0 > 0, "the server takes blocks again");
    let e = c.drain("127.0.0.1:1", false).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::UnknownServer, "{e}");
}

/// Small values share blocks (slabs): a drain moves the slabs whole, and
/// every value in them stays readable (here to the next class: the only
/// DRAM server is drained).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_values_move_with_their_slabs() {
    let dir = tempfile::tempdir().unwrap();
    let t = start_with(config(2 << 20, 8 << 20, &dir), dir).await;
    let c = &t.client;
    let dram = t.cluster.stores[0].advertised_addr().to_string();
    c.create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    for i in 0..40u64 {
        c.put(&format!("/t/k{i}"), &pattern(i, 50 + i as usize))
            .await
            .unwrap();
    }
    let old = c.lookup("/t/k7").await.unwrap();
    assert!(used(c, &dram).await.0 > 0, "the values' slab is on DRAM");
    c.drain(&dram, false).await.unwrap();
    let parts = drain_to_end(c, &dram).await;
    let p = &parts[0];
    assert_eq!((p.state, p.used_blocks), (DrainState::Done, 0), "{p:?}");
    for i in 0..40u64 {
        assert_eq!(
            c.get(&format!("/t/k{i}")).await.unwrap(),
            pattern(i, 50 + i as usize)
        );
    }
    assert_eq!(
        old.read(0, old.size()).await.unwrap(),
        pattern(7, 57),
        "an old handle follows its moved slab"
    );
}

/// A storage server can join at any time and takes new blocks at once;
/// draining the old one then hands it everything (replacing a server
/// without stopping the cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_server_takes_blocks_at_once_and_can_replace_another() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(16 * BS, 0, &dir);
    cfg.store = cfg.up_stores();
    let section = cfg.store[0].clone();
    let mut t = start_with(cfg, dir).await;
    let c = t.client.clone();
    let old = t.cluster.stores[0].advertised_addr().to_string();
    // Fill the only server.
    let full = pattern(1, 14 * BS as usize);
    c.put_file("/full", &full).await;
    let mut n = c
        .create("/more", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    let e = n.append(&pattern(2, 4 * BS as usize)).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpace, "{e}");
    drop(n);
    c.delete("/more", false).await.unwrap();
    // A new server joins: the very next write may use it.
    let bigger = StoreSection {
        size: ByteSize(40 * BS),
        ..section
    };
    let new = t
        .cluster
        .add_store(&bigger)
        .await
        .unwrap()
        .advertised_addr()
        .to_string();
    let more = pattern(3, 8 * BS as usize);
    c.put_file("/more", &more).await;
    let blocks = blocks_of(&c, "/more").await;
    assert!(
        blocks.iter().any(|b| b.addr == new),
        "new blocks on the new server: {blocks:?}"
    );
    // Replace the old server: drain it onto the new one.
    c.drain(&old, false).await.unwrap();
    let parts = drain_to_end(&c, &old).await;
    assert_eq!(
        (parts[0].state, parts[0].used_blocks),
        (DrainState::Done, 0)
    );
    for (p, data) in [("/full", &full), ("/more", &more)] {
        assert_eq!(c.get(p).await.unwrap(), *data, "{p}");
        let blocks = blocks_of(&c, p).await;
        assert!(blocks.iter().all(|b| b.addr == new), "{p}: {blocks:?}");
    }
}
