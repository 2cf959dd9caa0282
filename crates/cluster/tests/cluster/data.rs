//! Data operations through a real cluster: appends across block and tier
//! boundaries, random reads, overwrite, read past end, single writer.

use crate::common;

use common::{pattern, BS};
use nodekernel_client::{CreateOptions, ErrorCode, NodeType};
use rand::{Rng, SeedableRng};

#[tokio::test]
async fn fifty_mib_of_mixed_appends_read_back_identical() {
    // DRAM holds 16 MiB, so the file spills over into the file tier too;
    // the test checks that both hold part of it, so migration (which may
    // move the whole file down: it moves a node's blocks on a class
    // together) is off.
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(16 << 20, 96 << 20, &dir);
    cfg.meta.migration = false;
    let t = common::start_with(cfg, dir).await;
    let c = &t.client;
    let total = 50usize << 20;
    let data = pattern(1, total);
    let mut rng = rand::rngs::SmallRng::seed_from_u64(2);
    let mut node = c
        .create("/big", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    let mut pos = 0;
    let mut sizes = Vec::new();
    while pos < total {
        // 1 B .. 3 MiB, with tiny appends mixed in.
        let n = match rng.gen_range(0..4) {
            0 => rng.gen_range(1..=16),
            1 => rng.gen_range(1..=BS as usize * 2),
            _ => rng.gen_range(1..=3 << 20),
        }
        .min(total - pos);
        node.append(&data[pos..pos + n]).await.unwrap();
        sizes.push(n);
        pos += n;
    }
    assert!(
        sizes.contains(&1) || sizes.iter().any(|s| *s < 16),
        "small appends exercised"
    );
    assert!(
        sizes.iter().any(|s| *s > 2 << 20),
        "multi-block appends exercised"
    );
    node.close().await.unwrap();

    let r = c.lookup("/big").await.unwrap();
    assert_eq!(r.info().size, total as u64);
    let whole = r.read(0, total as u64).await.unwrap();
    assert!(whole == data, "whole file reads back byte-identical");
    for _ in 0..200 {
        let off = rng.gen_range(0..total);
        let len = rng.gen_range(0..=(total - off).min(3 << 20));
        let got = r.read(off as u64, len as u64).await.unwrap();
        assert!(
            got == data[off..off + len],
            "random read at {off} len {len}"
        );
    }
    // Sequential reader with location prefetch.
    let mut reader = r.reader(0);
    let mut seq = Vec::with_capacity(total);
    let mut buf = vec![0u8; 300_000];
    loop {
        let n = reader.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        seq.extend_from_slice(&buf[..n]);
    }
    assert!(seq == data, "sequential reader returns the same bytes");

    // Both tiers hold part of the file.
    let st = c.status().await.unwrap();
    let used: Vec<u64> = st.servers.iter().map(|s| s.used_blocks).collect();
    assert!(
        used.iter().all(|u| *u > 0),
        "blocks on both tiers: {used:?}"
    );
}

#[tokio::test]
async fn reads_past_the_end_are_errors() {
    let t = common::start(8 << 20, 32 << 20).await;
    let c = &t.client;
    let data = pattern(3, 100_000);
    let mut w = c
        .create("/f", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    w.append(&data).await.unwrap();
    w.close().await.unwrap();
    let r = c.lookup("/f").await.unwrap();
    for (off, len) in [
        (99_990u64, 20usize),
        (100_000, 1),
        (200_000, 10),
        (u64::MAX, 2),
        (u64::MAX - 1, 10),
    ] {
        let mut buf = vec![0xAAu8; len];
        let e = r.read_at(off, &mut buf).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::OutOfRange, "read {len} at {off}: {e}");
        assert!(
            buf.iter().all(|b| *b == 0xAA),
            "no partial garbage written into the buffer"
        );
    }
    assert_eq!(r.read(99_990, 10).await.unwrap(), &data[99_990..]);
    assert!(r.read(100_000, 0).await.unwrap().is_empty());
    let e = c.lookup("/d").await.unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
}

#[tokio::test]
async fn overwrite_inside_the_file() {
    let t = common::start(8 << 20, 32 << 20).await;
    let c = &t.client;
    let mut model = pattern(4, 3 * BS as usize + 123);
    let mut w = c
        .create("/f", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    w.append(&model).await.unwrap();
    // Overwrites inside one block, across a block boundary, at the very end.
    for (off, len, seed) in [
        (10usize, 100usize, 5u64),
        (BS as usize - 7, 50, 6),
        (model.len() - 9, 9, 7),
    ] {
        let patch = pattern(seed, len);
        w.write_at(off as u64, &patch).await.unwrap();
        model[off..off + len].copy_from_slice(&patch);
    }
    let e = w
        .write_at(model.len() as u64 - 2, b"xyz")
        .await
        .unwrap_err();
    assert_eq!(
        e.code,
        ErrorCode::OutOfRange,
        "overwrite cannot grow the file"
    );
    w.close().await.unwrap();
    assert!(c.get("/f").await.unwrap() == model);

    // Reopen for writing: overwrite and append again.
    let mut w = c.open_write("/f").await.unwrap();
    w.write_at(0, b"HEAD").await.unwrap();
    w.append(b"TAIL").await.unwrap();
    w.close().await.unwrap();
    model[..4].copy_from_slice(b"HEAD");
    model.extend_from_slice(b"TAIL");
    assert!(c.get("/f").await.unwrap() == model);
}

#[tokio::test]
async fn one_writer_at_a_time() {
    let t = common::start(8 << 20, 32 << 20).await;
    let c = &t.client;
    let other = t.cluster.client().await.unwrap();
    let mut w = c
        .create("/f", NodeType::File, CreateOptions::default())
        .await
        .unwrap();
    w.append(b"hello").await.unwrap();
    let e = other
        .open_write("/f")
        .await
        .expect_err("second writer refused");
    assert_eq!(e.code, ErrorCode::Busy, "{e}");
    // Readers see only published bytes.
    assert_eq!(other.lookup("/f").await.unwrap().info().size, 0);
    w.sync().await.unwrap();
    assert_eq!(other.get("/f").await.unwrap(), b"hello");
    assert_eq!(
        other.open_write("/f").await.err().unwrap().code,
        ErrorCode::Busy
    );
    w.close().await.unwrap();
    let mut w2 = other.open_write("/f").await.unwrap();
    w2.append(b" world").await.unwrap();
    w2.close().await.unwrap();
    assert_eq!(c.get("/f").await.unwrap(), b"hello world");
    // A read-only handle cannot write.
    let mut ro = c.lookup("/f").await.unwrap();
    assert_eq!(
        ro.append(b"x").await.unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    // Containers cannot be opened for writing.
    c.mkdir("/d", false).await.unwrap();
    assert_eq!(
        c.open_write("/d").await.err().unwrap().code,
        ErrorCode::TypeMismatch
    );
}

#[tokio::test]
async fn blocking_wrapper_round_trip() {
    let t = common::start(8 << 20, 32 << 20).await;
    let cfg = t.cluster.client_config();
    // The blocking client owns its own runtime: run it off this runtime.
    let got = tokio::task::spawn_blocking(move || {
        let c = nodekernel_client::blocking::Client::connect(cfg).unwrap();
        c.mkdir("/tbl", false).unwrap();
        c.rename("/tbl", "/t2").unwrap();
        let mut n = c
            .create("/t2/f", NodeType::File, CreateOptions::default())
            .unwrap();
        n.append(b"blocking").unwrap();
        n.close().unwrap();
        (c.get("/t2/f").unwrap(), c.enumerate("/t2").unwrap())
    })
    .await
    .unwrap();
    assert_eq!(got.0, b"blocking");
    assert_eq!(got.1, vec!["f"]);
}
