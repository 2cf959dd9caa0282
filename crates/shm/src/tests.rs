//! Protocol tests, on one mapping and on two independent mappings of the
//! same memfd (as a server and a co-located client in two processes have).

use crate::testing::{busy_thread, second_mapping};
use crate::{Region, CLAIM_WAIT, SETTLING};
use nodekernel_proto::{ErrorCode, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: u32 = 64 << 10;
const N: u32 = 4;

fn region() -> Region {
    Region::create(BS, N).unwrap()
}

fn read(r: &Region, block: u32, gen: u64, off: u32, len: u32) -> Result<Vec<u8>> {
    let mut v = vec![0u8; len as usize];
    r.read(block, gen, off, &mut v)?;
    Ok(v)
}

fn code<T: std::fmt::Debug>(r: Result<T>) -> ErrorCode {
    r.expect_err("expected an error").code
}

#[test]
fn generation_rules_across_mappings() {
    let a = region();
    let b = second_mapping(&a);
    a.write(2, 5, 10, b"five").unwrap();
    assert_eq!(b.generation(2), Some(5));
    assert_eq!(read(&b, 2, 5, 10, 4).unwrap(), b"five");
    assert_eq!(
        code(read(&b, 2, 4, 10, 4)),
        ErrorCode::Stale,
        "older reader"
    );
    assert_eq!(
        code(read(&a, 2, 6, 10, 4)),
        ErrorCode::Stale,
        "owner not written yet"
    );
    b.write(2, 6, 0, b"six").unwrap();
    assert_eq!(a.generation(2), Some(6));
    assert_eq!(code(a.write(2, 5, 0, b"OLD")), ErrorCode::Stale);
    assert_eq!(
        read(&a, 2, 6, 0, 3).unwrap(),
        b"six",
        "a stale write writes nothing"
    );
    // A zero-length write is a claim.
    a.write(2, 9, 0, &[]).unwrap();
    assert_eq!(b.generation(2), Some(9));
    assert_eq!(code(read(&b, 2, 6, 0, 3)), ErrorCode::Stale);
    assert_eq!(b.writers_in_flight(2), Some(0), "every writer left");
    // Bit 63 is reserved.
    assert_eq!(
        code(a.write(1, SETTLING | 1, 0, b"x")),
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        code(read(&a, 1, SETTLING, 0, 1)),
        ErrorCode::InvalidArgument
    );
    assert_eq!(a.generation(1), Some(0));
    // Bounds, without overflow, and they claim nothing.
    for (block, off, len) in [
        (N, 0, 1),
        (u32::MAX, 0, 1),
        (0, BS, 1),
        (0, u32::MAX, 2),
        (0, 1, BS),
    ] {
        assert_eq!(code(read(&a, block, 0, off, len)), ErrorCode::OutOfRange);
        let data = vec![0u8; len as usize];
        assert_eq!(code(a.write(block, 7, off, &data)), ErrorCode::OutOfRange);
    }
    assert_eq!(a.generation(0), Some(0));
    let mut out = bytes::BytesMut::from(&b"hdr"[..]);
    assert!(b.read_append(2, 6, 0, 3, &mut out).is_err());
    b.read_append(2, 9, 0, 3, &mut out).unwrap();
    assert_eq!(&out[..], b"hdrsix", "appends only on success");
    assert_eq!(b.generation(N), None);
}

/// The old owner keeps writing full blocks through one mapping while the
/// new owner claims through the other: none of the old bytes may land
/// after the claim.
fn old_owner_never_overwrites_new_owner(old_side: Arc<Region>, new_side: Arc<Region>, rounds: u64) {
    let base = old_side.generation(3).unwrap();
    for round in 0..rounds {
        let old = base + 2 * round + 1;
        let new = old + 1;
        old_side.write(3, old, 0, &[1u8; BS as usize]).unwrap();
        let writer = {
            let s = old_side.clone();
            busy_thread(move || match s.write(3, old, 0, &[1u8; BS as usize]) {
                Ok(()) => true,
                Err(e) => {
                    assert_eq!(e.code, ErrorCode::Stale);
                    false
                }
            })
        };
        new_side.write(3, new, 0, &[2u8; BS as usize]).unwrap();
        writer.join().unwrap();
        let bytes = read(&new_side, 3, new, 0, BS).unwrap();
        let leaked = bytes.iter().filter(|&&b| b != 2).count();
        assert_eq!(
            leaked, 0,
            "round {round}: {leaked} bytes of the old owner landed after the claim"
        );
        assert_eq!(code(read(&old_side, 3, old, 0, 1)), ErrorCode::Stale);
        assert_eq!(new_side.writers_in_flight(3), Some(0));
    }
}

/// Readers on one mapping racing with claims on the other get exactly the
/// old owner's bytes or `Stale` (with their buffer zeroed), never a mix.
fn racing_reads_get_old_bytes_or_stale(
    reader_side: Arc<Region>,
    claim_side: Arc<Region>,
    rounds: u64,
) {
    let base = claim_side.generation(0).unwrap();
    for round in 0..rounds {
        let old = base + 2 * round + 1;
        claim_side.write(0, old, 0, &[7u8; BS as usize]).unwrap();
        let reader = {
            let s = reader_side.clone();
            busy_thread(move || {
                let mut buf = vec![0xEEu8; BS as usize];
                match s.read(0, old, 0, &mut buf) {
                    Ok(()) => {
                        assert!(
                            buf.iter().all(|&x| x == 7),
                            "round {round}: read mixed bytes"
                        );
                        true
                    }
                    Err(e) => {
                        assert_eq!(e.code, ErrorCode::Stale);
                        assert!(
                            buf.iter().all(|&x| x == 0xEE) || buf.iter().all(|&x| x == 0),
                            "round {round}: a failed read leaves no foreign bytes"
                        );
                        false
                    }
                }
            })
        };
        claim_side
            .write(0, old + 1, 0, &[9u8; BS as usize])
            .unwrap();
        reader.join().unwrap();
    }
}

#[test]
fn one_mapping_old_owner_never_overwrites_new_owner() {
    let r = Arc::new(region());
    old_owner_never_overwrites_new_owner(r.clone(), r, 300);
}

#[test]
fn two_mappings_old_owner_never_overwrites_new_owner() {
    let a = Arc::new(region());
    let b = Arc::new(second_mapping(&a));
    old_owner_never_overwrites_new_owner(a.clone(), b.clone(), 300);
    old_owner_never_overwrites_new_owner(b, a, 300);
}

#[test]
fn two_mappings_racing_reads_get_old_bytes_or_stale() {
    let a = Arc::new(region());
    let b = Arc::new(second_mapping(&a));
    racing_reads_get_old_bytes_or_stale(a.clone(), b.clone(), 300);
    racing_reads_get_old_bytes_or_stale(b, a, 300);
}

/// Pretends a writer of the current generation registered and is copying.
fn stuck_writer(r: &Region, block: u32) {
    r.ctl(block).1.fetch_add(1, Ordering::SeqCst);
}

fn writer_leaves(r: &Region, block: u32) {
    let _ = r
        .ctl(block)
        .1
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            Some(n.saturating_sub(1))
        });
}

#[test]
fn a_claim_waits_for_old_writers_and_holds_off_its_own_generation() {
    let a = Arc::new(region());
    let b = Arc::new(second_mapping(&a));
    a.write(1, 1, 0, &[1u8; 100]).unwrap();
    stuck_writer(&a, 1);
    let claim_done = Arc::new(AtomicBool::new(false));
    let sibling_done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let claim = {
        let (b, done) = (b.clone(), claim_done.clone());
        std::thread::spawn(move || {
            b.write(1, 2, 0, &[2u8; 50]).unwrap();
            done.store(true, Ordering::SeqCst);
        })
    };
    while a.ctl(1).0.load(Ordering::SeqCst) != 2 | SETTLING {
        std::thread::yield_now();
    }
    // A second writer of the new owner (other bytes of the block) must not
    // write while the old writer still may: it waits for the claim.
    let sibling = {
        let (a, done) = (a.clone(), sibling_done.clone());
        std::thread::spawn(move || {
            a.write(1, 2, 50, &[3u8; 50]).unwrap();
            done.store(true, Ordering::SeqCst);
        })
    };
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(
        code(read(&a, 1, 1, 0, 1)),
        ErrorCode::Stale,
        "the old owner's reads are over"
    );
    // Only meaningful while the claim has not given up on the old writer
    // (after CLAIM_WAIT it presumes it dead): a heavily loaded machine may
    // take that long to get here.
    if started.elapsed() < CLAIM_WAIT / 2 {
        assert!(
            !claim_done.load(Ordering::SeqCst),
            "the claim waits for the old writer"
        );
        assert!(
            !sibling_done.load(Ordering::SeqCst),
            "so does its own generation"
        );
        // The old writer lands its bytes and leaves: they must end up
        // under the new owner's.
        // SAFETY: test-only raw write into block 1, as the stuck writer's copy.
        unsafe { std::ptr::write_bytes(a.data_ptr().add(BS as usize), 1, 100) };
    }
    writer_leaves(&a, 1);
    claim.join().unwrap();
    sibling.join().unwrap();
    let bytes = read(&a, 1, 2, 0, 100).unwrap();
    assert_eq!(&bytes[..50], &[2u8; 50][..]);
    assert_eq!(&bytes[50..], &[3u8; 50][..]);
    assert_eq!(a.writers_in_flight(1), Some(0));
}

#[test]
fn a_dead_writer_is_forgiven_after_the_claim_wait() {
    let a = region();
    a.write(0, 1, 0, b"old").unwrap();
    stuck_writer(&a, 0);
    let t = Instant::now();
    a.write(0, 2, 0, b"new").unwrap();
    assert!(t.elapsed() >= CLAIM_WAIT, "waited {:?}", t.elapsed());
    assert_eq!(a.writers_in_flight(0), Some(0), "its count was forgiven");
    // The next claim does not wait again.
    let t = Instant::now();
    a.write(0, 3, 0, b"newer").unwrap();
    assert!(t.elapsed() < CLAIM_WAIT, "waited {:?}", t.elapsed());
    assert_eq!(read(&a, 0, 3, 0, 5).unwrap(), b"newer");
}

#[test]
fn a_dead_claimer_is_settled_for_by_its_generation() {
    let a = region();
    a.write(0, 1, 0, b"old").unwrap();
    // A claimer of generation 2 died after its exchange.
    a.ctl(0).0.store(2 | SETTLING, Ordering::SeqCst);
    let t = Instant::now();
    a.write(0, 2, 0, b"two").unwrap();
    assert!(t.elapsed() >= 2 * CLAIM_WAIT, "waited {:?}", t.elapsed());
    assert_eq!(read(&a, 0, 2, 0, 3).unwrap(), b"two");
    // A newer generation simply claims over it.
    a.ctl(0).0.store(3 | SETTLING, Ordering::SeqCst);
    a.write(0, 4, 0, b"four").unwrap();
    assert_eq!(read(&a, 0, 4, 0, 4).unwrap(), b"four");
}

#[test]
fn a_newer_claim_takes_over_a_settling_one() {
    let a = Arc::new(region());
    a.write(2, 1, 0, b"one").unwrap();
    stuck_writer(&a, 2);
    let first = {
        let a = a.clone();
        std::thread::spawn(move || a.write(2, 2, 0, b"two"))
    };
    while a.ctl(2).0.load(Ordering::SeqCst) != 2 | SETTLING {
        std::thread::yield_now();
    }
    let second = {
        let a = a.clone();
        std::thread::spawn(move || a.write(2, 3, 0, b"three"))
    };
    let e = first.join().unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::Stale, "{e}");
    assert!(e.message.contains("generation 3"), "{e}");
    writer_leaves(&a, 2);
    second.join().unwrap().unwrap();
    assert_eq!(read(&a, 2, 3, 0, 5).unwrap(), b"three");
    assert_eq!(a.writers_in_flight(2), Some(0));
}

/// Many threads on two mappings, each owning its own bytes of one block,
/// all under one generation: writes of one owner never disturb each other.
#[test]
fn concurrent_writers_of_one_generation_keep_their_bytes() {
    let a = Arc::new(region());
    let b = Arc::new(second_mapping(&a));
    a.write(0, 1, 0, &[]).unwrap();
    let threads: Vec<_> = (0..8u32)
        .map(|t| {
            let r = if t % 2 == 0 { a.clone() } else { b.clone() };
            std::thread::spawn(move || {
                for round in 0..2000u32 {
                    let v = vec![(t * 31 + round) as u8; 512];
                    r.write(0, 1, t * 512, &v).unwrap();
                    assert_eq!(read(&r, 0, 1, t * 512, 512).unwrap(), v);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(a.writers_in_flight(0), Some(0));
}

#[test]
fn prefault_walks_a_client_mapping_once_and_keeps_its_bytes() {
    let server = Region::create(4096, 300).unwrap();
    assert_eq!(
        server.prefault(0),
        None,
        "the server maps everything at create"
    );
    server.write(7, 1, 0, b"kept").unwrap();
    let client = second_mapping(&server);
    assert!(!client.is_populated(7));
    // 16 MiB of 4 KiB blocks per call would be 4096: all 300 at once.
    assert_eq!(client.prefault(0), Some(300));
    assert_eq!(client.prefault(300), None);
    assert!((0..300).all(|b| client.is_populated(b)));
    assert_eq!(read(&client, 7, 1, 0, 4).unwrap(), b"kept");

    // Large blocks: one chunk is 16 MiB worth, and a large access maps its
    // block in on the spot.
    let server = Region::create(8 << 20, 5).unwrap();
    let client = second_mapping(&server);
    client.write(4, 1, 0, &vec![9u8; 1 << 20]).unwrap();
    assert!(client.is_populated(4), "a large write maps its block in");
    client.write(3, 1, 0, b"small").unwrap();
    assert!(
        !client.is_populated(3),
        "a small one takes its fault instead"
    );
    assert_eq!(client.prefault(0), Some(2));
    assert_eq!(client.prefault(2), Some(4));
    assert_eq!(client.prefault(4), Some(5));
    assert_eq!(client.prefault(5), None);
    assert!((0..5).all(|b| client.is_populated(b)));
    assert_eq!(read(&server, 3, 1, 0, 5).unwrap(), b"small");
}
