//! Puts in one exchange (`docs/small-values.md`, *Puts in one exchange*),
//! through a real cluster on both data paths: a client putting small
//! values one after another puts each through a reservation, closed at its
//! key by one `link`; the values, their replacements and the table's
//! listing are those of ordinary puts; a table whose values go to another
//! class, or a key that cannot be put, goes the usual way.

use crate::admin::{scrape, sum};
use crate::common;

use common::pattern;
use nodekernel_client::{Client, CreateOptions, ErrorCode, NodeType};

/// Metadata requests of kind `op` the server has served.
async fn served(t: &common::TestCluster, op: &str) -> f64 {
    let addr = t.cluster.meta.admin_addr().expect("meta.admin is on");
    sum(
        &scrape(addr).await,
        "nodekernel_meta_requests_total",
        &[("op", op)],
    )
}

fn value(key: u64, round: u64) -> Vec<u8> {
    pattern(key << 32 | round, 100)
}

async fn check_all(c: &Client, keys: u64, round: u64) {
    for k in 0..keys {
        assert_eq!(
            c.get(&format!("/t/k{k}")).await.unwrap(),
            value(k, round),
            "key {k}"
        );
    }
}

on_both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    a_stream_of_small_puts_puts_each_in_one_exchange => stream_of_puts
);

/// 300 puts of new keys and 300 replacing ones: most are links of
/// reserved puts, not creates and closes, and every value, every
/// replacement and the listing read back as after ordinary puts.
async fn stream_of_puts(shared_memory: bool) {
    const KEYS: u64 = 300;
    let t = common::start_on_path(64 << 20, 0, shared_memory).await;
    let c = &t.client;
    c.create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    let (creates, links) = (served(&t, "create").await, served(&t, "link").await);
    for round in 0..2 {
        for k in 0..KEYS {
            c.put(&format!("/t/k{k}"), &value(k, round)).await.unwrap();
        }
        check_all(c, KEYS, round).await;
    }
    let created = served(&t, "create").await - creates;
    let linked = served(&t, "link").await - links;
    // Most, not all: a put that finds its pool empty while a refill is on
    // its way (a busy machine) goes the usual way.
    assert!(
        linked >= KEYS as f64 && created <= KEYS as f64,
        "{linked} of {} puts linked, {created} created",
        2 * KEYS
    );
    assert!(served(&t, "reserve").await >= 1.0);
    let mut names = c.enumerate("/t").await.unwrap();
    names.sort();
    let mut want: Vec<String> = (0..KEYS).map(|k| format!("k{k}")).collect();
    want.sort();
    assert_eq!(names, want, "one record per key");
    // The unused reservations show as such, a client's worth at most.
    let held = reserved_more_than(c, 0).await;
    assert!(held <= 32, "{held}");
    assert_eq!(c.status().await.unwrap().puts_in_progress, 0);
    // A get through a handle of a replaced value is Stale, as ever.
    let old = c.lookup("/t/k0").await.unwrap();
    c.put("/t/k0", &value(0, 9)).await.unwrap();
    assert_eq!(old.read(0, 100).await.unwrap_err().code, ErrorCode::Stale);
    assert_eq!(c.get("/t/k0").await.unwrap(), value(0, 9));
    common::assert_data_path(&t, c, shared_memory);

    // A client that goes away gives back what it reserved.
    let c2 = t.cluster.client().await.unwrap();
    for k in 0..50 {
        c2.put(&format!("/t/k{k}"), &value(k, 3)).await.unwrap();
    }
    reserved_more_than(c, held).await;
    drop(c2);
    // Against what `c` holds now, not `held`: a refill `c` asked for may
    // land meanwhile. (Read before the cluster's count, so a refill landing
    // in between only makes this wait longer.)
    let back = tokio::time::timeout(std::time::Duration::from_secs(120), async {
        loop {
            let mine = c.reserved_puts_held();
            if c.status().await.unwrap().reserved_puts <= mine {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    });
    back.await
        .expect("the reservations of a dropped client are given back");
    t.cluster.shutdown();
}

/// The reserved puts in the cluster once there are more than `held`:
/// refills run in the background, so the one the last puts asked for may
/// still be on its way (the bound only catches a hang).
async fn reserved_more_than(c: &Client, held: u64) -> u64 {
    let wait = async {
        loop {
            let n = c.status().await.unwrap().reserved_puts;
            if n > held {
                return n;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(120), wait)
        .await
        .unwrap_or_else(|_| panic!("no more than {held} puts reserved"))
}

/// A Table whose values go to the file class: its puts are created the
/// usual way (reservations go where the root's values go) and land in
/// its class; a put into a table that does not exist, or at a path that
/// is no table's key, fails as it always did, and the puts after it
/// still link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_that_reservations_cannot_serve_go_the_usual_way() {
    let t = common::start(16 << 20, 16 << 20).await;
    let c = &t.client;
    let file = CreateOptions {
        storage_class: Some(1),
        ..CreateOptions::default()
    };
    c.create("/f", NodeType::Table, file).await.unwrap();
    c.create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    c.mkdir("/d", false).await.unwrap();
    for k in 0..50 {
        c.put(&format!("/f/k{k}"), &value(k, 0)).await.unwrap();
    }
    for k in 0..50 {
        let n = c.lookup(&format!("/f/k{k}")).await.unwrap();
        assert_eq!(n.info().first_block.as_ref().unwrap().class, 1, "k{k}");
        assert_eq!(c.get(&format!("/f/k{k}")).await.unwrap(), value(k, 0));
    }
    let creates = served(&t, "create").await;
    for k in 0..20 {
        c.put(&format!("/t/k{k}"), &value(k, 1)).await.unwrap();
        let e = c.put("/gone/k", b"x").await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound, "{e}");
        let e = c.put("/d/k", b"x").await.unwrap_err();
        assert_eq!(e.code, ErrorCode::TypeMismatch, "{e}");
    }
    for k in 0..20 {
        assert_eq!(c.get(&format!("/t/k{k}")).await.unwrap(), value(k, 1));
    }
    // Each refused put tried its create too; the table's puts linked.
    let created = served(&t, "create").await - creates;
    assert!(
        created <= 40.0 + 4.0,
        "{created} creates for 20 puts and 40 refused ones"
    );
    t.cluster.shutdown();
}
