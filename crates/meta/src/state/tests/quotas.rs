//! Quotas and disk usage: `QuotaSet`, `Usage`, `Quotas`, the check that
//! refuses growth past a quota whatever the request, and the accounting
//! through removes, moves, reaping, the log and checkpoints.

use super::*;
use nodekernel_proto::quota::{Quota, UsageInfo, NO_LIMIT};
use proptest::prelude::*;

fn set_quota(s: &mut MetaState, path: &str, bytes: u64, nodes: u64) -> Result<UsageInfo> {
    let req = MetaRequest::QuotaSet {
        path: path.into(),
        quota: Quota { bytes, nodes },
    };
    match s.apply(req, 0)? {
        MetaReply::Usage(u) => Ok(u),
        r => panic!("unexpected {r:?}"),
    }
}

fn du(s: &mut MetaState, path: &str) -> UsageInfo {
    match s
        .apply(MetaRequest::Usage { path: path.into() }, 0)
        .unwrap()
    {
        MetaReply::Usage(u) => u,
        r => panic!("unexpected {r:?}"),
    }
}

fn quotas(s: &mut MetaState) -> Vec<UsageInfo> {
    match s.apply(MetaRequest::Quotas, 0).unwrap() {
        MetaReply::Quotas(all) => all,
        r => panic!("unexpected {r:?}"),
    }
}

fn rename(s: &mut MetaState, src: &str, dst: &str) -> Result<MetaReply> {
    s.apply(
        MetaRequest::Move {
            src: src.into(),
            dst: dst.into(),
            replace: false,
        },
        0,
    )
}

fn reap_all(s: &mut MetaState) {
    while let Some(d) = s.decide_reap() {
        s.commit(d, 0);
    }
}

fn abort(s: &mut MetaState, n: &NodeInfo) {
    s.apply(
        MetaRequest::Abort {
            node: n.id,
            lease: n.lease,
        },
        0,
    )
    .unwrap();
}

fn refused(r: Result<impl std::fmt::Debug>, root: &str) -> Error {
    let e = r.expect_err("past the quota");
    assert_eq!(e.code, ErrorCode::QuotaExceeded, "{e}");
    assert_eq!(
        nodekernel_proto::quota::exceeded_root(&e),
        Some(root),
        "{e}"
    );
    e
}

/// `du` counts nodes below a container, published bytes, and blocks per
/// class of the data nodes below it, from the accounting: a data node
/// counts itself, a container its subtree; the root sees everything.
#[test]
fn du_counts_nodes_bytes_and_blocks_per_class() {
    let mut s = state();
    create(&mut s, "/d", Directory, 0).unwrap();
    create(&mut s, "/d/e", Directory, 0).unwrap();
    file(&mut s, "/d/f", 2);
    let g = create(&mut s, "/d/e/g", File, 0).unwrap();
    map(&mut s, g.id, 0, 1, g.lease).unwrap();
    sync(&mut s, &g, 100, false).unwrap();
    let u = du(&mut s, "/d");
    assert_eq!(
        (u.ty, u.nodes, u.bytes),
        (Directory, 3, 2 * BS as u64 + 100)
    );
    assert_eq!(u.held, 3 * BS as u64);
    assert_eq!(u.classes.iter().map(|c| c.blocks).sum::<u64>(), 3);
    assert_eq!(u.quota, None);
    let f = du(&mut s, "/d/f");
    assert_eq!(
        (f.ty, f.nodes, f.bytes, f.held),
        (File, 1, 2 * BS as u64, 2 * BS as u64)
    );
    let e = du(&mut s, "/d/e");
    assert_eq!((e.nodes, e.bytes), (1, 100));
    // The root: /setup, /d and what is below /d.
    assert_eq!(du(&mut s, "/").nodes, 5);
    assert_eq!(
        s.apply(MetaRequest::Usage { path: "/no".into() }, 0)
            .unwrap_err()
            .code,
        ErrorCode::NotFound
    );
}

/// A create past a node quota is refused before any effect, naming the
/// quota root; so is one in a subtree under it; clearing the quota lets it
/// through. Quotas are listed with their usage.
#[test]
fn a_node_quota_refuses_creates_below_it_and_changes_nothing() {
    let mut s = state();
    create(&mut s, "/q", Directory, 0).unwrap();
    create(&mut s, "/q/sub", Directory, 0).unwrap();
    let u = set_quota(&mut s, "/q", NO_LIMIT, 3).unwrap();
    assert_eq!(
        u.quota,
        Some(Quota {
            bytes: NO_LIMIT,
            nodes: 3
        })
    );
    create(&mut s, "/q/a", File, 0).unwrap();
    create(&mut s, "/q/sub/b", File, 0).unwrap();
    let before = s.dump();
    let e = refused(create(&mut s, "/q/sub/c", File, 0), "/q");
    assert!(e.message.contains("quota of 3 nodes"), "{e}");
    refused(create(&mut s, "/q/c", Table, 0), "/q");
    assert_eq!(s.dump(), before, "refusals changed nothing");
    // A put in progress holds its node from its create (and its first
    // block: a put's create hands it out); an abort gives both back.
    table(&mut s, "/t", true);
    set_quota(&mut s, "/t", NO_LIMIT, 1).unwrap();
    let k = create(&mut s, "/t/k", KeyValue, 0).unwrap();
    assert_eq!(
        (du(&mut s, "/t").nodes, du(&mut s, "/t").held),
        (1, BS as u64)
    );
    let before_t = s.dump();
    refused(create(&mut s, "/t/l", KeyValue, 0), "/t");
    assert_eq!(s.dump(), before_t, "a refused put leaves no node");
    abort(&mut s, &k);
    assert_eq!((du(&mut s, "/t").nodes, du(&mut s, "/t").held), (0, 0));
    assert!(lookup(&mut s, "/t/k").is_err());
    create(&mut s, "/elsewhere", File, 0).unwrap();
    let q = quotas(&mut s);
    assert_eq!(
        q.iter()
            .map(|u| (u.path.as_str(), u.nodes))
            .collect::<Vec<_>>(),
        [("/q", 3), ("/t", 0)]
    );
    set_quota(&mut s, "/t", NO_LIMIT, NO_LIMIT).unwrap();
    set_quota(&mut s, "/q", NO_LIMIT, NO_LIMIT).unwrap();
    create(&mut s, "/q/sub/c", File, 0).unwrap();
    assert!(quotas(&mut s).is_empty());
    s.check_invariants().unwrap();
}

/// A byte quota counts storage held: a map that would take a block past
/// it is refused, so a writer never overshoots; a put that is refused is
/// aborted and leaves no node; a quota set below what is held refuses
/// growth only.
#[test]
fn a_byte_quota_refuses_the_map_that_would_pass_it() {
    let mut s = state();
    create(&mut s, "/q", Directory, 0).unwrap();
    set_quota(&mut s, "/q", 3 * BS as u64, NO_LIMIT).unwrap();
    let f = create(&mut s, "/q/f", File, 0).unwrap();
    map(&mut s, f.id, 0, 2, f.lease).unwrap();
    let e = refused(map(&mut s, f.id, 2, 2, f.lease), "/q");
    assert!(e.message.contains("quota of 12 KiB"), "{e}");
    map(&mut s, f.id, 2, 1, f.lease).unwrap();
    close(&mut s, &f, 3 * BS as u64).unwrap();
    // A put whose map is refused: the client aborts it, nothing is left.
    let k = create(&mut s, "/q/k", KeyValue, 0);
    assert!(k.is_err(), "a Directory takes no KeyValue");
    table(&mut s, "/q/t", true);
    // A put's create takes its first block: refused at the create.
    let before = s.dump();
    refused(create(&mut s, "/q/t/k", KeyValue, 0), "/q");
    assert_eq!(s.dump(), before, "a refused create leaves no node");
    // With room for that block only, its next map is refused; the
    // client aborts, and nothing is left.
    set_quota(&mut s, "/q", 4 * BS as u64, NO_LIMIT).unwrap();
    let k = create(&mut s, "/q/t/k", KeyValue, 0).unwrap();
    refused(map(&mut s, k.id, 1, 1, k.lease), "/q");
    abort(&mut s, &k);
    assert!(lookup(&mut s, "/q/t/k").is_err());
    assert_eq!(du(&mut s, "/q").held, 3 * BS as u64);
    // Below what it holds: growth is refused, shrinking is not.
    set_quota(&mut s, "/q", BS as u64, NO_LIMIT).unwrap();
    let g = create(&mut s, "/q/g", File, 0).unwrap();
    refused(map(&mut s, g.id, 0, 1, g.lease), "/q");
    let f = s
        .apply(
            MetaRequest::OpenWrite {
                path: "/q/f".into(),
            },
            0,
        )
        .map(|r| match r {
            MetaReply::Node(n) => n,
            r => panic!("{r:?}"),
        })
        .unwrap();
    truncate(&mut s, &f, 0, 0).unwrap();
    assert_eq!(du(&mut s, "/q").held, 0);
    s.check_invariants().unwrap();
}

/// Small values count the bytes of their pieces; nested quotas are both
/// checked; a create with a size hint takes its storage at the create,
/// and is refused there.
#[test]
fn pieces_count_and_nested_quotas_both_hold() {
    let mut s = state_of(1 << 16, 64, 64);
    table(&mut s, "/t", true);
    put_small(&mut s, "/t/a", 100).unwrap();
    let u = du(&mut s, "/t");
    assert_eq!((u.nodes, u.bytes), (1, 100));
    let piece = u.held;
    assert!((100..1 << 16).contains(&piece), "{piece}");
    assert_eq!(u.classes.iter().map(|c| c.blocks).sum::<u64>(), 0);
    set_quota(&mut s, "/t", 3 * piece, NO_LIMIT).unwrap();
    put_small(&mut s, "/t/b", 100).unwrap();
    put_small(&mut s, "/t/c", 100).unwrap();
    let before = s.dump();
    refused(put_small(&mut s, "/t/d", 100), "/t");
    assert_eq!(s.dump(), before);
    // An outer quota under which the inner one has room.
    create(&mut s, "/o", Directory, 0).unwrap();
    create(&mut s, "/o/i", Directory, 0).unwrap();
    set_quota(&mut s, "/o", NO_LIMIT, 2).unwrap();
    set_quota(&mut s, "/o/i", NO_LIMIT, 10).unwrap();
    create(&mut s, "/o/i/a", File, 0).unwrap();
    refused(create(&mut s, "/o/i/b", File, 0), "/o");
    s.check_invariants().unwrap();
}

/// A move subtracts a subtree's whole usage from its old ancestors and
/// adds it to its new ones; into a quota root it would take past its
/// limit it is refused; a remove takes a subtree's usage away at once
/// (what waits in the graveyard counts nowhere), and reaping changes no
/// ancestor's usage.
#[test]
fn moves_and_removes_carry_whole_subtrees() {
    let mut s = state_of(BS, 64, 64);
    create(&mut s, "/a", Directory, 0).unwrap();
    create(&mut s, "/b", Directory, 0).unwrap();
    create(&mut s, "/a/x", Directory, 0).unwrap();
    file(&mut s, "/a/x/f", 2);
    file(&mut s, "/a/x/g", 1);
    set_quota(&mut s, "/b", 4 * BS as u64, 2).unwrap();
    let e = refused(rename(&mut s, "/a/x", "/b/x"), "/b");
    assert!(e.message.contains("nodes"), "{e}");
    set_quota(&mut s, "/b", 2 * BS as u64, 3).unwrap();
    refused(rename(&mut s, "/a/x", "/b/x"), "/b");
    set_quota(&mut s, "/b", 3 * BS as u64, 3).unwrap();
    rename(&mut s, "/a/x", "/b/x").unwrap();
    assert_eq!((du(&mut s, "/a").nodes, du(&mut s, "/a").held), (0, 0));
    assert_eq!(
        (du(&mut s, "/b").nodes, du(&mut s, "/b").held),
        (3, 3 * BS as u64)
    );
    // Within the quota root, and out of it again.
    rename(&mut s, "/b/x/g", "/b/g").unwrap();
    assert_eq!(du(&mut s, "/b").nodes, 3);
    rename(&mut s, "/b/x", "/a/x").unwrap();
    assert_eq!(du(&mut s, "/b").nodes, 1);
    let root = du(&mut s, "/").nodes;
    remove(&mut s, "/a/x", true).unwrap();
    assert_eq!(du(&mut s, "/a").nodes, 0);
    assert_eq!(du(&mut s, "/").nodes, root - 2);
    reap_all(&mut s);
    assert_eq!(du(&mut s, "/").nodes, root - 2);
    // A removed quota root takes its quota with it.
    remove(&mut s, "/b", true).unwrap();
    reap_all(&mut s);
    assert!(quotas(&mut s).is_empty());
    s.check_invariants().unwrap();
}

/// A reserved put counts nowhere until its `Link`, which is checked
/// against the target's quotas like a put (and refused, changing
/// nothing).
#[test]
fn a_link_is_charged_to_the_quotas_of_its_key() {
    let mut s = state_of(1 << 16, 64, 64);
    table(&mut s, "/t", true);
    let root = du(&mut s, "/");
    // A reserve may hand out fewer puts than asked (a new slab started):
    // ask until there are two.
    let mut puts = Vec::new();
    while puts.len() < 2 {
        match s
            .apply(
                MetaRequest::Reserve {
                    size_hint: 100,
                    count: 2 - puts.len() as u32,
                    storage_class: NO_CLASS,
                    location: String::new(),
                },
                0,
            )
            .unwrap()
        {
            MetaReply::Reserved { puts: p, .. } => {
                assert!(!p.is_empty());
                puts.extend(p);
            }
            r => panic!("{r:?}"),
        }
    }
    assert_eq!(du(&mut s, "/"), root, "reserved puts count nowhere");
    set_quota(&mut s, "/t", NO_LIMIT, 1).unwrap();
    let link = |p: &NodeInfo, path: &str| MetaRequest::Link {
        node: p.id,
        lease: p.lease,
        size: 100,
        mtime: 0,
        path: path.into(),
    };
    s.apply(link(&puts[0], "/t/a"), 0).unwrap();
    let before = s.dump();
    refused(s.apply(link(&puts[1], "/t/b"), 0), "/t");
    assert_eq!(s.dump(), before);
    assert_eq!(du(&mut s, "/t").nodes, 1);
    s.check_invariants().unwrap();
}

/// Only a container carries a quota; a missing path is `NotFound`.
#[test]
fn only_containers_carry_quotas() {
    let mut s = state();
    file(&mut s, "/f", 0);
    let e = set_quota(&mut s, "/f", 1, 1).unwrap_err();
    assert_eq!(e.code, ErrorCode::TypeMismatch, "{e}");
    let e = set_quota(&mut s, "/none", 1, 1).unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    set_quota(&mut s, "/", NO_LIMIT, 100).unwrap();
    assert_eq!(quotas(&mut s)[0].path, "/");
}

/// Quotas survive the log and a checkpoint; usage is recounted to the
/// same numbers.
#[test]
fn quotas_and_usage_survive_the_log_and_checkpoints() {
    let mut s = state_of(BS, 64, 64);
    let mut log = Vec::new();
    for req in [
        create_request("/q", Directory),
        MetaRequest::QuotaSet {
            path: "/q".into(),
            quota: Quota {
                bytes: 10 * BS as u64,
                nodes: 5,
            },
        },
        create_request("/q/d", Directory),
    ] {
        logged(&mut s, &mut log, req).unwrap();
    }
    file(&mut s, "/q/d/f", 2);
    let want = du(&mut s, "/q");
    let mut back = through_checkpoint(&s);
    assert_eq!(du(&mut back, "/q"), want);
    back.check_invariants().unwrap();
    // The log alone (the file was not logged): the quota and the usage
    // of what the log made.
    let mut r = state_of(BS, 64, 64);
    for rec in &log {
        r.replay(rec).unwrap();
    }
    let u = du(&mut r, "/q");
    assert_eq!((u.nodes, u.quota), (1, want.quota));
    r.check_invariants().unwrap();
}

// ----- a model ---------------------------------------------------------------

/// One step of the model test.
#[derive(Debug, Clone)]
enum Op {
    /// A Directory under directory `parent` (an index into the live ones).
    Mkdir(usize),
    /// A File of `blocks` blocks under directory `parent`.
    Write(usize, u32),
    /// A put of `blocks` blocks at key `key` of the Table.
    Put(u8, u32),
    /// Removes the node at index `i` of the live ones (recursively).
    Remove(usize),
    /// Moves live node `i` under directory `j`.
    Move(usize, usize),
    /// Sets the quota of directory `i`: (blocks, nodes).
    Quota(usize, u32, u32),
    Reap,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => any::<usize>().prop_map(Op::Mkdir),
        4 => (any::<usize>(), 0..3u32).prop_map(|(p, b)| Op::Write(p, b)),
        3 => (0..6u8, 0..3u32).prop_map(|(k, b)| Op::Put(k, b)),
        2 => any::<usize>().prop_map(Op::Remove),
        2 => (any::<usize>(), any::<usize>()).prop_map(|(i, j)| Op::Move(i, j)),
        2 => (any::<usize>(), 0..8u32, 1..8u32).prop_map(|(i, b, n)| Op::Quota(i, b, n)),
        1 => Just(Op::Reap),
    ]
}

/// What the model knows: every live path with its blocks (None for a
/// directory), and the quotas by directory path.
#[derive(Default)]
struct Model {
    nodes: BTreeMap<String, Option<u64>>,
    quotas: BTreeMap<String, (u64, u64)>,
}

impl Model {
    fn below(&self, dir: &str) -> (u64, u64) {
        let prefix = if dir == "/" {
            "/".to_string()
        } else {
            format!("{dir}/")
        };
        self.nodes
            .iter()
            .filter(|(p, _)| p.starts_with(&prefix) && p.as_str() != dir)
            .fold((0, 0), |(n, b), (_, blocks)| {
                (n + 1, b + blocks.unwrap_or(0))
            })
    }

    fn dirs(&self) -> Vec<String> {
        let mut d: Vec<String> = vec!["/m".into()];
        d.extend(
            self.nodes
                .iter()
                .filter(|(p, b)| b.is_none() && p.starts_with("/m/"))
                .map(|(p, _)| p.clone()),
        );
        d
    }

    fn live(&self) -> Vec<String> {
        self.nodes
            .keys()
            .filter(|p| p.starts_with("/m/"))
            .cloned()
            .collect()
    }

    /// Whether adding (nodes, blocks) under `dir` keeps every quota above.
    fn fits(&self, dir: &str, nodes: u64, blocks: u64, except: Option<&str>) -> bool {
        self.quotas.iter().all(|(q, &(qb, qn))| {
            let inside = dir == q || dir.starts_with(&format!("{q}/"));
            let moved_within = except.is_some_and(|e| e.starts_with(&format!("{q}/")));
            if !inside || moved_within {
                return true;
            }
            let (n, b) = self.below(q);
            (nodes == 0 || n + nodes <= qn) && (blocks == 0 || b + blocks <= qb)
        })
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Creates, puts, removes, moves and quota changes against a model:
    /// a step the model says fits succeeds, one it says does not is
    /// refused with `QuotaExceeded` (so no quota root ever grows past its
    /// limit), and every directory's `du` equals the model's count.
    #[test]
    fn quotas_follow_a_model(ops in proptest::collection::vec(op(), 1..40)) {
        let mut s = state_of(BS, 256, 256);
        let mut m = Model::default();
        create(&mut s, "/m", Directory, 0).unwrap();
        m.nodes.insert("/m".into(), None);
        table(&mut s, "/m/t", true);
        m.nodes.insert("/m/t".into(), None);
        let mut next = 0u32;
        for o in ops {
            let dirs: Vec<String> = m.dirs().into_iter().filter(|d| d != "/m/t").collect();
            let live = m.live();
            match o {
                Op::Mkdir(p) => {
                    let path = format!("{}/d{next}", dirs[p % dirs.len()]);
                    next += 1;
                    let fits = m.fits(&dirs[p % dirs.len()], 1, 0, None);
                    match create(&mut s, &path, Directory, 0) {
                        Ok(_) => { prop_assert!(fits); m.nodes.insert(path, None); }
                        Err(e) => { prop_assert!(!fits, "{e}"); prop_assert_eq!(e.code, ErrorCode::QuotaExceeded); }
                    }
                }
                Op::Write(p, blocks) => {
                    let dir = dirs[p % dirs.len()].clone();
                    let path = format!("{dir}/f{next}");
                    next += 1;
                    if !m.fits(&dir, 1, 0, None) {
                        let e = create(&mut s, &path, File, 0).unwrap_err();
                        prop_assert_eq!(e.code, ErrorCode::QuotaExceeded);
                        continue;
                    }
                    let f = create(&mut s, &path, File, 0).unwrap();
                    m.nodes.insert(path.clone(), Some(0));
                    let mut held = 0;
                    for i in 0..blocks {
                        let fits = m.fits(&dir, 0, 1, None);
                        match map(&mut s, f.id, u64::from(i), 1, f.lease) {
                            Ok(_) => { prop_assert!(fits); held += 1; m.nodes.insert(path.clone(), Some(held)); }
                            Err(e) => { prop_assert!(!fits, "{e}"); prop_assert_eq!(e.code, ErrorCode::QuotaExceeded); break; }
                        }
                    }
                    close(&mut s, &f, held * u64::from(BS)).unwrap();
                }
                Op::Put(key, blocks) => {
                    let path = format!("/m/t/k{key}");
                    // A put in progress holds a node and its blocks besides
                    // the value it replaces; its create takes its first
                    // block.
                    let old = m.nodes.get(&path).copied().flatten();
                    if !m.fits("/m/t", 1, 1, None) {
                        let e = create(&mut s, &path, KeyValue, 0).unwrap_err();
                        prop_assert_eq!(e.code, ErrorCode::QuotaExceeded);
                        continue;
                    }
                    let k = create(&mut s, &path, KeyValue, 0).unwrap();
                    let shadow = format!("{path}.put");
                    m.nodes.insert(shadow.clone(), Some(1));
                    let mut ok = true;
                    for i in 1..blocks {
                        let fits = m.fits("/m/t", 0, 1, None);
                        match map(&mut s, k.id, u64::from(i), 1, k.lease) {
                            Ok(_) => { prop_assert!(fits); *m.nodes.get_mut(&shadow).unwrap() = Some(u64::from(i) + 1); }
                            Err(e) => { prop_assert!(!fits, "{e}"); prop_assert_eq!(e.code, ErrorCode::QuotaExceeded); ok = false; break; }
                        }
                    }
                    m.nodes.remove(&shadow);
                    if ok {
                        // The close gives back blocks past its size (an
                        // empty value keeps none).
                        close(&mut s, &k, u64::from(blocks) * u64::from(BS)).unwrap();
                        m.nodes.insert(path, Some(u64::from(blocks)));
                    } else {
                        abort(&mut s, &k);
                        prop_assert!(lookup(&mut s, &path).map(|_| ()).is_ok() == old.is_some());
                    }
                }
                Op::Remove(i) => {
                    if live.is_empty() { continue; }
                    let path = live[i % live.len()].clone();
                    if path == "/m/t" { continue; }
                    remove(&mut s, &path, true).unwrap();
                    let prefix = format!("{path}/");
                    m.nodes.retain(|p, _| p != &path && !p.starts_with(&prefix));
                    m.quotas.retain(|p, _| p != &path && !p.starts_with(&prefix));
                }
                Op::Move(i, j) => {
                    if live.is_empty() { continue; }
                    let src = live[i % live.len()].clone();
                    let dir = dirs[j % dirs.len()].clone();
                    // A Table's keys stay in it (a Directory takes no
                    // KeyValue).
                    if src == "/m/t" || src.starts_with("/m/t/") || dir == src || dir.starts_with(&format!("{src}/")) { continue; }
                    let name = src.rsplit('/').next().unwrap();
                    let dst = format!("{dir}/{name}");
                    if m.nodes.contains_key(&dst) { continue; }
                    let (n, b) = m.below(&src);
                    let own = m.nodes[&src].unwrap_or(0);
                    let fits = m.fits(&dir, n + 1, b + own, Some(&src));
                    match rename(&mut s, &src, &dst) {
                        Ok(_) => {
                            prop_assert!(fits, "{src} -> {dst}");
                            let prefix = format!("{src}/");
                            let moved: Vec<(String, Option<u64>)> = m.nodes.iter()
                                .filter(|(p, _)| **p == src || p.starts_with(&prefix))
                                .map(|(p, v)| (format!("{dst}{}", &p[src.len()..]), *v)).collect();
                            m.nodes.retain(|p, _| p != &src && !p.starts_with(&prefix));
                            m.nodes.extend(moved);
                            let qs: Vec<(String, (u64, u64))> = m.quotas.iter()
                                .filter(|(p, _)| **p == src || p.starts_with(&prefix))
                                .map(|(p, v)| (format!("{dst}{}", &p[src.len()..]), *v)).collect();
                            m.quotas.retain(|p, _| p != &src && !p.starts_with(&prefix));
                            m.quotas.extend(qs);
                        }
                        Err(e) => { prop_assert!(!fits, "{e}"); prop_assert_eq!(e.code, ErrorCode::QuotaExceeded); }
                    }
                }
                Op::Quota(i, blocks, nodes) => {
                    let dir = dirs[i % dirs.len()].clone();
                    set_quota(&mut s, &dir, u64::from(blocks) * u64::from(BS), u64::from(nodes)).unwrap();
                    m.quotas.insert(dir, (u64::from(blocks), u64::from(nodes)));
                }
                Op::Reap => reap_all(&mut s),
            }
            for d in m.dirs() {
                let u = du(&mut s, &d);
                let (n, b) = m.below(&d);
                prop_assert_eq!((u.nodes, u.held), (n, b * u64::from(BS)), "du of {}", d);
            }
        }
        s.check_invariants().map_err(TestCaseError::fail)?;
    }
}
