//! Tests of the state machine, one file per request family (as the
//! state's own files); the helpers they share are here.

use super::*;
use crate::namespace::ROOT;
use crate::snapshot::PAGE_BYTES;
use nodekernel_proto::cap::{Rights, Use};
use nodekernel_proto::crypt;
use nodekernel_proto::meta::SnapshotEntry;
use nodekernel_proto::record::SLOT_SIZE;
use nodekernel_proto::store::TAG_LEN;
use nodekernel_proto::types::{DrainState, DrainStatus};
use nodekernel_proto::{BlockLoc, ErrorCode, NodeInfo, NodeType, RecordLoc, ServerSpec, NO_CLASS};
use NodeType::*;

mod apply;
mod drains;
mod encryption;
mod invariants;
mod leases;
mod lifetimes;
mod moves;
mod names;
mod pieces;
mod quotas;
mod replies;
mod reserved;
mod servers;
mod sessions;
mod small_files;
mod snapshots;
mod tiering;
mod writes;

const BS: u32 = 4096;

fn spec(addr: &str, class: u8, n: u32) -> ServerSpec {
    ServerSpec {
        addr: addr.into(),
        class,
        class_name: format!("c{class}"),
        medium: "dram".into(),
        location: "h".into(),
        block_size: BS,
        first_block: 0,
        num_blocks: n,
        identity: format!("id-{}", addr.replace(':', "-")),
        incarnation: 1,
        cap_key: [7; 32],
    }
}

/// 4 DRAM blocks (class 0) and 9 file blocks (class 1); the root's first
/// record block (from the slowest class) is taken up front, so tests see 4
/// free DRAM and 8 file blocks.
fn state() -> MetaState {
    let mut s = MetaState::new(BS, 1000, 1);
    for (class, n) in [(0u8, 4u32), (1, 9)] {
        s.apply(
            MetaRequest::Register(spec(&format!("h:{class}"), class, n)),
            0,
        )
        .unwrap();
    }
    create(&mut s, "/setup", Directory, 0).unwrap();
    s.check_invariants().unwrap();
    s
}

fn create(s: &mut MetaState, path: &str, ty: NodeType, now: u64) -> Result<NodeInfo> {
    create_with(s, path, ty, NO_CLASS, true, now)
}

fn create_with(
    s: &mut MetaState,
    path: &str,
    ty: NodeType,
    class: u8,
    enumerable: bool,
    now: u64,
) -> Result<NodeInfo> {
    create_req(s, path, ty, class, enumerable, false, now)
}

/// A Create that, with `open_existing`, opens an existing File instead.
fn create_req(
    s: &mut MetaState,
    path: &str,
    ty: NodeType,
    class: u8,
    enumerable: bool,
    open_existing: bool,
    now: u64,
) -> Result<NodeInfo> {
    let mut req = create_request(path, ty);
    if let MetaRequest::Create {
        storage_class,
        enumerable: e,
        open_existing: o,
        ..
    } = &mut req
    {
        (*storage_class, *e, *o) = (class, enumerable, open_existing);
    }
    match s.apply(req, now)? {
        MetaReply::Node(n) => Ok(n),
        r => panic!("unexpected {r:?}"),
    }
}

/// A plain Create of `path` (mode 0o644, no class, no TTL), for a test to
/// change what it needs.
fn create_request(path: &str, ty: NodeType) -> MetaRequest {
    MetaRequest::Create {
        path: path.into(),
        ty,
        storage_class: NO_CLASS,
        location: String::new(),
        enumerable: true,
        size_hint: 0,
        pinned: false,
        mode: 0o644,
        mtime: 0,
        open_existing: false,
        ttl_ms: 0,
        child_ttl_ms: 0,
        session: None,
    }
}

fn lookup(s: &mut MetaState, path: &str) -> Result<NodeInfo> {
    match s.apply(MetaRequest::Lookup { path: path.into() }, 0)? {
        MetaReply::Node(n) => Ok(n),
        r => panic!("unexpected {r:?}"),
    }
}

fn remove(s: &mut MetaState, path: &str, recursive: bool) -> Result<Option<RecordLoc>> {
    match s.apply(
        MetaRequest::Remove {
            path: path.into(),
            recursive,
        },
        0,
    )? {
        MetaReply::Record(r) => Ok(r),
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
            first_write: 0,
        },
        0,
    )? {
        MetaReply::Blocks { size, blocks } => Ok((size, blocks)),
        r => panic!("unexpected {r:?}"),
    }
}

fn sync(s: &mut MetaState, n: &NodeInfo, size: u64, close: bool) -> Result<Option<RecordLoc>> {
    let req = MetaRequest::Sync {
        node: n.id,
        lease: n.lease,
        size,
        close,
        mtime: 0,
    };
    match s.apply(req, 0)? {
        MetaReply::Record(r) => Ok(r),
        r => panic!("unexpected {r:?}"),
    }
}

fn close(s: &mut MetaState, n: &NodeInfo, size: u64) -> Result<Option<RecordLoc>> {
    sync(s, n, size, true)
}

/// A put: create the KeyValue, write `blocks` blocks, close at `size`.
fn put(s: &mut MetaState, path: &str, size: u64) -> Result<NodeInfo> {
    let k = create(s, path, KeyValue, 0)?;
    if size > 0 {
        map(s, k.id, 0, size.div_ceil(BS as u64) as u32, k.lease)?;
    }
    close(s, &k, size)?;
    Ok(k)
}

fn children(s: &MetaState, path: &str) -> Vec<String> {
    s.ns().children(path).unwrap()
}

/// `req`, a storage server's request about server `id`, signed as that
/// server signs it (with the key it registered and a fresh sequence
/// number).
fn signed(s: &MetaState, id: u32, mut req: MetaRequest) -> MetaRequest {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let key = *s.alloc().cap_key(id).expect("a registered server");
    req.sign(&key, SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    req
}

/// At `now`, every storage server but `alive` has been silent too long.
/// The ticker's liveness step: servers silent for longer than `after` ms
/// at `now` are declared dead.
fn expire(s: &mut MetaState, now: u64, after: u64) {
    if let Some(d) = s.decide_liveness(now, after) {
        s.commit(d, now);
    }
}

fn only_alive(s: &mut MetaState, alive: u32, now: u64) {
    let beat = MetaRequest::Heartbeat {
        server: alive,
        traffic: Default::default(),
        signed: Default::default(),
    };
    s.apply(signed(s, alive, beat), now).unwrap();
    expire(s, now, 1000);
}

/// A write of `len` bytes from the start of `l`'s block, now.
fn whole(l: &BlockLoc, len: u32) -> Use {
    Use {
        block: l.block,
        gen: l.gen,
        offset: 0,
        len,
        needs: Rights::WRITE,
        now: 0,
    }
}

/// [`whole`] as a read.
fn read(l: &BlockLoc, len: u32) -> Use {
    Use {
        needs: Rights::READ,
        ..whole(l, len)
    }
}

/// A state with one DRAM server of `dram` and one file server of `file`
/// blocks of `bs` bytes.
fn state_of(bs: u32, dram: u32, file: u32) -> MetaState {
    let mut s = MetaState::new(bs, 1000, 1);
    for (class, n) in [(0u8, dram), (1, file)] {
        if n == 0 {
            continue;
        }
        let spec = ServerSpec {
            block_size: bs,
            ..spec(&format!("h:{class}"), class, n)
        };
        s.apply(MetaRequest::Register(spec), 0).unwrap();
    }
    s
}

/// Classes 0 (plain) and 1 (encrypted).
fn encrypt_class_1(s: &mut MetaState) {
    let class = |c: u8, encrypt: bool| ClassInfo {
        class: c,
        name: format!("c{c}"),
        price_per_gib: 0.0,
        encrypt,
    };
    s.set_classes(vec![class(0, false), class(1, true)]);
}

/// A put of a value of known `size` (what `Client::put` sends).
fn put_small(s: &mut MetaState, path: &str, size: u64) -> Result<NodeInfo> {
    let k = create_with_hint(s, path, size)?;
    close(s, &k, size)?;
    Ok(k)
}

fn used_blocks(s: &MetaState, class: u8) -> u64 {
    s.alloc()
        .status(0)
        .iter()
        .filter(|x| x.class == class)
        .map(|x| x.used_blocks)
        .sum()
}

fn table(s: &mut MetaState, path: &str, enumerable: bool) {
    create_with(s, path, Table, NO_CLASS, enumerable, 0).unwrap();
}

fn create_with_hint(s: &mut MetaState, path: &str, size: u64) -> Result<NodeInfo> {
    create_hinted(s, path, NO_CLASS, size)
}

/// A KeyValue of class `class` (or none) whose size, `size`, is known.
fn create_hinted(s: &mut MetaState, path: &str, class: u8, size: u64) -> Result<NodeInfo> {
    let mut req = create_request(path, KeyValue);
    if let MetaRequest::Create {
        storage_class,
        size_hint,
        ..
    } = &mut req
    {
        (*storage_class, *size_hint) = (class, size);
    }
    match s.apply(req, 0)? {
        MetaReply::Node(n) => Ok(n),
        r => panic!("unexpected {r:?}"),
    }
}

/// A state rebuilt from the records of every decision, as a restarted
/// server rebuilds it from its operation log.
fn restart(s: &mut MetaState, records: &[bytes::Bytes]) -> MetaState {
    let mut r = MetaState::new(BS, 1000, 1);
    for rec in records {
        r.replay(rec).unwrap();
    }
    assert_eq!(r.dump(), s.dump(), "the log rebuilds the state exactly");
    r.restarted(0);
    if let Some(d) = r.decide_restart(1 << 40) {
        r.commit(d, 0);
    }
    r.check_invariants().unwrap();
    r
}

/// Executes `req`, keeping its effects as a log record.
fn logged(s: &mut MetaState, log: &mut Vec<bytes::Bytes>, req: MetaRequest) -> Result<MetaReply> {
    let o = s.execute(&req, 0)?;
    let mut rec = bytes::BytesMut::new();
    crate::codec::encode_effects(&o.effects, &mut rec);
    log.push(rec.freeze());
    Ok(o.reply)
}

fn is_free(s: &MetaState, loc: &BlockLoc) -> bool {
    s.alloc()
        .server(loc.server)
        .is_some_and(|x| x.free.contains(loc.block))
}

/// A File of `blocks` whole blocks, closed.
fn file(s: &mut MetaState, path: &str, blocks: u32) -> NodeInfo {
    let f = create(s, path, File, 0).unwrap();
    map(s, f.id, 0, blocks, f.lease).unwrap();
    close(s, &f, blocks as u64 * BS as u64).unwrap();
    f
}

fn resize(
    s: &mut MetaState,
    server: &str,
    blocks: u32,
) -> Result<nodekernel_proto::types::ResizeStatus> {
    let req = MetaRequest::Resize {
        server: server.into(),
        blocks,
        signed: Default::default(),
    };
    let req = match s.alloc().find_server(server) {
        Some(id) => signed(s, id, req),
        None => req,
    };
    match s.apply(req, 0)? {
        MetaReply::Resized(r) => Ok(r),
        r => panic!("{r:?}"),
    }
}

/// `s` written to a checkpoint image and read back.
fn through_checkpoint(s: &MetaState) -> MetaState {
    let image = s.checkpoint_image();
    MetaState::from_checkpoint(
        1000,
        &image.state,
        image.node_records().map(|(id, r)| Ok((id, r.to_vec()))),
        0,
    )
    .unwrap()
}

fn truncate(s: &mut MetaState, n: &NodeInfo, size: u64, mtime: u64) -> Result<()> {
    match s.apply(
        MetaRequest::Truncate {
            node: n.id,
            lease: n.lease,
            size,
            mtime,
        },
        0,
    )? {
        MetaReply::Done => Ok(()),
        r => panic!("unexpected {r:?}"),
    }
}
