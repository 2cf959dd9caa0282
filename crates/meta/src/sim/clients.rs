//! The simulation's clients: writers (puts, small puts, appends, syncs,
//! truncates, aborts, takeovers, writers that vanish), readers checking
//! that a block read at its generation holds their node's bytes (also
//! through old handles), and namespace requests.

use super::*;

/// The name `prefix` + `i`, lengthened by `i`: records of one, two,
/// three and nine slots (`record::slots_for`), so containers hold records
/// of every length side by side.
fn named(prefix: &str, i: u64) -> String {
    let pad = [0, 20, 60, 250][(i % 4) as usize];
    let name = format!("{prefix}{i}");
    format!("{name:x<width$}", width = name.len() + pad)
}

impl Sim {
    pub(super) fn path(&mut self) -> String {
        let top = ["d0", "d1", "t0", "t1"][self.rng.below(4) as usize];
        match self.rng.below(3) {
            0 => format!("/{top}"),
            1 => format!("/{top}/{}", named("n", self.rng.below(4))),
            _ => format!(
                "/{top}/{}/{}",
                named("n", self.rng.below(2)),
                named("m", self.rng.below(2))
            ),
        }
    }

    pub(super) fn client_step(&mut self) -> Result<(), String> {
        let c = self.rng.below(self.clients.len() as u64) as usize;
        match self.clients[c] {
            Task::Idle => self.start_write(c),
            Task::Writing {
                node,
                lease,
                bs,
                next,
                end,
                first_write,
                piece,
                link,
            } => {
                if self.rng.chance(4) {
                    // The client dies: its put is swept once its lease
                    // expires, and so is what a File writer had not
                    // published.
                    self.clients[c] = Task::Idle;
                    return Ok(());
                }
                if next < end && next > 0 && piece.is_some() {
                    self.outgrow(c, node, lease)
                } else if next < end {
                    self.write_block(c, node, lease, next, first_write)
                } else if let Some(key) = link {
                    self.link(c, node, lease, key, end * bs)
                } else {
                    self.finish_write(c, node, lease, piece.unwrap_or(end * bs))
                }
            }
        }
    }

    pub(super) fn start_write(&mut self, c: usize) -> Result<(), String> {
        if self.rng.chance(8) {
            return self.reserve(c);
        }
        let path = self.path();
        let blocks = self.rng.below(4);
        let reply = if self.rng.chance(30) {
            self.exec(MetaRequest::OpenWrite { path })?
        } else {
            let ty = if self.rng.chance(60) {
                NodeType::KeyValue
            } else {
                NodeType::File
            };
            // Most puts are small values of known size, of four piece sizes
            // (four to six pieces a slab), into the two tables' 32 keys:
            // slabs are shared by several values, stay in use, and soon
            // hand out every never-used piece, so their freed pieces are
            // reused (behind a stamp).
            let small = ty == NodeType::KeyValue && self.rng.chance(70);
            let (path, size_hint) = if small {
                let key = format!("/t{}/{}", self.rng.below(2), named("k", self.rng.below(32)));
                (key, 513 + self.rng.below(512))
            } else {
                (path, 0)
            };
            // An append-or-create opens a File that is there.
            let open_existing = ty == NodeType::File && self.rng.chance(30);
            let ttl_ms = self.ttl();
            let session = self.session_ref();
            self.exec(MetaRequest::Create {
                path,
                ty,
                storage_class: NO_CLASS,
                location: String::new(),
                enumerable: true,
                size_hint,
                pinned: false,
                mode: 0o644,
                mtime: 0,
                open_existing,
                ttl_ms,
                child_ttl_ms: 0,
                session,
            })?
        };
        if let Ok(MetaReply::Node(info)) = &reply {
            self.note_bound(info.id);
        }
        if let Ok(MetaReply::Node(info)) = reply {
            if info.lease != 0 {
                // A new File's first write: most small (a piece), some not.
                let first_write = if info.ty == NodeType::File && info.size == 0 {
                    [0, 1 + self.rng.below(900), 1 + self.rng.below(3000)]
                        [self.rng.below(3) as usize] as u32
                } else {
                    0
                };
                // An open File already in a piece.
                let piece = info
                    .first_block
                    .as_ref()
                    .filter(|b| info.ty == NodeType::File && b.tag != 0)
                    .map(|_| info.size);
                let bs = info.block_size as u64;
                let first = info.size.div_ceil(bs);
                if info.size > 0 {
                    self.stats.takeovers += 1;
                }
                if bs < BS as u64 {
                    self.stats.small_puts += 1;
                }
                self.clients[c] = Task::Writing {
                    node: info.id,
                    lease: info.lease,
                    bs,
                    next: first,
                    end: first + blocks,
                    first_write,
                    piece,
                    link: None,
                };
            }
        }
        Ok(())
    }

    /// A client reserves a few puts of small values ahead of their keys
    /// (one for a table's keys, or for another node's path: a link the
    /// state refuses) and writes the first; the others it never uses,
    /// and their leases lapse.
    fn reserve(&mut self, c: usize) -> Result<(), String> {
        let count = 1 + self.rng.below(4) as u32;
        let size_hint = 513 + self.rng.below(512);
        let reply = self.exec(MetaRequest::Reserve {
            size_hint,
            count,
            storage_class: NO_CLASS,
            location: String::new(),
        })?;
        let Ok(MetaReply::Reserved { puts, .. }) = reply else {
            return match reply {
                Ok(r) => Err(format!("reserve answered {r:?}")),
                Err(_) => Ok(()),
            };
        };
        if puts.len() > count as usize {
            return Err(format!("{count} puts reserved, {} handed out", puts.len()));
        }
        self.stats.reserved += puts.len() as u64;
        let Some(first) = puts.first() else {
            return Err(format!("reserve of {count} answered none"));
        };
        if first.first_block.as_ref().is_none_or(|b| b.tag != first.id) {
            return Err(format!(
                "reserved put {} has no piece of its own: {first:?}",
                first.id
            ));
        }
        // Mostly a table's key; sometimes a directory's (refused).
        let tables = if self.rng.chance(90) { 2 } else { 4 };
        let key = (self.rng.below(tables), self.rng.below(32));
        self.clients[c] = Task::Writing {
            node: first.id,
            lease: first.lease,
            bs: first.block_size as u64,
            next: 0,
            end: 1,
            first_write: 0,
            piece: None,
            link: Some(key),
        };
        Ok(())
    }

    /// Closes reserved put `node` as the value at table `key.0`'s key
    /// `key.1`.
    fn link(
        &mut self,
        c: usize,
        node: NodeId,
        lease: u64,
        (table, key): (u64, u64),
        size: u64,
    ) -> Result<(), String> {
        // Tables t0 and t1; d0 and d1 are directories (or gone).
        let top = ["t0", "t1", "d0", "d1"][table as usize];
        let path = format!("/{top}/{}", named("k", key));
        match self.exec(MetaRequest::Link {
            node,
            lease,
            size,
            mtime: 3,
            path: path.clone(),
        })? {
            Ok(MetaReply::Record(_)) => {
                let n = self.st.ns().resolve(&path).ok();
                if n != Some(node) {
                    return Err(format!("{path} linked node {node} but resolves to {n:?}"));
                }
                self.stats.linked += 1;
                self.stats.puts_closed += 1;
                self.clients[c] = Task::Idle;
                Ok(())
            }
            Ok(r) => Err(format!("link answered {r:?}")),
            Err(_) => self.give_up(c, node, lease),
        }
    }

    pub(super) fn write_block(
        &mut self,
        c: usize,
        node: NodeId,
        lease: u64,
        index: u64,
        first_write: u32,
    ) -> Result<(), String> {
        let blocks = match self.exec(MetaRequest::Map {
            node,
            index,
            count: 1,
            alloc: true,
            lease,
            first_write,
        })? {
            Ok(MetaReply::Blocks { blocks, .. }) => blocks,
            Ok(r) => return Err(format!("map answered {r:?}")),
            Err(_) => return self.give_up(c, node, lease),
        };
        let Some(loc) = blocks.first().cloned() else {
            // The block is on a dead server or being moved: retry later.
            return Ok(());
        };
        let up = self.store_of(loc.server).is_some_and(|s| s.up);
        if !up {
            // The data is still in the client's hands: ask for another block.
            let r = self.exec(MetaRequest::ReplaceBlock {
                node,
                lease,
                index,
                gen: loc.gen,
            })?;
            if r.is_err() {
                return self.give_up(c, node, lease);
            }
            return Ok(());
        }
        let whole = self.st.slabs().get(loc.server, loc.block).is_none();
        // A piece handed to another node under the generation its old
        // owner wrote it with: that owner's old handles would read the new
        // node's bytes (the storage server cannot tell them apart).
        if let Some(&(writer, gen)) = self
            .store_of(loc.server)
            .and_then(|s| s.bytes[loc.block as usize].get(&loc.offset))
        {
            if !whole && writer != node && gen == loc.gen {
                return Err(format!(
                    "an old handle of node {writer} would read node {node}'s bytes: the piece at offset {} of block {} of server {} was handed out again under generation {gen}",
                    loc.offset, loc.block, loc.server
                ));
            }
        }
        let wrote = match self.store_of(loc.server) {
            Some(s) => s.write(&loc, whole, node)?,
            None => false,
        };
        self.trace.push(format!(
            "  write node {node} block {index} at {loc:?}: {wrote}"
        ));
        if wrote {
            self.keep_handle(node, &loc);
            self.stats.writes += 1;
            if let Task::Writing {
                next,
                first_write,
                piece,
                ..
            } = &mut self.clients[c]
            {
                *next += 1;
                if *first_write > 0 && !whole {
                    // The first write went to a piece: it holds that much.
                    *piece = Some(u64::from(*first_write));
                    self.stats.file_pieces += 1;
                }
                *first_write = 0;
            }
        }
        Ok(())
    }

    /// The writer of a File in a piece is about to write past it: it gets
    /// block 0 of its own, and copies the piece into it (writes block 0
    /// again) before writing on; the sync after publishes the blocks.
    pub(super) fn outgrow(&mut self, c: usize, node: NodeId, lease: u64) -> Result<(), String> {
        match self.exec(MetaRequest::Outgrow { node, lease })? {
            Ok(MetaReply::Blocks { blocks, .. }) => {
                if blocks.first().is_some_and(|b| b.tag != 0) {
                    return Err(format!(
                        "node {node} outgrew its piece into a piece: {blocks:?}"
                    ));
                }
                self.stats.outgrown += 1;
                if let Task::Writing { next, piece, .. } = &mut self.clients[c] {
                    *next = 0;
                    *piece = None;
                }
                Ok(())
            }
            Ok(r) => Err(format!("outgrow answered {r:?}")),
            Err(_) => self.give_up(c, node, lease),
        }
    }

    pub(super) fn finish_write(
        &mut self,
        c: usize,
        node: NodeId,
        lease: u64,
        size: u64,
    ) -> Result<(), String> {
        if self.rng.chance(10) {
            // The client's lease keeper renews the lease, publishing
            // nothing: it says whether the lease is still held.
            let held = self
                .st
                .ns()
                .get(node)
                .and_then(|n| n.lease)
                .is_some_and(|l| l.id == lease);
            match self.exec(MetaRequest::Renew {
                leases: vec![(node, lease)],
            })? {
                Ok(MetaReply::Renewed { lost, .. }) if lost.contains(&node) != held => {
                    self.stats.renewals += u64::from(held);
                }
                r => {
                    return Err(format!(
                        "renewal of node {node} (held: {held}) answered {r:?}"
                    ))
                }
            }
        }
        let close = self.rng.chance(85);
        if !close && self.rng.chance(30) {
            // The writer cuts its node short (to at most what it has
            // published), then writes on from there.
            let published = self.st.ns().get(node).map_or(0, |n| n.size);
            let to = self.rng.below(published + 1);
            return match self.exec(MetaRequest::Truncate {
                node,
                lease,
                size: to,
                mtime: 7,
            })? {
                Ok(MetaReply::Done) => {
                    self.stats.truncates += 1;
                    if let Task::Writing {
                        next, bs, piece, ..
                    } = &mut self.clients[c]
                    {
                        *next = to.div_ceil(*bs);
                        if piece.is_some() {
                            *piece = Some(to);
                        }
                    }
                    Ok(())
                }
                Ok(r) => Err(format!("truncate answered {r:?}")),
                Err(_) => self.give_up(c, node, lease),
            };
        }
        match self.exec(MetaRequest::Sync {
            node,
            lease,
            size,
            close,
            mtime: 0,
        })? {
            Ok(MetaReply::Record(r)) => {
                if close {
                    self.stats.puts_closed += 1;
                    self.clients[c] = Task::Idle;
                }
                let _ = r;
                Ok(())
            }
            Ok(r) => Err(format!("sync answered {r:?}")),
            Err(_) => self.give_up(c, node, lease),
        }
    }

    /// A write failed: abort (a put leaves nothing behind), or just stop.
    pub(super) fn give_up(&mut self, c: usize, node: NodeId, lease: u64) -> Result<(), String> {
        self.clients[c] = Task::Idle;
        if self.rng.chance(80) {
            if let Ok(MetaReply::Done) = self.exec(MetaRequest::Abort { node, lease })? {
                let n = self.st.ns().get(node);
                if n.is_some_and(|n| !n.linked && (!n.blocks.is_empty() || n.piece.is_some())) {
                    return Err(format!("aborted put {node} still holds blocks"));
                }
            }
        }
        Ok(())
    }

    /// Reads a node's blocks: what a block at its current generation holds
    /// must have been written for this node.
    pub(super) fn read(&mut self) -> Result<(), String> {
        // A random path, or (as often) a data node that exists.
        let mut data: Vec<NodeId> = self
            .st
            .ns()
            .nodes()
            .filter(|n| !n.ty.is_container() && n.linked)
            .map(|n| n.id)
            .collect();
        data.sort_unstable(); // the namespace iterates in hash order
        let id = if data.is_empty() || self.rng.chance(50) {
            let path = self.path();
            match self.exec(MetaRequest::Lookup { path })? {
                Ok(MetaReply::Node(info)) if !info.ty.is_container() => info.id,
                _ => return Ok(()),
            }
        } else {
            data[self.rng.below(data.len() as u64) as usize]
        };
        let bs = self
            .st
            .ns()
            .get(id)
            .map_or(BS, |n| n.piece.map_or(BS, |p| p.capacity()));
        let blocks = match self.exec(MetaRequest::Map {
            node: id,
            index: 0,
            count: 16,
            alloc: false,
            lease: 0,
            first_write: 0,
        })? {
            Ok(MetaReply::Blocks { size, blocks }) => {
                let published = size.div_ceil(bs as u64) as usize;
                blocks.into_iter().take(published).collect::<Vec<_>>()
            }
            _ => return Ok(()),
        };
        for loc in blocks {
            self.keep_handle(id, &loc);
            let (held, cleared) = match self.store_of(loc.server) {
                Some(s) if s.up && s.gens[loc.block as usize] == loc.gen => (
                    s.bytes[loc.block as usize].get(&loc.offset).copied(),
                    s.cleared[loc.block as usize].contains(&loc.offset),
                ),
                _ => continue, // unreachable, or Stale: the client re-maps
            };
            self.stats.reads += 1;
            if bs < BS {
                self.stats.small_reads += 1;
            }
            match held {
                Some((writer, _)) if writer != id => {
                    return Err(format!(
                        "reading node {} got block {} of server {} at generation {}, written for node {writer}",
                        id, loc.block, loc.server, loc.gen
                    ));
                }
                // A published block without its node's bytes: a write
                // was lost (e.g. to a block's old copy during a move).
                None => {
                    return Err(format!(
                        "reading node {id}: block {} of server {} at generation {} (offset {}) holds none of its published bytes",
                        loc.block, loc.server, loc.gen, loc.offset
                    ));
                }
                // A live small value's tag cleared: its readers would get
                // `Stale` for good.
                _ if cleared => {
                    return Err(format!(
                        "the tag of node {id}'s piece at offset {} of block {} of server {} is gone while the node lives",
                        loc.offset, loc.block, loc.server
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Keeps a location a client used, to read through it later.
    pub(super) fn keep_handle(&mut self, node: NodeId, loc: &BlockLoc) {
        // Many: a freed piece is reused only after its slab's never-used
        // pieces, so a handle must outlive many puts to see the reuse.
        if self.handles.len() >= 512 {
            let i = self.rng.below(512) as usize;
            self.handles.swap_remove(i);
        }
        self.handles.push((node, loc.clone()));
    }

    /// Reads through a location looked up earlier, whatever happened to
    /// its node since (replaced, deleted, its block or piece reused): the
    /// storage server either refuses the generation or still holds bytes
    /// written for that node.
    pub(super) fn read_old_handle(&mut self) -> Result<(), String> {
        if self.handles.is_empty() {
            return Ok(());
        }
        let i = self.rng.below(self.handles.len() as u64) as usize;
        let (node, loc) = self.handles[i].clone();
        let held = match self.store_of(loc.server) {
            Some(s)
                if s.up
                    && s.gens[loc.block as usize] == loc.gen
                    && !s.cleared[loc.block as usize].contains(&loc.offset) =>
            {
                s.bytes[loc.block as usize].get(&loc.offset).copied()
            }
            // Stale (a generation refused, or a small value's tag cleared):
            // the handle's owner learns it is gone.
            _ => return Ok(()),
        };
        self.stats.old_handle_reads += 1;
        match held {
            Some((writer, _)) if writer != node => Err(format!(
                "an old handle of node {node} read block {} of server {} (offset {}) at generation {}, written for node {writer}",
                loc.block, loc.server, loc.offset, loc.gen
            )),
            _ => Ok(()),
        }
    }

    /// A create's TTL: mostly none, sometimes a few seconds (some
    /// steps' worth), now and then never (under a parent's child TTL).
    fn ttl(&mut self) -> u64 {
        match self.rng.below(100) {
            0..=14 => 1 + self.rng.below(3000),
            15..=17 => nodekernel_proto::meta::TTL_NEVER,
            _ => 0,
        }
    }

    /// A container's child TTL: mostly none.
    fn child_ttl(&mut self) -> u64 {
        if self.rng.chance(15) {
            1 + self.rng.below(3000)
        } else {
            0
        }
    }

    /// A session opened, renewed (sometimes with a wrong secret) or
    /// closed. A renewal refused with the right secret must be of a
    /// session that has ended.
    fn session_op(&mut self) -> Result<(), String> {
        let pick = (!self.sessions.is_empty())
            .then(|| self.rng.below(self.sessions.len() as u64) as usize);
        match (self.rng.below(10), pick) {
            (0..=3, _) | (_, None) => {
                let secret = u128::from(self.rng.next()) << 64 | u128::from(self.rng.next());
                let lease_ms = 1_000 + self.rng.below(2_000);
                if let Ok(MetaReply::Session { id, .. }) =
                    self.exec(MetaRequest::SessionOpen { secret, lease_ms })?
                {
                    self.stats.sessions_opened += 1;
                    self.sessions.push((id, secret));
                }
            }
            (4..=7, Some(i)) => {
                let (id, secret) = self.sessions[i];
                let wrong = self.rng.chance(10);
                let secret = if wrong { secret ^ 1 } else { secret };
                match self.exec(MetaRequest::SessionRenew { id, secret })? {
                    Ok(_) if wrong => {
                        return Err(format!("session {id} was renewed with a wrong secret"))
                    }
                    Err(ErrorCode::NotFound) if !wrong => {
                        if self.st.ns().lifetimes().session(id).is_some() {
                            return Err(format!("the renewal of open session {id} was refused"));
                        }
                        self.sessions.swap_remove(i);
                    }
                    _ => {}
                }
            }
            (_, Some(i)) => {
                let (id, secret) = self.sessions.swap_remove(i);
                if self.exec(MetaRequest::SessionClose { id, secret })?.is_ok() {
                    self.stats.sessions_closed += 1;
                }
            }
        }
        Ok(())
    }

    /// Keeps node `id` to check, if a create just bound it to a session.
    fn note_bound(&mut self, id: NodeId) {
        if let Some(s) = self.st.ns().lifetimes().bound_to(id) {
            self.bound.push((id, s));
        }
    }

    /// A create's session: mostly none; now and then one the clients
    /// opened (perhaps ended since), rarely with a wrong secret.
    fn session_ref(&mut self) -> Option<nodekernel_proto::meta::SessionRef> {
        if self.sessions.is_empty() || !self.rng.chance(25) {
            return None;
        }
        let (id, secret) = self.sessions[self.rng.below(self.sessions.len() as u64) as usize];
        let secret = if self.rng.chance(5) { !secret } else { secret };
        Some(nodekernel_proto::meta::SessionRef { id, secret })
    }

    pub(super) fn namespace_op(&mut self) -> Result<(), String> {
        let path = self.path();
        let (ttl_ms, child_ttl_ms) = (self.ttl(), self.child_ttl());
        let session = self.session_ref();
        if session.is_some() {
            self.stats.bound += 1;
        }
        let req = match self.rng.below(9) {
            8 => return self.session_op(),
            0 | 1 => MetaRequest::Create {
                ty: if path.starts_with("/t") && self.rng.chance(80) || self.rng.chance(30) {
                    NodeType::Table
                } else {
                    NodeType::Directory
                },
                path,
                storage_class: NO_CLASS,
                location: String::new(),
                enumerable: self.rng.chance(70),
                size_hint: 0,
                pinned: self.rng.chance(10),
                mode: 0o644,
                mtime: 0,
                open_existing: false,
                ttl_ms,
                child_ttl_ms,
                session,
            },
            2 | 3 => MetaRequest::Remove {
                path,
                recursive: self.rng.chance(60),
            },
            4 => {
                let dst = self.path();
                MetaRequest::Move {
                    src: path,
                    dst,
                    replace: self.rng.chance(40),
                }
            }
            5 => MetaRequest::SetAttrs {
                path,
                mode: self.rng.chance(50).then_some(0o600),
                mtime: self.rng.chance(50).then_some(self.rng.below(1 << 40)),
                ttl_ms: self.rng.chance(40).then_some(ttl_ms).filter(|t| *t != 0),
                child_ttl_ms: self.rng.chance(20).then_some(child_ttl_ms),
            },
            6 => MetaRequest::Enumerate { path },
            _ => {
                // Small limits, so that writers meet them; sometimes one
                // limit only, sometimes none (cleared).
                use nodekernel_proto::quota::{Quota, NO_LIMIT};
                let bytes = if self.rng.chance(70) {
                    self.rng.below(24) * u64::from(super::BS)
                } else {
                    NO_LIMIT
                };
                let nodes = if self.rng.chance(60) {
                    self.rng.below(12)
                } else {
                    NO_LIMIT
                };
                self.stats.quotas_set += 1;
                // Mostly on the top-level containers, which most writes
                // go into.
                let path = if self.rng.chance(70) {
                    format!("/{}", ["d0", "d1", "t0", "t1"][self.rng.below(4) as usize])
                } else {
                    path
                };
                MetaRequest::QuotaSet {
                    path,
                    quota: Quota { bytes, nodes },
                }
            }
        };
        match self.exec(req)? {
            Ok(MetaReply::Node(info)) => self.note_bound(info.id),
            Ok(MetaReply::Record(Some(r))) => self.clearing.push((r.container, r.slot)),
            Ok(MetaReply::Moved {
                clear, replaced, ..
            }) => {
                if replaced.is_some() {
                    self.stats.replacing_moves += 1;
                }
                for r in [clear, replaced].into_iter().flatten() {
                    self.clearing.push((r.container, r.slot));
                }
            }
            _ => {}
        }
        Ok(())
    }

    pub(super) fn release_slots(&mut self) -> Result<(), String> {
        if self.clearing.is_empty() {
            return Ok(());
        }
        let i = self.rng.below(self.clearing.len() as u64) as usize;
        let (container, slot) = self.clearing.swap_remove(i);
        if self.rng.chance(50) {
            // As a clear refused by a stamp asks (`RecordAt`): the answer is
            // the record's place now, at its extent's current generation.
            self.record_at(container, slot)?;
        }
        let _ = self.exec(MetaRequest::ReleaseSlot { container, slot })?;
        Ok(())
    }

    /// Asks where the record in `slot` of `container` (being cleared) is
    /// now, and checks the answer against the state: that record, in an
    /// extent of the container, at the generation the extent has now.
    fn record_at(&mut self, container: NodeId, slot: u32) -> Result<(), String> {
        let req = MetaRequest::RecordAt {
            container,
            slot,
            name: String::new(),
        };
        let r = match self.exec(req)? {
            Ok(MetaReply::Record(Some(r))) => r,
            // Gone with its container, or its block moving.
            Ok(MetaReply::Record(None)) | Err(_) => return Ok(()),
            Ok(other) => return Err(format!("RecordAt answered {other:?}")),
        };
        let b = &r.block;
        let current = match self.st.slabs().get(b.server, b.block) {
            Some(slab) => Some(slab.gen),
            None => self.st.ns().get(container).and_then(|n| {
                n.blocks
                    .iter()
                    .find(|x| (x.server, x.block) == (b.server, b.block))
                    .map(|x| x.gen)
            }),
        };
        if (r.container, r.slot) != (container, slot) || current != Some(b.gen) {
            return Err(format!(
                "RecordAt for slot {slot} of node {container} answered {r:?}; the extent is at \
                 generation {current:?}"
            ));
        }
        self.stats.record_locations += 1;
        Ok(())
    }
}
