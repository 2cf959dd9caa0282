//! Protocol tests, on one mapping and on two independent mappings of the
//! same memfd (as a server and a co-located client in two processes have).

use crate::testing::{
    block_on, busy_thread, mapping_with_lease, second_mapping, stall_write, start_claim,
};
use crate::{Region, Role, ServerRegion, SETTLING};
use nodekernel_proto::{ErrorCode, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BS: u32 = 64 << 10;
const N: u32 = 4;

fn region() -> ServerRegion {
    ServerRegion::create(BS, N).unwrap()
}

fn write<R: Role>(r: &Region<R>, block: u32, gen: u64, off: u32, data: &[u8]) -> Result<()> {
    block_on(r.write(block, gen, off, data))
}

fn read<R: Role>(r: &Region<R>, block: u32, gen: u64, off: u32, len: u32) -> Result<Vec<u8>> {
    let mut v = vec![0u8; len as usize];
    r.read(block, gen, off, &mut v)?;
    Ok(v)
}

fn code<T: std::fmt::Debug>(r: Result<T>) -> ErrorCode {
    r.expect_err("expected an error").code
}

#[test]
fn generation_rules_across_mappings() {
    let a = Arc::new(region());
    let b = second_mapping(&a);
    write(&a, 2, 5, 10, b"five").unwrap();
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
    write(&b, 2, 6, 0, b"six").unwrap();
    assert_eq!(a.generation(2), Some(6));
    assert_eq!(code(write(&a, 2, 5, 0, b"OLD")), ErrorCode::Stale);
    assert_eq!(
        read(&a, 2, 6, 0, 3).unwrap(),
        b"six",
        "a stale write writes nothing"
    );
    // A zero-length write is a claim.
    write(&a, 2, 9, 0, &[]).unwrap();
    assert_eq!(b.generation(2), Some(9));
    assert_eq!(code(read(&b, 2, 6, 0, 3)), ErrorCode::Stale);
    assert_eq!(b.writers_in_flight(2), Some(0), "every writer left");
    // Bit 63 is reserved.
    assert_eq!(
        code(write(&a, 1, SETTLING | 1, 0, b"x")),
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
        assert_eq!(code(write(&a, block, 7, off, &data)), ErrorCode::OutOfRange);
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
fn old_owner_never_overwrites_new_owner<A: Role, B: Role>(
    old_side: Arc<Region<A>>,
    new_side: Arc<Region<B>>,
    rounds: u64,
) {
    let base = old_side.generation(3).unwrap();
    for round in 0..rounds {
        let old = base + 2 * round + 1;
        let new = old + 1;
        write(&old_side, 3, old, 0, &[1u8; BS as usize]).unwrap();
        let writer = {
            let s = old_side.clone();
            busy_thread(move || match write(&s, 3, old, 0, &[1u8; BS as usize]) {
                Ok(()) => true,
                Err(e) => {
                    assert_eq!(e.code, ErrorCode::Stale);
                    false
                }
            })
        };
        write(&new_side, 3, new, 0, &[2u8; BS as usize]).unwrap();
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
fn racing_reads_get_old_bytes_or_stale<A: Role, B: Role>(
    reader_side: Arc<Region<A>>,
    claim_side: Arc<Region<B>>,
    rounds: u64,
) {
    let base = claim_side.generation(0).unwrap();
    for round in 0..rounds {
        let old = base + 2 * round + 1;
        write(&claim_side, 0, old, 0, &[7u8; BS as usize]).unwrap();
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
        write(&claim_side, 0, old + 1, 0, &[9u8; BS as usize]).unwrap();
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

/// Longer than any timeout the protocol ever had (it waited 100 ms for old
/// writers, 200 ms for a settling claim): something that must still be
/// waiting after this long waits for an event, not for time.
const LONGER_THAN_ANY_TIMEOUT: Duration = Duration::from_millis(500);

/// Runs `f` on a thread of its own (driven by `block_on`); `done` says
/// whether it has returned.
fn spawn_async<T: Send + 'static>(
    f: impl std::future::Future<Output = T> + Send + 'static,
) -> (Spawned<T>, Arc<AtomicBool>) {
    let done = Arc::new(AtomicBool::new(false));
    let flag = done.clone();
    let thread = std::thread::spawn(move || {
        let v = block_on(f);
        flag.store(true, Ordering::SeqCst);
        v
    });
    let spawned = Spawned {
        thread,
        done: done.clone(),
    };
    (spawned, done)
}

/// A thread of [`spawn_async`]: joining it fails the test, rather than
/// hanging it, if the operation never returns (a lost wake-up).
struct Spawned<T> {
    thread: std::thread::JoinHandle<T>,
    done: Arc<AtomicBool>,
}

impl<T> Spawned<T> {
    fn join(self) -> std::thread::Result<T> {
        wait_until("the operation to return", || {
            self.done.load(Ordering::SeqCst)
        });
        self.thread.join()
    }
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    // A generous bound that only catches hangs.
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "hung waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Regression: a claim used to presume writers dead after 100 ms and go
/// on, so a writer stalled mid-copy for longer landed its late bytes on
/// the new owner. Now the claim (and a second writer of the new owner)
/// waits for the stalled writer however long it takes, and its late bytes
/// end up under the new owner's.
#[test]
fn a_claim_waits_for_a_stalled_writer_however_long() {
    let a = Arc::new(region());
    let b = Arc::new(second_mapping(&a));
    block_on(a.write(1, 1, 0, &[1u8; 100])).unwrap();
    let stalled = stall_write(&a, 1, 1).unwrap();
    assert_eq!(a.writers_in_flight(1), Some(1));
    let (claim, claim_done) = {
        let b = b.clone();
        spawn_async(async move { b.write(1, 2, 0, &[2u8; 50]).await })
    };
    wait_until("the claim", || a.is_settling(1) == Some(true));
    assert_eq!(a.generation(1), Some(2));
    // A second writer of the new owner (other bytes of the block) must not
    // write while the old writer still may: it helps the claim, and waits.
    let (sibling, sibling_done) = {
        let a = a.clone();
        spawn_async(async move { a.write(1, 2, 50, &[3u8; 50]).await })
    };
    assert_eq!(
        code(read(&a, 1, 1, 0, 1)),
        ErrorCode::Stale,
        "the old owner's reads are over"
    );
    assert_eq!(code(read(&b, 1, 2, 0, 1)), ErrorCode::Stale, "not settled");
    std::thread::sleep(LONGER_THAN_ANY_TIMEOUT);
    assert!(!claim_done.load(Ordering::SeqCst), "the claim waits");
    assert!(
        !sibling_done.load(Ordering::SeqCst),
        "so does its generation"
    );
    assert_eq!(a.is_settling(1), Some(true));
    // The stalled writer wakes up and lands its late bytes.
    stalled.land(0, &[1u8; 100]);
    claim.join().unwrap().unwrap();
    sibling.join().unwrap().unwrap();
    let bytes = read(&a, 1, 2, 0, 100).unwrap();
    assert_eq!(&bytes[..50], &[2u8; 50][..], "no late byte under gen 2");
    assert_eq!(&bytes[50..], &[3u8; 50][..], "no late byte under gen 2");
    assert_eq!(a.writers_in_flight(1), Some(0));
    assert_eq!(a.is_settling(1), Some(false));
}

/// Regression: a writer killed mid-copy used to be forgiven after 100 ms.
/// Now its lane holds claims of its block until the server reclaims its
/// slot (its hand-over connection closed), and then they go on; the slot
/// is granted again only after that.
#[test]
fn a_dead_writer_holds_claims_until_its_slot_is_reclaimed() {
    let a = Arc::new(region());
    let free = a.free_slots();
    let (m, lease) = mapping_with_lease(&a);
    assert_eq!(a.free_slots(), free - 1);
    block_on(m.write(0, 1, 0, b"old")).unwrap();
    stall_write(&m, 0, 1).unwrap().die();
    drop(m);
    let (claim, done) = {
        let a = a.clone();
        spawn_async(async move { a.write(0, 2, 0, b"new").await })
    };
    wait_until("the claim", || a.is_settling(0) == Some(true));
    std::thread::sleep(LONGER_THAN_ANY_TIMEOUT);
    assert!(
        !done.load(Ordering::SeqCst),
        "a dead writer is never presumed"
    );
    assert_eq!(a.free_slots(), free - 1, "not granted before reclaim");
    block_on(lease.reclaim());
    claim.join().unwrap().unwrap();
    assert_eq!(read(&a, 0, 2, 0, 3).unwrap(), b"new");
    assert_eq!(a.writers_in_flight(0), Some(0));
    assert_eq!(a.free_slots(), free, "granted again after reclaim");
}

/// A claimer killed mid-claim (the block left settling, its lane
/// claiming): reclaiming its slot completes the claim, once the older
/// writer it was waiting for has finished, and the new owner reads and
/// writes.
#[test]
fn a_dead_claimer_is_settled_by_reclamation() {
    let a = Arc::new(region());
    block_on(a.write(0, 1, 0, b"old")).unwrap();
    let stalled = stall_write(&a, 0, 1).unwrap();
    let (m, lease) = mapping_with_lease(&a);
    let claim = start_claim(&m, 0, 2)
        .unwrap()
        .expect("waits for the old writer");
    claim.die();
    drop(m);
    assert_eq!(a.is_settling(0), Some(true));
    assert_eq!(code(read(&a, 0, 2, 0, 3)), ErrorCode::Stale, "not settled");
    let (reclaim, done) = spawn_async(lease.reclaim());
    std::thread::sleep(LONGER_THAN_ANY_TIMEOUT);
    assert!(
        !done.load(Ordering::SeqCst),
        "reclamation settles only safely"
    );
    assert_eq!(a.is_settling(0), Some(true));
    stalled.land(0, b"OLD");
    reclaim.join().unwrap();
    assert_eq!(a.is_settling(0), Some(false), "reclamation settled it");
    assert_eq!(a.generation(0), Some(2));
    assert_eq!(read(&a, 0, 2, 0, 3).unwrap(), b"OLD", "bytes from before");
    block_on(a.write(0, 2, 0, b"two")).unwrap();
    assert_eq!(read(&a, 0, 2, 0, 3).unwrap(), b"two");
    assert_eq!(code(block_on(a.write(0, 1, 0, b"one"))), ErrorCode::Stale);
}

/// Without reclamation, the next writer of the dead claimer's generation
/// settles its claim (after the old writer), and a newer generation simply
/// claims over it.
#[test]
fn a_dead_claim_is_settled_by_its_generation_or_superseded() {
    let a = Arc::new(region());
    let m = second_mapping(&a);
    block_on(a.write(0, 1, 0, b"old")).unwrap();
    let stalled = stall_write(&a, 0, 1).unwrap();
    start_claim(&m, 0, 2).unwrap().unwrap().die();
    let (helper, done) = {
        let a = a.clone();
        spawn_async(async move { a.write(0, 2, 0, b"two").await })
    };
    std::thread::sleep(LONGER_THAN_ANY_TIMEOUT);
    assert!(
        !done.load(Ordering::SeqCst),
        "the helper waits for the old writer"
    );
    stalled.land(0, b"OLD");
    helper.join().unwrap().unwrap();
    assert_eq!(read(&a, 0, 2, 0, 3).unwrap(), b"two");

    let stalled = stall_write(&a, 1, 0).unwrap();
    start_claim(&m, 1, 3).unwrap().unwrap().die();
    let (newer, _) = {
        let a = a.clone();
        spawn_async(async move { a.write(1, 4, 0, b"four").await })
    };
    wait_until("the newer claim", || a.generation(1) == Some(4));
    stalled.land(0, b"zero");
    newer.join().unwrap().unwrap();
    assert_eq!(read(&a, 1, 4, 0, 4).unwrap(), b"four");
    assert_eq!(code(block_on(a.write(1, 3, 0, b"3"))), ErrorCode::Stale);
}

#[test]
fn a_newer_claim_takes_over_a_settling_one() {
    let a = Arc::new(region());
    block_on(a.write(2, 1, 0, b"one")).unwrap();
    let stalled = stall_write(&a, 2, 1).unwrap();
    let (first, _) = {
        let a = a.clone();
        spawn_async(async move { a.write(2, 2, 0, b"two").await })
    };
    wait_until("the first claim", || {
        a.generation(2) == Some(2) && a.is_settling(2) == Some(true)
    });
    let (second, _) = {
        let a = a.clone();
        spawn_async(async move { a.write(2, 3, 0, b"three").await })
    };
    let e = first.join().unwrap().unwrap_err();
    assert_eq!(e.code, ErrorCode::Stale, "{e}");
    assert!(e.message.contains("generation 3"), "{e}");
    stalled.land(0, b"one");
    second.join().unwrap().unwrap();
    assert_eq!(read(&a, 2, 3, 0, 5).unwrap(), b"three");
    assert_eq!(a.writers_in_flight(2), Some(0));
}

/// A waker that counts its wake-ups.
#[derive(Default)]
struct Count(std::sync::atomic::AtomicUsize);

impl std::task::Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Count {
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Polls `f` once with `count`'s waker: whether it is ready.
fn poll_with<F: std::future::Future>(f: std::pin::Pin<&mut F>, count: &Arc<Count>) -> bool {
    let waker = std::task::Waker::from(count.clone());
    f.poll(&mut std::task::Context::from_waker(&waker))
        .is_ready()
}

/// A write that must wait returns to its executor and is woken only when
/// a lane changes (not before, and not on a timer): for a claim waiting
/// for an old writer, and for a write waiting for a free lane of its slot.
/// Dropping it meanwhile frees its lane.
#[test]
fn waiting_writes_sleep_until_a_lane_changes() {
    let a = Arc::new(region());
    let m = second_mapping(&a);
    block_on(a.write(3, 1, 0, b"old")).unwrap();
    let stalled = stall_write(&a, 3, 1).unwrap();
    let woken = Arc::new(Count::default());
    let mut claim = std::pin::pin!(m.write(3, 2, 0, b"new"));
    assert!(!poll_with(claim.as_mut(), &woken), "pending");
    std::thread::sleep(LONGER_THAN_ANY_TIMEOUT);
    assert_eq!(
        woken.get(),
        0,
        "nothing to wake it for while the writer stalls"
    );
    assert!(
        !poll_with(claim.as_mut(), &woken),
        "a spurious poll changes nothing"
    );
    stalled.land(0, b"OLD");
    wait_until("the wake-up", || woken.get() > 0);
    assert!(
        poll_with(claim.as_mut(), &woken),
        "done once the old writer is"
    );
    assert_eq!(read(&m, 3, 2, 0, 3).unwrap(), b"new");

    // Every lane of the slot taken by stalled writes: the next one waits.
    let lanes = m.layout().lanes_per_slot;
    let mut held: Vec<_> = (0..lanes).map(|_| stall_write(&m, 3, 2).unwrap()).collect();
    assert_eq!(m.writers_in_flight(3), Some(lanes));
    {
        let mut more = std::pin::pin!(m.write(0, 1, 0, b"x"));
        assert!(!poll_with(more.as_mut(), &Arc::default()));
        assert_eq!(m.generation(0), Some(0), "nothing done yet");
        // Dropped while waiting: nothing happens.
    }
    let woken = Arc::new(Count::default());
    let mut more = std::pin::pin!(m.write(0, 1, 0, b"x"));
    assert!(!poll_with(more.as_mut(), &woken));
    held.pop().unwrap().land(0, b"y");
    wait_until("the wake-up", || woken.get() > 0);
    assert!(poll_with(more.as_mut(), &woken), "a lane came free");
    assert_eq!(read(&a, 0, 1, 0, 1).unwrap(), b"x");
    drop(held);

    // A claim dropped while waiting frees its lane; its generation's next
    // write settles the block.
    let stalled = stall_write(&a, 2, 0).unwrap();
    {
        let mut claim = std::pin::pin!(m.write(2, 5, 0, b"five"));
        assert!(!poll_with(claim.as_mut(), &Arc::default()));
    }
    assert_eq!(a.is_settling(2), Some(true));
    assert_eq!(m.writers_in_flight(2), Some(1), "only the stalled writer");
    stalled.land(0, b"zero");
    block_on(m.write(2, 5, 0, b"five")).unwrap();
    assert_eq!(read(&a, 2, 5, 0, 4).unwrap(), b"five");
    assert_eq!(m.writers_in_flight(2), Some(0));
}

/// Slots: one per client process, until none is left; a slot is granted
/// again only once reclaimed, and never if its lease was dropped (the
/// server stopping: its process may still be writing).
#[test]
fn client_slots_are_granted_once_and_reused_only_after_reclamation() {
    let a = Arc::new(region());
    let l = *a.layout();
    let clients = (l.slots - l.server_slots) as usize;
    assert_eq!(a.free_slots(), clients);
    let mut leases: Vec<_> = (0..clients).map(|_| a.lease_slot().unwrap()).collect();
    let mut seen: Vec<u32> = leases.iter().map(|s| s.slot()).collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), clients, "distinct slots");
    assert!(seen.iter().all(|&s| l.is_client_slot(s)));
    assert!(a.lease_slot().is_none(), "no slot left");
    drop(leases.pop());
    assert!(a.lease_slot().is_none(), "a dropped lease retires its slot");
    let last = leases.pop().unwrap();
    let slot = last.slot();
    block_on(last.reclaim());
    assert_eq!(a.lease_slot().map(|s| s.slot()), Some(slot));
    // A client mapping grants nothing: it has no `free_slots` or
    // `lease_slot` (a `ClientRegion`).
}

/// Many threads on two mappings, each owning its own bytes of one block,
/// all under one generation: writes of one owner never disturb each other.
#[test]
fn concurrent_writers_of_one_generation_keep_their_bytes() {
    let a = Arc::new(region());
    let b = Arc::new(second_mapping(&a));
    write(&a, 0, 1, 0, &[]).unwrap();
    fn writer<R: Role>(r: Arc<Region<R>>, t: u32) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            for round in 0..2000u32 {
                let v = vec![(t * 31 + round) as u8; 512];
                write(&r, 0, 1, t * 512, &v).unwrap();
                assert_eq!(read(&r, 0, 1, t * 512, 512).unwrap(), v);
            }
        })
    }
    let threads: Vec<_> = (0..8u32)
        .map(|t| {
            if t % 2 == 0 {
                writer(a.clone(), t)
            } else {
                writer(b.clone(), t)
            }
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(a.writers_in_flight(0), Some(0));
}

#[test]
fn prefault_walks_a_client_mapping_once_and_keeps_its_bytes() {
    let server = Arc::new(Region::create(4096, 300).unwrap());
    assert_eq!(
        server.prefault(0),
        None,
        "the server maps everything at create"
    );
    write(&server, 7, 1, 0, b"kept").unwrap();
    let client = second_mapping(&server);
    assert!(!client.is_populated(7));
    // 16 MiB of 4 KiB blocks per call would be 4096: all 300 at once.
    assert_eq!(client.prefault(0), Some(300));
    assert_eq!(client.prefault(300), None);
    assert!((0..300).all(|b| client.is_populated(b)));
    assert_eq!(read(&client, 7, 1, 0, 4).unwrap(), b"kept");

    // Large blocks: one chunk is 16 MiB worth, and a large access maps its
    // block in on the spot.
    let server = Arc::new(Region::create(8 << 20, 5).unwrap());
    let client = second_mapping(&server);
    write(&client, 4, 1, 0, &vec![9u8; 1 << 20]).unwrap();
    assert!(client.is_populated(4), "a large write maps its block in");
    write(&client, 3, 1, 0, b"small").unwrap();
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

/// Environment variable naming the abstract socket a child test process
/// (see [`child_process_writer`]) receives its region from.
const CHILD_SOCKET: &str = "NK_SHM_TEST_CHILD_SOCKET";

/// Not a test by itself: the body of the client process that
/// [`a_live_stalled_process_is_waited_for_and_a_killed_one_reclaimed`]
/// starts (this test binary again, with only this test selected). It maps
/// the region over the hand-over socket and obeys commands on stdin:
/// `stall BLOCK GEN` starts a write and stops it where its copy would
/// begin, `land BYTE` finishes that write with 100 bytes of `BYTE`. It
/// answers each with a line starting `NKCHILD`.
#[test]
fn child_process_writer() {
    use std::io::BufRead;
    let Ok(name) = std::env::var(CHILD_SOCKET) else {
        return;
    };
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let sock = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    let region = crate::receive_region(&sock).unwrap();
    println!("NKCHILD mapped {}", region.slot().unwrap());
    let mut stalled = None;
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["stall", block, gen] => {
                let w = stall_write(&region, block.parse().unwrap(), gen.parse().unwrap());
                stalled = Some(w.unwrap());
                println!("NKCHILD stalled");
            }
            ["land", byte] => {
                let byte: u8 = byte.parse().unwrap();
                stalled.take().unwrap().land(0, &[byte; 100]);
                println!("NKCHILD landed");
            }
            _ => panic!("unknown command {line:?}"),
        }
    }
    drop(stalled);
    drop(region);
    drop(sock);
}

/// The child process of the test below, and its stdout.
struct Child {
    process: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Child {
    fn start(socket: &str) -> Child {
        use std::process::{Command, Stdio};
        let mut process = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "tests::child_process_writer",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_SOCKET, socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = process.stdin.take().unwrap();
        let stdout = process.stdout.take().unwrap();
        let lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
        Child {
            process,
            stdin,
            lines,
        }
    }

    /// Sends `command` (if any) and waits for the answer containing
    /// `NKCHILD <answer>`. Blocks until it comes (the child dying fails).
    fn ask(&mut self, command: Option<&str>, answer: &str) {
        use std::io::Write;
        if let Some(c) = command {
            writeln!(self.stdin, "{c}").unwrap();
        }
        let want = format!("NKCHILD {answer}");
        for line in self.lines.by_ref() {
            if line.unwrap().contains(&want) {
                return;
            }
        }
        panic!("the child process ended before answering {want:?}");
    }
}

/// Regression for the defect this protocol replaces, with a real second
/// process on a real hand-over connection. A claim used to presume a
/// writer dead after 100 ms and forgive it, so a writer that was only
/// slow landed its late bytes on the new owner. Now:
///
/// * a client process whose write stalls for far longer than 100 ms, but
///   which is alive, is waited for: the claim completes only after its
///   bytes have landed, so they are accounted before the new owner's;
/// * a client process killed mid-write (SIGKILL) closes its hand-over
///   connection; the server sees end-of-file, reclaims its slot, and only
///   then does the claim go on.
#[test]
fn a_live_stalled_process_is_waited_for_and_a_killed_one_reclaimed() {
    use std::io::Read;
    use std::os::fd::AsFd;
    use std::os::linux::net::SocketAddrExt;
    let server = Arc::new(region());
    let free = server.free_slots();
    let name = format!("nodekernel-shm-test-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = std::os::unix::net::UnixListener::bind_addr(&addr).unwrap();
    // The server's side of the hand-over, as the storage server runs it:
    // grant a slot, then reclaim it at end-of-file.
    let reclaimed = Arc::new(AtomicBool::new(false));
    let serve = {
        let server = server.clone();
        let reclaimed = reclaimed.clone();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let lease = server.lease_slot().unwrap();
            crate::send_region(conn.as_fd(), &server, Some(lease.slot())).unwrap();
            let mut buf = [0u8; 16];
            while conn.read(&mut buf).unwrap() != 0 {}
            block_on(lease.reclaim());
            reclaimed.store(true, Ordering::SeqCst);
        })
    };
    write(&server, 1, 1, 0, &[9u8; 200]).unwrap();
    let mut child = Child::start(&name);
    child.ask(None, "mapped");
    assert_eq!(server.free_slots(), free - 1);

    // Alive but stalled for far longer than the old 100 ms.
    child.ask(Some("stall 1 1"), "stalled");
    assert_eq!(server.writers_in_flight(1), Some(1));
    let (claim, claimed) = {
        let s = server.clone();
        spawn_async(async move { s.write(1, 2, 0, &[2u8; 50]).await })
    };
    wait_until("the claim", || server.is_settling(1) == Some(true));
    std::thread::sleep(LONGER_THAN_ANY_TIMEOUT);
    assert!(
        !claimed.load(Ordering::SeqCst),
        "a live writer is waited for"
    );
    assert!(!reclaimed.load(Ordering::SeqCst), "and never reclaimed");
    assert_eq!(server.writers_in_flight(1), Some(1), "nor forgiven");
    child.ask(Some("land 1"), "landed");
    claim.join().unwrap().unwrap();
    let bytes = read(&server, 1, 2, 0, 200).unwrap();
    assert_eq!(&bytes[..50], &[2u8; 50][..], "the new owner's bytes");
    assert_eq!(
        &bytes[50..100],
        &[1u8; 50][..],
        "the late bytes, accounted before"
    );
    assert_eq!(&bytes[100..], &[9u8; 100][..]);
    assert_eq!(server.writers_in_flight(1), Some(0));

    // Killed mid-write: waited for until its connection closes, then
    // reclaimed.
    child.ask(Some("stall 1 2"), "stalled");
    let (claim, claimed) = {
        let s = server.clone();
        spawn_async(async move { s.write(1, 3, 0, &[3u8; 50]).await })
    };
    wait_until("the claim", || server.is_settling(1) == Some(true));
    std::thread::sleep(LONGER_THAN_ANY_TIMEOUT);
    assert!(!claimed.load(Ordering::SeqCst), "still waited for");
    child.process.kill().unwrap();
    child.process.wait().unwrap();
    claim.join().unwrap().unwrap();
    serve.join().unwrap();
    assert!(reclaimed.load(Ordering::SeqCst));
    assert_eq!(server.free_slots(), free, "the slot is free again");
    assert_eq!(server.writers_in_flight(1), Some(0));
    assert_eq!(&read(&server, 1, 3, 0, 50).unwrap()[..], &[3u8; 50][..]);
}

/// A write received in place holds its block like a copy in progress: a
/// claim of a newer generation waits until it is dropped, its bytes (all
/// written through the raw pointer) are the block's under its own
/// generation, and none of them is seen under the newer one.
#[test]
fn an_in_place_write_holds_claims_until_it_is_dropped() {
    let a = Arc::new(region());
    let w = block_on(a.write_in_place(2, 4, 10, 100)).unwrap();
    assert_eq!(w.len(), 100);
    assert_eq!(a.writers_in_flight(2), Some(1));
    // SAFETY: the write covers 100 bytes at `ptr`.
    unsafe { std::ptr::write_bytes(w.ptr(), 7, 100) };
    assert_eq!(read(&a, 2, 4, 10, 100).unwrap(), vec![7u8; 100]);
    let (claim, claim_done) = {
        let a = a.clone();
        spawn_async(async move { a.claim(2, 5).await })
    };
    wait_until("the claim", || a.is_settling(2) == Some(true));
    assert!(!claim_done.load(Ordering::SeqCst), "the claim waits");
    // Late bytes of the in-place write still land before the claim ends.
    // SAFETY: as above.
    unsafe { std::ptr::write_bytes(w.ptr(), 8, 50) };
    drop(w);
    claim.join().unwrap().unwrap();
    assert_eq!(a.writers_in_flight(2), Some(0));
    assert_eq!(code(read(&a, 2, 4, 10, 1)), ErrorCode::Stale);
    // An older generation is refused before anything is handed out, and
    // so is a range past the block.
    assert_eq!(
        code(block_on(a.write_in_place(2, 4, 0, 1))),
        ErrorCode::Stale
    );
    let past = block_on(a.write_in_place(2, 5, BS - 1, 2));
    assert_eq!(code(past), ErrorCode::OutOfRange);
    assert_eq!(a.writers_in_flight(2), Some(0), "refusals hold no lane");
}

/// A region in a regular file (a persistent server's DRAM tier) is kept
/// across the death of every process that mapped it: block bytes and
/// generations stay, while what only those processes could mean goes —
/// the closed state, the lanes of a writer that died mid-copy and of a
/// claimer that died mid-claim, the waiting counts, and the claim's
/// `SETTLING` bit. A later claim then completes at once instead of
/// waiting for a writer that no longer exists.
#[test]
fn a_file_backed_region_is_kept_and_its_transient_state_reset() {
    let dir = std::env::temp_dir().join(format!("nk-shm-keep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("dram");
    assert!(Region::check_file(&path, BS, N)
        .unwrap_err()
        .contains("missing"));
    {
        let a = Arc::new(Region::open_file(&path, BS, N, false).unwrap());
        write(&a, 1, 7, 0, b"kept bytes").unwrap();
        write(&a, 0, 1, 0, b"old").unwrap();
        let (m, lease) = mapping_with_lease(&a);
        // A client writer stalls mid-copy, and the server's claim of a
        // newer generation waits for it; then every process dies.
        let stalled = stall_write(&m, 0, 1).unwrap();
        let claim = start_claim(&a, 0, 2)
            .unwrap()
            .expect("waits for the stalled writer");
        assert!(a.lanes_busy());
        assert_eq!(a.is_settling(0), Some(true));
        stalled.die();
        claim.die();
        a.close();
        // A stopped server writes nothing more itself.
        assert_eq!(code(write(&a, 2, 1, 0, b"late")), ErrorCode::Unavailable);
        assert_eq!(a.writers_in_flight(2), Some(0), "and holds no lane for it");
        std::mem::forget(lease);
        drop(m);
    }
    Region::check_file(&path, BS, N).unwrap();
    let e = Region::check_file(&path, BS, N + 1).unwrap_err();
    assert!(e.contains("bytes"), "{e}");
    let e = Region::open_file(&path, BS * 2, N / 2, true).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{e}");

    let a = Arc::new(Region::open_file(&path, BS, N, true).unwrap());
    assert!(!a.is_closed(), "serving again");
    assert!(!a.lanes_busy(), "the dead processes' lanes are free");
    assert_eq!(a.writers_in_flight(0), Some(0));
    assert_eq!(a.is_settling(0), Some(false), "the dead claim is settled");
    assert_eq!(a.generation(0), Some(2));
    assert_eq!(a.generation(1), Some(7));
    assert_eq!(read(&a, 1, 7, 0, 10).unwrap(), b"kept bytes");
    assert_eq!(code(read(&a, 0, 1, 0, 3)), ErrorCode::Stale);
    // A newer claim does not wait for the writer that died.
    assert!(
        start_claim(&a, 0, 3).unwrap().is_none(),
        "the claim completes at once"
    );
    write(&a, 0, 3, 0, b"new").unwrap();
    assert_eq!(read(&a, 0, 3, 0, 3).unwrap(), b"new");
    // Every client slot can be granted again.
    assert_eq!(
        a.free_slots(),
        (a.layout().slots - a.layout().server_slots) as usize
    );
    drop(a);

    // Without keep, the file is emptied: generation 0, zeros.
    let a = Region::open_file(&path, BS, N, false).unwrap();
    assert_eq!(a.generation(1), Some(0));
    assert_eq!(read(&a, 1, 0, 0, 10).unwrap(), vec![0u8; 10]);
    drop(a);
    // A damaged header is not kept.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"XX", 0).unwrap();
    let e = Region::check_file(&path, BS, N).unwrap_err();
    assert!(e.contains("header"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
