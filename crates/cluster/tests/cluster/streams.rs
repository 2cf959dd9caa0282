//! Buffered streams (`BufferedReader`, `BufferedWriter`): several slices in
//! flight, byte-exact on both data paths, sticky errors, publication only
//! at sync/close.

use crate::common;

use common::{pattern, BS};
use nodekernel_client::{
    BufferedReader, BufferedWriter, CreateOptions, Error, ErrorCode, NodeType, StreamOptions,
    MAX_STREAM_BUFFER_SIZE,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

fn opts() -> CreateOptions {
    CreateOptions::default()
}

async fn start(shared_memory: bool) -> common::TestCluster {
    common::start_on_path(32 << 20, 32 << 20, shared_memory).await
}

/// Call sizes from 1 byte to a few slices, so calls both split and span
/// slices and blocks.
fn odd_size(rng: &mut SmallRng) -> usize {
    match rng.gen_range(0..3) {
        0 => rng.gen_range(1..100),
        1 => rng.gen_range(100..10_000),
        _ => rng.gen_range(10_000..300_000),
    }
}

/// Panics with the first differing offset (not a multi-megabyte diff).
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {i}");
    }
}

on_both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    odd_sized_writes_and_reads_round_trip => round_trip
);

async fn round_trip(shared_memory: bool) {
    let t = start(shared_memory).await;
    let c = &t.client;
    let slice = 100_003;
    let wopts = StreamOptions::new(3 * slice + 17, slice).unwrap();
    assert_eq!(wopts.slices_in_flight(), 3);
    let len = 40 * BS as usize + 12_345;
    for unit in [BS as usize, slice, wopts.buffer_size] {
        assert_ne!(len % unit, 0, "length is not a multiple of {unit}");
    }
    let data = pattern(1, len);

    let node = c.create("/f", NodeType::File, opts()).await.unwrap();
    let mut w = BufferedWriter::new(node, wopts).unwrap();
    let mut rng = SmallRng::seed_from_u64(7);
    let (mut at, mut calls) = (0, 0);
    while at < len {
        let n = odd_size(&mut rng).min(len - at);
        w.write_all(&data[at..at + n]).await.unwrap();
        at += n;
        calls += 1;
        assert_eq!(w.position(), at as u64);
    }
    assert!(calls > 30, "many write calls ({calls})");
    w.close().await.unwrap();

    let node = Arc::new(c.lookup("/f").await.unwrap());
    assert_eq!(node.size(), len as u64, "close published every byte");
    let plain = node.read(0, len as u64).await.unwrap();
    assert_same(&plain, &data, "direct read of the buffered writes");

    // Read back with slicings unlike the writer's: a buffer larger than
    // the file, unaligned slices, and one block-sized slice in flight.
    for ropts in [
        StreamOptions::default(),
        StreamOptions::new(5 * 77_777, 77_777).unwrap(),
        StreamOptions::new(BS as usize, BS as usize).unwrap(),
    ] {
        let mut r = BufferedReader::new(node.clone(), 0, ropts).unwrap();
        assert_eq!(r.end(), len as u64);
        let mut got = Vec::with_capacity(len);
        let mut buf = vec![0u8; 300_000];
        loop {
            let want = odd_size(&mut rng);
            let n = r.read(&mut buf[..want]).await.unwrap();
            if n == 0 {
                break;
            }
            assert!(n <= want);
            got.extend_from_slice(&buf[..n]);
            assert_eq!(r.position(), got.len() as u64);
        }
        assert_same(&got, &plain, &format!("buffered read with {ropts:?}"));
        assert_eq!(r.read(&mut buf).await.unwrap(), 0, "still at the end");
    }
    // fill_buf/consume hand out the stream's own buffer.
    let ropts = StreamOptions::new(2 * 65_000, 65_000).unwrap();
    let mut r = BufferedReader::new(node.clone(), 0, ropts).unwrap();
    let mut got = Vec::with_capacity(len);
    loop {
        let avail = r.fill_buf().await.unwrap();
        if avail.is_empty() {
            break;
        }
        assert!(avail.len() <= 65_000, "at most one slice");
        let n = odd_size(&mut rng).min(avail.len());
        got.extend_from_slice(&avail[..n]);
        r.consume(n);
        assert_eq!(r.position(), got.len() as u64);
    }
    assert_same(&got, &plain, "fill_buf/consume");
    common::assert_data_path(&t, c, shared_memory);
}

on_both_paths!(
    #[tokio::test]
    reader_starts_at_an_offset => reader_offsets
);

async fn reader_offsets(shared_memory: bool) {
    let t = start(shared_memory).await;
    let c = &t.client;
    let len = 10 * BS + 777;
    let data = pattern(2, len as usize);
    let mut f = c.create("/f", NodeType::File, opts()).await.unwrap();
    f.append(&data).await.unwrap();
    f.close().await.unwrap();
    let node = Arc::new(c.lookup("/f").await.unwrap());
    let ropts = StreamOptions::new(3 * 50_000, 50_000).unwrap();
    for offset in [1, BS - 1, BS, 3 * BS + 12_345, len - 1, len] {
        let mut r = BufferedReader::new(node.clone(), offset, ropts).unwrap();
        assert_eq!(r.position(), offset);
        let mut out = b"prefix".to_vec();
        let n = r.read_to_end(&mut out).await.unwrap();
        assert_eq!(n as u64, len - offset, "offset {offset}");
        assert_eq!(&out[..6], b"prefix", "read_to_end appends");
        assert_same(
            &out[6..],
            &data[offset as usize..],
            &format!("from offset {offset}"),
        );
        assert_eq!(r.position(), len);
        assert_eq!(r.read(&mut [0u8; 10]).await.unwrap(), 0);
    }
    let e = BufferedReader::new(node.clone(), len + 1, ropts).unwrap_err();
    assert_eq!(e.code, ErrorCode::OutOfRange, "{e}");
    assert!(e.message.contains("/f"), "{e}");
}

on_both_paths!(
    #[tokio::test]
    empty_file_streams => empty_file
);

async fn empty_file(shared_memory: bool) {
    let t = start(shared_memory).await;
    let c = &t.client;
    let node = c.create("/empty", NodeType::File, opts()).await.unwrap();
    let mut w = BufferedWriter::new(node, StreamOptions::default()).unwrap();
    w.write_all(&[]).await.unwrap();
    w.flush().await.unwrap();
    assert_eq!(w.position(), 0);
    w.close().await.unwrap();

    let node = c.lookup("/empty").await.unwrap();
    assert_eq!(node.size(), 0);
    let mut r = BufferedReader::new(node, 0, StreamOptions::default()).unwrap();
    assert_eq!(r.read(&mut [0u8; 100]).await.unwrap(), 0);
    let mut out = Vec::new();
    assert_eq!(r.read_to_end(&mut out).await.unwrap(), 0);
    assert!(out.is_empty());
    assert_eq!((r.position(), r.end()), (0, 0));
}

fn assert_invalid(e: Error, words: &[&str]) {
    assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
    for w in words {
        assert!(e.message.contains(w), "{e:?} names {w}");
    }
}

#[tokio::test]
async fn invalid_options_are_rejected() {
    let d = StreamOptions::default();
    d.validate().unwrap();
    assert_eq!((d.buffer_size, d.slice_size), (4 << 20, 1 << 20));
    assert_eq!(d.slices_in_flight(), 4);
    assert_eq!(StreamOptions::new(1000, 300).unwrap().slices_in_flight(), 3);
    assert_eq!(StreamOptions::new(7, 7).unwrap().slices_in_flight(), 1);
    assert!(StreamOptions::new(MAX_STREAM_BUFFER_SIZE, 1 << 20).is_ok());

    assert_invalid(
        StreamOptions::new(1 << 20, 0).unwrap_err(),
        &["slice_size", "0"],
    );
    assert_invalid(
        StreamOptions::new(1000, 1001).unwrap_err(),
        &["buffer_size 1000", "slice_size 1001"],
    );
    let huge = MAX_STREAM_BUFFER_SIZE + 1;
    assert_invalid(
        StreamOptions::new(huge, 1 << 20).unwrap_err(),
        &["buffer_size", &huge.to_string()],
    );

    // The constructors check options built without `new` too.
    let t = start(false).await;
    let c = &t.client;
    let mut f = c.create("/f", NodeType::File, opts()).await.unwrap();
    f.append(b"abc").await.unwrap();
    f.close().await.unwrap();
    let bad = StreamOptions {
        buffer_size: 4096,
        slice_size: 0,
    };
    let e = BufferedReader::new(c.lookup("/f").await.unwrap(), 0, bad).unwrap_err();
    assert_invalid(e, &["slice_size"]);
    let writable = c.open_write("/f").await.unwrap();
    let e = BufferedWriter::new(writable, bad).unwrap_err();
    assert_invalid(e, &["slice_size"]);
}

#[tokio::test]
async fn writer_on_a_read_only_handle_is_refused() {
    let t = start(false).await;
    let c = &t.client;
    let mut f = c.create("/ro", NodeType::File, opts()).await.unwrap();
    f.append(b"kept").await.unwrap();
    f.close().await.unwrap();
    let e =
        BufferedWriter::new(c.lookup("/ro").await.unwrap(), StreamOptions::default()).unwrap_err();
    assert_invalid(e, &["/ro", "read-only"]);
    assert_eq!(c.get("/ro").await.unwrap(), b"kept", "nothing changed");
}

/// Writes until a slice write fails (its error surfaces at a later call),
/// then checks that every later call returns that same error.
async fn fail_and_check_sticky(mut w: BufferedWriter) -> Error {
    let chunk = pattern(4, BS as usize / 2 + 1);
    let mut first = None;
    for _ in 0..64 {
        if let Err(e) = w.write_all(&chunk).await {
            first = Some(e);
            break;
        }
    }
    let e = match first {
        Some(e) => e,
        None => w.flush().await.expect_err("the writes fail"),
    };
    assert_eq!(w.write_all(b"more").await.unwrap_err(), e, "write_all");
    assert_eq!(w.write_all(&[]).await.unwrap_err(), e, "empty write_all");
    assert_eq!(w.flush().await.unwrap_err(), e, "flush");
    assert_eq!(w.sync().await.unwrap_err(), e, "sync");
    assert_eq!(w.close().await.unwrap_err(), e, "close");
    e
}

on_both_paths!(
    #[tokio::test]
    writer_error_after_delete_is_sticky => deleted_under_writer
);

async fn deleted_under_writer(shared_memory: bool) {
    let t = start(shared_memory).await;
    let c = &t.client;
    let node = c.create("/doomed", NodeType::File, opts()).await.unwrap();
    let mut w = BufferedWriter::new(
        node,
        StreamOptions::new(4 * BS as usize, BS as usize).unwrap(),
    )
    .unwrap();
    w.write_all(&pattern(3, 2 * BS as usize)).await.unwrap();
    w.flush().await.unwrap();
    c.delete("/doomed", false).await.unwrap();
    let e = fail_and_check_sticky(w).await;
    assert_eq!(e.code, ErrorCode::Stale, "{e}");
    assert!(e.message.contains("/doomed"), "{e}");
    let gone = c.lookup("/doomed").await.unwrap_err();
    assert_eq!(gone.code, ErrorCode::NotFound, "{gone}");
}

on_both_paths!(
    #[tokio::test]
    writer_error_after_storage_servers_die_is_sticky => servers_die_under_writer
);

async fn servers_die_under_writer(shared_memory: bool) {
    let t = start(shared_memory).await;
    let c = &t.client;
    let node = c.create("/f", NodeType::File, opts()).await.unwrap();
    let mut w = BufferedWriter::new(
        node,
        StreamOptions::new(4 * BS as usize, BS as usize).unwrap(),
    )
    .unwrap();
    w.write_all(&pattern(5, 3 * BS as usize)).await.unwrap();
    w.sync().await.unwrap();
    for s in &t.cluster.stores {
        s.shutdown();
    }
    let e = fail_and_check_sticky(w).await;
    assert!(
        matches!(
            e.code,
            ErrorCode::Unavailable | ErrorCode::Timeout | ErrorCode::DataLost | ErrorCode::NoSpace
        ),
        "{e}"
    );
    assert!(e.message.contains("/f"), "{e}");
    let node = c.lookup("/f").await.unwrap();
    assert_eq!(node.size(), 3 * BS, "only the synced bytes are published");
}

on_both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    sync_publishes_and_open_write_appends => sync_and_append
);

async fn sync_and_append(shared_memory: bool) {
    let t = start(shared_memory).await;
    let c = &t.client;
    let data = pattern(6, 900_001);
    let sopts = StreamOptions::new(3 * 40_000, 40_000).unwrap();
    let node = c.create("/s", NodeType::File, opts()).await.unwrap();
    let mut w = BufferedWriter::new(node, sopts).unwrap();
    for part in data[..300_001].chunks(123_457) {
        w.write_all(part).await.unwrap();
    }
    assert_eq!(c.lookup("/s").await.unwrap().size(), 0, "nothing published");
    w.sync().await.unwrap();
    assert_eq!(w.node().size(), 300_001);
    let seen = c.lookup("/s").await.unwrap();
    assert_eq!(seen.size(), 300_001, "sync published");
    assert_same(
        &seen.read(0, 300_001).await.unwrap(),
        &data[..300_001],
        "after sync",
    );

    w.write_all(&data[300_001..500_001]).await.unwrap();
    w.flush().await.unwrap();
    assert_eq!(
        c.lookup("/s").await.unwrap().size(),
        300_001,
        "flush stores but does not publish"
    );
    w.close().await.unwrap();
    assert_same(&c.get("/s").await.unwrap(), &data[..500_001], "after close");

    // Appending to an existing node from an unaligned end: the stream's
    // slices allocate blocks after the existing ones.
    let node = c.open_write("/s").await.unwrap();
    let mut w = BufferedWriter::new(node, sopts).unwrap();
    assert_eq!(w.position(), 500_001);
    let mut rng = SmallRng::seed_from_u64(9);
    let mut at = 500_001;
    while at < data.len() {
        let n = odd_size(&mut rng).min(data.len() - at);
        w.write_all(&data[at..at + n]).await.unwrap();
        at += n;
    }
    w.close().await.unwrap();
    assert_same(&c.get("/s").await.unwrap(), &data, "after the append");
}

on_both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    dropping_unclosed_streams_does_not_panic => drop_streams
);

async fn drop_streams(shared_memory: bool) {
    let t = start(shared_memory).await;
    let c = &t.client;
    let small = StreamOptions::new(4 * BS as usize, BS as usize).unwrap();

    // A writer with slices in flight, dropped: nothing is published.
    let node = c.create("/dropped", NodeType::File, opts()).await.unwrap();
    let mut w = BufferedWriter::new(node, small).unwrap();
    w.write_all(&pattern(7, 1 << 20)).await.unwrap();
    drop(w);
    assert_eq!(c.lookup("/dropped").await.unwrap().size(), 0);

    // A reader with slices in flight, dropped.
    let data = pattern(8, 1 << 20);
    let mut f = c.create("/r", NodeType::File, opts()).await.unwrap();
    f.append(&data).await.unwrap();
    f.close().await.unwrap();
    let mut r = BufferedReader::new(c.lookup("/r").await.unwrap(), 0, small).unwrap();
    let mut buf = [0u8; 10];
    assert_eq!(r.read(&mut buf).await.unwrap(), 10);
    assert_eq!(buf, data[..10]);
    drop(r);

    // The abandoned transfers finish in the background; the client and
    // its connections keep working.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let node = c.create("/after", NodeType::File, opts()).await.unwrap();
    let mut w = BufferedWriter::new(node, small).unwrap();
    w.write_all(&data).await.unwrap();
    w.close().await.unwrap();
    let mut out = Vec::new();
    BufferedReader::new(c.lookup("/after").await.unwrap(), 0, small)
        .unwrap()
        .read_to_end(&mut out)
        .await
        .unwrap();
    assert_same(&out, &data, "after dropped streams");
}

on_both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    overtaking_slice_writes_allocate_blocks_in_order => overtaking_slices
);

/// One block per slice and many slices sent at once: a slice whose map
/// overtakes the maps of earlier slices must still get its block (the
/// metadata server only allocates contiguously).
async fn overtaking_slices(shared_memory: bool) {
    let t = start(shared_memory).await;
    let c = &t.client;
    let data = pattern(10, 48 * BS as usize + 1);
    let wopts = StreamOptions::new(16 * BS as usize, BS as usize).unwrap();
    for round in 0..3 {
        let path = format!("/o{round}");
        let node = c.create(&path, NodeType::File, opts()).await.unwrap();
        let mut w = BufferedWriter::new(node, wopts).unwrap();
        w.write_all(&data).await.unwrap();
        w.close().await.unwrap();
        assert_same(&c.get(&path).await.unwrap(), &data, &path);
    }
}

on_both_paths!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    aborted_streams_publish_nothing_new => aborted_streams
);

/// An aborted stream releases the write lease at once (another writer may
/// open the File) and publishes nothing beyond its last sync; an aborted
/// put in steps leaves no value.
async fn aborted_streams(shared_memory: bool) {
    let t = start(shared_memory).await;
    let c = &t.client;
    let wopts = StreamOptions::new(8 * BS as usize, BS as usize).unwrap();
    let node = c.create("/f", NodeType::File, opts()).await.unwrap();
    let mut w = BufferedWriter::new(node, wopts).unwrap();
    let synced = pattern(20, 3 * BS as usize + 5);
    w.write_all(&synced).await.unwrap();
    w.sync().await.unwrap();
    w.write_all(&pattern(21, 5 * BS as usize)).await.unwrap();
    w.abort().await.unwrap();
    assert_same(&c.get("/f").await.unwrap(), &synced, "/f after abort");
    // The lease is free: a new writer opens the File at once.
    let again = c.open_write("/f").await.unwrap();
    again.close().await.unwrap();

    c.create("/t", NodeType::Table, opts()).await.unwrap();
    let kv = c.create("/t/k", NodeType::KeyValue, opts()).await.unwrap();
    let mut w = BufferedWriter::new(kv, wopts).unwrap();
    w.write_all(&pattern(22, 2 * BS as usize)).await.unwrap();
    w.abort().await.unwrap();
    let e = c.lookup("/t/k").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound, "{e}");
}
