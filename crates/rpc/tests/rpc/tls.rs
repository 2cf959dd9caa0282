//! TLS on TCP connections ([`nodekernel_rpc::tls`]): requests are served
//! inside it and nothing of them crosses the wire in the clear; a client
//! that trusts another authority is refused; a TLS client against a plain
//! server and a plain client against a TLS server each fail saying so; a
//! server requiring client certificates refuses clients without one from
//! its authority; Unix sockets stay plain; large and small frames cross
//! both ways on one connection with replies received into callers'
//! buffers and bodies sent from memory, busy-polling or not; a connection
//! cut inside a record fails its calls, not the server.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::{conn_opts, start, Kind, HANG};
use nodekernel_proto::{Error, ErrorCode, Result};
use nodekernel_rpc::testing::recording_proxy;
use nodekernel_rpc::tls::{generate, Generated};
use nodekernel_rpc::{
    Connection, Handler, Role, ServeOptions, ServerHandshake, Tls, TlsFiles, Token,
    VersionHandshake,
};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A fresh authority and node certificate for 127.0.0.1 in `dir`.
fn pki(dir: &Path) -> Generated {
    generate(dir, &["127.0.0.1".into(), "localhost".into()]).unwrap()
}

/// A server's TLS: `g`'s certificate, optionally requiring clients'.
fn server_tls(g: &Generated, require_client_cert: bool) -> Arc<Tls> {
    Arc::new(
        Tls::load(&TlsFiles {
            ca_file: Some(&g.ca_file),
            cert_file: Some(&g.cert_file),
            key_file: Some(&g.key_file),
            require_client_cert,
            server_name: None,
        })
        .unwrap(),
    )
}

/// A client's TLS trusting `ca`, presenting `identity`'s certificate.
fn client_tls(ca: &Generated, identity: Option<&Generated>) -> Arc<Tls> {
    Arc::new(
        Tls::load(&TlsFiles {
            ca_file: Some(&ca.ca_file),
            cert_file: identity.map(|g| g.cert_file.as_path()),
            key_file: identity.map(|g| g.key_file.as_path()),
            ..TlsFiles::default()
        })
        .unwrap(),
    )
}

/// Echoes and counts what it served.
struct Echo {
    tls: Option<Arc<Tls>>,
    token: Option<Arc<Token>>,
    served: AtomicU64,
}

impl Echo {
    fn new(tls: Option<Arc<Tls>>) -> Arc<Echo> {
        Arc::new(Echo {
            tls,
            token: None,
            served: AtomicU64::new(0),
        })
    }
}

impl Handler for Echo {
    async fn handle(&self, _op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        self.served.fetch_add(1, Ordering::SeqCst);
        out.extend_from_slice(&payload);
        Ok(())
    }

    fn handshake(&self) -> Arc<dyn ServerHandshake> {
        Arc::new(
            VersionHandshake::new(Role::StorageServer)
                .with_token(self.token.clone())
                .with_tls(self.tls.clone()),
        )
    }
}

async fn connect(addr: &str, tls: Option<Arc<Tls>>) -> std::result::Result<Connection, Error> {
    connect_with_token(addr, tls, None).await
}

async fn connect_with_token(
    addr: &str,
    tls: Option<Arc<Tls>>,
    token: Option<Arc<Token>>,
) -> std::result::Result<Connection, Error> {
    let hs = VersionHandshake::new(Role::Client)
        .with_tls(tls)
        .with_token(token);
    let opts = conn_opts(Duration::ZERO);
    tokio::time::timeout(HANG, Connection::connect_with_handshake(addr, opts, &hs))
        .await
        .expect("the connect finished")
}

const SECRET: &[u8] = b"a payload that must never cross the wire in the clear";

#[tokio::test]
async fn requests_are_served_inside_tls_and_never_cross_the_wire_in_the_clear() {
    let dir = tempfile::tempdir().unwrap();
    let g = pki(dir.path());
    let h = Echo::new(Some(server_tls(&g, false)));
    let server = start(Kind::Tcp, h.clone(), ServeOptions::default()).await;

    // Through a proxy that records what the client sends.
    let (proxy, recorded) = recording_proxy(server.addr.clone()).await;
    let conn = connect(&proxy, Some(client_tls(&g, None))).await.unwrap();
    assert_eq!(conn.peer_info().role, Role::StorageServer);
    // Small and large payloads (a large one spans many TLS records).
    let big: Vec<u8> = SECRET.iter().copied().cycle().take(3 << 20).collect();
    assert_eq!(&conn.call(2, &[SECRET]).await.unwrap()[..], SECRET);
    assert_eq!(&conn.call(2, &[&big]).await.unwrap()[..], &big[..]);
    drop(conn);
    let sent = tokio::time::timeout(HANG, recorded).await.unwrap();
    assert!(sent.len() > big.len(), "{} bytes", sent.len());
    assert!(
        !sent.windows(SECRET.len()).any(|w| w == SECRET),
        "the payload crossed the wire in the clear"
    );
    assert_eq!(h.served.load(Ordering::SeqCst), 2);

    // The same request over a plain connection does show it: the check
    // above can see a leak.
    let plain = Echo::new(None);
    let plain_server = start(Kind::Tcp, plain, ServeOptions::default()).await;
    let (proxy, recorded) = recording_proxy(plain_server.addr.clone()).await;
    let conn = connect(&proxy, None).await.unwrap();
    conn.call(2, &[SECRET]).await.unwrap();
    drop(conn);
    let sent = tokio::time::timeout(HANG, recorded).await.unwrap();
    assert!(sent.windows(SECRET.len()).any(|w| w == SECRET));
}

#[tokio::test]
async fn a_client_trusting_another_authority_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let (g, stranger) = (pki(dir.path()), pki(other.path()));
    let h = Echo::new(Some(server_tls(&g, false)));
    let server = start(Kind::Tcp, h.clone(), ServeOptions::default()).await;
    let e = connect(&server.addr, Some(client_tls(&stranger, None)))
        .await
        .err()
        .expect("refused");
    assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    assert!(
        e.message.contains("TLS handshake") && e.message.contains("does not trust"),
        "{e}"
    );
    // A name the certificate does not carry is refused the same way.
    let misnamed = Arc::new(
        Tls::load(&TlsFiles {
            ca_file: Some(&g.ca_file),
            server_name: Some("elsewhere.example"),
            ..TlsFiles::default()
        })
        .unwrap(),
    );
    let e = connect(&server.addr, Some(misnamed))
        .await
        .err()
        .expect("refused");
    assert!(e.message.contains("does not trust"), "{e}");
    assert_eq!(h.served.load(Ordering::SeqCst), 0);
    // The right authority works.
    let conn = connect(&server.addr, Some(client_tls(&g, None)))
        .await
        .unwrap();
    conn.call(2, &[b"x"]).await.unwrap();
}

#[tokio::test]
async fn tls_against_plain_and_plain_against_tls_fail_saying_so() {
    let dir = tempfile::tempdir().unwrap();
    let g = pki(dir.path());

    // A TLS client, a plain server: the server closes, the client says TLS
    // may not be configured there.
    let plain = Echo::new(None);
    let server = start(Kind::Tcp, plain.clone(), ServeOptions::default()).await;
    let e = connect(&server.addr, Some(client_tls(&g, None)))
        .await
        .err()
        .expect("refused");
    assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    assert!(
        e.message.contains("TLS handshake") && e.message.contains("is TLS configured on it"),
        "{e}"
    );

    // A plain client, a TLS server: answered in the clear that TLS is
    // required.
    let tls = Echo::new(Some(server_tls(&g, false)));
    let server = start(Kind::Tcp, tls.clone(), ServeOptions::default()).await;
    let e = connect(&server.addr, None).await.err().expect("refused");
    assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    assert!(e.message.contains("requires TLS"), "{e}");
    assert_eq!(plain.served.load(Ordering::SeqCst), 0);
    assert_eq!(tls.served.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_server_requiring_client_certificates_takes_only_those_of_its_authority() {
    let dir = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let (g, stranger) = (pki(dir.path()), pki(other.path()));
    let h = Echo::new(Some(server_tls(&g, true)));
    let server = start(Kind::Tcp, h.clone(), ServeOptions::default()).await;

    for (who, identity) in [
        ("no certificate", None),
        ("another authority's", Some(&stranger)),
    ] {
        let e = connect(&server.addr, Some(client_tls(&g, identity)))
            .await
            .err()
            .unwrap_or_else(|| panic!("a client with {who} was let in"));
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{who}: {e}");
        assert!(
            e.message.contains(&server.addr) && e.message.contains("certificate"),
            "{who}: {e}"
        );
    }
    assert_eq!(h.served.load(Ordering::SeqCst), 0);
    let conn = connect(&server.addr, Some(client_tls(&g, Some(&g))))
        .await
        .unwrap();
    assert_eq!(&conn.call(2, &[b"in"]).await.unwrap()[..], b"in");
}

#[tokio::test]
async fn the_cluster_token_is_proved_inside_tls_and_unix_sockets_stay_plain() {
    let dir = tempfile::tempdir().unwrap();
    let g = pki(dir.path());
    let token = Arc::new(Token::new(&[7; 32], "test").unwrap());
    let h = Arc::new(Echo {
        tls: Some(server_tls(&g, false)),
        token: Some(token.clone()),
        served: AtomicU64::new(0),
    });
    let tcp = start(Kind::Tcp, h.clone(), ServeOptions::default()).await;
    let conn = connect_with_token(&tcp.addr, Some(client_tls(&g, None)), Some(token.clone()))
        .await
        .unwrap();
    conn.call(2, &[b"x"]).await.unwrap();
    let wrong = Arc::new(Token::new(&[8; 32], "test").unwrap());
    let e = connect_with_token(&tcp.addr, Some(client_tls(&g, None)), Some(wrong))
        .await
        .err()
        .expect("refused");
    assert!(e.message.contains("wrong cluster token"), "{e}");

    // The same handler on a Unix socket: TLS does not apply, on either end.
    let unix = start(Kind::Unix, h.clone(), ServeOptions::default()).await;
    let conn = connect_with_token(&unix.addr, Some(client_tls(&g, None)), Some(token))
        .await
        .unwrap();
    conn.call(2, &[b"y"]).await.unwrap();
    assert_eq!(h.served.load(Ordering::SeqCst), 2);
}

#[test]
fn bad_settings_name_the_file_and_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let g = pki(dir.path());
    let missing = dir.path().join("missing.pem");
    let e = Tls::load(&TlsFiles {
        ca_file: Some(&missing),
        ..TlsFiles::default()
    })
    .unwrap_err();
    assert!(
        e.message.contains("ca_file") && e.message.contains("missing.pem"),
        "{e}"
    );
    // A key where a certificate belongs.
    let e = Tls::load(&TlsFiles {
        ca_file: Some(&g.ca_key_file),
        ..TlsFiles::default()
    })
    .unwrap_err();
    assert!(e.message.contains("no PEM certificate"), "{e}");
    let e = Tls::load(&TlsFiles::default()).unwrap_err();
    assert!(e.message.contains("needs ca_file"), "{e}");
    let e = Tls::load(&TlsFiles {
        ca_file: Some(&g.ca_file),
        cert_file: Some(&g.cert_file),
        ..TlsFiles::default()
    })
    .unwrap_err();
    assert!(e.message.contains("together"), "{e}");
    let e = Tls::load(&TlsFiles {
        ca_file: Some(&g.ca_file),
        require_client_cert: true,
        ..TlsFiles::default()
    })
    .unwrap_err();
    assert!(e.message.contains("require_client_cert"), "{e}");
    // generate never overwrites.
    let e = generate(dir.path(), &["127.0.0.1".into()]).unwrap_err();
    assert!(e.message.contains("exists"), "{e}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&g.key_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_and_small_frames_cross_both_ways_and_replies_land_in_callers_buffers() {
    let dir = tempfile::tempdir().unwrap();
    let g = pki(dir.path());
    let h = Echo::new(Some(server_tls(&g, false)));
    let server = start(Kind::Tcp, h.clone(), ServeOptions::default()).await;
    for spin in [Duration::ZERO, Duration::from_micros(50)] {
        let hs = VersionHandshake::new(Role::Client).with_tls(Some(client_tls(&g, None)));
        let conn = Connection::connect_with_handshake(&server.addr, conn_opts(spin), &hs);
        let conn = Arc::new(tokio::time::timeout(HANG, conn).await.unwrap().unwrap());
        // Sizes around a record (16 KiB), the session's send limit
        // (256 KiB) and the receive stage (64 KiB), in flight together.
        const SIZES: [usize; 8] = [
            1,
            100,
            16_383,
            16_385,
            65_537,
            262_145,
            1 << 20,
            (3 << 20) + 7,
        ];
        let tasks: Vec<_> = (0..6u8)
            .map(|t| {
                let conn = conn.clone();
                tokio::spawn(async move {
                    for round in 0..12usize {
                        let len = SIZES[(t as usize + round) % SIZES.len()];
                        let sent = pattern(len, t.wrapping_mul(13).wrapping_add(round as u8));
                        if (t as usize + round).is_multiple_of(2) {
                            // Not zeroed: stale bytes would show.
                            let mut buf = vec![0xEEu8; len + 5];
                            let n = conn.call_into(2, &[&sent], &mut buf).await.unwrap();
                            assert_eq!(n, len);
                            assert!(buf[..n] == sent[..], "task {t} round {round}: direct");
                            assert!(buf[n..].iter().all(|&b| b == 0xEE), "wrote past it");
                        } else {
                            let got = conn.call(2, &[&sent]).await.unwrap();
                            assert!(got[..] == sent[..], "task {t} round {round}: wrong reply");
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            tokio::time::timeout(HANG, t).await.unwrap().unwrap();
        }
        // Replies went into the callers' buffers from the session, not
        // through the connection's receive buffer (beyond what came with
        // a header).
        let copies = conn.reply_copies();
        assert!(
            copies.direct() > copies.staged(),
            "{}/{}",
            copies.direct(),
            copies.staged()
        );
    }
    assert_eq!(h.served.load(Ordering::SeqCst), 2 * 6 * 12);
}

/// Forwards one TCP connection to `to`, passing at most `limit` bytes
/// from the client, then cutting both directions.
async fn cutting_proxy(to: String, limit: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (c, _) = l.accept().await.unwrap();
        let s = tokio::net::TcpStream::connect(&to).await.unwrap();
        let (mut cr, mut cw) = c.into_split();
        let (mut sr, mut sw) = s.into_split();
        let down = tokio::spawn(async move {
            let _ = tokio::io::copy(&mut sr, &mut cw).await;
        });
        let mut buf = vec![0u8; 4096];
        let mut passed = 0;
        while passed < limit {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n.min(limit - passed),
            };
            if sw.write_all(&buf[..n]).await.is_err() {
                break;
            }
            passed += n;
        }
        // Both directions go down: the client's record is cut short.
        down.abort();
        drop((cr, sw));
    });
    addr
}

#[tokio::test]
async fn a_connection_cut_mid_record_fails_its_calls_and_the_server_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let g = pki(dir.path());
    let h = Echo::new(Some(server_tls(&g, false)));
    let server = start(Kind::Tcp, h.clone(), ServeOptions::default()).await;
    // The handshake and a small call pass; a 1 MiB request is cut after
    // about 100 KB, inside one of its records.
    let proxy = cutting_proxy(server.addr.clone(), 100_000).await;
    let conn = connect(&proxy, Some(client_tls(&g, None))).await.unwrap();
    assert_eq!(&conn.call(2, &[SECRET]).await.unwrap()[..], SECRET);
    let big = pattern(1 << 20, 3);
    let e = tokio::time::timeout(HANG, conn.call(2, &[&big]))
        .await
        .expect("the call ended")
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "{e}");
    assert_eq!(h.served.load(Ordering::SeqCst), 1);
    // The server took only that connection down.
    let conn = connect(&server.addr, Some(client_tls(&g, None)))
        .await
        .unwrap();
    assert_eq!(&conn.call(2, &[&big]).await.unwrap()[..], &big[..]);
}

/// Echoes, or for op 9 replies with `len` bytes of a static body sent
/// from memory (as a storage server sends a DRAM read) and a trailer.
struct Bodies {
    tls: Arc<Tls>,
}

static BODY: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| pattern(1 << 20, 42));

struct StaticBody(usize);

// SAFETY: `BODY` lives for the whole program and is never written.
unsafe impl nodekernel_rpc::SharedBody for StaticBody {
    fn bytes(&self) -> (*const u8, usize) {
        (BODY.as_ptr(), self.0)
    }
    fn trailer_len(&self) -> usize {
        1
    }
    fn seal(&self, out: &mut BytesMut) {
        out.extend_from_slice(b"!");
    }
}

impl Handler for Bodies {
    async fn handle(&self, _op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        out.extend_from_slice(&payload);
        Ok(())
    }

    async fn handle_reply(
        &self,
        op: u16,
        payload: Bytes,
        reply: &mut nodekernel_rpc::Reply,
    ) -> Result<()> {
        if op != 9 {
            return self.handle(op, payload, reply.out()).await;
        }
        let len = u32::from_le_bytes(payload[..4].try_into().unwrap()) as usize;
        reply.set_body(Box::new(StaticBody(len)));
        Ok(())
    }

    fn handshake(&self) -> Arc<dyn ServerHandshake> {
        Arc::new(VersionHandshake::new(Role::StorageServer).with_tls(Some(self.tls.clone())))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_sent_from_memory_arrive_whole_on_fresh_and_busy_connections() {
    let dir = tempfile::tempdir().unwrap();
    let g = pki(dir.path());
    let h = Arc::new(Bodies {
        tls: server_tls(&g, false),
    });
    let server = start(Kind::Tcp, h, ServeOptions::default()).await;
    let client = client_tls(&g, None);
    // Busy-polling callers pull whole records into the session ahead of
    // the reply they park for (the rest is then in no socket, and no
    // readiness announces it): they must still find it.
    for round in 0..40 {
        let spin = [Duration::ZERO, Duration::from_micros(100)][round % 2];
        let hs = VersionHandshake::new(Role::Client).with_tls(Some(client.clone()));
        let opts = conn_opts(spin);
        let conn = Connection::connect_with_handshake(&server.addr, opts, &hs);
        let conn = tokio::time::timeout(HANG, conn).await.unwrap().unwrap();
        for (i, len) in [1024usize, 1, 70_000, 1 << 20, 1024, 1024]
            .into_iter()
            .enumerate()
        {
            let mut buf = Vec::with_capacity(len);
            let mut trailer = [0u8; 1];
            let req = (len as u32).to_le_bytes();
            let parts: [&[u8]; 1] = [&req];
            let call = conn.call_into_uninit(9, &parts, buf.spare_capacity_mut(), &mut trailer);
            let n = tokio::time::timeout(HANG, call)
                .await
                .unwrap_or_else(|_| panic!("round {round} call {i} ({len} bytes) hung"))
                .unwrap_or_else(|e| panic!("round {round} call {i} ({len} bytes): {e}"));
            // SAFETY: `n` bytes were received.
            unsafe { buf.set_len(n) };
            assert!(n == len && buf[..] == BODY[..len], "round {round} call {i}");
            assert_eq!(&trailer, b"!");
        }
    }
}
