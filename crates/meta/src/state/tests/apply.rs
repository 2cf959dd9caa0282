//! Decisions change nothing until applied; effects replay (and
//! checkpoints restore) to the same state.

use super::*;

#[test]
fn decisions_change_nothing_and_effects_replay_to_the_same_state() {
    let mut s = state();
    create(&mut s, "/t", Table, 0).unwrap();
    let before = s.dump();
    let req = MetaRequest::Create {
        path: "/t/k".into(),
        ty: KeyValue,
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
    };
    let d = s.decide(&req, 5).unwrap();
    assert!(!d.effects.is_empty());
    assert_eq!(s.dump(), before, "deciding changed nothing");
    let again = s.decide(&req, 5).unwrap();
    assert_eq!(
        d, again,
        "the same state and request decide the same effects"
    );
    // A failing request decides nothing and changes nothing.
    assert!(s
        .decide(
            &MetaRequest::Lookup {
                path: "/nope".into()
            },
            0
        )
        .is_err());
    let bad = MetaRequest::Create {
        path: "/t/dir".into(),
        ty: Directory,
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
    };
    assert_eq!(s.apply(bad, 0).unwrap_err().code, ErrorCode::TypeMismatch);
    assert_eq!(s.dump(), before);
}

#[test]
fn a_checkpointed_node_from_before_modes_gets_the_default_ones() {
    let mut s = state();
    create(&mut s, "/d", Directory, 0).unwrap();
    file(&mut s, "/f", 1);
    let image = s.checkpoint_image();
    // Records as format 3 wrote them: without the trailing mode and time.
    // (The root's, ending with the record pieces that came later still,
    // stays as it is.)
    let old: Vec<(u64, Vec<u8>)> = image
        .node_records()
        .map(|(id, r)| match s.ns().get(id).unwrap().slots.pieces() {
            [] => (id, r[..r.len() - 10].to_vec()),
            _ => (id, r.to_vec()),
        })
        .collect();
    let back = MetaState::from_checkpoint(1000, &image.state, old.into_iter().map(Ok), 0).unwrap();
    let d = back.ns().resolve("/d").unwrap();
    let f = back.ns().resolve("/f").unwrap();
    assert_eq!(
        back.ns().get(d).map(|n| (n.mode, n.mtime)),
        Some((0o755, 0))
    );
    assert_eq!(
        back.ns().get(f).map(|n| (n.mode, n.mtime)),
        Some((0o644, 0))
    );
    back.check_invariants().unwrap();
}
