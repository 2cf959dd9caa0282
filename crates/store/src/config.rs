//! Storage server configuration and its validation.

use crate::StoreError;
use std::path::PathBuf;
use std::time::Duration;

/// Smallest block size a storage server accepts.
pub const MIN_BLOCK_SIZE: u32 = 4 << 10;

/// The medium a storage server exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediumKind {
    /// Anonymous shared memory (a `memfd`), mapped into the server; on a
    /// persistent server, the regular file `dram` in its data directory,
    /// mapped shared (put the directory on `/dev/shm` or another fast file
    /// system).
    Dram,
    /// A file, preallocated to the exported size. On a volatile server its
    /// previous contents are discarded at start, and the file is removed
    /// when the server stops; a persistent server keeps it (see
    /// [`StoreConfig::persistent`]). A relative path is taken under the
    /// server's data directory (see [`StoreConfig::data_dir`]), or the
    /// current directory without one.
    File { path: PathBuf },
}

/// Where a storage server keeps its `LOCK`, its `identity` and, by default,
/// its block file (see [`datadir`](crate::datadir)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DataDirConfig {
    /// No data directory: the server gets a random identity at every start,
    /// and a file medium's block file must be named by its path.
    #[default]
    None,
    /// This directory, created (mode 0700) if missing and kept when the
    /// server stops (its block file is removed).
    At(PathBuf),
    /// A fresh private directory made at start
    /// (`<temp dir>/nodekernel-<uid>/store-<pid>-<random>`) and removed
    /// entirely when the server stops.
    Private,
}

impl MediumKind {
    /// The medium name sent to metadata servers (`"dram"` or `"file"`).
    pub fn name(&self) -> &'static str {
        match self {
            MediumKind::Dram => "dram",
            MediumKind::File { .. } => "file",
        }
    }
}

/// How a file medium does its I/O (see [`FileMedium`](crate::FileMedium)).
///
/// The defaults take the fastest path the machine allows; the switches exist
/// to force the fallbacks (tests, benchmarks, or a file system that accepts
/// `O_DIRECT` but performs badly with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileIoConfig {
    /// Open the block file with `O_DIRECT` (bypassing the page cache) where
    /// the file system allows it; buffered I/O otherwise. Default `true`.
    pub direct: bool,
    /// Use io_uring where the kernel allows it; a pool of `pread`/`pwrite`
    /// threads otherwise. Default `true`.
    pub io_uring: bool,
    /// Most I/Os in flight at once (io_uring), and the size of the fallback
    /// thread pool (capped at 16). `1..=4096`, default 64.
    pub queue_depth: u32,
    /// With `O_DIRECT`: read ranges of [`STREAM_READ_MIN`](crate::file::STREAM_READ_MIN)
    /// bytes or more through the page cache with `RWF_DONTCACHE` (the
    /// kernel reads ahead; the pages are dropped once read), where the
    /// kernel and file system support it. Default `true`.
    pub stream_reads: bool,
}

/// Largest accepted [`FileIoConfig::queue_depth`].
pub const MAX_QUEUE_DEPTH: u32 = 4096;

impl Default for FileIoConfig {
    fn default() -> Self {
        FileIoConfig {
            direct: true,
            io_uring: true,
            queue_depth: 64,
            stream_reads: true,
        }
    }
}

impl FileIoConfig {
    /// Checks the queue depth.
    pub fn validate(&self) -> Result<(), StoreError> {
        if !(1..=MAX_QUEUE_DEPTH).contains(&self.queue_depth) {
            return Err(StoreError::config(
                "queue_depth",
                format!(
                    "must be between 1 and {MAX_QUEUE_DEPTH}, got {}",
                    self.queue_depth
                ),
            ));
        }
        Ok(())
    }
}

/// Everything a storage server needs to start.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Address to bind the data port to, e.g. `"127.0.0.1:0"` (port 0 picks
    /// a free port).
    pub listen: String,
    /// Address to register with; defaults to the bound address. Set it when
    /// binding a wildcard address such as `0.0.0.0`.
    pub advertise: Option<String>,
    /// Metadata server addresses, in partition order. May be empty (then the
    /// server registers nowhere; used by tests).
    pub metas: Vec<String>,
    /// Storage class priority, 0 = fastest.
    pub class: u8,
    /// Name of the storage class, e.g. `"dram"` or `"file"`.
    pub class_name: String,
    pub medium: MediumKind,
    /// The server's data directory. Default [`DataDirConfig::None`].
    pub data_dir: DataDirConfig,
    /// Bytes to export; the server exports `capacity / block_size` whole
    /// blocks (at least one).
    pub capacity: u64,
    /// Block size: a power of two in
    /// `MIN_BLOCK_SIZE..=nodekernel_proto::MAX_BLOCK_SIZE`.
    pub block_size: u32,
    /// Location class (the host name by default; callers fill it).
    pub location: String,
    /// Time between heartbeats to each metadata server.
    pub heartbeat_interval: Duration,
    /// Bound on each metadata call, and roughly how long start-up keeps
    /// retrying an unreachable metadata server.
    pub rpc_timeout: Duration,
    /// DRAM only: hand the memory to co-located clients (same host and
    /// network namespace, same user) over an abstract Unix socket, so they
    /// read and write blocks with memory copies. Default `true`.
    pub shared_memory: bool,
    /// How long an idle connection busy-polls for the next request before
    /// parking (0 disables spinning).
    pub poll_spin: Duration,
    /// Keep the blocks (and their generations) across a restart of the
    /// server's process, in its data directory, which must then be
    /// [`DataDirConfig::At`]: a file medium keeps its block file and a
    /// `gens` file, a DRAM medium is a regular file (`dram`) mapped
    /// shared instead of a memfd. See [`persist`](crate::persist) for the
    /// files and the rule deciding at start whether the blocks are kept.
    /// Default `false`: every start begins empty, as a volatile server.
    pub persistent: bool,
    /// Address of the admin HTTP endpoint (`/metrics`, `/status`,
    /// `/healthz`, `/readyz`, a dashboard); `None` (the default): none.
    pub admin: Option<String>,
    /// Follow a memory source between a minimum and `capacity` (dynamic
    /// capacity, [`crate::capacity`]); `None` (the default): export
    /// `capacity` unless resized.
    pub dynamic: Option<crate::capacity::DynamicCapacity>,
    /// Who may connect: the cluster token every connection (in and out)
    /// proves, and the local users of its shared memory. Default: no
    /// token, the server's own user.
    pub security: nodekernel_rpc::Security,
}

impl Default for StoreConfig {
    /// A 64 MiB DRAM server with 1 MiB blocks on a free local port,
    /// registering nowhere.
    fn default() -> Self {
        StoreConfig {
            listen: "127.0.0.1:0".into(),
            advertise: None,
            metas: Vec::new(),
            class: 0,
            class_name: "dram".into(),
            medium: MediumKind::Dram,
            data_dir: DataDirConfig::None,
            capacity: 64 << 20,
            block_size: nodekernel_proto::DEFAULT_BLOCK_SIZE,
            location: "localhost".into(),
            heartbeat_interval: Duration::from_secs(1),
            rpc_timeout: Duration::from_secs(5),
            shared_memory: true,
            poll_spin: nodekernel_rpc::default_spin(),
            persistent: false,
            admin: None,
            dynamic: None,
            security: Default::default(),
        }
    }
}

impl StoreConfig {
    /// Checks every field and returns the number of exported blocks.
    pub fn validate(&self) -> Result<u32, StoreError> {
        let bs = self.block_size;
        if !bs.is_power_of_two() {
            return Err(StoreError::config(
                "block_size",
                format!("must be a power of two, got {bs}"),
            ));
        }
        if !(MIN_BLOCK_SIZE..=nodekernel_proto::MAX_BLOCK_SIZE).contains(&bs) {
            return Err(StoreError::config(
                "block_size",
                format!(
                    "must be between {MIN_BLOCK_SIZE} and {} bytes, got {bs}",
                    nodekernel_proto::MAX_BLOCK_SIZE
                ),
            ));
        }
        if self.capacity < u64::from(bs) {
            return Err(StoreError::config(
                "capacity",
                format!(
                    "must hold at least one block of {bs} bytes, got {} bytes",
                    self.capacity
                ),
            ));
        }
        let blocks = self.capacity / u64::from(bs);
        let blocks = u32::try_from(blocks).map_err(|_| {
            StoreError::config(
                "capacity",
                format!(
                    "{} bytes is {blocks} blocks of {bs} bytes, more than the {} blocks one server can export",
                    self.capacity,
                    u32::MAX
                ),
            )
        })?;
        if usize::try_from(u64::from(blocks) * u64::from(bs)).is_err() {
            return Err(StoreError::config(
                "capacity",
                format!(
                    "{} bytes does not fit in this machine's address space",
                    self.capacity
                ),
            ));
        }
        if self.heartbeat_interval.is_zero() {
            return Err(StoreError::config(
                "heartbeat_interval",
                "must be greater than zero",
            ));
        }
        if self.rpc_timeout.is_zero() {
            return Err(StoreError::config(
                "rpc_timeout",
                "must be greater than zero",
            ));
        }
        if self.listen.is_empty() {
            return Err(StoreError::config(
                "listen",
                "must be an address such as 127.0.0.1:0",
            ));
        }
        if self.metas.len() > blocks as usize {
            return Err(StoreError::config(
                "metas",
                format!(
                    "{} metadata servers cannot each get a share of only {blocks} blocks",
                    self.metas.len()
                ),
            ));
        }
        if let MediumKind::File { path } = &self.medium {
            if path.as_os_str().is_empty() {
                return Err(StoreError::config("medium", "file path must not be empty"));
            }
        }
        if let DataDirConfig::At(dir) = &self.data_dir {
            if dir.as_os_str().is_empty() {
                return Err(StoreError::config("data_dir", "must not be empty"));
            }
        }
        if self.persistent && !matches!(self.data_dir, DataDirConfig::At(_)) {
            return Err(StoreError::config(
                "persistent",
                "needs a data directory that outlives the server (data_dir = a path); \
                 the blocks are kept there",
            ));
        }
        Ok(blocks)
    }

    /// Bytes actually exported: the whole blocks that fit in `capacity`.
    pub(crate) fn exported_bytes(&self, blocks: u32) -> u64 {
        u64::from(blocks) * u64::from(self.block_size)
    }
}

/// The blocks partition `i` of `k` gets out of `n`: `[i*n/k, (i+1)*n/k)`,
/// returned as `(first_block, num_blocks)`.
pub(crate) fn partition(n: u32, k: usize, i: usize) -> (u32, u32) {
    let (n, k, i) = (u64::from(n), k as u64, i as u64);
    let first = i * n / k;
    let end = (i + 1) * n / k;
    (first as u32, (end - first) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(e: StoreError) -> &'static str {
        match e {
            StoreError::Config { field, .. } => field,
            other => panic!("expected a config error, got {other}"),
        }
    }

    #[test]
    fn default_is_valid() {
        assert_eq!(StoreConfig::default().validate().unwrap(), 64);
    }

    #[test]
    fn bad_fields_are_named() {
        let base = StoreConfig::default();
        let cases: Vec<(StoreConfig, &str)> = vec![
            (
                StoreConfig {
                    block_size: 3 << 12,
                    ..base.clone()
                },
                "block_size",
            ),
            (
                StoreConfig {
                    block_size: 2048,
                    ..base.clone()
                },
                "block_size",
            ),
            (
                StoreConfig {
                    block_size: 32 << 20,
                    ..base.clone()
                },
                "block_size",
            ),
            (
                StoreConfig {
                    block_size: 0,
                    ..base.clone()
                },
                "block_size",
            ),
            (
                StoreConfig {
                    capacity: (1 << 20) - 1,
                    ..base.clone()
                },
                "capacity",
            ),
            (
                StoreConfig {
                    capacity: 0,
                    ..base.clone()
                },
                "capacity",
            ),
            (
                StoreConfig {
                    capacity: (u64::from(u32::MAX) + 1) * 4096,
                    block_size: 4096,
                    ..base.clone()
                },
                "capacity",
            ),
            (
                StoreConfig {
                    heartbeat_interval: Duration::ZERO,
                    ..base.clone()
                },
                "heartbeat_interval",
            ),
            (
                StoreConfig {
                    rpc_timeout: Duration::ZERO,
                    ..base.clone()
                },
                "rpc_timeout",
            ),
            (
                StoreConfig {
                    listen: String::new(),
                    ..base.clone()
                },
                "listen",
            ),
            (
                StoreConfig {
                    capacity: 1 << 20,
                    metas: vec!["a:1".into(), "b:1".into()],
                    ..base.clone()
                },
                "metas",
            ),
            (
                StoreConfig {
                    medium: MediumKind::File {
                        path: PathBuf::new(),
                    },
                    ..base.clone()
                },
                "medium",
            ),
            (
                StoreConfig {
                    data_dir: DataDirConfig::At(PathBuf::new()),
                    ..base.clone()
                },
                "data_dir",
            ),
            (
                StoreConfig {
                    persistent: true,
                    ..base.clone()
                },
                "persistent",
            ),
            (
                StoreConfig {
                    persistent: true,
                    data_dir: DataDirConfig::Private,
                    ..base.clone()
                },
                "persistent",
            ),
        ];
        let kept = StoreConfig {
            persistent: true,
            data_dir: DataDirConfig::At("/some/dir".into()),
            ..base.clone()
        };
        assert!(kept.validate().is_ok(), "persistent with a data directory");
        for (cfg, field) in cases {
            let err = cfg.validate().unwrap_err();
            let text = err.to_string();
            assert!(text.contains(field), "{text:?} names {field}");
            assert_eq!(field_of(err), field);
        }
    }

    #[test]
    fn file_io_queue_depth_is_checked() {
        assert!(FileIoConfig::default().validate().is_ok());
        for bad in [0, MAX_QUEUE_DEPTH + 1] {
            let c = FileIoConfig {
                queue_depth: bad,
                ..FileIoConfig::default()
            };
            assert_eq!(field_of(c.validate().unwrap_err()), "queue_depth");
        }
    }

    #[test]
    fn partial_blocks_are_not_exported() {
        let cfg = StoreConfig {
            capacity: (3 << 20) + 17,
            ..StoreConfig::default()
        };
        assert_eq!(cfg.validate().unwrap(), 3);
        assert_eq!(cfg.exported_bytes(3), 3 << 20);
    }

    #[test]
    fn partitions_are_contiguous_disjoint_and_complete() {
        for n in [1u32, 2, 3, 10, 64, 1000, u32::MAX] {
            for k in 1..=5usize.min(n as usize) {
                let mut next = 0u64;
                for i in 0..k {
                    let (first, count) = partition(n, k, i);
                    assert_eq!(u64::from(first), next, "n={n} k={k} i={i}");
                    assert!(count >= 1 || n < k as u32);
                    next += u64::from(count);
                }
                assert_eq!(next, u64::from(n));
            }
        }
        assert_eq!(partition(10, 3, 0), (0, 3));
        assert_eq!(partition(10, 3, 1), (3, 3));
        assert_eq!(partition(10, 3, 2), (6, 4));
    }
}
