//! The server end: an accept loop, and one task per connection that runs the
//! handshake, then reads frames, hands each request to the [`Handler`] and
//! writes the replies.
//!
//! Every resource a peer can make the server hold is bounded (see
//! [`crate::limits`]): open connections ([`ServeOptions::max_connections`])
//! and those still in their handshake ([`ServeOptions::max_handshakes`]),
//! requests being handled per connection and per server, the payload each
//! request kind may have ([`Handler::max_payload`]), the bytes held for
//! frames being received or handled ([`ServeOptions::max_request_bytes`];
//! receive buffers grow only as bytes arrive, and shrink back when idle),
//! the bytes of replies waiting for their peer
//! ([`ServeOptions::max_reply_bytes`]), and the time a handshake or a frame
//! may take.

use crate::handshake::{HandshakeIo, ServerHandshake, VersionHandshake};
use crate::limits::{
    FRAME_TIMEOUT, HANDSHAKE_GRACE, HANDSHAKE_TIMEOUT, LIMIT_WARN_INTERVAL, MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_PEER, MAX_CONNECTION_REPLY_BYTES, MAX_ERROR_MESSAGE, MAX_HANDSHAKES,
    MAX_IN_FLIGHT, MAX_REPLY_BYTES, MAX_REQUESTS, MAX_REQUEST_BYTES, RECV_BUF_INITIAL,
    RECV_READ_MIN, RECV_SHRINK_AFTER, REPLY_BUF, SMALL_PAYLOAD, TRIM_AFTER, TRIM_INTERVAL,
};
use crate::spin::{Spin, SpinStats};
use crate::transport::{Listener, LocalPeers, ReadHalf, Stream};
use bytes::{Buf, Bytes, BytesMut};
use futures::future::Either;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use nodekernel_proto::frame::STATUS_OK;
use nodekernel_proto::hello::Role;
use nodekernel_proto::{Error, ErrorCode, FrameHeader, Result, HEADER_LEN, MAX_PAYLOAD_LEN};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};

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
    out: BytesMut,
    body: Option<Box<dyn SharedBody>>,
    /// The bytes reserved for it ([`Handler::reply_len`]), given back once
    /// it was sent (or dropped).
    reserved: Option<OwnedSemaphorePermit>,
}

impl Reply {
    /// An empty reply (the server makes one per request; for tests of
    /// handlers).
    pub fn new() -> Reply {
        Reply::default()
    }

    /// Bytes reserved for this reply.
    fn reserved_bytes(&self) -> usize {
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

/// Settings of a server's connections. The defaults are the constants of
/// [`crate::limits`].
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// How long an idle connection busy-polls for the next request before
    /// parking (0 disables spinning).
    pub spin: Duration,
    /// Requests of one connection handled concurrently; replies go out as
    /// they complete (the client matches them by id).
    pub max_in_flight: usize,
    /// Open connections (including those still in their handshake). A
    /// connection beyond it is answered with an `Unavailable` error frame
    /// and closed at once, unless a connection in its handshake can make
    /// room (see `max_handshakes`).
    pub max_connections: usize,
    /// Connections in their handshake. When they are all taken (or every
    /// connection is), the oldest connection in its handshake is closed to
    /// make room once it has had [`HANDSHAKE_GRACE`] (or the handshake
    /// timeout, if shorter); until then new connections wait in the listen
    /// queue. See [`MAX_HANDSHAKES`].
    pub max_handshakes: usize,
    /// Open connections of one peer (an IP address, or a local user on a
    /// Unix socket), so one client cannot take them all; refused like
    /// those beyond `max_connections`.
    pub max_connections_per_peer: usize,
    /// Requests handled at once across all connections of this server; a
    /// request beyond it waits for another to finish.
    pub max_requests: usize,
    /// Bytes of request payloads larger than [`SMALL_PAYLOAD`] held at
    /// once, being received or handled, across all connections; a frame
    /// beyond it waits, unread. See [`MAX_REQUEST_BYTES`].
    pub max_request_bytes: usize,
    /// Bytes of replies declared by the handler ([`Handler::reply_len`])
    /// held at once, being built or waiting to be sent, across all
    /// connections; a request beyond it waits. See [`MAX_REPLY_BYTES`].
    pub max_reply_bytes: usize,
    /// The same for one connection (which may always have one reply): a
    /// connection whose replies are not read stops having its requests
    /// read. See [`MAX_CONNECTION_REPLY_BYTES`].
    pub max_connection_reply_bytes: usize,
    /// Once a frame's first byte has arrived, the rest must arrive within
    /// this time, or the connection is closed (time the server spends not
    /// reading, because of the bounds above, does not count). Also the
    /// longest a reply may wait for the peer to take any of its bytes.
    pub frame_timeout: Duration,
    /// A new connection must finish its handshake within this time.
    pub handshake_timeout: Duration,
    /// Who may connect over a Unix socket (not checked for TCP): a peer
    /// refused is answered with an `Unauthenticated` error and closed
    /// before its first frame is read.
    pub local_peers: LocalPeers,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            spin: crate::default_spin(),
            max_in_flight: MAX_IN_FLIGHT,
            max_connections: MAX_CONNECTIONS,
            max_connections_per_peer: MAX_CONNECTIONS_PER_PEER,
            max_handshakes: MAX_HANDSHAKES,
            max_requests: MAX_REQUESTS,
            max_request_bytes: MAX_REQUEST_BYTES,
            max_reply_bytes: MAX_REPLY_BYTES,
            max_connection_reply_bytes: MAX_CONNECTION_REPLY_BYTES,
            frame_timeout: FRAME_TIMEOUT,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            local_peers: LocalPeers::owner(),
        }
    }
}

/// A running server. Dropping it (or calling [`ServerHandle::shutdown`])
/// stops accepting and closes every connection.
pub struct ServerHandle {
    /// The TCP address served; `None` for a Unix-socket server.
    addr: Option<SocketAddr>,
    task: JoinHandle<()>,
    state: Arc<ServerState>,
    opts: ServeOptions,
}

/// What the accept loop and the connections of one server share.
struct ServerState {
    sockets: Sockets,
    /// Permits for requests being handled ([`ServeOptions::max_requests`]).
    requests: Arc<Semaphore>,
    /// Bytes of larger request frames being received or handled
    /// ([`ServeOptions::max_request_bytes`]).
    request_bytes: Budget,
    /// Bytes of declared replies being built or waiting to be sent
    /// ([`ServeOptions::max_reply_bytes`]).
    reply_bytes: Budget,
    /// Capacity of every connection's receive buffer, summed.
    recv_bytes: AtomicUsize,
    /// The largest value `recv_bytes` has had.
    recv_bytes_peak: AtomicUsize,
    /// The most bytes [`ServerState::held`] since memory was last handed
    /// back to the system ([`TRIM_AFTER`]).
    held_peak: AtomicUsize,
    /// Connections closed because of a frame that could not be parsed.
    malformed: AtomicU64,
    /// Connections refused because `max_connections` were open.
    refused: AtomicU64,
    /// Connections in their handshake closed to make room for new ones.
    evicted: AtomicU64,
    /// Idle connections that busy-polled for their next request.
    idle_spins: AtomicU64,
}

impl ServerState {
    /// Bytes reserved for frames and replies, and of receive buffers.
    fn held(&self) -> usize {
        self.request_bytes.used()
            + self.reply_bytes.used()
            + self.recv_bytes.load(Ordering::Relaxed)
    }

    /// Notes what is held now in the peak since the last trim.
    fn note_held(&self) {
        self.held_peak.fetch_max(self.held(), Ordering::Relaxed);
    }

    /// Hands freed heap memory back to the system when what the server
    /// holds fell [`TRIM_AFTER`] below its peak since the last time.
    fn trim_if_freed(&self) {
        let now = self.held();
        if self.held_peak.load(Ordering::Relaxed).saturating_sub(now) < TRIM_AFTER {
            return;
        }
        self.held_peak.store(now, Ordering::Relaxed);
        tokio::task::spawn_blocking(crate::trim_heap);
    }
}

/// A server-wide budget of bytes, taken in reservations that give their
/// bytes back when dropped.
struct Budget {
    sem: Arc<Semaphore>,
    limit: usize,
}

impl Budget {
    fn new(limit: usize) -> Budget {
        let limit = limit.clamp(1, Semaphore::MAX_PERMITS);
        Budget {
            sem: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// A reservation of `n` bytes (at most the whole budget, so that any
    /// one request can be served), if they are free now.
    fn try_take(&self, n: usize) -> Option<OwnedSemaphorePermit> {
        self.sem.clone().try_acquire_many_owned(self.clamp(n)).ok()
    }

    /// Waits for a reservation of `n` bytes, in turn with the others
    /// waiting.
    fn take(&self, n: usize) -> PermitWait {
        Box::pin(self.sem.clone().acquire_many_owned(self.clamp(n)))
    }

    fn clamp(&self, n: usize) -> u32 {
        n.clamp(1, self.limit).min(u32::MAX as usize) as u32
    }

    /// Bytes reserved now.
    fn used(&self) -> usize {
        self.limit.saturating_sub(self.sem.available_permits())
    }
}

/// Duplicates of the listening socket and of every open connection, so
/// `shutdown` takes effect synchronously: the aborted tasks are only
/// dropped once the runtime gets to them, and a connection could otherwise
/// serve one more request.
#[derive(Default)]
struct Sockets {
    listener: std::sync::Mutex<Option<OwnedFd>>,
    conns: std::sync::Mutex<Registry>,
    stopped: AtomicBool,
    /// Wakes the accept loop: a shut-down Unix listener keeps reporting
    /// readiness while `accept` finds nothing, so the loop must not rely on
    /// an accept error to notice the end.
    stop: tokio::sync::Notify,
    /// Wakes the accept loop waiting for room for a connection in its
    /// handshake: one finished its handshake or closed.
    room: tokio::sync::Notify,
}

/// The open connections of a server.
#[derive(Default)]
struct Registry {
    /// Every open connection: a duplicate of its socket, the peer it counts
    /// against, and its address (for logs).
    open: HashMap<u64, Conn>,
    /// Open connections by peer (IP address, or local user).
    per_peer: HashMap<String, usize>,
    /// The connections still in their handshake, oldest first, with when
    /// they were accepted.
    handshaking: BTreeMap<u64, Instant>,
}

struct Conn {
    fd: OwnedFd,
    peer_key: String,
    peer: String,
}

/// Whether a server can take one more connection now.
#[derive(Clone, Copy)]
enum Room {
    /// There is room.
    Free,
    /// The connection in its handshake with id `oldest` must make room;
    /// it may from `due` on (see [`ServeOptions::max_handshakes`]).
    Crowded { oldest: u64, due: Instant },
    /// Every connection is past its handshake: refuse.
    Full,
}

impl Registry {
    /// Room for one more connection (see [`ServeOptions::max_handshakes`]).
    fn room(&self, opts: &ServeOptions) -> Room {
        let crowded = self.handshaking.len() >= opts.max_handshakes
            || self.open.len() >= opts.max_connections;
        if !crowded {
            return Room::Free;
        }
        match self.handshaking.first_key_value() {
            None => Room::Full,
            Some((&oldest, &since)) => Room::Crowded {
                oldest,
                due: since + HANDSHAKE_GRACE.min(opts.handshake_timeout),
            },
        }
    }

    /// Registers a new connection, in its handshake.
    fn add(&mut self, id: u64, conn: Conn, now: Instant) {
        *self.per_peer.entry(conn.peer_key.clone()).or_insert(0) += 1;
        self.handshaking.insert(id, now);
        self.open.insert(id, conn);
    }

    /// Forgets a connection (closed, or closed to make room); returns it if
    /// it was still registered.
    fn remove(&mut self, id: u64) -> Option<Conn> {
        self.handshaking.remove(&id);
        let conn = self.open.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&conn.peer_key) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&conn.peer_key);
            }
        }
        Some(conn)
    }
}

fn shutdown_fd(fd: &OwnedFd) {
    // shutdown(2) ends a listener's accepting and a connection's traffic at
    // once. SAFETY: a plain system call on a descriptor we own.
    unsafe {
        libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR);
    }
}

impl Sockets {
    fn shutdown_all(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.stop.notify_one();
        if let Some(fd) = self.listener.lock().expect("sockets lock").as_ref() {
            shutdown_fd(fd);
        }
        for c in self.conns.lock().expect("sockets lock").open.values() {
            shutdown_fd(&c.fd);
        }
    }

    fn open(&self) -> usize {
        self.conns.lock().expect("sockets lock").open.len()
    }

    /// Connection `id` finished its handshake; `false` if it was closed to
    /// make room meanwhile.
    fn established(&self, id: u64) -> bool {
        let mut reg = self.conns.lock().expect("sockets lock");
        let present = reg.open.contains_key(&id);
        reg.handshaking.remove(&id);
        drop(reg);
        self.room.notify_one();
        present
    }
}

/// Removes a connection from the registry when its task ends.
struct Registered {
    state: Arc<ServerState>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let sockets = &self.state.sockets;
        let gone = sockets.conns.lock().expect("sockets lock").remove(self.id);
        drop(gone); // its duplicate descriptor, closed outside the lock
        sockets.room.notify_one();
    }
}

impl ServerHandle {
    /// The TCP address served (the unspecified address `0.0.0.0:0` for a
    /// server started with [`serve_unix`]).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// Stops the server: from the moment this returns, new connections are
    /// refused and open connections carry no more traffic. Idempotent.
    pub fn shutdown(&self) {
        self.state.sockets.shutdown_all();
        self.task.abort();
    }

    /// Connections open right now (including those in their handshake).
    pub fn connections(&self) -> usize {
        self.state.sockets.open()
    }

    /// Connections refused so far because
    /// [`ServeOptions::max_connections`] were open.
    pub fn refused_connections(&self) -> u64 {
        self.state.refused.load(Ordering::Relaxed)
    }

    /// Connections closed while still in their handshake to make room
    /// for new ones ([`ServeOptions::max_handshakes`]).
    pub fn evicted_handshakes(&self) -> u64 {
        self.state.evicted.load(Ordering::Relaxed)
    }

    /// Bytes reserved right now for request frames and for replies
    /// ([`ServeOptions::max_request_bytes`], [`ServeOptions::max_reply_bytes`]).
    #[doc(hidden)]
    pub fn reserved_bytes(&self) -> (usize, usize) {
        (
            self.state.request_bytes.used(),
            self.state.reply_bytes.used(),
        )
    }

    /// Requests being handled right now, across all connections.
    pub fn requests_in_flight(&self) -> usize {
        self.opts
            .max_requests
            .saturating_sub(self.state.requests.available_permits())
    }

    /// Bytes of receive-buffer capacity held by this server's connections
    /// (for tests of the memory bounds).
    #[doc(hidden)]
    pub fn recv_buffer_bytes(&self) -> usize {
        self.state.recv_bytes.load(Ordering::Relaxed)
    }

    /// The most receive-buffer capacity this server's connections have
    /// held at once (for tests of the memory bounds).
    #[doc(hidden)]
    pub fn recv_buffer_peak(&self) -> usize {
        self.state.recv_bytes_peak.load(Ordering::Relaxed)
    }

    /// Times an idle connection busy-polled for its next request (it
    /// stops while its requests come seldom; see [`crate::spin`]).
    pub fn idle_spins(&self) -> u64 {
        self.state.idle_spins.load(Ordering::Relaxed)
    }

    /// Connections closed so far because of a frame the server could not
    /// parse (a bad header, or a first frame that is not a valid HELLO).
    #[doc(hidden)]
    pub fn malformed_frames(&self) -> u64 {
        self.state.malformed.load(Ordering::Relaxed)
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts serving `listener` with `handler` on the current tokio runtime.
pub fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>) -> Result<ServerHandle> {
    serve_with(listener, handler, ServeOptions::default())
}

/// Like [`serve`], with explicit connection settings.
pub fn serve_with<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    opts: ServeOptions,
) -> Result<ServerHandle> {
    let addr = listener
        .local_addr()
        .map_err(|e| crate::io_error("listener address", e))?;
    serve_listener(Listener::Tcp(listener), Some(addr), handler, opts)
}

/// Like [`serve_with`], on a Unix-domain listener (see
/// [`crate::bind_unix`]): for clients on the same host.
pub fn serve_unix<H: Handler>(
    listener: UnixListener,
    handler: Arc<H>,
    opts: ServeOptions,
) -> Result<ServerHandle> {
    serve_listener(Listener::Unix(listener), None, handler, opts)
}

/// Logs a line at most once per [`LIMIT_WARN_INTERVAL`].
#[derive(Default)]
struct RateLimited {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimited {
    /// `Some(lines suppressed since the last one)` when a line may be
    /// logged now.
    fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.last {
            Some(t) if now.duration_since(t) < LIMIT_WARN_INTERVAL => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

fn serve_listener<H: Handler>(
    listener: Listener,
    addr: Option<SocketAddr>,
    handler: Arc<H>,
    opts: ServeOptions,
) -> Result<ServerHandle> {
    crate::transport::raise_nofile_limit();
    listener.widen_backlog();
    let opts = ServeOptions {
        max_in_flight: opts.max_in_flight.max(1),
        max_connections: opts.max_connections.max(1),
        max_connections_per_peer: opts.max_connections_per_peer.max(1),
        max_handshakes: opts.max_handshakes.max(1),
        max_requests: opts.max_requests.clamp(1, Semaphore::MAX_PERMITS),
        ..opts
    };
    let state = Arc::new(ServerState {
        sockets: Sockets::default(),
        requests: Arc::new(Semaphore::new(opts.max_requests)),
        request_bytes: Budget::new(opts.max_request_bytes),
        reply_bytes: Budget::new(opts.max_reply_bytes),
        recv_bytes: AtomicUsize::new(0),
        recv_bytes_peak: AtomicUsize::new(0),
        held_peak: AtomicUsize::new(0),
        malformed: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        evicted: AtomicU64::new(0),
        idle_spins: AtomicU64::new(0),
    });
    *state.sockets.listener.lock().expect("sockets lock") = Some(
        listener
            .dup()
            .map_err(|e| crate::io_error("duplicating the listening socket", e))?,
    );
    let handshake = handler.handshake();
    let st = state.clone();
    let task = tokio::spawn(async move {
        // Connections live in this set: aborting the accept task drops the
        // set, which aborts every connection task with it.
        let mut conns = JoinSet::new();
        let mut next_id = 0u64;
        let mut refusals = RateLimited::default();
        let mut local_refusals = RateLimited::default();
        let mut evictions = RateLimited::default();
        let mut accept_errors = RateLimited::default();
        let mut trim = tokio::time::interval(TRIM_INTERVAL);
        trim.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // While the connections in their handshake are all young, new
            // ones wait in the listen queue (see `max_handshakes`).
            let now = Instant::now();
            let room = st.sockets.conns.lock().expect("sockets lock").room(&opts);
            match room {
                Room::Crowded { due, .. } if due > now => {
                    tokio::select! {
                        biased;
                        () = st.sockets.stop.notified() => return,
                        () = tokio::time::sleep_until(due.into()) => {}
                        () = st.sockets.room.notified() => {}
                        Some(_) = conns.join_next(), if !conns.is_empty() => {}
                        _ = trim.tick() => st.trim_if_freed(),
                    }
                    continue;
                }
                _ => {}
            }
            tokio::select! {
                biased;
                () = st.sockets.stop.notified() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer, peer_key)) => {
                        if let Stream::Unix(_) = stream {
                            if let Err(why) = opts.local_peers.check(stream.raw_fd()) {
                                st.refused.fetch_add(1, Ordering::Relaxed);
                                if let Some(suppressed) = local_refusals.allow() {
                                    tracing::warn!(
                                        "refused a local connection: {why}; {suppressed} more \
                                         refused since the last warning"
                                    );
                                }
                                refuse_at_once(&stream, &Error::unauthenticated(format!(
                                    "refused: {why}"
                                )));
                                continue;
                            }
                        }
                        let Ok(dup) = stream.dup() else {
                            continue; // out of descriptors: drop this connection
                        };
                        let now = Instant::now();
                        let mut reg = st.sockets.conns.lock().expect("sockets lock");
                        let n = reg.per_peer.get(&peer_key).copied().unwrap_or(0);
                        if n >= opts.max_connections_per_peer {
                            drop(reg);
                            st.refused.fetch_add(1, Ordering::Relaxed);
                            if let Some(suppressed) = refusals.allow() {
                                tracing::warn!(
                                    "refused a connection from {peer}: {peer_key} has {n} \
                                     connections open, the limit per peer \
                                     (max_connections_per_peer); {suppressed} more refused \
                                     since the last warning"
                                );
                            }
                            refuse_at_once(&stream, &Error::unavailable(format!(
                                "{peer_key} has {} connections open to this server, the \
                                 limit per peer; close some or try again later",
                                opts.max_connections_per_peer
                            )));
                            continue;
                        }
                        match reg.room(&opts) {
                            Room::Free => {}
                            // Waited for above: the oldest connection in its
                            // handshake has had its grace.
                            Room::Crowded { oldest, due } if due <= now => {
                                if let Some(victim) = reg.remove(oldest) {
                                    shutdown_fd(&victim.fd);
                                    st.evicted.fetch_add(1, Ordering::Relaxed);
                                    if let Some(suppressed) = evictions.allow() {
                                        tracing::warn!(
                                            "closed the connection from {} still in its \
                                             handshake after {:?} to make room (max_handshakes \
                                             {}, max_connections {}); {suppressed} more since \
                                             the last warning",
                                            victim.peer,
                                            now.saturating_duration_since(due)
                                                + HANDSHAKE_GRACE.min(opts.handshake_timeout),
                                            opts.max_handshakes,
                                            opts.max_connections,
                                        );
                                    }
                                }
                            }
                            // Every connection is past its handshake (or, in
                            // a race, the one that was old enough finished it).
                            _ => {
                                let open = reg.open.len();
                                drop(reg);
                                st.refused.fetch_add(1, Ordering::Relaxed);
                                if let Some(suppressed) = refusals.allow() {
                                    tracing::warn!(
                                        "refused a connection from {peer}: {open} connections \
                                         are open, the limit (max_connections); {suppressed} \
                                         more refused since the last warning"
                                    );
                                }
                                refuse_at_once(&stream, &Error::unavailable(format!(
                                    "the server has {} open connections, its limit; try again \
                                     later",
                                    opts.max_connections
                                )));
                                continue;
                            }
                        }
                        next_id += 1;
                        reg.add(next_id, Conn { fd: dup, peer_key, peer: peer.clone() }, now);
                        drop(reg);
                        if st.sockets.stopped.load(Ordering::SeqCst) {
                            st.sockets.shutdown_all();
                        }
                        let guard = Registered { state: st.clone(), id: next_id };
                        let handler = handler.clone();
                        let handshake = handshake.clone();
                        let state = st.clone();
                        conns.spawn(connection(
                            stream, peer, guard, handler, handshake, state, opts,
                        ));
                    }
                    // A listener shut down by `ServerHandle::shutdown`.
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => return,
                    Err(e) => {
                        // Out of descriptors, typically: back off a little.
                        if let Some(suppressed) = accept_errors.allow() {
                            tracing::warn!(
                                "accept failed: {e} ({suppressed} more failures since the \
                                 last warning)"
                            );
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                _ = trim.tick() => st.trim_if_freed(),
            }
        }
    });
    Ok(ServerHandle {
        addr,
        task,
        state,
        opts,
    })
}

/// Tells a connection refused before its handshake why it is closed (if
/// the socket takes the few bytes at once: an error reply to the HELLO's
/// id) and drops it.
fn refuse_at_once(stream: &Stream, why: &Error) {
    let mut out = BytesMut::new();
    push_error(&mut out, 0, why);
    let fd = stream.raw_fd();
    // SAFETY: send reads `out.len()` bytes from a live buffer; `fd` is the
    // open socket `stream` owns. MSG_DONTWAIT: never blocks the accept
    // loop; MSG_NOSIGNAL: a peer already gone raises no SIGPIPE.
    unsafe {
        libc::send(
            fd,
            out.as_ptr().cast(),
            out.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        );
    }
}

/// One connection: the handshake, then requests until the peer closes.
async fn connection<H: Handler>(
    stream: Stream,
    peer: String,
    registered: Registered,
    handler: Arc<H>,
    handshake: Arc<dyn ServerHandshake>,
    state: Arc<ServerState>,
    opts: ServeOptions,
) {
    let mut io = HandshakeIo::new(stream, peer);
    match tokio::time::timeout(opts.handshake_timeout, handshake.accept(&mut io)).await {
        Ok(Ok(info)) => tracing::debug!(
            "connection from {} ({}, wire version {})",
            io.peer(),
            info.role,
            info.version
        ),
        Ok(Err(e)) => {
            tracing::debug!("refused the connection from {}: {e}", io.peer());
            if e.code == ErrorCode::Protocol {
                state.malformed.fetch_add(1, Ordering::Relaxed);
            }
            let _ = tokio::time::timeout(opts.handshake_timeout, io.refuse(&e)).await;
            return;
        }
        Err(_) => {
            tracing::debug!(
                "closing the connection from {}: no handshake within {:?}",
                io.peer(),
                opts.handshake_timeout
            );
            return;
        }
    }
    if !state.sockets.established(registered.id) {
        return; // closed meanwhile to make room
    }
    let peer: Arc<str> = io.peer().into();
    let (stream, leftover) = io.into_parts();
    serve_requests(stream, leftover, peer, handler, &state, opts).await;
}

/// What the front of a receive buffer holds.
enum Front {
    /// Less than a header.
    Short,
    /// A header and part of its payload, with the number of bytes still
    /// missing.
    Partial(FrameHeader, usize),
    /// A complete frame.
    Frame(FrameHeader),
    /// A header that cannot be parsed, or announcing more than the request
    /// kind may have: the request id (as read) and why.
    Bad(u64, Error),
}

fn front(buf: &[u8]) -> Front {
    if buf.len() < HEADER_LEN {
        return Front::Short;
    }
    let h: [u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("length checked");
    match FrameHeader::parse(&h) {
        Ok(hdr) if buf.len() >= HEADER_LEN + hdr.payload_len => Front::Frame(hdr),
        Ok(hdr) => Front::Partial(hdr, HEADER_LEN + hdr.payload_len - buf.len()),
        Err(e) => Front::Bad(u64::from_le_bytes(h[4..12].try_into().expect("8 bytes")), e),
    }
}

/// [`front`], with the handler's limit on each request kind's payload
/// ([`Handler::max_payload`]) applied from the header.
fn front_for<H: Handler>(buf: &[u8], handler: &H) -> Front {
    match front(buf) {
        Front::Partial(h, _) | Front::Frame(h) if h.payload_len > handler.max_payload(h.kind) => {
            Front::Bad(
                h.id,
                Error::protocol(format!(
                    "a request of kind {} with a payload of {} bytes: this server takes at \
                     most {} bytes for that kind",
                    h.kind,
                    h.payload_len,
                    handler.max_payload(h.kind)
                )),
            )
        }
        f => f,
    }
}

/// Bytes a frame of `payload_len` takes from [`ServeOptions::max_request_bytes`]:
/// the receive buffer it arrives in (see [`MAX_REQUEST_BYTES`]). `None`: a
/// small frame, copied out, which takes none.
fn frame_reservation(payload_len: usize) -> Option<usize> {
    (payload_len > SMALL_PAYLOAD)
        .then(|| (HEADER_LEN + payload_len).max(RECV_BUF_INITIAL) + RECV_READ_MIN)
}

/// Takes the payload of the complete frame with `header` at the front of
/// `buf` (see [`front`]). A small one is copied out, so that it keeps no
/// receive buffer alive; a larger one is handed over as it is (its buffer
/// is reserved, see [`frame_reservation`]).
fn take_frame(buf: &mut BytesMut, header: FrameHeader) -> Bytes {
    buf.advance(HEADER_LEN);
    if header.payload_len <= SMALL_PAYLOAD {
        let payload = Bytes::copy_from_slice(&buf[..header.payload_len]);
        buf.advance(header.payload_len);
        payload
    } else {
        buf.split_to(header.payload_len).freeze()
    }
}

/// A connection's receive buffer, counted in the server's total. It grows
/// beyond [`RECV_BUF_INITIAL`] only for a frame whose bytes have filled it
/// and are reserved ([`MAX_REQUEST_BYTES`]), never from a declared frame
/// length alone.
struct RecvBuf<'a> {
    buf: BytesMut,
    counted: usize,
    /// The frame at the front has its bytes reserved: the buffer may grow
    /// to hold it.
    reserved: bool,
    /// The server's total, and its high-water mark.
    total: &'a AtomicUsize,
    peak: &'a AtomicUsize,
}

impl<'a> RecvBuf<'a> {
    fn new(mut buf: BytesMut, total: &'a AtomicUsize, peak: &'a AtomicUsize) -> RecvBuf<'a> {
        if buf.capacity() < RECV_BUF_INITIAL {
            buf.reserve(RECV_BUF_INITIAL - buf.len());
        }
        let mut b = RecvBuf {
            buf,
            counted: 0,
            reserved: false,
            total,
            peak,
        };
        b.sync();
        b
    }

    /// Brings the server's total up to date with this buffer's capacity.
    fn sync(&mut self) {
        let cap = self.buf.capacity();
        if cap > self.counted {
            let now =
                self.total.fetch_add(cap - self.counted, Ordering::Relaxed) + cap - self.counted;
            self.peak.fetch_max(now, Ordering::Relaxed);
        } else if cap < self.counted {
            self.total.fetch_sub(self.counted - cap, Ordering::Relaxed);
        }
        self.counted = cap;
    }

    /// The room the next read needs: the rest of a reserved frame at the
    /// front, or else [`RECV_READ_MIN`] bytes (or what the frame at the
    /// front still needs, if less).
    fn wanted(&self) -> usize {
        match front(&self.buf) {
            Front::Partial(_, missing) if self.reserved => missing,
            Front::Partial(_, missing) => missing.min(RECV_READ_MIN),
            _ => RECV_READ_MIN,
        }
    }

    /// Whether the next read needs a larger buffer (the bytes buffered
    /// move to its start first, if that makes room).
    fn full(&mut self) -> bool {
        let want = self.wanted();
        self.buf.capacity() - self.buf.len() < want && !self.buf.try_reclaim(want)
    }

    /// Makes room for the next read ([`RecvBuf::wanted`]): a new buffer is
    /// exactly that large (never doubled), at least [`RECV_BUF_INITIAL`].
    fn prepare(&mut self) {
        if self.full() {
            self.move_to((self.buf.len() + self.wanted()).max(RECV_BUF_INITIAL));
        }
    }

    /// Moves the bytes buffered to a new buffer of `cap` bytes.
    fn move_to(&mut self, cap: usize) {
        let mut fresh = BytesMut::with_capacity(cap);
        fresh.extend_from_slice(&self.buf);
        self.buf = fresh;
        self.sync();
    }

    /// After a frame larger than [`RECV_BUF_INITIAL`] was taken: the bytes
    /// after it move to a buffer of their own, so that no later request
    /// keeps that frame's (reserved) buffer alive once it was handled.
    fn detach(&mut self) {
        self.move_to(RECV_BUF_INITIAL.max(self.buf.len()));
    }

    /// Reads what the socket has (see [`crate::recv_now`]).
    fn recv(&mut self, fd: std::os::fd::RawFd) -> std::io::Result<Option<usize>> {
        self.prepare();
        let r = crate::recv_now(fd, &mut self.buf, usize::MAX);
        self.sync();
        r
    }

    /// Whether the buffer is larger than it needs to be while idle.
    fn oversized(&self) -> bool {
        self.buf.capacity() > RECV_BUF_INITIAL && self.buf.len() <= RECV_BUF_INITIAL / 2
    }

    /// Goes back to a buffer of [`RECV_BUF_INITIAL`] (keeping what is
    /// buffered).
    fn shrink(&mut self) {
        self.move_to(RECV_BUF_INITIAL);
    }
}

impl Drop for RecvBuf<'_> {
    fn drop(&mut self) {
        self.total.fetch_sub(self.counted, Ordering::Relaxed);
    }
}

/// The length of the prefix of the frame with `header`, if its data
/// should be received in place (see [`Handler::direct_prefix`]). Not the
/// frame `declined` by the handler before.
fn direct_len<H: Handler>(
    header: &FrameHeader,
    handler: &H,
    declined: Option<u64>,
) -> Option<usize> {
    let prefix = handler.direct_prefix(header.kind)?;
    let data = header.payload_len.checked_sub(prefix)?;
    (data >= DIRECT_MIN && declined != Some(header.id)).then_some(prefix)
}

/// Receives the data of the frame at the front of `rbuf` (header and
/// prefix buffered) into the handler's sink: the bytes already buffered
/// by a copy, the rest straight from the socket. `Ok(None)`: the handler
/// declined (nothing consumed). `Err`: the connection must close (the
/// peer went away or stalled mid-frame; the sink is dropped).
async fn receive_direct<H: Handler>(
    rd: &ReadHalf,
    rbuf: &mut RecvBuf<'_>,
    handler: &H,
    header: FrameHeader,
    prefix_len: usize,
    opts: &ServeOptions,
) -> std::result::Result<Option<(Bytes, Box<dyn DirectSink>)>, String> {
    let data_len = header.payload_len - prefix_len;
    let prefix = &rbuf.buf[HEADER_LEN..HEADER_LEN + prefix_len];
    let asked = handler.direct_sink(header.kind, prefix, data_len);
    let sink = match tokio::time::timeout(opts.frame_timeout, asked).await {
        Ok(Ok(Some(sink))) => sink,
        _ => return Ok(None),
    };
    if sink.dest().1 != data_len {
        return Ok(None);
    }
    rbuf.buf.advance(HEADER_LEN);
    let prefix = rbuf.buf.split_to(prefix_len).freeze();
    let have = rbuf.buf.len().min(data_len);
    // SAFETY: the sink's memory is valid for `data_len` bytes (the
    // `DirectSink` contract) and is not our buffer.
    unsafe { std::ptr::copy_nonoverlapping(rbuf.buf.as_ptr(), sink.dest().0, have) };
    rbuf.buf.advance(have);
    rbuf.sync();
    let mut got = have;
    // The rest of the frame is on its way: poll for it a spin budget after
    // each progress before parking (each wake-up costs tens of
    // microseconds). Bytes in flight are always "soon", so no statistics.
    let mut spin = Spin::begin(opts.spin, SpinStats::default());
    let deadline = tokio::time::Instant::now() + opts.frame_timeout;
    let fd = rd.fd();
    while got < data_len {
        let step = rd.try_io(|| {
            // SAFETY: `dest + got .. dest + data_len` lies inside the
            // sink's memory.
            match unsafe { crate::recv_raw(fd, sink.dest().0.add(got), data_len - got) } {
                Ok(Some(n)) => Ok(n),
                Ok(None) => Err(std::io::ErrorKind::WouldBlock.into()),
                Err(e) => Err(e),
            }
        });
        match step {
            Ok(0) => return Err("the peer closed mid-frame".into()),
            Ok(n) => {
                got += n;
                spin = Spin::begin(opts.spin, SpinStats::default());
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    && spin.as_ref().is_some_and(Spin::again) =>
            {
                tokio::task::yield_now().await;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                spin = None;
                match tokio::time::timeout_at(deadline, rd.readable()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e.to_string()),
                    Err(_) => {
                        return Err(format!(
                            "a frame did not arrive completely within {:?}",
                            opts.frame_timeout
                        ))
                    }
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(Some((prefix, sink)))
}

/// Handles one request, holding a permit of the server's request bound
/// and its frame's bytes until it was handled, and its reply's bytes
/// until the reply was sent; returns its whole reply frame (with its
/// shared body, if any).
async fn handle_one<H: Handler>(
    handler: Arc<H>,
    header: FrameHeader,
    payload: Bytes,
    peer: Arc<str>,
    (_permit, _frame, reserved): (
        OwnedSemaphorePermit,
        Option<OwnedSemaphorePermit>,
        Option<OwnedSemaphorePermit>,
    ),
) -> Reply {
    let mut reply = Reply {
        out: BytesMut::with_capacity(256),
        body: None,
        reserved,
    };
    let start = FrameHeader::begin(&mut reply.out, header.id, STATUS_OK);
    let result = handler.handle_reply(header.kind, payload, &mut reply).await;
    finish_reply(&peer, header, start, result, reply)
}

/// Handles one request whose data went into `sink`, like [`handle_one`].
async fn handle_direct_one<H: Handler>(
    handler: Arc<H>,
    header: FrameHeader,
    prefix: Bytes,
    sink: Box<dyn DirectSink>,
    peer: Arc<str>,
    _permit: OwnedSemaphorePermit,
) -> Reply {
    let mut reply = Reply::default();
    let start = FrameHeader::begin(&mut reply.out, header.id, STATUS_OK);
    let result = handler
        .handle_direct(header.kind, prefix, sink, &mut reply.out)
        .await;
    finish_reply(&peer, header, start, result, reply)
}

/// Seals a reply begun at `start`, or replaces it with the error.
fn finish_reply(
    peer: &str,
    header: FrameHeader,
    start: usize,
    result: Result<()>,
    mut reply: Reply,
) -> Reply {
    let more = reply
        .body
        .as_ref()
        .map_or(0, |b| b.bytes().1 + b.trailer_len());
    if let Err(e) = result.and_then(|()| FrameHeader::seal_with(&mut reply.out, start, more)) {
        if e.code == ErrorCode::Protocol {
            tracing::debug!("bad request from {peer}: {e}");
        }
        reply.out.truncate(start);
        reply.body = None;
        push_error(&mut reply.out, header.id, &e);
    }
    reply
}

/// Reads whatever the socket has without blocking: `Some(true)` data,
/// `Some(false)` end of stream, `None` nothing yet.
fn try_fill(rd: &ReadHalf, buf: &mut RecvBuf<'_>) -> std::io::Result<Option<bool>> {
    // Inside `try_io`, so a WouldBlock clears the reactor's readiness.
    match rd.try_io(|| match buf.recv(rd.fd()) {
        Ok(None) => Err(std::io::ErrorKind::WouldBlock.into()),
        other => other,
    }) {
        Ok(Some(0)) => Ok(Some(false)),
        Ok(_) => Ok(Some(true)),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// Busy-polls for data for up to `spin`, straight on the descriptor,
/// yielding between polls so other tasks of this worker (another server's
/// connection, say) still run.
async fn spin_fill(
    rd: &ReadHalf,
    buf: &mut RecvBuf<'_>,
    spin: Duration,
    stats: SpinStats,
    spins: &AtomicU64,
) -> std::io::Result<Option<bool>> {
    let fd = rd.fd();
    let Some(spin) = Spin::begin(spin, stats) else {
        return Ok(None);
    };
    spins.fetch_add(1, Ordering::Relaxed);
    loop {
        match buf.recv(fd)? {
            Some(n) => return Ok(Some(n > 0)),
            None if spin.again() => tokio::task::yield_now().await,
            None => return Ok(None),
        }
    }
}

type PermitWait = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// One of the reservations a request needs before it is handled.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// A permit of the server's request bound ([`ServeOptions::max_requests`]).
    Request,
    /// Its frame's bytes ([`ServeOptions::max_request_bytes`]).
    Frame,
    /// Its reply's bytes ([`ServeOptions::max_reply_bytes`]).
    Reply,
}

/// What the frame at the front of a connection holds, and the one wait
/// it may be in for more: kept across turns of the loop, so the
/// connection keeps its place in each queue.
#[derive(Default)]
struct Holds {
    request: Option<OwnedSemaphorePermit>,
    frame: Option<OwnedSemaphorePermit>,
    reply: Option<OwnedSemaphorePermit>,
    wait: Option<(Hold, PermitWait)>,
}

impl Holds {
    fn slot(&mut self, which: Hold) -> &mut Option<OwnedSemaphorePermit> {
        match which {
            Hold::Request => &mut self.request,
            Hold::Frame => &mut self.frame,
            Hold::Reply => &mut self.reply,
        }
    }

    /// Whether `which` is held, taking it now if it is free; otherwise the
    /// connection waits for it (unless it waits for something else
    /// already).
    fn get(&mut self, which: Hold, state: &ServerState, bytes: usize) -> bool {
        if self.slot(which).is_some() {
            return true;
        }
        if self.wait.is_some() {
            return false;
        }
        let now = match which {
            Hold::Request => state.requests.clone().try_acquire_owned().ok(),
            Hold::Frame => state.request_bytes.try_take(bytes),
            Hold::Reply => state.reply_bytes.try_take(bytes),
        };
        match now {
            Some(p) => {
                if which != Hold::Request {
                    state.note_held();
                }
                *self.slot(which) = Some(p);
                true
            }
            None => {
                let wait = match which {
                    Hold::Request => Box::pin(state.requests.clone().acquire_owned()),
                    Hold::Frame => state.request_bytes.take(bytes),
                    Hold::Reply => state.reply_bytes.take(bytes),
                };
                self.wait = Some((which, wait));
                false
            }
        }
    }

    /// A permit of the request bound for the next request, if one is free
    /// (otherwise the connection waits for one).
    fn take_request(&mut self, state: &ServerState) -> Option<OwnedSemaphorePermit> {
        if self.get(Hold::Request, state, 1) {
            self.request.take()
        } else {
            None
        }
    }

    /// The wait ended with `p`.
    fn got(&mut self, p: OwnedSemaphorePermit, state: &ServerState) {
        if let Some((which, _)) = self.wait.take() {
            if which != Hold::Request {
                state.note_held();
            }
            *self.slot(which) = Some(p);
        }
    }
}

/// Serves the requests of one connection whose handshake is done.
async fn serve_requests<H: Handler>(
    stream: Stream,
    leftover: BytesMut,
    peer: Arc<str>,
    handler: Arc<H>,
    state: &ServerState,
    opts: ServeOptions,
) {
    let (rd, wr) = stream.split();
    let mut wr = BufWriter::with_capacity(REPLY_BUF, wr);
    let mut rbuf = RecvBuf::new(leftover, &state.recv_bytes, &state.recv_bytes_peak);
    let mut pending = FuturesUnordered::new();
    let mut eof = false;
    // What the next request holds and waits for.
    let mut holds = Holds::default();
    // Bytes reserved for this connection's replies not sent yet.
    let mut replies_held = 0usize;
    // How soon this connection's requests come after it went idle.
    let mut spin_stats = SpinStats::default();
    let mut idle_since: Option<Instant> = None;
    // A frame whose data the handler would not take in place.
    let mut declined: Option<u64> = None;
    // When the frame at the front must be complete (set while the server
    // waits for its bytes).
    let mut frame_deadline: Option<tokio::time::Instant> = None;
    loop {
        // Start every complete request, up to the bounds.
        let mut blocked = false;
        // Blocked until this connection's replies go out.
        let mut replies_wait = false;
        while pending.len() < opts.max_in_flight {
            let at_front = front_for(&rbuf.buf, &*handler);
            if let Front::Partial(header, _) = at_front {
                if let Some(prefix_len) = direct_len(&header, &*handler, declined) {
                    if rbuf.buf.len() < HEADER_LEN + prefix_len {
                        break; // its prefix first
                    }
                    let Some(p) = holds.take_request(state) else {
                        blocked = true;
                        break;
                    };
                    let got = receive_direct(&rd, &mut rbuf, &*handler, header, prefix_len, &opts);
                    match got.await {
                        Ok(Some((prefix, sink))) => {
                            frame_deadline = None;
                            let h = handler.clone();
                            let done = handle_direct_one(h, header, prefix, sink, peer.clone(), p);
                            pending.push(Either::Right(done));
                            continue;
                        }
                        Ok(None) => {
                            // The usual path for this frame.
                            declined = Some(header.id);
                            holds.request = Some(p);
                        }
                        Err(why) => {
                            tracing::debug!("closing connection from {peer}: {why}");
                            return;
                        }
                    }
                }
            }
            match at_front {
                Front::Short => break,
                Front::Partial(header, _) => {
                    // Its bytes are reserved before the buffer grows for it.
                    if let Some(n) = frame_reservation(header.payload_len) {
                        if rbuf.full() {
                            blocked = !holds.get(Hold::Frame, state, n);
                        }
                    }
                    break;
                }
                Front::Bad(id, e) => {
                    // The stream is unsynchronised: answer, then close.
                    state.malformed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!("closing connection from {peer}: {e}");
                    let mut out = BytesMut::new();
                    push_error(&mut out, id, &e);
                    if write_bounded(&mut wr, &out, opts.frame_timeout)
                        .await
                        .is_ok()
                    {
                        let _ = flush_bounded(&mut wr, opts.frame_timeout).await;
                    }
                    return;
                }
                Front::Frame(header) => {
                    if let Some(n) = frame_reservation(header.payload_len) {
                        if !holds.get(Hold::Frame, state, n) {
                            blocked = true;
                            break;
                        }
                    }
                    let payload = &rbuf.buf[HEADER_LEN..HEADER_LEN + header.payload_len];
                    let reply = handler.reply_len(header.kind, payload);
                    if reply > 0 {
                        // A connection whose replies wait for their peer
                        // takes no more requests (it may always have one).
                        if holds.reply.is_none()
                            && replies_held > 0
                            && replies_held + reply > opts.max_connection_reply_bytes
                        {
                            blocked = true;
                            replies_wait = true;
                            break;
                        }
                        if !holds.get(Hold::Reply, state, reply) {
                            blocked = true;
                            break;
                        }
                    }
                    let Some(p) = holds.take_request(state) else {
                        blocked = true;
                        break;
                    };
                    let payload = take_frame(&mut rbuf.buf, header);
                    if header.payload_len > RECV_BUF_INITIAL {
                        rbuf.detach();
                    }
                    frame_deadline = None;
                    let reserved = holds.reply.take();
                    replies_held += reserved.as_ref().map_or(0, |r| r.num_permits());
                    let held = (p, holds.frame.take(), reserved);
                    let done = handle_one(handler.clone(), header, payload, peer.clone(), held);
                    pending.push(Either::Left(done));
                }
            }
        }
        rbuf.reserved = holds.frame.is_some();
        rbuf.sync();
        // Send every reply that is already done.
        let mut sent = false;
        while let Some(Some(reply)) = pending.next().now_or_never() {
            replies_held -= reply.reserved_bytes();
            sent = true;
            if write_reply(&mut wr, &rd, reply, opts.frame_timeout)
                .await
                .is_err()
            {
                return;
            }
        }
        if replies_wait && sent {
            continue; // there may be room for the next request now
        }
        if eof && pending.is_empty() && !blocked {
            let _ = flush_bounded(&mut wr, opts.frame_timeout).await;
            return; // the peer closed (a truncated frame is dropped)
        }
        let can_read = !eof && !blocked && pending.len() < opts.max_in_flight;
        if can_read
            && matches!(
                front_for(&rbuf.buf, &*handler),
                Front::Frame(_) | Front::Bad(..)
            )
        {
            continue;
        }
        if !wr.buffer().is_empty() && flush_bounded(&mut wr, opts.frame_timeout).await.is_err() {
            return;
        }
        if can_read && !rbuf.buf.is_empty() {
            // Waiting for the rest of a frame: bounded.
            frame_deadline.get_or_insert_with(|| tokio::time::Instant::now() + opts.frame_timeout);
        } else {
            frame_deadline = None;
        }
        // Checked here too, not only when parked: a peer that trickles a
        // byte at a time keeps the spin below from ever parking.
        if frame_deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            log_frame_timeout(&peer, opts.frame_timeout);
            let _ = flush_bounded(&mut wr, opts.frame_timeout).await;
            return;
        }
        if pending.is_empty() && can_read && !opts.spin.is_zero() {
            // Idle: busy-poll briefly for the next request before parking,
            // if this connection's requests usually come that soon.
            let since = *idle_since.get_or_insert_with(Instant::now);
            match spin_fill(&rd, &mut rbuf, opts.spin, spin_stats, &state.idle_spins).await {
                Ok(Some(more)) => {
                    spin_stats.record(since.elapsed(), opts.spin);
                    idle_since = None;
                    eof |= !more;
                    continue;
                }
                Ok(None) => {}
                Err(_) => return,
            }
        }
        let idle = can_read && pending.is_empty() && rbuf.oversized();
        tokio::select! {
            Some(reply) = pending.next(), if !pending.is_empty() => {
                replies_held -= reply.reserved_bytes();
                if write_reply(&mut wr, &rd, reply, opts.frame_timeout).await.is_err() {
                    return;
                }
            }
            ready = rd.readable(), if can_read => {
                if ready.is_err() {
                    return;
                }
                match try_fill(&rd, &mut rbuf) {
                    Ok(Some(true)) => {
                        if let Some(since) = idle_since.take() {
                            spin_stats.record(since.elapsed(), opts.spin);
                        }
                    }
                    Ok(None) => {}
                    Ok(Some(false)) => eof = true,
                    Err(_) => return,
                }
            }
            p = async { (&mut holds.wait.as_mut().expect("waiting").1).await }, if holds.wait.is_some() => {
                match p {
                    Ok(p) => holds.got(p, state),
                    Err(_) => return, // the semaphores are never closed
                }
            }
            () = tokio::time::sleep_until(
                frame_deadline.unwrap_or_else(tokio::time::Instant::now)
            ), if frame_deadline.is_some() => {
                log_frame_timeout(&peer, opts.frame_timeout);
                let _ = flush_bounded(&mut wr, opts.frame_timeout).await;
                return;
            }
            () = tokio::time::sleep(RECV_SHRINK_AFTER), if idle => rbuf.shrink(),
        }
    }
}

fn log_frame_timeout(peer: &str, timeout: Duration) {
    tracing::debug!(
        "closing connection from {peer}: a frame did not arrive completely within {timeout:?}"
    );
}

type Replies = BufWriter<crate::transport::WriteHalf>;

/// Writes `buf` to the peer, failing when it takes no byte for `stall`: a
/// peer that stopped reading its replies must not keep its requests (and
/// their permits of the server-wide bound) forever.
async fn write_bounded(wr: &mut Replies, buf: &[u8], stall: Duration) -> std::io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        match tokio::time::timeout(stall, wr.write(&buf[off..])).await {
            Ok(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => off += n,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(stalled_writing(stall)),
        }
    }
    Ok(())
}

/// Writes a reply: its frame bytes (buffered), then any shared body
/// straight from its memory, then the body's trailer. `sock` is the
/// connection's socket (its read half), for sending the body directly.
async fn write_reply(
    wr: &mut Replies,
    sock: &ReadHalf,
    reply: Reply,
    stall: Duration,
) -> std::io::Result<()> {
    write_bounded(wr, &reply.out, stall).await?;
    let Some(body) = reply.body else {
        return Ok(());
    };
    // The frame's first bytes go out before the body's.
    flush_bounded(wr, stall).await?;
    let len = body.bytes().1;
    let mut sent = 0;
    while sent < len {
        let r = sock.try_write_io(|| {
            let (ptr, _) = body.bytes();
            // SAFETY: `SharedBody`'s contract: `ptr` is readable for `len`
            // bytes while `body` lives. send(2) only reads them.
            let n = unsafe {
                libc::send(
                    sock.fd(),
                    ptr.add(sent).cast(),
                    len - sent,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match r {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                match tokio::time::timeout(stall, sock.writable()).await {
                    Ok(r) => r?,
                    Err(_) => return Err(stalled_writing(stall)),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let mut trailer = BytesMut::with_capacity(body.trailer_len());
    body.seal(&mut trailer);
    debug_assert_eq!(trailer.len(), body.trailer_len());
    write_bounded(wr, &trailer, stall).await
}

/// Flushes the buffered replies (at most [`REPLY_BUF`] bytes), failing when
/// that takes longer than `stall`.
async fn flush_bounded(wr: &mut Replies, stall: Duration) -> std::io::Result<()> {
    match tokio::time::timeout(stall, wr.flush()).await {
        Ok(r) => r,
        Err(_) => Err(stalled_writing(stall)),
    }
}

fn stalled_writing(stall: Duration) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("the peer took no reply bytes for {stall:?}"),
    )
}

pub(crate) fn push_error(out: &mut BytesMut, id: u64, e: &Error) {
    let msg = e.message.as_bytes();
    let msg = &msg[..msg.len().min(MAX_ERROR_MESSAGE)];
    FrameHeader::put(out, id, e.code as u16, msg.len());
    out.extend_from_slice(msg);
}
