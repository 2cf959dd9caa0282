//! Requests received in place (`Handler::direct_prefix`): the bulk data of
//! a large request goes from the socket straight into memory the handler
//! names, not through the connection's buffer; everything else takes the
//! usual path, and a peer that dies or stalls mid-frame only loses its own
//! connection.

use crate::common;

use bytes::{Bytes, BytesMut};
use common::{closed_by_server, connect, frame, no_hang, raw_peer, read_frame, start, Kind};
use nodekernel_proto::Result;
use nodekernel_rpc::{DirectSink, Handler, ServeOptions, DIRECT_MIN};
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// The op whose payload is an 8-byte prefix and then data.
const OP: u16 = 5;
const PREFIX: usize = 8;

/// Echoes op 5's data after its prefix, taking it in place unless the
/// prefix's first byte is 1 (then it declines). Counts how each path ran
/// and records the bytes every sink held when it was dropped.
#[derive(Default)]
struct Sinks {
    usual: AtomicUsize,
    direct: AtomicUsize,
    dropped: Arc<Mutex<Vec<Vec<u8>>>>,
}

/// Heap memory standing in for a DRAM block.
struct VecSink {
    mem: Box<[u8]>,
    dropped: Arc<Mutex<Vec<Vec<u8>>>>,
}

// SAFETY: `mem` is owned by the sink and never moves (a boxed slice).
unsafe impl DirectSink for VecSink {
    fn dest(&self) -> (*mut u8, usize) {
        (self.mem.as_ptr().cast_mut(), self.mem.len())
    }
}

impl Drop for VecSink {
    fn drop(&mut self) {
        self.dropped.lock().unwrap().push(self.mem.to_vec());
    }
}

impl Handler for Sinks {
    async fn handle(&self, op: u16, payload: Bytes, out: &mut BytesMut) -> Result<()> {
        assert_eq!(op, OP);
        self.usual.fetch_add(1, Ordering::SeqCst);
        out.extend_from_slice(&payload[PREFIX..]);
        Ok(())
    }

    fn direct_prefix(&self, op: u16) -> Option<usize> {
        (op == OP).then_some(PREFIX)
    }

    fn direct_sink(
        &self,
        _op: u16,
        prefix: &[u8],
        data_len: usize,
    ) -> impl Future<Output = Result<Option<Box<dyn DirectSink>>>> + Send {
        let sink: Option<Box<dyn DirectSink>> = (prefix[0] != 1).then(|| {
            Box::new(VecSink {
                mem: vec![0u8; data_len].into_boxed_slice(),
                dropped: self.dropped.clone(),
            }) as Box<dyn DirectSink>
        });
        async move { Ok(sink) }
    }

    async fn handle_direct(
        &self,
        _op: u16,
        prefix: Bytes,
        sink: Box<dyn DirectSink>,
        out: &mut BytesMut,
    ) -> Result<()> {
        assert_eq!(prefix.len(), PREFIX);
        self.direct.fetch_add(1, Ordering::SeqCst);
        let (ptr, len) = sink.dest();
        // SAFETY: the sink's memory is valid for `len` bytes, written in
        // full before this is called; nobody else touches it.
        out.extend_from_slice(unsafe { std::slice::from_raw_parts(ptr, len) });
        Ok(())
    }
}

fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13) ^ seed)
        .collect()
}

fn request(decline: bool, data: &[u8]) -> Vec<u8> {
    let mut p = vec![u8::from(decline); PREFIX];
    p.extend_from_slice(data);
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_data_goes_in_place_and_the_rest_the_usual_way() {
    for kind in [Kind::Tcp, Kind::Unix] {
        let h = Arc::new(Sinks::default());
        let server = start(kind, h.clone(), ServeOptions::default()).await;
        let conn = connect(&server.addr, Duration::ZERO).await;
        // (data length, declined, in place?): in place when large enough,
        // not declined, and not all buffered already when the server gets
        // to the frame. A frame of DIRECT_MIN data may fit in the server's
        // buffer (64 KiB and a little): either path is right for it. The
        // others cannot fit in what the buffer has grown to by then.
        for (i, (len, decline, want)) in [
            (4 << 20, false, Some(true)),
            (DIRECT_MIN, false, None),
            (DIRECT_MIN - 1, false, Some(false)),
            (100, false, Some(false)),
            (1 << 20, true, Some(false)),
            (3 << 20, false, Some(true)),
        ]
        .into_iter()
        .enumerate()
        {
            let before = h.direct.load(Ordering::SeqCst);
            let d = data(len, i as u8);
            let got = no_hang("call", conn.call(OP, &[&request(decline, &d)])).await;
            assert!(
                got.unwrap()[..] == d[..],
                "{kind:?} {len}: echoed bytes differ"
            );
            let went_direct = h.direct.load(Ordering::SeqCst) > before;
            if let Some(want) = want {
                assert_eq!(went_direct, want, "{kind:?} {len}: in place?");
            }
            let all = h.direct.load(Ordering::SeqCst) + h.usual.load(Ordering::SeqCst);
            assert_eq!(all, i + 1, "{kind:?} {len}: handled once");
        }
        let direct = h.direct.load(Ordering::SeqCst);
        assert_eq!(
            h.dropped.lock().unwrap().len(),
            direct,
            "every sink dropped"
        );
        // Concurrent large requests on one connection keep their bytes apart.
        let calls = (0..8u8).map(|i| {
            let d = data((1 << 20) + usize::from(i) * 4099, i);
            let conn = &conn;
            async move {
                let got = conn.call(OP, &[&request(false, &d)]).await.unwrap();
                assert!(
                    got[..] == d[..],
                    "{kind:?}: concurrent call {i} got other bytes"
                );
            }
        });
        no_hang("concurrent calls", futures::future::join_all(calls)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_dies_or_stalls_mid_frame_loses_only_its_connection() {
    let h = Arc::new(Sinks::default());
    let opts = ServeOptions {
        // Generous: a whole frame from a healthy peer must arrive within
        // it even on a loaded machine; the stalled peer waits it out.
        frame_timeout: Duration::from_secs(3),
        ..ServeOptions::default()
    };
    let server = start(Kind::Tcp, h.clone(), opts).await;
    let len = 2 << 20;
    let whole = frame(7, OP, &request(false, &data(len, 9)));
    let part = &whole[..whole.len() / 2];

    // Dies half way: the sink is dropped with what had arrived.
    let mut s = raw_peer(&server.addr).await;
    s.write_all(part).await.unwrap();
    drop(s);
    common::eventually("the sink of the dead peer is dropped", || {
        h.dropped.lock().unwrap().len() == 1
    })
    .await;
    assert_eq!(h.direct.load(Ordering::SeqCst), 0, "never handled");
    let arrived = part.len() - nodekernel_proto::HEADER_LEN - PREFIX;
    let held = h.dropped.lock().unwrap()[0].clone();
    assert!(
        held[..arrived] == data(len, 9)[..arrived],
        "what arrived went in place"
    );
    assert!(
        held[arrived..].iter().all(|&b| b == 0),
        "nothing else was written"
    );

    // Stalls half way: closed after the frame timeout, sink dropped.
    let mut s = raw_peer(&server.addr).await;
    s.write_all(part).await.unwrap();
    closed_by_server(&mut s).await;
    common::eventually("the stalled peer's sink is dropped", || {
        h.dropped.lock().unwrap().len() == 2
    })
    .await;

    // Others are served, in place.
    let mut s = raw_peer(&server.addr).await;
    s.write_all(&whole).await.unwrap();
    let (id, status, payload) = read_frame(&mut s).await.expect("a reply");
    assert_eq!((id, status), (7, 0));
    assert!(payload == data(len, 9), "the bytes differ");
    assert_eq!(h.direct.load(Ordering::SeqCst), 1);
}
