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
//! this is where authentication (a challenge and response over a cluster
//! token) and TLS will plug in.
//!
//! The default on both ends is [`VersionHandshake`]: one HELLO each way
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
use nodekernel_proto::frame::STATUS_OK;
use nodekernel_proto::hello::{Hello, Role, HELLO_ID, HELLO_KIND, WIRE_VERSION};
use nodekernel_proto::{Error, ErrorCode, FrameHeader, Result, HEADER_LEN};

/// What a handshake learnt about the other end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// The wire version both ends speak on this connection.
    pub version: u16,
    /// What the peer says it is.
    pub role: Role,
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
    stream: Stream,
    peer: String,
    buf: BytesMut,
    /// The id of the last frame received and not yet answered.
    unanswered: Option<u64>,
}

impl HandshakeIo {
    pub(crate) fn new(stream: Stream, peer: String) -> HandshakeIo {
        HandshakeIo {
            stream,
            peer,
            buf: BytesMut::new(),
            unanswered: None,
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
        self.stream
            .write_all(&frame)
            .await
            .map_err(|e| crate::io_error(&format!("handshake with {}", self.peer), e))
    }

    /// Sends an error frame (status = the error's code, payload = its
    /// message) with id `id`.
    pub async fn send_error(&mut self, id: u64, err: &Error) -> Result<()> {
        let mut frame = BytesMut::new();
        crate::server::push_error(&mut frame, id, err);
        self.unanswered = None;
        self.stream
            .write_all(&frame)
            .await
            .map_err(|e| crate::io_error(&format!("handshake with {}", self.peer), e))
    }

    /// Receives one frame. A header that cannot be parsed, a payload over
    /// [`MAX_HANDSHAKE_PAYLOAD`] or the end of the stream is an error; the
    /// frame's id (when readable) still counts as unanswered.
    ///
    /// Cancel safe: bytes read are kept for the next call.
    pub async fn recv(&mut self) -> Result<HandshakeFrame> {
        loop {
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
            let n = self
                .stream
                .read_buf(&mut self.buf)
                .await
                .map_err(|e| crate::io_error(&format!("handshake with {}", self.peer), e))?;
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

/// The default handshake on both ends: one HELLO each way and the same wire
/// version required of both.
#[derive(Debug, Clone)]
pub struct VersionHandshake {
    role: Role,
    version: u16,
}

impl VersionHandshake {
    /// Speaks this build's [`WIRE_VERSION`] and introduces itself as `role`.
    pub fn new(role: Role) -> VersionHandshake {
        VersionHandshake {
            role,
            version: WIRE_VERSION,
        }
    }

    /// Speaks `version` instead of [`WIRE_VERSION`] (to test how other
    /// versions are treated).
    #[doc(hidden)]
    pub fn speaking(role: Role, version: u16) -> VersionHandshake {
        VersionHandshake { role, version }
    }

    fn hello(&self) -> Result<BytesMut> {
        let mut b = BytesMut::new();
        Hello {
            version: self.version,
            role: self.role,
            ext: Vec::new(),
        }
        .encode(&mut b)?;
        Ok(b)
    }

    async fn client(&self, io: &mut HandshakeIo) -> Result<PeerInfo> {
        io.send(HELLO_ID, HELLO_KIND, &self.hello()?).await?;
        let answer = io.recv().await?;
        let peer = io.peer().to_string();
        if answer.id != HELLO_ID {
            return Err(Error::protocol(format!(
                "the server at {peer} answered the HELLO with id {}",
                answer.id
            )));
        }
        if answer.kind != STATUS_OK {
            let e = Error::from_wire(answer.kind, &answer.payload);
            if e.code == ErrorCode::Protocol {
                // A server from before the handshake treats a HELLO as an
                // unknown request.
                return Err(Error::version_mismatch(format!(
                    "wire version mismatch: this client speaks NodeKernel wire version {}, \
                     the server at {peer} does not understand the version handshake \
                     (it is older than wire version 1?): {}",
                    self.version, e.message
                )));
            }
            return Err(Error::new(
                e.code,
                format!("the server at {peer} refused the connection: {}", e.message),
            ));
        }
        let theirs = Hello::decode(&answer.payload).map_err(|e| {
            Error::protocol(format!(
                "the server at {peer} answered the HELLO with: {}",
                e.message
            ))
        })?;
        if theirs.version != self.version {
            return Err(Error::version_mismatch(format!(
                "wire version mismatch: this client speaks NodeKernel wire version {}, \
                 the server at {peer} speaks version {}",
                self.version, theirs.version
            )));
        }
        Ok(PeerInfo {
            version: theirs.version,
            role: theirs.role,
        })
    }

    async fn server(&self, io: &mut HandshakeIo) -> Result<PeerInfo> {
        let first = io.recv().await?;
        if first.kind != HELLO_KIND || first.id != HELLO_ID {
            return Err(Error::protocol(format!(
                "the first frame of a connection must be a HELLO (kind {HELLO_KIND:#x}, id \
                 {HELLO_ID}), not kind {} with id {}: this server speaks NodeKernel wire \
                 version {} and expects the version handshake first",
                first.kind, first.id, self.version
            )));
        }
        let theirs = Hello::decode(&first.payload)?;
        // Answered with our version even when it differs: the client then
        // names both versions in its own error.
        io.send(HELLO_ID, STATUS_OK, &self.hello()?).await?;
        if theirs.version != self.version {
            tracing::warn!(
                "refused a connection from {} ({}): it speaks NodeKernel wire version {}, \
                 this server speaks version {}",
                io.peer(),
                theirs.role,
                theirs.version,
                self.version
            );
            return Err(Error::version_mismatch(format!(
                "wire version mismatch: the {} at {} speaks NodeKernel wire version {}, \
                 this server speaks version {}",
                theirs.role,
                io.peer(),
                theirs.version,
                self.version
            )));
        }
        Ok(PeerInfo {
            version: theirs.version,
            role: theirs.role,
        })
    }
}

impl ClientHandshake for VersionHandshake {
    fn connect<'a>(&'a self, io: &'a mut HandshakeIo) -> BoxFuture<'a, Result<PeerInfo>> {
        Box::pin(self.client(io))
    }
}

impl ServerHandshake for VersionHandshake {
    fn accept<'a>(&'a self, io: &'a mut HandshakeIo) -> BoxFuture<'a, Result<PeerInfo>> {
        Box::pin(self.server(io))
    }
}
