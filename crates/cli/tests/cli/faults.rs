//! Faults and fault-path semantics, end to end with separate processes:
//! `nk` servers and clients started by the test, killed with SIGKILL.

use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{start_role, Proc};
/// Generous bound that only catches hangs.
const HANG: Duration = Duration::from_secs(120);

impl Proc {
    fn sigkill(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

/// Starts `nk args` (see [`start_role`]) with the config file `config`
/// and the cluster `meta`, killed when dropped.
fn start(args: &[&str], config: Option<&Path>, meta: Option<&str>, ready: &str) -> (Proc, String) {
    let config = config.map(|c| c.to_str().expect("a UTF-8 path"));
    let envs: Vec<(&str, &str)> = [("NK_CONFIG", config), ("NK_META", meta)]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect();
    let (child, last) = start_role(args, &envs, ready);
    (Proc(child), last)
}

/// `nk args` as a client of the cluster at `meta` with config file `config`.
fn nk_cmd(meta: &str, config: &Path, args: &[&str]) -> Command {
    let mut c = common::nk();
    c.args(args).env("NK_META", meta).env("NK_CONFIG", config);
    c
}

struct Cluster {
    meta: String,
    config: tempfile::NamedTempFile,
    _up: Proc,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// `nk up` with a config file holding `config` (TOML).
    fn up(config: &str, extra: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(config.as_bytes()).unwrap();
        let mut args = vec!["up", "--port", "0", "--data-dir"];
        let d = dir.path().to_str().unwrap().to_string();
        args.push(&d);
        args.extend_from_slice(extra);
        let (up, meta) = start(&args, Some(file.path()), None, "metadata server at");
        Cluster {
            meta,
            config: file,
            _up: up,
            dir,
        }
    }

    fn cmd(&self, args: &[&str]) -> Command {
        nk_cmd(&self.meta, self.config.path(), args)
    }

    fn nk(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> Vec<u8> {
        let out = self.nk(args);
        assert!(
            out.status.success(),
            "nk {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    fn status(&self) -> Value {
        serde_json::from_slice(&self.ok(&["status", "--json"])).unwrap()
    }
}

fn used_blocks(status: &Value) -> u64 {
    status["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["used_blocks"].as_u64().unwrap())
        .sum()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Waits for `cond`, polling; panics only on a hang.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + HANG;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `nk kv get` and `nk get` under two writers replacing the value in a
/// loop: every read gives one whole value or fails without output.
#[test]
fn gets_are_whole_under_concurrent_replacement() {
    let c = Cluster::up("", &["--dram", "64MiB", "--file", "0"]);
    c.ok(&["mkdir", "--type", "table", "/t"]);
    const LEN: usize = 3 << 20;
    let put = |fill: u8| {
        let mut p = c
            .cmd(&["kv", "put", "/t/k", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        p.stdin.take().unwrap().write_all(&vec![fill; LEN]).unwrap();
        let out = p.wait_with_output().unwrap();
        assert!(out.status.success(), "kv put: {}", stderr(&out));
    };
    put(b'a');
    let whole =
        |v: &[u8]| v.len() == LEN && (v.iter().all(|b| *b == b'a') || v.iter().all(|b| *b == b'b'));
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for fill in [b'a', b'b'] {
            let stop = &stop;
            let put = &put;
            s.spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    put(fill);
                }
            });
        }
        let out_file = c.dir.path().join("got.bin");
        let mut whole_reads = 0;
        for i in 0..24 {
            if i % 2 == 0 {
                let o = c.nk(&["kv", "get", "/t/k"]);
                if o.status.success() {
                    assert!(whole(&o.stdout), "kv get printed a partial or mixed value");
                    whole_reads += 1;
                } else {
                    assert!(
                        o.stdout.is_empty(),
                        "a failed kv get printed {} bytes",
                        o.stdout.len()
                    );
                }
            } else {
                let _ = std::fs::remove_file(&out_file);
                let o = c.nk(&["get", "/t/k", out_file.to_str().unwrap()]);
                if o.status.success() {
                    assert!(
                        whole(&std::fs::read(&out_file).unwrap()),
                        "get wrote a partial value"
                    );
                    whole_reads += 1;
                } else {
                    assert!(!out_file.exists(), "a failed get left a file");
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(whole_reads > 0, "no get succeeded");
    });
    // No temporary files are left beside the target.
    let left: Vec<_> = std::fs::read_dir(c.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("nk-part"))
        .collect();
    assert!(left.is_empty(), "temporary files left: {left:?}");
}

/// A put that fails for lack of space leaves nothing behind, and the
/// space is usable again at once.
#[test]
fn a_failed_put_leaves_no_node_and_no_blocks() {
    let c = Cluster::up("", &["--dram", "16MiB", "--file", "32MiB"]);
    // The root's record block, taken by the first create, stays.
    c.ok(&["mkdir", "/warm"]);
    let before = used_blocks(&c.status());
    let big = c.dir.path().join("big.bin");
    std::fs::write(&big, vec![7u8; 100 << 20]).unwrap();
    let o = c.nk(&["put", big.to_str().unwrap(), "/big"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("NoSpace"), "{}", stderr(&o));
    assert!(stderr(&c.nk(&["stat", "/big"])).contains("NotFound"));
    let st = c.status();
    assert_eq!(used_blocks(&st), before, "every block is free again: {st}");
    assert_eq!(st["puts_in_progress"], 0);
    let small = c.dir.path().join("small.bin");
    std::fs::write(&small, vec![8u8; 20 << 20]).unwrap();
    c.ok(&["put", small.to_str().unwrap(), "/big"]);
}

/// `nk status --wait` waits for the expected storage servers; before any
/// registered, a write says so.
#[test]
fn readiness_is_explicit() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("nk.toml");
    std::fs::write(&cfg, "[meta]\nexpect_servers = 1\n").unwrap();
    let (_meta, addr) = start(
        &["meta", "--listen", "127.0.0.1:0"],
        Some(&cfg),
        None,
        "metadata server listening on",
    );
    let nk = |args: &[&str]| nk_cmd(&addr, &cfg, args).output().unwrap();
    let o = nk(&["status", "--wait", "--timeout", "1"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("0 of 1 expected storage servers"),
        "{}",
        stderr(&o)
    );
    let st: Value = serde_json::from_slice(&nk(&["status", "--json"]).stdout).unwrap();
    assert_eq!(st["ready"], false);
    let o = nk(&["mkdir", "--type", "table", "/t"]);
    assert!(
        stderr(&o).contains("no storage server has registered"),
        "{}",
        stderr(&o)
    );
    // A store that starts later: --wait returns once it is alive.
    let waiter = nk_cmd(&addr, &cfg, &["status", "--wait", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (_store, _) = start(
        &[
            "store", "--class", "0", "--medium", "dram", "--size", "16MiB",
        ],
        Some(&cfg),
        Some(&addr),
        "storage server 0",
    );
    let out = waiter.wait_with_output().unwrap();
    assert!(out.status.success());
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["ready"], true);
    let o = nk(&["mkdir", "--type", "table", "/t"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = nk(&["kv", "put", "/t/k", "v"]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// Small rules: `mkdir -p` of a path that is too deep creates nothing,
/// and human `ls` escapes control characters in names.
#[test]
fn mkdir_p_checks_first_and_ls_escapes_names() {
    let c = Cluster::up("", &["--dram", "16MiB", "--file", "0"]);
    let deep = "/deep".repeat(200);
    let o = c.nk(&["mkdir", "-p", &deep]);
    assert!(stderr(&o).contains("InvalidPath"), "{}", stderr(&o));
    assert!(
        stderr(&c.nk(&["stat", "/deep"])).contains("NotFound"),
        "nothing created"
    );
    c.ok(&["mkdir", "/a\nb\u{1b}[31m"]);
    let ls = String::from_utf8(c.ok(&["ls", "/"])).unwrap();
    assert!(ls.contains("a\\nb\\u{1b}[31m"), "{ls}");
    assert_eq!(ls.lines().count(), 1, "one line per entry: {ls:?}");
    let json: Value = serde_json::from_slice(&c.ok(&["ls", "/", "--json"])).unwrap();
    assert_eq!(json[0]["name"], "a\nb\u{1b}[31m", "JSON keeps the name");
}

/// A client that dies mid-write (`docs/security.md`, *Space held by
/// writers that vanished*): a writer killed with SIGKILL
/// loses its lease once it expires; the node keeps its last synced size
/// (nothing was synced), and deleting it leaks no block.
#[test]
fn a_client_killed_mid_write_leaks_nothing() {
    let c = Cluster::up(
        "[meta]\nlease_timeout_ms = 1000\n",
        &["--dram", "64MiB", "--file", "0"],
    );
    c.ok(&["mkdir", "/warm"]);
    let before = used_blocks(&c.status());
    let mut put = c
        .cmd(&["put", "-", "/f"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = put.stdin.take().unwrap();
    stdin.write_all(&vec![1u8; 12 << 20]).unwrap();
    // Some of it reached storage: blocks are allocated.
    eventually("the writer to write blocks", || {
        used_blocks(&c.status()) > before
    });
    put.kill().unwrap();
    put.wait().unwrap();
    drop(stdin);
    // The put wrote under a hidden name beside /f, which it never reached.
    assert!(!c.nk(&["test", "-e", "/f"]).status.success());
    let hidden: Vec<String> =
        serde_json::from_slice(&c.ok(&["find", "/", "--name", ".f.nk-copying-*", "--json"]))
            .unwrap();
    let [hidden] = &hidden[..] else {
        panic!("one hidden copy: {hidden:?}")
    };
    let st: Value = serde_json::from_slice(&c.ok(&["stat", hidden, "--json"])).unwrap();
    assert_eq!(st["size"], 0, "nothing was synced");
    // The lease expires: another writer may take the node over.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = nodekernel_client::Client::connect(common::client_config(&c.meta))
            .await
            .unwrap();
        let deadline = Instant::now() + HANG;
        loop {
            match client.open_write(hidden).await {
                Ok(n) => break n.close().await.unwrap(),
                Err(e) if e.code == nodekernel_client::ErrorCode::Busy => {
                    assert!(Instant::now() < deadline, "the lease never expired");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("open_write: {e}"),
            }
        }
    });
    c.ok(&["rm", hidden]);
    eventually("every block to be free", || {
        used_blocks(&c.status()) == before
    });
}

/// A storage server killed (README.md, *Semantics in brief*, Faults): a store killed with SIGKILL
/// has its blocks reported lost (after a bounded wait, never a hang),
/// blocks elsewhere are unaffected.
#[test]
fn a_killed_storage_server_loses_only_its_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("nk.toml");
    std::fs::write(
        &cfg,
        // Dead after five missed heartbeats (1 s each): declaring the killed
        // store dead is under test, the surviving one must stay alive on a
        // loaded machine.
        "[meta]\ndead_after_ms = 5000\n[client]\ntimeout_ms = 30000\n",
    )
    .unwrap();
    let (_meta, addr) = start(
        &["meta", "--listen", "127.0.0.1:0"],
        Some(&cfg),
        None,
        "metadata server listening on",
    );
    let (_dram, _) = start(
        &[
            "store", "--class", "0", "--medium", "dram", "--size", "16MiB",
        ],
        Some(&cfg),
        Some(&addr),
        "storage server 0",
    );
    let blocks = dir.path().join("f.blocks");
    let (mut file, _) = start(
        &[
            "store",
            "--class",
            "1",
            "--class-name",
            "file",
            "--medium",
            "file",
            "--size",
            "16MiB",
            "--path",
            blocks.to_str().unwrap(),
        ],
        Some(&cfg),
        Some(&addr),
        "storage server 0",
    );
    let nk = |args: &[&str]| nk_cmd(&addr, &cfg, args).output().unwrap();
    let a = dir.path().join("a.bin");
    let b = dir.path().join("b.bin");
    std::fs::write(&a, vec![0xAA; 3 << 20]).unwrap();
    std::fs::write(&b, vec![0xBB; 3 << 20]).unwrap();
    for (local, path, class) in [(&a, "/a", "0"), (&b, "/b", "1")] {
        let o = nk(&["put", "--class", class, local.to_str().unwrap(), path]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    file.sigkill();
    // Before it is declared dead: a read of its blocks fails (its
    // connections are refused), it does not hang.
    let out = dir.path().join("out.bin");
    let o = nk(&["get", "/b", out.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(!out.exists(), "a failed get writes nothing");
    // Declared dead: status says so and its blocks are reported lost.
    eventually("the store to be declared dead", || {
        let st: Value = serde_json::from_slice(&nk(&["status", "--json"]).stdout).unwrap();
        st["servers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["alive"] == false)
    });
    let o = nk(&["get", "/b", out.to_str().unwrap()]);
    assert!(stderr(&o).contains("DataLost"), "{}", stderr(&o));
    // Blocks elsewhere are unaffected.
    let o = nk(&["get", "/a", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&a).unwrap());
}
