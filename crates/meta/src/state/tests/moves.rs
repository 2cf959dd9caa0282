//! Block and slab moves.

use super::*;

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

/// While a container's record block moves, creates and removes in it get
/// no record location: a record written to the source after the copy
/// would be lost, and a lost clear could show a reused slot's old name.
/// The same holds for a record piece while its slab moves.
#[test]
fn records_are_not_handed_out_while_their_block_moves() {
    let mut s = state();
    create(&mut s, "/d", Directory, 0).unwrap();
    // Slots 0-18 are in the container's first piece, slot 19 in its
    // block 0 (extent 1).
    let p = create(&mut s, "/d/p", File, 0).unwrap();
    assert!(p.record.unwrap().block.offset > 0, "in a piece");
    for i in 1..19 {
        create(&mut s, &format!("/d/p{i}"), File, 0).unwrap();
    }
    let a = create(&mut s, "/d/a", File, 0).unwrap();
    assert_eq!(a.record.unwrap().block.offset, 0, "in a block");
    let d = lookup(&mut s, "/d").unwrap();
    let (dec, _, _) = s.decide_move_start(d.id, 0, NO_CLASS).unwrap();
    s.commit(dec, 0);
    let b = create(&mut s, "/d/b", File, 0).unwrap();
    assert!(b.record.is_none(), "no record while moving: {:?}", b.record);
    assert!(remove(&mut s, "/d/a", false).unwrap().is_none());
    assert_eq!(
        map(&mut s, d.id, 1, 1, 0).unwrap_err().code,
        ErrorCode::TryAgain,
        "a reader of the records waits for the move, never reads an empty map"
    );
    map(&mut s, d.id, 0, 1, 0).expect("the piece is not moving");
    let dec = s.decide_move_end(d.id, 0, true).unwrap();
    s.commit(dec, 0);
    let c = create(&mut s, "/d/c", File, 0).unwrap();
    let rec = c.record.expect("records again after the move");
    let (_, now) = map(&mut s, d.id, 1, 1, 0).unwrap();
    assert_eq!(
        (rec.block.server, rec.block.gen),
        (now[0].server, now[0].gen)
    );
    s.check_invariants().unwrap();

    // The piece's slab moves: its record is not handed out meanwhile,
    // and afterwards the container's piece is the moved one.
    let piece = s.ns().get(d.id).unwrap().slots.pieces()[0];
    let index = slab_move_index(piece.server, piece.block);
    let (dec, _, dst) = s.decide_move_start(SLAB_MOVE, index, NO_CLASS).unwrap();
    s.commit(dec, 0);
    assert!(remove(&mut s, "/d/p", false).unwrap().is_none());
    assert_eq!(
        map(&mut s, d.id, 0, 1, 0).unwrap_err().code,
        ErrorCode::TryAgain
    );
    let dec = s.decide_move_end(SLAB_MOVE, index, true).unwrap();
    s.commit(dec, 0);
    let moved = s.ns().get(d.id).unwrap().slots.pieces()[0];
    assert_eq!(
        (moved.server, moved.block, moved.index, moved.size),
        (dst.server, dst.block, piece.index, piece.size)
    );
    let (_, now) = map(&mut s, d.id, 0, 2, 0).unwrap();
    assert_eq!((now[0].server, now[0].block), (dst.server, dst.block));
    assert_eq!(now[0].offset, moved.value_offset());
    assert_eq!(now.len(), 2, "the piece, then the block");
    s.check_invariants().unwrap();
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
