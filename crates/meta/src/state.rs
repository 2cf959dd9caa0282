//! The metadata state machine: namespace + block allocator + write leases,
//! driven one request at a time by [`MetaState::apply`]. Pure: no I/O, no
//! clock (the caller passes `now_ms`), so it can be tested exhaustively and
//! driven by a deterministic simulation.

use crate::alloc::{BlockAllocator, BlockRef, ServerSpec};
use crate::namespace::{CreateSpec, Lease, Namespace, NodeId};
use nodekernel_proto::meta::{MetaReply, MetaRequest, MAX_MAP_COUNT};
use nodekernel_proto::{BlockLoc, ClusterStatus, Error, NodeInfo, NodeType, Result};

#[derive(Debug)]
pub struct MetaState {
    pub ns: Namespace,
    pub alloc: BlockAllocator,
    lease_ms: u64,
    next_lease: u64,
}

impl MetaState {
    /// `first_gen` seeds block generations (see [`BlockAllocator::new`]).
    pub fn new(block_size: u32, lease_ms: u64, first_gen: u64) -> Self {
        MetaState {
            ns: Namespace::new(),
            alloc: BlockAllocator::new(block_size, first_gen),
            lease_ms,
            next_lease: 1,
        }
    }

    pub fn apply(&mut self, req: MetaRequest, now: u64) -> Result<MetaReply> {
        match req {
            MetaRequest::Create {
                path,
                ty,
                storage_class,
                location,
                enumerable,
            } => {
                let spec = CreateSpec {
                    storage_class,
                    location,
                    enumerable,
                };
                let created = self.ns.create(&path, ty, spec)?;
                self.release(created.freed);
                let lease = if ty.is_container() {
                    0
                } else {
                    self.grant(created.id, now)
                };
                Ok(MetaReply::Node(self.info(created.id, lease)))
            }
            MetaRequest::Lookup { path } => {
                let id = self.ns.resolve(&path)?;
                Ok(MetaReply::Node(self.info(id, 0)))
            }
            MetaRequest::Remove { path, recursive } => {
                let freed = self.ns.remove(&path, recursive)?;
                self.release(freed);
                Ok(MetaReply::Done)
            }
            MetaRequest::Move { src, dst } => {
                self.ns.rename(&src, &dst)?;
                Ok(MetaReply::Done)
            }
            MetaRequest::Enumerate { path } => Ok(MetaReply::Names(self.ns.children(&path)?)),
            MetaRequest::Map {
                node,
                index,
                count,
                alloc,
                lease,
            } => self.map(node, index, count, alloc, lease, now),
            MetaRequest::OpenWrite { path } => {
                let id = self.ns.resolve(&path)?;
                let n = self.ns.get(id).expect("resolved");
                if n.ty.is_container() {
                    return Err(Error::type_mismatch(format!(
                        "{path} is a {}; only File and KeyValue nodes hold data",
                        n.ty
                    )));
                }
                if let Some(l) = n.lease {
                    if now < l.expires_ms {
                        return Err(Error::busy(format!(
                            "{path} is being written by another client (one writer at a time)"
                        )));
                    }
                }
                let lease = self.grant(id, now);
                Ok(MetaReply::Node(self.info(id, lease)))
            }
            MetaRequest::Sync {
                node,
                lease,
                size,
                close,
            } => {
                let bs = self.alloc.block_size() as u64;
                let lease_ms = self.lease_ms;
                let n = self.writable(node, lease)?;
                let capacity = n.blocks.len() as u64 * bs;
                if size > capacity {
                    return Err(Error::out_of_range(format!(
                        "cannot publish size {size} of node {node}: only {capacity} bytes are allocated"
                    )));
                }
                if size < n.size {
                    return Err(Error::invalid_argument(format!(
                        "cannot shrink node {node} from {} to {size} bytes",
                        n.size
                    )));
                }
                n.size = size;
                n.lease = if close {
                    None
                } else {
                    Some(Lease {
                        id: lease,
                        expires_ms: now + lease_ms,
                    })
                };
                Ok(MetaReply::Done)
            }
            MetaRequest::Register {
                addr,
                class,
                class_name,
                medium,
                location,
                block_size,
                first_block,
                num_blocks,
            } => {
                let spec = ServerSpec {
                    addr,
                    class,
                    class_name,
                    medium,
                    location,
                    block_size,
                    first_block,
                    num_blocks,
                };
                let server = self.alloc.register(spec, now)?;
                Ok(MetaReply::Registered { server })
            }
            MetaRequest::Heartbeat { server } => {
                self.alloc.heartbeat(server, now)?;
                Ok(MetaReply::Done)
            }
            MetaRequest::Status => Ok(MetaReply::Status(ClusterStatus {
                block_size: self.alloc.block_size(),
                nodes: self.ns.len() as u64,
                servers: self.alloc.status(now),
            })),
        }
    }

    fn release(&mut self, blocks: Vec<BlockRef>) {
        for b in blocks {
            self.alloc.free(b);
        }
    }

    fn grant(&mut self, id: NodeId, now: u64) -> u64 {
        let lease = self.next_lease;
        self.next_lease += 1;
        let n = self.ns.get_mut(id).expect("node exists");
        n.lease = Some(Lease {
            id: lease,
            expires_ms: now + self.lease_ms,
        });
        lease
    }

    /// The node, if `lease` is its current write lease. A lease that expired
    /// but was not taken over stays usable (and is renewed by the caller).
    fn writable(&mut self, node: u64, lease: u64) -> Result<&mut crate::namespace::Node> {
        let n = self.ns.get_mut(node).ok_or_else(|| stale(node))?;
        match n.lease {
            Some(l) if l.id == lease => Ok(n),
            Some(_) => Err(Error::lease_expired(format!(
                "write lease {lease} on node {node} expired and another writer took over"
            ))),
            None => Err(Error::lease_expired(format!(
                "node {node} has no open writer; lease {lease} was closed or expired"
            ))),
        }
    }

    fn map(
        &mut self,
        node: u64,
        index: u64,
        count: u32,
        alloc: bool,
        lease: u64,
        now: u64,
    ) -> Result<MetaReply> {
        let count = count.clamp(1, MAX_MAP_COUNT) as u64;
        let end = index.saturating_add(count);
        if alloc {
            let lease_ms = self.lease_ms;
            let n = self.writable(node, lease)?;
            n.lease = Some(Lease {
                id: lease,
                expires_ms: now + lease_ms,
            });
            let have = n.blocks.len() as u64;
            if index > have {
                return Err(Error::out_of_range(format!(
                    "node {node} has {have} blocks; block {index} cannot be allocated before block {have}"
                )));
            }
            let (class, location) = (n.storage_class, n.location.clone());
            for i in have..end {
                match self.alloc.allocate(class, &location) {
                    Ok(b) => self.ns.get_mut(node).expect("exists").blocks.push(b),
                    Err(e) if i <= index => return Err(e),
                    Err(_) => break, // partial: the caller gets NoSpace on its next map
                }
            }
        }
        let n = self.ns.get(node).ok_or_else(|| stale(node))?;
        if n.ty.is_container() {
            return Err(Error::type_mismatch(format!(
                "node {node} is a {}, not a data node",
                n.ty
            )));
        }
        let hi = end.min(n.blocks.len() as u64) as usize;
        let lo = (index as usize).min(hi);
        let mut blocks = Vec::with_capacity(hi - lo);
        for (i, b) in n.blocks[lo..hi].iter().enumerate() {
            if !self.alloc.is_alive(b.server) {
                if blocks.is_empty() {
                    return Err(Error::data_lost(format!(
                        "block {} of node {node} is on storage server {} ({}), which is dead",
                        lo + i,
                        b.server,
                        self.alloc.server_addr(b.server).unwrap_or("?")
                    )));
                }
                break;
            }
            blocks.push(self.loc(b));
        }
        Ok(MetaReply::Blocks {
            size: n.size,
            blocks,
        })
    }

    fn loc(&self, b: &BlockRef) -> BlockLoc {
        BlockLoc {
            server: b.server,
            addr: self
                .alloc
                .server_addr(b.server)
                .unwrap_or_default()
                .to_string(),
            block: b.block,
            gen: b.gen,
            class: self.alloc.server_class(b.server).unwrap_or(0),
        }
    }

    fn info(&self, id: NodeId, lease: u64) -> NodeInfo {
        let n = self.ns.get(id).expect("node exists");
        let size = if n.ty.is_container() {
            n.children.len() as u64
        } else {
            n.size
        };
        NodeInfo {
            id,
            ty: n.ty,
            size,
            block_size: self.alloc.block_size(),
            storage_class: n.storage_class,
            location: n.location.clone(),
            enumerable: n.enumerable,
            lease,
            first_block: n
                .blocks
                .first()
                .filter(|b| self.alloc.is_alive(b.server))
                .map(|b| self.loc(b)),
        }
    }

    /// The storage class a node prefers (used by tests and status).
    pub fn node_type(&self, id: NodeId) -> Option<NodeType> {
        self.ns.get(id).map(|n| n.ty)
    }
}

fn stale(node: u64) -> Error {
    Error::stale(format!(
        "node {node} no longer exists (it was deleted or replaced)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodekernel_proto::{ErrorCode, NO_CLASS};

    const BS: u32 = 4096;

    fn state() -> MetaState {
        let mut s = MetaState::new(BS, 1000, 1);
        for (class, n) in [(0u8, 4u32), (1, 8)] {
            s.apply(
                MetaRequest::Register {
                    addr: format!("h:{class}"),
                    class,
                    class_name: format!("c{class}"),
                    medium: "dram".into(),
                    location: "h".into(),
                    block_size: BS,
                    first_block: 0,
                    num_blocks: n,
                },
                0,
            )
            .unwrap();
        }
        s
    }

    fn create(s: &mut MetaState, path: &str, ty: NodeType, now: u64) -> Result<NodeInfo> {
        match s.apply(
            MetaRequest::Create {
                path: path.into(),
                ty,
                storage_class: NO_CLASS,
                location: String::new(),
                enumerable: true,
            },
            now,
        )? {
            MetaReply::Node(n) => Ok(n),
            r => panic!("unexpected {r:?}"),
        }
    }

    fn map(
        s: &mut MetaState,
        node: u64,
        index: u64,
        count: u32,
        lease: u64,
    ) -> Result<(u64, Vec<BlockLoc>)> {
        match s.apply(
            MetaRequest::Map {
                node,
                index,
                count,
                alloc: lease != 0,
                lease,
            },
            0,
        )? {
            MetaReply::Blocks { size, blocks } => Ok((size, blocks)),
            r => panic!("unexpected {r:?}"),
        }
    }

    #[test]
    fn write_lease_map_sync_cycle() {
        let mut s = state();
        let f = create(&mut s, "/f", NodeType::File, 0).unwrap();
        assert_ne!(f.lease, 0, "creator holds the write lease");
        let busy = s
            .apply(MetaRequest::OpenWrite { path: "/f".into() }, 10)
            .unwrap_err();
        assert_eq!(busy.code, ErrorCode::Busy);
        let (_, blocks) = map(&mut s, f.id, 0, 6, f.lease).unwrap();
        assert_eq!(blocks.len(), 6);
        assert_eq!(
            blocks.iter().filter(|b| b.class == 0).count(),
            4,
            "DRAM first"
        );
        assert_eq!(
            map(&mut s, f.id, 9, 1, f.lease).unwrap_err().code,
            ErrorCode::OutOfRange
        );
        let too_big = MetaRequest::Sync {
            node: f.id,
            lease: f.lease,
            size: 7 * BS as u64,
            close: false,
        };
        assert_eq!(s.apply(too_big, 0).unwrap_err().code, ErrorCode::OutOfRange);
        s.apply(
            MetaRequest::Sync {
                node: f.id,
                lease: f.lease,
                size: 5000,
                close: true,
            },
            0,
        )
        .unwrap();
        let (size, blocks) = map(&mut s, f.id, 0, 10, 0).unwrap();
        assert_eq!((size, blocks.len()), (5000, 6));
        // Closed: the old lease is gone, a new writer may open.
        let stale_lease = MetaRequest::Sync {
            node: f.id,
            lease: f.lease,
            size: 5000,
            close: false,
        };
        assert_eq!(
            s.apply(stale_lease, 0).unwrap_err().code,
            ErrorCode::LeaseExpired
        );
        s.apply(MetaRequest::OpenWrite { path: "/f".into() }, 0)
            .unwrap();
    }

    #[test]
    fn expired_lease_can_be_taken_and_node_keeps_synced_size() {
        let mut s = state();
        let f = create(&mut s, "/f", NodeType::File, 0).unwrap();
        map(&mut s, f.id, 0, 2, f.lease).unwrap();
        s.apply(
            MetaRequest::Sync {
                node: f.id,
                lease: f.lease,
                size: 100,
                close: false,
            },
            0,
        )
        .unwrap();
        // The writer dies; after the lease timeout another writer takes over.
        let MetaReply::Node(n) = s
            .apply(MetaRequest::OpenWrite { path: "/f".into() }, 5000)
            .unwrap()
        else {
            panic!()
        };
        assert_ne!(n.lease, f.lease);
        assert_eq!(n.size, 100, "last synced size is kept");
        assert_eq!(
            map(&mut s, f.id, 2, 1, f.lease).unwrap_err().code,
            ErrorCode::LeaseExpired
        );
        // Deleting it returns all blocks, including the unpublished ones.
        let before = s.alloc.free_blocks();
        s.apply(
            MetaRequest::Remove {
                path: "/f".into(),
                recursive: false,
            },
            0,
        )
        .unwrap();
        assert_eq!(s.alloc.free_blocks(), before + 2, "no leaked blocks");
    }

    #[test]
    fn replaced_or_deleted_nodes_are_stale() {
        let mut s = state();
        create(&mut s, "/t", NodeType::Table, 0).unwrap();
        let k1 = create(&mut s, "/t/k", NodeType::KeyValue, 0).unwrap();
        map(&mut s, k1.id, 0, 1, k1.lease).unwrap();
        let free_before = s.alloc.free_blocks();
        let k2 = create(&mut s, "/t/k", NodeType::KeyValue, 0).unwrap();
        assert_eq!(
            s.alloc.free_blocks(),
            free_before + 1,
            "replaced value's blocks freed"
        );
        assert_eq!(
            map(&mut s, k1.id, 0, 1, 0).unwrap_err().code,
            ErrorCode::Stale
        );
        assert_eq!(
            map(&mut s, k1.id, 0, 1, k1.lease).unwrap_err().code,
            ErrorCode::Stale
        );
        assert!(map(&mut s, k2.id, 0, 1, k2.lease).is_ok());
    }

    #[test]
    fn no_space_keeps_earlier_data_and_recovers_after_delete() {
        let mut s = state();
        let f = create(&mut s, "/f", NodeType::File, 0).unwrap();
        let (_, got) = map(&mut s, f.id, 0, 100, f.lease).unwrap();
        assert_eq!(got.len(), 12, "partial allocation up to capacity");
        assert_eq!(
            map(&mut s, f.id, 12, 1, f.lease).unwrap_err().code,
            ErrorCode::NoSpace
        );
        s.apply(
            MetaRequest::Sync {
                node: f.id,
                lease: f.lease,
                size: 12 * BS as u64,
                close: true,
            },
            0,
        )
        .unwrap();
        let g = create(&mut s, "/g", NodeType::File, 0).unwrap();
        assert_eq!(
            map(&mut s, g.id, 0, 1, g.lease).unwrap_err().code,
            ErrorCode::NoSpace
        );
        assert_eq!(
            map(&mut s, f.id, 0, 100, 0).unwrap().1.len(),
            12,
            "earlier data still mapped"
        );
        s.apply(
            MetaRequest::Remove {
                path: "/f".into(),
                recursive: false,
            },
            0,
        )
        .unwrap();
        let (_, got) = map(&mut s, g.id, 0, 1, g.lease).unwrap();
        assert_eq!(got[0].class, 0, "freed DRAM is used first again");
    }

    #[test]
    fn dead_server_blocks_report_data_lost() {
        let mut s = state();
        let f = create(&mut s, "/f", NodeType::File, 0).unwrap();
        let (_, b) = map(&mut s, f.id, 0, 1, f.lease).unwrap();
        s.apply(
            MetaRequest::Sync {
                node: f.id,
                lease: f.lease,
                size: 10,
                close: true,
            },
            0,
        )
        .unwrap();
        // Only the other server keeps heartbeating.
        let other = if b[0].server == 1 { 2 } else { 1 };
        s.apply(MetaRequest::Heartbeat { server: other }, 5000)
            .unwrap();
        s.alloc.expire(5000, 1000);
        assert_eq!(
            map(&mut s, f.id, 0, 1, 0).unwrap_err().code,
            ErrorCode::DataLost
        );
        let MetaReply::Node(info) = s
            .apply(MetaRequest::Lookup { path: "/f".into() }, 0)
            .unwrap()
        else {
            panic!()
        };
        assert!(info.first_block.is_none());
        let g = create(&mut s, "/g", NodeType::File, 0).unwrap();
        let (_, b2) = map(&mut s, g.id, 0, 1, g.lease).unwrap();
        assert_eq!(b2[0].server, other, "dead server gets no new blocks");
    }
}
