//! TTLs through a real cluster (`docs/lifecycle.md`): nodes and subtrees
//! expire, readers holding them get `Stale`, their space comes back, and
//! a node made to never expire stays. The times themselves are the state
//! machine's to get right (its tests move the clock); here every wait only
//! catches a hang.

use crate::admin::{scrape, sum};
use crate::common;

use common::{pattern, until_gone, used_blocks, BS};
use nodekernel_client::{CreateOptions, ErrorCode, NodeType, Ttl};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Generous: only a hang takes this long.
const HANG: Duration = Duration::from_secs(120);

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn ttl(ms: u64) -> Option<Ttl> {
    Some(Ttl::After(Duration::from_millis(ms)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_and_subtrees_expire_and_give_their_space_back() {
    let t = common::start(64 * BS, 0).await;
    let c = t.client.clone();
    // A Table with a value that stays, before the baseline.
    c.create("/t", NodeType::Table, CreateOptions::default())
        .await
        .unwrap();
    c.put("/t/stays", b"no ttl").await.unwrap();
    let baseline = used_blocks(&c).await;
    // A job directory whose children live a short while, and a value of
    // its own TTL.
    let before = wall_ms();
    let job = c
        .create(
            "/job",
            NodeType::Directory,
            CreateOptions {
                child_ttl: Some(Duration::from_millis(300)),
                ..CreateOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(job.info().child_ttl_ms, 300);
    assert_eq!(job.info().expires_ms, 0);
    let mut w = c
        .create("/job/data", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    let bytes = pattern(1, 3 * BS as usize);
    w.append(&bytes).await.unwrap();
    w.close().await.unwrap();
    let f = c.lookup("/job/data").await.unwrap();
    let expires = f.info().expires_ms;
    // The server's wall clock is its start time plus its monotonic clock,
    // each truncated to milliseconds: it may read a few behind this one.
    const SLACK_MS: u64 = 5;
    assert!(
        expires + SLACK_MS >= before + 300 && expires <= wall_ms() + 300 + SLACK_MS,
        "the child TTL counts from its create: {expires}, created after {before}"
    );
    // One that is kept: made to never expire.
    c.create("/job/kept", NodeType::File, CreateOptions::default())
        .await
        .unwrap()
        .close()
        .await
        .unwrap();
    assert_eq!(
        c.expire("/job/kept", Ttl::Never).await.unwrap().expires_ms,
        0
    );
    let put = CreateOptions {
        ttl: ttl(300),
        ..CreateOptions::default()
    };
    c.put_with("/t/k", b"short-lived", put).await.unwrap();
    assert!(c.lookup("/t/k").await.unwrap().info().expires_ms > 0);
    assert!(used_blocks(&c).await > baseline);
    // A reader holding the File when it expires.
    assert_eq!(f.read(0, 10).await.unwrap(), bytes[..10]);
    until_gone(&c, "/job/data").await;
    until_gone(&c, "/t/k").await;
    assert_eq!(c.get("/t/stays").await.unwrap(), b"no ttl");
    assert!(c.lookup("/job/kept").await.is_ok(), "never means never");
    let e = f.read(BS, 10).await.unwrap_err();
    assert!(
        matches!(e.code, ErrorCode::Stale | ErrorCode::NotFound),
        "a reader of an expired File: {e}"
    );
    // The whole directory: its kept child goes with it.
    c.expire("/job", Ttl::After(Duration::from_millis(1)))
        .await
        .unwrap();
    until_gone(&c, "/job").await;
    assert!(c.lookup("/job/kept").await.is_err());
    assert_eq!(c.enumerate("/t").await.unwrap(), vec!["stays".to_string()]);
    let start = Instant::now();
    loop {
        let used = used_blocks(&c).await;
        if used == baseline {
            break;
        }
        assert!(
            start.elapsed() < HANG,
            "the expired blocks never came back: {used} used, {baseline} before"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let metrics = scrape(t.cluster.meta.admin_addr().unwrap()).await;
    let expired = sum(&metrics, "nodekernel_meta_expired_total", &[]);
    assert!(expired >= 3.0, "{expired} expired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ttls_are_refused_and_leave_nothing() {
    let t = common::start(16 * BS, 0).await;
    let c = t.client.clone();
    let long = CreateOptions {
        ttl: Some(Ttl::After(Duration::from_secs(200 * 365 * 24 * 3600))),
        ..CreateOptions::default()
    };
    let e = c.create("/f", NodeType::File, long).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
    let child = CreateOptions {
        child_ttl: Some(Duration::from_secs(1)),
        ..CreateOptions::default()
    };
    let e = c.create("/f", NodeType::File, child).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
    assert_eq!(c.lookup("/f").await.unwrap_err().code, ErrorCode::NotFound);
    let e = c.expire("/", Ttl::After(Duration::from_secs(1))).await;
    assert_eq!(e.unwrap_err().code, ErrorCode::InvalidArgument);
}
