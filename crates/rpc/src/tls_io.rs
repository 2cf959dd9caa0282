//! A TLS session run in line on a non-blocking TCP socket: the transport's
//! reads decrypt straight from the socket's bytes into its own buffers (or
//! a caller's), and its writes encrypt straight from the frames it sends,
//! so a TLS connection keeps everything a plain one has (busy polling,
//! replies received into callers' buffers, bounded buffers, back-pressure)
//! with no task and no socket pair in between.
//!
//! [`TlsSession`] drives rustls's *unbuffered* connection
//! ([`rustls::unbuffered`]; rustls stays the record layer) behind a lock
//! (the connection's receiving and sending sides both drive it), and talks
//! to the socket with `recv`/`send(MSG_DONTWAIT)` straight on its
//! descriptor, like [`crate::sock`]. The buffered `rustls::Connection` this
//! replaces copied every received record from our stage into a deframer
//! buffer of its own (which it grew and shrank around each record) and
//! kept every outgoing record in a `Vec` of its own until the socket took
//! it; here the session owns both buffers:
//!
//! - received ciphertext lands in one stage ([`RECV_STAGE`]), where rustls
//!   decrypts each record in place (`process_tls_records`). rustls 0.23
//!   still hands the plaintext out as a `Vec` it copies the record into
//!   (`ReadTraffic::next_record`); the session copies it from there into
//!   the destination at once, so that `Vec` is freed before the next record
//!   and the allocator hands the same, cache-warm block back each time.
//!   What a destination had no room for waits here (`rest`) for the next
//!   read;
//! - outgoing records are encrypted into one send buffer (at most
//!   [`SEND_LIMIT`] bytes of records; `WriteTraffic::encrypt`) and go to the
//!   socket in one `send` per batch, so a 1 MiB write is a handful of
//!   syscalls. Small frames given as several slices (a header and its
//!   payload) are gathered into one record, as the buffered API did.
//!
//! Every method is non-blocking: "nothing now" is `Ok(None)` or a
//! `WouldBlock` error, after which the caller waits for the socket's
//! readiness as it does on a plain socket. A read reports "nothing now"
//! only when no input is left in the session and the socket had nothing.
//! The converse needs care: a busy poll may drain the socket into the
//! session and take only part of it (a reply's header), and the kernel
//! reports no readiness for bytes already read, so while
//! [`TlsSession::has_input`] holds, the transport reads without waiting for
//! readiness (`ReadHalf::readable`, `ReadHalf::try_io`). A record only
//! partly received is no input: the rest must come from the socket.
//!
//! Bounds: ciphertext is received into a stage of [`RECV_STAGE`] bytes
//! (rustls itself refuses handshake messages over 64 KiB, and a stage full
//! of one unfinished message fails the session); decrypted bytes wait here
//! only when a destination was too small or the sending side had to step
//! past records to encrypt (at most what the stage held); at most
//! [`SEND_LIMIT`] bytes of encrypted application data wait for the socket,
//! and a write takes nothing more until there is room for a record. TLS's
//! own messages (a key update's answer, session tickets, alerts) may add
//! [`CONTROL_SLACK`] bytes more; a peer that makes us answer more than that
//! without reading fails the session.
//!
//! Kernel TLS (the `tls` ULP) would let the kernel do the record layer
//! and keep the descriptor plain; the kernels this was built on do not
//! offer it (`/proc/sys/net/ipv4/tcp_available_ulp`), see
//! `docs/security.md`.

use crate::sock::recv_raw;
use nodekernel_proto::Error;
use rustls::client::UnbufferedClientConnection;
use rustls::server::UnbufferedServerConnection;
use rustls::unbuffered::{ConnectionState, EncodeError, EncryptError, WriteTraffic};
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::sync::Mutex;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Ciphertext received from the socket (the stage rustls decrypts in).
pub(crate) const RECV_STAGE: usize = 64 * 1024;

/// Encrypted application data that may wait for the socket: a write
/// encrypts at most this much at a time.
pub(crate) const SEND_LIMIT: usize = 256 * 1024;

/// Encrypted TLS messages of its own (handshake, key update answers,
/// alerts) that may wait beyond [`SEND_LIMIT`].
pub(crate) const CONTROL_SLACK: usize = 64 * 1024;

/// Plaintext in one TLS record (the protocol's limit).
const MAX_FRAGMENT: usize = 16 * 1024;

/// The most ciphertext one record of [`MAX_FRAGMENT`] bytes takes (TLS
/// 1.3 allows 256 bytes of expansion and a 5-byte header): the room a
/// write wants before it encrypts a record.
const MAX_RECORD: usize = MAX_FRAGMENT + 256 + 5;

/// The send buffer's first size (it grows to [`SEND_LIMIT`] as writes
/// need): connections that only exchange small messages keep it small.
const FIRST_OUT: usize = 2 * MAX_RECORD;

/// One TLS session on one TCP socket. The socket itself is owned by
/// whoever holds the session (a [`crate::transport::Stream`] or its
/// halves), who keeps it open while they use the session.
pub(crate) struct TlsSession {
    fd: RawFd,
    inner: Mutex<Inner>,
}

/// Either end of a connection.
pub(crate) enum Conn {
    Client(UnbufferedClientConnection),
    Server(UnbufferedServerConnection),
}

impl From<UnbufferedClientConnection> for Conn {
    fn from(c: UnbufferedClientConnection) -> Conn {
        Conn::Client(c)
    }
}

impl From<UnbufferedServerConnection> for Conn {
    fn from(c: UnbufferedServerConnection) -> Conn {
        Conn::Server(c)
    }
}

/// Runs `$body` with `$c` bound to the connection, whichever end it is
/// (the two have the same methods on different types).
macro_rules! with_conn {
    ($conn:expr, $c:ident => $body:expr) => {
        match $conn {
            Conn::Client($c) => $body,
            Conn::Server($c) => $body,
        }
    };
}

struct Inner {
    conn: Conn,
    /// Received ciphertext: `stage[io.start..io.end]` is what rustls has
    /// not discarded yet (whole records not processed yet, the start of
    /// one still arriving, or a handshake message it is joining in place).
    stage: Box<[u8]>,
    io: Io,
}

/// The session's state besides the connection and the stage (a separate
/// struct so it can be borrowed while rustls borrows those two).
struct Io {
    start: usize,
    end: usize,
    /// The stage may hold records rustls has not looked at yet (bytes
    /// arrived, or a read stopped when its destination was full). Cleared
    /// when rustls reports it needs more input.
    unseen: bool,
    /// Decrypted bytes no destination took yet: `rest[rest_at..]`.
    rest: Vec<u8>,
    rest_at: usize,
    /// Encrypted output waiting for the socket: `out[out_start..out_end]`.
    out: Vec<u8>,
    out_start: usize,
    out_end: usize,
    /// Small slices gathered into one record.
    gather: Vec<u8>,
    /// The peer's `close_notify` was received.
    peer_closed: bool,
    /// The socket reported its end (a read returned 0).
    eof: bool,
    /// `close` was called: nothing more is taken to send.
    closing: bool,
    /// Our `close_notify` was encrypted.
    close_sent: bool,
    /// Why the session failed; every later call reports it.
    failed: Option<rustls::Error>,
}

impl std::fmt::Debug for TlsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSession")
            .field("fd", &self.fd)
            .finish_non_exhaustive()
    }
}

/// A rustls error as an I/O error (its `get_ref` is the rustls error, for
/// [`tls_failure`]).
fn tls_io_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

fn would_block() -> io::Error {
    io::ErrorKind::WouldBlock.into()
}

/// What an unclean end of a TLS session is reported as.
const CUT_SHORT: &str = "the peer closed the TCP connection without ending its TLS session \
                         (no close_notify): the stream may have been cut short";

/// What a step of the connection (one state rustls reported) came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Handled; ask rustls for its next state.
    Again,
    /// The read's destination is full.
    Full,
    /// rustls needs more input (the stage holds no whole record it has
    /// not processed), and the handshake is far enough to send
    /// application data.
    Idle,
    /// rustls needs more input to go on with the handshake.
    Blocked,
    /// The peer's `close_notify` (a read stops there).
    PeerClosed,
    /// Both ends sent `close_notify`: nothing more happens.
    Closed,
}

/// What the caller driving the connection wants from it.
enum Want<'a, 'b> {
    /// Only the handshake (or whatever rustls must do by itself).
    Handshake,
    /// Decrypted bytes into `dst`, `got` of them written so far.
    Read {
        dst: &'a mut [MaybeUninit<u8>],
        got: usize,
    },
    /// `bufs` encrypted, `taken` bytes of them so far.
    Write {
        bufs: &'a [IoSlice<'b>],
        taken: usize,
    },
    /// Our `close_notify` encrypted.
    Close,
}

impl TlsSession {
    /// A session for `conn` (before its handshake) on the TCP socket `fd`.
    pub(crate) fn new(conn: Conn, fd: RawFd) -> TlsSession {
        TlsSession {
            fd,
            inner: Mutex::new(Inner {
                conn,
                stage: vec![0u8; RECV_STAGE].into_boxed_slice(),
                io: Io {
                    start: 0,
                    end: 0,
                    // A client's first step writes its hello from nothing.
                    unseen: true,
                    rest: Vec::new(),
                    rest_at: 0,
                    out: Vec::new(),
                    out_start: 0,
                    out_end: 0,
                    gather: Vec::new(),
                    peer_closed: false,
                    eof: false,
                    closing: false,
                    close_sent: false,
                    failed: None,
                },
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the session as it was at
        // some step: still a valid state to fail from (the one policy,
        // `nodekernel_proto::sync`).
        nodekernel_proto::sync::lock(&self.inner)
    }

    /// Receives decrypted bytes into `dst` (at most `len`) without
    /// waiting: `Ok(Some(n))` with `n > 0` bytes, `Ok(Some(0))` when the
    /// peer ended the session cleanly, `Ok(None)` when nothing is there
    /// now (nothing buffered here either). An error ends the session: a
    /// TLS alert or a record that does not decrypt (its `get_ref` is the
    /// rustls error), or a TCP end without `close_notify` (after every
    /// whole record before it was delivered).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes (it need not be
    /// initialised: only received bytes are written).
    pub(crate) unsafe fn recv(&self, dst: *mut u8, len: usize) -> io::Result<Option<usize>> {
        // SAFETY: the caller guarantees `dst` is writable for `len` bytes;
        // as `MaybeUninit` nothing is read from it.
        let dst = unsafe { std::slice::from_raw_parts_mut(dst.cast::<MaybeUninit<u8>>(), len) };
        let mut guard = self.lock();
        let s = &mut *guard;
        let mut got = 0;
        loop {
            got += s.io.take_rest(&mut dst[got..]);
            if got == len {
                return Ok(Some(got));
            }
            if let Some(e) = &s.io.failed {
                return match got {
                    0 => Err(tls_io_error(e.clone())),
                    // The bytes before the failure first; the failure on
                    // the next read.
                    n => Ok(Some(n)),
                };
            }
            if s.io.unseen {
                let mut want = Want::Read {
                    dst: &mut dst[..],
                    got,
                };
                let step = s.drive(self.fd, &mut want);
                if let Want::Read { got: n, .. } = want {
                    got = n;
                }
                // What those records asked for (a key update's answer)
                // goes out if the socket takes it now.
                let _ = s.io.write_out(self.fd);
                match step {
                    Err(e) if got == 0 => return Err(e),
                    Err(_) => return Ok(Some(got)),
                    Ok(Step::Full | Step::PeerClosed | Step::Closed) => return Ok(Some(got)),
                    Ok(_) => continue,
                }
            }
            if s.io.peer_closed || got > 0 {
                return Ok(Some(got));
            }
            if s.io.eof {
                // The stage holds no whole record rustls has not processed:
                // whatever is left of the stream was cut short.
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, CUT_SHORT));
            }
            match s.receive(self.fd)? {
                None => {
                    // Nothing to read: a good moment to send what a
                    // received record asked for, if the socket takes it.
                    let _ = s.io.write_out(self.fd);
                    return Ok(None);
                }
                Some(0) => s.io.eof = true,
                Some(_) => {}
            }
        }
    }

    /// Takes plaintext from `bufs` (encrypting it) and writes what it can
    /// to the socket, without waiting. Returns how many plaintext bytes
    /// were taken; they go out before anything written after them (see
    /// [`flush`](Self::flush)). `WouldBlock` when the encrypted output
    /// waiting for the socket leaves no room for a record and the socket
    /// takes nothing now.
    pub(crate) fn send(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut guard = self.lock();
        let s = &mut *guard;
        match s.io.write_out(self.fd) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => return Err(e),
            _ => {}
        }
        if s.io.closing {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the TLS session was ended on this side",
            ));
        }
        if bufs.iter().all(|b| b.is_empty()) {
            return Ok(0);
        }
        if !s.io.data_room() {
            // Output waits and the last `send` found the socket full.
            return Err(would_block());
        }
        let mut want = Want::Write { bufs, taken: 0 };
        let step = s.drive(self.fd, &mut want)?;
        let Want::Write { taken, .. } = want else {
            unreachable!("a write's want stays a write")
        };
        if taken == 0 && step == Step::Closed {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the TLS session is closed",
            ));
        }
        match s.io.write_out(self.fd) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ if taken == 0 => Err(io::ErrorKind::WriteZero.into()),
            _ => Ok(taken),
        }
    }

    /// Writes the encrypted output still waiting, without waiting:
    /// `WouldBlock` while some is left.
    pub(crate) fn flush(&self) -> io::Result<()> {
        self.lock().io.write_out(self.fd)
    }

    /// Whether a read would find something here without the socket:
    /// decrypted bytes, whole records received and not yet decrypted, or
    /// the session's end (the peer's `close_notify`, a failure). While it
    /// does, readers must not wait for the socket's readiness: the socket
    /// may have been drained into the session (by a busy poll), and the
    /// kernel reports no readiness for data already read.
    pub(crate) fn has_input(&self) -> bool {
        let s = self.lock();
        s.io.rest_at < s.io.rest.len() || s.io.unseen || s.io.peer_closed || s.io.failed.is_some()
    }

    /// Whether encrypted output waits for the socket.
    pub(crate) fn wants_write(&self) -> bool {
        let s = self.lock();
        s.io.out_start < s.io.out_end
    }

    /// Ends the session on this side: encrypts `close_notify` (once) and
    /// writes what the socket takes now.
    pub(crate) fn close(&self) {
        let mut guard = self.lock();
        let s = &mut *guard;
        if !s.io.closing {
            s.io.closing = true;
            let _ = s.drive(self.fd, &mut Want::Close);
        }
        let _ = s.io.write_out(self.fd);
    }

    /// Runs the TLS handshake on `tcp` (the socket of this session) to its
    /// end. Errors as [`recv`](Self::recv)'s; the peer closing during the
    /// handshake is an `UnexpectedEof`.
    pub(crate) async fn handshake(&self, tcp: &TcpStream) -> io::Result<()> {
        loop {
            // Outside `try_io`: a client's first step (its hello) needs
            // no input, and tokio runs a read only once the socket has
            // shown readiness.
            self.step_handshake()?;
            loop {
                match tcp.try_io(Interest::WRITABLE, || self.flush()) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => tcp.writable().await?,
                    Err(e) => return Err(e),
                }
            }
            if !self.lock().handshaking() {
                return Ok(());
            }
            match tcp.try_io(Interest::READABLE, || self.pull_handshake()) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => tcp.readable().await?,
                Err(e) => return Err(e),
            }
        }
    }

    /// Processes what is staged: handshake messages (what they answer is
    /// encoded into the send buffer), and records after the handshake's
    /// last (application data waits in `rest` for `recv`).
    fn step_handshake(&self) -> io::Result<()> {
        let mut guard = self.lock();
        let s = &mut *guard;
        if s.io.unseen {
            s.drive(self.fd, &mut Want::Handshake)?;
        }
        Ok(())
    }

    /// One `recv` of handshake records; `WouldBlock` when the socket has
    /// nothing.
    fn pull_handshake(&self) -> io::Result<()> {
        match self.lock().receive(self.fd)? {
            None => Err(would_block()),
            Some(0) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection during the TLS handshake",
            )),
            Some(_) => Ok(()),
        }
    }
}

impl Inner {
    fn handshaking(&self) -> bool {
        with_conn!(&self.conn, c => c.is_handshaking())
    }

    /// One `recv` from the socket onto the end of the stage (what rustls
    /// still holds moves to its front first when the end has too little
    /// room for a record). `Ok(None)`: nothing there now; `Ok(Some(0))`:
    /// the socket's end.
    fn receive(&mut self, fd: RawFd) -> io::Result<Option<usize>> {
        let io = &mut self.io;
        if io.start == io.end {
            io.start = 0;
            io.end = 0;
        } else if self.stage.len() - io.end < MAX_RECORD && io.start > 0 {
            // rustls sees the same bytes at the front of the next slice it
            // is given, so it may keep offsets into them.
            self.stage.copy_within(io.start..io.end, 0);
            io.end -= io.start;
            io.start = 0;
        }
        if io.end == self.stage.len() {
            // A full stage rustls made nothing of: a handshake message it
            // is still joining that fills all of it.
            let e = rustls::Error::General(format!(
                "the peer sent a TLS message larger than the {RECV_STAGE}-byte receive stage"
            ));
            io.failed = Some(e.clone());
            return Err(tls_io_error(e));
        }
        // SAFETY: `stage[end..]` is our own memory of that length.
        let got = unsafe {
            recv_raw(
                fd,
                self.stage.as_mut_ptr().add(io.end),
                self.stage.len() - io.end,
            )?
        };
        if let Some(n) = got {
            io.end += n;
            if n > 0 {
                io.unseen = true;
            }
        }
        Ok(got)
    }

    /// Steps the connection through what the stage holds (and what rustls
    /// must send of its own accord) until the caller's want is met or
    /// rustls needs more input. A failure is kept (later calls report it),
    /// and the alert rustls made for it is sent if the socket takes it.
    fn drive(&mut self, fd: RawFd, want: &mut Want<'_, '_>) -> io::Result<Step> {
        if let Some(e) = &self.io.failed {
            return Err(tls_io_error(e.clone()));
        }
        loop {
            let (start, end) = (self.io.start, self.io.end);
            let stage = &mut self.stage[start..end];
            let io = &mut self.io;
            let (discard, result) = with_conn!(&mut self.conn, c => {
                let status = c.process_tls_records(stage);
                let result = match status.state {
                    Ok(state) => io.handle(state, want),
                    Err(e) => Err(e),
                };
                (status.discard, result)
            });
            let (extra, step) = match result {
                Ok(r) => r,
                Err(e) => {
                    self.io.start += discard;
                    self.io.failed = Some(e.clone());
                    self.send_alert(fd);
                    return Err(tls_io_error(e));
                }
            };
            // Bounded: rustls discards at most what it was given.
            self.io.start = (self.io.start + discard + extra).min(self.io.end);
            match step {
                Step::Again => continue,
                Step::Idle | Step::Blocked | Step::Closed => self.io.unseen = false,
                Step::Full | Step::PeerClosed => {}
            }
            return Ok(step);
        }
    }

    /// After a failure: encodes the alert rustls queued for it and writes
    /// it, best effort. rustls hands out what it queued before it looks
    /// at the stage again, and it is asked only while something is queued
    /// (looking at the failed record again would fail it twice).
    fn send_alert(&mut self, fd: RawFd) {
        for _ in 0..4 {
            let (start, end) = (self.io.start, self.io.end);
            let stage = &mut self.stage[start..end];
            let io = &mut self.io;
            let (discard, more) = with_conn!(&mut self.conn, c => {
                if !c.wants_write() {
                    break;
                }
                let status = c.process_tls_records(stage);
                let more = match status.state {
                    Ok(ConnectionState::EncodeTlsData(mut d)) => io.encode(&mut d).is_ok(),
                    Ok(ConnectionState::ReadTraffic(mut t)) => {
                        // Plaintext of records before the failure: nobody
                        // reads it any more.
                        while let Some(Ok(_)) = t.next_record() {}
                        true
                    }
                    _ => false,
                };
                (status.discard, more)
            });
            self.io.start = (self.io.start + discard).min(self.io.end);
            if !more {
                break;
            }
        }
        let _ = self.io.write_out(fd);
    }
}

impl Io {
    /// Handles one state rustls reported; returns how much more of the
    /// stage to discard (what its records ask for) and what it came to.
    fn handle<Data>(
        &mut self,
        state: ConnectionState<'_, '_, Data>,
        want: &mut Want<'_, '_>,
    ) -> Result<(usize, Step), rustls::Error> {
        match state {
            ConnectionState::ReadTraffic(mut traffic) => {
                let mut extra = 0;
                while let Some(record) = traffic.next_record() {
                    let record = record?;
                    extra += record.discard;
                    self.take_plaintext(record.payload, want);
                }
                let full = matches!(want, Want::Read { dst, got } if *got == dst.len());
                Ok((extra, if full { Step::Full } else { Step::Again }))
            }
            ConnectionState::EncodeTlsData(mut data) => {
                self.encode(&mut data)?;
                Ok((0, Step::Again))
            }
            ConnectionState::TransmitTlsData(t) => {
                // It is in `out`, ahead of anything encrypted after it;
                // `write_out` sends it.
                t.done();
                Ok((0, Step::Again))
            }
            ConnectionState::BlockedHandshake => Ok((0, Step::Blocked)),
            ConnectionState::WriteTraffic(mut traffic) => {
                match want {
                    Want::Write { bufs, taken } => self.encrypt(&mut traffic, bufs, taken)?,
                    Want::Close if !self.close_sent => {
                        loop {
                            match traffic.queue_close_notify(&mut self.out[self.out_end..]) {
                                Ok(n) => {
                                    self.out_end += n;
                                    break;
                                }
                                Err(EncryptError::InsufficientSize(s)) => {
                                    self.reserve(s.required_size, SEND_LIMIT + CONTROL_SLACK)?
                                }
                                Err(EncryptError::EncryptExhausted) => {
                                    return Err(rustls::Error::EncryptError)
                                }
                            }
                        }
                        self.close_sent = true;
                    }
                    _ => {}
                }
                Ok((0, Step::Idle))
            }
            ConnectionState::PeerClosed => {
                self.peer_closed = true;
                // A read ends there; others go on (we may still send).
                let step = match want {
                    Want::Read { .. } => Step::PeerClosed,
                    _ => Step::Again,
                };
                Ok((0, step))
            }
            ConnectionState::Closed => {
                self.peer_closed = true;
                Ok((0, Step::Closed))
            }
            // Neither end enables early data (a server's
            // `max_early_data_size` stays 0), so rustls accepts none.
            ConnectionState::ReadEarlyData(_) => Err(rustls::Error::General(
                "TLS early data, which this end does not accept".into(),
            )),
            _ => Err(rustls::Error::General(
                "a TLS connection state this session does not know".into(),
            )),
        }
    }

    /// Gives a decrypted record to the read's destination, as much as it
    /// has room for; the rest (all of it, when no read is waiting) waits
    /// in `rest`.
    fn take_plaintext(&mut self, mut payload: &[u8], want: &mut Want<'_, '_>) {
        if let Want::Read { dst, got } = want {
            let n = payload.len().min(dst.len() - *got);
            // SAFETY: `payload` holds `n` bytes and `dst[*got..]` has room
            // for them; they do not overlap (rustls's memory and the
            // caller's).
            unsafe {
                std::ptr::copy_nonoverlapping(payload.as_ptr(), dst[*got..].as_mut_ptr().cast(), n)
            };
            *got += n;
            payload = &payload[n..];
        }
        if !payload.is_empty() {
            if self.rest_at == self.rest.len() {
                self.rest.clear();
                self.rest_at = 0;
            }
            self.rest.extend_from_slice(payload);
        }
    }

    /// Copies what waits in `rest` into `dst`; returns how much.
    fn take_rest(&mut self, dst: &mut [MaybeUninit<u8>]) -> usize {
        let n = (self.rest.len() - self.rest_at).min(dst.len());
        if n == 0 {
            return 0;
        }
        // SAFETY: `rest[rest_at..]` holds `n` bytes and `dst` has room for
        // them; our memory and the caller's do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.rest[self.rest_at..].as_ptr(),
                dst.as_mut_ptr().cast(),
                n,
            )
        };
        self.rest_at += n;
        if self.rest_at == self.rest.len() {
            self.rest.clear();
            self.rest_at = 0;
        }
        n
    }

    /// Encodes a TLS message of rustls's own into `out`.
    fn encode<Data>(
        &mut self,
        data: &mut rustls::unbuffered::EncodeTlsData<'_, Data>,
    ) -> Result<(), rustls::Error> {
        loop {
            match data.encode(&mut self.out[self.out_end..]) {
                Ok(n) => {
                    self.out_end += n;
                    return Ok(());
                }
                Err(EncodeError::InsufficientSize(s)) => {
                    self.reserve(s.required_size, SEND_LIMIT + CONTROL_SLACK)?
                }
                Err(EncodeError::AlreadyEncoded) => return Ok(()),
            }
        }
    }

    /// Makes room for `need` more bytes at the end of `out`, which may
    /// grow to `cap` bytes; the session fails past that.
    fn reserve(&mut self, need: usize, cap: usize) -> Result<(), rustls::Error> {
        if self.out_start == self.out_end {
            self.out_start = 0;
            self.out_end = 0;
        }
        if self.out.len() - self.out_end >= need {
            return Ok(());
        }
        if self.out_start > 0 {
            self.out.copy_within(self.out_start..self.out_end, 0);
            self.out_end -= self.out_start;
            self.out_start = 0;
        }
        let len = self.out_end + need;
        if len > cap {
            return Err(rustls::Error::General(format!(
                "more than {cap} bytes of TLS output wait for a peer that does not read them"
            )));
        }
        if len > self.out.len() {
            let grown = (self.out.len() * 2).max(FIRST_OUT).min(cap).max(len);
            self.out.resize(grown, 0);
        }
        Ok(())
    }

    /// Whether `out` has room for one more record of application data
    /// (growing it up to [`SEND_LIMIT`], or moving a small remainder to
    /// its front; a large one is left to drain instead of being copied).
    fn data_room(&mut self) -> bool {
        if self.out_start == self.out_end {
            self.out_start = 0;
            self.out_end = 0;
        }
        if self.out.len() - self.out_end >= MAX_RECORD {
            return true;
        }
        if self.out_end - self.out_start > SEND_LIMIT / 4 && self.out_start > 0 {
            return false;
        }
        self.reserve(MAX_RECORD, SEND_LIMIT).is_ok()
    }

    /// Encrypts from `bufs` (past the first `taken` bytes) into `out`, a
    /// record at a time, while `out` has room.
    fn encrypt<Data>(
        &mut self,
        traffic: &mut WriteTraffic<'_, Data>,
        bufs: &[IoSlice<'_>],
        taken: &mut usize,
    ) -> Result<(), rustls::Error> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        while *taken < total && self.data_room() {
            let (i, off) = locate(bufs, *taken);
            let cur = &bufs[i][off..];
            let direct = cur.len() >= MAX_FRAGMENT || cur.len() == total - *taken;
            let piece: &[u8] = if direct {
                // A record's worth straight from the caller's slice.
                &cur[..cur.len().min(MAX_FRAGMENT)]
            } else {
                // Small slices (a frame's header and payload) into one
                // record rather than a record each.
                self.gather.clear();
                let (mut j, mut o) = (i, off);
                while j < bufs.len() && self.gather.len() < MAX_FRAGMENT {
                    let s = &bufs[j][o..];
                    let k = s.len().min(MAX_FRAGMENT - self.gather.len());
                    self.gather.extend_from_slice(&s[..k]);
                    (j, o) = if k == s.len() { (j + 1, 0) } else { (j, o + k) };
                }
                &self.gather
            };
            let plen = piece.len();
            match traffic.encrypt(piece, &mut self.out[self.out_end..]) {
                Ok(n) => {
                    self.out_end += n;
                    *taken += plen;
                }
                // More than a record's room: rustls also sends a key
                // update of its own first. Room for both, then again.
                Err(EncryptError::InsufficientSize(s)) => {
                    let need = s.required_size;
                    self.reserve(need, SEND_LIMIT + CONTROL_SLACK)?
                }
                Err(EncryptError::EncryptExhausted) => return Err(rustls::Error::EncryptError),
            }
        }
        Ok(())
    }

    /// Writes encrypted output until none is left (`Ok`) or the socket
    /// takes no more (`WouldBlock`).
    fn write_out(&mut self, fd: RawFd) -> io::Result<()> {
        while self.out_start < self.out_end {
            let pending = &self.out[self.out_start..self.out_end];
            // SAFETY: `pending` is alive for the call; `send` only reads it.
            let n = unsafe {
                libc::send(
                    fd,
                    pending.as_ptr().cast(),
                    pending.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            self.out_start += n as usize;
        }
        self.out_start = 0;
        self.out_end = 0;
        Ok(())
    }
}

/// Where byte `at` of `bufs` is: the slice and the offset in it (`at`
/// must be below the slices' total length).
fn locate(bufs: &[IoSlice<'_>], mut at: usize) -> (usize, usize) {
    for (i, b) in bufs.iter().enumerate() {
        if at < b.len() {
            return (i, at);
        }
        at -= b.len();
    }
    (bufs.len().saturating_sub(1), 0)
}

/// Why a TLS session failed, as the connection's errors report it, when
/// `e` carries a TLS error; `None` for plain I/O errors. An alert from the
/// peer after the handshake is how a server refuses a client's
/// certificate in TLS 1.3 (the client finished its side already).
pub(crate) fn tls_failure(e: &io::Error) -> Option<Error> {
    let tls = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<rustls::Error>())?;
    Some(match tls {
        rustls::Error::AlertReceived(alert) => Error::unauthenticated(format!(
            "TLS: the peer ended the session with alert {alert:?}; it did not accept this \
             end's certificate (with require_client_cert, clients need [security.tls] \
             cert_file and key_file signed by the cluster's authority)"
        )),
        other => Error::unavailable(format!("TLS: {other}")),
    })
}
