//! Helpers shared by the `nk` end-to-end tests.

pub mod netns;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

pub const NK: &str = env!("CARGO_BIN_EXE_nk");

/// The cluster token every server and client these tests start shares
/// (servers refuse to start without one: `docs/security.md`), written once
/// per test process.
pub fn token_file() -> &'static std::path::Path {
    static FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let path = dir.join(format!("test-token-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let out = Command::new(NK)
            .args(["token", "new"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        path
    })
}

/// The runtime directory (where `nk up` and `nk meta` tell local clients
/// their token file) of the processes these tests start: one per test
/// process, so the tests never touch the user's.
pub fn runtime_dir() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("run-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    })
}

/// Settings of a Rust client (in the test process) of the cluster at
/// `meta`, with the tests' token ([`token_file`]).
#[allow(dead_code)] // not every test binary has a client of its own
pub fn client_config(meta: &str) -> nodekernel_client::ClientConfig {
    let mut c = nodekernel_client::ClientConfig::new(vec![meta.to_string()]);
    let security = nodekernel_client::SecuritySection {
        token_file: Some(token_file().to_path_buf()),
        ..Default::default()
    };
    c.token = security.token().expect("the tests' token");
    c
}

/// `nk`, with the tests' token ([`token_file`]) and runtime directory.
pub fn nk() -> Command {
    let mut cmd = Command::new(NK);
    cmd.env("NK_TOKEN_FILE", token_file())
        .env("NK_RUNTIME_DIR", runtime_dir());
    cmd
}

/// Starts a long-running `nk` role (`up`, `meta`, `store`) with only the
/// environment `envs` naming a cluster (and the tests' token, see [`nk`]), and returns it once it printed a
/// first line containing `ready`, with the last word of that line (the
/// address). Later output is drained so the role never blocks on it.
pub fn start_role(args: &[&str], envs: &[(&str, &str)], ready: &str) -> (Child, String) {
    let mut cmd = nk();
    cmd.args(args).env_remove("NK_META").env_remove("NK_CONFIG");
    for (k, v) in envs {
        // An empty value removes the variable (the tests' token, say).
        if v.is_empty() {
            cmd.env_remove(k);
        } else {
            cmd.env(k, v);
        }
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.next().expect("a first line").unwrap();
    assert!(line.contains(ready), "unexpected first line: {line}");
    std::thread::spawn(move || for _ in lines {});
    let last = line.rsplit(' ').next().unwrap().to_string();
    (child, last)
}

/// A long-running process, killed when dropped.
#[allow(dead_code)] // not every test binary keeps processes this way
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `nk meta --listen 127.0.0.1:0 EXTRA...` and one DRAM `nk store` of
/// `size` registered with it: (meta, its address, store).
#[allow(dead_code)] // not every test binary starts a cluster this way
pub fn start_meta_and_store(extra: &[&str], size: &str) -> (Child, String, Child) {
    let mut args = vec!["meta", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    let (meta, addr) = start_role(&args, &[], "metadata server listening on");
    let (store, _) = start_role(
        &["store", "--class", "0", "--medium", "dram", "--size", size],
        &[("NK_META", &addr)],
        "storage server 0",
    );
    (meta, addr, store)
}

/// An `nk` client command against the cluster at `meta`, whose requests
/// wait for a reply as long as it takes: its timeout only catches a hang
/// (the default 5 s is not that on a loaded machine).
#[allow(dead_code)] // not every test binary runs client commands this way
pub fn client(meta: &str) -> Command {
    static CONFIG: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        // Written once per test process, before any command reads it.
        let name = format!("client-hang-bound-{}.toml", std::process::id());
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
        std::fs::write(&path, "[client]\ntimeout_ms = 120000\n").unwrap();
        path
    });
    let mut cmd = nk();
    cmd.env("NK_META", meta).env("NK_CONFIG", config);
    cmd
}

/// Runs `nk ARGS` against the cluster at `meta` (see [`client`]), checks
/// that it succeeded, and returns its stdout.
#[allow(dead_code)] // not every test binary runs client commands this way
pub fn nk_ok(meta: &str, args: &[&str]) -> Vec<u8> {
    succeeds(client(meta).args(args))
}

/// Runs `cmd`, checks that it succeeded (failing with its stderr), and
/// returns its stdout.
#[allow(dead_code)] // not every test binary uses it
pub fn succeeds(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Runs `cmd`, checks that it failed, and returns its stderr.
#[allow(dead_code)] // not every test binary uses it
pub fn fails(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "{cmd:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}
