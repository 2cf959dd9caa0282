//! Sessions: opened, renewed and closed by their holder; what is bound to
//! one goes when it ends or its lease lapses. Time is the state's `now`
//! (the tests' wall clock starts at 0).

use super::*;
use crate::state::sessions::MAX_BOUND;
use nodekernel_proto::meta::{SessionRef, MAX_SESSION_LEASE_MS, MIN_SESSION_LEASE_MS};

const SECRET: u128 = 0x5eed_5eed_5eed_5eed_1234_5678_9abc_def0;

fn open(s: &mut MetaState, lease_ms: u64, now: u64) -> (u64, u64) {
    let req = MetaRequest::SessionOpen {
        secret: SECRET,
        lease_ms,
    };
    match s.apply(req, now).unwrap() {
        MetaReply::Session { id, lease_ms } => (id, lease_ms),
        r => panic!("unexpected {r:?}"),
    }
}

fn renew(s: &mut MetaState, id: u64, secret: u128, now: u64) -> Result<MetaReply> {
    s.apply(MetaRequest::SessionRenew { id, secret }, now)
}

fn close_session(s: &mut MetaState, id: u64, secret: u128, now: u64) -> Result<MetaReply> {
    s.apply(MetaRequest::SessionClose { id, secret }, now)
}

fn bound_request(path: &str, ty: NodeType, session: u64, secret: u128) -> MetaRequest {
    let mut req = create_request(path, ty);
    if let MetaRequest::Create { session: s, .. } = &mut req {
        *s = Some(SessionRef {
            id: session,
            secret,
        });
    }
    req
}

fn create_bound(
    s: &mut MetaState,
    path: &str,
    ty: NodeType,
    session: u64,
    now: u64,
) -> Result<NodeInfo> {
    match s.apply(bound_request(path, ty, session, SECRET), now)? {
        MetaReply::Node(n) => Ok(n),
        r => panic!("unexpected {r:?}"),
    }
}

/// What the shell does before each request: end lapsed sessions, then
/// expire what is due. Returns (sessions lapsed, nodes expired).
fn tick(s: &mut MetaState, now: u64) -> (u64, u64) {
    let (mut lapsed, mut expired) = (0, 0);
    while let Some(d) = s.decide_session_lapse(now) {
        lapsed += d.notes().sessions_lapsed();
        s.commit(d, now);
    }
    while let Some(d) = s.decide_expiry(now) {
        expired += d.notes().expired();
        s.commit(d, now);
    }
    s.check_invariants().unwrap();
    (lapsed, expired)
}

fn gone(s: &mut MetaState, path: &str) -> bool {
    lookup(s, path).is_err_and(|e| e.code == ErrorCode::NotFound)
}

#[test]
fn a_lapsed_lease_removes_the_bound_subtree_and_nothing_else() {
    let mut s = state();
    let (id, lease) = open(&mut s, 10_000, 0);
    assert_eq!(lease, 10_000);
    create(&mut s, "/jobs", Directory, 0).unwrap();
    create_bound(&mut s, "/jobs/j1", Directory, id, 0).unwrap();
    let f = file(&mut s, "/jobs/j1/part-0", 2);
    let other = file(&mut s, "/jobs/other", 1);
    let (_, held) = map(&mut s, f.id, 0, 2, 0).unwrap();

    // Renewed in time, it lives on.
    assert_eq!(tick(&mut s, 9_999), (0, 0));
    renew(&mut s, id, SECRET, 9_000).unwrap();
    assert_eq!(tick(&mut s, 18_999), (0, 0));
    assert!(!gone(&mut s, "/jobs/j1/part-0"));
    // Not renewed: at the deadline it lapses and its subtree goes at once.
    assert_eq!(tick(&mut s, 19_000), (1, 1));
    for p in ["/jobs/j1", "/jobs/j1/part-0"] {
        assert!(gone(&mut s, p), "{p} is gone");
    }
    assert_eq!(lookup(&mut s, "/jobs/other").unwrap().id, other.id);
    assert!(!gone(&mut s, "/jobs"));
    while let Some(d) = s.decide_reap() {
        s.commit(d, 19_000);
    }
    let claims = s.take_claims();
    for b in &held {
        assert!(
            claims.iter().any(|c| c.block == b.block && c.gen > b.gen),
            "block {b:?} comes back fenced"
        );
    }
    // The session is gone: renewing it or binding to it is NotFound, and
    // a create that names it makes nothing.
    assert_eq!(
        renew(&mut s, id, SECRET, 19_000).unwrap_err().code,
        ErrorCode::NotFound
    );
    let e = create_bound(&mut s, "/jobs/j2", Directory, id, 19_000).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    assert!(gone(&mut s, "/jobs/j2"));
    assert_eq!(s.ns().lifetimes().open_sessions(), 0);
    s.check_invariants().unwrap();
}

#[test]
fn closing_removes_what_is_bound_and_only_the_holder_may() {
    let mut s = state();
    let (id, _) = open(&mut s, 60_000, 0);
    create_bound(&mut s, "/a", Directory, id, 0).unwrap();
    create_bound(&mut s, "/b", Table, id, 0).unwrap();
    put(&mut s, "/b/k", 10).unwrap();
    create(&mut s, "/keep", Directory, 0).unwrap();
    // A wrong secret is told the same as an unknown session, and changes
    // nothing; nor may it bind a node.
    for bad in [SECRET ^ 1, 0] {
        let e = close_session(&mut s, id, bad, 1).unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert_eq!(
            renew(&mut s, id, bad, 1).unwrap_err().code,
            ErrorCode::NotFound
        );
        let e = s
            .apply(bound_request("/c", Directory, id, bad), 1)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert_eq!(
            close_session(&mut s, id + 1, SECRET, 1).unwrap_err().code,
            ErrorCode::NotFound
        );
    }
    assert!(gone(&mut s, "/c"));
    assert!(!gone(&mut s, "/a"));
    close_session(&mut s, id, SECRET, 5).unwrap();
    assert_eq!(tick(&mut s, 5), (0, 2), "two bound subtrees removed");
    assert!(gone(&mut s, "/a") && gone(&mut s, "/b") && gone(&mut s, "/b/k"));
    assert!(!gone(&mut s, "/keep"));
    // Closed once: closing again is NotFound.
    assert_eq!(
        close_session(&mut s, id, SECRET, 6).unwrap_err().code,
        ErrorCode::NotFound
    );
}

#[test]
fn leases_are_clamped_ids_never_reused_and_a_bound_node_removed_otherwise_leaves_no_binding() {
    let mut s = state();
    let (a, short) = open(&mut s, 1, 0);
    assert_eq!(short, MIN_SESSION_LEASE_MS);
    let (b, long) = open(&mut s, u64::MAX, 0);
    assert_eq!(long, MAX_SESSION_LEASE_MS);
    assert!(b > a);
    close_session(&mut s, b, SECRET, 0).unwrap();
    let (c, _) = open(&mut s, 5_000, 0);
    assert!(c > b, "an ended session's id is not handed out again");
    // A bound node deleted, or a bound KeyValue replaced, keeps nothing.
    create(&mut s, "/t", Table, 0).unwrap();
    create_bound(&mut s, "/d", Directory, a, 0).unwrap();
    let k = create_bound(&mut s, "/t/k", KeyValue, a, 0).unwrap();
    close(&mut s, &k, 0).unwrap();
    assert_eq!(s.ns().lifetimes().bound_count(a), 2);
    remove(&mut s, "/d", false).unwrap();
    put(&mut s, "/t/k", 3).unwrap();
    assert_eq!(s.ns().lifetimes().bound_count(a), 0);
    s.check_invariants().unwrap();
    // So the session's end removes none of them.
    assert_eq!(tick(&mut s, MIN_SESSION_LEASE_MS), (1, 0));
    assert!(!gone(&mut s, "/t/k"));
}

#[test]
fn a_session_binds_a_bounded_number_of_nodes() {
    // Room for the records of MAX_BOUND children.
    let mut s = state_of(BS, 512, 512);
    let (id, _) = open(&mut s, 60_000, 0);
    create(&mut s, "/d", Directory, 0).unwrap();
    for i in 0..MAX_BOUND {
        create_bound(&mut s, &format!("/d/{i}"), Directory, id, 0).unwrap();
    }
    let e = create_bound(&mut s, "/d/more", Directory, id, 0).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    assert!(e.message.contains("bind a directory"), "{}", e.message);
    assert!(gone(&mut s, "/d/more"));
    close_session(&mut s, id, SECRET, 1).unwrap();
    let (_, expired) = tick(&mut s, 1);
    assert_eq!(expired, MAX_BOUND as u64);
    assert!(children(&s, "/d").is_empty());
}

#[test]
fn sessions_survive_the_log_and_a_checkpoint_and_a_restart_gives_each_a_lease() {
    let mut s = state();
    let mut log = Vec::new();
    let open_req = MetaRequest::SessionOpen {
        secret: SECRET,
        lease_ms: 5_000,
    };
    let MetaReply::Session { id, .. } = logged(&mut s, &mut log, open_req).unwrap() else {
        panic!()
    };
    logged(&mut s, &mut log, bound_request("/j", Directory, id, SECRET)).unwrap();
    logged(&mut s, &mut log, create_request("/j/x", Directory)).unwrap();
    logged(&mut s, &mut log, create_request("/keep", Directory)).unwrap();
    // The same start as `s`, then the log; or its checkpoint.
    let mut replayed = state();
    for rec in &log {
        replayed.replay(rec).unwrap();
    }
    assert_eq!(replayed.dump(), s.dump(), "the log carries the sessions");
    let back = through_checkpoint(&s);
    assert_eq!(back.dump(), s.dump(), "the checkpoint keeps the sessions");
    for mut back in [replayed, back] {
        let j = lookup(&mut back, "/j").unwrap().id;
        assert_eq!(back.ns().lifetimes().bound_to(j), Some(id));
        // The restart is at time 100: the session has a lease from then.
        back.restarted(100);
        assert_eq!(back.ns().lifetimes().deadline(id), Some(5_100));
        assert_eq!(tick(&mut back, 5_099), (0, 0));
        // The client, alive, renews it with its secret.
        renew(&mut back, id, SECRET, 5_000).unwrap();
        assert_eq!(tick(&mut back, 9_999), (0, 0));
        assert_eq!(tick(&mut back, 10_000), (1, 1));
        assert!(gone(&mut back, "/j/x"));
        assert!(!gone(&mut back, "/keep"));
        // The next session after a restart gets a new id.
        let (next, _) = open(&mut back, 5_000, 10_000);
        assert!(next > id);
    }
}

#[test]
fn an_existing_node_is_bound_by_its_path() {
    let mut s = state();
    let (id, _) = open(&mut s, 60_000, 0);
    create(&mut s, "/d", Directory, 0).unwrap();
    let f = file(&mut s, "/d/.hidden", 1);
    let bind = |secret| MetaRequest::SessionBind {
        id,
        secret,
        path: "/d/.hidden".into(),
    };
    assert_eq!(
        s.apply(bind(SECRET ^ 1), 0).unwrap_err().code,
        ErrorCode::NotFound
    );
    s.apply(bind(SECRET), 0).unwrap();
    s.apply(bind(SECRET), 0).unwrap(); // again: no change
    assert_eq!(s.ns().lifetimes().bound_to(f.id), Some(id));
    assert_eq!(s.ns().lifetimes().bound_count(id), 1);
    let root = MetaRequest::SessionBind {
        id,
        secret: SECRET,
        path: "/".into(),
    };
    assert_eq!(
        s.apply(root, 0).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    close_session(&mut s, id, SECRET, 1).unwrap();
    assert_eq!(tick(&mut s, 1), (0, 1));
    assert!(gone(&mut s, "/d/.hidden"));
    assert!(!gone(&mut s, "/d"));
}
