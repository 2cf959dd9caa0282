//! The block protocol itself, generic over where its words live.
//!
//! [`Region`](crate::Region) runs it on atomics inside the shared mapping;
//! the model check (`tests/loom.rs`, run with `RUSTFLAGS="--cfg loom"`)
//! runs this very code on `loom` atomics, with the block bytes as
//! `loom::cell::UnsafeCell`s, so that loom's race detector proves that an
//! older generation's copy never overlaps a newer owner's, and its deadlock
//! detector that no wait misses its wake-up. Nothing here copies block
//! bytes: a [`Write`] says when its caller may copy, and the caller tells
//! it when it is done.
//!
//! # Words
//!
//! * One **generation word** per block: the generation (below 2^63) of the
//!   block's owner, with [`SETTLING`] (bit 63) set while a claim by that
//!   generation waits for writers that may still be copying.
//! * **Lanes**, grouped in slots: one slot per writer process (the server
//!   has its own), a few lanes per slot. A lane is 0 when free, or holds
//!   the block a write of that process is working on: [`lane_writing`]
//!   while it may copy into the block, [`lane_claiming`] while it waits for
//!   a claim to settle (and will not copy before it has published itself
//!   as writing again). Only the lane's own process changes it, except
//!   that the server clears the lanes of a process that is gone.
//! * **Wake-up words**: a wake sequence (a futex word in the real region),
//!   a count of operations waiting in any process, and one such count per
//!   slot (see [Waiting](#waiting)).
//!
//! # Write (and claim)
//!
//! A writer of generation `g` takes a free lane of its slot, storing
//! `writing(block)` in it, and issues a `SeqCst` fence; then it loads the
//! generation word `w`:
//!
//! * `w & !SETTLING > g`: the block belongs to a newer owner: `Stale`;
//! * `w == g`: the block is ours and settled: fence(Release), copy, free
//!   the lane;
//! * `w < g` (a new owner: **claim**), or `w == g | SETTLING` (a claim by
//!   our generation is settling: **help** it): mark the lane claiming
//!   (so that claimers of our generation do not wait for us), swap the word
//!   to `g | SETTLING` if it was older, fence(SeqCst), and scan every lane
//!   of every slot. While some lane holds `writing(block)`, a write that
//!   read an older generation may be copying: wait (`Poll::Pending`,
//!   keeping the lane claiming). Once none does, `compare_exchange(g |
//!   SETTLING, g)`; then publish the lane as writing again, fence, and
//!   check the word again as above.
//!
//! The two fences make a Dekker pair. A writer stores its lane, fences,
//! loads the word; a claimer (or helper) stores the word, fences, loads the
//! lanes. The fences are totally ordered: if the writer's comes first, the
//! claimer's scan sees its lane (or a later value: the lane freed, after
//! the copy); otherwise the writer's load sees the claim (or a later
//! value), and it backs off without copying. So when a scan finds no lane
//! writing the block, every write that saw an older generation has
//! finished its copy, and every later one will see the claim. A newer
//! owner's copy therefore never overlaps an older generation's.
//!
//! Any writer of `g` (and the server reclaiming a dead process's slot) may
//! settle a claim by `g`: settling only needs a scan that comes after the
//! word was seen settling. So a claimer that stops waiting (its future
//! dropped, its process killed) never leaves the block stuck: the next
//! writer of its generation, a newer claim, or the server's reclamation
//! completes or supersedes the claim.
//!
//! The scan ignores claiming lanes and lanes of other blocks; a lane
//! writing the block with our own or a newer generation only delays us
//! until its write backs off (it saw the claim) or finishes (then the word
//! has moved on and the next check decides). A write that returns
//! `Pending` never holds a writing lane, so writes never wait for each
//! other in a cycle.
//!
//! # Read
//!
//! [`read_begin`], copy, [`read_end`]: the generation must be exactly the
//! reader's before and after the copy (a seqlock read; the copy may race
//! with a new owner's bytes and is then discarded). Every writer's
//! fence(Release) between seeing its generation settled and copying pairs
//! with the reader's fence(Acquire) after its copy: a copy that saw any
//! byte of a newer owner also sees that owner's generation in `read_end`.
//! Readers never store to shared memory and never wait.
//!
//! # Waiting
//!
//! A write (or a settle) that cannot go on waits for a lane to change: a
//! writing lane of its block to be freed or turned claiming, or a lane of
//! its slot to come free; a claim that waits also wakes when a newer
//! claim supersedes it (it then returns `Stale` without waiting for the
//! old writers, which may hold their lanes for long). Nothing is polled on
//! a timer. The waiter registers in the waiting counts ([`Waiting::new`]),
//! then, each round, loads the wake sequence, fences (`SeqCst`) and tries
//! again; if it must still wait, it sleeps until the wake sequence differs
//! from the value it loaded ([`Memory::wait`]: a futex wait in the real
//! region). Whoever frees or changes a lane, or swaps a settling
//! generation word for a newer claim, fences (`SeqCst`) and loads the
//! global waiting count; if it is not zero, it advances the wake sequence
//! and wakes every sleeper ([`Memory::wake_all`]). Another Dekker pair:
//! either the change comes before the waiter's try (which then sees it),
//! or the waiter's registration comes before the load of the count, and
//! the wake sequence advances after the waiter loaded it (so its sleep
//! ends at once or is woken).
//!
//! # Dead processes
//!
//! A process that dies keeps its lanes as they were. The server learns of
//! the death when the process's hand-over connection closes (the kernel
//! closes it once every thread has exited, so no copy of that process can
//! still be running) and then calls [`clear_lanes`] on its slot (which
//! also drops whatever the process had added to the waiting count, and
//! wakes every waiter) and [`poll_settle`] on every block it was claiming.
//! Until then, a claim of a block the dead process was writing waits;
//! nothing is ever presumed dead because of time.
//!
//! # Untrusted words
//!
//! Every word here is shared with other processes and may hold anything.
//! The code only compares lane and generation values, takes block numbers
//! out of lanes for callers to check against the layout ([`clear_lanes`]),
//! and uses wrapping arithmetic on the counts: no value read from shared
//! memory indexes anything or can make this code panic. A peer that
//! scribbles on the words can make its own and other writes fail or wait,
//! as it could by writing into blocks directly, but cannot make a write of
//! this process copy while the protocol says it may not.

use std::sync::atomic::Ordering::{self, Acquire, Relaxed, Release, SeqCst};
use std::task::Poll;

/// Bit 63 of a generation word: a claim by the generation in the other
/// bits is waiting for writers that may still be copying. Generations are
/// below 2^63 (the metadata server seeds them from the wall clock in
/// microseconds), so the bit is free.
pub const SETTLING: u64 = 1 << 63;

/// Lane bit: the write may copy into the block in the low 32 bits.
const WRITING: u64 = 1 << 63;
/// Lane bit: the write waits for a claim on the block in the low 32 bits
/// to settle, and copies nothing before publishing itself writing again.
const CLAIMING: u64 = 1 << 62;

/// The lane value of a write that may copy into `block`.
pub fn lane_writing(block: u32) -> u64 {
    WRITING | u64::from(block)
}

/// The lane value of a write waiting for a claim on `block` to settle.
pub fn lane_claiming(block: u32) -> u64 {
    CLAIMING | u64::from(block)
}

/// The block a lane value names, if it is a claiming lane.
pub fn claimed_block(lane: u64) -> Option<u32> {
    (lane & CLAIMING != 0 && lane & WRITING == 0).then_some(lane as u32)
}

/// An atomic 64-bit word: `std`'s in the real region, `loom`'s in the
/// model check.
pub trait Word {
    fn load(&self, order: Ordering) -> u64;
    fn store(&self, value: u64, order: Ordering);
    fn swap(&self, value: u64, order: Ordering) -> u64;
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64>;
    /// Wrapping add; returns the previous value.
    fn fetch_add(&self, value: u64, order: Ordering) -> u64;
    /// Wrapping subtract; returns the previous value.
    fn fetch_sub(&self, value: u64, order: Ordering) -> u64;
}

impl Word for std::sync::atomic::AtomicU64 {
    #[inline]
    fn load(&self, order: Ordering) -> u64 {
        self.load(order)
    }
    #[inline]
    fn store(&self, value: u64, order: Ordering) {
        self.store(value, order)
    }
    #[inline]
    fn swap(&self, value: u64, order: Ordering) -> u64 {
        self.swap(value, order)
    }
    #[inline]
    fn compare_exchange(
        &self,
        current: u64,
        new: u64,
        success: Ordering,
        failure: Ordering,
    ) -> Result<u64, u64> {
        self.compare_exchange(current, new, success, failure)
    }
    #[inline]
    fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
        self.fetch_add(value, order)
    }
    #[inline]
    fn fetch_sub(&self, value: u64, order: Ordering) -> u64 {
        self.fetch_sub(value, order)
    }
}

/// Where the protocol's words live, and how its waiters sleep.
pub trait Memory {
    type Word: Word;
    /// A memory fence of `order` (`std::sync::atomic::fence`, or loom's).
    fn fence(&self, order: Ordering);
    /// The generation word of `block`. Callers check `block` against the
    /// number of blocks first.
    fn generation_word(&self, block: u32) -> &Self::Word;
    /// Lane `index` of all lanes, slot after slot (`index < lane_count()`).
    fn lane(&self, index: usize) -> &Self::Word;
    /// Lanes of all slots together.
    fn lane_count(&self) -> usize;
    /// Operations waiting for a lane to change, in every process.
    fn waiting(&self) -> &Self::Word;
    /// The part of [`Memory::waiting`] that slot `slot` added (callers
    /// pass a slot of the layout).
    fn slot_waiting(&self, slot: u32) -> &Self::Word;
    /// The wake sequence (`SeqCst` load).
    fn wake_seq(&self) -> u32;
    /// Advances the wake sequence (a `SeqCst` read-modify-write), then
    /// wakes every thread sleeping in [`Memory::wait`], in any process.
    fn wake_all(&self);
    /// Blocks the thread until the wake sequence differs from `seq` (it
    /// may also return spuriously).
    fn wait(&self, seq: u32);
}

/// The lanes one writer process may use: `first..first + count` of all
/// lanes, and the slot whose waiting count its waits go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lanes {
    pub slot: u32,
    pub first: usize,
    pub count: usize,
}

/// Whether some lane holds `writing(block)`.
fn writer_in_flight<M: Memory + ?Sized>(mem: &M, block: u32) -> bool {
    let writing = lane_writing(block);
    // Acquire: a lane found free again was freed after its copy, which
    // then happens before whatever we do next (settle, copy).
    (0..mem.lane_count()).any(|i| mem.lane(i).load(Acquire) == writing)
}

/// A lane was freed or stopped writing, or a settling claim superseded:
/// wakes the waiters, if any. The fence orders the change before the load
/// of the waiting count (see [Waiting](self#waiting)).
fn wake_waiters<M: Memory + ?Sized>(mem: &M) {
    mem.fence(SeqCst);
    if mem.waiting().load(SeqCst) != 0 {
        mem.wake_all();
    }
}

/// One write (or pure claim) of one block under one generation, in
/// progress. Holds at most one lane of its slot, freed when it finishes or
/// is dropped.
pub struct Write<'a, M: Memory + ?Sized> {
    mem: &'a M,
    lanes: Lanes,
    block: u32,
    gen: u64,
    /// Index of our lane, once we have one.
    lane: Option<usize>,
    /// Our lane says claiming (else writing).
    claiming: bool,
}

impl<'a, M: Memory + ?Sized> Write<'a, M> {
    /// A write of `block` (< number of blocks) under `gen` (< 2^63), using
    /// a lane of `lanes`. Touches nothing until [`Write::poll`].
    pub fn new(mem: &'a M, lanes: Lanes, block: u32, gen: u64) -> Self {
        debug_assert!(gen & SETTLING == 0);
        Write {
            mem,
            lanes,
            block,
            gen,
            lane: None,
            claiming: false,
        }
    }

    /// The lanes this write uses.
    pub fn lanes(&self) -> Lanes {
        self.lanes
    }

    /// Advances the write without ever blocking:
    ///
    /// * `Ready(Ok(()))`: the caller may copy its bytes into the block now,
    ///   then must call [`Write::finish`] (or drop the write);
    /// * `Ready(Err(current))`: the block belongs to the newer generation
    ///   `current`; nothing was written and the lane is free;
    /// * `Pending`: no free lane in our slot, or a claim waits for writers
    ///   in flight; call again once a lane has changed (see
    ///   [Waiting](self#waiting) and [`drive`]).
    pub fn poll(&mut self) -> Poll<Result<(), u64>> {
        let lane = match self.lane {
            Some(l) => l,
            None => match self.take_lane() {
                Some(l) => l,
                None => return Poll::Pending,
            },
        };
        let word = self.mem.generation_word(self.block);
        let gen = self.gen;
        loop {
            if !self.claiming {
                // Dekker with claimers: our `writing` lane (stored just
                // before) is ordered before our load of the word.
                self.mem.fence(SeqCst);
            }
            let w = word.load(SeqCst);
            let current = w & !SETTLING;
            if current > gen {
                self.release();
                return Poll::Ready(Err(current));
            }
            if w == gen {
                if self.claiming {
                    // Settled (by us or a helper): publish ourselves as a
                    // writer again and check once more, as a fresh writer.
                    self.mem.lane(lane).store(lane_writing(self.block), SeqCst);
                    self.claiming = false;
                    continue;
                }
                // Pairs with the readers' acquire fence (see `read_end`):
                // the generation we saw happens before our bytes appear.
                self.mem.fence(Release);
                return Poll::Ready(Ok(()));
            }
            // A claim: ours (current < gen) or one by our generation that
            // is settling. Stop being a writer first, so that claimers of
            // our generation never wait for us (nor we for them), and tell
            // any that already wait.
            if !self.claiming {
                self.mem.lane(lane).store(lane_claiming(self.block), SeqCst);
                self.claiming = true;
                wake_waiters(self.mem);
            }
            if current < gen {
                if word
                    .compare_exchange(w, gen | SETTLING, SeqCst, Relaxed)
                    .is_err()
                {
                    continue;
                }
                if w & SETTLING != 0 {
                    // We superseded a settling claim: its claimers and
                    // helpers may be waiting for a writer that holds its
                    // lane for long, and must learn now that the block is
                    // no longer theirs.
                    wake_waiters(self.mem);
                }
            }
            // Dekker with writers: the claim (ours, or the one we loaded)
            // is ordered before our loads of the lanes.
            self.mem.fence(SeqCst);
            if writer_in_flight(self.mem, self.block) {
                return Poll::Pending;
            }
            // Every write that saw an older generation is done: settle. If
            // the word moved on meanwhile (settled by a helper, or a newer
            // claim), the next round decides.
            let _ = word.compare_exchange(gen | SETTLING, gen, SeqCst, Relaxed);
        }
    }

    /// The copy is done: frees the lane.
    pub fn finish(mut self) {
        self.release();
    }

    /// Once [`Write::poll`] gave `Ready(Ok(()))`: hands the lane (still
    /// announcing the write) to the caller, whose copy outlives this
    /// borrow; the caller frees it with [`release_lane`] when the copy is
    /// done or abandoned. `None` if the write was not ready.
    pub fn into_lane(mut self) -> Option<usize> {
        self.lane.take()
    }

    /// Abandons the write as a killed process would: its lane stays as it
    /// is (for tests and the model check of dead processes).
    pub fn die(self) {
        std::mem::forget(self);
    }

    /// Takes a free lane of our slot, publishing `writing(block)` in it.
    fn take_lane(&mut self) -> Option<usize> {
        let l = self.lanes;
        let me = lane_writing(self.block);
        let lane = (l.first..l.first + l.count).find(|&i| {
            self.mem
                .lane(i)
                .compare_exchange(0, me, SeqCst, Relaxed)
                .is_ok()
        })?;
        self.lane = Some(lane);
        self.claiming = false;
        Some(lane)
    }

    fn release(&mut self) {
        if let Some(l) = self.lane.take() {
            release_lane(self.mem, l);
        }
    }
}

/// Frees `lane` after a write's copy (see [`Write::into_lane`]).
pub fn release_lane<M: Memory + ?Sized>(mem: &M, lane: usize) {
    // Release: a claimer that finds the lane free (acquire) sees the copy
    // complete.
    mem.lane(lane).store(0, Release);
    wake_waiters(mem);
}

impl<M: Memory + ?Sized> Drop for Write<'_, M> {
    fn drop(&mut self) {
        self.release();
    }
}

/// Starts a read of `block` under `gen`: `Err(word)` unless the block's
/// generation word is exactly `gen` (settled).
pub fn read_begin<M: Memory + ?Sized>(mem: &M, block: u32, gen: u64) -> Result<(), u64> {
    let w = mem.generation_word(block).load(Acquire);
    if w == gen {
        Ok(())
    } else {
        Err(w)
    }
}

/// Ends a read begun with [`read_begin`]: `Err(word)` if the block changed
/// hands during the copy, which must then be discarded.
pub fn read_end<M: Memory + ?Sized>(mem: &M, block: u32, gen: u64) -> Result<(), u64> {
    // Keeps the copy's loads before the load below, and pairs with the
    // writers' release fence: a copy that saw a newer owner's byte sees
    // that owner's generation here.
    mem.fence(Acquire);
    let w = mem.generation_word(block).load(Relaxed);
    if w == gen {
        Ok(())
    } else {
        Err(w)
    }
}

/// One operation registered as waiting (see [Waiting](self#waiting)), from
/// [`Waiting::new`] until it is dropped.
pub struct Waiting<'a, M: Memory + ?Sized> {
    mem: &'a M,
    slot: u32,
}

impl<'a, M: Memory + ?Sized> Waiting<'a, M> {
    /// Registers a waiting operation of `slot`'s process. The global count
    /// goes up before the slot's and down after it, so the slot's count
    /// never exceeds what it added to the global one: reclaiming a dead
    /// process's slot subtracts at most that.
    pub fn new(mem: &'a M, slot: u32) -> Self {
        mem.waiting().fetch_add(1, SeqCst);
        mem.slot_waiting(slot).fetch_add(1, SeqCst);
        Waiting { mem, slot }
    }

    /// Starts a round: returns the wake sequence to sleep on should the
    /// next try fail, and fences so that the try comes after both the
    /// registration and that load.
    pub fn round(&self) -> u32 {
        let seq = self.mem.wake_seq();
        self.mem.fence(SeqCst);
        seq
    }
}

impl<M: Memory + ?Sized> Drop for Waiting<'_, M> {
    fn drop(&mut self) {
        self.mem.slot_waiting(self.slot).fetch_sub(1, SeqCst);
        self.mem.waiting().fetch_sub(1, SeqCst);
    }
}

/// Runs `attempt` until it is ready, sleeping in [`Memory::wait`] between
/// tries (blocking the thread: for threads that may block, the model check
/// and tests; async code waits for the same wake-ups without blocking,
/// see `Region::write`). `slot` is the waiting process's slot.
pub fn drive<M: Memory + ?Sized, T>(mem: &M, slot: u32, mut attempt: impl FnMut() -> Poll<T>) -> T {
    if let Poll::Ready(v) = attempt() {
        return v;
    }
    let waiting = Waiting::new(mem, slot);
    loop {
        let seq = waiting.round();
        if let Poll::Ready(v) = attempt() {
            return v;
        }
        mem.wait(seq);
    }
}

/// Reclamation, step 1: frees every lane of a process that is gone (its
/// hand-over connection closed, so none of its copies can still run),
/// drops what it added to the waiting count, wakes every waiter, and
/// returns the blocks it was claiming, to be settled with [`poll_settle`].
/// The block numbers come from shared memory: check them against the
/// layout before use.
pub fn clear_lanes<M: Memory + ?Sized>(mem: &M, lanes: Lanes) -> Vec<u32> {
    let claims = (lanes.first..lanes.first + lanes.count)
        .filter_map(|i| claimed_block(mem.lane(i).swap(0, SeqCst)))
        .collect();
    let added = mem.slot_waiting(lanes.slot).swap(0, SeqCst);
    mem.waiting().fetch_sub(added, SeqCst);
    mem.fence(SeqCst);
    mem.wake_all();
    claims
}

/// Reclamation, step 2: completes the claim settling on `block`, if any
/// (whoever made it: settling is the same for every helper). `Pending`
/// while a writer may still be copying into the block under an older
/// generation; call again once a lane has changed.
pub fn poll_settle<M: Memory + ?Sized>(mem: &M, block: u32) -> Poll<()> {
    let word = mem.generation_word(block);
    loop {
        let w = word.load(SeqCst);
        if w & SETTLING == 0 {
            return Poll::Ready(());
        }
        mem.fence(SeqCst);
        if writer_in_flight(mem, block) {
            return Poll::Pending;
        }
        let _ = word.compare_exchange(w, w & !SETTLING, SeqCst, Relaxed);
    }
}

/// Writes of `block` that may be copying right now (lanes holding
/// `writing(block)`), for tests and diagnostics.
pub fn writers_of<M: Memory + ?Sized>(mem: &M, block: u32) -> u32 {
    let writing = lane_writing(block);
    (0..mem.lane_count())
        .filter(|&i| mem.lane(i).load(Acquire) == writing)
        .count() as u32
}
