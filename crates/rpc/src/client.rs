use bytes::{Bytes, BytesMut};
use nodekernel_proto::frame::STATUS_OK;
use nodekernel_proto::{Error, FrameHeader, Result, HEADER_LEN, MAX_PAYLOAD_LEN};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

type Pending = Mutex<HashMap<u64, oneshot::Sender<Result<Bytes>>>>;

struct Shared {
    pending: Pending,
    closed: AtomicBool,
    peer: String,
}

impl Shared {
    fn fail_all(&self, err: &Error) {
        self.closed.store(true, Ordering::Release);
        let waiters: Vec<_> = self.pending.lock().expect("pending lock").drain().collect();
        for (_, tx) in waiters {
            let _ = tx.send(Err(err.clone()));
        }
    }
}

/// The client end of one connection to a NodeKernel server.
pub struct Connection {
    shared: Arc<Shared>,
    writer: tokio::sync::Mutex<BufWriter<OwnedWriteHalf>>,
    next_id: AtomicU64,
    timeout: Duration,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Connection {
    /// Connects to `addr`, giving up after `timeout`. The same timeout bounds
    /// every call made on the connection.
    pub async fn connect(addr: &str, timeout: Duration) -> Result<Connection> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(Error::unavailable(format!("cannot connect to {addr}: {e}"))),
            Err(_) => {
                return Err(Error::timeout(format!(
                    "connecting to {addr} took longer than {timeout:?}"
                )))
            }
        };
        stream
            .set_nodelay(true)
            .map_err(|e| crate::io_error(addr, e))?;
        let (rd, wr) = stream.into_split();
        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            peer: addr.to_string(),
        });
        let reader = tokio::spawn(read_loop(rd, shared.clone()));
        Ok(Connection {
            shared,
            writer: tokio::sync::Mutex::new(BufWriter::with_capacity(64 * 1024, wr)),
            next_id: AtomicU64::new(1),
            timeout,
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

    /// Sends a request whose payload is the concatenation of `parts` and
    /// waits for its reply payload. Error replies become [`Error`]s; a reply
    /// that does not arrive within the timeout gives `Timeout`.
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
        let (tx, rx) = oneshot::channel();
        self.shared
            .pending
            .lock()
            .expect("pending lock")
            .insert(id, tx);
        let mut header = BytesMut::with_capacity(HEADER_LEN);
        FrameHeader::put(&mut header, id, kind, len);

        let deadline = tokio::time::Instant::now() + self.timeout;
        let send = async {
            let mut w = self.writer.lock().await;
            w.write_all(&header).await?;
            for p in parts {
                w.write_all(p).await?;
            }
            w.flush().await
        };
        let sent = tokio::time::timeout_at(deadline, send).await;
        let outcome = match sent {
            Ok(Ok(())) => match tokio::time::timeout_at(deadline, rx).await {
                Ok(Ok(r)) => return r,
                Ok(Err(_)) => Err(Error::unavailable(format!(
                    "connection to {} closed while waiting for a reply",
                    self.shared.peer
                ))),
                Err(_) => Err(self.timed_out()),
            },
            Ok(Err(e)) => {
                let err = crate::io_error(&format!("sending to {}", self.shared.peer), e);
                self.shared.fail_all(&err);
                Err(err)
            }
            Err(_) => Err(self.timed_out()),
        };
        self.shared
            .pending
            .lock()
            .expect("pending lock")
            .remove(&id);
        outcome
    }

    fn timed_out(&self) -> Error {
        Error::timeout(format!(
            "no reply from {} within {:?}",
            self.shared.peer, self.timeout
        ))
    }
}

async fn read_loop(mut rd: tokio::net::tcp::OwnedReadHalf, shared: Arc<Shared>) {
    let mut rd_buf = tokio::io::BufReader::with_capacity(64 * 1024, &mut rd);
    let err = loop {
        let mut h = [0u8; HEADER_LEN];
        if let Err(e) = rd_buf.read_exact(&mut h).await {
            break crate::io_error(&format!("connection to {}", shared.peer), e);
        }
        let header = match FrameHeader::parse(&h) {
            Ok(h) => h,
            Err(e) => break e,
        };
        let mut payload = BytesMut::zeroed(header.payload_len);
        if let Err(e) = rd_buf.read_exact(&mut payload).await {
            break crate::io_error(&format!("connection to {}", shared.peer), e);
        }
        let result = if header.kind == STATUS_OK {
            Ok(payload.freeze())
        } else {
            Err(Error::from_wire(header.kind, &payload))
        };
        let waiter = shared
            .pending
            .lock()
            .expect("pending lock")
            .remove(&header.id);
        if let Some(tx) = waiter {
            let _ = tx.send(result);
        }
    };
    shared.fail_all(&err);
}

/// One shared connection per peer address, reconnecting when a connection
/// has failed.
pub struct ConnectionPool {
    timeout: Duration,
    conns: Mutex<HashMap<String, Arc<Connection>>>,
}

impl ConnectionPool {
    pub fn new(timeout: Duration) -> ConnectionPool {
        ConnectionPool {
            timeout,
            conns: Mutex::new(HashMap::new()),
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The live connection to `addr`, connecting if there is none.
    pub async fn get(&self, addr: &str) -> Result<Arc<Connection>> {
        if let Some(c) = self.conns.lock().expect("pool lock").get(addr) {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        let conn = Arc::new(Connection::connect(addr, self.timeout).await?);
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
