//! The namespace: create, lookup, remove and reaping, move, enumerate,
//! record slots, partitions, attributes.

use super::*;

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
fn slots_are_cleared_before_reuse_and_moves_rewrite_records() {
    let mut s = state();
    let d = create(&mut s, "/d", Directory, 0).unwrap();
    assert!(d.record.is_some(), "root is enumerable: /d needs a record");
    // Records in a 640-byte piece (19 slots), then in blocks.
    let layout = nodekernel_proto::record::Layout::new(BS, true);
    let per_block = BS as u64 / SLOT_SIZE as u64;
    let in_piece = u64::from(layout.slots_in(0));
    let slots = in_piece + per_block + 1;
    for i in 0..slots {
        let f = create(&mut s, &format!("/d/f{i}"), File, 0).unwrap();
        let r = f.record.unwrap();
        assert_eq!((r.container, r.slot as u64), (d.id, i));
        assert_eq!(r.offset, layout.locate(i as u32).1);
        // A piece's location starts past its tag; a block's at 0.
        assert_eq!(r.block.offset == 0, i >= in_piece, "slot {i}");
    }
    let (size, blocks) = map(&mut s, d.id, 0, 10, 0).unwrap();
    assert_eq!(size, slots * SLOT_SIZE as u64);
    assert_eq!(blocks.len(), 3, "a piece and two blocks");
    let clear = remove(&mut s, "/d/f3", false).unwrap().unwrap();
    assert_eq!(clear.slot, 3);
    let next = create(&mut s, "/d/g", File, 0).unwrap();
    assert_eq!(
        next.record.unwrap().slot as u64,
        slots,
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
    let MetaReply::Listing {
        slots: listed,
        live,
        pieces,
        ..
    } = s
        .apply(MetaRequest::Enumerate { path: "/d".into() }, 0)
        .unwrap()
    else {
        panic!()
    };
    assert!(pieces);
    assert_eq!(listed as u64, slots + 1);
    assert_eq!(
        live.iter().map(|b| b.count_ones()).sum::<u32>() as u64,
        slots
    );
    let e = s.apply(
        MetaRequest::Map {
            node: d.id,
            index: 0,
            count: 1,
            alloc: true,
            lease: 1,
            first_write: 0,
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
        s.ns().get(k.id).unwrap().slot.get(),
        None,
        "no record in a non-enumerable table"
    );
    assert!(s.ns().get(t.id).unwrap().slots.is_empty());
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
    let steps = reap_all(&mut s);
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
            ttl_ms: None,
            child_ttl_ms: None,
        },
        0,
    )? {
        MetaReply::Node(n) => Ok(n),
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
        ttl_ms: 0,
        child_ttl_ms: 0,
        session: None,
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
            first_write: 0,
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
            ttl_ms: None,
            child_ttl_ms: None,
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
            ttl_ms: None,
            child_ttl_ms: None,
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
            ttl_ms: None,
            child_ttl_ms: None,
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
                lease: 0,
                first_write: 0,
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

/// A container's record pieces on a storage server that died are replaced
/// by new ones on a live server, each in its place (as its record blocks
/// are): new records are written there, and the names of the records lost
/// with the dead server come from the metadata server. With 4 KiB blocks
/// a container has one record piece (19 slots, then blocks); with 64 KiB
/// blocks, 218 records of short names take four pieces (19, 39, 159, 1).
#[test]
fn record_pieces_on_a_dead_server_are_replaced() {
    for (bs, children, pieces, extents) in [(BS, 19, 1, 2), (64 << 10, 217, 4, 4)] {
        let mut s = MetaState::new(bs, 1000, 1);
        for i in 1..=2 {
            let spec = ServerSpec {
                block_size: bs,
                ..spec(&format!("h:{i}"), 0, 8)
            };
            s.apply(MetaRequest::Register(spec), 0).unwrap();
        }
        let d = create(&mut s, "/d", Directory, 0).unwrap();
        for i in 0..children {
            create(&mut s, &format!("/d/a{i}"), File, 0).unwrap();
        }
        // The server of the last piece dies (the others may be there
        // too, or on the other server).
        let before = s.ns().get(d.id).unwrap().slots.pieces().to_vec();
        let dead = before.last().unwrap().server;
        let other = if dead == 1 { 2 } else { 1 };
        only_alive(&mut s, other, 5000);
        let b = create(&mut s, "/d/b", File, 5000).unwrap();
        let rb = b.record.unwrap();
        assert_eq!((rb.slot, rb.block.server), (children, other));
        let now = s.ns().get(d.id).unwrap().slots.pieces().to_vec();
        assert_eq!(now.len(), pieces, "block size {bs}");
        assert!(now.iter().all(|p| p.server == other), "{now:?}");
        for (was, is) in before.iter().zip(&now) {
            // A piece keeps its place and size; only the lost ones moved.
            assert_eq!(was.size, is.size);
            assert_eq!(was == is, was.server == other, "{before:?} {now:?}");
        }
        let (_, mapped) = map(&mut s, d.id, 0, 40, 0).unwrap();
        assert_eq!(mapped.len(), extents);
        assert!(mapped.iter().all(|e| e.server == other), "{mapped:?}");
        let mut slots = vec![0, children - 1];
        slots.dedup();
        let want: Vec<_> = slots.iter().map(|i| (*i, File, format!("a{i}"))).collect();
        let MetaReply::Names(names) = s
            .apply(
                MetaRequest::RecordNames {
                    container: d.id,
                    slots,
                },
                5000,
            )
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(names, want);
        s.check_invariants().unwrap();
    }
}

/// A container whose record pieces and blocks together exceed what one
/// reaping step frees is reaped in steps too: its blocks first, within
/// the budget, then the node with its pieces; everything comes back.
#[test]
fn a_container_with_more_record_extents_than_a_step_frees_is_reaped_in_steps() {
    let mut s = MetaState::new(BS, 1000, 1);
    s.apply(MetaRequest::Register(spec("h:0", 0, 20_000)), 0)
        .unwrap();
    let free = s.alloc().free_blocks();
    create(&mut s, "/d", Directory, 0).unwrap();
    // Names of 232 bytes, eight slots each: two records in the piece,
    // then 16 per 4 KiB block: REAP_BLOCKS blocks and the piece, one
    // extent more than a step frees.
    let per_block = BS as usize / SLOT_SIZE / 8;
    for i in 0..2 + REAP_BLOCKS * per_block {
        create(&mut s, &format!("/d/{i:0>232}"), File, 0).unwrap();
    }
    let d = s.ns().get(s.ns().resolve("/d").unwrap()).unwrap();
    assert_eq!((d.slots.pieces().len(), d.blocks.len()), (1, REAP_BLOCKS));
    remove(&mut s, "/d", true).unwrap();
    reap_all(&mut s);
    assert_eq!(s.ns().len(), 1, "only the root is left");
    let root = s.ns().get(ROOT).unwrap().blocks.len() as u64;
    assert_eq!(
        s.alloc().free_blocks(),
        free - root,
        "every record block and slab is back"
    );
}

/// Runs reaping steps until the graveyard is empty, checking that each
/// frees at most [`REAP_BLOCKS`] blocks and keeps every invariant; returns
/// the number of steps.
fn reap_all(s: &mut MetaState) -> usize {
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
    steps
}

/// Records take the slots their names need (one up to 8 bytes, two up to
/// 40, nine for 255), each in one extent: names of every length, created
/// and removed over and over (records cleared and released as clients
/// do), keep every invariant, reuse the freed runs, and keep the array at
/// what the most records live at once need.
#[test]
fn records_of_names_of_every_length_share_slots_and_churn_stays_bounded() {
    use nodekernel_proto::record::{slots_for, Layout};
    let mut s = state();
    let d = create(&mut s, "/d", Directory, 0).unwrap();
    let layout = Layout::new(BS, true);
    let lens = [2, 8, 9, 40, 41, 100, 255];
    let name = |round: usize, i: usize| {
        let base = format!("{round}.{i}.");
        let len = lens[(round + i) % lens.len()].max(base.len());
        format!("{base:x<len$}")
    };
    const LIVE: usize = 40;
    let mut sizes = Vec::new();
    for round in 0..12 {
        let mut held = 0;
        for i in 0..LIVE {
            let n = name(round, i);
            let r = create(&mut s, &format!("/d/{n}"), File, 0)
                .unwrap()
                .record
                .unwrap();
            let (k, at) = layout.locate(r.slot);
            let len = slots_for(n.len());
            assert_eq!(layout.locate(r.slot + len - 1).0, k, "one extent: {n}");
            assert_eq!(r.offset, at);
            held += len;
        }
        s.check_invariants().unwrap();
        let dir = s.ns().get(d.id).unwrap();
        // Slots skipped at the ends of extents, at most a record's worth
        // per extent.
        let extents = layout.extents_for(dir.slots.len()) as u32;
        assert!(dir.slots.len() <= held + extents * 8, "round {round}");
        sizes.push(dir.slots.len());
        // Every other one goes, then the rest: freed runs of every length.
        for i in (0..LIVE).step_by(2).chain((1..LIVE).step_by(2)) {
            remove_and_release(&mut s, &format!("/d/{}", name(round, i)));
        }
        s.check_invariants().unwrap();
    }
    // Each round finds every slot free and fills them lowest first.
    let most = *sizes.iter().max().unwrap();
    assert!(sizes.iter().skip(1).all(|n| *n <= most), "{sizes:?}");
    assert!(most < (LIVE as u32) * 9, "{sizes:?}");
}

/// A run of free slots too short for a long name is passed over, and a
/// short name takes it; a run long enough is taken lowest first.
#[test]
fn a_record_takes_the_lowest_free_run_its_name_fits() {
    let mut s = state();
    create(&mut s, "/d", Directory, 0).unwrap();
    let slot = |s: &mut MetaState, name: &str| {
        create(s, &format!("/d/{name}"), File, 0)
            .unwrap()
            .record
            .unwrap()
            .slot
    };
    // Slots 0, 1-2, 3, 4: a short name, one of 9-40 bytes, two short.
    assert_eq!(slot(&mut s, "a"), 0);
    assert_eq!(slot(&mut s, &"b".repeat(20)), 1);
    assert_eq!(slot(&mut s, "c"), 3);
    assert_eq!(slot(&mut s, "e"), 4);
    for name in ["a".to_string(), "b".repeat(20)] {
        remove_and_release(&mut s, &format!("/d/{name}"));
    }
    // Free: 0..3. A 73-byte name needs four slots: past the end.
    assert_eq!(slot(&mut s, &"f".repeat(73)), 5);
    // Three slots (41-72 bytes) fit the freed run.
    assert_eq!(slot(&mut s, &"g".repeat(41)), 0);
    s.check_invariants().unwrap();
}

/// Removes `path`, then releases its record slot once cleared, as the
/// client that removes it does.
fn remove_and_release(s: &mut MetaState, path: &str) {
    let clear = remove(s, path, false).unwrap().unwrap();
    s.apply(
        MetaRequest::ReleaseSlot {
            container: clear.container,
            slot: clear.slot,
        },
        0,
    )
    .unwrap();
}

/// `RecordAt`: a record write refused because the record piece's slab got
/// a new generation (the small values sharing it came and went) learns
/// where the record is now, while its slot still holds that child; a
/// clear, while its slot is still being cleared. Otherwise no location.
#[test]
fn a_record_refused_after_a_stamp_is_found_again_while_its_slot_is_its_own() {
    let mut s = state();
    table(&mut s, "/t", true);
    put_small(&mut s, "/t/a", 10).unwrap();
    // A new key's record comes with its close.
    let b = create_with_hint(&mut s, "/t/b", 10).unwrap();
    let rec = close(&mut s, &b, 10).unwrap().expect("b's record");
    let t = s.ns().resolve("/t").unwrap();
    let record_at = |s: &mut MetaState, slot: u32, name: &str| {
        let req = MetaRequest::RecordAt {
            container: t,
            slot,
            name: name.into(),
        };
        match s.apply(req, 0) {
            Ok(MetaReply::Record(r)) => Ok(r),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        }
    };
    // Values of the record piece's size replace one another in its slab
    // until the slab is stamped.
    let piece = s.ns().get(t).unwrap().slots.pieces()[0];
    let value = u64::from(piece.capacity());
    let mut i = 0;
    while s.slabs().get(piece.server, piece.block).unwrap().gen == rec.block.gen {
        put_small(&mut s, &format!("/t/v{}", i % 2), value).unwrap();
        i += 1;
        assert!(i < 10_000, "the slab was never stamped");
    }
    let now = record_at(&mut s, rec.slot, "b")
        .unwrap()
        .expect("still b's slot");
    assert_eq!(
        (now.container, now.slot, now.offset),
        (t, rec.slot, rec.offset)
    );
    assert_eq!(
        now.block.gen,
        s.slabs().get(piece.server, piece.block).unwrap().gen,
        "at the slab's new generation"
    );
    assert_eq!(
        (now.block.server, now.block.block),
        (rec.block.server, rec.block.block)
    );
    // Not a location for another child's record, nor for a clear of a
    // live slot.
    assert_eq!(record_at(&mut s, rec.slot, "a").unwrap(), None);
    assert_eq!(record_at(&mut s, rec.slot, "").unwrap(), None);
    assert_eq!(record_at(&mut s, 999, "b").unwrap(), None);
    // Removed: its slot is being cleared, so a clear may learn where.
    let clear = remove(&mut s, "/t/b", false)
        .unwrap()
        .expect("a record to clear");
    assert_eq!(clear.slot, rec.slot);
    assert_eq!(record_at(&mut s, rec.slot, "b").unwrap(), None);
    assert!(record_at(&mut s, rec.slot, "").unwrap().is_some());
    s.apply(
        MetaRequest::ReleaseSlot {
            container: t,
            slot: rec.slot,
        },
        0,
    )
    .unwrap();
    assert_eq!(record_at(&mut s, rec.slot, "").unwrap(), None);
    // A container that is gone: Stale, as for the other record requests.
    remove(&mut s, "/t", true).unwrap();
    assert_eq!(
        record_at(&mut s, rec.slot, "").unwrap_err().code,
        ErrorCode::Stale
    );
    s.check_invariants().unwrap();
}
