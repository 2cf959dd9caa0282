//! `nk snapshot PATH DIR` and `nk restore DIR PATH` (`docs/snapshots.md`).

use crate::paths::norm;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use nodekernel_client::snapshot::{Phase, Progress, RestoreOptions, SnapshotOptions};
use nodekernel_client::Client;
use nodekernel_cluster::human;
use nodekernel_proto::sync;
use std::io::IsTerminal;
use std::path::Path;
use std::time::Instant;

/// A progress bar on stderr when it is a terminal (hidden otherwise): bytes,
/// with the nodes done in the message.
struct Bar {
    pb: ProgressBar,
    nodes: std::sync::atomic::AtomicU64,
    total_nodes: std::sync::atomic::AtomicU64,
    phase: std::sync::Mutex<&'static str>,
}

impl Bar {
    fn new() -> Bar {
        let pb = if std::io::stderr().is_terminal() {
            let pb = ProgressBar::new(0);
            pb.set_draw_target(ProgressDrawTarget::stderr());
            pb.set_style(
                ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .expect("static template")
                .progress_chars("=> "),
            );
            pb
        } else {
            ProgressBar::hidden()
        };
        Bar {
            pb,
            nodes: Default::default(),
            total_nodes: Default::default(),
            phase: std::sync::Mutex::new(""),
        }
    }

    fn message(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let phase = *sync::lock(&self.phase);
        self.pb.set_message(format!(
            "{phase} {}/{} nodes",
            self.nodes.load(Relaxed),
            self.total_nodes.load(Relaxed)
        ));
    }
}

impl Progress for Bar {
    fn phase(&self, phase: Phase, nodes: u64, bytes: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        *sync::lock(&self.phase) = match phase {
            Phase::Reading => "reading",
            Phase::Verifying => "verifying",
            Phase::Writing => "writing",
        };
        self.nodes.store(0, Relaxed);
        self.total_nodes.store(nodes, Relaxed);
        self.pb.set_length(bytes);
        self.pb.set_position(0);
        self.pb.reset_eta();
        self.message();
    }

    fn advance(&self, nodes: u64, bytes: u64) {
        if nodes > 0 {
            self.nodes
                .fetch_add(nodes, std::sync::atomic::Ordering::Relaxed);
            self.message();
        }
        self.pb.inc(bytes);
    }
}

/// A summary as JSON, with the seconds the work took.
fn print_json(summary: &impl serde::Serialize, secs: f64) -> anyhow::Result<()> {
    let mut v = serde_json::to_value(summary)?;
    v["seconds"] = serde_json::json!(secs);
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

pub async fn snapshot(client: &Client, path: &str, dir: &Path, json: bool) -> anyhow::Result<()> {
    let bar = Bar::new();
    let start = Instant::now();
    let r = client
        .snapshot(&norm(path), dir, &SnapshotOptions::default(), &bar)
        .await;
    bar.pb.finish_and_clear();
    let s = r?;
    let secs = start.elapsed().as_secs_f64();
    if json {
        print_json(&s, secs)?;
    } else {
        println!(
            "snapshot of {} in {}: {}, {} in {} pack file(s), {secs:.2} s",
            s.path,
            s.dir,
            s.counts,
            human(s.counts.bytes),
            s.packs,
        );
    }
    Ok(())
}

pub async fn restore(
    client: &Client,
    dir: &Path,
    path: &str,
    force: bool,
    json: bool,
) -> anyhow::Result<()> {
    let bar = Bar::new();
    let start = Instant::now();
    let opts = RestoreOptions {
        overwrite: force,
        ..RestoreOptions::default()
    };
    let r = client.restore(dir, &norm(path), &opts, &bar).await;
    bar.pb.finish_and_clear();
    let s = r?;
    let secs = start.elapsed().as_secs_f64();
    if json {
        print_json(&s, secs)?;
    } else {
        println!(
            "restored {} to {}: {}, {}, {secs:.2} s",
            s.dir,
            s.path,
            s.counts,
            human(s.counts.bytes),
        );
    }
    Ok(())
}
