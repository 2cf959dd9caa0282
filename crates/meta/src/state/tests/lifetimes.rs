//! Lifetimes: TTLs at create and by `SetAttrs`, child TTLs, and the expiry
//! decision. Time is the state's `now` (the tests' wall clock starts at 0).

use super::*;
use nodekernel_proto::meta::{MAX_TTL_MS, TTL_NEVER};

/// A Create of `path` with a TTL and a child TTL.
fn ttl_request(path: &str, ty: NodeType, ttl: u64, child_ttl: u64) -> MetaRequest {
    let mut req = create_request(path, ty);
    if let MetaRequest::Create {
        ttl_ms,
        child_ttl_ms,
        ..
    } = &mut req
    {
        (*ttl_ms, *child_ttl_ms) = (ttl, child_ttl);
    }
    req
}

fn create_ttl(
    s: &mut MetaState,
    path: &str,
    ty: NodeType,
    ttl_ms: u64,
    child_ttl_ms: u64,
    now: u64,
) -> Result<NodeInfo> {
    match s.apply(ttl_request(path, ty, ttl_ms, child_ttl_ms), now)? {
        MetaReply::Node(n) => Ok(n),
        r => panic!("unexpected {r:?}"),
    }
}

fn set_ttl(
    s: &mut MetaState,
    path: &str,
    ttl_ms: Option<u64>,
    child_ttl_ms: Option<u64>,
    now: u64,
) -> Result<NodeInfo> {
    let req = MetaRequest::SetAttrs {
        path: path.into(),
        mode: None,
        mtime: None,
        ttl_ms,
        child_ttl_ms,
    };
    match s.apply(req, now)? {
        MetaReply::Node(n) => Ok(n),
        r => panic!("unexpected {r:?}"),
    }
}

/// What the shell does before each request: expire what is due at `now`.
/// Returns how many nodes expired.
fn tick(s: &mut MetaState, now: u64) -> u64 {
    let mut n = 0;
    while let Some(d) = s.decide_expiry(now) {
        n += d.notes().expired();
        s.commit(d, now);
    }
    s.check_invariants().unwrap();
    n
}

/// Reaps every removed subtree.
fn reap_all(s: &mut MetaState) {
    while let Some(d) = s.decide_reap() {
        s.commit(d, 0);
    }
}

fn gone(s: &mut MetaState, path: &str) -> bool {
    lookup(s, path).is_err_and(|e| e.code == ErrorCode::NotFound)
}

#[test]
fn a_node_expires_when_its_time_comes_and_not_before() {
    let mut s = state();
    let f = create_ttl(&mut s, "/setup/f", File, 5_000, 0, 1_000).unwrap();
    assert_eq!(f.expires_ms, 6_000);
    close(&mut s, &f, 0).unwrap();
    assert_eq!(lookup(&mut s, "/setup/f").unwrap().expires_ms, 6_000);
    assert!(!s.expiry_due(5_999));
    assert!(s.decide_expiry(5_999).is_none());
    assert_eq!(tick(&mut s, 5_999), 0);
    assert!(!gone(&mut s, "/setup/f"));
    assert_eq!(tick(&mut s, 6_000), 1);
    assert!(gone(&mut s, "/setup/f"));
    assert_eq!(s.ns().lifetimes().expiring(), 0);
    // Its name is free again, and the new node has no TTL.
    let again = create(&mut s, "/setup/f", File, 7_000).unwrap();
    assert_eq!(again.expires_ms, 0);
}

#[test]
fn a_subtree_expires_as_a_whole_and_gives_its_blocks_back() {
    let mut s = state();
    let before = used_blocks(&s, 0) + used_blocks(&s, 1);
    create_ttl(&mut s, "/job", Directory, 10_000, 0, 0).unwrap();
    create(&mut s, "/job/d", Directory, 0).unwrap();
    let f = file(&mut s, "/job/d/data", 2);
    // A child that lives longer than its parent goes with it.
    create_ttl(&mut s, "/job/long", File, 100_000, 0, 0).unwrap();
    let (_, held) = map(&mut s, f.id, 0, 2, 0).unwrap();
    assert!(used_blocks(&s, 0) + used_blocks(&s, 1) > before);
    assert_eq!(tick(&mut s, 10_000), 1, "one subtree, removed at once");
    for p in ["/job", "/job/d", "/job/d/data", "/job/long"] {
        assert!(gone(&mut s, p), "{p} is gone");
    }
    reap_all(&mut s);
    // The blocks are fenced as they come back: old handles get Stale.
    let claims = s.take_claims();
    for b in &held {
        assert!(
            claims
                .iter()
                .any(|c| c.block == b.block && c.server == b.server && c.gen > b.gen),
            "block {b:?} is claimed with a newer generation: {claims:?}"
        );
        assert!(is_free(&s, b));
    }
    assert_eq!(used_blocks(&s, 0) + used_blocks(&s, 1), before);
    assert_eq!(s.ns().lifetimes().expiring(), 0, "nothing left behind");
    s.check_invariants().unwrap();
}

#[test]
fn children_inherit_a_containers_child_ttl_unless_they_name_their_own() {
    let mut s = state();
    let t = create_ttl(&mut s, "/t", Table, 0, 60_000, 0).unwrap();
    assert_eq!((t.expires_ms, t.child_ttl_ms), (0, 60_000));
    let k = create(&mut s, "/t/k", KeyValue, 1_000).unwrap();
    close(&mut s, &k, 0).unwrap();
    assert_eq!(lookup(&mut s, "/t/k").unwrap().expires_ms, 61_000);
    let own = create_ttl(&mut s, "/t/own", KeyValue, 5_000, 0, 1_000).unwrap();
    close(&mut s, &own, 0).unwrap();
    assert_eq!(lookup(&mut s, "/t/own").unwrap().expires_ms, 6_000);
    let never = create_ttl(&mut s, "/t/never", KeyValue, TTL_NEVER, 0, 1_000).unwrap();
    close(&mut s, &never, 0).unwrap();
    assert_eq!(lookup(&mut s, "/t/never").unwrap().expires_ms, 0);
    // A replacing put starts its own TTL.
    let k2 = create(&mut s, "/t/k", KeyValue, 30_000).unwrap();
    close(&mut s, &k2, 0).unwrap();
    assert_eq!(lookup(&mut s, "/t/k").unwrap().expires_ms, 90_000);
    assert_eq!(
        s.ns().lifetimes().expiring(),
        2,
        "the replaced value's is gone"
    );
    assert_eq!(tick(&mut s, 6_000), 1);
    assert!(gone(&mut s, "/t/own"));
    assert_eq!(tick(&mut s, 90_000), 1);
    assert!(gone(&mut s, "/t/k"));
    assert!(!gone(&mut s, "/t/never"));
    assert!(!gone(&mut s, "/t"));
}

#[test]
fn a_child_ttl_reaches_down_through_new_containers() {
    let mut s = state();
    create_ttl(&mut s, "/scratch", Directory, 0, 10_000, 0).unwrap();
    // A new directory expires with the child TTL and passes it on.
    let job = create(&mut s, "/scratch/job", Directory, 1_000).unwrap();
    assert_eq!((job.expires_ms, job.child_ttl_ms), (11_000, 10_000));
    let kept = create_ttl(&mut s, "/scratch/kept", Directory, TTL_NEVER, 0, 1_000).unwrap();
    assert_eq!((kept.expires_ms, kept.child_ttl_ms), (0, 10_000));
    let f = create(&mut s, "/scratch/kept/f", File, 2_000).unwrap();
    assert_eq!(f.expires_ms, 12_000);
    // Its own child TTL wins; a cleared one stops it.
    let own = create_ttl(&mut s, "/scratch/own", Table, 0, 500, 1_000).unwrap();
    assert_eq!(own.child_ttl_ms, 500);
    set_ttl(&mut s, "/scratch/kept", None, Some(0), 3_000).unwrap();
    let g = create(&mut s, "/scratch/kept/g", File, 3_000).unwrap();
    assert_eq!(g.expires_ms, 0);
    // A data node under it gets no child TTL to keep.
    assert_eq!(f.child_ttl_ms, 0);
}

#[test]
fn a_ttl_is_set_changed_and_cleared_and_bad_ones_are_refused() {
    let mut s = state();
    let f = create(&mut s, "/setup/f", File, 0).unwrap();
    close(&mut s, &f, 0).unwrap();
    assert_eq!(
        set_ttl(&mut s, "/setup/f", Some(500), None, 100)
            .unwrap()
            .expires_ms,
        600
    );
    assert_eq!(
        set_ttl(&mut s, "/setup/f", Some(10_000), None, 100)
            .unwrap()
            .expires_ms,
        10_100
    );
    assert_eq!(tick(&mut s, 600), 0, "the later TTL replaced the earlier");
    let n = set_ttl(&mut s, "/setup/f", Some(TTL_NEVER), None, 700).unwrap();
    assert_eq!(n.expires_ms, 0);
    assert_eq!(tick(&mut s, 1 << 40), 0);
    assert!(!gone(&mut s, "/setup/f"));
    let d = set_ttl(&mut s, "/setup", None, Some(1_000), 0).unwrap();
    assert_eq!((d.expires_ms, d.child_ttl_ms), (0, 1_000));
    assert_eq!(
        set_ttl(&mut s, "/setup", None, Some(0), 0)
            .unwrap()
            .child_ttl_ms,
        0
    );
    for (path, ttl, child) in [
        ("/setup/f", Some(0), None),
        ("/setup/f", Some(MAX_TTL_MS + 1), None),
        ("/setup/f", None, Some(1_000)),
        ("/setup", None, Some(TTL_NEVER)),
        ("/", Some(1_000), None),
    ] {
        let e = set_ttl(&mut s, path, ttl, child, 0).unwrap_err();
        assert_eq!(
            e.code,
            ErrorCode::InvalidArgument,
            "{path} {ttl:?} {child:?}: {e}"
        );
    }
    let e = create_ttl(&mut s, "/setup/g", File, 0, 1_000, 0).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    assert!(gone(&mut s, "/setup/g"), "a refused create leaves nothing");
    s.check_invariants().unwrap();
}

#[test]
fn an_unclosed_put_past_its_ttl_is_dropped_and_its_close_refused() {
    let mut s = state();
    table(&mut s, "/t", true);
    let before = used_blocks(&s, 0) + used_blocks(&s, 1);
    let k = create_ttl(&mut s, "/t/k", KeyValue, 100, 0, 0).unwrap();
    map(&mut s, k.id, 0, 1, k.lease).unwrap();
    assert_eq!(tick(&mut s, 100), 1);
    assert!(close(&mut s, &k, 10).is_err());
    assert!(gone(&mut s, "/t/k"));
    assert_eq!(used_blocks(&s, 0) + used_blocks(&s, 1), before);
}

#[test]
fn one_decision_expires_a_bounded_number_and_the_rest_follow() {
    let mut s = state_of(BS, 64, 64);
    create(&mut s, "/d", Directory, 0).unwrap();
    let n = EXPIRE_NODES + 10;
    for i in 0..n {
        create_ttl(&mut s, &format!("/d/{i}"), Directory, 1, 0, 0).unwrap();
    }
    let d = s.decide_expiry(1).unwrap();
    assert_eq!(d.notes().expired(), EXPIRE_NODES as u64);
    s.commit(d, 1);
    assert_eq!(tick(&mut s, 1), 10);
    assert!(children(&s, "/d").is_empty());
}

#[test]
fn expiry_survives_the_log_and_a_checkpoint() {
    let mut s = state();
    let mut log = Vec::new();
    // (`logged` decides at time 0.)
    logged(&mut s, &mut log, ttl_request("/a", Directory, 0, 2_000)).unwrap();
    logged(&mut s, &mut log, ttl_request("/a/x", Directory, 0, 0)).unwrap();
    logged(&mut s, &mut log, ttl_request("/b", Directory, 9_000, 0)).unwrap();
    // The same start as `s`, then the log.
    let mut fresh = state();
    for rec in &log {
        fresh.replay(rec).unwrap();
    }
    assert_eq!(fresh.dump(), s.dump(), "the log carries the lifetimes");
    let mut back = through_checkpoint(&s);
    assert_eq!(back.dump(), s.dump(), "the checkpoint keeps the lifetimes");
    assert_eq!(lookup(&mut back, "/a").unwrap().child_ttl_ms, 2_000);
    assert_eq!(tick(&mut back, 2_000), 1);
    assert!(gone(&mut back, "/a/x"));
    assert!(!gone(&mut back, "/b"));
    assert_eq!(tick(&mut back, 9_000), 1);
    assert!(gone(&mut back, "/b"));
}

#[test]
fn a_renamed_node_keeps_its_expiry() {
    let mut s = state();
    create(&mut s, "/a", Directory, 0).unwrap();
    create(&mut s, "/b", Directory, 0).unwrap();
    let f = create_ttl(&mut s, "/a/f", File, 5_000, 0, 0).unwrap();
    close(&mut s, &f, 0).unwrap();
    let req = MetaRequest::Move {
        src: "/a/f".into(),
        dst: "/b/g".into(),
        replace: false,
    };
    s.apply(req, 1_000).unwrap();
    assert_eq!(lookup(&mut s, "/b/g").unwrap().expires_ms, 5_000);
    assert_eq!(tick(&mut s, 5_000), 1);
    assert!(gone(&mut s, "/b/g"));
    assert!(!gone(&mut s, "/b"));
}
