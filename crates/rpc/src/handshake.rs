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
//! The default on both ends is [`VersionHandshake`]: one HELLO each way
//! ([`nodekernel_proto::hello`]), and the connection is refused unless both
//! ends speak the same wire version. A server answers a HELLO with its own
//! even when it refuses the version, so a client can always name both
//! versions in its error.
//!
//! If a server handshake fails without answering the last frame it read,
//! the transport answers that frame with the error (so an old client that
//! sends a request first gets an error reply), then closes the connection.

use crate::auth::Token;
use crate::limits::MAX_HANDSHAKE_PAYLOAD;
use crate::tls::Tls;
use crate::transport::Stream;
use bytes::{Buf, Bytes, BytesMut};
use futures::future::BoxFuture;
use nodekernel_proto::frame::STATUS_OK;
use nodekernel_proto::hello::{
    Hello, Role, AUTH_KIND, HELLO_ID, HELLO_KIND, NONCE_LEN, WIRE_VERSION,
};
use nodekernel_proto::{Error, ErrorCode, FrameHeader, Result, HEADER_LEN};
use std::sync::{Arc, OnceLock};

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
    pub(crate) stream: Stream,
    peer: String,
    buf: BytesMut,
    /// The id of the last frame received and not yet answered.
    unanswered: Option<u64>,
    /// Whether the first bytes were checked for a TLS record (a TLS peer
    /// on a plain TCP connection).
    tls_checked: bool,
    /// Why the TLS relay of this connection ended, once it has.
    pub(crate) relay_error: Option<Arc<OnceLock<Error>>>,
}

impl HandshakeIo {
    pub(crate) fn new(stream: Stream, peer: String) -> HandshakeIo {
        HandshakeIo {
            stream,
            peer,
            buf: BytesMut::new(),
            unanswered: None,
            tls_checked: false,
            relay_error: None,
        }
    }

    /// Counts frame `id` as received and unanswered (the transport answers
    /// it if the handshake fails).
    pub(crate) fn mark_unanswered(&mut self, id: u64) {
        self.unanswered = Some(id);
    }

    /// An I/O failure of the handshake, with why the TLS relay ended if it
    /// did (a TLS alert from the peer says more than a closed socket, and
    /// decides the error's code).
    fn failure(&self, e: Error) -> Error {
        match self.relay_error.as_ref().and_then(|r| r.get()) {
            Some(why) => Error::new(why.code, format!("{}: {}", e.message, why.message)),
            None => e,
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
            Err(e) => {
                Err(self.failure(crate::io_error(&format!("handshake with {}", self.peer), e)))
            }
        }
    }

    /// Sends an error frame (status = the error's code, payload = its
    /// message) with id `id`.
    pub async fn send_error(&mut self, id: u64, err: &Error) -> Result<()> {
        let mut frame = BytesMut::new();
        crate::server::push_error(&mut frame, id, err);
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
                if matches!(self.stream, Stream::Tcp(_)) && crate::tls::looks_like_tls(&self.buf) {
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
                Err(e) => {
                    let e = crate::io_error(&format!("handshake with {}", self.peer), e);
                    return Err(self.failure(e));
                }
            };
            if n == 0 {
                return Err(self.failure(Error::unavailable(format!(
                    "{} closed the connection during the handshake",
                    self.peer
                ))));
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
/// version required of both; with a cluster [`Token`], each end also
/// proves the token to the other ([`crate::auth`]).
#[derive(Debug, Clone)]
pub struct VersionHandshake {
    role: Role,
    version: u16,
    token: Option<Arc<Token>>,
    tls: Option<Arc<Tls>>,
}

impl VersionHandshake {
    /// Speaks this build's [`WIRE_VERSION`] and introduces itself as `role`.
    pub fn new(role: Role) -> VersionHandshake {
        VersionHandshake {
            role,
            version: WIRE_VERSION,
            token: None,
            tls: None,
        }
    }

    /// Speaks `version` instead of [`WIRE_VERSION`] (to test how other
    /// versions are treated).
    #[doc(hidden)]
    pub fn speaking(role: Role, version: u16) -> VersionHandshake {
        VersionHandshake {
            version,
            ..VersionHandshake::new(role)
        }
    }

    /// This handshake proving `token` (and requiring the peer to prove it);
    /// `None` leaves it without one.
    pub fn with_token(mut self, token: Option<Arc<Token>>) -> VersionHandshake {
        self.token = token;
        self
    }

    /// This handshake starting TLS on TCP connections first (see
    /// [`crate::tls`]); `None` leaves them plain.
    pub fn with_tls(mut self, tls: Option<Arc<Tls>>) -> VersionHandshake {
        self.tls = tls;
        self
    }

    fn hello(&self, nonce: Option<[u8; NONCE_LEN]>) -> Result<BytesMut> {
        let mut hello = Hello {
            version: self.version,
            role: self.role,
            ext: Vec::new(),
        };
        if let Some(n) = nonce {
            hello = hello.with_nonce(n);
        }
        let mut b = BytesMut::new();
        hello.encode(&mut b)?;
        Ok(b)
    }

    async fn client(&self, io: &mut HandshakeIo) -> Result<PeerInfo> {
        if let Some(tls) = &self.tls {
            io.start_tls_client(tls).await?;
        }
        let ours = self.token.as_ref().map(|_| Token::nonce()).transpose()?;
        io.send(HELLO_ID, HELLO_KIND, &self.hello(ours)?).await?;
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
            return Err(refused(&peer, e));
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
        let info = PeerInfo {
            version: theirs.version,
            role: theirs.role,
        };
        let (Some(token), Some(ours)) = (&self.token, ours) else {
            return Ok(info);
        };
        let Some(nonce) = theirs.nonce()? else {
            return Err(Error::unauthenticated(format!(
                "the {} at {peer} does not authenticate connections (it has no cluster token \
                 configured) but this end has one, so it cannot tell the server belongs to \
                 the cluster: configure the same [security] token there",
                theirs.role
            )));
        };
        io.send(HELLO_ID, AUTH_KIND, &token.client_proof(&nonce, &ours))
            .await?;
        let answer = io.recv().await?;
        if answer.kind != STATUS_OK {
            return Err(refused(
                &peer,
                Error::from_wire(answer.kind, &answer.payload),
            ));
        }
        if !token.check_server(&ours, &nonce, &answer.payload) {
            return Err(Error::unauthenticated(format!(
                "the {} at {peer} did not prove the cluster token: it belongs to another \
                 cluster, or impersonates a member of this one",
                theirs.role
            )));
        }
        Ok(info)
    }

    async fn server(&self, io: &mut HandshakeIo) -> Result<PeerInfo> {
        if let Some(tls) = &self.tls {
            io.start_tls_server(tls).await?;
        }
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
        let same_version = theirs.version == self.version;
        let peer_nonce = if same_version { theirs.nonce()? } else { None };
        if self.token.is_some() && same_version && peer_nonce.is_none() {
            tracing::warn!(
                "refused a connection from {} ({}): it offered no proof of the cluster token",
                io.peer(),
                theirs.role
            );
            // Not answered here: the transport answers the HELLO with this.
            return Err(Error::unauthenticated(
                "this server requires the cluster token: give the client the cluster's token \
                 ([security] token_file in its configuration, or NK_TOKEN_FILE; `nk up` keeps \
                 its own in DIR/token of its data directory and prints where)",
            ));
        }
        let ours = self.token.as_ref().map(|_| Token::nonce()).transpose()?;
        // Answered with our version even when it differs: the client then
        // names both versions in its own error.
        io.send(HELLO_ID, STATUS_OK, &self.hello(ours)?).await?;
        if !same_version {
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
        if let (Some(token), Some(ours), Some(theirs_nonce)) = (&self.token, ours, peer_nonce) {
            let proof = io.recv().await?;
            if proof.kind != AUTH_KIND || proof.id != HELLO_ID {
                return Err(Error::protocol(format!(
                    "expected the proof of the cluster token (kind {AUTH_KIND:#x}, id \
                     {HELLO_ID}) after the HELLO, not kind {} with id {}",
                    proof.kind, proof.id
                )));
            }
            let Some(key) = token.check_client(&ours, &theirs_nonce, &proof.payload) else {
                tracing::warn!(
                    "refused a connection from {} ({}): wrong cluster token",
                    io.peer(),
                    theirs.role
                );
                return Err(Error::unauthenticated(
                    "wrong cluster token: this server does not accept the token the client \
                     proved",
                ));
            };
            io.send(
                HELLO_ID,
                STATUS_OK,
                &token.server_proof(key, &theirs_nonce, &ours),
            )
            .await?;
        }
        Ok(PeerInfo {
            version: theirs.version,
            role: theirs.role,
        })
    }
}

/// A server's refusal `e`, as the client reports it.
fn refused(peer: &str, e: Error) -> Error {
    Error::new(
        e.code,
        format!("the server at {peer} refused the connection: {}", e.message),
    )
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
