//! The handshake every connection runs before its first request.
//!
//! The client side ([`ClientHandshake`]) runs inside
//! [`Connection::connect_with_handshake`](crate::Connection::connect_with_handshake)
//! and [`ConnectionPool::with_handshake`](crate::ConnectionPool::with_handshake);
//! the server side ([`ServerHandshake`]) is taken from
//! [`Handler::handshake`](crate::Handler::handshake) and runs on every
//! accepted connection, bounded by
//! [`ServeOptions::handshake_timeout`](crate::ServeOptions::handshake_timeout).
//! Both get a [`HandshakeIo`] that sends and receives whole frames of at most
//! [`MAX_HANDSHAKE_PAYLOAD`] bytes, and may exchange as many as they need:
//! TLS ([`crate::tls`]) runs here first, then the cluster-token proof
//! ([`crate::auth`]).
//!
//! The default on both ends is [`VersionHandshake`](crate::VersionHandshake)
//! (in `hello.rs`, above this module, TLS and the token): one HELLO each way
//! ([`nodekernel_proto::hello`]), and the connection is refused unless both
//! ends speak the same wire version. A server answers a HELLO with its own
//! even when it refuses the version, so a client can always name both
//! versions in its error.
//!
//! If a server handshake fails without answering the last frame it read,
//! the transport answers that frame with the error (so an old client that
//! sends a request first gets an error reply), then closes the connection.

use crate::limits::MAX_HANDSHAKE_PAYLOAD;
use crate::transport::Stream;
use bytes::{Buf, Bytes, BytesMut};
use futures::future::BoxFuture;
use nodekernel_proto::hello::Role;
use nodekernel_proto::{Error, FrameHeader, Result, HEADER_LEN};

/// What a handshake learnt about the other end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The wire version both ends speak on this connection.
    pub version: u16,
    /// What the peer says it is.
    pub role: Role,
    /// Server end: the tenant whose token the peer proved
    /// ([`Token::with_tenant`](crate::Token::with_tenant)); `None` for a
    /// member of the cluster (or a server without a token). The transport
    /// refuses a tenant every request its handler does not open to tenants
    /// ([`Handler::tenant_may`](crate::Handler::tenant_may)) and hands the
    /// name to the rest ([`Reply::tenant`](crate::Reply::tenant)).
    pub tenant: Option<std::sync::Arc<str>>,
}

/// The client end of a connection's handshake. Object safe: configured as
/// an `Arc<dyn ClientHandshake>`.
pub trait ClientHandshake: Send + Sync + 'static {
    /// Runs the handshake on a freshly connected socket. An error fails the
    /// connect with that error. The caller bounds the whole exchange with
    /// the connect timeout, so this need not.
    fn connect<'a>(&'a self, io: &'a mut HandshakeIo) -> BoxFuture<'a, Result<PeerInfo>>;
}

/// The server end of a connection's handshake. Object safe: configured as
/// an `Arc<dyn ServerHandshake>` (see [`crate::Handler::handshake`]).
pub trait ServerHandshake: Send + Sync + 'static {
    /// Runs the handshake on a freshly accepted socket, before any request
    /// is read. An error refuses the connection: it is answered (see the
    /// module docs) and closed; the server changes no state. The caller
    /// bounds the whole exchange with the handshake timeout.
    fn accept<'a>(&'a self, io: &'a mut HandshakeIo) -> BoxFuture<'a, Result<PeerInfo>>;
}

/// One frame of a handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandshakeFrame {
    pub id: u64,
    /// The request kind, or in an answer the status (0 or an error code).
    pub kind: u16,
    pub payload: Bytes,
}

/// A connection's socket during its handshake: whole frames in and out,
/// each payload at most [`MAX_HANDSHAKE_PAYLOAD`] bytes. Bytes that arrive
/// after the last frame read are kept for the connection.
pub struct HandshakeIo {
    pub(crate) stream: Stream,
    peer: String,
    buf: BytesMut,
    /// The id of the last frame received and not yet answered.
    unanswered: Option<u64>,
    /// Whether the first bytes were checked for a TLS record (a TLS peer
    /// on a plain TCP connection).
    tls_checked: bool,
}

impl HandshakeIo {
    pub(crate) fn new(stream: Stream, peer: String) -> HandshakeIo {
        HandshakeIo {
            stream,
            peer,
            buf: BytesMut::new(),
            unanswered: None,
            tls_checked: false,
        }
    }

    /// Counts frame `id` as received and unanswered (the transport answers
    /// it if the handshake fails).
    pub(crate) fn mark_unanswered(&mut self, id: u64) {
        self.unanswered = Some(id);
    }

    /// An I/O failure of the handshake; a TLS failure (an alert from the
    /// peer says more than a closed socket) decides the error's code.
    fn failure(&self, e: std::io::Error) -> Error {
        let what = format!("handshake with {}", self.peer);
        match crate::tls_io::tls_failure(&e) {
            Some(why) => Error::new(why.code, format!("{what}: {}", why.message)),
            None => crate::sock::io_error(&what, e),
        }
    }

    /// The peer: the address connected to (client end) or the peer's
    /// address (server end).
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Sends one frame. Counts as the answer to the last frame received.
    ///
    /// Not cancel safe (a frame may be left half-written), which is fine
    /// for a handshake: an interrupted handshake drops the connection.
    pub async fn send(&mut self, id: u64, kind: u16, payload: &[u8]) -> Result<()> {
        if payload.len() > MAX_HANDSHAKE_PAYLOAD {
            return Err(Error::invalid_argument(format!(
                "handshake frame of {} bytes exceeds the limit of {MAX_HANDSHAKE_PAYLOAD}",
                payload.len()
            )));
        }
        let mut frame = BytesMut::with_capacity(HEADER_LEN + payload.len());
        FrameHeader::put(&mut frame, id, kind, payload.len());
        frame.extend_from_slice(payload);
        self.unanswered = None;
        self.write(&frame).await
    }

    async fn write(&mut self, frame: &[u8]) -> Result<()> {
        match self.stream.write_all(frame).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.failure(e)),
        }
    }

    /// Sends an error frame (status = the error's code, payload = its
    /// message) with id `id`.
    pub async fn send_error(&mut self, id: u64, err: &Error) -> Result<()> {
        let mut frame = BytesMut::new();
        crate::sock::push_error(&mut frame, id, err);
        self.unanswered = None;
        self.write(&frame).await
    }

    /// Receives one frame. A header that cannot be parsed, a payload over
    /// [`MAX_HANDSHAKE_PAYLOAD`] or the end of the stream is an error; the
    /// frame's id (when readable) still counts as unanswered.
    ///
    /// Cancel safe: bytes read are kept for the next call.
    pub async fn recv(&mut self) -> Result<HandshakeFrame> {
        loop {
            if !self.tls_checked && self.buf.len() >= 3 {
                self.tls_checked = true;
                if self.stream.is_plain_tcp() && looks_like_tls(&self.buf) {
                    // Nothing to answer: the peer could not read a frame.
                    self.unanswered = None;
                    return Err(Error::unauthenticated(format!(
                        "{} speaks TLS on this connection, but this end has no TLS configured \
                         for it ([security.tls] in docs/security.md)",
                        self.peer
                    )));
                }
            }
            if self.buf.len() >= HEADER_LEN {
                let h: [u8; HEADER_LEN] =
                    self.buf[..HEADER_LEN].try_into().expect("length checked");
                let id = u64::from_le_bytes(h[4..12].try_into().expect("8 bytes"));
                self.unanswered = Some(id);
                let header = FrameHeader::parse(&h)?;
                if header.payload_len > MAX_HANDSHAKE_PAYLOAD {
                    return Err(Error::protocol(format!(
                        "handshake frame of {} bytes exceeds the limit of {MAX_HANDSHAKE_PAYLOAD}",
                        header.payload_len
                    )));
                }
                let total = HEADER_LEN + header.payload_len;
                if self.buf.len() >= total {
                    self.buf.advance(HEADER_LEN);
                    let payload = self.buf.split_to(header.payload_len).freeze();
                    return Ok(HandshakeFrame {
                        id: header.id,
                        kind: header.kind,
                        payload,
                    });
                }
                // Bounded: at most MAX_HANDSHAKE_PAYLOAD + HEADER_LEN.
                self.buf.reserve(total - self.buf.len());
            } else {
                self.buf.reserve(4096);
            }
            let n = match self.stream.read_buf(&mut self.buf).await {
                Ok(n) => n,
                Err(e) => return Err(self.failure(e)),
            };
            if n == 0 {
                return Err(Error::unavailable(format!(
                    "{} closed the connection during the handshake",
                    self.peer
                )));
            }
        }
    }

    /// Answers the last frame received with `err` if nothing answered it
    /// yet (the server's refusal).
    pub(crate) async fn refuse(&mut self, err: &Error) {
        if let Some(id) = self.unanswered {
            let _ = self.send_error(id, err).await;
        }
    }

    /// The socket and the bytes received after the handshake's last frame.
    pub(crate) fn into_parts(self) -> (Stream, BytesMut) {
        (self.stream, self.buf)
    }
}

/// Whether `b` starts like a TLS record (content type 20–23, version 3.1
/// to 3.4): read as a frame header's length, those bytes give at least
/// 66,324, beyond every handshake frame's bound, so no HELLO starts so.
pub(crate) fn looks_like_tls(b: &[u8]) -> bool {
    b.len() >= 3 && (0x14..=0x17).contains(&b[0]) && b[1] == 3 && (1..=4).contains(&b[2])
}
