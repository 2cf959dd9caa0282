//! Checkpoints: the whole metadata state as of one record of the operation
//! log, so that a restart replays only the records after it, and the
//! segments before it can be deleted (`docs/persistence.md`).
//!
//! A checkpoint is a redb database in the server's directory, named
//! `checkpoint-<last log record it holds, 20 digits>-<CRC-32 of the whole
//! file, 8 hex digits>.redb`, with two tables: `nodes` (node id → the
//! node's record, see `Namespace::checkpoint_nodes`; records written before
//! nodes kept a mode and a modification time end without them, and only a
//! container with record pieces ends with them) and `parts` (`state`:
//! counters, allocator, slabs, moves, blocks held for snapshots and
//! ballooned blocks, in format [`FORMAT`]; formats 1, without held blocks,
//! 2, without ballooned ones, 3, without the storage servers'
//! capability keys, 4, without slabs' encryption flags, 5, without
//! nodes' lifetimes, 6, without sessions and their bound nodes, and 7,
//! without quotas, are read too; containers' usage is not kept: it is
//! recounted from the nodes). It is
//! written whole to `checkpoint.tmp` (created with mode 0600 whatever the
//! umask; a checkpoint found open to others is set to 0600 when read),
//! committed (redb syncs it), and only
//! then renamed to its name, which makes it the newest; older ones are
//! deleted after. A crash leaves either checkpoint intact.
//!
//! At start the newest checkpoint's bytes are checked against the CRC in
//! its name *before* redb reads them: redb detects a torn commit, but it
//! panics on a damaged page, and a file from disk must never crash the
//! server. A checkpoint that fails the check, or does not decode, stops the
//! start with an error naming the file: it is never silently skipped, since
//! the log before it is gone.

use crate::alloc::{BlockAllocator, BlockRef};
use crate::lifetimes::Session;
use crate::namespace::{Namespace, NodeId};
use crate::slab::Slabs;
use crate::state::{MetaState, Move, Parts};
use nodekernel_proto::codec::{Dec, Enc};
use nodekernel_proto::{Error, Result as ProtoResult};
use redb::{
    Database, ReadOnlyDatabase, ReadableDatabase, ReadableTable, ReadableTableMetadata,
    TableDefinition,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The format of the `state` part written; the only one read.
pub const FORMAT: u8 = 8;
const TMP_FILE: &str = "checkpoint.tmp";

const NODES: TableDefinition<u64, &[u8]> = TableDefinition::new("nodes");
const PARTS: TableDefinition<&str, &[u8]> = TableDefinition::new("parts");

#[derive(Debug, thiserror::Error)]
#[error("checkpoint {}: {reason}", path.display())]
pub struct CheckpointError {
    pub path: PathBuf,
    pub reason: String,
}

fn err(path: &Path) -> impl Fn(String) -> CheckpointError + '_ {
    move |reason| CheckpointError {
        path: path.to_path_buf(),
        reason,
    }
}

/// The state encoded under the lock, written out after it is released.
#[derive(Debug, Default)]
pub struct Image {
    /// Counters, allocator, slabs and moves.
    pub state: Vec<u8>,
    /// Every node record, back to back.
    buf: Vec<u8>,
    /// (node id, start, end) of each record in `buf`.
    nodes: Vec<(NodeId, usize, usize)>,
}

impl Image {
    pub(crate) fn push_node(&mut self, id: NodeId, rec: &[u8]) {
        let start = self.buf.len();
        self.buf.extend_from_slice(rec);
        self.nodes.push((id, start, self.buf.len()));
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Bytes of encoded state.
    pub fn bytes(&self) -> usize {
        self.state.len() + self.buf.len()
    }

    /// Every node record, in the order they were encoded.
    pub fn node_records(&self) -> impl Iterator<Item = (NodeId, &[u8])> + '_ {
        self.nodes
            .iter()
            .map(|&(id, s, end)| (id, &self.buf[s..end]))
    }
}

impl MetaState {
    /// The whole durable state as a checkpoint image: one record per node,
    /// and the rest (counters, allocator, slabs, moves, held and ballooned
    /// blocks) in one part. Leases are kept (a replayed log tail may renew
    /// them), liveness and pending claims are not.
    pub fn checkpoint_image(&self) -> Image {
        let mut image = Image::default();
        let next_id = self
            .ns()
            .checkpoint_nodes(|id, rec| image.push_node(id, rec));
        let mut buf = bytes::BytesMut::new();
        let e = &mut Enc(&mut buf);
        e.u8(FORMAT)
            .u32(self.alloc().block_size())
            .u64(next_id)
            .u64(self.next_lease());
        self.alloc().checkpoint(e);
        self.slabs().checkpoint(e);
        let moves: Vec<_> = self.moves().collect();
        e.u32(moves.len() as u32);
        for ((node, index), m) in &moves {
            e.u64(*node)
                .u64(*index)
                .u32(m.to.server)
                .u32(m.to.block)
                .u64(m.to.gen)
                .u64(m.fence);
        }
        let held: Vec<_> = self.held_blocks().collect();
        let ballooned: Vec<_> = self.ballooned_blocks().collect();
        for blocks in [held, ballooned] {
            e.u32(blocks.len() as u32);
            for ((server, block), gen) in blocks {
                e.u32(server).u32(block).u64(gen);
            }
        }
        let lifetimes = self.ns().lifetimes().entries();
        e.u32(lifetimes.len() as u32);
        for (node, expires_ms, child_ttl_ms) in lifetimes {
            e.u64(node).u64(expires_ms).u64(child_ttl_ms);
        }
        let life = self.ns().lifetimes();
        e.u64(life.next_session()).u32(life.open_sessions() as u32);
        for (id, s) in life.sessions() {
            e.u64(id)
                .u64(s.secret as u64)
                .u64((s.secret >> 64) as u64)
                .u64(s.lease_ms);
        }
        let bindings = life.bindings();
        e.u32(bindings.len() as u32);
        for (node, session) in bindings {
            e.u64(node).u64(session);
        }
        e.u32(self.accounts().quota_count() as u32);
        for (node, q) in self.accounts().quotas() {
            e.u64(node).u64(q.bytes).u64(q.nodes);
        }
        image.state = buf.to_vec();
        image
    }

    /// The state of a checkpoint: `state` and the node records as
    /// [`MetaState::checkpoint_image`] made them. Every storage server
    /// counts as seen at `now`.
    pub fn from_checkpoint(
        lease_ms: u64,
        state: &[u8],
        nodes: impl Iterator<Item = ProtoResult<(NodeId, Vec<u8>)>>,
        now: u64,
    ) -> ProtoResult<MetaState> {
        let mut dec = Dec::new(state, "checkpointed state");
        let d = &mut dec;
        let format = d.u8()?;
        // Format 1 had no held blocks (no snapshots), format 2 no
        // ballooned ones (no dynamic capacity), format 3 no capability
        // keys, format 4 no slab encryption flags, format 5 no lifetimes,
        // format 6 no sessions, format 7 no quotas.
        if !(1..=FORMAT).contains(&format) {
            return Err(Error::protocol(format!(
                "checkpoint format {format}; this build reads format {FORMAT}"
            )));
        }
        let block_size = d.u32()?;
        let next_id = d.u64()?;
        let next_lease = d.u64()?;
        let alloc = BlockAllocator::from_checkpoint(block_size, d, now, format >= 4)?;
        let slabs = Slabs::from_checkpoint(d, format >= 5)?;
        let n = d.count(40)?;
        let mut moves = BTreeMap::new();
        for _ in 0..n {
            let key = (d.u64()?, d.u64()?);
            let to = BlockRef {
                server: d.u32()?,
                block: d.u32()?,
                gen: d.u64()?,
            };
            moves.insert(
                key,
                Move {
                    to,
                    fence: d.u64()?,
                },
            );
        }
        let mut blocks = |since: u8| -> ProtoResult<BTreeMap<(u32, u32), u64>> {
            let mut out = BTreeMap::new();
            if format >= since {
                let n = d.count(16)?;
                for _ in 0..n {
                    out.insert((d.u32()?, d.u32()?), d.u64()?);
                }
            }
            Ok(out)
        };
        let held = blocks(2)?;
        let ballooned = blocks(3)?;
        let mut lifetimes = Vec::new();
        if format >= 6 {
            let n = d.count(24)?;
            for _ in 0..n {
                lifetimes.push((d.u64()?, d.u64()?, d.u64()?));
            }
        }
        let mut next_session = 1;
        let mut sessions = Vec::new();
        let mut bindings = Vec::new();
        if format >= 7 {
            next_session = d.u64()?;
            let n = d.count(32)?;
            for _ in 0..n {
                let id = d.u64()?;
                let secret = u128::from(d.u64()?) | u128::from(d.u64()?) << 64;
                let lease_ms = d.u64()?;
                if id == 0 || id >= next_session {
                    return Err(Error::protocol(format!(
                        "session {id} is not below the next session id {next_session}"
                    )));
                }
                sessions.push((id, Session { secret, lease_ms }));
            }
            let n = d.count(16)?;
            for _ in 0..n {
                bindings.push((d.u64()?, d.u64()?));
            }
        }
        let mut quotas = Vec::new();
        if format >= 8 {
            let n = d.count(24)?;
            for _ in 0..n {
                let node = d.u64()?;
                quotas.push((
                    node,
                    nodekernel_proto::quota::Quota {
                        bytes: d.u64()?,
                        nodes: d.u64()?,
                    },
                ));
            }
        }
        dec.finish()?;
        let mut ns = Namespace::from_checkpoint(next_id, nodes)?;
        for (node, expires_ms, child_ttl_ms) in lifetimes {
            if ns.get(node).is_none() {
                return Err(Error::protocol(format!(
                    "node {node} has a lifetime but no record"
                )));
            }
            ns.set_lifetime(node, expires_ms, child_ttl_ms);
        }
        let life = ns.lifetimes_mut();
        life.raise_next_session(next_session);
        for (id, s) in sessions {
            life.open_session(id, s);
        }
        for (node, session) in bindings {
            if ns.get(node).is_none() || ns.lifetimes().session(session).is_none() {
                return Err(Error::protocol(format!(
                    "node {node} is bound to session {session}, but one of them does not exist"
                )));
            }
            ns.bind_session(node, session);
        }
        for (node, _) in &quotas {
            if !ns.get(*node).is_some_and(|n| n.ty.is_container()) {
                return Err(Error::protocol(format!(
                    "node {node} has a quota but is not a container"
                )));
            }
        }
        Ok(MetaState::from_parts(
            lease_ms,
            Parts {
                ns,
                alloc,
                slabs,
                next_lease,
                moves,
                held,
                ballooned,
                quotas,
            },
        ))
    }
}

fn name(covered: u64, crc: u32) -> String {
    format!("checkpoint-{covered:020}-{crc:08x}.redb")
}

/// The checkpoints in `dir`, newest last: (covered, crc, path).
fn list(dir: &Path) -> std::io::Result<Vec<(u64, u32, PathBuf)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let n = entry.file_name();
        let Some(parts) = n
            .to_str()
            .and_then(|n| n.strip_prefix("checkpoint-"))
            .and_then(|n| n.strip_suffix(".redb"))
        else {
            continue;
        };
        let Some((covered, crc)) = parts.split_once('-') else {
            continue;
        };
        if let (Ok(covered), Ok(crc)) = (covered.parse(), u32::from_str_radix(crc, 16)) {
            out.push((covered, crc, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

fn file_crc(path: &Path) -> std::io::Result<u32> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            return Ok(h.finalize());
        }
        h.update(&buf[..n]);
    }
}

/// The newest checkpoint's path, if any.
pub fn newest(dir: &Path) -> Option<PathBuf> {
    list(dir).ok()?.pop().map(|c| c.2)
}

/// Writes `image`, which holds every log record up to `covered`, as the
/// checkpoint in `dir` (replacing the old one once it is complete).
pub fn write(dir: &Path, mut image: Image, covered: u64) -> Result<(), CheckpointError> {
    let tmp = dir.join(TMP_FILE);
    let e = err(&tmp);
    image.nodes.sort_unstable_by_key(|n| n.0);
    // Created here, empty, with mode 0600 whatever the umask (redb would
    // create it with the umask's mode), then initialised by redb.
    drop(crate::floor::create_private(&tmp).map_err(|x| e(x.to_string()))?);
    let db = Database::create(&tmp).map_err(|x| e(x.to_string()))?;
    let tx = db.begin_write().map_err(|x| e(x.to_string()))?;
    {
        let mut t = tx.open_table(NODES).map_err(|x| e(x.to_string()))?;
        for (id, rec) in image.node_records() {
            t.insert(id, rec).map_err(|x| e(x.to_string()))?;
        }
        let mut p = tx.open_table(PARTS).map_err(|x| e(x.to_string()))?;
        p.insert("state", &image.state[..])
            .map_err(|x| e(x.to_string()))?;
    }
    tx.commit().map_err(|x| e(x.to_string()))?;
    drop(db);
    let crc = file_crc(&tmp).map_err(|x| e(x.to_string()))?;
    let path = dir.join(name(covered, crc));
    std::fs::rename(&tmp, &path).map_err(|x| e(format!("renaming it: {x}")))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|x| e(format!("syncing {}: {x}", dir.display())))?;
    let older = list(dir).map_err(|x| e(x.to_string()))?;
    for (c, _, p) in older {
        if c < covered {
            std::fs::remove_file(&p).map_err(|x| e(format!("removing {}: {x}", p.display())))?;
        }
    }
    Ok(())
}

/// The checkpoint in `dir`, if there is one: the state (every storage
/// server counted as seen at `now`) and the last log record it holds.
pub fn read(
    dir: &Path,
    lease_ms: u64,
    now: u64,
) -> Result<Option<(MetaState, u64)>, CheckpointError> {
    let Some((covered, crc, path)) = list(dir).map_err(|x| err(dir)(x.to_string()))?.pop() else {
        return Ok(None);
    };
    let e = err(&path);
    nodekernel_journal::make_private(&path);
    let got = file_crc(&path).map_err(|x| e(x.to_string()))?;
    if got != crc {
        return Err(e(format!(
            "its bytes do not match the checksum in its name ({got:08x}): the file is damaged; restore it from a backup or move it away"
        )));
    }
    // Read-only: a plain open may write to the file (and so change the
    // bytes its name's checksum covers).
    let db = ReadOnlyDatabase::open(&path).map_err(|x| e(x.to_string()))?;
    let rx = db.begin_read().map_err(|x| e(x.to_string()))?;
    let parts = rx.open_table(PARTS).map_err(|x| e(x.to_string()))?;
    let part = |k: &str| -> Result<Vec<u8>, CheckpointError> {
        parts
            .get(k)
            .map_err(|x| e(x.to_string()))?
            .map(|v| v.value().to_vec())
            .ok_or_else(|| e(format!("its {k} part is missing")))
    };
    let state = part("state")?;
    let nodes = rx.open_table(NODES).map_err(|x| e(x.to_string()))?;
    let count = nodes.len().map_err(|x| e(x.to_string()))?;
    let records = Counted {
        left: usize::try_from(count).unwrap_or(usize::MAX),
        inner: nodes.iter().map_err(|x| e(x.to_string()))?.map(|r| {
            r.map(|(k, v)| (k.value(), v.value().to_vec()))
                .map_err(|x| nodekernel_proto::Error::protocol(x.to_string()))
        }),
    };
    let st = MetaState::from_checkpoint(lease_ms, &state, records, now)
        .map_err(|x| e(format!("it does not decode: {}", x.message)))?;
    Ok(Some((st, covered)))
}

/// An iterator that knows how many items it yields (redb's does not say),
/// so the node table is sized once.
struct Counted<I> {
    inner: I,
    left: usize,
}

impl<I: Iterator> Iterator for Counted<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<I::Item> {
        let x = self.inner.next()?;
        self.left = self.left.saturating_sub(1);
        Some(x)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, None)
    }
}
