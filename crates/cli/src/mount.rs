//! `nk mount` and `nk umount`: a NodeKernel directory as a FUSE file
//! system (`docs/fuse.md`).

use anyhow::Context;
use nodekernel_client::{Client, ClientConfig};
use std::io::{BufRead, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The descriptor a background mount reports on (to the `nk mount` that
/// started it): `ready` once mounted, or the error.
const NOTIFY_FD: i32 = 3;
const NOTIFY_ENV: &str = "NK_MOUNT_NOTIFY";

#[derive(clap::Args)]
pub struct MountArgs {
    /// An existing empty directory to mount on
    pub mountpoint: PathBuf,
    /// The NodeKernel directory (or Table, or Bag) to show there
    #[arg(long, default_value = "/")]
    pub root: String,
    /// Stay in the foreground (logs go to stderr); Ctrl-C or SIGTERM
    /// unmounts. Without it, `nk mount` returns once the mount is ready and
    /// the file system runs in the background
    #[arg(long)]
    pub foreground: bool,
    /// Let other users use the mount (needs root, or user_allow_other in
    /// /etc/fuse.conf)
    #[arg(long)]
    pub allow_other: bool,
    /// Threads reading FUSE requests (reads and writes run on them, other
    /// requests on the async runtime)
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// How long (milliseconds) the kernel may cache names and attributes;
    /// changes made by other clients show up after at most this long
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    pub attr_ttl_ms: u64,
    /// Where a background mount writes its log (default: nowhere)
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
    /// How long files unlinked while open outlive a mount that dies
    /// (killed, its machine lost): the lease of the mount's session
    /// (`docs/lifecycle.md`), 1s to 1h
    #[arg(long, value_name = "DURATION", default_value = "10s",
          value_parser = crate::common::parse_duration)]
    pub lease: Duration,
}

#[derive(clap::Args)]
pub struct UmountArgs {
    /// Where the file system is mounted
    pub mountpoint: PathBuf,
    /// Detach at once even while files are open (they keep working; the
    /// file system ends when the last is closed)
    #[arg(long)]
    pub lazy: bool,
}

/// `nk mount`: in the foreground, mounts and serves until unmounted or
/// signalled; otherwise starts itself in the background and waits until
/// that mount is ready (or failed).
pub async fn mount(cfg: ClientConfig, a: &MountArgs) -> anyhow::Result<()> {
    check_mountpoint(&a.mountpoint)?;
    if !a.foreground {
        return spawn_background(a);
    }
    let notify = notify_channel();
    match serve(cfg, a, notify.as_ref()).await {
        Ok(()) => Ok(()),
        Err(e) => {
            if let Some(mut n) = notify {
                let _ = writeln!(n, "error: {}", crate::common::error_text(e.chain()));
            }
            Err(e)
        }
    }
}

fn check_mountpoint(p: &Path) -> anyhow::Result<()> {
    let md = std::fs::metadata(p).with_context(|| format!("mount point {}", p.display()))?;
    if !md.is_dir() {
        return Err(crate::common::coded(
            crate::common::Code::Wire(nodekernel_client::ErrorCode::TypeMismatch),
            format!("mount point {} is not a directory", p.display()),
        ));
    }
    Ok(())
}

/// The pipe to the `nk mount` that started this one in the background.
fn notify_channel() -> Option<std::fs::File> {
    std::env::var_os(NOTIFY_ENV)?;
    // SAFETY: the parent set NOTIFY_ENV only after putting the pipe's
    // write end at NOTIFY_FD, which nothing else here owns.
    Some(unsafe { std::fs::File::from_raw_fd(NOTIFY_FD) })
}

async fn serve(
    cfg: ClientConfig,
    a: &MountArgs,
    notify: Option<&std::fs::File>,
) -> anyhow::Result<()> {
    let client = Client::connect(cfg).await?;
    let root = crate::paths::norm(&a.root);
    let node = client
        .lookup(&root)
        .await
        .with_context(|| format!("cannot mount {root}"))?;
    if !node.info().ty.is_container() {
        return Err(crate::fs::not_a(
            &format!("cannot mount {root}: it"),
            node.info().ty,
            "Directory, Table or Bag",
        ));
    }
    // Without a session (a metadata server that refuses one), hidden
    // files of a mount that dies wait for the next mount or an rmdir.
    let session = match client.session(a.lease).await {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("no session for the mount ({e}): files unlinked while open outlive a mount that dies");
            None
        }
    };
    let opts = nodekernel_fuse::MountOptions {
        root: root.clone(),
        allow_other: a.allow_other,
        threads: a.threads,
        attr_ttl: Duration::from_millis(a.attr_ttl_ms),
        session,
    };
    let mp = a.mountpoint.clone();
    let rt = tokio::runtime::Handle::current();
    let mounted =
        tokio::task::spawn_blocking(move || nodekernel_fuse::mount(client, rt, &mp, opts))
            .await?
            .with_context(|| format!("cannot mount on {}", a.mountpoint.display()))?;
    tracing::info!("mounted {root} at {}", a.mountpoint.display());
    match notify {
        Some(mut n) => {
            let _ = writeln!(n, "ready");
        }
        None => {
            println!(
                "mounted {root} at {} (Ctrl-C or SIGTERM unmounts)",
                a.mountpoint.display()
            );
            let _ = std::io::stdout().flush();
        }
    }
    let mut ended = tokio::task::spawn_blocking(move || mounted.join());
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = &mut ended => return Ok(r??),
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("unmounting {}", a.mountpoint.display());
    if let Err(e) = nodekernel_fuse::unmount(&a.mountpoint, false) {
        if e.raw_os_error() != Some(libc::EBUSY) {
            return Err(e).context("unmounting");
        }
        eprintln!(
            "nk: {} is busy (files are open there): detaching it; the file system ends when the last is closed",
            a.mountpoint.display()
        );
        nodekernel_fuse::unmount(&a.mountpoint, true).context("detaching")?;
    }
    Ok(ended.await??)
}

/// Starts `nk mount --foreground` as a daemon and waits for its word.
fn spawn_background(a: &MountArgs) -> anyhow::Result<()> {
    let (mut rx, tx) = std::io::pipe().context("creating a pipe")?;
    let exe = std::env::current_exe().context("finding the nk binary")?;
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    args.push("--foreground".into());
    let log = match &a.log {
        Some(p) => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .with_context(|| format!("opening the log file {}", p.display()))?
            .into(),
        None => std::process::Stdio::null(),
    };
    let tx_fd = tx.as_raw_fd();
    let mut cmd = std::process::Command::new(exe);
    cmd.args(&args)
        .env(NOTIFY_ENV, "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(tx_fd, NOTIFY_FD) < 0 || libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .context("starting the mount in the background")?;
    drop(tx);
    drop(cmd);
    // One line: the daemon keeps its end open while it runs.
    let mut word = String::new();
    std::io::BufReader::new(&mut rx)
        .read_line(&mut word)
        .context("waiting for the mount")?;
    match word.trim_end() {
        "ready" => {
            println!(
                "mounted {} at {} (pid {}; `nk umount {}` unmounts)",
                crate::paths::norm(&a.root),
                a.mountpoint.display(),
                child.id(),
                a.mountpoint.display()
            );
            Ok(())
        }
        w => match w.strip_prefix("error: ") {
            Some(e) => Err(crate::common::coded(crate::common::Code::Io, e.to_string())),
            None => Err(crate::common::coded(
                crate::common::Code::Io,
                "the mount process exited before the mount was ready",
            )),
        },
    }
}

/// `nk umount`.
pub fn umount(mountpoint: &Path, lazy: bool) -> anyhow::Result<()> {
    match nodekernel_fuse::unmount(mountpoint, lazy) {
        Ok(()) => Ok(()),
        Err(e) => match e.raw_os_error() {
            Some(libc::EBUSY) => Err(crate::common::coded(
                crate::common::Code::Wire(nodekernel_client::ErrorCode::Busy),
                format!(
                    "{} is busy: files are open there (close them, or use --lazy)",
                    mountpoint.display()
                ),
            )),
            Some(libc::EINVAL) => Err(crate::common::invalid(format!(
                "{} is not a mount point",
                mountpoint.display()
            ))),
            _ => Err(e).with_context(|| format!("unmounting {}", mountpoint.display())),
        },
    }
}
