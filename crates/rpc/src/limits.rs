//! Every limit of the transport, in one place.
//!
//! A peer is never trusted to be small, quick or polite: the number of
//! connections, the requests in flight, the bytes buffered for a frame and
//! the time a frame or a handshake may take are all bounded. The limits a
//! deployment may want to change are fields of [`crate::ServeOptions`] with
//! the defaults below; the others are fixed here. The largest frame is fixed
//! by the wire protocol ([`nodekernel_proto::MAX_PAYLOAD_LEN`]: one 16 MiB
//! block plus 64 KiB).

use std::time::Duration;

/// Default of [`crate::ServeOptions::max_connections`]: open connections per
/// server. A connection beyond it is accepted and closed at once (so the
/// listen backlog does not fill up with connections nobody serves).
pub const MAX_CONNECTIONS: usize = 1024;

/// Default of [`crate::ServeOptions::max_connections_per_peer`]: open
/// connections of one peer (IP address, or local user) per server. A
/// client process needs a handful (one per server it talks to, and one for
/// shared memory); a quarter of [`MAX_CONNECTIONS`] leaves room for many
/// processes behind one address while no single one takes every slot.
pub const MAX_CONNECTIONS_PER_PEER: usize = 256;

/// Default of [`crate::ServeOptions::max_requests`]: requests handled at
/// once by one server, across all its connections. A request beyond it
/// waits (its connection stops reading) until another one finishes.
pub const MAX_REQUESTS: usize = 4096;

/// Default of [`crate::ServeOptions::max_in_flight`]: requests of one
/// connection handled at once.
pub const MAX_IN_FLIGHT: usize = 64;

/// Default of [`crate::ServeOptions::frame_timeout`]: once the first byte of
/// a frame has arrived, the rest must follow within this time (time the
/// server itself spends not reading, because of the bounds above, does not
/// count). A connection that stalls in the middle of a frame is closed. The
/// same bound applies to replies: a peer that takes no reply bytes for this
/// long (it stopped reading) is closed, releasing its requests' permits.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(30);

/// Default of [`crate::ServeOptions::handshake_timeout`]: a new connection
/// must complete its handshake within this time or the server closes it.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest payload of a handshake frame (either direction). A HELLO is at
/// most [`nodekernel_proto::hello::MAX_HELLO_LEN`] bytes; the rest is room
/// for authentication exchanges.
pub const MAX_HANDSHAKE_PAYLOAD: usize = 64 * 1024;

/// Capacity of a server connection's receive buffer when it starts and after
/// it shrinks back.
pub const RECV_BUF_INITIAL: usize = 64 * 1024;

/// A server receive buffer never offers a read less room than this (it grows
/// first).
pub const RECV_READ_MIN: usize = 16 * 1024;

/// A server receive buffer grows as bytes arrive, never from a declared
/// frame length alone: each growth asks for at most
/// `max(RECV_GROW_STEP, bytes buffered)` more, and never for more than the
/// frame still needs. A peer that sends only a header declaring a 16 MiB
/// frame pins [`RECV_BUF_INITIAL`], not 16 MiB.
pub const RECV_GROW_STEP: usize = 256 * 1024;

/// A server receive buffer larger than [`RECV_BUF_INITIAL`] shrinks back to
/// it once its connection has been idle (nothing buffered beyond a small
/// partial frame, no request in flight) for this long.
pub const RECV_SHRINK_AFTER: Duration = Duration::from_secs(1);

/// Bytes of replies a server connection collects before writing them out.
pub const REPLY_BUF: usize = 64 * 1024;

/// Longest error message sent in an error reply (longer ones are cut).
pub const MAX_ERROR_MESSAGE: usize = 64 * 1024;

/// Receive buffer of a client connection (initial capacity and growth
/// step). A client trusts the sizes its server announces for replies.
pub const CLIENT_RECV_BUF: usize = 256 * 1024;

/// TCP keepalive on every TCP connection (both ends): the first probe after
/// this much silence ...
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// ... then one probe per interval ...
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// ... and the connection is declared dead after this many unanswered
/// probes (a dead peer is noticed after about 60 s).
pub const KEEPALIVE_PROBES: u32 = 3;

/// Warnings about refused connections and failed accepts are logged at most
/// once per this interval (with the number suppressed meanwhile).
pub const LIMIT_WARN_INTERVAL: Duration = Duration::from_secs(10);
