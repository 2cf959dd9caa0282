//! Dynamic capacity: a storage server exports less (or again more) of its
//! memory at runtime, asked by `nk store resize` (`StoreRequest::Resize`)
//! or, with [`DynamicCapacity`], following the host's available memory
//! between bounds, as Nswap2L-FS's network RAM does.
//!
//! The server only decides how many blocks each metadata partition's slice
//! should export and tells that partition at every heartbeat
//! (`MetaRequest::Resize`); the metadata server withdraws free blocks at
//! once and moves blocks in use away first, so shrinking never loses data.
//! The size decided here is the target; `nk status` shows what is exported.

use nodekernel_proto::sync;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// How much memory a store may export now.
pub trait MemorySource: Debug + Send + Sync {
    /// Bytes the server may export, given that it exports `exported` now
    /// (memory it already uses counts as available to it).
    fn budget(&self, exported: u64) -> u64;
}

/// The host's memory: `MemAvailable` of `/proc/meminfo` plus what the
/// server exports, less `reserve` left to everything else.
#[derive(Debug, Clone, Copy)]
pub struct HostMemory {
    pub reserve: u64,
}

impl HostMemory {
    /// `MemAvailable` in bytes, if the kernel reports it.
    pub fn available() -> Option<u64> {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        kib.checked_mul(1024)
    }
}

impl MemorySource for HostMemory {
    fn budget(&self, exported: u64) -> u64 {
        match HostMemory::available() {
            Some(a) => a.saturating_add(exported).saturating_sub(self.reserve),
            // Unknown: keep what is exported.
            None => exported,
        }
    }
}

/// Follow a [`MemorySource`] between `min` bytes and the server's size.
#[derive(Debug, Clone)]
pub struct DynamicCapacity {
    pub min: u64,
    pub source: Arc<dyn MemorySource>,
}

/// Blocks partition `i` exports when the server exports `target` of its
/// `total` blocks: its share, rounded down (the slices are in `slices`).
pub fn share(slices: &[u32], i: usize, target: u64) -> u32 {
    let total: u64 = slices.iter().map(|s| u64::from(*s)).sum();
    let slice = u64::from(slices.get(i).copied().unwrap_or(0));
    if total == 0 || target >= total {
        return slice as u32;
    }
    (slice * target / total) as u32
}

/// The server's capacity target, shared by the data port (which sets it)
/// and the heartbeats (which tell the metadata servers).
#[derive(Debug)]
pub(crate) struct Capacity {
    block_size: u64,
    /// Blocks in each metadata partition's slice.
    slices: Vec<u32>,
    /// Target in blocks of the whole server; `u64::MAX`: all of them.
    target: AtomicU64,
    dynamic: Option<DynamicCapacity>,
    /// What each partition was last told, to log changes once.
    told: Mutex<Vec<Option<u32>>>,
}

impl Capacity {
    pub(crate) fn new(block_size: u32, slices: Vec<u32>, dynamic: Option<DynamicCapacity>) -> Self {
        let n = slices.len();
        Capacity {
            block_size: u64::from(block_size),
            slices,
            target: AtomicU64::new(u64::MAX),
            dynamic,
            told: Mutex::new(vec![None; n]),
        }
    }

    fn max_blocks(&self) -> u64 {
        self.slices.iter().map(|s| u64::from(*s)).sum()
    }

    /// Exports `bytes` from now on (clamped to the server's size); returns
    /// the bytes that exports: whole blocks of each partition's share.
    pub(crate) fn set(&self, bytes: u64) -> u64 {
        let blocks = (bytes / self.block_size).min(self.max_blocks());
        self.target.store(blocks, Ordering::Relaxed);
        self.exported_bytes()
    }

    /// The bytes the current target exports.
    pub(crate) fn exported_bytes(&self) -> u64 {
        let t = self.target.load(Ordering::Relaxed);
        (0..self.slices.len())
            .map(|i| u64::from(share(&self.slices, i, t)))
            .sum::<u64>()
            * self.block_size
    }

    /// With dynamic capacity, moves the target to the memory source's
    /// budget (between the bounds); a change of less than one block per
    /// partition is ignored.
    pub(crate) fn follow(&self) {
        let Some(d) = &self.dynamic else { return };
        let max = self.max_blocks() * self.block_size;
        let want = d
            .source
            .budget(self.exported_bytes())
            .clamp(d.min.min(max), max);
        let step = self.block_size * self.slices.len().max(1) as u64;
        if want.abs_diff(self.exported_bytes()) >= step {
            self.set(want);
        }
    }

    /// The blocks partition `i` should export, when a target is set, and
    /// whether that is news to it (for the log).
    pub(crate) fn for_partition(&self, i: usize) -> Option<(u32, bool)> {
        let t = self.target.load(Ordering::Relaxed);
        if t == u64::MAX {
            return None;
        }
        let blocks = share(&self.slices, i, t);
        let mut told = sync::lock(&self.told);
        let news = told.get(i).copied().flatten() != Some(blocks);
        if let Some(x) = told.get_mut(i) {
            *x = Some(blocks);
        }
        Some((blocks, news))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_proportional_and_never_exceed_a_slice() {
        let slices = [100, 50, 50];
        assert_eq!(share(&slices, 0, 100), 50);
        assert_eq!(share(&slices, 1, 100), 25);
        assert_eq!(share(&slices, 2, 1000), 50);
        assert_eq!(share(&slices, 1, 0), 0);
        assert_eq!(share(&slices, 3, 10), 0, "no such partition");
        for t in 0..=200 {
            let sum: u64 = (0..3).map(|i| u64::from(share(&slices, i, t))).sum();
            assert!(sum <= t, "{t}: {sum}");
            assert!(t - sum < 3, "rounding loses less than a block each");
        }
    }

    #[derive(Debug)]
    struct Fixed(u64);
    impl MemorySource for Fixed {
        fn budget(&self, _: u64) -> u64 {
            self.0
        }
    }

    #[test]
    fn dynamic_capacity_follows_the_source_between_bounds() {
        let bs = 1 << 20;
        let dynamic = |budget| DynamicCapacity {
            min: 4 * bs,
            source: Arc::new(Fixed(budget)),
        };
        let c = Capacity::new(bs as u32, vec![32, 32], Some(dynamic(20 * bs)));
        assert_eq!(c.for_partition(0), None, "no target until one is set");
        c.follow();
        assert_eq!(c.exported_bytes(), 20 * bs);
        assert_eq!(c.for_partition(0), Some((10, true)));
        assert_eq!(c.for_partition(0), Some((10, false)), "told once");
        let low = Capacity::new(bs as u32, vec![32, 32], Some(dynamic(0)));
        low.follow();
        assert_eq!(low.exported_bytes(), 4 * bs, "never below the minimum");
        let high = Capacity::new(bs as u32, vec![32, 32], Some(dynamic(u64::MAX)));
        high.set(8 * bs);
        high.follow();
        assert_eq!(high.exported_bytes(), 64 * bs, "never above the size");
        let manual = Capacity::new(bs as u32, vec![32, 32], None);
        manual.set(10 * bs + 5);
        manual.follow();
        assert_eq!(manual.exported_bytes(), 10 * bs, "whole blocks, no source");
    }
}
