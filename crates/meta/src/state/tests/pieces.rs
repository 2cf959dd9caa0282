//! Small values in pieces of shared blocks (`docs/small-values.md`).

use super::*;

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
    // root's record block (the root keeps its records in blocks).
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
    // (The table's records: up to 2,000 slots, in pieces.)
    let t = s.ns().get(s.ns().resolve("/t").unwrap()).unwrap();
    let records = t.slots.pieces().len() as u64;
    let layout = nodekernel_proto::record::Layout::new(1 << 20, true);
    assert_eq!(records as usize, layout.extents_for(t.slots.len()));
    assert_eq!(pieces, live.len() as u64 + records);
    eprintln!("peak blocks used per 100,000 operations: {peaks:?}");
    let first = peaks[0];
    assert!(
        peaks.iter().all(|p| *p <= first + 1),
        "used space grew with churn: {peaks:?}"
    );
    // Deleting everything gives every block back but the records'
    // (whose pieces are all that is left in slabs).
    for key in live.keys() {
        remove(&mut s, &format!("/t/k{key}"), false).unwrap();
    }
    let left: u64 = s.slabs().iter().map(|(_, sl)| sl.used() as u64).sum();
    assert_eq!(left, records);
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
