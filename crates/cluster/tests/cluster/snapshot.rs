//! Snapshot and restore (`docs/snapshots.md`) through real clusters: a
//! snapshot under a concurrent writer restores every node closed before
//! it began, byte for byte, and nothing after; the `Stale` promise is not
//! delayed by it; restore refuses an existing target unless asked, and a
//! damaged or incomplete snapshot directory, naming the file.

use crate::common;

use common::pattern;
use nodekernel_client::snapshot::{
    pack_name, Phase, Progress, RestoreOptions, SnapshotOptions, MANIFEST,
};
use nodekernel_client::{Client, CreateOptions, ErrorCode, NodeType};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

const MIB: u64 = 1 << 20;
const BS: usize = common::BS as usize;

fn opts(enumerable: bool) -> CreateOptions {
    CreateOptions {
        enumerable,
        ..CreateOptions::default()
    }
}

/// What a subtree holds: path -> (type, bytes of a data node).
type Tree = BTreeMap<String, (NodeType, Vec<u8>)>;

async fn file(c: &Client, p: &str, bytes: &[u8]) {
    let mut f = c
        .create(p, NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    // In a few appends, so a File spans blocks written separately.
    for chunk in bytes.chunks(BS / 2 + 7) {
        f.append(chunk).await.unwrap();
    }
    f.close().await.unwrap();
}

/// Fills `root` with Files (empty, small, several blocks), small and big
/// KeyValues in an enumerable and a non-enumerable Table, a Bag and nested
/// Directories; returns what it holds.
async fn fill(c: &Client, root: &str) -> Tree {
    let mut t = Tree::new();
    let mut dir = |p: String, ty: NodeType| {
        t.insert(p, (ty, Vec::new()));
    };
    c.create(root, NodeType::Directory, opts(true))
        .await
        .unwrap();
    dir(root.into(), NodeType::Directory);
    for (p, ty, e) in [
        ("d", NodeType::Directory, true),
        ("d/sub", NodeType::Directory, true),
        ("d/sub/deeper", NodeType::Directory, true),
        ("t", NodeType::Table, true),
        ("n", NodeType::Table, false),
        ("b", NodeType::Bag, true),
        ("empty", NodeType::Directory, true),
    ] {
        let p = format!("{root}/{p}");
        c.create(&p, ty, opts(e)).await.unwrap();
        dir(p, ty);
    }
    let mut seed = 0;
    let mut next = |len: usize| {
        seed += 1;
        pattern(seed, len)
    };
    for (i, len) in [0, 1, 100, BS - 1, BS, 3 * BS + 17].into_iter().enumerate() {
        for d in ["d", "d/sub/deeper", "b"] {
            let p = format!("{root}/{d}/f{i}");
            let v = next(len);
            file(c, &p, &v).await;
            t.insert(p, (NodeType::File, v));
        }
    }
    for table in ["t", "n"] {
        for i in 0..40 {
            // Small ones live in pieces of shared blocks; every fifth is big.
            let len = if i % 5 == 4 { 2 * BS + 5 } else { 10 + i * 7 };
            let p = format!("{root}/{table}/k{i}");
            let v = next(len);
            c.put(&p, &v).await.unwrap();
            t.insert(p, (NodeType::KeyValue, v));
        }
    }
    t
}

/// Reads the subtree at `root` back (enumerating every container) and
/// checks it is `want`, re-rooted at `root`, exactly.
async fn check_tree(c: &Client, want_root: &str, want: &Tree, root: &str) {
    let rebase = |p: &str| match format!("{root}{}", &p[want_root.len()..]) {
        r if r.is_empty() => "/".to_string(),
        r => r,
    };
    let want: Tree = want.iter().map(|(p, v)| (rebase(p), v.clone())).collect();
    for (p, (ty, bytes)) in &want {
        let n = c.lookup(p).await.unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(n.info().ty, *ty, "{p}");
        if ty.is_container() {
            let listed: BTreeSet<String> = c.enumerate(p).await.unwrap().into_iter().collect();
            let expected: BTreeSet<String> = want
                .keys()
                .filter(|q| *q != p)
                .filter_map(|q| q.strip_prefix(&format!("{}/", p.trim_end_matches('/'))))
                .filter(|rest| !rest.contains('/'))
                .map(str::to_string)
                .collect();
            if n.info().enumerable {
                assert_eq!(listed, expected, "children of {p}");
            } else {
                assert!(listed.is_empty(), "{p} is not enumerable");
                for name in &expected {
                    c.lookup(&format!("{p}/{name}")).await.unwrap();
                }
            }
            // Nothing else is there either (seen through lookups of the
            // names the source had).
        } else {
            let got = c.get(p).await.unwrap_or_else(|e| panic!("{p}: {e}"));
            assert!(
                got == *bytes,
                "{p}: {} bytes, want {}",
                got.len(),
                bytes.len()
            );
        }
    }
}

/// Counts progress calls, to check they come.
#[derive(Default)]
struct Count {
    nodes: AtomicU64,
    bytes: AtomicU64,
    reading: AtomicBool,
}

impl Progress for Count {
    fn phase(&self, phase: Phase, _nodes: u64, _bytes: u64) {
        if phase == Phase::Reading {
            self.reading.store(true, Ordering::Relaxed);
        }
    }
    fn advance(&self, nodes: u64, bytes: u64) {
        self.nodes.fetch_add(nodes, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// The acceptance case. The snapshot begins; then, before a single byte is
/// read, pre-existing nodes are replaced, deleted and appended to, and new
/// ones created; a writer keeps doing so while the snapshot reads. The
/// restore into a fresh cluster holds exactly the tree as it was at the
/// start.
async fn under_a_concurrent_writer(shared_memory: bool) {
    let src = common::start_on_path(64 * MIB, 64 * MIB, shared_memory).await;
    let c = &src.client;
    let want = fill(c, "/src").await;
    let stale_handle = c.lookup("/src/t/k0").await.unwrap();
    let stale_big = c.lookup("/src/t/k4").await.unwrap();

    let snap = c.snapshot_begin("/src").await.unwrap();
    assert_eq!(snap.nodes().len(), want.len(), "the listing is the tree");

    // Between the start and the reads: every kind of change to nodes the
    // snapshot must still read whole.
    for i in 0..40 {
        let p = format!("/src/t/k{i}");
        match i % 4 {
            0 => c
                .put(&p, &pattern(1000 + i, 10 + i as usize))
                .await
                .unwrap(),
            1 => c.delete(&p, false).await.unwrap(),
            2 => c.put(&p, &pattern(2000 + i, 3 * BS)).await.unwrap(),
            _ => {}
        }
        let p = format!("/src/n/k{i}");
        if i % 3 == 0 {
            c.delete(&p, false).await.unwrap();
        } else {
            c.put(&p, &pattern(3000 + i, 50)).await.unwrap();
        }
    }
    // The Stale promise is not delayed by the snapshot: handles to values
    // replaced meanwhile fail at once.
    for h in [&stale_handle, &stale_big] {
        let e = h.read(0, h.size()).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Stale, "{}: {e}", h.path());
    }
    c.delete("/src/d/sub", true).await.unwrap();
    c.delete("/src/b/f5", false).await.unwrap();
    c.delete("/src/d/f3", false).await.unwrap();
    let mut f = c.open_write("/src/d/f5").await.unwrap();
    f.append(&pattern(7, 2 * BS)).await.unwrap();
    f.close().await.unwrap();
    c.create("/src/new", NodeType::Directory, opts(true))
        .await
        .unwrap();
    file(c, "/src/d/later", &pattern(8, 5000)).await;
    c.put("/src/t/later", b"not in the snapshot").await.unwrap();

    // And a writer that keeps at it while the snapshot reads.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (c, stop) = (c.clone(), stop.clone());
        tokio::spawn(async move {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let i = round % 40;
                let _ = c
                    .put(
                        &format!("/src/t/k{i}"),
                        &pattern(round, (round % 3) as usize * BS + 9),
                    )
                    .await;
                let _ = c.delete(&format!("/src/n/k{i}"), false).await;
                let _ = c.put(&format!("/src/n/w{round}"), b"new").await;
                if let Ok(mut f) = c.open_write("/src/d/f4").await {
                    let _ = f.append(&pattern(round, 100)).await;
                    let _ = f.close().await;
                }
                let _ = c.delete(&format!("/src/d/deeper{}", round - 1), true).await;
                let _ = c
                    .create(
                        &format!("/src/d/deeper{round}"),
                        NodeType::Directory,
                        opts(true),
                    )
                    .await;
                tokio::task::yield_now().await;
            }
            round
        })
    };

    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("snap");
    std::fs::create_dir(&out).unwrap();
    let count = Count::default();
    let sum = snap
        .write_to(
            &out,
            &SnapshotOptions {
                pack_bytes: 100 << 10,
                ..SnapshotOptions::default()
            },
            &count,
        )
        .await
        .unwrap();
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.await.unwrap();
    assert!(rounds > 0);
    let data: u64 = want.values().map(|(_, b)| b.len() as u64).sum();
    assert_eq!(sum.counts.nodes, want.len() as u64);
    assert_eq!(sum.counts.bytes, data);
    assert!(sum.packs > 1, "small packs: several of them");
    assert!(count.reading.load(Ordering::Relaxed));
    assert_eq!(count.nodes.load(Ordering::Relaxed), want.len() as u64);
    assert_eq!(count.bytes.load(Ordering::Relaxed), data);
    // The snapshot ended: nothing is held any more.
    assert_eq!(src.cluster.meta.with_state(|s| s.held_blocks().count()), 0);
    assert!(src.cluster.meta.with_state(|s| s.snapshots().is_empty()));

    // Restore into a fresh cluster.
    let dst = common::start_on_path(64 * MIB, 64 * MIB, shared_memory).await;
    let sum = dst
        .client
        .restore(&out, "/restored", &RestoreOptions::default(), &())
        .await
        .unwrap();
    assert_eq!(
        (sum.counts.nodes, sum.counts.bytes),
        (want.len() as u64, data)
    );
    check_tree(&dst.client, "/src", &want, "/restored").await;
    for gone in ["/restored/new", "/restored/d/later", "/restored/t/later"] {
        let e = dst.client.lookup(gone).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound, "{gone}");
    }
    // And into `/` of another fresh cluster.
    let root = common::start_on_path(64 * MIB, 64 * MIB, shared_memory).await;
    root.client
        .restore(&out, "/", &RestoreOptions::default(), &())
        .await
        .unwrap();
    check_tree(&root.client, "/src", &want, "").await;
}

on_both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_snapshot_under_a_concurrent_writer_restores_exactly_what_was_closed_before_it =>
        under_a_concurrent_writer
);

/// A snapshot of `/src` (a small tree) into a new directory.
async fn small_snapshot(c: &Client, dir: &Path) -> Tree {
    let mut want = Tree::new();
    c.create("/src", NodeType::Table, opts(true)).await.unwrap();
    want.insert("/src".into(), (NodeType::Table, Vec::new()));
    for (i, len) in [5usize, 300, 2 * BS + 1].into_iter().enumerate() {
        let p = format!("/src/k{i}");
        let v = pattern(i as u64, len);
        c.put(&p, &v).await.unwrap();
        want.insert(p, (NodeType::KeyValue, v));
    }
    c.snapshot("/src", dir, &SnapshotOptions::default(), &())
        .await
        .unwrap();
    want
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_refuses_an_existing_target_unless_asked_to_overwrite() {
    let t = common::start(32 * MIB, 32 * MIB).await;
    let c = &t.client;
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s");
    let want = small_snapshot(c, &snap).await;
    // A snapshot goes into an empty directory only.
    let e = c
        .snapshot("/src", &snap, &SnapshotOptions::default(), &())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::AlreadyExists, "{e}");
    // The source itself exists: refused, and left as it was.
    c.put("/src/k0", b"changed").await.unwrap();
    let e = c
        .restore(&snap, "/src", &RestoreOptions::default(), &())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::AlreadyExists, "{e}");
    assert!(e.message.contains("/src"), "{e}");
    assert_eq!(c.get("/src/k0").await.unwrap(), b"changed");
    // Asked to: the old tree is replaced by the snapshot's.
    c.put("/src/extra", b"x").await.unwrap();
    let force = RestoreOptions {
        overwrite: true,
        ..RestoreOptions::default()
    };
    c.restore(&snap, "/src", &force, &()).await.unwrap();
    check_tree(c, "/src", &want, "/src").await;
    assert_eq!(
        c.lookup("/src/extra").await.unwrap_err().code,
        ErrorCode::NotFound
    );
    // Only a Directory can become `/`.
    let e = c
        .restore(&snap, "/", &RestoreOptions::default(), &())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::TypeMismatch, "{e}");
    // `/` with something in it is an existing target too.
    let whole = dir.path().join("whole");
    c.snapshot("/", &whole, &SnapshotOptions::default(), &())
        .await
        .unwrap();
    let e = c
        .restore(&whole, "/", &RestoreOptions::default(), &())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::AlreadyExists, "{e}");
    assert!(e.message.contains("not empty"), "{e}");
    // Under a new name, with missing parents made.
    c.restore(&snap, "/a/b/copy", &RestoreOptions::default(), &())
        .await
        .unwrap();
    check_tree(c, "/src", &want, "/a/b/copy").await;
    // A snapshot of one value.
    let one = dir.path().join("one");
    c.snapshot("/src/k2", &one, &SnapshotOptions::default(), &())
        .await
        .unwrap();
    c.restore(&one, "/src/copy", &RestoreOptions::default(), &())
        .await
        .unwrap();
    assert_eq!(c.get("/src/copy").await.unwrap(), want["/src/k2"].1);
}

fn flip(path: &Path, at_from_end: u64) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let at = f.metadata().unwrap().len() - at_from_end;
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_or_incomplete_snapshot_is_refused_naming_the_file() {
    let t = common::start(32 * MIB, 32 * MIB).await;
    let c = &t.client;
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s");
    small_snapshot(c, &snap).await;
    let restore = |to: &'static str| {
        let snap = snap.clone();
        async move {
            c.restore(&snap, to, &RestoreOptions::default(), &())
                .await
                .unwrap_err()
        }
    };
    // A damaged byte in the last node's data.
    let pack = snap.join(pack_name(0));
    let pack_bytes = std::fs::read(&pack).unwrap();
    flip(&pack, 10);
    let e = restore("/r1").await;
    assert_eq!(e.code, ErrorCode::DataLost, "{e}");
    assert!(e.message.contains(&pack_name(0)), "names the file: {e}");
    assert!(e.message.contains("k2"), "names the node: {e}");
    assert_eq!(
        c.lookup("/r1").await.unwrap_err().code,
        ErrorCode::NotFound,
        "nothing was created"
    );
    // A pack cut short.
    std::fs::write(&pack, &pack_bytes[..pack_bytes.len() - 1]).unwrap();
    let e = restore("/r2").await;
    assert_eq!(e.code, ErrorCode::DataLost, "{e}");
    assert!(e.message.contains(&pack_name(0)), "{e}");
    // A pack missing.
    std::fs::remove_file(&pack).unwrap();
    let e = restore("/r2").await;
    assert_eq!(e.code, ErrorCode::DataLost, "{e}");
    assert!(e.message.contains(&pack_name(0)), "{e}");
    std::fs::write(&pack, &pack_bytes).unwrap();
    // A damaged manifest.
    let manifest = snap.join(MANIFEST);
    flip(&manifest, 20);
    let e = restore("/r3").await;
    assert_eq!(e.code, ErrorCode::DataLost, "{e}");
    assert!(e.message.contains(MANIFEST), "names the file: {e}");
    flip(&manifest, 20);
    // Garbage of any length never panics.
    let good = std::fs::read(&manifest).unwrap();
    for cut in [0, 3, 12, good.len() / 2, good.len() - 1] {
        std::fs::write(&manifest, &good[..cut]).unwrap();
        let e = restore("/r4").await;
        assert!(e.message.contains(MANIFEST), "cut {cut}: {e}");
    }
    std::fs::write(&manifest, &good).unwrap();
    // Incomplete: no manifest (a snapshot interrupted before its end).
    std::fs::remove_file(&manifest).unwrap();
    let e = restore("/r5").await;
    assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
    assert!(e.message.contains("incomplete"), "{e}");
    std::fs::write(&manifest, &good).unwrap();
    // Intact again: it restores.
    c.restore(&snap, "/r6", &RestoreOptions::default(), &())
        .await
        .unwrap();
}

/// Every name directly under `/`, sorted.
async fn top_level(c: &Client) -> Vec<String> {
    let mut names = c.enumerate("/").await.unwrap();
    names.sort();
    names
}

/// A Directory `/precious` holding a File: a target a failed restore must
/// leave as it was.
async fn precious(c: &Client) -> Vec<u8> {
    c.create("/precious", NodeType::Directory, opts(true))
        .await
        .unwrap();
    let keep = pattern(99, 3 * BS + 5);
    file(c, "/precious/keep", &keep).await;
    keep
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_listing_a_node_twice_is_refused_before_anything_changes() {
    use nodekernel_client::snapshot::{read_manifest, Manifest, ManifestEntry};
    let t = common::start(32 * MIB, 32 * MIB).await;
    let c = &t.client;
    c.create("/src", NodeType::Directory, opts(true))
        .await
        .unwrap();
    file(c, "/src/f", &pattern(1, 1000)).await;
    c.create("/src/b", NodeType::Bag, opts(true)).await.unwrap();
    file(c, "/src/b/g", &pattern(2, BS + 3)).await;
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s");
    c.snapshot("/src", &snap, &SnapshotOptions::default(), &())
        .await
        .unwrap();
    let good = read_manifest(&snap).unwrap();
    let keep = precious(c).await;
    let before = top_level(c).await;

    let entry = |path: &str| good.entries.iter().find(|e| e.path == path).unwrap();
    let empty = |path: &str, ty| ManifestEntry {
        path: path.into(),
        ty,
        size: 0,
        crc: 0,
        ..entry("f").clone()
    };
    let crafted: [(&str, ManifestEntry); 4] = [
        ("a File twice", entry("f").clone()),
        ("a File and a Directory", empty("f", NodeType::Directory)),
        ("a Bag and a File", empty("b", NodeType::File)),
        ("a File in a Bag twice", entry("b/g").clone()),
    ];
    let force = RestoreOptions {
        overwrite: true,
        ..RestoreOptions::default()
    };
    for (what, extra) in crafted {
        let mut m: Manifest = good.clone();
        m.entries.push(extra);
        // The checksum is valid: only the content is hostile.
        std::fs::write(snap.join(MANIFEST), m.encode()).unwrap();
        for to in ["/precious", "/fresh/copy"] {
            let e = c.restore(&snap, to, &force, &()).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::DataLost, "{what} to {to}: {e}");
            assert!(
                e.message.contains(MANIFEST) && e.message.contains("twice"),
                "{what} to {to}: {e}"
            );
            assert_eq!(top_level(c).await, before, "{what} to {to}");
            assert_eq!(c.get("/precious/keep").await.unwrap(), keep, "{what}");
        }
    }
    // The snapshot as written still restores, over the target too.
    std::fs::write(snap.join(MANIFEST), good.encode()).unwrap();
    c.restore(&snap, "/precious", &force, &()).await.unwrap();
    assert_eq!(c.get("/precious/f").await.unwrap(), pattern(1, 1000));
    assert_eq!(
        c.lookup("/precious/keep").await.unwrap_err().code,
        ErrorCode::NotFound
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_that_fails_midway_leaves_no_partial_tree_and_keeps_the_target() {
    // A snapshot of 3 MiB of Files and KeyValues, taken in a big cluster...
    let src = common::start(32 * MIB, 0).await;
    let c = &src.client;
    c.create("/src", NodeType::Directory, opts(true))
        .await
        .unwrap();
    c.create("/src/t", NodeType::Table, opts(true))
        .await
        .unwrap();
    for i in 0..12u64 {
        file(c, &format!("/src/f{i}"), &pattern(i, 4 * BS)).await;
        c.put(&format!("/src/t/k{i}"), &pattern(100 + i, 100))
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s");
    c.snapshot("/src", &snap, &SnapshotOptions::default(), &())
        .await
        .unwrap();
    // ... restored into a small one: it runs out of space partway.
    let small = common::start(32 * common::BS, 0).await;
    let c = &small.client;
    let keep = precious(c).await;
    let force = RestoreOptions {
        overwrite: true,
        ..RestoreOptions::default()
    };
    let e = c
        .restore(&snap, "/precious", &force, &())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpace, "{e}");
    // The target was not touched, and nothing of the restore is left.
    assert_eq!(top_level(c).await, ["precious"]);
    assert_eq!(c.get("/precious/keep").await.unwrap(), keep);
    assert_eq!(c.enumerate("/precious").await.unwrap(), ["keep"]);
    // Into a new path with missing parents: none of them is left either.
    let e = c
        .restore(&snap, "/new/deeper/copy", &RestoreOptions::default(), &())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpace, "{e}");
    assert_eq!(top_level(c).await, ["precious"]);
    let e = c
        .restore(&snap, "/precious/copy", &RestoreOptions::default(), &())
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpace, "{e}");
    assert_eq!(c.enumerate("/precious").await.unwrap(), ["keep"]);
    // The space the failed restores took is free again: a restore that
    // fits once the old tree is gone succeeds.
    c.delete("/precious", true).await.unwrap();
    let smaller = common::start(32 * MIB, 0).await;
    smaller
        .client
        .create("/s", NodeType::Directory, opts(true))
        .await
        .unwrap();
    file(&smaller.client, "/s/f", &pattern(5, 20 * BS)).await;
    let snap2 = dir.path().join("s2");
    smaller
        .client
        .snapshot("/s", &snap2, &SnapshotOptions::default(), &())
        .await
        .unwrap();
    c.restore(&snap2, "/s", &RestoreOptions::default(), &())
        .await
        .unwrap();
    assert_eq!(c.get("/s/f").await.unwrap(), pattern(5, 20 * BS));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_with_overwrite_replaces_all_of_root_and_a_single_value() {
    let t = common::start(32 * MIB, 32 * MIB).await;
    let c = &t.client;
    let dir = tempfile::tempdir().unwrap();
    let want = small_snapshot(c, &dir.path().join("s")).await;
    c.create("/other", NodeType::Directory, opts(true))
        .await
        .unwrap();
    let whole = dir.path().join("whole");
    c.snapshot("/", &whole, &SnapshotOptions::default(), &())
        .await
        .unwrap();
    // Changed after the snapshot: replaced, removed, added.
    c.put("/src/k0", b"changed").await.unwrap();
    c.delete("/other", false).await.unwrap();
    c.create("/later", NodeType::Directory, opts(true))
        .await
        .unwrap();
    let force = RestoreOptions {
        overwrite: true,
        ..RestoreOptions::default()
    };
    c.restore(&whole, "/", &force, &()).await.unwrap();
    assert_eq!(top_level(c).await, ["other", "src"]);
    check_tree(c, "/src", &want, "/src").await;
    // A snapshot of one value over an existing value.
    let one = dir.path().join("one");
    c.snapshot("/src/k1", &one, &SnapshotOptions::default(), &())
        .await
        .unwrap();
    c.restore(&one, "/src/k0", &force, &()).await.unwrap();
    assert_eq!(c.get("/src/k0").await.unwrap(), want["/src/k1"].1);
    assert_eq!(
        c.enumerate("/src").await.unwrap().len(),
        3,
        "nothing else is left in the table"
    );
}

/// Replaces `path` with a symbolic link to `to`.
fn symlink_over(path: &Path, to: &Path) {
    std::fs::remove_file(path).unwrap();
    std::os::unix::fs::symlink(to, path).unwrap();
}

/// Replaces `path` with a FIFO nobody writes to.
fn fifo_over(path: &Path) {
    std::fs::remove_file(path).unwrap();
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn special_files_in_a_snapshot_are_refused_naming_them() {
    let t = common::start(32 * MIB, 32 * MIB).await;
    let c = &t.client;
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s");
    let want = small_snapshot(c, &snap).await;
    let manifest = snap.join(MANIFEST);
    let pack = snap.join(pack_name(0));
    let saved = dir.path().join("saved");
    std::fs::create_dir(&saved).unwrap();
    std::fs::copy(&manifest, saved.join(MANIFEST)).unwrap();
    std::fs::copy(&pack, saved.join(pack_name(0))).unwrap();
    let put_back = || {
        for f in [MANIFEST.to_string(), pack_name(0)] {
            let _ = std::fs::remove_file(snap.join(&f));
            std::fs::copy(saved.join(&f), snap.join(&f)).unwrap();
        }
    };
    let refused = |file: &Path, why: &str| {
        let (snap, file, why) = (snap.clone(), file.to_path_buf(), why.to_string());
        async move {
            let e = c
                .restore(&snap, "/r", &RestoreOptions::default(), &())
                .await
                .unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
            assert!(
                e.message.contains(&file.display().to_string())
                    && e.message.contains("not a regular file")
                    && e.message.contains(&why),
                "{e}"
            );
            assert_eq!(c.lookup("/r").await.unwrap_err().code, ErrorCode::NotFound);
        }
    };
    // A manifest that reads forever, and one that never answers.
    symlink_over(&manifest, Path::new("/dev/zero"));
    refused(&manifest, "character device").await;
    fifo_over(&manifest);
    refused(&manifest, "FIFO").await;
    put_back();
    // Packs likewise.
    fifo_over(&pack);
    refused(&pack, "FIFO").await;
    symlink_over(&pack, Path::new("/dev/zero"));
    refused(&pack, "character device").await;
    put_back();
    // A link to a regular file is followed.
    symlink_over(&pack, &saved.join(pack_name(0)));
    symlink_over(&manifest, &saved.join(MANIFEST));
    c.restore(&snap, "/r", &RestoreOptions::default(), &())
        .await
        .unwrap();
    check_tree(c, "/src", &want, "/r").await;
}
