//! [`ServeOptions`]: the limits of a server's connections that a
//! deployment may set, with the defaults of [`crate::limits`].

use crate::limits::{
    FRAME_TIMEOUT, HANDSHAKE_TIMEOUT, MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER,
    MAX_CONNECTION_REPLY_BYTES, MAX_HANDSHAKES, MAX_IN_FLIGHT, MAX_REPLY_BYTES, MAX_REQUESTS,
    MAX_REQUEST_BYTES,
};
use crate::transport::LocalPeers;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Settings of a server's connections. The defaults are the constants of
/// [`crate::limits`].
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// How long an idle connection busy-polls for the next request before
    /// parking (0 disables spinning).
    pub spin: Duration,
    /// Requests of one connection handled concurrently; replies go out as
    /// they complete (the client matches them by id).
    pub max_in_flight: usize,
    /// Open connections (including those still in their handshake). A
    /// connection beyond it is answered with an `Unavailable` error frame
    /// and closed at once, unless a connection in its handshake can make
    /// room (see `max_handshakes`).
    pub max_connections: usize,
    /// Connections in their handshake. When they are all taken (or every
    /// connection is), the oldest connection in its handshake is closed to
    /// make room once it has had [`HANDSHAKE_GRACE`] (or the handshake
    /// timeout, if shorter); until then new connections wait in the listen
    /// queue. See [`MAX_HANDSHAKES`].
    ///
    /// [`HANDSHAKE_GRACE`]: crate::limits::HANDSHAKE_GRACE
    pub max_handshakes: usize,
    /// Open connections of one peer (an IP address, or a local user on a
    /// Unix socket), so one client cannot take them all; refused like
    /// those beyond `max_connections`.
    pub max_connections_per_peer: usize,
    /// Requests handled at once across all connections of this server; a
    /// request beyond it waits for another to finish.
    pub max_requests: usize,
    /// Bytes of request payloads larger than [`SMALL_PAYLOAD`] held at
    /// once, being received or handled, across all connections; a frame
    /// beyond it waits, unread. See [`MAX_REQUEST_BYTES`].
    ///
    /// [`SMALL_PAYLOAD`]: crate::limits::SMALL_PAYLOAD
    pub max_request_bytes: usize,
    /// Bytes of replies declared by the handler ([`Handler::reply_len`])
    /// held at once, being built or waiting to be sent, across all
    /// connections; a request beyond it waits. See [`MAX_REPLY_BYTES`].
    ///
    /// [`Handler::reply_len`]: crate::Handler::reply_len
    pub max_reply_bytes: usize,
    /// The same for one connection (which may always have one reply): a
    /// connection whose replies are not read stops having its requests
    /// read. See [`MAX_CONNECTION_REPLY_BYTES`].
    pub max_connection_reply_bytes: usize,
    /// Once a frame's first byte has arrived, the rest must arrive within
    /// this time, or the connection is closed (time the server spends not
    /// reading, because of the bounds above, does not count). Also the
    /// longest a reply may wait for the peer to take any of its bytes.
    pub frame_timeout: Duration,
    /// A new connection must finish its handshake within this time.
    pub handshake_timeout: Duration,
    /// Who may connect over a Unix socket (not checked for TCP): a peer
    /// refused is answered with an `Unauthenticated` error and closed
    /// before its first frame is read.
    pub local_peers: LocalPeers,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            spin: crate::default_spin(),
            max_in_flight: MAX_IN_FLIGHT,
            max_connections: MAX_CONNECTIONS,
            max_connections_per_peer: MAX_CONNECTIONS_PER_PEER,
            max_handshakes: MAX_HANDSHAKES,
            max_requests: MAX_REQUESTS,
            max_request_bytes: MAX_REQUEST_BYTES,
            max_reply_bytes: MAX_REPLY_BYTES,
            max_connection_reply_bytes: MAX_CONNECTION_REPLY_BYTES,
            frame_timeout: FRAME_TIMEOUT,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            local_peers: LocalPeers::owner(),
        }
    }
}

impl ServeOptions {
    /// These settings with every count at least 1 (and the request bound
    /// at most what a semaphore holds), as a server runs them.
    pub(super) fn bounded(self) -> ServeOptions {
        ServeOptions {
            max_in_flight: self.max_in_flight.max(1),
            max_connections: self.max_connections.max(1),
            max_connections_per_peer: self.max_connections_per_peer.max(1),
            max_handshakes: self.max_handshakes.max(1),
            max_requests: self.max_requests.clamp(1, Semaphore::MAX_PERMITS),
            ..self
        }
    }
}
