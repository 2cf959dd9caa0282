//! Property test of the file tier: unaligned reads and writes (odd offsets
//! and lengths, across 4 KiB sector and block boundaries, some of them
//! concurrent) return exactly the bytes written, checked against an
//! in-memory model, in every I/O mode (io_uring or pread/pwrite threads,
//! `O_DIRECT` or buffered).
//!
//! `PROPTEST_CASES` sets the number of cases per mode (default 32, a few
//! seconds in all).

use bytes::BytesMut;
use nodekernel_proto::ErrorCode;
use nodekernel_store::{BlockStore, FileIoConfig, FileMedium, IoMode};
use proptest::prelude::*;
use std::sync::Arc;

/// Four sectors per block, so that requests cross sector boundaries often
/// and block boundaries are near.
/// Large enough that reads of a block's larger part are stream reads
/// (`nodekernel_store::file::STREAM_READ_MIN`).
const BS: u32 = 256 << 10;
const BLOCKS: u32 = 3;
const SECTOR: u32 = 4096;
const GEN: u64 = 1;

#[derive(Debug, Clone)]
enum Op {
    /// Writes `len` bytes derived from `seed`. A batch of writes runs
    /// concurrently; writes overlapping an earlier one of the batch are
    /// dropped from it, so the model's result does not depend on timing.
    Write {
        block: u32,
        off: u32,
        len: u32,
        seed: u8,
    },
    Read {
        block: u32,
        off: u32,
        len: u32,
    },
    /// Ends the current batch of concurrent writes.
    Barrier,
}

/// Offsets biased to sector and block edges: exactly on one, a few bytes
/// either side, or anywhere.
fn offset() -> impl Strategy<Value = u32> {
    prop_oneof![
        3 => (0..=BS / SECTOR, -3i64..=3).prop_map(|(k, d)| {
            (i64::from(k * SECTOR) + d).clamp(0, i64::from(BS)) as u32
        }),
        2 => 0..=BS,
    ]
}

/// Lengths: tiny, around a sector, around a block, or anywhere.
fn length() -> impl Strategy<Value = u32> {
    prop_oneof![
        3 => 0u32..=17,
        2 => (1u32..=3, -3i64..=3).prop_map(|(k, d)| (i64::from(k * SECTOR) + d) as u32),
        1 => (BS - 3)..=(BS + 1),
        2 => 0..=BS,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..BLOCKS, offset(), length(), any::<u8>())
            .prop_map(|(block, off, len, seed)| Op::Write { block, off, len, seed }),
        3 => (0..BLOCKS, offset(), length()).prop_map(|(block, off, len)| Op::Read { block, off, len }),
        1 => Just(Op::Barrier),
    ]
}

fn data(len: u32, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn in_block(off: u32, len: u32) -> bool {
    u64::from(off) + u64::from(len) <= u64::from(BS)
}

async fn read(s: &BlockStore, block: u32, off: u32, len: u32) -> Result<Vec<u8>, ErrorCode> {
    let mut out = BytesMut::from(&b"hdr"[..]);
    match s.read(block, GEN, off, len, &mut out).await {
        Ok(()) => Ok(out[3..].to_vec()),
        Err(e) => {
            assert_eq!(&out[..], b"hdr", "a failed read appends nothing");
            Err(e.code)
        }
    }
}

/// Runs `ops` against a fresh file tier in mode `io` and the model.
async fn check(io: &FileIoConfig, ops: &[Op]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let medium = FileMedium::create_with(
        &dir.path().join("blocks"),
        u64::from(BS) * u64::from(BLOCKS),
        io,
    )
    .unwrap();
    let s = Arc::new(BlockStore::new(Box::new(medium), BS, BLOCKS));
    let mut model = vec![vec![0u8; BS as usize]; BLOCKS as usize];
    for b in 0..BLOCKS {
        s.write(b, GEN, 0, &[]).await.unwrap(); // claim
    }
    let mut batch: Vec<(u32, u32, u32, u8)> = Vec::new();
    let mut ops = ops.to_vec();
    ops.push(Op::Barrier);
    for op in ops {
        match op {
            Op::Write {
                block,
                off,
                len,
                seed,
            } => {
                if !in_block(off, len) {
                    let e = s
                        .write(block, GEN, off, &data(len, seed))
                        .await
                        .unwrap_err();
                    prop_assert_eq!(e.code, ErrorCode::OutOfRange);
                    continue;
                }
                let overlaps = batch
                    .iter()
                    .any(|&(b, o, l, _)| b == block && off < o + l && o < off + len);
                if !overlaps {
                    batch.push((block, off, len, seed));
                }
            }
            Op::Barrier => {
                let mut set = tokio::task::JoinSet::new();
                for &(block, off, len, seed) in &batch {
                    let s = s.clone();
                    set.spawn(async move { s.write(block, GEN, off, &data(len, seed)).await });
                    model[block as usize][off as usize..(off + len) as usize]
                        .copy_from_slice(&data(len, seed));
                }
                while let Some(r) = set.join_next().await {
                    r.unwrap().unwrap();
                }
                // Every byte written by the batch reads back.
                for &(block, off, len, _) in &batch {
                    let got = read(&s, block, off, len).await.unwrap();
                    prop_assert_eq!(
                        &got[..],
                        &model[block as usize][off as usize..(off + len) as usize],
                        "block {} off {} len {} after a batch",
                        block,
                        off,
                        len
                    );
                }
                batch.clear();
            }
            Op::Read { block, off, len } => {
                let got = read(&s, block, off, len).await;
                if !in_block(off, len) {
                    prop_assert_eq!(got, Err(ErrorCode::OutOfRange));
                    continue;
                }
                // Reads see the last barrier's state: pending (unflushed)
                // batch writes have not started yet.
                prop_assert_eq!(
                    &got.unwrap()[..],
                    &model[block as usize][off as usize..(off + len) as usize],
                    "block {} off {} len {}",
                    block,
                    off,
                    len
                );
            }
        }
    }
    // Whole blocks at the end.
    for b in 0..BLOCKS {
        prop_assert_eq!(
            &read(&s, b, 0, BS).await.unwrap(),
            &model[b as usize],
            "block {}",
            b
        );
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

fn run_mode(direct: bool, io_uring: bool, stream_reads: bool) -> IoMode {
    let io = FileIoConfig {
        direct,
        io_uring,
        queue_depth: 16,
        stream_reads,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .enable_all()
        .build()
        .unwrap();
    let mode = {
        let dir = tempfile::tempdir().unwrap();
        let m = FileMedium::create_with(&dir.path().join("m"), 1 << 20, &io).unwrap();
        if stream_reads && m.mode().is_direct() && !m.stream_reads() {
            eprintln!("note: no uncached buffered reads here; large reads use O_DIRECT");
        }
        m.mode()
    };
    let config = ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in prop::collection::vec(op(), 1..40))| {
        rt.block_on(check(&io, &ops))?;
    });
    mode
}

#[test]
fn unaligned_io_matches_model_io_uring_direct() {
    // The main path; on a machine without io_uring or O_DIRECT this runs
    // whatever the detection fell back to.
    // O_DIRECT writes interleave with uncached buffered reads of the same
    // blocks here: the page cache must never serve old bytes.
    let mode = run_mode(true, true, true);
    eprintln!("main path ran as {mode}");
}

/// Large reads with O_DIRECT too, as on kernels without `RWF_DONTCACHE`.
#[test]
fn unaligned_io_matches_model_io_uring_direct_without_stream_reads() {
    let mode = run_mode(true, true, false);
    eprintln!("ran as {mode}");
}

#[test]
fn unaligned_io_matches_model_io_uring_buffered() {
    assert!(!run_mode(false, true, false).is_direct());
}

#[test]
fn unaligned_io_matches_model_threads_direct() {
    assert!(!run_mode(true, false, true).is_uring());
}

#[test]
fn unaligned_io_matches_model_threads_buffered() {
    assert_eq!(run_mode(false, false, false), IoMode::ThreadsBuffered);
}
