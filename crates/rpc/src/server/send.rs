//! Handling a request and sending its reply: the handler's reply (or its
//! error) sealed into a frame, then written out with a bound on how long
//! the peer may take no byte of it, a [`SharedBody`](crate::SharedBody)
//! straight from its memory.

use crate::server::budget::Held;
use crate::server::handler::{DirectSink, Handler, Reply, SharedBody};
use crate::sock::push_error;
use crate::transport::{ReadHalf, WriteHalf};
use bytes::{Bytes, BytesMut};
use nodekernel_proto::frame::STATUS_OK;
use nodekernel_proto::{Error, ErrorCode, FrameHeader, Result};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::sync::OwnedSemaphorePermit;

/// Handles one request, holding a permit of the server's request bound
/// and its frame's bytes until it was handled, and its reply's bytes
/// until the reply was sent; returns its whole reply frame (with its
/// shared body, if any).
pub(super) async fn handle_one<H: Handler>(
    handler: Arc<H>,
    header: FrameHeader,
    payload: Bytes,
    peer: Arc<str>,
    tenant: Option<Arc<str>>,
    held: Held,
) -> Reply {
    let Held {
        request: _request,
        frame: _frame,
        reply: reserved,
    } = held;
    let mut reply = Reply {
        out: BytesMut::with_capacity(256),
        body: None,
        reserved,
        tenant,
    };
    let start = FrameHeader::begin(&mut reply.out, header.id, STATUS_OK);
    let result = match admitted(&*handler, header.kind, &reply.tenant) {
        Ok(()) => handler.handle_reply(header.kind, payload, &mut reply).await,
        Err(e) => Err(e),
    };
    finish_reply(&peer, header, start, result, reply)
}

/// Refuses request `op` of a tenant's connection unless the handler opens
/// it to tenants: members' requests (a registration, a block copy, the
/// shared-memory offer) never reach a handler from a tenant.
fn admitted<H: Handler>(handler: &H, op: u16, tenant: &Option<Arc<str>>) -> Result<()> {
    match tenant {
        Some(t) if !handler.tenant_may(op) => Err(Error::unauthenticated(format!(
            "tenant {t} may not make request {op} here: it is for members of the cluster \
             (the cluster token), not tenants"
        ))),
        _ => Ok(()),
    }
}

/// Handles one request whose data went into `sink`, like [`handle_one`].
pub(super) async fn handle_direct_one<H: Handler>(
    handler: Arc<H>,
    header: FrameHeader,
    prefix: Bytes,
    sink: Box<dyn DirectSink>,
    peer: Arc<str>,
    tenant: Option<Arc<str>>,
    _permit: OwnedSemaphorePermit,
) -> Reply {
    let mut reply = Reply::default();
    let start = FrameHeader::begin(&mut reply.out, header.id, STATUS_OK);
    let result = match admitted(&*handler, header.kind, &tenant) {
        Ok(()) => {
            handler
                .handle_direct(header.kind, prefix, sink, &mut reply.out)
                .await
        }
        Err(e) => Err(e),
    };
    finish_reply(&peer, header, start, result, reply)
}

/// Seals a reply begun at `start`, or replaces it with the error.
fn finish_reply(
    peer: &str,
    header: FrameHeader,
    start: usize,
    result: Result<()>,
    mut reply: Reply,
) -> Reply {
    let more = reply
        .body
        .as_ref()
        .map_or(0, |b| b.bytes().1 + b.trailer_len());
    if let Err(e) = result.and_then(|()| FrameHeader::seal_with(&mut reply.out, start, more)) {
        if e.code == ErrorCode::Protocol {
            tracing::debug!("bad request from {peer}: {e}");
        }
        reply.out.truncate(start);
        reply.body = None;
        push_error(&mut reply.out, header.id, &e);
    }
    reply
}

pub(super) type Replies = BufWriter<WriteHalf>;

/// Writes `buf` to the peer, failing when it takes no byte for `stall`: a
/// peer that stopped reading its replies must not keep its requests (and
/// their permits of the server-wide bound) forever.
pub(super) async fn write_bounded(
    wr: &mut Replies,
    buf: &[u8],
    stall: Duration,
) -> std::io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        match tokio::time::timeout(stall, wr.write(&buf[off..])).await {
            Ok(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => off += n,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(stalled_writing(stall)),
        }
    }
    Ok(())
}

/// Writes a reply: its frame bytes (buffered), then any shared body
/// straight from its memory, then the body's trailer. `sock` is the
/// connection's socket (its read half), for sending the body directly.
pub(super) async fn write_reply(
    wr: &mut Replies,
    sock: &ReadHalf,
    reply: Reply,
    stall: Duration,
) -> std::io::Result<()> {
    write_bounded(wr, &reply.out, stall).await?;
    let Some(mut body) = reply.body else {
        return Ok(());
    };
    let len = body.bytes().1;
    if sock.tls().is_some() {
        // Over TLS the body is encrypted straight from its memory (a
        // large one past the reply buffer, by the session's writes).
        let (ptr, _) = body.bytes();
        // SAFETY: `SharedBody`'s contract: `ptr` is readable for `len`
        // bytes while `body` lives; they are only read (by the cipher).
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
        write_bounded(wr, bytes, stall).await?;
    } else {
        send_body(wr, sock, &mut *body, len, stall).await?;
    }
    let mut trailer = BytesMut::with_capacity(body.trailer_len());
    body.seal(&mut trailer);
    debug_assert_eq!(trailer.len(), body.trailer_len());
    write_bounded(wr, &trailer, stall).await
}

/// Sends `body` (`len` bytes) with `send(2)` straight from its memory on
/// the plain socket `sock`, after the reply's buffered first bytes.
async fn send_body(
    wr: &mut Replies,
    sock: &ReadHalf,
    body: &mut dyn SharedBody,
    len: usize,
    stall: Duration,
) -> std::io::Result<()> {
    // The frame's first bytes go out before the body's.
    flush_bounded(wr, stall).await?;
    let mut sent = 0;
    while sent < len {
        let r = sock.try_write_io(|| {
            let (ptr, _) = body.bytes();
            // SAFETY: `SharedBody`'s contract: `ptr` is readable for `len`
            // bytes while `body` lives. send(2) only reads them.
            let n = unsafe {
                libc::send(
                    sock.fd(),
                    ptr.add(sent).cast(),
                    len - sent,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match r {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                match tokio::time::timeout(stall, sock.writable()).await {
                    Ok(r) => r?,
                    Err(_) => return Err(stalled_writing(stall)),
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Flushes the buffered replies (at most [`REPLY_BUF`] bytes), failing when
/// that takes longer than `stall`.
pub(super) async fn flush_bounded(wr: &mut Replies, stall: Duration) -> std::io::Result<()> {
    match tokio::time::timeout(stall, wr.flush()).await {
        Ok(r) => r,
        Err(_) => Err(stalled_writing(stall)),
    }
}

fn stalled_writing(stall: Duration) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("the peer took no reply bytes for {stall:?}"),
    )
}
