//! Model check of the block protocol ([`nodekernel_shm::protocol`]) with
//! loom: every interleaving of the scenarios below, under the C11 memory
//! model, up to a bound on preemptions.
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p nodekernel-shm --release --test loom
//! ```
//!
//! The code under test is the crate's own `protocol` module, run on loom
//! atomics and fences. Block bytes are `loom::cell::UnsafeCell`s that
//! writers write while the protocol lets them copy, so loom's race detector
//! fails the run if a copy of one generation is not ordered with a copy of
//! another (an old writer's late bytes landing while a new owner writes).
//! Each cell also has a relaxed atomic mirror, which the seqlock readers
//! load (their copy is racy by design, and discarded when the generation
//! moved). The futex is modelled by a loom mutex and condition variable
//! with the futex's semantics (the value check and the sleep are atomic
//! with respect to wake-ups), so a missed wake-up is a deadlock, which loom
//! reports. A dead process is a thread that abandons its write (or its
//! wait) without cleaning up; its slot is reclaimed only after that thread
//! has been joined, as the server reclaims only once the hand-over
//! connection reached end-of-file. Each scenario ends with the invariants
//! that no count ends short: every lane free, every waiting count at zero,
//! the block settled, and the newest owner's bytes in the block.
//!
//! Loom's limits: it treats `SeqCst` loads, stores and read-modify-writes
//! as acquire/release (weaker than C11: no false negatives from that), but
//! makes `SeqCst` fences synchronize with one another (stronger than C11).
//! The protocol's safety never rests on a fence creating happens-before:
//! the Dekker pairs only decide who sees whose store, and every copy is
//! ordered after an older one through a lane freed with release (or
//! swapped to free by the reclamation, after the dead thread's join) and
//! read with acquire. The fence-less and wrong-order variants of each
//! Dekker pair and wake-up fail here (checked by mutation when this file
//! was written).
//!
//! Bound: loom explores every interleaving with at most
//! `LOOM_MAX_PREEMPTIONS` preemptions per execution. The default here,
//! [`DEFAULT_PREEMPTIONS`] = 4, takes about a minute on two cores in
//! release mode (3: about 5 s; each step multiplies the time by about
//! ten). Set `LOOM_MAX_PREEMPTIONS` to search deeper or to go faster.
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{fence, AtomicU32, AtomicU64};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;
use nodekernel_shm::protocol::{
    self, read_begin, read_end, Lanes, Memory, Waiting, Word, Write, SETTLING,
};
use std::sync::atomic::Ordering::{self, Relaxed, SeqCst};
use std::task::Poll;

/// Preemption bound when `LOOM_MAX_PREEMPTIONS` is not set.
const DEFAULT_PREEMPTIONS: usize = 4;

/// The only block of the model.
const BLOCK: u32 = 0;

/// A loom word (a newtype: `Word` and loom's atomics are both foreign here).
struct W(AtomicU64);

impl W {
    fn new(v: u64) -> W {
        W(AtomicU64::new(v))
    }
}

impl Word for W {
    fn load(&self, order: Ordering) -> u64 {
        self.0.load(order)
    }
    fn store(&self, value: u64, order: Ordering) {
        self.0.store(value, order)
    }
    fn swap(&self, value: u64, order: Ordering) -> u64 {
        self.0.swap(value, order)
    }
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        self.0.compare_exchange(current, new, success, failure)
    }
    fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
        self.0.fetch_add(value, order)
    }
    fn fetch_sub(&self, value: u64, order: Ordering) -> u64 {
        self.0.fetch_sub(value, order)
    }
}

/// One part of the block's bytes.
struct Cell {
    /// What writers write while the protocol lets them copy.
    bytes: UnsafeCell<u64>,
    /// The same value, for racy seqlock readers.
    mirror: AtomicU64,
}

/// The shared region of the model: one block, `slots` slots of `per_slot`
/// lanes, the wake-up words, and a futex.
struct Mem {
    generation: W,
    lanes: Vec<W>,
    per_slot: usize,
    waiting: W,
    slot_waiting: Vec<W>,
    seq: AtomicU32,
    futex: Mutex<()>,
    woken: Condvar,
    cells: Vec<Cell>,
}

impl Mem {
    /// Generation `gen` owns the block, whose cells hold `value`.
    fn new(slots: usize, per_slot: usize, cells: usize, gen: u64, value: u64) -> Arc<Mem> {
        Arc::new(Mem {
            generation: W::new(gen),
            lanes: (0..slots * per_slot).map(|_| W::new(0)).collect(),
            per_slot,
            waiting: W::new(0),
            slot_waiting: (0..slots).map(|_| W::new(0)).collect(),
            seq: AtomicU32::new(0),
            futex: Mutex::new(()),
            woken: Condvar::new(),
            cells: (0..cells)
                .map(|_| Cell {
                    bytes: UnsafeCell::new(value),
                    mirror: AtomicU64::new(value),
                })
                .collect(),
        })
    }

    fn lanes_of(&self, slot: u32) -> Lanes {
        Lanes {
            slot,
            first: slot as usize * self.per_slot,
            count: self.per_slot,
        }
    }

    /// The copy of a write the protocol let through.
    fn copy(&self, cell: usize, value: u64) {
        let c = &self.cells[cell];
        // SAFETY (loom checks it): the protocol orders this copy with every
        // other access to the cell's bytes.
        c.bytes.with_mut(|p| unsafe { *p = value });
        c.mirror.store(value, Relaxed);
    }

    /// The cell's bytes, once every thread is done.
    fn value(&self, cell: usize) -> u64 {
        self.cells[cell].bytes.with(|p| unsafe { *p })
    }

    /// A whole write of `value` into `cells` by a live process: `Ok`, or
    /// `Err(current)` when the block belongs to a newer generation.
    fn write(&self, slot: u32, gen: u64, cells: &[usize], value: u64) -> Result<(), u64> {
        let mut op = Write::new(self, self.lanes_of(slot), BLOCK, gen);
        protocol::drive(self, slot, || op.poll())?;
        for &c in cells {
            self.copy(c, value + c as u64);
        }
        op.finish();
        Ok(())
    }

    /// What a server does once the process of `slot` is gone.
    fn reclaim(&self, slot: u32) {
        for block in protocol::clear_lanes(self, self.lanes_of(slot)) {
            assert_eq!(block, BLOCK, "a claim of a block that does not exist");
            protocol::drive(self, 0, || protocol::poll_settle(self, block));
        }
    }

    /// The invariants at the end of every scenario: no lane held, no
    /// waiting count short or left over, the block settled on `gen`.
    fn check_quiet(&self, gen: u64) {
        for (i, l) in self.lanes.iter().enumerate() {
            assert_eq!(l.load(SeqCst), 0, "lane {i} still held");
        }
        assert_eq!(self.waiting.load(SeqCst), 0, "waiting count");
        for (i, w) in self.slot_waiting.iter().enumerate() {
            assert_eq!(w.load(SeqCst), 0, "waiting count of slot {i}");
        }
        let w = self.generation.load(SeqCst);
        assert_eq!(w & SETTLING, 0, "the block is left settling");
        assert_eq!(w, gen);
    }
}

impl Memory for Mem {
    type Word = W;

    fn fence(&self, order: Ordering) {
        fence(order);
    }
    fn generation_word(&self, block: u32) -> &W {
        assert_eq!(block, BLOCK);
        &self.generation
    }
    fn lane(&self, index: usize) -> &W {
        &self.lanes[index]
    }
    fn lane_count(&self) -> usize {
        self.lanes.len()
    }
    fn waiting(&self) -> &W {
        &self.waiting
    }
    fn slot_waiting(&self, slot: u32) -> &W {
        &self.slot_waiting[slot as usize]
    }
    fn wake_seq(&self) -> u32 {
        self.seq.load(SeqCst)
    }
    /// FUTEX_WAKE after the increment, as `Region` does.
    fn wake_all(&self) {
        self.seq.fetch_add(1, SeqCst);
        let _g = self.futex.lock().unwrap();
        self.woken.notify_all();
    }
    /// FUTEX_WAIT: sleeps unless the value moved, atomically with respect
    /// to wake-ups (the futex's hash-bucket lock is the mutex here).
    fn wait(&self, seq: u32) {
        let g = self.futex.lock().unwrap();
        if self.seq.load(SeqCst) == seq {
            drop(self.woken.wait(g).unwrap());
        }
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(DEFAULT_PREEMPTIONS);
    }
    b.check(f);
}

/// An old writer (generation 1) against a new owner's write (generation 2,
/// a claim): the old copy is either entirely before the new one or does
/// not happen, and the block ends with the new owner's bytes.
#[test]
fn old_writer_against_claimer() {
    model(|| {
        let mem = Mem::new(2, 1, 1, 1, 10);
        let old = {
            let mem = mem.clone();
            thread::spawn(move || mem.write(0, 1, &[0], 11))
        };
        mem.write(1, 2, &[0], 20).unwrap();
        let _ = old.join().unwrap();
        assert_eq!(mem.value(0), 20, "an old byte landed on the new owner");
        mem.check_quiet(2);
    });
}

/// A seqlock reader of generation 1 racing a claim by generation 2 and
/// an old writer: whatever it accepts is generation 1's bytes.
#[test]
fn reader_gets_old_bytes_or_stale() {
    model(|| {
        let mem = Mem::new(2, 1, 1, 1, 10);
        let reader = {
            let mem = mem.clone();
            thread::spawn(move || {
                if read_begin(&*mem, BLOCK, 1).is_ok() {
                    let v = mem.cells[0].mirror.load(Relaxed);
                    if read_end(&*mem, BLOCK, 1).is_ok() {
                        assert!(v == 10 || v == 11, "read {v} under generation 1");
                    }
                }
            })
        };
        let old = {
            let mem = mem.clone();
            thread::spawn(move || mem.write(0, 1, &[0], 11))
        };
        mem.write(1, 2, &[0], 20).unwrap();
        let _ = old.join().unwrap();
        reader.join().unwrap();
        assert_eq!(mem.value(0), 20);
        mem.check_quiet(2);
    });
}

/// Two writers of the new generation 2 (each its own bytes) against an
/// old writer of generation 1 (all the bytes): one claims, the other helps
/// or waits, and neither copies while the old writer may.
#[test]
fn two_new_writers_against_an_old_writer() {
    model(|| {
        let mem = Mem::new(3, 1, 2, 1, 10);
        let old = {
            let mem = mem.clone();
            thread::spawn(move || mem.write(0, 1, &[0, 1], 11))
        };
        let other = {
            let mem = mem.clone();
            thread::spawn(move || mem.write(2, 2, &[1], 20))
        };
        mem.write(1, 2, &[0], 20).unwrap();
        other.join().unwrap().unwrap();
        let _ = old.join().unwrap();
        assert_eq!((mem.value(0), mem.value(1)), (20, 21));
        mem.check_quiet(2);
    });
}

/// A process killed mid-copy (its lane left writing): a claim waits for it
/// until its slot is reclaimed, which happens only once the process is
/// gone, so its bytes never land after the new owner's.
#[test]
fn dead_writer_is_reclaimed() {
    model(|| {
        let mem = Mem::new(2, 1, 1, 1, 10);
        let dead = {
            let mem = mem.clone();
            thread::spawn(move || {
                let mut op = Write::new(&*mem, mem.lanes_of(1), BLOCK, 1);
                if let Poll::Ready(Ok(())) = op.poll() {
                    mem.copy(0, 11);
                }
                op.die();
            })
        };
        let claim = {
            let mem = mem.clone();
            thread::spawn(move || mem.write(0, 2, &[0], 20))
        };
        // The hand-over connection reaches end-of-file only once the
        // process is gone.
        dead.join().unwrap();
        mem.reclaim(1);
        claim.join().unwrap().unwrap();
        assert_eq!(mem.value(0), 20);
        mem.check_quiet(2);
    });
}

/// A process killed mid-claim, possibly while registered as waiting (its
/// lane left claiming, the block settling, its waiting count held): the
/// reclamation settles the block only once the old writer is done, and
/// takes back what the dead process added to the waiting count. The new
/// owner then writes.
#[test]
fn dead_claimer_is_reclaimed() {
    model(|| {
        let mem = Mem::new(3, 1, 1, 1, 10);
        let old = {
            let mem = mem.clone();
            thread::spawn(move || mem.write(0, 1, &[0], 11))
        };
        let dead = {
            let mem = mem.clone();
            thread::spawn(move || {
                let mut op = Write::new(&*mem, mem.lanes_of(1), BLOCK, 2);
                if op.poll().is_pending() {
                    let waiting = Waiting::new(&*mem, 1);
                    waiting.round();
                    let _ = op.poll();
                    std::mem::forget(waiting);
                }
                op.die();
            })
        };
        dead.join().unwrap();
        mem.reclaim(1);
        // Whether or not the dead claim got as far as taking the block, a
        // write of generation 2 (another process) now completes, claiming
        // again if needed, and never while the old writer copies.
        mem.write(2, 2, &[0], 20).unwrap();
        let _ = old.join().unwrap();
        assert_eq!(mem.value(0), 20);
        mem.check_quiet(2);
    });
}

/// Two writes of one process whose slot has a single lane, and a claim by
/// another process: the write that finds no free lane sleeps until one is
/// freed, and no wake-up is lost.
#[test]
fn full_slot_waits_for_a_free_lane() {
    model(|| {
        let mem = Mem::new(2, 1, 2, 1, 10);
        let first = {
            let mem = mem.clone();
            thread::spawn(move || mem.write(1, 1, &[0], 11))
        };
        let claim = {
            let mem = mem.clone();
            thread::spawn(move || mem.write(0, 2, &[0, 1], 20))
        };
        let _ = mem.write(1, 1, &[1], 11);
        let _ = first.join().unwrap();
        claim.join().unwrap().unwrap();
        assert_eq!((mem.value(0), mem.value(1)), (20, 21));
        mem.check_quiet(2);
    });
}

/// A claim by generation 2 waits for an old writer (generation 1) that
/// holds its lane throughout; a claim by generation 3 supersedes it. The
/// waiting claim must learn of that and return `Stale` at once, while the
/// old writer still holds its lane (no lane changes after the newer claim:
/// only the claim itself can wake it). Then the old writer finishes and
/// the newest owner writes.
#[test]
fn a_newer_claim_wakes_a_superseded_one() {
    model(|| {
        let mem = Mem::new(3, 1, 1, 1, 10);
        let mut old = Write::new(&*mem, mem.lanes_of(0), BLOCK, 1);
        assert_eq!(old.poll(), Poll::Ready(Ok(())));
        let superseded = {
            let mem = mem.clone();
            thread::spawn(move || mem.write(1, 2, &[0], 20))
        };
        let newer = {
            let mem = mem.clone();
            thread::spawn(move || mem.write(2, 3, &[0], 30))
        };
        assert_eq!(superseded.join().unwrap(), Err(3));
        mem.copy(0, 11);
        old.finish();
        newer.join().unwrap().unwrap();
        assert_eq!(mem.value(0), 30);
        mem.check_quiet(3);
    });
}
