//! The client end of a connection.
//!
//! # Sending, and why every call is cancel safe
//!
//! Many callers share one socket. A caller sends its own frame, straight
//! from its borrowed slices (a 1 MiB block goes from the user's buffer to
//! the socket with one `writev`, no copy), while holding the writer lock.
//! The danger is a caller that goes away in the middle of its frame (a
//! `select!`, a `timeout`, an aborted task, a Python cancellation): the
//! frames that follow would be read by the server as the rest of the
//! abandoned one.
//!
//! So the caller writes through a guard (`PartialFrame`) that counts the
//! bytes of its frame that went out. If the call is dropped after a partial
//! write, the guard's `Drop` (which runs while the borrowed slices are still
//! alive) copies the unsent rest of the frame into the writer state, and
//! that rest goes out before any other frame: by a task spawned on the
//! current runtime at once, or else by the next caller, who always finishes
//! a pending rest first. A frame not started at all is simply not sent.
//! Only an abandoned frame is ever copied; the normal path has no copy and
//! no extra task.
//!
//! A queue feeding a writer task (mini-redis style) would also be cancel
//! safe, but every request would have to be copied into an owned buffer
//! first (the caller's slices cannot outlive its future), which costs a
//! memory copy of every block written.
//!
//! Replies are matched by id. A caller registers its waiter through a guard
//! that removes it when the call ends in any way, so the reply of an
//! abandoned call is dropped on arrival and nothing leaks.
//!
//! # Receiving straight into the caller's buffer
//!
//! A reply normally lands in the connection's receive buffer and is handed
//! over as `Bytes` cut from it. A caller of [`Connection::call_into`] wants
//! the payload in its own buffer instead, without that intermediate copy
//! (when its buffer is small, under [`DIRECT_REPLY_MIN`], the reply comes
//! the usual way and is copied: cheaper than what follows).
//! While such a call is waiting, the connection reads frame by frame (a
//! header, then exactly the rest of its frame), so no byte of a later
//! frame is read ahead into the receive buffer. When the header of the
//! direct reply arrives, whoever is reading stops there: the stream is
//! *parked* and belongs to that caller, which receives the payload with
//! `recv` straight into its buffer, inside its own future (no pointer to
//! the buffer is ever stored). When the payload is complete, the stream is
//! unparked and the reader task goes on. A caller that goes away while the
//! stream is parked for it leaves the rest of its payload to be skipped.
//!
//! A send that cannot finish before the call's deadline (the peer stopped
//! reading) fails the whole connection: the stream is stuck and a later
//! frame could not go out anyway. Every pending call fails at once, the
//! socket is shut down, and [`ConnectionPool`] connects afresh on next use.

use crate::handshake::{ClientHandshake, HandshakeIo, PeerInfo};
use crate::hello::VersionHandshake;
use crate::limits::CLIENT_RECV_BUF;
use crate::sock::io_error;
use crate::spin::{Spin, SpinStats};
use crate::transport::{ReadHalf, Stream, WriteHalf};
use bytes::{Buf, Bytes, BytesMut};
use nodekernel_proto::frame::STATUS_OK;
use nodekernel_proto::hello::Role;
use nodekernel_proto::sync;
use nodekernel_proto::{Error, FrameHeader, Result, HEADER_LEN, MAX_PAYLOAD_LEN};
use std::collections::HashMap;
use std::io::IoSlice;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;

/// Settings of a client connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnOptions {
    /// Bound on connecting (including the handshake) and on every call.
    pub timeout: Duration,
    /// How long a caller busy-polls the socket for its reply before parking
    /// (0 disables spinning). Waking a parked thread costs tens of
    /// microseconds on these machines; a short spin avoids it.
    pub spin: Duration,
}

impl ConnOptions {
    pub fn new(timeout: Duration) -> Self {
        ConnOptions {
            timeout,
            spin: crate::spin::default_call_spin(),
        }
    }
}

/// A call of [`Connection::call_into`] whose buffers (with the trailer's)
/// hold at least this much has its reply received straight into them; a
/// smaller one has it received with the frames around it and copied out.
/// Parking the stream costs a `recv` each for the header, the payload and
/// the trailer, and a hand-over between the task that read the header and
/// the caller (a thread wake-up when they run on different workers): for
/// a small read, several times what the copy of a few KiB costs. Remote
/// 1 KiB reads took 40-100 µs less with it on a 2-vCPU machine
/// (`docs/benchmarks.md`, *Small replies*).
pub const DIRECT_REPLY_MIN: usize = 16 * 1024;

/// The handshake used when none is given: the wire-version check,
/// introducing this end as a client.
pub fn default_client_handshake() -> Arc<dyn ClientHandshake> {
    Arc::new(VersionHandshake::new(Role::Client))
}

/// How a call wants its reply.
enum Waiter {
    /// As `Bytes` cut from the receive buffer.
    Buffered(oneshot::Sender<Result<Bytes>>),
    /// Straight into the caller's buffers (see the module docs): the
    /// payload is at least `trailer` and at most `cap` bytes. `Ok(len)`
    /// tells the caller the stream is parked at its payload of `len` bytes.
    Direct {
        tx: oneshot::Sender<Result<usize>>,
        cap: usize,
        trailer: usize,
    },
}

impl Waiter {
    fn fail(self, e: Error) {
        match self {
            Waiter::Buffered(tx) => {
                let _ = tx.send(Err(e));
            }
            Waiter::Direct { tx, .. } => {
                let _ = tx.send(Err(e));
            }
        }
    }
}

#[derive(Default)]
struct Waiters {
    map: HashMap<u64, Waiter>,
    /// Entries of `map` that are `Direct`.
    direct: usize,
}

impl Waiters {
    fn remove(&mut self, id: u64) -> Option<Waiter> {
        let w = self.map.remove(&id);
        if matches!(w, Some(Waiter::Direct { .. })) {
            self.direct -= 1;
        }
        w
    }
}

/// Bytes of direct replies ([`Connection::call_into`]) by how they reached
/// the caller's buffer; shared by the connections of a pool.
#[derive(Debug, Default)]
pub struct ReplyCopies {
    direct: AtomicU64,
    staged: AtomicU64,
    small: AtomicU64,
}

impl ReplyCopies {
    /// Payload bytes the kernel wrote straight into callers' buffers.
    pub fn direct(&self) -> u64 {
        self.direct.load(Ordering::Relaxed)
    }

    /// Payload bytes that went through a receive buffer first and were
    /// copied from there (read together with an earlier frame).
    pub fn staged(&self) -> u64 {
        self.staged.load(Ordering::Relaxed)
    }

    /// Payload bytes (trailers included) of direct calls whose buffers
    /// held less than [`DIRECT_REPLY_MIN`]: received with the frames
    /// around them and copied out, on purpose.
    pub fn small(&self) -> u64 {
        self.small.load(Ordering::Relaxed)
    }
}

/// The receiving side of a connection, driven by the reader task, by a
/// caller spinning for its reply (whoever holds `state`), or by the caller
/// the stream is parked for.
struct Inbound {
    rd: ReadHalf,
    state: Mutex<InState>,
    /// Signalled when a parked stream is given back to the reader task.
    unparked: tokio::sync::Notify,
}

struct InState {
    buf: BytesMut,
    /// The direct reply whose payload its caller is receiving: nobody else
    /// reads the socket meanwhile.
    parked: Option<Parked>,
    /// Payload bytes of an abandoned direct reply still to be dropped.
    skip: usize,
}

#[derive(Debug, Clone, Copy)]
struct Parked {
    id: u64,
    /// Payload bytes its caller has not received yet.
    left: usize,
}

struct Shared {
    waiters: Mutex<Waiters>,
    /// `waiters.direct`, readable without the lock: while it is not zero,
    /// the connection reads frame by frame.
    direct_waiters: AtomicUsize,
    copies: Arc<ReplyCopies>,
    /// Set (under the `waiters` lock) when the connection fails; no waiter
    /// is registered after that.
    closed: AtomicBool,
    peer: String,
    inbound: Inbound,
    /// Frames whose caller went away mid-write (their rest was sent from a
    /// copy).
    abandoned: AtomicU64,
    /// Direct replies whose caller went away while receiving the payload.
    abandoned_replies: AtomicU64,
    /// How soon replies come (`SpinStats::to_bits`): whether callers spin.
    spin_stats: AtomicU32,
}

enum Pump {
    /// Read something (maybe not a whole frame).
    Progress,
    /// Nothing to read right now.
    Idle,
    /// Another thread is reading.
    Busy,
    /// The stream is parked for a direct reply's caller.
    Parked,
}

impl Shared {
    fn spin_stats(&self) -> SpinStats {
        SpinStats::from_bits(self.spin_stats.load(Ordering::Relaxed))
    }

    /// Records how long a caller waited for its reply. Concurrent callers
    /// may overwrite each other's update; the average only steers spinning.
    fn record_wait(&self, waited: Duration, budget: Duration) {
        let mut stats = self.spin_stats();
        stats.record(waited, budget);
        self.spin_stats.store(stats.to_bits(), Ordering::Relaxed);
    }

    /// Fails every pending call with `err`, refuses new ones and shuts the
    /// socket down (so the server, and our reader, see the end at once).
    fn fail_all(&self, err: &Error) {
        let waiters: Vec<_> = {
            let mut w = sync::lock(&self.waiters);
            self.closed.store(true, Ordering::Release);
            w.direct = 0;
            self.direct_waiters.store(0, Ordering::Relaxed);
            w.map.drain().collect()
        };
        for (_, waiter) in waiters {
            waiter.fail(err.clone());
        }
        // SAFETY: a plain system call on the descriptor of the read half,
        // which `self` owns (shutdown acts on the socket, both directions).
        unsafe {
            libc::shutdown(self.inbound.rd.fd(), libc::SHUT_RDWR);
        }
    }

    fn closed_error(&self) -> Error {
        Error::unavailable(format!("connection to {} is closed", self.peer))
    }

    /// Registers the waiter for request `id`; fails if the connection has
    /// failed (checked under the same lock `fail_all` drains, so a waiter
    /// is never left behind by a failure).
    fn register(&self, id: u64, waiter: Waiter) -> Result<WaiterGuard<'_>> {
        let mut w = sync::lock(&self.waiters);
        if self.closed.load(Ordering::Acquire) {
            return Err(self.closed_error());
        }
        let direct = matches!(waiter, Waiter::Direct { .. });
        if direct {
            w.direct += 1;
            self.direct_waiters.store(w.direct, Ordering::SeqCst);
        }
        w.map.insert(id, waiter);
        Ok(WaiterGuard {
            shared: self,
            id,
            direct,
            armed: true,
        })
    }

    fn remove_waiter(&self, id: u64) -> Option<Waiter> {
        let mut w = sync::lock(&self.waiters);
        let waiter = w.remove(id);
        self.direct_waiters.store(w.direct, Ordering::SeqCst);
        waiter
    }

    /// How much the next read may take: everything the buffer has room
    /// for, or, while a direct call waits, no more than the rest of the
    /// frame at the front (so its payload is not read ahead).
    fn read_limit(&self, st: &InState) -> usize {
        if self.direct_waiters.load(Ordering::SeqCst) == 0 {
            return usize::MAX;
        }
        if st.skip > 0 {
            return st.skip;
        }
        if st.buf.len() < HEADER_LEN {
            return HEADER_LEN - st.buf.len();
        }
        let h: [u8; HEADER_LEN] = st.buf[..HEADER_LEN].try_into().expect("length checked");
        match FrameHeader::parse(&h) {
            Ok(header) => (HEADER_LEN + header.payload_len)
                .saturating_sub(st.buf.len())
                .max(1),
            Err(_) => usize::MAX, // dispatch reports it
        }
    }

    /// Hands a stream that is no longer parked back: delivers the frames
    /// already buffered and wakes the reader task.
    fn unpark(&self, mut st: std::sync::MutexGuard<'_, InState>) {
        st.parked = None;
        let dispatched = self.dispatch(&mut st);
        drop(st);
        if let Err(e) = dispatched {
            self.fail_all(&e);
        }
        self.inbound.unparked.notify_one();
    }

    /// The caller of direct reply `id` went away: if the stream is parked
    /// for it, the rest of its payload is skipped.
    fn abandon_direct(&self, id: u64) {
        let mut st = sync::lock(&self.inbound.state);
        let left = match st.parked {
            Some(p) if p.id == id => p.left,
            _ => return,
        };
        let n = left.min(st.buf.len());
        st.buf.advance(n);
        st.skip = left - n;
        self.abandoned_replies.fetch_add(1, Ordering::Relaxed);
        self.unpark(st);
    }

    /// Receives what has arrived of the payload the stream is parked at
    /// (for direct reply `id`) into `rest`, the next part of the caller's
    /// buffers to fill; returns how many bytes it took, and unparks the
    /// stream once the whole payload is in. Never waits.
    fn receive_now(&self, id: u64, rest: &mut [MaybeUninit<u8>]) -> Result<usize> {
        let rd = &self.inbound.rd;
        let mut st = sync::lock(&self.inbound.state);
        debug_assert!(matches!(st.parked, Some(p) if p.id == id && p.left >= rest.len()));
        // Bytes read together with the header (before the call was
        // registered as direct, or by a read not yet frame by frame):
        // copied once from the receive buffer.
        let mut got = st.buf.len().min(rest.len());
        if got > 0 {
            // SAFETY: both ranges are valid for `got` bytes and do not
            // overlap (`rest` is the caller's memory).
            unsafe {
                std::ptr::copy_nonoverlapping(st.buf.as_ptr(), rest.as_mut_ptr().cast::<u8>(), got);
            }
            st.buf.advance(got);
            self.copies.staged.fetch_add(got as u64, Ordering::Relaxed);
        }
        while got < rest.len() {
            // Inside `try_io`, so a WouldBlock clears the readiness.
            let r = rd.try_io(|| match rd.recv_into(&mut rest[got..]) {
                Ok(None) => Err(std::io::ErrorKind::WouldBlock.into()),
                other => other,
            });
            let e = match r {
                Ok(Some(0)) => {
                    Error::unavailable(format!("connection to {} closed by the peer", self.peer))
                }
                Ok(Some(n)) => {
                    got += n;
                    self.copies.direct.fetch_add(n as u64, Ordering::Relaxed);
                    continue;
                }
                // `Ok(None)` is turned into WouldBlock above.
                Ok(None) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => io_error(&format!("connection to {}", self.peer), e),
            };
            drop(st);
            self.fail_all(&e);
            return Err(e);
        }
        let p = st.parked.as_mut().expect("parked for this call");
        p.left -= got;
        if p.left == 0 {
            self.unpark(st);
        }
        Ok(got)
    }

    /// Reads what the socket has without blocking and hands every complete
    /// reply to its waiter.
    fn pump(&self) -> Result<Pump> {
        let Ok(mut st) = self.inbound.state.try_lock() else {
            return Ok(Pump::Busy);
        };
        if st.parked.is_some() {
            return Ok(Pump::Parked);
        }
        let rd = &self.inbound.rd;
        let mut progress = false;
        loop {
            if st.buf.capacity() - st.buf.len() < CLIENT_RECV_BUF / 4 {
                st.buf.reserve(CLIENT_RECV_BUF);
            }
            let max = self.read_limit(&st);
            match rd.recv_now(&mut st.buf, max) {
                Ok(Some(0)) => {
                    return Err(Error::unavailable(format!(
                        "connection to {} closed by the peer",
                        self.peer
                    )))
                }
                Ok(Some(_)) => {
                    progress = true;
                    self.dispatch(&mut st)?;
                    if st.parked.is_some() {
                        return Ok(Pump::Parked);
                    }
                }
                Ok(None) => break,
                Err(e) => return Err(io_error(&format!("connection to {}", self.peer), e)),
            }
        }
        Ok(if progress { Pump::Progress } else { Pump::Idle })
    }

    /// Splits complete frames off the receive buffer and completes their
    /// waiters; stops at the header of a direct reply, parking the stream
    /// for its caller. A reply nobody waits for any more (its call was
    /// dropped) is discarded.
    fn dispatch(&self, st: &mut InState) -> Result<()> {
        loop {
            if st.skip > 0 {
                let n = st.skip.min(st.buf.len());
                st.buf.advance(n);
                st.skip -= n;
                if st.skip > 0 {
                    return Ok(());
                }
            }
            if st.buf.len() < HEADER_LEN {
                return Ok(());
            }
            let h: [u8; HEADER_LEN] = st.buf[..HEADER_LEN].try_into().expect("length checked");
            let header = FrameHeader::parse(&h)?;
            if header.kind == STATUS_OK && self.park_for_direct(st, &header) {
                if st.parked.is_some() {
                    return Ok(());
                }
                continue;
            }
            if st.buf.len() < HEADER_LEN + header.payload_len {
                // The server is trusted to send the replies it announces.
                let missing = HEADER_LEN + header.payload_len - st.buf.len();
                st.buf.reserve(missing);
                return Ok(());
            }
            st.buf.advance(HEADER_LEN);
            let payload = st.buf.split_to(header.payload_len).freeze();
            let result = if header.kind == STATUS_OK {
                Ok(payload)
            } else {
                Err(Error::from_wire(header.kind, &payload))
            };
            match (self.remove_waiter(header.id), result) {
                (Some(Waiter::Buffered(tx)), r) => {
                    let _ = tx.send(r);
                }
                (Some(w), Err(e)) => w.fail(e),
                (Some(Waiter::Direct { .. }), Ok(_)) => {
                    unreachable!("a successful direct reply parks the stream")
                }
                (None, _) => {}
            }
        }
    }

    /// If the successful reply `header` (at the front of the buffer) is for
    /// a direct call, takes its header off and parks the stream for that
    /// caller (or, if the caller is gone, or the payload does not fit its
    /// buffer, skips the payload). Returns whether it was a direct reply.
    fn park_for_direct(&self, st: &mut InState, header: &FrameHeader) -> bool {
        let waiter = {
            let mut w = sync::lock(&self.waiters);
            if !matches!(w.map.get(&header.id), Some(Waiter::Direct { .. })) {
                return false;
            }
            let waiter = w.remove(header.id);
            self.direct_waiters.store(w.direct, Ordering::SeqCst);
            waiter
        };
        let Some(Waiter::Direct { tx, cap, trailer }) = waiter else {
            unreachable!("checked under the lock")
        };
        st.buf.advance(HEADER_LEN);
        let len = header.payload_len;
        if len > cap || len < trailer {
            let _ = tx.send(Err(Error::protocol(format!(
                "{} sent a reply of {len} bytes for a buffer of {} and a trailer of {trailer}",
                self.peer,
                cap - trailer
            ))));
            st.skip = len;
        } else if len == 0 {
            let _ = tx.send(Ok(0));
        } else if tx.send(Ok(len)).is_ok() {
            st.parked = Some(Parked {
                id: header.id,
                left: len,
            });
        } else {
            st.skip = len;
        }
        true
    }
}

/// Removes a call's waiter when the call ends without its reply (dropped,
/// timed out, failed to send).
struct WaiterGuard<'a> {
    shared: &'a Shared,
    id: u64,
    /// A direct call's reply may have parked the stream before the call
    /// went away.
    direct: bool,
    /// Cleared once the reply (or the failure) was taken: the entry is gone
    /// (and for a direct call, its payload received).
    armed: bool,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.shared.remove_waiter(self.id);
            if self.direct {
                self.shared.abandon_direct(self.id);
            }
        }
    }
}

/// Leaves the rest of a direct payload to be skipped when its caller goes
/// away while the stream is parked for it.
struct ParkedGuard<'a> {
    shared: &'a Shared,
    id: u64,
    /// Payload bytes not received yet; 0 once the payload is complete.
    left: usize,
}

impl Drop for ParkedGuard<'_> {
    fn drop(&mut self) {
        if self.left > 0 {
            self.shared.abandon_direct(self.id);
        }
    }
}

/// The sending side, behind the writer lock.
struct WriterState {
    wr: WriteHalf,
    /// The unsent rest of a frame whose caller went away mid-write. It goes
    /// out before any other frame.
    tail: Option<Tail>,
    /// Set once a send failed: the stream can carry no more frames.
    failed: Option<Error>,
}

struct Tail {
    bytes: Vec<u8>,
    sent: usize,
}

/// Why a send stopped.
enum SendError {
    Io(std::io::Error),
    /// The deadline passed with the frame unfinished.
    Stalled,
}

type Writer = Arc<tokio::sync::Mutex<WriterState>>;

/// Writes the pending tail, if any, then flushes the stream (over TLS,
/// records a write left for the socket). Progress is recorded after every
/// write, so a caller dropped in here leaves a consistent tail behind.
async fn flush_tail(st: &mut WriterState, deadline: tokio::time::Instant) -> Result<(), SendError> {
    let WriterState { wr, tail, .. } = st;
    while let Some(t) = tail {
        let n = match tokio::time::timeout_at(deadline, wr.write(&t.bytes[t.sent..])).await {
            Ok(Ok(0)) => return Err(SendError::Io(std::io::ErrorKind::WriteZero.into())),
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(SendError::Io(e)),
            Err(_) => return Err(SendError::Stalled),
        };
        t.sent += n;
        if t.sent == t.bytes.len() {
            *tail = None;
        }
    }
    flush_stream(wr, deadline).await
}

/// Flushes what a write left for the socket: nothing on a plain socket;
/// over TLS, encrypted records the socket did not take yet.
async fn flush_stream(wr: &mut WriteHalf, deadline: tokio::time::Instant) -> Result<(), SendError> {
    match tokio::time::timeout_at(deadline, wr.flush()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(SendError::Io(e)),
        Err(_) => Err(SendError::Stalled),
    }
}

/// Fails the connection after a send failed: marks the writer unusable,
/// fails every pending call (with `Unavailable`) and shuts the socket down.
/// Returns the error for the caller whose send failed.
fn fail_sending(shared: &Shared, st: &mut WriterState, e: SendError, timeout: Duration) -> Error {
    let (mine, others) = match e {
        SendError::Io(e) => {
            let err = io_error(&format!("sending to {}", shared.peer), e);
            (err.clone(), err)
        }
        SendError::Stalled => {
            let msg = format!(
                "sending to {} did not finish within {timeout:?}: the server stopped reading; \
                 the connection is closed",
                shared.peer
            );
            (Error::timeout(msg.clone()), Error::unavailable(msg))
        }
    };
    st.failed = Some(others.clone());
    shared.fail_all(&others);
    mine
}

/// A frame being written by its caller, holding the writer lock. See the
/// module docs: dropped after a partial write, it leaves the rest of the
/// frame to be sent before anything else.
struct PartialFrame<'a, 'b> {
    st: tokio::sync::MutexGuard<'a, WriterState>,
    conn: &'a Connection,
    /// The frame's slices; `slices[first..]` is what is still unsent
    /// (`slices[first]` already cut to its unsent part).
    slices: Vec<&'b [u8]>,
    first: usize,
    /// Bytes of the frame that went out.
    sent: usize,
    /// Bytes of the frame still to send.
    left: usize,
    /// Set when the frame went out completely or the connection failed:
    /// nothing to keep.
    done: bool,
}

impl PartialFrame<'_, '_> {
    fn advance(&mut self, mut n: usize) {
        self.sent += n;
        self.left -= n;
        while self.first < self.slices.len() && n >= self.slices[self.first].len() {
            n -= self.slices[self.first].len();
            self.first += 1;
        }
        if self.first < self.slices.len() {
            self.slices[self.first] = &self.slices[self.first][n..];
        }
    }
}

impl Drop for PartialFrame<'_, '_> {
    fn drop(&mut self) {
        if self.done || self.sent == 0 {
            // Complete, or not started: the stream is at a frame boundary.
            return;
        }
        // The caller went away mid-frame. Its borrowed slices are still
        // alive here: keep a copy of the rest for the next writer.
        let mut rest = Vec::with_capacity(self.left);
        for s in &self.slices[self.first..] {
            rest.extend_from_slice(s);
        }
        debug_assert_eq!(rest.len(), self.left);
        debug_assert!(
            self.st.tail.is_none(),
            "a tail is flushed before a new frame"
        );
        self.st.tail = Some(Tail {
            bytes: rest,
            sent: 0,
        });
        self.conn.shared.abandoned.fetch_add(1, Ordering::Relaxed);
        self.conn.spawn_tail_flush();
    }
}

/// Hands the pending tail to a task if dropped while armed (a caller that
/// went away while flushing it).
struct TailRescue<'a> {
    conn: &'a Connection,
    armed: bool,
}

impl Drop for TailRescue<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.conn.spawn_tail_flush();
        }
    }
}

/// The client end of one connection to a NodeKernel server: many requests
/// in flight, replies matched by id, every call bounded by a timeout, every
/// call cancel safe (see the module docs).
pub struct Connection {
    shared: Arc<Shared>,
    writer: Writer,
    next_id: AtomicU64,
    opts: ConnOptions,
    reader: tokio::task::JoinHandle<()>,
    peer_info: PeerInfo,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Connection {
    /// Connects to `addr` (`host:port`, `unix:@name` or `unix:/path`) and
    /// runs the default handshake (the wire-version check), giving up after
    /// `timeout`. The same timeout bounds every call made on the connection.
    ///
    /// Cancel safe: dropping the future abandons the attempt and closes its
    /// socket; nothing else is affected.
    pub async fn connect(addr: &str, timeout: Duration) -> Result<Connection> {
        Connection::connect_with(addr, ConnOptions::new(timeout)).await
    }

    /// Like [`Connection::connect`], with explicit settings.
    ///
    /// Cancel safe, as [`Connection::connect`].
    pub async fn connect_with(addr: &str, opts: ConnOptions) -> Result<Connection> {
        let handshake = VersionHandshake::new(Role::Client);
        Connection::connect_with_handshake(addr, opts, &handshake).await
    }

    /// Like [`Connection::connect_with`], running `handshake` on the new
    /// socket before it carries any request. `opts.timeout` bounds the
    /// connect and the handshake together. A server of another wire version
    /// gives `VersionMismatch` here.
    ///
    /// Cancel safe, as [`Connection::connect`].
    pub async fn connect_with_handshake(
        addr: &str,
        opts: ConnOptions,
        handshake: &dyn ClientHandshake,
    ) -> Result<Connection> {
        Connection::connect_counting(addr, opts, handshake, Arc::default()).await
    }

    /// Connects, counting direct reply bytes in `copies`.
    async fn connect_counting(
        addr: &str,
        opts: ConnOptions,
        handshake: &dyn ClientHandshake,
        copies: Arc<ReplyCopies>,
    ) -> Result<Connection> {
        let timeout = opts.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let stream = match tokio::time::timeout_at(deadline, Stream::connect(addr)).await {
            Ok(Ok(s)) => s,
            // A malformed address (no port, a bad port, a Unix path too
            // long) is the caller's mistake, not a server yet to start:
            // said at once, never waited for.
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::InvalidInput => {
                return Err(Error::invalid_argument(format!(
                    "{addr:?} is not an address ({e}): expected HOST:PORT, unix:/PATH or unix:@NAME"
                )))
            }
            Ok(Err(e)) => return Err(Error::unavailable(format!("cannot connect to {addr}: {e}"))),
            Err(_) => {
                return Err(Error::timeout(format!(
                    "connecting to {addr} took longer than {timeout:?}"
                )))
            }
        };
        let mut io = HandshakeIo::new(stream, addr.to_string());
        let peer_info = match tokio::time::timeout_at(deadline, handshake.connect(&mut io)).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(Error::timeout(format!(
                    "the handshake with {addr} did not finish within {timeout:?}"
                )))
            }
        };
        let (stream, mut buf) = io.into_parts();
        buf.reserve(CLIENT_RECV_BUF);
        let (rd, wr) = stream.split();
        let shared = Arc::new(Shared {
            waiters: Mutex::new(Waiters::default()),
            direct_waiters: AtomicUsize::new(0),
            copies,
            closed: AtomicBool::new(false),
            abandoned: AtomicU64::new(0),
            abandoned_replies: AtomicU64::new(0),
            spin_stats: AtomicU32::new(SpinStats::default().to_bits()),
            peer: addr.to_string(),
            inbound: Inbound {
                rd,
                state: Mutex::new(InState {
                    buf,
                    parked: None,
                    skip: 0,
                }),
                unparked: tokio::sync::Notify::new(),
            },
        });
        let reader = tokio::spawn(read_loop(shared.clone()));
        Ok(Connection {
            shared,
            writer: Arc::new(tokio::sync::Mutex::new(WriterState {
                wr,
                tail: None,
                failed: None,
            })),
            next_id: AtomicU64::new(1),
            opts,
            reader,
            peer_info,
        })
    }

    /// Whether the connection has failed (the peer closed it, sent garbage,
    /// or stopped reading).
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    pub fn peer(&self) -> &str {
        &self.shared.peer
    }

    /// What the handshake learnt about the server.
    pub fn peer_info(&self) -> &PeerInfo {
        &self.peer_info
    }

    /// Whether a caller on this connection would busy-poll for its reply
    /// now: while most recent replies came soon (see [`crate::spin`]).
    pub fn spinning(&self) -> bool {
        !self.opts.spin.is_zero() && self.shared.spin_stats().should_spin()
    }

    /// Calls waiting for their reply right now (for tests: a dropped call
    /// must not leave its waiter behind).
    #[doc(hidden)]
    pub fn pending_calls(&self) -> usize {
        sync::lock(&self.shared.waiters).map.len()
    }

    /// How the payloads of this connection's direct replies
    /// ([`Connection::call_into`]) reached their callers' buffers.
    pub fn reply_copies(&self) -> &ReplyCopies {
        &self.shared.copies
    }

    /// Requests so far whose caller went away in the middle of writing them
    /// (for tests: their rest was sent from a copy).
    #[doc(hidden)]
    pub fn abandoned_frames(&self) -> u64 {
        self.shared.abandoned.load(Ordering::Relaxed)
    }

    /// Direct replies so far whose caller went away while their payload
    /// was arriving (for tests: the rest was skipped).
    #[doc(hidden)]
    pub fn abandoned_replies(&self) -> u64 {
        self.shared.abandoned_replies.load(Ordering::Relaxed)
    }

    /// Sends a request whose payload is the concatenation of `parts` (one
    /// vectored write, no copy) and waits for its reply payload. Error
    /// replies become [`Error`]s; a call that does not complete within the
    /// timeout gives `Timeout`. A send that cannot finish within the timeout
    /// (the server stopped reading) also closes the connection, failing
    /// every other pending call with `Unavailable`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the future may be dropped at any point (`select!`,
    /// `timeout`, task abort) without harm to the connection or to other
    /// calls on it. A request not yet started is not sent; a request partly
    /// written is completed, from a copy of its unsent bytes, before any
    /// other frame; the reply of a dropped call is discarded. Whether a
    /// dropped request was executed by the server is unknown, as after a
    /// timeout.
    pub async fn call(&self, kind: u16, parts: &[&[u8]]) -> Result<Bytes> {
        let (reply, _, _) = self.exchange(kind, parts, Waiter::Buffered).await?;
        Ok(reply)
    }

    /// Sends a request and waits for what its waiter (made by `waiter`)
    /// is given: the part `call` and `call_into_uninit` share. Returns it
    /// with the request's id and the call's deadline.
    async fn exchange<T>(
        &self,
        kind: u16,
        parts: &[&[u8]],
        waiter: impl FnOnce(oneshot::Sender<Result<T>>) -> Waiter,
    ) -> Result<(T, u64, tokio::time::Instant)> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > MAX_PAYLOAD_LEN {
            return Err(Error::invalid_argument(format!(
                "request of {len} bytes exceeds the frame limit of {MAX_PAYLOAD_LEN}"
            )));
        }
        let deadline = tokio::time::Instant::now() + self.opts.timeout;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = oneshot::channel();
        let mut guard = self.shared.register(id, waiter(tx))?;
        let header = FrameHeader::encode(id, kind, len);
        self.send(&header, parts, deadline).await?;
        let sent = Instant::now();
        let reply = match self.spin_for(&mut rx).await {
            Some(r) => r,
            None => match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(r)) => r,
                Ok(Err(_)) => Err(Error::unavailable(format!(
                    "connection to {} closed while waiting for a reply",
                    self.shared.peer
                ))),
                Err(_) => return Err(self.timed_out()),
            },
        };
        // The entry is gone: taken with the reply, or by a failure.
        guard.armed = false;
        self.shared.record_wait(sent.elapsed(), self.opts.spin);
        Ok((reply?, id, deadline))
    }

    /// Writes one frame (`header` then `parts`) under the writer lock,
    /// after any tail left by a dropped caller. Cancel safe (see
    /// `PartialFrame`).
    async fn send(
        &self,
        header: &[u8; HEADER_LEN],
        parts: &[&[u8]],
        deadline: tokio::time::Instant,
    ) -> Result<()> {
        let Ok(mut st) = tokio::time::timeout_at(deadline, self.writer.lock()).await else {
            return Err(self.timed_out());
        };
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        if self.is_closed() {
            return Err(self.shared.closed_error());
        }
        if st.tail.is_some() {
            // If this caller goes away while finishing another one's tail,
            // what is left of it still goes out (from a task).
            let mut rescue = TailRescue {
                conn: self,
                armed: true,
            };
            let flushed = flush_tail(&mut st, deadline).await;
            rescue.armed = false;
            if let Err(e) = flushed {
                return Err(fail_sending(&self.shared, &mut st, e, self.opts.timeout));
            }
        }
        let mut slices: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        slices.push(header);
        slices.extend(parts.iter().copied().filter(|p| !p.is_empty()));
        let left = slices.iter().map(|s| s.len()).sum();
        let mut frame = PartialFrame {
            st,
            conn: self,
            slices,
            first: 0,
            sent: 0,
            left,
            done: false,
        };
        while frame.left > 0 {
            let io: Vec<IoSlice<'_>> = frame.slices[frame.first..]
                .iter()
                .map(|s| IoSlice::new(s))
                .collect();
            let written = tokio::time::timeout_at(deadline, frame.st.wr.write_vectored(&io)).await;
            let failure = match written {
                Ok(Ok(0)) => SendError::Io(std::io::ErrorKind::WriteZero.into()),
                Ok(Ok(n)) => {
                    frame.advance(n);
                    continue;
                }
                Ok(Err(e)) => SendError::Io(e),
                Err(_) => SendError::Stalled,
            };
            // The connection is failed as a whole: nothing to keep.
            frame.done = true;
            return Err(fail_sending(
                &self.shared,
                &mut frame.st,
                failure,
                self.opts.timeout,
            ));
        }
        frame.done = true;
        // The frame is whole; over TLS part of it may wait for the socket.
        // If this caller goes away meanwhile, a task sends it.
        let mut rescue = TailRescue {
            conn: self,
            armed: true,
        };
        let flushed = flush_stream(&mut frame.st.wr, deadline).await;
        rescue.armed = false;
        if let Err(e) = flushed {
            return Err(fail_sending(
                &self.shared,
                &mut frame.st,
                e,
                self.opts.timeout,
            ));
        }
        Ok(())
    }

    /// Sends the tail a dropped caller left, from a task of the current
    /// runtime, so the server is not left waiting for the rest of a frame
    /// until the next call. Without a runtime the next caller sends it.
    fn spawn_tail_flush(&self) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let writer = self.writer.clone();
        let shared = self.shared.clone();
        let timeout = self.opts.timeout;
        rt.spawn(async move {
            let mut st = writer.lock().await;
            if st.failed.is_some() {
                return;
            }
            let deadline = tokio::time::Instant::now() + timeout;
            if let Err(e) = flush_tail(&mut st, deadline).await {
                fail_sending(&shared, &mut st, e, timeout);
            }
        });
    }

    /// Like [`Connection::call`], with the reply payload received by the
    /// kernel straight into `dst` (see the module docs): no intermediate
    /// buffer, no copy. Returns the payload's length; a reply longer than
    /// `dst` is a `Protocol` error. On an error, `dst` may hold part of the
    /// reply.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Connection::call`]: a call dropped while its
    /// payload is arriving leaves the rest to be skipped.
    pub async fn call_into(&self, kind: u16, parts: &[&[u8]], dst: &mut [u8]) -> Result<usize> {
        // SAFETY: a direct call writes only received bytes into `dst`.
        let dst = unsafe { init_as_uninit(dst) };
        self.call_into_uninit(kind, parts, dst, &mut []).await
    }

    /// Like [`Connection::call_into`], into memory that need not be
    /// initialised (a result buffer allocated for the reply, not zeroed),
    /// and with the last `trailer.len()` bytes of the payload (a status
    /// sent after the data, say) received into `trailer`. Returns the
    /// length of the rest, received into `dst`, whose first that many bytes
    /// are then initialised. A payload shorter than the trailer, or longer
    /// than both buffers, is a `Protocol` error.
    pub async fn call_into_uninit(
        &self,
        kind: u16,
        parts: &[&[u8]],
        dst: &mut [MaybeUninit<u8>],
        trailer: &mut [u8],
    ) -> Result<usize> {
        let cap = dst.len() + trailer.len();
        let trailer_len = trailer.len();
        if cap < DIRECT_REPLY_MIN {
            return self.call_copied(kind, parts, dst, trailer).await;
        }
        let (len, id, deadline) = self
            .exchange(kind, parts, |tx| Waiter::Direct {
                tx,
                cap,
                trailer: trailer_len,
            })
            .await?;
        let data = len - trailer_len;
        if data > 0 {
            self.receive_parked(id, &mut dst[..data], deadline).await?;
        }
        if trailer_len > 0 {
            // SAFETY: only received bytes are written into `trailer`.
            let trailer = unsafe { init_as_uninit(trailer) };
            self.receive_parked(id, trailer, deadline).await?;
        }
        Ok(data)
    }

    /// [`Connection::call_into_uninit`] into buffers of fewer than
    /// [`DIRECT_REPLY_MIN`] bytes: the reply is received with the frames
    /// around it and copied out of the receive buffer (see
    /// [`DIRECT_REPLY_MIN`] for why).
    async fn call_copied(
        &self,
        kind: u16,
        parts: &[&[u8]],
        dst: &mut [MaybeUninit<u8>],
        trailer: &mut [u8],
    ) -> Result<usize> {
        let (reply, _, _) = self.exchange(kind, parts, Waiter::Buffered).await?;
        let len = reply.len();
        if len > dst.len() + trailer.len() || len < trailer.len() {
            return Err(Error::protocol(format!(
                "{} sent a reply of {len} bytes for a buffer of {} and a trailer of {}",
                self.shared.peer,
                dst.len(),
                trailer.len()
            )));
        }
        let data = len - trailer.len();
        // SAFETY: `reply` holds `len >= data` bytes and is not `dst`.
        unsafe {
            std::ptr::copy_nonoverlapping(reply.as_ptr(), dst.as_mut_ptr().cast::<u8>(), data)
        };
        trailer.copy_from_slice(&reply[data..]);
        self.shared
            .copies
            .small
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(data)
    }

    /// Receives the payload of direct reply `id`, for which the stream is
    /// parked, into `dst` (exactly its length), then unparks the stream.
    async fn receive_parked(
        &self,
        id: u64,
        dst: &mut [MaybeUninit<u8>],
        deadline: tokio::time::Instant,
    ) -> Result<()> {
        let shared = &*self.shared;
        let mut guard = ParkedGuard {
            shared,
            id,
            left: dst.len(),
        };
        let mut spin = Spin::begin(self.opts.spin, shared.spin_stats());
        loop {
            let got = dst.len() - guard.left;
            let received = shared.receive_now(id, &mut dst[got..]);
            guard.left -= received?;
            if guard.left == 0 {
                return Ok(());
            }
            if spin.as_ref().is_some_and(Spin::again) {
                tokio::task::yield_now().await;
                continue;
            }
            spin = None;
            match tokio::time::timeout_at(deadline, shared.inbound.rd.readable()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    let e = io_error(&format!("connection to {}", shared.peer), e);
                    shared.fail_all(&e);
                    return Err(e);
                }
                Err(_) => return Err(self.timed_out()),
            }
        }
    }

    /// Busy-polls the socket for the reply for up to the spin budget,
    /// reading and dispatching replies itself (no thread wake-up needed),
    /// and yielding between polls so other tasks keep running.
    async fn spin_for<T>(&self, rx: &mut oneshot::Receiver<Result<T>>) -> Option<Result<T>> {
        let spin = Spin::begin(self.opts.spin, self.shared.spin_stats())?;
        loop {
            match rx.try_recv() {
                Ok(r) => return Some(r),
                Err(oneshot::error::TryRecvError::Closed) => return None,
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            match self.shared.pump() {
                Ok(Pump::Progress) => continue,
                Ok(Pump::Idle | Pump::Busy | Pump::Parked) => {}
                Err(e) => {
                    self.shared.fail_all(&e);
                    return None;
                }
            }
            if !spin.again() {
                return None;
            }
            tokio::task::yield_now().await;
        }
    }

    fn timed_out(&self) -> Error {
        Error::timeout(format!(
            "no reply from {} within {:?}",
            self.shared.peer, self.opts.timeout
        ))
    }
}

/// `buf` as memory to receive into.
///
/// # Safety
/// Only initialised bytes may be written through the result.
unsafe fn init_as_uninit(buf: &mut [u8]) -> &mut [MaybeUninit<u8>] {
    // SAFETY: the caller writes only initialised bytes.
    unsafe { &mut *(buf as *mut [u8] as *mut [MaybeUninit<u8>]) }
}

/// Reads replies whenever nobody is spinning for them.
async fn read_loop(shared: Arc<Shared>) {
    let err = loop {
        if let Err(e) = shared.inbound.rd.readable().await {
            break io_error(&format!("connection to {}", shared.peer), e);
        }
        // `pump` reads to EAGAIN; reporting WouldBlock through `try_io` makes
        // the reactor clear its readiness and wait for new data.
        let outcome = shared.inbound.rd.try_io(|| match shared.pump() {
            Ok(Pump::Idle | Pump::Progress) => Err(std::io::ErrorKind::WouldBlock.into()),
            other => Ok(other),
        });
        match outcome {
            Err(_) => {}
            Ok(Ok(Pump::Parked)) => shared.inbound.unparked.notified().await,
            Ok(Ok(_busy)) => tokio::task::yield_now().await,
            Ok(Err(e)) => break e,
        }
    };
    shared.fail_all(&err);
}

/// One shared connection per peer address, reconnecting when a connection
/// has failed.
pub struct ConnectionPool {
    opts: ConnOptions,
    handshake: Arc<dyn ClientHandshake>,
    conns: Mutex<HashMap<String, Arc<Connection>>>,
    copies: Arc<ReplyCopies>,
}

impl ConnectionPool {
    pub fn new(timeout: Duration) -> ConnectionPool {
        ConnectionPool::with_options(ConnOptions::new(timeout))
    }

    /// A pool whose connections run the default handshake (the
    /// wire-version check, as a client).
    pub fn with_options(opts: ConnOptions) -> ConnectionPool {
        ConnectionPool::with_handshake(opts, default_client_handshake())
    }

    /// A pool whose connections run `handshake` when they connect (to name
    /// another role, or to authenticate).
    pub fn with_handshake(
        opts: ConnOptions,
        handshake: Arc<dyn ClientHandshake>,
    ) -> ConnectionPool {
        ConnectionPool {
            opts,
            handshake,
            conns: Mutex::new(HashMap::new()),
            copies: Arc::default(),
        }
    }

    /// How the payloads of direct replies reached their callers' buffers,
    /// over every connection this pool has made.
    pub fn reply_copies(&self) -> &ReplyCopies {
        &self.copies
    }

    pub fn timeout(&self) -> Duration {
        self.opts.timeout
    }

    /// The live connection to `addr`, connecting if there is none.
    ///
    /// Cancel safe: dropping the future abandons a connection attempt in
    /// progress and leaves the pool as it was.
    pub async fn get(&self, addr: &str) -> Result<Arc<Connection>> {
        if let Some(c) = sync::lock(&self.conns).get(addr) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let conn = Arc::new(
            Connection::connect_counting(
                addr,
                self.opts,
                self.handshake.as_ref(),
                self.copies.clone(),
            )
            .await?,
        );
        let mut map = sync::lock(&self.conns);
        // Another task may have connected meanwhile; keep the first live one.
        match map.get(addr) {
            Some(existing) if !existing.is_closed() => Ok(existing.clone()),
            _ => {
                map.insert(addr.to_string(), conn.clone());
                Ok(conn)
            }
        }
    }

    /// Sends one request to `addr` over the pooled connection.
    ///
    /// Cancel safe, as [`ConnectionPool::get`] and [`Connection::call`].
    pub async fn call(&self, addr: &str, kind: u16, parts: &[&[u8]]) -> Result<Bytes> {
        self.get(addr).await?.call(kind, parts).await
    }
}
