//! The server's resource bounds: open connections, requests in flight,
//! memory for a frame announced but not sent, and time for a frame or a
//! handshake that stalls. Every check waits for an event (with a bound that
//! only catches hangs), never for a time to pass.

use crate::common;

use common::{closed_by_server, connect, frame, raw_peer, read_frame, start, Echo, Kind, HANG};
use nodekernel_proto::{ErrorCode, FrameHeader, HEADER_LEN, MAX_PAYLOAD_LEN};
use nodekernel_rpc::limits::{MAX_HANDSHAKES, MAX_REQUEST_BYTES, RECV_BUF_INITIAL, RECV_READ_MIN};
use nodekernel_rpc::{Connection, ServeOptions};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// One peer (here, 127.0.0.1, or this process's user on the Unix socket)
/// cannot take every connection: beyond its own cap it is refused, saying
/// so, while the server's overall cap is far from reached; a connection
/// that closes frees its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_cannot_take_every_connection() {
    const PER_PEER: usize = 3;
    let opts = ServeOptions {
        max_connections_per_peer: PER_PEER,
        ..ServeOptions::default()
    };
    for kind in [Kind::Tcp, Kind::Unix] {
        let server = start(kind, Arc::new(Echo::default()), opts).await;
        let mut conns = Vec::new();
        for _ in 0..PER_PEER {
            let c = connect(&server.addr, Duration::ZERO).await;
            assert_eq!(&c.call(2, &[b"x"]).await.unwrap()[..], b"x");
            conns.push(c);
        }
        let e = Connection::connect(&server.addr, HANG)
            .await
            .err()
            .expect("one more from the same peer is refused");
        assert_eq!(e.code, ErrorCode::Unavailable, "{kind:?}: {e}");
        if kind == Kind::Tcp {
            // The refusal says why (a client that wrote its HELLO first may
            // see the connection closed instead).
            let mut s = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
            let (_, status, msg) = read_frame(&mut s).await.expect("the refusal");
            assert_eq!(status, ErrorCode::Unavailable as u16);
            let msg = String::from_utf8_lossy(&msg);
            assert!(
                msg.contains("limit per peer") && msg.contains("127.0.0.1"),
                "{msg}"
            );
        }
        drop(conns.pop());
        common::eventually("the closed connection to leave", || {
            server.connections() == PER_PEER - 1
        })
        .await;
        let c = connect(&server.addr, Duration::ZERO).await;
        assert_eq!(&c.call(2, &[b"y"]).await.unwrap()[..], b"y");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_refused_at_once_and_service_resumes() {
    const CAP: usize = 4;
    let opts = ServeOptions {
        max_connections: CAP,
        ..ServeOptions::default()
    };
    for kind in [Kind::Tcp, Kind::Unix] {
        let server = start(kind, Arc::new(Echo::default()), opts).await;
        let mut conns = Vec::new();
        for i in 0..CAP {
            let c = connect(&server.addr, Duration::ZERO).await;
            assert_eq!(&c.call(2, &[&[i as u8]]).await.unwrap()[..], &[i as u8]);
            conns.push(c);
        }
        // Beyond the cap: refused with an error, not left hanging (the
        // connect timeout, HANG, is far beyond any refusal).
        for _ in 0..3 {
            let e = Connection::connect(&server.addr, HANG)
                .await
                .err()
                .expect("a connection beyond the cap is refused");
            assert_eq!(e.code, ErrorCode::Unavailable, "{kind:?}: {e}");
        }
        if kind == Kind::Tcp {
            // A raw peer is told why, then closed.
            let mut s = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
            if let Some((id, status, msg)) = read_frame(&mut s).await {
                let msg = String::from_utf8_lossy(&msg).into_owned();
                assert_eq!((id, status), (0, ErrorCode::Unavailable as u16), "{msg}");
                assert!(msg.contains(&format!("{CAP} open connections")), "{msg}");
            }
            closed_by_server(&mut s).await;
        }
        assert!(server.refused_connections() >= 3);
        assert_eq!(server.connections(), CAP);
        // The connections inside the cap were not disturbed.
        for c in &conns {
            assert_eq!(&c.call(2, &[b"still"]).await.unwrap()[..], b"still");
        }
        // Once some close, new ones are served again.
        conns.truncate(CAP - 2);
        common::eventually("closed connections to leave the count", || {
            server.connections() == CAP - 2
        })
        .await;
        for _ in 0..2 {
            let c = connect(&server.addr, Duration::ZERO).await;
            assert_eq!(&c.call(2, &[b"fresh"]).await.unwrap()[..], b"fresh");
            conns.push(c);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_in_flight_are_capped_per_connection_and_per_server() {
    // op 1 sleeps the number of ms in its first byte: long enough that
    // requests pile up against the caps.
    // (per connection, per server, connections, the most at once)
    for (per_conn, per_server, conns, cap) in [(3, 1000, 2, 6), (64, 5, 4, 5)] {
        let echo = Arc::new(Echo::default());
        let opts = ServeOptions {
            max_in_flight: per_conn,
            max_requests: per_server,
            ..ServeOptions::default()
        };
        let server = start(Kind::Tcp, echo.clone(), opts).await;
        let mut tasks = Vec::new();
        for _ in 0..conns {
            let c = Arc::new(connect(&server.addr, Duration::ZERO).await);
            for i in 0..20u8 {
                let c = c.clone();
                tasks.push(tokio::spawn(async move {
                    let r = c.call(1, &[&[20, i]]).await.unwrap();
                    assert_eq!(&r[..], &[20, i]);
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        let most = echo.most_active.load(Ordering::SeqCst);
        assert!(most <= cap, "{most} requests handled at once, cap {cap}");
        assert_eq!(server.requests_in_flight(), 0);
    }
}

#[tokio::test]
async fn a_frame_announced_but_not_sent_does_not_pin_its_size() {
    // A header announcing the largest frame, then 10 bytes, then nothing.
    // A short frame timeout closes the connection; that close shows the
    // server read those bytes, so the buffer's high-water mark is final.
    let opts = ServeOptions {
        frame_timeout: Duration::from_millis(200),
        ..ServeOptions::default()
    };
    let server = start(Kind::Tcp, Arc::new(Echo::default()), opts).await;
    let mut s = raw_peer(&server.addr).await;
    let mut start = bytes::BytesMut::new();
    FrameHeader::put(&mut start, 1, 2, MAX_PAYLOAD_LEN);
    start.extend_from_slice(&[7u8; 10]);
    s.write_all(&start).await.unwrap();
    closed_by_server(&mut s).await;
    let peak = server.recv_buffer_peak();
    assert!(
        peak <= 4 * RECV_BUF_INITIAL,
        "{peak} bytes of receive buffer for {} bytes received of a \
         {MAX_PAYLOAD_LEN}-byte frame",
        HEADER_LEN + 10
    );
    common::eventually("the closed connection to free its buffer", || {
        server.recv_buffer_bytes() == 0
    })
    .await;

    // A frame that does arrive whole still gets through, however large.
    let conn = connect(&server.addr, Duration::ZERO).await;
    let big = vec![3u8; MAX_PAYLOAD_LEN];
    assert!(conn.call(2, &[&big]).await.unwrap()[..] == big[..]);
}

#[tokio::test]
async fn a_connection_stalled_mid_frame_is_closed() {
    let opts = ServeOptions {
        frame_timeout: Duration::from_millis(200),
        ..ServeOptions::default()
    };
    let server = start(Kind::Tcp, Arc::new(Echo::default()), opts).await;

    // Idle between frames is fine, however long: the timeout only runs
    // once a frame has started.
    let mut s = raw_peer(&server.addr).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    s.write_all(&frame(1, 2, b"after a pause")).await.unwrap();
    let (id, status, payload) = read_frame(&mut s).await.expect("a reply");
    assert_eq!((id, status, &payload[..]), (1, 0, &b"after a pause"[..]));

    // Part of a frame, then silence: closed.
    let f = frame(2, 2, b"0123456789");
    s.write_all(&f[..HEADER_LEN + 3]).await.unwrap();
    closed_by_server(&mut s).await;

    // The same with the header itself cut short.
    let mut s = raw_peer(&server.addr).await;
    s.write_all(&f[..5]).await.unwrap();
    closed_by_server(&mut s).await;

    // A client connection that carries on normally is unaffected.
    let conn = connect(&server.addr, Duration::ZERO).await;
    assert_eq!(&conn.call(2, &[b"ok"]).await.unwrap()[..], b"ok");
    common::eventually("the stalled connections to leave the count", || {
        server.connections() == 1
    })
    .await;
}

#[tokio::test]
async fn a_connection_that_never_finishes_its_handshake_is_closed() {
    let opts = ServeOptions {
        handshake_timeout: Duration::from_millis(200),
        ..ServeOptions::default()
    };
    let server = start(Kind::Tcp, Arc::new(Echo::default()), opts).await;
    // Nothing at all.
    let mut s = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    closed_by_server(&mut s).await;
    // Half a HELLO.
    let mut s = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    s.write_all(&common::hello_frame()[..10]).await.unwrap();
    closed_by_server(&mut s).await;
    common::eventually("the connections to leave the count", || {
        server.connections() == 0
    })
    .await;
}

#[tokio::test]
async fn serving_raises_the_open_file_limit_to_the_hard_limit() {
    let _server = start(
        Kind::Tcp,
        Arc::new(Echo::default()),
        ServeOptions::default(),
    )
    .await;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the live local.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
    assert_eq!(lim.rlim_cur, lim.rlim_max);
}

/// Echoes, to clients that prove its token.
struct Tokened(Arc<nodekernel_rpc::Token>);

impl nodekernel_rpc::Handler for Tokened {
    async fn handle(
        &self,
        _op: u16,
        payload: bytes::Bytes,
        out: &mut bytes::BytesMut,
    ) -> nodekernel_proto::Result<()> {
        out.extend_from_slice(&payload);
        Ok(())
    }

    fn handshake(&self) -> Arc<dyn nodekernel_rpc::ServerHandshake> {
        Arc::new(
            nodekernel_rpc::VersionHandshake::new(nodekernel_rpc::Role::MetaServer)
                .with_token(Some(self.0.clone())),
        )
    }
}

/// Issue 36, defect 10: on a server with a token, 5 loopback addresses x
/// 250 connections that never finish their handshake, reopened as soon as
/// they close, kept the port at its 1,024 connections and 9 of 10 clients
/// with the right token were refused. Connections in their handshake have
/// their own budget; when it is full the oldest one makes room (after a
/// grace period), and new connections wait their turn in the listen
/// queue, so every client with the token gets in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_stuck_in_their_handshake_never_lock_out_clients_with_the_token() {
    let token =
        Arc::new(nodekernel_rpc::Token::new(b"a cluster token of 32 bytes long", "t").unwrap());
    let server = start(
        Kind::Tcp,
        Arc::new(Tokened(token.clone())),
        ServeOptions::default(),
    )
    .await;
    let target: std::net::SocketAddr = server.addr.parse().unwrap();
    let opened = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut attack = Vec::new();
    for a in 1..=5u8 {
        for _ in 0..250 {
            let opened = opened.clone();
            attack.push(tokio::spawn(async move {
                loop {
                    let sock = tokio::net::TcpSocket::new_v4().unwrap();
                    sock.bind(([127, 0, 0, a], 0).into()).unwrap();
                    let Ok(mut s) = sock.connect(target).await else {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    opened.fetch_add(1, Ordering::SeqCst);
                    // Not a byte: wait for the server to close it, then
                    // come back.
                    let mut b = [0u8; 256];
                    while let Ok(n) = tokio::io::AsyncReadExt::read(&mut s, &mut b).await {
                        if n == 0 {
                            break;
                        }
                    }
                }
            }));
        }
    }
    common::eventually("every attacking socket to connect", || {
        opened.load(Ordering::SeqCst) >= 1250
    })
    .await;
    let client = nodekernel_rpc::VersionHandshake::new(nodekernel_rpc::Role::Client)
        .with_token(Some(token.clone()));
    let mut served = Vec::new();
    for i in 0..10u8 {
        let conn = Connection::connect_with_handshake(
            &server.addr,
            common::conn_opts(Duration::ZERO),
            &client,
        )
        .await
        .unwrap_or_else(|e| panic!("client {i} with the token, during the attack: {e}"));
        assert_eq!(&conn.call(2, &[&[i]]).await.unwrap()[..], &[i]);
        served.push(conn);
    }
    // They stay served while the attack goes on, which took at most its
    // share of the connections.
    for (i, conn) in served.iter().enumerate() {
        assert_eq!(
            &conn.call(2, &[b"on"]).await.unwrap()[..],
            b"on",
            "client {i}"
        );
    }
    assert!(server.evicted_handshakes() > 0, "the attack was on");
    assert!(server.connections() <= MAX_HANDSHAKES + served.len());
    for t in attack {
        t.abort();
    }
}

/// Issue 36, defect 11, on the transport: 64 connections that each send
/// all of a 16 MiB frame but its last byte and stall made a server buffer
/// 1 GiB. The bytes buffered for unfinished frames stay within the
/// server's budget; the others wait, unread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_that_stall_before_their_last_byte_stay_within_the_servers_budget() {
    let server = start(
        Kind::Tcp,
        Arc::new(Echo::default()),
        ServeOptions::default(),
    )
    .await;
    let finished = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut conns = Vec::new();
    for i in 0..64u64 {
        let (addr, finished) = (server.addr.clone(), finished.clone());
        conns.push(tokio::spawn(async move {
            static CHUNK: [u8; 1 << 20] = [7; 1 << 20];
            let mut s = raw_peer(&addr).await;
            let mut left = MAX_PAYLOAD_LEN - 1;
            let mut head = bytes::BytesMut::new();
            FrameHeader::put(&mut head, i + 1, 2, MAX_PAYLOAD_LEN);
            if s.write_all(&head).await.is_ok() {
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
        }));
    }
    // The budget, and a receive buffer of each connection.
    let bound = MAX_REQUEST_BYTES + 64 * (RECV_BUF_INITIAL + RECV_READ_MIN);
    // Sampled until nothing changed for 3 s: a pause only ends the sampling.
    let (mut last, mut quiet, mut most) = ((0, 0), 0, 0);
    while quiet < 150 {
        let held = server.recv_buffer_bytes();
        most = most.max(held);
        assert!(
            held <= bound,
            "{} MiB buffered for unfinished frames, over the bound of {} MiB",
            held >> 20,
            bound >> 20
        );
        let now = (finished.load(Ordering::SeqCst), held >> 20);
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("at most {} MiB buffered", most >> 20);
    // A small request on a fresh connection is served meanwhile.
    let conn = connect(&server.addr, Duration::ZERO).await;
    assert_eq!(&conn.call(2, &[b"small"]).await.unwrap()[..], b"small");
    for c in conns {
        c.abort();
    }
}

/// Serves op 5, an echo whose payload may have at most `LIMIT` bytes on
/// this server ([`nodekernel_rpc::Handler::max_payload`]), and op 6, a reply of as
/// many bytes as the u32 in its payload says, declared in advance
/// ([`nodekernel_rpc::Handler::reply_len`]) and sent from static memory; counts the
/// replies that are alive (built, not yet sent in full).
#[derive(Default)]
struct Sized {
    alive: Arc<std::sync::atomic::AtomicUsize>,
    most_alive: Arc<std::sync::atomic::AtomicUsize>,
}

const LIMIT: usize = 1024;
static BODY: [u8; 1 << 20] = [9; 1 << 20];

struct Body {
    len: usize,
    alive: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for Body {
    fn drop(&mut self) {
        self.alive.fetch_sub(1, Ordering::SeqCst);
    }
}

// SAFETY: the bytes are a static, readable for the whole run.
unsafe impl nodekernel_rpc::SharedBody for Body {
    fn bytes(&self) -> (*const u8, usize) {
        (BODY.as_ptr(), self.len)
    }
    fn trailer_len(&self) -> usize {
        0
    }
    fn seal(&self, _out: &mut bytes::BytesMut) {}
}

fn wanted(payload: &[u8]) -> usize {
    payload
        .get(..4)
        .map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()) as usize)
        .min(BODY.len())
}

impl nodekernel_rpc::Handler for Sized {
    async fn handle(
        &self,
        _op: u16,
        payload: bytes::Bytes,
        out: &mut bytes::BytesMut,
    ) -> nodekernel_proto::Result<()> {
        out.extend_from_slice(&payload);
        Ok(())
    }

    async fn handle_reply(
        &self,
        op: u16,
        payload: bytes::Bytes,
        reply: &mut nodekernel_rpc::Reply,
    ) -> nodekernel_proto::Result<()> {
        if op != 6 {
            return self.handle(op, payload, reply.out()).await;
        }
        let now = self.alive.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_alive.fetch_max(now, Ordering::SeqCst);
        reply.set_body(Box::new(Body {
            len: wanted(&payload),
            alive: self.alive.clone(),
        }));
        Ok(())
    }

    fn max_payload(&self, op: u16) -> usize {
        match op {
            5 => LIMIT,
            _ => MAX_PAYLOAD_LEN,
        }
    }

    fn reply_len(&self, op: u16, payload: &[u8]) -> usize {
        match op {
            6 => wanted(payload),
            _ => 0,
        }
    }
}

/// A handler's limit on a request kind's payload is checked from the
/// frame's header alone: a frame over it is refused at once, before its
/// payload is read (the server buffers nothing of it), with an error
/// naming the limit; other kinds, and frames within it, are served.
#[tokio::test]
async fn a_frame_over_its_kinds_limit_is_refused_from_its_header() {
    let server = start(
        Kind::Tcp,
        Arc::new(Sized::default()),
        ServeOptions::default(),
    )
    .await;
    let conn = connect(&server.addr, Duration::ZERO).await;
    let within = vec![1u8; LIMIT];
    assert_eq!(&conn.call(5, &[&within]).await.unwrap()[..], &within[..]);
    let other = vec![2u8; 64 << 10];
    assert_eq!(&conn.call(2, &[&other]).await.unwrap()[..], &other[..]);

    // The header of a 16 MiB frame of kind 5, and nothing more.
    let mut s = raw_peer(&server.addr).await;
    let mut head = bytes::BytesMut::new();
    FrameHeader::put(&mut head, 7, 5, MAX_PAYLOAD_LEN);
    s.write_all(&head).await.unwrap();
    let (id, status, msg) = read_frame(&mut s).await.expect("refused at once");
    let msg = String::from_utf8_lossy(&msg);
    assert_eq!((id, status), (7, ErrorCode::Protocol as u16), "{msg}");
    assert!(
        msg.contains("kind 5")
            && msg.contains(&MAX_PAYLOAD_LEN.to_string())
            && msg.contains(&LIMIT.to_string()),
        "{msg}"
    );
    closed_by_server(&mut s).await;
    // One byte over is refused too, even once all of it was sent.
    let mut s = raw_peer(&server.addr).await;
    s.write_all(&frame(8, 5, &vec![3u8; LIMIT + 1]))
        .await
        .unwrap();
    let (id, status, _) = read_frame(&mut s).await.expect("refused");
    assert_eq!((id, status), (8, ErrorCode::Protocol as u16));
    closed_by_server(&mut s).await;
    assert!(server.recv_buffer_peak() <= 4 * RECV_BUF_INITIAL);
    // The first connection was not disturbed.
    assert_eq!(&conn.call(5, &[b"still"]).await.unwrap()[..], b"still");
}

/// Issue 36, defect 12, on the transport: replies nobody reads are held
/// only up to the server's reply budget (`max_reply_bytes`), and a
/// connection whose replies wait stops having its requests read; once its
/// peer reads, every reply arrives, in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_nobody_reads_stay_within_the_reply_budget() {
    const MIB: usize = 1 << 20;
    let handler = Arc::new(Sized::default());
    let opts = ServeOptions {
        max_reply_bytes: 4 * MIB,
        max_connection_reply_bytes: 2 * MIB,
        // The peers read only after the sampling below, which on a loaded
        // machine may outlast the default 30 s a reply waits for its peer
        // to take bytes (the connection is then closed, as it should be):
        // a bound that only catches a hang.
        frame_timeout: Duration::from_secs(600),
        ..ServeOptions::default()
    };
    let server = start(Kind::Tcp, handler.clone(), opts).await;
    let size = (MIB as u32).to_le_bytes();
    let mut peers = Vec::new();
    for _ in 0..4 {
        let mut s = raw_peer(&server.addr).await;
        let mut reqs = Vec::new();
        for id in 1..=64u64 {
            reqs.extend_from_slice(&frame(id, 6, &size));
        }
        s.write_all(&reqs).await.unwrap();
        peers.push(s);
    }
    // Sampled until nothing changed for 3 s: a pause only ends the sampling.
    let (mut last, mut quiet) = ((0, 0), 0);
    while quiet < 150 {
        let (alive, reserved) = (
            handler.alive.load(Ordering::SeqCst),
            server.reserved_bytes().1,
        );
        assert!(reserved <= 4 * MIB, "{reserved} bytes reserved for replies");
        quiet = if (alive, reserved) == last {
            quiet + 1
        } else {
            0
        };
        last = (alive, reserved);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let most = handler.most_alive.load(Ordering::SeqCst);
    assert!(
        most <= 4,
        "{most} replies of 1 MiB held at once, for a budget of 4 MiB"
    );
    // A small request on another connection is served meanwhile.
    let conn = connect(&server.addr, Duration::ZERO).await;
    assert_eq!(&conn.call(2, &[b"small"]).await.unwrap()[..], b"small");
    // The peers read, all at once: all their replies come, whole. (Read
    // one after another, the test would wait on a peer whose replies have
    // no budget while two unread peers hold all of it.)
    let readers: Vec<_> = peers
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let mut ids = Vec::new();
                for _ in 0..64 {
                    let (id, status, payload) = read_frame(&mut s).await.expect("a reply");
                    assert_eq!((status, payload.len()), (0, MIB));
                    assert!(payload.iter().all(|&b| b == 9));
                    ids.push(id);
                }
                ids.sort_unstable();
                assert_eq!(ids, (1..=64).collect::<Vec<u64>>());
            })
        })
        .collect();
    for r in readers {
        r.await.expect("a peer's replies");
    }
    common::eventually("every reply to be released", || {
        handler.alive.load(Ordering::SeqCst) == 0 && server.reserved_bytes() == (0, 0)
    })
    .await;
}

/// With every slot for connections in their handshake taken, a new
/// connection waits until the oldest one has had its grace, then takes
/// its place; the others keep theirs.
#[tokio::test]
async fn the_oldest_connection_in_its_handshake_makes_room_after_its_grace() {
    let opts = ServeOptions {
        max_handshakes: 2,
        ..ServeOptions::default()
    };
    let server = start(Kind::Tcp, Arc::new(Echo::default()), opts).await;
    let mut oldest = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    common::eventually("the first to be accepted", || server.connections() == 1).await;
    let mut second = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    common::eventually("the second to be accepted", || server.connections() == 2).await;
    let conn = connect(&server.addr, Duration::ZERO).await;
    assert_eq!(&conn.call(2, &[b"in"]).await.unwrap()[..], b"in");
    closed_by_server(&mut oldest).await;
    assert_eq!(server.evicted_handshakes(), 1);
    // The second is still open: a HELLO now is answered.
    second.write_all(&common::hello_frame()).await.unwrap();
    let (id, status, _) = read_frame(&mut second).await.expect("a HELLO answer");
    assert_eq!((id, status), (0, 0));
}
