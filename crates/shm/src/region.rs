//! A mapped shared region, the block protocol on its atomics, and the
//! server's table of writer slots.

use crate::layout::Layout;
use crate::protocol::{self, Lanes, Memory};
use bytes::BytesMut;
use memmap2::{MmapOptions, MmapRaw};
use nodekernel_proto::{Error, Result};
use std::ffi::CStr;
use std::fs::File;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

pub use crate::protocol::SETTLING;

/// Value of the state word once the server has stopped.
const CLOSED: u64 = 1;

const MEMFD_NAME: &CStr = c"nodekernel-dram";

/// One DRAM storage server's memory: header, state word, writer lanes,
/// per-block generation words and block data, in one sealed memfd mapped
/// shared.
///
/// The server creates it ([`Region::create`]) and writes with lanes of its
/// own slots; a co-located client receives the memfd and the number of the
/// slot granted to its process, and maps it again ([`Region::open`]). Both
/// then run exactly the same protocol ([`Region::read`], [`Region::write`];
/// see [`protocol`]) on the same atomics, so network and mapped
/// accesses interoperate.
///
/// No Rust reference to block data is ever formed: data is copied with
/// `ptr::copy_nonoverlapping` between raw pointers into the mapping and the
/// caller's buffers. Only the state, lane and generation words are accessed
/// through references, as atomics.
pub struct Region {
    /// Shared with the waker thread (see [`Notifier`]), which sleeps on
    /// the wake sequence inside it.
    map: Arc<MmapRaw>,
    layout: Layout,
    file: File,
    /// The lanes this mapping writes with: the server's slots, or the
    /// client slot granted at the hand-over; `None` for a read-only mapping.
    lanes: Option<Lanes>,
    /// The client slot granted to this mapping (clients only).
    slot: Option<u32>,
    /// Server only: the state of every client slot.
    slots: Option<Mutex<Vec<SlotState>>>,
    /// Clients only: one bit per block whose pages this mapping has already
    /// faulted in (see [`Region::touch`]). The server maps everything up
    /// front.
    populated: Option<Box<[AtomicU64]>>,
    /// Wakes this process's async waits when the wake sequence moves.
    notifier: Notifier,
}

/// The slot whose waiting count the server's own waits (its writes and
/// reclamations) go to.
const SERVER_WAIT_SLOT: u32 = 0;

/// Where a client slot is in its life (server side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// All its lanes are free; it can be granted.
    Free,
    /// Granted to a hand-over connection that is still open.
    Leased,
    /// Its lease was dropped without reclamation (the server is stopping):
    /// never granted again, since its process may still be writing.
    Retired,
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("layout", &self.layout)
            .field("slot", &self.slot)
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Region {
    /// Creates a zero-filled region of `num_blocks` blocks of `block_size`
    /// bytes (every generation 0, every lane free) in a new memfd, seals
    /// its size and maps it. The region writes with the lanes of the
    /// server's slots, and grants the others with [`Region::lease_slot`].
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
        Ok(Region::server(file, layout, map))
    }

    /// The server's side of a freshly mapped region: its own lanes, every
    /// client slot free.
    fn server(file: File, layout: Layout, map: MmapRaw) -> Region {
        let client_slots = layout.slots - layout.server_slots;
        let map = Arc::new(map);
        Region {
            notifier: Notifier::new(map.clone(), layout.wake_seq_offset()),
            map,
            layout,
            file,
            lanes: Some(Lanes {
                slot: SERVER_WAIT_SLOT,
                first: 0,
                count: layout.server_slots as usize * layout.lanes_per_slot as usize,
            }),
            slot: None,
            slots: Some(Mutex::new(vec![SlotState::Free; client_slots as usize])),
            populated: None,
        }
    }

    /// Whether the regular file at `path` holds a region this build would
    /// create for `num_blocks` blocks of `block_size` bytes, so that
    /// [`Region::open_file`] may keep it: `Err` says why not (missing, of
    /// another size, a header of another version or layout). Reads only
    /// the header; changes nothing.
    pub fn check_file(
        path: &Path,
        block_size: u32,
        num_blocks: u32,
    ) -> std::result::Result<(), String> {
        let layout = Layout::new(block_size, num_blocks).map_err(|e| e.to_string())?;
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(format!("{} is missing", path.display()))
            }
            Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
        };
        let meta = file
            .metadata()
            .map_err(|e| format!("cannot inspect {}: {e}", path.display()))?;
        if !meta.is_file() {
            return Err(format!("{} is not a regular file", path.display()));
        }
        if meta.len() != layout.total_len {
            return Err(format!(
                "{} has {} bytes, this server's region has {}",
                path.display(),
                meta.len(),
                layout.total_len
            ));
        }
        let mut header = [0u8; crate::HEADER_LEN];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| format!("cannot read the header of {}: {e}", path.display()))?;
        if header != layout.encode() {
            let why = match Layout::decode(&header) {
                Err(e) => e.to_string(),
                Ok(other) => format!(
                    "it holds {} blocks of {} bytes with {} slots of {} lanes",
                    other.num_blocks, other.block_size, other.slots, other.lanes_per_slot
                ),
            };
            return Err(format!(
                "the header of {} does not match this server's region: {why}",
                path.display()
            ));
        }
        Ok(())
    }

    /// A server's region in the regular file at `path` (created mode 0600
    /// if missing), mapped shared, so that its blocks and generations
    /// outlive the process: a persistent DRAM tier (the file should live
    /// on `/dev/shm` or another memory-backed or fast file system).
    ///
    /// With `keep`, the file must hold a region of exactly this layout
    /// (see [`Region::check_file`]; otherwise `InvalidData`): its block
    /// data and generation words are kept, while what only a live process
    /// could mean is reset, since no process of the server that wrote it
    /// can still be writing: the state word (serving again), every lane,
    /// the waiting counts, and the [`SETTLING`] bit of any generation
    /// word (a claim the old process left half done: as when a dead
    /// claimer's slot is reclaimed, its generation simply owns the block
    /// now). Without `keep`, a new file is initialised like
    /// [`Region::create`]'s memfd (every generation 0) and renamed over
    /// `path` (processes that still map the old file keep the old bytes).
    ///
    /// Either way the whole file is reserved (`posix_fallocate`) and the
    /// mapping prefaulted, as for a memfd. A regular file cannot be sealed
    /// against shrinking; clients accept it all the same (see
    /// [`Region::open`] and `docs/shared-memory.md`).
    pub fn open_file(
        path: &Path,
        block_size: u32,
        num_blocks: u32,
        keep: bool,
    ) -> io::Result<Region> {
        let layout = Layout::new(block_size, num_blocks)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        if keep {
            if let Err(why) = Region::check_file(path, block_size, num_blocks) {
                return Err(io::Error::new(io::ErrorKind::InvalidData, why));
            }
        }
        // A fresh region is a new file renamed over the old one, never the
        // old one emptied in place: a process that still maps the old file
        // (a client of the server before, that has not yet noticed it is
        // gone) keeps its own bytes, cannot fault on a shrunk file, and
        // shares nothing with the new region.
        let tmp = {
            let mut name = path.as_os_str().to_owned();
            name.push(".tmp");
            std::path::PathBuf::from(name)
        };
        let file = if keep {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(path)?
        } else {
            match std::fs::remove_file(&tmp) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC)
                .open(&tmp)?;
            f.set_len(layout.total_len)?;
            f
        };
        // SAFETY: plain fallocate on a descriptor we own, inside its size;
        // it allocates what is missing and changes no byte.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, layout.total_len as i64) };
        match rc {
            0 => {}
            libc::EOPNOTSUPP | libc::EINVAL => tracing::debug!(
                "{}: posix_fallocate unsupported, the region may be sparse",
                path.display()
            ),
            rc => {
                let e = io::Error::from_raw_os_error(rc);
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "cannot reserve {} bytes for {}: {e}",
                        layout.total_len,
                        path.display()
                    ),
                ));
            }
        }
        let map = MmapOptions::new()
            .len(layout.total_len as usize)
            .populate()
            .map_raw(&file)?;
        let region = if keep {
            let region = Region::server(file, layout, map);
            region.reset_transient();
            region
        } else {
            let header = layout.encode();
            // SAFETY: the mapping is at least HEADER_LEN bytes (validated
            // layout) and nobody else can see the new file yet.
            unsafe {
                std::ptr::copy_nonoverlapping(header.as_ptr(), map.as_mut_ptr(), header.len());
            }
            std::fs::rename(&tmp, path)?;
            Region::server(file, layout, map)
        };
        Ok(region)
    }

    /// Resets what only a live process could mean (see
    /// [`Region::open_file`]).
    fn reset_transient(&self) {
        let l = &self.layout;
        self.state().store(0, Ordering::Relaxed);
        self.waiting().store(0, Ordering::Relaxed);
        for i in 0..l.lane_count() {
            self.lane(i).store(0, Ordering::Relaxed);
        }
        for s in 0..l.slots {
            self.slot_waiting(s).store(0, Ordering::Relaxed);
        }
        for b in 0..l.num_blocks {
            let w = self.generation_word(b);
            let v = w.load(Ordering::Relaxed);
            if v & SETTLING != 0 {
                w.store(v & !SETTLING, Ordering::Relaxed);
            }
        }
        fence(Ordering::SeqCst);
    }

    /// Writes every changed page of the region back to its file and waits
    /// for the device (`msync(MS_SYNC)`, then `fsync`): a file-backed
    /// region's blocks and generations then survive a machine crash. On a
    /// memfd (or tmpfs) there is nothing to write back.
    pub fn sync(&self) -> io::Result<()> {
        // SAFETY: the whole mapping, which lives as long as `self`; msync
        // changes no byte.
        let rc = unsafe {
            libc::msync(
                self.map.as_mut_ptr().cast(),
                self.layout.total_len as usize,
                libc::MS_SYNC,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        self.file.sync_all()
    }

    /// Whether some lane of any slot holds a write (in progress, or left
    /// by a process that died and was not reclaimed): a server that stops
    /// waits for none before it syncs.
    pub fn lanes_busy(&self) -> bool {
        // Pairs with the fence a writer makes after taking its lane: a
        // server write either sees the region closed (if `close` came
        // before) or its lane is seen here.
        fence(Ordering::SeqCst);
        (0..self.layout.lane_count()).any(|i| self.lane(i).load(Ordering::Acquire) != 0)
    }

    /// Maps a region received from a server, after checking everything:
    /// the header parses and is consistent, the granted `slot` (if any) is
    /// a client slot of this layout, the descriptor is a regular file (a
    /// memfd, sealed against shrinking by a volatile server, or the file of
    /// a persistent one) at least as long as the header says, the header
    /// inside the mapping matches the one received, and the server has not
    /// stopped.
    ///
    /// Writes use the lanes of `slot`; without one the mapping is read
    /// only ([`Region::write`] fails with `Unavailable`).
    pub fn open(fd: OwnedFd, header: &[u8], slot: Option<u32>) -> io::Result<Region> {
        let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidData, msg);
        let layout = Layout::decode(header).map_err(|e| invalid(e.to_string()))?;
        if let Some(s) = slot.filter(|&s| !layout.is_client_slot(s)) {
            return Err(invalid(format!(
                "slot {s} is not a client slot (the server keeps slots 0 to {}, the region has {})",
                layout.server_slots - 1,
                layout.slots
            )));
        }
        let file = File::from(fd);
        // A sealed memfd (a volatile server), or a regular file (a
        // persistent server's region: a file cannot be sealed, and only
        // its owner, the same user the hand-over already requires, could
        // shrink it; see docs/shared-memory.md).
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(invalid(
                "the received descriptor is neither a memfd nor a regular file".into(),
            ));
        }
        // SAFETY: plain fcntl on a descriptor we own.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        let sealed = seals >= 0 && seals & libc::F_SEAL_SHRINK != 0;
        if meta.len() < layout.total_len {
            return Err(invalid(format!(
                "the received {} has {} bytes, the header describes {}",
                if sealed { "memfd" } else { "file" },
                meta.len(),
                layout.total_len
            )));
        }
        let map = MmapOptions::new()
            .len(layout.total_len as usize)
            .map_raw(&file)?;
        let words = layout.num_blocks.div_ceil(64) as usize;
        let map = Arc::new(map);
        let region = Region {
            notifier: Notifier::new(map.clone(), layout.wake_seq_offset()),
            map,
            layout,
            file,
            lanes: slot.map(|s| slot_lanes(&layout, s)),
            slot,
            slots: None,
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
    unsafe fn word_at(&self, offset: u64) -> &AtomicU64 {
        // SAFETY: the caller's contract puts the word inside the mapping
        // (which lives as long as `self`), 8-aligned (the mapping is page
        // aligned), and only ever accessed atomically.
        unsafe { AtomicU64::from_ptr(self.map.as_mut_ptr().add(offset as usize).cast()) }
    }

    /// The client slot this mapping writes with (`None` for the server's
    /// own region and for a read-only mapping).
    pub fn slot(&self) -> Option<u32> {
        self.slot
    }

    /// Whether this mapping may write (it has lanes).
    pub fn can_write(&self) -> bool {
        self.lanes.is_some()
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

    /// Like [`Region::write`], for a copy that the caller makes itself,
    /// later: waits until `len` bytes of `block` at `offset` may be written
    /// under `gen` and returns them as an [`InPlaceWrite`], which announces
    /// the write (a claim of a newer generation waits for it) until it is
    /// dropped. A storage server receives a write's bytes from the socket
    /// straight into the block this way. The bytes are the block's as they
    /// arrive: a write abandoned half way leaves part of its bytes in place
    /// (under its own generation, as a torn write would).
    pub async fn write_in_place(
        self: &Arc<Self>,
        block: u32,
        gen: u64,
        offset: u32,
        len: usize,
    ) -> Result<InPlaceWrite> {
        let op = self.ready_write(block, gen, offset, len).await?;
        let lane = op
            .into_lane()
            .ok_or_else(|| Error::internal(format!("block {block}: a ready write has no lane")))?;
        Ok(InPlaceWrite {
            region: self.clone(),
            lane,
            dst: self.src(block, offset),
            len,
        })
    }

    /// Checks a write of `len` bytes of `block` at `offset` under `gen`
    /// and waits until its bytes may be copied in (see [`Region::write`]).
    async fn ready_write(
        &self,
        block: u32,
        gen: u64,
        offset: u32,
        len: usize,
    ) -> Result<protocol::Write<'_, Region>> {
        let l = &self.layout;
        check_range(l.block_size, l.num_blocks, block, offset, len as u64)?;
        check_generation(gen)?;
        let lanes = self.lanes.ok_or_else(|| {
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
        if self.slots.is_some() && self.is_closed() {
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
    async fn until_ready<T>(&self, slot: u32, mut attempt: impl FnMut() -> Poll<T>) -> T {
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
        self.lanes
    }

    /// Server: grants a free client slot to a new hand-over connection, or
    /// `None` when every client slot is taken (that client then uses the
    /// network). The slot is granted again only after
    /// [`SlotLease::reclaim`].
    pub fn lease_slot(self: &Arc<Self>) -> Option<SlotLease> {
        let table = self.slots.as_ref()?;
        let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
        let i = t.iter().position(|s| *s == SlotState::Free)?;
        t[i] = SlotState::Leased;
        Some(SlotLease {
            region: self.clone(),
            slot: self.layout.server_slots + i as u32,
            reclaimed: false,
        })
    }

    /// Client slots not granted now (server only; `None` on a client
    /// mapping).
    pub fn free_slots(&self) -> Option<usize> {
        let t = self
            .slots
            .as_ref()?
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Some(t.iter().filter(|s| **s == SlotState::Free).count())
    }

    fn set_slot_state(&self, slot: u32, state: SlotState) {
        if let Some(table) = &self.slots {
            let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(s) = t.get_mut((slot - self.layout.server_slots) as usize) {
                *s = state;
            }
        }
    }

    /// The wake sequence, a futex word shared by every process.
    fn wake_word(&self) -> &AtomicU32 {
        self.notifier.word()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.notifier.stop();
    }
}

/// A write of a region's block whose bytes the holder copies in itself
/// ([`Region::write_in_place`]): `len` bytes at [`InPlaceWrite::ptr`],
/// writable only through that raw pointer (other processes may read them
/// at any time, so no Rust reference to them is ever formed). Dropping it
/// ends the write.
pub struct InPlaceWrite {
    region: Arc<Region>,
    lane: usize,
    dst: *mut u8,
    len: usize,
}

// SAFETY: `dst` points into the mapping `region` keeps alive; the struct
// only hands the address out, and the lane is an index.
unsafe impl Send for InPlaceWrite {}

impl InPlaceWrite {
    /// Where the bytes go: valid for writes of [`InPlaceWrite::len`] bytes
    /// while `self` lives.
    pub fn ptr(&self) -> *mut u8 {
        self.dst
    }

    /// How many bytes the write covers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it covers no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for InPlaceWrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InPlaceWrite")
            .field("lane", &self.lane)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl Drop for InPlaceWrite {
    fn drop(&mut self) {
        protocol::release_lane(&*self.region, self.lane);
    }
}

/// The lanes of `slot` (< `layout.slots`).
fn slot_lanes(layout: &Layout, slot: u32) -> Lanes {
    let per = layout.lanes_per_slot as usize;
    Lanes {
        slot,
        first: slot as usize * per,
        count: per,
    }
}

impl Memory for Region {
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

/// A client slot granted to one hand-over connection, that is, to one
/// client process (server side).
///
/// When the connection closes, the process is gone or has dropped its
/// mapping, so none of its copies can still be running: call
/// [`SlotLease::reclaim`]. Dropping the lease without reclaiming retires
/// the slot for good (its process may still be writing), which is right
/// when the server itself stops.
#[derive(Debug)]
pub struct SlotLease {
    region: Arc<Region>,
    slot: u32,
    reclaimed: bool,
}

impl SlotLease {
    /// The slot number, sent to the client with the region.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The slot's process is gone: frees its lanes, completes every claim
    /// it had in progress (waiting, without blocking the thread, for
    /// writers of older generations in other processes to finish their
    /// copy), and only then makes the slot available again.
    ///
    /// Cancel safety: if the future is dropped before it completes, the
    /// slot is retired, never granted again; claims not yet settled are
    /// settled by their generation's next write or superseded.
    pub async fn reclaim(mut self) {
        let region = self.region.clone();
        let claims = protocol::clear_lanes(&*region, slot_lanes(&region.layout, self.slot));
        for block in claims {
            if block >= region.layout.num_blocks {
                // Only a corrupt lane can name one; nothing to settle.
                tracing::warn!(
                    "slot {}: a lane names block {block}, past the end",
                    self.slot
                );
                continue;
            }
            region
                .until_ready(SERVER_WAIT_SLOT, || protocol::poll_settle(&*region, block))
                .await;
        }
        region.set_slot_state(self.slot, SlotState::Free);
        self.reclaimed = true;
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        if !self.reclaimed {
            self.region.set_slot_state(self.slot, SlotState::Retired);
        }
    }
}

/// `FUTEX_WAIT` on the shared (not process-private) futex `word`: sleeps
/// while it holds `seq`, until a `FUTEX_WAKE` on it from any process (or
/// a signal: callers check again anyway). Returns at once if it differs.
fn futex_wait(word: &AtomicU32, seq: u32) {
    // SAFETY: `word` is a live, aligned u32 (in the shared mapping); the
    // kernel only reads it. No timeout, no second address.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            seq,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

/// Wakes every thread of any process sleeping in [`futex_wait`] on `word`.
fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`; FUTEX_WAKE does not even read the word.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Turns moves of the shared wake sequence into wake-ups of this process's
/// async waits: the bridge between the futex, which only blocking threads
/// can sleep on, and tasks, which must never block.
///
/// A task that must wait registers its waker with the sequence value it
/// loaded before its last try ([`Notifier::changed`]). One thread per
/// mapping, started at the first wait, sleeps in `FUTEX_WAIT` while every
/// registered waiter's value is still current, and wakes the waiters whose
/// value is not. Since a waiter's value was loaded before the thread's,
/// and the thread sleeps only while the word still holds its own value, no
/// move of the sequence is missed.
struct Notifier {
    shared: Arc<NotifierShared>,
}

struct NotifierShared {
    /// Keeps the futex word mapped while the thread runs.
    map: Arc<MmapRaw>,
    /// Offset of the wake sequence in `map`.
    at: u64,
    sleepers: Mutex<Sleepers>,
    /// Signalled when a waiter registers, or to stop.
    registered: Condvar,
}

#[derive(Default)]
struct Sleepers {
    /// Registered waits: id, the sequence value they wait to move from,
    /// their waker.
    list: Vec<(u64, u32, Waker)>,
    next_id: u64,
    started: bool,
    stop: bool,
}

impl Notifier {
    fn new(map: Arc<MmapRaw>, at: u64) -> Notifier {
        Notifier {
            shared: Arc::new(NotifierShared {
                map,
                at,
                sleepers: Mutex::default(),
                registered: Condvar::new(),
            }),
        }
    }

    fn word(&self) -> &AtomicU32 {
        self.shared.word()
    }

    /// Ready once the wake sequence differs from `seq`.
    fn changed(&self, seq: u32) -> Changed<'_> {
        Changed {
            notifier: self,
            seq,
            id: None,
        }
    }

    /// Stops the thread, if any (the region is being dropped, so nothing
    /// waits any more).
    fn stop(&self) {
        let started = {
            let mut s = self.shared.lock();
            s.stop = true;
            s.started
        };
        if started {
            self.shared.registered.notify_all();
            // The thread may be about to sleep on the futex: move the
            // sequence so that it cannot (other processes' waiters just
            // try once more).
            self.word().fetch_add(1, Ordering::SeqCst);
            futex_wake_all(self.word());
        }
    }
}

impl NotifierShared {
    fn word(&self) -> &AtomicU32 {
        // SAFETY: `at` is the wake sequence of the validated layout: inside
        // the mapping, which `self.map` keeps alive, 8-aligned, and only
        // ever accessed atomically (and by the kernel's futex calls).
        unsafe { AtomicU32::from_ptr(self.map.as_mut_ptr().add(self.at as usize).cast()) }
    }

    fn lock(&self) -> MutexGuard<'_, Sleepers> {
        self.sleepers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The thread: wakes the waiters whose value is stale, sleeps on the
    /// futex while the others' is current, on the condition variable while
    /// there are none.
    fn run(&self) {
        let mut s = self.lock();
        loop {
            if s.stop {
                return;
            }
            if s.list.is_empty() {
                s = self.registered.wait(s).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            let current = self.word().load(Ordering::SeqCst);
            s.list.retain(|(_, seq, waker)| {
                let moved = *seq != current;
                if moved {
                    waker.wake_by_ref();
                }
                !moved
            });
            if s.list.is_empty() {
                continue;
            }
            drop(s);
            futex_wait(self.word(), current);
            s = self.lock();
        }
    }
}

/// The future of [`Notifier::changed`].
struct Changed<'a> {
    notifier: &'a Notifier,
    seq: u32,
    /// Our entry in the list, once registered.
    id: Option<u64>,
}

impl Future for Changed<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let shared = self.notifier.shared.clone();
        if shared.word().load(Ordering::SeqCst) != self.seq {
            self.unregister();
            return Poll::Ready(());
        }
        let mut s = shared.lock();
        if s.stop {
            // Cannot happen while the region is borrowed; do not hang.
            return Poll::Ready(());
        }
        let id = match self.id {
            Some(id) => id,
            None => {
                let id = s.next_id;
                s.next_id += 1;
                self.id = Some(id);
                id
            }
        };
        let waker = cx.waker().clone();
        match s.list.iter_mut().find(|e| e.0 == id) {
            Some(e) => e.2 = waker,
            None => s.list.push((id, self.seq, waker)),
        }
        if !s.started {
            let thread = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("nk-shm-wake".into())
                .spawn(move || thread.run());
            if let Err(e) = spawned {
                // Without the thread nothing would wake us: try again at
                // once rather than hang (the caller re-checks).
                tracing::warn!("shared memory: cannot start the wake-up thread: {e}");
                let i = s.list.iter().position(|e| e.0 == id);
                if let Some(i) = i {
                    s.list.swap_remove(i);
                }
                self.id = None;
                return Poll::Ready(());
            }
            s.started = true;
        }
        drop(s);
        shared.registered.notify_one();
        Poll::Pending
    }
}

impl Changed<'_> {
    fn unregister(&mut self) {
        if let Some(id) = self.id.take() {
            let mut s = self.notifier.shared.lock();
            if let Some(i) = s.list.iter().position(|e| e.0 == id) {
                s.list.swap_remove(i);
            }
        }
    }
}

impl Drop for Changed<'_> {
    fn drop(&mut self) {
        self.unregister();
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
