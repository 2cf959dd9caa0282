//! Block locations and the capabilities they carry.

use super::*;

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
    let rec = SLOT_SIZE as u32;
    // The first record is in a piece (its location starts past the
    // piece's tag), the next ones in a block: offsets the storage server
    // sees are the location's plus the record's.
    assert!(r.block.offset > 0 && r.block.tag == 0);
    let at = r.block.offset + r.offset;
    assert!(allows(&r.block, at, rec, Rights::WRITE, 1_000));
    assert!(!allows(&r.block, at + rec, rec, Rights::WRITE, 1_000));
    assert!(!allows(
        &r.block,
        at - TAG_LEN,
        TAG_LEN,
        Rights::WRITE,
        1_000
    ));
    assert!(!allows(&r.block, 0, BS, Rights::WRITE, 1_000));
    // The piece holds 19 slots: the 20th record is the block's first.
    for i in 0..19 {
        create(&mut s, &format!("/d/c{i}"), Directory, 0).unwrap();
    }
    let r = create(&mut s, "/d/next", Directory, 0)
        .unwrap()
        .record
        .unwrap();
    assert_eq!((r.block.offset, r.offset), (0, rec));
    assert!(allows(&r.block, r.offset, rec, Rights::WRITE, 1_000));
    assert!(!allows(&r.block, 0, rec, Rights::WRITE, 1_000));

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
