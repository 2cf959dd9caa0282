//! The server end: an accept loop, and one task per connection that runs the
//! handshake, then reads frames, hands each request to the [`Handler`] and
//! writes the replies.
//!
//! Every resource a peer can make the server hold is bounded (see
//! [`crate::limits`]): open connections ([`ServeOptions::max_connections`]),
//! requests being handled per connection and per server, bytes buffered for
//! an unfinished frame (receive buffers grow only as bytes arrive, and shrink
//! back when idle), and the time a handshake or a frame may take.

use crate::handshake::{HandshakeIo, ServerHandshake, VersionHandshake};
use crate::limits::{
    FRAME_TIMEOUT, HANDSHAKE_TIMEOUT, LIMIT_WARN_INTERVAL, MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_PEER, MAX_ERROR_MESSAGE, MAX_IN_FLIGHT, MAX_REQUESTS, RECV_BUF_INITIAL,
    RECV_GROW_STEP, RECV_READ_MIN, RECV_SHRINK_AFTER, REPLY_BUF,
};
use crate::spin::{Spin, SpinStats};
use crate::transport::{Listener, LocalPeers, ReadHalf, Stream};
use bytes::{Buf, Bytes, BytesMut};
use futures::future::Either;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use nodekernel_proto::frame::STATUS_OK;
use nodekernel_proto::hello::Role;
use nodekernel_proto::{Error, ErrorCode, FrameHeader, Result, HEADER_LEN};
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
}

impl Reply {
    /// An empty reply (the server makes one per request; for tests of
    /// handlers).
    pub fn new() -> Reply {
        Reply {
            out: BytesMut::new(),
            body: None,
        }
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
    /// and closed at once.
    pub max_connections: usize,
    /// Open connections of one peer (an IP address, or a local user on a
    /// Unix socket), so one client cannot take them all; refused like
    /// those beyond `max_connections`.
    pub max_connections_per_peer: usize,
    /// Requests handled at once across all connections of this server; a
    /// request beyond it waits for another to finish.
    pub max_requests: usize,
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
            max_requests: MAX_REQUESTS,
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
    /// Capacity of every connection's receive buffer, summed.
    recv_bytes: AtomicUsize,
    /// The largest value `recv_bytes` has had.
    recv_bytes_peak: AtomicUsize,
    /// Connections closed because of a frame that could not be parsed.
    malformed: AtomicU64,
    /// Connections refused because `max_connections` were open.
    refused: AtomicU64,
    /// Idle connections that busy-polled for their next request.
    idle_spins: AtomicU64,
}

/// Duplicates of the listening socket and of every open connection, so
/// `shutdown` takes effect synchronously: the aborted tasks are only
/// dropped once the runtime gets to them, and a connection could otherwise
/// serve one more request.
#[derive(Default)]
struct Sockets {
    listener: std::sync::Mutex<Option<OwnedFd>>,
    conns: std::sync::Mutex<std::collections::HashMap<u64, OwnedFd>>,
    /// Open connections by peer (IP address, or local user).
    per_peer: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    stopped: AtomicBool,
    /// Wakes the accept loop: a shut-down Unix listener keeps reporting
    /// readiness while `accept` finds nothing, so the loop must not rely on
    /// an accept error to notice the end.
    stop: tokio::sync::Notify,
}

impl Sockets {
    fn shutdown_all(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.stop.notify_one();
        let close = |fd: &OwnedFd| {
            // shutdown(2) ends a listener's accepting and a connection's
            // traffic at once. SAFETY: a plain system call on a descriptor
            // we own.
            unsafe {
                libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR);
            }
        };
        if let Some(fd) = self.listener.lock().expect("sockets lock").as_ref() {
            close(fd);
        }
        for fd in self.conns.lock().expect("sockets lock").values() {
            close(fd);
        }
    }

    fn open(&self) -> usize {
        self.conns.lock().expect("sockets lock").len()
    }
}

/// Removes a connection from the registry when its task ends.
struct Registered {
    state: Arc<ServerState>,
    id: u64,
    peer: String,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let sockets = &self.state.sockets;
        sockets.conns.lock().expect("sockets lock").remove(&self.id);
        let mut per_peer = sockets.per_peer.lock().expect("sockets lock");
        if let Some(n) = per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                per_peer.remove(&self.peer);
            }
        }
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
    let opts = ServeOptions {
        max_in_flight: opts.max_in_flight.max(1),
        max_connections: opts.max_connections.max(1),
        max_connections_per_peer: opts.max_connections_per_peer.max(1),
        max_requests: opts.max_requests.clamp(1, Semaphore::MAX_PERMITS),
        ..opts
    };
    let state = Arc::new(ServerState {
        sockets: Sockets::default(),
        requests: Arc::new(Semaphore::new(opts.max_requests)),
        recv_bytes: AtomicUsize::new(0),
        recv_bytes_peak: AtomicUsize::new(0),
        malformed: AtomicU64::new(0),
        refused: AtomicU64::new(0),
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
        let mut accept_errors = RateLimited::default();
        loop {
            tokio::select! {
                biased;
                () = st.sockets.stop.notified() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer, peer_key)) => {
                        let open = st.sockets.open();
                        if open >= opts.max_connections {
                            st.refused.fetch_add(1, Ordering::Relaxed);
                            if let Some(suppressed) = refusals.allow() {
                                tracing::warn!(
                                    "refused a connection from {peer}: {open} connections are \
                                     open, the limit (max_connections); {suppressed} more \
                                     refused since the last warning"
                                );
                            }
                            refuse_at_once(&stream, &Error::unavailable(format!(
                                "the server has {} open connections, its limit; try again later",
                                opts.max_connections
                            )));
                            continue;
                        }
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
                        {
                            let mut per_peer = st.sockets.per_peer.lock().expect("sockets lock");
                            let n = per_peer.entry(peer_key.clone()).or_insert(0);
                            if *n >= opts.max_connections_per_peer {
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
                            *n += 1;
                        }
                        next_id += 1;
                        st.sockets.conns.lock().expect("sockets lock").insert(next_id, dup);
                        if st.sockets.stopped.load(Ordering::SeqCst) {
                            st.sockets.shutdown_all();
                        }
                        let guard = Registered { state: st.clone(), id: next_id, peer: peer_key };
                        let handler = handler.clone();
                        let handshake = handshake.clone();
                        let state = st.clone();
                        conns.spawn(async move {
                            let _guard = guard;
                            connection(stream, peer, handler, handshake, state, opts).await
                        });
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
    let peer: Arc<str> = io.peer().into();
    let (stream, leftover) = io.into_parts();
    serve_requests(stream, leftover, peer, handler, &state, opts).await;
}

/// What the front of a receive buffer holds.
enum Front {
    /// Less than a header, or a header and part of its payload (with the
    /// number of bytes still missing).
    Partial(Option<usize>),
    /// A complete frame.
    Frame,
    /// A header that cannot be parsed: the request id (as read) and why.
    Bad(u64, Error),
}

fn front(buf: &[u8]) -> Front {
    if buf.len() < HEADER_LEN {
        return Front::Partial(None);
    }
    let h: [u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("length checked");
    match FrameHeader::parse(&h) {
        Ok(hdr) if buf.len() >= HEADER_LEN + hdr.payload_len => Front::Frame,
        Ok(hdr) => Front::Partial(Some(HEADER_LEN + hdr.payload_len - buf.len())),
        Err(e) => Front::Bad(u64::from_le_bytes(h[4..12].try_into().expect("8 bytes")), e),
    }
}

/// Takes the complete frame at the front of `buf` (see [`front`]).
fn take_frame(buf: &mut BytesMut) -> (FrameHeader, Bytes) {
    let h: [u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("length checked");
    let header = FrameHeader::parse(&h).expect("checked by front()");
    buf.advance(HEADER_LEN);
    (header, buf.split_to(header.payload_len).freeze())
}

/// A connection's receive buffer, counted in the server's total. It grows
/// only as bytes arrive (see [`RECV_GROW_STEP`]), never from a declared frame
/// length alone.
struct RecvBuf<'a> {
    buf: BytesMut,
    counted: usize,
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

    /// Makes room for the next read: when less than [`RECV_READ_MIN`] is
    /// free, grows by at most `max(RECV_GROW_STEP, bytes buffered)`, and by
    /// no more than the frame at the front still needs.
    fn prepare(&mut self) {
        let len = self.buf.len();
        if self.buf.capacity() - len >= RECV_READ_MIN {
            return;
        }
        let step = RECV_GROW_STEP.max(len);
        let want = match front(&self.buf) {
            Front::Partial(Some(missing)) => missing.min(step),
            _ => RECV_GROW_STEP,
        };
        self.buf.reserve(want.max(RECV_READ_MIN));
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
        let mut fresh = BytesMut::with_capacity(RECV_BUF_INITIAL);
        fresh.extend_from_slice(&self.buf);
        self.buf = fresh;
        self.sync();
    }
}

impl Drop for RecvBuf<'_> {
    fn drop(&mut self) {
        self.total.fetch_sub(self.counted, Ordering::Relaxed);
    }
}

/// A permit of the server-wide request bound for the next request: the
/// one held, or a free one. `None` when there is none, or when a queued
/// wait for one is pending (it may hold a permit handed to it).
fn take_permit(
    held: &mut Option<OwnedSemaphorePermit>,
    waiting: &Option<PermitWait>,
    requests: &Arc<Semaphore>,
) -> Option<OwnedSemaphorePermit> {
    match held.take() {
        Some(p) => Some(p),
        None if waiting.is_some() => None,
        None => requests.clone().try_acquire_owned().ok(),
    }
}

/// The frame at the front of `buf`, if it should be received in place:
/// its header and the length of its prefix, once the prefix is buffered
/// (see [`Handler::direct_prefix`]). Not the frame `declined` by the
/// handler before.
fn direct_front<H: Handler>(
    buf: &[u8],
    handler: &H,
    declined: Option<u64>,
) -> Option<(FrameHeader, usize)> {
    let h: [u8; HEADER_LEN] = buf.get(..HEADER_LEN)?.try_into().ok()?;
    let header = FrameHeader::parse(&h).ok()?;
    let prefix = handler.direct_prefix(header.kind)?;
    let data = header.payload_len.checked_sub(prefix)?;
    let wanted = data >= DIRECT_MIN
        && declined != Some(header.id)
        && buf.len() >= HEADER_LEN + prefix
        && buf.len() < HEADER_LEN + header.payload_len;
    wanted.then_some((header, prefix))
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

/// Handles one request, holding a permit of the server's request bound;
/// returns its whole reply frame (with its shared body, if any).
async fn handle_one<H: Handler>(
    handler: Arc<H>,
    header: FrameHeader,
    payload: Bytes,
    peer: Arc<str>,
    _permit: OwnedSemaphorePermit,
) -> Reply {
    let mut reply = Reply {
        out: BytesMut::with_capacity(256),
        body: None,
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
    // A permit of the server-wide bound, taken for the next request while
    // waiting for it; and the wait itself, kept across turns of the loop so
    // the connection keeps its place in the semaphore's queue.
    let mut permit: Option<OwnedSemaphorePermit> = None;
    let mut permit_wait: Option<PermitWait> = None;
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
        while pending.len() < opts.max_in_flight {
            let at_front = front(&rbuf.buf);
            let direct = match at_front {
                Front::Partial(Some(_)) => direct_front(&rbuf.buf, &*handler, declined),
                _ => None,
            };
            if let Some((header, prefix_len)) = direct {
                let Some(p) = take_permit(&mut permit, &permit_wait, &state.requests) else {
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
                        permit = Some(p);
                        break;
                    }
                    Err(why) => {
                        tracing::debug!("closing connection from {peer}: {why}");
                        return;
                    }
                }
            }
            match at_front {
                Front::Partial(_) => break,
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
                Front::Frame => {
                    let Some(p) = take_permit(&mut permit, &permit_wait, &state.requests) else {
                        blocked = true;
                        break;
                    };
                    let (header, payload) = take_frame(&mut rbuf.buf);
                    frame_deadline = None;
                    let done = handle_one(handler.clone(), header, payload, peer.clone(), p);
                    pending.push(Either::Left(done));
                }
            }
        }
        rbuf.sync();
        // Send every reply that is already done.
        while let Some(Some(reply)) = pending.next().now_or_never() {
            if write_reply(&mut wr, &rd, reply, opts.frame_timeout)
                .await
                .is_err()
            {
                return;
            }
        }
        if eof && pending.is_empty() && !blocked {
            let _ = flush_bounded(&mut wr, opts.frame_timeout).await;
            return; // the peer closed (a truncated frame is dropped)
        }
        let can_read = !eof && !blocked && pending.len() < opts.max_in_flight;
        if can_read && matches!(front(&rbuf.buf), Front::Frame | Front::Bad(..)) {
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
        if blocked && permit_wait.is_none() {
            permit_wait = Some(Box::pin(state.requests.clone().acquire_owned()));
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
            p = async { permit_wait.as_mut().expect("set when blocked").await }, if blocked => {
                permit_wait = None;
                match p {
                    Ok(p) => permit = Some(p),
                    Err(_) => return, // the semaphore is never closed
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
