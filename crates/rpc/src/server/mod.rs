//! The server end: an accept loop, and one task per connection that runs the
//! handshake, then reads frames, hands each request to the [`Handler`] and
//! writes the replies.
//!
//! Every resource a peer can make the server hold is bounded (see
//! [`crate::limits`]): open connections ([`ServeOptions::max_connections`])
//! and those still in their handshake ([`ServeOptions::max_handshakes`]),
//! requests being handled per connection and per server, the payload each
//! request kind may have ([`Handler::max_payload`]), the bytes held for
//! frames being received or handled ([`ServeOptions::max_request_bytes`];
//! receive buffers grow only as bytes arrive, and shrink back when idle),
//! the bytes of replies waiting for their peer
//! ([`ServeOptions::max_reply_bytes`]), and the time a handshake or a frame
//! may take.
//!
//! The files: `handler.rs` (what a server plugs in), `options.rs` (its
//! settings), `state.rs` (what its accept loop and connections share),
//! `budget.rs` (the server-wide budgets a request draws on), `accept.rs`
//! (the accept loop: who gets in), `conn.rs` (one connection: its
//! handshake, then its requests), `recv.rs` (a connection's receive buffer
//! and the frames in it) and `send.rs` (handling a request and writing its
//! reply). Each depends only on those listed before it (and `conn.rs` on
//! `recv.rs` and `send.rs`).

mod accept;
mod budget;
mod conn;
mod handler;
mod options;
mod recv;
mod send;
mod state;

pub use handler::{DirectSink, Handler, Reply, SharedBody, DIRECT_MIN};
pub use options::ServeOptions;

use crate::transport::Listener;
use accept::Acceptor;
use nodekernel_proto::sync;
use nodekernel_proto::Result;
use state::ServerState;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinHandle;

/// A running server. Dropping it (or calling [`ServerHandle::shutdown`])
/// stops accepting and closes every connection.
pub struct ServerHandle {
    /// The TCP address served; `None` for a Unix-socket server.
    addr: Option<SocketAddr>,
    task: JoinHandle<()>,
    state: Arc<ServerState>,
    opts: ServeOptions,
}

impl ServerHandle {
    /// The TCP address served (the unspecified address `0.0.0.0:0` for a
    /// server started with [`serve_unix`]).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// Stops the server: from the moment this returns, new connections are
    /// refused and open connections carry no more traffic. Idempotent.
    pub fn shutdown(&self) {
        self.state.sockets.shutdown_all();
        self.task.abort();
    }

    /// Connections open right now (including those in their handshake).
    pub fn connections(&self) -> usize {
        self.state.sockets.open()
    }

    /// Connections refused so far because
    /// [`ServeOptions::max_connections`] were open.
    pub fn refused_connections(&self) -> u64 {
        self.state.refused.load(Ordering::Relaxed)
    }

    /// Connections closed while still in their handshake to make room
    /// for new ones ([`ServeOptions::max_handshakes`]).
    pub fn evicted_handshakes(&self) -> u64 {
        self.state.evicted.load(Ordering::Relaxed)
    }

    /// Bytes reserved right now for request frames and for replies
    /// ([`ServeOptions::max_request_bytes`], [`ServeOptions::max_reply_bytes`]).
    #[doc(hidden)]
    pub fn reserved_bytes(&self) -> (usize, usize) {
        (
            self.state.budgets.request_bytes.used(),
            self.state.budgets.reply_bytes.used(),
        )
    }

    /// Requests being handled right now, across all connections.
    pub fn requests_in_flight(&self) -> usize {
        self.opts
            .max_requests
            .saturating_sub(self.state.budgets.requests.available_permits())
    }

    /// Bytes of receive-buffer capacity held by this server's connections
    /// (for tests of the memory bounds).
    #[doc(hidden)]
    pub fn recv_buffer_bytes(&self) -> usize {
        self.state.budgets.recv_bytes.load(Ordering::Relaxed)
    }

    /// The most receive-buffer capacity this server's connections have
    /// held at once (for tests of the memory bounds).
    #[doc(hidden)]
    pub fn recv_buffer_peak(&self) -> usize {
        self.state.budgets.recv_bytes_peak.load(Ordering::Relaxed)
    }

    /// Times an idle connection busy-polled for its next request (it
    /// stops while its requests come seldom; see [`crate::spin`]).
    pub fn idle_spins(&self) -> u64 {
        self.state.idle_spins.load(Ordering::Relaxed)
    }

    /// Connections closed so far because of a frame the server could not
    /// parse (a bad header, or a first frame that is not a valid HELLO).
    #[doc(hidden)]
    pub fn malformed_frames(&self) -> u64 {
        self.state.malformed.load(Ordering::Relaxed)
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Starts serving `listener` with `handler` on the current tokio runtime.
pub fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>) -> Result<ServerHandle> {
    serve_with(listener, handler, ServeOptions::default())
}

/// Like [`serve`], with explicit connection settings.
pub fn serve_with<H: Handler>(
    listener: TcpListener,
    handler: Arc<H>,
    opts: ServeOptions,
) -> Result<ServerHandle> {
    let addr = listener
        .local_addr()
        .map_err(|e| crate::sock::io_error("listener address", e))?;
    serve_listener(Listener::Tcp(listener), Some(addr), handler, opts)
}

/// Like [`serve_with`], on a Unix-domain listener (see
/// [`crate::bind_unix`]): for clients on the same host.
pub fn serve_unix<H: Handler>(
    listener: UnixListener,
    handler: Arc<H>,
    opts: ServeOptions,
) -> Result<ServerHandle> {
    serve_listener(Listener::Unix(listener), None, handler, opts)
}

fn serve_listener<H: Handler>(
    listener: Listener,
    addr: Option<SocketAddr>,
    handler: Arc<H>,
    opts: ServeOptions,
) -> Result<ServerHandle> {
    crate::transport::raise_nofile_limit();
    listener.widen_backlog();
    let opts = opts.bounded();
    let state = Arc::new(ServerState::new(&opts));
    *sync::lock(&state.sockets.listener) = Some(
        listener
            .dup()
            .map_err(|e| crate::sock::io_error("duplicating the listening socket", e))?,
    );
    let accepting = Acceptor::new(listener, handler, state.clone(), opts);
    let task = tokio::spawn(accepting.run());
    Ok(ServerHandle {
        addr,
        task,
        state,
        opts,
    })
}
