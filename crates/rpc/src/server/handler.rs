//! What a server plugs into the transport: the [`Handler`] of its requests,
//! and the [`Reply`] it builds, which may end with a [`SharedBody`] sent
//! without a copy; requests whose bulk data is received in place go to a
//! [`DirectSink`].

use crate::handshake::ServerHandshake;
use crate::hello::VersionHandshake;
use bytes::{Bytes, BytesMut};
use nodekernel_proto::hello::Role;
use nodekernel_proto::{Error, Result, MAX_PAYLOAD_LEN};
use std::future::Future;
use std::sync::Arc;
use tokio::sync::OwnedSemaphorePermit;

/// Serves requests of one kind of server (metadata or storage).
pub trait Handler: Send + Sync + 'static {
    /// Handles request `op` with `payload`, appending the reply payload to
    /// `out` on success. Errors are sent back as error replies.
    fn handle(
        &self,
        op: u16,
        payload: Bytes,
        out: &mut BytesMut,
    ) -> impl Future<Output = Result<()>> + Send;

    /// The handshake every connection to this server runs before its first
    /// request; called once when serving starts. The default checks the
    /// wire version ([`VersionHandshake`]) and introduces the server with
    /// [`Role::Unspecified`]. Override it to name the server's role, or to
    /// require authentication.
    fn handshake(&self) -> Arc<dyn ServerHandshake> {
        Arc::new(VersionHandshake::new(Role::Unspecified))
    }

    /// Whether a tenant's connection ([`crate::PeerInfo::tenant`]) may make
    /// request `op`: the transport refuses every other one with
    /// `Unauthenticated` before the handler sees it. The default: none (a
    /// server that knows nothing of tenants serves only members).
    fn tenant_may(&self, _op: u16) -> bool {
        false
    }

    /// The largest payload a request of kind `op` may have on this server.
    /// A frame over it is refused from its header alone, before any of its
    /// payload is buffered: it is answered with a `Protocol` error naming
    /// the limit, and the connection closes (the stream cannot be followed
    /// past a frame that is not read). The default: the wire's limit,
    /// [`MAX_PAYLOAD_LEN`].
    fn max_payload(&self, _op: u16) -> usize {
        MAX_PAYLOAD_LEN
    }

    /// The bytes of memory the reply to request `op` with `payload` will
    /// hold while it is built and until it is sent, when they are large and
    /// known in advance (a file server's read: its data, and the buffer it
    /// is read through). The server reserves them before the request is
    /// handled ([`ServeOptions::max_reply_bytes`],
    /// [`ServeOptions::max_connection_reply_bytes`]), so replies that their
    /// peer does not read hold a bounded amount of memory. 0 (the default):
    /// a small reply, or one sent from elsewhere ([`SharedBody`]); a
    /// connection holds at most [`ServeOptions::max_in_flight`] of those.
    /// Called for every request before it is handled: it must be cheap, and
    /// must not fail (a malformed payload: 0, and the handler refuses it).
    ///
    /// [`ServeOptions::max_reply_bytes`]: crate::ServeOptions::max_reply_bytes
    /// [`ServeOptions::max_connection_reply_bytes`]: crate::ServeOptions::max_connection_reply_bytes
    /// [`ServeOptions::max_in_flight`]: crate::ServeOptions::max_in_flight
    fn reply_len(&self, _op: u16, _payload: &[u8]) -> usize {
        0
    }

    /// For requests whose payload is a fixed prefix followed by bulk data
    /// that the handler can take in place: the prefix's length for `op`.
    /// When such a request's data is [`DIRECT_MIN`] bytes or more and has
    /// not all arrived yet, the server asks [`Handler::direct_sink`] where
    /// the data should go, receives it there from the socket, and calls
    /// [`Handler::handle_direct`]. The default: no such requests.
    fn direct_prefix(&self, _op: u16) -> Option<usize> {
        None
    }

    /// Where the `data_len` bytes after `prefix` of request `op` should be
    /// received. `Ok(None)` (or an error, which the usual path will meet
    /// again and answer) takes the usual path: the whole payload into the
    /// connection's buffer, then [`Handler::handle_reply`]. The
    /// connection reads nothing else while this waits (at most the frame
    /// timeout).
    fn direct_sink(
        &self,
        _op: u16,
        _prefix: &[u8],
        _data_len: usize,
    ) -> impl Future<Output = Result<Option<Box<dyn DirectSink>>>> + Send {
        async { Ok(None) }
    }

    /// Handles request `op` whose data went into `sink` (every byte of it
    /// arrived), appending the reply payload to `out`.
    fn handle_direct(
        &self,
        _op: u16,
        _prefix: Bytes,
        _sink: Box<dyn DirectSink>,
        _out: &mut BytesMut,
    ) -> impl Future<Output = Result<()>> + Send {
        async { Err(Error::internal("this server takes no direct requests")) }
    }

    /// Like [`Handler::handle`], with the whole [`Reply`] at hand: a
    /// handler overrides it to end its reply with a [`SharedBody`] (sent
    /// without a copy). The default calls [`Handler::handle`].
    fn handle_reply(
        &self,
        op: u16,
        payload: Bytes,
        reply: &mut Reply,
    ) -> impl Future<Output = Result<()>> + Send {
        self.handle(op, payload, &mut reply.out)
    }
}

/// Memory that the bulk data ending a request is received into straight
/// from the socket, instead of through the connection's buffer and a copy
/// (a storage server's DRAM block). See [`Handler::direct_prefix`].
///
/// # Safety
///
/// [`DirectSink::dest`] must name memory valid for writes of its length
/// for as long as the sink lives. Other processes may read it meanwhile:
/// the server writes to it only through the raw pointer (`recv(2)` and a
/// copy of bytes it had buffered), never through a Rust reference.
pub unsafe trait DirectSink: Send + 'static {
    /// Where the data goes, and how many bytes.
    fn dest(&self) -> (*mut u8, usize);
}

/// Requests whose data is shorter than this take the usual path: copying
/// them out of the connection's buffer costs less than a second step.
pub const DIRECT_MIN: usize = 64 << 10;

/// The end of a reply's payload sent straight from memory the server shares
/// with other processes (a storage server's DRAM region), without copying
/// it into the reply first. Those bytes may change while they are sent, so
/// once they went out, [`SharedBody::seal`] appends a trailer saying
/// whether they were still valid.
///
/// # Safety
///
/// The memory `bytes` names must stay mapped and readable for as long as
/// the body lives. Its contents may change at any time: the server never
/// forms a Rust reference to it, it only passes the address to `send(2)`.
pub unsafe trait SharedBody: Send + 'static {
    /// Where the bytes are, and how many.
    fn bytes(&self) -> (*const u8, usize);
    /// How many bytes [`SharedBody::seal`] appends.
    fn trailer_len(&self) -> usize;
    /// Called once every byte went out (not at all if the send failed):
    /// appends exactly [`SharedBody::trailer_len`] bytes.
    fn seal(&self, out: &mut BytesMut);
}

/// A reply being built: the frame so far (header and payload bytes), and
/// optionally a [`SharedBody`] that ends the payload.
#[derive(Default)]
pub struct Reply {
    pub(super) out: BytesMut,
    pub(super) body: Option<Box<dyn SharedBody>>,
    /// The bytes reserved for it ([`Handler::reply_len`]), given back once
    /// it was sent (or dropped).
    pub(super) reserved: Option<OwnedSemaphorePermit>,
    /// The tenant whose connection made the request (`None`: a member).
    pub(super) tenant: Option<Arc<str>>,
}

impl Reply {
    /// An empty reply (the server makes one per request; for tests of
    /// handlers).
    pub fn new() -> Reply {
        Reply::default()
    }

    /// The tenant whose connection made this request, if a tenant's
    /// ([`crate::PeerInfo::tenant`]); `None` for a member of the cluster.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// Bytes reserved for this reply.
    pub(super) fn reserved_bytes(&self) -> usize {
        self.reserved.as_ref().map_or(0, |p| p.num_permits())
    }

    /// Takes the shared body out (for tests of handlers).
    #[doc(hidden)]
    pub fn take_body(&mut self) -> Option<Box<dyn SharedBody>> {
        self.body.take()
    }

    /// The payload bytes so far; a handler appends its reply here.
    pub fn out(&mut self) -> &mut BytesMut {
        &mut self.out
    }

    /// Ends the payload with `body`, sent after the bytes of
    /// [`Reply::out`] (which must not grow after this).
    pub fn set_body(&mut self, body: Box<dyn SharedBody>) {
        self.body = Some(body);
    }
}
