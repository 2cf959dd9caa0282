//! The cluster token on both ends of a connection ([`nodekernel_rpc::auth`]):
//! the right token is served, no token, a wrong token and a replayed
//! handshake are refused before any request is read, a server without a
//! token is not trusted by a client with one, the previous token is
//! accepted while a new one is rolled out, and Unix-socket peers of other
//! users are refused.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::{conn_opts, read_frame, start, Kind, HANG};
use nodekernel_proto::{ErrorCode, Result};
use nodekernel_rpc::testing::{as_nobody, recording_proxy};
use nodekernel_rpc::{
    Connection, ConnectionPool, Handler, Role, ServeOptions, ServerHandshake, Token,
    VersionHandshake,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const KINDS: [Kind; 2] = [Kind::Tcp, Kind::Unix];

fn token(secret: &[u8]) -> Arc<Token> {
    Arc::new(Token::new(secret, "test").unwrap())
}

fn client(t: Option<Arc<Token>>) -> VersionHandshake {
    VersionHandshake::new(Role::Client).with_token(t)
}

/// Echoes, and counts the requests it served (state a refused peer must
/// not change).
struct Secured {
    token: Option<Arc<Token>>,
    served: AtomicU64,
}

impl Secured {
    fn new(token: Option<Arc<Token>>) -> Arc<Secured> {
        Arc::new(Secured {
            token,
            served: AtomicU64::new(0),
        })
    }
}

impl Handler for Secured {
    async fn handle(&self, _op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        self.served.fetch_add(1, Ordering::SeqCst);
        out.extend_from_slice(&payload);
        Ok(())
    }

    fn handshake(&self) -> Arc<dyn ServerHandshake> {
        Arc::new(VersionHandshake::new(Role::MetaServer).with_token(self.token.clone()))
    }
}

async fn connect_with(addr: &str, hs: &VersionHandshake) -> Result<Connection> {
    Connection::connect_with_handshake(addr, conn_opts(Duration::ZERO), hs).await
}

#[tokio::test]
async fn the_right_token_is_served_and_no_or_a_wrong_token_is_refused_before_any_request() {
    let secret = b"a cluster token of 32 bytes long";
    for kind in KINDS {
        let h = Secured::new(Some(token(secret)));
        let server = start(kind, h.clone(), ServeOptions::default()).await;

        let conn = connect_with(&server.addr, &client(Some(token(secret))))
            .await
            .unwrap();
        assert_eq!(conn.peer_info().role, Role::MetaServer);
        assert_eq!(&conn.call(2, &[b"in"]).await.unwrap()[..], b"in");
        assert_eq!(h.served.load(Ordering::SeqCst), 1);

        let e = connect_with(&server.addr, &client(None))
            .await
            .err()
            .unwrap();
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
        assert!(e.message.contains("requires the cluster token"), "{e}");

        let wrong = token(b"another token of the same length");
        let e = connect_with(&server.addr, &client(Some(wrong)))
            .await
            .err()
            .unwrap();
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
        assert!(e.message.contains("wrong cluster token"), "{e}");

        // A pool surfaces the same refusal on its calls.
        let pool =
            ConnectionPool::with_handshake(conn_opts(Duration::ZERO), Arc::new(client(None)));
        let e = pool.call(&server.addr, 2, &[b"x"]).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");

        // None of the refused peers got a request served.
        assert_eq!(h.served.load(Ordering::SeqCst), 1);
        assert!(
            server.handle.refused_connections() == 0,
            "refusals are not limit refusals"
        );
    }
}

#[tokio::test]
async fn a_client_with_a_token_does_not_trust_a_server_without_one() {
    for kind in KINDS {
        let server = start(kind, Secured::new(None), ServeOptions::default()).await;
        let e = connect_with(&server.addr, &client(Some(token(&[5; 32]))))
            .await
            .err()
            .unwrap();
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
        assert!(e.message.contains("does not authenticate"), "{e}");
        // Without tokens on either end nothing changes.
        connect_with(&server.addr, &client(None)).await.unwrap();
    }
}

#[tokio::test]
async fn the_previous_token_is_accepted_while_a_new_one_rolls_out() {
    let (old, new) = ([1u8; 32], [2u8; 32]);
    let rotating = Arc::new(
        Token::new(&new, "new")
            .unwrap()
            .accepting(&old, "old")
            .unwrap(),
    );
    let server = start(
        Kind::Tcp,
        Secured::new(Some(rotating)),
        ServeOptions::default(),
    )
    .await;
    for t in [old, new] {
        let conn = connect_with(&server.addr, &client(Some(token(&t))))
            .await
            .unwrap();
        assert_eq!(&conn.call(2, &[b"ok"]).await.unwrap()[..], b"ok");
    }
    let e = connect_with(&server.addr, &client(Some(token(&[3; 32]))))
        .await
        .err()
        .unwrap();
    assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
}

#[tokio::test]
async fn a_replayed_handshake_is_refused() {
    let secret = [7u8; 32];
    let h = Secured::new(Some(token(&secret)));
    let server = start(Kind::Tcp, h.clone(), ServeOptions::default()).await;
    // A genuine client's handshake, recorded on the way.
    let (proxy, recorded) = recording_proxy(server.addr.clone()).await;
    let conn = connect_with(&proxy, &client(Some(token(&secret))))
        .await
        .unwrap();
    drop(conn);
    let sent = tokio::time::timeout(HANG, recorded).await.unwrap();
    assert!(!sent.is_empty());

    // The same bytes on a new connection: the server's fresh nonce makes
    // the recorded proof worthless.
    let mut s = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    s.write_all(&sent).await.unwrap();
    let (id, status, _hello) = read_frame(&mut s).await.expect("the server's HELLO");
    assert_eq!((id, status), (0, 0));
    let (_, status, msg) = read_frame(&mut s).await.expect("the refusal");
    assert_eq!(status, ErrorCode::Unauthenticated as u16);
    assert!(String::from_utf8_lossy(&msg).contains("wrong cluster token"));
    assert!(read_frame(&mut s).await.is_none(), "then the server closes");
    assert_eq!(h.served.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn unix_socket_peers_of_another_user_are_refused_before_their_hello() {
    let h = Secured::new(None);
    let server = start(Kind::Unix, h.clone(), ServeOptions::default()).await;
    let name = server.addr.strip_prefix("unix:@").unwrap().to_string();
    let answer = as_nobody(move || {
        use std::io::Read;
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let mut s = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
        s.set_read_timeout(Some(HANG)).unwrap();
        let mut all = Vec::new();
        let _ = s.read_to_end(&mut all);
        all
    })
    .await;
    let Some(answer) = answer else { return };
    let msg = String::from_utf8_lossy(&answer);
    assert!(msg.contains("runs as user 65534"), "{msg}");
    // Status: the error code, at bytes 12..14 of the frame header.
    assert_eq!(
        u16::from_le_bytes([answer[12], answer[13]]),
        ErrorCode::Unauthenticated as u16
    );
    // The owner's connections (root here) are served, and so is a group
    // the server names.
    let conn = connect_with(&server.addr, &client(None)).await.unwrap();
    assert_eq!(&conn.call(2, &[b"ok"]).await.unwrap()[..], b"ok");
    assert_eq!(h.served.load(Ordering::SeqCst), 1);

    let opts = ServeOptions {
        local_peers: nodekernel_rpc::LocalPeers::owner().with_group(Some(65534)),
        ..ServeOptions::default()
    };
    let grouped = start(Kind::Unix, Secured::new(None), opts).await;
    let name = grouped.addr.strip_prefix("unix:@").unwrap().to_string();
    let answer = as_nobody(move || {
        use std::io::{Read, Write};
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let mut s = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
        s.set_read_timeout(Some(HANG)).unwrap();
        s.write_all(&common::hello_frame()).unwrap();
        let mut header = [0u8; 14];
        s.read_exact(&mut header).unwrap();
        header
    })
    .await
    .unwrap();
    assert_eq!(
        u16::from_le_bytes([answer[12], answer[13]]),
        0,
        "the group is served"
    );
}
