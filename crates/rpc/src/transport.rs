//! The two socket kinds a connection runs over: TCP, and Unix-domain
//! sockets for peers on the same host (a round trip there skips the TCP
//! stack: about 3 µs instead of 8 µs when both ends poll).
//!
//! An address is `host:port` for TCP, `unix:/path` for a Unix socket bound
//! to a path, and `unix:@name` for one in the abstract namespace (which
//! exists only inside one host's network namespace, so reaching it proves
//! the peer is local).

use crate::limits::LISTEN_BACKLOG;
use crate::sock::{recv_now, recv_raw};
use crate::tls_io::TlsSession;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use tokio::net::{tcp, unix, TcpListener, TcpStream, UnixListener, UnixStream};

/// Prefix of Unix-socket addresses.
pub const UNIX_PREFIX: &str = "unix:";

/// The address of the abstract Unix socket `name`.
pub fn abstract_unix_addr(name: &str) -> String {
    format!("{UNIX_PREFIX}@{name}")
}

/// A Unix-socket address: `@name` is abstract, anything else a path.
fn std_unix_addr(spec: &str) -> io::Result<std::os::unix::net::SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    match spec.strip_prefix('@') {
        Some(name) => std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()),
        None => std::os::unix::net::SocketAddr::from_pathname(spec),
    }
}

/// A connected socket of either kind. A TCP socket may carry a TLS
/// session ([`crate::tls`]), run in line by every read and write
/// ([`crate::tls_io`]).
pub(crate) enum Stream {
    Tcp(TcpStream, Option<Arc<TlsSession>>),
    Unix(UnixStream),
}

impl Stream {
    /// Connects to `addr` (see the module docs for the forms).
    pub(crate) async fn connect(addr: &str) -> io::Result<Stream> {
        match addr.strip_prefix(UNIX_PREFIX) {
            Some(spec) => {
                // Connecting to a listening Unix socket completes at once
                // (the kernel queues it for accept), so the blocking call
                // does not stall the runtime.
                let s = std::os::unix::net::UnixStream::connect_addr(&std_unix_addr(spec)?)?;
                s.set_nonblocking(true)?;
                Ok(Stream::Unix(UnixStream::from_std(s)?))
            }
            None => {
                let s = TcpStream::connect(addr).await?;
                s.set_nodelay(true)?;
                set_keepalive(s.as_raw_fd());
                Ok(Stream::Tcp(s, None))
            }
        }
    }

    /// Whether this is a TCP socket without TLS.
    pub(crate) fn is_plain_tcp(&self) -> bool {
        matches!(self, Stream::Tcp(_, None))
    }

    /// Writes all of `buf` (used only before the stream is split).
    pub(crate) async fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Stream::Tcp(s, None) => s.write_all(buf).await,
            Stream::Tcp(s, Some(tls)) => {
                let mut off = 0;
                while off < buf.len() {
                    let slice = [io::IoSlice::new(&buf[off..])];
                    match s.try_io(Interest::WRITABLE, || tls.send(&slice)) {
                        Ok(n) => off += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => s.writable().await?,
                        Err(e) => return Err(e),
                    }
                }
                loop {
                    match s.try_io(Interest::WRITABLE, || tls.flush()) {
                        Ok(()) => return Ok(()),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => s.writable().await?,
                        Err(e) => return Err(e),
                    }
                }
            }
            Stream::Unix(s) => s.write_all(buf).await,
        }
    }

    /// Reads what is available into the spare capacity of `buf` (used only
    /// before the stream is split). `Ok(0)`: end of stream.
    pub(crate) async fn read_buf(&mut self, buf: &mut bytes::BytesMut) -> io::Result<usize> {
        match self {
            Stream::Tcp(s, None) => s.read_buf(buf).await,
            Stream::Tcp(s, Some(tls)) => loop {
                let mut recv = || match tls_recv_now(tls, buf, usize::MAX) {
                    Ok(None) => Err(io::ErrorKind::WouldBlock.into()),
                    Ok(Some(n)) => Ok(n),
                    Err(e) => Err(e),
                };
                // What the session holds needs no readiness (see
                // `TlsSession::has_input`).
                let got = if tls.has_input() {
                    recv()
                } else {
                    s.try_io(Interest::READABLE, recv)
                };
                match got {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => s.readable().await?,
                    Err(e) => return Err(e),
                }
            },
            Stream::Unix(s) => s.read_buf(buf).await,
        }
    }

    pub(crate) fn raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s, _) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }

    /// A duplicate of the descriptor (for shutting the socket down from
    /// outside the task that owns it).
    pub(crate) fn dup(&self) -> io::Result<OwnedFd> {
        match self {
            Stream::Tcp(s, _) => s.as_fd().try_clone_to_owned(),
            Stream::Unix(s) => s.as_fd().try_clone_to_owned(),
        }
    }

    pub(crate) fn split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s, None) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), Box::new(w))
            }
            Stream::Tcp(s, Some(tls)) => {
                let (r, w) = s.into_split();
                let writer = TlsWriter {
                    wr: w,
                    tls: tls.clone(),
                };
                (ReadHalf::Tls(r, tls), Box::new(writer))
            }
            Stream::Unix(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Unix(r), Box::new(w))
            }
        }
    }
}

/// Receives from `tls` into the spare capacity of `buf` (at most `max`
/// bytes), as [`crate::sock::recv_now`] does from a plain socket.
fn tls_recv_now(
    tls: &TlsSession,
    buf: &mut bytes::BytesMut,
    max: usize,
) -> io::Result<Option<usize>> {
    use bytes::BufMut;
    let spare = buf.chunk_mut();
    let len = spare.len().min(max);
    // SAFETY: `spare` is writable memory of at least `len` bytes.
    let n = unsafe { tls.recv(spare.as_mut_ptr(), len)? };
    if let Some(n) = n {
        // SAFETY: `n` bytes were just written.
        unsafe { buf.advance_mut(n) };
    }
    Ok(n)
}

/// The sending half: both kinds support vectored writes. Over TLS a
/// write encrypts and sends what the socket takes; what it did not take
/// yet goes out on the next write or flush (callers flush after each
/// frame or batch of replies; a plain socket's flush does nothing).
pub(crate) type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// The sending half of a TLS connection: plaintext in, records out.
struct TlsWriter {
    wr: tcp::OwnedWriteHalf,
    tls: Arc<TlsSession>,
}

impl TlsWriter {
    /// Runs `f` (a non-blocking step of the session) until it is done or
    /// the socket must become writable first.
    fn poll_step<R>(
        &self,
        cx: &mut Context<'_>,
        mut f: impl FnMut() -> io::Result<R>,
    ) -> Poll<io::Result<R>> {
        let tcp: &TcpStream = self.wr.as_ref();
        loop {
            match tcp.try_io(Interest::WRITABLE, &mut f) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Err(e) = ready!(tcp.poll_write_ready(cx)) {
                        return Poll::Ready(Err(e));
                    }
                }
                r => return Poll::Ready(r),
            }
        }
    }
}

impl AsyncWrite for TlsWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let slices = [io::IoSlice::new(buf)];
        self.poll_step(cx, || self.tls.send(&slices))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_step(cx, || self.tls.send(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_step(cx, || self.tls.flush())
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tls.close();
        ready!(self.poll_step(cx, || self.tls.flush()))?;
        Pin::new(&mut self.wr).poll_shutdown(cx)
    }
}

impl Drop for TlsWriter {
    /// Ends the session cleanly (`close_notify`, sent if the socket takes
    /// it now) before the socket is shut down for writing.
    fn drop(&mut self) {
        self.tls.close();
    }
}

/// The receiving half. Reads go straight to the descriptor
/// (`crate::recv_now`), or through the TLS session on it; the half is
/// only asked for readiness.
pub(crate) enum ReadHalf {
    Tcp(tcp::OwnedReadHalf),
    Tls(tcp::OwnedReadHalf, Arc<TlsSession>),
    Unix(unix::OwnedReadHalf),
}

impl ReadHalf {
    pub(crate) fn fd(&self) -> RawFd {
        match self {
            ReadHalf::Tcp(r) | ReadHalf::Tls(r, _) => AsRef::<TcpStream>::as_ref(r).as_raw_fd(),
            ReadHalf::Unix(r) => AsRef::<UnixStream>::as_ref(r).as_raw_fd(),
        }
    }

    /// The TLS session on this socket, if any.
    pub(crate) fn tls(&self) -> Option<&TlsSession> {
        match self {
            ReadHalf::Tls(_, tls) => Some(tls),
            _ => None,
        }
    }

    /// Reads what the socket has right now into the spare capacity of
    /// `buf`, at most `max` bytes (see [`crate::sock::recv_now`]; over TLS,
    /// decrypted bytes).
    pub(crate) fn recv_now(
        &self,
        buf: &mut bytes::BytesMut,
        max: usize,
    ) -> io::Result<Option<usize>> {
        match self {
            ReadHalf::Tls(_, tls) => tls_recv_now(tls, buf, max),
            _ => recv_now(self.fd(), buf, max),
        }
    }

    /// Like [`recv_now`](Self::recv_now), into `dst` (memory the caller
    /// may not have initialised: only received bytes are written).
    pub(crate) fn recv_into(&self, dst: &mut [MaybeUninit<u8>]) -> io::Result<Option<usize>> {
        // SAFETY: `dst` is writable memory of `dst.len()` bytes.
        unsafe { self.recv_raw(dst.as_mut_ptr().cast(), dst.len()) }
    }

    /// Like [`recv_now`](Self::recv_now), at most `len` bytes to `ptr`.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes.
    pub(crate) unsafe fn recv_raw(&self, ptr: *mut u8, len: usize) -> io::Result<Option<usize>> {
        debug_assert!(len > 0);
        match self {
            // SAFETY: as this function's contract.
            ReadHalf::Tls(_, tls) => unsafe { tls.recv(ptr, len) },
            // SAFETY: as this function's contract.
            _ => unsafe { recv_raw(self.fd(), ptr, len) },
        }
    }

    /// Waits until the reactor reports the socket readable; over TLS, not
    /// at all while the session holds input (see
    /// [`TlsSession::has_input`]).
    pub(crate) async fn readable(&self) -> io::Result<()> {
        match self {
            ReadHalf::Tls(_, tls) if tls.has_input() => Ok(()),
            ReadHalf::Tcp(r) | ReadHalf::Tls(r, _) => r.readable().await,
            ReadHalf::Unix(r) => r.readable().await,
        }
    }

    /// Waits until the reactor reports the socket writable (the half
    /// shares the socket with the write half).
    pub(crate) async fn writable(&self) -> io::Result<()> {
        match self {
            ReadHalf::Tcp(r) | ReadHalf::Tls(r, _) => {
                AsRef::<TcpStream>::as_ref(r).writable().await
            }
            ReadHalf::Unix(r) => AsRef::<UnixStream>::as_ref(r).writable().await,
        }
    }

    /// Runs `f` (a write on the descriptor); a `WouldBlock` from it clears
    /// the reactor's write readiness.
    pub(crate) fn try_write_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        let interest = Interest::WRITABLE;
        match self {
            ReadHalf::Tcp(r) | ReadHalf::Tls(r, _) => {
                AsRef::<TcpStream>::as_ref(r).try_io(interest, f)
            }
            ReadHalf::Unix(r) => AsRef::<UnixStream>::as_ref(r).try_io(interest, f),
        }
    }

    /// Runs `f` (a read on the descriptor); a `WouldBlock` from it clears
    /// the reactor's readiness so the next `readable` waits for new data.
    /// (tokio calls `f` only while it has seen the socket readable.) Over
    /// TLS, reads report `WouldBlock` only when the session holds no input
    /// either, and while it holds some `f` runs whatever the reactor saw:
    /// the socket may have been drained into the session.
    pub(crate) fn try_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        let interest = Interest::READABLE;
        match self {
            ReadHalf::Tls(_, tls) if tls.has_input() => f(),
            ReadHalf::Tcp(r) | ReadHalf::Tls(r, _) => {
                AsRef::<TcpStream>::as_ref(r).try_io(interest, f)
            }
            ReadHalf::Unix(r) => AsRef::<UnixStream>::as_ref(r).try_io(interest, f),
        }
    }
}

/// Who may connect to a server's Unix sockets: root, the server's own user,
/// and members of one configured group. A peer is known by the kernel's
/// record of its credentials when it connected (`SO_PEERCRED`, and
/// `SO_PEERGROUPS` for its supplementary groups), which it cannot forge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPeers {
    pub uid: u32,
    pub gid: Option<u32>,
}

impl LocalPeers {
    /// Root and the user this process runs as.
    pub fn owner() -> LocalPeers {
        LocalPeers {
            // SAFETY: geteuid has no preconditions and cannot fail.
            uid: unsafe { libc::geteuid() },
            gid: None,
        }
    }

    /// These peers and the members of group `gid`.
    pub fn with_group(self, gid: Option<u32>) -> LocalPeers {
        LocalPeers { gid, ..self }
    }

    /// Whether the peer of the Unix socket `fd` may connect; the refusal
    /// says who the peer is.
    pub fn check(&self, fd: RawFd) -> Result<(), String> {
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into the live local.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(format!(
                "the peer's credentials are unknown: {}",
                io::Error::last_os_error()
            ));
        }
        if cred.uid == 0 || cred.uid == self.uid {
            return Ok(());
        }
        if let Some(g) = self.gid {
            if cred.gid == g || peer_groups(fd).contains(&g) {
                return Ok(());
            }
        }
        Err(format!(
            "process {} runs as user {} (group {}); this server's local sockets accept only \
             user {}{} and root",
            cred.pid,
            cred.uid,
            cred.gid,
            self.uid,
            self.gid.map(|g| format!(", group {g}")).unwrap_or_default()
        ))
    }
}

/// The supplementary groups of the peer of `fd` (empty when unknown).
fn peer_groups(fd: RawFd) -> Vec<u32> {
    let mut groups = vec![0 as libc::gid_t; 256];
    let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `groups`.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERGROUPS,
            groups.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Vec::new();
    }
    groups.truncate(len as usize / std::mem::size_of::<libc::gid_t>());
    groups
}

/// A listening socket of either kind.
pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    /// Accepts a connection; returns it with a printable peer name and
    /// the peer it counts against (its IP address, or its user for a Unix
    /// socket).
    pub(crate) async fn accept(&self) -> io::Result<(Stream, String, String)> {
        match self {
            Listener::Tcp(l) => {
                let (s, peer) = l.accept().await?;
                let _ = s.set_nodelay(true);
                set_keepalive(s.as_raw_fd());
                Ok((
                    Stream::Tcp(s, None),
                    peer.to_string(),
                    peer.ip().to_string(),
                ))
            }
            Listener::Unix(l) => {
                let (s, _) = l.accept().await?;
                let (name, key) = match s.peer_cred() {
                    Ok(c) => (
                        format!(
                            "a local process (pid {}, user {})",
                            c.pid().unwrap_or(0),
                            c.uid()
                        ),
                        format!("local user {}", c.uid()),
                    ),
                    Err(_) => ("a local process".to_string(), "local".to_string()),
                };
                Ok((Stream::Unix(s), name, key))
            }
        }
    }

    pub(crate) fn dup(&self) -> io::Result<OwnedFd> {
        match self {
            Listener::Tcp(l) => l.as_fd().try_clone_to_owned(),
            Listener::Unix(l) => l.as_fd().try_clone_to_owned(),
        }
    }

    /// Lets [`LISTEN_BACKLOG`] connections wait to be accepted (listening
    /// again only changes the backlog; the kernel caps it at
    /// `net.core.somaxconn`). Best effort: a failure is logged.
    pub(crate) fn widen_backlog(&self) {
        let fd = match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l) => l.as_raw_fd(),
        };
        // SAFETY: listen(2) on a socket we own, already listening.
        if unsafe { libc::listen(fd, LISTEN_BACKLOG) } != 0 {
            tracing::warn!(
                "cannot widen the listen backlog to {LISTEN_BACKLOG}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// Turns TCP keepalive on for `fd` with the probes of [`crate::limits`], so
/// a peer that vanished without closing (a crashed host, a cut link) is
/// noticed even on an idle connection. Best effort: a failure is logged.
fn set_keepalive(fd: RawFd) {
    use crate::limits::{KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES};
    let opts: [(libc::c_int, libc::c_int, libc::c_int); 4] = [
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPIDLE,
            KEEPALIVE_IDLE.as_secs() as libc::c_int,
        ),
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPINTVL,
            KEEPALIVE_INTERVAL.as_secs() as libc::c_int,
        ),
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPCNT,
            KEEPALIVE_PROBES as libc::c_int,
        ),
    ];
    for (level, name, value) in opts {
        // SAFETY: setsockopt reads `size_of::<c_int>()` bytes from a live
        // local; `fd` is an open socket owned by the caller.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            tracing::debug!(
                "setting TCP keepalive option {name}: {}",
                io::Error::last_os_error()
            );
            return;
        }
    }
}

/// Raises this process's soft limit on open descriptors to its hard limit,
/// once per process (a server holds two descriptors per connection).
pub(crate) fn raise_nofile_limit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one `rlimit` into the live local.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
            tracing::debug!("getrlimit(NOFILE): {}", io::Error::last_os_error());
            return;
        }
        if lim.rlim_cur >= lim.rlim_max {
            tracing::debug!("open-file limit already at its maximum ({})", lim.rlim_cur);
            return;
        }
        let old = lim.rlim_cur;
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: setrlimit reads one `rlimit` from the live local.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } == 0 {
            tracing::debug!("raised the open-file limit from {old} to {}", lim.rlim_max);
        } else {
            tracing::debug!(
                "raising the open-file limit from {old} to {}: {}",
                lim.rlim_max,
                io::Error::last_os_error()
            );
        }
    });
}

/// Binds a Unix listener at `addr` (`unix:@name` or `unix:/path`).
pub fn bind_unix(addr: &str) -> io::Result<UnixListener> {
    let spec = addr.strip_prefix(UNIX_PREFIX).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{addr} is not a Unix-socket address ({UNIX_PREFIX}@name or {UNIX_PREFIX}/path)"
            ),
        )
    })?;
    let l = std::os::unix::net::UnixListener::bind_addr(&std_unix_addr(spec)?)?;
    l.set_nonblocking(true)?;
    UnixListener::from_std(l)
}

/// Binds a fresh abstract Unix socket named `prefix` plus 64 random bits in
/// hex; returns the name (without the leading NUL) and the listener.
pub fn bind_abstract_unix(prefix: &str) -> io::Result<(String, UnixListener)> {
    let mut attempt = 0;
    loop {
        let name = format!("{prefix}{:016x}", random_u64());
        match bind_unix(&abstract_unix_addr(&name)) {
            Ok(l) => return Ok((name, l)),
            // 64 random bits collided: try another name.
            Err(e) if e.kind() == io::ErrorKind::AddrInUse && attempt < 3 => attempt += 1,
            Err(e) => return Err(e),
        }
    }
}

fn random_u64() -> u64 {
    let mut r = [0u8; 8];
    if crate::random::random_bytes(&mut r).is_ok() {
        return u64::from_le_bytes(r);
    }
    // No randomness at all: time and pid, mixed. Names only need to differ
    // between servers of one host.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    (t ^ (u64::from(std::process::id()) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn abstract_names_are_distinct_and_prefixed() {
        let (a, _la) = bind_abstract_unix("nk-test-").unwrap();
        let (b, _lb) = bind_abstract_unix("nk-test-").unwrap();
        assert!(
            a.starts_with("nk-test-") && a.len() == "nk-test-".len() + 16,
            "{a}"
        );
        assert_ne!(a, b);
    }

    fn sockopt(fd: RawFd, level: libc::c_int, name: libc::c_int) -> libc::c_int {
        let mut v: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into the live local.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                level,
                name,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", io::Error::last_os_error());
        v
    }

    #[tokio::test]
    async fn tcp_connections_probe_idle_peers_on_both_ends() {
        use crate::limits::{KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_PROBES};
        let listener = Listener::Tcp(TcpListener::bind("127.0.0.1:0").await.unwrap());
        let Listener::Tcp(l) = &listener else {
            unreachable!()
        };
        let addr = l.local_addr().unwrap().to_string();
        let (client, accepted) = tokio::join!(Stream::connect(&addr), listener.accept());
        for s in [client.unwrap(), accepted.unwrap().0] {
            let fd = s.raw_fd();
            assert_eq!(sockopt(fd, libc::SOL_SOCKET, libc::SO_KEEPALIVE), 1);
            assert_eq!(
                sockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) as u64,
                KEEPALIVE_IDLE.as_secs()
            );
            assert_eq!(
                sockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPINTVL) as u64,
                KEEPALIVE_INTERVAL.as_secs()
            );
            assert_eq!(
                sockopt(fd, libc::IPPROTO_TCP, libc::TCP_KEEPCNT) as u32,
                KEEPALIVE_PROBES
            );
        }
    }
}
