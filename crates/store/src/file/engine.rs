//! The engine switch: io_uring ([`Uring`]) or a pread/pwrite pool
//! ([`Pool`]), behind one `run`.

use super::buf::AlignedBuf;
use super::request::{gone, OpKind, Request};
use super::threads::Pool;
use super::uring::Uring;
use crate::medium::Keepalive;
use std::io;
use tokio::sync::oneshot;

/// The submission side of the medium: io_uring or a pread/pwrite pool.
pub(crate) enum Engine {
    Uring(Uring),
    Threads(Pool),
}

impl Engine {
    /// Runs one I/O of the whole of `buf` at `off` and returns the buffer.
    pub async fn run(
        &self,
        kind: OpKind,
        off: u64,
        buf: AlignedBuf,
        keep: Keepalive,
    ) -> io::Result<AlignedBuf> {
        let (done, rx) = oneshot::channel();
        let req = Request {
            kind,
            off,
            buf,
            keep,
            done,
        };
        match self {
            Engine::Uring(u) => u.submit(req)?,
            Engine::Threads(p) => p.submit(req)?,
        }
        let c = rx.await.map_err(|_| gone())?;
        c.result.map(|()| c.buf)
    }
}
