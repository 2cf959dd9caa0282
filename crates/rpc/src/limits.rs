//! Every limit of the transport, in one place.
//!
//! A peer is never trusted to be small, quick or polite: the number of
//! connections, the requests in flight, the bytes buffered for a frame and
//! the time a frame or a handshake may take are all bounded. The limits a
//! deployment may want to change are fields of [`crate::ServeOptions`] with
//! the defaults below; the others are fixed here. The largest frame is fixed
//! by the wire protocol ([`nodekernel_proto::MAX_PAYLOAD_LEN`]: one 16 MiB
//! block plus 64 KiB); a handler lowers it per request kind
//! ([`crate::Handler::max_payload`]).
//!
//! What a server's connections hold, at most: a receive buffer of
//! [`RECV_BUF_INITIAL`] (+ [`RECV_READ_MIN`]) each, plus
//! [`MAX_REQUEST_BYTES`] of larger frames and their payloads,
//! [`MAX_REQUESTS`] x [`SMALL_PAYLOAD`] of small payloads,
//! [`MAX_REPLY_BYTES`] of declared replies, and [`MAX_IN_FLIGHT`] small
//! (undeclared) replies per connection.

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

/// Default of [`crate::ServeOptions::max_handshakes`]: connections in their
/// handshake (which have proved nothing yet) per server, a quarter of
/// [`MAX_CONNECTIONS`]. When they are all taken, or every connection slot
/// is, the oldest connection still in its handshake is closed to make room
/// for the next one, once it has had [`HANDSHAKE_GRACE`]; until then new
/// connections wait in the listen queue ([`LISTEN_BACKLOG`]), in the order
/// they came. So peers that open connections and never finish their
/// handshake (from any number of addresses) cannot keep out those that do:
/// they hold at most this many slots, and a new client waits at most about
/// (connections queued before it / `MAX_HANDSHAKES`) x `HANDSHAKE_GRACE`
/// (4 s behind a full queue of 4,096).
pub const MAX_HANDSHAKES: usize = 256;

/// A connection in its handshake is not closed to make room for another
/// before it has had this long (or the handshake timeout, if shorter): a
/// client that is not stuck finishes its handshake well within it (a
/// handshake takes a few round trips).
pub const HANDSHAKE_GRACE: Duration = Duration::from_millis(250);

/// Connections the kernel keeps waiting to be accepted (the listen
/// backlog; capped by `net.core.somaxconn`, 4,096 on current kernels).
/// While [`MAX_HANDSHAKES`] are taken, new connections wait there in the
/// order they came: a queue that overflows drops connection attempts,
/// which then retry with growing pauses and lose their place.
pub const LISTEN_BACKLOG: i32 = 4096;

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

/// Request payloads of at most this many bytes are copied out of their
/// connection's receive buffer for the handler (a copy of a few KiB costs
/// less than keeping the buffer alive for the request). At most
/// [`MAX_REQUESTS`] of them are held at once.
pub const SMALL_PAYLOAD: usize = 4 * 1024;

/// Default of [`crate::ServeOptions::max_request_bytes`]: bytes of request
/// payloads larger than [`SMALL_PAYLOAD`] a server holds at once, across
/// its connections, until their requests have been handled. A frame
/// reserves `max(its length, RECV_BUF_INITIAL) + RECV_READ_MIN` bytes
/// before it is taken, or, if it is larger than its connection's receive
/// buffer, before the buffer grows for it (then to the whole frame at once;
/// its pages become resident as its bytes arrive). A connection whose frame
/// does not fit waits, reading nothing, without its frame timeout running
/// (those holding the bytes must finish their frames within theirs). A
/// frame that announces more than it sends holds nothing until its bytes
/// fill the receive buffer. Frames a handler receives in place (a DRAM
/// server's writes) take none.
pub const MAX_REQUEST_BYTES: usize = 128 << 20;

/// Default of [`crate::ServeOptions::max_reply_bytes`]: bytes of replies a
/// server holds at once, across its connections, for the requests whose
/// handler declares them in advance ([`crate::Handler::reply_len`]: a file
/// server's reads), from before the request is handled until its reply
/// has been handed to the socket. A request whose reply does not fit
/// waits (its connection reads nothing meanwhile).
pub const MAX_REPLY_BYTES: usize = 128 << 20;

/// Default of [`crate::ServeOptions::max_connection_reply_bytes`]: the same
/// per connection (a connection may always have one reply, however
/// large): a connection whose peer does not read its replies stops having
/// its requests read once this much waits, so it holds no more.
pub const MAX_CONNECTION_REPLY_BYTES: usize = 32 << 20;

/// Once the bytes a server holds for frames, replies and receive buffers
/// have fallen this far below their peak, it hands the freed heap memory
/// back to the system (glibc's `malloc_trim`; other allocators give it
/// back themselves or keep it), checked every [`TRIM_INTERVAL`]. Without
/// it, memory freed after a burst of large buffers stays with the process.
pub const TRIM_AFTER: usize = 32 << 20;

/// Heap allocations of at least this many bytes are mapped on their own
/// (glibc's `M_MMAP_THRESHOLD`), so that freeing one hands it straight
/// back to the system. A process that serves sets it when its first
/// server starts. glibc's default raises this threshold to the largest
/// block freed (up to 32 MiB): after one 16 MiB frame, every later one
/// came from a thread's arena, whose free top (up to twice that)
/// `malloc_trim` does not hand back, so tens of MiB stayed after a burst.
pub const HEAP_MMAP_THRESHOLD: usize = 4 << 20;

/// Free memory at the top of a heap arena beyond this is handed back when
/// something is freed (glibc's `M_TRIM_THRESHOLD`; twice
/// [`HEAP_MMAP_THRESHOLD`], as glibc's own adaptive setting keeps it).
pub const HEAP_TRIM_THRESHOLD: usize = 2 * HEAP_MMAP_THRESHOLD;

/// How often a server checks whether to hand memory back ([`TRIM_AFTER`]).
pub const TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// Capacity of a server connection's receive buffer when it starts and after
/// it shrinks back.
pub const RECV_BUF_INITIAL: usize = 64 * 1024;

/// A server receive buffer never offers a read less room than this (it grows
/// first).
pub const RECV_READ_MIN: usize = 16 * 1024;

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
