//! Benchmarks of NodeKernel components.
//!
//! [`file_tier`] compares the storage server's file tier
//! ([`BlockStore`](nodekernel_store::BlockStore) over a
//! [`FileMedium`](nodekernel_store::FileMedium), by default io_uring with
//! `O_DIRECT`) with plain buffered `pread`/`pwrite` on the same machine. The
//! `nk-file-bench` binary runs it and prints a Markdown table.

pub mod file_tier;
