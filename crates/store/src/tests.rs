//! End-to-end tests: the storage server over the network, and its
//! registration and heartbeats against a fake metadata server.

use crate::{FileIoConfig, MediumKind, StorageServer, StoreConfig, StoreError};
use bytes::{Bytes, BytesMut};
use nodekernel_proto::cap::{Cap, CapKey, Rights};
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::store::{
    op, read_reply_data, Claim, StoreRequest, TagCheck, READ_CHANGED_HANDS, READ_OK,
};
use nodekernel_proto::sync;
use nodekernel_proto::{Error, ErrorCode, Result};
use nodekernel_rpc::{Connection, Handler, ServerHandle};
use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BS: u32 = 64 << 10;
/// Generous bound that only catches hangs.
const HANG: Duration = Duration::from_secs(120);

fn cfg(medium: MediumKind, blocks: u64) -> StoreConfig {
    StoreConfig {
        listen: "127.0.0.1:0".into(),
        class_name: medium.name().into(),
        medium,
        capacity: blocks * u64::from(BS),
        block_size: BS,
        location: "test-host".into(),
        heartbeat_interval: Duration::from_millis(20),
        rpc_timeout: HANG,
        ..StoreConfig::default()
    }
}

/// The capability key of each storage server these tests started, by
/// address (the tests play the metadata server, which mints
/// capabilities with it).
fn cap_keys() -> std::sync::MutexGuard<'static, std::collections::HashMap<String, CapKey>> {
    static KEYS: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, CapKey>>> =
        std::sync::OnceLock::new();
    sync::lock(KEYS.get_or_init(Default::default))
}

/// [`StorageServer::start`], noting the server's capability key for
/// [`cap`].
async fn start(cfg: StoreConfig) -> std::result::Result<StorageServer, StoreError> {
    start_with_file_io(cfg, FileIoConfig::default()).await
}

/// [`StorageServer::start_with_file_io`], noting the server's capability
/// key for [`cap`].
async fn start_with_file_io(
    cfg: StoreConfig,
    io: FileIoConfig,
) -> std::result::Result<StorageServer, StoreError> {
    let srv = StorageServer::start_with_file_io(cfg, io).await?;
    cap_keys().insert(srv.local_addr().to_string(), *srv.cap_key());
    Ok(srv)
}

/// A capability for all of `block` at `gen` on the server `c` is
/// connected to.
fn cap(c: &Connection, block: u32, gen: u64) -> Cap {
    let key = cap_keys()
        .get(c.peer())
        .copied()
        .expect("a server these tests started");
    Cap::mint(&key, block, gen, 0, u32::MAX, Rights::MANAGE, 0)
}

async fn call(c: &Connection, req: StoreRequest<'_>) -> Result<Bytes> {
    let mut buf = BytesMut::new();
    req.encode(&mut buf);
    c.call(req.op(), &[&buf]).await
}

async fn write(c: &Connection, block: u32, gen: u64, offset: u32, data: &[u8]) -> Result<()> {
    let r = call(
        c,
        StoreRequest::Write {
            block,
            gen,
            offset,
            cap: cap(c, block, gen),
            data,
        },
    )
    .await?;
    assert!(r.is_empty(), "a write reply has no payload");
    Ok(())
}

async fn read(c: &Connection, block: u32, gen: u64, offset: u32, len: u32) -> Result<Bytes> {
    read_tagged(c, block, gen, offset, len, None).await
}

async fn read_tagged(
    c: &Connection,
    block: u32,
    gen: u64,
    offset: u32,
    len: u32,
    tag: Option<TagCheck>,
) -> Result<Bytes> {
    let reply = call(
        c,
        StoreRequest::Read {
            block,
            gen,
            offset,
            len,
            tag,
            cap: cap(c, block, gen),
        },
    )
    .await?;
    read_reply_data(reply, block, gen, len as usize)
}

/// A claim of `block` with `gen` on the server `c` is connected to,
/// clearing no tag.
fn claim(c: &Connection, block: u32, gen: u64) -> Claim {
    Claim {
        block,
        gen,
        clear_tag_at: None,
        scrub: false,
        release: false,
        cap: cap(c, block, gen),
    }
}

async fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + HANG;
    while !cond() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Write/read/ping, errors keeping the connection usable, and shutdown.
async fn serve_over_network(medium: MediumKind) {
    serve_over_network_with(medium, FileIoConfig::default()).await;
}

async fn serve_over_network_with(medium: MediumKind, io: FileIoConfig) {
    let is_file = matches!(medium, MediumKind::File { .. });
    let srv = start_with_file_io(cfg(medium, 4), io.clone())
        .await
        .unwrap();
    if is_file {
        let mode = srv.io_mode();
        assert!(io.io_uring || mode.starts_with("pread/pwrite+"), "{mode}");
        assert!(io.direct || mode.ends_with("+buffered"), "{mode}");
    } else {
        assert_eq!(srv.io_mode(), "memory");
    }
    assert_eq!(srv.num_blocks(), 4);
    assert_eq!(srv.server_ids(), Vec::<Option<u32>>::new());
    let addr = srv.local_addr().to_string();
    assert_ne!(srv.local_addr().port(), 0);
    let c = Connection::connect(&addr, HANG).await.unwrap();

    assert!(call(&c, StoreRequest::Ping).await.unwrap().is_empty());

    let full: Vec<u8> = (0..BS).map(|i| (i % 251) as u8).collect();
    write(&c, 3, 11, 0, &full).await.unwrap();
    assert_eq!(read(&c, 3, 11, 0, BS).await.unwrap(), full);
    write(&c, 3, 11, 1001, b"odd bytes").await.unwrap();
    assert_eq!(
        read(&c, 3, 11, 1000, 11).await.unwrap(),
        [&full[1000..1001], b"odd bytes", &full[1010..1011]].concat()
    );
    assert_eq!(read(&c, 3, 11, BS, 0).await.unwrap(), b"" as &[u8]);

    // Generations over the wire.
    assert_eq!(
        read(&c, 3, 10, 0, 1).await.unwrap_err().code,
        ErrorCode::Stale
    );
    assert_eq!(
        read(&c, 3, 12, 0, 1).await.unwrap_err().code,
        ErrorCode::Stale
    );
    write(&c, 3, 12, 0, b"new owner").await.unwrap();
    assert_eq!(
        write(&c, 3, 11, 0, b"old").await.unwrap_err().code,
        ErrorCode::Stale
    );
    assert_eq!(read(&c, 3, 12, 0, 9).await.unwrap(), b"new owner" as &[u8]);
    assert_eq!(srv.store().generation(3), Some(12));

    // Bounds over the wire.
    for (what, r) in [
        ("past block end", read(&c, 3, 12, BS - 1, 2).await),
        ("huge length", read(&c, 3, 12, 0, u32::MAX).await),
        ("huge offset", read(&c, 3, 12, u32::MAX, u32::MAX).await),
        ("block past end", read(&c, 4, 12, 0, 1).await),
        ("block u32::MAX", read(&c, u32::MAX, 1, 0, 1).await),
    ] {
        assert_eq!(r.unwrap_err().code, ErrorCode::OutOfRange, "{what}");
    }
    assert_eq!(
        write(&c, 0, 1, u32::MAX, b"x").await.unwrap_err().code,
        ErrorCode::OutOfRange
    );
    assert_eq!(
        write(&c, 0, 1, BS - 1, b"xy").await.unwrap_err().code,
        ErrorCode::OutOfRange
    );

    // Garbage: unknown op, malformed payloads. The connection survives.
    let e = c
        .call(999, &[b"\xde\xad\xbe\xef garbage"])
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Protocol, "{e}");
    assert!(e.message.contains("999"), "{e}");
    for (opcode, payload) in [
        (op::READ, &[1u8; 5][..]),
        (op::READ, &[0u8; 22][..]),
        (op::WRITE, &[0u8; 15][..]),
        (op::PING, &[0u8][..]),
    ] {
        let e = c.call(opcode, &[payload]).await.unwrap_err();
        assert_eq!(
            e.code,
            ErrorCode::Protocol,
            "op {opcode} with {} bytes: {e}",
            payload.len()
        );
    }
    assert!(!c.is_closed());
    assert!(call(&c, StoreRequest::Ping).await.unwrap().is_empty());
    assert_eq!(read(&c, 3, 12, 0, 9).await.unwrap(), b"new owner" as &[u8]);

    // The block file: private, preallocated while running; removed at
    // shutdown (this start created it and nothing persists yet).
    let block_file = srv.block_file().map(|p| p.to_path_buf());
    if let Some(p) = &block_file {
        let m = std::fs::metadata(p).unwrap();
        assert_eq!(m.len(), 4 * u64::from(BS));
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
    }
    assert_eq!(block_file.is_some(), is_file);

    // Shutdown: new connections are refused at once, old ones are closed.
    srv.shutdown();
    if let Some(p) = &block_file {
        assert!(!p.exists(), "{} is removed at shutdown", p.display());
    }
    let e = Connection::connect(&addr, HANG)
        .await
        .err()
        .expect("connect after shutdown must fail");
    assert_eq!(e.code, ErrorCode::Unavailable, "{e}");
    let e = call(&c, StoreRequest::Ping).await.unwrap_err();
    assert_eq!(
        e.code,
        ErrorCode::Unavailable,
        "existing connection is closed: {e}"
    );
    srv.shutdown(); // idempotent
    drop(srv);
}

#[tokio::test]
async fn dram_server_over_network() {
    serve_over_network(MediumKind::Dram).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_server_over_network() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dir/blocks.dat");
    serve_over_network(MediumKind::File { path: path.clone() }).await;
    assert!(!path.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_server_over_network_in_fallback_modes() {
    for (direct, io_uring) in [(false, true), (true, false), (false, false)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blocks.dat");
        let io = FileIoConfig {
            direct,
            io_uring,
            queue_depth: 4,
            stream_reads: true,
        };
        serve_over_network_with(MediumKind::File { path }, io).await;
    }
}

#[tokio::test]
async fn bad_file_io_config_names_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(
        MediumKind::File {
            path: dir.path().join("b"),
        },
        1,
    );
    let io = FileIoConfig {
        queue_depth: 0,
        ..FileIoConfig::default()
    };
    let e = start_with_file_io(c, io).await.unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Config {
                field: "queue_depth",
                ..
            }
        ),
        "{e}"
    );
}

/// Many clients writing and reading one file-tier server at once, each on
/// its own connection (the transport handles one request per connection at
/// a time), with small unaligned writes sharing sectors of one block.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_on_the_file_tier() {
    let dir = tempfile::tempdir().unwrap();
    let srv = start(cfg(
        MediumKind::File {
            path: dir.path().join("b"),
        },
        8,
    ))
    .await
    .unwrap();
    let addr = srv.local_addr().to_string();
    let tasks: Vec<_> = (0..16u32)
        .map(|t| {
            let addr = addr.clone();
            tokio::spawn(async move {
                let c = Connection::connect(&addr, HANG).await.unwrap();
                for round in 0..10u32 {
                    // Client t owns bytes [7+t*100, 7+t*100+100) of block
                    // 0: neighbours share 4 KiB sectors, never bytes.
                    let small = vec![(t * 13 + round) as u8; 100];
                    write(&c, 0, 1, t * 100 + 7, &small).await.unwrap();
                    assert_eq!(read(&c, 0, 1, t * 100 + 7, 100).await.unwrap(), small);
                }
                t
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let c = Connection::connect(&addr, HANG).await.unwrap();
    let all = read(&c, 0, 1, 7, 1600).await.unwrap();
    for t in 0..16usize {
        let want = (t as u32 * 13 + 9) as u8;
        assert!(
            all[t * 100..t * 100 + 100].iter().all(|&b| b == want),
            "client {t}'s last write is intact"
        );
    }
}

#[tokio::test]
async fn drop_stops_the_server() {
    let srv = start(cfg(MediumKind::Dram, 1)).await.unwrap();
    let addr = srv.local_addr().to_string();
    Connection::connect(&addr, HANG).await.unwrap();
    drop(srv);
    assert!(Connection::connect(&addr, HANG).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_on_disjoint_blocks() {
    let srv = start(cfg(MediumKind::Dram, 8)).await.unwrap();
    let addr = srv.local_addr().to_string();
    let tasks: Vec<_> = (0..8u32)
        .map(|b| {
            let addr = addr.clone();
            tokio::spawn(async move {
                let c = Connection::connect(&addr, HANG).await.unwrap();
                for round in 0..20u32 {
                    let gen = u64::from(round) + 1;
                    let data = vec![(b * 31 + round) as u8; (BS / 2) as usize + b as usize];
                    write(&c, b, gen, 7, &data).await.unwrap();
                    assert_eq!(read(&c, b, gen, 7, data.len() as u32).await.unwrap(), data);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn bad_config_names_the_field() {
    let mut c = cfg(MediumKind::Dram, 1);
    c.block_size = 1000;
    let e = start(c).await.unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Config {
                field: "block_size",
                ..
            }
        ),
        "{e}"
    );
    let pe: Error = e.into();
    assert_eq!(pe.code, ErrorCode::InvalidArgument);

    let mut c = cfg(MediumKind::Dram, 1);
    c.listen = "not an address".into();
    let e = start(c).await.unwrap_err();
    assert!(e.to_string().contains("not an address"), "{e}");
}

// ---------------------------------------------------------------------------
// Registration and heartbeats against a fake metadata server.

#[derive(Default)]
struct FakeMeta {
    /// Id handed out by the next registration.
    next_id: AtomicU32,
    /// Ids it has handed out; heartbeats from others get `UnknownServer`.
    known: Mutex<HashSet<u32>>,
    registrations: Mutex<Vec<MetaRequest>>,
    /// Server ids of accepted heartbeats, in order.
    heartbeats: Mutex<Vec<u32>>,
    /// Answer the first heartbeat with `UnknownServer` regardless.
    forget_first_heartbeat: bool,
    forgot: AtomicBool,
    /// Refuse registrations with this error.
    refuse: Option<Error>,
}

impl FakeMeta {
    fn new(first_id: u32) -> FakeMeta {
        FakeMeta {
            next_id: AtomicU32::new(first_id),
            ..FakeMeta::default()
        }
    }

    fn registrations(&self) -> Vec<MetaRequest> {
        sync::lock(&self.registrations).clone()
    }

    fn heartbeats(&self) -> Vec<u32> {
        sync::lock(&self.heartbeats).clone()
    }
}

impl Handler for FakeMeta {
    async fn handle(&self, op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        let req = MetaRequest::decode(op, &payload)?;
        let reply = match &req {
            MetaRequest::Register(_) => {
                sync::lock(&self.registrations).push(req.clone());
                if let Some(e) = &self.refuse {
                    return Err(e.clone());
                }
                let id = self.next_id.fetch_add(1, Ordering::SeqCst);
                sync::lock(&self.known).insert(id);
                MetaReply::Registered { server: id }
            }
            MetaRequest::Heartbeat { server, .. } => {
                if self.forget_first_heartbeat && !self.forgot.swap(true, Ordering::SeqCst) {
                    sync::lock(&self.known).remove(server);
                }
                if !sync::lock(&self.known).contains(server) {
                    return Err(Error::unknown_server(format!(
                        "storage server {server} is not registered"
                    )));
                }
                sync::lock(&self.heartbeats).push(*server);
                MetaReply::Done
            }
            other => {
                return Err(Error::invalid_argument(format!(
                    "fake meta does not do {other:?}"
                )))
            }
        };
        reply.encode(out);
        Ok(())
    }
}

async fn fake_meta_at(addr: &str, meta: FakeMeta) -> (Arc<FakeMeta>, ServerHandle, String) {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let meta = Arc::new(meta);
    let handle = nodekernel_rpc::serve(listener, meta.clone()).unwrap();
    let addr = handle.local_addr().to_string();
    (meta, handle, addr)
}

async fn fake_meta(meta: FakeMeta) -> (Arc<FakeMeta>, ServerHandle, String) {
    fake_meta_at("127.0.0.1:0", meta).await
}

#[tokio::test]
async fn registers_and_heartbeats() {
    let (meta, _h, meta_addr) = fake_meta(FakeMeta::new(7)).await;
    let mut c = cfg(MediumKind::Dram, 10);
    c.metas = vec![meta_addr];
    c.class = 2;
    c.class_name = "fast".into();
    let srv = start(c).await.unwrap();
    assert_eq!(
        srv.server_ids(),
        vec![Some(7)],
        "registered before start returns"
    );
    assert_eq!(
        meta.registrations(),
        vec![MetaRequest::Register(nodekernel_proto::ServerSpec {
            identity: srv.identity().to_string(),
            incarnation: srv.incarnation(),
            cap_key: *srv.cap_key(),
            addr: srv.local_addr().to_string(),
            class: 2,
            class_name: "fast".into(),
            medium: "dram".into(),
            location: "test-host".into(),
            block_size: BS,
            first_block: 0,
            num_blocks: 10,
        })]
    );
    eventually("three heartbeats", || meta.heartbeats().len() >= 3).await;
    assert!(meta.heartbeats().iter().all(|&id| id == 7));
    assert_eq!(
        meta.registrations().len(),
        1,
        "no re-registration while heartbeats succeed"
    );

    // Heartbeats stop with the server.
    srv.shutdown();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let n = meta.heartbeats().len();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(meta.heartbeats().len(), n, "no heartbeats after shutdown");
}

#[tokio::test]
async fn reregisters_when_the_meta_forgets_it() {
    let (meta, _h, meta_addr) = fake_meta(FakeMeta {
        forget_first_heartbeat: true,
        ..FakeMeta::new(7)
    })
    .await;
    let mut c = cfg(MediumKind::Dram, 4);
    c.metas = vec![meta_addr];
    let srv = start(c).await.unwrap();
    assert_eq!(srv.server_ids(), vec![Some(7)]);
    eventually("re-registration", || meta.registrations().len() == 2).await;
    eventually("the new id", || srv.server_ids() == vec![Some(8)]).await;
    eventually("heartbeats with the new id", || {
        meta.heartbeats().contains(&8)
    })
    .await;
    assert!(
        !meta.heartbeats().contains(&7),
        "the forgotten id got no accepted heartbeat"
    );
    let regs = meta.registrations();
    assert_eq!(regs[0], regs[1], "the same blocks are registered again");
}

#[tokio::test]
async fn survives_a_meta_restart() {
    let (meta1, h1, meta_addr) = fake_meta(FakeMeta::new(7)).await;
    let mut c = cfg(MediumKind::Dram, 4);
    c.metas = vec![meta_addr.clone()];
    c.rpc_timeout = Duration::from_millis(500);
    let srv = start(c).await.unwrap();
    eventually("a heartbeat", || !meta1.heartbeats().is_empty()).await;

    // The metadata server dies: heartbeats fail, the storage server stays up.
    drop(h1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let data = Connection::connect(&srv.local_addr().to_string(), HANG)
        .await
        .unwrap();
    assert!(call(&data, StoreRequest::Ping).await.is_ok());
    assert_eq!(
        srv.server_ids(),
        vec![Some(7)],
        "failed heartbeats do not drop the id"
    );

    // It comes back with no memory of us: we register again.
    let (meta2, _h2, _) = fake_meta_at(&meta_addr, FakeMeta::new(100)).await;
    eventually("registration with the restarted meta", || {
        srv.server_ids() == vec![Some(100)]
    })
    .await;
    eventually("heartbeats to the restarted meta", || {
        meta2.heartbeats().contains(&100)
    })
    .await;
    assert_eq!(meta2.registrations().len(), 1);
}

#[tokio::test]
async fn blocks_are_partitioned_across_metas() {
    let mut metas = Vec::new();
    let mut handles = Vec::new();
    let mut addrs = Vec::new();
    for i in 0..3 {
        let (m, h, a) = fake_meta(FakeMeta::new(10 * (i + 1))).await;
        metas.push(m);
        handles.push(h);
        addrs.push(a);
    }
    let mut c = cfg(MediumKind::Dram, 10);
    c.metas = addrs;
    let srv = start(c).await.unwrap();
    assert_eq!(srv.server_ids(), vec![Some(10), Some(20), Some(30)]);
    let ranges: Vec<(u32, u32)> = metas
        .iter()
        .map(|m| match &m.registrations()[..] {
            [MetaRequest::Register(spec)] => (spec.first_block, spec.num_blocks),
            other => panic!("expected one registration, got {other:?}"),
        })
        .collect();
    assert_eq!(ranges, vec![(0, 3), (3, 3), (6, 4)]);
    for (i, m) in metas.iter().enumerate() {
        let id = 10 * (i as u32 + 1);
        eventually("heartbeats to every meta", || m.heartbeats().contains(&id)).await;
    }
}

#[tokio::test]
async fn unreachable_meta_fails_start_naming_it() {
    // A port that was free a moment ago: connections are refused.
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let mut c = cfg(MediumKind::Dram, 1);
    c.metas = vec![addr.clone()];
    c.rpc_timeout = Duration::from_millis(300);
    let started = std::time::Instant::now();
    let e = tokio::time::timeout(HANG, start(c))
        .await
        .expect("gives up instead of hanging")
        .unwrap_err();
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "retries for about the rpc timeout"
    );
    assert!(
        matches!(&e, StoreError::Register { meta, .. } if *meta == addr),
        "{e}"
    );
    assert!(e.to_string().contains(&addr), "{e}");
    assert_eq!(Error::from(e).code, ErrorCode::Unavailable);
}

#[tokio::test]
async fn refused_registration_fails_at_once() {
    let (meta, _h, meta_addr) = fake_meta(FakeMeta {
        refuse: Some(Error::invalid_argument(
            "block size 65536 does not match the cluster's 1048576",
        )),
        ..FakeMeta::new(1)
    })
    .await;
    let mut c = cfg(MediumKind::Dram, 1);
    c.metas = vec![meta_addr.clone()];
    let e = start(c).await.unwrap_err();
    assert!(
        e.to_string().contains(&meta_addr) && e.to_string().contains("block size"),
        "{e}"
    );
    assert_eq!(meta.registrations().len(), 1, "a refusal is not retried");
    assert_eq!(Error::from(e).code, ErrorCode::InvalidArgument);
}

// ---------------------------------------------------------------------------
// Shared memory: SHM_INFO and the hand-over socket.

async fn shm_name(c: &Connection) -> String {
    let reply = call(c, StoreRequest::ShmInfo).await.unwrap();
    nodekernel_proto::store::decode_shm_info(&reply).unwrap()
}

/// Connects to a server's abstract socket and maps its region, as a
/// co-located client does.
pub(crate) fn map_region(
    name: &str,
) -> std::io::Result<(nodekernel_shm::ClientRegion, std::os::unix::net::UnixStream)> {
    map_region_proving(name, None)
}

/// [`map_region`], answering the challenge with a proof of `token`.
fn map_region_proving(
    name: &str,
    token: Option<&nodekernel_rpc::Token>,
) -> std::io::Result<(nodekernel_shm::ClientRegion, std::os::unix::net::UnixStream)> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    let sock = std::os::unix::net::UnixStream::connect_addr(&addr)?;
    sock.set_read_timeout(Some(HANG))?;
    nodekernel_shm::answer_challenge(&sock, |n| token.map(|t| t.handover_proof(n)))?;
    let region = nodekernel_shm::receive_region(&sock)?;
    Ok((region, sock))
}

/// With a cluster token, the memory goes only to a client proving it: not
/// to one without it, one with another token, or one replaying a proof
/// recorded on another connection; and never to a process of another user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_goes_only_to_the_owner_proving_the_token() {
    use nodekernel_rpc::{Security, Token};
    use std::io::{Read, Write};
    let token = Arc::new(Token::new(&[4; 32], "test").unwrap());
    let security = Security {
        token: Some(token.clone()),
        ..Security::default()
    };
    let srv = start(StoreConfig {
        security: security.clone(),
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    let c = Connection::connect_with_handshake(
        &srv.local_addr().to_string(),
        nodekernel_rpc::ConnOptions::new(HANG),
        &*security.handshake(nodekernel_rpc::Role::Client),
    )
    .await
    .unwrap();
    let name = shm_name(&c).await;
    let n = name.clone();
    let t = token.clone();
    let region = tokio::task::spawn_blocking(move || map_region_proving(&n, Some(&t)))
        .await
        .unwrap();
    assert!(region.is_ok(), "{:?}", region.err());

    let n = name.clone();
    let e = tokio::task::spawn_blocking(move || map_region_proving(&n, None))
        .await
        .unwrap()
        .err()
        .unwrap();
    assert!(e.to_string().contains("cluster token"), "{e}");

    let n = name.clone();
    let other = Token::new(&[5; 32], "other").unwrap();
    let Err(e) = tokio::task::spawn_blocking(move || map_region_proving(&n, Some(&other)))
        .await
        .unwrap()
    else {
        panic!("another token got the memory");
    };
    assert!(
        matches!(
            e.kind(),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
        ),
        "{e}"
    );

    // A replay: the proof a genuine client sent on one connection, sent
    // again on another.
    let n = name.clone();
    let t = token.clone();
    let replayed = tokio::task::spawn_blocking(move || {
        use nodekernel_shm::handover::CHALLENGE_LEN;
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(n.as_bytes()).unwrap();
        let challenge = |s: &mut std::os::unix::net::UnixStream| {
            s.set_read_timeout(Some(HANG)).unwrap();
            let mut c = [0u8; CHALLENGE_LEN];
            s.read_exact(&mut c).unwrap();
            nodekernel_shm::Challenge::decode(&c).unwrap()
        };
        let mut first = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
        let recorded = t.handover_proof(&challenge(&mut first).nonce);
        first.write_all(&recorded).unwrap();
        nodekernel_shm::receive_region(&first).expect("the genuine client is served");
        let mut second = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
        challenge(&mut second);
        second.write_all(&recorded).unwrap();
        let mut rest = Vec::new();
        let _ = second.read_to_end(&mut rest);
        rest
    })
    .await
    .unwrap();
    assert!(replayed.is_empty(), "a replayed proof gets nothing");

    // Another user, even with the token, gets nothing: its proof is not
    // even asked for.
    let n = name.clone();
    let t = token.clone();
    if let Some(r) =
        nodekernel_rpc::testing::as_nobody(move || map_region_proving(&n, Some(&t)).err()).await
    {
        let e = r.expect("another user gets no memory");
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof, "{e}");
    }
    drop(region);
}

/// A DRAM server answers a read with the bytes of its region itself (no
/// copy into the reply), and says after sending them whether the block
/// was still the reader's generation throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dram_reads_are_sent_from_the_region_and_checked_after() {
    use crate::handler::StoreHandler;
    use nodekernel_rpc::Reply;
    let srv = start(cfg(MediumKind::Dram, 4)).await.unwrap();
    let c = Connection::connect(&srv.local_addr().to_string(), HANG)
        .await
        .unwrap();
    write(&c, 1, 7, 100, b"straight from the region")
        .await
        .unwrap();
    let region = srv.store().shared_region().expect("a DRAM region").clone();

    let mut reply = Reply::new();
    StoreHandler::read_from_region(&region, 1, 7, 100, 24, &mut reply).unwrap();
    assert!(reply.out().is_empty(), "no byte was copied into the reply");
    let body = reply
        .take_body()
        .expect("the bytes are sent from the region");
    let (ptr, len) = body.bytes();
    let expected = region.data_ptr() as usize + BS as usize + 100;
    assert_eq!((ptr as usize, len), (expected, 24), "block 1 at offset 100");
    let mut status = BytesMut::new();
    body.seal(&mut status);
    assert_eq!(&status[..], &[READ_OK]);

    // A new owner claims the block while the bytes are (say) still going
    // out: the status sent after them says so.
    write(&c, 1, 8, 0, b"new owner").await.unwrap();
    let mut status = BytesMut::new();
    body.seal(&mut status);
    assert_eq!(&status[..], &[READ_CHANGED_HANDS]);
    // A read that starts after the claim is refused at once.
    let e = StoreHandler::read_from_region(&region, 1, 7, 100, 24, &mut Reply::new())
        .expect_err("refused");
    assert_eq!(e.code, ErrorCode::Stale, "{e}");

    // Over the network, the client sees the bytes and the status checked.
    assert_eq!(read(&c, 1, 8, 0, 9).await.unwrap(), b"new owner" as &[u8]);
    assert_eq!(
        read(&c, 1, 7, 0, 9).await.unwrap_err().code,
        ErrorCode::Stale
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dram_memory_is_handed_to_colocated_clients() {
    let srv = start(cfg(MediumKind::Dram, 4)).await.unwrap();
    let c = Connection::connect(&srv.local_addr().to_string(), HANG)
        .await
        .unwrap();
    let name = shm_name(&c).await;
    assert!(name.starts_with(nodekernel_shm::NAME_PREFIX), "{name}");
    assert_eq!(srv.shared_memory_name(), Some(name.as_str()));

    let (region, sock) = {
        let name = name.clone();
        tokio::task::spawn_blocking(move || map_region(&name))
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!((region.block_size(), region.num_blocks()), (BS, 4));
    // Network and mapped accesses see each other, generations included.
    write(&c, 2, 40, 0, b"over the network").await.unwrap();
    let mut buf = [0u8; 16];
    region.read(2, 40, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"over the network");
    region.write(2, 41, 0, b"mapped").await.unwrap();
    assert_eq!(srv.store().generation(2), Some(41));
    assert_eq!(read(&c, 2, 41, 0, 6).await.unwrap(), b"mapped" as &[u8]);
    assert_eq!(
        write(&c, 2, 40, 0, b"old").await.unwrap_err().code,
        ErrorCode::Stale
    );
    write(&c, 2, 42, 0, &[]).await.unwrap();
    assert_eq!(
        region.read(2, 41, 0, &mut buf).unwrap_err().code,
        ErrorCode::Stale,
        "a claim over the network reaches the mapping"
    );

    // Stopping the server marks the region closed and closes the socket.
    assert!(!region.is_closed());
    srv.shutdown();
    assert!(region.is_closed());
    let eof = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut b = [0u8; 1];
        (&sock).read(&mut b)
    })
    .await
    .unwrap();
    assert!(matches!(eof, Ok(0) | Err(_)), "{eof:?}");
    let gone = tokio::task::spawn_blocking(move || map_region(&name).map(drop))
        .await
        .unwrap();
    assert!(gone.is_err(), "the name is released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_shared_dram_answers_with_a_socket_name() {
    let mut c = cfg(MediumKind::Dram, 1);
    c.shared_memory = false;
    let srv = start(c).await.unwrap();
    let conn = Connection::connect(&srv.local_addr().to_string(), HANG)
        .await
        .unwrap();
    assert_eq!(shm_name(&conn).await, "", "sharing disabled");
    assert_eq!(srv.shared_memory_name(), None);

    let dir = tempfile::tempdir().unwrap();
    let srv = start(cfg(
        MediumKind::File {
            path: dir.path().join("b"),
        },
        1,
    ))
    .await
    .unwrap();
    let conn = Connection::connect(&srv.local_addr().to_string(), HANG)
        .await
        .unwrap();
    assert_eq!(shm_name(&conn).await, "", "file medium");
    let e = conn.call(op::SHM_INFO, &[b"x"]).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Protocol, "{e}");
}

/// Each server has its own socket; many clients can map one server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_map_one_server() {
    let a = start(cfg(MediumKind::Dram, 2)).await.unwrap();
    let b = start(cfg(MediumKind::Dram, 2)).await.unwrap();
    assert_ne!(a.shared_memory_name(), b.shared_memory_name());
    let name = a.shared_memory_name().unwrap().to_string();
    let maps = tokio::task::spawn_blocking(move || {
        (0..8)
            .map(|_| map_region(&name).unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    for (i, (r, _)) in maps.iter().enumerate() {
        r.write(1, 10 + i as u64, 0, &[i as u8; 8]).await.unwrap();
    }
    assert_eq!(a.store().generation(1), Some(17));
    assert_eq!(b.store().generation(1), Some(0), "another server's memory");
}

/// `Claim` stamps each block, leaving alone a block already claimed by a
/// newer owner; `Copy` pulls a whole block from another storage server,
/// only at the source generation it names.
async fn claims_and_copies(medium: MediumKind) {
    let a = start(cfg(MediumKind::Dram, 4)).await.unwrap();
    let b = start(cfg(medium, 4)).await.unwrap();
    let ca = Connection::connect(&a.local_addr().to_string(), HANG)
        .await
        .unwrap();
    let cb = Connection::connect(&b.local_addr().to_string(), HANG)
        .await
        .unwrap();
    let data: Vec<u8> = (0..BS).map(|i| (i % 251) as u8).collect();
    write(&ca, 1, 5, 0, &data).await.unwrap();
    call(
        &ca,
        StoreRequest::Claim {
            claims: vec![claim(&ca, 1, 3), claim(&ca, 2, 7)],
        },
    )
    .await
    .expect("an older claim is not an error");
    assert_eq!(a.store().generation(1), Some(5), "the newer owner stays");
    assert_eq!(a.store().generation(2), Some(7));
    let bad = call(
        &ca,
        StoreRequest::Claim {
            claims: vec![claim(&ca, 2, 8), claim(&ca, 99, 9)],
        },
    )
    .await
    .unwrap_err();
    assert_eq!(bad.code, ErrorCode::OutOfRange, "{bad}");
    assert_eq!(
        a.store().generation(2),
        Some(8),
        "the good claims still apply"
    );

    let copy = |src_gen| StoreRequest::Copy {
        block: 0,
        gen: 9,
        cap: cap(&cb, 0, 9),
        src_addr: a.local_addr().to_string(),
        src_block: 1,
        src_gen,
        src_cap: cap(&ca, 1, src_gen),
    };
    let stale = call(&cb, copy(4)).await.unwrap_err();
    assert_eq!(stale.code, ErrorCode::Stale, "{stale}");
    call(&cb, copy(5)).await.unwrap();
    assert_eq!(read(&cb, 0, 9, 0, BS).await.unwrap(), data);
    assert_eq!(b.store().generation(0), Some(9));
}

/// A small value's read checks its tag first: the node id its piece
/// starts with, which a claim clears when the value is freed; a clear at
/// an older generation (the piece reused since) changes nothing.
async fn tags(medium: MediumKind) {
    let s = start(cfg(medium, 2)).await.unwrap();
    let c = Connection::connect(&s.local_addr().to_string(), HANG)
        .await
        .unwrap();
    // Two values of 100 bytes in 112-byte pieces at 0 and 112.
    let piece = |tag: u64, v: u8| [&tag.to_le_bytes()[..], &[v; 100]].concat();
    write(&c, 1, 4, 0, &piece(41, 1)).await.unwrap();
    write(&c, 1, 4, 112, &piece(42, 2)).await.unwrap();
    let tag = |at, expect| Some(TagCheck { at, expect });
    let a = read_tagged(&c, 1, 4, 8, 100, tag(0, 41)).await.unwrap();
    assert_eq!(&a[..], &[1; 100]);
    // Not from the start: the tag is read on its own.
    let b = read_tagged(&c, 1, 4, 130, 10, tag(112, 42)).await.unwrap();
    assert_eq!(&b[..], &[2; 10]);
    let wrong = read_tagged(&c, 1, 4, 8, 100, tag(0, 42)).await.unwrap_err();
    assert_eq!(wrong.code, ErrorCode::Stale, "{wrong}");
    assert!(wrong.message.contains("replaced or deleted"), "{wrong}");

    // a is freed: its tag is cleared, b's stays.
    let clear_a_at = |gen| {
        let claims = vec![Claim {
            clear_tag_at: Some(0),
            ..claim(&c, 1, gen)
        }];
        call(&c, StoreRequest::Claim { claims })
    };
    clear_a_at(4).await.unwrap();
    for (offset, len) in [(8, 100), (50, 7)] {
        let e = read_tagged(&c, 1, 4, offset, len, tag(0, 41))
            .await
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Stale, "{e}");
    }
    let b = read_tagged(&c, 1, 4, 120, 100, tag(112, 42)).await.unwrap();
    assert_eq!(&b[..], &[2; 100]);
    // Untagged reads (whole blocks) are not checked.
    assert_eq!(&read(&c, 1, 4, 8, 4).await.unwrap()[..], &[1; 4]);

    // The slab moves on to generation 5 and a's piece is reused: a late
    // clear of a's tag at 4 leaves the new value alone.
    write(&c, 1, 5, 0, &piece(43, 3)).await.unwrap();
    clear_a_at(4).await.unwrap();
    let n = read_tagged(&c, 1, 5, 8, 100, tag(0, 43)).await.unwrap();
    assert_eq!(&n[..], &[3; 100]);
}

/// A scrub claim (a block handed to an encrypted node,
/// `docs/encryption.md`) leaves only zeros in the block, under its
/// generation; a late one, after the new owner wrote under a newer
/// generation, is refused and leaves the owner's bytes alone.
async fn scrubs(medium: MediumKind) {
    let s = start(cfg(medium, 2)).await.unwrap();
    let c = Connection::connect(&s.local_addr().to_string(), HANG)
        .await
        .unwrap();
    let old = vec![7u8; BS as usize];
    write(&c, 1, 4, 0, &old).await.unwrap();
    let scrub = |gen| {
        let claims = vec![Claim {
            scrub: true,
            ..claim(&c, 1, gen)
        }];
        call(&c, StoreRequest::Claim { claims })
    };
    scrub(5).await.unwrap();
    assert_eq!(read(&c, 1, 5, 0, BS).await.unwrap(), vec![0u8; BS as usize]);
    write(&c, 1, 6, 100, b"new owner").await.unwrap();
    scrub(5).await.unwrap();
    assert_eq!(&read(&c, 1, 6, 100, 9).await.unwrap()[..], b"new owner");
    // A capability for less than the whole block does not scrub it.
    let key = *cap_keys().get(c.peer()).unwrap();
    let claims = vec![Claim {
        scrub: true,
        cap: Cap::mint(&key, 1, 7, 0, 8, Rights::MANAGE, 0),
        ..claim(&c, 1, 7)
    }];
    assert!(call(&c, StoreRequest::Claim { claims }).await.is_err());
    assert_eq!(&read(&c, 1, 6, 100, 9).await.unwrap()[..], b"new owner");
}

/// Runs `$f(medium)` as two tests: on DRAM and on a block file.
macro_rules! on_both_media {
    ($dram:ident, $file:ident => $f:ident) => {
        #[tokio::test]
        async fn $dram() {
            $f(MediumKind::Dram).await;
        }

        #[tokio::test]
        async fn $file() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(concat!(stringify!($f), ".blocks"));
            $f(MediumKind::File { path }).await;
        }
    };
}

on_both_media!(small_value_tags_dram, small_value_tags_file => tags);
on_both_media!(claims_and_copies_dram, claims_and_copies_file => claims_and_copies);
on_both_media!(scrub_claims_dram, scrub_claims_file => scrubs);

/// Each hand-over connection holds a writer slot of its own; the server
/// takes it back when the client's end closes (its process gone), never
/// because of time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_hand_over_connection_gives_its_slot_back() {
    let srv = start(cfg(MediumKind::Dram, 2)).await.unwrap();
    let region = srv.store().shared_region().unwrap().clone();
    let free = region.free_slots();
    let name = srv.shared_memory_name().unwrap().to_string();
    let (mapped, sock) = tokio::task::spawn_blocking(move || map_region(&name).unwrap())
        .await
        .unwrap();
    assert_eq!(region.free_slots(), free - 1);
    mapped.write(0, 5, 0, b"mapped").await.unwrap();
    drop(mapped);
    drop(sock);
    // A generous bound that only catches hangs.
    let start = std::time::Instant::now();
    while region.free_slots() != free {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "slot never reclaimed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(region.writers_in_flight(0), Some(0));
}

// ---------------------------------------------------------------------------
// Data directories and block files: exclusive use, modes, identity, clean-up.

use crate::datadir::{IDENTITY_FILE, IDENTITY_LEN, LOCK_FILE};
use crate::DataDirConfig;
use std::path::{Path, PathBuf};

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// A file server of `blocks` blocks in data directory `dir`, block file
/// `blocks` there.
fn in_dir(dir: &Path, blocks: u64) -> StoreConfig {
    StoreConfig {
        data_dir: DataDirConfig::At(dir.to_path_buf()),
        ..cfg(
            MediumKind::File {
                path: PathBuf::from("blocks"),
            },
            blocks,
        )
    }
}

/// The message and every cause, as `anyhow` prints them with `{:#}`.
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

fn is_identity(s: &str) -> bool {
    s.len() == IDENTITY_LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_data_dir_is_refused_naming_it_and_left_alone() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("d");
    let first = start(in_dir(&dir, 2)).await.unwrap();
    assert_eq!(first.data_dir(), Some(dir.as_path()));
    assert_eq!(first.block_file(), Some(dir.join("blocks").as_path()));
    let c = Connection::connect(&first.local_addr().to_string(), HANG)
        .await
        .unwrap();
    write(&c, 1, 1, 0, b"first's bytes").await.unwrap();

    for medium in [
        MediumKind::Dram,
        MediumKind::File {
            path: PathBuf::from("other-blocks"),
        },
    ] {
        let e = start(StoreConfig {
            data_dir: DataDirConfig::At(dir.clone()),
            ..cfg(medium, 2)
        })
        .await
        .unwrap_err();
        let text = e.to_string();
        let pid = std::process::id();
        assert!(
            matches!(&e, StoreError::Locked { path, holder: Some(h), .. }
                if *path == dir && *h == pid),
            "{text}"
        );
        assert!(
            text.contains(&format!("data directory {}", dir.display()))
                && text.contains(&format!("pid {pid}"))
                && text.contains("--data-dir"),
            "{text}"
        );
        assert_eq!(Error::from(e).code, ErrorCode::Busy);
    }
    assert!(
        !dir.join("other-blocks").exists(),
        "the refused start made nothing"
    );
    assert_eq!(
        std::fs::metadata(dir.join("blocks")).unwrap().len(),
        2 * u64::from(BS),
        "and truncated nothing"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap(),
        format!("{}\n", std::process::id())
    );
    assert_eq!(
        read(&c, 1, 1, 0, 13).await.unwrap(),
        b"first's bytes" as &[u8],
        "the first server keeps serving its bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_file_in_use_is_refused_and_not_truncated() {
    let t = tempfile::tempdir().unwrap();
    let path = t.path().join("shared.blocks");
    let file = |blocks| cfg(MediumKind::File { path: path.clone() }, blocks);
    let first = start(file(2)).await.unwrap();
    assert_eq!(first.data_dir(), None);
    let c = Connection::connect(&first.local_addr().to_string(), HANG)
        .await
        .unwrap();
    let data: Vec<u8> = (0..BS).map(|i| (i % 253) as u8).collect();
    write(&c, 1, 1, 0, &data).await.unwrap();

    // Another server (same or other size) must not truncate or resize it.
    for blocks in [2, 1] {
        let e = start(file(blocks)).await.unwrap_err();
        let text = e.to_string();
        assert!(
            matches!(&e, StoreError::Locked { path: p, .. } if *p == path),
            "{text}"
        );
        assert!(
            text.contains(&format!("block file {}", path.display()))
                && text.contains(&format!("pid {}", std::process::id())),
            "{text}"
        );
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * u64::from(BS));
    assert_eq!(read(&c, 1, 1, 0, BS).await.unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_files_are_0600_and_directories_0700() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("a/b");
    let srv = start(in_dir(&dir, 1)).await.unwrap();
    for d in [t.path().join("a"), dir.clone()] {
        assert_eq!(mode(&d), 0o700, "{}", d.display());
    }
    for f in [LOCK_FILE, IDENTITY_FILE, "blocks"] {
        assert_eq!(mode(&dir.join(f)), 0o600, "{f}");
    }
    drop(srv);

    // A block file named by its path, in new directories.
    let path = t.path().join("x/y/blocks");
    let _srv = start(cfg(MediumKind::File { path: path.clone() }, 1))
        .await
        .unwrap();
    assert_eq!(mode(&t.path().join("x")), 0o700);
    assert_eq!(mode(&t.path().join("x/y")), 0o700);
    assert_eq!(mode(&path), 0o600);

    // An existing block file is made private before it holds blocks.
    let old = t.path().join("old.blocks");
    std::fs::write(&old, b"x").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
    let srv = start(cfg(MediumKind::File { path: old.clone() }, 1))
        .await
        .unwrap();
    assert_eq!(mode(&old), 0o600);
    srv.shutdown();
    assert!(old.exists(), "a block file that existed before is kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_data_dirs_are_unique_and_removed_at_shutdown() {
    let private = || StoreConfig {
        data_dir: DataDirConfig::Private,
        ..cfg(
            MediumKind::File {
                path: PathBuf::from("blocks"),
            },
            1,
        )
    };
    let a = start(private()).await.unwrap();
    let b = start(private()).await.unwrap();
    let (da, db) = (
        a.data_dir().unwrap().to_path_buf(),
        b.data_dir().unwrap().to_path_buf(),
    );
    assert_ne!(da, db);
    assert_ne!(a.identity(), b.identity());
    // SAFETY: geteuid has no preconditions.
    let base = std::env::temp_dir().join(format!("nodekernel-{}", unsafe { libc::geteuid() }));
    for d in [&da, &db] {
        assert_eq!(d.parent(), Some(base.as_path()), "{}", d.display());
        assert_eq!(mode(d), 0o700);
        assert!(d.join("blocks").exists());
    }
    assert_eq!(mode(&base) & 0o077, 0, "the base is private too");
    a.shutdown();
    assert!(!da.exists(), "removed at shutdown");
    assert!(db.join("blocks").exists(), "the other one is untouched");
    drop(b);
    assert!(!db.exists(), "removed when dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_is_kept_in_the_data_dir_and_the_lock_freed_at_shutdown() {
    let t = tempfile::tempdir().unwrap();
    let (d1, d2) = (t.path().join("one"), t.path().join("two"));
    let first = start(in_dir(&d1, 1)).await.unwrap();
    let id = first.identity().to_string();
    assert!(is_identity(&id), "{id}");
    assert_eq!(
        std::fs::read_to_string(d1.join(IDENTITY_FILE)).unwrap(),
        format!("{id}\n")
    );
    let incarnation = first.incarnation();

    // After shutdown (the handle still alive) the directory is free.
    first.shutdown();
    assert!(
        !d1.join("blocks").exists(),
        "the block file goes at shutdown"
    );
    assert!(d1.join(LOCK_FILE).exists() && d1.join(IDENTITY_FILE).exists());
    let second = start(in_dir(&d1, 1)).await.unwrap();
    assert_eq!(second.identity(), id, "same directory, same identity");
    assert_ne!(second.incarnation(), incarnation, "a new incarnation");
    drop(second);
    drop(first);
    let third = start(in_dir(&d1, 2)).await.unwrap();
    assert_eq!(third.identity(), id);

    let other = start(in_dir(&d2, 1)).await.unwrap();
    assert!(is_identity(other.identity()));
    assert_ne!(other.identity(), id, "another directory, another identity");

    // Without a data directory: a fresh identity every start.
    let a = start(cfg(MediumKind::Dram, 1)).await.unwrap();
    let b = start(cfg(MediumKind::Dram, 1)).await.unwrap();
    assert!(is_identity(a.identity()) && is_identity(b.identity()));
    assert_ne!(a.identity(), b.identity());
    assert_eq!(a.data_dir(), None);

    // A damaged identity refuses to start, naming the file, and is kept.
    drop(other);
    std::fs::write(d2.join(IDENTITY_FILE), b"not an identity\n").unwrap();
    let e = start(in_dir(&d2, 1)).await.unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, StoreError::Identity { .. })
            && text.contains(&d2.join(IDENTITY_FILE).display().to_string()),
        "{text}"
    );
    assert_eq!(
        std::fs::read(d2.join(IDENTITY_FILE)).unwrap(),
        b"not an identity\n"
    );
    assert!(!d2.join("blocks").exists());
}

/// A port in use, so that a start fails after its medium was created.
fn busy_port() -> (std::net::TcpListener, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    (l, addr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_leaves_nothing_behind() {
    let t = tempfile::tempdir().unwrap();
    let (_l, busy) = busy_port();

    // A new data directory, in new parents.
    let dir = t.path().join("new/data");
    let mut c = in_dir(&dir, 1);
    c.listen = busy.clone();
    let e = start(c).await.unwrap_err();
    assert!(matches!(e, StoreError::Listen { .. }), "{e}");
    assert!(
        !t.path().join("new").exists(),
        "nothing of new/data is left"
    );

    // A block file named by its path.
    let path = t.path().join("x/blocks");
    let mut c = cfg(MediumKind::File { path: path.clone() }, 1);
    c.listen = busy.clone();
    start(c).await.unwrap_err();
    assert!(!t.path().join("x").exists(), "no block file is left");

    // A registration that fails: the same.
    let unreachable = busy_port().1;
    let mut c = in_dir(&dir, 1);
    c.metas = vec![unreachable];
    c.rpc_timeout = Duration::from_millis(50);
    let e = start(c).await.unwrap_err();
    assert!(matches!(e, StoreError::Register { .. }), "{e}");
    assert!(!t.path().join("new").exists());

    // An existing data directory keeps what it had, and only that.
    let srv = start(in_dir(&dir, 1)).await.unwrap();
    let id = srv.identity().to_string();
    drop(srv);
    std::fs::write(dir.join("blocks"), b"left by a crash").unwrap();
    let mut c = in_dir(&dir, 1);
    c.listen = busy;
    start(c).await.unwrap_err();
    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, [LOCK_FILE, "blocks", IDENTITY_FILE]);
    assert_eq!(
        std::fs::read_to_string(dir.join(IDENTITY_FILE)).unwrap(),
        format!("{id}\n")
    );
    // The next start reuses the directory.
    let srv = start(in_dir(&dir, 1)).await.unwrap();
    assert_eq!(srv.identity(), id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_removes_what_the_start_created() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("new");
    let srv = start(in_dir(&dir, 1)).await.unwrap();
    let addr = srv.local_addr().to_string();
    srv.discard();
    assert!(!dir.exists());
    assert!(Connection::connect(&addr, HANG).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn os_errors_appear_once_in_the_message() {
    let t = tempfile::tempdir().unwrap();
    let not_dir = t.path().join("plain-file");
    std::fs::write(&not_dir, b"").unwrap();
    let (_l, busy) = busy_port();
    let mut listen = cfg(MediumKind::Dram, 1);
    listen.listen = busy;
    for (c, errno) in [
        (in_dir(&not_dir.join("d"), 1), libc::ENOTDIR),
        (
            cfg(
                MediumKind::File {
                    path: not_dir.join("blocks"),
                },
                1,
            ),
            libc::ENOTDIR,
        ),
        (listen, libc::EADDRINUSE),
    ] {
        let e = start(c).await.unwrap_err();
        let text = chain_text(&e);
        let os = std::io::Error::from_raw_os_error(errno).to_string();
        assert_eq!(text.matches(&os).count(), 1, "{text}");
        assert_eq!(text.matches("os error").count(), 1, "{text}");
    }
}

/// Creating the medium (prefaulting DRAM, preallocating a file) runs off
/// the async workers: other tasks of a one-thread runtime run meanwhile.
#[tokio::test(flavor = "current_thread")]
async fn start_does_not_hold_the_async_thread() {
    let dir = tempfile::tempdir().unwrap();
    for medium in [
        MediumKind::Dram,
        MediumKind::File {
            path: dir.path().join("blocks"),
        },
    ] {
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        tokio::spawn(async move { r.store(true, Ordering::SeqCst) });
        let _srv = start(cfg(medium, 64)).await.unwrap();
        assert!(
            ran.load(Ordering::SeqCst),
            "another task ran during the start"
        );
    }
}

/// Large writes to a DRAM store go from the socket straight into the
/// region, with every generation rule of the copied path: the bytes land,
/// an older generation is refused and writes nothing, a newer one claims
/// the block; small writes and other media take the copied path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_dram_writes_are_received_in_place_with_their_generation_rules() {
    let bs = 4u32 << 20;
    let srv = start(StoreConfig {
        capacity: 4 * u64::from(bs),
        block_size: bs,
        ..cfg(MediumKind::Dram, 4)
    })
    .await
    .unwrap();
    let c = Connection::connect(&srv.local_addr().to_string(), HANG)
        .await
        .unwrap();
    let big: Vec<u8> = (0..3u32 << 20).map(|i| (i % 253) as u8).collect();
    write(&c, 1, 5, 4096, &big).await.unwrap();
    assert_eq!(srv.writes_in_place(), 1);
    assert!(read(&c, 1, 5, 4096, big.len() as u32).await.unwrap() == big);
    write(&c, 1, 5, 0, b"small").await.unwrap();
    assert_eq!(srv.writes_in_place(), 1, "a small write is copied");

    // A newer generation claims the block in place; the old one is then
    // refused, and its data is not written.
    let newer: Vec<u8> = big.iter().map(|b| b ^ 0xFF).collect();
    write(&c, 1, 6, 4096, &newer).await.unwrap();
    assert_eq!(srv.writes_in_place(), 2);
    let e = write(&c, 1, 5, 4096, &big).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Stale, "{e}");
    assert!(read(&c, 1, 6, 4096, newer.len() as u32).await.unwrap() == newer);
    assert_eq!(
        read(&c, 1, 5, 0, 1).await.unwrap_err().code,
        ErrorCode::Stale
    );
    // Out of the block: refused, whichever path it took.
    let e = write(&c, 1, 6, bs - 1000, &big).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::OutOfRange, "{e}");
    // The connection is still in step after the refusals.
    assert!(call(&c, StoreRequest::Ping).await.unwrap().is_empty());
}
