//! NodeKernel configuration and the embedded one-process cluster.
//!
//! [`Config`] is the TOML file every `nk` role reads. [`LocalCluster`]
//! starts a metadata server and storage servers inside the current tokio
//! runtime: `nk up` uses it, and so do the integration tests (every server
//! binds port 0 unless told otherwise).

pub mod config;
pub mod size;

pub use config::{Config, ConfigError, Medium, StoreSection, DEFAULT_ADMIN, DEFAULT_META};
pub use size::{human, ByteSize};

use nodekernel_client::settings::PublishedToken;
use nodekernel_client::{Client, ClientConfig};
use nodekernel_meta::{ClaimFuture, LocalStore, MetaError, MetaServer};
use nodekernel_store::{DirLock, StorageServer, StoreError};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// Why a cluster could not start.
///
/// Every message includes its cause's message, so causes are deliberately
/// not exposed as [`source`](std::error::Error::source)s: printing the
/// chain (as `anyhow`'s `{:#}` does) would repeat them.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The cluster's data directory (`up.data_dir`) is unusable or locked.
    #[error("{0}")]
    DataDir(StoreError),
    #[error("metadata server: {0}")]
    Meta(MetaError),
    #[error("storage server {index} ({class_name}): {error}")]
    Store {
        index: usize,
        class_name: String,
        error: StoreError,
    },
    /// A tenant's root could not be made (`[[security.tenant]]`).
    #[error("tenant {tenant}'s root {root}: {error}")]
    TenantRoot {
        tenant: String,
        root: String,
        error: nodekernel_client::Error,
    },
}

impl From<MetaError> for ClusterError {
    fn from(e: MetaError) -> ClusterError {
        ClusterError::Meta(e)
    }
}

/// The name of the cluster token a cluster makes for itself in its data
/// directory when none is configured (secure by default,
/// `docs/security.md`).
pub const TOKEN_FILE: &str = "token";

/// The token file in data directory `dir`, made (32 random bytes, mode
/// 0600) if it does not exist yet (and removed again if this start
/// fails): a kept data directory keeps its token across restarts.
fn own_token(dir: &DirLock) -> Result<std::path::PathBuf, ClusterError> {
    let file = dir.path().join(TOKEN_FILE);
    match nodekernel_client::settings::write_new_secret(&file) {
        Ok(()) => {
            dir.note_created(file.clone());
            Ok(file)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(file),
        Err(e) => Err(ClusterError::Config(ConfigError::Value {
            key: "security".into(),
            reason: format!("cannot create the cluster token {}: {e}", file.display()),
        })),
    }
}

/// `listen` as an address with a fixed port (not 0, which the system picks
/// at bind), if it is one.
pub fn fixed_addr(listen: &str) -> Option<SocketAddr> {
    listen.parse::<SocketAddr>().ok().filter(|a| a.port() != 0)
}

/// Tells clients of this user on this host that the cluster at `addr`
/// takes the token in `config`'s token file, if it has one; a failure only
/// costs those clients a setting, so it is a warning.
pub fn publish(config: &Config, addr: SocketAddr) -> Option<PublishedToken> {
    let file = config.token_file()?;
    match nodekernel_client::settings::publish_token(addr, &file) {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(
                "cannot tell local clients where the cluster token is ({e}); give them \
                 NK_TOKEN_FILE={}",
                file.display()
            );
            None
        }
    }
}

/// A metadata server and its storage servers running in this process.
pub struct LocalCluster {
    pub config: Config,
    pub meta: MetaServer,
    pub stores: Vec<StorageServer>,
    /// The cluster token its servers prove and require, and their TLS
    /// (`[security]`).
    security: nodekernel_rpc::Security,
    /// The section each of `stores` was started from.
    sections: Vec<StoreSection>,
    /// Where clients of this user on this host find the token
    /// (`up.publish_token`); withdrawn when the cluster is dropped.
    _published: Vec<PublishedToken>,
    /// The locked data directory (`up.data_dir` or a fresh private one).
    /// Declared last: it is released after the stores.
    dir: DirLock,
}

/// A storage server of this process as its metadata server's
/// [`LocalStore`].
struct InProcess(nodekernel_store::LocalClaims);

impl LocalStore for InProcess {
    fn claim<'a>(&'a self, claims: &'a [nodekernel_proto::store::Claim]) -> ClaimFuture<'a> {
        Box::pin(self.0.claim(claims))
    }
}

impl LocalCluster {
    /// Locks the data directory (`up.data_dir`, or a fresh private one that
    /// is removed at shutdown), starts the metadata server on
    /// `config.meta.listen`, then every store of [`Config::up_stores`]
    /// (each in `store-<i>` of the data directory unless its `data_dir`
    /// says otherwise), registered with it.
    ///
    /// If anything fails, what this start created is removed again: the
    /// stores already started are discarded
    /// ([`StorageServer::discard`]), and the data directory's `LOCK` (and
    /// the directory, if it did not exist) go.
    pub async fn start(mut config: Config) -> Result<LocalCluster, ClusterError> {
        config.validate()?;
        config.check_up_dir()?;
        let dir = match &config.up.data_dir {
            Some(d) => DirLock::acquire(d),
            None => DirLock::private("up"),
        }
        .map_err(ClusterError::DataDir)?;
        // On failure from here on, `dir` drops unstarted and undoes itself.
        if !config.security.insecure && !config.has_token()? {
            config.use_token_file(own_token(&dir)?);
            config.validate()?;
        }
        // Before the metadata server listens (at a fixed address), so that
        // a client that can connect also finds the token.
        let mut published = Vec::new();
        if config.up.publish_token {
            if let Some(addr) = fixed_addr(&config.meta.listen) {
                published.extend(publish(&config, addr));
            }
        }
        let mut meta_cfg = config.meta_config()?;
        meta_cfg.persistence = config.meta_persistence(Some(&dir.path().join("meta")));
        if config.meta.expect_servers.is_none() {
            meta_cfg.placement.expected_servers = config.up_stores().len() as u32;
        }
        let security = meta_cfg.security.clone();
        let meta = MetaServer::start(meta_cfg).await?;
        if config.up.publish_token && published.is_empty() {
            published.extend(publish(&config, meta.local_addr()));
        }
        let mut cluster = LocalCluster {
            config,
            meta,
            security,
            stores: Vec::new(),
            sections: Vec::new(),
            _published: published,
            dir,
        };
        for s in cluster.config.up_stores() {
            if let Err(e) = cluster.add_store(&s).await {
                for started in cluster.stores.drain(..) {
                    started.discard();
                }
                return Err(e);
            }
        }
        cluster.make_tenant_roots().await?;
        cluster.dir.started();
        Ok(cluster)
    }

    /// Makes each tenant's root directory (and its parents) where it is
    /// missing, so a tenant's `/` exists from the start
    /// (`docs/security.md`, *Tenants*).
    async fn make_tenant_roots(&self) -> Result<(), ClusterError> {
        if self.security.tenants.is_empty() {
            return Ok(());
        }
        let failed = |t: &nodekernel_proto::tenant::Tenant, error| ClusterError::TenantRoot {
            tenant: t.name.clone(),
            root: t.root.clone(),
            error,
        };
        let first = &self.security.tenants[0];
        let c = self.client().await.map_err(|e| failed(first, e))?;
        for t in self.security.tenants.iter() {
            match c.lookup(&t.root).await {
                Ok(_) => continue,
                Err(e) if e.code == nodekernel_client::ErrorCode::NotFound => {}
                Err(e) => return Err(failed(t, e)),
            }
            c.mkdir(&t.root, true).await.map_err(|e| failed(t, e))?;
        }
        Ok(())
    }

    /// Starts one more storage server and registers it. Its data directory
    /// is `store-<i>` in the cluster's (`i` its index in
    /// [`stores`](Self::stores)), unless the section names one.
    pub async fn add_store(&mut self, s: &StoreSection) -> Result<&StorageServer, ClusterError> {
        let index = self.stores.len();
        let store = self.start_store(index, s).await?;
        self.stores.push(store);
        self.sections.push(s.clone());
        Ok(&self.stores[index])
    }

    /// Stops storage server `index` and starts it again from the same
    /// settings and data directory: a persistent server comes back with
    /// its blocks (and, when it listens on port 0, at its old address if
    /// that is still free). On failure the server is left out of
    /// [`stores`](Self::stores), which then lists the others.
    ///
    /// # Panics
    /// If `index` is not that of a running store.
    pub async fn restart_store(&mut self, index: usize) -> Result<&StorageServer, ClusterError> {
        let s = self.sections.remove(index);
        // Dropped, not just shut down: every lock it holds must be free for
        // the new server.
        drop(self.stores.remove(index));
        let store = self.start_store(index, &s).await?;
        self.stores.insert(index, store);
        self.sections.insert(index, s);
        Ok(&self.stores[index])
    }

    /// Starts storage server `index` from section `s`, registered with
    /// the metadata server, in `store-<index>` of the data directory unless
    /// the section names one.
    async fn start_store(
        &self,
        index: usize,
        s: &StoreSection,
    ) -> Result<StorageServer, ClusterError> {
        let metas = vec![self.meta_addr().to_string()];
        let cfg = self
            .config
            .store_config_under(index, s, metas, self.dir.path())?;
        let store = StorageServer::start(cfg)
            .await
            .map_err(|error| ClusterError::Store {
                index,
                class_name: s.class_name.clone(),
                error,
            })?;
        // Claims (a replacing put's, a delete's) by a call, not a request
        // over loopback the reply would wait for.
        self.meta.add_local_store(
            store.advertised_addr(),
            Arc::new(InProcess(store.local_claims())),
        );
        Ok(store)
    }

    /// The tenants the servers let in (`[[security.tenant]]`).
    pub fn tenants(&self) -> &[nodekernel_proto::tenant::Tenant] {
        &self.security.tenants
    }

    /// Whether the servers require a cluster token.
    pub fn has_token(&self) -> bool {
        self.security.token.is_some()
    }

    /// The file holding the cluster token, if the servers' token is one
    /// (`[security] token_file`, `NK_TOKEN_FILE`, or the cluster's own,
    /// [`TOKEN_FILE`] in the data directory).
    pub fn token_file(&self) -> Option<std::path::PathBuf> {
        self.config.token_file()
    }

    /// The cluster's locked data directory.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether the data directory is a private one, removed at shutdown.
    pub fn data_dir_is_private(&self) -> bool {
        self.dir.is_private()
    }

    pub fn meta_addr(&self) -> SocketAddr {
        self.meta.local_addr()
    }

    /// The metadata server's admin endpoint and dashboard
    /// (`http://ADDR/`), unless `meta.admin` turned it off.
    pub fn admin_url(&self) -> Option<String> {
        self.meta.admin_addr().map(|a| format!("http://{a}/"))
    }

    /// Client settings pointing at this cluster.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = self.config.client_config();
        c.metas = vec![self.meta_addr().to_string()];
        c.token = self.security.token.clone();
        c.tls = self.security.tls.clone();
        c
    }

    pub async fn client(&self) -> nodekernel_client::Result<Client> {
        Client::connect(self.client_config()).await
    }

    /// Stops every server (the metadata server last). A volatile storage
    /// server removes its block file, a persistent one syncs and keeps its
    /// blocks; a private data directory is removed entirely, any other one
    /// stays (with `LOCK`, the stores' identities and what persistence
    /// keeps). The locks are released when the cluster is dropped.
    /// Idempotent; also done on drop.
    pub fn shutdown(&self) {
        for s in &self.stores {
            s.shutdown();
        }
        self.meta.shutdown();
        self.dir.stop();
    }
}
