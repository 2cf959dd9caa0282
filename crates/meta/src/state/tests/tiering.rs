//! Tier migration and dynamic capacity (`docs/tiering.md`).

use super::*;

/// Carries out every migration the state wants now (copies succeed), as
/// the migrator would; returns the moves.
fn migrate_all(s: &mut MetaState, now: u64) -> Vec<crate::state::Migration> {
    let mut done = Vec::new();
    loop {
        let found = s.migration_candidates(now, 64);
        if found.is_empty() {
            return done;
        }
        for m in found {
            if !s.migration_still_wanted(&m) {
                continue;
            }
            let (d, _, dst) = s.decide_move_start_to(m.node, m.index, m.to, true).unwrap();
            assert_eq!(dst.class, m.to, "{m:?}: into exactly its class");
            s.commit(d, now);
            let d = s.decide_move_end(m.node, m.index, true).unwrap();
            s.commit(d, now);
            s.note_migration(&m, now);
            s.check_invariants().unwrap();
            done.push(m);
        }
    }
}

fn classes_of(s: &mut MetaState, path: &str) -> Vec<u8> {
    let n = lookup(s, path).unwrap();
    let (_, b) = map(s, n.id, 0, (n.size / BS as u64) as u32, 0).unwrap();
    b.iter().map(|l| l.class).collect()
}

/// The state's side of migration: a class past its high watermark sheds
/// its coldest unpinned blocks into the next class down to its low one,
/// touched nodes count as hot, moves are counted per class in status, and
/// a hot node on the file class comes back up once there is room.
#[test]
fn migration_moves_the_coldest_unpinned_blocks_and_promotes_hot_ones() {
    let mut s = state_of(BS, 10, 40);
    let mut t = crate::tier::TierSettings::default();
    t.apply(&[
        ("high_watermark", "70"),
        ("low_watermark", "40"),
        ("half_life_ms", "1000000"),
    ])
    .unwrap();
    s.set_tier_settings(t);
    // At the root, whose child records are on the file class: only data
    // fills DRAM. /pinned first: the coldest of all, but pinned.
    let p = match s
        .apply(
            MetaRequest::Create {
                path: "/pinned".into(),
                ty: File,
                storage_class: NO_CLASS,
                location: String::new(),
                enumerable: true,
                size_hint: 0,
                pinned: true,
                mode: 0o644,
                mtime: 0,
                open_existing: false,
                ttl_ms: 0,
                child_ttl_ms: 0,
                session: None,
            },
            1,
        )
        .unwrap()
    {
        MetaReply::Node(n) => n,
        r => panic!("{r:?}"),
    };
    map(&mut s, p.id, 0, 2, p.lease).unwrap();
    close(&mut s, &p, 2 * BS as u64).unwrap();
    for (i, now) in [(0, 10), (1, 20), (2, 30)] {
        let f = create(&mut s, &format!("/f{i}"), File, now).unwrap();
        map(&mut s, f.id, 0, 2, f.lease).unwrap();
        close(&mut s, &f, 2 * BS as u64).unwrap();
    }
    // 8 of 10 DRAM blocks: nothing below the high watermark moves.
    assert_eq!(used_blocks(&s, 0), 8);
    assert_eq!(s.heat(p.id).last_ms, 0, "no heat at create, mapped at 0");
    // Touch f0 at a later time, several times: now the hottest.
    for now in [100, 101, 102] {
        lookup_at(&mut s, "/f0", now);
    }
    let moved = migrate_all(&mut s, 200);
    // 80 % > 70 %: shed to 40 % (4 blocks): f1 then f2 (the coldest
    // unpinned), never /d/pinned, f0 stays.
    let nodes: Vec<u64> = moved.iter().map(|m| m.node).collect();
    let id = |s: &mut MetaState, p: &str| lookup(s, p).unwrap().id;
    let (f1, f2) = (id(&mut s, "/f1"), id(&mut s, "/f2"));
    assert_eq!(nodes, vec![f1, f1, f2, f2], "{moved:?}");
    assert!(moved.iter().all(|m| (m.from, m.to) == (0, 1)));
    assert_eq!(used_blocks(&s, 0), 4);
    assert_eq!(classes_of(&mut s, "/pinned"), vec![0, 0]);
    assert_eq!(classes_of(&mut s, "/f0"), vec![0, 0]);
    assert_eq!(classes_of(&mut s, "/f1"), vec![1, 1]);
    let st = match s.apply(MetaRequest::Status, 300).unwrap() {
        MetaReply::Status(st) => st,
        r => panic!("{r:?}"),
    };
    assert_eq!(
        st.moves,
        vec![nodekernel_proto::ClassMoves {
            class: 0,
            demoted: 4,
            promoted: 0
        }]
    );
    // Promotion: f2 is read often (a half-life after its move), but one
    // more 2-block node would take DRAM past its low watermark (6 > 4):
    // it stays until room is made.
    s.set_tier_settings({
        let mut t = s.tier_settings().clone();
        t.apply(&[("promotion", "on"), ("promote_after", "3")])
            .unwrap();
        t
    });
    for now in 2_000_000..2_000_010 {
        lookup_at(&mut s, "/f2", now);
    }
    assert!(
        migrate_all(&mut s, 2_000_010).is_empty(),
        "no room at the low watermark"
    );
    remove(&mut s, "/f0", false).unwrap();
    let up = migrate_all(&mut s, 2_000_010);
    assert_eq!(up.len(), 2, "{up:?}");
    assert!(up.iter().all(|m| m.node == f2 && m.is_promotion()));
    assert_eq!(classes_of(&mut s, "/f2"), vec![0, 0]);
    assert!(
        migrate_all(&mut s, 2_000_020).is_empty(),
        "nothing moves back and forth"
    );
}

fn lookup_at(s: &mut MetaState, path: &str, now: u64) {
    s.apply(MetaRequest::Lookup { path: path.into() }, now)
        .unwrap();
}

/// Dynamic capacity in the state: free blocks leave a shrinking server at
/// once (the balloon), blocks in use leave by moves, a shrinking server
/// gets no new blocks, growing gives blocks back, and the balloon survives
/// a checkpoint.
#[test]
fn a_server_shrinks_by_ballooning_free_blocks_and_moving_used_ones() {
    let mut s = state_of(BS, 10, 40);
    let f = file(&mut s, "/f", 3);
    let dram = "h:0";
    let r = resize(&mut s, dram, 4).unwrap();
    assert_eq!(
        (
            r.max_blocks,
            r.exported_blocks,
            r.target_blocks,
            r.used_blocks
        ),
        (10, 4, 4, 3)
    );
    s.check_invariants().unwrap();
    let st = match s.apply(MetaRequest::Status, 0).unwrap() {
        MetaReply::Status(st) => st,
        r => panic!("{r:?}"),
    };
    let d = st.servers.iter().find(|x| x.addr == dram).unwrap();
    assert_eq!(
        (d.capacity_blocks, d.used_blocks),
        (4, 3),
        "status shows the new capacity"
    );
    // Below what is in use: one free block goes, then blocks must move.
    let r = resize(&mut s, dram, 2).unwrap();
    assert_eq!((r.exported_blocks, r.target_blocks), (3, 2));
    let g = create(&mut s, "/g", File, 0).unwrap();
    let (_, b) = map(&mut s, g.id, 0, 1, g.lease).unwrap();
    assert_eq!(b[0].class, 1, "a shrinking server gets no new blocks");
    let found = s.drain_candidates(10);
    assert_eq!(
        found.len(),
        3,
        "its blocks are candidates to move: {found:?}"
    );
    let (node, index, class, _) = found[0];
    let (d, _, _) = s.decide_move_start(node, index, class).unwrap();
    s.commit(d, 0);
    let d = s.decide_move_end(node, index, true).unwrap();
    s.commit(d, 0);
    assert_eq!(s.shrinking(), vec![(1, 2)]);
    let d = s.decide_resize(1, 2).unwrap();
    s.commit(d, 0);
    assert!(
        s.shrinking().is_empty(),
        "the freed block joined the balloon"
    );
    let r = resize(&mut s, dram, 2).unwrap();
    assert_eq!((r.exported_blocks, r.used_blocks), (2, 2));
    assert!(
        s.drain_candidates(10).is_empty(),
        "done: nothing more moves"
    );
    s.check_invariants().unwrap();
    // The balloon is durable: a checkpoint keeps it.
    let back = through_checkpoint(&s);
    assert_eq!(back.dump(), s.dump());
    back.check_invariants().unwrap();
    assert_eq!(back.resize_status(1).exported_blocks, 2);
    // Growing gives the ballooned blocks back; too much is refused.
    assert_eq!(
        resize(&mut s, dram, 11).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    let r = resize(&mut s, dram, 10).unwrap();
    assert_eq!((r.exported_blocks, r.used_blocks), (10, 2));
    s.check_invariants().unwrap();
    let h = create(&mut s, "/h", File, 0).unwrap();
    let (_, b) = map(&mut s, h.id, 0, 1, h.lease).unwrap();
    assert_eq!(b[0].class, 0, "a grown server takes new blocks again");
    assert_eq!(s.ns().get(f.id).unwrap().blocks.len(), 3);
}
