//! Claims in a one-process cluster (`nk up`): the metadata server hands a
//! storage server of its own process the claims of replacing puts and
//! deletes by a call, not by a request over loopback, with the same
//! effect (an old handle gets `Stale` as soon as the put returns); a store
//! that stopped gets its claims the usual way, which keeps them for a
//! retry.

use crate::admin::{scrape, sum};
use crate::common;

use common::{config, pattern, start_with, PutFile, BS};
use nodekernel_client::{CreateOptions, NodeType};
use nodekernel_proto::ErrorCode;

const KIB: u64 = 1 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacing_put_claims_the_old_value_by_a_call() {
    for shared_memory in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(64 << 20, 0, &dir);
        cfg.client.shared_memory = shared_memory;
        let t = start_with(cfg, dir).await;
        let c = &t.client;
        let meta = t.cluster.meta.admin_addr().expect("meta admin");
        let store = t.cluster.stores[0].admin_addr().expect("store admin");
        c.create("/t", NodeType::Table, CreateOptions::default())
            .await
            .unwrap();
        // A small value (a piece: its tag is cleared) and one of whole
        // blocks (their generations move on).
        for (key, len) in [("small", 100usize), ("large", 3 * 64 * KIB as usize)] {
            let path = format!("/t/{key}");
            c.put(&path, &pattern(1, len)).await.unwrap();
            let old = c.lookup(&path).await.unwrap();
            let before = scrape(meta).await;
            c.put(&path, &pattern(2, len)).await.unwrap();
            // Claimed before the put returned: the old handle is stale now.
            let e = old.read(0, len as u64).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::Stale, "{key} ({shared_memory}): {e}");
            assert_eq!(c.get(&path).await.unwrap(), pattern(2, len));
            let after = scrape(meta).await;
            let calls = |s| sum(s, "nodekernel_meta_claims_total", &[("via", "call")]);
            assert!(
                calls(&after) > calls(&before),
                "{key}: the replacing put's claim was not a call"
            );
        }
        c.delete("/t/small", false).await.unwrap();
        let m = scrape(meta).await;
        assert_eq!(
            sum(&m, "nodekernel_meta_claims_total", &[("via", "request")]),
            0.0,
            "no claim crossed a socket"
        );
        assert_eq!(sum(&m, "nodekernel_meta_pending_claims", &[]), 0.0);
        // The store counts them as the requests they stand for.
        let s = scrape(store).await;
        assert!(sum(&s, "nodekernel_store_requests_total", &[("op", "claim")]) >= 3.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_store_gets_its_claims_the_usual_way_and_keeps_them_for_a_retry() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(16 << 20, 0, &dir);
    // Two DRAM stores of one class, taken in turn.
    let mut stores = cfg.up_stores();
    stores.insert(1, stores[0].clone());
    cfg.store = stores;
    cfg.meta.expect_servers = Some(cfg.store.len() as u32);
    let t = start_with(cfg, dir).await;
    let c = &t.client;
    let meta = t.cluster.meta.admin_addr().expect("meta admin");
    c.create("/d", NodeType::Directory, CreateOptions::default())
        .await
        .unwrap();
    // Files of one whole block each, on either store.
    let stopped = t.cluster.stores[1].advertised_addr().to_string();
    let mut on_stopped = None;
    for i in 0..8 {
        let path = format!("/d/f{i}");
        c.put_file(&path, &pattern(i, BS as usize)).await;
        if common::blocks_of(c, &path)
            .await
            .iter()
            .all(|b| b.addr == stopped)
        {
            on_stopped = Some(path);
            break;
        }
    }
    let path = on_stopped.expect("a File on the second store");
    let before = scrape(meta).await;
    t.cluster.stores[1].shutdown();
    // The metadata server still counts the store alive (dead only after
    // minutes here): the delete's claims are for it. Nobody listens at its
    // address any more, so they are kept and the delete answers anyway.
    c.delete(&path, false).await.unwrap();
    let after = scrape(meta).await;
    let calls = |s| sum(s, "nodekernel_meta_claims_total", &[("via", "call")]);
    assert_eq!(calls(&after), calls(&before), "no call to a stopped store");
    assert!(
        sum(&after, "nodekernel_meta_pending_claims", &[]) >= 1.0,
        "the claims wait for a retry"
    );
}
