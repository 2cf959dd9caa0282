//! The cluster token end to end (`docs/security.md`): with a token
//! configured, a peer with no token, a wrong token or a replayed handshake
//! is refused on every port (the metadata server's TCP port and Unix
//! socket, a storage server's data port, its shared-memory hand-over) and
//! changes nothing; a storage server without the token cannot register;
//! the right token works end to end.

use crate::common;

use bytes::BytesMut;
use common::{config, pattern, start_with};
use nodekernel_client::{Client, ErrorCode, NodeType};
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::store::{decode_shm_info, op as store_op};
use nodekernel_rpc::testing::recording_proxy;
use nodekernel_rpc::{ConnOptions, Connection, Role, Security, Token, VersionHandshake};
use nodekernel_store::{StorageServer, StoreConfig};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HANG: Duration = Duration::from_secs(120);
const SECRET: &str = "a cluster token for these tests, 48 bytes long.";

fn token(secret: &str) -> Arc<Token> {
    Arc::new(Token::new(secret.as_bytes(), "test").unwrap())
}

fn as_client(t: Option<Arc<Token>>) -> VersionHandshake {
    VersionHandshake::new(Role::Client).with_token(t)
}

async fn connect(addr: &str, t: Option<Arc<Token>>) -> nodekernel_proto::Result<Connection> {
    Connection::connect_with_handshake(addr, ConnOptions::new(HANG), &as_client(t)).await
}

fn mkdir(path: &str) -> (u16, Vec<u8>) {
    let req = MetaRequest::Create {
        path: path.into(),
        ty: NodeType::Directory,
        storage_class: nodekernel_proto::NO_CLASS,
        location: String::new(),
        enumerable: true,
        size_hint: 0,
        pinned: false,
        mode: 0o755,
        mtime: 0,
        open_existing: false,
        ttl_ms: 0,
        child_ttl_ms: 0,
        session: None,
    };
    let mut b = BytesMut::new();
    req.encode(&mut b);
    (req.op(), b.to_vec())
}

/// What a refused peer must not change: the namespace's node count, the
/// root's children and every server's used blocks.
async fn footprint(c: &Client) -> (u64, Vec<String>, Vec<(u32, u64)>) {
    let s = c.status().await.unwrap();
    let names = c.enumerate("/").await.unwrap();
    let used = s.servers.iter().map(|v| (v.id, v.used_blocks)).collect();
    (s.nodes, names, used)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_strangers_are_refused_on_every_port_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(8 << 20, 0, &dir);
    cfg.security.token = Some(SECRET.into());
    let t = start_with(cfg, dir).await;
    let c = &t.client;
    let data = pattern(3, 200_000);
    c.create("/t", NodeType::Table, Default::default())
        .await
        .unwrap();
    c.put("/t/kept", &data).await.unwrap();

    let meta_tcp = t.cluster.meta_addr().to_string();
    let meta_unix = format!(
        "unix:@{}",
        t.cluster.meta.local_socket().expect("a Unix socket")
    );
    let store = t.cluster.stores[0].local_addr().to_string();
    let shm = {
        let conn = connect(&store, Some(token(SECRET))).await.unwrap();
        let reply = conn.call(store_op::SHM_INFO, &[]).await.unwrap();
        decode_shm_info(&reply).unwrap()
    };
    assert!(!shm.is_empty());

    // A genuine connection, recorded on the way: its handshake and one
    // create, which the client then undoes.
    let (proxy, recorded) = recording_proxy(meta_tcp.clone()).await;
    let genuine = connect(&proxy, Some(token(SECRET))).await.unwrap();
    let (op, payload) = mkdir("/replayed");
    genuine.call(op, &[&payload]).await.unwrap();
    drop(genuine);
    let recorded = tokio::time::timeout(HANG, recorded).await.unwrap();
    c.delete("/replayed", false).await.unwrap();

    let before = footprint(c).await;
    let wrong = token("another token, the same length as the right one.");
    for addr in [&meta_tcp, &meta_unix, &store] {
        for (who, t) in [("no token", None), ("a wrong token", Some(wrong.clone()))] {
            let e = connect(addr, t).await.err().unwrap_or_else(|| {
                panic!("{addr} accepted a client with {who}");
            });
            assert_eq!(e.code, ErrorCode::Unauthenticated, "{addr}, {who}: {e}");
        }
        // A peer that skips the handshake and sends a request at once.
        if !addr.starts_with("unix:") {
            let mut s = tokio::net::TcpStream::connect(addr.as_str()).await.unwrap();
            let (op, payload) = mkdir("/sneaked");
            let mut frame = BytesMut::new();
            nodekernel_proto::FrameHeader::put(&mut frame, 1, op, payload.len());
            frame.extend_from_slice(&payload);
            s.write_all(&frame).await.unwrap();
            let mut rest = Vec::new();
            let _ = tokio::time::timeout(HANG, s.read_to_end(&mut rest)).await;
        }
    }
    // The recorded connection, replayed: refused at the proof, so its
    // create never runs.
    let mut s = tokio::net::TcpStream::connect(&meta_tcp).await.unwrap();
    s.write_all(&recorded).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(HANG, s.read_to_end(&mut answer)).await;
    assert!(
        String::from_utf8_lossy(&answer).contains("wrong cluster token"),
        "the replay is refused"
    );
    // The hand-over: nothing without the token, nothing with a wrong one.
    for who in [None, Some(wrong.clone())] {
        let name = shm.clone();
        let got = tokio::task::spawn_blocking(move || {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            let sock = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
            sock.set_read_timeout(Some(HANG)).unwrap();
            nodekernel_shm::answer_challenge(&sock, |n| who.map(|t| t.handover_proof(n)))
                .and_then(|()| nodekernel_shm::receive_region(&sock))
                .is_ok()
        })
        .await
        .unwrap();
        assert!(!got, "the memory went to a client without the token");
    }
    // A whole client with the wrong token fails to connect, naming why.
    let mut cc = t.cluster.client_config();
    cc.token = Some(wrong);
    let e = Client::connect(cc).await.err().unwrap();
    assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");

    assert_eq!(footprint(c).await, before, "refused peers changed nothing");
    assert!(c.lookup("/sneaked").await.is_err() && c.lookup("/replayed").await.is_err());
    // The right token works end to end, on both data paths.
    assert_eq!(c.get("/t/kept").await.unwrap(), data);
    for shared_memory in [true, false] {
        let mut cc = t.cluster.client_config();
        cc.shared_memory = shared_memory;
        let other = Client::connect(cc).await.unwrap();
        other.put("/t/fresh", &data).await.unwrap();
        assert_eq!(other.get("/t/fresh").await.unwrap(), data);
        other.delete("/t/fresh", false).await.unwrap();
        if shared_memory {
            assert!(
                other.data_path_stats().mapped_reads > 0,
                "the mapping was used"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_server_without_the_token_cannot_register() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(8 << 20, 0, &dir);
    cfg.security.token = Some(SECRET.into());
    let t = start_with(cfg, dir).await;
    let servers = t.client.status().await.unwrap().servers.len();
    let meta = t.cluster.meta_addr().to_string();

    for (who, token) in [
        ("no token", None),
        ("a wrong token", Some(token("x".repeat(32).as_str()))),
    ] {
        let fake = StorageServer::start(StoreConfig {
            metas: vec![meta.clone()],
            block_size: common::BS as u32,
            rpc_timeout: Duration::from_secs(1),
            security: Security {
                token,
                ..Security::default()
            },
            ..StoreConfig::default()
        })
        .await;
        let e = fake
            .err()
            .unwrap_or_else(|| panic!("a store with {who} registered"));
        assert!(e.to_string().contains("cluster token"), "{who}: {e}");
    }
    // Nor can a bare registration request get through.
    let e = connect(&meta, None).await.err().unwrap();
    assert_eq!(e.code, ErrorCode::Unauthenticated);
    assert_eq!(t.client.status().await.unwrap().servers.len(), servers);

    // With the token, one registers.
    let real = StorageServer::start(StoreConfig {
        metas: vec![meta],
        block_size: common::BS as u32,
        security: Security {
            token: Some(token(SECRET)),
            ..Security::default()
        },
        ..StoreConfig::default()
    })
    .await
    .unwrap();
    assert_eq!(t.client.status().await.unwrap().servers.len(), servers + 1);
    real.shutdown();
}

/// The attack found by hostile testing, without a token: 64 zero-length
/// writes with generation 2^63-1 used to claim every DRAM block, so every
/// reader and writer got `Stale` until the server restarted. Without a
/// capability for that generation the store refuses them all and changes
/// nothing; nor does a real capability for one block open another, or
/// another generation of the same block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_poisoning_fails_without_a_token_too() {
    use nodekernel_proto::cap::Cap;
    use nodekernel_proto::store::StoreRequest;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(8 << 20, 0, &dir);
    cfg.security.insecure = true;
    let t = start_with(cfg, dir).await;
    let c = &t.client;
    c.create("/t", NodeType::Table, Default::default())
        .await
        .unwrap();
    let data = pattern(5, 100_000);
    c.put("/t/kept", &data).await.unwrap();
    let mut f = c
        .create("/f", NodeType::File, Default::default())
        .await
        .unwrap();
    f.append(&data).await.unwrap();
    let loc = common::blocks_of(c, "/f").await[0].clone();

    let store = t.cluster.stores[0].local_addr().to_string();
    let raw = connect(&store, None).await.unwrap();
    let send = |req: StoreRequest<'_>| {
        let mut b = BytesMut::new();
        req.encode(&mut b);
        let raw = &raw;
        let op = req.op();
        async move { raw.call(op, &[&b]).await }
    };
    let poison = u64::MAX >> 1;
    for block in 0..64 {
        for cap in [Cap::default(), loc.cap] {
            let e = send(StoreRequest::Write {
                block,
                gen: poison,
                offset: 0,
                cap,
                data: &[],
            })
            .await
            .unwrap_err();
            assert_eq!(e.code, ErrorCode::Stale, "block {block}: {e}");
        }
    }
    // A claim batch, a copy and a read are refused the same way.
    let claims = (0..64)
        .map(|block| nodekernel_proto::store::Claim {
            block,
            gen: poison,
            clear_tag_at: None,
            scrub: false,
            release: false,
            cap: loc.cap,
        })
        .collect();
    let e = send(StoreRequest::Claim { claims }).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Stale, "{e}");
    // The capability the client was given reads its block, and only up to
    // its end.
    let read = |block, offset| StoreRequest::Read {
        block,
        gen: loc.gen,
        offset,
        len: 1,
        tag: None,
        cap: loc.cap,
    };
    let e = send(read(loc.block + 1, 0)).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Stale, "another block: {e}");
    let e = send(read(loc.block, loc.cap.hi)).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::OutOfRange, "{e}");

    // Nothing changed: every value reads back, and writing goes on.
    assert_eq!(c.get("/t/kept").await.unwrap(), data);
    f.append(b"more").await.unwrap();
    f.close().await.unwrap();
    let r = c.lookup("/f").await.unwrap();
    let mut back = vec![0u8; data.len() + 4];
    r.read_at(0, &mut back).await.unwrap();
    assert_eq!(back, [&data[..], b"more"].concat());
    c.put("/t/new", b"fresh").await.unwrap();
    assert_eq!(c.get("/t/new").await.unwrap(), b"fresh");
}

/// TLS end to end (`[security.tls]`): the storage servers register and
/// every client connection runs over TLS with the token proved inside it;
/// clients without TLS, or trusting another authority, are refused by the
/// metadata server and by a storage server's data port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_serves_tls_clients_only() {
    use nodekernel_client::TlsSection;
    let pki = tempfile::tempdir().unwrap();
    let g = nodekernel_rpc::tls::generate(pki.path(), &["127.0.0.1".into()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(8 << 20, 8 << 20, &dir);
    cfg.security.token = Some(SECRET.into());
    cfg.security.tls = Some(TlsSection {
        ca_file: Some(g.ca_file.clone()),
        cert_file: Some(g.cert_file.clone()),
        key_file: Some(g.key_file.clone()),
        ..TlsSection::default()
    });
    // TCP everywhere: no Unix socket, no shared memory.
    cfg.client.unix_socket = false;
    cfg.client.shared_memory = false;
    let t = start_with(cfg, dir).await;
    let c = &t.client;
    let data = pattern(5, 300_000);
    c.create("/t", NodeType::Table, Default::default())
        .await
        .unwrap();
    c.put("/t/over-tls", &data).await.unwrap();
    assert_eq!(c.get("/t/over-tls").await.unwrap(), data);
    let stats = c.data_path_stats();
    assert!(stats.network_writes > 0 && stats.network_reads > 0 && stats.mapped_reads == 0);

    let mut stranger_cfg = t.cluster.client_config();
    stranger_cfg.tls = None;
    let e = Client::connect(stranger_cfg.clone()).await.err().unwrap();
    assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    assert!(e.message.contains("requires TLS"), "{e}");
    let other = tempfile::tempdir().unwrap();
    let og = nodekernel_rpc::tls::generate(other.path(), &["127.0.0.1".into()]).unwrap();
    stranger_cfg.tls = Some(Arc::new(
        nodekernel_rpc::Tls::load(&nodekernel_rpc::TlsFiles {
            ca_file: Some(&og.ca_file),
            ..Default::default()
        })
        .unwrap(),
    ));
    let e = Client::connect(stranger_cfg).await.err().unwrap();
    assert!(e.message.contains("does not trust"), "{e}");

    // A storage server's data port, plain: refused too.
    let store_addr = t.cluster.stores[0].local_addr().to_string();
    let e = connect(&store_addr, Some(token(SECRET)))
        .await
        .err()
        .unwrap();
    assert!(e.message.contains("requires TLS"), "{e}");
}

/// A raw connection to `addr` as a member of `t`'s cluster: with its
/// token, or none on an insecure cluster.
async fn member(t: &common::TestCluster, addr: &str) -> Connection {
    connect(addr, t.cluster.client_config().token)
        .await
        .expect("a member connects")
}

async fn send_meta(conn: &Connection, req: MetaRequest) -> nodekernel_proto::Result<MetaReply> {
    let mut b = BytesMut::new();
    req.encode(&mut b);
    let reply = conn.call(req.op(), &[&b]).await?;
    MetaReply::decode(req.op(), &reply)
}

/// Issue 36, defect 1: one REGISTER frame with a live store's identity
/// (under another incarnation, or its own with another address and key),
/// or with its address under another identity, used to retire the store
/// (or take over its blocks): its data read `DataLost`. A registration
/// now replaces or moves a server only if that server fails to prove, at
/// its address, that it still serves under the key it registered; and
/// the registrant must prove it serves at the address it names. Neither
/// a member (with the token) nor, on an insecure cluster, a stranger
/// gets a live store retired, and an impostor store that copied the
/// store's identity cannot start. A store that really restarted still
/// takes its old place.
async fn no_registration_displaces_a_live_store(insecure: bool) {
    use nodekernel_proto::ServerSpec;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(8 << 20, 0, &dir);
    cfg.security.insecure = insecure;
    let t = start_with(cfg, dir).await;
    let c = &t.client;
    c.create("/t", NodeType::Table, Default::default())
        .await
        .unwrap();
    let data = pattern(11, 200_000);
    c.put("/t/k", &data).await.unwrap();
    let live = &t.cluster.stores[0];
    let before = c.status().await.unwrap().servers;
    assert_eq!(before.len(), 1);
    let meta = t.cluster.meta_addr().to_string();
    let conn = member(&t, &meta).await;
    let spec = |identity: &str, incarnation: u64, addr: &str| ServerSpec {
        addr: addr.into(),
        class: 0,
        class_name: "dram".into(),
        medium: "dram".into(),
        location: "h".into(),
        block_size: common::BS as u32,
        first_block: 0,
        num_blocks: 16,
        identity: identity.into(),
        incarnation,
        cap_key: [42; 32],
    };
    let (identity, addr) = (live.identity().to_string(), live.local_addr().to_string());
    for (what, fake, code) in [
        (
            "its identity under another incarnation at its address",
            spec(&identity, 12345, &addr),
            ErrorCode::InvalidArgument,
        ),
        (
            "its identity under another incarnation elsewhere",
            spec(&identity, 12345, "127.0.0.1:1"),
            ErrorCode::Unavailable,
        ),
        (
            "its identity and incarnation at another address, with another key",
            spec(&identity, live.incarnation(), "127.0.0.1:1"),
            ErrorCode::Unavailable,
        ),
        (
            "another identity at its address",
            spec("0123456789abcdef0123456789abcdef", 7, &addr),
            ErrorCode::InvalidArgument,
        ),
    ] {
        let e = send_meta(&conn, MetaRequest::Register(fake))
            .await
            .expect_err(what);
        assert_eq!(e.code, code, "{what}: {e}");
    }

    // An impostor: a real storage server whose data directory holds the
    // live store's (public) identity.
    let stolen = tempfile::tempdir().unwrap();
    std::fs::write(stolen.path().join("identity"), format!("{identity}\n")).unwrap();
    let impostor = StorageServer::start(StoreConfig {
        metas: vec![meta.clone()],
        block_size: common::BS as u32,
        capacity: 16 * common::BS,
        data_dir: nodekernel_store::DataDirConfig::At(stolen.path().to_path_buf()),
        rpc_timeout: Duration::from_secs(5),
        security: Security {
            token: t.cluster.client_config().token,
            ..Security::default()
        },
        ..StoreConfig::default()
    })
    .await;
    let Err(e) = impostor else {
        panic!("an impostor with a copied identity registered");
    };
    assert!(e.to_string().contains("still serves"), "{e}");

    // Nothing changed: the store is the same, alive, and its data reads.
    let after = c.status().await.unwrap().servers;
    assert_eq!(after.len(), 1);
    assert_eq!(
        (after[0].id, &after[0].identity, after[0].alive),
        (before[0].id, &before[0].identity, true)
    );
    assert_eq!(c.get("/t/k").await.unwrap(), data);

    // A real restart (a new process, a new incarnation, the same identity)
    // still replaces the old registration.
    let mut t = t;
    t.cluster
        .restart_store(0)
        .await
        .expect("a restarted store registers");
    let servers = t.client.status().await.unwrap().servers;
    assert!(servers.iter().any(|s| s.identity == identity && s.alive));
    t.client
        .put("/t/again", b"after the restart")
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_registration_displaces_a_live_store_with_the_token() {
    no_registration_displaces_a_live_store(false).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_registration_displaces_a_live_store_on_an_insecure_cluster() {
    no_registration_displaces_a_live_store(true).await
}

/// Heartbeats and resizes count only signed by their store: a forged
/// one, even from a member, is refused and changes nothing (issue 36:
/// "heartbeats are authenticated"; defect 9's resizes go the same way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_heartbeats_and_resizes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = start_with(config(8 << 20, 0, &dir), dir).await;
    let c = &t.client;
    let before = c.status().await.unwrap().servers;
    let conn = member(&t, &t.cluster.meta_addr().to_string()).await;
    let mut forged = MetaRequest::Heartbeat {
        server: before[0].id,
        traffic: Default::default(),
        signed: Default::default(),
    };
    let e = send_meta(&conn, forged.clone()).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    forged.sign(&[1; 32], u64::MAX - 1);
    let e = send_meta(&conn, forged).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    let mut shrink = MetaRequest::Resize {
        server: before[0].identity.clone(),
        blocks: 0,
        signed: Default::default(),
    };
    shrink.sign(&[1; 32], u64::MAX - 1);
    let e = send_meta(&conn, shrink).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    let after = c.status().await.unwrap().servers;
    assert_eq!(after[0].capacity_blocks, before[0].capacity_blocks);
    // The store's own heartbeats go on.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(c.status().await.unwrap().servers[0].alive);
}

/// Issue 36, defect 5: a client that only looked a value up used to
/// overwrite it with its read location's capability. A reader's location
/// now only reads: its write is refused (`Stale`), on a DRAM and on a file
/// store, for a small value (a piece), a value in blocks and a File; the
/// data is unchanged.
async fn readers_cannot_write(dram: u64, file: u64) {
    use nodekernel_proto::store::StoreRequest;
    let dir = tempfile::tempdir().unwrap();
    let t = start_with(config(dram, file, &dir), dir).await;
    let c = &t.client;
    c.create("/t", NodeType::Table, Default::default())
        .await
        .unwrap();
    let small = pattern(1, 100);
    let big = pattern(2, 200_000);
    c.put("/t/k1", &small).await.unwrap();
    c.put("/t/k2", &big).await.unwrap();
    let mut f = c
        .create("/f", NodeType::File, Default::default())
        .await
        .unwrap();
    f.append(&big).await.unwrap();
    f.close().await.unwrap();
    // Short writes, and whole blocks (which a DRAM store receives in
    // place).
    let long = vec![0xEE; common::BS as usize];
    for (path, data) in [
        ("/t/k1", &b"a reader's bytes"[..]),
        ("/t/k2", &b"a reader's bytes"[..]),
        ("/t/k2", &long[..]),
        ("/f", &b"a reader's bytes"[..]),
        ("/f", &long[..]),
    ] {
        let loc = common::blocks_of(c, path).await[0].clone();
        let store = member(&t, &loc.addr).await;
        let req = StoreRequest::Write {
            block: loc.block,
            gen: loc.gen,
            offset: loc.offset,
            cap: loc.cap,
            data,
        };
        let mut b = BytesMut::new();
        req.encode(&mut b);
        let e = store.call(req.op(), &[&b]).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Stale, "{path}: {e}");
        assert!(e.message.contains("allows reading only"), "{path}: {e}");
    }
    assert_eq!(c.get("/t/k1").await.unwrap(), small);
    assert_eq!(c.get("/t/k2").await.unwrap(), big);
    let mut back = vec![0u8; big.len()];
    c.lookup("/f")
        .await
        .unwrap()
        .read_at(0, &mut back)
        .await
        .unwrap();
    assert_eq!(back, big);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_cannot_write_on_a_dram_store() {
    readers_cannot_write(8 << 20, 0).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_cannot_write_on_a_file_store() {
    readers_cannot_write(0, 8 << 20).await
}

/// Capabilities expire: a location kept past `meta.cap_lifetime_ms` is
/// refused by the storage server (`Stale`, "expired"), and a client
/// holding it just asks again, on both data paths.
async fn capabilities_expire(shared_memory: bool) {
    use nodekernel_proto::store::StoreRequest;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(8 << 20, 0, &dir);
    cfg.meta.cap_lifetime_ms = 1000;
    cfg.client.shared_memory = shared_memory;
    let t = start_with(cfg, dir).await;
    let c = &t.client;
    let data = pattern(3, 150_000);
    let mut f = c
        .create("/f", NodeType::File, Default::default())
        .await
        .unwrap();
    f.append(&data).await.unwrap();
    f.close().await.unwrap();
    let node = c.lookup("/f").await.unwrap();
    let loc = common::blocks_of(c, "/f").await[0].clone();
    let store = member(&t, &loc.addr).await;
    let read = StoreRequest::Read {
        block: loc.block,
        gen: loc.gen,
        offset: 0,
        len: 10,
        tag: None,
        cap: loc.cap,
    };
    let mut b = BytesMut::new();
    read.encode(&mut b);
    store
        .call(read.op(), &[&b])
        .await
        .expect("a fresh location reads");
    // Past its second (the lifetime is counted in whole seconds).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let e = store.call(read.op(), &[&b]).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Stale, "{e}");
    assert!(e.message.contains("expired"), "{e}");
    // The handle looked up before reads on: the client asks again.
    let mut back = vec![0u8; data.len()];
    node.read_at(0, &mut back).await.unwrap();
    assert_eq!(back, data);
}

on_both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    capabilities_expire_and_clients_ask_again => capabilities_expire
);

/// Issue 36, defect 9: two unauthenticated `Resize` frames on the stores'
/// data ports shrank both to nothing, and every write then failed, once
/// with a misleading `Unavailable: no storage server is alive`. A default
/// cluster has a token, so a stranger's `Resize` is refused at the
/// handshake and changes nothing; and once every store exports nothing (a
/// member may still ask for that), a write fails with `NoSpace` saying
/// why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resizes_need_the_token_and_a_cluster_resized_to_nothing_says_so() {
    use nodekernel_proto::store::StoreRequest;
    let t = common::start(8 << 20, 8 << 20).await;
    let c = &t.client;
    let capacity = |s: &nodekernel_proto::ClusterStatus| -> Vec<u64> {
        s.servers.iter().map(|v| v.capacity_blocks).collect()
    };
    let before = capacity(&c.status().await.unwrap());
    let resize = |bytes| {
        let mut b = BytesMut::new();
        let req = StoreRequest::Resize { bytes };
        req.encode(&mut b);
        (req.op(), b)
    };
    for s in &t.cluster.stores {
        let Err(e) = connect(&s.local_addr().to_string(), None).await else {
            panic!("a stranger got in");
        };
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    }
    assert_eq!(capacity(&c.status().await.unwrap()), before);

    // A member resizes every store to nothing.
    for s in &t.cluster.stores {
        let (op, b) = resize(0);
        member(&t, &s.local_addr().to_string())
            .await
            .call(op, &[&b])
            .await
            .unwrap();
    }
    tokio::time::timeout(HANG, async {
        while capacity(&c.status().await.unwrap()).iter().any(|b| *b > 0) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the stores export nothing");
    // The table's child records need a block already; if they had one,
    // its value would.
    let e = match c.create("/t", NodeType::Table, Default::default()).await {
        Err(e) => e,
        Ok(_) => c.put("/t/k", b"a value").await.unwrap_err(),
    };
    assert_eq!(e.code, ErrorCode::NoSpace, "{e}");
    assert!(e.message.contains("resized to nothing"), "{e}");
}
