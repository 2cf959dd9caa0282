//! A mapped shared region and the block protocol on its atomics.

use crate::layout::{Layout, INFLIGHT_AT};
use bytes::BytesMut;
use memmap2::{MmapOptions, MmapRaw};
use nodekernel_proto::{Error, Result};
use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Set in a block's generation word while a claim waits for the writers of
/// the previous generation. Generations are below 2^63 (the metadata server
/// seeds them from the wall clock in microseconds), so the bit is free.
pub const SETTLING: u64 = 1 << 63;

/// How long a claim waits for writers of the previous generation, and how
/// long a writer waits for a settling claim of its own generation, before
/// presuming the other party dead and going on.
pub const CLAIM_WAIT: Duration = Duration::from_millis(100);

/// Value of the state word once the server has stopped.
const CLOSED: u64 = 1;

const MEMFD_NAME: &CStr = c"nodekernel-dram";

/// One DRAM storage server's memory: header, state word, per-block control
/// entries and block data, in one sealed memfd mapped shared.
///
/// The server creates it ([`Region::create`]); a co-located client receives
/// the memfd and maps it again ([`Region::open`]). Both then run exactly the
/// same protocol ([`Region::read`], [`Region::write`]; see the crate docs) on
/// the same atomics, so network and mapped accesses interoperate.
///
/// No Rust reference to block data is ever formed: data is copied with
/// `ptr::copy_nonoverlapping` between raw pointers into the mapping and the
/// caller's buffers. Only the control words are accessed through
/// references, as atomics.
pub struct Region {
    map: MmapRaw,
    layout: Layout,
    file: File,
    /// Clients only: one bit per block whose pages this mapping has already
    /// faulted in (see [`Region::touch`]). The server maps everything up
    /// front.
    populated: Option<Box<[AtomicU64]>>,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("layout", &self.layout)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Region {
    /// Creates a zero-filled region of `num_blocks` blocks of `block_size`
    /// bytes (every generation 0, no writer in flight) in a new memfd, seals
    /// its size and maps it.
    ///
    /// All of its memory is allocated here, not at first touch: the DRAM
    /// tier's capacity is then real (a later shortage cannot fault a
    /// client's copy with `SIGBUS`), and no block transfer pays for zeroing
    /// fresh pages. Fails if the memory cannot be had.
    pub fn create(block_size: u32, num_blocks: u32) -> io::Result<Region> {
        let layout = Layout::new(block_size, num_blocks)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: MEMFD_NAME is NUL-terminated; the result is checked and
        // then owned by exactly one `File`.
        let fd = unsafe {
            libc::memfd_create(
                MEMFD_NAME.as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(layout.total_len)?;
        // The size can never change again, so no mapping of it (ours or a
        // client's) can ever fault past the end of the file.
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: plain fcntl on a descriptor we own.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: plain fallocate on a descriptor we own, inside its size.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, layout.total_len as i64) };
        if rc != 0 {
            let e = io::Error::from_raw_os_error(rc);
            return Err(io::Error::new(
                e.kind(),
                format!("cannot reserve {} bytes of memory: {e}", layout.total_len),
            ));
        }
        let map = MmapOptions::new()
            .len(layout.total_len as usize)
            .populate()
            .map_raw(&file)?;
        let header = layout.encode();
        // SAFETY: the mapping is at least HEADER_LEN bytes (validated layout)
        // and nobody else can see it yet.
        unsafe {
            std::ptr::copy_nonoverlapping(header.as_ptr(), map.as_mut_ptr(), header.len());
        }
        Ok(Region {
            map,
            layout,
            file,
            populated: None,
        })
    }

    /// Maps a region received from a server, after checking everything:
    /// the header parses and is consistent, the descriptor is a memfd
    /// sealed against shrinking and at least as long as the header says,
    /// the header inside the mapping matches the one received, and the
    /// server has not stopped.
    pub fn open(fd: OwnedFd, header: &[u8]) -> io::Result<Region> {
        let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidData, msg);
        let layout = Layout::decode(header).map_err(|e| invalid(e.to_string()))?;
        let file = File::from(fd);
        // SAFETY: plain fcntl on a descriptor we own.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(invalid(format!(
                "the received descriptor is not a sealable memfd: {}",
                io::Error::last_os_error()
            )));
        }
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(invalid("the received memfd can still shrink".into()));
        }
        let meta = file.metadata()?;
        if !meta.is_file() || meta.len() < layout.total_len {
            return Err(invalid(format!(
                "the received memfd has {} bytes, the header describes {}",
                meta.len(),
                layout.total_len
            )));
        }
        let map = MmapOptions::new()
            .len(layout.total_len as usize)
            .map_raw(&file)?;
        let words = layout.num_blocks.div_ceil(64) as usize;
        let region = Region {
            map,
            layout,
            file,
            populated: Some((0..words).map(|_| AtomicU64::new(0)).collect()),
        };
        let mut mapped = [0u8; crate::HEADER_LEN];
        // SAFETY: the mapping holds at least HEADER_LEN bytes; the header is
        // written once before the region is shared and never again.
        unsafe {
            std::ptr::copy_nonoverlapping(
                region.map.as_ptr(),
                mapped.as_mut_ptr(),
                crate::HEADER_LEN,
            );
        }
        if mapped[..] != *header {
            return Err(invalid(
                "the header in the memfd differs from the one received".into(),
            ));
        }
        if region.is_closed() {
            return Err(invalid("the storage server has stopped".into()));
        }
        Ok(region)
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

    /// Marks the region closed: the server has stopped serving it. Mapped
    /// clients check this before every access and stop using the mapping.
    pub fn close(&self) {
        self.state().store(CLOSED, Ordering::Release);
    }

    pub fn is_closed(&self) -> bool {
        self.state().load(Ordering::Acquire) == CLOSED
    }

    fn state(&self) -> &AtomicU64 {
        // SAFETY: state_offset is 8-aligned and inside the mapping
        // (validated); the mapping is page aligned and lives as long as
        // `self`. The word is only ever accessed atomically.
        unsafe {
            AtomicU64::from_ptr(
                self.map
                    .as_mut_ptr()
                    .add(self.layout.state_offset as usize)
                    .cast(),
            )
        }
    }

    /// The generation word and writer counter of `block` (< num_blocks).
    pub(crate) fn ctl(&self, block: u32) -> (&AtomicU64, &AtomicU32) {
        debug_assert!(block < self.layout.num_blocks);
        let at = self.layout.ctrl_offset + u64::from(block) * self.layout.ctrl_stride;
        // SAFETY: the entry lies inside the control region (block <
        // num_blocks, validated layout), is 8-aligned (ctrl_offset and
        // stride are multiples of 8 and the mapping is page aligned), and
        // both words are only ever accessed atomically, by every process.
        unsafe {
            let p = self.map.as_mut_ptr().add(at as usize);
            (
                AtomicU64::from_ptr(p.cast()),
                AtomicU32::from_ptr(p.add(INFLIGHT_AT as usize).cast()),
            )
        }
    }

    /// The current generation of `block`, or `None` past the end.
    pub fn generation(&self, block: u32) -> Option<u64> {
        (block < self.layout.num_blocks)
            .then(|| self.ctl(block).0.load(Ordering::Acquire) & !SETTLING)
    }

    /// Writers of `block` in flight right now (for tests and diagnostics).
    pub fn writers_in_flight(&self, block: u32) -> Option<u32> {
        (block < self.layout.num_blocks).then(|| self.ctl(block).1.load(Ordering::Acquire))
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
        let Some(bits) = &self.populated else {
            return true;
        };
        bits[block as usize / 64].load(Ordering::Relaxed) & (1u64 << (block % 64)) != 0
    }

    /// Maps the pages of blocks `[first, first + count)` in (see
    /// [`Region::touch`]) and marks them populated.
    fn populate(&self, first: u32, count: u32) {
        let Some(bits) = &self.populated else {
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
    /// whole region is done. A client calls it in the background after
    /// mapping a region, so that copies find their pages mapped (the
    /// analogue of registering memory for RDMA). It costs about 0.3 µs of
    /// CPU per 4 KiB page and 2 MiB of page tables per GiB.
    pub fn prefault(&self, from: u32) -> Option<u32> {
        self.populated.as_ref()?;
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

    fn src(&self, block: u32, offset: u32) -> *mut u8 {
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
        let (word, _) = self.ctl(block);
        let before = word.load(Ordering::Acquire);
        if before != gen {
            return Err((stale_read(block, gen, before), false));
        }
        // A racy copy: a claim may start writing the new owner's bytes while
        // we copy. The result is kept only if the generation is unchanged
        // afterwards (a seqlock read); the acquire fence keeps the copy's
        // loads before the second load of the generation, and pairs with
        // the release fence writers issue between taking the block and
        // copying, so a copy that saw any byte of a new owner sees the new
        // generation too.
        //
        // SAFETY: the source range lies inside the block (checked above),
        // the destination is valid for `len` bytes and separate from the
        // mapping (caller contract).
        unsafe { std::ptr::copy_nonoverlapping(self.src(block, offset), dst, len) };
        fence(Ordering::Acquire);
        let after = word.load(Ordering::Relaxed);
        if after != gen {
            return Err((stale_read(block, gen, after), true));
        }
        Ok(())
    }

    /// Writes `data` into `block` at `offset` under generation `gen`,
    /// claiming the block first if `gen` is newer than its generation.
    /// An empty `data` with a newer generation is a pure claim.
    pub fn write(&self, block: u32, gen: u64, offset: u32, data: &[u8]) -> Result<()> {
        let l = &self.layout;
        check_range(l.block_size, l.num_blocks, block, offset, data.len() as u64)?;
        check_generation(gen)?;
        self.touch(block, data.len());
        let (word, inflight) = self.ctl(block);
        let _writer = enter(block, gen, word, inflight)?;
        // Pairs with the readers' acquire fence (see `read_raw`): every
        // change of the generation we observed or made happens before our
        // bytes become visible.
        fence(Ordering::Release);
        // SAFETY: the destination range lies inside the block (checked
        // above); `data` is the caller's buffer, never the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.src(block, offset), data.len());
        }
        Ok(())
        // `_writer` drops here: the counter goes down (release), after the copy.
    }
}

/// A counted writer of one block; leaving decrements the counter.
struct Writer<'a>(&'a AtomicU32);

impl Drop for Writer<'_> {
    fn drop(&mut self) {
        leave(self.0);
    }
}

fn arrive(inflight: &AtomicU32) -> Writer<'_> {
    inflight.fetch_add(1, Ordering::SeqCst);
    Writer(inflight)
}

/// Decrements, never below zero: a writer presumed dead may have been
/// forgiven already (see `drain`).
fn leave(inflight: &AtomicU32) {
    let _ = inflight.fetch_update(Ordering::Release, Ordering::Relaxed, |n| {
        Some(n.saturating_sub(1))
    });
}

/// Spins a little, then yields.
fn backoff(round: &mut u32) {
    if *round < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
    *round = round.saturating_add(1);
}

/// Registers a writer of `gen` and makes sure `gen` is the block's settled
/// generation, claiming the block if `gen` is newer.
fn enter<'a>(
    block: u32,
    gen: u64,
    word: &AtomicU64,
    inflight: &'a AtomicU32,
) -> Result<Writer<'a>> {
    let mut me = arrive(inflight);
    loop {
        let w = word.load(Ordering::SeqCst);
        let current = w & !SETTLING;
        if current > gen {
            return Err(stale_write(block, gen, current));
        }
        if current < gen {
            // A new owner. Writers of the old generation that registered
            // before this exchange are waited for in `drain`; every writer
            // that registers after it sees the new generation and backs off.
            if word
                .compare_exchange(w, gen | SETTLING, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                drain(block, gen, word, inflight)?;
                return Ok(me);
            }
            continue;
        }
        if w & SETTLING == 0 {
            return Ok(me);
        }
        // Our generation, but another writer of it is still settling the
        // claim. Step aside (it waits for the counter to drop to one) and
        // wait for it, so we never write while an old owner still may.
        drop(me);
        wait_settled(block, gen, word);
        me = arrive(inflight);
    }
}

/// Waits until every other registered writer has left, then clears the
/// settling bit. Fails with `Stale` if a newer claim takes the block over
/// meanwhile.
fn drain(block: u32, gen: u64, word: &AtomicU64, inflight: &AtomicU32) -> Result<()> {
    let mine = gen | SETTLING;
    let started = Instant::now();
    let mut round = 0;
    loop {
        let w = word.load(Ordering::SeqCst);
        if w == gen {
            // A waiter presumed us dead and settled for us.
            return Ok(());
        }
        if w != mine {
            return Err(stale_write(block, gen, w & !SETTLING));
        }
        let n = inflight.load(Ordering::SeqCst);
        if n <= 1 {
            break;
        }
        if round >= 64 && started.elapsed() > CLAIM_WAIT {
            // A writer that has not finished one copy in this long is taken
            // for dead (its process was killed mid-copy): forgive its count
            // so later claims do not wait for it again, and go on.
            tracing::warn!(
                "block {block}: claim by generation {gen} waited {CLAIM_WAIT:?} for {} writer(s) of an older generation; presuming them dead",
                n - 1
            );
            let _ = inflight.compare_exchange(n, 1, Ordering::SeqCst, Ordering::SeqCst);
            break;
        }
        backoff(&mut round);
    }
    match word.compare_exchange(mine, gen, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => Ok(()),
        Err(w) if w == gen => Ok(()),
        Err(w) => Err(stale_write(block, gen, w & !SETTLING)),
    }
}

/// Waits while `block`'s claim by `gen` settles. A claim that does not
/// settle in twice [`CLAIM_WAIT`] (its claimer gives up waiting after one)
/// is taken for dead, and the bit is cleared on its behalf.
fn wait_settled(block: u32, gen: u64, word: &AtomicU64) {
    let started = Instant::now();
    let mut round = 0;
    while word.load(Ordering::SeqCst) == gen | SETTLING {
        if round >= 64 && started.elapsed() > 2 * CLAIM_WAIT {
            tracing::warn!(
                "block {block}: the claim by generation {gen} did not settle in {:?}; presuming its writer dead",
                2 * CLAIM_WAIT
            );
            let _ = word.compare_exchange(gen | SETTLING, gen, Ordering::SeqCst, Ordering::SeqCst);
            return;
        }
        backoff(&mut round);
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
