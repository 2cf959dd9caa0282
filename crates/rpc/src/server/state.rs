//! What the accept loop and the connections of one server share
//! ([`ServerState`]): the registry of open connections with duplicates of
//! their sockets ([`Sockets`]), the budgets, and the counters.

use crate::limits::HANDSHAKE_GRACE;
use crate::server::budget::Budgets;
use crate::server::options::ServeOptions;
use nodekernel_proto::sync;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What the accept loop and the connections of one server share.
pub(super) struct ServerState {
    pub(super) sockets: Sockets,
    /// Requests in flight and bytes held, server-wide.
    pub(super) budgets: Budgets,
    /// Connections closed because of a frame that could not be parsed.
    pub(super) malformed: AtomicU64,
    /// Connections refused because `max_connections` were open.
    pub(super) refused: AtomicU64,
    /// Connections in their handshake closed to make room for new ones.
    pub(super) evicted: AtomicU64,
    /// Idle connections that busy-polled for their next request.
    pub(super) idle_spins: AtomicU64,
}

impl ServerState {
    /// The state of a server with settings `opts`: no connection, nothing
    /// held.
    pub(super) fn new(opts: &ServeOptions) -> ServerState {
        ServerState {
            sockets: Sockets::default(),
            budgets: Budgets::new(opts),
            malformed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            idle_spins: AtomicU64::new(0),
        }
    }
}

/// Duplicates of the listening socket and of every open connection, so
/// `shutdown` takes effect synchronously: the aborted tasks are only
/// dropped once the runtime gets to them, and a connection could otherwise
/// serve one more request.
#[derive(Default)]
pub(super) struct Sockets {
    pub(super) listener: std::sync::Mutex<Option<OwnedFd>>,
    pub(super) conns: std::sync::Mutex<Registry>,
    pub(super) stopped: AtomicBool,
    /// Wakes the accept loop: a shut-down Unix listener keeps reporting
    /// readiness while `accept` finds nothing, so the loop must not rely on
    /// an accept error to notice the end.
    pub(super) stop: tokio::sync::Notify,
    /// Wakes the accept loop waiting for room for a connection in its
    /// handshake: one finished its handshake or closed.
    pub(super) room: tokio::sync::Notify,
}

/// The open connections of a server.
#[derive(Default)]
pub(super) struct Registry {
    /// Every open connection: a duplicate of its socket, the peer it counts
    /// against, and its address (for logs).
    pub(super) open: HashMap<u64, Conn>,
    /// Open connections by peer (IP address, or local user).
    pub(super) per_peer: HashMap<String, usize>,
    /// The connections still in their handshake, oldest first, with when
    /// they were accepted.
    handshaking: BTreeMap<u64, Instant>,
}

pub(super) struct Conn {
    pub(super) fd: OwnedFd,
    pub(super) peer_key: String,
    pub(super) peer: String,
}

/// Whether a server can take one more connection now.
#[derive(Clone, Copy)]
pub(super) enum Room {
    /// There is room.
    Free,
    /// The connection in its handshake with id `oldest` must make room;
    /// it may from `due` on (see [`ServeOptions::max_handshakes`]).
    Crowded { oldest: u64, due: Instant },
    /// Every connection is past its handshake: refuse.
    Full,
}

impl Registry {
    /// Room for one more connection (see [`ServeOptions::max_handshakes`]).
    pub(super) fn room(&self, opts: &ServeOptions) -> Room {
        let crowded = self.handshaking.len() >= opts.max_handshakes
            || self.open.len() >= opts.max_connections;
        if !crowded {
            return Room::Free;
        }
        match self.handshaking.first_key_value() {
            None => Room::Full,
            Some((&oldest, &since)) => Room::Crowded {
                oldest,
                due: since + HANDSHAKE_GRACE.min(opts.handshake_timeout),
            },
        }
    }

    /// Registers a new connection, in its handshake.
    pub(super) fn add(&mut self, id: u64, conn: Conn, now: Instant) {
        *self.per_peer.entry(conn.peer_key.clone()).or_insert(0) += 1;
        self.handshaking.insert(id, now);
        self.open.insert(id, conn);
    }

    /// Forgets a connection (closed, or closed to make room); returns it if
    /// it was still registered.
    pub(super) fn remove(&mut self, id: u64) -> Option<Conn> {
        self.handshaking.remove(&id);
        let conn = self.open.remove(&id)?;
        if let Some(n) = self.per_peer.get_mut(&conn.peer_key) {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&conn.peer_key);
            }
        }
        Some(conn)
    }
}

pub(super) fn shutdown_fd(fd: &OwnedFd) {
    // shutdown(2) ends a listener's accepting and a connection's traffic at
    // once. SAFETY: a plain system call on a descriptor we own.
    unsafe {
        libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR);
    }
}

impl Sockets {
    pub(super) fn shutdown_all(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.stop.notify_one();
        if let Some(fd) = sync::lock(&self.listener).as_ref() {
            shutdown_fd(fd);
        }
        for c in sync::lock(&self.conns).open.values() {
            shutdown_fd(&c.fd);
        }
    }

    pub(super) fn open(&self) -> usize {
        sync::lock(&self.conns).open.len()
    }

    /// Connection `id` finished its handshake; `false` if it was closed to
    /// make room meanwhile.
    pub(super) fn established(&self, id: u64) -> bool {
        let mut reg = sync::lock(&self.conns);
        let present = reg.open.contains_key(&id);
        reg.handshaking.remove(&id);
        drop(reg);
        self.room.notify_one();
        present
    }
}

/// Removes a connection from the registry when its task ends.
pub(super) struct Registered {
    pub(super) state: Arc<ServerState>,
    pub(super) id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let sockets = &self.state.sockets;
        let gone = sync::lock(&sockets.conns).remove(self.id);
        drop(gone); // its duplicate descriptor, closed outside the lock
        sockets.room.notify_one();
    }
}
