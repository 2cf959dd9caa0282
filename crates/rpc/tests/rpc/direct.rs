//! `Connection::call_into`: a reply's payload is received by the kernel
//! straight into the caller's buffer, with no intermediate buffer and no
//! copy, however it is mixed with ordinary calls; replies that do not fit
//! and error replies are reported, and the connection goes on.

use crate::common;

use common::{connect, no_hang, start, Echo, Kind};
use nodekernel_proto::ErrorCode;
use nodekernel_rpc::{ServeOptions, DIRECT_REPLY_MIN};
use std::sync::Arc;
use std::time::Duration;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const SIZES: [usize; 7] = [1, 100, 4096, 65_536, 1 << 20, (4 << 20) + 3, 16 << 20];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_land_in_the_callers_buffer_without_a_copy() {
    for kind in [Kind::Tcp, Kind::Unix] {
        for spin in [Duration::ZERO, Duration::from_micros(50)] {
            let server = start(kind, Arc::new(Echo::default()), ServeOptions::default()).await;
            let conn = connect(&server.addr, spin).await;
            let (mut expected_direct, mut expected_small) = (0, 0);
            for (i, &len) in SIZES.iter().enumerate() {
                let sent = pattern(len, i as u8);
                // Not zeroed in between: stale bytes would show.
                let mut buf = vec![0xEEu8; len + 7];
                let n = no_hang("a direct call", conn.call_into(2, &[&sent], &mut buf))
                    .await
                    .unwrap();
                assert_eq!(n, len, "{kind:?}");
                assert!(buf[..n] == sent[..], "{kind:?}, {len} bytes: wrong payload");
                assert!(buf[n..].iter().all(|&b| b == 0xEE), "wrote past the reply");
                if buf.len() >= DIRECT_REPLY_MIN {
                    expected_direct += len as u64;
                } else {
                    expected_small += len as u64;
                }
                // An ordinary call in between changes nothing.
                let small = pattern(10, 7);
                let got = conn.call(2, &[&small]).await.unwrap();
                assert_eq!(&got[..], &small[..]);
            }
            let copies = conn.reply_copies();
            assert_eq!(
                copies.staged(),
                0,
                "{kind:?}, spin {spin:?}: bytes of direct replies went through the receive buffer"
            );
            assert_eq!(copies.direct(), expected_direct, "{kind:?}, spin {spin:?}");
            // Small buffers take their replies the usual way, copied once.
            assert_eq!(copies.small(), expected_small, "{kind:?}, spin {spin:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_and_ordinary_calls_in_flight_together_each_get_their_own_reply() {
    let server = start(
        Kind::Tcp,
        Arc::new(Echo::default()),
        ServeOptions::default(),
    )
    .await;
    let conn = Arc::new(connect(&server.addr, Duration::from_micros(50)).await);
    let tasks: Vec<_> = (0..8u8)
        .map(|t| {
            let conn = conn.clone();
            tokio::spawn(async move {
                for round in 0..20usize {
                    let len = SIZES[(t as usize + round) % 6];
                    let sent = pattern(len, t.wrapping_mul(13).wrapping_add(round as u8));
                    if (t as usize + round).is_multiple_of(2) {
                        let mut buf = vec![0u8; len];
                        let n = conn.call_into(2, &[&sent], &mut buf).await.unwrap();
                        assert_eq!(n, len);
                        assert!(buf == sent, "task {t} round {round}: wrong direct reply");
                    } else {
                        let got = conn.call(2, &[&sent]).await.unwrap();
                        assert!(got[..] == sent[..], "task {t} round {round}: wrong reply");
                    }
                }
            })
        })
        .collect();
    no_hang("mixed calls", async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await;
    assert_eq!(conn.pending_calls(), 0);
    assert!(!conn.is_closed());
    // Concurrent ordinary replies may be read ahead together with a direct
    // reply's first bytes; most of the bytes still went straight through.
    let c = conn.reply_copies();
    assert!(
        c.direct() > c.staged() * 4,
        "direct {} staged {}",
        c.direct(),
        c.staged()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_does_not_fit_or_an_error_reply_fails_only_its_call() {
    let server = start(
        Kind::Unix,
        Arc::new(Echo::default()),
        ServeOptions::default(),
    )
    .await;
    let conn = connect(&server.addr, Duration::ZERO).await;
    let sent = pattern(1 << 20, 3);
    let mut small = vec![0u8; 1000];
    let e = conn.call_into(2, &[&sent], &mut small).await.unwrap_err();
    assert_eq!(e.code, ErrorCode::Protocol, "{e}");
    assert!(e.message.contains("1048576"), "{e}");
    // An error reply (op 3) reaches a direct caller as its error.
    let e = conn
        .call_into(3, &[&sent[..5]], &mut small)
        .await
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
    // The skipped reply left the stream at a frame boundary.
    let mut buf = vec![0u8; sent.len()];
    assert_eq!(
        conn.call_into(2, &[&sent], &mut buf).await.unwrap(),
        sent.len()
    );
    assert!(buf == sent);
    let got = conn.call(2, &[b"after"]).await.unwrap();
    assert_eq!(&got[..], b"after");
    assert!(!conn.is_closed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_call_dropped_mid_payload_leaves_the_connection_usable() {
    // A reply of 16 MiB takes long enough over loopback that a call
    // dropped after a few hundred microseconds is almost always dropped
    // while its payload is arriving; keep trying until one was.
    let server = start(
        Kind::Tcp,
        Arc::new(Echo::default()),
        ServeOptions::default(),
    )
    .await;
    let conn = connect(&server.addr, Duration::ZERO).await;
    let big = pattern(16 << 20, 9);
    let mut buf = vec![0u8; big.len()];
    let mut tries = 0;
    while conn.abandoned_replies() == 0 {
        tries += 1;
        assert!(tries < 200, "never dropped a direct call mid-payload");
        let wait = Duration::from_micros(200 * tries);
        let _ = tokio::time::timeout(wait, conn.call_into(2, &[&big], &mut buf)).await;
        // Later calls, direct and ordinary, are right.
        let sent = pattern(70_000, tries as u8);
        let mut b = vec![0u8; sent.len()];
        let n = no_hang(
            "a call after a dropped one",
            conn.call_into(2, &[&sent], &mut b),
        )
        .await
        .unwrap();
        assert_eq!(n, sent.len());
        assert!(
            b == sent,
            "try {tries}: a later direct call got the wrong bytes"
        );
        let got = conn.call(2, &[b"next"]).await.unwrap();
        assert_eq!(&got[..], b"next");
    }
    assert_eq!(conn.pending_calls(), 0);
    assert!(!conn.is_closed());
}

/// A handler whose op 9 replies with a byte prefix from the reply buffer,
/// then a body sent straight from memory it does not own, then a trailer
/// computed after the body went out.
struct Shared {
    sealed: Arc<std::sync::atomic::AtomicUsize>,
}

static BODY: std::sync::LazyLock<Vec<u8>> = std::sync::LazyLock::new(|| pattern(3 << 20, 42));

struct StaticBody(Arc<std::sync::atomic::AtomicUsize>);

// SAFETY: `BODY` lives for the whole program.
unsafe impl nodekernel_rpc::SharedBody for StaticBody {
    fn bytes(&self) -> (*const u8, usize) {
        (BODY.as_ptr(), BODY.len())
    }
    fn trailer_len(&self) -> usize {
        2
    }
    fn seal(&self, out: &mut bytes::BytesMut) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        out.extend_from_slice(b"OK");
    }
}

impl nodekernel_rpc::Handler for Shared {
    async fn handle(
        &self,
        _op: u16,
        payload: bytes::Bytes,
        out: &mut bytes::BytesMut,
    ) -> nodekernel_proto::Result<()> {
        out.extend_from_slice(&payload);
        Ok(())
    }

    async fn handle_reply(
        &self,
        op: u16,
        payload: bytes::Bytes,
        reply: &mut nodekernel_rpc::Reply,
    ) -> nodekernel_proto::Result<()> {
        if op != 9 {
            return self.handle(op, payload, reply.out()).await;
        }
        reply.out().extend_from_slice(b"head:");
        reply.set_body(Box::new(StaticBody(self.sealed.clone())));
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_body_goes_out_after_the_reply_bytes_and_before_its_trailer() {
    let sealed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for kind in [Kind::Tcp, Kind::Unix] {
        let handler = Arc::new(Shared {
            sealed: sealed.clone(),
        });
        let server = start(kind, handler, ServeOptions::default()).await;
        let conn = connect(&server.addr, Duration::ZERO).await;
        // Whole, through the receive buffer.
        let got = conn.call(9, &[b"x"]).await.unwrap();
        assert_eq!(got.len(), 5 + BODY.len() + 2, "{kind:?}");
        assert_eq!(&got[..5], b"head:");
        assert!(got[5..5 + BODY.len()] == BODY[..], "{kind:?}: the body");
        assert_eq!(&got[5 + BODY.len()..], b"OK");
        // Direct, the trailer into its own buffer; ordinary replies in
        // between are untouched.
        for _ in 0..3 {
            let mut buf = Vec::with_capacity(5 + BODY.len());
            let mut trailer = [0u8; 2];
            let n = conn
                .call_into_uninit(9, &[b"x"], buf.spare_capacity_mut(), &mut trailer)
                .await
                .unwrap();
            // SAFETY: `n` bytes were received.
            unsafe { buf.set_len(n) };
            assert_eq!(n, 5 + BODY.len());
            assert!(buf[5..] == BODY[..], "{kind:?}: the body, direct");
            assert_eq!(&trailer, b"OK");
            assert_eq!(&conn.call(2, &[b"plain"]).await.unwrap()[..], b"plain");
        }
        assert_eq!(conn.reply_copies().staged(), 0, "{kind:?}");
    }
    assert_eq!(sealed.load(std::sync::atomic::Ordering::SeqCst), 8);
}
