//! What a client is configured with: [`ClientConfig`] (built by hand or by
//! [`crate::discover`] from the environment and `nodekernel.toml`) and the
//! [`CreateOptions`] of a create.

use crate::blockio::AccessHook;
use nodekernel_proto::meta::TTL_NEVER;
use std::sync::Arc;
use std::time::Duration;

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Metadata servers, in partition order.
    pub metas: Vec<String>,
    /// Bound on connecting and on every request.
    pub timeout: Duration,
    /// This client's location class (host name by default).
    pub location: String,
    /// Block transfers kept in flight by one read or write call.
    pub transfers_in_flight: usize,
    /// Map the memory of DRAM storage servers on the same host and read and
    /// write their blocks with memory copies instead of network requests
    /// (default `true`). Servers elsewhere, file-tier servers and servers
    /// that do not share their memory are always reached over the network.
    pub shared_memory: bool,
    /// Talk to metadata servers on the same host over their abstract Unix
    /// socket instead of TCP (default `true`).
    pub unix_sockets: bool,
    /// How long a caller busy-polls for a reply before parking (0 disables
    /// spinning; default 100 µs or `NK_POLL_SPIN_US`).
    pub poll_spin: Duration,
    /// Sees every block transfer, mapped ones included (per-block access
    /// statistics, metrics); `None` by default.
    pub access_hook: Option<Arc<dyn AccessHook>>,
    /// The cluster token this client proves on every connection (to
    /// metadata and storage servers, and for shared memory); `None` by
    /// default, when [`Client::connect`](crate::Client::connect) uses one a server on this host
    /// published for its address, if any. [`crate::discover`] reads it from
    /// `NK_TOKEN_FILE` or the `[security]` section.
    pub token: Option<Arc<nodekernel_rpc::Token>>,
    /// TLS on TCP connections (the `[security.tls]` table); `None` by
    /// default.
    pub tls: Option<Arc<nodekernel_rpc::Tls>>,
    /// The key this client encrypts and decrypts the data of encrypted
    /// nodes with (`docs/encryption.md`); never sent anywhere. `None` by
    /// default: encrypted nodes then fail with `Unauthenticated`.
    /// [`crate::discover`] reads it from `NK_ENCRYPTION_KEY_FILE` or
    /// `[security] encryption_key_file`.
    pub encryption_key: Option<Arc<crate::crypt::EncryptionKey>>,
    /// Renew the write leases of this client's open writers a few times
    /// per lease, so a writer that pauses keeps its node (default `true`).
    /// Without it, a writer silent for about two leases
    /// (`meta.lease_timeout_ms`) loses what it wrote since its last sync,
    /// as a writer that vanished does: for tests of lease expiry.
    pub renew_leases: bool,
    /// Puts of small values reserved ahead of their keys, per metadata
    /// partition and piece size, at most (default 32; 0: none, every put
    /// creates its node): a client putting small values one after another
    /// then puts each in one exchange with its metadata server. An unused
    /// reservation holds its piece until the client uses it or its lease
    /// lapses (`docs/small-values.md`, *Puts in one exchange*).
    pub reserved_puts: u32,
}

impl ClientConfig {
    pub fn new(metas: Vec<String>) -> Self {
        ClientConfig {
            metas,
            timeout: Duration::from_secs(5),
            location: default_location(),
            transfers_in_flight: 16,
            shared_memory: true,
            unix_sockets: true,
            poll_spin: nodekernel_rpc::default_call_spin(),
            access_hook: None,
            token: None,
            tls: None,
            encryption_key: None,
            renew_leases: true,
            reserved_puts: 32,
        }
    }
}

/// Now, in nanoseconds since the Unix epoch (what nodes keep as their
/// modification time).
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The host name, used as the default location class.
pub fn default_location() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// Options of a create besides path and type.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// Preferred storage class; `None` inherits the parent directory's
    /// preference, or uses the highest class with free space.
    pub storage_class: Option<u8>,
    /// Ask for blocks on storage servers at this client's location first.
    pub local: bool,
    /// For Tables: whether children are listed (default true).
    pub enumerable: bool,
    /// For a KeyValue: the size its writer will write, when known (0:
    /// unknown). A small value (up to a quarter block) is then stored in a
    /// piece of a block shared with other small values, and cannot grow
    /// past that piece. [`Client::put`](crate::Client::put) sets it.
    pub size_hint: u64,
    /// Tier migration never moves the node's blocks (e.g. broadcast data
    /// that must stay in DRAM; `docs/tiering.md`).
    pub pinned: bool,
    /// Permission bits; `None` gives 0o755 to containers and 0o644 to
    /// data nodes.
    pub mode: Option<u32>,
    /// Modification time (nanoseconds since the Unix epoch); `None` is now.
    pub mtime: Option<u64>,
    /// When the node (with its subtree) expires (`docs/lifecycle.md`):
    /// `None` takes the parent's child TTL, if it has one.
    pub ttl: Option<Ttl>,
    /// For a Directory, Table or Bag: the TTL of new children whose create
    /// names none (`None`: no child TTL).
    pub child_ttl: Option<Duration>,
    /// The session the node is bound to ([`Client::session`](crate::Client::session)):
    /// it is removed, with its subtree, when the session ends or its lease
    /// lapses (`docs/lifecycle.md`, *Sessions*).
    pub session: Option<crate::Session>,
}

/// How long a node lives (`docs/lifecycle.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    /// It expires this long from now (rounded up to whole milliseconds;
    /// at most about 100 years).
    After(Duration),
    /// It never expires (not even under a parent with a child TTL).
    Never,
}

impl Ttl {
    /// The milliseconds a request carries ([`TTL_NEVER`] for never).
    pub fn wire_ms(self) -> u64 {
        match self {
            Ttl::Never => TTL_NEVER,
            Ttl::After(d) => ttl_ms(d),
        }
    }
}

/// `d` as a request's TTL: whole milliseconds, rounded up, at least 1
/// (saturating below [`TTL_NEVER`]; the server refuses what is too long).
pub(crate) fn ttl_ms(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms)
        .unwrap_or(u64::MAX)
        .clamp(1, TTL_NEVER - 1)
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            storage_class: None,
            local: false,
            enumerable: true,
            size_hint: 0,
            pinned: false,
            mode: None,
            mtime: None,
            ttl: None,
            child_ttl: None,
            session: None,
        }
    }
}
