//! Memory bounds of a running cluster's ports against peers that send
//! frames and stall, or ask for replies and never read them (issue 36,
//! defects 11 and 12). The servers run in this process, so its anonymous
//! resident memory (`RssAnon` in /proc/self/status) is what they hold; the
//! tests run one at a time so that none measures another's traffic.
//!
//! Every bound is measured, never timed: a test samples the memory while
//! the attack runs and fails at the first sample over the bound; it ends
//! once the attack has done all it can (its connections were closed, or
//! nothing changed for a while: a pause only ends the sampling, so a slow
//! machine can only make a test pass late, never fail).

#[path = "cluster/common/mod.rs"]
mod common;

use bytes::BytesMut;
use common::{blocks_of, config, pattern, start_with, TestCluster};
use nodekernel_client::{CreateOptions, NodeType};
use nodekernel_cluster::ByteSize;
use nodekernel_proto::hello::{Hello, Role, HELLO_ID, HELLO_KIND};
use nodekernel_proto::meta::op as meta_op;
use nodekernel_proto::store::{encode_write_prefix, op as store_op, StoreRequest};
use nodekernel_proto::{FrameHeader, HEADER_LEN, MAX_PAYLOAD_LEN};
use nodekernel_rpc::limits::{MAX_REPLY_BYTES, MAX_REQUEST_BYTES, RECV_BUF_INITIAL, RECV_READ_MIN};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: usize = 1 << 20;

/// A connection's receive buffer, at most, while no frame of it holds
/// room in the request budget.
const CONN_BUF: usize = RECV_BUF_INITIAL + RECV_READ_MIN;

/// Freed read and write buffers a file server keeps for reuse
/// (`file::buf::POOL_BYTES`).
const FILE_POOL: usize = 64 * MIB;

/// What else the process may allocate meanwhile (the runtime, the
/// allocator's own bookkeeping).
const SLACK: usize = 32 * MIB;

/// Bound that only catches hangs.
const HANG: Duration = Duration::from_secs(180);

/// One test at a time: each measures the whole process.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn run(test: impl std::future::Future<Output = ()>) {
    let _one = serial();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(test)
}

/// This process's anonymous resident memory (heap and stacks; not the
/// DRAM region, which is shared memory, nor file pages).
fn rss_anon() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("RssAnon:"))
        .expect("RssAnon in /proc/self/status");
    let kb: usize = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("RssAnon in kB");
    kb * 1024
}

fn frame_header(id: u64, kind: u16, payload_len: usize) -> Vec<u8> {
    FrameHeader::encode(id, kind, payload_len).to_vec()
}

/// A raw connection past its HELLO exchange (the cluster has no token).
async fn raw(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut p = BytesMut::new();
    Hello::new(Role::Client).encode(&mut p).unwrap();
    let mut f = frame_header(HELLO_ID, HELLO_KIND, p.len());
    f.extend_from_slice(&p);
    s.write_all(&f).await.unwrap();
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).await.unwrap();
    let hdr = FrameHeader::parse(&h).unwrap();
    assert_eq!(hdr.kind, 0, "the HELLO is answered");
    let mut rest = vec![0u8; hdr.payload_len];
    s.read_exact(&mut rest).await.unwrap();
    s
}

/// Sends the header of a frame of `kind` announcing `payload` bytes and
/// expects it refused at once, from the header alone: a `Protocol` error
/// naming the limit, then the connection closed.
async fn refused_from_its_header(addr: &str, kind: u16, payload: usize, limit: usize) {
    let mut s = raw(addr).await;
    s.write_all(&frame_header(9, kind, payload)).await.unwrap();
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).await.unwrap();
    let hdr = FrameHeader::parse(&h).unwrap();
    let mut msg = vec![0u8; hdr.payload_len];
    s.read_exact(&mut msg).await.unwrap();
    let msg = String::from_utf8_lossy(&msg);
    assert_eq!(
        (hdr.id, hdr.kind),
        (9, nodekernel_proto::ErrorCode::Protocol as u16),
        "{msg}"
    );
    assert!(msg.contains(&format!("at most {limit} bytes")), "{msg}");
    assert_eq!(s.read(&mut [0u8; 1]).await.unwrap(), 0, "closed");
}

/// Samples the memory while an attack runs: fails at the first sample
/// more than `bound` bytes over `base`, and returns the highest growth
/// once `done` holds or nothing (`progress` and memory) changed for a
/// while.
async fn watch(
    what: &str,
    base: usize,
    bound: usize,
    mut done: impl FnMut() -> bool,
    progress: impl Fn() -> usize,
) -> usize {
    const QUIET: u32 = 150; // samples of 20 ms without any change
    let mut most = 0;
    let (mut last, mut quiet) = ((usize::MAX, usize::MAX), 0);
    let r = tokio::time::timeout(HANG, async {
        loop {
            let grew = rss_anon().saturating_sub(base);
            most = most.max(grew);
            assert!(
                grew <= bound,
                "{what}: the servers' memory grew by {} MiB, over the bound of {} MiB",
                grew / MIB,
                bound / MIB
            );
            if done() {
                return;
            }
            let now = (progress(), grew / MIB);
            quiet = if now == last { quiet + 1 } else { 0 };
            last = now;
            if quiet >= QUIET {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    r.unwrap_or_else(|_| panic!("{what}: hung"));
    most
}

/// Waits until the memory is back within `slack` of `base` (the freed
/// buffers went back to the system), failing only if that hangs.
async fn returns_to(what: &str, base: usize, slack: usize) {
    let r = tokio::time::timeout(HANG, async {
        while rss_anon().saturating_sub(base) > slack {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if r.is_err() {
        panic!(
            "{what}: {} MiB more than before stayed after the connections closed \
             (at most {} MiB may stay)",
            rss_anon().saturating_sub(base) / MIB,
            slack / MIB
        );
    }
}

/// `n` connections that each send the header of a frame of `payload`
/// bytes of request `kind` and all of its bytes but the last (`body`
/// makes them), then stall. Returns the writers (done: wrote it all, or
/// the server closed) and a counter of those finished.
fn stalled_frames(
    addr: &str,
    n: usize,
    kind: u16,
    payload: usize,
    body: impl Fn(&mut Vec<u8>) + Clone + Send + 'static,
) -> (Vec<tokio::task::JoinHandle<TcpStream>>, Arc<AtomicUsize>) {
    let finished = Arc::new(AtomicUsize::new(0));
    let tasks = (0..n)
        .map(|i| {
            let (addr, finished, body) = (addr.to_string(), finished.clone(), body.clone());
            tokio::spawn(async move {
                let mut s = raw(&addr).await;
                let mut f = frame_header(i as u64 + 1, kind, payload);
                body(&mut f);
                // The rest from one shared chunk: this process's memory
                // must be the servers'.
                static CHUNK: [u8; 1 << 20] = [7; 1 << 20];
                let mut left = HEADER_LEN + payload - 1 - f.len();
                // Refused mid-way (the server closed) or all written: either
                // way this connection has done what it can.
                if s.write_all(&f).await.is_ok() {
                    while left > 0 {
                        let n = left.min(CHUNK.len());
                        if s.write_all(&CHUNK[..n]).await.is_err() {
                            break;
                        }
                        left -= n;
                    }
                }
                finished.fetch_add(1, Ordering::SeqCst);
                s
            })
        })
        .collect();
    (tasks, finished)
}

/// A cluster whose blocks are `block` bytes, with a DRAM and a file
/// storage server, and no token: every peer gets past the handshake (the
/// most a peer can do; with a token, any member can do the same).
async fn cluster(block: usize) -> TestCluster {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(4 * block as u64, 4 * block as u64, &dir);
    cfg.meta.block_size = ByteSize(block as u64);
    cfg.security.insecure = true;
    start_with(cfg, dir).await
}

/// A first value, so that what a cluster allocates once is in the
/// baseline.
async fn warm_up(t: &TestCluster) {
    let c = &t.client;
    c.create("/t", NodeType::Table, Default::default())
        .await
        .unwrap();
    c.put("/t/warm", b"up").await.unwrap();
    assert_eq!(c.get("/t/warm").await.unwrap(), b"up");
}

async fn read_file(c: &nodekernel_client::Client, path: &str) -> Vec<u8> {
    let r = c.lookup(path).await.unwrap();
    let mut back = vec![0u8; MIB];
    r.read_at(0, &mut back).await.unwrap();
    back
}

/// Address of the DRAM server (`dram`) or of the file server.
fn store_addr(t: &TestCluster, dram: bool) -> String {
    let s = t
        .cluster
        .stores
        .iter()
        .find(|s| s.shared_memory_name().is_some() == dram)
        .expect("a DRAM and a file storage server");
    s.local_addr().to_string()
}

/// Defect 11 on the metadata port: 64 connections past their HELLO that
/// each send a 16 MiB frame and stall took the metadata server from 26 to
/// 1,053 MiB. No metadata request is larger than a few KiB, so each such
/// frame is refused from its header, before its payload is buffered.
#[test]
fn frames_stalled_on_the_metadata_port_hold_no_memory() {
    run(async {
        let t = cluster(MIB).await;
        let meta = t.cluster.meta_addr().to_string();
        warm_up(&t).await;
        let limit = nodekernel_proto::meta::max_request_len(meta_op::LOOKUP);
        refused_from_its_header(&meta, meta_op::LOOKUP, limit + 1, limit).await;
        let base = rss_anon();
        let (conns, finished) = stalled_frames(&meta, 64, meta_op::LOOKUP, MAX_PAYLOAD_LEN, |_| {});
        let most = watch(
            "64 stalled 16 MiB frames at the metadata server",
            base,
            64 * CONN_BUF + SLACK,
            || finished.load(Ordering::SeqCst) == 64,
            || finished.load(Ordering::SeqCst),
        )
        .await;
        eprintln!("metadata port: grew by at most {} MiB", most / MIB);
        // The server still serves.
        assert_eq!(t.client.get("/t/warm").await.unwrap(), b"up");
        for c in conns {
            drop(c.await.unwrap());
        }
    });
}

/// Defect 11 on the data ports: writes of a whole 16 MiB block that stall
/// before their last byte. A DRAM server receives a write with a valid
/// capability straight into its block; one with a made-up capability (a
/// stranger's) is buffered like every write to a file server. Either way
/// the bytes buffered for unfinished frames stay within the server's
/// budget (`limits::MAX_REQUEST_BYTES`).
#[test]
fn stalled_writes_on_both_stores_stay_within_the_request_budget() {
    run(async {
        let block = 16 * MIB;
        let t = cluster(block).await;
        warm_up(&t).await;
        for dram in [true, false] {
            let addr = store_addr(&t, dram);
            // More than a block is refused before any of it is read.
            let most = nodekernel_proto::store::WRITE_PREFIX_LEN + block;
            refused_from_its_header(&addr, store_op::WRITE, most + 1, most).await;
            let base = rss_anon();
            let prefix = |f: &mut Vec<u8>| {
                let mut p = BytesMut::new();
                encode_write_prefix(&mut p, 0, 1, 0, &Default::default());
                f.extend_from_slice(&p);
            };
            let payload = nodekernel_proto::store::WRITE_PREFIX_LEN + block;
            let (conns, finished) = stalled_frames(&addr, 64, store_op::WRITE, payload, prefix);
            let what = format!(
                "64 stalled 16 MiB writes at the {} server",
                if dram { "DRAM" } else { "file" }
            );
            let most = watch(
                &what,
                base,
                MAX_REQUEST_BYTES + 64 * CONN_BUF + SLACK,
                || finished.load(Ordering::SeqCst) == 64,
                || finished.load(Ordering::SeqCst),
            )
            .await;
            eprintln!("{what}: grew by at most {} MiB", most / MIB);
            for c in conns {
                c.abort();
            }
            returns_to(&what, base, SLACK).await;
        }
        assert_eq!(t.client.get("/t/warm").await.unwrap(), b"up");
    });
}

/// Defect 12: 20 connections that each pipeline 200 reads of a whole
/// 1 MiB block and never read a reply took a file server from 27 to 1,317
/// MiB, and 1.18 GiB stayed after the connections closed. The replies
/// waiting for their peer stay within the server's budget
/// (`limits::MAX_REPLY_BYTES`), and their memory goes back to the system
/// once the connections close. A DRAM server sends read replies from its
/// region and holds nothing for them.
#[test]
fn unread_read_replies_on_both_stores_stay_within_the_reply_budget() {
    run(async {
        let t = cluster(MIB).await;
        let c = &t.client;
        let data = pattern(1, MIB);
        for (class, path) in [(0u8, "/dram"), (1, "/file")] {
            let opts = CreateOptions {
                storage_class: Some(class),
                ..Default::default()
            };
            let mut f = c.create(path, NodeType::File, opts).await.unwrap();
            f.append(&data).await.unwrap();
            f.close().await.unwrap();
            assert_eq!(read_file(c, path).await, data);
        }
        for (dram, path) in [(true, "/dram"), (false, "/file")] {
            let loc = blocks_of(c, path).await[0].clone();
            assert_eq!(loc.addr, store_addr(&t, dram), "{path} is on its server");
            let mut read = BytesMut::new();
            StoreRequest::Read {
                block: loc.block,
                gen: loc.gen,
                offset: 0,
                len: MIB as u32,
                tag: None,
                cap: loc.cap,
            }
            .encode(&mut read);
            let base = rss_anon();
            let mut conns = Vec::new();
            for _ in 0..20 {
                let mut s = raw(&loc.addr).await;
                let mut reqs = Vec::new();
                for id in 1..=200u64 {
                    reqs.extend_from_slice(&frame_header(id, store_op::READ, read.len()));
                    reqs.extend_from_slice(&read);
                }
                s.write_all(&reqs).await.unwrap();
                conns.push(s);
            }
            let what = format!(
                "20 connections x 200 unread 1 MiB reads at the {} server",
                if dram { "DRAM" } else { "file" }
            );
            let bound = MAX_REPLY_BYTES + FILE_POOL + 20 * CONN_BUF + SLACK;
            let most = watch(&what, base, bound, || false, || 0).await;
            eprintln!("{what}: grew by at most {} MiB", most / MIB);
            drop(conns);
            returns_to(&what, base, FILE_POOL + SLACK).await;
            // The server serves on.
            assert_eq!(read_file(c, path).await, data);
        }
    });
}
