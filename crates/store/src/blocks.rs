//! Fixed-size blocks over a [`Medium`], guarded by allocation generations.
//!
//! Every block has a generation, starting at 0. The metadata server gives
//! each allocation of a block a generation strictly greater than any earlier
//! one for that block, and clients send it with every access:
//!
//! * a **write** with a newer generation claims the block for the new owner
//!   (the block's generation becomes the request's), then writes; a write
//!   with the current generation just writes; an older generation is `Stale`
//!   and writes nothing;
//! * a **read** succeeds only with exactly the current generation. An older
//!   one means the block was reused by a newer owner; a newer one means the
//!   new owner has not written yet, so the bytes still belong to someone
//!   else. Either way the reply is `Stale` and carries no bytes.
//!
//! A claim waits for every copy already in flight under the old generation,
//! and every access that starts afterwards sees the new generation. An old
//! owner's delayed write therefore can never land on top of a new owner's
//! bytes, and a read never returns bytes copied while the block changed
//! hands. Two implementations keep these rules:
//!
//! * **DRAM** (a medium with a [`shared_region`](Medium::shared_region)):
//!   the generations and writer lanes live in shared memory next to the
//!   data, and reads and writes run the lock-free protocol of
//!   [`nodekernel_shm`]: readers check the generation before and after
//!   their copy, writers publish the block in a lane of their process's
//!   slot, and a claim waits (without blocking the task) until no lane
//!   writes the block. Co-located clients that mapped the same
//!   memory run the very same protocol, so network and mapped accesses
//!   interoperate. The copy is a synchronous memcpy in the connection task.
//! * **Other media** (the file medium): the generation is an atomic in this
//!   process (in a file mapped shared, `gens`, on a persistent server, so
//!   that every claim is in the page cache the instant it happens: the
//!   same single store, no extra cost), and each block has a reader-writer
//!   lock: reads and
//!   same-generation writes hold it shared for the copy (they run
//!   concurrently), and a claim holds it exclusively while it raises the
//!   generation. The lock is an async (`tokio`) lock, because the "copy" is
//!   an I/O the connection task awaits. The shared guard is handed to the
//!   medium as its [`Keepalive`], which drops it only when the kernel has
//!   completed the I/O: even if the request's future is dropped halfway
//!   (server shutdown), a claim still waits for the old owner's I/O. Writes
//!   to different bytes of one block share the lock; the file medium
//!   serialises read-modify-writes of a shared 4 KiB sector itself (see
//!   [`file`](crate::file)).
//!
//! Generations with bit 63 set are refused with `InvalidArgument` on every
//! medium (the shared protocol uses that bit). The store never interprets
//! block bytes; it only checks generations and bounds.

use crate::medium::{Keepalive, Medium};
use crate::persist::GenFile;
use bytes::BytesMut;
use nodekernel_proto::{Error, Result};
use nodekernel_shm::{check_generation, check_range, stale_read, stale_write, ServerRegion};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// One block's generation and lock (other media than DRAM).
struct BlockState<'a> {
    gen: &'a AtomicU64,
    /// Held shared for copies (until their I/O completed), exclusively to
    /// change `gen`.
    lock: &'a Arc<RwLock<()>>,
}

/// Where the generation words of a medium without a shared region live.
enum Gens {
    /// In this process's memory (a volatile server).
    Heap(Box<[AtomicU64]>),
    /// In a file mapped shared (a persistent server): every store is in
    /// the page cache at once.
    File(GenFile),
}

/// Generations and per-block locks of a medium without a shared region.
struct Locked {
    gens: Gens,
    locks: Box<[Arc<RwLock<()>>]>,
}

impl Locked {
    #[inline]
    fn words(&self) -> &[AtomicU64] {
        match &self.gens {
            Gens::Heap(w) => w,
            Gens::File(f) => f.words(),
        }
    }
}

/// Where the generations live.
enum Guards {
    /// In the medium's shared region (DRAM).
    Shared(Arc<ServerRegion>),
    /// In this process (or a file it maps), one lock per block (other
    /// media).
    Locked(Locked),
}

/// The blocks of one storage server.
pub struct BlockStore {
    medium: Box<dyn Medium>,
    guards: Guards,
    block_size: u32,
    num_blocks: u32,
    /// Set by a stopping server ([`BlockStore::close_and_quiesce`]): writes
    /// to a medium without a shared region are refused from then on.
    closed: std::sync::atomic::AtomicBool,
}

impl BlockStore {
    /// Splits `medium` into `num_blocks` blocks of `block_size` bytes, all at
    /// generation 0.
    ///
    /// # Panics
    ///
    /// If the medium is smaller than `block_size * num_blocks` bytes, or its
    /// shared region has another shape (a programming error:
    /// [`StoreConfig`](crate::StoreConfig) sizes the medium from the same
    /// numbers).
    pub fn new(medium: Box<dyn Medium>, block_size: u32, num_blocks: u32) -> BlockStore {
        BlockStore::with_gens(medium, block_size, num_blocks, None)
    }

    /// [`BlockStore::new`], with the generations of a medium without a
    /// shared region kept in `gens` (a persistent server's generation
    /// file, whose words are the blocks' generations as they stand)
    /// instead of process memory.
    ///
    /// # Panics
    ///
    /// As [`BlockStore::new`], and if `gens` does not hold one word per
    /// block.
    pub(crate) fn with_gens(
        medium: Box<dyn Medium>,
        block_size: u32,
        num_blocks: u32,
        gens: Option<GenFile>,
    ) -> BlockStore {
        assert!(
            u64::from(block_size) * u64::from(num_blocks) <= medium.size(),
            "medium of {} bytes cannot hold {num_blocks} blocks of {block_size} bytes",
            medium.size()
        );
        let guards = match medium.shared_region() {
            Some(r) => {
                assert!(
                    r.block_size() == block_size && r.num_blocks() == num_blocks,
                    "shared region of {} blocks of {} bytes used as {num_blocks} blocks of {block_size} bytes",
                    r.num_blocks(),
                    r.block_size()
                );
                Guards::Shared(r.clone())
            }
            None => {
                let gens = match gens {
                    Some(f) => {
                        assert_eq!(f.words().len(), num_blocks as usize, "generation file size");
                        Gens::File(f)
                    }
                    None => Gens::Heap((0..num_blocks).map(|_| AtomicU64::new(0)).collect()),
                };
                Guards::Locked(Locked {
                    gens,
                    locks: (0..num_blocks).map(|_| Arc::new(RwLock::new(()))).collect(),
                })
            }
        };
        BlockStore {
            medium,
            guards,
            block_size,
            num_blocks,
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    pub fn num_blocks(&self) -> u32 {
        self.num_blocks
    }

    /// `"dram"` or `"file"`.
    pub fn medium_kind(&self) -> &'static str {
        self.medium.kind()
    }

    /// How the medium moves bytes: `"memory"` for DRAM, an
    /// [`IoMode`](crate::IoMode) string such as `"io_uring+O_DIRECT"` for a
    /// file.
    pub fn io_mode(&self) -> &'static str {
        self.medium.io_mode()
    }

    /// The shared region holding data and generations (DRAM), which can be
    /// handed to co-located clients.
    pub fn shared_region(&self) -> Option<&Arc<ServerRegion>> {
        match &self.guards {
            Guards::Shared(r) => Some(r),
            Guards::Locked(_) => None,
        }
    }

    /// The current generation of `block`, or `None` past the end.
    pub fn generation(&self, block: u32) -> Option<u64> {
        match &self.guards {
            Guards::Shared(r) => r.generation(block),
            Guards::Locked(l) => l
                .words()
                .get(block as usize)
                .map(|g| g.load(Ordering::Acquire)),
        }
    }

    /// Bytes of memory a [`BlockStore::read`] of `len` bytes of `block` at
    /// `offset` holds besides the bytes it appends (see
    /// [`Medium::read_buffer_len`]).
    pub fn read_buffer_len(&self, block: u32, offset: u32, len: u32) -> usize {
        self.medium
            .read_buffer_len(self.position(block, offset), len as usize)
    }

    /// Appends `len` bytes of `block` starting at `offset` to `out`, if `gen`
    /// is the block's current generation. On any error nothing is appended.
    ///
    /// Cancel-safe: if the future is dropped, nothing is appended and any
    /// I/O already started keeps the block's guard until it completes.
    pub async fn read(
        &self,
        block: u32,
        gen: u64,
        offset: u32,
        len: u32,
        out: &mut BytesMut,
    ) -> Result<()> {
        let blocks = match &self.guards {
            Guards::Shared(r) => return r.read_append(block, gen, offset, len, out),
            Guards::Locked(blocks) => blocks,
        };
        let state = self.check(blocks, block, offset, u64::from(len))?;
        check_generation(gen)?;
        let guard = state.lock.clone().read_owned().await;
        let current = state.gen.load(Ordering::Acquire);
        if gen != current {
            return Err(stale_read(block, gen, current));
        }
        let start = out.len();
        let pos = self.position(block, offset);
        // Holds the guard (directly, or shared with the medium's I/O) until
        // after the re-check below.
        let mut held = None;
        let result = match self.medium.as_async() {
            None => self.medium.read_into(pos, len as usize, out),
            Some(m) => {
                let k = keep(guard);
                held = Some(k.clone());
                m.read_into_async(pos, len as usize, out, k).await
            }
        };
        if let Err(e) = result {
            out.truncate(start);
            return Err(medium_error("read", block, offset, u64::from(len), e));
        }
        // The shared guard keeps the generation fixed during the copy, so
        // this re-check cannot fail today; it stays as a second line of
        // defence should the locking ever change: bytes copied while the
        // block changed hands are never returned.
        let after = state.gen.load(Ordering::Acquire);
        if after != gen {
            out.truncate(start);
            return Err(stale_read(block, gen, after));
        }
        drop(held);
        Ok(())
    }

    /// Writes `data` into `block` at `offset` under generation `gen`,
    /// claiming the block first if `gen` is newer than its current one.
    ///
    /// If the future is dropped, the write may or may not have happened; an
    /// I/O already started keeps the block's guard until it completes, so a
    /// later claim still waits for it.
    pub async fn write(&self, block: u32, gen: u64, offset: u32, data: &[u8]) -> Result<()> {
        let blocks = match &self.guards {
            Guards::Shared(r) => return r.write(block, gen, offset, data).await,
            Guards::Locked(blocks) => blocks,
        };
        let state = self.check(blocks, block, offset, data.len() as u64)?;
        check_generation(gen)?;
        let guard = if gen > state.gen.load(Ordering::Acquire) {
            // A new owner: raise the generation once every in-flight copy
            // under the old one has finished, then keep the lock shared for
            // our own copy.
            let excl = state.lock.clone().write_owned().await;
            self.check_open(block)?;
            let current = state.gen.load(Ordering::Acquire);
            if gen > current {
                state.gen.store(gen, Ordering::Release);
            }
            OwnedRwLockWriteGuard::downgrade(excl)
        } else {
            let shared = state.lock.clone().read_owned().await;
            self.check_open(block)?;
            shared
        };
        let current = state.gen.load(Ordering::Acquire);
        if gen != current {
            // Older than the current owner (possibly because an even newer
            // owner claimed the block just now).
            return Err(stale_write(block, gen, current));
        }
        let pos = self.position(block, offset);
        let result = match self.medium.as_async() {
            None => self.medium.write(pos, data),
            Some(m) => m.write_async(pos, data, keep(guard)).await,
        };
        result.map_err(|e| medium_error("write", block, offset, data.len() as u64, e))
    }

    /// Refuses a write once the store is closed. Called under the block's
    /// lock, before the write changes anything (generation or bytes): once
    /// a stopping server has seen every block's lock free after closing,
    /// nothing reaches the medium or the generations any more (see
    /// [`BlockStore::close_and_quiesce`]).
    #[inline]
    fn check_open(&self, block: u32) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::unavailable(format!(
                "block {block}: the storage server is stopping"
            )));
        }
        Ok(())
    }

    /// Validates the block index and byte range (without overflow).
    fn check<'a>(
        &self,
        blocks: &'a Locked,
        block: u32,
        offset: u32,
        len: u64,
    ) -> Result<BlockState<'a>> {
        check_range(self.block_size, self.num_blocks, block, offset, len)?;
        match (
            blocks.words().get(block as usize),
            blocks.locks.get(block as usize),
        ) {
            (Some(gen), Some(lock)) => Ok(BlockState { gen, lock }),
            _ => Err(Error::internal(format!(
                "block {block} has no state (store of {} blocks)",
                blocks.locks.len()
            ))),
        }
    }

    /// Closes the store to writes and waits, up to `patience`, until no
    /// write is in flight any more. On DRAM (whose region the server
    /// marked closed already): until no lane of any slot holds a write. On
    /// other media: writes are refused from now on (checked under the
    /// block's lock), and it waits until every block's lock has been free
    /// once (an I/O keeps its block's lock until the kernel completed it):
    /// a write either held the lock before, and is waited for, or takes it
    /// after and sees the store closed. Returns whether every write was
    /// over in time; then nothing changes the medium any more (on DRAM,
    /// unless a client that has not yet seen the region closed starts a
    /// copy). Used by a stopping server, after it stopped serving, before
    /// it syncs and releases its block file.
    pub(crate) fn close_and_quiesce(&self, patience: std::time::Duration) -> bool {
        self.closed.store(true, Ordering::SeqCst);
        let deadline = std::time::Instant::now() + patience;
        let mut next = 0;
        loop {
            let done = match &self.guards {
                Guards::Shared(r) => !r.lanes_busy(),
                Guards::Locked(l) => {
                    // Blocks seen free once stay done: a later write sees
                    // the store closed.
                    while next < l.locks.len() && l.locks[next].try_write().is_ok() {
                        next += 1;
                    }
                    next == l.locks.len()
                }
            };
            if done {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Gives the memory (or disk space) of `block` back: it left the
    /// exported capacity (dynamic capacity), after a claim fenced it, so
    /// nobody reads or writes it until it is handed out again.
    pub(crate) fn release(&self, block: u32) -> std::io::Result<()> {
        let bs = u64::from(self.block_size);
        self.medium.release(u64::from(block) * bs, bs)
    }

    /// Writes the blocks and their generations back to their files and
    /// waits for the device (a persistent server's clean stop).
    pub(crate) fn sync(&self) -> std::io::Result<()> {
        match &self.guards {
            Guards::Shared(r) => r.sync(),
            Guards::Locked(l) => {
                self.medium.sync()?;
                match &l.gens {
                    Gens::File(f) => f.sync(),
                    Gens::Heap(_) => Ok(()),
                }
            }
        }
    }

    fn position(&self, block: u32, offset: u32) -> u64 {
        u64::from(block) * u64::from(self.block_size) + u64::from(offset)
    }
}

fn keep(guard: OwnedRwLockReadGuard<()>) -> Keepalive {
    Arc::new(guard)
}

fn medium_error(what: &str, block: u32, offset: u32, len: u64, e: std::io::Error) -> Error {
    tracing::error!("medium {what} failed at block {block} offset {offset} length {len}: {e}");
    Error::internal(format!(
        "medium {what} failed at block {block} offset {offset} length {len}: {e}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file::block_on;
    use crate::file::FileMedium;
    use crate::medium::DramMedium;
    use crate::FileIoConfig;
    use nodekernel_proto::ErrorCode;
    use nodekernel_shm::testing::busy_thread;
    use std::sync::Arc;

    const BS: u32 = 64 << 10;
    const N: u32 = 4;

    fn dram() -> BlockStore {
        let m = DramMedium::new(BS, N).unwrap();
        BlockStore::new(Box::new(m), BS, N)
    }

    fn file(dir: &tempfile::TempDir) -> BlockStore {
        file_with(dir, &FileIoConfig::default())
    }

    fn file_with(dir: &tempfile::TempDir, io: &FileIoConfig) -> BlockStore {
        let m =
            FileMedium::create_with(&dir.path().join("blocks"), u64::from(BS) * u64::from(N), io)
                .unwrap();
        BlockStore::new(Box::new(m), BS, N)
    }

    /// Every file I/O mode: (io_uring, O_DIRECT) on and off.
    fn file_modes() -> Vec<FileIoConfig> {
        let mut v = Vec::new();
        for io_uring in [true, false] {
            for direct in [true, false] {
                v.push(FileIoConfig {
                    io_uring,
                    direct,
                    queue_depth: 8,
                    stream_reads: true,
                });
            }
        }
        v
    }

    /// Small deterministic generator (xorshift), so failures reproduce.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn write(s: &BlockStore, block: u32, gen: u64, offset: u32, data: &[u8]) -> Result<()> {
        block_on(s.write(block, gen, offset, data))
    }

    fn read(s: &BlockStore, block: u32, gen: u64, offset: u32, len: u32) -> Result<Vec<u8>> {
        let mut out = BytesMut::new();
        block_on(s.read(block, gen, offset, len, &mut out))?;
        Ok(out.to_vec())
    }

    /// Random writes mirrored in a model; every read must match the model.
    fn random_round_trip(s: &BlockStore) {
        let mut model = vec![vec![0u8; BS as usize]; N as usize];
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for b in 0..N {
            write(s, b, 1, 0, &[]).unwrap();
        }
        for i in 0..400 {
            let block = rng.below(u64::from(N)) as u32;
            let offset = rng.below(u64::from(BS)) as u32;
            let len = match i % 5 {
                0 => 1,
                1 => rng.below(17) as u32,
                _ => rng.below(u64::from(BS - offset) + 1) as u32,
            }
            .min(BS - offset);
            let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
            write(s, block, 1, offset, &data).unwrap();
            model[block as usize][offset as usize..(offset + len) as usize].copy_from_slice(&data);

            let rb = rng.below(u64::from(N)) as u32;
            let ro = rng.below(u64::from(BS)) as u32;
            let rl = rng.below(u64::from(BS - ro) + 1) as u32;
            assert_eq!(
                read(s, rb, 1, ro, rl).unwrap(),
                &model[rb as usize][ro as usize..(ro + rl) as usize],
                "iteration {i}: block {rb} offset {ro} len {rl}"
            );
        }
        // A full block, both ways.
        let full: Vec<u8> = (0..BS).map(|i| (i * 7 + 3) as u8).collect();
        write(s, N - 1, 1, 0, &full).unwrap();
        assert_eq!(read(s, N - 1, 1, 0, BS).unwrap(), full);
        for b in 0..N - 1 {
            assert_eq!(
                read(s, b, 1, 0, BS).unwrap(),
                model[b as usize],
                "block {b}"
            );
        }
        // Odd offsets and lengths, including the last byte of a block.
        write(s, 0, 1, 3, b"hello").unwrap();
        assert_eq!(read(s, 0, 1, 4, 3).unwrap(), b"ell");
        write(s, 0, 1, BS - 1, b"Z").unwrap();
        assert_eq!(read(s, 0, 1, BS - 1, 1).unwrap(), b"Z");
        assert_eq!(read(s, 0, 1, BS, 0).unwrap(), b"");
        // Blocks do not bleed into each other.
        write(s, 1, 1, 0, b"next").unwrap();
        assert_eq!(read(s, 0, 1, BS - 1, 1).unwrap(), b"Z");
    }

    #[test]
    fn io_mode_is_reported() {
        assert_eq!(dram().io_mode(), "memory");
        let dir = tempfile::tempdir().unwrap();
        let s = file(&dir);
        assert_eq!(s.medium_kind(), "file");
        assert!(
            s.io_mode().starts_with("io_uring+") || s.io_mode().starts_with("pread/pwrite+"),
            "{}",
            s.io_mode()
        );
    }

    #[test]
    fn dram_round_trip() {
        random_round_trip(&dram());
    }

    #[test]
    fn file_round_trip() {
        for io in file_modes() {
            let dir = tempfile::tempdir().unwrap();
            let s = file_with(&dir, &io);
            random_round_trip(&s);
        }
    }

    fn code<T: std::fmt::Debug>(r: Result<T>) -> ErrorCode {
        r.expect_err("expected an error").code
    }

    fn generation_rules(s: &BlockStore) {
        write(s, 2, 5, 10, b"five").unwrap();
        assert_eq!(s.generation(2), Some(5));
        assert_eq!(read(s, 2, 5, 10, 4).unwrap(), b"five");
        assert_eq!(code(read(s, 2, 4, 10, 4)), ErrorCode::Stale, "older reader");
        assert_eq!(
            code(read(s, 2, 6, 10, 4)),
            ErrorCode::Stale,
            "new owner not written yet"
        );
        assert_eq!(
            s.generation(2),
            Some(5),
            "reads never change the generation"
        );

        // Same generation keeps writing.
        write(s, 2, 5, 14, b"!").unwrap();
        assert_eq!(read(s, 2, 5, 10, 5).unwrap(), b"five!");

        // Generation 6 claims the block.
        write(s, 2, 6, 0, b"six").unwrap();
        assert_eq!(s.generation(2), Some(6));
        assert_eq!(read(s, 2, 6, 0, 3).unwrap(), b"six");
        assert_eq!(code(read(s, 2, 5, 10, 4)), ErrorCode::Stale);
        assert_eq!(code(write(s, 2, 5, 0, b"OLD")), ErrorCode::Stale);
        assert_eq!(
            read(s, 2, 6, 0, 3).unwrap(),
            b"six",
            "a stale write writes nothing"
        );
        assert_eq!(s.generation(2), Some(6));

        // An empty write claims, too; other blocks are unaffected.
        write(s, 2, 9, 0, &[]).unwrap();
        assert_eq!(s.generation(2), Some(9));
        assert_eq!(s.generation(1), Some(0));
        assert_eq!(code(read(s, 1, 5, 0, 1)), ErrorCode::Stale);

        // A failed read appends nothing to the reply buffer.
        let mut out = BytesMut::from(&b"hdr"[..]);
        assert!(block_on(s.read(2, 6, 0, 3, &mut out)).is_err());
        assert_eq!(&out[..], b"hdr");
    }

    #[test]
    fn dram_generation_rules() {
        generation_rules(&dram());
    }

    #[test]
    fn file_generation_rules() {
        for io in file_modes() {
            let dir = tempfile::tempdir().unwrap();
            generation_rules(&file_with(&dir, &io));
        }
    }

    #[test]
    fn bounds_are_checked_without_overflow() {
        let s = dram();
        write(&s, 0, 1, 0, b"x").unwrap();
        let long = vec![0u8; BS as usize + 1];
        let cases: Vec<(&str, Result<()>)> = vec![
            ("write past block end", write(&s, 0, 1, BS - 2, b"abc")),
            ("write longer than a block", write(&s, 0, 1, 0, &long)),
            ("write at offset block_size", write(&s, 0, 1, BS, b"a")),
            ("write at u32::MAX", write(&s, 0, 1, u32::MAX, b"a")),
            ("write block past end", write(&s, N, 1, 0, b"a")),
            (
                "write block u32::MAX",
                write(&s, u32::MAX, 1, u32::MAX, b"a"),
            ),
            ("read past block end", read(&s, 0, 1, BS - 2, 3).map(drop)),
            (
                "read longer than a block",
                read(&s, 0, 1, 0, BS + 1).map(drop),
            ),
            (
                "read u32::MAX offset and length",
                read(&s, 0, 1, u32::MAX, u32::MAX).map(drop),
            ),
            (
                "read u32::MAX length",
                read(&s, 0, 1, 0, u32::MAX).map(drop),
            ),
            ("read block past end", read(&s, N, 1, 0, 1).map(drop)),
            (
                "read block u32::MAX",
                read(&s, u32::MAX, u64::MAX, u32::MAX, u32::MAX).map(drop),
            ),
        ];
        for (what, r) in cases {
            let e = r.expect_err(what);
            assert_eq!(e.code, ErrorCode::OutOfRange, "{what}: {e}");
            assert!(e.message.contains("block"), "{what}: {e}");
        }
        let e = write(&s, 1, 1, 100, &[0; 65500]).unwrap_err();
        for part in ["block 1", "offset 100", "length 65500", &BS.to_string()] {
            assert!(e.message.contains(part), "{e} names {part}");
        }
        // Out-of-range writes must not claim the block.
        assert_eq!(s.generation(1), Some(0));
        assert_eq!(s.generation(0), Some(1));
        assert_eq!(read(&s, 0, 1, 0, 1).unwrap(), b"x");
    }

    /// A claim must wait for copies in flight under the old generation, and
    /// old-generation writes after it must fail: the new owner's bytes are
    /// never overwritten by the old owner.
    fn old_owner_never_overwrites_new_owner(s: Arc<BlockStore>, rounds: u64) {
        for round in 0..rounds {
            let old = 2 * round + 1;
            let new = old + 1;
            write(&s, 3, old, 0, &[1u8; BS as usize]).unwrap();
            let old_writer = {
                let s = s.clone();
                // The old owner keeps writing until it is told it is stale.
                busy_thread(move || match write(&s, 3, old, 0, &[1u8; BS as usize]) {
                    Ok(()) => true,
                    Err(e) => {
                        assert_eq!(e.code, ErrorCode::Stale);
                        false
                    }
                })
            };
            write(&s, 3, new, 0, &[2u8; BS as usize]).unwrap();
            old_writer.join().unwrap();
            let bytes = read(&s, 3, new, 0, BS).unwrap();
            let leaked = bytes.iter().filter(|&&b| b != 2).count();
            assert_eq!(
                leaked, 0,
                "round {round}: {leaked} bytes of the old owner landed after the claim"
            );
            assert_eq!(code(read(&s, 3, old, 0, 1)), ErrorCode::Stale);
        }
    }

    /// Readers racing with a claim either get exactly the old owner's bytes
    /// (before the claim) or `Stale`, never a mix.
    fn racing_reads_get_old_bytes_or_stale(s: Arc<BlockStore>, rounds: u64) {
        for round in 0..rounds {
            let old = 2 * round + 1;
            write(&s, 0, old, 0, &[7u8; BS as usize]).unwrap();
            let reader = {
                let s = s.clone();
                busy_thread(move || match read(&s, 0, old, 0, BS) {
                    Ok(b) => {
                        assert!(b.iter().all(|&x| x == 7), "round {round}: read mixed bytes");
                        true
                    }
                    Err(e) => {
                        assert_eq!(e.code, ErrorCode::Stale);
                        false
                    }
                })
            };
            write(&s, 0, old + 1, 0, &[9u8; BS as usize]).unwrap();
            reader.join().unwrap();
        }
    }

    #[test]
    fn dram_old_owner_never_overwrites_new_owner() {
        old_owner_never_overwrites_new_owner(Arc::new(dram()), 300);
    }

    #[test]
    fn dram_racing_reads_get_old_bytes_or_stale() {
        racing_reads_get_old_bytes_or_stale(Arc::new(dram()), 300);
    }

    /// A second, independent mapping of a DRAM store's memfd: what a
    /// co-located client in another process works on.
    fn client_mapping(s: &BlockStore) -> Arc<nodekernel_shm::ClientRegion> {
        let r = s.shared_region().expect("DRAM is shared");
        Arc::new(nodekernel_shm::testing::second_mapping(r))
    }

    #[test]
    fn file_store_has_no_shared_region() {
        let dir = tempfile::tempdir().unwrap();
        assert!(file(&dir).shared_region().is_none());
        assert!(dram().shared_region().is_some());
    }

    /// The store's own (network) path and a client's mapping race each
    /// other, in both roles: an old owner writing through the mapping never
    /// lands after a claim through the store and vice versa, and readers on
    /// one side racing claims on the other get the old bytes or `Stale`.
    #[test]
    fn dram_store_and_a_client_mapping_obey_one_protocol() {
        let s = Arc::new(dram());
        let m = client_mapping(&s);
        write(&s, 1, 5, 0, b"from the store").unwrap();
        let mut buf = [0u8; 14];
        m.read(1, 5, 0, &mut buf).unwrap();
        assert_eq!(&buf, b"from the store");
        block_on(m.write(1, 6, 0, b"client")).unwrap();
        assert_eq!(
            s.generation(1),
            Some(6),
            "a mapped write claims for everyone"
        );
        assert_eq!(code(read(&s, 1, 5, 0, 1)), ErrorCode::Stale);
        assert_eq!(read(&s, 1, 6, 0, 6).unwrap(), b"client");
        write(&s, 1, 7, 0, &[]).unwrap();
        assert_eq!(
            m.read(1, 6, 0, &mut buf).unwrap_err().code,
            ErrorCode::Stale
        );
        assert_eq!(
            block_on(m.write(1, 6, 0, b"late")).unwrap_err().code,
            ErrorCode::Stale,
            "a claim over the network fences mapped writers"
        );

        for round in 0..200u64 {
            let base = 100 + 4 * round;
            // Old owner on the mapping, new owner through the store.
            block_on(m.write(3, base, 0, &[1u8; BS as usize])).unwrap();
            let old_writer = {
                let m = m.clone();
                busy_thread(
                    move || match block_on(m.write(3, base, 0, &[1u8; BS as usize])) {
                        Ok(()) => true,
                        Err(e) => {
                            assert_eq!(e.code, ErrorCode::Stale);
                            false
                        }
                    },
                )
            };
            write(&s, 3, base + 1, 0, &[2u8; BS as usize]).unwrap();
            old_writer.join().unwrap();
            let bytes = read(&s, 3, base + 1, 0, BS).unwrap();
            assert!(
                bytes.iter().all(|&b| b == 2),
                "round {round}: old mapped bytes leaked"
            );

            // Old owner through the store, new owner on the mapping.
            let old_writer = {
                let s = s.clone();
                busy_thread(
                    move || match write(&s, 3, base + 1, 0, &[3u8; BS as usize]) {
                        Ok(()) => true,
                        Err(e) => {
                            assert_eq!(e.code, ErrorCode::Stale);
                            false
                        }
                    },
                )
            };
            block_on(m.write(3, base + 2, 0, &[4u8; BS as usize])).unwrap();
            old_writer.join().unwrap();
            let mut all = vec![0u8; BS as usize];
            m.read(3, base + 2, 0, &mut all).unwrap();
            assert!(
                all.iter().all(|&b| b == 4),
                "round {round}: old network bytes leaked"
            );

            // Mapped readers racing a claim through the store.
            let reader = {
                let m = m.clone();
                busy_thread(move || {
                    let mut buf = vec![0u8; BS as usize];
                    match m.read(3, base + 2, 0, &mut buf) {
                        Ok(()) => {
                            assert!(buf.iter().all(|&x| x == 4), "round {round}: mixed read");
                            true
                        }
                        Err(e) => {
                            assert_eq!(e.code, ErrorCode::Stale);
                            assert!(
                                buf.iter().all(|&x| x == 0),
                                "round {round}: foreign bytes kept"
                            );
                            false
                        }
                    }
                })
            };
            write(&s, 3, base + 3, 0, &[5u8; BS as usize]).unwrap();
            reader.join().unwrap();
        }
        assert_eq!(m.writers_in_flight(3), Some(0));
    }

    #[test]
    fn file_old_owner_never_overwrites_new_owner() {
        for io in file_modes() {
            let dir = tempfile::tempdir().unwrap();
            old_owner_never_overwrites_new_owner(Arc::new(file_with(&dir, &io)), 30);
        }
    }

    #[test]
    fn file_racing_reads_get_old_bytes_or_stale() {
        for io in file_modes() {
            let dir = tempfile::tempdir().unwrap();
            racing_reads_get_old_bytes_or_stale(Arc::new(file_with(&dir, &io)), 30);
        }
    }
}
