//! The simulation's background work, as the metadata server's shell
//! drives it: the ticker (dead and retired servers, the sweep after
//! vanished writers), snapshots, block and slab moves copied store to
//! store in steps of their own, and drains.

use super::*;

impl Sim {
    /// The ticker of the server shell: liveness, retirement, sweeping
    /// abandoned puts, one reaping step.
    pub(super) fn tick(&mut self) -> Result<(), String> {
        if let Some(d) = self.st.decide_liveness(self.now, DEAD_AFTER_MS) {
            self.commit(d)?;
        }
        if let Some(d) = self.st.decide_retire(self.now, RETIRE_AFTER_MS) {
            self.commit(d)?;
        }
        if let Some(d) = self.st.decide_sweep(self.now, LEASE_MS) {
            self.sweep(d)?;
        }
        if let Some(d) = self.st.decide_reap() {
            self.commit(d)?;
        }
        if let Some(d) = self.st.decide_snapshot_expiry(self.now) {
            self.commit(d)?;
            let running: BTreeSet<u64> = self.st.snapshots().ids().collect();
            self.snaps.retain(|s| running.contains(&s.id));
        }
        // What the drainer does after moves: shrinking stores balloon the
        // blocks the moves freed.
        for (id, target) in self.st.shrinking() {
            if let Ok(d) = self.st.decide_resize(id, target) {
                self.commit(d)?;
            }
        }
        Ok(())
    }

    /// Commits a sweep and checks what it left of the writers that
    /// vanished: no lease lapsed longer ago than the grace is still held,
    /// and a node whose lease lapsed kept every block its published bytes
    /// need (reads check those bytes are still its own) and nothing past
    /// them (`check_invariants`).
    pub(super) fn sweep(&mut self, d: crate::state::Decision) -> Result<(), String> {
        let lapsed: Vec<(NodeId, usize, u64)> = d
            .effects
            .iter()
            .filter_map(|e| match e {
                Effect::LeaseCleared { node } => self.st.ns().get(*node),
                _ => None,
            })
            .map(|n| (n.id, n.blocks.len(), n.size))
            .collect();
        self.stats.lapses += lapsed.len() as u64;
        self.commit(d)?;
        for (id, before, size) in lapsed {
            let Some(n) = self.st.ns().get(id) else {
                continue;
            };
            let need = size.div_ceil(self.st.block_size_of(n) as u64) as usize;
            if n.piece.is_none() && n.blocks.len() < need.min(before) {
                return Err(format!(
                    "node {id}'s lease lapsed and it kept {} of the {need} blocks its {size} published bytes need",
                    n.blocks.len()
                ));
            }
        }
        let late = self.now.saturating_sub(LEASE_MS);
        if let Some(n) = self.st.ns().nodes().find(|n| {
            n.linked && !n.ty.is_container() && n.lease.is_some_and(|l| l.expires_ms <= late)
        }) {
            return Err(format!(
                "node {} still holds a write lease that expired at {:?}, after the sweep at {}",
                n.id, n.lease, self.now
            ));
        }
        Ok(())
    }

    /// Begins a snapshot, reads one of a running snapshot's blocks, or
    /// ends one. A read finds the block where the metadata server says it
    /// is now (its node may be gone: the block is then held) and checks
    /// that it still holds the bytes written for the node the snapshot
    /// listed — so a block a snapshot pins is never handed out again.
    pub(super) fn snapshot_step(&mut self) -> Result<(), String> {
        let roll = self.rng.below(100);
        if self.snaps.is_empty() || roll < 15 {
            return self.snapshot_begin();
        }
        let i = self.rng.below(self.snaps.len() as u64) as usize;
        if roll < 25 {
            let id = self.snaps.swap_remove(i).id;
            return match self.exec(MetaRequest::SnapshotEnd { id })? {
                Ok(MetaReply::Done) => Ok(()),
                r => Err(format!("ending snapshot {id} answered {r:?}")),
            };
        }
        let snap = &self.snaps[i];
        if snap.blocks.is_empty() {
            return Ok(());
        }
        let id = snap.id;
        let (node, index, then, incarnation) =
            snap.blocks[self.rng.below(snap.blocks.len() as u64) as usize].clone();
        let req = MetaRequest::SnapshotLocate {
            id,
            node,
            index,
            server: then.server,
            block: then.block,
        };
        let now = match self.exec(req)? {
            Ok(MetaReply::Located(loc)) => loc,
            Ok(r) => return Err(format!("locate answered {r:?}")),
            // Its server is dead: the snapshot reports it.
            Err(ErrorCode::Unavailable) => return Ok(()),
            // Only a retired server loses a snapshot's block.
            Err(ErrorCode::DataLost) if self.st.alloc().server(then.server).is_none() => {
                return Ok(())
            }
            Err(ErrorCode::DataLost) => {
                return Err(format!(
                    "snapshot {id} lost block {index} of node {node} (block {} of server {}) while its server lives: not the node's bytes any more",
                    then.block, then.server
                ))
            }
            Err(code) => return Err(format!("locating a snapshot's block: {code:?}")),
        };
        if now.gen < then.gen {
            return Err(format!(
                "a snapshot's block {} of server {} went back from generation {} to {}",
                then.block, then.server, then.gen, now.gen
            ));
        }
        let node_gone = self.st.ns().get(node).is_none_or(|n| !n.linked);
        let Some(s) = self.store_of(then.server) else {
            return Ok(());
        };
        if !s.up || s.incarnation != incarnation {
            return Ok(()); // down, or wiped: its blocks are lost anyway
        }
        // The reader makes the fence's claim itself when the store is
        // behind (as the block-I/O layer does).
        s.claim(then.block, now.gen, None);
        if s.gens[then.block as usize] != now.gen {
            return Err(format!(
                "block {} of server {} is at generation {} on its store, ahead of the {} the metadata server located",
                then.block, then.server, s.gens[then.block as usize], now.gen
            ));
        }
        let held = s.bytes[then.block as usize].get(&then.offset).copied();
        self.stats.snapshot_reads += 1;
        if node_gone {
            self.stats.snapshot_held_reads += 1;
        }
        match held {
            Some((writer, _)) if writer == node => Ok(()),
            other => Err(format!(
                "snapshot {id} read block {index} of node {node} (gone: {node_gone}) at block {} of server {} offset {} generation {}: it holds {other:?}, not the node's bytes",
                then.block, then.server, then.offset, now.gen
            )),
        }
    }

    /// Begins a snapshot of a random subtree and keeps what it listed.
    pub(super) fn snapshot_begin(&mut self) -> Result<(), String> {
        let path = if self.rng.chance(30) {
            "/".to_string()
        } else {
            self.path()
        };
        let id = match self.exec(MetaRequest::SnapshotBegin { path })? {
            Ok(MetaReply::SnapshotBegun { id, .. }) => id,
            Ok(r) => return Err(format!("snapshot begin answered {r:?}")),
            // No such path, one of a file, too many snapshots running...
            Err(_) => return Ok(()),
        };
        self.stats.snapshots += 1;
        let (mut entry, mut block) = (0, 0);
        let mut listed: Vec<(NodeId, u64, BlockLoc)> = Vec::new();
        loop {
            let req = MetaRequest::SnapshotList { id, entry, block };
            match self.exec(req)? {
                Ok(MetaReply::SnapshotPage {
                    entries,
                    next_entry,
                    next_block,
                }) => {
                    if entries.is_empty() {
                        break;
                    }
                    for e in entries {
                        for (i, loc) in e.blocks.into_iter().enumerate() {
                            listed.push((e.node, e.first_block + i as u64, loc));
                        }
                    }
                    (entry, block) = (next_entry, next_block);
                }
                r => return Err(format!("snapshot list answered {r:?}")),
            }
        }
        // Only blocks whose bytes were the node's when it began: the
        // others were never written, or are on a store that lost them.
        let mut blocks = Vec::new();
        for (node, index, loc) in listed {
            if let Some(s) = self.store_of(loc.server) {
                let b = loc.block as usize;
                let ours = s.gens[b] <= loc.gen
                    && s.bytes[b].get(&loc.offset).is_some_and(|(w, _)| *w == node);
                if ours {
                    blocks.push((node, index, loc, s.incarnation));
                }
            }
        }
        self.snaps.push(SimSnap { id, blocks });
        Ok(())
    }

    /// Starts a move of a random block of a node (data or child records)
    /// or of a slab, copies the block of one in progress, or ends one that
    /// was copied: three steps, as in the server shell, so other requests
    /// run between the copy and the switch.
    pub(super) fn move_step(&mut self) -> Result<(), String> {
        if !self.moving.is_empty() && self.rng.chance(70) {
            let i = self.rng.below(self.moving.len() as u64) as usize;
            let (node, index, src, copied) = self.moving[i].clone();
            match copied {
                None => self.moving[i].3 = Some(self.copy_block(node, index, &src)),
                Some(copied) => {
                    self.moving.swap_remove(i);
                    if let Some(d) = self.st.decide_move_end(node, index, copied) {
                        self.commit(d)?;
                    }
                }
            }
            return Ok(());
        }
        if self.rng.chance(8) {
            // Resize a store (dynamic capacity): anywhere from nothing to
            // all of its blocks.
            let i = self.rng.below(self.stores.len() as u64) as usize;
            let (server, max) = (self.stores[i].addr.clone(), self.stores[i].num_blocks);
            let blocks = self.rng.below(u64::from(max) + 1) as u32;
            let resize = self.stores[i].signed(MetaRequest::Resize {
                server,
                blocks,
                signed: Default::default(),
            });
            if let Ok(MetaReply::Resized(r)) = self.exec(resize)? {
                self.stats.resizes += 1;
                if r.exported_blocks < r.target_blocks {
                    return Err(format!("a store exports less than it asked for: {r:?}"));
                }
            }
            return Ok(());
        }
        if self.rng.chance(10) {
            // Start or cancel the drain of a store.
            let i = self.rng.below(self.stores.len() as u64) as usize;
            let server = self.stores[i].addr.clone();
            let cancel = self.rng.chance(40);
            if let Ok(MetaReply::Drain(_)) = self.exec(MetaRequest::Drain { server, cancel })? {
                self.stats.drains += 1;
            }
            return Ok(());
        }
        let migrating = self.st.migration_candidates(self.now, 8);
        if let Some(m) = migrating
            .iter()
            .find(|m| self.st.ns().get(m.node).is_some_and(|n| n.pinned))
        {
            return Err(format!("migration planned to move pinned node {}", m.node));
        }
        if !migrating.is_empty() && self.rng.chance(50) {
            let m = migrating[self.rng.below(migrating.len() as u64) as usize];
            match self.st.decide_move_start_to(m.node, m.index, m.to, true) {
                Ok((d, src, dst)) => {
                    if dst.class != m.to {
                        return Err(format!("{m:?} went to class {}", dst.class));
                    }
                    self.stats.moves += 1;
                    self.stats.migrations += 1;
                    self.commit(d)?;
                    self.moving.push((m.node, m.index, src, None));
                }
                Err(e) if e.code == ErrorCode::Internal => {
                    return Err(format!("migration start failed internally: {}", e.message))
                }
                Err(_) => self.stats.refused += 1,
            }
            return Ok(());
        }
        let drained = self.st.drain_candidates(8);
        let (node, index) = if !drained.is_empty() && self.rng.chance(50) {
            let (node, index, _, _) = drained[self.rng.below(drained.len() as u64) as usize];
            (node, index)
        } else if self.rng.chance(30) {
            // A slab: every small value in it follows.
            let slabs: Vec<u64> = self
                .st
                .slabs()
                .iter()
                .map(|((server, block), _)| crate::state::slab_move_index(server, block))
                .collect();
            if slabs.is_empty() {
                return Ok(());
            }
            let i = self.rng.below(slabs.len() as u64) as usize;
            (crate::state::SLAB_MOVE, slabs[i])
        } else {
            let mut nodes: Vec<(NodeId, usize)> = self
                .st
                .ns()
                .nodes()
                .filter(|n| !n.blocks.is_empty())
                .map(|n| (n.id, n.blocks.len()))
                .collect();
            nodes.sort_unstable(); // the namespace iterates in hash order
            if nodes.is_empty() {
                return Ok(());
            }
            let (node, len) = nodes[self.rng.below(nodes.len() as u64) as usize];
            (node, self.rng.below(len as u64))
        };
        match self.st.decide_move_start(node, index, NO_CLASS) {
            Ok((d, src, _dst)) => {
                self.stats.moves += 1;
                if node == crate::state::SLAB_MOVE {
                    self.stats.slab_moves += 1;
                }
                self.commit(d)?;
                self.moving.push((node, index, src, None));
            }
            Err(e) if e.code == ErrorCode::Internal => {
                return Err(format!("move start failed internally: {}", e.message))
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// The copy of a move: the source at the fence generation to the
    /// target (the shell sends the fence claim first).
    pub(super) fn copy_block(&mut self, node: NodeId, index: u64, src: &BlockLoc) -> bool {
        let Some(m) = self
            .st
            .moves()
            .find(|(k, _)| *k == (node, index))
            .map(|(_, m)| m)
        else {
            return false;
        };
        let Some(s) = self.store_of(src.server) else {
            return false;
        };
        if !s.up {
            return false;
        }
        s.claim(src.block, src.gen, None);
        if s.gens[src.block as usize] != src.gen {
            return false;
        }
        let bytes = s.bytes[src.block as usize].clone();
        let cleared = s.cleared[src.block as usize].clone();
        // The copy holds every piece's bytes; only the pieces' current
        // owners can be handed the target's generation, so only their
        // bytes count as written under it (the bytes of a freed piece stay
        // its old owner's, under the old generation).
        let owners = self.st.slabs().get(src.server, src.block).map(|slab| {
            (
                slab.piece_size,
                slab.owned()
                    .collect::<std::collections::BTreeMap<u32, NodeId>>(),
            )
        });
        let Some(t) = self.store_of(m.to.server) else {
            return false;
        };
        if !t.up || m.to.gen < t.gens[m.to.block as usize] {
            return false;
        }
        t.gens[m.to.block as usize] = m.to.gen;
        t.bytes[m.to.block as usize] = bytes
            .into_iter()
            .map(|(at, (n, g))| match &owners {
                Some((size, owned)) if owned.get(&(at / size)) != Some(&n) => (at, (n, g)),
                _ => (at, (n, m.to.gen)),
            })
            .collect();
        t.cleared[m.to.block as usize] = cleared;
        true
    }

    /// Ends the run: every client stops, time passes, every name is
    /// removed and reaped; then no block is in use but the root's records.
    pub(super) fn drain(&mut self) -> Result<(), String> {
        self.clients.iter_mut().for_each(|c| *c = Task::Idle);
        for s in std::mem::take(&mut self.snaps) {
            let _ = self.exec(MetaRequest::SnapshotEnd { id: s.id })?;
        }
        for (node, index, _, _) in std::mem::take(&mut self.moving) {
            if let Some(d) = self.st.decide_move_end(node, index, false) {
                self.commit(d)?;
            }
        }
        self.now += 4 * LEASE_MS;
        let tops: Vec<String> = self
            .st
            .ns()
            .get(crate::namespace::ROOT)
            .map(|r| r.children.keys().map(|k| format!("/{k}")).collect())
            .unwrap_or_default();
        for path in tops {
            let _ = self.exec(MetaRequest::Remove {
                path,
                recursive: true,
            })?;
        }
        for _ in 0..10_000 {
            // Each decided on the state the one before left.
            let mut idle = true;
            if let Some(d) = self.st.decide_sweep(self.now, LEASE_MS) {
                self.commit(d)?;
                idle = false;
            }
            if let Some(d) = self.st.decide_reap() {
                self.commit(d)?;
                idle = false;
            }
            if idle {
                break;
            }
            self.st.check_invariants()?;
        }
        self.st.check_invariants()?;
        let left: Vec<NodeId> = self
            .st
            .ns()
            .nodes()
            .filter(|n| n.id != crate::namespace::ROOT)
            .map(|n| n.id)
            .collect();
        if !left.is_empty() {
            return Err(format!("nodes left after removing everything: {left:?}"));
        }
        let root_blocks = self
            .st
            .ns()
            .get(crate::namespace::ROOT)
            .map_or(0, |r| r.blocks.len() as u64);
        let capacity: u64 = self
            .st
            .alloc()
            .servers()
            .map(|(_, s)| s.exported_blocks())
            .sum();
        let free: u64 = self.st.alloc().servers().map(|(_, s)| s.free.len()).sum();
        if free + root_blocks < capacity {
            return Err(format!(
                "after removing everything {free} of {capacity} blocks are free (root holds {root_blocks})"
            ));
        }
        Ok(())
    }
}
