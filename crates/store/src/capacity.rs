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

/// The memory this server may use: `MemAvailable` of `/proc/meminfo` or,
/// in a container (a control group with a memory limit, as a Kubernetes
/// pod's), the room left under that limit, whichever is less; plus what
/// the server exports, less `reserve` left to everything else.
#[derive(Debug, Clone, Copy)]
pub struct HostMemory {
    pub reserve: u64,
}

impl HostMemory {
    /// Bytes available to this process, if the kernel reports any: the
    /// host's `MemAvailable`, capped by [`cgroup_room`].
    pub fn available() -> Option<u64> {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let host = read("/proc/meminfo").and_then(|t| mem_available(&t));
        let group = read("/proc/self/cgroup").and_then(|t| cgroup_room(&t, &read));
        match (host, group) {
            (Some(h), Some(g)) => Some(h.min(g)),
            (h, g) => h.or(g),
        }
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The room under the memory limit of the control group that
/// `proc_self_cgroup` (the text of `/proc/self/cgroup`) names, read
/// through `read` (a path to its text): the limit less the group's working
/// set (what it uses, less the inactive file cache the kernel reclaims
/// first, as the kubelet counts it). cgroup v2 (`memory.max`,
/// `memory.current`) or v1 (the `memory` controller's
/// `memory.limit_in_bytes`, `memory.usage_in_bytes`); `None` without a
/// limit. Inside a container the group's path may not exist in its own
/// view of `/sys/fs/cgroup`, whose root is then the container's group.
pub fn cgroup_room(proc_self_cgroup: &str, read: &dyn Fn(&str) -> Option<String>) -> Option<u64> {
    let number = |text: Option<String>| text?.trim().parse::<u64>().ok();
    let stat = |text: Option<String>, key: &str| {
        text?.lines().find_map(|l| {
            l.strip_prefix(key)?
                .strip_prefix(' ')?
                .trim()
                .parse::<u64>()
                .ok()
        })
    };
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (root, limit, usage, inactive) = if controllers.is_empty() {
            (
                "/sys/fs/cgroup",
                "memory.max",
                "memory.current",
                "inactive_file",
            )
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                "/sys/fs/cgroup/memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                "total_inactive_file",
            )
        } else {
            continue;
        };
        let path = path.trim_end_matches('/');
        let dirs = [format!("{root}{path}"), root.to_string()];
        for dir in dirs {
            // "max" (v2) or a page-rounded 2^63 (v1): no limit.
            let Some(max) = number(read(&format!("{dir}/{limit}"))) else {
                continue;
            };
            if max >= 1 << 62 {
                return None;
            }
            let used = number(read(&format!("{dir}/{usage}")))?;
            let cache = stat(read(&format!("{dir}/memory.stat")), inactive).unwrap_or(0);
            return Some(max.saturating_sub(used.saturating_sub(cache)));
        }
    }
    None
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

    #[test]
    fn a_containers_memory_limit_caps_what_is_available() {
        use std::collections::HashMap;
        let files = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let room = |cgroup: &str, fs: &HashMap<String, String>| {
            cgroup_room(cgroup, &|p: &str| fs.get(p).cloned())
        };
        // cgroup v2, the pod's own view (its group is the root).
        let v2 = files(&[
            ("/sys/fs/cgroup/memory.max", "4294967296\n"),
            ("/sys/fs/cgroup/memory.current", "1073741824\n"),
            (
                "/sys/fs/cgroup/memory.stat",
                "anon 1\ninactive_file 268435456\nactive_file 5\n",
            ),
        ]);
        assert_eq!(
            room("0::/\n", &v2),
            Some((4 << 30) - (1 << 30) + (256 << 20))
        );
        // A path the container's view does not have: its root is the group.
        assert_eq!(
            room("0::/kubepods/pod1/abc\n", &v2),
            Some((3 << 30) + (256 << 20))
        );
        // No limit.
        let open = files(&[("/sys/fs/cgroup/memory.max", "max\n")]);
        assert_eq!(room("0::/\n", &open), None);
        // cgroup v1, hybrid: the memory controller's line, under its path.
        let v1 = files(&[
            (
                "/sys/fs/cgroup/memory/pod/memory.limit_in_bytes",
                "2147483648\n",
            ),
            (
                "/sys/fs/cgroup/memory/pod/memory.usage_in_bytes",
                "2415919104\n",
            ),
            (
                "/sys/fs/cgroup/memory/pod/memory.stat",
                "cache 9\ntotal_inactive_file 536870912\n",
            ),
        ]);
        let hybrid = "9:name=systemd:/\n4:memory:/pod\n3:cpuset:/\n0::/\n";
        assert_eq!(room(hybrid, &v1), Some((2048 + 512 - 2304) << 20));
        let unlimited = files(&[(
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "9223372036854771712\n",
        )]);
        assert_eq!(room("4:memory:/\n", &unlimited), None);
        // Over the limit: no room, not an underflow; nothing readable: None.
        let over = files(&[
            ("/sys/fs/cgroup/memory.max", "100\n"),
            ("/sys/fs/cgroup/memory.current", "200\n"),
        ]);
        assert_eq!(room("0::/\n", &over), Some(0));
        assert_eq!(room("0::/\n", &HashMap::new()), None);
        assert_eq!(room("garbage", &v2), None);
        assert_eq!(
            mem_available("MemTotal: 10 kB\nMemAvailable:    2048 kB\n"),
            Some(2 << 20)
        );
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
