//! Property test: random sequences of create, put, delete, move and
//! enumerate against a simple in-memory model of the namespace. Besides the
//! outcome of every operation, it replays the child-record protocol the way
//! clients do (write records handed out, clear and release the ones taken
//! back) and checks that a data-plane enumeration - records filtered by the
//! live-slot bitmap - lists exactly the model's children.

use nodekernel_meta::MetaState;
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::{ErrorCode, NodeType, RecordLoc, NO_CLASS};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

type Model = BTreeMap<String, NodeType>;

#[derive(Debug, Clone)]
enum Op {
    Create(String, NodeType),
    Put(String),
    Delete(String, bool),
    Move(String, String),
}

fn path() -> impl Strategy<Value = String> {
    proptest::collection::vec(prop_oneof!["a", "b", "c"], 1..=3)
        .prop_map(|c| format!("/{}", c.join("/")))
}

fn node_type() -> impl Strategy<Value = NodeType> {
    prop_oneof![
        Just(NodeType::Directory),
        Just(NodeType::File),
        Just(NodeType::Table),
        Just(NodeType::KeyValue),
        Just(NodeType::Bag),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (path(), node_type()).prop_map(|(p, t)| Op::Create(p, t)),
        2 => path().prop_map(Op::Put),
        2 => (path(), any::<bool>()).prop_map(|(p, r)| Op::Delete(p, r)),
        2 => (path(), path()).prop_map(|(a, b)| Op::Move(a, b)),
    ]
}

fn parent(p: &str) -> &str {
    match p.rfind('/') {
        Some(0) => "/",
        Some(i) => &p[..i],
        None => "/",
    }
}

/// Walks to `p` in the model the way the namespace does.
fn resolve(m: &Model, p: &str) -> Result<NodeType, ErrorCode> {
    if p == "/" {
        return Ok(NodeType::Directory);
    }
    let comps: Vec<&str> = p[1..].split('/').collect();
    let mut ty = NodeType::Directory;
    for i in 0..comps.len() {
        if !ty.is_container() {
            return Err(ErrorCode::TypeMismatch);
        }
        let sub = format!("/{}", comps[..=i].join("/"));
        ty = *m.get(&sub).ok_or(ErrorCode::NotFound)?;
    }
    Ok(ty)
}

fn parent_for(m: &Model, p: &str, ty: NodeType) -> Result<(), ErrorCode> {
    let pt = resolve(m, parent(p))?;
    if !pt.accepts(ty) {
        return Err(ErrorCode::TypeMismatch);
    }
    Ok(())
}

fn in_subtree(p: &str, root: &str) -> bool {
    p == root || p.starts_with(&format!("{root}/"))
}

/// Applies `op` to the model; returns the expected error, if any.
fn model_apply(m: &mut Model, op: &Op) -> Result<(), ErrorCode> {
    match op {
        Op::Create(p, ty) => {
            parent_for(m, p, *ty)?;
            match m.get(p) {
                Some(NodeType::KeyValue) if *ty == NodeType::KeyValue => {}
                Some(_) if *ty != NodeType::KeyValue => return Err(ErrorCode::AlreadyExists),
                _ => {}
            }
            m.insert(p.clone(), *ty);
            Ok(())
        }
        Op::Put(p) => model_apply(m, &Op::Create(p.clone(), NodeType::KeyValue)),
        Op::Delete(p, recursive) => {
            resolve(m, p)?;
            let has_children = m.keys().any(|k| k.starts_with(&format!("{p}/")));
            if has_children && !recursive {
                return Err(ErrorCode::NotEmpty);
            }
            m.retain(|k, _| !in_subtree(k, p));
            Ok(())
        }
        Op::Move(src, dst) => {
            let ty = resolve(m, src)?;
            parent_for(m, dst, ty)?;
            if m.contains_key(dst) {
                return Err(ErrorCode::AlreadyExists);
            }
            if in_subtree(parent(dst), src) {
                return Err(ErrorCode::InvalidArgument);
            }
            let moved: Vec<(String, NodeType)> = m
                .iter()
                .filter(|(k, _)| in_subtree(k, src))
                .map(|(k, t)| (k.clone(), *t))
                .collect();
            for (k, t) in moved {
                m.remove(&k);
                m.insert(format!("{dst}{}", &k[src.len()..]), t);
            }
            Ok(())
        }
    }
}

/// Simulated container data: (container, slot) -> name.
type Records = HashMap<(u64, u32), String>;

struct Sim {
    st: MetaState,
    records: Records,
}

impl Sim {
    fn new() -> Sim {
        let mut st = MetaState::new(4096, 60_000, 1);
        st.apply(
            MetaRequest::Register(nodekernel_proto::ServerSpec {
                addr: "h:1".into(),
                class: 0,
                class_name: "dram".into(),
                medium: "dram".into(),
                location: "h".into(),
                block_size: 4096,
                first_block: 0,
                num_blocks: 100_000,
                identity: "model".into(),
                incarnation: 1,
                cap_key: [1; 32],
            }),
            0,
        )
        .unwrap();
        Sim {
            st,
            records: HashMap::new(),
        }
    }

    fn write(&mut self, rec: Option<RecordLoc>, name: &str) {
        if let Some(r) = rec {
            self.records.insert((r.container, r.slot), name.to_string());
        }
    }

    fn clear(&mut self, rec: Option<RecordLoc>) {
        if let Some(r) = rec {
            self.records.remove(&(r.container, r.slot));
            self.st
                .apply(
                    MetaRequest::ReleaseSlot {
                        container: r.container,
                        slot: r.slot,
                    },
                    0,
                )
                .unwrap();
        }
    }

    fn apply(&mut self, op: &Op) -> Result<(), ErrorCode> {
        let leaf = |p: &str| p.rsplit('/').next().unwrap().to_string();
        let create = |path: &str, ty: NodeType| MetaRequest::Create {
            path: path.to_string(),
            ty,
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
        match op {
            Op::Create(p, NodeType::KeyValue) | Op::Put(p) => {
                let MetaReply::Node(n) = self
                    .st
                    .apply(create(p, NodeType::KeyValue), 0)
                    .map_err(|e| e.code)?
                else {
                    panic!("create reply")
                };
                let close = MetaRequest::Sync {
                    node: n.id,
                    lease: n.lease,
                    size: 0,
                    close: true,
                    mtime: 0,
                };
                match self.st.apply(close, 0).map_err(|e| e.code)? {
                    MetaReply::Record(r) => self.write(r, &leaf(p)),
                    r => panic!("{r:?}"),
                }
                Ok(())
            }
            Op::Create(p, ty) => {
                let MetaReply::Node(n) = self.st.apply(create(p, *ty), 0).map_err(|e| e.code)?
                else {
                    panic!("create reply")
                };
                self.write(n.record, &leaf(p));
                Ok(())
            }
            Op::Delete(p, recursive) => {
                let req = MetaRequest::Remove {
                    path: p.clone(),
                    recursive: *recursive,
                };
                match self.st.apply(req, 0).map_err(|e| e.code)? {
                    MetaReply::Record(r) => self.clear(r),
                    r => panic!("{r:?}"),
                }
                Ok(())
            }
            Op::Move(src, dst) => {
                let req = MetaRequest::Move {
                    src: src.clone(),
                    dst: dst.clone(),
                    replace: false,
                };
                match self.st.apply(req, 0).map_err(|e| e.code)? {
                    MetaReply::Moved { clear, write, .. } => {
                        self.write(write, &leaf(dst));
                        self.clear(clear);
                    }
                    r => panic!("{r:?}"),
                }
                Ok(())
            }
        }
    }

    /// Data-plane enumeration: records of live slots.
    fn enumerate(&mut self, p: &str) -> BTreeSet<String> {
        let MetaReply::Listing {
            container,
            slots,
            live,
            ..
        } = self
            .st
            .apply(
                MetaRequest::Enumerate {
                    path: p.to_string(),
                },
                0,
            )
            .unwrap()
        else {
            panic!("listing")
        };
        let mut names = BTreeSet::new();
        for slot in 0..slots {
            if live[slot as usize / 8] & (1 << (slot % 8)) != 0 {
                let name = self
                    .records
                    .get(&(container, slot))
                    .expect("live slot has a record");
                assert!(names.insert(name.clone()), "duplicate record {name}");
            }
        }
        names
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn namespace_matches_the_model(ops in proptest::collection::vec(op(), 1..60)) {
        let mut model = Model::new();
        let mut sim = Sim::new();
        for op in &ops {
            let want = model_apply(&mut model, op);
            let got = sim.apply(op);
            prop_assert_eq!(got, want, "{:?}", op);
            // Every container enumerates to exactly its children.
            let containers: Vec<String> = std::iter::once("/".to_string())
                .chain(model.iter().filter(|(_, t)| t.is_container()).map(|(k, _)| k.clone()))
                .collect();
            for c in containers {
                let expect: BTreeSet<String> = model
                    .keys()
                    .filter(|k| parent(k) == c)
                    .map(|k| k.rsplit('/').next().unwrap().to_string())
                    .collect();
                prop_assert_eq!(sim.enumerate(&c), expect.clone(), "data-plane listing of {}", c);
                let authority: BTreeSet<String> = sim.st.ns().children(&c).unwrap().into_iter().collect();
                prop_assert_eq!(authority, expect, "metadata listing of {}", c);
            }
            for (p, ty) in &model {
                let id = sim.st.ns().resolve(p).unwrap();
                prop_assert_eq!(sim.st.ns().get(id).unwrap().ty, *ty);
            }
        }
    }
}
