//! Drains.

use super::*;

fn drain(s: &mut MetaState, server: &str, cancel: bool) -> Result<DrainStatus> {
    match s.apply(
        MetaRequest::Drain {
            server: server.into(),
            cancel,
        },
        0,
    )? {
        MetaReply::Drain(d) => Ok(d),
        r => panic!("unexpected {r:?}"),
    }
}

/// Runs every move the drains ask for (copies succeed).
fn run_drains(s: &mut MetaState) -> u64 {
    let mut moved = 0;
    loop {
        let batch = s.drain_candidates(3);
        if batch.is_empty() {
            return moved;
        }
        for (node, index, class, server) in batch {
            let (d, src, dst) = s.decide_move_start(node, index, class).unwrap();
            assert_eq!(src.server, server);
            assert_ne!(dst.server, server, "never back onto the drained server");
            s.commit(d, 0);
            let d = s.decide_move_end(node, index, true).unwrap();
            s.commit(d, 0);
            s.note_drain_move(server, Ok(()));
            s.check_invariants().unwrap();
            moved += 1;
        }
    }
}

#[test]
fn a_drained_server_gets_no_new_blocks_and_ends_empty() {
    // Two DRAM servers and a file server.
    let mut s = state();
    s.apply(MetaRequest::Register(spec("h:2", 0, 6)), 0)
        .unwrap();
    // A directory whose child records and a file whose data are on DRAM.
    create_with(&mut s, "/d", Directory, 0, true, 0).unwrap();
    let f = create_with(&mut s, "/d/f", File, 0, true, 0).unwrap();
    let (_, blocks) = map(&mut s, f.id, 0, 4, f.lease).unwrap();
    close(&mut s, &f, 4 * BS as u64).unwrap();
    let on_first = blocks.iter().filter(|b| b.addr == "h:0").count() as u64;
    assert!(on_first > 0, "{blocks:?}");
    let d = drain(&mut s, "id-h-0", false).unwrap();
    assert_eq!((d.addr.as_str(), d.state), ("h:0", DrainState::Draining));
    assert!(d.used_blocks >= on_first);
    let st = match s.apply(MetaRequest::Status, 0).unwrap() {
        MetaReply::Status(st) => st,
        r => panic!("{r:?}"),
    };
    assert!(st.servers.iter().any(|x| x.addr == "h:0" && x.draining));
    // New data never lands on it.
    let g = create_with(&mut s, "/g", File, 0, true, 0).unwrap();
    let (_, b) = map(&mut s, g.id, 0, 3, g.lease).unwrap();
    assert!(b.iter().all(|b| b.addr != "h:0"), "{b:?}");
    close(&mut s, &g, 3 * BS as u64).unwrap();
    // A block found by a scan and moved since no longer needs moving.
    let found = s.drain_candidates(2);
    let (node, index, class, server) = found[0];
    assert!(s.drain_still_needs(node, index, server));
    let (d, _, _) = s.decide_move_start(node, index, class).unwrap();
    s.commit(d, 0);
    assert!(!s.drain_still_needs(node, index, server), "being moved");
    let d = s.decide_move_end(node, index, true).unwrap();
    s.commit(d, 0);
    s.note_drain_move(server, Ok(()));
    assert!(!s.drain_still_needs(node, index, server), "moved");
    let (n1, i1, _, s1) = found[1];
    assert!(s.drain_still_needs(n1, i1, s1));
    // Every block it holds is a candidate, data and child records alike.
    let moved = 1 + run_drains(&mut s);
    assert!(moved >= on_first, "moved {moved}");
    let d = drain(&mut s, "h:0", false).unwrap();
    assert_eq!(
        (d.state, d.used_blocks, d.moved_blocks),
        (DrainState::Done, 0, moved)
    );
    let (_, now) = map(&mut s, f.id, 0, 4, 0).unwrap();
    assert!(now.iter().all(|b| b.addr != "h:0"), "{now:?}");
    // Cancelled: placement may use it again.
    let d = drain(&mut s, "h:0", true).unwrap();
    assert_eq!(d.state, DrainState::Cancelled);
    let mut used_again = false;
    for i in 0..6 {
        let n = create_with(&mut s, &format!("/n{i}"), File, 0, true, 0).unwrap();
        let (_, b) = map(&mut s, n.id, 0, 1, n.lease).unwrap();
        used_again |= b[0].addr == "h:0";
    }
    assert!(used_again, "a cancelled drain gives the server back");
    // Unknown and dead servers.
    assert_eq!(
        drain(&mut s, "nobody", false).unwrap_err().code,
        ErrorCode::UnknownServer
    );
    expire(&mut s, 1_000_000, 1);
    assert_eq!(
        drain(&mut s, "h:2", false).unwrap_err().code,
        ErrorCode::DataLost
    );
    s.check_invariants().unwrap();
}

/// A drained server that stops leaves as soon as it is declared dead; a
/// server that still holds blocks waits for `retire_after_ms`.
#[test]
fn a_drained_server_that_stops_is_retired_at_once() {
    let mut s = state();
    s.apply(MetaRequest::Register(spec("h:2", 0, 6)), 0)
        .unwrap();
    let d = drain(&mut s, "h:2", false).unwrap();
    assert_eq!(d.state, DrainState::Done, "it held nothing");
    // Both silent: the drained one and the file server (which holds the
    // root's records) are declared dead.
    expire(&mut s, 5_000, 1_000);
    let d = s.decide_retire(5_000, 60_000).unwrap();
    let retired: Vec<u32> = d
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::ServerRetired { id } => Some(*id),
            _ => None,
        })
        .collect();
    let drained = s.alloc().find_server("h:2").unwrap();
    assert_eq!(retired, vec![drained]);
    s.commit(d, 5_000);
    let st = match s.apply(MetaRequest::Status, 5_000).unwrap() {
        MetaReply::Status(st) => st,
        r => panic!("{r:?}"),
    };
    assert!(st.servers.iter().all(|x| x.addr != "h:2"), "it left status");
    assert_eq!(st.servers.len(), 2, "the others wait for retire_after_ms");
}

/// Draining a server moves its slabs too, until it holds nothing.
#[test]
fn a_drain_moves_slabs() {
    let mut s = state_of(4096, 4, 8);
    s.apply(MetaRequest::Register(spec("h:9", 0, 4)), 0)
        .unwrap();
    table(&mut s, "/t", false);
    for i in 0..30 {
        put_small(&mut s, &format!("/t/k{i}"), 100 + i).unwrap();
    }
    let d = drain(&mut s, "h:0", false).unwrap();
    assert!(d.used_blocks > 0);
    assert!(s.drain_candidates(100).iter().any(|c| c.0 == SLAB_MOVE));
    run_drains(&mut s);
    let d = drain(&mut s, "h:0", false).unwrap();
    assert_eq!((d.state, d.used_blocks), (DrainState::Done, 0), "{d:?}");
    for i in 0..30 {
        let k = lookup(&mut s, &format!("/t/k{i}")).unwrap();
        assert_ne!(k.first_block.unwrap().addr, "h:0");
    }
}
