//! The handshake every connection runs before its first request: the HELLO
//! exchange and its wire-version check, what a server does with a first
//! frame that is not a HELLO, and custom handshakes plugged in on both ends.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::{closed_by_server, conn_opts, connect, frame, read_frame, start, Echo, Kind, HANG};
use futures::future::BoxFuture;
use nodekernel_proto::frame::STATUS_OK;
use nodekernel_proto::hello::{Hello, HELLO_ID, HELLO_KIND};
use nodekernel_proto::{Error, ErrorCode, Result};
use nodekernel_rpc::{
    ClientHandshake, Connection, ConnectionPool, Handler, HandshakeIo, PeerInfo, Role,
    ServeOptions, ServerHandshake, VersionHandshake, WIRE_VERSION,
};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

const KINDS: [Kind; 2] = [Kind::Tcp, Kind::Unix];

fn names_both_versions(e: &Error, ours: u16, theirs: u16) {
    assert_eq!(e.code, ErrorCode::VersionMismatch, "{e}");
    for v in [ours, theirs] {
        assert!(
            e.message.contains(&format!("version {v}")),
            "the error names version {v}: {e}"
        );
    }
}

#[tokio::test]
async fn a_client_of_another_wire_version_fails_at_connect_naming_both_versions() {
    let other = WIRE_VERSION + 1;
    for kind in KINDS {
        let server = start(kind, Arc::new(Echo::default()), ServeOptions::default()).await;
        let e = Connection::connect_with_handshake(
            &server.addr,
            conn_opts(Duration::ZERO),
            &VersionHandshake::speaking(Role::Client, other),
        )
        .await
        .err()
        .expect("a client of another version is refused");
        names_both_versions(&e, WIRE_VERSION, other);
        assert!(e.message.contains(&server.addr), "{e}");

        // The same through a pool.
        let pool = ConnectionPool::with_handshake(
            conn_opts(Duration::ZERO),
            Arc::new(VersionHandshake::speaking(Role::Client, other)),
        );
        let e = pool.call(&server.addr, 2, &[b"x"]).await.unwrap_err();
        names_both_versions(&e, WIRE_VERSION, other);

        // The server is unaffected: a client of its version is served.
        let conn = connect(&server.addr, Duration::ZERO).await;
        assert_eq!(
            conn.peer_info(),
            &PeerInfo {
                version: WIRE_VERSION,
                role: Role::Unspecified,
                tenant: None,
            }
        );
        assert_eq!(
            &conn.call(2, &[b"same version"]).await.unwrap()[..],
            b"same version"
        );
        common::eventually("the refused connections to close", || {
            server.connections() == 1
        })
        .await;
    }
}

/// [`Echo`] on a server that speaks another wire version, as a metadata
/// server.
struct OtherVersion(u16);

impl Handler for OtherVersion {
    async fn handle(&self, _op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        out.extend_from_slice(&payload);
        Ok(())
    }

    fn handshake(&self) -> Arc<dyn ServerHandshake> {
        Arc::new(VersionHandshake::speaking(Role::MetaServer, self.0))
    }
}

#[tokio::test]
async fn a_server_of_another_wire_version_refuses_clients_naming_both_versions() {
    let other = WIRE_VERSION + 7;
    for kind in KINDS {
        let server = start(kind, Arc::new(OtherVersion(other)), ServeOptions::default()).await;
        let e = Connection::connect(&server.addr, HANG)
            .await
            .err()
            .expect("a server of another version is refused");
        names_both_versions(&e, WIRE_VERSION, other);
        // A client of the server's version is served, and learns its role.
        let conn = Connection::connect_with_handshake(
            &server.addr,
            conn_opts(Duration::ZERO),
            &VersionHandshake::speaking(Role::Client, other),
        )
        .await
        .unwrap();
        assert_eq!(conn.peer_info().role, Role::MetaServer);
        assert_eq!(&conn.call(2, &[b"ok"]).await.unwrap()[..], b"ok");
    }
}

#[tokio::test]
async fn a_first_frame_that_is_not_a_hello_is_answered_and_the_connection_closed() {
    let server = start(
        Kind::Tcp,
        Arc::new(Echo::default()),
        ServeOptions::default(),
    )
    .await;

    // A request first (what a client from before the handshake sends): an
    // error reply to that request, then the end of the connection.
    let mut s = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    s.write_all(&frame(5, 2, b"abc")).await.unwrap();
    let (id, status, msg) = read_frame(&mut s).await.expect("an error reply");
    let msg = String::from_utf8_lossy(&msg).into_owned();
    assert_eq!((id, status), (5, ErrorCode::Protocol as u16), "{msg}");
    assert!(msg.contains("HELLO"), "{msg}");
    assert!(msg.contains(&format!("version {WIRE_VERSION}")), "{msg}");
    closed_by_server(&mut s).await;

    // A HELLO kind with a payload that is not a HELLO.
    let mut s = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    s.write_all(&frame(HELLO_ID, HELLO_KIND, b"NOT A HELLO"))
        .await
        .unwrap();
    let (_, status, _) = read_frame(&mut s).await.expect("an error reply");
    assert_eq!(status, ErrorCode::Protocol as u16);
    closed_by_server(&mut s).await;

    // Bytes that are not even a frame.
    let mut s = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    s.write_all(&[0xFF; 64]).await.unwrap();
    closed_by_server(&mut s).await;

    assert_eq!(server.malformed_frames(), 3);
    // Nothing was handled, and the server still serves.
    let conn = connect(&server.addr, Duration::ZERO).await;
    assert_eq!(&conn.call(2, &[b"fine"]).await.unwrap()[..], b"fine");
}

#[tokio::test]
async fn the_hello_exchange_on_the_wire() {
    // Done by hand, to pin the format down: a HELLO frame (id 0, kind
    // 0xFFFF), answered with status 0 and the server's HELLO; then requests
    // flow as before, on the same connection.
    let server = start(
        Kind::Tcp,
        Arc::new(Echo::default()),
        ServeOptions::default(),
    )
    .await;
    let mut s = tokio::net::TcpStream::connect(&server.addr).await.unwrap();
    let mut hello = frame(0, 0xFFFF, b"NKWIRE\x10\x00\x01\x00\x00\x00\x00");
    // The first request right behind the HELLO, in the same write.
    hello.extend_from_slice(&frame(9, 2, b"hi"));
    assert_eq!(WIRE_VERSION, 16, "update the bytes above with the version");
    s.write_all(&hello).await.unwrap();
    let (id, status, payload) = read_frame(&mut s).await.expect("the answer");
    assert_eq!((id, status), (HELLO_ID, STATUS_OK));
    assert_eq!(&payload[..], b"NKWIRE\x10\x00\x00\x00\x00\x00\x00");
    let (id, status, payload) = read_frame(&mut s).await.expect("the reply");
    assert_eq!((id, status, &payload[..]), (9, STATUS_OK, &b"hi"[..]));
}

/// A custom handshake on both ends: the version check plus a shared token
/// carried in the HELLO's extension (the shape authentication will take).
struct Token(&'static [u8]);

impl ClientHandshake for Token {
    fn connect<'a>(&'a self, io: &'a mut HandshakeIo) -> BoxFuture<'a, Result<PeerInfo>> {
        Box::pin(async move {
            let mut p = BytesMut::new();
            Hello {
                ext: self.0.to_vec(),
                ..Hello::new(Role::Client)
            }
            .encode(&mut p)?;
            io.send(HELLO_ID, HELLO_KIND, &p).await?;
            let answer = io.recv().await?;
            if answer.kind != STATUS_OK {
                return Err(Error::from_wire(answer.kind, &answer.payload));
            }
            let theirs = Hello::decode(&answer.payload)?;
            Ok(PeerInfo {
                version: theirs.version,
                role: theirs.role,
                tenant: None,
            })
        })
    }
}

impl ServerHandshake for Token {
    fn accept<'a>(&'a self, io: &'a mut HandshakeIo) -> BoxFuture<'a, Result<PeerInfo>> {
        Box::pin(async move {
            let first = io.recv().await?;
            let theirs = Hello::decode(&first.payload)?;
            if theirs.ext != self.0 {
                // Not answered here: the transport answers with the error.
                return Err(Error::invalid_argument("wrong cluster token"));
            }
            let mut p = BytesMut::new();
            Hello::new(Role::StorageServer).encode(&mut p)?;
            io.send(HELLO_ID, STATUS_OK, &p).await?;
            Ok(PeerInfo {
                version: theirs.version,
                role: theirs.role,
                tenant: None,
            })
        })
    }
}

struct Guarded;

impl Handler for Guarded {
    async fn handle(&self, _op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        out.extend_from_slice(&payload);
        Ok(())
    }

    fn handshake(&self) -> Arc<dyn ServerHandshake> {
        Arc::new(Token(b"secret"))
    }
}

#[tokio::test]
async fn custom_handshakes_plug_in_on_both_ends() {
    for kind in KINDS {
        let server = start(kind, Arc::new(Guarded), ServeOptions::default()).await;
        let opts = conn_opts(Duration::ZERO);
        let conn = Connection::connect_with_handshake(&server.addr, opts, &Token(b"secret"))
            .await
            .unwrap();
        assert_eq!(conn.peer_info().role, Role::StorageServer);
        assert_eq!(&conn.call(2, &[b"in"]).await.unwrap()[..], b"in");

        let e = Connection::connect_with_handshake(&server.addr, opts, &Token(b"guess"))
            .await
            .err()
            .expect("a wrong token is refused");
        assert_eq!(
            (e.code, e.message.as_str()),
            (ErrorCode::InvalidArgument, "wrong cluster token")
        );
        // A default client carries no token: refused too, with the reason.
        let e = Connection::connect(&server.addr, HANG).await.err().unwrap();
        assert!(e.message.contains("wrong cluster token"), "{e}");
        // The connection that got in is unaffected.
        assert_eq!(&conn.call(2, &[b"still"]).await.unwrap()[..], b"still");
    }
}
