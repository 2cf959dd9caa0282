//! Write leases: takeovers, lapses, the sweep, renewals, restarts.

use super::*;

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
        ttl_ms: 0,
        child_ttl_ms: 0,
        session: None,
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
        first_write: 0,
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
