use super::*;
use crate::namespace::ROOT;
use crate::snapshot::PAGE_BYTES;
use nodekernel_proto::cap::{Rights, Use};
use nodekernel_proto::crypt;
use nodekernel_proto::meta::SnapshotEntry;
use nodekernel_proto::record::RECORD_SIZE;
use nodekernel_proto::store::TAG_LEN;
use nodekernel_proto::types::{DrainState, DrainStatus};
use nodekernel_proto::{BlockLoc, ErrorCode, NodeInfo, NodeType, RecordLoc, ServerSpec, NO_CLASS};
use NodeType::*;

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
    match s.apply(
        MetaRequest::Create {
            path: path.into(),
            ty,
            storage_class: class,
            location: String::new(),
            enumerable,
            size_hint: 0,
            pinned: false,
            mode: 0o644,
            mtime: 0,
            open_existing,
        },
        now,
    )? {
        MetaReply::Node(n) => Ok(n),
        r => panic!("unexpected {r:?}"),
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

#[test]
fn decisions_change_nothing_and_effects_replay_to_the_same_state() {
    let mut s = state();
    create(&mut s, "/t", Table, 0).unwrap();
    let before = s.dump();
    let req = MetaRequest::Create {
        path: "/t/k".into(),
        ty: KeyValue,
        storage_class: NO_CLASS,
        location: String::new(),
        enumerable: true,
        size_hint: 0,
        pinned: false,
        mode: 0o644,
        mtime: 0,
        open_existing: false,
    };
    let d = s.decide(&req, 5).unwrap();
    assert!(!d.effects.is_empty());
    assert_eq!(s.dump(), before, "deciding changed nothing");
    let again = s.decide(&req, 5).unwrap();
    assert_eq!(
        d, again,
        "the same state and request decide the same effects"
    );
    // A failing request decides nothing and changes nothing.
    assert!(s
        .decide(
            &MetaRequest::Lookup {
                path: "/nope".into()
            },
            0
        )
        .is_err());
    let bad = MetaRequest::Create {
        path: "/t/dir".into(),
        ty: Directory,
        storage_class: NO_CLASS,
        location: String::new(),
        enumerable: true,
        size_hint: 0,
        pinned: false,
        mode: 0o644,
        mtime: 0,
        open_existing: false,
    };
    assert_eq!(s.apply(bad, 0).unwrap_err().code, ErrorCode::TypeMismatch);
    assert_eq!(s.dump(), before);
}

#[test]
fn node_type_table() {
    for parent in [Directory, Table, Bag] {
        for child in NodeType::ALL {
            let mut s = state();
            create(&mut s, "/p", parent, 0).unwrap();
            let r = create(&mut s, "/p/c", child, 0);
            if parent.accepts(child) {
                r.unwrap();
            } else {
                let e = r.unwrap_err();
                assert_eq!(e.code, ErrorCode::TypeMismatch, "{parent} <- {child}");
                assert!(e.message.contains("/p/c"), "{}", e.message);
            }
            s.check_invariants().unwrap();
        }
    }
    let mut s = state();
    create(&mut s, "/f", File, 0).unwrap();
    create(&mut s, "/t", Table, 0).unwrap();
    put(&mut s, "/t/k", 0).unwrap();
    for p in ["/f/x", "/t/k/x"] {
        assert_eq!(
            create(&mut s, p, File, 0).unwrap_err().code,
            ErrorCode::TypeMismatch
        );
    }
}

#[test]
fn write_lease_map_sync_cycle() {
    let mut s = state();
    let f = create(&mut s, "/f", File, 0).unwrap();
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
        mtime: 0,
    };
    assert_eq!(s.apply(too_big, 0).unwrap_err().code, ErrorCode::OutOfRange);
    close(&mut s, &f, 5000).unwrap();
    let (size, blocks) = map(&mut s, f.id, 0, 10, 0).unwrap();
    assert_eq!(
        (size, blocks.len()),
        (5000, 2),
        "closing trimmed the 4 unused blocks"
    );
    assert_eq!(
        sync(&mut s, &f, 5000, false).unwrap_err().code,
        ErrorCode::LeaseExpired,
        "closed: the old lease is gone"
    );
    s.apply(MetaRequest::OpenWrite { path: "/f".into() }, 0)
        .unwrap();
    s.check_invariants().unwrap();
}

fn total_used(s: &MetaState) -> u64 {
    used_blocks(s, 0) + used_blocks(s, 1)
}

/// A File writer that vanished without a close (issue 36, defect 7): once
/// its lease has been expired for the grace, the sweep frees the blocks
/// past the published size (fenced, like every free) and releases the
/// lease; the published bytes stay, in blocks fenced against the old
/// writer, and a later writer appends from the published size.
#[test]
fn a_lapsed_file_lease_frees_the_unpublished_blocks_and_fences_the_rest() {
    let mut s = state();
    let used = total_used(&s);
    let f = create(&mut s, "/f", File, 0).unwrap();
    let (_, old) = map(&mut s, f.id, 0, 5, f.lease).unwrap();
    let published = BS as u64 + 100;
    sync(&mut s, &f, published, false).unwrap();
    assert_eq!(total_used(&s), used + 5);
    s.take_claims();
    // The lease expires at 1000; the sweep waits out the grace (1000).
    assert!(s.decide_sweep(1999, 1000).is_none(), "within the grace");
    let d = s.decide_sweep(2000, 1000).expect("the writer is gone");
    s.commit(d, 2000);
    s.check_invariants().unwrap();
    assert_eq!(
        total_used(&s),
        used + 2,
        "the 3 blocks past the published size came back"
    );
    let claims = s.take_claims();
    let (size, now) = map(&mut s, f.id, 0, 10, 0).unwrap();
    assert_eq!(
        (size, now.len()),
        (published, 2),
        "the published bytes stay"
    );
    for (i, b) in now.iter().enumerate() {
        assert_eq!((b.server, b.block), (old[i].server, old[i].block));
        assert!(b.gen > old[i].gen, "kept block {i} is fenced");
        assert!(claims.iter().any(|c| c.block == b.block && c.gen == b.gen));
    }
    for b in &old[2..] {
        assert!(
            claims
                .iter()
                .any(|c| (c.server, c.block) == (b.server, b.block) && c.gen > b.gen),
            "freed block {} is claimed at a new generation",
            b.block
        );
    }
    assert_eq!(claims.len(), 5);
    // The old writer is out: its lease is gone.
    assert_eq!(
        sync(&mut s, &f, published, false).unwrap_err().code,
        ErrorCode::LeaseExpired
    );
    assert_eq!(
        map(&mut s, f.id, 2, 1, f.lease).unwrap_err().code,
        ErrorCode::LeaseExpired
    );
    assert!(
        s.decide_sweep(5000, 1000).is_none(),
        "nothing left to sweep"
    );
    // A new writer gets it at once (no fence needed any more) and appends
    // from the published size.
    let MetaReply::Node(n) = s
        .apply(MetaRequest::OpenWrite { path: "/f".into() }, 2001)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(n.size, published);
    assert!(s.take_claims().is_empty(), "nothing to fence");
    let (_, more) = map(&mut s, f.id, 2, 1, n.lease).unwrap();
    assert_eq!(more.len(), 1);
    close(&mut s, &n, 2 * BS as u64 + 1).unwrap();
    assert_eq!(total_used(&s), used + 3);
    s.check_invariants().unwrap();
}

/// The lapse minds what else holds the node's blocks: a move of an
/// unpublished block is given up (its target freed too), a move of a
/// kept block as well (the block is fenced under it), and a small File's
/// piece stays, its slab fenced.
#[test]
fn a_lapse_gives_up_moves_and_keeps_a_small_files_piece() {
    let mut s = state();
    let used = total_used(&s);
    let f = create(&mut s, "/f", File, 0).unwrap();
    map(&mut s, f.id, 0, 3, f.lease).unwrap();
    sync(&mut s, &f, 10, false).unwrap();
    for index in [0, 2] {
        let (d, _, _) = s.decide_move_start(f.id, index, NO_CLASS).unwrap();
        s.commit(d, 0);
    }
    assert_eq!(s.moves().count(), 2);
    create(&mut s, "/t", Table, 0).unwrap();
    let k = create_with_hint(&mut s, "/t/k", 100).unwrap();
    let piece = k.first_block.clone().expect("a small value's piece");
    sync(&mut s, &k, 50, true).unwrap();
    let MetaReply::Node(w) = s
        .apply(
            MetaRequest::OpenWrite {
                path: "/t/k".into(),
            },
            0,
        )
        .unwrap()
    else {
        panic!()
    };
    let used_then = total_used(&s);
    s.take_claims();
    let d = s.decide_sweep(3000, 1000).expect("both writers are gone");
    s.commit(d, 3000);
    s.check_invariants().unwrap();
    assert_eq!(s.moves().count(), 0, "moves given up");
    assert_eq!(
        total_used(&s),
        used_then - 4,
        "blocks 1 and 2 and both move targets came back"
    );
    let (size, blocks) = map(&mut s, f.id, 0, 3, 0).unwrap();
    assert_eq!((size, blocks.len()), (10, 1));
    let (size, blocks) = map(&mut s, k.id, 0, 1, 0).unwrap();
    assert_eq!(size, 50, "the small value keeps its published bytes");
    let now = &blocks[0];
    assert_eq!((now.block, now.offset), (piece.block, piece.offset));
    assert!(now.gen > piece.gen, "its slab is fenced");
    assert_eq!(
        sync(&mut s, &w, 50, false).unwrap_err().code,
        ErrorCode::LeaseExpired
    );
    remove(&mut s, "/f", false).unwrap();
    remove(&mut s, "/t", true).unwrap();
    assert_eq!(total_used(&s), used);
    s.check_invariants().unwrap();
}

/// A takeover after the lease expired (before the sweep came) frees the
/// old writer's unpublished blocks too.
#[test]
fn a_takeover_frees_what_the_old_writer_did_not_publish() {
    let mut s = state();
    let used = total_used(&s);
    let f = create(&mut s, "/f", File, 0).unwrap();
    map(&mut s, f.id, 0, 4, f.lease).unwrap();
    sync(&mut s, &f, 100, false).unwrap();
    let MetaReply::Node(n) = s
        .apply(MetaRequest::OpenWrite { path: "/f".into() }, 1500)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(n.size, 100);
    assert_eq!(total_used(&s), used + 1, "only the published block stays");
    s.check_invariants().unwrap();
}

fn open_or_create(s: &mut MetaState, path: &str, ty: NodeType, now: u64) -> Result<NodeInfo> {
    create_req(s, path, ty, NO_CLASS, true, true, now)
}

#[test]
fn append_or_create_opens_an_existing_file_and_creates_a_missing_one() {
    let mut s = state();
    create(&mut s, "/b", Bag, 0).unwrap();
    let f = open_or_create(&mut s, "/b/f", File, 0).unwrap();
    assert_ne!(f.lease, 0, "a created File comes back leased");
    assert_eq!(
        open_or_create(&mut s, "/b/f", File, 1).unwrap_err().code,
        ErrorCode::Busy,
        "one writer at a time"
    );
    map(&mut s, f.id, 0, 1, f.lease).unwrap();
    close(&mut s, &f, 100).unwrap();
    let again = open_or_create(&mut s, "/b/f", File, 2).unwrap();
    assert_eq!(again.id, f.id, "the existing File is opened, not replaced");
    assert_eq!(again.size, 100, "its bytes stay: the writer appends");
    assert_ne!(again.lease, 0);
    close(&mut s, &again, 100).unwrap();
    assert_eq!(children(&s, "/b"), ["f"]);

    create(&mut s, "/t", Table, 0).unwrap();
    put(&mut s, "/t/k", 10).unwrap();
    create(&mut s, "/d", Directory, 0).unwrap();
    for (path, want) in [
        ("/b", ErrorCode::AlreadyExists),
        ("/t/k", ErrorCode::TypeMismatch),
        ("/d", ErrorCode::AlreadyExists),
        ("/missing/f", ErrorCode::NotFound),
    ] {
        assert_eq!(
            open_or_create(&mut s, path, File, 3).unwrap_err().code,
            want,
            "{path}"
        );
    }
    assert_eq!(
        open_or_create(&mut s, "/t/k2", KeyValue, 3)
            .unwrap_err()
            .code,
        ErrorCode::InvalidArgument,
        "only a File is opened if it exists"
    );
    s.check_invariants().unwrap();
}

#[test]
fn a_lease_taken_over_fences_the_old_writer_at_the_storage_layer() {
    let mut s = state();
    let f = create(&mut s, "/f", File, 0).unwrap();
    let (_, old) = map(&mut s, f.id, 0, 2, f.lease).unwrap();
    sync(&mut s, &f, 100, false).unwrap();
    s.take_claims();
    // A new writer may open after the lease expired; until then, Busy.
    assert_eq!(
        s.apply(MetaRequest::OpenWrite { path: "/f".into() }, 500)
            .unwrap_err()
            .code,
        ErrorCode::Busy
    );
    let MetaReply::Node(n) = s
        .apply(MetaRequest::OpenWrite { path: "/f".into() }, 5000)
        .unwrap()
    else {
        panic!()
    };
    assert_ne!(n.lease, f.lease);
    assert_eq!(n.size, 100, "last synced size is kept");
    // Every block gets a new generation, claimed on its server before the
    // new writer is answered: the old writer's late writes get Stale. (The
    // unpublished block is freed, which fences it too.)
    let claims = s.take_claims();
    assert_eq!(claims.len(), 2);
    let (_, now) = map(&mut s, f.id, 0, 2, 0).unwrap();
    assert_eq!(now.len(), 1);
    for (i, b) in now.iter().enumerate() {
        assert_eq!((b.server, b.block), (old[i].server, old[i].block));
        assert!(b.gen > old[i].gen, "block {i} is fenced");
        assert!(claims.iter().any(|c| c.block == b.block && c.gen == b.gen));
    }
    assert_eq!(
        map(&mut s, f.id, 2, 1, f.lease).unwrap_err().code,
        ErrorCode::LeaseExpired
    );
    // A clean close hands over without fencing.
    let n2 = NodeInfo { ..n };
    map(&mut s, f.id, 0, 2, n2.lease).unwrap();
    close(&mut s, &n2, 100).unwrap();
    s.take_claims(); // the close freed the unpublished block
    s.apply(MetaRequest::OpenWrite { path: "/f".into() }, 5001)
        .unwrap();
    assert!(s.take_claims().is_empty(), "no fence after a clean close");
    // Deleting it returns all blocks, the unpublished ones included.
    let before = s.alloc().free_blocks();
    remove(&mut s, "/f", false).unwrap();
    assert_eq!(s.alloc().free_blocks(), before + 1, "no leaked blocks");
    s.check_invariants().unwrap();
}

#[test]
fn keyvalue_put_is_invisible_until_closed_then_replaces() {
    let mut s = state();
    let t = create(&mut s, "/t", Table, 0).unwrap();
    s.take_claims();
    let k1 = create(&mut s, "/t/k", KeyValue, 0).unwrap();
    assert_eq!(
        lookup(&mut s, "/t/k").unwrap_err().code,
        ErrorCode::NotFound,
        "invisible until its close"
    );
    let (_, b1) = map(&mut s, k1.id, 0, 1, k1.lease).unwrap();
    let rec = close(&mut s, &k1, 10)
        .unwrap()
        .expect("new key: record to write");
    assert_eq!((rec.container, rec.slot, rec.offset), (t.id, 0, 0));
    assert_eq!(
        s.take_claims().len(),
        1,
        "the table's first record block is claimed"
    );
    let free_before = s.alloc().free_blocks();
    let k2 = create(&mut s, "/t/k", KeyValue, 0).unwrap();
    map(&mut s, k2.id, 0, 1, k2.lease).unwrap();
    assert_eq!(
        lookup(&mut s, "/t/k").unwrap().id,
        k1.id,
        "old value visible"
    );
    assert!(
        map(&mut s, k1.id, 0, 1, 0).is_ok(),
        "old value readable until the put closes"
    );
    assert_eq!(
        close(&mut s, &k2, 10).unwrap(),
        None,
        "same key keeps its record"
    );
    assert_eq!(lookup(&mut s, "/t/k").unwrap().id, k2.id);
    assert_eq!(
        s.alloc().free_blocks(),
        free_before,
        "old block freed, new one used"
    );
    let inv = s.take_claims();
    assert_eq!(inv.len(), 1);
    assert_eq!(inv[0].block, b1[0].block);
    assert!(
        inv[0].gen > b1[0].gen,
        "the claim carries a newer generation"
    );
    for lease in [0, k1.lease] {
        assert_eq!(
            map(&mut s, k1.id, 0, 1, lease).unwrap_err().code,
            ErrorCode::Stale
        );
    }
    assert_eq!(children(&s, "/t"), vec!["k"]);
    remove(&mut s, "/t/k", false).unwrap();
    assert_eq!(s.take_claims().len(), 1, "deleted value's block claimed");
    // A put whose table disappeared cannot be linked, and is reaped with it.
    let k3 = create(&mut s, "/t/k3", KeyValue, 0).unwrap();
    map(&mut s, k3.id, 0, 1, k3.lease).unwrap();
    let free = s.alloc().free_blocks();
    remove(&mut s, "/t", true).unwrap();
    assert_eq!(
        s.ns().shadow_count(),
        0,
        "its puts in progress went with it"
    );
    assert!(
        s.alloc().free_blocks() > free,
        "their blocks are free at once"
    );
    assert_eq!(close(&mut s, &k3, 1).unwrap_err().code, ErrorCode::Stale);
    for (p, ty) in [("/d", Directory), ("/f", File), ("/t", Table), ("/b", Bag)] {
        create(&mut s, p, ty, 0).unwrap();
        assert_eq!(
            create(&mut s, p, ty, 0).unwrap_err().code,
            ErrorCode::AlreadyExists,
            "{p}"
        );
    }
    assert_eq!(
        create(&mut s, "/", Directory, 0).unwrap_err().code,
        ErrorCode::AlreadyExists
    );
    s.check_invariants().unwrap();
}

#[test]
fn puts_get_their_first_block_and_close_trims_unused_blocks() {
    let mut s = state();
    create(&mut s, "/t", Table, 0).unwrap();
    put(&mut s, "/t/warm", 0).unwrap();
    let free = s.alloc().free_blocks();
    let k = create(&mut s, "/t/k", KeyValue, 0).unwrap();
    let b0 = k
        .first_block
        .clone()
        .expect("a put gets its first block with the create");
    assert_eq!(s.alloc().free_blocks(), free - 1);
    let (_, blocks) = map(&mut s, k.id, 0, 3, k.lease).unwrap();
    assert_eq!(blocks[0], b0, "block 0 is the one handed out");
    close(&mut s, &k, BS as u64 + 1).unwrap();
    assert_eq!(
        s.alloc().free_blocks(),
        free - 2,
        "the third block was never needed"
    );
    put(&mut s, "/t/empty", 0).unwrap();
    assert_eq!(
        s.alloc().free_blocks(),
        free - 2,
        "an empty value keeps no block"
    );
    let f = create(&mut s, "/f", File, 0).unwrap();
    assert!(
        f.first_block.is_none(),
        "Files may stay empty: no block up front"
    );
    s.check_invariants().unwrap();
}

#[test]
fn abandoned_puts_are_swept_and_aborted_puts_vanish_at_once() {
    let mut s = state();
    create(&mut s, "/t", Table, 0).unwrap();
    put(&mut s, "/t/warm", 0).unwrap();
    let free = s.alloc().free_blocks();
    let k = create(&mut s, "/t/k", KeyValue, 0).unwrap();
    map(&mut s, k.id, 0, 2, k.lease).unwrap();
    assert!(s.decide_sweep(500, 100).is_none(), "lease still valid");
    let d = s.decide_sweep(1100, 100).expect("the put is abandoned");
    s.commit(d, 1100);
    assert_eq!(s.alloc().free_blocks(), free, "no leaked blocks");
    assert_eq!(close(&mut s, &k, 0).unwrap_err().code, ErrorCode::Stale);

    // A writer that gives up aborts: nothing stays behind, at once.
    let k = create(&mut s, "/t/k", KeyValue, 0).unwrap();
    map(&mut s, k.id, 0, 2, k.lease).unwrap();
    assert_eq!(s.ns().shadow_count(), 1);
    s.apply(
        MetaRequest::Abort {
            node: k.id,
            lease: k.lease,
        },
        0,
    )
    .unwrap();
    assert_eq!(s.ns().shadow_count(), 0);
    assert_eq!(s.alloc().free_blocks(), free);
    assert_eq!(
        lookup(&mut s, "/t/k").unwrap_err().code,
        ErrorCode::NotFound
    );
    // Aborting a File keeps what was published and frees the rest.
    let f = create(&mut s, "/f", File, 0).unwrap();
    map(&mut s, f.id, 0, 3, f.lease).unwrap();
    sync(&mut s, &f, 10, false).unwrap();
    s.apply(
        MetaRequest::Abort {
            node: f.id,
            lease: f.lease,
        },
        0,
    )
    .unwrap();
    assert_eq!(lookup(&mut s, "/f").unwrap().size, 10);
    assert_eq!(map(&mut s, f.id, 0, 8, 0).unwrap().1.len(), 1);
    assert_eq!(
        s.apply(
            MetaRequest::Abort {
                node: f.id,
                lease: f.lease
            },
            0
        )
        .unwrap_err()
        .code,
        ErrorCode::LeaseExpired
    );
    s.check_invariants().unwrap();
}

#[test]
fn slots_are_cleared_before_reuse_and_moves_rewrite_records() {
    let mut s = state();
    let d = create(&mut s, "/d", Directory, 0).unwrap();
    assert!(d.record.is_some(), "root is enumerable: /d needs a record");
    let per_block = BS as u64 / RECORD_SIZE as u64;
    for i in 0..per_block + 1 {
        let f = create(&mut s, &format!("/d/f{i}"), File, 0).unwrap();
        let r = f.record.unwrap();
        assert_eq!((r.container, r.slot as u64), (d.id, i));
        assert_eq!(r.offset as u64, (i % per_block) * RECORD_SIZE as u64);
    }
    let (size, blocks) = map(&mut s, d.id, 0, 10, 0).unwrap();
    assert_eq!(size, (per_block + 1) * RECORD_SIZE as u64);
    assert_eq!(blocks.len(), 2, "container data length");
    let clear = remove(&mut s, "/d/f3", false).unwrap().unwrap();
    assert_eq!(clear.slot, 3);
    let next = create(&mut s, "/d/g", File, 0).unwrap();
    assert_eq!(
        next.record.unwrap().slot as u64,
        per_block + 1,
        "slot 3 is not reusable before its release"
    );
    s.apply(
        MetaRequest::ReleaseSlot {
            container: d.id,
            slot: 3,
        },
        0,
    )
    .unwrap();
    assert_eq!(
        s.apply(
            MetaRequest::ReleaseSlot {
                container: d.id,
                slot: 3
            },
            0
        )
        .unwrap_err()
        .code,
        ErrorCode::InvalidArgument
    );
    let again = create(&mut s, "/d/h", File, 0).unwrap();
    assert_eq!(
        again.record.unwrap().slot,
        3,
        "released slot reused, lowest first"
    );
    let e = create(&mut s, "/e", Directory, 0).unwrap();
    let MetaReply::Moved {
        ty,
        clear,
        write,
        replaced: None,
    } = s
        .apply(
            MetaRequest::Move {
                src: "/d/f0".into(),
                dst: "/e/g".into(),
                replace: false,
            },
            0,
        )
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(ty, File);
    assert_eq!(clear.map(|r| (r.container, r.slot)), Some((d.id, 0)));
    assert_eq!(write.map(|r| (r.container, r.slot)), Some((e.id, 0)));
    let MetaReply::Listing { slots, live, .. } = s
        .apply(MetaRequest::Enumerate { path: "/d".into() }, 0)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(slots as u64, per_block + 2);
    assert_eq!(
        live.iter().map(|b| b.count_ones()).sum::<u32>() as u64,
        per_block + 1
    );
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
    s.check_invariants().unwrap();
}

#[test]
fn lookup_remove_move() {
    let mut s = state();
    assert_eq!(
        lookup(&mut s, "/nope").unwrap_err().code,
        ErrorCode::NotFound
    );
    let e = create(&mut s, "/a/b", File, 0).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    assert!(e.message.contains("parent /a"), "{}", e.message);
    create(&mut s, "/a", Directory, 0).unwrap();
    create(&mut s, "/a/b", Directory, 0).unwrap();
    let f = create(&mut s, "/a/b/f", File, 0).unwrap();
    assert_eq!(
        remove(&mut s, "/a", false).unwrap_err().code,
        ErrorCode::NotEmpty
    );
    s.apply(
        MetaRequest::Move {
            src: "/a/b".into(),
            dst: "/c".into(),
            replace: false,
        },
        0,
    )
    .unwrap();
    assert_eq!(lookup(&mut s, "/c/f").unwrap().id, f.id);
    assert_eq!(
        lookup(&mut s, "/a/b").unwrap_err().code,
        ErrorCode::NotFound
    );
    for (dst, code) in [
        ("/c/f2", ErrorCode::InvalidArgument),
        ("/a", ErrorCode::AlreadyExists),
    ] {
        let e = s
            .apply(
                MetaRequest::Move {
                    src: "/c".into(),
                    dst: dst.into(),
                    replace: false,
                },
                0,
            )
            .unwrap_err();
        assert_eq!(e.code, code, "{dst}");
    }
    remove(&mut s, "/c", true).unwrap();
    assert_eq!(
        lookup(&mut s, "/c/f").unwrap_err().code,
        ErrorCode::NotFound
    );
    assert_eq!(
        map(&mut s, f.id, 0, 1, 0).unwrap_err().code,
        ErrorCode::Stale,
        "a removed node is stale"
    );
    assert_eq!(
        remove(&mut s, "/", true).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    s.check_invariants().unwrap();
}

#[test]
fn class_is_inherited_and_non_enumerable_tables_list_nothing() {
    let mut s = state();
    create_with(&mut s, "/d", Directory, 1, true, 0).unwrap();
    let f = create(&mut s, "/d/f", File, 0).unwrap();
    assert_eq!(f.storage_class, 1);
    let t = create_with(&mut s, "/t", Table, NO_CLASS, false, 0).unwrap();
    assert!(!t.enumerable);
    let k = put(&mut s, "/t/k", 1).unwrap();
    assert!(children(&s, "/t").is_empty());
    assert_eq!(lookup(&mut s, "/t/k").unwrap().id, k.id);
    assert_eq!(
        s.ns().get(k.id).unwrap().slot,
        None,
        "no record in a non-enumerable table"
    );
    assert!(s.ns().get(t.id).unwrap().slots.is_empty());
    s.check_invariants().unwrap();
}

#[test]
fn no_space_keeps_earlier_data_and_recovers_after_delete() {
    let mut s = state();
    let f = create(&mut s, "/f", File, 0).unwrap();
    let (_, got) = map(&mut s, f.id, 0, 100, f.lease).unwrap();
    assert_eq!(got.len(), 12, "partial allocation up to capacity");
    assert_eq!(
        map(&mut s, f.id, 12, 1, f.lease).unwrap_err().code,
        ErrorCode::NoSpace
    );
    close(&mut s, &f, 12 * BS as u64).unwrap();
    let g = create(&mut s, "/g", File, 0).unwrap();
    assert_eq!(
        map(&mut s, g.id, 0, 1, g.lease).unwrap_err().code,
        ErrorCode::NoSpace
    );
    assert_eq!(
        map(&mut s, f.id, 0, 100, 0).unwrap().1.len(),
        12,
        "earlier data still mapped"
    );
    remove(&mut s, "/f", false).unwrap();
    let (_, got) = map(&mut s, g.id, 0, 1, g.lease).unwrap();
    assert_eq!(got[0].class, 0, "freed DRAM is used first again");
    s.check_invariants().unwrap();
}

#[test]
fn before_any_storage_server_registers_the_error_says_so() {
    let mut s = MetaState::new(BS, 1000, 1);
    let e = create(&mut s, "/d", Directory, 0).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable);
    assert!(
        e.message.contains("no storage server has registered"),
        "{e}"
    );
    let MetaReply::Status(st) = s.apply(MetaRequest::Status, 0).unwrap() else {
        panic!()
    };
    assert!(!st.is_ready());
    s.apply(MetaRequest::Register(spec("h:0", 0, 4)), 0)
        .unwrap();
    let MetaReply::Status(st) = s.apply(MetaRequest::Status, 0).unwrap() else {
        panic!()
    };
    assert!(st.is_ready());
    create(&mut s, "/d", Directory, 0).unwrap();
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
fn only_alive(s: &mut MetaState, alive: u32, now: u64) {
    let beat = MetaRequest::Heartbeat {
        server: alive,
        traffic: Default::default(),
        signed: Default::default(),
    };
    s.apply(signed(s, alive, beat), now).unwrap();
    s.alloc_soft().expire(now, 1000);
}

#[test]
fn dead_servers_report_data_lost_and_retired_ones_leave_capacity() {
    let mut s = state();
    let f = create(&mut s, "/f", File, 0).unwrap();
    let (_, b) = map(&mut s, f.id, 0, 1, f.lease).unwrap();
    close(&mut s, &f, 10).unwrap();
    let other = if b[0].server == 1 { 2 } else { 1 };
    only_alive(&mut s, other, 5000);
    assert_eq!(
        map(&mut s, f.id, 0, 1, 0).unwrap_err().code,
        ErrorCode::DataLost
    );
    assert!(lookup(&mut s, "/f").unwrap().first_block.is_none());
    let g = create(&mut s, "/g", File, 0).unwrap();
    let (_, b2) = map(&mut s, g.id, 0, 1, g.lease).unwrap();
    assert_eq!(b2[0].server, other, "dead server gets no new blocks");
    // Retired after a while: it leaves status, its data is lost for good.
    assert!(s.decide_retire(5500, 10_000).is_none());
    let d = s.decide_retire(11_000, 10_000).unwrap();
    s.commit(d, 11_000);
    let MetaReply::Status(st) = s.apply(MetaRequest::Status, 11_000).unwrap() else {
        panic!()
    };
    assert_eq!(st.servers.len(), 1);
    assert_eq!(
        map(&mut s, f.id, 0, 1, 0).unwrap_err().code,
        ErrorCode::DataLost
    );
    // Deleting a node on a retired server is fine and claims nothing there.
    s.take_claims();
    remove(&mut s, "/f", false).unwrap();
    assert!(s.take_claims().iter().all(|c| c.server == other));
    s.check_invariants().unwrap();
}

#[test]
fn registration_is_idempotent_and_a_restarted_server_replaces_its_old_self() {
    let mut s = state();
    let reg =
        |s: &mut MetaState, sp: ServerSpec| match s.apply(MetaRequest::Register(sp), 0).unwrap() {
            MetaReply::Registered { server } => server,
            r => panic!("{r:?}"),
        };
    let sp = spec("h:0", 0, 4);
    assert_eq!(
        reg(&mut s, sp.clone()),
        1,
        "a retried registration gets the same id"
    );
    let f = create(&mut s, "/f", File, 0).unwrap();
    let (_, b) = map(&mut s, f.id, 0, 1, f.lease).unwrap();
    assert_eq!(b[0].server, 1);
    close(&mut s, &f, 10).unwrap();
    let mut restarted = sp.clone();
    restarted.incarnation = 2;
    let new = reg(&mut s, restarted);
    assert_ne!(new, 1);
    assert_eq!(
        map(&mut s, f.id, 0, 1, 0).unwrap_err().code,
        ErrorCode::DataLost,
        "the old instance's blocks are gone with it"
    );
    // The new instance's blocks are all free: nothing is handed out twice.
    let g = create(&mut s, "/g", File, 0).unwrap();
    let (_, b) = map(&mut s, g.id, 0, 4, g.lease).unwrap();
    assert!(b.iter().all(|x| x.server == new));
    s.check_invariants().unwrap();
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

/// Every location carries a capability under its server's key; a server
/// that kept its blocks and comes back with a new key (every process draws
/// one) keeps its id and blocks, and locations carry the new key's
/// capabilities from then on, also after a checkpoint.
#[test]
fn locations_carry_capabilities_under_the_servers_current_key() {
    let mut s = state();
    let f = create(&mut s, "/f", File, 0).unwrap();
    let (_, b) = map(&mut s, f.id, 0, 1, f.lease).unwrap();
    let l = &b[0];
    assert_eq!(l.server, 1);
    l.cap.check(&[7; 32], whole(l, BS)).unwrap();
    assert!(l.cap.check(&[7; 32], whole(l, BS + 1)).is_err());
    close(&mut s, &f, 10).unwrap();

    let rekeyed = ServerSpec {
        cap_key: [9; 32],
        addr: "h:0".into(),
        ..spec("h:0", 0, 4)
    };
    match s.apply(MetaRequest::Register(rekeyed), 0).unwrap() {
        MetaReply::Registered { server } => assert_eq!(server, 1, "the same server"),
        r => panic!("{r:?}"),
    }
    let (_, b) = map(&mut s, f.id, 0, 1, 0).unwrap();
    let l = &b[0];
    assert_eq!(l.server, 1, "its blocks are kept");
    l.cap.check(&[9; 32], read(l, BS)).unwrap();
    assert_eq!(
        l.cap.check(&[7; 32], read(l, BS)).unwrap_err().code,
        ErrorCode::Stale
    );
    let back = through_checkpoint(&s);
    assert_eq!(back.alloc().cap_key(1), Some(&[9; 32]));
    s.check_invariants().unwrap();
}

#[test]
fn a_huge_registration_costs_nothing_up_front() {
    let mut s = MetaState::new(BS, 1000, 1);
    let sp = spec("h:0", 0, crate::alloc::MAX_SERVER_BLOCKS);
    s.apply(MetaRequest::Register(sp), 0).unwrap();
    let mut too_big = spec("h:1", 0, u32::MAX);
    too_big.identity = "other".into();
    assert_eq!(
        s.apply(MetaRequest::Register(too_big), 0).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    let f = create(&mut s, "/f", File, 0).unwrap();
    assert_eq!(map(&mut s, f.id, 0, 8, f.lease).unwrap().1.len(), 8);
}

#[test]
fn a_writer_replaces_a_block_on_an_unreachable_server() {
    let mut s = state();
    let f = create(&mut s, "/f", File, 0).unwrap();
    let (_, b) = map(&mut s, f.id, 0, 2, f.lease).unwrap();
    sync(&mut s, &f, 10, false).unwrap();
    let replace = |s: &mut MetaState, index: u64, gen: u64| {
        s.apply(
            MetaRequest::ReplaceBlock {
                node: f.id,
                lease: f.lease,
                index,
                gen,
            },
            0,
        )
    };
    assert_eq!(
        replace(&mut s, 0, b[0].gen).unwrap_err().code,
        ErrorCode::InvalidArgument,
        "block 0 holds published bytes"
    );
    let MetaReply::Blocks { blocks, .. } = replace(&mut s, 1, b[1].gen).unwrap() else {
        panic!()
    };
    assert_ne!(blocks[0].server, b[1].server, "another server");
    // The failing server gets no new blocks until it heartbeats again.
    let (_, more) = map(&mut s, f.id, 2, 1, f.lease).unwrap();
    assert_ne!(more[0].server, b[1].server);
    // An outdated location just gets the current one back.
    let MetaReply::Blocks { blocks: again, .. } = replace(&mut s, 1, b[1].gen).unwrap() else {
        panic!()
    };
    assert_eq!(again, blocks);
    s.check_invariants().unwrap();
}

#[test]
fn a_big_delete_unlinks_at_once_and_reaps_in_bounded_steps() {
    let mut s = MetaState::new(BS, 1000, 1);
    s.apply(MetaRequest::Register(spec("h:0", 0, 100_000)), 0)
        .unwrap();
    create(&mut s, "/big", Directory, 0).unwrap();
    create(&mut s, "/big/sub", Directory, 0).unwrap();
    let n = REAP_NODES * 2 + 10;
    for i in 0..n {
        let f = create(&mut s, &format!("/big/sub/f{i}"), File, 0).unwrap();
        map(&mut s, f.id, 0, 2, f.lease).unwrap();
        close(&mut s, &f, 2 * BS as u64).unwrap();
    }
    let free = s.alloc().free_blocks();
    let d = s
        .decide(
            &MetaRequest::Remove {
                path: "/big".into(),
                recursive: true,
            },
            0,
        )
        .unwrap();
    assert!(
        d.effects.len() < 4,
        "a big subtree is only unlinked: {}",
        d.effects.len()
    );
    s.commit(d, 0);
    assert_eq!(
        lookup(&mut s, "/big").unwrap_err().code,
        ErrorCode::NotFound
    );
    s.check_invariants().unwrap();
    let mut steps = 0;
    while let Some(d) = s.decide_reap() {
        let freed = d
            .effects
            .iter()
            .filter(|e| matches!(e, Effect::BlockFreed { .. }))
            .count();
        assert!(
            freed <= REAP_BLOCKS,
            "a step frees at most {REAP_BLOCKS} blocks"
        );
        s.commit(d, 0);
        s.check_invariants().unwrap();
        steps += 1;
        assert!(steps < 1000, "reaping ends");
    }
    assert!(steps >= 3, "{steps} steps");
    assert_eq!(s.ns().len(), 1, "only the root is left");
    let root_records = s.ns().get(ROOT).unwrap().blocks.len() as u64;
    assert!(s.alloc().free_blocks() > free + 2 * n as u64);
    assert_eq!(
        s.alloc().free_blocks(),
        100_000 - root_records,
        "every block but the root's records is free again"
    );
}

#[test]
fn a_metadata_server_serves_only_its_own_partition() {
    let mut s = state();
    s.set_placement(Placement {
        partition: 0,
        partitions: 2,
        expected_servers: 1,
    });
    let (mine, theirs): (Vec<String>, Vec<String>) = (0..20)
        .map(|i| format!("/top{i}"))
        .partition(|p| path::partition_of(p, 2) == 0);
    let e = create(&mut s, &theirs[0], Directory, 0).unwrap_err();
    assert_eq!(e.code, ErrorCode::WrongPartition);
    assert!(e.message.contains("partition 1 of 2"), "{e}");
    assert_eq!(
        lookup(&mut s, &theirs[0]).unwrap_err().code,
        ErrorCode::WrongPartition
    );
    create(&mut s, &mine[0], Directory, 0).unwrap();
    let e = s
        .apply(
            MetaRequest::Move {
                src: mine[0].clone(),
                dst: theirs[0].clone(),
                replace: false,
            },
            0,
        )
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::CrossPartition);
    lookup(&mut s, "/").unwrap();
    s.apply(MetaRequest::Enumerate { path: "/".into() }, 0)
        .unwrap();
}

#[test]
fn a_block_moves_while_its_node_stays_put() {
    let mut s = state();
    let f = create(&mut s, "/f", File, 0).unwrap();
    let (_, b) = map(&mut s, f.id, 0, 2, f.lease).unwrap();
    close(&mut s, &f, 2 * BS as u64).unwrap();
    let from_class = b[0].class;
    let to_class = 1 - from_class;
    let (d, src, dst) = s.decide_move_start(f.id, 0, to_class).unwrap();
    s.commit(d, 0);
    assert_eq!((src.server, src.block), (b[0].server, b[0].block));
    assert!(src.gen > b[0].gen, "the source is fenced");
    assert_eq!(dst.class, to_class);
    assert_eq!(
        map(&mut s, f.id, 0, 2, 0).unwrap_err().code,
        ErrorCode::TryAgain,
        "maps of a moving block say try again"
    );
    assert!(lookup(&mut s, "/f").unwrap().first_block.is_none());
    s.check_invariants().unwrap();
    let d = s.decide_move_end(f.id, 0, true).unwrap();
    s.commit(d, 0);
    let (_, now) = map(&mut s, f.id, 0, 2, 0).unwrap();
    assert_eq!(
        (now[0].server, now[0].block, now[0].gen),
        (dst.server, dst.block, dst.gen)
    );
    assert_eq!(
        (now[1].server, now[1].block, now[1].gen),
        (b[1].server, b[1].block, b[1].gen),
        "block 1 stays"
    );
    s.check_invariants().unwrap();
    // A failed copy leaves the block where it was (fenced).
    let (d, src, _) = s.decide_move_start(f.id, 1, from_class).unwrap();
    s.commit(d, 0);
    let d = s.decide_move_end(f.id, 1, false).unwrap();
    s.commit(d, 0);
    let (_, now) = map(&mut s, f.id, 1, 1, 0).unwrap();
    assert_eq!((now[0].server, now[0].gen), (src.server, src.gen));
    // A move that the node's deletion overtakes gives its target back.
    let free = s.alloc().free_blocks();
    let (d, _, _) = s.decide_move_start(f.id, 0, NO_CLASS).unwrap();
    s.commit(d, 0);
    remove(&mut s, "/f", false).unwrap();
    assert!(s.decide_move_end(f.id, 0, true).is_none());
    assert_eq!(s.alloc().free_blocks(), free + 2);
    s.check_invariants().unwrap();
}

fn drain(s: &mut MetaState, server: &str, cancel: bool) -> Result<DrainStatus> {
    match s.apply(
        MetaRequest::Drain {
            server: server.into(),
            cancel,
        },
        0,
    )? {
        MetaReply::Drain(d) => Ok(d),
        r => panic!("unexpected {r:?}"),
    }
}

/// Runs every move the drains ask for (copies succeed).
fn run_drains(s: &mut MetaState) -> u64 {
    let mut moved = 0;
    loop {
        let batch = s.drain_candidates(3);
        if batch.is_empty() {
            return moved;
        }
        for (node, index, class, server) in batch {
            let (d, src, dst) = s.decide_move_start(node, index, class).unwrap();
            assert_eq!(src.server, server);
            assert_ne!(dst.server, server, "never back onto the drained server");
            s.commit(d, 0);
            let d = s.decide_move_end(node, index, true).unwrap();
            s.commit(d, 0);
            s.note_drain_move(server, Ok(()));
            s.check_invariants().unwrap();
            moved += 1;
        }
    }
}

#[test]
fn a_drained_server_gets_no_new_blocks_and_ends_empty() {
    // Two DRAM servers and a file server.
    let mut s = state();
    s.apply(MetaRequest::Register(spec("h:2", 0, 6)), 0)
        .unwrap();
    // A directory whose child records and a file whose data are on DRAM.
    create_with(&mut s, "/d", Directory, 0, true, 0).unwrap();
    let f = create_with(&mut s, "/d/f", File, 0, true, 0).unwrap();
    let (_, blocks) = map(&mut s, f.id, 0, 4, f.lease).unwrap();
    close(&mut s, &f, 4 * BS as u64).unwrap();
    let on_first = blocks.iter().filter(|b| b.addr == "h:0").count() as u64;
    assert!(on_first > 0, "{blocks:?}");
    let d = drain(&mut s, "id-h-0", false).unwrap();
    assert_eq!((d.addr.as_str(), d.state), ("h:0", DrainState::Draining));
    assert!(d.used_blocks >= on_first);
    let st = match s.apply(MetaRequest::Status, 0).unwrap() {
        MetaReply::Status(st) => st,
        r => panic!("{r:?}"),
    };
    assert!(st.servers.iter().any(|x| x.addr == "h:0" && x.draining));
    // New data never lands on it.
    let g = create_with(&mut s, "/g", File, 0, true, 0).unwrap();
    let (_, b) = map(&mut s, g.id, 0, 3, g.lease).unwrap();
    assert!(b.iter().all(|b| b.addr != "h:0"), "{b:?}");
    close(&mut s, &g, 3 * BS as u64).unwrap();
    // A block found by a scan and moved since no longer needs moving.
    let found = s.drain_candidates(2);
    let (node, index, class, server) = found[0];
    assert!(s.drain_still_needs(node, index, server));
    let (d, _, _) = s.decide_move_start(node, index, class).unwrap();
    s.commit(d, 0);
    assert!(!s.drain_still_needs(node, index, server), "being moved");
    let d = s.decide_move_end(node, index, true).unwrap();
    s.commit(d, 0);
    s.note_drain_move(server, Ok(()));
    assert!(!s.drain_still_needs(node, index, server), "moved");
    let (n1, i1, _, s1) = found[1];
    assert!(s.drain_still_needs(n1, i1, s1));
    // Every block it holds is a candidate, data and child records alike.
    let moved = 1 + run_drains(&mut s);
    assert!(moved >= on_first, "moved {moved}");
    let d = drain(&mut s, "h:0", false).unwrap();
    assert_eq!(
        (d.state, d.used_blocks, d.moved_blocks),
        (DrainState::Done, 0, moved)
    );
    let (_, now) = map(&mut s, f.id, 0, 4, 0).unwrap();
    assert!(now.iter().all(|b| b.addr != "h:0"), "{now:?}");
    // Cancelled: placement may use it again.
    let d = drain(&mut s, "h:0", true).unwrap();
    assert_eq!(d.state, DrainState::Cancelled);
    let mut used_again = false;
    for i in 0..6 {
        let n = create_with(&mut s, &format!("/n{i}"), File, 0, true, 0).unwrap();
        let (_, b) = map(&mut s, n.id, 0, 1, n.lease).unwrap();
        used_again |= b[0].addr == "h:0";
    }
    assert!(used_again, "a cancelled drain gives the server back");
    // Unknown and dead servers.
    assert_eq!(
        drain(&mut s, "nobody", false).unwrap_err().code,
        ErrorCode::UnknownServer
    );
    s.alloc_soft().expire(1_000_000, 1);
    assert_eq!(
        drain(&mut s, "h:2", false).unwrap_err().code,
        ErrorCode::DataLost
    );
    s.check_invariants().unwrap();
}

/// A drained server that stops leaves as soon as it is declared dead; a
/// server that still holds blocks waits for `retire_after_ms`.
#[test]
fn a_drained_server_that_stops_is_retired_at_once() {
    let mut s = state();
    s.apply(MetaRequest::Register(spec("h:2", 0, 6)), 0)
        .unwrap();
    let d = drain(&mut s, "h:2", false).unwrap();
    assert_eq!(d.state, DrainState::Done, "it held nothing");
    // Both silent: the drained one and the file server (which holds the
    // root's records) are declared dead.
    s.alloc_soft().expire(5_000, 1_000);
    let d = s.decide_retire(5_000, 60_000).unwrap();
    let retired: Vec<u32> = d
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::ServerRetired { id } => Some(*id),
            _ => None,
        })
        .collect();
    let drained = s.alloc().find_server("h:2").unwrap();
    assert_eq!(retired, vec![drained]);
    s.commit(d, 5_000);
    let st = match s.apply(MetaRequest::Status, 5_000).unwrap() {
        MetaReply::Status(st) => st,
        r => panic!("{r:?}"),
    };
    assert!(st.servers.iter().all(|x| x.addr != "h:2"), "it left status");
    assert_eq!(st.servers.len(), 2, "the others wait for retire_after_ms");
}

/// While a container's record block moves, creates and removes in it get
/// no record location: a record written to the source after the copy
/// would be lost, and a lost clear could show a reused slot's old name.
#[test]
fn records_are_not_handed_out_while_their_block_moves() {
    let mut s = state();
    create(&mut s, "/d", Directory, 0).unwrap();
    let a = create(&mut s, "/d/a", File, 0).unwrap();
    assert!(a.record.is_some());
    let d = lookup(&mut s, "/d").unwrap();
    let (dec, _, _) = s.decide_move_start(d.id, 0, NO_CLASS).unwrap();
    s.commit(dec, 0);
    let b = create(&mut s, "/d/b", File, 0).unwrap();
    assert!(b.record.is_none(), "no record while moving: {:?}", b.record);
    assert!(remove(&mut s, "/d/a", false).unwrap().is_none());
    assert_eq!(
        map(&mut s, d.id, 0, 1, 0).unwrap_err().code,
        ErrorCode::TryAgain,
        "a reader of the records waits for the move, never reads an empty map"
    );
    let dec = s.decide_move_end(d.id, 0, true).unwrap();
    s.commit(dec, 0);
    let c = create(&mut s, "/d/c", File, 0).unwrap();
    let rec = c.record.expect("records again after the move");
    let (_, now) = map(&mut s, d.id, 0, 1, 0).unwrap();
    assert_eq!(
        (rec.block.server, rec.block.gen),
        (now[0].server, now[0].gen)
    );
    s.check_invariants().unwrap();
}

// ----- small values --------------------------------------------------------

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

/// A slab moves whole: its small values follow it, a writer of one of
/// them waits (`TryAgain`) instead of writing to the old copy, new values
/// go to other slabs meanwhile, and a slab a snapshot reads stays put.
#[test]
fn a_slab_moves_with_every_small_value_in_it() {
    // Two DRAM servers, the second one registered later, and a file tier.
    let mut s = state_of(4096, 4, 8);
    table(&mut s, "/t", false);
    let mut vals = Vec::new();
    for i in 0..5 {
        vals.push(put_small(&mut s, &format!("/t/k{i}"), 100).unwrap());
    }
    let open = create_with_hint(&mut s, "/t/open", 100).unwrap();
    let p = s.ns().get(vals[0].id).unwrap().piece.unwrap();
    assert!(vals
        .iter()
        .all(|v| s.ns().get(v.id).unwrap().piece.unwrap().block == p.block));
    s.apply(MetaRequest::Register(spec("h:9", 0, 4)), 0)
        .unwrap();
    let index = slab_move_index(p.server, p.block);
    let (d, src, dst) = s.decide_move_start(SLAB_MOVE, index, 0).unwrap();
    s.commit(d, 0);
    assert_eq!((src.server, src.block), (p.server, p.block));
    assert_ne!(dst.server, p.server);
    s.check_invariants().unwrap();
    // The writer of a value in it waits; readers still read the source.
    assert_eq!(
        map(&mut s, open.id, 0, 1, open.lease).unwrap_err().code,
        ErrorCode::TryAgain
    );
    let r = lookup(&mut s, "/t/k1").unwrap().first_block.unwrap();
    assert_eq!((r.server, r.block, r.gen), (src.server, src.block, src.gen));
    // A new value goes elsewhere; a freed one waits for a stamp.
    let fresh = put_small(&mut s, "/t/new", 100).unwrap();
    let fp = s.ns().get(fresh.id).unwrap().piece.unwrap();
    assert_ne!((fp.server, fp.block), (p.server, p.block));
    remove(&mut s, "/t/k4", false).unwrap();
    let d = s.decide_move_end(SLAB_MOVE, index, true).unwrap();
    s.commit(d, 0);
    s.check_invariants().unwrap();
    for v in &vals[..4] {
        let now = s.ns().get(v.id).unwrap().piece.unwrap();
        assert_eq!((now.server, now.block), (dst.server, dst.block));
    }
    let r = lookup(&mut s, "/t/k1").unwrap().first_block.unwrap();
    assert_eq!((r.server, r.block, r.gen), (dst.server, dst.block, dst.gen));
    let slab = s.slabs().get(dst.server, dst.block).unwrap();
    assert_eq!(slab.quarantined(), 1, "k4's piece waits for a stamp");
    assert!(s.slabs().get(src.server, src.block).is_none());
    // The writer gets the new location.
    let (_, b) = map(&mut s, open.id, 0, 1, open.lease).unwrap();
    assert_eq!((b[0].server, b[0].block), (dst.server, dst.block));
    // A slab a snapshot reads does not move.
    match s
        .apply(MetaRequest::SnapshotBegin { path: "/t".into() }, 0)
        .unwrap()
    {
        MetaReply::SnapshotBegun { .. } => {}
        r => panic!("{r:?}"),
    }
    let moved = slab_move_index(dst.server, dst.block);
    assert_eq!(
        s.decide_move_start(SLAB_MOVE, moved, NO_CLASS)
            .unwrap_err()
            .code,
        ErrorCode::Busy
    );
}

/// Draining a server moves its slabs too, until it holds nothing.
#[test]
fn a_drain_moves_slabs() {
    let mut s = state_of(4096, 4, 8);
    s.apply(MetaRequest::Register(spec("h:9", 0, 4)), 0)
        .unwrap();
    table(&mut s, "/t", false);
    for i in 0..30 {
        put_small(&mut s, &format!("/t/k{i}"), 100 + i).unwrap();
    }
    let d = drain(&mut s, "h:0", false).unwrap();
    assert!(d.used_blocks > 0);
    assert!(s.drain_candidates(100).iter().any(|c| c.0 == SLAB_MOVE));
    run_drains(&mut s);
    let d = drain(&mut s, "h:0", false).unwrap();
    assert_eq!((d.state, d.used_blocks), (DrainState::Done, 0), "{d:?}");
    for i in 0..30 {
        let k = lookup(&mut s, &format!("/t/k{i}")).unwrap();
        assert_ne!(k.first_block.unwrap().addr, "h:0");
    }
}

#[test]
fn a_hundred_thousand_small_values_fit_in_32_mib_of_dram() {
    const MIB: u32 = 1 << 20;
    let mut s = state_of(MIB, 32, 0);
    // Non-enumerable: the child records (512 bytes per key) would need
    // 49 MiB by themselves; this is about the values.
    table(&mut s, "/t", false);
    for i in 0..100_000 {
        let k = put_small(&mut s, &format!("/t/k{i}"), 100).unwrap();
        if i == 0 {
            assert_eq!(
                k.block_size, 104,
                "a 100-byte value and its tag get a 112-byte piece"
            );
            let loc = k.first_block.expect("a piece with the create");
            assert_eq!((loc.offset, loc.tag), (8, k.id), "past the tag");
        }
    }
    // 100,000 pieces of 112 bytes, 9,362 to a slab: 11 blocks, plus the
    // root's record block.
    assert_eq!(s.slabs().len(), 11);
    assert_eq!(used_blocks(&s, 0), 11 + 1);
    s.check_invariants().unwrap();
    let k = lookup(&mut s, "/t/k99999").unwrap();
    assert_eq!((k.size, k.block_size), (100, 104));
    let loc = k.first_block.unwrap();
    assert_eq!(loc.offset, (99_999 % 9362) * 112 + 8);
}

#[test]
fn a_million_replaces_and_deletes_keep_used_space_bounded() {
    const KEYS: u64 = 2000;
    let mut s = state_of(1 << 20, 64, 0);
    table(&mut s, "/t", true);
    let mut rng = crate::sim::Rng(7);
    let mut live = BTreeMap::new();
    let mut peaks = Vec::new();
    let mut peak = 0;
    for op in 1..=1_000_000u64 {
        let key = rng.below(KEYS);
        let path = format!("/t/k{key}");
        if rng.below(5) == 0 {
            if live.remove(&key).is_some() {
                let r = remove(&mut s, &path, false).unwrap();
                if let Some(r) = r {
                    s.apply(
                        MetaRequest::ReleaseSlot {
                            container: r.container,
                            slot: r.slot,
                        },
                        0,
                    )
                    .unwrap();
                }
            }
        } else {
            let size = 1 + rng.below(1500);
            put_small(&mut s, &path, size).unwrap();
            live.insert(key, size);
        }
        peak = peak.max(used_blocks(&s, 0));
        if op % 100_000 == 0 {
            peaks.push(peak);
            peak = 0;
        }
    }
    s.check_invariants().unwrap();
    // Every slab holds a live value, and the space used does not creep up
    // with the operations: the last windows peak no higher than the first.
    let pieces: u64 = s.slabs().iter().map(|(_, sl)| sl.used() as u64).sum();
    assert_eq!(pieces, live.len() as u64);
    eprintln!("peak blocks used per 100,000 operations: {peaks:?}");
    let first = peaks[0];
    assert!(
        peaks.iter().all(|p| *p <= first + 1),
        "used space grew with churn: {peaks:?}"
    );
    // Deleting everything gives every block back but the records'.
    for key in live.keys() {
        remove(&mut s, &format!("/t/k{key}"), false).unwrap();
    }
    assert!(s.slabs().is_empty());
    s.check_invariants().unwrap();
}

#[test]
fn a_freed_piece_is_fenced_before_another_value_reuses_it() {
    let mut s = state_of(BS, 16, 0);
    table(&mut s, "/t", true);
    let a = put_small(&mut s, "/t/a", 100).unwrap();
    let b = put_small(&mut s, "/t/b", 100).unwrap();
    let (la, lb) = (a.first_block.unwrap(), b.first_block.unwrap());
    assert_eq!((lb.block, lb.offset), (la.block, 112 + 8), "one slab");
    assert_eq!(la.gen, lb.gen, "the slab's generation");
    s.take_claims();
    remove(&mut s, "/t/a", false).unwrap();
    // The freed value's tag is cleared (its handles get `Stale` at once),
    // under the slab's generation: no fence yet.
    let claims = s.take_claims();
    assert_eq!(claims.len(), 1, "{claims:?}");
    assert_eq!(
        (claims[0].block, claims[0].gen, claims[0].clear_tag_at),
        (la.block, la.gen, Some(la.offset - 8))
    );
    // The piece is quarantined: the values stored meanwhile get the slab's
    // never-used pieces, under its generation.
    for i in 2..BS / 112 {
        let k = put_small(&mut s, &format!("/t/f{i}"), 100).unwrap();
        let l = k.first_block.unwrap();
        assert_eq!((l.block, l.gen), (la.block, la.gen), "f{i}");
        assert_ne!(l.offset, la.offset, "f{i} got the quarantined piece");
    }
    // Every never-used piece is taken. One quarantined piece is not worth
    // a stamp (each one makes the slab's live handles re-map) while a new
    // slab can be had.
    let c = put_small(&mut s, "/t/c", 104).unwrap();
    assert_ne!(c.first_block.unwrap().block, la.block, "a new slab");
    assert!(
        s.take_claims()
            .iter()
            .all(|c| c.gen == la.gen || c.block != la.block),
        "no fence yet"
    );
    // A batch of quarantined pieces (an eighth of the slab's 36), and no
    // free piece elsewhere (c's slab goes back with c): the next value gets
    // one of them, behind a fence that the storage server is told about
    // first.
    assert_eq!(crate::slab::stamp_batch(36), 4);
    remove(&mut s, "/t/c", false).unwrap();
    let mut quarantined = vec![la.offset];
    for i in 2..5 {
        let f = lookup(&mut s, &format!("/t/f{i}")).unwrap();
        quarantined.push(f.first_block.unwrap().offset);
        remove(&mut s, &format!("/t/f{i}"), false).unwrap();
    }
    s.take_claims();
    let d = put_small(&mut s, "/t/d", 104).unwrap();
    let claims = s.take_claims();
    let fence = claims
        .iter()
        .find(|c| c.block == la.block && c.gen > la.gen)
        .expect("the slab is claimed with a fresh generation");
    let ld = d.first_block.unwrap();
    assert_eq!(ld.block, la.block, "the slab's pieces reused");
    assert!(quarantined.contains(&ld.offset), "{ld:?}");
    assert_eq!(ld.gen, fence.gen);
    // The value that stayed is found at the new generation (its readers
    // re-map once after `Stale`).
    let lb2 = map(&mut s, b.id, 0, 1, 0).unwrap().1.remove(0);
    assert_eq!(
        (lb2.block, lb2.offset, lb2.gen),
        (lb.block, lb.offset, fence.gen)
    );
    // The deleted value's node is gone: its re-map says so.
    assert_eq!(
        map(&mut s, a.id, 0, 1, 0).unwrap_err().code,
        ErrorCode::Stale
    );
    // Replacing a value frees the old value's piece the same way, when the
    // new one closes: its tag is cleared at once.
    put_small(&mut s, "/t/b", 100).unwrap();
    let claims = s.take_claims();
    assert!(
        claims
            .iter()
            .any(|c| c.block == lb.block && c.clear_tag_at == Some(lb.offset - 8)),
        "{claims:?}"
    );
    s.check_invariants().unwrap();
}

#[test]
fn small_values_tier_like_blocks_and_report_no_space() {
    // 3 DRAM blocks and 3 file blocks of 4 KiB (one of them the root's
    // records, from the slowest class): pieces up to 1 KiB.
    let mut s = state_of(BS, 3, 3);
    table(&mut s, "/t", false);
    let class_of = |k: &NodeInfo| k.first_block.as_ref().unwrap().class;
    // 4 KiB / 1 KiB = 4 pieces per slab; DRAM holds 3 slabs.
    let mut dram = Vec::new();
    for i in 0..12 {
        let k = put_small(&mut s, &format!("/t/s{i}"), 1000).unwrap();
        assert_eq!(class_of(&k), 0, "value {i} in DRAM");
        dram.push(k);
    }
    // DRAM is full: small and big values go on to the file class.
    let k = put_small(&mut s, "/t/next", 1000).unwrap();
    assert_eq!(class_of(&k), 1);
    let big = put(&mut s, "/t/big", 3 * BS as u64 / 4 + 1).unwrap();
    assert_eq!(
        map(&mut s, big.id, 0, 1, 0).unwrap().1[0].class,
        1,
        "a big value gets a whole file block"
    );
    // Both classes full: the put's map reports NoSpace (nothing is left
    // behind).
    for i in 0..3 {
        put_small(&mut s, &format!("/t/f{i}"), 1000).unwrap();
    }
    let k = create_with_hint(&mut s, "/t/full", 1000).unwrap();
    assert!(k.first_block.is_none());
    assert_eq!(
        map(&mut s, k.id, 0, 1, k.lease).unwrap_err().code,
        ErrorCode::NoSpace
    );
    s.apply(
        MetaRequest::Abort {
            node: k.id,
            lease: k.lease,
        },
        0,
    )
    .unwrap();
    // Freeing one DRAM slab's values gives its block back: the next value
    // lands in DRAM again.
    for i in 0..4 {
        remove(&mut s, &format!("/t/s{i}"), false).unwrap();
    }
    let k = put_small(&mut s, "/t/back", 200).unwrap();
    assert_eq!(class_of(&k), 0);
    s.check_invariants().unwrap();
}

fn create_with_hint(s: &mut MetaState, path: &str, size: u64) -> Result<NodeInfo> {
    create_hinted(s, path, NO_CLASS, size)
}

/// A KeyValue of class `class` (or none) whose size, `size`, is known.
fn create_hinted(s: &mut MetaState, path: &str, class: u8, size: u64) -> Result<NodeInfo> {
    let req = MetaRequest::Create {
        path: path.into(),
        ty: KeyValue,
        storage_class: class,
        location: String::new(),
        enumerable: true,
        size_hint: size,
        pinned: false,
        mode: 0o644,
        mtime: 0,
        open_existing: false,
    };
    match s.apply(req, 0)? {
        MetaReply::Node(n) => Ok(n),
        r => panic!("unexpected {r:?}"),
    }
}

#[test]
fn a_small_value_cannot_grow_past_its_piece() {
    let mut s = state_of(BS, 4, 0);
    table(&mut s, "/t", true);
    let k = create_with_hint(&mut s, "/t/k", 100).unwrap();
    // A piece of 112 bytes: 104 for the value, 8 for its tag.
    assert_eq!(k.block_size, 104);
    let e = map(&mut s, k.id, 1, 1, k.lease).unwrap_err();
    assert_eq!(e.code, ErrorCode::OutOfRange);
    assert!(e.message.contains("piece of 112 bytes"), "{e}");
    let e = close(&mut s, &k, 105).unwrap_err();
    assert_eq!(e.code, ErrorCode::OutOfRange);
    close(&mut s, &k, 104).unwrap();
    // Without a size hint (or above a quarter block) a value gets blocks.
    let big = create_with_hint(&mut s, "/t/big", BS as u64 / 4 - 7).unwrap();
    assert_eq!(big.block_size, BS);
    let unknown = create_with_hint(&mut s, "/t/unknown", 0).unwrap();
    assert_eq!(unknown.block_size, BS);
    s.check_invariants().unwrap();
}

#[test]
fn a_small_value_moves_off_an_unreachable_server_and_is_fenced_on_takeover() {
    let mut s = MetaState::new(BS, 1000, 1);
    for i in 0..2 {
        s.apply(MetaRequest::Register(spec(&format!("h:{i}"), 0, 4)), 0)
            .unwrap();
    }
    table(&mut s, "/t", false);
    let k = create_with_hint(&mut s, "/t/k", 100).unwrap();
    let lost = k.first_block.clone().unwrap();
    let moved = match s
        .apply(
            MetaRequest::ReplaceBlock {
                node: k.id,
                lease: k.lease,
                index: 0,
                gen: lost.gen,
            },
            0,
        )
        .unwrap()
    {
        MetaReply::Blocks { blocks, .. } => blocks[0].clone(),
        r => panic!("unexpected {r:?}"),
    };
    assert_ne!(moved.server, lost.server);
    close(&mut s, &k, 100).unwrap();
    // An expired lease taken over fences the piece's slab.
    let w = match s
        .apply(
            MetaRequest::OpenWrite {
                path: "/t/k".into(),
            },
            0,
        )
        .unwrap()
    {
        MetaReply::Node(n) => n,
        r => panic!("unexpected {r:?}"),
    };
    s.take_claims();
    let now = 10_000;
    let again = match s
        .apply(
            MetaRequest::OpenWrite {
                path: "/t/k".into(),
            },
            now,
        )
        .unwrap()
    {
        MetaReply::Node(n) => n,
        r => panic!("unexpected {r:?}"),
    };
    assert_ne!(again.lease, w.lease);
    let claims = s.take_claims();
    assert!(
        claims
            .iter()
            .any(|c| c.block == moved.block && c.gen > moved.gen),
        "{claims:?}"
    );
    s.check_invariants().unwrap();
}

#[test]
fn small_values_on_a_dead_server_are_reported_lost_and_others_carry_on() {
    let mut s = MetaState::new(BS, 1000, 1);
    for i in 1..=2 {
        s.apply(MetaRequest::Register(spec(&format!("h:{i}"), 0, 4)), 0)
            .unwrap();
    }
    table(&mut s, "/t", false);
    let a = put_small(&mut s, "/t/a", 100).unwrap();
    let la = a.first_block.unwrap();
    let other = if la.server == 1 { 2 } else { 1 };
    only_alive(&mut s, other, 5000);
    assert_eq!(
        map(&mut s, a.id, 0, 1, 0).unwrap_err().code,
        ErrorCode::DataLost
    );
    assert!(lookup(&mut s, "/t/a").unwrap().first_block.is_none());
    // New small values go to the live server, into a slab of their own.
    let b = put_small(&mut s, "/t/b", 100).unwrap();
    assert_eq!(b.first_block.unwrap().server, other);
    // Retired: the slab is gone with its server; deleting the lost value
    // frees nothing and claims nothing there.
    let d = s.decide_retire(11_000, 10_000).unwrap();
    s.commit(d, 11_000);
    assert_eq!(s.slabs().len(), 1);
    s.take_claims();
    remove(&mut s, "/t/a", false).unwrap();
    assert!(s.take_claims().iter().all(|c| c.server == other));
    s.check_invariants().unwrap();
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

#[test]
fn a_restart_keeps_what_was_closed_and_forgets_writers() {
    let mut s = MetaState::new(BS, 1000, 1);
    let mut log = Vec::new();
    let l = &mut log;
    logged(&mut s, l, MetaRequest::Register(spec("h:0", 0, 16))).unwrap();
    let create = |path: &str, ty: NodeType, size_hint: u64| MetaRequest::Create {
        path: path.into(),
        ty,
        storage_class: NO_CLASS,
        location: String::new(),
        enumerable: true,
        size_hint,
        pinned: false,
        mode: 0o644,
        mtime: 0,
        open_existing: false,
    };
    let node = |r: MetaReply| match r {
        MetaReply::Node(n) => n,
        r => panic!("unexpected {r:?}"),
    };
    let map = |n: &NodeInfo, count: u32| MetaRequest::Map {
        node: n.id,
        index: 0,
        count,
        alloc: true,
        lease: n.lease,
    };
    let sync = |n: &NodeInfo, size: u64, close: bool| MetaRequest::Sync {
        node: n.id,
        lease: n.lease,
        size,
        close,
        mtime: 0,
    };
    logged(&mut s, l, create("/d", Directory, 0)).unwrap();
    logged(&mut s, l, create("/t", Table, 0)).unwrap();
    // A closed File, a File still open (synced at 100, two blocks), a
    // closed put (small) and one that never closed (a whole block).
    let closed = node(logged(&mut s, l, create("/d/closed", File, 0)).unwrap());
    logged(&mut s, l, map(&closed, 1)).unwrap();
    logged(&mut s, l, sync(&closed, 10, true)).unwrap();
    let open = node(logged(&mut s, l, create("/d/open", File, 0)).unwrap());
    logged(&mut s, l, map(&open, 2)).unwrap();
    logged(&mut s, l, sync(&open, 100, false)).unwrap();
    let kv = node(logged(&mut s, l, create("/t/kv", KeyValue, 5)).unwrap());
    logged(&mut s, l, sync(&kv, 5, true)).unwrap();
    let unclosed = node(logged(&mut s, l, create("/t/kv2", KeyValue, 0)).unwrap());
    logged(&mut s, l, map(&unclosed, 1)).unwrap();
    let used_before = s.alloc().status(0)[0].used_blocks;

    let mut r = restart(&mut s, &log);
    let info = |r: &mut MetaState, p: &str| lookup(r, p).unwrap();
    assert_eq!(info(&mut r, "/d/closed").size, 10);
    assert_eq!(info(&mut r, "/d/open").size, 100, "the last synced size");
    assert_eq!(info(&mut r, "/t/kv").size, 5);
    assert_eq!(
        lookup(&mut r, "/t/kv2").unwrap_err().code,
        ErrorCode::NotFound
    );
    let mut names = r.ns().children("/d").unwrap();
    names.sort();
    assert_eq!(names, ["closed", "open"]);
    assert_eq!(r.ns().children("/t").unwrap(), ["kv"]);
    // The unclosed put's block went back, and so did the open File's
    // block past its synced size: it keeps the one its bytes need.
    assert_eq!(r.alloc().status(0)[0].used_blocks, used_before - 2);
    // The old writers are gone: their lease is refused, and a new writer
    // gets the File at once (no Busy until the old lease would expire).
    let e = r.apply(sync(&open, 200, true), 0).unwrap_err();
    assert_eq!(e.code, ErrorCode::LeaseExpired, "{e}");
    let e = r.apply(sync(&unclosed, 1, true), 0).unwrap_err();
    assert!(
        matches!(e.code, ErrorCode::Stale | ErrorCode::LeaseExpired),
        "{e}"
    );
    let again = node(
        r.apply(
            MetaRequest::OpenWrite {
                path: "/d/open".into(),
            },
            0,
        )
        .unwrap(),
    );
    assert!(again.lease >= 1 << 40, "lease ids continue from the floor");
    let fresh = node(r.apply(create("/d/new", File, 0), 0).unwrap());
    assert!(fresh.id >= 1 << 40, "node ids continue from the floor");
    match r.apply(map(&fresh, 1), 0).unwrap() {
        MetaReply::Blocks { blocks, .. } => {
            assert!(
                blocks[0].gen >= 1 << 40,
                "generations continue from the floor"
            )
        }
        r => panic!("unexpected {r:?}"),
    }
    // Restarting again lapses the new writers' leases: the File's kept
    // block is fenced, the new File's unpublished block freed.
    let d = MetaState::decide_restart(&r, 1 << 40).expect("two writers");
    let cleared = |e: &Effect| matches!(e, Effect::LeaseCleared { .. });
    assert_eq!(d.effects.iter().filter(|e| cleared(e)).count(), 2);
    assert!(d.effects.iter().all(|e| cleared(e)
        || matches!(
            e,
            Effect::BlockStamped { .. }
                | Effect::BlockFreed { .. }
                | Effect::BlocksTruncated { .. }
        )));
}

/// A File whose lease an older build's restart cleared kept its blocks
/// past the synced size: the next restart gives them back.
#[test]
fn a_restart_frees_what_an_older_restart_left_past_the_size() {
    let mut s = state();
    let used = total_used(&s);
    let f = create(&mut s, "/f", File, 0).unwrap();
    map(&mut s, f.id, 0, 3, f.lease).unwrap();
    sync(&mut s, &f, 100, false).unwrap();
    // What a restart of an older build did: the lease cleared, nothing else.
    s.apply_effect(&Effect::LeaseCleared { node: f.id });
    assert_eq!(total_used(&s), used + 3);
    let d = s.decide_restart(0).expect("blocks to give back");
    s.commit(d, 0);
    s.check_invariants().unwrap();
    assert_eq!(total_used(&s), used + 1);
    assert_eq!(lookup(&mut s, "/f").unwrap().size, 100);
}

// ----- snapshots ------------------------------------------------------------

fn snap_begin(s: &mut MetaState, path: &str, now: u64) -> Result<(u64, u64)> {
    match s.apply(MetaRequest::SnapshotBegin { path: path.into() }, now)? {
        MetaReply::SnapshotBegun { id, entries } => Ok((id, entries)),
        r => panic!("unexpected {r:?}"),
    }
}

fn snap_list(s: &mut MetaState, id: u64) -> Result<Vec<SnapshotEntry>> {
    let (mut entry, mut block) = (0, 0);
    let mut out: Vec<SnapshotEntry> = Vec::new();
    loop {
        match s.apply(MetaRequest::SnapshotList { id, entry, block }, 0)? {
            MetaReply::SnapshotPage {
                entries,
                next_entry,
                next_block,
            } => {
                if entries.is_empty() {
                    return Ok(out);
                }
                for e in entries {
                    match out.last_mut() {
                        Some(last) if last.index == e.index => last.blocks.extend(e.blocks),
                        _ => out.push(e),
                    }
                }
                (entry, block) = (next_entry, next_block);
            }
            r => panic!("unexpected {r:?}"),
        }
    }
}

fn snap_locate(s: &mut MetaState, id: u64, node: u64, index: u64, loc: &BlockLoc) -> Result<u64> {
    let req = MetaRequest::SnapshotLocate {
        id,
        node,
        index,
        server: loc.server,
        block: loc.block,
    };
    match s.apply(req, 0)? {
        MetaReply::Located(l) => Ok(l.gen),
        r => panic!("unexpected {r:?}"),
    }
}

fn snap_end(s: &mut MetaState, id: u64) -> Result<()> {
    s.apply(MetaRequest::SnapshotEnd { id }, 0).map(drop)
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

#[test]
fn a_snapshot_lists_its_subtree_as_it_was_when_it_began() {
    let mut s = state();
    create(&mut s, "/s", Directory, 0).unwrap();
    create(&mut s, "/s/d", Directory, 0).unwrap();
    create_with(&mut s, "/s/t", Table, NO_CLASS, false, 0).unwrap();
    create(&mut s, "/s/b", Bag, 0).unwrap();
    file(&mut s, "/s/d/f", 2);
    put(&mut s, "/s/t/k", 10).unwrap();
    create(&mut s, "/other", Directory, 0).unwrap();
    let (id, n) = snap_begin(&mut s, "/s", 0).unwrap();
    assert_eq!(n, 6);
    // Changes after the start are not in it.
    create(&mut s, "/s/later", Directory, 0).unwrap();
    remove(&mut s, "/s/d", true).unwrap();
    let list = snap_list(&mut s, id).unwrap();
    let names: Vec<(&str, NodeType)> = list.iter().map(|e| (e.path.as_str(), e.ty)).collect();
    assert_eq!(
        names,
        [
            ("", Directory),
            ("b", Bag),
            ("d", Directory),
            ("d/f", File),
            ("t", Table),
            ("t/k", KeyValue)
        ],
        "parents first, children in name order"
    );
    assert!(!list[4].enumerable, "the Table's flag is kept");
    assert_eq!((list[3].size, list[3].blocks.len()), (2 * BS as u64, 2));
    assert_eq!((list[5].size, list[5].blocks.len()), (10, 1));
    s.check_invariants().unwrap();
    snap_end(&mut s, id).unwrap();
    assert_eq!(snap_list(&mut s, id).unwrap_err().code, ErrorCode::NotFound);
}

#[test]
fn a_pinned_block_freed_is_fenced_at_once_but_not_reused_until_the_snapshot_ends() {
    let mut s = state();
    create(&mut s, "/s", Table, 0).unwrap();
    let old = put(&mut s, "/s/k", 10).unwrap();
    let old_loc = map(&mut s, old.id, 0, 1, 0).unwrap().1.remove(0);
    let (id, _) = snap_begin(&mut s, "/s", 0).unwrap();
    s.take_claims();
    // Replaced: the old block is fenced with a newer generation (its
    // handles get `Stale` as soon as the claim lands)...
    put(&mut s, "/s/k", 10).unwrap();
    let claims = s.take_claims();
    let fence = claims
        .iter()
        .find(|c| (c.server, c.block) == (old_loc.server, old_loc.block))
        .expect("the old block is claimed before the reply");
    assert!(fence.gen > old_loc.gen);
    // ... but held: not free, counted as used, and found by the snapshot.
    assert!(!is_free(&s, &old_loc));
    assert_eq!(
        s.held_blocks().collect::<Vec<_>>(),
        [((old_loc.server, old_loc.block), fence.gen)]
    );
    s.check_invariants().unwrap();
    assert_eq!(
        snap_locate(&mut s, id, old.id, 0, &old_loc).unwrap(),
        fence.gen
    );
    // Fill every class: the held block is never handed out.
    let mut i = 0;
    while let Ok(f) = create(&mut s, &format!("/setup/f{i}"), File, 0) {
        match map(&mut s, f.id, 0, 1, f.lease) {
            Ok((_, b)) => assert_ne!(
                (b[0].server, b[0].block),
                (old_loc.server, old_loc.block),
                "a held block was reused"
            ),
            Err(e) => {
                assert_eq!(e.code, ErrorCode::NoSpace);
                break;
            }
        }
        close(&mut s, &f, 1).unwrap();
        i += 1;
    }
    s.check_invariants().unwrap();
    // The end gives it back, fenced again.
    s.take_claims();
    snap_end(&mut s, id).unwrap();
    assert!(is_free(&s, &old_loc));
    assert_eq!(s.held_blocks().count(), 0);
    assert!(s
        .take_claims()
        .iter()
        .any(|c| c.block == old_loc.block && c.gen > fence.gen));
    s.check_invariants().unwrap();
}

#[test]
fn a_block_held_for_two_snapshots_waits_for_both() {
    let mut s = state();
    create(&mut s, "/s", Directory, 0).unwrap();
    let f = file(&mut s, "/s/f", 1);
    let loc = map(&mut s, f.id, 0, 1, 0).unwrap().1.remove(0);
    let (a, _) = snap_begin(&mut s, "/s", 0).unwrap();
    let (b, _) = snap_begin(&mut s, "/", 0).unwrap();
    assert_ne!(a, b);
    remove(&mut s, "/s/f", false).unwrap();
    while let Some(d) = s.decide_reap() {
        s.commit(d, 0);
    }
    assert!(!is_free(&s, &loc));
    snap_end(&mut s, a).unwrap();
    assert!(!is_free(&s, &loc), "still pinned by the other snapshot");
    snap_end(&mut s, b).unwrap();
    assert!(is_free(&s, &loc));
    s.check_invariants().unwrap();
}

#[test]
fn an_unused_snapshot_expires_and_frees_what_it_held() {
    let mut s = state();
    create(&mut s, "/s", Directory, 0).unwrap();
    let f = file(&mut s, "/s/f", 1);
    let loc = map(&mut s, f.id, 0, 1, 0).unwrap().1.remove(0);
    let (id, _) = snap_begin(&mut s, "/s", 100).unwrap();
    remove(&mut s, "/s/f", false).unwrap();
    while let Some(d) = s.decide_reap() {
        s.commit(d, 0);
    }
    assert!(!is_free(&s, &loc));
    let ttl = crate::snapshot::SNAPSHOT_TTL_MS;
    // A call renews it: even an empty page past the end (what a reader
    // sends to keep it alive).
    let page = s
        .apply(
            MetaRequest::SnapshotList {
                id,
                entry: u64::MAX,
                block: 0,
            },
            100 + ttl / 2,
        )
        .unwrap();
    assert!(matches!(page, MetaReply::SnapshotPage { entries, .. } if entries.is_empty()));
    assert!(s.decide_snapshot_expiry(100 + ttl).is_none());
    let d = s
        .decide_snapshot_expiry(100 + ttl / 2 + ttl)
        .expect("expired");
    s.commit(d, 0);
    assert!(is_free(&s, &loc));
    assert!(s.snapshots().is_empty());
    assert_eq!(snap_end(&mut s, id).unwrap_err().code, ErrorCode::NotFound);
    s.check_invariants().unwrap();
}

#[test]
fn at_most_a_few_snapshots_run_at_once() {
    let mut s = state();
    assert_eq!(
        snap_begin(&mut s, "/nope", 0).unwrap_err().code,
        ErrorCode::NotFound
    );
    for _ in 0..crate::snapshot::MAX_SNAPSHOTS {
        snap_begin(&mut s, "/", 0).unwrap();
    }
    assert_eq!(
        snap_begin(&mut s, "/", 0).unwrap_err().code,
        ErrorCode::Busy
    );
}

#[test]
fn a_pinned_piece_freed_has_its_tag_cleared_but_is_not_reused_until_the_end() {
    let mut s = state_of(BS, 64, 0);
    table(&mut s, "/t", false);
    let a = put_small(&mut s, "/t/a", 100).unwrap();
    let b = put_small(&mut s, "/t/b", 100).unwrap();
    let la = a.first_block.unwrap();
    let (id, _) = snap_begin(&mut s, "/t", 0).unwrap();
    s.take_claims();
    remove(&mut s, "/t/a", false).unwrap();
    let claims = s.take_claims();
    assert!(
        claims
            .iter()
            .any(|c| c.block == la.block && c.clear_tag_at == Some(la.offset - 8)),
        "the tag is cleared at once: {claims:?}"
    );
    s.check_invariants().unwrap();
    // Its slab keeps it even once every live value in it is gone.
    remove(&mut s, "/t/b", false).unwrap();
    s.check_invariants().unwrap();
    assert!(s.slabs().get(la.server, la.block).is_some(), "slab kept");
    // New values never get a's piece, whatever stamps happen meanwhile.
    for i in 0..3 * (BS / 112) {
        let k = put_small(&mut s, &format!("/t/n{i}"), 100).unwrap();
        let l = k.first_block.unwrap();
        assert_ne!((l.block, l.offset), (la.block, la.offset), "n{i}");
        if i % 3 == 0 {
            remove(&mut s, &format!("/t/n{i}"), false).unwrap();
        }
        s.check_invariants().unwrap();
    }
    let gen = snap_locate(&mut s, id, a.id, 0, &la).unwrap();
    assert!(gen >= la.gen);
    let _ = b;
    snap_end(&mut s, id).unwrap();
    s.check_invariants().unwrap();
    assert!(s
        .slabs()
        .get(la.server, la.block)
        .is_none_or(|slab| slab.owner(la.offset / 112) != Some(crate::slab::HELD)));
}

#[test]
fn what_a_snapshot_held_survives_a_replay_and_a_checkpoint_and_a_restart_frees_it() {
    let mut s = state_of(BS, 16, 0);
    let mut log = Vec::new();
    let l = &mut log;
    logged(
        &mut s,
        l,
        MetaRequest::Create {
            path: "/t".into(),
            ty: Table,
            storage_class: NO_CLASS,
            location: String::new(),
            enumerable: true,
            size_hint: 0,
            pinned: false,
            mode: 0o644,
            mtime: 0,
            open_existing: false,
        },
    )
    .unwrap();
    let big = put(&mut s, "/t/big", 10).unwrap();
    let small = put_small(&mut s, "/t/small", 100).unwrap();
    let big_loc = map(&mut s, big.id, 0, 1, 0).unwrap().1.remove(0);
    let small_loc = small.first_block.unwrap();
    snap_begin(&mut s, "/t", 0).unwrap();
    logged(
        &mut s,
        l,
        MetaRequest::Remove {
            path: "/t/big".into(),
            recursive: false,
        },
    )
    .unwrap();
    logged(
        &mut s,
        l,
        MetaRequest::Remove {
            path: "/t/small".into(),
            recursive: false,
        },
    )
    .unwrap();
    assert_eq!(s.held_blocks().count(), 1);
    // A checkpoint holds them.
    let back = through_checkpoint(&s);
    assert_eq!(back.dump(), s.dump());
    // A restart (the snapshot is gone with the old process) frees both.
    let mut r = back;
    let d = r.decide_restart(0).expect("something to free");
    r.commit(d, 0);
    r.check_invariants().unwrap();
    assert_eq!(r.held_blocks().count(), 0);
    assert!(is_free(&r, &big_loc));
    assert!(
        r.slabs().get(small_loc.server, small_loc.block).is_none(),
        "the slab, empty now, went back"
    );
    assert!(is_free(&r, &small_loc));
}

#[test]
fn a_big_listing_comes_in_bounded_pages_and_a_long_file_is_split_over_them() {
    let mut s = state_of(BS, 40_000, 0);
    create(&mut s, "/s", Directory, 0).unwrap();
    let f = create(&mut s, "/s/big", File, 0).unwrap();
    for i in 0..35 {
        map(&mut s, f.id, i * 1024, 1024, f.lease).unwrap();
    }
    close(&mut s, &f, 35 * 1024 * BS as u64).unwrap();
    let blocks: Vec<BlockLoc> = (0..35)
        .flat_map(|i| map(&mut s, f.id, i * 1024, 1024, 0).unwrap().1)
        .collect();
    for i in 0..3000 {
        create(&mut s, &format!("/s/{i:0>200}"), Directory, 0).unwrap();
    }
    let (id, n) = snap_begin(&mut s, "/s", 0).unwrap();
    assert_eq!(n, 3002);
    let mut pages = 0;
    let (mut entry, mut block) = (0, 0);
    loop {
        let reply = s
            .apply(MetaRequest::SnapshotList { id, entry, block }, 0)
            .unwrap();
        let mut buf = bytes::BytesMut::new();
        reply.encode(&mut buf);
        assert!(buf.len() <= 2 * PAGE_BYTES, "a page of {} bytes", buf.len());
        let MetaReply::SnapshotPage {
            entries,
            next_entry,
            next_block,
        } = reply
        else {
            panic!("unexpected reply");
        };
        if entries.is_empty() {
            break;
        }
        pages += 1;
        (entry, block) = (next_entry, next_block);
    }
    assert!(pages >= 3, "{pages} pages");
    let list = snap_list(&mut s, id).unwrap();
    assert_eq!(list.len(), 3002);
    let big = list.iter().find(|e| e.path == "big").unwrap();
    assert_eq!(big.blocks, blocks, "every block, in order, once");
    snap_end(&mut s, id).unwrap();
}

/// Carries out every migration the state wants now (copies succeed), as
/// the migrator would; returns the moves.
fn migrate_all(s: &mut MetaState, now: u64) -> Vec<crate::state::Migration> {
    let mut done = Vec::new();
    loop {
        let found = s.migration_candidates(now, 64);
        if found.is_empty() {
            return done;
        }
        for m in found {
            if !s.migration_still_wanted(&m) {
                continue;
            }
            let (d, _, dst) = s.decide_move_start_to(m.node, m.index, m.to, true).unwrap();
            assert_eq!(dst.class, m.to, "{m:?}: into exactly its class");
            s.commit(d, now);
            let d = s.decide_move_end(m.node, m.index, true).unwrap();
            s.commit(d, now);
            s.note_migration(&m, now);
            s.check_invariants().unwrap();
            done.push(m);
        }
    }
}

fn classes_of(s: &mut MetaState, path: &str) -> Vec<u8> {
    let n = lookup(s, path).unwrap();
    let (_, b) = map(s, n.id, 0, (n.size / BS as u64) as u32, 0).unwrap();
    b.iter().map(|l| l.class).collect()
}

/// The state's side of migration: a class past its high watermark sheds
/// its coldest unpinned blocks into the next class down to its low one,
/// touched nodes count as hot, moves are counted per class in status, and
/// a hot node on the file class comes back up once there is room.
#[test]
fn migration_moves_the_coldest_unpinned_blocks_and_promotes_hot_ones() {
    let mut s = state_of(BS, 10, 40);
    let mut t = crate::tier::TierSettings::default();
    t.apply(&[
        ("high_watermark", "70"),
        ("low_watermark", "40"),
        ("half_life_ms", "1000000"),
    ])
    .unwrap();
    s.set_tier_settings(t);
    // At the root, whose child records are on the file class: only data
    // fills DRAM. /pinned first: the coldest of all, but pinned.
    let p = match s
        .apply(
            MetaRequest::Create {
                path: "/pinned".into(),
                ty: File,
                storage_class: NO_CLASS,
                location: String::new(),
                enumerable: true,
                size_hint: 0,
                pinned: true,
                mode: 0o644,
                mtime: 0,
                open_existing: false,
            },
            1,
        )
        .unwrap()
    {
        MetaReply::Node(n) => n,
        r => panic!("{r:?}"),
    };
    map(&mut s, p.id, 0, 2, p.lease).unwrap();
    close(&mut s, &p, 2 * BS as u64).unwrap();
    for (i, now) in [(0, 10), (1, 20), (2, 30)] {
        let f = create(&mut s, &format!("/f{i}"), File, now).unwrap();
        map(&mut s, f.id, 0, 2, f.lease).unwrap();
        close(&mut s, &f, 2 * BS as u64).unwrap();
    }
    // 8 of 10 DRAM blocks: nothing below the high watermark moves.
    assert_eq!(used_blocks(&s, 0), 8);
    assert_eq!(s.heat(p.id).last_ms, 0, "no heat at create, mapped at 0");
    // Touch f0 at a later time, several times: now the hottest.
    for now in [100, 101, 102] {
        lookup_at(&mut s, "/f0", now);
    }
    let moved = migrate_all(&mut s, 200);
    // 80 % > 70 %: shed to 40 % (4 blocks): f1 then f2 (the coldest
    // unpinned), never /d/pinned, f0 stays.
    let nodes: Vec<u64> = moved.iter().map(|m| m.node).collect();
    let id = |s: &mut MetaState, p: &str| lookup(s, p).unwrap().id;
    let (f1, f2) = (id(&mut s, "/f1"), id(&mut s, "/f2"));
    assert_eq!(nodes, vec![f1, f1, f2, f2], "{moved:?}");
    assert!(moved.iter().all(|m| (m.from, m.to) == (0, 1)));
    assert_eq!(used_blocks(&s, 0), 4);
    assert_eq!(classes_of(&mut s, "/pinned"), vec![0, 0]);
    assert_eq!(classes_of(&mut s, "/f0"), vec![0, 0]);
    assert_eq!(classes_of(&mut s, "/f1"), vec![1, 1]);
    let st = match s.apply(MetaRequest::Status, 300).unwrap() {
        MetaReply::Status(st) => st,
        r => panic!("{r:?}"),
    };
    assert_eq!(
        st.moves,
        vec![nodekernel_proto::ClassMoves {
            class: 0,
            demoted: 4,
            promoted: 0
        }]
    );
    // Promotion: f2 is read often (a half-life after its move), but one
    // more 2-block node would take DRAM past its low watermark (6 > 4):
    // it stays until room is made.
    s.set_tier_settings({
        let mut t = s.tier_settings().clone();
        t.apply(&[("promotion", "on"), ("promote_after", "3")])
            .unwrap();
        t
    });
    for now in 2_000_000..2_000_010 {
        lookup_at(&mut s, "/f2", now);
    }
    assert!(
        migrate_all(&mut s, 2_000_010).is_empty(),
        "no room at the low watermark"
    );
    remove(&mut s, "/f0", false).unwrap();
    let up = migrate_all(&mut s, 2_000_010);
    assert_eq!(up.len(), 2, "{up:?}");
    assert!(up.iter().all(|m| m.node == f2 && m.is_promotion()));
    assert_eq!(classes_of(&mut s, "/f2"), vec![0, 0]);
    assert!(
        migrate_all(&mut s, 2_000_020).is_empty(),
        "nothing moves back and forth"
    );
}

fn lookup_at(s: &mut MetaState, path: &str, now: u64) {
    s.apply(MetaRequest::Lookup { path: path.into() }, now)
        .unwrap();
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

/// Dynamic capacity in the state: free blocks leave a shrinking server at
/// once (the balloon), blocks in use leave by moves, a shrinking server
/// gets no new blocks, growing gives blocks back, and the balloon survives
/// a checkpoint.
#[test]
fn a_server_shrinks_by_ballooning_free_blocks_and_moving_used_ones() {
    let mut s = state_of(BS, 10, 40);
    let f = file(&mut s, "/f", 3);
    let dram = "h:0";
    let r = resize(&mut s, dram, 4).unwrap();
    assert_eq!(
        (
            r.max_blocks,
            r.exported_blocks,
            r.target_blocks,
            r.used_blocks
        ),
        (10, 4, 4, 3)
    );
    s.check_invariants().unwrap();
    let st = match s.apply(MetaRequest::Status, 0).unwrap() {
        MetaReply::Status(st) => st,
        r => panic!("{r:?}"),
    };
    let d = st.servers.iter().find(|x| x.addr == dram).unwrap();
    assert_eq!(
        (d.capacity_blocks, d.used_blocks),
        (4, 3),
        "status shows the new capacity"
    );
    // Below what is in use: one free block goes, then blocks must move.
    let r = resize(&mut s, dram, 2).unwrap();
    assert_eq!((r.exported_blocks, r.target_blocks), (3, 2));
    let g = create(&mut s, "/g", File, 0).unwrap();
    let (_, b) = map(&mut s, g.id, 0, 1, g.lease).unwrap();
    assert_eq!(b[0].class, 1, "a shrinking server gets no new blocks");
    let found = s.drain_candidates(10);
    assert_eq!(
        found.len(),
        3,
        "its blocks are candidates to move: {found:?}"
    );
    let (node, index, class, _) = found[0];
    let (d, _, _) = s.decide_move_start(node, index, class).unwrap();
    s.commit(d, 0);
    let d = s.decide_move_end(node, index, true).unwrap();
    s.commit(d, 0);
    assert_eq!(s.shrinking(), vec![(1, 2)]);
    let d = s.decide_resize(1, 2).unwrap();
    s.commit(d, 0);
    assert!(
        s.shrinking().is_empty(),
        "the freed block joined the balloon"
    );
    let r = resize(&mut s, dram, 2).unwrap();
    assert_eq!((r.exported_blocks, r.used_blocks), (2, 2));
    assert!(
        s.drain_candidates(10).is_empty(),
        "done: nothing more moves"
    );
    s.check_invariants().unwrap();
    // The balloon is durable: a checkpoint keeps it.
    let back = through_checkpoint(&s);
    assert_eq!(back.dump(), s.dump());
    back.check_invariants().unwrap();
    assert_eq!(back.resize_status(1).exported_blocks, 2);
    // Growing gives the ballooned blocks back; too much is refused.
    assert_eq!(
        resize(&mut s, dram, 11).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    let r = resize(&mut s, dram, 10).unwrap();
    assert_eq!((r.exported_blocks, r.used_blocks), (10, 2));
    s.check_invariants().unwrap();
    let h = create(&mut s, "/h", File, 0).unwrap();
    let (_, b) = map(&mut s, h.id, 0, 1, h.lease).unwrap();
    assert_eq!(b[0].class, 0, "a grown server takes new blocks again");
    assert_eq!(s.ns().get(f.id).unwrap().blocks.len(), 3);
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

// ----- what a POSIX mount needs: modes, times, truncate, replacing moves -----

fn set_attrs(
    s: &mut MetaState,
    path: &str,
    mode: Option<u32>,
    mtime: Option<u64>,
) -> Result<NodeInfo> {
    match s.apply(
        MetaRequest::SetAttrs {
            path: path.into(),
            mode,
            mtime,
        },
        0,
    )? {
        MetaReply::Node(n) => Ok(n),
        r => panic!("unexpected {r:?}"),
    }
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

fn rename(s: &mut MetaState, src: &str, dst: &str, replace: bool) -> Result<MetaReply> {
    s.apply(
        MetaRequest::Move {
            src: src.into(),
            dst: dst.into(),
            replace,
        },
        0,
    )
}

#[test]
fn modes_and_times_are_kept_through_the_log_and_a_checkpoint() {
    let mut s = MetaState::new(BS, 1000, 1);
    let mut log = Vec::new();
    let l = &mut log;
    logged(&mut s, l, MetaRequest::Register(spec("h:0", 0, 16))).unwrap();
    let mk = |path: &str, ty, mode, mtime| MetaRequest::Create {
        path: path.into(),
        ty,
        storage_class: NO_CLASS,
        location: String::new(),
        enumerable: true,
        size_hint: 0,
        pinned: false,
        mode,
        mtime,
        open_existing: false,
    };
    let MetaReply::Node(d) = logged(&mut s, l, mk("/d", Directory, 0o700, 11)).unwrap() else {
        panic!()
    };
    assert_eq!(
        (d.mode, d.mtime),
        (0o700, 11),
        "a create keeps what it was given"
    );
    let MetaReply::Node(f) = logged(&mut s, l, mk("/d/f", File, 0o4640, 12)).unwrap() else {
        panic!()
    };
    assert_eq!((f.mode, f.mtime), (0o4640, 12));
    // A sync with a time stamps it; one without keeps the old one.
    logged(
        &mut s,
        l,
        MetaRequest::Map {
            node: f.id,
            index: 0,
            count: 1,
            alloc: true,
            lease: f.lease,
        },
    )
    .unwrap();
    for (mtime, expect) in [(99, 99), (0, 99)] {
        logged(
            &mut s,
            l,
            MetaRequest::Sync {
                node: f.id,
                lease: f.lease,
                size: 10,
                close: false,
                mtime,
            },
        )
        .unwrap();
        assert_eq!(lookup(&mut s, "/d/f").unwrap().mtime, expect);
    }
    // SetAttrs changes what it is given and nothing else.
    let r = logged(
        &mut s,
        l,
        MetaRequest::SetAttrs {
            path: "/d/f".into(),
            mode: Some(0o600),
            mtime: None,
        },
    )
    .unwrap();
    let MetaReply::Node(n) = r else { panic!() };
    assert_eq!((n.mode, n.mtime, n.size), (0o600, 99, 10));
    let MetaReply::Node(n) = logged(
        &mut s,
        l,
        MetaRequest::SetAttrs {
            path: "/d".into(),
            mode: None,
            mtime: Some(5),
        },
    )
    .unwrap() else {
        panic!()
    };
    assert_eq!((n.mode, n.mtime), (0o700, 5));
    // Bits beyond the permission bits are refused, on create and after.
    for req in [
        mk("/d/g", File, 0o10644, 1),
        MetaRequest::SetAttrs {
            path: "/d/f".into(),
            mode: Some(0o170000),
            mtime: None,
        },
    ] {
        let before = s.dump();
        assert_eq!(
            s.apply(req, 0).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        assert_eq!(s.dump(), before, "a refused request changes nothing");
    }
    assert_eq!(
        set_attrs(&mut s, "/d/none", Some(0o644), None)
            .unwrap_err()
            .code,
        ErrorCode::NotFound
    );
    // The log and a checkpoint both keep them.
    let back = restart(&mut s, &log);
    assert_eq!(
        back.ns().get(f.id).map(|n| (n.mode, n.mtime)),
        Some((0o600, 99))
    );
    let cp = through_checkpoint(&s);
    assert_eq!(cp.dump(), s.dump(), "a checkpoint keeps modes and times");
}

#[test]
fn a_checkpointed_node_from_before_modes_gets_the_default_ones() {
    let mut s = state();
    create(&mut s, "/d", Directory, 0).unwrap();
    file(&mut s, "/d/f", 1);
    let image = s.checkpoint_image();
    // Records as format 3 wrote them: without the trailing mode and time.
    let old: Vec<(u64, Vec<u8>)> = image
        .node_records()
        .map(|(id, r)| (id, r[..r.len() - 10].to_vec()))
        .collect();
    let back = MetaState::from_checkpoint(1000, &image.state, old.into_iter().map(Ok), 0).unwrap();
    let d = back.ns().resolve("/d").unwrap();
    let f = back.ns().resolve("/d/f").unwrap();
    assert_eq!(
        back.ns().get(d).map(|n| (n.mode, n.mtime)),
        Some((0o755, 0))
    );
    assert_eq!(
        back.ns().get(f).map(|n| (n.mode, n.mtime)),
        Some((0o644, 0))
    );
    back.check_invariants().unwrap();
}

#[test]
fn truncate_shrinks_frees_and_fences_the_blocks_past_the_new_end() {
    let mut s = state();
    let f = create(&mut s, "/f", File, 0).unwrap();
    let (_, locs) = map(&mut s, f.id, 0, 3, f.lease).unwrap();
    sync(&mut s, &f, 3 * BS as u64, false).unwrap();
    s.take_claims();
    let free = s.alloc().free_blocks();
    // To the middle of block 1: block 2 goes back, fenced.
    truncate(&mut s, &f, BS as u64 + 100, 77).unwrap();
    let n = lookup(&mut s, "/f").unwrap();
    assert_eq!((n.size, n.mtime), (BS as u64 + 100, 77));
    assert_eq!(s.alloc().free_blocks(), free + 1);
    assert!(is_free(&s, &locs[2]));
    let claims = s.take_claims();
    assert_eq!(claims.len(), 1, "the freed block is claimed: {claims:?}");
    assert_eq!(
        (claims[0].server, claims[0].block),
        (locs[2].server, locs[2].block)
    );
    assert!(claims[0].gen > locs[2].gen, "with a newer generation");
    // The writer goes on from the new end.
    let (_, again) = map(&mut s, f.id, 1, 2, f.lease).unwrap();
    assert_eq!(again[0].block, locs[1].block, "block 1 stayed");
    sync(&mut s, &f, 3 * BS as u64, false).unwrap();
    // To zero: every block goes.
    truncate(&mut s, &f, 0, 0).unwrap();
    assert_eq!(lookup(&mut s, "/f").unwrap().size, 0);
    assert_eq!(s.alloc().free_blocks(), free + 3);
    s.check_invariants().unwrap();
    // Growing is refused (a node grows by writing), as is a truncate by
    // someone without the lease.
    let before = s.dump();
    assert_eq!(
        truncate(&mut s, &f, 1, 0).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    assert_eq!(s.dump(), before, "a refused truncate changes nothing");
    let thief = NodeInfo {
        lease: f.lease + 1000,
        ..f.clone()
    };
    assert_eq!(
        truncate(&mut s, &thief, 0, 0).unwrap_err().code,
        ErrorCode::LeaseExpired
    );
    close(&mut s, &f, 0).unwrap();
    assert_eq!(
        truncate(&mut s, &f, 0, 0).unwrap_err().code,
        ErrorCode::LeaseExpired,
        "a closed writer cannot truncate"
    );
    s.check_invariants().unwrap();
}

#[test]
fn a_small_value_truncates_inside_its_piece() {
    let mut s = state_of(1 << 16, 64, 0);
    table(&mut s, "/t", true);
    let k = create_with_hint(&mut s, "/t/k", 100).unwrap();
    map(&mut s, k.id, 0, 1, k.lease).unwrap();
    sync(&mut s, &k, 100, false).unwrap();
    truncate(&mut s, &k, 40, 0).unwrap();
    close(&mut s, &k, 40).unwrap();
    assert_eq!(lookup(&mut s, "/t/k").unwrap().size, 40);
    s.check_invariants().unwrap();
}

#[test]
fn a_replacing_move_removes_the_target_in_the_same_step() {
    let mut s = state();
    create(&mut s, "/d", Directory, 0).unwrap();
    let a = file(&mut s, "/d/a", 1);
    let b = file(&mut s, "/d/b", 2);
    let b_locs = {
        let (_, l) = map(&mut s, b.id, 0, 2, 0).unwrap();
        l
    };
    s.take_claims();
    let free = s.alloc().free_blocks();
    // Without `replace`, an existing target is refused.
    let before = s.dump();
    assert_eq!(
        rename(&mut s, "/d/a", "/d/b", false).unwrap_err().code,
        ErrorCode::AlreadyExists
    );
    assert_eq!(s.dump(), before);
    // With it, /d/a takes /d/b's place and b's blocks are freed and fenced.
    let MetaReply::Moved {
        ty,
        clear,
        write,
        replaced,
    } = rename(&mut s, "/d/a", "/d/b", true).unwrap()
    else {
        panic!()
    };
    assert_eq!(ty, File);
    assert!(clear.is_some() && write.is_some());
    let replaced = replaced.expect("the replaced node's record is to be cleared");
    assert_ne!(Some(replaced.slot), write.map(|w| w.slot));
    assert_eq!(lookup(&mut s, "/d/b").unwrap().id, a.id);
    assert_eq!(
        lookup(&mut s, "/d/a").unwrap_err().code,
        ErrorCode::NotFound
    );
    assert!(s.ns().get(b.id).is_none(), "the old node is gone");
    assert_eq!(s.alloc().free_blocks(), free + 2);
    for l in &b_locs {
        assert!(is_free(&s, l));
    }
    assert_eq!(s.take_claims().len(), 2, "both freed blocks are fenced");
    assert_eq!(
        s.apply(
            MetaRequest::Map {
                node: b.id,
                index: 0,
                count: 1,
                alloc: false,
                lease: 0
            },
            0
        )
        .unwrap_err()
        .code,
        ErrorCode::Stale,
        "a handle to the replaced node is stale"
    );
    assert_eq!(children(&s, "/d"), vec!["b"]);
    s.check_invariants().unwrap();
    // A rename onto itself changes nothing.
    let before = s.dump();
    rename(&mut s, "/d/b", "/d/b", true).unwrap();
    assert_eq!(s.dump(), before);
}

#[test]
fn a_replacing_move_of_containers_needs_an_empty_target_of_the_same_type() {
    let mut s = state();
    for p in ["/x", "/y", "/z", "/x/f"] {
        let ty = if p == "/x/f" { File } else { Directory };
        create(&mut s, p, ty, 0).unwrap();
    }
    create(&mut s, "/z/g", Directory, 0).unwrap();
    create(&mut s, "/bag", Bag, 0).unwrap();
    let file_over_dir = rename(&mut s, "/x/f", "/y", true).unwrap_err();
    assert_eq!(file_over_dir.code, ErrorCode::TypeMismatch);
    let dir_over_bag = rename(&mut s, "/y", "/bag", true).unwrap_err();
    assert_eq!(dir_over_bag.code, ErrorCode::TypeMismatch);
    assert_eq!(
        rename(&mut s, "/x", "/z", true).unwrap_err().code,
        ErrorCode::NotEmpty
    );
    // Over an empty directory: it goes, /x (with its file) takes its name.
    let x = lookup(&mut s, "/x").unwrap();
    rename(&mut s, "/x", "/y", true).unwrap();
    assert_eq!(lookup(&mut s, "/y").unwrap().id, x.id);
    assert!(lookup(&mut s, "/y/f").is_ok());
    // A directory cannot replace one of its own ancestors' children that
    // contains it.
    assert_eq!(
        rename(&mut s, "/z/g", "/z", true).unwrap_err().code,
        ErrorCode::NotEmpty
    );
    s.check_invariants().unwrap();
}

// ----- encryption (docs/encryption.md) ---------------------------------------

/// A KeyValue of class `class` (or none) and known `size`, put and closed.
fn put_hinted(s: &mut MetaState, path: &str, class: u8, size: u64) -> NodeInfo {
    let k = create_hinted(s, path, class, size).unwrap();
    close(s, &k, size).unwrap();
    k
}

/// With class 1 encrypted: a node of no class (or of class 1) is
/// encrypted, one of class 0 plain, containers never; an encrypted node's
/// blocks have the plaintext capacity as their size and are scrubbed at
/// the generation just below theirs (nothing else is ever handed out at
/// it), a plain node's are not and never land in class 1 (`NoSpace` says
/// why); plain and encrypted small values never share a slab, and an
/// encrypted slab is scrubbed too; all of it survives the log and a
/// checkpoint.
#[test]
fn encryption_is_decided_at_create_and_plain_data_stays_out_of_encrypted_classes() {
    let mut s = state_of(BS, 8, 8);
    let class = |c: u8, encrypt: bool| ClassInfo {
        class: c,
        name: format!("c{c}"),
        price_per_gib: 0.0,
        encrypt,
    };
    s.set_classes(vec![class(0, false), class(1, true)]);
    assert!(s.encrypts(NO_CLASS) && s.encrypts(1) && !s.encrypts(0));
    table(&mut s, "/t", false);
    let d = create(&mut s, "/d", Directory, 0).unwrap();
    let e = create(&mut s, "/e", File, 0).unwrap();
    let p = create_with(&mut s, "/p", File, 0, true, 0).unwrap();
    assert!(!d.encrypted && e.encrypted && !p.encrypted);
    assert_eq!(e.block_size, crypt::block_capacity(BS));
    assert_eq!(p.block_size, BS);

    // Small values: the same stored size, but never the same slab.
    s.take_claims();
    let ke = put_hinted(&mut s, "/t/e", NO_CLASS, 100);
    let scrubs: Vec<BlockClaim> = s.take_claims().into_iter().filter(|c| c.scrub).collect();
    let kp = put_hinted(&mut s, "/t/p", 0, crypt::sealed_len(100));
    assert!(
        s.take_claims().iter().all(|c| !c.scrub),
        "a plain slab is not scrubbed"
    );
    let (le, lp) = (ke.first_block.unwrap(), kp.first_block.unwrap());
    assert!(ke.encrypted && !kp.encrypted);
    assert!(ke.block_size as u64 >= 100 && ke.block_size < kp.block_size);
    assert_eq!(crypt::plain_capacity(kp.block_size), ke.block_size);
    assert_ne!(
        le.block, lp.block,
        "plain and encrypted values share no slab"
    );
    assert_eq!(
        scrubs
            .iter()
            .map(|c| (c.block, c.gen + 1))
            .collect::<Vec<_>>(),
        vec![(le.block, le.gen)],
        "the new encrypted slab is scrubbed just below its generation"
    );
    assert!(s.slabs().get(le.server, le.block).unwrap().encrypted);
    assert!(!s.slabs().get(lp.server, lp.block).unwrap().encrypted);

    // Blocks: the plain File fills DRAM, the encrypted one spills into
    // the encrypted class; only the encrypted one's are scrubbed.
    let (_, pb) = map(&mut s, p.id, 0, 4, p.lease).unwrap();
    assert!(pb.iter().all(|b| b.class == 0));
    assert!(s.take_claims().iter().all(|c| !c.scrub));
    let (_, eb) = map(&mut s, e.id, 0, 6, e.lease).unwrap();
    assert_eq!(eb.iter().filter(|b| b.class == 1).count(), 4, "{eb:?}");
    let mut scrubbed: Vec<(u32, u64)> = s
        .take_claims()
        .iter()
        .filter(|c| c.scrub)
        .map(|c| (c.block, c.gen + 1))
        .collect();
    let mut want: Vec<(u32, u64)> = eb.iter().map(|b| (b.block, b.gen)).collect();
    scrubbed.sort();
    want.sort();
    assert_eq!(scrubbed, want);
    let e = map(&mut s, p.id, 4, 1, p.lease).unwrap_err();
    assert_eq!(e.code, ErrorCode::NoSpace, "{e}");
    assert!(e.message.contains("not encrypted"), "{e}");
    // Sizes follow the plaintext capacity.
    let cap = crypt::block_capacity(BS) as u64;
    let full = create(&mut s, "/full", File, 0).unwrap();
    map(&mut s, full.id, 0, 2, full.lease).unwrap();
    let err = close(&mut s, &full, 2 * cap + 1).unwrap_err();
    assert_eq!(err.code, ErrorCode::OutOfRange, "{err}");
    close(&mut s, &full, 2 * cap).unwrap();
    s.check_invariants().unwrap();

    // A checkpoint keeps the node and slab flags.
    let back = through_checkpoint(&s);
    assert_eq!(back.dump(), s.dump());
    assert!(back.ns().get(ke.id).unwrap().encrypted);
    assert!(back.slabs().get(le.server, le.block).unwrap().encrypted);
}

/// What `cap` allows on bytes `offset..offset + len` of `l`'s block with
/// key [7; 32] at the storage server's time `now` (seconds).
fn allows(l: &BlockLoc, offset: u32, len: u32, needs: Rights, now: u64) -> bool {
    l.cap
        .check(
            &[7; 32],
            Use {
                block: l.block,
                gen: l.gen,
                offset,
                len,
                needs,
                now,
            },
        )
        .is_ok()
}

/// A reader's location only reads; a writer's (handed out under its
/// lease: the create, a map that allocates) reads and writes; a child
/// record's location writes that one record only. Every location a client
/// gets expires after the capability lifetime, counted in its storage
/// server's clock (learned from its signed heartbeats); the metadata
/// server's own claims never expire and alone may clear tags.
#[test]
fn locations_allow_their_holders_only_what_they_were_given_for_a_while() {
    let mut s = state();
    // This server's wall clock reads 1,000 s at `now` 0; capabilities live
    // 60 s.
    s.set_cap_clock(1_000_000, 60);
    let f = create(&mut s, "/f", File, 0).unwrap();
    let (_, b) = map(&mut s, f.id, 0, 1, f.lease).unwrap();
    let w = &b[0];
    assert!(allows(w, 0, BS, Rights::WRITE, 1_000));
    assert!(
        allows(w, 0, BS, Rights::WRITE, 1_060),
        "good through its last second"
    );
    assert!(!allows(w, 0, BS, Rights::WRITE, 1_061), "expired");
    assert!(
        !allows(w, 0, 0, Rights::MANAGE, 1_000),
        "a client never manages"
    );
    close(&mut s, &f, BS as u64).unwrap();

    // A reader's locations (lookup, a map without a lease) only read.
    let l = lookup(&mut s, "/f").unwrap().first_block.unwrap();
    assert_eq!((l.block, l.gen), (w.block, w.gen));
    assert!(allows(&l, 0, BS, Rights::READ, 1_000));
    assert!(
        !allows(&l, 0, 1, Rights::WRITE, 1_000),
        "a reader cannot write"
    );
    let (_, b) = map(&mut s, f.id, 0, 1, 0).unwrap();
    assert!(!allows(&b[0], 0, 1, Rights::WRITE, 1_000));
    // A small value's reader reads its piece only.
    create(&mut s, "/t", Table, 0).unwrap();
    let k = put_small(&mut s, "/t/k", 100).unwrap();
    let kl = lookup(&mut s, "/t/k").unwrap().first_block.unwrap();
    assert_eq!(kl.tag, k.id);
    let piece = kl.offset - TAG_LEN;
    assert!(allows(&kl, piece, TAG_LEN + 100, Rights::READ, 1_000));
    assert!(!allows(&kl, piece, TAG_LEN, Rights::WRITE, 1_000));

    // A child record's location writes that record and nothing else.
    let d = create(&mut s, "/d", Directory, 0).unwrap();
    let c = create(&mut s, "/d/c", Directory, 0).unwrap();
    let r = c.record.expect("a record to write");
    assert_eq!(r.container, d.id);
    let rec = RECORD_SIZE as u32;
    assert!(allows(&r.block, r.offset, rec, Rights::WRITE, 1_000));
    assert!(!allows(&r.block, r.offset + rec, rec, Rights::WRITE, 1_000));
    assert!(!allows(&r.block, 0, BS, Rights::WRITE, 1_000));

    // A storage server whose clock runs 500 s ahead: its capabilities
    // expire in its own clock.
    let beat = MetaRequest::Heartbeat {
        server: w.server,
        traffic: Default::default(),
        signed: Default::default(),
    };
    let mut beat = beat;
    beat.sign(&[7; 32], (1_000 + 500) * 1000);
    s.apply(beat, 0).unwrap();
    let (_, b) = map(&mut s, f.id, 0, 1, 0).unwrap();
    assert!(allows(&b[0], 0, 1, Rights::READ, 1_560));
    assert!(!allows(&b[0], 0, 1, Rights::READ, 1_561));

    // The metadata server's own claims: never expire, clear tags.
    remove(&mut s, "/t/k", false).unwrap();
    let claims = s.take_claims();
    let clear = claims
        .iter()
        .find(|c| c.clear_tag_at.is_some())
        .expect("the freed piece's tag is cleared");
    assert_eq!(clear.cap.rights, Rights::MANAGE);
    assert_eq!(clear.cap.expires, 0);
    s.check_invariants().unwrap();
}

/// A heartbeat or resize counts only when signed with the key its server
/// registered, and only once: an unsigned, forged or replayed one is
/// refused and changes nothing.
#[test]
fn heartbeats_and_resizes_count_only_signed_by_their_server_and_once() {
    let mut s = state();
    let beat = |seq: u64, key: [u8; 32]| {
        let mut b = MetaRequest::Heartbeat {
            server: 1,
            traffic: Default::default(),
            signed: Default::default(),
        };
        b.sign(&key, seq);
        b
    };
    s.alloc_soft().expire(10_000, 1000);
    assert!(!s.alloc().is_alive(1));
    let unsigned = MetaRequest::Heartbeat {
        server: 1,
        traffic: Default::default(),
        signed: Default::default(),
    };
    for (what, req) in [("unsigned", unsigned), ("forged", beat(5, [8; 32]))] {
        let e = s.apply(req, 10_000).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{what}: {e}");
        assert!(!s.alloc().is_alive(1), "{what} revived the server");
    }
    s.apply(beat(5, [7; 32]), 10_000).unwrap();
    assert!(s.alloc().is_alive(1));
    for seq in [5, 4] {
        let e = s.apply(beat(seq, [7; 32]), 10_000).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
        assert!(e.message.contains("replay"), "{e}");
    }
    s.apply(beat(6, [7; 32]), 10_000).unwrap();

    // A resize: forged ones leave the server's size alone.
    let id = s.alloc().server(1).unwrap().spec.identity.clone();
    let resize = |seq: u64, key: [u8; 32]| {
        let mut r = MetaRequest::Resize {
            server: id.clone(),
            blocks: 0,
            signed: Default::default(),
        };
        r.sign(&key, seq);
        r
    };
    let capacity = |s: &MetaState| s.alloc().server(1).unwrap().free.len();
    let before = capacity(&s);
    for req in [resize(7, [8; 32]), resize(6, [7; 32])] {
        let e = s.apply(req, 10_000).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
        assert_eq!(capacity(&s), before);
    }
    s.apply(resize(7, [7; 32]), 10_000).unwrap();
    assert!(capacity(&s) < before, "the server's own resize is taken");
    // Registering a new key starts its numbers anew.
    let rekeyed = ServerSpec {
        cap_key: [9; 32],
        ..spec("h:0", 0, 4)
    };
    s.apply(MetaRequest::Register(rekeyed), 10_000).unwrap();
    s.apply(beat(1, [9; 32]), 10_000).unwrap();
    assert_eq!(
        s.apply(beat(2, [7; 32]), 10_000).unwrap_err().code,
        ErrorCode::Unauthenticated,
        "the old key no longer signs"
    );
    s.check_invariants().unwrap();
}

/// A writer that pauses keeps its node: its client renews the lease
/// (`Renew`, publishing nothing), so the sweep never lapses it and what it
/// wrote past its last sync stays; a renewal of a lease that is gone says
/// so, and renews nothing.
#[test]
fn a_renewed_lease_never_lapses_and_a_lost_one_is_reported() {
    let mut s = state();
    let f = create(&mut s, "/f", File, 0).unwrap();
    map(&mut s, f.id, 0, 3, f.lease).unwrap();
    sync(&mut s, &f, 100, false).unwrap();
    let used = total_used(&s);
    let renew = |s: &mut MetaState, now: u64| match s
        .apply(
            MetaRequest::Renew {
                leases: vec![(f.id, f.lease), (f.id, f.lease + 99), (9999, 1)],
            },
            now,
        )
        .unwrap()
    {
        MetaReply::Renewed { lease_ms, lost } => (lease_ms, lost),
        r => panic!("{r:?}"),
    };
    // Renewed every 400 ms (of a 1000 ms lease) for a long while.
    for now in (400..20_000).step_by(400) {
        let (lease_ms, lost) = renew(&mut s, now);
        assert_eq!(lease_ms, 1000);
        assert_eq!(
            lost,
            vec![f.id, 9999],
            "only the wrong lease and node are lost"
        );
        assert!(s.decide_sweep(now, 1000).is_none(), "at {now}: swept");
    }
    assert_eq!(total_used(&s), used, "nothing was freed");
    assert_eq!(s.ns().get(f.id).unwrap().size, 100, "nothing was published");
    // The writer goes on where it was.
    map(&mut s, f.id, 3, 1, f.lease).unwrap();
    close(&mut s, &f, 3 * BS as u64 + 1).unwrap();
    // Once closed, a renewal finds the lease gone.
    let reply = s
        .apply(
            MetaRequest::Renew {
                leases: vec![(f.id, f.lease)],
            },
            20_000,
        )
        .unwrap();
    assert_eq!(
        reply,
        MetaReply::Renewed {
            lease_ms: 1000,
            lost: vec![f.id]
        }
    );
    s.check_invariants().unwrap();
}
