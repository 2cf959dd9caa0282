//! Quotas and disk usage through a real cluster (`docs/lifecycle.md`,
//! *Quotas* and *Disk usage*): concurrent writers against a quota never
//! take it past its limits, a refused put leaves no node, and `du` (the
//! metadata server's accounting) equals what a walk finds after churn,
//! moves and metadata-server restarts. Every wait only catches a hang.

use crate::admin::{scrape, sum};
use crate::common;

use common::{pattern, TestCluster, BS};
use nodekernel_client::{
    exceeded_root, BufferedWriter, Client, CreateOptions, ErrorCode, NodeType, StreamOptions,
    UsageInfo,
};
use nodekernel_cluster::config::FsyncMode;
use nodekernel_meta::MetaServer;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// What a walk of the subtree at `p` finds: (nodes below it, bytes of
/// data, storage its data nodes hold), the way `du` counts them.
async fn walk(c: &Client, p: &str) -> (u64, u64, u64) {
    let mut stack = vec![p.to_string()];
    let (mut nodes, mut bytes, mut stored) = (0, 0, 0);
    while let Some(dir) = stack.pop() {
        for (name, ty) in c.enumerate_typed(&dir).await.unwrap() {
            let child = if dir == "/" {
                format!("/{name}")
            } else {
                format!("{dir}/{name}")
            };
            nodes += 1;
            if ty.is_container() {
                stack.push(child);
            } else {
                let info = c.lookup(&child).await.unwrap().info().clone();
                bytes += info.size;
                stored += info.stored;
            }
        }
    }
    (nodes, bytes, stored)
}

/// The Directory `/q` (the quota root of the tests) and its Table `/q/t`.
async fn quota_table(c: &Client) {
    c.mkdir("/q", false).await.unwrap();
    c.create("/q/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
}

fn numbers(u: &UsageInfo) -> (u64, u64, u64) {
    (u.nodes, u.bytes, u.held)
}

/// Checks `du` of every container below `p` (and `p`) against a walk.
async fn du_matches_walks(c: &Client, p: &str, when: &str) {
    let mut stack = vec![p.to_string()];
    while let Some(dir) = stack.pop() {
        let u = c.du(&dir).await.unwrap();
        assert_eq!(numbers(&u), walk(c, &dir).await, "du of {dir} {when}");
        let held: u64 = u
            .classes
            .iter()
            .map(|k| k.blocks * BS + k.piece_bytes)
            .sum();
        assert_eq!(held, u.held, "{dir} {when}: classes add up to what is held");
        for (name, ty) in c.enumerate_typed(&dir).await.unwrap() {
            if ty.is_container() {
                stack.push(if dir == "/" {
                    format!("/{name}")
                } else {
                    format!("{dir}/{name}")
                });
            }
        }
    }
}

/// Eight writers put values of 1 byte to 3 blocks into a Table under a
/// quota, make directories and delete some of what they wrote, until each
/// has been refused several times. A watcher samples `du` all along: the
/// quota root never holds more than its limits. Every refusal is
/// `QuotaExceeded` naming the root, and leaves nothing: at the end the
/// Table holds exactly the keys whose puts succeeded and were not deleted,
/// `du` equals a walk, and the metrics count the refusals and show the
/// root's usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_writers_never_take_a_quota_past_its_limits() {
    const WRITERS: u64 = 8;
    const REFUSALS: u64 = 6;
    let limit_bytes = 24 * BS;
    let limit_nodes = 60;
    let t = common::start(512 * BS, 0).await;
    let c = t.client.clone();
    quota_table(&c).await;
    let u = c
        .set_quota("/q", Some(limit_bytes), Some(limit_nodes))
        .await
        .unwrap();
    assert_eq!(u.nodes, 1);
    let done = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(AtomicU64::new(0));
    let watcher = {
        let (c, done, samples) = (c.clone(), done.clone(), samples.clone());
        tokio::spawn(async move {
            let mut max = (0, 0);
            while !done.load(Ordering::Acquire) {
                let u = c.du("/q").await.unwrap();
                assert!(
                    u.held <= limit_bytes && u.nodes <= limit_nodes,
                    "the quota root holds {} bytes and {} nodes, past its limits",
                    u.held,
                    u.nodes
                );
                max = (max.0.max(u.held), max.1.max(u.nodes));
                samples.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
            max
        })
    };
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let c = c.clone();
        writers.push(tokio::spawn(async move {
            // Keys this writer stored and still holds.
            let mut held: BTreeSet<String> = BTreeSet::new();
            let (mut refused, mut i) = (0u64, 0u64);
            while refused < REFUSALS {
                i += 1;
                let r = if i % 5 == 0 {
                    c.mkdir(&format!("/q/d{w}-{i}"), false).await
                } else {
                    let key = format!("/q/t/w{w}-{i}");
                    let len = ((w * 7919 + i * 104_729) % (3 * BS + 1)) as usize;
                    let r = c.put(&key, &pattern(w * 1000 + i, len.max(1))).await;
                    if r.is_ok() {
                        held.insert(key);
                    }
                    r
                };
                match r {
                    Ok(()) => {}
                    Err(e) if e.code == ErrorCode::QuotaExceeded => {
                        assert_eq!(exceeded_root(&e), Some("/q"), "{e}");
                        refused += 1;
                        // Make room again: delete the oldest value.
                        if let Some(k) = held.pop_first() {
                            c.delete(&k, false).await.unwrap();
                        }
                    }
                    Err(e) => panic!("writer {w}: {e}"),
                }
            }
            (held, refused)
        }));
    }
    let mut want: BTreeSet<String> = BTreeSet::new();
    let mut refusals = 0;
    for w in writers {
        let (held, refused) = w.await.unwrap();
        want.extend(held);
        refusals += refused;
    }
    done.store(true, Ordering::Release);
    let (max_held, max_nodes) = watcher.await.unwrap();
    assert!(samples.load(Ordering::Relaxed) > 0);
    assert!(max_held <= limit_bytes && max_nodes <= limit_nodes);
    // Nothing of a refused put is left: the Table holds exactly the keys
    // stored and not deleted.
    let got: BTreeSet<String> = c
        .enumerate("/q/t")
        .await
        .unwrap()
        .into_iter()
        .map(|k| format!("/q/t/{k}"))
        .collect();
    assert_eq!(got, want);
    // No put is left in progress either (the client's puts reserved
    // ahead of their keys count nowhere and stay reserved).
    assert_eq!(c.status().await.unwrap().puts_in_progress, 0);
    du_matches_walks(&c, "/q", "after eight writers").await;
    let u = c.du("/q").await.unwrap();
    assert!(u.held <= limit_bytes && u.nodes <= limit_nodes, "{u:?}");
    // The metrics: the refusals (each writer's, at least), the root's
    // usage and limits.
    let admin = t.cluster.meta.admin_addr().expect("meta.admin is on");
    let s = scrape(admin).await;
    assert!(
        sum(&s, "nodekernel_meta_quota_refused_total", &[]) >= refusals as f64,
        "{refusals} refusals"
    );
    assert!(
        sum(
            &s,
            "nodekernel_meta_quota_refused_by_root_total",
            &[("root", "/q")]
        ) >= refusals as f64
    );
    let root = [("root", "/q")];
    assert_eq!(
        sum(&s, "nodekernel_meta_quota_used_bytes", &root),
        u.held as f64
    );
    assert_eq!(
        sum(&s, "nodekernel_meta_quota_used_nodes", &root),
        u.nodes as f64
    );
    assert_eq!(
        sum(&s, "nodekernel_meta_quota_limit_bytes", &root),
        limit_bytes as f64
    );
    assert_eq!(
        sum(&s, "nodekernel_meta_quota_limit_nodes", &root),
        limit_nodes as f64
    );
    // Cleared, the quota is gone from the listing and the metrics.
    c.clear_quota("/q").await.unwrap();
    assert!(c.quotas().await.unwrap().is_empty());
    let s = scrape(admin).await;
    assert_eq!(sum(&s, "nodekernel_meta_quota_used_bytes", &root), 0.0);
}

/// A put streamed past a quota through a `BufferedWriter` with many slices
/// in flight: the refused slice poisons the writer while later slices are
/// still being written; the abort then waits for them and drops the put,
/// so nothing of it stays named, counted or held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_streamed_past_a_quota_leaves_nothing_after_its_abort() {
    let t = common::start(512 * BS, 0).await;
    let c = t.client.clone();
    quota_table(&c).await;
    c.set_quota("/q", Some(2 * BS), None).await.unwrap();
    let before = c.du("/q").await.unwrap();
    let put = c
        .create(
            "/q/t/streamed",
            NodeType::KeyValue,
            CreateOptions::default(),
        )
        .await
        .unwrap();
    let slice = (BS / 4) as usize;
    let mut w = BufferedWriter::new(put, StreamOptions::new(16 * slice, slice).unwrap()).unwrap();
    let chunk = pattern(7, slice);
    let mut refused = None;
    for _ in 0..64 {
        if let Err(e) = w.write_all(&chunk).await {
            refused = Some(e);
            break;
        }
    }
    let e = match refused {
        Some(e) => e,
        None => w
            .flush()
            .await
            .expect_err("16 blocks do not fit a 2-block quota"),
    };
    assert_eq!(e.code, ErrorCode::QuotaExceeded, "{e}");
    w.abort().await.expect("the abort releases the put");
    assert_eq!(
        c.lookup("/q/t/streamed").await.unwrap_err().code,
        ErrorCode::NotFound
    );
    let after = c.du("/q").await.unwrap();
    assert_eq!(numbers(&after), numbers(&before), "{after:?}");
    assert_eq!(c.status().await.unwrap().puts_in_progress, 0);
}

/// A cluster whose metadata server keeps its log in `<data dir>/meta`.
async fn persistent() -> TestCluster {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(256 * BS, 0, &dir);
    cfg.meta.persistence = true;
    common::start_with(cfg, dir).await
}

/// Stops the metadata server and starts it again on the same address and
/// directory (as `persistence.rs` does); returns a new client.
async fn restart_meta(t: &mut TestCluster) -> Client {
    t.cluster.config.meta.fsync = FsyncMode::Always;
    let cfg = crate::persistence::stop_meta(t);
    t.cluster.meta = MetaServer::start(cfg).await.expect("restarts");
    t.cluster.client().await.unwrap()
}

/// Writes a File of `len` bytes.
async fn file(c: &Client, p: &str, len: usize, seed: u64) {
    let mut w = c
        .create(p, NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    w.append(&pattern(seed, len)).await.unwrap();
    w.close().await.unwrap();
}

/// Churn (Files, small and large values, replacing puts, removes of
/// subtrees, renames of subtrees across directories and quota roots),
/// then a checkpoint and a restart, more moves, and a restart from the
/// log alone: after each, `du` of every container equals a walk, and the
/// quotas are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn du_equals_a_walk_after_churn_restarts_and_moves() {
    let mut t = persistent().await;
    let c = t.client.clone();
    for d in ["/a", "/a/x", "/a/x/y", "/b", "/b/z"] {
        c.mkdir(d, false).await.unwrap();
    }
    c.create("/a/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    c.set_quota("/a", Some(200 * BS), Some(500)).await.unwrap();
    c.set_quota("/b", None, Some(300)).await.unwrap();
    let mut seed = 0;
    for i in 0..30u64 {
        seed += 1;
        let len = (i * 9973 % (2 * BS + 7)) as usize;
        match i % 4 {
            0 => file(&c, &format!("/a/x/f{i}"), len, seed).await,
            1 => file(&c, &format!("/b/z/f{i}"), len, seed).await,
            2 => c
                .put(&format!("/a/t/k{}", i % 5), &pattern(seed, len))
                .await
                .unwrap(),
            _ => file(&c, &format!("/a/x/y/f{i}"), len, seed).await,
        }
    }
    // Removes: a File, a value, and a subtree.
    c.delete("/a/x/f0", false).await.unwrap();
    c.delete("/a/t/k2", false).await.unwrap();
    c.mkdir("/b/gone", false).await.unwrap();
    file(&c, "/b/gone/f", 3 * BS as usize, 99).await;
    c.delete("/b/gone", true).await.unwrap();
    // Moves of whole subtrees, between quota roots and within one.
    c.rename("/a/x/y", "/b/y").await.unwrap();
    c.rename("/b/z/f1", "/a/f1").await.unwrap();
    du_matches_walks(&c, "/", "after churn").await;
    let quotas: BTreeMap<String, _> = c
        .quotas()
        .await
        .unwrap()
        .into_iter()
        .map(|u| (u.path.clone(), (u.quota, numbers(&u))))
        .collect();
    assert_eq!(quotas.len(), 2);
    // A checkpoint, then more churn in the log's tail, then a restart.
    t.cluster.meta.checkpoint().await.unwrap().expect("written");
    c.put("/a/t/k0", &pattern(500, 3 * BS as usize))
        .await
        .unwrap();
    c.rename("/b/y", "/a/x/y").await.unwrap();
    file(&c, "/b/z/late", 100, 501).await;
    let before = c.du("/").await.unwrap();
    let c = restart_meta(&mut t).await;
    assert_eq!(numbers(&c.du("/").await.unwrap()), numbers(&before));
    du_matches_walks(&c, "/", "after a checkpoint and a restart").await;
    for (p, (q, _)) in &quotas {
        assert_eq!(&c.quota(p).await.unwrap(), q, "{p} keeps its quota");
    }
    // More moves and removes, then a restart from the log alone (the
    // checkpoint above is older than all of it).
    c.rename("/a/x", "/b/x").await.unwrap();
    c.delete("/a/t/k1", false).await.unwrap();
    c.mkdir("/b/x/new", false).await.unwrap();
    file(&c, "/b/x/new/f", BS as usize + 1, 502).await;
    let c = restart_meta(&mut t).await;
    du_matches_walks(&c, "/", "after moves and a second restart").await;
    // The quotas still refuse growth past them.
    let nodes = c.du("/b").await.unwrap().nodes;
    c.set_quota("/b", None, Some(nodes)).await.unwrap();
    let e = c.mkdir("/b/one-more", false).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::QuotaExceeded, "{e}");
    assert_eq!(exceeded_root(&e), Some("/b"));
    assert_eq!(c.du("/b").await.unwrap().nodes, nodes);
}
