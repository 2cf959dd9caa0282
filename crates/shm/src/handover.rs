//! Handing a region's memfd to a co-located client over a Unix socket.
//!
//! The server listens on an abstract Unix socket (Linux abstract namespace:
//! no file, the name is only visible inside the server's network
//! namespace). On each connection it sends one message: the
//! [`HEADER_LEN`]-byte header as data, with the memfd attached as
//! `SCM_RIGHTS` ancillary data. The client validates the header and the
//! descriptor before mapping anything ([`Region::open`]). The connection
//! then stays open without traffic: when the server goes away the client
//! sees end-of-file and stops using the mapping.
//!
//! This uses `libc::sendmsg`/`recvmsg` directly rather than the `nix` crate:
//! two short, contained functions do not justify a new dependency.

use crate::layout::HEADER_LEN;
use crate::Region;
use std::io::{self, Read};
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Prefix of every storage server's abstract socket name.
pub const NAME_PREFIX: &str = "nodekernel-store-";

/// Control buffer with the alignment `cmsghdr` needs, with room for a few
/// descriptors (more than one is refused, but must be received to be closed).
#[repr(C, align(8))]
struct Cmsg([u8; 128]);

/// Sends `region`'s header and memfd on the connected stream socket `sock`.
/// On a non-blocking socket this may fail with `WouldBlock`; retry when it
/// is writable.
pub fn send_region(sock: BorrowedFd<'_>, region: &Region) -> io::Result<()> {
    let header = region.layout().encode();
    let fd: RawFd = region.file().as_raw_fd();
    let mut iov = libc::iovec {
        iov_base: header.as_ptr() as *mut libc::c_void,
        iov_len: header.len(),
    };
    let mut cbuf = Cmsg([0; 128]);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
    debug_assert!(space <= cbuf.0.len());
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.0.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: msg_control points to `space` aligned bytes, enough for one
    // cmsghdr carrying one descriptor, so CMSG_FIRSTHDR is non-null and
    // CMSG_DATA has room for the descriptor (written unaligned to be safe).
    // sendmsg only reads `msg`, `iov`, `header` and `cbuf`, all alive here.
    let sent = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() {
            return Err(io::Error::other("no room for the control message"));
        }
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    if sent as usize != header.len() {
        // The descriptor went with the first byte; the rest of a 64-byte
        // message on a fresh connection always fits, so this is a broken
        // peer. Give up on the connection.
        return Err(io::Error::other(format!(
            "sent {sent} of {} header bytes",
            header.len()
        )));
    }
    Ok(())
}

/// Receives a region from a server (blocking, bounded by the socket's read
/// timeout), validates it and maps it.
pub fn receive_region(sock: &UnixStream) -> io::Result<Region> {
    let (header, fd) = receive(sock)?;
    Region::open(fd, &header)
}

/// Receives the header bytes and exactly one descriptor.
fn receive(sock: &UnixStream) -> io::Result<([u8; HEADER_LEN], OwnedFd)> {
    let mut header = [0u8; HEADER_LEN];
    let mut iov = libc::iovec {
        iov_base: header.as_mut_ptr().cast(),
        iov_len: header.len(),
    };
    let mut cbuf = Cmsg([0; 128]);
    // SAFETY: an all-zero msghdr is a valid empty message.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.0.as_mut_ptr().cast();
    msg.msg_controllen = cbuf.0.len() as _;
    let n = loop {
        // SAFETY: every pointer in `msg` refers to live buffers of the
        // stated sizes; the kernel writes at most that much.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(match e.kind() {
                io::ErrorKind::WouldBlock => io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no region received before the timeout",
                ),
                _ => e,
            });
        }
    };
    // Take ownership of every descriptor received first, so that all of
    // them are closed on any error below.
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `msg_controllen` bytes of `cbuf` with
    // well-formed control messages; CMSG_FIRSTHDR/CMSG_NXTHDR walk them
    // within that length. SCM_RIGHTS payloads are arrays of descriptors
    // now installed in our table, which we own from here on.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..bytes / size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.add(i));
                    if fd >= 0 {
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control data truncated",
        ));
    }
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the storage server closed the connection without sending its region",
        ));
    }
    if fds.len() != 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("expected one descriptor, received {}", fds.len()),
        ));
    }
    if n < HEADER_LEN {
        // The rest of the header (without descriptors) may come separately.
        (&*sock).read_exact(&mut header[n..])?;
    }
    Ok((header, fds.pop().expect("one descriptor")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;

    #[test]
    fn hand_over_over_a_socket_pair() {
        let r = Region::create(4096, 4).unwrap();
        r.write(1, 7, 10, b"shared").unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        send_region(a.as_fd(), &r).unwrap();
        let mapped = receive_region(&b).unwrap();
        assert_eq!(mapped.layout(), r.layout());
        let mut out = [0u8; 6];
        mapped.read(1, 7, 10, &mut out).unwrap();
        assert_eq!(&out, b"shared");
        // A write through the second mapping is seen by the first.
        mapped.write(1, 8, 0, b"claimed").unwrap();
        assert_eq!(r.generation(1), Some(8));
        let mut out = [0u8; 7];
        r.read(1, 8, 0, &mut out).unwrap();
        assert_eq!(&out, b"claimed");
        // A stopped server's region is refused.
        r.close();
        assert!(mapped.is_closed());
        send_region(a.as_fd(), &r).unwrap();
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("stopped"), "{e}");
    }

    #[test]
    fn refuses_missing_or_foreign_descriptors() {
        let mut buf = [0u8; HEADER_LEN];
        buf.copy_from_slice(&crate::Layout::new(4096, 1).unwrap().encode());

        // Header without a descriptor.
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&buf).unwrap();
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("descriptor"), "{e}");

        // Peer closes without sending.
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert_eq!(
            receive_region(&b).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );

        // A descriptor that is not a sealed memfd (a socket) is refused,
        // and so is a plain file.
        let (a, b) = UnixStream::pair().unwrap();
        let (other, _keep) = UnixStream::pair().unwrap();
        send_raw(&a, &buf, other.as_raw_fd());
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("memfd"), "{e}");
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        send_raw(&a, &buf, f.as_raw_fd());
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("memfd"), "{e}");

        // A real region with a header that claims more than it holds.
        let r = Region::create(4096, 1).unwrap();
        let mut lie = crate::Layout::new(4096, 2).unwrap().encode();
        send_raw(&a, &lie, r.file().as_raw_fd());
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("bytes"), "{e}");
        // ... or a consistent but different one than in the memfd.
        lie = crate::Layout::new(2048, 2).unwrap().encode();
        send_raw(&a, &lie, r.file().as_raw_fd());
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("differs"), "{e}");
        // Garbage header.
        send_raw(&a, &[0xAB; HEADER_LEN], r.file().as_raw_fd());
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
    }

    /// Sends `data` with `fd` attached.
    fn send_raw(sock: &UnixStream, data: &[u8], fd: RawFd) {
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let mut cbuf = Cmsg([0; 128]);
        // SAFETY: as in `send_region`.
        unsafe {
            let space = libc::CMSG_SPACE(size_of::<RawFd>() as u32) as usize;
            let mut msg: libc::msghdr = zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.0.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
            assert_eq!(
                libc::sendmsg(sock.as_raw_fd(), &msg, 0),
                data.len() as isize
            );
        }
    }
}
