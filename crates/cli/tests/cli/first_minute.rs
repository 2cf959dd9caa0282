//! The first minute of a newcomer (`docs/deployment.md`, *Start order and readiness*):
//! the README's quick start runs as written, a command that arrives
//! while the cluster starts waits for it (bounded, saying so), and
//! `nk meta --meta A,B` takes its partition from its place in the list.

use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{nk, start_role, Proc};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A port nothing listens on (free a moment ago).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A client config file whose timeout (the bound of a wait for a
/// starting cluster) is `ms`.
fn timeout_config(dir: &std::path::Path, ms: u64) -> std::path::PathBuf {
    let path = dir.join(format!("client-{ms}.toml"));
    std::fs::write(&path, format!("[client]\ntimeout_ms = {ms}\n")).unwrap();
    path
}

/// `nk args` as a client of `meta` with the config file `config`.
fn client(meta: &str, config: &std::path::Path, args: &[&str]) -> Command {
    let mut c = nk();
    c.args(args)
        .env("NK_META", meta)
        .env("NK_CONFIG", config)
        .stdin(Stdio::null());
    c
}

/// `nk args` against `meta` started in the background, waiting for the
/// cluster: its stderr is piped (the notice), its stdout dropped.
fn waiting(meta: &str, config: &std::path::Path, args: &[&str]) -> std::process::Child {
    let child = client(meta, config, args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Long enough for the wait to say so.
    std::thread::sleep(Duration::from_millis(1500));
    child
}

/// A 16 MiB DRAM storage server registered with `meta`.
fn start_store(meta: &str) -> Proc {
    let (store, _) = start_role(
        &["store", "--class", "0", "--size", "16MiB"],
        &[("NK_META", meta)],
        "storage server 0",
    );
    Proc(store)
}

/// The bash block under `## Quick start` in README.md.
fn quick_start_block() -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let section = readme
        .split("\n## Quick start\n")
        .nth(1)
        .expect("a `## Quick start` section in README.md");
    let section = section.split("\n## ").next().unwrap();
    let block = section
        .split("```bash\n")
        .nth(1)
        .expect("a bash block in the quick start");
    block.split("```").next().unwrap().to_string()
}

/// The README's quick start, as written, in a host of its own (a network
/// namespace: its fixed port 9060 is then never taken), in a fresh
/// directory holding `input.parquet` (the file it puts) and the `nk`
/// under test as `target/release/nk`: its first line, `cargo build
/// --release`, is the one line not run (the test must not rebuild; the
/// line is checked to be there, so a changed build step fails here). A
/// `wait` after the block checks that `nk up` stops cleanly.
#[test]
fn the_readme_quick_start_runs_as_written() {
    let block = quick_start_block();
    let build = "cargo build --release\n";
    assert!(
        block.starts_with(build),
        "the quick start no longer starts with `{build}`; update this test:\n{block}"
    );
    let script = format!(
        "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n\
         : built by the test: target/release/nk is the nk under test\n{}\nwait\n",
        &block[build.len()..]
    );
    let Some(net) = common::netns::Net::new(1) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("target/release")).unwrap();
    std::os::unix::fs::symlink(common::NK, dir.path().join("target/release/nk")).unwrap();
    std::fs::write(dir.path().join("input.parquet"), vec![7u8; 3 << 20]).unwrap();
    let run = dir.path().join("run");
    let mut cmd = net.host(0).command("timeout");
    cmd.args(["300", "bash", "-e", "-c", &script])
        .current_dir(dir.path())
        .env("HOME", dir.path())
        .env("NK_RUNTIME_DIR", &run)
        .env_remove("NK_META")
        .env_remove("NK_CONFIG")
        .env_remove("NK_TOKEN_FILE")
        .stdin(Stdio::null());
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the quick start failed:\n{stdout}\n{}",
        stderr(&out)
    );
    assert!(stdout.contains("input.parquet"), "{stdout}");
    // (`nk kv get` prints the value as it is: no newline after it.)
    assert!(stdout.contains("\n42"), "{stdout}");
    assert!(stdout.contains("NodeKernel is up"), "{stdout}");
}

/// `nk up … &` and a command at once (the quick start's order): the
/// command waits for the metadata server to listen and for a storage
/// server to register, and finds `nk up`'s token by itself.
#[test]
fn a_command_right_after_nk_up_waits_for_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let config = timeout_config(dir.path(), 60_000);
    let addr = format!("127.0.0.1:{}", free_port());
    let port = addr.rsplit(':').next().unwrap().to_string();
    let _up = Proc(
        nk().args(["up", "--port", &port, "--dram", "64MiB", "--file", "0"])
            .env_remove("NK_META")
            .env_remove("NK_CONFIG")
            .env_remove("NK_TOKEN_FILE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let out = client(&addr, &config, &["mkdir", "-p", "/jobs/job1"])
        .env_remove("NK_TOKEN_FILE")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = client(&addr, &config, &["ls", "/jobs"])
        .env_remove("NK_TOKEN_FILE")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("job1"));
}

/// Before the metadata server listens, a command waits for it (and says
/// so once it has waited a moment); with nothing ever listening it fails
/// after the client timeout, saying how long it waited.
#[test]
fn a_command_waits_for_the_metadata_server_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let long = timeout_config(dir.path(), 60_000);
    let early = waiting(&addr, &long, &["mkdir", "/early"]);
    let (meta, _) = start_role(
        &["meta", "--listen", &addr],
        &[],
        "metadata server listening on",
    );
    let _meta = Proc(meta);
    let _store = start_store(&addr);
    let out = early.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(&format!("waiting for the cluster at {addr} to start")),
        "{err}"
    );

    // Nothing listens, ever: an error after the bound, not before.
    let nowhere = format!("127.0.0.1:{}", free_port());
    let short = timeout_config(dir.path(), 1500);
    let t = Instant::now();
    let out = client(&nowhere, &short, &["ls", "/"]).output().unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(t.elapsed() >= Duration::from_millis(1400), "{err}");
    assert!(
        err.contains("Unavailable") && err.contains(&nowhere) && err.contains("waited"),
        "{err}"
    );
}

/// A metadata server with no storage server yet: a command that needs a
/// block waits until one registers; if none does within the client
/// timeout, it fails saying what it waited for.
#[test]
fn a_command_waits_for_a_storage_server_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (meta, addr) = start_role(
        &["meta", "--listen", "127.0.0.1:0"],
        &[],
        "metadata server listening on",
    );
    let _meta = Proc(meta);

    // None comes: the error after the bound.
    let short = timeout_config(dir.path(), 1500);
    let t = Instant::now();
    let out = client(&addr, &short, &["mkdir", "/never"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(t.elapsed() >= Duration::from_millis(1400), "{err}");
    assert!(
        err.contains("no storage server has registered") && err.contains("waited"),
        "{err}"
    );
    assert!(
        err.contains(&format!("waiting for the cluster at {addr} to start")),
        "{err}"
    );

    // One comes while the command waits: it goes through.
    let long = timeout_config(dir.path(), 60_000);
    let later = waiting(&addr, &long, &["mkdir", "/later"]);
    let _store = start_store(&addr);
    let out = later.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = client(&addr, &long, &["ls", "/"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("later"));
}

/// `nk meta --listen A --meta A,B`: partition 0 of 2 for A, 1 of 2 for
/// B (as its `--meta` help says, the list is in partition order), so
/// clients of the list work; a listen address not in the list is
/// refused, saying how to fix it.
#[test]
fn nk_meta_takes_its_partition_from_the_list() {
    let addrs = [free_port(), free_port()].map(|p| format!("127.0.0.1:{p}"));
    let list = addrs.join(",");
    let metas: Vec<Proc> = addrs
        .iter()
        .map(|a| {
            let (p, _) = start_role(
                &["meta", "--listen", a, "--meta", &list],
                &[],
                "metadata server listening on",
            );
            Proc(p)
        })
        .collect();
    let _store = start_store(&list);
    let dir = tempfile::tempdir().unwrap();
    let config = timeout_config(dir.path(), 60_000);
    for name in ["/a", "/b", "/c", "/d"] {
        let out = client(&list, &config, &["mkdir", name]).output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let out = client(&list, &config, &["status", "--json"])
        .output()
        .unwrap();
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["unreachable"].as_array().map(Vec::len), Some(0), "{st}");
    drop(metas);

    let elsewhere = format!("127.0.0.1:{}", free_port());
    let out = nk()
        .args(["meta", "--listen", &elsewhere, "--meta", &list])
        .env_remove("NK_CONFIG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(!out.status.success());
    assert!(
        err.contains("not in that list") && err.contains("meta.partition"),
        "{err}"
    );
}
