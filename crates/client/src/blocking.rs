//! Blocking wrapper around the async client, for synchronous callers.
//! Each [`Client`] owns a small tokio runtime.

use crate::{ClientConfig, CreateOptions, Node as AsyncNode};
use nodekernel_proto::{ClusterStatus, NodeInfo, NodeType, Result};
use std::sync::Arc;
use tokio::runtime::Runtime;

/// A blocking NodeKernel client.
#[derive(Clone)]
pub struct Client {
    rt: Arc<Runtime>,
    inner: crate::Client,
}

/// A blocking node handle.
pub struct Node {
    rt: Arc<Runtime>,
    inner: AsyncNode,
}

impl Client {
    pub fn connect(cfg: ClientConfig) -> Result<Client> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| nodekernel_proto::Error::internal(format!("cannot start runtime: {e}")))?;
        let inner = rt.block_on(crate::Client::connect(cfg))?;
        Ok(Client {
            rt: Arc::new(rt),
            inner,
        })
    }

    /// The async client underneath.
    pub fn as_async(&self) -> &crate::Client {
        &self.inner
    }

    fn node(&self, r: Result<AsyncNode>) -> Result<Node> {
        r.map(|inner| Node {
            rt: self.rt.clone(),
            inner,
        })
    }

    pub fn create(&self, path: &str, ty: NodeType, opts: CreateOptions) -> Result<Node> {
        self.node(self.rt.block_on(self.inner.create(path, ty, opts)))
    }
    pub fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        self.rt.block_on(self.inner.mkdir(path, parents))
    }
    pub fn lookup(&self, path: &str) -> Result<Node> {
        self.node(self.rt.block_on(self.inner.lookup(path)))
    }
    pub fn open_write(&self, path: &str) -> Result<Node> {
        self.node(self.rt.block_on(self.inner.open_write(path)))
    }
    pub fn open_append(&self, path: &str, opts: CreateOptions) -> Result<Node> {
        self.node(self.rt.block_on(self.inner.open_append(path, opts)))
    }
    pub fn delete(&self, path: &str, recursive: bool) -> Result<()> {
        self.rt.block_on(self.inner.delete(path, recursive))
    }
    pub fn rename(&self, src: &str, dst: &str) -> Result<()> {
        self.rt.block_on(self.inner.rename(src, dst))
    }
    pub fn enumerate(&self, path: &str) -> Result<Vec<String>> {
        self.rt.block_on(self.inner.enumerate(path))
    }
    pub fn status(&self) -> Result<ClusterStatus> {
        self.rt.block_on(self.inner.status())
    }
    pub fn put(&self, path: &str, value: &[u8]) -> Result<()> {
        self.rt.block_on(self.inner.put(path, value))
    }
    pub fn get(&self, path: &str) -> Result<Vec<u8>> {
        self.rt.block_on(self.inner.get(path))
    }
}

impl Node {
    pub fn info(&self) -> &NodeInfo {
        self.inner.info()
    }
    pub fn size(&self) -> u64 {
        self.inner.size()
    }
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.rt.block_on(self.inner.read_at(offset, buf))
    }
    pub fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        self.rt.block_on(self.inner.read(offset, len))
    }
    pub fn append(&mut self, data: &[u8]) -> Result<()> {
        self.rt.block_on(self.inner.append(data))
    }
    pub fn write_at(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.rt.block_on(self.inner.write_at(offset, data))
    }
    pub fn sync(&mut self) -> Result<()> {
        self.rt.block_on(self.inner.sync())
    }
    pub fn close(self) -> Result<()> {
        self.rt.block_on(self.inner.close())
    }
}
