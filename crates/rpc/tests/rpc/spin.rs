//! Adaptive busy-polling (`nodekernel_rpc::spin`): a connection whose
//! replies, or a server connection whose requests, keep coming later than
//! its spin budget stops spinning, and spins again once they come soon.
//! Budgets are milliseconds here and the slow side sleeps ten times longer,
//! so a loaded machine cannot blur "soon" and "late"; nothing is timed.

use crate::common;

use common::{connect, no_hang, start, Echo, Kind};
use nodekernel_rpc::ServeOptions;
use std::sync::Arc;
use std::time::Duration;

const BUDGET: Duration = Duration::from_millis(5);
/// Far past `nodekernel_rpc::spin::WITHIN` budgets.
const LATE_MS: u8 = 100;

/// Up to this many calls may pass before the connection changes its mind
/// (the moving average needs a few; a loaded machine may need more).
const PATIENCE: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_stops_spinning_for_late_replies_and_resumes_for_prompt_ones() {
    for kind in [Kind::Tcp, Kind::Unix] {
        let server = start(kind, Arc::new(Echo::default()), ServeOptions::default()).await;
        let conn = connect(&server.addr, BUDGET).await;
        assert!(conn.spinning(), "{kind:?}: a new connection spins");
        // op 1 echoes after the first payload byte's milliseconds.
        let late = calls_until(&conn, 1, &[LATE_MS], PATIENCE, || !conn.spinning()).await;
        assert!(late >= 2, "{kind:?}: one late reply must not stop spinning");
        calls_until(&conn, 2, b"x", PATIENCE, || conn.spinning()).await;
    }
}

/// Calls `op` with `payload` until `done` holds (checked before each call);
/// returns how many calls that took, failing after `limit`.
async fn calls_until(
    conn: &nodekernel_rpc::Connection,
    op: u16,
    payload: &[u8],
    limit: usize,
    done: impl Fn() -> bool,
) -> usize {
    let mut calls = 0;
    while !done() {
        no_hang("call", conn.call(op, &[payload])).await.unwrap();
        calls += 1;
        assert!(
            calls < limit,
            "still not there after {calls} calls of op {op}"
        );
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_connection_stops_spinning_when_requests_come_seldom() {
    let opts = ServeOptions {
        spin: BUDGET,
        ..ServeOptions::default()
    };
    let server = start(Kind::Tcp, Arc::new(Echo::default()), opts).await;
    let conn = connect(&server.addr, Duration::ZERO).await;
    // Seldom requests: the gaps are far longer than the budget. Each idle
    // period spins until the connection learns; then the count stands.
    let mut gaps = 0;
    let mut last = server.idle_spins();
    let mut unchanged = 0;
    while unchanged < 5 {
        tokio::time::sleep(Duration::from_millis(LATE_MS as u64)).await;
        no_hang("call", conn.call(2, &[b"x"])).await.unwrap();
        let now = server.idle_spins();
        unchanged = if now == last { unchanged + 1 } else { 0 };
        last = now;
        gaps += 1;
        assert!(
            gaps < PATIENCE,
            "the server still spins after {gaps} long gaps"
        );
    }
    assert!(last >= 1, "an idle connection spun at first");
    // Back-to-back requests: it spins again.
    calls_until(&conn, 2, b"x", PATIENCE * 10, || {
        server.idle_spins() != last
    })
    .await;
}
