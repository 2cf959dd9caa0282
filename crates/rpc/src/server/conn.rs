//! One connection of a server: its handshake ([`connection`]), then its
//! requests ([`serve_requests`]), a loop of named steps over the
//! connection's state ([`Serving`]): admit the complete requests at the
//! front of the receive buffer as far as the bounds allow
//! ([`Serving::admit`]), send the replies already done
//! ([`Serving::send_done`]), flush, check the frame deadline, spin briefly
//! when idle ([`Serving::spin_for_request`]), then wait for whichever
//! comes first ([`Serving::wait`]): a reply, more bytes, a reservation,
//! the frame deadline, or the time to shrink an idle receive buffer.

use crate::handshake::{HandshakeIo, ServerHandshake};
use crate::limits::{RECV_BUF_INITIAL, RECV_SHRINK_AFTER, REPLY_BUF};
use crate::server::budget::{Held, Hold, Holds};
use crate::server::handler::{DirectSink, Handler, Reply};
use crate::server::options::ServeOptions;
use crate::server::recv::{
    direct_len, frame_reservation, front_for, receive_direct, spin_fill, take_frame, try_fill,
    Front, RecvBuf,
};
use crate::server::send::{
    flush_bounded, handle_direct_one, handle_one, write_bounded, write_reply, Replies,
};
use crate::server::state::{Registered, ServerState};
use crate::sock::push_error;
use crate::spin::SpinStats;
use crate::transport::{ReadHalf, Stream};
use bytes::{Bytes, BytesMut};
use futures::future::Either;
use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use nodekernel_proto::{Error, ErrorCode, FrameHeader, HEADER_LEN};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::BufWriter;
use tokio::sync::{AcquireError, OwnedSemaphorePermit};

/// One connection: the handshake, then requests until the peer closes.
pub(super) async fn connection<H: Handler>(
    stream: Stream,
    peer: String,
    registered: Registered,
    handler: Arc<H>,
    handshake: Arc<dyn ServerHandshake>,
    state: Arc<ServerState>,
    opts: ServeOptions,
) {
    let mut io = HandshakeIo::new(stream, peer);
    let tenant = match tokio::time::timeout(opts.handshake_timeout, handshake.accept(&mut io)).await
    {
        Ok(Ok(info)) => {
            tracing::debug!(
                "connection from {} ({}, wire version {}{})",
                io.peer(),
                info.role,
                info.version,
                info.tenant
                    .as_ref()
                    .map_or(String::new(), |t| format!(", tenant {t}"))
            );
            info.tenant
        }
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
    };
    if !state.sockets.established(registered.id) {
        return; // closed meanwhile to make room
    }
    let peer: Arc<str> = io.peer().into();
    let (stream, leftover) = io.into_parts();
    serve_requests(stream, leftover, peer, tenant, handler, &state, opts).await;
}

/// Serves the requests of one connection whose handshake is done.
async fn serve_requests<H: Handler>(
    stream: Stream,
    leftover: BytesMut,
    peer: Arc<str>,
    tenant: Option<Arc<str>>,
    handler: Arc<H>,
    state: &ServerState,
    opts: ServeOptions,
) {
    let mut conn = Serving::new(stream, leftover, peer, handler, state, opts);
    let tenant = &tenant;
    let mut pending = FuturesUnordered::new();
    loop {
        // Start every complete request, up to the bounds.
        let mut gate = Gate::Open;
        while pending.len() < opts.max_in_flight {
            let Ok(admitted) = conn.admit().await else {
                return;
            };
            match admitted {
                Admit::Request(header, payload, held) => {
                    let (h, peer) = (conn.handler.clone(), conn.peer.clone());
                    let done = handle_one(h, header, payload, peer, tenant.clone(), held);
                    pending.push(Either::Left(done));
                }
                Admit::Direct(header, prefix, sink, permit) => {
                    let (h, peer) = (conn.handler.clone(), conn.peer.clone());
                    let done =
                        handle_direct_one(h, header, prefix, sink, peer, tenant.clone(), permit);
                    pending.push(Either::Right(done));
                }
                Admit::Stop(why) => {
                    gate = why;
                    break;
                }
            }
        }
        conn.note_frame_hold();
        let Ok(sent) = conn.send_done(&mut pending).await else {
            return;
        };
        if gate == Gate::Replies && sent {
            continue; // there may be room for the next request now
        }
        if conn.eof && pending.is_empty() && gate == Gate::Open {
            let _ = flush_bounded(&mut conn.wr, opts.frame_timeout).await;
            return; // the peer closed (a truncated frame is dropped)
        }
        let can_read = !conn.eof && gate == Gate::Open && pending.len() < opts.max_in_flight;
        if can_read && conn.request_at_front() {
            continue;
        }
        if conn.flush().await.is_err() {
            return;
        }
        if conn.frame_overdue(can_read) {
            conn.close_overdue().await;
            return;
        }
        if pending.is_empty() && can_read {
            match conn.spin_for_request().await {
                Ok(true) => continue,
                Ok(false) => {}
                Err(Close) => return,
            }
        }
        if conn.wait(&mut pending, can_read).await.is_err() {
            return;
        }
    }
}

/// The connection must close: its peer left, stalled or broke the stream
/// (whatever could be said was said).
struct Close;

/// Whether a connection takes another request now.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// Yes, as soon as one is complete.
    Open,
    /// Not until the reservation it waits for ([`Holds::wait`]) is
    /// granted.
    Reserving,
    /// Not until some of its replies went out: they hold
    /// [`ServeOptions::max_connection_reply_bytes`] already.
    Replies,
}

/// What the front of a connection's receive buffer gave.
enum Admit {
    /// A complete request, to be handled with what it holds.
    Request(FrameHeader, Bytes, Held),
    /// A request whose data went into the handler's sink, with its
    /// permit of the server's request bound.
    Direct(
        FrameHeader,
        Bytes,
        Box<dyn DirectSink>,
        OwnedSemaphorePermit,
    ),
    /// No request to start now.
    Stop(Gate),
}

/// What woke a connection that waited.
enum Woke {
    /// A reply is done.
    Replied(Reply),
    /// The socket is readable (or failed).
    Readable(std::io::Result<()>),
    /// The reservation it waited for.
    Reserved(Result<OwnedSemaphorePermit, AcquireError>),
    /// The frame at the front did not arrive in time.
    Overdue,
    /// It stayed idle with an oversized receive buffer.
    Idle,
}

/// One connection past its handshake, between turns of its loop.
struct Serving<'a, H> {
    handler: Arc<H>,
    peer: Arc<str>,
    state: &'a ServerState,
    opts: ServeOptions,
    rd: ReadHalf,
    wr: Replies,
    rbuf: RecvBuf<'a>,
    /// What the next request holds and waits for.
    holds: Holds,
    /// Bytes reserved for this connection's replies not sent yet.
    replies_held: usize,
    /// How soon this connection's requests come after it went idle.
    spin_stats: SpinStats,
    idle_since: Option<Instant>,
    /// A frame whose data the handler would not take in place.
    declined: Option<u64>,
    /// When the frame at the front must be complete (set while the server
    /// waits for its bytes).
    frame_deadline: Option<tokio::time::Instant>,
    /// The peer closed its end.
    eof: bool,
}

impl<'a, H: Handler> Serving<'a, H> {
    fn new(
        stream: Stream,
        leftover: BytesMut,
        peer: Arc<str>,
        handler: Arc<H>,
        state: &'a ServerState,
        opts: ServeOptions,
    ) -> Serving<'a, H> {
        let (rd, wr) = stream.split();
        let budgets = &state.budgets;
        Serving {
            handler,
            peer,
            state,
            opts,
            rd,
            wr: BufWriter::with_capacity(REPLY_BUF, wr),
            rbuf: RecvBuf::new(leftover, &budgets.recv_bytes, &budgets.recv_bytes_peak),
            holds: Holds::default(),
            replies_held: 0,
            spin_stats: SpinStats::default(),
            idle_since: None,
            declined: None,
            frame_deadline: None,
            eof: false,
        }
    }

    /// Looks at the front of the receive buffer: a complete request (taken
    /// out, with its reservations), one whose data was received in place,
    /// or why none starts now. A frame whose header cannot be followed is
    /// answered, and the connection closes.
    async fn admit(&mut self) -> Result<Admit, Close> {
        let state = self.state;
        let header = match front_for(&self.rbuf.buf, &*self.handler) {
            Front::Short => return Ok(Admit::Stop(Gate::Open)),
            Front::Bad(id, e) => {
                self.refuse_frame(id, &e).await;
                return Err(Close);
            }
            Front::Frame(header) => return Ok(self.take_request(header)),
            Front::Partial(header, _) => header,
        };
        if let Some(prefix_len) = direct_len(&header, &*self.handler, self.declined) {
            if self.rbuf.buf.len() < HEADER_LEN + prefix_len {
                return Ok(Admit::Stop(Gate::Open)); // its prefix first
            }
            let Some(permit) = self.holds.take_request(&state.budgets) else {
                return Ok(Admit::Stop(Gate::Reserving));
            };
            let (rd, handler) = (&self.rd, &*self.handler);
            let got = receive_direct(rd, &mut self.rbuf, handler, header, prefix_len, &self.opts);
            match got.await {
                Ok(Some((prefix, sink))) => {
                    self.frame_deadline = None;
                    return Ok(Admit::Direct(header, prefix, sink, permit));
                }
                Ok(None) => {
                    // The usual path for this frame.
                    self.declined = Some(header.id);
                    self.holds.request = Some(permit);
                }
                Err(why) => {
                    tracing::debug!("closing connection from {}: {why}", self.peer);
                    return Err(Close);
                }
            }
        }
        // Its bytes are reserved before the buffer grows for it.
        if let Some(n) = frame_reservation(header.payload_len) {
            if self.rbuf.full() && !self.holds.get(Hold::Frame, &state.budgets, n) {
                return Ok(Admit::Stop(Gate::Reserving));
            }
        }
        Ok(Admit::Stop(Gate::Open))
    }

    /// Takes the complete frame with `header` out of the buffer once what
    /// it needs is reserved: its frame's bytes, its declared reply's bytes
    /// (within the connection's share), a permit of the request bound.
    fn take_request(&mut self, header: FrameHeader) -> Admit {
        let budgets = &self.state.budgets;
        if let Some(n) = frame_reservation(header.payload_len) {
            if !self.holds.get(Hold::Frame, budgets, n) {
                return Admit::Stop(Gate::Reserving);
            }
        }
        let payload = &self.rbuf.buf[HEADER_LEN..HEADER_LEN + header.payload_len];
        let reply = self.handler.reply_len(header.kind, payload);
        if reply > 0 {
            // A connection whose replies wait for their peer takes no more
            // requests (it may always have one).
            if self.holds.reply.is_none()
                && self.replies_held > 0
                && self.replies_held + reply > self.opts.max_connection_reply_bytes
            {
                return Admit::Stop(Gate::Replies);
            }
            if !self.holds.get(Hold::Reply, budgets, reply) {
                return Admit::Stop(Gate::Reserving);
            }
        }
        let Some(request) = self.holds.take_request(budgets) else {
            return Admit::Stop(Gate::Reserving);
        };
        let payload = take_frame(&mut self.rbuf.buf, header);
        if header.payload_len > RECV_BUF_INITIAL {
            self.rbuf.detach();
        }
        self.frame_deadline = None;
        let reply = self.holds.reply.take();
        self.replies_held += reply.as_ref().map_or(0, |r| r.num_permits());
        let frame = self.holds.frame.take();
        Admit::Request(
            header,
            payload,
            Held {
                request,
                frame,
                reply,
            },
        )
    }

    /// Answers a frame whose header cannot be followed: the stream is
    /// unsynchronised, so the connection closes after this.
    async fn refuse_frame(&mut self, id: u64, e: &Error) {
        self.state.malformed.fetch_add(1, Ordering::Relaxed);
        tracing::debug!("closing connection from {}: {e}", self.peer);
        let mut out = BytesMut::new();
        push_error(&mut out, id, e);
        if write_bounded(&mut self.wr, &out, self.opts.frame_timeout)
            .await
            .is_ok()
        {
            let _ = flush_bounded(&mut self.wr, self.opts.frame_timeout).await;
        }
    }

    /// Lets the receive buffer grow for the frame at the front only while
    /// that frame's bytes are reserved.
    fn note_frame_hold(&mut self) {
        self.rbuf.reserved = self.holds.frame.is_some();
        self.rbuf.sync();
    }

    /// Whether a complete frame (or one that cannot be followed) waits at
    /// the front: more to admit before waiting.
    fn request_at_front(&self) -> bool {
        matches!(
            front_for(&self.rbuf.buf, &*self.handler),
            Front::Frame(_) | Front::Bad(..)
        )
    }

    /// Sends every reply that is already done; whether there was one.
    async fn send_done<F>(&mut self, pending: &mut FuturesUnordered<F>) -> Result<bool, Close>
    where
        F: Future<Output = Reply>,
    {
        let mut sent = false;
        while let Some(Some(reply)) = pending.next().now_or_never() {
            sent = true;
            self.send(reply).await?;
        }
        Ok(sent)
    }

    /// Writes one reply, giving its bytes back to the connection's share.
    async fn send(&mut self, reply: Reply) -> Result<(), Close> {
        self.replies_held -= reply.reserved_bytes();
        write_reply(&mut self.wr, &self.rd, reply, self.opts.frame_timeout)
            .await
            .map_err(|_| Close)
    }

    /// Writes out the replies buffered so far.
    async fn flush(&mut self) -> Result<(), Close> {
        // Over TLS, a reply written past the buffer may have left records
        // for the socket.
        if self.wr.buffer().is_empty() && !self.rd.tls().is_some_and(|t| t.wants_write()) {
            return Ok(());
        }
        flush_bounded(&mut self.wr, self.opts.frame_timeout)
            .await
            .map_err(|_| Close)
    }

    /// Starts the frame deadline while the server waits for the rest of
    /// a frame (and clears it otherwise); whether it has passed. Checked
    /// here too, not only when parked: a peer that trickles a byte at a
    /// time keeps the spin from ever parking.
    fn frame_overdue(&mut self, can_read: bool) -> bool {
        if can_read && !self.rbuf.buf.is_empty() {
            // Waiting for the rest of a frame: bounded.
            let timeout = self.opts.frame_timeout;
            self.frame_deadline
                .get_or_insert_with(|| tokio::time::Instant::now() + timeout);
        } else {
            self.frame_deadline = None;
        }
        self.frame_deadline
            .is_some_and(|d| tokio::time::Instant::now() >= d)
    }

    /// The frame at the front did not arrive in time: what can be sent is
    /// sent before the connection closes.
    async fn close_overdue(&mut self) {
        log_frame_timeout(&self.peer, self.opts.frame_timeout);
        let _ = flush_bounded(&mut self.wr, self.opts.frame_timeout).await;
    }

    /// Idle: busy-polls briefly for the next request before parking, if
    /// this connection's requests usually come that soon; whether bytes
    /// (or the end of the stream) came.
    async fn spin_for_request(&mut self) -> Result<bool, Close> {
        if self.opts.spin.is_zero() {
            return Ok(false);
        }
        let since = *self.idle_since.get_or_insert_with(Instant::now);
        let spins = &self.state.idle_spins;
        match spin_fill(
            &self.rd,
            &mut self.rbuf,
            self.opts.spin,
            self.spin_stats,
            spins,
        )
        .await
        {
            Ok(Some(more)) => {
                self.spin_stats.record(since.elapsed(), self.opts.spin);
                self.idle_since = None;
                self.eof |= !more;
                Ok(true)
            }
            Ok(None) => Ok(false),
            Err(_) => Err(Close),
        }
    }

    /// Parks until something happens, and takes it in: a reply done
    /// (sent), bytes (read), a reservation (held), the frame deadline
    /// (the connection closes), or an idle second (the receive buffer
    /// shrinks back).
    async fn wait<F>(
        &mut self,
        pending: &mut FuturesUnordered<F>,
        can_read: bool,
    ) -> Result<(), Close>
    where
        F: Future<Output = Reply>,
    {
        let idle = can_read && pending.is_empty() && self.rbuf.oversized();
        let waiting = self.holds.wait.is_some();
        let reservation = &mut self.holds.wait;
        let deadline = self.frame_deadline;
        let woke = tokio::select! {
            Some(reply) = pending.next(), if !pending.is_empty() => Woke::Replied(reply),
            ready = self.rd.readable(), if can_read => Woke::Readable(ready),
            p = async { (&mut reservation.as_mut().expect("waiting").1).await }, if waiting => {
                Woke::Reserved(p)
            }
            () = tokio::time::sleep_until(
                deadline.unwrap_or_else(tokio::time::Instant::now)
            ), if deadline.is_some() => Woke::Overdue,
            () = tokio::time::sleep(RECV_SHRINK_AFTER), if idle => Woke::Idle,
        };
        match woke {
            Woke::Replied(reply) => self.send(reply).await?,
            Woke::Readable(ready) => {
                if ready.is_err() {
                    return Err(Close);
                }
                self.fill()?;
            }
            Woke::Reserved(Ok(p)) => self.holds.got(p, &self.state.budgets),
            Woke::Reserved(Err(_)) => return Err(Close), // the semaphores are never closed
            Woke::Overdue => {
                self.close_overdue().await;
                return Err(Close);
            }
            Woke::Idle => self.rbuf.shrink(),
        }
        Ok(())
    }

    /// Reads what the socket has, noting how long the connection was idle.
    fn fill(&mut self) -> Result<(), Close> {
        match try_fill(&self.rd, &mut self.rbuf) {
            Ok(Some(true)) => {
                if let Some(since) = self.idle_since.take() {
                    self.spin_stats.record(since.elapsed(), self.opts.spin);
                }
            }
            Ok(None) => {}
            Ok(Some(false)) => self.eof = true,
            Err(_) => return Err(Close),
        }
        Ok(())
    }
}

fn log_frame_timeout(peer: &str, timeout: Duration) {
    tracing::debug!(
        "closing connection from {peer}: a frame did not arrive completely within {timeout:?}"
    );
}
