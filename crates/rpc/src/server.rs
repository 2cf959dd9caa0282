use bytes::{Bytes, BytesMut};
use nodekernel_proto::frame::STATUS_OK;
use nodekernel_proto::{Error, ErrorCode, FrameHeader, Result, HEADER_LEN};
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// Serves requests of one kind of server (metadata or storage).
pub trait Handler: Send + Sync + 'static {
    /// Handles request `op` with `payload`, appending the reply payload to
    /// `out` on success. Errors are sent back as error replies.
    fn handle(
        &self,
        op: u16,
        payload: Bytes,
        out: &mut BytesMut,
    ) -> impl Future<Output = Result<()>> + Send;
}

/// A running server. Dropping it (or calling [`ServerHandle::shutdown`])
/// stops accepting and closes every connection.
pub struct ServerHandle {
    addr: SocketAddr,
    task: JoinHandle<()>,
    /// A duplicate of the listening socket, so `shutdown` can stop accepting
    /// synchronously (the aborted accept task is only dropped once the
    /// runtime gets to it).
    listen_fd: OwnedFd,
}

impl ServerHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server: new connections are refused from the moment this
    /// returns, and every open connection is closed. Idempotent.
    pub fn shutdown(&self) {
        // shutdown(2) takes a listening socket out of the listen state at
        // once. SAFETY: a plain system call on a descriptor we own.
        unsafe {
            libc::shutdown(self.listen_fd.as_raw_fd(), libc::SHUT_RDWR);
        }
        self.task.abort();
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts serving `listener` with `handler` on the current tokio runtime.
pub fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>) -> Result<ServerHandle> {
    let addr = listener
        .local_addr()
        .map_err(|e| crate::io_error("listener address", e))?;
    let listen_fd = listener
        .as_fd()
        .try_clone_to_owned()
        .map_err(|e| crate::io_error("duplicating the listening socket", e))?;
    let task = tokio::spawn(async move {
        // Connections live in this set: aborting the accept task drops the
        // set, which aborts every connection task with it.
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let _ = stream.set_nodelay(true);
                        conns.spawn(connection(stream, peer, handler.clone()));
                    }
                    // A listener shut down by `ServerHandle::shutdown`.
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => return,
                    Err(e) => {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    });
    Ok(ServerHandle {
        addr,
        task,
        listen_fd,
    })
}

async fn connection<H: Handler>(stream: TcpStream, peer: SocketAddr, handler: Arc<H>) {
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(64 * 1024, rd);
    let mut wr = BufWriter::with_capacity(64 * 1024, wr);
    let mut out = BytesMut::with_capacity(64 * 1024);
    loop {
        let mut h = [0u8; HEADER_LEN];
        if rd.read_exact(&mut h).await.is_err() {
            return; // peer closed (or sent a partial header and closed)
        }
        let header = match FrameHeader::parse(&h) {
            Ok(h) => h,
            Err(e) => {
                // The stream is unsynchronised: answer, then close.
                tracing::debug!("closing connection from {peer}: {e}");
                let id = u64::from_le_bytes(h[4..12].try_into().expect("8 bytes"));
                out.clear();
                push_error(&mut out, id, &e);
                let _ = wr.write_all(&out).await;
                let _ = wr.flush().await;
                return;
            }
        };
        let mut payload = BytesMut::zeroed(header.payload_len);
        if rd.read_exact(&mut payload).await.is_err() {
            return; // truncated frame: the peer went away
        }
        out.clear();
        let start = FrameHeader::begin(&mut out, header.id, STATUS_OK);
        let result = handler
            .handle(header.kind, payload.freeze(), &mut out)
            .await;
        let result = result.and_then(|()| FrameHeader::seal(&mut out, start));
        if let Err(e) = result {
            if e.code == ErrorCode::Protocol {
                tracing::debug!("bad request from {peer}: {e}");
            }
            out.truncate(start);
            push_error(&mut out, header.id, &e);
        }
        if wr.write_all(&out).await.is_err() {
            return;
        }
        // Batch replies while more requests are already waiting.
        if rd.buffer().is_empty() && wr.flush().await.is_err() {
            return;
        }
        if out.capacity() > 4 << 20 {
            out = BytesMut::with_capacity(64 * 1024);
        }
    }
}

fn push_error(out: &mut BytesMut, id: u64, e: &Error) {
    let msg = e.message.as_bytes();
    let msg = &msg[..msg.len().min(64 * 1024)];
    FrameHeader::put(out, id, e.code as u16, msg.len());
    out.extend_from_slice(msg);
}
