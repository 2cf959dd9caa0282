//! `nk run --bind PATH -- CMD`: runs a command with cluster directories
//! that live exactly as long as it does (`docs/lifecycle.md`, *Sessions*).
//! Each directory is created bound to this process's session; when CMD
//! exits the session is closed and they are removed with everything in
//! them, and if `nk run` itself dies (SIGKILL, a crash, a lost machine)
//! the session's lease lapses and the metadata server removes them.

use anyhow::Context;
use nodekernel_client::{Client, CreateOptions, NodeType};
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

/// The environment variable CMD finds the (first) bound directory in.
pub const BIND_ENV: &str = "NK_BIND";

#[derive(clap::Args)]
pub struct RunArgs {
    /// A directory to create for the command, bound to its run: removed
    /// with everything in it when the command exits or nk run dies (missing
    /// parents are made, and kept). It must not exist. Give it more than
    /// once for several
    #[arg(long, value_name = "PATH", required = true)]
    pub bind: Vec<String>,
    /// How long the directories outlive an nk run that dies without
    /// removing them (the session's lease, renewed a few times per lease
    /// while it runs): 1s to 1h
    #[arg(long, value_name = "DURATION", default_value = "10s",
          value_parser = crate::common::parse_duration)]
    pub lease: Duration,
    /// The command and its arguments (after --)
    #[arg(value_name = "CMD", required = true, num_args = 1.., last = true)]
    pub cmd: Vec<OsString>,
}

/// Runs the command; its exit status is `nk run`'s (128 + the signal
/// that ended it, as a shell reports; 127 when it cannot be started).
pub async fn run(client: &Client, a: &RunArgs) -> anyhow::Result<u8> {
    let paths: Vec<String> = a.bind.iter().map(|p| crate::paths::norm(p)).collect();
    let session = client
        .session(a.lease)
        .await
        .context("cannot open a session")?;
    let made = bind_all(client, &session, &paths).await;
    if let Err(e) = made {
        // Whatever was made goes with the session.
        let _ = session.close().await;
        return Err(e);
    }
    let status = run_child(&a.cmd, &paths[0]).await;
    let closed = session.close().await;
    if let Err(e) = &closed {
        eprintln!(
            "nk run: could not remove {} now ({e}); it goes when the session's lease lapses, within {}",
            paths.join(", "),
            crate::common::short_duration(session.lease().as_millis() as u64)
        );
    }
    status
}

/// Creates each directory bound to `session` (its parents unbound).
async fn bind_all(
    client: &Client,
    session: &nodekernel_client::Session,
    paths: &[String],
) -> anyhow::Result<()> {
    let bound = CreateOptions {
        session: Some(session.clone()),
        ..CreateOptions::default()
    };
    for p in paths {
        let parent = match p.rfind('/') {
            Some(0) | None => "/",
            Some(i) => &p[..i],
        };
        if parent != "/" {
            client
                .mkdir(parent, true)
                .await
                .with_context(|| format!("cannot make {parent}"))?;
        }
        client
            .create(p, NodeType::Directory, bound.clone())
            .await
            .with_context(|| format!("cannot create {p} (nk run makes the directory it binds: give one that does not exist)"))?;
    }
    Ok(())
}

/// Runs `cmd` with [`BIND_ENV`] set, passing on the signals that would
/// end `nk run` (so it outlives the command and removes the directories),
/// and returns its exit status.
async fn run_child(cmd: &[OsString], bound: &str) -> anyhow::Result<u8> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut child = match tokio::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .env(BIND_ENV, bound)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nk run: cannot run {}: {e}", cmd[0].to_string_lossy());
            return Ok(if e.kind() == std::io::ErrorKind::PermissionDenied {
                126
            } else {
                127
            });
        }
    };
    let pid = child.id();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let status = loop {
        let sig = tokio::select! {
            s = child.wait() => break s.context("waiting for the command")?,
            _ = term.recv() => libc::SIGTERM,
            _ = int.recv() => libc::SIGINT,
            _ = hup.recv() => libc::SIGHUP,
        };
        if let Some(pid) = pid {
            // SAFETY: kill with a pid of our own child and a valid signal.
            unsafe { libc::kill(pid as i32, sig) };
        }
    };
    Ok(match (status.code(), status.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        (None, None) => 1,
    })
}
