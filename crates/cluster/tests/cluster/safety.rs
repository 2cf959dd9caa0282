//! Data safety on fault paths, end to end in one process: blocks that move
//! under readers and writers, puts that fail, stores that die silently or
//! stop answering, writers whose lease was taken over.

use crate::common;

use common::{pattern, start_on_path, start_with, BS};
use nodekernel_client::{
    Access, AccessHook, BufferedWriter, Client, CreateOptions, ErrorCode, NodeType, StreamOptions,
};
use nodekernel_cluster::{ByteSize, Medium, StoreSection};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Generous bound that only catches hangs.
const HANG: Duration = Duration::from_secs(120);

/// Blocks in use over all storage servers, as `status` says.
fn used(st: &nodekernel_client::ClusterStatus) -> u64 {
    st.servers.iter().map(|x| x.used_blocks).sum()
}

/// [`used`], asked of the cluster now.
async fn used_blocks(c: &Client) -> u64 {
    used(&c.status().await.unwrap())
}

/// Waits (at most [`HANG`]) until no put is in progress and `baseline`
/// blocks are used again: aborted puts give their space back in the
/// background. Fails naming `what` (the puts that were dropped).
async fn wait_for_baseline(c: &Client, baseline: u64, what: &str) {
    let settled = tokio::time::timeout(HANG, async {
        loop {
            let s = c.status().await.unwrap();
            if s.puts_in_progress == 0 && used(&s) == baseline {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let s = c.status().await.unwrap();
    assert!(
        settled.is_ok(),
        "{what}: {} puts still in progress, {} blocks used (baseline {baseline})",
        s.puts_in_progress,
        used(&s)
    );
}

const MIB: usize = 1 << 20;

/// 64 MiB of DRAM in 1 MiB blocks, write leases of `lease_ms`, and the
/// ticker (which sweeps after vanished writers) every quarter of
/// `dead_after_ms`.
async fn lease_cluster(lease_ms: u64, dead_after_ms: u64) -> common::TestCluster {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(64 << 20, 0, &dir);
    cfg.meta.block_size = ByteSize(MIB as u64);
    cfg.meta.lease_timeout_ms = lease_ms;
    cfg.meta.dead_after_ms = dead_after_ms;
    start_with(cfg, dir).await
}

/// Creates the table `/t` that the tests' values live in.
async fn table(c: &Client) {
    c.create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
}

on_both_paths!(#[tokio::test(flavor = "multi_thread", worker_threads = 2)] blocks_move_under_a_reader_and_a_writer => move_under_io);

/// Blocks of a file being read and of a file being written move between
/// the DRAM and the file tier (the metadata server's test hook) again and
/// again: the reader and the writer see no error, and every byte is right.
async fn move_under_io(shared_memory: bool) {
    let t = start_on_path(8 << 20, 8 << 20, shared_memory).await;
    let c = &t.client;
    table(c).await;
    let data = pattern(1, 3 * BS as usize);
    c.put("/t/r", &data).await.unwrap();
    let r = c.lookup("/t/r").await.unwrap();
    let r_id = r.info().id;
    let mut w = c
        .create("/w", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    let w_id = w.info().id;
    w.append(&pattern(2, 1000)).await.unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = stop.clone();
        let data = data.clone();
        tokio::spawn(async move {
            let mut reads = 0u64;
            let mut buf = vec![0u8; data.len()];
            while !stop.load(Ordering::Acquire) || reads < 3 {
                r.read_at(0, &mut buf).await.expect("read while moving");
                assert!(buf == data, "read {reads} returned other bytes");
                reads += 1;
            }
            reads
        })
    };
    let writer = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut expect = pattern(2, 1000);
            let mut n = 0u64;
            while !stop.load(Ordering::Acquire) || n < 3 {
                let piece = pattern(100 + n, 777);
                // However slow the moves, the file never outgrows an eighth
                // of the cluster: past that the writer overwrites in place.
                if expect.len() + piece.len() <= (2 << 20) {
                    w.append(&piece).await.expect("append while moving");
                    expect.extend_from_slice(&piece);
                } else {
                    let at = (n as usize * 7919) % (expect.len() - piece.len());
                    w.write_at(at as u64, &piece)
                        .await
                        .expect("overwrite while moving");
                    expect[at..at + piece.len()].copy_from_slice(&piece);
                }
                n += 1;
                if n.is_multiple_of(8) {
                    w.sync().await.expect("sync while moving");
                }
            }
            w.close().await.expect("close");
            expect
        })
    };
    // Move blocks of both nodes back and forth while they run.
    let mut moved = 0;
    for round in 0..40u64 {
        let (node, index) = if round % 2 == 0 {
            (r_id, round / 2 % 3)
        } else {
            (w_id, 0)
        };
        match t
            .cluster
            .meta
            .move_block(node, index, nodekernel_proto::NO_CLASS)
            .await
        {
            Ok(()) => moved += 1,
            // The writer's block may be mid-move or not yet allocated.
            Err(e) => assert!(
                matches!(e.code, ErrorCode::Busy | ErrorCode::OutOfRange),
                "move {round}: {e}"
            ),
        }
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::Release);
    let reads = tokio::time::timeout(HANG, reader).await.unwrap().unwrap();
    let expect = tokio::time::timeout(HANG, writer).await.unwrap().unwrap();
    assert!(moved >= 20, "only {moved} moves happened");
    assert!(reads >= 3);
    assert_eq!(c.get("/w").await.unwrap(), expect, "the written bytes");
    assert_eq!(c.get("/t/r").await.unwrap(), data);
}

/// A put that runs out of space leaves nothing behind: no node, no held
/// blocks, and the same key can be put right after.
#[tokio::test]
async fn a_failed_put_leaves_nothing_behind() {
    let t = common::start(16 * BS, 32 * BS).await;
    let c = &t.client;
    table(c).await;
    let before = c.status().await.unwrap();
    let err = c
        .put("/t/big", &pattern(3, 100 * BS as usize))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::NoSpace, "{err}");
    let after = c.status().await.unwrap();
    assert_eq!(after.puts_in_progress, 0, "the put was dropped");
    assert_eq!(used(&after), used(&before), "every block is free again");
    assert_eq!(
        c.lookup("/t/big").await.unwrap_err().code,
        ErrorCode::NotFound
    );
    // Not AlreadyExists, not NoSpace: the space is back.
    c.put("/t/big", &pattern(4, 10 * BS as usize))
        .await
        .unwrap();
    assert_eq!(c.get("/t/big").await.unwrap(), pattern(4, 10 * BS as usize));
}

/// A put whose future is dropped at any point, from before its create is
/// sent to after its close (timeouts of nothing up to about a whole put),
/// leaves nothing behind: it is aborted in the background, so every block
/// is free again without the metadata server's sweep (which cannot run
/// here: the lease is ten minutes), and the space can be used right away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_put_frees_its_blocks_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(40 * BS, 0, &dir);
    cfg.meta.lease_timeout_ms = 600_000;
    let t = start_with(cfg, dir).await;
    let c = &t.client;
    table(c).await;
    // The table keeps the block its child records took.
    c.put("/t/k", b"x").await.unwrap();
    c.delete("/t/k", false).await.unwrap();
    let baseline = used(&c.status().await.unwrap());
    let value = pattern(5, 16 * BS as usize);
    let mut dropped = 0;
    for i in 0..300u64 {
        let put = c.put("/t/k", &value);
        if tokio::time::timeout(Duration::from_micros(i * 3), put)
            .await
            .is_err()
        {
            dropped += 1;
        }
    }
    assert!(dropped > 0, "no put was dropped: the test proves nothing");
    // A put that finished in time is the value of /t/k.
    match c.delete("/t/k", false).await {
        Err(e) if e.code == ErrorCode::NotFound => {}
        r => r.unwrap(),
    }
    wait_for_baseline(c, baseline, &format!("{dropped} dropped puts")).await;
    // Room for two values at once: no dropped put holds anything.
    c.put("/t/a", &value).await.unwrap();
    c.put("/t/b", &value).await.unwrap();
    assert_eq!(c.get("/t/b").await.unwrap(), value);
}

/// A `put_many` dropped at any point (timeouts of nothing up to about the
/// whole batch) leaves nothing of the puts it had in flight: each is
/// aborted in the background, so the used blocks come back to what the
/// finished puts hold without the metadata server's sweep (the lease is
/// ten minutes here), and the space can be used right away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_put_many_frees_the_blocks_of_its_puts_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(40 * BS, 0, &dir);
    cfg.meta.lease_timeout_ms = 600_000;
    // No reserved puts: the small puts below would reserve a slab's pieces,
    // which the client gives back when a put meets NoSpace, taking the
    // count below the baseline.
    cfg.client.reserved_puts = 0;
    let t = start_with(cfg, dir).await;
    let c = &t.client;
    table(c).await;
    // The table keeps the pieces its child records took (records of four
    // keys: three pieces).
    let keys: Vec<String> = (0..4).map(|i| format!("/t/k{i}")).collect();
    for k in &keys {
        c.put(k, b"x").await.unwrap();
    }
    for k in &keys {
        c.delete(k, false).await.unwrap();
    }
    let baseline = used(&c.status().await.unwrap());
    let value = pattern(5, 4 * BS as usize);
    let items: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), &value[..])).collect();
    let mut dropped = 0;
    for i in 0..200u64 {
        let put = c.put_many(&items, 4);
        if tokio::time::timeout(Duration::from_micros(i * 5), put)
            .await
            .is_err()
        {
            dropped += 1;
        }
    }
    assert!(
        dropped > 0,
        "no put_many was dropped: the test proves nothing"
    );
    // The puts that finished in time are the values of the keys.
    for r in c.delete_many(&keys, false, 4).await.unwrap() {
        match r {
            Err(e) if e.code == ErrorCode::NotFound => {}
            r => r.unwrap(),
        }
    }
    wait_for_baseline(c, baseline, &format!("{dropped} dropped batches")).await;
    // Room for eight values at once: no dropped put holds anything.
    let keys: Vec<String> = (0..8).map(|i| format!("/t/after{i}")).collect();
    let items: Vec<(&str, &[u8])> = keys.iter().map(|k| (k.as_str(), &value[..])).collect();
    for r in c.put_many(&items, 8).await.unwrap() {
        r.unwrap();
    }
    assert_eq!(c.get("/t/after7").await.unwrap(), value);
}

/// Two DRAM stores; one stops without the metadata server noticing (long
/// dead-after). Puts still succeed: blocks that land on the dead store are
/// written elsewhere while the value is in the client's hands.
async fn writes_move_off_a_silently_dead_store(shared_memory: bool) {
    let dir = tempfile::tempdir().unwrap();
    // The metadata server never notices (the defaults: a long dead-after).
    let mut cfg = common::config(0, 0, &dir);
    cfg.client.shared_memory = shared_memory;
    cfg.store = (0..2)
        .map(|_| StoreSection {
            size: ByteSize(64 * BS),
            medium: Medium::Dram,
            ..StoreSection::default()
        })
        .collect();
    let t = start_with(cfg, dir).await;
    let c = &t.client;
    table(c).await;
    c.put("/t/warm", b"x").await.unwrap();
    t.cluster.stores[0].shutdown();
    for i in 0..8u64 {
        let v = pattern(10 + i, (2 * BS + 5) as usize);
        c.put(&format!("/t/k{i}"), &v)
            .await
            .unwrap_or_else(|e| panic!("put {i}: {e}"));
        assert_eq!(c.get(&format!("/t/k{i}")).await.unwrap(), v);
    }
}

on_both_paths!(#[tokio::test] puts_survive_a_silently_dead_store => writes_move_off_a_silently_dead_store);

/// A File's close that fails (the storage server its last bytes were
/// going to is gone, the only one) still releases its write lease: another
/// writer opens it at once instead of getting `Busy` until the lease (ten
/// minutes here) lapses. The Spark shuffle's retries met that `Busy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_that_fails_releases_the_write_lease() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(0, 0, &dir);
    cfg.client.shared_memory = false;
    cfg.meta.lease_timeout_ms = 600_000;
    cfg.store = vec![StoreSection {
        size: ByteSize(64 * BS),
        medium: Medium::Dram,
        ..StoreSection::default()
    }];
    let t = start_with(cfg, dir).await;
    let c = &t.client;
    let node = c
        .create("/f", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    let mut w = BufferedWriter::new(node, StreamOptions::default()).unwrap();
    // Buffered, not sent yet: the close sends it.
    w.write_all(&pattern(1, (BS / 2) as usize)).await.unwrap();
    t.cluster.stores[0].shutdown();
    let e = tokio::time::timeout(HANG, w.close())
        .await
        .expect("the close hung")
        .unwrap_err();
    assert_ne!(e.code, ErrorCode::Busy, "{e}");
    let again = tokio::time::timeout(HANG, c.open_write("/f"))
        .await
        .expect("open_write hung");
    assert!(
        again.is_ok(),
        "the failed close kept the write lease: {:?}",
        again.err()
    );
}

/// A storage server that proves who it is (it answers `Identify`, so its
/// registration is taken) and never answers anything else.
struct BlackHole {
    identity: String,
    key: nodekernel_proto::cap::CapKey,
    handshake: Arc<nodekernel_rpc::VersionHandshake>,
}

impl nodekernel_rpc::Handler for BlackHole {
    fn handshake(&self) -> Arc<dyn nodekernel_rpc::ServerHandshake> {
        self.handshake.clone()
    }

    async fn handle(
        &self,
        op: u16,
        payload: bytes::Bytes,
        out: &mut bytes::BytesMut,
    ) -> nodekernel_proto::Result<()> {
        use nodekernel_proto::store::{Identity, StoreRequest};
        if let Ok(StoreRequest::Identify { nonce }) = StoreRequest::decode(op, &payload) {
            Identity {
                identity: self.identity.clone(),
                incarnation: 1,
                proof: nodekernel_proto::cap::identify_proof(&self.key, &nonce, &self.identity, 1),
            }
            .encode(out);
            return Ok(());
        }
        std::future::pending().await
    }
}

/// Starts a [`BlackHole`] that takes `security`'s token: its address, and
/// the server (serving while it lives).
async fn black_hole(
    security: &nodekernel_rpc::Security,
    key: [u8; 32],
) -> (String, nodekernel_rpc::ServerHandle) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let hole = BlackHole {
        identity: "black-hole".into(),
        key,
        handshake: security.handshake(nodekernel_rpc::Role::StorageServer),
    };
    let server =
        nodekernel_rpc::serve_with(l, Arc::new(hole), Default::default()).expect("serving");
    (addr, server)
}

/// Replies never wait on an unresponsive store: a put whose first block
/// sits on a store that never answers moves it elsewhere (its claim goes
/// to that store in the background), and an abort that frees a block there
/// answers at once rather than timing out.
#[tokio::test]
async fn replies_do_not_wait_on_an_unresponsive_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(64 * BS, 0, &dir);
    // The timeouts under test: a write to the black hole gives up after
    // the client's, a claim after the metadata server's.
    cfg.meta.claim_timeout_ms = 200;
    cfg.client.timeout_ms = 2_000;
    let t = start_with(cfg, dir).await;
    let c = &t.client;
    // Register the black hole as the only server of class 7.
    let security = nodekernel_rpc::Security {
        token: t.cluster.client_config().token,
        ..Default::default()
    };
    let (hole, _hole_server) = black_hole(&security, [3; 32]).await;
    let spec = nodekernel_proto::ServerSpec {
        addr: hole.clone(),
        class: 7,
        class_name: "hole".into(),
        medium: "dram".into(),
        location: "nowhere".into(),
        block_size: BS as u32,
        first_block: 0,
        num_blocks: 16,
        identity: "black-hole".into(),
        incarnation: 1,
        cap_key: [3; 32],
    };
    let req = nodekernel_proto::meta::MetaRequest::Register(spec);
    let mut buf = bytes::BytesMut::new();
    req.encode(&mut buf);
    let pool = security.pool(
        nodekernel_rpc::Role::StorageServer,
        nodekernel_rpc::ConnOptions::new(Duration::from_secs(120)),
    );
    pool.call(&t.cluster.meta_addr().to_string(), req.op(), &[&buf])
        .await
        .unwrap();
    let opts = CreateOptions {
        storage_class: Some(7),
        local: false,
        enumerable: false,
        ..CreateOptions::default()
    };
    c.create("/hole", NodeType::Table, opts.clone())
        .await
        .unwrap();
    // The put's first block is on the black hole (class 7 first).
    let v = pattern(5, (BS + 1) as usize);
    c.put("/hole/k", &v)
        .await
        .expect("put moves off the black hole");
    assert_eq!(c.get("/hole/k").await.unwrap(), v);
    let node = c.lookup("/hole/k").await.unwrap();
    for b in node.block_locations().await.unwrap() {
        assert_ne!(b.addr, hole, "no block of the value is on the black hole");
    }
    // An abandoned put with a block on the black hole: the abort answers.
    let k2 = c
        .create("/hole/k2", NodeType::KeyValue, opts)
        .await
        .unwrap();
    k2.abort().await.expect("abort answers without waiting");
    c.delete("/hole", true).await.expect("delete answers");
}

/// A writer whose lease was taken over cannot write any more, not even to
/// the blocks it already knows: the storage layer refuses them, and the new
/// writer's bytes stay as written.
#[tokio::test]
async fn a_writer_whose_lease_was_taken_over_is_fenced() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(64 * BS, 0, &dir);
    cfg.meta.lease_timeout_ms = 200;
    let t = start_with(cfg, dir).await;
    let c = &t.client;
    // The first writer's client stops renewing its lease (a client that
    // stalls, or is cut off).
    let stalled = Client::connect(nodekernel_client::ClientConfig {
        renew_leases: false,
        ..t.cluster.client_config()
    })
    .await
    .unwrap();
    let mut a = stalled
        .create("/f", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    a.append(b"first writer ").await.unwrap();
    a.sync().await.unwrap();
    // Wait for the lease to expire (an event: open_write stops saying Busy).
    let mut b = tokio::time::timeout(HANG, async {
        loop {
            match c.open_write("/f").await {
                Ok(n) => break n,
                Err(e) if e.code == ErrorCode::Busy => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("open_write: {e}"),
            }
        }
    })
    .await
    .unwrap();
    b.append(b"second writer").await.unwrap();
    // The first writer's late write into its known block is refused.
    let late = a.write_at(0, b"LATE!").await.unwrap_err();
    assert!(
        matches!(late.code, ErrorCode::LeaseExpired | ErrorCode::Stale),
        "{late}"
    );
    b.close().await.unwrap();
    assert_eq!(
        c.get("/f").await.unwrap(),
        b"first writer second writer".to_vec()
    );
}

#[derive(Debug, Default)]
struct Counting {
    mapped_reads: AtomicU64,
    network_reads: AtomicU64,
    writes: AtomicU64,
}

impl AccessHook for Counting {
    fn on_access(&self, a: &Access<'_>) {
        assert!(a.len > 0 && !a.loc.addr.is_empty());
        let c = match (a.write, a.mapped) {
            (true, _) => &self.writes,
            (false, true) => &self.mapped_reads,
            (false, false) => &self.network_reads,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// The access hook sees every transfer, mapped reads included (which no
/// server ever sees).
#[tokio::test]
async fn the_access_hook_sees_mapped_reads() {
    let t = start_on_path(8 << 20, 0, true).await;
    let hook = Arc::new(Counting::default());
    let mut cfg = t.cluster.client_config();
    cfg.access_hook = Some(hook.clone());
    let c = Client::connect(cfg).await.unwrap();
    table(&c).await;
    c.put("/t/v", &pattern(6, (2 * BS) as usize)).await.unwrap();
    assert_eq!(c.get("/t/v").await.unwrap().len(), 2 * BS as usize);
    let stats = c.data_path_stats();
    assert!(stats.mapped_reads >= 2, "{stats:?}");
    assert_eq!(
        hook.mapped_reads.load(Ordering::Relaxed),
        stats.mapped_reads
    );
    assert_eq!(
        hook.network_reads.load(Ordering::Relaxed),
        stats.network_reads
    );
    assert_eq!(
        hook.writes.load(Ordering::Relaxed),
        stats.mapped_writes + stats.network_writes
    );
}

/// Marks the line the killed writer prints once its bytes are written.
const WRITTEN: &str = "nk-test-writer: written";

/// Run in a child process by the test below (it is skipped otherwise):
/// creates `/f` on the cluster named by `NK_TEST_META` (with the token of
/// `NK_TOKEN_FILE`), writes and syncs
/// `NK_TEST_PUBLISH` bytes, writes `NK_TEST_MORE` bytes more without
/// syncing, says so, and waits to be killed.
#[test]
#[ignore = "the writer process of a_killed_writers_unpublished_blocks_come_back_once_its_lease_lapses"]
fn killed_writer_process() {
    let Ok(meta) = std::env::var("NK_TEST_META") else {
        return;
    };
    let size = |var: &str| std::env::var(var).unwrap().parse::<usize>().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // NK_TOKEN_FILE: the cluster's token (`discover` reads it).
        let cfg = nodekernel_client::discover(Some(&meta), None).unwrap();
        let c = Client::connect(cfg).await.unwrap();
        let mut f = c
            .create("/f", NodeType::File, CreateOptions::default())
            .await
            .unwrap();
        f.append(&pattern(7, size("NK_TEST_PUBLISH")))
            .await
            .unwrap();
        f.sync().await.unwrap();
        f.append(&pattern(8, size("NK_TEST_MORE"))).await.unwrap();
        println!("{WRITTEN}");
        std::future::pending::<()>().await;
    });
}

/// A writer that pauses keeps what it wrote: its client's lease keeper
/// renews the lease a few times per lease, so the sweep, which lapses the
/// leases of writers that vanished, never lapses a live writer's (before
/// the keeper, a File writer silent for two leases lost everything past
/// its last sync). A handle dropped unclosed stops being renewed, and its
/// unpublished blocks come back like those of a killed process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_pauses_keeps_its_node_and_a_dropped_one_lets_go() {
    let t = lease_cluster(300, 1200).await;
    let c = &t.client;
    c.create("/warm", NodeType::Directory, CreateOptions::default())
        .await
        .unwrap();
    let before = used_blocks(c).await;
    let mut w = c
        .create("/f", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    let first = pattern(3, 2 * MIB);
    w.append(&first).await.unwrap();
    // Ten leases of silence, unsynced.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    w.renew().await.expect("the lease is still held");
    let second = pattern(4, MIB);
    w.append(&second).await.expect("the writer goes on");
    w.close().await.unwrap();
    assert_eq!(c.get("/f").await.unwrap(), [first, second].concat());

    // A handle dropped unclosed: renewed no more, so its lease lapses and
    // what it never published comes back.
    let mut g = c
        .create("/g", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    g.append(&pattern(5, 2 * MIB)).await.unwrap();
    assert_eq!(used_blocks(c).await, before + 5);
    drop(g);
    let deadline = tokio::time::Instant::now() + HANG;
    while used_blocks(c).await != before + 3 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dropped writer's blocks never came back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(c.get("/g").await.unwrap(), b"", "nothing was published");
}

/// Issue 36, defect 7: a process writing a File is killed (SIGKILL) after
/// 20 MiB, of which it synced the first 2.5 MiB. Once its lease lapses,
/// the sweep gives back every block past the published size (before the
/// fix they stayed used until the File was deleted); the published bytes
/// read back, and a new writer appends after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_writers_unpublished_blocks_come_back_once_its_lease_lapses() {
    use std::io::BufRead;
    let t = lease_cluster(500, 4000).await;
    let c = &t.client;
    // The root's first record block, taken now.
    c.create("/warm", NodeType::Directory, CreateOptions::default())
        .await
        .unwrap();
    let before = used_blocks(c).await;
    let (published, more) = (5 * MIB / 2, 20 * MIB - 5 * MIB / 2);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "safety::killed_writer_process",
            "--ignored",
            "--nocapture",
        ])
        .env("NK_TEST_META", t.cluster.client_config().metas.join(","))
        .env("NK_TOKEN_FILE", t.cluster.token_file().unwrap())
        .env("NK_TEST_PUBLISH", published.to_string())
        .env("NK_TEST_MORE", more.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, said) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut lines = std::io::BufReader::new(out).lines();
        let written = lines.any(|l| l.is_ok_and(|l| l.contains(WRITTEN)));
        let _ = tx.send(written);
        for _ in lines {} // until it is killed
    });
    assert!(
        tokio::time::timeout(HANG, said).await.unwrap().unwrap(),
        "the writer process ended before writing"
    );
    assert_eq!(used_blocks(c).await, before + 20, "20 blocks written");
    child.kill().unwrap();
    child.wait().unwrap();
    let kept = before + published.div_ceil(MIB) as u64;
    let deadline = tokio::time::Instant::now() + HANG;
    loop {
        let now = used_blocks(c).await;
        if now == kept {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the killed writer's unpublished blocks never came back: {now} used, {kept} expected"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut want = pattern(7, published);
    assert_eq!(c.get("/f").await.unwrap(), want, "the published bytes stay");
    let mut w = c.open_write("/f").await.unwrap();
    let tail = pattern(9, MIB);
    w.append(&tail).await.unwrap();
    w.close().await.unwrap();
    want.extend_from_slice(&tail);
    assert_eq!(c.get("/f").await.unwrap(), want, "a new writer appends");
    assert_eq!(
        used_blocks(c).await,
        before + (want.len().div_ceil(MIB)) as u64
    );
}
