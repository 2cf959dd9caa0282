//! Page-aligned heap buffers handed to the kernel.

use nodekernel_proto::sync;
use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

/// Alignment of every direct I/O: buffer address, file offset and length.
///
/// 4096 covers devices with 512-byte and 4 KiB logical blocks and the page
/// size of the machines we run on.
pub const ALIGN: u64 = 4096;

/// A heap buffer whose address is [`ALIGN`]-aligned.
///
/// It owns its memory (a raw allocation, never a `Vec` that could
/// reallocate), so its address is stable for its whole life: moving the
/// `AlignedBuf` value into an in-flight request does not move the bytes the
/// kernel writes into or reads from. The I/O engines keep the buffer inside
/// the request until the kernel has completed it.
///
/// The memory is zeroed when allocated, so every byte is always
/// initialised; a recycled buffer (see [`BufPool`]) holds old bytes, which
/// every user overwrites before reading.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    /// Bytes in use, at most `layout.size()`.
    len: usize,
    layout: Layout,
}

// SAFETY: `AlignedBuf` uniquely owns its allocation (like `Box<[u8]>`); the
// raw pointer is only an implementation detail.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out `&[u8]`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zero-filled buffer of `len` bytes (the allocation is rounded up to
    /// a multiple of [`ALIGN`]).
    ///
    /// Callers bound `len` by the block size (at most 16 MiB plus two
    /// sectors), so the allocation cannot be driven by network input alone.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let align = ALIGN as usize;
        let size = len.max(1).div_ceil(align) * align;
        let layout = Layout::from_size_align(size, align).expect("aligned buffer layout");
        // SAFETY: `layout` has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len, layout }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes allocated (a multiple of [`ALIGN`]).
    pub fn capacity(&self) -> usize {
        self.layout.size()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the allocation holds at least `len` initialised bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The buffer start, for the kernel. It stays valid until `self` drops.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

/// Largest buffer capacity kept for reuse.
const MAX_POOLED: usize = 32 << 20;
/// Bytes of free buffers a pool keeps in all, at most.
const POOL_BYTES: usize = 64 << 20;

/// Recycles aligned buffers, so that steady-state I/O neither allocates
/// nor zeroes: buffers of power-of-two capacities, a free list per capacity.
pub struct BufPool {
    classes: Vec<std::sync::Mutex<Vec<AlignedBuf>>>,
    /// Free buffers kept per class at most (at least 2).
    keep: usize,
    /// Bytes of the free buffers held, at most [`POOL_BYTES`].
    cached: std::sync::atomic::AtomicUsize,
}

impl BufPool {
    /// A pool keeping up to about `keep` free buffers per size class.
    pub fn new(keep: usize) -> BufPool {
        let classes = (ALIGN.trailing_zeros()..=MAX_POOLED.trailing_zeros())
            .map(|_| std::sync::Mutex::new(Vec::new()))
            .collect();
        BufPool {
            classes,
            keep: keep.max(2),
            cached: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn class(cap: usize) -> usize {
        (cap.trailing_zeros() - ALIGN.trailing_zeros()) as usize
    }

    /// The capacity of the buffer [`BufPool::get`] hands out for `len`
    /// bytes.
    pub fn capacity(len: usize) -> usize {
        len.max(ALIGN as usize).next_power_of_two()
    }

    /// A buffer of `len` bytes (contents unspecified but initialised).
    pub fn get(&self, len: usize) -> AlignedBuf {
        let cap = Self::capacity(len);
        if cap <= MAX_POOLED {
            let free = sync::lock(&self.classes[Self::class(cap)]).pop();
            if let Some(mut b) = free {
                self.cached.fetch_sub(cap, Ordering::Relaxed);
                b.len = len;
                return b;
            }
        }
        let mut b = AlignedBuf::zeroed(cap);
        b.len = len;
        b
    }

    /// Returns `buf` for reuse (or frees it if the class is full).
    pub fn put(&self, buf: AlignedBuf) {
        let cap = buf.capacity();
        if cap > MAX_POOLED || !cap.is_power_of_two() {
            return;
        }
        let mut free = sync::lock(&self.classes[Self::class(cap)]);
        if free.len() < self.keep
            && self.cached.fetch_add(cap, Ordering::Relaxed) + cap <= POOL_BYTES
        {
            free.push(buf);
        } else if free.len() < self.keep {
            // Over the byte budget: undo the reservation and free it.
            self.cached.fetch_sub(cap, Ordering::Relaxed);
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with exactly this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_recycles_by_capacity() {
        let pool = BufPool::new(4);
        let mut a = pool.get(5000);
        assert_eq!((a.len(), a.capacity()), (5000, 8192));
        a.as_mut_slice().fill(9);
        let addr = a.as_mut_ptr() as usize;
        pool.put(a);
        let mut b = pool.get(8000);
        assert_eq!(b.as_mut_ptr() as usize, addr, "reused");
        assert_eq!(b.len(), 8000);
        let mut c = pool.get(8000);
        assert_ne!(c.as_mut_ptr() as usize, addr, "a new one while b is out");
        assert_eq!(c.as_mut_ptr() as usize % ALIGN as usize, 0);
        for x in [b, c] {
            pool.put(x);
        }
        // Tiny and huge requests work, huge ones are not kept.
        assert_eq!(pool.get(0).capacity(), 4096);
        let big = pool.get(MAX_POOLED + 1);
        assert!(big.capacity() > MAX_POOLED);
        pool.put(big);
        // The class keeps at most `keep` buffers.
        let many: Vec<_> = (0..10).map(|_| pool.get(4096)).collect();
        for b in many {
            pool.put(b);
        }
        assert_eq!(sync::lock(&pool.classes[0]).len(), 4);
        // And the pool at most POOL_BYTES in all.
        let pool = BufPool::new(1000);
        let big: Vec<_> = (0..5).map(|_| pool.get(16 << 20)).collect();
        for b in big {
            pool.put(b);
        }
        let kept: usize = pool
            .classes
            .iter()
            .map(|c| sync::lock(c).iter().map(|b| b.capacity()).sum::<usize>())
            .sum();
        assert_eq!(kept, POOL_BYTES);
        assert_eq!(pool.cached.load(Ordering::Relaxed), POOL_BYTES);
        let b = pool.get(16 << 20);
        assert_eq!(pool.cached.load(Ordering::Relaxed), POOL_BYTES - (16 << 20));
        drop(b);
    }

    #[test]
    fn aligned_zeroed_and_sized() {
        for len in [0usize, 1, 4095, 4096, 4097, 1 << 20] {
            let mut b = AlignedBuf::zeroed(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_mut_ptr() as usize % ALIGN as usize, 0);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice().fill(7);
            assert!(b.as_slice().iter().all(|&x| x == 7));
        }
    }
}
