//! What the I/O engines share: requests, completions, and positional I/O
//! with its errors.

use super::buf::AlignedBuf;
use crate::medium::Keepalive;
use std::io;
use tokio::sync::oneshot;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OpKind {
    Read,
    Write,
    /// A read through the page cache with `RWF_DONTCACHE`, on the medium's
    /// buffered descriptor: the kernel reads ahead, and drops the pages
    /// once they were read (see [`FileMedium`](super::FileMedium)).
    StreamRead,
}

impl OpKind {
    /// The descriptor this kind of I/O goes to: `stream` for
    /// [`OpKind::StreamRead`] (set whenever such reads are issued).
    pub fn fd(self, direct: i32, stream: i32) -> i32 {
        match self {
            OpKind::StreamRead => stream,
            OpKind::Read | OpKind::Write => direct,
        }
    }
}

/// One positional I/O of the whole of `buf` at `off`.
pub(crate) struct Request {
    pub kind: OpKind,
    pub off: u64,
    /// Read into / written from; owned by the request (and so by the engine)
    /// until the kernel is done with it.
    pub buf: AlignedBuf,
    /// Dropped by the engine only after the I/O completed.
    pub keep: Keepalive,
    pub done: oneshot::Sender<Completion>,
}

/// The outcome of a [`Request`], with its buffer handed back.
pub(crate) struct Completion {
    pub buf: AlignedBuf,
    pub result: io::Result<()>,
}

impl Request {
    /// Reports the outcome. The waiter may be gone (its future was
    /// dropped); the buffer and keepalive are then dropped here, after the
    /// kernel finished with them.
    pub fn complete(self, result: io::Result<()>) {
        let Request {
            buf, keep, done, ..
        } = self;
        let _ = done.send(Completion { buf, result });
        drop(keep);
    }
}

pub(crate) fn gone() -> io::Error {
    io::Error::new(
        io::ErrorKind::BrokenPipe,
        "the file medium's I/O thread has stopped",
    )
}

/// Transfers the whole of `buf` at `off` with positional system calls,
/// retrying short transfers and `EINTR`.
pub(crate) fn pio(fd: i32, kind: OpKind, off: u64, buf: &mut AlignedBuf) -> io::Result<()> {
    let len = buf.len();
    let base = buf.as_mut_ptr();
    let mut done = 0usize;
    while done < len {
        let pos = off
            .checked_add(done as u64)
            .and_then(|p| libc::off_t::try_from(p).ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "offset overflow"))?;
        // SAFETY: `base + done .. base + len` lies inside `buf`, which we
        // borrow mutably for the duration of the call.
        let n = unsafe {
            let p = base.add(done);
            match kind {
                OpKind::Read => libc::pread(fd, p.cast(), len - done, pos),
                OpKind::StreamRead => {
                    let iov = libc::iovec {
                        iov_base: p.cast(),
                        iov_len: len - done,
                    };
                    libc::preadv2(fd, &iov, 1, pos, libc::RWF_DONTCACHE)
                }
                OpKind::Write => libc::pwrite(fd, p.cast_const().cast(), len - done, pos),
            }
        };
        match n {
            n if n > 0 => done += n as usize,
            0 => return Err(short(kind)),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn short(kind: OpKind) -> io::Error {
    match kind {
        OpKind::Read | OpKind::StreamRead => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file ended before the read did",
        ),
        OpKind::Write => io::Error::new(io::ErrorKind::WriteZero, "the file took no bytes"),
    }
}
