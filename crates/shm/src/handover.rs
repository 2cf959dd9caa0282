//! Handing a region's memfd to a co-located client over a Unix socket.
//!
//! The server listens on an abstract Unix socket (Linux abstract namespace:
//! no file, the name is only visible inside the server's network
//! namespace). On each connection it first sends a [`Challenge`] of
//! [`CHALLENGE_LEN`] bytes: a fresh random nonce, and whether it requires
//! the cluster token. The client answers with [`PROOF_LEN`] bytes: its
//! proof of the token over the nonce, or zeros without a token. A server
//! that requires the token and does not get a valid proof closes the
//! connection; otherwise it sends one message of [`MESSAGE_LEN`]
//! bytes: the [`HEADER_LEN`]-byte header, then the **grant**, the writer
//! slot given to that client process (u32 little-endian, [`NO_SLOT`] when
//! every client slot is taken) and 4 reserved zero bytes; the memfd is
//! attached as `SCM_RIGHTS` ancillary data. The client validates the
//! header, the slot and the descriptor before mapping anything
//! ([`ClientRegion::open`]).
//!
//! The connection then stays open without traffic, and both ends watch it:
//! when the server goes away the client sees end-of-file and stops using
//! the mapping; when the client process dies (the kernel closes its
//! sockets once all its threads are gone) or drops its mapping, the server
//! sees end-of-file and reclaims the slot
//! ([`SlotLease::reclaim`](crate::SlotLease::reclaim)). So a
//! client must keep the connection open for as long as it may access the
//! mapping, and close it only after its last access.
//!
//! This uses `libc::sendmsg`/`recvmsg` directly rather than the `nix` crate:
//! two short, contained functions do not justify a new dependency.

use crate::layout::{Layout, HEADER_LEN};
use crate::{ClientRegion, ServerRegion};
use std::io::{self, Read};
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

/// Prefix of every storage server's abstract socket name.
pub const NAME_PREFIX: &str = "nodekernel-store-";

/// First bytes of a [`Challenge`].
pub const CHALLENGE_MAGIC: [u8; 8] = *b"NKHANDO1";
/// Bytes of a [`Challenge`]: magic, flags (`u32`, bit 0: the token is
/// required), 4 reserved zero bytes, the nonce.
pub const CHALLENGE_LEN: usize = 8 + 4 + 4 + NONCE_LEN;
/// Bytes of a hand-over nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of the client's answer to a [`Challenge`].
pub const PROOF_LEN: usize = 32;

/// What the server sends first on a hand-over connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// The server hands its memory over only to a client proving the
    /// cluster token.
    pub token_required: bool,
    /// Fresh for each connection: a proof recorded on one connection is
    /// worthless on another.
    pub nonce: [u8; NONCE_LEN],
}

impl Challenge {
    pub fn encode(&self) -> [u8; CHALLENGE_LEN] {
        let mut b = [0u8; CHALLENGE_LEN];
        b[..8].copy_from_slice(&CHALLENGE_MAGIC);
        b[8..12].copy_from_slice(&u32::from(self.token_required).to_le_bytes());
        b[16..].copy_from_slice(&self.nonce);
        b
    }

    /// Decodes a challenge; anything else (another magic, unknown flags,
    /// reserved bytes set) is `InvalidData`.
    pub fn decode(b: &[u8; CHALLENGE_LEN]) -> io::Result<Challenge> {
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
        if b[..8] != CHALLENGE_MAGIC {
            return Err(bad("not a NodeKernel hand-over challenge (wrong magic)"));
        }
        let flags = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        if flags > 1 || b[12..16] != [0; 4] {
            return Err(bad("a hand-over challenge with unknown flags"));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[16..]);
        Ok(Challenge {
            token_required: flags == 1,
            nonce,
        })
    }
}

/// The client's side of the challenge (blocking, bounded by the socket's
/// timeouts): reads it, and answers with `prove(nonce)`, or zeros when
/// that is `None` (the client has no token). Fails, without answering,
/// when the server requires the token and the client has none.
pub fn answer_challenge(
    mut sock: &UnixStream,
    prove: impl FnOnce(&[u8; NONCE_LEN]) -> Option<[u8; PROOF_LEN]>,
) -> io::Result<()> {
    use std::io::Write;
    let mut b = [0u8; CHALLENGE_LEN];
    sock.read_exact(&mut b)?;
    let c = Challenge::decode(&b)?;
    let proof =
        match prove(&c.nonce) {
            Some(p) => p,
            None if c.token_required => return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the storage server hands its memory over only to clients with the cluster token",
            )),
            None => [0; PROOF_LEN],
        };
    sock.write_all(&proof)
}

/// Bytes of the hand-over message: the header and the grant.
pub const MESSAGE_LEN: usize = HEADER_LEN + 8;

/// The grant when the server has no client slot left: the client must
/// not write through the mapping, and [`receive_region`] refuses it (the
/// client then uses the network altogether).
pub const NO_SLOT: u32 = u32::MAX;

/// Control buffer with the alignment `cmsghdr` needs, with room for a few
/// descriptors (more than one is refused, but must be received to be closed).
#[repr(C, align(8))]
struct Cmsg([u8; 128]);

/// Sends `region`'s header, the grant of `slot` (`None`: no slot) and the
/// memfd on the connected stream socket `sock`. On a non-blocking socket
/// this may fail with `WouldBlock`; retry when it is writable.
pub fn send_region(
    sock: BorrowedFd<'_>,
    region: &ServerRegion,
    slot: Option<u32>,
) -> io::Result<()> {
    let mut message = [0u8; MESSAGE_LEN];
    message[..HEADER_LEN].copy_from_slice(&region.layout().encode());
    message[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&slot.unwrap_or(NO_SLOT).to_le_bytes());
    let fd: RawFd = region.file().as_raw_fd();
    let mut iov = libc::iovec {
        iov_base: message.as_ptr() as *mut libc::c_void,
        iov_len: message.len(),
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
    // sendmsg only reads `msg`, `iov`, `message` and `cbuf`, all alive here.
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
    if sent as usize != message.len() {
        // The descriptor went with the first byte; the rest of a short
        // message on a fresh connection always fits, so this is a broken
        // peer. Give up on the connection.
        return Err(io::Error::other(format!(
            "sent {sent} of {} message bytes",
            message.len()
        )));
    }
    Ok(())
}

/// Receives a region from a server (blocking, bounded by the socket's read
/// timeout), validates it and maps it, writing with the granted slot.
/// Fails when the server had no slot left: such a client
/// uses the network. Keep `sock` open for as long as the mapping may be
/// used (drop the [`ClientRegion`] first): closing it tells the server that this
/// process's writes are over and lets it reclaim the slot.
pub fn receive_region(sock: &UnixStream) -> io::Result<ClientRegion> {
    match receive_grant(sock)? {
        (fd, header, Some(slot)) => ClientRegion::open(fd, &header, Some(slot)),
        (_, _, None) => Err(io::Error::other(
            "the storage server has no writer slot left for this process",
        )),
    }
}

/// Receives a region that may come without a slot, and maps it read only
/// in that case (see [`ClientRegion::can_write`]).
pub fn receive_region_maybe_read_only(sock: &UnixStream) -> io::Result<ClientRegion> {
    let (fd, header, slot) = receive_grant(sock)?;
    ClientRegion::open(fd, &header, slot)
}

/// Receives the message and descriptor, and checks the grant's form.
fn receive_grant(sock: &UnixStream) -> io::Result<(OwnedFd, [u8; HEADER_LEN], Option<u32>)> {
    let (message, fd) = receive(sock)?;
    let (header, slot) = decode_message(&message)?;
    Ok((fd, header, slot))
}

/// Splits a hand-over message into the header and the granted slot
/// (`None` for [`NO_SLOT`]); reserved bytes that are not zero are
/// `InvalidData`. The header and the slot are checked by [`ClientRegion::open`].
pub fn decode_message(message: &[u8; MESSAGE_LEN]) -> io::Result<([u8; HEADER_LEN], Option<u32>)> {
    let (header, grant) = message.split_at(HEADER_LEN);
    if grant[4..] != [0; 4] {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "reserved bytes of the slot grant are not zero",
        ));
    }
    let slot = u32::from_le_bytes([grant[0], grant[1], grant[2], grant[3]]);
    let mut h = [0u8; HEADER_LEN];
    h.copy_from_slice(header);
    Ok((h, (slot != NO_SLOT).then_some(slot)))
}

/// Receives the message bytes and exactly one descriptor.
fn receive(sock: &UnixStream) -> io::Result<([u8; MESSAGE_LEN], OwnedFd)> {
    let mut header = [0u8; MESSAGE_LEN];
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
    if n >= 12 {
        // A server of another layout version may send a message of another
        // length: say so rather than wait for bytes that never come.
        Layout::check_version(&header[..n])
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    }
    if n < MESSAGE_LEN {
        // The rest of the message (without descriptors) may come separately.
        (&*sock).read_exact(&mut header[n..])?;
    }
    Ok((header, fds.pop().expect("one descriptor")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::VERSION;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::sync::Arc;

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        crate::testing::block_on(f)
    }

    /// A challenge round-trips; any other 48 bytes decode to one with the
    /// same fields or are refused, never panic; and a client without a
    /// token refuses a server that requires one, sending nothing.
    #[test]
    fn challenges_decode_exactly_and_a_tokenless_client_backs_off() {
        for token_required in [false, true] {
            let c = Challenge {
                token_required,
                nonce: [9; NONCE_LEN],
            };
            assert_eq!(Challenge::decode(&c.encode()).unwrap(), c);
        }
        let mut bad = Challenge {
            token_required: true,
            nonce: [1; NONCE_LEN],
        }
        .encode();
        bad[0] ^= 1;
        assert!(Challenge::decode(&bad).is_err(), "wrong magic");
        let mut bad = Challenge {
            token_required: false,
            nonce: [1; NONCE_LEN],
        }
        .encode();
        bad[8] = 2;
        assert!(Challenge::decode(&bad).is_err(), "unknown flag");
        let mut state = 0x1234_5678_u64;
        for _ in 0..10_000 {
            let mut b = [0u8; CHALLENGE_LEN];
            for x in b.iter_mut() {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *x = (state >> 33) as u8;
            }
            if let Ok(c) = Challenge::decode(&b) {
                assert_eq!(c.encode(), b);
            }
        }

        let (client, mut server) = UnixStream::pair().unwrap();
        server
            .write_all(
                &Challenge {
                    token_required: true,
                    nonce: [3; NONCE_LEN],
                }
                .encode(),
            )
            .unwrap();
        let e = answer_challenge(&client, |_| None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        drop(client);
        let mut rest = Vec::new();
        server.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "no answer was sent");
    }

    #[test]
    fn hand_over_over_a_socket_pair() {
        let r = Arc::new(ServerRegion::create(4096, 4).unwrap());
        block_on(r.write(1, 7, 10, b"shared")).unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        let lease = r.lease_slot().unwrap();
        send_region(a.as_fd(), &r, Some(lease.slot())).unwrap();
        let mapped = receive_region(&b).unwrap();
        assert_eq!(mapped.layout(), r.layout());
        assert_eq!(mapped.slot(), Some(lease.slot()));
        assert!(mapped.can_write());
        let mut out = [0u8; 6];
        mapped.read(1, 7, 10, &mut out).unwrap();
        assert_eq!(&out, b"shared");
        // A write through the second mapping is seen by the first.
        block_on(mapped.write(1, 8, 0, b"claimed")).unwrap();
        assert_eq!(r.generation(1), Some(8));
        let mut out = [0u8; 7];
        r.read(1, 8, 0, &mut out).unwrap();
        assert_eq!(&out, b"claimed");
        // Without a slot the mapping is refused, or reads but does not
        // write.
        send_region(a.as_fd(), &r, None).unwrap();
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("no writer slot"), "{e}");
        send_region(a.as_fd(), &r, None).unwrap();
        let ro = receive_region_maybe_read_only(&b).unwrap();
        assert_eq!(ro.slot(), None);
        assert!(!ro.can_write());
        ro.read(1, 8, 0, &mut out).unwrap();
        let e = block_on(ro.write(1, 8, 0, b"x")).unwrap_err();
        assert_eq!(e.code, nodekernel_proto::ErrorCode::Unavailable, "{e}");
        // A stopped server's region is refused.
        r.close();
        assert!(mapped.is_closed());
        send_region(a.as_fd(), &r, Some(lease.slot())).unwrap();
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("stopped"), "{e}");
    }

    /// A persistent server's region is a regular file, which cannot be
    /// sealed: it is handed over and mapped all the same, and both
    /// mappings see each other's writes.
    #[test]
    fn a_file_backed_region_is_handed_over() {
        let dir = std::env::temp_dir().join(format!("nk-shm-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dram");
        let r = Arc::new(ServerRegion::open_file(&path, 4096, 4, false).unwrap());
        block_on(r.write(2, 9, 0, b"in a file")).unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        let lease = r.lease_slot().unwrap();
        send_region(a.as_fd(), &r, Some(lease.slot())).unwrap();
        let mapped = receive_region(&b).unwrap();
        let mut out = [0u8; 9];
        mapped.read(2, 9, 0, &mut out).unwrap();
        assert_eq!(&out, b"in a file");
        block_on(mapped.write(3, 10, 0, b"from the client")).unwrap();
        let mut out = [0u8; 15];
        r.read(3, 10, 0, &mut out).unwrap();
        assert_eq!(&out, b"from the client");
        drop(mapped);
        block_on(lease.reclaim());
        drop(r);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn refuses_missing_or_foreign_descriptors_and_bad_grants() {
        let layout = crate::Layout::new(4096, 1).unwrap();
        let message = |header: &[u8], slot: u32| {
            let mut m = header.to_vec();
            m.extend_from_slice(&slot.to_le_bytes());
            m.extend_from_slice(&[0; 4]);
            m
        };
        let good = message(&layout.encode(), 5);

        // Message without a descriptor.
        let (mut a, b) = UnixStream::pair().unwrap();
        a.write_all(&good).unwrap();
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("descriptor"), "{e}");

        // Peer closes without sending.
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert_eq!(
            receive_region(&b).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );

        // A descriptor that is not a regular file (a socket) is refused; a
        // regular file that is not a region (opened read only, without the
        // header) is refused too.
        let (a, b) = UnixStream::pair().unwrap();
        let (other, _keep) = UnixStream::pair().unwrap();
        send_raw(&a, &good, other.as_raw_fd());
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("memfd"), "{e}");
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        send_raw(&a, &good, f.as_raw_fd());
        receive_region(&b).expect_err("not a region");
        // A regular file shorter than its header says is refused.
        let dir = std::env::temp_dir().join(format!("nk-shm-handover-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let short = dir.join("short");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&short)
            .unwrap();
        f.set_len(layout.total_len - 1).unwrap();
        send_raw(&a, &good, f.as_raw_fd());
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("bytes"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);

        // A real region with a header that claims more than it holds.
        let r = ServerRegion::create(4096, 1).unwrap();
        let lie = message(&crate::Layout::new(4096, 2).unwrap().encode(), 5);
        send_raw(&a, &lie, r.file().as_raw_fd());
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("bytes"), "{e}");
        // ... or a consistent but different one than in the memfd.
        let lie = message(&crate::Layout::new(2048, 2).unwrap().encode(), 5);
        send_raw(&a, &lie, r.file().as_raw_fd());
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("differs"), "{e}");
        // Garbage header.
        send_raw(&a, &[0xAB; MESSAGE_LEN], r.file().as_raw_fd());
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");

        // Slots the server keeps for itself, or past the end, are refused,
        // and so are reserved bytes that are not zero.
        for slot in [
            0,
            crate::layout::SERVER_SLOTS - 1,
            layout.slots,
            NO_SLOT - 1,
        ] {
            send_raw(&a, &message(&layout.encode(), slot), r.file().as_raw_fd());
            let e = receive_region(&b).unwrap_err();
            assert!(e.to_string().contains("slot"), "slot {slot}: {e}");
        }
        let mut m = good.clone();
        m[MESSAGE_LEN - 1] = 1;
        send_raw(&a, &m, r.file().as_raw_fd());
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        send_raw(&a, &good, r.file().as_raw_fd());
        assert_eq!(receive_region(&b).unwrap().slot(), Some(5));

        // A server of another version is named as such at once, even when
        // its message is shorter than ours (version 1 sent 64 bytes).
        let mut old = layout.encode()[..64].to_vec();
        old[8..12].copy_from_slice(&(VERSION - 1).to_le_bytes());
        send_raw(&a, &old, r.file().as_raw_fd());
        let e = receive_region(&b).unwrap_err();
        assert!(e.to_string().contains("version 1"), "{e}");
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
