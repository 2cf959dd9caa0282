//! A storage server restarted alone (issue #13 acceptance 3,
//! `docs/persistence.md`, *Storage servers*): a persistent one comes back with every block it held, under
//! the same identity and incarnation, and the metadata server keeps every
//! mapping; one that comes back empty turns exactly its own blocks into
//! `DataLost`, and everything on the other servers stays readable.

use crate::common;

use common::{pattern, TestCluster};
use nodekernel_client::{Client, CreateOptions, ErrorCode, NodeType};
use std::collections::BTreeMap;

/// Path → bytes.
type Expected = BTreeMap<String, Vec<u8>>;

/// A persistent cluster (operation log, persistent DRAM and file stores).
async fn persistent(shared_memory: bool) -> TestCluster {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(4 << 20, 16 << 20, &dir);
    cfg.meta.persistence = true;
    cfg.client.shared_memory = shared_memory;
    common::start_with(cfg, dir).await
}

/// Large and small values, Files spanning blocks, in containers pinned to
/// class 0 (`/dram…`, the DRAM server) and class 1 (`/file…`, the file
/// server).
async fn fill(c: &Client) -> (Expected, Expected) {
    let mut on = [Expected::new(), Expected::new()];
    for (class, tier) in [(0u8, "dram"), (1, "file")] {
        let opts = CreateOptions {
            storage_class: Some(class),
            ..CreateOptions::default()
        };
        let (dir, table) = (format!("/{tier}"), format!("/{tier}_kv"));
        c.create(&dir, NodeType::Directory, opts.clone())
            .await
            .unwrap();
        c.create(&table, NodeType::Table, opts).await.unwrap();
        let want = &mut on[class as usize];
        for (i, len) in [10usize, 700, 3000, 100_000].into_iter().enumerate() {
            let p = format!("{table}/k{i}");
            let v = pattern(i as u64 + 7 * class as u64, len);
            c.put(&p, &v).await.unwrap();
            want.insert(p, v);
        }
        let p = format!("{dir}/big");
        let v = pattern(99 + class as u64, 300_000);
        let mut f = c
            .create(&p, NodeType::File, CreateOptions::default())
            .await
            .unwrap();
        f.append(&v).await.unwrap();
        f.close().await.unwrap();
        want.insert(p, v);
    }
    let [dram, file] = on;
    (dram, file)
}

async fn check(c: &Client, want: &Expected, when: &str) {
    for (p, v) in want {
        let got = c.get(p).await.unwrap_or_else(|e| panic!("{p} {when}: {e}"));
        assert!(got == *v, "{p} {when}: other bytes");
    }
}

async fn a_store_restarted_alone_keeps_its_blocks(shared_memory: bool) {
    let mut t = persistent(shared_memory).await;
    let (dram, file) = fill(&t.client).await;
    // A handle taken before the restarts, and a File left open for writing.
    let old = t.client.lookup("/dram/big").await.unwrap();
    let mut open = t
        .client
        .create("/file/open", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    open.append(&pattern(1, 5000)).await.unwrap();
    open.sync().await.unwrap();

    for i in 0..t.cluster.stores.len() {
        let (identity, incarnation, addr) = {
            let s = &t.cluster.stores[i];
            (
                s.identity().to_string(),
                s.incarnation(),
                s.advertised_addr().to_string(),
            )
        };
        let s = t.cluster.restart_store(i).await.expect("restarts");
        assert_eq!(s.kept_blocks(), Some(Ok(())), "store {i} kept its blocks");
        assert_eq!(s.identity(), identity);
        assert_eq!(s.incarnation(), incarnation, "store {i}: same incarnation");
        assert_eq!(
            s.advertised_addr(),
            addr,
            "store {i}: its old port was free"
        );
        check(&t.client, &dram, &format!("after store {i} restarted")).await;
        check(&t.client, &file, &format!("after store {i} restarted")).await;
    }
    // Still one registration per server: nothing was replaced or lost.
    let st = t.client.status().await.unwrap();
    assert_eq!(st.servers.len(), 2, "{st:?}");

    // Old handles and writers carry on.
    let got = old.read(0, 300_000).await.unwrap();
    assert!(got == dram["/dram/big"], "a handle from before the restart");
    open.append(&pattern(2, 3000)).await.unwrap();
    open.close().await.unwrap();
    let mut want = pattern(1, 5000);
    want.extend(pattern(2, 3000));
    assert!(t.client.get("/file/open").await.unwrap() == want);

    // New work lands on both tiers, and a fresh client sees everything.
    let (dram2, file2) = {
        let c = &t.client;
        c.delete("/dram", true).await.unwrap();
        c.delete("/file", true).await.unwrap();
        c.delete("/dram_kv", true).await.unwrap();
        c.delete("/file_kv", true).await.unwrap();
        fill(c).await
    };
    let fresh = t.cluster.client().await.unwrap();
    check(&fresh, &dram2, "written after the restarts").await;
    check(&fresh, &file2, "written after the restarts").await;
    // The writes after the restarts took the configured path too (a
    // restarted DRAM server is mapped afresh).
    common::assert_data_path(&t, &t.client, shared_memory);
}

on_both_paths!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_store_restarted_alone_keeps_its_blocks_ => a_store_restarted_alone_keeps_its_blocks);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_restarted_empty_loses_exactly_its_blocks() {
    let mut t = persistent(true).await;
    let (dram, file) = fill(&t.client).await;
    let old_incarnation = t.cluster.stores[0].incarnation();
    let data_dir = t.cluster.stores[0].data_dir().unwrap().to_path_buf();
    // What a wiped machine leaves: the identity and nothing else.
    t.cluster.stores[0].shutdown();
    for e in std::fs::read_dir(&data_dir).unwrap() {
        let p = e.unwrap().path();
        if p.file_name()
            .is_some_and(|n| n != "identity" && n != "LOCK")
        {
            std::fs::remove_file(&p).unwrap();
        }
    }
    let s = t.cluster.restart_store(0).await.expect("restarts");
    let why = match s.kept_blocks() {
        Some(Err(why)) => why,
        other => panic!("the DRAM store kept blocks it no longer has: {other:?}"),
    };
    eprintln!("started empty because: {why}");
    assert_ne!(s.incarnation(), old_incarnation, "a new incarnation");

    for p in dram.keys() {
        let e = t.client.get(p).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::DataLost, "{p}: {e}");
        assert!(e.message.contains(p.as_str()), "the error names {p}: {e}");
    }
    check(&t.client, &file, "on the other server").await;
    // The namespace is intact and usable: a lost value can be replaced, and
    // the listing still names every node.
    let mut names = t.client.enumerate("/dram_kv").await.unwrap();
    names.sort();
    assert_eq!(names, ["k0", "k1", "k2", "k3"]);
    let v = pattern(5, 2000);
    t.client.put("/dram_kv/k1", &v).await.unwrap();
    assert!(t.client.get("/dram_kv/k1").await.unwrap() == v);
    let st = t.client.status().await.unwrap();
    assert_eq!(
        st.servers.len(),
        2,
        "the old registration was replaced: {st:?}"
    );
}

/// A persistent store whose old port was taken comes back on another one:
/// the metadata server records its new address, and a handle that still
/// holds the old one follows it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_back_on_another_port_is_followed_there() {
    let mut t = persistent(false).await;
    let (dram, file) = fill(&t.client).await;
    let old = t.client.lookup("/file/big").await.unwrap();
    let (old_addr, incarnation) = {
        let s = &t.cluster.stores[1];
        (s.advertised_addr().to_string(), s.incarnation())
    };
    t.cluster.stores[1].shutdown();
    // Another program holds the port while the server starts again, then
    // goes: the old address refuses connections.
    let mut squatter = None;
    for _ in 0..600 {
        if let Ok(l) = std::net::TcpListener::bind(&old_addr) {
            squatter = Some(l);
            break;
        }
        // The stopped server's listener is still closing.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let squatter = squatter.expect("the old port comes free");
    // It closes what it accepts, as a program that does not speak the
    // protocol would. (One that accepts and never answers holds up the
    // metadata server's check that the old address no longer serves this
    // server until its request timeout: the tests' two minutes.)
    let squatter = refuse_all(squatter);
    let s = t.cluster.restart_store(1).await.expect("restarts");
    assert_ne!(s.advertised_addr(), old_addr, "its old port was taken");
    assert_eq!(s.kept_blocks(), Some(Ok(())));
    assert_eq!(s.incarnation(), incarnation);
    drop(squatter);

    let got = old.read(0, 300_000).await.unwrap();
    assert!(
        got == file["/file/big"],
        "the old handle followed the server"
    );
    check(&t.client, &file, "at the new address").await;
    check(&t.client, &dram, "on the other server").await;
    let st = t.client.status().await.unwrap();
    assert_eq!(st.servers.len(), 2, "the same server, readdressed: {st:?}");
    let now = t.cluster.stores[1].advertised_addr();
    assert!(st.servers.iter().any(|x| x.addr == now), "{st:?}");
}

/// Accepts on `l` and closes each connection at once, on a thread of its
/// own, until the returned guard drops (the port is free again then).
fn refuse_all(l: std::net::TcpListener) -> impl Drop {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    struct Stop {
        addr: std::net::SocketAddr,
        stop: Arc<AtomicBool>,
        thread: Option<std::thread::JoinHandle<()>>,
    }
    impl Drop for Stop {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            // Wakes the accept loop, which then sees the flag and ends.
            let _ = std::net::TcpStream::connect(self.addr);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
    let addr = l.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        for conn in l.incoming() {
            drop(conn);
            if flag.load(Ordering::SeqCst) {
                break;
            }
        }
    });
    Stop {
        addr,
        stop,
        thread: Some(thread),
    }
}
