//! Snapshots (`docs/snapshots.md`).

use super::*;

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
            ttl_ms: 0,
            child_ttl_ms: 0,
            session: None,
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
