//! The transport on its own: many requests in flight on one connection,
//! replies matched by id even when they complete out of order, large
//! payloads, and the same behaviour with and without busy-polling, over
//! TCP and over Unix sockets (abstract and path-bound).

use crate::common;

use common::Echo;
use nodekernel_proto::ErrorCode;
use nodekernel_rpc::{
    abstract_unix_addr, bind_abstract_unix, bind_unix, serve_unix, serve_with, ConnOptions,
    Connection, ServeOptions, ServerHandle,
};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
enum Kind {
    Tcp,
    AbstractUnix,
    PathUnix,
}

const KINDS: [Kind; 3] = [Kind::Tcp, Kind::AbstractUnix, Kind::PathUnix];

/// Keeps the directory of a path-bound socket alive with its server.
struct Server {
    handle: ServerHandle,
    addr: String,
    _dir: Option<tempfile::TempDir>,
}

impl std::ops::Deref for Server {
    type Target = ServerHandle;
    fn deref(&self) -> &ServerHandle {
        &self.handle
    }
}

async fn pair(spin: Duration, kind: Kind) -> (Server, Connection) {
    let opts = ServeOptions {
        spin,
        ..ServeOptions::default()
    };
    let (handle, addr, dir) = match kind {
        Kind::Tcp => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let h = serve_with(listener, Arc::new(Echo::default()), opts).unwrap();
            let addr = h.local_addr().to_string();
            (h, addr, None)
        }
        Kind::AbstractUnix => {
            let (name, listener) = bind_abstract_unix("nk-rpc-test-").unwrap();
            let h = serve_unix(listener, Arc::new(Echo::default()), opts).unwrap();
            (h, abstract_unix_addr(&name), None)
        }
        Kind::PathUnix => {
            let dir = tempfile::tempdir().unwrap();
            let addr = format!("unix:{}", dir.path().join("s.sock").display());
            let h = serve_unix(bind_unix(&addr).unwrap(), Arc::new(Echo::default()), opts).unwrap();
            (h, addr, Some(dir))
        }
    };
    let conn = Connection::connect_with(
        &addr,
        ConnOptions {
            // Only catches a hang: no test here waits for the timeout.
            timeout: Duration::from_secs(120),
            spin,
        },
    )
    .await
    .unwrap();
    let server = Server {
        handle,
        addr,
        _dir: dir,
    };
    (server, conn)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_complete_out_of_order_and_match_their_requests() {
    for (spin, kind) in spins_and_kinds() {
        let (_server, conn) = pair(spin, kind).await;
        let conn = Arc::new(conn);
        // A request that completes only when the test says so.
        let slow = {
            let c = conn.clone();
            tokio::spawn(async move { c.call(4, &[&[200u8, 1, 2, 3]]).await.unwrap() })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The fast request sent after the slow one is not stuck behind it:
        // it completes while the slow one still waits.
        let fast = tokio::time::timeout(Duration::from_secs(120), conn.call(2, &[b"fast"]))
            .await
            .expect("the fast call is stuck behind the slow one")
            .unwrap();
        assert_eq!(&fast[..], b"fast");
        assert!(
            !slow.is_finished(),
            "{kind:?}, spin {spin:?}: the slow call finished first"
        );
        common::GATE.notify_one();
        let slow_reply = slow.await.unwrap();
        assert_eq!(&slow_reply[..], &[200u8, 1, 2, 3]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_bursts_large_payloads_and_errors() {
    for (spin, kind) in spins_and_kinds() {
        let (_server, conn) = pair(spin, kind).await;
        let conn = Arc::new(conn);
        let mut tasks = Vec::new();
        for i in 0..500u32 {
            let c = conn.clone();
            tasks.push(tokio::spawn(async move {
                let body = i.to_le_bytes();
                let r = c.call(2, &[b"n=", &body]).await.unwrap();
                assert_eq!(&r[2..], &body, "reply {i} matched to its request");
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        // 1 MiB payload split over several slices (one vectored write).
        let a = vec![7u8; 700_000];
        let b = vec![9u8; 348_576];
        let r = conn.call(2, &[&a, &[], &b]).await.unwrap();
        assert_eq!(r.len(), 1 << 20);
        assert!(r[..700_000].iter().all(|x| *x == 7) && r[700_000..].iter().all(|x| *x == 9));
        let e = conn.call(3, &[&[0u8; 10]]).await.unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (ErrorCode::NotFound, "10 bytes")
        );
        assert_eq!(
            &conn.call(2, &[b"still ok"]).await.unwrap()[..],
            b"still ok"
        );
    }
}

#[tokio::test]
async fn a_server_that_goes_away_fails_pending_calls_quickly() {
    for kind in KINDS {
        let (server, conn) = pair(Duration::from_micros(50), kind).await;
        let conn = Arc::new(conn);
        let c = conn.clone();
        let pending = tokio::spawn(async move { c.call(1, &[&[250u8]]).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        server.shutdown();
        let e = pending.await.unwrap().unwrap_err();
        // Unavailable, not Timeout: failed at once, not at the timeout.
        assert_eq!(e.code, ErrorCode::Unavailable, "{kind:?}: {e}");
        assert!(conn.is_closed());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_busy_connections_at_once() {
    // A connection that is busy-polling must not serve one more request
    // after shutdown returns.
    for kind in KINDS {
        for _ in 0..10 {
            let (server, conn) = pair(Duration::from_millis(5), kind).await;
            assert_eq!(&conn.call(2, &[b"x"]).await.unwrap()[..], b"x");
            server.shutdown();
            let r = conn.call(2, &[b"y"]).await;
            assert!(r.is_err(), "{kind:?}: served a request after shutdown");
            // Nothing listens any more: a new connection is refused.
            assert!(
                Connection::connect(&server.addr, Duration::from_secs(1))
                    .await
                    .is_err(),
                "{kind:?}: connected after shutdown"
            );
        }
    }
}

#[tokio::test]
async fn a_unix_address_nobody_listens_on_is_unavailable() {
    // A fresh name, whose listener is gone again.
    let (name, listener) = bind_abstract_unix("nk-rpc-nobody-").unwrap();
    drop(listener);
    let addr = abstract_unix_addr(&name);
    let e = Connection::connect(&addr, Duration::from_secs(1))
        .await
        .err()
        .expect("nobody listens");
    assert_eq!(e.code, ErrorCode::Unavailable, "{e}");
    assert!(e.message.contains(&addr), "{e}");
    let e = bind_unix("not-a-unix-address").unwrap_err();
    assert!(e.to_string().contains("not a Unix-socket address"), "{e}");
}

/// A malformed address is the caller's mistake, `InvalidArgument` naming
/// it (a client never waits for it to start listening), unlike a
/// well-formed one where nobody listens (`Unavailable`, above).
#[tokio::test]
async fn a_malformed_address_is_an_invalid_argument() {
    let long_path = format!("unix:/{}", "p".repeat(200));
    for addr in [
        "not-an-address",
        "127.0.0.1:port",
        "127.0.0.1:99999",
        &long_path,
    ] {
        let e = Connection::connect(addr, Duration::from_secs(60))
            .await
            .err()
            .expect("no such address");
        assert_eq!(e.code, ErrorCode::InvalidArgument, "{addr}: {e}");
        assert!(e.message.contains(addr), "{e}");
    }
}

fn spins_and_kinds() -> Vec<(Duration, Kind)> {
    let mut v = Vec::new();
    for spin in [Duration::ZERO, Duration::from_micros(50)] {
        for kind in KINDS {
            v.push((spin, kind));
        }
    }
    v
}
