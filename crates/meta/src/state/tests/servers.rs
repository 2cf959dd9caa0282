//! Storage servers: registration, liveness, retirement, signed requests.

use super::*;

#[test]
fn before_any_storage_server_registers_the_error_says_so() {
    let mut s = MetaState::new(BS, 1000, 1);
    let e = create(&mut s, "/d", Directory, 0).unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable);
    assert!(
        e.message.contains("no storage server has registered"),
        "{e}"
    );
    let MetaReply::Status(st) = s.apply(MetaRequest::Status, 0).unwrap() else {
        panic!()
    };
    assert!(!st.is_ready());
    s.apply(MetaRequest::Register(spec("h:0", 0, 4)), 0)
        .unwrap();
    let MetaReply::Status(st) = s.apply(MetaRequest::Status, 0).unwrap() else {
        panic!()
    };
    assert!(st.is_ready());
    create(&mut s, "/d", Directory, 0).unwrap();
}

#[test]
fn dead_servers_report_data_lost_and_retired_ones_leave_capacity() {
    let mut s = state();
    let f = create(&mut s, "/f", File, 0).unwrap();
    let (_, b) = map(&mut s, f.id, 0, 1, f.lease).unwrap();
    close(&mut s, &f, 10).unwrap();
    let other = if b[0].server == 1 { 2 } else { 1 };
    only_alive(&mut s, other, 5000);
    assert_eq!(
        map(&mut s, f.id, 0, 1, 0).unwrap_err().code,
        ErrorCode::DataLost
    );
    assert!(lookup(&mut s, "/f").unwrap().first_block.is_none());
    let g = create(&mut s, "/g", File, 0).unwrap();
    let (_, b2) = map(&mut s, g.id, 0, 1, g.lease).unwrap();
    assert_eq!(b2[0].server, other, "dead server gets no new blocks");
    // Retired after a while: it leaves status, its data is lost for good.
    assert!(s.decide_retire(5500, 10_000).is_none());
    let d = s.decide_retire(11_000, 10_000).unwrap();
    s.commit(d, 11_000);
    let MetaReply::Status(st) = s.apply(MetaRequest::Status, 11_000).unwrap() else {
        panic!()
    };
    assert_eq!(st.servers.len(), 1);
    assert_eq!(
        map(&mut s, f.id, 0, 1, 0).unwrap_err().code,
        ErrorCode::DataLost
    );
    // Deleting a node on a retired server is fine and claims nothing there.
    s.take_claims();
    remove(&mut s, "/f", false).unwrap();
    assert!(s.take_claims().iter().all(|c| c.server == other));
    s.check_invariants().unwrap();
}

#[test]
fn registration_is_idempotent_and_a_restarted_server_replaces_its_old_self() {
    let mut s = state();
    let reg =
        |s: &mut MetaState, sp: ServerSpec| match s.apply(MetaRequest::Register(sp), 0).unwrap() {
            MetaReply::Registered { server } => server,
            r => panic!("{r:?}"),
        };
    let sp = spec("h:0", 0, 4);
    assert_eq!(
        reg(&mut s, sp.clone()),
        1,
        "a retried registration gets the same id"
    );
    let f = create(&mut s, "/f", File, 0).unwrap();
    let (_, b) = map(&mut s, f.id, 0, 1, f.lease).unwrap();
    assert_eq!(b[0].server, 1);
    close(&mut s, &f, 10).unwrap();
    let mut restarted = sp.clone();
    restarted.incarnation = 2;
    let new = reg(&mut s, restarted);
    assert_ne!(new, 1);
    assert_eq!(
        map(&mut s, f.id, 0, 1, 0).unwrap_err().code,
        ErrorCode::DataLost,
        "the old instance's blocks are gone with it"
    );
    // The new instance's blocks are all free: nothing is handed out twice.
    let g = create(&mut s, "/g", File, 0).unwrap();
    let (_, b) = map(&mut s, g.id, 0, 4, g.lease).unwrap();
    assert!(b.iter().all(|x| x.server == new));
    s.check_invariants().unwrap();
}

#[test]
fn a_huge_registration_costs_nothing_up_front() {
    let mut s = MetaState::new(BS, 1000, 1);
    let sp = spec("h:0", 0, crate::alloc::MAX_SERVER_BLOCKS);
    s.apply(MetaRequest::Register(sp), 0).unwrap();
    let mut too_big = spec("h:1", 0, u32::MAX);
    too_big.identity = "other".into();
    assert_eq!(
        s.apply(MetaRequest::Register(too_big), 0).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    let f = create(&mut s, "/f", File, 0).unwrap();
    assert_eq!(map(&mut s, f.id, 0, 8, f.lease).unwrap().1.len(), 8);
}

/// A heartbeat or resize counts only when signed with the key its server
/// registered, and only once: an unsigned, forged or replayed one is
/// refused and changes nothing.
#[test]
fn heartbeats_and_resizes_count_only_signed_by_their_server_and_once() {
    let mut s = state();
    let beat = |seq: u64, key: [u8; 32]| {
        let mut b = MetaRequest::Heartbeat {
            server: 1,
            traffic: Default::default(),
            signed: Default::default(),
        };
        b.sign(&key, seq);
        b
    };
    expire(&mut s, 10_000, 1000);
    assert!(!s.alloc().is_alive(1));
    let unsigned = MetaRequest::Heartbeat {
        server: 1,
        traffic: Default::default(),
        signed: Default::default(),
    };
    for (what, req) in [("unsigned", unsigned), ("forged", beat(5, [8; 32]))] {
        let e = s.apply(req, 10_000).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{what}: {e}");
        assert!(!s.alloc().is_alive(1), "{what} revived the server");
    }
    s.apply(beat(5, [7; 32]), 10_000).unwrap();
    assert!(s.alloc().is_alive(1));
    for seq in [5, 4] {
        let e = s.apply(beat(seq, [7; 32]), 10_000).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
        assert!(e.message.contains("replay"), "{e}");
    }
    s.apply(beat(6, [7; 32]), 10_000).unwrap();

    // A resize: forged ones leave the server's size alone.
    let id = s.alloc().server(1).unwrap().spec.identity.clone();
    let resize = |seq: u64, key: [u8; 32]| {
        let mut r = MetaRequest::Resize {
            server: id.clone(),
            blocks: 0,
            signed: Default::default(),
        };
        r.sign(&key, seq);
        r
    };
    let capacity = |s: &MetaState| s.alloc().server(1).unwrap().free.len();
    let before = capacity(&s);
    for req in [resize(7, [8; 32]), resize(6, [7; 32])] {
        let e = s.apply(req, 10_000).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
        assert_eq!(capacity(&s), before);
    }
    s.apply(resize(7, [7; 32]), 10_000).unwrap();
    assert!(capacity(&s) < before, "the server's own resize is taken");
    // Registering a new key starts its numbers anew.
    let rekeyed = ServerSpec {
        cap_key: [9; 32],
        ..spec("h:0", 0, 4)
    };
    s.apply(MetaRequest::Register(rekeyed), 10_000).unwrap();
    s.apply(beat(1, [9; 32]), 10_000).unwrap();
    assert_eq!(
        s.apply(beat(2, [7; 32]), 10_000).unwrap_err().code,
        ErrorCode::Unauthenticated,
        "the old key no longer signs"
    );
    s.check_invariants().unwrap();
}
