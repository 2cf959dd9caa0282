//! Mounting and unmounting, and what a mount runs beside the kernel's
//! requests: the lease keeper and the removal of files that dead mounts
//! left unlinked while open.

use crate::fs::Inner;
use crate::fs::NkFs;
use crate::inodes::Inodes;
use fuser::{MountOption, SessionACL};
use nodekernel_client::{now_ns, Client};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How often the lease keeper renews, as a fraction of the lease: a mount
/// that stalls for up to two thirds of a lease keeps its files.
pub(crate) const RENEWS_PER_LEASE: u32 = 3;

/// The lease keeper's period until the metadata server told the lease.
pub(crate) const RENEW_FALLBACK: Duration = Duration::from_secs(1);

#[derive(Debug, Clone)]
pub struct MountOptions {
    /// The NodeKernel directory (or Table, or Bag) shown at the mount point.
    pub root: String,
    /// Let users other than the one who mounted use the mount.
    pub allow_other: bool,
    /// FUSE worker threads.
    pub threads: usize,
    /// How long the kernel may cache attributes and names.
    pub attr_ttl: Duration,
    /// The mount's session: the files it hides while they are open
    /// (unlinked while open) are bound to it, so they go if the mount
    /// dies (`docs/lifecycle.md`, *Sessions*).
    pub session: Option<nodekernel_client::Session>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            root: "/".into(),
            allow_other: false,
            threads: 4,
            attr_ttl: Duration::from_secs(1),
            session: None,
        }
    }
}

/// A live mount.
pub struct Mounted {
    session: fuser::BackgroundSession,
}

impl Mounted {
    /// Waits until the mount ends (unmounted by [`unmount`] or from
    /// outside): every file still open for writing is closed by then,
    /// publishing what was written.
    pub fn join(self) -> std::io::Result<()> {
        self.session.join()
    }
}

/// Unmounts the file system at `mountpoint`: as root directly, otherwise
/// through `fusermount3 -u`. With `lazy`, detaches it even while files are
/// open there (it ends when the last is closed); without, that is `EBUSY`.
pub fn unmount(mountpoint: &Path, lazy: bool) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    let flags = if lazy { libc::MNT_DETACH } else { 0 };
    // SAFETY: a valid C string.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EPERM) {
        return Err(e);
    }
    // Not root: the set-user-id helper of fuse3 may.
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd.arg(mountpoint).output()?;
    if out.status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&out.stderr);
    Err(if text.contains("busy") {
        std::io::Error::from_raw_os_error(libc::EBUSY)
    } else {
        std::io::Error::other(format!("fusermount3 -u: {}", text.trim()))
    })
}

pub(crate) fn mount(
    client: Client,
    rt: tokio::runtime::Handle,
    mountpoint: &Path,
    opts: MountOptions,
) -> std::io::Result<Mounted> {
    let partitions = client.config().metas.len();
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let fs = NkFs {
        inner: Arc::new(Inner {
            client,
            rt,
            uid,
            gid,
            ttl: opts.attr_ttl,
            partitions,
            mount_id: std::process::id() as u64 ^ now_ns().rotate_left(17),
            lease_ms: AtomicU64::new(0),
            session: opts.session.clone(),
            names: Mutex::new(Inodes::new(&opts.root)),
            files: Mutex::new(HashMap::new()),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
        }),
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName("nodekernel".into()),
        MountOption::Subtype("nk".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    if opts.allow_other {
        config.acl = SessionACL::All;
    }
    config.n_threads = Some(opts.threads.max(1));
    let inner = Arc::downgrade(&fs.inner);
    let rt = fs.inner.rt.clone();
    let session = fuser::Session::new(fs, mountpoint, &config)?.spawn()?;
    rt.spawn(keep_leases(inner.clone()));
    rt.spawn(remove_dead_hidden(inner, opts.root));
    Ok(Mounted { session })
}

/// Renews the mount's write leases while it runs ([`Inner::renew_leases`]),
/// a few times per lease (as long as the metadata servers say it lasts).
pub(crate) async fn keep_leases(fs: Weak<Inner>) {
    loop {
        let Some(inner) = fs.upgrade() else {
            return;
        };
        inner.renew_leases().await;
        let period = match inner.lease().await {
            Some(lease) => lease / RENEWS_PER_LEASE,
            None => RENEW_FALLBACK,
        };
        drop(inner);
        tokio::time::sleep(period.max(Duration::from_millis(10))).await;
    }
}

/// At the start of a mount: removes the files that mounts which died left
/// unlinked while open under `root` (hidden, so no listing shows them and
/// no `rmdir` could remove their directory). One whose lease is still
/// held is tried again once that lease would have run out: a mount
/// killed just now leaves it held for up to a lease.
pub(crate) async fn remove_dead_hidden(fs: Weak<Inner>, root: String) {
    let Some(inner) = fs.upgrade() else {
        return;
    };
    let kept = inner.walk_hidden(&root).await;
    if kept.is_empty() {
        return;
    }
    let wait = inner.lease().await.unwrap_or(RENEW_FALLBACK);
    drop(inner);
    tokio::time::sleep(wait + wait / RENEWS_PER_LEASE).await;
    let Some(inner) = fs.upgrade() else {
        return;
    };
    for p in kept {
        inner.remove_if_dead(&p).await;
    }
}
