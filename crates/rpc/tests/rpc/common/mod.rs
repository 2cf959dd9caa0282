//! Helpers shared by the transport's robustness tests: an echo server over
//! TCP or an abstract Unix socket, and a raw socket that speaks frames by
//! hand (to play a misbehaving peer).

#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use nodekernel_proto::hello::{Hello, Role, HELLO_ID, HELLO_KIND};
use nodekernel_proto::{Error, FrameHeader, Result, HEADER_LEN};
use nodekernel_rpc::{
    abstract_unix_addr, bind_abstract_unix, serve_unix, serve_with, ConnOptions, Connection,
    Handler, ServeOptions, ServerHandle,
};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bound that only catches hangs: nothing in these tests should come near
/// it, however slow the machine.
pub const HANG: Duration = Duration::from_secs(120);

/// Awaits `f`, failing the test if it hangs.
pub async fn no_hang<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(HANG, f).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: still not done after {HANG:?} (hung)"),
    }
}

/// Waits (without an upper bound short of [`HANG`]) until `cond` holds.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    no_hang(what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
}

/// op 1: echo after the number of milliseconds in the first payload byte;
/// op 2: echo at once; op 3: an error naming the payload length; op 4:
/// echo once the test opens [`GATE`]. Counts the
/// requests being handled and the most handled at once, and records the
/// first 8 bytes of every payload (the tests' call ids).
#[derive(Default)]
pub struct Echo {
    pub active: AtomicUsize,
    pub most_active: AtomicUsize,
    pub seen: std::sync::Mutex<std::collections::HashSet<u64>>,
}

/// Opens op 4 of [`Echo`] (`notify_one`: one waiting request).
pub static GATE: tokio::sync::Notify = tokio::sync::Notify::const_new();

impl Echo {
    /// Whether a request whose payload starts with `id` was handled.
    pub fn saw(&self, id: u64) -> bool {
        self.seen.lock().unwrap().contains(&id)
    }
}

impl Handler for Echo {
    async fn handle(&self, op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_active.fetch_max(now, Ordering::SeqCst);
        if let Some(id) = payload.get(..8) {
            let id = u64::from_le_bytes(id.try_into().unwrap());
            self.seen.lock().unwrap().insert(id);
        }
        let r = match op {
            1 => {
                let ms = payload.first().copied().unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(ms as u64)).await;
                out.extend_from_slice(&payload);
                Ok(())
            }
            2 => {
                out.extend_from_slice(&payload);
                Ok(())
            }
            3 => Err(Error::not_found(format!("{} bytes", payload.len()))),
            4 => {
                GATE.notified().await;
                out.extend_from_slice(&payload);
                Ok(())
            }
            _ => Err(Error::protocol("unknown op")),
        };
        self.active.fetch_sub(1, Ordering::SeqCst);
        r
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tcp,
    Unix,
}

pub struct Server {
    pub handle: ServerHandle,
    pub addr: String,
}

impl std::ops::Deref for Server {
    type Target = ServerHandle;
    fn deref(&self) -> &ServerHandle {
        &self.handle
    }
}

/// Starts a server for `handler` on a fresh port (port 0) or abstract name.
pub async fn start<H: Handler>(kind: Kind, handler: Arc<H>, opts: ServeOptions) -> Server {
    match kind {
        Kind::Tcp => {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let handle = serve_with(listener, handler, opts).unwrap();
            let addr = handle.local_addr().to_string();
            Server { handle, addr }
        }
        Kind::Unix => {
            let (name, listener) = bind_abstract_unix("nk-rpc-test-").unwrap();
            let handle = serve_unix(listener, handler, opts).unwrap();
            Server {
                handle,
                addr: abstract_unix_addr(&name),
            }
        }
    }
}

pub fn conn_opts(spin: Duration) -> ConnOptions {
    ConnOptions {
        timeout: Duration::from_secs(60),
        spin,
    }
}

pub async fn connect(addr: &str, spin: Duration) -> Connection {
    Connection::connect_with(addr, conn_opts(spin))
        .await
        .unwrap()
}

/// A frame: header and payload.
pub fn frame(id: u64, kind: u16, payload: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    FrameHeader::put(&mut b, id, kind, payload.len());
    b.extend_from_slice(payload);
    b.to_vec()
}

/// A client HELLO of this build's version, as a whole frame.
pub fn hello_frame() -> Vec<u8> {
    let mut p = BytesMut::new();
    Hello::new(Role::Client).encode(&mut p).unwrap();
    frame(HELLO_ID, HELLO_KIND, &p)
}

/// Reads one frame; `None` when the peer closed the connection (or reset
/// it). Fails the test if nothing happens before [`HANG`].
pub async fn read_frame(s: &mut tokio::net::TcpStream) -> Option<(u64, u16, Vec<u8>)> {
    no_hang("reading a frame", async {
        let mut h = [0u8; HEADER_LEN];
        s.read_exact(&mut h).await.ok()?;
        let hdr = FrameHeader::parse(&h).expect("the server sends valid frames");
        let mut p = vec![0u8; hdr.payload_len];
        s.read_exact(&mut p).await.ok()?;
        Some((hdr.id, hdr.kind, p))
    })
    .await
}

/// Waits until the server closes `s` (reading and discarding anything it
/// still sends). Fails the test if that does not happen before [`HANG`].
pub async fn closed_by_server(s: &mut tokio::net::TcpStream) {
    no_hang("waiting for the server to close the connection", async {
        let mut b = [0u8; 4096];
        loop {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
}

/// A raw TCP connection, past the HELLO exchange (done by hand).
pub async fn raw_peer(addr: &str) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(&hello_frame()).await.unwrap();
    let (id, status, payload) = read_frame(&mut s).await.expect("a HELLO answer");
    assert_eq!(
        (id, status),
        (HELLO_ID, 0),
        "{}",
        String::from_utf8_lossy(&payload)
    );
    Hello::decode(&payload).expect("the answer is a HELLO");
    s
}
