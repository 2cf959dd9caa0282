//! Tenants end to end (`docs/security.md`, *Tenants*): a tenant's client
//! sees its root as `/` and nothing outside it, through the client and
//! through raw frames on the metadata and data ports; its rights and its
//! root's quota hold; wrong or missing tokens change nothing; `/metrics`
//! carries its usage. Every wait only catches a hang.

use crate::admin::{only, scrape, sum};
use crate::common;

use bytes::BytesMut;
use common::{config, pattern, start_with, TestCluster};
use nodekernel_client::{exceeded_root, Client, CreateOptions, ErrorCode, NodeType, TenantSection};
use nodekernel_proto::meta::{MetaReply, MetaRequest};
use nodekernel_proto::store::{op as store_op, StoreRequest};
use nodekernel_rpc::{ConnOptions, Connection, Role, Token, VersionHandshake};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const HANG: Duration = Duration::from_secs(120);
const SECRET: &str = "a cluster token for the tenant tests, 48 bytes..";

fn token_of(file: &Path) -> Arc<Token> {
    let secret = std::fs::read(file).unwrap();
    Arc::new(Token::new(secret.trim_ascii(), "test").unwrap())
}

fn tenant(dir: &Path, name: &str, root: &str, rights: &[&str]) -> TenantSection {
    let file = dir.join(format!("{name}.token"));
    nodekernel_client::settings::write_new_secret(&file).unwrap();
    TenantSection {
        name: name.into(),
        token_file: Some(file),
        root: root.into(),
        rights: rights.iter().map(|r| r.to_string()).collect(),
    }
}

/// A cluster with tenants `a` (read, write: `/tenants/a`), `b` (read,
/// write, admin: `/tenants/b`) and `ro` (read: `/tenants/a`); their token
/// files are in `tokens`.
async fn tenants_cluster(tokens: &Path) -> TestCluster {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(16 << 20, 0, &dir);
    cfg.security.token = Some(SECRET.into());
    cfg.security.tenant = vec![
        tenant(tokens, "a", "/tenants/a", &["read", "write"]),
        tenant(tokens, "b", "/tenants/b", &["read", "write", "admin"]),
        tenant(tokens, "ro", "/tenants/a", &["read"]),
    ];
    start_with(cfg, dir).await
}

/// A client of `t`'s cluster proving tenant `name`'s token.
async fn client_of(t: &TestCluster, tokens: &Path, name: &str) -> Client {
    let mut cc = t.cluster.client_config();
    cc.token = Some(token_of(&tokens.join(format!("{name}.token"))));
    Client::connect(cc).await.expect("the tenant connects")
}

/// A raw connection proving `token`.
async fn raw(addr: &str, token: Arc<Token>) -> Connection {
    let hs = VersionHandshake::new(Role::Client).with_token(Some(token));
    Connection::connect_with_handshake(addr, ConnOptions::new(HANG), &hs)
        .await
        .expect("connects")
}

async fn send_meta(conn: &Connection, req: &MetaRequest) -> nodekernel_proto::Result<MetaReply> {
    let mut b = BytesMut::new();
    req.encode(&mut b);
    let reply = conn.call(req.op(), &[&b]).await?;
    MetaReply::decode(req.op(), &reply)
}

/// `e`'s message with every number taken out: two answers about node ids
/// that differ only in the id read the same.
fn shape(e: &nodekernel_proto::Error) -> (ErrorCode, String) {
    let m: String = e.message.chars().filter(|c| !c.is_ascii_digit()).collect();
    (e.code, m)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_sees_only_its_root() {
    let tokens = tempfile::tempdir().unwrap();
    let t = tenants_cluster(tokens.path()).await;
    let admin = &t.client;
    let data = pattern(4, 300_000);
    // The cluster made the tenants' roots at start.
    let mut names = admin.enumerate("/tenants").await.unwrap();
    names.sort();
    assert_eq!(names, ["a", "b"]);
    admin.mkdir("/secret", false).await.unwrap();
    admin
        .create("/secret/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    admin.put("/secret/t/k", &data).await.unwrap();
    // A sibling whose name starts like a's root.
    admin.mkdir("/tenants/ab", false).await.unwrap();

    let a = client_of(&t, tokens.path(), "a").await;
    let b = client_of(&t, tokens.path(), "b").await;
    assert!(
        a.enumerate("/").await.unwrap().is_empty(),
        "a's / is its root"
    );
    a.create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    a.put("/t/k", &data).await.unwrap();
    a.mkdir("/d", false).await.unwrap();
    a.rename("/t", "/d/t").await.unwrap();
    assert_eq!(a.get("/d/t/k").await.unwrap(), data);
    // It is a's root, as the cluster sees it.
    assert_eq!(admin.get("/tenants/a/d/t/k").await.unwrap(), data);
    assert_eq!(a.enumerate("/").await.unwrap(), ["d"]);
    // Nothing outside: the cluster's paths name a's own (missing) nodes,
    // and the errors speak of a's paths only.
    for p in ["/secret", "/secret/t/k", "/tenants", "/tenants/b", "/ab"] {
        let e = a.lookup(p).await.err().unwrap();
        assert_eq!(e.code, ErrorCode::NotFound, "{p}: {e}");
        assert!(!e.message.contains("/tenants/a"), "{p}: {e}");
    }
    assert!(a.get("/secret/t/k").await.is_err());
    // b's namespace is its own: a's data is not in it.
    assert!(b.enumerate("/").await.unwrap().is_empty());
    assert_eq!(
        b.lookup("/d").await.err().unwrap().code,
        ErrorCode::NotFound
    );
    b.create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    b.put("/t/k", b"b's").await.unwrap();
    assert_eq!(admin.get("/tenants/b/t/k").await.unwrap(), b"b's");
    // Moves stay inside: a's root can be neither moved nor removed, and
    // what it moves lands in its root.
    for e in [
        a.delete("/", true).await.unwrap_err(),
        a.rename("/", "/x").await.unwrap_err(),
    ] {
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    }
    a.rename("/d", "/tenants").await.unwrap();
    assert_eq!(admin.enumerate("/tenants/a").await.unwrap(), ["tenants"]);
    let mut names = admin.enumerate("/tenants").await.unwrap();
    names.sort();
    assert_eq!(names, ["a", "ab", "b"]);
    // du and quotas speak of its paths; a quota on b's root is not a's.
    admin
        .set_quota("/tenants/b", Some(1 << 30), None)
        .await
        .unwrap();
    let du = a.du("/").await.unwrap();
    assert_eq!(du.path, "/");
    assert_eq!(du.bytes, data.len() as u64);
    assert!(a.quotas().await.unwrap().is_empty());
    let bq = b.quotas().await.unwrap();
    assert_eq!(bq.len(), 1);
    assert_eq!(bq[0].path, "/");
    // Its status shows its own nodes, not the cluster's.
    assert_eq!(a.status().await.unwrap().nodes, du.nodes + 1);
    // A read-only tenant of the same root reads, and writes nothing.
    let ro = client_of(&t, tokens.path(), "ro").await;
    assert_eq!(ro.get("/tenants/t/k").await.unwrap(), data);
    let e = ro.put("/tenants/t/new", b"x").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    assert!(e.message.contains("may not write"), "{e}");
    assert!(admin.lookup("/tenants/a/tenants/t/new").await.is_err());
    // Only b has the admin right: a quota below its root, not on it.
    let e = a
        .set_quota("/tenants", Some(1 << 20), None)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    b.set_quota("/t", Some(1 << 20), None).await.unwrap();
    let e = b.set_quota("/", None, None).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    assert!(admin.quota("/tenants/b").await.unwrap().is_some());
    // The admin's data is untouched.
    assert_eq!(admin.get("/secret/t/k").await.unwrap(), data);
}

/// Raw frames: what a tenant's connection cannot reach by node id,
/// snapshot id or lease, and what it may not ask at all, on the metadata
/// port and on a storage server's data port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_frames_reach_nothing_outside_the_root() {
    let tokens = tempfile::tempdir().unwrap();
    let t = tenants_cluster(tokens.path()).await;
    let admin = &t.client;
    let data = pattern(5, 200_000);
    admin
        .create("/secret", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    admin.put("/secret/k", &data).await.unwrap();
    let secret = admin.lookup("/secret/k").await.unwrap().info().clone();
    let a_token = token_of(&tokens.path().join("a.token"));
    let meta = raw(&t.cluster.meta_addr().to_string(), a_token.clone()).await;

    // A node outside the root reads as one that does not exist.
    let map = |node| MetaRequest::Map {
        node,
        index: 0,
        count: 1,
        alloc: false,
        lease: 0,
        first_write: 0,
    };
    let outside = send_meta(&meta, &map(secret.id)).await.unwrap_err();
    let missing = send_meta(&meta, &map(1 << 50)).await.unwrap_err();
    assert_eq!(shape(&outside), shape(&missing), "{outside} / {missing}");
    assert!(!outside.message.contains("secret"), "{outside}");
    // The admin's write lease of a File, guessed: no write, no renewal.
    let mut f = admin
        .create("/file", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    f.append(b"the admin's").await.unwrap();
    let (node, lease) = (f.info().id, f.info().lease);
    assert_ne!(lease, 0);
    for req in [
        MetaRequest::Map {
            node,
            index: 0,
            count: 1,
            alloc: true,
            lease,
            first_write: 0,
        },
        MetaRequest::Sync {
            node,
            lease,
            size: 1,
            close: true,
            mtime: 0,
        },
        MetaRequest::Truncate {
            node,
            lease,
            size: 0,
            mtime: 0,
        },
        MetaRequest::Abort { node, lease },
    ] {
        let e = send_meta(&meta, &req).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Stale, "{req:?}: {e}");
    }
    match send_meta(
        &meta,
        &MetaRequest::Renew {
            leases: vec![(node, lease)],
        },
    )
    .await
    .unwrap()
    {
        MetaReply::Renewed { lost, .. } => assert_eq!(lost, [node]),
        other => panic!("{other:?}"),
    }
    f.close().await.unwrap();
    assert_eq!(admin.get("/file").await.unwrap(), b"the admin's");
    // The root's records, by the container's id.
    let root_id = admin.lookup("/").await.unwrap().info().id;
    let e = send_meta(
        &meta,
        &MetaRequest::RecordNames {
            container: root_id,
            slots: vec![0, 1, 2],
        },
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::Stale, "{e}");
    // Another's snapshot reads as a gone one.
    let begun = send_meta(
        &raw(
            &t.cluster.meta_addr().to_string(),
            t.cluster.client_config().token.unwrap(),
        )
        .await,
        &MetaRequest::SnapshotBegin {
            path: "/secret".into(),
        },
    )
    .await
    .unwrap();
    let MetaReply::SnapshotBegun { id, .. } = begun else {
        panic!("{begun:?}")
    };
    let list = |id| MetaRequest::SnapshotList {
        id,
        entry: 0,
        block: 0,
    };
    let theirs = send_meta(&meta, &list(id)).await.unwrap_err();
    let gone = send_meta(&meta, &list(id + 1000)).await.unwrap_err();
    assert_eq!(shape(&theirs), shape(&gone), "{theirs} / {gone}");
    // The members' requests are refused before they are read.
    for req in [
        MetaRequest::Drain {
            server: t.cluster.stores[0].local_addr().to_string(),
            cancel: false,
        },
        MetaRequest::Policy { set: vec![] },
    ] {
        let e = send_meta(&meta, &req).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{req:?}: {e}");
    }
    // A put reserved ahead of its key belongs to no root: refused.
    let e = send_meta(
        &meta,
        &MetaRequest::Reserve {
            size_hint: 100,
            count: 4,
            storage_class: nodekernel_proto::NO_CLASS,
            location: String::new(),
        },
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");

    // The data port: blocks with capabilities only, no shared memory,
    // no server-to-server requests; a forged capability reads nothing.
    let loc = common::blocks_of(admin, "/secret/k").await[0].clone();
    let store = raw(&loc.addr, a_token).await;
    store.call(store_op::PING, &[]).await.expect("a ping");
    for op in [
        store_op::SHM_INFO,
        store_op::CLAIM,
        store_op::COPY,
        store_op::RESIZE,
        store_op::IDENTIFY,
    ] {
        let e = store.call(op, &[]).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthenticated, "op {op}: {e}");
    }
    let mut forged = loc.cap;
    forged.mac = [0x5a; 16];
    let req = StoreRequest::Read {
        block: loc.block,
        gen: loc.gen,
        offset: loc.offset,
        len: 1024,
        tag: None,
        cap: forged,
    };
    let mut b = BytesMut::new();
    req.encode(&mut b);
    let e = store.call(req.op(), &[&b]).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Stale, "{e}");
    assert!(e.message.contains("no valid capability"), "{e}");
    assert_eq!(admin.get("/secret/k").await.unwrap(), data);
}

/// The quota on a tenant's root caps the tenant, and a refusal names its
/// `/`; a quota above its root is named as its root's, without the other
/// subtree's numbers. Wrong and missing tokens change nothing; `/metrics`
/// carries each tenant's usage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_quota_holds_and_its_usage_is_measured() {
    let tokens = tempfile::tempdir().unwrap();
    let t = tenants_cluster(tokens.path()).await;
    let admin = &t.client;
    admin
        .set_quota("/tenants/a", Some(4 * common::BS), None)
        .await
        .unwrap();
    let a = client_of(&t, tokens.path(), "a").await;
    a.create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    let value = pattern(6, common::BS as usize);
    let mut stored = 0;
    let refusal = loop {
        match a.put(&format!("/t/k{stored}"), &value).await {
            Ok(()) => stored += 1,
            Err(e) => break e,
        }
        assert!(stored < 100, "the quota never refused");
    };
    assert_eq!(refusal.code, ErrorCode::QuotaExceeded, "{refusal}");
    assert_eq!(exceeded_root(&refusal), Some("/"), "{refusal}");
    assert!(!refusal.message.contains("/tenants"), "{refusal}");
    // Nothing partial: the refused key is not there.
    assert_eq!(
        a.enumerate("/t").await.unwrap().len(),
        stored,
        "only the stored keys"
    );
    assert!(a.du("/").await.unwrap().held <= 4 * common::BS);

    // A quota above the root: the refusal names a's root, not the
    // ancestor nor what its other subtrees hold.
    admin.clear_quota("/tenants/a").await.unwrap();
    admin
        .set_quota(
            "/tenants",
            None,
            Some(admin.du("/tenants").await.unwrap().nodes),
        )
        .await
        .unwrap();
    let e = a.mkdir("/more", false).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::QuotaExceeded, "{e}");
    assert_eq!(exceeded_root(&e), Some("/"), "{e}");
    assert!(
        !e.message.contains("tenants") && !e.message.contains("nodes below"),
        "{e}"
    );
    admin.clear_quota("/tenants").await.unwrap();

    // Wrong and missing tokens: refused, nothing changes.
    let before = admin.du("/").await.unwrap().nodes;
    for token in [
        None,
        Some(Arc::new(
            Token::new(b"not any tenant's token, 40 bytes long....", "x").unwrap(),
        )),
    ] {
        let mut cc = t.cluster.client_config();
        cc.token = token;
        let e = Client::connect(cc).await.err().expect("refused");
        assert_eq!(e.code, ErrorCode::Unauthenticated, "{e}");
    }
    assert_eq!(admin.du("/").await.unwrap().nodes, before);

    // The metrics: each tenant's usage, from its root's accounting.
    let held = admin.du("/tenants/a").await.unwrap().held;
    let s = scrape(t.cluster.meta.admin_addr().expect("meta.admin is on")).await;
    assert_eq!(
        sum(&s, "nodekernel_meta_tenant_used_bytes", &[("tenant", "a")]),
        held as f64
    );
    assert_eq!(
        sum(&s, "nodekernel_meta_tenant_used_nodes", &[("tenant", "a")]),
        (stored + 1) as f64
    );
    // Tenant b has nothing yet, and says so: a sample of 0, not none.
    assert_eq!(
        only(&s, "nodekernel_meta_tenant_used_nodes", &[("tenant", "b")]),
        Some(0.0)
    );
}

/// A tenant's clients talk to the one partition that keeps its root, so
/// a tenant rooted at `/` (in every partition) is refused at start by a
/// partitioned metadata server, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_rooted_at_slash_needs_one_metadata_partition() {
    let tokens = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(16 << 20, 0, &dir);
    cfg.security.token = Some(SECRET.into());
    cfg.security.tenant = vec![tenant(tokens.path(), "all", "/", &["read"])];
    let mut meta = cfg.meta_config().unwrap();
    meta.placement.partitions = 2;
    let e = nodekernel_meta::MetaServer::start(meta)
        .await
        .err()
        .expect("refused");
    let e = e.to_string();
    assert!(
        e.contains("security.tenant") && e.contains("spans all 2"),
        "{e}"
    );
}
