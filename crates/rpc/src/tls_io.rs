//! A TLS session run in line on a non-blocking TCP socket: the transport's
//! reads decrypt straight from the socket into its own buffers (or a
//! caller's), and its writes encrypt straight from the frames it sends, so
//! a TLS connection keeps everything a plain one has (busy polling,
//! replies received into callers' buffers, bounded buffers, back-pressure)
//! with no task and no socket pair in between.
//!
//! [`TlsSession`] wraps a rustls [`rustls::Connection`] behind a lock (the
//! connection's receiving and sending sides both drive it) and talks to the
//! socket with `recv`/`sendmsg(MSG_DONTWAIT)` straight on its descriptor,
//! like [`crate::sock`]. Every method is non-blocking: "nothing now" is
//! `Ok(None)` or a `WouldBlock` error, after which the caller waits for the
//! socket's readiness as it does on a plain socket. A read reports
//! "nothing now" only when no input is left in the session and the socket
//! had nothing. The converse needs care: a busy poll may drain the socket
//! into the session and take only part of it (a reply's header), and the
//! kernel reports no readiness for bytes already read, so while
//! [`TlsSession::has_input`] holds, the transport reads without waiting
//! for readiness (`ReadHalf::readable`, `ReadHalf::try_io`).
//!
//! Bounds: ciphertext is received [`RECV_STAGE`] bytes at a time, rustls
//! holds at most 16 KiB of decrypted bytes (its default), and at most
//! [`SEND_LIMIT`] bytes of encrypted output wait for the socket; a write
//! takes nothing more until they went out.
//!
//! Kernel TLS (the `tls` ULP) would let the kernel do the record layer
//! and keep the descriptor plain; the kernels this was built on do not
//! offer it (`/proc/sys/net/ipv4/tcp_available_ulp`), see
//! `docs/security.md`.

use crate::sock::recv_raw;
use nodekernel_proto::Error;
use std::io::{self, BufRead, IoSlice, Write};
use std::os::fd::RawFd;
use std::sync::Mutex;
use tokio::io::Interest;
use tokio::net::TcpStream;

/// Ciphertext received from the socket in one `recv`.
pub(crate) const RECV_STAGE: usize = 64 * 1024;

/// Encrypted bytes that may wait for the socket (rustls's buffer limit):
/// a write encrypts at most this much at a time.
pub(crate) const SEND_LIMIT: usize = 256 * 1024;

/// One TLS session on one TCP socket. The socket itself is owned by
/// whoever holds the session (a [`crate::transport::Stream`] or its
/// halves), who keeps it open while they use the session.
pub(crate) struct TlsSession {
    fd: RawFd,
    inner: Mutex<Inner>,
}

struct Inner {
    conn: rustls::Connection,
    /// Ciphertext received and not yet given to rustls:
    /// `stage[start..end]`.
    stage: Box<[u8]>,
    start: usize,
    end: usize,
    /// `close_notify` was queued.
    closing: bool,
}

impl std::fmt::Debug for TlsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSession")
            .field("fd", &self.fd)
            .finish_non_exhaustive()
    }
}

/// The socket as rustls's output: `sendmsg(MSG_DONTWAIT | MSG_NOSIGNAL)`.
struct FdOut(RawFd);

impl Write for FdOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        // SAFETY: an all-zero msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // IoSlice is guaranteed ABI compatible with iovec; sendmsg only
        // reads the slices.
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len().min(libc::UIO_MAXIOV as usize) as _;
        loop {
            // SAFETY: `msg` points at `bufs`, alive for the call.
            let n = unsafe { libc::sendmsg(self.0, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
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

impl TlsSession {
    /// A session for `conn` (before or after its handshake) on the TCP
    /// socket `fd`.
    pub(crate) fn new(mut conn: rustls::Connection, fd: RawFd) -> TlsSession {
        conn.set_buffer_limit(Some(SEND_LIMIT));
        TlsSession {
            fd,
            inner: Mutex::new(Inner {
                conn,
                stage: vec![0u8; RECV_STAGE].into_boxed_slice(),
                start: 0,
                end: 0,
                closing: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves rustls's state as it was
        // at some step: still a valid state to fail from (the one policy,
        // `nodekernel_proto::sync`).
        nodekernel_proto::sync::lock(&self.inner)
    }

    /// Receives decrypted bytes into `dst` (at most `len`) without
    /// waiting: `Ok(Some(n))` with `n > 0` bytes, `Ok(Some(0))` when the
    /// peer ended the session cleanly, `Ok(None)` when nothing is there
    /// now (nothing buffered here either). An error ends the session: a
    /// TLS alert or a record that does not decrypt (its `get_ref` is the
    /// rustls error), or a TCP end without `close_notify`.
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes (it need not be
    /// initialised: only received bytes are written).
    pub(crate) unsafe fn recv(&self, dst: *mut u8, len: usize) -> io::Result<Option<usize>> {
        let mut guard = self.lock();
        let s = &mut *guard;
        let mut got = 0;
        loop {
            // What rustls decrypted already goes first.
            loop {
                if got == len {
                    return Ok(Some(got));
                }
                let mut reader = s.conn.reader();
                match reader.fill_buf() {
                    // The peer's close_notify: the end of the stream.
                    Ok([]) => return Ok(Some(got)),
                    Ok(chunk) => {
                        let n = chunk.len().min(len - got);
                        // SAFETY: `chunk` holds `n` bytes; the caller
                        // guarantees `dst + got .. dst + len` is writable,
                        // and it is not rustls's memory.
                        unsafe { std::ptr::copy_nonoverlapping(chunk.as_ptr(), dst.add(got), n) };
                        reader.consume(n);
                        got += n;
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) if got > 0 => return Ok(Some(got)),
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, CUT_SHORT))
                    }
                    Err(e) => return Err(e),
                }
            }
            if s.start == s.end {
                if got > 0 {
                    return Ok(Some(got));
                }
                // SAFETY: `stage` is our own memory of that length.
                match unsafe { recv_raw(self.fd, s.stage.as_mut_ptr(), s.stage.len())? } {
                    None => {
                        // Nothing to read: a good moment to send what a
                        // received record asked for (a key update's
                        // answer), if the socket takes it.
                        let _ = s.write_out(self.fd);
                        return Ok(None);
                    }
                    Some(0) => {
                        // The TCP end: rustls decides whether it was clean.
                        s.conn.read_tls(&mut &[][..])?;
                        continue;
                    }
                    Some(n) => {
                        s.start = 0;
                        s.end = n;
                    }
                }
            }
            s.feed(self.fd)?;
        }
    }

    /// Takes plaintext from `bufs` (encrypting it) and writes what it can
    /// to the socket, without waiting. Returns how many plaintext bytes
    /// were taken; they go out before anything written after them (see
    /// [`flush`](Self::flush)). `WouldBlock` when encrypted output is
    /// still waiting for the socket and the socket takes nothing now.
    pub(crate) fn send(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut s = self.lock();
        s.write_out(self.fd)?;
        if s.closing {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the TLS session was ended on this side",
            ));
        }
        let n = s.conn.writer().write_vectored(bufs)?;
        match s.write_out(self.fd) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(n),
        }
    }

    /// Writes the encrypted output still waiting, without waiting:
    /// `WouldBlock` while some is left.
    pub(crate) fn flush(&self) -> io::Result<()> {
        self.lock().write_out(self.fd)
    }

    /// Whether a read would find bytes here without the socket:
    /// decrypted bytes, or ciphertext received and not yet decrypted.
    /// While it does, readers must not wait for the socket's readiness:
    /// the socket may have been drained into the session (by a busy
    /// poll), and the kernel reports no readiness for data already read.
    pub(crate) fn has_input(&self) -> bool {
        let mut s = self.lock();
        s.start < s.end || matches!(s.conn.reader().fill_buf(), Ok(c) if !c.is_empty())
    }

    /// Whether encrypted output waits for the socket.
    pub(crate) fn wants_write(&self) -> bool {
        self.lock().conn.wants_write()
    }

    /// Ends the session on this side: queues `close_notify` (once) and
    /// writes what the socket takes now.
    pub(crate) fn close(&self) {
        let mut s = self.lock();
        if !s.closing {
            s.closing = true;
            s.conn.send_close_notify();
        }
        let _ = s.write_out(self.fd);
    }

    /// Runs the TLS handshake on `tcp` (the socket of this session) to its
    /// end. Errors as [`recv`](Self::recv)'s; the peer closing during the
    /// handshake is an `UnexpectedEof`.
    pub(crate) async fn handshake(&self, tcp: &TcpStream) -> io::Result<()> {
        loop {
            loop {
                match tcp.try_io(Interest::WRITABLE, || self.flush()) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => tcp.writable().await?,
                    Err(e) => return Err(e),
                }
            }
            if !self.lock().conn.is_handshaking() {
                return Ok(());
            }
            match tcp.try_io(Interest::READABLE, || self.pull_handshake()) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => tcp.readable().await?,
                Err(e) => return Err(e),
            }
        }
    }

    /// One `recv` of handshake records, processed (what they answer is
    /// queued); `WouldBlock` when the socket has nothing.
    fn pull_handshake(&self) -> io::Result<()> {
        let mut guard = self.lock();
        let s = &mut *guard;
        if s.start == s.end {
            // SAFETY: `stage` is our own memory of that length.
            match unsafe { recv_raw(self.fd, s.stage.as_mut_ptr(), s.stage.len())? } {
                None => return Err(would_block()),
                Some(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection during the TLS handshake",
                    ))
                }
                Some(n) => {
                    s.start = 0;
                    s.end = n;
                }
            }
        }
        // Records after the handshake's last stay staged for `recv`.
        while s.start < s.end && s.conn.is_handshaking() {
            s.feed(self.fd)?;
        }
        Ok(())
    }
}

impl Inner {
    /// Gives rustls the next staged ciphertext and processes it. A failure
    /// sends the alert rustls queued for it (best effort).
    fn feed(&mut self, fd: RawFd) -> io::Result<()> {
        let mut staged = &self.stage[self.start..self.end];
        let before = staged.len();
        self.conn.read_tls(&mut staged)?;
        self.start += before - staged.len();
        if let Err(e) = self.conn.process_new_packets() {
            let _ = self.write_out(fd);
            return Err(tls_io_error(e));
        }
        Ok(())
    }

    /// Writes encrypted output until none is left (`Ok`) or the socket
    /// takes no more (`WouldBlock`).
    fn write_out(&mut self, fd: RawFd) -> io::Result<()> {
        while self.conn.wants_write() {
            if self.conn.write_tls(&mut FdOut(fd))? == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
        }
        Ok(())
    }
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
