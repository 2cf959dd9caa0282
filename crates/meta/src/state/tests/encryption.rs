//! Encrypted classes (`docs/encryption.md`).

use super::*;

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
    encrypt_class_1(&mut s);
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

/// Where only an encrypted class has room, a container's first records
/// get a block (pieces of plain slabs never go to an encrypted class, and
/// record blocks may): it then keeps its records in blocks, and listing
/// says so.
#[test]
fn containers_keep_records_in_blocks_where_only_encrypted_classes_have_room() {
    let mut s = state_of(BS, 0, 8);
    s.set_classes(vec![ClassInfo {
        class: 1,
        name: "c1".into(),
        price_per_gib: 0.0,
        encrypt: true,
    }]);
    let d = create(&mut s, "/d", Directory, 0).unwrap();
    for i in 0..3 {
        let r = create(&mut s, &format!("/d/f{i}"), File, 0)
            .unwrap()
            .record
            .unwrap();
        assert_eq!(
            (r.slot, r.block.offset, r.offset),
            (i, 0, i * SLOT_SIZE as u32)
        );
    }
    let n = s.ns().get(d.id).unwrap();
    assert!(n.slots.pieces().is_empty() && n.blocks.len() == 1);
    let MetaReply::Listing { pieces, slots, .. } = s
        .apply(MetaRequest::Enumerate { path: "/d".into() }, 0)
        .unwrap()
    else {
        panic!()
    };
    assert_eq!((pieces, slots), (false, 3));
    s.check_invariants().unwrap();
}
