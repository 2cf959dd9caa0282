//! Block allocator: storage servers, their free blocks and block generations.
//!
//! Pure state, no I/O, no clock: callers pass the current time in
//! milliseconds. Placement rules (PRODUCT.md §2 "Placement"):
//! - classes are tried in priority order (0 first); with a preferred class,
//!   that class first, then the lower-priority classes after it, and only
//!   then the higher-priority ones;
//! - within a class, servers are used round-robin; with a preferred location,
//!   servers at that location come first (storage class outranks location);
//! - dead servers get no new blocks.
//!
//! Freed blocks go to the front of the free list (LIFO): a replaced value's
//! block is the next one handed out, so its pages are already mapped by
//! co-located clients and warm in caches (a fresh page costs a fault of
//! about a microsecond per 4 KiB on first touch). Safety against old handles
//! does not depend on the order: every allocation stamps the block with a
//! new generation, strictly greater than all earlier ones, which storage
//! servers check on every access, and freed blocks are claimed with one.

use nodekernel_proto::{Error, Result, ServerStatus, NO_CLASS};
use std::collections::{BTreeMap, VecDeque};

/// One allocated block: server, absolute block index on it, generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockRef {
    pub server: u32,
    pub block: u32,
    pub gen: u64,
}

/// A block to claim on its storage server with `gen` (a zero-length write).
/// For a freed block the generation is fresh, so every older location of it
/// gets `Stale` at once, before the block is ever reused; for a new
/// container block it is the allocation's generation, so the container's
/// records can be read before any client has written one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockClaim {
    pub server: u32,
    pub addr: String,
    pub block: u32,
    pub gen: u64,
}

pub use nodekernel_proto::ServerSpec;

#[derive(Debug)]
struct Server {
    spec: ServerSpec,
    free: VecDeque<u32>,
    alive: bool,
    last_seen_ms: u64,
}

#[derive(Debug, Default)]
struct Class {
    servers: Vec<u32>,
    next: usize,
}

#[derive(Debug)]
pub struct BlockAllocator {
    block_size: u32,
    servers: BTreeMap<u32, Server>,
    classes: BTreeMap<u8, Class>,
    next_server: u32,
    next_gen: u64,
}

impl BlockAllocator {
    /// `first_gen` seeds block generations; pass a value that grows across
    /// restarts (e.g. wall-clock microseconds) so a restarted metadata server
    /// never reissues a generation a storage server has already seen.
    pub fn new(block_size: u32, first_gen: u64) -> Self {
        BlockAllocator {
            block_size,
            servers: BTreeMap::new(),
            classes: BTreeMap::new(),
            next_server: 1,
            next_gen: first_gen.max(1),
        }
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Adds a storage server; returns its new id (ids are never reused).
    pub fn register(&mut self, spec: ServerSpec, now_ms: u64) -> Result<u32> {
        if spec.block_size != self.block_size {
            return Err(Error::invalid_argument(format!(
                "storage server {} exports {}-byte blocks but this cluster uses {}-byte blocks",
                spec.addr, spec.block_size, self.block_size
            )));
        }
        if spec.class == NO_CLASS {
            return Err(Error::invalid_argument(format!(
                "storage class {NO_CLASS} is reserved (means 'no preference')"
            )));
        }
        if spec.first_block.checked_add(spec.num_blocks).is_none() {
            return Err(Error::invalid_argument("block range overflows u32"));
        }
        let id = self.next_server;
        self.next_server += 1;
        let free = (spec.first_block..spec.first_block + spec.num_blocks).collect();
        self.classes.entry(spec.class).or_default().servers.push(id);
        self.servers.insert(
            id,
            Server {
                spec,
                free,
                alive: true,
                last_seen_ms: now_ms,
            },
        );
        Ok(id)
    }

    /// Records a heartbeat; a server that was declared dead and heartbeats
    /// again is alive again (its blocks were never handed out to others).
    pub fn heartbeat(&mut self, id: u32, now_ms: u64) -> Result<()> {
        let s = self.servers.get_mut(&id).ok_or_else(|| {
            Error::unknown_server(format!("storage server {id} is not registered"))
        })?;
        s.last_seen_ms = now_ms;
        s.alive = true;
        Ok(())
    }

    /// Marks servers silent for longer than `dead_after_ms` as dead; returns
    /// the ids newly declared dead.
    pub fn expire(&mut self, now_ms: u64, dead_after_ms: u64) -> Vec<u32> {
        let mut dead = Vec::new();
        for (id, s) in &mut self.servers {
            if s.alive && now_ms.saturating_sub(s.last_seen_ms) > dead_after_ms {
                s.alive = false;
                dead.push(*id);
            }
        }
        dead
    }

    pub fn is_alive(&self, server: u32) -> bool {
        self.servers.get(&server).is_some_and(|s| s.alive)
    }

    pub fn server_addr(&self, server: u32) -> Option<&str> {
        self.servers.get(&server).map(|s| s.spec.addr.as_str())
    }

    pub fn server_class(&self, server: u32) -> Option<u8> {
        self.servers.get(&server).map(|s| s.spec.class)
    }

    /// Class search order for a preference.
    fn class_order(&self, preferred: u8) -> Vec<u8> {
        let all: Vec<u8> = self.classes.keys().copied().collect();
        if preferred == NO_CLASS {
            return all;
        }
        let (higher, lower): (Vec<u8>, Vec<u8>) = all.into_iter().partition(|c| *c < preferred);
        lower.into_iter().chain(higher).collect()
    }

    /// Allocates one block following the placement rules, or `NoSpace`.
    pub fn allocate(&mut self, preferred_class: u8, location: &str) -> Result<BlockRef> {
        for class in self.class_order(preferred_class) {
            if let Some(b) = self.allocate_in(class, location) {
                return Ok(b);
            }
        }
        Err(Error::no_space(
            "every storage class is full (or has no live storage server)",
        ))
    }

    /// Allocates one block from the lowest-priority class with room (then
    /// upwards): for capacity-hungry, rarely hot data such as child records,
    /// so the fast classes stay free for node data.
    pub fn allocate_slowest_first(&mut self) -> Result<BlockRef> {
        let order: Vec<u8> = self.classes.keys().rev().copied().collect();
        for class in order {
            if let Some(b) = self.allocate_in(class, "") {
                return Ok(b);
            }
        }
        Err(Error::no_space(
            "every storage class is full (or has no live storage server)",
        ))
    }

    fn allocate_in(&mut self, class: u8, location: &str) -> Option<BlockRef> {
        let c = self.classes.get_mut(&class)?;
        let n = c.servers.len();
        let servers = &mut self.servers;
        let usable = |id: &u32, local_only: bool| {
            let s = &servers[id];
            s.alive && !s.free.is_empty() && (!local_only || s.spec.location == location)
        };
        let passes: &[bool] = if location.is_empty() {
            &[false]
        } else {
            &[true, false]
        };
        let mut chosen = None;
        'search: for &local_only in passes {
            for step in 0..n {
                let i = (c.next + step) % n;
                if usable(&c.servers[i], local_only) {
                    chosen = Some(i);
                    break 'search;
                }
            }
        }
        let i = chosen?;
        c.next = (i + 1) % n;
        let id = c.servers[i];
        let s = servers
            .get_mut(&id)
            .expect("class lists only known servers");
        let block = s.free.pop_front().expect("checked non-empty");
        let gen = self.next_gen;
        self.next_gen += 1;
        Some(BlockRef {
            server: id,
            block,
            gen,
        })
    }

    /// Returns a block to its server's free list (at the front: reused first)
    /// and gives it a fresh generation, returned as the invalidation to send
    /// to the storage server. Blocks of unknown servers are dropped.
    pub fn free(&mut self, b: BlockRef) -> Option<BlockClaim> {
        let s = self.servers.get_mut(&b.server)?;
        debug_assert!(!s.free.contains(&b.block), "double free of {b:?}");
        s.free.push_front(b.block);
        let gen = self.next_gen;
        self.next_gen += 1;
        Some(BlockClaim {
            server: b.server,
            addr: s.spec.addr.clone(),
            block: b.block,
            gen,
        })
    }

    pub fn status(&self, now_ms: u64) -> Vec<ServerStatus> {
        self.servers
            .iter()
            .map(|(id, s)| ServerStatus {
                id: *id,
                addr: s.spec.addr.clone(),
                class: s.spec.class,
                class_name: s.spec.class_name.clone(),
                medium: s.spec.medium.clone(),
                location: s.spec.location.clone(),
                block_size: s.spec.block_size,
                capacity_blocks: s.spec.num_blocks as u64,
                used_blocks: (s.spec.num_blocks as usize - s.free.len()) as u64,
                alive: s.alive,
                last_seen_ms: now_ms.saturating_sub(s.last_seen_ms),
            })
            .collect()
    }

    /// Total free blocks over live servers (for tests and status).
    pub fn free_blocks(&self) -> u64 {
        self.servers
            .values()
            .filter(|s| s.alive)
            .map(|s| s.free.len() as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(class: u8, loc: &str, n: u32) -> ServerSpec {
        ServerSpec {
            addr: format!("{loc}:{class}"),
            class,
            class_name: format!("c{class}"),
            medium: "dram".into(),
            location: loc.into(),
            block_size: 4096,
            first_block: 0,
            num_blocks: n,
        }
    }

    #[test]
    fn fills_classes_in_priority_order_round_robin() {
        let mut a = BlockAllocator::new(4096, 1);
        let d1 = a.register(spec(0, "h1", 4), 0).unwrap();
        let d2 = a.register(spec(0, "h2", 4), 0).unwrap();
        let f = a.register(spec(1, "h1", 64), 0).unwrap();
        let blocks: Vec<_> = (0..20).map(|_| a.allocate(NO_CLASS, "").unwrap()).collect();
        let on = |id| blocks.iter().filter(|b| b.server == id).count();
        assert_eq!((on(d1), on(d2), on(f)), (4, 4, 12));
        assert!(blocks[..8].iter().all(|b| b.server != f), "DRAM first");
        assert_ne!(blocks[0].server, blocks[1].server, "round-robin");
        let mut gens: Vec<_> = blocks.iter().map(|b| b.gen).collect();
        gens.dedup();
        assert_eq!(gens.len(), 20, "every allocation has a fresh generation");
        // Freeing DRAM blocks makes DRAM the first choice again.
        for b in &blocks[..8] {
            let inv = a.free(*b).unwrap();
            assert!(
                inv.gen > blocks[19].gen,
                "freeing stamps a fresh generation"
            );
        }
        let again = a.allocate(NO_CLASS, "").unwrap();
        assert_ne!(again.server, f);
        assert!(again.gen > blocks[19].gen);
    }

    #[test]
    fn preferred_class_then_lower_then_higher() {
        let mut a = BlockAllocator::new(4096, 1);
        let c0 = a.register(spec(0, "h", 1), 0).unwrap();
        let c1 = a.register(spec(1, "h", 1), 0).unwrap();
        let c2 = a.register(spec(2, "h", 1), 0).unwrap();
        assert_eq!(a.allocate(1, "").unwrap().server, c1);
        assert_eq!(a.allocate(1, "").unwrap().server, c2);
        assert_eq!(a.allocate(1, "").unwrap().server, c0);
        assert_eq!(
            a.allocate(1, "").unwrap_err().code,
            nodekernel_proto::ErrorCode::NoSpace
        );
    }

    #[test]
    fn slowest_first_fills_from_the_bottom() {
        let mut a = BlockAllocator::new(4096, 1);
        let c0 = a.register(spec(0, "h", 1), 0).unwrap();
        let c1 = a.register(spec(1, "h", 1), 0).unwrap();
        assert_eq!(a.allocate_slowest_first().unwrap().server, c1);
        assert_eq!(a.allocate_slowest_first().unwrap().server, c0);
        assert!(a.allocate_slowest_first().is_err());
    }

    #[test]
    fn location_preference_within_class() {
        let mut a = BlockAllocator::new(4096, 1);
        let h1 = a.register(spec(0, "h1", 2), 0).unwrap();
        let h2 = a.register(spec(0, "h2", 2), 0).unwrap();
        let got: Vec<_> = (0..4)
            .map(|_| a.allocate(NO_CLASS, "h2").unwrap().server)
            .collect();
        assert_eq!(got, vec![h2, h2, h1, h1]);
    }

    #[test]
    fn dead_servers_get_no_blocks_and_revive_on_heartbeat() {
        let mut a = BlockAllocator::new(4096, 1);
        let s1 = a.register(spec(0, "h", 2), 0).unwrap();
        let s2 = a.register(spec(0, "h", 2), 500).unwrap();
        assert_eq!(a.expire(1200, 1000), vec![s1]);
        assert!(!a.is_alive(s1));
        for _ in 0..2 {
            assert_eq!(a.allocate(NO_CLASS, "").unwrap().server, s2);
        }
        assert!(a.allocate(NO_CLASS, "").is_err());
        a.heartbeat(s1, 1300).unwrap();
        assert_eq!(a.allocate(NO_CLASS, "").unwrap().server, s1);
        assert!(a.heartbeat(99, 0).is_err());
    }

    #[test]
    fn freed_blocks_are_reused_first_with_a_newer_generation() {
        let mut a = BlockAllocator::new(4096, 1);
        a.register(spec(0, "h", 3), 0).unwrap();
        let b0 = a.allocate(NO_CLASS, "").unwrap();
        let claim = a.free(b0).unwrap();
        assert!(claim.gen > b0.gen, "the freed block is claimed anew");
        let next = a.allocate(NO_CLASS, "").unwrap();
        assert_eq!(
            next.block, b0.block,
            "the just-freed block (mapped, cached) goes before never-used ones"
        );
        assert!(
            next.gen > claim.gen,
            "its new owner's generation is newer than the claim"
        );
    }

    #[test]
    fn registration_checks() {
        let mut a = BlockAllocator::new(8192, 1);
        assert!(
            a.register(spec(0, "h", 1), 0).is_err(),
            "block size mismatch"
        );
        let mut s = spec(0, "h", 1);
        s.block_size = 8192;
        s.class = NO_CLASS;
        assert!(a.register(s, 0).is_err());
    }
}
