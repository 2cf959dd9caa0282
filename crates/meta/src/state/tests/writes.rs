//! Writers: map, sync, close, puts, open for writing, truncate, block
//! replacement, no space.

use super::*;

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
    assert!(rec.block.offset > 0, "the first record is in a piece");
    assert_eq!(
        s.take_claims().len(),
        0,
        "a record piece, like a value's, is written at its slab's generation: nothing to claim"
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
    // The table's records: its first piece, then its first block.
    put(&mut s, "/t/warm", 0).unwrap();
    put(&mut s, "/t/warm2", 0).unwrap();
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
