//! Small Files in pieces (`docs/small-values.md`, *Small Files*): a
//! File's small first write takes a piece; its writer outgrows it into
//! blocks, which replace the piece at its next sync.

use super::*;

/// Maps block 0 of writer `n` for a first write of `len` bytes.
fn map_first(s: &mut MetaState, n: &NodeInfo, len: u32) -> Result<BlockLoc> {
    let req = MetaRequest::Map {
        node: n.id,
        index: 0,
        count: 1,
        alloc: true,
        lease: n.lease,
        first_write: len,
    };
    match s.apply(req, 0)? {
        MetaReply::Blocks { mut blocks, .. } => Ok(blocks.remove(0)),
        r => panic!("unexpected {r:?}"),
    }
}

fn outgrow(s: &mut MetaState, n: &NodeInfo) -> Result<BlockLoc> {
    let req = MetaRequest::Outgrow {
        node: n.id,
        lease: n.lease,
    };
    match s.apply(req, 0)? {
        MetaReply::Blocks { mut blocks, .. } => Ok(blocks.remove(0)),
        r => panic!("unexpected {r:?}"),
    }
}

fn open_write(s: &mut MetaState, path: &str) -> NodeInfo {
    match s.apply(MetaRequest::OpenWrite { path: path.into() }, 0) {
        Ok(MetaReply::Node(n)) => n,
        r => panic!("unexpected {r:?}"),
    }
}

/// Whether `loc` is a piece of a shared block (past its tag) rather than
/// a block of its own.
fn is_piece(loc: &BlockLoc) -> bool {
    loc.tag != 0 && loc.offset != 0
}

/// A File of `len` bytes written in one go and closed: in a piece.
fn small_file(s: &mut MetaState, path: &str, len: u32) -> (NodeInfo, BlockLoc) {
    let f = create(s, path, File, 0).unwrap();
    let piece = map_first(s, &f, len).unwrap();
    close(s, &f, len.into()).unwrap();
    (f, piece)
}

/// A 100-byte File takes a 112-byte piece and counts its offsets in whole
/// blocks all the same; its writer cannot write or publish past the
/// piece until it outgrows it; after outgrowing, its readers still read
/// the piece while the writer fills a block of its own, and the next sync
/// switches them to the blocks and frees the piece.
#[test]
fn a_small_file_lives_in_a_piece_until_it_outgrows_it() {
    let mut s = state();
    let used = used_blocks(&s, 0);
    let (f, piece) = small_file(&mut s, "/f", 100);
    assert!(is_piece(&piece), "{piece:?}");
    assert_eq!(piece.tag, f.id);
    assert_eq!(used_blocks(&s, 0), used + 1, "one slab");
    let r = lookup(&mut s, "/f").unwrap();
    assert_eq!((r.size, r.block_size, r.stored), (100, BS, 112));
    let seen = r.first_block.unwrap();
    assert_eq!(
        (seen.block, seen.offset, seen.tag),
        (piece.block, piece.offset, f.id)
    );

    let w = open_write(&mut s, "/f");
    assert!(w.first_block.as_ref().is_some_and(is_piece));
    let e = map(&mut s, w.id, 1, 1, w.lease).unwrap_err();
    assert_eq!(e.code, ErrorCode::OutOfRange, "{e}");
    let e = sync(&mut s, &w, 105, false).unwrap_err();
    assert_eq!(
        e.code,
        ErrorCode::OutOfRange,
        "the piece holds 104 bytes: {e}"
    );
    sync(&mut s, &w, 104, false).unwrap();

    let b = outgrow(&mut s, &w).unwrap();
    assert_eq!((b.tag, b.offset), (0, 0), "a block of its own: {b:?}");
    assert_eq!(
        outgrow(&mut s, &w).unwrap().block,
        b.block,
        "a retry gets the same block"
    );
    s.check_invariants().unwrap();
    let (size, seen) = map(&mut s, w.id, 0, 4, 0).unwrap();
    assert_eq!(size, 104);
    assert!(
        seen.len() == 1 && is_piece(&seen[0]),
        "readers read the piece: {seen:?}"
    );
    let (_, mine) = map(&mut s, w.id, 0, 2, w.lease).unwrap();
    assert_eq!(mine.iter().map(|l| l.block).collect::<Vec<_>>()[0], b.block);
    assert_eq!(mine.len(), 2, "the writer allocates on past block 0");

    sync(&mut s, &w, BS as u64 + 10, false).unwrap();
    s.check_invariants().unwrap();
    let (_, seen) = map(&mut s, w.id, 0, 4, 0).unwrap();
    assert_eq!(
        seen.iter().map(|l| (l.block, l.tag)).collect::<Vec<_>>(),
        vec![(b.block, 0), (mine[1].block, 0)]
    );
    assert!(
        s.slabs().get(piece.server, piece.block).is_none(),
        "the emptied slab went back"
    );
    assert_eq!(used_blocks(&s, 0), used + 2);
    close(&mut s, &w, BS as u64 + 10).unwrap();
    let r = lookup(&mut s, "/f").unwrap();
    assert_eq!((r.size, r.stored), (BS as u64 + 10, 2 * BS as u64));
}

/// A writer that outgrew the piece and went away before syncing (aborted,
/// or forgotten by a restart) leaves the File in its piece, as published,
/// and its block free.
#[test]
fn a_writer_gone_before_its_sync_leaves_the_file_in_its_piece() {
    let mut s = state();
    small_file(&mut s, "/f", 100);
    let w = open_write(&mut s, "/f");
    let b = outgrow(&mut s, &w).unwrap();
    s.apply(
        MetaRequest::Abort {
            node: w.id,
            lease: w.lease,
        },
        0,
    )
    .unwrap();
    s.check_invariants().unwrap();
    assert!(is_free(&s, &b));
    let (size, seen) = map(&mut s, w.id, 0, 4, 0).unwrap();
    assert!(size == 100 && seen.len() == 1 && is_piece(&seen[0]));

    // The same through a checkpoint and a restart, which forgets writers.
    let mut s = state();
    let (f, _) = small_file(&mut s, "/f", 100);
    let w = open_write(&mut s, "/f");
    let b = outgrow(&mut s, &w).unwrap();
    let mut r = through_checkpoint(&s);
    assert_eq!(
        r.dump(),
        s.dump(),
        "a checkpoint keeps the piece and the block"
    );
    r.restarted(0);
    if let Some(d) = r.decide_restart(1 << 40) {
        r.commit(d, 0);
    }
    r.check_invariants().unwrap();
    let n = r.ns().get(f.id).unwrap();
    assert!(n.piece.is_some() && n.blocks.is_empty() && n.size == 100);
    assert!(is_free(&r, &b));
}

/// Only a File's first write, small enough and not encrypted, takes a
/// piece; a KeyValue never outgrows one.
#[test]
fn only_a_small_first_write_of_a_plain_file_takes_a_piece() {
    let mut s = state();
    table(&mut s, "/t", false);
    let k = create(&mut s, "/t/k", KeyValue, 0).unwrap();
    assert!(
        !is_piece(&map_first(&mut s, &k, 100).unwrap()),
        "a KeyValue's size hint decides"
    );
    let big = create(&mut s, "/big", File, 0).unwrap();
    assert!(
        !is_piece(&map_first(&mut s, &big, BS / 4).unwrap()),
        "more than a quarter block"
    );
    let g = create(&mut s, "/g", File, 0).unwrap();
    map(&mut s, g.id, 0, 1, g.lease).unwrap();
    assert!(
        !is_piece(&map_first(&mut s, &g, 10).unwrap()),
        "blocks already"
    );

    let v = create_with_hint(&mut s, "/t/v", 100).unwrap();
    let e = outgrow(&mut s, &v).unwrap_err();
    assert_eq!(e.code, ErrorCode::TypeMismatch, "{e}");
    s.check_invariants().unwrap();

    let mut s = state_of(BS, 8, 8);
    encrypt_class_1(&mut s);
    let e = create(&mut s, "/e", File, 0).unwrap();
    assert!(e.encrypted);
    assert!(
        !is_piece(&map_first(&mut s, &e, 100).unwrap()),
        "an encrypted File"
    );
}
