//! The server's resource bounds: open connections, requests in flight,
//! memory for a frame announced but not sent, and time for a frame or a
//! handshake that stalls. Every check waits for an event (with a bound that
//! only catches hangs), never for a time to pass.

mod common;

use common::{closed_by_server, connect, frame, raw_peer, read_frame, start, Echo, Kind, HANG};
use nodekernel_proto::{ErrorCode, FrameHeader, HEADER_LEN, MAX_PAYLOAD_LEN};
use nodekernel_rpc::limits::RECV_BUF_INITIAL;
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
