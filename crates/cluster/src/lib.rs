//! NodeKernel configuration and the embedded one-process cluster.
//!
//! [`Config`] is the TOML file every `nk` role reads. [`LocalCluster`]
//! starts a metadata server and storage servers inside the current tokio
//! runtime: `nk up` uses it, and so do the integration tests (every server
//! binds port 0 unless told otherwise).

pub mod config;
pub mod size;

pub use config::{Config, ConfigError, Medium, StoreSection, DEFAULT_META};
pub use size::{human, ByteSize};

use nodekernel_client::{Client, ClientConfig};
use nodekernel_meta::{MetaError, MetaServer};
use nodekernel_store::{DirLock, StorageServer, StoreError};
use std::net::SocketAddr;
use std::path::Path;

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
}

impl From<MetaError> for ClusterError {
    fn from(e: MetaError) -> ClusterError {
        ClusterError::Meta(e)
    }
}

/// A metadata server and its storage servers running in this process.
pub struct LocalCluster {
    pub config: Config,
    pub meta: MetaServer,
    pub stores: Vec<StorageServer>,
    /// The locked data directory (`up.data_dir` or a fresh private one).
    /// Declared last: it is released after the stores.
    dir: DirLock,
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
    pub async fn start(config: Config) -> Result<LocalCluster, ClusterError> {
        config.validate()?;
        let dir = match &config.up.data_dir {
            Some(d) => DirLock::acquire(d),
            None => DirLock::private("up"),
        }
        .map_err(ClusterError::DataDir)?;
        // On failure from here on, `dir` drops unstarted and undoes itself.
        let mut meta_cfg = config.meta_config();
        meta_cfg.persistence = config.meta_persistence(Some(&dir.path().join("meta")));
        if config.meta.expect_servers.is_none() {
            meta_cfg.placement.expected_servers = config.up_stores().len() as u32;
        }
        let meta = MetaServer::start(meta_cfg).await?;
        let mut cluster = LocalCluster {
            config,
            meta,
            stores: Vec::new(),
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
        cluster.dir.started();
        Ok(cluster)
    }

    /// Starts one more storage server and registers it. Its data directory
    /// is `store-<i>` in the cluster's (`i` its index in
    /// [`stores`](Self::stores)), unless the section names one.
    pub async fn add_store(&mut self, s: &StoreSection) -> Result<&StorageServer, ClusterError> {
        let index = self.stores.len();
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
        self.stores.push(store);
        Ok(&self.stores[index])
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

    /// Client settings pointing at this cluster.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = self.config.client_config();
        c.metas = vec![self.meta_addr().to_string()];
        c
    }

    pub async fn client(&self) -> nodekernel_client::Result<Client> {
        Client::connect(self.client_config()).await
    }

    /// Stops every server (the metadata server last). Each storage server
    /// removes its block file; a private data directory is removed
    /// entirely, any other one stays (with `LOCK` and the stores'
    /// identities). The locks are released when the cluster is dropped.
    /// Idempotent; also done on drop.
    pub fn shutdown(&self) {
        for s in &self.stores {
            s.shutdown();
        }
        self.meta.shutdown();
        self.dir.stop();
    }
}
