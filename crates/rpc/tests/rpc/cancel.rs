//! Cancel safety of `Connection::call` and `Connection::call_into`: calls
//! dropped at random points (inside `timeout`, lost `select!` races,
//! aborted tasks), many at once on one shared connection, never leave half
//! a frame on the socket, never leave a waiter behind, never leave a
//! direct reply's payload half read, and never mix up replies: every call
//! that completes, then and afterwards, gets exactly its own payload back.

use crate::common;

use bytes::Bytes;
use common::{connect, no_hang, start, Echo, Kind, Server};
use nodekernel_proto::Result;
use nodekernel_rpc::{Connection, ServeOptions};
use std::sync::Arc;
use std::time::Duration;

/// A small deterministic generator (no dependency needed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A payload that can only be the reply to its own call: its bytes derive
/// from `seed`, which differs for every call.
fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut v = Vec::with_capacity(len + 8);
    v.extend_from_slice(&seed.to_le_bytes());
    while v.len() < len {
        v.extend_from_slice(&r.next().to_le_bytes());
    }
    v.truncate(len.max(8));
    v
}

/// Sizes from tiny to several socket buffers (so that writes are often
/// partial and a drop often lands in the middle of a frame).
fn size(r: &mut Rng) -> usize {
    match r.below(6) {
        0 => r.below(64) as usize,
        1 => 1_000 + r.below(4_000) as usize,
        2 => 60_000 + r.below(10_000) as usize,
        3 => 500_000 + r.below(600_000) as usize,
        _ => 2_000_000 + r.below(2_000_000) as usize,
    }
}

/// Echoes `parts` (op 2), the reply either cut from the connection's
/// buffer or, with `direct`, received straight into a buffer of the
/// caller's (larger than the reply, as a reader's buffer may be).
async fn echo(conn: &Connection, direct: bool, parts: &[&[u8]]) -> Result<Bytes> {
    if !direct {
        return conn.call(2, parts).await;
    }
    let len: usize = parts.iter().map(|p| p.len()).sum();
    let mut buf = vec![0u8; len + 16];
    let n = conn.call_into(2, parts, &mut buf).await?;
    buf.truncate(n);
    Ok(Bytes::from(buf))
}

fn check(what: &str, seed: u64, sent: &[u8], got: nodekernel_proto::Result<bytes::Bytes>) {
    let got = got.unwrap_or_else(|e| panic!("{what} (call {seed:#x}) failed: {e}"));
    assert!(
        got[..] == sent[..],
        "{what} (call {seed:#x}): got {} bytes starting {:02x?}, sent {} starting {:02x?}",
        got.len(),
        &got[..got.len().min(16)],
        sent.len(),
        &sent[..sent.len().min(16)]
    );
}

/// One task's share of the chaos: `iters` calls, most of them dropped at
/// a random point.
async fn chaos(conn: Arc<Connection>, task: u64, round: u64, iters: u64) {
    let mut r = Rng((task << 32 | round) * 2 + 0x1234_5678_9ABC_DEF1);
    for i in 0..iters {
        let seed = (round << 40) | (task << 20) | i;
        let data = payload(seed, size(&mut r));
        let direct = r.below(2) == 0;
        match r.below(5) {
            // Completes normally.
            0 => check(
                "plain call",
                seed,
                &data,
                echo(&conn, direct, &[&data]).await,
            ),
            // Dropped by a timeout of 0 to 3 ms, anywhere in the call.
            1 => {
                let t = Duration::from_micros(r.below(3_000));
                if let Ok(got) = tokio::time::timeout(t, echo(&conn, direct, &[&data])).await {
                    check("call under timeout", seed, &data, got);
                }
            }
            // Loses a select! against a number of yields.
            2 => {
                let yields = r.below(40);
                let parts: [&[u8]; 1] = [&data];
                tokio::select! {
                    got = echo(&conn, direct, &parts) => check("call in select", seed, &data, got),
                    () = async {
                        for _ in 0..yields {
                            tokio::task::yield_now().await;
                        }
                    } => {}
                }
            }
            // Races another call on the same connection: the loser is
            // dropped, the winner must be right.
            3 => {
                let seed2 = seed | 1 << 60;
                let other = payload(seed2, size(&mut r));
                let parts: [&[u8]; 1] = [&data];
                let others: [&[u8]; 2] = [&other[..8], &other[8..]];
                tokio::select! {
                    got = echo(&conn, direct, &parts) => check("select race", seed, &data, got),
                    got = echo(&conn, !direct, &others) => {
                        check("select race", seed2, &other, got)
                    }
                }
            }
            // Runs in its own task, aborted after a random short sleep.
            _ => {
                let c = conn.clone();
                let d = data.clone();
                let task = tokio::spawn(async move {
                    let got = echo(&c, direct, &[&d]).await;
                    check("call in an aborted task", seed, &d, got);
                });
                tokio::time::sleep(Duration::from_micros(r.below(2_000))).await;
                task.abort();
                if let Err(e) = task.await {
                    assert!(e.is_cancelled(), "the call task panicked: {e}");
                }
            }
        }
    }
}

/// Every call after the chaos gets its own reply, concurrently and in
/// sequence, small and large.
async fn all_later_calls_are_right(conn: &Arc<Connection>, round: u64) {
    let mut tasks = Vec::new();
    for t in 0..8u64 {
        let c = conn.clone();
        tasks.push(tokio::spawn(async move {
            let mut r = Rng(t + 77);
            for i in 0..20u64 {
                let seed = (round << 40) | 0xF_0000 | (t << 8) | i;
                let data = payload(seed, size(&mut r));
                check(
                    "call after the chaos",
                    seed,
                    &data,
                    echo(&c, i.is_multiple_of(2), &[&data]).await,
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_dropped_at_random_points_never_corrupt_the_connection() {
    for (spin, kind) in [
        (Duration::ZERO, Kind::Tcp),
        (Duration::from_micros(50), Kind::Tcp),
        (Duration::ZERO, Kind::Unix),
        (Duration::from_micros(50), Kind::Unix),
    ] {
        let server: Server = start(kind, Arc::new(Echo::default()), ServeOptions::default()).await;
        let conn = Arc::new(connect(&server.addr, spin).await);
        // Until several frames were abandoned mid-write and several direct
        // replies mid-payload (the cases that matter), but at least three
        // rounds.
        let mut round = 0;
        while round < 3 || conn.abandoned_frames() < 5 || conn.abandoned_replies() < 5 {
            let tasks: Vec<_> = (0..8u64)
                .map(|t| tokio::spawn(chaos(conn.clone(), t, round, 25)))
                .collect();
            no_hang("a round of dropped calls", async {
                for t in tasks {
                    t.await.unwrap();
                }
            })
            .await;
            // Every dropped call removed its waiter.
            assert_eq!(conn.pending_calls(), 0, "{kind:?}, spin {spin:?}");
            no_hang(
                "calls after the round",
                all_later_calls_are_right(&conn, round),
            )
            .await;
            assert!(!conn.is_closed(), "{kind:?}, spin {spin:?}");
            round += 1;
            assert!(
                round < 1_000,
                "{kind:?}, spin {spin:?}: too few calls dropped mid-frame ({}) or mid-reply \
                 ({}) in 1000 rounds",
                conn.abandoned_frames(),
                conn.abandoned_replies()
            );
        }
        assert_eq!(conn.pending_calls(), 0);
        // The server never saw a broken frame.
        assert_eq!(server.malformed_frames(), 0, "{kind:?}, spin {spin:?}");
        assert_eq!(server.connections(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rest_of_an_abandoned_frame_goes_out_without_a_next_caller() {
    // The rest of an abandoned frame is sent on its own (from a task), so
    // the server gets the whole frame and handles it even if nobody calls
    // again; its reply is discarded on arrival.
    let echo = Arc::new(Echo::default());
    let server = start(Kind::Unix, echo.clone(), ServeOptions::default()).await;
    let conn = connect(&server.addr, Duration::ZERO).await;
    let mut seed = 0;
    while conn.abandoned_frames() == 0 {
        seed += 1;
        assert!(seed < 1_000, "never dropped a call mid-frame");
        let data = payload(seed, 8 << 20);
        let _ = tokio::time::timeout(Duration::from_micros(200), conn.call(2, &[&data])).await;
    }
    // `seed` is the call dropped mid-frame.
    assert_eq!(conn.pending_calls(), 0);
    common::eventually("the server to handle the abandoned request", || {
        echo.saw(seed)
    })
    .await;
    let small = payload(1 << 50, 100);
    check("next call", 1 << 50, &small, conn.call(2, &[&small]).await);
    assert_eq!(server.malformed_frames(), 0);
    assert!(!conn.is_closed());
}
