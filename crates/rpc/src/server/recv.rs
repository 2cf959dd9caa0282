//! A connection's receive side: what the front of its buffer holds
//! ([`Front`], with each request kind's payload limit applied from the
//! header), the buffer itself ([`RecvBuf`], counted in the server's total
//! and grown only for frames whose bytes are reserved), reads without
//! blocking or after a short spin, and data received in place into a
//! handler's [`DirectSink`].

use crate::limits::{RECV_BUF_INITIAL, RECV_READ_MIN, SMALL_PAYLOAD};
use crate::server::handler::{DirectSink, Handler, DIRECT_MIN};
use crate::server::options::ServeOptions;
use crate::spin::{Spin, SpinStats};
use crate::transport::ReadHalf;
use bytes::{Buf, Bytes, BytesMut};
use nodekernel_proto::{Error, FrameHeader, HEADER_LEN};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// What the front of a receive buffer holds.
pub(super) enum Front {
    /// Less than a header.
    Short,
    /// A header and part of its payload, with the number of bytes still
    /// missing.
    Partial(FrameHeader, usize),
    /// A complete frame.
    Frame(FrameHeader),
    /// A header that cannot be parsed, or announcing more than the request
    /// kind may have: the request id (as read) and why.
    Bad(u64, Error),
}

pub(super) fn front(buf: &[u8]) -> Front {
    if buf.len() < HEADER_LEN {
        return Front::Short;
    }
    let h: [u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("length checked");
    match FrameHeader::parse(&h) {
        Ok(hdr) if buf.len() >= HEADER_LEN + hdr.payload_len => Front::Frame(hdr),
        Ok(hdr) => Front::Partial(hdr, HEADER_LEN + hdr.payload_len - buf.len()),
        Err(e) => Front::Bad(u64::from_le_bytes(h[4..12].try_into().expect("8 bytes")), e),
    }
}

/// [`front`], with the handler's limit on each request kind's payload
/// ([`Handler::max_payload`]) applied from the header.
pub(super) fn front_for<H: Handler>(buf: &[u8], handler: &H) -> Front {
    match front(buf) {
        Front::Partial(h, _) | Front::Frame(h) if h.payload_len > handler.max_payload(h.kind) => {
            Front::Bad(
                h.id,
                Error::protocol(format!(
                    "a request of kind {} with a payload of {} bytes: this server takes at \
                     most {} bytes for that kind",
                    h.kind,
                    h.payload_len,
                    handler.max_payload(h.kind)
                )),
            )
        }
        f => f,
    }
}

/// Bytes a frame of `payload_len` takes from [`ServeOptions::max_request_bytes`]:
/// the receive buffer it arrives in (see [`MAX_REQUEST_BYTES`]). `None`: a
/// small frame, copied out, which takes none.
pub(super) fn frame_reservation(payload_len: usize) -> Option<usize> {
    (payload_len > SMALL_PAYLOAD)
        .then(|| (HEADER_LEN + payload_len).max(RECV_BUF_INITIAL) + RECV_READ_MIN)
}

/// Takes the payload of the complete frame with `header` at the front of
/// `buf` (see [`front`]). A small one is copied out, so that it keeps no
/// receive buffer alive; a larger one is handed over as it is (its buffer
/// is reserved, see [`frame_reservation`]).
pub(super) fn take_frame(buf: &mut BytesMut, header: FrameHeader) -> Bytes {
    buf.advance(HEADER_LEN);
    if header.payload_len <= SMALL_PAYLOAD {
        let payload = Bytes::copy_from_slice(&buf[..header.payload_len]);
        buf.advance(header.payload_len);
        payload
    } else {
        buf.split_to(header.payload_len).freeze()
    }
}

/// A connection's receive buffer, counted in the server's total. It grows
/// beyond [`RECV_BUF_INITIAL`] only for a frame whose bytes have filled it
/// and are reserved ([`MAX_REQUEST_BYTES`]), never from a declared frame
/// length alone.
pub(super) struct RecvBuf<'a> {
    pub(super) buf: BytesMut,
    counted: usize,
    /// The frame at the front has its bytes reserved: the buffer may grow
    /// to hold it.
    pub(super) reserved: bool,
    /// The server's total, and its high-water mark.
    total: &'a AtomicUsize,
    peak: &'a AtomicUsize,
}

impl<'a> RecvBuf<'a> {
    pub(super) fn new(
        mut buf: BytesMut,
        total: &'a AtomicUsize,
        peak: &'a AtomicUsize,
    ) -> RecvBuf<'a> {
        if buf.capacity() < RECV_BUF_INITIAL {
            buf.reserve(RECV_BUF_INITIAL - buf.len());
        }
        let mut b = RecvBuf {
            buf,
            counted: 0,
            reserved: false,
            total,
            peak,
        };
        b.sync();
        b
    }

    /// Brings the server's total up to date with this buffer's capacity.
    pub(super) fn sync(&mut self) {
        let cap = self.buf.capacity();
        if cap > self.counted {
            let now =
                self.total.fetch_add(cap - self.counted, Ordering::Relaxed) + cap - self.counted;
            self.peak.fetch_max(now, Ordering::Relaxed);
        } else if cap < self.counted {
            self.total.fetch_sub(self.counted - cap, Ordering::Relaxed);
        }
        self.counted = cap;
    }

    /// The room the next read needs: the rest of a reserved frame at the
    /// front, or else [`RECV_READ_MIN`] bytes (or what the frame at the
    /// front still needs, if less).
    fn wanted(&self) -> usize {
        match front(&self.buf) {
            Front::Partial(_, missing) if self.reserved => missing,
            Front::Partial(_, missing) => missing.min(RECV_READ_MIN),
            _ => RECV_READ_MIN,
        }
    }

    /// Whether the next read needs a larger buffer (the bytes buffered
    /// move to its start first, if that makes room).
    pub(super) fn full(&mut self) -> bool {
        let want = self.wanted();
        self.buf.capacity() - self.buf.len() < want && !self.buf.try_reclaim(want)
    }

    /// Makes room for the next read ([`RecvBuf::wanted`]): a new buffer is
    /// exactly that large (never doubled), at least [`RECV_BUF_INITIAL`].
    fn prepare(&mut self) {
        if self.full() {
            self.move_to((self.buf.len() + self.wanted()).max(RECV_BUF_INITIAL));
        }
    }

    /// Moves the bytes buffered to a new buffer of `cap` bytes.
    fn move_to(&mut self, cap: usize) {
        let mut fresh = BytesMut::with_capacity(cap);
        fresh.extend_from_slice(&self.buf);
        self.buf = fresh;
        self.sync();
    }

    /// After a frame larger than [`RECV_BUF_INITIAL`] was taken: the bytes
    /// after it move to a buffer of their own, so that no later request
    /// keeps that frame's (reserved) buffer alive once it was handled.
    pub(super) fn detach(&mut self) {
        self.move_to(RECV_BUF_INITIAL.max(self.buf.len()));
    }

    /// Reads what the socket has (see [`ReadHalf::recv_now`]).
    fn recv(&mut self, rd: &ReadHalf) -> std::io::Result<Option<usize>> {
        self.prepare();
        let r = rd.recv_now(&mut self.buf, usize::MAX);
        self.sync();
        r
    }

    /// Whether the buffer is larger than it needs to be while idle.
    pub(super) fn oversized(&self) -> bool {
        self.buf.capacity() > RECV_BUF_INITIAL && self.buf.len() <= RECV_BUF_INITIAL / 2
    }

    /// Goes back to a buffer of [`RECV_BUF_INITIAL`] (keeping what is
    /// buffered).
    pub(super) fn shrink(&mut self) {
        self.move_to(RECV_BUF_INITIAL);
    }
}

impl Drop for RecvBuf<'_> {
    fn drop(&mut self) {
        self.total.fetch_sub(self.counted, Ordering::Relaxed);
    }
}

/// The length of the prefix of the frame with `header`, if its data
/// should be received in place (see [`Handler::direct_prefix`]). Not the
/// frame `declined` by the handler before.
pub(super) fn direct_len<H: Handler>(
    header: &FrameHeader,
    handler: &H,
    declined: Option<u64>,
) -> Option<usize> {
    let prefix = handler.direct_prefix(header.kind)?;
    let data = header.payload_len.checked_sub(prefix)?;
    (data >= DIRECT_MIN && declined != Some(header.id)).then_some(prefix)
}

/// Receives the data of the frame at the front of `rbuf` (header and
/// prefix buffered) into the handler's sink: the bytes already buffered
/// by a copy, the rest straight from the socket. `Ok(None)`: the handler
/// declined (nothing consumed). `Err`: the connection must close (the
/// peer went away or stalled mid-frame; the sink is dropped).
pub(super) async fn receive_direct<H: Handler>(
    rd: &ReadHalf,
    rbuf: &mut RecvBuf<'_>,
    handler: &H,
    header: FrameHeader,
    prefix_len: usize,
    opts: &ServeOptions,
) -> std::result::Result<Option<(Bytes, Box<dyn DirectSink>)>, String> {
    let data_len = header.payload_len - prefix_len;
    let prefix = &rbuf.buf[HEADER_LEN..HEADER_LEN + prefix_len];
    let asked = handler.direct_sink(header.kind, prefix, data_len);
    let sink = match tokio::time::timeout(opts.frame_timeout, asked).await {
        Ok(Ok(Some(sink))) => sink,
        _ => return Ok(None),
    };
    if sink.dest().1 != data_len {
        return Ok(None);
    }
    rbuf.buf.advance(HEADER_LEN);
    let prefix = rbuf.buf.split_to(prefix_len).freeze();
    let have = rbuf.buf.len().min(data_len);
    // SAFETY: the sink's memory is valid for `data_len` bytes (the
    // `DirectSink` contract) and is not our buffer.
    unsafe { std::ptr::copy_nonoverlapping(rbuf.buf.as_ptr(), sink.dest().0, have) };
    rbuf.buf.advance(have);
    rbuf.sync();
    let mut got = have;
    // The rest of the frame is on its way: poll for it a spin budget after
    // each progress before parking (each wake-up costs tens of
    // microseconds). Bytes in flight are always "soon", so no statistics.
    let mut spin = Spin::begin(opts.spin, SpinStats::default());
    let deadline = tokio::time::Instant::now() + opts.frame_timeout;
    while got < data_len {
        let step = rd.try_io(|| {
            // SAFETY: `dest + got .. dest + data_len` lies inside the
            // sink's memory.
            match unsafe { rd.recv_raw(sink.dest().0.add(got), data_len - got) } {
                Ok(Some(n)) => Ok(n),
                Ok(None) => Err(std::io::ErrorKind::WouldBlock.into()),
                Err(e) => Err(e),
            }
        });
        match step {
            Ok(0) => return Err("the peer closed mid-frame".into()),
            Ok(n) => {
                got += n;
                spin = Spin::begin(opts.spin, SpinStats::default());
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    && spin.as_ref().is_some_and(Spin::again) =>
            {
                tokio::task::yield_now().await;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                spin = None;
                match tokio::time::timeout_at(deadline, rd.readable()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => return Err(e.to_string()),
                    Err(_) => {
                        return Err(format!(
                            "a frame did not arrive completely within {:?}",
                            opts.frame_timeout
                        ))
                    }
                }
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(Some((prefix, sink)))
}

/// Reads whatever the socket has without blocking: `Some(true)` data,
/// `Some(false)` end of stream, `None` nothing yet.
pub(super) fn try_fill(rd: &ReadHalf, buf: &mut RecvBuf<'_>) -> std::io::Result<Option<bool>> {
    // Inside `try_io`, so a WouldBlock clears the reactor's readiness.
    match rd.try_io(|| match buf.recv(rd) {
        Ok(None) => Err(std::io::ErrorKind::WouldBlock.into()),
        other => other,
    }) {
        Ok(Some(0)) => Ok(Some(false)),
        Ok(_) => Ok(Some(true)),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// Busy-polls for data for up to `spin`, straight on the descriptor,
/// yielding between polls so other tasks of this worker (another server's
/// connection, say) still run.
pub(super) async fn spin_fill(
    rd: &ReadHalf,
    buf: &mut RecvBuf<'_>,
    spin: Duration,
    stats: SpinStats,
    spins: &AtomicU64,
) -> std::io::Result<Option<bool>> {
    let Some(spin) = Spin::begin(spin, stats) else {
        return Ok(None);
    };
    spins.fetch_add(1, Ordering::Relaxed);
    loop {
        match buf.recv(rd)? {
            Some(n) => return Ok(Some(n > 0)),
            None if spin.again() => tokio::task::yield_now().await,
            None => return Ok(None),
        }
    }
}
