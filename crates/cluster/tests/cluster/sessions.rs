//! Sessions through a real cluster (`docs/lifecycle.md`, *Sessions*): what
//! a session binds goes when it is closed, or when its client stops
//! renewing it (here: the runtime its renewals ran on is shut down, as a
//! process that dies or hangs stops them); everything else stays. The
//! lease arithmetic is the state machine's (its tests move the clock);
//! every wait here only catches a hang.

use crate::admin::{scrape, sum};
use crate::common;

use common::{pattern, until_gone, used_blocks, BS};
use nodekernel_client::{Client, CreateOptions, ErrorCode, NodeType, Session};
use std::time::{Duration, Instant};

/// Generous: only a hang takes this long.
const HANG: Duration = Duration::from_secs(120);

fn bound(s: &Session) -> CreateOptions {
    CreateOptions {
        session: Some(s.clone()),
        ..CreateOptions::default()
    }
}

/// A job directory bound to `s` with a 3-block File in it.
async fn job(c: &Client, s: &Session, dir: &str) {
    c.create(dir, NodeType::Directory, bound(s)).await.unwrap();
    let mut w = c
        .create(
            &format!("{dir}/part-0"),
            NodeType::File,
            CreateOptions::default(),
        )
        .await
        .unwrap();
    w.append(&pattern(7, 3 * BS as usize)).await.unwrap();
    w.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_removes_what_it_bound_and_nothing_else() {
    let t = common::start(64 * BS, 0).await;
    let c = t.client.clone();
    c.mkdir("/jobs", false).await.unwrap();
    let mut w = c
        .create("/jobs/keep", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    w.append(b"stays").await.unwrap();
    w.close().await.unwrap();
    let baseline = used_blocks(&c).await;

    let s = c.session(Duration::from_secs(30)).await.unwrap();
    assert_eq!(s.lease(), Duration::from_secs(30));
    let admin = t.cluster.meta.admin_addr().expect("meta.admin is on");
    assert_eq!(
        sum(&scrape(admin).await, "nodekernel_meta_sessions_open", &[]),
        1.0
    );
    job(&c, &s, "/jobs/j1").await;
    // A reader holds the bound File when the session ends.
    let r = c.lookup("/jobs/j1/part-0").await.unwrap();
    assert_eq!(
        r.read(0, 10).await.unwrap(),
        pattern(7, 3 * BS as usize)[..10]
    );
    assert!(used_blocks(&c).await > baseline);
    s.close().await.unwrap();
    assert!(s.has_ended());
    // Gone before any later request sees it, with its subtree.
    for p in ["/jobs/j1", "/jobs/j1/part-0"] {
        assert_eq!(
            c.lookup(p).await.unwrap_err().code,
            ErrorCode::NotFound,
            "{p}"
        );
    }
    let keep = c.lookup("/jobs/keep").await.unwrap();
    assert_eq!(keep.read(0, 5).await.unwrap(), b"stays");
    // The metrics: the session is no longer open; its one bound node was
    // removed with it (and counted as expired); it did not lapse.
    let m = scrape(admin).await;
    assert_eq!(sum(&m, "nodekernel_meta_sessions_open", &[]), 0.0);
    assert_eq!(sum(&m, "nodekernel_meta_session_removed_total", &[]), 1.0);
    assert_eq!(sum(&m, "nodekernel_meta_expired_total", &[]), 1.0);
    assert_eq!(sum(&m, "nodekernel_meta_sessions_lapsed_total", &[]), 0.0);
    let e = r.read(BS, 10).await.unwrap_err();
    assert!(
        matches!(e.code, ErrorCode::Stale | ErrorCode::NotFound),
        "a reader of a removed File: {e}"
    );
    let start = Instant::now();
    while used_blocks(&c).await > baseline {
        assert!(start.elapsed() < HANG, "the job's blocks never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Nothing more is bound to it.
    let e = c
        .create("/jobs/j2", NodeType::Directory, bound(&s))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    assert_eq!(
        c.lookup("/jobs/j2").await.unwrap_err().code,
        ErrorCode::NotFound
    );
    s.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_client_stops_renewing_lapses_and_its_subtree_goes() {
    let t = common::start(64 * BS, 0).await;
    let c = t.client.clone();
    c.mkdir("/jobs", false).await.unwrap();
    // Another client, on a runtime of its own, as another process would be.
    let meta = t.cluster.client_config();
    let (tx, rx) = std::sync::mpsc::channel();
    let other = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let c = Client::connect(meta).await.unwrap();
            let s = c.session(Duration::from_secs(3)).await.unwrap();
            job(&c, &s, "/jobs/dies").await;
            // Renewed for a while: more than a lease passes (3 s leases: a stall of 2 s is survived) and it lives on.
            tokio::time::sleep(Duration::from_millis(4_000)).await;
            tx.send(()).unwrap();
            // Then the process "dies": its runtime stops, and with it
            // every renewal (and the close a drop would send).
            std::mem::forget(s);
        });
        rt.shutdown_background();
    });
    rx.recv_timeout(HANG).unwrap();
    assert!(
        c.lookup("/jobs/dies/part-0").await.is_ok(),
        "a renewed session outlives its lease"
    );
    other.join().unwrap();
    until_gone(&c, "/jobs/dies").await;
    assert!(c.lookup("/jobs").await.is_ok());
    let admin = t.cluster.meta.admin_addr().expect("meta.admin is on");
    let m = scrape(admin).await;
    assert_eq!(sum(&m, "nodekernel_meta_sessions_lapsed_total", &[]), 1.0);
    assert_eq!(sum(&m, "nodekernel_meta_session_removed_total", &[]), 1.0);
    assert_eq!(sum(&m, "nodekernel_meta_sessions_open", &[]), 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_bound_only_by_the_client_that_opened_it() {
    let t = common::start(64 * BS, 0).await;
    let c = t.client.clone();
    let s = c.session(Duration::from_secs(30)).await.unwrap();
    let other = Client::connect(t.cluster.client_config()).await.unwrap();
    let e = other
        .create("/x", NodeType::Directory, bound(&s))
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
    assert_eq!(c.lookup("/x").await.unwrap_err().code, ErrorCode::NotFound);
    // Dropping the last handle closes it in the background.
    c.create("/y", NodeType::Directory, bound(&s))
        .await
        .unwrap();
    drop(s);
    until_gone(&c, "/y").await;
}
