//! End-to-end tests of the `nk` binary against `nk up` started by the test.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{client, fails, nk_ok, start_meta_and_store, start_role, succeeds};

pub(crate) struct Up {
    child: Child,
    pub(crate) meta: String,
    _dir: Option<tempfile::TempDir>,
}

/// `nk up` on port 0 with a 64 MiB DRAM and a 256 MiB file tier in
/// `data_dir`, output piped.
fn up_command(data_dir: &std::path::Path) -> Command {
    let mut cmd = common::nk();
    cmd.args([
        "up",
        "--port",
        "0",
        "--dram",
        "64MiB",
        "--file",
        "256MiB",
        "--data-dir",
    ])
    .arg(data_dir)
    .env_remove("NK_META")
    .env_remove("NK_CONFIG")
    .stdout(Stdio::piped());
    cmd
}

impl Up {
    /// `nk up` on port 0 in a fresh data directory; returns once it printed
    /// its address.
    pub(crate) fn start(extra: &[&str]) -> Up {
        let dir = tempfile::tempdir().unwrap();
        let mut up = Up::start_in(dir.path(), extra);
        up._dir = Some(dir);
        up
    }

    /// `nk up` on port 0 in `data_dir`; returns once it printed its address.
    fn start_in(data_dir: &std::path::Path, extra: &[&str]) -> Up {
        let mut child = up_command(data_dir)
            .args(extra)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("nk up prints a line").unwrap();
        let meta = first
            .rsplit(' ')
            .next()
            .filter(|_| first.contains("metadata server at"))
            .unwrap_or_else(|| panic!("unexpected first line: {first}"))
            .to_string();
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Up {
            child,
            meta,
            _dir: None,
        }
    }

    fn nk(&self, args: &[&str]) -> Output {
        client(&self.meta).args(args).output().unwrap()
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.nk(args);
        assert!(
            out.status.success(),
            "nk {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(args);
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("nk {args:?}: invalid JSON ({e}): {out}"))
    }

    /// Sends SIGTERM and checks that `nk up` stops cleanly.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        // Generous: only catches a hang.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "nk up exits cleanly on SIGTERM: {status}");
                return;
            }
            assert!(Instant::now() < deadline, "nk up did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

fn used(status: &Value, class: u64) -> u64 {
    status["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["class"] == class)
        .map(|c| c["used_bytes"].as_u64().unwrap())
        .unwrap_or_else(|| panic!("class {class} missing in {status}"))
}

/// `nk get` into a FIFO (or a device such as /dev/null) writes through
/// it, and leaves it what it was: a renamed temporary file must never
/// replace it.
#[test]
fn get_into_a_fifo_writes_through_it() {
    use std::os::unix::fs::FileTypeExt;
    let up = Up::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.bin");
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    up.ok(&["put", src.to_str().unwrap(), "/f"]);
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    up.ok(&["get", "/f", fifo.to_str().unwrap()]);
    // Checked first: had the FIFO been replaced, the reader would wait on
    // it for ever.
    let kind = std::fs::symlink_metadata(&fifo).unwrap().file_type();
    assert!(kind.is_fifo(), "the FIFO is still a FIFO: {kind:?}");
    assert!(
        reader.join().unwrap() == data,
        "the bytes went through the FIFO"
    );
}

/// `nk policy show|set`: every partition's settings, JSON for scripts, a
/// change that sticks, and a bad key refused with its name.
#[test]
fn policy_show_and_set() {
    let up = Up::start(&[]);
    let shown = up.json(&["policy", "show", "--json"]);
    assert_eq!(shown["settings"]["migration"], "on", "{shown}");
    assert_eq!(shown["settings"]["high_watermark"], "90", "{shown}");
    assert_eq!(shown["consistent"], true);
    let set = up.json(&[
        "policy",
        "set",
        "low_watermark",
        "20",
        "high_watermark",
        "30",
        "--json",
    ]);
    assert_eq!(set["settings"]["high_watermark"], "30", "{set}");
    assert_eq!(set["settings"]["low_watermark"], "20", "{set}");
    let text = up.ok(&["policy", "show"]);
    assert!(
        text.lines()
            .any(|l| l.split_whitespace().eq(["high_watermark", "30"])),
        "{text}"
    );
    let bad = up.nk(&["policy", "set", "colour", "red"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("colour") && err.contains("InvalidArgument"),
        "{err}"
    );
    assert_eq!(
        up.json(&["policy", "show", "--json"])["settings"]["high_watermark"],
        "30",
        "a refused change changes nothing"
    );
}

#[test]
fn put_get_100_mib_and_json_output() {
    let up = Up::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.bin");
    let dst = dir.path().join("out.bin");
    let mut data = vec![0u8; 100 << 20];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    std::fs::File::create(&src)
        .unwrap()
        .write_all(&data)
        .unwrap();

    let before = up.json(&["status", "--json"]);
    let classes = before["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2, "DRAM and file classes: {before}");
    assert_eq!(classes[0]["capacity_bytes"], 64u64 << 20);
    assert_eq!(classes[1]["capacity_bytes"], 256u64 << 20);
    assert_eq!(used(&before, 0) + used(&before, 1), 0);

    // This test checks where the blocks land: nothing may move them.
    up.ok(&["policy", "set", "migration", "off"]);
    up.ok(&["mkdir", "-p", "/data/sub"]);
    up.ok(&["put", src.to_str().unwrap(), "/data/big.bin"]);
    up.ok(&["get", "/data/big.bin", dst.to_str().unwrap()]);
    let back = std::fs::read(&dst).unwrap();
    assert_eq!(back.len(), data.len());
    assert!(
        back == data,
        "100 MiB round trip through nk put / nk get is byte-identical"
    );

    let after = up.json(&["status", "--json"]);
    assert_eq!(used(&after, 0), 64 << 20, "DRAM filled first");
    // 100 MiB of data plus the child records of / (a block, file tier)
    // and /data (DRAM: its few records share one 640-byte piece, in a
    // slab of its own while nothing else shares it).
    assert_eq!(
        used(&after, 1),
        38 << 20,
        "the rest spilled to the file tier"
    );

    let ls = up.json(&["ls", "/data", "--json"]);
    let entries = ls.as_array().unwrap();
    assert_eq!(entries.len(), 2);
    let big = entries.iter().find(|e| e["name"] == "big.bin").unwrap();
    assert_eq!(big["type"], "File");
    assert_eq!(big["size"], 100u64 << 20);
    assert_eq!(big["path"], "/data/big.bin");

    let stat = up.json(&["stat", "/data/big.bin", "--json"]);
    assert_eq!(stat["type"], "File");
    assert_eq!(stat["size"], 100u64 << 20);
    assert_eq!(stat["blocks"], 100);
    assert!(
        stat.get("block_list").is_none(),
        "block list only on request"
    );
    let stat = up.json(&["stat", "/data/big.bin", "--json", "--blocks"]);
    let list = stat["block_list"].as_array().unwrap();
    assert_eq!(list.len(), 100, "one entry per block");
    // /data's record piece took a DRAM block (its slab) before the put.
    assert!(list
        .iter()
        .take(63)
        .all(|b| b["storage_class"] == 0 && b["class_name"] == "dram"));
    assert!(list
        .iter()
        .skip(63)
        .all(|b| b["storage_class"] == 1 && b["class_name"] == "file"));
    assert!(list
        .iter()
        .all(|b| b["addr"].as_str().unwrap().starts_with("127.0.0.1:")));
    let prices: Vec<f64> = after["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["price_per_gib"].as_f64().unwrap())
        .collect();
    assert_eq!(prices, vec![5.0, 0.63], "the seed's price table by default");
    assert_eq!(after["classes"][0]["blocks"], 64);
    assert_eq!(after["classes"][0]["used_blocks"], 64);

    // KV, cat, mv, rm and their errors.
    up.ok(&["mkdir", "--type", "table", "/kv"]);
    up.ok(&["kv", "put", "/kv/greeting", "hello"]);
    assert_eq!(up.ok(&["kv", "get", "/kv/greeting"]), "hello");
    up.ok(&["kv", "put", "/kv/greeting", "replaced"]);
    assert_eq!(up.ok(&["cat", "/kv/greeting"]), "replaced");
    up.ok(&["mv", "/data/sub", "/moved"]);
    let root: Vec<String> = up
        .json(&["ls", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(root, vec!["data", "kv", "moved"]);
    let out = up.nk(&["rm", "/data"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotEmpty"));
    up.ok(&["rm", "-r", "/data"]);
    let out = up.nk(&["stat", "/data"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound: /data does not exist"));
    // Tables, bags and their commands.
    up.ok(&["mkdir", "--type", "table", "--non-enumerable", "/hidden"]);
    up.ok(&["kv", "put", "/hidden/k", "v"]);
    assert_eq!(up.ok(&["kv", "get", "/hidden/k"]), "v");
    assert_eq!(
        up.json(&["kv", "ls", "/hidden", "--json"]),
        serde_json::json!([])
    );
    up.ok(&["kv", "put", "/kv/other", "x"]);
    assert_eq!(
        up.json(&["kv", "ls", "/kv", "--json"]),
        serde_json::json!(["greeting", "other"])
    );
    up.ok(&["kv", "rm", "/kv/other"]);
    assert_eq!(up.ok(&["kv", "ls", "/kv"]), "greeting\n");
    up.ok(&["mkdir", "--type", "bag", "/shuffle"]);
    let parts = ["first part|", "second part|", "third"];
    for (i, p) in parts.iter().enumerate() {
        let f = dir.path().join(format!("part{i}"));
        std::fs::write(&f, p).unwrap();
        up.ok(&["put", f.to_str().unwrap(), &format!("/shuffle/map-{i}")]);
    }
    assert_eq!(
        up.ok(&["cat", "/shuffle"]),
        parts.concat(),
        "the bag reads as one stream"
    );
    let bag = up.json(&["ls", "/shuffle", "--json"]);
    assert_eq!(bag.as_array().unwrap().len(), 3);
    let out = up.nk(&["mkdir", "--type", "table", "/shuffle/t"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains(
        "TypeMismatch: cannot put a Table at /shuffle/t: a Bag can only hold File nodes"
    ));
    up.ok(&["rm", "-r", "/shuffle"]);
    up.ok(&["rm", "-r", "/hidden"]);

    let freed = up.json(&["status", "--json"]);
    // Left: the slab of the KV value's piece, the root's record block and
    // the slab of /kv's record piece (its two keys share one).
    assert_eq!(
        used(&freed, 0) + used(&freed, 1),
        3 << 20,
        "everything else was freed"
    );

    up.stop();
}

#[test]
fn bad_config_and_unreachable_cluster_give_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("nk.toml");
    std::fs::write(&cfg, "[meta]\nblock_sise = \"1MiB\"\n").unwrap();
    let out = common::nk()
        .args(["up", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success(), "refuses to start");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("block_sise"), "names the key: {err}");

    std::fs::write(&cfg, "[meta]\nblock_size = \"3MiB\"\n").unwrap();
    let out = common::nk()
        .args(["meta", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("meta.block_size"));

    // Persistence needs directories that outlive the servers: refused
    // before anything starts, naming the key.
    std::fs::write(&cfg, "[meta]\npersistence = true\n").unwrap();
    let out = common::nk()
        .args(["up", "--port", "0", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("meta.persistence") && err.contains("--data-dir"),
        "{err}"
    );
    let out = common::nk()
        .args(["store", "--class", "0", "--persistent"])
        .env("NK_META", "127.0.0.1:1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("persistent") && err.contains("data_dir"),
        "{err}"
    );

    // Nothing listens on this port: a clear error, quickly.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = common::nk()
        .args(["ls", "/"])
        .env("NK_META", port.to_string())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Unavailable") && err.contains(&port.to_string()),
        "{err}"
    );
}

/// Checks one `nk bench --json` report against the schema in docs/bench.md.
fn check_report(mode: &str, r: &Value, max_ops: u64) {
    assert_eq!(r["mode"], mode);
    for key in ["clients", "qd", "size", "ops"] {
        assert!(r[key].is_u64(), "{mode}: {key} is an integer: {r}");
    }
    for key in ["seconds", "ops_per_sec", "mb_per_sec", "gb_per_sec"] {
        assert!(
            r[key].as_f64().is_some_and(|v| v >= 0.0),
            "{mode}: {key}: {r}"
        );
    }
    assert!(r["non_enumerable"].is_boolean());
    let ops = r["ops"].as_u64().unwrap();
    assert!(ops > 0 && ops <= max_ops, "{mode}: {ops} measured ops");
    assert!(r["ops_per_sec"].as_f64().unwrap() > 0.0);
    let l = &r["latency_us"];
    let p: Vec<f64> = ["p50", "p90", "p99", "p999", "max"]
        .iter()
        .map(|k| l[k].as_f64().unwrap())
        .collect();
    assert!(
        p.windows(2).all(|w| w[0] <= w[1]) && p[0] > 0.0,
        "{mode}: ordered percentiles {p:?}"
    );
    assert!(l["mean"].as_f64().unwrap() > 0.0);
    let path = r["data_path"].as_str().unwrap();
    assert!(
        ["shared-memory", "network", "mixed", "none"].contains(&path),
        "{mode}: {r}"
    );
    let meta = r["meta_transport"].as_str().unwrap();
    assert!(["unix", "tcp"].contains(&meta), "{mode}: {r}");
}

/// Checks that a report says the run took the expected paths.
fn check_paths(r: &Value, data: &str, meta: &str) {
    assert_eq!(
        (r["data_path"].as_str(), r["meta_transport"].as_str()),
        (Some(data), Some(meta)),
        "{r}"
    );
}

#[test]
fn bench_reports_valid_json() {
    let modes = [
        "write",
        "read",
        "randread",
        "multistream",
        "create",
        "lookup",
        "putkey",
        "getkey",
        "enumerate",
        "delete",
    ];
    for mode in modes {
        let out = common::nk()
            .args([
                "bench",
                mode,
                "--embedded",
                "--dram",
                "64MiB",
                "--block-size",
                "4KiB",
            ])
            .args([
                "-k", "40", "-w", "5", "-c", "2", "-s", "1KiB", "--qd", "4", "--json",
            ])
            .env_remove("NK_META")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        check_report(mode, &r, 80);
        assert_eq!(r["clients"], 2);
        if matches!(mode, "write" | "read" | "randread" | "putkey" | "getkey") {
            assert_eq!(r["size"], 1024, "{mode}");
            assert!(r["mb_per_sec"].as_f64().unwrap() > 0.0, "{mode}");
            // An embedded cluster is co-located with its clients.
            check_paths(&r, "shared-memory", "unix");
        }
    }
    // Against a separately started cluster (nk up), not an embedded one.
    let up = Up::start(&[]);
    let r = up.json(&[
        "bench", "getkey", "-k", "30", "-w", "3", "-s", "100", "--json",
    ]);
    check_report("getkey", &r, 30);
    check_paths(&r, "shared-memory", "unix");
    let r = up.json(&[
        "bench", "read", "--remote", "-k", "30", "-w", "3", "-s", "4KiB", "--json",
    ]);
    check_report("read", &r, 30);
    check_paths(&r, "network", "tcp");
    lifecycle_bench_runs(&up);
    drop(up);

    let dir = tempfile::tempdir().unwrap();
    let out = common::nk()
        .args([
            "bench",
            "tiering",
            "-s",
            "256KiB",
            "--block-size",
            "4KiB",
            "--json",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tiering: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let shares: Vec<u64> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["dram_percent"].as_u64().unwrap())
        .collect();
    assert_eq!(shares, vec![100, 50, 10, 0]);
    assert_eq!(rows[0]["relative_to_all_dram"], 1.0);
    let costs: Vec<f64> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["storage_cost"].as_f64().unwrap())
        .collect();
    assert!(
        costs.windows(2).all(|w| w[0] > w[1]),
        "less DRAM costs less: {costs:?}"
    );
    // --vs redis reports the peer's numbers when redis is installed, and a
    // clear message when it is not.
    let out = common::nk()
        .args([
            "bench",
            "getkey",
            "--embedded",
            "-k",
            "200",
            "-w",
            "10",
            "--vs",
            "redis",
            "--json",
        ])
        .output()
        .unwrap();
    if out.status.success() {
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["peer"]["name"], "redis");
        assert_eq!(r["peer"]["op"], "GET");
        assert!(r["peer"]["p50_ratio"].as_f64().unwrap() > 0.0);
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("apt-get install redis-server"), "{err}");
    }
}

/// `nk bench --ttl --quota` makes every node carry the TTL under a quota
/// root, and `nk bench expire` times a subtree's removal and leaves
/// nothing behind (`docs/bench.md`).
fn lifecycle_bench_runs(up: &Up) {
    let r = up.json(&[
        "bench", "create", "-k", "20", "-w", "2", "--ttl", "1h", "--quota", "--keep", "--json",
    ]);
    check_report("create", &r, 20);
    assert_eq!(r["ttl_seconds"], 3600.0, "{r}");
    assert_eq!(r["quota"], true, "{r}");
    let roots = up.json(&["ls", "/", "--json"]);
    let root = roots
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .find(|n| n.starts_with("nk-bench-"))
        .unwrap_or_else(|| panic!("the kept run's root: {roots}"));
    let f = up.json(&["stat", "--json", &format!("/{root}/c0/f21")]);
    assert!(f["expires_ms"].as_u64().is_some_and(|t| t > 0), "{f}");
    let q = up.json(&["quota", "show", "--json"]);
    let q: Vec<&Value> = q
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["path"] == format!("/{root}"))
        .collect();
    assert_eq!(q.len(), 1, "the run's root carries a quota");
    // The root, its client's directory and 22 Files.
    assert_eq!(q[0]["nodes"], 23, "{q:?}");
    up.ok(&["rm", "-r", &format!("/{root}")]);

    let e = up.json(&[
        "bench", "expire", "-k", "2500", "-c", "2", "-w", "5", "--json",
    ]);
    assert_eq!(e["mode"], "expire");
    assert_eq!(e["nodes"], 2500);
    assert_eq!(e["directories"], 3);
    assert!(e["before"]["ops"].as_u64().unwrap() > 0, "{e}");
    let (gone, reaped) = (
        e["gone_after_seconds"].as_f64().unwrap(),
        e["reaped_after_seconds"].as_f64().unwrap(),
    );
    assert!(gone > 0.0 && gone <= reaped, "{e}");
    assert!(e["p99_ratio"].as_f64().is_some(), "{e}");
    // The subtree expired and the rest of the run was removed: only the
    // root directory is left.
    let st = up.json(&["status", "--json"]);
    assert_eq!(st["nodes"], 1, "{st}");
}

/// Runs a client command against `addr` that must succeed; its stdout.
fn stop(mut child: Child) {
    let pid = child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = child.wait().unwrap();
    assert!(status.success(), "stops cleanly on SIGTERM: {status}");
}

/// `nk status --wait` started before the metadata server waits for it to
/// come up (and for its storage server), instead of failing at connect.
#[test]
fn status_wait_waits_for_the_metadata_server_to_come_up() {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let waiter = client(&addr)
        .args(["status", "--wait", "--timeout", "120", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Let the waiter find nothing listening first.
    std::thread::sleep(Duration::from_millis(500));
    let (meta, _) = start_role(
        &["meta", "--listen", &addr],
        &[],
        "metadata server listening on",
    );
    let (store, _) = start_role(
        &[
            "store", "--class", "0", "--medium", "dram", "--size", "8MiB",
        ],
        &[("NK_META", &addr)],
        "storage server 0",
    );
    let out = waiter.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["ready"], true, "{st}");
    stop(store);
    stop(meta);
}

#[test]
fn separately_started_meta_and_store_serve_clients_and_bench() {
    let (meta, addr, store) = start_meta_and_store(&[], "64MiB");
    let nk = |args: &[&str]| client(&addr).args(args).output().unwrap();
    let st: Value = serde_json::from_slice(&nk(&["status", "--json"]).stdout).unwrap();
    assert_eq!(
        st["servers"].as_array().unwrap().len(),
        1,
        "the store registered: {st}"
    );
    assert_eq!(st["classes"][0]["capacity_bytes"], 64u64 << 20);
    assert_eq!(
        st["logs"],
        serde_json::json!([]),
        "a volatile namespace: {st}"
    );
    let out = nk(&[
        "bench", "putkey", "-k", "50", "-w", "5", "-s", "2KiB", "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_report("putkey", &serde_json::from_slice(&out.stdout).unwrap(), 50);
    stop(store);
    stop(meta);
}

/// `nk meta --data-dir` killed with SIGKILL and started again on the same
/// address and directory: the storage server it left running carries on,
/// and everything closed before the kill is back, byte for byte.
#[test]
fn a_metadata_server_killed_with_sigkill_comes_back_from_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("meta");
    let data = data.to_str().unwrap();
    let (mut meta, addr, store) = start_meta_and_store(&["--data-dir", data], "64MiB");
    let nk = |args: &[&str]| nk_ok(&addr, args);
    let src = dir.path().join("src.bin");
    let bytes: Vec<u8> = (0..(3 << 20) + 11).map(|i: u32| (i % 251) as u8).collect();
    std::fs::write(&src, &bytes).unwrap();
    nk(&["mkdir", "/d"]);
    nk(&["put", src.to_str().unwrap(), "/d/file"]);
    nk(&["mkdir", "--type", "table", "/t"]);
    nk(&["kv", "put", "/t/a", "first"]);
    nk(&["kv", "put", "/t/a", "second"]);
    nk(&["kv", "put", "/t/b", "gone"]);
    nk(&["kv", "rm", "/t/b"]);

    meta.kill().unwrap();
    meta.wait().unwrap();
    let (meta, again) = start_role(
        &["meta", "--listen", &addr, "--data-dir", data],
        &[],
        "metadata server listening on",
    );
    assert_eq!(again, addr);
    let st: Value = serde_json::from_slice(&nk(&["status", "--json"])).unwrap();
    assert_eq!(st["logs"][0]["fsync"], "always", "{st}");
    assert!(st["logs"][0]["records"].as_u64().unwrap() > 0, "{st}");
    let text = String::from_utf8(nk(&["status"])).unwrap();
    assert!(
        text.contains("metadata partition 0: persistent, fsync always"),
        "{text}"
    );
    let back = dir.path().join("back.bin");
    nk(&["get", "/d/file", back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == bytes, "the file's bytes");
    assert_eq!(nk(&["kv", "get", "/t/a"]), b"second");
    assert_eq!(
        String::from_utf8(nk(&["kv", "ls", "/t"])).unwrap().trim(),
        "a"
    );
    stop(store);
    stop(meta);
}

/// `nk meta --data-dir` and `nk store --persistent --data-dir`, both killed
/// with SIGKILL and started again: the store says it kept its blocks, and
/// everything closed before the kills reads back.
#[test]
fn separately_started_persistent_servers_come_back_after_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let meta_dir = dir.path().join("meta");
    let store_dir = dir.path().join("store");
    let (meta_dir, store_dir) = (meta_dir.to_str().unwrap(), store_dir.to_str().unwrap());
    let store_args = [
        "store",
        "--class",
        "0",
        "--medium",
        "file",
        "--size",
        "64MiB",
        "--persistent",
        "--data-dir",
        store_dir,
    ];
    let (mut meta, addr) = start_role(
        &["meta", "--listen", "127.0.0.1:0", "--data-dir", meta_dir],
        &[],
        "metadata server listening on",
    );
    let mut store = start_role(&store_args, &[("NK_META", &addr)], "storage server 0").0;
    let nk = |args: &[&str]| nk_ok(&addr, args);
    let src = dir.path().join("src.bin");
    let bytes: Vec<u8> = (0..(2 << 20) + 5).map(|i: u32| (i % 253) as u8).collect();
    std::fs::write(&src, &bytes).unwrap();
    nk(&["put", src.to_str().unwrap(), "/file"]);
    nk(&["mkdir", "--type", "table", "/t"]);
    nk(&["kv", "put", "/t/a", "kept"]);

    for child in [&mut store, &mut meta] {
        child.kill().unwrap();
        child.wait().unwrap();
    }
    let (meta, again) = start_role(
        &["meta", "--listen", &addr, "--data-dir", meta_dir],
        &[],
        "metadata server listening on",
    );
    assert_eq!(again, addr);
    let mut cmd = common::nk();
    cmd.args(store_args)
        .env("NK_META", &addr)
        .env_remove("NK_CONFIG");
    let mut store = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(store.stdout.take().unwrap()).lines();
    let line = lines.next().expect("a start-up line").unwrap();
    assert!(line.contains("persistent: blocks kept"), "{line}");
    std::thread::spawn(move || for _ in lines {});

    let back = dir.path().join("back.bin");
    nk(&["get", "/file", back.to_str().unwrap()]);
    assert!(std::fs::read(&back).unwrap() == bytes, "the file's bytes");
    assert_eq!(nk(&["kv", "get", "/t/a"]), b"kept");
    let st: Value = serde_json::from_slice(&nk(&["status", "--json"])).unwrap();
    assert_eq!(
        st["servers"].as_array().map(Vec::len),
        Some(1),
        "the same server, not a second one: {st}"
    );
    stop(store);
    stop(meta);
}

/// Runs a command that must fail to start and returns its exit status and
/// stderr. If its first line of output contains `up_marker` instead, it
/// started: it is killed and the test fails (rather than waiting forever).
fn refused(mut cmd: Command, up_marker: &str) -> (std::process::ExitStatus, String) {
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    if let Some(Ok(line)) = lines.next() {
        if line.contains(up_marker) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("started although it must not: {line}");
        }
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn second_up_on_the_same_data_dir_is_refused_and_the_first_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let up = Up::start_in(dir.path(), &[]);
    let first_pid = up.child.id();
    let src = dir.path().join("src.bin");
    std::fs::write(&src, vec![7u8; 3 << 20]).unwrap();
    up.ok(&["put", "--class", "1", src.to_str().unwrap(), "/before"]);

    let (status, err) = refused(up_command(dir.path()), "is up");
    assert!(!status.success(), "the second nk up fails");
    assert!(
        err.contains(&format!("data directory {}", dir.path().display()))
            && err.contains(&format!("pid {first_pid}"))
            && err.contains("--data-dir"),
        "names the directory and the holder: {err}"
    );
    assert_eq!(err.lines().count(), 1, "one line: {err}");

    // The first cluster still serves what it had, and more.
    let back = dir.path().join("back.bin");
    up.ok(&["get", "/before", back.to_str().unwrap()]);
    assert_eq!(std::fs::read(&back).unwrap(), vec![7u8; 3 << 20]);
    up.ok(&["put", src.to_str().unwrap(), "/after"]);
    up.stop();

    // Stopped cleanly: no block file is left, the identities are, and the
    // directory can be used again.
    assert!(dir.path().join("store-1/identity").exists());
    assert!(!dir.path().join("store-1/blocks").exists());
    let again = Up::start_in(dir.path(), &[]);
    again.ok(&["status"]);
    again.stop();
}

#[test]
fn os_errors_are_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"").unwrap();
    let (status, err) = refused(up_command(&file.join("d")), "is up");
    assert!(!status.success());
    assert!(err.contains(&file.display().to_string()), "{err}");
    assert_eq!(err.matches("os error").count(), 1, "{err}");

    // The metadata server's own error, through nk meta.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let mut cmd = common::nk();
    cmd.args(["meta", "--listen", &addr])
        .env_remove("NK_CONFIG")
        .stdout(Stdio::piped());
    let (status, err) = refused(cmd, "listening on");
    assert!(!status.success());
    assert!(err.contains(&addr), "{err}");
    assert_eq!(err.matches("os error").count(), 1, "{err}");
}

#[test]
fn file_stores_without_a_path_get_their_own_private_directories() {
    let (meta, addr) = start_role(
        &["meta", "--listen", "127.0.0.1:0"],
        &[],
        "metadata server listening on",
    );
    let store = |class: &str| {
        let mut cmd = common::nk();
        cmd.args([
            "store",
            "--class",
            class,
            "--class-name",
            "file",
            "--medium",
            "file",
            "--size",
            "64MiB",
        ])
        .env_remove("NK_CONFIG")
        .env("NK_META", &addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let mut child = cmd.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines.next().expect("a first line").unwrap();
        std::thread::spawn(move || for _ in lines {});
        let dir = line
            .split(", data directory ")
            .nth(1)
            .and_then(|rest| rest.split(", at ").next())
            .unwrap_or_else(|| panic!("no data directory in: {line}"))
            .to_string();
        (child, std::path::PathBuf::from(dir))
    };
    let (a, da) = store("1");
    let (b, db) = store("1");
    assert_ne!(da, db, "each store has its own directory");
    for d in [&da, &db] {
        assert!(d.join("blocks").exists(), "{}", d.display());
        assert_eq!(
            std::fs::metadata(d).unwrap().permissions().mode() & 0o777,
            0o700
        );
    }
    let st: Value = serde_json::from_slice(
        &common::nk()
            .args(["status", "--json"])
            .env("NK_META", &addr)
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(st["servers"].as_array().unwrap().len(), 2, "{st}");
    stop(a);
    assert!(!da.exists(), "removed at shutdown");
    assert!(db.join("blocks").exists());
    stop(b);
    assert!(!db.exists());
    stop(meta);
}

/// `nk top --once --json`: one frame with every class and server, their
/// capacity and use, the servers' counters (from their heartbeats) and
/// rates measured over the interval.
#[test]
fn top_once_prints_one_json_frame() {
    let up = Up::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("f");
    std::fs::write(&src, vec![5u8; 3 << 20]).unwrap();
    // The file tier: over the network, so its server counts the bytes.
    up.ok(&["put", "--class", "1", src.to_str().unwrap(), "/f"]);
    let deadline = Instant::now() + Duration::from_secs(120);
    let frame = loop {
        let f = up.json(&["top", "--once", "--json", "--interval", "0.2"]);
        let written: u64 = f["servers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["bytes_written"].as_u64().unwrap())
            .sum();
        if written >= 3 << 20 {
            break f;
        }
        assert!(
            Instant::now() < deadline,
            "the heartbeats never carried the write: {f}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(frame["interval_s"].as_f64().unwrap() > 0.0, "{frame}");
    assert_eq!(frame["ready"], true);
    let classes = frame["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2, "{frame}");
    assert_eq!(classes[0]["capacity_bytes"], 64u64 << 20);
    assert_eq!(classes[1]["capacity_bytes"], 256u64 << 20);
    assert!(classes[1]["used_bytes"].as_u64().unwrap() >= 3 << 20);
    for key in [
        "read_bytes_per_s",
        "write_bytes_per_s",
        "read_ops_per_s",
        "write_ops_per_s",
    ] {
        assert!(frame[key].as_f64().is_some(), "{key} missing: {frame}");
        assert!(classes[0][key].as_f64().is_some(), "{key} missing: {frame}");
    }
    let servers = frame["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 2);
    assert!(servers.iter().all(|s| s["alive"] == true));
    // The text form draws the same frame.
    let text = up.ok(&["top", "--once", "--interval", "0.1"]);
    assert!(text.contains("CLASS") && text.contains("file"), "{text}");
    up.stop();
}

#[test]
fn bench_zipf_reports_the_share_of_reads_from_dram() {
    // 64 MiB DRAM and a 256 MiB file class, 1 MiB blocks.
    let up = Up::start(&[]);
    let zipf = |files: &str, size: &str| {
        let r = up.json(&[
            "bench", "zipf", "--files", files, "-s", size, "-k", "60", "-w", "10", "-c", "2",
            "--json",
        ]);
        check_report("zipf", &r, 120);
        let z = r["zipf"].clone();
        assert_eq!(z["files"].as_u64(), files.parse().ok(), "{r}");
        assert_eq!(z["write_share"], 0.1, "{r}");
        assert_eq!(z["exponent"], 0.99, "{r}");
        let by_class: Vec<u64> = z["read_bytes_by_class"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .collect();
        assert_eq!(by_class.len(), 4, "{r}");
        // Whole-file reads: a multiple of the size, at most every op.
        let read: u64 = by_class.iter().sum();
        let size = r["size"].as_u64().unwrap();
        assert!(
            read > 0 && read.is_multiple_of(size) && read <= 120 * size,
            "{r}"
        );
        let share = z["dram_read_share"].as_f64().unwrap();
        assert!(
            (share - by_class[0] as f64 / read as f64).abs() < 1e-9,
            "{r}"
        );
        for key in [
            "blocks_demoted",
            "blocks_promoted",
            "setup_blocks_demoted",
            "setup_blocks_promoted",
        ] {
            assert!(z[key].is_u64(), "{key}: {r}");
        }
        (share, by_class)
    };
    // Everything fits in DRAM: every read comes from there.
    let (share, _) = zipf("20", "64KiB");
    assert_eq!(share, 1.0);
    // 96 MiB of 1 MiB files over 64 MiB of DRAM: some reads from the file
    // class.
    let (share, by_class) = zipf("96", "1MiB");
    assert!(
        share > 0.0 && share < 1.0 && by_class[1] > 0,
        "{by_class:?}"
    );
    up.stop();
}

/// `nk WHAT new FILE` (a cluster token or an encryption key): 64
/// hexadecimal digits, mode 0600; a second run never overwrites it.
fn new_secret_file(what: &str, file: &std::path::Path) {
    let new = || {
        let mut c = common::nk();
        c.args([what, "new"]).arg(file);
        c
    };
    succeeds(&mut new());
    let meta = std::fs::metadata(file).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.trim().len() == 64 && text.trim().chars().all(|c| c.is_ascii_hexdigit()));
    fails(&mut new());
    assert_eq!(std::fs::read_to_string(file).unwrap(), text);
}

/// `nk meta` and one 16 MiB DRAM `nk store`, both with config file `cfg`
/// (and the tests' token, unless `cfg` names its own); the metadata
/// server's address last.
fn meta_and_dram_store(cfg: &str) -> (common::Proc, common::Proc, String) {
    let own_token = std::fs::read_to_string(cfg).unwrap().contains("token_file");
    let envs: &[(&str, &str)] = if own_token {
        &[("NK_TOKEN_FILE", "")]
    } else {
        &[]
    };
    let (meta, addr) = start_role(
        &["meta", "--listen", "127.0.0.1:0", "--config", cfg],
        envs,
        "metadata server listening on",
    );
    let meta = common::Proc(meta);
    let (store, _) = start_role(
        &[
            "store", "--class", "0", "--medium", "dram", "--size", "16MiB", "--config", cfg,
        ],
        &[&[("NK_META", addr.as_str())], envs].concat(),
        "storage server 0",
    );
    (meta, common::Proc(store), addr)
}

#[test]
fn a_token_file_guards_the_cluster_and_nk_token_new_makes_one() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    new_secret_file("token", &token);
    let cfg = dir.path().join("nk.toml");
    std::fs::write(
        &cfg,
        format!(
            "[security]\ntoken_file = {:?}\n",
            token.display().to_string()
        ),
    )
    .unwrap();
    let cfg_s = cfg.display().to_string();
    let (_meta, _store, addr) = meta_and_dram_store(&cfg_s);

    // Without the token (as on another host, where no runtime directory
    // tells where it is): refused, saying what is missing.
    let elsewhere = tempfile::tempdir().unwrap();
    let err = fails(
        client(&addr)
            .args(["mkdir", "/d"])
            .env_remove("NK_TOKEN_FILE")
            .env("NK_RUNTIME_DIR", elsewhere.path()),
    );
    assert!(err.contains("requires the cluster token"), "{err}");
    assert!(err.contains("NK_TOKEN_FILE"), "{err}");
    // A client of this user on this host finds it: `nk meta` told it.
    succeeds(
        client(&addr)
            .args(["mkdir", "/found"])
            .env_remove("NK_TOKEN_FILE"),
    );
    // With it (NK_TOKEN_FILE, or the [security] section of the config).
    succeeds(
        client(&addr)
            .args(["mkdir", "/d"])
            .env("NK_TOKEN_FILE", &token),
    );
    let out = succeeds(
        client(&addr)
            .args(["ls", "/", "--config", &cfg_s])
            .env_remove("NK_TOKEN_FILE")
            .env("NK_RUNTIME_DIR", elsewhere.path()),
    );
    assert!(String::from_utf8_lossy(&out).contains('d'));
}

/// Tenants with separately started servers (`docs/security.md`,
/// *Tenants*): both `nk meta` and `nk store` list the tenant; a member
/// makes its root; the tenant's `nk` (its own token as `NK_TOKEN_FILE`)
/// sees that root as `/`, reads and writes its data over the network (no
/// shared memory for tenants), and is refused the members' commands.
#[test]
fn a_tenant_sees_its_root_through_nk() {
    let dir = tempfile::tempdir().unwrap();
    let (token, a_token) = (dir.path().join("token"), dir.path().join("a.token"));
    new_secret_file("token", &token);
    new_secret_file("token", &a_token);
    let cfg = dir.path().join("nk.toml");
    std::fs::write(
        &cfg,
        format!(
            "[security]\ntoken_file = {:?}\n\n[[security.tenant]]\nname = \"a\"\n\
             token_file = {:?}\nroot = \"/tenants/a\"\nrights = [\"read\", \"write\"]\n",
            token.display().to_string(),
            a_token.display().to_string()
        ),
    )
    .unwrap();
    let (_meta, _store, addr) = meta_and_dram_store(&cfg.display().to_string());
    let elsewhere = tempfile::tempdir().unwrap();
    let admin = || {
        let mut c = client(&addr);
        c.env("NK_TOKEN_FILE", &token);
        c
    };
    let tenant = || {
        let mut c = client(&addr);
        c.env("NK_TOKEN_FILE", &a_token)
            .env("NK_RUNTIME_DIR", elsewhere.path());
        c
    };
    succeeds(admin().args(["mkdir", "-p", "/tenants/a", "/private"]));
    let local = dir.path().join("data");
    std::fs::write(&local, b"a's data, from a local file").unwrap();
    succeeds(tenant().args(["mkdir", "/d"]));
    succeeds(tenant().arg("put").arg(&local).arg("/d/f"));
    let ls = String::from_utf8(succeeds(tenant().args(["ls", "/"]))).unwrap();
    assert!(
        ls.contains('d') && !ls.contains("tenants") && !ls.contains("private"),
        "{ls}"
    );
    let got = succeeds(tenant().args(["cat", "/d/f"]));
    assert_eq!(got, b"a's data, from a local file");
    assert_eq!(
        succeeds(admin().args(["cat", "/tenants/a/d/f"])),
        b"a's data, from a local file"
    );
    let err = fails(tenant().args(["stat", "/private"]));
    assert!(
        err.contains("NotFound") && !err.contains("/tenants/a"),
        "{err}"
    );
    let err = fails(tenant().args(["rm", "-r", "/"]));
    assert!(err.contains("Unauthenticated"), "{err}");
    let err = fails(tenant().args(["policy", "set", "migrate_interval_ms", "1000"]));
    assert!(err.contains("Unauthenticated"), "{err}");
    // Its status and du are its own.
    let du = String::from_utf8(succeeds(tenant().args(["du", "/", "--json"]))).unwrap();
    let du: serde_json::Value = serde_json::from_str(&du).unwrap();
    let root = du.as_array().and_then(|a| a.last()).expect("a list");
    assert_eq!(root["path"], "/", "{du}");
    assert_eq!(
        (root["files"].clone(), root["bytes"].clone()),
        (1.into(), 27.into()),
        "{du}"
    );
    succeeds(tenant().args(["status"]));
}

/// Secure by default (issue 36): `nk meta` and `nk store` refuse to start
/// without a cluster token, naming the way out, unless `--insecure` says
/// so; `nk up` makes a token of its own in its data directory, which
/// clients of this user on this host find by themselves.
#[test]
fn servers_refuse_to_run_without_a_token_unless_told_and_nk_up_makes_one() {
    for args in [
        &["meta", "--listen", "127.0.0.1:0"][..],
        &["store", "--class", "0", "--size", "8MiB"][..],
    ] {
        let out = common::nk()
            .args(args)
            .env_remove("NK_TOKEN_FILE")
            .env("NK_META", "127.0.0.1:1")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started without a token");
        let err = String::from_utf8_lossy(&out.stderr);
        for says in ["no cluster token", "nk token new", "--insecure"] {
            assert!(err.contains(says), "{args:?}: {err}");
        }
    }
    // Told so, they run without one.
    let (meta, addr) = start_role(
        &["meta", "--listen", "127.0.0.1:0", "--insecure"],
        &[("NK_TOKEN_FILE", "")],
        "metadata server listening on",
    );
    let _meta = common::Proc(meta);
    let _store = common::Proc(
        start_role(
            &["store", "--class", "0", "--size", "8MiB", "--insecure"],
            &[("NK_TOKEN_FILE", ""), ("NK_META", &addr)],
            "storage server 0",
        )
        .0,
    );
    let elsewhere = tempfile::tempdir().unwrap();
    succeeds(
        client(&addr)
            .args(["mkdir", "/open"])
            .env_remove("NK_TOKEN_FILE")
            .env("NK_RUNTIME_DIR", elsewhere.path()),
    );

    // `nk up` with no token configured makes one, 0600, in its data
    // directory, says where, and a client of this user finds it.
    let dir = tempfile::tempdir().unwrap();
    let child = up_command(dir.path())
        .env_remove("NK_TOKEN_FILE")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut up = Up {
        child,
        meta: String::new(),
        _dir: None,
    };
    let mut said = String::new();
    let mut lines = BufReader::new(up.child.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        said.push_str(&line);
        said.push('\n');
        if let Some(addr) = line.strip_prefix("export NK_META=") {
            up.meta = addr.split_whitespace().next().unwrap().to_string();
            break;
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let token = dir.path().join("token");
    let mode = std::fs::metadata(&token).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        said.contains(&format!("cluster token in {}", token.display())),
        "{said}"
    );
    succeeds(
        client(&up.meta)
            .args(["mkdir", "/mine"])
            .env_remove("NK_TOKEN_FILE"),
    );
    // Elsewhere (another host, another user): refused, naming the setting.
    let err = fails(
        client(&up.meta)
            .args(["mkdir", "/theirs"])
            .env_remove("NK_TOKEN_FILE")
            .env("NK_RUNTIME_DIR", elsewhere.path()),
    );
    assert!(err.contains("NK_TOKEN_FILE"), "{err}");
    // With the file, anyone who may read it gets in.
    succeeds(
        client(&up.meta)
            .args(["mkdir", "/shared"])
            .env("NK_TOKEN_FILE", &token)
            .env("NK_RUNTIME_DIR", elsewhere.path()),
    );
}

/// `nk key new` writes an encryption key (0600, never overwritten); with
/// `NK_ENCRYPTION_KEY_FILE` (or `[security] encryption_key_file`) a client
/// writes and reads an encrypted class, without it the read is refused
/// naming the setting (`docs/encryption.md`).
#[test]
fn nk_key_new_makes_a_key_that_encrypted_classes_need() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    new_secret_file("key", &key);
    let cfg = dir.path().join("nk.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[class]]\nid = 0\nname = \"dram\"\nencrypt = true\n[security]\nencryption_key_file = {:?}\n",
            key.display().to_string()
        ),
    )
    .unwrap();
    let cfg_s = cfg.display().to_string();
    let (_meta, _store, addr) = meta_and_dram_store(&cfg_s);
    let src = dir.path().join("in.bin");
    std::fs::write(&src, b"secret bytes for an encrypted class").unwrap();
    succeeds(
        client(&addr)
            .args(["put", src.to_str().unwrap(), "/f"])
            .env("NK_ENCRYPTION_KEY_FILE", &key),
    );
    for with_key in [&["cat", "/f", "--config", &cfg_s][..], &["cat", "/f"][..]] {
        let mut c = client(&addr);
        c.args(with_key);
        if with_key.len() == 2 {
            c.env("NK_ENCRYPTION_KEY_FILE", &key);
        }
        assert_eq!(succeeds(&mut c), b"secret bytes for an encrypted class");
    }
    let err = fails(client(&addr).args(["cat", "/f"]));
    assert!(
        err.contains("encryption_key_file") && err.contains("/f"),
        "{err}"
    );
}

#[test]
fn nk_tls_new_makes_certificates_a_tls_cluster_serves_and_plain_clients_are_told() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let tls_new = || {
        let mut c = common::nk();
        c.args(["tls", "new", "--host", "127.0.0.1"]).arg(&pki);
        c
    };
    succeeds(&mut tls_new());
    for key in ["ca.key", "node.key"] {
        let mode = std::fs::metadata(pki.join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }
    // Never overwritten.
    let before = std::fs::read(pki.join("node.pem")).unwrap();
    fails(&mut tls_new());
    assert_eq!(std::fs::read(pki.join("node.pem")).unwrap(), before);

    // TCP only (no Unix socket, no shared memory), so TLS carries it all.
    let client_section =
        "[client]\ntimeout_ms = 120000\nunix_socket = false\nshared_memory = false\n";
    let cfg = dir.path().join("nk.toml");
    std::fs::write(
        &cfg,
        format!(
            "{client_section}[security.tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
            pki.join("ca.pem"),
            pki.join("node.pem"),
            pki.join("node.key"),
        ),
    )
    .unwrap();
    let cfg_s = cfg.display().to_string();
    let (_meta, _store, addr) = meta_and_dram_store(&cfg_s);

    let src = dir.path().join("src");
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let nk = |args: &[&str], config: &std::path::Path| {
        let mut c = common::nk();
        c.args(args).env("NK_META", &addr).env("NK_CONFIG", config);
        c
    };
    succeeds(&mut nk(&["put", &src.display().to_string(), "/f"], &cfg));
    assert_eq!(succeeds(&mut nk(&["cat", "/f"], &cfg)), data);

    // A client without [security.tls]: refused, told why.
    let plain = dir.path().join("plain.toml");
    std::fs::write(&plain, client_section).unwrap();
    let err = fails(&mut nk(&["ls", "/"], &plain));
    assert!(err.contains("requires TLS"), "{err}");
}

/// Every file and directory under `dir` (itself included) whose mode is
/// not `0600` (files) or `0700` (directories): (path, mode in octal).
fn not_private(dir: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let mut wrong = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        let mode = m.permissions().mode() & 0o7777;
        if m.is_dir() {
            todo.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
        if mode != if m.is_dir() { 0o700 } else { 0o600 } {
            wrong.push((p, format!("{mode:o}")));
        }
    }
    wrong
}

/// Under umask 000, a persistent `nk up` (operation log, checkpoint, log
/// floor, locks, the stores' state, block and generation files, the DRAM
/// tier's file) and `nk snapshot` (packs, manifest) write every file 0600
/// and every directory 0700: they hold every store's capability key, the
/// whole namespace and the data.
#[test]
fn every_file_with_the_namespace_or_data_is_private_under_umask_000() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("nk.toml");
    // A small checkpoint threshold and a fast ticker, so a checkpoint is
    // written; hang-only client bounds.
    std::fs::write(
        &config,
        "[meta]\npersistence = true\ncheckpoint_after = \"16KiB\"\ndead_after_ms = 2000\n\
         retire_after_ms = 600000\n[up]\ndram = \"16MiB\"\nfile = \"64MiB\"\n\
         [client]\ntimeout_ms = 120000\n",
    )
    .unwrap();
    let data = dir.path().join("up");
    let umask_000 = |args: &[&std::ffi::OsStr]| {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "umask 000 && exec \"$@\"", "sh", common::NK])
            .args(args)
            .env_remove("NK_META")
            .env("NK_CONFIG", &config)
            .env("NK_RUNTIME_DIR", common::runtime_dir());
        cmd
    };
    let mut up = umask_000(&[
        "up".as_ref(),
        "--port".as_ref(),
        "0".as_ref(),
        "--data-dir".as_ref(),
        data.as_os_str(),
    ]);
    let mut child = up
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a first line").unwrap();
    assert!(first.contains("NodeKernel is up"), "{first}");
    std::thread::spawn(move || for _ in lines {});
    let meta = first.rsplit(' ').next().unwrap().to_string();
    let up = common::Proc(child);

    let src = dir.path().join("src.bin");
    std::fs::write(&src, vec![7u8; 3 << 20]).unwrap();
    // Clients find the token `nk up` made (its own, under umask 000 too).
    let own_token = |args: &[&str]| succeeds(client(&meta).args(args).env_remove("NK_TOKEN_FILE"));
    own_token(&["put", src.to_str().unwrap(), "/big"]);
    own_token(&["bench", "create", "-k", "300", "-w", "0", "--json"]);
    // Only a hang catcher: the ticker writes one within a few periods.
    let start = Instant::now();
    while !std::fs::read_dir(data.join("meta"))
        .unwrap()
        .any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".redb"))
    {
        assert!(start.elapsed() < Duration::from_secs(120), "no checkpoint");
        std::thread::sleep(Duration::from_millis(50));
    }
    let snap = dir.path().join("snap").join("inner");
    let mut cmd = umask_000(&["snapshot".as_ref(), "/".as_ref(), snap.as_os_str()]);
    succeeds(cmd.env("NK_META", &meta));
    drop(up);

    assert_eq!(not_private(&dir.path().join("snap")), [], "the snapshot");
    assert_eq!(not_private(&data), [], "the cluster's data directory");
    // What was checked: every kind of file was there.
    let mut seen: Vec<String> = Vec::new();
    let mut todo = vec![data.clone(), dir.path().join("snap")];
    while let Some(p) = todo.pop() {
        if p.is_dir() {
            todo.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        } else {
            seen.push(p.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    for want in [
        "LOCK",
        "log-floor",
        "store-state",
        "blocks",
        "gens",
        "dram",
        "identity",
    ] {
        assert!(seen.iter().any(|s| s == want), "no {want} in {seen:?}");
    }
    assert!(seen.iter().any(|s| s.starts_with("journal-")), "{seen:?}");
    assert!(
        seen.iter().any(|s| s.starts_with("checkpoint-")),
        "{seen:?}"
    );
    assert!(seen.iter().any(|s| s.starts_with("pack-")), "{seen:?}");
    assert!(seen.iter().any(|s| s == "token"), "{seen:?}");
}

/// `len` bytes of a xorshift stream from `seed`: incompressible, and cheap
/// to make again for the comparison.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    let mut x = seed | 1;
    for chunk in data.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    data
}

/// The peak resident memory (VmHWM) of the running process `pid` so far,
/// in bytes; `None` once it has exited. (Not `wait4`'s `ru_maxrss`: it
/// counts the memory of this test process, which the child was spawned
/// from.)
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib << 10)
}

/// `nk kv put KEY -` with stdin piped, its stderr in `err`. Its blocks go
/// over the network: mapping the co-located DRAM server's memory would
/// count the blocks it writes as its resident memory.
fn kv_put_stdin(meta: &str, key: &str, err: &std::path::Path) -> Child {
    let config = err.with_extension("toml");
    std::fs::write(
        &config,
        "[client]\ntimeout_ms = 120000\nshared_memory = false\n",
    )
    .unwrap();
    client(meta)
        .env("NK_CONFIG", &config)
        .args(["kv", "put", key, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(err).unwrap())
        .spawn()
        .unwrap()
}

/// `nk kv put KEY -` streams stdin into the value: a value much larger
/// than the memory it may take goes through a pipe (its size unknown),
/// the old value is what readers see until the put ends, and the new one
/// reads back byte for byte.
#[test]
fn kv_put_from_stdin_streams_in_bounded_memory() {
    const VALUE: usize = 256 << 20;
    const BOUND: u64 = 96 << 20;
    let (meta, addr, store) = start_meta_and_store(&[], "512MiB");
    let (_meta, _store) = (common::Proc(meta), common::Proc(store));
    nk_ok(&addr, &["mkdir", "--type", "table", "/t"]);
    nk_ok(&addr, &["kv", "put", "/t/k", "old"]);
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr");
    let data = noise(7, VALUE);
    let mut child = kv_put_stdin(&addr, "/t/k", &err);
    let mut stdin = child.stdin.take().unwrap();
    for chunk in data.chunks(1 << 20) {
        stdin.write_all(chunk).unwrap();
    }
    // Everything was taken; the put ends only with its input.
    let mut peak = peak_rss(child.id()).expect("nk waits for the end of its input");
    assert_eq!(nk_ok(&addr, &["kv", "get", "/t/k"]), b"old");
    drop(stdin);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        peak = peak.max(peak_rss(child.id()).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(
        status.success(),
        "nk kv put: {}",
        std::fs::read_to_string(&err).unwrap()
    );
    assert!(
        peak < BOUND,
        "nk kv put held {} MiB resident for a {} MiB value from stdin (bound {} MiB)",
        peak >> 20,
        VALUE >> 20,
        BOUND >> 20
    );
    let back = nk_ok(&addr, &["kv", "get", "/t/k"]);
    assert_eq!(back.len(), VALUE);
    assert!(back == data, "the value reads back byte for byte");
}

/// A put from stdin is all or nothing: one killed midway or one that runs
/// out of space leaves the old value; a small or empty one is stored.
#[test]
fn kv_put_from_stdin_is_all_or_nothing() {
    let (meta, addr, store) = start_meta_and_store(&[], "64MiB");
    let (_meta, _store) = (common::Proc(meta), common::Proc(store));
    nk_ok(&addr, &["mkdir", "--type", "table", "/t"]);
    nk_ok(&addr, &["kv", "put", "/t/k", "old"]);
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr");

    // Killed with its value half sent.
    let mut child = kv_put_stdin(&addr, "/t/k", &err);
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(&noise(1, 16 << 20)).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    drop(stdin);
    assert_eq!(nk_ok(&addr, &["kv", "get", "/t/k"]), b"old");

    // More than the cluster holds.
    let mut child = kv_put_stdin(&addr, "/t/k", &err);
    let mut stdin = child.stdin.take().unwrap();
    // nk stops reading once it fails: a broken pipe is expected.
    let _ = stdin.write_all(&noise(2, 128 << 20));
    drop(stdin);
    assert!(!child.wait().unwrap().success());
    let stderr = std::fs::read_to_string(&err).unwrap();
    assert!(stderr.contains("NoSpace"), "{stderr}");
    assert_eq!(nk_ok(&addr, &["kv", "get", "/t/k"]), b"old");

    // Small and empty values from stdin.
    for value in [&b"new"[..], b""] {
        let mut child = kv_put_stdin(&addr, "/t/k", &err);
        child.stdin.take().unwrap().write_all(value).unwrap();
        assert!(child.wait().unwrap().success());
        assert_eq!(nk_ok(&addr, &["kv", "get", "/t/k"]), value);
    }
}
