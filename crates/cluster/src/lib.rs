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
use nodekernel_store::{StorageServer, StoreError};
use std::net::SocketAddr;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("metadata server: {0}")]
    Meta(#[from] MetaError),
    #[error("storage server {index} ({class_name}): {source}")]
    Store {
        index: usize,
        class_name: String,
        source: StoreError,
    },
}

/// A metadata server and its storage servers running in this process.
pub struct LocalCluster {
    pub config: Config,
    pub meta: MetaServer,
    pub stores: Vec<StorageServer>,
}

impl LocalCluster {
    /// Starts the metadata server on `config.meta.listen`, then every store
    /// of [`Config::up_stores`], registered with it.
    pub async fn start(config: Config) -> Result<LocalCluster, ClusterError> {
        config.validate()?;
        let mut meta_cfg = config.meta_config();
        if config.meta.expect_servers.is_none() {
            meta_cfg.placement.expected_servers = config.up_stores().len() as u32;
        }
        let meta = MetaServer::start(meta_cfg).await?;
        let mut cluster = LocalCluster {
            config,
            meta,
            stores: Vec::new(),
        };
        for s in cluster.config.up_stores() {
            cluster.add_store(&s).await?;
        }
        Ok(cluster)
    }

    /// Starts one more storage server and registers it.
    pub async fn add_store(&mut self, s: &StoreSection) -> Result<&StorageServer, ClusterError> {
        let index = self.stores.len();
        let metas = vec![self.meta_addr().to_string()];
        let cfg = self.config.store_config(index, s, metas)?;
        let store = StorageServer::start(cfg)
            .await
            .map_err(|source| ClusterError::Store {
                index,
                class_name: s.class_name.clone(),
                source,
            })?;
        self.stores.push(store);
        Ok(&self.stores[index])
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

    /// Stops every server (the metadata server last).
    pub fn shutdown(&self) {
        for s in &self.stores {
            s.shutdown();
        }
        self.meta.shutdown();
    }
}
