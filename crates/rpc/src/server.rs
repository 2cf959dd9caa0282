use crate::transport::{Listener, ReadHalf, Stream};
use bytes::{Buf, Bytes, BytesMut};
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use nodekernel_proto::frame::STATUS_OK;
use nodekernel_proto::{Error, ErrorCode, FrameHeader, Result, HEADER_LEN};
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::{TcpListener, UnixListener};
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
}

/// Settings of a server's connections.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// How long an idle connection busy-polls for the next request before
    /// parking (0 disables spinning).
    pub spin: Duration,
    /// Requests of one connection handled concurrently; replies go out as
    /// they complete (the client matches them by id).
    pub max_in_flight: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            spin: crate::default_spin(),
            max_in_flight: 64,
        }
    }
}

/// A running server. Dropping it (or calling [`ServerHandle::shutdown`])
/// stops accepting and closes every connection.
pub struct ServerHandle {
    /// The TCP address served; `None` for a Unix-socket server.
    addr: Option<SocketAddr>,
    task: JoinHandle<()>,
    /// Duplicates of the listening socket and of every open connection, so
    /// `shutdown` takes effect synchronously: the aborted tasks are only
    /// dropped once the runtime gets to them, and a connection could
    /// otherwise serve one more request.
    sockets: Arc<Sockets>,
}

#[derive(Default)]
struct Sockets {
    listener: std::sync::Mutex<Option<OwnedFd>>,
    conns: std::sync::Mutex<std::collections::HashMap<u64, OwnedFd>>,
    stopped: std::sync::atomic::AtomicBool,
    /// Wakes the accept loop: a shut-down Unix listener keeps reporting
    /// readiness while `accept` finds nothing, so the loop must not rely on
    /// an accept error to notice the end.
    stop: tokio::sync::Notify,
}

impl Sockets {
    fn shutdown_all(&self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::SeqCst);
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
}

/// Removes a connection from the registry when its task ends.
struct Registered {
    sockets: Arc<Sockets>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.sockets
            .conns
            .lock()
            .expect("sockets lock")
            .remove(&self.id);
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
        self.sockets.shutdown_all();
        self.task.abort();
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

fn serve_listener<H: Handler>(
    listener: Listener,
    addr: Option<SocketAddr>,
    handler: Arc<H>,
    opts: ServeOptions,
) -> Result<ServerHandle> {
    let sockets = Arc::new(Sockets::default());
    *sockets.listener.lock().expect("sockets lock") = Some(
        listener
            .dup()
            .map_err(|e| crate::io_error("duplicating the listening socket", e))?,
    );
    let registry = sockets.clone();
    let opts = ServeOptions {
        max_in_flight: opts.max_in_flight.max(1),
        ..opts
    };
    let task = tokio::spawn(async move {
        // Connections live in this set: aborting the accept task drops the
        // set, which aborts every connection task with it.
        let mut conns = JoinSet::new();
        let mut next_id = 0u64;
        loop {
            tokio::select! {
                biased;
                () = registry.stop.notified() => return,
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let Ok(dup) = stream.dup() else {
                            continue; // out of descriptors: drop this connection
                        };
                        next_id += 1;
                        registry.conns.lock().expect("sockets lock").insert(next_id, dup);
                        if registry.stopped.load(std::sync::atomic::Ordering::SeqCst) {
                            registry.shutdown_all();
                        }
                        let guard = Registered { sockets: registry.clone(), id: next_id };
                        let handler = handler.clone();
                        conns.spawn(async move {
                            let _guard = guard;
                            connection(stream, peer, handler, opts).await
                        });
                    }
                    // A listener shut down by `ServerHandle::shutdown`.
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => return,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
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
        sockets,
    })
}

/// Takes the next complete frame off `buf`. A bad header is fatal for the
/// connection: it yields the request id (if readable) and the error.
fn next_frame(
    buf: &mut BytesMut,
) -> std::result::Result<Option<(FrameHeader, Bytes)>, (u64, Error)> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let h: [u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("length checked");
    let header = FrameHeader::parse(&h).map_err(|e| {
        let id = u64::from_le_bytes(h[4..12].try_into().expect("8 bytes"));
        (id, e)
    })?;
    if buf.len() < HEADER_LEN + header.payload_len {
        buf.reserve(HEADER_LEN + header.payload_len - buf.len());
        return Ok(None);
    }
    buf.advance(HEADER_LEN);
    Ok(Some((header, buf.split_to(header.payload_len).freeze())))
}

/// Handles one request; returns its whole reply frame.
async fn handle_one<H: Handler>(
    handler: Arc<H>,
    header: FrameHeader,
    payload: Bytes,
    peer: Arc<str>,
) -> BytesMut {
    let mut out = BytesMut::with_capacity(256);
    let start = FrameHeader::begin(&mut out, header.id, STATUS_OK);
    let result = handler.handle(header.kind, payload, &mut out).await;
    if let Err(e) = result.and_then(|()| FrameHeader::seal(&mut out, start)) {
        if e.code == ErrorCode::Protocol {
            tracing::debug!("bad request from {peer}: {e}");
        }
        out.truncate(start);
        push_error(&mut out, header.id, &e);
    }
    out
}

/// Reads whatever the socket has without blocking: `Some(true)` data,
/// `Some(false)` end of stream, `None` nothing yet.
fn try_fill(rd: &ReadHalf, buf: &mut BytesMut) -> std::io::Result<Option<bool>> {
    // Inside `try_io`, so a WouldBlock clears the reactor's readiness.
    match rd.try_io(|| match crate::recv_now(rd.fd(), buf) {
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
    buf: &mut BytesMut,
    spin: Duration,
) -> std::io::Result<Option<bool>> {
    let fd = rd.fd();
    let start = Instant::now();
    while start.elapsed() < spin {
        match crate::recv_now(fd, buf)? {
            Some(0) => return Ok(Some(false)),
            Some(_) => return Ok(Some(true)),
            None => tokio::task::yield_now().await,
        }
    }
    Ok(None)
}

async fn connection<H: Handler>(stream: Stream, peer: String, handler: Arc<H>, opts: ServeOptions) {
    let peer: Arc<str> = peer.into();
    let (rd, wr) = stream.split();
    let mut wr = BufWriter::with_capacity(64 * 1024, wr);
    let mut rbuf = BytesMut::with_capacity(256 * 1024);
    let mut pending = FuturesUnordered::new();
    let mut eof = false;
    loop {
        // Start every complete request, up to the in-flight bound.
        while pending.len() < opts.max_in_flight {
            match next_frame(&mut rbuf) {
                Ok(Some((header, payload))) => {
                    pending.push(handle_one(handler.clone(), header, payload, peer.clone()))
                }
                Ok(None) => break,
                Err((id, e)) => {
                    // The stream is unsynchronised: answer, then close.
                    tracing::debug!("closing connection from {peer}: {e}");
                    let mut out = BytesMut::new();
                    push_error(&mut out, id, &e);
                    let _ = wr.write_all(&out).await;
                    let _ = wr.flush().await;
                    return;
                }
            }
        }
        // Send every reply that is already done.
        while let Some(Some(reply)) = pending.next().now_or_never() {
            if wr.write_all(&reply).await.is_err() {
                return;
            }
        }
        if eof && pending.is_empty() {
            let _ = wr.flush().await;
            return; // the peer closed (a truncated frame is dropped)
        }
        let can_read = !eof && pending.len() < opts.max_in_flight;
        if can_read && next_frame_ready(&rbuf) {
            continue;
        }
        if !wr.buffer().is_empty() && wr.flush().await.is_err() {
            return;
        }
        if pending.is_empty() && can_read && !opts.spin.is_zero() {
            // Idle: busy-poll briefly for the next request before parking.
            match spin_fill(&rd, &mut rbuf, opts.spin).await {
                Ok(Some(more)) => {
                    eof |= !more;
                    continue;
                }
                Ok(None) => {}
                Err(_) => return,
            }
        }
        tokio::select! {
            Some(reply) = pending.next(), if !pending.is_empty() => {
                if wr.write_all(&reply).await.is_err() {
                    return;
                }
            }
            ready = rd.readable(), if can_read => {
                if ready.is_err() {
                    return;
                }
                match try_fill(&rd, &mut rbuf) {
                    Ok(Some(true)) | Ok(None) => {}
                    Ok(Some(false)) => eof = true,
                    Err(_) => return,
                }
            }
        }
    }
}

/// Whether `buf` holds at least one complete frame (or a bad header).
fn next_frame_ready(buf: &BytesMut) -> bool {
    if buf.len() < HEADER_LEN {
        return false;
    }
    let h: [u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("length checked");
    match FrameHeader::parse(&h) {
        Ok(hdr) => buf.len() >= HEADER_LEN + hdr.payload_len,
        Err(_) => true,
    }
}

fn push_error(out: &mut BytesMut, id: u64, e: &Error) {
    let msg = e.message.as_bytes();
    let msg = &msg[..msg.len().min(64 * 1024)];
    FrameHeader::put(out, id, e.code as u16, msg.len());
    out.extend_from_slice(msg);
}
