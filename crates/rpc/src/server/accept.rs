//! The accept loop: who gets a connection. A Unix-socket peer must be one
//! of the [`LocalPeers`](crate::LocalPeers); a peer may have
//! `max_connections_per_peer` open; beyond `max_connections` (or
//! `max_handshakes`), the oldest connection still in its handshake makes
//! room once it has had its grace, and until then new connections wait in
//! the listen queue. Every connection admitted runs in a task of its own
//! ([`conn::connection`]).

use crate::handshake::ServerHandshake;
use crate::limits::{HANDSHAKE_GRACE, LIMIT_WARN_INTERVAL, TRIM_INTERVAL};
use crate::server::conn;
use crate::server::handler::Handler;
use crate::server::options::ServeOptions;
use crate::server::state::{shutdown_fd, Conn, Registered, Registry, Room, ServerState};
use crate::sock::push_error;
use crate::transport::{Listener, Stream};
use bytes::BytesMut;
use nodekernel_proto::sync;
use nodekernel_proto::Error;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio::time::{Interval, MissedTickBehavior};

/// The accept loop of one server and what it keeps between connections.
pub(super) struct Acceptor<H> {
    listener: Listener,
    handler: Arc<H>,
    handshake: Arc<dyn ServerHandshake>,
    state: Arc<ServerState>,
    opts: ServeOptions,
    /// Connections live in this set: aborting the accept task drops the
    /// set, which aborts every connection task with it.
    conns: JoinSet<()>,
    next_id: u64,
    refusals: RateLimited,
    local_refusals: RateLimited,
    evictions: RateLimited,
    accept_errors: RateLimited,
    /// When to check whether to hand memory back ([`TRIM_INTERVAL`]).
    trim: Interval,
}

impl<H: Handler> Acceptor<H> {
    pub(super) fn new(
        listener: Listener,
        handler: Arc<H>,
        state: Arc<ServerState>,
        opts: ServeOptions,
    ) -> Acceptor<H> {
        let handshake = handler.handshake();
        let mut trim = tokio::time::interval(TRIM_INTERVAL);
        trim.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Acceptor {
            listener,
            handler,
            handshake,
            state,
            opts,
            conns: JoinSet::new(),
            next_id: 0,
            refusals: RateLimited::default(),
            local_refusals: RateLimited::default(),
            evictions: RateLimited::default(),
            accept_errors: RateLimited::default(),
            trim,
        }
    }

    /// Accepts connections until the server stops.
    pub(super) async fn run(mut self) {
        loop {
            // While the connections in their handshake are all young, new
            // ones wait in the listen queue (see `max_handshakes`).
            if let Some(due) = self.crowded_until() {
                if !self.wait_for_room(due).await {
                    return;
                }
                continue;
            }
            tokio::select! {
                biased;
                () = self.state.sockets.stop.notified() => return,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer, peer_key)) => self.admit(stream, peer, peer_key),
                    // A listener shut down by `ServerHandle::shutdown`.
                    Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => return,
                    Err(e) => self.accept_failed(e).await,
                },
                Some(_) = self.conns.join_next(), if !self.conns.is_empty() => {}
                _ = self.trim.tick() => self.state.budgets.trim_if_freed(),
            }
        }
    }

    /// When the oldest connection in its handshake may be closed to make
    /// room, if there is no room before then.
    fn crowded_until(&self) -> Option<Instant> {
        let now = Instant::now();
        let room = sync::lock(&self.state.sockets.conns).room(&self.opts);
        match room {
            Room::Crowded { due, .. } if due > now => Some(due),
            _ => None,
        }
    }

    /// Waits until `due`, or until a connection finished its handshake or
    /// closed, doing the loop's other chores meanwhile; `false` once the
    /// server stopped.
    async fn wait_for_room(&mut self, due: Instant) -> bool {
        tokio::select! {
            biased;
            () = self.state.sockets.stop.notified() => return false,
            () = tokio::time::sleep_until(due.into()) => {}
            () = self.state.sockets.room.notified() => {}
            Some(_) = self.conns.join_next(), if !self.conns.is_empty() => {}
            _ = self.trim.tick() => self.state.budgets.trim_if_freed(),
        }
        true
    }

    /// Takes a new connection in and starts its task, or refuses it: a
    /// local user not let in, a peer over its limit, or a server over its
    /// own when no connection in its handshake can make room.
    fn admit(&mut self, stream: Stream, peer: String, peer_key: String) {
        if let Stream::Unix(_) = stream {
            if let Err(why) = self.opts.local_peers.check(stream.raw_fd()) {
                self.refuse_local(&stream, &why);
                return;
            }
        }
        let Ok(dup) = stream.dup() else {
            return; // out of descriptors: drop this connection
        };
        let now = Instant::now();
        let state = self.state.clone();
        let mut reg = sync::lock(&state.sockets.conns);
        let n = reg.per_peer.get(&peer_key).copied().unwrap_or(0);
        if n >= self.opts.max_connections_per_peer {
            drop(reg);
            self.refuse_peer(&stream, &peer, &peer_key, n);
            return;
        }
        if !self.make_room(&mut reg, now) {
            let open = reg.open.len();
            drop(reg);
            self.refuse_full(&stream, &peer, open);
            return;
        }
        self.next_id += 1;
        let conn = Conn {
            fd: dup,
            peer_key,
            peer: peer.clone(),
        };
        reg.add(self.next_id, conn, now);
        drop(reg);
        self.spawn(stream, peer);
    }

    /// Whether there is room for one more connection in `reg`, after
    /// closing the oldest connection in its handshake if that is due.
    fn make_room(&mut self, reg: &mut Registry, now: Instant) -> bool {
        match reg.room(&self.opts) {
            Room::Free => true,
            // Waited for above: the oldest connection in its handshake has
            // had its grace.
            Room::Crowded { oldest, due } if due <= now => {
                if let Some(victim) = reg.remove(oldest) {
                    shutdown_fd(&victim.fd);
                    self.state.evicted.fetch_add(1, Ordering::Relaxed);
                    if let Some(suppressed) = self.evictions.allow() {
                        tracing::warn!(
                            "closed the connection from {} still in its handshake after {:?} to \
                             make room (max_handshakes {}, max_connections {}); {suppressed} more \
                             since the last warning",
                            victim.peer,
                            now.saturating_duration_since(due)
                                + HANDSHAKE_GRACE.min(self.opts.handshake_timeout),
                            self.opts.max_handshakes,
                            self.opts.max_connections,
                        );
                    }
                }
                true
            }
            // Every connection is past its handshake (or, in a race, the
            // one that was old enough finished it).
            _ => false,
        }
    }

    /// Starts the task of the connection registered last.
    fn spawn(&mut self, stream: Stream, peer: String) {
        if self.state.sockets.stopped.load(Ordering::SeqCst) {
            self.state.sockets.shutdown_all();
        }
        let guard = Registered {
            state: self.state.clone(),
            id: self.next_id,
        };
        self.conns.spawn(conn::connection(
            stream,
            peer,
            guard,
            self.handler.clone(),
            self.handshake.clone(),
            self.state.clone(),
            self.opts,
        ));
    }

    fn refuse_local(&mut self, stream: &Stream, why: &str) {
        self.state.refused.fetch_add(1, Ordering::Relaxed);
        if let Some(suppressed) = self.local_refusals.allow() {
            tracing::warn!(
                "refused a local connection: {why}; {suppressed} more refused since the last \
                 warning"
            );
        }
        refuse_at_once(stream, &Error::unauthenticated(format!("refused: {why}")));
    }

    fn refuse_peer(&mut self, stream: &Stream, peer: &str, peer_key: &str, n: usize) {
        self.state.refused.fetch_add(1, Ordering::Relaxed);
        if let Some(suppressed) = self.refusals.allow() {
            tracing::warn!(
                "refused a connection from {peer}: {peer_key} has {n} connections open, the \
                 limit per peer (max_connections_per_peer); {suppressed} more refused since the \
                 last warning"
            );
        }
        refuse_at_once(
            stream,
            &Error::unavailable(format!(
                "{peer_key} has {} connections open to this server, the limit per peer; close \
                 some or try again later",
                self.opts.max_connections_per_peer
            )),
        );
    }

    fn refuse_full(&mut self, stream: &Stream, peer: &str, open: usize) {
        self.state.refused.fetch_add(1, Ordering::Relaxed);
        if let Some(suppressed) = self.refusals.allow() {
            tracing::warn!(
                "refused a connection from {peer}: {open} connections are open, the limit \
                 (max_connections); {suppressed} more refused since the last warning"
            );
        }
        refuse_at_once(
            stream,
            &Error::unavailable(format!(
                "the server has {} open connections, its limit; try again later",
                self.opts.max_connections
            )),
        );
    }

    /// An accept that failed (out of descriptors, typically): back off a
    /// little.
    async fn accept_failed(&mut self, e: std::io::Error) {
        if let Some(suppressed) = self.accept_errors.allow() {
            tracing::warn!(
                "accept failed: {e} ({suppressed} more failures since the last warning)"
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Tells a connection refused before its handshake why it is closed (if
/// the socket takes the few bytes at once: an error reply to the HELLO's
/// id) and drops it.
fn refuse_at_once(stream: &Stream, why: &Error) {
    let mut out = BytesMut::new();
    push_error(&mut out, 0, why);
    let fd = stream.raw_fd();
    // SAFETY: send reads `out.len()` bytes from a live buffer; `fd` is the
    // open socket `stream` owns. MSG_DONTWAIT: never blocks the accept
    // loop; MSG_NOSIGNAL: a peer already gone raises no SIGPIPE.
    unsafe {
        libc::send(
            fd,
            out.as_ptr().cast(),
            out.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        );
    }
}

/// Logs a line at most once per [`LIMIT_WARN_INTERVAL`].
#[derive(Default)]
struct RateLimited {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimited {
    /// `Some(lines suppressed since the last one)` when a line may be
    /// logged now.
    fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.last {
            Some(t) if now.duration_since(t) < LIMIT_WARN_INTERVAL => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}
