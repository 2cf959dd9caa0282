//! `nk mount`: a NodeKernel subtree as a FUSE file system, so unmodified
//! programs (sort, tar, git, sqlite, compilers) keep their temporary files
//! in the cluster (`docs/fuse.md`).
//!
//! The file system is a thin translation over the one Rust client: every
//! operation becomes the client calls a NodeKernel user would make
//! (lookup, create, open for writing, append, overwrite, truncate, sync,
//! rename, remove, set attributes), run on a tokio runtime from the FUSE
//! worker threads. What it adds is what POSIX has and NodeKernel has not:
//!
//! - inode numbers (`inodes.rs`: paths are the identity, kept current
//!   across renames);
//! - one write lease per file for the whole mount, shared by every open
//!   file descriptor of it (NodeKernel allows one writer per node);
//! - writes anywhere: a write past the end appends zeros up to it first
//!   (files have no holes);
//! - a KeyValue (a file in a Table) is only ever replaced whole: opening
//!   one for writing starts a new value (a copy of the old one unless
//!   `O_TRUNC`), which replaces the old one atomically at the last close,
//!   so a reader never sees part of a value;
//! - unlink while open: the file is renamed to a hidden name in its
//!   directory (in the same metadata partition) and removed at its last
//!   close, as NFS clients do.
//!
//! What cannot be mapped fails with the errno `docs/fuse.md` lists, never
//! with a silent success.

mod errno;
mod fs;
mod inodes;
mod kernel;
mod mount;

pub use fs::HIDDEN_PREFIX;
pub use mount::{unmount, MountOptions, Mounted};

use nodekernel_client::Client;
use std::path::Path;

/// Mounts the NodeKernel directory `opts.root` at `mountpoint`, serving it
/// from FUSE worker threads that run `client`'s calls on `rt`. The mount
/// stays until [`unmount`] or an outside unmount (`nk umount`,
/// `fusermount3 -u`); [`Mounted::join`] waits for its end.
pub fn mount(
    client: Client,
    rt: tokio::runtime::Handle,
    mountpoint: &Path,
    opts: MountOptions,
) -> std::io::Result<Mounted> {
    mount::mount(client, rt, mountpoint, opts)
}
