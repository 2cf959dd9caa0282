//! Tests of the file medium's modes, alignment handling, RMW serialisation,
//! cancellation and shutdown. The model-based property test of unaligned
//! accesses is in `tests/file_tier.rs`.

use super::*;
use crate::medium::tests::exercise;
use std::time::Duration;

/// Every combination of the two switches.
pub(crate) fn all_modes(queue_depth: u32) -> Vec<FileIoConfig> {
    let mut v = Vec::new();
    for io_uring in [true, false] {
        for (direct, stream_reads) in [(true, true), (true, false), (false, false)] {
            v.push(FileIoConfig {
                direct,
                io_uring,
                queue_depth,
                stream_reads,
            });
        }
    }
    v
}

/// Whether io_uring can be set up and entered here (a NOP round trip).
fn uring_works() -> bool {
    let Ok(mut ring) = io_uring::IoUring::new(2) else {
        return false;
    };
    let nop = io_uring::opcode::Nop::new().build();
    // SAFETY: a NOP references no memory.
    if unsafe { ring.submission().push(&nop) }.is_err() {
        return false;
    }
    ring.submit_and_wait(1).is_ok()
}

/// What this machine should give for `io`, found out independently of the
/// medium's own detection.
fn expected_mode(dir: &Path, io: &FileIoConfig) -> IoMode {
    let uring = io.io_uring && uring_works();
    let direct = io.direct && {
        let p = dir.join("direct-probe");
        std::fs::write(&p, vec![0u8; ALIGN as usize]).unwrap();
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p)
            .is_ok()
    };
    match (uring, direct) {
        (true, true) => IoMode::UringDirect,
        (true, false) => IoMode::UringBuffered,
        (false, true) => IoMode::ThreadsDirect,
        (false, false) => IoMode::ThreadsBuffered,
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn modes_are_detected_forced_and_named() {
    for io in all_modes(4) {
        let dir = tempfile::tempdir().unwrap();
        let m = FileMedium::create_with(&dir.path().join("b"), 1 << 20, &io).unwrap();
        let want = expected_mode(dir.path(), &io);
        assert_eq!(m.mode(), want, "{io:?}");
        assert_eq!(m.io_mode(), want.as_str());
        assert_eq!(m.mode().is_uring(), io.io_uring && want.is_uring());
        assert_eq!(m.mode().is_direct(), io.direct && want.is_direct());
        assert_eq!(m.queue_depth(), 4);
    }
    let names: Vec<_> = [
        IoMode::UringDirect,
        IoMode::UringBuffered,
        IoMode::ThreadsDirect,
        IoMode::ThreadsBuffered,
    ]
    .iter()
    .map(|m| m.to_string())
    .collect();
    assert_eq!(
        names,
        [
            "io_uring+O_DIRECT",
            "io_uring+buffered",
            "pread/pwrite+O_DIRECT",
            "pread/pwrite+buffered"
        ]
    );
}

/// On this project's machines (ext4 under the temp dir, io_uring enabled)
/// the default is the main path. Skipped where either is unavailable.
#[test]
fn default_is_io_uring_with_o_direct_where_available() {
    let dir = tempfile::tempdir().unwrap();
    let m = FileMedium::create(&dir.path().join("b"), 1 << 20).unwrap();
    let want = expected_mode(dir.path(), &FileIoConfig::default());
    assert_eq!(m.mode(), want);
    if want != IoMode::UringDirect {
        eprintln!("note: this machine gives {want}, not io_uring+O_DIRECT");
    }
}

#[test]
fn bad_queue_depth_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let io = FileIoConfig {
        queue_depth: 0,
        ..FileIoConfig::default()
    };
    let e = FileMedium::create_with(&dir.path().join("b"), 1 << 20, &io)
        .err()
        .expect("queue depth 0");
    assert!(e.to_string().contains("queue_depth"), "{e}");
}

#[test]
fn aligned_covering_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let io = FileIoConfig::default();
    let m = FileMedium::create_with(&dir.path().join("b"), 1 << 20, &io).unwrap();
    if m.mode().is_direct() {
        assert_eq!(m.cover(0, 1), (0, 4096));
        assert_eq!(m.cover(4095, 2), (0, 8192));
        assert_eq!(m.cover(4096, 4096), (4096, 8192));
        assert_eq!(m.cover(5000, 10_000), (4096, 16_384));
    }
    let m = FileMedium::create_with(
        &dir.path().join("c"),
        1 << 20,
        &FileIoConfig {
            direct: false,
            ..io
        },
    )
    .unwrap();
    assert_eq!(
        m.cover(4095, 2),
        (4095, 4097),
        "buffered I/O is not widened"
    );
}

#[test]
fn stripes_spread_sectors() {
    let used: std::collections::HashSet<usize> = (0..4096u64).map(stripe).collect();
    assert!(used.len() > STRIPES * 9 / 10, "{} stripes used", used.len());
    assert!(used.iter().all(|&i| i < STRIPES));
    // The same offset in consecutive 1 MiB blocks (256 sectors apart).
    let same_offset: std::collections::HashSet<usize> =
        (0..64u64).map(|b| stripe(b * 256 + 3)).collect();
    assert!(same_offset.len() > 40);
}

/// Many requests write disjoint, unaligned byte ranges that share sectors,
/// all at once; every byte must land (no RMW undoes another).
#[test]
fn concurrent_writes_sharing_sectors_lose_nothing() {
    let rt = rt();
    for io in all_modes(32) {
        let dir = tempfile::tempdir().unwrap();
        let m = Arc::new(FileMedium::create_with(&dir.path().join("b"), 64 << 10, &io).unwrap());
        for round in 0..20u8 {
            // 96 pieces of 1..=61 bytes, packed back to back from an odd
            // offset, across three sectors; written concurrently in a
            // scrambled order.
            let base = 4096 - 1000 + u64::from(round);
            let mut pieces = Vec::new();
            let mut at = base;
            for i in 0..96u64 {
                let len = 1 + (i * 37 + u64::from(round)) % 61;
                pieces.push((at, len));
                at += len;
            }
            let end = at;
            let order: Vec<usize> = (0..pieces.len()).map(|i| (i * 53) % 96).collect();
            rt.block_on(async {
                let mut set = tokio::task::JoinSet::new();
                for &i in &order {
                    let (off, len) = pieces[i];
                    let m = m.clone();
                    let fill = round.wrapping_mul(7).wrapping_add(i as u8) | 1;
                    set.spawn(async move {
                        let data = vec![fill; len as usize];
                        m.write_at(off, &data, Arc::new(())).await.unwrap();
                    });
                }
                while let Some(r) = set.join_next().await {
                    r.unwrap();
                }
            });
            let mut out = BytesMut::new();
            m.read_into(base, (end - base) as usize, &mut out).unwrap();
            for (i, &(off, len)) in pieces.iter().enumerate() {
                let fill = round.wrapping_mul(7).wrapping_add(i as u8) | 1;
                let s = (off - base) as usize;
                assert!(
                    out[s..s + len as usize].iter().all(|&b| b == fill),
                    "{io:?} round {round}: piece {i} at {off}+{len} was lost"
                );
            }
        }
    }
}

/// Reads and writes of every size class, from many tasks at once, through
/// the async interface: more requests than the queue depth must queue up,
/// not fail.
#[test]
fn more_requests_than_the_queue_depth() {
    let rt = rt();
    for io in all_modes(2) {
        let dir = tempfile::tempdir().unwrap();
        let m = Arc::new(FileMedium::create_with(&dir.path().join("b"), 4 << 20, &io).unwrap());
        rt.block_on(async {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..64u64 {
                let m = m.clone();
                set.spawn(async move {
                    let off = i * 65_536 + i;
                    let data: Vec<u8> = (0..60_000u32).map(|x| (x as u64 ^ i) as u8).collect();
                    m.write_at(off, &data, Arc::new(())).await.unwrap();
                    let mut out = BytesMut::new();
                    m.read_at(off, data.len(), &mut out, Arc::new(()))
                        .await
                        .unwrap();
                    assert_eq!(&out[..], &data[..], "{i}");
                });
            }
            while let Some(r) = set.join_next().await {
                r.unwrap();
            }
        });
    }
}

/// Whether any descriptor of this process refers to `path`.
fn is_open(path: &Path) -> bool {
    let path = std::fs::canonicalize(path).unwrap();
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .any(|p| p == path)
}

/// Dropping requests mid-flight is safe (the engine owns the buffers and
/// keepalives until completion), and dropping the medium waits for the I/O
/// thread(s), which close the file as they exit.
#[test]
fn cancelled_requests_and_shutdown() {
    let rt = rt();
    for io in all_modes(8) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b");
        let m = Arc::new(FileMedium::create_with(&path, 8 << 20, &io).unwrap());
        let keep: Keepalive = Arc::new(());
        rt.block_on(async {
            let mut tasks = Vec::new();
            for i in 0..32u64 {
                let m = m.clone();
                let keep = keep.clone();
                tasks.push(tokio::spawn(async move {
                    let data = vec![i as u8; 1 << 20];
                    let off = (i % 8) << 20;
                    m.write_at(off + 3, &data[..(1 << 20) - 3], keep.clone())
                        .await
                        .unwrap();
                    let mut out = BytesMut::new();
                    m.read_at(off, 1 << 20, &mut out, keep).await.unwrap();
                }));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            for t in &tasks {
                t.abort();
            }
            for t in tasks {
                let _ = t.await;
            }
        });
        // The engine still holds the keepalives of I/O in flight; they all
        // come back.
        // A generous bound that only catches a hang.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while Arc::strong_count(&keep) > 1 {
            assert!(
                std::time::Instant::now() < deadline,
                "{io:?}: keepalive leaked"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // The medium still works after cancellations.
        m.write(5, b"after").unwrap();
        let mut out = BytesMut::new();
        m.read_into(5, 5, &mut out).unwrap();
        assert_eq!(&out[..], b"after");
        assert!(is_open(&path));
        let m = Arc::try_unwrap(m).ok().expect("no other owner");
        drop(m);
        assert!(
            !is_open(&path),
            "{io:?}: the I/O thread still holds the file"
        );
    }
}

/// Errors from the kernel reach the caller (here: an fd opened read-only
/// makes every write fail with EBADF), through both engines.
#[test]
fn io_errors_are_reported() {
    for io in all_modes(4) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b");
        let mut m = FileMedium::create_with(&path, 1 << 20, &io).unwrap();
        let ro = Arc::new(std::fs::File::open(&path).unwrap());
        // Swap in an engine on a read-only descriptor.
        let stream = m.stream_reads().then(|| ro.clone());
        m.engine = if io.io_uring && m.mode().is_uring() {
            Engine::Uring(uring::Uring::new(ro, stream, 4).unwrap())
        } else {
            Engine::Threads(threads::Pool::new(ro, stream, 2).unwrap())
        };
        m.align = 1;
        let e = m.write(0, b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBADF), "{io:?}: {e}");
        let mut out = BytesMut::from(&b"hdr"[..]);
        m.read_into(0, 4, &mut out).unwrap();
        assert_eq!(&out[..], b"hdr\0\0\0\0");
        // A stream read (where the medium has them) reads the same file.
        let mut out = BytesMut::new();
        m.read_into(0, STREAM_READ_MIN, &mut out).unwrap();
        assert_eq!(out.len(), STREAM_READ_MIN);
        assert!(out.iter().all(|&b| b == 0), "{io:?}");
    }
}

/// Large reads go through the page cache uncached where the kernel takes
/// `RWF_DONTCACHE` (found out here independently), and O_DIRECT writes
/// stay visible to them: a range read (and so read ahead) once, then
/// rewritten, reads back new.
#[test]
fn stream_reads_where_the_kernel_has_them_and_they_see_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let probe_path = dir.path().join("probe");
    std::fs::write(&probe_path, vec![0u8; 4096]).unwrap();
    let probe = std::fs::File::open(&probe_path).unwrap();
    let mut b = [0u8; 4096];
    let iov = libc::iovec {
        iov_base: b.as_mut_ptr().cast(),
        iov_len: b.len(),
    };
    // SAFETY: `iov` points at `b`, which outlives the call.
    let kernel_has_them =
        unsafe { libc::preadv2(probe.as_raw_fd(), &iov, 1, 0, libc::RWF_DONTCACHE) } == 4096;
    let rt = rt();
    for io in all_modes(8) {
        let m = FileMedium::create_with(&dir.path().join("b"), 4 << 20, &io).unwrap();
        let want = io.stream_reads && m.mode().is_direct() && kernel_has_them;
        assert_eq!(m.stream_reads(), want, "{io:?}");
        let len = 2 * STREAM_READ_MIN + 100;
        rt.block_on(async {
            for round in 0u8..3 {
                let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ round).collect();
                m.write_at(4096, &data, Arc::new(())).await.unwrap();
                let mut out = BytesMut::new();
                m.read_at(4096, len, &mut out, Arc::new(())).await.unwrap();
                assert!(out[..] == data[..], "{io:?} round {round}: old bytes read");
                // Read ahead of what is written next.
                let mut ahead = BytesMut::new();
                m.read_at(0, 4 << 20, &mut ahead, Arc::new(()))
                    .await
                    .unwrap();
            }
        });
    }
}

#[test]
fn file_medium_bounds_round_trip_and_preallocation() {
    for io_uring in [true, false] {
        for direct in [true, false] {
            let io = crate::FileIoConfig {
                io_uring,
                direct,
                queue_depth: 4,
                stream_reads: true,
            };
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("a/b/blocks.dat");
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, vec![0xEEu8; 200 << 10]).unwrap();
            let m = FileMedium::create_with(&path, 64 << 10, &io).unwrap();
            assert_eq!(m.kind(), "file");
            assert_eq!(m.path(), path);
            assert_eq!(std::fs::metadata(&path).unwrap().len(), 64 << 10);
            let mut out = BytesMut::new();
            m.read_into(1000, 16, &mut out).unwrap();
            assert_eq!(&out[..], &[0u8; 16], "old contents are discarded");
            exercise(&m);
        }
    }
}

#[test]
fn file_medium_of_unaligned_size() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.dat");
    let m = FileMedium::create(&path, 10_000).unwrap();
    assert_eq!(m.size(), 10_000);
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        12_288,
        "the file is rounded up to whole sectors"
    );
    exercise(&m);
}

#[test]
fn file_medium_creates_parent_dirs_and_names_path_on_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x/y/z.dat");
    FileMedium::create(&path, 4096).unwrap();
    assert!(path.exists());
    // A regular file where a directory is needed.
    let bad = path.join("under-a-file.dat");
    let err = FileMedium::create(&bad, 4096)
        .err()
        .expect("cannot create under a file");
    assert!(err.to_string().contains(path.to_str().unwrap()), "{err}");
}
