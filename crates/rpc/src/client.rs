use crate::limits::CLIENT_RECV_BUF;
use crate::transport::{ReadHalf, Stream, WriteHalf};
use bytes::{Buf, Bytes, BytesMut};
use nodekernel_proto::frame::STATUS_OK;
use nodekernel_proto::{Error, FrameHeader, Result, HEADER_LEN, MAX_PAYLOAD_LEN};
use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;

/// Settings of a client connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnOptions {
    /// Bound on connecting and on every call.
    pub timeout: Duration,
    /// How long a caller busy-polls the socket for its reply before parking
    /// (0 disables spinning). Waking a parked thread costs tens of
    /// microseconds on these machines; a short spin avoids it.
    pub spin: Duration,
}

impl ConnOptions {
    pub fn new(timeout: Duration) -> Self {
        ConnOptions {
            timeout,
            spin: crate::default_spin(),
        }
    }
}

type Waiters = HashMap<u64, oneshot::Sender<Result<Bytes>>>;

/// The receiving side of a connection, driven either by the reader task or
/// by a caller spinning for its reply (whoever holds `buf`).
struct Inbound {
    rd: ReadHalf,
    buf: Mutex<BytesMut>,
}

struct Shared {
    waiters: Mutex<Waiters>,
    closed: AtomicBool,
    peer: String,
    inbound: Inbound,
}

enum Pump {
    /// Read something (maybe not a whole frame).
    Progress,
    /// Nothing to read right now.
    Idle,
    /// Another thread is reading.
    Busy,
}

impl Shared {
    fn fail_all(&self, err: &Error) {
        self.closed.store(true, Ordering::Release);
        let waiters: Vec<_> = self.waiters.lock().expect("waiters lock").drain().collect();
        for (_, tx) in waiters {
            let _ = tx.send(Err(err.clone()));
        }
    }

    /// Reads what the socket has without blocking and hands every complete
    /// reply to its waiter.
    fn pump(&self) -> Result<Pump> {
        let Ok(mut buf) = self.inbound.buf.try_lock() else {
            return Ok(Pump::Busy);
        };
        let fd = self.inbound.rd.fd();
        let mut progress = false;
        loop {
            if buf.capacity() - buf.len() < CLIENT_RECV_BUF / 4 {
                buf.reserve(CLIENT_RECV_BUF);
            }
            match crate::recv_now(fd, &mut buf) {
                Ok(Some(0)) => {
                    return Err(Error::unavailable(format!(
                        "connection to {} closed by the peer",
                        self.peer
                    )))
                }
                Ok(Some(_)) => {
                    progress = true;
                    self.dispatch(&mut buf)?;
                }
                Ok(None) => break,
                Err(e) => return Err(crate::io_error(&format!("connection to {}", self.peer), e)),
            }
        }
        Ok(if progress { Pump::Progress } else { Pump::Idle })
    }

    /// Splits complete frames off `buf` and completes their waiters.
    fn dispatch(&self, buf: &mut BytesMut) -> Result<()> {
        while buf.len() >= HEADER_LEN {
            let h: [u8; HEADER_LEN] = buf[..HEADER_LEN].try_into().expect("length checked");
            let header = FrameHeader::parse(&h)?;
            if buf.len() < HEADER_LEN + header.payload_len {
                buf.reserve(HEADER_LEN + header.payload_len - buf.len());
                break;
            }
            buf.advance(HEADER_LEN);
            let payload = buf.split_to(header.payload_len).freeze();
            let result = if header.kind == STATUS_OK {
                Ok(payload)
            } else {
                Err(Error::from_wire(header.kind, &payload))
            };
            let waiter = self
                .waiters
                .lock()
                .expect("waiters lock")
                .remove(&header.id);
            if let Some(tx) = waiter {
                let _ = tx.send(result);
            }
        }
        Ok(())
    }
}

/// The client end of one connection to a NodeKernel server: many requests
/// in flight, replies matched by id, every call bounded by a timeout.
pub struct Connection {
    shared: Arc<Shared>,
    writer: tokio::sync::Mutex<WriteHalf>,
    next_id: AtomicU64,
    opts: ConnOptions,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Connection {
    /// Connects to `addr` (`host:port`, `unix:@name` or `unix:/path`),
    /// giving up after `timeout`. The same timeout bounds every call made on
    /// the connection.
    pub async fn connect(addr: &str, timeout: Duration) -> Result<Connection> {
        Connection::connect_with(addr, ConnOptions::new(timeout)).await
    }

    pub async fn connect_with(addr: &str, opts: ConnOptions) -> Result<Connection> {
        let timeout = opts.timeout;
        let stream = match tokio::time::timeout(timeout, Stream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(Error::unavailable(format!("cannot connect to {addr}: {e}"))),
            Err(_) => {
                return Err(Error::timeout(format!(
                    "connecting to {addr} took longer than {timeout:?}"
                )))
            }
        };
        let (rd, wr) = stream.split();
        let shared = Arc::new(Shared {
            waiters: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            peer: addr.to_string(),
            inbound: Inbound {
                rd,
                buf: Mutex::new(BytesMut::with_capacity(CLIENT_RECV_BUF)),
            },
        });
        let reader = tokio::spawn(read_loop(shared.clone()));
        Ok(Connection {
            shared,
            writer: tokio::sync::Mutex::new(wr),
            next_id: AtomicU64::new(1),
            opts,
            reader,
        })
    }

    /// Whether the connection has failed (the peer closed it or sent garbage).
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    pub fn peer(&self) -> &str {
        &self.shared.peer
    }

    /// Sends a request whose payload is the concatenation of `parts` (one
    /// vectored write, no copy) and waits for its reply payload. Error
    /// replies become [`Error`]s; a reply that does not arrive within the
    /// timeout gives `Timeout`.
    pub async fn call(&self, kind: u16, parts: &[&[u8]]) -> Result<Bytes> {
        if self.is_closed() {
            return Err(Error::unavailable(format!(
                "connection to {} is closed",
                self.shared.peer
            )));
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > MAX_PAYLOAD_LEN {
            return Err(Error::invalid_argument(format!(
                "request of {len} bytes exceeds the frame limit of {MAX_PAYLOAD_LEN}"
            )));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = oneshot::channel();
        self.shared
            .waiters
            .lock()
            .expect("waiters lock")
            .insert(id, tx);
        let mut header = BytesMut::with_capacity(HEADER_LEN);
        FrameHeader::put(&mut header, id, kind, len);

        let deadline = tokio::time::Instant::now() + self.opts.timeout;
        let send = async {
            let mut w = self.writer.lock().await;
            let mut slices: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
            slices.push(&header);
            slices.extend(parts.iter().filter(|p| !p.is_empty()));
            write_all_vectored(&mut w, &mut slices).await
        };
        let outcome = match tokio::time::timeout_at(deadline, send).await {
            Ok(Ok(())) => {
                if let Some(r) = self.spin_for(&mut rx).await {
                    return r;
                }
                match tokio::time::timeout_at(deadline, rx).await {
                    Ok(Ok(r)) => return r,
                    Ok(Err(_)) => Err(Error::unavailable(format!(
                        "connection to {} closed while waiting for a reply",
                        self.shared.peer
                    ))),
                    Err(_) => Err(self.timed_out()),
                }
            }
            Ok(Err(e)) => {
                let err = crate::io_error(&format!("sending to {}", self.shared.peer), e);
                self.shared.fail_all(&err);
                Err(err)
            }
            Err(_) => Err(self.timed_out()),
        };
        self.shared
            .waiters
            .lock()
            .expect("waiters lock")
            .remove(&id);
        outcome
    }

    /// Busy-polls the socket for the reply for up to the spin budget,
    /// reading and dispatching replies itself (no thread wake-up needed),
    /// and yielding between polls so other tasks keep running.
    async fn spin_for(&self, rx: &mut oneshot::Receiver<Result<Bytes>>) -> Option<Result<Bytes>> {
        if self.opts.spin.is_zero() {
            return None;
        }
        let start = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(r) => return Some(r),
                Err(oneshot::error::TryRecvError::Closed) => return None,
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            match self.shared.pump() {
                Ok(Pump::Progress) => continue,
                Ok(Pump::Idle | Pump::Busy) => {}
                Err(e) => {
                    self.shared.fail_all(&e);
                    return None;
                }
            }
            if start.elapsed() >= self.opts.spin {
                return None;
            }
            tokio::task::yield_now().await;
        }
    }

    fn timed_out(&self) -> Error {
        Error::timeout(format!(
            "no reply from {} within {:?}",
            self.shared.peer, self.opts.timeout
        ))
    }
}

/// Writes every slice, with as few `writev` calls as the socket allows.
async fn write_all_vectored(w: &mut WriteHalf, slices: &mut [&[u8]]) -> std::io::Result<()> {
    let mut first = 0;
    while first < slices.len() {
        let io: Vec<IoSlice> = slices[first..].iter().map(|s| IoSlice::new(s)).collect();
        let mut n = w.write_vectored(&io).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while first < slices.len() && n >= slices[first].len() {
            n -= slices[first].len();
            first += 1;
        }
        if first < slices.len() {
            slices[first] = &slices[first][n..];
        }
    }
    Ok(())
}

/// Reads replies whenever nobody is spinning for them.
async fn read_loop(shared: Arc<Shared>) {
    let err = loop {
        if let Err(e) = shared.inbound.rd.readable().await {
            break crate::io_error(&format!("connection to {}", shared.peer), e);
        }
        // `pump` reads to EAGAIN; reporting WouldBlock through `try_io` makes
        // the reactor clear its readiness and wait for new data.
        let outcome = shared.inbound.rd.try_io(|| match shared.pump() {
            Ok(Pump::Idle | Pump::Progress) => Err(std::io::ErrorKind::WouldBlock.into()),
            other => Ok(other),
        });
        match outcome {
            Err(_) => {}
            Ok(Ok(_busy)) => tokio::task::yield_now().await,
            Ok(Err(e)) => break e,
        }
    };
    shared.fail_all(&err);
}

/// One shared connection per peer address, reconnecting when a connection
/// has failed.
pub struct ConnectionPool {
    opts: ConnOptions,
    conns: Mutex<HashMap<String, Arc<Connection>>>,
}

impl ConnectionPool {
    pub fn new(timeout: Duration) -> ConnectionPool {
        ConnectionPool::with_options(ConnOptions::new(timeout))
    }

    pub fn with_options(opts: ConnOptions) -> ConnectionPool {
        ConnectionPool {
            opts,
            conns: Mutex::new(HashMap::new()),
        }
    }

    pub fn timeout(&self) -> Duration {
        self.opts.timeout
    }

    /// The live connection to `addr`, connecting if there is none.
    pub async fn get(&self, addr: &str) -> Result<Arc<Connection>> {
        if let Some(c) = self.conns.lock().expect("pool lock").get(addr) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let conn = Arc::new(Connection::connect_with(addr, self.opts).await?);
        let mut map = self.conns.lock().expect("pool lock");
        // Another task may have connected meanwhile; keep the first live one.
        match map.get(addr) {
            Some(existing) if !existing.is_closed() => Ok(existing.clone()),
            _ => {
                map.insert(addr.to_string(), conn.clone());
                Ok(conn)
            }
        }
    }

    /// Sends one request to `addr` over the pooled connection.
    pub async fn call(&self, addr: &str, kind: u16, parts: &[&[u8]]) -> Result<Bytes> {
        self.get(addr).await?.call(kind, parts).await
    }
}
