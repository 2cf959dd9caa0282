//! The TOML configuration file.
//!
//! One file configures every role; each process reads the sections it needs.
//! Unknown keys are rejected (naming the key), and so are bad values.
//! Every key and its default is documented in the README's configuration
//! table; keep the two in sync.

use crate::size::ByteSize;
use nodekernel_client::ClientConfig;
use nodekernel_meta::{Fsync, MetaConfig, Persistence};
use nodekernel_store::{DataDirConfig, MediumKind, StoreConfig};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use nodekernel_client::{ClientSection, SecuritySection, DEFAULT_META};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The message includes the OS error, so it is not a `source` too
    /// (printing the chain would repeat it).
    #[error("cannot read config file {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("bad config file {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("bad config value {key}: {reason}")]
    Value { key: String, reason: String },
}

/// Where admin endpoints listen unless configured: loopback only, a free
/// port.
pub const DEFAULT_ADMIN: &str = "127.0.0.1:0";

/// An admin address setting: `None` when empty (turned off).
pub fn admin_addr(setting: &str) -> Option<String> {
    (!setting.is_empty()).then(|| setting.to_string())
}

fn bad(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Value {
        key: key.into(),
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Storage classes: names and prices (default: 0 dram $5/GiB, 1 file
    /// $0.63/GiB, the seed paper's price table).
    pub class: Vec<ClassSection>,
    pub meta: MetaSection,
    pub client: ClientSection,
    /// Storage servers started by `nk store` (and by `nk up` instead of its
    /// default DRAM + file pair when the list is not empty).
    pub store: Vec<StoreSection>,
    pub up: UpSection,
    /// The cluster token and who may use the local sockets
    /// (`docs/security.md`).
    pub security: SecuritySection,
    /// `security` with its files read: once, at the first use, so every
    /// server of one start gets the same token and nothing is read twice.
    #[serde(skip)]
    loaded_security: std::sync::OnceLock<nodekernel_rpc::Security>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassSection {
    pub id: u8,
    pub name: String,
    #[serde(default)]
    pub price_per_gib: f64,
    /// This class's migration watermarks in percent (default: the
    /// `meta` ones).
    #[serde(default)]
    pub high_watermark: Option<u8>,
    #[serde(default)]
    pub low_watermark: Option<u8>,
    /// Clients encrypt node data before it goes to this class
    /// (`docs/encryption.md`).
    #[serde(default)]
    pub encrypt: bool,
}

/// The seed paper's price table: DRAM $5/GB, NAND flash $0.63/GB.
pub fn default_classes() -> Vec<ClassSection> {
    vec![
        ClassSection {
            id: 0,
            name: "dram".into(),
            price_per_gib: 5.0,
            high_watermark: None,
            low_watermark: None,
            encrypt: false,
        },
        ClassSection {
            id: 1,
            name: "file".into(),
            price_per_gib: 0.63,
            high_watermark: None,
            low_watermark: None,
            encrypt: false,
        },
    ]
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetaSection {
    pub listen: String,
    pub block_size: ByteSize,
    pub lease_timeout_ms: u64,
    pub dead_after_ms: u64,
    /// A storage server dead this long is retired (its blocks are lost for
    /// good; it leaves status and capacity).
    pub retire_after_ms: u64,
    /// How long a reply waits for the block claims of its effects before
    /// they are retried in the background.
    pub claim_timeout_ms: u64,
    /// How long a block location handed to a client may be used before the
    /// client asks again (`docs/security.md`).
    pub cap_lifetime_ms: u64,
    /// Busy-poll budget of idle connections (default: `NK_POLL_SPIN_US` or 50).
    pub poll_spin_us: Option<u64>,
    /// Also serve clients on this host over an abstract Unix socket.
    pub unix_socket: bool,
    /// This metadata server's partition (`0..partitions`); it refuses
    /// paths whose top-level name another partition owns.
    pub partition: u32,
    /// Number of metadata partitions (the length of `client.meta`).
    pub partitions: u32,
    /// Live storage servers needed before `nk status --wait` reports the
    /// cluster ready (default 1; `nk up`: the number of stores it starts).
    pub expect_servers: Option<u32>,
    /// Keep the namespace across restarts: an operation log in `data_dir`
    /// (`docs/persistence.md`).
    pub persistence: bool,
    /// The metadata server's own directory (`nk meta --data-dir`; an
    /// embedded cluster: `meta` in its data directory).
    pub data_dir: Option<PathBuf>,
    /// When log records reach stable storage: `always` (before the reply),
    /// `interval` (every `fsync_interval_ms`), or `never` (the kernel's
    /// write-back).
    pub fsync: FsyncMode,
    pub fsync_interval_ms: u64,
    /// A checkpoint is written once the log has grown this much since the
    /// last one; the log before it is then deleted.
    pub checkpoint_after: ByteSize,
    /// Bytes per second that block moves (`nk drain`, tier migration)
    /// may copy between storage servers together, so foreground I/O keeps
    /// most of the bandwidth (0: no limit).
    pub move_rate: ByteSize,
    /// Tier migration (`docs/tiering.md`): a class above `high_watermark`
    /// percent full sheds its coldest blocks to the next class until it is
    /// at `low_watermark`.
    pub migration: bool,
    pub high_watermark: u8,
    pub low_watermark: u8,
    /// Move blocks read often on a slower class up when there is room.
    pub promotion: bool,
    /// Accesses (halving every `heat_half_life_ms`) that make a block hot
    /// enough to promote.
    pub promote_after: u32,
    pub heat_half_life_ms: u64,
    /// Within a class: `local-first` (the client's location first) or
    /// `round-robin`.
    pub placement: String,
    /// Address of the admin HTTP endpoint (`/metrics`, `/status`,
    /// `/healthz`, `/readyz`, the dashboard at `/`); `""` turns it off.
    pub admin: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsyncMode {
    Always,
    Interval,
    Never,
}

impl Default for MetaSection {
    fn default() -> Self {
        MetaSection {
            listen: DEFAULT_META.into(),
            block_size: ByteSize(nodekernel_proto::DEFAULT_BLOCK_SIZE as u64),
            lease_timeout_ms: 30_000,
            dead_after_ms: 10_000,
            retire_after_ms: 60_000,
            claim_timeout_ms: 1_000,
            cap_lifetime_ms: nodekernel_proto::cap::CAP_LIFETIME_SECS * 1000,
            poll_spin_us: None,
            unix_socket: true,
            partition: 0,
            partitions: 1,
            expect_servers: None,
            persistence: false,
            data_dir: None,
            fsync: FsyncMode::Always,
            fsync_interval_ms: 100,
            move_rate: ByteSize(256 << 20),
            checkpoint_after: ByteSize(64 << 20),
            migration: true,
            high_watermark: 90,
            low_watermark: 75,
            promotion: false,
            promote_after: 8,
            heat_half_life_ms: 60_000,
            placement: "local-first".into(),
            admin: DEFAULT_ADMIN.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Medium {
    Dram,
    File,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSection {
    pub class: u8,
    pub class_name: String,
    pub medium: Medium,
    pub size: ByteSize,
    /// The server's data directory (`LOCK`, `identity`, block file). Under
    /// `nk up`: relative to `up.data_dir`, default `store-<i>` there. Under
    /// `nk store`: none by default (a file store without `path` gets a
    /// fresh private one).
    pub data_dir: Option<PathBuf>,
    /// Block file of a `file` store (default `blocks`; relative paths are
    /// under the data directory).
    pub path: Option<PathBuf>,
    pub listen: String,
    /// Address registered with the metadata server (default: the bound address).
    pub advertise: Option<String>,
    /// Empty: the host name.
    pub location: String,
    pub heartbeat_ms: u64,
    /// DRAM stores: hand the memory to co-located clients.
    pub shared_memory: bool,
    /// Busy-poll budget of idle connections.
    pub poll_spin_us: Option<u64>,
    /// Keep the blocks across a restart of the server (needs a data
    /// directory; `docs/persistence.md`). Default: `meta.persistence` under
    /// `nk up`, `false` for `nk store`.
    pub persistent: Option<bool>,
    /// Address of the server's admin HTTP endpoint; `""` turns it off.
    pub admin: String,
    /// DRAM only: follow the host's available memory, exporting between
    /// `min_size` and `size` and leaving `reserve` free to the host
    /// (dynamic capacity, `docs/tiering.md`).
    pub dynamic: bool,
    pub min_size: ByteSize,
    pub reserve: ByteSize,
}

impl Default for StoreSection {
    fn default() -> Self {
        StoreSection {
            class: 0,
            class_name: "dram".into(),
            medium: Medium::Dram,
            size: ByteSize(512 << 20),
            data_dir: None,
            path: None,
            listen: "127.0.0.1:0".into(),
            advertise: None,
            location: String::new(),
            heartbeat_ms: 1_000,
            shared_memory: true,
            poll_spin_us: None,
            persistent: None,
            admin: DEFAULT_ADMIN.into(),
            dynamic: false,
            min_size: ByteSize(0),
            reserve: ByteSize(1 << 30),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpSection {
    /// `nk up`'s data directory (`LOCK`, and `store-<i>` per storage
    /// server). `None`: a fresh private directory, removed at shutdown.
    pub data_dir: Option<PathBuf>,
    pub dram: ByteSize,
    pub file: ByteSize,
    /// Tell clients of this user on this host which file holds the
    /// cluster's token (`nk up` sets it; not a key of the file):
    /// [`nodekernel_client::settings::publish_token`], before the metadata
    /// server listens, so every client that can connect finds it.
    #[serde(skip)]
    pub publish_token: bool,
}

impl Default for UpSection {
    fn default() -> Self {
        UpSection {
            data_dir: None,
            dram: ByteSize(512 << 20),
            file: ByteSize(2 << 30),
            publish_token: false,
        }
    }
}

impl Config {
    /// Parses TOML text; `origin` names the source in errors.
    pub fn parse(text: &str, origin: &Path) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_path_buf(),
            message: e.to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        Config::parse(&text, path)
    }

    /// Checks values that the types alone do not.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.tiering()?;
        self.security()?;
        for (i, c) in self.class.iter().enumerate() {
            if c.id == nodekernel_proto::NO_CLASS {
                return Err(bad(
                    format!("class[{i}].id"),
                    "255 is reserved; use 0..=254",
                ));
            }
            if self.class[..i].iter().any(|o| o.id == c.id) {
                return Err(bad(
                    format!("class[{i}].id"),
                    format!("class {} is defined twice", c.id),
                ));
            }
            if !(c.price_per_gib.is_finite() && c.price_per_gib >= 0.0) {
                return Err(bad(
                    format!("class[{i}].price_per_gib"),
                    "must be a number >= 0",
                ));
            }
        }
        let bs = self.meta.block_size.0;
        let max = nodekernel_proto::MAX_BLOCK_SIZE as u64;
        if !bs.is_power_of_two() || !(4096..=max).contains(&bs) {
            return Err(bad(
                "meta.block_size",
                format!(
                    "{bs} must be a power of two between 4KiB and {}MiB",
                    max >> 20
                ),
            ));
        }
        if self.meta.lease_timeout_ms == 0 {
            return Err(bad("meta.lease_timeout_ms", "must be greater than 0"));
        }
        if self.meta.dead_after_ms == 0 {
            return Err(bad("meta.dead_after_ms", "must be greater than 0"));
        }
        if self.meta.retire_after_ms < self.meta.dead_after_ms {
            return Err(bad(
                "meta.retire_after_ms",
                format!(
                    "must be at least meta.dead_after_ms ({})",
                    self.meta.dead_after_ms
                ),
            ));
        }
        if self.meta.claim_timeout_ms == 0 {
            return Err(bad("meta.claim_timeout_ms", "must be greater than 0"));
        }
        if self.meta.cap_lifetime_ms < 1000 {
            return Err(bad("meta.cap_lifetime_ms", "must be at least 1000"));
        }
        if self.meta.partitions == 0 || self.meta.partition >= self.meta.partitions {
            return Err(bad(
                "meta.partition",
                format!(
                    "{} is not below meta.partitions ({})",
                    self.meta.partition, self.meta.partitions
                ),
            ));
        }
        if self.client.meta.is_empty() {
            return Err(bad(
                "client.meta",
                "needs at least one metadata server address",
            ));
        }
        if self.client.timeout_ms == 0 {
            return Err(bad("client.timeout_ms", "must be greater than 0"));
        }
        if self.client.transfers_in_flight == 0 {
            return Err(bad("client.transfers_in_flight", "must be at least 1"));
        }
        for (i, s) in self.store.iter().enumerate() {
            let key = |k: &str| format!("store[{i}].{k}");
            if s.class == nodekernel_proto::NO_CLASS {
                return Err(bad(key("class"), "255 is reserved; use 0..=254"));
            }
            if s.size.0 < bs {
                return Err(bad(
                    key("size"),
                    format!(
                        "{} is smaller than one block ({})",
                        s.size, self.meta.block_size
                    ),
                ));
            }
            if s.dynamic && s.medium != Medium::Dram {
                return Err(bad(
                    key("dynamic"),
                    "only a DRAM store follows the host's memory",
                ));
            }
            if s.dynamic && s.min_size.0 > s.size.0 {
                return Err(bad(
                    key("min_size"),
                    format!("{} is larger than size ({})", s.min_size, s.size),
                ));
            }
            for (k, p) in [("data_dir", &s.data_dir), ("path", &s.path)] {
                if p.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                    return Err(bad(key(k), "must not be empty"));
                }
            }
            if s.heartbeat_ms == 0 || s.heartbeat_ms >= self.meta.dead_after_ms {
                return Err(bad(
                    key("heartbeat_ms"),
                    format!(
                        "must be greater than 0 and below meta.dead_after_ms ({})",
                        self.meta.dead_after_ms
                    ),
                ));
            }
        }
        for (key, dir) in [
            ("up.data_dir", &self.up.data_dir),
            ("meta.data_dir", &self.meta.data_dir),
        ] {
            if dir.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(bad(key, "must not be empty"));
            }
        }
        if self.meta.checkpoint_after.0 < 4096 {
            return Err(bad("meta.checkpoint_after", "must be at least 4KiB"));
        }
        if self.meta.fsync == FsyncMode::Interval && self.meta.fsync_interval_ms == 0 {
            return Err(bad(
                "meta.fsync_interval_ms",
                "must be greater than 0 with meta.fsync = \"interval\"",
            ));
        }
        for (key, size) in [("up.dram", self.up.dram), ("up.file", self.up.file)] {
            if size.0 != 0 && size.0 < bs {
                return Err(bad(
                    key,
                    format!("{size} is smaller than one block (use 0 to disable)"),
                ));
            }
        }
        Ok(())
    }

    /// Who the servers let in: the token files are read at the first call
    /// (by [`Config::validate`]), later calls get the same.
    pub fn security(&self) -> Result<nodekernel_rpc::Security, ConfigError> {
        if let Some(s) = self.loaded_security.get() {
            return Ok(s.clone());
        }
        let s = self
            .security
            .load()
            .map_err(|e| bad("security", e.message))?;
        Ok(self.loaded_security.get_or_init(|| s).clone())
    }

    /// Whether the servers of this configuration have a cluster token
    /// (`[security]` or `NK_TOKEN_FILE`).
    pub fn has_token(&self) -> Result<bool, ConfigError> {
        Ok(self.security()?.token.is_some())
    }

    /// The check `nk meta` and `nk store` make before they start: a
    /// cluster token, unless `security.insecure` says explicitly to run
    /// without one.
    pub fn require_token(&self) -> Result<(), ConfigError> {
        if self.security.insecure || self.has_token()? {
            return Ok(());
        }
        Err(bad(
            "security",
            "no cluster token: without one, every peer that can reach this server's ports is \
             trusted with all data (it could read, write, register storage servers or shrink \
             them). Make a token with `nk token new FILE` and give that file to every server \
             and client as [security] token_file (or NK_TOKEN_FILE); or, on a network where \
             every peer may be trusted, pass --insecure ([security] insecure = true)",
        ))
    }

    /// The file the servers' token comes from (`NK_TOKEN_FILE`, else
    /// `security.token_file`), if they have a token and it is in a file.
    pub fn token_file(&self) -> Option<PathBuf> {
        if !self.has_token().unwrap_or(false) {
            return None;
        }
        std::env::var_os("NK_TOKEN_FILE")
            .map(PathBuf::from)
            .or_else(|| self.security.token_file.clone())
    }

    /// Makes `file` the cluster token (`security.token_file`), read at
    /// the next use.
    pub fn use_token_file(&mut self, file: PathBuf) {
        self.security.token_file = Some(file);
        self.security.token = None;
        self.loaded_security = std::sync::OnceLock::new();
    }

    pub fn meta_config(&self) -> Result<MetaConfig, ConfigError> {
        Ok(MetaConfig {
            listen: self.meta.listen.clone(),
            block_size: self.meta.block_size.0 as u32,
            lease_timeout: Duration::from_millis(self.meta.lease_timeout_ms),
            dead_after: Duration::from_millis(self.meta.dead_after_ms),
            retire_after: Duration::from_millis(self.meta.retire_after_ms),
            claim_timeout: Duration::from_millis(self.meta.claim_timeout_ms),
            cap_lifetime: Duration::from_millis(self.meta.cap_lifetime_ms),
            classes: self.classes(),
            poll_spin: spin(self.meta.poll_spin_us),
            unix_socket: self.meta.unix_socket,
            placement: nodekernel_meta::Placement {
                partition: self.meta.partition,
                partitions: self.meta.partitions,
                expected_servers: self.meta.expect_servers.unwrap_or(1),
            },
            persistence: self.meta_persistence(None),
            tiering: self
                .tiering()
                .expect("validate checks the tiering settings"),
            admin: admin_addr(&self.meta.admin),
            security: self.security()?,
        })
    }

    /// The tiering settings of `[meta]` and `[[class]]`, checked by the
    /// same rules as `nk policy set` (the error names the key).
    pub fn tiering(&self) -> Result<nodekernel_meta::tier::TierSettings, ConfigError> {
        let m = &self.meta;
        let onoff = |b: bool| if b { "on" } else { "off" }.to_string();
        let mut sets = vec![
            ("migration".to_string(), onoff(m.migration)),
            ("high_watermark".into(), m.high_watermark.to_string()),
            ("low_watermark".into(), m.low_watermark.to_string()),
            ("promotion".into(), onoff(m.promotion)),
            ("promote_after".into(), m.promote_after.to_string()),
            ("half_life_ms".into(), m.heat_half_life_ms.to_string()),
            ("move_rate".into(), m.move_rate.0.to_string()),
            ("placement".into(), m.placement.clone()),
        ];
        for c in &self.class {
            for (which, v) in [("high", c.high_watermark), ("low", c.low_watermark)] {
                if let Some(v) = v {
                    sets.push((format!("class.{}.{which}_watermark", c.id), v.to_string()));
                }
            }
        }
        let mut t = nodekernel_meta::tier::TierSettings::default();
        t.apply(&sets).map_err(|reason| {
            // The policy names its key; the config names the TOML one.
            let key = reason.split(':').next().unwrap_or_default();
            let toml_key = match key.strip_prefix("class.") {
                Some(rest) => {
                    let (id, field) = rest.split_once('.').unwrap_or((rest, ""));
                    let i = self.class.iter().position(|c| c.id.to_string() == id);
                    format!("class[{}].{field}", i.unwrap_or(0))
                }
                None if key == "half_life_ms" => "meta.heat_half_life_ms".into(),
                None => format!("meta.{key}"),
            };
            bad(toml_key, reason)
        })?;
        Ok(t)
    }

    /// The metadata server's persistence settings, if enabled: its
    /// directory is `meta.data_dir`, else `default_dir`; `None` when
    /// neither is set (see [`Config::check_meta_dir`]).
    pub fn meta_persistence(&self, default_dir: Option<&Path>) -> Option<Persistence> {
        if !self.meta.persistence {
            return None;
        }
        let dir = self.meta.data_dir.as_deref().or(default_dir)?;
        Some(Persistence {
            dir: dir.to_path_buf(),
            fsync: match self.meta.fsync {
                FsyncMode::Always => Fsync::Always,
                FsyncMode::Interval => {
                    Fsync::Interval(Duration::from_millis(self.meta.fsync_interval_ms))
                }
                FsyncMode::Never => Fsync::Never,
            },
            checkpoint_bytes: self.meta.checkpoint_after.0,
        })
    }

    /// For a metadata server started on its own: persistence needs a
    /// directory.
    pub fn check_meta_dir(&self) -> Result<(), ConfigError> {
        if self.meta.persistence && self.meta.data_dir.is_none() {
            return Err(bad(
                "meta.persistence",
                "needs a directory for the operation log: set meta.data_dir or pass --data-dir",
            ));
        }
        Ok(())
    }

    /// For `nk up`: a persistent cluster needs a data directory that is
    /// kept (a private one is removed at shutdown).
    pub fn check_up_dir(&self) -> Result<(), ConfigError> {
        if self.up.data_dir.is_some() {
            return Ok(());
        }
        let key = if self.meta.persistence {
            "meta.persistence".to_string()
        } else {
            match self
                .up_stores()
                .iter()
                .position(|s| self.store_persistent(s, true))
            {
                Some(i) => format!("store[{i}].persistent"),
                None => return Ok(()),
            }
        };
        Err(bad(
            key,
            "a persistent `nk up` needs a data directory that outlives it: set up.data_dir or pass --data-dir",
        ))
    }

    /// Whether a store keeps its blocks across restarts: its `persistent`
    /// key, else `meta.persistence` under `nk up` (so a persistent `nk up`
    /// keeps everything), else no.
    pub fn store_persistent(&self, s: &StoreSection, under_up: bool) -> bool {
        s.persistent.unwrap_or(under_up && self.meta.persistence)
    }

    /// The configured classes, or the default price table.
    pub fn classes(&self) -> Vec<nodekernel_proto::ClassInfo> {
        let list = if self.class.is_empty() {
            default_classes()
        } else {
            self.class.clone()
        };
        list.into_iter()
            .map(|c| nodekernel_proto::ClassInfo {
                class: c.id,
                name: c.name,
                price_per_gib: c.price_per_gib,
                encrypt: c.encrypt,
            })
            .collect()
    }

    /// The `[client]` settings (without the token: a running cluster's
    /// [`crate::LocalCluster::client_config`] has it).
    pub fn client_config(&self) -> ClientConfig {
        self.client.to_config()
    }

    /// The storage servers `nk up` starts: the `[[store]]` list, or a DRAM
    /// store of `up.dram` plus a file store of `up.file`.
    pub fn up_stores(&self) -> Vec<StoreSection> {
        if !self.store.is_empty() {
            return self.store.clone();
        }
        let mut v = Vec::new();
        if self.up.dram.0 > 0 {
            v.push(StoreSection {
                size: self.up.dram,
                ..StoreSection::default()
            });
        }
        if self.up.file.0 > 0 {
            v.push(StoreSection {
                class: 1,
                class_name: "file".into(),
                medium: Medium::File,
                size: self.up.file,
                ..StoreSection::default()
            });
        }
        v
    }

    /// Turns a store section into the storage server's settings, for
    /// `nk store`: the data directory is `data_dir` as given (relative to
    /// the current directory); without one, a file store without `path`
    /// gets a fresh private directory (removed when it stops) and any other
    /// store has none. The block file is `path`, default `blocks`, relative
    /// to the data directory.
    pub fn store_config(
        &self,
        i: usize,
        s: &StoreSection,
        metas: Vec<String>,
    ) -> Result<StoreConfig, ConfigError> {
        self.make_store_config(i, s, metas, None)
    }

    /// [`store_config`](Self::store_config) for a storage server of
    /// `nk up` whose data directory is `up_dir`: the server's data
    /// directory is `data_dir` (relative to `up_dir`), default
    /// `up_dir/store-<i>`.
    pub fn store_config_under(
        &self,
        i: usize,
        s: &StoreSection,
        metas: Vec<String>,
        up_dir: &Path,
    ) -> Result<StoreConfig, ConfigError> {
        self.make_store_config(i, s, metas, Some(up_dir))
    }

    fn make_store_config(
        &self,
        i: usize,
        s: &StoreSection,
        metas: Vec<String>,
        up_dir: Option<&Path>,
    ) -> Result<StoreConfig, ConfigError> {
        let data_dir = match (&s.data_dir, up_dir) {
            (Some(d), Some(up)) => DataDirConfig::At(up.join(d)),
            (Some(d), None) => DataDirConfig::At(d.clone()),
            (None, Some(up)) => DataDirConfig::At(up.join(format!("store-{i}"))),
            (None, None) if s.medium == Medium::File && s.path.is_none() => DataDirConfig::Private,
            (None, None) => DataDirConfig::None,
        };
        let medium = match s.medium {
            Medium::Dram => MediumKind::Dram,
            Medium::File => MediumKind::File {
                path: s
                    .path
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(nodekernel_store::datadir::BLOCK_FILE)),
            },
        };
        let location = if s.location.is_empty() {
            nodekernel_client::default_location()
        } else {
            s.location.clone()
        };
        Ok(StoreConfig {
            listen: s.listen.clone(),
            advertise: s.advertise.clone(),
            metas,
            class: s.class,
            class_name: s.class_name.clone(),
            medium,
            data_dir,
            capacity: s.size.0,
            block_size: self.meta.block_size.0 as u32,
            location,
            heartbeat_interval: Duration::from_millis(s.heartbeat_ms),
            rpc_timeout: Duration::from_millis(self.client.timeout_ms),
            shared_memory: s.shared_memory,
            poll_spin: spin(s.poll_spin_us),
            persistent: self.store_persistent(s, up_dir.is_some()),
            admin: admin_addr(&s.admin),
            security: self.security()?,
            dynamic: s
                .dynamic
                .then(|| nodekernel_store::capacity::DynamicCapacity {
                    min: s.min_size.0,
                    source: std::sync::Arc::new(nodekernel_store::capacity::HostMemory {
                        reserve: s.reserve.0,
                    }),
                }),
        })
    }
}

/// A configured busy-poll budget, or the process default.
fn spin(us: Option<u64>) -> Duration {
    us.map(Duration::from_micros)
        .unwrap_or_else(nodekernel_rpc::default_spin)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Config, ConfigError> {
        Config::parse(s, Path::new("test.toml"))
    }

    /// `nk policy set move_rate X` and `move_rate = "X"` in the config
    /// take the same sizes and mean the same rate.
    #[test]
    fn the_config_and_policy_set_take_the_same_sizes() {
        for size in ["4096", "64KiB", "64MiB", "1.5GiB", "10MB", "0"] {
            let c = parse(&format!("[meta]\nmove_rate = \"{size}\"\n")).unwrap();
            let mut set = nodekernel_meta::tier::TierSettings::default();
            set.set("move_rate", size).unwrap();
            assert_eq!(c.tiering().unwrap().move_rate, set.move_rate, "{size}");
        }
        assert!(parse("[meta]\nmove_rate = \"fast\"\n").is_err());
        let mut set = nodekernel_meta::tier::TierSettings::default();
        assert!(set.set("move_rate", "fast").is_err());
    }

    #[test]
    fn defaults_and_full_file() {
        let c = parse("").unwrap();
        assert_eq!(c.meta.block_size.0, 1 << 20);
        assert_eq!(c.up_stores().len(), 2);
        assert!(c.client.shared_memory && c.client_config().shared_memory);
        assert!(c.up_stores().iter().all(|s| s.shared_memory));
        let c = parse(
            r#"
            [meta]
            listen = "0.0.0.0:7000"
            block_size = "64KiB"
            poll_spin_us = 7
            unix_socket = false
            [client]
            meta = ["a:1", "b:2"]
            shared_memory = false
            unix_socket = false
            poll_spin_us = 0
            [[store]]
            shared_memory = false
            poll_spin_us = 3
            class = 1
            class_name = "nvme"
            medium = "file"
            size = "1GiB"
            path = "/tmp/x"
            [up]
            dram = "1GiB"
            "#,
        )
        .unwrap();
        assert_eq!(c.meta.block_size.0, 64 << 10);
        assert_eq!(c.client.meta.len(), 2);
        assert!(!c.client_config().shared_memory);
        assert!(!c.client_config().unix_sockets);
        assert_eq!(c.client_config().poll_spin, Duration::ZERO);
        assert!(!c.meta_config().unwrap().unix_socket);
        assert_eq!(c.meta_config().unwrap().poll_spin, Duration::from_micros(7));
        let sc = c.store_config(0, &c.store[0], vec![]).unwrap();
        assert!(!sc.shared_memory);
        assert_eq!(sc.poll_spin, Duration::from_micros(3));
        assert_eq!(c.store[0].medium, Medium::File);
        assert_eq!(
            c.up_stores().len(),
            1,
            "[[store]] replaces the default pair"
        );
    }

    /// Unconfigured, a caller waits for its reply with the call budget
    /// (a reply can include a server's own round trip) and servers poll
    /// idle connections with the shorter one.
    #[test]
    fn default_spin_budgets() {
        let c = parse("").unwrap();
        assert_eq!(
            c.client_config().poll_spin,
            nodekernel_rpc::default_call_spin()
        );
        assert_eq!(
            c.meta_config().unwrap().poll_spin,
            nodekernel_rpc::default_spin()
        );
        if std::env::var_os("NK_POLL_SPIN_US").is_none() {
            assert_eq!(
                nodekernel_rpc::default_call_spin(),
                Duration::from_micros(100)
            );
            assert_eq!(nodekernel_rpc::default_spin(), Duration::from_micros(50));
        }
    }

    #[test]
    fn data_directories() {
        let file = |path: &str| match path {
            "" => "[[store]]\nmedium = \"file\"\n".to_string(),
            p => format!("[[store]]\nmedium = \"file\"\npath = \"{p}\"\n"),
        };
        let c = parse("").unwrap();
        assert_eq!(c.up.data_dir, None, "nk up: a fresh private directory");
        let up = Path::new("/up");
        let stores = c.up_stores();
        let sc: Vec<StoreConfig> = stores
            .iter()
            .enumerate()
            .map(|(i, s)| c.store_config_under(i, s, vec![], up).unwrap())
            .collect();
        assert_eq!(sc[0].data_dir, DataDirConfig::At(up.join("store-0")));
        assert_eq!(sc[1].data_dir, DataDirConfig::At(up.join("store-1")));
        assert_eq!(
            sc[1].medium,
            MediumKind::File {
                path: PathBuf::from("blocks")
            },
            "the block file is `blocks` in the store's data directory"
        );

        // nk store: a file store without path or data_dir gets a private
        // directory; with a path, none; a DRAM store, none.
        let c = parse(&file("")).unwrap();
        let sc = c.store_config(0, &c.store[0], vec![]).unwrap();
        assert_eq!(sc.data_dir, DataDirConfig::Private);
        let c = parse(&file("/x/b")).unwrap();
        let sc = c.store_config(0, &c.store[0], vec![]).unwrap();
        assert_eq!(sc.data_dir, DataDirConfig::None);
        let c = parse("[[store]]\n").unwrap();
        let sc = c.store_config(0, &c.store[0], vec![]).unwrap();
        assert_eq!(sc.data_dir, DataDirConfig::None);

        let c = parse("[up]\ndata_dir = \"/d\"\n[[store]]\ndata_dir = \"mine\"\n").unwrap();
        assert_eq!(c.up.data_dir, Some(PathBuf::from("/d")));
        let sc = c.store_config(0, &c.store[0], vec![]).unwrap();
        assert_eq!(sc.data_dir, DataDirConfig::At("mine".into()));
        let sc = c
            .store_config_under(0, &c.store[0], vec![], Path::new("/d"))
            .unwrap();
        assert_eq!(sc.data_dir, DataDirConfig::At("/d/mine".into()));

        for (text, key) in [
            ("[up]\ndata_dir = \"\"\n", "up.data_dir"),
            ("[[store]]\ndata_dir = \"\"\n", "store[0].data_dir"),
            ("[[store]]\npath = \"\"\n", "store[0].path"),
            ("[[store]]\ndata_dirs = \"x\"\n", "data_dirs"),
        ] {
            let e = parse(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text:?}: {e}");
        }
    }

    #[test]
    fn a_persistent_up_keeps_every_store_and_needs_a_kept_directory() {
        let c = parse("[meta]\npersistence = true\n").unwrap();
        let up = Path::new("/d");
        for (i, s) in c.up_stores().iter().enumerate() {
            let sc = c.store_config_under(i, s, vec![], up).unwrap();
            assert!(sc.persistent, "nk up store {i} follows meta.persistence");
        }
        let e = c.check_up_dir().unwrap_err().to_string();
        assert!(
            e.contains("meta.persistence") && e.contains("up.data_dir"),
            "{e}"
        );
        let c = parse("[meta]\npersistence = true\n[up]\ndata_dir = \"/d\"\n").unwrap();
        c.check_up_dir().unwrap();

        // A store may opt out, or in on its own.
        let c = parse("[meta]\npersistence = true\n[[store]]\npersistent = false\n").unwrap();
        let sc = c.store_config_under(0, &c.store[0], vec![], up).unwrap();
        assert!(!sc.persistent);
        let c = parse("[[store]]\npersistent = true\ndata_dir = \"/s\"\n").unwrap();
        let sc = c.store_config(0, &c.store[0], vec![]).unwrap();
        assert!(sc.persistent, "nk store with persistent = true");
        let e = c.check_up_dir().unwrap_err().to_string();
        assert!(
            e.contains("store[0].persistent"),
            "a persistent store under nk up needs up.data_dir too: {e}"
        );
        // A volatile cluster: nothing persistent, no directory needed.
        let c = parse("").unwrap();
        c.check_up_dir().unwrap();
        let sc = c
            .store_config_under(0, &c.up_stores()[0], vec![], up)
            .unwrap();
        assert!(!sc.persistent);
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let e = parse("[meta]\nblok_size = 4096\n").unwrap_err().to_string();
        assert!(e.contains("blok_size"), "{e}");
        let e = parse("[nope]\n").unwrap_err().to_string();
        assert!(e.contains("nope"), "{e}");
        let e = parse("[meta]\nblock_size = \"3MiB\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("meta.block_size"), "{e}");
        let e = parse("[meta]\nblock_size = \"1XB\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("block_size") && e.contains("unknown unit"),
            "{e}"
        );
        let e = parse("[[store]]\nmedium = \"tape\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("medium") && e.contains("tape"), "{e}");
        let e = parse("[[store]]\nsize = \"1KiB\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("store[0].size"), "{e}");
        let e = parse("[client]\nshared_memory = \"yes\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("shared_memory"), "{e}");
        let e = parse("[client]\nmeta = []\n").unwrap_err().to_string();
        assert!(e.contains("client.meta"), "{e}");
        let e = parse("[[class]]\nid = 0\nname = \"a\"\n[[class]]\nid = 0\nname = \"b\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("class[1].id"), "{e}");
        let e = parse("[[class]]\nid = 1\nname = \"a\"\nprice_per_gib = -1\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("class[0].price_per_gib"), "{e}");
        let c = parse("[[class]]\nid = 2\nname = \"disk\"\nprice_per_gib = 0.02\n").unwrap();
        assert_eq!(c.classes()[0].name, "disk");
        assert_eq!(parse("").unwrap().classes()[1].price_per_gib, 0.63);
    }
}
