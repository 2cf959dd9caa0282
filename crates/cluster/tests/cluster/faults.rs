//! Bad input and faults (README.md, *Semantics in brief*; `docs/security.md`, *Limits*): malformed frames on both server
//! ports, and a storage server that is killed.

use crate::common;

use nodekernel_client::{CreateOptions, ErrorCode, NodeType};
use nodekernel_proto::frame::STATUS_OK;
use nodekernel_proto::hello::{Hello, Role, HELLO_ID, HELLO_KIND};
use nodekernel_proto::{FrameHeader, HEADER_LEN};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Generous bound that only catches hangs.
const HANG: Duration = Duration::from_secs(120);

/// Reads one reply frame, or `None` if the server closed the connection.
async fn read_reply(s: &mut TcpStream) -> Option<(u64, u16, Vec<u8>)> {
    let mut h = [0u8; HEADER_LEN];
    let r = tokio::time::timeout(HANG, s.read_exact(&mut h)).await;
    match r.expect("server answers or closes") {
        Ok(_) => {}
        Err(_) => return None,
    }
    let hdr = FrameHeader::parse(&h).expect("server sends valid frames");
    let mut p = vec![0u8; hdr.payload_len];
    s.read_exact(&mut p).await.ok()?;
    Some((hdr.id, hdr.kind, p))
}

fn frame(id: u64, kind: u16, payload: &[u8]) -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    FrameHeader::put(&mut b, id, kind, payload.len());
    b.extend_from_slice(payload);
    b.to_vec()
}

/// Throws every kind of malformed input at `addr`.
async fn abuse(addr: &str) {
    // 1. Random bytes: an error reply or a closed connection.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let junk = common::pattern(9, 4096);
    let _ = s.write_all(&junk).await;
    if let Some((_, status, _)) = read_reply(&mut s).await {
        assert_ne!(status, STATUS_OK, "garbage never succeeds");
    }

    // 2. A frame claiming 4 GiB: refused before any allocation.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut big = frame(7, 1, &[]);
    big[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    s.write_all(&big).await.unwrap();
    let (id, status, msg) = read_reply(&mut s)
        .await
        .expect("an error reply before closing");
    assert_eq!((id, status), (7, ErrorCode::Protocol as u16));
    assert!(String::from_utf8_lossy(&msg).contains("exceeds the maximum"));
    assert!(
        read_reply(&mut s).await.is_none(),
        "then the connection is closed"
    );

    // 3. A truncated frame, then the client goes away.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let f = frame(8, 2, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
    s.write_all(&f[..f.len() - 4]).await.unwrap();
    drop(s);
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&[1, 2, 3]).await.unwrap();
    drop(s);

    // 4. Unknown op and malformed payloads: Protocol error, connection lives on
    //    (once past the handshake every connection starts with).
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut hello = bytes::BytesMut::new();
    Hello::new(Role::Client).encode(&mut hello).unwrap();
    s.write_all(&frame(HELLO_ID, HELLO_KIND, &hello))
        .await
        .unwrap();
    let (id, status, _) = read_reply(&mut s).await.expect("a HELLO answer");
    assert_eq!((id, status), (HELLO_ID, STATUS_OK));
    for (id, kind, payload) in [
        (1u64, 999u16, vec![]),
        (2, 1, vec![0xFF; 3]),
        (3, 2, vec![0xFF; 9]),
    ] {
        s.write_all(&frame(id, kind, &payload)).await.unwrap();
        let (rid, status, _) = read_reply(&mut s).await.expect("connection still open");
        assert_eq!(rid, id);
        assert_eq!(status, ErrorCode::Protocol as u16, "kind {kind}");
    }
}

#[tokio::test]
async fn malformed_frames_on_both_ports_do_not_stop_service() {
    // Without a token, so that every frame gets past the handshake to the
    // decoders (with one, the handshake refuses them first).
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(8 << 20, 32 << 20, &dir);
    cfg.security.insecure = true;
    let t = common::start_with(cfg, dir).await;
    let c = &t.client;
    // A client already connected before the abuse keeps working after it.
    c.put_kv_table().await;
    let meta = t.cluster.meta_addr().to_string();
    abuse(&meta).await;
    for s in &t.cluster.stores {
        abuse(&s.local_addr().to_string()).await;
    }
    c.put("/t/after", b"still serving").await.unwrap();
    assert_eq!(c.get("/t/after").await.unwrap(), b"still serving");
    assert_eq!(c.get("/t/before").await.unwrap(), b"before");
    let fresh = t.cluster.client().await.unwrap();
    let mut n = fresh
        .create("/f", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    n.append(&common::pattern(1, 300_000)).await.unwrap();
    n.close().await.unwrap();
    assert_eq!(fresh.get("/f").await.unwrap(), common::pattern(1, 300_000));
}

trait Seed {
    async fn put_kv_table(&self);
}

impl Seed for nodekernel_client::Client {
    async fn put_kv_table(&self) {
        self.create("/t", NodeType::Table, CreateOptions::default())
            .await
            .unwrap();
        self.put("/t/before", b"before").await.unwrap();
    }
}

#[tokio::test]
async fn killed_storage_server_fails_reads_fast_and_spares_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(8 << 20, 32 << 20, &dir);
    // Declaring the killed server dead is under test (heartbeats: 100 ms).
    cfg.meta.dead_after_ms = 3_000;
    let t = common::start_with(cfg, dir).await;
    let c = &t.client;
    let on = |class| CreateOptions {
        storage_class: Some(class),
        ..CreateOptions::default()
    };
    let dram_data = common::pattern(1, 500_000);
    let file_data = common::pattern(2, 500_000);
    let mut a = c.create("/on-dram", NodeType::File, on(0)).await.unwrap();
    a.append(&dram_data).await.unwrap();
    a.close().await.unwrap();
    let mut b = c.create("/on-file", NodeType::File, on(1)).await.unwrap();
    b.append(&file_data).await.unwrap();
    b.close().await.unwrap();
    // A directory whose child records live on the DRAM server too.
    c.create("/hot", NodeType::Directory, on(0)).await.unwrap();
    for name in ["x", "y", "z"] {
        c.create(&format!("/hot/{name}"), NodeType::Directory, on(1))
            .await
            .unwrap();
    }
    let reader = c.lookup("/on-dram").await.unwrap();
    assert_eq!(
        reader.read(0, 500_000).await.unwrap(),
        dram_data,
        "cached locations warm"
    );

    // Kill the DRAM storage server (class 0).
    t.cluster.stores[0].shutdown();

    // A reader with cached locations gets a clear error, bounded by the
    // client timeout (the codes say so; the outer bound only catches hangs).
    let e = tokio::time::timeout(HANG, reader.read(0, 500_000))
        .await
        .expect("no hang")
        .unwrap_err();
    assert!(
        matches!(
            e.code,
            ErrorCode::Unavailable | ErrorCode::Timeout | ErrorCode::DataLost
        ),
        "{e}"
    );
    assert!(e.message.contains("/on-dram"), "error names the path: {e}");

    // Once declared dead, lookups report the data lost.
    let deadline = Instant::now() + HANG;
    loop {
        let st = c.status().await.unwrap();
        if st.servers.iter().any(|s| !s.alive) {
            break;
        }
        assert!(Instant::now() < deadline, "server never declared dead");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fresh = c.lookup("/on-dram").await.unwrap();
    let e = tokio::time::timeout(HANG, fresh.read(0, 10))
        .await
        .expect("no hang")
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::DataLost, "{e}");

    // The namespace and the other server keep working.
    assert_eq!(c.get("/on-file").await.unwrap(), file_data);
    c.mkdir("/still/works", true).await.unwrap();
    let mut n = c
        .create("/still/works/new", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    n.append(&dram_data).await.unwrap();
    n.close().await.unwrap();
    assert_eq!(
        c.get("/still/works/new").await.unwrap(),
        dram_data,
        "new blocks avoid the dead server"
    );
    // Child records on the dead server are lost, yet listing stays exact:
    // the names of those live slots come from the metadata server.
    let mut root = c.enumerate("/").await.unwrap();
    root.sort();
    assert_eq!(root, vec!["hot", "on-dram", "on-file", "still"]);
    assert_eq!(
        c.enumerate("/hot").await.unwrap(),
        vec!["x", "y", "z"],
        "names recovered"
    );
    c.create("/hot/w", NodeType::File, CreateOptions::default())
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    assert_eq!(
        c.enumerate("/hot").await.unwrap(),
        vec!["x", "y", "z", "w"],
        "records relocated"
    );
    assert_eq!(c.enumerate("/still/works").await.unwrap(), vec!["new"]);
    c.delete("/on-dram", false).await.unwrap();
    let mut root = c.enumerate("/").await.unwrap();
    root.sort();
    assert_eq!(root, vec!["hot", "on-file", "still"]);
}
