//! Block allocator: storage servers, their free blocks and block generations.
//!
//! Pure state, no I/O, no clock: callers pass the current time in
//! milliseconds. Placement rules (README.md, *Semantics in brief*, and `docs/tiering.md`):
//! - classes are tried in priority order (0 first); with a preferred class,
//!   that class first, then the lower-priority classes after it, and only
//!   then the higher-priority ones;
//! - within a class, servers are used round-robin; with a preferred location,
//!   servers at that location come first (storage class outranks location);
//! - dead and suspect servers get no new blocks.
//!
//! Freed blocks go to the top of a stack (LIFO): a replaced value's block
//! is the next one handed out, so its pages are already mapped by
//! co-located clients and warm in caches. Blocks never used yet are handed
//! out from a watermark, so a server's free list costs memory in proportion
//! to the blocks it has freed, not to its size: a registration of 2^31
//! blocks costs nothing up front. Safety against old handles does not
//! depend on the order: every allocation stamps the block with a new
//! generation, strictly greater than all earlier ones, which storage
//! servers check on every access, and freed blocks are claimed with one.
//!
//! Two kinds of state live here:
//! - *durable* state — servers, their free lists, round-robin positions and
//!   the next generation — changes only through the appliers
//!   (`take`, `give_back`, `add_server`, `retire`, `bump_gen`), called from
//!   [`MetaState::apply_effect`](crate::MetaState::apply_effect);
//! - *soft* state — liveness: last heartbeat, dead, suspect — is rebuilt
//!   from heartbeats after a restart and changes through `heartbeat`,
//!   `expire` and `suspect`. Decisions read it (dead servers get no
//!   blocks), but effects carry everything they chose, so replaying effects
//!   never needs it.
//!
//! [`AllocPlan`] decides a sequence of allocations and frees against this
//! state without changing it; the effects it returns reproduce exactly
//! that sequence when applied.

use nodekernel_proto::cap::{CapKey, CapSigner};
use nodekernel_proto::codec::{Dec, Enc};
use nodekernel_proto::{Error, ErrorCode, Result, ServerStatus, Traffic, NO_CLASS};
use std::collections::{BTreeMap, BTreeSet};

/// Most storage servers one metadata server accepts (registrations beyond
/// it are refused). Every server costs a few hundred bytes plus its freed
/// blocks.
pub const MAX_SERVERS: usize = 4096;
/// Most blocks one registration may export: 2^31 (2 PiB at 1 MiB blocks).
pub const MAX_SERVER_BLOCKS: u32 = 1 << 31;
/// Longest server identity.
pub const MAX_IDENTITY_LEN: usize = 64;

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
/// records can be read before any client has written one; for a block whose
/// lease changed hands it fences the old writer out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockClaim {
    pub server: u32,
    pub addr: String,
    pub block: u32,
    pub gen: u64,
    /// A freed small value's tag to clear, at `gen` (see
    /// `nodekernel_proto::store::Claim`).
    pub clear_tag_at: Option<u32>,
    /// The block joined the balloon: the server may give its memory back.
    pub release: bool,
    /// Zeros over the whole block at `gen`: a block handed to an
    /// encrypted node or slab (`MetaState::scrub`).
    pub scrub: bool,
    /// The capability for the claim (the whole block at `gen`).
    pub cap: nodekernel_proto::cap::Cap,
}

pub use nodekernel_proto::ServerSpec;

/// Free blocks of one server: a stack of freed blocks (reused first) over
/// a watermark of never-used ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeList {
    /// Freed blocks; the last one is handed out next.
    freed: Vec<u32>,
    /// Lowest block never handed out.
    fresh: u32,
    /// One past the server's last block.
    end: u32,
}

impl FreeList {
    fn new(first: u32, count: u32) -> FreeList {
        FreeList {
            freed: Vec::new(),
            fresh: first,
            end: first + count,
        }
    }

    pub fn len(&self) -> u64 {
        self.freed.len() as u64 + u64::from(self.end - self.fresh)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The block the `k`-th take from now would return.
    fn nth(&self, k: u64) -> Option<u32> {
        let stacked = self.freed.len() as u64;
        if k < stacked {
            return Some(self.freed[(stacked - 1 - k) as usize]);
        }
        let at = u64::from(self.fresh) + (k - stacked);
        (at < u64::from(self.end)).then_some(at as u32)
    }

    /// Removes `block` (which `nth(0)` returned when it was decided).
    fn take(&mut self, block: u32) {
        if self.freed.last() == Some(&block) {
            self.freed.pop();
        } else if block == self.fresh && self.fresh < self.end {
            self.fresh += 1;
        } else if let Some(i) = self.freed.iter().rposition(|b| *b == block) {
            debug_assert!(false, "block {block} taken out of order");
            self.freed.remove(i);
        } else {
            debug_assert!(false, "block {block} is not free");
        }
    }

    fn give_back(&mut self, block: u32) {
        self.freed.push(block);
    }

    /// Whether `block` is free (for invariant checks; linear in the freed
    /// blocks).
    pub fn contains(&self, block: u32) -> bool {
        (block >= self.fresh && block < self.end) || self.freed.contains(&block)
    }

    /// Every free block (for invariant checks).
    pub fn blocks(&self) -> impl Iterator<Item = u32> + '_ {
        self.freed.iter().copied().chain(self.fresh..self.end)
    }
}

/// Liveness of a server (soft state).
#[derive(Debug, Clone, Copy)]
struct Liveness {
    alive: bool,
    /// A client could not reach it: no new blocks until its next heartbeat.
    suspect: bool,
    last_seen_ms: u64,
    /// The sequence number of its last signed request taken (a heartbeat
    /// or a resize): one not above it is a replay. Zero after it
    /// registered its key.
    seq: u64,
    /// Its clock minus this server's, in seconds, as of its last signed
    /// request: capabilities for its blocks expire in its clock.
    clock_offset_s: i64,
}

#[derive(Debug)]
pub struct Server {
    pub spec: ServerSpec,
    /// `spec.cap_key` made ready: every location handed out mints a
    /// capability with it.
    signer: CapSigner,
    pub free: FreeList,
    live: Liveness,
    /// Being drained (soft state, like liveness): no new blocks.
    draining: bool,
    /// Blocks withdrawn from the capacity it exports (dynamic capacity:
    /// owned by the balloon, see `MetaState`); derived from durable state.
    ballooned: u32,
    /// Shrinking: its exported capacity is above the size it asked for,
    /// so it gets no new blocks while its blocks move away (soft state).
    shrinking: bool,
    /// Its counters as of its last heartbeat (soft state, for status).
    traffic: Traffic,
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
    /// Placement ignores the client's location (`placement =
    /// round-robin`); a runtime setting, not durable state.
    round_robin: bool,
    /// Encrypted classes (`[[class]] encrypt`): data of a node that is not
    /// encrypted never goes there. From the configuration, not durable
    /// state.
    sealed: BTreeSet<u8>,
}

/// What a registration does, decided by [`BlockAllocator::decide_register`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Registration {
    /// The same server instance registered again (a retry): its id.
    Known(u32),
    /// The same server instance (identity and incarnation), which kept its
    /// blocks across a restart of its process, registered from a new
    /// address: its id, and the ids of servers it replaces (another server
    /// that was at that address is gone; its blocks are lost).
    Readdressed { id: u32, replaces: Vec<u32> },
    /// A new server instance: its id, and the ids of servers it replaces (an
    /// earlier instance with the same identity, or another server at the
    /// same address), whose blocks are lost.
    New { id: u32, replaces: Vec<u32> },
}

impl Server {
    /// Blocks it exports now: its blocks less the ballooned ones.
    pub fn exported_blocks(&self) -> u64 {
        u64::from(self.spec.num_blocks - self.ballooned.min(self.spec.num_blocks))
    }

    /// Blocks in use (owned by nodes, slabs, moves, snapshots).
    pub fn used_blocks(&self) -> u64 {
        self.exported_blocks().saturating_sub(self.free.len())
    }

    pub fn ballooned_blocks(&self) -> u32 {
        self.ballooned
    }
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
            round_robin: false,
            sealed: BTreeSet::new(),
        }
    }

    /// Sets the encrypted classes (from the configuration).
    pub fn set_sealed(&mut self, classes: impl IntoIterator<Item = u8>) {
        self.sealed = classes.into_iter().collect();
    }

    /// Whether the data of a node that is not encrypted must stay out of
    /// `class`.
    pub fn is_sealed(&self, class: u8) -> bool {
        self.sealed.contains(&class)
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The generation the next allocation, free or fence gets.
    pub fn next_gen(&self) -> u64 {
        self.next_gen
    }

    pub fn servers(&self) -> impl Iterator<Item = (u32, &Server)> {
        self.servers.iter().map(|(id, s)| (*id, s))
    }

    pub fn server_count(&self) -> usize {
        self.servers.len()
    }

    // ----- registration ------------------------------------------------------

    /// The allocator in a checkpoint (`crate::checkpoint`): counters,
    /// servers with their free lists, and each class's round-robin
    /// position. Liveness is soft state and not kept.
    pub(crate) fn checkpoint(&self, e: &mut Enc) {
        e.u32(self.next_server)
            .u64(self.next_gen)
            .u32(self.servers.len() as u32);
        for (id, s) in &self.servers {
            e.u32(*id);
            s.spec.encode(e);
            e.u32(s.free.fresh)
                .u32(s.free.end)
                .u32(s.free.freed.len() as u32);
            for b in &s.free.freed {
                e.u32(*b);
            }
        }
        e.u32(self.classes.len() as u32);
        for (class, c) in &self.classes {
            e.u8(*class).u32(c.next as u32);
        }
    }

    /// The allocator of a checkpoint written by
    /// [`BlockAllocator::checkpoint`]; every server counts as seen at
    /// `now_ms`.
    /// Checkpoints before format 4 (`keyed` false) have no capability
    /// keys: those servers' blocks stay unusable until they register again.
    pub(crate) fn from_checkpoint(
        block_size: u32,
        d: &mut Dec,
        now_ms: u64,
        keyed: bool,
    ) -> Result<Self> {
        let mut a = BlockAllocator::new(block_size, 1);
        let next_server = d.u32()?;
        a.next_gen = d.u64()?;
        let n = d.count(4)?;
        for _ in 0..n {
            let id = d.u32()?;
            let spec = ServerSpec::decode_keyed(d, keyed)?;
            a.add_server(id, &spec, now_ms);
            let (fresh, end) = (d.u32()?, d.u32()?);
            let first = spec.first_block;
            if end != first.saturating_add(spec.num_blocks) || fresh < first || fresh > end {
                return Err(Error::protocol(format!(
                    "server {id}: free list {fresh}..{end} does not fit its blocks"
                )));
            }
            let nf = d.count(4)?;
            let mut freed = Vec::with_capacity(nf);
            for _ in 0..nf {
                freed.push(d.u32()?);
            }
            if let Some(s) = a.servers.get_mut(&id) {
                s.free = FreeList { freed, fresh, end };
            }
        }
        a.next_server = next_server;
        let nc = d.count(5)?;
        for _ in 0..nc {
            let (class, next) = (d.u8()?, d.u32()? as usize);
            if let Some(c) = a.classes.get_mut(&class) {
                c.next = next.min(c.servers.len().saturating_sub(1));
            }
        }
        Ok(a)
    }

    /// Checks a registration and decides what it does (see
    /// [`Registration`]). Bounded: a server costs memory in proportion to
    /// the blocks it frees, never to the blocks it exports.
    pub fn decide_register(&self, spec: &ServerSpec) -> Result<Registration> {
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
        if spec.num_blocks == 0 || spec.num_blocks > MAX_SERVER_BLOCKS {
            return Err(Error::invalid_argument(format!(
                "storage server {} registers {} blocks; a server exports 1 to {MAX_SERVER_BLOCKS}",
                spec.addr, spec.num_blocks
            )));
        }
        if spec.first_block.checked_add(spec.num_blocks).is_none() {
            return Err(Error::invalid_argument("block range overflows u32"));
        }
        if spec.addr.is_empty() {
            return Err(Error::invalid_argument(
                "a storage server must register an address",
            ));
        }
        let id_ok = !spec.identity.is_empty()
            && spec.identity.len() <= MAX_IDENTITY_LEN
            && spec
                .identity
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !id_ok {
            return Err(Error::invalid_argument(format!(
                "storage server {} sent identity {:?}: expected 1 to {MAX_IDENTITY_LEN} letters, digits, '-' or '_'",
                spec.addr, spec.identity
            )));
        }
        let mut replaces = Vec::new();
        let mut known = None;
        for (id, s) in &self.servers {
            if s.spec.identity == spec.identity {
                if s.spec.incarnation == spec.incarnation {
                    // It kept its blocks; its address and key (drawn anew
                    // by each process) may differ.
                    let moved = ServerSpec {
                        addr: spec.addr.clone(),
                        cap_key: spec.cap_key,
                        ..s.spec.clone()
                    };
                    if moved != *spec {
                        return Err(Error::invalid_argument(format!(
                            "storage server {} (identity {}) registered again with different settings",
                            spec.addr, spec.identity
                        )));
                    }
                    if s.spec.addr == spec.addr && s.spec.cap_key == spec.cap_key {
                        return Ok(Registration::Known(*id));
                    }
                    known = Some(*id);
                    continue;
                }
                replaces.push(*id);
            } else if s.spec.addr == spec.addr {
                // Only one process can serve an address: the old one is gone.
                replaces.push(*id);
            }
        }
        if let Some(id) = known {
            return Ok(Registration::Readdressed { id, replaces });
        }
        if self.servers.len() - replaces.len() >= MAX_SERVERS {
            return Err(Error::invalid_argument(format!(
                "this metadata server already has {MAX_SERVERS} storage servers (the limit)"
            )));
        }
        Ok(Registration::New {
            id: self.next_server,
            replaces,
        })
    }

    /// Adds a storage server under `id` (applier).
    pub(crate) fn add_server(&mut self, id: u32, spec: &ServerSpec, now_ms: u64) {
        self.next_server = self.next_server.max(id + 1);
        self.classes.entry(spec.class).or_default().servers.push(id);
        self.servers.insert(
            id,
            Server {
                free: FreeList::new(spec.first_block, spec.num_blocks),
                signer: CapSigner::new(&spec.cap_key),
                spec: spec.clone(),
                live: Liveness {
                    alive: true,
                    suspect: false,
                    last_seen_ms: now_ms,
                    seq: 0,
                    clock_offset_s: 0,
                },
                draining: false,
                ballooned: 0,
                shrinking: false,
                traffic: Traffic::default(),
            },
        );
    }

    /// Records a known server's new address and key (applier).
    pub(crate) fn readdress(&mut self, id: u32, addr: &str, cap_key: Option<&CapKey>) {
        if let Some(s) = self.servers.get_mut(&id) {
            s.spec.addr = addr.to_string();
            if let Some(k) = cap_key {
                if s.spec.cap_key != *k {
                    // A new process: its signed requests count anew.
                    s.live.seq = 0;
                }
                s.spec.cap_key = *k;
                s.signer = CapSigner::new(k);
            }
        }
    }

    /// The key server `id` checks capabilities with.
    pub fn cap_key(&self, id: u32) -> Option<&CapKey> {
        self.servers.get(&id).map(|s| &s.spec.cap_key)
    }

    /// What mints the capabilities server `id` checks.
    pub fn signer(&self, id: u32) -> Option<&CapSigner> {
        self.servers.get(&id).map(|s| &s.signer)
    }

    /// Removes a server for good (applier): its blocks are lost, and the
    /// nodes that still name it report `DataLost`.
    pub(crate) fn retire(&mut self, id: u32) {
        let Some(s) = self.servers.remove(&id) else {
            return;
        };
        if let Some(c) = self.classes.get_mut(&s.spec.class) {
            c.servers.retain(|x| *x != id);
            if c.next >= c.servers.len() {
                c.next = 0;
            }
            if c.servers.is_empty() {
                self.classes.remove(&s.spec.class);
            }
        }
    }

    // ----- liveness (soft state) ---------------------------------------------

    /// Records a heartbeat; a server that was declared dead or suspect and
    /// heartbeats again is usable again (its blocks were never handed out
    /// to others).
    pub fn heartbeat(&mut self, id: u32, now_ms: u64) -> Result<()> {
        let s = self.servers.get_mut(&id).ok_or_else(|| {
            Error::unknown_server(format!("storage server {id} is not registered"))
        })?;
        s.live.alive = true;
        s.live.suspect = false;
        s.live.last_seen_ms = now_ms;
        Ok(())
    }

    /// The sequence number a signed request of server `id` must exceed.
    pub fn last_seq(&self, id: u32) -> u64 {
        self.servers.get(&id).map_or(u64::MAX, |s| s.live.seq)
    }

    /// Takes signed request `seq` of server `id` (its clock in
    /// milliseconds) at `wall_ms` of this server's clock.
    pub fn accept_signed(&mut self, id: u32, seq: u64, wall_ms: u64) {
        if let Some(s) = self.servers.get_mut(&id) {
            s.live.seq = s.live.seq.max(seq);
            s.live.clock_offset_s = (seq as i64 - wall_ms as i64) / 1000;
        }
    }

    /// Server `id`'s clock minus this server's, in seconds (0 until it
    /// sent a signed request).
    pub fn clock_offset_s(&self, id: u32) -> i64 {
        self.servers.get(&id).map_or(0, |s| s.live.clock_offset_s)
    }

    /// Whether exactly `spec` is registered (registering it again changes
    /// nothing).
    pub fn is_registered(&self, spec: &ServerSpec) -> bool {
        self.servers.values().any(|s| s.spec == *spec)
    }

    /// The registered servers a registration of `spec` would retire or
    /// move (see [`BlockAllocator::decide_register`]): a metadata server
    /// lets it do so only when none of them proves it is still serving.
    pub fn displaced_by(&self, spec: &ServerSpec) -> Vec<ServerSpec> {
        self.servers
            .values()
            .filter(|s| {
                let same = s.spec.identity == spec.identity;
                (same && s.spec != *spec) || (!same && s.spec.addr == spec.addr)
            })
            .map(|s| s.spec.clone())
            .collect()
    }

    /// Records the counters a server reported with its heartbeat.
    pub fn set_traffic(&mut self, id: u32, traffic: Traffic) {
        if let Some(s) = self.servers.get_mut(&id) {
            s.traffic = traffic;
        }
    }

    /// Marks servers silent for longer than `dead_after_ms` as dead; returns
    /// the ids newly declared dead.
    pub fn expire(&mut self, now_ms: u64, dead_after_ms: u64) -> Vec<u32> {
        let dead = self.silent(now_ms, dead_after_ms);
        for id in &dead {
            self.declare_dead(*id);
        }
        dead
    }

    /// The servers alive but silent for longer than `dead_after_ms`.
    pub fn silent(&self, now_ms: u64, dead_after_ms: u64) -> Vec<u32> {
        self.servers
            .iter()
            .filter(|(_, s)| {
                s.live.alive && now_ms.saturating_sub(s.live.last_seen_ms) > dead_after_ms
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// Declares server `id` dead, until its next heartbeat.
    pub fn declare_dead(&mut self, id: u32) {
        if let Some(s) = self.servers.get_mut(&id) {
            s.live.alive = false;
        }
    }

    /// Servers dead and silent for longer than `retire_after_ms`, and dead
    /// servers that were drained empty (nothing of theirs can be lost: a
    /// drained server that is stopped leaves at once).
    pub fn retirable(&self, now_ms: u64, retire_after_ms: u64) -> Vec<u32> {
        self.servers
            .iter()
            .filter(|(_, s)| {
                !s.live.alive
                    && (now_ms.saturating_sub(s.live.last_seen_ms) > retire_after_ms
                        || (s.draining && s.used_blocks() == 0))
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// A client could not reach `id`: it gets no new blocks until it
    /// heartbeats again.
    pub fn suspect(&mut self, id: u32) {
        if let Some(s) = self.servers.get_mut(&id) {
            s.live.suspect = true;
        }
    }

    pub fn is_alive(&self, server: u32) -> bool {
        self.servers.get(&server).is_some_and(|s| s.live.alive)
    }

    /// Each storage class, in priority order, as tier migration sees it:
    /// the capacity and use of its servers that take new blocks.
    pub fn class_use(&self) -> Vec<crate::tier::ClassUse> {
        self.classes
            .iter()
            .map(|(class, c)| {
                let (mut capacity, mut used) = (0, 0);
                for s in c.servers.iter().filter(|id| self.usable(**id)) {
                    let s = &self.servers[s];
                    capacity += s.exported_blocks();
                    used += s.used_blocks();
                }
                crate::tier::ClassUse {
                    class: *class,
                    capacity,
                    used,
                    encrypted: self.is_sealed(*class),
                }
            })
            .collect()
    }

    /// Whether new blocks may go to `server`.
    pub(crate) fn usable(&self, server: u32) -> bool {
        self.servers
            .get(&server)
            .is_some_and(|s| s.live.alive && !s.live.suspect && !s.draining && !s.shrinking)
    }

    /// Placement within a class: round-robin over every server (`true`),
    /// or servers at the client's location first.
    pub fn set_round_robin(&mut self, on: bool) {
        self.round_robin = on;
    }

    /// Starts or ends draining `id`: a draining server gets no new blocks.
    pub fn set_draining(&mut self, id: u32, on: bool) {
        if let Some(s) = self.servers.get_mut(&id) {
            s.draining = on;
        }
    }

    pub fn is_draining(&self, id: u32) -> bool {
        self.servers.get(&id).is_some_and(|s| s.draining)
    }

    /// The server registered with identity `identity`, or at address
    /// `addr`.
    pub fn find_server(&self, name: &str) -> Option<u32> {
        self.servers
            .iter()
            .find(|(_, s)| s.spec.identity == name)
            .or_else(|| self.servers.iter().find(|(_, s)| s.spec.addr == name))
            .map(|(id, _)| *id)
    }

    pub fn server(&self, id: u32) -> Option<&Server> {
        self.servers.get(&id)
    }

    /// Live servers.
    pub fn alive_count(&self) -> usize {
        self.servers.values().filter(|s| s.live.alive).count()
    }

    pub fn server_addr(&self, server: u32) -> Option<&str> {
        self.servers.get(&server).map(|s| s.spec.addr.as_str())
    }

    pub fn server_class(&self, server: u32) -> Option<u8> {
        self.servers.get(&server).map(|s| s.spec.class)
    }

    // ----- planning ----------------------------------------------------------

    /// A planner for a sequence of allocations and frees (see [`AllocPlan`]).
    pub fn plan(&self) -> AllocPlan<'_> {
        AllocPlan {
            a: self,
            taken: BTreeMap::new(),
            given: BTreeMap::new(),
            rr: BTreeMap::new(),
            next_gen: self.next_gen,
            avoid: None,
        }
    }

    /// Blocks free on servers that may get new blocks.
    pub fn usable_free_blocks(&self) -> u64 {
        self.servers
            .iter()
            .filter(|(id, _)| self.usable(**id))
            .map(|(_, s)| s.free.len())
            .sum()
    }

    /// Class search order for a preference, for the data of a node that
    /// is `encrypted` or not (which skips the encrypted classes).
    pub(crate) fn class_order(&self, preferred: u8, encrypted: bool) -> Vec<u8> {
        let all: Vec<u8> = self
            .classes
            .keys()
            .copied()
            .filter(|c| encrypted || !self.is_sealed(*c))
            .collect();
        if preferred == NO_CLASS {
            return all;
        }
        let (higher, lower): (Vec<u8>, Vec<u8>) = all.into_iter().partition(|c| *c < preferred);
        lower.into_iter().chain(higher).collect()
    }

    // ----- appliers ----------------------------------------------------------

    /// Takes `block` of `server` out of its free list for generation `gen`
    /// and moves the class's round-robin position past the server.
    pub(crate) fn take(&mut self, server: u32, block: u32, gen: u64) {
        self.bump_gen(gen);
        let Some(s) = self.servers.get_mut(&server) else {
            return;
        };
        s.free.take(block);
        if let Some(c) = self.classes.get_mut(&s.spec.class) {
            if let Some(i) = c.servers.iter().position(|x| *x == server) {
                c.next = (i + 1) % c.servers.len();
            }
        }
    }

    /// Takes `block` of `server` out of its free list into the balloon
    /// (applier; see [`BlockAllocator::take`]).
    pub(crate) fn balloon(&mut self, server: u32, block: u32, gen: u64) {
        self.take(server, block, gen);
        if let Some(s) = self.servers.get_mut(&server) {
            s.ballooned += 1;
        }
    }

    /// One ballooned block of `server` is back in its free list.
    pub(crate) fn unballoon(&mut self, server: u32) {
        if let Some(s) = self.servers.get_mut(&server) {
            s.ballooned = s.ballooned.saturating_sub(1);
        }
    }

    /// The ballooned blocks of `server`, restored from a checkpoint.
    pub(crate) fn set_ballooned(&mut self, server: u32, n: u32) {
        if let Some(s) = self.servers.get_mut(&server) {
            s.ballooned = n;
        }
    }

    pub fn is_shrinking(&self, id: u32) -> bool {
        self.servers.get(&id).is_some_and(|s| s.shrinking)
    }

    /// Whether `server` is shrinking: it gets no new blocks.
    pub(crate) fn set_shrinking(&mut self, server: u32, on: bool) {
        if let Some(s) = self.servers.get_mut(&server) {
            s.shrinking = on;
        }
    }

    /// Returns `block` to `server`'s free list (reused first); `gen` is the
    /// generation it is claimed with. Blocks of retired servers are gone.
    pub(crate) fn give_back(&mut self, server: u32, block: u32, gen: u64) {
        self.bump_gen(gen);
        if let Some(s) = self.servers.get_mut(&server) {
            debug_assert!(!s.free.contains(block), "double free of block {block}");
            s.free.give_back(block);
        }
    }

    /// Records that generation `gen` was handed out.
    pub(crate) fn bump_gen(&mut self, gen: u64) {
        self.next_gen = self.next_gen.max(gen + 1);
    }

    // ----- reporting ---------------------------------------------------------

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
                capacity_blocks: s.exported_blocks(),
                used_blocks: s.used_blocks(),
                alive: s.live.alive,
                last_seen_ms: now_ms.saturating_sub(s.live.last_seen_ms),
                identity: s.spec.identity.clone(),
                draining: s.draining,
                traffic: s.traffic,
            })
            .collect()
    }

    /// The durable state as text, in a fixed order (for tests comparing
    /// states).
    #[cfg(test)]
    pub(crate) fn dump(&self) -> String {
        use std::fmt::Write;
        let mut out = format!(
            "bs {} next_server {} next_gen {}\n",
            self.block_size, self.next_server, self.next_gen
        );
        for (id, s) in &self.servers {
            let _ = writeln!(out, "server {id} {:?} free {:?}", s.spec, s.free);
        }
        for (c, class) in &self.classes {
            let _ = writeln!(out, "class {c} {:?} next {}", class.servers, class.next);
        }
        out
    }

    /// Total free blocks over live servers (for tests and status).
    pub fn free_blocks(&self) -> u64 {
        self.servers
            .values()
            .filter(|s| s.live.alive)
            .map(|s| s.free.len())
            .sum()
    }
}

/// Decides a sequence of allocations and frees against a
/// [`BlockAllocator`] without changing it. Each step returns what the
/// matching applier must do, in the same order, to reach the state the
/// plan assumed: `take` for an allocation, `give_back` for a free.
pub struct AllocPlan<'a> {
    a: &'a BlockAllocator,
    /// Blocks taken so far from each server's own free list.
    taken: BTreeMap<u32, u64>,
    /// Blocks freed by this plan, per server (taken back first, LIFO).
    given: BTreeMap<u32, Vec<u32>>,
    /// Round-robin positions moved by this plan.
    rr: BTreeMap<u8, usize>,
    next_gen: u64,
    avoid: Option<u32>,
}

impl AllocPlan<'_> {
    /// A free block of `server`, whatever its state (for the balloon).
    pub fn take_on(&mut self, server: u32) -> Option<BlockRef> {
        (self.a.servers.contains_key(&server) && self.free_left(server) > 0)
            .then(|| self.take_from(server))
    }

    /// Never allocate on `server` in this plan (it just failed a client).
    pub fn avoid(&mut self, server: u32) {
        self.avoid = Some(server);
    }

    /// A fresh generation (for a free or a fence).
    pub fn gen(&mut self) -> u64 {
        let g = self.next_gen;
        self.next_gen += 1;
        g
    }

    fn free_left(&self, server: u32) -> u64 {
        let s = &self.a.servers[&server];
        let given = self.given.get(&server).map_or(0, |v| v.len() as u64);
        s.free.len() - self.taken.get(&server).copied().unwrap_or(0) + given
    }

    fn usable(&self, server: u32, location: &str, local_only: bool) -> bool {
        self.avoid != Some(server)
            && self.a.usable(server)
            && self.free_left(server) > 0
            && (!local_only || self.a.servers[&server].spec.location == location)
    }

    /// Whether `server` may get new data in this plan (alive, not avoided,
    /// free blocks or not).
    pub(crate) fn may_use(&self, server: u32) -> bool {
        self.avoid != Some(server) && self.a.usable(server)
    }

    /// Free blocks left on servers that may get new blocks.
    pub fn usable_free_blocks(&self) -> u64 {
        self.a
            .servers
            .keys()
            .filter(|id| self.avoid != Some(**id) && self.a.usable(**id))
            .map(|id| self.free_left(*id))
            .sum()
    }

    fn take_from(&mut self, server: u32) -> BlockRef {
        let block = match self.given.get_mut(&server).and_then(|v| v.pop()) {
            Some(b) => b,
            None => {
                let k = self.taken.entry(server).or_default();
                let b = self.a.servers[&server]
                    .free
                    .nth(*k)
                    .expect("free_left checked");
                *k += 1;
                b
            }
        };
        BlockRef {
            server,
            block,
            gen: self.gen(),
        }
    }

    pub(crate) fn allocate_in(&mut self, class: u8, location: &str) -> Option<BlockRef> {
        let c = self.a.classes.get(&class)?;
        let n = c.servers.len();
        let next = self.rr.get(&class).copied().unwrap_or(c.next);
        let passes: &[bool] = if location.is_empty() || self.a.round_robin {
            &[false]
        } else {
            &[true, false]
        };
        for &local_only in passes {
            for step in 0..n {
                let i = (next + step) % n;
                if self.usable(c.servers[i], location, local_only) {
                    self.rr.insert(class, (i + 1) % n);
                    return Some(self.take_from(c.servers[i]));
                }
            }
        }
        None
    }

    /// Allocates one block following the placement rules, or `NoSpace`,
    /// in any class (containers' child records: namespace metadata, see
    /// `docs/encryption.md`).
    pub fn allocate(&mut self, preferred_class: u8, location: &str) -> Result<BlockRef> {
        self.allocate_where(preferred_class, location, true)
    }

    /// Allocates one block of a data node that is `encrypted` or not (not:
    /// never in an encrypted class), or `NoSpace`. For an encrypted node
    /// the generation just below the block's is kept unused: the block is
    /// scrubbed at it (`MetaState::scrub`).
    pub fn allocate_data(
        &mut self,
        preferred_class: u8,
        location: &str,
        encrypted: bool,
    ) -> Result<BlockRef> {
        if encrypted {
            self.gen();
        }
        self.allocate_where(preferred_class, location, encrypted)
    }

    /// Allocates one block in the classes a unit that may (`sealed_ok`)
    /// or may not go to encrypted classes may use (a move's target: the
    /// copy overwrites the whole block).
    pub fn allocate_where(
        &mut self,
        preferred_class: u8,
        location: &str,
        sealed_ok: bool,
    ) -> Result<BlockRef> {
        let encrypted = sealed_ok;
        for class in self.a.class_order(preferred_class, encrypted) {
            if let Some(b) = self.allocate_in(class, location) {
                return Ok(b);
            }
        }
        let e = self.no_space();
        if encrypted || self.a.sealed.is_empty() || e.code != ErrorCode::NoSpace {
            return Err(e);
        }
        Err(Error::no_space(format!(
            "{}; a node that is not encrypted never goes to the encrypted classes {:?} (docs/encryption.md)",
            e.message, self.a.sealed
        )))
    }

    /// Allocates one block from the lowest-priority class with room (then
    /// upwards): for capacity-hungry, rarely hot data such as child records,
    /// so the fast classes stay free for node data.
    pub fn allocate_slowest_first(&mut self) -> Result<BlockRef> {
        let order: Vec<u8> = self.a.classes.keys().rev().copied().collect();
        for class in order {
            if let Some(b) = self.allocate_in(class, "") {
                return Ok(b);
            }
        }
        Err(self.no_space())
    }

    pub(crate) fn no_space(&self) -> Error {
        let alive: Vec<&Server> = self.a.servers.values().filter(|s| s.live.alive).collect();
        let count = |f: fn(&Server) -> bool| alive.iter().filter(|s| f(s)).count();
        let mut why = String::new();
        for (n, what) in [
            (
                count(|s| s.draining),
                "being drained take no new blocks (`nk drain SERVER --cancel` gives one back)",
            ),
            (
                count(|s| s.shrinking && !s.draining),
                "are shrinking (dynamic capacity, `nk store resize`) and take no new blocks until \
                 their blocks moved away",
            ),
            (
                count(|s| !s.shrinking && s.ballooned >= s.spec.num_blocks),
                "export no blocks (resized to nothing: `nk store resize`)",
            ),
            (
                count(|s| s.live.suspect && !s.shrinking && !s.draining),
                "could not be reached by a client and take no new blocks until their next \
                 heartbeat",
            ),
        ] {
            if n > 0 {
                why.push_str(&format!("; {n} storage server(s) {what}"));
            }
        }
        if self.a.servers.is_empty() {
            Error::unavailable(format!(
                "{} (the cluster may still be starting; `nk status --wait` waits for it)",
                nodekernel_proto::meta::NO_STORAGE_SERVER_YET
            ))
        } else if alive.is_empty() {
            Error::unavailable(
                "no storage server is alive: every registered storage server is dead or unreachable",
            )
        } else {
            Error::no_space(format!(
                "every storage class is full (or has no live storage server){why}"
            ))
        }
    }

    /// Frees `b`: returns the generation to claim it with, and makes it the
    /// next block this plan hands out on its server.
    pub fn free(&mut self, b: BlockRef) -> u64 {
        if self.a.servers.contains_key(&b.server) {
            self.given.entry(b.server).or_default().push(b.block);
        }
        self.gen()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(class: u8, loc: &str, n: u32) -> ServerSpec {
        ServerSpec {
            addr: format!("{loc}:{class}:{n}"),
            class,
            class_name: format!("c{class}"),
            medium: "dram".into(),
            location: loc.into(),
            block_size: 4096,
            first_block: 0,
            num_blocks: n,
            identity: format!("id-{loc}-{class}-{n}"),
            incarnation: 1,
            cap_key: [n as u8; 32],
        }
    }

    fn register(a: &mut BlockAllocator, s: ServerSpec) -> u32 {
        match a.decide_register(&s).unwrap() {
            Registration::New { id, replaces } => {
                for r in replaces {
                    a.retire(r);
                }
                a.add_server(id, &s, 0);
                id
            }
            Registration::Known(id) => id,
            Registration::Readdressed { id, replaces } => {
                for r in replaces {
                    a.retire(r);
                }
                a.readdress(id, &s.addr, None);
                id
            }
        }
    }

    /// Allocates through a one-step plan and applies it.
    fn alloc(a: &mut BlockAllocator, class: u8, loc: &str) -> Result<BlockRef> {
        let b = a.plan().allocate(class, loc)?;
        a.take(b.server, b.block, b.gen);
        Ok(b)
    }

    fn free(a: &mut BlockAllocator, b: BlockRef) -> u64 {
        let gen = a.plan().free(b);
        a.give_back(b.server, b.block, gen);
        gen
    }

    #[test]
    fn fills_classes_in_priority_order_round_robin() {
        let mut a = BlockAllocator::new(4096, 1);
        let d1 = register(&mut a, spec(0, "h1", 4));
        let d2 = register(&mut a, spec(0, "h2", 4));
        let f = register(&mut a, spec(1, "h1", 64));
        let blocks: Vec<_> = (0..20)
            .map(|_| alloc(&mut a, NO_CLASS, "").unwrap())
            .collect();
        let on = |id| blocks.iter().filter(|b| b.server == id).count();
        assert_eq!((on(d1), on(d2), on(f)), (4, 4, 12));
        assert!(blocks[..8].iter().all(|b| b.server != f), "DRAM first");
        assert_ne!(blocks[0].server, blocks[1].server, "round-robin");
        let mut gens: Vec<_> = blocks.iter().map(|b| b.gen).collect();
        gens.dedup();
        assert_eq!(gens.len(), 20, "every allocation has a fresh generation");
        for b in &blocks[..8] {
            assert!(
                free(&mut a, *b) > blocks[19].gen,
                "freeing stamps a fresh generation"
            );
        }
        let again = alloc(&mut a, NO_CLASS, "").unwrap();
        assert_ne!(again.server, f, "freed DRAM is the first choice again");
        assert!(again.gen > blocks[19].gen);
    }

    #[test]
    fn a_plan_matches_what_its_steps_apply() {
        let mut a = BlockAllocator::new(4096, 10);
        register(&mut a, spec(0, "h1", 3));
        register(&mut a, spec(0, "h2", 3));
        let first = alloc(&mut a, NO_CLASS, "").unwrap();
        // Decide several steps at once, free included, then apply them.
        let mut p = a.plan();
        let x = p.allocate(NO_CLASS, "").unwrap();
        let y = p.allocate(NO_CLASS, "").unwrap();
        let g = p.free(first);
        let z1 = p.allocate(0, "").unwrap();
        let z2 = p.allocate(0, "").unwrap();
        let again = [z1, z2]
            .into_iter()
            .find(|z| z.server == first.server)
            .expect("round-robin comes back to the first server");
        assert_eq!(
            again.block, first.block,
            "a block freed in the plan is handed out next on its server"
        );
        assert!(x.gen < y.gen && y.gen < g && g < z1.gen && z1.gen < z2.gen);
        a.take(x.server, x.block, x.gen);
        a.take(y.server, y.block, y.gen);
        a.give_back(first.server, first.block, g);
        a.take(z1.server, z1.block, z1.gen);
        a.take(z2.server, z2.block, z2.gen);
        // A fresh plan now continues exactly where that one ended.
        let w = a.plan().allocate(NO_CLASS, "").unwrap();
        assert!(w.gen > z2.gen);
        assert_eq!(a.free_blocks(), 6 - 4);
    }

    #[test]
    fn preferred_class_then_lower_then_higher() {
        let mut a = BlockAllocator::new(4096, 1);
        let c0 = register(&mut a, spec(0, "h", 1));
        let c1 = register(&mut a, spec(1, "h", 1));
        let c2 = register(&mut a, spec(2, "h", 1));
        assert_eq!(alloc(&mut a, 1, "").unwrap().server, c1);
        assert_eq!(alloc(&mut a, 1, "").unwrap().server, c2);
        assert_eq!(alloc(&mut a, 1, "").unwrap().server, c0);
        assert_eq!(
            alloc(&mut a, 1, "").unwrap_err().code,
            nodekernel_proto::ErrorCode::NoSpace
        );
    }

    #[test]
    fn slowest_first_fills_from_the_bottom() {
        let mut a = BlockAllocator::new(4096, 1);
        let c0 = register(&mut a, spec(0, "h", 1));
        let c1 = register(&mut a, spec(1, "h", 1));
        let mut p = a.plan();
        assert_eq!(p.allocate_slowest_first().unwrap().server, c1);
        assert_eq!(p.allocate_slowest_first().unwrap().server, c0);
        assert!(p.allocate_slowest_first().is_err());
    }

    #[test]
    fn location_preference_within_class() {
        let mut a = BlockAllocator::new(4096, 1);
        let h1 = register(&mut a, spec(0, "h1", 2));
        let h2 = register(&mut a, spec(0, "h2", 2));
        let got: Vec<_> = (0..4)
            .map(|_| alloc(&mut a, NO_CLASS, "h2").unwrap().server)
            .collect();
        assert_eq!(got, vec![h2, h2, h1, h1]);
    }

    #[test]
    fn dead_and_suspect_servers_get_no_blocks_until_they_heartbeat() {
        let mut a = BlockAllocator::new(4096, 1);
        let s1 = register(&mut a, spec(0, "h", 2));
        let s2 = register(&mut a, spec(0, "h2", 2));
        a.heartbeat(s2, 500).unwrap();
        assert_eq!(a.expire(1200, 1000), vec![s1]);
        assert!(!a.is_alive(s1));
        let mut p = a.plan();
        for _ in 0..2 {
            assert_eq!(p.allocate(NO_CLASS, "").unwrap().server, s2);
        }
        assert!(p.allocate(NO_CLASS, "").is_err());
        a.heartbeat(s1, 1300).unwrap();
        assert_eq!(a.plan().allocate(NO_CLASS, "").unwrap().server, s1);
        a.suspect(s1);
        assert_eq!(a.plan().allocate(NO_CLASS, "").unwrap().server, s2);
        a.heartbeat(s1, 1400).unwrap();
        let mut p = a.plan();
        p.avoid(s2);
        assert_eq!(p.allocate(NO_CLASS, "").unwrap().server, s1);
        assert!(a.heartbeat(99, 0).is_err());
    }

    #[test]
    fn freed_blocks_are_reused_first_with_a_newer_generation() {
        let mut a = BlockAllocator::new(4096, 1);
        register(&mut a, spec(0, "h", 3));
        let b0 = alloc(&mut a, NO_CLASS, "").unwrap();
        let claim = free(&mut a, b0);
        assert!(claim > b0.gen, "the freed block is claimed anew");
        let next = alloc(&mut a, NO_CLASS, "").unwrap();
        assert_eq!(
            next.block, b0.block,
            "the just-freed block (mapped, cached) goes before never-used ones"
        );
        assert!(next.gen > claim);
    }

    #[test]
    fn huge_registrations_cost_nothing_up_front() {
        let mut a = BlockAllocator::new(4096, 1);
        let mut s = spec(0, "h", MAX_SERVER_BLOCKS);
        let id = register(&mut a, s.clone());
        assert_eq!(a.free_blocks(), MAX_SERVER_BLOCKS as u64);
        let b = alloc(&mut a, NO_CLASS, "").unwrap();
        assert_eq!((b.server, b.block), (id, 0));
        s.num_blocks = MAX_SERVER_BLOCKS + 1;
        s.identity = "other".into();
        s.addr = "other:1".into();
        assert!(a.decide_register(&s).is_err(), "over the per-server limit");
        s.num_blocks = u32::MAX;
        assert!(a.decide_register(&s).is_err());
    }

    #[test]
    fn registration_is_idempotent_and_a_new_incarnation_replaces_the_old() {
        let mut a = BlockAllocator::new(4096, 1);
        let s = spec(0, "h", 4);
        let id = register(&mut a, s.clone());
        assert_eq!(a.decide_register(&s).unwrap(), Registration::Known(id));
        let mut changed = s.clone();
        changed.num_blocks = 5;
        assert!(
            a.decide_register(&changed).is_err(),
            "same instance, other settings"
        );
        let mut restarted = s.clone();
        restarted.incarnation = 2;
        match a.decide_register(&restarted).unwrap() {
            Registration::New { id: new, replaces } => {
                assert_ne!(new, id);
                assert_eq!(replaces, vec![id], "the old instance's blocks are lost");
            }
            r => panic!("{r:?}"),
        }
        let mut other_at_same_addr = s.clone();
        other_at_same_addr.identity = "someone-else".into();
        assert!(matches!(
            a.decide_register(&other_at_same_addr).unwrap(),
            Registration::New { replaces, .. } if replaces == vec![id]
        ));
    }

    #[test]
    fn a_server_that_kept_its_blocks_may_come_back_at_another_address() {
        let mut a = BlockAllocator::new(4096, 1);
        let s = spec(0, "h", 4);
        let id = register(&mut a, s.clone());
        let b = alloc(&mut a, 0, "").unwrap();
        let squatter = register(&mut a, spec(0, "x", 4));
        let mut moved = s.clone();
        moved.addr = a.server_addr(squatter).unwrap().to_string();
        assert_eq!(
            a.decide_register(&moved).unwrap(),
            Registration::Readdressed {
                id,
                replaces: vec![squatter]
            },
            "same instance: kept, and the server gone from that address is replaced"
        );
        assert_eq!(register(&mut a, moved.clone()), id);
        assert_eq!(a.server_addr(id), Some(moved.addr.as_str()));
        assert!(a.server(squatter).is_none());
        assert!(
            !a.server(id).unwrap().free.contains(b.block),
            "its blocks stay in use"
        );
        assert_eq!(a.decide_register(&moved).unwrap(), Registration::Known(id));
        let mut changed = moved.clone();
        changed.addr = "elsewhere:1".into();
        changed.num_blocks = 3;
        assert!(
            a.decide_register(&changed).is_err(),
            "a new address does not excuse other settings"
        );
    }

    #[test]
    fn registration_checks() {
        let mut a = BlockAllocator::new(8192, 1);
        assert!(
            a.decide_register(&spec(0, "h", 1)).is_err(),
            "block size mismatch"
        );
        let mut s = spec(0, "h", 1);
        s.block_size = 8192;
        s.class = NO_CLASS;
        assert!(a.decide_register(&s).is_err());
        for bad in ["", "has space", &"x".repeat(65)] {
            let mut s = spec(0, "h", 1);
            s.block_size = 8192;
            s.identity = bad.to_string();
            assert!(a.decide_register(&s).is_err(), "identity {bad:?}");
        }
        let mut s = spec(0, "h", 1);
        s.block_size = 8192;
        s.num_blocks = 0;
        assert!(a.decide_register(&s).is_err(), "empty server");
        // The per-metadata-server limit.
        for i in 0..MAX_SERVERS {
            let mut s = spec(0, "h", 1);
            s.block_size = 8192;
            s.addr = format!("h:{i}");
            s.identity = format!("s{i}");
            register(&mut a, s);
        }
        let mut s = spec(0, "h", 1);
        s.block_size = 8192;
        s.addr = "one-too-many:1".into();
        s.identity = "one-too-many".into();
        assert!(a.decide_register(&s).is_err());
        let _ = &mut a;
    }
}
