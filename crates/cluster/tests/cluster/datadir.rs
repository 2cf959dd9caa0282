//! Data directories of `nk up` clusters: exclusive use, private default
//! locations, identities kept across restarts, and clean-up after a failed
//! start.

use crate::common;

use common::{pattern, BS};
use nodekernel_client::{Client, CreateOptions, NodeType};
use nodekernel_cluster::{ClusterError, Config, LocalCluster};
use nodekernel_store::datadir::LOCK_FILE;
use nodekernel_store::StoreError;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Every path under `dir`, relative to it, sorted.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if p.is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

/// The message and every cause, as `nk` prints them (`anyhow`'s `{:#}`).
fn chain_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cur = c.source();
    }
    text
}

async fn put(c: &Client, path: &str, data: &[u8]) {
    let mut n = c
        .create(path, NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    n.append(data).await.unwrap();
    n.close().await.unwrap();
}

async fn get(c: &Client, path: &str, len: usize) -> Vec<u8> {
    c.lookup(path)
        .await
        .unwrap()
        .read(0, len as u64)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_cluster_on_the_same_data_dir_is_refused() {
    // File tier only, so the bytes live in the block file.
    let t = common::start(0, 64 * BS).await;
    let data = pattern(7, 20 * BS as usize + 5);
    put(&t.client, "/f", &data).await;
    let blocks = t.dir.path().join("store-0/blocks");
    assert_eq!(t.cluster.stores[0].block_file(), Some(blocks.as_path()));
    let before = tree(t.dir.path());
    let len = std::fs::metadata(&blocks).unwrap().len();

    // Another cluster on other ports, same data directory: for its file
    // tier of another size, and for a DRAM-only one.
    for (dram, file) in [(0, 32 * BS), (16 * BS, 0)] {
        let e = match LocalCluster::start(common::config(dram, file, &t.dir)).await {
            Ok(_) => panic!("a second cluster started on {}", t.dir.path().display()),
            Err(e) => e,
        };
        let text = e.to_string();
        let pid = std::process::id();
        assert!(
            matches!(&e, ClusterError::DataDir(StoreError::Locked { path, holder: Some(h), .. })
                if path == t.dir.path() && *h == pid),
            "{text}"
        );
        assert!(
            text.contains(&t.dir.path().display().to_string())
                && text.contains(&format!("pid {pid}"))
                && text.contains("--data-dir"),
            "{text}"
        );
    }

    // The first cluster is untouched and keeps serving.
    assert_eq!(tree(t.dir.path()), before);
    assert_eq!(std::fs::metadata(&blocks).unwrap().len(), len);
    assert_eq!(get(&t.client, "/f", data.len()).await, data);
    put(&t.client, "/g", b"more").await;
    assert_eq!(get(&t.client, "/g", 4).await, b"more");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_data_dir_of_a_running_cluster_is_refused() {
    let t = common::start(16 * BS, 16 * BS).await;
    let taken = t.cluster.stores[1].data_dir().unwrap().to_path_buf();
    let mut cfg = Config::default();
    cfg.meta.listen = "127.0.0.1:0".into();
    cfg.meta.block_size = nodekernel_cluster::ByteSize(BS);
    cfg.up.dram = nodekernel_cluster::ByteSize(16 * BS);
    cfg.up.file = nodekernel_cluster::ByteSize(0);
    cfg.up.data_dir = Some(taken.clone());
    let e = LocalCluster::start(cfg).await.err().expect("refused");
    assert!(e.to_string().contains(&taken.display().to_string()), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_data_dirs_are_private_distinct_and_removed() {
    let t = tempfile::tempdir().unwrap();
    let private = || {
        let mut cfg = common::config(16 * BS, 16 * BS, &t);
        cfg.up.data_dir = None;
        cfg
    };
    let a = LocalCluster::start(private()).await.unwrap();
    let b = LocalCluster::start(private()).await.unwrap();
    assert!(a.data_dir_is_private() && b.data_dir_is_private());
    assert_ne!(a.data_dir(), b.data_dir());
    // <temp dir>/nodekernel-<uid>, private to this user.
    let uid = std::fs::metadata(t.path()).unwrap().uid();
    let base = std::env::temp_dir().join(format!("nodekernel-{uid}"));
    assert_eq!(mode(&base) & 0o077, 0);
    for c in [&a, &b] {
        let d = c.data_dir();
        assert_eq!(d.parent(), Some(base.as_path()), "{}", d.display());
        assert_eq!(mode(d), 0o700);
        assert_eq!(mode(&d.join(LOCK_FILE)), 0o600);
        for (i, s) in c.stores.iter().enumerate() {
            assert_eq!(s.data_dir(), Some(d.join(format!("store-{i}")).as_path()));
        }
        assert_eq!(mode(c.stores[1].block_file().unwrap()), 0o600);
    }
    let (da, db) = (a.data_dir().to_path_buf(), b.data_dir().to_path_buf());
    a.shutdown();
    assert!(!da.exists(), "removed at shutdown");
    assert!(db.exists());
    drop(b);
    assert!(!db.exists(), "removed on drop");
    assert_eq!(
        tree(t.path()),
        Vec::<String>::new(),
        "nothing in the tempdir"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_the_same_data_dir_keeps_the_identities() {
    let t = tempfile::tempdir().unwrap();
    let cfg = || common::config(16 * BS, 16 * BS, &t);
    let first = LocalCluster::start(cfg()).await.unwrap();
    assert!(!first.data_dir_is_private());
    let ids: Vec<String> = first.stores.iter().map(|s| s.identity().into()).collect();
    let incarnations: Vec<u64> = first.stores.iter().map(|s| s.incarnation()).collect();
    assert_ne!(ids[0], ids[1]);
    assert_eq!(mode(&t.path().join("store-0")), 0o700);
    for f in ["LOCK", "store-0/LOCK", "store-0/identity", "store-1/blocks"] {
        assert_eq!(mode(&t.path().join(f)), 0o600, "{f}");
    }

    // Shut down (the handle is still alive): the locks are free, the block
    // file is gone, the identities and the cluster's token stay.
    let token = std::fs::read(t.path().join("token")).unwrap();
    assert_eq!(mode(&t.path().join("token")), 0o600);
    first.shutdown();
    assert_eq!(
        tree(t.path()),
        [
            LOCK_FILE,
            "store-0",
            "store-0/LOCK",
            "store-0/identity",
            "store-1",
            "store-1/LOCK",
            "store-1/identity",
            "token",
        ]
    );
    let second = LocalCluster::start(cfg()).await.unwrap();
    assert_eq!(
        std::fs::read(t.path().join("token")).unwrap(),
        token,
        "the same token"
    );
    for (i, s) in second.stores.iter().enumerate() {
        assert_eq!(s.identity(), ids[i], "store {i} keeps its identity");
        assert_ne!(
            s.incarnation(),
            incarnations[i],
            "store {i}: new incarnation"
        );
    }
    let client = second.client().await.unwrap();
    put(&client, "/after-restart", b"works").await;
    assert_eq!(get(&client, "/after-restart", 5).await, b"works");
    drop(first);
    drop(second);
    let third = LocalCluster::start(cfg()).await.unwrap();
    assert_eq!(third.stores[1].identity(), ids[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_leaves_nothing_behind_and_names_the_os_error_once() {
    let t = tempfile::tempdir().unwrap();
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy_addr = busy.local_addr().unwrap().to_string();
    let in_use = std::net::TcpListener::bind(&busy_addr)
        .unwrap_err()
        .to_string();
    let data_dir = t.path().join("new/cluster");

    // The file store (the last one) cannot listen: the DRAM store and the
    // metadata server had started.
    let mut cfg = common::config(16 * BS, 16 * BS, &t);
    cfg.up.data_dir = Some(data_dir.clone());
    cfg.store = cfg.up_stores();
    for s in &mut cfg.store {
        s.heartbeat_ms = 100;
    }
    cfg.store[1].listen = busy_addr.clone();
    let e = LocalCluster::start(cfg.clone()).await.err().expect("fails");
    assert!(matches!(&e, ClusterError::Store { index: 1, .. }), "{e}");
    let text = chain_text(&e);
    assert_eq!(text.matches(&in_use).count(), 1, "{text}");
    assert_eq!(text.matches("os error").count(), 1, "{text}");
    assert!(
        !t.path().join("new").exists(),
        "nothing left: {:?}",
        tree(t.path())
    );

    // The metadata server cannot listen.
    cfg.store[1].listen = "127.0.0.1:0".into();
    cfg.meta.listen = busy_addr;
    let e = LocalCluster::start(cfg.clone()).await.err().expect("fails");
    let text = chain_text(&e);
    assert_eq!(text.matches(&in_use).count(), 1, "{text}");
    assert!(!t.path().join("new").exists());

    // A data directory that is a file.
    let not_dir = t.path().join("file");
    std::fs::write(&not_dir, b"").unwrap();
    cfg.meta.listen = "127.0.0.1:0".into();
    cfg.up.data_dir = Some(not_dir.join("d"));
    let e = LocalCluster::start(cfg.clone()).await.err().expect("fails");
    let text = chain_text(&e);
    let enotdir = std::fs::create_dir(not_dir.join("d"))
        .unwrap_err()
        .to_string();
    assert_eq!(text.matches(&enotdir).count(), 1, "{text}");
    assert!(text.contains(&not_dir.display().to_string()), "{text}");
}
