//! The metadata state machine: namespace + block allocator + write leases,
//! driven one request at a time by [`MetaState::apply`]. Pure: no I/O, no
//! clock (the caller passes `now_ms`), so it can be tested exhaustively and
//! driven by a deterministic simulation. Side effects on storage servers
//! (invalidating freed blocks) are queued for the caller to send.

use crate::alloc::{BlockAllocator, BlockClaim, BlockRef};
use crate::namespace::{stale, CreateSpec, Lease, Linked, Namespace, NodeId, Slot, SlotRef};
use nodekernel_proto::meta::{MetaReply, MetaRequest, MAX_MAP_COUNT};
use nodekernel_proto::record::RECORD_SIZE;
use nodekernel_proto::{
    BlockLoc, ClassInfo, ClusterStatus, Error, NodeInfo, RecordLoc, Result, NO_CLASS,
};

#[derive(Debug)]
pub struct MetaState {
    pub ns: Namespace,
    pub alloc: BlockAllocator,
    lease_ms: u64,
    next_lease: u64,
    claims: Vec<BlockClaim>,
    classes: Vec<ClassInfo>,
    local_socket: String,
}

impl MetaState {
    /// `first_gen` seeds block generations (see [`BlockAllocator::new`]).
    pub fn new(block_size: u32, lease_ms: u64, first_gen: u64) -> Self {
        MetaState {
            ns: Namespace::new(),
            alloc: BlockAllocator::new(block_size, first_gen),
            lease_ms,
            next_lease: 1,
            claims: Vec::new(),
            classes: Vec::new(),
            local_socket: String::new(),
        }
    }

    /// Sets the abstract Unix socket name the server shell also listens on
    /// (answered by `LocalSocket`; empty for none).
    pub fn set_local_socket(&mut self, name: String) {
        self.local_socket = name;
    }

    pub fn local_socket(&self) -> &str {
        &self.local_socket
    }

    /// Sets the configured storage classes (names and prices).
    pub fn set_classes(&mut self, classes: Vec<ClassInfo>) {
        self.classes = classes;
    }

    /// Configured classes, plus any class a storage server registered
    /// without configuration (named after its first server, no price).
    fn class_table(&self, servers: &[nodekernel_proto::ServerStatus]) -> Vec<ClassInfo> {
        let mut out = self.classes.clone();
        for s in servers {
            if !out.iter().any(|c| c.class == s.class) {
                out.push(ClassInfo {
                    class: s.class,
                    name: s.class_name.clone(),
                    price_per_gib: 0.0,
                });
            }
        }
        out.sort_by_key(|c| c.class);
        out
    }

    /// BlockClaims of freed blocks queued by the requests applied so far;
    /// the server shell sends them to the storage servers.
    pub fn take_claims(&mut self) -> Vec<BlockClaim> {
        std::mem::take(&mut self.claims)
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
                if !ty.replaces_on_create() {
                    if let Some(slot) = self.ns.next_slot(&path) {
                        self.ensure_record_space(slot)?;
                    }
                }
                let spec = CreateSpec {
                    storage_class,
                    location,
                    enumerable,
                };
                let (id, linked) = self.ns.create(&path, ty, spec)?;
                let lease = if ty.is_container() {
                    0
                } else {
                    self.grant(id, now)
                };
                if ty.replaces_on_create() {
                    // A put always writes: hand out its first block with the
                    // create, saving the put a map round trip. (No space now
                    // is not an error yet: the put's map will report it.)
                    let n = self.ns.get(id).expect("just created");
                    let (class, location) = (n.storage_class, n.location.clone());
                    if let Ok(b) = self.alloc.allocate(class, &location) {
                        self.ns.get_mut(id).expect("just created").blocks.push(b);
                    }
                }
                let mut info = self.info(id, lease);
                info.record = self.record_to_write(&linked);
                Ok(MetaReply::Node(info))
            }
            MetaRequest::Lookup { path } => {
                let id = self.ns.resolve(&path)?;
                Ok(MetaReply::Node(self.info(id, 0)))
            }
            MetaRequest::Remove { path, recursive } => {
                let removed = self.ns.remove(&path, recursive)?;
                self.release(removed.freed);
                Ok(MetaReply::Record(removed.clear.map(|s| self.record_loc(s))))
            }
            MetaRequest::Move { src, dst } => {
                if let Some(slot) = self.ns.next_slot(&dst) {
                    self.ensure_record_space(slot)?;
                }
                let m = self.ns.rename(&src, &dst)?;
                Ok(MetaReply::Moved {
                    ty: m.ty,
                    clear: m.clear.map(|s| self.record_loc(s)),
                    write: m.write.map(|s| self.record_loc(s)),
                })
            }
            MetaRequest::Enumerate { path } => {
                let id = self.ns.container(&path)?;
                let n = self.ns.get(id).expect("resolved");
                Ok(MetaReply::Listing {
                    container: id,
                    block_size: self.alloc.block_size(),
                    slots: n.slots.len(),
                    live: n.slots.live_bitmap(),
                })
            }
            MetaRequest::ReleaseSlot { container, slot } => {
                self.ns.release_slot(container, slot)?;
                Ok(MetaReply::Done)
            }
            MetaRequest::RecordNames { container, slots } => {
                let n = self.ns.get(container).ok_or_else(|| stale(container))?;
                let names = slots
                    .into_iter()
                    .filter_map(|slot| match n.slots.get(slot) {
                        Some(Slot::Live(id)) => {
                            self.ns.get(id).map(|c| (slot, c.ty, c.name.clone()))
                        }
                        _ => None,
                    })
                    .collect();
                Ok(MetaReply::Names(names))
            }
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
            } => self.sync(node, lease, size, close, now),
            MetaRequest::Register(spec) => {
                let server = self.alloc.register(spec, now)?;
                Ok(MetaReply::Registered { server })
            }
            MetaRequest::Heartbeat { server } => {
                self.alloc.heartbeat(server, now)?;
                Ok(MetaReply::Done)
            }
            MetaRequest::Status => {
                let servers = self.alloc.status(now);
                Ok(MetaReply::Status(ClusterStatus {
                    block_size: self.alloc.block_size(),
                    nodes: self.ns.len() as u64,
                    classes: self.class_table(&servers),
                    servers,
                }))
            }
            MetaRequest::LocalSocket => Ok(MetaReply::LocalSocket(self.local_socket.clone())),
        }
    }

    fn sync(
        &mut self,
        node: u64,
        lease: u64,
        size: u64,
        close: bool,
        now: u64,
    ) -> Result<MetaReply> {
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
        // A closed node keeps only the blocks its bytes need: blocks handed
        // out but never filled (an empty put, a write cut short) go back.
        let unused = if close {
            n.blocks.split_off(size.div_ceil(bs) as usize)
        } else {
            Vec::new()
        };
        let (linked, parent) = (n.linked, n.parent);
        self.release(unused);
        if !close || linked {
            return Ok(MetaReply::Record(None));
        }
        // Closing a put: the value becomes visible, replacing any older one.
        if let Some(slot) = self.ns.next_slot_in(parent) {
            self.ensure_record_space(slot)?;
        }
        match self.ns.link(node) {
            Ok(linked) => {
                let record = self.record_to_write(&linked);
                self.release(linked.freed);
                Ok(MetaReply::Record(record))
            }
            Err(e) => {
                let freed = self.ns.drop_unlinked(node);
                self.release(freed);
                Err(e)
            }
        }
    }

    /// Drops puts that never closed and whose lease expired `grace_ms` ago,
    /// freeing their blocks. Returns how many were dropped.
    pub fn sweep_abandoned_puts(&mut self, now: u64, grace_ms: u64) -> usize {
        let dead: Vec<NodeId> = self
            .ns
            .shadows()
            .filter(|n| n.lease.is_none_or(|l| l.expires_ms + grace_ms <= now))
            .map(|n| n.id)
            .collect();
        for id in &dead {
            let freed = self.ns.drop_unlinked(*id);
            self.release(freed);
        }
        dead.len()
    }

    fn release(&mut self, blocks: Vec<BlockRef>) {
        for b in blocks {
            if let Some(inv) = self.alloc.free(b) {
                self.claims.push(inv);
            }
        }
    }

    /// Makes sure the container's data has a block for the record `slot`
    /// (on a live storage server).
    fn ensure_record_space(&mut self, (container, slot): SlotRef) -> Result<()> {
        let bs = self.alloc.block_size() as u64;
        let need = ((slot as u64 + 1) * RECORD_SIZE as u64).div_ceil(bs) as usize;
        self.relocate_lost_records(container)?;
        loop {
            let n = self.ns.get(container).ok_or_else(|| stale(container))?;
            if n.blocks.len() >= need {
                return Ok(());
            }
            let b = self.record_block(container)?;
            self.ns.get_mut(container).expect("exists").blocks.push(b);
        }
    }

    /// Allocates (and claims) a block for a container's records.
    fn record_block(&mut self, container: NodeId) -> Result<BlockRef> {
        let class = self
            .ns
            .get(container)
            .ok_or_else(|| stale(container))?
            .storage_class;
        // Records are written on the create path, so they follow the normal
        // placement (DRAM first, or the container's preferred class). The
        // root's few records go to the slowest class instead: the root is
        // shared by every top-level name and changes rarely.
        let b = if class == NO_CLASS && container == crate::namespace::ROOT {
            self.alloc.allocate_slowest_first()
        } else {
            self.alloc.allocate(class, "")
        };
        let b = b.map_err(|e| {
            Error::no_space(format!(
                "no space for the child records of node {container}: {}",
                e.message
            ))
        })?;
        if let Some(addr) = self.alloc.server_addr(b.server) {
            self.claims.push(BlockClaim {
                server: b.server,
                addr: addr.to_string(),
                block: b.block,
                gen: b.gen,
            });
        }
        Ok(b)
    }

    /// Replaces record blocks of `container` that sit on dead storage
    /// servers. Their records are lost; enumeration recovers the names of
    /// those live slots from the metadata server (`RecordNames`).
    fn relocate_lost_records(&mut self, container: NodeId) -> Result<()> {
        let n = self.ns.get(container).ok_or_else(|| stale(container))?;
        let lost: Vec<(usize, BlockRef)> = n
            .blocks
            .iter()
            .enumerate()
            .filter(|(_, b)| !self.alloc.is_alive(b.server))
            .map(|(i, b)| (i, *b))
            .collect();
        for (i, old) in lost {
            let new = self.record_block(container)?;
            self.ns.get_mut(container).expect("exists").blocks[i] = new;
            self.release(vec![old]);
            tracing::warn!(
                "records of node {container} in block {i} were lost with storage server {}; moved to server {}",
                old.server,
                new.server
            );
        }
        Ok(())
    }

    fn record_loc(&self, (container, slot): SlotRef) -> RecordLoc {
        let bs = self.alloc.block_size() as u64;
        let at = slot as u64 * RECORD_SIZE as u64;
        let n = self.ns.get(container).expect("container exists");
        let b = n.blocks[(at / bs) as usize];
        RecordLoc {
            container,
            slot,
            block: self.loc(&b),
            offset: (at % bs) as u32,
        }
    }

    fn record_to_write(&self, linked: &Linked) -> Option<RecordLoc> {
        linked.write.map(|s| self.record_loc(s))
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
        if n.ty.is_container() {
            return Err(Error::type_mismatch(format!(
                "node {node} is a {}; its data is written by the metadata server",
                n.ty
            )));
        }
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
        if self.ns.get(node).is_some_and(|n| n.ty.is_container()) {
            self.relocate_lost_records(node)?;
        }
        let n = self.ns.get(node).ok_or_else(|| stale(node))?;
        let size = if n.ty.is_container() {
            n.slots.len() as u64 * RECORD_SIZE as u64
        } else {
            n.size
        };
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
        Ok(MetaReply::Blocks { size, blocks })
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
                .filter(|b| self.alloc.is_alive(b.server) && !n.ty.is_container())
                .map(|b| self.loc(b)),
            record: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodekernel_proto::{ErrorCode, NodeType, NO_CLASS};

    const BS: u32 = 4096;

    fn state() -> MetaState {
        let mut s = MetaState::new(BS, 1000, 1);
        for (class, n) in [(0u8, 4u32), (1, 9)] {
            s.apply(
                MetaRequest::Register(nodekernel_proto::ServerSpec {
                    addr: format!("h:{class}"),
                    class,
                    class_name: format!("c{class}"),
                    medium: "dram".into(),
                    location: "h".into(),
                    block_size: BS,
                    first_block: 0,
                    num_blocks: n,
                }),
                0,
            )
            .unwrap();
        }
        // The root's first record block (from the slowest class) is
        // allocated up front, so tests see 4 free DRAM and 8 file blocks.
        create(&mut s, "/setup", NodeType::Directory, 0).unwrap();
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
        assert_eq!(
            (size, blocks.len()),
            (5000, 2),
            "closing trimmed the 4 unused blocks"
        );
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

    fn close(s: &mut MetaState, node: &NodeInfo, size: u64) -> Result<Option<RecordLoc>> {
        let req = MetaRequest::Sync {
            node: node.id,
            lease: node.lease,
            size,
            close: true,
        };
        match s.apply(req, 0)? {
            MetaReply::Record(r) => Ok(r),
            r => panic!("unexpected {r:?}"),
        }
    }

    #[test]
    fn replaced_or_deleted_nodes_are_stale_and_their_blocks_invalidated() {
        let mut s = state();
        create(&mut s, "/t", NodeType::Table, 0).unwrap();
        s.take_claims();
        let k1 = create(&mut s, "/t/k", NodeType::KeyValue, 0).unwrap();
        let (_, b1) = map(&mut s, k1.id, 0, 1, k1.lease).unwrap();
        let rec = close(&mut s, &k1, 10)
            .unwrap()
            .expect("new key: record to write");
        assert_eq!((rec.slot, rec.offset), (0, 0));
        assert_eq!(
            s.take_claims().len(),
            1,
            "the table's first record block is claimed"
        );
        let free_before = s.alloc.free_blocks();
        let k2 = create(&mut s, "/t/k", NodeType::KeyValue, 0).unwrap();
        map(&mut s, k2.id, 0, 1, k2.lease).unwrap();
        assert!(
            map(&mut s, k1.id, 0, 1, 0).is_ok(),
            "old value readable until the put closes"
        );
        assert_eq!(
            close(&mut s, &k2, 10).unwrap(),
            None,
            "same key keeps its record"
        );
        assert_eq!(
            s.alloc.free_blocks(),
            free_before,
            "old block freed, new one used"
        );
        let inv = s.take_claims();
        assert_eq!(inv.len(), 1);
        assert_eq!(inv[0].block, b1[0].block);
        assert!(
            inv[0].gen > b1[0].gen,
            "invalidation carries a newer generation"
        );
        assert_eq!(
            map(&mut s, k1.id, 0, 1, 0).unwrap_err().code,
            ErrorCode::Stale
        );
        assert_eq!(
            map(&mut s, k1.id, 0, 1, k1.lease).unwrap_err().code,
            ErrorCode::Stale
        );
        assert!(map(&mut s, k2.id, 0, 1, 0).is_ok());
        s.apply(
            MetaRequest::Remove {
                path: "/t/k".into(),
                recursive: false,
            },
            0,
        )
        .unwrap();
        assert_eq!(
            s.take_claims().len(),
            1,
            "deleted value's block invalidated"
        );
        let d = create(&mut s, "/d", NodeType::Directory, 0).unwrap();
        create(&mut s, "/d/x", NodeType::File, 0).unwrap();
        let claims = s.take_claims();
        assert_eq!(claims.len(), 1, "a new container block is claimed");
        let (_, blocks) = map(&mut s, d.id, 0, 1, 0).unwrap();
        assert_eq!(
            (claims[0].block, claims[0].gen),
            (blocks[0].block, blocks[0].gen)
        );
    }

    #[test]
    fn puts_get_their_first_block_and_close_trims_unused_blocks() {
        let mut s = state();
        create(&mut s, "/t", NodeType::Table, 0).unwrap();
        // The table's first record block is allocated by its first put.
        let warm = create(&mut s, "/t/warm", NodeType::KeyValue, 0).unwrap();
        close(&mut s, &warm, 0).unwrap();
        let free = s.alloc.free_blocks();
        let k = create(&mut s, "/t/k", NodeType::KeyValue, 0).unwrap();
        let b0 = k
            .first_block
            .clone()
            .expect("a put gets its first block with the create");
        assert_eq!(s.alloc.free_blocks(), free - 1);
        let (_, blocks) = map(&mut s, k.id, 0, 3, k.lease).unwrap();
        assert_eq!(blocks[0], b0, "block 0 is the one handed out");
        close(&mut s, &k, BS as u64 + 1).unwrap();
        assert_eq!(
            s.alloc.free_blocks(),
            free - 2,
            "the third block was never needed"
        );
        let e = create(&mut s, "/t/empty", NodeType::KeyValue, 0).unwrap();
        close(&mut s, &e, 0).unwrap();
        assert_eq!(
            s.alloc.free_blocks(),
            free - 2,
            "an empty value keeps no block"
        );
        let f = create(&mut s, "/f", NodeType::File, 0).unwrap();
        assert!(
            f.first_block.is_none(),
            "Files may stay empty: no block up front"
        );
    }

    #[test]
    fn abandoned_puts_are_swept() {
        let mut s = state();
        create(&mut s, "/t", NodeType::Table, 0).unwrap();
        let free = s.alloc.free_blocks();
        let k = create(&mut s, "/t/k", NodeType::KeyValue, 0).unwrap();
        map(&mut s, k.id, 0, 2, k.lease).unwrap();
        assert_eq!(s.sweep_abandoned_puts(500, 100), 0, "lease still valid");
        assert_eq!(s.sweep_abandoned_puts(1100, 100), 1);
        assert_eq!(s.alloc.free_blocks(), free, "no leaked blocks");
        assert_eq!(close(&mut s, &k, 0).unwrap_err().code, ErrorCode::Stale);
    }

    #[test]
    fn container_records_get_space_and_slots() {
        let mut s = state();
        let d = create(&mut s, "/d", NodeType::Directory, 0).unwrap();
        assert!(d.record.is_some(), "root is enumerable: /d needs a record");
        let per_block = BS as u64 / RECORD_SIZE as u64;
        for i in 0..per_block + 1 {
            let f = create(&mut s, &format!("/d/f{i}"), NodeType::File, 0).unwrap();
            let r = f.record.unwrap();
            assert_eq!(r.container, d.id);
            assert_eq!(r.slot as u64, i);
            assert_eq!(r.offset as u64, (i % per_block) * RECORD_SIZE as u64);
        }
        let (size, blocks) = map(&mut s, d.id, 0, 10, 0).unwrap();
        assert_eq!(
            size,
            (per_block + 1) * RECORD_SIZE as u64,
            "container data length"
        );
        assert_eq!(blocks.len(), 2);
        let MetaReply::Listing { slots, live, .. } = s
            .apply(MetaRequest::Enumerate { path: "/d".into() }, 0)
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(slots as u64, per_block + 1);
        assert_eq!(
            live.iter().map(|b| b.count_ones()).sum::<u32>() as u64,
            per_block + 1
        );
        let MetaReply::Record(Some(clear)) = s
            .apply(
                MetaRequest::Remove {
                    path: "/d/f3".into(),
                    recursive: false,
                },
                0,
            )
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(clear.slot, 3);
        s.apply(
            MetaRequest::ReleaseSlot {
                container: d.id,
                slot: 3,
            },
            0,
        )
        .unwrap();
        let again = create(&mut s, "/d/g", NodeType::File, 0).unwrap();
        assert_eq!(again.record.unwrap().slot, 3, "released slot reused");
        let e = s.apply(
            MetaRequest::Map {
                node: d.id,
                index: 0,
                count: 1,
                alloc: true,
                lease: 1,
            },
            0,
        );
        assert_eq!(
            e.unwrap_err().code,
            ErrorCode::TypeMismatch,
            "containers are not client-written"
        );
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
