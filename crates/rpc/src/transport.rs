//! The two socket kinds a connection runs over: TCP, and Unix-domain
//! sockets for peers on the same host (a round trip there skips the TCP
//! stack: about 3 µs instead of 8 µs when both ends poll).
//!
//! An address is `host:port` for TCP, `unix:/path` for a Unix socket bound
//! to a path, and `unix:@name` for one in the abstract namespace (which
//! exists only inside one host's network namespace, so reaching it proves
//! the peer is local).

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use tokio::io::AsyncWrite;
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

/// A connected socket of either kind.
pub(crate) enum Stream {
    Tcp(TcpStream),
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
                Ok(Stream::Tcp(s))
            }
        }
    }

    /// A duplicate of the descriptor (for shutting the socket down from
    /// outside the task that owns it).
    pub(crate) fn dup(&self) -> io::Result<OwnedFd> {
        match self {
            Stream::Tcp(s) => s.as_fd().try_clone_to_owned(),
            Stream::Unix(s) => s.as_fd().try_clone_to_owned(),
        }
    }

    pub(crate) fn split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Tcp(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tcp(r), Box::new(w))
            }
            Stream::Unix(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Unix(r), Box::new(w))
            }
        }
    }
}

/// The sending half: both kinds support vectored writes.
pub(crate) type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// The receiving half. Reads go straight to the descriptor
/// (`crate::recv_now`); the half is only asked for readiness.
pub(crate) enum ReadHalf {
    Tcp(tcp::OwnedReadHalf),
    Unix(unix::OwnedReadHalf),
}

impl ReadHalf {
    pub(crate) fn fd(&self) -> RawFd {
        match self {
            ReadHalf::Tcp(r) => AsRef::<TcpStream>::as_ref(r).as_raw_fd(),
            ReadHalf::Unix(r) => AsRef::<UnixStream>::as_ref(r).as_raw_fd(),
        }
    }

    /// Waits until the reactor reports the socket readable.
    pub(crate) async fn readable(&self) -> io::Result<()> {
        match self {
            ReadHalf::Tcp(r) => r.readable().await,
            ReadHalf::Unix(r) => r.readable().await,
        }
    }

    /// Runs `f` (a read on the descriptor); a `WouldBlock` from it clears
    /// the reactor's readiness so the next `readable` waits for new data.
    pub(crate) fn try_io<R>(&self, f: impl FnOnce() -> io::Result<R>) -> io::Result<R> {
        let interest = tokio::io::Interest::READABLE;
        match self {
            ReadHalf::Tcp(r) => AsRef::<TcpStream>::as_ref(r).try_io(interest, f),
            ReadHalf::Unix(r) => AsRef::<UnixStream>::as_ref(r).try_io(interest, f),
        }
    }
}

/// A listening socket of either kind.
pub(crate) enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    /// Accepts a connection; returns it with a printable peer name.
    pub(crate) async fn accept(&self) -> io::Result<(Stream, String)> {
        match self {
            Listener::Tcp(l) => {
                let (s, peer) = l.accept().await?;
                let _ = s.set_nodelay(true);
                Ok((Stream::Tcp(s), peer.to_string()))
            }
            Listener::Unix(l) => {
                let (s, _) = l.accept().await?;
                Ok((Stream::Unix(s), "a local Unix-socket client".to_string()))
            }
        }
    }

    pub(crate) fn dup(&self) -> io::Result<OwnedFd> {
        match self {
            Listener::Tcp(l) => l.as_fd().try_clone_to_owned(),
            Listener::Unix(l) => l.as_fd().try_clone_to_owned(),
        }
    }
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
    // SAFETY: getrandom writes at most r.len() bytes into `r`.
    let n = unsafe { libc::getrandom(r.as_mut_ptr().cast(), r.len(), 0) };
    if n == r.len() as isize {
        return u64::from_le_bytes(r);
    }
    // No getrandom: time and pid, mixed. Names only need to differ between
    // servers of one host.
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
}
