//! A mapped shared region and the block protocol on its atomics, the same
//! for both of its roles: the server's own mapping
//! ([`ServerRegion`](crate::ServerRegion), `server.rs`) and a co-located
//! client's ([`ClientRegion`](crate::ClientRegion), `client.rs`).

use crate::layout::Layout;
use crate::notifier::{futex_wait, futex_wake_all, Notifier};
use crate::protocol::{self, Lanes, Memory};
use bytes::BytesMut;
use memmap2::MmapRaw;
use nodekernel_proto::{Error, Result};
use std::fs::File;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;

pub use crate::protocol::SETTLING;

/// Value of the state word once the server has stopped.
pub(crate) const CLOSED: u64 = 1;

/// One DRAM storage server's memory: header, state word, writer lanes,
/// per-block generation words and block data, in one memfd (or file)
/// mapped shared, in one of two roles `R`.
///
/// The server creates it ([`ServerRegion::create`](crate::ServerRegion::create))
/// and writes with lanes of its own slots; a co-located client receives the
/// memfd and the number of the slot granted to its process, and maps it
/// again ([`ClientRegion::open`](crate::ClientRegion::open)). Both then run
/// exactly the same protocol ([`Region::read`], [`Region::write`]; see
/// [`protocol`]) on the same atomics, so network and mapped accesses
/// interoperate. What only one role has (the server's table of client
/// slots, a client's granted slot and the blocks it has mapped in) is its
/// role's, so neither can reach the other's operations.
///
/// No Rust reference to block data is ever formed: data is copied with
/// `ptr::copy_nonoverlapping` between raw pointers into the mapping and the
/// caller's buffers. Only the state, lane and generation words are accessed
/// through references, as atomics.
pub struct Region<R: Role> {
    /// Shared with the waker thread (see [`Notifier`]), which sleeps on
    /// the wake sequence inside it.
    pub(crate) map: Arc<MmapRaw>,
    pub(crate) layout: Layout,
    pub(crate) file: File,
    /// Wakes this process's async waits when the wake sequence moves.
    pub(crate) notifier: Notifier,
    /// What this role has of its own.
    pub(crate) role: R,
}

/// The role a [`Region`] is mapped in: [`Server`](crate::server::Server) or
/// [`Client`](crate::client::Client). Sealed: there are these two.
pub trait Role: sealed::Role {}

pub(crate) mod sealed {
    use crate::protocol::Lanes;
    use std::sync::atomic::AtomicU64;

    /// What the common code asks of a role.
    pub trait Role: Send + Sync + Sized + 'static {
        /// The server's own mapping: its writes stop once it closed the
        /// region.
        const SERVES: bool;

        /// The lanes this mapping writes with: the server's slots, or the
        /// client slot granted at the hand-over; `None` for a read-only
        /// mapping.
        fn lanes(&self) -> Option<Lanes>;

        /// The client slot granted to this mapping (clients only).
        fn slot(&self) -> Option<u32>;

        /// One bit per block whose pages this mapping has already faulted
        /// in (see `Region::touch`); `None` for the server, which maps
        /// everything up front.
        fn populated(&self) -> Option<&[AtomicU64]>;
    }
}

impl<R: Role> std::fmt::Debug for Region<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("layout", &self.layout)
            .field("slot", &self.role.slot())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl<R: Role> Region<R> {
    /// A region of `layout` mapped at `map` from `file`, in `role`.
    pub(crate) fn mapped(file: File, layout: Layout, map: MmapRaw, role: R) -> Region<R> {
        let map = Arc::new(map);
        Region {
            notifier: Notifier::new(map.clone(), layout.wake_seq_offset()),
            map,
            layout,
            file,
            role,
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn block_size(&self) -> u32 {
        self.layout.block_size
    }

    pub fn num_blocks(&self) -> u32 {
        self.layout.num_blocks
    }

    /// The memfd (to hand over).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Start of the block data. Accesses through it bypass the generation
    /// protocol (for medium-level tools and tests).
    pub fn data_ptr(&self) -> *mut u8 {
        // SAFETY: data_offset < total_len = the mapping's length (validated).
        unsafe { self.map.as_mut_ptr().add(self.layout.data_offset as usize) }
    }

    pub fn is_closed(&self) -> bool {
        self.state().load(Ordering::Acquire) == CLOSED
    }

    pub(crate) fn state(&self) -> &AtomicU64 {
        // SAFETY: state_offset is 8-aligned and inside the mapping
        // (validated layout); the state word is only ever accessed
        // atomically.
        unsafe { self.word_at(self.layout.state_offset) }
    }

    /// The word at `offset` of the mapping.
    ///
    /// # Safety
    ///
    /// `offset` must be 8-aligned, lie inside one of the word areas of the
    /// validated layout (state word, lanes, generation words), and that
    /// word must only ever be accessed atomically, by every process.
    #[inline]
    pub(crate) unsafe fn word_at(&self, offset: u64) -> &AtomicU64 {
        // SAFETY: the caller's contract puts the word inside the mapping
        // (which lives as long as `self`), 8-aligned (the mapping is page
        // aligned), and only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(offset as usize).cast()) }
    }

    /// The current generation of `block`, or `None` past the end.
    pub fn generation(&self, block: u32) -> Option<u64> {
        (block < self.layout.num_blocks)
            .then(|| self.generation_word(block).load(Ordering::Acquire) & !SETTLING)
    }

    /// Whether a claim of `block` is still settling (waiting for writers
    /// that saw an older generation), or `None` past the end.
    pub fn is_settling(&self, block: u32) -> Option<bool> {
        (block < self.layout.num_blocks)
            .then(|| self.generation_word(block).load(Ordering::Acquire) & SETTLING != 0)
    }

    /// Writes of `block` that may be copying right now, in any process
    /// (for tests and diagnostics).
    pub fn writers_in_flight(&self, block: u32) -> Option<u32> {
        (block < self.layout.num_blocks).then(|| protocol::writers_of(self, block))
    }

    /// Maps the pages of `block` into this mapping before the first large
    /// copy into or out of it. Left to page faults, a fresh mapping costs a
    /// fault per 4 KiB page on first touch (about 1.4 µs for a write fault
    /// on these machines, more than the copy itself);
    /// `madvise(MADV_POPULATE_READ)` maps the whole block in one call at
    /// about 0.3 µs a page (read faults map 16 pages at a time, and a shared
    /// memfd page comes in writable). Small accesses just take their one or
    /// two faults. A kernel without it (before 5.14) takes the faults too.
    fn touch(&self, block: u32, len: usize) {
        const LARGE: usize = 64 << 10;
        if len >= LARGE && !self.is_populated(block) {
            self.populate(block, 1);
        }
    }

    /// Whether this mapping has mapped `block`'s pages in already (always
    /// for the server's own mapping).
    pub(crate) fn is_populated(&self, block: u32) -> bool {
        let Some(bits) = self.role.populated() else {
            return true;
        };
        bits[block as usize / 64].load(Ordering::Relaxed) & (1u64 << (block % 64)) != 0
    }

    /// Maps the pages of blocks `[first, first + count)` in (see
    /// [`Region::touch`]) and marks them populated.
    pub(crate) fn populate(&self, first: u32, count: u32) {
        let Some(bits) = self.role.populated() else {
            return;
        };
        let bs = self.layout.block_size as usize;
        // SAFETY: the blocks lie inside the mapping (callers clip `count`)
        // and form a page-aligned, whole-page range; populating changes no
        // bytes.
        unsafe {
            libc::madvise(
                self.src(first, 0).cast(),
                bs * count as usize,
                libc::MADV_POPULATE_READ,
            );
        }
        for b in first..first + count {
            bits[b as usize / 64].fetch_or(1u64 << (b % 64), Ordering::Relaxed);
        }
    }

    /// Maps in the pages of up to 16 MiB of blocks from `from` on, skipping
    /// blocks already mapped in; returns where to go on, or `None` when the
    /// whole region is done (at once for the server's own mapping, which
    /// maps everything at create). A client calls it in the background after
    /// mapping a region, so that copies find their pages mapped (the
    /// analogue of registering memory for RDMA). It costs about 0.3 µs of
    /// CPU per 4 KiB page and 2 MiB of page tables per GiB.
    pub fn prefault(&self, from: u32) -> Option<u32> {
        self.role.populated()?;
        let n = self.layout.num_blocks;
        if from >= n {
            return None;
        }
        let chunk = ((16u32 << 20) / self.layout.block_size).max(1);
        let end = from.saturating_add(chunk).min(n);
        let mut b = from;
        while b < end {
            if self.is_populated(b) {
                b += 1;
                continue;
            }
            let run = (b..end).take_while(|&x| !self.is_populated(x)).count() as u32;
            self.populate(b, run);
            b += run;
        }
        Some(end)
    }

    pub(crate) fn src(&self, block: u32, offset: u32) -> *mut u8 {
        let at = u64::from(block) * u64::from(self.layout.block_size) + u64::from(offset);
        // SAFETY: callers checked block/offset against the layout, so `at`
        // lies inside the data region.
        unsafe { self.data_ptr().add(at as usize) }
    }

    /// Reads `dst.len()` bytes of `block` at `offset` into `dst`, if `gen`
    /// is the block's generation before and after the copy.
    ///
    /// On `Stale` after the copy, `dst` is zeroed again, so it never holds
    /// bytes of another owner. Other errors leave it untouched.
    pub fn read(&self, block: u32, gen: u64, offset: u32, dst: &mut [u8]) -> Result<()> {
        // SAFETY: `dst` is valid for writes of its length and is not the
        // shared mapping (a `&mut` to it can only come from safe code that
        // never forms one).
        let r = unsafe { self.read_raw(block, gen, offset, dst.as_mut_ptr(), dst.len()) };
        match r {
            Ok(()) => Ok(()),
            Err((e, copied)) => {
                if copied {
                    dst.fill(0);
                }
                Err(e)
            }
        }
    }

    /// Like [`Region::read`], into memory that need not be initialised (a
    /// result buffer allocated for the read, not zeroed). On success all of
    /// `dst` is initialised; on `Stale` after the copy it is zeroed.
    pub fn read_uninit(
        &self,
        block: u32,
        gen: u64,
        offset: u32,
        dst: &mut [std::mem::MaybeUninit<u8>],
    ) -> Result<()> {
        let (ptr, len) = (dst.as_mut_ptr().cast::<u8>(), dst.len());
        // SAFETY: `dst` is valid for writes of its length and is not the
        // shared mapping (a `&mut` to it can only come from safe code that
        // never forms one).
        match unsafe { self.read_raw(block, gen, offset, ptr, len) } {
            Ok(()) => Ok(()),
            Err((e, copied)) => {
                if copied {
                    // SAFETY: as above.
                    unsafe { std::ptr::write_bytes(ptr, 0, len) };
                }
                Err(e)
            }
        }
    }

    /// Begins a read of `len` bytes of `block` at `offset` that someone
    /// else copies (the kernel, sending them to a socket): checks the range
    /// and that `gen` is the block's generation, and returns where the
    /// bytes are. They are valid for as long as this region lives, but may
    /// change hands meanwhile: once the copy is done,
    /// [`Region::read_unchanged`] says whether it may be used.
    pub fn read_shared(&self, block: u32, gen: u64, offset: u32, len: u32) -> Result<*const u8> {
        check_range(
            self.layout.block_size,
            self.layout.num_blocks,
            block,
            offset,
            u64::from(len),
        )?;
        check_generation(gen)?;
        self.touch(block, len as usize);
        protocol::read_begin(self, block, gen).map_err(|w| stale_read(block, gen, w))?;
        Ok(self.src(block, offset).cast_const())
    }

    /// Ends a read begun with [`Region::read_shared`]: whether `block` was
    /// still at `gen` throughout (so the bytes copied are its owner's).
    pub fn read_unchanged(&self, block: u32, gen: u64) -> bool {
        protocol::read_end(self, block, gen).is_ok()
    }

    /// Appends `len` bytes of `block` at `offset` to `out`, if `gen` is the
    /// block's generation before and after the copy. On error nothing is
    /// appended.
    pub fn read_append(
        &self,
        block: u32,
        gen: u64,
        offset: u32,
        len: u32,
        out: &mut BytesMut,
    ) -> Result<()> {
        check_range(
            self.layout.block_size,
            self.layout.num_blocks,
            block,
            offset,
            u64::from(len),
        )?;
        let len = len as usize;
        out.reserve(len);
        let dst = out.spare_capacity_mut();
        // SAFETY: `dst` has room for `len` bytes (reserved above) in a heap
        // buffer of our own. On success those bytes are initialised, so
        // extending the length is sound; on error the length is unchanged.
        unsafe {
            self.read_raw(block, gen, offset, dst.as_mut_ptr().cast(), len)
                .map_err(|(e, _)| e)?;
            out.set_len(out.len() + len);
        }
        Ok(())
    }

    /// The read protocol. `Err((e, true))` when bytes were copied into `dst`
    /// before the generation check failed.
    ///
    /// # Safety
    ///
    /// `dst` must be valid for writes of `len` bytes and must not overlap
    /// the mapping.
    unsafe fn read_raw(
        &self,
        block: u32,
        gen: u64,
        offset: u32,
        dst: *mut u8,
        len: usize,
    ) -> std::result::Result<(), (Error, bool)> {
        let l = &self.layout;
        check_range(l.block_size, l.num_blocks, block, offset, len as u64)
            .map_err(|e| (e, false))?;
        check_generation(gen).map_err(|e| (e, false))?;
        self.touch(block, len);
        protocol::read_begin(self, block, gen).map_err(|w| (stale_read(block, gen, w), false))?;
        // A racy copy: a claim may start writing the new owner's bytes while
        // we copy. The result is kept only if the generation is unchanged
        // afterwards (a seqlock read, see `protocol::read_end`).
        //
        // SAFETY: the source range lies inside the block (checked above),
        // the destination is valid for `len` bytes and separate from the
        // mapping (caller contract).
        unsafe { std::ptr::copy_nonoverlapping(self.src(block, offset), dst, len) };
        protocol::read_end(self, block, gen).map_err(|w| (stale_read(block, gen, w), true))
    }

    /// Writes `data` into `block` at `offset` under generation `gen`,
    /// claiming the block first if `gen` is newer than its generation
    /// (then the bytes are written once every write that saw an older
    /// generation has finished its copy). An empty `data` with a newer
    /// generation is a pure claim ([`Region::claim`]).
    ///
    /// Never blocks the thread, and never polls on a timer: while it must
    /// wait (for writers of an older generation to finish their copy,
    /// however long that takes, or for a free lane of this mapping's slot),
    /// the future is pending until a lane changes, in any process (see
    /// [`protocol`]'s *Waiting*). Works on any executor. `Stale` if the
    /// block belongs to a newer generation; `Unavailable` on a read-only
    /// mapping, and on the server's own region once it is closed (a claim
    /// it had begun may have taken effect).
    ///
    /// Cancel safety: dropping the future before it completes writes
    /// nothing and frees its lane. A claim it had made stays settling
    /// (readers of `gen` get `Stale`) until the next write of `gen` settles
    /// it or a newer generation claims the block.
    pub async fn write(&self, block: u32, gen: u64, offset: u32, data: &[u8]) -> Result<()> {
        let op = self.ready_write(block, gen, offset, data.len()).await?;
        // SAFETY: the destination range lies inside the block (checked
        // above); `data` is the caller's buffer, never the mapping. The
        // protocol gave us the block: no write of another generation copies
        // into it until we finish.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.src(block, offset), data.len());
        }
        op.finish();
        Ok(())
    }

    /// Checks a write of `len` bytes of `block` at `offset` under `gen`
    /// and waits until its bytes may be copied in (see [`Region::write`]).
    pub(crate) async fn ready_write(
        &self,
        block: u32,
        gen: u64,
        offset: u32,
        len: usize,
    ) -> Result<protocol::Write<'_, Region<R>>> {
        let l = &self.layout;
        check_range(l.block_size, l.num_blocks, block, offset, len as u64)?;
        check_generation(gen)?;
        let lanes = self.role.lanes().ok_or_else(|| {
            Error::unavailable(format!(
                "block {block}: this mapping has no writer slot (read only)"
            ))
        })?;
        self.touch(block, len);
        let mut op = protocol::Write::new(self, lanes, block, gen);
        if let Err(current) = self.until_ready(lanes.slot, || op.poll()).await {
            return Err(stale_write(block, gen, current));
        }
        // The server's own writes stop once it closed the region: checked
        // while the lane announces this write (the protocol fenced after
        // taking it), so a stopping server that closes, fences and then
        // finds every lane free knows no write of its own copies any more
        // (see `Region::lanes_busy`). Dropping `op` frees the lane.
        if R::SERVES && self.is_closed() {
            return Err(Error::unavailable(format!(
                "block {block}: the storage server is stopping"
            )));
        }
        Ok(op)
    }

    /// Claims `block` for generation `gen` without writing: a zero-length
    /// [`Region::write`]. Returns once every write that saw an older
    /// generation has finished its copy; from then on writes and reads
    /// with an older generation get `Stale`.
    pub async fn claim(&self, block: u32, gen: u64) -> Result<()> {
        self.write(block, gen, 0, &[]).await
    }

    /// Runs `attempt` until it is ready; between tries, waits (without
    /// blocking the thread) until a lane has changed. `slot`: whose
    /// waiting count the wait goes to. See [`protocol::drive`], its
    /// blocking twin.
    pub(crate) async fn until_ready<T>(
        &self,
        slot: u32,
        mut attempt: impl FnMut() -> Poll<T>,
    ) -> T {
        if let Poll::Ready(v) = attempt() {
            return v;
        }
        let waiting = protocol::Waiting::new(self, slot);
        loop {
            let seq = waiting.round();
            if let Poll::Ready(v) = attempt() {
                return v;
            }
            self.notifier.changed(seq).await;
        }
    }

    /// The lanes this mapping writes with (tests).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn lanes(&self) -> Option<Lanes> {
        self.role.lanes()
    }

    /// The wake sequence, a futex word shared by every process.
    fn wake_word(&self) -> &AtomicU32 {
        self.notifier.word()
    }
}

impl<R: Role> Drop for Region<R> {
    fn drop(&mut self) {
        self.notifier.stop();
    }
}

/// The lanes of `slot` (< `layout.slots`).
pub(crate) fn slot_lanes(layout: &Layout, slot: u32) -> Lanes {
    let per = layout.lanes_per_slot as usize;
    Lanes {
        slot,
        first: slot as usize * per,
        count: per,
    }
}

impl<R: Role> Memory for Region<R> {
    type Word = AtomicU64;

    #[inline]
    fn fence(&self, order: Ordering) {
        fence(order);
    }

    #[inline]
    fn generation_word(&self, block: u32) -> &AtomicU64 {
        assert!(block < self.layout.num_blocks, "block {block} out of range");
        let at = self.layout.ctrl_offset + u64::from(block) * self.layout.ctrl_stride;
        // SAFETY: the word lies inside the generation words (block <
        // num_blocks, validated layout), is 8-aligned (offset and stride
        // are multiples of 8), and is only ever accessed atomically.
        unsafe { self.word_at(at) }
    }

    #[inline]
    fn lane(&self, index: usize) -> &AtomicU64 {
        assert!(
            index < self.layout.lane_count(),
            "lane {index} out of range"
        );
        let at = self.layout.lanes_offset + 8 * index as u64;
        // SAFETY: the word lies inside the lanes (index < lane_count,
        // validated layout), is 8-aligned, and is only ever accessed
        // atomically.
        unsafe { self.word_at(at) }
    }

    #[inline]
    fn lane_count(&self) -> usize {
        self.layout.lane_count()
    }

    #[inline]
    fn waiting(&self) -> &AtomicU64 {
        // SAFETY: the waiting count is a word of the validated layout's
        // state words, 8-aligned, only ever accessed atomically.
        unsafe { self.word_at(self.layout.waiting_offset()) }
    }

    #[inline]
    fn slot_waiting(&self, slot: u32) -> &AtomicU64 {
        assert!(slot < self.layout.slots, "slot {slot} out of range");
        let at = self.layout.waits_offset() + 8 * u64::from(slot);
        // SAFETY: the word lies inside the per-slot waiting counts (slot <
        // slots, validated layout), is 8-aligned, and is only ever
        // accessed atomically.
        unsafe { self.word_at(at) }
    }

    #[inline]
    fn wake_seq(&self) -> u32 {
        self.wake_word().load(Ordering::SeqCst)
    }

    #[inline]
    fn wake_all(&self) {
        self.wake_word().fetch_add(1, Ordering::SeqCst);
        futex_wake_all(self.wake_word());
    }

    #[inline]
    fn wait(&self, seq: u32) {
        futex_wait(self.wake_word(), seq);
    }
}

/// Validates a block index and byte range (without overflow); the messages
/// are the same on every medium and path.
pub fn check_range(
    block_size: u32,
    num_blocks: u32,
    block: u32,
    offset: u32,
    len: u64,
) -> Result<()> {
    let bs = u64::from(block_size);
    if block >= num_blocks {
        return Err(Error::out_of_range(format!(
            "block {block} (offset {offset}, length {len}) is past the end: this server has {num_blocks} blocks of {bs} bytes"
        )));
    }
    match u64::from(offset).checked_add(len) {
        Some(end) if end <= bs => Ok(()),
        _ => Err(Error::out_of_range(format!(
            "block {block}: offset {offset} plus length {len} exceeds the block size of {bs} bytes"
        ))),
    }
}

/// Refuses generations with the reserved [`SETTLING`] bit.
pub fn check_generation(gen: u64) -> Result<()> {
    if gen & SETTLING != 0 {
        return Err(Error::invalid_argument(format!(
            "generation {gen} is out of range: bit 63 is reserved"
        )));
    }
    Ok(())
}

/// `Stale` for a read with `gen` of a block whose generation word is `word`.
pub fn stale_read(block: u32, gen: u64, word: u64) -> Error {
    let current = word & !SETTLING;
    if gen < current {
        Error::stale(format!(
            "block {block}: read with generation {gen} refused, the block was reused by generation {current}"
        ))
    } else {
        Error::stale(format!(
            "block {block}: read with generation {gen} refused, its owner has not written it yet (current generation {current})"
        ))
    }
}

/// `Stale` for a write with `gen` older than the block's `current`.
pub fn stale_write(block: u32, gen: u64, current: u64) -> Error {
    Error::stale(format!(
        "block {block}: write with generation {gen} refused, the block now belongs to generation {current}"
    ))
}
