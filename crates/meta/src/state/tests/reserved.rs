//! Puts in one exchange (`docs/small-values.md`, *Puts in one exchange*):
//! puts reserved ahead of their paths, each with its piece and lease,
//! closed and linked at a path by one `Link`.

use super::*;

fn reserve(s: &mut MetaState, size: u64, count: u32, now: u64) -> Result<Vec<NodeInfo>> {
    let req = MetaRequest::Reserve {
        size_hint: size,
        count,
        storage_class: NO_CLASS,
        location: String::new(),
    };
    match s.apply(req, now)? {
        MetaReply::Reserved { lease_ms, puts } => {
            assert_eq!(lease_ms, s.lease_ms, "how long an unused one lasts");
            Ok(puts)
        }
        r => panic!("unexpected {r:?}"),
    }
}

fn link(s: &mut MetaState, n: &NodeInfo, size: u64, path: &str) -> Result<Option<RecordLoc>> {
    let req = MetaRequest::Link {
        node: n.id,
        lease: n.lease,
        size,
        mtime: 7,
        path: path.into(),
    };
    match s.apply(req, 0)? {
        MetaReply::Record(r) => Ok(r),
        r => panic!("unexpected {r:?}"),
    }
}

/// Sixteen reservations in one request take sixteen different pieces of
/// the slabs there are (never one twice), each tagged with its own node;
/// linking one at a new key makes it the value there, with a record
/// slot; linking another at the same key replaces it and frees its
/// piece; none of it is visible before its link.
#[test]
fn reserved_puts_take_distinct_pieces_and_link_as_puts() {
    let mut s = state();
    table(&mut s, "/t", true);
    // A slab already partly used, so the reservations fill it first.
    put_small(&mut s, "/t/a", 100).unwrap();
    let used = used_blocks(&s, 0);
    let first = reserve(&mut s, 100, 16, 0).unwrap();
    let mut all = first.clone();
    while all.len() < 40 {
        all.extend(reserve(&mut s, 100, 16, 0).unwrap());
    }
    let mut places = std::collections::BTreeSet::new();
    for r in &all {
        assert_eq!((r.ty, r.size, r.lease != 0), (KeyValue, 0, true), "{r:?}");
        let loc = r.first_block.as_ref().expect("a piece");
        assert_eq!(loc.tag, r.id, "tagged with its own node");
        assert!(
            places.insert((loc.server, loc.block, loc.offset)),
            "{loc:?} twice"
        );
    }
    // 112-byte pieces, 36 a 4 KiB slab: 41 values take two slabs.
    assert_eq!(used_blocks(&s, 0), used + 1);
    assert_eq!(
        children(&s, "/t"),
        ["a"],
        "reserved puts are not values yet"
    );

    let rec = link(&mut s, &all[0], 90, "/t/b").unwrap();
    assert!(
        rec.is_some(),
        "a new key in an enumerable table: its record"
    );
    let b = lookup(&mut s, "/t/b").unwrap();
    assert_eq!((b.id, b.size, b.mtime), (all[0].id, 90, 7));
    assert_eq!(b.first_block.unwrap().tag, all[0].id);
    assert_eq!(children(&s, "/t"), ["a", "b"]);

    assert_eq!(
        link(&mut s, &all[1], 100, "/t/b").unwrap(),
        None,
        "replaced"
    );
    assert_eq!(lookup(&mut s, "/t/b").unwrap().id, all[1].id);
    // Linked once: its lease is closed.
    let e = link(&mut s, &all[1], 100, "/t/c").unwrap_err();
    assert_eq!(e.code, ErrorCode::LeaseExpired, "{e}");
    s.check_invariants().unwrap();
}

/// A link is checked before anything changes: a value past its piece, a
/// path whose parent is not a Table, another partition's path, a node
/// that is not a reserved put, a table whose values go elsewhere: each
/// refused, the reservation left as it was (and usable).
#[test]
fn a_link_that_cannot_be_made_changes_nothing() {
    let mut s = state();
    table(&mut s, "/t", true);
    create(&mut s, "/d", Directory, 0).unwrap();
    create_with(&mut s, "/t1", Table, 1, true, 0).unwrap();
    let r = reserve(&mut s, 100, 1, 0).unwrap().remove(0);
    let before = s.dump();
    let cases = [
        (200, "/t/k", ErrorCode::OutOfRange),
        (10, "/d/k", ErrorCode::TypeMismatch),
        (10, "/nope/k", ErrorCode::NotFound),
        (10, "/t1/k", ErrorCode::InvalidArgument),
    ];
    for (size, path, code) in cases {
        let e = link(&mut s, &r, size, path).unwrap_err();
        assert_eq!(e.code, code, "{path}: {e}");
        assert_eq!(s.dump(), before, "{path}");
    }
    let e = link(&mut s, &r, 10, "/t1/k").unwrap_err();
    assert!(e.message.contains("storage class 1"), "{e}");
    // A put created the usual way is not a reservation.
    let k = create_with_hint(&mut s, "/t/x", 10).unwrap();
    let e = link(&mut s, &k, 10, "/t/y").unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
    // The reservation still links.
    link(&mut s, &r, 100, "/t/k").unwrap();
    assert_eq!(lookup(&mut s, "/t/k").unwrap().size, 100);
}

/// Reservations its client never uses go when their leases lapse, pieces
/// and all; a restart forgets them (their writers are gone), and a
/// replay of the log rebuilds what linked ones made.
#[test]
fn unused_reservations_lapse_and_the_log_rebuilds_linked_ones() {
    let mut s = MetaState::new(BS, 1000, 1);
    let mut log = Vec::new();
    logged(&mut s, &mut log, MetaRequest::Register(spec("h:0", 0, 16))).unwrap();
    let t = MetaRequest::Create {
        path: "/t".into(),
        ty: Table,
        storage_class: NO_CLASS,
        location: String::new(),
        enumerable: true,
        size_hint: 0,
        pinned: false,
        mode: 0o755,
        mtime: 0,
        open_existing: false,
        ttl_ms: 0,
        child_ttl_ms: 0,
        session: None,
    };
    logged(&mut s, &mut log, t).unwrap();
    let used = used_blocks(&s, 0);
    let req = MetaRequest::Reserve {
        size_hint: 50,
        count: 3,
        storage_class: NO_CLASS,
        location: String::new(),
    };
    // The first starts a slab, which the next request fills.
    let mut r = Vec::new();
    while r.len() < 3 {
        let MetaReply::Reserved { puts: more, .. } = logged(&mut s, &mut log, req.clone()).unwrap()
        else {
            panic!()
        };
        r.extend(more);
    }
    assert_eq!(r.len(), 4, "the second request took all three");
    let linked = MetaRequest::Link {
        node: r[0].id,
        lease: r[0].lease,
        size: 50,
        mtime: 1,
        path: "/t/k".into(),
    };
    logged(&mut s, &mut log, linked).unwrap();
    let status = |s: &mut MetaState| match s.apply(MetaRequest::Status, 0).unwrap() {
        MetaReply::Status(st) => {
            assert_eq!(st.puts_in_progress, 0, "a reserved put is not in progress");
            st.reserved_puts
        }
        r => panic!("{r:?}"),
    };
    assert_eq!(status(&mut s), 3, "three reservations wait");

    let mut r2 = restart(&mut s, &log);
    assert_eq!(lookup(&mut r2, "/t/k").unwrap().size, 50);
    assert_eq!(status(&mut r2), 0, "a restart forgets the reservations");

    let d = s
        .decide_sweep(1 << 30, 100)
        .expect("three lapsed reservations");
    s.commit(d, 1 << 30);
    assert_eq!(status(&mut s), 0);
    assert_eq!(
        used_blocks(&s, 0),
        used + 2,
        "the slabs of the one value and of its table's record piece stay"
    );
    assert_eq!(lookup(&mut s, "/t/k").unwrap().size, 50);
    s.check_invariants().unwrap();
}

/// The sizes a reservation takes: what fits a piece, of a class that is
/// not encrypted.
#[test]
fn only_small_plain_values_are_reserved() {
    let mut s = state();
    let e = reserve(&mut s, BS as u64, 1, 0).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
    let e = reserve(&mut s, 0, 1, 0).unwrap_err();
    assert_eq!(
        e.code,
        ErrorCode::InvalidArgument,
        "an empty value takes no piece: {e}"
    );
    assert_eq!(reserve(&mut s, 1, 0, 0).unwrap(), Vec::new());
    encrypt_class_1(&mut s);
    let e = reserve(&mut s, 10, 1, 0).unwrap_err();
    assert!(e.message.contains("encrypted"), "{e}");
}
