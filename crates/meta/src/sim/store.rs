//! The simulation's storage servers: the model of one (per block, the
//! generation it holds and who wrote its bytes), and the steps that
//! register them, heartbeat, deliver their claims late and out of order,
//! and make them die, rejoin or restart wiped.

use super::*;

/// A model storage server: per block, the generation it holds and who
/// wrote the bytes in it (node, generation written with), by the offset
/// the write started at (0 for a whole block, a piece's offset).
pub(super) struct Store {
    pub(super) identity: String,
    pub(super) addr: String,
    pub(super) class: u8,
    pub(super) num_blocks: u32,
    pub(super) incarnation: u64,
    /// The id the metadata server gave its current incarnation.
    pub(super) id: Option<u32>,
    /// The sequence number of its last signed request.
    pub(super) seq: u64,
    pub(super) up: bool,
    pub(super) gens: Vec<u64>,
    pub(super) bytes: Vec<BTreeMap<u32, (NodeId, u64)>>,
    /// Per block, the small values (by offset) whose tags were cleared:
    /// reads through them get `Stale` until a put writes the piece again.
    pub(super) cleared: Vec<BTreeSet<u32>>,
}

impl Store {
    pub(super) fn spec(&self) -> ServerSpec {
        ServerSpec {
            addr: self.addr.clone(),
            class: self.class,
            class_name: format!("class{}", self.class),
            medium: "dram".into(),
            location: "host".into(),
            block_size: BS,
            first_block: 0,
            num_blocks: self.num_blocks,
            identity: self.identity.clone(),
            incarnation: self.incarnation,
            cap_key: self.cap_key(),
        }
    }

    /// The capability key of incarnation `incarnation` (a real server
    /// draws a random one per process).
    pub(super) fn key_of(&self, incarnation: u64) -> CapKey {
        let mut k = [0u8; 32];
        k[..8].copy_from_slice(&incarnation.to_le_bytes());
        let id = self.identity.as_bytes();
        let n = id.len().min(24);
        k[8..8 + n].copy_from_slice(&id[..n]);
        k
    }

    pub(super) fn cap_key(&self) -> CapKey {
        self.key_of(self.incarnation)
    }

    /// `req` signed as this store signs its heartbeats and resizes.
    pub(super) fn signed(&mut self, mut req: MetaRequest) -> MetaRequest {
        self.seq += 1;
        req.sign(&self.cap_key(), self.seq);
        req
    }

    /// Checks a capability as a storage server does, for a request that
    /// `needs` these rights: `Ok(false)` refuses it (a location from before
    /// this incarnation, as a real server's `Stale`); one that verifies
    /// under no key this server ever had, or does not allow what the
    /// request does, was minted wrong, and fails the run. (Time stands
    /// still for capabilities here: expiry is the cluster tests'.)
    pub(super) fn check_cap(
        &self,
        cap: &Cap,
        block: u32,
        gen: u64,
        offset: u32,
        needs: Rights,
    ) -> Result<bool, String> {
        let u = Use {
            block,
            gen,
            offset,
            len: 0,
            needs,
            now: 0,
        };
        if cap.check(&self.cap_key(), u).is_ok() {
            return Ok(true);
        }
        if (1..self.incarnation).any(|i| cap.check(&self.key_of(i), u).is_ok()) {
            return Ok(false);
        }
        Err(format!(
            "server {} refused a capability the metadata server minted for block {block} at \
             generation {gen}, offset {offset}: {cap:?}",
            self.addr
        ))
    }

    /// A write under `gen` of the node's block at `loc` (a whole block, or
    /// a piece at `loc.offset`): newer claims the block, older is refused,
    /// and so is one without a capability for it.
    pub(super) fn write(
        &mut self,
        loc: &BlockLoc,
        whole: bool,
        node: NodeId,
    ) -> Result<bool, String> {
        let start = if loc.tag != 0 {
            loc.offset - TAG_LEN
        } else {
            loc.offset
        };
        if !self.check_cap(&loc.cap, loc.block, loc.gen, start, Rights::WRITE)? {
            return Ok(false);
        }
        Ok(self.write_checked(loc, whole, node))
    }

    pub(super) fn write_checked(&mut self, loc: &BlockLoc, whole: bool, node: NodeId) -> bool {
        let b = loc.block as usize;
        if loc.gen < self.gens[b] {
            return false;
        }
        self.gens[b] = loc.gen;
        if whole {
            self.bytes[b].clear();
            self.cleared[b].clear();
        }
        self.bytes[b].insert(loc.offset, (node, loc.gen));
        self.cleared[b].remove(&loc.offset);
        true
    }

    /// A claim: newer claims the block; with `clear_tag_at`, the tag of
    /// the piece there is cleared (a write under `gen`: refused if older).
    pub(super) fn claim(&mut self, block: u32, gen: u64, clear_tag_at: Option<u32>) {
        let b = block as usize;
        if gen > self.gens[b] {
            self.gens[b] = gen;
        }
        if let Some(at) = clear_tag_at {
            if gen == self.gens[b] {
                self.cleared[b].insert(at + TAG_LEN);
            }
        }
    }

    /// Comes back with its memory wiped, as a new incarnation.
    pub(super) fn wipe(&mut self) {
        self.incarnation += 1;
        self.id = None;
        self.gens.iter_mut().for_each(|g| *g = 0);
        self.bytes.iter_mut().for_each(|b| b.clear());
        self.cleared.iter_mut().for_each(|b| b.clear());
    }
}

impl Sim {
    pub(super) fn register(&mut self, i: usize) -> Result<(), String> {
        let spec = self.stores[i].spec();
        match self.exec(MetaRequest::Register(spec.clone()))? {
            Ok(MetaReply::Registered { server }) => {
                // Registering again (a retry) is idempotent.
                match self.exec(MetaRequest::Register(spec))? {
                    Ok(MetaReply::Registered { server: again }) if again == server => {}
                    r => return Err(format!("a repeated registration answered {r:?}")),
                }
                self.stores[i].id = Some(server);
                Ok(())
            }
            r => Err(format!("registration of store {i} answered {r:?}")),
        }
    }

    pub(super) fn heartbeats(&mut self) -> Result<(), String> {
        for i in 0..self.stores.len() {
            let s = &self.stores[i];
            if s.up && self.rng.chance(70) {
                if let Some(server) = s.id {
                    let heartbeat = self.stores[i].signed(MetaRequest::Heartbeat {
                        server,
                        traffic: Default::default(),
                        signed: Default::default(),
                    });
                    if let Err(code) = self.exec(heartbeat)? {
                        // Retired while it was away: it registers anew.
                        if code != ErrorCode::UnknownServer {
                            return Err(format!("heartbeat refused with {code:?}"));
                        }
                        self.stores[i].wipe();
                        self.register(i)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Delivers a random part of the queued claims, in random order, to
    /// stores that are up (a down store misses them, as a real one would).
    pub(super) fn deliver_claims(&mut self) {
        let mut kept = Vec::new();
        let claims = std::mem::take(&mut self.claims);
        for c in claims {
            if self.rng.chance(60) {
                if let Some(s) = self.store_of(c.server) {
                    if s.up {
                        let at = c.clear_tag_at.unwrap_or(0);
                        let needs = if c.clear_tag_at.is_some() {
                            Rights::MANAGE
                        } else {
                            Rights::READ
                        };
                        if s.check_cap(&c.cap, c.block, c.gen, at, needs)
                            .expect("claims are minted right")
                        {
                            s.claim(c.block, c.gen, c.clear_tag_at);
                        }
                    }
                }
            } else {
                kept.push(c);
            }
        }
        self.claims = kept;
    }

    pub(super) fn store_of(&mut self, server: u32) -> Option<&mut Store> {
        self.stores.iter_mut().find(|s| s.id == Some(server))
    }

    pub(super) fn store_fault(&mut self) -> Result<(), String> {
        let i = self.rng.below(self.stores.len() as u64) as usize;
        if self.stores[i].up {
            self.stores[i].up = false;
            self.stats.store_deaths += 1;
            self.trace
                .push(format!("t={} store {i} goes down", self.now));
            return Ok(());
        }
        self.stores[i].up = true;
        let roll = self.rng.below(100);
        if roll < 40 {
            // A restart: memory wiped, a new incarnation registers.
            self.stores[i].wipe();
            self.trace
                .push(format!("t={} store {i} restarts", self.now));
            self.register(i)
        } else if roll < 60 {
            // A persistent store's restart: its blocks and generations kept,
            // the same incarnation registers from a new address.
            self.stats.store_moves += 1;
            let s = &mut self.stores[i];
            s.addr = format!("store{i}-{}:7000", self.stats.store_moves);
            self.trace.push(format!(
                "t={} store {i} restarts keeping its blocks, at {}",
                self.now, self.stores[i].addr
            ));
            self.register(i)
        } else {
            // A network blip: it just rejoins.
            self.trace.push(format!("t={} store {i} rejoins", self.now));
            Ok(())
        }
    }

    // ----- clients -----------------------------------------------------------
}
