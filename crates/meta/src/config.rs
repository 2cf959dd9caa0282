//! A metadata server's settings ([`MetaConfig`], [`Persistence`]) and
//! what starting or checkpointing one can fail with ([`MetaError`]).

use crate::checkpoint::CheckpointError;
use crate::state::Placement;
use nodekernel_journal::{Fsync, JournalError};
use std::path::PathBuf;
use std::time::Duration;

/// Settings of one metadata server.
#[derive(Debug, Clone)]
pub struct MetaConfig {
    /// Address to listen on (`127.0.0.1:0` picks a free port).
    pub listen: String,
    /// Block size every storage server must export.
    pub block_size: u32,
    /// A writer that neither syncs nor allocates for this long loses its lease
    /// to the next writer that asks.
    pub lease_timeout: Duration,
    /// A storage server silent for this long is declared dead.
    pub dead_after: Duration,
    /// A storage server dead for this long is retired: its blocks are lost
    /// for good and it leaves status and capacity.
    pub retire_after: Duration,
    /// How long a reply waits for the block claims of its effects.
    pub claim_timeout: Duration,
    /// Names and prices of the storage classes (shown in status).
    pub classes: Vec<nodekernel_proto::ClassInfo>,
    /// How long an idle connection busy-polls for the next request.
    pub poll_spin: Duration,
    /// Also listen on an abstract Unix socket, which clients on the same
    /// host use instead of TCP (a shorter round trip).
    pub unix_socket: bool,
    /// This server's partition among the metadata servers, and the live
    /// storage servers it waits for before it calls itself ready.
    pub placement: Placement,
    /// Keep the namespace across restarts (`None`: volatile, the default).
    pub persistence: Option<Persistence>,
    /// Tier migration and placement settings, changed at runtime by
    /// `MetaRequest::Policy`; `move_rate` there also paces drains.
    pub tiering: crate::tier::TierSettings,
    /// Address of the admin HTTP endpoint (`/metrics`, `/status`,
    /// `/healthz`, `/readyz`, the dashboard); `None`: none.
    pub admin: Option<String>,
    /// Who may connect: the cluster token every connection (in and out)
    /// proves, and the local users of the Unix socket. Default: no token,
    /// the server's own user.
    pub security: nodekernel_rpc::Security,
    /// How long a block location handed to a client may be used
    /// (`docs/security.md`, *Data-plane capabilities*); whole seconds, at
    /// least one.
    pub cap_lifetime: Duration,
}

/// Where and how a persistent metadata server keeps its operation log.
#[derive(Debug, Clone)]
pub struct Persistence {
    /// The server's own directory; the log lives in `journal/` inside it.
    pub dir: PathBuf,
    /// When log records reach stable storage (see `docs/persistence.md`).
    pub fsync: Fsync,
    /// A checkpoint is written once the log has grown by this many bytes
    /// since the last one (the log before it is then deleted).
    pub checkpoint_bytes: u64,
}

/// What one checkpoint wrote.
#[derive(Debug, Clone, Copy)]
pub struct CheckpointStats {
    pub nodes: u64,
    /// Bytes of encoded state.
    pub bytes: u64,
    /// The last log record it holds.
    pub covered: u64,
    /// Log records replayed onto the previous checkpoint to build it.
    pub replayed: u64,
    /// How long it took in all (in the background: requests never wait).
    pub took: Duration,
}

impl Default for MetaConfig {
    fn default() -> Self {
        MetaConfig {
            listen: "127.0.0.1:9060".into(),
            block_size: nodekernel_proto::DEFAULT_BLOCK_SIZE,
            lease_timeout: Duration::from_secs(30),
            dead_after: Duration::from_secs(10),
            retire_after: Duration::from_secs(60),
            claim_timeout: Duration::from_secs(1),
            classes: Vec::new(),
            poll_spin: nodekernel_rpc::default_spin(),
            unix_socket: true,
            placement: Placement::default(),
            persistence: None,
            tiering: crate::tier::TierSettings::default(),
            admin: None,
            security: Default::default(),
            cap_lifetime: Duration::from_secs(nodekernel_proto::cap::CAP_LIFETIME_SECS),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    /// The cause is part of the message (and not a `source()`), so a
    /// printed chain names the OS error once.
    #[error("cannot listen on {addr}: {error}")]
    Bind { addr: String, error: std::io::Error },
    #[error("invalid metadata server setting {key}: {reason}")]
    Config { key: &'static str, reason: String },
    #[error(transparent)]
    Rpc(#[from] nodekernel_proto::Error),
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// The log lost records it held on stable storage
    /// ([`JournalError::Lost`]; `dir` is the server's directory): the
    /// server does not start.
    #[error("{error}. Refusing to start with part of the namespace in {}: restore the log from a backup; or, to go on with the records that are left, remove {} (every change after record {ends} is lost); or move {} away to start an empty namespace", dir.display(), dir.join(crate::floor::FILE).display(), dir.display())]
    LogLost {
        error: Box<JournalError>,
        ends: u64,
        dir: PathBuf,
    },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Admin(#[from] nodekernel_admin::AdminError),
}
